/*
 * Login checks that block (PAM, LDAP) run in a few threads of the worker,
 * never in its event loop: a check is a job that a thread runs and the loop
 * finishes, the answer coming back through an eventfd. Each kind of check
 * has a pool of its own, so that one kind's slow checks never hold up the
 * other's. See doc/architecture.md, "Inside a worker".
 */
#ifndef PGB_WORKER_AUTH_THREADS_H
#define PGB_WORKER_AUTH_THREADS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "worker/objects.h"

typedef struct AuthPool AuthPool;

/*
 * One check. The kind's own request embeds it as its first member. Until it
 * is submitted it belongs to the loop; from then until `finish` the thread
 * reads it, and the loop touches only `client`.
 */
struct AuthJob {
	AuthJob *next;     /* the pool's queue or done list */
	AuthPool *pool;    /* the kind of check */
	PgSocket *client;  /* loop only: NULL once the client is gone */
	bool submitted;    /* loop only: given to the threads */
	bool own_deadline; /* loop only: the kind ends the login at its own deadline, not the janitor */
	uint64_t lane;     /* what the check waits on (an LDAP directory), 0: none; set before submitting */
};

/* the most threads a pool may have, and so the most checks running at once */
#define AUTH_POOL_MAX_THREADS 32

struct AuthPool {
	const char *name; /* "PAM", "LDAP": in log lines and close reasons */
	int max_threads;  /* started one by one, when a job finds no idle thread; <= AUTH_POOL_MAX_THREADS */
	/*
	 * The most threads the checks of one lane may hold at once (0: no
	 * bound): a directory that hangs holds its threads until the checks'
	 * deadlines, and the checks of another lane must still find one.
	 */
	int lane_cap;
	/* in a thread: the blocking check; no logging, no worker state */
	void (*run)(AuthJob *job);
	/* in the loop: the answer; c is NULL when the client left first. Frees the job. */
	void (*finish)(AuthJob *job, PgSocket *c);
	/* in the loop, optional: a thread runs the job of a client that left; cut the check short */
	void (*abandon)(AuthJob *job);

	/* the pool's own state */
	pthread_mutex_t lock;
	pthread_cond_t wake;
	AuthJob *queue_head, *queue_tail;        /* waiting for a thread */
	int queued;                              /* jobs in that queue */
	AuthJob *done;                           /* answered, newest first, for the loop */
	int threads;                             /* started */
	int idle;                                /* waiting for a job */
	uint64_t running[AUTH_POOL_MAX_THREADS]; /* the lanes of the checks running, 0 in a free slot */
	int done_fd;                             /* eventfd: a thread answered */
	struct event *done_ev;
};

#define AUTH_POOL_INIT(NAME, MAX, LANE_CAP, RUN, FINISH, ABANDON)                                                      \
	{                                                                                                              \
		.name = (NAME), .max_threads = (MAX), .lane_cap = (LANE_CAP), .run = (RUN), .finish = (FINISH),        \
		.abandon = (ABANDON), .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER,             \
		.done_fd = -1                                                                                          \
	}

/* Attach a prepared (not yet submitted) job to its client: the client's check until it is submitted. */
void auth_job_attach(AuthJob *job, AuthPool *pool, PgSocket *c);

/*
 * Give the client's attached job to the pool's threads; the client stops
 * being read until the answer. False when no thread can be started: the
 * job is then finished at once as for a client that left (freed), and the
 * caller closes the client.
 */
bool auth_job_submit(PgSocket *c) __attribute__((warn_unused_result));

/*
 * Forget the client's check (it is being closed, or its check ended in the
 * loop): a job not yet submitted is finished and freed now, a queued one
 * is taken off the queue and freed, a running one is abandoned (the pool's
 * abandon, if any) and its answer dropped when it comes.
 */
void auth_job_client_gone(PgSocket *c);

/* Whether the client's check is with the threads (it is not read meanwhile). */
bool auth_job_running(const PgSocket *c);

#endif
