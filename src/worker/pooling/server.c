/*
 * Server connections: connect, log in (trust, cleartext, md5, SCRAM with a
 * password or with a client's pass-through keys), capture the pool's
 * welcome, then forward responses to the linked client and run reset,
 * check and parameter-replay queries whose answers clients never see.
 */
#include "autoconfig.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>

#include "common/log.h"
#include "common/pktbuf.h"
#include "common/util.h"
#include "worker/dns.h"
#include "worker/client.h"
#include "worker/hooks.h"
#include "worker/objects.h"
#include "worker/pool.h"
#include "worker/pool_settings.h"
#include "worker/server.h"
#include "worker/txn.h"
#include "worker/worker.h"

/* Entries in the database's host list (1 for a single host or none). */
static int host_count(const PgDatabase *db)
{
	int n = 1;
	for (const char *p = db->cf.host; p && *p; p++)
		n += *p == ',';
	return n;
}

/*
 * Pick the host for a new connection (host lists rotate per pool's
 * database). `host` receives the host list entry used (the name TLS
 * verify-full checks).
 */
static DnsResult pick_address(PgPool *pool, struct sockaddr_storage *ss, socklen_t *len, char *host, size_t hostlen,
                              char *err, size_t errlen)
{
	PgDatabase *db = pool->db;
	int port = db_server_port(db);
	host[0] = '\0';
	if (db->cf.host && *db->cf.host) {
		/* comma-separated list: choose one entry */
		int want = db->host_index % host_count(db);
		const char *p = db->cf.host;
		for (int i = 0; i < want; i++)
			p = strchr(p, ',') + 1;
		size_t l = strcspn(p, ",");
		while (l > 0 && (*p == ' '))
			p++, l--;
		while (l > 0 && p[l - 1] == ' ')
			l--;
		if (l >= hostlen) {
			snprintf(err, errlen, "host name too long");
			return DNS_FAIL;
		}
		memcpy(host, p, l);
		host[l] = '\0';
	} else {
		pgb_strlcpy(host, wk.cf.g.unix_socket_dir ? wk.cf.g.unix_socket_dir : "/tmp", hostlen);
		if (!host[0])
			pgb_strlcpy(host, "/tmp", hostlen);
	}
	/* a name goes through c-ares (cached); an address or a socket directory is used as it is */
	DnsResult r = dns_address(host, port, ss, len, err, errlen);
	/* round-robin moves on at every attempt; disable sticks to a host until it fails (pool_login_failed()) */
	if (r == DNS_FAIL || (r == DNS_OK && db->cf.load_balance_hosts == LB_ROUND_ROBIN))
		db->host_index++;
	return r;
}

/*
 * The StartupMessage. A replication server also carries `replication`, its
 * client's tracked parameters (which win over the database's) and the
 * client's `options` verbatim: a walsender takes no SET (doc/pgbouncer.1.md, "REPLICATION CONNECTIONS").
 */
static void send_startup(PgSocket *s)
{
	PgPool *pool = s->pool;
	PgDatabase *db = pool->db;
	const PgSocket *repl = s->replication != REPLICATION_NONE ? s->link : NULL;
	PktBuf pb;
	pktbuf_init(&pb, 256);
	pktbuf_start_msg(&pb, 0);
	pktbuf_put_u32(&pb, PROTO_V3_0);
	pktbuf_put_string(&pb, "database");
	pktbuf_put_string(&pb, db->cf.dbname ? db->cf.dbname : db->name);
	pktbuf_put_string(&pb, "user");
	pktbuf_put_string(&pb, pool->user->name);
	const char *extra[][2] = {{"client_encoding", db->cf.client_encoding},
	                          {"datestyle", db->cf.datestyle},
	                          {"timezone", db->cf.timezone},
	                          {"application_name", db->cf.application_name}};
	for (size_t i = 0; i < 4; i++) {
		int idx = var_index(extra[i][0]);
		if (extra[i][1] && !(repl && idx >= 0 && sock_var(repl, idx))) {
			pktbuf_put_string(&pb, extra[i][0]);
			pktbuf_put_string(&pb, extra[i][1]);
		}
	}
	if (s->replication != REPLICATION_NONE) {
		pktbuf_put_string(&pb, "replication");
		pktbuf_put_string(&pb, proto_replication_value(s->replication));
	}
	if (repl) {
		for (int i = 0; i < var_count(); i++)
			if (sock_var(repl, i)) {
				pktbuf_put_string(&pb, var_name(i));
				pktbuf_put_string(&pb, sock_var(repl, i));
			}
		if (repl->repl_options) {
			pktbuf_put_string(&pb, "options");
			pktbuf_put_string(&pb, repl->repl_options);
		}
	}
	pktbuf_put_u8(&pb, 0);
	pktbuf_finish_msg(&pb);
	(void)sbuf_send(&s->sb, pb.buf, pb.len);
	pktbuf_free(&pb);
}

/*
 * An attempt whose host did not resolve is a server connection that never
 * got an address, as in PgBouncer: it takes a connection id (SHOW
 * SERVERS, doc/workers.md "Connection ids") and logs one `closing
 * because: server DNS lookup failed`. It holds no budget and is closed
 * before anything can see it.
 */
static void dns_failed_attempt(PgPool *pool)
{
	PgSocket *s = socket_new(true);
	/* no s->pool, so in none of its lists: the close must not start the next attempt from here */
	s->db = pool->db;
	s->login_user = pool->user;
	s->state = SV_LOGIN;
	disconnect_server(s, false, "server DNS lookup failed");
}

