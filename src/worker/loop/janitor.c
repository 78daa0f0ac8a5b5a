/*
 * Periodic maintenance, about three times a second: timeouts of clients
 * and servers, health checks, idle and lifetime closes, min_pool_size,
 * retries after failed logins; and the stats_period averages and log line.
 */
#include "autoconfig.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/pktbuf.h"
#include "common/util.h"
#include "worker/admin.h"
#include "worker/auth_query.h"
#include "worker/auth_threads.h"
#include "worker/cancel.h"
#include "worker/janitor.h"
#include "worker/objects.h"
#include "worker/pool.h"
#include "worker/pool_policy.h"
#include "worker/pool_settings.h"
#include "worker/server.h"
#include "worker/worker.h"

static void check_client_timeouts(PgPool *pool)
{
	List *i, *tmp;
	usec_t now = wk.now;
	/* a queued query, or a login waiting for the pool's first server, counts against query_timeout */
	usec_t qt = user_query_timeout(pool->user);
	list_for_each_safe(i, &pool->waiting_clients, tmp)
	{
		PgSocket *c = container_of(i, PgSocket, node);
		if (qt > 0 && now - c->wait_start > qt) {
			disconnect_client(c, true, "query_timeout");
			continue;
		}
		if (c->state == CL_WAITING_LOGIN && wk.cf.g.client_login_timeout > 0 &&
		    now - c->connect_time > wk.cf.g.client_login_timeout) {
			disconnect_client(c, true, "client_login_timeout (server down)");
			continue;
		}
		/* a login waiting for the pool's first server waits for a server too */
		usec_t qwt = client_query_wait_timeout(c->login_user, pool->db);
		if (qwt > 0 && now - c->wait_start > qwt) {
			disconnect_client(c, true, "query_wait_timeout");
			continue;
		}
		if (c->state == CL_WAITING_LOGIN)
			continue;
		if (wk.cf.g.query_wait_notify > 0 && !c->wait_notice_sent &&
		    now - c->wait_start >= (usec_t)wk.cf.g.query_wait_notify * USEC_PER_SEC) {
			PktBuf pb;
			pktbuf_init(&pb, 128);
			pktbuf_write_notice(&pb,
			                    "No server connection available in postgres backend, client being queued");
			(void)sbuf_send(&c->sb, pb.buf, pb.len);
			pktbuf_free(&pb);
			c->wait_notice_sent = true;
		}
	}
	usec_t idle_to = 0;
	list_for_each_safe(i, &pool->active_clients, tmp)
	{
		PgSocket *c = container_of(i, PgSocket, node);
		/*
		 * Connections idle for a second give their buffers back
		 * (doc/benchmarks.md, "Memory per idle client"); busy ones keep
		 * them, not to take them again at once, while few sockets hold
		 * one ("Memory per active client").
		 */
		if (now - c->request_time >= USEC_PER_SEC)
			sbuf_trim(&c->sb);
		if (c->link) {
			if (now - c->link->request_time >= USEC_PER_SEC)
				sbuf_trim(&c->link->sb);
			continue;
		}
		idle_to = user_client_idle_timeout(c->login_user);
		if (idle_to > 0 && now - c->request_time > idle_to)
			disconnect_client(c, true, "client_idle_timeout");
	}
}

static void check_linked_server_timeouts(PgPool *pool)
{
	List *i, *tmp;
	usec_t now = wk.now;
	const PgUser *u = pool->user;
	usec_t qt = user_query_timeout(u);
	usec_t itt = user_idle_transaction_timeout(u);
	usec_t tt = user_transaction_timeout(u);
	list_for_each_safe(i, &pool->active_servers, tmp)
	{
		PgSocket *s = container_of(i, PgSocket, node);
		PgSocket *c = s->link;
		if (s->replication != REPLICATION_NONE) {
			/* a stream is no query or transaction; it is never released, so close_needed acts now */
			if (s->close_needed)
				disconnect_server(s, true, "%s", close_needed_reason(s));
			continue;
		}
		if (!c)
			continue;
		if (policy_fast_close(wk.cf.g.server_fast_close, s->link_mode == POOL_SESSION, s->close_needed,
		                      server_between_transactions(s))) {
			disconnect_server(s, true, "%s", close_needed_reason(s));
			continue;
		}
		if (qt > 0 && c->query_start && now - c->query_start > qt) {
			disconnect_server(s, true, "query timeout");
			continue;
		}
		if (itt > 0 && s->ready && (s->txn_status == 'T' || s->txn_status == 'E') &&
		    now - s->request_time > itt) {
			disconnect_server(s, true, "idle transaction timeout");
			continue;
		}
		if (tt > 0 && c->xact_start && now - c->xact_start > tt)
			disconnect_server(s, true, "transaction timeout");
	}
}

