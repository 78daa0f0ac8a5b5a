/*
 * The autoscaler's decision (doc/workers.md, "How the scaler decides"): a
 * pure function of the load history (busy + run-queue wait, "The
 * saturation signal") and the settings (their ranges are in
 * common/config.c's table, the rest in common/worker_bounds.c). What
 * max_workers = 0 stands for is master/cpu_allowance.c's.
 */
#include "autoconfig.h"

#include "master/scaler.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

ScalerSample scaler_sample_make_full(int64_t time_us, int n_workers, double sum_load, double sum_cpu, double sum_wait,
                                     double idle_cpus, double throttled)
{
	/* the wait counts as far as there was idle CPU for it (doc/workers.md, "Adding a worker only into idle CPU") */
	double wait = idle_cpus >= 0 && sum_wait > idle_cpus ? idle_cpus : sum_wait;
	double up = sum_cpu + wait;
	if (up > sum_load)
		up = sum_load;
	ScalerSample s = {
	    .time_us = time_us,
	    .n_workers = n_workers,
	    .sum_busy = sum_load,
	    .mean_busy = n_workers > 0 ? sum_load / n_workers : 0.0,
	    .mean_cpu = n_workers > 0 ? sum_cpu / n_workers : 0.0,
	    .sum_up = up,
	    .mean_up = n_workers > 0 ? up / n_workers : 0.0,
	    .idle_cpus = idle_cpus,
	    .throttled = throttled,
	};
	return s;
}

ScalerSample scaler_sample_make_split(int64_t time_us, int n_workers, double sum_load, double sum_cpu)
{
	ScalerSample s = scaler_sample_make_full(time_us, n_workers, sum_load, sum_cpu, sum_load - sum_cpu, -1, 0);
	s.sum_up = sum_load; /* no idle reading: all of the load asks */
	s.mean_up = s.mean_busy;
	return s;
}

ScalerSample scaler_sample_make(int64_t time_us, int n_workers, double sum_busy)
{
	return scaler_sample_make_split(time_us, n_workers, sum_busy, sum_busy);
}

static double clamp01(double v)
{
	return v < 0 ? 0 : (v > 1 ? 1 : v);
}

Saturation scaler_saturation(const SchedCounters *prev, const SchedCounters *cur)
{
	Saturation r = {.valid = false};
	if (cur->time_ns <= prev->time_ns || cur->busy_ns < prev->busy_ns)
		return r;
	bool have_wait = prev->wait_ns != SHM_WAIT_UNKNOWN && cur->wait_ns != SHM_WAIT_UNKNOWN;
	if (have_wait && cur->wait_ns < prev->wait_ns)
		return r;
	double dt = (double)(cur->time_ns - prev->time_ns);
	r.valid = true;
	r.busy = clamp01((double)(cur->busy_ns - prev->busy_ns) / dt);
	r.wait = have_wait ? clamp01((double)(cur->wait_ns - prev->wait_ns) / dt) : 0.0;
	r.load = clamp01(r.busy + r.wait);
	return r;
}

void scaler_history_add(ScalerHistory *h, const ScalerSample *s)
{
	if (h->n >= SCALER_HISTORY) {
		memmove(&h->samples[0], &h->samples[1], (SCALER_HISTORY - 1) * sizeof(h->samples[0]));
		h->n = SCALER_HISTORY - 1;
	}
	h->samples[h->n++] = *s;
}

void scaler_history_reset(ScalerHistory *h)
{
	h->n = 0;
}

void scaler_note_change(ScalerHistory *h, int64_t now_us)
{
	scaler_history_reset(h);
	h->last_change_us = now_us;
}

