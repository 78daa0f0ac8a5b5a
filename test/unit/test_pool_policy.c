/*
 * Unit tests for the pool's pure decisions (worker/pool_policy.c): when a
 * server may be launched (pool_size, the reserve pool, server_login_retry,
 * one login at a time, servers being checked, max_db_connections,
 * max_user_connections, other workers' fair shares), min_pool_size, what happens to a released and to an
 * idle server (lifetime, idle timeout, oversize, checks), server_fast_close
 * and the order idle servers are given in.
 */
#include "autoconfig.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "worker/pool_policy.h"

#define SEC(n) ((usec_t)(n)*USEC_PER_SEC)

/* ---- server_login_retry ---- */

static void test_login_retry_wait(void **state)
{
	(void)state;
	assert_false(policy_login_retry_wait(false, SEC(100), SEC(101), SEC(15))); /* no failure */
	assert_true(policy_login_retry_wait(true, SEC(100), SEC(100), SEC(15)));
	assert_true(policy_login_retry_wait(true, SEC(100), SEC(115) - 1, SEC(15)));
	assert_false(policy_login_retry_wait(true, SEC(100), SEC(115), SEC(15))); /* retry time reached */
	assert_false(policy_login_retry_wait(true, SEC(100), SEC(100), 0));       /* server_login_retry = 0 */
}

/* ---- launching ---- */

/* A pool of 2 with a reserve of 1 after 5 s, one client waiting for 1 s; no database or user limit. */
static LaunchInput pool_of_two(int servers)
{
	LaunchInput in = {.reserve = 1, .reserve_timeout = SEC(5), .has_waiter = true, .waited = SEC(1)};
	in.entry[LIMIT_POOL] = (LaunchEntry){.limit = 2, .servers = servers};
	return in;
}

static void test_launch_within_size(void **state)
{
	(void)state;
	LaunchRoom room = {.limit = -1};
	LaunchInput in = pool_of_two(0);
	assert_int_equal(policy_launch(&in, &room), LAUNCH_OK);
	assert_int_equal(room.limit, 2);
	assert_false(room.reserve);
	in.entry[LIMIT_POOL].servers = 1;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_OK);
	/* pool_size = 0: unlimited */
	in = pool_of_two(1000);
	in.entry[LIMIT_POOL].limit = 0;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_OK);
	assert_int_equal(room.limit, 0);
}

static void test_launch_not_now(void **state)
{
	(void)state;
	LaunchRoom room;
	LaunchInput in = pool_of_two(0);
	in.login_in_flight = true; /* one login at a time per pool */
	assert_int_equal(policy_launch(&in, &room), LAUNCH_NO);
	in = pool_of_two(0);
	in.paused = true;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_NO);
	in = pool_of_two(0);
	in.retry_wait = true; /* within server_login_retry */
	assert_int_equal(policy_launch(&in, &room), LAUNCH_NO);
	/* even for a replication client, and even with room in the reserve */
	in.for_replication = true;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_NO);
}

static void test_launch_full_and_reserve(void **state)
{
	(void)state;
	LaunchRoom room;
	LaunchInput in = pool_of_two(2);
	/* full: the first client has waited 1 s of the 5 */
	assert_int_equal(policy_launch(&in, &room), LAUNCH_FULL);
	in.waited = SEC(5) - 1;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_FULL);
	/* reserve_pool_timeout reached: one more, up to size + reserve */
	in.waited = SEC(5);
	assert_int_equal(policy_launch(&in, &room), LAUNCH_RESERVE);
	assert_int_equal(room.limit, 3);
	assert_true(room.reserve);
	in.entry[LIMIT_POOL].servers = 3;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_FULL);
	/* no reserve, reserve_pool_timeout = 0, or nobody waiting: full */
	in = pool_of_two(2);
	in.waited = SEC(60);
	in.reserve = 0;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_FULL);
	in.reserve = 1;
	in.reserve_timeout = 0;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_FULL);
	in.reserve_timeout = SEC(5);
	in.has_waiter = false;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_FULL);
	/* more servers than the size (pool_size lowered by a reload): still full */
	in = pool_of_two(5);
	in.waited = SEC(60);
	assert_int_equal(policy_launch(&in, &room), LAUNCH_FULL);
}

