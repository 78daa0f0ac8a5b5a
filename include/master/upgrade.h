/*
 * Online restart (`pgbouncer -R`, doc/workers.md "Upgrading"): the running
 * master listens on a control socket in its private directory; a new
 * master started with -R on the same configuration connects to it, takes
 * every listening socket (the same sockets, so nothing queued in the
 * kernel is lost), starts its workers on them, and then tells the old
 * master, which drains its workers and exits.
 */
#ifndef PGB_MASTER_UPGRADE_H
#define PGB_MASTER_UPGRADE_H

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/channel.h"
#include "master/listen.h"

#define UPGRADE_MAX_ORPHANS 64 /* SHM_MAX_WORKERS */

/* What the new master received from the old one. */
typedef struct Takeover {
	int conn;           /* the control connection, -1 after upgrade_commit() */
	InheritedSocket *s; /* every listening socket */
	int n;
	int workers; /* the old tree's worker count */
	pid_t old_pid;
	int shm_fd;           /* the old tree's shared memory (memfd), -1 = none */
	uint8_t salt_key[32]; /* the old tree's SCRAM salt key (include/common/scram.h) */
	bool have_salt_key;
	uint32_t client_state_version; /* the old binary's CLIENT_STATE_VERSION, 0 = it cannot hand clients over */
	int n_orphans;                 /* adopted orphaned workers (their master died; conn is -1 then), else 0 */
	pid_t orphan_pids[UPGRADE_MAX_ORPHANS];
} Takeover;

/*
 * New master: connect to the running master of this configuration and take
 * its listening sockets. False (nothing changed) when no old process
 * answers; fatal when one answers but the hand-over fails.
 */
bool upgrade_connect(const char *private_dir, Takeover *t);

/* New master: give one of our workers (the k-th old worker's partner) socket fd as CH_ADOPT. */
typedef bool (*UpgradeAdoptFn)(int k, int fd);

/*
 * New master started without a running one: adopt the workers of a tree
 * whose master died (doc/workers.md "When the master dies"), found by
 * their adoption sockets in private_dir. Each hands over copies of the
 * listening sockets it holds, the tree's shared memory and SCRAM salt
 * key; t is filled as upgrade_connect() fills it (workers = the orphans
 * found, old_pid 0) and their pids are in t->orphan_pids. False when no
 * orphan answers.
 */
bool upgrade_find_orphans(const char *private_dir, Takeover *t);

/*
 * New master, its grace period over (UPGRADE_GRACE_S after its workers
 * run): tell every adopted orphan to stop accepting and to hand its
 * clients to one of our workers (adopt_fn), draining within
 * drain_timeout_ms (0 = no bound). Until then a new master that dies
 * leaves the orphans serving as they were.
 */
void upgrade_release_orphans(UpgradeAdoptFn adopt_fn, int64_t drain_timeout_ms);

/*
 * New master: fn(pid) when the control connection to an older master
 * closes (it exited, or died: during its grace period its workers then
 * serve on as orphans, for us to adopt).
 */
void upgrade_on_pred_gone(void (*fn)(pid_t pid));

/*
 * New master, its workers started: offer the old workers a socket each to
 * hand their clients to ours (adopt_fn; NULL = none), then tell the old
 * master to stop accepting and drain. Once it confirmed, the connection
 * stays open (watched from `base`) while that master lives, for
 * upgrade_forward_cancel().
 */
void upgrade_commit(Takeover *t, UpgradeAdoptFn adopt_fn, struct event_base *base);

/*
 * New master: pass a cancel request that no client of this tree has (key
 * in m->arg, requester's socket fd) to the master we took over from, which
 * routes it in its tree (doc/workers.md "Upgrading"). False if that master
 * is gone or cannot be reached: the caller drops the request.
 */
bool upgrade_forward_cancel(const ChannelMsg *m, int fd);

/*
 * In a worker just forked: close what the master holds for online restarts
 * and adoptions (the control socket, the connections to older masters, to
 * orphans and to a successor, the hand-off sockets), and the fds that
 * cancel requests queued for them hold (each keeps a requester waiting
 * until it is closed).
 */
void upgrade_forget_in_child(void);

/* Inherited sockets nobody took (their address is gone from listen_addr): closed, with a log line. */
void upgrade_close_unused(Takeover *t);

/*
 * How long a running master keeps its tree serving after a new master took
 * over (CH_UP_DONE) before it retires: if the new master dies within it, the
 * old tree carries on instead of leaving nothing behind (doc/workers.md
 * "Upgrading").
 */
#define UPGRADE_GRACE_S 3

/* Running master: called with the new master's pid once it has served for UPGRADE_GRACE_S; the old tree then
 * retires. */
typedef void (*UpgradeRetireFn)(pid_t new_pid);

/*
 * Running master: the new master went away within the grace period (its
 * control connection closed without CH_UP_BYE). The tree is serving as
 * before and scaling again; the caller takes back its pidfile and control
 * socket.
 */
typedef void (*UpgradeResumeFn)(pid_t new_pid);
void upgrade_on_resume(UpgradeResumeFn fn);

/*
 * Running master: the new master committed (CH_UP_DONE sent). From now on
 * the unix socket file, the private sockets and the pidfile are its: an
 * exit of ours, within the grace period too, must leave them alone (a
 * resume takes them back).
 */
typedef void (*UpgradeHandedFn)(pid_t new_pid);
void upgrade_on_handed(UpgradeHandedFn fn);

/* New master, stopping on purpose: an old master still in its grace period retires now (CH_UP_BYE). */
void upgrade_goodbye(void);
/*
 * Running master: called when a new master asks for the sockets; sends
 * them with upgrade_send_listener() and returns the worker count (-1 on
 * failure). Called again with conn = -1 if that new master gives up.
 */
typedef int (*UpgradeExportFn)(int conn);

/*
 * Running master, once it retired: a CH_CANCEL the new master passed on
 * (the requester's socket fd stays the caller's: send a copy).
 */
typedef void (*UpgradeCancelFn)(ChannelMsg *m, int fd);

/*
 * Running master: listen on <private_dir>/master (mode 0600, same uid
 * only). False (logged) if it cannot: -R then cannot find this process.
 */
bool upgrade_listen(struct event_base *base, const char *private_dir, UpgradeExportFn export_fn,
                    UpgradeRetireFn retire_fn, UpgradeCancelFn cancel_fn);

/* One listening socket for the new master (id = listener id, UINT32_MAX = the unix socket). */
bool upgrade_send_listener(int conn, uint32_t id, int fd);

/* The memfd of the shared memory, for the new master. */
bool upgrade_send_segment(int conn, int fd);

/* Running master, retiring: the next socket a new worker takes clients on (CH_HANDOFF), -1 = none left. */
int upgrade_next_handoff(void);

/*
 * New master: a cancel request an adopted orphan could not place (no
 * worker of the old tree has the key) goes to fn, which passes it to a
 * client moved to our tree, or drops it.
 */
void upgrade_on_orphan_cancel(UpgradeCancelFn fn);

/* Stop listening (retiring, or exit); the socket file is removed only if it is still ours. */
void upgrade_stop_listening(void);

#endif
