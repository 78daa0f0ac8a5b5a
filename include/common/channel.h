/*
 * The master<->worker control channel: a SOCK_SEQPACKET socketpair carrying
 * small fixed-size messages, optionally with one file descriptor
 * (SCM_RIGHTS) for listener hand-over.
 */
#ifndef PGB_COMMON_CHANNEL_H
#define PGB_COMMON_CHANNEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct event_base;

typedef enum ChannelMsgType {
	CH_TAKE_LISTENER = 1, /* master->worker: start accepting on the attached fd (id = listener id) */
	CH_DROP_LISTENER = 2, /* master->worker: stop accepting on listener `id` and close it */
	CH_DRAIN = 3,         /* master->worker: stop accepting, finish clients, exit (arg = timeout ms, 0 = none;
	                 id = 1: a new tree took over, doc/workers.md "Upgrading") */
	/*
	 * worker->master->worker: cancel key in arg (8 bytes), byte 3 names the
	 * owner; the requester's socket rides along, and the owner closes it once
	 * the cancel is handled (the requester then knows it is done).
	 */
	CH_CANCEL = 4,
	/*
	 * Rebalancing (doc/workers.md, "Rebalancing long-lived clients"): the
	 * master makes a SOCK_SEQPACKET socketpair and sends one end to each
	 * side. CH_MIGRATE: hand up to `arg` movable clients to worker `id`
	 * over the attached socket, then close it. CH_ADOPT: take the clients
	 * worker `id` sends over the attached socket until EOF (arg = 1: the
	 * giver is the old tree's worker `id`, -R, which sends until it exits;
	 * a drain of the taker shuts the socket for reading). Each client is
	 * one packet of state with its socket attached (include/worker/migrate.h).
	 */
	CH_MIGRATE = 5,
	CH_ADOPT = 6,
	/* worker->master: the client with cancel key `arg` now lives in worker `id` (it was moved there) */
	CH_MOVED = 7,
	/* worker->master: that moved client (cancel key `arg`) has closed */
	CH_MOVED_GONE = 8,
	/*
	 * master->worker of a retiring tree (-R, doc/workers.md "Upgrading"):
	 * keep the attached socket (its other end is a worker of the new tree,
	 * told CH_ADOPT) and hand every movable client over it, now and
	 * whenever more become movable, until this worker exits.
	 */
	CH_HANDOFF = 9,
	/*
	 * worker->master: a console SET the workers applied; the attached memfd
	 * holds "name\0value\0". The master applies it to its own configuration,
	 * the one the workers it starts from now on get (doc/workers.md).
	 */
	CH_SET = 10,
	/*
	 * worker->master: the console's PAUSE/SUSPEND and paused and disabled
	 * databases after a command changed them; the attached memfd holds the
	 * state (include/common/console_state.h). Workers the master starts
	 * from now on take it over (doc/workers.md "Console state").
	 */
	CH_CONSOLE_STATE = 11,
	/*
	 * master->worker: the pooler's PAUSE or SUSPEND ended (in the worker
	 * that reported it); a worker that took it over at start resumes.
	 */
	CH_CONSOLE_RESUME = 12,
	/*
	 * worker->master: a console state command of this worker's console left
	 * out the workers whose bits are set in `arg` (bit i = worker i): they
	 * did not answer in time, or the console went away before they did, and
	 * their connection from this console was closed. The state this worker
	 * reported before (CH_CONSOLE_STATE) is the pooler's; the master hands
	 * it to each of them as CH_CONSOLE_SYNC (doc/workers.md "Console state").
	 */
	CH_CONSOLE_LEFT_OUT = 13,
	/*
	 * master->worker: take the pooler's console state in the attached memfd
	 * (include/common/console_state.h) as your own, now: pause, suspend or
	 * resume, and set or clear the database flags. A command the left-out
	 * worker finds later on a peer connection whose other end has closed is
	 * stale and not run, so this state stays in force.
	 */
	CH_CONSOLE_SYNC = 14,
	/*
	 * Online restart (-R) between a new master and the running one, on the
	 * old master's control socket (doc/workers.md "Upgrading"):
	 * new->old CH_UP_HELLO (arg = protocol version); old->new one
	 * CH_UP_LISTENER per listening socket (fd attached; id = listener id, or
	 * UINT32_MAX for the unix socket), CH_UP_SEGMENT with the memfd of its
	 * shared memory (if it has one), CH_UP_SALT_KEY four times (id = part,
	 * arg = 8 bytes of the SCRAM salt key), then CH_UP_END (arg = its worker
	 * count, id = its CLIENT_STATE_VERSION, 0 from a binary that cannot
	 * hand clients over); new->old, only if its workers read that format
	 * (CLIENT_STATE_VERSION_OLDEST to CLIENT_STATE_VERSION), one
	 * CH_UP_HANDOFF per old worker (id = index, arg = that format, which
	 * the old master checks is its own; one end of a socket pair attached:
	 * the other end went to a new worker as CH_ADOPT); new->old CH_UP_COMMIT (arg = the new master's pid) once
	 * its workers accept; old->new CH_UP_DONE (arg = the old master's pid).
	 * The connection then stays open while the old master runs: new->old
	 * CH_CANCEL (id 0, requester's socket attached) for a key no client of
	 * the new tree has; the old master routes it in its tree. Right after
	 * CH_UP_DONE, old->new one CH_UP_PRED per connection the old master
	 * still has to a master before it (that connection attached, arg = that
	 * master's pid): the new master sends its cancels there too.
	 */
	CH_UP_HELLO = 16,
	CH_UP_LISTENER = 17,
	CH_UP_END = 18,
	CH_UP_COMMIT = 19,
	CH_UP_DONE = 20,
	CH_UP_SALT_KEY = 21,
	CH_UP_SEGMENT = 22,
	CH_UP_HANDOFF = 23,
	CH_UP_PRED = 24,
	/*
	 * new->old, during the old master's grace period after CH_UP_DONE
	 * (doc/workers.md "Upgrading"): the new master stops on purpose (a
	 * shutdown signal), so its end of the connection closing is no crash
	 * to recover from: the old tree retires at once instead of serving on.
	 */
	CH_UP_BYE = 25,
	/*
	 * master->worker: this worker may outlive its master (doc/workers.md
	 * "When the master dies"). Sent at once to the workers of a master that
	 * started on its own, and only after the grace period to those of one
	 * that took over (-R, or an orphaned tree): within it a master that
	 * dies takes its new workers with it and the older tree carries on.
	 */
	CH_SETTLE = 26,
	/*
	 * A new master and an orphaned worker (its master died), on the
	 * worker's adoption socket `<private dir>/worker.<id>/adopt`
	 * (SOCK_SEQPACKET, mode 0600; both sides check the peer's uid):
	 * new->orphan CH_ORPHAN_HELLO (arg = protocol version); orphan->new
	 * what a master sends at -R for its tree, for this worker alone: a
	 * CH_UP_LISTENER per listening socket it holds, CH_UP_SEGMENT (the
	 * old tree's shared memory), CH_UP_SALT_KEY four times, then CH_UP_END
	 * (arg = its worker id, id = its CLIENT_STATE_VERSION). From then on
	 * the connection is the worker's control channel from the new master:
	 * CH_DRAIN (id 1) and CH_HANDOFF once the new master's grace period is
	 * over, CH_CANCEL for keys no client of the new tree has. If it closes
	 * before the drain, the worker is an orphan again.
	 */
	CH_ORPHAN_HELLO = 27,
} ChannelMsgType;

