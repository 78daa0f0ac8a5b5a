/*
 * The admin console: the "pgbouncer" pseudo-database. Parses one command
 * per Query, checks privileges, and answers SHOW commands with the exact
 * columns of spec/admin.md; process-control commands act on the worker.
 */
#include "config.h"

#include <ctype.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/pktbuf.h"
#include "common/util.h"
#include "worker/worker.h"

void worker_close_idle_servers(void);
void worker_start_shutdown(RunState mode);

/* ---- reply helpers ---- */

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
	bool ok = sbuf_send(&r->c->sb, r->pb.buf, r->pb.len);
	pktbuf_free(&r->pb);
	return ok;
}

static bool send_simple(PgSocket *c, const char *tag)
{
	PktBuf pb;
	pktbuf_init(&pb, 64);
	pktbuf_write_command_complete(&pb, tag);
	pktbuf_write_ready(&pb, 'I');
	bool ok = sbuf_send(&c->sb, pb.buf, pb.len);
	pktbuf_free(&pb);
	return ok;
}

static bool admin_error(PgSocket *c, const char *sqlstate, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool admin_error(PgSocket *c, const char *sqlstate, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	log_error("%s", msg);
	client_send_error(c, false, sqlstate ? sqlstate : "08P01", "%s", msg);
	return true;
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

static bool show_version(PgSocket *c)
{
	Reply r;
	static const char *const names[] = {"version"};
	reply_begin(&r, c, "T", names);
	const char *v[] = {"PgBouncer " PACKAGE_VERSION};
	reply_row(&r, v);
	return reply_end(&r, "SHOW");
}

static bool show_help(PgSocket *c)
{
	PktBuf pb;
	pktbuf_init(&pb, 1024);
	pktbuf_write_notice_detail(&pb, "Console usage",
	                           "\n\tSHOW HELP|CONFIG|USERS|DATABASES|POOLS|CLIENTS|SERVERS|USERS|VERSION\n"
	                           "\tSHOW PEERS|PEER_POOLS\n"
	                           "\tSHOW FDS|SOCKETS|ACTIVE_SOCKETS|LISTS|MEM|STATE\n"
	                           "\tSHOW DNS_HOSTS|DNS_ZONES\n"
	                           "\tSHOW STATS|STATS_TOTALS|STATS_AVERAGES|TOTALS\n"
	                           "\tSET key = arg\n"
	                           "\tRELOAD\n"
	                           "\tPAUSE [<db>]\n"
	                           "\tRESUME [<db>]\n"
	                           "\tDISABLE <db>\n"
	                           "\tENABLE <db>\n"
	                           "\tRECONNECT [<db>]\n"
	                           "\tKILL [<db>]\n"
	                           "\tKILL_CLIENT <client_id>\n"
	                           "\tSUSPEND\n"
	                           "\tSHUTDOWN\n"
	                           "\tSHUTDOWN WAIT_FOR_SERVERS|WAIT_FOR_CLIENTS\n"
	                           "\tWAIT_CLOSE [<db>]");
	pktbuf_write_command_complete(&pb, "SHOW");
	pktbuf_write_ready(&pb, 'I');
	bool ok = sbuf_send(&c->sb, pb.buf, pb.len);
	pktbuf_free(&pb);
	return ok;
}

static bool show_config(PgSocket *c)
{
	Reply r;
	static const char *const names[] = {"key", "value", "default", "changeable"};
	reply_begin(&r, c, "TTTT", names);
	for (const CfParam *p = cf_params; p->name; p++) {
		if (p->hidden)
			continue;
		char val[1024], def[1024];
		bool has_val = config_format_value(&wk.cf, p, val, sizeof(val));
		bool has_def = config_format_default(p, def, sizeof(def));
		const char *v[] = {p->name, has_val ? val : NULL, has_def ? def : NULL, p->reloadable ? "yes" : "no"};
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

static bool show_databases(PgSocket *c)
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
		int pool_size = db->cf.pool_size != CF_UNSET ? db->cf.pool_size : wk.cf.g.default_pool_size;
		int minp = db->cf.min_pool_size != CF_UNSET ? db->cf.min_pool_size : wk.cf.g.min_pool_size;
		int resv = db->cf.reserve_pool_size != CF_UNSET ? db->cf.reserve_pool_size : wk.cf.g.reserve_pool_size;
		int life =
		    db->cf.server_lifetime > 0 ? db->cf.server_lifetime : (int)(wk.cf.g.server_lifetime / USEC_PER_SEC);
		int maxc = db->cf.max_db_connections > 0 ? db->cf.max_db_connections : wk.cf.g.max_db_connections;
		int maxcc = db->cf.max_db_client_connections > 0 ? db->cf.max_db_client_connections
		                                                 : wk.cf.g.max_db_client_connections;
		const char *v[] = {
		    db->name,
		    db->admin ? NULL : db->cf.host,
		    fmt_int(db->admin ? wk.cf.g.listen_port : (db->cf.port > 0 ? db->cf.port : 5432)),
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

static bool show_pools(PgSocket *c)
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
			cl_waiting++;
			usec_t since = cl->wait_start ? cl->wait_start : cl->connect_time;
			if (wk.now - since > maxwait)
				maxwait = wk.now - since;
		}
		const char *v[] = {p->db->name,
		                   p->user->name,
		                   fmt_int(list_count(&p->active_clients)),
		                   fmt_int(cl_waiting),
		                   fmt_int(list_count(&p->active_cancel_req)),
		                   fmt_int(list_count(&p->waiting_cancel_req)),
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
	char addr[80], laddr[80];
	int port, lport;
	format_addr(&s->remote, addr, sizeof(addr), &port);
	format_addr(&s->local, laddr, sizeof(laddr), &lport);
	usec_t wait = 0;
	if (!s->is_server && (s->state == CL_WAITING || s->state == CL_WAITING_LOGIN) && s->wait_start)
		wait = wk.now - s->wait_start;
	const char *state = state_name(s->state, sockets);
	if (!sockets && !s->is_server && s->state == CL_ACTIVE && !s->link)
		state = "idle";
	int app = var_index("application_name");
	const char *appname = "";
	if (!s->is_server && s->vars[app].value)
		appname = s->vars[app].value;
	else if (s->is_server && s->link && s->link->vars[app].value)
		appname = s->link->vars[app].value;
	int remote_pid = 0;
	if (s->is_server)
		remote_pid = (int)s->backend_pid;
	else if (s->is_unix)
		remote_pid = s->peer_pid;
	const char *db = s->pool ? s->pool->db->name : (s->db ? s->db->name : "(nodb)");
	const char *user = s->login_user ? s->login_user->name : (s->pool ? s->pool->user->name : "(nouser)");
	const char *v[28] = {s->is_server ? "S" : "C",
	                     user,
	                     db,
	                     "none",
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
	                     "",
	                     appname,
	                     fmt_int(0),
	                     fmt_int((long long)s->id)};
	if (sockets) {
		v[21] = fmt_int(s->sb.end);
		v[22] = fmt_int(s->sb.pos);
		v[23] = fmt_int(s->sb.pkt_remain);
		v[24] = fmt_int(s->sb.send_pos);
		v[25] = fmt_int(s->sb.send_end - s->sb.send_pos);
		v[26] = fmt_int(s->sb.end - s->sb.pos);
		v[27] = fmt_int(s->sb.size - s->sb.end);
	}
	reply_row(r, v);
}

static bool show_sockets_generic(PgSocket *c, bool clients, bool servers, bool sockets, bool only_active)
{
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

static bool show_users(PgSocket *c)
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
		char ps[16] = "", rs[16] = "";
		if (u->cf && u->cf->pool_size != CF_UNSET)
			snprintf(ps, sizeof(ps), "%9d", u->cf->pool_size);
		if (u->cf && u->cf->reserve_pool_size != CF_UNSET)
			snprintf(rs, sizeof(rs), "%9d", u->cf->reserve_pool_size);
		int maxc = u->cf && u->cf->max_user_connections > 0 ? u->cf->max_user_connections
		                                                    : wk.cf.g.max_user_connections;
		int maxcc = u->cf && u->cf->max_user_client_connections > 0 ? u->cf->max_user_client_connections
		                                                            : wk.cf.g.max_user_client_connections;
		const char *v[] = {
		    u->name,
		    ps,
		    rs,
		    u->cf && u->cf->pool_mode != CF_UNSET ? config_enum_name(cf_pool_modes, u->cf->pool_mode) : NULL,
		    fmt_int(maxc),
		    fmt_int(u->server_count),
		    fmt_int(maxcc),
		    fmt_int(u->client_count)};
		reply_row(&r, v);
	}
	return reply_end(&r, "SHOW");
}

/* Sum the stats of every pool of each database, in database order. */
typedef struct DbStats {
	const char *name;
	PgStats total, older, newer;
} DbStats;

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
		const PgStats *src[3] = {&p->stats, &p->older_stats, &p->newer_stats};
		PgStats *dst[3] = {&d->total, &d->older, &d->newer};
		for (int k = 0; k < 3; k++) {
			dst[k]->server_assignment_count += src[k]->server_assignment_count;
			dst[k]->xact_count += src[k]->xact_count;
			dst[k]->query_count += src[k]->query_count;
			dst[k]->client_bytes += src[k]->client_bytes;
			dst[k]->server_bytes += src[k]->server_bytes;
			dst[k]->xact_time += src[k]->xact_time;
			dst[k]->query_time += src[k]->query_time;
			dst[k]->wait_time += src[k]->wait_time;
			dst[k]->client_parse_count += src[k]->client_parse_count;
			dst[k]->server_parse_count += src[k]->server_parse_count;
			dst[k]->bind_count += src[k]->bind_count;
		}
	}
	*out = arr;
	return n;
}

/* Averages over the last complete stats_period. */
static void averages(const DbStats *d, long long avg[11])
{
	double secs = wk.cf.g.stats_period > 0 ? wk.cf.g.stats_period : 60;
	const PgStats *a = &d->older, *b = &d->newer;
	uint64_t dx = b->xact_count - a->xact_count, dq = b->query_count - a->query_count;
	uint64_t da = b->server_assignment_count - a->server_assignment_count;
	avg[0] = (long long)(da / secs);
	avg[1] = (long long)(dx / secs);
	avg[2] = (long long)(dq / secs);
	avg[3] = (long long)((b->client_bytes - a->client_bytes) / secs);
	avg[4] = (long long)((b->server_bytes - a->server_bytes) / secs);
	avg[5] = dx ? (long long)((b->xact_time - a->xact_time) / dx) : 0;
	avg[6] = dq ? (long long)((b->query_time - a->query_time) / dq) : 0;
	avg[7] = da ? (long long)((b->wait_time - a->wait_time) / da) : 0;
	avg[8] = (long long)((b->client_parse_count - a->client_parse_count) / secs);
	avg[9] = (long long)((b->server_parse_count - a->server_parse_count) / secs);
	avg[10] = (long long)((b->bind_count - a->bind_count) / secs);
}

static void totals(const PgStats *t, long long tot[11])
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
}

