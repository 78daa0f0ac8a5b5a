/*
 * Unit tests for handover_codec.c, the moving client's state as bytes
 * (doc/architecture.md, "The handover codec"): every field round trips,
 * optional fields left out decode as their defaults, unknown tags are
 * skipped, malformed input is refused without a crash, and the format
 * before the codec (version 2, captured from a running pooler) still
 * decodes.
 */
#include "autoconfig.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cmocka.h>

#include "unit.h"

#include "common/config.h"
#include "common/userlist.h"
#include "worker/handover_codec.h"

#include "handover_v2_fixtures.h"

/* ---- a client with every field set, each to a value no other field has ---- */

static const uint8_t body_a[] = {'S', 'E', 'L', 'E', 'C', 'T', ' ', '$', '1', 0, 0, 1, 0, 0, 0, 23};
static const uint8_t body_b[] = {'S', 'E', 'L', 'E', 'C', 'T', ' ', '2', 0, 0, 0};
static const uint8_t request[] = {'Q', 0, 0, 0, 13, 'S', 'E', 'L', 'E', 'C', 'T', ' ', '9', 0};

static HandoverVar full_vars[3];
static HandoverStmt full_stmts[2];
static HandoverVar server_vars[2];
static const uint8_t server_key[] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0xaa, 0xbb};

static void fill_full(HandoverClient *hc)
{
	memset(hc, 0, sizeof(*hc));
	hc->id = UINT64_C(0x0102030405060708);
	hc->database = "db_one";
	hc->user = "user_two";
	hc->is_unix = true;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&hc->remote;
	in6->sin6_family = AF_INET6;
	in6->sin6_port = htons(5433);
	in6->sin6_addr.s6_addr[15] = 7;
	struct sockaddr_in *in = (struct sockaddr_in *)&hc->local;
	in->sin_family = AF_INET;
	in->sin_port = htons(6432);
	in->sin_addr.s_addr = htonl(0x7f000009);
	hc->peer_pid = 4242;
	hc->peer_uid = 1001;
	hc->connect_time = UINT64_C(1796472660027864);
	hc->request_time = UINT64_C(1796472660037903);
	hc->auth_method = AUTH_SCRAM_SHA_256;
	memcpy(hc->cancel_key, "\x11\x22\x33\x00\x44\x55\x66\x77", HANDOVER_CANCEL_KEY_LEN);
	hc->app_name = "app three";
	hc->bytes_in = UINT64_C(0xfffffffffffffff0);
	hc->bytes_out = 77;
	full_vars[0] = (HandoverVar){"TimeZone", "Asia/Tokyo"};
	full_vars[1] = (HandoverVar){"application_name", ""};
	full_vars[2] = (HandoverVar){"DateStyle", "ISO, DMY"};
	hc->vars = full_vars;
	hc->nvars = 3;
	full_stmts[0] = (HandoverStmt){"s1", body_a, sizeof(body_a), UINT64_C(0xffb50e988bad0ee5)};
	full_stmts[1] = (HandoverStmt){"", body_b, sizeof(body_b), 0}; /* the unnamed statement, result type unknown */
	hc->stmts = full_stmts;
	hc->nstmts = 2;
	hc->has_secret = true;
	hc->secret.text = "SCRAM-SHA-256$4096:c2FsdA==$c3RvcmVk:c2VydmVy";
	hc->secret.kind = SECRET_SCRAM;
	hc->secret.from_auth_query = true;
	hc->secret.from_pam = true;
	hc->secret.has_scram_keys = true;
	for (int i = 0; i < SCRAM_KEY_LEN; i++) {
		hc->secret.scram_client_key[i] = (uint8_t)(i + 1);
		hc->secret.scram_server_key[i] = (uint8_t)(200 - i);
	}
	hc->secret.time = UINT64_C(1796472668529427);
	hc->request = request;
	hc->request_len = sizeof(request);
	hc->wait_start = UINT64_C(1796472660037999);
	hc->wait_notice_sent = true;
	hc->units_moved = true;
	hc->units.entry[0] = 404;
	hc->units.entry[1] = -1;
	/* an idle session-mode client's server connection (format 4) */
	HandoverServer *sv = &hc->server;
	hc->has_server = true;
	sv->id = UINT64_C(0x0a0b0c0d0e0f1011);
	sv->pool_user = "pool_user_four";
	struct sockaddr_in *pg = (struct sockaddr_in *)&sv->remote;
	pg->sin_family = AF_INET;
	pg->sin_port = htons(5432);
	pg->sin_addr.s_addr = htonl(0x7f000005);
	sv->connect_time = UINT64_C(1796472600000001);
	sv->request_time = UINT64_C(1796472600000002);
	sv->backend_pid = 31337;
	sv->key = server_key;
	sv->key_len = sizeof(server_key);
	server_vars[0] = (HandoverVar){"client_encoding", "UTF8"};
	server_vars[1] = (HandoverVar){"TimeZone", "Europe/Oslo"};
	sv->vars = server_vars;
	sv->nvars = 2;
	sv->bytes_in = 123456;
	sv->bytes_out = 654321;
	sv->session_tail = 3;
	sv->units_moved = true;
	sv->units.entry[0] = 17;
	sv->units.entry[1] = -1;
	sv->units.entry[2] = 4095;
}

static void assert_str_eq(const char *a, const char *b)
{
	if (!a || !b)
		assert_ptr_equal(a, b);
	else
		assert_string_equal(a, b);
}

