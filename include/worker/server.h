/* Server connections: connect and login, packets of a linked or internal-query server, release. */
#ifndef PGB_WORKER_SERVER_H
#define PGB_WORKER_SERVER_H

#include "worker/objects.h"

/* The server sockets' sbuf callback: connect, login, then every packet of the server. */
SBufAction server_cb(SBuf *sb, SBufEvent ev, const PktHdr *hdr, const uint8_t *data, uint32_t avail);
/* Both take over `hold` (units already taken from the global budget) and give it back if they fail. */
bool server_launch(PgPool *pool, BudgetHold *hold);
bool server_launch_replication(PgPool *pool, PgSocket *client, BudgetHold *hold); /* dedicated, linked to client */
void server_release(PgSocket *server);
void server_client_gone(PgSocket *client); /* CLIENT_GONE_SERVER (hooks.h): its linked server is released */
void server_closed(PgSocket *server);      /* SERVER_GONE_LAUNCH (hooks.h): its pool may launch another */
/* Idle outside a transaction, nothing outstanding or unsent: it can go back to the pool (or be closed) now. */
bool server_between_transactions(const PgSocket *server);
void server_reset_or_ready(PgSocket *server, bool always_reset); /* released and ready: reset query, then idle */
bool server_param_status(PgSocket *server, const uint8_t *body, uint32_t len); /* false: malformed */

#endif
