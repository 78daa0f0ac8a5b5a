/*
 * The worker's object model: databases, users, pools and connections, the
 * state lists, change_state() (the only way a socket changes lists), and
 * disconnect_client()/disconnect_server() with their reasons.
 */
#include "autoconfig.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <netinet/tcp.h>
#include <uthash.h>

#include "common/budget.h"
#include "common/filesnap.h"
#include "common/log.h"
#include "common/pktbuf.h"
#include "common/util.h"
#include "worker/hooks.h"
#include "worker/objects.h"
#include "worker/pool_policy.h"
#include "worker/pool_settings.h"
#include "worker/worker.h"

/* Tracked parameters: the five always tracked, then track_extra_parameters. */
static char *var_names[MAX_TRACKED];
static size_t var_name_lens[MAX_TRACKED];
static int n_vars;
static uint32_t names_gen; /* pools' welcome caches hold names of this generation */

static char *var_idents[MAX_TRACKED]; /* var_names quoted as SQL identifiers, made when first needed */

uint32_t var_names_gen(void)
{
	return names_gen;
}

const char *var_ident(int idx)
{
	if (!var_idents[idx]) {
		PktBuf q;
		pktbuf_init(&q, 64);
		pktbuf_put_sql_ident(&q, var_names[idx]);
		pktbuf_put_u8(&q, 0);
		var_idents[idx] = (char *)q.buf; /* owned here now */
	}
	return var_idents[idx];
}

static void var_rename(int idx, const char *name)
{
	free(var_names[idx]);
	var_names[idx] = xstrdup(name);
	var_name_lens[idx] = strlen(name);
	free(var_idents[idx]);
	var_idents[idx] = NULL;
	names_gen++;
}

int var_count(void)
{
	return n_vars;
}

const char *var_name(int idx)
{
	return var_names[idx];
}

int var_index(const char *name)
{
	/* every startup parameter and ParameterStatus of a login comes here: lengths first */
	size_t len = strlen(name);
	for (int i = 0; i < n_vars; i++)
		if (var_name_lens[i] == len && strcasecmp(var_names[i], name) == 0)
			return i;
	return -1;
}

void var_learn_name(int idx, const char *name)
{
	/* the server's spelling: clients look names up case-sensitively (libpq's PQparameterStatus) */
	if (strcmp(var_names[idx], name) != 0)
		var_rename(idx, name);
}

/*
 * DateStyle, client_encoding, TimeZone and standard_conforming_strings
 * (the first four of vars_init()'s list) are read by PostgreSQL whatever
 * their case, and reported in its own spelling, which a client need not
 * use: `utf8` is the server's `UTF8`. Any other value is a string whose
 * case PostgreSQL keeps (application_name, search_path's quoted names):
 * `MyApp` on a server whose previous client was `myapp` needs its SET.
 */
#define CASE_BLIND_VARS 4

bool var_same_value(int idx, const char *a, const char *b)
{
	return a == b || (a && b && (idx < CASE_BLIND_VARS ? strcasecmp(a, b) : strcmp(a, b)) == 0);
}

/*
 * Tracked values are interned: one reference-counted copy per distinct
 * text in the worker, so that equal values are equal pointers and the
 * comparison at every link of a client to a server (replay_vars) is a
 * pointer comparison.
 */
typedef struct VarText {
	UT_hash_handle hh; /* in var_texts, keyed by text */
	uint32_t refs;     /* VarValues pointing at text */
	char text[];       /* NUL-terminated */
} VarText;

static VarText *var_texts; /* uthash head */

static char *var_intern(const char *value)
{
	size_t len = strlen(value);
	VarText *t;
	HASH_FIND(hh, var_texts, value, len, t);
	if (t) {
		t->refs++;
		return t->text;
	}
	t = xcalloc(1, sizeof(*t) + len + 1);
	memcpy(t->text, value, len + 1);
	t->refs = 1;
	HASH_ADD_KEYPTR(hh, var_texts, t->text, len, t);
	return t->text;
}

static void var_release(char *value)
{
	if (!value)
		return;
	VarText *t = (VarText *)(void *)(value - offsetof(VarText, text));
	if (--t->refs > 0)
		return;
	HASH_DELETE(hh, var_texts, t);
	free(t);
}

static void var_ref(char *value)
{
	if (value)
		((VarText *)(void *)(value - offsetof(VarText, text)))->refs++;
}

void var_copy(VarValue *dst, const VarValue *src)
{
	/* the same interned text: a reference more, no hashing */
	if (dst->value == src->value)
		return;
	char *old = dst->value;
	var_ref(dst->value = src->value);
	var_release(old);
}

void var_set(VarValue *v, const char *value)
{
	if (v->value && value && strcmp(v->value, value) == 0)
		return;
	char *old = v->value;
	v->value = value ? var_intern(value) : NULL; /* before the release: value may be old's text */
	var_release(old);
}

/*
 * Sockets' tuples of tracked values, interned like the texts (VarSet in
 * worker/objects.h; doc/architecture.md, "Tracked parameters"), keyed by
 * their pointers. An entry holds var_count() of them, not MAX_TRACKED:
 * nothing reads a tuple past var_count(), which is fixed for the worker's
 * life. A tuple no socket uses any more stays for the next login that
 * builds it (the values of a startup packet before the pool's defaults are
 * added, say); the oldest of more than SPARE_SETS is freed.
 */
typedef struct VarSetEntry {
	UT_hash_handle hh; /* in var_sets */
	List spare;        /* in spare_sets while refs == 0 */
	uint32_t refs;     /* sockets pointing at set */
	VarSet set;        /* last: only var_count() of its pointers are allocated */
} VarSetEntry;

#define SPARE_SETS 64

static VarSetEntry *var_sets;                        /* uthash head */
static List spare_sets = {&spare_sets, &spare_sets}; /* oldest first */
static unsigned n_spare;

/* What s has (the first var_count() entries of dst, the only ones read). */
static void varset_load(VarSet *dst, const PgSocket *s)
{
	for (int i = 0; i < n_vars; i++)
		dst->v[i] = s->vars ? s->vars->v[i] : NULL;
}