static void assert_bytes_eq(const uint8_t *a, uint32_t alen, const uint8_t *b, uint32_t blen)
{
	assert_int_equal(alen, blen);
	if (alen)
		assert_memory_equal(a, b, alen);
}

/* Every field, one by one (not through the codec's table, which could be wrong itself). */
static void assert_clients_equal(const HandoverClient *a, const HandoverClient *b)
{
	assert_true(a->id == b->id);
	assert_str_eq(a->database, b->database);
	assert_str_eq(a->user, b->user);
	assert_int_equal(a->is_unix, b->is_unix);
	assert_memory_equal(&a->remote, &b->remote, sizeof(a->remote));
	assert_memory_equal(&a->local, &b->local, sizeof(a->local));
	assert_int_equal(a->peer_pid, b->peer_pid);
	assert_int_equal(a->peer_uid, b->peer_uid);
	assert_true(a->connect_time == b->connect_time);
	assert_true(a->request_time == b->request_time);
	assert_int_equal(a->auth_method, b->auth_method);
	assert_memory_equal(a->cancel_key, b->cancel_key, HANDOVER_CANCEL_KEY_LEN);
	assert_str_eq(a->app_name, b->app_name);
	assert_true(a->bytes_in == b->bytes_in);
	assert_true(a->bytes_out == b->bytes_out);
	assert_int_equal(a->nvars, b->nvars);
	for (uint32_t i = 0; i < a->nvars; i++) {
		assert_str_eq(a->vars[i].name, b->vars[i].name);
		assert_str_eq(a->vars[i].value, b->vars[i].value);
	}
	assert_int_equal(a->nstmts, b->nstmts);
	for (uint32_t i = 0; i < a->nstmts; i++) {
		assert_str_eq(a->stmts[i].name, b->stmts[i].name);
		assert_bytes_eq(a->stmts[i].body, a->stmts[i].body_len, b->stmts[i].body, b->stmts[i].body_len);
		assert_true(a->stmts[i].desc == b->stmts[i].desc);
	}
	assert_int_equal(a->has_secret, b->has_secret);
	assert_str_eq(a->secret.text, b->secret.text);
	assert_int_equal(a->secret.kind, b->secret.kind);
	assert_int_equal(a->secret.from_auth_query, b->secret.from_auth_query);
	assert_int_equal(a->secret.from_pam, b->secret.from_pam);
	assert_int_equal(a->secret.has_scram_keys, b->secret.has_scram_keys);
	assert_memory_equal(a->secret.scram_client_key, b->secret.scram_client_key, SCRAM_KEY_LEN);
	assert_memory_equal(a->secret.scram_server_key, b->secret.scram_server_key, SCRAM_KEY_LEN);
	assert_true(a->secret.time == b->secret.time);
	assert_bytes_eq(a->request, a->request_len, b->request, b->request_len);
	assert_true(a->wait_start == b->wait_start);
	assert_int_equal(a->wait_notice_sent, b->wait_notice_sent);
	assert_int_equal(a->units_moved, b->units_moved);
	assert_int_equal(a->units.entry[0], b->units.entry[0]);
	assert_int_equal(a->units.entry[1], b->units.entry[1]);
	assert_int_equal(a->has_server, b->has_server);
	const HandoverServer *x = &a->server, *y = &b->server;
	assert_true(x->id == y->id);
	assert_str_eq(x->pool_user, y->pool_user);
	assert_memory_equal(&x->remote, &y->remote, sizeof(x->remote));
	assert_true(x->connect_time == y->connect_time);
	assert_true(x->request_time == y->request_time);
	assert_int_equal(x->backend_pid, y->backend_pid);
	assert_bytes_eq(x->key, x->key_len, y->key, y->key_len);
	assert_int_equal(x->nvars, y->nvars);
	for (uint32_t i = 0; i < x->nvars; i++) {
		assert_str_eq(x->vars[i].name, y->vars[i].name);
		assert_str_eq(x->vars[i].value, y->vars[i].value);
	}
	assert_true(x->bytes_in == y->bytes_in);
	assert_true(x->bytes_out == y->bytes_out);
	assert_int_equal(x->session_tail, y->session_tail);
	assert_int_equal(x->units_moved, y->units_moved);
	for (int k = 0; k < 3; k++)
		assert_int_equal(x->units.entry[k], y->units.entry[k]);
}

/* The message of hc, in pb (initialized here). */
static void encode(const HandoverClient *hc, PktBuf *pb)
{
	pktbuf_init(pb, 256);
	handover_encode(hc, pb);
}

static bool decode(const uint8_t *data, size_t len, HandoverClient *out, char *err)
{
	return handover_decode(data, len, out, err, 128);
}

static void test_round_trip_every_field(void **state)
{
	HandoverClient in, out;
	char err[128];
	fill_full(&in);
	PktBuf pb;
	encode(&in, &pb);
	assert_true(decode(pb.buf, pb.len, &out, err));
	assert_clients_equal(&in, &out);
	/* strings and byte strings point into the message, not into the encoder's memory */
	assert_true((const uint8_t *)out.database > pb.buf && (const uint8_t *)out.database < pb.buf + pb.len);
	assert_true(out.request > pb.buf && out.request < pb.buf + pb.len);
	handover_free(&out);
	assert_null(out.vars);
	assert_int_equal(out.nvars, 0);
	pktbuf_free(&pb);
}

