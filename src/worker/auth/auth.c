/*
 * Client authentication against auth_file users: trust, any, plain, md5
 * and scram-sha-256 (against plain passwords and SCRAM verifiers), with a
 * mock exchange for unknown users so that they cannot be told apart; with
 * auth_type=hba the method comes from the client's first matching hba rule.
 */
#include "autoconfig.h"

#include <openssl/rand.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/pktbuf.h"
#include "common/util.h"
#include "worker/auth.h"
#include "worker/ldap_auth.h"
#include "worker/objects.h"
#include "worker/pam.h"
#include "worker/pool.h"
#include "worker/pool_settings.h"
#include "worker/welcome.h"
#include "worker/worker.h"

static bool send_auth(PgSocket *c, uint32_t code, const void *data, size_t len)
{
	PktBuf pb;
	pktbuf_init(&pb, 64 + len);
	pktbuf_write_auth(&pb, code, data, len);
	bool ok = sbuf_send(&c->sb, pb.buf, pb.len);
	pktbuf_free(&pb);
	return ok;
}

/*
 * A user with a secret from auth_file or auth_query, even an empty one. A
 * [users] entry alone gives settings, not a login (doc/pgbouncer.5.md, "SECTION [users]").
 */
static bool user_known(const PgUser *u)
{
	return u && u->secret;
}

/* Is this login user allowed on the console? Sets admin_user/stats_user. */
static bool console_access(PgSocket *c, const char *name)
{
	c->admin_user = config_list_contains(wk.cf.g.admin_users, name);
	c->stats_user = config_list_contains(wk.cf.g.stats_users, name);
	return c->admin_user || c->stats_user;
}

/* Take the client's place under both client limits (counted across workers); false = refused. */
static bool take_client_slot(PgSocket *c, int max_db)
{
	const char *full = pool_take_client_budget(c, max_db, user_max_client_connections(c->login_user));
	if (full)
		disconnect_client(c, true, "client connections exceeded (%s)", full);
	return !full;
}

void auth_login_complete(PgSocket *c)
{
	PgDatabase *db = c->db;
	const char *uname = c->login_user ? c->login_user->name : c->app_name_raw;

	slog_debug(c, "authentication ok");

	if (db->admin) {
		if (c->replication != REPLICATION_NONE) {
			disconnect_client(c, true, "replication connections are not supported by the admin console");
			return;
		}
		if (!c->admin_user && !c->stats_user && !console_access(c, uname)) {
			disconnect_client(c, true, "not allowed");
			return;
		}
		if (!c->login_user)
			c->login_user = user_add(uname);
		/* admin_users are exempt from the client limits on the console, stats users are not */
		if (!c->admin_user && !take_client_slot(c, wk.cf.g.max_db_client_connections))
			return;
		/* one console pool, whoever logs in */
		c->pool = pool_get(db, wk.admin_user);
		if (!c->is_internal) {
			db->client_count++;
			c->login_user->client_count++;
		}
		client_send_welcome(c);
		return;
	}
	if (db->placeholder) {
		disconnect_client(c, true, "no such database: %s", db->name);
		return;
	}
	if (db->disabled) {
		disconnect_client(c, true, "database \"%s\" is disabled", db->name);
		return;
	}
	/* a draining worker still serves the clients it already accepted */
	if (wk.run_state != RUN_ACTIVE && wk.run_state != RUN_DRAINING) {
		disconnect_client(c, true, "pooler is shutting down");
		return;
	}
	int max_db = db_max_client_connections(db);
	PgUser *u = c->login_user;
	/* counted across all workers, like the server limits; given back when the client goes */
	if (!take_client_slot(c, max_db))
		return;
	PgUser *pool_user = db->forced_user ? db->forced_user : u;
	c->pool = pool_get(db, pool_user);
	slog_debug(c, "pool %s/%s: %s", db->name, pool_user->name,
	           c->pool->welcome_ready ? "has a server's welcome" : "waits for its first server login");
	if (!c->pool->welcome_ready && pool_fast_fail(c, c->pool))
		return;
	db->client_count++;
	u->client_count++;
	if (c->pool->welcome_ready && c->replication == REPLICATION_NONE) {
		client_send_welcome(c);
		return;
	}
	/*
	 * No server has logged in for this pool yet: wait for the first one.
	 * A replication client always waits, for a server of its own.
	 */
	c->wait_start = wk.now;
	change_state(c, CL_WAITING_LOGIN);
	sbuf_pause(&c->sb);
	pool_maybe_launch(c->pool);
}

