/*
 * Unit tests for pktbuf.c: the exact bytes of every message the pooler
 * builds itself, and the bounds checks of the message reader.
 */
#include "autoconfig.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/pktbuf.h"

/* Compare the whole buffer with the expected bytes. */
#define assert_pkt(pb, ...)                                                                                            \
	do {                                                                                                           \
		static const uint8_t expect_[] = {__VA_ARGS__};                                                        \
		assert_int_equal((pb)->len, sizeof(expect_));                                                          \
		assert_memory_equal((pb)->buf, expect_, sizeof(expect_));                                              \
	} while (0)

/* What put() (a quoting function) writes for s, as a C string. */
static char *quoted(void (*put)(PktBuf *, const char *), const char *s)
{
	static char out[256];
	PktBuf pb;
	pktbuf_init(&pb, 0);
	put(&pb, s);
	assert_true(pb.len < sizeof(out));
	memcpy(out, pb.buf, pb.len);
	out[pb.len] = '\0';
	pktbuf_free(&pb);
	return out;
}

static char *literal(const char *s)
{
	return quoted(pktbuf_put_sql_literal, s);
}

static void test_sql_ident(void **state)
{
	assert_string_equal(quoted(pktbuf_put_sql_ident, "DateStyle"), "\"DateStyle\"");
	assert_string_equal(quoted(pktbuf_put_sql_ident, "a\"b"), "\"a\"\"b\"");
	assert_string_equal(quoted(pktbuf_put_sql_ident, "x\"=1; DROP TABLE t; --"), "\"x\"\"=1; DROP TABLE t; --\"");
}

static void test_sql_literal(void **state)
{
	assert_string_equal(literal("UTC"), "'UTC'");
	assert_string_equal(literal(""), "''");
	assert_string_equal(literal("it's"), "'it''s'");
	/* a backslash reads the same with standard_conforming_strings on or off */
	assert_string_equal(literal("a\\b"), "E'a\\\\b'");
	assert_string_equal(literal("x\\'; DROP TABLE t; --"), "E'x\\\\''; DROP TABLE t; --'");
}

static void test_ready_for_query(void **state)
{
	PktBuf pb;
	pktbuf_init(&pb, 0);
	pktbuf_write_ready(&pb, 'I');
	assert_pkt(&pb, 0x5a, 0x00, 0x00, 0x00, 0x05, 0x49);
	assert_false(pb.in_msg);

	/* reset keeps the memory and starts over */
	pktbuf_reset(&pb);
	assert_int_equal(pb.len, 0);
	pktbuf_write_ready(&pb, 'T');
	assert_pkt(&pb, 'Z', 0, 0, 0, 5, 'T');
	pktbuf_free(&pb);
	assert_null(pb.buf);
}

static void test_error_response(void **state)
{
	PktBuf pb;
	pktbuf_init(&pb, 16);
	pktbuf_write_error(&pb, "FATAL", "08P01", "no such user");
	/* 4 + "SFATAL\0" 7 + "C08P01\0" 7 + "Mno such user\0" 14 + 1 = 33 */
	assert_pkt(&pb, 'E', 0x00, 0x00, 0x00, 0x21,                                   /* type, length 33 */
	           'S', 'F', 'A', 'T', 'A', 'L', 0,                                    /* severity */
	           'C', '0', '8', 'P', '0', '1', 0,                                    /* SQLSTATE */
	           'M', 'n', 'o', ' ', 's', 'u', 'c', 'h', ' ', 'u', 's', 'e', 'r', 0, /* message */
	           0);                                                                 /* terminator */
	pktbuf_free(&pb);
}

static void test_notice(void **state)
{
	PktBuf pb;
	pktbuf_init(&pb, 0);
	pktbuf_write_notice(&pb, "hi");
	/* 4 + "SNOTICE\0" 8 + "C00000\0" 7 + "Mhi\0" 4 + 1 = 24 */
	assert_pkt(&pb, 'N', 0, 0, 0, 24, 'S', 'N', 'O', 'T', 'I', 'C', 'E', 0, 'C', '0', '0', '0', '0', '0', 0, 'M',
	           'h', 'i', 0, 0);
	pktbuf_free(&pb);
}

