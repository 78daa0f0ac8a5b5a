/*
 * Unit tests for the auth_file (userlist.txt) parser: field quoting, secret
 * kinds, comments, broken lines, length limits, repeated users and loading
 * from disk, also through the master's kept copy (common/filesnap.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/filesnap.h"
#include "common/userlist.h"

#define ADMIN_MD5 "md545f2603610af569b6155c45067268c6b"
#define SCRAM_OK                                                                                                       \
	"SCRAM-SHA-256$4096:c2FsdHNhbHRzYWx0$nRD6rEj3Pm8rAfqC0FNcUBjCxxx6zq4R0ZnTN3Ec5Bc=:"                            \
	"m1lrWZgNE56lKs1mrzJ2L9AtGcEHEvdzqYAPDAMSgE0="

static void assert_user(const UserList *ul, int idx, const char *name, const char *secret, SecretKind kind)
{
	assert_true(idx < ul->n_users);
	assert_string_equal(ul->users[idx].name, name);
	assert_string_equal(ul->users[idx].secret, secret);
	assert_int_equal(ul->users[idx].kind, kind);
}

/* A string of n copies of c, malloc'd. */
static char *repeat(char c, size_t n)
{
	char *s = malloc(n + 1);
	assert_non_null(s);
	memset(s, c, n);
	s[n] = '\0';
	return s;
}

static void test_secret_kind(void **state)
{
	(void)state;
	assert_int_equal(userlist_secret_kind(""), SECRET_EMPTY);
	assert_int_equal(userlist_secret_kind("1234"), SECRET_PLAIN);
	assert_int_equal(userlist_secret_kind(ADMIN_MD5), SECRET_MD5);
	/* upper-case hex, 31 and 33 digits, non-hex: all plain */
	assert_int_equal(userlist_secret_kind("md545F2603610AF569B6155C45067268C6B"), SECRET_PLAIN);
	assert_int_equal(userlist_secret_kind("MD545f2603610af569b6155c45067268c6b"), SECRET_PLAIN);
	assert_int_equal(userlist_secret_kind("md545f2603610af569b6155c45067268c6"), SECRET_PLAIN);
	assert_int_equal(userlist_secret_kind("md545f2603610af569b6155c45067268c6b0"), SECRET_PLAIN);
	assert_int_equal(userlist_secret_kind("md545f2603610af569b6155c45067268c6g"), SECRET_PLAIN);
	assert_int_equal(userlist_secret_kind("md5"), SECRET_PLAIN);

	assert_int_equal(userlist_secret_kind(SCRAM_OK), SECRET_SCRAM);
	assert_int_equal(userlist_secret_kind("SCRAM-SHA-256$1:YQ$Yg==:Yw=="), SECRET_SCRAM);
	/* malformed verifiers are plain passwords */
	assert_int_equal(userlist_secret_kind("SCRAM-SHA-256$0:YQ$Yg==:Yw=="), SECRET_PLAIN);
	assert_int_equal(userlist_secret_kind("SCRAM-SHA-256$-1:YQ$Yg==:Yw=="), SECRET_PLAIN);
	assert_int_equal(userlist_secret_kind("SCRAM-SHA-256$x:YQ$Yg==:Yw=="), SECRET_PLAIN);
	assert_int_equal(userlist_secret_kind("SCRAM-SHA-256$99999999999:YQ$Yg==:Yw=="), SECRET_PLAIN);
	assert_int_equal(userlist_secret_kind("SCRAM-SHA-256$4096:$Yg==:Yw=="), SECRET_PLAIN);
	assert_int_equal(userlist_secret_kind("SCRAM-SHA-256$4096:YQ$:Yw=="), SECRET_PLAIN);
	assert_int_equal(userlist_secret_kind("SCRAM-SHA-256$4096:YQ$Yg==:"), SECRET_PLAIN);
	assert_int_equal(userlist_secret_kind("SCRAM-SHA-256$4096:YQ$Yg=="), SECRET_PLAIN);
	assert_int_equal(userlist_secret_kind("SCRAM-SHA-256$4096:YQ$Yg==:Yw==$"), SECRET_PLAIN);
	assert_int_equal(userlist_secret_kind("SCRAM-SHA-256$4096:Y!$Yg==:Yw=="), SECRET_PLAIN);
	assert_int_equal(userlist_secret_kind("SCRAM-SHA-256$4096:YQ$Yg===:Yw=="), SECRET_PLAIN);
	assert_int_equal(userlist_secret_kind("SCRAM-SHA-1$4096:YQ$Yg==:Yw=="), SECRET_PLAIN);
	assert_int_equal(userlist_secret_kind("scram-sha-256$4096:YQ$Yg==:Yw=="), SECRET_PLAIN);
}

