/*
 * The admin console: the "pgbouncer" pseudo-database. Parses one command
 * per Query, checks privileges, and answers SHOW commands with the exact
 * columns of doc/pgbouncer.1.md ("ADMIN CONSOLE"); process-control commands act on the worker.
 */
#include "autoconfig.h"

#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "common/log.h"
#include "common/pktbuf.h"
#include "common/util.h"
#include "shm.h"
#include "worker/dns.h"
#include "worker/admin.h"
#include "worker/admin_fanout.h"
#include "worker/admin_parse.h"
#include "worker/admin_state.h"
#include "worker/admin_workers.h"
#include "worker/cancel.h"
#include "worker/prepare.h"
#include "worker/objects.h"
#include "worker/pool.h"
#include "worker/pool_settings.h"
#include "worker/worker.h"

/*
 * ---- reply helpers ----
 *
 * Every function that answers a console returns false only when it had to
 * close the connection (the caller must not touch the client afterwards).
 */

/* A failed send closes the console: nothing else would notice. */
static bool sent(PgSocket *c, bool ok)
{
	if (!ok)
		disconnect_client(c, false, "client send failed");
	return ok;
}

static bool send_pktbuf(PgSocket *c, PktBuf *pb)
{
	/* a fanned-out command: this worker's answer is merged with the others' first */
	if (admin_fanout_capture(c, pb->buf, pb->len)) {
		pktbuf_free(pb);
		return true;
	}
	bool ok = sbuf_send(&c->sb, pb->buf, pb->len);
	pktbuf_free(pb);
	return sent(c, ok);
}

typedef struct Reply {
	PgSocket *c;
	PktBuf pb;
	int ncols;
	int rows;
} Reply;

static void reply_begin(Reply *r, PgSocket *c, const char *types, const char *const *names)
{
	r->c = c;
	r->ncols = (int)strlen(types);
	r->rows = 0;
	pktbuf_init(&r->pb, 1024);
	pktbuf_write_row_description(&r->pb, types, names);
}

static void reply_row(Reply *r, const char *const *values)
{
	pktbuf_write_data_row(&r->pb, r->ncols, values);
	r->rows++;
}

static bool reply_end(Reply *r, const char *tag)
{
	pktbuf_write_command_complete(&r->pb, tag);
	pktbuf_write_ready(&r->pb, 'I');
	return send_pktbuf(r->c, &r->pb);
}

static bool send_simple(PgSocket *c, const char *tag)
{
	PktBuf pb;
	pktbuf_init(&pb, 64);
	pktbuf_write_command_complete(&pb, tag);
	pktbuf_write_ready(&pb, 'I');
	return send_pktbuf(c, &pb);
}

/* ERROR (S, C, M only) + ReadyForQuery; logged like every pooler error. */
static bool in_fanout(const PgSocket *c);

void admin_log_error(PgSocket *c, const char *msg)
{
	log_error("%s", msg);
	if (wk.cf.g.log_pooler_errors)
		slog(LG_WARNING, c, "pooler error: %s", msg);
}

static bool admin_error(PgSocket *c, const char *sqlstate, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool admin_error(PgSocket *c, const char *sqlstate, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* in a fan-out, "nothing here" is one worker's part: logged once if no worker had anything (admin_fanout.c) */
	if (!(in_fanout(c) && admin_error_is_absence(msg)))
		admin_log_error(c, msg);
	PktBuf pb;
	pktbuf_init(&pb, 64 + strlen(msg));
	pktbuf_write_error(&pb, "ERROR", sqlstate ? sqlstate : "08P01", msg);
	pktbuf_write_ready(&pb, 'I');
	return send_pktbuf(c, &pb);
}

/* Formatters with rotating static buffers, enough for one row. */
static char fmtbuf[48][64];
static int fmtidx;
static const char *fmt_int(long long v)
{
	char *b = fmtbuf[fmtidx++ % 48];
	snprintf(b, 64, "%lld", v);
	return b;
}

static const char *fmt_rate(double v)
{
	char *b = fmtbuf[fmtidx++ % 48];
	snprintf(b, 64, "%.3f", v);
	return b;
}

static const char *fmt_ts(usec_t t)
{
	char *b = fmtbuf[fmtidx++ % 48];
	time_t s = (time_t)((t ? t : get_time_usec()) / USEC_PER_SEC);
	struct tm tm;
	localtime_r(&s, &tm);
	strftime(b, 64, "%Y-%m-%d %H:%M:%S %Z", &tm);
	return b;
}

static const char *fmt_ptr(const void *p)
{
	char *b = fmtbuf[fmtidx++ % 48];
	if (!p)
		return "";
	snprintf(b, 64, "%p", p);
	return b;
}

/* ---- SHOW commands ---- */

static bool show_version(PgSocket *c, int variant)
{
	Reply r;
	static const char *const names[] = {"version"};
	reply_begin(&r, c, "T", names);
	const char *v[] = {"PgBouncer " PACKAGE_VERSION};
	reply_row(&r, v);
	return reply_end(&r, "SHOW");
}

static bool show_config(PgSocket *c, int variant)
{
	Reply r;
	static const char *const names[] = {"key", "value", "default", "changeable"};
	reply_begin(&r, c, "TTTT", names);
	for (const CfParam *p = cf_params; p->name; p++) {
		if (p->hidden)
			continue;
		char val[64], def[1024];
		/* a string in full (a long auth_query or server_reset_query), as PgBouncer shows it */
		const char *value = config_value_text(&wk.cf, p, val, sizeof(val));
		bool has_def = config_format_default(p, def, sizeof(def));
		const char *v[] = {p->name, value, has_def ? def : NULL, p->reloadable ? "yes" : "no"};
		reply_row(&r, v);
	}
	return reply_end(&r, "SHOW");
}

static const char *lb_name(const PgDatabase *db)
{
	if (!db->cf.host || !strchr(db->cf.host, ','))
		return NULL;
	return db->cf.load_balance_hosts == LB_DISABLE ? "disable" : "round-robin";
}

static bool show_databases(PgSocket *c, int variant)
{
	Reply r;
	static const char *const names[] = {"name",
	                                    "host",
	                                    "port",
	                                    "database",
	                                    "force_user",
	                                    "pool_size",
	                                    "min_pool_size",
	                                    "reserve_pool_size",
	                                    "server_lifetime",
	                                    "pool_mode",
	                                    "load_balance_hosts",
	                                    "max_connections",
	                                    "current_connections",
	                                    "max_client_connections",
	                                    "current_client_connections",
	                                    "paused",
	                                    "disabled"};
	reply_begin(&r, c, "TTiTTiiiiTTiiiiii", names);
	List *i;
	list_for_each(i, &wk.databases)
	{
		PgDatabase *db = container_of(i, PgDatabase, node);
		int pool_size = db_pool_size(db);
		int minp = db_min_pool_size(db);
		int resv = db_reserve_pool_size(db);
		int life = (int)(db_server_lifetime(db) / USEC_PER_SEC);
		int maxc = db_max_connections(db);
		int maxcc = db_max_client_connections(db);
		const char *v[] = {
		    db->name,
		    db->admin ? NULL : db->cf.host,
		    fmt_int(db->admin ? wk.cf.g.listen_port : db_server_port(db)),
		    db->admin ? "pgbouncer" : (db->cf.dbname ? db->cf.dbname : db->name),
		    db->admin ? "pgbouncer" : db->cf.user,
		    fmt_int(pool_size),
		    fmt_int(minp),
		    fmt_int(resv),
		    fmt_int(life),
		    db->admin
		        ? "statement"
		        : (db->cf.pool_mode != CF_UNSET ? config_enum_name(cf_pool_modes, db->cf.pool_mode) : NULL),
		    lb_name(db),
		    fmt_int(maxc),
		    fmt_int(db->server_count),
		    fmt_int(maxcc),
		    fmt_int(db->client_count),
		    fmt_int(db->paused),
		    fmt_int(db->disabled)};
		reply_row(&r, v);
	}
	return reply_end(&r, "SHOW");
}

/* Clients in list l, without the peer connections of other workers' consoles. */
static int visible_clients(List *l)
{
	int n = 0;
	List *j;
	list_for_each(j, l)
	{
		if (!container_of(j, PgSocket, node)->is_internal)
			n++;
	}
	return n;
}

static bool show_pools(PgSocket *c, int variant)
{
	Reply r;
	static const char *const names[] = {"database",
	                                    "user",
	                                    "cl_active",
	                                    "cl_waiting",
	                                    "cl_active_cancel_req",
	                                    "cl_waiting_cancel_req",
	                                    "sv_active",
	                                    "sv_active_cancel",
	                                    "sv_being_canceled",
	                                    "sv_idle",
	                                    "sv_used",
	                                    "sv_tested",
	                                    "sv_login",
	                                    "maxwait",
	                                    "maxwait_us",
	                                    "pool_mode",
	                                    "load_balance_hosts"};
	reply_begin(&r, c, "TTiiiiiiiiiiiiiTT", names);
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		int cl_waiting = 0;
		usec_t maxwait = 0;
		List *j;
		list_for_each(j, &p->waiting_clients)
		{
			PgSocket *cl = container_of(j, PgSocket, node);
			if (cl->is_internal)
				continue;
			cl_waiting++;
			usec_t since = cl->wait_start ? cl->wait_start : cl->connect_time;
			if (wk.now - since > maxwait)
				maxwait = wk.now - since;
		}
		const char *v[] = {p->db->name,
		                   p->user->name,
		                   fmt_int(visible_clients(&p->active_clients)),
		                   fmt_int(cl_waiting),
		                   fmt_int(visible_clients(&p->active_cancel_req)),
		                   fmt_int(visible_clients(&p->waiting_cancel_req)),
		                   fmt_int(list_count(&p->active_servers)),
		                   fmt_int(list_count(&p->active_cancel_servers)),
		                   fmt_int(list_count(&p->being_canceled_servers)),
		                   fmt_int(list_count(&p->idle_servers)),
		                   fmt_int(list_count(&p->used_servers)),
		                   fmt_int(list_count(&p->tested_servers)),
		                   fmt_int(list_count(&p->new_servers)),
		                   fmt_int(maxwait / USEC_PER_SEC),
		                   fmt_int(maxwait % USEC_PER_SEC),
		                   config_enum_name(cf_pool_modes, pool_effective_mode(p)),
		                   lb_name(p->db)};
		reply_row(&r, v);
	}
	return reply_end(&r, "SHOW");
}

static const char *const socket_cols[] = {
    "type",         "user",       "database",   "replication",      "state",
    "addr",         "port",       "local_addr", "local_port",       "connect_time",
    "request_time", "wait",       "wait_us",    "close_needed",     "ptr",
    "link",         "remote_pid", "tls",        "application_name", "prepared_statements",
    "id",           "recv_pos",   "pkt_pos",    "pkt_remain",       "send_pos",
    "send_remain",  "pkt_avail",  "send_avail"};