static void test_launch_for_replication(void **state)
{
	(void)state;
	LaunchRoom room;
	LaunchInput in = pool_of_two(2);
	in.for_replication = true;
	/* a replication server is never shared: a full pool closes an idle one, the reserve is not used */
	assert_int_equal(policy_launch(&in, &room), LAUNCH_EVICT);
	in.waited = SEC(60);
	assert_int_equal(policy_launch(&in, &room), LAUNCH_EVICT);
	/* one closed and the pool still counts as full (another worker's launch): the budget take decides */
	in.entry[LIMIT_POOL].evicted = true;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_OK);
	assert_int_equal(room.limit, 2);
	assert_false(room.reserve);
	in = pool_of_two(1);
	in.for_replication = true;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_OK);
}

/*
 * A login waits for the pool's first welcome on this worker, whose servers all
 * came with moved sessions: a full pool closes an idle one for a new login,
 * without the reserve; with room it simply launches.
 */
static void test_launch_for_a_first_welcome(void **state)
{
	(void)state;
	LaunchRoom room;
	LaunchInput in = pool_of_two(2);
	in.welcome_login = true;
	in.pool_waits = true; /* the still-full shortcut does not hold it back */
	in.reserve = 0;
	assert_false(policy_launch_still_full(&in));
	assert_int_equal(policy_launch(&in, &room), LAUNCH_EVICT);
	in.entry[LIMIT_POOL].evicted = true;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_OK);
	/* checks running for waiting clients do not give a welcome either */
	in = pool_of_two(1);
	in.welcome_login = true;
	in.waiting = 1;
	in.checking = 1;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_OK);
	in.welcome_login = false;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_CHECKING);
}

/* Under load the answer at every release: whatever else holds, the wait goes on (no action but the wait's). */
static void test_launch_still_full(void **state)
{
	(void)state;
	LaunchRoom room;
	LaunchInput in = pool_of_two(2);
	in.reserve = 0;
	in.pool_waits = true;
	assert_true(policy_launch_still_full(&in));
	in.paused = true; /* a refusal anyway: the want bit the wait has set stays */
	in.login_in_flight = true;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_FULL);
	assert_int_equal(room.limit, 2);
	/* not before the pool waits, nor with room, a reserve, unlimited, or for a replication client */
	static const size_t offsets[] = {offsetof(LaunchInput, pool_waits), offsetof(LaunchInput, for_replication),
	                                 offsetof(LaunchInput, welcome_login)};
	for (size_t k = 0; k < sizeof(offsets) / sizeof(offsets[0]); k++) {
		LaunchInput b = in;
		*(bool *)((char *)&b + offsets[k]) = !*(bool *)((char *)&b + offsets[k]);
		assert_false(policy_launch_still_full(&b));
		assert_int_equal(policy_launch(&b, &room), LAUNCH_NO); /* paused: the rest of the rules decide */
	}
	LaunchInput b = in;
	b.entry[LIMIT_POOL].servers = 1;
	assert_false(policy_launch_still_full(&b));
	b = in;
	b.reserve = 1;
	assert_false(policy_launch_still_full(&b));
	b = in;
	b.entry[LIMIT_POOL].limit = 0;
	assert_false(policy_launch_still_full(&b));
}

static void test_launch_checking(void **state)
{
	(void)state;
	LaunchRoom room;
	LaunchInput in = pool_of_two(0);
	/* two servers run server_check_query for the two waiting clients: no new connection for them */
	in.waiting = 2;
	in.checking = 2;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_CHECKING);
	in.waiting = 3; /* one more than the checks serve */
	assert_int_equal(policy_launch(&in, &room), LAUNCH_OK);
	in.waiting = 1;
	in.checking = 0;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_OK);
	/* auth_query lookups, or a replication client, need a server of their own */
	in.checking = 2;
	in.lookups = true;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_OK);
	in.lookups = false;
	in.for_replication = true;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_OK);
}