static void varset_release(const VarSet *set)
{
	if (!set)
		return;
	VarSetEntry *e = container_of(set, VarSetEntry, set);
	if (--e->refs > 0)
		return;
	list_append(&spare_sets, &e->spare);
	if (++n_spare <= SPARE_SETS)
		return;
	VarSetEntry *old = container_of(list_first(&spare_sets), VarSetEntry, spare);
	list_del(&old->spare);
	n_spare--;
	HASH_DELETE(hh, var_sets, old);
	for (int i = 0; i < n_vars; i++)
		var_release(old->set.v[i]);
	free(old);
}

static bool varset_equal(const VarSet *a, const VarSet *b)
{
	for (int i = 0; i < n_vars; i++)
		if (a->v[i] != b->v[i])
			return false;
	return true;
}

/*
 * s takes the tuple of want's texts (interned ones, not given: the tuple
 * takes its own references). like: a tuple that may be the one, tried
 * before the hash (the linked socket's: a server mostly takes on what its
 * client asked for).
 */
/* The interned tuple of want's texts, made if none has them (NULL: all unset). */
static VarSetEntry *varset_lookup(const VarSet *want)
{
	size_t keylen = (size_t)n_vars * sizeof(want->v[0]);
	/* the hash mixes the pointers word by word: uthash's own (Jenkins) goes byte by byte, 450 instructions for five */
	uint64_t h = 0;
	uintptr_t any = 0;
	for (int i = 0; i < n_vars; i++) {
		any |= (uintptr_t)want->v[i];
		h = (h ^ (uint64_t)(uintptr_t)want->v[i]) * UINT64_C(0x9E3779B97F4A7C15);
	}
	if (!any)
		return NULL;
	unsigned hash = (unsigned)(h >> 32);
	VarSetEntry *e;
	HASH_FIND_BYHASHVALUE(hh, var_sets, want->v, keylen, hash, e);
	if (!e) {
		e = xcalloc(1, offsetof(VarSetEntry, set) + keylen);
		list_init(&e->spare);
		for (int i = 0; i < n_vars; i++)
			var_ref(e->set.v[i] = want->v[i]);
		HASH_ADD_KEYPTR_BYHASHVALUE(hh, var_sets, e->set.v, keylen, hash, e);
	} else if (e->refs == 0) {
		list_del(&e->spare);
		n_spare--;
	}
	return e;
}

static void varset_assign(PgSocket *s, const VarSet *want, const VarSet *like)
{
	/* like is in use by its socket: refs > 0 */
	VarSetEntry *e = like && varset_equal(like, want) ? container_of(like, VarSetEntry, set) : varset_lookup(want);
	if (e)
		e->refs++;
	const VarSet *old = s->vars;
	s->vars = e ? &e->set : NULL;
	varset_release(old);
}

void sock_var_set(PgSocket *s, int idx, const char *value)
{
	const char *cur = sock_var(s, idx);
	if (cur == value || (cur && value && strcmp(cur, value) == 0))
		return;
	char *text = value ? var_intern(value) : NULL; /* value may be a text of s's tuple: before the release */
	sock_var_copy(s, idx, text);
	var_release(text);
}

void sock_var_copy(PgSocket *s, int idx, const char *text)
{
	if (sock_var(s, idx) == text)
		return;
	VarSet want;
	varset_load(&want, s);
	want.v[idx] = (char *)text;
	varset_assign(s, &want, s->link ? s->link->vars : NULL);
}

static const VarSet *varset_ref(const VarSet *set)
{
	if (set)
		container_of(set, VarSetEntry, set)->refs++;
	return set;
}

void var_fill_clear(VarFill *last)
{
	varset_release(last->from);
	varset_release(last->to);
	last->from = last->to = NULL;
}

void sock_vars_fill(PgSocket *s, const VarValue *defaults, VarFill *last)
{
	if (last->to && s->vars == last->from) {
		/* what the last client of the pool with these values got (the defaults did not change since) */
		const VarSet *old = s->vars;
		s->vars = varset_ref(last->to);
		varset_release(old);
		return;
	}
	VarSet want;
	varset_load(&want, s);
	for (int i = 0; i < n_vars; i++)
		if (!want.v[i] && defaults[i].value)
			want.v[i] = defaults[i].value;
	const VarSet *from = varset_ref(s->vars);
	varset_assign(s, &want, s->vars);
	var_fill_clear(last);
	last->from = from;
	last->to = varset_ref(s->vars);
}

void var_sets_usage(size_t *size, int *used, int *spare)
{
	*size = offsetof(VarSetEntry, set) + (size_t)n_vars * sizeof(char *);
	*spare = (int)n_spare;
	*used = (int)HASH_COUNT(var_sets) - (int)n_spare;
}

void sock_vars_clear(PgSocket *s)
{
	varset_release(s->vars);
	s->vars = NULL;
}

static void vars_init(const char *extra)
{
	/* the first CASE_BLIND_VARS are the ones PostgreSQL reads in any case (var_same_value()) */
	static const char *const base[] = {"DateStyle", "client_encoding", "TimeZone", "standard_conforming_strings",
	                                   "application_name"};
	n_vars = 0;
	names_gen++;
	for (size_t i = 0; i < sizeof(base) / sizeof(base[0]); i++) {
		var_name_lens[n_vars] = strlen(base[i]);
		var_names[n_vars++] = xstrdup(base[i]);
	}
	if (!extra)
		return;
	char *list = xstrdup(extra), *save = NULL;
	for (char *t = strtok_r(list, ", \t", &save); t && n_vars < MAX_TRACKED; t = strtok_r(NULL, ", \t", &save))
		if (var_index(t) < 0) {
			var_name_lens[n_vars] = strlen(t);
			var_names[n_vars++] = xstrdup(t);
		}
	free(list);
}

void objects_init(void)
{
	list_init(&wk.databases);
	list_init(&wk.users);
	list_init(&wk.pools);
	list_init(&wk.login_clients);
	list_init(&wk.justfree);
	list_init(&wk.autodb_idle);
	vars_init(wk.cf.g.track_extra_parameters);

	/* the admin console pseudo-database and its user; no min or reserve pool (0 in SHOW DATABASES, as PgBouncer) */
	CfDatabase admin = {.name = "pgbouncer",
	                    .port = 0,
	                    .pool_size = 2,
	                    .min_pool_size = 0,
	                    .reserve_pool_size = 0,
	                    .pool_mode = POOL_STATEMENT,
	                    .query_wait_timeout = CF_UNSET};
	wk.admin_db = db_add(&admin);
	wk.admin_db->admin = true;
	wk.admin_user = user_add("pgbouncer");
	objects_load_userlist(true);
	objects_load_databases();
}

