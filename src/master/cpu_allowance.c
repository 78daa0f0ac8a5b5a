/*
 * The CPU allowance (doc/workers.md, "The CPU allowance"): the CPUs this
 * pooler may use, from the affinity mask, the cgroup's cpuset and quota,
 * and the physical cores among the allowed CPUs. Files only, under a root
 * prefix so that the unit tests can read fixture trees.
 */
#include "autoconfig.h"

#include "master/cpu_allowance.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"

#define SYSFS_CPU_DIR "/sys/devices/system/cpu"

/* ---- small parsers ---- */

/* A decimal integer, then nothing but white space; false for anything else. */
static bool parse_int64(const char *text, int64_t *out)
{
	if (!text)
		return false;
	char *end;
	errno = 0;
	long long v = strtoll(text, &end, 10);
	if (end == text || errno != 0)
		return false;
	while (isspace((unsigned char)*end))
		end++;
	if (*end != '\0')
		return false;
	*out = v;
	return true;
}

/* A CPU number of a list: digits only, below CPU_SETSIZE. */
static bool parse_cpu(const char **p, int *cpu)
{
	if (!isdigit((unsigned char)**p))
		return false;
	long v = 0;
	while (isdigit((unsigned char)**p)) {
		v = v * 10 + (**p - '0');
		if (v >= CPU_SETSIZE)
			return false;
		(*p)++;
	}
	*cpu = (int)v;
	return true;
}

bool cpu_list_parse(const char *text, cpu_set_t *set)
{
	if (!text)
		return false;
	CPU_ZERO(set);
	const char *p = text;
	bool any = false;
	while (*p && *p != '\n') {
		int lo, hi;
		if (!parse_cpu(&p, &lo))
			return false;
		hi = lo;
		if (*p == '-') {
			p++;
			if (!parse_cpu(&p, &hi) || hi < lo)
				return false;
		}
		for (int c = lo; c <= hi; c++)
			CPU_SET(c, set);
		any = true;
		if (*p == ',')
			p++;
		else if (*p && *p != '\n')
			return false;
	}
	return any;
}

bool cpu_max_parse(const char *text, int64_t *quota_us, int64_t *period_us)
{
	if (!text)
		return false;
	char quota[32];
	int64_t period = 100000; /* the kernel's default, should the period be missing */
	const char *p = text;
	size_t n = 0;
	while (*p && !isspace((unsigned char)*p) && n + 1 < sizeof(quota))
		quota[n++] = *p++;
	quota[n] = '\0';
	if (*p && !isspace((unsigned char)*p))
		return false;
	while (*p == ' ' || *p == '\t')
		p++;
	if (*p && *p != '\n' && (!parse_int64(p, &period) || period <= 0))
		return false;
	if (strcmp(quota, "max") == 0) {
		*quota_us = 0;
		*period_us = period;
		return true;
	}
	int64_t q;
	if (!parse_int64(quota, &q) || q <= 0)
		return false;
	*quota_us = q;
	*period_us = period;
	return true;
}

/* ---- paths under the root ---- */

/* ROOT + path into buf; root "" or "/" (or NULL) is the real file system. */
static void at_root(char *buf, size_t len, const char *root, const char *path)
{
	size_t r = root ? strlen(root) : 0;
	while (r > 0 && root[r - 1] == '/')
		r--;
	snprintf(buf, len, "%.*s%s", (int)r, r ? root : "", path);
}

static char *read_at(const char *root, const char *path)
{
	char full[PATH_MAX];
	at_root(full, sizeof(full), root, path);
	return read_file(full, NULL);
}

/* ---- topology: online CPUs and their cores ---- */

typedef struct CpuInfo {
	int cpu;      /* the logical CPU (cpuN) */
	bool ids;     /* the three ids below were read */
	long package; /* topology/physical_package_id */
	long die;     /* topology/die_id (0 where the kernel has none) */
	long core;    /* topology/core_id */
} CpuInfo;

typedef struct Topology {
	cpu_set_t online;
	CpuInfo *cpus; /* the online CPUs with sysfs entries; NULL when there were none */
	size_t n;
} Topology;