static void test_header(void **state)
{
	HandoverClient in;
	fill_full(&in);
	PktBuf pb;
	encode(&in, &pb);
	static const uint8_t head[] = {'P', 'G', 'B', 'M', 0, 0, 0, CLIENT_STATE_VERSION};
	assert_memory_equal(pb.buf, head, sizeof(head));
	pktbuf_free(&pb);
}

/* A client with the required fields only: the message holds nothing else, and the rest decodes as defaults. */
static void test_only_required_fields(void **state)
{
	HandoverClient in, out;
	char err[128];
	memset(&in, 0, sizeof(in));
	in.id = 9;
	in.database = "d";
	in.user = "u";
	in.remote.ss_family = AF_INET;
	memcpy(in.cancel_key, "abcdefgh", 8);
	PktBuf pb;
	encode(&in, &pb);
	/* header, id, database, user, remote, cancel key: 8 + 6 * 5 + 8 + 2 + 2 + 128 + 8 */
	assert_int_equal(pb.len, 8 + 6 * 5 + 8 + 2 + 2 + sizeof(struct sockaddr_storage) + 8);
	assert_true(decode(pb.buf, pb.len, &out, err));
	assert_clients_equal(&in, &out);
	assert_null(out.app_name);
	assert_null(out.vars);
	assert_false(out.has_secret);
	assert_null(out.request);
	assert_false(out.units_moved);
	handover_free(&out);
	pktbuf_free(&pb);
}

/* ---- messages built by hand: tag, length, value ---- */

static void tlv(PktBuf *pb, uint16_t tag, const void *v, uint32_t len)
{
	pktbuf_put_u16(pb, tag);
	pktbuf_put_u32(pb, len);
	pktbuf_put_bytes(pb, v, len);
}

static void tlv_str(PktBuf *pb, uint16_t tag, const char *s)
{
	tlv(pb, tag, s, (uint32_t)strlen(s) + 1);
}

static void tlv_u64(PktBuf *pb, uint16_t tag, uint64_t v)
{
	uint8_t b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (56 - 8 * i));
	tlv(pb, tag, b, 8);
}

/* The header and the required fields of the client record (tags of handover_codec.c's table). */
static void minimal(PktBuf *pb, uint32_t version)
{
	pktbuf_init(pb, 256);
	pktbuf_put_u32(pb, HANDOVER_MAGIC);
	pktbuf_put_u32(pb, version);
	tlv_u64(pb, 2, 77);
	tlv_str(pb, 3, "db");
	tlv_str(pb, 4, "usr");
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof(ss));
	ss.ss_family = AF_UNIX;
	tlv(pb, 6, &ss, sizeof(ss));
	tlv(pb, 13, "12345678", 8);
}

static void test_hand_built_minimal_message(void **state)
{
	HandoverClient out;
	char err[128];
	PktBuf pb;
	minimal(&pb, CLIENT_STATE_VERSION);
	assert_true(decode(pb.buf, pb.len, &out, err));
	assert_true(out.id == 77);
	assert_string_equal(out.database, "db");
	assert_string_equal(out.user, "usr");
	assert_int_equal(out.remote.ss_family, AF_UNIX);
	assert_memory_equal(out.cancel_key, "12345678", 8);
	assert_false(out.is_unix);
	assert_int_equal(out.nstmts, 0);
	handover_free(&out);
	pktbuf_free(&pb);
}

static void test_unknown_tags_skipped(void **state)
{
	HandoverClient out;
	char err[128];
	PktBuf pb;
	minimal(&pb, CLIENT_STATE_VERSION);
	/* a newer encoder's fields: at the top, and inside a nested record */
	tlv(&pb, 999, "\x01\x02\x03", 3);
	tlv(&pb, 0xffff, "", 0);
	PktBuf sec;
	pktbuf_init(&sec, 64);
	tlv(&sec, 40, "later", 5);
	tlv_str(&sec, 1, "md5abc");
	tlv(&sec, 2, "\0\0\0\2", 4);
	tlv(&sec, 41, "", 0);
	tlv(&pb, 19, sec.buf, (uint32_t)sec.len);
	assert_true(decode(pb.buf, pb.len, &out, err));
	assert_true(out.has_secret);
	assert_string_equal(out.secret.text, "md5abc");
	assert_int_equal(out.secret.kind, SECRET_MD5);
	assert_false(out.secret.from_auth_query);
	assert_true(out.secret.time == 0);
	handover_free(&out);
	pktbuf_free(&sec);
	pktbuf_free(&pb);
}

/* ---- each field left out in turn ---- */

/* Offsets of the top-level fields in an encoded message (after the header), and their count. */
static int top_fields(const PktBuf *pb, size_t *at, size_t *len, uint16_t *tags)
{
	int n = 0;
	size_t pos = 8;
	while (pos + 6 <= pb->len) {
		uint32_t vlen = (uint32_t)pb->buf[pos + 2] << 24 | (uint32_t)pb->buf[pos + 3] << 16 |
		                (uint32_t)pb->buf[pos + 4] << 8 | pb->buf[pos + 5];
		at[n] = pos;
		len[n] = 6 + vlen;
		tags[n] = (uint16_t)(pb->buf[pos] << 8 | pb->buf[pos + 1]);
		n++;
		pos += 6 + vlen;
	}
	assert_int_equal(pos, pb->len);
	return n;
}

