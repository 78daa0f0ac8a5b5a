/*
 * SCRAM-SHA-256 (RFC 5802/7677) for both directions, and PostgreSQL's MD5
 * password hashing: pure functions over OpenSSL, no sockets.
 *
 * Server side: a client authenticates to the pooler against a stored secret
 * (a SCRAM verifier from auth_file/auth_query, or one built from a plain
 * password). Client side: the pooler logs into PostgreSQL with a plain
 * password, or with the ClientKey/ServerKey recovered from a client's
 * successful SCRAM exchange (pass-through, no plain password needed).
 */
#ifndef PGB_COMMON_SCRAM_H
#define PGB_COMMON_SCRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/userlist.h"

#define SCRAM_KEY_LEN               32 /* SHA-256 output */
#define SCRAM_MAX_SALT              64
#define SCRAM_NONCE_LEN             18   /* random bytes before base64 */
#define SCRAM_MAX_MSG               1024 /* longer SCRAM messages are rejected as malformed */
/*
 * Highest iteration count a server may ask of us: every server login
 * computes the salted password inside the worker's event loop (about a
 * second at this count), so a hostile or misconfigured server must not be
 * able to stall a worker for longer.
 */
#define SCRAM_MAX_SERVER_ITERATIONS 1000000
#define MD5_PASSWD_LEN              35 /* "md5" + 32 hex */

/* A parsed SCRAM-SHA-256 verifier. */
typedef struct ScramSecret {
	int iterations;
	uint8_t salt[SCRAM_MAX_SALT];
	size_t salt_len;
	uint8_t stored_key[SCRAM_KEY_LEN];
	uint8_t server_key[SCRAM_KEY_LEN];
} ScramSecret;

/* Parse "SCRAM-SHA-256$<iter>:<b64 salt>$<b64 StoredKey>:<b64 ServerKey>". */
bool scram_parse_secret(const char *text, ScramSecret *out) __attribute__((warn_unused_result));

/* Build a verifier from a plain password (SASLprep applied, random salt). */
bool scram_build_secret(const char *password, int iterations, ScramSecret *out) __attribute__((warn_unused_result));

/*
 * Salts that must look alike for every login and on every worker: that of
 * the verifier made from a plain-text password, and that of the mock
 * exchange of an unknown user, so that a prober cannot tell the two apart
 * by connecting twice. Derived from a random key made once per process
 * tree: the master calls scram_salt_key_init() before workers fork (else
 * the first scram_salt_for() makes one for this process).
 */
#define SCRAM_DERIVED_SALT_LEN 16
void scram_salt_key_init(void);
/* The key itself, so that a new master at an online restart keeps the salts (doc/workers.md "Upgrading"). */
#define SCRAM_SALT_KEY_LEN 32
void scram_salt_key_get(uint8_t key[SCRAM_SALT_KEY_LEN]);
void scram_salt_key_set(const uint8_t key[SCRAM_SALT_KEY_LEN]);
void scram_salt_for(const char *name, uint8_t salt[SCRAM_DERIVED_SALT_LEN]);

/*
 * Build a verifier with a given salt (1..SCRAM_MAX_SALT bytes). This is what
 * scram_build_secret does after drawing a random salt; tests use it to
 * replay known vectors.
 */
bool scram_build_secret_salt(const char *password, const uint8_t *salt, size_t salt_len, int iterations,
                             ScramSecret *out) __attribute__((warn_unused_result));

/*
 * Check a plain password (e.g. from AuthenticationCleartextPassword) against
 * a verifier: recompute StoredKey with the verifier's salt and iterations.
 */
bool scram_verify_plain_password(const ScramSecret *s, const char *password) __attribute__((warn_unused_result));

/* Format a verifier in the text form above into buf; false if too small. */
bool scram_format_secret(const ScramSecret *s, char *buf, size_t len) __attribute__((warn_unused_result));

/* --- server side: a client logs into the pooler --- */
typedef struct ScramServer {
	ScramSecret secret;
	char client_nonce[SCRAM_MAX_MSG];
	char server_nonce[64]; /* base64 of SCRAM_NONCE_LEN random bytes */
	char client_first_bare[SCRAM_MAX_MSG];
	char server_first[SCRAM_MAX_MSG];
	char cbind_flag;                   /* 'n', 'y' or 'p' */
	uint8_t client_key[SCRAM_KEY_LEN]; /* recovered after a successful proof */
	bool done;
} ScramServer;

