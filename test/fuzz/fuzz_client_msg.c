/*
 * libFuzzer target: a client's messages after login, and the server's
 * answers, through the pure code transaction pooling uses: message headers
 * (proto_parse_header), fields (PktReader), the prepared-statement registry
 * and name maps (prepare.c) and the outstanding-request queue (reqqueue.c),
 * driven the way txn.c drives them. The input is a sequence of messages,
 * each preceded by one byte: even = from the client, odd = from the server.
 * At the end every statement must be released (no reference leaks).
 */
#include "autoconfig.h"

#include "common/config.h"
#include "common/pktbuf.h"
#include "common/proto.h"
#include "fuzz.h"
#include "worker/reqqueue.h"

#define FUZZ_MAX_PACKET (64 * 1024)
#define FUZZ_MAX_STMTS  4 /* max_prepared_statements: small, so evictions happen */

typedef struct Conn {
	ClientStmtMap cmap; /* the client's names */
	ServerStmt *sset;   /* what the server has prepared */
	ReqQueue q;
} Conn;

/* As txn.c's request_dropped: undo what a request the server skipped recorded. */
static void dropped(Request *r, void *arg)
{
	Conn *c = arg;
	if (r->closed) {
		prepare_client_reattach(&c->cmap, r->closed);
		r->closed = NULL;
		return;
	}
	if (r->kind == REQ_CLOSE && r->stmt_id) {
		PreparedStmt *ps = prepare_stmt_by_id(r->stmt_id);
		if (ps && !prepare_server_has(&c->sset, ps, false))
			prepare_server_add(&c->sset, ps);
		return;
	}
	if (r->kind != REQ_PARSE)
		return;
	if (r->stmt_id)
		prepare_server_remove_id(&c->sset, r->stmt_id);
	if (r->map_gen)
		(void)prepare_client_remove_gen(&c->cmap, r->map_gen);
}

static void answer_own(Conn *c)
{
	Request *h;
	while ((h = reqqueue_head(&c->q)) && h->answer == ANS_POOLER)
		reqqueue_pop(&c->q, NULL);
}

static void evict(Conn *c, const PreparedStmt *keep)
{
	PreparedStmt *old;
	while ((old = prepare_server_evict(&c->sset, FUZZ_MAX_STMTS, keep))) {
		reqqueue_push(&c->q, REQ_CLOSE, ANS_SWALLOW);
		reqqueue_tail(&c->q)->stmt_id = prepare_stmt_id(old);
		prepare_stmt_unref(old);
	}
}

/* Parse: name, query, int16 count, that many int32 type OIDs. */
static void client_parse(Conn *c, const uint8_t *body, uint32_t len)
{
	PktReader r;
	const char *name, *query;
	uint16_t n;
	uint32_t oid;
	pktreader_init(&r, body, len);
	if (!pktreader_get_string(&r, &name))
		return;
	size_t keylen = pktreader_remaining(&r);
	const uint8_t *key = body + (len - keylen);
	if (pktreader_get_string(&r, &query) && pktreader_get_u16(&r, &n))
		for (unsigned i = 0; i < n && pktreader_get_u32(&r, &oid); i++)
			;
	if (!*name) {
		reqqueue_push(&c->q, REQ_PARSE, ANS_CLIENT);
		return;
	}
	if (prepare_client_find(&c->cmap, name)) {
		reqqueue_push(&c->q, REQ_PARSE, ANS_FAKE_ERROR);
		reqqueue_tail(&c->q)->error = strdup("already exists");
		return;
	}
	PreparedStmt *ps = prepare_stmt_get(key, keylen);
	ClientStmt *cs = prepare_client_add(&c->cmap, name, ps);
	if (prepare_client_find(&c->cmap, name) != cs || prepare_client_stmt(cs) != ps)
		abort();
	if (prepare_server_has(&c->sset, ps, true)) {
		reqqueue_push(&c->q, REQ_PARSE, ANS_POOLER);
		reqqueue_tail(&c->q)->map_gen = prepare_client_gen(cs);
		answer_own(c);
	} else {
		prepare_server_add(&c->sset, ps);
		reqqueue_push(&c->q, REQ_PARSE, ANS_CLIENT);
		reqqueue_tail(&c->q)->stmt_id = prepare_stmt_id(ps);
		reqqueue_tail(&c->q)->map_gen = prepare_client_gen(cs);
		evict(c, ps);
	}
	(void)prepare_stmt_name(ps);
	prepare_stmt_unref(ps);
}

