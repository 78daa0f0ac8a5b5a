/*
 * Building PostgreSQL protocol messages into a growing buffer, and reading
 * fields out of received message bodies with bounds checks on every read.
 * Pure code: callers own the sockets.
 */
#include "autoconfig.h"

#include "common/pktbuf.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"

/* Type OIDs and typlen of the column types RowDescription can announce (doc/architecture.md, "Admin console across workers"). */
#define OID_BYTEA   17
#define OID_INT8    20
#define OID_INT4    23
#define OID_TEXT    25
#define OID_NUMERIC 1700

#define PKTBUF_MIN_CAP 64

void pktbuf_init(PktBuf *pb, size_t initial_cap)
{
	if (initial_cap < PKTBUF_MIN_CAP)
		initial_cap = PKTBUF_MIN_CAP;
	pb->buf = xmalloc(initial_cap);
	pb->cap = initial_cap;
	pb->len = 0;
	pb->msg_start = 0;
	pb->in_msg = false;
}

void pktbuf_free(PktBuf *pb)
{
	free(pb->buf);
	pb->buf = NULL;
	pb->cap = 0;
	pb->len = 0;
	pb->msg_start = 0;
	pb->in_msg = false;
}

void pktbuf_reset(PktBuf *pb)
{
	pb->len = 0;
	pb->msg_start = 0;
	pb->in_msg = false;
}

/* Grow the buffer to hold `need` bytes. */
static void pktbuf_grow(PktBuf *pb, size_t need)
{
	size_t cap = pb->cap ? pb->cap : PKTBUF_MIN_CAP;
	while (cap < need) {
		if (cap > SIZE_MAX / 2) {
			cap = need;
			break;
		}
		cap *= 2;
	}
	pb->buf = xrealloc(pb->buf, cap);
	pb->cap = cap;
}

/* Make room for `extra` more bytes (inline: the room is usually there). */
static inline void pktbuf_reserve(PktBuf *pb, size_t extra)
{
	size_t need = pb->len + extra;
	if (need < pb->len)
		fatal("pktbuf: size overflow");
	if (need > pb->cap)
		pktbuf_grow(pb, need);
}

