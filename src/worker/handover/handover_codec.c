/*
 * The moving client's state as bytes (include/worker/handover_codec.h;
 * doc/architecture.md, "The handover codec"): one table of fields drives
 * the encoder, the decoder, the range checks and the release of decoded
 * lists. Below it, the decoder of the format before this one (version 2),
 * kept so that -R takes clients from the previous binary.
 */
#include "autoconfig.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/userlist.h"
#include "worker/handover_codec.h"

/* ---- the table ---- */

/*
 * Each macro takes the struct and member a field lives in; the
 * offset's type check (a negative array size if the member has another
 * type) keeps the table and the structs from drifting apart.
 */
#define IS_A(T, m, type) (0 * sizeof(char[_Generic(((T *)0)->m, type : 1, default : -1)]))
#define AT(T, m, type)   (offsetof(T, m) + IS_A(T, m, type))

#define F_BOOL(tag_, T, m, fl)                                                                                         \
	{                                                                                                              \
		.tag = tag_, .kind = HK_BOOL, .flags = fl, .name = #m, .offset = AT(T, m, bool)                        \
	}
#define F_U32(tag_, T, m, fl, max_)                                                                                    \
	{                                                                                                              \
		.tag = tag_, .kind = HK_U32, .flags = fl, .name = #m, .offset = AT(T, m, uint32_t), .max = max_        \
	}
#define F_I32(tag_, T, m, fl)                                                                                          \
	{                                                                                                              \
		.tag = tag_, .kind = HK_I32, .flags = fl, .name = #m, .offset = AT(T, m, int32_t)                      \
	}
#define F_U64(tag_, T, m, fl)                                                                                          \
	{                                                                                                              \
		.tag = tag_, .kind = HK_U64, .flags = fl, .name = #m, .offset = AT(T, m, uint64_t)                     \
	}
#define F_STR(tag_, T, m, fl, max_)                                                                                    \
	{                                                                                                              \
		.tag = tag_, .kind = HK_STR, .flags = fl, .name = #m, .offset = AT(T, m, const char *), .max = max_    \
	}
#define F_BYTES(tag_, T, m, len, fl, max_)                                                                             \
	{                                                                                                              \
		.tag = tag_, .kind = HK_BYTES, .flags = fl, .name = #m, .offset = AT(T, m, const uint8_t *),           \
		.aux = AT(T, len, uint32_t), .max = max_                                                               \
	}
/* raw bytes of the member, whatever its type: its size comes from the member itself */
#define F_FIXED(tag_, T, m, fl)                                                                                        \
	{                                                                                                              \
		.tag = tag_, .kind = HK_FIXED, .flags = fl, .name = #m, .offset = offsetof(T, m),                      \
		.size = sizeof(((T *)0)->m)                                                                            \
	}
#define F_LIST(tag_, T, m, count, E, table, fl, max_)                                                                  \
	{                                                                                                              \
		.tag = tag_, .kind = HK_LIST, .flags = fl, .name = #m, .offset = AT(T, m, E *),                        \
		.aux = AT(T, count, uint32_t), .size = sizeof(E), .max = max_, .sub = &table                           \
	}
#define F_RECORD(tag_, T, m, present, S, table, fl)                                                                    \
	{                                                                                                              \
		.tag = tag_, .kind = HK_RECORD, .flags = fl, .name = #m, .offset = AT(T, m, S),                        \
		.aux = AT(T, present, bool), .size = sizeof(S), .sub = &table                                          \
	}
#define TABLE(name_, fields_)                                                                                          \
	{.name = name_, .fields = fields_, .n = sizeof(fields_) / sizeof(fields_[0])};                                 \
	_Static_assert(sizeof(fields_) / sizeof(fields_[0]) <= 64, "a record has at most 64 fields")

#define REQ HF_REQUIRED
#define OPT 0

