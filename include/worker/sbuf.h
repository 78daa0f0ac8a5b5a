/*
 * Stream buffer: one per client or server socket. It reads into a fixed
 * buffer, cuts the stream into protocol packets and asks its owner, per
 * packet header, what to do: forward the packet to the linked peer in
 * pieces, skip it, or have it buffered whole to be parsed. A peer that
 * cannot take more stops the source from reading (back-pressure), so a slow
 * reader never makes the pooler buffer a whole result set.
 *
 * The read event stays armed while a socket is reading, and also while its
 * owner waits (SB_WAIT) until input arrives; a write event is armed only
 * while output is blocked. Normal traffic therefore costs one recv and one
 * send per packet batch and no epoll_ctl.
 */
#ifndef PGB_WORKER_SBUF_H
#define PGB_WORKER_SBUF_H

#include <event2/event.h>
#include <event2/event_struct.h>
#include <openssl/ssl.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "common/pktbuf.h"
#include "common/proto.h"

typedef struct SBuf SBuf;

/* What the owner wants done with the packet whose header it was shown. */
typedef enum SBufAction {
	SB_FORWARD,   /* pass the whole packet to the peer, as it arrives */
	SB_SKIP,      /* drop the whole packet, as it arrives */
	SB_NEED_FULL, /* show it again once the whole packet is buffered */
	SB_CONSUMED,  /* the owner used the whole (full) packet */
	SB_WAIT,      /* leave the packet where it is and stop reading; sbuf_continue() resumes */
	SB_CLOSED,    /* the owner closed this connection: touch nothing */
} SBufAction;

typedef enum SBufEvent {
	SBEV_PACKET,         /* a packet header is available (hdr, data, avail set) */
	SBEV_BAD_PACKET,     /* unparsable or oversized header (data/avail = raw bytes) */
	SBEV_EOF,            /* peer closed or recv failed */
	SBEV_SEND_FAILED,    /* send to this socket failed */
	SBEV_CONNECTED,      /* outgoing connect() completed */
	SBEV_CONNECT_FAILED, /* outgoing connect() failed (errno in sb->last_errno) */
	SBEV_FLUSHED,        /* all queued output is written (only after sbuf_notify_flush()) */
	SBEV_RAW_BYTE,       /* sbuf_expect_byte(): data[0] is the byte (avail = all bytes buffered) */
	SBEV_DIRECT_TLS,     /* sbuf_detect_tls(): the first byte is a TLS handshake record */
	SBEV_TLS_READY,      /* the TLS handshake finished */
	SBEV_TLS_FAILED,     /* the TLS handshake failed (sbuf_tls_error() says why) */
} SBufEvent;

/*
 * The owner's callback. For SBEV_PACKET: `data` points at the packet's first
 * byte (type byte, or length for startup-phase packets), `avail` bytes of it
 * are buffered; the packet is complete when avail == hdr->len. For other
 * events hdr is NULL and the return value is ignored unless SB_CLOSED.
 */
typedef SBufAction (*sbuf_cb_t)(SBuf *sb, SBufEvent ev, const PktHdr *hdr, const uint8_t *data, uint32_t avail);

struct SBuf {
	struct event ev_read;      /* EV_READ|EV_PERSIST, armed while reading */
	struct event *ev_write;    /* armed while output is blocked or connecting; allocated when first needed */
	bool reading;              /* ev_read is armed (left so after SB_WAIT until input comes) */
	bool writing;              /* ev_write is armed */
	bool connecting;           /* waiting for connect() to finish */
	bool startup;              /* packets have no type byte (startup phase) */
	bool paused;               /* owner asked to stop reading (SB_WAIT or sbuf_pause) */
	bool notify_flush;         /* owner wants SBEV_FLUSHED */
	bool in_process;           /* guards against re-entering sbuf_process */
	bool resume_pending;       /* sbuf_continue() was called from inside a callback */
	bool raw_byte;             /* deliver the next input byte as SBEV_RAW_BYTE (SSLRequest answer) */
	bool detect_tls : 1;       /* the first byte read tells whether the client starts a direct TLS handshake */
	bool tls_prefix : 1;       /* buf[pos, end) is the start of a direct TLS handshake, for OpenSSL to read first */
	bool tls_drained : 1;      /* a TLS read found the socket empty: no read() until it is reported readable */
	bool tls_handshake;        /* the TLS handshake is in progress */
	bool tls_read_wants_write; /* SSL_read needs the socket writable */
	bool tls_failed;           /* a fatal TLS error: no close_notify at close */
	bool give_back;            /* accepted (a client): give the input buffer back when idle and unlinked */
	bool pkt_forward;          /* the current packet is forwarded (else skipped) */
	bool marked_mid_pkt;       /* [send_pos, send_end) starts inside a packet whose head went out already */
	bool ring_ok : 1;          /* the owner allows receiving through io_uring (sbuf_use_ring) */
	uint8_t direct_reads;      /* recv() calls since ring_ok, up to the switch (sbuf.c RING_AFTER_READS) */

