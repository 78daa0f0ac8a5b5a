/*
 * The autoscaler's decision (doc/workers.md, "How the scaler decides"): a
 * pure function of the load history (busy + run-queue wait, "The
 * saturation signal") and the settings (their ranges are in
 * common/config.c's table, the rest in common/worker_bounds.c), plus the
 * physical core count that max_workers = 0 stands for.
 */
#include "autoconfig.h"

#include "master/scaler.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

ScalerSample scaler_sample_make_split(int64_t time_us, int n_workers, double sum_load, double sum_cpu)
{
	ScalerSample s = {
	    .time_us = time_us,
	    .n_workers = n_workers,
	    .sum_busy = sum_load,
	    .mean_busy = n_workers > 0 ? sum_load / n_workers : 0.0,
	    .mean_cpu = n_workers > 0 ? sum_cpu / n_workers : 0.0,
	};
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

ScalerResult scaler_decide(const ScalerHistory *h, const ScalerConfig *cf, int current, int64_t now_us)
{
	ScalerResult r = {.decision = SCALE_HOLD};

	/* the bounds first: they act at once, whatever the load or the cooldown */
	if (current < cf->min_workers) {
		set_result(&r, SCALE_UP, "below min_workers (%d < %d)", current, cf->min_workers);
		return r;
	}
	if (current > cf->max_workers) {
		set_result(&r, SCALE_DOWN, "above max_workers (%d > %d)", current, cf->max_workers);
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
	/* at or above the cores, the wait is the workers' own: only CPU time can ask for more */
	bool cpu_only = cf->cores > 0 && current >= cf->cores;
	bool up_open = true, down_open = current > 1;
	for (int i = h->n - 1; i >= 0 && (up_open || down_open); i--) {
		const ScalerSample *s = &h->samples[i];
		if (!sample_counts(h, s, current))
			break;
		if (!newest)
			newest = s;
		double up_value = cpu_only ? s->mean_cpu : s->mean_busy;
		if (up_open && up_value > cf->up_threshold && up_run < cf->up_samples)
			up_run++;
		else
			up_open = false;
		if (down_open && s->sum_busy / (current - 1) < cf->down_threshold && down_run < cf->down_samples)
			down_run++;
		else
			down_open = false;
	}

	if (!newest) {
		set_result(&r, SCALE_HOLD, "no samples with %d worker%s yet", current, current == 1 ? "" : "s");
		return r;
	}

	double mean = cpu_only ? newest->mean_cpu : newest->mean_busy;
	double sum = newest->sum_busy;
	const char *what = cpu_only ? "mean busy" : "mean load";
	int fewer = current - 1;
	double fit = fewer > 0 ? sum / fewer : 0.0;

	if (up_run > 0) {
		if (current >= cf->max_workers)
			set_result(&r, SCALE_HOLD, "at max_workers (%d): %s %.2f > %.2f", cf->max_workers, what, mean,
			           cf->up_threshold);
		else if (up_run >= cf->up_samples)
			set_result(&r, SCALE_UP, "%s %.2f > %.2f for %d samples", what, mean, cf->up_threshold,
			           cf->up_samples);
		else
			set_result(&r, SCALE_HOLD, "%s %.2f > %.2f for %d of %d samples", what, mean, cf->up_threshold,
			           up_run, cf->up_samples);
		return r;
	}

	if (down_run > 0) {
		const char *s = fewer == 1 ? "" : "s";
		if (current <= cf->min_workers)
			set_result(&r, SCALE_HOLD, "at min_workers (%d): load %.2f would fit on %d worker%s",
			           cf->min_workers, sum, fewer, s);
		else if (down_run >= cf->down_samples)
			set_result(&r, SCALE_DOWN, "load %.2f would fit on %d worker%s (%.2f < %.2f) for %d samples",
			           sum, fewer, s, fit, cf->down_threshold, cf->down_samples);
		else
			set_result(&r, SCALE_HOLD,
			           "load %.2f would fit on %d worker%s (%.2f < %.2f) for %d of %d samples", sum, fewer,
			           s, fit, cf->down_threshold, down_run, cf->down_samples);
		return r;
	}

	if (cpu_only && newest->mean_busy > cf->up_threshold && current < cf->max_workers) {
		set_result(&r, SCALE_HOLD,
		           "at the %d physical cores: mean busy %.2f without the run-queue wait (load %.2f)", cf->cores,
		           newest->mean_cpu, newest->mean_busy);
		return r;
	}
	set_result(&r, SCALE_HOLD, "steady: mean load %.2f on %d worker%s", newest->mean_busy, current,
	           current == 1 ? "" : "s");
	return r;
}

/* ---- physical cores ---- */

#define SYSFS_CPU_DIR "/sys/devices/system/cpu"

typedef struct CoreId {
	long package; /* topology/physical_package_id */
	long die;     /* topology/die_id (0 where the kernel has none) */
	long core;    /* topology/core_id */
	int cpu;      /* the logical CPU (cpuN) */
} CoreId;

/* Read one non-negative decimal number (a sysfs attribute); false if missing or not a number. */
static bool read_number(const char *path, long *out)
{
	char buf[64];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	ssize_t got = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (got <= 0)
		return false;
	buf[got] = '\0';
	char *end;
	errno = 0;
	long v = strtol(buf, &end, 10);
	if (end == buf || errno != 0 || (*end != '\0' && *end != '\n'))
		return false;
	*out = v;
	return true;
}

/* "cpu" followed by digits only (not cpufreq, cpuidle, ...) */
static bool is_cpu_entry(const char *name)
{
	if (strncmp(name, "cpu", 3) != 0 || name[3] == '\0')
		return false;
	for (const char *p = name + 3; *p; p++)
		if (!isdigit((unsigned char)*p))
			return false;
	return true;
}

static int cmp_core(const void *a, const void *b)
{
	const CoreId *x = a, *y = b;
	if (x->package != y->package)
		return x->package < y->package ? -1 : 1;
	if (x->die != y->die)
		return x->die < y->die ? -1 : 1;
	if (x->core != y->core)
		return x->core < y->core ? -1 : 1;
	return 0;
}

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

/* cmp_core, then the CPU number: the lowest CPU of a core sorts first */
static int cmp_core_cpu(const void *a, const void *b)
{
	int c = cmp_core(a, b);
	return c ? c : cmp_int(&((const CoreId *)a)->cpu, &((const CoreId *)b)->cpu);
}

int scaler_core_cpus_at(const char *dir, int *cpus, int max)
{
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	CoreId *ids = NULL;
	size_t n = 0, cap = 0;
	bool ok = true;
	struct dirent *de;
	char path[PATH_MAX];
	while (ok && (de = readdir(d)) != NULL) {
		if (!is_cpu_entry(de->d_name))
			continue;
		long online;
		snprintf(path, sizeof(path), "%s/%s/online", dir, de->d_name);
		/* no "online" attribute: a CPU that cannot be taken offline (cpu0 on x86) */
		if (read_number(path, &online) && online == 0)
			continue;
		CoreId id = {.die = 0, .cpu = atoi(de->d_name + 3)};
		snprintf(path, sizeof(path), "%s/%s/topology/physical_package_id", dir, de->d_name);
		if (!read_number(path, &id.package)) {
			ok = false;
			break;
		}
		snprintf(path, sizeof(path), "%s/%s/topology/core_id", dir, de->d_name);
		if (!read_number(path, &id.core)) {
			ok = false;
			break;
		}
		snprintf(path, sizeof(path), "%s/%s/topology/die_id", dir, de->d_name);
		if (!read_number(path, &id.die))
			id.die = 0;
		if (n == cap) {
			size_t ncap = cap ? cap * 2 : 64;
			CoreId *nids = realloc(ids, ncap * sizeof(*ids));
			if (!nids) {
				ok = false;
				break;
			}
			ids = nids;
			cap = ncap;
		}
		ids[n++] = id;
	}
	closedir(d);

	int cores = 0;
	if (ok && n > 0) {
		qsort(ids, n, sizeof(*ids), cmp_core_cpu);
		for (size_t i = 0; i < n; i++)
			if (i == 0 || cmp_core(&ids[i - 1], &ids[i]) != 0) {
				if (cpus && cores < max)
					cpus[cores] = ids[i].cpu;
				cores++;
			}
		if (cpus)
			qsort(cpus, (size_t)(cores < max ? cores : max), sizeof(int), cmp_int);
	}
	free(ids);
	return cores;
}

int scaler_physical_cores_at(const char *sysfs_cpu_dir)
{
	int cores = scaler_core_cpus_at(sysfs_cpu_dir, NULL, 0);
	if (cores > 0)
		return cores;
	long online = sysconf(_SC_NPROCESSORS_ONLN);
	if (online < 1)
		return 1;
	return online > INT_MAX ? INT_MAX : (int)online;
}

int scaler_physical_cores(void)
{
	return scaler_physical_cores_at(SYSFS_CPU_DIR);
}

int scaler_core_cpus(int *cpus, int max)
{
	return scaler_core_cpus_at(SYSFS_CPU_DIR, cpus, max);
}
