/*
 * The auth_file (userlist.txt): one `"user" "secret"` per line, with the
 * secret kind detected from its form (plain text, md5, SCRAM verifier).
 */
#ifndef PGB_COMMON_USERLIST_H
#define PGB_COMMON_USERLIST_H

#include <stdbool.h>
#include <stddef.h>

#define USERLIST_MAX_USER   127   /* longest user name in bytes */
#define USERLIST_MAX_SECRET 65535 /* longest secret in bytes: a password message's limit in the protocol */

typedef enum SecretKind {
	SECRET_EMPTY, /* user exists, password auth always fails */
	SECRET_PLAIN, /* plain text password */
	SECRET_MD5,   /* "md5" + 32 lower-case hex digits */
	SECRET_SCRAM, /* SCRAM-SHA-256$<iter>:<salt>$<stored>:<server> */
} SecretKind;

typedef struct UserEntry {
	char *name;
	char *secret;
	SecretKind kind;
} UserEntry;

typedef struct UserList {
	UserEntry *users; /* in file order; a repeated name keeps the last secret */
	int n_users;
} UserList;

/* Classify a secret string. */
SecretKind userlist_secret_kind(const char *secret);

/*
 * Parse the text of an auth file. Parsing stops at the first broken line,
 * keeping the users read so far: returns false with "line N: problem" in
 * errbuf (the caller logs it), true when the whole text parsed.
 */
bool userlist_parse(UserList *ul, const char *text, char *errbuf, size_t errlen);

/* Read and parse a file; false with a message if it cannot be read or is broken. */
bool userlist_load(UserList *ul, const char *path, char *errbuf, size_t errlen);

const UserEntry *userlist_find(const UserList *ul, const char *name);

void userlist_free(UserList *ul);

#endif
