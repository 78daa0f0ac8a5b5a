/*
 * Batched sends through io_uring (include/worker/sendq.h; doc/architecture.md,
 * "Batched sends").
 *
 * Every queued send carries MSG_DONTWAIT, so the kernel tries it once at
 * submission and completes it there: with the bytes taken, short, or with
 * EAGAIN when the socket has no room. Nothing stays in flight after
 * sendq_flush() returns, so the copies can be reused at once and no
 * completion ever arrives later.
 */
#include "autoconfig.h"

#include "worker/sendq.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/log.h"
#include "common/util.h"

#ifdef HAVE_LIBURING

#include <liburing.h>

#define SENDQ_ENTRIES 128          /* sends per submission (the ring's size) */
#define SENDQ_ARENA   (256 * 1024) /* bytes copied per submission */

typedef struct Queued {
	void *owner;
	uint8_t *data; /* the copy, in the arena */
	uint32_t len;
} Queued;

uint32_t sendq_batch = 1;
unsigned sendq_count;

static struct io_uring ring;
static bool enabled;
static sendq_result_cb result_cb;
static Queued queued[SENDQ_ENTRIES];
static uint8_t *arena;
static size_t arena_used;
static bool flushing; /* the result callbacks run: they may not queue */

static bool ring_setup(void)
{
	/* the flags only make submission cheaper; a kernel that lacks one gets none */
	struct io_uring_params p = {.flags = IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN |
	                                     IORING_SETUP_SINGLE_ISSUER};
	int r = io_uring_queue_init_params(SENDQ_ENTRIES, &ring, &p);
	if (r == -EINVAL) {
		memset(&p, 0, sizeof(p));
		r = io_uring_queue_init_params(SENDQ_ENTRIES, &ring, &p);
	}
	if (r < 0) {
		log_debug("io_uring not available (%s): sends are not batched", strerror(-r));
		return false;
	}
	struct io_uring_probe *probe = io_uring_get_probe_ring(&ring);
	bool ok = probe && io_uring_opcode_supported(probe, IORING_OP_SEND);
	if (probe)
		io_uring_free_probe(probe);
	if (!ok) {
		log_debug("io_uring without IORING_OP_SEND: sends are not batched");
		io_uring_queue_exit(&ring);
	}
	return ok;
}

/* exit() from inside a pass (a shutdown): what the pass queued still goes out */
static void submit_at_exit(void)
{
	if (sendq_count && !flushing)
		(void)io_uring_submit_and_wait(&ring, sendq_count);
}

bool sendq_init(sendq_result_cb cb)
{
	if (enabled)
		return true;
	if (!io_uring_wanted(false)) {
		log_debug("PGBOUNCER_IO_URING=0: sends are not batched");
		return false;
	}
	if (!ring_setup())
		return false;
	result_cb = cb;
	arena = xmalloc(SENDQ_ARENA);
	enabled = true;
	atexit(submit_at_exit);
	log_debug("sends are batched per loop pass (io_uring)");
	return true;
}

/* sendq_add() when the queue has no room: flush, then queue if batching still works */
static uint32_t add_after_flush(void *owner, int fd, const void *a, size_t alen, const void *b, size_t blen)
{
	sendq_flush();
	if (!enabled)
		return 0; /* that submission failed */
	return sendq_add(owner, fd, a, alen, b, blen);
}

uint32_t sendq_add(void *owner, int fd, const void *a, size_t alen, const void *b, size_t blen)
{
	size_t len = alen + blen;
	if (!enabled || len - 1 >= SENDQ_MAX_SEND) /* len - 1: an empty send wraps around */
		return 0;
	pgb_assert(!flushing);
	if (sendq_count == SENDQ_ENTRIES || arena_used + len > SENDQ_ARENA)
		return add_after_flush(owner, fd, a, alen, b, blen);
	struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
	if (!sqe)
		return 0;
	uint8_t *copy = arena + arena_used;
	memcpy(copy, a, alen);
	if (blen)
		memcpy(copy + alen, b, blen);
	arena_used += len;
	queued[sendq_count] = (Queued){.owner = owner, .data = copy, .len = (uint32_t)len};
	io_uring_prep_send(sqe, fd, copy, len, MSG_NOSIGNAL | MSG_DONTWAIT);
	io_uring_sqe_set_data64(sqe, sendq_count);
	sendq_count++;
	return sendq_batch;
}

/* A send not taken whole: its owner keeps what is left. res: bytes taken, or -errno. */
static void report(const Queued *q, int res)
{
	if (res >= 0)
		result_cb(q->owner, q->data + res, q->len - (uint32_t)res, 0);
	else
		result_cb(q->owner, q->data, q->len, -res);
}

void sendq_flush(void)
{
	if (!sendq_count)
		return;
	pgb_assert(!flushing);
	flushing = true;
	unsigned n = sendq_count;
	int r;
	do
		r = io_uring_submit_and_wait(&ring, n);
	while (r == -EINTR);
	unsigned submitted = r < 0 ? 0 : (unsigned)r < n ? (unsigned)r : n;
	if (submitted < n) {
		/* what the kernel did not take stays in the ring: nothing may be submitted after it */
		log_warning("io_uring took %u of %u sends (%s): sending directly from now on", submitted, n,
		            r < 0 ? strerror(-r) : "short submission");
		enabled = false;
	}
	unsigned got = 0;
	while (got < submitted) {
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0;
		io_uring_for_each_cqe(&ring, head, cqe)
		{
			uint64_t k = io_uring_cqe_get_data64(cqe);
			seen++;
			if (k >= n)
				continue;
			if (cqe->res != (int)queued[k].len)
				report(&queued[k], cqe->res);
		}
		io_uring_cq_advance(&ring, seen);
		got += seen;
		/* MSG_DONTWAIT: the wait is never for a socket, only for the kernel to post the rest */
		if (got < submitted && io_uring_wait_cqe(&ring, &cqe) < 0)
			break;
	}
	if (got < n) {
		if (got < submitted)
			log_warning("io_uring: %u completions missing", submitted - got);
		/* never submitted: all of it goes out from the socket's spill (submitted, result lost: the kernel took it) */
		for (unsigned k = submitted; k < n; k++)
			report(&queued[k], -EAGAIN);
	}
	sendq_count = 0;
	arena_used = 0;
	if (++sendq_batch == 0)
		sendq_batch = 1; /* 0 is no batch */
	flushing = false;
}

#else /* !HAVE_LIBURING */

bool sendq_init(sendq_result_cb cb)
{
	(void)cb;
	return false;
}

uint32_t sendq_batch = 1;
unsigned sendq_count;

uint32_t sendq_add(void *owner, int fd, const void *a, size_t alen, const void *b, size_t blen)
{
	(void)owner, (void)fd, (void)a, (void)alen, (void)b, (void)blen;
	return 0;
}

void sendq_flush(void)
{
}

#endif