static bool show_stats(PgSocket *c, int which)
{
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
	                                   "avg_bind_count"};
	static const char *const tot_names[] = {"database",           "server_assignment_count",
	                                        "xact_count",         "query_count",
	                                        "bytes_received",     "bytes_sent",
	                                        "xact_time",          "query_time",
	                                        "wait_time",          "client_parse_count",
	                                        "server_parse_count", "bind_count"};
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
	                                        "avg_bind_count"};
	Reply r;
	if (which == 0)
		reply_begin(&r, c, "TNNNNNNNNNNNNNNNNNNNNNN", full);
	else
		reply_begin(&r, c, "TNNNNNNNNNNN", which == 1 ? tot_names : avg_names);
	DbStats *arr;
	int n = collect_stats(&arr);
	for (int k = 0; k < n; k++) {
		long long tot[11], avg[11];
		totals(&arr[k].total, tot);
		averages(&arr[k], avg);
		const char *v[23];
		v[0] = arr[k].name;
		int col = 1;
		if (which != 2)
			for (int m = 0; m < 11; m++)
				v[col++] = fmt_int(tot[m]);
		if (which != 1)
			for (int m = 0; m < 11; m++)
				v[col++] = fmt_int(avg[m]);
		reply_row(&r, v);
	}
	free(arr);
	return reply_end(&r, "SHOW");
}

