/* Pools: giving servers to clients, launching and closing servers, limits counted across workers. */
#ifndef PGB_WORKER_POOL_H
#define PGB_WORKER_POOL_H

#include "worker/objects.h"
#include "worker/pool_settings.h"
#include "worker/worker.h"

/*
 * The pool's pool_mode, pool_size, reserve_pool_size (user, database,
 * global: include/worker/pool_settings.h) and server limits, asked several
 * times per transaction, so inline and cached until the config changes.
 */
static inline const PgPool *pool_settings(const PgPool *pool)
{
	if (__builtin_expect(pool->settings_gen != wk.cf_gen + 1, 0))
		pool_settings_refresh((PgPool *)pool);
	return pool;
}
static inline int pool_effective_mode(const PgPool *pool)
{
	return pool_settings(pool)->mode;
}
/* 0 = unlimited */
static inline int pool_effective_size(const PgPool *pool)
{
	return pool_settings(pool)->size;
}
static inline int pool_reserve_size(const PgPool *pool)
{
	return pool_settings(pool)->reserve;
}

/* Link a server to the client (true), or queue it and maybe launch one (false). */
bool pool_find_server(PgSocket *client);
/* Within server_login_retry of the pool's last failed login (policy_login_retry_wait()). */
bool pool_retry_wait(const PgPool *pool);
/* Within server_login_retry of a failed login of the pool, with no server to use (not while paused). */
bool pool_login_failing(const PgPool *pool);
/* If pool_login_failing(): close `client` with the cached error and return true. */
bool pool_fast_fail(PgSocket *client, const PgPool *pool);
/* A free server: close it (lifetime, pause, give-back) or make it idle and serve waiters. */
void pool_server_ready(PgSocket *server);
/* Welcome clients waiting for the first login; give idle servers to queued clients. */
void pool_wake_waiters(PgPool *pool);
void pool_drop_gone_waiters(PgPool *pool); /* close waiting clients that hung up (janitor) */
/* Whether the peer of a client that is not being read has closed its end (poll POLLRDHUP). */
bool client_hung_up(const PgSocket *c);
void pool_login_failed(PgPool *pool, const char *sqlstate, const char *msg, bool from_server);
/* Connect a new server if a client (or lookup) waits and the limits allow. */
void pool_maybe_launch(PgPool *pool);
PgSocket *pool_take_idle(PgPool *pool);        /* for internal work; a used server is checked first (NULL meanwhile) */
void pool_replication_ready(PgSocket *server); /* its login is done: link it to its client, welcome the client */
int pool_global_servers(PgPool *pool);         /* servers of the pool in all workers (per worker if no budget) */
void pool_launch_min(PgPool *pool, int min);   /* min_pool_size: one more server while all workers have < min */
void pool_budget_tick(void);                   /* ~10/s: give idle servers to waiting workers, retry waiters */
/* A logging-in client's unit of its database's and login user's client count; NULL, or the limit that is full. */
const char *pool_take_client_budget(PgSocket *c, int max_db, int max_user);
/*
 * A logged-in client moving to worker `to` of this tree takes its units
 * along (its client connection, its database's and user's client counts),
 * so that no login takes its place on the way (doc/workers.md, "Limits span
 * all workers"). moved[k]: the entry now held by `to` for it, or -1. False
 * without a global budget: nothing moved. Undone by pool_unmove_client_budget().
 */
bool pool_move_client_budget(PgSocket *c, int to, int moved[2]);
void pool_unmove_client_budget(PgSocket *c, int to, const int moved[2]);
/* The receiver: c is counted with the units moved here for it (moved NULL: none came, it takes its own). */
void pool_adopt_client_budget(PgSocket *c, const int *moved);
/* The receiver could not take the client: give back what was moved here for it. */
void pool_drop_moved_client_budget(const int moved[2]);

/*
 * The same for the server connection an idle session-mode client takes
 * along (doc/workers.md, "Session-mode clients move too"): its units of the
 * pool's, database's and user's server counts go to worker `to` without
 * the totals changing, so that the limits hold at every instant.
 */
bool pool_move_server_budget(PgSocket *s, int to, int moved[3]);
void pool_unmove_server_budget(PgSocket *s, int to, const int moved[3]);
/* The receiver: s (in its pool) is counted with the units moved here for it (moved NULL: it takes its own). */
void pool_adopt_server_budget(PgSocket *s, const int *moved);
void pool_drop_moved_server_budget(const int moved[3]);
void pool_budget_forget(PgPool *pool); /* the pool is freed: it waits for room nowhere any more */

#endif