static void test_parse_kinds(void **state)
{
	UserList ul;
	char err[256] = "junk";
	(void)state;

	const char *text = "\"alice\" \"secret pass\"\n"
	                   "\"admin\" \"" ADMIN_MD5 "\"\n"
	                   "\"scram\" \"" SCRAM_OK "\"\n"
	                   "\"nopass\" \"\"\n"
	                   "\"upper\" \"md545F2603610AF569B6155C45067268C6B\"\n";
	assert_true(userlist_parse(&ul, text, err, sizeof(err)));
	assert_string_equal(err, "");
	assert_int_equal(ul.n_users, 5);
	assert_user(&ul, 0, "alice", "secret pass", SECRET_PLAIN);
	assert_user(&ul, 1, "admin", ADMIN_MD5, SECRET_MD5);
	assert_user(&ul, 2, "scram", SCRAM_OK, SECRET_SCRAM);
	assert_user(&ul, 3, "nopass", "", SECRET_EMPTY);
	assert_user(&ul, 4, "upper", "md545F2603610AF569B6155C45067268C6B", SECRET_PLAIN);

	const UserEntry *e = userlist_find(&ul, "admin");
	assert_non_null(e);
	assert_ptr_equal(e, &ul.users[1]);
	assert_null(userlist_find(&ul, "Admin"));
	assert_null(userlist_find(&ul, "nobody"));
	assert_null(userlist_find(&ul, ""));

	userlist_free(&ul);
	assert_int_equal(ul.n_users, 0);
	assert_null(ul.users);
	userlist_free(&ul); /* freeing an empty list is harmless */
}

static void test_escaped_quotes_and_trailing(void **state)
{
	UserList ul;
	char err[256];
	(void)state;

	const char *text = "\"a\"\"b\" \"p\"\"q\"\"\"\n"           /* a"b / p"q" */
	                   "\"\"\"\" \"\"\"\"\"\"\n"               /* " / "" */
	                   "\"third\" \"pw\" \"old-field\" more\n" /* old third field */
	                   "\"glued\"\t\"pw2\"junk after\n"        /* tab between, garbage glued on */
	                   "  \"indented\" \"x y\"   \n"           /* leading blanks */
	                   "\"semi;colon\" \";not a comment\"";    /* no final newline */
	assert_true(userlist_parse(&ul, text, err, sizeof(err)));
	assert_string_equal(err, "");
	assert_int_equal(ul.n_users, 6);
	assert_user(&ul, 0, "a\"b", "p\"q\"", SECRET_PLAIN);
	assert_user(&ul, 1, "\"", "\"\"", SECRET_PLAIN);
	assert_user(&ul, 2, "third", "pw", SECRET_PLAIN);
	assert_user(&ul, 3, "glued", "pw2", SECRET_PLAIN);
	assert_user(&ul, 4, "indented", "x y", SECRET_PLAIN);
	assert_user(&ul, 5, "semi;colon", ";not a comment", SECRET_PLAIN);
	userlist_free(&ul);
}

static void test_comments_and_blank_lines(void **state)
{
	UserList ul;
	char err[256];
	(void)state;

	const char *text = "; a comment\n"
	                   "\n"
	                   "   \n"
	                   "\t\n"
	                   "   ; indented comment \"x\" \"y\"\n"
	                   "\"u1\" \"p1\"\r\n"
	                   "\r\n"
	                   ";\n"
	                   "\"u2\" \"p2\"\n"
	                   "\n";
	assert_true(userlist_parse(&ul, text, err, sizeof(err)));
	assert_string_equal(err, "");
	assert_int_equal(ul.n_users, 2);
	assert_user(&ul, 0, "u1", "p1", SECRET_PLAIN);
	assert_user(&ul, 1, "u2", "p2", SECRET_PLAIN);
	userlist_free(&ul);

	assert_true(userlist_parse(&ul, "", err, sizeof(err)));
	assert_int_equal(ul.n_users, 0);
	assert_null(ul.users);
	userlist_free(&ul);
}

