/*
 * The pool's decisions as pure functions of plain numbers: whether a
 * server may be launched (pool_size, reserve_pool_size/_timeout,
 * server_login_retry, a login in flight, PAUSE, max_db_connections,
 * max_user_connections, other workers waiting), whether min_pool_size
 * wants one more, what becomes of a server a client releases and of an
 * idle server at the janitor's tick (close_needed, pause, give-back,
 * server_lifetime, pool oversize, server_idle_timeout, the check query),
 * server_fast_close, and which end of the idle list a server goes to.
 * pool.c and janitor.c gather the inputs and carry the verdict out; the
 * launch decision includes the limits counted across workers
 * (max_db_connections, max_user_connections, the fair shares of
 * common/budget.c), whose numbers pool.c reads from the global budget.
 * Unit tests: test/unit/test_pool_policy.c.
 * What runs at every release or state change is inline here (a call cost
 * some 60 instructions per transaction under callgrind); the rest is in
 * pool_policy.c.
 */
#ifndef PGB_WORKER_POOL_POLICY_H
#define PGB_WORKER_POOL_POLICY_H

#include <stdbool.h>

#include "common/config.h"

/* Within server_login_retry of the pool's last failed login (no new login is tried meanwhile). */
bool policy_login_retry_wait(bool login_failed, usec_t failed_at, usec_t now, usec_t login_retry);

/*
 * A limit counted across workers, as the launch decision sees it: the
 * pool's (pool_size), the database's (max_db_connections) or the user's
 * (max_user_connections), in LaunchInput.entry[] in that order.
 */
enum { LIMIT_POOL, LIMIT_DB, LIMIT_USER, LIMIT_COUNT };

typedef struct LaunchEntry {
	int limit;        /* the setting; 0 = unlimited */
	int servers;      /* its servers in all workers (and in the old tree of an online restart) */
	bool others_want; /* another worker's clients wait for room in it */
	int held;         /* this worker's servers of it (read when others_want) */
	int share;        /* this worker's fair share of the limit, budget_fair_share() (read when others_want) */
	bool evicted;     /* an idle server closed already to make room here for this launch */
} LaunchEntry;

/* Everything the launch decision reads, gathered once by launch_inputs() in pool.c (the pool's entry first). */
typedef struct LaunchInput {
	LaunchEntry entry[LIMIT_COUNT]; /* pool, database, user */
	bool pool_waits;                /* our clients wait for room in the pool already (its budget want bit) */
	int reserve;                    /* reserve_pool_size; 0 = none */
	usec_t reserve_timeout;         /* reserve_pool_timeout; 0 = the reserve is never used */
	int reserve_share;              /* the pool's fair share of pool_size + reserve (read when others_want) */
	bool login_in_flight;           /* one login at a time per pool */
	bool paused;                    /* PAUSE, the database paused, or the safe shutdown */
	bool retry_wait;                /* policy_login_retry_wait() */
	bool for_replication;           /* the server is for a replication client (never shared) */
	/*
	 * A login waits for the pool's first welcome on this worker, and the
	 * pool's idle servers here came from another worker or tree with their
	 * sessions (none logged in here, so none can give a welcome): only a
	 * new server's login can, and an idle one gives way to it.
	 */
	bool welcome_login;
	bool has_waiter; /* a client waits (its wait time is `waited`) */
	usec_t waited;   /* how long the first waiting client has waited */
	bool lookups;    /* auth_query lookups wait for a server */
	int waiting;     /* clients waiting for a server (CL_WAITING) */
	int checking;    /* servers running server_check_query for them */
} LaunchInput;