static const HandoverField *top_field(uint16_t tag)
{
	for (size_t i = 0; i < handover_client_fields.n; i++)
		if (handover_client_fields.fields[i].tag == tag)
			return &handover_client_fields.fields[i];
	fail_msg("tag %u is not in the table", tag);
	return NULL;
}

/* The bytes a field's member (and its length, count or flag) takes in the struct. */
static void assert_member_default(const HandoverClient *hc, const HandoverField *f)
{
	const uint8_t *base = (const uint8_t *)hc;
	size_t size;
	switch (f->kind) {
	case HK_BOOL:
		size = sizeof(bool);
		break;
	case HK_U32:
	case HK_I32:
		size = 4;
		break;
	case HK_U64:
		size = 8;
		break;
	case HK_STR:
	case HK_BYTES:
	case HK_LIST:
		size = sizeof(void *);
		break;
	default:
		size = f->size;
		break;
	}
	for (size_t i = 0; i < size; i++)
		assert_int_equal(base[f->offset + i], 0);
	if (f->kind == HK_BYTES || f->kind == HK_LIST)
		assert_int_equal(*(const uint32_t *)(base + f->aux), 0);
	if (f->kind == HK_RECORD)
		assert_false(*(const bool *)(base + f->aux));
}

static void test_each_field_left_out(void **state)
{
	HandoverClient in, out;
	char err[128];
	fill_full(&in);
	PktBuf pb;
	encode(&in, &pb);
	size_t at[64], len[64];
	uint16_t tags[64];
	int n = top_fields(&pb, at, len, tags);
	assert_int_equal(n, (int)handover_client_fields.n); /* the full client has every field */
	for (int k = 0; k < n; k++) {
		const HandoverField *f = top_field(tags[k]);
		PktBuf cut;
		pktbuf_init(&cut, pb.len);
		pktbuf_put_bytes(&cut, pb.buf, at[k]);
		pktbuf_put_bytes(&cut, pb.buf + at[k] + len[k], pb.len - at[k] - len[k]);
		bool ok = decode(cut.buf, cut.len, &out, err);
		if (f->flags & HF_REQUIRED) {
			assert_false(ok);
			char want[128];
			snprintf(want, sizeof(want), "missing client.%s", f->name);
			assert_string_equal(err, want);
		} else {
			if (!ok)
				fail_msg("without %s: %s", f->name, err);
			assert_member_default(&out, f);
			handover_free(&out);
		}
		pktbuf_free(&cut);
	}
	pktbuf_free(&pb);
}

/* Tags unique in each record, at most 64 fields, a name for each. */
static void check_table(const HandoverTable *t)
{
	assert_true(t->n > 0 && t->n <= 64);
	for (size_t i = 0; i < t->n; i++) {
		const HandoverField *f = &t->fields[i];
		assert_non_null(f->name);
		assert_true(f->tag != 0);
		for (size_t j = i + 1; j < t->n; j++)
			assert_int_not_equal(f->tag, t->fields[j].tag);
		if (f->kind == HK_LIST || f->kind == HK_RECORD)
			check_table(f->sub);
	}
}

static void test_table(void **state)
{
	check_table(&handover_client_fields);
}

/* ---- refused input ---- */

static void assert_refused(const PktBuf *pb, const char *why)
{
	HandoverClient out;
	char err[128];
	assert_false(decode(pb->buf, pb->len, &out, err));
	if (!strstr(err, why))
		fail_msg("refused as \"%s\", not \"%s\"", err, why);
	/* nothing is left to free */
	assert_null(out.vars);
	assert_null(out.stmts);
}

static void test_truncated_at_every_length(void **state)
{
	HandoverClient in, out;
	char err[128];
	fill_full(&in);
	PktBuf pb;
	encode(&in, &pb);
	size_t at[64], len[64];
	uint16_t tags[64];
	int n = top_fields(&pb, at, len, tags);
	for (size_t cut = 0; cut < pb.len; cut++) {
		/* cut at a field's end, the message is whole but shorter: it decodes if what is left holds the required */
		bool at_boundary = false;
		for (int k = 0; k < n; k++)
			at_boundary |= cut == at[k] + len[k];
		uint8_t *copy = malloc(cut ? cut : 1);
		memcpy(copy, pb.buf, cut);
		bool ok = decode(copy, cut, &out, err);
		if (ok)
			handover_free(&out);
		if (!at_boundary)
			assert_false(ok);
		free(copy);
	}
	pktbuf_free(&pb);
}

static void test_refused_headers(void **state)
{
	PktBuf pb;
	minimal(&pb, CLIENT_STATE_VERSION + 1);
	assert_refused(&pb, "unknown state format 5");
	pktbuf_free(&pb);
	minimal(&pb, 1);
	assert_refused(&pb, "unknown state format 1");
	pktbuf_free(&pb);
	minimal(&pb, CLIENT_STATE_VERSION);
	pb.buf[0] = 'X';
	assert_refused(&pb, "unknown state format");
	pb.len = 7;
	assert_refused(&pb, "unknown state format");
	pktbuf_free(&pb);
	HandoverClient out;
	char err[128];
	assert_false(handover_decode((const uint8_t *)"", 0, &out, err, sizeof(err)));
}