/* ---- names and logging ---- */

const char *state_name(SocketState st, bool for_sockets)
{
	switch (st) {
	case CL_LOGIN:
		return for_sockets ? "cl_login" : "login";
	case CL_WAITING_LOGIN:
	case CL_WAITING:
		return for_sockets ? "cl_waiting" : "waiting";
	case CL_ACTIVE:
		return for_sockets ? "cl_active" : "active";
	case CL_WAITING_CANCEL:
		return for_sockets ? "cl_waiting_cancel_req" : "waiting_cancel_req";
	case CL_ACTIVE_CANCEL:
		return for_sockets ? "cl_active_cancel_req" : "active_cancel_req";
	case SV_LOGIN:
		return for_sockets ? "sv_login" : "new";
	case SV_IDLE:
		return for_sockets ? "sv_idle" : "idle";
	case SV_ACTIVE:
		return for_sockets ? "sv_active" : "active";
	case SV_USED:
		return for_sockets ? "sv_used" : "used";
	case SV_TESTED:
		return for_sockets ? "sv_tested" : "tested";
	case SV_ACTIVE_CANCEL:
		return for_sockets ? "sv_active_cancel" : "active_cancel";
	case SV_BEING_CANCELED:
		return for_sockets ? "sv_being_canceled" : "being_canceled";
	default:
		return "free";
	}
}

void format_addr(const struct sockaddr_storage *ss, char *buf, size_t len, int *port)
{
	sockaddr_host_port((const struct sockaddr *)ss, buf, len, port);
	/* a client's Unix socket peer is unnamed: it came in on our port */
	if (ss->ss_family != AF_INET && ss->ss_family != AF_INET6 && *port == 0)
		*port = wk.cf.g.listen_port;
}

void socket_set_remote(PgSocket *s, const struct sockaddr *sa, socklen_t len)
{
	memset(&s->remote, 0, sizeof(s->remote));
	free(s->remote_path);
	s->remote_path = NULL;
	if (sa->sa_family == AF_INET || sa->sa_family == AF_INET6) {
		memcpy(&s->remote, sa, len < sizeof(s->remote) ? len : sizeof(s->remote));
		return;
	}
	s->remote.sa.sa_family = sa->sa_family;
	/* a client's peer is unnamed; a server's path says the port (SHOW SERVERS) and is where cancels go */
	if (sa->sa_family == AF_UNIX && s->is_server && len > offsetof(struct sockaddr_un, sun_path)) {
		s->remote_path = xcalloc(1, sizeof(*s->remote_path));
		memcpy(s->remote_path, sa, len < sizeof(*s->remote_path) ? len : sizeof(*s->remote_path));
		/* one that came in a hand-over message is read as a string later: never past its end */
		s->remote_path->sun_path[sizeof(s->remote_path->sun_path) - 1] = '\0';
	}
}

socklen_t socket_remote(const PgSocket *s, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	switch (s->remote.sa.sa_family) {
	case AF_INET:
		memcpy(ss, &s->remote.in, sizeof(s->remote.in));
		return sizeof(s->remote.in);
	case AF_INET6:
		memcpy(ss, &s->remote.in6, sizeof(s->remote.in6));
		return sizeof(s->remote.in6);
	default:
		if (!s->remote_path) {
			ss->ss_family = s->remote.sa.sa_family;
			return sizeof(struct sockaddr_un);
		}
		memcpy(ss, s->remote_path, sizeof(*s->remote_path));
		if (s->remote_path->sun_path[0] == '\0') {
			/* abstract (host=@name): the name is as long as the length says, no NUL padding */
			const char *name = s->remote_path->sun_path + 1;
			return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
			                   strnlen(name, sizeof(s->remote_path->sun_path) - 1));
		}
		return sizeof(struct sockaddr_un);
	}
}

void socket_remote_text(const PgSocket *s, char *buf, size_t len, int *port)
{
	struct sockaddr_storage ss;
	socket_remote(s, &ss);
	format_addr(&ss, buf, len, port);
}

/* "C-0x...: db/user@host:port " (doc/pgbouncer.1.md, "LOG FORMAT"). */
void slog(LogLevel level, const PgSocket *s, const char *fmt, ...)
{
	if (!log_enabled(level))
		return;
	char msg[1024], host[INET6_ADDRSTRLEN + 16];
	int port;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	socket_remote_text(s, host, sizeof(host), &port);
	char hostpart[INET6_ADDRSTRLEN + 32];
	if (s->is_server && s->remote.sa.sa_family == AF_UNSPEC) {
		/* no address: a host that did not resolve (PgBouncer's text) */
		snprintf(hostpart, sizeof(hostpart), "(bad-af)");
		port = 0;
	} else if (s->remote.sa.sa_family == AF_INET6)
		snprintf(hostpart, sizeof(hostpart), "[%s]", host);
	else if (s->is_unix && s->peer_pid)
		snprintf(hostpart, sizeof(hostpart), "unix(%d)", s->peer_pid);
	else
		snprintf(hostpart, sizeof(hostpart), "%s", host);
	const char *db = s->db ? s->db->name : (s->pool ? s->pool->db->name : "(nodb)");
	const char *user = s->login_user ? s->login_user->name : "(nouser)";
	log_generic(level, "%c-%p: %s/%s@%s:%d %s", s->is_server ? 'S' : 'C', (const void *)s, db, user, hostpart, port,
	            msg);
}

/* ---- users ---- */

PgUser *user_find_scoped(const char *scope, const char *name)
{
	List *i;
	list_for_each(i, &wk.users)
	{
		PgUser *u = container_of(i, PgUser, node);
		if (strcmp(u->name, name) == 0 && strcmp(u->scope, scope) == 0)
			return u;
	}
	return NULL;
}

PgUser *user_find(const char *name)
{
	return user_find_scoped("", name);
}

/* The [users] entry of this name, or NULL. */
static const CfUser *user_entry_of(const char *name)
{
	for (int k = 0; k < wk.cf.n_users; k++)
		if (strcmp(wk.cf.users[k].name, name) == 0)
			return &wk.cf.users[k];
	return NULL;
}

