/*
 * The bounds of the worker settings (min_workers, max_workers,
 * worker_scale_*): the limits the parameter table uses, the checks across
 * settings that config_validate() runs after the table's ranges
 * (worker_bounds_check()), and the worker counts the master's scaler takes
 * from worker_bounds_resolve(), which clamps.
 */
#ifndef PGB_COMMON_WORKER_BOUNDS_H
#define PGB_COMMON_WORKER_BOUNDS_H

#include <stdbool.h>
#include <stddef.h>

#include "common/config.h"
#include "shm.h"

#define WORKERS_MAX        SHM_MAX_WORKERS /* slots in the worker table: no more workers can run */
#define WORKER_SAMPLES_MAX 128             /* samples the scaler keeps: the largest *_samples that can fire */

/*
 * The checks across worker settings: min_workers above a non-zero
 * max_workers, worker_scale_down_threshold not below
 * worker_scale_up_threshold. The range of each setting alone (min_workers
 * 1..WORKERS_MAX, *_samples 1..WORKER_SAMPLES_MAX, thresholds above 0 and
 * at most 1, worker_scale_interval above 0) is in the parameter table
 * (src/common/config.c), which config_validate() checks first. False with
 * "SETTING must be ... (got V)" in err.
 */
bool worker_bounds_check(const CfGlobals *g, char *err, size_t errlen) __attribute__((warn_unused_result));

/* The worker counts the scaler works within. */
typedef struct WorkerBounds {
	int min_workers; /* 1..WORKERS_MAX */
	int max_workers; /* min_workers..WORKERS_MAX */
	char note[256];  /* what was clamped, and to what; "" when the settings were taken as they are */
} WorkerBounds;

/*
 * Resolve the settings (already accepted by worker_bounds_check()) for a
 * CPU allowance of `cpus` (rounded up; master/cpu_allowance.h), described
 * by cpus_text ("2 physical cores", "cgroup quota of 1.5 CPUs"; NULL =
 * "N physical cores"): max_workers = 0 stands for cpus; a max_workers
 * above WORKERS_MAX is clamped to it; a max_workers of 0 below min_workers
 * is raised to min_workers. Each clamp, and a min_workers above cpus
 * (taken as it is), is described in note for the caller to log.
 */
WorkerBounds worker_bounds_resolve(const CfGlobals *g, int cpus, const char *cpus_text);

#endif
