/*
 * Reading the auth_file (userlist.txt) into a list of users and their
 * secrets, classifying each secret as empty, plain, md5 or SCRAM so that
 * authentication can tell which methods a user can take part in.
 */
#include "autoconfig.h"

#include "common/userlist.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/filesnap.h"
#include "common/util.h"

#define MD5_PREFIX   "md5"
#define MD5_HEX_LEN  32
#define SCRAM_PREFIX "SCRAM-SHA-256$"

/* What one line of the file turned out to be. */
typedef enum LineResult {
	LINE_SKIP,        /* blank or `;` comment */
	LINE_USER,        /* a user and secret were read */
	LINE_BROKEN,      /* not of the form "user" "secret" */
	LINE_NAME_LONG,   /* user name over USERLIST_MAX_USER bytes */
	LINE_SECRET_LONG, /* secret over USERLIST_MAX_SECRET bytes */
} LineResult;

/* Outcome of reading one quoted field. */
typedef enum FieldResult {
	FIELD_OK,
	FIELD_BROKEN,   /* no closing quote before the end of the line */
	FIELD_TOO_LONG, /* more than the allowed number of bytes */
} FieldResult;

static bool is_lower_hex(char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

static bool is_base64_char(char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '/';
}

static bool is_md5_secret(const char *s)
{
	if (strncmp(s, MD5_PREFIX, strlen(MD5_PREFIX)) != 0)
		return false;
	s += strlen(MD5_PREFIX);
	for (int i = 0; i < MD5_HEX_LEN; i++) {
		if (!is_lower_hex(s[i]))
			return false;
	}
	return s[MD5_HEX_LEN] == '\0';
}

/*
 * Accept a non-empty run of base64 characters with at most two `=` of
 * padding, ending at `stop`. Advances *pp past the run (not past `stop`).
 */
static bool skip_base64(const char **pp, char stop)
{
	const char *p = *pp;
	const char *start = p;
	int pad = 0;

	while (is_base64_char(*p))
		p++;
	if (p == start)
		return false;
	while (*p == '=' && pad < 2) {
		p++;
		pad++;
	}
	if (*p != stop)
		return false;
	*pp = p;
	return true;
}

/* SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>, checked for shape only. */
static bool is_scram_secret(const char *s)
{
	const char *p = s;
	long iterations = 0;

	if (strncmp(p, SCRAM_PREFIX, strlen(SCRAM_PREFIX)) != 0)
		return false;
	p += strlen(SCRAM_PREFIX);

	if (*p < '0' || *p > '9')
		return false;
	while (*p >= '0' && *p <= '9') {
		iterations = iterations * 10 + (*p - '0');
		if (iterations > INT_MAX)
			return false;
		p++;
	}
	if (iterations <= 0 || *p++ != ':')
		return false;

	if (!skip_base64(&p, '$'))
		return false;
	p++;
	if (!skip_base64(&p, ':'))
		return false;
	p++;
	return skip_base64(&p, '\0');
}

SecretKind userlist_secret_kind(const char *secret)
{
	if (secret[0] == '\0')
		return SECRET_EMPTY;
	if (is_md5_secret(secret))
		return SECRET_MD5;
	if (is_scram_secret(secret))
		return SECRET_SCRAM;
	return SECRET_PLAIN;
}

static bool is_blank(char c)
{
	return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
}

/*
 * Read a double-quoted field starting at *pp (which points at the opening
 * quote) and ending before `end`; `""` stands for one `"`. On success the
 * unescaped text is in out (NUL-terminated) and *pp is past the closing quote.
 */
static FieldResult read_quoted(const char **pp, const char *end, char *out, size_t max)
{
	const char *p = *pp + 1;
	size_t len = 0;

	for (;;) {
		if (p >= end)
			return FIELD_BROKEN;
		if (*p == '"') {
			if (p + 1 < end && p[1] == '"') {
				p++;
			} else {
				p++;
				break;
			}
		}
		if (len == max)
			return FIELD_TOO_LONG;
		out[len++] = *p++;
	}
	out[len] = '\0';
	*pp = p;
	return FIELD_OK;
}

static LineResult field_failure(FieldResult fr, LineResult too_long)
{
	return fr == FIELD_TOO_LONG ? too_long : LINE_BROKEN;
}

/* Parse the line [p, end) (without its newline). */
static LineResult parse_line(const char *p, const char *end, char *name, char *secret)
{
	FieldResult fr;

	while (p < end && is_blank(*p))
		p++;
	if (p == end || *p == ';')
		return LINE_SKIP;
	if (*p != '"')
		return LINE_BROKEN;

	fr = read_quoted(&p, end, name, USERLIST_MAX_USER);
	if (fr != FIELD_OK)
		return field_failure(fr, LINE_NAME_LONG);

	while (p < end && is_blank(*p))
		p++;
	if (p == end || *p != '"')
		return LINE_BROKEN;

	fr = read_quoted(&p, end, secret, USERLIST_MAX_SECRET);
	if (fr != FIELD_OK)
		return field_failure(fr, LINE_SECRET_LONG);

	/* whatever follows the secret (e.g. an old third field) is ignored */
	return LINE_USER;
}

static void add_user(UserList *ul, const char *name, const char *secret)
{
	int n = ul->n_users;

	/* capacity is the next power of two, so grow when n is 0 or a power of two */
	if ((n & (n - 1)) == 0)
		ul->users = xrealloc(ul->users, sizeof(UserEntry) * (size_t)(n ? 2 * n : 1));
	ul->users[n].name = xstrdup(name);
	ul->users[n].secret = xstrdup(secret);
	ul->users[n].kind = userlist_secret_kind(secret);
	ul->n_users = n + 1;
}

/* A user's name and its position in the file, for finding repeats. */
typedef struct NamePos {
	const char *name; /* owned by the UserList */
	int pos;          /* index into UserList.users */
} NamePos;

static int namepos_cmp(const void *a, const void *b)
{
	const NamePos *x = a, *y = b;
	int c = strcmp(x->name, y->name);
	if (c != 0)
		return c;
	return (x->pos > y->pos) - (x->pos < y->pos);
}

/*
 * A name given more than once keeps its first position and takes the
 * secret of its last line; the later lines are dropped. Sorting by
 * (name, position) keeps this O(n log n) for large files.
 */
static void merge_repeats(UserList *ul)
{
	int n = ul->n_users;
	NamePos *np;
	int i, j, out;

	if (n < 2)
		return;
	np = xmalloc(sizeof(NamePos) * (size_t)n);
	for (i = 0; i < n; i++) {
		np[i].name = ul->users[i].name;
		np[i].pos = i;
	}
	qsort(np, (size_t)n, sizeof(NamePos), namepos_cmp);

	for (i = 0; i < n; i = j) {
		UserEntry *first = &ul->users[np[i].pos];
		for (j = i + 1; j < n && strcmp(np[j].name, np[i].name) == 0; j++)
			;
		if (j - i == 1)
			continue;
		UserEntry *last = &ul->users[np[j - 1].pos];
		free(first->secret);
		first->secret = last->secret;
		first->kind = last->kind;
		last->secret = NULL;
		/* this group's names are not looked at again, so the repeats can go now */
		for (int k = i + 1; k < j; k++) {
			UserEntry *dup = &ul->users[np[k].pos];
			free(dup->secret);
			free(dup->name);
			dup->secret = NULL;
			dup->name = NULL;
		}
	}
	free(np);

	for (i = 0, out = 0; i < n; i++) {
		if (ul->users[i].name)
			ul->users[out++] = ul->users[i];
	}
	ul->n_users = out;
}

/* The list is (re)initialised here: any previous contents must have been freed. */
bool userlist_parse(UserList *ul, const char *text, char *errbuf, size_t errlen)
{
	char name[USERLIST_MAX_USER + 1];
	char secret[USERLIST_MAX_SECRET + 1];
	const char *p = text;
	int lineno = 0;
	bool ok = true;

	ul->users = NULL;
	ul->n_users = 0;
	if (errbuf && errlen > 0)
		errbuf[0] = '\0';

	while (*p && ok) {
		const char *eol = strchr(p, '\n');
		const char *end = eol ? eol : p + strlen(p);

		lineno++;
		switch (parse_line(p, end, name, secret)) {
		case LINE_SKIP:
			break;
		case LINE_USER:
			add_user(ul, name, secret);
			break;
		case LINE_BROKEN:
			set_error(errbuf, errlen, "line %d: broken auth file", lineno);
			ok = false;
			break;
		case LINE_NAME_LONG:
			set_error(errbuf, errlen, "line %d: username too long", lineno);
			ok = false;
			break;
		case LINE_SECRET_LONG:
			set_error(errbuf, errlen, "line %d: password too long", lineno);
			ok = false;
			break;
		}
		p = eol ? eol + 1 : end;
	}

	merge_repeats(ul);
	return ok;
}

bool userlist_load(UserList *ul, const char *path, char *errbuf, size_t errlen)
{
	char *text = filesnap_read(path, NULL);
	bool ok;

	if (!text) {
		ul->users = NULL;
		ul->n_users = 0;
		set_error(errbuf, errlen, "could not open auth_file %s: %s", path, strerror(errno));
		return false;
	}
	ok = userlist_parse(ul, text, errbuf, errlen);
	free(text);
	return ok;
}

const UserEntry *userlist_find(const UserList *ul, const char *name)
{
	for (int i = 0; i < ul->n_users; i++) {
		if (strcmp(ul->users[i].name, name) == 0)
			return &ul->users[i];
	}
	return NULL;
}

void userlist_free(UserList *ul)
{
	for (int i = 0; i < ul->n_users; i++) {
		free(ul->users[i].name);
		free(ul->users[i].secret);
	}
	free(ul->users);
	ul->users = NULL;
	ul->n_users = 0;
}