static void socket_row(Reply *r, PgSocket *s, bool sockets)
{
	if (s->is_internal)
		return; /* another worker's console: not a client of the pooler */
	char addr[80], laddr[80];
	int port, lport;
	socket_remote_text(s, addr, sizeof(addr), &port);
	struct sockaddr_storage local;
	socket_local_addr(s, &local);
	format_addr(&local, laddr, sizeof(laddr), &lport);
	usec_t wait = 0;
	if (!s->is_server && (s->state == CL_WAITING || s->state == CL_WAITING_LOGIN) && s->wait_start)
		wait = wk.now - s->wait_start;
	else if (!s->is_server && s->query_start)
		wait = wk.now - s->query_start; /* its query runs on a server: how long so far */
	const char *state = state_name(s->state, sockets);
	if (!sockets && !s->is_server && s->state == CL_ACTIVE && !s->link)
		state = "idle";
	int app = var_index("application_name");
	const char *appname = "";
	if (!s->is_server && sock_var(s, app))
		appname = sock_var(s, app);
	else if (s->is_server && s->link && sock_var(s->link, app))
		appname = sock_var(s->link, app);
	int remote_pid = 0;
	if (s->is_server)
		remote_pid = (int)s->backend_pid;
	else if (s->is_unix)
		remote_pid = s->peer_pid;
	const char *db = s->pool ? s->pool->db->name : (s->db ? s->db->name : "(nodb)");
	const char *user = s->login_user ? s->login_user->name : (s->pool ? s->pool->user->name : "(nouser)");
	char tls[TLS_DESCRIBE_LEN] = "";
	if (socket_is_tls(s) && !s->sb.tls_handshake)
		tls_describe(s->sb.ssl, tls, sizeof(tls));
	const char *v[28] = {s->is_server ? "S" : "C",
	                     user,
	                     db,
	                     proto_replication_show_name(s->replication),
	                     state,
	                     addr,
	                     fmt_int(port),
	                     laddr,
	                     fmt_int(lport),
	                     fmt_ts(s->connect_time),
	                     fmt_ts(s->request_time),
	                     fmt_int(wait / USEC_PER_SEC),
	                     fmt_int(wait % USEC_PER_SEC),
	                     fmt_int(s->close_needed),
	                     fmt_ptr(s),
	                     fmt_ptr(s->link),
	                     fmt_int(remote_pid),
	                     tls,
	                     appname,
	                     fmt_int(s->is_server ? prepare_server_count(&s->sstmts) : prepare_client_count(&s->stmts)),
	                     fmt_int((long long)s->id)};
	if (sockets) {
		v[21] = fmt_int(s->sb.end);
		v[22] = fmt_int(s->sb.pos);
		v[23] = fmt_int(s->sb.pkt_remain);
		v[24] = fmt_int(s->sb.send_pos);
		v[25] = fmt_int(s->sb.send_end - s->sb.send_pos);
		v[26] = fmt_int(s->sb.end - s->sb.pos);
		/* an idle socket holds no buffer: a read would take one of the base size */
		v[27] = fmt_int(s->sb.buf ? s->sb.size - s->sb.end : s->sb.base_size);
	}
	reply_row(r, v);
}

/* What show_sockets() lists: SHOW CLIENTS, SERVERS, SOCKETS, ACTIVE_SOCKETS. */
enum {
	SOCK_CLIENTS = 1,     /* the clients (with SOCK_BUFFERS, those logging in too) */
	SOCK_SERVERS = 2,     /* the servers */
	SOCK_BUFFERS = 4,     /* SOCKETS' columns and states: buffer internals, no "idle" */
	SOCK_ONLY_ACTIVE = 8, /* only sockets with buffered data */
};

static bool show_sockets(PgSocket *c, int what)
{
	bool clients = what & SOCK_CLIENTS, servers = what & SOCK_SERVERS;
	bool sockets = what & SOCK_BUFFERS, only_active = what & SOCK_ONLY_ACTIVE;
	Reply r;
	reply_begin(&r, c, sockets ? "TTTTTTiTiTTiiiTTiTTiiiiiiiii" : "TTTTTTiTiTTiiiTTiTTii", socket_cols);
	if (sockets && clients) {
		List *j;
		list_for_each(j, &wk.login_clients)
		{
			PgSocket *s = container_of(j, PgSocket, node);
			if (!only_active || sbuf_unprocessed(&s->sb) > 0)
				socket_row(&r, s, sockets);
		}
	}
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		if (clients) {
			List *cl[] = {&p->active_clients, &p->waiting_clients, &p->active_cancel_req,
			              &p->waiting_cancel_req};
			for (int l = 0; l < 4; l++) {
				List *j;
				list_for_each(j, cl[l])
				{
					PgSocket *s = container_of(j, PgSocket, node);
					if (!only_active || sbuf_unprocessed(&s->sb) > 0)
						socket_row(&r, s, sockets);
				}
			}
		}
		if (servers) {
			List *sl[] = {&p->active_servers,        &p->idle_servers, &p->used_servers,
			              &p->tested_servers,        &p->new_servers,  &p->active_cancel_servers,
			              &p->being_canceled_servers};
			for (int l = 0; l < 7; l++) {
				List *j;
				list_for_each(j, sl[l])
				{
					PgSocket *s = container_of(j, PgSocket, node);
					if (!only_active || sbuf_unprocessed(&s->sb) > 0)
						socket_row(&r, s, sockets);
				}
			}
		}
	}
	return reply_end(&r, "SHOW");
}

static bool show_users(PgSocket *c, int variant)
{
	Reply r;
	static const char *const names[] = {"name",
	                                    "pool_size",
	                                    "reserve_pool_size",
	                                    "pool_mode",
	                                    "max_user_connections",
	                                    "current_connections",
	                                    "max_user_client_connections",
	                                    "current_client_connections"};
	reply_begin(&r, c, "TTTTiiii", names);
	List *i;
	list_for_each(i, &wk.users)
	{
		PgUser *u = container_of(i, PgUser, node);
		/* one row per name: the users auth_query found per database sit next to each other (sorted) */
		if (i->prev != &wk.users && strcmp(container_of(i->prev, PgUser, node)->name, u->name) == 0)
			continue;
		int servers = 0, clients = 0;
		for (List *j = i; j != &wk.users && strcmp(container_of(j, PgUser, node)->name, u->name) == 0;
		     j = j->next) {
			servers += container_of(j, PgUser, node)->server_count;
			clients += container_of(j, PgUser, node)->client_count;
		}
		char ps[16] = "", rs[16] = "";
		if (u->cf && u->cf->pool_size != CF_UNSET)
			snprintf(ps, sizeof(ps), "%9d", u->cf->pool_size);
		if (u->cf && u->cf->reserve_pool_size != CF_UNSET)
			snprintf(rs, sizeof(rs), "%9d", u->cf->reserve_pool_size);
		int maxc = user_max_connections(u);
		int maxcc = user_max_client_connections(u);
		const char *v[] = {
		    u->name,
		    ps,
		    rs,
		    u->cf && u->cf->pool_mode != CF_UNSET ? config_enum_name(cf_pool_modes, u->cf->pool_mode) : NULL,
		    fmt_int(maxc),
		    fmt_int(servers),
		    fmt_int(maxcc),
		    fmt_int(clients)};
		reply_row(&r, v);
	}
	return reply_end(&r, "SHOW");
}

/* Sum the stats of every pool of each database, in database order. */
static int collect_stats(DbStats **out)
{
	int n = 0, cap = 8;
	DbStats *arr = xcalloc((size_t)cap, sizeof(*arr));
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		if (n == 0 || strcmp(arr[n - 1].name, p->db->name) != 0) {
			if (n == cap) {
				cap *= 2;
				arr = xrealloc(arr, sizeof(*arr) * (size_t)cap);
			}
			memset(&arr[n], 0, sizeof(arr[n]));
			arr[n++].name = p->db->name;
		}
		DbStats *d = &arr[n - 1];
		pgstats_add(&d->total, &p->stats);
		pgstats_add(&d->older, &p->older_stats);
	}
	/* the rates since the snapshot of the start of the previous period (doc/pgbouncer.1.md, SHOW STATS) */
	double secs = (double)(wk.now - wk.stats_older_at) / USEC_PER_SEC;
	for (int k = 0; k < n; k++) {
		const uint64_t *t = (const uint64_t *)&arr[k].total, *o = (const uint64_t *)&arr[k].older;
		for (size_t f = 0; f < PGSTATS_FIELDS; f++)
			arr[k].rate[f] = secs > 0 ? (double)(t[f] - o[f]) / secs : 0;
	}
	*out = arr;
	return n;
}

/* Counters per SHOW STATS half (totals, then averages), in PgStats order. */
#define STATS_COLUMNS 12
_Static_assert(STATS_COLUMNS == PGSTATS_FIELDS, "every PgStats counter has a SHOW STATS column");

/*
 * Averages since the start of the previous stats_period (since start
 * within the first): rates per second, and the *_time columns per
 * transaction, query and server assignment of that window.
 */
static void averages(const DbStats *d, long long avg[STATS_COLUMNS])
{
	const PgStats *a = &d->older, *b = &d->total;
	uint64_t dx = b->xact_count - a->xact_count, dq = b->query_count - a->query_count;
	uint64_t da = b->server_assignment_count - a->server_assignment_count;
	const double *r = d->rate;
#define RATE(field) ((long long)r[offsetof(PgStats, field) / sizeof(uint64_t)])
	avg[0] = RATE(server_assignment_count);
	avg[1] = RATE(xact_count);
	avg[2] = RATE(query_count);
	avg[3] = RATE(client_bytes);
	avg[4] = RATE(server_bytes);
	avg[5] = dx ? (long long)((b->xact_time - a->xact_time) / dx) : 0;
	avg[6] = dq ? (long long)((b->query_time - a->query_time) / dq) : 0;
	avg[7] = da ? (long long)((b->wait_time - a->wait_time) / da) : 0;
	avg[8] = RATE(client_parse_count);
	avg[9] = RATE(server_parse_count);
	avg[10] = RATE(bind_count);
	avg[11] = RATE(client_login_count);
#undef RATE
}

/*
 * The totals of row d: the tree's for its database (they keep the counts of
 * workers that exited; every worker answering added its own first), else
 * what the workers answered.
 */
static const PgStats *row_totals(const DbStats *d, bool tree, PgStats *buf)
{
	return tree && db_stats_totals(d->name, buf) ? buf : &d->total;
}

static void totals(const PgStats *t, long long tot[STATS_COLUMNS])
{
	tot[0] = (long long)t->server_assignment_count;
	tot[1] = (long long)t->xact_count;
	tot[2] = (long long)t->query_count;
	tot[3] = (long long)t->client_bytes;
	tot[4] = (long long)t->server_bytes;
	tot[5] = (long long)t->xact_time;
	tot[6] = (long long)t->query_time;
	tot[7] = (long long)t->wait_time;
	tot[8] = (long long)t->client_parse_count;
	tot[9] = (long long)t->server_parse_count;
	tot[10] = (long long)t->bind_count;
	tot[11] = (long long)t->client_login_count;
}

static void write_totals(PktBuf *pb, const DbStats *arr, int n, bool tree);

void admin_write_stats(PktBuf *pb, int which, const DbStats *arr, int n, bool tree)
{
	if (which == 3) {
		write_totals(pb, arr, n, tree);
		return;
	}
	static const char *const full[] = {"database",
	                                   "total_server_assignment_count",
	                                   "total_xact_count",
	                                   "total_query_count",
	                                   "total_received",
	                                   "total_sent",
	                                   "total_xact_time",
	                                   "total_query_time",
	                                   "total_wait_time",
	                                   "total_client_parse_count",
	                                   "total_server_parse_count",
	                                   "total_bind_count",
	                                   "total_client_login_count",
	                                   "avg_server_assignment_count",
	                                   "avg_xact_count",
	                                   "avg_query_count",
	                                   "avg_recv",
	                                   "avg_sent",
	                                   "avg_xact_time",
	                                   "avg_query_time",
	                                   "avg_wait_time",
	                                   "avg_client_parse_count",
	                                   "avg_server_parse_count",
	                                   "avg_bind_count",
	                                   "avg_client_login_count"};
	static const char *const tot_names[] = {"database",           "server_assignment_count",
	                                        "xact_count",         "query_count",
	                                        "bytes_received",     "bytes_sent",
	                                        "xact_time",          "query_time",
	                                        "wait_time",          "client_parse_count",
	                                        "server_parse_count", "bind_count",
	                                        "client_login_count"};
	static const char *const avg_names[] = {"database",
	                                        "server_assignment_count",
	                                        "xact_count",
	                                        "query_count",
	                                        "bytes_received",
	                                        "bytes_sent",
	                                        "xact_time",
	                                        "query_time",
	                                        "wait_time",
	                                        "avg_client_parse_count",
	                                        "avg_server_parse_count",
	                                        "avg_bind_count",
	                                        "avg_client_login_count"};
	Reply r = {.pb = *pb};
	r.ncols = 1 + (which == 0 ? 2 : 1) * STATS_COLUMNS;
	char types[2 + 2 * STATS_COLUMNS];
	memset(types, 'N', sizeof(types));
	types[0] = 'T';
	types[r.ncols] = '\0';
	pktbuf_write_row_description(&r.pb, types, which == 0 ? full : which == 1 ? tot_names : avg_names);
	for (int k = 0; k < n; k++) {
		long long tot[STATS_COLUMNS], avg[STATS_COLUMNS];
		PgStats buf;
		totals(row_totals(&arr[k], tree, &buf), tot);
		averages(&arr[k], avg);
		const char *v[1 + 2 * STATS_COLUMNS];
		v[0] = arr[k].name;
		int col = 1;
		if (which != 2)
			for (int m = 0; m < STATS_COLUMNS; m++)
				v[col++] = fmt_int(tot[m]);
		if (which != 1)
			for (int m = 0; m < STATS_COLUMNS; m++)
				v[col++] = fmt_int(avg[m]);
		reply_row(&r, v);
	}
	pktbuf_write_command_complete(&r.pb, "SHOW");
	*pb = r.pb;
}

