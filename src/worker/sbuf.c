/*
 * Stream buffer: socket I/O for one connection, packet cutting, forwarding
 * to the linked peer with back-pressure, and pooler-generated output.
 * See include/worker/sbuf.h for the contract.
 */
#include "config.h"

#include "worker/sbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"

/* Result of one step of the processing loop. */
typedef enum Step {
	STEP_OK,      /* continue */
	STEP_NEED,    /* need more input */
	STEP_BLOCKED, /* output to the peer is blocked; wait for it */
	STEP_WAIT,    /* the owner asked to stop */
	STEP_CLOSED,  /* the connection is gone */
} Step;

static void on_read(evutil_socket_t fd, short what, void *arg);
static void on_write(evutil_socket_t fd, short what, void *arg);
static void sbuf_process(SBuf *sb, bool do_read);

static void set_nonblocking(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl >= 0)
		fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void sbuf_setup(SBuf *sb, struct event_base *base, int fd, uint32_t pkt_buf, uint32_t max_len, sbuf_cb_t cb,
                       void *owner)
{
	memset(sb, 0, sizeof(*sb));
	sb->fd = fd;
	sb->base_size = pkt_buf < 512 ? 512 : pkt_buf;
	sb->size = sb->base_size;
	sb->buf = xmalloc(sb->size);
	sb->max_len = max_len;
	sb->cb = cb;
	sb->owner = owner;
	pktbuf_init(&sb->out, 0);
	event_assign(&sb->ev_read, base, fd, EV_READ | EV_PERSIST, on_read, sb);
	event_assign(&sb->ev_write, base, fd, EV_WRITE | EV_PERSIST, on_write, sb);
}

static void enable_read(SBuf *sb)
{
	if (!sb->reading && sb->fd >= 0 && !sb->connecting) {
		event_add(&sb->ev_read, NULL);
		sb->reading = true;
	}
}

static void disable_read(SBuf *sb)
{
	if (sb->reading) {
		event_del(&sb->ev_read);
		sb->reading = false;
	}
}

static void enable_write(SBuf *sb)
{
	if (!sb->writing && sb->fd >= 0) {
		event_add(&sb->ev_write, NULL);
		sb->writing = true;
	}
}

static void disable_write(SBuf *sb)
{
	if (sb->writing) {
		event_del(&sb->ev_write);
		sb->writing = false;
	}
}

void sbuf_accept(SBuf *sb, struct event_base *base, int fd, uint32_t pkt_buf, uint32_t max_len, sbuf_cb_t cb,
                 void *owner)
{
	set_nonblocking(fd);
	sbuf_setup(sb, base, fd, pkt_buf, max_len, cb, owner);
	sb->startup = true;
	enable_read(sb);
}

