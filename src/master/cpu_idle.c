/*
 * Idle CPU within the allowance and the cgroup's throttling, from
 * /proc/stat and the quota cgroup's cpu.stat: the scaler's "is there CPU
 * for another worker" (doc/workers.md, "Adding a worker only into idle
 * CPU").
 */
#include "autoconfig.h"

#include "master/cpu_idle.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

bool cpu_proc_stat_parse(const char *text, const cpu_set_t *allowed, CpuReading *r)
{
	r->have_stat = false;
	r->n_cpus = 0;
	r->idle_ticks = r->total_ticks = 0;
	for (const char *line = text; line && *line;) {
		const char *next = strchr(line, '\n');
		if (strncmp(line, "cpu", 3) == 0 && isdigit((unsigned char)line[3])) {
			char *end;
			long cpu = strtol(line + 3, &end, 10);
			if (cpu >= 0 && cpu < CPU_SETSIZE && CPU_ISSET((int)cpu, allowed)) {
				/* user nice system idle iowait irq softirq steal (guest times are inside user/nice) */
				uint64_t v[8] = {0};
				const char *p = end;
				int n = 0;
				while (n < 8) {
					while (*p == ' ')
						p++;
					if (!isdigit((unsigned char)*p))
						break;
					v[n++] = strtoull(p, &end, 10);
					p = end;
				}
				if (n >= 4) {
					uint64_t total = 0;
					for (int i = 0; i < n; i++)
						total += v[i];
					r->idle_ticks += v[3] + v[4];
					r->total_ticks += total;
					r->n_cpus++;
					r->have_stat = true;
				}
			}
		}
		line = next ? next + 1 : NULL;
	}
	return r->have_stat;
}

/* The value of `key` in "key value" lines; false when absent. */
static bool stat_value(const char *text, const char *key, uint64_t *out)
{
	size_t klen = strlen(key);
	for (const char *line = text; line && *line;) {
		if (strncmp(line, key, klen) == 0 && line[klen] == ' ') {
			char *end;
			unsigned long long v = strtoull(line + klen + 1, &end, 10);
			if (end != line + klen + 1) {
				*out = v;
				return true;
			}
		}
		const char *next = strchr(line, '\n');
		line = next ? next + 1 : NULL;
	}
	return false;
}

void cpu_cgroup_stat_parse(const char *text, CpuReading *r)
{
	if (!text)
		return;
	uint64_t v;
	if (stat_value(text, "nr_periods", &r->nr_periods) && stat_value(text, "nr_throttled", &r->nr_throttled))
		r->have_throttle = true;
	if (stat_value(text, "usage_usec", &v)) {
		r->usage_us = v;
		r->have_usage = true;
	}
}

CpuIdle cpu_idle_between(const CpuReading *prev, const CpuReading *cur, const CpuAllowance *a)
{
	CpuIdle r = {.valid = false, .idle_cpus = -1, .throttled = 0};
	int64_t dt_us = cur->time_us - prev->time_us;
	if (dt_us <= 0)
		return r;
	r.valid = true;
	if (prev->have_stat && cur->have_stat && prev->n_cpus == cur->n_cpus && cur->total_ticks > prev->total_ticks &&
	    cur->idle_ticks >= prev->idle_ticks) {
		double share =
		    (double)(cur->idle_ticks - prev->idle_ticks) / (double)(cur->total_ticks - prev->total_ticks);
		r.idle_cpus = share * cur->n_cpus;
	}
	if (a->quota_us > 0 && a->period_us > 0 && prev->have_usage && cur->have_usage &&
	    cur->usage_us >= prev->usage_us) {
		double quota = (double)a->quota_us / (double)a->period_us;
		double used = (double)(cur->usage_us - prev->usage_us) / (double)dt_us;
		double left = quota > used ? quota - used : 0;
		if (r.idle_cpus < 0 || left < r.idle_cpus)
			r.idle_cpus = left;
	}
	if (prev->have_throttle && cur->have_throttle && cur->nr_periods > prev->nr_periods &&
	    cur->nr_throttled >= prev->nr_throttled) {
		r.throttled =
		    (double)(cur->nr_throttled - prev->nr_throttled) / (double)(cur->nr_periods - prev->nr_periods);
		if (r.throttled > 1)
			r.throttled = 1;
	}
	return r;
}

void cpu_reading_take(const CpuAllowance *a, int64_t now_us, CpuReading *r)
{
	memset(r, 0, sizeof(*r));
	r->time_us = now_us;
	char *stat = read_file("/proc/stat", NULL);
	if (stat && !cpu_proc_stat_parse(stat, &a->allowed, r))
		r->have_stat = false;
	free(stat);
	if (!a->quota_dir[0])
		return;
	char path[PATH_MAX + 32];
	snprintf(path, sizeof(path), "%s/cpu.stat", a->quota_dir);
	char *text = read_file(path, NULL);
	cpu_cgroup_stat_parse(text, r);
	free(text);
	if (!a->quota_v2) {
		/* v1: the usage is cpuacct's, in nanoseconds, where cpuacct is mounted with cpu */
		snprintf(path, sizeof(path), "%s/cpuacct.usage", a->quota_dir);
		char *usage = read_file(path, NULL);
		char *end;
		unsigned long long ns = usage ? strtoull(usage, &end, 10) : 0;
		if (usage && end != usage) {
			r->usage_us = ns / 1000;
			r->have_usage = true;
		}
		free(usage);
	}
}
