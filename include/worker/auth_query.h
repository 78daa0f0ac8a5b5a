/* auth_query at run time: users not in auth_file looked up on a pooled server (doc/auth_query.md). */
#ifndef PGB_WORKER_AUTH_QUERY_H
#define PGB_WORKER_AUTH_QUERY_H

#include "worker/objects.h"

/* The client's user must be looked up with auth_query before its login. */
bool auth_query_wanted(const PgSocket *client);
SBufAction auth_query_start(PgSocket *client); /* instead of auth_start(); the client waits */
SBufAction auth_query_server_packet(PgSocket *server, const PktHdr *hdr, const uint8_t *data, uint32_t avail);
/*
 * The pool below asks and tells the lookups waiting for its servers through
 * include/worker/hooks.h (auth_query_waiting(), auth_query_wake(), and the
 * hooks set to these, in the queue kept there: auth_query_queue).
 */
void auth_query_wake_slow(PgPool *pool);          /* idle servers of the pool serve queued lookups */
bool auth_query_waiting_slow(const PgPool *pool); /* lookups wait for a server of this pool */
/* The auth_user's login failed: lookups waiting for it fail, with the server's error when it sent one. */
void auth_query_pool_failed(PgPool *pool, const char *sqlstate, const char *msg, bool from_server);
/* The client closed: its lookup, if any, is forgotten. */
void auth_query_client_gone(PgSocket *client);
/* The server closed: the lookup it ran fails. */
void auth_query_server_gone(PgSocket *server);

#endif
