/*
 * auth_query at run time: a client whose user is not in the auth_file waits
 * (still logging in) while an ordinary pooled server connection of
 * (auth database, auth_user) runs auth_query for its name; the secret found
 * then drives the normal password exchange (auth.c), as if from the auth_file.
 */
#include "autoconfig.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/pktbuf.h"
#include "common/util.h"
#include "worker/auth_query_msg.h"
#include "worker/auth.h"
#include "worker/auth_query.h"
#include "worker/hooks.h"
#include "worker/objects.h"
#include "worker/pool.h"
#include "worker/pool_settings.h"
#include "worker/server.h"
#include "worker/worker.h"

/* One lookup: queued for a server of its pool, then running on one. */
struct AuthQuery {
	List node;                         /* in auth_query_queue while it waits for a server */
	PgSocket *client;                  /* who waits; NULL once gone (a running query still finishes) */
	PgSocket *server;                  /* the server running it; NULL while queued */
	PgDatabase *db;                    /* auth database */
	PgUser *user;                      /* auth_user */
	char *query;                       /* auth_query, copied: a reload may change the config meanwhile */
	char login[USERLIST_MAX_USER + 1]; /* $1 */
	int rows;                          /* DataRows seen */
	AuthqRow result;                   /* of the first row */
	char *secret;                      /* of the first row */
	char problem[256];                 /* why the answer is unusable; "" = fine */
};

/* Lookups waiting for a server, oldest first (across pools). */
static const char *nonempty(const char *s)
{
	return s && *s ? s : NULL;
}

static void free_lookup(AuthQuery *q)
{
	free(q->secret);
	free(q->query);
	free(q);
}

/*
 * The client cannot log in because the lookup could not be done: the
 * server's error when the auth_user's login got one (as every client
 * waiting for a failing pool hears it), else the spec's generic error.
 */
static void fail_lookup_with(AuthQuery *q, const char *sqlstate, const char *msg)
{
	PgSocket *c = q->client;
	if (c) {
		c->auth_query = NULL;
		if (sqlstate) {
			client_send_error(c, true, sqlstate, "%s", msg);
			disconnect_client(c, false, "%s", msg);
		} else {
			disconnect_client(c, true, "bouncer config error");
		}
	}
	free_lookup(q);
}

static void fail_lookup(AuthQuery *q)
{
	fail_lookup_with(q, NULL, NULL);
}

static AuthQuery *first_queued(const PgPool *pool)
{
	List *i;
	list_for_each(i, &auth_query_queue)
	{
		AuthQuery *q = container_of(i, AuthQuery, node);
		if (q->db == pool->db && q->user == pool->user)
			return q;
	}
	return NULL;
}

bool auth_query_waiting_slow(const PgPool *pool)
{
	return first_queued(pool) != NULL;
}

bool auth_query_wanted(const PgSocket *c)
{
	const PgDatabase *db = c->db;
	const PgUser *u = c->login_user;
	/* auth_type=any ignores the client's user name altogether, and PAM and LDAP know their users */
	if (!db || db->placeholder || wk.cf.g.auth_type == AUTH_ANY || wk.cf.g.auth_type == AUTH_PAM ||
	    wk.cf.g.auth_type == AUTH_LDAP || !db_auth_user(db))
		return false;
	/* the console has no server of its own: it looks users up only in the auth_dbname */
	if (db->admin && (!nonempty(wk.cf.g.auth_dbname) || auth_console_peer(c)))
		return false;
	return !u || !u->secret || u->from_auth_query;
}

