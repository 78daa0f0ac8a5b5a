/*
 * The scaler's decision: a pure function of the recent load history (each
 * worker's busy + run-queue wait ratio, capped at 1)
 * and the settings, so it can be unit-tested alone (doc/workers.md, "How the scaler decides").
 */
#ifndef PGB_MASTER_SCALER_H
#define PGB_MASTER_SCALER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shm.h"

#include "common/worker_bounds.h"

#define SCALER_HISTORY WORKER_SAMPLES_MAX /* samples kept: the largest *_samples setting accepted */

/* The settings as the decision uses them: checked by config_validate(), counts from worker_bounds_resolve(). */
typedef struct ScalerConfig {
	int min_workers;       /* >= 1 */
	int max_workers;       /* resolved (0 already replaced by the CPU allowance): >= min_workers */
	double up_threshold;   /* mean load above which to add */
	int up_samples;        /* consecutive samples needed */
	double down_threshold; /* fit-on-one-fewer ratio below which to drain */
	int down_samples;      /* consecutive samples needed */
	int64_t cooldown_us;   /* after any change, wait this long */
	int cores;             /* the CPU allowance rounded up (master/cpu_allowance.h): from this many workers
	                          on, only CPU time counts for adding one (the run-queue wait is then the
	                          workers' own; 0 = no such limit), and a step up forks at most up to it */
	double cpus;           /* the CPU allowance itself, for the reasons (0 = unknown) */
} ScalerConfig;

/* A mean load at or above this in a whole up run: the workers are saturated, the step up doubles them. */
#define SCALER_SATURATED 0.95

/* At or beyond the allowance (cf->cores) a worker is added only with at least this many idle CPUs. */
#define SCALER_IDLE_MIN 0.25

/* A cgroup throttled in more than this share of its quota periods gets no more workers. */
#define SCALER_THROTTLED_MAX 0.02

/*
 * One sample: the loads of the active workers at one tick. A worker's load
 * is its Saturation.load (busy + run-queue wait, at most 1); the fields keep
 * their older names.
 */
typedef struct ScalerSample {
	int64_t time_us;  /* monotonic time of the sample */
	int n_workers;    /* active workers when sampled */
	double sum_busy;  /* sum of their loads */
	double mean_busy; /* sum_busy / n_workers */
	double mean_cpu;  /* mean of their busy ratios alone (without the wait) */
	/*
	 * The load that asks for another worker: the busy ratios plus as much
	 * of the run-queue wait as the allowance had idle CPU (all of it when
	 * the idle CPU is unknown), at most sum_busy (doc/workers.md, "Adding
	 * a worker only into idle CPU").
	 */
	double sum_up;
	double mean_up;   /* sum_up / n_workers */
	double idle_cpus; /* idle CPUs of the allowance over the interval; -1 = unknown */
	double throttled; /* share of the cgroup's quota periods that were throttled, 0..1 */
} ScalerSample;

/* The history the decision looks at; the newest sample is last. */
typedef struct ScalerHistory {
	ScalerSample samples[SCALER_HISTORY];
	int n;                  /* valid samples (<= SCALER_HISTORY) */
	int64_t last_change_us; /* monotonic time of the last change; 0 = never */
} ScalerHistory;

typedef struct ScalerResult {
	ScaleDecision decision;
	int target;       /* the worker count to reach: > current for UP, < current for DOWN, = current for HOLD */
	char reason[128]; /* e.g. "mean load 0.91 > 0.75 for 2 samples" */
} ScalerResult;

/* One worker's published counters at one moment (shm.h WorkerSlot). */
typedef struct SchedCounters {
	uint64_t time_ns; /* sample_time_ns: monotonic time of the reading */
	uint64_t busy_ns; /* busy_ns: CPU time */
	uint64_t wait_ns; /* wait_ns: run-queue wait; SHM_WAIT_UNKNOWN when the kernel has none */
} SchedCounters;

/* A worker's saturation over the interval between two readings. */
typedef struct Saturation {
	bool valid;  /* false: no reading (no time passed, or a counter went back) */
	double busy; /* share of the interval on a CPU, 0..1 */
	double wait; /* share runnable but waiting for a CPU, 0..1 (0 when unknown) */
	double load; /* busy + wait, at most 1: the scaler's input */
} Saturation;

