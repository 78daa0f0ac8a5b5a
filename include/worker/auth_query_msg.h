/*
 * The pure half of auth_query: the extended-protocol request sent to the
 * server, the reading of its answer, and the hint that turns a server error
 * into the grant (or set-up step) that is missing. No sockets, no event loop;
 * the run-time half (queueing clients, borrowing a pooled server) is in
 * src/worker/auth/auth_query.c and declared in worker/auth_query.h.
 */
#ifndef PGB_WORKER_AUTH_QUERY_MSG_H
#define PGB_WORKER_AUTH_QUERY_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/pktbuf.h"

/* The bootstrap command named in hints (src/tools/auth_setup.c). */
#define AUTHQ_SETUP_COMMAND "pgbouncer-auth-setup"

/*
 * Unnamed Parse of `query` with one text parameter, Bind with $1 = login
 * (text), Describe portal, Execute (all rows), Sync.
 */
void authq_write_request(PktBuf *pb, const char *query, const char *login);

/* Number of columns in a RowDescription body, or -1 if it is malformed. */
int authq_row_columns(const uint8_t *body, uint32_t len);

typedef enum AuthqRow {
	AUTHQ_ROW_SECRET, /* *secret is a new string (maybe empty) */
	AUTHQ_ROW_NULL,   /* the password column is NULL: the user can never log in with a password */
	AUTHQ_ROW_BAD,    /* not two columns, a broken row, or an unusable secret (reason in err) */
} AuthqRow;

/*
 * The secret (second column) of a DataRow body. A secret longer than
 * max_secret bytes, or one with a NUL byte in it, is AUTHQ_ROW_BAD.
 */
AuthqRow authq_parse_row(const uint8_t *body, uint32_t len, size_t max_secret, char **secret, char *err, size_t errlen);

/*
 * What an auth_query failure means for the set-up, for the log: for
 * SQLSTATE 42501 the missing grant derived from the server's message
 * ("permission denied for schema S" -> USAGE on schema S, "... for function
 * F" -> EXECUTE on F, ...) with its GRANT statement; for a missing
 * schema/function/table that the lookup is not installed in auth_db. Every
 * hint names the bootstrap command and its --check. `query` (the
 * auth_query, may be NULL) gives a function its schema in the GRANT.
 * Writes "" when the failure says nothing about the set-up. Returns buf.
 */
const char *authq_error_hint(const char *sqlstate, const char *msg, const char *auth_user, const char *auth_db,
                             const char *query, char *buf, size_t len);

/* An SQL identifier, double-quoted when it is not a plain lower-case name. */
void authq_quote_ident(const char *name, char *buf, size_t len);

#endif