static void write_totals(PktBuf *pb, const DbStats *arr, int n, bool tree)
{
	static const char *const names[] = {"name", "value"};
	static const char *const rows[] = {"total_server_assignment_count",
	                                   "total_xact_count",
	                                   "total_query_count",
	                                   "total_client_bytes",
	                                   "total_server_bytes",
	                                   "total_xact_time",
	                                   "total_query_time",
	                                   "total_wait_time",
	                                   "total_ps_client_parse_count",
	                                   "total_ps_server_parse_count",
	                                   "total_ps_bind_count",
	                                   "total_client_login_count",
	                                   "avg_server_assignment_count",
	                                   "avg_xact_count",
	                                   "avg_query_count",
	                                   "avg_client_bytes",
	                                   "avg_server_bytes",
	                                   "avg_xact_time",
	                                   "avg_query_time",
	                                   "avg_wait_time",
	                                   "avg_ps_client_parse_count",
	                                   "avg_ps_server_parse_count",
	                                   "avg_ps_bind_count",
	                                   "avg_client_login_count"};
	DbStats all = {0};
	PgStats shown = {0};
	for (int k = 0; k < n; k++) {
		PgStats buf;
		pgstats_add(&shown, row_totals(&arr[k], tree, &buf));
		pgstats_add(&all.total, &arr[k].total);
		pgstats_add(&all.older, &arr[k].older);
		for (size_t f = 0; f < PGSTATS_FIELDS; f++)
			all.rate[f] += arr[k].rate[f];
	}
	long long tot[STATS_COLUMNS], avg[STATS_COLUMNS];
	totals(&shown, tot);
	averages(&all, avg);
	Reply r = {.pb = *pb, .ncols = 2};
	pktbuf_write_row_description(&r.pb, "TN", names);
	for (int k = 0; k < 2 * STATS_COLUMNS; k++) {
		const char *v[] = {rows[k], fmt_int(k < STATS_COLUMNS ? tot[k] : avg[k - STATS_COLUMNS])};
		reply_row(&r, v);
	}
	pktbuf_write_command_complete(&r.pb, "SHOW");
	*pb = r.pb;
}

/*
 * SHOW STATS, STATS_TOTALS, STATS_AVERAGES (which 0-2) and TOTALS (3) of
 * this worker: the whole pooler's when no other worker runs, else (a
 * private console) this worker's own.
 */
static bool show_stats(PgSocket *c, int which)
{
	pools_stats_flush();
	DbStats *arr;
	int n = collect_stats(&arr);
	PktBuf pb;
	pktbuf_init(&pb, 1024);
	admin_write_stats(&pb, which, arr, n, !c->is_private || c->from_master);
	free(arr);
	pktbuf_write_ready(&pb, 'I');
	return send_pktbuf(c, &pb);
}

/*
 * SHOW STATS_RAW, for a peer's fan-out only: per database the totals, the
 * snapshot of the start of the previous period and this worker's rates
 * since it, so that the averages of the whole pooler can be computed from
 * summed counters and rates.
 */
static bool show_stats_raw(PgSocket *c, int variant)
{
	enum { NF = sizeof(PgStats) / sizeof(uint64_t) };
	char types[2 + 3 * NF];
	const char *names[1 + 3 * NF];
	char namebuf[3 * NF][16];
	types[0] = 'T';
	names[0] = "database";
	for (int k = 0; k < 3 * NF; k++) {
		types[1 + k] = 'N';
		snprintf(namebuf[k], sizeof(namebuf[k]), "%c%d", "tor"[k / NF], k % NF);
		names[1 + k] = namebuf[k];
	}
	types[1 + 3 * NF] = '\0';
	Reply r;
	reply_begin(&r, c, types, names);
	pools_stats_flush(); /* the tree's totals have all of ours when the merged answer reads them */
	DbStats *arr;
	int n = collect_stats(&arr);
	for (int k = 0; k < n; k++) {
		const char *v[1 + 3 * NF];
		const uint64_t *src[2] = {(const uint64_t *)&arr[k].total, (const uint64_t *)&arr[k].older};
		v[0] = arr[k].name;
		for (int m = 0; m < 2 * NF; m++)
			v[1 + m] = fmt_int((long long)src[m / NF][m % NF]);
		for (int m = 0; m < NF; m++)
			v[1 + 2 * NF + m] = fmt_rate(arr[k].rate[m]);
		reply_row(&r, v);
	}
	free(arr);
	return reply_end(&r, "SHOW");
}

static void raw_dns_row(const char *name, void *arg)
{
	const char *v[] = {"dns_names", "1", name, NULL};
	reply_row(arg, v);
}

/*
 * SHOW LISTS; variant 1 is LISTS_RAW, for a peer's fan-out only: the same
 * rows with two more columns (NULL there), then one row per database, user,
 * pool (database, user) and DNS name, so that the fan-out counts each once
 * however many workers have it.
 */
static bool show_lists(PgSocket *c, int variant)
{
	static const char *const names[] = {"list", "items", "database", "user"};
	bool raw = variant == 1;
	int dbs = list_count(&wk.databases), users = 0, pools = list_count(&wk.pools);
	int used_clients = 0, used_servers = 0;
	List *i;
	/* names: the users auth_query found per database count once (sorted: they are neighbours) */
	list_for_each(i, &wk.users) users += i->prev == &wk.users || strcmp(container_of(i->prev, PgUser, node)->name,
	                                                                    container_of(i, PgUser, node)->name) != 0;
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		used_clients += visible_clients(&p->active_clients) + visible_clients(&p->waiting_clients) +
		                visible_clients(&p->active_cancel_req) + visible_clients(&p->waiting_cancel_req);
		used_servers += pool_server_count(p) + list_count(&p->active_cancel_servers);
	}
	const char *rows[][2] = {{"databases", fmt_int(dbs)},
	                         {"users", fmt_int(users)},
	                         {"peers", fmt_int(wk.cf.n_peers)},
	                         {"pools", fmt_int(pools)},
	                         {"peer_pools", fmt_int(0)},
	                         {"free_clients", fmt_int(0)},
	                         {"used_clients", fmt_int(used_clients)},
	                         {"login_clients", fmt_int(visible_clients(&wk.login_clients))},
	                         {"free_servers", fmt_int(0)},
	                         {"used_servers", fmt_int(used_servers)},
	                         {"dns_names", fmt_int(dns_name_count())},
	                         {"dns_zones", fmt_int(0)},
	                         {"dns_queries", fmt_int(dns_pending_count())},
	                         {"dns_pending", fmt_int(0)}};
	Reply r;
	reply_begin(&r, c, raw ? "TiTT" : "Ti", names);
	for (size_t k = 0; k < sizeof(rows) / sizeof(rows[0]); k++) {
		const char *v[] = {rows[k][0], rows[k][1], NULL, NULL};
		reply_row(&r, v);
	}
	if (raw) {
		list_for_each(i, &wk.databases)
		{
			const char *v[] = {"databases", "1", container_of(i, PgDatabase, node)->name, NULL};
			reply_row(&r, v);
		}
		list_for_each(i, &wk.users)
		{
			const char *v[] = {"users", "1", NULL, container_of(i, PgUser, node)->name};
			reply_row(&r, v);
		}
		list_for_each(i, &wk.pools)
		{
			PgPool *p = container_of(i, PgPool, node);
			const char *v[] = {"pools", "1", p->db->name, p->user->name};
			reply_row(&r, v);
		}
		dns_for_each_name(raw_dns_row, &r);
	}
	return reply_end(&r, "SHOW");
}

static bool show_state(PgSocket *c, int variant)
{
	static const char *const names[] = {"key", "value"};
	Reply r;
	reply_begin(&r, c, "TT", names);
	const char *rows[][2] = {{"active", wk.pause_mode == P_NONE ? "yes" : "no"},
	                         {"paused", wk.pause_mode == P_PAUSE ? "yes" : "no"},
	                         {"suspended", wk.pause_mode == P_SUSPEND ? "yes" : "no"}};
	for (int k = 0; k < 3; k++)
		reply_row(&r, rows[k]);
	return reply_end(&r, "SHOW");
}

/* What SHOW MEM counts over the sockets of this worker (peer connections of consoles left out). */
typedef struct MemCount {
	int clients, servers;
	int iobufs;                  /* sockets with their read buffer */
	int requests, request_slots; /* queued requests; allocated ring slots */
	int server_stmts;            /* statements prepared on servers */
} MemCount;

static void mem_socket(MemCount *m, const PgSocket *s)
{
	if (s->is_internal)
		return;
	if (s->is_server) {
		m->servers++;
		m->requests += (int)s->rq.count;
		m->request_slots += (int)s->rq.cap;
		m->server_stmts += (int)prepare_server_count(&s->sstmts);
	} else {
		m->clients++;
	}
	m->iobufs++;
}

/*
 * One row per kind of object PgBouncer keeps in a slab cache, with its
 * size and how many this worker has (doc/workers.md, "SHOW MEM"). Nothing
 * is cached once unused here (closed sockets and freed pools go back to
 * malloc), so `free` is 0 but for the request queues' ring slots allocated
 * and not in use and the spare tuples of tracked values (var_list_cache).
 */
static bool show_mem(PgSocket *c, int variant)
{
	static const char *const names[] = {"name", "size", "used", "free", "memtotal"};
	Reply r;
	reply_begin(&r, c, "Tiiii", names);
	MemCount m = {0};
	size_t var_size;
	int var_used, var_spare;
	var_sets_usage(&var_size, &var_used, &var_spare);
	List *i, *j;
	list_for_each(i, &wk.login_clients) mem_socket(&m, container_of(i, PgSocket, node));
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		List *lists[] = {&p->active_clients, &p->waiting_clients,       &p->active_servers,
		                 &p->idle_servers,   &p->used_servers,          &p->tested_servers,
		                 &p->new_servers,    &p->active_cancel_servers, &p->being_canceled_servers};
		for (size_t l = 0; l < sizeof(lists) / sizeof(lists[0]); l++)
			list_for_each(j, lists[l]) mem_socket(&m, container_of(j, PgSocket, node));
	}
	struct {
		const char *name;
		size_t size;
		int used, free;
	} caches[] = {
	    {"user_cache", sizeof(PgUser), list_count(&wk.users), 0},
	    {"credentials_cache", sizeof(UserEntry), wk.userlist.n_users, 0},
	    {"db_cache", sizeof(PgDatabase), list_count(&wk.databases), 0},
	    {"peer_cache", sizeof(CfPeer), wk.cf.n_peers, 0},
	    {"peer_pool_cache", cancel_peer_queue_size(), cancel_peer_queue_count(), 0},
	    {"pool_cache", sizeof(PgPool), list_count(&wk.pools), 0},
	    {"outstanding_request_cache", sizeof(Request), m.requests, m.request_slots - m.requests},
	    {"server_cache", sizeof(PgSocket), m.servers, 0},
	    {"client_cache", sizeof(PgSocket), m.clients, 0},
	    {"iobuf_cache", (size_t)(wk.cf.g.pkt_buf < 512 ? 512 : wk.cf.g.pkt_buf), m.iobufs, 0},
	    {"var_list_cache", var_size, var_used, var_spare},
	    {"server_prepared_statement_cache", prepare_server_stmt_size(), m.server_stmts, 0},
	};
	for (size_t k = 0; k < sizeof(caches) / sizeof(caches[0]); k++) {
		const char *v[] = {caches[k].name, fmt_int((long long)caches[k].size), fmt_int(caches[k].used),
		                   fmt_int(caches[k].free),
		                   fmt_int((long long)caches[k].size * (caches[k].used + caches[k].free))};
		reply_row(&r, v);
	}
	return reply_end(&r, "SHOW");
}

