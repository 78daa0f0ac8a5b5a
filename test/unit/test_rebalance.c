/*
 * Unit tests for rebalance.c: the plan of which worker hands how many
 * clients to which (doc/workers.md, "Rebalancing long-lived clients"):
 * even splits, the tolerance band, draining workers, busy ratios, and a
 * replay of repeated plans that must settle without moving clients back.
 */
#include "autoconfig.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "unit.h"

#include "master/rebalance.h"

static RebalanceWorker wrk(int slot, int clients, int movable, double busy)
{
	return (RebalanceWorker){.slot = slot, .clients = clients, .movable = movable, .busy = busy};
}

static int plan(const RebalanceWorker *w, int n, RebalanceMove *out)
{
	RebalanceConfig cf = rebalance_default_config();
	return rebalance_plan(w, n, &cf, out, REBALANCE_MAX_MOVES);
}

static void assert_move(const RebalanceMove *m, int from, int to, int count)
{
	assert_int_equal(m->from, from);
	assert_int_equal(m->to, to);
	assert_int_equal(m->count, count);
}

static void test_tolerance(void **state)
{
	RebalanceConfig cf = rebalance_default_config();
	assert_int_equal(rebalance_tolerance(&cf, 40, 2), 2);    /* mean 20: 10% is 2 */
	assert_int_equal(rebalance_tolerance(&cf, 10, 2), 2);    /* the floor */
	assert_int_equal(rebalance_tolerance(&cf, 1000, 4), 25); /* mean 250 */
	assert_int_equal(rebalance_tolerance(&cf, 41, 2), 3);    /* mean 20.5: rounded up */
	assert_int_equal(rebalance_tolerance(&cf, 5, 0), 2);
}

/* 40 clients on worker 0, a new empty worker 1: half of them move. */
static void test_new_worker_gets_half(void **state)
{
	RebalanceWorker w[2] = {wrk(0, 40, 40, 0.1), wrk(1, 0, 0, 0.0)};
	RebalanceMove m[REBALANCE_MAX_MOVES];
	assert_int_equal(plan(w, 2, m), 1);
	assert_move(&m[0], 0, 1, 20);
	/* the old worker much busier: the new one is filled to the top of the band */
	w[0].busy = 0.6;
	assert_int_equal(plan(w, 2, m), 1);
	assert_move(&m[0], 0, 1, 22);
	w[0].clients = w[0].movable = 18;
	w[1].clients = w[1].movable = 22;
	assert_int_equal(plan(w, 2, m), 0);
}

/* Only movable clients can go: the rest stays, and the plan says so by its count. */
static void test_limited_by_movable(void **state)
{
	RebalanceWorker w[2] = {wrk(0, 40, 7, 0.3), wrk(1, 0, 0, 0.0)};
	RebalanceMove m[REBALANCE_MAX_MOVES];
	assert_int_equal(plan(w, 2, m), 1);
	assert_move(&m[0], 0, 1, 7);
	w[0].movable = 0;
	assert_int_equal(plan(w, 2, m), 0);
}

/* Inside the tolerance nothing moves; one client beyond it, the split is evened. */
static void test_tolerance_band(void **state)
{
	RebalanceMove m[REBALANCE_MAX_MOVES];
	RebalanceWorker w[2] = {wrk(0, 22, 22, 0.2), wrk(1, 18, 18, 0.2)};
	assert_int_equal(plan(w, 2, m), 0);
	w[0] = wrk(0, 23, 23, 0.2);
	w[1] = wrk(1, 17, 17, 0.2);
	assert_int_equal(plan(w, 2, m), 1);
	assert_move(&m[0], 0, 1, 3);
	/* an odd total: the extra client stays with the fuller worker */
	w[0] = wrk(0, 41, 41, 0.2);
	w[1] = wrk(1, 0, 0, 0.2);
	assert_int_equal(plan(w, 2, m), 1);
	assert_move(&m[0], 0, 1, 20);
}

/* Three workers after two were added: the full one feeds both. */
static void test_three_workers(void **state)
{
	RebalanceWorker w[3] = {wrk(0, 60, 60, 0.2), wrk(1, 0, 0, 0.0), wrk(2, 0, 0, 0.0)};
	RebalanceMove m[REBALANCE_MAX_MOVES];
	int n = plan(w, 3, m);
	assert_int_equal(n, 2);
	assert_int_equal(m[0].from, 0);
	assert_int_equal(m[1].from, 0);
	assert_int_equal(m[0].count + m[1].count, 40);
	assert_true(m[0].to != m[1].to);
	/* two givers, one receiver */
	RebalanceWorker v[3] = {wrk(0, 30, 30, 0.2), wrk(3, 30, 30, 0.2), wrk(5, 0, 0, 0.0)};
	n = plan(v, 3, m);
	assert_int_equal(n, 2);
	assert_move(&m[0], 0, 5, 10);
	assert_move(&m[1], 3, 5, 10);
}