bool sbuf_connect(SBuf *sb, struct event_base *base, const struct sockaddr *sa, socklen_t salen, uint32_t pkt_buf,
                  uint32_t max_len, sbuf_cb_t cb, void *owner)
{
	int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	sbuf_setup(sb, base, fd, pkt_buf, max_len, cb, owner);
	if (fd < 0) {
		sb->last_errno = errno;
		return false;
	}
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
	while (sb->out_pos < sb->out.len) {
		ssize_t n = send(sb->fd, sb->out.buf + sb->out_pos, sb->out.len - sb->out_pos, MSG_NOSIGNAL);
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
 * Write this buffer's pending range to the peer. On a partial write the
 * source stops reading and waits for the peer's write event.
 */
static Step flush_pending(SBuf *sb)
{
	SBuf *dst = sb->dst;
	if (sb->send_pos == sb->send_end)
		return STEP_OK;
	if (!dst || dst->fd < 0) {
		/* the peer went away: nothing to deliver to */
		sb->send_pos = sb->send_end = 0;
		return STEP_OK;
	}
	Step st = flush_out(dst);
	if (st == STEP_CLOSED) {
		dst->waiting_src = NULL;
		return STEP_CLOSED;
	}
	while (st == STEP_OK && sb->send_pos < sb->send_end) {
		ssize_t n = send(dst->fd, sb->buf + sb->send_pos, sb->send_end - sb->send_pos, MSG_NOSIGNAL);
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

/* Mark n bytes at pos as due to the peer, flushing first when the range would not be contiguous. */
static Step add_pending(SBuf *sb, uint32_t n)
{
	if (sb->send_pos != sb->send_end && sb->send_end != sb->pos) {
		Step st = flush_pending(sb);
		if (st != STEP_OK)
			return st;
	}
	if (sb->send_pos == sb->send_end)
		sb->send_pos = sb->send_end = sb->pos;
	sb->send_end = sb->pos + n;
	return STEP_OK;
}

/* Cut buffered input into packets and act on them. */
static Step process_buffer(SBuf *sb)
{
	while (sb->pos < sb->end) {
		uint32_t avail = sb->end - sb->pos;
		if (sb->pkt_remain > 0) {
			uint32_t n = avail < sb->pkt_remain ? avail : sb->pkt_remain;
			if (sb->pkt_forward && sb->dst) {
				Step st = add_pending(sb, n);
				if (st != STEP_OK)
					return st;
			}
			sb->pos += n;
			sb->pkt_remain -= n;
			continue;
		}

		PktHdr hdr;
		uint32_t max = sb->startup ? PROTO_MAX_STARTUP_LEN : sb->max_len;
		HdrResult hr = proto_parse_header(sb->buf + sb->pos, avail, sb->startup, max, &hdr);
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
		if (sb->size > sb->base_size && sb->pkt_remain == 0) {
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
	for (;;) {
		size_t space = sb->size - sb->end;
		ssize_t n = recv(sb->fd, sb->buf + sb->end, space, 0);
		if (n > 0) {
			*filled = (size_t)n == space;
			sb->end += (uint32_t)n;
			sb->bytes_in += (uint64_t)n;
			return STEP_OK;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return STEP_NEED;
		sb->last_errno = n == 0 ? 0 : errno;
		sb->cb(sb, SBEV_EOF, NULL, NULL, 0);
		return STEP_CLOSED;
	}
}

static void sbuf_process(SBuf *sb, bool do_read)
{
	if (sb->in_process)
		return;
	sb->in_process = true;
	int loops = 0;
	for (;;) {
		Step st = flush_pending(sb);
		if (st == STEP_OK) {
			st = process_buffer(sb);
			if (st == STEP_NEED)
				st = flush_pending(sb);
		}
		if (st == STEP_CLOSED) {
			if (sb->fd >= 0 && (sb->send_pos != sb->send_end)) {
				/*
				 * The peer failed while we forwarded to it. Its owner is told
				 * while our unsent bytes are still visible, so that it does not
				 * take this socket (stopped mid-packet) for a reusable one.
				 */
				SBuf *dst = sb->dst;
				sb->in_process = false;
				if (dst && dst->cb)
					dst->cb(dst, SBEV_SEND_FAILED, NULL, NULL, 0);
				if (sb->fd >= 0)
					sb->send_pos = sb->send_end = 0;
				return;
			}
			return; /* the sbuf may be freed: don't touch it */
		}
		if (st == STEP_WAIT) {
			if (sb->resume_pending) {
				/* the owner resumed us from within its own callback */
				sb->resume_pending = false;
				continue;
			}
			/* resumed later by sbuf_continue() */
			sb->paused = true;
			disable_read(sb);
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
		if (st == STEP_NEED)
			break;
		/* a short read emptied the socket: the event loop tells us when there is more */
		do_read = filled && ++loops < 5;
	}
	sb->in_process = false;
}

static void on_read(evutil_socket_t fd, short what, void *arg)
{
	SBuf *sb = arg;
	sbuf_process(sb, true);
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
	if (sb->connecting) {
		finish_connect(sb);
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
	if (sb->fd < 0)
		return false;
	pktbuf_put_bytes(&sb->out, data, len);
	if (sb->connecting || sb->waiting_src)
		return true; /* written once connected / after the forwarded bytes */
	return flush_out(sb) != STEP_CLOSED;
}

bool sbuf_send_pktbuf(SBuf *sb, PktBuf *pb)
{
	bool ok = sbuf_send(sb, pb->buf, pb->len);
	pktbuf_reset(pb);
	return ok;
}

bool sbuf_is_flushed(const SBuf *sb)
{
	return sb->out_pos >= sb->out.len && !sb->waiting_src && sb->send_pos == sb->send_end;
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
	if (sb->fd >= 0) {
		disable_read(sb);
		disable_write(sb);
		close(sb->fd);
		sb->fd = -1;
	}
	if (sb->waiting_src) {
		/* a peer was blocked on us: its pending bytes have nowhere to go */
		sb->waiting_src->send_pos = sb->waiting_src->send_end = 0;
		sb->waiting_src = NULL;
	}
	if (sb->dst && sb->dst->waiting_src == sb)
		sb->dst->waiting_src = NULL;
	sb->dst = NULL;
	free(sb->buf);
	sb->buf = NULL;
	sb->size = sb->pos = sb->end = 0;
	pktbuf_free(&sb->out);
	sb->out_pos = 0;
}

bool sbuf_local_addr(const SBuf *sb, struct sockaddr_storage *ss, socklen_t *len)
{
	*len = sizeof(*ss);
	return getsockname(sb->fd, (struct sockaddr *)ss, len) == 0;
}
