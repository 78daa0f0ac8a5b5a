/*
 * PostgreSQL wire-protocol facts and parsers: message headers, the
 * StartupMessage and its special codes, as doc/architecture.md ("Client lifecycle") describes.
 */
#ifndef PGB_COMMON_PROTO_H
#define PGB_COMMON_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Special codes in the first (untyped) message. */
#define PROTO_CANCEL_CODE     80877102u   /* 1234.5678 */
#define PROTO_SSL_CODE        80877103u   /* 1234.5679 */
#define PROTO_GSSENC_CODE     80877104u   /* 1234.5680 */
#define PROTO_V3_0            0x00030000u /* protocol 3.0 */
#define PROTO_V3_2            0x00030002u /* protocol 3.2 (longer cancel keys) */
#define PROTO_MAX_STARTUP_LEN 65535u      /* first two bytes of the length must be 0 */

typedef enum HdrResult {
	HDR_OK,         /* header complete and sane */
	HDR_INCOMPLETE, /* need more bytes */
	HDR_BAD,        /* length < 4 (or < 8 for startup), or above the limit */
} HdrResult;

typedef struct PktHdr {
	char type;         /* message type; 0 for an untyped startup-phase message */
	uint32_t code;     /* startup phase: protocol version or special code */
	uint32_t len;      /* total bytes of the message incl. type byte and length */
	uint32_t body_off; /* offset of the body (after the header) */
} PktHdr;

/*
 * Parse a message header at `buf` (`avail` bytes present).
 * startup = true: untyped "int32 len, int32 code" (code included in the
 * header; body after it); else "byte type, int32 len".
 * max_len bounds the total size (max_packet_size, or PROTO_MAX_STARTUP_LEN).
 */
static inline uint32_t proto_get_be32(const uint8_t *p)
{
	return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* Inline: it runs for every message in either direction. */
static inline HdrResult proto_parse_header(const uint8_t *buf, size_t avail, bool startup, uint32_t max_len,
                                           PktHdr *hdr)
{
	if (startup) {
		if (avail < 8)
			return HDR_INCOMPLETE;
		/* The length counts itself and the code. */
		uint32_t len = proto_get_be32(buf);
		if (len < 8 || len > max_len)
			return HDR_BAD;
		hdr->type = 0;
		hdr->code = proto_get_be32(buf + 4);
		hdr->len = len;
		hdr->body_off = 8;
		return HDR_OK;
	}
	if (avail < 5)
		return HDR_INCOMPLETE;
	/* The length counts itself but not the type byte; 64-bit so 0xffffffff + 1 cannot wrap. */
	uint32_t len = proto_get_be32(buf + 1);
	uint64_t total = (uint64_t)len + 1;
	if (len < 4 || total > max_len)
		return HDR_BAD;
	hdr->type = (char)buf[0];
	hdr->code = 0;
	hdr->len = (uint32_t)total;
	hdr->body_off = 5;
	return HDR_OK;
}

/* One key/value pair from a StartupMessage. */
typedef struct StartupParam {
	const char *key;
	const char *value;
} StartupParam;

/*
 * Split a StartupMessage body (after len+version) into pairs, pointing into
 * the body. Returns the number of pairs, or -1 when the layout is broken
 * (the spec's "invalid startup packet layout: expected terminator as last
 * byte"). At most max_params pairs are stored; more is an error (-1).
 * With params NULL the pairs are only counted (and the layout checked).
 */
int proto_parse_startup(const uint8_t *body, size_t len, StartupParam *params, int max_params);

/* What the `replication` startup parameter asks for (doc/pgbouncer.1.md, "REPLICATION CONNECTIONS"). */
typedef enum ReplicationMode {
	REPLICATION_NONE,     /* a normal connection (absent, false, or not a boolean) */
	REPLICATION_PHYSICAL, /* a PostgreSQL boolean true: physical replication */
	REPLICATION_LOGICAL,  /* "database": logical replication */
} ReplicationMode;

/* Read a `replication` value the way PostgreSQL does; NULL (absent) is REPLICATION_NONE. */
ReplicationMode proto_parse_replication(const char *value);

/* The `replication=` value of a mode in the "login attempt" log line and a server's startup: no, yes, database. */
const char *proto_replication_value(ReplicationMode mode);

/* The SHOW CLIENTS/SERVERS `replication` column: none, physical, logical. */
const char *proto_replication_show_name(ReplicationMode mode);

/* Hex dump of the first bytes for "bad packet header: '<hex>'" (e.g. "0000000c04d2162f"). */
void proto_hex_prefix(const uint8_t *buf, size_t len, char *out, size_t outlen);

/* Human-readable name of a frontend/backend message type, for logs. */
const char *proto_msg_name(char type, bool from_server);

/*
 * The fields S (severity), C (SQLSTATE) and M (message) of an
 * ErrorResponse or NoticeResponse body. False when the body is not a
 * well-formed list of NUL-terminated fields ended by a zero byte, or lacks
 * one of the three that PostgreSQL always sends; the outputs then hold
 * defaults (ERROR, 08P01, ""). They point into the body.
 */
bool proto_parse_error(const uint8_t *body, uint32_t len, const char **sev, const char **code, const char **msg);

/* A ParameterStatus body: exactly two NUL-terminated strings. False when it is anything else. */
bool proto_parse_param_status(const uint8_t *body, uint32_t len, const char **name, const char **value);

/*
 * An AuthenticationSASL body after its code: a list of NUL-terminated
 * mechanism names ended by an empty one. Whether `mech` is among them.
 */
bool proto_sasl_has_mech(const uint8_t *list, uint32_t len, const char *mech);

/*
 * A SASLInitialResponse body: mechanism name, int32 length (-1: no data),
 * data. False when the name or the length is missing; *data is NULL when
 * the length is -1 or runs past the body. Outputs point into the body.
 */
bool proto_parse_sasl_initial(const uint8_t *body, uint32_t len, const char **mech, const uint8_t **data,
                              uint32_t *dlen);

#endif
