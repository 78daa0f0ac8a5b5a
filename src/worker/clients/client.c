/*
 * Client connections: the startup phase (SSL/GSS answers, cancel requests,
 * StartupMessage parameters), and client packets once logged in (forwarded
 * to the linked server, or queued until one is assigned). The welcome that
 * ends a login is pooling/welcome.c's.
 */
#include "autoconfig.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "common/pktbuf.h"
#include "common/proto.h"
#include "common/util.h"
#include "worker/admin.h"
#include "worker/admin_fanout.h"
#include "worker/auth.h"
#include "worker/auth_query.h"
#include "worker/cancel.h"
#include "worker/client.h"
#include "worker/objects.h"
#include "worker/pool.h"
#include "worker/txn.h"
#include "worker/worker.h"

void client_accept(int fd, bool is_unix, bool is_private, const struct sockaddr_storage *peer, socklen_t peer_len)
{
	struct ucred cred = {.pid = 0, .uid = (uid_t)-1};
	socklen_t cl = sizeof(cred);
	if (is_unix && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0)
		cred = (struct ucred){.pid = 0, .uid = (uid_t)-1};
	/* the peer connection of another worker's console, not an operator on the private socket */
	bool from_worker = is_private && admin_fanout_from_worker(cred.pid);
	/* the master's /metrics scrape (doc/monitoring.md): hidden and uncounted too, but fanned out */
	bool from_master = is_private && cred.pid > 0 && cred.pid == (int)wk.parent_master;
	PgSocket *c = from_worker || from_master ? socket_new_internal() : socket_new(false);
	struct sockaddr_storage asked;
	if (!peer) {
		peer_len = sizeof(asked);
		memset(&asked, 0, sizeof(asked));
		if (getpeername(fd, (struct sockaddr *)&asked, &peer_len) < 0)
			peer_len = sizeof(asked);
		peer = &asked;
	}
	socket_set_remote(c, (const struct sockaddr *)peer, peer_len);
	c->is_unix = is_unix;
	c->is_private = is_private;
	if (is_unix) {
		c->peer_pid = cred.pid;
		c->peer_uid = cred.uid;
	} else {
		tune_accepted_socket(fd); /* the rest it has from the listener (tune_tcp_listener()) */
	}
	c->from_master = from_master;
	c->is_internal = from_worker || from_master;
	if (is_private) {
		/* a peer worker's console: not a client of the pooler, so outside max_client_conn */
		wk.client_count++;
		wk.private_clients++;
	} else {
		worker_clients_add(1);
		wk.accepted++;
	}
	change_state(c, CL_LOGIN);
	if (log_enabled(LG_DEBUG)) {
		char lhost[INET6_ADDRSTRLEN + 8];
		int lport;
		struct sockaddr_storage local = {0};
		socklen_t llen = sizeof(local);
		(void)getsockname(fd, (struct sockaddr *)&local,
		                  &llen); /* not kept: doc/benchmarks.md, "Memory per idle client" */
		format_addr(&local, lhost, sizeof(lhost), &lport);
		slog(LG_DEBUG, c, "got connection: %s:%d%s", lhost, lport, is_private ? " (private socket)" : "");
	}
	sbuf_accept(&c->sb, wk.base, fd, (uint32_t)wk.cf.g.pkt_buf, wk.cf.g.max_packet_size, client_cb, c);
	if (!is_unix && wk.tls.client_ctx)
		sbuf_detect_tls(&c->sb);
	/*
	 * With tcp_defer_accept the kernel hands over a connection only once
	 * its first bytes are in: read them now, not after another turn of
	 * the event loop (one epoll_wait() per login less). c may be gone
	 * afterwards.
	 */
	if (!is_unix && !is_private && wk.cf.g.tcp_defer_accept)
		sbuf_read_now(&c->sb);
}

/* ---- TLS ---- */