/*
 * A connect that failed (refused, unreachable) to one address of a name
 * that has several: true when the next address is to be tried at once, as
 * libpq does, instead of after server_login_retry; false once each has
 * failed in a row (doc/pgbouncer.5.md, "host"). Nothing was sent, so the
 * next try changes nothing on any server.
 */
static bool next_address_at_once(PgPool *pool)
{
	if (++pool->connect_fail_run < pool->launch_addrs)
		return true;
	pool->connect_fail_run = 0;
	return false;
}

/* Inside failed_in_launch(): the server closing is the launch's own (server_closed()). */
static bool launch_failing;

/*
 * A connection that failed inside launch() itself (connect() to a unix
 * socket that is not there fails at once): its close does not launch the
 * next one from here, which would recurse for as long as it fails (with
 * server_login_retry = 0, until the stack ran out). The janitor retries.
 */
static void failed_in_launch(PgSocket *s, const char *reason)
{
	bool outer = launch_failing;
	launch_failing = true;
	disconnect_server(s, false, "%s", reason);
	launch_failing = outer;
}

/* A new server connection of the pool; for a replication client (repl_client), its own one. */
static bool launch(PgPool *pool, PgSocket *repl_client, BudgetHold *hold)
{
	struct sockaddr_storage ss;
	socklen_t len;
	char err[320], host[256];
	/* a name of a host list that does not resolve is skipped: the next one may */
	DnsResult r;
	int tries = host_count(pool->db);
	while ((r = pick_address(pool, &ss, &len, host, sizeof(host), err, sizeof(err))) == DNS_FAIL) {
		dns_failed_attempt(pool);
		if (--tries == 0)
			break;
	}
	if (r != DNS_OK)
		budget_hold_release(hold); /* no connection: the units go back */
	if (r == DNS_PENDING)
		return false; /* the lookup's end wakes the pool again */
	if (r == DNS_FAIL) {
		pool_login_failed(pool, NULL, err, false);
		/* no host resolves before dns_nxdomain_ttl passes: don't keep clients waiting */
		List *i, *tmp;
		list_for_each_safe(i, &pool->waiting_clients, tmp)
		    disconnect_client(container_of(i, PgSocket, node), true, "%s", err);
		return false;
	}
	pool->launch_addrs = dns_address_count(host);
	PgSocket *s = socket_new(true);
	s->pool = pool;
	s->login_user = pool->user;
	s->db = pool->db;
	s->budget = *hold; /* given back by disconnect_server(), whatever the path */
	hold->taken = false;
	pool->db->server_count++;
	pool->user->server_count++;
	change_state(s, SV_LOGIN);
	if (repl_client) {
		/* linked from the start: the two are closed together, even during the login */
		s->replication = repl_client->replication;
		s->link_mode = POOL_SESSION;
		s->link = repl_client;
		repl_client->link = s;
	}
	socket_set_remote(s, (const struct sockaddr *)&ss, len);
	s->is_unix = ss.ss_family == AF_UNIX;
	slog_debug(s, "launching new connection to server%s", repl_client ? " (replication)" : "");
	if (!s->is_unix && !wk.tls.server_ctx && wk.tls.server_deferred) {
		/* no context yet: it is built if PostgreSQL answers 'S' (handle_ssl_answer) */
		s->tls_host = xstrdup(host);
	} else if (!s->is_unix && wk.tls.server_ctx) {
		/* made now, while the host list entry is known: verify-full checks that name */
		s->tls_pending = tls_server_ssl_new(&wk.tls, host, err, sizeof(err));
		if (!s->tls_pending) {
			pool_login_failed(pool, NULL, err, false);
			failed_in_launch(s, err);
			return false;
		}
	}
	if (!sbuf_connect(&s->sb, wk.base, (struct sockaddr *)&ss, len, (uint32_t)wk.cf.g.pkt_buf,
	                  wk.cf.g.max_packet_size, tune_tcp_socket, server_cb, s)) {
		slog(LG_LOG, s, "connect failed: %s", strerror(s->sb.last_errno));
		if (!next_address_at_once(pool)) /* else the janitor's next pass tries the next address */
			pool_login_failed(pool, NULL, "server connect failed", false);
		failed_in_launch(s, "connect failed");
		return false;
	}
	return true;
}

bool server_launch(PgPool *pool, BudgetHold *hold)
{
	return launch(pool, NULL, hold);
}

bool server_launch_replication(PgPool *pool, PgSocket *client, BudgetHold *hold)
{
	return launch(pool, client, hold);
}

/* ---- login ---- */

/* We cannot log in (no usable password, protocol trouble): clients waiting for this pool are told why. */
static SBufAction login_fail(PgSocket *s, const char *why)
{
	char msg[300];
	snprintf(msg, sizeof(msg), "server login failed: %s", why);
	slog(LG_WARNING, s, "%s", msg);
	pool_login_failed(s->pool, "08P01", msg, true);
	disconnect_server(s, false, "%s", msg);
	return SB_CLOSED;
}

/*
 * We have no answer to the method the server asks for. A replication
 * server's fails only its own client, as a walsender's refusal does
 * (handle_login_packet()): PostgreSQL picks the method of a replication
 * login by lines of its own (`replication` in pg_hba.conf), which say
 * nothing about the pool's normal logins.
 */
