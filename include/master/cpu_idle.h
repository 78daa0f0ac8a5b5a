/*
 * The idle CPU of the allowance, and the cgroup's throttling: what the
 * scaler needs to add a worker only where it gets CPU nobody else uses
 * (doc/workers.md, "Adding a worker only into idle CPU"). Parsing and
 * arithmetic are pure; cpu_reading_take() reads the files.
 */
#ifndef PGB_MASTER_CPU_IDLE_H
#define PGB_MASTER_CPU_IDLE_H

#include <stdbool.h>
#include <stdint.h>

#include "master/cpu_allowance.h"

/* Cumulative counters at one moment. */
typedef struct CpuReading {
	int64_t time_us;       /* monotonic time of the reading */
	bool have_stat;        /* /proc/stat had lines for the allowed CPUs */
	int n_cpus;            /* allowed CPUs found in /proc/stat */
	uint64_t idle_ticks;   /* their idle + iowait time */
	uint64_t total_ticks;  /* all their time */
	bool have_usage;       /* the quota cgroup's CPU time is known */
	uint64_t usage_us;     /* CPU time of the quota cgroup (all its processes) */
	bool have_throttle;    /* the quota cgroup's cpu.stat had nr_periods */
	uint64_t nr_periods;   /* quota periods with runnable tasks */
	uint64_t nr_throttled; /* of them, periods that hit the quota */
} CpuReading;

/* What two readings say about the time between them. */
typedef struct CpuIdle {
	bool valid;       /* false: not two readings of the same kind, or no time between them */
	double idle_cpus; /* CPUs of the allowance nobody used, on average; -1 = unknown */
	double throttled; /* share of the quota periods that hit the quota, 0..1 (0 without a quota) */
} CpuIdle;

/*
 * The "cpuN ..." lines of /proc/stat for the CPUs in `allowed` (the
 * aggregate "cpu" line is not used): idle + iowait into idle_ticks, the sum
 * of every field up to steal into total_ticks. False when no allowed CPU
 * has a line.
 */
bool cpu_proc_stat_parse(const char *text, const cpu_set_t *allowed, CpuReading *r) __attribute__((warn_unused_result));

/*
 * A cgroup cpu.stat: "nr_periods", "nr_throttled" (v1 and v2) and
 * "usage_usec" (v2). Keys it lacks leave their have_* flags as they were.
 */
void cpu_cgroup_stat_parse(const char *text, CpuReading *r);

/*
 * The idle CPUs of the allowance between two readings: the allowed CPUs'
 * idle share times their count, and with a quota at most the quota less
 * the cgroup's usage; the throttled share of the quota periods.
 */
CpuIdle cpu_idle_between(const CpuReading *prev, const CpuReading *cur, const CpuAllowance *a);

/* Read /proc/stat and the quota cgroup's files for allowance `a` at monotonic time now_us. */
void cpu_reading_take(const CpuAllowance *a, int64_t now_us, CpuReading *r);

#endif