SBufAction auth_query_start(PgSocket *c)
{
	PgDatabase *cdb = c->db;
	const char *auth_user = db_auth_user(cdb);
	const char *query = db_auth_query(cdb);
	const char *dbname = db_auth_dbname(cdb);
	PgDatabase *adb = NULL;
	if (!query) {
		slog(LG_WARNING, c, "auth_query is empty: cannot look up user %s", c->app_name_raw);
		disconnect_client(c, true, "bouncer config error");
		return SB_CLOSED;
	}
	/* a database entry's auth_dbname of "pgbouncer" fails its logins (the global one
	 * cannot be loaded); both log lines are PgBouncer's (doc/pgbouncer.5.md "auth_dbname") */
	if (strcmp(dbname, "pgbouncer") == 0) {
		slog(LG_ERROR, c, "cannot use the reserved \"pgbouncer\" database as an auth_dbname");
		disconnect_client(c, true, "bouncer config error");
		return SB_CLOSED;
	}
	if (strlen(dbname) < CF_MAX_DBNAME) {
		adb = db_find(dbname);
		if (!adb)
			adb = db_register_auto(dbname);
	}
	if (!adb || adb->placeholder) {
		slog(LG_ERROR, c, "authentication database \"%s\" is not configured.", dbname);
		disconnect_client(c, true, "bouncer config error");
		return SB_CLOSED;
	}
	if (adb->disabled) {
		slog(LG_WARNING, c, "auth_query cannot run: auth database %s is disabled (DISABLE)", adb->name);
		disconnect_client(c, true, "authentication database \"%s\" is disabled", adb->name);
		return SB_CLOSED;
	}

	PgPool *pool = pool_get(adb, user_add(auth_user));
	/* within server_login_retry of a failed login and no server to use: don't wait for nothing */
	if (pool_login_failing(pool)) {
		slog(LG_WARNING, c, "auth_query cannot run: login of auth_user %s to database %s has been failing: %s",
		     pool->user->name, adb->name, pool->failed_msg);
		(void)pool_fast_fail(c, pool);
		return SB_CLOSED;
	}

	AuthQuery *q = xcalloc(1, sizeof(*q));
	list_init(&q->node);
	q->client = c;
	q->db = adb;
	q->user = pool->user;
	q->query = xstrdup(query);
	pgb_strlcpy(q->login, c->app_name_raw, sizeof(q->login));
	c->auth_query = q;
	list_append(&auth_query_queue, &q->node);
	/* nothing is read from the client until its secret is known */
	sbuf_pause(&c->sb);
	pool_wake_waiters(pool);
	return c->state == CL_JUSTFREE ? SB_CLOSED : SB_CONSUMED;
}

/* Send the lookup to a server that the pool gave us. */
static void run_lookup(AuthQuery *q, PgSocket *s)
{
	list_del(&q->node);
	q->server = s;
	s->auth_query = q;
	change_state(s, SV_ACTIVE);
	s->ready = false;
	s->request_time = wk.now;

	PktBuf pb;
	pktbuf_init(&pb, 128 + strlen(q->query) + strlen(q->login));
	authq_write_request(&pb, q->query, q->login);
	bool ok = sbuf_send(&s->sb, pb.buf, pb.len);
	pktbuf_free(&pb);
	if (!ok)
		disconnect_server(s, false, "server conn crashed?"); /* fails the lookup (auth_query_server_gone) */
}

void auth_query_wake_slow(PgPool *pool)
{
	/* from the head each time: a failure may take other lookups with it */
	for (;;) {
		AuthQuery *q = first_queued(pool);
		if (!q)
			return;
		PgSocket *s = pool_take_idle(pool);
		if (!s)
			return;
		run_lookup(q, s);
	}
}

void auth_query_pool_failed(PgPool *pool, const char *sqlstate, const char *msg, bool from_server)
{
	/* 57P03 (the server is starting up) says nothing about the set-up: the generic error */
	bool tell = from_server && sqlstate && strcmp(sqlstate, "57P03") != 0;
	bool logged = false;
	AuthQuery *q;
	while ((q = first_queued(pool)) != NULL) {
		list_del(&q->node);
		if (!logged && q->client) {
			char hint[1024];
			authq_error_hint(sqlstate, msg, q->user->name,
			                 q->db->cf.dbname ? q->db->cf.dbname : q->db->name, q->query, hint,
			                 sizeof(hint));
			if (!q->user->secret && !hint[0])
				snprintf(hint, sizeof(hint), "the auth_user %s has no password in auth_file",
				         q->user->name);
			slog(LG_WARNING, q->client,
			     "auth_query cannot run: login of auth_user %s to database %s failed: %s%s%s",
			     q->user->name, q->db->name, msg, hint[0] ? "; " : "", hint);
			logged = true;
		}
		fail_lookup_with(q, tell ? sqlstate : NULL, msg);
	}
}

