/*
 * The scaler replay's simulator (scripts/bench/scaler-replay builds and runs
 * it; doc/workers.md, "The scaler on larger machines"): a demand trace goes
 * through the pooler's own saturation signal (scaler_saturation()) and
 * decision (scaler_decide()) from src/master/scaler.c, tick by tick, as the
 * master's scaler tick runs them.
 *
 * Model, per tick of `interval` seconds: the pooler has `demand` cores of
 * work, spread evenly over its n workers (one core each at most: a worker
 * is one event loop). Other processes want `other` cores. When the
 * runnable total exceeds the machine's cores, every runnable thread gets
 * the same share of a core: a worker is on a CPU for that share of its
 * runnable time and waits in the run queue for the rest. The worker's
 * counters (CPU time, run-queue wait, clock) advance accordingly and the
 * scaler reads them like the master does: a new worker has no reading
 * before its second tick. With --signal busy the wait is not published
 * (SHM_WAIT_UNKNOWN), which is the scaler before it read the kernel's
 * run-queue statistics; --core-cap 0 lets the wait count at any worker
 * count (the master stops counting it at the physical cores).
 *
 * --persistent P puts a share P of the demand on long-lived clients, which
 * stay on the worker that accepted them; --rebalance none leaves them there
 * (a new worker then only gets new clients), `even` (the default) moves them
 * so that every worker holds the same share at every tick (the ideal), and
 * `plan` moves them as the master does: the real plan of
 * src/master/rebalance.c on client counts (one client = 0.01 core of
 * demand) and each worker's load, after 3 uneven ticks in a row, at once
 * in the 10 ticks after a worker was added, one quiet tick after a move.
 *
 * Input on stdin: one "demand other" line per tick. Output: one line per
 * tick, "t demand other workers decision mean_busy mean_wait unserved"
 * (unserved: cores of demand above what a worker's one core can take).
 */
#include "autoconfig.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "master/rebalance.h"
#include "master/scaler.h"

#define CLIENT_CORES 0.01 /* --rebalance plan: the demand of one long-lived client */

static double arg(int argc, char **argv, const char *name, double def)
{
	for (int i = 1; i + 1 < argc; i++)
		if (strcmp(argv[i], name) == 0)
			return atof(argv[i + 1]);
	return def;
}

