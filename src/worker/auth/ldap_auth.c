/*
 * LDAP checks (doc/ldap.md) in worker threads (auth_threads.c): a thread
 * connects to the first server that answers, sets up TLS (ldaps or
 * StartTLS), and binds as the user (simple bind), or binds as ldapbinddn,
 * searches for the user's entry and binds as it (search+bind). The loop
 * bounds each check: at its deadline it fails the login and shuts the
 * directory connection down under the thread, whatever libldap is doing;
 * it does the same as soon as the client leaves.
 */
#include "autoconfig.h"

#include "worker/ldap_auth.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "worker/auth.h"
#include "worker/worker.h"

#ifndef HAVE_LDAP

bool ldap_auth_prepare(PgSocket *c, const struct LdapOptions *rule)
{
	(void)rule;
	/* not reached: the configuration refuses ldap in such a build */
	disconnect_client(c, true, "login rejected");
	return false;
}

bool ldap_auth_start(PgSocket *c, const char *password)
{
	(void)password;
	disconnect_client(c, true, "login rejected");
	return false;
}

#else

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/ldap_dl.h"
#include "common/ldap_options.h"
#include "worker/auth_threads.h"

/*
 * A directory that hangs holds a thread per check until the check's
 * deadline: one directory's checks hold at most LDAP_THREADS_PER_DIRECTORY
 * of a worker's threads, so that the logins of another directory still
 * find one (doc/ldap.md, "When the directory does not answer").
 */
#define LDAP_THREADS                     32
#define LDAP_THREADS_PER_DIRECTORY       8
/* the bound of a check when client_login_timeout is 0 (no login deadline) */
#define LDAP_BOUND_WITHOUT_LOGIN_TIMEOUT (60 * USEC_PER_SEC)

typedef struct LdapRequest {
	AuthJob job;       /* first: the pool's view of it */
	LdapOptions *opts; /* a copy: the rules may be reloaded meanwhile */
	char *user;
	char *password;            /* NULL until the client sent it; wiped when freed */
	usec_t bound;              /* loop: how long the check may take */
	usec_t deadline;           /* thread: get_mono_usec() time the check must end by */
	struct event *deadline_ev; /* loop */
	int watch_fd;              /* under watch_lock: a dup of the directory socket, -1 when none */
	bool expired;              /* under watch_lock: the deadline passed, or the client left */
	bool ok;                   /* thread's answer */
	char why[512];             /* thread's answer: what failed; never the password */
} LdapRequest;

static void check(AuthJob *job);
static void finish(AuthJob *job, PgSocket *c);
static void abandon(AuthJob *job);

static AuthPool pool = AUTH_POOL_INIT("LDAP", LDAP_THREADS, LDAP_THREADS_PER_DIRECTORY, check, finish, abandon);
static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;

static void free_request(LdapRequest *r)
{
	if (r->deadline_ev)
		event_free(r->deadline_ev);
	if (r->password) {
		explicit_bzero(r->password, strlen(r->password));
		free(r->password);
	}
	if (r->opts) {
		ldap_options_free(r->opts);
		free(r->opts);
	}
	free(r->user);
	free(r);
}

/* ---- in a thread ---- */