/* Read one decimal number (a sysfs attribute); false if missing or not a number. */
static bool read_number(const char *path, long *out)
{
	char *text = read_file(path, NULL);
	int64_t v;
	bool ok = parse_int64(text, &v) && v >= LONG_MIN && v <= LONG_MAX;
	free(text);
	if (ok)
		*out = (long)v;
	return ok;
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

/* a directory of PATH_MAX, an entry name of NAME_MAX and an attribute's path below it */
#define ATTR_PATH_MAX (PATH_MAX + NAME_MAX + 64)

static void read_ids(const char *dir, const char *cpu, CpuInfo *ci)
{
	char path[ATTR_PATH_MAX];
	snprintf(path, sizeof(path), "%s/%s/topology/physical_package_id", dir, cpu);
	ci->ids = read_number(path, &ci->package);
	snprintf(path, sizeof(path), "%s/%s/topology/core_id", dir, cpu);
	ci->ids = ci->ids && read_number(path, &ci->core);
	snprintf(path, sizeof(path), "%s/%s/topology/die_id", dir, cpu);
	if (!read_number(path, &ci->die))
		ci->die = 0;
}

static void topology_read(const char *root, Topology *t)
{
	char dir[PATH_MAX], path[ATTR_PATH_MAX];
	size_t cap = 0;
	CPU_ZERO(&t->online);
	t->cpus = NULL;
	t->n = 0;
	at_root(dir, sizeof(dir), root, SYSFS_CPU_DIR);
	DIR *d = opendir(dir);
	struct dirent *de;
	while (d && (de = readdir(d)) != NULL) {
		if (!is_cpu_entry(de->d_name))
			continue;
		long cpu = strtol(de->d_name + 3, NULL, 10);
		if (cpu < 0 || cpu >= CPU_SETSIZE)
			continue;
		long online;
		snprintf(path, sizeof(path), "%s/%s/online", dir, de->d_name);
		/* no "online" attribute: a CPU that cannot be taken offline (cpu0 on x86) */
		if (read_number(path, &online) && online == 0)
			continue;
		if (t->n == cap) {
			cap = cap ? cap * 2 : 64;
			t->cpus = xrealloc(t->cpus, cap * sizeof(*t->cpus));
		}
		CpuInfo *ci = &t->cpus[t->n++];
		ci->cpu = (int)cpu;
		read_ids(dir, de->d_name, ci);
		CPU_SET(ci->cpu, &t->online);
	}
	if (d)
		closedir(d);
	if (t->n == 0) {
		/* no sysfs: the CPUs the C library counts, without topology */
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		for (long c = 0; c < (n < 1 ? 1 : n) && c < CPU_SETSIZE; c++)
			CPU_SET((int)c, &t->online);
	}
}

static int cmp_core(const void *a, const void *b)
{
	const CpuInfo *x = a, *y = b;
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
	return c ? c : cmp_int(&((const CpuInfo *)a)->cpu, &((const CpuInfo *)b)->cpu);
}

static void add_core(CpuAllowance *out, int cpu)
{
	if (out->n_core_cpus < CPU_ALLOWANCE_CORE_CPUS)
		out->core_cpus[out->n_core_cpus++] = cpu;
	out->cores++;
}

/* The physical cores among the allowed CPUs; every allowed CPU is one where a topology is missing. */
static void count_cores(const Topology *t, const cpu_set_t *allowed, CpuAllowance *out)
{
	CpuInfo *mine = xcalloc(t->n ? t->n : 1, sizeof(*mine));
	size_t n = 0;
	bool ids = t->n > 0;
	for (size_t i = 0; i < t->n; i++)
		if (CPU_ISSET(t->cpus[i].cpu, allowed)) {
			mine[n++] = t->cpus[i];
			ids = ids && t->cpus[i].ids;
		}
	out->cores = out->n_core_cpus = 0;
	if (ids) {
		qsort(mine, n, sizeof(*mine), cmp_core_cpu);
		for (size_t i = 0; i < n; i++)
			if (i == 0 || cmp_core(&mine[i - 1], &mine[i]) != 0)
				add_core(out, mine[i].cpu);
		qsort(out->core_cpus, (size_t)out->n_core_cpus, sizeof(int), cmp_int);
	} else {
		for (int c = 0; c < CPU_SETSIZE; c++)
			if (CPU_ISSET(c, allowed))
				add_core(out, c);
	}
	free(mine);
}

/* ---- cgroups ---- */

/* Is `name` one of the comma-separated words of list[0..len)? */
static bool has_word(const char *list, size_t len, const char *name)
{
	size_t n = strlen(name);
	const char *end = list + len;
	for (const char *p = list; p < end;) {
		const char *comma = memchr(p, ',', (size_t)(end - p));
		size_t w = (size_t)((comma ? comma : end) - p);
		if (w == n && memcmp(p, name, n) == 0)
			return true;
		p = comma ? comma + 1 : end;
	}
	return false;
}

/*
 * The cgroup path of one hierarchy from /proc/self/cgroup: the v2 line
 * ("0::/path") when controller is NULL, else the v1 line that lists the
 * controller. False when there is none.
 */
static bool cgroup_path(const char *cgroup_file, const char *controller, char *path, size_t len)
{
	for (const char *line = cgroup_file; line && *line;) {
		const char *eol = strchr(line, '\n');
		const char *end = eol ? eol : line + strlen(line);
		const char *c1 = memchr(line, ':', (size_t)(end - line));
		const char *c2 = c1 ? memchr(c1 + 1, ':', (size_t)(end - c1 - 1)) : NULL;
		if (c2) {
			bool v2 = c1 - line == 1 && line[0] == '0' && c2 == c1 + 1;
			bool match = controller ? !v2 && has_word(c1 + 1, (size_t)(c2 - c1 - 1), controller) : v2;
			if (match && end - c2 - 1 > 0 && c2[1] == '/') {
				snprintf(path, len, "%.*s", (int)(end - c2 - 1), c2 + 1);
				return true;
			}
		}
		line = eol ? eol + 1 : NULL;
	}
	return false;
}

/* mountinfo escapes space, tab, newline and backslash as \ooo */
static void unescape(char *s)
{
	char *w = s;
	for (const char *r = s; *r;) {
		if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' && r[3] >= '0' &&
		    r[3] <= '7') {
			*w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
			r += 4;
		} else {
			*w++ = *r++;
		}
	}
	*w = '\0';
}