/*
 * CH_CANCEL's id from a worker: 0 = the key names another worker (byte 3);
 * CANCEL_NOT_HERE = the key names this worker but no client of it has it
 * (it may have been moved: the master looks it up among moved clients), or
 * a cancel the master sent to this worker found no client (the master
 * passes it to the tree it replaced, if that one still runs, or drops it).
 */
#define CANCEL_NOT_HERE 1
/*
 * CH_CANCEL's id from the master: CANCEL_FINAL = deliver it if a client
 * here has the key, else drop it, never back to the master (a cancel that
 * came back from an adopted tree, which must not go round again).
 */
#define CANCEL_FINAL    2

/*
 * The format of a moved client's packed state (src/worker/handover/handover_codec.c).
 * A binary writes CLIENT_STATE_VERSION and reads every format from
 * CLIENT_STATE_VERSION_OLDEST on, so at -R it takes clients from a binary
 * whose format is one of those (doc/architecture.md, "The handover codec").
 * 2: each prepared statement carries its result type.
 * 3: fields as tag, length, value, from one table; version 2 still read.
 */
#define CLIENT_STATE_VERSION        4u
#define CLIENT_STATE_VERSION_OLDEST 2u

/* Whether this binary's workers read clients packed in format v (-R: the running binary's format). */
static inline bool client_state_readable(uint32_t v)
{
	return v >= CLIENT_STATE_VERSION_OLDEST && v <= CLIENT_STATE_VERSION;
}