static void test_launch_db_and_user_full(void **state)
{
	(void)state;
	LaunchRoom room;
	LaunchInput in = pool_of_two(1);
	in.entry[LIMIT_DB] = (LaunchEntry){.limit = 5, .servers = 4};
	in.entry[LIMIT_USER] = (LaunchEntry){.limit = 3, .servers = 2};
	assert_int_equal(policy_launch(&in, &room), LAUNCH_OK);
	/* max_db_connections reached in all workers (other pools of the database count) */
	in.entry[LIMIT_DB].servers = 5;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_DB_FULL);
	/* an idle server of the database closed for this launch: room, as far as the decision goes */
	in.entry[LIMIT_DB].evicted = true;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_OK);
	/* max_user_connections, after the database's */
	in.entry[LIMIT_DB].evicted = false;
	in.entry[LIMIT_USER].servers = 3;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_DB_FULL);
	in.entry[LIMIT_DB].servers = 4;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_USER_FULL);
	in.entry[LIMIT_USER].evicted = true;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_OK);
	/* 0 = unlimited, whatever the count */
	in = pool_of_two(1);
	in.entry[LIMIT_DB] = (LaunchEntry){.limit = 0, .servers = 100};
	in.entry[LIMIT_USER] = (LaunchEntry){.limit = 0, .servers = 100};
	assert_int_equal(policy_launch(&in, &room), LAUNCH_OK);
	/* a full pool is the first refusal; not now comes before all */
	in = pool_of_two(2);
	in.entry[LIMIT_DB] = (LaunchEntry){.limit = 1, .servers = 1};
	assert_int_equal(policy_launch(&in, &room), LAUNCH_FULL);
	in.paused = true;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_NO);
	/* the reserve passed the pool's check: the refusal after it says so (the pool's want stays) */
	in = pool_of_two(2);
	in.waited = SEC(5);
	in.entry[LIMIT_DB] = (LaunchEntry){.limit = 2, .servers = 2};
	assert_int_equal(policy_launch(&in, &room), LAUNCH_DB_FULL);
	assert_true(room.reserve);
	assert_int_equal(room.limit, 3);
}

static void test_launch_yield(void **state)
{
	(void)state;
	LaunchRoom room;
	LaunchInput in = pool_of_two(1);
	in.entry[LIMIT_DB] = (LaunchEntry){.limit = 10, .servers = 8};
	/* another worker waits for the database's room and we hold our share of it: leave it */
	in.entry[LIMIT_DB].others_want = true;
	in.entry[LIMIT_DB].held = 5;
	in.entry[LIMIT_DB].share = 5;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_YIELD);
	assert_int_equal(room.full, LIMIT_DB);
	in.entry[LIMIT_DB].held = 4; /* below our share: ours to take */
	assert_int_equal(policy_launch(&in, &room), LAUNCH_OK);
	in.entry[LIMIT_DB].held = 5;
	in.entry[LIMIT_DB].others_want = false; /* nobody else waits */
	assert_int_equal(policy_launch(&in, &room), LAUNCH_OK);
	/* the pool first, then the database, then the user */
	in = pool_of_two(1);
	for (int k = LIMIT_COUNT; k-- > 0;) {
		in.entry[k].limit = in.entry[k].limit ? in.entry[k].limit : 10;
		in.entry[k].others_want = true;
		in.entry[k].held = 1;
		in.entry[k].share = 1;
		assert_int_equal(policy_launch(&in, &room), LAUNCH_YIELD);
		assert_int_equal(room.full, k);
	}
	/* no limit, no share to keep */
	in = pool_of_two(1);
	in.entry[LIMIT_USER] = (LaunchEntry){.limit = 0, .others_want = true, .held = 3, .share = 0};
	assert_int_equal(policy_launch(&in, &room), LAUNCH_OK);
	/* from the reserve, the pool's share is the one of size + reserve */
	in = pool_of_two(2);
	in.waited = SEC(5);
	in.entry[LIMIT_POOL].others_want = true;
	in.entry[LIMIT_POOL].held = 1;
	in.entry[LIMIT_POOL].share = 1;
	in.reserve_share = 2;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_RESERVE);
	in.reserve_share = 1;
	assert_int_equal(policy_launch(&in, &room), LAUNCH_YIELD);
	assert_int_equal(room.full, LIMIT_POOL);
	assert_true(room.reserve);
}

/* ---- min_pool_size ---- */

