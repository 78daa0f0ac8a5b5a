/*
 * The bounds of the worker settings: what is refused (at start, RELOAD and
 * SET) and what is clamped (by the master, which logs it). See
 * include/common/worker_bounds.h and doc/workers.md.
 */
#include "autoconfig.h"

#include "common/worker_bounds.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/util.h"

static bool samples_ok(const char *name, int v, char *err, size_t errlen)
{
	if (v >= 1 && v <= WORKER_SAMPLES_MAX)
		return true;
	return set_error(err, errlen, "%s must be between 1 and %d (got %d)", name, WORKER_SAMPLES_MAX, v);
}

bool worker_bounds_check(const CfGlobals *g, char *err, size_t errlen)
{
	if (g->min_workers < 1 || g->min_workers > WORKERS_MAX)
		return set_error(err, errlen, "min_workers must be between 1 and %d (got %d)", WORKERS_MAX,
		                 g->min_workers);
	if (g->max_workers < 0)
		return set_error(err, errlen, "max_workers must be 0 (one per physical core) or more (got %d)",
		                 g->max_workers);
	if (g->max_workers > 0 && g->min_workers > g->max_workers)
		return set_error(err, errlen, "min_workers must be between 1 and max_workers (%d) (got %d)",
		                 g->max_workers, g->min_workers);
	/* written as !(a < b) so that NaN fails too */
	if (!(g->worker_scale_up_threshold > 0 && g->worker_scale_up_threshold <= 1))
		return set_error(err, errlen, "worker_scale_up_threshold must be above 0 and at most 1 (got %g)",
		                 g->worker_scale_up_threshold);
	if (!(g->worker_scale_down_threshold > 0 && g->worker_scale_down_threshold < g->worker_scale_up_threshold))
		return set_error(err, errlen,
		                 "worker_scale_down_threshold must be above 0 and below worker_scale_up_threshold "
		                 "(%g) (got %g)",
		                 g->worker_scale_up_threshold, g->worker_scale_down_threshold);
	if (!samples_ok("worker_scale_up_samples", g->worker_scale_up_samples, err, errlen))
		return false;
	if (!samples_ok("worker_scale_down_samples", g->worker_scale_down_samples, err, errlen))
		return false;
	if (g->worker_scale_interval <= 0)
		return set_error(err, errlen, "worker_scale_interval must be above 0 seconds (got %g)",
		                 (double)g->worker_scale_interval / (double)USEC_PER_SEC);
	return true;
}

static void add_note(WorkerBounds *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void add_note(WorkerBounds *b, const char *fmt, ...)
{
	size_t used = strlen(b->note);
	if (used > 0 && used + 2 < sizeof(b->note)) {
		memcpy(b->note + used, "; ", 3);
		used += 2;
	}
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(b->note + used, sizeof(b->note) - used, fmt, ap);
	va_end(ap);
}

WorkerBounds worker_bounds_resolve(const CfGlobals *g, int cores)
{
	WorkerBounds b = {.min_workers = g->min_workers, .max_workers = g->max_workers};
	if (cores < 1)
		cores = 1;
	/* the loader refused these; clamp anyway so that the worker table can never overflow */
	if (b.min_workers < 1)
		b.min_workers = 1;
	if (b.min_workers > WORKERS_MAX)
		b.min_workers = WORKERS_MAX;

	if (g->max_workers == 0) {
		b.max_workers = cores < WORKERS_MAX ? cores : WORKERS_MAX;
		if (cores > WORKERS_MAX)
			add_note(&b, "max_workers = 0 (%d physical cores) clamped to %d, the size of the worker table",
			         cores, WORKERS_MAX);
		if (b.max_workers < b.min_workers) {
			add_note(&b, "max_workers = 0 (%d physical cores) raised to min_workers (%d)", b.max_workers,
			         b.min_workers);
			b.max_workers = b.min_workers;
		}
	} else if (g->max_workers > WORKERS_MAX) {
		add_note(&b, "max_workers = %d clamped to %d, the size of the worker table", g->max_workers,
		         WORKERS_MAX);
		b.max_workers = WORKERS_MAX;
	}
	if (b.max_workers < b.min_workers)
		b.max_workers = b.min_workers; /* refused by the loader */

	if (g->min_workers > cores && g->max_workers != 0)
		add_note(&b, "min_workers = %d is above the %d physical cores; running at least %d workers anyway",
		         b.min_workers, cores, b.min_workers);
	return b;
}
