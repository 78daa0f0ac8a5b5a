/*
 * Unit tests for the pure half of auth_query: the bytes of the extended-
 * protocol request, the reading of RowDescription/DataRow answers, and the
 * set-up hints derived from server errors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "worker/auth_query_msg.h"

/* A reader over pb that checks message framing. */
typedef struct Msgs {
	const uint8_t *p;
	size_t left;
} Msgs;

static const uint8_t *next_msg(Msgs *m, char type, uint32_t *body_len)
{
	assert_true(m->left >= 5);
	assert_int_equal(m->p[0], (uint8_t)type);
	uint32_t len = ((uint32_t)m->p[1] << 24) | ((uint32_t)m->p[2] << 16) | ((uint32_t)m->p[3] << 8) | m->p[4];
	assert_true(len >= 4 && len + 1 <= m->left);
	const uint8_t *body = m->p + 5;
	*body_len = len - 4;
	m->p += len + 1;
	m->left -= len + 1;
	return body;
}

static void test_request_layout(void **state)
{
	(void)state;
	PktBuf pb;
	pktbuf_init(&pb, 16);
	authq_write_request(&pb, "SELECT u, p FROM f($1)", "alice");
	Msgs m = {pb.buf, pb.len};
	uint32_t n;

	const uint8_t *b = next_msg(&m, 'P', &n);
	static const uint8_t parse[] = "\0SELECT u, p FROM f($1)\0\0\1\0\0\0\x19";
	assert_int_equal(n, sizeof(parse) - 1);
	assert_memory_equal(b, parse, n); /* unnamed, one parameter of type text (25) */

	b = next_msg(&m, 'B', &n);
	static const uint8_t bind[] = "\0\0\0\0\0\1\0\0\0\5alice\0\0";
	assert_int_equal(n, sizeof(bind) - 1);
	assert_memory_equal(b, bind, n); /* unnamed portal and statement, $1 = 'alice' as text */

	b = next_msg(&m, 'D', &n);
	assert_int_equal(n, 2);
	assert_memory_equal(b, "P\0", 2); /* Describe the unnamed portal */

	b = next_msg(&m, 'E', &n);
	assert_int_equal(n, 5);
	assert_memory_equal(b, "\0\0\0\0\0", 5); /* Execute, no row limit */

	next_msg(&m, 'S', &n);
	assert_int_equal(n, 0);
	assert_int_equal(m.left, 0);
	pktbuf_free(&pb);
}

static void test_row_columns(void **state)
{
	(void)state;
	static const uint8_t two[] = {0, 2, 'u', 0};
	assert_int_equal(authq_row_columns(two, sizeof(two)), 2);
	static const uint8_t three[] = {0, 3};
	assert_int_equal(authq_row_columns(three, sizeof(three)), 3);
	assert_int_equal(authq_row_columns(two, 1), -1);
}

static size_t row(uint8_t *out, int ncols, const char *name, const char *pw, int pw_len)
{
	size_t n = 0;
	out[n++] = 0;
	out[n++] = (uint8_t)ncols;
	const char *vals[] = {name, pw};
	int lens[] = {name ? (int)strlen(name) : -1, pw ? pw_len : -1};
	for (int i = 0; i < 2 && i < ncols; i++) {
		uint32_t l = (uint32_t)lens[i];
		out[n++] = (uint8_t)(l >> 24);
		out[n++] = (uint8_t)(l >> 16);
		out[n++] = (uint8_t)(l >> 8);
		out[n++] = (uint8_t)l;
		if (lens[i] > 0) {
			memcpy(out + n, vals[i], (size_t)lens[i]);
			n += (size_t)lens[i];
		}
	}
	return n;
}

static void test_parse_row(void **state)
{
	(void)state;
	uint8_t buf[512];
	char err[200], *secret;
	const char *md5 = "md5a3556571e93b0d20722ba62be61e8c2d";

	size_t n = row(buf, 2, "alice", md5, (int)strlen(md5));
	assert_int_equal(authq_parse_row(buf, (uint32_t)n, 2047, &secret, err, sizeof(err)), AUTHQ_ROW_SECRET);
	assert_string_equal(secret, md5);
	free(secret);

	n = row(buf, 2, "alice", NULL, 0);
	assert_int_equal(authq_parse_row(buf, (uint32_t)n, 2047, &secret, err, sizeof(err)), AUTHQ_ROW_NULL);
	assert_null(secret);

	n = row(buf, 2, "alice", "", 0);
	assert_int_equal(authq_parse_row(buf, (uint32_t)n, 2047, &secret, err, sizeof(err)), AUTHQ_ROW_SECRET);
	assert_string_equal(secret, "");
	free(secret);

	n = row(buf, 1, "alice", NULL, 0);
	assert_int_equal(authq_parse_row(buf, (uint32_t)n, 2047, &secret, err, sizeof(err)), AUTHQ_ROW_BAD);
	assert_non_null(strstr(err, "2 columns"));

	n = row(buf, 2, "alice", "0123456789", 10);
	assert_int_equal(authq_parse_row(buf, (uint32_t)n, 9, &secret, err, sizeof(err)), AUTHQ_ROW_BAD);
	assert_non_null(strstr(err, "10 bytes"));
	assert_int_equal(authq_parse_row(buf, (uint32_t)n - 1, 2047, &secret, err, sizeof(err)), AUTHQ_ROW_BAD);
	assert_int_equal(authq_parse_row(buf, (uint32_t)n + 1, 2047, &secret, err, sizeof(err)), AUTHQ_ROW_BAD);

	n = row(buf, 2, "alice", "a\0b", 3);
	assert_int_equal(authq_parse_row(buf, (uint32_t)n, 2047, &secret, err, sizeof(err)), AUTHQ_ROW_BAD);
	assert_non_null(strstr(err, "NUL"));
	assert_null(secret);
}