static void test_notice_detail(void **state)
{
	PktBuf pb;
	pktbuf_init(&pb, 0);
	pktbuf_write_notice_detail(&pb, "a", "bc");
	/* 4 + 8 + 7 + "Ma\0" 3 + "Dbc\0" 4 + 1 = 27 */
	assert_pkt(&pb, 'N', 0, 0, 0, 27, 'S', 'N', 'O', 'T', 'I', 'C', 'E', 0, 'C', '0', '0', '0', '0', '0', 0, 'M',
	           'a', 0, 'D', 'b', 'c', 0, 0);
	pktbuf_free(&pb);
}

static void test_param_status(void **state)
{
	PktBuf pb;
	pktbuf_init(&pb, 0);
	pktbuf_write_param_status(&pb, "TimeZone", "UTC");
	assert_pkt(&pb, 'S', 0, 0, 0, 17, 'T', 'i', 'm', 'e', 'Z', 'o', 'n', 'e', 0, 'U', 'T', 'C', 0);
	pktbuf_free(&pb);
}

static void test_auth(void **state)
{
	static const uint8_t salt[4] = {0xde, 0xad, 0xbe, 0xef};
	PktBuf pb;
	pktbuf_init(&pb, 0);
	pktbuf_write_auth(&pb, 0, NULL, 0);
	pktbuf_write_auth(&pb, 5, salt, sizeof(salt));
	/* AuthenticationOk, then AuthenticationMD5Password with the salt; two messages in one buffer */
	assert_pkt(&pb, 'R', 0, 0, 0, 8, 0, 0, 0, 0, /* ok */
	           'R', 0, 0, 0, 12, 0, 0, 0, 5, 0xde, 0xad, 0xbe, 0xef);
	pktbuf_free(&pb);
}

static void test_backend_key(void **state)
{
	static const uint8_t key[4] = {0x01, 0x02, 0x03, 0x04};
	PktBuf pb;
	pktbuf_init(&pb, 0);
	pktbuf_write_backend_key(&pb, 0x7f000102, key, sizeof(key));
	assert_pkt(&pb, 'K', 0, 0, 0, 12, 0x7f, 0x00, 0x01, 0x02, 0x01, 0x02, 0x03, 0x04);
	pktbuf_free(&pb);
}

static void test_command_complete_and_empty_query(void **state)
{
	PktBuf pb;
	pktbuf_init(&pb, 0);
	pktbuf_write_command_complete(&pb, "SHOW");
	pktbuf_write_empty_query(&pb);
	assert_pkt(&pb, 'C', 0, 0, 0, 9, 'S', 'H', 'O', 'W', 0, 'I', 0, 0, 0, 4);
	pktbuf_free(&pb);
}

static void test_row_description_int4(void **state)
{
	static const char *const names[] = {"cnt"};
	PktBuf pb;
	pktbuf_init(&pb, 0);
	pktbuf_write_row_description(&pb, "i", names);
	/* 4 + 2 + "cnt\0" 4 + 18 = 28 */
	assert_pkt(&pb, 'T', 0, 0, 0, 28,  /* header */
	           0, 1,                   /* one column */
	           'c', 'n', 't', 0,       /* name */
	           0, 0, 0, 0,             /* table OID */
	           0, 0,                   /* column number */
	           0, 0, 0, 23,            /* int4 */
	           0, 4,                   /* typlen 4 */
	           0xff, 0xff, 0xff, 0xff, /* typmod -1 */
	           0, 0);                  /* text format */
	pktbuf_free(&pb);
}

