/*
 * GET /metrics in the Prometheus text format (doc/monitoring.md). The master
 * serves it: it owns the shared memory with the per-worker and scaler
 * figures, and it outlives any worker. For the pooler's objects it logs in
 * to one live worker's private socket as the console user, as the workers'
 * own fan-out does, and asks SHOW LISTS, POOLS, STATS, DATABASES and
 * CLIENTS; that worker merges every worker's answer, so the figures are the
 * pooler's. Every family pgbouncer_exporter emits is here with its name, type
 * and labels, so its dashboards and alerts work unchanged; the families it
 * does not have are listed in doc/monitoring.md, "Metric names".
 * The HTTP side is bounded in connections, bytes and time, since anyone who
 * reaches the port may use it (doc/monitoring.md, "Limits").
 */
#include "autoconfig.h"

#include "master/metrics.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <ares.h>
#include <openssl/crypto.h>

#include "common/log.h"
#include "common/pktbuf.h"
#include "common/util.h"
#include "master/http_request.h"
#include "master/scaler.h"

/* The bounds of doc/monitoring.md, "Limits"; metrics_max_connections is the one setting. */
#define SCRAPE_TIMEOUT_SEC  5 /* the whole console conversation; the worker's fan-out gives up on a peer after 2 */
#define SCRAPE_MAX_MSG      (16 << 20)
#define REQUEST_TIMEOUT_SEC 5    /* from accept to the end of the request head */
#define REPLY_TIMEOUT_SEC   10   /* from the answer's start until the client has it and closes */
#define MAX_REQUEST_HEAD    8192 /* request line and header fields; a body is never read */
#define LOG_INTERVAL_SEC    10   /* a bound that is hit: one line at once, then a count per interval */
#define ACCEPT_PAUSE_SEC    1    /* after accept() failed for want of descriptors or memory */

enum { Q_LISTS, Q_POOLS, Q_STATS, Q_DATABASES, Q_CLIENTS, N_QUERIES };
static const char *const queries[N_QUERIES] = {"SHOW LISTS", "SHOW POOLS", "SHOW STATS", "SHOW DATABASES",
                                               "SHOW CLIENTS"};

/* The labels of pgbouncer_client_connections: the only columns of SHOW CLIENTS a scrape keeps. */
static const char *const client_labels[] = {"database", "user", "application_name", "state"};
#define N_CLIENT_LABELS 4

/* One SHOW's answer: column names and text values (NULL = SQL NULL, or a column not kept). */
typedef struct Table {
	bool ok; /* complete and without error */
	bool failed;
	int ncols;
	char **cols;
	const char *const *keep; /* the columns whose values are kept, NULL for all */
	int n_keep;
	bool *dropped; /* per column: its values are not kept (NULL when all are) */
	char ***rows;
	int n_rows, cap_rows;
} Table;

typedef struct Conn Conn;

typedef struct Scrape {
	Conn *conn;              /* the HTTP client that asked; the scrape goes when it goes */
	struct bufferevent *bev; /* the console connection */
	struct event *deadline;  /* SCRAPE_TIMEOUT_SEC after the start */
	int worker;              /* the slot asked, -1 before one was reached */
	int worker_pid;
	int q; /* the SHOW in progress; -1 while logging in */
	Table t[N_QUERIES];
	char err[256];
	struct Scrape *next;
} Scrape;

typedef enum ConnPhase {
	CONN_REQUEST, /* reading the request head; closed first to make room */
	CONN_SCRAPE,  /* the head is in: `scrape` asks a worker */
	CONN_REPLY,   /* writing the answer */
	CONN_LINGER,  /* answer written, our side shut: reading until the client closes; closed first to make room */
} ConnPhase;

/* One HTTP connection: accepted, one request, one answer, closed. */
struct Conn {
	struct bufferevent *bev;
	ConnPhase phase;
	bool head_only;         /* HEAD: the answer's head alone */
	bool no_linger;         /* closed once the answer is written: the client may still be sending */
	bool peer_done;         /* the client shut its side: nothing more to read */
	size_t head_looked;     /* how far http_request_parse() has looked */
	struct event *deadline; /* REQUEST_TIMEOUT_SEC, then REPLY_TIMEOUT_SEC; none during the scrape */
	Scrape *scrape;         /* in CONN_SCRAPE */
	Conn *prev, *next;      /* m.conns, oldest first */
};

/* The bounds that are logged, each counted apart. */
enum {
	B_CAP_CLOSED,   /* metrics_max_connections: the oldest idle connection closed */
	B_CAP_REFUSED,  /* metrics_max_connections: the new connection closed */
	B_HEAD,         /* MAX_REQUEST_HEAD */
	B_REQUEST_TIME, /* REQUEST_TIMEOUT_SEC */
	B_REPLY_TIME,   /* REPLY_TIMEOUT_SEC */
	B_SCRAPE,       /* a scrape failed, SCRAPE_TIMEOUT_SEC among the reasons */
	B_ACCEPT,       /* accept() or the connection's set-up failed */
	N_BOUNDS
};

/* A bound that was hit: the first time a line at once, then one count per LOG_INTERVAL_SEC. */
typedef struct LogBound {
	uint64_t hits;       /* since the last line */
	bool counting;       /* a line went out less than LOG_INTERVAL_SEC ago */
	char last[256];      /* what the latest hit was */
	struct event *timer; /* LOG_INTERVAL_SEC after a line */
} LogBound;

static struct {
	struct evconnlistener *listener;
	struct event *accept_resume; /* ACCEPT_PAUSE_SEC after accept() failed */
	struct event_base *base;
	const Config *cf;
	ShmSegment *shm;
	Scrape *scrapes; /* in progress */
	Conn *conns;     /* open, oldest first */
	Conn *conns_tail;
	int n_conns;
	LogBound bounds[N_BOUNDS];
} m;

/* ---- tables ---- */

static void table_free(Table *t)
{
	for (int r = 0; r < t->n_rows; r++) {
		for (int c = 0; c < t->ncols; c++)
			free(t->rows[r][c]);
		free(t->rows[r]);
	}
	free(t->rows);
	for (int c = 0; c < t->ncols; c++)
		free(t->cols[c]);
	free(t->cols);
	free(t->dropped);
	memset(t, 0, sizeof(*t));
}

static int table_col(const Table *t, const char *name)
{
	for (int c = 0; c < t->ncols; c++)
		if (strcmp(t->cols[c], name) == 0)
			return c;
	return -1;
}

/* ---- the console conversation ---- */

static void scrape_finish(Scrape *s);

static void scrape_fail(Scrape *s, const char *why)
{
	if (!s->err[0])
		snprintf(s->err, sizeof(s->err), "%s", why);
	scrape_finish(s);
}

