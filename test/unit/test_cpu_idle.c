/*
 * Unit tests for cpu_idle.c: the idle CPUs of the allowance from two
 * /proc/stat readings, the quota's headroom and the throttled share from a
 * cgroup's cpu.stat (doc/workers.md, "Adding a worker only into idle CPU").
 */
#include "autoconfig.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "unit.h"

#include "master/cpu_idle.h"

static const char *stat0 = "cpu  100 0 100 800 0 0 0 0 0 0\n"
                           "cpu0 50 0 50 400 0 0 0 0 0 0\n"
                           "cpu1 50 0 50 400 0 0 0 0 0 0\n"
                           "intr 1 2 3\n";
/* 100 ticks later: cpu0 fully busy, cpu1 idle 90 of 100 (10 of them iowait) */
static const char *stat1 = "cpu  250 0 150 880 10 0 0 0 0 0\n"
                           "cpu0 150 0 50 400 0 0 0 0 0 0\n"
                           "cpu1 60 0 50 480 10 0 0 0 0 0\n"
                           "intr 1 2 3\n";

static CpuAllowance allowance(int ncpu)
{
	CpuAllowance a;
	memset(&a, 0, sizeof(a));
	CPU_ZERO(&a.allowed);
	for (int i = 0; i < ncpu; i++)
		CPU_SET(i, &a.allowed);
	a.cpus = ncpu;
	return a;
}

static void test_proc_stat_parse(void **state)
{
	CpuAllowance a = allowance(2);
	CpuReading r;
	assert_true(cpu_proc_stat_parse(stat0, &a.allowed, &r));
	assert_int_equal(r.n_cpus, 2);
	assert_int_equal(r.idle_ticks, 800);
	assert_int_equal(r.total_ticks, 1000);
	/* only the allowed CPUs */
	CPU_CLR(0, &a.allowed);
	assert_true(cpu_proc_stat_parse(stat1, &a.allowed, &r));
	assert_int_equal(r.n_cpus, 1);
	assert_int_equal(r.idle_ticks, 490);
	/* nothing allowed, or nothing readable */
	CPU_ZERO(&a.allowed);
	CPU_SET(7, &a.allowed);
	assert_false(cpu_proc_stat_parse(stat1, &a.allowed, &r));
	assert_false(cpu_proc_stat_parse("garbage\ncpuX 1 2\n", &a.allowed, &r));
}

static void test_idle_between(void **state)
{
	CpuAllowance a = allowance(2);
	CpuReading p, c;
	assert_true(cpu_proc_stat_parse(stat0, &a.allowed, &p));
	assert_true(cpu_proc_stat_parse(stat1, &a.allowed, &c));
	p.time_us = 0;
	c.time_us = 1000000;
	CpuIdle idle = cpu_idle_between(&p, &c, &a);
	assert_true(idle.valid);
	/* 90 idle ticks of 200: 0.45 of 2 CPUs = 0.9 */
	assert_true(idle.idle_cpus > 0.899 && idle.idle_cpus < 0.901);
	assert_true(idle.throttled == 0);
	/* no time between them: nothing to say */
	c.time_us = 0;
	assert_false(cpu_idle_between(&p, &c, &a).valid);
	/* a first reading without /proc/stat: unknown */
	c.time_us = 1000000;
	p.have_stat = false;
	assert_true(cpu_idle_between(&p, &c, &a).idle_cpus < 0);
}

static void test_quota_and_throttling(void **state)
{
	CpuAllowance a = allowance(2);
	a.quota_us = 50000;
	a.period_us = 100000;
	CpuReading p, c;
	assert_true(cpu_proc_stat_parse(stat0, &a.allowed, &p));
	assert_true(cpu_proc_stat_parse(stat1, &a.allowed, &c));
	p.time_us = 0;
	c.time_us = 1000000;
	cpu_cgroup_stat_parse("usage_usec 1000000\nuser_usec 1\nnr_periods 100\nnr_throttled 10\nthrottled_usec 5\n",
	                      &p);
	/* 0.45 s of CPU in 1 s against a quota of 0.5 CPU; 35 of 100 periods throttled */
	cpu_cgroup_stat_parse("usage_usec 1450000\nuser_usec 1\nnr_periods 200\nnr_throttled 45\nthrottled_usec 9\n",
	                      &c);
	assert_true(p.have_usage && p.have_throttle);
	CpuIdle idle = cpu_idle_between(&p, &c, &a);
	assert_true(idle.idle_cpus > 0.049 && idle.idle_cpus < 0.051);
	assert_true(idle.throttled > 0.349 && idle.throttled < 0.351);
	/* a v1 cpu.stat: throttling but no usage line */
	CpuReading v1 = {0};
	cpu_cgroup_stat_parse("nr_periods 7\nnr_throttled 3\nthrottled_time 123456\n", &v1);
	assert_true(v1.have_throttle);
	assert_false(v1.have_usage);
	assert_int_equal(v1.nr_throttled, 3);
	cpu_cgroup_stat_parse(NULL, &v1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_proc_stat_parse),
	    cmocka_unit_test(test_idle_between),
	    cmocka_unit_test(test_quota_and_throttling),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
