/*
 * Unit tests for recvq.c (doc/architecture.md, "Batched receives"), on
 * real sockets and a real io_uring driven by a real libevent loop: what a
 * socket receives arrives whole and in order, more than one provided
 * buffer's worth included; EOF and a cancel end the receive with their
 * codes; a dropped owner hears nothing more; after recvq_stop_wait() the
 * ring takes nothing more from the socket, so a descriptor handed on is
 * read only by its new owner; completions beyond the completion queue's
 * room are fetched, not left in the kernel. Skipped where io_uring or
 * multishot receives are not available.
 */
#include "autoconfig.h"

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>

#include "worker/recvq.h"

typedef struct Owner {
	uint8_t got[1 << 17];
	size_t len;
	bool ended;
	int end_res;
	int dones;
} Owner;

static Owner *owners[2];
static int done_calls;

static void on_data(void *owner, const uint8_t *data, size_t len)
{
	Owner *o = owner;
	assert_false(o->ended);
	assert_true(o->len + len <= sizeof(o->got));
	memcpy(o->got + o->len, data, len);
	o->len += len;
}

static void on_end(void *owner, int res)
{
	Owner *o = owner;
	assert_false(o->ended);
	o->ended = true;
	o->end_res = res;
}

static void on_done(void)
{
	done_calls++;
}

static const RecvqOps ops = {.data = on_data, .end = on_end, .done = on_done};
static struct event_base *base;

static void require_ring(void)
{
	if (!base)
		base = event_base_new();
	assert_non_null(base);
	if (!recvq_init(base, &ops))
		skip();
}

static int test_setup(void **state)
{
	(void)state;
	for (int i = 0; i < 2; i++) {
		if (!owners[i])
			owners[i] = malloc(sizeof(Owner));
		memset(owners[i], 0, sizeof(Owner));
	}
	done_calls = 0;
	return 0;
}

static void pair(int sv[2])
{
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	assert_int_equal(fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK), 0);
}

/* A socket pair whose first end the ring receives for owner (the start submitted); the receive's id. */
static uint32_t started_pair(int sv[2], Owner *owner)
{
	require_ring();
	pair(sv);
	uint32_t id = recvq_start(owner, sv[0]);
	assert_int_not_equal(id, 0);
	recvq_submit();
	return id;
}

/* Run the loop until cond holds (at most a few seconds). */
#define LOOP_UNTIL(cond)                                                                                               \
	do {                                                                                                           \
		for (int spin_ = 0; !(cond); spin_++) {                                                                \
			assert_true(spin_ < 2000);                                                                     \
			recvq_submit();                                                                                \
			struct timeval tv_ = {0, 2000};                                                                \
			event_base_loopexit(base, &tv_);                                                               \
			event_base_loop(base, EVLOOP_ONCE);                                                            \
		}                                                                                                      \
	} while (0)

static void test_bytes_arrive_whole_and_in_order(void **state)
{
	(void)state;
	int sv[2];
	(void)started_pair(sv, owners[0]);
	/* more than a provided buffer holds, in pieces */
	static uint8_t msg[100000];
	for (size_t k = 0; k < sizeof(msg); k++)
		msg[k] = (uint8_t)(k * 7 + k / 251);
	size_t sent = 0;
	while (sent < sizeof(msg)) {
		ssize_t n = send(sv[1], msg + sent, sizeof(msg) - sent > 30000 ? 30000 : sizeof(msg) - sent, 0);
		assert_true(n > 0);
		sent += (size_t)n;
		LOOP_UNTIL(owners[0]->len == sent || owners[0]->ended);
	}
	assert_false(owners[0]->ended);
	assert_int_equal(owners[0]->len, sizeof(msg));
	assert_memory_equal(owners[0]->got, msg, sizeof(msg));
	assert_true(done_calls > 0);
	/* the peer closes: the receive ends with EOF, its id free */
	close(sv[1]);
	LOOP_UNTIL(owners[0]->ended);
	assert_int_equal(owners[0]->end_res, 0);
	close(sv[0]);
}

static void test_two_sockets_are_kept_apart(void **state)
{
	(void)state;
	require_ring();
	int a[2], b[2];
	pair(a);
	pair(b);
	assert_int_not_equal(recvq_start(owners[0], a[0]), 0);
	assert_int_not_equal(recvq_start(owners[1], b[0]), 0);
	recvq_submit();
	assert_int_equal(send(a[1], "first", 5, 0), 5);
	assert_int_equal(send(b[1], "second", 6, 0), 6);
	assert_int_equal(send(a[1], " again", 6, 0), 6);
	LOOP_UNTIL(owners[0]->len == 11 && owners[1]->len == 6);
	assert_memory_equal(owners[0]->got, "first again", 11);
	assert_memory_equal(owners[1]->got, "second", 6);
	close(a[1]), close(b[1]);
	LOOP_UNTIL(owners[0]->ended && owners[1]->ended);
	close(a[0]), close(b[0]);
}

static void test_cancel_reports_what_came_before_it(void **state)
{
	(void)state;
	int sv[2];
	uint32_t id = started_pair(sv, owners[0]);
	assert_int_equal(send(sv[1], "before", 6, 0), 6);
	LOOP_UNTIL(owners[0]->len == 6);
	recvq_stop(id, true);
	recvq_submit();
	LOOP_UNTIL(owners[0]->ended);
	assert_int_equal(owners[0]->end_res, -ECANCELED);
	/* what comes after the cancel stays in the socket */
	assert_int_equal(send(sv[1], "after", 5, 0), 5);
	char buf[16];
	assert_int_equal(recv(sv[0], buf, sizeof(buf), 0), 5);
	assert_memory_equal(buf, "after", 5);
	close(sv[0]), close(sv[1]);
}