void auth_query_client_gone(PgSocket *c)
{
	AuthQuery *q = c->auth_query;
	if (!q)
		return;
	c->auth_query = NULL;
	q->client = NULL;
	if (!q->server) {
		list_del(&q->node);
		free_lookup(q);
	}
	/* a running lookup finishes on its server, which then goes back to the pool */
}

void auth_query_server_gone(PgSocket *s)
{
	AuthQuery *q = s->auth_query;
	if (!q)
		return;
	s->auth_query = NULL;
	q->server = NULL;
	if (q->client)
		slog(LG_WARNING, q->client, "auth_query failed: the server connection closed while it ran");
	fail_lookup(q);
}

/* The answer is complete: continue the client's login with the secret, or refuse it. */
static void conclude(AuthQuery *q)
{
	PgSocket *c = q->client;
	if (!c) {
		free_lookup(q);
		return;
	}
	if (q->problem[0]) {
		slog(LG_WARNING, c, "auth_query for user %s: %s", q->login, q->problem);
		fail_lookup(q);
		return;
	}
	c->auth_query = NULL;
	/*
	 * The database's own user of that name: another database's lookup may
	 * have asked another server, and its secret is not this one's. An
	 * auth_file entry that a reload brought meanwhile wins.
	 */
	PgUser *g = user_find(q->login);
	bool from_file = g && g->secret && !g->from_auth_query;
	PgUser *u = from_file ? g : user_find_scoped(c->db->name, q->login);
	if (q->rows == 0) {
		/* the role is gone, or never was: forget a secret fetched earlier */
		if (u && u->from_auth_query)
			user_set_secret(u, NULL, SECRET_EMPTY);
		if (wk.cf.g.log_connections) {
			slog(LG_LOG, c, "login failed: db=%s user=%s", c->db->name, q->login);
			slog(LG_LOG, c, "no such user: %s", q->login);
		}
		free_lookup(q);
		disconnect_client(c, true, "no such user");
		return;
	}
	if (!u)
		u = user_add_scoped(c->db->name, q->login);
	if (!from_file) {
		if (q->result == AUTHQ_ROW_NULL)
			user_set_secret(u, "", SECRET_EMPTY); /* exists, but no password ever matches */
		else
			user_set_secret(u, q->secret, userlist_secret_kind(q->secret));
		u->from_auth_query = true;
		u->secret_time = get_time_usec(); /* the newest wins when a client moves in (migrate.c) */
	}
	c->login_user = u;
	free_lookup(q);
	if (auth_start(c) == SB_CLOSED)
		return;
	/* read again: the password message, or (trust) the first query; a client waiting for its welcome stays paused */
	if (c->state == CL_LOGIN || c->state == CL_ACTIVE)
		sbuf_continue(&c->sb);
}

/* Fields S, C, M of an ErrorResponse body. */
static void error_fields(const uint8_t *body, uint32_t len, const char **sev, const char **code, const char **msg)
{
	PktReader r;
	uint8_t t;
	const char *v;
	*sev = "ERROR";
	*code = "XX000";
	*msg = "";
	pktreader_init(&r, body, len);
	while (pktreader_get_u8(&r, &t) && t != 0 && pktreader_get_string(&r, &v)) {
		if (t == 'S')
			*sev = v;
		else if (t == 'C')
			*code = v;
		else if (t == 'M')
			*msg = v;
	}
}