/* A minimal message with one more field (tag, value). */
static void minimal_with(PktBuf *pb, uint16_t tag, const void *v, uint32_t len)
{
	minimal(pb, CLIENT_STATE_VERSION);
	tlv(pb, tag, v, len);
}

static void test_refused_values(void **state)
{
	PktBuf pb;
	/* a length past the end */
	minimal(&pb, CLIENT_STATE_VERSION);
	pktbuf_put_u16(&pb, 14);
	pktbuf_put_u32(&pb, 1000);
	pktbuf_put_bytes(&pb, "x", 2);
	assert_refused(&pb, "truncated client");
	pktbuf_free(&pb);
	/* a field header cut short */
	minimal(&pb, CLIENT_STATE_VERSION);
	pktbuf_put_u16(&pb, 14);
	assert_refused(&pb, "truncated client");
	pktbuf_free(&pb);
	/* a repeated field */
	minimal(&pb, CLIENT_STATE_VERSION);
	tlv_str(&pb, 3, "other");
	assert_refused(&pb, "repeated client.database");
	pktbuf_free(&pb);
	/* a string without its NUL, or with one inside */
	minimal_with(&pb, 14, "app", 3);
	assert_refused(&pb, "malformed client.app_name");
	pktbuf_free(&pb);
	minimal_with(&pb, 14, "a\0p", 4);
	assert_refused(&pb, "malformed client.app_name");
	pktbuf_free(&pb);
	minimal_with(&pb, 14, "", 0);
	assert_refused(&pb, "malformed client.app_name");
	pktbuf_free(&pb);
	/* a bool that is neither 0 nor 1; integers of the wrong width */
	minimal_with(&pb, 5, "\2", 1);
	assert_refused(&pb, "malformed client.is_unix");
	pktbuf_free(&pb);
	minimal_with(&pb, 8, "\0\0\1", 3);
	assert_refused(&pb, "malformed client.peer_pid");
	pktbuf_free(&pb);
	minimal_with(&pb, 10, "\0\0\0\0\0\0\0\0\0", 9);
	assert_refused(&pb, "malformed client.connect_time");
	pktbuf_free(&pb);
	/* a fixed-size field of another size */
	minimal_with(&pb, 7, "\1\0", 2);
	assert_refused(&pb, "malformed client.local");
	pktbuf_free(&pb);
	/* values out of the table's bounds */
	minimal_with(&pb, 12, "\0\0\0\xff", 4);
	assert_refused(&pb, "out of range: client.auth_method");
	pktbuf_free(&pb);
	char longdb[CF_MAX_DBNAME + 1];
	memset(longdb, 'd', CF_MAX_DBNAME);
	longdb[CF_MAX_DBNAME] = '\0';
	pktbuf_init(&pb, 256);
	pktbuf_put_u32(&pb, HANDOVER_MAGIC);
	pktbuf_put_u32(&pb, CLIENT_STATE_VERSION);
	tlv_str(&pb, 3, longdb);
	tlv_u64(&pb, 2, 1);
	tlv_str(&pb, 4, "u");
	struct sockaddr_storage ss = {.ss_family = AF_INET};
	tlv(&pb, 6, &ss, sizeof(ss));
	tlv(&pb, 13, "12345678", 8);
	assert_refused(&pb, "too long: client.database");
	pb.buf[8 + 6 + CF_MAX_DBNAME - 1] = '\0'; /* 63 bytes and a NUL (and a NUL in the way: malformed) */
	assert_refused(&pb, "malformed client.database");
	pktbuf_free(&pb);
	uint8_t *big = calloc(1, HANDOVER_MAX_REQUEST + 1);
	minimal_with(&pb, 20, big, HANDOVER_MAX_REQUEST + 1);
	assert_refused(&pb, "too long: client.request");
	pktbuf_free(&pb);
	free(big);
	/* an empty user name */
	pktbuf_init(&pb, 256);
	pktbuf_put_u32(&pb, HANDOVER_MAGIC);
	pktbuf_put_u32(&pb, CLIENT_STATE_VERSION);
	tlv_u64(&pb, 2, 1);
	tlv_str(&pb, 3, "db");
	tlv_str(&pb, 4, "");
	tlv(&pb, 6, &ss, sizeof(ss));
	tlv(&pb, 13, "12345678", 8);
	assert_refused(&pb, "empty client.user");
	pktbuf_free(&pb);
}