/* Switch a client to TLS (after answering 'S', or for a direct TLS handshake). */
static bool client_start_tls(PgSocket *c, bool direct)
{
	SSL *ssl = tls_client_ssl_new(&wk.tls);
	if (!ssl) {
		disconnect_client(c, false, "could not create TLS connection");
		return false;
	}
	c->tls_direct = direct;
	if (!sbuf_tls_start(&c->sb, ssl, true)) {
		disconnect_client(c, false, "%s", sbuf_tls_error());
		return false;
	}
	return true;
}

static SBufAction client_tls_ready(PgSocket *c)
{
	worker_count_tls_handshake();
	if (c->tls_direct && !tls_alpn_is_postgresql(c->sb.ssl)) {
		disconnect_client(c, true, "direct TLS connection without ALPN protocol \"%s\"", TLS_ALPN_PROTO);
		return SB_CLOSED;
	}
	if (wk.cf.g.verbose > 0) {
		char desc[TLS_DESCRIBE_LEN];
		tls_describe(c->sb.ssl, desc, sizeof(desc));
		slog(LG_DEBUG, c, "TLS established: %s", desc);
	}
	return SB_CONSUMED;
}

/* The machine's name, for application_name_add_host on a Unix socket ("localhost" if it has none). */
static const char *local_hostname(void)
{
	static char name[256];
	if (!name[0] && (gethostname(name, sizeof(name) - 1) != 0 || !name[0]))
		strcpy(name, "localhost");
	return name;
}

/* ---- startup ---- */

/* Parse an `options` value: "-c name=value" or "--name=value", backslash escapes. */
static bool apply_options_words(PgSocket *c, const char *opts, char *word);

static bool apply_options(PgSocket *c, const char *opts)
{
	/* a word is never longer than the whole value: no limit of its own */
	char *word = xmalloc(strlen(opts) + 1);
	bool ok = apply_options_words(c, opts, word);
	free(word);
	return ok;
}

static bool apply_options_words(PgSocket *c, const char *opts, char *word)
{
	const char *p = opts;
	bool want_c_value = false;
	bool ignore_unknown = config_list_contains(wk.cf.g.ignore_startup_parameters, "options");
	for (;;) {
		while (*p == ' ' || *p == '\t')
			p++;
		if (!*p)
			break;
		size_t n = 0;
		while (*p && *p != ' ' && *p != '\t') {
			/* the next character as it is; one at the very end escapes nothing and goes, as in PostgreSQL */
			if (*p == '\\' && !*++p)
				break;
			word[n++] = *p++;
		}
		word[n] = '\0';
		const char *setting;
		if (want_c_value) {
			setting = word;
			want_c_value = false;
		} else if (strcmp(word, "-c") == 0) {
			want_c_value = true;
			continue;
		} else if (strncmp(word, "-c", 2) == 0) {
			setting = word + 2;
		} else if (strncmp(word, "--", 2) == 0) {
			setting = word + 2;
		} else {
			client_send_error(c, true, "08P01",
			                  "unsupported options startup parameter: only '-c config=val' and "
			                  "'--config=val' are allowed");
			return false;
		}
		char *eq = strchr(setting, '=');
		if (!eq) {
			client_send_error(c, true, "08P01",
			                  "unsupported options startup parameter: only '-c config=val' and "
			                  "'--config=val' are allowed");
			return false;
		}
		*eq = '\0';
		/* "--a-b=c" means a_b */
		for (char *q = (char *)setting; *q; q++)
			if (*q == '-')
				*q = '_';
		int idx = var_index(setting);
		if (idx >= 0)
			sock_var_set(c, idx, eq + 1);
		else if (!ignore_unknown && !config_list_contains(wk.cf.g.ignore_startup_parameters, setting)) {
			client_send_error(c, true, "08P01", "unsupported startup parameter in options: %s", setting);
			return false;
		}
	}
	if (want_c_value) {
		client_send_error(c, true, "08P01",
		                  "unsupported options startup parameter: only '-c config=val' and '--config=val' are "
		                  "allowed");
		return false;
	}
	return true;
}

