/*
 * Control channel between the master and a worker: fixed-size messages on a
 * SOCK_SEQPACKET socketpair, with SCM_RIGHTS for handing a listening
 * socket to another worker, and the sender's queue that keeps a slow
 * reader from costing a message (ChannelOut).
 */
#include "autoconfig.h"

#include "common/channel.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <event2/event.h>

#include "common/log.h"
#include "common/util.h"

bool channel_pair(int fds[2])
{
	return socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) == 0;
}

ssize_t fd_send(int sock, const void *buf, size_t len, const int *fds, int nfds, int flags)
{
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * FD_SEND_MAX)];
	} ctl;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (nfds > FD_SEND_MAX) {
		errno = EINVAL;
		return -1;
	}
	if (nfds > 0) {
		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.buf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
	}
	ssize_t n;
	do
		n = sendmsg(sock, &mh, flags | MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	return n;
}

ssize_t fd_recv(int sock, void *buf, size_t cap, int *fds, int maxfds, int *nfds, int flags, bool *truncated)
{
	struct iovec iov = {.iov_base = buf, .iov_len = cap};
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * FD_SEND_MAX)];
	} ctl;
	struct msghdr mh = {
	    .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf)};
	*nfds = 0;
	for (int i = 0; i < maxfds; i++)
		fds[i] = -1;
	ssize_t n;
	do
		n = recvmsg(sock, &mh, flags | MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return n;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len < CMSG_LEN(sizeof(int)))
			continue;
		int got = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		for (int i = 0; i < got; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(c) + (size_t)i * sizeof(int), sizeof(int));
			if (*nfds < maxfds)
				fds[(*nfds)++] = fd;
			else
				close(fd); /* more than the caller takes: not ours to keep */
		}
	}
	if (truncated)
		*truncated = (mh.msg_flags & MSG_TRUNC) != 0;
	return n;
}

bool channel_send(int sock, const ChannelMsg *msg, int fd)
{
	ssize_t n = fd_send(sock, msg, sizeof(*msg), &fd, fd >= 0 ? 1 : 0, 0);
	if (n == (ssize_t)sizeof(*msg))
		return true;
	if (n >= 0)
		errno = EMSGSIZE;
	return false;
}

int channel_recv(int sock, ChannelMsg *msg, int *fd)
{
	int nfds;
	ssize_t n = fd_recv(sock, msg, sizeof(*msg), fd, 1, &nfds, 0, NULL);
	if (n == 0)
		return 0;
	if (n < 0)
		return -1;
	if (n != (ssize_t)sizeof(*msg)) {
		errno = EPROTO;
		return -1;
	}
	return 1;
}

const char *channel_msg_name(uint32_t type)
{
	static const char *const names[] = {
	    [CH_TAKE_LISTENER] = "CH_TAKE_LISTENER",
	    [CH_DROP_LISTENER] = "CH_DROP_LISTENER",
	    [CH_DRAIN] = "CH_DRAIN",
	    [CH_CANCEL] = "CH_CANCEL",
	    [CH_MIGRATE] = "CH_MIGRATE",
	    [CH_ADOPT] = "CH_ADOPT",
	    [CH_MOVED] = "CH_MOVED",
	    [CH_MOVED_GONE] = "CH_MOVED_GONE",
	    [CH_HANDOFF] = "CH_HANDOFF",
	    [CH_SET] = "CH_SET",
	    [CH_CONSOLE_STATE] = "CH_CONSOLE_STATE",
	    [CH_CONSOLE_RESUME] = "CH_CONSOLE_RESUME",
	    [CH_CONSOLE_LEFT_OUT] = "CH_CONSOLE_LEFT_OUT",
	    [CH_CONSOLE_SYNC] = "CH_CONSOLE_SYNC",
	    [CH_UP_HELLO] = "CH_UP_HELLO",
	    [CH_UP_LISTENER] = "CH_UP_LISTENER",
	    [CH_UP_END] = "CH_UP_END",
	    [CH_UP_COMMIT] = "CH_UP_COMMIT",
	    [CH_UP_DONE] = "CH_UP_DONE",
	    [CH_UP_SALT_KEY] = "CH_UP_SALT_KEY",
	    [CH_UP_SEGMENT] = "CH_UP_SEGMENT",
	    [CH_UP_HANDOFF] = "CH_UP_HANDOFF",
	    [CH_UP_PRED] = "CH_UP_PRED",
	    [CH_UP_BYE] = "CH_UP_BYE",
	    [CH_SETTLE] = "CH_SETTLE",
	    [CH_ORPHAN_HELLO] = "CH_ORPHAN_HELLO",
	};
	static char other[32];
	if (type < sizeof(names) / sizeof(names[0]) && names[type])
		return names[type];
	snprintf(other, sizeof(other), "message %u", type);
	return other;
}