/*
 * Adding a field (doc/architecture.md, "The handover codec"): the member
 * in its struct and a row here with a tag never used before in that
 * record. An optional field that an older binary may ignore needs nothing
 * else: its decoder skips the tag, and ours gives the default when an
 * older giver leaves it out. A field that must not be ignored (a block
 * without which the client cannot go on, such as a session-mode client's
 * server connection moving with it: a record with its own tables) also
 * bumps CLIENT_STATE_VERSION, so that -R moves no clients from a binary
 * that writes it to one that would drop it.
 */

static const HandoverField var_fields[] = {
    F_STR(1, HandoverVar, name, REQ | HF_NONEMPTY, 0),
    F_STR(2, HandoverVar, value, REQ, 0),
};
static const HandoverTable var_table = TABLE("var", var_fields);

static const HandoverField stmt_fields[] = {
    F_STR(1, HandoverStmt, name, REQ, 0),
    F_BYTES(2, HandoverStmt, body, body_len, REQ, 0),
    F_U64(3, HandoverStmt, desc, OPT),
};
static const HandoverTable stmt_table = TABLE("stmt", stmt_fields);

static const HandoverField secret_fields[] = {
    F_STR(1, HandoverSecret, text, REQ, 0),
    F_U32(2, HandoverSecret, kind, REQ, SECRET_SCRAM),
    F_BOOL(3, HandoverSecret, from_auth_query, OPT),
    F_BOOL(4, HandoverSecret, from_pam, OPT),
    F_BOOL(5, HandoverSecret, has_scram_keys, OPT),
    F_FIXED(6, HandoverSecret, scram_client_key, OPT),
    F_FIXED(7, HandoverSecret, scram_server_key, OPT),
    F_U64(8, HandoverSecret, time, OPT),
};
static const HandoverTable secret_table = TABLE("secret", secret_fields);

static const HandoverField units_fields[] = {
    F_I32(1, HandoverUnits, entry[0], REQ),
    F_I32(2, HandoverUnits, entry[1], REQ),
};
static const HandoverTable units_table = TABLE("units", units_fields);

static const HandoverField server_units_fields[] = {
    F_I32(1, HandoverServerUnits, entry[0], REQ),
    F_I32(2, HandoverServerUnits, entry[1], REQ),
    F_I32(3, HandoverServerUnits, entry[2], REQ),
};
static const HandoverTable server_units_table = TABLE("server units", server_units_fields);

static const HandoverField server_fields[] = {
    F_RECORD(1, HandoverServer, units, units_moved, HandoverServerUnits, server_units_table, OPT),
    F_U64(2, HandoverServer, id, REQ),
    F_STR(3, HandoverServer, pool_user, REQ | HF_NONEMPTY, USERLIST_MAX_USER),
    F_FIXED(4, HandoverServer, remote, REQ),
    F_U64(5, HandoverServer, connect_time, OPT),
    F_U64(6, HandoverServer, request_time, OPT),
    F_U32(7, HandoverServer, backend_pid, OPT, 0),
    F_BYTES(8, HandoverServer, key, key_len, OPT, HANDOVER_MAX_SERVER_KEY),
    F_LIST(9, HandoverServer, vars, nvars, HandoverVar, var_table, OPT, 0),
    F_U64(10, HandoverServer, bytes_in, OPT),
    F_U64(11, HandoverServer, bytes_out, OPT),
    F_U32(12, HandoverServer, session_tail, OPT, 255),
    F_U64(13, HandoverServer, db_definition, OPT),
    F_BOOL(14, HandoverServer, close_needed, OPT),
};
static const HandoverTable server_table = TABLE("server", server_fields);

