/*
 * Stream buffer: socket I/O for one connection, packet cutting, forwarding
 * to the linked peer with back-pressure, and pooler-generated output.
 * See include/worker/sbuf.h for the contract.
 */
#include "autoconfig.h"

#include "worker/sbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/err.h>

#include "common/log.h"
#include "common/util.h"
#include "common/list.h"
#include "worker/recvq.h"
#include "worker/sendq.h"

/* Result of one step of the processing loop. */
typedef enum Step {
	STEP_OK,      /* continue */
	STEP_NEED,    /* need more input */
	STEP_BLOCKED, /* output to the peer is blocked; wait for it */
	STEP_WAIT,    /* the owner asked to stop */
	STEP_CLOSED,  /* the connection is gone */
	STEP_TLS,     /* the owner switched the socket to TLS: run the handshake */
} Step;

/* Reads per event before others get their turn, 0 = no limit (sbuf_set_loopcnt). */
static const int *loopcnt;

/* Run at the start of each socket event (sbuf_set_wake_hook). */
static void (*wake_hook)(void);

/* The last TLS failure, for the owner's callback (one event loop per process). */
static char tls_err[256];

static void on_read(evutil_socket_t fd, short what, void *arg);
static void on_write(evutil_socket_t fd, short what, void *arg);
static void sbuf_process(SBuf *sb, bool do_read);
static void enable_write(SBuf *sb);

void sbuf_set_wake_hook(void (*hook)(void))
{
	wake_hook = hook;
}

void sbuf_set_loopcnt(const int *setting)
{
	loopcnt = setting;
}

void sbuf_set_nonblocking(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl >= 0)
		fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Remember why a TLS call failed; `what` says which. */
static void note_tls_error(SBuf *sb, const char *what, int sslerr)
{
	unsigned long e = ERR_peek_last_error();
	char reason[200] = "";
	const char *rs = e ? ERR_reason_error_string(e) : NULL;
	long vr = sb->ssl ? SSL_get_verify_result(sb->ssl) : X509_V_OK;
	if (rs && vr != X509_V_OK)
		snprintf(reason, sizeof(reason), "%s: %s", rs, X509_verify_cert_error_string(vr));
	else if (rs)
		snprintf(reason, sizeof(reason), "%s", rs);
	else if (e)
		ERR_error_string_n(e, reason, sizeof(reason));
	else if (sslerr == SSL_ERROR_SYSCALL)
		snprintf(reason, sizeof(reason), "%s", errno ? strerror(errno) : "unexpected eof");
	else
		snprintf(reason, sizeof(reason), "SSL error %d", sslerr);
	snprintf(tls_err, sizeof(tls_err), "%s: %s", what, reason);
	ERR_clear_error();
	sb->tls_failed = true;
}

const char *sbuf_tls_error(void)
{
	return tls_err;
}

/*
 * recv()/send() semantics over plain TCP or TLS: >0 bytes, 0 = EOF (recv),
 * -1 with errno (EAGAIN when the socket is not ready).
 */
static ssize_t io_recv(SBuf *sb, void *buf, size_t len)
{
	if (!sb->ssl)
		return recv(sb->fd, buf, len, 0);
	ERR_clear_error();
	int n = SSL_read(sb->ssl, buf, len > INT_MAX ? INT_MAX : (int)len);
	if (n > 0)
		return n;
	int e = SSL_get_error(sb->ssl, n);
	switch (e) {
	case SSL_ERROR_WANT_READ:
		errno = EAGAIN;
		return -1;
	case SSL_ERROR_WANT_WRITE:
		/* the read must wait for the socket to take TLS output (key update) */
		sb->tls_read_wants_write = true;
		errno = EAGAIN;
		return -1;
	case SSL_ERROR_ZERO_RETURN:
		return 0; /* close_notify */
	default:
		note_tls_error(sb, "TLS read failed", e);
		errno = ECONNRESET;
		return -1;
	}
}

static bool batching; /* sbuf_init_sends() set up the send queue */

/* Sockets the receive ring brought something for (SBufRing), and the ones being processed now. */
static List ready = {&ready, &ready};
static List ring_batch = {&ring_batch, &ring_batch};

/* The unsent tail of a queued send (SBuf.spill). */
struct SBufSpill {
	uint32_t len, pos;
	uint8_t data[];
};

/* A send to this socket waits in the pass's send queue. */
static inline bool is_queued(const SBuf *sb)
{
	return sendq_pending(sb->queued_in);
}

/* sendq_flush()'s report of a queued send not taken whole: keep the rest, and ask for a write event. */
static void on_send_result(void *owner, const void *data, size_t unsent, int err)
{
	SBuf *sb = owner;
	/* a socket with a spill queues nothing, so there is at most one (see plain_send()) */
	pgb_assert(!sb->spill);
	struct SBufSpill *sp = xmalloc(sizeof(*sp) + unsent);
	sp->len = (uint32_t)unsent;
	sp->pos = 0;
	memcpy(sp->data, data, unsent);
	sb->spill = sp;
	/* the write event sends it again, and reports a failure to the owner */
	if (err && err != EAGAIN)
		log_debug("sbuf: queued send failed: %s", strerror(err));
	enable_write(sb);
}

/* Write the spill; false with errno when it cannot all go now. */
static bool drain_spill(SBuf *sb)
{
	struct SBufSpill *sp = sb->spill;
	while (sp->pos < sp->len) {
		ssize_t n = send(sb->fd, sp->data + sp->pos, sp->len - sp->pos, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return false;
		}
		sp->pos += (uint32_t)n;
	}
	free(sp);
	sb->spill = NULL;
	return true;
}

/*
 * The order of the bytes on one plain socket: a queued send is submitted
 * before the socket is written again, and its spill is written first.
 * false with errno when the socket cannot be written now.
 */
static bool plain_ready(SBuf *sb)
{
	if (is_queued(sb))
		sendq_flush();
	return !sb->spill || drain_spill(sb);
}

/* a, then b, to a plain socket: queued for the end of the loop pass, or sent now. */
static ssize_t plain_send(SBuf *sb, const void *a, size_t alen, const void *b, size_t blen)
{
	if (!plain_ready(sb))
		return -1;
	/*
	 * A pass's only send goes out directly: one io_uring_enter() for one
	 * send costs more than the send() itself (a login, a light load).
	 */
	if (batching && (sendq_queued() || !list_empty(&ring_batch) ||
	                 event_base_get_num_events(event_get_base(&sb->ev_read), EVENT_BASE_COUNT_ACTIVE) > 0)) {
		uint32_t batch = sendq_add(sb, sb->fd, a, alen, b, blen);
		if (batch) {
			sb->queued_in = batch;
			return (ssize_t)(alen + blen);
		}
	}
	if (!blen)
		return send(sb->fd, a, alen, MSG_NOSIGNAL);
	struct iovec iov[2] = {{(void *)a, alen}, {(void *)b, blen}};
	struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
	return sendmsg(sb->fd, &mh, MSG_NOSIGNAL);
}

