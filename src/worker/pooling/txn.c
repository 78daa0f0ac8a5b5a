/*
 * Transaction and statement pooling (doc/transaction.md): the messages of
 * a client linked to a server are queued as outstanding requests, the
 * server's answers pop them, and the server goes back to the pool at the
 * ReadyForQuery that closes what the client sent. Protocol-level prepared
 * statements are renamed, prepared on demand on whichever server a client
 * gets, and answered in order when the pooler answers them itself; a
 * statement the pooler prepares again must keep the result type its
 * client was given (doc/transaction.md, "Schema changes").
 *
 * Invariants (doc/architecture.md, "Transaction pooling: when a server is
 * released"), asserted by txn_check_invariants() with --enable-cassert at
 * every link, release, client message and server message:
 *
 *  1. A link is mutual: c->link == s exactly when s->link == c, and a
 *     client links only to a server.
 *  2. A linked pair (but a replication server still logging in) is
 *     SV_ACTIVE and CL_ACTIVE and forwards each to the other (sb.dst); an
 *     unlinked client or server forwards nowhere.
 *  3. A client waiting for a server (CL_WAITING) has no link.
 *  4. The request queue is a ring within its room: count <= cap, cap 0 or
 *     a power of two, head < cap; nothing is popped from an empty queue
 *     or read past its end (reqqueue.c, reqqueue.h).
 *  5. A session-mode link (replication's too) has nothing queued and no
 *     message held: the queue is transaction and statement mode's.
 *  6. A client message held for answers (held_for_check, rq.full) is a
 *     linked server's: unlinking lets it go.
 *  7. A server in the pool (SV_IDLE, SV_USED, SV_TESTED,
 *     SV_BEING_CANCELED) has no link, nothing queued or skipped, no COPY
 *     (copy_in, copy_mode) and no SET of tracked parameters in flight.
 *  8. At the release (txn_release()) no message is cut in two in either
 *     direction, and after it nothing of the client's is left to forward
 *     (client_input_clean()).
 */
#include "autoconfig.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/pktbuf.h"
#include "common/util.h"
#include "worker/prepare.h"
#include "worker/reqqueue.h"
#include "worker/objects.h"
#include "worker/pool.h"
#include "worker/server.h"
#include "worker/txn.h"
#include "worker/txn_msg.h"
#include "worker/worker.h"

/* Whether protocol-level prepared statements are tracked on this linked server. */
static bool tracks_statements(const PgSocket *s)
{
	return wk.cf.g.max_prepared_statements > 0 && s->link_mode != POOL_SESSION;
}

/* ---- pooler-made messages ---- */

/* Where the pooler builds a message before it is queued (its memory is kept: no malloc per message). */
static PktBuf *scratch(void)
{
	static PktBuf pb;
	pktbuf_reset(&pb);
	return &pb;
}

/* A message whose body is a single byte-string (Close/Describe of a statement). */
static void put_simple_msg(PktBuf *pb, char type, char sub, const char *name)
{
	pktbuf_start_msg(pb, type);
	if (sub)
		pktbuf_put_u8(pb, (uint8_t)sub);
	pktbuf_put_string(pb, name);
	pktbuf_finish_msg(pb);
}

/*
 * Where a pooler-made message for the server is built: in the server's
 * queue itself, after what the client has forwarded so far (it goes out
 * with the client's batch), or in the scratch if the server is gone.
 * Nothing else may be queued for the server until the message is done.
 */
static PktBuf *server_msg(PgSocket *c)
{
	c->link->ready = false;
	PktBuf *q = sbuf_own_queue(&c->sb);
	return q ? q : scratch();
}

/*
 * The pooler's own error for the client's current message, with the state
 * PostgreSQL's error would bring: the server gets a Parse that fails, so
 * that it skips to the next Sync and fails an open transaction, and its
 * error is replaced by `error` (SQLSTATE, then the message). Valid syntax
 * (an unknown column, named after the reason in the server's log), so
 * that in a failed transaction the server's 25P02 comes first, as it would.
 * A named Parse: one of the unnamed statement would drop the client's
 * unnamed statement, and this name is never stored, since the Parse fails.
 */
static void refuse(PgSocket *c, PgSocket *s, const char *column, const char *error)
{
	PktBuf *pb = server_msg(c);
	pktbuf_start_msg(pb, 'P');
	pktbuf_put_string(pb, PREPARE_NAME_PREFIX "refused");
	pktbuf_put_bytes(pb, "SELECT ", 7);
	pktbuf_put_string(pb, column);
	pktbuf_put_u16(pb, 0);
	pktbuf_finish_msg(pb);
	reqqueue_push(&s->rq, REQ_PARSE, ANS_FAKE_ERROR);
	reqqueue_tail(&s->rq)->error = xstrdup(error);
}

/* PostgreSQL's error for a statement whose result type changed since it was prepared. */
#define CHANGED_ERROR "0A000cached plan must not change result type"

static void refuse_changed(PgSocket *c, PgSocket *s)
{
	refuse(c, s, "pgbouncer_result_type_changed", CHANGED_ERROR);
}

/* To the client, after what the server has forwarded so far. */
static void to_client(PgSocket *s, const void *data, size_t len)
{
	sbuf_forward_own(&s->sb, data, len, true);
}

/* Requests at the head that the pooler answers itself go out now, in order. */
static void answer_own_requests(PgSocket *s)
{
	Request *h;
	while ((h = reqqueue_head(&s->rq)) && h->answer == ANS_POOLER) {
		static const uint8_t parse_complete[] = {'1', 0, 0, 0, 4};
		static const uint8_t close_complete[] = {'3', 0, 0, 0, 4};
		if (s->link)
			to_client(s, h->kind == REQ_PARSE ? parse_complete : close_complete, 5);
		reqqueue_pop(&s->rq, NULL);
	}
}

/* A Flush: the server sends what it keeps until a Sync (the pooler's, when a message waits for answers). */
static const uint8_t FLUSH_MSG[] = {'H', 0, 0, 0, 4};

/* Whether a request of one of `kinds` (a bit per ReqKind) is queued. */
static bool queued(const ReqQueue *q, unsigned kinds)
{
	for (uint32_t i = 0; i < q->count; i++) {
		if (kinds & (1u << reqqueue_at(q, i)->kind))
			return true;
	}
	return false;
}

/*
 * A request that changes which unnamed statement the server has: the
 * client's Parse of it (with max_prepared_statements = 0, any of its
 * Parses), or the pooler's Close of another client's (unnamed_of_another()).
 */
static bool changes_unnamed(const Request *r)
{
	if (r->kind == REQ_PARSE)
		return r->answer == ANS_CLIENT && !r->stmt_id && !r->map_gen;
	return r->kind == REQ_CLOSE && r->answer == ANS_SWALLOW && !r->stmt_id;
}

/*
 * Whether what a client's next message depends on is still unanswered in
 * an earlier part of the pipeline (before a Sync): an error there has the
 * server skip it, and PostgreSQL's answer to the message depends on that.
 * With `name`, the last request that changed what the client's statement
 * of that name is: the Parse that made its mapping `cs` (a failed Parse
 * leaves the name free) or a Close of it (a skipped Close leaves the
 * statement). Without, what made the client the owner of the server's
 * unnamed statement (skipped, the statement is someone else's). In the
 * same part the message shares its fate.
 */
static bool unsettled(const ReqQueue *q, const char *name, const ClientStmt *cs)
{
	if (!q->count)
		return false;
	uint64_t gen = cs ? prepare_client_gen(cs) : 0;
	bool behind_sync = false;
	for (uint32_t i = q->count; i-- > 0;) {
		const Request *r = reqqueue_at(q, i);
		if (r->kind == REQ_SYNC)
			behind_sync = true;
		else if (!name
		             ? changes_unnamed(r)
		             : (gen && r->kind == REQ_PARSE && r->map_gen == gen) ||
		                   (r->kind == REQ_CLOSE && r->closed && !strcmp(prepare_client_name(r->closed), name)))
			return behind_sync;
	}
	return false;
}

/* Whether an earlier part of the pipeline (up to a Sync or Query) is still unanswered. */
static bool part_unanswered(const ReqQueue *q)
{
	return queued(q, 1u << REQ_SYNC | 1u << REQ_QUERY);
}