static uint32_t get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static bool parse_rowdesc(Table *t, const uint8_t *p, uint32_t len)
{
	if (len < 2 || t->cols)
		return false;
	int n = p[0] << 8 | p[1];
	uint32_t off = 2;
	t->cols = xcalloc((size_t)n + 1, sizeof(char *));
	for (int c = 0; c < n; c++) {
		const uint8_t *nul = memchr(p + off, '\0', len - off);
		if (!nul || (uint32_t)(nul - p) + 1 + 18 > len)
			return false;
		t->cols[c] = xstrdup((const char *)p + off);
		t->ncols = c + 1;
		off = (uint32_t)(nul - p) + 1 + 18;
	}
	if (t->keep) {
		t->dropped = xcalloc((size_t)n + 1, sizeof(bool));
		for (int c = 0; c < n; c++) {
			t->dropped[c] = true;
			for (int k = 0; k < t->n_keep; k++)
				if (strcmp(t->cols[c], t->keep[k]) == 0)
					t->dropped[c] = false;
		}
	}
	return true;
}

/*
 * The length of the UTF-8 sequence at p if it is a valid one (no overlong
 * form, no surrogate, at most U+10FFFF), else 0 with *bad set to the bytes
 * to replace: the longest start of a sequence that could have been valid,
 * at least one (Unicode's "maximal subpart", as Python and Go replace).
 */
static size_t utf8_len(const unsigned char *p, size_t left, size_t *bad)
{
	unsigned char c = p[0];
	size_t n;
	unsigned char lo = 0x80, hi = 0xBF; /* the range of the second byte */
	if (c < 0x80)
		return 1;
	if (c >= 0xC2 && c <= 0xDF)
		n = 2;
	else if (c >= 0xE0 && c <= 0xEF) {
		n = 3;
		if (c == 0xE0)
			lo = 0xA0;
		else if (c == 0xED)
			hi = 0x9F;
	} else if (c >= 0xF0 && c <= 0xF4) {
		n = 4;
		if (c == 0xF0)
			lo = 0x90;
		else if (c == 0xF4)
			hi = 0x8F;
	} else {
		*bad = 1;
		return 0;
	}
	for (size_t i = 1; i < n; i++) {
		unsigned char min = i == 1 ? lo : 0x80, max = i == 1 ? hi : 0xBF;
		if (i == left || p[i] < min || p[i] > max) {
			*bad = i;
			return 0;
		}
	}
	return n;
}

/*
 * A value of the console's answer as text: a copy of its `len` bytes, with
 * what is not UTF-8 replaced by U+FFFD. A client may put any bytes in its
 * application_name, and Prometheus refuses a whole scrape for one label
 * value that is not UTF-8; replaced here, before the clients are grouped,
 * two such names that read the same are one sample.
 */
static char *text_dup(const uint8_t *p, size_t len)
{
	size_t out_len = 0;
	for (size_t i = 0, bad, n; i < len; i += n ? n : bad, out_len += n ? n : 3)
		n = utf8_len(p + i, len - i, &bad);
	char *out = xmalloc(out_len + 1);
	size_t o = 0;
	for (size_t i = 0, bad, n; i < len; i += n ? n : bad) {
		n = utf8_len(p + i, len - i, &bad);
		if (n) {
			memcpy(out + o, p + i, n);
			o += n;
		} else {
			memcpy(out + o, "\xEF\xBF\xBD", 3);
			o += 3;
		}
	}
	out[o] = '\0';
	return out;
}

static bool parse_datarow(Table *t, const uint8_t *p, uint32_t len)
{
	if (len < 2 || (p[0] << 8 | p[1]) != t->ncols)
		return false;
	char **row = xcalloc((size_t)t->ncols + 1, sizeof(char *));
	if (t->n_rows == t->cap_rows) {
		t->cap_rows = t->cap_rows ? t->cap_rows * 2 : 16;
		t->rows = xrealloc(t->rows, sizeof(*t->rows) * (size_t)t->cap_rows);
	}
	t->rows[t->n_rows++] = row;
	uint32_t off = 2;
	for (int c = 0; c < t->ncols; c++) {
		if (off + 4 > len)
			return false;
		uint32_t vlen = get_u32(p + off);
		off += 4;
		if (vlen == 0xffffffffu)
			continue;
		if (vlen > len - off)
			return false;
		if (t->dropped && t->dropped[c]) {
			off += vlen;
			continue;
		}
		row[c] = text_dup(p + off, vlen);
		off += vlen;
	}
	return true;
}

/* One message from the console; false ends the scrape. */
static bool on_message(Scrape *s, char type, const uint8_t *p, uint32_t len)
{
	Table *t = s->q >= 0 ? &s->t[s->q] : NULL;
	switch (type) {
	case 'R':
		if (len < 4 || get_u32(p) != 0) {
			scrape_fail(s, "the console asked for a password (the metrics login is the pooler's own user)");
			return false;
		}
		return true;
	case 'E':
		if (!t) {
			scrape_fail(s, "the console refused the login");
			return false;
		}
		t->failed = true;
		return true;
	case 'T':
		if (t && !parse_rowdesc(t, p, len))
			t->failed = true;
		return true;
	case 'D':
		if (t && !t->failed && !parse_datarow(t, p, len))
			t->failed = true;
		return true;
	case 'Z':
		if (t)
			t->ok = !t->failed && t->cols;
		s->q++;
		if (s->q < N_QUERIES) {
			pktbuf_send_query(s->bev, queries[s->q]);
			return true;
		}
		scrape_finish(s);
		return false;
	default: /* ParameterStatus, BackendKeyData, CommandComplete, notices */
		return true;
	}
}

static void on_read(struct bufferevent *bev, void *arg)
{
	Scrape *s = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	for (;;) {
		uint8_t hdr[5];
		if (evbuffer_copyout(in, hdr, 5) < 5)
			return;
		uint32_t len = get_u32(hdr + 1);
		if (len < 4 || len > SCRAPE_MAX_MSG) {
			scrape_fail(s, "malformed message from the console");
			return;
		}
		if (evbuffer_get_length(in) < (size_t)len + 1)
			return;
		const uint8_t *msg = evbuffer_pullup(in, (ev_ssize_t)len + 1);
		bool go_on = on_message(s, (char)hdr[0], msg + 5, len - 4);
		if (!go_on)
			return; /* s is gone */
		evbuffer_drain(in, (size_t)len + 1);
	}
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
	Scrape *s = arg;
	if (what & BEV_EVENT_CONNECTED)
		return;
	char why[200];
	snprintf(why, sizeof(why), "the console connection %s: worker %d (pid %d)",
	         what & BEV_EVENT_EOF ? "was closed" : "failed", s->worker, s->worker_pid);
	scrape_fail(s, why);
}

/* The scrape's own bound: it answers with what it has, and names the worker it waited for. */
static void on_scrape_deadline(evutil_socket_t fd, short what, void *arg)
{
	Scrape *s = arg;
	char why[200];
	snprintf(why, sizeof(why), "the console connection timed out: worker %d (pid %d) did not answer within %d s",
	         s->worker, s->worker_pid, SCRAPE_TIMEOUT_SEC);
	scrape_fail(s, why);
}

/*
 * Connect to the private socket of an active worker, the lowest first (its
 * console answers for all of them); the next one when a socket is gone.
 * A unix socket connects at once or fails at once: connected here, the
 * bufferevent never reports a failure from inside scrape_connect().
 */