int main(int argc, char **argv)
{
	double cores = arg(argc, argv, "--cores", 2);
	double interval = arg(argc, argv, "--interval", 1);
	ScalerConfig cf = {
	    .min_workers = (int)arg(argc, argv, "--min", 1),
	    .max_workers = (int)arg(argc, argv, "--max", cores),
	    .up_threshold = arg(argc, argv, "--up", 0.75),
	    .up_samples = (int)arg(argc, argv, "--up-samples", 2),
	    .down_threshold = arg(argc, argv, "--down", 0.5),
	    .down_samples = (int)arg(argc, argv, "--down-samples", 30),
	    .cooldown_us = (int64_t)(arg(argc, argv, "--cooldown", 10) * 1e6),
	    .cores = (int)arg(argc, argv, "--core-cap", cores), /* 0: the wait counts at any count */
	    .cpus = cores,
	};
	int busy_only = 0;
	for (int i = 1; i + 1 < argc; i++)
		if (strcmp(argv[i], "--signal") == 0)
			busy_only = strcmp(argv[i + 1], "busy") == 0;
	if (cf.max_workers > SHM_MAX_WORKERS)
		cf.max_workers = SHM_MAX_WORKERS;

	/* the share of the demand carried by long-lived clients, and whether they move between workers */
	double persistent = arg(argc, argv, "--persistent", 0);
	enum { REB_NONE, REB_EVEN, REB_PLAN } rebalance = REB_EVEN;
	for (int i = 1; i + 1 < argc; i++)
		if (strcmp(argv[i], "--rebalance") == 0)
			rebalance = strcmp(argv[i + 1], "none") == 0   ? REB_NONE
			            : strcmp(argv[i + 1], "plan") == 0 ? REB_PLAN
			                                               : REB_EVEN;
	RebalanceConfig rcf = rebalance_default_config();
	int streak = 0, fresh = 0, quiet = 0;
	double load[SHM_MAX_WORKERS] = {0}; /* each worker's last reading */

	SchedCounters cnt[SHM_MAX_WORKERS], prev[SHM_MAX_WORKERS];
	int have_prev[SHM_MAX_WORKERS] = {0};
	double held[SHM_MAX_WORKERS] = {0}; /* cores of long-lived clients' demand on each worker */
	memset(cnt, 0, sizeof(cnt));
	ScalerHistory h = {0};
	int n = cf.min_workers;
	double demand, other;
	uint64_t tick_ns = (uint64_t)llround(interval * 1e9);
	for (long tick = 1; scanf("%lf %lf", &demand, &other) == 2; tick++) {
		/*
		 * The interval that ends now, with n workers. Short-lived clients
		 * spread evenly; long-lived ones stay on the worker that accepted
		 * them (new ones spread evenly, leaving ones leave every worker
		 * alike) unless rebalancing evens them out.
		 */
		double churn = demand * (1 - persistent), longlived = demand * persistent, total = 0;
		for (int i = 0; i < n; i++)
			total += held[i];
		for (int i = 0; i < n; i++) {
			if (rebalance == REB_EVEN)
				held[i] = longlived / n;
			else if (longlived >= total)
				held[i] += (longlived - total) / n;
			else
				held[i] *= longlived / total;
		}
		double want[SHM_MAX_WORKERS], runnable = other, unserved = 0;
		for (int i = 0; i < n; i++) {
			double w = churn / n + held[i];
			want[i] = w > 1 ? 1 : w; /* one event loop: one core at most */
			unserved += w - want[i];
			runnable += want[i];
		}
		double share = runnable > cores ? cores / runnable : 1; /* of a core, per runnable thread */
		for (int i = 0; i < n; i++) {
			cnt[i].time_ns += tick_ns;
			cnt[i].busy_ns += (uint64_t)llround(want[i] * share * (double)tick_ns);
			cnt[i].wait_ns =
			    busy_only ? SHM_WAIT_UNKNOWN
			              : cnt[i].wait_ns + (uint64_t)llround(want[i] * (1 - share) * (double)tick_ns);
		}
		/* the master's tick: read every worker, sample, decide */
		int64_t now_us = tick * (int64_t)(interval * 1e6);
		double sum = 0, sum_busy = 0, sum_wait = 0;
		for (int i = 0; i < n; i++) {
			if (have_prev[i]) {
				Saturation s = scaler_saturation(&prev[i], &cnt[i]);
				if (s.valid) {
					load[i] = s.load;
					sum += s.load;
					sum_busy += s.busy;
					sum_wait += s.wait;
				}
			}
			prev[i] = cnt[i];
			have_prev[i] = 1;
		}
		if (rebalance == REB_PLAN) {
			/* the master's rebalance tick (supervisor.c), every client movable */
			RebalanceWorker rw[SHM_MAX_WORKERS];
			for (int i = 0; i < n; i++)
				rw[i] = (RebalanceWorker){.slot = i,
				                          .clients = (int)llround(held[i] / CLIENT_CORES),
				                          .movable = (int)llround(held[i] / CLIENT_CORES),
				                          .busy = load[i]};
			RebalanceMove mv[REBALANCE_MAX_MOVES];
			int k = 0;
			if (fresh > 0)
				fresh--;
			if (quiet > 0)
				quiet--;
			else if ((k = rebalance_plan(rw, n, &rcf, mv, REBALANCE_MAX_MOVES)) == 0)
				streak = 0;
			else if (fresh > 0 || ++streak >= 3) {
				for (int j = 0; j < k; j++) {
					double c = mv[j].count * CLIENT_CORES;
					if (c > held[mv[j].from])
						c = held[mv[j].from];
					held[mv[j].from] -= c;
					held[mv[j].to] += c;
				}
				streak = fresh = 0;
				quiet = 1;
			}
		}
		/* the CPU nobody used in the interval: the master's idle reading (cpu_idle.c) */
		double used = other * share;
		for (int i = 0; i < n; i++)
			used += want[i] * share;
		double idle = cores > used ? cores - used : 0;
		ScalerSample smp = busy_only ? scaler_sample_make_split(now_us, n, sum, sum_busy)
		                             : scaler_sample_make_full(now_us, n, sum, sum_busy, sum_wait, idle, 0);
		scaler_history_add(&h, &smp);
		ScalerResult r = scaler_decide(&h, &cf, n, now_us);
		/* a proportional step: several workers at once (doc/workers.md, "Proportional steps") */
		while (r.decision == SCALE_UP && n < r.target && n < SHM_MAX_WORKERS) {
			/* a fresh process in the next slot: counters from zero, no reading at its first tick */
			memset(&cnt[n], 0, sizeof(cnt[n]));
			cnt[n].time_ns = cnt[0].time_ns;
			have_prev[n] = 0;
			held[n] = 0;
			load[n] = 0;
			n++;
			fresh = 10; /* the master plans at once for a new worker */
		}
		while (r.decision == SCALE_DOWN && n > r.target && n > 1) {
			/* the highest slot drains: it no longer counts; its long-lived clients come back elsewhere */
			n--;
			for (int i = 0; i < n; i++)
				held[i] += held[n] / n;
			held[n] = 0;
		}
		if (r.decision != SCALE_HOLD)
			scaler_note_change(&h, now_us);
		printf("%.3f %.4f %.4f %d %s %.4f %.4f %.4f\n", (double)now_us / 1e6, demand, other, n,
		       scaler_decision_name(r.decision), sum_busy / smp.n_workers, sum_wait / smp.n_workers, unserved);
	}
	return 0;
}