static bool show_totals(PgSocket *c)
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
	                                   "avg_ps_bind_count"};
	DbStats *arr, all = {0};
	int n = collect_stats(&arr);
	for (int k = 0; k < n; k++) {
		PgStats *src[3] = {&arr[k].total, &arr[k].older, &arr[k].newer};
		PgStats *dst[3] = {&all.total, &all.older, &all.newer};
		for (int m = 0; m < 3; m++) {
			uint64_t *s = (uint64_t *)src[m], *d = (uint64_t *)dst[m];
			for (size_t f = 0; f < sizeof(PgStats) / sizeof(uint64_t); f++)
				d[f] += s[f];
		}
	}
	free(arr);
	long long tot[11], avg[11];
	totals(&all.total, tot);
	averages(&all, avg);
	Reply r;
	reply_begin(&r, c, "TN", names);
	for (int k = 0; k < 22; k++) {
		const char *v[] = {rows[k], fmt_int(k < 11 ? tot[k] : avg[k - 11])};
		reply_row(&r, v);
	}
	return reply_end(&r, "SHOW");
}

static bool show_lists(PgSocket *c)
{
	static const char *const names[] = {"list", "items"};
	int dbs = list_count(&wk.databases), users = list_count(&wk.users), pools = list_count(&wk.pools);
	int used_clients = 0, used_servers = 0;
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		used_clients +=
		    pool_client_count(p) + list_count(&p->active_cancel_req) + list_count(&p->waiting_cancel_req);
		used_servers += pool_server_count(p) + list_count(&p->active_cancel_servers);
	}
	const char *rows[][2] = {{"databases", fmt_int(dbs)},
	                         {"users", fmt_int(users)},
	                         {"peers", fmt_int(wk.cf.n_peers)},
	                         {"pools", fmt_int(pools)},
	                         {"peer_pools", fmt_int(0)},
	                         {"free_clients", fmt_int(0)},
	                         {"used_clients", fmt_int(used_clients)},
	                         {"login_clients", fmt_int(list_count(&wk.login_clients))},
	                         {"free_servers", fmt_int(0)},
	                         {"used_servers", fmt_int(used_servers)},
	                         {"dns_names", fmt_int(0)},
	                         {"dns_zones", fmt_int(0)},
	                         {"dns_queries", fmt_int(0)},
	                         {"dns_pending", fmt_int(0)}};
	Reply r;
	reply_begin(&r, c, "Ti", names);
	for (size_t k = 0; k < sizeof(rows) / sizeof(rows[0]); k++)
		reply_row(&r, rows[k]);
	return reply_end(&r, "SHOW");
}

