/* The console answers for every worker: commands sent to the others and answers merged (doc/workers.md). */
#ifndef PGB_WORKER_ADMIN_FANOUT_H
#define PGB_WORKER_ADMIN_FANOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/objects.h"

typedef enum FanoutMerge {
	FM_COMMAND,   /* process command: one tag once every worker has completed */
	FM_CONCAT,    /* rows of every worker, worker by worker (CLIENTS, SERVERS, SOCKETS) */
	FM_POOLS,     /* one row per (database, user): counts summed, maxwait maxed */
	FM_DATABASES, /* one row per database: connection counts summed, paused/disabled or-ed */
	FM_USERS,     /* one row per user: connection counts summed */
	FM_LISTS,     /* peers answer SHOW LISTS_RAW: objects counted once by name, connections summed */
	FM_MEM,       /* used, free and memtotal summed */
	FM_STATE,     /* active if all are, paused/suspended if any is */
	FM_DNS,       /* one row per host name */
	FM_STATS,     /* peers answer SHOW STATS_RAW; `which` as admin_write_stats() */
} FanoutMerge;

void admin_fanout_listen(void); /* the private socket of this worker */
bool admin_fanout_wanted(const PgSocket *c);
bool admin_fanout_from_worker(int pid); /* pid is another worker of this pooler */
/*
 * Send `query` to every other active or draining worker, and capture what
 * this worker's own console code answers c from now on (run it right after).
 * `waits`: the command may take long on a live worker (PAUSE, SUSPEND, ...).
 */
void admin_fanout_begin(PgSocket *c, const char *query, FanoutMerge merge, int which, bool waits);
bool admin_fanout_capture(PgSocket *c, const uint8_t *buf, size_t len); /* false: not capturing */
/* The command c's fan-out is running (NULL: none); done_here: this worker's part of it succeeded already. */
const char *admin_fanout_command(const PgSocket *c, bool *done_here);
/*
 * A CancelRequest for c: passed on to the peers still working on its
 * command; the peers whose part succeeded already get `undo` (NULL: none).
 */
void admin_fanout_cancel(PgSocket *c, const char *undo);
void admin_fanout_client_gone(PgSocket *c); /* c is closing: drop its peer connections */

#endif