static void auth_failed(PgSocket *c, const char *msg)
{
	disconnect_client(c, true, "%s", msg);
}

static SBufAction start_scram(PgSocket *c)
{
	static const char mech[] = "SCRAM-SHA-256\0";
	c->auth_method = AUTH_SCRAM_SHA_256;
	if (!send_auth(c, 10, mech, sizeof(mech))) {
		disconnect_client(c, false, "client unexpected eof");
		return SB_CLOSED;
	}
	return SB_CONSUMED;
}

static void log_file_warning(void *arg, const char *msg)
{
	(void)arg;
	log_warning("%s", msg);
}

/* auth_hba_file: an empty setting means no rules, an unreadable file keeps the previous ones */
static void load_hba_rules(void)
{
	const char *path = wk.cf.g.auth_hba_file;
	HbaRules rules;
	char err[512];

	if (!path || !*path) {
		log_warning("auth_type=hba but auth_hba_file is not set: no login can succeed");
		hba_parse(&rules, "", NULL, NULL, NULL);
	} else if (!hba_load(&rules, path, log_file_warning, NULL, err, sizeof(err))) {
		log_warning("%s%s", err, wk.hba ? "; keeping the previous hba rules" : "");
		if (wk.hba)
			return;
	}
	if (wk.hba)
		hba_free(wk.hba);
	else
		wk.hba = xcalloc(1, sizeof(*wk.hba));
	*wk.hba = rules;
}

/* auth_ident_file, the same way */
static void load_ident_maps(void)
{
	const char *path = wk.cf.g.auth_ident_file;
	IdentMap map;
	char err[512];

	if (!path || !*path) {
		ident_parse(&map, "", NULL, NULL);
	} else if (!ident_load(&map, path, log_file_warning, NULL, err, sizeof(err))) {
		log_warning("%s%s", err, wk.ident ? "; keeping the previous ident maps" : "");
		if (wk.ident)
			return;
	}
	if (wk.ident)
		ident_free(wk.ident);
	else
		wk.ident = xcalloc(1, sizeof(*wk.ident));
	*wk.ident = map;
}

void auth_load_hba(void)
{
	if (wk.cf.g.auth_type == AUTH_HBA) {
		load_hba_rules();
		load_ident_maps();
		return;
	}
	/* not used by any other auth_type */
	if (wk.hba) {
		hba_free(wk.hba);
		free(wk.hba);
		wk.hba = NULL;
	}
	if (wk.ident) {
		ident_free(wk.ident);
		free(wk.ident);
		wk.ident = NULL;
	}
}

/* peer: the OS user of a Unix-socket client must be the database user, or be mapped to it. */
static bool peer_allowed(PgSocket *c, const char *uname, const char *map)
{
	struct passwd pw, *found = NULL;
	char buf[4096];

	if (!c->is_unix || c->peer_uid == (uid_t)-1)
		return false;
	int rc = getpwuid_r(c->peer_uid, &pw, buf, sizeof(buf), &found);
	if (rc != 0 || !found) {
		slog(LG_WARNING, c, "peer authentication: no OS user name for uid %ld: %s", (long)c->peer_uid,
		     rc ? strerror(rc) : "not found");
		return false;
	}
	bool ok = map ? ident_map_allows(wk.ident, map, pw.pw_name, uname) : strcmp(pw.pw_name, uname) == 0;
	if (!ok && wk.cf.g.log_connections) {
		if (map)
			slog(LG_LOG, c, "peer authentication: ident map \"%s\" does not allow OS user \"%s\" as \"%s\"",
			     map, pw.pw_name, uname);
		else
			slog(LG_LOG, c, "peer authentication: OS user \"%s\" is not \"%s\"", pw.pw_name, uname);
	}
	return ok;
}

/*
 * Whether the client's verified certificate names `user` (CN or
 * subjectAltName), directly or through the hba rule's ident map.
 */
static bool cert_allowed(PgSocket *c, const char *user, const char *map)
{
	char names[8][TLS_NAME_LEN];
	int n = socket_is_tls(c) ? tls_peer_cert_names(c->sb.ssl, names, 8) : 0;
	for (int i = 0; i < n; i++)
		if (map ? ident_map_allows(wk.ident, map, names[i], user) : strcmp(names[i], user) == 0)
			return true;
	if (!wk.cf.g.log_connections)
		return false;
	if (n == 0)
		slog(LG_LOG, c, "certificate authentication: no verified client certificate");
	else if (map)
		slog(LG_LOG, c,
		     "certificate authentication: ident map \"%s\" maps none of the certificate's names to \"%s\"", map,
		     user);
	else
		slog(LG_LOG, c, "certificate authentication: no certificate name is \"%s\" (CN: \"%s\")", user,
		     names[0]);
	return false;
}