static SBufAction auth_fail(PgSocket *s, const char *why)
{
	if (s->replication == REPLICATION_NONE || !s->link)
		return login_fail(s, why);
	char msg[300];
	snprintf(msg, sizeof(msg), "server login failed: %s", why);
	slog(LG_WARNING, s, "%s", msg);
	disconnect_server(s, false, "%s", msg); /* its client hears why */
	return SB_CLOSED;
}

/* PostgreSQL's one-byte answer to our SSLRequest. */
static SBufAction handle_ssl_answer(PgSocket *s, uint8_t answer, uint32_t avail)
{
	const char *why = NULL;
	slog_noise(s, "server login: SSL answer '%c'", answer);
	if (answer == 'S') {
		if (avail > 1) {
			why = "server sent unencrypted data after its SSL answer";
		} else {
			char err[320];
			SSL *ssl = s->tls_pending;
			s->tls_pending = NULL;
			if (ssl == NULL && s->tls_host != NULL) {
				/* the deferred context, built by the first server that offers TLS */
				ssl = tls_server_ctx_ensure(&wk.tls, &wk.cf.g, err, sizeof(err))
				          ? tls_server_ssl_new(&wk.tls, s->tls_host, err, sizeof(err))
				          : NULL;
				free(s->tls_host);
				s->tls_host = NULL;
				if (ssl == NULL)
					return login_fail(s, err);
			}
			if (sbuf_tls_start(&s->sb, ssl, false))
				return SB_CONSUMED;
			why = sbuf_tls_error();
		}
	} else if (answer == 'N') {
		SSL_free(s->tls_pending);
		s->tls_pending = NULL;
		free(s->tls_host);
		s->tls_host = NULL;
		if (wk.tls.server_sslmode < SSLMODE_REQUIRE) {
			send_startup(s);
			return SB_CONSUMED;
		}
		why = "server refused SSL";
	} else {
		why = "bad SSL answer from server";
	}
	return login_fail(s, why);
}

/*
 * The password of a pool's server logins: the database entry's password in
 * that entry's forced-user pool, else the pool user's auth_file (or
 * auth_query) secret. The entry's password is not the auth_user's for
 * auth_query pools of that database, and not the user's anywhere else.
 */
static const char *server_password(PgSocket *s, SecretKind *kind)
{
	PgUser *u = s->pool->user;
	const char *entry_pw = s->pool->db->cf.password;
	if (u == s->pool->db->forced_user && entry_pw && *entry_pw) {
		*kind = userlist_secret_kind(entry_pw);
		return entry_pw;
	}
	*kind = u->kind;
	return u->secret;
}

static bool send_password_msg(PgSocket *s, const void *data, size_t len)
{
	PktBuf pb;
	pktbuf_init(&pb, len + 8);
	pktbuf_start_msg(&pb, 'p');
	pktbuf_put_bytes(&pb, data, len);
	pktbuf_finish_msg(&pb);
	bool ok = sbuf_send(&s->sb, pb.buf, pb.len);
	pktbuf_free(&pb);
	return ok;
}

static SBufAction handle_auth_request(PgSocket *s, const uint8_t *body, uint32_t len)
{
	PktReader r;
	uint32_t code;
	pktreader_init(&r, body, len);
	if (!pktreader_get_u32(&r, &code))
		return login_fail(s, "bad auth packet from server");
	PgUser *u = s->pool->user;
	SecretKind kind;
	const char *pw = server_password(s, &kind);
	char err[128];

	slog_noise(s, "server login: authentication request %u", code);
	switch (code) {
	case 0:
		slog_debug(s, "server login: authentication ok");
		return SB_CONSUMED;
	case 3: /* cleartext */
		if (!pw || kind != SECRET_PLAIN)
			return auth_fail(s, "wrong password type");
		return send_password_msg(s, pw, strlen(pw) + 1) ? SB_CONSUMED : SB_CLOSED;
	case 5: { /* md5 */
		const uint8_t *salt;
		if (!pktreader_get_bytes(&r, 4, &salt))
			return login_fail(s, "bad md5 auth packet");
		if (!pw || (kind != SECRET_PLAIN && kind != SECRET_MD5))
			return auth_fail(s, "wrong password type");
		char resp[MD5_PASSWD_LEN + 1];
		md5_salted_response(pw, kind == SECRET_MD5, u->name, salt, resp);
		return send_password_msg(s, resp, strlen(resp) + 1) ? SB_CONSUMED : SB_CLOSED;
	}
	case 10: { /* SASL: list of mechanisms */
		if (!proto_sasl_has_mech(body + 4, len - 4, "SCRAM-SHA-256"))
			return auth_fail(s, "none of the server's SASL authentication mechanisms are supported");
		free(s->scram_cli);
		s->scram_cli = xcalloc(1, sizeof(*s->scram_cli));
		if (pw && kind == SECRET_PLAIN)
			scram_client_init_password(s->scram_cli, pw);
		else if (kind == SECRET_SCRAM && u->has_scram_keys && !s->pool->db->cf.user)
			scram_client_init_keys(s->scram_cli, u->scram_client_key, u->scram_server_key);
		else
			return auth_fail(s, "wrong password type");
		char first[SCRAM_MAX_MSG];
		if (!scram_client_first(s->scram_cli, first, sizeof(first)))
			return auth_fail(s, "SCRAM initialization failed");
		PktBuf pb;
		pktbuf_init(&pb, 128);
		pktbuf_start_msg(&pb, 'p');
		pktbuf_put_string(&pb, "SCRAM-SHA-256");
		pktbuf_put_u32(&pb, (uint32_t)strlen(first));
		pktbuf_put_bytes(&pb, first, strlen(first));
		pktbuf_finish_msg(&pb);
		bool ok = sbuf_send(&s->sb, pb.buf, pb.len);
		pktbuf_free(&pb);
		return ok ? SB_CONSUMED : SB_CLOSED;
	}
	case 11: { /* SASL continue */
		char final[SCRAM_MAX_MSG];
		if (!s->scram_cli || !scram_client_final(s->scram_cli, (const char *)body + 4, len - 4, final,
		                                         sizeof(final), err, sizeof(err))) {
			char why[200];
			snprintf(why, sizeof(why), "SCRAM exchange with server failed: %s",
			         s->scram_cli ? err : "no exchange");
			return auth_fail(s, why);
		}
		return send_password_msg(s, final, strlen(final)) ? SB_CONSUMED : SB_CLOSED;
	}
	case 12: /* SASL final */
		if (!s->scram_cli ||
		    !scram_client_verify_final(s->scram_cli, (const char *)body + 4, len - 4, err, sizeof(err))) {
			char why[200];
			snprintf(why, sizeof(why), "invalid server signature: %s", s->scram_cli ? err : "no exchange");
			return login_fail(s, why);
		}
		free(s->scram_cli);
		s->scram_cli = NULL;
		return SB_CONSUMED;
	default:
		return auth_fail(s, "wrong password type");
	}
}