void sbuf_init_sends(void)
{
	batching = sendq_init(on_send_result);
}

static ssize_t io_send(SBuf *sb, const void *buf, size_t len)
{
	if (!sb->ssl)
		return plain_send(sb, buf, len, NULL, 0);
	ERR_clear_error();
	int n = SSL_write(sb->ssl, buf, len > INT_MAX ? INT_MAX : (int)len);
	if (n > 0)
		return n;
	int e = SSL_get_error(sb->ssl, n);
	if (e == SSL_ERROR_WANT_WRITE) {
		errno = EAGAIN;
		return -1;
	}
	/* WANT_READ would mean renegotiation, which the contexts forbid */
	note_tls_error(sb, "TLS write failed", e);
	errno = ECONNRESET;
	return -1;
}

/*
 * Input buffers of the base size that idle sockets gave back, reused last
 * in, first out (one event loop per process): an idle connection holds no
 * input buffer, and the few sockets busy at a time share a hot few. See
 * doc/benchmarks.md, "Memory per idle client".
 */
#define BUF_CACHE_MAX 64
static uint8_t *buf_cache[BUF_CACHE_MAX];
static int buf_cache_n;
/*
 * Sockets holding an input buffer. While they hold up to KEEP_BYTES (128
 * buffers at the default pkt_buf), a busy socket keeps its buffer between
 * events, so that the hot path of a few hundred connections does not pay a
 * cache get and put per event; beyond, every socket gives an empty buffer
 * back at the end of its event (doc/benchmarks.md, "Memory per active
 * client").
 */
#define KEEP_BYTES (512 * 1024)
static size_t buffers_held;
static uint32_t buf_cache_size; /* the size of the cached buffers (pkt_buf may change on reload) */

static uint8_t *buf_get(uint32_t size)
{
	if (buf_cache_n > 0 && buf_cache_size == size)
		return buf_cache[--buf_cache_n];
	return xmalloc(size);
}

static void buf_put(uint8_t *buf, uint32_t size)
{
	if (buf_cache_n > 0 && buf_cache_size != size) {
		/* pkt_buf changed: the old size goes */
		while (buf_cache_n > 0)
			free(buf_cache[--buf_cache_n]);
	}
	if (buf_cache_n < BUF_CACHE_MAX) {
		buf_cache_size = size;
		buf_cache[buf_cache_n++] = buf;
		return;
	}
	free(buf);
}

/* Give the input buffer back when nothing is buffered or due to the peer; the next read takes one. */
static inline void release_input(SBuf *sb)
{
	if (!sb->buf || sb->pos != sb->end || sb->send_pos != sb->send_end)
		return;
	if (sb->size == sb->base_size)
		buf_put(sb->buf, sb->size);
	else
		free(sb->buf); /* grown for one large packet */
	sb->buf = NULL;
	buffers_held--;
	sb->size = sb->pos = sb->end = 0;
}

/* Free the output queue's memory once it is all written. */
static void release_output(SBuf *sb)
{
	if (sb->out.buf && sb->out_pos >= sb->out.len && !sb->out.in_msg) {
		pktbuf_free(&sb->out);
		sb->out_pos = 0;
	}
}

static void sbuf_setup(SBuf *sb, struct event_base *base, int fd, uint32_t pkt_buf, uint32_t max_len, sbuf_cb_t cb,
                       void *owner)
{
	/* no input buffer (the first read takes one) and no output memory until needed */
	memset(sb, 0, sizeof(*sb));
	sb->fd = fd;
	sb->base_size = pkt_buf < 512 ? 512 : pkt_buf;
	sb->max_len = max_len;
	sb->cb = cb;
	sb->owner = owner;
	event_assign(&sb->ev_read, base, fd, EV_READ | EV_PERSIST, on_read, sb);
}

/*
 * Receiving through io_uring (worker/recvq.h; doc/architecture.md,
 * "Batched receives"). What the ring received for a socket waits in its
 * stash until read_some() takes it, as it would take it from the socket;
 * sockets that got something are put on the ready list and processed
 * after the ring's completions were reaped, as a readiness event would.
 * While the socket is paused the receive stays armed, as the read event
 * does on epoll; a stash that grows beyond stash_limit() stops it until
 * read_some() emptied the stash.
 */
typedef struct SBufRing {
	List ready_node; /* on `ready` or `ring_batch` */
	SBuf *sb;
	uint32_t id;   /* the receive in the ring, 0 = none */
	bool stopping; /* recvq_stop() asked for its end */
	bool eof;      /* EOF behind the stash */
	int err;       /* an error behind the stash (errno), 0 = none */
	uint8_t *data; /* the stash: [off, len) not yet read */
	uint32_t off, len, cap;
} SBufRing;

#define STASH_LIMIT      (32 * 1024) /* or pkt_buf, if larger: what one recv() could have taken */
#define RING_AFTER_READS 4 /* recv() calls before a socket moves to the ring: a one-query connection never does */

/* How much the stash holds before the receive stops: as much as one recv() into the buffer could take. */
static inline uint32_t stash_limit(const SBuf *sb)
{
	return sb->base_size > STASH_LIMIT ? sb->base_size : STASH_LIMIT;
}

static void ring_schedule(SBufRing *r)
{
	if (!list_linked(&r->ready_node)) {
		list_append(&ready, &r->ready_node);
		recvq_wake();
	}
}

static inline bool ring_has_input(const SBufRing *r)
{
	return r->len > r->off || r->eof || r->err;
}

/* Start the receive when it may run: wanted, not running, room in the stash. */
static void ring_restart(SBuf *sb)
{
	SBufRing *r = sb->rq;
	if (r->id || !sb->ring_ok || r->eof || r->err || r->len - r->off >= stash_limit(sb) || sb->fd < 0)
		return;
	r->id = recvq_start(sb, sb->fd);
	r->stopping = false;
	if (!r->id)
		sb->ring_ok = false; /* read_some() goes back to recv() once the stash is empty */
}

/* Move a socket that reads on epoll to the ring. */
static void ring_enter(SBuf *sb)
{
	if (sb->rq || !recvq_enabled() || sb->ssl || sb->tls_handshake || sb->raw_byte || sb->detect_tls ||
	    sb->connecting || sb->fd < 0)
		return;
	SBufRing *r = xcalloc(1, sizeof(*r));
	list_init(&r->ready_node);
	r->sb = sb;
	sb->rq = r;
	ring_restart(sb);
	if (!r->id) {
		sb->rq = NULL;
		free(r);
		return;
	}
	if (sb->reading)
		event_del(&sb->ev_read);
}

/* Back to epoll, with nothing in the stash and no receive in the ring. */
static void ring_leave(SBuf *sb)
{
	SBufRing *r = sb->rq;
	pgb_assert(!r->id && !ring_has_input(r));
	list_del(&r->ready_node);
	free(r->data);
	free(r);
	sb->rq = NULL;
	if (sb->reading)
		event_add(&sb->ev_read, NULL);
}