/*
 * Whether the Parse at position `at` of client name `name` creates
 * statement `id` on a server that does not have it: sent there (not
 * answered by the pooler, not unnamed for a statement the server has),
 * with no Close of the statement ahead in its part of the pipeline
 * (client_parse()) and none of the name (skipped, it gives the name its
 * old statement back). Then the name exists exactly when that Parse
 * succeeded, on PostgreSQL and through the pooler alike.
 */
static bool parse_makes_stmt(const ReqQueue *q, uint32_t at, uint64_t id, const char *name)
{
	const Request *p = reqqueue_at(q, at);
	if (p->answer != ANS_CLIENT || p->stmt_id != id)
		return false;
	for (uint32_t i = at; i-- > 0;) {
		const Request *r = reqqueue_at(q, i);
		if (r->kind == REQ_SYNC)
			break;
		if (r->kind == REQ_CLOSE &&
		    (r->stmt_id == id || (r->closed && !strcmp(prepare_client_name(r->closed), name))))
			return false;
	}
	return true;
}

/*
 * Whether the server's copy of statement `id` (PGBOUNCER_<id>) is still
 * in question: the last Parse or Close of it the pooler queued (its own:
 * an eviction, a preparation again) is unanswered in an earlier part of
 * the pipeline, which an error may have the server skip. Deciding now
 * whether to prepare it could send a Parse of a statement the server kept
 * (42P05 under the pooler's name) or a Bind of one it never got. The
 * Parse that made client mapping `gen` itself is no question when it
 * creates the statement (parse_makes_stmt()) and nothing after it closes
 * or prepares the statement again: should it fail, the name fails with
 * it, as on PostgreSQL.
 */
static bool stmt_unsettled(const ReqQueue *q, uint64_t id, uint64_t gen, const char *name)
{
	bool behind_sync = false, touched_later = false;
	for (uint32_t i = q->count; i-- > 0;) {
		const Request *r = reqqueue_at(q, i);
		if (r->kind == REQ_SYNC) {
			behind_sync = true;
		} else if (gen && r->kind == REQ_PARSE && r->map_gen == gen) {
			return behind_sync && (touched_later || !parse_makes_stmt(q, i, id, name));
		} else if ((r->kind == REQ_PARSE || r->kind == REQ_CLOSE) && r->stmt_id == id) {
			if (behind_sync || !gen)
				return behind_sync;
			touched_later = true; /* in this part: the statement's fate is no longer the name's */
		}
	}
	return false;
}

/* The same for client statement `cs` (a Bind or Describe of it); an empty queue, the usual, settles it at once. */
static inline bool client_stmt_unsettled(const ReqQueue *q, const ClientStmt *cs)
{
	return q->count && stmt_unsettled(q, prepare_stmt_id(prepare_client_stmt(cs)), prepare_client_gen(cs),
	                                  prepare_client_name(cs));
}

/*
 * Where the later parts of the pipeline begin in the queue, for a request
 * being dropped: what is left of its own part comes before it
 * (reqqueue_server_special() drops the last first), so at the first Sync.
 */
static uint32_t later_parts(const ReqQueue *q)
{
	uint32_t i = 0;
	while (i < q->count && reqqueue_at(q, i)->kind != REQ_SYNC)
		i++;
	return i;
}

/*
 * A Parse of statement `id` prepared nothing: the pooler's Closes of it
 * in later parts (evictions) find nothing on the server, and if the
 * server skips them, nothing is left to put back (request_dropped()); up
 * to a later Parse of it, which prepares it anew. Unless a Close of it
 * ahead of the Parse in its part was skipped too: then the server kept
 * it. Returns whether such a later Parse is queued: the server's set has
 * that Parse's entry.
 */
static bool parse_came_to_nothing(ReqQueue *q, uint64_t id)
{
	uint32_t later = later_parts(q);
	bool kept = false;
	for (uint32_t i = 0; i < later; i++) {
		const Request *r = reqqueue_at(q, i);
		if (r->kind == REQ_CLOSE && r->stmt_id == id)
			kept = true;
	}
	for (uint32_t i = later; i < q->count; i++) {
		Request *r = reqqueue_at(q, i);
		if (r->stmt_id != id)
			continue;
		if (r->kind == REQ_PARSE)
			return true;
		if (r->kind == REQ_CLOSE && !kept)
			r->dropped_ahead = true;
	}
	return false;
}

/*
 * Whether a later part closes statement `id` again: that Close decides
 * whether the server has it, and puts it back itself if skipped.
 */
static bool closed_later(const ReqQueue *q, uint64_t id)
{
	for (uint32_t i = later_parts(q); i < q->count; i++) {
		const Request *r = reqqueue_at(q, i);
		if (r->kind == REQ_CLOSE && r->stmt_id == id)
			return true;
	}
	return false;
}

/* Whether a later part changes the unnamed statement again. */
static bool unnamed_changed_later(const ReqQueue *q)
{
	for (uint32_t i = later_parts(q); i < q->count; i++) {
		if (changes_unnamed(reqqueue_at(q, i)))
			return true;
	}
	return false;
}

/* A request the server will never answer: what it prepared never happened. */
static void request_dropped(Request *r, void *arg)
{
	PgSocket *s = arg;
	if (r->closed && s->link) {
		/* a Close the server skipped: PostgreSQL keeps the statement, so the name stays the client's */
		prepare_client_reattach(&s->link->stmts, r->closed);
		r->closed = NULL;
		return;
	}
	if (r->kind == REQ_CLOSE && r->stmt_id) {
		/* an eviction the server skipped: the statement is still there, unless dropped ahead of it */
		if (r->dropped_ahead || closed_later(&s->rq, r->stmt_id))
			return;
		PreparedStmt *ps = prepare_stmt_by_id(r->stmt_id);
		if (!ps)
			/*
			 * Nobody holds it any more (an eviction's was the last
			 * reference, or client_parse()'s Parse behind the Close
			 * was skipped too and took it): the server's statement
			 * stays all the same, to be counted and closed in due
			 * course, or each such skip leaves one more behind.
			 */
			prepare_server_add_stand_in(&s->sstmts, r->stmt_id, request_name(r));
		else if (!prepare_server_has(&s->sstmts, ps, false))
			prepare_server_add(&s->sstmts, ps);
		return;
	}
	if (changes_unnamed(r)) {
		/*
		 * Skipped, the server's unnamed statement is still whoever's it
		 * was (a failed Parse leaves none): nobody's, a later Bind of it
		 * closes it first. Unless a later part of the pipeline changes
		 * it again: what the pooler recorded for that one holds.
		 */
		if (!unnamed_changed_later(&s->rq))
			s->unnamed_owner = 0;
		return;
	}
	if (r->kind != REQ_PARSE)
		return;
	if (r->stmt_id) {
		if (!parse_came_to_nothing(&s->rq, r->stmt_id))
			prepare_server_remove_id(&s->sstmts, r->stmt_id);
	}
	if (r->map_gen && s->link)
		prepare_client_remove_gen(&s->link->stmts, r->map_gen);
}

/* Close the least recently used statements beyond max_prepared_statements (answers swallowed). */
static void evict_statements(PgSocket *c, PgSocket *s, const PreparedStmt *keep)
{
	PreparedStmt *old;
	while ((old = prepare_server_evict(&s->sstmts, (unsigned)wk.cf.g.max_prepared_statements, keep))) {
		put_simple_msg(server_msg(c), 'C', 'S', prepare_stmt_name(old));
		reqqueue_push(&s->rq, REQ_CLOSE, ANS_SWALLOW);
		reqqueue_tail(&s->rq)->stmt_id = prepare_stmt_id(old); /* put back if the server skips the Close */
		if (prepare_stmt_retired(old))
			/* a stand-in's name is not its id's: put back under its name (request_dropped()) */
			request_set_name(reqqueue_tail(&s->rq), prepare_stmt_name(old));
		prepare_stmt_unref(old);
	}
}