/* Parse text that must fail; check the message and which users survived. */
static void check_broken(const char *text, const char *msg, int n_kept)
{
	UserList ul;
	char err[256] = "";

	assert_false(userlist_parse(&ul, text, err, sizeof(err)));
	assert_string_equal(err, msg);
	assert_int_equal(ul.n_users, n_kept);
	userlist_free(&ul);
}

static void test_broken_lines(void **state)
{
	UserList ul;
	char err[256];
	(void)state;

	/* '#' is not a comment: parsing stops, earlier users are kept */
	const char *text = "; header\n"
	                   "\"a\" \"1\"\n"
	                   "\"b\" \"2\"\n"
	                   "# not a comment\n"
	                   "\"c\" \"3\"\n";
	assert_false(userlist_parse(&ul, text, err, sizeof(err)));
	assert_string_equal(err, "line 4: broken auth file");
	assert_int_equal(ul.n_users, 2);
	assert_user(&ul, 0, "a", "1", SECRET_PLAIN);
	assert_user(&ul, 1, "b", "2", SECRET_PLAIN);
	assert_null(userlist_find(&ul, "c"));
	userlist_free(&ul);

	check_broken("# first line\n\"a\" \"1\"\n", "line 1: broken auth file", 0);
	check_broken("\"a\" \"1\"\n  # indented hash\n", "line 2: broken auth file", 1);
	check_broken("\"a\" \"1\"\nbob \"pw\"\n", "line 2: broken auth file", 1);
	check_broken("\"a\" \"1\"\n\"bob\" pw\n", "line 2: broken auth file", 1);
	check_broken("\"a\" \"1\"\n\"bob\"\n", "line 2: broken auth file", 1);
	check_broken("\"a\" \"1\"\n\"bob\"   \n", "line 2: broken auth file", 1);
	check_broken("\"a\" \"1\"\n\"bob\" \"pw\n\"c\" \"3\"\n", "line 2: broken auth file", 1);
	check_broken("\"a\" \"1\"\n\"bob pw\n", "line 2: broken auth file", 1);
	check_broken("\"a\" \"1\"\n\"bob\" x \"pw\"\n", "line 2: broken auth file", 1);
	check_broken("\"a\" \"1\"\n\"bob\"\"pw\"\n", "line 2: broken auth file", 1);
	check_broken("\"a\" \"1\"\n\"a\" \"2\"\n\"bob\" \"pw", "line 3: broken auth file", 1);

	/* a NULL error buffer is allowed */
	assert_false(userlist_parse(&ul, "x\n", NULL, 0));
	assert_int_equal(ul.n_users, 0);
	userlist_free(&ul);
}

static void test_length_limits(void **state)
{
	UserList ul;
	char err[256];
	char *name127 = repeat('n', USERLIST_MAX_USER);
	char *name128 = repeat('n', USERLIST_MAX_USER + 1);
	char *name126 = repeat('n', USERLIST_MAX_USER - 1);
	char *secret_max = repeat('s', USERLIST_MAX_SECRET);
	char *secret_over = repeat('s', USERLIST_MAX_SECRET + 1);
	const size_t text_len = USERLIST_MAX_SECRET + 1024;
	char *text = malloc(text_len);
	(void)state;

	assert_int_equal(strlen(name127), 127);
	assert_int_equal(strlen(secret_max), 65535); /* a password message's limit in the protocol */
	assert_non_null(text);

	/* exactly at the limits: accepted */
	snprintf(text, text_len, "\"%s\" \"%s\"\n", name127, secret_max);
	assert_true(userlist_parse(&ul, text, err, sizeof(err)));
	assert_int_equal(ul.n_users, 1);
	assert_user(&ul, 0, name127, secret_max, SECRET_PLAIN);
	userlist_free(&ul);

	/* an escaped quote counts as one byte: 126 + 1 = 127 */
	snprintf(text, text_len, "\"%s\"\"\" \"x\"\n", name126);
	assert_true(userlist_parse(&ul, text, err, sizeof(err)));
	assert_int_equal(ul.n_users, 1);
	assert_int_equal(strlen(ul.users[0].name), 127);
	assert_int_equal(ul.users[0].name[126], '"');
	userlist_free(&ul);

	/* one byte over: error, earlier users kept, later lines not read */
	snprintf(text, text_len, "\"ok\" \"1\"\n\"%s\" \"x\"\n\"after\" \"2\"\n", name128);
	assert_false(userlist_parse(&ul, text, err, sizeof(err)));
	assert_string_equal(err, "line 2: username too long");
	assert_int_equal(ul.n_users, 1);
	assert_user(&ul, 0, "ok", "1", SECRET_PLAIN);
	userlist_free(&ul);

	snprintf(text, text_len, "; c\n\"ok\" \"1\"\n\"u\" \"%s\"\n\"after\" \"2\"\n", secret_over);
	assert_false(userlist_parse(&ul, text, err, sizeof(err)));
	assert_string_equal(err, "line 3: password too long");
	assert_int_equal(ul.n_users, 1);
	assert_user(&ul, 0, "ok", "1", SECRET_PLAIN);
	userlist_free(&ul);

	free(name126);
	free(name127);
	free(name128);
	free(secret_max);
	free(secret_over);
	free(text);
}

