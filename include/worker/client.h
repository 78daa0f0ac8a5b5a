/* Client connections: accept, startup and login, the packets of a logged-in client. */
#ifndef PGB_WORKER_CLIENT_H
#define PGB_WORKER_CLIENT_H

#include "worker/objects.h"

/*
 * Take an accepted, non-blocking socket as a new client (is_private: a peer
 * worker's console). peer: its address from accept4(), or NULL to ask the socket.
 */
void client_accept(int fd, bool is_unix, bool is_private, const struct sockaddr_storage *peer, socklen_t peer_len);
/* The client sockets' sbuf callback: login, then every packet of the client. */
SBufAction client_cb(SBuf *sb, SBufEvent ev, const PktHdr *hdr, const uint8_t *data, uint32_t avail);

#endif