/* Every type letter maps to its OID and typlen. */
static void test_row_description_all_types(void **state)
{
	static const char *const names[] = {"a", "b", "c", "d", "e"};
	static const struct {
		uint32_t oid;
		uint16_t typlen;
	} expect[] = {{25, 0xffff}, {23, 4}, {20, 8}, {1700, 0xffff}, {17, 0xffff}};
	PktBuf pb;
	PktReader r;
	uint8_t type;
	uint32_t len, u32;
	uint16_t ncols, u16;
	const char *name;

	pktbuf_init(&pb, 0);
	pktbuf_write_row_description(&pb, "TiqNb", names);
	pktreader_init(&r, pb.buf, pb.len);
	assert_true(pktreader_get_u8(&r, &type));
	assert_int_equal(type, 'T');
	assert_true(pktreader_get_u32(&r, &len));
	assert_int_equal(len, pb.len - 1);
	assert_true(pktreader_get_u16(&r, &ncols));
	assert_int_equal(ncols, 5);
	for (int i = 0; i < 5; i++) {
		assert_true(pktreader_get_string(&r, &name));
		assert_string_equal(name, names[i]);
		assert_true(pktreader_get_u32(&r, &u32));
		assert_int_equal(u32, 0);
		assert_true(pktreader_get_u16(&r, &u16));
		assert_int_equal(u16, 0);
		assert_true(pktreader_get_u32(&r, &u32));
		assert_int_equal(u32, expect[i].oid);
		assert_true(pktreader_get_u16(&r, &u16));
		assert_int_equal(u16, expect[i].typlen);
		assert_true(pktreader_get_u32(&r, &u32));
		assert_int_equal(u32, 0xffffffffu);
		assert_true(pktreader_get_u16(&r, &u16));
		assert_int_equal(u16, 0);
	}
	assert_int_equal(pktreader_remaining(&r), 0);
	pktbuf_free(&pb);
}

static void test_data_row(void **state)
{
	static const char *const values[] = {"ab", NULL, ""};
	PktBuf pb;
	pktbuf_init(&pb, 0);
	pktbuf_write_data_row(&pb, 3, values);
	/* 4 + 2 + (4 + 2) + 4 + 4 = 20 */
	assert_pkt(&pb, 'D', 0, 0, 0, 20, 0, 3, /* three columns */
	           0, 0, 0, 2, 'a', 'b',        /* "ab" */
	           0xff, 0xff, 0xff, 0xff,      /* NULL */
	           0, 0, 0, 0);                 /* "" */
	pktbuf_free(&pb);
}

/* An untyped (startup-style) message: the length is the first field and counts itself. */
static void test_untyped_and_primitives(void **state)
{
	PktBuf pb;
	pktbuf_init(&pb, 0);
	pktbuf_start_msg(&pb, 0);
	assert_true(pb.in_msg);
	pktbuf_put_u32(&pb, 0x00030000);
	pktbuf_put_string(&pb, "user");
	pktbuf_put_string(&pb, "u");
	pktbuf_put_u8(&pb, 0);
	pktbuf_finish_msg(&pb);
	assert_false(pb.in_msg);
	assert_pkt(&pb, 0, 0, 0, 16, 0, 3, 0, 0, 'u', 's', 'e', 'r', 0, 'u', 0, 0);

	pktbuf_reset(&pb);
	pktbuf_put_u16(&pb, 0x1234);
	pktbuf_put_u32(&pb, 0xa1b2c3d4);
	pktbuf_put_bytes(&pb, "xy", 2);
	pktbuf_put_bytes(&pb, NULL, 0);
	pktbuf_put_u8(&pb, 'N');
	assert_pkt(&pb, 0x12, 0x34, 0xa1, 0xb2, 0xc3, 0xd4, 'x', 'y', 'N');
	pktbuf_free(&pb);
}

/* A message far larger than the initial capacity grows the buffer and keeps the bytes. */
static void test_growth(void **state)
{
	char big[5000];
	PktBuf pb;

	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	pktbuf_init(&pb, 1);
	pktbuf_write_ready(&pb, 'I');
	pktbuf_write_command_complete(&pb, big);
	assert_int_equal(pb.len, 6 + 5 + sizeof(big));
	assert_true(pb.cap >= pb.len);
	assert_memory_equal(pb.buf, "Z\0\0\0\5I", 6);
	/* CommandComplete length = 4 + 5000 = 5004 = 0x138c */
	assert_memory_equal(pb.buf + 6, "C\0\0\x13\x8c", 5);
	assert_memory_equal(pb.buf + 11, big, sizeof(big));
	pktbuf_free(&pb);
}

