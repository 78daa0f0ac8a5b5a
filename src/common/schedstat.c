/*
 * Reading /proc/self/schedstat (include/common/schedstat.h, doc/workers.md).
 */
#include "autoconfig.h"

#include "common/schedstat.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

/* One decimal field followed by a blank or the end: false if none. */
static bool parse_field(const char **p, uint64_t *out)
{
	const char *s = *p;
	while (*s == ' ' || *s == '\t')
		s++;
	if (!isdigit((unsigned char)*s))
		return false;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno != 0 || (*end != '\0' && !isspace((unsigned char)*end)))
		return false;
	*out = (uint64_t)v;
	*p = end;
	return true;
}

bool schedstat_parse(const char *text, uint64_t *on_cpu_ns, uint64_t *wait_ns)
{
	uint64_t run, wait;
	const char *p = text;
	if (!text || !parse_field(&p, &run) || !parse_field(&p, &wait))
		return false;
	*on_cpu_ns = run;
	*wait_ns = wait;
	return true;
}

int schedstat_open_self(void)
{
	/* the main thread: a worker is one thread, its event loop */
	return open("/proc/self/schedstat", O_RDONLY | O_CLOEXEC);
}

bool schedstat_read(int fd, uint64_t *on_cpu_ns, uint64_t *wait_ns)
{
	char buf[128];
	if (fd < 0)
		return false;
	ssize_t got = pread(fd, buf, sizeof(buf) - 1, 0);
	if (got <= 0)
		return false;
	buf[got] = '\0';
	return schedstat_parse(buf, on_cpu_ns, wait_ns);
}
