/*
 * The bounds of the worker settings (min_workers, max_workers,
 * worker_scale_*), in one place: the config loader, RELOAD and SET refuse
 * what cannot work through worker_bounds_check(), and the master's scaler
 * takes its worker counts from worker_bounds_resolve(), which clamps.
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
 * Refuse values that cannot work: min_workers outside 1..WORKERS_MAX,
 * max_workers below 0, min_workers above a non-zero max_workers,
 * thresholds outside 0 < worker_scale_down_threshold <
 * worker_scale_up_threshold <= 1, *_samples outside 1..WORKER_SAMPLES_MAX,
 * worker_scale_interval of 0. False with "SETTING must be ... (got V)" in
 * err, naming the setting and its range (the first problem found).
 */
bool worker_bounds_check(const CfGlobals *g, char *err, size_t errlen) __attribute__((warn_unused_result));

/* The worker counts the scaler works within. */
typedef struct WorkerBounds {
	int min_workers; /* 1..WORKERS_MAX */
	int max_workers; /* min_workers..WORKERS_MAX */
	char note[256];  /* what was clamped, and to what; "" when the settings were taken as they are */
} WorkerBounds;

/*
 * Resolve the settings (already accepted by worker_bounds_check()) on a
 * machine with `cores` physical cores: max_workers = 0 stands for the
 * cores; a max_workers above WORKERS_MAX is clamped to it; a max_workers
 * of 0 below min_workers is raised to min_workers. Each clamp, and a
 * min_workers above the core count (taken as it is), is described in note
 * for the caller to log.
 */
WorkerBounds worker_bounds_resolve(const CfGlobals *g, int cores);

#endif