static void test_quote_ident(void **state)
{
	(void)state;
	char b[64];
	authq_quote_ident("pgbouncer_auth", b, sizeof(b));
	assert_string_equal(b, "pgbouncer_auth");
	authq_quote_ident("Auth Schema", b, sizeof(b));
	assert_string_equal(b, "\"Auth Schema\"");
	authq_quote_ident("pgb \"odd\"", b, sizeof(b));
	assert_string_equal(b, "\"pgb \"\"odd\"\"\"");
	authq_quote_ident("1abc", b, sizeof(b));
	assert_string_equal(b, "\"1abc\"");
}

static const char *hint(const char *code, const char *msg, const char *query)
{
	static char buf[1024];
	return authq_error_hint(code, msg, "pgb_auth", "app", query, buf, sizeof(buf));
}

static void assert_contains(const char *s, const char *what)
{
	if (!strstr(s, what))
		fail_msg("\"%s\" not in \"%s\"", what, s);
}

static void test_hint_names_the_missing_grant(void **state)
{
	(void)state;
	const char *q = "SELECT usename, passwd FROM pgbouncer.get_auth($1)";
	const char *h = hint("42501", "permission denied for schema pgbouncer", q);
	assert_contains(h, "missing grant: USAGE on schema pgbouncer for the auth_user pgb_auth");
	assert_contains(h, "GRANT USAGE ON SCHEMA pgbouncer TO pgb_auth;");
	assert_contains(h, "pgbouncer-auth-setup for database app");
	assert_contains(h, "pgbouncer-auth-setup --check");

	h = hint("42501", "permission denied for schema Auth Schema", q);
	assert_contains(h, "GRANT USAGE ON SCHEMA \"Auth Schema\" TO pgb_auth;");

	h = hint("42501", "permission denied for function get_auth", q);
	assert_contains(h, "missing grant: EXECUTE on function pgbouncer.get_auth for the auth_user pgb_auth");
	assert_contains(h, "GRANT EXECUTE ON FUNCTION pgbouncer.get_auth(text) TO pgb_auth;");
	assert_contains(h, "pgbouncer-auth-setup --check");

	/* the schema is taken from the query when it is there, quoted or not */
	h = hint("42501", "permission denied for function select",
	         "SELECT usename, passwd FROM \"Auth Schema\".select($1)");
	assert_contains(h, "GRANT EXECUTE ON FUNCTION \"Auth Schema\".select(text)");
	h = hint("42501", "permission denied for function get_auth", "SELECT * FROM get_auth($1)");
	assert_contains(h, "GRANT EXECUTE ON FUNCTION get_auth(text)");
	h = hint("42501", "permission denied for function get_auth", NULL);
	assert_contains(h, "EXECUTE on function get_auth");

	h = hint("42501", "permission denied for table pg_authid", NULL);
	assert_contains(h, "only superusers can read pg_authid");
	assert_contains(h, "SECURITY DEFINER");
	assert_contains(h, "pgbouncer-auth-setup");

	h = hint("42501", "permission denied for database app", NULL);
	assert_contains(h, "CONNECT on database app");

	h = hint("42501", "must be owner of something", NULL);
	assert_contains(h, "lacks a privilege");
	assert_contains(h, "pgbouncer-auth-setup --check");
}

static void test_hint_for_other_failures(void **state)
{
	(void)state;
	const char *h = hint("3F000", "schema \"pgbouncer\" does not exist", NULL);
	assert_contains(h, "not installed in database app");
	assert_contains(h, "auth_dbname");
	h = hint("42883", "function pgbouncer.get_auth(text) does not exist", NULL);
	assert_contains(h, "not installed in database app");
	h = hint("28P01", "password authentication failed for user \"pgb_auth\"", NULL);
	assert_contains(h, "plain password");
	assert_string_equal(hint("42601", "syntax error at or near \"x\"", NULL), "");
	assert_string_equal(hint(NULL, "connect failed", NULL), "");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_request_layout),
	    cmocka_unit_test(test_row_columns),
	    cmocka_unit_test(test_parse_row),
	    cmocka_unit_test(test_quote_ident),
	    cmocka_unit_test(test_hint_names_the_missing_grant),
	    cmocka_unit_test(test_hint_for_other_failures),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
