/* The admin console: commands and SHOW subjects of this worker. */
#ifndef PGB_WORKER_ADMIN_H
#define PGB_WORKER_ADMIN_H

#include "common/console_state.h"
#include "common/pktbuf.h"
#include "worker/admin_fanout.h"
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
/* Log a console command's error as refused commands are (the ERROR line, and log_pooler_errors' WARNING). */
void admin_log_error(PgSocket *c, const char *msg);
/*
 * The pooler's console state from the master (CH_CONSOLE_SYNC), after a
 * console command left this worker out: pause, suspend or resume as it
 * says, and set or clear every database's paused and disabled flag.
 */
void admin_take_state(const ConsoleState *cs);
/* A console SET this worker missed (it was starting), passed on by the master (CH_SET). */
void admin_apply_set(const char *key, const char *val);

/* The follow-ups of a fanned-out KILL and DISABLE db (admin_fanout.h), on this worker. */
void admin_kill_here(const char *db_name);
void admin_disable_later(const char *db_name);

/*
 * which: 0 STATS, 1 STATS_TOTALS, 2 STATS_AVERAGES, 3 TOTALS; RowDescription,
 * rows, CommandComplete. tree: the answer is the whole pooler's, and the
 * totals are the tree's in shared memory (db_stats_totals()), which keep the
 * counts of workers that exited.
 */
void admin_write_stats(PktBuf *pb, int which, const DbStats *arr, int n, bool tree);

#endif