static void test_min_pool_size(void **state)
{
	(void)state;
	assert_int_equal(policy_min_target(20, 5), 5);
	assert_int_equal(policy_min_target(3, 5), 3); /* never above a limited pool_size */
	assert_int_equal(policy_min_target(0, 5), 5); /* pool_size 0 = unlimited */
	assert_int_equal(policy_min_target(3, 0), 0);

	MinInput in = {.min = 2, .servers = 1, .wanted = true};
	assert_true(policy_launch_min(&in));
	in.servers = 2;
	assert_false(policy_launch_min(&in)); /* reached */
	in.servers = 1;
	static const size_t offsets[] = {offsetof(MinInput, paused), offsetof(MinInput, login_in_flight),
	                                 offsetof(MinInput, admin), offsetof(MinInput, retry_wait)};
	for (size_t k = 0; k < sizeof(offsets) / sizeof(offsets[0]); k++) {
		MinInput b = in;
		*(bool *)((char *)&b + offsets[k]) = true;
		assert_false(policy_launch_min(&b));
	}
	in.wanted = false; /* no clients and no forced user */
	assert_false(policy_launch_min(&in));
	in = (MinInput){.min = 0, .servers = 0, .wanted = true};
	assert_false(policy_launch_min(&in));
}

/* ---- server_lifetime ---- */

static void test_lifetime(void **state)
{
	(void)state;
	/* 0 = no limit */
	assert_false(policy_lifetime_over(0, 4, SEC(100000), SEC(100000)));
	/* old enough, and no lifetime close in the pool for lifetime / size */
	assert_true(policy_lifetime_over(SEC(60), 4, SEC(60), SEC(15)));
	assert_false(policy_lifetime_over(SEC(60), 4, SEC(60) - 1, SEC(15)));
	assert_false(policy_lifetime_over(SEC(60), 4, SEC(600), SEC(15) - 1)); /* spread out */
	/* pool_size 0 (unlimited): no spacing, every old server closes */
	assert_true(policy_lifetime_over(SEC(60), 0, SEC(600), 0));
	assert_false(policy_lifetime_over(SEC(60), 0, SEC(60) - 1, 0));
}

/* ---- a released server ---- */

static ReleaseInput released(void)
{
	return (ReleaseInput){.lifetime = SEC(3600),
	                      .size = 20,
	                      .age = SEC(10),
	                      .since_lifetime_close = SEC(10000),
	                      .check_query = true,
	                      .check_delay = SEC(30),
	                      .lent = true};
}

static void test_release(void **state)
{
	(void)state;
	ReleaseInput in = released();
	assert_int_equal(policy_release(&in), RELEASE_IDLE);
	/* each reason alone, then the order when several hold: cancel, config, pause, give-back, lifetime */
	in.age = SEC(3600);
	assert_int_equal(policy_release(&in), RELEASE_CLOSE_LIFETIME);
	in.yield = true;
	assert_int_equal(policy_release(&in), RELEASE_YIELD);
	in.paused = true;
	assert_int_equal(policy_release(&in), RELEASE_CLOSE_PAUSE);
	in.close_needed = true;
	assert_int_equal(policy_release(&in), RELEASE_CLOSE_CONFIG);
	in.cancels_pending = true;
	assert_int_equal(policy_release(&in), RELEASE_HOLD);
	/* lifetime closes spread out */
	in = released();
	in.age = SEC(3600);
	in.since_lifetime_close = SEC(3600) / 20 - 1;
	assert_int_equal(policy_release(&in), RELEASE_IDLE);
}

static void test_release_check(void **state)
{
	(void)state;
	/* server_check_delay = 0: a server a client used is checked before the next one */
	ReleaseInput in = released();
	in.check_delay = 0;
	assert_int_equal(policy_release(&in), RELEASE_USED);
	in.lent = false; /* internal work (auth_query) and checks themselves */
	assert_int_equal(policy_release(&in), RELEASE_IDLE);
	in.lent = true;
	in.check_query = false; /* server_check_query empty: no checks */
	assert_int_equal(policy_release(&in), RELEASE_IDLE);
	/* a delay above 0 is the janitor's */
	in = released();
	assert_int_equal(policy_release(&in), RELEASE_IDLE);
}

/* ---- an idle server at the janitor's tick ---- */

