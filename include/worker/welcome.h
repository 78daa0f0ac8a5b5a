/* The welcome that ends a client's login (pooling/welcome.c). */
#ifndef PGB_WORKER_WELCOME_H
#define PGB_WORKER_WELCOME_H

#include "worker/objects.h"

/* AuthenticationOk, parameters, BackendKeyData, ReadyForQuery; the client becomes CL_ACTIVE. False if it closed. */
bool client_send_welcome(PgSocket *c);

#endif
