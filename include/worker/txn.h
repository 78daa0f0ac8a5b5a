/* Transaction and statement pooling: what a linked client or server sends, and when the server goes back (doc/transaction.md). */
#ifndef PGB_WORKER_TXN_H
#define PGB_WORKER_TXN_H

#include "worker/objects.h"

/* A message of a client linked to a server in transaction/statement mode: queued, maybe rewritten. */
SBufAction txn_client_packet(PgSocket *c, const PktHdr *hdr, const uint8_t *data, uint32_t avail);
/* A message of a linked server in transaction/statement mode: answers pop requests; may release it; counts its bytes. */
SBufAction txn_server_packet(PgSocket *s, const PktHdr *hdr, const uint8_t *data, uint32_t avail);
void txn_release(PgSocket *s); /* unlink from its client and return it to the pool */
/* A ReadyForQuery answering all a session-mode client sent, its pool now in another mode: released (true). */
bool txn_session_link_release(PgSocket *s, const uint8_t *data, uint32_t len);
/* The client's settings that its statements are parsed in (prepare_stmt_get_in()): good until the next call. */
const uint8_t *txn_client_env(const PgSocket *c, size_t *len);
/* A CommandComplete of the reset query: DISCARD ALL / DEALLOCATE ALL empty the server's statements. */
void txn_server_discard_check(PgSocket *s, const uint8_t *data, uint32_t len);

/*
 * With --enable-cassert: the invariants of the link, the request queue and
 * the release (listed at the top of txn.c) hold for `sock`, a client or a
 * server, and for its peer. Called at every change of them; compiled to
 * nothing without cassert.
 */
#ifdef PGB_CASSERT
void txn_check_invariants(const PgSocket *sock);
#else
static inline void txn_check_invariants(const PgSocket *sock)
{
	(void)sock;
}
#endif

#endif