static void fail(LdapRequest *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fail(LdapRequest *r, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(r->why, sizeof(r->why), fmt, ap);
	va_end(ap);
}

/* A libldap error: the step, the error's text, and the server's diagnostic message if any. */
static void fail_ldap(LdapRequest *r, LDAP *ld, int rc, const char *step)
{
	char *diag = NULL;
	if (ld)
		ldap_get_option(ld, LDAP_OPT_DIAGNOSTIC_MESSAGE, &diag);
	bool has_diag = diag && *diag;
	bool parenthesized = has_diag && diag[0] == '(';
	fail(r, "%s: %s%s%s%s", step, ldap_err2string(rc),
	     !has_diag       ? ""
	     : parenthesized ? " "
	                     : " (",
	     has_diag ? diag : "", has_diag && !parenthesized ? ")" : "");
	if (diag)
		ldap_memfree(diag);
}

/* Another reason after the ones before (each server that could not be reached). */
static void fail_more(LdapRequest *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fail_more(LdapRequest *r, const char *fmt, ...)
{
	size_t n = strlen(r->why);
	if (n > 0 && n + 2 < sizeof(r->why)) {
		memcpy(r->why + n, "; ", 3);
		n += 2;
	}
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(r->why + n, sizeof(r->why) - n, fmt, ap);
	va_end(ap);
}

static int remaining_ms(const LdapRequest *r)
{
	usec_t now = get_mono_usec();
	return now >= r->deadline ? 0 : (int)((r->deadline - now + 999) / 1000);
}

/* A TCP connection to one address within the time left; blocking once made. -1 with errno. */
static int connect_addr(const LdapRequest *r, const struct addrinfo *ai)
{
	int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -1;
	int err = 0;
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		err = errno;
		if (err == EINPROGRESS) {
			struct pollfd p = {.fd = fd, .events = POLLOUT};
			int n = poll(&p, 1, remaining_ms(r));
			socklen_t len = sizeof(err);
			if (n == 0)
				err = ETIMEDOUT;
			else if (n < 0)
				err = errno;
			else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
				err = errno;
		}
	}
	if (err) {
		close(fd);
		errno = err;
		return -1;
	}
	int one = 1;
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	(void)fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	return fd;
}

/* The first server, in the order given, that accepts a connection; its URL goes to url. */
static int connect_any(LdapRequest *r, char *url, size_t len)
{
	const LdapOptions *o = r->opts;
	char port[16];
	snprintf(port, sizeof(port), "%d", ldap_options_port(o));
	for (int i = 0; i < o->n_servers; i++) {
		if (!ldap_options_server_url(o, i, url, len)) {
			fail_more(r, "server name too long: %s", o->servers[i]);
			continue;
		}
		struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
		struct addrinfo *res = NULL;
		int rc = getaddrinfo(o->servers[i], port, &hints, &res);
		if (rc != 0) {
			fail_more(r, "could not connect to %s: %s", url, gai_strerror(rc));
			continue;
		}
		for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
			int fd = connect_addr(r, ai);
			if (fd >= 0) {
				freeaddrinfo(res);
				return fd;
			}
			fail_more(r, "could not connect to %s: %s", url, strerror(errno));
		}
		freeaddrinfo(res);
	}
	return -1;
}

/* Let the loop shut the connection down at the deadline (a dup of its own: no fd number reuse). */
static void watch(LdapRequest *r, int fd)
{
	int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	pthread_mutex_lock(&watch_lock);
	r->watch_fd = dup_fd;
	if (r->expired && dup_fd >= 0)
		shutdown(dup_fd, SHUT_RDWR);
	pthread_mutex_unlock(&watch_lock);
}

static void unwatch(LdapRequest *r)
{
	pthread_mutex_lock(&watch_lock);
	if (r->watch_fd >= 0)
		close(r->watch_fd);
	r->watch_fd = -1;
	pthread_mutex_unlock(&watch_lock);
}

static bool bind_as(LdapRequest *r, LDAP *ld, const char *dn, const char *password, const char *step)
{
	struct berval cred = {.bv_len = strlen(password), .bv_val = (char *)password};
	int rc = ldap_sasl_bind_s(ld, dn, LDAP_SASL_SIMPLE, &cred, NULL, NULL, NULL);
	if (rc != LDAP_SUCCESS) {
		char what[600];
		snprintf(what, sizeof(what), "%s \"%s\"", step, dn);
		fail_ldap(r, ld, rc, what);
		return false;
	}
	return true;
}

/* Search+bind: find the one entry of the user, with ldapbinddn's rights, then bind as it. */
static bool search_and_bind(LdapRequest *r, LDAP *ld)
{
	const LdapOptions *o = r->opts;
	char filter[1024];
	if (!ldap_options_filter(o, r->user, filter, sizeof(filter))) {
		fail(r, "the user name has a character that LDAP filters reserve (*, (, ), \\, /), or the filter is "
		        "too long");
		return false;
	}
	if (!bind_as(r, ld, o->binddn ? o->binddn : "", o->bindpasswd ? o->bindpasswd : "", "bind as ldapbinddn"))
		return false;
	static const int scopes[] = {[LDAP_OPTS_SCOPE_BASE] = LDAP_SCOPE_BASE,
	                             [LDAP_OPTS_SCOPE_ONE] = LDAP_SCOPE_ONELEVEL,
	                             [LDAP_OPTS_SCOPE_SUB] = LDAP_SCOPE_SUBTREE};
	char *attrs[] = {LDAP_NO_ATTRS, NULL};
	int ms = remaining_ms(r);
	struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 + 1};
	LDAPMessage *res = NULL;
	int rc = ldap_search_ext_s(ld, o->basedn, scopes[o->scope], filter, attrs, 0, NULL, NULL, &tv, 2, &res);
	if (rc != LDAP_SUCCESS && rc != LDAP_SIZELIMIT_EXCEEDED) {
		char what[1200];
		snprintf(what, sizeof(what), "search for %s under \"%s\"", filter, o->basedn);
		fail_ldap(r, ld, rc, what);
		ldap_msgfree(res);
		return false;
	}
	int n = ldap_count_entries(ld, res);
	if (n != 1) {
		fail(r, "%s under \"%s\": %s", filter, o->basedn,
		     n == 0 ? "no such entry (LDAP user does not exist)"
		            : "more than one entry (LDAP user is not unique)");
		ldap_msgfree(res);
		return false;
	}
	char *dn = ldap_get_dn(ld, ldap_first_entry(ld, res));
	ldap_msgfree(res);
	if (!dn) {
		fail(r, "%s under \"%s\": the entry has no DN", filter, o->basedn);
		return false;
	}
	bool ok = bind_as(r, ld, dn, r->password, "bind as");
	ldap_memfree(dn);
	return ok;
}