static int connect_worker(Scrape *s)
{
	char dir[108];
	if (!private_socket_dir(m.cf->g.unix_socket_dir, m.cf->g.listen_port, dir, sizeof(dir))) {
		snprintf(s->err, sizeof(s->err), "the workers have no private socket");
		return -1;
	}
	snprintf(s->err, sizeof(s->err), "no active worker");
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		WorkerSlot *w = &m.shm->slots[i];
		int pid = atomic_load(&w->pid);
		if (atomic_load(&w->state) != SLOT_ACTIVE || pid <= 0)
			continue;
		if (atomic_load(&w->hung)) {
			/* its loop does not run: ask a worker that answers (doc/workers.md, "When a worker hangs") */
			snprintf(s->err, sizeof(s->err), "worker %d (pid %d) is hung", i, pid);
			continue;
		}
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		int n =
		    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/worker.%d/.s.PGSQL.%d", dir, i, m.cf->g.listen_port);
		if (n < 0 || (size_t)n >= sizeof(sa.sun_path)) {
			snprintf(s->err, sizeof(s->err), "private socket path too long");
			return -1;
		}
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			snprintf(s->err, sizeof(s->err), "socket() failed: %s", strerror(errno));
			return -1;
		}
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
			s->err[0] = '\0';
			s->worker = i;
			s->worker_pid = pid;
			return fd;
		}
		snprintf(s->err, sizeof(s->err), "connect(%s) failed: %s", sa.sun_path, strerror(errno));
		close(fd);
	}
	return -1;
}

static bool scrape_connect(Scrape *s)
{
	int fd = connect_worker(s);
	if (fd < 0)
		return false;
	s->bev = bufferevent_socket_new(m.base, fd, 0); /* closed by bev_close() */
	if (!s->bev) {
		close(fd);
		snprintf(s->err, sizeof(s->err), "bufferevent_socket_new() failed");
		return false;
	}
	bufferevent_setcb(s->bev, on_read, NULL, on_event, s);
	bufferevent_enable(s->bev, EV_READ | EV_WRITE);
	/* the same-user console login the workers' fan-out uses (doc/workers.md) */
	PktBuf pb;
	pktbuf_init(&pb, 128);
	pktbuf_put_console_login(&pb, "metrics");
	bufferevent_write(s->bev, pb.buf, pb.len);
	pktbuf_free(&pb);
	return true;
}

/* ---- the text format ---- */

static void put_escaped(struct evbuffer *o, const char *v)
{
	for (; *v; v++) {
		if (*v == '\\')
			evbuffer_add(o, "\\\\", 2);
		else if (*v == '"')
			evbuffer_add(o, "\\\"", 2);
		else if (*v == '\n')
			evbuffer_add(o, "\\n", 2);
		else
			evbuffer_add(o, v, 1);
	}
}

