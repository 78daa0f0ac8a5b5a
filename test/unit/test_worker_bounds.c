/*
 * Unit tests for the worker settings' bounds (the ranges in config.c's
 * table and the checks across settings in worker_bounds.c), through
 * config_validate(): every refused value with its message, the
 * values at each bound that are accepted, and what resolving clamps (and
 * says it clamped) for a given core count.
 */
#include "autoconfig.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

#include <cmocka.h>

#include "common/config.h"
#include "common/worker_bounds.h"

static Config cf;

static int setup(void **state)
{
	(void)state;
	config_init(&cf);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	config_free(&cf);
	return 0;
}

static void set(const char *name, const char *value)
{
	char e[CF_ERRMSG_LEN];
	if (!config_set(&cf, name, value, e, sizeof(e)))
		fail_msg("config_set(%s, %s): %s", name, value, e);
}

static void expect_refused(const char *name, const char *value, const char *want)
{
	char e[256] = "";
	set(name, value);
	assert_false(config_validate(&cf, e, sizeof(e)));
	assert_string_equal(e, want);
	config_free(&cf);
	config_init(&cf);
}

static void expect_accepted(const char *name, const char *value)
{
	char e[256] = "";
	set(name, value);
	if (!config_validate(&cf, e, sizeof(e)))
		fail_msg("%s = %s refused: %s", name, value, e);
	config_free(&cf);
	config_init(&cf);
}

static void test_defaults_accepted(void **state)
{
	char e[256];
	(void)state;
	assert_true(worker_bounds_check(&cf.g, e, sizeof(e)));
	assert_int_equal(WORKERS_MAX, 64);
	assert_int_equal(WORKER_SAMPLES_MAX, 128);
}

static void test_refused(void **state)
{
	(void)state;
	expect_refused("min_workers", "0", "min_workers must be between 1 and 64 (got 0)");
	expect_refused("min_workers", "70", "min_workers must be between 1 and 64 (got 70)");
	expect_refused("min_workers", "65", "min_workers must be between 1 and 64 (got 65)");
	expect_refused("max_workers", "-1", "max_workers must be at least 0 (got -1)");
	expect_refused("worker_scale_up_threshold", "0",
	               "worker_scale_up_threshold must be above 0 and at most 1 (got 0)");
	expect_refused("worker_scale_up_threshold", "1.5",
	               "worker_scale_up_threshold must be above 0 and at most 1 (got 1.5)");
	expect_refused("worker_scale_down_threshold", "0",
	               "worker_scale_down_threshold must be above 0 and at most 1 (got 0)");
	expect_refused(
	    "worker_scale_down_threshold", "0.75",
	    "worker_scale_down_threshold must be above 0 and below worker_scale_up_threshold (0.75) (got 0.75)");
	expect_refused("worker_scale_up_samples", "0", "worker_scale_up_samples must be between 1 and 128 (got 0)");
	expect_refused("worker_scale_up_samples", "129", "worker_scale_up_samples must be between 1 and 128 (got 129)");
	expect_refused("worker_scale_down_samples", "200",
	               "worker_scale_down_samples must be between 1 and 128 (got 200)");
	expect_refused("worker_scale_down_samples", "-3",
	               "worker_scale_down_samples must be between 1 and 128 (got -3)");
	expect_refused("worker_scale_interval", "0",
	               "worker_scale_interval must be above 0 and at most 2147483647 seconds (got 0)");

	/* across settings: min_workers above an explicit max_workers */
	char e[256];
	set("max_workers", "2");
	set("min_workers", "3");
	assert_false(worker_bounds_check(&cf.g, e, sizeof(e)));
	assert_string_equal(e, "min_workers must be between 1 and max_workers (2) (got 3)");
	/* NaN fails too; no buffer: still false, no crash */
	cf.g.min_workers = 1;
	cf.g.worker_scale_up_threshold = NAN;
	assert_false(config_validate(&cf, e, sizeof(e)));
	assert_string_equal(e, "worker_scale_up_threshold must be above 0 and at most 1 (got nan)");
	assert_false(config_validate(&cf, NULL, 0));
	/* the check across thresholds alone */
	cf.g.worker_scale_up_threshold = 0.5;
	cf.g.worker_scale_down_threshold = NAN;
	assert_false(worker_bounds_check(&cf.g, e, sizeof(e)));
	assert_false(worker_bounds_check(&cf.g, NULL, 0));
}