typedef enum LaunchVerdict {
	LAUNCH_NO,       /* not now: a login in flight, paused, or within server_login_retry */
	LAUNCH_CHECKING, /* the servers being checked are enough for the waiting clients */
	LAUNCH_FULL,     /* the pool is full (reserve included): wait for room */
	LAUNCH_EVICT,   /* full, for a replication client or a welcome_login: an idle server of the pool closes first */
	LAUNCH_DB_FULL, /* max_db_connections reached: an idle server of the database closes, else wait */
	LAUNCH_USER_FULL, /* max_user_connections reached: an idle server of the user closes, else wait */
	LAUNCH_YIELD,     /* another worker waits for this room and this worker has its share: leave it */
	LAUNCH_OK,        /* within pool_size (limit = size) */
	LAUNCH_RESERVE, /* from the reserve pool: the first client waited reserve_pool_timeout (limit = size + reserve) */
} LaunchVerdict;

/* What the verdict allows, and where it stopped. */
typedef struct LaunchRoom {
	int limit;    /* the pool's count the launch must stay below (0 = unlimited) */
	bool reserve; /* past pool_size with the reserve pool (RESERVE, or a refusal after the pool's check) */
	int full;     /* LAUNCH_YIELD: the entry (LIMIT_*) another worker waits for */
} LaunchRoom;

/*
 * LAUNCH_FULL again, whatever the other inputs say: our clients wait for
 * room in the pool already, it is still full, no reserve pool can open
 * with time, and the server is not for a replication client. Every other
 * verdict there would refuse too, with no action that the wait has not
 * taken already. It reads only the pool's own numbers (pool_waits,
 * for_replication, reserve, entry[LIMIT_POOL].limit and .servers): under
 * load it is the answer at every release, and launch_inputs() in pool.c
 * reads nothing more then. Inline for that reason.
 */
static inline bool policy_launch_still_full(const LaunchInput *in)
{
	const LaunchEntry *pool = &in->entry[LIMIT_POOL];
	return in->pool_waits && !in->for_replication && !in->welcome_login && in->reserve <= 0 && pool->limit > 0 &&
	       pool->servers >= pool->limit;
}

/*
 * The verdict, in this order: still full (policy_launch_still_full()); not
 * now; checks serve the waiters; the pool (size, reserve, eviction for
 * replication); max_db_connections; max_user_connections; the fair shares
 * of the pool, database and user. An entry with `evicted` set counts as
 * having room (the budget units taken at the launch decide).
 */
LaunchVerdict policy_launch(const LaunchInput *in, LaunchRoom *room);

/* min_pool_size as applied: never above a limited pool_size. */
int policy_min_target(int size, int min_pool_size);

/* What min_pool_size looks at (the janitor, one launch per tick). */
typedef struct MinInput {
	int min;              /* policy_min_target() */
	int servers;          /* the pool's servers in all workers */
	bool wanted;          /* the pool has clients, or is a running forced-user pool */
	bool paused;          /* PAUSE or the database paused */
	bool login_in_flight; /* one login at a time per pool */
	bool admin;           /* the console's pool has no servers */
	bool retry_wait;      /* policy_login_retry_wait() */
} MinInput;

/* Whether min_pool_size launches one more server now. */
bool policy_launch_min(const MinInput *in);

/*
 * server_lifetime: a server at least `lifetime` old closes, but lifetime
 * closes of a pool are spread out, at most one per lifetime / pool_size
 * (`since_last` = time since the pool's previous one), so that a pool
 * filled at once does not reconnect at once. An unlimited pool (size 0)
 * has no such spacing, as in PgBouncer: one close per lifetime would keep
 * a pool of n servers for n lifetimes. lifetime 0 = no limit.
 */
static inline bool policy_lifetime_over(usec_t lifetime, int size, usec_t age, usec_t since_last)
{
	return lifetime > 0 && age >= lifetime && (size <= 0 || since_last >= lifetime / size);
}

