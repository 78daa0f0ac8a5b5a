/*
 * The console's pooler-wide state and the workers started later
 * (doc/workers.md, "Console state"): a worker reports PAUSE, SUSPEND and
 * the paused and disabled databases to the master after a console command,
 * and a worker the master starts takes them over before it accepts.
 */
#ifndef PGB_WORKER_ADMIN_STATE_H
#define PGB_WORKER_ADMIN_STATE_H

#include <stdint.h>

#include "common/console_state.h"
#include "worker/objects.h"

/* At start, before the listeners: the state the master handed over. */
void admin_state_inherit(const ConsoleState *cs);
/* An auto-database created later takes its inherited flags... */
void admin_state_inherit_db(PgDatabase *db);
/* ...unless an ENABLE (CS_DB_DISABLED) or RESUME db (CS_DB_PAUSED) of it came first. */
void admin_state_inherited_clear(char kind, const char *name);
/* Keep flag `kind` for an auto-database this worker has not created (yet), as if inherited. */
void admin_state_remember(char kind, const char *name);
/* Tell the master this worker's state (after a console command changed it). */
void admin_state_report(void);
/*
 * CH_CONSOLE_RESUME: the PAUSE or SUSPEND this worker took over at start
 * ended in the worker that ran it; resume, unless a console command has
 * changed the pause here since.
 */
void admin_state_master_resume(void);
/*
 * A console command of this worker's console left out the workers in `mask`
 * (bit i = worker i; their connections from the console are closed): the
 * master hands them the state this worker reported (CH_CONSOLE_LEFT_OUT).
 */
void admin_state_left_out(uint64_t mask);
/*
 * CH_CONSOLE_SYNC: this worker was left out of a console command; take the
 * pooler's state in memfd `fd` over (admin_take_state()).
 */
void admin_state_sync(int fd);
/*
 * A new master adopted this orphaned worker (worker/orphan.h): resume a
 * PAUSE, SUSPEND or paused databases in force here. The new tree does not
 * know them, and no console reaches this worker any more (its private socket
 * is the new worker's), so nothing would ever resume its waiting clients,
 * which cannot move while paused. Disabled databases stay disabled.
 */
void admin_state_adopted(void);

#endif
