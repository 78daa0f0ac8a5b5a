/*
 * Unit tests for warmstart.c: the file round trip, every way a file can be
 * broken, and the atomic write (rename() and fsync() are wrapped by the
 * linker, -Wl,--wrap, to watch their order and to make them fail).
 */
#include "autoconfig.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "master/warmstart.h"

/* ---- the wrapped system calls ---- */

int __real_rename(const char *from, const char *to);
int __wrap_rename(const char *from, const char *to);
int __real_fsync(int fd);
int __wrap_fsync(int fd);

static char events[256];      /* "fsync(file) rename fsync(dir) " */
static int rename_errno;      /* fail the next rename() with this */
static int fsync_file_errno;  /* fail the next fsync() of a file with this */
static char seen_target[128]; /* the target's content when rename() was called */
static char seen_tmp[128];    /* the temporary file's content then */
static bool tmp_synced_first; /* fsync() of the temporary file came before rename() */

static void slurp(const char *path, char *buf, size_t len)
{
	buf[0] = '\0';
	int fd = open(path, O_RDONLY);
	if (fd < 0) {
		snprintf(buf, len, "<%s>", strerror(errno));
		return;
	}
	ssize_t got = read(fd, buf, len - 1);
	buf[got > 0 ? got : 0] = '\0';
	close(fd);
}

/* Append to events; bounded, the round trip writes 64 times without looking. */
static void note(const char *what)
{
	size_t used = strlen(events);
	snprintf(events + used, sizeof(events) - used, "%s", what);
}

int __wrap_rename(const char *from, const char *to)
{
	note("rename ");
	slurp(to, seen_target, sizeof(seen_target));
	slurp(from, seen_tmp, sizeof(seen_tmp));
	tmp_synced_first = strstr(events, "fsync(file) rename") != NULL;
	if (rename_errno) {
		errno = rename_errno;
		rename_errno = 0;
		return -1;
	}
	return __real_rename(from, to);
}

int __wrap_fsync(int fd)
{
	struct stat st;
	bool dir = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
	note(dir ? "fsync(dir) " : "fsync(file) ");
	if (!dir && fsync_file_errno) {
		errno = fsync_file_errno;
		fsync_file_errno = 0;
		return -1;
	}
	return __real_fsync(fd);
}

/* ---- a temporary directory per test ---- */

static char dir[64];  /* the test's directory */
static char path[96]; /* dir/state */
static char tmp[128]; /* dir/state.tmp */

static int setup(void **state)
{
	strcpy(dir, "/tmp/test_warmstart.XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	snprintf(path, sizeof(path), "%s/state", dir);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	events[0] = '\0';
	rename_errno = fsync_file_errno = 0;
	umask(022);
	return 0;
}

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(p);
}

static int teardown(void **state)
{
	return nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void put(const char *p, const char *data, size_t len)
{
	int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, data, len), (ssize_t)len);
	assert_int_equal(close(fd), 0);
}

/* The file holds `text`: reading fails with exactly `reason`. */
static void assert_rejected_len(const char *text, size_t len, const char *reason)
{
	char err[256] = "";
	int count = -1;
	put(path, text, len);
	assert_false(warmstart_read(path, &count, err, sizeof(err)));
	assert_int_equal(count, -1);
	assert_string_equal(err, reason);
}

static void assert_rejected(const char *text, const char *reason)
{
	assert_rejected_len(text, strlen(text), reason);
}

static bool exists(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0;
}

/* ---- tests ---- */

static void test_round_trip(void **state)
{
	char err[256] = "", buf[128];
	int count = 0;

	assert_true(warmstart_write(path, 3, err, sizeof(err)));
	slurp(path, buf, sizeof(buf));
	assert_string_equal(buf, "pgbouncer-workers 1\ncount 3\n");
	assert_true(warmstart_read(path, &count, err, sizeof(err)));
	assert_int_equal(count, 3);

	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0644);

	for (int n = 1; n <= WARMSTART_MAX_COUNT; n++) {
		assert_true(warmstart_write(path, n, err, sizeof(err)));
		assert_true(warmstart_read(path, &count, err, sizeof(err)));
		assert_int_equal(count, n);
	}
	assert_false(exists(tmp));
}

