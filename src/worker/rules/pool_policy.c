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

LaunchVerdict policy_launch(const LaunchInput *in, int *limit)
{
	*limit = in->size;
	if (in->login_in_flight || in->paused || in->retry_wait)
		return LAUNCH_NO;
	if (in->size <= 0 || in->servers < in->size)
		return LAUNCH_OK;
	if (in->for_replication)
		return LAUNCH_EVICT;
	/* the reserve pool helps clients that waited long enough */
	if (in->reserve <= 0 || in->reserve_timeout <= 0 || !in->has_waiter || in->servers >= in->size + in->reserve ||
	    in->waited < in->reserve_timeout)
		return LAUNCH_FULL;
	*limit = in->size + in->reserve;
	return LAUNCH_RESERVE;
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
	if (in->size > 0 && in->servers > in->size)
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
