/* Client authentication: methods, hba rules, the end of a login. */
#ifndef PGB_WORKER_AUTH_H
#define PGB_WORKER_AUTH_H

#include "worker/objects.h"

/* Start the client's authentication by auth_type or its hba rule. */
SBufAction auth_start(PgSocket *c);
/* The same-UID Unix-socket user "pgbouncer": the console without a password (nor a lookup). */
bool auth_console_peer(const PgSocket *c);
/*
 * (Re)read auth_hba_file and auth_ident_file when auth_type=hba (on start
 * and every reload); a file that cannot be read keeps the previous contents.
 */
void auth_load_hba(void);
/* A PasswordMessage/SASL response of a logging-in client. */
SBufAction auth_handle_password_msg(PgSocket *c, const uint8_t *data, uint32_t len);
/* Authenticated: apply client limits, find its pool, welcome it or queue it. */
void auth_login_complete(PgSocket *c);

#endif