typedef struct ChannelMsg {
	uint32_t type; /* ChannelMsgType */
	uint32_t id;   /* listener id */
	int64_t arg;   /* type-specific */
} ChannelMsg;

/* Create the socketpair (both ends close-on-exec). */
bool channel_pair(int fds[2]) __attribute__((warn_unused_result));

/* Send a message with an optional fd (-1 = none). False with errno on failure. */
bool channel_send(int sock, const ChannelMsg *msg, int fd) __attribute__((warn_unused_result));

#define FD_SEND_MAX 2 /* descriptors one message carries at most: a client and its session's server */

/*
 * One message of `len` bytes on a SOCK_SEQPACKET socket, with the nfds
 * descriptors of fds attached by SCM_RIGHTS (the control channel's one, or
 * a moving client's socket and its server's): sendmsg() with `flags` |
 * MSG_NOSIGNAL, retried on EINTR. Returns what sendmsg() returned.
 */
ssize_t fd_send(int sock, const void *buf, size_t len, const int *fds, int nfds, int flags);

/*
 * The other side: one message into buf (at most cap bytes), the attached
 * descriptors into fds (at most maxfds, in order, close-on-exec; the rest
 * -1, *nfds says how many came; more than maxfds are closed), recvmsg()
 * with `flags`, retried on EINTR. *truncated (when not NULL) says the
 * message did not fit. Returns what recvmsg() returned.
 */
ssize_t fd_recv(int sock, void *buf, size_t cap, int *fds, int maxfds, int *nfds, int flags, bool *truncated);

/*
 * Receive one message; *fd gets the attached descriptor or -1.
 * Returns 1 on a message, 0 on EOF (peer gone), -1 on error/EAGAIN (errno set).
 */
int channel_recv(int sock, ChannelMsg *msg, int *fd);

/* The message type's name for log lines ("CH_MOVED"; "message 99" for an unknown one, in a static buffer). */
const char *channel_msg_name(uint32_t type);

/*
 * The sending side of one control channel (doc/architecture.md "Control
 * channel"): no message is dropped because the peer reads slowly. A message
 * goes out at once while the socket has room; once it is full, it and every
 * later one wait in a queue, in order, and go out when the socket becomes
 * writable again (an EV_WRITE event in the owner's loop). A queued message
 * holds a duplicate of its fd, closed once the message is sent or dropped.
 * The queue is capped (CHANNEL_OUT_MAX_QUEUED); being full and hitting the
 * cap are logged once per CHANNEL_OUT_LOG_INTERVAL_US each, as are send
 * errors. A peer gone (EPIPE, ECONNRESET) is not logged: its owner learns
 * it from EOF on the channel; what was queued for it is dropped.
 */
typedef struct ChannelOut ChannelOut;

#define CHANNEL_OUT_MAX_QUEUED      65536u   /* messages waiting at most (24 bytes each) */
#define CHANNEL_OUT_LOG_INTERVAL_US 10000000 /* 10 s: one log line per kind of trouble per interval */

/* A sender on non-blocking socket `sock` (not owned), events in `base`; `peer` names the other end in logs. */
ChannelOut *channel_out_new(struct event_base *base, int sock, const char *peer);

/* Drop what is still queued (closing its fds) and free the sender; the socket stays open. NULL is ignored. */
void channel_out_free(ChannelOut *out);

/*
 * In a child forked from the owner, whose loop it no longer runs: close the
 * fds held by queued messages (a moved-client socket pair end held here
 * would keep its peer from ever seeing EOF), touching nothing of the loop.
 * The memory stays (the child never frees it).
 */
void channel_out_forget_in_child(ChannelOut *out);

/*
 * Send `msg` with `fd` attached (-1 = none; the caller keeps its own fd
 * either way). True when it was sent or queued behind earlier ones; false,
 * with errno, when it is dropped: EPIPE/ECONNRESET (the peer is gone, now
 * or earlier), ENOBUFS (the queue is at its cap), EMFILE/ENFILE (fd could
 * not be duplicated for the queue), or another sendmsg() error.
 */
bool channel_out_send(ChannelOut *out, const ChannelMsg *msg, int fd);

/* Messages waiting in the queue. */
size_t channel_out_queued(const ChannelOut *out);

/*
 * Send what is queued now, waiting up to timeout_ms for room, without the
 * loop (before the owner exits, or hands the socket on). True when nothing
 * is left; what is left after the wait is dropped and logged.
 */
bool channel_out_finish(ChannelOut *out, int timeout_ms);

#endif