/* A draining worker gives every movable client, even when the others are even. */
static void test_drain_gives_all(void **state)
{
	RebalanceWorker w[3] = {wrk(0, 10, 10, 0.1), wrk(1, 10, 10, 0.1), wrk(2, 7, 5, 0.1)};
	w[2].draining = true;
	RebalanceMove m[REBALANCE_MAX_MOVES];
	int n = plan(w, 3, m);
	int moved = 0;
	for (int k = 0; k < n; k++) {
		assert_int_equal(m[k].from, 2);
		assert_true(m[k].to == 0 || m[k].to == 1);
		moved += m[k].count;
	}
	assert_int_equal(moved, 5);
	/* even to a busy worker: a drain must end */
	w[0].busy = w[1].busy = 0.99;
	n = plan(w, 3, m);
	moved = 0;
	for (int k = 0; k < n; k++)
		moved += m[k].count;
	assert_int_equal(moved, 5);
	/* nothing movable: nothing to do until a client is between transactions */
	w[2].movable = 0;
	assert_int_equal(plan(w, 3, m), 0);
}

/* A saturated worker takes no clients from an active one. */
static void test_full_receiver_skipped(void **state)
{
	RebalanceWorker w[3] = {wrk(0, 40, 40, 0.3), wrk(1, 0, 0, 0.95), wrk(2, 5, 5, 0.2)};
	RebalanceMove m[REBALANCE_MAX_MOVES];
	int n = plan(w, 3, m);
	assert_int_equal(n, 1);
	/* target 15 each; worker 2, the idlest, fills to the top of the band (15 + 2) */
	assert_move(&m[0], 0, 2, 12);
}

/* Even counts, uneven busy ratios: a few clients move, never out of the band. */
static void test_busy_gap(void **state)
{
	RebalanceWorker w[2] = {wrk(0, 20, 20, 0.8), wrk(1, 20, 20, 0.2)};
	RebalanceMove m[REBALANCE_MAX_MOVES];
	assert_int_equal(plan(w, 2, m), 1);
	assert_move(&m[0], 0, 1, 2); /* to the edges of the band: 18 and 22 */
	/* once at the band's edge, no more */
	w[0].clients = w[0].movable = 18;
	w[1].clients = w[1].movable = 22;
	assert_int_equal(plan(w, 2, m), 0);
	/* a small gap moves nothing */
	RebalanceWorker v[2] = {wrk(0, 20, 20, 0.5), wrk(1, 20, 20, 0.3)};
	assert_int_equal(plan(v, 2, m), 0);
}

/* No active worker, nothing to plan; room for no moves, no moves. */
static void test_degenerate(void **state)
{
	RebalanceWorker w[1] = {wrk(0, 10, 10, 0.1)};
	w[0].draining = true;
	RebalanceMove m[REBALANCE_MAX_MOVES];
	assert_int_equal(plan(w, 1, m), 0);
	RebalanceWorker v[2] = {wrk(0, 40, 40, 0.3), wrk(1, 0, 0, 0.0)};
	RebalanceConfig cf = rebalance_default_config();
	assert_int_equal(rebalance_plan(v, 2, &cf, m, 0), 0);
	assert_int_equal(plan(v, 0, m), 0);
}

/*
 * Replay: random counts and busy ratios; carry each plan out (every client
 * movable) and plan again. The plan must settle inside the band within a
 * few rounds and never move a client straight back to where it came from.
 */
static void test_replay_settles(void **state)
{
	srand(12345);
	RebalanceConfig cf = rebalance_default_config();
	for (int run = 0; run < 200; run++) {
		int n = 2 + rand() % 6;
		RebalanceWorker w[8];
		int total = 0;
		for (int i = 0; i < n; i++) {
			/* below busy_full: every worker may take clients */
			w[i] = wrk(i, rand() % 200, 0, (rand() % 85) / 100.0);
			w[i].movable = w[i].clients;
			total += w[i].clients;
		}
		int last_from = -1, last_to = -1;
		for (int round = 0; round < 10; round++) {
			RebalanceMove m[REBALANCE_MAX_MOVES];
			int k = rebalance_plan(w, n, &cf, m, REBALANCE_MAX_MOVES);
			if (k == 0)
				break;
			for (int j = 0; j < k; j++) {
				assert_false(m[j].from == last_to && m[j].to == last_from);
				w[m[j].from].clients -= m[j].count;
				w[m[j].to].clients += m[j].count;
				assert_true(w[m[j].from].clients >= 0);
				last_from = m[j].from;
				last_to = m[j].to;
			}
			for (int i = 0; i < n; i++)
				w[i].movable = w[i].clients;
			assert_true(round < 3); /* settles in a few rounds */
		}
		int tol = rebalance_tolerance(&cf, total, n);
		int sum = 0;
		for (int i = 0; i < n; i++) {
			sum += w[i].clients;
			assert_true(abs(w[i].clients * n - total) <= (tol + 1) * n);
		}
		assert_int_equal(sum, total);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_tolerance),
	    cmocka_unit_test(test_new_worker_gets_half),
	    cmocka_unit_test(test_limited_by_movable),
	    cmocka_unit_test(test_tolerance_band),
	    cmocka_unit_test(test_three_workers),
	    cmocka_unit_test(test_drain_gives_all),
	    cmocka_unit_test(test_full_receiver_skipped),
	    cmocka_unit_test(test_busy_gap),
	    cmocka_unit_test(test_degenerate),
	    cmocka_unit_test(test_replay_settles),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