/* ---- the sender's queue ---- */

typedef struct QueuedMsg {
	ChannelMsg msg;
	int fd; /* our duplicate of the attached fd, closed once sent or dropped; -1 = none */
} QueuedMsg;

/* One kind of trouble, logged at most once per CHANNEL_OUT_LOG_INTERVAL_US. */
typedef struct LogLimit {
	usec_t last;     /* when it was last logged, 0 = never */
	uint64_t missed; /* times it happened since, not logged */
} LogLimit;

struct ChannelOut {
	int sock;               /* not ours */
	struct event *writable; /* EV_WRITE on sock, pending while the queue is not empty */
	QueuedMsg *q;           /* ring of `size` entries (a power of 2) */
	size_t size;
	size_t head;  /* the oldest message */
	size_t count; /* messages queued */
	bool gone;    /* the peer closed (EPIPE/ECONNRESET): nothing goes out any more */
	char peer[32];
	LogLimit full_log; /* the socket was full: queueing */
	LogLimit cap_log;  /* the queue was at its cap: dropped */
	LogLimit err_log;  /* a send failed otherwise: dropped */
};

/* True when this occurrence is to be logged; *missed is how many were not since the last line. */
static bool log_due(LogLimit *l, uint64_t *missed)
{
	usec_t now = get_mono_usec();
	if (l->last && now - l->last < CHANNEL_OUT_LOG_INTERVAL_US) {
		l->missed++;
		return false;
	}
	*missed = l->missed;
	l->missed = 0;
	l->last = now;
	return true;
}

static bool peer_gone(int err)
{
	return err == EPIPE || err == ECONNRESET;
}

/* " (N more times since the last such line)", or "" for none */
static const char *missed_note(char *buf, size_t len, uint64_t missed)
{
	if (!missed)
		return "";
	snprintf(buf, len, " (%llu more times since the last such line)", (unsigned long long)missed);
	return buf;
}

static void note_full(ChannelOut *out)
{
	uint64_t missed;
	char note[80];
	if (log_due(&out->full_log, &missed))
		log_info("the control channel to %s is full: messages wait in order until it has room%s", out->peer,
		         missed_note(note, sizeof(note), missed));
}

static void note_error(ChannelOut *out, LogLimit *l, const ChannelMsg *msg, int err)
{
	uint64_t missed;
	char note[80];
	if (log_due(l, &missed))
		log_warning("the control channel to %s dropped %s: %s%s", out->peer, channel_msg_name(msg->type),
		            err == ENOBUFS ? "its queue is full" : strerror(err),
		            missed_note(note, sizeof(note), missed));
}

static void pop(ChannelOut *out)
{
	QueuedMsg *e = &out->q[out->head];
	if (e->fd >= 0)
		close(e->fd);
	out->head = (out->head + 1) & (out->size - 1);
	out->count--;
}

static void drop_all(ChannelOut *out)
{
	while (out->count > 0)
		pop(out);
	if (out->writable)
		event_del(out->writable);
}

static void lost_peer(ChannelOut *out)
{
	if (out->count > 0)
		log_debug("the control channel to %s is closed: %zu queued messages dropped", out->peer, out->count);
	out->gone = true;
	drop_all(out);
}

