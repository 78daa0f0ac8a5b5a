/*
 * Kept copies of the auth files (include/common/filesnap.h). The master
 * reads them after each successful load of the configuration; a worker is
 * forked with the copies in its memory and loads from them once.
 */
#include "autoconfig.h"

#include "common/filesnap.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"

typedef struct SnapFile {
	char *path;
	char *text; /* NULL: the read failed with err */
	size_t len;
	int err;
	struct stat st;
	struct SnapFile *next;
} SnapFile;

static SnapFile *kept;
static enum { SNAP_OFF, SNAP_RECORD, SNAP_REPLAY } mode;

void filesnap_clear(void)
{
	while (kept) {
		SnapFile *f = kept;
		kept = f->next;
		free(f->path);
		free(f->text);
		free(f);
	}
	mode = SNAP_OFF;
}

void filesnap_record(void)
{
	filesnap_clear();
	mode = SNAP_RECORD;
}

void filesnap_record_end(void)
{
	mode = SNAP_OFF;
}

void filesnap_replay(void)
{
	mode = SNAP_REPLAY;
}

static SnapFile *find(const char *path)
{
	for (SnapFile *f = kept; f; f = f->next) {
		if (strcmp(f->path, path) == 0)
			return f;
	}
	return NULL;
}

static char *copy_of(const SnapFile *f, size_t *len_out)
{
	if (!f->text) {
		errno = f->err;
		return NULL;
	}
	char *text = xmalloc(f->len + 1);
	memcpy(text, f->text, f->len + 1);
	if (len_out)
		*len_out = f->len;
	return text;
}

/* The file and its stat() from one open, so that the two agree; NULL with errno set. */
static char *read_with_stat(const char *path, size_t *len_out, struct stat *st)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	char *text = NULL;
	if (fstat(fd, st) == 0)
		text = read_fd(fd, len_out);
	int save = errno;
	close(fd);
	errno = save;
	return text;
}

char *filesnap_read(const char *path, size_t *len_out)
{
	SnapFile *f = mode == SNAP_OFF ? NULL : find(path);
	if (f)
		return copy_of(f, len_out); /* replayed, or recorded twice (an @file of two hba lines) */
	size_t len = 0;
	struct stat st;
	memset(&st, 0, sizeof(st));
	char *text = read_with_stat(path, &len, &st);
	if (mode != SNAP_RECORD) {
		if (text && len_out)
			*len_out = len;
		return text;
	}
	int save = errno;
	f = xcalloc(1, sizeof(*f));
	f->path = xstrdup(path);
	f->err = text ? 0 : save;
	f->st = st;
	f->len = len;
	f->next = kept;
	kept = f;
	if (text) {
		f->text = xmalloc(len + 1);
		memcpy(f->text, text, len + 1);
		if (len_out)
			*len_out = len;
	}
	errno = save;
	return text;
}

bool filesnap_stat(const char *path, struct stat *st)
{
	SnapFile *f = mode == SNAP_REPLAY ? find(path) : NULL;
	if (!f)
		return stat(path, st) == 0;
	if (!f->text) {
		errno = f->err;
		return false;
	}
	*st = f->st;
	return true;
}