/* The Parse message itself, queued with what its failure undoes (stmt_id: on the server; map_gen: the client's name). */
static void send_parse_msg(PgSocket *c, PgSocket *s, PreparedStmt *ps, ReqAnswer answer, uint64_t stmt_id,
                           uint64_t map_gen, bool unnamed)
{
	size_t keylen;
	const uint8_t *key = prepare_stmt_key(ps, &keylen);
	PktBuf *pb = server_msg(c);
	pktbuf_start_msg(pb, 'P');
	pktbuf_put_string(pb, unnamed ? "" : prepare_stmt_name(ps));
	if (unnamed)
		s->unnamed_owner = 0; /* the pooler's, not the client's */
	pktbuf_put_bytes(pb, key, keylen);
	pktbuf_finish_msg(pb);
	reqqueue_push(&s->rq, REQ_PARSE, answer);
	Request *r = reqqueue_tail(&s->rq);
	r->stmt_id = stmt_id;
	r->map_gen = map_gen;
	c->pool->stats.server_parse_count++;
}

/* Send Parse(PGBOUNCER_<id>, body) to the server and record the statement there. */
static void send_parse(PgSocket *c, PgSocket *s, PreparedStmt *ps, ReqAnswer answer, uint64_t map_gen)
{
	prepare_server_add(&s->sstmts, ps);
	evict_statements(c, s, ps); /* their Close goes before the Parse */
	send_parse_msg(c, s, ps, answer, prepare_stmt_id(ps), map_gen, false);
}

/* The pooler's Describe of a statement it prepares, whose answer it keeps to itself (ANS_LEARN, ANS_CHECK). */
static Request *send_describe(PgSocket *c, PgSocket *s, PreparedStmt *ps, ReqAnswer answer)
{
	put_simple_msg(server_msg(c), 'D', 'S', prepare_stmt_name(ps));
	reqqueue_push(&s->rq, REQ_DESCRIBE, answer);
	Request *r = reqqueue_tail(&s->rq);
	r->stmt_id = prepare_stmt_id(ps);
	return r;
}

/* What ensure_prepared() did for a client's Bind or Describe. */
typedef enum Prepared {
	PREP_READY,   /* the statement is on the server (or will be, its Parse ahead): send the message */
	PREP_WAIT,    /* prepared again: the message waits for the description (SB_WAIT) */
	PREP_REFUSED, /* its result type changed: the message is answered with the pooler's 0A000 */
} Prepared;

/*
 * The client's statement is not on the server: prepare it from its text,
 * with a Describe whose answer the client never sees. The client was given
 * the statement's result type: the message waits (one round trip, a Flush
 * making the server answer at once) and the answer decides (described()),
 * so that a Bind of a statement whose columns changed never runs
 * (doc/transaction.md, "Schema changes").
 */
static __attribute__((noinline)) Prepared prepare_again(PgSocket *c, PgSocket *s, PreparedStmt *ps)
{
	if (prepare_stmt_retired(ps)) {
		refuse_changed(c, s);
		return PREP_REFUSED;
	}
	send_parse(c, s, ps, ANS_SWALLOW, 0);
	/*
	 * Also when the type is not known yet (its first Describe is still
	 * unanswered): the answer records it, and the wait keeps the messages
	 * behind from relying on a Parse that the server may skip after an
	 * error ahead of it.
	 */
	send_describe(c, s, ps, ANS_CHECK);
	pktbuf_put_bytes(server_msg(c), FLUSH_MSG, sizeof(FLUSH_MSG));
	s->held_for_check = true;
	return PREP_WAIT;
}

/* Make sure the statement exists on the linked server (a Parse the client never sees if not). */
static inline Prepared ensure_prepared(PgSocket *c, PgSocket *s, PreparedStmt *ps)
{
	if (prepare_server_has(&s->sstmts, ps, true))
		return PREP_READY;
	return prepare_again(c, s, ps);
}

/* ---- client messages ---- */

/*
 * The client's parse environment: its tracked parameters but
 * application_name, which PostgreSQL reads when it parses a text (a
 * timestamptz literal without an offset in TimeZone, a date in DateStyle,
 * the bytes in client_encoding). Clients whose environments differ never
 * share a server-side statement (doc/transaction.md, "Protocol-level
 * prepared statements"). The bytes are good until the next call.
 */
const uint8_t *txn_client_env(const PgSocket *c, size_t *len)
{
	static PktBuf pb;
	static int app = -2;
	if (app == -2)
		app = var_index("application_name");
	pktbuf_reset(&pb);
	for (int i = 0; i < var_count(); i++) {
		const char *v = sock_var(c, i);
		if (i == app)
			continue;
		pktbuf_put_u8(&pb, v != NULL);
		if (v)
			pktbuf_put_string(&pb, v);
	}
	*len = pb.len;
	return pb.buf;
}

/*
 * Whether a Query, FunctionCall or Execute is still unanswered: it may be
 * a DEALLOCATE ALL or DISCARD ALL that drops the server's statements
 * before what the client sent behind it.
 */
static bool may_drop_statements(ReqQueue *q)
{
	return queued(q, 1u << REQ_QUERY | 1u << REQ_EXECUTE);
}

/* Parse with a statement name: map it, and prepare it on the server unless it is there already. */
static SBufAction client_parse(PgSocket *c, PgSocket *s, const uint8_t *body, uint32_t blen)
{
	const uint8_t *nul = txn_find_nul(body, body + blen);
	if (!nul) {
		disconnect_client(c, true, "invalid Parse message");
		return SB_CLOSED;
	}
	const char *name = (const char *)body;
	if (!*name) {
		reqqueue_push(&s->rq, REQ_PARSE, ANS_CLIENT);
		return SB_FORWARD;
	}
	ClientStmt *taken = prepare_client_find(&c->stmts, name);
	if (unsettled(&s->rq, name, taken)) {
		/* whether the name is taken: the server's answer to a Parse or Close of it ahead decides */
		s->held_for_check = true; /* offered again once that is answered or skipped */
		return SB_WAIT;
	}
	if (taken && may_drop_statements(&s->rq)) {
		/*
		 * The same for a Query or Execute ahead: a DEALLOCATE ALL or
		 * DISCARD ALL frees every name. It may be in this part of the
		 * pipeline, not yet ended by a Sync: a Flush has the server
		 * answer it.
		 */
		s->held_for_check = true;
		pktbuf_put_bytes(server_msg(c), FLUSH_MSG, sizeof(FLUSH_MSG));
		return SB_WAIT;
	}
	size_t keylen = (size_t)(body + blen - (nul + 1));
	size_t envlen;
	const uint8_t *env = txn_client_env(c, &envlen);
	PreparedStmt *ps = prepare_stmt_get_in(body + (blen - keylen), keylen, env, envlen);
	if (s->rq.count && stmt_unsettled(&s->rq, prepare_stmt_id(ps), 0, NULL)) {
		prepare_stmt_unref(ps);
		s->held_for_check = true; /* whether the server has the statement: its answer decides */
		return SB_WAIT;
	}
	if (s->txn_status == 'T' && prepare_server_has(&s->sstmts, ps, false) && part_unanswered(&s->rq)) {
		/*
		 * The pooler would answer this Parse itself, but an error ahead
		 * fails the transaction, and PostgreSQL then refuses it (25P02).
		 */
		prepare_stmt_unref(ps);
		s->held_for_check = true;
		return SB_WAIT;
	}
	c->pool->stats.client_parse_count++;
	if (taken) {
		/*
		 * PostgreSQL's own answer, 42P05, with the error state it brings.
		 * It parses the text before it looks at the name, so a text that
		 * fails (syntax, an unknown table, a failed transaction) gets its
		 * own error instead: one the server does not have is prepared
		 * there first, its success swallowed, its error the client's.
		 */
		if (!prepare_server_has(&s->sstmts, ps, false))
			send_parse(c, s, ps, ANS_SWALLOW, 0);
		prepare_stmt_unref(ps);
		/* PgBouncer's log line for it, at its level (doc/transaction.md "Errors a client can get") */
		slog(LG_ERROR, c, "prepared statement '%s' was already prepared", name);
		char err[160];
		snprintf(err, sizeof(err), "42P05prepared statement \"%.100s\" already exists", name);
		refuse(c, s, "pgbouncer_duplicate_prepared_statement", err);
		return SB_CONSUMED;
	}
	ClientStmt *cs = prepare_client_add(&c->stmts, name, ps);
	if (s->txn_status == 'E' && !may_drop_statements(&s->rq)) {
		/*
		 * A failed transaction: PostgreSQL refuses a Parse (25P02, and the
		 * name stays free) unless it is ROLLBACK, COMMIT and the like. The
		 * server decides: the statement goes to it, and a failure undoes
		 * the mapping. If the server has it already, the Parse goes
		 * unnamed (a named one would only say "already exists"). Only a
		 * Query or Execute ahead can end the failed block first: then the
		 * Parse is sent as below, behind a Close.
		 */
		bool had = prepare_server_has(&s->sstmts, ps, false);
		if (!had)
			prepare_server_add(&s->sstmts, ps);
		send_parse_msg(c, s, ps, ANS_CLIENT, had ? 0 : prepare_stmt_id(ps), prepare_client_gen(cs), had);
	} else if (prepare_server_has(&s->sstmts, ps, true) && !may_drop_statements(&s->rq)) {
		reqqueue_push(&s->rq, REQ_PARSE, ANS_POOLER);
		reqqueue_tail(&s->rq)->map_gen = prepare_client_gen(cs);
		answer_own_requests(s);
	} else {
		if (prepare_server_has(&s->sstmts, ps, false)) {
			/*
			 * What is ahead may drop the server's statement
			 * (check_discard()): the Parse goes to the server, behind
			 * a Close of it, and holds either way. If the server
			 * skips both, the statement is put back as after a
			 * skipped eviction.
			 */
			prepare_server_remove_id(&s->sstmts, prepare_stmt_id(ps));
			put_simple_msg(server_msg(c), 'C', 'S', prepare_stmt_name(ps));
			reqqueue_push(&s->rq, REQ_CLOSE, ANS_SWALLOW);
			reqqueue_tail(&s->rq)->stmt_id = prepare_stmt_id(ps);
		}
		/* its result type is learnt from a Describe behind it: the client's later Binds rely on it */
		send_parse(c, s, ps, ANS_CLIENT, prepare_client_gen(cs));
		Request *r = send_describe(c, s, ps, ANS_LEARN);
		r->map_gen = prepare_client_gen(cs);
		request_set_name(r, name);
	}
	prepare_stmt_unref(ps); /* the mapping holds it */
	return SB_CONSUMED;
}

