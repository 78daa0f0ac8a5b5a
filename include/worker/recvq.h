/*
 * Batched receives: a plain socket in the steady state of a session (a
 * logged-in pooled client, a logged-in server) is read by one multishot
 * receive in this process's io_uring instead of by a recv() per readiness
 * event. The kernel copies what arrives into a buffer it takes from a ring
 * of provided buffers and posts a completion; the event loop wakes once for
 * the ring (its descriptor is in epoll) and reaps every completion of the
 * pass from shared memory, without a syscall per socket. Why, and the
 * figures: doc/architecture.md, "Batched receives".
 *
 * Without liburing (configure --without-liburing), where the kernel refuses
 * io_uring or multishot receives, or with PGBOUNCER_IO_URING=0 or =send in
 * the environment, recvq_start() takes nothing and every socket stays on
 * epoll and recv(). On the machine this was measured on, the ring costs
 * the pooler up to 8% more CPU per transaction than epoll and recv() at
 * 200 clients and gives 3-8% more transactions per second
 * (doc/benchmarks.md, "Receives through io_uring"): `send` is for a pooler
 * whose own CPU is the limit.
 *
 * Only sbuf.c uses it. The callbacks only append and note: they may run
 * during recvq_stop_wait(), from inside another socket's processing.
 */
#ifndef PGB_WORKER_RECVQ_H
#define PGB_WORKER_RECVQ_H

#include <event2/event.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct RecvqOps {
	/* bytes received for owner; valid only during the call */
	void (*data)(void *owner, const uint8_t *data, size_t len);
	/*
	 * owner's receive ended and its id is free again: 0 = EOF, -ECANCELED
	 * after recvq_stop(), -ENOBUFS when it may simply be started again (the
	 * provided buffers ran out, or the kernel ended it after data), else
	 * the socket's error as -errno.
	 */
	void (*end)(void *owner, int res);
	/* after the completions of a wake-up were reported: process what came */
	void (*done)(void);
} RecvqOps;

/* Set up this process's receive ring (a worker, after the fork); false = receives stay on epoll. */
bool recvq_init(struct event_base *base, const RecvqOps *ops);

/* Whether recvq_start() can take sockets. */
bool recvq_enabled(void);

/* Start receiving fd for owner; the id (never 0) names it to recvq_stop(). 0 = not possible. */
uint32_t recvq_start(void *owner, int fd);

/*
 * Cancel the receive `id`. keep_owner: what it received before the cancel
 * took effect is still reported, then end(-ECANCELED) (or its earlier end);
 * otherwise nothing more is reported for it (the owner is going away).
 * True when it ended here: its start had not reached the kernel (a
 * submission failed) and was withdrawn; with keep_owner, end(-ECANCELED)
 * was reported before the return.
 */
bool recvq_stop(uint32_t id, bool keep_owner);

/*
 * Cancel the receive `id` and return true once its end was reported: the
 * ring holds no reference to the socket any more (before its descriptor is
 * handed to another process or read directly). Completions of other
 * sockets reaped meanwhile are reported too, and done() runs from the
 * event loop later. False when the end did not come within half a second
 * (the ring still holds the socket; the end is reported later as usual).
 */
bool recvq_stop_wait(uint32_t id);

/* Have done() run from the event loop soon (a socket was put on the owner's list of work). */
void recvq_wake(void);

/* Submit the starts and stops queued during the pass; cheap when there are none. */
void recvq_submit(void);

#endif
