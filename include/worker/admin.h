/* The admin console: commands and SHOW subjects of this worker. */
#ifndef PGB_WORKER_ADMIN_H
#define PGB_WORKER_ADMIN_H

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

/* Sums of a database's pools (SHOW STATS and friends). */
typedef struct DbStats {
	const char *name;
	PgStats total, older, newer; /* totals, and the two stats_period snapshots */
} DbStats;

/* which: 0 STATS, 1 STATS_TOTALS, 2 STATS_AVERAGES, 3 TOTALS; RowDescription, rows, CommandComplete. */
void admin_write_stats(PktBuf *pb, int which, const DbStats *arr, int n);
bool admin_console_busy(const PgSocket *c); /* a fanned-out command is still running: hold its input */

#endif