static bool show_empty(PgSocket *c, const char *types, const char *const *names)
{
	Reply r;
	reply_begin(&r, c, types, names);
	return reply_end(&r, "SHOW");
}

/* No peer pools are kept (SHOW LISTS counts 0): always empty. */
static bool show_peer_pools(PgSocket *c, int variant)
{
	static const char *const names[] = {"peer_id", "cl_active_cancel_req", "cl_waiting_cancel_req",
	                                    "sv_active_cancel", "sv_login"};
	return show_empty(c, "iiiii", names);
}

/* No DNS zones are tracked (SHOW LISTS counts 0): always empty. */
static bool show_dns_zones(PgSocket *c, int variant)
{
	static const char *const names[] = {"zonename", "serial", "count"};
	return show_empty(c, "Tqi", names);
}

/* SHOW WORKERS and SCALER read shared memory (admin_workers.c), not merged. */
static bool show_workers(PgSocket *c, int variant)
{
	return sent(c, admin_show_workers(c));
}

static bool show_scaler(PgSocket *c, int variant)
{
	return sent(c, admin_show_scaler(c));
}

static int cmp_peer_id(const void *a, const void *b)
{
	const CfPeer *x = *(const CfPeer *const *)a, *y = *(const CfPeer *const *)b;
	return (x->id > y->id) - (x->id < y->id);
}

static void dns_host_row(void *arg, const char *name, long long ttl, const char *addrs)
{
	const char *v[] = {name, fmt_int(ttl), addrs};
	reply_row(arg, v);
}

static bool show_dns_hosts(PgSocket *c, int variant)
{
	static const char *const names[] = {"hostname", "ttl", "addrs"};
	Reply r;
	reply_begin(&r, c, "TqT", names);
	dns_foreach_host(dns_host_row, &r);
	return reply_end(&r, "SHOW");
}

static bool show_peers(PgSocket *c, int variant)
{
	static const char *const names[] = {"peer_id", "host", "port", "pool_size"};
	const CfPeer **sorted = xcalloc((size_t)wk.cf.n_peers + 1, sizeof(*sorted));
	for (int k = 0; k < wk.cf.n_peers; k++)
		sorted[k] = &wk.cf.peers[k];
	qsort(sorted, (size_t)wk.cf.n_peers, sizeof(*sorted), cmp_peer_id);
	Reply r;
	reply_begin(&r, c, "iTii", names);
	for (int k = 0; k < wk.cf.n_peers; k++) {
		const CfPeer *p = sorted[k];
		const char *v[] = {fmt_int(p->id), p->host, fmt_int(p->port), fmt_int(peer_pool_size(p))};
		reply_row(&r, v);
	}
	free(sorted);
	return reply_end(&r, "SHOW");
}

/*
 * SHOW FDS: the sockets an online reboot would take over. The fds themselves
 * are not passed (no SCM_RIGHTS): -R is refused at start-up anyway.
 */
static void fds_row(Reply *r, int fd, const char *task, const PgSocket *s, const char *addr, int port)
{
	char cancel[24] = "0";
	const char *user = NULL, *db = NULL, *enc = NULL, *std = NULL, *ds = NULL, *tz = NULL;
	int link = 0;
	if (s) {
		uint64_t key = 0;
		/* servers show PostgreSQL's key, clients ours */
		const uint8_t *kb = s->is_server ? s->server_key : s->cancel_key;
		uint32_t kl = s->is_server ? s->server_key_len : s->cancel_key_len;
		for (uint32_t k = 0; k < 8 && k < kl; k++)
			key = key << 8 | kb[k];
		snprintf(cancel, sizeof(cancel), "%llu", (unsigned long long)key);
		user = s->login_user ? s->login_user->name : NULL;
		db = s->pool ? s->pool->db->name : NULL;
		link = s->link ? s->link->sb.fd : 0;
		const int idx[] = {var_index("client_encoding"), var_index("standard_conforming_strings"),
		                   var_index("DateStyle"), var_index("TimeZone")};
		const char **dst[] = {&enc, &std, &ds, &tz};
		for (int k = 0; k < 4; k++)
			if (idx[k] >= 0)
				*dst[k] = sock_var(s, idx[k]);
	}
	const char *v[] = {fmt_int(fd), task, user, db, addr, fmt_int(port), cancel, fmt_int(link),
	                   enc,         std,  ds,   tz, NULL, NULL,          NULL};
	reply_row(r, v);
}

static void fds_socket_row(Reply *r, const PgSocket *s)
{
	char addr[80];
	int port;
	if (s->is_internal)
		return;
	socket_remote_text(s, addr, sizeof(addr), &port);
	fds_row(r, s->sb.fd, s->is_server ? "server" : "client", s, addr, port);
}

static bool show_fds(PgSocket *c, int variant)
{
	static const char *const names[] = {
	    "fd",        "task",     "user",     "database",         "addr",
	    "port",      "cancel",   "link",     "client_encoding",  "std_strings",
	    "datestyle", "timezone", "password", "scram_client_key", "scram_server_key"};
	Reply r;
	reply_begin(&r, c, "iTTTTiqiTTTTTbb", names);
	for (int k = 0; k < wk.n_listeners; k++) {
		const WorkerListener *l = &wk.listeners[k];
		struct sockaddr_storage ss;
		socklen_t len = sizeof(ss);
		char addr[80] = "unix";
		int port = wk.cf.g.listen_port;
		if (l->fd < 0)
			continue;
		if (!l->is_unix && getsockname(l->fd, (struct sockaddr *)&ss, &len) == 0)
			format_addr(&ss, addr, sizeof(addr), &port);
		fds_row(&r, l->fd, "pooler", NULL, addr, port);
	}
	List *i, *j;
	list_for_each(i, &wk.login_clients) fds_socket_row(&r, container_of(i, PgSocket, node));
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		List *lists[] = {&p->active_clients, &p->waiting_clients, &p->active_servers, &p->idle_servers,
		                 &p->used_servers,   &p->tested_servers,  &p->new_servers};
		for (int l = 0; l < 7; l++)
			list_for_each(j, lists[l]) fds_socket_row(&r, container_of(j, PgSocket, node));
	}
	return reply_end(&r, "SHOW");
}

/* ---- fake parameters for drivers ---- */

static const char *fake_param(const char *name)
{
	static const char *const fakes[][2] = {{"client_encoding", "UTF-8"},
	                                       {"default_transaction_isolation", "read committed"},
	                                       {"standard_conforming_strings", "on"},
	                                       {"datestyle", "ISO"},
	                                       {"timezone", "GMT"}};
	for (size_t k = 0; k < sizeof(fakes) / sizeof(fakes[0]); k++)
		if (strcasecmp(fakes[k][0], name) == 0)
			return fakes[k][1];
	return NULL;
}

/* ---- parsing ---- */

#define MAX_WORD ADMIN_MAX_WORD

static PgDatabase *find_or_register_db(const char *name)
{
	PgDatabase *db = db_find(name);
	return db ? db : db_register_auto(name);
}

/*
 * The database named by a command's argument: found (or, with `auto`,
 * registered through "*"), and not the admin db. On failure the console has
 * its error ("no such database", "cannot <verb> admin db") and NULL is returned.
 */
static PgDatabase *db_arg(PgSocket *c, const char *arg, bool autodb, const char *verb)
{
	PgDatabase *db = autodb ? find_or_register_db(arg) : db_find(arg);
	if (!db)
		admin_error(c, NULL, "no such database: %s", arg);
	else if (db->admin)
		admin_error(c, NULL, "cannot %s admin db: %s", verb, arg);
	return db && !db->admin ? db : NULL;
}

/* Servers still serving a client (PAUSE waits for them); only = one db or every non-admin db. */
static int servers_in_use(const PgDatabase *only)
{
	int n = 0;
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		if (p->db->admin || (only && p->db != only))
			continue;
		n += list_count(&p->active_servers) + list_count(&p->tested_servers);
	}
	return n;
}

static int close_needed_count(const PgDatabase *only)
{
	int n = 0;
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		if (only && p->db != only)
			continue;
		List *lists[] = {&p->active_servers, &p->idle_servers, &p->used_servers, &p->tested_servers,
		                 &p->new_servers};
		for (int l = 0; l < 5; l++) {
			List *j;
			list_for_each(j, lists[l]) n += container_of(j, PgSocket, node)->close_needed;
		}
	}
	return n;
}

/* Close the unused servers of one database (PAUSE db). */
static void close_idle_servers_of(const PgDatabase *db)
{
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		if (p->db != db)
			continue;
		List *lists[] = {&p->idle_servers, &p->used_servers};
		for (int l = 0; l < 2; l++) {
			List *j, *t;
			list_for_each_safe(j, lists[l], t)
			    disconnect_server(container_of(j, PgSocket, node), true, "pause mode");
		}
	}
}

static void wake_all_pools(void)
{
	List *i, *t;
	list_for_each_safe(i, &wk.pools, t) pool_wake_waiters(container_of(i, PgPool, node));
}

/* ---- delayed replies ---- */

/*
 * Consoles waiting for a delayed reply, kept by client id rather than by
 * pointer: a console may disconnect while it waits, and its PgSocket is
 * freed with it.
 */
typedef enum WaitKind {
	WAIT_PAUSE,    /* global PAUSE: until no server is in use */
	WAIT_PAUSE_DB, /* PAUSE db: until no server of db is in use */
	WAIT_CLOSE,    /* WAIT_CLOSE [db]: until no server has close_needed */
	WAIT_SHUTDOWN, /* SHUTDOWN WAIT_FOR_*: until the master's signal has put this worker into shutdown */
	WAIT_SUSPEND,  /* SUSPEND: until every pooled socket is flushed, or suspend_timeout closed the rest */
	WAIT_RELOAD,   /* RELOAD: until the master's SIGHUP has reloaded this worker */
} WaitKind;

typedef struct ConsoleWait {
	uint64_t client_id;
	WaitKind kind;
	char db[CF_MAX_DBNAME]; /* the database, "" = all */
	uint64_t reloads;       /* WAIT_RELOAD: wk.reloads when RELOAD was given */
	usec_t since;           /* when the command was given */
} ConsoleWait;

static ConsoleWait *waits;
static int n_waits, cap_waits;
static uint64_t suspend_owner; /* console whose SUSPEND is in force (0 = none): its disconnect resumes */
static usec_t suspend_start;   /* when that SUSPEND began (suspend_timeout counts from here) */

/* Sockets SUSPEND stopped reading (by id), to be resumed by RESUME. */
static uint64_t *suspended;
static int n_suspended, cap_suspended;

static PgSocket *console_by_id(uint64_t id)
{
	PgPool *p = pool_find(wk.admin_db, wk.admin_user);
	List *i;
	if (!p)
		return NULL;
	list_for_each(i, &p->active_clients)
	{
		PgSocket *c = container_of(i, PgSocket, node);
		if (c->id == id)
			return c;
	}
	return NULL;
}

static void add_wait(PgSocket *c, WaitKind kind, const PgDatabase *db)
{
	if (n_waits == cap_waits) {
		cap_waits = cap_waits ? cap_waits * 2 : 8;
		waits = xrealloc(waits, sizeof(*waits) * (size_t)cap_waits);
	}
	ConsoleWait *w = &waits[n_waits++];
	w->client_id = c->id;
	w->kind = kind;
	w->reloads = wk.reloads;
	w->since = wk.now;
	pgb_strlcpy(w->db, db ? db->name : "", sizeof(w->db));
}

/* A waiting console whose command was aborted (RESUME, cancel) gets a bare ReadyForQuery. */
static void send_ready(PgSocket *c)
{
	PktBuf pb;
	pktbuf_init(&pb, 8);
	pktbuf_write_ready(&pb, 'I');
	(void)send_pktbuf(c, &pb);
}

static bool suspend_flushed(void);

#define RELOAD_WAIT_MAX (5 * USEC_PER_SEC)       /* a stopped or hung process does not hold a console's RELOAD longer */
static const char RELOAD_NOT_DONE[] = "!RELOAD"; /* wait_outcome(): answer with an error */
static const char RELOAD_FAILED[] = "!RELOAD failed"; /* wait_outcome(): reloaded, but not all of it loaded */

