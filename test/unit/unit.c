/* Set-up shared by the cmocka programs (test/unit/unit.h). */
#include "autoconfig.h"

#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "unit.h"

void unit_tmpdir(const char *prefix, char *dir, size_t len)
{
	int n = snprintf(dir, len, "/tmp/%s.XXXXXX", prefix);
	assert_true(n > 0 && (size_t)n < len);
	assert_non_null(mkdtemp(dir));
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

void unit_rmtree(const char *dir)
{
	assert_int_equal(nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS), 0);
}

void unit_write_file(const char *dir, const char *name, const char *text, char *path, size_t pathlen)
{
	char buf[4096];
	int n = snprintf(buf, sizeof(buf), "%s/%s", dir, name);
	assert_true(n > 0 && (size_t)n < sizeof(buf));
	FILE *f = fopen(buf, "w");
	assert_non_null(f);
	assert_true(fputs(text, f) >= 0);
	assert_int_equal(fclose(f), 0);
	if (path) {
		assert_true((size_t)n < pathlen);
		memcpy(path, buf, (size_t)n + 1);
	}
}