static void test_accepted_at_the_bounds(void **state)
{
	(void)state;
	expect_accepted("min_workers", "1");
	expect_accepted("min_workers", "64");
	expect_accepted("max_workers", "0");
	expect_accepted("max_workers", "1000"); /* clamped, not refused */
	expect_accepted("worker_scale_up_threshold", "1");
	expect_accepted("worker_scale_down_threshold", "0.01");
	expect_accepted("worker_scale_up_samples", "1");
	expect_accepted("worker_scale_up_samples", "128");
	expect_accepted("worker_scale_down_samples", "128");
	expect_accepted("worker_scale_interval", "0.1");
	expect_accepted("worker_scale_cooldown", "0");
}

static void expect_resolved(int cores, int min, int max, const char *note)
{
	WorkerBounds b = worker_bounds_resolve(&cf.g, cores, NULL);
	assert_int_equal(b.min_workers, min);
	assert_int_equal(b.max_workers, max);
	assert_string_equal(b.note, note);
}

static void test_resolve(void **state)
{
	(void)state;
	/* taken as they are: nothing to say */
	expect_resolved(4, 1, 4, "");
	set("max_workers", "8");
	expect_resolved(4, 1, 8, "");
	set("min_workers", "2");
	set("max_workers", "0");
	expect_resolved(2, 2, 2, "");

	/* max_workers above the worker table */
	set("min_workers", "1");
	set("max_workers", "100");
	expect_resolved(2, 1, 64, "max_workers = 100 clamped to 64, the size of the worker table");
	set("max_workers", "0");
	expect_resolved(96, 1, 64, "max_workers = 0 (96 physical cores) clamped to 64, the size of the worker table");

	/* min_workers above the cores */
	set("min_workers", "4");
	expect_resolved(2, 4, 4, "max_workers = 0 (2 physical cores) raised to min_workers (4)");
	set("max_workers", "6");
	expect_resolved(2, 4, 6, "min_workers = 4 is above the 2 physical cores; running at least 4 workers anyway");
	set("min_workers", "64");
	set("max_workers", "70");
	expect_resolved(2, 64, 64,
	                "max_workers = 70 clamped to 64, the size of the worker table; min_workers = 64 is above "
	                "the 2 physical cores; running at least 64 workers anyway");

	/* an allowance other than the cores is named in the note */
	set("min_workers", "4");
	set("max_workers", "0");
	WorkerBounds q = worker_bounds_resolve(&cf.g, 2, "cgroup quota of 1.5 CPUs");
	assert_int_equal(q.max_workers, 4);
	assert_string_equal(q.note, "max_workers = 0 (cgroup quota of 1.5 CPUs) raised to min_workers (4)");
	set("max_workers", "4");
	q = worker_bounds_resolve(&cf.g, 1, "1 CPU of the cgroup cpuset");
	assert_string_equal(
	    q.note, "min_workers = 4 is above the 1 CPU of the cgroup cpuset; running at least 4 workers anyway");

	/* values the loader refuses still cannot overflow the worker table */
	cf.g.min_workers = 70;
	cf.g.max_workers = 0;
	WorkerBounds b = worker_bounds_resolve(&cf.g, 2, NULL);
	assert_int_equal(b.min_workers, 64);
	assert_int_equal(b.max_workers, 64);
	cf.g.min_workers = 0;
	b = worker_bounds_resolve(&cf.g, 0, NULL);
	assert_int_equal(b.min_workers, 1);
	assert_int_equal(b.max_workers, 1);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
	const struct CMUnitTest tests[] = {
	    T(test_defaults_accepted),
	    T(test_refused),
	    T(test_accepted_at_the_bounds),
	    T(test_resolve),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