/* A free server (idle or used) at the janitor's tick: closed, checked before its next client, or kept. */
static void check_free_server(PgPool *pool, PgSocket *s, IdleInput *in)
{
	usec_t now = wk.now;
	in->close_needed = s->close_needed;
	in->servers = pool_global_servers(pool); /* all workers' servers, as limits count them */
	in->idle_for = now - s->request_time;
	in->age = now - s->connect_time;
	in->since_lifetime_close = now - pool->last_lifetime_close;
	switch (policy_idle(in)) {
	case IDLE_CLOSE_CONFIG:
		disconnect_server(s, true, "%s", close_needed_reason(s));
		break;
	case IDLE_CLOSE_OVERSIZE:
		disconnect_server(s, true, "too many servers in the pool");
		break;
	case IDLE_CLOSE_TIMEOUT:
		disconnect_server(s, true, "server idle timeout");
		break;
	case IDLE_CLOSE_LIFETIME:
		pool->last_lifetime_close = now;
		disconnect_server(s, true, "server lifetime over");
		break;
	case IDLE_CHECK:
		if (s->state == SV_IDLE)
			change_state(s, SV_USED);
		break;
	case IDLE_KEEP:
		if (in->idle_for >= USEC_PER_SEC) {
			/* idle for a second: no buffers (doc/benchmarks.md, "Memory per idle client") */
			sbuf_trim(&s->sb);
		}
		break;
	}
}

static void check_server_states(PgPool *pool)
{
	List *i, *tmp;
	usec_t now = wk.now;
	/* connect + login bounded by server_connect_timeout */
	list_for_each_safe(i, &pool->new_servers, tmp)
	{
		PgSocket *s = container_of(i, PgSocket, node);
		if (wk.cf.g.server_connect_timeout > 0 && now - s->connect_time > wk.cf.g.server_connect_timeout) {
			pool_login_failed(pool, NULL, "connect timeout", false);
			disconnect_server(s, false, "connect timeout");
		}
	}
	int size = pool_effective_size(pool);
	int min = policy_min_target(size, db_min_pool_size(pool->db));
	const char *check = wk.cf.g.server_check_query;
	IdleInput in = {
	    .size = size,
	    .reserve = pool_reserve_size(pool),
	    .min = min,
	    .idle_timeout = wk.cf.g.server_idle_timeout,
	    .lifetime = pool_server_lifetime(pool),
	    .check_query = check && *check,
	    .check_delay = wk.cf.g.server_check_delay,
	};
	/*
	 * Used servers (idle past server_check_delay) are free servers too:
	 * server_idle_timeout, server_lifetime and the pool's size apply to
	 * them as to idle ones, or with the default delay (30 s) no idle
	 * server would ever reach server_idle_timeout (600 s).
	 */
	List *lists[] = {&pool->used_servers, &pool->idle_servers};
	for (size_t l = 0; l < sizeof(lists) / sizeof(lists[0]); l++)
		list_for_each_safe(i, lists[l], tmp)
		{
			PgSocket *s = container_of(i, PgSocket, node);
			check_free_server(pool, s, &in);
		}
	/* min_pool_size: one connection at a time while the pool has clients or a forced user */
	MinInput mi = {
	    .min = min,
	    .servers = pool_global_servers(pool),
	    .wanted = pool_client_count(pool) > 0 || (pool->db->forced_user && wk.run_state == RUN_ACTIVE),
	    .paused = wk.pause_mode != P_NONE || pool->db->paused,
	    .login_in_flight = !list_empty(&pool->new_servers),
	    .admin = pool->db->admin,
	    .retry_wait = pool_retry_wait(pool),
	};
	if (policy_launch_min(&mi))
		pool_launch_min(pool, min);
	/* clients (or auth_query lookups) may wait for a retry after a failed login, or for room */
	pool_maybe_launch(pool);
}

