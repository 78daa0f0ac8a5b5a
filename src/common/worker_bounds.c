/*
 * The bounds of the worker settings: what is refused across settings (the
 * range of each one is in config.c's table) and what is clamped (by the
 * master, which logs it). See
 * include/common/worker_bounds.h and doc/workers.md.
 */
#include "autoconfig.h"

#include "common/worker_bounds.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/util.h"

bool worker_bounds_check(const CfGlobals *g, char *err, size_t errlen)
{
	/* each setting alone is in its range (config_validate() checked the table before) */
	if (g->max_workers > 0 && g->min_workers > g->max_workers)
		return set_error(err, errlen, "min_workers must be between 1 and max_workers (%d) (got %d)",
		                 g->max_workers, g->min_workers);
	/* written as !(a < b) so that NaN fails too */
	if (!(g->worker_scale_down_threshold < g->worker_scale_up_threshold))
		return set_error(err, errlen,
		                 "worker_scale_down_threshold must be above 0 and below worker_scale_up_threshold "
		                 "(%g) (got %g)",
		                 g->worker_scale_up_threshold, g->worker_scale_down_threshold);
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

WorkerBounds worker_bounds_resolve(const CfGlobals *g, int cpus, const char *cpus_text)
{
	WorkerBounds b = {.min_workers = g->min_workers, .max_workers = g->max_workers};
	if (cpus < 1)
		cpus = 1;
	char text[96];
	if (cpus_text)
		snprintf(text, sizeof(text), "%s", cpus_text);
	else
		snprintf(text, sizeof(text), "%d physical core%s", cpus, cpus == 1 ? "" : "s");
	/* the loader refused these; clamp anyway so that the worker table can never overflow */
	if (b.min_workers < 1)
		b.min_workers = 1;
	if (b.min_workers > WORKERS_MAX)
		b.min_workers = WORKERS_MAX;

	if (g->max_workers == 0) {
		b.max_workers = cpus < WORKERS_MAX ? cpus : WORKERS_MAX;
		if (cpus > WORKERS_MAX)
			add_note(&b, "max_workers = 0 (%s) clamped to %d, the size of the worker table", text,
			         WORKERS_MAX);
		if (b.max_workers < b.min_workers) {
			add_note(&b, "max_workers = 0 (%s) raised to min_workers (%d)", text, b.min_workers);
			b.max_workers = b.min_workers;
		}
	} else if (g->max_workers > WORKERS_MAX) {
		add_note(&b, "max_workers = %d clamped to %d, the size of the worker table", g->max_workers,
		         WORKERS_MAX);
		b.max_workers = WORKERS_MAX;
	}
	if (b.max_workers < b.min_workers)
		b.max_workers = b.min_workers; /* refused by the loader */

	if (g->min_workers > cpus && g->max_workers != 0)
		add_note(&b, "min_workers = %d is above the %s; running at least %d workers anyway", b.min_workers,
		         text, b.min_workers);
	return b;
}