static void test_refused_lists(void **state)
{
	PktBuf pb;
	/* a count far beyond what the bytes can hold: refused before any allocation */
	minimal_with(&pb, 17, "\xff\xff\xff\xff", 4);
	assert_refused(&pb, "malformed client.vars");
	pktbuf_free(&pb);
	/* an element whose length runs past the list */
	minimal_with(&pb, 17, "\0\0\0\1\0\0\0\x50", 8);
	assert_refused(&pb, "malformed client.vars");
	pktbuf_free(&pb);
	/* two elements, the second without its value: the first is freed again */
	PktBuf list, e;
	pktbuf_init(&list, 64);
	pktbuf_init(&e, 64);
	pktbuf_put_u32(&list, 2);
	tlv_str(&e, 1, "TimeZone");
	tlv_str(&e, 2, "UTC");
	pktbuf_put_u32(&list, (uint32_t)e.len);
	pktbuf_put_bytes(&list, e.buf, e.len);
	pktbuf_reset(&e);
	tlv_str(&e, 1, "DateStyle");
	pktbuf_put_u32(&list, (uint32_t)e.len);
	pktbuf_put_bytes(&list, e.buf, e.len);
	minimal_with(&pb, 17, list.buf, (uint32_t)list.len);
	assert_refused(&pb, "missing var.value");
	pktbuf_free(&pb);
	pktbuf_free(&list);
	/* bytes after the last element */
	pktbuf_init(&list, 64);
	pktbuf_put_u32(&list, 1);
	tlv_str(&e, 2, "ISO");
	pktbuf_put_u32(&list, (uint32_t)e.len);
	pktbuf_put_bytes(&list, e.buf, e.len);
	minimal_with(&pb, 17, list.buf, (uint32_t)list.len);
	HandoverClient out;
	char err[128];
	assert_true(decode(pb.buf, pb.len, &out, err)); /* DateStyle = ISO, as a check of the list built */
	assert_int_equal(out.nvars, 1);
	assert_string_equal(out.vars[0].value, "ISO");
	handover_free(&out);
	pktbuf_free(&pb);
	pktbuf_put_u8(&list, 0);
	minimal_with(&pb, 17, list.buf, (uint32_t)list.len);
	assert_refused(&pb, "malformed client.vars");
	pktbuf_free(&pb);
	pktbuf_free(&list);
	pktbuf_free(&e);
	/* an empty parameter name */
	pktbuf_init(&list, 64);
	pktbuf_init(&e, 64);
	pktbuf_put_u32(&list, 1);
	tlv_str(&e, 1, "");
	tlv_str(&e, 2, "x");
	pktbuf_put_u32(&list, (uint32_t)e.len);
	pktbuf_put_bytes(&list, e.buf, e.len);
	minimal_with(&pb, 17, list.buf, (uint32_t)list.len);
	assert_refused(&pb, "empty var.name");
	pktbuf_free(&pb);
	pktbuf_free(&list);
	pktbuf_free(&e);
}

/* A small deterministic generator (xorshift), so that a failure repeats. */
static uint32_t rnd_state = 2463534242u;

static uint32_t rnd(void)
{
	rnd_state ^= rnd_state << 13;
	rnd_state ^= rnd_state >> 17;
	rnd_state ^= rnd_state << 5;
	return rnd_state;
}

/* Valid messages with bytes flipped, and bytes at random: no crash, and what decodes can be freed. */
static void test_garbage(void **state)
{
	HandoverClient in, out;
	char err[128];
	fill_full(&in);
	PktBuf pb;
	encode(&in, &pb);
	const uint8_t *msgs[3] = {pb.buf, v2_waiting, v2_auth_query};
	size_t lens[3] = {pb.len, sizeof(v2_waiting), sizeof(v2_auth_query)};
	uint8_t *copy = malloc(pb.len + sizeof(v2_waiting) + 64);
	for (int round = 0; round < 20000; round++) {
		int m = round % 3;
		size_t len = lens[m];
		memcpy(copy, msgs[m], len);
		int flips = 1 + (int)(rnd() % 4);
		for (int i = 0; i < flips; i++)
			copy[rnd() % len] ^= (uint8_t)(1 + rnd() % 255);
		if (round % 7 == 0)
			len = rnd() % len;
		if (decode(copy, len, &out, err))
			handover_free(&out);
	}
	for (int round = 0; round < 2000; round++) {
		size_t len = 8 + rnd() % 200;
		for (size_t i = 0; i < len; i++)
			copy[i] = (uint8_t)rnd();
		memcpy(copy, "PGBM\0\0\0", 7);
		copy[7] = (uint8_t)(2 + round % 2);
		if (decode(copy, len, &out, err))
			handover_free(&out);
	}
	free(copy);
	pktbuf_free(&pb);
}

/* ---- the format before the codec (version 2) ---- */

