/*
 * Pools of threads for login checks that block (PAM, LDAP). A thread takes
 * a job from its pool's queue, runs the kind's check, puts the job on the
 * done list and writes to the pool's eventfd; the loop reads it and
 * finishes the jobs in arrival order. Only the loop touches sockets and
 * logs; a job names its client through `client`, which only the loop reads
 * or clears.
 */
#include "autoconfig.h"

#include "worker/auth_threads.h"

#include <errno.h>
#include <event2/event.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/log.h"
#include "worker/worker.h"

void auth_job_attach(AuthJob *job, AuthPool *pool, PgSocket *c)
{
	job->pool = pool;
	job->client = c;
	job->submitted = false;
	c->auth_job = job;
}

bool auth_job_running(const PgSocket *c)
{
	return c->auth_job && c->auth_job->submitted;
}

/* Whether the lane's checks hold every thread they may; called with the lock held. */
static bool lane_full(const AuthPool *p, uint64_t lane)
{
	if (!lane || p->lane_cap <= 0)
		return false;
	int n = 0;
	for (int i = 0; i < AUTH_POOL_MAX_THREADS; i++)
		n += p->running[i] == lane;
	return n >= p->lane_cap;
}

/* The first queued job whose lane has room, taken off the queue and its lane marked; NULL: none. */
static AuthJob *take_job(AuthPool *p, int *slot)
{
	AuthJob *prev = NULL;
	for (AuthJob *job = p->queue_head; job; prev = job, job = job->next) {
		if (lane_full(p, job->lane))
			continue;
		if (prev)
			prev->next = job->next;
		else
			p->queue_head = job->next;
		if (p->queue_tail == job)
			p->queue_tail = prev;
		p->queued--;
		*slot = -1;
		for (int i = 0; job->lane && i < AUTH_POOL_MAX_THREADS; i++)
			if (!p->running[i]) {
				p->running[i] = job->lane;
				*slot = i;
				break;
			}
		return job;
	}
	return NULL;
}

static void *thread_main(void *arg)
{
	AuthPool *p = arg;
	for (;;) {
		pthread_mutex_lock(&p->lock);
		AuthJob *job;
		int slot;
		/* a job whose lane is full waits for one of that lane's checks to end: that thread takes it */
		while (!(job = take_job(p, &slot))) {
			p->idle++;
			pthread_cond_wait(&p->wake, &p->lock);
			p->idle--;
		}
		pthread_mutex_unlock(&p->lock);

		p->run(job);

		pthread_mutex_lock(&p->lock);
		if (slot >= 0)
			p->running[slot] = 0;
		job->next = p->done;
		p->done = job;
		pthread_mutex_unlock(&p->lock);
		uint64_t one = 1;
		while (write(p->done_fd, &one, sizeof(one)) < 0 && errno == EINTR)
			;
	}
	return NULL;
}

static void finish(AuthJob *job)
{
	PgSocket *c = job->client;
	if (c) {
		c->auth_job = NULL;
		job->client = NULL;
	} else {
		log_debug("%s: answer for a client that is gone, dropped", job->pool->name);
	}
	job->pool->finish(job, c);
}

static void on_done(evutil_socket_t fd, short what, void *arg)
{
	AuthPool *p = arg;
	(void)what;
	worker_clock_tick();
	uint64_t n;
	(void)!read(fd, &n, sizeof(n));
	pthread_mutex_lock(&p->lock);
	AuthJob *list = p->done;
	p->done = NULL;
	pthread_mutex_unlock(&p->lock);
	/* the done list is newest first: answer in arrival order */
	AuthJob *ordered = NULL;
	while (list) {
		AuthJob *next = list->next;
		list->next = ordered;
		ordered = list;
		list = next;
	}
	while (ordered) {
		AuthJob *next = ordered->next;
		finish(ordered);
		ordered = next;
	}
}

/* The eventfd is made at the pool's first job in this worker process. */
static bool start_pool(AuthPool *p)
{
	if (p->done_ev)
		return true;
	if (p->done_fd < 0)
		p->done_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (p->done_fd < 0) {
		log_error("%s: eventfd() failed: %s", p->name, strerror(errno));
		return false;
	}
	p->done_ev = event_new(wk.base, p->done_fd, EV_READ | EV_PERSIST, on_done, p);
	if (!p->done_ev || event_add(p->done_ev, NULL) != 0) {
		log_error("%s: cannot watch the answer eventfd", p->name);
		if (p->done_ev)
			event_free(p->done_ev);
		p->done_ev = NULL;
		return false;
	}
	return true;
}

/*
 * Another thread, when more jobs wait than threads do and there is room;
 * called with the lock held. A job whose lane is full needs none: a thread
 * of its lane takes it when its check ends.
 */
static void maybe_add_thread(AuthPool *p, const AuthJob *job)
{
	if (p->queued <= p->idle || p->threads >= p->max_threads || p->threads >= AUTH_POOL_MAX_THREADS ||
	    lane_full(p, job->lane))
		return;
	/* signals stay with the loop's thread: the threads start with all of them blocked */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	pthread_t t;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	int rc = pthread_create(&t, &attr, thread_main, p);
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		/* the job waits for a thread that exists, if any */
		log_warning("%s: pthread_create() failed: %s", p->name, strerror(rc));
		return;
	}
	p->threads++;
	log_debug("%s: thread %d of at most %d started", p->name, p->threads, p->max_threads);
}

bool auth_job_submit(PgSocket *c)
{
	AuthJob *job = c->auth_job;
	AuthPool *p = job->pool;
	if (!start_pool(p)) {
		auth_job_client_gone(c);
		return false;
	}
	job->submitted = true;
	job->next = NULL;
	/* nothing is read from the client until the answer */
	sbuf_pause(&c->sb);
	pthread_mutex_lock(&p->lock);
	if (p->queue_tail)
		p->queue_tail->next = job;
	else
		p->queue_head = job;
	p->queue_tail = job;
	p->queued++;
	maybe_add_thread(p, job);
	bool no_thread = p->threads == 0;
	if (no_thread) {
		p->queue_head = p->queue_tail = NULL;
		p->queued = 0;
	} else {
		pthread_cond_signal(&p->wake);
	}
	pthread_mutex_unlock(&p->lock);
	if (no_thread) {
		job->submitted = false;
		auth_job_client_gone(c);
		return false;
	}
	return true;
}

void auth_job_client_gone(PgSocket *c)
{
	AuthJob *job = c->auth_job;
	if (!job)
		return;
	c->auth_job = NULL;
	job->client = NULL;
	if (!job->submitted) {
		job->pool->finish(job, NULL);
		return;
	}
	/*
	 * Still queued: no thread runs a check for nobody (a flood of logins
	 * that send a password and leave would hold every PAM thread, and with
	 * pam_faillock count failures against real accounts). Running: a thread
	 * owns it, and its answer is dropped in finish(); the kind may cut the
	 * check short (an LDAP check on a hung directory would hold its thread
	 * until its deadline, and with every thread held, the logins of others).
	 */
	AuthPool *p = job->pool;
	bool unqueued = false;
	pthread_mutex_lock(&p->lock);
	for (AuthJob **at = &p->queue_head, *prev = NULL; *at; prev = *at, at = &(*at)->next) {
		if (*at != job)
			continue;
		*at = job->next;
		if (p->queue_tail == job)
			p->queue_tail = prev;
		p->queued--;
		unqueued = true;
		break;
	}
	pthread_mutex_unlock(&p->lock);
	if (unqueued)
		job->pool->finish(job, NULL);
	else if (job->pool->abandon)
		job->pool->abandon(job);
}
