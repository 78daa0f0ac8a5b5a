/*
 * PAM authentication (auth_type = pam, hba method pam) off the event loop:
 * libpam calls block, so they run in a few threads of the worker; the
 * answer comes back to the loop through an eventfd. See doc/pgbouncer.5.md,
 * auth_type.
 */
#ifndef PGB_WORKER_PAM_H
#define PGB_WORKER_PAM_H

#include <stdbool.h>

#include "worker/objects.h"

/* Whether this build has PAM (configure found libpam). */
bool pam_available(void);

/*
 * Check the client's cleartext password with PAM service "pgbouncer"; the
 * client stops being read until the answer, which finishes its login or
 * closes it with "PAM authentication failed". False (client closed) when
 * the check cannot be started.
 */
bool pam_auth_start(PgSocket *c, const char *password);

#endif