static void put_head(struct evbuffer *o, const char *name, const char *type, const char *help)
{
	evbuffer_add_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void put_value(struct evbuffer *o, double v)
{
	evbuffer_add_printf(o, " %.17g\n", v);
}

/* One numeric column of a SHOW as a metric, one sample per row. */
typedef struct ColMetric {
	const char *col;  /* column name */
	const char *name; /* metric name after put_table()'s prefix */
	const char *type; /* "gauge" or "counter" */
	double scale;     /* 1e-6 for microseconds to seconds */
	const char *help;
	const char *col_us; /* a microseconds column added to this one (maxwait_us) */
} ColMetric;

/* A family per entry of `cm`, named `prefix` + its name, a sample per row labelled with the columns `labels`. */
static void put_table(struct evbuffer *o, const Table *t, const char *prefix, const char *const *labels, int n_labels,
                      const ColMetric *cm, int n_cm)
{
	int lc[8];
	for (int k = 0; k < n_labels && k < 8; k++)
		lc[k] = table_col(t, labels[k]);
	for (int i = 0; i < n_cm; i++) {
		int c = table_col(t, cm[i].col);
		int cu = cm[i].col_us ? table_col(t, cm[i].col_us) : -1;
		if (c < 0)
			continue;
		char name[128];
		snprintf(name, sizeof(name), "%s%s", prefix, cm[i].name);
		put_head(o, name, cm[i].type, cm[i].help);
		for (int r = 0; r < t->n_rows; r++) {
			char **row = t->rows[r];
			if (!row[c])
				continue;
			evbuffer_add_printf(o, "%s{", name);
			for (int k = 0; k < n_labels; k++) {
				evbuffer_add_printf(o, "%s%s=\"", k ? "," : "", labels[k]);
				if (lc[k] >= 0 && row[lc[k]])
					put_escaped(o, row[lc[k]]);
				evbuffer_add(o, "\"", 1);
			}
			evbuffer_add(o, "}", 1);
			double v = strtod(row[c], NULL) * cm[i].scale;
			if (cu >= 0 && row[cu])
				v += strtod(row[cu], NULL) * 1e-6;
			put_value(o, v);
		}
	}
}

static const ColMetric pool_metrics[] = {
    {"cl_active", "client_active_connections", "gauge", 1,
     "Clients of the pool that hold a server or are idle (SHOW POOLS cl_active)"},
    {"cl_waiting", "client_waiting_connections", "gauge", 1,
     "Clients of the pool with a query that waits for a server (SHOW POOLS cl_waiting)"},
    {"cl_active_cancel_req", "client_active_cancel_connections", "gauge", 1,
     "Cancel requests of the pool passed on to PostgreSQL and not answered yet (SHOW POOLS cl_active_cancel_req)"},
    {"cl_waiting_cancel_req", "client_waiting_cancel_connections", "gauge", 1,
     "Cancel requests of the pool waiting to be passed on (SHOW POOLS cl_waiting_cancel_req)"},
    {"sv_active", "server_active_connections", "gauge", 1,
     "Server connections of the pool that serve a client (SHOW POOLS sv_active)"},
    {"sv_active_cancel", "server_active_cancel_connections", "gauge", 1,
     "Server connections of the pool that carry a cancel request (SHOW POOLS sv_active_cancel)"},
    {"sv_being_canceled", "server_being_canceled_connections", "gauge", 1,
     "Server connections of the pool kept until the cancel requests aimed at them are done (SHOW POOLS "
     "sv_being_canceled)"},
    {"sv_idle", "server_idle_connections", "gauge", 1,
     "Server connections of the pool free for the next client (SHOW POOLS sv_idle)"},
    {"sv_used", "server_used_connections", "gauge", 1,
     "Server connections of the pool free but due for server_check_query (SHOW POOLS sv_used)"},
    {"sv_tested", "server_testing_connections", "gauge", 1,
     "Server connections of the pool running server_reset_query or server_check_query (SHOW POOLS sv_tested)"},
    {"sv_login", "server_login_connections", "gauge", 1,
     "Server connections of the pool still logging in to PostgreSQL (SHOW POOLS sv_login)"},
    {"maxwait", "client_maxwait_seconds", "gauge", 1,
     "How long the pool's longest-waiting client has waited, in seconds (SHOW POOLS maxwait, maxwait_us)",
     "maxwait_us"},
};

/* SHOW STATS totals; put twice, as pgbouncer_stats_totals_* and under their earlier names pgbouncer_stats_*. */
static const ColMetric stats_metrics[] = {
    {"total_server_assignment_count", "server_assignments_total", "counter", 1,
     "Times a server was assigned to a client of the database (SHOW STATS total_server_assignment_count)"},
    {"total_xact_count", "sql_transactions_pooled_total", "counter", 1,
     "Transactions of the database run through the pooler (SHOW STATS total_xact_count)"},
    {"total_query_count", "queries_pooled_total", "counter", 1,
     "Queries of the database run through the pooler (SHOW STATS total_query_count)"},
    {"total_received", "received_bytes_total", "counter", 1,
     "Bytes the pooler received from the database's clients (SHOW STATS total_received)"},
    {"total_sent", "sent_bytes_total", "counter", 1,
     "Bytes the pooler sent to the database's clients (SHOW STATS total_sent)"},
    {"total_xact_time", "server_in_transaction_seconds_total", "counter", 1e-6,
     "Seconds the database's server connections spent in a transaction (SHOW STATS total_xact_time)"},
    {"total_query_time", "queries_duration_seconds_total", "counter", 1e-6,
     "Seconds the database's server connections spent running queries (SHOW STATS total_query_time)"},
    {"total_wait_time", "client_wait_seconds_total", "counter", 1e-6,
     "Seconds the database's clients waited for a server (SHOW STATS total_wait_time)"},
    {"total_client_parse_count", "client_parses_total", "counter", 1,
     "Parse messages for named prepared statements from the database's clients (SHOW STATS "
     "total_client_parse_count)"},
    {"total_server_parse_count", "server_parses_total", "counter", 1,
     "Parse messages the pooler sent to the database's servers (SHOW STATS total_server_parse_count)"},
    {"total_bind_count", "binds_total", "counter", 1,
     "Bind messages for prepared statements from the database's clients (SHOW STATS total_bind_count)"},
};

static const ColMetric database_metrics[] = {
    {"pool_size", "pool_size", "gauge", 1,
     "Server connections a pool of the database may open (SHOW DATABASES pool_size)"},
    {"min_pool_size", "min_pool_size", "gauge", 1,
     "Server connections kept open per pool of the database (SHOW DATABASES min_pool_size)"},
    {"reserve_pool_size", "reserve_pool", "gauge", 1,
     "Extra server connections a pool of the database may open when clients wait (SHOW DATABASES "
     "reserve_pool_size)"},
    {"max_connections", "max_connections", "gauge", 1,
     "Most server connections the database may have, 0 for no limit (SHOW DATABASES max_connections)"},
    {"current_connections", "current_connections", "gauge", 1,
     "Server connections the database has (SHOW DATABASES current_connections)"},
    {"max_client_connections", "max_client_connections", "gauge", 1,
     "Most clients the database may have, 0 for no limit (SHOW DATABASES max_client_connections)"},
    {"current_client_connections", "current_client_connections", "gauge", 1,
     "Clients the database has (SHOW DATABASES current_client_connections)"},
    {"paused", "paused", "gauge", 1, "1 while the database is paused (SHOW DATABASES paused)"},
    {"disabled", "disabled", "gauge", 1, "1 while the database is disabled (SHOW DATABASES disabled)"},
};

/* SHOW LISTS rows: (list name, metric name, help). */
static const char *const list_metrics[][3] = {
    {"databases", "pgbouncer_databases", "Databases the pooler knows (SHOW LISTS databases)"},
    {"users", "pgbouncer_users", "Users the pooler knows (SHOW LISTS users)"},
    {"pools", "pgbouncer_pools", "Pools, one per database and user in use (SHOW LISTS pools)"},
    {"free_clients", "pgbouncer_free_clients", "Client slots allocated and unused (SHOW LISTS free_clients)"},
    {"used_clients", "pgbouncer_used_clients", "Client connections (SHOW LISTS used_clients)"},
    {"login_clients", "pgbouncer_login_clients", "Clients still logging in (SHOW LISTS login_clients)"},
    {"free_servers", "pgbouncer_free_servers", "Server slots allocated and unused (SHOW LISTS free_servers)"},
    {"used_servers", "pgbouncer_used_servers", "Server connections (SHOW LISTS used_servers)"},
    {"dns_names", "pgbouncer_cached_dns_names", "Host names in the DNS cache (SHOW LISTS dns_names)"},
    {"dns_zones", "pgbouncer_cached_dns_zones", "DNS zones watched for changes (SHOW LISTS dns_zones)"},
    {"dns_queries", "pgbouncer_in_flight_dns_queries", "DNS lookups under way (SHOW LISTS dns_queries)"},
};

static void put_lists(struct evbuffer *o, const Table *t)
{
	int cl = table_col(t, "list"), ci = table_col(t, "items");
	if (cl < 0 || ci < 0)
		return;
	for (size_t i = 0; i < sizeof(list_metrics) / sizeof(list_metrics[0]); i++)
		for (int r = 0; r < t->n_rows; r++) {
			char **row = t->rows[r];
			if (!row[cl] || !row[ci] || strcmp(row[cl], list_metrics[i][0]) != 0)
				continue;
			put_head(o, list_metrics[i][1], "gauge", list_metrics[i][2]);
			evbuffer_add_printf(o, "%s", list_metrics[i][1]);
			put_value(o, strtod(row[ci], NULL));
		}
}

/* A client's values of client_labels, "" for NULL. */
typedef struct ClientKey {
	const char *v[N_CLIENT_LABELS];
} ClientKey;

static int client_key_cmp(const void *a, const void *b)
{
	const ClientKey *x = a, *y = b;
	for (int k = 0; k < N_CLIENT_LABELS; k++) {
		int d = strcmp(x->v[k], y->v[k]);
		if (d)
			return d;
	}
	return 0;
}

/* SHOW CLIENTS counted by database, user, application_name and state: one sample per group. */
static void put_clients(struct evbuffer *o, const Table *t)
{
	int lc[N_CLIENT_LABELS];
	for (int k = 0; k < N_CLIENT_LABELS; k++)
		if ((lc[k] = table_col(t, client_labels[k])) < 0)
			return;
	ClientKey *keys = xcalloc((size_t)t->n_rows + 1, sizeof(*keys));
	for (int r = 0; r < t->n_rows; r++)
		for (int k = 0; k < N_CLIENT_LABELS; k++)
			keys[r].v[k] = t->rows[r][lc[k]] ? t->rows[r][lc[k]] : "";
	qsort(keys, (size_t)t->n_rows, sizeof(*keys), client_key_cmp);
	put_head(o, "pgbouncer_client_connections", "gauge",
	         "Client connections by database, user, application_name and state (SHOW CLIENTS)");
	for (int r = 0, n; r < t->n_rows; r += n) {
		for (n = 1; r + n < t->n_rows && client_key_cmp(&keys[r], &keys[r + n]) == 0; n++)
			;
		evbuffer_add(o, "pgbouncer_client_connections{", strlen("pgbouncer_client_connections{"));
		for (int k = 0; k < N_CLIENT_LABELS; k++) {
			evbuffer_add_printf(o, "%s%s=\"", k ? "," : "", client_labels[k]);
			put_escaped(o, keys[r].v[k]);
			evbuffer_add(o, "\"", 1);
		}
		evbuffer_add(o, "}", 1);
		put_value(o, n);
	}
	free(keys);
}

/* Per-worker figures, straight from shared memory. */
static void put_workers(struct evbuffer *o)
{
	static const struct {
		const char *name, *type, *help;
	} wm[] = {
	    {"pgbouncer_worker_busy_ratio", "gauge", "Share of the last sample the worker's loop was busy (0 to 1)"},
	    {"pgbouncer_worker_busy_avg_ratio", "gauge", "Moving average of the busy ratio the scaler decides on"},
	    {"pgbouncer_worker_client_active_connections", "gauge", "Active client connections of the worker"},
	    {"pgbouncer_worker_client_waiting_connections", "gauge", "Waiting client connections of the worker"},
	    {"pgbouncer_worker_server_active_connections", "gauge", "Active server connections of the worker"},
	    {"pgbouncer_worker_server_idle_connections", "gauge", "Idle server connections of the worker"},
	    {"pgbouncer_worker_accepted_connections_total", "counter", "Client connections the worker accepted"},
	    {"pgbouncer_worker_tls_handshakes_total", "counter", "Client TLS handshakes the worker completed"},
	    {"pgbouncer_worker_transactions_total", "counter", "Transactions the worker pooled"},
	    {"pgbouncer_worker_queries_total", "counter", "Queries the worker pooled"},
	    {"pgbouncer_worker_uptime_seconds", "gauge", "Seconds since the worker started"},
	    {"pgbouncer_worker_wait_ratio", "gauge",
	     "Share of the last sample the worker was runnable but waiting for a CPU"},
	    {"pgbouncer_worker_wait_avg_ratio", "gauge", "Moving average of the worker's run-queue wait ratio"},
	    {"pgbouncer_worker_clients_moved_in_total", "counter", "Clients taken over from other workers"},
	    {"pgbouncer_worker_clients_moved_out_total", "counter", "Clients handed over to other workers"},
	    {"pgbouncer_worker_clients_not_movable", "gauge",
	     "Logged-in clients that cannot move to another worker now (in a transaction, TLS, ...)"},
	    {"pgbouncer_worker_client_move_failures_total", "counter",
	     "Clients picked for a move that stayed where they were"},
	};
	uint64_t now = (uint64_t)get_time_usec();
	for (size_t k = 0; k < sizeof(wm) / sizeof(wm[0]); k++) {
		put_head(o, wm[k].name, wm[k].type, wm[k].help);
		for (int i = 0; i < SHM_MAX_WORKERS; i++) {
			WorkerSlot *w = &m.shm->slots[i];
			if (atomic_load(&w->state) == SLOT_FREE)
				continue;
			double v = 0;
			uint64_t started = atomic_load(&w->start_time_us);
			switch (k) {
			case 0:
				v = atomic_load(&m.shm->scaler.busy_milli[i]) / 1000.0;
				break;
			case 1:
				v = atomic_load(&m.shm->scaler.busy_avg_milli[i]) / 1000.0;
				break;
			case 2:
				v = atomic_load(&w->cl_active);
				break;
			case 3:
				v = atomic_load(&w->cl_waiting);
				break;
			case 4:
				v = atomic_load(&w->sv_active);
				break;
			case 5:
				v = atomic_load(&w->sv_idle);
				break;
			case 6:
				v = (double)atomic_load(&w->accepted);
				break;
			case 7:
				v = (double)atomic_load(&w->tls_handshakes);
				break;
			case 8:
				v = (double)atomic_load(&w->xact_count);
				break;
			case 9:
				v = (double)atomic_load(&w->query_count);
				break;
			case 10:
				v = now > started ? (double)(now - started) / 1e6 : 0;
				break;
			case 11:
				v = atomic_load(&m.shm->scaler.wait_milli[i]) / 1000.0;
				break;
			case 12:
				v = atomic_load(&m.shm->scaler.wait_avg_milli[i]) / 1000.0;
				break;
			case 13:
				v = (double)atomic_load(&w->moved_in);
				break;
			case 14:
				v = (double)atomic_load(&w->moved_out);
				break;
			case 15:
				v = atomic_load(&w->cl_unmovable);
				break;
			default:
				v = (double)atomic_load(&w->move_failed);
				break;
			}
			evbuffer_add_printf(o, "%s{worker=\"%d\"}", wm[k].name, i);
			put_value(o, v);
		}
	}
	put_head(o, "pgbouncer_worker_state", "gauge",
	         "1 for the worker's state (starting, active, draining, exiting)");
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		uint32_t st = atomic_load(&m.shm->slots[i].state);
		if (st == SLOT_FREE)
			continue;
		evbuffer_add_printf(o, "pgbouncer_worker_state{worker=\"%d\",state=\"%s\"}", i,
		                    worker_slot_state_name(&m.shm->slots[i]));
		put_value(o, 1);
	}
}

