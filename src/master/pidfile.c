/*
 * Pidfile handling for the master: one instance per pidfile, stale files
 * from a crashed instance cleaned up, ours removed at exit.
 */
#include "autoconfig.h"

#include "master/pidfile.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"

static char *written_path; /* set once our pidfile exists */
static pid_t written_by;   /* only the writer removes it (not forked children) */

/* A zombie (state Z in /proc/PID/stat) has exited: only its parent has not reaped it yet. */
static bool is_zombie(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	char *stat = read_file(path, NULL);
	if (!stat)
		return false;
	const char *p = strrchr(stat, ')'); /* after the command name, which may hold anything */
	bool z = p && p[1] == ' ' && p[2] == 'Z';
	free(stat);
	return z;
}

void pidfile_check(const char *path)
{
	if (!path || !*path)
		return;
	size_t len;
	char *buf = read_file(path, &len);
	if (!buf) {
		if (errno == ENOENT)
			return;
		fatal("pidfile '%s' exists, another instance running?", path);
	}
	char *end;
	errno = 0;
	long pid = strtol(buf, &end, 10);
	bool parsed = end != buf && errno == 0 && pid > 0 && (*end == '\n' || *end == '\0');
	free(buf);
	if (!parsed || ((kill((pid_t)pid, 0) == 0 || errno == EPERM) && !is_zombie((pid_t)pid)))
		fatal("pidfile '%s' exists, another instance running?", path);
	log_info("stale pidfile, removing");
	if (unlink(path) < 0 && errno != ENOENT)
		fatal("could not remove stale pidfile '%s': %s", path, strerror(errno));
}

pid_t pidfile_running(const char *path)
{
	if (!path || !*path)
		return 0;
	char *buf = read_file(path, NULL);
	if (!buf)
		return 0;
	long pid = strtol(buf, NULL, 10);
	free(buf);
	if (pid <= 0 || (kill((pid_t)pid, 0) < 0 && errno != EPERM) || is_zombie((pid_t)pid))
		return 0;
	return (pid_t)pid;
}

void pidfile_write(const char *path)
{
	if (!path || !*path)
		return;
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		fatal("could not create pidfile '%s': %s", path, strerror(errno));
	char buf[32];
	int n = snprintf(buf, sizeof(buf), "%d\n", (int)getpid());
	if (write(fd, buf, (size_t)n) != n) {
		int e = errno;
		close(fd);
		unlink(path);
		fatal("could not write pidfile '%s': %s", path, strerror(e));
	}
	close(fd);
	written_path = xstrdup(path);
	written_by = getpid();
}

void pidfile_remove(void)
{
	if (!written_path || written_by != getpid())
		return;
	unlink(written_path);
	free(written_path);
	written_path = NULL;
}

bool pidfile_replace(const char *path)
{
	if (!path || !*path)
		return true;
	size_t n = strlen(path) + 16;
	char *tmp = xmalloc(n);
	snprintf(tmp, n, "%s.new", path);
	unlink(tmp);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0) {
		log_error("could not create pidfile '%s': %s", tmp, strerror(errno));
		free(tmp);
		return false;
	}
	char buf[32];
	int len = snprintf(buf, sizeof(buf), "%d\n", (int)getpid());
	ssize_t w = write(fd, buf, (size_t)len);
	if (w != len || rename(tmp, path) < 0) {
		int e = w < 0 || w == len ? errno : ENOSPC;
		close(fd);
		unlink(tmp);
		free(tmp);
		log_error("could not write pidfile '%s': %s", path, strerror(e));
		return false;
	}
	close(fd);
	free(tmp);
	free(written_path);
	written_path = xstrdup(path);
	written_by = getpid();
	return true;
}

void pidfile_forget(void)
{
	free(written_path);
	written_path = NULL;
}
