/*
 * Unit tests for the control channel's sending queue (channel.c,
 * doc/architecture.md "Control channel"): a full socket pair costs no
 * message; what waits goes out in order, each with its own fd, once the
 * reader has read; the cap and a closed peer drop what they must and leak
 * no fd; and an owner about to exit sends what is queued.
 */
#include "autoconfig.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>

#include "common/channel.h"

typedef struct Fixture {
	int sv[2]; /* sv[0]: the sender's end, sv[1]: the reader's */
	struct event_base *base;
	ChannelOut *out;
	int fds_open; /* open fds once set up (the pair and the loop's among them) */
} Fixture;

/* Every how many messages one carries an fd (0 = none): few enough for a 1024-fd limit. */
static int fd_every;

static int open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	assert_non_null(d);
	int n = 0;
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

static int setup(void **state)
{
	Fixture *f = calloc(1, sizeof(*f));
	assert_non_null(f);
	assert_true(channel_pair(f->sv));
	for (int i = 0; i < 2; i++)
		assert_int_equal(fcntl(f->sv[i], F_SETFL, fcntl(f->sv[i], F_GETFL) | O_NONBLOCK), 0);
	f->base = event_base_new();
	assert_non_null(f->base);
	f->out = channel_out_new(f->base, f->sv[0], "the test reader");
	f->fds_open = open_fds();
	fd_every = 7;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	Fixture *f = *state;
	channel_out_free(f->out);
	event_base_free(f->base);
	close(f->sv[0]);
	if (f->sv[1] >= 0)
		close(f->sv[1]);
	free(f);
	return 0;
}

/* A memfd holding the number n: the fd a message carries, told apart from the others by its content. */
static int numbered_fd(int n)
{
	int fd = memfd_create("test-channel", MFD_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, &n, sizeof(n)), (ssize_t)sizeof(n));
	return fd;
}

static int number_in(int fd)
{
	int n = -1;
	assert_int_equal(pread(fd, &n, sizeof(n), 0), (ssize_t)sizeof(n));
	return n;
}

static bool carries_fd(int i)
{
	return fd_every && i % fd_every == 3;
}

/* Send message i (CH_MOVED, arg = i; every fd_every-th with a numbered fd, closed here right away). */
static bool send_nth(ChannelOut *out, int i)
{
	ChannelMsg m = {.type = CH_MOVED, .id = 1, .arg = i};
	int fd = carries_fd(i) ? numbered_fd(i) : -1;
	bool ok = channel_out_send(out, &m, fd);
	if (fd >= 0)
		close(fd); /* the queue holds its own copy */
	return ok;
}

/* Send until the socket is full and then `more` messages beyond; returns how many were sent in all. */
static int fill(ChannelOut *out, int more)
{
	int n = 0;
	while (channel_out_queued(out) == 0) {
		assert_true(send_nth(out, n));
		n++;
		assert_true(n < 1000000); /* a socket buffer that never fills */
	}
	for (int i = 0; i < more; i++, n++)
		assert_true(send_nth(out, n));
	return n;
}

/* Read what is there, in order from *next; false when nothing was. */
static bool read_some(int sock, int *next)
{
	bool any = false;
	for (;;) {
		ChannelMsg m;
		int fd;
		int r = channel_recv(sock, &m, &fd);
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return any;
		assert_int_equal(r, 1);
		any = true;
		assert_int_equal(m.type, CH_MOVED);
		assert_int_equal(m.arg, *next);
		if (carries_fd(*next)) {
			assert_true(fd >= 0);
			assert_int_equal(number_in(fd), *next);
			close(fd);
		} else {
			assert_int_equal(fd, -1);
		}
		(*next)++;
	}
}