static bool show_state(PgSocket *c)
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

static bool show_mem(PgSocket *c)
{
	static const char *const names[] = {"name", "size", "used", "free", "memtotal"};
	Reply r;
	reply_begin(&r, c, "Tiiii", names);
	int nclients = 0, nservers = 0;
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		nclients += pool_client_count(p);
		nservers += pool_server_count(p);
	}
	nclients += list_count(&wk.login_clients);
	struct {
		const char *name;
		size_t size;
		int used;
	} caches[] = {{"user_cache", sizeof(PgUser), list_count(&wk.users)},
	              {"db_cache", sizeof(PgDatabase), list_count(&wk.databases)},
	              {"pool_cache", sizeof(PgPool), list_count(&wk.pools)},
	              {"server_cache", sizeof(PgSocket), nservers},
	              {"client_cache", sizeof(PgSocket), nclients}};
	for (size_t k = 0; k < sizeof(caches) / sizeof(caches[0]); k++) {
		const char *v[] = {caches[k].name, fmt_int((long long)caches[k].size), fmt_int(caches[k].used),
		                   fmt_int(0), fmt_int((long long)caches[k].size * caches[k].used)};
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

static bool show_peers(PgSocket *c)
{
	static const char *const names[] = {"peer_id", "host", "port", "pool_size"};
	Reply r;
	reply_begin(&r, c, "iTii", names);
	for (int k = 0; k < wk.cf.n_peers; k++) {
		const CfPeer *p = &wk.cf.peers[k];
		const char *v[] = {fmt_int(p->id), p->host, fmt_int(p->port),
		                   fmt_int(p->pool_size != CF_UNSET ? p->pool_size : wk.cf.g.default_pool_size)};
		reply_row(&r, v);
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

#define MAX_WORD 64

/* Read a word or a double-quoted identifier. Returns false on syntax error. */
static bool read_ident(const char **pp, char *out, size_t outlen, bool *too_long)
{
	const char *p = *pp;
	size_t n = 0;
	*too_long = false;
	while (isspace((unsigned char)*p))
		p++;
	if (*p == '"') {
		p++;
		for (;;) {
			if (!*p)
				return false;
			if (*p == '"') {
				if (p[1] == '"') {
					p++;
				} else {
					p++;
					break;
				}
			}
			if (n + 1 >= outlen) {
				*too_long = true;
				return false;
			}
			out[n++] = *p++;
		}
	} else {
		while (isalnum((unsigned char)*p) || *p == '_') {
			if (n + 1 >= outlen) {
				*too_long = true;
				return false;
			}
			out[n++] = *p++;
		}
		if (n == 0)
			return false;
	}
	out[n] = '\0';
	*pp = p;
	return true;
}

static bool at_end(const char *p)
{
	while (isspace((unsigned char)*p))
		p++;
	if (*p == ';')
		p++;
	while (isspace((unsigned char)*p))
		p++;
	return *p == '\0';
}

static bool need_admin(PgSocket *c)
{
	if (c->admin_user)
		return true;
	admin_error(c, NULL, "admin access needed");
	return false;
}

static PgDatabase *find_db_arg(PgSocket *c, const char *name)
{
	PgDatabase *db = db_find(name);
	if (!db)
		db = db_register_auto(name);
	if (!db)
		admin_error(c, NULL, "no such database: %s", name);
	return db;
}

static int servers_in_use(PgDatabase *only)
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

void admin_pause_done_check(void)
{
	PgSocket *c = wk.pause_waiter;
	if (!c || c->state == CL_JUSTFREE)
		return;
	if (wk.pause_mode == P_PAUSE && servers_in_use(NULL) == 0) {
		wk.pause_waiter = NULL;
		if (!send_simple(c, "PAUSE"))
			disconnect_client(c, false, "client send failed");
	} else if (wk.pause_mode == P_SUSPEND) {
		wk.pause_waiter = NULL;
		if (!send_simple(c, "SUSPEND"))
			disconnect_client(c, false, "client send failed");
	}
}

static int close_needed_count(PgDatabase *only)
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

/* WAIT_CLOSE waiters: clients with pending_admin_cmd set (1 = all dbs, db pointer kept in cancel_target). */
void admin_wait_close_check(void)
{
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		if (!p->db->admin)
			continue;
		List *j;
		list_for_each(j, &p->active_clients)
		{
			PgSocket *c = container_of(j, PgSocket, node);
			if (c->pending_admin_cmd != 1)
				continue;
			if (close_needed_count((PgDatabase *)c->cancel_target) == 0) {
				c->pending_admin_cmd = 0;
				c->cancel_target = NULL;
				if (!send_simple(c, "WAIT_CLOSE"))
					disconnect_client(c, false, "client send failed");
				else
					sbuf_continue(&c->sb);
			}
		}
	}
}

static void mark_close_needed(PgDatabase *only)
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
				if (s->state == SV_IDLE || s->state == SV_USED)
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
				if (s->id == id)
					return s;
			}
		}
	}
	return NULL;
}