PgUser *user_add_scoped(const char *scope, const char *name)
{
	PgUser *u = user_find_scoped(scope, name);
	if (u)
		return u;
	u = xcalloc(1, sizeof(*u));
	pgb_strlcpy(u->name, name, sizeof(u->name));
	pgb_strlcpy(u->scope, scope, sizeof(u->scope));
	u->cf = *scope ? user_entry_of(name) : NULL; /* a user of every database gets it from objects_load_userlist() */
	list_init(&u->node);
	/* keep sorted for SHOW USERS */
	List *i;
	list_for_each(i, &wk.users)
	{
		if (strcmp(container_of(i, PgUser, node)->name, name) > 0)
			break;
	}
	list_insert_between(&u->node, i->prev, i);
	return u;
}

PgUser *user_add(const char *name)
{
	return user_add_scoped("", name);
}

void user_set_secret(PgUser *u, const char *secret, SecretKind kind)
{
	if (u->secret && secret && strcmp(u->secret, secret) == 0)
		return;
	free(u->secret);
	u->secret = secret ? xstrdup(secret) : NULL;
	u->kind = kind;
	u->has_scram_keys = false;
	free(u->adhoc_scram);
	u->adhoc_scram = NULL;
}

void objects_load_userlist(bool force)
{
	const char *path = wk.cf.g.auth_file;
	List *i;
	/* [users] entries exist even without a password */
	for (int k = 0; k < wk.cf.n_users; k++)
		(void)user_add(wk.cf.users[k].name);
	/* every user of the name, those auth_query found per database too */
	list_for_each(i, &wk.users)
	{
		PgUser *u = container_of(i, PgUser, node);
		u->cf = user_entry_of(u->name);
	}
	if (wk.cf.g.auth_user && *wk.cf.g.auth_user)
		user_add(wk.cf.g.auth_user); /* a known user (SHOW USERS) */
	if (!path || !*path)
		return;
	struct stat st;
	if (!filesnap_stat(path, &st)) {
		log_warning("could not open auth_file %s: %s", path, strerror(errno));
		return;
	}
	struct stat_key key = {.dev = (long)st.st_dev,
	                       .ino = (long)st.st_ino,
	                       .mode = (long)st.st_mode,
	                       .uid = (long)st.st_uid,
	                       .gid = (long)st.st_gid,
	                       .mtime = (long)st.st_mtim.tv_sec,
	                       .mtime_ns = st.st_mtim.tv_nsec,
	                       .ctime = (long)st.st_ctim.tv_sec,
	                       .ctime_ns = st.st_ctim.tv_nsec,
	                       .size = (long)st.st_size};
	if (!force && memcmp(&key, &wk.auth_file_stat, sizeof(key)) == 0)
		return;
	wk.auth_file_stat = key;

	UserList ul = {0};
	char err[256];
	if (!userlist_load(&ul, path, err, sizeof(err)))
		log_warning("%s", err); /* users read before the broken line are kept */
	/*
	 * The passwords of users the file no longer lists are cleared: removed
	 * users can no longer log in. A secret that auth_query or PAM gave is
	 * not the file's to remove, and a user whose secret stays the same
	 * keeps its SCRAM pass-through keys (user_set_secret()): clients logged
	 * in before the reload still get server connections.
	 */
	list_for_each(i, &wk.users) container_of(i, PgUser, node)->in_auth_file = false;
	for (int k = 0; k < ul.n_users; k++) {
		PgUser *u = user_add(ul.users[k].name);
		user_set_secret(u, ul.users[k].secret, ul.users[k].kind);
		u->from_auth_query = false;
		u->from_pam = false;
		u->in_auth_file = true;
	}
	list_for_each(i, &wk.users)
	{
		PgUser *u = container_of(i, PgUser, node);
		if (!u->in_auth_file && !u->from_auth_query && !u->from_pam)
			user_set_secret(u, NULL, SECRET_EMPTY);
	}
	userlist_free(&wk.userlist);
	wk.userlist = ul;
}

/* ---- databases ---- */

PgDatabase *db_find(const char *name)
{
	List *i;
	list_for_each(i, &wk.databases)
	{
		PgDatabase *db = container_of(i, PgDatabase, node);
		if (strcmp(db->name, name) == 0)
			return db;
	}
	return NULL;
}

static void db_copy_cf(CfDatabase *dst, const CfDatabase *src)
{
	*dst = *src;
	dst->name = xstrdup_or_null(src->name);
	dst->dbname = xstrdup_or_null(src->dbname);
	dst->host = xstrdup_or_null(src->host);
	dst->user = xstrdup_or_null(src->user);
	dst->password = xstrdup_or_null(src->password);
	dst->auth_user = xstrdup_or_null(src->auth_user);
	dst->auth_query = xstrdup_or_null(src->auth_query);
	dst->auth_dbname = xstrdup_or_null(src->auth_dbname);
	dst->connect_query = xstrdup_or_null(src->connect_query);
	dst->client_encoding = xstrdup_or_null(src->client_encoding);
	dst->datestyle = xstrdup_or_null(src->datestyle);
	dst->timezone = xstrdup_or_null(src->timezone);
	dst->application_name = xstrdup_or_null(src->application_name);
	dst->connstr = xstrdup_or_null(src->connstr);
}

static void db_free_cf(CfDatabase *c)
{
	free(c->name);
	free(c->dbname);
	free(c->host);
	free(c->user);
	free(c->password);
	free(c->auth_user);
	free(c->auth_query);
	free(c->auth_dbname);
	free(c->connect_query);
	free(c->client_encoding);
	free(c->datestyle);
	free(c->timezone);
	free(c->application_name);
	free(c->connstr);
}

static void db_apply_cf(PgDatabase *db, const CfDatabase *cf)
{
	db_free_cf(&db->cf);
	db_copy_cf(&db->cf, cf);
	db->forced_user = NULL;
	if (cf->auth_user && *cf->auth_user)
		user_add(cf->auth_user); /* a known user (SHOW USERS) */
	/* the entry's password is for its own server logins only (server_password()), never the user's */
	if (cf->user)
		db->forced_user = user_add(cf->user);
}