static void test_reader_getters(void **state)
{
	static const uint8_t data[] = {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 'h', 'i', 0, 0xaa};
	PktReader r;
	uint8_t u8;
	uint16_t u16;
	uint32_t u32;
	const uint8_t *p;
	const char *s;

	pktreader_init(&r, data, sizeof(data));
	assert_int_equal(pktreader_remaining(&r), 11);
	assert_true(pktreader_get_u8(&r, &u8));
	assert_int_equal(u8, 0x01);
	assert_true(pktreader_get_u16(&r, &u16));
	assert_int_equal(u16, 0x0203);
	assert_true(pktreader_get_u32(&r, &u32));
	assert_int_equal(u32, 0x04050607);
	assert_true(pktreader_get_string(&r, &s));
	assert_string_equal(s, "hi");
	assert_ptr_equal(s, (const char *)data + 7);
	assert_int_equal(pktreader_remaining(&r), 1);
	assert_true(pktreader_get_bytes(&r, 1, &p));
	assert_int_equal(p[0], 0xaa);
	assert_int_equal(pktreader_remaining(&r), 0);
	/* zero bytes at the end is still inside the body */
	assert_true(pktreader_get_bytes(&r, 0, &p));
}

/* Each getter fails when the value would cross the end, and does not move the position. */
static void test_reader_bounds(void **state)
{
	static const uint8_t data[] = {0x11, 0x22, 0x33};
	PktReader r;
	uint8_t u8;
	uint16_t u16;
	uint32_t u32 = 0x5555;
	const uint8_t *p;
	const char *s;

	pktreader_init(&r, data, sizeof(data));
	assert_false(pktreader_get_u32(&r, &u32));
	assert_int_equal(u32, 0x5555);
	assert_false(pktreader_get_bytes(&r, 4, &p));
	assert_int_equal(pktreader_remaining(&r), 3);
	assert_true(pktreader_get_bytes(&r, 2, &p));
	assert_false(pktreader_get_u16(&r, &u16));
	assert_false(pktreader_get_u32(&r, &u32));
	assert_int_equal(pktreader_remaining(&r), 1);
	assert_true(pktreader_get_u8(&r, &u8));
	assert_int_equal(u8, 0x33);
	assert_false(pktreader_get_u8(&r, &u8));
	assert_false(pktreader_get_u16(&r, &u16));
	assert_false(pktreader_get_u32(&r, &u32));
	assert_false(pktreader_get_bytes(&r, 1, &p));
	assert_false(pktreader_get_string(&r, &s));
	assert_int_equal(pktreader_remaining(&r), 0);

	/* empty body */
	pktreader_init(&r, NULL, 0);
	assert_false(pktreader_get_u8(&r, &u8));
	assert_false(pktreader_get_string(&r, &s));
	assert_int_equal(pktreader_remaining(&r), 0);
}

static void test_reader_string_without_nul(void **state)
{
	static const uint8_t data[] = {'a', 0, 'b', 'c'};
	PktReader r;
	const char *s;

	pktreader_init(&r, data, sizeof(data));
	assert_true(pktreader_get_string(&r, &s));
	assert_string_equal(s, "a");
	assert_false(pktreader_get_string(&r, &s));
	assert_int_equal(pktreader_remaining(&r), 2);

	/* the NUL just past the reader's end does not count */
	pktreader_init(&r, data, 1);
	assert_false(pktreader_get_string(&r, &s));
	pktreader_init(&r, data, 2);
	assert_true(pktreader_get_string(&r, &s));
	assert_string_equal(s, "a");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_ready_for_query),
	    cmocka_unit_test(test_error_response),
	    cmocka_unit_test(test_notice),
	    cmocka_unit_test(test_notice_detail),
	    cmocka_unit_test(test_param_status),
	    cmocka_unit_test(test_auth),
	    cmocka_unit_test(test_backend_key),
	    cmocka_unit_test(test_command_complete_and_empty_query),
	    cmocka_unit_test(test_row_description_int4),
	    cmocka_unit_test(test_row_description_all_types),
	    cmocka_unit_test(test_data_row),
	    cmocka_unit_test(test_untyped_and_primitives),
	    cmocka_unit_test(test_growth),
	    cmocka_unit_test(test_sql_literal),
	    cmocka_unit_test(test_sql_ident),
	    cmocka_unit_test(test_reader_getters),
	    cmocka_unit_test(test_reader_bounds),
	    cmocka_unit_test(test_reader_string_without_nul),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