static const HandoverField client_fields[] = {
    /* first: handover_peek_units() finds it even in a message whose rest does not decode */
    F_RECORD(1, HandoverClient, units, units_moved, HandoverUnits, units_table, OPT),
    F_U64(2, HandoverClient, id, REQ),
    F_STR(3, HandoverClient, database, REQ, CF_MAX_DBNAME - 1),
    F_STR(4, HandoverClient, user, REQ | HF_NONEMPTY, USERLIST_MAX_USER),
    F_BOOL(5, HandoverClient, is_unix, OPT),
    F_FIXED(6, HandoverClient, remote, REQ),
    F_FIXED(7, HandoverClient, local, OPT),
    F_U32(8, HandoverClient, peer_pid, OPT, 0),
    F_U32(9, HandoverClient, peer_uid, OPT, 0),
    F_U64(10, HandoverClient, connect_time, OPT),
    F_U64(11, HandoverClient, request_time, OPT),
    F_U32(12, HandoverClient, auth_method, OPT, AUTH_REJECT),
    F_FIXED(13, HandoverClient, cancel_key, REQ),
    F_STR(14, HandoverClient, app_name, OPT, 0),
    F_U64(15, HandoverClient, bytes_in, OPT),
    F_U64(16, HandoverClient, bytes_out, OPT),
    F_LIST(17, HandoverClient, vars, nvars, HandoverVar, var_table, OPT, 0),
    F_LIST(18, HandoverClient, stmts, nstmts, HandoverStmt, stmt_table, OPT, 0),
    F_RECORD(19, HandoverClient, secret, has_secret, HandoverSecret, secret_table, OPT),
    F_BYTES(20, HandoverClient, request, request_len, OPT, HANDOVER_MAX_REQUEST),
    F_U64(21, HandoverClient, wait_start, OPT),
    F_BOOL(22, HandoverClient, wait_notice_sent, OPT),
    /* format 4: not to be ignored (the second socket is the client's session) */
    F_RECORD(23, HandoverClient, server, has_server, HandoverServer, server_table, OPT),
};
const HandoverTable handover_client_fields = TABLE("client", client_fields);

#define TLV_HEADER 6 /* tag (u16) and length (u32) */
#define V2         2 /* the format before this codec (decode_v2()) */
#define TLV_FIRST  3 /* the first format of this codec: it and every later one are read by the table */

_Static_assert(CLIENT_STATE_VERSION >= TLV_FIRST && CLIENT_STATE_VERSION_OLDEST >= V2,
               "handover_decode() reads every format from CLIENT_STATE_VERSION_OLDEST on");

/* ---- encoding ---- */

static void put_u64(PktBuf *pb, uint64_t v)
{
	pktbuf_put_u32(pb, (uint32_t)(v >> 32));
	pktbuf_put_u32(pb, (uint32_t)v);
}

static void patch_u32(PktBuf *pb, size_t at, uint32_t v)
{
	pb->buf[at] = (uint8_t)(v >> 24);
	pb->buf[at + 1] = (uint8_t)(v >> 16);
	pb->buf[at + 2] = (uint8_t)(v >> 8);
	pb->buf[at + 3] = (uint8_t)v;
}

static bool all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

/* Whether a field has its default (and an encoder leaves an optional one out). */
static bool at_default(const HandoverField *f, const char *base)
{
	const void *p = base + f->offset;
	switch (f->kind) {
	case HK_BOOL:
		return !*(const bool *)p;
	case HK_U32:
		return *(const uint32_t *)p == 0;
	case HK_I32:
		return *(const int32_t *)p == 0;
	case HK_U64:
		return *(const uint64_t *)p == 0;
	case HK_STR:
		return *(const char *const *)p == NULL;
	case HK_BYTES:
		return *(const uint32_t *)(base + f->aux) == 0;
	case HK_FIXED:
		return all_zero(p, f->size);
	case HK_LIST:
		return *(const uint32_t *)(base + f->aux) == 0;
	case HK_RECORD:
		return !*(const bool *)(base + f->aux);
	}
	return true;
}

static void encode_record(const HandoverTable *t, const char *base, PktBuf *pb);