/* The socket is being closed: the ring forgets it. */
static void ring_drop(SBuf *sb)
{
	SBufRing *r = sb->rq;
	if (r->id)
		recvq_stop(r->id, false);
	list_del(&r->ready_node);
	free(r->data);
	free(r);
	sb->rq = NULL;
}

static void ring_on_data(void *owner, const uint8_t *data, size_t len)
{
	SBuf *sb = owner;
	SBufRing *r = sb->rq;
	if (r->off == r->len)
		r->off = r->len = 0;
	if (r->len + len > r->cap) {
		if (r->off) {
			memmove(r->data, r->data + r->off, r->len - r->off);
			r->len -= r->off;
			r->off = 0;
		}
		uint32_t cap = r->cap ? r->cap : 512;
		while (cap < r->len + len)
			cap *= 2;
		if (cap != r->cap) {
			r->data = xrealloc(r->data, cap);
			r->cap = cap;
		}
	}
	memcpy(r->data + r->len, data, len);
	r->len += (uint32_t)len;
	if (r->len - r->off >= stash_limit(sb) && r->id && !r->stopping) {
		/* nobody takes it now: the rest waits in the socket (back-pressure, as on epoll) */
		r->stopping = true;
		if (!recvq_stop(r->id, true)) /* true: it ended at once (ring_on_end()) */
			recvq_submit();       /* now, or more buffers fill before the pass ends */
	}
	ring_schedule(r);
}

static void ring_on_end(void *owner, int res)
{
	SBuf *sb = owner;
	SBufRing *r = sb->rq;
	r->id = 0;
	r->stopping = false;
	if (res == 0)
		r->eof = true;
	else if (res == -ENOBUFS)
		ring_restart(sb); /* the buffers ran out, not the stash's room: on at once, as a recv() would go on */
	else if (res == -ECANCELED)
		; /* started again by read_some() or enable_read() */
	else if (res == -EINVAL || res == -EOPNOTSUPP)
		sb->ring_ok = false; /* the kernel cannot: back to epoll */
	else
		r->err = -res;
	ring_schedule(r);
}

static void sbuf_process(SBuf *sb, bool do_read);

/* The sockets the ring brought something for, processed as a readiness event would be. */
static void ring_on_done(void)
{
	if (list_empty(&ready))
		return;
	if (wake_hook)
		wake_hook();
	/* those put back on `ready` while these run wait for the next round */
	ring_batch.next = ready.next;
	ring_batch.prev = ready.prev;
	ring_batch.next->prev = &ring_batch;
	ring_batch.prev->next = &ring_batch;
	list_init(&ready);
	List *n;
	while ((n = list_first(&ring_batch))) {
		list_del(n);
		SBuf *sb = container_of(n, SBufRing, ready_node)->sb;
		if (sb->fd < 0 || !sb->reading || sb->in_process)
			continue;
		if (sb->paused) {
			/* the stash keeps it until sbuf_continue() (no TLS socket is on the ring) */
			sb->reading = false;
			continue;
		}
		sbuf_process(sb, true);
	}
}

static const RecvqOps ring_ops = {.data = ring_on_data, .end = ring_on_end, .done = ring_on_done};

void sbuf_init_receives(struct event_base *base)
{
	(void)recvq_init(base, &ring_ops);
}

void sbuf_use_ring(SBuf *sb)
{
	if (recvq_enabled() && !sb->ssl && sb->fd >= 0) {
		sb->ring_ok = true;
		sb->direct_reads = 0;
	}
}

bool sbuf_ring_release(SBuf *sb)
{
	sb->ring_ok = false;
	SBufRing *r = sb->rq;
	if (!r)
		return true;
	if (r->id && !recvq_stop_wait(r->id)) {
		r->stopping = true; /* still in the ring: the socket stays, its end comes later */
		return false;
	}
	if (ring_has_input(r)) {
		ring_schedule(r); /* read_some() takes it, then leaves the ring */
		return false;
	}
	ring_leave(sb);
	return true;
}

bool sbuf_ring_holds(const SBuf *sb)
{
	return sb->rq && ring_has_input(sb->rq);
}

/*
 * read_some() on a socket in the ring: take from the stash. STEP_NEED with
 * sb->rq NULL: the socket left the ring, recv() it.
 */
static Step ring_read(SBuf *sb, bool *filled)
{
	SBufRing *r = sb->rq;
	if (r->len > r->off) {
		uint32_t n = r->len - r->off, space = sb->size - sb->end;
		if (n > space)
			n = space;
		memcpy(sb->buf + sb->end, r->data + r->off, n);
		r->off += n;
		sb->end += n;
		sb->bytes_in += n;
		*filled = r->len > r->off;
		if (!*filled)
			ring_restart(sb);
		return STEP_OK;
	}
	if (r->eof || r->err) {
		sb->last_errno = r->err;
		sb->cb(sb, SBEV_EOF, NULL, NULL, 0);
		return STEP_CLOSED;
	}
	ring_restart(sb);
	if (!r->id && !sb->ring_ok)
		ring_leave(sb);
	return STEP_NEED;
}

static void enable_read(SBuf *sb)
{
	if (sb->reading || sb->fd < 0 || sb->connecting)
		return;
	sb->reading = true;
	if (sb->rq) {
		ring_restart(sb);
		if (ring_has_input(sb->rq))
			ring_schedule(sb->rq); /* as a level-triggered event would fire */
		else if (!sb->rq->id && !sb->ring_ok)
			ring_leave(
			    sb); /* the ring cannot take it again: epoll reads it (ring_leave() adds the event) */
		return;
	}
	event_add(&sb->ev_read, NULL);
}

static void disable_read(SBuf *sb)
{
	if (sb->reading) {
		if (!sb->rq)
			event_del(&sb->ev_read);
		sb->reading = false;
	}
}

static void enable_write(SBuf *sb)
{
	if (!sb->writing && sb->fd >= 0) {
		if (!sb->ev_write) {
			/* most clients never wait to write: they carry no write event until then */
			sb->ev_write = xmalloc(event_get_struct_event_size());
			event_assign(sb->ev_write, event_get_base(&sb->ev_read), sb->fd, EV_WRITE | EV_PERSIST,
			             on_write, sb);
		}
		event_add(sb->ev_write, NULL);
		sb->writing = true;
	}
}

static void disable_write(SBuf *sb)
{
	if (sb->writing) {
		event_del(sb->ev_write);
		sb->writing = false;
	}
}

void sbuf_accept(SBuf *sb, struct event_base *base, int fd, uint32_t pkt_buf, uint32_t max_len, sbuf_cb_t cb,
                 void *owner)
{
	sbuf_setup(sb, base, fd, pkt_buf, max_len, cb, owner);
	sb->startup = true;
	sb->give_back = true;
	enable_read(sb);
}