/*
 * A ParameterStatus from the server: update the server's (and its client's)
 * tracked values. False when the body is not two NUL-terminated strings.
 */
/*
 * Set `name` in the pool's welcome: servers logging in at once all report
 * their parameters, and a connect_query's report comes after the login's.
 * The last value counts and each name is there once.
 */
static void welcome_set(PktBuf *pb, const char *name, const char *value)
{
	size_t n = strlen(name);
	for (size_t pos = 0; pos + 5 <= pb->len;) {
		uint32_t len = ((uint32_t)pb->buf[pos + 1] << 24) | ((uint32_t)pb->buf[pos + 2] << 16) |
		               ((uint32_t)pb->buf[pos + 3] << 8) | (uint32_t)pb->buf[pos + 4];
		if (len < 4 || pos + 1 + len > pb->len)
			break;
		if (len - 4 > n && memcmp(pb->buf + pos + 5, name, n) == 0 && pb->buf[pos + 5 + n] == '\0') {
			memmove(pb->buf + pos, pb->buf + pos + 1 + len, pb->len - (pos + 1 + len));
			pb->len -= 1 + len;
			break;
		}
		pos += 1 + len;
	}
	pktbuf_write_param_status(pb, name, value);
}

static bool handle_param_status(PgSocket *s, const uint8_t *body, uint32_t len, bool login)
{
	const char *name, *value;
	if (!proto_parse_param_status(body, len, &name, &value))
		return false;
	if (login)
		slog_noise(s, "server login: parameter %s=%s", name, value);
	int idx = var_index(name);
	/* a replication server's login parameters are its client's welcome, not the pool's */
	bool repl = s->replication != REPLICATION_NONE;
	if (idx >= 0) {
		var_learn_name(idx, name);
		/* mostly the value its client asked for (a SET) or the pool's default (a reset): no hashing then */
		const char *known = s->link ? sock_var(s->link, idx) : NULL;
		if (known && strcmp(known, value) == 0)
			sock_var_copy(s, idx, known);
		else if (s->pool && s->pool->defaults[idx].value && strcmp(s->pool->defaults[idx].value, value) == 0)
			sock_var_copy(s, idx, s->pool->defaults[idx].value);
		else
			sock_var_set(s, idx, value);
		if (s->link)
			sock_var_copy(s->link, idx, sock_var(s, idx));
		if (login && !repl && !s->pool->welcome_ready && s->pool->defaults[idx].value != sock_var(s, idx)) {
			var_copy(&s->pool->defaults[idx], &(VarValue){(char *)sock_var(s, idx)});
			var_fill_clear(&s->pool->last_fill);
		}
	} else if (login && repl) {
		if (!s->repl_params) {
			s->repl_params = xmalloc(sizeof(*s->repl_params));
			pktbuf_init(s->repl_params, 256);
		}
		pktbuf_write_param_status(s->repl_params, name, value);
	} else if (login && !s->pool->welcome_ready) {
		welcome_set(&s->pool->welcome_params, name, value);
	}
	return true;
}

/* A server that broke the protocol after login: say what it sent, close it (its client hears why). */
static SBufAction server_protocol_violation(PgSocket *s, const char *what)
{
	char msg[128];
	snprintf(msg, sizeof(msg), "%s from server", what);
	slog(LG_WARNING, s, "%s", msg);
	disconnect_server(s, false, "%s", msg);
	return SB_CLOSED;
}

bool server_param_status(PgSocket *s, const uint8_t *body, uint32_t len)
{
	return handle_param_status(s, body, len, false);
}

/* A server's login (and connect_query) is over: its ParameterStatus make its pool's welcome, if none had. */
static void welcome_done(PgSocket *s)
{
	if (!s->pool->welcome_ready) {
		s->pool->welcome_ready = true;
		s->pool->welcome_cache_gen = 0;
	}
}

