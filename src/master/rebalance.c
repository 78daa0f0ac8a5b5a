/*
 * The rebalancing plan (include/master/rebalance.h): which worker hands
 * how many clients to which. Pure arithmetic on the counts the workers
 * publish; the master sends the orders (supervisor.c), the workers move
 * the clients (src/worker/handover/migrate.c). The user's view is doc/workers.md,
 * "Rebalancing long-lived clients".
 */
#include "autoconfig.h"

#include "master/rebalance.h"

#include <stdlib.h>

#define PLAN_MAX_WORKERS 64 /* = SHM_MAX_WORKERS */

RebalanceConfig rebalance_default_config(void)
{
	return (RebalanceConfig){.min_tolerance = 2, .tolerance_ratio = 0.10, .busy_gap = 0.25, .busy_full = 0.90};
}

int rebalance_tolerance(const RebalanceConfig *cfg, int total_clients, int n_active)
{
	if (n_active <= 0)
		return cfg->min_tolerance;
	double mean = (double)total_clients / n_active;
	double want = mean * cfg->tolerance_ratio;
	int rel = (int)want;
	if (rel < want - 1e-9)
		rel++; /* rounded up */
	return rel > cfg->min_tolerance ? rel : cfg->min_tolerance;
}

/* Add count clients from -> to, merged with an earlier move of the same pair. */
static int add_move(RebalanceMove *out, int n_out, int max_moves, int from, int to, int count)
{
	for (int k = 0; k < n_out; k++)
		if (out[k].from == from && out[k].to == to) {
			out[k].count += count;
			return n_out;
		}
	if (n_out < max_moves)
		out[n_out++] = (RebalanceMove){.from = from, .to = to, .count = count};
	return n_out;
}

/* The index with the largest v[i] > 0 among those allowed, or -1. */
static int largest(const int *v, const bool *allowed, int n)
{
	int best = -1;
	for (int i = 0; i < n; i++)
		if (allowed[i] && v[i] > 0 && (best < 0 || v[i] > v[best]))
			best = i;
	return best;
}

/* Pair givers with receivers, biggest first, until one side is used up. */
static int match(const RebalanceWorker *w, int n, int *give, const bool *gives, int *take, const bool *takes,
                 RebalanceMove *out, int n_out, int max_moves)
{
	for (;;) {
		int g = largest(give, gives, n), r = largest(take, takes, n);
		if (g < 0 || r < 0 || n_out >= max_moves)
			return n_out;
		int k = give[g] < take[r] ? give[g] : take[r];
		n_out = add_move(out, n_out, max_moves, w[g].slot, w[r].slot, k);
		give[g] -= k;
		take[r] -= k;
	}
}

int rebalance_plan(const RebalanceWorker *w, int n, const RebalanceConfig *cfg, RebalanceMove *out, int max_moves)
{
	if (n > PLAN_MAX_WORKERS)
		n = PLAN_MAX_WORKERS;
	int total = 0, n_active = 0;
	for (int i = 0; i < n; i++) {
		total += w[i].clients;
		if (!w[i].draining)
			n_active++;
	}
	if (n_active == 0 || max_moves <= 0)
		return 0;

	/* targets: an even split; the remainder goes to the fullest workers, which then move fewer */
	int target[PLAN_MAX_WORKERS] = {0};
	bool done[PLAN_MAX_WORKERS] = {false};
	int base = total / n_active, rem = total % n_active;
	for (int i = 0; i < n; i++)
		target[i] = w[i].draining ? 0 : base;
	for (int r = 0; r < rem; r++) {
		int best = -1;
		for (int i = 0; i < n; i++)
			if (!w[i].draining && !done[i] && (best < 0 || w[i].clients > w[best].clients))
				best = i;
		target[best]++;
		done[best] = true;
	}
	int tol = rebalance_tolerance(cfg, total, n_active);

	/*
	 * Uneven load: the busiest worker aims at the low edge of the band and
	 * the idlest at the high edge, so that the count rule and the busy rule
	 * agree on where clients should be and never undo each other's moves.
	 */
	int b = -1, l = -1;
	for (int i = 0; i < n; i++) {
		if (w[i].draining)
			continue;
		if (b < 0 || w[i].busy > w[b].busy)
			b = i;
		if (l < 0 || w[i].busy < w[l].busy)
			l = i;
	}
	int aim[PLAN_MAX_WORKERS];
	for (int i = 0; i < n; i++)
		aim[i] = target[i];
	bool busy_uneven = b != l && w[b].busy - w[l].busy > cfg->busy_gap && w[l].busy < cfg->busy_full;
	if (busy_uneven) {
		int shift = tol < target[b] ? tol : target[b];
		aim[b] -= shift;
		aim[l] += shift;
	}

	int give[PLAN_MAX_WORKERS] = {0}, take[PLAN_MAX_WORKERS] = {0};
	bool drainer[PLAN_MAX_WORKERS] = {false}, active[PLAN_MAX_WORKERS] = {false},
	     not_full[PLAN_MAX_WORKERS] = {false};
	bool any_drain = false, uneven = false;
	for (int i = 0; i < n; i++) {
		if (w[i].draining) {
			give[i] = w[i].movable > 0 ? w[i].movable : 0;
			drainer[i] = give[i] > 0;
			any_drain |= drainer[i];
			continue;
		}
		active[i] = true;
		not_full[i] = w[i].busy < cfg->busy_full;
		take[i] = aim[i] > w[i].clients ? aim[i] - w[i].clients : 0;
		if (abs(w[i].clients - target[i]) > tol)
			uneven = true;
	}

	int n_out = 0;
	if (any_drain)
		n_out = match(w, n, give, drainer, take, active, out, n_out, max_moves);
	if (uneven) {
		for (int i = 0; i < n; i++)
			if (active[i]) {
				int excess = w[i].clients - aim[i];
				give[i] = excess <= 0 ? 0 : (excess < w[i].movable ? excess : w[i].movable);
			}
		n_out = match(w, n, give, active, take, not_full, out, n_out, max_moves);
	}
	if (any_drain || uneven || !busy_uneven)
		return n_out;

	/* even counts, uneven load: from the busiest to the idlest, to the edges of the band */
	int k = w[b].clients - aim[b];
	if (take[l] < k)
		k = take[l];
	if (w[b].movable < k)
		k = w[b].movable;
	if (k <= 0)
		return 0;
	out[0] = (RebalanceMove){.from = w[b].slot, .to = w[l].slot, .count = k};
	return 1;
}