void sbuf_attach(SBuf *sb, struct event_base *base, int fd, uint32_t pkt_buf, uint32_t max_len, sbuf_cb_t cb,
                 void *owner)
{
	sbuf_setup(sb, base, fd, pkt_buf, max_len, cb, owner);
	enable_read(sb);
}

void sbuf_preload(SBuf *sb, const void *data, uint32_t len)
{
	pgb_assert(!sb->buf && sb->fd >= 0);
	uint32_t size = len > sb->base_size ? len : sb->base_size;
	sb->buf = size == sb->base_size ? buf_get(size) : xmalloc(size);
	buffers_held++;
	sb->size = size;
	memcpy(sb->buf, data, len);
	sb->pos = 0;
	sb->end = len;
	event_active(&sb->ev_read, EV_READ, 0);
}

void sbuf_read_now(SBuf *sb)
{
	if (sb->fd >= 0 && !sb->tls_handshake)
		sbuf_process(sb, true);
}

bool sbuf_connect(SBuf *sb, struct event_base *base, const struct sockaddr *sa, socklen_t salen, uint32_t pkt_buf,
                  uint32_t max_len, void (*tune)(int fd), sbuf_cb_t cb, void *owner)
{
	int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	sbuf_setup(sb, base, fd, pkt_buf, max_len, cb, owner);
	if (fd < 0) {
		sb->last_errno = errno;
		return false;
	}
	if (tune && sa->sa_family != AF_UNIX)
		tune(fd);
	if (connect(fd, sa, salen) < 0 && errno != EINPROGRESS) {
		sb->last_errno = errno;
		return false;
	}
	/* completion (or failure) is reported when the socket becomes writable */
	sb->connecting = true;
	enable_write(sb);
	return true;
}

void sbuf_pause(SBuf *sb)
{
	sb->paused = true;
	disable_read(sb);
}

void sbuf_continue(SBuf *sb)
{
	sb->paused = false;
	if (sb->fd < 0)
		return;
	if (sb->in_process) {
		/* called from inside this buffer's own callback: the loop picks it up */
		sb->resume_pending = true;
		return;
	}
	sbuf_process(sb, false);
}

/* Write the pooler-generated queue. Returns STEP_OK when empty, STEP_BLOCKED, or STEP_CLOSED on error. */
static Step flush_out(SBuf *sb)
{
	if (sb->spill && !drain_spill(sb)) {
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			enable_write(sb);
			return STEP_BLOCKED;
		}
		sb->last_errno = errno;
		return STEP_CLOSED;
	}
	while (sb->out_pos < sb->out.len) {
		ssize_t n = io_send(sb, sb->out.buf + sb->out_pos, sb->out.len - sb->out_pos);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				enable_write(sb);
				return STEP_BLOCKED;
			}
			sb->last_errno = errno;
			return STEP_CLOSED;
		}
		sb->out_pos += (size_t)n;
	}
	pktbuf_reset(&sb->out);
	sb->out_pos = 0;
	return STEP_OK;
}

/*
 * The peer's queued pooler bytes and this buffer's pending range in one
 * sendmsg() (plain sockets): a renamed Bind followed by the forwarded
 * Execute and Sync costs one system call, not two. STEP_OK with whatever
 * is left for the ordinary path, STEP_BLOCKED or STEP_CLOSED.
 */
static Step send_both(SBuf *sb, SBuf *dst)
{
	if (dst->out_pos >= dst->out.len)
		return STEP_OK;
	size_t out_left = dst->out.len - dst->out_pos;
	ssize_t n;
	do
		n = plain_send(dst, dst->out.buf + dst->out_pos, out_left, sb->buf + sb->send_pos,
		               sb->send_end - sb->send_pos);
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			enable_write(dst);
			return STEP_BLOCKED;
		}
		dst->last_errno = errno;
		return STEP_CLOSED;
	}
	size_t from_out = (size_t)n < out_left ? (size_t)n : out_left;
	dst->out_pos += from_out;
	if (dst->out_pos >= dst->out.len) {
		pktbuf_reset(&dst->out);
		dst->out_pos = 0;
	}
	sb->send_pos += (uint32_t)((size_t)n - from_out);
	sb->bytes_out += (uint64_t)((size_t)n - from_out);
	return STEP_OK;
}

/*
 * Write this buffer's pending range to the peer. On a partial write the
 * source stops reading and waits for the peer's write event.
 */
static Step flush_pending_slow(SBuf *sb)
{
	SBuf *dst = sb->dst;
	if (sb->send_pos == sb->send_end) {
		/* pooler bytes queued for the peer by sbuf_forward_own() go out with the batch */
		if (dst && dst->fd >= 0 && dst->out_pos < dst->out.len && !dst->writing && !dst->connecting &&
		    flush_out(dst) == STEP_CLOSED)
			enable_write(dst); /* its write event reports the failure to its owner */
		return STEP_OK;
	}
	if (!dst || dst->fd < 0) {
		/* the peer went away: nothing to deliver to */
		sb->send_pos = sb->send_end = 0;
		return STEP_OK;
	}
	Step st = STEP_OK;
	if (dst->out_pos < dst->out.len) {
		/* the peer's own queue first (usually empty) */
		st = dst->ssl ? STEP_OK : send_both(sb, dst);
		if (st == STEP_OK)
			st = flush_out(dst);
	}
	if (st == STEP_CLOSED) {
		dst->waiting_src = NULL;
		return STEP_CLOSED;
	}
	while (st == STEP_OK && sb->send_pos < sb->send_end) {
		ssize_t n = io_send(dst, sb->buf + sb->send_pos, sb->send_end - sb->send_pos);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				enable_write(dst);
				st = STEP_BLOCKED;
				break;
			}
			dst->last_errno = errno;
			return STEP_CLOSED;
		}
		sb->send_pos += (uint32_t)n;
		sb->bytes_out += (uint64_t)n;
	}
	if (st == STEP_BLOCKED) {
		dst->waiting_src = sb;
		disable_read(sb);
		return STEP_BLOCKED;
	}
	sb->send_pos = sb->send_end = 0;
	return STEP_OK;
}

/* flush_pending_slow(), with the common case of nothing to write decided inline. */
static inline Step flush_pending(SBuf *sb)
{
	if (sb->send_pos == sb->send_end && (!sb->dst || sb->dst->out_pos >= sb->dst->out.len))
		return STEP_OK;
	return flush_pending_slow(sb);
}

/* Make room so that a packet of `need` bytes starting at pos fits in the buffer. */
static void make_room(SBuf *sb, uint32_t need)
{
	/* only called when nothing is pending, so bytes before pos are dead */
	if (sb->pos > 0) {
		memmove(sb->buf, sb->buf + sb->pos, sb->end - sb->pos);
		sb->end -= sb->pos;
		sb->pos = 0;
	}
	if (need > sb->size) {
		sb->buf = xrealloc(sb->buf, need);
		sb->size = need;
	}
}

