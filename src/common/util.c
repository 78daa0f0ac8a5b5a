/*
 * Small helpers shared by master and workers: clocks, allocation that
 * treats out-of-memory as a broken invariant, whole-file reads.
 */
#include "autoconfig.h"

#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"

usec_t get_time_usec(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (usec_t)ts.tv_sec * USEC_PER_SEC + ts.tv_nsec / 1000;
}

usec_t get_mono_usec(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (usec_t)ts.tv_sec * USEC_PER_SEC + ts.tv_nsec / 1000;
}

size_t pgb_strlcpy(char *dst, const char *src, size_t size)
{
	size_t len = strlen(src);
	if (size > 0) {
		size_t n = len < size - 1 ? len : size - 1;
		memcpy(dst, src, n);
		dst[n] = '\0';
	}
	return len;
}

void *xmalloc(size_t size)
{
	void *p = malloc(size ? size : 1);
	if (!p)
		fatal("out of memory");
	return p;
}

void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);
	if (!p)
		fatal("out of memory");
	return p;
}

void *xrealloc(void *p, size_t size)
{
	void *np = realloc(p, size ? size : 1);
	if (!np)
		fatal("out of memory");
	return np;
}

char *xstrdup(const char *s)
{
	char *p = strdup(s);
	if (!p)
		fatal("out of memory");
	return p;
}

char *xstrdup_or_null(const char *s)
{
	return s ? xstrdup(s) : NULL;
}

char *read_file(const char *path, size_t *len_out)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	char *buf = read_fd(fd, len_out);
	int save = errno;
	close(fd);
	errno = save;
	return buf;
}

char *read_fd(int fd, size_t *len_out)
{
	size_t cap = 4096, len = 0;
	char *buf = xmalloc(cap);
	for (;;) {
		if (len + 1 >= cap) {
			cap *= 2;
			buf = xrealloc(buf, cap);
		}
		ssize_t n = read(fd, buf + len, cap - len - 1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			free(buf);
			return NULL;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	buf[len] = '\0';
	if (len_out)
		*len_out = len;
	return buf;
}

bool set_error(char *err, size_t errlen, const char *fmt, ...)
{
	if (err && errlen > 0) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return false;
}

static bool private_dir_overridden;
static char private_dir_chosen[108];

void private_socket_dir_override(const char *path)
{
	private_dir_overridden = true;
	pgb_strlcpy(private_dir_chosen, path ? path : "", sizeof(private_dir_chosen));
}

bool private_socket_dir(const char *unix_socket_dir, int listen_port, char *buf, size_t len)
{
	if (private_dir_overridden) {
		size_t n = strlen(private_dir_chosen);
		if (n == 0)
			return false; /* none could be made */
		if (n >= len || n + 27 >= 108)
			return false;
		memcpy(buf, private_dir_chosen, n + 1);
		return true;
	}
	const char *base = unix_socket_dir && unix_socket_dir[0] ? unix_socket_dir : "/tmp";
	/* room for "/worker.NN/.s.PGSQL.NNNNN" in a sockaddr_un */
	int n = snprintf(buf, len, "%s/pgbouncer-workers.%d", base, listen_port);
	return n > 0 && (size_t)n < len && (size_t)n + 27 < 108;
}

void sockaddr_host_port(const struct sockaddr *sa, char *host, size_t hostlen, int *port)
{
	*port = 0;
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const void *)sa;
		inet_ntop(AF_INET, &in->sin_addr, host, (socklen_t)hostlen);
		*port = ntohs(in->sin_port);
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const void *)sa;
		inet_ntop(AF_INET6, &in6->sin6_addr, host, (socklen_t)hostlen);
		*port = ntohs(in6->sin6_port);
	} else {
		const struct sockaddr_un *un = (const void *)sa;
		const char *dot = sa->sa_family == AF_UNIX ? strrchr(un->sun_path, '.') : NULL;
		pgb_strlcpy(host, "unix", hostlen);
		if (dot && strstr(un->sun_path, ".s.PGSQL."))
			*port = atoi(dot + 1);
	}
}