static void test_duplicates(void **state)
{
	UserList ul;
	char err[256];
	(void)state;

	const char *text = "\"alice\" \"" ADMIN_MD5 "\"\n"
	                   "\"bob\" \"b1\"\n"
	                   "\"alice\" \"a2\"\n"
	                   "\"carol\" \"c1\"\n"
	                   "\"bob\" \"\"\n"
	                   "\"alice\" \"a3\"\n"
	                   "\"Alice\" \"other\"\n";
	assert_true(userlist_parse(&ul, text, err, sizeof(err)));
	assert_int_equal(ul.n_users, 4);
	assert_user(&ul, 0, "alice", "a3", SECRET_PLAIN);
	assert_user(&ul, 1, "bob", "", SECRET_EMPTY);
	assert_user(&ul, 2, "carol", "c1", SECRET_PLAIN);
	assert_user(&ul, 3, "Alice", "other", SECRET_PLAIN);
	userlist_free(&ul);

	/* repeats before a broken line are merged too */
	assert_false(userlist_parse(&ul, "\"a\" \"1\"\n\"a\" \"" ADMIN_MD5 "\"\n#\n", err, sizeof(err)));
	assert_string_equal(err, "line 3: broken auth file");
	assert_int_equal(ul.n_users, 1);
	assert_user(&ul, 0, "a", ADMIN_MD5, SECRET_MD5);
	userlist_free(&ul);
}

static void test_many_users(void **state)
{
	UserList ul;
	char err[256];
	size_t cap = 1000 * 32, len = 0;
	char *text = malloc(cap);
	(void)state;

	assert_non_null(text);
	for (int i = 0; i < 1000; i++)
		len += (size_t)snprintf(text + len, cap - len, "\"user%d\" \"pw%d\"\n", i % 600, i);
	assert_true(userlist_parse(&ul, text, err, sizeof(err)));
	assert_int_equal(ul.n_users, 600);
	assert_user(&ul, 0, "user0", "pw600", SECRET_PLAIN);
	assert_user(&ul, 399, "user399", "pw999", SECRET_PLAIN);
	assert_user(&ul, 400, "user400", "pw400", SECRET_PLAIN);
	assert_user(&ul, 599, "user599", "pw599", SECRET_PLAIN);
	userlist_free(&ul);
	free(text);
}

static void test_load_missing(void **state)
{
	UserList ul;
	char err[512];
	char want[512];
	const char *path = "/nonexistent-dir-for-test/userlist.txt";
	(void)state;

	assert_false(userlist_load(&ul, path, err, sizeof(err)));
	snprintf(want, sizeof(want), "could not open auth_file %s: %s", path, strerror(ENOENT));
	assert_string_equal(err, want);
	assert_int_equal(ul.n_users, 0);
	userlist_free(&ul);
}