/*
 * Mark n bytes at pos as due to the peer, flushing first when the range
 * would not be contiguous. mid_pkt: they continue a packet begun earlier.
 */
static Step add_pending(SBuf *sb, uint32_t n, bool mid_pkt)
{
	if (sb->send_pos != sb->send_end && sb->send_end != sb->pos) {
		Step st = flush_pending(sb);
		if (st != STEP_OK)
			return st;
	}
	if (sb->send_pos == sb->send_end) {
		sb->send_pos = sb->send_end = sb->pos;
		sb->marked_mid_pkt = mid_pkt;
	}
	sb->send_end = sb->pos + n;
	return STEP_OK;
}

bool sbuf_drop_marked(SBuf *src)
{
	if (src->send_pos != src->send_end && src->marked_mid_pkt)
		return false;
	src->send_pos = src->send_end = 0;
	return true;
}

/* Cut buffered input into packets and act on them. */
static Step process_buffer(SBuf *sb)
{
	while (sb->pos < sb->end) {
		uint32_t avail = sb->end - sb->pos;
		if (sb->raw_byte) {
			sb->raw_byte = false;
			if (sb->cb(sb, SBEV_RAW_BYTE, NULL, sb->buf + sb->pos, avail) == SB_CLOSED || sb->fd < 0)
				return STEP_CLOSED;
			sb->pos++;
			if (sb->tls_handshake)
				return STEP_TLS;
			continue;
		}
		if (sb->pkt_remain > 0) {
			uint32_t n = avail < sb->pkt_remain ? avail : sb->pkt_remain;
			if (sb->pkt_forward && sb->dst) {
				Step st = add_pending(sb, n, true);
				if (st != STEP_OK)
					return st;
			}
			sb->pos += n;
			sb->pkt_remain -= n;
			continue;
		}

		PktHdr hdr;
		HdrResult hr = sb->startup
		                   ? proto_parse_header(sb->buf + sb->pos, avail, true, PROTO_MAX_STARTUP_LEN, &hdr)
		                   : proto_parse_header(sb->buf + sb->pos, avail, false, sb->max_len, &hdr);
		if (hr == HDR_INCOMPLETE)
			return STEP_NEED;
		if (hr == HDR_BAD) {
			sb->in_process = true;
			sb->cb(sb, SBEV_BAD_PACKET, NULL, sb->buf + sb->pos, avail);
			return STEP_CLOSED;
		}
		uint32_t have = avail < hdr.len ? avail : hdr.len;
		sb->resume_pending = false;
		SBufAction act = sb->cb(sb, SBEV_PACKET, &hdr, sb->buf + sb->pos, have);
		if (act == SB_FORWARD && have == hdr.len && sb->dst && sb->fd >= 0 && !sb->tls_handshake &&
		    !sb->raw_byte) {
			/* the whole packet is here (the common case): marked for the peer at once */
			Step st = add_pending(sb, have, false);
			if (st == STEP_OK) {
				sb->pos += have;
				continue;
			}
			sb->pkt_forward = true;
			sb->pkt_remain = hdr.len;
			return st;
		}
		switch (act) {
		case SB_FORWARD:
		case SB_SKIP:
			sb->pkt_forward = act == SB_FORWARD;
			sb->pkt_remain = hdr.len;
			break;
		case SB_NEED_FULL:
			if (have == hdr.len) {
				log_error("sbuf: owner asked for a packet it already has");
				return STEP_CLOSED;
			}
			if (sb->send_pos != sb->send_end) {
				Step st = flush_pending(sb);
				if (st != STEP_OK)
					return st;
			}
			make_room(sb, hdr.len);
			return STEP_NEED;
		case SB_CONSUMED:
			sb->pos += have;
			if (have < hdr.len) {
				/* consumed a partial packet: skip the rest */
				sb->pkt_forward = false;
				sb->pkt_remain = hdr.len - have;
			}
			break;
		case SB_WAIT:
			return STEP_WAIT;
		case SB_CLOSED:
			return STEP_CLOSED;
		}
		if (sb->fd < 0)
			return STEP_CLOSED;
		if (sb->tls_handshake)
			return STEP_TLS;
	}
	return STEP_NEED;
}

/*
 * Read once into the buffer. STEP_OK = got data, STEP_NEED = nothing now,
 * STEP_CLOSED = EOF/error reported. *filled tells whether the read filled
 * all free space (only then may more be waiting in the socket).
 */
static Step read_some(SBuf *sb, bool *filled)
{
	*filled = false;
	if (sb->pos == sb->end && sb->send_pos == sb->send_end) {
		sb->pos = sb->end = 0;
		/* one compare in the common case: no buffer (size 0) and a grown one both differ from base_size */
		if (sb->size != sb->base_size && !sb->buf) {
			sb->buf = buf_get(sb->base_size);
			sb->size = sb->base_size;
			buffers_held++;
		} else if (sb->size > sb->base_size && sb->pkt_remain == 0) {
			/* give back a buffer that grew for one large packet */
			free(sb->buf);
			sb->buf = xmalloc(sb->base_size);
			sb->size = sb->base_size;
		}
	} else if (sb->end == sb->size && sb->send_pos == sb->send_end) {
		make_room(sb, sb->size);
	}
	if (sb->end == sb->size)
		return STEP_NEED; /* full and waiting on the peer */
	if (sb->rq) {
		Step st = ring_read(sb, filled);
		if (st != STEP_NEED || sb->rq)
			return st;
	}
	for (;;) {
		size_t space = sb->size - sb->end;
		ssize_t n = io_recv(sb, sb->buf + sb->end, space);
		if (n > 0 && sb->detect_tls) {
			/*
			 * A TLS handshake record as the first byte: what was read is
			 * the start of a ClientHello, which OpenSSL gets before the
			 * socket (tls_gate_read). Read, not peeked at first: a
			 * recv(MSG_PEEK) per login was one syscall more.
			 */
			sb->detect_tls = false;
			if (sb->buf[sb->end] == 0x16) {
				sb->end += (uint32_t)n;
				sb->tls_prefix = true;
				if (sb->cb(sb, SBEV_DIRECT_TLS, NULL, NULL, 0) == SB_CLOSED || sb->fd < 0)
					return STEP_CLOSED;
				return sb->tls_handshake ? STEP_TLS : STEP_NEED;
			}
		}
		if (n > 0) {
			*filled = (size_t)n == space;
			sb->end += (uint32_t)n;
			sb->bytes_in += (uint64_t)n;
			if (sb->ring_ok && ++sb->direct_reads >= RING_AFTER_READS)
				ring_enter(sb); /* a filled read continues from the ring */
			return STEP_OK;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			if (sb->tls_read_wants_write)
				enable_write(sb);
			return STEP_NEED;
		}
		sb->last_errno = n == 0 ? 0 : errno;
		sb->cb(sb, SBEV_EOF, NULL, NULL, 0);
		return STEP_CLOSED;
	}
}

static void tls_step(SBuf *sb);