static void put_scaler(struct evbuffer *o)
{
	ScalerView *sc = &m.shm->scaler;
	static const char *const gauges[][2] = {
	    {"pgbouncer_scaler_current_workers", "Active workers"},
	    {"pgbouncer_scaler_target_workers", "Worker count the scaler is heading for"},
	    {"pgbouncer_scaler_min_workers", "min_workers in force"},
	    {"pgbouncer_scaler_max_workers", "max_workers in force (resolved)"},
	};
	uint32_t vals[4] = {atomic_load(&sc->current), atomic_load(&sc->target), atomic_load(&sc->min_workers),
	                    atomic_load(&sc->max_workers)};
	for (int k = 0; k < 4; k++) {
		put_head(o, gauges[k][0], "gauge", gauges[k][1]);
		evbuffer_add_printf(o, "%s", gauges[k][0]);
		put_value(o, vals[k]);
	}
	put_head(o, "pgbouncer_scaler_cpus", "gauge",
	         "The CPU allowance: the CPUs the pooler may use, which max_workers = 0 stands for (rounded up)");
	evbuffer_add_printf(o, "pgbouncer_scaler_cpus");
	put_value(o, atomic_load(&sc->cpus_milli) / 1000.0);
	uint32_t idle = atomic_load(&sc->idle_milli);
	if (idle != UINT32_MAX) {
		put_head(o, "pgbouncer_scaler_idle_cpus", "gauge",
		         "CPUs of the allowance nobody used at the scaler's last sample");
		evbuffer_add_printf(o, "pgbouncer_scaler_idle_cpus");
		put_value(o, idle / 1000.0);
	}
	put_head(o, "pgbouncer_scaler_throttled_ratio", "gauge",
	         "Share of the cgroup's CPU quota periods that were throttled at the scaler's last sample");
	evbuffer_add_printf(o, "pgbouncer_scaler_throttled_ratio");
	put_value(o, atomic_load(&sc->throttled_milli) / 1000.0);
	put_head(o, "pgbouncer_scaler_cpus_info", "gauge",
	         "1, with where the CPU allowance came from (physical cores, affinity, cgroup cpuset, cgroup quota)");
	evbuffer_add_printf(o, "pgbouncer_scaler_cpus_info{from=\"%s\"}",
	                    cpus_from_name((CpusFrom)atomic_load(&sc->cpus_from)));
	put_value(o, 1);
	put_head(o, "pgbouncer_scaler_decisions_total", "counter", "Scaler decisions taken, by decision");
	for (int d = SCALE_HOLD; d <= SCALE_DOWN; d++) {
		evbuffer_add_printf(o, "pgbouncer_scaler_decisions_total{decision=\"%s\"}",
		                    scaler_decision_name((ScaleDecision)d));
		put_value(o, (double)atomic_load(&sc->decisions[d]));
	}
	char reason[sizeof(sc->last_reason)] = "";
	for (int tries = 0; tries < 100; tries++) {
		uint32_t seq = atomic_load(&sc->reason_seq);
		if (seq & 1)
			continue;
		memcpy(reason, sc->last_reason, sizeof(reason));
		reason[sizeof(reason) - 1] = '\0';
		if (atomic_load(&sc->reason_seq) == seq)
			break;
	}
	/* the kind of reason only: its text has figures that change at every sample (SHOW SCALER has it) */
	put_head(o, "pgbouncer_scaler_last_decision_info", "gauge",
	         "The scaler's last decision and the kind of its reason");
	evbuffer_add_printf(o, "pgbouncer_scaler_last_decision_info{decision=\"%s\",reason=\"%s\"}",
	                    scaler_decision_name((ScaleDecision)atomic_load(&sc->last_decision)),
	                    scaler_reason_kind(reason));
	put_value(o, 1);
	put_head(o, "pgbouncer_scaler_last_change_timestamp_seconds", "gauge",
	         "Unix time of the last change of the worker count (0: none yet)");
	evbuffer_add_printf(o, "pgbouncer_scaler_last_change_timestamp_seconds");
	put_value(o, (double)atomic_load(&sc->last_change_us) / 1e6);
}