PgDatabase *db_add(const CfDatabase *cf)
{
	PgDatabase *db = db_find(cf->name);
	if (!db) {
		db = xcalloc(1, sizeof(*db));
		pgb_strlcpy(db->name, cf->name, sizeof(db->name));
		List *i;
		list_for_each(i, &wk.databases)
		{
			if (strcmp(container_of(i, PgDatabase, node)->name, cf->name) > 0)
				break;
		}
		list_insert_between(&db->node, i->prev, i);
	}
	db_apply_cf(db, cf);
	return db;
}

PgDatabase *db_register_auto(const char *name)
{
	const CfDatabase *star = config_find_db(&wk.cf, "*");
	if (!star || strlen(name) >= CF_MAX_DBNAME)
		return NULL;
	CfDatabase cf = *star;
	cf.name = (char *)name;
	if (!cf.dbname)
		cf.dbname = (char *)name;
	PgDatabase *db = db_add(&cf);
	db->auto_db = true;
	db->inactive_since = 0;
	hooks.db_added(db); /* a DISABLE or PAUSE of it before this worker started */
	log_info("registered new auto-database: %s", name);
	return db;
}

static void kill_database_pools(PgDatabase *db, const char *reason);

static bool same_str(const char *a, const char *b)
{
	return a == b || (a && b && strcmp(a, b) == 0);
}

/*
 * Whether a reloaded entry changes how its servers connect: only then are
 * they replaced (doc/pgbouncer.5.md "RELOADING"). Pool sizes, limits,
 * pool_mode and the startup parameters take effect without closing
 * anything, so a reload that raises pool_size does not cut a session or a
 * replication stream. A removed user= is kept (see below), so it changes
 * nothing.
 */
static bool db_definition_changed(const CfDatabase *old, const CfDatabase *cf)
{
	return !same_str(old->dbname, cf->dbname) || !same_str(old->host, cf->host) || old->port != cf->port ||
	       (cf->user && !same_str(old->user, cf->user)) || !same_str(old->connect_query, cf->connect_query) ||
	       !same_str(old->auth_dbname, cf->auth_dbname) || !same_str(old->auth_query, cf->auth_query) ||
	       old->load_balance_hosts != cf->load_balance_hosts;
}

/* FNV-1a over what db_definition_changed() compares: equal entries, equal hashes; never 0. */
uint64_t db_definition_hash(const CfDatabase *cf)
{
	uint64_t h = 1469598103934665603ull;
	const char *strs[] = {cf->dbname, cf->host, cf->user, cf->connect_query, cf->auth_dbname, cf->auth_query};
	for (size_t k = 0; k < sizeof(strs) / sizeof(strs[0]); k++) {
		for (const char *p = strs[k] ? strs[k] : ""; *p; p++)
			h = (h ^ (uint8_t)*p) * 1099511628211ull;
		h = (h ^ (strs[k] ? 0xffu : 0xfeu)) * 1099511628211ull; /* NULL and "" differ, as same_str() has it */
	}
	int nums[] = {cf->port, (int)cf->load_balance_hosts};
	for (size_t k = 0; k < 2; k++)
		for (int b = 0; b < 4; b++)
			h = (h ^ (uint8_t)((unsigned)nums[k] >> (8 * b))) * 1099511628211ull;
	return h ? h : 1;
}

/* Add or update a database from its (new) entry. */
static PgDatabase *db_load(PgDatabase *db, const CfDatabase *cf)
{
	bool changed = db && !db->admin && db_definition_changed(&db->cf, cf);
	if (db && db->cf.user && !cf->user) {
		log_warning("losing forced user not supported, keeping old setting");
		CfDatabase keep = *cf;
		char *u = xstrdup(db->cf.user);
		keep.user = u;
		db = db_add(&keep);
		free(u);
	} else {
		db = db_add(cf);
	}
	if (changed) {
		/* servers of a changed definition are closed when released */
		List *i;
		list_for_each(i, &wk.pools)
		{
			PgPool *pool = container_of(i, PgPool, node);
			if (pool->db != db)
				continue;
			pool_mark_close_needed(pool);
			/* a failure of the old definition says nothing of the new one: it gets a try at once */
			pool->last_login_failed = false;
			/* the next server login says the parameters again: none twice in a welcome */
			pool->welcome_ready = false;
			pool->welcome_cache_gen = 0;
			pktbuf_reset(&pool->welcome_params);
		}
	}
	return db;
}

void objects_load_databases(void)
{
	/* add or update every configured database */
	for (int k = 0; k < wk.cf.n_dbs; k++) {
		const CfDatabase *cf = &wk.cf.dbs[k];
		if (strcmp(cf->name, "*") == 0)
			continue;
		db_load(db_find(cf->name), cf)->auto_db = false;
	}
	/* the automatically created ones follow the "*" entry, as db_register_auto() made them */
	const CfDatabase *star = config_find_db(&wk.cf, "*");
	List *i, *tmp;
	list_for_each(i, &wk.databases)
	{
		PgDatabase *db = container_of(i, PgDatabase, node);
		if (!db->auto_db || !star)
			continue;
		CfDatabase cf = *star;
		cf.name = db->name;
		if (!cf.dbname)
			cf.dbname = db->name;
		(void)db_load(db, &cf);
	}
	/* databases removed from the file are dropped */
	list_for_each_safe(i, &wk.databases, tmp)
	{
		PgDatabase *db = container_of(i, PgDatabase, node);
		if (db->admin || db->auto_db)
			continue;
		if (!config_find_db(&wk.cf, db->name))
			kill_database_pools(db, "database removed");
	}
}

static void kill_database_pools(PgDatabase *db, const char *reason)
{
	List *i, *tmp;
	list_for_each_safe(i, &wk.pools, tmp)
	{
		PgPool *pool = container_of(i, PgPool, node);
		if (pool->db != db)
			continue;
		List *lists[] = {&pool->active_clients, &pool->waiting_clients};
		for (size_t l = 0; l < 2; l++) {
			List *j, *t2;
			list_for_each_safe(j, lists[l], t2)
			    disconnect_client(container_of(j, PgSocket, node), true, "%s", reason);
		}
		List *slists[] = {&pool->active_servers, &pool->idle_servers, &pool->used_servers,
		                  &pool->tested_servers, &pool->new_servers};
		for (size_t l = 0; l < sizeof(slists) / sizeof(slists[0]); l++) {
			List *j, *t2;
			list_for_each_safe(j, slists[l], t2)
			    disconnect_server(container_of(j, PgSocket, node), true, "%s", reason);
		}
		/* gone from SHOW POOLS now; one still busy with a cancel goes with the janitor (check_pool_idle()) */
		if (pool_unused(pool))
			pool_free(pool);
	}
	db->placeholder = true; /* hidden from lookups; freed with its pools later */
	list_del(&db->node);
	list_append(&wk.autodb_idle, &db->node);
}