/* Whether a read now could take bytes (the same test read_some makes). */
static bool has_room(const SBuf *sb)
{
	return sb->end < sb->size || (sb->send_pos == sb->send_end && (sb->pos > 0 || sb->pos == sb->end));
}

/*
 * The peer failed while we forwarded to it. Its owner is told while our
 * unsent bytes are still visible, so that it does not take this socket
 * (stopped mid-packet) for a reusable one; then they are dropped.
 */
static void peer_send_failed(SBuf *sb)
{
	SBuf *dst = sb->dst;
	sb->in_process = false;
	if (dst && dst->cb)
		dst->cb(dst, SBEV_SEND_FAILED, NULL, NULL, 0);
	if (sb->fd >= 0)
		sb->send_pos = sb->send_end = 0;
}

static void sbuf_process(SBuf *sb, bool do_read)
{
	if (sb->in_process)
		return;
	if (sb->tls_handshake) {
		tls_step(sb);
		return;
	}
	sb->in_process = true;
	int loops = 0;
	for (;;) {
		Step st = flush_pending(sb);
		if (st == STEP_OK) {
			st = process_buffer(sb);
			if (st == STEP_NEED)
				st = flush_pending(sb);
		}
		if (st == STEP_TLS) {
			/* the owner switched to TLS with all plain input consumed */
			if (!sb->tls_prefix)
				sb->pos = sb->end = 0;
			sb->in_process = false;
			tls_step(sb);
			return;
		}
		if (st == STEP_CLOSED) {
			if (sb->fd >= 0 && (sb->send_pos != sb->send_end))
				peer_send_failed(sb);
			return; /* the sbuf may be freed: don't touch it */
		}
		if (st == STEP_WAIT) {
			if (sb->resume_pending) {
				/* the owner resumed us from within its own callback */
				sb->resume_pending = false;
				continue;
			}
			/*
			 * Resumed later by sbuf_continue(); what was forwarded before
			 * goes out now. The read event stays armed: a client waiting
			 * for a server usually sends nothing meanwhile, and leaving it
			 * armed saves two epoll_ctl() calls per wait. Should input
			 * come anyway, on_read() disarms it then.
			 */
			sb->paused = true;
			if (flush_pending(sb) == STEP_CLOSED && sb->fd >= 0 && sb->send_pos != sb->send_end) {
				peer_send_failed(sb);
				return;
			}
			break;
		}
		if (st == STEP_BLOCKED)
			break; /* the peer's write event resumes us */
		if (sb->paused) {
			disable_read(sb);
			break;
		}
		enable_read(sb);
		if (!do_read)
			break;
		bool filled;
		st = read_some(sb, &filled);
		if (st == STEP_CLOSED)
			return;
		if (st == STEP_TLS) {
			sb->in_process = false;
			tls_step(sb);
			return;
		}
		if (st == STEP_NEED)
			break;
		/* a short read emptied the socket: the event loop tells us when there is more */
		++loops;
		do_read = filled && (!loopcnt || *loopcnt <= 0 || loops < *loopcnt);
	}
	sb->in_process = false;
	/* the ring's stash holds more (sbuf_loopcnt ended the reads): come back, as level-triggered epoll would */
	if (sb->rq && sb->reading && !sb->paused && ring_has_input(sb->rq))
		ring_schedule(sb->rq);
	if ((sb->give_back && !sb->dst) || buffers_held * sb->base_size > KEEP_BYTES) {
		/*
		 * A client not linked to a server keeps no input buffer while it
		 * is idle. Linked clients and servers keep theirs while few
		 * sockets hold one, so that the hot path does not pay for it (a
		 * transaction-mode server would give its buffer back at every
		 * release), and the janitor trims them (sbuf_trim) once they are
		 * idle; with more, they give it back too.
		 */
		release_input(sb);
	}
	/*
	 * OpenSSL may hold bytes the socket no longer signals (decrypted, or
	 * read ahead and not yet decrypted): come back for them from the event
	 * loop (not now, to let others run).
	 */
	if (sb->ssl && sb->reading && !sb->paused && SSL_has_pending(sb->ssl) && has_room(sb))
		event_active(&sb->ev_read, EV_READ, 0);
}

static void on_read(evutil_socket_t fd, short what, void *arg)
{
	SBuf *sb = arg;
	if (wake_hook)
		wake_hook();
	sb->tls_drained = false;
	if (sb->paused && !sb->tls_handshake) {
		/* paused with the read event left armed (sbuf_process): stop reading for real */
		disable_read(sb);
		return;
	}
	sbuf_process(sb, true);
}

/* Advance the TLS handshake; report its end to the owner. */
static void tls_step(SBuf *sb)
{
	ERR_clear_error();
	int r = SSL_do_handshake(sb->ssl);
	if (r == 1) {
		sb->tls_handshake = false;
		disable_write(sb);
		if (sb->cb(sb, SBEV_TLS_READY, NULL, NULL, 0) == SB_CLOSED || sb->fd < 0)
			return;
		/* the first packet may already sit decrypted in OpenSSL */
		if (!sb->paused)
			sbuf_process(sb, true);
		return;
	}
	int e = SSL_get_error(sb->ssl, r);
	if (e == SSL_ERROR_WANT_READ) {
		disable_write(sb);
		enable_read(sb);
		return;
	}
	if (e == SSL_ERROR_WANT_WRITE) {
		disable_read(sb);
		enable_write(sb);
		return;
	}
	note_tls_error(sb, "TLS handshake failed", e);
	disable_read(sb);
	disable_write(sb);
	sb->cb(sb, SBEV_TLS_FAILED, NULL, NULL, 0);
}

void sbuf_expect_byte(SBuf *sb)
{
	sb->raw_byte = true;
}

void sbuf_detect_tls(SBuf *sb)
{
	sb->detect_tls = true;
}

/*
 * The BIO between OpenSSL and the socket: a filter over OpenSSL's own
 * socket BIO, which does the I/O. OpenSSL reads on its own whenever it
 * wants more input: after writing a handshake flight, when a record is
 * incomplete, at every SSL_read(). Most of those reads found nothing, the
 * peer had not answered yet (2.3 read() calls per TLS login that returned
 * EAGAIN). A read that returns less than asked has emptied the socket, so
 * the gate answers "retry" without a read() from then until the event
 * loop reports the socket readable (on_read). The loop's epoll is
 * level-triggered, so nothing that arrives meanwhile is missed: every
 * "retry" leaves the read event armed. The gate also hands OpenSSL the
 * start of a direct TLS handshake that was read before TLS was known.
 */
