/*
 * Unit tests for proto.c: header parsing at every length boundary,
 * StartupMessage layout rules, the hex prefix of bad headers, message names,
 * the bodies of ErrorResponse, ParameterStatus and the SASL messages.
 */
#include "autoconfig.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/proto.h"

/* ---- typed headers ---- */

static void test_typed_header_ok(void **state)
{
	/* Query "SELECT 1": 'Q', length 13, body */
	static const uint8_t msg[] = {'Q', 0, 0, 0, 13, 'S', 'E', 'L', 'E', 'C', 'T', ' ', '1', 0};
	PktHdr hdr;

	memset(&hdr, 0x55, sizeof(hdr));
	assert_int_equal(proto_parse_header(msg, sizeof(msg), false, 8192, &hdr), HDR_OK);
	assert_int_equal(hdr.type, 'Q');
	assert_int_equal(hdr.code, 0);
	assert_int_equal(hdr.len, 14);
	assert_int_equal(hdr.body_off, 5);

	/* only the header present: still OK, the caller waits for the body */
	assert_int_equal(proto_parse_header(msg, 5, false, 8192, &hdr), HDR_OK);
	assert_int_equal(hdr.len, 14);
}

static void test_typed_header_incomplete(void **state)
{
	static const uint8_t msg[] = {'Z', 0, 0, 0, 5, 'I'};
	PktHdr hdr;

	for (size_t avail = 0; avail < 5; avail++)
		assert_int_equal(proto_parse_header(msg, avail, false, 8192, &hdr), HDR_INCOMPLETE);
	assert_int_equal(proto_parse_header(msg, 5, false, 8192, &hdr), HDR_OK);
	assert_int_equal(hdr.len, 6);
}

static void test_typed_header_lengths(void **state)
{
	uint8_t msg[5] = {'X', 0, 0, 0, 0};
	PktHdr hdr;

	/* the length field counts itself, so 4 is the smallest valid value */
	for (uint8_t len = 0; len < 4; len++) {
		msg[4] = len;
		assert_int_equal(proto_parse_header(msg, 5, false, 8192, &hdr), HDR_BAD);
	}
	msg[4] = 4;
	assert_int_equal(proto_parse_header(msg, 5, false, 8192, &hdr), HDR_OK);
	assert_int_equal(hdr.type, 'X');
	assert_int_equal(hdr.len, 5);

	/* "negative" length: must not wrap around to a tiny total */
	memcpy(msg + 1, "\xff\xff\xff\xff", 4);
	assert_int_equal(proto_parse_header(msg, 5, false, UINT32_MAX, &hdr), HDR_BAD);
	memcpy(msg + 1, "\x80\x00\x00\x00", 4);
	assert_int_equal(proto_parse_header(msg, 5, false, 8192, &hdr), HDR_BAD);

	/* total = len + 1 is bounded by max_len: 8191 + 1 fits 8192, 8192 + 1 does not */
	memcpy(msg + 1, "\x00\x00\x1f\xff", 4);
	assert_int_equal(proto_parse_header(msg, 5, false, 8192, &hdr), HDR_OK);
	assert_int_equal(hdr.len, 8192);
	memcpy(msg + 1, "\x00\x00\x20\x00", 4);
	assert_int_equal(proto_parse_header(msg, 5, false, 8192, &hdr), HDR_BAD);
}

/* ---- startup-phase headers ---- */

static void test_startup_header_ok(void **state)
{
	/* SSLRequest: length 8, code 80877103 */
	static const uint8_t ssl[] = {0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f};
	/* StartupMessage 3.0 header, length 41 */
	static const uint8_t startup[] = {0, 0, 0, 41, 0, 3, 0, 0, 'u'};
	/* CancelRequest: length 16, code 80877102 */
	static const uint8_t cancel[] = {0, 0, 0, 16, 0x04, 0xd2, 0x16, 0x2e};
	PktHdr hdr;

	memset(&hdr, 0x55, sizeof(hdr));
	assert_int_equal(proto_parse_header(ssl, sizeof(ssl), true, PROTO_MAX_STARTUP_LEN, &hdr), HDR_OK);
	assert_int_equal(hdr.type, 0);
	assert_int_equal(hdr.code, PROTO_SSL_CODE);
	assert_int_equal(hdr.len, 8);
	assert_int_equal(hdr.body_off, 8);

	assert_int_equal(proto_parse_header(startup, sizeof(startup), true, PROTO_MAX_STARTUP_LEN, &hdr), HDR_OK);
	assert_int_equal(hdr.code, PROTO_V3_0);
	assert_int_equal(hdr.len, 41);
	assert_int_equal(hdr.body_off, 8);

	assert_int_equal(proto_parse_header(cancel, sizeof(cancel), true, PROTO_MAX_STARTUP_LEN, &hdr), HDR_OK);
	assert_int_equal(hdr.code, PROTO_CANCEL_CODE);
	assert_int_equal(hdr.len, 16);
}