/* ---- pools ---- */

PgPool *pool_find(PgDatabase *db, PgUser *user)
{
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		if (p->db == db && p->user == user)
			return p;
	}
	return NULL;
}

PgPool *pool_get(PgDatabase *db, PgUser *user)
{
	PgPool *pool = pool_find(db, user);
	if (pool) {
		pool->unused_since = 0; /* a login counts as use, even between two janitor passes */
		return pool;
	}
	pool = xcalloc(1, sizeof(*pool));
	pool->db = db;
	pool->user = user;
	List *lists[] = {&pool->active_clients,        &pool->waiting_clients,       &pool->active_cancel_req,
	                 &pool->waiting_cancel_req,    &pool->active_servers,        &pool->idle_servers,
	                 &pool->used_servers,          &pool->tested_servers,        &pool->new_servers,
	                 &pool->active_cancel_servers, &pool->being_canceled_servers};
	for (size_t l = 0; l < sizeof(lists) / sizeof(lists[0]); l++)
		list_init(lists[l]);
	pktbuf_init(&pool->welcome_params, 256);
	/* sorted by (database, user) */
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		int c = strcmp(p->db->name, db->name);
		if (c > 0 || (c == 0 && strcmp(p->user->name, user->name) > 0))
			break;
	}
	list_insert_between(&pool->node, i->prev, i);
	log_debug("new pool %s/%s", db->name, user->name);
	return pool;
}

/* The entry of the tree's SHOW STATS totals of db: its BUDGET_DB budget entry, looked up once; -1: none. */
static int db_stats_entry(PgDatabase *db)
{
	if (!wk.slot)
		return -1;
	if (db->budget.idx == 0) {
		int idx = budget_lookup(&wk.shm->budget, wk.id, BUDGET_DB, db->name, "");
		db->budget.idx = idx < 0 ? -1 : idx + 1;
	}
	return db->budget.idx > 0 ? db->budget.idx - 1 : -1;
}

void pool_stats_flush(PgPool *pool)
{
	const uint64_t *now = (const uint64_t *)&pool->stats;
	const uint64_t *done = (const uint64_t *)&pool->flushed;
	uint64_t delta[PGSTATS_FIELDS];
	bool any = false;
	for (size_t f = 0; f < PGSTATS_FIELDS; f++) {
		delta[f] = now[f] - done[f];
		any = any || delta[f];
	}
	if (!any)
		return;
	int e = db_stats_entry(pool->db);
	if (e < 0)
		return;
	budget_stats_add(&wk.shm->budget, e, delta);
	pool->flushed = pool->stats;
}

void pools_stats_flush(void)
{
	List *i;
	list_for_each(i, &wk.pools) pool_stats_flush(container_of(i, PgPool, node));
}

bool db_stats_totals(const char *name, PgStats *out)
{
	if (!wk.slot)
		return false;
	int idx = budget_lookup(&wk.shm->budget, wk.id, BUDGET_DB, name, "");
	if (idx < 0)
		return false;
	budget_stats_read(&wk.shm->budget, idx, (uint64_t *)out);
	return true;
}

void pool_free(PgPool *pool)
{
	pool_stats_flush(pool);
	pgstats_add(&wk.retired_stats, &pool->stats); /* the worker's totals stay monotonic */
	hooks.pool_gone(pool);
	list_del(&pool->node);
	pktbuf_free(&pool->welcome_params);
	pktbuf_free(&pool->welcome_cache);
	for (int k = 0; k < MAX_TRACKED; k++) {
		var_set(&pool->defaults[k], NULL);
		var_set(&pool->welcome_vals[k], NULL);
	}
	var_fill_clear(&pool->last_fill);
	free(pool);
}

int pool_server_count(const PgPool *pool)
{
	const int *n = pool->n_state;
	return n[SV_ACTIVE] + n[SV_IDLE] + n[SV_USED] + n[SV_TESTED] + n[SV_LOGIN] + n[SV_BEING_CANCELED];
}

int pool_client_count(const PgPool *pool)
{
	const int *n = pool->n_state;
	return n[CL_ACTIVE] + n[CL_WAITING] + n[CL_WAITING_LOGIN];
}

bool pool_unused(const PgPool *pool)
{
	return pool_client_count(pool) == 0 && pool_server_count(pool) == 0 && list_empty(&pool->active_cancel_req) &&
	       list_empty(&pool->waiting_cancel_req) && list_empty(&pool->active_cancel_servers) &&
	       !auth_query_waiting(pool);
}

void pool_mark_close_needed(PgPool *pool)
{
	List *lists[] = {&pool->active_servers, &pool->idle_servers, &pool->used_servers, &pool->tested_servers,
	                 &pool->new_servers};
	for (size_t l = 0; l < sizeof(lists) / sizeof(lists[0]); l++) {
		List *j;
		list_for_each(j, lists[l]) container_of(j, PgSocket, node)->close_needed = true;
	}
}

void budget_hold_release(BudgetHold *hold)
{
	if (!hold->taken)
		return;
	for (int k = 0; k < 3; k++)
		if (hold->idx[k] >= 0)
			budget_give(&wk.shm->budget, wk.id, hold->idx[k]); /* an entry of the segment: wk.slot is set */
	hold->taken = false;
}

/* ---- sockets ---- */

/*
 * Freed sockets kept for the next logins: a login under churn took a
 * calloc() and a free() of its PgSocket (about 400 instructions of 14,600,
 * doc/benchmarks.md "Logins against PgBouncer 1.25.2"). The closed
 * sockets of a loop pass are freed at its end (worker_main), so a few
 * suffice: at most SOCKET_CACHE_MAX (11.9 KB). None under
 * AddressSanitizer, whose use-after-free checks a reused socket would
 * blind.
 */