static int tls_gate_read(BIO *b, char *out, int len)
{
	SBuf *sb = BIO_get_data(b);
	BIO_clear_retry_flags(b);
	if (len <= 0)
		return 0;
	if (sb->tls_prefix) {
		uint32_t n = sb->end - sb->pos < (uint32_t)len ? sb->end - sb->pos : (uint32_t)len;
		memcpy(out, sb->buf + sb->pos, n);
		sb->pos += n;
		if (sb->pos == sb->end) {
			sb->pos = sb->end = 0;
			sb->tls_prefix = false;
		}
		return (int)n;
	}
	if (sb->tls_drained) {
		BIO_set_retry_read(b);
		return -1;
	}
	int n = BIO_read(BIO_next(b), out, len);
	if (n < len)
		sb->tls_drained = true;
	BIO_copy_next_retry(b);
	return n;
}

static int tls_gate_write(BIO *b, const char *in, int len)
{
	BIO_clear_retry_flags(b);
	int n = BIO_write(BIO_next(b), in, len);
	BIO_copy_next_retry(b);
	return n;
}

/* OpenSSL's internal BIO_CTRL_SET_KTLS (bio.h lists it in a comment only). */
#define TLS_GATE_CTRL_SET_KTLS 72

static long tls_gate_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	switch (cmd) {
	case BIO_CTRL_GET_KTLS_SEND:
	case BIO_CTRL_GET_KTLS_RECV:
	case TLS_GATE_CTRL_SET_KTLS:
		/*
		 * No kernel TLS on these sockets (SSL_OP_ENABLE_KTLS is not set,
		 * and would be refused here). OpenSSL asks about it around every
		 * record, about 100 times per login: answered here, not by a
		 * second BIO_ctrl() down the chain (8,000 instructions per login).
		 */
		return 0;
	case BIO_CTRL_FLUSH:
		return 1; /* the socket BIO writes at once: nothing to flush */
	default: {
		BIO *next = BIO_next(b);
		return next ? BIO_ctrl(next, cmd, num, ptr) : 0;
	}
	}
}

static int tls_gate_create(BIO *b)
{
	BIO_set_init(b, 1);
	return 1;
}

/* The gate over the socket BIO of sb's fd; NULL when OpenSSL cannot make one. */
static BIO *tls_gate_new(SBuf *sb)
{
	static BIO_METHOD *method;
	if (!method) {
		int index = BIO_get_new_index();
		BIO_METHOD *m = index < 0 ? NULL : BIO_meth_new(index | BIO_TYPE_FILTER, "pgbouncer socket gate");
		if (!m || !BIO_meth_set_read(m, tls_gate_read) || !BIO_meth_set_write(m, tls_gate_write) ||
		    !BIO_meth_set_ctrl(m, tls_gate_ctrl) || !BIO_meth_set_create(m, tls_gate_create)) {
			BIO_meth_free(m);
			return NULL;
		}
		method = m;
	}
	BIO *gate = BIO_new(method);
	BIO *sock = BIO_new_socket(sb->fd, BIO_NOCLOSE);
	if (!gate || !sock) {
		BIO_free(gate);
		BIO_free(sock);
		return NULL;
	}
	BIO_set_data(gate, sb);
	BIO_push(gate, sock);
	return gate;
}

bool sbuf_tls_start(SBuf *sb, SSL *ssl, bool accept)
{
	/* sbuf_use_ring() is for sessions past their TLS start: OpenSSL reads the socket itself */
	pgb_assert(!sb->rq);
	/* the plain answer ('S') goes out before any TLS byte: not left in the send queue */
	Step st = flush_out(sb);
	if (st == STEP_OK && is_queued(sb)) {
		sendq_flush();
		st = flush_out(sb); /* a spill, if the queued send came back short */
	}
	if (st != STEP_OK) {
		snprintf(tls_err, sizeof(tls_err), "could not send the SSL answer");
		SSL_free(ssl);
		return false;
	}
	BIO *bio = tls_gate_new(sb);
	if (!bio) {
		note_tls_error(sb, "BIO_new", SSL_ERROR_SSL);
		SSL_free(ssl);
		return false;
	}
	SSL_set_bio(ssl, bio, bio); /* one reference, owned by ssl */
	/*
	 * The peer's first TLS bytes come a round trip and a key share after
	 * our 'S' (or our ClientHello): a read now found nothing in every
	 * login traced. Wait for the event loop (a direct TLS ClientHello read
	 * already is in buf, and is served first).
	 */
	sb->tls_drained = true;
	if (accept)
		SSL_set_accept_state(ssl);
	else
		SSL_set_connect_state(ssl);
	sb->ssl = ssl;
	sb->tls_handshake = true;
	sb->tls_failed = false;
	return true;
}