/* Send from the head of the queue until it is empty or the socket is full. */
static void flush(ChannelOut *out)
{
	while (out->count > 0) {
		QueuedMsg *e = &out->q[out->head];
		if (!channel_send(out->sock, &e->msg, e->fd)) {
			int err = errno;
			if (err == EAGAIN || err == EWOULDBLOCK)
				return; /* the event stays pending */
			if (peer_gone(err)) {
				lost_peer(out);
				return;
			}
			note_error(out, &out->err_log, &e->msg, err);
		}
		pop(out);
	}
	event_del(out->writable);
}

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	flush(arg);
}

static bool enqueue(ChannelOut *out, const ChannelMsg *msg, int fd)
{
	if (out->count >= CHANNEL_OUT_MAX_QUEUED) {
		note_error(out, &out->cap_log, msg, ENOBUFS);
		errno = ENOBUFS;
		return false;
	}
	int dup_fd = -1;
	if (fd >= 0 && (dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) {
		int err = errno;
		note_error(out, &out->err_log, msg, err);
		errno = err;
		return false;
	}
	if (out->count == out->size) {
		/* grow, the oldest first again */
		size_t size = out->size ? out->size * 2 : 64;
		QueuedMsg *q = xmalloc(size * sizeof(*q));
		for (size_t i = 0; i < out->count; i++)
			q[i] = out->q[(out->head + i) & (out->size - 1)];
		free(out->q);
		out->q = q;
		out->size = size;
		out->head = 0;
	}
	out->q[(out->head + out->count) & (out->size - 1)] = (QueuedMsg){.msg = *msg, .fd = dup_fd};
	out->count++;
	if (!event_pending(out->writable, EV_WRITE, NULL))
		event_add(out->writable, NULL);
	return true;
}

ChannelOut *channel_out_new(struct event_base *base, int sock, const char *peer)
{
	ChannelOut *out = xcalloc(1, sizeof(*out));
	out->sock = sock;
	pgb_strlcpy(out->peer, peer, sizeof(out->peer));
	out->writable = event_new(base, sock, EV_WRITE | EV_PERSIST, on_writable, out);
	if (!out->writable)
		fatal("event_new() failed for the control channel to %s", peer);
	return out;
}

void channel_out_free(ChannelOut *out)
{
	if (!out)
		return;
	drop_all(out);
	event_free(out->writable);
	free(out->q);
	free(out);
}

void channel_out_forget_in_child(ChannelOut *out)
{
	if (!out)
		return;
	for (size_t i = 0; i < out->count; i++) {
		QueuedMsg *e = &out->q[(out->head + i) & (out->size - 1)];
		if (e->fd >= 0)
			close(e->fd);
		e->fd = -1;
	}
	out->count = 0;
}

bool channel_out_send(ChannelOut *out, const ChannelMsg *msg, int fd)
{
	if (out->gone) {
		errno = EPIPE;
		return false;
	}
	if (out->count == 0) {
		if (channel_send(out->sock, msg, fd))
			return true;
		int err = errno;
		if (err != EAGAIN && err != EWOULDBLOCK) {
			if (peer_gone(err))
				lost_peer(out);
			else
				note_error(out, &out->err_log, msg, err);
			errno = err;
			return false;
		}
		note_full(out);
	}
	/* behind what waits already: a later message never overtakes an earlier one */
	return enqueue(out, msg, fd);
}

size_t channel_out_queued(const ChannelOut *out)
{
	return out->count;
}

bool channel_out_finish(ChannelOut *out, int timeout_ms)
{
	usec_t deadline = get_mono_usec() + (usec_t)timeout_ms * 1000;
	for (;;) {
		flush(out);
		if (out->count == 0)
			return true;
		usec_t now = get_mono_usec();
		if (now >= deadline)
			break;
		struct pollfd pfd = {.fd = out->sock, .events = POLLOUT};
		if (poll(&pfd, 1, (int)((deadline - now + 999) / 1000)) < 0 && errno != EINTR)
			break;
	}
	log_warning("the control channel to %s had no room for %zu queued messages within %d ms: dropped", out->peer,
	            out->count, timeout_ms);
	drop_all(out);
	return false;
}