#if defined(__SANITIZE_ADDRESS__)
#define SOCKET_CACHE_MAX 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SOCKET_CACHE_MAX 0
#endif
#endif
#ifndef SOCKET_CACHE_MAX
#define SOCKET_CACHE_MAX 16
#endif
static PgSocket *socket_cache[SOCKET_CACHE_MAX + 1];
static int socket_cached;

PgSocket *socket_new_with_id(bool is_server, uint64_t id)
{
	PgSocket *s;
	if (socket_cached > 0) {
		s = socket_cache[--socket_cached];
		memset(s, 0, sizeof(*s));
	} else {
		s = xcalloc(1, sizeof(*s));
	}
	list_init(&s->node);
	s->is_server = is_server;
	s->state = is_server ? SV_FREE : CL_FREE;
	s->sb.fd = -1;
	s->id = id;
	s->connect_time = s->request_time = wk.now ? wk.now : get_time_usec();
	return s;
}

PgSocket *socket_new(bool is_server)
{
	/*
	 * One counter for the whole tree, taken in creation order, so that an
	 * id names one connection whatever the worker (doc/workers.md,
	 * "Connection ids").
	 */
	uint64_t n = wk.slot ? atomic_fetch_add(&wk.shm->next_socket_id, 1) + 1 : ++wk.next_id;
	return socket_new_with_id(is_server, shm_socket_id(n));
}

PgSocket *socket_new_internal(void)
{
	/* never shown, never a KILL_CLIENT target: out of the range users see, unique in this worker */
	return socket_new_with_id(false, SOCKET_ID_INTERNAL | ++wk.next_internal_id);
}

static List *state_list(PgSocket *s, SocketState st)
{
	PgPool *p = s->pool;
	switch (st) {
	case CL_LOGIN:
		return &wk.login_clients;
	case CL_WAITING_LOGIN:
	case CL_WAITING:
		return &p->waiting_clients;
	case CL_ACTIVE:
		return &p->active_clients;
	case CL_WAITING_CANCEL:
		return &p->waiting_cancel_req;
	case CL_ACTIVE_CANCEL:
		return &p->active_cancel_req;
	case SV_LOGIN:
		return &p->new_servers;
	case SV_IDLE:
		return &p->idle_servers;
	case SV_ACTIVE:
		return &p->active_servers;
	case SV_USED:
		return &p->used_servers;
	case SV_TESTED:
		return &p->tested_servers;
	case SV_ACTIVE_CANCEL:
		return &p->active_cancel_servers;
	case SV_BEING_CANCELED:
		return &p->being_canceled_servers;
	case CL_JUSTFREE:
	case SV_JUSTFREE:
		return &wk.justfree;
	default:
		return NULL;
	}
}

static bool is_client_state(SocketState st)
{
	return st <= CL_ACTIVE_CANCEL;
}

void change_state(PgSocket *s, SocketState st)
{
	pgb_assert(st < SOCKET_STATE_COUNT && is_client_state(st) == !s->is_server);
	if (list_linked(&s->node))
		list_del(&s->node);
	if (s->counted_in) {
		pgb_assert(s->counted_in->n_state[s->state] > 0);
		s->counted_in->n_state[s->state]--;
		s->counted_in = NULL;
	}
	s->state = st;
	List *l = state_list(s, st);
	if (!l)
		return;
	if (l != &wk.login_clients && l != &wk.justfree) {
		/* a pool's list: counted */
		s->counted_in = s->pool;
		s->pool->n_state[st]++;
	}
	/* idle servers are reused LIFO, unless round-robin or about to close */
	if (st == SV_IDLE && policy_idle_at_head(wk.cf.g.server_round_robin, s->close_needed))
		list_prepend(l, &s->node);
	else
		list_append(l, &s->node);
}

void pool_check_counts(const PgPool *p)
{
#ifdef PGB_CASSERT
	const int *n = p->n_state;
	pgb_assert(list_count(&p->active_clients) == n[CL_ACTIVE]);
	pgb_assert(list_count(&p->waiting_clients) == n[CL_WAITING] + n[CL_WAITING_LOGIN]);
	pgb_assert(list_count(&p->active_cancel_req) == n[CL_ACTIVE_CANCEL]);
	pgb_assert(list_count(&p->waiting_cancel_req) == n[CL_WAITING_CANCEL]);
	pgb_assert(list_count(&p->active_servers) == n[SV_ACTIVE]);
	pgb_assert(list_count(&p->idle_servers) == n[SV_IDLE]);
	pgb_assert(list_count(&p->used_servers) == n[SV_USED]);
	pgb_assert(list_count(&p->tested_servers) == n[SV_TESTED]);
	pgb_assert(list_count(&p->new_servers) == n[SV_LOGIN]);
	pgb_assert(list_count(&p->active_cancel_servers) == n[SV_ACTIVE_CANCEL]);
	pgb_assert(list_count(&p->being_canceled_servers) == n[SV_BEING_CANCELED]);
#else
	(void)p;
#endif
}

static void free_socket(PgSocket *s)
{
	pgb_assert(s->counted_in == NULL && !s->link);
	sock_vars_clear(s);
	free(s->app_name_raw);
	free(s->repl_options);
	if (s->repl_params) {
		pktbuf_free(s->repl_params);
		free(s->repl_params);
	}
	free(s->own_placeholder);
	free(s->server_key);
	free(s->remote_path);
	free(s->scram_srv);
	free(s->scram_cli);
	SSL_free(s->tls_pending);
	free(s->tls_host);
	reqqueue_free(&s->rq);
	prepare_client_clear(&s->stmts);
	prepare_server_clear(&s->sstmts);
	if (socket_cached < SOCKET_CACHE_MAX)
		socket_cache[socket_cached++] = s;
	else
		free(s);
}

void socket_local_addr(const PgSocket *s, struct sockaddr_storage *ss)
{
	socklen_t len;
	if (s->sb.fd < 0 || s->sb.connecting || !sbuf_local_addr(&s->sb, ss, &len))
		memset(ss, 0, sizeof(*ss));
}

void socket_set_server_key(PgSocket *s, const uint8_t *key, uint32_t len)
{
	free(s->server_key);
	s->server_key = xmalloc(len ? len : 1);
	memcpy(s->server_key, key, len);
	s->server_key_len = len;
}

void socket_free_justfree(void)
{
	List *i, *tmp;
	list_for_each_safe(i, &wk.justfree, tmp)
	{
		list_del(i);
		free_socket(container_of(i, PgSocket, node));
	}
}