static void send_negotiate(PgSocket *c, const StartupParam *params, int n)
{
	PktBuf pb;
	pktbuf_init(&pb, 128);
	pktbuf_start_msg(&pb, 'v');
	pktbuf_put_u32(&pb, PROTO_V3_0);
	uint32_t count = 0;
	for (int i = 0; i < n; i++)
		if (strncmp(params[i].key, "_pq_.", 5) == 0)
			count++;
	pktbuf_put_u32(&pb, count);
	for (int i = 0; i < n; i++)
		if (strncmp(params[i].key, "_pq_.", 5) == 0)
			pktbuf_put_string(&pb, params[i].key);
	pktbuf_finish_msg(&pb);
	(void)sbuf_send(&c->sb, pb.buf, pb.len);
	pktbuf_free(&pb);
}

static SBufAction handle_startup_params(PgSocket *c, const StartupParam *params, int n, uint32_t minor);

static SBufAction handle_startup(PgSocket *c, const PktHdr *hdr, const uint8_t *data, uint32_t avail)
{
	uint32_t major = hdr->code >> 16, minor = hdr->code & 0xffff;
	if (hdr->code == 0x00020000) {
		disconnect_client(c, true, "old V2 protocol not supported");
		return SB_CLOSED;
	}
	if (major != 3) {
		char hex[64];
		proto_hex_prefix(data, avail, hex, sizeof(hex));
		disconnect_client(c, true, "bad packet header: '%s'", hex);
		return SB_CLOSED;
	}
	if (avail < hdr->len)
		return SB_NEED_FULL;
	if (c->db) {
		disconnect_client(c, true, "unexpected second startup packet");
		return SB_CLOSED;
	}

	/* counted first: as many parameters as fit in the packet are taken, as PgBouncer does */
	const uint8_t *body = data + hdr->body_off;
	size_t body_len = hdr->len - hdr->body_off;
	StartupParam few[16], *params = few; /* a login sends 3-6: one pass, no allocation */
	int n = proto_parse_startup(body, body_len, few, 16);
	if (n < 0) {
		n = proto_parse_startup(body, body_len, NULL, 0);
		if (n < 0) {
			disconnect_client(c, true, "invalid startup packet layout: expected terminator as last byte");
			return SB_CLOSED;
		}
		params = xcalloc((size_t)n + 1, sizeof(*params));
		(void)proto_parse_startup(body, body_len, params, n);
	}
	SBufAction act = handle_startup_params(c, params, n, minor);
	if (params != few)
		free(params);
	return act;
}

