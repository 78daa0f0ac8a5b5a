/* The admin console: commands and SHOW subjects of this worker. */
#ifndef PGB_WORKER_ADMIN_H
#define PGB_WORKER_ADMIN_H

#include "common/console_state.h"
#include "common/pktbuf.h"
#include "worker/objects.h"

/* Run one console command and answer it; false if the client was closed. */
bool admin_handle_query(PgSocket *c, const char *query);
/* Finish a pending PAUSE/SUSPEND once its conditions hold (janitor and releases). */
void admin_pause_done_check(void);
/* Answer WAIT_CLOSE commands whose servers are all closed. */
void admin_wait_close_check(void);
/* A cancel for a console session: abort its pending PAUSE or WAIT_CLOSE. */
void admin_console_cancel(PgSocket *console);
void admin_resume_all(void); /* leave PAUSE/SUSPEND, wake waiting clients */
/*
 * Another worker refused c's fanned-out command `query`, so it fails: this
 * worker gives up its part. A wait ends (bare ReadyForQuery) and what it
 * paused resumes; a PAUSE [db] or SUSPEND done here (done_here) is undone.
 */
void admin_abandon_part(PgSocket *c, const char *query, bool done_here);
/*
 * An error that says only that this worker has nothing to act on (the
 * database or client is not here, nothing is paused here): for a fanned-out
 * command it is no refusal when another worker did act (doc/workers.md).
 */
bool admin_error_is_absence(const char *msg);
/* Log a console command's error as refused commands are (the ERROR line, and log_pooler_errors' WARNING). */
void admin_log_error(PgSocket *c, const char *msg);
/*
 * The pooler's console state from the master (CH_CONSOLE_SYNC), after a
 * console command left this worker out: pause, suspend or resume as it
 * says, and set or clear every database's paused and disabled flag.
 */
void admin_take_state(const ConsoleState *cs);
/* The follow-ups of a fanned-out KILL and DISABLE db (admin_fanout.h), on this worker. */
void admin_kill_here(const char *db_name);
void admin_disable_later(const char *db_name);

/*
 * Sums of a database's pools (SHOW STATS and friends): the totals, the
 * snapshot taken at the start of the previous stats_period, and the rates
 * per second since that snapshot (each worker divides by its own time
 * since its snapshot; the rates of several workers add up).
 */
typedef struct DbStats {
	const char *name;
	PgStats total, older;
	double rate[PGSTATS_FIELDS];
} DbStats;

/* which: 0 STATS, 1 STATS_TOTALS, 2 STATS_AVERAGES, 3 TOTALS; RowDescription, rows, CommandComplete. */
void admin_write_stats(PktBuf *pb, int which, const DbStats *arr, int n);
bool admin_console_busy(const PgSocket *c); /* a fanned-out command is still running: hold its input */

#endif