static void encode_value(const HandoverField *f, const char *base, PktBuf *pb)
{
	const void *p = base + f->offset;
	switch (f->kind) {
	case HK_BOOL:
		pktbuf_put_u8(pb, *(const bool *)p ? 1 : 0);
		break;
	case HK_U32:
		pktbuf_put_u32(pb, *(const uint32_t *)p);
		break;
	case HK_I32:
		pktbuf_put_u32(pb, (uint32_t) * (const int32_t *)p);
		break;
	case HK_U64:
		put_u64(pb, *(const uint64_t *)p);
		break;
	case HK_STR: {
		const char *s = *(const char *const *)p;
		pktbuf_put_string(pb, s ? s : ""); /* a required string left NULL goes as "" */
		break;
	}
	case HK_BYTES: {
		uint32_t len = *(const uint32_t *)(base + f->aux);
		if (len)
			pktbuf_put_bytes(pb, *(const uint8_t *const *)p, len);
		break;
	}
	case HK_FIXED:
		pktbuf_put_bytes(pb, p, f->size);
		break;
	case HK_LIST: {
		const char *elems = *(const char *const *)p;
		uint32_t n = *(const uint32_t *)(base + f->aux);
		pktbuf_put_u32(pb, n);
		for (uint32_t i = 0; i < n; i++) {
			size_t at = pb->len;
			pktbuf_put_u32(pb, 0);
			encode_record(f->sub, elems + (size_t)i * f->size, pb);
			patch_u32(pb, at, (uint32_t)(pb->len - at - 4));
		}
		break;
	}
	case HK_RECORD:
		encode_record(f->sub, p, pb);
		break;
	}
}

/* Every required field and every optional one that differs from its default, in table order. */
static void encode_record(const HandoverTable *t, const char *base, PktBuf *pb)
{
	for (size_t i = 0; i < t->n; i++) {
		const HandoverField *f = &t->fields[i];
		if (!(f->flags & HF_REQUIRED) && at_default(f, base))
			continue;
		pktbuf_put_u16(pb, f->tag);
		size_t at = pb->len;
		pktbuf_put_u32(pb, 0);
		encode_value(f, base, pb);
		patch_u32(pb, at, (uint32_t)(pb->len - at - 4));
	}
}

void handover_encode(const HandoverClient *hc, PktBuf *out)
{
	pktbuf_put_u32(out, HANDOVER_MAGIC);
	pktbuf_put_u32(out, CLIENT_STATE_VERSION);
	encode_record(&handover_client_fields, (const char *)hc, out);
}

/* ---- decoding ---- */

static uint32_t get_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static const HandoverField *field_of(const HandoverTable *t, uint16_t tag, size_t *idx)
{
	for (size_t i = 0; i < t->n; i++)
		if (t->fields[i].tag == tag) {
			*idx = i;
			return &t->fields[i];
		}
	return NULL;
}

static bool fail(char *err, size_t errlen, const char *what, const HandoverTable *t, const HandoverField *f)
{
	if (errlen && !*err)
		snprintf(err, errlen, "%s %s%s%s", what, t->name, f ? "." : "", f ? f->name : "");
	return false;
}

static void free_record(const HandoverTable *t, char *base);

static bool decode_record(const HandoverTable *t, const uint8_t *p, size_t len, char *base, char *err, size_t errlen);

/* One list: u32 count, then each element as u32 length and a record. */
static bool decode_list(const HandoverField *f, const uint8_t *p, size_t len, char *base, char *err, size_t errlen)
{
	if (len < 4)
		return false;
	uint32_t n = get_be32(p);
	p += 4;
	len -= 4;
	if (n > len / 4) /* each element takes 4 bytes at least: no allocation larger than the message allows */
		return false;
	if (n == 0)
		return len == 0;
	char *elems = calloc(n, f->size);
	if (!elems)
		return false;
	*(char **)(base + f->offset) = elems;
	for (uint32_t i = 0; i < n; i++) {
		/* counted before it is filled, so that a failure frees what it holds */
		*(uint32_t *)(base + f->aux) = i + 1;
		if (len < 4)
			return false;
		uint32_t elen = get_be32(p);
		if (elen > len - 4)
			return false;
		if (!decode_record(f->sub, p + 4, elen, elems + (size_t)i * f->size, err, errlen))
			return false;
		p += 4 + elen;
		len -= 4 + elen;
	}
	return len == 0;
}