static void test_startup_header_incomplete(void **state)
{
	/* even a hopeless length waits for the whole 8-byte header */
	static const uint8_t msg[] = {0xff, 0xff, 0xff, 0xff, 0, 3, 0, 0};
	PktHdr hdr;

	for (size_t avail = 0; avail < 8; avail++)
		assert_int_equal(proto_parse_header(msg, avail, true, PROTO_MAX_STARTUP_LEN, &hdr), HDR_INCOMPLETE);
	assert_int_equal(proto_parse_header(msg, 8, true, PROTO_MAX_STARTUP_LEN, &hdr), HDR_BAD);
}

static void test_startup_header_lengths(void **state)
{
	uint8_t msg[8] = {0, 0, 0, 0, 0, 3, 0, 0};
	PktHdr hdr;

	/* below 8 (length + code) is malformed */
	for (uint8_t len = 0; len < 8; len++) {
		msg[3] = len;
		assert_int_equal(proto_parse_header(msg, 8, true, PROTO_MAX_STARTUP_LEN, &hdr), HDR_BAD);
	}
	/* 65535 is the largest; 65536 has a non-zero second byte */
	memcpy(msg, "\x00\x00\xff\xff", 4);
	assert_int_equal(proto_parse_header(msg, 8, true, PROTO_MAX_STARTUP_LEN, &hdr), HDR_OK);
	assert_int_equal(hdr.len, 65535);
	memcpy(msg, "\x00\x01\x00\x00", 4);
	assert_int_equal(proto_parse_header(msg, 8, true, PROTO_MAX_STARTUP_LEN, &hdr), HDR_BAD);
	/* negative */
	memcpy(msg, "\xff\xff\xff\xff", 4);
	assert_int_equal(proto_parse_header(msg, 8, true, PROTO_MAX_STARTUP_LEN, &hdr), HDR_BAD);
	/* a smaller max_len is honoured exactly */
	memcpy(msg, "\x00\x00\x01\x00", 4);
	assert_int_equal(proto_parse_header(msg, 8, true, 256, &hdr), HDR_OK);
	assert_int_equal(proto_parse_header(msg, 8, true, 255, &hdr), HDR_BAD);
}

/* ---- StartupMessage body ---- */

#define BODY(s) ((const uint8_t *)(s)), (sizeof(s) - 1)

static void test_startup_params_good(void **state)
{
	StartupParam params[8];
	int n;

	n = proto_parse_startup(BODY("user\0alice\0database\0db1\0application_name\0\0\0"), params, 8);
	assert_int_equal(n, 3);
	assert_string_equal(params[0].key, "user");
	assert_string_equal(params[0].value, "alice");
	assert_string_equal(params[1].key, "database");
	assert_string_equal(params[1].value, "db1");
	assert_string_equal(params[2].key, "application_name");
	assert_string_equal(params[2].value, "");

	/* without an array the pairs are counted, however many */
	assert_int_equal(proto_parse_startup(BODY("user\0alice\0database\0db1\0application_name\0\0\0"), NULL, 0), 3);
	assert_int_equal(proto_parse_startup(BODY("user\0alice\0"), NULL, 0), -1);
	/* an array too small is an error */
	assert_int_equal(proto_parse_startup(BODY("user\0alice\0database\0db1\0\0"), params, 1), -1);
}

static void test_startup_params_points_into_body(void **state)
{
	static const char body[] = "k\0v\0";
	StartupParam params[1];

	/* sizeof includes the literal's own NUL, which is the terminator here */
	assert_int_equal(proto_parse_startup((const uint8_t *)body, sizeof(body), params, 1), 1);
	assert_ptr_equal(params[0].key, body);
	assert_ptr_equal(params[0].value, body + 2);
}