static SBufAction handle_startup_params(PgSocket *c, const StartupParam *params, int n, uint32_t minor)
{

	const char *user = NULL, *dbname = NULL, *options = NULL, *replication = NULL;
	bool has_pq = false;
	/* the first letter before strcmp(): every login sends these keys */
	for (int i = 0; i < n; i++)
		if (params[i].key[0] == 'r' && strcmp(params[i].key, "replication") == 0)
			replication = params[i].value;
	for (int i = 0; i < n; i++) {
		const char *k = params[i].key, *v = params[i].value;
		int idx;
		slog_noise(c, "startup parameter: %s=%s", k, v);
		if (k[0] == 'u' && strcmp(k, "user") == 0) {
			user = v;
		} else if (k[0] == 'd' && strcmp(k, "database") == 0) {
			dbname = v;
		} else if (k[0] == 'r' && strcmp(k, "replication") == 0) {
			continue;
		} else if (k[0] == 'o' && strcmp(k, "options") == 0) {
			options = v;
		} else if (k[0] == '_' && strncmp(k, "_pq_.", 5) == 0) {
			has_pq = true;
		} else if ((idx = var_index(k)) >= 0) {
			sock_var_set(c, idx, v);
		} else if (config_list_contains(wk.cf.g.ignore_startup_parameters, k)) {
			continue;
		} else {
			slog(LG_WARNING, c, "unsupported startup parameter: %s=%s", k, v);
			disconnect_client(c, true, "unsupported startup parameter: %s", k);
			return SB_CLOSED;
		}
	}
	c->replication = proto_parse_replication(replication);
	if (!user || !*user) {
		disconnect_client(c, true, "no username supplied");
		return SB_CLOSED;
	}
	if (strlen(user) > USERLIST_MAX_USER) {
		disconnect_client(c, true, "username too long");
		return SB_CLOSED;
	}
	if (!dbname || !*dbname)
		dbname = user;
	if (options && c->replication != REPLICATION_NONE) {
		/* goes verbatim into the dedicated server's startup: physical replication allows no SET */
		c->repl_options = xstrdup(options);
	} else if (options) {
		if (!apply_options(c, options)) {
			disconnect_client(c, false, "bad options");
			return SB_CLOSED;
		}
		/* PostgreSQL applies `options` first: the packet's own parameters win, wherever `options` is */
		for (int i = 0; i < n; i++) {
			int idx = var_index(params[i].key);
			if (idx >= 0)
				sock_var_set(c, idx, params[i].value);
		}
	}
	int app_idx = var_index("application_name");
	if (wk.cf.g.application_name_add_host) {
		char host[80], buf[512];
		int port;
		socket_remote_text(c, host, sizeof(host), &port);
		/* `app` for a client that sent none, and this machine's name for a Unix socket (doc/pgbouncer.5.md) */
		const char *app = sock_var(c, app_idx) ? sock_var(c, app_idx) : "app";
		if (c->is_unix)
			snprintf(buf, sizeof(buf), "%s - unix(%d@%s):%d", app, c->peer_pid, local_hostname(), port);
		else if (c->remote.sa.sa_family == AF_INET6)
			snprintf(buf, sizeof(buf), "%s - [%s]:%d", app, host, port);
		else
			snprintf(buf, sizeof(buf), "%s - %s:%d", app, host, port);
		sock_var_set(c, app_idx, buf);
	}
	if (!c->is_unix && !socket_is_tls(c) && wk.tls.client_sslmode >= SSLMODE_REQUIRE) {
		disconnect_client(c, true, "SSL required");
		return SB_CLOSED;
	}
	if (minor > 0 || has_pq)
		send_negotiate(c, params, n);

	/* the database: admin, configured, auto, or a placeholder that fails after auth */
	PgDatabase *db = strlen(dbname) < CF_MAX_DBNAME ? db_find(dbname) : NULL;
	if (!db && strlen(dbname) < CF_MAX_DBNAME)
		db = db_register_auto(dbname);
	PgUser *u = user_find(user);
	c->login_user = u;
	if (!db) {
		/* one per login: concurrent logins must not share the name */
		PgDatabase *ph = xcalloc(1, sizeof(*ph));
		list_init(&ph->node);
		ph->placeholder = true;
		pgb_strlcpy(ph->name, dbname, sizeof(ph->name));
		c->own_placeholder = ph;
		c->db = ph;
	} else {
		c->db = db;
	}
	slog_debug(c, "startup packet: db=%s user=%s, %d parameters, protocol 3.%u", dbname, user, n, minor);
	/* internal consoles (fan-out peers, the metrics scrape) are nobody's connections: no log */
	if (wk.cf.g.log_connections && !c->is_internal) {
		char desc[TLS_DESCRIBE_LEN] = "no";
		if (socket_is_tls(c))
			tls_describe(c->sb.ssl, desc, sizeof(desc));
		slog(LG_LOG, c, "login attempt: db=%s user=%s tls=%s replication=%s", dbname, user, desc,
		     proto_replication_value(c->replication));
	}
	/* remember the requested names for auth even if unknown */
	free(c->app_name_raw);
	c->app_name_raw = xstrdup(user);
	/* a user not in auth_file may be found by auth_query: that tells whether it exists */
	bool lookup = auth_query_wanted(c);
	/* a secret that auth_query fetched counts only where auth_query runs */
	if (u && u->from_auth_query && !lookup)
		c->login_user = u = NULL;
	/* an unknown user of a known database is logged by auth_start(), which knows the method (PAM and LDAP
	 * have their own users) */
	if (wk.cf.g.log_connections && !db) {
		slog(LG_LOG, c, "login failed: db=%s user=%s", dbname, user);
		if (!u)
			slog(LG_LOG, c, "no such user: %s", user);
	}

	if (!(db && db->admin) && worker_global_clients() > wk.cf.g.max_client_conn) {
		disconnect_client(c, true, "no more connections allowed (max_client_conn)");
		return SB_CLOSED;
	}
	c->sb.startup = false;
	SBufAction act = lookup ? auth_query_start(c) : auth_start(c);
	return act == SB_CLOSED ? SB_CLOSED : SB_CONSUMED;
}