static void test_write_rejects_bad_counts(void **state)
{
	char err[256] = "";
	assert_false(warmstart_write(path, 0, err, sizeof(err)));
	assert_string_equal(err, "count 0 out of range 1..64");
	assert_false(warmstart_write(path, -2, err, sizeof(err)));
	assert_string_equal(err, "count -2 out of range 1..64");
	assert_false(warmstart_write(path, 65, err, sizeof(err)));
	assert_string_equal(err, "count 65 out of range 1..64");
	assert_false(exists(path));
	assert_false(exists(tmp));
}

static void test_missing(void **state)
{
	char err[256] = "";
	int count = -1;
	errno = 0;
	assert_false(warmstart_read(path, &count, err, sizeof(err)));
	assert_int_equal(errno, ENOENT);
	assert_string_equal(err, "open() failed: No such file or directory");
	assert_int_equal(count, -1);

	/* a directory in its place */
	assert_false(warmstart_read(dir, &count, err, sizeof(err)));
	assert_string_equal(err, "not a regular file");

	/* a FIFO: rejected at once, not waited on for a writer */
	assert_int_equal(mkfifo(path, 0644), 0);
	assert_false(warmstart_read(path, &count, err, sizeof(err)));
	assert_string_equal(err, "not a regular file");
	assert_int_equal(count, -1);
}

static void test_empty(void **state)
{
	assert_rejected("", "empty file");
}

static void test_truncated(void **state)
{
	assert_rejected("pgbouncer-wor", "truncated: line 1 does not end in a newline");
	assert_rejected("pgbouncer-workers 1", "truncated: line 1 does not end in a newline");
	assert_rejected("pgbouncer-workers 1\n", "truncated: line 2 (\"count ...\") is missing");
	assert_rejected("pgbouncer-workers 1\ncou", "truncated: line 2 does not end in a newline");
	/* cut inside the number: "count 1" of "count 12" must not read as 1 */
	assert_rejected("pgbouncer-workers 1\ncount 1", "truncated: line 2 does not end in a newline");

	/* every proper prefix of a valid file is rejected */
	const char *full = "pgbouncer-workers 1\ncount 12\n";
	for (size_t len = 0; len < strlen(full); len++) {
		char err[256] = "";
		int count = -1;
		put(path, full, len);
		assert_false(warmstart_read(path, &count, err, sizeof(err)));
		assert_int_equal(count, -1);
		assert_true(err[0] != '\0');
	}
	int count = -1;
	char err[256];
	put(path, full, strlen(full));
	assert_true(warmstart_read(path, &count, err, sizeof(err)));
	assert_int_equal(count, 12);
}

static void test_corrupt(void **state)
{
	assert_rejected("hello\n", "line 1: expected \"pgbouncer-workers <number>\"");
	assert_rejected("count 3\n", "line 1: expected \"pgbouncer-workers <number>\"");
	assert_rejected("pgbouncer-workers\ncount 3\n", "line 1: expected \"pgbouncer-workers <number>\"");
	assert_rejected("pgbouncer-workersX1\ncount 3\n", "line 1: expected \"pgbouncer-workers <number>\"");
	assert_rejected("pgbouncer-workers 2\ncount 3\n", "unsupported format version 2 (expected 1)");
	assert_rejected("pgbouncer-workers 1\nsize 3\n", "line 2: expected \"count <number>\"");
	assert_rejected("pgbouncer-workers 1\ncount \n", "line 2: count has no value");
	assert_rejected("pgbouncer-workers 1\ncount 3x\n", "line 2: count must be decimal digits only");
	assert_rejected("pgbouncer-workers 1\ncount  3\n", "line 2: count must be decimal digits only");
	assert_rejected("pgbouncer-workers 1\ncount +3\n", "line 2: count must be decimal digits only");
	assert_rejected("pgbouncer-workers 1\ncount 3\r\n", "line 2: count must be decimal digits only");
	assert_rejected("pgbouncer-workers 1\ncount 0x3\n", "line 2: count must be decimal digits only");
	assert_rejected_len("pgbouncer-workers 1\ncount 3\0\n", 29, "line 2: count must be decimal digits only");
	assert_rejected_len("\0\0\0\0\n\xff\xfe", 7, "line 1: expected \"pgbouncer-workers <number>\"");
}