static void finish_connect(SBuf *sb)
{
	int err = 0;
	socklen_t len = sizeof(err);
	sb->connecting = false;
	disable_write(sb);
	if (getsockopt(sb->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
		err = errno;
	if (err) {
		sb->last_errno = err;
		sb->cb(sb, SBEV_CONNECT_FAILED, NULL, NULL, 0);
		return;
	}
	sb->startup = false;
	if (sb->cb(sb, SBEV_CONNECTED, NULL, NULL, 0) == SB_CLOSED)
		return;
	if (!sb->paused)
		enable_read(sb);
}

static void on_write(evutil_socket_t fd, short what, void *arg)
{
	SBuf *sb = arg;
	if (wake_hook)
		wake_hook();
	if (sb->connecting) {
		finish_connect(sb);
		return;
	}
	if (sb->tls_handshake) {
		tls_step(sb);
		return;
	}
	if (sb->tls_read_wants_write) {
		sb->tls_read_wants_write = false;
		if (!sb->waiting_src && sb->out_pos >= sb->out.len && !sb->notify_flush)
			disable_write(sb);
		sbuf_process(sb, !sb->paused);
		if (sb->fd < 0 || !sb->writing)
			return;
	}
	Step st = flush_out(sb);
	if (st == STEP_CLOSED) {
		disable_write(sb);
		sb->cb(sb, SBEV_SEND_FAILED, NULL, NULL, 0);
		return;
	}
	if (st == STEP_BLOCKED)
		return;
	SBuf *src = sb->waiting_src;
	if (src) {
		sb->waiting_src = NULL;
		disable_write(sb);
		sbuf_process(src, !src->paused);
		return; /* sb may be gone now */
	}
	disable_write(sb);
	if (sb->notify_flush && sbuf_is_flushed(sb)) {
		sb->notify_flush = false;
		sb->cb(sb, SBEV_FLUSHED, NULL, NULL, 0);
	}
}

bool sbuf_send(SBuf *sb, const void *data, size_t len)
{
	/* nothing can be said to a peer whose TLS handshake has not finished (or failed) */
	if (sb->fd < 0 || sb->tls_handshake || sb->tls_failed)
		return false;
	if (sb->out_pos >= sb->out.len && !sb->connecting && !sb->waiting_src) {
		/* nothing queued before it: write from the caller's memory, queue only what the socket does not take */
		while (len > 0) {
			ssize_t n = io_send(sb, data, len);
			if (n < 0) {
				if (errno == EINTR)
					continue;
				if (errno == EAGAIN || errno == EWOULDBLOCK)
					break;
				sb->last_errno = errno;
				return false;
			}
			data = (const uint8_t *)data + n;
			len -= (size_t)n;
		}
		if (len == 0)
			return true;
		pktbuf_reset(&sb->out);
		sb->out_pos = 0;
		pktbuf_put_bytes(&sb->out, data, len);
		enable_write(sb);
		return true;
	}
	pktbuf_put_bytes(&sb->out, data, len);
	if (sb->connecting || sb->waiting_src)
		return true; /* written once connected / after the forwarded bytes */
	return flush_out(sb) != STEP_CLOSED;
}

/*
 * Send src's pending range to dst now, after dst's own queue; what the
 * socket does not take moves into dst's queue (its write event sends it,
 * or reports the failure), so src has nothing pending afterwards.
 */
static void send_pending_now(SBuf *src, SBuf *dst)
{
	Step st = STEP_OK;
	if (dst->out_pos < dst->out.len) {
		/* the peer's own queue first (usually empty) */
		st = dst->ssl ? STEP_OK : send_both(src, dst);
		if (st == STEP_OK)
			st = flush_out(dst);
	}
	while (st == STEP_OK && src->send_pos < src->send_end) {
		ssize_t n = io_send(dst, src->buf + src->send_pos, src->send_end - src->send_pos);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				dst->last_errno = errno;
			break;
		}
		src->send_pos += (uint32_t)n;
		src->bytes_out += (uint64_t)n;
	}
	if (src->send_pos < src->send_end) {
		pktbuf_put_bytes(&dst->out, src->buf + src->send_pos, src->send_end - src->send_pos);
		src->bytes_out += src->send_end - src->send_pos;
		enable_write(dst);
	}
	src->send_pos = src->send_end = 0;
}

/* What src marked for the peer moves into the peer's queue, ahead of pooler bytes added next. */
static void move_marked(SBuf *src, SBuf *dst)
{
	if (src->send_pos == src->send_end)
		return;
	pktbuf_put_bytes(&dst->out, src->buf + src->send_pos, src->send_end - src->send_pos);
	src->bytes_out += src->send_end - src->send_pos;
	src->send_pos = src->send_end = 0;
	if (dst->waiting_src == src) {
		/* src no longer waits: the peer's write event flushes its queue */
		dst->waiting_src = NULL;
		if (!src->paused && !src->in_process && src->fd >= 0) {
			enable_read(src);
			event_active(&src->ev_read, EV_READ, 0);
		}
	}
}

PktBuf *sbuf_own_queue(SBuf *src)
{
	SBuf *dst = src->dst;
	if (!dst || dst->fd < 0)
		return NULL;
	move_marked(src, dst);
	return &dst->out;
}

void sbuf_forward_queue(SBuf *src, const void *data, size_t len, bool flush_now)
{
	SBuf *dst = src->dst;
	if (!dst || dst->fd < 0)
		return;
	if (flush_now && len && len <= src->end - src->pos && (const uint8_t *)data == src->buf + src->pos &&
	    (src->send_pos == src->send_end || src->send_end == src->pos) && !dst->connecting && !dst->waiting_src &&
	    !dst->writing) {
		/*
		 * The packet being processed, right behind what src marked for
		 * the peer (a ReadyForQuery that releases the server): both go
		 * out from src's buffer, without a copy into the peer's queue.
		 */
		if (src->send_pos == src->send_end)
			src->send_pos = src->pos;
		src->send_end = src->pos + (uint32_t)len;
		send_pending_now(src, dst);
		return;
	}
	move_marked(src, dst); /* what src marked for the peer goes first */
	if (len)
		pktbuf_put_bytes(&dst->out, data, len);
	if (!flush_now || dst->out_pos >= dst->out.len || dst->connecting || dst->waiting_src || dst->writing)
		return;
	if (flush_out(dst) == STEP_CLOSED)
		enable_write(dst); /* its write event reports the failure to its owner */
}

bool sbuf_send_pktbuf(SBuf *sb, PktBuf *pb)
{
	bool ok = sbuf_send(sb, pb->buf, pb->len);
	pktbuf_reset(pb);
	return ok;
}

bool sbuf_is_flushed(const SBuf *sb)
{
	if (is_queued(sb))
		sendq_flush(); /* flushed means in the kernel's hands */
	return sb->out_pos >= sb->out.len && !sb->waiting_src && sb->send_pos == sb->send_end && !sb->spill;
}

bool sbuf_unsent(const SBuf *sb)
{
	return is_queued(sb) || sb->spill;
}

void sbuf_notify_flush(SBuf *sb)
{
	if (sbuf_is_flushed(sb)) {
		sb->cb(sb, SBEV_FLUSHED, NULL, NULL, 0);
		return;
	}
	sb->notify_flush = true;
	enable_write(sb);
}

void sbuf_close(SBuf *sb)
{
	if (is_queued(sb))
		sendq_flush(); /* what was sent before the close goes out before it */
	free(sb->spill);
	sb->spill = NULL;
	if (sb->ssl) {
		/* one non-blocking close_notify, unless the TLS session is broken */
		if (!sb->tls_failed && !sb->tls_handshake && sb->fd >= 0) {
			ERR_clear_error();
			(void)SSL_shutdown(sb->ssl);
		}
		ERR_clear_error();
		SSL_free(sb->ssl);
		sb->ssl = NULL;
	}
	sb->tls_handshake = sb->tls_read_wants_write = sb->raw_byte = sb->detect_tls = sb->tls_prefix = false;
	sb->ring_ok = false;
	if (sb->fd >= 0) {
		disable_read(sb);
		if (sb->rq)
			ring_drop(sb);
		disable_write(sb);
		close(sb->fd);
		sb->fd = -1;
	}
	free(sb->ev_write);
	sb->ev_write = NULL;
	if (sb->waiting_src) {
		/* a peer was blocked on us: its pending bytes have nowhere to go */
		sb->waiting_src->send_pos = sb->waiting_src->send_end = 0;
		sb->waiting_src = NULL;
	}
	if (sb->dst && sb->dst->waiting_src == sb)
		sb->dst->waiting_src = NULL;
	sb->dst = NULL;
	sb->pos = sb->end = sb->send_pos = sb->send_end = 0;
	release_input(sb);
	pktbuf_free(&sb->out);
	sb->out_pos = 0;
}

void sbuf_trim(SBuf *sb)
{
	if (sb->fd < 0 || sb->in_process)
		return;
	if (sb->rq && sb->rq->off == sb->rq->len && sb->rq->data) {
		free(sb->rq->data);
		sb->rq->data = NULL;
		sb->rq->off = sb->rq->len = sb->rq->cap = 0;
	}
	release_input(sb);
	if (!sb->writing)
		release_output(sb);
}

bool sbuf_local_addr(const SBuf *sb, struct sockaddr_storage *ss, socklen_t *len)
{
	*len = sizeof(*ss);
	return getsockname(sb->fd, (struct sockaddr *)ss, len) == 0;
}