static bool decode_value(const HandoverField *f, const uint8_t *p, size_t len, char *base, char *err, size_t errlen)
{
	void *v = base + f->offset;
	switch (f->kind) {
	case HK_BOOL:
		if (len != 1 || p[0] > 1)
			return false;
		*(bool *)v = p[0] != 0;
		return true;
	case HK_U32:
		if (len != 4)
			return false;
		*(uint32_t *)v = get_be32(p);
		return true;
	case HK_I32:
		if (len != 4)
			return false;
		*(int32_t *)v = (int32_t)get_be32(p);
		return true;
	case HK_U64:
		if (len != 8)
			return false;
		*(uint64_t *)v = (uint64_t)get_be32(p) << 32 | get_be32(p + 4);
		return true;
	case HK_STR:
		/* its one NUL at the end: the string can be used where it lies */
		if (len == 0 || p[len - 1] != 0 || memchr(p, 0, len) != p + len - 1)
			return false;
		*(const char **)v = (const char *)p;
		return true;
	case HK_BYTES:
		*(const uint8_t **)v = len ? p : NULL;
		*(uint32_t *)(base + f->aux) = (uint32_t)len;
		return true;
	case HK_FIXED:
		if (len != f->size)
			return false;
		memcpy(v, p, len);
		return true;
	case HK_LIST:
		return decode_list(f, p, len, base, err, errlen);
	case HK_RECORD:
		if (!decode_record(f->sub, p, len, v, err, errlen))
			return false;
		*(bool *)(base + f->aux) = true;
		return true;
	}
	return false;
}

/*
 * The fields of one record: unknown tags are skipped (a newer encoder's
 * optional fields), a known one twice or a required one missing is an
 * error. What a failure leaves allocated is freed by the caller.
 */
static bool decode_record(const HandoverTable *t, const uint8_t *p, size_t len, char *base, char *err, size_t errlen)
{
	uint64_t seen = 0;
	while (len > 0) {
		if (len < TLV_HEADER)
			return fail(err, errlen, "truncated", t, NULL);
		uint16_t tag = (uint16_t)(p[0] << 8 | p[1]);
		uint32_t vlen = get_be32(p + 2);
		p += TLV_HEADER;
		len -= TLV_HEADER;
		if (vlen > len)
			return fail(err, errlen, "truncated", t, NULL);
		size_t idx;
		const HandoverField *f = field_of(t, tag, &idx);
		if (f) {
			if (seen & (UINT64_C(1) << idx))
				return fail(err, errlen, "repeated", t, f);
			seen |= UINT64_C(1) << idx;
			if (!decode_value(f, p, vlen, base, err, errlen))
				return fail(err, errlen, "malformed", t, f);
		}
		p += vlen;
		len -= vlen;
	}
	for (size_t i = 0; i < t->n; i++)
		if ((t->fields[i].flags & HF_REQUIRED) && !(seen & (UINT64_C(1) << i)))
			return fail(err, errlen, "missing", t, &t->fields[i]);
	return true;
}

