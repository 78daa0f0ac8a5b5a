/*
 * TLS configuration: OpenSSL contexts for accepting TLS from clients and for
 * connecting to PostgreSQL, built from the client_tls_* / server_tls_*
 * settings, rebuilt on RELOAD (the old ones stay when the new ones fail),
 * plus the per-connection pieces (SSL objects, host name checks, the
 * SHOW CLIENTS `tls` text). No sockets here: the stream buffer drives I/O.
 *
 * Naming follows the rest of the pooler: "client" = an application talking
 * to the pooler (the pooler is the TLS server), "server" = PostgreSQL (the
 * pooler is the TLS client).
 *
 * Contexts are reference counted by OpenSSL: an SSL made from a context
 * keeps it alive, so a reload may free the old contexts while connections
 * made from them finish on the old settings.
 */
#ifndef PGB_COMMON_TLS_H
#define PGB_COMMON_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include <openssl/ssl.h>

#include "common/config.h"

#define TLS_ERR_LEN      512 /* enough for any error this module writes */
#define TLS_DESCRIBE_LEN 128 /* enough for any tls_describe() text */
#define TLS_ALPN_PROTO   "postgresql"
#define TLS_NAME_LEN     256 /* longest certificate name tls_peer_cert_names() reports, plus one */

/* Protocol versions of client_tls_protocols / server_tls_protocols, as bits. */
enum {
	TLS_PROTO_TLSV1_0 = 1 << 0,
	TLS_PROTO_TLSV1_1 = 1 << 1,
	TLS_PROTO_TLSV1_2 = 1 << 2,
	TLS_PROTO_TLSV1_3 = 1 << 3,
	TLS_PROTO_ALL = 0xf,
	TLS_PROTO_SECURE = TLS_PROTO_TLSV1_2 | TLS_PROTO_TLSV1_3, /* `secure` and `default` */
};

/* The contexts a worker uses; swapped as a whole by tls_contexts_reload(). */
typedef struct TlsContexts {
	SSL_CTX *client_ctx; /* accepts TLS from clients; NULL when client_tls_sslmode=disable */
	SSL_CTX *server_ctx; /* connects to PostgreSQL; NULL when server_tls_sslmode=disable, or until needed
	                        (server_deferred) */
	int client_sslmode;  /* SSLMODE_* the client_ctx was built for */
	int server_sslmode;  /* SSLMODE_* the server_ctx was built for */
	char *server_key;    /* the server_tls_* settings server_ctx was built from (change detection) */
	bool server_changed; /* set by the last successful reload: server_tls_* differ from before */
	/*
	 * server_tls_sslmode allow or prefer with nothing to load or check
	 * (no key, certificate or cipher list): server_ctx is built by
	 * tls_server_ctx_ensure() at the first server connection, so that a
	 * pooler whose servers never use TLS never initialises OpenSSL's
	 * providers (about 2.5 MB resident; doc/benchmarks.md, "Memory
	 * against PgBouncer 1.25.2").
	 */
	bool server_deferred;
} TlsContexts;

/*
 * Parse a protocol list (`tlsv1.0`..`tlsv1.3`, `tlsv1`, `all`, `secure`,
 * `default`, `!item`; separated by `,`, `:` or blanks; case-insensitive)
 * into TLS_PROTO_* bits. NULL or empty means `secure`. A list whose first
 * item is `!item` starts from `all`. `setting` names the parameter in errors
 * (unknown word, or a list that enables nothing).
 */
bool tls_parse_protocols(const char *setting, const char *value, unsigned *mask, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/*
 * Build the context that accepts TLS from clients. With client_tls_sslmode
 * = disable, succeeds with *out = NULL. Otherwise needs client_tls_key_file
 * and client_tls_cert_file (readable, matching, certificate currently valid).
 *
 * A CA is loaded only from client_tls_ca_file; the system bundle is never
 * used on this side. Client certificates must be verified when
 * client_tls_sslmode is verify-ca/verify-full, auth_type is cert, or the
 * caller says so (`need_client_cert_verify`: hba `cert` rules); then a
 * missing client_tls_ca_file is an error. Under verify-ca/verify-full and
 * auth_type=cert a client without a valid certificate fails the handshake;
 * otherwise, with a CA, a certificate is asked for but optional (one that
 * is sent must verify; hba `cert` rules then reject a client without one).
 * Without a CA none is asked for. auth_type=cert also needs client_tls_sslmode=verify-full.
 *
 * On failure returns false with a message naming the setting (and file) in
 * err; *out is left alone.
 */
bool tls_build_client_ctx(const CfGlobals *g, bool need_client_cert_verify, SSL_CTX **out, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/*
 * Build the context for connecting to PostgreSQL. With server_tls_sslmode
 * = disable, succeeds with *out = NULL. verify-ca/verify-full load
 * server_tls_ca_file (required) and verify the server's chain; the weaker
 * modes verify nothing and load no CA. server_tls_key_file/cert_file, when
 * both set, are presented to servers (same checks as the client side).
 */
bool tls_build_server_ctx(const CfGlobals *g, SSL_CTX **out, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* Empty contexts (TLS off on both sides until the first reload). */
void tls_contexts_init(TlsContexts *t);

/* Drop this holder's references (connections keep theirs). */
void tls_contexts_free(TlsContexts *t);

/*
 * Build both contexts from `g`; only when both succeed replace those in
 * `cur` (and set cur->server_changed). On failure `cur` is untouched and err
 * says why. Used at start-up (a failure is fatal) and on RELOAD/SET (the old
 * contexts stay in use).
 */
/*
 * Build the deferred server_ctx (server_deferred) from g, the settings it
 * was deferred with, if not built yet. False (err set) only when OpenSSL
 * fails. True without a context when server TLS is disabled.
 */
bool tls_server_ctx_ensure(TlsContexts *t, const CfGlobals *g, char *err, size_t errlen)
    __attribute__((warn_unused_result));
bool tls_contexts_reload(TlsContexts *cur, const CfGlobals *g, bool need_client_cert_verify, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* An SSL for an accepted client connection (server role), or NULL (TLS off, out of memory). */
SSL *tls_client_ssl_new(const TlsContexts *t);

/*
 * An SSL for a connection to PostgreSQL at `host` (the host list entry
 * actually used; NULL or a socket path for none), with SNI and, under
 * verify-full, the host name / IP check set. NULL with err on failure.
 */
SSL *tls_server_ssl_new(const TlsContexts *t, const char *host, char *err, size_t errlen);

/*
 * Set SNI (only for a DNS name, never for an IP literal) and, if
 * `verify_name`, require the peer certificate to match `host` (DNS name or
 * IP address).
 */
bool tls_set_server_hostname(SSL *ssl, const char *host, bool verify_name, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/*
 * The names of a client's verified certificate for cert authentication:
 * the subject's CN(s), then subjectAltName DNS and e-mail entries, at most
 * `max`. 0 when there is no certificate or it did not verify.
 */
int tls_peer_cert_names(SSL *ssl, char names[][TLS_NAME_LEN], int max);

/* Whether ALPN settled on "postgresql" (direct TLS requires it). */
bool tls_alpn_is_postgresql(const SSL *ssl);

/*
 * "<protocol>/<cipher>[/ECDH=<group> | /DH=<bits>]" of an established
 * connection, e.g. "TLSv1.3/TLS_AES_256_GCM_SHA384/ECDH=X25519": the
 * SHOW CLIENTS/SERVERS `tls` column and the log's tls= text. "" for NULL.
 */
void tls_describe(const SSL *ssl, char *buf, size_t len);

#endif
