/*
 * Batched receives through io_uring (include/worker/recvq.h;
 * doc/architecture.md, "Batched receives").
 *
 * One ring per worker, apart from the send queue's: its completions arrive
 * while the worker sleeps in epoll_wait(), so it is set up without
 * IORING_SETUP_COOP_TASKRUN (which would leave them until the next
 * syscall), and its descriptor is one more event of the loop.
 *
 * A receive is named by a slot of `slots`; the slot is taken by
 * recvq_start() and freed only when the receive's last completion (one
 * without IORING_CQE_F_MORE) has been reaped, so a completion always
 * finds the slot of its own receive.
 */
#include "autoconfig.h"

#include "worker/recvq.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/log.h"
#include "common/util.h"
#include "worker/sendq.h"

#ifdef HAVE_LIBURING

#include <liburing.h>

#define RING_ENTRIES   256  /* starts and stops per submission */
#define CQ_ENTRIES     2048 /* completions between two reapings before the kernel keeps them aside */
#define BUF_COUNT      128  /* provided buffers (a power of two) */
#define BUF_SIZE       1024 /* bytes each: a completion carries at most that much */
#define BUF_GROUP      1
#define CANCEL_TAG     UINT64_MAX   /* the user data of a cancel's own completion */
#define STOP_WAIT_USEC (500 * 1000) /* recvq_stop_wait()'s bound */

typedef struct Slot {
	void *owner; /* NULL: nothing more is reported */
	bool used;
	uint32_t batch;  /* the submission its start went with (see `batch`) */
	uint32_t sq_pos; /* its start's place in the submission queue, while batch is the current one */
	uint32_t next_free;
} Slot;

static struct io_uring ring;
static struct io_uring_buf_ring *bufring;
static uint8_t *bufs;
static bool enabled;
static bool skip_cancel_cqe; /* IORING_FEAT_CQE_SKIP: a cancel that found its receive posts nothing */
static const RecvqOps *ops;
static struct event *ring_ev;
static unsigned queued; /* SQEs waiting for recvq_submit() */
static uint32_t batch;  /* counts submissions: a slot whose batch is this one waits for the next */
static bool reaping;    /* on_ring() reports completions: done() follows anyway */

static Slot *slots;
static uint32_t n_slots, free_head; /* free list through next_free, index + 1 (0 = empty) */

static bool setup(void)
{
	struct io_uring_params p = {.flags = IORING_SETUP_SUBMIT_ALL | IORING_SETUP_CQSIZE, .cq_entries = CQ_ENTRIES};
	int r = io_uring_queue_init_params(RING_ENTRIES, &ring, &p);
	if (r == -EINVAL) {
		memset(&p, 0, sizeof(p));
		r = io_uring_queue_init_params(RING_ENTRIES, &ring, &p);
	}
	if (r < 0) {
		log_debug("io_uring not available (%s): receives stay on epoll", strerror(-r));
		return false;
	}
	skip_cancel_cqe = p.features & IORING_FEAT_CQE_SKIP;
	struct io_uring_probe *probe = io_uring_get_probe_ring(&ring);
	bool ok = probe && io_uring_opcode_supported(probe, IORING_OP_RECV) &&
	          io_uring_opcode_supported(probe, IORING_OP_ASYNC_CANCEL);
	if (probe)
		io_uring_free_probe(probe);
	size_t ring_bytes = BUF_COUNT * sizeof(struct io_uring_buf);
	if (ok) {
		void *m = mmap(NULL, ring_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		bufring = m == MAP_FAILED ? NULL : m;
		ok = bufring != NULL;
	}
	if (ok) {
		struct io_uring_buf_reg reg = {
		    .ring_addr = (uint64_t)(uintptr_t)bufring, .ring_entries = BUF_COUNT, .bgid = BUF_GROUP};
		r = io_uring_register_buf_ring(&ring, &reg, 0);
		if (r < 0) {
			log_debug("io_uring without provided buffer rings (%s): receives stay on epoll", strerror(-r));
			munmap(bufring, ring_bytes);
			bufring = NULL;
			ok = false;
		}
	}
	if (!ok) {
		io_uring_queue_exit(&ring);
		return false;
	}
	/* the buffers' pages are touched only as the kernel fills them */
	bufs = xmalloc((size_t)BUF_COUNT * BUF_SIZE);
	io_uring_buf_ring_init(bufring);
	int mask = io_uring_buf_ring_mask(BUF_COUNT);
	for (int i = 0; i < BUF_COUNT; i++)
		io_uring_buf_ring_add(bufring, bufs + (size_t)i * BUF_SIZE, BUF_SIZE, (unsigned short)i, mask, i);
	io_uring_buf_ring_advance(bufring, BUF_COUNT);
	return true;
}

static void reap(void);

static void on_ring(evutil_socket_t fd, short what, void *arg)
{
	(void)fd, (void)what, (void)arg;
	reaping = true;
	reap();
	reaping = false;
	ops->done();
}

bool recvq_init(struct event_base *base, const RecvqOps *cb)
{
	if (enabled)
		return true;
	if (!io_uring_wanted(true)) {
		log_debug("PGBOUNCER_IO_URING is 0 or send: receives stay on epoll");
		return false;
	}
	if (!setup())
		return false;
	ops = cb;
	ring_ev = event_new(base, ring.ring_fd, EV_READ | EV_PERSIST, on_ring, NULL);
	if (!ring_ev || event_add(ring_ev, NULL) < 0) {
		log_warning("could not watch the receive ring: receives stay on epoll");
		return false;
	}
	enabled = true;
	log_debug("receives of logged-in plain sockets go through io_uring");
	return true;
}

bool recvq_enabled(void)
{
	return enabled;
}

/* An SQE, submitting the queued ones first when the ring is full. */
static struct io_uring_sqe *get_sqe(void)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
	if (!sqe) {
		recvq_submit();
		sqe = io_uring_get_sqe(&ring);
	}
	if (sqe)
		queued++;
	return sqe;
}

