/*
 * Unit tests for scaler.c: the exact decision and reason for each rule of
 * DESIGN.md §4, stability under a simulated load, and the saturation
 * signal (busy + run-queue wait) from synthetic schedstat numbers. The
 * core count is test_cpu_allowance.c's.
 */
#include "autoconfig.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmocka.h>

#include "unit.h"

#include "common/schedstat.h"
#include "master/scaler.h"

#define SEC 1000000LL

/* The defaults of DESIGN.md §4, with max_workers = 4. */
static ScalerConfig defaults(void)
{
	ScalerConfig cf = {
	    .min_workers = 1,
	    .max_workers = 4,
	    .up_threshold = 0.75,
	    .up_samples = 2,
	    .down_threshold = 0.50,
	    .down_samples = 30,
	    .cooldown_us = 10 * SEC,
	};
	return cf;
}

/* Add a sample at second `t` of n workers each `busy` busy. */
static void add(ScalerHistory *h, int64_t t, int n, double busy)
{
	ScalerSample s = scaler_sample_make(t * SEC, n, n * busy);
	scaler_history_add(h, &s);
}

#define assert_decision(r, d, text)                                                                                    \
	do {                                                                                                           \
		ScalerResult r_ = (r);                                                                                 \
		assert_string_equal(scaler_decision_name(r_.decision), scaler_decision_name(d));                       \
		assert_string_equal(r_.reason, (text));                                                                \
	} while (0)

static void test_sample_make(void **state)
{
	ScalerSample s = scaler_sample_make(5, 4, 2.0);
	assert_int_equal(s.time_us, 5);
	assert_int_equal(s.n_workers, 4);
	assert_true(s.sum_busy == 2.0);
	assert_true(s.mean_busy == 0.5);
	s = scaler_sample_make(5, 0, 0.0);
	assert_true(s.mean_busy == 0.0);
}

static void test_up_after_exactly_n_samples(void **state)
{
	ScalerConfig cf = defaults();
	ScalerHistory h = {0};

	assert_decision(scaler_decide(&h, &cf, 2, 1 * SEC), SCALE_HOLD, "no samples with 2 workers yet");
	add(&h, 1, 2, 0.90);
	assert_decision(scaler_decide(&h, &cf, 2, 1 * SEC), SCALE_HOLD, "mean load 0.90 > 0.75 for 1 of 2 samples");
	add(&h, 2, 2, 0.90);
	assert_decision(scaler_decide(&h, &cf, 2, 2 * SEC), SCALE_UP, "mean load 0.90 > 0.75 for 2 samples");

	/* with 5 samples needed: 4 are not enough */
	cf.up_samples = 5;
	scaler_history_reset(&h);
	for (int t = 1; t <= 4; t++)
		add(&h, t, 3, 0.80);
	assert_decision(scaler_decide(&h, &cf, 3, 4 * SEC), SCALE_HOLD, "mean load 0.80 > 0.75 for 4 of 5 samples");
	add(&h, 5, 3, 0.80);
	assert_decision(scaler_decide(&h, &cf, 3, 5 * SEC), SCALE_UP, "mean load 0.80 > 0.75 for 5 samples");
}

static void test_dip_resets_the_count(void **state)
{
	ScalerConfig cf = defaults();
	ScalerHistory h = {0};
	cf.up_samples = 3;

	add(&h, 1, 2, 0.90);
	add(&h, 2, 2, 0.90);
	add(&h, 3, 2, 0.70); /* one dip */
	add(&h, 4, 2, 0.90);
	add(&h, 5, 2, 0.90);
	assert_decision(scaler_decide(&h, &cf, 2, 5 * SEC), SCALE_HOLD, "mean load 0.90 > 0.75 for 2 of 3 samples");
	add(&h, 6, 2, 0.75); /* exactly at the threshold is not above it */
	assert_decision(scaler_decide(&h, &cf, 2, 6 * SEC), SCALE_HOLD, "steady: mean load 0.75 on 2 workers");
	add(&h, 7, 2, 0.95);
	add(&h, 8, 2, 0.95);
	add(&h, 9, 2, 0.95);
	assert_decision(scaler_decide(&h, &cf, 2, 9 * SEC), SCALE_UP, "mean load 0.95 > 0.75 for 3 samples");

	/* the same for the way down */
	scaler_history_reset(&h);
	for (int t = 1; t <= 29; t++)
		add(&h, t, 2, 0.20);
	add(&h, 30, 2, 0.26); /* 0.52 on one worker: does not fit */
	for (int t = 31; t <= 59; t++)
		add(&h, t, 2, 0.20);
	assert_decision(scaler_decide(&h, &cf, 2, 59 * SEC), SCALE_HOLD,
	                "load 0.40 would fit on 1 worker (0.40 < 0.50) for 29 of 30 samples");
	add(&h, 60, 2, 0.20);
	assert_decision(scaler_decide(&h, &cf, 2, 60 * SEC), SCALE_DOWN,
	                "load 0.40 would fit on 1 worker (0.40 < 0.50) for 30 samples");
}