/*
 * Login packets are held whole to be parsed; none of a real server (auth
 * requests, ParameterStatus, errors) comes near this, so a bigger one is
 * refused rather than buffered up to max_packet_size.
 */
#define SERVER_LOGIN_MAX_PACKET (64 * 1024)

static SBufAction handle_login_packet(PgSocket *s, const PktHdr *hdr, const uint8_t *data, uint32_t avail)
{
	if (hdr->len > SERVER_LOGIN_MAX_PACKET) {
		char why[96];
		snprintf(why, sizeof(why), "login packet '%c' of %u bytes is too large", hdr->type, hdr->len);
		return login_fail(s, why);
	}
	if (avail < hdr->len)
		return SB_NEED_FULL;
	const uint8_t *body = data + 5;
	uint32_t blen = hdr->len - 5;
	switch (hdr->type) {
	case 'R':
		return handle_auth_request(s, body, blen);
	case 'S':
		if (!handle_param_status(s, body, blen, true))
			return login_fail(s, "malformed ParameterStatus from server");
		return SB_CONSUMED;
	case 'K':
		slog_noise(s, "server login: backend key data");
		if (blen < 8 || blen > 4 + MAX_SERVER_KEY)
			return login_fail(s, "bad BackendKeyData from server");
		s->backend_pid =
		    ((uint32_t)body[0] << 24) | ((uint32_t)body[1] << 16) | ((uint32_t)body[2] << 8) | body[3];
		socket_set_server_key(s, body + 4, blen - 4);
		return SB_CONSUMED;
	case 'N':
	case 'v':
		return SB_CONSUMED;
	case 'E': {
		const char *sev, *code, *msg;
		if (!proto_parse_error(body, blen, &sev, &code, &msg) || !*msg)
			return login_fail(s, "malformed ErrorResponse from server (S, C and M fields required)");
		slog(LG_WARNING, s, "server login failed: %s %s", sev, msg);
		PgSocket *c = s->link;
		if (s->replication != REPLICATION_NONE && c) {
			/*
			 * Only its own client is failed: a refused walsender (no
			 * REPLICATION attribute, no replication hba line,
			 * max_wal_senders) says nothing about the pool's normal
			 * logins. It gets PgBouncer's "login failed" followed by
			 * PostgreSQL's reason (doc/pgbouncer.1.md, "REPLICATION CONNECTIONS").
			 */
			s->link = NULL;
			c->link = NULL;
			disconnect_client(c, true, "login failed: %s", msg);
		} else {
			pool_login_failed(s->pool, code, msg, true);
		}
		/* the closing line says why, in PostgreSQL's words, as the client's does */
		disconnect_server(s, false, "%s", msg);
		return SB_CLOSED;
	}
	case 'Z':
		slog_debug(s, "server login: ready for query");
		if (wk.cf.g.log_connections) {
			if (s->is_unix) {
				slog(LG_LOG, s, "new connection to server");
			} else {
				char laddr[80];
				int lport;
				struct sockaddr_storage local;
				socket_local_addr(s, &local);
				format_addr(&local, laddr, sizeof(laddr), &lport);
				slog(LG_LOG, s, "new connection to server (from %s:%d)", laddr, lport);
			}
		}
		s->ready = true;
		s->txn_status = blen > 0 ? (char)body[0] : 'I';
		s->pool->last_login_failed = false;
		/* logged in: its answers may come through the receive ring (worker/recvq.h) */
		if (s->replication == REPLICATION_NONE)
			sbuf_use_ring(&s->sb);
		if (s->replication != REPLICATION_NONE) {
			/* no connect_query: a physical walsender runs no SQL */
			pool_replication_ready(s);
			return s->state == SV_JUSTFREE ? SB_CLOSED : SB_CONSUMED;
		}
		if (s->pool->db->cf.connect_query && *s->pool->db->cf.connect_query) {
			/*
			 * What connect_query sets is part of every server's
			 * session, so its tracked values are the pool's defaults
			 * too: the welcome waits for its answer (doc/pgbouncer.5.md).
			 */
			s->welcome_pending = !s->pool->welcome_ready;
			PktBuf pb;
			pktbuf_init(&pb, 128);
			pktbuf_start_msg(&pb, 'Q');
			pktbuf_put_string(&pb, s->pool->db->cf.connect_query);
			pktbuf_finish_msg(&pb);
			bool ok = sbuf_send(&s->sb, pb.buf, pb.len);
			pktbuf_free(&pb);
			if (!ok)
				return SB_CLOSED;
			s->resetting = true;
			change_state(s, SV_TESTED);
			return SB_CONSUMED;
		}
		welcome_done(s);
		pool_server_ready(s);
		return s->state == SV_JUSTFREE ? SB_CLOSED : SB_CONSUMED;
	default:
		return login_fail(s, "unexpected packet from server during login");
	}
}

/*
 * The SET replay of c's tracked parameters has ended. PostgreSQL reports
 * a parameter only when its value changes: a value that still differs
 * from the client's was set to what the server already had, which is
 * then the canonical form of the client's spelling (DateStyle `ISO` is
 * `ISO, MDY`). The client keeps that form, so that its next transactions
 * on this server, or on any server reporting the same, need no SET
 * (doc/transaction.md, "Tracked parameters").
 */