bool auth_console_peer(const PgSocket *c)
{
	const char *uname = c->login_user ? c->login_user->name : c->app_name_raw;
	return c->db && c->db->admin && c->is_unix && c->peer_uid == getuid() && uname &&
	       strcmp(uname, "pgbouncer") == 0;
}

SBufAction auth_start(PgSocket *c)
{
	PgUser *u = c->login_user;
	const char *uname = u ? u->name : c->app_name_raw;
	int method = wk.cf.g.auth_type;
	const HbaRule *rule = NULL; /* with auth_type=hba */
	const char *map = NULL;     /* ident map of the hba rule */

	if (auth_console_peer(c)) {
		c->admin_user = true;
		if (wk.cf.g.log_connections && !c->is_internal)
			slog(LG_LOG, c, "pgbouncer access from unix socket");
		auth_login_complete(c);
		return c->state == CL_JUSTFREE ? SB_CLOSED : SB_CONSUMED;
	}

	if (method == AUTH_HBA) {
		/* the `replication` keyword is for physical replication; logical matches by database name */
		rule = hba_match(wk.hba, c->is_unix, socket_is_tls(c), c->db->name, uname,
		                 c->replication == REPLICATION_PHYSICAL, &c->remote.sa);
		if (!rule) {
			disconnect_client(c, true, "no authentication method is found");
			return SB_CLOSED;
		}
		if (log_enabled(LG_DEBUG))
			slog(LG_DEBUG, c, "hba: line %d matched", rule->line);
		method = rule->method;
		map = rule->map;
	}
	/* the password PAM accepted is for server logins: it proves nothing to another method */
	if (u && u->from_pam && method != AUTH_PAM)
		c->login_user = u = NULL;
	/* PAM and LDAP know their users themselves */
	if (!u && method != AUTH_PAM && method != AUTH_LDAP && wk.cf.g.log_connections && !c->db->placeholder) {
		slog(LG_LOG, c, "login failed: db=%s user=%s", c->db->name, uname);
		slog(LG_LOG, c, "no such user: %s", uname);
	}
	if (log_enabled(LG_DEBUG)) {
		const char *name = method == AUTH_PEER ? "peer" : method == AUTH_REJECT ? "reject" : NULL;
		slog(LG_DEBUG, c, "auth method: %s", name ? name : config_enum_name(cf_auth_types, method));
	}

	switch (method) {
	case AUTH_ANY:
		if (c->db->admin) {
			if (!console_access(c, uname))
				c->stats_user = true;
			c->login_user = user_add(uname);
		} else if (!c->db->placeholder) {
			if (!c->db->forced_user) {
				disconnect_client(c, true, "bouncer config error");
				return SB_CLOSED;
			}
			c->login_user = c->db->forced_user;
		} else if (!c->login_user) {
			c->login_user = user_add(uname);
		}
		auth_login_complete(c);
		break;
	case AUTH_TRUST:
		if (!user_known(u)) {
			disconnect_client(c, true, "\"trust\" authentication failed");
			return SB_CLOSED;
		}
		auth_login_complete(c);
		break;
	case AUTH_LDAP:
		if (!ldap_auth_prepare(c, rule ? rule->ldap : NULL))
			return SB_CLOSED;
		/* fall through */
	case AUTH_PLAIN:
	case AUTH_PAM:
		/* PAM and LDAP need the password itself: asked in clear text (doc/pgbouncer.5.md, auth_type) */
		c->auth_method = method;
		if (!send_auth(c, 3, NULL, 0)) {
			disconnect_client(c, false, "client unexpected eof");
			return SB_CLOSED;
		}
		return SB_CONSUMED;
	case AUTH_MD5:
		if (u && u->kind == SECRET_SCRAM)
			return start_scram(c);
		c->auth_method = AUTH_MD5;
		RAND_bytes(c->md5_salt, sizeof(c->md5_salt));
		if (!send_auth(c, 5, c->md5_salt, 4)) {
			disconnect_client(c, false, "client unexpected eof");
			return SB_CLOSED;
		}
		return SB_CONSUMED;
	case AUTH_SCRAM_SHA_256:
		return start_scram(c);
	case AUTH_PEER:
		/* only from an hba rule; an unknown user fails like a wrong OS user */
		if (!user_known(u) || !peer_allowed(c, uname, map)) {
			disconnect_client(c, true, "unix socket login rejected");
			return SB_CLOSED;
		}
		auth_login_complete(c);
		break;
	case AUTH_CERT:
		if (!user_known(u) || !cert_allowed(c, uname, map)) {
			disconnect_client(c, true, "certificate authentication failed");
			return SB_CLOSED;
		}
		c->auth_method = AUTH_CERT;
		auth_login_complete(c);
		break;
	default:
		/* reject, from an hba rule */
		disconnect_client(c, true, "login rejected");
		return SB_CLOSED;
	}
	return c->state == CL_JUSTFREE ? SB_CLOSED : SB_CONSUMED;
}