static SBufAction handle_startup_phase(PgSocket *c, const PktHdr *hdr, const uint8_t *data, uint32_t avail)
{
	switch (hdr->code) {
	case PROTO_SSL_CODE:
	case PROTO_GSSENC_CODE:
		if (hdr->len != 8) {
			disconnect_client(c, false, "bad SSL request");
			return SB_CLOSED;
		}
		if (socket_is_tls(c)) {
			disconnect_client(c, false, "%s request inside TLS",
			                  hdr->code == PROTO_SSL_CODE ? "SSL" : "GSSAPI encryption");
			return SB_CLOSED;
		}
		if (sbuf_unprocessed(&c->sb) > hdr->len) {
			disconnect_client(c, true, "received unencrypted data after %s request",
			                  hdr->code == PROTO_SSL_CODE ? "SSL" : "GSSAPI encryption");
			return SB_CLOSED;
		}
		if (hdr->code == PROTO_SSL_CODE && !c->is_unix && wk.tls.client_ctx) {
			if (!sbuf_send(&c->sb, "S", 1)) {
				disconnect_client(c, false, "client unexpected eof");
				return SB_CLOSED;
			}
			return client_start_tls(c, false) ? SB_CONSUMED : SB_CLOSED;
		}
		if (!sbuf_send(&c->sb, "N", 1)) {
			disconnect_client(c, false, "client unexpected eof");
			return SB_CLOSED;
		}
		return SB_CONSUMED;
	case PROTO_CANCEL_CODE:
		if (hdr->len != 16) {
			disconnect_client(c, false, "bad cancel request");
			return SB_CLOSED;
		}
		if (avail < hdr->len)
			return SB_NEED_FULL;
		cancel_handle_request(c, data + 8);
		return SB_CLOSED;
	default:
		return handle_startup(c, hdr, data, avail);
	}
}

/* ---- logged in ---- */

/*
 * Statistics when a client message starts a query/transaction. A request
 * that waited for a server began when it was queued: query_time and
 * xact_time include the wait, as with PgBouncer (doc/pgbouncer.1.md, SHOW STATS).
 */
static void count_request(PgSocket *c, const PktHdr *hdr)
{
	PgPool *pool = c->pool;
	usec_t began = c->queued_start ? c->queued_start : wk.now;
	c->queued_start = 0;
	pool->stats.client_bytes += hdr->len;
	if (c->query_start == 0 && hdr->type != 'H') {
		c->query_start = began;
		pool->stats.query_count++;
		/* a transaction is counted at its first query, as PgBouncer does; its time when it ends */
		if (c->xact_start == 0) {
			c->xact_start = began;
			pool->stats.xact_count++;
		}
	}
}

