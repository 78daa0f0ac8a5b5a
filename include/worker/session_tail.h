/*
 * What a client linked in session mode has sent that its server still owes
 * a ReadyForQuery for, as far as the pooler needs it: once the pool has
 * left session mode (RELOAD, SET pool_mode), the link ends at a
 * ReadyForQuery that answers everything sent (server.c,
 * session_link_done(); doc/architecture.md, "Transaction pooling: when a
 * server is released"). The Syncs right behind the Execute or Query of a
 * COPY FROM STDIN reach the server in COPY, which ignores them: they are
 * owed nothing (session_tail_copy_begun()). Pure: the message types in,
 * the counts out (test/unit/test_session_tail.c).
 */
#ifndef PGB_WORKER_SESSION_TAIL_H
#define PGB_WORKER_SESSION_TAIL_H

#include <stdbool.h>
#include <stdint.h>

/* What the client sent last (SessionTail.tail). */
enum SessionTailKind {
	SESSION_TAIL_OTHER,      /* nothing of note since the last Sync */
	SESSION_TAIL_BROKEN,     /* two Executes, more behind one, an end of COPY: no guess until the next Sync */
	SESSION_TAIL_EXEC,       /* one Execute since the last Sync, and nothing behind it */
	SESSION_TAIL_EXEC_SYNCS, /* that Execute, then Syncs only (tail_syncs) */
	SESSION_TAIL_QUERY,      /* a Query, then Syncs only (tail_syncs) */
};

/* More Syncs than this at the end of a tail: no guess (SESSION_TAIL_BROKEN). */
#define SESSION_TAIL_SYNCS_MAX ((1u << 28) - 1)

/* A server's count for its client in session mode: 8 bytes in each PgSocket (doc/benchmarks.md, "Memory per idle client"). */
typedef struct SessionTail {
	uint32_t owed;            /* ReadyForQuery still owed: its Syncs, Queries and FunctionCalls not answered */
	uint32_t tail_syncs : 28; /* the Syncs at the end of `tail` (EXEC_SYNCS, QUERY) */
	uint32_t tail : 3;        /* enum SessionTailKind */
	uint32_t open : 1;        /* it sent more since its last Sync, Query or FunctionCall */
} SessionTail;

/* A new link: nothing owed. */
static inline void session_tail_reset(SessionTail *t)
{
	*t = (SessionTail){.tail = SESSION_TAIL_OTHER};
}

/* The client sent a message of `type`, `len` bytes with its header. */
void session_tail_client_msg(SessionTail *t, char type, uint32_t len);

/*
 * The server answered a CopyInResponse: it is in COPY FROM STDIN. When the
 * COPY's Execute or Query is the only request not answered and nothing but
 * Syncs came behind it, those Syncs are owed nothing; otherwise the count
 * stays (the link is kept, never handed back early).
 */
void session_tail_copy_begun(SessionTail *t);

/*
 * The server sent a ReadyForQuery: one less owed. Whether it answers
 * everything the client sent (nothing owed, nothing sent since). Inline: at
 * every ReadyForQuery of a session-mode link.
 */
static inline bool session_tail_answered(SessionTail *t)
{
	if (t->owed > 0 && --t->owed > 0)
		return false;
	return !t->open;
}

#endif
