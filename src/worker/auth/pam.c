/*
 * PAM checks in worker threads (auth_threads.c). A request holds copies of
 * the user name, password and client address; a thread runs
 * pam_authenticate() and pam_acct_mgmt() for service "pgbouncer", and the
 * loop finishes the login with the answer (when the client went first, the
 * answer is dropped). Threads never log; the loop logs the answers.
 */
#include "autoconfig.h"

#include "worker/pam.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "worker/auth.h"
#include "worker/worker.h"

#ifndef HAVE_PAM

bool pam_available(void)
{
	return false;
}

bool pam_auth_start(PgSocket *c, const char *password)
{
	(void)password;
	/* not reached: the configuration refuses pam in such a build */
	disconnect_client(c, true, "login rejected");
	return false;
}

#else

#include <security/pam_appl.h>

#include "worker/auth_threads.h"

#define PGB_PAM_SERVICE "pgbouncer"
#define PAM_THREADS     2

typedef struct PamRequest {
	AuthJob job; /* first: the pool's view of it */
	char *user;
	char *password;
	char rhost[INET6_ADDRSTRLEN + 8];
	bool ok;       /* thread's answer */
	char why[160]; /* thread's answer: PAM's reason for a failure */
} PamRequest;

static void check(AuthJob *job);
static void finish(AuthJob *job, PgSocket *c);

static AuthPool pool = AUTH_POOL_INIT("PAM", PAM_THREADS, 0, check, finish, NULL);

bool pam_available(void)
{
	return true;
}

static void free_request(PamRequest *r)
{
	if (r->password) {
		explicit_bzero(r->password, strlen(r->password));
		free(r->password);
	}
	free(r->user);
	free(r);
}

/* PAM's questions: the password for a hidden prompt, the user name for a visible one. */
static int conversation(int n, const struct pam_message **msg, struct pam_response **resp, void *arg)
{
	const PamRequest *r = arg;
	if (n <= 0 || n > PAM_MAX_NUM_MSG)
		return PAM_CONV_ERR;
	struct pam_response *out = calloc((size_t)n, sizeof(*out));
	if (!out)
		return PAM_BUF_ERR;
	for (int i = 0; i < n; i++) {
		const char *answer = NULL;
		switch (msg[i]->msg_style) {
		case PAM_PROMPT_ECHO_OFF:
			answer = r->password;
			break;
		case PAM_PROMPT_ECHO_ON:
			answer = r->user;
			break;
		case PAM_ERROR_MSG:
		case PAM_TEXT_INFO:
			continue;
		default:
			answer = NULL;
			break;
		}
		if (!answer || !(out[i].resp = strdup(answer))) {
			for (int k = 0; k < i; k++) {
				if (out[k].resp) {
					explicit_bzero(out[k].resp, strlen(out[k].resp));
					free(out[k].resp);
				}
			}
			free(out);
			return PAM_CONV_ERR;
		}
	}
	*resp = out;
	return PAM_SUCCESS;
}

/* In a thread. */
static void check(AuthJob *job)
{
	PamRequest *r = (PamRequest *)job;
	struct pam_conv conv = {.conv = conversation, .appdata_ptr = r};
	pam_handle_t *h = NULL;
	int rc = pam_start(PGB_PAM_SERVICE, r->user, &conv, &h);
	if (rc != PAM_SUCCESS) {
		snprintf(r->why, sizeof(r->why), "pam_start: %s", h ? pam_strerror(h, rc) : "failed");
		if (h)
			pam_end(h, rc);
		return;
	}
	rc = pam_set_item(h, PAM_RHOST, r->rhost);
	const char *step = "pam_set_item";
	if (rc == PAM_SUCCESS) {
		step = "pam_authenticate";
		rc = pam_authenticate(h, PAM_SILENT);
	}
	if (rc == PAM_SUCCESS) {
		step = "pam_acct_mgmt";
		rc = pam_acct_mgmt(h, PAM_SILENT);
	}
	r->ok = rc == PAM_SUCCESS;
	if (!r->ok)
		snprintf(r->why, sizeof(r->why), "%s: %s", step, pam_strerror(h, rc));
	pam_end(h, rc);
}

/* In the loop. */
static void finish(AuthJob *job, PgSocket *c)
{
	PamRequest *r = (PamRequest *)job;
	if (!c) {
		free_request(r);
		return;
	}
	if (!r->ok) {
		slog(LG_WARNING, c, "PAM authentication failed for user %s: %s", r->user, r->why);
		free_request(r);
		disconnect_client(c, true, "PAM authentication failed");
		return;
	}
	slog_debug(c, "PAM authentication ok");
	if (!c->login_user)
		c->login_user = user_add(r->user);
	PgUser *u = c->login_user;
	/* a user that auth_file does not know logs into servers with the password PAM accepted */
	if (!u->secret || u->from_pam) {
		user_set_secret(u, r->password, SECRET_PLAIN);
		u->from_pam = true;
		u->secret_time = get_time_usec(); /* the newest wins when a client moves in (migrate.c) */
	}
	free_request(r);
	auth_login_complete(c);
	/* read again: the first query; a client waiting for its welcome stays paused */
	if (c->state == CL_ACTIVE)
		sbuf_continue(&c->sb);
}

bool pam_auth_start(PgSocket *c, const char *password)
{
	/*
	 * One check per login: a second password message already in the read
	 * buffer (sent without waiting for the answer) would attach a second
	 * job to the client, and the first answer's close would leave the
	 * other pointing at a freed socket.
	 */
	if (c->auth_job) {
		disconnect_client(c, true, "PAM authentication failed");
		return false;
	}
	const char *user = c->login_user ? c->login_user->name : c->app_name_raw;
	PamRequest *r = xcalloc(1, sizeof(*r));
	r->user = xstrdup(user);
	r->password = xstrdup(password);
	int port;
	socket_remote_text(c, r->rhost, sizeof(r->rhost), &port);
	auth_job_attach(&r->job, &pool, c);
	if (!auth_job_submit(c)) {
		disconnect_client(c, true, "PAM authentication failed");
		return false;
	}
	slog_debug(c, "PAM check queued");
	return true;
}

#endif
