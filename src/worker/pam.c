/*
 * PAM checks in worker threads. A request holds copies of the user name,
 * password and client address; a thread takes it from the queue, runs
 * pam_authenticate() and pam_acct_mgmt() for service "pgbouncer", and puts
 * it on the done list, then writes to an eventfd that the event loop reads.
 * Only the loop touches sockets: a request names its client through
 * `client`, which only the loop reads or clears (when the client goes
 * first, the answer is dropped). Threads never log; the loop logs the
 * answers.
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

void pam_client_gone(PgSocket *c)
{
	(void)c;
}

#else

#include <errno.h>
#include <event2/event.h>
#include <pthread.h>
#include <security/pam_appl.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define PGB_PAM_SERVICE "pgbouncer"
#define PAM_THREADS     2

struct PamRequest {
	struct PamRequest *next;
	PgSocket *client; /* loop only: NULL once the client is gone */
	char *user;
	char *password;
	char rhost[INET6_ADDRSTRLEN + 8];
	bool ok;       /* thread's answer */
	char why[160]; /* thread's answer: PAM's reason for a failure */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static PamRequest *queue_head, *queue_tail; /* waiting for a thread */
static PamRequest *done;                    /* answered, for the loop */
static int done_fd = -1;
static struct event *done_ev;
static bool started;

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

static void check(PamRequest *r)
{
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

static void *thread_main(void *arg)
{
	(void)arg;
	for (;;) {
		pthread_mutex_lock(&lock);
		while (!queue_head)
			pthread_cond_wait(&wake, &lock);
		PamRequest *r = queue_head;
		queue_head = r->next;
		if (!queue_head)
			queue_tail = NULL;
		pthread_mutex_unlock(&lock);

		check(r);

		pthread_mutex_lock(&lock);
		r->next = done;
		done = r;
		pthread_mutex_unlock(&lock);
		uint64_t one = 1;
		while (write(done_fd, &one, sizeof(one)) < 0 && errno == EINTR)
			;
	}
	return NULL;
}

static void finish(PamRequest *r)
{
	PgSocket *c = r->client;
	if (!c) {
		log_debug("PAM: answer for a client that is gone, dropped");
		free_request(r);
		return;
	}
	c->pam_req = NULL;
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

static void on_done(evutil_socket_t fd, short what, void *arg)
{
	(void)what;
	(void)arg;
	worker_clock_tick();
	uint64_t n;
	(void)!read(fd, &n, sizeof(n));
	pthread_mutex_lock(&lock);
	PamRequest *list = done;
	done = NULL;
	pthread_mutex_unlock(&lock);
	/* the done list is newest first: answer in arrival order */
	PamRequest *ordered = NULL;
	while (list) {
		PamRequest *next = list->next;
		list->next = ordered;
		ordered = list;
		list = next;
	}
	while (ordered) {
		PamRequest *next = ordered->next;
		finish(ordered);
		ordered = next;
	}
}

/* The threads start at the first PAM login of this worker process. */
static bool start_threads(void)
{
	if (started)
		return true;
	done_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (done_fd < 0) {
		log_error("PAM: eventfd: %s", strerror(errno));
		return false;
	}
	done_ev = event_new(wk.base, done_fd, EV_READ | EV_PERSIST, on_done, NULL);
	if (!done_ev || event_add(done_ev, NULL) != 0) {
		log_error("PAM: cannot watch the answer eventfd");
		return false;
	}
	/* signals stay with the loop's thread: the threads start with all of them blocked */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	int n = 0;
	for (int i = 0; i < PAM_THREADS; i++) {
		pthread_t t;
		pthread_attr_t attr;
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&t, &attr, thread_main, NULL) == 0)
			n++;
		pthread_attr_destroy(&attr);
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (n == 0) {
		log_error("PAM: cannot start a thread");
		return false;
	}
	log_debug("PAM: %d threads started", n);
	started = true;
	return true;
}

bool pam_auth_start(PgSocket *c, const char *password)
{
	const char *user = c->login_user ? c->login_user->name : c->app_name_raw;
	if (!start_threads()) {
		disconnect_client(c, true, "PAM authentication failed");
		return false;
	}
	PamRequest *r = xcalloc(1, sizeof(*r));
	r->client = c;
	r->user = xstrdup(user);
	r->password = xstrdup(password);
	int port;
	socket_remote_text(c, r->rhost, sizeof(r->rhost), &port);
	c->pam_req = r;
	slog_debug(c, "PAM check queued");
	/* nothing is read from the client until the answer */
	sbuf_pause(&c->sb);
	pthread_mutex_lock(&lock);
	if (queue_tail)
		queue_tail->next = r;
	else
		queue_head = r;
	queue_tail = r;
	pthread_cond_signal(&wake);
	pthread_mutex_unlock(&lock);
	return true;
}

void pam_client_gone(PgSocket *c)
{
	PamRequest *r = c->pam_req;
	if (!r)
		return;
	c->pam_req = NULL;
	/* queued or running: a thread still owns it; its answer is dropped in finish() */
	r->client = NULL;
}

#endif