static void test_down_only_when_the_load_fits(void **state)
{
	ScalerConfig cf = defaults();
	ScalerHistory h = {0};

	/* 2 x 0.30 = 0.60 on one worker >= 0.50: stay, however long */
	for (int t = 1; t <= 100; t++)
		add(&h, t, 2, 0.30);
	assert_decision(scaler_decide(&h, &cf, 2, 100 * SEC), SCALE_HOLD, "steady: mean load 0.30 on 2 workers");

	/* 2 x 0.20 = 0.40 < 0.50: down after exactly 30 samples */
	scaler_history_reset(&h);
	for (int t = 1; t <= 29; t++)
		add(&h, t, 2, 0.20);
	assert_decision(scaler_decide(&h, &cf, 2, 29 * SEC), SCALE_HOLD,
	                "load 0.40 would fit on 1 worker (0.40 < 0.50) for 29 of 30 samples");
	add(&h, 30, 2, 0.20);
	assert_decision(scaler_decide(&h, &cf, 2, 30 * SEC), SCALE_DOWN,
	                "load 0.40 would fit on 1 worker (0.40 < 0.50) for 30 samples");

	/* 3 x 0.30 = 0.90 on two workers = 0.45 each: fits */
	scaler_history_reset(&h);
	for (int t = 1; t <= 30; t++)
		add(&h, t, 3, 0.30);
	assert_decision(scaler_decide(&h, &cf, 3, 30 * SEC), SCALE_DOWN,
	                "load 0.90 would fit on 2 workers (0.45 < 0.50) for 30 samples");

	/* 3 x 0.34 = 1.02 on two workers = 0.51 each: does not */
	scaler_history_reset(&h);
	for (int t = 1; t <= 30; t++)
		add(&h, t, 3, 0.34);
	assert_decision(scaler_decide(&h, &cf, 3, 30 * SEC), SCALE_HOLD, "steady: mean load 0.34 on 3 workers");

	/* one worker never drains below itself, even idle */
	scaler_history_reset(&h);
	for (int t = 1; t <= 30; t++)
		add(&h, t, 1, 0.0);
	assert_decision(scaler_decide(&h, &cf, 1, 30 * SEC), SCALE_HOLD, "steady: mean load 0.00 on 1 worker");
}

static void test_clamps(void **state)
{
	ScalerConfig cf = defaults();
	ScalerHistory h = {0};

	/* below min: up at once, with no samples, within the cooldown, under no load */
	cf.min_workers = 2;
	scaler_note_change(&h, 100 * SEC);
	add(&h, 101, 1, 0.0);
	assert_decision(scaler_decide(&h, &cf, 1, 101 * SEC), SCALE_UP, "below min_workers (1 < 2)");
	assert_decision(scaler_decide(&h, &cf, 0, 101 * SEC), SCALE_UP, "below min_workers (0 < 2)");

	/* above max: down at once, even under full load and within the cooldown */
	add(&h, 102, 5, 1.0);
	add(&h, 103, 5, 1.0);
	assert_decision(scaler_decide(&h, &cf, 5, 103 * SEC), SCALE_DOWN, "above max_workers (5 > 4)");

	/* at max: no up, however busy */
	scaler_history_reset(&h);
	for (int t = 200; t < 210; t++)
		add(&h, t, 4, 0.99);
	assert_decision(scaler_decide(&h, &cf, 4, 210 * SEC), SCALE_HOLD, "at max_workers (4): mean load 0.99 > 0.75");

	/* at min: no down, however idle */
	scaler_history_reset(&h);
	for (int t = 300; t < 340; t++)
		add(&h, t, 2, 0.05);
	assert_decision(scaler_decide(&h, &cf, 2, 340 * SEC), SCALE_HOLD,
	                "at min_workers (2): load 0.10 would fit on 1 worker");

	/* min == max == 1 with a busy worker: nothing to do */
	cf.min_workers = cf.max_workers = 1;
	scaler_history_reset(&h);
	add(&h, 400, 1, 1.0);
	add(&h, 401, 1, 1.0);
	assert_decision(scaler_decide(&h, &cf, 1, 401 * SEC), SCALE_HOLD, "at max_workers (1): mean load 1.00 > 0.75");
}

static void test_cooldown(void **state)
{
	ScalerConfig cf = defaults();
	ScalerHistory h = {0};

	/* up blocked: a change at 100 s, busy samples right after */
	scaler_note_change(&h, 100 * SEC);
	add(&h, 101, 3, 0.95);
	add(&h, 102, 3, 0.95);
	assert_decision(scaler_decide(&h, &cf, 3, 105 * SEC + 800000), SCALE_HOLD, "cooldown: 4.2 s left");
	/* rounded up: never "0.0 s left" while still waiting */
	assert_decision(scaler_decide(&h, &cf, 3, 110 * SEC - 1), SCALE_HOLD, "cooldown: 0.1 s left");
	/* samples taken during the cooldown count once it is over */
	assert_decision(scaler_decide(&h, &cf, 3, 110 * SEC), SCALE_UP, "mean load 0.95 > 0.75 for 2 samples");

	/* down blocked the same way */
	scaler_note_change(&h, 200 * SEC);
	assert_int_equal(h.n, 0);
	for (int t = 201; t <= 209; t++)
		add(&h, t, 3, 0.10);
	cf.down_samples = 5;
	assert_decision(scaler_decide(&h, &cf, 3, 209 * SEC), SCALE_HOLD, "cooldown: 1.0 s left");
	assert_decision(scaler_decide(&h, &cf, 3, 210 * SEC), SCALE_DOWN,
	                "load 0.30 would fit on 2 workers (0.15 < 0.50) for 5 samples");

	/* a cooldown of 0 never blocks */
	cf.cooldown_us = 0;
	assert_decision(scaler_decide(&h, &cf, 3, 200 * SEC), SCALE_DOWN,
	                "load 0.30 would fit on 2 workers (0.15 < 0.50) for 5 samples");
}