static void keep_canonical_vars(PgSocket *s, PgSocket *c)
{
	for (int i = 0; i < var_count(); i++) {
		const char *want = sock_var(c, i), *have = sock_var(s, i);
		if (!want || !have || var_same_value(i, want, have))
			continue;
		slog_debug(c, "setting %s to its canonical version %s -> %s", var_name(i), want, have);
		sock_var_copy(c, i, have);
	}
}

/* Reset, check, connect_query or SET replay: swallow everything until ReadyForQuery. */
static SBufAction handle_internal_query(PgSocket *s, const PktHdr *hdr, const uint8_t *data, uint32_t avail)
{
	if (hdr->type == 'E' || hdr->type == 'S') {
		if (avail < hdr->len)
			return SB_NEED_FULL;
		if (hdr->type == 'S') {
			if (!handle_param_status(s, data + 5, hdr->len - 5, s->welcome_pending))
				return server_protocol_violation(s, "malformed ParameterStatus");
		} else {
			const char *sev, *code, *msg;
			if (!proto_parse_error(data + 5, hdr->len - 5, &sev, &code, &msg))
				return server_protocol_violation(s, "malformed ErrorResponse");
			if (s->setting_vars && s->vars_pipelined) {
				/*
				 * The client's messages are on their way behind it: the
				 * server keeps its old value, which it reported, and the
				 * next link tries again.
				 */
				slog(LG_WARNING, s, "parameter SET failed, the server keeps its value: %s", msg);
				return SB_CONSUMED;
			}
			if (s->setting_vars) {
				slog(LG_WARNING, s, "parameter SET failed: %s", msg);
				disconnect_server(s, true, "invalid server parameter");
				return SB_CLOSED;
			}
			slog(LG_WARNING, s, "query failed: %s", msg);
			if (s->reset_running || s->checking)
				s->reset_failed = true;
		}
		return SB_CONSUMED;
	}
	if (hdr->type == 'C') {
		/* DISCARD ALL / DEALLOCATE ALL in the reset query: nothing stays prepared */
		if (avail < hdr->len)
			return SB_NEED_FULL;
		txn_server_discard_check(s, data, hdr->len);
		return SB_CONSUMED;
	}
	if (hdr->type != 'Z')
		return SB_SKIP;
	if (avail < hdr->len)
		return SB_NEED_FULL;
	s->txn_status = hdr->len > 5 ? (char)data[5] : 'I';
	if (s->setting_vars && s->vars_enc_first) {
		/* the answer to the client_encoding SET alone: the other values' comes next (replay_vars()) */
		s->vars_enc_first = false;
		return SB_CONSUMED;
	}
	if (s->setting_vars) {
		s->setting_vars = false;
		if (s->vars_pipelined) {
			/* what follows answers the client's messages, sent right behind the SET */
			s->vars_pipelined = false;
			/*
			 * In transaction mode each client message the server answers
			 * is in the request queue: an empty one means the pooler
			 * answered them all itself (a Parse of a statement the server
			 * has, a Close) and the SET, answered now, was all the server
			 * had to do. It is between transactions, as it would be
			 * without the SET, and a client that leaves now gives it back
			 * (doc/transaction.md, "When a server is lent and given back").
			 */
			if (s->link && s->link_mode != POOL_SESSION && s->rq.count == 0)
				s->ready = true;
			return SB_CONSUMED;
		}
		s->ready = true;
		if (s->link) {
			keep_canonical_vars(s, s->link);
			client_server_assigned(s->link);
		}
		return SB_CONSUMED;
	}
	/*
	 * A reset or check query that failed (a statement_timeout the last
	 * client set, a cancel that came late, a check that errors) left the
	 * session as it was: the next client would get the previous one's
	 * settings (doc/pgbouncer.5.md, server_reset_query). It is closed.
	 */
	if (s->reset_failed) {
		const char *what = s->checking ? "server_check_query" : "server_reset_query";
		s->resetting = s->checking = s->reset_running = s->reset_failed = false;
		disconnect_server(s, true, "%s failed", what);
		return SB_CLOSED;
	}
	s->resetting = false;
	s->checking = false;
	s->reset_running = false;
	s->ready = true;
	if (s->welcome_pending) {
		s->welcome_pending = false;
		welcome_done(s);
	}
	pool_server_ready(s);
	return s->state == SV_JUSTFREE ? SB_CLOSED : SB_CONSUMED;
}

/*
 * A ReadyForQuery to a client linked in session mode. Its pool's mode may
 * have changed since the link (RELOAD, SET): the link ends at the first
 * ReadyForQuery outside a transaction that answers everything the client
 * sent (session_tail_answered()). A Sync the server ignores (during COPY
 * FROM STDIN) only keeps the link. Whether this one ends it.
 */
static inline bool session_link_done(PgSocket *s)
{
	return session_tail_answered(&s->session) && s->txn_status == 'I' &&
	       pool_effective_mode(s->pool) != POOL_SESSION;
}