/*
 * Handle SASLInitialResponse data (client-first-message). Fills server_first
 * (the AuthenticationSASLContinue payload). Errors: false with a short reason
 * in err (malformed message, channel binding requested, ...).
 */
bool scram_server_first(ScramServer *st, const ScramSecret *secret, const char *client_first, size_t len, char *err,
                        size_t errlen) __attribute__((warn_unused_result));

/*
 * Handle SASLResponse data (client-final-message): check nonce and proof.
 * On success fills server_final (the AuthenticationSASLFinal payload, "v=...")
 * and st->client_key. False on a wrong proof or malformed message.
 */
bool scram_server_final(ScramServer *st, const char *client_final, size_t len, char *server_final,
                        size_t server_final_len, char *err, size_t errlen) __attribute__((warn_unused_result));

/* --- client side: the pooler logs into PostgreSQL --- */
typedef struct ScramClient {
	bool have_password;                     /* else use client_key/server_key */
	char password[USERLIST_MAX_SECRET + 1]; /* SASLprep'ed plain password */
	uint8_t client_key[SCRAM_KEY_LEN];      /* pass-through keys */
	uint8_t server_key[SCRAM_KEY_LEN];
	char client_nonce[64];
	char client_first_bare[SCRAM_MAX_MSG];
	char server_first[SCRAM_MAX_MSG];
	uint8_t expected_server_sig[SCRAM_KEY_LEN];
} ScramClient;

/* Start with a plain password. */
void scram_client_init_password(ScramClient *st, const char *password);
/* Start with keys recovered from a client's SCRAM login (pass-through). */
void scram_client_init_keys(ScramClient *st, const uint8_t *client_key, const uint8_t *server_key);

/*
 * client-first-message ("n,,n=,r=<nonce>") into buf. False if buf is too
 * small or the password is unusable (empty, or too long after SASLprep).
 */
bool scram_client_first(ScramClient *st, char *buf, size_t len) __attribute__((warn_unused_result));
/*
 * The same with a user name in "n=" (escaped as RFC 5802 requires).
 * PostgreSQL ignores the name and the pooler sends an empty one; tests use
 * this to replay RFC 7677's example, which names "user".
 */
bool scram_client_first_user(ScramClient *st, const char *user, char *buf, size_t len)
    __attribute__((warn_unused_result));

/*
 * Handle server-first-message, produce client-final-message into buf.
 * Rejects a server nonce that does not start with ours, an overlong message,
 * iteration counts < 1, bad base64. With keys (pass-through) the salt and
 * iterations of the server must match the secret the keys came from: the
 * caller checks that; here the keys are used as given.
 */
bool scram_client_final(ScramClient *st, const char *server_first, size_t len, char *buf, size_t buflen, char *err,
                        size_t errlen) __attribute__((warn_unused_result));

/* Check server-final-message ("v=<signature>"). */
bool scram_client_verify_final(ScramClient *st, const char *server_final, size_t len, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/*
 * --- MD5 ---
 * On failure (MD5 unavailable, e.g. a FIPS-only provider, or a stored md5
 * secret that is not "md5" + 32 hex) out is set to "", which no client
 * response equals.
 */
/* "md5" + hex(md5(password || user)) into out (MD5_PASSWD_LEN + 1 bytes). */
void md5_password_hash(const char *password, const char *user, char *out);
/*
 * Response to AuthenticationMD5Password: "md5" + hex(md5(hex_part_of(stored) || salt)),
 * where stored is either a plain password (hashed with user first) or an md5 secret.
 */
void md5_salted_response(const char *stored, bool stored_is_md5, const char *user, const uint8_t salt[4], char *out);

/*
 * For unit tests only: the next nonce generated (by scram_server_first or
 * scram_client_first*) is this text instead of random bytes; used once.
 * NULL clears it. Never called by the pooler itself.
 */
void scram_set_test_nonce(const char *nonce);

/* Constant-time comparison. */
bool scram_secure_equal(const void *a, const void *b, size_t len);

#endif
