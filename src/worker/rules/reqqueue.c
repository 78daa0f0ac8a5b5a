/*
 * The outstanding-request queue of a linked server and the release
 * decision of transaction and statement mode (include/worker/reqqueue.h).
 */
#include "autoconfig.h"

#include "worker/reqqueue.h"

#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/log.h"
#include "common/util.h"

void reqqueue_grow(ReqQueue *q)
{
	uint32_t ncap = q->cap ? q->cap * 2 : 16; /* a power of two: positions wrap with a mask */
	Request *n = xmalloc(ncap * sizeof(*n));
	for (uint32_t i = 0; i < q->count; i++)
		n[i] = *reqqueue_at(q, i);
	free(q->items);
	q->items = n;
	q->head = 0;
	q->cap = ncap;
}

void request_set_name(Request *r, const char *name)
{
	size_t len = strlen(name);
	if (len < sizeof(r->short_name))
		memcpy(r->short_name, name, len + 1);
	else
		r->stmt_name = xstrdup(name);
}

/* Free what a request owns. */
static void request_free(Request *r)
{
	if (r->error)
		free(r->error);
	if (r->stmt_name)
		free(r->stmt_name);
	if (r->closed)
		prepare_client_free(r->closed);
}

static inline void pop_head(ReqQueue *q, Request *out)
{
	pgb_assert(q->count > 0);
	Request *r = &q->items[q->head];
	if (out)
		*out = *r;
	else
		request_free(r);
	q->head = (q->head + 1) & (q->cap - 1);
	q->count--;
}

void reqqueue_pop(ReqQueue *q, Request *out)
{
	pop_head(q, out);
}

bool reqqueue_has_answer(const ReqQueue *q, ReqAnswer answer)
{
	for (uint32_t i = 0; i < q->count; i++)
		if (reqqueue_at(q, i)->answer == answer)
			return true;
	return false;
}

/* Drop the request at position i of the queue (0 = head). */
static void drop_at(ReqQueue *q, uint32_t i, void (*dropped)(Request *r, void *arg), void *arg)
{
	pgb_assert(i < q->count);
	Request r = *reqqueue_at(q, i);
	for (uint32_t k = i; k + 1 < q->count; k++)
		*reqqueue_at(q, k) = *reqqueue_at(q, k + 1);
	q->count--;
	if (dropped)
		dropped(&r, arg); /* may take r.closed back */
	request_free(&r);
}

void reqqueue_clear(ReqQueue *q, void (*dropped)(Request *r, void *arg), void *arg)
{
	while (q->count)
		drop_at(q, 0, dropped, arg);
	q->head = 0;
	q->skipping = false;
	q->copy_in = false;
	q->full = false;
}

void reqqueue_free(ReqQueue *q)
{
	reqqueue_clear(q, NULL, NULL);
	free(q->items);
	q->items = NULL;
	q->cap = 0;
}

#define K(kind) (1u << (kind))
const uint8_t reqqueue_answers[256] = {
    ['Z'] = K(REQ_QUERY) | K(REQ_SYNC),
    ['1'] = K(REQ_PARSE),
    ['2'] = K(REQ_BIND),
    ['3'] = K(REQ_CLOSE),
    ['T'] = K(REQ_DESCRIBE),
    ['n'] = K(REQ_DESCRIBE),
    ['C'] = K(REQ_EXECUTE),
    ['I'] = K(REQ_EXECUTE),
    ['s'] = K(REQ_EXECUTE),
};
#undef K

ReqPop reqqueue_server_special(ReqQueue *q, char type, Request *out, void (*dropped)(Request *r, void *arg), void *arg)
{
	Request *h = reqqueue_head(q);
	if (type == 'G') {
		/* COPY FROM STDIN: Syncs sent behind its Query/Execute are ignored by the server */
		uint32_t end = 0;
		while (end < q->count && !reqqueue_at(q, end)->copy_end)
			end++;
		if (end == q->count) {
			q->copy_in = true;
			while (q->count > 1 && reqqueue_at(q, 1)->kind == REQ_SYNC)
				drop_at(q, 1, dropped, arg);
			return POP_NONE;
		}
		/* the client ended the COPY already (it did not wait for this): up to there, and no further */
		reqqueue_at(q, end)->copy_end = false;
		for (uint32_t i = end; i >= 1; i--)
			if (reqqueue_at(q, i)->kind == REQ_SYNC)
				drop_at(q, i, dropped, arg);
		return POP_NONE;
	}
	/* 'E': an error ends a COPY FROM STDIN: what the client still sends for it is dropped */
	q->copy_in = false;
	/* a Query's error ends at its ReadyForQuery; so does one raised at a Sync (a deferred check) */
	if (!h || h->kind == REQ_QUERY || h->kind == REQ_SYNC)
		return POP_NONE;
	/* the failed request goes to the caller; the server skips the rest up to the next Sync */
	pop_head(q, out);
	uint32_t skipped = 0;
	while (skipped < q->count && reqqueue_at(q, skipped)->kind != REQ_SYNC)
		skipped++;
	/* undone last first, as effects are rolled back (a Close and a Parse of one statement) */
	while (skipped > 0)
		drop_at(q, --skipped, dropped, arg);
	if (!q->count)
		q->skipping = true;
	return POP_ANSWER;
}

ReleaseDecision reqqueue_release_decision(int pool_mode, char status, const ReqQueue *q)
{
	if (pool_mode == POOL_SESSION)
		return RELEASE_KEEP;
	/*
	 * Statement mode refuses a transaction block at any ReadyForQuery, one
	 * in the middle of a pipeline too: the rest of the pipeline would run
	 * inside the block (doc/transaction.md, "Statement mode").
	 */
	if (status != 'I' && pool_mode == POOL_STATEMENT)
		return RELEASE_VIOLATION;
	if (q->count > 0)
		return RELEASE_KEEP; /* a pipeline: the last ReadyForQuery releases */
	if (status != 'I')
		return RELEASE_KEEP;
	return q->copy_in ? RELEASE_KEEP : RELEASE_RETURN;
}
