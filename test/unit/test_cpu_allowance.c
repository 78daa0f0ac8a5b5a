/*
 * Unit tests for cpu_allowance.c (doc/workers.md, "The CPU allowance"): the
 * list and cpu.max parsers, and the allowance read from fixture trees (a
 * sysfs topology, /proc/self/cgroup and mountinfo, cgroup v1 and v2 files)
 * made in a temporary directory: quotas, nested limits, cpusets,
 * hyperthread siblings, the affinity mask, and which limit is named.
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
#include <unistd.h>

#include <cmocka.h>

#include "unit.h"

#include "master/cpu_allowance.h"

/* ---- fixture trees ---- */

/* Write root/rel, making its directories. */
static void put(const char *root, const char *rel, const char *text)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", root, rel);
	for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')) != NULL; p++) {
		*p = '\0';
		assert_true(mkdir(path, 0755) == 0 || access(path, F_OK) == 0);
		*p = '/';
	}
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	assert_int_equal(fclose(f), 0);
}

/* a CPU with its package and core id */
static void put_cpu(const char *root, int cpu, const char *package, const char *core)
{
	char rel[128];
	snprintf(rel, sizeof(rel), "sys/devices/system/cpu/cpu%d/topology/physical_package_id", cpu);
	put(root, rel, package);
	snprintf(rel, sizeof(rel), "sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
	put(root, rel, core);
}

/* n logical CPUs on `cores` cores of package 0: CPU c is on core c % cores (its siblings are c +- cores) */
static void machine(const char *root, int n, int cores)
{
	for (int c = 0; c < n; c++) {
		char core[16];
		snprintf(core, sizeof(core), "%d\n", c % cores);
		put_cpu(root, c, "0\n", core);
	}
	put(root, "sys/devices/system/cpu/online", "0-63\n"); /* not a CPU entry: ignored */
	put(root, "sys/devices/system/cpu/cpufreq/policy0/x", "1\n");
}

static char root[64];

static int setup(void **state)
{
	(void)state;
	unit_tmpdir("test_cpu_allowance", root, sizeof(root));
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	unit_rmtree(root);
	return 0;
}

/* The allowance under the fixture root, with an affinity mask of the CPUs in `mask` ("" = none). */
static CpuAllowance read_with(const char *mask)
{
	CpuAllowance a;
	cpu_set_t set;
	bool have = mask[0] != '\0';
	if (have)
		assert_true(cpu_list_parse(mask, &set));
	cpu_allowance_read(root, have ? &set : NULL, &a);
	return a;
}

static void expect(const CpuAllowance *a, double cpus, int max_workers, CpusFrom from)
{
	if (fabs(a->cpus - cpus) > 1e-9 || a->max_workers != max_workers || a->from != from)
		fail_msg("got cpus %g, max_workers %d, from %s; expected %g, %d, %s", a->cpus, a->max_workers,
		         cpus_from_name(a->from), cpus, max_workers, cpus_from_name(from));
}

static int sysconf_cpus(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : (int)n;
}

/* A cgroup v2 host: the process in /kubepods/pod1/ctr, the unified hierarchy at /sys/fs/cgroup. */
static void cgroup_v2(void)
{
	put(root, "proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
	put(root, "proc/self/mountinfo",
	    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
	    "31 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
	    "rw,nsdelegate,memory_recursiveprot\n");
	put(root, "sys/fs/cgroup/cpu.stat", "usage_usec 0\n"); /* the root has no cpu.max */
	put(root, "sys/fs/cgroup/kubepods/cpu.max", "max 100000\n");
	put(root, "sys/fs/cgroup/kubepods/pod1/cpu.max", "max 100000\n");
	put(root, "sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "max 100000\n");
}

/* A cgroup v1 host: cpu,cpuacct and cpuset hierarchies, the process in /docker/abc of both. */
static void cgroup_v1(void)
{
	put(root, "proc/self/cgroup",
	    "12:pids:/docker/abc\n"
	    "4:cpu,cpuacct:/docker/abc\n"
	    "3:cpuset:/docker/abc\n"
	    "1:name=systemd:/docker/abc\n"
	    "0::/\n");
	put(root, "proc/self/mountinfo",
	    "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"
	    "31 22 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
	    "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:10 - cgroup cgroup rw,cpu,cpuacct\n"
	    "33 31 0:30 / /sys/fs/cgroup/cpuset rw,relatime shared:11 - cgroup cgroup rw,cpuset\n"
	    "34 31 0:31 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
	    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n");
	put(root, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
	put(root, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
	put(root, "sys/fs/cgroup/cpu,cpuacct/docker/cpu.cfs_quota_us", "-1\n");
	put(root, "sys/fs/cgroup/cpu,cpuacct/docker/cpu.cfs_period_us", "100000\n");
	put(root, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n");
	put(root, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
	put(root, "sys/fs/cgroup/cpuset/cpuset.cpus", "0-3\n");
	put(root, "sys/fs/cgroup/cpuset/docker/abc/cpuset.cpus", "0-3\n");
}

/* ---- parsers ---- */

static void test_cpu_list_parse(void **state)
{
	(void)state;
	cpu_set_t s;
	assert_true(cpu_list_parse("0-3,8-11\n", &s));
	assert_int_equal(CPU_COUNT(&s), 8);
	for (int c = 0; c < 16; c++)
		assert_int_equal(CPU_ISSET(c, &s) != 0, c <= 3 || (c >= 8 && c <= 11));
	assert_true(cpu_list_parse("5", &s));
	assert_int_equal(CPU_COUNT(&s), 1);
	assert_true(CPU_ISSET(5, &s));
	assert_true(cpu_list_parse("0,2,4-5\n", &s));
	assert_int_equal(CPU_COUNT(&s), 4);
	assert_true(cpu_list_parse("7-7", &s));
	assert_int_equal(CPU_COUNT(&s), 1);

	/* refused: empty (a cpuset without CPUs says nothing), reversed, garbage, beyond cpu_set_t */
	assert_false(cpu_list_parse("", &s));
	assert_false(cpu_list_parse("\n", &s));
	assert_false(cpu_list_parse("3-1", &s));
	assert_false(cpu_list_parse("1-", &s));
	assert_false(cpu_list_parse("a", &s));
	assert_false(cpu_list_parse("0 1", &s));
	assert_false(cpu_list_parse("-1", &s));
	assert_false(cpu_list_parse("0-99999", &s));
	assert_false(cpu_list_parse(NULL, &s));
}

static void test_cpu_max_parse(void **state)
{
	(void)state;
	int64_t q = 7, p = 7;
	assert_true(cpu_max_parse("max 100000\n", &q, &p));
	assert_int_equal(q, 0);
	assert_int_equal(p, 100000);
	assert_true(cpu_max_parse("150000 100000\n", &q, &p));
	assert_int_equal(q, 150000);
	assert_int_equal(p, 100000);
	assert_true(cpu_max_parse("50000 200000", &q, &p));
	assert_int_equal(q, 50000);
	assert_int_equal(p, 200000);
	assert_true(cpu_max_parse("max", &q, &p)); /* the period left at the kernel's default */
	assert_int_equal(q, 0);

	assert_false(cpu_max_parse("", &q, &p));
	assert_false(cpu_max_parse("abc 100000", &q, &p));
	assert_false(cpu_max_parse("150000 0", &q, &p));
	assert_false(cpu_max_parse("-5 100000", &q, &p));
	assert_false(cpu_max_parse("150000 100000 7", &q, &p));
	assert_false(cpu_max_parse(NULL, &q, &p));
}

/* ---- the physical cores ---- */

static void test_physical_cores(void **state)
{
	(void)state;
	/* 4 logical CPUs = 2 cores with a hyperthread sibling each */
	put_cpu(root, 0, "0\n", "0\n");
	put_cpu(root, 1, "0\n", "1\n");
	put_cpu(root, 2, "0\n", "0\n");
	put_cpu(root, 3, "0\n", "1\n");
	put(root, "sys/devices/system/cpu/cpu1/online", "1\n");
	put(root, "sys/devices/system/cpu/cpuidle/current_driver", "none\n");
	put(root, "sys/devices/system/cpu/possible", "0-7\n");
	CpuAllowance a = read_with("");
	expect(&a, 2, 2, CPUS_FROM_CORES);
	assert_int_equal(a.online, 4);
	/* the workers' CPUs: the lowest of each core, in CPU order */
	assert_int_equal(a.n_core_cpus, 2);
	assert_int_equal(a.core_cpus[0], 0);
	assert_int_equal(a.core_cpus[1], 1);

	/* an offline CPU does not count (its topology may be stale) */
	put_cpu(root, 4, "0\n", "7\n");
	put(root, "sys/devices/system/cpu/cpu4/online", "0\n");
	a = read_with("");
	expect(&a, 2, 2, CPUS_FROM_CORES);
	assert_int_equal(a.online, 4);
	put(root, "sys/devices/system/cpu/cpu4/online", "1\n");
	a = read_with("");
	expect(&a, 3, 3, CPUS_FROM_CORES);

	/* the same core id in another package is another core */
	put_cpu(root, 5, "1\n", "0\n");
	put_cpu(root, 6, "1\n", "0\n");
	a = read_with("");
	expect(&a, 4, 4, CPUS_FROM_CORES);
	/* ... and in another die of the same package */
	put(root, "sys/devices/system/cpu/cpu6/topology/die_id", "1\n");
	a = read_with("");
	expect(&a, 5, 5, CPUS_FROM_CORES);

	/* an online CPU without topology: do not guess, every CPU is a core */
	put(root, "sys/devices/system/cpu/cpu7/online", "1\n");
	a = read_with("");
	expect(&a, 8, 8, CPUS_FROM_CORES);
	/* ... or without its package */
	put(root, "sys/devices/system/cpu/cpu7/topology/core_id", "9\n");
	a = read_with("");
	expect(&a, 8, 8, CPUS_FROM_CORES);
	/* ... but only where it is allowed: outside the mask, it does not matter */
	a = read_with("0-6");
	expect(&a, 5, 5, CPUS_FROM_CORES);
	put(root, "sys/devices/system/cpu/cpu7/topology/physical_package_id", "0\n");
	a = read_with("");
	expect(&a, 6, 6, CPUS_FROM_CORES);
}

static void test_topology_unreadable(void **state)
{
	(void)state;
	/* a garbage id: every CPU is a core */
	put_cpu(root, 0, "0\n", "zero\n");
	put_cpu(root, 1, "0\n", "0\n");
	CpuAllowance a = read_with("");
	expect(&a, 2, 2, CPUS_FROM_CORES);
	unit_rmtree(root);

	/* no sysfs at all: the CPUs the C library counts */
	unit_tmpdir("test_cpu_allowance", root, sizeof(root));
	a = read_with("");
	expect(&a, sysconf_cpus(), sysconf_cpus(), CPUS_FROM_CORES);
}

static void test_hyperthreads_in_a_cpuset(void **state)
{
	(void)state;
	/* 16 logical CPUs on 8 cores: CPU c and c + 8 are siblings */
	machine(root, 16, 8);
	cgroup_v2();
	CpuAllowance a = read_with("");
	expect(&a, 8, 8, CPUS_FROM_CORES);

	/* 8 CPUs of the cpuset, 4 cores among them: the siblings count once */
	put(root, "sys/fs/cgroup/kubepods/pod1/ctr/cpuset.cpus.effective", "0-3,8-11\n");
	a = read_with("");
	expect(&a, 4, 4, CPUS_FROM_CORES);
	assert_int_equal(a.cpuset, 8);
	assert_int_equal(a.n_core_cpus, 4);
	for (int i = 0; i < 4; i++)
		assert_int_equal(a.core_cpus[i], i);

	/* 4 CPUs on 4 cores: the cpuset is what limits (a tie names it) */
	put(root, "sys/fs/cgroup/kubepods/pod1/ctr/cpuset.cpus.effective", "4-7\n");
	a = read_with("");
	expect(&a, 4, 4, CPUS_FROM_CPUSET);
	/* the workers are pinned to the allowed CPUs */
	assert_int_equal(a.n_core_cpus, 4);
	for (int i = 0; i < 4; i++)
		assert_int_equal(a.core_cpus[i], 4 + i);

	/* siblings only: the lowest allowed one stands for the core */
	put(root, "sys/fs/cgroup/kubepods/pod1/ctr/cpuset.cpus.effective", "9,1\n");
	a = read_with("");
	expect(&a, 1, 1, CPUS_FROM_CORES);
	assert_int_equal(a.core_cpus[0], 1);
	put(root, "sys/fs/cgroup/kubepods/pod1/ctr/cpuset.cpus.effective", "9,10\n");
	a = read_with("");
	expect(&a, 2, 2, CPUS_FROM_CPUSET);
	assert_int_equal(a.core_cpus[0], 9);
	assert_int_equal(a.core_cpus[1], 10);
}

/* ---- cgroup v2 ---- */

static void test_v2_quota(void **state)
{
	(void)state;
	machine(root, 4, 4);
	cgroup_v2();
	/* "max" everywhere: no quota */
	CpuAllowance a = read_with("");
	expect(&a, 4, 4, CPUS_FROM_CORES);
	assert_int_equal(a.quota_us, 0);

	/* resources.limits.cpu: "1500m" */
	put(root, "sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "150000 100000\n");
	a = read_with("");
	expect(&a, 1.5, 2, CPUS_FROM_QUOTA);
	assert_int_equal(a.quota_us, 150000);
	assert_int_equal(a.period_us, 100000);

	/* half a CPU: still one worker */
	put(root, "sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "50000 100000\n");
	a = read_with("");
	expect(&a, 0.5, 1, CPUS_FROM_QUOTA);

	/* a quota of exactly the cores names the quota; above the cores, the cores */
	put(root, "sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "400000 100000\n");
	a = read_with("");
	expect(&a, 4, 4, CPUS_FROM_QUOTA);
	put(root, "sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "800000 100000\n");
	a = read_with("");
	expect(&a, 4, 4, CPUS_FROM_CORES);

	/* a malformed file is no limit */
	put(root, "sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "lots\n");
	a = read_with("");
	expect(&a, 4, 4, CPUS_FROM_CORES);
}

static void test_v2_nested_quota(void **state)
{
	(void)state;
	machine(root, 8, 8);
	cgroup_v2();
	/* the pod is limited, the container not: the pod's limit holds */
	put(root, "sys/fs/cgroup/kubepods/pod1/cpu.max", "200000 100000\n");
	CpuAllowance a = read_with("");
	expect(&a, 2, 2, CPUS_FROM_QUOTA);
	/* a limit further up, too */
	put(root, "sys/fs/cgroup/kubepods/pod1/cpu.max", "max 100000\n");
	put(root, "sys/fs/cgroup/kubepods/cpu.max", "300000 100000\n");
	a = read_with("");
	expect(&a, 3, 3, CPUS_FROM_QUOTA);
	/* both limited: the smaller counts, wherever it is */
	put(root, "sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "500000 100000\n");
	a = read_with("");
	expect(&a, 3, 3, CPUS_FROM_QUOTA);
	put(root, "sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "25000 10000\n");
	a = read_with("");
	expect(&a, 2.5, 3, CPUS_FROM_QUOTA);
}

static void test_v2_in_a_namespace(void **state)
{
	(void)state;
	/* a container with its own cgroup namespace: it sees "/" and the mount's root is its cgroup */
	machine(root, 4, 4);
	put(root, "proc/self/cgroup", "0::/\n");
	put(root, "proc/self/mountinfo",
	    "500 400 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw\n");
	put(root, "sys/fs/cgroup/cpu.max", "100000 100000\n");
	put(root, "sys/fs/cgroup/cpuset.cpus.effective", "0-3\n");
	CpuAllowance a = read_with("");
	expect(&a, 1, 1, CPUS_FROM_QUOTA);

	/* without a namespace, the mount's root is a bind mount of the cgroup: the files are at the mount point */
	put(root, "proc/self/cgroup", "0::/system.slice/pgbouncer.service\n");
	put(root, "proc/self/mountinfo",
	    "500 400 0:26 /system.slice/pgbouncer.service /sys/fs/cgroup rw - cgroup2 cgroup rw\n");
	put(root, "sys/fs/cgroup/cpu.max", "max 100000\n");
	put(root, "sys/fs/cgroup/cpuset.cpus.effective", "2\n");
	a = read_with("");
	expect(&a, 1, 1, CPUS_FROM_CPUSET);
	assert_int_equal(a.core_cpus[0], 2);

	/* a mount point with a space in it (mountinfo writes \040) */
	put(root, "proc/self/mountinfo", "500 400 0:26 / /cg\\040v2 rw - cgroup2 cgroup rw\n");
	put(root, "proc/self/cgroup", "0::/x\n");
	put(root, "cg v2/x/cpu.max", "120000 100000\n");
	a = read_with("");
	expect(&a, 1.2, 2, CPUS_FROM_QUOTA);
}

/* ---- cgroup v1 ---- */

static void test_v1_quota(void **state)
{
	(void)state;
	machine(root, 4, 4);
	cgroup_v1();
	/* -1 everywhere: no quota; the cpuset has every CPU: no limit either */
	CpuAllowance a = read_with("");
	expect(&a, 4, 4, CPUS_FROM_CORES);

	put(root, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "50000\n");
	a = read_with("");
	expect(&a, 0.5, 1, CPUS_FROM_QUOTA);
	/* another period */
	put(root, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "75000\n");
	put(root, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "50000\n");
	a = read_with("");
	expect(&a, 1.5, 2, CPUS_FROM_QUOTA);

	/* the parent limited, the child not */
	put(root, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n");
	put(root, "sys/fs/cgroup/cpu,cpuacct/docker/cpu.cfs_quota_us", "300000\n");
	a = read_with("");
	expect(&a, 3, 3, CPUS_FROM_QUOTA);
}

static void test_v1_cpuset(void **state)
{
	(void)state;
	machine(root, 4, 4);
	cgroup_v1();
	put(root, "sys/fs/cgroup/cpuset/docker/abc/cpuset.cpus", "0\n");
	CpuAllowance a = read_with("");
	expect(&a, 1, 1, CPUS_FROM_CPUSET);
	/* the kernel narrows the affinity mask to the cpuset: the cpuset is still named */
	a = read_with("0");
	expect(&a, 1, 1, CPUS_FROM_CPUSET);
	/* the effective CPUs, where the kernel has them, win over the configured ones */
	put(root, "sys/fs/cgroup/cpuset/docker/abc/cpuset.cpus", "0-2\n");
	put(root, "sys/fs/cgroup/cpuset/docker/abc/cpuset.effective_cpus", "1-2\n");
	a = read_with("");
	expect(&a, 2, 2, CPUS_FROM_CPUSET);
	assert_int_equal(a.core_cpus[0], 1);
	/* a quota below the cpuset */
	put(root, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "50000\n");
	a = read_with("");
	expect(&a, 0.5, 1, CPUS_FROM_QUOTA);

	/* a container without its own namespace: the hierarchies' roots are its cgroup */
	put(root, "proc/self/mountinfo",
	    "32 31 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct\n"
	    "33 31 0:30 /docker/abc /sys/fs/cgroup/cpuset ro - cgroup cgroup rw,cpuset\n");
	put(root, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
	put(root, "sys/fs/cgroup/cpuset/cpuset.cpus", "3\n");
	a = read_with("");
	expect(&a, 1, 1, CPUS_FROM_CPUSET);
	assert_int_equal(a.core_cpus[0], 3);
	/* a mount of another cgroup does not fit this process's: no limit from it */
	put(root, "proc/self/mountinfo", "33 31 0:30 /other /sys/fs/cgroup/cpuset ro - cgroup cgroup rw,cpuset\n");
	a = read_with("");
	expect(&a, 4, 4, CPUS_FROM_CORES);
}

static void test_v1_and_v2_together(void **state)
{
	(void)state;
	/* a hybrid host: the fewest of everything counts */
	machine(root, 8, 8);
	cgroup_v1();
	put(root, "sys/fs/cgroup/unified/cpu.max", "200000 100000\n"); /* v2's root: "0::/" */
	put(root, "sys/fs/cgroup/cpuset/docker/abc/cpuset.cpus", "0-2\n");
	CpuAllowance a = read_with("");
	expect(&a, 2, 2, CPUS_FROM_QUOTA);
	put(root, "sys/fs/cgroup/unified/cpu.max", "max 100000\n");
	a = read_with("");
	expect(&a, 3, 3, CPUS_FROM_CPUSET);
}

/* ---- the affinity mask ---- */

static void test_affinity(void **state)
{
	(void)state;
	machine(root, 4, 4);
	/* no cgroup files at all */
	CpuAllowance a = read_with("0");
	expect(&a, 1, 1, CPUS_FROM_AFFINITY);
	assert_int_equal(a.core_cpus[0], 0);
	a = read_with("1,3");
	expect(&a, 2, 2, CPUS_FROM_AFFINITY);
	assert_int_equal(a.core_cpus[0], 1);
	assert_int_equal(a.core_cpus[1], 3);
	/* a mask with every CPU is no limit */
	a = read_with("0-3");
	expect(&a, 4, 4, CPUS_FROM_CORES);
	a = read_with("0-63");
	expect(&a, 4, 4, CPUS_FROM_CORES);
	/* a mask of no online CPU says nothing */
	a = read_with("40");
	expect(&a, 4, 4, CPUS_FROM_CORES);

	/* narrower than the cpuset: the mask is named */
	cgroup_v1();
	put(root, "sys/fs/cgroup/cpuset/docker/abc/cpuset.cpus", "0-2\n");
	a = read_with("2");
	expect(&a, 1, 1, CPUS_FROM_AFFINITY);
	assert_int_equal(a.core_cpus[0], 2);
	/* two hyperthread siblings in the mask are one core */
	unit_rmtree(root);
	unit_tmpdir("test_cpu_allowance", root, sizeof(root));
	machine(root, 4, 2);
	a = read_with("1,3");
	expect(&a, 1, 1, CPUS_FROM_CORES);
}

static void test_describe(void **state)
{
	(void)state;
	char buf[96];
	CpuAllowance a = {.cpus = 2, .max_workers = 2, .from = CPUS_FROM_CORES};
	cpu_allowance_describe(&a, buf, sizeof(buf));
	assert_string_equal(buf, "2 physical cores");
	a.cpus = 1;
	cpu_allowance_describe(&a, buf, sizeof(buf));
	assert_string_equal(buf, "1 physical core");
	a.from = CPUS_FROM_AFFINITY;
	cpu_allowance_describe(&a, buf, sizeof(buf));
	assert_string_equal(buf, "1 CPU of the affinity mask");
	a.from = CPUS_FROM_CPUSET;
	a.cpus = 3;
	cpu_allowance_describe(&a, buf, sizeof(buf));
	assert_string_equal(buf, "3 CPUs of the cgroup cpuset");
	a.from = CPUS_FROM_QUOTA;
	a.cpus = 1.5;
	cpu_allowance_describe(&a, buf, sizeof(buf));
	assert_string_equal(buf, "cgroup quota of 1.5 CPUs");
	a.cpus = 0.5;
	cpu_allowance_describe(&a, buf, sizeof(buf));
	assert_string_equal(buf, "cgroup quota of 0.5 CPU");
	a.cpus = 1.0 / 3;
	cpu_allowance_describe(&a, buf, sizeof(buf));
	assert_string_equal(buf, "cgroup quota of 0.333 CPU");
	assert_string_equal(cpus_from_name(CPUS_FROM_CORES), "physical cores");
	assert_string_equal(cpus_from_name(CPUS_FROM_AFFINITY), "affinity");
	assert_string_equal(cpus_from_name(CPUS_FROM_CPUSET), "cgroup cpuset");
	assert_string_equal(cpus_from_name(CPUS_FROM_QUOTA), "cgroup quota");
	assert_string_equal(cpus_from_name((CpusFrom)9), "unknown");
}

static void test_this_machine(void **state)
{
	(void)state;
	CpuAllowance a;
	cpu_allowance_read_self(&a);
	assert_true(a.max_workers >= 1);
	assert_true(a.cpus > 0);
	assert_true(a.cores >= 1);
	assert_true(a.cores <= sysconf_cpus());
	assert_true(a.max_workers <= a.cores);
	assert_true(a.n_core_cpus >= 1);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_cpu_list_parse),
	    cmocka_unit_test(test_cpu_max_parse),
	    T(test_physical_cores),
	    T(test_topology_unreadable),
	    T(test_hyperthreads_in_a_cpuset),
	    T(test_v2_quota),
	    T(test_v2_nested_quota),
	    T(test_v2_in_a_namespace),
	    T(test_v1_quota),
	    T(test_v1_cpuset),
	    T(test_v1_and_v2_together),
	    T(test_affinity),
	    cmocka_unit_test(test_describe),
	    cmocka_unit_test(test_this_machine),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
