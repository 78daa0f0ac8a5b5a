/*
 * Batched sends: the plain-socket sends of one event-loop pass are copied
 * into an io_uring submission queue and submitted together when the pass
 * ends, one io_uring_enter() for all of them, instead of one send() each.
 * Why, and the figures: doc/benchmarks.md, "Sends batched per loop pass".
 *
 * Without liburing (configure --without-liburing), or where the kernel
 * refuses io_uring (seccomp, io_uring_disabled), sendq_add() takes nothing
 * and every send stays a direct send().
 *
 * Only sbuf.c queues sends; it keeps the byte order of each socket: one
 * queued send per socket at a time (a second one flushes the queue first),
 * and what a queued send could not write comes back through the result
 * callback and goes out before anything else on that socket.
 */
#ifndef PGB_WORKER_SENDQ_H
#define PGB_WORKER_SENDQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SENDQ_MAX_SEND (16 * 1024) /* larger sends go out directly: copying them would cost more than a syscall */

/*
 * Called by sendq_flush() for a queued send the kernel did not take whole:
 * `unsent` bytes at data were not taken (they stay valid only during the
 * call); err is 0 for a short send, else the error (EAGAIN: no room), with
 * all of it unsent. A send taken whole is not reported: its batch id stops
 * being pending (sendq_pending()). The callback may not queue sends itself.
 */
typedef void (*sendq_result_cb)(void *owner, const void *data, size_t unsent, int err);

/*
 * PGBOUNCER_IO_URING in the environment (doc/pgbouncer.1.md, ENVIRONMENT):
 * `0` keeps a worker off io_uring altogether, for a kernel where it
 * misbehaves and for the tests of the path without it; `send` batches the
 * sends and leaves the receives on epoll (worker/recvq.h says why one may
 * want that). receives = false asks about the receive ring.
 */
static inline bool io_uring_wanted(bool receives)
{
	const char *v = getenv("PGBOUNCER_IO_URING");
	if (!v)
		return true;
	if (strcmp(v, "0") == 0)
		return false;
	return !receives || strcmp(v, "send") != 0;
}

/* Set up this process's queue (a worker, after the fork); false = sends stay direct. */
bool sendq_init(sendq_result_cb cb);

/*
 * Queue a copy of a then b (b may be empty) for fd, on behalf of owner, and
 * return the id of the batch it joined (never 0). 0 = not queued (disabled,
 * too large, or the queue is full even after a flush): the caller sends
 * directly.
 */
uint32_t sendq_add(void *owner, int fd, const void *a, size_t alen, const void *b, size_t blen);

/* The batch being filled, and how many sends wait in it; read through the functions below. */
extern uint32_t sendq_batch;
extern unsigned sendq_count;

/* Sends wait in the queue. */
static inline bool sendq_queued(void)
{
	return sendq_count > 0;
}

/*
 * The send sendq_add() queued as batch `id` waits for the flush. The id
 * wraps after 2^32 flushes, so an id kept that long may read as pending
 * again for one batch; that only makes its owner flush early.
 */
static inline bool sendq_pending(uint32_t id)
{
	return id == sendq_batch;
}

/* Submit everything queued and report the sends that were not taken whole; cheap when nothing is queued. */
void sendq_flush(void);

#endif