/* Check a cleartext password against the stored secret. */
static bool check_plain(const PgUser *u, const char *pw)
{
	if (!u || !u->secret || !*u->secret || !*pw)
		return false;
	switch (u->kind) {
	case SECRET_PLAIN:
		return strlen(u->secret) == strlen(pw) && scram_secure_equal(u->secret, pw, strlen(pw));
	case SECRET_MD5: {
		char h[MD5_PASSWD_LEN + 1];
		md5_password_hash(pw, u->name, h);
		return scram_secure_equal(h, u->secret, MD5_PASSWD_LEN);
	}
	case SECRET_SCRAM: {
		ScramSecret stored;
		if (!scram_parse_secret(u->secret, &stored))
			return false;
		/*
		 * The check runs PBKDF2 with the secret's iterations on the event
		 * loop: any role may store a verifier of 2^31 of them (ALTER ROLE
		 * ... PASSWORD 'SCRAM-SHA-256$...'), which would stall every client
		 * of the worker for minutes. The bound is the one a server's
		 * server-first message gets.
		 */
		if (stored.iterations > SCRAM_MAX_SERVER_ITERATIONS) {
			log_warning("user %s: its SCRAM secret asks for %d iterations, more than the %d a password is "
			            "checked with here: login refused",
			            u->name, stored.iterations, SCRAM_MAX_SERVER_ITERATIONS);
			return false;
		}
		return scram_verify_plain_password(&stored, pw);
	}
	default:
		return false;
	}
}