static void test_dropped_owner_hears_nothing(void **state)
{
	(void)state;
	int sv[2];
	uint32_t id = started_pair(sv, owners[0]);
	recvq_stop(id, false);
	assert_int_equal(send(sv[1], "late", 4, 0), 4);
	close(sv[1]);
	recvq_submit();
	/* a second socket's bytes still come: the ring goes on */
	int b[2];
	pair(b);
	assert_int_not_equal(recvq_start(owners[1], b[0]), 0);
	recvq_submit();
	assert_int_equal(send(b[1], "x", 1, 0), 1);
	LOOP_UNTIL(owners[1]->len == 1);
	assert_int_equal(owners[0]->len, 0);
	assert_false(owners[0]->ended);
	close(sv[0]), close(b[0]), close(b[1]);
	LOOP_UNTIL(owners[1]->ended);
}

static void test_stop_wait_lets_go_of_the_socket(void **state)
{
	(void)state;
	int sv[2];
	uint32_t id = started_pair(sv, owners[0]);
	assert_int_equal(send(sv[1], "mine", 4, 0), 4);
	LOOP_UNTIL(owners[0]->len == 4);
	/* not reaped yet: stop_wait reports it before it returns */
	assert_int_equal(send(sv[1], "+tail", 5, 0), 5);
	assert_true(recvq_stop_wait(id));
	assert_true(owners[0]->ended);
	assert_int_equal(owners[0]->end_res, -ECANCELED);
	/* from now on the socket's bytes are its next reader's: nothing lost, nothing twice */
	assert_int_equal(send(sv[1], "next owner", 10, 0), 10);
	char all[32];
	memcpy(all, owners[0]->got, owners[0]->len);
	ssize_t n = recv(sv[0], all + owners[0]->len, sizeof(all) - owners[0]->len, 0);
	assert_true(n >= 10);
	assert_int_equal(owners[0]->len + (size_t)n, 19);
	assert_memory_equal(all, "mine+tailnext owner", 19);
	/* and no completion for it comes later */
	assert_int_equal(send(sv[1], "z", 1, 0), 1);
	struct timeval tv = {0, 20000};
	event_base_loopexit(base, &tv);
	event_base_loop(base, 0);
	assert_int_equal(owners[0]->len + (size_t)n, 19);
	close(sv[0]), close(sv[1]);
}

static void test_closed_before_submission_never_reads_a_reused_descriptor(void **state)
{
	(void)state;
	require_ring();
	int sv[2];
	pair(sv);
	int fd = sv[0];
	/* started and dropped in one pass, its descriptor closed at once */
	uint32_t id = recvq_start(owners[0], fd);
	assert_int_not_equal(id, 0);
	recvq_stop(id, false);
	close(sv[0]);
	close(sv[1]);
	/* a socket of the same pass gets the number, with bytes waiting */
	int b[2];
	pair(b);
	assert_int_equal(b[0], fd);
	assert_int_equal(send(b[1], "not yours", 9, 0), 9);
	recvq_submit();
	struct timeval tv = {0, 20000};
	event_base_loopexit(base, &tv);
	event_base_loop(base, 0);
	assert_int_equal(owners[0]->len, 0);
	char buf[16];
	assert_int_equal(recv(b[0], buf, sizeof(buf), MSG_DONTWAIT), 9);
	assert_memory_equal(buf, "not yours", 9);
	close(b[0]), close(b[1]);
}

static int count_ended(const Owner *o, int n)
{
	int k = 0;
	for (int i = 0; i < n; i++)
		k += o[i].ended;
	return k;
}

/*
 * More completions at once than the completion queue holds (2048): 2,500
 * receives end together (their peers close), and every end is reported,
 * those the kernel kept aside included.
 */
static void test_completions_beyond_the_queue_are_fetched(void **state)
{
	(void)state;
	require_ring();
	enum { N = 2500 };
	struct rlimit rl;
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
	if (rl.rlim_cur < 2 * N + 64) {
		rl.rlim_cur = rl.rlim_max;
		if (rl.rlim_cur < 2 * N + 64 || setrlimit(RLIMIT_NOFILE, &rl) != 0)
			skip();
	}
	Owner *many = calloc(N, sizeof(Owner));
	static int sv[N][2];
	assert_non_null(many);
	for (int i = 0; i < N; i++) {
		pair(sv[i]);
		assert_int_not_equal(recvq_start(&many[i], sv[i][0]), 0);
	}
	recvq_submit();
	/* every receive posts its last completion before the loop reaps one */
	for (int i = 0; i < N; i++)
		close(sv[i][1]);
	LOOP_UNTIL(count_ended(many, N) == N);
	for (int i = 0; i < N; i++) {
		assert_int_equal(many[i].end_res, 0);
		close(sv[i][0]);
	}
	free(many);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup(test_bytes_arrive_whole_and_in_order, test_setup),
	    cmocka_unit_test_setup(test_two_sockets_are_kept_apart, test_setup),
	    cmocka_unit_test_setup(test_cancel_reports_what_came_before_it, test_setup),
	    cmocka_unit_test_setup(test_dropped_owner_hears_nothing, test_setup),
	    cmocka_unit_test_setup(test_stop_wait_lets_go_of_the_socket, test_setup),
	    cmocka_unit_test_setup(test_closed_before_submission_never_reads_a_reused_descriptor, test_setup),
	    cmocka_unit_test_setup(test_completions_beyond_the_queue_are_fetched, test_setup),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
