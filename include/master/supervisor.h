/*
 * The supervisor: forks, reaps, drains and respawns workers, owns the
 * listener slots and the shared-memory segment, and runs the scaler tick.
 */
#ifndef PGB_MASTER_SUPERVISOR_H
#define PGB_MASTER_SUPERVISOR_H

#include <event2/event.h>
#include <stdbool.h>
#include <sys/types.h>

#include "common/channel.h"
#include "common/config.h"
#include "master/listen.h"
#include "common/tls.h"
#include "shm.h"

/* Create the shm segment and remember what workers need; call before supervisor_start(). */
void supervisor_init(struct event_base *base, Config *cf, const TlsContexts *tls, ListenSet *ls, int cmdline_verbose);

/*
 * Start the initial workers and the scaler tick: takeover_count (> 0 after
 * an online restart: the old tree's count) or the warm start count, clamped.
 */
void supervisor_start(int takeover_count);

/*
 * Online restart, old side: send every listening socket to the new master
 * on `conn` and stop scaling; returns the worker count, -1 on failure.
 * conn = -1: the new master gave up, scale again.
 */
int supervisor_export(int conn);

/*
 * Online restart or adoption, new side (before supervisor_start()): map
 * the old tree's segment read-only so that its budget counts add to ours
 * until the n `pids` have exited: its master (-R, `master` = that pid), or
 * the orphaned workers we adopted (`master` = 0).
 */
void supervisor_predecessor(int shm_fd, pid_t master, const pid_t *pids, int n);

/* Orphans of that tree adopted later (its master died after our -R): its counts add to ours until they exit. */
void supervisor_predecessor_add(const pid_t *pids, int n);

/*
 * From now on our workers may outlive us (CH_SETTLE to each, now and at
 * every fork): at once after a start of our own, after the grace period
 * after a take-over (doc/workers.md "When the master dies").
 */
void supervisor_settle(void);
bool supervisor_settled(void); /* supervisor_settle() was called */

/* Online restart, new side (before supervisor_start()): use the old tree's listener slots. */
void supervisor_inherit(InheritedSocket *s, int n);

/* Online restart, new side: wait (at most timeout_ms) until every worker started accepts. */
void supervisor_wait_active(int timeout_ms);

/* Online restart, old side: the new tree serves; drain every worker, close our TCP sockets, never respawn. */
void supervisor_retire(void);

/* New master (-R): worker k of the old tree hands its clients over fd; one of ours takes them (CH_ADOPT). */
bool supervisor_adopt_old(int k, int fd);

/*
 * After -R, in the old master: a cancel request the new master could not
 * place (CH_CANCEL, requester's socket fd, which stays the caller's) goes to
 * the worker of ours that has the key (doc/workers.md "Upgrading").
 */
void supervisor_cancel_from_successor(ChannelMsg *m, int fd);

/* A cancel an adopted orphan could not place: to the worker a client with that key moved to, else dropped. */
void supervisor_cancel_to_moved(ChannelMsg *m, int fd);

/* The running config changed (reload): new scaler settings. */
void supervisor_config_changed(Config *cf);

/* main.c's handler of a console SET a worker reports (CH_SET). */
void supervisor_on_console_set(void (*fn)(const char *name, const char *value));

/* The running config changed without a reload (a console SET): the scaler takes it up. */
void supervisor_settings_changed(void);

/*
 * Why an online restart cannot take over now, or NULL: the pooler is paused
 * or suspended, or a database is paused (PAUSE db). Its waiting clients could
 * not move, and no console could resume them once the new tree had the
 * sockets (doc/workers.md "Upgrading"). buf holds the text.
 */
const char *supervisor_paused_why(char *buf, size_t len);

/* Whether a console SUSPEND holds the pooler (as the workers last reported it). */
bool supervisor_suspended(void);

/* SIGUSR1 (pause) or SIGUSR2: the pause workers started later take over (doc/workers.md "Console state"). */
void supervisor_console_signal(bool pause);

/* Pass a signal on to every live worker. */
void supervisor_signal_all(int sig);

/* Reap exited workers (SIGCHLD). Returns true when no worker is left and none will be respawned. */
bool supervisor_reap(bool shutting_down);

/* Shutdown: close the TCP listener slots in the master (workers close theirs). */
void supervisor_close_tcp(void);

/*
 * Fast exit: wait up to timeout_ms for the workers, which got SIGQUIT, to
 * exit by themselves, reaping them; those still running are named in the
 * log (supervisor_kill_all() then kills them).
 */
void supervisor_wait_exit(int timeout_ms);

/* Kill every worker at once (fast exit paths); safe to call from the fatal hook. */
void supervisor_kill_all(void);

/* The shared-memory segment (after supervisor_init()). */
ShmSegment *supervisor_shm(void);
/* Number of live worker processes. */
int supervisor_live_workers(void);

#endif