static void render(const Scrape *s, struct evbuffer *o)
{
	bool up = !s->err[0];
	for (int i = 0; i < N_QUERIES; i++)
		up = up && s->t[i].ok;
	put_head(o, "pgbouncer_up", "gauge", "1 if the console answered every query of this scrape");
	evbuffer_add_printf(o, "pgbouncer_up");
	put_value(o, up ? 1 : 0);
	/* the label is SHOW VERSION's text, as a scrape through the console shows it */
	put_head(o, "pgbouncer_version_info", "gauge", "1, with the pooler's SHOW VERSION");
	evbuffer_add_printf(o, "pgbouncer_version_info{version=\"PgBouncer %s\"}", PACKAGE_VERSION);
	put_value(o, 1);
	put_head(o, "pgbouncer_build_info", "gauge",
	         "1, with this pooler's version and the versions of the libraries it runs with");
	evbuffer_add_printf(o, "pgbouncer_build_info{version=\"%s\",libevent=\"", PACKAGE_VERSION);
	put_escaped(o, event_get_version());
	evbuffer_add_printf(o, "\",c_ares=\"");
	put_escaped(o, ares_version(NULL));
	evbuffer_add_printf(o, "\",openssl=\"");
	put_escaped(o, OpenSSL_version(OPENSSL_VERSION));
	evbuffer_add_printf(o, "\"}");
	put_value(o, 1);
	put_head(o, "pgbouncer_config_max_client_connections", "gauge", "max_client_conn");
	evbuffer_add_printf(o, "pgbouncer_config_max_client_connections");
	put_value(o, m.cf->g.max_client_conn);
	put_head(o, "pgbouncer_config_max_user_connections", "gauge", "max_user_connections");
	evbuffer_add_printf(o, "pgbouncer_config_max_user_connections");
	put_value(o, m.cf->g.max_user_connections);

	static const char *const db_labels[] = {"database"};
	static const char *const pool_labels[] = {"database", "user"};
	static const char *const dbs_labels[] = {"name", "host", "port", "database", "force_user", "pool_mode"};
	if (s->t[Q_LISTS].ok)
		put_lists(o, &s->t[Q_LISTS]);
	if (s->t[Q_POOLS].ok)
		put_table(o, &s->t[Q_POOLS], "pgbouncer_pools_", pool_labels, 2, pool_metrics,
		          sizeof(pool_metrics) / sizeof(pool_metrics[0]));
	if (s->t[Q_STATS].ok) {
		put_table(o, &s->t[Q_STATS], "pgbouncer_stats_totals_", db_labels, 1, stats_metrics,
		          sizeof(stats_metrics) / sizeof(stats_metrics[0]));
		put_table(o, &s->t[Q_STATS], "pgbouncer_stats_", db_labels, 1, stats_metrics,
		          sizeof(stats_metrics) / sizeof(stats_metrics[0]));
	}
	if (s->t[Q_DATABASES].ok)
		put_table(o, &s->t[Q_DATABASES], "pgbouncer_databases_", dbs_labels, 6, database_metrics,
		          sizeof(database_metrics) / sizeof(database_metrics[0]));
	if (s->t[Q_CLIENTS].ok)
		put_clients(o, &s->t[Q_CLIENTS]);
	put_workers(o);
	put_scaler(o);
}

/* ---- bounds that were hit, in the log ---- */

static void bound_tick(evutil_socket_t fd, short what, void *arg)
{
	LogBound *b = arg;
	if (b->hits == 0) {
		b->counting = false; /* the next hit is logged at once */
		return;
	}
	log_warning("metrics: %s (%llu more times in the last %d s)", b->last, (unsigned long long)b->hits,
	            LOG_INTERVAL_SEC);
	b->hits = 0;
	struct timeval tv = {LOG_INTERVAL_SEC, 0};
	evtimer_add(b->timer, &tv);
}

/*
 * Bound `b` was hit, for the reason `fmt` says: logged at once if the last
 * line of `b` is LOG_INTERVAL_SEC old, else counted for the next line, so
 * that a flood of requests does not become a flood of log lines.
 */