/* The bounds of the table, for a record decoded by either format's decoder. */
static bool check_record(const HandoverTable *t, const char *base, char *err, size_t errlen)
{
	for (size_t i = 0; i < t->n; i++) {
		const HandoverField *f = &t->fields[i];
		const void *v = base + f->offset;
		switch (f->kind) {
		case HK_U32:
			if (f->max && *(const uint32_t *)v > f->max)
				return fail(err, errlen, "out of range:", t, f);
			break;
		case HK_STR: {
			const char *s = *(const char *const *)v;
			if (s && f->max && strlen(s) > f->max)
				return fail(err, errlen, "too long:", t, f);
			if ((f->flags & HF_NONEMPTY) && (!s || !*s))
				return fail(err, errlen, "empty", t, f);
			break;
		}
		case HK_BYTES:
		case HK_LIST:
			if (f->max && *(const uint32_t *)(base + f->aux) > f->max)
				return fail(err, errlen, "too long:", t, f);
			if (f->kind == HK_LIST) {
				const char *elems = *(const char *const *)v;
				uint32_t n = *(const uint32_t *)(base + f->aux);
				for (uint32_t k = 0; k < n; k++)
					if (!check_record(f->sub, elems + (size_t)k * f->size, err, errlen))
						return false;
			}
			break;
		case HK_RECORD:
			if (*(const bool *)(base + f->aux) && !check_record(f->sub, v, err, errlen))
				return false;
			break;
		default:
			break;
		}
	}
	return true;
}

static void free_record(const HandoverTable *t, char *base)
{
	for (size_t i = 0; i < t->n; i++) {
		const HandoverField *f = &t->fields[i];
		if (f->kind == HK_LIST) {
			char **elems = (char **)(base + f->offset);
			uint32_t *n = (uint32_t *)(base + f->aux);
			for (uint32_t k = 0; *elems && k < *n; k++)
				free_record(f->sub, *elems + (size_t)k * f->size);
			free(*elems);
			*elems = NULL;
			*n = 0;
		} else if (f->kind == HK_RECORD) {
			free_record(f->sub, base + f->offset);
		}
	}
}

void handover_free(HandoverClient *hc)
{
	free_record(&handover_client_fields, (char *)hc);
}

static bool decode_v2(const uint8_t *data, size_t len, HandoverClient *hc, char *err, size_t errlen);
static bool peek_units_v2(const uint8_t *data, size_t len, HandoverUnits *units);

bool handover_decode(const uint8_t *data, size_t len, HandoverClient *hc, char *err, size_t errlen)
{
	memset(hc, 0, sizeof(*hc));
	if (errlen)
		*err = '\0';
	if (len < 8 || get_be32(data) != HANDOVER_MAGIC) {
		snprintf(err, errlen, "unknown state format");
		return false;
	}
	uint32_t version = get_be32(data + 4);
	if (!client_state_readable(version)) {
		snprintf(err, errlen, "unknown state format %u", version);
		return false;
	}
	/* a later format only adds fields: an older message lacks them and they take their defaults */
	bool ok = version >= TLV_FIRST
	              ? decode_record(&handover_client_fields, data + 8, len - 8, (char *)hc, err, errlen)
	              : decode_v2(data, len, hc, err, errlen);
	ok = ok && check_record(&handover_client_fields, (const char *)hc, err, errlen);
	if (!ok)
		handover_free(hc);
	return ok;
}

/*
 * The record of table `want` in a message of a TLV format, found by its
 * framing alone (the rest may not decode): at the top level, or inside the
 * record of table `via` (NULL: top level only). Decoded into out.
 */
static bool peek_record(const uint8_t *data, size_t len, const HandoverTable *via, const HandoverTable *want, char *out,
                        size_t outsize)
{
	const HandoverTable *t = &handover_client_fields;
	const uint8_t *p = data + 8;
	len -= 8;
	while (len >= TLV_HEADER) {
		uint16_t tag = (uint16_t)(p[0] << 8 | p[1]);
		uint32_t vlen = get_be32(p + 2);
		if (vlen > len - TLV_HEADER)
			return false;
		size_t idx;
		const HandoverField *f = field_of(t, tag, &idx);
		if (f && f->sub == want) {
			memset(out, 0, outsize);
			return decode_record(want, p + TLV_HEADER, vlen, out, NULL, 0);
		}
		if (f && via && f->sub == via) {
			t = via; /* into it */
			via = NULL;
			p += TLV_HEADER;
			len = vlen;
			continue;
		}
		p += TLV_HEADER + vlen;
		len -= TLV_HEADER + vlen;
	}
	return false;
}