/* Every running worker has reloaded to this worker's configuration generation (or the wait is over). */
static bool workers_reloaded(const ConsoleWait *w)
{
	if (!wk.slot || wk.now - w->since > RELOAD_WAIT_MAX)
		return true;
	uint64_t gen = atomic_load(&wk.slot->config_gen);
	for (int k = 0; k < SHM_MAX_WORKERS; k++) {
		const WorkerSlot *sl = &wk.shm->slots[k];
		uint32_t st = atomic_load(&sl->state);
		if ((st == SLOT_STARTING || st == SLOT_ACTIVE || st == SLOT_DRAINING) && atomic_load(&sl->pid) > 0 &&
		    atomic_load(&sl->config_gen) < gen)
			return false;
	}
	return true;
}

/* Tag to answer w with now; NULL = keep waiting; "" = aborted. */
static const char *wait_outcome(const ConsoleWait *w)
{
	PgDatabase *db = w->db[0] ? db_find(w->db) : NULL;
	switch (w->kind) {
	case WAIT_PAUSE:
		if (wk.pause_mode != P_PAUSE)
			return "";
		return servers_in_use(NULL) == 0 ? "PAUSE" : NULL;
	case WAIT_PAUSE_DB:
		if (!db || !db->paused)
			return "";
		return servers_in_use(db) == 0 ? "PAUSE" : NULL;
	case WAIT_CLOSE:
		if (w->db[0] && !db)
			return "WAIT_CLOSE";
		return close_needed_count(db) == 0 ? "WAIT_CLOSE" : NULL;
	case WAIT_SHUTDOWN:
		return wk.run_state == RUN_SHUTDOWN_SERVERS || wk.run_state == RUN_SHUTDOWN_CLIENTS ? "SHUTDOWN" : NULL;
	case WAIT_SUSPEND:
		if (wk.pause_mode != P_SUSPEND)
			return "";
		return suspend_flushed() ? "SUSPEND" : NULL;
	case WAIT_RELOAD:
		if (wk.reloads > w->reloads) {
			if (!workers_reloaded(w))
				return NULL;
			/* the TLS files are read by every process alike: this worker's outcome is theirs (doc/tls.md) */
			return wk.reload_failed ? RELOAD_FAILED : "RELOAD";
		}
		/* the master has not reloaded us: stopped, or its own load of the file failed after our check */
		return wk.now - w->since > RELOAD_WAIT_MAX ? RELOAD_NOT_DONE : NULL;
	}
	return "";
}

static void check_waits(void);

static void on_reload_poll(evutil_socket_t fd, short what, void *arg)
{
	wk.now = get_time_usec();
	check_waits();
}

/* Answer the waits that are done; forget those of departed consoles. */
static void check_waits(void)
{
	static struct event *reload_poll;
	bool reload_pending = false;
	for (int k = 0; k < n_waits;) {
		ConsoleWait w = waits[k];
		PgSocket *c = console_by_id(w.client_id);
		const char *tag = c ? wait_outcome(&w) : "";
		if (!tag) {
			/* the master's and the other workers' reloads leave no event here: look again soon */
			reload_pending |= w.kind == WAIT_RELOAD;
			k++;
			continue;
		}
		waits[k] = waits[--n_waits];
		if (!c)
			continue;
		if (tag == RELOAD_NOT_DONE) {
			log_warning("RELOAD: the master did not reload within %d s",
			            (int)(RELOAD_WAIT_MAX / USEC_PER_SEC));
			(void)admin_error(c, "F0000", "RELOAD failed, see logs for additional details");
		} else if (tag == RELOAD_FAILED) {
			(void)admin_error(c, "F0000", "RELOAD failed, see logs for additional details");
		} else if (*tag)
			(void)send_simple(c, tag);
		else
			send_ready(c);
	}
	if (reload_pending) {
		struct timeval tv = {0, 10000};
		if (!reload_poll)
			reload_poll = evtimer_new(wk.base, on_reload_poll, NULL);
		if (reload_poll && !evtimer_pending(reload_poll, NULL))
			evtimer_add(reload_poll, &tv);
	}
}

/* The pooled sockets (not the consoles), in SHOW FDS order; fn may not close them. */
static void for_each_pooled_socket(void (*fn)(PgSocket *s))
{
	List *i, *j;
	list_for_each(i, &wk.login_clients)
	{
		PgSocket *s = container_of(i, PgSocket, node);
		if (!s->db || !s->db->admin)
			fn(s);
	}
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		if (p->db->admin)
			continue;
		List *lists[] = {&p->active_clients, &p->waiting_clients, &p->active_servers, &p->idle_servers,
		                 &p->used_servers,   &p->tested_servers,  &p->new_servers};
		for (int l = 0; l < 7; l++)
			list_for_each(j, lists[l]) fn(container_of(j, PgSocket, node));
	}
}

static void suspend_socket(PgSocket *s)
{
	if (s->sb.fd < 0 || s->sb.paused)
		return; /* already waiting for something else, which will not happen while suspended */
	if (n_suspended == cap_suspended) {
		cap_suspended = cap_suspended ? cap_suspended * 2 : 64;
		suspended = xrealloc(suspended, sizeof(*suspended) * (size_t)cap_suspended);
	}
	suspended[n_suspended++] = s->id;
	sbuf_pause(&s->sb);
}

/* Pooled sockets with output still to write, collected by collect_unflushed(). */
static PgSocket **unflushed;
static int n_unflushed, cap_unflushed;

static void collect_unflushed(PgSocket *s)
{
	if (s->sb.fd < 0 || sbuf_is_flushed(&s->sb))
		return;
	if (n_unflushed == cap_unflushed) {
		cap_unflushed = cap_unflushed ? cap_unflushed * 2 : 16;
		unflushed = xrealloc(unflushed, sizeof(*unflushed) * (size_t)cap_unflushed);
	}
	unflushed[n_unflushed++] = s;
}

/*
 * Whether SUSPEND is complete: every pooled socket has written what it
 * had. Once suspend_timeout has passed, the sockets that still have not
 * are closed, and it is complete too.
 */
static bool suspend_flushed(void)
{
	n_unflushed = 0;
	for_each_pooled_socket(collect_unflushed);
	if (n_unflushed == 0)
		return true;
	if (wk.now - suspend_start < wk.cf.g.suspend_timeout)
		return false;
	log_warning("SUSPEND: closing %d socket%s that did not flush within suspend_timeout", n_unflushed,
	            n_unflushed == 1 ? "" : "s");
	/* closing one may close its peer too: those are skipped (freed only after this pass) */
	for (int k = 0; k < n_unflushed; k++) {
		PgSocket *s = unflushed[k];
		if (s->is_server)
			disconnect_server(s, false, "suspend_timeout");
		else
			disconnect_client(s, false, "suspend_timeout");
	}
	n_unflushed = 0;
	return true;
}

static int cmp_id(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

static void resume_socket(PgSocket *s)
{
	if (s->sb.fd >= 0 && s->sb.paused &&
	    bsearch(&s->id, suspended, (size_t)n_suspended, sizeof(*suspended), cmp_id))
		sbuf_continue(&s->sb);
}

static void resume_sockets(void)
{
	if (n_suspended == 0)
		return;
	qsort(suspended, (size_t)n_suspended, sizeof(*suspended), cmp_id);
	for_each_pooled_socket(resume_socket);
	n_suspended = 0;
}

void admin_resume_all(void)
{
	if (wk.pause_mode == P_SUSPEND)
		worker_listen_pause(false);
	wk.pause_mode = P_NONE;
	wk.pause_inherited = false;
	resume_sockets();
	suspend_owner = 0;
	wake_all_pools();
	check_waits();
}

void admin_take_state(const ConsoleState *cs)
{
	if (wk.run_state != RUN_ACTIVE && wk.run_state != RUN_DRAINING)
		return; /* shutting down: nothing to pause or resume */
	List *i;
	list_for_each(i, &wk.databases)
	{
		PgDatabase *db = container_of(i, PgDatabase, node);
		if (db->admin)
			continue;
		bool paused = console_state_has(cs, CS_DB_PAUSED, db->name);
		db->disabled = console_state_has(cs, CS_DB_DISABLED, db->name);
		if (db->paused == paused)
			continue;
		db->paused = paused;
		if (paused)
			close_idle_servers_of(db);
	}
	char pause = console_state_pause(cs);
	PauseMode want = pause == CS_PAUSED ? P_PAUSE : pause == CS_SUSPENDED ? P_SUSPEND : P_NONE;
	if (wk.pause_mode != want) {
		if (wk.pause_mode != P_NONE)
			admin_resume_all();
		if (want == P_PAUSE) {
			wk.pause_mode = P_PAUSE;
			worker_close_idle_servers();
		} else if (want == P_SUSPEND) {
			/* as SUSPEND without its console: it ends with the pooler's RESUME (CH_CONSOLE_RESUME) */
			wk.pause_mode = P_SUSPEND;
			worker_listen_pause(true);
			for_each_pooled_socket(suspend_socket);
			suspend_start = wk.now;
		}
		/* like a pause taken over at start: the master's word that the pooler resumed ends it */
		wk.pause_inherited = want != P_NONE;
	}
	wake_all_pools();
	check_waits();
}

void admin_pause_done_check(void)
{
	/* a SIGUSR2 ended the SUSPEND behind the console's back */
	if (wk.pause_mode != P_SUSPEND)
		resume_sockets();
	/* the console that suspended the pooler went away: nobody would resume it */
	if (suspend_owner && !console_by_id(suspend_owner)) {
		suspend_owner = 0;
		if (wk.pause_mode == P_SUSPEND && wk.run_state == RUN_ACTIVE) {
			log_info("suspending console is gone, resuming");
			admin_resume_all();
			admin_state_report();
		}
	}
	check_waits();
}

void admin_wait_close_check(void)
{
	check_waits();
}

/*
 * What undoes `query` on a peer when a cancel or another worker's refusal
 * abandons it: for PAUSE [db] and SUSPEND, "RESUME_PART" with the argument
 * as typed (to be freed), and in db the database ("" = all); NULL for the
 * other commands, whose cancel only ends the wait.
 */
static char *undo_of(const char *query, char *db, size_t dblen)
{
	const char *p = query;
	char word[16];
	if (admin_read_ident(&p, word, sizeof(word)) != ADMIN_PARSE_OK ||
	    (strcasecmp(word, "PAUSE") != 0 && strcasecmp(word, "SUSPEND") != 0) ||
	    admin_parse_arg(p, db, dblen) != ADMIN_PARSE_OK)
		return NULL;
	static const char verb[] = "RESUME_PART";
	size_t n = strlen(p), k = sizeof(verb) - 1;
	char *undo = xmalloc(n + k + 1);
	memcpy(undo, verb, k);
	memcpy(undo + k, p, n + 1);
	return undo;
}

/* Undo this worker's part of a cancelled PAUSE [db] or SUSPEND (db "" = all); true if it held. */
static bool undo_pause(const char *db_name)
{
	if (*db_name) {
		PgDatabase *db = db_find(db_name);
		if (!db || !db->paused)
			return false;
		db->paused = false;
		wake_all_pools();
		return true;
	}
	if (wk.pause_mode == P_NONE)
		return false;
	admin_resume_all();
	return true;
}

/*
 * Undo console c's finished part of `query` (PAUSE [db], SUSPEND) on this
 * worker; true if there was one to undo. A PAUSE db that found the database
 * paused already changed nothing here: the earlier pause stays.
 */
static bool undo_here(PgSocket *c, const char *query)
{
	char db[MAX_WORD];
	char *undo = undo_of(query, db, sizeof(db));
	bool undone = undo && !(*db && c->pause_db_noop) && undo_pause(db);
	free(undo);
	if (undone) {
		log_info("console command abandoned, resuming");
		admin_state_report();
	}
	return undone;
}

/* End c's pending PAUSE [db], SUSPEND, WAIT_CLOSE or RELOAD with a bare ReadyForQuery. */
static void abandon_wait(PgSocket *c)
{
	for (int k = 0; k < n_waits; k++) {
		ConsoleWait w = waits[k];
		if (w.client_id != c->id || w.kind == WAIT_SHUTDOWN)
			continue;
		waits[k] = waits[--n_waits];
		/* only what the command itself paused: a cancelled WAIT_CLOSE or RELOAD leaves a PAUSE alone */
		bool undone = false;
		if (w.kind == WAIT_PAUSE_DB)
			undone = !c->pause_db_noop && undo_pause(w.db); /* a pause from before stays */
		else if (w.kind == WAIT_PAUSE || w.kind == WAIT_SUSPEND)
			undone = undo_pause("");
		if (undone) {
			log_info("console command abandoned, resuming");
			admin_state_report();
		}
		send_ready(c);
		return;
	}
}

void admin_abandon_part(PgSocket *c, const char *query, bool done_here)
{
	if (done_here)
		(void)undo_here(c, query);
	else
		abandon_wait(c);
}

void admin_console_cancel(PgSocket *c)
{
	if (wk.run_state != RUN_ACTIVE)
		return;
	bool done_here = false;
	const char *query = admin_fanout_command(c, &done_here);
	/* the other workers abort their part, or undo it if it is done; so does this one */
	if (query) {
		admin_fanout_cancel(c); /* the command ends later, from the loop: query stays */
		if (done_here)
			(void)undo_here(c, query);
	}
	abandon_wait(c);
}

/* ---- process control ---- */

static void mark_close_needed(const PgDatabase *only)
{
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		if (p->db->admin || (only && p->db != only))
			continue;
		List *lists[] = {&p->active_servers, &p->idle_servers, &p->used_servers, &p->tested_servers,
		                 &p->new_servers};
		for (int l = 0; l < 5; l++) {
			List *j, *t;
			list_for_each_safe(j, lists[l], t)
			{
				PgSocket *s = container_of(j, PgSocket, node);
				s->close_needed = true;
				/* a streaming replication server is never released: it goes now too */
				if (s->state == SV_IDLE || s->state == SV_USED ||
				    (s->state == SV_ACTIVE && s->replication != REPLICATION_NONE))
					disconnect_server(s, true, "RECONNECT");
			}
		}
	}
}