static __attribute__((noinline)) SBufAction handle_active_packet(PgSocket *s, const PktHdr *hdr, const uint8_t *data,
                                                                 uint32_t avail)
{
	PgSocket *c = s->link;
	if (s->setting_vars)
		return handle_internal_query(s, hdr, data, avail);
	PgPool *pool = s->pool;
	if (hdr->type == 'D') {
		/* DataRow, the bulk of most answers: nothing to track */
		pool->stats.server_bytes += hdr->len;
		return SB_FORWARD;
	}
	bool txn = s->replication == REPLICATION_NONE && c && s->link_mode != POOL_SESSION;
	if ((hdr->type == 'Z' || hdr->type == 'S') && avail < hdr->len)
		return SB_NEED_FULL;
	switch (hdr->type) {
	case 'Z': {
		char st = hdr->len > 5 ? (char)data[5] : 'I';
		s->txn_status = st;
		s->ready = true;
		s->copy_mode = false; /* a COPY that failed ends without CommandComplete */
		if (c && c->query_start) {
			pool->stats.query_time += (uint64_t)(wk.now - c->query_start);
			c->query_start = 0;
		}
		if (c && st == 'I' && c->xact_start) {
			pool->stats.xact_time += (uint64_t)(wk.now - c->xact_start);
			c->xact_start = 0;
		}
		if (!txn && c && s->replication == REPLICATION_NONE && session_link_done(s)) {
			pool->stats.server_bytes += hdr->len;
			return txn_session_link_release(s, data, hdr->len) ? SB_CONSUMED : SB_FORWARD;
		}
		/*
		 * Retiring (-R) or draining: a session-mode client between queries
		 * may move with its server once this answer is sent (worker_main.c;
		 * doc/workers.md, "Session-mode clients move too").
		 */
		if (!txn && c && st == 'I' && !s->session.owed && !s->session.open &&
		    (wk.handoff_fd >= 0 || wk.drain_fd >= 0))
			wk.handoff_due = true;
		break;
	}
	case 'S':
		if (!handle_param_status(s, data + 5, hdr->len - 5, false))
			return server_protocol_violation(s, "malformed ParameterStatus");
		break;
	case 'G': /* CopyInResponse */
		if (!txn && c && s->replication == REPLICATION_NONE)
			session_tail_copy_begun(&s->session); /* libpq's PQexecParams sends a Sync behind the Execute */
		s->copy_mode = true;
		break;
	case 'W': /* CopyBothResponse */
		s->copy_mode = true;
		break;
	case 'C':
		s->copy_mode = false;
		if (!txn && s->sstmts && c) {
			/*
			 * A session link on a server with the pooler's statements
			 * (its pool was in transaction mode before): a DEALLOCATE
			 * ALL or DISCARD ALL here is noted for the clients after
			 * the link, as in transaction mode.
			 */
			if (avail < hdr->len)
				return SB_NEED_FULL;
			txn_server_discard_check(s, data, hdr->len);
		}
		break;
	default:
		break;
	}
	if (!txn) {
		pool->stats.server_bytes += hdr->len;
		return SB_FORWARD;
	}
	return txn_server_packet(s, hdr, data, avail); /* counts the bytes too */
}

/* Every event but a packet of a linked server (server_cb). */
static __attribute__((noinline)) SBufAction server_event(SBuf *sb, SBufEvent ev, const PktHdr *hdr, const uint8_t *data,
                                                         uint32_t avail)
{
	PgSocket *s = sb->owner;
	switch (ev) {
	case SBEV_CONNECTED: {
		s->pool->connect_fail_run = 0;
		if (s->tls_pending || s->tls_host) {
			/* SSLRequest; the answer is one byte */
			static const uint8_t ssl_request[8] = {0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f};
			sbuf_expect_byte(sb);
			if (!sbuf_send(sb, ssl_request, sizeof(ssl_request))) {
				pool_login_failed(s->pool, NULL, "server connect failed", false);
				disconnect_server(s, false, "send failed");
				return SB_CLOSED;
			}
			return SB_CONSUMED;
		}
		send_startup(s);
		return SB_CONSUMED;
	}
	case SBEV_RAW_BYTE:
		return handle_ssl_answer(s, data[0], avail);
	case SBEV_TLS_READY:
		if (wk.cf.g.log_connections) {
			char desc[TLS_DESCRIBE_LEN];
			tls_describe(sb->ssl, desc, sizeof(desc));
			slog(LG_LOG, s, "SSL established: %s", desc);
		}
		send_startup(s);
		return SB_CONSUMED;
	case SBEV_TLS_FAILED:
		/* a certificate problem does not go away by waiting: queued clients hear it now */
		return login_fail(s, sbuf_tls_error());
	case SBEV_DIRECT_TLS:
		return SB_CONSUMED;
	case SBEV_CONNECT_FAILED:
		/* else the close launches the next connection, to the next address */
		if (!next_address_at_once(s->pool))
			pool_login_failed(s->pool, NULL, "server connect failed", false);
		disconnect_server(s, false, "connect failed: %s", strerror(sb->last_errno));
		return SB_CLOSED;
	case SBEV_EOF:
	case SBEV_SEND_FAILED: {
		/* bytes left unprocessed at EOF are the start of a message that never ended */
		bool mid = sbuf_unprocessed(&s->sb) > 0 || s->sb.pkt_remain > 0;
		const char *why = ev == SBEV_SEND_FAILED ? "send to server failed"
		                  : mid                  ? "server closed the connection in the middle of a message"
		                                         : "server closed the connection";
		if (s->state == SV_LOGIN) {
			char msg[128];
			snprintf(msg, sizeof(msg), "%s during login", why);
			slog(LG_WARNING, s, "server login failed: %s", msg);
			pool_login_failed(s->pool, NULL, msg, false);
			disconnect_server(s, false, "%s", msg);
		} else if (mid && ev == SBEV_EOF) {
			slog(LG_WARNING, s, "%s", why);
			disconnect_server(s, false, "%s", why);
		} else {
			disconnect_server(s, false, "server conn crashed?");
		}
		return SB_CLOSED;
	}
	case SBEV_BAD_PACKET: {
		char why[96];
		uint32_t len = avail >= 5 ? ((uint32_t)data[1] << 24) | ((uint32_t)data[2] << 16) |
		                                ((uint32_t)data[3] << 8) | data[4]
		                          : 0;
		snprintf(why, sizeof(why), "bad packet header from server: type '%c', length %u",
		         avail > 0 && data[0] >= 0x20 && data[0] < 0x7f ? data[0] : '?', len);
		if (s->state == SV_LOGIN)
			return login_fail(s, why); /* counts as a failed login: the next waits server_login_retry */
		slog(LG_WARNING, s, "%s", why);
		disconnect_server(s, false, "%s", why);
		return SB_CLOSED;
	}
	case SBEV_FLUSHED:
		return SB_CONSUMED;
	case SBEV_PACKET:
		break;
	}
	s->request_time = wk.now;
	switch (s->state) {
	case SV_LOGIN:
		return handle_login_packet(s, hdr, data, avail);
	case SV_ACTIVE:
		if (s->auth_query)
			return hooks.lookup_packet(s, hdr, data, avail); /* auth_query.c */
		return handle_active_packet(s, hdr, data, avail);
	case SV_TESTED:
		return handle_internal_query(s, hdr, data, avail);
	default:
		/* idle servers may send notices and parameter changes; anything else is wrong */
		if (hdr->type == 'N' || hdr->type == 'A')
			return SB_SKIP;
		if (hdr->type == 'S') {
			if (avail < hdr->len)
				return SB_NEED_FULL;
			if (!handle_param_status(s, data + 5, hdr->len - 5, false))
				return server_protocol_violation(s, "malformed ParameterStatus");
			return SB_CONSUMED;
		}
		disconnect_server(s, false, "idle server got something");
		return SB_CLOSED;
	}
}

