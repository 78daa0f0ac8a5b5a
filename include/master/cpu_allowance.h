/*
 * The CPU allowance: how many CPUs this pooler may use, which is what
 * max_workers = 0 stands for (doc/workers.md, "The CPU allowance"). The
 * fewest of the affinity mask, the cgroup's cpuset, the cgroup's CPU quota
 * and the physical cores among the allowed CPUs. Reads files only (under a
 * root prefix, so that unit tests can use fixture trees); no libevent.
 */
#ifndef PGB_MASTER_CPU_ALLOWANCE_H
#define PGB_MASTER_CPU_ALLOWANCE_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <limits.h>
#include <stdint.h>

#include "shm.h"

#define CPU_ALLOWANCE_CORE_CPUS SHM_MAX_WORKERS /* core CPUs kept for pinning: one per worker at most */

typedef struct CpuAllowance {
	double cpus;       /* the allowance: the fewest of the limits below (1.5 for a quota of 150000/100000) */
	int max_workers;   /* what max_workers = 0 stands for: cpus rounded up, at least 1 */
	CpusFrom from;     /* the limit that set cpus (on a tie: quota, then cpuset, then affinity, then cores) */
	int online;        /* online logical CPUs */
	int affinity;      /* online CPUs in the affinity mask (= online when it excludes none) */
	int cpuset;        /* online CPUs in the cgroup cpuset (= online without one) */
	int64_t quota_us;  /* the smallest cgroup quota on the path (cpu.max, cpu.cfs_quota_us); 0 = none */
	int64_t period_us; /* its period */
	int cores;         /* physical cores among the allowed CPUs (hyperthread siblings once) */
	int core_cpus[CPU_ALLOWANCE_CORE_CPUS]; /* the lowest allowed CPU of each of them, in CPU order */
	int n_core_cpus;                        /* entries in core_cpus: min(cores, CPU_ALLOWANCE_CORE_CPUS) */
	cpu_set_t allowed;                      /* the online CPUs the masks allow */
	/*
	 * The cgroup whose quota is quota_us (under the root prefix), "" without
	 * one: its cpu.stat tells the throttling, its usage what of the quota is
	 * used (master/cpu_idle.h). quota_v2: a cgroup v2 directory (cpu.stat
	 * has usage_usec and throttled_usec), else v1 (cpu.stat with
	 * throttled_time, cpuacct.usage beside it when cpuacct is mounted with cpu).
	 */
	char quota_dir[PATH_MAX];
	bool quota_v2;
} CpuAllowance;

/*
 * The allowance of the calling process as seen under `root` ("/" or NULL
 * in production; a fixture directory in tests):
 *
 *  - the online CPUs and their topology from ROOT/sys/devices/system/cpu
 *    (cpuN/online, cpuN/topology/{physical_package_id,die_id,core_id});
 *    without cpuN entries, CPUs 0..sysconf(_SC_NPROCESSORS_ONLN)-1, and
 *    where an allowed CPU has no topology, every allowed CPU is a core;
 *  - `affinity` (sched_getaffinity(); NULL = none);
 *  - the cgroups from ROOT/proc/self/cgroup (the v2 "0::" line, the v1
 *    lines of the cpu and cpuset controllers), found under the mounts that
 *    ROOT/proc/self/mountinfo lists: in v2 cpuset.cpus.effective and
 *    cpu.max ("max 100000", "150000 100000"); in v1
 *    cpuset.effective_cpus (or cpuset.cpus) and cpu.cfs_quota_us /
 *    cpu.cfs_period_us (-1 = none). The quota is the smallest on the path
 *    from the process's cgroup up to the mount's root, so an unlimited
 *    cgroup under a limited parent has the parent's.
 *
 * A mask counts as a limit only where it excludes an online CPU (so a
 * machine with none says "physical cores"); a mask that would leave no
 * online CPU is ignored. Missing or unreadable files mean no such limit:
 * this never fails, and the result has cpus >= the smallest quota and
 * max_workers >= 1.
 */
void cpu_allowance_read(const char *root, const cpu_set_t *affinity, CpuAllowance *out);

/* The same for this process under "/", with its own affinity mask. */
void cpu_allowance_read_self(CpuAllowance *out);

/*
 * A cpuset list ("0-3,8-11", "5", with or without a trailing newline)
 * into set; false (set unspecified) for an empty or malformed list.
 */
bool cpu_list_parse(const char *text, cpu_set_t *set) __attribute__((warn_unused_result));

/*
 * cgroup v2 cpu.max ("max 100000", "150000 100000"): quota_us = 0 for
 * "max" (no limit), else the quota and period. False when malformed.
 */
bool cpu_max_parse(const char *text, int64_t *quota_us, int64_t *period_us) __attribute__((warn_unused_result));

/*
 * The allowance in words, for logs and notes: "2 physical cores", "1 CPU
 * of the affinity mask", "3 CPUs of the cgroup cpuset", "cgroup quota of
 * 1.5 CPUs".
 */
void cpu_allowance_describe(const CpuAllowance *a, char *buf, size_t len);

#endif