static void kill_db(PgDatabase *db)
{
	db->paused = true;
	List *i, *tmp;
	list_for_each_safe(i, &wk.pools, tmp)
	{
		PgPool *p = container_of(i, PgPool, node);
		if (p->db != db)
			continue;
		List *cl[] = {&p->active_clients, &p->waiting_clients};
		for (int l = 0; l < 2; l++) {
			List *j, *t;
			list_for_each_safe(j, cl[l], t)
			    disconnect_client(container_of(j, PgSocket, node), true, "database removed");
		}
		List *sl[] = {&p->active_servers, &p->idle_servers, &p->used_servers, &p->tested_servers,
		              &p->new_servers};
		for (int l = 0; l < 5; l++) {
			List *j, *t;
			list_for_each_safe(j, sl[l], t)
			    disconnect_server(container_of(j, PgSocket, node), true, "database removed");
		}
	}
}

static bool db_has_pools(const PgDatabase *db)
{
	List *i;
	list_for_each(i, &wk.pools) if (container_of(i, PgPool, node)->db == db) return true;
	return false;
}

static PgSocket *find_client_by_id(uint64_t id)
{
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		List *cl[] = {&p->active_clients, &p->waiting_clients, &p->active_cancel_req, &p->waiting_cancel_req};
		for (int l = 0; l < 4; l++) {
			List *j;
			list_for_each(j, cl[l])
			{
				PgSocket *s = container_of(j, PgSocket, node);
				if (s->id == id && !s->is_internal) /* a console's peer connection is nobody's client */
					return s;
			}
		}
	}
	return NULL;
}

static bool invalid_command(PgSocket *c, const char *query)
{
	return admin_error(c, NULL, "invalid command '%s', use SHOW HELP;", query);
}

/* The error for a parse failure of `query`. */
static bool parse_error(PgSocket *c, AdminParse r, const char *query)
{
	return r == ADMIN_PARSE_TOO_LONG ? admin_error(c, NULL, "bad arguments") : invalid_command(c, query);
}

static bool cmd_pause(PgSocket *c, const char *arg, const char *query)
{
	if (wk.pause_mode != P_NONE)
		return admin_error(c, NULL, "already suspended/paused");
	if (*arg) {
		PgDatabase *db = db_arg(c, arg, true, "pause");
		if (!db)
			return c->state != CL_JUSTFREE; /* false: the error could not be sent */
		c->pause_db_noop = db->paused;          /* an undo of this part must keep that pause (undo_here()) */
		db->paused = true;
		close_idle_servers_of(db);
		if (servers_in_use(db) == 0)
			return send_simple(c, "PAUSE");
		add_wait(c, WAIT_PAUSE_DB, db);
		return true;
	}
	wk.pause_mode = P_PAUSE;
	worker_close_idle_servers();
	if (servers_in_use(NULL) == 0)
		return send_simple(c, "PAUSE");
	add_wait(c, WAIT_PAUSE, NULL);
	return true;
}

static bool cmd_resume(PgSocket *c, const char *arg, const char *query)
{
	/* a draining worker is no pooler shutting down: its clients waiting in a PAUSE go on too */
	if (wk.run_state != RUN_ACTIVE && wk.run_state != RUN_DRAINING)
		return admin_error(c, NULL, "pooler is shutting down");
	if (*arg) {
		admin_state_inherited_clear(CS_DB_PAUSED, arg); /* also for an auto-database not created here yet */
		PgDatabase *db = db_find(arg);
		if (!db)
			return admin_error(c, NULL, "no such database: %s", arg);
		if (!db->paused)
			return admin_error(c, NULL, "database %s is not paused", arg);
		db->paused = false;
		wake_all_pools();
		check_waits();
	} else {
		if (wk.pause_mode == P_NONE)
			return admin_error(c, NULL, "pooler is not paused/suspended");
		admin_resume_all();
	}
	return send_simple(c, "RESUME");
}

/*
 * RESUME_PART [db]: the undo of a fanned-out PAUSE [db] or SUSPEND whose
 * part this peer connection's worker had done (undo_of()). As RESUME [db],
 * except after a PAUSE db that found the database paused already.
 */
static bool cmd_resume_part(PgSocket *c, const char *arg, const char *query)
{
	bool noop = *arg && c->pause_db_noop;
	c->pause_db_noop = false;
	return noop ? send_simple(c, "RESUME") : cmd_resume(c, arg, query);
}

static bool cmd_suspend(PgSocket *c, const char *arg, const char *query)
{
	if (wk.pause_mode != P_NONE)
		return admin_error(c, NULL, "already suspended/paused");
	List *i;
	list_for_each(i, &wk.databases)
	{
		if (container_of(i, PgDatabase, node)->paused)
			return admin_error(c, NULL, "cannot suspend with paused databases");
	}
	/* stop reading: what is buffered still goes out, nothing new comes in */
	wk.pause_mode = P_SUSPEND;
	worker_listen_pause(true);
	for_each_pooled_socket(suspend_socket);
	suspend_owner = c->id;
	suspend_start = wk.now;
	/* the reply waits until the buffers are flushed (checked by the janitor) */
	if (suspend_flushed())
		return send_simple(c, "SUSPEND");
	add_wait(c, WAIT_SUSPEND, NULL);
	return true;
}

/* A fanned-out command's part on this worker: the console's own, or a peer's (doc/workers.md). */
static bool in_fanout(const PgSocket *c)
{
	return c->is_internal || admin_console_busy(c);
}

static bool cmd_kill(PgSocket *c, const char *arg, const char *query)
{
	if (wk.pause_mode != P_NONE)
		return admin_error(c, NULL, "already suspended/paused");
	if (*arg) {
		PgDatabase *db = db_arg(c, arg, true, "kill");
		if (!db)
			return c->state != CL_JUSTFREE; /* false: the error could not be sent */
		kill_db(db);
		return send_simple(c, "KILL");
	}
	/*
	 * In a fan-out the answer names the databases killed here, so that the
	 * console's worker has every worker pause each of them (FOLLOW_KILL).
	 */
	static const char *const names[] = {"database"};
	Reply r = {.c = c, .ncols = 1};
	pktbuf_init(&r.pb, 256);
	if (in_fanout(c))
		pktbuf_write_row_description(&r.pb, "T", names);
	List *i, *t;
	list_for_each_safe(i, &wk.databases, t)
	{
		PgDatabase *db = container_of(i, PgDatabase, node);
		if (db->admin || !db_has_pools(db))
			continue;
		kill_db(db);
		if (in_fanout(c)) {
			const char *v[] = {db->name};
			reply_row(&r, v);
		}
	}
	return reply_end(&r, "KILL");
}

void admin_kill_here(const char *db_name)
{
	PgDatabase *db = find_or_register_db(db_name);
	if (db && !db->admin) {
		log_info("KILL: %s was killed on another worker, killing it here too", db_name);
		kill_db(db);
	}
}

static bool cmd_kill_client(PgSocket *c, const char *arg, const char *query)
{
	char *end;
	errno = 0;
	unsigned long long id = strtoull(arg, &end, 10);
	if (!*arg || *end || errno || !isdigit((unsigned char)*arg))
		return admin_error(c, NULL, "invalid client pointer supplied");
	PgSocket *target = find_client_by_id(id);
	if (!target)
		return admin_error(c, NULL, "client not found");
	disconnect_client(target, true, "admin forced disconnect");
	if (target == c)
		return false;
	return send_simple(c, "KILL_CLIENT");
}

/* DISABLE db / ENABLE db (1.25 words the admin-db error "disable" for both). */
static bool set_disabled(PgSocket *c, const char *arg, bool disable)
{
	if (!disable) /* also for an auto-database this worker has not created yet */
		admin_state_inherited_clear(CS_DB_DISABLED, arg);
	PgDatabase *db = db_arg(c, arg, false, "disable");
	if (!db)
		return c->state != CL_JUSTFREE; /* false: the error could not be sent */
	db->disabled = disable;
	return send_simple(c, disable ? "DISABLE" : "ENABLE");
}

static bool cmd_disable(PgSocket *c, const char *arg, const char *query)
{
	return set_disabled(c, arg, true);
}

void admin_disable_later(const char *db_name)
{
	PgDatabase *db = db_find(db_name);
	if (db && !db->admin)
		db->disabled = true; /* created here since the DISABLE */
	else if (!db)
		admin_state_remember(CS_DB_DISABLED, db_name);
}

/* DISABLE_LATER db: a fan-out's follow-up of DISABLE db (FOLLOW_DISABLE) for a worker without db. */
static bool cmd_disable_later(PgSocket *c, const char *arg, const char *query)
{
	admin_disable_later(arg);
	return send_simple(c, "DISABLE");
}

static bool cmd_enable(PgSocket *c, const char *arg, const char *query)
{
	return set_disabled(c, arg, false);
}

static bool cmd_reconnect(PgSocket *c, const char *arg, const char *query)
{
	PgDatabase *db = NULL;
	if (*arg) {
		db = db_arg(c, arg, false, "reconnect");
		if (!db)
			return c->state != CL_JUSTFREE; /* false: the error could not be sent */
	}
	mark_close_needed(db);
	return send_simple(c, "RECONNECT");
}

static bool cmd_wait_close(PgSocket *c, const char *arg, const char *query)
{
	PgDatabase *db = NULL;
	if (*arg) {
		db = db_arg(c, arg, false, "wait in");
		if (!db)
			return c->state != CL_JUSTFREE; /* false: the error could not be sent */
	}
	if (close_needed_count(db) == 0)
		return send_simple(c, "WAIT_CLOSE");
	add_wait(c, WAIT_CLOSE, db);
	return true;
}

/* RELOAD and SHUTDOWN are the master's: an orphaned worker (doc/workers.md "When the master dies") has none. */
static bool no_master(PgSocket *c, const char *cmd)
{
	return admin_error(
	    c, "55000", "%s needs the master process, which is gone; start pgbouncer again to adopt this worker", cmd);
}