static void test_other_worker_counts_ignored(void **state)
{
	ScalerConfig cf = defaults();
	ScalerHistory h = {0};

	add(&h, 1, 2, 0.95);
	add(&h, 2, 2, 0.95);
	assert_decision(scaler_decide(&h, &cf, 3, 3 * SEC), SCALE_HOLD, "no samples with 3 workers yet");
	add(&h, 3, 3, 0.90);
	assert_decision(scaler_decide(&h, &cf, 3, 3 * SEC), SCALE_HOLD, "mean load 0.90 > 0.75 for 1 of 2 samples");

	/* a sample with another count breaks the run */
	add(&h, 4, 4, 0.90);
	add(&h, 5, 3, 0.90);
	assert_decision(scaler_decide(&h, &cf, 3, 5 * SEC), SCALE_HOLD, "mean load 0.90 > 0.75 for 1 of 2 samples");

	/* samples older than the last change do not count, even with the same count */
	scaler_history_reset(&h);
	add(&h, 10, 3, 0.95);
	add(&h, 11, 3, 0.95);
	h.last_change_us = 12 * SEC; /* a caller that kept the samples */
	assert_decision(scaler_decide(&h, &cf, 3, 30 * SEC), SCALE_HOLD, "no samples with 3 workers yet");
	add(&h, 31, 3, 0.95);
	add(&h, 32, 3, 0.95);
	assert_decision(scaler_decide(&h, &cf, 3, 32 * SEC), SCALE_UP, "mean load 0.95 > 0.75 for 2 samples");
}

static void test_history_keeps_the_newest(void **state)
{
	ScalerHistory h = {0};
	for (int t = 1; t <= SCALER_HISTORY + 72; t++)
		add(&h, t, 2, 0.5);
	assert_int_equal(h.n, SCALER_HISTORY);
	assert_int_equal(h.samples[0].time_us, 73 * SEC);
	assert_int_equal(h.samples[SCALER_HISTORY - 1].time_us, (SCALER_HISTORY + 72) * SEC);

	/* the full history still decides on its newest samples */
	ScalerConfig cf = defaults();
	cf.down_samples = SCALER_HISTORY;
	for (int t = 1; t <= SCALER_HISTORY; t++)
		add(&h, 1000 + t, 3, 0.1);
	assert_decision(scaler_decide(&h, &cf, 3, 2000 * SEC), SCALE_DOWN,
	                "load 0.30 would fit on 2 workers (0.15 < 0.50) for 128 samples");
}

/*
 * A load model: total work W (in workers' worth of CPU) spread evenly over
 * n workers, each at most fully busy. One sample per second, decisions
 * carried out at once. Returns the number of changes; *n ends at the final
 * count, *reversals counts an up after a down or a down after an up.
 */
static int simulate(const ScalerConfig *cf, int *n, int ticks, double (*load)(int t), int *reversals)
{
	ScalerHistory h = {0};
	int changes = 0;
	ScaleDecision last = SCALE_HOLD;
	*reversals = 0;
	for (int t = 1; t <= ticks; t++) {
		double w = load(t);
		double busy = w / *n < 1.0 ? w / *n : 1.0;
		add(&h, t, *n, busy);
		ScalerResult r = scaler_decide(&h, cf, *n, t * SEC);
		if (r.decision == SCALE_HOLD)
			continue;
		if (last != SCALE_HOLD && last != r.decision)
			(*reversals)++;
		last = r.decision;
		*n += r.decision == SCALE_UP ? 1 : -1;
		scaler_note_change(&h, t * SEC);
		changes++;
	}
	return changes;
}

static double const_load; /* for load_const() */

static double load_const(int t)
{
	return const_load;
}

/* around the up threshold of 2 workers (1.5): 1.45 and 1.55 every other second */
static double load_flicker_up(int t)
{
	return t % 2 ? 1.55 : 1.45;
}

/* the same in blocks of 5 s: long enough to scale up */
static double load_blocks_up(int t)
{
	return (t / 5) % 2 ? 1.4 : 1.6;
}

/* around the down threshold of 3 workers (1.0 on two): 0.9 and 1.1 in blocks of 40 s */
static double load_blocks_down(int t)
{
	return (t / 40) % 2 ? 1.1 : 0.9;
}

/* a slow triangle wave between 0.2 and 3.2 workers' worth, period 10 min */
static double load_wave(int t)
{
	double phase = (t % 600) / 300.0; /* 0..2 */
	return 0.2 + 3.0 * (phase < 1.0 ? phase : 2.0 - phase);
}