/* A server its client released (pool_server_ready()). */
typedef struct ReleaseInput {
	bool cancels_pending; /* a cancel of its last client is on its way */
	bool close_needed;    /* its database entry changed */
	bool paused;          /* PAUSE, the database paused, or the safe shutdown */
	bool yield;           /* another worker's clients wait and this worker has more than its share */
	usec_t lifetime;      /* server_lifetime; 0 = no limit */
	int size;             /* pool_size */
	usec_t age;           /* since it connected */
	usec_t since_lifetime_close;
	bool check_query;   /* server_check_query is set */
	usec_t check_delay; /* server_check_delay */
	bool lent;          /* a client used it */
} ReleaseInput;

typedef enum ReleaseVerdict {
	RELEASE_HOLD,           /* kept aside until the cancel arrives (SV_BEING_CANCELED) */
	RELEASE_CLOSE_CONFIG,   /* "database configuration changed" */
	RELEASE_CLOSE_PAUSE,    /* "pause mode" */
	RELEASE_YIELD,          /* "given back to another worker" */
	RELEASE_CLOSE_LIFETIME, /* "server lifetime over" */
	RELEASE_USED,           /* free, but checked before the next client (SV_USED) */
	RELEASE_IDLE,           /* free for the next client */
} ReleaseVerdict;

/* The verdict, in this order: cancel, close_needed, pause, give-back, lifetime, check. */
static inline ReleaseVerdict policy_release(const ReleaseInput *in)
{
	if (in->cancels_pending)
		return RELEASE_HOLD;
	/* close_needed and lifetime are honoured when a server becomes free */
	if (in->close_needed)
		return RELEASE_CLOSE_CONFIG;
	if (in->paused)
		return RELEASE_CLOSE_PAUSE;
	if (in->yield)
		return RELEASE_YIELD;
	if (policy_lifetime_over(in->lifetime, in->size, in->age, in->since_lifetime_close))
		return RELEASE_CLOSE_LIFETIME;
	/* server_check_delay = 0: whoever used it, the next user gets it only after a check (the janitor does the others) */
	if (in->check_query && in->check_delay == 0 && in->lent)
		return RELEASE_USED;
	return RELEASE_IDLE;
}

/* An idle server at the janitor's tick. */
typedef struct IdleInput {
	bool close_needed;   /* its database entry changed */
	int size;            /* pool_size; 0 = unlimited */
	int reserve;         /* reserve_pool_size: its servers may stay, as idle ones, until server_idle_timeout */
	int min;             /* policy_min_target() */
	int servers;         /* the pool's servers in all workers */
	usec_t idle_timeout; /* server_idle_timeout; 0 = off */
	usec_t idle_for;     /* since its last use */
	usec_t lifetime;     /* server_lifetime; 0 = no limit */
	usec_t age;          /* since it connected */
	usec_t since_lifetime_close;
	bool check_query;   /* server_check_query is set */
	usec_t check_delay; /* server_check_delay */
} IdleInput;

typedef enum IdleVerdict {
	IDLE_KEEP,           /* stays idle */
	IDLE_CLOSE_CONFIG,   /* "database configuration changed" */
	IDLE_CLOSE_OVERSIZE, /* "too many servers in the pool" (above pool_size + reserve: lowered, other workers') */
	IDLE_CLOSE_TIMEOUT,  /* "server idle timeout" (never below min_pool_size) */
	IDLE_CLOSE_LIFETIME, /* "server lifetime over" */
	IDLE_CHECK,          /* checked before its next client (SV_USED) */
} IdleVerdict;

IdleVerdict policy_idle(const IdleInput *in);

/*
 * server_fast_close: in session mode a server whose database entry
 * changed closes between transactions, its client with it, instead of
 * at the end of the session.
 */
bool policy_fast_close(bool fast_close, bool session_mode, bool close_needed, bool between_transactions);

/*
 * Which idle server the next client gets: the list is taken from its head,
 * so a server put at the head is reused first (LIFO, the default, keeps
 * few servers busy and lets the others reach server_idle_timeout);
 * server_round_robin, and a server about to close, go to the tail.
 */
static inline bool policy_idle_at_head(bool round_robin, bool close_needed)
{
	return !round_robin && !close_needed;
}

#endif