static void test_trailing_junk(void **state)
{
	assert_rejected("pgbouncer-workers 1\ncount 3\nextra\n", "trailing data after the count");
	assert_rejected("pgbouncer-workers 1\ncount 3\n\n", "trailing data after the count");
	assert_rejected("pgbouncer-workers 1\ncount 3\ncount 4\n", "trailing data after the count");
	assert_rejected_len("pgbouncer-workers 1\ncount 3\n\0", 29, "trailing data after the count");
}

static void test_negative(void **state)
{
	assert_rejected("pgbouncer-workers 1\ncount -3\n", "line 2: count is negative");
	assert_rejected("pgbouncer-workers -1\ncount 3\n", "line 1: pgbouncer-workers is negative");
}

static void test_out_of_range(void **state)
{
	assert_rejected("pgbouncer-workers 1\ncount 0\n", "count 0 out of range: at least 1");
	assert_rejected("pgbouncer-workers 1\ncount 99999999999999999999\n",
	                "line 2: count 999999999... is absurdly large");
	assert_rejected("pgbouncer-workers 18446744073709551617\ncount 3\n",
	                "line 1: pgbouncer-workers 184467440... is absurdly large");

	/* a huge file is not read whole, and not accepted */
	static char big[4096];
	memset(big, '9', sizeof(big));
	memcpy(big, "pgbouncer-workers 1\ncount ", 26);
	assert_rejected_len(big, sizeof(big), "longer than 128 bytes: not a worker state file");

	/* a count above what is written (a file from elsewhere) is read; the caller clamps it */
	int count = 0;
	char err[256];
	put(path, "pgbouncer-workers 1\ncount 65\n", 29);
	assert_true(warmstart_read(path, &count, err, sizeof(err)));
	assert_int_equal(count, 65);
	put(path, "pgbouncer-workers 1\ncount 999999999\n", 36);
	assert_true(warmstart_read(path, &count, err, sizeof(err)));
	assert_int_equal(count, 999999999);
	assert_int_equal(warmstart_clamp(count, 1, 4), 4);

	/* leading zeros are only digits */
	put(path, "pgbouncer-workers 01\ncount 007\n", 31);
	assert_true(warmstart_read(path, &count, err, sizeof(err)));
	assert_int_equal(count, 7);
}

static void test_clamp(void **state)
{
	assert_int_equal(warmstart_clamp(3, 1, 4), 3);
	assert_int_equal(warmstart_clamp(1, 1, 4), 1);
	assert_int_equal(warmstart_clamp(4, 1, 4), 4);
	assert_int_equal(warmstart_clamp(0, 1, 4), 1);
	assert_int_equal(warmstart_clamp(9, 1, 4), 4);
	assert_int_equal(warmstart_clamp(5, 2, 2), 2);
	assert_int_equal(warmstart_clamp(3, 4, 2), 4); /* min wins */
}

static void test_write_order_and_atomic_replace(void **state)
{
	char err[256] = "", buf[128];
	int count = 0;

	assert_true(warmstart_write(path, 5, err, sizeof(err)));
	assert_string_equal(events, "fsync(file) rename fsync(dir) ");
	assert_string_equal(seen_target, "<No such file or directory>");

	/* a reader holding the old file keeps reading the old content */
	int old_fd = open(path, O_RDONLY);
	assert_true(old_fd >= 0);
	struct stat before, after;
	assert_int_equal(fstat(old_fd, &before), 0);

	events[0] = '\0';
	assert_true(warmstart_write(path, 7, err, sizeof(err)));
	assert_string_equal(events, "fsync(file) rename fsync(dir) ");
	assert_true(tmp_synced_first);
	/* until the rename, PATH held the whole old file and PATH.tmp the whole new one */
	assert_string_equal(seen_target, "pgbouncer-workers 1\ncount 5\n");
	assert_string_equal(seen_tmp, "pgbouncer-workers 1\ncount 7\n");

	ssize_t got = pread(old_fd, buf, sizeof(buf) - 1, 0);
	assert_true(got > 0);
	buf[got] = '\0';
	assert_string_equal(buf, "pgbouncer-workers 1\ncount 5\n");
	close(old_fd);

	/* replaced by another inode, not rewritten in place */
	assert_int_equal(stat(path, &after), 0);
	assert_true(before.st_ino != after.st_ino);
	assert_true(warmstart_read(path, &count, err, sizeof(err)));
	assert_int_equal(count, 7);
	assert_false(exists(tmp));
}