static void set_result(ScalerResult *r, ScaleDecision d, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void set_result(ScalerResult *r, ScaleDecision d, const char *fmt, ...)
{
	va_list ap;
	r->decision = d;
	va_start(ap, fmt);
	vsnprintf(r->reason, sizeof(r->reason), fmt, ap);
	va_end(ap);
}

/* Does this sample describe the load on `current` workers since the last change? */
static bool sample_counts(const ScalerHistory *h, const ScalerSample *s, int current)
{
	if (s->n_workers != current)
		return false;
	return h->last_change_us == 0 || s->time_us >= h->last_change_us;
}

/* ceil(sum / threshold), at least 0 and at most `cap` */
static int wanted_for(double sum, double threshold, int cap)
{
	if (threshold <= 0 || sum <= 0)
		return 0;
	double w = sum / threshold;
	if (w >= cap)
		return cap;
	int n = (int)w;
	return n < w ? n + 1 : n;
}

/* The count a step up reaches: ceil(sum_up / threshold), one more at least, within the allowance and max. */
static int step_up(const ScalerConfig *cf, int current, double sum_up)
{
	int limit = cf->max_workers;
	int allowance = cf->cores > 0 && cf->cores < limit ? cf->cores : limit;
	int target = wanted_for(sum_up, cf->up_threshold, limit);
	/*
	 * Workers at their limit hide how much more is wanted (a worker's load
	 * is at most 1): the count doubles, as a cluster autoscaler's step does,
	 * so that a ramp on a big machine is met in a few steps.
	 */
	if (current > 0 && sum_up / current >= SCALER_SATURATED && target < 2 * current)
		target = 2 * current;
	if (target > allowance)
		target = allowance;
	if (target < current + 1)
		target = current + 1; /* beyond the allowance (cpu_only): one at a time, as before */
	return target > limit ? limit : target;
}

/* The count a step down reaches: ceil(sum / up threshold), one fewer at least, at most halving, >= min_workers. */
static int step_down(const ScalerConfig *cf, int current, double sum)
{
	int target = wanted_for(sum, cf->up_threshold, current);
	int half = (current + 1) / 2;
	if (target < half)
		target = half;
	if (target < cf->min_workers)
		target = cf->min_workers;
	if (target > current - 1)
		target = current - 1;
	return target;
}

ScalerResult scaler_decide(const ScalerHistory *h, const ScalerConfig *cf, int current, int64_t now_us)
{
	ScalerResult r = {.decision = SCALE_HOLD, .target = current};

	/* the bounds first: they act at once, whatever the load or the cooldown */
	if (current < cf->min_workers) {
		set_result(&r, SCALE_UP, "below min_workers (%d < %d)", current, cf->min_workers);
		r.target = cf->min_workers;
		return r;
	}
	if (current > cf->max_workers) {
		set_result(&r, SCALE_DOWN, "above max_workers (%d > %d)", current, cf->max_workers);
		r.target = cf->max_workers;
		return r;
	}

	if (h->last_change_us != 0 && cf->cooldown_us > 0) {
		int64_t since = now_us - h->last_change_us;
		if (since < cf->cooldown_us) {
			int64_t left = cf->cooldown_us - (since > 0 ? since : 0);
			/* round up to a tenth of a second: never "0.0 s left" while waiting */
			int64_t tenths = (left + 99999) / 100000;
			set_result(&r, SCALE_HOLD, "cooldown: %lld.%lld s left", (long long)(tenths / 10),
			           (long long)(tenths % 10));
			return r;
		}
	}

	/* the runs of qualifying samples ending with the newest one, capped at what is needed */
	const ScalerSample *newest = NULL;
	int up_run = 0, down_run = 0;
	double up_sum = 0, down_sum = 0; /* the smallest sum_up of the up run, the largest sum_busy of the down run */
	/* at or above the CPUs allowed, the wait is the workers' own: only CPU time can ask for more */
	bool cpu_only = cf->cores > 0 && current >= cf->cores;
	bool up_open = true, down_open = current > 1;
	for (int i = h->n - 1; i >= 0 && (up_open || down_open); i--) {
		const ScalerSample *s = &h->samples[i];
		if (!sample_counts(h, s, current))
			break;
		if (!newest)
			newest = s;
		double up_value = cpu_only ? s->mean_cpu : s->mean_up;
		double up_sum_s = cpu_only ? s->mean_cpu * s->n_workers : s->sum_up;
		/* beyond the allowance a new worker gets only what nobody uses */
		bool room = !cpu_only || s->idle_cpus < 0 || s->idle_cpus >= SCALER_IDLE_MIN;
		/* at max_workers the idle CPU and the throttling change nothing: the reason says the bound */
		bool may = current >= cf->max_workers || (s->throttled <= SCALER_THROTTLED_MAX && room);
		if (up_open && up_value > cf->up_threshold && may && up_run < cf->up_samples) {
			up_sum = up_run == 0 || up_sum_s < up_sum ? up_sum_s : up_sum;
			up_run++;
		} else
			up_open = false;
		if (down_open && s->sum_busy / (current - 1) < cf->down_threshold && down_run < cf->down_samples) {
			down_sum = s->sum_busy > down_sum ? s->sum_busy : down_sum;
			down_run++;
		} else
			down_open = false;
	}

	if (!newest) {
		set_result(&r, SCALE_HOLD, "no samples with %d worker%s yet", current, current == 1 ? "" : "s");
		return r;
	}

	double mean = cpu_only ? newest->mean_cpu : newest->mean_up;
	double sum = newest->sum_busy;
	const char *what = cpu_only ? "mean busy" : "mean load";
	int fewer = current - 1;
	double fit = fewer > 0 ? sum / fewer : 0.0;

	if (up_run > 0) {
		if (current >= cf->max_workers)
			set_result(&r, SCALE_HOLD, "at max_workers (%d): %s %.2f > %.2f", cf->max_workers, what, mean,
			           cf->up_threshold);
		else if (up_run >= cf->up_samples) {
			r.target = step_up(cf, current, up_sum);
			set_result(&r, SCALE_UP, "%s %.2f > %.2f for %d samples", what, mean, cf->up_threshold,
			           cf->up_samples);
		} else
			set_result(&r, SCALE_HOLD, "%s %.2f > %.2f for %d of %d samples", what, mean, cf->up_threshold,
			           up_run, cf->up_samples);
		return r;
	}

	if (down_run > 0) {
		const char *s = fewer == 1 ? "" : "s";
		if (current <= cf->min_workers)
			set_result(&r, SCALE_HOLD, "at min_workers (%d): load %.2f would fit on %d worker%s",
			           cf->min_workers, sum, fewer, s);
		else if (down_run >= cf->down_samples) {
			r.target = step_down(cf, current, down_sum);
			set_result(&r, SCALE_DOWN, "load %.2f would fit on %d worker%s (%.2f < %.2f) for %d samples",
			           sum, fewer, s, fit, cf->down_threshold, cf->down_samples);
		} else
			set_result(&r, SCALE_HOLD,
			           "load %.2f would fit on %d worker%s (%.2f < %.2f) for %d of %d samples", sum, fewer,
			           s, fit, cf->down_threshold, down_run, cf->down_samples);
		return r;
	}

	/* the load would ask for another worker, but what asks is not there for one */
	bool asks = (cpu_only ? newest->mean_cpu : newest->mean_busy) > cf->up_threshold && current < cf->max_workers;
	if (asks && newest->throttled > SCALER_THROTTLED_MAX) {
		set_result(&r, SCALE_HOLD,
		           "throttled: the cgroup's CPU quota held the pooler back in %.0f%% of periods",
		           newest->throttled * 100);
		return r;
	}
	if (asks && ((!cpu_only && newest->mean_up <= cf->up_threshold) ||
	             (cpu_only && newest->idle_cpus >= 0 && newest->idle_cpus < SCALER_IDLE_MIN))) {
		char of[32] = "";
		if (cf->cpus > 0)
			snprintf(of, sizeof(of), " of %.4g CPU%s", cf->cpus, cf->cpus == 1 ? "" : "s");
		set_result(&r, SCALE_HOLD, "no idle CPU for another worker (idle %.2f%s)",
		           newest->idle_cpus < 0 ? 0 : newest->idle_cpus, of);
		return r;
	}
	if (cpu_only && newest->mean_busy > cf->up_threshold && current < cf->max_workers) {
		set_result(&r, SCALE_HOLD,
		           "at the %d CPU%s allowed: mean busy %.2f without the run-queue wait (load %.2f)", cf->cores,
		           cf->cores == 1 ? "" : "s", newest->mean_cpu, newest->mean_busy);
		return r;
	}
	set_result(&r, SCALE_HOLD, "steady: mean load %.2f on %d worker%s", newest->mean_busy, current,
	           current == 1 ? "" : "s");
	return r;
}

const char *scaler_reason_kind(const char *reason)
{
	/* the beginnings of the texts scaler_decide() writes, most specific first */
	static const struct {
		const char *start, *kind;
	} kinds[] = {
	    {"below min_workers", "below_min_workers"},
	    {"above max_workers", "above_max_workers"},
	    {"cooldown:", "cooldown"},
	    {"no samples", "no_samples"},
	    {"at max_workers", "at_max_workers"},
	    {"at min_workers", "at_min_workers"},
	    {"mean load", "load_high"},
	    {"mean busy", "load_high"},
	    {"load ", "load_low"},
	    {"throttled:", "throttled"},
	    {"no idle CPU", "no_idle_cpu"},
	    {"at the ", "at_cpu_allowance"},
	    {"steady:", "steady"},
	    {"start", "start"}, /* the master's, before the first sample */
	};
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
		if (strncmp(reason, kinds[i].start, strlen(kinds[i].start)) == 0)
			return kinds[i].kind;
	return "other";
}