static void test_no_oscillation(void **state)
{
	ScalerConfig cf = defaults();
	int n, rev, changes;

	n = 2;
	changes = simulate(&cf, &n, 400, load_flicker_up, &rev);
	assert_int_equal(changes, 0);
	assert_int_equal(n, 2);

	n = 2;
	changes = simulate(&cf, &n, 400, load_blocks_up, &rev);
	assert_int_equal(changes, 1);
	assert_int_equal(n, 3);

	n = 3;
	changes = simulate(&cf, &n, 400, load_blocks_down, &rev);
	assert_int_equal(changes, 1);
	assert_int_equal(n, 2);

	/* under any constant load the count moves one way only, and settles */
	for (int tenth = 0; tenth <= 45; tenth++) {
		const_load = tenth / 10.0;
		for (int start = 1; start <= 4; start++) {
			n = start;
			changes = simulate(&cf, &n, 300, load_const, &rev);
			assert_int_equal(rev, 0);
			assert_true(changes <= 3);
			/* settled: the last 100 ticks change nothing */
			int settled = n;
			assert_int_equal(simulate(&cf, &n, 100, load_const, &rev), 0);
			assert_int_equal(n, settled);
		}
	}

	/* a slow wave: follows it up and down, once per direction per period */
	n = 1;
	changes = simulate(&cf, &n, 1200, load_wave, &rev);
	assert_true(changes >= 4);
	assert_true(changes <= 2 * 3 * 2); /* at most 3 steps each way per period, 2 periods */
}

static void test_decision_names(void **state)
{
	assert_string_equal(scaler_decision_name(SCALE_HOLD), "hold");
	assert_string_equal(scaler_decision_name(SCALE_UP), "up");
	assert_string_equal(scaler_decision_name(SCALE_DOWN), "down");
	assert_string_equal(scaler_decision_name((ScaleDecision)7), "unknown");
}

