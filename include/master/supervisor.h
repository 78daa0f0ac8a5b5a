/*
 * The supervisor: forks, reaps, drains and respawns workers, owns the
 * listener slots and the shared-memory segment, and runs the scaler tick.
 */
#ifndef PGB_MASTER_SUPERVISOR_H
#define PGB_MASTER_SUPERVISOR_H

#include <event2/event.h>
#include <stdbool.h>

#include "common/config.h"
#include "master/listen.h"
#include "common/tls.h"
#include "shm.h"

/* Create the shm segment and remember what workers need; call before supervisor_start(). */
void supervisor_init(struct event_base *base, Config *cf, const TlsContexts *tls, ListenSet *ls, int cmdline_verbose);

/* Start the initial workers (warm start count, clamped) and the scaler tick. */
void supervisor_start(void);

/* The running config changed (reload): new scaler settings. */
void supervisor_config_changed(Config *cf);

/* Pass a signal on to every live worker. */
void supervisor_signal_all(int sig);

/* Reap exited workers (SIGCHLD). Returns true when no worker is left and none will be respawned. */
bool supervisor_reap(bool shutting_down);

/* Shutdown: close the TCP listener slots in the master (workers close theirs). */
void supervisor_close_tcp(void);

/* Kill every worker at once (fast exit paths); safe to call from the fatal hook. */
void supervisor_kill_all(void);

/* The shared-memory segment (after supervisor_init()). */
ShmSegment *supervisor_shm(void);
/* Number of live worker processes. */
int supervisor_live_workers(void);

#endif