#define MOUNT_FIELDS 64 /* fields of one mountinfo line that are looked at, at most */

/* The fields of one mountinfo line that matter here (pointers into the line, unescaped). */
typedef struct MountLine {
	char *root;    /* the directory of the file system that is mounted ("/" or a cgroup) */
	char *point;   /* where it is mounted */
	char *fstype;  /* "cgroup2", "cgroup", ... */
	char *options; /* the super options: a v1 hierarchy's controllers are among them */
} MountLine;

/*
 * Split one line of /proc/self/mountinfo in place: "ID PARENT MAJ:MIN ROOT
 * POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS". False when
 * the line does not have that shape.
 */
static bool mount_line_split(char *line, MountLine *m)
{
	char *f[MOUNT_FIELDS];
	int nf = 0;
	for (char *save = NULL, *tok = strtok_r(line, " ", &save); tok && nf < MOUNT_FIELDS;
	     tok = strtok_r(NULL, " ", &save))
		f[nf++] = tok;
	for (int dash = 6; dash + 3 < nf; dash++)
		if (strcmp(f[dash], "-") == 0) {
			m->root = f[3];
			m->point = f[4];
			m->fstype = f[dash + 1];
			m->options = f[dash + 3];
			unescape(m->root);
			unescape(m->point);
			return true;
		}
	return false;
}

/*
 * Where the cgroup `path` is in a mount: rel is the part of the path below
 * the mount's root ("" for the root itself). False when the mount's root is
 * neither the path nor one of its ancestors (another cgroup was mounted).
 */
static bool path_below(const char *mroot, const char *path, char *rel, size_t rel_len)
{
	size_t rl = strlen(mroot);
	while (rl > 0 && mroot[rl - 1] == '/')
		rl--;
	if (strncmp(path, mroot, rl) != 0 || (path[rl] != '\0' && path[rl] != '/'))
		return false;
	const char *below = path + rl;
	size_t bl = strlen(below);
	while (bl > 0 && below[bl - 1] == '/')
		bl--;
	snprintf(rel, rel_len, "%.*s", (int)bl, below);
	return true;
}

/*
 * The directory of the cgroup `path` in the hierarchy mounted with type
 * fstype ("cgroup2", or "cgroup" with `controller` among its options),
 * from mountinfo: into mount (the mount point) and rel (the path below
 * it). False when no mount fits.
 */