/*
 * A message held (SB_WAIT) until its statement's description is in
 * (txn.c): its request starts when it is first held, so that
 * query_timeout covers the wait, and it is counted once.
 */
static __attribute__((noinline)) void count_held_request(PgSocket *c, const PktHdr *hdr, SBufAction act)
{
	if (act == SB_WAIT) {
		if (!c->request_counted)
			count_request(c, hdr);
		c->request_counted = true;
	} else if (act != SB_NEED_FULL) {
		c->request_counted = false; /* offered again and passed on: counted when it was held */
	}
}

/*
 * A request the pooler answered all by itself (a Close, a Parse the server
 * has), with nothing of the client's left on its server: no ReadyForQuery
 * will end it, so it ends now. Else its start would stay, and
 * query_timeout and transaction_timeout would count from it while the
 * client idles, and for its next query.
 */
static __attribute__((noinline)) void end_own_request(PgSocket *c, const PgSocket *s)
{
	PgPool *pool = c->pool;
	if (c->query_start) {
		pool->stats.query_time += (uint64_t)(wk.now - c->query_start);
		c->query_start = 0;
	}
	if (s->txn_status == 'I' && c->xact_start) {
		pool->stats.xact_time += (uint64_t)(wk.now - c->xact_start);
		c->xact_start = 0;
	}
}

/* The client's next message waits until what the pooler wrote to it is in the kernel (SBEV_FLUSHED resumes it). */
static SBufAction wait_for_flush(PgSocket *c)
{
	c->held_for_flush = true;
	sbuf_notify_flush(&c->sb);
	return SB_WAIT;
}

/*
 * Answers the pooler makes itself (in transaction mode: ParseComplete,
 * CloseComplete, its own errors) wait in the client's output queue when
 * the client does not read; forwarded results stop the client's input by
 * back-pressure, these would not. Past this many unsent bytes its next
 * message waits for them to go out.
 */
#define OWN_ANSWERS_MAX (64 * 1024)

/*
 * SHOW STATS of the pgbouncer database, as PgBouncer counts a console: its
 * first message (but Terminate) is one transaction and one query, and as
 * its request never ends, later ones count nothing and no time accrues
 * (doc/pgbouncer.1.md "SHOW STATS"). Peer connections of other workers are
 * not consoles of their own: they are counted nowhere.
 */
static void count_console(PgSocket *c, const PktHdr *hdr)
{
	if (c->console_counted || c->is_internal || hdr->type == 'X')
		return;
	c->console_counted = true;
	c->pool->stats.xact_count++;
	c->pool->stats.query_count++;
}

static SBufAction handle_admin_packet(PgSocket *c, const PktHdr *hdr, const uint8_t *data, uint32_t avail)
{
	count_console(c, hdr);
	switch (hdr->type) {
	case 'Q': {
		if (avail < hdr->len)
			return SB_NEED_FULL;
		if (admin_console_busy(c))
			return SB_WAIT; /* the other workers still answer the previous command */
		if (!sbuf_is_flushed(&c->sb)) {
			/*
			 * The previous answer is not in the kernel yet: a console that
			 * sends and does not read would otherwise have every answer
			 * held here. One at a time, as PgBouncer; SBEV_FLUSHED resumes.
			 */
			return wait_for_flush(c);
		}
		char *q = xmalloc(hdr->len - 4);
		memcpy(q, data + 5, hdr->len - 5);
		q[hdr->len - 5] = '\0';
		bool ok = admin_handle_query(c, q);
		free(q);
		return ok ? SB_CONSUMED : SB_CLOSED;
	}
	case 'X':
		disconnect_client(c, false, "client close request");
		return SB_CLOSED;
	case 'P':
	case 'B':
	case 'E':
		/* these three only; Sync, Flush, Describe, Close are "unsupported packet type" (doc/pgbouncer.1.md) */
		log_error("extended query protocol not supported by admin console");
		client_send_error(c, false, "08P01", "extended query protocol not supported by admin console");
		/* then FATAL "bad packet", as PgBouncer, so that the client knows the connection is gone */
		disconnect_client(c, true, "bad packet");
		return SB_CLOSED;
	default:
		log_error("unsupported packet type for admin console: %d", hdr->type);
		client_send_error(c, false, "08P01", "unsupported packet type for admin console: %d", hdr->type);
		disconnect_client(c, true, "bad packet");
		return SB_CLOSED;
	}
}

