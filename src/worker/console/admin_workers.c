/*
 * SHOW WORKERS and SHOW SCALER: the console's view of the process tree,
 * read from the shared-memory segment, so that every worker answers the
 * same whichever one the console connection landed on.
 */
#include "autoconfig.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/pktbuf.h"
#include "common/util.h"
#include "worker/admin_workers.h"
#include "worker/worker.h"

static void format_ts(uint64_t us, char *buf, size_t len)
{
	time_t s = (time_t)(us / USEC_PER_SEC);
	struct tm tm;
	localtime_r(&s, &tm);
	strftime(buf, len, "%Y-%m-%d %H:%M:%S %Z", &tm);
}

static bool send_and_free(PgSocket *c, PktBuf *pb)
{
	pktbuf_write_command_complete(pb, "SHOW");
	pktbuf_write_ready(pb, 'I');
	bool ok = sbuf_send(&c->sb, pb->buf, pb->len);
	pktbuf_free(pb);
	return ok;
}

/* A listener slot mask as "0,3": the slots in increasing order, "" for none. */
static void format_slots(uint64_t mask, char *buf, size_t len)
{
	size_t off = 0;
	buf[0] = '\0';
	for (int k = 0; k < SHM_MAX_WORKERS && off < len; k++)
		if (mask >> k & 1)
			off += (size_t)snprintf(buf + off, len - off, "%s%d", off ? "," : "", k);
}

bool admin_show_workers(PgSocket *c)
{
	static const char *const names[] = {"worker", "pid", "state", "busy", "busy_avg", "cl_active", "cl_waiting",
	                                    "sv_active", "sv_idle", "accepted", "tls_handshakes", "xact_count",
	                                    "query_count", "started", "uptime", "wait", "wait_avg",
	                                    /* rebalancing (doc/workers.md): added at the end */
	                                    "moved_in", "moved_out", "not_movable", "move_failed",
	                                    /* the listener slots it accepts on (doc/workers.md, "Listener slots") */
	                                    "listeners"};
	enum { NCOL = sizeof(names) / sizeof(names[0]) };
	PktBuf pb;
	pktbuf_init(&pb, 1024);
	pktbuf_write_row_description(&pb, "iiTNNiiiiqqqqTqNNqqiqT", names);
	ShmSegment *shm = wk.shm;
	uint64_t now = (uint64_t)get_time_usec();
	for (int i = 0; shm && i < SHM_MAX_WORKERS; i++) {
		WorkerSlot *s = &shm->slots[i];
		/*
		 * The pid before the state: the master frees a slot state first,
		 * pid second, so a slot being freed is skipped here, never shown
		 * as an active worker with pid 0.
		 */
		int32_t pid = atomic_load(&s->pid);
		uint32_t st = atomic_load(&s->state);
		if (st == SLOT_FREE)
			continue;
		char v[NCOL][64];
		uint64_t started = atomic_load(&s->start_time_us);
		snprintf(v[0], 64, "%d", i);
		snprintf(v[1], 64, "%d", (int)pid);
		snprintf(v[2], 64, "%s", st == SLOT_FREE ? "free" : worker_slot_state_name(s));
		snprintf(v[3], 64, "%.3f", atomic_load(&shm->scaler.busy_milli[i]) / 1000.0);
		snprintf(v[4], 64, "%.3f", atomic_load(&shm->scaler.busy_avg_milli[i]) / 1000.0);
		snprintf(v[5], 64, "%u", atomic_load(&s->cl_active));
		snprintf(v[6], 64, "%u", atomic_load(&s->cl_waiting));
		snprintf(v[7], 64, "%u", atomic_load(&s->sv_active));
		snprintf(v[8], 64, "%u", atomic_load(&s->sv_idle));
		snprintf(v[9], 64, "%llu", (unsigned long long)atomic_load(&s->accepted));
		snprintf(v[10], 64, "%llu", (unsigned long long)atomic_load(&s->tls_handshakes));
		snprintf(v[11], 64, "%llu", (unsigned long long)atomic_load(&s->xact_count));
		snprintf(v[12], 64, "%llu", (unsigned long long)atomic_load(&s->query_count));
		format_ts(started, v[13], 64);
		snprintf(v[14], 64, "%llu", (unsigned long long)(now > started ? (now - started) / USEC_PER_SEC : 0));
		/* after the PgBouncer-compatible columns: the run-queue wait (doc/workers.md, "The saturation signal") */
		snprintf(v[15], 64, "%.3f", atomic_load(&shm->scaler.wait_milli[i]) / 1000.0);
		snprintf(v[16], 64, "%.3f", atomic_load(&shm->scaler.wait_avg_milli[i]) / 1000.0);
		/* then rebalancing (doc/workers.md, "Rebalancing long-lived clients") */
		snprintf(v[17], 64, "%llu", (unsigned long long)atomic_load(&s->moved_in));
		snprintf(v[18], 64, "%llu", (unsigned long long)atomic_load(&s->moved_out));
		snprintf(v[19], 64, "%u", atomic_load(&s->cl_unmovable));
		snprintf(v[20], 64, "%llu", (unsigned long long)atomic_load(&s->move_failed));
		format_slots(atomic_load(&s->listener_mask), v[21], 64);
		const char *row[NCOL];
		for (int k = 0; k < NCOL; k++)
			row[k] = v[k];
		pktbuf_write_data_row(&pb, NCOL, row);
	}
	return send_and_free(c, &pb);
}

