/*
 * The admin console's command syntax (doc/pgbouncer.1.md, "ADMIN CONSOLE"):
 * words, double-quoted identifiers, SET's key and value. Pure code over a
 * NUL-terminated query (test/fuzz/fuzz_admin.c runs it alone); what the
 * commands do is in src/worker/console/admin.c.
 */
#ifndef PGB_WORKER_ADMIN_PARSE_H
#define PGB_WORKER_ADMIN_PARSE_H

#include <stdbool.h>
#include <stddef.h>

/* Size of a command's argument (a database name, SHOW subject, client id). */
#define ADMIN_MAX_WORD 64

typedef enum AdminParse {
	ADMIN_PARSE_OK,
	ADMIN_PARSE_SYNTAX,   /* "invalid command '...', use SHOW HELP;" */
	ADMIN_PARSE_TOO_LONG, /* "bad arguments" */
} AdminParse;

/*
 * Read a word (letters, digits, _) or a double-quoted identifier ("" is a
 * quote) after any spaces into out (outlen bytes, NUL included), and move
 * *pp past it. *pp stays put on an error.
 */
AdminParse admin_read_ident(const char **pp, char *out, size_t outlen);

/* Whether only spaces and at most one ';' are left. */
bool admin_at_end(const char *p);

/* The argument after the command word: one identifier or nothing (arg = ""), then the end. */
AdminParse admin_parse_arg(const char *p, char *arg, size_t arglen);

/* SET's `key = value` or `key TO value`; the value is an identifier or a '...' string ('' is a quote). */
AdminParse admin_parse_set(const char *p, char *key, size_t keylen, char *val, size_t vallen);

#endif