/* What a message type a client may send after login means to the pooler (handle_client_packet()). */
enum { MSG_UNKNOWN = 0, MSG_PLAIN, MSG_QUERY, MSG_NO_SERVER, MSG_TERMINATE };
static const uint8_t client_msg_class[256] = {
    ['P'] = MSG_PLAIN,
    ['B'] = MSG_PLAIN,
    ['E'] = MSG_PLAIN,
    ['D'] = MSG_PLAIN,
    ['C'] = MSG_PLAIN,
    ['S'] = MSG_PLAIN,
    ['F'] = MSG_PLAIN,
    ['Q'] = MSG_QUERY,
    /* Flush and the COPY messages: with no server linked, nothing they could mean */
    ['H'] = MSG_NO_SERVER,
    ['d'] = MSG_NO_SERVER,
    ['c'] = MSG_NO_SERVER,
    ['f'] = MSG_NO_SERVER,
    ['X'] = MSG_TERMINATE,
};

static __attribute__((noinline)) SBufAction handle_client_packet(PgSocket *c, const PktHdr *hdr, const uint8_t *data,
                                                                 uint32_t avail)
{
	if (c->state == CL_LOGIN) {
		if (hdr->type == 'p') {
			/* no password or SASL message of a real client comes near this */
			if (hdr->len > 5 + USERLIST_MAX_SECRET + 1 && hdr->len > 5 + SCRAM_MAX_MSG + 64) {
				disconnect_client(c, true, "password too long");
				return SB_CLOSED;
			}
			return avail < hdr->len ? SB_NEED_FULL : auth_handle_password_msg(c, data, avail);
		}
		if (hdr->type == 'X') {
			disconnect_client(c, false, "client close request");
			return SB_CLOSED;
		}
		disconnect_client(c, true, "unexpected packet during login: '%c'", hdr->type);
		return SB_CLOSED;
	}
	if (c->state == CL_WAITING_LOGIN) {
		/* no welcome yet: nothing should arrive but Terminate */
		if (hdr->type == 'X') {
			disconnect_client(c, false, "client close request");
			return SB_CLOSED;
		}
		return SB_WAIT;
	}
	if (c->db->admin)
		return handle_admin_packet(c, hdr, data, avail);
	if (__builtin_expect(c->sb.out.len - c->sb.out_pos > OWN_ANSWERS_MAX, 0))
		return wait_for_flush(c);
	switch (client_msg_class[(uint8_t)hdr->type]) {
	case MSG_UNKNOWN:
		disconnect_client(c, true, "unknown pkt");
		return SB_CLOSED;
	case MSG_TERMINATE:
		disconnect_client(c, false, "client close request");
		return SB_CLOSED;
	case MSG_QUERY:
		if (wk.cf.g.disable_pqexec) {
			disconnect_client(c, true, "PQexec disallowed");
			return SB_CLOSED;
		}
		break;
	case MSG_NO_SERVER:
		/* nothing outstanding to flush; COPY messages after a failed COPY let go of: no server needed */
		if (!c->link && pool_effective_mode(c->pool) != POOL_SESSION && c->replication == REPLICATION_NONE) {
			if (hdr->type == 'H' && hdr->len != 5) {
				/* as with a server linked (txn_client_packet()) */
				disconnect_client(c, true, "invalid Flush message");
				return SB_CLOSED;
			}
			c->request_time = wk.now;
			return SB_SKIP;
		}
		break;
	}
	c->request_time = wk.now;
	if (!c->link) {
		if (c->state == CL_WAITING)
			return SB_WAIT;
		if (!pool_find_server(c))
			return c->state == CL_JUSTFREE ? SB_CLOSED : SB_WAIT;
	}
	PgSocket *s = c->link;
	if (s->setting_vars && !s->vars_pipelined)
		return SB_WAIT;
	if (c->replication != REPLICATION_NONE || s->link_mode == POOL_SESSION) {
		count_request(c, hdr);
		s->ready = false;
		/* what ends and what opens a request, should the pool leave session mode (server.c) */
		session_tail_client_msg(&s->session, hdr->type, hdr->len);
		return SB_FORWARD;
	}
	SBufAction act = txn_client_packet(c, hdr, data, avail);
	if (__builtin_expect(act == SB_WAIT || c->request_counted, 0))
		count_held_request(c, hdr, act);
	else if (act == SB_FORWARD || act == SB_CONSUMED)
		count_request(c, hdr);
	else if (act == SB_SKIP)
		c->queued_start = 0; /* no request: the next one starts when it comes */
	if (act == SB_CONSUMED && c->link == s && s->ready && s->rq.count == 0)
		end_own_request(c, s);
	/*
	 * What the pooler sends on its own marks it itself. A Flush starts
	 * nothing on the server: behind requests the pooler answered itself it
	 * leaves the server between transactions, so a client leaving then
	 * gives it back (doc/transaction.md, "When a server is lent and given
	 * back").
	 */
	if (act == SB_FORWARD && hdr->type != 'H')
		s->ready = false;
	return act;
}

