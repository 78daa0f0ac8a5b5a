/*
 * The head of an HTTP/1.x request to metrics_listen (doc/monitoring.md,
 * "Limits"): where it ends and what its request line asks for. Pure, no
 * libevent, so that test/unit/test_http_request.c can try every case.
 */
#ifndef PGB_MASTER_HTTP_REQUEST_H
#define PGB_MASTER_HTTP_REQUEST_H

#include <stddef.h>

typedef enum HttpParse {
	HTTP_NEED_MORE, /* no end of head yet, and fewer than `max` bytes */
	HTTP_TOO_LARGE, /* no end of head within the first `max` bytes */
	HTTP_BAD,       /* the request line is not "METHOD SP target SP HTTP/1.x" */
	HTTP_DONE,      /* a whole head: the HttpRequest is filled in */
} HttpParse;

typedef enum HttpMethod {
	HTTP_GET,   /* GET */
	HTTP_HEAD,  /* HEAD */
	HTTP_OTHER, /* any other token: refused with 405 */
} HttpMethod;

typedef struct HttpRequest {
	HttpMethod method;
	const char *path; /* into the caller's buffer, not NUL-terminated; "/" for "http://host" */
	size_t path_len;  /* up to '?' or '#' */
	size_t head_len;  /* bytes up to and with the empty line that ends the head */
} HttpRequest;

/*
 * Look at the first `len` bytes a client sent. The head ends with an empty
 * line (CRLF or bare LF line ends); header fields are not looked at, a body
 * is never wanted. An empty line before the request line, which RFC 9112
 * 2.2 lets a server skip, is a bad request here: the answer closes the
 * connection, so no request follows a body. Only the first `max` bytes
 * count: a head that has not ended by then is HTTP_TOO_LARGE even if more
 * bytes are there. `*looked` is 0 for the first call on a request; on
 * HTTP_NEED_MORE it says how far this call looked, so that the next one,
 * with the same bytes and more, looks at each byte about once. `req` is
 * written only for HTTP_DONE.
 */
HttpParse http_request_parse(const char *buf, size_t len, size_t max, size_t *looked, HttpRequest *req);

#endif