uint32_t recvq_start(void *owner, int fd)
{
	if (!enabled)
		return 0;
	if (!free_head) {
		uint32_t n = n_slots ? n_slots * 2 : 64;
		slots = xrealloc(slots, n * sizeof(*slots));
		for (uint32_t i = n_slots; i < n; i++)
			slots[i] = (Slot){.next_free = i + 1 < n ? i + 2 : free_head};
		free_head = n_slots + 1;
		n_slots = n;
	}
	struct io_uring_sqe *sqe = get_sqe();
	if (!sqe)
		return 0;
	uint32_t id = free_head;
	Slot *s = &slots[id - 1];
	free_head = s->next_free;
	*s = (Slot){.owner = owner, .used = true, .batch = batch, .sq_pos = ring.sq.sqe_tail - 1};
	io_uring_prep_recv_multishot(sqe, fd, NULL, 0, 0);
	sqe->flags |= IOSQE_BUFFER_SELECT;
	sqe->buf_group = BUF_GROUP;
	io_uring_sqe_set_data64(sqe, id);
	return id;
}

/* Whether the kernel has not taken slot s's start from the submission queue yet. */
static bool start_pending(const Slot *s)
{
	/* batch moves on once the queue is empty: only then can sq_pos be far behind the head */
	return s->batch == batch && queued && (int32_t)(s->sq_pos - io_uring_smp_load_acquire(ring.sq.khead)) >= 0;
}

bool recvq_stop(uint32_t id, bool keep_owner)
{
	pgb_assert(id && id <= n_slots && slots[id - 1].used);
	Slot *s = &slots[id - 1];
	/*
	 * A start not submitted yet names its socket by descriptor number: the
	 * owner may close it right after this, and a socket accepted in the
	 * same pass may get the number. The start goes to the kernel now,
	 * while the number is still its socket's; if the kernel does not take
	 * it, it is withdrawn (a no-op in its place) and ends here.
	 */
	if (start_pending(s))
		recvq_submit();
	if (start_pending(s)) {
		struct io_uring_sqe *sqe = &ring.sq.sqes[s->sq_pos & *ring.sq.kring_mask];
		io_uring_prep_nop(sqe);
		io_uring_sqe_set_data64(sqe, CANCEL_TAG);
		void *owner = keep_owner ? s->owner : NULL;
		*s = (Slot){.next_free = free_head};
		free_head = id;
		if (owner)
			ops->end(owner, -ECANCELED);
		return true;
	}
	if (!keep_owner)
		s->owner = NULL;
	struct io_uring_sqe *sqe = get_sqe();
	if (!sqe) {
		/* the ring refuses submissions: nothing more can arrive through it either */
		log_warning("io_uring: could not cancel a receive");
		return false;
	}
	io_uring_prep_cancel64(sqe, id, 0);
	io_uring_sqe_set_data64(sqe, CANCEL_TAG);
	/* the receive's own last completion says it ended: half the completions of a mass close */
	if (skip_cancel_cqe)
		sqe->flags |= IOSQE_CQE_SKIP_SUCCESS;
	return false;
}

void recvq_wake(void)
{
	if (ring_ev && !reaping)
		event_active(ring_ev, EV_READ, 0);
}

void recvq_submit(void)
{
	if (!queued)
		return;
	int r;
	do
		r = io_uring_submit(&ring);
	while (r == -EINTR);
	/*
	 * What the kernel did not take stays in the submission queue and goes
	 * with the next io_uring_enter(): those starts are not submitted yet
	 * (their slots keep this batch), and recvq_stop() tries again before
	 * their sockets may be closed.
	 */
	unsigned left = io_uring_sq_ready(&ring);
	if (r < 0) {
		static usec_t logged;
		usec_t now = get_mono_usec();
		if (!logged || now - logged >= 10 * USEC_PER_SEC) {
			logged = now;
			log_warning("io_uring: submitting %u receive starts and stops failed: %s", queued,
			            strerror(-r));
		}
	}
	queued = left;
	if (!left)
		batch++;
}