	uint8_t *buf;        /* input buffer, NULL while idle (nothing buffered) */
	uint32_t size;       /* its size (grows for a packet that must be held whole); 0 without one */
	uint32_t pos;        /* first unprocessed byte */
	uint32_t end;        /* end of received data */
	uint32_t pkt_remain; /* bytes of the current packet not yet passed on/skipped */
	uint32_t send_pos;   /* [send_pos, send_end) of buf is due to the peer */
	uint32_t send_end;
	uint32_t base_size; /* pkt_buf: size to shrink back to */
	uint32_t max_len;   /* largest packet accepted (max_packet_size) */
	uint32_t queued_in; /* the send-queue batch holding a send to this socket (worker/sendq.h), 0 for none */

	SBuf *dst;               /* peer that forwarded packets go to */
	SBuf *waiting_src;       /* a peer whose forwarding is blocked on this socket's output */
	PktBuf out;              /* pooler-generated output, written before forwarded bytes */
	size_t out_pos;          /* bytes of `out` already written */
	struct SBufSpill *spill; /* what a queued send could not write: goes out before anything else */
	struct SBufRing *rq;     /* receiving through io_uring (worker/recvq.h), NULL while on epoll */

	sbuf_cb_t cb;       /* owner's callback */
	void *owner;        /* the PgSocket */
	int fd;             /* -1 when closed */
	int last_errno;     /* errno of the last failure */
	uint64_t bytes_in;  /* bytes received */
	uint64_t bytes_out; /* bytes forwarded out of this buffer to the peer */

	SSL *ssl; /* TLS on this socket (owned) once sbuf_tls_start() ran, or NULL for plain */
};

/*
 * A function run at the start of every socket event, before any owner
 * callback (the worker reads its clock there once, not per packet).
 */
void sbuf_set_wake_hook(void (*hook)(void));

/*
 * Where the limit of reads per socket event is kept (sbuf_loopcnt,
 * doc/pgbouncer.5.md): read at each event, so a reload or SET applies at
 * once. Unset or 0: read until the socket is empty.
 */
void sbuf_set_loopcnt(const int *setting);

/*
 * Attach an accepted socket and start reading. The socket must be
 * non-blocking already (accept4() with SOCK_NONBLOCK makes it so without
 * two fcntl() calls per login; sbuf_set_nonblocking() for other sources).
 */
void sbuf_accept(SBuf *sb, struct event_base *base, int fd, uint32_t pkt_buf, uint32_t max_len, sbuf_cb_t cb,
                 void *owner);
void sbuf_set_nonblocking(int fd);

/* Read what an accepted socket already holds (TCP_DEFER_ACCEPT) without waiting for the event loop. */
void sbuf_read_now(SBuf *sb);

/*
 * Input that arrived before this buffer owned the socket (a client moved
 * here while waiting for a server): processed from the event loop as if
 * just read, ahead of what the socket brings next.
 */
void sbuf_preload(SBuf *sb, const void *data, uint32_t len);

/*
 * Start a non-blocking connect; SBEV_CONNECTED or SBEV_CONNECT_FAILED
 * follows. False if it failed at once. tune (may be NULL) sets socket
 * options on a TCP socket before the connect: buffer sizes must be known
 * before TCP agrees on its window.
 */
/*
 * A connected socket that came from elsewhere (a server connection another
 * worker handed over with its client): set up and read, with no startup
 * packet to expect.
 */
void sbuf_attach(SBuf *sb, struct event_base *base, int fd, uint32_t pkt_buf, uint32_t max_len, sbuf_cb_t cb,
                 void *owner);

bool sbuf_connect(SBuf *sb, struct event_base *base, const struct sockaddr *sa, socklen_t salen, uint32_t pkt_buf,
                  uint32_t max_len, void (*tune)(int fd), sbuf_cb_t cb, void *owner)
    __attribute__((warn_unused_result));

/* Stop reading (e.g. while a client waits for a server). */
void sbuf_pause(SBuf *sb);

/* Resume reading and re-offer the packet left by SB_WAIT. Safe to call from a callback of another sbuf. */
void sbuf_continue(SBuf *sb);

/*
 * Queue pooler-generated bytes for this socket and try to write them now.
 * False if the socket failed; callers that are about to close anyway may
 * ignore it, since a failed socket also reports SBEV_EOF/SBEV_SEND_FAILED.
 */
bool sbuf_send(SBuf *sb, const void *data, size_t len);
bool sbuf_send_pktbuf(SBuf *sb, PktBuf *pb); /* sends and resets pb */

void sbuf_forward_queue(SBuf *src, const void *data, size_t len, bool flush_now); /* sbuf_forward_own()'s work */