static bool cmd_reload(PgSocket *c, const char *arg, const char *query)
{
	if (wk.parent_master <= 0)
		return no_master(c, "RELOAD");
	Config probe;
	char err[CF_ERRMSG_LEN];
	const char *path = wk.cf.g.conffile ? wk.cf.g.conffile : wk.cf.path;
	config_init(&probe);
	bool ok = config_load(&probe, path, err, sizeof(err));
	config_free(&probe);
	if (!ok) {
		log_error("%s", err);
		return admin_error(c, "F0000", "RELOAD failed, see logs for additional details");
	}
	/*
	 * The master re-reads the file and has every worker reload once (this
	 * one too); the reply waits for that, so the next command sees it.
	 */
	log_info("RELOAD command issued");
	add_wait(c, WAIT_RELOAD, NULL);
	kill(wk.parent_master, SIGHUP);
	return true;
}

static bool cmd_shutdown(PgSocket *c, const char *arg, const char *query)
{
	/* the master runs shutdowns: it closes its listener copies and tells every worker */
	if (wk.parent_master <= 0)
		return no_master(c, "SHUTDOWN");
	if (!*arg) {
		log_info("SHUTDOWN command issued");
		/* no reply: the connection stays open until the process exits */
		kill(wk.parent_master, SIGQUIT);
		return true;
	}
	/* the command table let only WAIT_FOR_SERVERS and WAIT_FOR_CLIENTS through */
	bool servers = strcasecmp(arg, "WAIT_FOR_SERVERS") == 0;
	int sig = servers ? SIG_CONSOLE_SHUTDOWN_SERVERS : SIG_CONSOLE_SHUTDOWN_CLIENTS;
	log_info("SHUTDOWN %s command issued", servers ? "WAIT_FOR_SERVERS" : "WAIT_FOR_CLIENTS");
	/* the reply waits until the master's signal is back, so the next command sees the shutdown */
	kill(wk.parent_master, sig);
	add_wait(c, WAIT_SHUTDOWN, NULL);
	return true;
}

/*
 * TLS cannot be built after SET key=val of a key that is not itself a TLS
 * setting: if the old value builds it, the new one is the cause and is
 * taken back (false); else TLS settings set earlier are still incomplete,
 * and the new value stays (true).
 */
static bool set_tls_blocker(const char *key, const char *old, const char *val)
{
	char err[CF_ERRMSG_LEN];
	if (!config_set(&wk.cf, key, old, err, sizeof(err))) {
		log_warning("%s", err);
		return false;
	}
	if (worker_tls_reload(err, sizeof(err)))
		return false;
	if (!config_set(&wk.cf, key, val, err, sizeof(err))) {
		log_warning("%s", err);
		return false;
	}
	return true;
}

/* SET refused: PgBouncer's "SET failed", after a NOTICE with the reason (the setting and its range). */
static bool set_refused(PgSocket *c, const char *reason)
{
	log_warning("%s", reason);
	log_error("SET failed"); /* PgBouncer's line, as for any console error */
	if (wk.cf.g.log_pooler_errors)
		slog(LG_WARNING, c, "pooler error: SET failed");
	PktBuf pb;
	pktbuf_init(&pb, 128 + strlen(reason));
	pktbuf_write_notice(&pb, reason);
	pktbuf_write_error(&pb, "ERROR", "08P01", "SET failed");
	pktbuf_write_ready(&pb, 'I');
	return send_pktbuf(c, &pb);
}

/* What a SET that was taken changes beyond the value: the configuration's generation, logging, listeners. */
static void set_taken(const CfParam *param)
{
	wk.cf_gen++;
	if (config_param_is_log(param))
		worker_apply_log_settings();
	if (strcmp(param->name, "tcp_keepalive") == 0)
		worker_tune_listeners();
}

static bool cmd_set(PgSocket *c, const char *p, const char *query)
{
	char key[MAX_WORD], val[256];
	AdminParse r = admin_parse_set(p, key, sizeof(key), val, sizeof(val));
	if (r != ADMIN_PARSE_OK)
		return parse_error(c, r, query);

	if (fake_param(key)) {
		PktBuf pb;
		pktbuf_init(&pb, 64);
		pktbuf_write_notice(&pb, "SET ignored");
		pktbuf_write_command_complete(&pb, "SET");
		pktbuf_write_ready(&pb, 'I');
		return send_pktbuf(c, &pb);
	}
	if (!c->admin_user)
		return admin_error(c, NULL, "admin access needed");
	const CfParam *param = config_find_param(key);
	char err[CF_ERRMSG_LEN];
	if (!param) {
		log_error("unknown parameter: pgbouncer/%s", key); /* PgBouncer's line, then "SET failed" */
		return admin_error(c, NULL, "SET failed");
	}
	/*
	 * A TLS key is kept even when TLS cannot be built from it yet, as in
	 * PgBouncer: enabling TLS takes several SETs (mode, key, certificate),
	 * and the running TLS stays until they make a whole. auth_type (cert
	 * needs client certificates) is refused when it is what breaks TLS.
	 */
	bool tls_key = config_param_is_tls(param);
	bool needs_tls = tls_key || strcmp(param->name, "auth_type") == 0;
	char old[1024]; /* auth_type's, to take it back; a TLS string may be unset (NULL) */
	if (needs_tls && !tls_key && !config_format_value(&wk.cf, param, old, sizeof(old)))
		return admin_error(c, NULL, "SET failed");
	if (!param->reloadable)
		needs_tls = false; /* reported as set, changes nothing */
	else if (!config_set_checked(&wk.cf, key, val, err, sizeof(err)))
		return set_refused(c, err);
	bool tls_kept = false;
	if (needs_tls && !worker_tls_reload(err, sizeof(err))) {
		log_error("%s", err); /* as PgBouncer; the client gets the NOTICE below */
		tls_kept = true;
		if (!tls_key && !set_tls_blocker(key, old, val))
			return admin_error(c, NULL, "SET failed");
	}
	set_taken(param);
	/* the console's own worker (not the copies fanned out to the others) tells the master */
	if (param->reloadable && !c->is_internal)
		worker_tell_master_set(key, val, admin_fanout_missed(c)); /* the master passes it to those */
	char tag[400];
	snprintf(tag, sizeof(tag), "SET %s=%s", key, val);
	PktBuf pb;
	pktbuf_init(&pb, 128);
	if (tls_kept)
		pktbuf_write_notice(&pb, "TLS settings could not be applied, still using old configuration");
	pktbuf_write_command_complete(&pb, tag);
	pktbuf_write_ready(&pb, 'I');
	return send_pktbuf(c, &pb);
}

void admin_apply_set(const char *key, const char *val)
{
	const CfParam *param = config_find_param(key);
	char err[CF_ERRMSG_LEN];
	if (!param || !param->reloadable)
		return;
	if (!config_set_checked(&wk.cf, key, val, err, sizeof(err))) {
		log_warning("console SET %s, run while this worker started: not taken: %s", key, err);
		return;
	}
	if ((config_param_is_tls(param) || strcmp(param->name, "auth_type") == 0) &&
	    !worker_tls_reload(err, sizeof(err)))
		log_error("%s", err);
	set_taken(param);
	log_info("console SET %s=%s, run while this worker started: taken", key, val);
}

/* SHOW of a fake parameter: its canned value under its lower-cased name. */
static bool show_fake(PgSocket *c, const char *arg, const char *value)
{
	char name[MAX_WORD];
	size_t k;
	for (k = 0; arg[k] && k + 1 < sizeof(name); k++)
		name[k] = (char)tolower((unsigned char)arg[k]);
	name[k] = '\0';
	const char *names[] = {name};
	const char *v[] = {value};
	Reply r;
	reply_begin(&r, c, "T", names);
	reply_row(&r, v);
	return reply_end(&r, "SHOW");
}

/* ---- the console's commands and SHOW subjects ---- */

#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

/* Who may run a command or SHOW a subject. */
typedef enum Access {
	ACCESS_ADMIN, /* admins only: others get "admin access needed" */
	ACCESS_STATS, /* stats users and admins */
	ACCESS_PEER,  /* a peer's fan-out only (private socket, or inside a fan-out; commands: an admin on a private
	               * socket); others: invalid command */
} Access;

typedef struct ShowSubject {
	const char *name;
	bool (*show)(PgSocket *c, int variant); /* this worker's answer */
	int variant;                            /* passed to show(): SOCK_* flags, admin_write_stats()'s `which` */
	Access access;
	bool merged;       /* asked of every worker, answers merged by `merge`; false: this worker alone */
	FanoutMerge merge; /* FM_STATS: the peers answer STATS_RAW, `variant` is the `which`; FM_LISTS: LISTS_RAW */
	int help_line;     /* the SHOW HELP line listing it (from 1); 0: not listed */
} ShowSubject;

static bool show_help(PgSocket *c, int variant);

/* Every SHOW subject (SELECT is an alias), in SHOW HELP's order (doc/workers.md: the merges). */
static const ShowSubject show_subjects[] = {
    {"HELP", show_help, 0, ACCESS_STATS, .help_line = 1},
    {"CONFIG", show_config, 0, ACCESS_STATS, .help_line = 1},
    {"USERS", show_users, 0, ACCESS_STATS, .merged = true, .merge = FM_USERS, .help_line = 1},
    {"DATABASES", show_databases, 0, ACCESS_STATS, .merged = true, .merge = FM_DATABASES, .help_line = 1},
    {"POOLS", show_pools, 0, ACCESS_STATS, .merged = true, .merge = FM_POOLS, .help_line = 1},
    {"CLIENTS", show_sockets, SOCK_CLIENTS, ACCESS_STATS, .merged = true, .merge = FM_CONCAT, .help_line = 1},
    {"SERVERS", show_sockets, SOCK_SERVERS, ACCESS_STATS, .merged = true, .merge = FM_CONCAT, .help_line = 1},
    {"VERSION", show_version, 0, ACCESS_STATS, .help_line = 1},
    {"PEERS", show_peers, 0, ACCESS_STATS, .help_line = 2},
    {"PEER_POOLS", show_peer_pools, 0, ACCESS_STATS, .help_line = 2},
    {"WORKERS", show_workers, 0, ACCESS_STATS, .help_line = 3},
    {"SCALER", show_scaler, 0, ACCESS_STATS, .help_line = 3},
    {"FDS", show_fds, 0, ACCESS_ADMIN, .help_line = 4},
    {"SOCKETS", show_sockets, SOCK_CLIENTS | SOCK_SERVERS | SOCK_BUFFERS, ACCESS_STATS, .merged = true,
     .merge = FM_CONCAT, .help_line = 4},
    {"ACTIVE_SOCKETS", show_sockets, SOCK_CLIENTS | SOCK_SERVERS | SOCK_BUFFERS | SOCK_ONLY_ACTIVE, ACCESS_STATS,
     .merged = true, .merge = FM_CONCAT, .help_line = 4},
    {"LISTS", show_lists, 0, ACCESS_STATS, .merged = true, .merge = FM_LISTS, .help_line = 4},
    {"MEM", show_mem, 0, ACCESS_STATS, .merged = true, .merge = FM_MEM, .help_line = 4},
    {"STATE", show_state, 0, ACCESS_STATS, .merged = true, .merge = FM_STATE, .help_line = 4},
    {"DNS_HOSTS", show_dns_hosts, 0, ACCESS_STATS, .merged = true, .merge = FM_DNS, .help_line = 5},
    {"DNS_ZONES", show_dns_zones, 0, ACCESS_STATS, .help_line = 5},
    {"STATS", show_stats, 0, ACCESS_STATS, .merged = true, .merge = FM_STATS, .help_line = 6},
    {"STATS_TOTALS", show_stats, 1, ACCESS_STATS, .merged = true, .merge = FM_STATS, .help_line = 6},
    {"STATS_AVERAGES", show_stats, 2, ACCESS_STATS, .merged = true, .merge = FM_STATS, .help_line = 6},
    {"TOTALS", show_stats, 3, ACCESS_STATS, .merged = true, .merge = FM_STATS, .help_line = 6},
    {"STATS_RAW", show_stats_raw, 0, ACCESS_PEER},
    {"LISTS_RAW", show_lists, 1, ACCESS_PEER},
};

/* What follows a command's name. */
typedef enum ArgKind {
	ARG_NONE,      /* nothing; an argument is an invalid command */
	ARG_OPT_DB,    /* [<db>] */
	ARG_DB,        /* <db>; without it: "a database is required" */
	ARG_CLIENT_ID, /* <client_id>; without it: invalid command */
	ARG_OPT_MODE,  /* nothing or one of the command's `modes`; anything else: invalid command */
	ARG_SUBJECT,   /* a SHOW subject or fake parameter; without it: invalid command */
	ARG_SET,       /* key = value: the rest of the line, parsed by the command */
} ArgKind;