bool admin_show_scaler(PgSocket *c)
{
	static const char *const names[] = {"current", "target", "min_workers", "max_workers", "last_decision",
	                                    "last_reason", "last_change", "tcp_migrate_req",
	                                    /* the CPU allowance (doc/workers.md): added at the end */
	                                    "cpus", "cpus_from", "idle_cpus", "throttled"};
	enum { NCOL = sizeof(names) / sizeof(names[0]) };
	PktBuf pb;
	pktbuf_init(&pb, 512);
	pktbuf_write_row_description(&pb, "iiiiTTTiNTNN", names);
	ScalerView *sc = wk.shm ? &wk.shm->scaler : NULL;
	if (sc) {
		char v[NCOL][160];
		snprintf(v[0], 160, "%u", atomic_load(&sc->current));
		snprintf(v[1], 160, "%u", atomic_load(&sc->target));
		snprintf(v[2], 160, "%u", atomic_load(&sc->min_workers));
		snprintf(v[3], 160, "%u", atomic_load(&sc->max_workers));
		snprintf(v[4], 160, "%s", scaler_decision_name((ScaleDecision)atomic_load(&sc->last_decision)));
		/* the master bumps reason_seq around each write: retry a torn read */
		for (int tries = 0; tries < 100; tries++) {
			uint32_t seq = atomic_load(&sc->reason_seq);
			if (seq & 1)
				continue;
			snprintf(v[5], 160, "%s", sc->last_reason);
			if (atomic_load(&sc->reason_seq) == seq)
				break;
		}
		uint64_t last = atomic_load(&sc->last_change_us);
		if (last)
			format_ts(last, v[6], 160);
		snprintf(v[7], 160, "%u", atomic_load(&sc->tcp_migrate_req));
		snprintf(v[8], 160, "%.10g", atomic_load(&sc->cpus_milli) / 1000.0);
		snprintf(v[9], 160, "%s", cpus_from_name((CpusFrom)atomic_load(&sc->cpus_from)));
		/* what the scaler saw of the CPU at its last sample (doc/workers.md, "Adding a worker only into idle CPU") */
		uint32_t idle = atomic_load(&sc->idle_milli);
		snprintf(v[10], 160, "%.3f", idle / 1000.0);
		snprintf(v[11], 160, "%.3f", atomic_load(&sc->throttled_milli) / 1000.0);
		const char *row[NCOL] = {v[0],
		                         v[1],
		                         v[2],
		                         v[3],
		                         v[4],
		                         v[5],
		                         last ? v[6] : NULL,
		                         v[7],
		                         v[8],
		                         v[9],
		                         idle == UINT32_MAX ? NULL : v[10],
		                         v[11]};
		pktbuf_write_data_row(&pb, NCOL, row);
	}
	return send_and_free(c, &pb);
}