static void bound_hit(LogBound *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bound_hit(LogBound *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(b->last, sizeof(b->last), fmt, ap);
	va_end(ap);
	if (b->counting) {
		b->hits++;
		return;
	}
	log_warning("metrics: %s", b->last);
	if (!b->timer)
		b->timer = evtimer_new(m.base, bound_tick, b);
	struct timeval tv = {LOG_INTERVAL_SEC, 0};
	if (b->timer && evtimer_add(b->timer, &tv) == 0)
		b->counting = true;
}

static void bound_reset(LogBound *b)
{
	if (b->timer)
		event_free(b->timer);
	memset(b, 0, sizeof(*b));
}

/* ---- HTTP ---- */

/*
 * Free a bufferevent made without BEV_OPT_CLOSE_ON_FREE and close its socket
 * now: libevent 2.1 finalizes a freed bufferevent later in its loop, and
 * with it would close the socket only then, so that a burst of connections
 * closed to make room would hold their descriptors past the cap.
 */
static void bev_close(struct bufferevent *bev)
{
	evutil_socket_t fd = bufferevent_getfd(bev);
	bufferevent_disable(bev, EV_READ | EV_WRITE); /* its events leave the loop before the socket closes */
	bufferevent_free(bev);
	if (fd >= 0)
		evutil_closesocket(fd);
}

/* Say goodbye to the console and forget the scrape. */
static void scrape_free(Scrape *s)
{
	for (Scrape **pp = &m.scrapes; *pp; pp = &(*pp)->next)
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	s->conn->scrape = NULL;
	if (s->bev && bufferevent_getfd(s->bev) >= 0) {
		/* Terminate: the console closes its side quietly */
		static const char terminate[5] = {'X', 0, 0, 0, 4};
		(void)!send(bufferevent_getfd(s->bev), terminate, sizeof(terminate), MSG_DONTWAIT | MSG_NOSIGNAL);
	}
	if (s->bev)
		bev_close(s->bev);
	if (s->deadline)
		event_free(s->deadline);
	for (int i = 0; i < N_QUERIES; i++)
		table_free(&s->t[i]);
	free(s);
}

static void conn_free(Conn *c)
{
	/* nobody waits for its scrape: the console connection goes too, so scrapes never outnumber connections */
	if (c->scrape)
		scrape_free(c->scrape);
	if (c->prev)
		c->prev->next = c->next;
	else
		m.conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	else
		m.conns_tail = c->prev;
	m.n_conns--;
	event_free(c->deadline);
	bev_close(c->bev);
	free(c);
}

static void set_deadline(Conn *c, int sec)
{
	struct timeval tv = {sec, 0};
	evtimer_add(c->deadline, &tv);
}

/*
 * The head of the answer; the caller adds a body of `body_len` bytes unless
 * the request was HEAD. Every answer closes its connection: one request per
 * connection is what the bounds count (the request's deadline runs from the
 * accept), and it leaves nothing open between scrapes.
 */
static void conn_reply_head(Conn *c, int status, const char *reason, const char *type, const char *extra,
                            size_t body_len)
{
	char date[64] = "";
	time_t now = time(NULL);
	struct tm tm;
	if (gmtime_r(&now, &tm))
		strftime(date, sizeof(date), "Date: %a, %d %b %Y %H:%M:%S GMT\r\n", &tm);
	evbuffer_add_printf(
	    bufferevent_get_output(c->bev),
	    "HTTP/1.1 %d %s\r\n%sContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: close\r\n\r\n", status,
	    reason, date, type, body_len, extra);
	c->phase = CONN_REPLY;
	set_deadline(c, REPLY_TIMEOUT_SEC);
}

static void conn_reply_text(Conn *c, int status, const char *reason, const char *extra, const char *text)
{
	size_t len = strlen(text);
	conn_reply_head(c, status, reason, "text/plain; charset=utf-8", extra, len);
	if (!c->head_only)
		evbuffer_add(bufferevent_get_output(c->bev), text, len);
}

static void scrape_finish(Scrape *s)
{
	if (s->err[0])
		bound_hit(&m.bounds[B_SCRAPE], "%s", s->err);
	Conn *c = s->conn;
	struct evbuffer *o = evbuffer_new();
	if (o) {
		render(s, o);
		conn_reply_head(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", "", evbuffer_get_length(o));
		if (!c->head_only)
			evbuffer_add_buffer(bufferevent_get_output(c->bev), o);
		evbuffer_free(o);
	} else {
		conn_reply_text(c, 500, "Internal Server Error", "", "out of memory\n");
	}
	scrape_free(s);
}

static void scrape_start(Conn *c)
{
	Scrape *s = xcalloc(1, sizeof(*s));
	s->conn = c;
	s->worker = -1;
	s->q = -1;
	s->t[Q_CLIENTS].keep = client_labels; /* a row per client: only what the metric counts by */
	s->t[Q_CLIENTS].n_keep = N_CLIENT_LABELS;
	s->next = m.scrapes;
	m.scrapes = s;
	c->scrape = s;
	c->phase = CONN_SCRAPE;
	evtimer_del(c->deadline);
	s->deadline = evtimer_new(m.base, on_scrape_deadline, s);
	struct timeval tv = {SCRAPE_TIMEOUT_SEC, 0};
	if (!s->deadline || evtimer_add(s->deadline, &tv) < 0) {
		snprintf(s->err, sizeof(s->err), "evtimer_new() failed");
		scrape_finish(s);
		return;
	}
	if (!scrape_connect(s))
		scrape_finish(s); /* pgbouncer_up 0, with the workers and the scaler */
}

/* A whole request head: answer it, or start the scrape. */
static void conn_request(Conn *c, const HttpRequest *req)
{
	c->head_only = req->method == HTTP_HEAD;
	if (req->method == HTTP_OTHER)
		conn_reply_text(c, 405, "Method Not Allowed", "Allow: GET, HEAD\r\n", "only GET and HEAD\n");
	else if (req->path_len != strlen("/metrics") || memcmp(req->path, "/metrics", req->path_len) != 0)
		conn_reply_text(c, 404, "Not Found", "", "only /metrics is served here\n");
	else
		scrape_start(c);
}

static void on_conn_read(struct bufferevent *bev, void *arg)
{
	Conn *c = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	size_t len = evbuffer_get_length(in);
	if (c->phase == CONN_REQUEST) {
		HttpRequest req;
		const char *head = (const char *)evbuffer_pullup(in, -1);
		if (!head) {
			conn_free(c);
			return;
		}
		switch (http_request_parse(head, len, MAX_REQUEST_HEAD, &c->head_looked, &req)) {
		case HTTP_NEED_MORE:
			return; /* below the read watermark: libevent reads on */
		case HTTP_TOO_LARGE:
			bound_hit(&m.bounds[B_HEAD], "closed a connection whose request head was over %d bytes",
			          MAX_REQUEST_HEAD);
			c->no_linger = true;
			conn_reply_text(c, 431, "Request Header Fields Too Large", "", "request head too large\n");
			break;
		case HTTP_BAD:
			c->no_linger = true;
			conn_reply_text(c, 400, "Bad Request", "", "not an HTTP/1.x request\n");
			break;
		case HTTP_DONE:
			conn_request(c, &req);
			break;
		}
	}
	/* after the head nothing is kept: a body, a second request or more header lines are dropped */
	evbuffer_drain(in, len);
}

static void on_conn_write(struct bufferevent *bev, void *arg)
{
	Conn *c = arg;
	if (c->phase != CONN_REPLY)
		return;
	if (c->no_linger || c->peer_done) {
		conn_free(c);
		return;
	}
	/*
	 * Our side is done. Reading on until the client closes keeps bytes it
	 * sent after the head from turning our close into a reset, which could
	 * cut the answer short on its side.
	 */
	shutdown(bufferevent_getfd(bev), SHUT_WR);
	c->phase = CONN_LINGER;
}

static void on_conn_event(struct bufferevent *bev, short what, void *arg)
{
	Conn *c = arg;
	if ((what & BEV_EVENT_EOF) && !(what & BEV_EVENT_ERROR) &&
	    (c->phase == CONN_SCRAPE || c->phase == CONN_REPLY)) {
		c->peer_done = true; /* the client shut its sending side after the request: it still gets the answer */
		return;
	}
	conn_free(c);
}

static void on_conn_deadline(evutil_socket_t fd, short what, void *arg)
{
	Conn *c = arg;
	if (c->phase == CONN_REQUEST)
		bound_hit(&m.bounds[B_REQUEST_TIME], "closed a connection that sent no complete request within %d s",
		          REQUEST_TIMEOUT_SEC);
	else if (c->phase == CONN_REPLY)
		bound_hit(&m.bounds[B_REPLY_TIME], "closed a connection that had not taken its answer within %d s",
		          REPLY_TIMEOUT_SEC);
	conn_free(c);
}

static void conn_new(evutil_socket_t fd)
{
	Conn *c = xcalloc(1, sizeof(*c));
	c->bev = bufferevent_socket_new(m.base, fd, 0); /* closed by bev_close() */
	c->deadline = evtimer_new(m.base, on_conn_deadline, c);
	if (!c->bev || !c->deadline) {
		bound_hit(&m.bounds[B_ACCEPT],
		          "cannot take a connection: bufferevent_socket_new() or evtimer_new() failed");
		if (c->bev)
			bufferevent_free(c->bev);
		evutil_closesocket(fd);
		if (c->deadline)
			event_free(c->deadline);
		free(c);
		return;
	}
	c->prev = m.conns_tail;
	if (m.conns_tail)
		m.conns_tail->next = c;
	else
		m.conns = c;
	m.conns_tail = c;
	m.n_conns++;
	bufferevent_setcb(c->bev, on_conn_read, on_conn_write, on_conn_event, c);
	/* libevent reads no further than the bound on the head */
	bufferevent_setwatermark(c->bev, EV_READ, 0, MAX_REQUEST_HEAD);
	bufferevent_enable(c->bev, EV_READ);
	set_deadline(c, REQUEST_TIMEOUT_SEC);
}

/* The oldest connection without a request in progress: still reading its head, or done. */
static Conn *oldest_idle(void)
{
	for (Conn *c = m.conns; c; c = c->next)
		if (c->phase == CONN_REQUEST || c->phase == CONN_LINGER)
			return c;
	return NULL;
}

/*
 * At metrics_max_connections a new connection takes the place of the oldest
 * one without a request in progress, so that connections opened and left
 * idle cannot lock a scraper out for long; when every open connection has a
 * request in progress, the new one is closed at once.
 */
static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
	int cap = m.cf->g.metrics_max_connections;
	if (m.n_conns >= cap) {
		Conn *idle;
		while (m.n_conns >= cap && (idle = oldest_idle()) != NULL)
			conn_free(idle);
		if (m.n_conns >= cap) {
			evutil_closesocket(fd);
			bound_hit(&m.bounds[B_CAP_REFUSED],
			          "metrics_max_connections (%d) reached: refused a connection, every open one has a "
			          "request in progress",
			          cap);
			return;
		}
		bound_hit(&m.bounds[B_CAP_CLOSED],
		          "metrics_max_connections (%d) reached: closed the oldest connection without a request in "
		          "progress",
		          cap);
	}
	conn_new(fd);
}

/* accept() failed for want of descriptors or memory: pause rather than spin on the ready socket. */
static void on_accept_error(struct evconnlistener *l, void *arg)
{
	int e = EVUTIL_SOCKET_ERROR();
	bound_hit(&m.bounds[B_ACCEPT], "accept() failed: %s; accepting again in %d s", strerror(e), ACCEPT_PAUSE_SEC);
	evconnlistener_disable(l);
	struct timeval tv = {ACCEPT_PAUSE_SEC, 0};
	evtimer_add(m.accept_resume, &tv);
}

static void on_accept_resume(evutil_socket_t fd, short what, void *arg)
{
	evconnlistener_enable(m.listener);
}

/* "host:port", "[v6]:port" or "*:port"; false if it is none of those. */
static bool split_listen(const char *spec, char *host, size_t hostlen, int *port)
{
	const char *colon = strrchr(spec, ':');
	if (!colon || colon == spec)
		return false;
	char *end;
	long p = strtol(colon + 1, &end, 10);
	if (*end || end == colon + 1 || p < 1 || p > 65535)
		return false;
	*port = (int)p;
	const char *h = spec;
	size_t hl = (size_t)(colon - spec);
	if (h[0] == '[' && hl >= 2 && h[hl - 1] == ']') {
		h++;
		hl -= 2;
	}
	if (hl == 1 && h[0] == '*') {
		h = "0.0.0.0";
		hl = 7;
	}
	if (hl == 0 || hl >= hostlen)
		return false;
	memcpy(host, h, hl);
	host[hl] = '\0';
	return true;
}

/*
 * The listening socket, with SO_REUSEPORT: during an online restart (-R) the
 * new master binds the port while the old one still serves it, and the old
 * one's copy goes away when it exits (doc/workers.md, "Upgrading").
 */
static int metrics_socket(const char *host, int port)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
	struct addrinfo *res = NULL;
	char portstr[16];
	snprintf(portstr, sizeof(portstr), "%d", port);
	int rc = getaddrinfo(host[0] ? host : NULL, portstr, &hints, &res);
	if (rc != 0) {
		errno = EADDRNOTAVAIL;
		return -1;
	}
	int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	int one = 1;
	if (fd >= 0 && (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	                setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) < 0 ||
	                bind(fd, res->ai_addr, res->ai_addrlen) < 0 || listen(fd, 128) < 0)) {
		int e = errno;
		close(fd);
		errno = e;
		fd = -1;
	}
	freeaddrinfo(res);
	return fd;
}