static bool cgroup_dir(const char *mountinfo, const char *fstype, const char *controller, const char *path, char *mount,
                       size_t mount_len, char *rel, size_t rel_len)
{
	bool found = false;
	for (const char *line = mountinfo; !found && line && *line;) {
		const char *eol = strchr(line, '\n');
		size_t n = eol ? (size_t)(eol - line) : strlen(line);
		char *copy = xmalloc(n + 1);
		memcpy(copy, line, n);
		copy[n] = '\0';
		line = eol ? eol + 1 : NULL;
		MountLine m;
		if (mount_line_split(copy, &m) && strcmp(m.fstype, fstype) == 0 &&
		    (!controller || has_word(m.options, strlen(m.options), controller)) &&
		    path_below(m.root, path, rel, rel_len)) {
			snprintf(mount, mount_len, "%s", m.point);
			found = true;
		}
		free(copy);
	}
	return found;
}

/* The files of one cgroup hierarchy: where the process's cgroup is. */
typedef struct CgroupDir {
	char mount[PATH_MAX]; /* the mount point (under the root prefix when read) */
	char rel[PATH_MAX];   /* the cgroup below it, "" for the mount's root */
} CgroupDir;

static bool find_cgroup(const char *cgroup_file, const char *mountinfo, const char *controller, CgroupDir *cd)
{
	char path[PATH_MAX];
	if (!cgroup_path(cgroup_file, controller, path, sizeof(path)))
		return false;
	return cgroup_dir(mountinfo, controller ? "cgroup" : "cgroup2", controller, path, cd->mount, sizeof(cd->mount),
	                  cd->rel, sizeof(cd->rel));
}

/* ROOT + mount + rel[0..rel_len) + "/" + name */
static char *read_cgroup_file(const char *root, const CgroupDir *cd, size_t rel_len, const char *name)
{
	char path[PATH_MAX * 2 + 64];
	snprintf(path, sizeof(path), "%s%.*s/%s", cd->mount, (int)rel_len, cd->rel, name);
	return read_at(root, path);
}

/* Keep the smaller of two quotas (quota/period); a quota of 0 is none. True when this one is kept. */
static bool keep_smaller(int64_t q, int64_t p, CpuAllowance *out)
{
	if (q <= 0 || p <= 0)
		return false;
	if (out->quota_us == 0 || (double)q / (double)p < (double)out->quota_us / (double)out->period_us) {
		out->quota_us = q;
		out->period_us = p;
		return true;
	}
	return false;
}

/* The quotas from the cgroup up to the mount's root (v2 cpu.max, or v1 cfs_quota_us / cfs_period_us). */
static void read_quota(const char *root, const CgroupDir *cd, bool v2, CpuAllowance *out)
{
	size_t len = strlen(cd->rel);
	for (;;) {
		int64_t q = 0, p = 0;
		if (v2) {
			char *text = read_cgroup_file(root, cd, len, "cpu.max");
			if (!cpu_max_parse(text, &q, &p))
				q = 0;
			free(text);
		} else {
			char *tq = read_cgroup_file(root, cd, len, "cpu.cfs_quota_us");
			char *tp = read_cgroup_file(root, cd, len, "cpu.cfs_period_us");
			if (!parse_int64(tq, &q) || !parse_int64(tp, &p))
				q = 0; /* -1: no quota */
			free(tq);
			free(tp);
		}
		if (keep_smaller(q, p, out)) {
			char dir[PATH_MAX * 2 + 8];
			snprintf(dir, sizeof(dir), "%s%.*s", cd->mount, (int)len, cd->rel);
			at_root(out->quota_dir, sizeof(out->quota_dir), root, dir);
			out->quota_v2 = v2;
		}
		if (len == 0)
			break;
		/* up one level: "/a/b" -> "/a" -> "" */
		while (len > 0 && cd->rel[len - 1] != '/')
			len--;
		if (len > 0)
			len--;
	}
}

/* The cgroup's cpuset: its effective CPUs (which already honour the ancestors), or its own list. */
static bool read_cpuset(const char *root, const CgroupDir *cd, bool v2, cpu_set_t *set)
{
	static const char *const v2_files[] = {"cpuset.cpus.effective", NULL};
	static const char *const v1_files[] = {"cpuset.effective_cpus", "cpuset.cpus", NULL};
	for (const char *const *name = v2 ? v2_files : v1_files; *name; name++) {
		char *text = read_cgroup_file(root, cd, strlen(cd->rel), *name);
		bool ok = cpu_list_parse(text, set);
		free(text);
		if (ok)
			return true;
	}
	return false;
}

