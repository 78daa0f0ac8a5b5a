/*
 * The warm-start file (worker_state_file): the master saves the active
 * worker count after every change and restores it at start. Format in
 * include/master/warmstart.h; parsing is strict, writing atomic.
 */
#include "autoconfig.h"

#include "master/warmstart.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define WARMSTART_MAGIC      "pgbouncer-workers"
#define WARMSTART_VERSION    1
#define WARMSTART_MAX_FILE   128 /* a valid file is far smaller */
#define WARMSTART_MAX_DIGITS 9   /* more cannot be in range, and cannot overflow a long */

/*
 * Parse line `lineno` ("<key> <digits>\n") starting at *pos and advance past
 * it. The value is checked for form here, for range by the caller.
 */
static bool parse_line(const char *buf, size_t len, size_t *pos, int lineno, const char *key, long *val, char *err,
                       size_t errlen)
{
	const char *line = buf + *pos;
	size_t left = len - *pos;
	if (left == 0)
		return set_error(err, errlen, "truncated: line %d (\"%s ...\") is missing", lineno, key);
	const char *nl = memchr(line, '\n', left);
	if (!nl)
		return set_error(err, errlen, "truncated: line %d does not end in a newline", lineno);
	size_t line_len = (size_t)(nl - line);
	size_t klen = strlen(key);
	if (line_len <= klen || memcmp(line, key, klen) != 0 || line[klen] != ' ')
		return set_error(err, errlen, "line %d: expected \"%s <number>\"", lineno, key);

	const char *digits = line + klen + 1;
	size_t ndigits = line_len - klen - 1;
	if (ndigits == 0)
		return set_error(err, errlen, "line %d: %s has no value", lineno, key);
	if (digits[0] == '-')
		return set_error(err, errlen, "line %d: %s is negative", lineno, key);
	for (size_t i = 0; i < ndigits; i++)
		if (digits[i] < '0' || digits[i] > '9')
			return set_error(err, errlen, "line %d: %s must be decimal digits only", lineno, key);
	if (ndigits > WARMSTART_MAX_DIGITS)
		return set_error(err, errlen, "line %d: %s %.*s... is absurdly large", lineno, key,
		                 WARMSTART_MAX_DIGITS, digits);
	long v = 0;
	for (size_t i = 0; i < ndigits; i++)
		v = v * 10 + (digits[i] - '0');
	*val = v;
	*pos += line_len + 1;
	return true;
}

bool warmstart_read(const char *path, int *count, char *err, size_t errlen)
{
	char buf[WARMSTART_MAX_FILE + 1];
	size_t len = 0;

	/* O_NONBLOCK: open() of a FIFO would wait for a writer, and the master with it */
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		set_error(err, errlen, "open() failed: %s", strerror(e));
		errno = e;
		return false;
	}
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		close(fd);
		return set_error(err, errlen, "fstat() failed: %s", strerror(e));
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return set_error(err, errlen, "not a regular file");
	}
	/* read one byte more than a file may hold, to see that it is too long */
	while (len < sizeof(buf)) {
		ssize_t got = read(fd, buf + len, sizeof(buf) - len);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			int e = errno;
			close(fd);
			return set_error(err, errlen, "read() failed: %s", strerror(e));
		}
		if (got == 0)
			break;
		len += (size_t)got;
	}
	close(fd);

	if (len == 0)
		return set_error(err, errlen, "empty file");
	if (len > WARMSTART_MAX_FILE)
		return set_error(err, errlen, "longer than %d bytes: not a worker state file", WARMSTART_MAX_FILE);

	size_t pos = 0;
	long version, value;
	if (!parse_line(buf, len, &pos, 1, WARMSTART_MAGIC, &version, err, errlen))
		return false;
	if (version != WARMSTART_VERSION)
		return set_error(err, errlen, "unsupported format version %ld (expected %d)", version,
		                 WARMSTART_VERSION);
	if (!parse_line(buf, len, &pos, 2, "count", &value, err, errlen))
		return false;
	if (pos != len)
		return set_error(err, errlen, "trailing data after the count");
	/* a count above WARMSTART_MAX_COUNT is read as it is: the caller clamps it to max_workers */
	if (value < 1)
		return set_error(err, errlen, "count %ld out of range: at least 1", value);
	*count = (int)value;
	return true;
}

static bool write_all(int fd, const char *p, size_t len)
{
	while (len > 0) {
		ssize_t done = write(fd, p, len);
		if (done < 0 && errno == EINTR)
			continue;
		if (done < 0)
			return false;
		p += done;
		len -= (size_t)done;
	}
	return true;
}

/* fsync the directory holding path, so the rename itself survives a crash. */
static bool sync_parent_dir(const char *path, char *err, size_t errlen)
{
	char dir[PATH_MAX];
	const char *slash = strrchr(path, '/');
	if (!slash)
		strcpy(dir, ".");
	else if (slash == path)
		strcpy(dir, "/");
	else
		snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);

	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return set_error(err, errlen, "open() of the directory failed: %s", strerror(errno));
	/* EINVAL: a file system that cannot sync directories; nothing more to do there */
	if (fsync(fd) < 0 && errno != EINVAL) {
		int e = errno;
		close(fd);
		return set_error(err, errlen, "fsync() of the directory failed: %s", strerror(e));
	}
	close(fd);
	return true;
}

bool warmstart_write(const char *path, int count, char *err, size_t errlen)
{
	char tmp[PATH_MAX];
	char text[64];
	const char *call;
	int e;

	if (count < 1 || count > WARMSTART_MAX_COUNT)
		return set_error(err, errlen, "count %d out of range 1..%d", count, WARMSTART_MAX_COUNT);
	if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= sizeof(tmp))
		return set_error(err, errlen, "path too long");
	int tlen = snprintf(text, sizeof(text), "%s %d\ncount %d\n", WARMSTART_MAGIC, WARMSTART_VERSION, count);

	/*
	 * A new file, never the one left at tmp: open() of a FIFO there would wait
	 * for a reader, and O_TRUNC of a hard link would cut another file short.
	 */
	if (unlink(tmp) < 0 && errno != ENOENT)
		return set_error(err, errlen, "unlink() of the temporary file failed: %s", strerror(errno));
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0)
		return set_error(err, errlen, "open() of the temporary file failed: %s", strerror(errno));
	if (!write_all(fd, text, (size_t)tlen)) {
		call = "write()";
		goto failed;
	}
	if (fsync(fd) < 0) {
		call = "fsync()";
		goto failed;
	}
	if (close(fd) < 0) {
		fd = -1;
		call = "close()";
		goto failed;
	}
	fd = -1;
	if (rename(tmp, path) < 0) {
		call = "rename()";
		goto failed;
	}
	return sync_parent_dir(path, err, errlen);

failed:
	e = errno;
	if (fd >= 0)
		close(fd);
	unlink(tmp);
	return set_error(err, errlen, "%s failed: %s", call, strerror(e));
}

int warmstart_clamp(int count, int min, int max)
{
	if (count > max)
		count = max;
	if (count < min)
		count = min;
	return count;
}