static bool cmd_set(PgSocket *c, const char *p, const char *query)
{
	char key[MAX_WORD], val[256];
	bool too_long;
	if (!read_ident(&p, key, sizeof(key), &too_long))
		return too_long ? admin_error(c, NULL, "bad arguments")
		                : admin_error(c, NULL, "invalid command '%s', use SHOW HELP;", query);
	while (isspace((unsigned char)*p))
		p++;
	if (*p == '=')
		p++;
	else if (strncasecmp(p, "to", 2) == 0 && isspace((unsigned char)p[2]))
		p += 2;
	else
		return admin_error(c, NULL, "invalid command '%s', use SHOW HELP;", query);
	while (isspace((unsigned char)*p))
		p++;
	size_t n = 0;
	if (*p == '\'') {
		p++;
		for (;;) {
			if (!*p)
				return admin_error(c, NULL, "invalid command '%s', use SHOW HELP;", query);
			if (*p == '\'') {
				if (p[1] == '\'')
					p++;
				else {
					p++;
					break;
				}
			}
			if (n + 1 >= sizeof(val))
				return admin_error(c, NULL, "bad arguments");
			val[n++] = *p++;
		}
		val[n] = '\0';
	} else if (!read_ident(&p, val, sizeof(val), &too_long)) {
		return too_long ? admin_error(c, NULL, "bad arguments")
		                : admin_error(c, NULL, "invalid command '%s', use SHOW HELP;", query);
	}
	if (!at_end(p))
		return admin_error(c, NULL, "invalid command '%s', use SHOW HELP;", query);

	if (fake_param(key)) {
		PktBuf pb;
		pktbuf_init(&pb, 64);
		pktbuf_write_notice(&pb, "SET ignored");
		pktbuf_write_command_complete(&pb, "SET");
		pktbuf_write_ready(&pb, 'I');
		bool ok = sbuf_send(&c->sb, pb.buf, pb.len);
		pktbuf_free(&pb);
		return ok;
	}
	if (!need_admin(c))
		return true;
	const CfParam *param = config_find_param(key);
	char err[CF_ERRMSG_LEN];
	if (!param)
		return admin_error(c, NULL, "SET failed");
	if (param->reloadable && !config_set(&wk.cf, key, val, err, sizeof(err))) {
		log_warning("%s", err);
		return admin_error(c, NULL, "SET failed");
	}
	char tag[400];
	snprintf(tag, sizeof(tag), "SET %s=%s", key, val);
	return send_simple(c, tag);
}