/*
 * Whether a Bind/Describe naming statement `name` goes to the server under
 * another name: every named one does. The client's own statements become
 * their PGBOUNCER_<n>; a name the client never prepared becomes one that
 * exists on no server, so that it gets PostgreSQL's 26000 (with its own
 * name in the text) and never a statement someone else left on the shared
 * server, neither the pooler's nor one made with SQL PREPARE.
 */
static bool renamed(PgSocket *c, const char *name, ClientStmt **cs)
{
	*cs = *name ? prepare_client_find(&c->stmts, name) : NULL;
	return *name != '\0';
}

/*
 * A statement about to be prepared again goes to the server in the
 * client's settings of now, which may differ from those it was first
 * parsed in (a SET since): that is another reading of the text, so the
 * client's name moves to the entry of its text in the settings of now
 * (keeping the result type the client was given, which the Describe
 * behind the Parse checks). Else the server would hold, under the old
 * entry's name, a statement that other clients of the old settings take
 * for theirs (doc/transaction.md, "Protocol-level prepared statements").
 */
static PreparedStmt *in_current_env(PgSocket *c, ClientStmt *cs)
{
	PreparedStmt *ps = prepare_client_stmt(cs);
	size_t envlen, oldlen, keylen;
	const uint8_t *env = txn_client_env(c, &envlen);
	const uint8_t *old = prepare_stmt_env(ps, &oldlen);
	if (prepare_stmt_retired(ps) || (envlen == oldlen && memcmp(env, old, envlen) == 0))
		return ps;
	const uint8_t *key = prepare_stmt_key(ps, &keylen);
	PreparedStmt *now = prepare_stmt_get_described(key, keylen, env, envlen, prepare_stmt_desc(ps));
	prepare_client_set_stmt(cs, now); /* may free ps */
	prepare_stmt_unref(now);          /* the mapping holds it */
	return now;
}

/* The server-side name for a renamed statement: prepared there first if it is the client's (*st says how). */
static const char *server_name(PgSocket *c, PgSocket *s, ClientStmt *cs, Prepared *st)
{
	if (!cs) {
		*st = PREP_READY;
		return PREPARE_NAME_PREFIX "0"; /* numbering starts at 1: no server has it */
	}
	PreparedStmt *ps = prepare_client_stmt(cs);
	if (!prepare_server_has(&s->sstmts, ps, true))
		ps = in_current_env(c, cs);
	*st = ensure_prepared(c, s, ps);
	return prepare_stmt_name(ps);
}

/* Bind: portal name, statement name, the rest. */
static SBufAction client_bind(PgSocket *c, PgSocket *s, const uint8_t *data, uint32_t avail, uint32_t len)
{
	const uint8_t *rest;
	const char *stmt = txn_bind_stmt_name(data, avail, &rest);
	if (!stmt) {
		if (avail < len)
			return SB_NEED_FULL;
		disconnect_client(c, true, "invalid Bind message");
		return SB_CLOSED;
	}
	ClientStmt *cs;
	bool rename = renamed(c, stmt, &cs);
	if (rename && avail < len)
		return SB_NEED_FULL; /* renamed below: the whole message is needed */
	if (!rename) {
		reqqueue_push(&s->rq, REQ_BIND, ANS_CLIENT);
		return SB_FORWARD;
	}
	if (cs ? client_stmt_unsettled(&s->rq, cs) : unsettled(&s->rq, stmt, NULL)) {
		/* a Parse or Close of the name ahead may yet be skipped: its answer decides */
		s->held_for_check = true;
		return SB_WAIT;
	}
	Prepared st;
	const char *name = server_name(c, s, cs, &st); /* may queue a Parse first: before the message is written */
	if (st == PREP_WAIT)
		return SB_WAIT; /* offered again once the description is in */
	c->pool->stats.bind_count++;
	if (st == PREP_REFUSED)
		return SB_CONSUMED;
	/* the same Bind with the server's statement name, written in one piece */
	const uint8_t *portal = data + 5;
	size_t portal_len = (size_t)((const uint8_t *)stmt - portal); /* with its NUL */
	size_t name_len = strlen(name) + 1, rest_len = (size_t)(data + len - rest);
	size_t body = 4 + portal_len + name_len + rest_len;
	uint8_t *p = pktbuf_append(server_msg(c), 1 + body);
	p[0] = 'B';
	p[1] = (uint8_t)(body >> 24);
	p[2] = (uint8_t)(body >> 16);
	p[3] = (uint8_t)(body >> 8);
	p[4] = (uint8_t)body;
	memcpy(p + 5, portal, portal_len);
	memcpy(p + 5 + portal_len, name, name_len);
	memcpy(p + 5 + portal_len + name_len, rest, rest_len);
	reqqueue_push(&s->rq, REQ_BIND, ANS_CLIENT);
	request_set_name(reqqueue_tail(&s->rq), stmt);
	reqqueue_tail(&s->rq)->stmt_id = cs ? prepare_stmt_id(prepare_client_stmt(cs)) : 0;
	return SB_CONSUMED;
}