static void check(AuthJob *job)
{
	LdapRequest *r = (LdapRequest *)job;
	const LdapOptions *o = r->opts;
	char url[300];
	LDAP *ld = NULL;
	int fd = connect_any(r, url, sizeof(url));
	if (fd < 0)
		return;
	watch(r, fd);
	int rc = ldap_init_fd(fd, LDAP_PROTO_TCP, url, &ld);
	if (rc != LDAP_SUCCESS) {
		fail_ldap(r, NULL, rc, "ldap_init_fd");
		close(fd);
		goto out;
	}
	int version = LDAP_VERSION3;
	int ms = remaining_ms(r);
	struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 + 1};
	ldap_set_option(ld, LDAP_OPT_PROTOCOL_VERSION, &version);
	ldap_set_option(ld, LDAP_OPT_REFERRALS, LDAP_OPT_OFF);
	/* the synchronous calls wait no longer than the check may; the loop's shutdown covers the rest */
	ldap_set_option(ld, LDAP_OPT_TIMEOUT, &tv);
	if (o->ldaps && (rc = ldap_install_tls(ld)) != LDAP_SUCCESS) {
		char what[400];
		snprintf(what, sizeof(what), "TLS with %s", url);
		fail_ldap(r, ld, rc, what);
		goto out;
	}
	if (o->starttls && (rc = ldap_start_tls_s(ld, NULL, NULL)) != LDAP_SUCCESS) {
		char what[400];
		snprintf(what, sizeof(what), "StartTLS with %s", url);
		fail_ldap(r, ld, rc, what);
		goto out;
	}
	if (ldap_options_search(o)) {
		r->ok = search_and_bind(r, ld);
	} else {
		char dn[1024];
		if (!ldap_options_bind_dn(o, r->user, dn, sizeof(dn)))
			fail(r, "the DN of user %s is too long", r->user);
		else
			r->ok = bind_as(r, ld, dn, r->password, "bind as");
	}
out:
	unwatch(r);
	if (ld)
		ldap_unbind_ext(ld, NULL, NULL);
}

/* ---- in the loop ---- */

static void finish(AuthJob *job, PgSocket *c)
{
	LdapRequest *r = (LdapRequest *)job;
	if (!c) {
		free_request(r);
		return;
	}
	if (!r->ok) {
		slog(LG_WARNING, c, "LDAP authentication failed for user %s: %s", r->user, r->why);
		free_request(r);
		disconnect_client(c, true, "LDAP authentication failed");
		return;
	}
	slog_debug(c, "LDAP authentication ok");
	/*
	 * The directory knows the user; the pooler may not. Its servers log in
	 * as for any user (the auth_file password, the database's user=, or
	 * none): the password the directory accepted is not kept.
	 */
	if (!c->login_user)
		c->login_user = user_add(r->user);
	free_request(r);
	auth_login_complete(c);
	/* read again: the first query; a client waiting for its welcome stays paused */
	if (c->state == CL_ACTIVE)
		sbuf_continue(&c->sb);
}

/* The check's connection to the directory is shut down under the thread, now or once it is made. */
static void cut_short(LdapRequest *r)
{
	pthread_mutex_lock(&watch_lock);
	r->expired = true;
	if (r->watch_fd >= 0)
		shutdown(r->watch_fd, SHUT_RDWR);
	pthread_mutex_unlock(&watch_lock);
}