static void put_be32_at(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

void pktbuf_start_msg(PktBuf *pb, char type)
{
	if (pb->in_msg)
		fatal("pktbuf: message started inside another one");
	pktbuf_reserve(pb, 5); /* once for the type and the length */
	if (type != 0)
		pb->buf[pb->len++] = (uint8_t)type;
	/* length placeholder, patched by pktbuf_finish_msg */
	pb->msg_start = pb->len;
	pb->in_msg = true;
	put_be32_at(pb->buf + pb->len, 0);
	pb->len += 4;
}

void pktbuf_finish_msg(PktBuf *pb)
{
	/* The length counts itself and the body, never the type byte. */
	size_t msg_len = pb->len - pb->msg_start;

	if (!pb->in_msg)
		fatal("pktbuf: finish without a started message");
	if (msg_len > INT32_MAX)
		fatal("pktbuf: message too long (%zu bytes)", msg_len);
	put_be32_at(pb->buf + pb->msg_start, (uint32_t)msg_len);
	pb->in_msg = false;
}

uint8_t *pktbuf_append(PktBuf *pb, size_t n)
{
	pktbuf_reserve(pb, n);
	uint8_t *p = pb->buf + pb->len;
	pb->len += n;
	return p;
}

void pktbuf_put_console_login(PktBuf *pb, const char *application_name)
{
	pktbuf_start_msg(pb, 0);
	pktbuf_put_u32(pb, 196608);
	pktbuf_put_string(pb, "user");
	pktbuf_put_string(pb, "pgbouncer");
	pktbuf_put_string(pb, "database");
	pktbuf_put_string(pb, "pgbouncer");
	pktbuf_put_string(pb, "application_name");
	pktbuf_put_string(pb, application_name);
	pktbuf_put_u8(pb, 0);
	pktbuf_finish_msg(pb);
}

void pktbuf_put_u8(PktBuf *pb, uint8_t v)
{
	pktbuf_reserve(pb, 1);
	pb->buf[pb->len++] = v;
}

void pktbuf_put_u16(PktBuf *pb, uint16_t v)
{
	pktbuf_reserve(pb, 2);
	pb->buf[pb->len++] = (uint8_t)(v >> 8);
	pb->buf[pb->len++] = (uint8_t)v;
}

void pktbuf_put_u32(PktBuf *pb, uint32_t v)
{
	pktbuf_reserve(pb, 4);
	put_be32_at(pb->buf + pb->len, v);
	pb->len += 4;
}

void pktbuf_put_bytes(PktBuf *pb, const void *data, size_t len)
{
	if (len == 0)
		return;
	pktbuf_reserve(pb, len);
	memcpy(pb->buf + pb->len, data, len);
	pb->len += len;
}

void pktbuf_put_string(PktBuf *pb, const char *s)
{
	pktbuf_put_bytes(pb, s, strlen(s) + 1);
}

void pktbuf_put_sql_literal(PktBuf *pb, const char *s)
{
	if (strchr(s, '\\'))
		pktbuf_put_u8(pb, 'E');
	pktbuf_put_u8(pb, '\'');
	for (const char *p = s; *p; p++) {
		if (*p == '\'' || *p == '\\')
			pktbuf_put_u8(pb, (uint8_t)*p);
		pktbuf_put_u8(pb, (uint8_t)*p);
	}
	pktbuf_put_u8(pb, '\'');
}

void pktbuf_put_sql_ident(PktBuf *pb, const char *s)
{
	pktbuf_put_u8(pb, '"');
	for (const char *p = s; *p; p++) {
		if (*p == '"')
			pktbuf_put_u8(pb, '"');
		pktbuf_put_u8(pb, (uint8_t)*p);
	}
	pktbuf_put_u8(pb, '"');
}

/* ErrorResponse / NoticeResponse body: S, C, M (and D when given), then the terminator. */
static void write_fields_msg(PktBuf *pb, char type, const char *severity, const char *sqlstate, const char *msg,
                             const char *detail)
{
	pktbuf_start_msg(pb, type);
	pktbuf_put_u8(pb, 'S');
	pktbuf_put_string(pb, severity);
	pktbuf_put_u8(pb, 'C');
	pktbuf_put_string(pb, sqlstate);
	pktbuf_put_u8(pb, 'M');
	pktbuf_put_string(pb, msg);
	if (detail) {
		pktbuf_put_u8(pb, 'D');
		pktbuf_put_string(pb, detail);
	}
	pktbuf_put_u8(pb, 0);
	pktbuf_finish_msg(pb);
}

void pktbuf_write_error(PktBuf *pb, const char *severity, const char *sqlstate, const char *msg)
{
	write_fields_msg(pb, 'E', severity, sqlstate, msg, NULL);
}

void pktbuf_write_notice(PktBuf *pb, const char *msg)
{
	write_fields_msg(pb, 'N', "NOTICE", "00000", msg, NULL);
}

void pktbuf_write_notice_detail(PktBuf *pb, const char *msg, const char *detail)
{
	write_fields_msg(pb, 'N', "NOTICE", "00000", msg, detail);
}

void pktbuf_write_ready(PktBuf *pb, char txn_status)
{
	pktbuf_start_msg(pb, 'Z');
	pktbuf_put_u8(pb, (uint8_t)txn_status);
	pktbuf_finish_msg(pb);
}

void pktbuf_write_param_status(PktBuf *pb, const char *name, const char *value)
{
	pktbuf_start_msg(pb, 'S');
	pktbuf_put_string(pb, name);
	pktbuf_put_string(pb, value);
	pktbuf_finish_msg(pb);
}

void pktbuf_write_auth(PktBuf *pb, uint32_t code, const void *data, size_t len)
{
	pktbuf_start_msg(pb, 'R');
	pktbuf_put_u32(pb, code);
	pktbuf_put_bytes(pb, data, len);
	pktbuf_finish_msg(pb);
}

void pktbuf_write_backend_key(PktBuf *pb, uint32_t pid, const uint8_t *key, size_t key_len)
{
	pktbuf_start_msg(pb, 'K');
	pktbuf_put_u32(pb, pid);
	pktbuf_put_bytes(pb, key, key_len);
	pktbuf_finish_msg(pb);
}

void pktbuf_write_command_complete(PktBuf *pb, const char *tag)
{
	pktbuf_start_msg(pb, 'C');
	pktbuf_put_string(pb, tag);
	pktbuf_finish_msg(pb);
}

void pktbuf_write_empty_query(PktBuf *pb)
{
	pktbuf_start_msg(pb, 'I');
	pktbuf_finish_msg(pb);
}

void pktbuf_write_row_description(PktBuf *pb, const char *types, const char *const *names)
{
	size_t ncols = strlen(types);

	if (ncols > UINT16_MAX)
		fatal("pktbuf: too many columns (%zu)", ncols);
	pktbuf_start_msg(pb, 'T');
	pktbuf_put_u16(pb, (uint16_t)ncols);
	for (size_t i = 0; i < ncols; i++) {
		uint32_t oid;
		int16_t typlen;

		switch (types[i]) {
		case 'T':
			oid = OID_TEXT;
			typlen = -1;
			break;
		case 'i':
			oid = OID_INT4;
			typlen = 4;
			break;
		case 'q':
			oid = OID_INT8;
			typlen = 8;
			break;
		case 'N':
			oid = OID_NUMERIC;
			typlen = -1;
			break;
		case 'b':
			oid = OID_BYTEA;
			typlen = -1;
			break;
		default:
			fatal("pktbuf: unknown column type letter '%c'", types[i]);
		}
		pktbuf_put_string(pb, names[i]);
		pktbuf_put_u32(pb, 0);                /* table OID */
		pktbuf_put_u16(pb, 0);                /* column number */
		pktbuf_put_u32(pb, oid);              /* type OID */
		pktbuf_put_u16(pb, (uint16_t)typlen); /* typlen */
		pktbuf_put_u32(pb, (uint32_t)-1);     /* typmod */
		pktbuf_put_u16(pb, 0);                /* format: text */
	}
	pktbuf_finish_msg(pb);
}

void pktbuf_write_data_row(PktBuf *pb, int n, const char *const *values)
{
	if (n < 0 || n > UINT16_MAX)
		fatal("pktbuf: bad DataRow column count %d", n);
	pktbuf_start_msg(pb, 'D');
	pktbuf_put_u16(pb, (uint16_t)n);
	for (int i = 0; i < n; i++) {
		if (values[i] == NULL) {
			pktbuf_put_u32(pb, (uint32_t)-1); /* SQL NULL */
		} else {
			size_t len = strlen(values[i]);
			if (len > INT32_MAX)
				fatal("pktbuf: DataRow value too long");
			pktbuf_put_u32(pb, (uint32_t)len);
			pktbuf_put_bytes(pb, values[i], len);
		}
	}
	pktbuf_finish_msg(pb);
}

void pktreader_init(PktReader *r, const void *data, size_t len)
{
	r->data = data;
	r->len = len;
	r->pos = 0;
}

size_t pktreader_remaining(const PktReader *r)
{
	return r->len - r->pos;
}

bool pktreader_get_u8(PktReader *r, uint8_t *v)
{
	if (pktreader_remaining(r) < 1)
		return false;
	*v = r->data[r->pos++];
	return true;
}

bool pktreader_get_u16(PktReader *r, uint16_t *v)
{
	const uint8_t *p;

	if (pktreader_remaining(r) < 2)
		return false;
	p = r->data + r->pos;
	*v = (uint16_t)((p[0] << 8) | p[1]);
	r->pos += 2;
	return true;
}

bool pktreader_get_u32(PktReader *r, uint32_t *v)
{
	const uint8_t *p;

	if (pktreader_remaining(r) < 4)
		return false;
	p = r->data + r->pos;
	*v = ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
	r->pos += 4;
	return true;
}

bool pktreader_get_bytes(PktReader *r, size_t n, const uint8_t **p)
{
	if (pktreader_remaining(r) < n)
		return false;
	*p = r->data + r->pos;
	r->pos += n;
	return true;
}

bool pktreader_get_string(PktReader *r, const char **s)
{
	const uint8_t *start;
	const uint8_t *nul;

	if (pktreader_remaining(r) == 0)
		return false;
	start = r->data + r->pos;
	nul = memchr(start, 0, pktreader_remaining(r));
	if (!nul)
		return false;
	*s = (const char *)start;
	r->pos += (size_t)(nul - start) + 1;
	return true;
}

void pktbuf_write_query(PktBuf *pb, const char *sql)
{
	pktbuf_start_msg(pb, 'Q');
	pktbuf_put_string(pb, sql);
	pktbuf_finish_msg(pb);
}
