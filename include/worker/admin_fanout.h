/* The console answers for every worker: commands sent to the others and answers merged (doc/workers.md). */
#ifndef PGB_WORKER_ADMIN_FANOUT_H
#define PGB_WORKER_ADMIN_FANOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/objects.h"

typedef enum FanoutMerge {
	FM_COMMAND,   /* process command: one tag once every worker has completed */
	FM_CONCAT,    /* rows of every worker in one PgBouncer's order (CLIENTS, SERVERS, SOCKETS) */
	FM_POOLS,     /* one row per (database, user): counts summed, maxwait maxed */
	FM_DATABASES, /* one row per database: connection counts summed, paused/disabled or-ed */
	FM_USERS,     /* one row per user: connection counts summed */
	FM_LISTS,     /* peers answer SHOW LISTS_RAW: objects counted once by name, connections summed */
	FM_MEM,       /* used, free and memtotal summed */
	FM_STATE,     /* active if all are, paused/suspended if any is */
	FM_DNS,       /* one row per host name */
	FM_STATS,     /* peers answer SHOW STATS_RAW; `which` as admin_write_stats() */
} FanoutMerge;

/* What a process command's fan-out does beyond merging (FM_COMMAND; doc/workers.md "The admin console with several workers"). */
typedef enum FanoutFollow {
	FOLLOW_NONE,
	/*
	 * KILL: each worker answers the databases it paused as rows; a database
	 * any worker paused is then killed ("KILL db") on the others too.
	 */
	FOLLOW_KILL,
	/*
	 * DISABLE db: when a worker has db and another has not (an auto-database
	 * it has not created), that one remembers the flag (DISABLE_LATER db).
	 */
	FOLLOW_DISABLE,
} FanoutFollow;

typedef struct FanoutCommand {
	const char *undo;    /* the query that undoes one worker's finished part (NULL: none) */
	FanoutFollow follow; /* what follows once every worker has answered */
	const char *db;      /* FOLLOW_DISABLE: the database */
	/*
	 * It may change the console's state (PAUSE, SUSPEND, RESUME, KILL,
	 * DISABLE, ENABLE): the workers it leaves out take the state over from
	 * the master (admin_state_left_out()).
	 */
	bool state;
} FanoutCommand;

bool admin_fanout_wanted(const PgSocket *c);

/*
 * The other live workers a console command of c does not reach as peers
 * (all of them without a fan-out; a worker still starting when the fan-out
 * began): a mask of worker slots, for the master to hand them its outcome.
 */
uint64_t admin_fanout_missed(const PgSocket *c);
bool admin_fanout_from_worker(int pid); /* pid is another worker of this pooler */
/*
 * Start a fan-out of `query` to every other active or draining worker, and
 * capture what this worker's own console code answers c from now on: run
 * it right after, then admin_fanout_dispatch(). `waits`: the command may
 * take long on a live worker (PAUSE, SUSPEND, ...). `cmd`: for FM_COMMAND
 * (NULL: no undo, no follow-up).
 */
void admin_fanout_begin(PgSocket *c, const char *query, FanoutMerge merge, int which, bool waits,
                        const FanoutCommand *cmd);
/* Send the query to the other workers, unless this worker refused it already (the command fails). */
void admin_fanout_dispatch(PgSocket *c);
bool admin_fanout_capture(PgSocket *c, const uint8_t *buf, size_t len); /* false: not capturing */
/* The command c's fan-out is running (NULL: none); done_here: this worker's part of it succeeded already. */
const char *admin_fanout_command(const PgSocket *c, bool *done_here);
/*
 * A CancelRequest for c: passed on to the peers still working on its
 * command; the peers whose part succeeded already (or succeeds later) get
 * the command's undo.
 */
void admin_fanout_cancel(PgSocket *c);
void admin_fanout_client_gone(PgSocket *c); /* c is closing (CLIENT_GONE_CONSOLE, hooks.h): drop its peer connections */
bool admin_console_busy(const PgSocket *c); /* a fanned-out command is still running: hold its input */
/*
 * An error that says only that this worker has nothing to act on (the
 * database or client is not here, nothing is paused here): for a fanned-out
 * command it is no refusal when another worker did act (doc/workers.md).
 */
bool admin_error_is_absence(const char *msg);

/*
 * Sums of a database's pools (SHOW STATS and friends): the totals, the
 * snapshot taken at the start of the previous stats_period, and the rates
 * per second since that snapshot (each worker divides by its own time
 * since its snapshot; the rates of several workers add up). The fan-out
 * sums the workers' into these; the console writes them (admin_write_stats()).
 */
typedef struct DbStats {
	const char *name;
	PgStats total, older;
	double rate[PGSTATS_FIELDS];
} DbStats;

#endif