static void test_startup_params_missing_terminator(void **state)
{
	StartupParam params[8];

	/* the pairs are complete but the final NUL is missing */
	assert_int_equal(proto_parse_startup(BODY("user\0alice\0"), params, 8), -1);
	/* last string not terminated at all */
	assert_int_equal(proto_parse_startup(BODY("user\0alice"), params, 8), -1);
	assert_int_equal(proto_parse_startup(BODY("user"), params, 8), -1);
}

static void test_startup_params_trailing_bytes(void **state)
{
	StartupParam params[8];

	/* the terminator must be the last byte */
	assert_int_equal(proto_parse_startup(BODY("user\0alice\0\0x"), params, 8), -1);
	assert_int_equal(proto_parse_startup(BODY("user\0alice\0\0\0"), params, 8), -1);
	assert_int_equal(proto_parse_startup(BODY("\0user\0alice\0\0"), params, 8), -1);
}

static void test_startup_params_odd_strings(void **state)
{
	StartupParam params[8];

	/* "database" has no value: the final NUL is taken as its empty value and no terminator remains */
	assert_int_equal(proto_parse_startup(BODY("user\0alice\0database\0\0"), params, 8), -1);
	/* a key whose value runs to the end */
	assert_int_equal(proto_parse_startup(BODY("user\0alice\0database\0"), params, 8), -1);
}

static void test_startup_params_too_many(void **state)
{
	StartupParam params[3];

	assert_int_equal(proto_parse_startup(BODY("a\0"
	                                          "1\0b\0"
	                                          "2\0c\0"
	                                          "3\0\0"),
	                                     params, 3),
	                 3);
	assert_int_equal(proto_parse_startup(BODY("a\0"
	                                          "1\0b\0"
	                                          "2\0c\0"
	                                          "3\0d\0"
	                                          "4\0\0"),
	                                     params, 3),
	                 -1);
	assert_int_equal(proto_parse_startup(BODY("a\0"
	                                          "1\0\0"),
	                                     params, 0),
	                 -1);
}

static void test_startup_params_empty(void **state)
{
	StartupParam params[1];

	/* only the terminator: zero pairs */
	assert_int_equal(proto_parse_startup((const uint8_t *)"", 1, params, 1), 0);
	assert_int_equal(proto_parse_startup((const uint8_t *)"", 1, params, 0), 0);
	/* no bytes at all: the terminator is missing */
	assert_int_equal(proto_parse_startup((const uint8_t *)"", 0, params, 1), -1);
}

/* ---- hex prefix ---- */

static void test_hex_prefix(void **state)
{
	static const uint8_t pkt[] = {0x00, 0x00, 0x00, 0x0c, 0x04, 0xd2, 0x16, 0x2f, 0xAB, 0xCD};
	char out[32];

	proto_hex_prefix(pkt, sizeof(pkt), out, sizeof(out));
	assert_string_equal(out, "0000000c04d2162f");
	proto_hex_prefix(pkt + 4, 6, out, sizeof(out));
	assert_string_equal(out, "04d2162fabcd");
	proto_hex_prefix(pkt, 3, out, sizeof(out));
	assert_string_equal(out, "000000");
	proto_hex_prefix(pkt, 0, out, sizeof(out));
	assert_string_equal(out, "");

	/* exact fit for 8 bytes is 17 */
	proto_hex_prefix(pkt, sizeof(pkt), out, 17);
	assert_string_equal(out, "0000000c04d2162f");
	/* a short buffer gets whole bytes only, always terminated */
	memset(out, 'z', sizeof(out));
	proto_hex_prefix(pkt + 4, 4, out, 6);
	assert_string_equal(out, "04d2");
	memset(out, 'z', sizeof(out));
	proto_hex_prefix(pkt + 4, 4, out, 1);
	assert_string_equal(out, "");
	memset(out, 'z', sizeof(out));
	proto_hex_prefix(pkt, 4, out, 0);
	assert_int_equal(out[0], 'z');
}

/* ---- message names ---- */

