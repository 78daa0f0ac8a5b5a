/*
 * Unit tests for http_request.c: where the head of a request to
 * metrics_listen ends, the size bound (doc/monitoring.md, "Limits"), and
 * the method and path taken from its request line.
 */
#include "autoconfig.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "unit.h"

#include "master/http_request.h"

static HttpParse parse_len(const char *text, size_t len, size_t max, HttpRequest *req)
{
	size_t looked = 0;
	return http_request_parse(text, len, max, &looked, req);
}

static HttpParse parse(const char *text, size_t max, HttpRequest *req)
{
	return parse_len(text, strlen(text), max, req);
}

static void assert_path(const HttpRequest *req, const char *want)
{
	assert_int_equal(req->path_len, strlen(want));
	assert_memory_equal(req->path, want, strlen(want));
}

static void test_get(void **state)
{
	HttpRequest req;
	const char *text = "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n";
	assert_int_equal(parse(text, 8192, &req), HTTP_DONE);
	assert_int_equal(req.method, HTTP_GET);
	assert_path(&req, "/metrics");
	assert_int_equal(req.head_len, strlen(text));

	/* bare line feeds, HTTP/1.0, no header field, bytes after the head */
	text = "HEAD /metrics?x=1 HTTP/1.0\n\nGET / HTTP/1.1\r\n";
	assert_int_equal(parse(text, 8192, &req), HTTP_DONE);
	assert_int_equal(req.method, HTTP_HEAD);
	assert_path(&req, "/metrics");
	assert_int_equal(req.head_len, strlen("HEAD /metrics?x=1 HTTP/1.0\n\n"));
}

/* Fed a byte at a time, as a slow client sends it: the same answer, at the byte that ends the head. */
static void test_byte_by_byte(void **state)
{
	static const char *const heads[] = {
	    "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
	    "GET /metrics HTTP/1.0\n\n",
	    "HEAD /metrics HTTP/1.1\r\nA: b\n\r\n",
	};
	for (size_t h = 0; h < sizeof(heads) / sizeof(heads[0]); h++) {
		const char *text = heads[h];
		size_t len = strlen(text), looked = 0;
		HttpRequest req;
		for (size_t n = 1; n < len; n++)
			assert_int_equal(http_request_parse(text, n, 8192, &looked, &req), HTTP_NEED_MORE);
		assert_int_equal(http_request_parse(text, len, 8192, &looked, &req), HTTP_DONE);
		assert_int_equal(req.head_len, len);
		assert_path(&req, "/metrics");
	}
	/* and the bound still holds */
	size_t looked = 0;
	HttpRequest req;
	const char *text = "GET /metrics HTTP/1.1\r\nX: yyyyyyyyyyyyyyyy\r\n";
	for (size_t n = 1; n < 32; n++)
		assert_int_equal(http_request_parse(text, n, 32, &looked, &req), HTTP_NEED_MORE);
	assert_int_equal(http_request_parse(text, 32, 32, &looked, &req), HTTP_TOO_LARGE);
}

static void test_other_methods_and_paths(void **state)
{
	HttpRequest req;
	assert_int_equal(parse("POST /metrics HTTP/1.1\r\nContent-Length: 1\r\n\r\nx", 8192, &req), HTTP_DONE);
	assert_int_equal(req.method, HTTP_OTHER);
	assert_int_equal(parse("get /metrics HTTP/1.1\r\n\r\n", 8192, &req), HTTP_DONE);
	assert_int_equal(req.method, HTTP_OTHER); /* methods are case-sensitive */
	assert_int_equal(parse("GET http://127.0.0.1:9127/metrics?a HTTP/1.1\r\n\r\n", 8192, &req), HTTP_DONE);
	assert_path(&req, "/metrics");
	assert_int_equal(parse("GET HTTP://host HTTP/1.1\r\n\r\n", 8192, &req), HTTP_DONE);
	assert_path(&req, "/");
	assert_int_equal(parse("OPTIONS * HTTP/1.1\r\n\r\n", 8192, &req), HTTP_DONE);
	assert_path(&req, "*");
	assert_int_equal(parse("GET /metrics#frag HTTP/1.1\r\n\r\n", 8192, &req), HTTP_DONE);
	assert_path(&req, "/metrics");
}

static void test_incomplete(void **state)
{
	HttpRequest req = {.path = NULL};
	assert_int_equal(parse("", 8192, &req), HTTP_NEED_MORE);
	assert_int_equal(parse("\r\n", 8192, &req), HTTP_NEED_MORE);
	assert_int_equal(parse("\n", 8192, &req), HTTP_NEED_MORE);
	assert_int_equal(parse("GET /metrics HTTP/1.1", 8192, &req), HTTP_NEED_MORE);
	assert_int_equal(parse("GET /metrics HTTP/1.1\r\n", 8192, &req), HTTP_NEED_MORE);
	assert_int_equal(parse("GET /metrics HTTP/1.1\r\nHost: x\r\n\r", 8192, &req), HTTP_NEED_MORE);
	assert_null(req.path); /* untouched */
}

static void test_too_large(void **state)
{
	HttpRequest req;
	const char *text = "GET /metrics HTTP/1.1\r\nX: 0123456789\r\n\r\n";
	size_t len = strlen(text);
	assert_int_equal(parse(text, len, &req), HTTP_DONE); /* exactly the limit */
	assert_int_equal(parse(text, len - 1, &req), HTTP_TOO_LARGE);
	/* the limit holds whatever follows it */
	assert_int_equal(parse_len(text, len - 1, len - 1, &req), HTTP_TOO_LARGE);
	assert_int_equal(parse_len(text, len - 2, len - 1, &req), HTTP_NEED_MORE);
	/* endless header lines */
	char big[4096];
	size_t n = (size_t)snprintf(big, sizeof(big), "GET /metrics HTTP/1.1\r\n");
	while (n + 8 < sizeof(big))
		n += (size_t)snprintf(big + n, sizeof(big) - n, "X: y\r\n");
	assert_int_equal(parse_len(big, n, 1024, &req), HTTP_TOO_LARGE);
	assert_int_equal(parse_len(big, n, n + 1, &req), HTTP_NEED_MORE);
}

static void test_bad(void **state)
{
	HttpRequest req;
	static const char *const bad[] = {
	    "GET\r\n\r\n",
	    "GET /metrics\r\n\r\n",            /* HTTP/0.9 */
	    "GET  /metrics HTTP/1.1\r\n\r\n",  /* two spaces */
	    "GET /metrics HTTP/2.0\r\n\r\n",   /* not 1.x */
	    "GET /metrics HTTP/1.1 x\r\n\r\n", /* more after the version */
	    "G(T /metrics HTTP/1.1\r\n\r\n",   /* not a token */
	    " GET /metrics HTTP/1.1\r\n\r\n",  /* empty method */
	    "\x16\x03\x01\x02\x05\x01\n\n",    /* a TLS hello, say */
	    "GET /metrics HTTP/1.1x\r\nHost: y\r\n\r\n",
	    "\r\nGET /metrics HTTP/1.1\r\n\r\n", /* an empty line first */
	    "\r\n\r\n",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(parse(bad[i], 8192, &req), HTTP_BAD);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_get),
	    cmocka_unit_test(test_byte_by_byte),
	    cmocka_unit_test(test_other_methods_and_paths),
	    cmocka_unit_test(test_incomplete),
	    cmocka_unit_test(test_too_large),
	    cmocka_unit_test(test_bad),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