/* min_pool_size: the pool of a database with a forced user is filled before any client comes */
static void open_forced_user_pools(void)
{
	if (wk.run_state != RUN_ACTIVE)
		return;
	List *i;
	list_for_each(i, &wk.databases)
	{
		PgDatabase *db = container_of(i, PgDatabase, node);
		if (db->forced_user && !db->admin && !db->placeholder && !db->disabled && db_min_pool_size(db) > 0)
			(void)pool_get(db, db->forced_user);
	}
}

/*
 * pool_idle_timeout: free a pool that has had no clients and no servers for
 * that long. The pools of a database that a reload removed go as soon as
 * they are unused: SHOW POOLS and SHOW STATS no longer list them, and the
 * database added again gets pools of its own.
 */
static void check_pool_idle(PgPool *pool)
{
	const PgDatabase *db = pool->db;
	if (db->placeholder && !db->admin && pool_unused(pool)) {
		log_debug("pool %s/%s of a removed database freed", db->name, pool->user->name);
		pool_free(pool);
		return;
	}
	/* the console's pool, and a forced-user pool that min_pool_size keeps filling, stay */
	bool kept = db->admin || (db->forced_user == pool->user && db_min_pool_size(db) > 0);
	if (wk.cf.g.pool_idle_timeout <= 0 || kept || !pool_unused(pool)) {
		pool->unused_since = 0;
		return;
	}
	if (!pool->unused_since) {
		pool->unused_since = wk.now;
	} else if (wk.now - pool->unused_since > wk.cf.g.pool_idle_timeout) {
		log_debug("pool %s/%s unused for pool_idle_timeout, freed", db->name, pool->user->name);
		pool_free(pool);
	}
}

static void check_login_clients(void)
{
	List *i, *tmp;
	list_for_each_safe(i, &wk.login_clients, tmp)
	{
		PgSocket *c = container_of(i, PgSocket, node);
		/* a check with a deadline of its own (LDAP) ends the login itself, with its own error */
		bool own_deadline = auth_job_running(c) && c->auth_job->own_deadline;
		if (!own_deadline && wk.cf.g.client_login_timeout > 0 &&
		    wk.now - c->connect_time > wk.cf.g.client_login_timeout)
			disconnect_client(c, true, "client_login_timeout");
		else if (auth_job_running(c) && client_hung_up(c))
			/* not read while its password is checked: its hang-up is seen here */
			disconnect_client(c, false, "client disconnected during %s authentication",
			                  c->auth_job->pool->name);
	}
}

static void check_autodb(void)
{
	List *i, *tmp;
	list_for_each_safe(i, &wk.databases, tmp)
	{
		PgDatabase *db = container_of(i, PgDatabase, node);
		if (!db->auto_db)
			continue;
		if (db->client_count > 0 || db->server_count > 0) {
			db->inactive_since = 0;
			continue;
		}
		if (!db->inactive_since)
			db->inactive_since = wk.now;
		else if (wk.cf.g.autodb_idle_timeout > 0 && wk.now - db->inactive_since > wk.cf.g.autodb_idle_timeout) {
			/* free its pools (their stats go with them) */
			List *p, *t2;
			list_for_each_safe(p, &wk.pools, t2)
			{
				PgPool *pool = container_of(p, PgPool, node);
				if (pool->db != db)
					continue;
				pool_free(pool);
			}
			list_del(&db->node);
			list_append(&wk.autodb_idle, &db->node);
		}
	}
}

void janitor_run(void)
{
	wk.now = get_time_usec();
	if (wk.pause_mode != P_SUSPEND) {
		check_login_clients();
		open_forced_user_pools();
		List *i, *tmp;
		list_for_each_safe(i, &wk.pools, tmp)
		{
			PgPool *pool = container_of(i, PgPool, node);
			pool_check_counts(pool);
			if (!list_empty(&pool->waiting_clients))
				pool_drop_gone_waiters(pool);
			check_client_timeouts(pool);
			check_linked_server_timeouts(pool);
			check_server_states(pool);
			check_pool_idle(pool);
		}
		check_autodb();
		cancel_check_timeouts();
	}
	admin_pause_done_check();
	admin_wait_close_check();
}