static void test_msg_names(void **state)
{
	/* from the client */
	assert_string_equal(proto_msg_name('Q', false), "Query");
	assert_string_equal(proto_msg_name('P', false), "Parse");
	assert_string_equal(proto_msg_name('B', false), "Bind");
	assert_string_equal(proto_msg_name('E', false), "Execute");
	assert_string_equal(proto_msg_name('D', false), "Describe");
	assert_string_equal(proto_msg_name('S', false), "Sync");
	assert_string_equal(proto_msg_name('X', false), "Terminate");
	assert_string_equal(proto_msg_name('p', false), "PasswordMessage");
	assert_string_equal(proto_msg_name('C', false), "Close");
	assert_string_equal(proto_msg_name(0, false), "StartupMessage");
	/* from the server, the same letters can mean something else */
	assert_string_equal(proto_msg_name('T', true), "RowDescription");
	assert_string_equal(proto_msg_name('Z', true), "ReadyForQuery");
	assert_string_equal(proto_msg_name('E', true), "ErrorResponse");
	assert_string_equal(proto_msg_name('D', true), "DataRow");
	assert_string_equal(proto_msg_name('S', true), "ParameterStatus");
	assert_string_equal(proto_msg_name('C', true), "CommandComplete");
	assert_string_equal(proto_msg_name('R', true), "Authentication");
	assert_string_equal(proto_msg_name('K', true), "BackendKeyData");
	assert_string_equal(proto_msg_name('1', true), "ParseComplete");
	assert_string_equal(proto_msg_name('v', true), "NegotiateProtocolVersion");
	/* unknown */
	assert_string_equal(proto_msg_name('?', false), "unknown");
	assert_string_equal(proto_msg_name('Q', true), "unknown");
	assert_string_equal(proto_msg_name('T', false), "unknown");
}

/* ---- the replication startup parameter ---- */

static void test_replication_values(void **state)
{
	(void)state;
	assert_int_equal(proto_parse_replication(NULL), REPLICATION_NONE);
	assert_int_equal(proto_parse_replication("database"), REPLICATION_LOGICAL);
	/* PostgreSQL booleans, any case, and their prefixes */
	static const char *const yes[] = {"true", "TRUE", "t", "tr", "on", "On", "yes", "y", "YE", "1"};
	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
		assert_int_equal(proto_parse_replication(yes[i]), REPLICATION_PHYSICAL);
	static const char *const no[] = {"false", "f", "FALSE", "off", "of", "OFF", "no", "n", "0"};
	for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
		assert_int_equal(proto_parse_replication(no[i]), REPLICATION_NONE);
	/* not a boolean: a normal connection (spec/behaviours.md §1.2) */
	static const char *const garbage[] = {"",  "o",  "Database", "database ", "truex", "yess",
	                                      "2", "10", " true",    "onn",       "offf",  "physical"};
	for (size_t i = 0; i < sizeof(garbage) / sizeof(garbage[0]); i++)
		assert_int_equal(proto_parse_replication(garbage[i]), REPLICATION_NONE);
}

static void test_replication_names(void **state)
{
	(void)state;
	assert_string_equal(proto_replication_value(REPLICATION_NONE), "no");
	assert_string_equal(proto_replication_value(REPLICATION_PHYSICAL), "yes");
	assert_string_equal(proto_replication_value(REPLICATION_LOGICAL), "database");
	assert_string_equal(proto_replication_show_name(REPLICATION_NONE), "none");
	assert_string_equal(proto_replication_show_name(REPLICATION_PHYSICAL), "physical");
	assert_string_equal(proto_replication_show_name(REPLICATION_LOGICAL), "logical");
}

/* ---- server and SASL message bodies ---- */

static void test_parse_error_fields(void **state)
{
	static const uint8_t ok[] = "SFATAL\0VFATAL\0C28P01\0Mpassword authentication failed\0\0";
	const char *sev, *code, *msg;
	assert_true(proto_parse_error(ok, sizeof(ok) - 1, &sev, &code, &msg));
	assert_string_equal(sev, "FATAL");
	assert_string_equal(code, "28P01");
	assert_string_equal(msg, "password authentication failed");
	/* no terminating zero, a missing field, a byte after the end: malformed, defaults kept */
	assert_false(proto_parse_error(ok, sizeof(ok) - 2, &sev, &code, &msg));
	static const uint8_t no_code[] = "SERROR\0Mx\0\0";
	assert_false(proto_parse_error(no_code, sizeof(no_code) - 1, &sev, &code, &msg));
	assert_string_equal(code, "08P01");
	assert_false(proto_parse_error(ok, sizeof(ok), &sev, &code, &msg));
	static const uint8_t cut[] = "SERROR\0C12345\0Mno nul";
	assert_false(proto_parse_error(cut, sizeof(cut) - 1, &sev, &code, &msg));
}