/* Describe or Close of a statement ('S') or portal ('P'). */
static SBufAction client_describe_close(PgSocket *c, PgSocket *s, const PktHdr *hdr, const uint8_t *data,
                                        uint32_t avail)
{
	ReqKind kind = hdr->type == 'D' ? REQ_DESCRIBE : REQ_CLOSE;
	if (avail < hdr->len)
		return SB_NEED_FULL; /* a name is short: this is rare */
	uint8_t what;
	const char *name = txn_describe_close_name(data, hdr->len, &what);
	if (!name) {
		disconnect_client(c, true, "invalid %s message", hdr->type == 'D' ? "Describe" : "Close");
		return SB_CLOSED;
	}
	if (what != 'S' || !*name) {
		reqqueue_push(&s->rq, kind, ANS_CLIENT);
		return SB_FORWARD;
	}
	ClientStmt *cs;
	bool rename = renamed(c, name, &cs);
	if (kind == REQ_CLOSE || !cs ? unsettled(&s->rq, name, cs) : client_stmt_unsettled(&s->rq, cs)) {
		/* a Parse or Close of the name ahead may yet be skipped: the server's answer decides */
		s->held_for_check = true;
		return SB_WAIT;
	}
	if (kind == REQ_CLOSE) {
		/* the name is the client's only: the server keeps the statement for others */
		if (cs)
			prepare_client_detach(&c->stmts, cs);
		reqqueue_push(&s->rq, REQ_CLOSE, ANS_POOLER);
		reqqueue_tail(&s->rq)->closed = cs;
		answer_own_requests(s);
		return SB_CONSUMED;
	}
	if (!rename) {
		reqqueue_push(&s->rq, REQ_DESCRIBE, ANS_CLIENT);
		return SB_FORWARD;
	}
	Prepared st;
	const char *sname = server_name(c, s, cs, &st); /* may queue a Parse first: before the message is started */
	if (st == PREP_WAIT)
		return SB_WAIT;
	if (st == PREP_REFUSED)
		return SB_CONSUMED;
	put_simple_msg(server_msg(c), 'D', 'S', sname);
	reqqueue_push(&s->rq, REQ_DESCRIBE, ANS_CLIENT);
	request_set_name(reqqueue_tail(&s->rq), name);
	reqqueue_tail(&s->rq)->stmt_id = cs ? prepare_stmt_id(prepare_client_stmt(cs)) : 0;
	return SB_CONSUMED;
}

/*
 * CopyData, CopyDone, CopyFail. Before the server has answered what the
 * client sent, its COPY may not have begun: a client may send the data
 * and the end of COPY right behind the Query, without waiting for
 * CopyInResponse (asyncpg does), and they go to the server, which takes
 * them for the COPY or, if the COPY failed, ignores them; the end is
 * marked on the request it follows, for the CopyInResponse to come. Once
 * the server has left COPY (it failed the COPY and answered), what the
 * client still sends means nothing to it: dropped, and the client's end
 * of COPY lets the server go back.
 */
static SBufAction client_copy_msg(PgSocket *c, PgSocket *s, char type)
{
	if (s->copy_mode) {
		if (type != 'd')
			s->rq.copy_in = false;
		return SB_FORWARD;
	}
	if (s->rq.count > 0) {
		if (type != 'd')
			reqqueue_tail(&s->rq)->copy_end = true;
		return SB_FORWARD;
	}
	s->rq.copy_in = false;
	if (s->ready && reqqueue_release_decision(s->link_mode, s->txn_status, &s->rq) == RELEASE_RETURN)
		txn_release(s);
	return SB_SKIP;
}

/*
 * The unnamed statement lives on the server until the next Parse of it,
 * across transactions, and a client may bind it in a later round trip
 * (pgx's QueryExecModeDescribeExec). When the server's unnamed statement
 * is another client's, a Bind or Describe of it would run that client's
 * query: the pooler closes it first, so that the client gets PostgreSQL's
 * answer for a server without one (doc/transaction.md, "Protocol-level
 * prepared statements").
 */
static SBufAction unnamed_of_another(PgSocket *c, PgSocket *s, ReqKind kind, const uint8_t *data, uint32_t avail,
                                     uint32_t len)
{
	if (avail < len)
		return SB_NEED_FULL;
	put_simple_msg(server_msg(c), 'C', 'S', "");
	reqqueue_push(&s->rq, REQ_CLOSE, ANS_SWALLOW);
	pktbuf_put_bytes(server_msg(c), data, len);
	reqqueue_push(&s->rq, kind, ANS_CLIENT);
	s->unnamed_owner = c->id;
	return SB_CONSUMED;
}

/* Whether a Bind (in avail bytes of len) or Describe names the unnamed statement: -1 when more bytes are needed. */
static int names_unnamed_stmt(char type, const uint8_t *data, uint32_t avail, uint32_t len)
{
	if (type == 'B') {
		const uint8_t *rest;
		const char *stmt = txn_bind_stmt_name(data, avail, &rest);
		if (!stmt)
			return avail < len ? -1 : 0; /* malformed: the server says so */
		return *stmt == '\0';
	}
	if (avail < 7)
		return avail < len ? -1 : 0;
	return data[5] == 'S' && data[6] == 0;
}

/*
 * A Bind or Describe that may name the unnamed statement while it is
 * another client's (unnamed_of_another()) or while what made it this
 * client's may yet be skipped (unsettled()): SB_FORWARD when it
 * does not, or neither is the case.
 */
static SBufAction guard_unnamed(PgSocket *c, PgSocket *s, const PktHdr *hdr, const uint8_t *data, uint32_t avail)
{
	int unnamed = names_unnamed_stmt(hdr->type, data, avail, hdr->len);
	if (unnamed < 0)
		return SB_NEED_FULL;
	if (!unnamed)
		return SB_FORWARD;
	if (s->unnamed_owner != c->id)
		return unnamed_of_another(c, s, hdr->type == 'B' ? REQ_BIND : REQ_DESCRIBE, data, avail, hdr->len);
	if (unsettled(&s->rq, NULL, NULL)) {
		s->held_for_check = true; /* offered again once that is answered or skipped */
		return SB_WAIT;
	}
	return SB_FORWARD;
}

/*
 * Requests a linked server may owe answers to before its client's next
 * message waits (the queue's full), and how few let it go on. Without a
 * bound a client that sends and does not read would make the queue grow
 * as fast as it sends while a query runs ahead: the requests the pooler
 * answers itself (a Close of an unknown name, a Parse the server has
 * already) never reach the server, whose socket would push back. A client
 * message adds a few requests (its own, and a Close, Parse and Describe
 * of the pooler's): the ring stays within 4096 entries, about 300 kB.
 */
#define QUEUE_HOLD   4000
#define QUEUE_RESUME 1024

/*
 * The client's message waits for answers. The server is sent a Flush, so
 * that it sends the answers it keeps until a Sync, a Flush or a full
 * buffer: they may be all that the queue waits for.
 */
static __attribute__((noinline)) SBufAction hold_until_answered(PgSocket *c, PgSocket *s)
{
	if (!s->rq.full) {
		pktbuf_put_bytes(server_msg(c), FLUSH_MSG, sizeof(FLUSH_MSG));
		s->rq.full = true;
	}
	return SB_WAIT;
}