bool handover_peek_units(const uint8_t *data, size_t len, HandoverUnits *units)
{
	if (len < 8 || get_be32(data) != HANDOVER_MAGIC || !client_state_readable(get_be32(data + 4)))
		return false;
	if (get_be32(data + 4) < TLV_FIRST)
		return peek_units_v2(data, len, units);
	/* the client's units come first in the message */
	return peek_record(data, len, NULL, &units_table, (char *)units, sizeof(*units));
}

bool handover_peek_server_units(const uint8_t *data, size_t len, HandoverServerUnits *units)
{
	if (len < 8 || get_be32(data) != HANDOVER_MAGIC || get_be32(data + 4) < TLV_FIRST ||
	    !client_state_readable(get_be32(data + 4)))
		return false;
	/* the server's units come first in its record */
	return peek_record(data, len, &server_table, &server_units_table, (char *)units, sizeof(*units));
}

/* ---- version 2: the format before this codec, read only ----
 *
 * Written by binaries before the codec (src/worker/handover/migrate.c's
 * migrate_pack() of that time), for -R from such a binary: magic,
 * version, then every field in a fixed order, the last two optional
 * (absent from their givers), and a fixed tail read from the end (flags,
 * the two unit entries, "PGBT"). Remove it once CLIENT_STATE_VERSION_OLDEST
 * passes 2.
 */

#define V2_TAIL_MAGIC 0x50474254u /* "PGBT" */
#define V2_TAIL_LEN   13          /* flags, two entries, magic */
#define V2_UNITS      0x01        /* the tail's flags: units moved */
#define V2_NOTICE     0x02        /* the waiting client got its NOTICE */

/* The tail, if there is one: its flags and entries; returns the length before it. */
static size_t read_tail_v2(const uint8_t *data, size_t len, uint8_t *flags, HandoverUnits *units)
{
	*flags = 0;
	/* only behind the header: a tail that overlaps it is none */
	if (len < 8 + V2_TAIL_LEN || get_be32(data + len - 4) != V2_TAIL_MAGIC)
		return len;
	const uint8_t *t = data + len - V2_TAIL_LEN;
	*flags = t[0];
	units->entry[0] = (int32_t)get_be32(t + 1);
	units->entry[1] = (int32_t)get_be32(t + 5);
	return len - V2_TAIL_LEN;
}

static bool peek_units_v2(const uint8_t *data, size_t len, HandoverUnits *units)
{
	uint8_t flags;
	(void)read_tail_v2(data, len, &flags, units);
	return (flags & V2_UNITS) != 0;
}

static bool get_u64(PktReader *r, uint64_t *v)
{
	uint32_t hi, lo;
	if (!pktreader_get_u32(r, &hi) || !pktreader_get_u32(r, &lo))
		return false;
	*v = (uint64_t)hi << 32 | lo;
	return true;
}

static bool get_blob(PktReader *r, const uint8_t **p, uint32_t *len)
{
	return pktreader_get_u32(r, len) && pktreader_get_bytes(r, *len, p);
}

static bool get_fixed(PktReader *r, void *out, size_t size)
{
	const uint8_t *p;
	uint32_t len;
	if (!get_blob(r, &p, &len) || len != size)
		return false;
	memcpy(out, p, size);
	return true;
}

static bool get_bool(PktReader *r, bool *v)
{
	uint8_t b;
	if (!pktreader_get_u8(r, &b))
		return false;
	*v = b != 0;
	return true;
}