static void test_v2_waiting_client(void **state)
{
	HandoverClient out;
	char err[128];
	if (!decode(v2_waiting, sizeof(v2_waiting), &out, err))
		fail_msg("%s", err);
	assert_true(out.id == 12);
	assert_string_equal(out.database, "postgres");
	assert_string_equal(out.user, "postgres");
	assert_true(out.is_unix);
	assert_int_equal(out.remote.ss_family, AF_UNIX);
	const struct sockaddr_un *local = (const struct sockaddr_un *)&out.local;
	assert_int_equal(local->sun_family, AF_UNIX);
	assert_string_equal(local->sun_path, "/tmp/pgbt-x0b3cmja/bouncer-5q_uga4q/.s.PGSQL.49743");
	assert_int_equal(out.peer_pid, 22791);
	assert_int_equal(out.peer_uid, 0);
	assert_true(out.connect_time == UINT64_C(1796472660027864));
	assert_true(out.request_time == UINT64_C(1796472660037903));
	assert_int_equal(out.auth_method, AUTH_SCRAM_SHA_256);
	assert_memory_equal(out.cancel_key, "\x44\x91\x8c\x00\xb8\x30\x0d\xa0", 8);
	assert_string_equal(out.app_name, "postgres");
	assert_true(out.bytes_in == 448);
	assert_true(out.bytes_out == 101);
	static const char *const vars[][2] = {
	    {"DateStyle", "ISO, MDY"},
	    {"client_encoding", "UTF8"},
	    {"TimeZone", "Asia/Tokyo"},
	    {"standard_conforming_strings", "on"},
	    {"application_name", "codec-fixture-9"},
	    {"IntervalStyle", "iso_8601"},
	};
	assert_int_equal(out.nvars, 6);
	for (int i = 0; i < 6; i++) {
		assert_string_equal(out.vars[i].name, vars[i][0]);
		assert_string_equal(out.vars[i].value, vars[i][1]);
	}
	assert_int_equal(out.nstmts, 2);
	assert_string_equal(out.stmts[0].name, "fx_stmt");
	assert_bytes_eq(out.stmts[0].body, out.stmts[0].body_len, (const uint8_t *)"SELECT $1::int + 9 AS n\0\0\0", 26);
	assert_true(out.stmts[0].desc == UINT64_C(0xffb50e988bad0ee5));
	assert_string_equal(out.stmts[1].name, "fx_other");
	assert_bytes_eq(out.stmts[1].body, out.stmts[1].body_len, (const uint8_t *)"SELECT now()\0\0\0", 15);
	assert_true(out.stmts[1].desc == UINT64_C(0xab70cafb612875de));
	assert_true(out.has_secret);
	assert_string_equal(out.secret.text,
	                    "SCRAM-SHA-256$4096:cGdib3VuY2VyLXNhbHQxNg==$3rbIJab+ZL3pR4djt20oq9tcOs9TTYX+"
	                    "nlQBaO/tjB8=:X6CJmno/MJ9D7ruiu1HSR4/EtMnssZIrezc70TrB/4o=");
	assert_int_equal(out.secret.kind, SECRET_SCRAM);
	assert_false(out.secret.from_auth_query);
	assert_false(out.secret.from_pam);
	assert_true(out.secret.has_scram_keys);
	assert_memory_equal(out.secret.scram_client_key,
	                    "\xca\xc5\x69\xee\x9b\x9f\x8c\xd4\x57\xe7\xba\x2d\x96\xa5\x84\x4d"
	                    "\x2e\x0e\x69\x85\x5d\xd1\x1f\xd7\xbd\x9f\x4c\x68\x91\x6c\x21\xa3",
	                    32);
	assert_memory_equal(out.secret.scram_server_key,
	                    "\x5f\xa0\x89\x9a\x7a\x3f\x30\x9f\x43\xee\xbb\xa2\xbb\x51\xd2\x47"
	                    "\x8f\xc4\xb4\xc9\xec\xb1\x92\x2b\x7b\x37\x3b\xd1\x3a\xc1\xff\x8a",
	                    32);
	assert_true(out.secret.time == 0);
	assert_bytes_eq(out.request, out.request_len, (const uint8_t *)"Q\0\0\0\rSELECT 9", 14);
	assert_true(out.wait_start == UINT64_C(1796472660037903));
	assert_true(out.wait_notice_sent);
	assert_true(out.units_moved);
	assert_int_equal(out.units.entry[0], 404);
	assert_int_equal(out.units.entry[1], 4025);
	handover_free(&out);
}

static void test_v2_auth_query_client(void **state)
{
	HandoverClient out;
	char err[128];
	if (!decode(v2_auth_query, sizeof(v2_auth_query), &out, err))
		fail_msg("%s", err);
	assert_true(out.id == 1);
	assert_string_equal(out.database, "authq_app");
	assert_string_equal(out.user, "authq_md5");
	assert_false(out.is_unix);
	const struct sockaddr_in *remote = (const struct sockaddr_in *)&out.remote;
	assert_int_equal(remote->sin_family, AF_INET);
	assert_int_equal(ntohs(remote->sin_port), 44400);
	assert_int_equal(ntohl(remote->sin_addr.s_addr), 0x7f000001);
	assert_int_equal(out.auth_method, AUTH_MD5);
	assert_memory_equal(out.cancel_key, "\x19\x5a\x4a\x00\xfa\xcf\x8e\x4c", 8);
	assert_string_equal(out.app_name, "authq_md5");
	assert_true(out.bytes_in == 106 && out.bytes_out == 14);
	assert_int_equal(out.nvars, 6);
	assert_string_equal(out.vars[4].name, "application_name");
	assert_string_equal(out.vars[4].value, "");
	assert_int_equal(out.nstmts, 0);
	assert_null(out.stmts);
	assert_true(out.has_secret);
	assert_string_equal(out.secret.text, "md516d99dd7e744f030d76ea8139c38bc25");
	assert_int_equal(out.secret.kind, SECRET_MD5);
	assert_true(out.secret.from_auth_query);
	assert_false(out.secret.from_pam);
	assert_false(out.secret.has_scram_keys);
	assert_true(out.secret.time == UINT64_C(1796472668529427));
	assert_null(out.request);
	assert_int_equal(out.request_len, 0);
	assert_true(out.wait_start == 0);
	assert_false(out.wait_notice_sent);
	assert_true(out.units_moved);
	assert_int_equal(out.units.entry[0], 16);
	assert_int_equal(out.units.entry[1], 3388);
	handover_free(&out);
}

/* What version 2 carried, re-encoded in the current format, decodes the same. */
static void test_v2_re_encoded(void **state)
{
	const uint8_t *msgs[2] = {v2_waiting, v2_auth_query};
	size_t lens[2] = {sizeof(v2_waiting), sizeof(v2_auth_query)};
	for (int i = 0; i < 2; i++) {
		HandoverClient old, now;
		char err[128];
		assert_true(decode(msgs[i], lens[i], &old, err));
		PktBuf pb;
		encode(&old, &pb);
		assert_true(decode(pb.buf, pb.len, &now, err));
		assert_clients_equal(&old, &now);
		handover_free(&now);
		handover_free(&old);
		pktbuf_free(&pb);
	}
}