static SBufAction client_message(PgSocket *c, const PktHdr *hdr, const uint8_t *data, uint32_t avail)
{
	PgSocket *s = c->link;
	ReqQueue *q = &s->rq;
	if (q->skipping && hdr->type != 'S') {
		/* the server ignores everything up to the next Sync after an error: so do we */
		if (hdr->type == 'c' || hdr->type == 'f')
			q->copy_in = false;
		return SB_SKIP;
	}
	/* COPY data and Flush add no request; during COPY FROM STDIN the server waits for the client */
	if (__builtin_expect(q->count >= QUEUE_HOLD, 0) && !q->copy_in && hdr->type != 'd' && hdr->type != 'c' &&
	    hdr->type != 'f' && hdr->type != 'H')
		return hold_until_answered(c, s);
	switch (hdr->type) {
	case 'Q':
	case 'F':
		reqqueue_push(q, REQ_QUERY, ANS_CLIENT);
		return SB_FORWARD;
	case 'S':
		q->skipping = false;
		if (q->copy_in)
			return SB_FORWARD; /* ignored by the server during COPY FROM STDIN */
		reqqueue_push(q, REQ_SYNC, ANS_CLIENT);
		return SB_FORWARD;
	case 'P':
		if (avail < 6)
			return SB_NEED_FULL;
		if (data[5] == 0)
			s->unnamed_owner = c->id;
		if (!tracks_statements(s)) {
			reqqueue_push(q, REQ_PARSE, ANS_CLIENT);
			return SB_FORWARD;
		}
		if (avail < hdr->len)
			return SB_NEED_FULL;
		return client_parse(c, s, data + 5, hdr->len - 5);
	case 'B':
		if (s->unnamed_owner != c->id || q->count) {
			SBufAction act = guard_unnamed(c, s, hdr, data, avail);
			if (act != SB_FORWARD)
				return act;
		}
		if (!tracks_statements(s)) {
			reqqueue_push(q, REQ_BIND, ANS_CLIENT);
			return SB_FORWARD;
		}
		return client_bind(c, s, data, avail, hdr->len);
	case 'D':
	case 'C':
		if (hdr->type == 'D' && (s->unnamed_owner != c->id || q->count)) {
			SBufAction act = guard_unnamed(c, s, hdr, data, avail);
			if (act != SB_FORWARD)
				return act;
		} else if (hdr->type == 'C' && s->unnamed_owner != c->id &&
		           names_unnamed_stmt('D', data, avail, hdr->len) > 0) {
			/*
			 * The server's unnamed statement is not this client's: the client
			 * has none here, and PostgreSQL answers a Close of a statement
			 * that does not exist with CloseComplete. The other's stays.
			 */
			reqqueue_push(q, REQ_CLOSE, ANS_POOLER);
			answer_own_requests(s);
			return SB_CONSUMED;
		}
		if (!tracks_statements(s)) {
			reqqueue_push(q, hdr->type == 'D' ? REQ_DESCRIBE : REQ_CLOSE, ANS_CLIENT);
			return SB_FORWARD;
		}
		return client_describe_close(c, s, hdr, data, avail);
	case 'E':
		reqqueue_push(q, REQ_EXECUTE, ANS_CLIENT);
		return SB_FORWARD;
	case 'd':
	case 'c':
	case 'f':
		return client_copy_msg(c, s, hdr->type);
	default: /* Flush */
		if (hdr->len != 5) {
			/*
			 * PostgreSQL answers a Flush with a body with an error and
			 * skips to the next Sync: an answer no request waits for, and
			 * a server that would ignore the next client's messages.
			 */
			disconnect_client(c, true, "invalid Flush message");
			return SB_CLOSED;
		}
		return SB_FORWARD;
	}
}

SBufAction txn_client_packet(PgSocket *c, const PktHdr *hdr, const uint8_t *data, uint32_t avail)
{
	SBufAction act = client_message(c, hdr, data, avail);
	txn_check_invariants(c);
	return act;
}

/* ---- server messages ---- */

/* Whether the sbuf is in the middle of a message it passes on (a release would cut it in two). */
static inline bool mid_forward(const SBuf *sb)
{
	return sb->pkt_remain > 0 && sb->pkt_forward;
}

/* Whether the client side has nothing half-sent to the server (no message cut in two by a release). */
static bool client_input_clean(const PgSocket *c)
{
	return c->sb.send_pos == c->sb.send_end && !mid_forward(&c->sb);
}

/* Unlink a server whose client is done with it, and return it to the pool. */
void txn_release(PgSocket *s)
{
	PgSocket *c = s->link;
	slog_debug(s, "released by C-%p (transaction end)", (const void *)c);
	txn_check_invariants(s);
	if (c) {
		/* bytes on their way in either direction are whole messages: they leave with their sockets */
		pgb_assert(!mid_forward(&c->sb) && !mid_forward(&s->sb));
		sbuf_forward_own(&c->sb, NULL, 0, true);
		sbuf_forward_own(&s->sb, NULL, 0, true);
		pgb_assert(client_input_clean(c));
		c->link = NULL;
		c->sb.dst = NULL;
		/* retiring (-R) or draining: between two transactions it may move, once its answer is sent (worker.c) */
		if (wk.handoff_fd >= 0 || wk.drain_fd >= 0)
			wk.handoff_due = true;
	}
	s->link = NULL;
	s->sb.dst = NULL;
	s->held_for_check = false;
	reqqueue_clear(&s->rq, NULL, NULL);
	if (c)
		txn_check_invariants(c);
	server_reset_or_ready(s, false);
}

#ifdef PGB_CASSERT
/* Invariants 1-3 of the top of this file, for a client and its link. */
static void check_client(const PgSocket *c)
{
	const PgSocket *s = c->link;
	pgb_assert(!c->is_server);
	if (c->state == CL_JUSTFREE || c->state == CL_FREE)
		return; /* closed: what it was linked to is the closing's */
	if (!s) {
		pgb_assert(c->sb.dst == NULL);
		return;
	}
	pgb_assert(s->is_server && s->link == c);
	pgb_assert(c->state != CL_WAITING);
	if (s->state != SV_LOGIN) /* a replication server's login: linked, nothing forwarded yet */
		pgb_assert(c->state == CL_ACTIVE && c->sb.dst == &s->sb);
}

/* Invariants 1, 2 and 4-7 of the top of this file, for a server and its link. */
static void check_server(const PgSocket *s)
{
	const ReqQueue *q = &s->rq;
	const PgSocket *c = s->link;
	pgb_assert(s->is_server);
	pgb_assert(q->cap == 0 ? q->count == 0 && q->head == 0
	                       : (q->cap & (q->cap - 1)) == 0 && q->count <= q->cap && q->head < q->cap);
	if (s->state == SV_JUSTFREE || s->state == SV_FREE)
		return; /* closed: its queue goes with it */
	if (!c) {
		pgb_assert(s->sb.dst == NULL && !s->held_for_check && !q->full);
	} else {
		pgb_assert(!c->is_server && c->link == s);
		if (s->state != SV_LOGIN)
			pgb_assert(s->state == SV_ACTIVE && s->sb.dst == &c->sb);
		if (s->link_mode == POOL_SESSION)
			pgb_assert(q->count == 0 && !q->skipping && !q->copy_in && !q->full && !s->held_for_check);
	}
	switch (s->state) {
	case SV_IDLE:
	case SV_USED:
	case SV_TESTED:
	case SV_BEING_CANCELED:
		pgb_assert(!c && q->count == 0 && !q->skipping && !q->copy_in && !s->copy_mode && !s->setting_vars);
		break;
	default:
		break;
	}
}

void txn_check_invariants(const PgSocket *sock)
{
	const PgSocket *c = sock->is_server ? sock->link : sock;
	const PgSocket *s = sock->is_server ? sock : sock->link;
	if (c)
		check_client(c);
	if (s)
		check_server(s);
}
#endif

/*
 * A server linked in session mode whose pool has turned to transaction or
 * statement mode (RELOAD, SET pool_mode): at a ReadyForQuery outside a
 * transaction that answers everything its client sent (server.c counts
 * that), the link ends as a transaction's does, and the client's next
 * request gets a server under the new mode.
 */
bool txn_session_link_release(PgSocket *s, const uint8_t *data, uint32_t len)
{
	PgSocket *c = s->link;
	if (!c || !client_input_clean(c))
		return false;
	s->link_mode = (char)pool_effective_mode(s->pool);
	to_client(s, data, len);
	txn_release(s);
	return true;
}

/*
 * Whether a Parse queued behind the head, before position `end`, made the
 * client's name mapping `gen` or prepares statement `id` (0: not asked).
 */
static bool parsed_behind(const ReqQueue *q, uint32_t end, uint64_t gen, uint64_t id)
{
	for (uint32_t i = 1; i < end; i++) {
		const Request *r = reqqueue_at(q, i);
		if (r->kind == REQ_PARSE && ((gen && r->map_gen == gen) || (id && r->stmt_id == id)))
			return true;
	}
	return false;
}

/* Whether a Parse queued behind the head made the client's name mapping `gen` (prepare_client_clear_except()). */
static bool mapped_by_queue(uint64_t gen, void *arg)
{
	const ReqQueue *q = arg;
	return parsed_behind(q, q->count, gen, 0);
}

/* Whether statement `id` is on the server once what is queued behind the head has run: Parsed last, not Closed. */
static bool prepared_behind(uint64_t id, void *arg)
{
	ReqQueue *q = arg;
	bool there = false;
	for (uint32_t i = 1; i < q->count; i++) {
		const Request *r = reqqueue_at(q, i);
		if (r->stmt_id != id)
			continue;
		if (r->kind == REQ_PARSE)
			there = true;
		else if (r->kind == REQ_CLOSE && r->answer == ANS_SWALLOW)
			there = false;
	}
	return there;
}