/* The server refused the query: log what it means for the set-up, close that server. */
static SBufAction query_failed(PgSocket *s, AuthQuery *q, const uint8_t *body, uint32_t len)
{
	const char *sev, *code, *msg;
	char hint[1024];
	error_fields(body, len, &sev, &code, &msg);
	authq_error_hint(code, msg, q->user->name, q->db->cf.dbname ? q->db->cf.dbname : q->db->name, q->query, hint,
	                 sizeof(hint));
	slog(LG_WARNING, s, "auth_query for user %s failed: %s %s (SQLSTATE %s)%s%s", q->login, sev, msg, code,
	     hint[0] ? "; " : "", hint);
	s->auth_query = NULL;
	q->server = NULL;
	disconnect_server(s, true, "auth_query failed");
	fail_lookup(q);
	return SB_CLOSED;
}

/* The first reason why the answer is unusable is the one reported. */
static void set_problem(AuthQuery *q, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_problem(AuthQuery *q, const char *fmt, ...)
{
	va_list ap;
	if (q->problem[0])
		return;
	va_start(ap, fmt);
	vsnprintf(q->problem, sizeof(q->problem), fmt, ap);
	va_end(ap);
}

SBufAction auth_query_server_packet(PgSocket *s, const PktHdr *hdr, const uint8_t *data, uint32_t avail)
{
	AuthQuery *q = s->auth_query;
	bool full = avail >= hdr->len;
	const uint8_t *body = data + 5;
	uint32_t blen = hdr->len - 5;

	switch (hdr->type) {
	case '1': /* ParseComplete */
	case '2': /* BindComplete */
	case 'C': /* CommandComplete */
	case 'N': /* NoticeResponse */
	case 'A': /* NotificationResponse */
		return SB_SKIP;
	case 'n': /* NoData: a statement without a result */
		set_problem(q, "auth_query must return 2 columns (user name, password), it returns no rows");
		return SB_SKIP;
	case 'I': /* EmptyQueryResponse */
		set_problem(q, "auth_query is empty");
		return SB_SKIP;
	case 'S':
		if (!full)
			return SB_NEED_FULL;
		if (!server_param_status(s, body, blen))
			set_problem(q, "malformed ParameterStatus from server");
		return SB_CONSUMED;
	case 'T': {
		if (!full)
			return SB_NEED_FULL;
		int cols = authq_row_columns(body, blen);
		if (cols != 2)
			set_problem(q, "auth_query must return 2 columns (user name, password), it returns %d", cols);
		return SB_CONSUMED;
	}
	case 'D':
		if (!full)
			return SB_NEED_FULL;
		if (++q->rows == 1 && !q->problem[0]) {
			char err[200];
			q->result = authq_parse_row(body, blen, USERLIST_MAX_SECRET, &q->secret, err, sizeof(err));
			if (q->result == AUTHQ_ROW_BAD)
				set_problem(q, "%s", err);
		} else if (q->rows == 2) {
			set_problem(q, "auth_query returned more than one row for one user name");
		}
		return SB_CONSUMED;
	case 'E':
		if (!full)
			return SB_NEED_FULL;
		return query_failed(s, q, body, blen);
	case 'Z': {
		if (!full)
			return SB_NEED_FULL;
		s->txn_status = blen > 0 ? (char)body[0] : 'I';
		s->ready = true;
		s->auth_query = NULL;
		q->server = NULL;
		/* the server goes back to its pool first (reset in any pool mode), then the client goes on */
		if (s->txn_status != 'I')
			disconnect_server(s, true, "auth_query left a transaction open");
		else
			server_reset_or_ready(s, true);
		conclude(q);
		return s->state == SV_JUSTFREE ? SB_CLOSED : SB_CONSUMED;
	}
	default:
		/* COPY or anything else a lookup has no business starting */
		slog(LG_WARNING, s, "auth_query for user %s: unexpected '%c' message from server", q->login, hdr->type);
		s->auth_query = NULL;
		q->server = NULL;
		disconnect_server(s, true, "unexpected auth_query answer");
		fail_lookup(q);
		return SB_CLOSED;
	}
}