static bool decode_v2_lists(PktReader *r, HandoverClient *hc)
{
	uint32_t n;
	if (!pktreader_get_u32(r, &n) || n > pktreader_remaining(r) / 2)
		return false;
	if (n && !(hc->vars = calloc(n, sizeof(*hc->vars))))
		return false;
	for (hc->nvars = 0; hc->nvars < n; hc->nvars++) {
		HandoverVar *v = &hc->vars[hc->nvars];
		if (!pktreader_get_string(r, &v->name) || !pktreader_get_string(r, &v->value))
			return false;
	}
	if (!pktreader_get_u32(r, &n) || n > pktreader_remaining(r) / 13)
		return false;
	if (n && !(hc->stmts = calloc(n, sizeof(*hc->stmts))))
		return false;
	for (hc->nstmts = 0; hc->nstmts < n; hc->nstmts++) {
		HandoverStmt *s = &hc->stmts[hc->nstmts];
		if (!pktreader_get_string(r, &s->name) || !get_blob(r, &s->body, &s->body_len) || !get_u64(r, &s->desc))
			return false;
	}
	return true;
}

static bool decode_v2(const uint8_t *data, size_t len, HandoverClient *hc, char *err, size_t errlen)
{
	uint8_t flags;
	len = read_tail_v2(data, len, &flags, &hc->units);
	hc->units_moved = (flags & V2_UNITS) != 0;
	if (!hc->units_moved)
		memset(&hc->units, 0, sizeof(hc->units));
	PktReader r;
	pktreader_init(&r, data + 8, len - 8);
	const char *app;
	bool has_secret;
	HandoverSecret *s = &hc->secret;
	if (!get_u64(&r, &hc->id) || !pktreader_get_string(&r, &hc->database) || !pktreader_get_string(&r, &hc->user) ||
	    !get_bool(&r, &hc->is_unix) || !get_fixed(&r, &hc->remote, sizeof(hc->remote)) ||
	    !get_fixed(&r, &hc->local, sizeof(hc->local)) || !pktreader_get_u32(&r, &hc->peer_pid) ||
	    !pktreader_get_u32(&r, &hc->peer_uid) || !get_u64(&r, &hc->connect_time) ||
	    !get_u64(&r, &hc->request_time) || !pktreader_get_u32(&r, &hc->auth_method) ||
	    !get_fixed(&r, hc->cancel_key, sizeof(hc->cancel_key)) || !pktreader_get_string(&r, &app) ||
	    !get_u64(&r, &hc->bytes_in) || !get_u64(&r, &hc->bytes_out) || !decode_v2_lists(&r, hc) ||
	    !get_bool(&r, &has_secret) || !pktreader_get_u32(&r, &s->kind) || !pktreader_get_string(&r, &s->text) ||
	    !get_bool(&r, &s->from_auth_query) || !get_bool(&r, &s->from_pam) || !get_bool(&r, &s->has_scram_keys)) {
		snprintf(err, errlen, "malformed state (version 2)");
		return false;
	}
	const uint8_t *ck, *sk;
	if (!pktreader_get_bytes(&r, SCRAM_KEY_LEN, &ck) || !pktreader_get_bytes(&r, SCRAM_KEY_LEN, &sk)) {
		snprintf(err, errlen, "malformed state (version 2)");
		return false;
	}
	memcpy(s->scram_client_key, ck, SCRAM_KEY_LEN);
	memcpy(s->scram_server_key, sk, SCRAM_KEY_LEN);
	hc->app_name = *app ? app : NULL;
	/* a waiting client's request, and the secret's time: absent from older givers of this version */
	if (pktreader_remaining(&r) > 0 &&
	    (!get_blob(&r, &hc->request, &hc->request_len) || !get_u64(&r, &hc->wait_start))) {
		snprintf(err, errlen, "malformed waiting request (version 2)");
		return false;
	}
	if (pktreader_remaining(&r) > 0 && !get_u64(&r, &s->time)) {
		snprintf(err, errlen, "malformed secret time (version 2)");
		return false;
	}
	if (!hc->request_len) {
		hc->request = NULL;
		hc->wait_start = 0;
	}
	hc->wait_notice_sent = hc->request_len && (flags & V2_NOTICE);
	hc->has_secret = has_secret;
	if (!has_secret)
		memset(s, 0, sizeof(*s)); /* the rest meant nothing without it */
	return true;
}
