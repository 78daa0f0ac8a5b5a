/*
 * The pool's pure decisions: launch, min_pool_size, release, idle close,
 * server_fast_close, idle order (include/worker/pool_policy.h). Nothing
 * here reads the clock, the configuration or a list: the callers pass the
 * numbers, so test/unit/test_pool_policy.c can try every case.
 */
#include "autoconfig.h"

#include "worker/pool_policy.h"

bool policy_login_retry_wait(bool login_failed, usec_t failed_at, usec_t now, usec_t login_retry)
{
	return login_failed && now - failed_at < login_retry;
}

/* Whether the reserve pool lends the full pool one more server: its first client waited long enough. */
static bool reserve_applies(const LaunchInput *in, const LaunchEntry *pool)
{
	return in->reserve > 0 && in->reserve_timeout > 0 && in->has_waiter &&
	       pool->servers < pool->limit + in->reserve && in->waited >= in->reserve_timeout;
}

/* Whether an entry is at its limit, with no idle server closed for this launch yet. */
static bool entry_full(const LaunchEntry *e)
{
	return e->limit > 0 && e->servers >= e->limit && !e->evicted;
}

LaunchVerdict policy_launch(const LaunchInput *in, LaunchRoom *room)
{
	const LaunchEntry *pool = &in->entry[LIMIT_POOL];
	*room = (LaunchRoom){.limit = pool->limit};
	if (policy_launch_still_full(in))
		return LAUNCH_FULL;
	if (in->login_in_flight || in->paused || in->retry_wait)
		return LAUNCH_NO;
	/* a server that passes its check is theirs: no new connection for them meanwhile */
	if (!in->for_replication && !in->welcome_login && !in->lookups && in->checking > 0 &&
	    in->waiting <= in->checking)
		return LAUNCH_CHECKING;
	if (entry_full(pool)) {
		/*
		 * A replication server is never shared, and a pool's first welcome
		 * here needs a login: an idle server of the pool gives way, the
		 * reserve is not used.
		 */
		if (in->for_replication || in->welcome_login)
			return LAUNCH_EVICT;
		if (!reserve_applies(in, pool))
			return LAUNCH_FULL;
		room->limit = pool->limit + in->reserve;
		room->reserve = true;
	}
	if (entry_full(&in->entry[LIMIT_DB]))
		return LAUNCH_DB_FULL;
	if (entry_full(&in->entry[LIMIT_USER]))
		return LAUNCH_USER_FULL;
	/* room another worker waits for goes to it when we have our share (no ping-pong after a give-back) */
	for (int k = 0; k < LIMIT_COUNT; k++) {
		const LaunchEntry *e = &in->entry[k];
		int limit = k == LIMIT_POOL ? room->limit : e->limit;
		int share = k == LIMIT_POOL && room->reserve ? in->reserve_share : e->share;
		if (limit > 0 && e->others_want && e->held >= share) {
			room->full = k;
			return LAUNCH_YIELD;
		}
	}
	return room->reserve ? LAUNCH_RESERVE : LAUNCH_OK;
}

int policy_min_target(int size, int min_pool_size)
{
	return size > 0 && min_pool_size > size ? size : min_pool_size;
}

bool policy_launch_min(const MinInput *in)
{
	return in->min > 0 && in->wanted && in->servers < in->min && !in->paused && !in->login_in_flight &&
	       !in->admin && !in->retry_wait;
}

IdleVerdict policy_idle(const IdleInput *in)
{
	if (in->close_needed)
		return IDLE_CLOSE_CONFIG;
	if (in->size > 0 && in->servers > in->size + in->reserve)
		return IDLE_CLOSE_OVERSIZE;
	if (in->idle_timeout > 0 && in->idle_for > in->idle_timeout && in->servers > in->min)
		return IDLE_CLOSE_TIMEOUT;
	if (policy_lifetime_over(in->lifetime, in->size, in->age, in->since_lifetime_close))
		return IDLE_CLOSE_LIFETIME;
	if (in->check_query && in->idle_for > in->check_delay)
		return IDLE_CHECK;
	return IDLE_KEEP;
}

bool policy_fast_close(bool fast_close, bool session_mode, bool close_needed, bool between_transactions)
{
	return close_needed && fast_close && session_mode && between_transactions;
}