/*
 * Pooler-made bytes for src's peer that must follow, in order, everything
 * src has already marked for forwarding (a rewritten or synthetic message
 * in the middle of forwarded traffic): the marked bytes move into the
 * peer's queue first. flush_now writes at once; otherwise the rest of
 * src's batch carries them out. A failed write is reported by the peer's
 * own events.
 */
static inline void sbuf_forward_own(SBuf *src, const void *data, size_t len, bool flush_now)
{
	SBuf *dst = src->dst;
	/* inline for the common call with nothing marked, nothing to add and nothing to write */
	if (!len && src->send_pos == src->send_end && (!dst || !flush_now || dst->out_pos >= dst->out.len))
		return;
	sbuf_forward_queue(src, data, len, flush_now);
}

/*
 * Forget the bytes src marked for its peer and has not handed over yet, as
 * if they had never come: for answers the client must not see ahead of a
 * fatal error. False (nothing dropped) if they start inside a packet whose
 * head went out already, since dropping its tail would cut the peer's stream.
 */
bool sbuf_drop_marked(SBuf *src);

/*
 * Like sbuf_forward_own() without flush_now, for a message the caller
 * builds in place: the marked bytes move into the peer's queue, which is
 * returned to append to (NULL when there is no peer).
 */
PktBuf *sbuf_own_queue(SBuf *src);

/* Ask for SBEV_FLUSHED once nothing is left to write (immediately if already flushed). */
void sbuf_notify_flush(SBuf *sb);

/* True when nothing is queued for this socket and nothing of its input awaits the peer. */
bool sbuf_is_flushed(const SBuf *sb);

/* Bytes sent to this socket wait in the send queue or its spill (not yet in the kernel). */
bool sbuf_unsent(const SBuf *sb);

/*
 * Batch this process's plain-socket sends per event-loop pass
 * (worker/sendq.h); the loop must call sendq_flush() after each pass.
 */
void sbuf_init_sends(void);

/*
 * Receive this process's logged-in plain sockets through io_uring
 * (worker/recvq.h) when the kernel allows; the loop must call
 * recvq_submit() after each pass.
 */
void sbuf_init_receives(struct event_base *base);

/*
 * The owner allows this socket to be received through io_uring: a plain
 * socket in a session's steady state, read by nobody else, never switched
 * to TLS. It moves there after a few reads of its own (a connection that
 * lives for one query never does).
 */
void sbuf_use_ring(SBuf *sb);

/*
 * Before the descriptor leaves this process (a client or server moved to
 * another worker or tree): the ring gives the socket up and reads it no
 * more. False when it had received bytes or an EOF that are not processed
 * yet (processed from the event loop), or did not let go within half a
 * second: the socket is not movable now, and sbuf_use_ring() lets it back
 * on the ring.
 */
bool sbuf_ring_release(SBuf *sb);

/* Input received through io_uring and not yet in the buffer (see sbuf_unprocessed). */
bool sbuf_ring_holds(const SBuf *sb);

/* Bytes buffered but not processed yet (a Terminate may be among them). */
static inline uint32_t sbuf_unprocessed(const SBuf *sb)
{
	return sb->end - sb->pos;
}

/*
 * Ask for the next input byte as SBEV_RAW_BYTE instead of as a packet: the
 * one-byte answer to an SSLRequest. The callback's SB_CONSUMED consumes
 * exactly that byte; more buffered bytes are visible in `avail`.
 */
void sbuf_expect_byte(SBuf *sb);

/* Before the first read of an accepted socket: report SBEV_DIRECT_TLS if the client starts with a TLS record. */
void sbuf_detect_tls(SBuf *sb);

/*
 * Switch the socket to TLS (taking ownership of `ssl`) and run the handshake
 * as the TLS server (`accept`) or client. Call it from the owner's callback
 * once all plain input is consumed; queued plain output (the 'S' answer) is
 * written first. SBEV_TLS_READY or SBEV_TLS_FAILED follows. False (ssl
 * freed) if the plain output could not be written or the SSL not attached.
 */
bool sbuf_tls_start(SBuf *sb, SSL *ssl, bool accept) __attribute__((warn_unused_result));

/* Why the last TLS handshake or TLS read/write failed (valid inside the callback). */
const char *sbuf_tls_error(void);

/* Close the socket and free buffers. Clears waiting links with the peer. */
void sbuf_close(SBuf *sb);

/*
 * Give back the memory of an idle socket's buffers (nothing buffered,
 * nothing queued); the next read or send takes it again. The janitor calls
 * it for clients and servers once a tick. Accepted sockets not linked to
 * a peer give their input buffer back by themselves at the end of each
 * event.
 */
void sbuf_trim(SBuf *sb);

/* Local/remote socket addresses (for SHOW CLIENTS and logs). */
bool sbuf_local_addr(const SBuf *sb, struct sockaddr_storage *ss, socklen_t *len);

#endif
