/* SHOW WORKERS and SHOW SCALER from the shared memory. */
#ifndef PGB_WORKER_ADMIN_WORKERS_H
#define PGB_WORKER_ADMIN_WORKERS_H

#include "worker/objects.h"

/* SHOW WORKERS from the shared memory; false if the client was closed. */
bool admin_show_workers(PgSocket *c);
/* SHOW SCALER from the shared memory; false if the client was closed. */
bool admin_show_scaler(PgSocket *c);

#endif