/* Report one completion; true when it was its receive's last. */
static bool complete(const struct io_uring_cqe *cqe, unsigned *bufs_back)
{
	uint64_t ud = io_uring_cqe_get_data64(cqe);
	if (ud == CANCEL_TAG || ud == 0 || ud > n_slots)
		return false;
	Slot *s = &slots[ud - 1];
	if (cqe->flags & IORING_CQE_F_BUFFER) {
		unsigned bid = cqe->flags >> IORING_CQE_BUFFER_SHIFT;
		uint8_t *b = bufs + (size_t)bid * BUF_SIZE;
		if (cqe->res > 0 && s->owner)
			ops->data(s->owner, b, (size_t)cqe->res);
		io_uring_buf_ring_add(bufring, b, BUF_SIZE, (unsigned short)bid, io_uring_buf_ring_mask(BUF_COUNT),
		                      (int)*bufs_back);
		(*bufs_back)++;
	}
	if (cqe->flags & IORING_CQE_F_MORE)
		return false;
	int res = cqe->res > 0 ? -ENOBUFS : cqe->res;
	if (res == -EINVAL || res == -EOPNOTSUPP) {
		/* a kernel without multishot receives: every socket goes back to epoll */
		if (enabled)
			log_info("io_uring refuses multishot receives (%s): receives stay on epoll", strerror(-res));
		enabled = false;
	}
	void *owner = s->owner;
	*s = (Slot){.next_free = free_head};
	free_head = (uint32_t)ud;
	if (owner)
		ops->end(owner, res);
	return true;
}

/* Report every completion posted so far; true when `id`'s receive ended among them. */
static bool reap_until(uint32_t id)
{
	bool ended = false;
	for (;;) {
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0, back = 0;
		io_uring_for_each_cqe(&ring, head, cqe)
		{
			seen++;
			if (complete(cqe, &back) && id && io_uring_cqe_get_data64(cqe) == id)
				ended = true;
		}
		if (!seen) {
			/*
			 * Completions beyond the queue's room wait in the kernel,
			 * which keeps the ring's descriptor readable meanwhile:
			 * fetch them, or the loop would spin and no receive would
			 * report again.
			 */
			if (!io_uring_cq_has_overflow(&ring))
				return ended;
			int r = io_uring_get_events(&ring);
			if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
				log_warning("io_uring: fetching the completions kept aside failed: %s", strerror(-r));
				return ended;
			}
			if (!io_uring_cq_ready(&ring))
				return ended; /* nothing came back now: the ring stays readable, the next pass asks again */
			continue;
		}
		if (back)
			io_uring_buf_ring_advance(bufring, (int)back);
		io_uring_cq_advance(&ring, seen);
	}
}

static void reap(void)
{
	(void)reap_until(0);
}

bool recvq_stop_wait(uint32_t id)
{
	if (recvq_stop(id, true))
		return true; /* it never started */
	recvq_submit();
	/*
	 * A receive waiting for data is cancelled at the submission itself; the
	 * bound keeps a worker from hanging on one that is not, with every
	 * other client of the worker waiting behind it.
	 */
	uint64_t until = get_mono_usec() + STOP_WAIT_USEC;
	bool ended;
	while (!(ended = reap_until(id))) {
		uint64_t now = get_mono_usec();
		if (now >= until)
			break;
		struct __kernel_timespec ts = {.tv_sec = 0, .tv_nsec = (long long)(until - now) * 1000};
		struct io_uring_cqe *cqe;
		int r = io_uring_wait_cqe_timeout(&ring, &cqe, &ts);
		if (r < 0 && r != -EINTR && r != -ETIME) {
			log_warning("io_uring: waiting for a cancelled receive failed: %s", strerror(-r));
			break;
		}
	}
	if (!ended)
		log_warning("io_uring: a cancelled receive did not end within %d ms: its socket stays here",
		            (int)(STOP_WAIT_USEC / 1000));
	/* what the others received is processed from the event loop */
	event_active(ring_ev, EV_READ, 0);
	return ended;
}

#else /* !HAVE_LIBURING */

bool recvq_init(struct event_base *base, const RecvqOps *cb)
{
	(void)base, (void)cb;
	return false;
}

bool recvq_enabled(void)
{
	return false;
}

uint32_t recvq_start(void *owner, int fd)
{
	(void)owner, (void)fd;
	return 0;
}

bool recvq_stop(uint32_t id, bool keep_owner)
{
	(void)id, (void)keep_owner;
	return true;
}

bool recvq_stop_wait(uint32_t id)
{
	(void)id;
	return true;
}

void recvq_wake(void)
{
}

void recvq_submit(void)
{
}

#endif