void metrics_start(struct event_base *base, const Config *cf, ShmSegment *shm)
{
	const char *spec = cf->g.metrics_listen;
	if (!spec || !spec[0])
		return;
	char host[256];
	int port;
	if (!split_listen(spec, host, sizeof(host), &port))
		fatal("metrics_listen: '%s' is not host:port", spec);
	m.base = base;
	m.cf = cf;
	m.shm = shm;
	m.accept_resume = evtimer_new(base, on_accept_resume, NULL);
	if (!m.accept_resume)
		fatal("evtimer_new() failed");
	int fd = metrics_socket(host, port);
	/* backlog 0: metrics_socket() listens already */
	m.listener =
	    fd >= 0 ? evconnlistener_new(base, on_accept, NULL, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 0, fd)
	            : NULL;
	if (!m.listener)
		fatal("metrics_listen: cannot listen on %s: %s", spec, strerror(errno));
	evconnlistener_set_error_cb(m.listener, on_accept_error);
	log_info("metrics: serving /metrics on %s", spec);
}

void metrics_stop(void)
{
	while (m.conns)
		conn_free(m.conns); /* and the scrapes */
	pgb_assert(!m.scrapes);
	if (m.listener) {
		evconnlistener_free(m.listener);
		m.listener = NULL;
	}
	if (m.accept_resume) {
		event_free(m.accept_resume);
		m.accept_resume = NULL;
	}
	for (int i = 0; i < N_BOUNDS; i++)
		bound_reset(&m.bounds[i]);
}

void metrics_retire(void)
{
	if (m.listener) {
		evconnlistener_free(m.listener);
		m.listener = NULL;
	}
	if (m.accept_resume)
		evtimer_del(m.accept_resume);
}

void metrics_forget_in_child(void)
{
	/* a worker must not hold the metrics port, a client's connection or a scrape's console connection */
	if (m.listener)
		close(evconnlistener_get_fd(m.listener));
	for (Conn *c = m.conns; c; c = c->next)
		if (bufferevent_getfd(c->bev) >= 0)
			close(bufferevent_getfd(c->bev));
	for (Scrape *s = m.scrapes; s; s = s->next)
		if (s->bev && bufferevent_getfd(s->bev) >= 0)
			close(bufferevent_getfd(s->bev));
}
