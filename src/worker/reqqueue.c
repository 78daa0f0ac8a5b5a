/*
 * The outstanding-request queue of a linked server and the release
 * decision of transaction and statement mode (include/worker/reqqueue.h).
 */
#include "config.h"

#include "worker/reqqueue.h"

#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/util.h"

void reqqueue_push(ReqQueue *q, ReqKind kind, ReqAnswer answer)
{
	if (q->count == q->cap) {
		uint32_t ncap = q->cap ? q->cap * 2 : 16;
		Request *n = xmalloc(ncap * sizeof(*n));
		for (uint32_t i = 0; i < q->count; i++)
			n[i] = q->items[(q->head + i) % q->cap];
		free(q->items);
		q->items = n;
		q->head = 0;
		q->cap = ncap;
	}
	Request *r = &q->items[(q->head + q->count) % q->cap];
	*r = (Request){.kind = (uint8_t)kind, .answer = (uint8_t)answer};
	q->count++;
}

Request *reqqueue_head(ReqQueue *q)
{
	return q->count ? &q->items[q->head] : NULL;
}

Request *reqqueue_tail(ReqQueue *q)
{
	return q->count ? &q->items[(q->head + q->count - 1) % q->cap] : NULL;
}

void reqqueue_pop(ReqQueue *q, Request *out)
{
	Request *r = &q->items[q->head];
	if (out) {
		*out = *r;
	} else {
		free(r->error);
		free(r->stmt_name);
		if (r->closed)
			prepare_client_free(r->closed);
	}
	q->head = (q->head + 1) % q->cap;
	q->count--;
}

/* Drop the request at position i of the queue (0 = head). */
static void drop_at(ReqQueue *q, uint32_t i, void (*dropped)(Request *r, void *arg), void *arg)
{
	Request r = q->items[(q->head + i) % q->cap];
	for (uint32_t k = i; k + 1 < q->count; k++)
		q->items[(q->head + k) % q->cap] = q->items[(q->head + k + 1) % q->cap];
	q->count--;
	if (dropped)
		dropped(&r, arg); /* may take r.closed back */
	free(r.error);
	free(r.stmt_name);
	if (r.closed)
		prepare_client_free(r.closed);
}

void reqqueue_clear(ReqQueue *q, void (*dropped)(Request *r, void *arg), void *arg)
{
	while (q->count)
		drop_at(q, 0, dropped, arg);
	q->head = 0;
	q->skipping = false;
	q->copy_in = false;
}

void reqqueue_free(ReqQueue *q)
{
	reqqueue_clear(q, NULL, NULL);
	free(q->items);
	q->items = NULL;
	q->cap = 0;
}

/* Whether a server message of this type answers a request of this kind. */
static bool answers(char type, ReqKind kind)
{
	switch (type) {
	case 'Z':
		return kind == REQ_QUERY || kind == REQ_SYNC;
	case '1':
		return kind == REQ_PARSE;
	case '2':
		return kind == REQ_BIND;
	case '3':
		return kind == REQ_CLOSE;
	case 'T':
	case 'n':
		return kind == REQ_DESCRIBE;
	case 'C':
	case 'I':
	case 's':
		return kind == REQ_EXECUTE;
	default:
		return false;
	}
}

ReqPop reqqueue_server_msg(ReqQueue *q, char type, Request *out, void (*dropped)(Request *r, void *arg), void *arg)
{
	Request *h = reqqueue_head(q);
	switch (type) {
	case 'E':
		/* an error ends a COPY FROM STDIN: what the client still sends for it is dropped */
		q->copy_in = false;
		/* a Query's error ends at its ReadyForQuery; so does one raised at a Sync (a deferred check) */
		if (!h || h->kind == REQ_QUERY || h->kind == REQ_SYNC)
			return POP_NONE;
		/* the failed request goes to the caller; the server skips the rest up to the next Sync */
		reqqueue_pop(q, out);
		uint32_t skipped = 0;
		while (skipped < q->count && q->items[(q->head + skipped) % q->cap].kind != REQ_SYNC)
			skipped++;
		/* undone last first, as effects are rolled back (a Close and a Parse of one statement) */
		while (skipped > 0)
			drop_at(q, --skipped, dropped, arg);
		if (!q->count)
			q->skipping = true;
		return POP_ANSWER;
	case 'G': {
		/* COPY FROM STDIN: Syncs sent behind its Query/Execute are ignored by the server */
		q->copy_in = true;
		while (q->count > 1 && q->items[(q->head + 1) % q->cap].kind == REQ_SYNC)
			drop_at(q, 1, dropped, arg);
		return POP_NONE;
	}
	case 'T':
		/* a Query's own RowDescription */
		if (!h || h->kind != REQ_DESCRIBE)
			return POP_NONE;
		break;
	case 'C':
	case 'I':
		if (h && h->kind == REQ_QUERY)
			return POP_NONE; /* the statements of a Query; its ReadyForQuery ends it */
		break;
	case 'Z':
	case '1':
	case '2':
	case '3':
	case 'n':
	case 's':
		break;
	default:
		return POP_NONE;
	}
	if (!h || !answers(type, h->kind))
		return POP_UNKNOWN;
	reqqueue_pop(q, out);
	return POP_ANSWER;
}

ReleaseDecision reqqueue_release_decision(int pool_mode, char status, const ReqQueue *q)
{
	if (pool_mode == POOL_SESSION)
		return RELEASE_KEEP;
	if (q->count > 0)
		return RELEASE_KEEP; /* a pipeline: the last ReadyForQuery releases */
	if (status != 'I')
		return pool_mode == POOL_STATEMENT ? RELEASE_VIOLATION : RELEASE_KEEP;
	return q->copy_in ? RELEASE_KEEP : RELEASE_RETURN;
}