/* The cgroup limits of both versions (a host may mount both): the smallest quota, the narrowest cpuset. */
static bool read_cgroups(const char *root, CpuAllowance *out, cpu_set_t *cpuset)
{
	char *cgroup_file = read_at(root, "/proc/self/cgroup");
	char *mountinfo = read_at(root, "/proc/self/mountinfo");
	bool have_cpuset = false;
	CgroupDir *cd = xmalloc(sizeof(*cd));
	if (cgroup_file && mountinfo) {
		cpu_set_t set;
		if (find_cgroup(cgroup_file, mountinfo, NULL, cd)) {
			read_quota(root, cd, true, out);
			if (read_cpuset(root, cd, true, &set)) {
				*cpuset = set;
				have_cpuset = true;
			}
		}
		if (find_cgroup(cgroup_file, mountinfo, "cpu", cd))
			read_quota(root, cd, false, out);
		if (find_cgroup(cgroup_file, mountinfo, "cpuset", cd) && read_cpuset(root, cd, false, &set)) {
			if (have_cpuset)
				CPU_AND(cpuset, cpuset, &set);
			else
				*cpuset = set;
			have_cpuset = true;
		}
	}
	free(cd);
	free(cgroup_file);
	free(mountinfo);
	return have_cpuset;
}

/* ---- the allowance ---- */

/* A limit of `value` CPUs from `from` takes over when it is as small as the one so far (ties: the later). */
static void consider(CpuAllowance *out, double value, int workers, CpusFrom from)
{
	if (value <= out->cpus) {
		out->cpus = value;
		out->max_workers = workers;
		out->from = from;
	}
}

static int count_and(const cpu_set_t *a, const cpu_set_t *b)
{
	cpu_set_t x;
	CPU_AND(&x, a, b);
	return CPU_COUNT(&x);
}

void cpu_allowance_read(const char *root, const cpu_set_t *affinity, CpuAllowance *out)
{
	memset(out, 0, sizeof(*out));
	Topology t;
	topology_read(root, &t);
	cpu_set_t allowed = t.online, cpuset;
	out->online = out->affinity = out->cpuset = CPU_COUNT(&t.online);

	/* a mask that leaves no online CPU (read while CPUs came and went) says nothing */
	if (affinity && count_and(affinity, &allowed) > 0) {
		out->affinity = count_and(affinity, &t.online);
		CPU_AND(&allowed, &allowed, affinity);
	}
	if (read_cgroups(root, out, &cpuset) && count_and(&cpuset, &allowed) > 0) {
		out->cpuset = count_and(&cpuset, &t.online);
		CPU_AND(&allowed, &allowed, &cpuset);
	}
	count_cores(&t, &allowed, out);
	out->allowed = allowed;
	free(t.cpus);

	out->cpus = out->cores;
	out->max_workers = out->cores;
	out->from = CPUS_FROM_CORES;
	/* a mask that excludes no online CPU is no limit */
	if (out->affinity < out->online)
		consider(out, out->affinity, out->affinity, CPUS_FROM_AFFINITY);
	if (out->cpuset < out->online)
		consider(out, out->cpuset, out->cpuset, CPUS_FROM_CPUSET);
	if (out->quota_us > 0) {
		int64_t workers = (out->quota_us + out->period_us - 1) / out->period_us;
		consider(out, (double)out->quota_us / (double)out->period_us,
		         workers > INT_MAX ? INT_MAX : (int)workers, CPUS_FROM_QUOTA);
	}
	if (out->max_workers < 1)
		out->max_workers = 1;
}

void cpu_allowance_read_self(CpuAllowance *out)
{
	cpu_set_t mask;
	CPU_ZERO(&mask);
	bool have = sched_getaffinity(0, sizeof(mask), &mask) == 0;
	cpu_allowance_read("/", have ? &mask : NULL, out);
}

void cpu_allowance_describe(const CpuAllowance *a, char *buf, size_t len)
{
	int n = (int)a->cpus;
	const char *s = n == 1 ? "" : "s";
	switch (a->from) {
	case CPUS_FROM_AFFINITY:
		snprintf(buf, len, "%d CPU%s of the affinity mask", n, s);
		return;
	case CPUS_FROM_CPUSET:
		snprintf(buf, len, "%d CPU%s of the cgroup cpuset", n, s);
		return;
	case CPUS_FROM_QUOTA:
		/* thousandths, as SHOW SCALER shows it */
		snprintf(buf, len, "cgroup quota of %.10g CPU%s", (double)(int64_t)(a->cpus * 1000 + 0.5) / 1000,
		         a->cpus > 1 ? "s" : "");
		return;
	case CPUS_FROM_CORES:
		break;
	}
	snprintf(buf, len, "%d physical core%s", n, s);
}