static IdleInput idle(void)
{
	return (IdleInput){.size = 4,
	                   .min = 1,
	                   .servers = 3,
	                   .idle_timeout = SEC(600),
	                   .idle_for = SEC(1),
	                   .lifetime = SEC(3600),
	                   .age = SEC(100),
	                   .since_lifetime_close = SEC(10000),
	                   .check_query = true,
	                   .check_delay = SEC(30)};
}

static void test_idle(void **state)
{
	(void)state;
	IdleInput in = idle();
	assert_int_equal(policy_idle(&in), IDLE_KEEP);
	/* server_check_delay passed: checked before its next client */
	in.idle_for = SEC(31);
	assert_int_equal(policy_idle(&in), IDLE_CHECK);
	in.check_query = false;
	assert_int_equal(policy_idle(&in), IDLE_KEEP);
	/* server_lifetime */
	in = idle();
	in.age = SEC(3600);
	assert_int_equal(policy_idle(&in), IDLE_CLOSE_LIFETIME);
	/* server_idle_timeout, but never below min_pool_size */
	in = idle();
	in.idle_for = SEC(600) + 1;
	assert_int_equal(policy_idle(&in), IDLE_CLOSE_TIMEOUT);
	in.servers = 1;
	assert_int_equal(policy_idle(&in), IDLE_CHECK);
	in.idle_timeout = 0; /* off */
	in.servers = 3;
	assert_int_equal(policy_idle(&in), IDLE_CHECK);
	/* more servers than pool_size in all workers: closes, whatever min_pool_size says */
	in = idle();
	in.servers = 5;
	in.min = 5;
	assert_int_equal(policy_idle(&in), IDLE_CLOSE_OVERSIZE);
	in.size = 0; /* unlimited */
	assert_int_equal(policy_idle(&in), IDLE_KEEP);
	/* the reserve pool's servers stay until server_idle_timeout, as PgBouncer's do */
	in = idle();
	in.servers = 5;
	in.reserve = 1;
	assert_int_equal(policy_idle(&in), IDLE_KEEP);
	in.servers = 6;
	assert_int_equal(policy_idle(&in), IDLE_CLOSE_OVERSIZE);
	/* the order when several hold: config, oversize, idle timeout, lifetime, check */
	in = idle();
	in.idle_for = SEC(700);
	in.age = SEC(4000);
	assert_int_equal(policy_idle(&in), IDLE_CLOSE_TIMEOUT);
	in.servers = 5;
	assert_int_equal(policy_idle(&in), IDLE_CLOSE_OVERSIZE);
	in.close_needed = true;
	assert_int_equal(policy_idle(&in), IDLE_CLOSE_CONFIG);
}

/* ---- server_fast_close and the idle order ---- */

static void test_fast_close(void **state)
{
	(void)state;
	assert_true(policy_fast_close(true, true, true, true));
	assert_false(policy_fast_close(false, true, true, true)); /* server_fast_close = 0 */
	assert_false(policy_fast_close(true, false, true, true)); /* transaction mode releases it anyway */
	assert_false(policy_fast_close(true, true, false, true)); /* nothing changed */
	assert_false(policy_fast_close(true, true, true, false)); /* inside a transaction */
}

static void test_idle_order(void **state)
{
	(void)state;
	assert_true(policy_idle_at_head(false, false)); /* LIFO: the last released is given first */
	assert_false(policy_idle_at_head(true, false)); /* server_round_robin: FIFO */
	assert_false(policy_idle_at_head(false, true)); /* about to close: given last */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_login_retry_wait),
	    cmocka_unit_test(test_launch_within_size),
	    cmocka_unit_test(test_launch_not_now),
	    cmocka_unit_test(test_launch_full_and_reserve),
	    cmocka_unit_test(test_launch_for_replication),
	    cmocka_unit_test(test_launch_for_a_first_welcome),
	    cmocka_unit_test(test_launch_still_full),
	    cmocka_unit_test(test_launch_checking),
	    cmocka_unit_test(test_launch_db_and_user_full),
	    cmocka_unit_test(test_launch_yield),
	    cmocka_unit_test(test_min_pool_size),
	    cmocka_unit_test(test_lifetime),
	    cmocka_unit_test(test_release),
	    cmocka_unit_test(test_release_check),
	    cmocka_unit_test(test_idle),
	    cmocka_unit_test(test_fast_close),
	    cmocka_unit_test(test_idle_order),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