bool server_between_transactions(const PgSocket *s)
{
	return s->ready && s->txn_status == 'I' && !s->copy_mode && s->rq.count == 0 && !s->rq.copy_in &&
	       sbuf_is_flushed(&s->sb) && sbuf_unprocessed(&s->sb) == 0;
}

SBufAction server_cb(SBuf *sb, SBufEvent ev, const PktHdr *hdr, const uint8_t *data, uint32_t avail)
{
	PgSocket *s = sb->owner;
	/* wk.now: read at the start of the event (worker_clock_tick), not per packet */
	if (ev == SBEV_PACKET && s->state == SV_ACTIVE && !s->auth_query) {
		/* the common case, kept a thin call */
		s->request_time = wk.now;
		return handle_active_packet(s, hdr, data, avail);
	}
	return server_event(sb, ev, hdr, data, avail);
}

/* The client c is closing (CLIENT_GONE_SERVER, hooks.h): its linked server is released. */
void server_client_gone(PgSocket *c)
{
	PgSocket *server = c->link;
	if (!server)
		return;
	c->link = NULL;
	server->link = NULL;
	c->sb.dst = NULL;
	server->sb.dst = NULL;
	server_release(server);
}

/* s has closed (SERVER_GONE_LAUNCH, hooks.h): the room it made lets its pool launch another. */
void server_closed(PgSocket *s)
{
	if (s->pool && !launch_failing)
		pool_maybe_launch(s->pool);
}

/* The client let go of this server (session end): reset it and make it idle, or close it. */
void server_release(PgSocket *s)
{
	if (s->state == SV_JUSTFREE)
		return;
	slog_debug(s, "released by its client");
	s->link = NULL;
	s->sb.dst = NULL;
	s->setting_vars = false;
	s->vars_pipelined = false;
	s->vars_enc_first = false;
	s->held_for_check = false;
	s->rq.skipping = false;
	if (s->replication != REPLICATION_NONE) {
		/* never pooled, never reused */
		disconnect_server(s, true, "replication client closed");
		return;
	}
	if (s->close_needed) {
		disconnect_server(s, true, "close_needed");
		return;
	}
	if (!server_between_transactions(s)) {
		disconnect_server(s, true, "client disconnect while server was not ready");
		return;
	}
	server_reset_or_ready(s, false);
}

/* A released server that is ready: run server_reset_query (session mode, or always), then make it idle. */
void server_reset_or_ready(PgSocket *s, bool always_reset)
{
	const char *reset = wk.cf.g.server_reset_query;
	bool run_reset =
	    reset && *reset && (always_reset || s->link_mode == POOL_SESSION || wk.cf.g.server_reset_query_always);
	if (run_reset) {
		/* at every release in session mode: a short query goes out from the stack, no allocation */
		uint8_t small[128];
		PktBuf pb = {.buf = small, .cap = sizeof(small)};
		size_t n = strlen(reset) + 1;
		if (5 + n > sizeof(small))
			pktbuf_init(&pb, 5 + n);
		pktbuf_start_msg(&pb, 'Q');
		pktbuf_put_bytes(&pb, reset, n);
		pktbuf_finish_msg(&pb);
		bool ok = sbuf_send(&s->sb, pb.buf, pb.len);
		if (pb.buf != small)
			pktbuf_free(&pb);
		if (!ok) {
			disconnect_server(s, false, "server conn crashed?");
			return;
		}
		s->resetting = true;
		s->reset_running = true;
		s->ready = false;
		change_state(s, SV_TESTED);
		return;
	}
	pool_server_ready(s);
}