/* The reader reads while the owner's loop runs, until messages first..end-1 came. */
static void drain(Fixture *f, int first, int end)
{
	int next = first;
	for (int idle = 0; next < end; idle++) {
		if (read_some(f->sv[1], &next))
			idle = 0;
		assert_true(idle < 1000); /* the queue stopped going out */
		event_base_loop(f->base, EVLOOP_NONBLOCK);
	}
	assert_false(read_some(f->sv[1], &next)); /* nothing more, nothing twice */
}

static void test_a_full_channel_queues_in_order_with_fds(void **state)
{
	Fixture *f = *state;
	int total = fill(f->out, 3000);
	assert_int_equal(channel_out_queued(f->out), 3001); /* the one that found it full, and the rest */
	drain(f, 0, total);
	assert_int_equal(channel_out_queued(f->out), 0);
	/* the queue's copies of the fds are closed once their messages went */
	assert_int_equal(open_fds(), f->fds_open);
	/* and the channel goes on as before: at once, nothing queued */
	assert_true(send_nth(f->out, total));
	assert_int_equal(channel_out_queued(f->out), 0);
	drain(f, total, total + 1);
}

static void test_the_cap_drops_and_keeps_the_rest_in_order(void **state)
{
	Fixture *f = *state;
	fd_every = 0; /* a fd each would take tens of thousands */
	int total = fill(f->out, (int)CHANNEL_OUT_MAX_QUEUED - 1);
	assert_int_equal(channel_out_queued(f->out), CHANNEL_OUT_MAX_QUEUED);
	ChannelMsg m = {.type = CH_MOVED, .arg = total};
	errno = 0;
	assert_false(channel_out_send(f->out, &m, -1));
	assert_int_equal(errno, ENOBUFS);
	drain(f, 0, total);
	assert_int_equal(channel_out_queued(f->out), 0);
}

static void test_a_closed_peer_drops_the_queue_and_its_fds(void **state)
{
	Fixture *f = *state;
	(void)fill(f->out, 100);
	close(f->sv[1]);
	f->sv[1] = -1;
	for (int i = 0; i < 10 && channel_out_queued(f->out) > 0; i++)
		event_base_loop(f->base, EVLOOP_NONBLOCK);
	assert_int_equal(channel_out_queued(f->out), 0);
	ChannelMsg m = {.type = CH_MOVED};
	errno = 0;
	assert_false(channel_out_send(f->out, &m, -1));
	assert_int_equal(errno, EPIPE);
	assert_int_equal(open_fds(), f->fds_open - 1); /* the reader's end closed, and no queued copy left */
}

static void test_finish_sends_the_queue_before_exit(void **state)
{
	Fixture *f = *state;
	int total = fill(f->out, 2000);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		/* the reader, slower than the sender: blocking reads from a little later on */
		usleep(50 * 1000);
		fcntl(f->sv[1], F_SETFL, fcntl(f->sv[1], F_GETFL) & ~O_NONBLOCK);
		for (int next = 0; next < total; next++) {
			ChannelMsg m;
			int fd;
			if (channel_recv(f->sv[1], &m, &fd) != 1 || m.arg != next)
				_exit(1);
			if (carries_fd(next) != (fd >= 0) || (fd >= 0 && number_in(fd) != next))
				_exit(2);
			if (fd >= 0)
				close(fd);
		}
		_exit(0);
	}
	assert_true(channel_out_finish(f->out, 10000));
	assert_int_equal(channel_out_queued(f->out), 0);
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_message_names(void **state)
{
	(void)state;
	assert_string_equal(channel_msg_name(CH_MOVED), "CH_MOVED");
	assert_string_equal(channel_msg_name(CH_UP_PRED), "CH_UP_PRED");
	assert_string_equal(channel_msg_name(15), "message 15");
	assert_string_equal(channel_msg_name(1000), "message 1000");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_a_full_channel_queues_in_order_with_fds, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_the_cap_drops_and_keeps_the_rest_in_order, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_a_closed_peer_drops_the_queue_and_its_fds, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_finish_sends_the_queue_before_exit, setup, teardown),
	    cmocka_unit_test(test_message_names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