/* Bind: portal, statement, formats, parameters (int32 length, -1 = NULL), result formats. */
static void client_bind(Conn *c, const uint8_t *body, uint32_t len)
{
	PktReader r;
	const char *portal, *stmt;
	const uint8_t *p;
	uint16_t n, v16;
	uint32_t v32;
	pktreader_init(&r, body, len);
	if (!pktreader_get_string(&r, &portal) || !pktreader_get_string(&r, &stmt))
		return;
	if (pktreader_get_u16(&r, &n))
		for (unsigned i = 0; i < n && pktreader_get_u16(&r, &v16); i++)
			;
	if (pktreader_get_u16(&r, &n))
		for (unsigned i = 0; i < n && pktreader_get_u32(&r, &v32); i++)
			if (v32 != 0xffffffffu && !pktreader_get_bytes(&r, v32, &p))
				break;
	reqqueue_push(&c->q, REQ_BIND, ANS_CLIENT);
	if (*stmt)
		reqqueue_tail(&c->q)->stmt_name = strdup(stmt);
}

/* Describe or Close: 'S' or 'P', then a name. */
static void client_describe_close(Conn *c, char type, const uint8_t *body, uint32_t len)
{
	PktReader r;
	uint8_t what;
	const char *name;
	pktreader_init(&r, body, len);
	if (!pktreader_get_u8(&r, &what) || !pktreader_get_string(&r, &name))
		return;
	ReqKind kind = type == 'D' ? REQ_DESCRIBE : REQ_CLOSE;
	if (what != 'S' || !*name || kind == REQ_DESCRIBE) {
		reqqueue_push(&c->q, kind, ANS_CLIENT);
		return;
	}
	ClientStmt *cs = prepare_client_find(&c->cmap, name);
	if (cs)
		prepare_client_detach(&c->cmap, cs);
	reqqueue_push(&c->q, REQ_CLOSE, ANS_POOLER);
	reqqueue_tail(&c->q)->closed = cs;
	answer_own(c);
}

static void client_msg(Conn *c, char type, const uint8_t *body, uint32_t len)
{
	PktReader r;
	const char *s;
	uint32_t v;
	pktreader_init(&r, body, len);
	switch (type) {
	case 'P':
		client_parse(c, body, len);
		break;
	case 'B':
		client_bind(c, body, len);
		break;
	case 'D':
	case 'C':
		client_describe_close(c, type, body, len);
		break;
	case 'E':
		if (pktreader_get_string(&r, &s) && pktreader_get_u32(&r, &v))
			reqqueue_push(&c->q, REQ_EXECUTE, ANS_CLIENT);
		break;
	case 'Q':
	case 'F':
		if (pktreader_get_string(&r, &s))
			reqqueue_push(&c->q, REQ_QUERY, ANS_CLIENT);
		break;
	case 'S':
		reqqueue_push(&c->q, REQ_SYNC, ANS_CLIENT);
		break;
	default:
		break;
	}
}

static void server_msg(Conn *c, char type, const uint8_t *body, uint32_t len)
{
	Request out;
	ReqPop pop = reqqueue_server_msg(&c->q, type, &out, dropped, c);
	if (pop == POP_ANSWER) {
		if (type == 'E')
			dropped(&out, c); /* the failed request is undone after those behind it */
		free(out.error);
		free(out.stmt_name);
		if (out.closed)
			prepare_client_free(out.closed);
		answer_own(c);
	}
	if (type == 'Z' && len >= 1)
		for (int mode = POOL_SESSION; mode <= POOL_STATEMENT; mode++)
			(void)reqqueue_release_decision(mode, (char)body[0], &c->q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	Conn c = {0};
	while (size >= 1) {
		bool from_server = data[0] & 1;
		PktHdr hdr;
		data++;
		size--;
		if (proto_parse_header(data, size, false, FUZZ_MAX_PACKET, &hdr) != HDR_OK || hdr.len > size)
			break;
		if (hdr.body_off > hdr.len)
			abort(); /* HDR_OK promises a whole header */
		(void)proto_msg_name(hdr.type, from_server);
		uint32_t blen = hdr.len - hdr.body_off;
		uint8_t *body = fuzz_copy(data + hdr.body_off, blen);
		if (from_server)
			server_msg(&c, hdr.type, body, blen);
		else
			client_msg(&c, hdr.type, body, blen);
		free(body);
		data += hdr.len;
		size -= hdr.len;
	}
	reqqueue_clear(&c.q, dropped, &c);
	reqqueue_free(&c.q);
	prepare_client_clear(&c.cmap);
	prepare_server_clear(&c.sset);
	if (prepare_registry_count() != 0)
		abort(); /* a statement reference was leaked */
	return 0;
}