/*
 * A DEALLOCATE ALL or DISCARD ALL ran (the head request's answer): what
 * was prepared before it is gone from the server, and so are the client's
 * names. What the client pipelined behind it runs after it: the
 * statements its Parses (and the pooler's) prepare there stay, on the
 * server and as the client's names; an eviction Close, or a client's
 * Close, of a statement dropped here has nothing to put back if the
 * server skips it after an error.
 */
static void check_discard(PgSocket *s, const uint8_t *data, uint32_t len)
{
	const char *tag = (const char *)data + 5;
	if (len < 6 || (tag[0] != 'D' && tag[0] != 'P') || data[len - 1] != 0)
		return; /* most tags are not DEALLOCATE/DISCARD/PREPARE: one byte tells */
	if ((strcmp(tag, "PREPARE") == 0 || strcmp(tag, "DEALLOCATE") == 0) && prepare_server_count(&s->sstmts) > 0) {
		/*
		 * SQL PREPARE or DEALLOCATE of one name on a server that holds the
		 * pooler's statements: it may have replaced one of them
		 * (PGBOUNCER_<n>, which pg_prepared_statements shows to any client
		 * of the pool) with other SQL, which another client's Bind would
		 * then run. The server is closed when released (doc/transaction.md).
		 */
		if (!s->close_needed)
			slog(LG_DEBUG, s,
			     "SQL %s on a server with the pooler's prepared statements: closes when released", tag);
		s->close_needed = true;
		return;
	}
	if (strcmp(tag, "DEALLOCATE ALL") != 0 && strcmp(tag, "DISCARD ALL") != 0)
		return;
	ReqQueue *q = &s->rq;
	prepare_server_clear_except(&s->sstmts, prepared_behind, q);
	for (uint32_t i = 1; i < q->count; i++) {
		Request *r = reqqueue_at(q, i);
		if (r->kind == REQ_CLOSE && r->answer == ANS_SWALLOW && r->stmt_id) {
			if (!parsed_behind(q, i, 0, r->stmt_id))
				r->dropped_ahead = true;
		} else if (r->closed && !parsed_behind(q, i, prepare_client_gen(r->closed), 0)) {
			prepare_client_free(r->closed);
			r->closed = NULL;
		}
	}
	if (s->link)
		prepare_client_clear_except(&s->link->stmts, mapped_by_queue, q);
}

void txn_server_discard_check(PgSocket *s, const uint8_t *data, uint32_t len)
{
	check_discard(s, data, len);
}

/*
 * The server's error for a request whose statement the pooler renamed, with
 * the client's statement name where PostgreSQL wrote the server-side one
 * (26000 "does not exist", a Bind with the wrong parameter count, ...);
 * every other field as the server sent it. False: nothing to rename.
 */
static bool rename_in_error(PgSocket *s, const char *client_name, const uint8_t *data, uint32_t len)
{
	PktBuf *pb = scratch();
	if (!txn_rename_in_error(pb, client_name, data, len))
		return false;
	to_client(s, pb->buf, pb->len);
	return true;
}

/*
 * The error the client sees for a failed request, when it is not the
 * server's own as sent: the pooler's (a reused statement name), or the
 * server's with the client's statement name in place of the server-side
 * one. False: the server's error goes through as it is.
 */
static bool own_error(PgSocket *s, const Request *req, const uint8_t *data, uint32_t len)
{
	const char *sqlstate = txn_error_sqlstate(data, len);
	/* in a failed transaction PostgreSQL refuses everything with 25P02 first: so do we */
	if (strcmp(sqlstate, "25P02") == 0)
		return false;
	if (request_name(req))
		return rename_in_error(s, request_name(req), data, len);
	if (req->answer != ANS_FAKE_ERROR)
		return false;
	char code[6];
	memcpy(code, req->error, 5);
	code[5] = 0;
	PktBuf pb;
	pktbuf_init(&pb, 128);
	if (strcmp(code, "0A000") != 0) {
		pktbuf_write_error(&pb, "ERROR", code, req->error + 5);
	} else {
		/*
		 * With the routine PostgreSQL names: drivers tell this error by it
		 * and prepare the statement again (asyncpg, pgjdbc).
		 */
		static const char *const fields[] = {"SERROR", "VERROR",       "C0A000",
		                                     NULL,     "Fplancache.c", "RRevalidateCachedQuery"};
		pktbuf_start_msg(&pb, 'E');
		for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
			if (fields[i]) {
				pktbuf_put_string(&pb, fields[i]);
				continue;
			}
			pktbuf_put_u8(&pb, 'M');
			pktbuf_put_string(&pb, req->error + 5);
		}
		pktbuf_put_u8(&pb, 0);
		pktbuf_finish_msg(&pb);
	}
	to_client(s, pb.buf, pb.len);
	pktbuf_free(&pb);
	return true;
}

/*
 * A renamed Bind failed with 0A000: after a table change, PostgreSQL
 * refuses a prepared statement whose result type would differ ("cached
 * plan must not change result type"). The statement is stale on every
 * server that has it, so the driver's new Parse of the same text must not
 * be answered from any of them: its registry entry is retired, and the
 * new Parse gets a new server-side name, prepared afresh on whichever
 * server the client holds then, the same one inside a transaction (a
 * retry after ROLLBACK TO SAVEPOINT). This server closes at release
 * (doc/transaction.md, "Schema changes").
 */
static void check_stale_statement(PgSocket *s, const Request *req, const uint8_t *data, uint32_t len)
{
	if (strcmp(txn_error_sqlstate(data, len), "0A000") != 0)
		return;
	PreparedStmt *ps = req->stmt_id ? prepare_stmt_by_id(req->stmt_id) : NULL;
	if (ps)
		prepare_stmt_retire(ps);
	if (s->close_needed)
		return;
	s->close_needed = true;
	s->stale_stmt = true;
	slog(LG_LOG, s, "a prepared statement's result type changed (0A000): closing the server at release");
}

/* Whether a Parse of statement `id` is queued (the pooler prepares it again behind the failed message). */
static bool parse_queued(const ReqQueue *q, uint64_t id)
{
	for (uint32_t i = 0; i < q->count; i++) {
		const Request *r = reqqueue_at(q, i);
		if (r->kind == REQ_PARSE && r->stmt_id == id)
			return true;
	}
	return false;
}

/*
 * A renamed Bind or Describe failed with 26000: the server no longer has
 * the statement the pooler listed there, dropped where the pooler cannot
 * see it (EXECUTE 'DEALLOCATE ALL' in a function or DO block, whose
 * CommandComplete says DO; an SQL DEALLOCATE of the server-side name). It
 * leaves the server's list, so that the next Bind of it, this client's or
 * another's, prepares it again: one error, not one at every use. Unless a
 * Parse of it is queued already (a later part of the pipeline prepares it
 * again): the server will have it.
 */
static void check_lost_statement(PgSocket *s, const Request *req, const uint8_t *data, uint32_t len)
{
	if (req->stmt_id && strcmp(txn_error_sqlstate(data, len), "26000") == 0 && !parse_queued(&s->rq, req->stmt_id))
		prepare_server_remove_id(&s->sstmts, req->stmt_id);
}

/*
 * The result type of a statement the pooler prepared on this server
 * differs from the one recorded for it: the server's statement is not the
 * one its clients know. The entry leaves the registry (a new Parse of the
 * text gets a new one) and the server's statement becomes a stand-in
 * closed in due course. A client whose own Parse prepared it (ANS_LEARN
 * with map_gen) was given the new type by the server: its name moves to a
 * new entry of that type. A client waiting on ANS_CHECK was given the old
 * one: its message gets PostgreSQL's 0A000, and the rest up to its Sync is
 * skipped, as PostgreSQL skips it.
 */