static void test_parse_param_status(void **state)
{
	static const uint8_t ok[] = "TimeZone\0UTC\0";
	const char *name, *value;
	assert_true(proto_parse_param_status(ok, sizeof(ok) - 1, &name, &value));
	assert_string_equal(name, "TimeZone");
	assert_string_equal(value, "UTC");
	assert_false(proto_parse_param_status(ok, sizeof(ok) - 2, &name, &value)); /* value without NUL */
	assert_false(proto_parse_param_status(ok, sizeof(ok), &name, &value));     /* a byte after it */
	assert_false(proto_parse_param_status(ok, 3, &name, &value));
}

static void test_sasl_mechs(void **state)
{
	static const uint8_t both[] = "SCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0";
	static const uint8_t plus[] = "SCRAM-SHA-256-PLUS\0\0";
	assert_true(proto_sasl_has_mech(both, sizeof(both) - 1, "SCRAM-SHA-256"));
	assert_false(proto_sasl_has_mech(plus, sizeof(plus) - 1, "SCRAM-SHA-256"));
	assert_false(proto_sasl_has_mech(both, 10, "SCRAM-SHA-256"));
	assert_false(proto_sasl_has_mech(both, 0, "SCRAM-SHA-256"));
}

static void test_sasl_initial(void **state)
{
	static const uint8_t ok[] = "SCRAM-SHA-256\0\0\0\0\3abc";
	static const uint8_t none[] = "SCRAM-SHA-256\0\xff\xff\xff\xff";
	static const uint8_t long_len[] = "SCRAM-SHA-256\0\0\0\0\4abc";
	const char *mech;
	const uint8_t *d;
	uint32_t n;
	assert_true(proto_parse_sasl_initial(ok, sizeof(ok) - 1, &mech, &d, &n));
	assert_string_equal(mech, "SCRAM-SHA-256");
	assert_int_equal(n, 3);
	assert_memory_equal(d, "abc", 3);
	assert_true(proto_parse_sasl_initial(none, sizeof(none) - 1, &mech, &d, &n));
	assert_null(d);
	assert_true(proto_parse_sasl_initial(long_len, sizeof(long_len) - 1, &mech, &d, &n));
	assert_null(d);                                                /* the length runs past the message */
	assert_false(proto_parse_sasl_initial(ok, 16, &mech, &d, &n)); /* no whole length */
	assert_false(proto_parse_sasl_initial(ok, 5, &mech, &d, &n));  /* no NUL after the name */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_typed_header_ok),
	    cmocka_unit_test(test_typed_header_incomplete),
	    cmocka_unit_test(test_typed_header_lengths),
	    cmocka_unit_test(test_startup_header_ok),
	    cmocka_unit_test(test_startup_header_incomplete),
	    cmocka_unit_test(test_startup_header_lengths),
	    cmocka_unit_test(test_startup_params_good),
	    cmocka_unit_test(test_startup_params_points_into_body),
	    cmocka_unit_test(test_startup_params_missing_terminator),
	    cmocka_unit_test(test_startup_params_trailing_bytes),
	    cmocka_unit_test(test_startup_params_odd_strings),
	    cmocka_unit_test(test_startup_params_too_many),
	    cmocka_unit_test(test_startup_params_empty),
	    cmocka_unit_test(test_hex_prefix),
	    cmocka_unit_test(test_msg_names),
	    cmocka_unit_test(test_replication_values),
	    cmocka_unit_test(test_replication_names),
	    cmocka_unit_test(test_parse_error_fields),
	    cmocka_unit_test(test_parse_param_status),
	    cmocka_unit_test(test_sasl_mechs),
	    cmocka_unit_test(test_sasl_initial),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