/* Every event but a packet after the startup phase (client_cb). */
static __attribute__((noinline)) SBufAction client_event(SBuf *sb, SBufEvent ev, const PktHdr *hdr, const uint8_t *data,
                                                         uint32_t avail)
{
	PgSocket *c = sb->owner;
	switch (ev) {
	case SBEV_PACKET:
		return handle_startup_phase(c, hdr, data, avail);
	case SBEV_BAD_PACKET: {
		char hex[64];
		proto_hex_prefix(data, avail, hex, sizeof(hex));
		disconnect_client(c, true, "bad packet header: '%s'", hex);
		return SB_CLOSED;
	}
	case SBEV_EOF:
		disconnect_client(c, false, "client unexpected eof");
		return SB_CLOSED;
	case SBEV_SEND_FAILED:
		disconnect_client(c, false, "client send failed");
		return SB_CLOSED;
	case SBEV_DIRECT_TLS:
		if (!wk.tls.client_ctx) {
			disconnect_client(c, false, "direct TLS connection while TLS is off");
			return SB_CLOSED;
		}
		return client_start_tls(c, true) ? SB_CONSUMED : SB_CLOSED;
	case SBEV_TLS_READY:
		return client_tls_ready(c);
	case SBEV_TLS_FAILED:
		disconnect_client(c, false, "%s", sbuf_tls_error());
		return SB_CLOSED;
	case SBEV_FLUSHED:
		/* the pooler's answers went out (wait_for_flush()): its next message */
		if (c->held_for_flush && c->state != CL_JUSTFREE) {
			c->held_for_flush = false;
			sbuf_continue(sb);
		}
		break;
	case SBEV_CONNECTED:
	case SBEV_CONNECT_FAILED:
	case SBEV_RAW_BYTE:
		break;
	}
	return SB_CONSUMED;
}

SBufAction client_cb(SBuf *sb, SBufEvent ev, const PktHdr *hdr, const uint8_t *data, uint32_t avail)
{
	/* wk.now: read at the start of the event (worker_clock_tick), not per packet */
	if (ev == SBEV_PACKET && !sb->startup)
		return handle_client_packet(sb->owner, hdr, data, avail); /* the common case, kept a thin call */
	return client_event(sb, ev, hdr, data, avail);
}