static void result_type_changed(PgSocket *s, const Request *req, PreparedStmt *ps, uint64_t desc)
{
	PgSocket *c = s->link;
	slog(LG_LOG, s, "prepared statement %s has a new result type%s", prepare_stmt_name(ps),
	     req->answer == ANS_CHECK ? ": its client gets 0A000" : "");
	prepare_stmt_retire(ps);
	ClientStmt *cs = c && req->map_gen ? prepare_client_find(&c->stmts, request_name(req)) : NULL;
	if (cs && (prepare_client_gen(cs) != req->map_gen || prepare_client_stmt(cs) != ps))
		cs = NULL;
	/* may free ps, unless cs holds it (the server's set need not: evicted meanwhile) */
	prepare_server_orphan(&s->sstmts, ps);
	if (cs) {
		size_t keylen, envlen;
		const uint8_t *key = prepare_stmt_key(ps, &keylen);
		const uint8_t *env = prepare_stmt_env(ps, &envlen);
		PreparedStmt *fresh = prepare_stmt_get_in(key, keylen, env, envlen);
		if (!prepare_stmt_desc(fresh))
			prepare_stmt_set_desc(fresh, desc);
		prepare_client_set_stmt(cs, fresh); /* may free ps */
		prepare_stmt_unref(fresh);
	}
	if (c && req->answer == ANS_CHECK) {
		refuse_changed(c, s);
		s->rq.skipping = true;
	}
}

/* The answer to the pooler's Describe (ANS_LEARN, ANS_CHECK): the statement's result type. */
static void described(PgSocket *s, const Request *req, const uint8_t *data, uint32_t len)
{
	uint64_t desc = txn_row_desc_hash(data, len);
	PreparedStmt *ps = prepare_server_find_id(&s->sstmts, req->stmt_id);
	if (!ps && req->stmt_id)
		/*
		 * Evicted or dropped by a DISCARD ALL after the Describe was sent (a
		 * pipeline): the answer still describes the statement as it was
		 * prepared. Its first description must not be lost, or the next
		 * re-prepare would learn the type instead of checking it.
		 */
		ps = prepare_stmt_by_id(req->stmt_id);
	if (!ps || !desc)
		return; /* nobody uses it any more: nothing to compare */
	uint64_t known = prepare_stmt_desc(ps);
	if (!known)
		prepare_stmt_set_desc(ps, desc);
	else if (known != desc)
		result_type_changed(s, req, ps, desc);
}

/* The client's message that waited for an ANS_CHECK, or for room in the queue, goes on. */
static void resume_held(PgSocket *s)
{
	s->held_for_check = false;
	s->rq.full = false;
	if (s->link)
		sbuf_continue(&s->link->sb);
}

/* After the pooler's own answers: a client message held for room in the queue goes on. */
static void resume_if_room(PgSocket *s)
{
	if (__builtin_expect(s->rq.full, 0) && s->rq.count <= QUEUE_RESUME)
		resume_held(s);
}

/* The answer goes to the client, then whatever the pooler answers itself after it. */
static SBufAction deliver_then_own(PgSocket *s, const uint8_t *data, uint32_t len)
{
	to_client(s, data, len);
	answer_own_requests(s);
	resume_if_room(s);
	return SB_CONSUMED;
}

static SBufAction server_message(PgSocket *s, const PktHdr *hdr, const uint8_t *data, uint32_t avail)
{
	PgSocket *c = s->link;
	char t = hdr->type;
	/* messages that are read whole: short answers, and the ones that change the queue's meaning */
	switch (t) {
	case 'Z':
	case '1':
	case '2':
	case '3':
	case 'n':
	case 's':
	case 'C':
	case 'I':
	case 'E':
	case 'T':
		if (avail < hdr->len)
			return SB_NEED_FULL;
		break;
	case 'G':
		break;
	case 't': {
		/* ParameterDescription: the pooler's own Describe keeps it */
		const Request *h = reqqueue_head(&s->rq);
		s->pool->stats.server_bytes += hdr->len;
		return h && h->kind == REQ_DESCRIBE && h->answer >= ANS_LEARN ? SB_SKIP : SB_FORWARD;
	}
	default:
		s->pool->stats.server_bytes += hdr->len;
		return SB_FORWARD; /* DataRow, notices, ...: they answer no request (reqqueue_server_msg) */
	}
	s->pool->stats.server_bytes += hdr->len; /* once: a packet asked for whole (SB_NEED_FULL) comes back */
	if (t == 'C' && tracks_statements(s))
		check_discard(s, data, hdr->len);
	Request req; /* filled when POP_ANSWER */
	ReqPop pop = reqqueue_server_msg(&s->rq, t, &req, request_dropped, s);
	if (pop == POP_UNKNOWN) {
		disconnect_server(s, true, "server sent an answer (%s) to no request", proto_msg_name(t, true));
		return SB_CLOSED;
	}
	if (pop == POP_NONE)
		return SB_FORWARD; /* the pooler's own answers never wait at the head: nothing to order */
	SBufAction act = SB_FORWARD;
	bool resume = false;
	if (t == 'E') {
		request_dropped(&req, s); /* a failed Parse prepared nothing */
		if (req.kind == REQ_BIND && request_name(&req))
			check_stale_statement(s, &req, data, hdr->len);
		if ((req.kind == REQ_BIND || req.kind == REQ_DESCRIBE) && req.answer == ANS_CLIENT)
			check_lost_statement(s, &req, data, hdr->len);
		if (own_error(s, &req, data, hdr->len))
			act = SB_CONSUMED;
		/* the ANS_CHECK failed or was skipped: the client's message goes on, into the skipping */
		resume = s->held_for_check && !reqqueue_has_answer(&s->rq, ANS_CHECK);
	} else if (req.answer == ANS_SWALLOW) {
		act = SB_CONSUMED;
	} else if (req.answer >= ANS_LEARN) {
		described(s, &req, data, hdr->len);
		act = SB_CONSUMED;
		resume = req.answer == ANS_CHECK;
	}
	/*
	 * A message waiting for answers ahead (unsettled()), not for a
	 * description, looks again at each answer; at a ReadyForQuery only if
	 * statement mode does not refuse the transaction block there (below).
	 */
	if (!resume && s->held_for_check && !reqqueue_has_answer(&s->rq, ANS_CHECK) &&
	    (t != 'Z' || reqqueue_release_decision(s->link_mode, s->txn_status, &s->rq) != RELEASE_VIOLATION))
		resume = true;
	if (__builtin_expect(s->rq.full, 0) && s->rq.count <= QUEUE_RESUME)
		resume = true; /* the queue has room again (hold_until_answered()) */
	if (req.error)
		free(req.error);
	if (req.stmt_name)
		free(req.stmt_name);
	if (req.closed)
		prepare_client_free(req.closed);
	if (resume) {
		/* what this answers reaches the client before anything its waiting message brings */
		if (act == SB_FORWARD)
			to_client(s, data, hdr->len);
		answer_own_requests(s);
		resume_held(s);
		return SB_CONSUMED;
	}
	if (act == SB_FORWARD && reqqueue_head(&s->rq) && reqqueue_head(&s->rq)->answer == ANS_POOLER)
		return deliver_then_own(s, data, hdr->len);
	if (act == SB_CONSUMED) {
		answer_own_requests(s);
		resume_if_room(s);
		return SB_CONSUMED;
	}
	if (t != 'Z' || !c)
		return SB_FORWARD;
	switch (reqqueue_release_decision(s->link_mode, s->txn_status, &s->rq)) {
	case RELEASE_KEEP:
		return SB_FORWARD;
	case RELEASE_VIOLATION:
		/*
		 * The error comes alone, as with PgBouncer: the answers of this
		 * request not passed on yet are dropped (a driver would otherwise
		 * report them, not the error). Only what went out already stays.
		 */
		if (!sbuf_drop_marked(&s->sb))
			to_client(s, NULL, 0);
		disconnect_server(s, true, "transaction blocks not allowed in statement pooling mode");
		return SB_CLOSED;
	case RELEASE_RETURN:
		break;
	}
	if (!client_input_clean(c))
		return SB_FORWARD; /* part of a client message is still on its way: kept until the next answer */
	to_client(s, data, hdr->len);
	txn_release(s);
	return SB_CONSUMED;
}

SBufAction txn_server_packet(PgSocket *s, const PktHdr *hdr, const uint8_t *data, uint32_t avail)
{
	SBufAction act = server_message(s, hdr, data, avail);
	txn_check_invariants(s);
	return act;
}