/* What every worker's counters were at this worker's previous stats_period tick. */
static struct {
	int32_t pid; /* 0 = no worker there then */
	PgStats v;
} stats_seen[SHM_MAX_WORKERS];

static bool slot_serving(const WorkerSlot *s)
{
	uint32_t st = atomic_load(&s->state);
	return atomic_load(&s->pid) > 0 && (st == SLOT_ACTIVE || st == SLOT_DRAINING);
}

/*
 * The counters of the whole pooler since the previous tick, and whether this
 * worker writes the stats line: the lowest active or draining worker does,
 * so that there is one line per stats_period for the pooler. Every worker
 * keeps track, so that another can take over at once.
 */
static bool pooler_delta(PgStats *delta)
{
	memset(delta, 0, sizeof(*delta));
	if (!wk.slot) {
		PgStats cur;
		worker_stats_total(&cur);
		const uint64_t *c = (const uint64_t *)&cur, *p = (const uint64_t *)&stats_seen[0].v;
		uint64_t *d = (uint64_t *)delta;
		for (size_t f = 0; f < PGSTATS_FIELDS; f++)
			d[f] = c[f] - p[f];
		stats_seen[0].v = cur;
		return true;
	}
	int logger = -1;
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		const WorkerSlot *s = &wk.shm->slots[i];
		int32_t pid = atomic_load(&s->pid);
		if (logger < 0 && slot_serving(s))
			logger = i;
		if (pid <= 0) {
			stats_seen[i].pid = 0;
			continue;
		}
		PgStats cur;
		uint64_t *c = (uint64_t *)&cur;
		if (i == wk.id)
			worker_stats_total(&cur); /* this worker's, fresher than its last publish */
		else
			for (size_t f = 0; f < PGSTATS_FIELDS; f++)
				c[f] = atomic_load(&s->stats[f]);
		/* a worker new since the previous tick (or a respawn in the slot) counts from zero */
		bool same = stats_seen[i].pid == pid;
		const uint64_t *p = (const uint64_t *)&stats_seen[i].v;
		for (size_t f = 0; f < PGSTATS_FIELDS && same; f++)
			same = c[f] >= p[f];
		uint64_t *d = (uint64_t *)delta;
		for (size_t f = 0; f < PGSTATS_FIELDS; f++)
			d[f] += same ? c[f] - p[f] : c[f];
		stats_seen[i].pid = pid;
		stats_seen[i].v = cur;
	}
	return logger < 0 || logger == wk.id;
}

/* stats_period: rotate snapshots and log the averages line (one for the whole pooler). */
void stats_period_tick(void)
{
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		p->older_stats = p->newer_stats;
		p->newer_stats = p->stats;
	}
	wk.stats_older_at = wk.stats_newer_at;
	wk.stats_newer_at = wk.now;
	PgStats d;
	if (!pooler_delta(&d) || !wk.cf.g.log_stats)
		return;
	double secs = wk.cf.g.stats_period; /* at least 1: the parameter table's range */
	uint64_t dx = d.xact_count, dq = d.query_count, da = d.server_assignment_count;
	log_info("stats: %llu xacts/s, %llu queries/s, %llu client parses/s, %llu server parses/s, %llu binds/s, "
	         "%llu client logins/s, in %llu B/s, out %llu B/s, xact %llu us, query %llu us, wait %llu us",
	         (unsigned long long)(dx / secs), (unsigned long long)(dq / secs),
	         (unsigned long long)(d.client_parse_count / secs), (unsigned long long)(d.server_parse_count / secs),
	         (unsigned long long)(d.bind_count / secs), (unsigned long long)(d.client_login_count / secs),
	         (unsigned long long)(d.client_bytes / secs), (unsigned long long)(d.server_bytes / secs),
	         (unsigned long long)(dx ? d.xact_time / dx : 0), (unsigned long long)(dq ? d.query_time / dq : 0),
	         (unsigned long long)(da ? d.wait_time / da : 0));
}