/* Write text to a new temp file; returns its malloc'd path. */
static char *write_temp(const char *text)
{
	char *path = strdup("/tmp/test_userlist.XXXXXX");
	assert_non_null(path);
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	size_t len = strlen(text);
	assert_int_equal(write(fd, text, len), (ssize_t)len);
	assert_int_equal(close(fd), 0);
	return path;
}

static void test_load_file(void **state)
{
	UserList ul;
	char err[256];
	(void)state;

	char *path = write_temp("; sample\n"
	                        "\"admin\" \"" ADMIN_MD5 "\"\n"
	                        "\"app\" \"" SCRAM_OK "\"\n"
	                        "\n"
	                        "\"plain\" \"1234\"\n");
	assert_true(userlist_load(&ul, path, err, sizeof(err)));
	assert_string_equal(err, "");
	assert_int_equal(ul.n_users, 3);
	assert_user(&ul, 0, "admin", ADMIN_MD5, SECRET_MD5);
	assert_user(&ul, 1, "app", SCRAM_OK, SECRET_SCRAM);
	assert_user(&ul, 2, "plain", "1234", SECRET_PLAIN);
	userlist_free(&ul);
	unlink(path);
	free(path);

	path = write_temp("\"admin\" \"1234\"\n#oops\n");
	assert_false(userlist_load(&ul, path, err, sizeof(err)));
	assert_string_equal(err, "line 2: broken auth file");
	assert_int_equal(ul.n_users, 1);
	assert_user(&ul, 0, "admin", "1234", SECRET_PLAIN);
	userlist_free(&ul);
	unlink(path);
	free(path);
}

/* A worker forked after an edit without RELOAD loads the file as the master kept it, once. */
static void test_kept_copy(void **state)
{
	(void)state;
	UserList ul = {0};
	char err[256];
	char *path = write_temp("\"alice\" \"one\"\n");
	char *missing = write_temp("");
	assert_int_equal(unlink(missing), 0);

	filesnap_record();
	assert_true(userlist_load(&ul, path, err, sizeof(err)));
	userlist_free(&ul);
	assert_false(userlist_load(&ul, missing, err, sizeof(err)));
	userlist_free(&ul);
	filesnap_record_end();
	struct stat kept;
	assert_int_equal(stat(path, &kept), 0);

	/* edited, and the missing file created, after the master read them */
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs("\"alice\" \"two, a longer one\"\n\"bob\" \"x\"\n", f);
	fclose(f);
	f = fopen(missing, "w");
	assert_non_null(f);
	fputs("\"carol\" \"c\"\n", f);
	fclose(f);

	filesnap_replay();
	assert_true(userlist_load(&ul, path, err, sizeof(err)));
	assert_int_equal(ul.n_users, 1);
	assert_user(&ul, 0, "alice", "one", SECRET_PLAIN);
	userlist_free(&ul);
	struct stat st;
	assert_true(filesnap_stat(path, &st));
	assert_int_equal(st.st_size, kept.st_size);
	assert_false(userlist_load(&ul, missing, err, sizeof(err)));
	assert_false(filesnap_stat(missing, &st));
	assert_int_equal(errno, ENOENT);
	userlist_free(&ul);

	/* after the first load the disk again, as at RELOAD */
	filesnap_clear();
	assert_true(userlist_load(&ul, path, err, sizeof(err)));
	assert_int_equal(ul.n_users, 2);
	assert_user(&ul, 0, "alice", "two, a longer one", SECRET_PLAIN);
	userlist_free(&ul);
	assert_true(filesnap_stat(path, &st));
	assert_true(st.st_size > kept.st_size);
	assert_true(userlist_load(&ul, missing, err, sizeof(err)));
	userlist_free(&ul);
	unlink(path);
	unlink(missing);
	free(path);
	free(missing);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_secret_kind),
	    cmocka_unit_test(test_parse_kinds),
	    cmocka_unit_test(test_escaped_quotes_and_trailing),
	    cmocka_unit_test(test_comments_and_blank_lines),
	    cmocka_unit_test(test_broken_lines),
	    cmocka_unit_test(test_length_limits),
	    cmocka_unit_test(test_duplicates),
	    cmocka_unit_test(test_many_users),
	    cmocka_unit_test(test_load_missing),
	    cmocka_unit_test(test_load_file),
	    cmocka_unit_test(test_kept_copy),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
