/*
 * Unit tests for the global budget (common/budget.c): lookups in the shared
 * table, "take if below the limit" across processes, fair give-back, and the
 * master returning a dead worker's share.
 */
#include "autoconfig.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/budget.h"

static GlobalBudget *new_budget(void)
{
	void *p = mmap(NULL, sizeof(GlobalBudget), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_true(p != MAP_FAILED);
	memset(p, 0, sizeof(GlobalBudget));
	return p;
}

static void free_budget(GlobalBudget *gb)
{
	munmap(gb, sizeof(GlobalBudget));
}

static void test_lookup_same_key_same_entry(void **state)
{
	GlobalBudget *gb = new_budget();
	int pool = budget_lookup(gb, 0, BUDGET_POOL, "db", "alice");
	int db = budget_lookup(gb, 1, BUDGET_DB, "db", "");
	int user = budget_lookup(gb, 1, BUDGET_USER, "", "alice");
	assert_true(pool >= 0 && db >= 0 && user >= 0);
	assert_int_not_equal(pool, db);
	assert_int_not_equal(db, user);
	/* another worker finds the same entries */
	assert_int_equal(budget_lookup(gb, 3, BUDGET_POOL, "db", "alice"), pool);
	assert_int_equal(budget_lookup(gb, 3, BUDGET_DB, "db", ""), db);
	/* the separator keeps ("ab","c") and ("a","bc") apart */
	assert_int_not_equal(budget_lookup(gb, 0, BUDGET_POOL, "ab", "c"),
	                     budget_lookup(gb, 0, BUDGET_POOL, "a", "bc"));
	/* names that do not fit fall back to per-worker limits */
	char long_name[SHM_BUDGET_DBNAME + 1];
	memset(long_name, 'x', sizeof(long_name) - 1);
	long_name[sizeof(long_name) - 1] = '\0';
	assert_int_equal(budget_lookup(gb, 0, BUDGET_DB, long_name, ""), -1);
	free_budget(gb);
}

static void test_table_full(void **state)
{
	GlobalBudget *gb = new_budget();
	char name[32];
	for (int i = 0; i < SHM_BUDGET_ENTRIES; i++) {
		snprintf(name, sizeof(name), "db%d", i);
		assert_true(budget_lookup(gb, 0, BUDGET_DB, name, "") >= 0);
	}
	assert_int_equal(budget_lookup(gb, 0, BUDGET_DB, "one too many", ""), -1);
	/* existing entries are still found */
	assert_true(budget_lookup(gb, 0, BUDGET_DB, "db17", "") >= 0);
	free_budget(gb);
}

static void test_take_below_limit(void **state)
{
	GlobalBudget *gb = new_budget();
	int e = budget_lookup(gb, 0, BUDGET_POOL, "db", "u");
	assert_true(budget_take(gb, 0, e, 2));
	assert_true(budget_take(gb, 1, e, 2));
	assert_false(budget_take(gb, 1, e, 2));
	assert_int_equal(budget_count(gb, e), 2);
	assert_int_equal(budget_held(gb, 0, e), 1);
	assert_int_equal(budget_held(gb, 1, e), 1);
	/* a higher limit (the reserve pool) lets one more in */
	assert_true(budget_take(gb, 1, e, 3));
	budget_give(gb, 0, e);
	assert_int_equal(budget_count(gb, e), 2);
	assert_int_equal(budget_held(gb, 0, e), 0);
	/* no limit */
	assert_true(budget_take(gb, 0, e, 0));
	assert_int_equal(budget_count(gb, e), 3);
	free_budget(gb);
}

/* Many processes race for a limit of 5: never more than 5 held at once. */
static void test_take_races_across_processes(void **state)
{
	GlobalBudget *gb = new_budget();
	int e = budget_lookup(gb, 0, BUDGET_POOL, "db", "u");
	_Atomic int *peak = mmap(NULL, sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	*peak = 0;
	enum { PROCS = 4, ROUNDS = 20000, LIMIT = 5 };
	pid_t pids[PROCS];
	for (int p = 0; p < PROCS; p++) {
		pids[p] = fork();
		if (pids[p] == 0) {
			for (int r = 0; r < ROUNDS; r++) {
				if (!budget_take(gb, p, e, LIMIT))
					continue;
				int now = budget_count(gb, e);
				int seen = atomic_load(peak);
				while (now > seen && !atomic_compare_exchange_weak(peak, &seen, now))
					;
				budget_give(gb, p, e);
			}
			_exit(0);
		}
	}
	for (int p = 0; p < PROCS; p++) {
		int st;
		waitpid(pids[p], &st, 0);
		assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	assert_true(atomic_load(peak) <= LIMIT);
	assert_int_equal(budget_count(gb, e), 0);
	munmap((void *)peak, sizeof(int));
	free_budget(gb);
}

static void test_reset_dead_worker(void **state)
{
	GlobalBudget *gb = new_budget();
	int e = budget_lookup(gb, 0, BUDGET_POOL, "db", "u");
	int d = budget_lookup(gb, 0, BUDGET_DB, "db", "");
	assert_true(budget_take(gb, 2, e, 10));
	assert_true(budget_take(gb, 2, e, 10));
	assert_true(budget_take(gb, 2, d, 10));
	assert_true(budget_take(gb, 5, e, 10));
	budget_want(gb, 2, e, true);
	budget_clients_add(gb, 2, 3);
	budget_clients_add(gb, 5, 1);
	/* worker 2 died in the middle of claiming an entry */
	int half = 0;
	while (atomic_load(&gb->entries[half].state) != BUDGET_EMPTY)
		half++;
	atomic_store(&gb->entries[half].state, BUDGET_CLAIMING | (2u << 8));
	budget_reset_worker(gb, 2);
	assert_int_equal(budget_count(gb, e), 1);
	assert_int_equal(budget_count(gb, d), 0);
	assert_int_equal(budget_held(gb, 2, e), 0);
	assert_int_equal(budget_held(gb, 5, e), 1);
	assert_false(budget_others_want(gb, 5, e));
	assert_int_equal(budget_clients(gb), 1);
	assert_int_equal(atomic_load(&gb->entries[half].state), BUDGET_DEAD);
	/* a late give-back of the dead worker's unit cannot drive counts negative */
	budget_give(gb, 2, e);
	assert_int_equal(budget_count(gb, e), 1);
	free_budget(gb);
}

static void test_yield_fair_share(void **state)
{
	GlobalBudget *gb = new_budget();
	int e = budget_lookup(gb, 0, BUDGET_POOL, "db", "u");
	/* worker 0 holds the whole pool of 3 */
	for (int i = 0; i < 3; i++)
		assert_true(budget_take(gb, 0, e, 3));
	/* nobody else waits: keep everything */
	assert_false(budget_should_yield(gb, 0, e, 3, false));
	budget_want(gb, 1, e, true);
	assert_true(budget_others_want(gb, 0, e));
	assert_false(budget_others_want(gb, 1, e));
	/* worker 0 needs none itself: give back */
	assert_true(budget_should_yield(gb, 0, e, 3, false));
	/* worker 0's clients wait too: keep the rounded-up share of 2 */
	assert_true(budget_should_yield(gb, 0, e, 3, true));
	budget_give(gb, 0, e);
	/* room is free: the waiting worker takes it, no give-back needed */
	assert_false(budget_should_yield(gb, 0, e, 3, true));
	assert_true(budget_take(gb, 1, e, 3));
	assert_false(budget_should_yield(gb, 0, e, 3, true)); /* 2 of 3: its share */
	/* worker 1 holds 1 and wants more; worker 0 wants too: nobody bounces servers */
	budget_want(gb, 0, e, true);
	assert_false(budget_should_yield(gb, 1, e, 3, true));
	assert_false(budget_should_yield(gb, 0, e, 3, true));
	/* no limit: never */
	assert_false(budget_should_yield(gb, 0, e, 0, false));
	free_budget(gb);
}

/* A worker with few of the clients does not take half of the pool from the one with the rest. */
static void test_fair_share_follows_clients(void **state)
{
	GlobalBudget *gb = new_budget();
	int e = budget_lookup(gb, 0, BUDGET_POOL, "db", "u");
	for (int i = 0; i < 20; i++)
		assert_true(budget_take(gb, 0, e, 20));
	budget_want(gb, 1, e, true);
	/* nobody said how many clients: even shares, as before */
	assert_int_equal(budget_fair_share(gb, 0, e, 20), 10);
	assert_int_equal(budget_fair_share(gb, 1, e, 20), 10);
	/* 1,900 clients on worker 0, 100 moved to worker 1 */
	budget_set_demand(gb, 0, e, 1900);
	budget_set_demand(gb, 1, e, 100);
	assert_int_equal(budget_fair_share(gb, 0, e, 20), 19);
	assert_int_equal(budget_fair_share(gb, 1, e, 20), 1);
	/* worker 0 gives back one server, and only one */
	assert_true(budget_should_yield(gb, 0, e, 20, true));
	budget_give(gb, 0, e);
	assert_false(budget_should_yield(gb, 0, e, 20, true));
	assert_true(budget_take(gb, 1, e, 20));
	assert_false(budget_should_yield(gb, 0, e, 20, true));
	/* both at their shares (19 and 1): neither takes room the other waits for (policy_launch(), LAUNCH_YIELD) */
	budget_want(gb, 0, e, true);
	for (int w = 0; w < 2; w++) {
		assert_true(budget_others_want(gb, w, e));
		assert_true(budget_held(gb, w, e) >= budget_fair_share(gb, w, e, 20));
	}
	/* worker 1's clients go (they disconnect): its one server goes back when it is free */
	budget_set_demand(gb, 1, e, 0);
	assert_int_equal(budget_fair_share(gb, 1, e, 20), 0);
	assert_true(budget_should_yield(gb, 1, e, 20, true));
	budget_set_demand(gb, 1, e, 100);
	/* even clients: even shares; a few clients still get at least one server */
	budget_set_demand(gb, 1, e, 1900);
	assert_int_equal(budget_fair_share(gb, 1, e, 20), 10);
	budget_set_demand(gb, 1, e, 1);
	assert_int_equal(budget_fair_share(gb, 1, e, 20), 1);
	/* more than 65,535 clients count as 65,535; worker 1's one client still has a server */
	budget_set_demand(gb, 0, e, 100000);
	assert_int_equal(budget_fair_share(gb, 0, e, 20), 19);
	assert_int_equal(budget_fair_share(gb, 1, e, 20), 1);
	/* a dead worker's clients no longer weigh */
	budget_reset_worker(gb, 1);
	budget_set_demand(gb, 0, e, 10);
	assert_int_equal(budget_fair_share(gb, 0, e, 20), 20);
	free_budget(gb);
}

/* The shares add up to the limit: rounding up would let one worker starve another. */
static void test_fair_shares_add_up_to_the_limit(void **state)
{
	GlobalBudget *gb = new_budget();
	int e = budget_lookup(gb, 0, BUDGET_POOL, "db", "u");
	assert_true(budget_take(gb, 0, e, 2));
	assert_true(budget_take(gb, 0, e, 2));
	budget_want(gb, 1, e, true);
	/* 4 busy clients on worker 0, 2 on worker 1 (one waiting for its welcome): 1 and 1, not 2 and 1 */
	budget_set_demand(gb, 0, e, 4);
	budget_set_demand(gb, 1, e, 2);
	assert_int_equal(budget_fair_share(gb, 0, e, 2), 1);
	assert_int_equal(budget_fair_share(gb, 1, e, 2), 1);
	assert_true(budget_should_yield(gb, 0, e, 2, true));
	/* three workers with the same clients: 7 + 7 + 6 of 20 */
	budget_want(gb, 2, e, true);
	budget_set_demand(gb, 1, e, 4);
	budget_set_demand(gb, 2, e, 4);
	int sum = 0;
	for (int w = 0; w < 3; w++) {
		int share = budget_fair_share(gb, w, e, 20);
		assert_true(share == 6 || share == 7);
		sum += share;
	}
	assert_int_equal(sum, 20);
	/* nobody said: even, still adding up (3 = 1 + 1 + 1 of 3, 2 + 1 of 3 between two) */
	for (int w = 0; w < 3; w++)
		budget_set_demand(gb, w, e, 0);
	for (int w = 0; w < 3; w++)
		assert_int_equal(budget_fair_share(gb, w, e, 3), 1);
	budget_want(gb, 2, e, false);
	assert_int_equal(budget_fair_share(gb, 0, e, 3) + budget_fair_share(gb, 1, e, 3), 3);
	/* a pool of 1 between two workers with clients: one of them has it */
	budget_set_demand(gb, 0, e, 5);
	budget_set_demand(gb, 1, e, 5);
	assert_int_equal(budget_fair_share(gb, 0, e, 1) + budget_fair_share(gb, 1, e, 1), 1);
	free_budget(gb);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_lookup_same_key_same_entry), cmocka_unit_test(test_table_full),
	    cmocka_unit_test(test_take_below_limit),           cmocka_unit_test(test_take_races_across_processes),
	    cmocka_unit_test(test_reset_dead_worker),          cmocka_unit_test(test_yield_fair_share),
	    cmocka_unit_test(test_fair_share_follows_clients), cmocka_unit_test(test_fair_shares_add_up_to_the_limit),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
