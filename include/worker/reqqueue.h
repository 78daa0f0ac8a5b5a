/*
 * What a linked server still owes an answer to, in transaction and
 * statement mode (doc/transaction.md): every
 * request sent (the client's, and the pooler's own Parse/Close) is queued;
 * the server's answers pop it. The server goes back to the pool only when
 * the queue is empty at a ReadyForQuery 'I'. Pure logic, unit-tested on
 * message sequences (test/unit/test_reqqueue.c).
 */
#ifndef PGB_WORKER_REQQUEUE_H
#define PGB_WORKER_REQQUEUE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/log.h"
#include "worker/prepare.h"

typedef enum ReqKind {
	REQ_QUERY,    /* Query or FunctionCall: answered up to its ReadyForQuery */
	REQ_SYNC,     /* Sync: ReadyForQuery */
	REQ_PARSE,    /* ParseComplete */
	REQ_BIND,     /* BindComplete */
	REQ_DESCRIBE, /* RowDescription or NoData */
	REQ_EXECUTE,  /* CommandComplete, EmptyQueryResponse or PortalSuspended */
	REQ_CLOSE,    /* CloseComplete */
} ReqKind;

typedef enum ReqAnswer {
	ANS_CLIENT,     /* the server answers and the client sees it */
	ANS_SWALLOW,    /* the pooler's own request (injected Parse, eviction Close): the answer is dropped */
	ANS_POOLER,     /* not sent to the server: the pooler answers the client itself, in order */
	ANS_FAKE_ERROR, /* an injected failing Parse: its ErrorResponse is replaced by the pooler's error */
	ANS_LEARN,      /* the pooler's Describe of a statement it prepared: the result type is recorded, the
	                   answer dropped */
	ANS_CHECK,      /* the same for a statement prepared again, compared with the recorded one (recorded if
	                   none yet); the client's message that needed it waits for the answer
	                   (doc/transaction.md, "Schema changes") */
} ReqAnswer;

#define REQ_SHORT_NAME 21 /* room in a Request for a short statement name (most drivers' names fit) */

typedef struct Request {
	uint8_t kind;       /* ReqKind */
	uint8_t answer;     /* ReqAnswer */
	bool copy_end;      /* the client ended a COPY FROM STDIN right after this, before the server began it */
	bool dropped_ahead; /* eviction Close: the statement is gone ahead of it (a DEALLOCATE ALL / DISCARD ALL, or
	                       its Parse failed or was skipped): if skipped, nothing is put back */
	char short_name[REQ_SHORT_NAME]; /* the client's name of a renamed Bind/Describe when it fits, else "" */
	uint64_t stmt_id;                /* Parse: registry id recorded on the server by it; Bind: the one bound;
	                                    Describe (the client's, ANS_LEARN, ANS_CHECK): the statement described
	                                    (0 = none) */
	uint64_t map_gen;                /* Parse: the client's name mapping made by it (0 = none); ANS_LEARN: the
	                                    mapping made by the client's Parse it follows (0 = none) */
	char *error;                     /* ANS_FAKE_ERROR: SQLSTATE (5 characters), then the message the client gets */
	char *stmt_name;                 /* the client's name of a renamed Bind/Describe when longer (owned) */
	ClientStmt *closed;              /* Close of a client's statement: its mapping, freed once answered */
} Request;

/*
 * Bind/Describe renamed by the pooler: remember the client's statement
 * name (not empty) for the server's errors. Short names need no malloc.
 */
void request_set_name(Request *r, const char *name);

/* The client's statement name of a renamed Bind/Describe, or NULL. */
static inline const char *request_name(const Request *r)
{
	return r->stmt_name ? r->stmt_name : r->short_name[0] ? r->short_name : NULL;
}

typedef struct ReqQueue {
	Request *items; /* ring buffer */
	uint32_t head;
	uint32_t count;
	uint32_t cap;  /* 0 or a power of two */
	bool skipping; /* the server had an error and ignores everything up to the next Sync */
	bool copy_in;  /* the client is sending COPY data the server waits for */
	bool full;     /* the client's next message waits until answers make room (txn.c, QUEUE_HOLD) */
} ReqQueue;

/* What the answer to a server message did to the queue. */
typedef enum ReqPop {
	POP_NONE,    /* answers nothing queued (data rows, notices, ...) */
	POP_ANSWER,  /* answered the head request (now out of the queue, in *out) */
	POP_UNKNOWN, /* an answer with nothing queued for it: a protocol error */
} ReqPop;