static void test_v2_cut_short(void **state)
{
	HandoverClient out;
	char err[128];
	/* without the tail, and without the waiting request and the secret's time (an older giver): still read */
	size_t body = sizeof(v2_auth_query) - 13;
	assert_true(decode(v2_auth_query, body, &out, err));
	assert_false(out.units_moved);
	assert_true(out.secret.from_auth_query);
	handover_free(&out);
	assert_true(decode(v2_auth_query, body - 8 - 8 - 4, &out, err));
	assert_true(out.secret.time == 0);
	handover_free(&out);
	/* cut inside the fields: refused */
	assert_false(decode(v2_auth_query, body - 8 - 8 - 4 - 1, &out, err));
	assert_string_equal(err, "malformed state (version 2)");
	assert_false(decode(v2_auth_query, 40, &out, err));
	/* a tail's magic that overlaps the header (found by fuzz_handover): no tail, a message far too short */
	static const char overlap[] = "PGBM\0\0\0\2~~~BT\0\0PGBT";
	assert_false(decode((const uint8_t *)overlap, sizeof(overlap) - 1, &out, err));
	HandoverUnits u;
	assert_false(handover_peek_units((const uint8_t *)overlap, sizeof(overlap) - 1, &u));
}

/* ---- the units, found without decoding the rest ---- */

static void test_peek_units(void **state)
{
	HandoverClient in;
	HandoverUnits u;
	fill_full(&in);
	PktBuf pb;
	encode(&in, &pb);
	assert_true(handover_peek_units(pb.buf, pb.len, &u));
	assert_int_equal(u.entry[0], 404);
	assert_int_equal(u.entry[1], -1);
	/* the rest spoiled: the units are still found (they come first) */
	HandoverClient out;
	char err[128];
	memset(pb.buf + 40, 0xee, pb.len - 40);
	assert_false(decode(pb.buf, pb.len, &out, err));
	assert_true(handover_peek_units(pb.buf, pb.len, &u));
	assert_int_equal(u.entry[0], 404);
	pktbuf_free(&pb);
	/* none moved */
	in.units_moved = false;
	encode(&in, &pb);
	assert_false(handover_peek_units(pb.buf, pb.len, &u));
	pktbuf_free(&pb);
	/* version 2: from its tail */
	assert_true(handover_peek_units(v2_waiting, sizeof(v2_waiting), &u));
	assert_int_equal(u.entry[0], 404);
	assert_int_equal(u.entry[1], 4025);
	assert_false(handover_peek_units(v2_waiting, sizeof(v2_waiting) - 13, &u));
	assert_false(handover_peek_units(v2_waiting, 4, &u));
}

/* The units of a session client's server are found by the framing alone, like the client's. */
static void test_peek_server_units(void **state)
{
	HandoverClient in;
	HandoverServerUnits u;
	fill_full(&in);
	PktBuf pb;
	encode(&in, &pb);
	assert_true(handover_peek_server_units(pb.buf, pb.len, &u));
	assert_int_equal(u.entry[0], 17);
	assert_int_equal(u.entry[1], -1);
	assert_int_equal(u.entry[2], 4095);
	pktbuf_free(&pb);
	/* no server, or its units not moved */
	in.server.units_moved = false;
	encode(&in, &pb);
	assert_false(handover_peek_server_units(pb.buf, pb.len, &u));
	pktbuf_free(&pb);
	in.has_server = false;
	encode(&in, &pb);
	assert_false(handover_peek_server_units(pb.buf, pb.len, &u));
	pktbuf_free(&pb);
	/* version 2 had no servers */
	assert_false(handover_peek_server_units(v2_waiting, sizeof(v2_waiting), &u));
}

/* -R: the formats this binary's workers read. */
static void test_readable_formats(void **state)
{
	assert_false(client_state_readable(0)); /* a binary that cannot hand clients over */
	assert_false(client_state_readable(1));
	assert_true(client_state_readable(2)); /* the previous binary's */
	assert_true(client_state_readable(CLIENT_STATE_VERSION));
	assert_false(client_state_readable(CLIENT_STATE_VERSION + 1));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_round_trip_every_field),
	    cmocka_unit_test(test_header),
	    cmocka_unit_test(test_only_required_fields),
	    cmocka_unit_test(test_hand_built_minimal_message),
	    cmocka_unit_test(test_unknown_tags_skipped),
	    cmocka_unit_test(test_each_field_left_out),
	    cmocka_unit_test(test_table),
	    cmocka_unit_test(test_truncated_at_every_length),
	    cmocka_unit_test(test_peek_server_units),
	    cmocka_unit_test(test_refused_headers),
	    cmocka_unit_test(test_refused_values),
	    cmocka_unit_test(test_refused_lists),
	    cmocka_unit_test(test_garbage),
	    cmocka_unit_test(test_v2_waiting_client),
	    cmocka_unit_test(test_v2_auth_query_client),
	    cmocka_unit_test(test_v2_re_encoded),
	    cmocka_unit_test(test_v2_cut_short),
	    cmocka_unit_test(test_peek_units),
	    cmocka_unit_test(test_readable_formats),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
