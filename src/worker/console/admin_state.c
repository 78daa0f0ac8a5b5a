/*
 * The console's state for workers started later and for workers a console
 * command left out (include/worker/admin_state.h, doc/workers.md "Console
 * state").
 */
#include "autoconfig.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/channel.h"
#include "common/log.h"
#include "common/util.h"
#include "worker/admin.h"
#include "worker/admin_state.h"
#include "worker/worker.h"

/*
 * What the master handed over at start, and the DISABLEs of auto-databases
 * this worker did not have (admin_state_remember()); auto-databases created
 * later look here.
 */
static ConsoleState inherited;

void admin_state_inherit_db(PgDatabase *db)
{
	if (db->admin)
		return;
	if (console_state_has(&inherited, CS_DB_PAUSED, db->name))
		db->paused = true;
	if (console_state_has(&inherited, CS_DB_DISABLED, db->name))
		db->disabled = true;
}

void admin_state_inherit(const ConsoleState *cs)
{
	if (!cs || !cs->len || !console_state_decode(&inherited, cs->buf, cs->len))
		return;
	List *i;
	list_for_each(i, &wk.databases) admin_state_inherit_db(container_of(i, PgDatabase, node));
	switch (console_state_pause(&inherited)) {
	case CS_PAUSED:
		wk.pause_mode = P_PAUSE;
		wk.pause_inherited = true;
		log_info("the pooler is paused (PAUSE): this worker starts paused");
		break;
	case CS_SUSPENDED:
		/* listeners added from now on stay off until RESUME */
		wk.pause_mode = P_SUSPEND;
		wk.pause_inherited = true;
		log_info("the pooler is suspended (SUSPEND): this worker starts suspended");
		break;
	default:
		break;
	}
}

void admin_state_inherited_clear(char kind, const char *name)
{
	console_state_remove(&inherited, kind, name);
}

void admin_state_remember(char kind, const char *name)
{
	if (!console_state_has(&inherited, kind, name))
		console_state_add(&inherited, kind, name);
}

void admin_state_report(void)
{
	if (!wk.master_out || (wk.run_state != RUN_ACTIVE && wk.run_state != RUN_DRAINING))
		return;
	ConsoleState now = {0};
	char pause = wk.pause_mode == P_PAUSE ? CS_PAUSED : wk.pause_mode == P_SUSPEND ? CS_SUSPENDED : CS_RUNNING;
	console_state_begin(&now, pause);
	List *i;
	list_for_each(i, &wk.databases)
	{
		PgDatabase *db = container_of(i, PgDatabase, node);
		if (db->admin)
			continue;
		if (db->paused)
			console_state_add(&now, CS_DB_PAUSED, db->name);
		if (db->disabled)
			console_state_add(&now, CS_DB_DISABLED, db->name);
	}
	/* and the flags kept for auto-databases not created here (yet) */
	size_t pos = 0;
	char kind;
	const char *name;
	while (console_state_next(&inherited, &pos, &kind, &name))
		if (!db_find(name))
			console_state_add(&now, kind, name);
	int fd = memfd_create("pgbouncer-console-state", MFD_CLOEXEC);
	bool ok = fd >= 0 && now.len <= CS_MAX_LEN && write(fd, now.buf, now.len) == (ssize_t)now.len;
	ChannelMsg m = {.type = CH_CONSOLE_STATE};
	if (!ok)
		log_warning("the master was not told the console's PAUSE/DISABLE state (could not write it): workers "
		            "started later may not have it");
	else
		(void)worker_tell_master(&m, fd); /* a failure is logged by the channel */
	if (fd >= 0)
		close(fd);
	console_state_free(&now);
}

void admin_state_master_resume(void)
{
	if (!wk.pause_inherited || wk.pause_mode == P_NONE || wk.run_state != RUN_ACTIVE)
		return;
	log_info("the console's PAUSE/SUSPEND ended in another worker, resuming");
	admin_resume_all();
}

void admin_state_left_out(uint64_t mask)
{
	if (!mask || !wk.master_out)
		return;
	ChannelMsg m = {.type = CH_CONSOLE_LEFT_OUT};
	memcpy(&m.arg, &mask, sizeof(mask));
	(void)worker_tell_master(&m, -1); /* a failure is logged by the channel */
}

void admin_state_sync(int fd)
{
	struct stat st;
	ConsoleState next = {0};
	char *buf = NULL;
	bool ok = fstat(fd, &st) == 0 && st.st_size >= 1 && st.st_size <= (off_t)CS_MAX_LEN;
	if (ok) {
		buf = xmalloc((size_t)st.st_size);
		ok = pread(fd, buf, (size_t)st.st_size, 0) == st.st_size &&
		     console_state_decode(&next, buf, (size_t)st.st_size);
	}
	free(buf);
	if (!ok) {
		log_warning("the master handed over a console state that cannot be read: this worker's may differ");
		console_state_free(&next);
		return;
	}
	/* the flags of auto-databases not created here are the pooler's from now on too */
	console_state_free(&inherited);
	inherited = next;
	log_info("a console command left this worker out: taking the pooler's state over (%s)",
	         console_state_pause(&inherited) == CS_PAUSED      ? "paused"
	         : console_state_pause(&inherited) == CS_SUSPENDED ? "suspended"
	                                                           : "running");
	admin_take_state(&inherited);
}

void admin_state_adopted(void)
{
	bool paused = wk.pause_mode != P_NONE;
	ConsoleState now = {0};
	console_state_begin(&now, CS_RUNNING);
	List *i;
	list_for_each(i, &wk.databases)
	{
		PgDatabase *db = container_of(i, PgDatabase, node);
		if (db->admin)
			continue;
		paused |= db->paused;
		if (db->disabled)
			console_state_add(&now, CS_DB_DISABLED, db->name);
	}
	/* auto-databases created from now on are not paused either */
	ConsoleState kept = {0};
	console_state_begin(&kept, CS_RUNNING);
	size_t pos = 0;
	char kind;
	const char *name;
	while (console_state_next(&inherited, &pos, &kind, &name))
		if (kind == CS_DB_DISABLED)
			console_state_add(&kept, kind, name);
	console_state_free(&inherited);
	inherited = kept;
	if (paused) {
		log_warning("adopted while the pooler was paused: resuming, as the new tree is not paused and no "
		            "console reaches this worker any more");
		admin_take_state(&now);
	}
	console_state_free(&now);
}