void reqqueue_grow(ReqQueue *q); /* room for one more (reqqueue_push) */

/* Inline: a few of these run for every message of a transaction. */
static inline void reqqueue_push(ReqQueue *q, ReqKind kind, ReqAnswer answer)
{
	if (q->count == q->cap)
		reqqueue_grow(q);
	pgb_assert(q->count < q->cap);
	q->items[(q->head + q->count) & (q->cap - 1)] = (Request){.kind = (uint8_t)kind, .answer = (uint8_t)answer};
	q->count++;
}

/* The request at position i of the queue (0 = head, i < count). */
static inline Request *reqqueue_at(const ReqQueue *q, uint32_t i)
{
	pgb_assert(i < q->count);
	return &q->items[(q->head + i) & (q->cap - 1)];
}

/* NULL when empty */
static inline Request *reqqueue_head(ReqQueue *q)
{
	return q->count ? &q->items[q->head] : NULL;
}

/* the request pushed last, NULL when empty */
static inline Request *reqqueue_tail(ReqQueue *q)
{
	return q->count ? reqqueue_at(q, q->count - 1) : NULL;
}

void reqqueue_pop(ReqQueue *q, Request *out);                  /* out may be NULL; else the caller frees its strings */
bool reqqueue_has_answer(const ReqQueue *q, ReqAnswer answer); /* a request of that answer kind is queued */
void reqqueue_clear(ReqQueue *q, void (*dropped)(Request *r, void *arg), void *arg);
void reqqueue_free(ReqQueue *q);

ReqPop reqqueue_server_special(ReqQueue *q, char type, Request *out, void (*dropped)(Request *r, void *arg),
                               void *arg); /* the 'E' and 'G' part of reqqueue_server_msg() */

/* For each server message type, the request kinds it answers (a bit per ReqKind; 0: none). */
extern const uint8_t reqqueue_answers[256];

/*
 * A server message of type `type`: pops the request it answers into *out.
 * 'E' (ErrorResponse) outside a Query pops the failed request and drops
 * the requests behind it up to the next Sync (each passed to dropped(),
 * which may be NULL, the last one first: the caller undoes what it
 * recorded for them in reverse, and undoes the failed one after them); if no Sync is queued it sets `skipping` until the
 * client sends one; it also ends a COPY FROM STDIN (copy_in), whose late
 * CopyData/CopyDone the pooler drops. 'G' (CopyInResponse)
 * sets copy_in and drops the Syncs queued right behind the COPY's request
 * (the server ignores Sync during COPY FROM STDIN). A client that sent
 * its data and CopyDone without waiting for CopyInResponse (asyncpg) has
 * marked the request it sent them after (copy_end): then only the Syncs
 * up to that mark are dropped, and copy_in stays off. Inline: it runs for
 * most server messages.
 */
static inline ReqPop reqqueue_server_msg(ReqQueue *q, char type, Request *out, void (*dropped)(Request *r, void *arg),
                                         void *arg)
{
	if (type == 'E' || type == 'G')
		return reqqueue_server_special(q, type, out, dropped, arg);
	unsigned kinds = reqqueue_answers[(uint8_t)type];
	if (!kinds)
		return POP_NONE;
	Request *h = reqqueue_head(q);
	if (!h || !(kinds & (1u << h->kind))) {
		/* a Query's own RowDescription, and the statements of a Query (its ReadyForQuery ends it) */
		if (type == 'T' || (h && (type == 'C' || type == 'I') && h->kind == REQ_QUERY))
			return POP_NONE;
		return POP_UNKNOWN;
	}
	*out = *h;
	q->head = (q->head + 1) & (q->cap - 1);
	q->count--;
	return POP_ANSWER;
}

/* The release decision (doc/transaction.md) for a server at ReadyForQuery `status`. */
typedef enum ReleaseDecision {
	RELEASE_KEEP,     /* stays linked (session mode, a transaction is open, requests outstanding, COPY) */
	RELEASE_RETURN,   /* goes back to the pool */
	RELEASE_VIOLATION /* statement mode and a transaction block: close it, the client gets the error */
} ReleaseDecision;

ReleaseDecision reqqueue_release_decision(int pool_mode, char status, const ReqQueue *q);

#endif