/* The kind of each reason scaler_decide() writes: a few fixed words, never its figures. */
static void test_reason_kinds(void **state)
{
	static const char *const cases[][2] = {
	    {"below min_workers (1 < 2)", "below_min_workers"},
	    {"above max_workers (3 > 2)", "above_max_workers"},
	    {"cooldown: 3.2 s left", "cooldown"},
	    {"no samples with 2 workers yet", "no_samples"},
	    {"at max_workers (2): mean load 0.91 > 0.75", "at_max_workers"},
	    {"mean load 0.91 > 0.75 for 2 samples", "load_high"},
	    {"mean busy 0.91 > 0.75 for 1 of 2 samples", "load_high"},
	    {"at min_workers (1): load 0.20 would fit on 0 workers", "at_min_workers"},
	    {"load 0.20 would fit on 1 worker (0.20 < 0.50) for 30 samples", "load_low"},
	    {"throttled: the cgroup's CPU quota held the pooler back in 40% of periods", "throttled"},
	    {"no idle CPU for another worker (idle 0.03 of 2 CPUs)", "no_idle_cpu"},
	    {"at the 2 CPUs allowed: mean busy 0.70 without the run-queue wait (load 0.95)", "at_cpu_allowance"},
	    {"steady: mean load 0.03 on 2 workers", "steady"},
	    {"start", "start"},
	    {"", "other"},
	    {"something else", "other"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		assert_string_equal(scaler_reason_kind(cases[i][0]), cases[i][1]);
	/* and what scaler_decide() itself says with no samples and in cooldown */
	ScalerConfig cf = defaults();
	ScalerHistory h = {.n = 0};
	assert_string_equal(scaler_reason_kind(scaler_decide(&h, &cf, 1, 1000).reason), "no_samples");
}

/* ---- the saturation signal (busy + run-queue wait) from synthetic schedstat numbers ---- */

#define NS 1000000000ULL

static SchedCounters counters(double t_s, double busy_s, double wait_s)
{
	SchedCounters c = {(uint64_t)llround(t_s * NS), (uint64_t)llround(busy_s * NS), (uint64_t)llround(wait_s * NS)};
	return c;
}

static void assert_saturation(Saturation s, double busy, double wait, double load)
{
	assert_true(s.valid);
	assert_true(fabs(s.busy - busy) < 1e-9);
	assert_true(fabs(s.wait - wait) < 1e-9);
	assert_true(fabs(s.load - load) < 1e-9);
}

static void test_schedstat_parse(void **state)
{
	uint64_t run = 7, wait = 7;
	(void)state;
	assert_true(schedstat_parse("1436739 15693607 2\n", &run, &wait));
	assert_int_equal(run, 1436739);
	assert_int_equal(wait, 15693607);
	assert_true(schedstat_parse("0 0 0\n", &run, &wait));
	assert_int_equal(run, 0);
	assert_int_equal(wait, 0);
	assert_true(schedstat_parse("18446744073709551615 5 1", &run, &wait));
	assert_true(run == UINT64_MAX);
	assert_int_equal(wait, 5);
	assert_true(schedstat_parse("12 34", &run, &wait)); /* the timeslice count is not needed */

	/* refused, outputs untouched */
	run = wait = 99;
	assert_false(schedstat_parse("", &run, &wait));
	assert_false(schedstat_parse("123\n", &run, &wait));
	assert_false(schedstat_parse("abc 1 2\n", &run, &wait));
	assert_false(schedstat_parse("-1 2 3\n", &run, &wait));
	assert_false(schedstat_parse("1x 2 3\n", &run, &wait));
	assert_false(schedstat_parse("1 2y 3\n", &run, &wait));
	assert_false(schedstat_parse("99999999999999999999 1 1\n", &run, &wait)); /* above 64 bits */
	assert_false(schedstat_parse(NULL, &run, &wait));
	assert_int_equal(run, 99);
	assert_int_equal(wait, 99);
}

static void test_schedstat_read(void **state)
{
	char dir[256], path[300];
	uint64_t run = 0, wait = 0;
	(void)state;
	/* a file with synthetic numbers, read twice through one fd (the worker keeps it open) */
	unit_tmpdir("test_scaler_schedstat", dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/schedstat", dir);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs("5000000000 2500000000 812\n", f);
	fclose(f);
	int fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	assert_true(schedstat_read(fd, &run, &wait));
	assert_int_equal(run, 5000000000ULL);
	assert_int_equal(wait, 2500000000ULL);
	run = wait = 0;
	assert_true(schedstat_read(fd, &run, &wait));
	assert_int_equal(wait, 2500000000ULL);
	close(fd);
	/* an empty file, and no file at all */
	f = fopen(path, "w");
	assert_non_null(f);
	fclose(f);
	fd = open(path, O_RDONLY);
	assert_false(schedstat_read(fd, &run, &wait));
	close(fd);
	unit_rmtree(dir);
	assert_false(schedstat_read(-1, &run, &wait));
	assert_true(open(path, O_RDONLY) < 0);

	/* this process's own numbers, where the kernel has them: they never go back */
	fd = schedstat_open_self();
	if (fd >= 0) {
		uint64_t run2, wait2;
		assert_true(schedstat_read(fd, &run, &wait));
		for (volatile int i = 0; i < 1000000; i++)
			;
		assert_true(schedstat_read(fd, &run2, &wait2));
		assert_true(run2 >= run);
		assert_true(wait2 >= wait);
		close(fd);
	}
}

static void test_saturation_starved_worker(void **state)
{
	(void)state;
	/* runnable 90% of a second: 0.35 on a CPU, 0.55 in the run queue (the contended worker) */
	SchedCounters a = counters(100, 20, 10), b = counters(101, 20.35, 10.55);
	Saturation s = scaler_saturation(&a, &b);
	assert_saturation(s, 0.35, 0.55, 0.90);

	/* busy alone stays under the up threshold; busy + wait goes over it and scales up */
	ScalerConfig cf = defaults();
	ScalerHistory busy_only = {0}, with_wait = {0};
	for (int t = 1; t <= 3; t++) {
		add(&busy_only, t, 1, s.busy);
		add(&with_wait, t, 1, s.load);
	}
	assert_decision(scaler_decide(&busy_only, &cf, 1, 3 * SEC), SCALE_HOLD, "steady: mean load 0.35 on 1 worker");
	assert_decision(scaler_decide(&with_wait, &cf, 1, 3 * SEC), SCALE_UP, "mean load 0.90 > 0.75 for 2 samples");

	/* idle: nothing either way */
	a = counters(1, 0.5, 0.1);
	b = counters(3, 0.5, 0.1);
	assert_saturation(scaler_saturation(&a, &b), 0, 0, 0);
}

static void test_saturation_capped(void **state)
{
	(void)state;
	/* the sum is capped at 1 */
	SchedCounters a = counters(0, 0, 0), b = counters(2, 1.4, 1.2);
	assert_saturation(scaler_saturation(&a, &b), 0.7, 0.6, 1.0);
	/* each share too: the counters are read a moment after the clock */
	b = counters(1, 1.01, 1.3);
	assert_saturation(scaler_saturation(&a, &b), 1.0, 1.0, 1.0);
}

static void test_saturation_reset_and_wrap(void **state)
{
	(void)state;
	/* a respawned worker starts from small numbers: no reading, the new counters are the baseline */
	SchedCounters old = counters(500, 300, 120), fresh = counters(501, 0.01, 0.002);
	assert_false(scaler_saturation(&old, &fresh).valid);
	SchedCounters next = counters(502, 0.41, 0.302);
	assert_saturation(scaler_saturation(&fresh, &next), 0.4, 0.3, 0.7);

	/* only the wait went back: no reading either */
	SchedCounters w1 = counters(10, 5, 4), w2 = counters(11, 5.5, 1);
	assert_false(scaler_saturation(&w1, &w2).valid);

	/* a counter that wraps past 2^64 reads as a reset */
	SchedCounters near = {10 * NS, UINT64_MAX - 1000, 50}, past = {11 * NS, 500, 60};
	assert_false(scaler_saturation(&near, &past).valid);

	/* the clock did not move (the worker has not published since), or went back */
	SchedCounters same = counters(10, 6, 4);
	assert_false(scaler_saturation(&w1, &same).valid);
	SchedCounters earlier = counters(9, 6, 4);
	assert_false(scaler_saturation(&w1, &earlier).valid);
}

static void test_saturation_wait_unknown(void **state)
{
	(void)state;
	/* no schedstat (a kernel without it): the busy share alone */
	SchedCounters a = {0, 0, SHM_WAIT_UNKNOWN}, b = {NS, NS / 4, SHM_WAIT_UNKNOWN};
	assert_saturation(scaler_saturation(&a, &b), 0.25, 0, 0.25);
	/* missing at one end only: no wait for that interval, but a reading */
	SchedCounters c = counters(2, 0.5, 3);
	SchedCounters d = counters(3, 1.0, 3.5);
	assert_saturation(scaler_saturation(&b, &c), 0.25, 0, 0.25);
	assert_saturation(scaler_saturation(&c, &d), 0.5, 0.5, 1.0);
	SchedCounters e = {4 * NS, NS + NS / 4, SHM_WAIT_UNKNOWN};
	assert_saturation(scaler_saturation(&d, &e), 0.25, 0, 0.25);
}

/* Add a sample at second `t` of n workers each with this busy ratio and wait ratio. */
static void add_split(ScalerHistory *h, int64_t t, int n, double busy, double wait)
{
	double load = busy + wait > 1 ? 1 : busy + wait;
	ScalerSample s = scaler_sample_make_split(t * SEC, n, n * load, n * busy);
	scaler_history_add(h, &s);
}

static void test_wait_counts_only_below_the_cores(void **state)
{
	(void)state;
	ScalerConfig cf = defaults();
	cf.cores = 2;
	cf.max_workers = 8; /* an explicit max_workers above the cores */
	cf.cooldown_us = 0;

	/* 1 worker on 2 cores, starved by other processes: the wait counts */
	ScalerHistory h = {0};
	add_split(&h, 1, 1, 0.40, 0.55);
	add_split(&h, 2, 1, 0.40, 0.55);
	assert_decision(scaler_decide(&h, &cf, 1, 2 * SEC), SCALE_UP, "mean load 0.95 > 0.75 for 2 samples");

	/* 3 workers on 2 cores wait for each other: no more of them on the strength of that */
	scaler_history_reset(&h);
	add_split(&h, 3, 3, 0.66, 0.34);
	add_split(&h, 4, 3, 0.66, 0.34);
	assert_decision(scaler_decide(&h, &cf, 3, 4 * SEC), SCALE_HOLD,
	                "at the 2 CPUs allowed: mean busy 0.66 without the run-queue wait (load 1.00)");
	/* at the cores exactly, too */
	scaler_history_reset(&h);
	add_split(&h, 3, 2, 0.50, 0.45);
	add_split(&h, 4, 2, 0.50, 0.45);
	assert_decision(scaler_decide(&h, &cf, 2, 4 * SEC), SCALE_HOLD,
	                "at the 2 CPUs allowed: mean busy 0.50 without the run-queue wait (load 0.95)");
	/* CPU time alone above the threshold still adds, up to max_workers */
	scaler_history_reset(&h);
	add_split(&h, 5, 3, 0.90, 0.10);
	add_split(&h, 6, 3, 0.90, 0.10);
	assert_decision(scaler_decide(&h, &cf, 3, 6 * SEC), SCALE_UP, "mean busy 0.90 > 0.75 for 2 samples");
	/* the down rule keeps using the load: busy workers that wait are not drained */
	scaler_history_reset(&h);
	for (int t = 1; t <= 30; t++)
		add_split(&h, t, 3, 0.10, 0.30);
	assert_decision(scaler_decide(&h, &cf, 3, 30 * SEC), SCALE_HOLD, "steady: mean load 0.40 on 3 workers");
	/* no core count (0): the load counts whatever the count */
	cf.cores = 0;
	scaler_history_reset(&h);
	add_split(&h, 1, 3, 0.66, 0.34);
	add_split(&h, 2, 3, 0.66, 0.34);
	assert_decision(scaler_decide(&h, &cf, 3, 2 * SEC), SCALE_UP, "mean load 1.00 > 0.75 for 2 samples");
}

/* End to end: two synthetic /proc/<pid>/schedstat texts and the worker's clock, as the master reads them. */
static void test_saturation_from_schedstat_text(void **state)
{
	(void)state;
	SchedCounters a = {.time_ns = 7 * NS}, b = {.time_ns = 7 * NS + NS / 2};
	uint64_t run;
	assert_true(schedstat_parse("2000000000 1000000000 40\n", &run, &a.wait_ns));
	a.busy_ns = run;
	assert_true(schedstat_parse("2100000000 1350000000 52\n", &run, &b.wait_ns));
	b.busy_ns = run;
	assert_saturation(scaler_saturation(&a, &b), 0.2, 0.7, 0.9);
}

/* n workers each busy `busy` and waiting `wait`, with `idle` idle CPUs and a throttled share */
static void add_full(ScalerHistory *h, int64_t t, int n, double busy, double wait, double idle, double throttled)
{
	double load = busy + wait > 1 ? 1 : busy + wait;
	ScalerSample s = scaler_sample_make_full(t * SEC, n, n * load, n * busy, n * wait, idle, throttled);
	scaler_history_add(h, &s);
}

/* Rule 2: the run-queue wait counts only up to the idle CPU of the allowance. */
static void test_wait_counts_only_into_idle_cpu(void **state)
{
	ScalerConfig cf = defaults();
	cf.max_workers = 2;
	cf.cores = 2;
	cf.cpus = 2;
	ScalerHistory h = {0};
	/* PostgreSQL and the clients hold both CPUs: busy 0.4, wait 0.5, idle 0.03 */
	add_full(&h, 1, 1, 0.40, 0.50, 0.03, 0);
	add_full(&h, 2, 1, 0.40, 0.50, 0.03, 0);
	assert_decision(scaler_decide(&h, &cf, 1, 2 * SEC), SCALE_HOLD,
	                "no idle CPU for another worker (idle 0.03 of 2 CPUs)");
	/* a hog on one core, the other idle: the wait counts, a worker is added */
	scaler_history_reset(&h);
	add_full(&h, 3, 1, 0.40, 0.50, 0.95, 0);
	add_full(&h, 4, 1, 0.40, 0.50, 0.95, 0);
	ScalerResult r = scaler_decide(&h, &cf, 1, 4 * SEC);
	assert_decision(r, SCALE_UP, "mean load 0.90 > 0.75 for 2 samples");
	assert_int_equal(r.target, 2);
	/* idle unknown (no /proc/stat): the whole wait counts, as before */
	scaler_history_reset(&h);
	add_full(&h, 5, 1, 0.40, 0.50, -1, 0);
	add_full(&h, 6, 1, 0.40, 0.50, -1, 0);
	assert_int_equal(scaler_decide(&h, &cf, 1, 6 * SEC).decision, SCALE_UP);
	/* some idle CPU: the wait counts up to it (0.40 + 0.30 = 0.70, not above 0.75) */
	scaler_history_reset(&h);
	add_full(&h, 7, 1, 0.40, 0.50, 0.30, 0);
	add_full(&h, 8, 1, 0.40, 0.50, 0.30, 0);
	assert_decision(scaler_decide(&h, &cf, 1, 8 * SEC), SCALE_HOLD,
	                "no idle CPU for another worker (idle 0.30 of 2 CPUs)");
	/* a CPU-bound worker (no wait) scales whatever the idle CPU: its own time is the load */
	scaler_history_reset(&h);
	add_full(&h, 9, 1, 0.90, 0.0, 0.0, 0);
	add_full(&h, 10, 1, 0.90, 0.0, 0.0, 0);
	assert_int_equal(scaler_decide(&h, &cf, 1, 10 * SEC).decision, SCALE_UP);
	/* at the allowance (2 workers on 2 CPUs, max_workers 4): a third gets only idle CPU */
	cf.max_workers = 4;
	scaler_history_reset(&h);
	add_full(&h, 11, 2, 0.90, 0.10, 0.10, 0);
	add_full(&h, 12, 2, 0.90, 0.10, 0.10, 0);
	assert_decision(scaler_decide(&h, &cf, 2, 12 * SEC), SCALE_HOLD,
	                "no idle CPU for another worker (idle 0.10 of 2 CPUs)");
	scaler_history_reset(&h);
	add_full(&h, 13, 2, 0.90, 0.10, 0.50, 0);
	add_full(&h, 14, 2, 0.90, 0.10, 0.50, 0);
	ScalerResult r3 = scaler_decide(&h, &cf, 2, 14 * SEC);
	assert_decision(r3, SCALE_UP, "mean busy 0.90 > 0.75 for 2 samples");
	assert_int_equal(r3.target, 3); /* beyond the allowance: one at a time */
	/* at max_workers the reason names the bound, idle CPU or not */
	cf.max_workers = 2;
	scaler_history_reset(&h);
	add_full(&h, 15, 2, 0.90, 0.10, 0.0, 0);
	add_full(&h, 16, 2, 0.90, 0.10, 0.0, 0);
	assert_decision(scaler_decide(&h, &cf, 2, 16 * SEC), SCALE_HOLD, "at max_workers (2): mean busy 0.90 > 0.75");
}

/* Rule 2: a throttled cgroup gets no more workers, and says why. */
static void test_throttled_cgroup_holds(void **state)
{
	ScalerConfig cf = defaults();
	ScalerHistory h = {0};
	add_full(&h, 1, 1, 0.90, 0.0, 1.0, 0.35);
	add_full(&h, 2, 1, 0.90, 0.0, 1.0, 0.35);
	assert_decision(scaler_decide(&h, &cf, 1, 2 * SEC), SCALE_HOLD,
	                "throttled: the cgroup's CPU quota held the pooler back in 35% of periods");
	/* a little throttling (at most SCALER_THROTTLED_MAX) does not hold */
	scaler_history_reset(&h);
	add_full(&h, 3, 1, 0.90, 0.0, 1.0, 0.01);
	add_full(&h, 4, 1, 0.90, 0.0, 1.0, 0.01);
	assert_int_equal(scaler_decide(&h, &cf, 1, 4 * SEC).decision, SCALE_UP);
}

/* Rule 3: one step up to ceil(load / up threshold), clamped to the allowance and max_workers. */
static void test_proportional_step_up(void **state)
{
	ScalerConfig cf = defaults();
	cf.max_workers = 64;
	cf.cores = 64;
	ScalerHistory h = {0};
	/* 4 workers at 0.9 (idle CPU plenty): 3.6 / 0.75 = 4.8 -> 5 */
	add_full(&h, 1, 4, 0.9, 0.0, 40, 0);
	add_full(&h, 2, 4, 0.9, 0.0, 40, 0);
	ScalerResult r = scaler_decide(&h, &cf, 4, 2 * SEC);
	assert_int_equal(r.decision, SCALE_UP);
	assert_int_equal(r.target, 5);
	/* saturated (1.0 each): the demand beyond them is unknown, the count doubles */
	scaler_history_reset(&h);
	add_full(&h, 1, 4, 1.0, 0.0, 40, 0);
	add_full(&h, 2, 4, 1.0, 0.0, 40, 0);
	assert_int_equal(scaler_decide(&h, &cf, 4, 2 * SEC).target, 8);
	/* the smallest load of the run decides */
	scaler_history_reset(&h);
	add_full(&h, 3, 10, 0.90, 0.0, 40, 0);
	add_full(&h, 4, 10, 1.00, 0.0, 40, 0);
	r = scaler_decide(&h, &cf, 10, 4 * SEC);
	assert_int_equal(r.target, 12); /* 9.0 / 0.75 = 12 */
	/* clamped to the allowance ... */
	cf.cores = 11;
	assert_int_equal(scaler_decide(&h, &cf, 10, 4 * SEC).target, 11);
	/* ... and to max_workers */
	cf.cores = 64;
	cf.max_workers = 11;
	assert_int_equal(scaler_decide(&h, &cf, 10, 4 * SEC).target, 11);
	/* below min_workers: straight to it */
	cf = defaults();
	cf.min_workers = 3;
	scaler_history_reset(&h);
	r = scaler_decide(&h, &cf, 1, 5 * SEC);
	assert_int_equal(r.decision, SCALE_UP);
	assert_int_equal(r.target, 3);
}

/* Rule 3: down to what the load needs, at most halving, never below min_workers. */
static void test_proportional_step_down(void **state)
{
	ScalerConfig cf = defaults();
	cf.max_workers = 64;
	cf.down_samples = 2;
	ScalerHistory h = {0};
	/* 60 workers, load 5 in all: wants 7, but halving stops at 30 */
	add_full(&h, 1, 60, 5.0 / 60, 0, 50, 0);
	add_full(&h, 2, 60, 5.0 / 60, 0, 50, 0);
	ScalerResult r = scaler_decide(&h, &cf, 60, 2 * SEC);
	assert_int_equal(r.decision, SCALE_DOWN);
	assert_int_equal(r.target, 30);
	/* then 30 -> 15 -> 8 -> 7 */
	scaler_history_reset(&h);
	add_full(&h, 3, 30, 5.0 / 30, 0, 50, 0);
	add_full(&h, 4, 30, 5.0 / 30, 0, 50, 0);
	assert_int_equal(scaler_decide(&h, &cf, 30, 4 * SEC).target, 15);
	scaler_history_reset(&h);
	add_full(&h, 5, 15, 5.0 / 15, 0, 50, 0);
	add_full(&h, 6, 15, 5.0 / 15, 0, 50, 0);
	assert_int_equal(scaler_decide(&h, &cf, 15, 6 * SEC).target, 8);
	/* at 8 the load (5 / 7 = 0.71 on one fewer) no longer fits: it stays */
	scaler_history_reset(&h);
	add_full(&h, 7, 8, 5.0 / 8, 0, 50, 0);
	add_full(&h, 8, 8, 5.0 / 8, 0, 50, 0);
	assert_int_equal(scaler_decide(&h, &cf, 8, 8 * SEC).decision, SCALE_HOLD);
	/* the largest load of the run decides: 5.0 and 5.2 on 12 -> ceil(5.2 / 0.75) = 7 */
	scaler_history_reset(&h);
	add_full(&h, 7, 12, 5.2 / 12, 0, 50, 0);
	add_full(&h, 8, 12, 5.0 / 12, 0, 50, 0);
	r = scaler_decide(&h, &cf, 12, 8 * SEC);
	assert_int_equal(r.decision, SCALE_DOWN);
	assert_int_equal(r.target, 7);
	/* never below min_workers, always one fewer at least */
	cf.min_workers = 6;
	scaler_history_reset(&h);
	add_full(&h, 9, 12, 0.01, 0, 50, 0);
	add_full(&h, 10, 12, 0.01, 0, 50, 0);
	assert_int_equal(scaler_decide(&h, &cf, 12, 10 * SEC).target, 6);
	cf.min_workers = 1;
	scaler_history_reset(&h);
	add_full(&h, 11, 2, 0.01, 0, 50, 0);
	add_full(&h, 12, 2, 0.01, 0, 50, 0);
	assert_int_equal(scaler_decide(&h, &cf, 2, 12 * SEC).target, 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_sample_make),
	    cmocka_unit_test(test_up_after_exactly_n_samples),
	    cmocka_unit_test(test_dip_resets_the_count),
	    cmocka_unit_test(test_down_only_when_the_load_fits),
	    cmocka_unit_test(test_clamps),
	    cmocka_unit_test(test_cooldown),
	    cmocka_unit_test(test_other_worker_counts_ignored),
	    cmocka_unit_test(test_history_keeps_the_newest),
	    cmocka_unit_test(test_no_oscillation),
	    cmocka_unit_test(test_decision_names),
	    cmocka_unit_test(test_reason_kinds),
	    cmocka_unit_test(test_schedstat_parse),
	    cmocka_unit_test(test_schedstat_read),
	    cmocka_unit_test(test_saturation_starved_worker),
	    cmocka_unit_test(test_saturation_capped),
	    cmocka_unit_test(test_saturation_reset_and_wrap),
	    cmocka_unit_test(test_saturation_wait_unknown),
	    cmocka_unit_test(test_saturation_from_schedstat_text),
	    cmocka_unit_test(test_wait_counts_only_below_the_cores),
	    cmocka_unit_test(test_wait_counts_only_into_idle_cpu),
	    cmocka_unit_test(test_throttled_cgroup_holds),
	    cmocka_unit_test(test_proportional_step_up),
	    cmocka_unit_test(test_proportional_step_down),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