static SBufAction handle_scram(PgSocket *c, const uint8_t *body, uint32_t len)
{
	PgUser *u = c->login_user;
	char err[128];

	if (!c->scram_srv) {
		/* SASLInitialResponse: mechanism, int32 length, data */
		const char *mech;
		uint32_t dlen;
		const uint8_t *d;
		if (!proto_parse_sasl_initial(body, len, &mech, &d, &dlen)) {
			auth_failed(c, "SASL authentication failed");
			return SB_CLOSED;
		}
		if (strcmp(mech, "SCRAM-SHA-256") != 0) {
			auth_failed(c, "client selected an invalid SASL authentication mechanism");
			return SB_CLOSED;
		}
		if (!d) {
			auth_failed(c, "SASL authentication failed");
			return SB_CLOSED;
		}
		c->scram_srv = xcalloc(1, sizeof(*c->scram_srv));
		ScramSecret secret;
		bool have = false;
		if (u && u->secret && *u->secret) {
			if (u->kind == SECRET_SCRAM) {
				have = scram_parse_secret(u->secret, &secret);
			} else if (u->kind == SECRET_PLAIN) {
				if (!u->adhoc_scram) {
					ScramSecret *s = xcalloc(1, sizeof(*s));
					uint8_t salt[SCRAM_DERIVED_SALT_LEN];
					scram_salt_for(u->name, salt);
					if (scram_build_secret_salt(u->secret, salt, sizeof(salt),
					                            wk.cf.g.scram_iterations, s))
						((PgUser *)u)->adhoc_scram = s;
					else
						free(s);
				}
				if (u->adhoc_scram) {
					secret = *u->adhoc_scram;
					have = true;
				}
			}
		}
		if (!have) {
			/* unknown user or md5 secret: a mock verifier, so the exchange fails at the proof */
			memset(&secret, 0, sizeof(secret));
			secret.iterations = wk.cf.g.scram_iterations;
			secret.salt_len = SCRAM_DERIVED_SALT_LEN;
			/* the salt a plain-password user of that name would get */
			scram_salt_for(u ? u->name : c->app_name_raw, secret.salt);
			RAND_bytes(secret.stored_key, SCRAM_KEY_LEN);
			RAND_bytes(secret.server_key, SCRAM_KEY_LEN);
		}
		if (!scram_server_first(c->scram_srv, &secret, (const char *)d, dlen, err, sizeof(err))) {
			slog(LG_DEBUG, c, "SCRAM client-first rejected: %s", err);
			auth_failed(c, "SASL authentication failed");
			return SB_CLOSED;
		}
		if (!send_auth(c, 11, c->scram_srv->server_first, strlen(c->scram_srv->server_first))) {
			disconnect_client(c, false, "client unexpected eof");
			return SB_CLOSED;
		}
		return SB_CONSUMED;
	}

	/* SASLResponse: the rest of the body is the client-final-message */
	char final[SCRAM_MAX_MSG];
	if (!scram_server_final(c->scram_srv, (const char *)body, len, final, sizeof(final), err, sizeof(err)) || !u ||
	    !u->secret) {
		slog(LG_DEBUG, c, "SCRAM client-final rejected: %s", err);
		/* a wrong password (or an unknown user's mock exchange): the line operators watch for, as with md5 */
		if (!u || !u->secret || strstr(err, "proof does not match"))
			slog(LG_WARNING, c, "password authentication failed");
		auth_failed(c, "SASL authentication failed");
		return SB_CLOSED;
	}
	if (u->kind == SECRET_SCRAM) {
		/* keep the keys so the pooler can log into servers with this secret */
		memcpy(u->scram_client_key, c->scram_srv->client_key, SCRAM_KEY_LEN);
		memcpy(u->scram_server_key, c->scram_srv->secret.server_key, SCRAM_KEY_LEN);
		u->has_scram_keys = true;
	}
	if (!send_auth(c, 12, final, strlen(final))) {
		disconnect_client(c, false, "client unexpected eof");
		return SB_CLOSED;
	}
	free(c->scram_srv);
	c->scram_srv = NULL;
	auth_login_complete(c);
	return c->state == CL_JUSTFREE ? SB_CLOSED : SB_CONSUMED;
}

SBufAction auth_handle_password_msg(PgSocket *c, const uint8_t *data, uint32_t len)
{
	const uint8_t *body = data + 5;
	uint32_t blen = len - 5;
	PgUser *u = c->login_user;

	if (c->auth_method == AUTH_SCRAM_SHA_256)
		return handle_scram(c, body, blen);

	if (blen == 0 || body[blen - 1] != '\0' || memchr(body, '\0', blen) != body + blen - 1) {
		auth_failed(c, "password authentication failed");
		return SB_CLOSED;
	}
	const char *pw = (const char *)body;
	if (!*pw) {
		auth_failed(c, "empty password returned by client");
		return SB_CLOSED;
	}
	bool ok = false;
	if (c->auth_method == AUTH_PAM || c->auth_method == AUTH_LDAP) {
		/* the check takes its own copy; none stays in the read buffer (doc/ldap.md) */
		char *copy = xstrdup(pw);
		explicit_bzero((char *)body, blen);
		bool started = c->auth_method == AUTH_PAM ? pam_auth_start(c, copy) : ldap_auth_start(c, copy);
		explicit_bzero(copy, strlen(copy));
		free(copy);
		return started ? SB_CONSUMED : SB_CLOSED;
	}
	if (c->auth_method == AUTH_PLAIN) {
		ok = check_plain(u, pw);
	} else if (c->auth_method == AUTH_MD5) {
		if (u && u->secret && *u->secret && (u->kind == SECRET_PLAIN || u->kind == SECRET_MD5)) {
			char expect[MD5_PASSWD_LEN + 1];
			md5_salted_response(u->secret, u->kind == SECRET_MD5, u->name, c->md5_salt, expect);
			ok = strlen(pw) == MD5_PASSWD_LEN && scram_secure_equal(expect, pw, MD5_PASSWD_LEN);
		}
	} else {
		auth_failed(c, "password authentication failed");
		return SB_CLOSED;
	}
	if (!ok) {
		auth_failed(c, "password authentication failed");
		return SB_CLOSED;
	}
	auth_login_complete(c);
	return c->state == CL_JUSTFREE ? SB_CLOSED : SB_CONSUMED;
}