static void test_stale_tmp_replaced(void **state)
{
	char err[256] = "";
	int count = 0;
	put(tmp, "garbage from a crash, longer than the real content\n", 51);
	assert_true(warmstart_write(path, 2, err, sizeof(err)));
	assert_true(warmstart_read(path, &count, err, sizeof(err)));
	assert_int_equal(count, 2);
	assert_false(exists(tmp));

	/* a FIFO left there is replaced, not opened (which would wait for a reader) */
	assert_int_equal(mkfifo(tmp, 0644), 0);
	assert_true(warmstart_write(path, 3, err, sizeof(err)));
	assert_true(warmstart_read(path, &count, err, sizeof(err)));
	assert_int_equal(count, 3);

	/* a hard link to another file: that file is left as it was */
	char other[160], buf[128];
	snprintf(other, sizeof(other), "%s/other", dir);
	put(other, "keep me\n", 8);
	assert_int_equal(link(other, tmp), 0);
	assert_true(warmstart_write(path, 4, err, sizeof(err)));
	slurp(other, buf, sizeof(buf));
	assert_string_equal(buf, "keep me\n");
}

static void test_failed_write_keeps_the_old_file(void **state)
{
	char err[256] = "", buf[128];
	assert_true(warmstart_write(path, 4, err, sizeof(err)));

	rename_errno = EXDEV;
	assert_false(warmstart_write(path, 6, err, sizeof(err)));
	assert_string_equal(err, "rename() failed: Invalid cross-device link");
	slurp(path, buf, sizeof(buf));
	assert_string_equal(buf, "pgbouncer-workers 1\ncount 4\n");
	assert_false(exists(tmp));

	fsync_file_errno = EIO;
	events[0] = '\0';
	assert_false(warmstart_write(path, 6, err, sizeof(err)));
	assert_string_equal(err, "fsync() failed: Input/output error");
	assert_string_equal(events, "fsync(file) "); /* no rename after a failed fsync */
	slurp(path, buf, sizeof(buf));
	assert_string_equal(buf, "pgbouncer-workers 1\ncount 4\n");
	assert_false(exists(tmp));

	/* PATH is a non-empty directory: the rename fails for real */
	assert_int_equal(unlink(path), 0);
	assert_int_equal(mkdir(path, 0755), 0);
	char inner[160];
	snprintf(inner, sizeof(inner), "%s/x", path);
	put(inner, "x", 1);
	assert_false(warmstart_write(path, 6, err, sizeof(err)));
	assert_true(strncmp(err, "rename() failed: ", 17) == 0);
	assert_false(exists(tmp));
}

static void test_write_to_missing_directory(void **state)
{
	char err[256] = "", p[160];
	snprintf(p, sizeof(p), "%s/no/such/dir/state", dir);
	assert_false(warmstart_write(p, 2, err, sizeof(err)));
	assert_string_equal(err, "open() of the temporary file failed: No such file or directory");
	/* no buffer for the reason: still false, no crash */
	assert_false(warmstart_write(p, 2, NULL, 0));
}

static void test_relative_path(void **state)
{
	char err[256] = "", cwd[4096];
	int count = 0;
	assert_non_null(getcwd(cwd, sizeof(cwd)));
	assert_int_equal(chdir(dir), 0);
	events[0] = '\0';
	bool ok = warmstart_write("state", 9, err, sizeof(err));
	bool read_ok = warmstart_read("state", &count, err, sizeof(err));
	assert_int_equal(chdir(cwd), 0);
	assert_true(ok);
	assert_true(read_ok);
	assert_int_equal(count, 9);
	assert_string_equal(events, "fsync(file) rename fsync(dir) ");
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
	const struct CMUnitTest tests[] = {
	    T(test_round_trip),
	    T(test_write_rejects_bad_counts),
	    T(test_missing),
	    T(test_empty),
	    T(test_truncated),
	    T(test_corrupt),
	    T(test_trailing_junk),
	    T(test_negative),
	    T(test_out_of_range),
	    T(test_clamp),
	    T(test_write_order_and_atomic_replace),
	    T(test_stale_tmp_replaced),
	    T(test_failed_write_keeps_the_old_file),
	    T(test_write_to_missing_directory),
	    T(test_relative_path),
	};
#undef T
	return cmocka_run_group_tests(tests, NULL, NULL);
}
