/*
 * Moving a logged-in client to another worker of the tree (rebalancing,
 * doc/workers.md "Rebalancing long-lived clients"): a movable client is
 * packed into bytes (database, users, tracked parameters, prepared
 * statements, cancel key, timers, counters) and its socket travels beside
 * them by SCM_RIGHTS over a SOCK_SEQPACKET socket; the other side rebuilds
 * the client from both. The client notices nothing: not a byte is read or
 * written on its socket during the move.
 *
 * Building blocks (pack / send / forget, recv / adopt) are separate from
 * the batch handlers (CH_MIGRATE, CH_ADOPT) so that another hand-over,
 * such as an online upgrade, can reuse them.
 */
#ifndef PGB_WORKER_MIGRATE_H
#define PGB_WORKER_MIGRATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/pktbuf.h"
#include "worker/handover_codec.h"
#include "worker/objects.h"

#define MIGRATE_MAX_STATE   (128 * 1024)         /* largest packed client; a bigger one stays where it is */
#define MIGRATE_MAX_REQUEST HANDOVER_MAX_REQUEST /* largest buffered request a waiting client takes along */

/* Why c cannot move now, or NULL if it can. *lasting: the reason will not pass by itself (TLS, ...). */
const char *migrate_unmovable_reason(const PgSocket *c, bool *lasting);

/* Whether c counts at all (a logged-in client of a pool; consoles and internal connections do not). */
bool migrate_counts(const PgSocket *c);

/*
 * Pack a movable client's state (not its socket) into out, with its server's
 * when it is an idle session-mode client linked to one; moved: the client's
 * units that pool_move_client_budget() gave the receiver, or NULL;
 * server_moved: the same for the server (pool_move_server_budget()). False
 * if it is larger than MIGRATE_MAX_STATE.
 */
bool migrate_pack(const PgSocket *c, const int *moved, const int *server_moved, PktBuf *out);

/*
 * One packed client and its socket (and its server's, server_fd >= 0) over a
 * SOCK_SEQPACKET socket, without blocking. False (errno) = nothing sent.
 */
bool migrate_send(int sock, const PktBuf *state, int fd, int server_fd);

/*
 * Receive one packed client into buf (cap bytes): 1 with *len, fds[] and
 * *nfds set (the client's socket, then its server's; -1 where none came),
 * 0 at EOF, -1 on error or EAGAIN (errno).
 */
int migrate_recv(int sock, uint8_t *buf, size_t cap, size_t *len, int fds[2], int *nfds);

/*
 * After a successful send: forget c here, keeping the connection open (only
 * our descriptor closes). units_moved: its units went to the receiver.
 */
void migrate_forget(PgSocket *c, bool units_moved);

/*
 * Rebuild a client from its packed state and socket: found or made
 * database, user and pool; counted in the client limits. NULL on failure,
 * with the reason in err: the client then gets a FATAL and is closed.
 * same_tree: the giver is a worker of this tree, which may have moved the
 * client's units here (pool_move_client_budget()).
 */
PgSocket *migrate_adopt(const uint8_t *data, size_t len, int fd, int server_fd, bool same_tree, char *err,
                        size_t errlen);

/* CH_MIGRATE: hand up to count movable clients to worker `to` over sock (closed at the end); one log line. */
void migrate_give(int sock, int to, int64_t count);

/*
 * CH_HANDOFF (a retiring tree, -R): keep sock and hand every movable client
 * over it now and at each migrate_handoff_tick() until this worker exits.
 */
void migrate_handoff_start(int sock);
/*
 * Draining: give the clients that have become movable (a transaction
 * ended in this loop pass) to the worker of the master's last move order,
 * over its socket, which a draining worker keeps (migrate_give()).
 */
void migrate_drain_due(void);
/* Draining (each publish tick): the kept socket is closed once the worker it leads to drains too or is gone. */
void migrate_drain_check(void);
void migrate_handoff_tick(void);
void migrate_handoff_due(void); /* the same at the end of a loop pass in which a transaction ended */

/*
 * CH_ADOPT: read clients from worker `from` over sock until EOF, in the
 * event loop. old_tree: the giver is a retiring tree's worker (-R), which
 * keeps sending until it exits.
 */
void migrate_take(int sock, int from, bool old_tree);

/*
 * This worker drains: refuse further clients from old-tree givers (they
 * finish theirs themselves), taking what is already on its way, so that
 * our exit does not wait for theirs.
 */
void migrate_stop_old_tree_intakes(void);

/* Logged-in clients that could move now and that cannot (the gauges SHOW WORKERS shows). */
void migrate_count(uint32_t *movable, uint32_t *unmovable);

/* A client closed (CLIENT_GONE_MOVED, hooks.h): if it was adopted, the master forgets where its cancel key lives. */
void migrate_client_closed(PgSocket *c);

#endif