typedef struct AdminCommand {
	const char *name;
	ArgKind arg;
	bool (*run)(PgSocket *c, const char *arg, const char *query);
	Access access;     /* SET: the command itself refuses real keys to stats users (fake ones are theirs) */
	bool fanout;       /* applied on every worker too, merged as FM_COMMAND (SHOW: per subject) */
	bool waits;        /* may wait long for its reply: a peer is left out only once it stops living */
	const char *modes; /* ARG_OPT_MODE: the words accepted, '|'-separated */
	bool alias;        /* not listed by SHOW HELP */
	bool state;        /* may change what workers started later take over (worker/admin_state.h) */
	bool issued;       /* logs "NAME ['db'] command issued" once, by the user's console, before running */
} AdminCommand;

static bool cmd_show(PgSocket *c, const char *arg, const char *query);

/* Every console command, in SHOW HELP's order. RELOAD and SHUTDOWN reach the workers through the master. */
static const AdminCommand admin_commands[] = {
    {"SHOW", ARG_SUBJECT, cmd_show, ACCESS_STATS},
    {"SELECT", ARG_SUBJECT, cmd_show, ACCESS_STATS, .alias = true},
    {"SET", ARG_SET, cmd_set, ACCESS_STATS, .fanout = true},
    {"RELOAD", ARG_NONE, cmd_reload, ACCESS_ADMIN},
    {"PAUSE", ARG_OPT_DB, cmd_pause, ACCESS_ADMIN, .fanout = true, .state = true, .waits = true, .issued = true},
    {"RESUME", ARG_OPT_DB, cmd_resume, ACCESS_ADMIN, .fanout = true, .state = true, .issued = true},
    {"DISABLE", ARG_DB, cmd_disable, ACCESS_ADMIN, .fanout = true, .state = true, .issued = true},
    {"ENABLE", ARG_DB, cmd_enable, ACCESS_ADMIN, .fanout = true, .state = true, .issued = true},
    {"RECONNECT", ARG_OPT_DB, cmd_reconnect, ACCESS_ADMIN, .fanout = true, .issued = true},
    {"KILL", ARG_OPT_DB, cmd_kill, ACCESS_ADMIN, .fanout = true, .state = true, .issued = true},
    {"KILL_CLIENT", ARG_CLIENT_ID, cmd_kill_client, ACCESS_ADMIN, .fanout = true},
    {"SUSPEND", ARG_NONE, cmd_suspend, ACCESS_ADMIN, .fanout = true, .state = true, .waits = true, .issued = true},
    {"SHUTDOWN", ARG_OPT_MODE, cmd_shutdown, ACCESS_ADMIN, .modes = "WAIT_FOR_SERVERS|WAIT_FOR_CLIENTS"},
    {"WAIT_CLOSE", ARG_OPT_DB, cmd_wait_close, ACCESS_ADMIN, .fanout = true, .waits = true, .issued = true},
    {"DISABLE_LATER", ARG_DB, cmd_disable_later, ACCESS_PEER, .alias = true, .state = true},
    {"RESUME_PART", ARG_OPT_DB, cmd_resume_part, ACCESS_PEER, .alias = true, .state = true},
};

/* SHOW HELP's text after a command's name, by its argument kind. */
static const char *const arg_usage[] = {
    [ARG_NONE] = "",     [ARG_OPT_DB] = " [<db>]", [ARG_DB] = " <db>",       [ARG_CLIENT_ID] = " <client_id>",
    [ARG_OPT_MODE] = "", [ARG_SUBJECT] = "",       [ARG_SET] = " key = arg",
};

typedef struct HelpText {
	char buf[2048];
	size_t len;
} HelpText;

static void help_add(HelpText *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void help_add(HelpText *h, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(h->buf + h->len, sizeof(h->buf) - h->len, fmt, ap);
	va_end(ap);
	if (n > 0)
		h->len = h->len + (size_t)n < sizeof(h->buf) ? h->len + (size_t)n : sizeof(h->buf) - 1;
}

/* "\tSHOW A|B|C" per help line, each listed subject once. */
static void help_subjects(HelpText *h, const char *cmd)
{
	int line = 0;
	for (size_t k = 0; k < N_ELEMS(show_subjects); k++) {
		const ShowSubject *s = &show_subjects[k];
		if (!s->help_line)
			continue;
		if (s->help_line != line)
			help_add(h, "\n\t%s %s", cmd, s->name);
		else
			help_add(h, "|%s", s->name);
		line = s->help_line;
	}
}

/*
 * SHOW HELP: a NOTICE whose detail lists the commands, one a line after a
 * tab, from the two tables (the shape of PgBouncer's "Console usage").
 */
static bool show_help(PgSocket *c, int variant)
{
	HelpText h = {.len = 0};
	for (size_t k = 0; k < N_ELEMS(admin_commands); k++) {
		const AdminCommand *cmd = &admin_commands[k];
		if (cmd->alias)
			continue;
		if (cmd->arg == ARG_SUBJECT) {
			help_subjects(&h, cmd->name);
			continue;
		}
		help_add(&h, "\n\t%s%s", cmd->name, arg_usage[cmd->arg]);
		if (cmd->arg == ARG_OPT_MODE)
			help_add(&h, "\n\t%s %s", cmd->name, cmd->modes);
	}
	PktBuf pb;
	pktbuf_init(&pb, 1024);
	pktbuf_write_notice_detail(&pb, "Console usage", h.buf);
	pktbuf_write_command_complete(&pb, "SHOW");
	pktbuf_write_ready(&pb, 'I');
	return send_pktbuf(c, &pb);
}

static bool may_run(const PgSocket *c, Access access)
{
	return access != ACCESS_ADMIN || c->admin_user;
}

/* SHOW x / SELECT x. */
static bool cmd_show(PgSocket *c, const char *arg, const char *query)
{
	const char *fake = fake_param(arg);
	if (fake)
		return show_fake(c, arg, fake);
	const ShowSubject *s = NULL;
	for (size_t k = 0; k < N_ELEMS(show_subjects) && !s; k++)
		if (strcasecmp(arg, show_subjects[k].name) == 0)
			s = &show_subjects[k];
	if (!s || (s->access == ACCESS_PEER && !c->is_private && !admin_console_busy(c)))
		return invalid_command(c, query);
	if (!may_run(c, s->access))
		return admin_error(c, NULL, "admin access needed");
	if (!s->merged || !admin_fanout_wanted(c))
		return s->show(c, s->variant);
	/* the other workers get the query (STATS_RAW for the stats), this worker answers into the fan-out */
	if (s->merge == FM_STATS) {
		admin_fanout_begin(c, "SHOW STATS_RAW", FM_STATS, s->variant, false, NULL);
		(void)show_stats_raw(c, 0);
	} else if (s->merge == FM_LISTS) {
		admin_fanout_begin(c, "SHOW LISTS_RAW", FM_LISTS, 0, false, NULL);
		(void)show_lists(c, 1);
	} else {
		admin_fanout_begin(c, query, s->merge, 0, false, NULL);
		(void)s->show(c, s->variant);
	}
	if (c->state == CL_JUSTFREE)
		return false;
	admin_fanout_dispatch(c);
	return true;
}

/* Whether `word` is one of the '|'-separated `words` (case-insensitive). */
static bool word_in(const char *word, const char *words)
{
	size_t n = strlen(word);
	for (const char *p = words; *p; p += strcspn(p, "|"), p += *p == '|') {
		if (strcspn(p, "|") == n && strncasecmp(p, word, n) == 0)
			return true;
	}
	return false;
}

/*
 * Whether the other end of peer connection c has closed: the console's
 * worker gave up on this worker (it left it out, or its console went away)
 * and reads no answer any more. The bytes of the query being run are in
 * c's buffer already; what the socket holds behind them is EOF then.
 */
static bool peer_gave_up(const PgSocket *c)
{
	uint8_t b;
	ssize_t n = recv(c->sb.fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
	return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Run `cmd` if the console may, with an argument of its kind. */
static bool run_command(PgSocket *c, const AdminCommand *cmd, const char *arg, const char *query)
{
	/*
	 * A state command from another worker's console that has given up on
	 * this worker is stale: the master hands this worker the state the
	 * console's commands left instead (CH_CONSOLE_SYNC, doc/workers.md
	 * "Console state"), which a late run must not undo.
	 */
	if (cmd->state && c->is_internal && !c->from_master && c->sb.fd >= 0 && peer_gave_up(c)) {
		log_info("console command \"%s\" came after its console had left this worker out: not run, the "
		         "pooler's state comes from the master",
		         query);
		disconnect_client(c, false, "console left this worker out");
		return false;
	}
	if (cmd->access == ACCESS_PEER && (!c->is_private || !c->admin_user))
		return invalid_command(c, query);
	if (!may_run(c, cmd->access))
		return admin_error(c, NULL, "admin access needed");
	switch (cmd->arg) {
	case ARG_NONE:
		if (*arg)
			return invalid_command(c, query);
		break;
	case ARG_DB:
		if (!*arg)
			return admin_error(c, NULL, "a database is required");
		break;
	case ARG_CLIENT_ID:
		/* no id is no number either (PgBouncer's answer) */
		if (!*arg)
			return admin_error(c, NULL, "invalid client pointer supplied");
		break;
	case ARG_SUBJECT:
		if (!*arg)
			return invalid_command(c, query);
		break;
	case ARG_OPT_MODE:
		if (*arg && !word_in(arg, cmd->modes))
			return invalid_command(c, query);
		break;
	case ARG_OPT_DB:
	case ARG_SET:
		break;
	}
	/* once, by the console the user typed it in (PgBouncer's line), not by the peers it reaches */
	if (cmd->issued && !c->is_private) {
		if (*arg)
			log_info("%s '%s' command issued", cmd->name, arg);
		else
			log_info("%s command issued", cmd->name);
	}
	/* a peer console is an admin: only an admin's command may reach it (not a stats user's fake SET) */
	bool fanout = cmd->fanout && c->admin_user && admin_fanout_wanted(c);
	if (fanout) {
		/* this worker runs it first: if it refuses, the others never get it */
		char db[MAX_WORD];
		char *undo = undo_of(query, db, sizeof(db));
		FanoutCommand fc = {.undo = undo, .state = cmd->state};
		if (cmd->run == cmd_kill && !*arg)
			fc.follow = FOLLOW_KILL;
		else if (cmd->run == cmd_disable) {
			fc.follow = FOLLOW_DISABLE;
			fc.db = arg;
		}
		admin_fanout_begin(c, query, FM_COMMAND, 0, cmd->waits, &fc);
		free(undo);
	}
	/* the console's own worker tells the master; the others run the command as its peers */
	bool report = cmd->state && !(c->is_private && !c->from_master);
	bool ok = cmd->run(c, arg, query);
	if (report)
		admin_state_report();
	/* the workers it does not reach (still starting, say) get the state from the master */
	if (report && !fanout)
		admin_state_left_out(admin_fanout_missed(c));
	if (ok && fanout)
		admin_fanout_dispatch(c);
	return ok;
}

/* One console command. Returns false only if the console was closed. */
bool admin_handle_query(PgSocket *c, const char *query)
{
	char word[16], arg[MAX_WORD] = "";
	const char *p = query;
	wk.now = get_time_usec();
	log_debug("got admin query: %s", query); /* PgBouncer's words */

	AdminParse r = admin_read_ident(&p, word, sizeof(word));
	if (r != ADMIN_PARSE_OK)
		return parse_error(c, r, query);
	const AdminCommand *cmd = NULL;
	for (size_t k = 0; k < N_ELEMS(admin_commands) && !cmd; k++)
		if (strcasecmp(word, admin_commands[k].name) == 0)
			cmd = &admin_commands[k];
	if (cmd && cmd->arg == ARG_SET)
		return run_command(c, cmd, p, query);
	r = admin_parse_arg(p, arg, sizeof(arg));
	if (r != ADMIN_PARSE_OK)
		return parse_error(c, r, query);
	if (!cmd)
		return invalid_command(c, query);
	return run_command(c, cmd, arg, query);
}