bool admin_handle_query(PgSocket *c, const char *query)
{
	char cmd[MAX_WORD], arg[MAX_WORD] = "";
	const char *p = query;
	bool too_long, has_arg = false;
	wk.now = get_time_usec();
	log_debug("admin command: %s", query);

	if (!read_ident(&p, cmd, 16, &too_long)) {
		if (too_long)
			return admin_error(c, NULL, "bad arguments") || true;
		return admin_error(c, NULL, "invalid command '%s', use SHOW HELP;", query);
	}
	if (strcasecmp(cmd, "SET") == 0)
		return cmd_set(c, p, query);
	if (!at_end(p)) {
		if (!read_ident(&p, arg, sizeof(arg), &too_long)) {
			if (too_long)
				return admin_error(c, NULL, "bad arguments");
			return admin_error(c, NULL, "invalid command '%s', use SHOW HELP;", query);
		}
		has_arg = true;
		if (!at_end(p))
			return admin_error(c, NULL, "invalid command '%s', use SHOW HELP;", query);
	}

	if (strcasecmp(cmd, "SHOW") == 0 || strcasecmp(cmd, "SELECT") == 0) {
		if (!has_arg)
			return admin_error(c, NULL, "invalid command '%s', use SHOW HELP;", query);
		const char *fake = fake_param(arg);
		if (fake) {
			Reply r;
			const char *names[] = {arg};
			for (char *q = (char *)names[0]; *q; q++)
				*q = (char)tolower((unsigned char)*q);
			reply_begin(&r, c, "T", names);
			const char *v[] = {fake};
			reply_row(&r, v);
			return reply_end(&r, "SHOW");
		}
		if (strcasecmp(arg, "HELP") == 0)
			return show_help(c);
		if (strcasecmp(arg, "VERSION") == 0)
			return show_version(c);
		if (strcasecmp(arg, "CONFIG") == 0)
			return show_config(c);
		if (strcasecmp(arg, "DATABASES") == 0)
			return show_databases(c);
		if (strcasecmp(arg, "POOLS") == 0)
			return show_pools(c);
		if (strcasecmp(arg, "CLIENTS") == 0)
			return show_sockets_generic(c, true, false, false, false);
		if (strcasecmp(arg, "SERVERS") == 0)
			return show_sockets_generic(c, false, true, false, false);
		if (strcasecmp(arg, "SOCKETS") == 0)
			return show_sockets_generic(c, true, true, true, false);
		if (strcasecmp(arg, "ACTIVE_SOCKETS") == 0)
			return show_sockets_generic(c, true, true, true, true);
		if (strcasecmp(arg, "USERS") == 0)
			return show_users(c);
		if (strcasecmp(arg, "STATS") == 0)
			return show_stats(c, 0);
		if (strcasecmp(arg, "STATS_TOTALS") == 0)
			return show_stats(c, 1);
		if (strcasecmp(arg, "STATS_AVERAGES") == 0)
			return show_stats(c, 2);
		if (strcasecmp(arg, "TOTALS") == 0)
			return show_totals(c);
		if (strcasecmp(arg, "LISTS") == 0)
			return show_lists(c);
		if (strcasecmp(arg, "STATE") == 0)
			return show_state(c);
		if (strcasecmp(arg, "MEM") == 0)
			return show_mem(c);
		if (strcasecmp(arg, "PEERS") == 0)
			return show_peers(c);
		if (strcasecmp(arg, "PEER_POOLS") == 0) {
			static const char *const n[] = {"peer_id", "cl_active_cancel_req", "cl_waiting_cancel_req",
			                                "sv_active_cancel", "sv_login"};
			return show_empty(c, "iiiii", n);
		}
		if (strcasecmp(arg, "DNS_HOSTS") == 0) {
			static const char *const n[] = {"hostname", "ttl", "addrs"};
			return show_empty(c, "TqT", n);
		}
		if (strcasecmp(arg, "DNS_ZONES") == 0) {
			static const char *const n[] = {"zonename", "serial", "count"};
			return show_empty(c, "Tqi", n);
		}
		if (strcasecmp(arg, "FDS") == 0) {
			if (!need_admin(c))
				return true;
			static const char *const n[] = {
			    "fd",        "task",     "user",     "database",         "addr",
			    "port",      "cancel",   "link",     "client_encoding",  "std_strings",
			    "datestyle", "timezone", "password", "scram_client_key", "scram_server_key"};
			return show_empty(c, "iTTTTiqiTTTTTbb", n);
		}
		return admin_error(c, NULL, "invalid command '%s', use SHOW HELP;", query);
	}

	/* everything below needs admin rights */
	if (!need_admin(c))
		return true;

	if (strcasecmp(cmd, "PAUSE") == 0) {
		if (wk.pause_mode != P_NONE)
			return admin_error(c, NULL, "already suspended/paused");
		if (has_arg) {
			PgDatabase *db = find_db_arg(c, arg);
			if (!db)
				return true;
			if (db->admin)
				return admin_error(c, NULL, "cannot pause admin db: %s", arg);
			db->paused = true;
			return send_simple(c, "PAUSE");
		}
		wk.pause_mode = P_PAUSE;
		worker_close_idle_servers();
		wk.pause_waiter = c;
		admin_pause_done_check();
		return true;
	}
	if (strcasecmp(cmd, "RESUME") == 0) {
		if (wk.run_state != RUN_ACTIVE)
			return admin_error(c, NULL, "pooler is shutting down");
		if (has_arg) {
			PgDatabase *db = db_find(arg);
			if (!db)
				return admin_error(c, NULL, "no such database: %s", arg);
			if (!db->paused)
				return admin_error(c, NULL, "database %s is not paused", arg);
			db->paused = false;
		} else {
			if (wk.pause_mode == P_NONE)
				return admin_error(c, NULL, "pooler is not paused/suspended");
			if (wk.pause_mode == P_SUSPEND)
				worker_listen_pause(false);
			wk.pause_mode = P_NONE;
			wk.pause_waiter = NULL;
		}
		List *i;
		list_for_each(i, &wk.pools) pool_wake_waiters(container_of(i, PgPool, node));
		return send_simple(c, "RESUME");
	}
	if (strcasecmp(cmd, "SUSPEND") == 0) {
		if (has_arg)
			return admin_error(c, NULL, "invalid command '%s', use SHOW HELP;", query);
		if (wk.pause_mode != P_NONE)
			return admin_error(c, NULL, "already suspended/paused");
		List *i;
		list_for_each(i, &wk.databases) if (container_of(i, PgDatabase, node)->paused) return admin_error(
		    c, NULL, "cannot suspend with paused databases");
		wk.pause_mode = P_SUSPEND;
		worker_listen_pause(true);
		wk.pause_waiter = c;
		admin_pause_done_check();
		return true;
	}
	if (strcasecmp(cmd, "KILL") == 0) {
		if (wk.pause_mode != P_NONE)
			return admin_error(c, NULL, "already suspended/paused");
		if (has_arg) {
			PgDatabase *db = find_db_arg(c, arg);
			if (!db)
				return true;
			if (db->admin)
				return admin_error(c, NULL, "cannot kill admin db: %s", arg);
			kill_db(db);
		} else {
			List *i, *t;
			list_for_each_safe(i, &wk.databases, t)
			{
				PgDatabase *db = container_of(i, PgDatabase, node);
				bool has_pools = false;
				List *j;
				list_for_each(j, &wk.pools) if (container_of(j, PgPool, node)->db == db) has_pools =
				    true;
				if (!db->admin && has_pools)
					kill_db(db);
			}
		}
		return send_simple(c, "KILL");
	}
	if (strcasecmp(cmd, "KILL_CLIENT") == 0) {
		if (!has_arg)
			return admin_error(c, NULL, "invalid command '%s', use SHOW HELP;", query);
		char *end;
		unsigned long long id = strtoull(arg, &end, 10);
		if (*end || end == arg)
			return admin_error(c, NULL, "invalid client pointer supplied");
		PgSocket *target = find_client_by_id(id);
		if (!target)
			return admin_error(c, NULL, "client not found");
		bool self = target == c;
		disconnect_client(target, true, "admin forced disconnect");
		if (self)
			return false;
		return send_simple(c, "KILL_CLIENT");
	}
	if (strcasecmp(cmd, "DISABLE") == 0 || strcasecmp(cmd, "ENABLE") == 0) {
		if (!has_arg)
			return admin_error(c, NULL, "a database is required");
		PgDatabase *db = db_find(arg);
		if (!db)
			return admin_error(c, NULL, "no such database: %s", arg);
		if (db->admin)
			return admin_error(c, NULL, "cannot disable admin db: %s", arg);
		db->disabled = strcasecmp(cmd, "DISABLE") == 0;
		return send_simple(c, db->disabled ? "DISABLE" : "ENABLE");
	}
	if (strcasecmp(cmd, "RECONNECT") == 0) {
		PgDatabase *db = NULL;
		if (has_arg) {
			db = db_find(arg);
			if (!db)
				return admin_error(c, NULL, "no such database: %s", arg);
			if (db->admin)
				return admin_error(c, NULL, "cannot reconnect admin db: %s", arg);
		}
		mark_close_needed(db);
		return send_simple(c, "RECONNECT");
	}
	if (strcasecmp(cmd, "WAIT_CLOSE") == 0) {
		PgDatabase *db = NULL;
		if (has_arg) {
			db = db_find(arg);
			if (!db)
				return admin_error(c, NULL, "no such database: %s", arg);
			if (db->admin)
				return admin_error(c, NULL, "cannot wait in admin db: %s", arg);
		}
		if (close_needed_count(db) == 0)
			return send_simple(c, "WAIT_CLOSE");
		c->pending_admin_cmd = 1;
		c->cancel_target = (PgSocket *)db;
		return true;
	}
	if (strcasecmp(cmd, "RELOAD") == 0) {
		if (has_arg)
			return admin_error(c, NULL, "invalid command '%s', use SHOW HELP;", query);
		Config probe;
		char err[CF_ERRMSG_LEN];
		config_init(&probe);
		bool ok = config_load(&probe, wk.cf.g.conffile ? wk.cf.g.conffile : wk.cf.path, err, sizeof(err));
		config_free(&probe);
		if (!ok) {
			log_error("%s", err);
			return admin_error(c, "F0000", "RELOAD failed, see logs for additional details");
		}
		/* the master re-reads the file too and passes SIGHUP on to the worker */
		kill(getppid(), SIGHUP);
		return send_simple(c, "RELOAD");
	}
	if (strcasecmp(cmd, "SHUTDOWN") == 0) {
		if (!has_arg) {
			log_info("shutdown requested by admin console");
			/* no reply: the connection stays open until the process exits */
			kill(getppid(), SIGQUIT);
			return true;
		}
		if (strcasecmp(arg, "WAIT_FOR_SERVERS") == 0) {
			if (!send_simple(c, "SHUTDOWN"))
				return false;
			kill(getppid(), SIGINT);
			return true;
		}
		if (strcasecmp(arg, "WAIT_FOR_CLIENTS") == 0) {
			if (!send_simple(c, "SHUTDOWN"))
				return false;
			kill(getppid(), SIGTERM);
			return true;
		}
		return admin_error(c, NULL, "invalid command '%s', use SHOW HELP;", query);
	}
	return admin_error(c, NULL, "invalid command '%s', use SHOW HELP;", query);
}
