/*
 * Unit tests for sendq.c (doc/architecture.md, "Batched sends"): queued
 * sends arrive whole and in order, pending until the flush and not
 * reported when taken whole, and a flush never waits on a socket
 * that has no room: what the kernel did not take comes back to the owner,
 * byte for byte, with EAGAIN, and a dead peer's send comes back with its
 * error. Skipped where io_uring is not available (no liburing in the
 * build, or a kernel that refuses it).
 */
#include "autoconfig.h"

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "worker/sendq.h"

#define MAX_RESULTS 8

typedef struct Result {
	void *owner;
	uint8_t data[4096];
	size_t unsent;
	int err;
} Result;

static Result results[MAX_RESULTS];
static int n_results;

static void on_result(void *owner, const void *data, size_t unsent, int err)
{
	assert_true(n_results < MAX_RESULTS);
	Result *r = &results[n_results++];
	r->owner = owner;
	r->unsent = unsent;
	r->err = err;
	assert_true(unsent <= sizeof(r->data));
	memcpy(r->data, data, unsent);
}

static int test_setup(void **state)
{
	(void)state;
	n_results = 0;
	return 0;
}

/* A connected pair of unix stream sockets; the first (the sender) non-blocking. */
static void pair(int sv[2])
{
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	assert_int_equal(fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK), 0);
}

static void require_ring(void)
{
	if (!sendq_init(on_result))
		skip();
}

static void test_sends_arrive_whole_and_in_socket_order(void **state)
{
	(void)state;
	require_ring();
	int a[2], b[2];
	pair(a);
	pair(b);
	char owner_a, owner_b;
	uint32_t id_a = sendq_add(&owner_a, a[0], "hello ", 6, "world", 5);
	assert_int_not_equal(id_a, 0);
	assert_true(sendq_queued());
	uint32_t id_b = sendq_add(&owner_b, b[0], "second socket", 13, NULL, 0);
	/* one batch, pending until the flush */
	assert_int_equal(id_b, id_a);
	assert_true(sendq_pending(id_a));
	/* nothing reaches the kernel before the flush */
	char buf[64];
	assert_int_equal(recv(a[1], buf, sizeof(buf), MSG_DONTWAIT), -1);
	assert_int_equal(errno, EAGAIN);
	sendq_flush();
	assert_false(sendq_queued());
	assert_false(sendq_pending(id_a));
	assert_false(sendq_pending(0));
	/* taken whole: nothing to report */
	assert_int_equal(n_results, 0);
	assert_int_equal(recv(a[1], buf, sizeof(buf), 0), 11);
	assert_memory_equal(buf, "hello world", 11);
	assert_int_equal(recv(b[1], buf, sizeof(buf), 0), 13);
	assert_memory_equal(buf, "second socket", 13);
	close(a[0]), close(a[1]), close(b[0]), close(b[1]);
}

static void test_full_socket_comes_back_unsent_without_waiting(void **state)
{
	(void)state;
	require_ring();
	int sv[2];
	pair(sv);
	/* fill the socket until it takes nothing more */
	static char fill[65536];
	while (send(sv[0], fill, sizeof(fill), MSG_DONTWAIT) > 0)
		;
	while (send(sv[0], fill, 1, MSG_DONTWAIT) > 0)
		;
	assert_int_equal(errno, EAGAIN);
	char msg[1000];
	for (size_t k = 0; k < sizeof(msg); k++)
		msg[k] = (char)('a' + k % 26);
	char owner;
	assert_int_not_equal(sendq_add(&owner, sv[0], msg, 400, msg + 400, 600), 0);
	alarm(20); /* a flush that waits for room would wait forever: fail instead */
	sendq_flush();
	alarm(0);
	assert_int_equal(n_results, 1);
	assert_ptr_equal(results[0].owner, &owner);
	/* none of it, or its tail, is given back for the socket's write event */
	assert_true(results[0].unsent > 0 && results[0].unsent <= sizeof(msg));
	if (results[0].unsent == sizeof(msg))
		assert_int_equal(results[0].err, EAGAIN);
	else
		assert_int_equal(results[0].err, 0);
	assert_memory_equal(results[0].data, msg + sizeof(msg) - results[0].unsent, results[0].unsent);
	close(sv[0]), close(sv[1]);
}

static void test_dead_peer_comes_back_with_its_error(void **state)
{
	(void)state;
	require_ring();
	int sv[2];
	pair(sv);
	close(sv[1]);
	char owner;
	assert_int_not_equal(sendq_add(&owner, sv[0], "gone", 4, NULL, 0), 0);
	sendq_flush();
	assert_int_equal(n_results, 1);
	assert_int_equal(results[0].unsent, 4);
	assert_int_equal(results[0].err, EPIPE);
	assert_memory_equal(results[0].data, "gone", 4);
	close(sv[0]);
}

static void test_large_and_empty_sends_are_not_queued(void **state)
{
	(void)state;
	require_ring();
	static char big[SENDQ_MAX_SEND + 1];
	char owner;
	assert_int_equal(sendq_add(&owner, 0, big, sizeof(big), NULL, 0), 0);
	assert_int_equal(sendq_add(&owner, 0, big, SENDQ_MAX_SEND, big, 1), 0);
	assert_int_equal(sendq_add(&owner, 0, big, 0, NULL, 0), 0);
	assert_false(sendq_queued());
	sendq_flush(); /* nothing queued: nothing reported */
	assert_int_equal(n_results, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup(test_sends_arrive_whole_and_in_socket_order, test_setup),
	    cmocka_unit_test_setup(test_full_socket_comes_back_unsent_without_waiting, test_setup),
	    cmocka_unit_test_setup(test_dead_peer_comes_back_with_its_error, test_setup),
	    cmocka_unit_test_setup(test_large_and_empty_sends_are_not_queued, test_setup),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
