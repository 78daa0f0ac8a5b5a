/* Cancel keys, CancelRequest routing (worker, peer) and the connections that carry them. */
#ifndef PGB_WORKER_CANCEL_H
#define PGB_WORKER_CANCEL_H

#include <stdint.h>

#include "worker/objects.h"

/* A CancelRequest: routed to the owning peer or worker, or sent to the client's server. */
void cancel_handle_request(PgSocket *req, const uint8_t *key);
/* A cancel another worker received for our client (final: CANCEL_FINAL, not passed back if no client has it). */
void cancel_forwarded(const uint8_t *key, int hold_fd, bool final);
void cancel_gen_key(PgSocket *c);
void cancel_server_gone(
    PgSocket *server); /* SERVER_GONE_CANCEL (hooks.h): cancels on their way for it no longer point at it */
void cancel_client_gone(PgSocket *c); /* CLIENT_GONE_CANCEL (hooks.h): a cancel request lets go of what it held */
int cancel_peer_queue_count(void);    /* [peers] entries a cancel was forwarded to (SHOW MEM) */
size_t cancel_peer_queue_size(void);
void cancel_peers_wake(void);     /* a name lookup ended: queued forwards to peers may go */
void cancel_check_timeouts(void); /* cancel_wait_timeout (the janitor) */

#endif
