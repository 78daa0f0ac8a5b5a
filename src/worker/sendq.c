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
	uint32_t off; /* the copy: arena + off */
	uint32_t len;
} Queued;

static struct io_uring ring;
static bool enabled;
static sendq_result_cb result_cb;
static Queued queued[SENDQ_ENTRIES];
static unsigned n_queued;
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
	if (n_queued && !flushing)
		(void)io_uring_submit_and_wait(&ring, n_queued);
}

bool sendq_init(sendq_result_cb cb)
{
	if (enabled)
		return true;
	if (!ring_setup())
		return false;
	result_cb = cb;
	arena = xmalloc(SENDQ_ARENA);
	enabled = true;
	atexit(submit_at_exit);
	log_debug("sends are batched per loop pass (io_uring)");
	return true;
}

bool sendq_queued(void)
{
	return n_queued > 0;
}

bool sendq_add(void *owner, int fd, const void *a, size_t alen, const void *b, size_t blen)
{
	size_t len = alen + blen;
	if (!enabled || len == 0 || len > SENDQ_MAX_SEND)
		return false;
	pgb_assert(!flushing);
	if (n_queued == SENDQ_ENTRIES || arena_used + len > SENDQ_ARENA) {
		sendq_flush();
		if (!enabled)
			return false; /* that submission failed */
	}
	struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
	if (!sqe)
		return false;
	Queued *q = &queued[n_queued];
	q->owner = owner;
	q->off = (uint32_t)arena_used;
	q->len = (uint32_t)len;
	memcpy(arena + arena_used, a, alen);
	if (blen)
		memcpy(arena + arena_used + alen, b, blen);
	arena_used += len;
	io_uring_prep_send(sqe, fd, arena + q->off, len, MSG_NOSIGNAL | MSG_DONTWAIT);
	io_uring_sqe_set_data64(sqe, n_queued);
	n_queued++;
	return true;
}

static void report(unsigned k, int res)
{
	Queued *q = &queued[k];
	if (!q->owner)
		return; /* reported already */
	void *owner = q->owner;
	q->owner = NULL;
	if (res >= 0)
		result_cb(owner, arena + q->off + (uint32_t)res, q->len - (uint32_t)res, 0);
	else
		result_cb(owner, arena + q->off, q->len, -res);
}

void sendq_flush(void)
{
	if (!n_queued)
		return;
	pgb_assert(!flushing);
	flushing = true;
	unsigned n = n_queued;
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
			if (k < n)
				report((unsigned)k, cqe->res);
			seen++;
		}
		io_uring_cq_advance(&ring, seen);
		got += seen;
		/* MSG_DONTWAIT: the wait is never for a socket, only for the kernel to post the rest */
		if (got < submitted && io_uring_wait_cqe(&ring, &cqe) < 0)
			break;
	}
	if (got < submitted)
		log_warning("io_uring: %u completions missing", submitted - got);
	for (unsigned k = 0; k < n; k++) {
		if (k >= submitted)
			report(k, -EAGAIN); /* never submitted: all of it goes out from the socket's spill */
		else
			report(k, (int)queued[k].len); /* submitted, result lost: the kernel took it */
	}
	n_queued = 0;
	arena_used = 0;
	flushing = false;
}

#else /* !HAVE_LIBURING */

bool sendq_init(sendq_result_cb cb)
{
	(void)cb;
	return false;
}

bool sendq_queued(void)
{
	return false;
}

bool sendq_add(void *owner, int fd, const void *a, size_t alen, const void *b, size_t blen)
{
	(void)owner, (void)fd, (void)a, (void)alen, (void)b, (void)blen;
	return false;
}

void sendq_flush(void)
{
}

#endif
