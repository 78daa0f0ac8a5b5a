/*
 * Finding and splitting the head of a request to metrics_listen
 * (doc/monitoring.md, "Limits"). The endpoint needs only the method and the
 * path; the caller bounds the bytes it keeps, this says when they suffice.
 */
#include "autoconfig.h"

#include "master/http_request.h"

#include <stdbool.h>
#include <string.h>
#include <strings.h>

/* The length of the head if it ends within n bytes (its line feeds at `from` or after), else 0. */
static size_t head_end(const char *buf, size_t from, size_t n)
{
	for (const char *lf = memchr(buf + from, '\n', n - from); lf;
	     lf = memchr(lf + 1, '\n', n - (size_t)(lf + 1 - buf))) {
		size_t i = (size_t)(lf - buf);
		if (i + 1 < n && buf[i + 1] == '\n')
			return i + 2;
		if (i + 2 < n && buf[i + 1] == '\r' && buf[i + 2] == '\n')
			return i + 3;
	}
	return 0;
}

/* A token character of RFC 9110 5.6.2 (methods are tokens). */
static bool is_tchar(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       (c && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static bool parse_method(const char *m, size_t len, HttpMethod *out)
{
	if (len == 0)
		return false;
	for (size_t i = 0; i < len; i++)
		if (!is_tchar(m[i]))
			return false;
	if (len == 3 && memcmp(m, "GET", 3) == 0)
		*out = HTTP_GET;
	else if (len == 4 && memcmp(m, "HEAD", 4) == 0)
		*out = HTTP_HEAD;
	else
		*out = HTTP_OTHER;
	return true;
}

/* The path of an origin-form ("/p?q") or absolute-form ("http://h:1/p") target. */
static void target_path(const char *t, size_t len, HttpRequest *req)
{
	size_t skip = 0;
	if (len >= 7 && strncasecmp(t, "http://", 7) == 0)
		skip = 7;
	else if (len >= 8 && strncasecmp(t, "https://", 8) == 0)
		skip = 8;
	if (skip) {
		const char *slash = memchr(t + skip, '/', len - skip);
		if (!slash) {
			req->path = "/";
			req->path_len = 1;
			return;
		}
		len -= (size_t)(slash - t);
		t = slash;
	}
	size_t n = 0;
	while (n < len && t[n] != '?' && t[n] != '#')
		n++;
	req->path = t;
	req->path_len = n;
}

HttpParse http_request_parse(const char *buf, size_t len, size_t max, size_t *looked, HttpRequest *req)
{
	size_t n = len < max ? len : max;
	/* a line feed seen before may start the end of the head: look again from the last two bytes */
	size_t from = *looked > 2 ? *looked - 2 : 0;
	size_t head_len = from < n ? head_end(buf, from, n) : 0;
	if (head_len == 0) {
		*looked = n;
		return len >= max ? HTTP_TOO_LARGE : HTTP_NEED_MORE;
	}

	const char *line = buf;
	size_t line_len = (size_t)((const char *)memchr(line, '\n', head_len) - line);
	if (line_len > 0 && line[line_len - 1] == '\r')
		line_len--;
	const char *sp1 = memchr(line, ' ', line_len);
	if (!sp1)
		return HTTP_BAD;
	const char *target = sp1 + 1;
	const char *sp2 = memchr(target, ' ', line_len - (size_t)(target - line));
	if (!sp2 || sp2 == target)
		return HTTP_BAD;
	const char *version = sp2 + 1;
	size_t version_len = line_len - (size_t)(version - line);
	if (version_len != 8 || memcmp(version, "HTTP/1.", 7) != 0 || version[7] < '0' || version[7] > '9')
		return HTTP_BAD;
	HttpMethod method;
	if (!parse_method(line, (size_t)(sp1 - line), &method))
		return HTTP_BAD;
	req->method = method;
	target_path(target, (size_t)(sp2 - target), req);
	req->head_len = head_len;
	return HTTP_DONE;
}