/*
 * The saturation signal from two readings of one worker (doc/workers.md,
 * "The saturation signal"): the busy and waiting shares of the time between
 * them. Invalid when the clock did not advance, or when a counter went back
 * (a new process in the slot after a respawn, or a wrap): the caller then
 * takes `cur` as the new baseline. A wait of SHM_WAIT_UNKNOWN in either
 * reading counts as no wait (the busy share alone, as before the kernel
 * statistics were read). Each share is clamped to 0..1 (the two readings
 * are not taken at the same instant), and so is their sum.
 */
Saturation scaler_saturation(const SchedCounters *prev, const SchedCounters *cur);

/* Fill a sample from the sum of the loads of n_workers workers (mean = 0 when n_workers <= 0); no wait. */
ScalerSample scaler_sample_make(int64_t time_us, int n_workers, double sum_busy);

/* The same with the sums of the loads and of the busy ratios alone; the idle CPU unknown. */
ScalerSample scaler_sample_make_split(int64_t time_us, int n_workers, double sum_load, double sum_cpu);

/*
 * The master's samples: the sums of the loads (per worker busy + wait, at
 * most 1), of the busy ratios and of the waits, the idle CPUs of the
 * allowance (-1 = unknown) and the throttled share of the quota periods.
 */
ScalerSample scaler_sample_make_full(int64_t time_us, int n_workers, double sum_load, double sum_cpu, double sum_wait,
                                     double idle_cpus, double throttled);

/* Append a sample (drops the oldest when full). */
void scaler_history_add(ScalerHistory *h, const ScalerSample *s);

/* Forget samples (after a change the old ones describe another worker count). */
void scaler_history_reset(ScalerHistory *h);

/* Record a change carried out at now_us: forget the samples and start the cooldown. */
void scaler_note_change(ScalerHistory *h, int64_t now_us);

/*
 * Decide for `current` active workers at time `now_us`, in this order:
 *  1. below min_workers: UP; above max_workers: DOWN. Clamps act at once,
 *     also within the cooldown: they follow a RELOAD of the bounds (or a
 *     crash), not the load, so there is nothing to wait out.
 *  2. within cooldown_us of the last change: HOLD ("cooldown: 4.2 s left").
 *  3. UP when the newest up_samples samples each have
 *     mean_up > up_threshold (the wait counted only up to the idle CPU:
 *     "no idle CPU for another worker (idle 0.03 of 2 CPUs)" otherwise) and
 *     a throttled share of at most SCALER_THROTTLED_MAX ("throttled: ..."),
 *     and current < max_workers; once current reaches cf->cores (when
 *     set), mean_cpu > up_threshold and at least SCALER_IDLE_MIN idle
 *     CPUs (when known) instead: the run-queue wait of more
 *     workers than CPUs is mostly their own, and counting it would add
 *     workers up to max_workers ("at the 2 CPUs allowed: mean busy 0.50
 *     without the run-queue wait");
 *     DOWN when the newest down_samples samples each have
 *     sum_busy / (current - 1) < down_threshold, and current > min_workers.
 *     The two cannot both hold while down_threshold < up_threshold.
 *  4. The step is proportional (doc/workers.md, "Proportional steps"): the
 *     wanted count is ceil(sum / up_threshold), with the smallest sum_up of
 *     the up run or the largest sum_busy of the down run. Up: at least one
 *     more, twice as many when the run's mean load is at least
 *     SCALER_SATURATED (saturated workers hide the demand beyond them), at most cf->cores (when set; one more at a time beyond it) and
 *     max_workers. Down: at least one fewer, at most halving, never below
 *     min_workers.
 * Only a run of samples counts: it is broken by a sample that misses the
 * condition, by a sample taken with n_workers != current, or by one taken
 * before last_change_us. So after a change the count restarts even when the
 * caller keeps the old samples. Samples taken during the cooldown (with the
 * new count) do count once it is over.
 * The reason is always filled, also for HOLD ("steady: ...", "at max_workers
 * (4): ...", "mean load 0.80 > 0.75 for 1 of 2 samples", ...).
 */
ScalerResult scaler_decide(const ScalerHistory *h, const ScalerConfig *cf, int current, int64_t now_us);

/*
 * What kind of reason scaler_decide() gave, without its figures: one of a
 * few fixed words ("steady", "cooldown", "load_high", ...; "other" for a
 * text it did not write), for a label that must not take a new value at
 * every sample (/metrics, doc/monitoring.md).
 */
const char *scaler_reason_kind(const char *reason);

#endif
