/*
 * Building PostgreSQL protocol messages (PktBuf) and reading fields out of
 * received ones (PktReader). Pure code: no sockets, no event loop.
 */
#ifndef PGB_COMMON_PKTBUF_H
#define PGB_COMMON_PKTBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A growing buffer of one or more complete messages. */
typedef struct PktBuf {
	uint8_t *buf;     /* message bytes */
	size_t len;       /* bytes used */
	size_t cap;       /* bytes allocated */
	size_t msg_start; /* offset of the length field of the message being built */
	bool in_msg;      /* between start_msg and finish_msg */
} PktBuf;

void pktbuf_init(PktBuf *pb, size_t initial_cap);
void pktbuf_free(PktBuf *pb);
void pktbuf_reset(PktBuf *pb); /* len = 0, keeps the memory */

/* Start a message with type byte `type`; type 0 = no type byte (startup-style). */
void pktbuf_start_msg(PktBuf *pb, char type);
/* Patch the length field of the message started last. */
void pktbuf_finish_msg(PktBuf *pb);

/*
 * A whole StartupMessage (protocol 3.0) for the same-uid "pgbouncer" login
 * to a worker's admin console over its private socket (the console fan-out
 * and /metrics, doc/workers.md), with this application_name.
 */
void pktbuf_put_console_login(PktBuf *pb, const char *application_name);

/* n more bytes at the end, for the caller to fill (a message written in one piece). */
uint8_t *pktbuf_append(PktBuf *pb, size_t n);
void pktbuf_put_u8(PktBuf *pb, uint8_t v);
void pktbuf_put_u16(PktBuf *pb, uint16_t v); /* network byte order */
void pktbuf_put_u32(PktBuf *pb, uint32_t v); /* network byte order */
void pktbuf_put_bytes(PktBuf *pb, const void *data, size_t len);
void pktbuf_put_string(PktBuf *pb, const char *s); /* with its NUL */
/*
 * s as an SQL string literal (no NUL): '...' with quotes doubled, or
 * E'...' with backslashes doubled too when s has one, so that it reads
 * the same whatever standard_conforming_strings says. The one way the
 * pooler quotes a value it writes into SQL.
 */
void pktbuf_put_sql_literal(PktBuf *pb, const char *s);

/* s as an SQL identifier: "..." with double quotes doubled. The one way the pooler quotes a name. */
void pktbuf_put_sql_ident(PktBuf *pb, const char *s);

/* Whole messages. */
/* ErrorResponse ('E') or NoticeResponse ('N') with exactly the fields S, C, M. */
void pktbuf_write_error(PktBuf *pb, const char *severity, const char *sqlstate, const char *msg);
void pktbuf_write_notice(PktBuf *pb, const char *msg); /* S=NOTICE C=00000 */
/* NoticeResponse with S, C, M and a D (detail) field, used by SHOW HELP. */
void pktbuf_write_notice_detail(PktBuf *pb, const char *msg, const char *detail);
void pktbuf_write_ready(PktBuf *pb, char txn_status);                            /* 'Z' */
void pktbuf_write_param_status(PktBuf *pb, const char *name, const char *value); /* 'S' */
/* 'R' with code (0 ok, 3 cleartext, 5 md5 + 4 salt bytes, 10 SASL, 11 continue, 12 final) and data. */
void pktbuf_write_auth(PktBuf *pb, uint32_t code, const void *data, size_t len);
/* 'K' BackendKeyData: 4-byte pid and a key of key_len bytes (4 in protocol 3.0; up to 256 in 3.2). */
void pktbuf_write_backend_key(PktBuf *pb, uint32_t pid, const uint8_t *key, size_t key_len);
void pktbuf_write_command_complete(PktBuf *pb, const char *tag); /* 'C' */
void pktbuf_write_empty_query(PktBuf *pb);                       /* 'I' */

/*
 * RowDescription ('T') for text-format columns. `types` has one letter per
 * column: 'T' text (25), 'i' int4 (23), 'q' int8 (20), 'N' numeric (1700),
 * 'b' bytea (17); names[] has the column names.
 */
void pktbuf_write_row_description(PktBuf *pb, const char *types, const char *const *names);
/* DataRow ('D'): n values, NULL pointer = SQL NULL; values are text. */
void pktbuf_write_data_row(PktBuf *pb, int n, const char *const *values);

/* Sequential reader over a received message body. Every getter fails (returns false) past the end. */
typedef struct PktReader {
	const uint8_t *data;
	size_t len;
	size_t pos;
} PktReader;

void pktreader_init(PktReader *r, const void *data, size_t len);
bool pktreader_get_u8(PktReader *r, uint8_t *v);
bool pktreader_get_u16(PktReader *r, uint16_t *v);
bool pktreader_get_u32(PktReader *r, uint32_t *v);
bool pktreader_get_bytes(PktReader *r, size_t n, const uint8_t **p);
/* A NUL-terminated string inside the body; fails when no NUL before the end. */
bool pktreader_get_string(PktReader *r, const char **s);
size_t pktreader_remaining(const PktReader *r);

/* A whole simple Query message (Q) with `sql`: the pooler's own consoles (metrics, the admin fan-out). */
void pktbuf_write_query(PktBuf *pb, const char *sql);

/*
 * Write that message to a bufferevent (a console connection of the master's
 * metrics or of a worker's fan-out). A macro so that this header needs no
 * libevent: its users include event2/bufferevent.h themselves.
 */
#define pktbuf_send_query(bev, sql)                                                                                    \
	do {                                                                                                           \
		PktBuf query_pb_;                                                                                      \
		pktbuf_init(&query_pb_, 64);                                                                           \
		pktbuf_write_query(&query_pb_, (sql));                                                                 \
		bufferevent_write((bev), query_pb_.buf, query_pb_.len);                                                \
		pktbuf_free(&query_pb_);                                                                               \
	} while (0)

#endif