/* The client left during its check: nobody waits for the answer, and the thread is free sooner. */
static void abandon(AuthJob *job)
{
	cut_short((LdapRequest *)job);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
	LdapRequest *r = arg;
	(void)fd;
	(void)what;
	worker_clock_tick();
	cut_short(r);
	PgSocket *c = r->job.client;
	if (!c)
		return;
	if (wk.cf.g.client_login_timeout > 0)
		slog(LG_WARNING, c,
		     "LDAP authentication failed for user %s: no answer from the directory before "
		     "client_login_timeout",
		     r->user);
	else
		slog(LG_WARNING, c, "LDAP authentication failed for user %s: no answer from the directory within %d s",
		     r->user, (int)(LDAP_BOUND_WITHOUT_LOGIN_TIMEOUT / USEC_PER_SEC));
	/* the thread's late answer goes to nobody; a check still queued is freed here: r is gone */
	auth_job_client_gone(c);
	disconnect_client(c, true, "LDAP authentication failed");
}

/* libldap reads ldap.conf and the LDAP* environment once per process: here, before any thread. */
static void init_library(void)
{
	static bool done;
	if (done)
		return;
	int version;
	ldap_get_option(NULL, LDAP_OPT_PROTOCOL_VERSION, &version);
	done = true;
}

/* The directory a check asks: its servers, port and scheme, hashed (FNV-1a); never 0. */
static uint64_t directory_lane(const LdapOptions *o)
{
	uint64_t h = 14695981039346656037ULL;
	char tail[32];
	snprintf(tail, sizeof(tail), ":%d:%d", o->port, o->ldaps);
	for (int i = 0; i <= o->n_servers; i++) {
		const char *s = i < o->n_servers ? o->servers[i] : tail;
		for (; *s; s++)
			h = (h ^ (unsigned char)*s) * 1099511628211ULL;
		h = (h ^ ',') * 1099511628211ULL;
	}
	return h ? h : 1;
}

bool ldap_auth_prepare(PgSocket *c, const LdapOptions *rule)
{
	LdapOptions *o;
	if (rule) {
		o = ldap_options_copy(rule);
	} else {
		char err[512];
		o = xmalloc(sizeof(*o));
		/* validated at load: this fails only if auth_ldap_options is empty */
		if (!ldap_options_parse(o, wk.cf.g.auth_ldap_options ? wk.cf.g.auth_ldap_options : "", err,
		                        sizeof(err))) {
			free(o);
			slog(LG_WARNING, c, "LDAP authentication: auth_ldap_options: %s", err);
			disconnect_client(c, true, "LDAP authentication failed");
			return false;
		}
	}
	LdapRequest *r = xcalloc(1, sizeof(*r));
	r->opts = o;
	r->user = xstrdup(c->login_user ? c->login_user->name : c->app_name_raw);
	r->watch_fd = -1;
	auth_job_attach(&r->job, &pool, c);
	r->job.own_deadline = true;
	r->job.lane = directory_lane(o);
	return true;
}

bool ldap_auth_start(PgSocket *c, const char *password)
{
	AuthJob *job = c->auth_job;
	if (!job || job->pool != &pool || job->submitted) {
		disconnect_client(c, true, "LDAP authentication failed");
		return false;
	}
	LdapRequest *r = (LdapRequest *)job;
	char why[300];
	if (!ldap_dl_load(why, sizeof(why))) {
		slog(LG_WARNING, c, "LDAP authentication: %s", why);
		auth_job_client_gone(c);
		disconnect_client(c, true, "LDAP authentication failed");
		return false;
	}
	init_library();
	r->password = xstrdup(password);
	/* the check ends with the login's deadline (doc/ldap.md, "When the directory does not answer") */
	usec_t timeout = wk.cf.g.client_login_timeout;
	if (timeout > 0) {
		usec_t end = c->connect_time + timeout;
		r->bound = end > wk.now ? end - wk.now : 1000;
	} else {
		r->bound = LDAP_BOUND_WITHOUT_LOGIN_TIMEOUT;
	}
	r->deadline = get_mono_usec() + r->bound;
	r->deadline_ev = evtimer_new(wk.base, on_deadline, r);
	struct timeval tv = {.tv_sec = (time_t)(r->bound / USEC_PER_SEC),
	                     .tv_usec = (suseconds_t)(r->bound % USEC_PER_SEC)};
	if (!r->deadline_ev || evtimer_add(r->deadline_ev, &tv) != 0) {
		log_error("LDAP: cannot arm the check's timer");
		auth_job_client_gone(c);
		disconnect_client(c, true, "LDAP authentication failed");
		return false;
	}
	if (!auth_job_submit(c)) {
		disconnect_client(c, true, "LDAP authentication failed");
		return false;
	}
	slog_debug(c, "LDAP check queued (%s)", ldap_options_search(r->opts) ? "search+bind" : "simple bind");
	return true;
}

#endif