void client_send_error(PgSocket *c, bool fatal_err, const char *sqlstate, const char *fmt, ...)
{
	char msg[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (wk.cf.g.log_pooler_errors)
		slog(LG_WARNING, c, "pooler error: %s", msg);
	PktBuf pb;
	pktbuf_init(&pb, 128);
	pktbuf_write_error(&pb, fatal_err ? "FATAL" : "ERROR", sqlstate ? sqlstate : "08P01", msg);
	if (!fatal_err)
		pktbuf_write_ready(&pb, 'I');
	if (c->sb.fd >= 0)
		(void)sbuf_send(&c->sb, pb.buf, pb.len);
	pktbuf_free(&pb);
}

static double age_seconds(const PgSocket *s)
{
	return (double)(get_time_usec() - s->connect_time) / USEC_PER_SEC;
}

/*
 * The reason for closing s, and its log line; false if s is closed already.
 * The reason is formatted only when something reads it (`needed`, or the
 * log line): a client that just says Terminate costs no vsnprintf().
 */
static bool closing(PgSocket *s, bool needed, char *reason, size_t len, const char *fmt, va_list ap)
{
	reason[0] = '\0';
	if (s->state == CL_JUSTFREE || s->state == CL_FREE || s->state == SV_JUSTFREE || s->state == SV_FREE)
		return false;
	if (fmt && (needed || wk.cf.g.log_disconnections || log_enabled(LG_DEBUG)))
		vsnprintf(reason, len, fmt, ap);
	if (wk.cf.g.log_disconnections && !s->is_internal)
		slog(LG_LOG, s, "closing because: %s (age=%.0fs)", reason, age_seconds(s));
	else
		slog_debug(s, "closing because: %s (age=%.0fs)", reason, age_seconds(s));
	return true;
}

/*
 * Steps [from, to) of a socket's teardown: what the modules above the
 * model do when it closes (include/worker/hooks.h, ClientGone, ServerGone).
 */
static void run_gone(const SocketHook *steps, int from, int to, PgSocket *s)
{
	for (int k = from; k < to; k++)
		steps[k](s);
}

void disconnect_client(PgSocket *c, bool notify, const char *fmt, ...)
{
	char reason[256];
	va_list ap;
	va_start(ap, fmt);
	bool open = closing(c, notify && c->sb.fd >= 0, reason, sizeof(reason), fmt, ap);
	va_end(ap);
	if (!open)
		return;
	if (notify && c->sb.fd >= 0 && reason[0])
		client_send_error(c, true, "08P01", "%s", reason);
	run_gone(hooks.client_gone, 0, CLIENT_GONE_CLOSED, c);
	if (c->state != CL_LOGIN && c->state != CL_WAITING_CANCEL && c->state != CL_ACTIVE_CANCEL && c->db &&
	    !c->is_internal) {
		c->db->client_count--;
		if (c->login_user)
			c->login_user->client_count--;
	}
	budget_hold_release(&c->budget);
	sbuf_close(&c->sb);
	change_state(c, CL_JUSTFREE);
	run_gone(hooks.client_gone, CLIENT_GONE_CLOSED + 1, CLIENT_GONE_STEPS, c);
}

void disconnect_server(PgSocket *s, bool notify, const char *fmt, ...)
{
	char reason[128];
	va_list ap;
	va_start(ap, fmt);
	bool open = closing(s, s->link != NULL, reason, sizeof(reason), fmt, ap);
	va_end(ap);
	if (!open)
		return;
	if (notify && s->sb.fd >= 0 && s->state != SV_LOGIN) {
		static const uint8_t terminate[] = {'X', 0, 0, 0, 4};
		(void)sbuf_send(&s->sb, terminate, sizeof(terminate));
	}
	PgSocket *client = s->link;
	if (client) {
		s->link = NULL;
		client->link = NULL;
		client->sb.dst = NULL;
		s->sb.dst = NULL;
		disconnect_client(client, true, "%s", reason);
	}
	run_gone(hooks.server_gone, 0, SERVER_GONE_CLOSED, s);
	if (s->pool) {
		s->pool->db->server_count--;
		s->pool->user->server_count--;
	}
	budget_hold_release(&s->budget);
	sbuf_close(&s->sb);
	change_state(s, SV_JUSTFREE);
	run_gone(hooks.server_gone, SERVER_GONE_CLOSED + 1, SERVER_GONE_STEPS, s);
}

/*
 * TCP_NODELAY, and SO_KEEPALIVE as tcp_keepalive says. Sockets accepted
 * from a listener inherit both (Linux copies them at accept), so they are
 * set on the listeners, at start, at every reload and at a console SET of
 * tcp_keepalive, instead of with two setsockopt() per login
 * (doc/benchmarks.md, "Options set on the listener").
 */
void tune_tcp_listener(int fd)
{
	int on = 1, keepalive = wk.cf.g.tcp_keepalive ? 1 : 0;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &keepalive, sizeof(keepalive));
}

/*
 * The options a socket does not inherit from its listener: the keepalive
 * timings and tcp_user_timeout (a listener could not be given "system
 * default" back after a reload), and the buffer sizes again.
 */
void tune_accepted_socket(int fd)
{
	const CfGlobals *g = &wk.cf.g;
	if (g->tcp_keepalive) {
		if (g->tcp_keepcnt > 0)
			setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &g->tcp_keepcnt, sizeof(int));
		if (g->tcp_keepidle > 0)
			setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &g->tcp_keepidle, sizeof(int));
		if (g->tcp_keepintvl > 0)
			setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &g->tcp_keepintvl, sizeof(int));
	}
	if (g->tcp_user_timeout > 0)
		setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &g->tcp_user_timeout, sizeof(int));
	if (g->tcp_socket_buffer > 0) {
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &g->tcp_socket_buffer, sizeof(int));
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &g->tcp_socket_buffer, sizeof(int));
	}
}

/*
 * TCP options of doc/pgbouncer.5.md, "Low-level network" (tcp_keepalive,
 * tcp_keep*, tcp_user_timeout, tcp_socket_buffer) on a server socket: what
 * a client socket has from its listener, and the rest.
 */
void tune_tcp_socket(int fd)
{
	tune_tcp_listener(fd);
	tune_accepted_socket(fd);
}
