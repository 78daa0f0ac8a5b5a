/*
 * TLS configuration: turns the client_tls_* / server_tls_* settings into
 * OpenSSL contexts with PgBouncer's error texts, followed by the setting
 * and file at fault where PgBouncer names neither (doc/tls.md),
 * swaps them on reload only when the new ones are good, and formats the
 * `tls` text of a connection. Pure OpenSSL: no sockets, no event loop.
 */
#include "autoconfig.h"

#include "common/tls.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/objects.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

/* ALPN wire form: one length byte, then the name. */
static const unsigned char alpn_wire[] = "\x0a" TLS_ALPN_PROTO;

/* Session ID context: needed by OpenSSL whenever client certificates are verified. */
static const unsigned char session_id_ctx[] = "pgbouncer";

/* Group lists for client_tls_ecdhcurve=none: finite-field groups only (RFC 7919). */
#define FFDHE_GROUPS "ffdhe2048:ffdhe3072:ffdhe4096:ffdhe6144:ffdhe8192"

/*
 * Bits of the DH group a client-facing context uses for TLS <= 1.2 DHE,
 * kept on the context (ex_data) because OpenSSL forgets the key after the
 * handshake and the `tls` column still wants "/DH=<bits>".
 */
static CRYPTO_ONCE dh_bits_once = CRYPTO_ONCE_STATIC_INIT;
static int dh_bits_index = -1;

static void dh_bits_index_init(void)
{
	dh_bits_index = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, NULL);
}

static int dh_bits_slot(void)
{
	if (!CRYPTO_THREAD_run_once(&dh_bits_once, dh_bits_index_init))
		return -1;
	return dh_bits_index;
}

/* The words of a protocol list. */
static const struct {
	const char *word;
	unsigned mask;
} proto_words[] = {
    {"tlsv1.0", TLS_PROTO_TLSV1_0}, {"tlsv1.1", TLS_PROTO_TLSV1_1}, {"tlsv1.2", TLS_PROTO_TLSV1_2},
    {"tlsv1.3", TLS_PROTO_TLSV1_3}, {"tlsv1", TLS_PROTO_ALL},       {"all", TLS_PROTO_ALL},
    {"secure", TLS_PROTO_SECURE},   {"default", TLS_PROTO_SECURE},
};

/* TLS_PROTO_* bit i <-> OpenSSL version and the option that switches it off. */
static const struct {
	int version;
	unsigned long no_option;
} proto_versions[] = {
    {TLS1_VERSION, SSL_OP_NO_TLSv1},
    {TLS1_1_VERSION, SSL_OP_NO_TLSv1_1},
    {TLS1_2_VERSION, SSL_OP_NO_TLSv1_2},
    {TLS1_3_VERSION, SSL_OP_NO_TLSv1_3},
};

/* The reason of OpenSSL's most recent error (its queue is emptied). */
static const char *ssl_reason(char *buf, size_t len)
{
	unsigned long e = ERR_peek_last_error();
	const char *r = e != 0 ? ERR_reason_error_string(e) : NULL;

	if (r != NULL)
		snprintf(buf, len, "%s", r);
	else if (e != 0)
		ERR_error_string_n(e, buf, len);
	else
		snprintf(buf, len, "unknown OpenSSL error");
	ERR_clear_error();
	return buf;
}

/* The reason of OpenSSL's earliest error: for a file, what was wrong in it ("no start line"). */
static const char *ssl_first_reason(char *buf, size_t len)
{
	unsigned long e = ERR_peek_error();
	const char *r = e != 0 ? ERR_reason_error_string(e) : NULL;

	if (r != NULL) {
		snprintf(buf, len, "%s", r);
		ERR_clear_error();
		return buf;
	}
	return ssl_reason(buf, len);
}

static bool is_set(const char *s)
{
	return s != NULL && s[0] != '\0';
}

bool tls_parse_protocols(const char *setting, const char *value, unsigned *mask, char *err, size_t errlen)
{
	char word[32];
	const char *p = value;
	unsigned m = 0;
	bool first = true;

	if (!is_set(value)) {
		*mask = TLS_PROTO_SECURE;
		return true;
	}
	while (*p != '\0') {
		bool negate = false, known = false;
		size_t n = 0;

		while (*p == ',' || *p == ':' || *p == ' ' || *p == '\t')
			p++;
		if (*p == '\0')
			break;
		if (*p == '!') {
			negate = true;
			p++;
		}
		while (p[n] != '\0' && p[n] != ',' && p[n] != ':' && p[n] != ' ' && p[n] != '\t')
			n++;
		if (n == 0 || n >= sizeof(word))
			return set_error(err, errlen, "invalid %s: %s (unknown protocol \"%.*s\")", setting, value,
			                 (int)(n < 32 ? n : 32), p);
		memcpy(word, p, n);
		word[n] = '\0';
		p += n;
		if (first && negate)
			m = TLS_PROTO_ALL;
		first = false;
		for (size_t i = 0; i < sizeof(proto_words) / sizeof(proto_words[0]); i++) {
			if (strcasecmp(word, proto_words[i].word) == 0) {
				m = negate ? m & ~proto_words[i].mask : m | proto_words[i].mask;
				known = true;
				break;
			}
		}
		if (!known)
			return set_error(err, errlen, "invalid %s: %s (unknown protocol \"%s\")", setting, value, word);
	}
	if (m == 0)
		return set_error(err, errlen, "invalid %s: %s (enables no protocol)", setting, value);
	*mask = m;
	return true;
}

/* Limit ctx to the protocols of `mask` (lowest..highest, holes switched off). */
static bool apply_protocols(SSL_CTX *ctx, const char *setting, const char *value, char *err, size_t errlen)
{
	unsigned mask;
	int lo = -1, hi = -1;
	char r[256];

	if (!tls_parse_protocols(setting, value, &mask, err, errlen))
		return false;
	for (int i = 0; i < 4; i++) {
		if (mask & (1u << i)) {
			if (lo < 0)
				lo = i;
			hi = i;
		}
	}
	if (!SSL_CTX_set_min_proto_version(ctx, proto_versions[lo].version) ||
	    !SSL_CTX_set_max_proto_version(ctx, proto_versions[hi].version))
		return set_error(err, errlen, "invalid %s: %s (%s)", setting, value, ssl_reason(r, sizeof(r)));
	for (int i = lo + 1; i < hi; i++) {
		if (!(mask & (1u << i)))
			SSL_CTX_set_options(ctx, proto_versions[i].no_option);
	}
	return true;
}

/* *_tls_ciphers (TLS <= 1.2) and *_tls13_ciphers. */
static bool apply_ciphers(SSL_CTX *ctx, const char *setting, const char *value, const char *setting13,
                          const char *value13, char *err, size_t errlen)
{
	char r[256];

	if (is_set(value) && strcasecmp(value, "default") != 0 && strcasecmp(value, "secure") != 0 &&
	    strcasecmp(value, "fast") != 0 && strcasecmp(value, "normal") != 0) {
		const char *list = strcasecmp(value, "all") == 0 ? "ALL" : value;

		if (!SSL_CTX_set_cipher_list(ctx, list)) {
			ERR_clear_error();
			return set_error(err, errlen, "invalid %s: %s", setting, value);
		}
	}
	if (is_set(value13) && !SSL_CTX_set_ciphersuites(ctx, value13))
		return set_error(err, errlen, "TLS setup failed: failed to set the TLSv1.3 cipher suites (%s: %s: %s)",
		                 setting13, value13, ssl_reason(r, sizeof(r)));
	return true;
}

/* client_tls_ecdhcurve: `auto` = OpenSSL's groups, `none` = no elliptic curves, else a list of names. */
static bool apply_ecdhcurve(SSL_CTX *ctx, const char *value, char *err, size_t errlen)
{
	char list[256], r[256];

	if (!is_set(value) || strcasecmp(value, "auto") == 0)
		return true;
	if (strcasecmp(value, "none") == 0) {
		snprintf(list, sizeof(list), "%s", FFDHE_GROUPS);
	} else {
		if (strlen(value) >= sizeof(list))
			return set_error(err, errlen, "invalid client_tls_ecdhcurve: %s (too long)", value);
		snprintf(list, sizeof(list), "%s", value);
		for (char *c = list; *c != '\0'; c++) {
			if (*c == ',')
				*c = ':';
		}
	}
	if (!SSL_CTX_set1_groups_list(ctx, list))
		return set_error(err, errlen, "invalid client_tls_ecdhcurve: %s (%s)", value, ssl_reason(r, sizeof(r)));
	return true;
}

/* DH parameters of a named group built into OpenSSL (RFC 7919 / RFC 5114). */
static EVP_PKEY *dh_named_group(const char *name)
{
	EVP_PKEY_CTX *pctx = EVP_PKEY_CTX_new_from_name(NULL, "DH", NULL);
	EVP_PKEY *pkey = NULL;

	if (pctx != NULL && EVP_PKEY_paramgen_init(pctx) > 0 && EVP_PKEY_CTX_set_group_name(pctx, name) > 0)
		(void)EVP_PKEY_paramgen(pctx, &pkey);
	EVP_PKEY_CTX_free(pctx);
	return pkey;
}

/* client_tls_dheparams for TLS <= 1.2 DHE: none, auto = 2048 bits, legacy = 1024 bits. */
static bool apply_dheparams(SSL_CTX *ctx, const char *value, char *err, size_t errlen)
{
	enum { DHE_NONE, DHE_AUTO, DHE_LEGACY } dhe;
	const char *group;
	EVP_PKEY *pkey;
	int bits, slot;
	char r[256];

	if (!is_set(value) || strcasecmp(value, "auto") == 0)
		dhe = DHE_AUTO;
	else if (strcasecmp(value, "none") == 0)
		dhe = DHE_NONE;
	else if (strcasecmp(value, "legacy") == 0)
		dhe = DHE_LEGACY;
	else
		return set_error(err, errlen, "invalid client_tls_dheparams: %s", value);
	if (dhe == DHE_NONE)
		return true;
	group = dhe == DHE_LEGACY ? "dh_1024_160" : "ffdhe2048";
	pkey = dh_named_group(group);
	if (pkey == NULL)
		return set_error(err, errlen, "client_tls_dheparams: cannot build DH group %s: %s", group,
		                 ssl_reason(r, sizeof(r)));
	bits = EVP_PKEY_get_bits(pkey);
	if (!SSL_CTX_set0_tmp_dh_pkey(ctx, pkey)) {
		EVP_PKEY_free(pkey);
		return set_error(err, errlen, "client_tls_dheparams=%s: OpenSSL refused DH group %s: %s%s",
		                 dhe == DHE_LEGACY ? "legacy" : "auto", group, ssl_reason(r, sizeof(r)),
		                 dhe == DHE_LEGACY ? " (a 1024-bit group needs @SECLEVEL=1 in client_tls_ciphers)"
		                                   : "");
	}
	slot = dh_bits_slot();
	if (slot < 0 || !SSL_CTX_set_ex_data(ctx, slot, (void *)(intptr_t)bits))
		return set_error(err, errlen, "SSL_CTX_set_ex_data() failed: %s", ssl_reason(r, sizeof(r)));
	return true;
}

/* The files a context loads, for the error texts. */
typedef enum TlsFile {
	TLS_FILE_KEY,  /* *_tls_key_file */
	TLS_FILE_CERT, /* *_tls_cert_file */
	TLS_FILE_CA,   /* *_tls_ca_file */
} TlsFile;

/*
 * PgBouncer's text for a file that did not load, with the reason (where
 * PgBouncer often has "(null)"), then in brackets the setting at fault,
 * which PgBouncer does not name, and `detail` (may be empty).
 */
static bool file_error(char *err, size_t errlen, TlsFile kind, const char *setting, const char *path,
                       const char *reason, const char *detail)
{
	switch (kind) {
	case TLS_FILE_KEY:
		return set_error(err, errlen, "TLS setup failed: failed to load private key file \"%s\": %s (%s%s)",
		                 path, reason, setting, detail);
	case TLS_FILE_CERT:
		return set_error(err, errlen, "TLS setup failed: failed to load certificate file \"%s\": %s (%s%s)",
		                 path, reason, setting, detail);
	default:
		return set_error(err, errlen, "TLS setup failed: failed to load CA: %s (%s %s%s)", reason, setting,
		                 path, detail);
	}
}

/* Fail with the file and errno when `path` cannot be opened for reading. */
static bool check_readable(TlsFile kind, const char *setting, const char *path, char *err, size_t errlen)
{
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return file_error(err, errlen, kind, setting, path, strerror(errno), "");
	if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
		close(fd);
		return file_error(err, errlen, kind, setting, path, strerror(EISDIR), "");
	}
	close(fd);
	return true;
}

/* Never prompt for a key passphrase: an encrypted key is an error. */
static int no_password(char *buf, int size, int rwflag, void *u)
{
	(void)buf;
	(void)size;
	(void)rwflag;
	(void)u;
	return 0;
}

/* An ASN1 time as "YYYY-MM-DD HH:MM:SS UTC". */
static void format_asn1_time(const ASN1_TIME *t, char *buf, size_t len)
{
	struct tm tm;

	if (ASN1_TIME_to_tm(t, &tm) != 1 || strftime(buf, len, "%Y-%m-%d %H:%M:%S UTC", &tm) == 0)
		snprintf(buf, len, "(unreadable date)");
}

/*
 * Load the certificate chain and key into ctx, checking each file, that the
 * key belongs to the certificate, and that the certificate is valid now.
 */
static bool load_keypair(SSL_CTX *ctx, const char *key_setting, const char *key_path, const char *cert_setting,
                         const char *cert_path, char *err, size_t errlen)
{
	EVP_PKEY *pkey = NULL;
	X509 *cert;
	BIO *bio;
	char r[256], when[64];

	if (!check_readable(TLS_FILE_CERT, cert_setting, cert_path, err, errlen) ||
	    !check_readable(TLS_FILE_KEY, key_setting, key_path, err, errlen))
		return false;
	if (SSL_CTX_use_certificate_chain_file(ctx, cert_path) != 1)
		return file_error(err, errlen, TLS_FILE_CERT, cert_setting, cert_path, ssl_first_reason(r, sizeof(r)),
		                  "");
	bio = BIO_new_file(key_path, "r");
	if (bio != NULL) {
		pkey = PEM_read_bio_PrivateKey(bio, NULL, no_password, NULL);
		BIO_free(bio);
	}
	if (pkey == NULL)
		return file_error(err, errlen, TLS_FILE_KEY, key_setting, key_path, ssl_first_reason(r, sizeof(r)), "");
	char mismatch[PATH_MAX + 64];
	snprintf(mismatch, sizeof(mismatch), " does not match %s %s", cert_setting, cert_path);
	cert = SSL_CTX_get0_certificate(ctx);
	if (cert == NULL || X509_check_private_key(cert, pkey) != 1) {
		EVP_PKEY_free(pkey);
		ERR_clear_error();
		/* OpenSSL's reason, as PgBouncer gives it */
		return file_error(err, errlen, TLS_FILE_KEY, key_setting, key_path, "key values mismatch", mismatch);
	}
	if (SSL_CTX_use_PrivateKey(ctx, pkey) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
		EVP_PKEY_free(pkey);
		return file_error(err, errlen, TLS_FILE_KEY, key_setting, key_path, ssl_reason(r, sizeof(r)), mismatch);
	}
	EVP_PKEY_free(pkey); /* ctx holds its own reference */
	if (X509_cmp_current_time(X509_get0_notAfter(cert)) <= 0) {
		format_asn1_time(X509_get0_notAfter(cert), when, sizeof(when));
		return set_error(err, errlen, "certificate in %s %s expired on %s", cert_setting, cert_path, when);
	}
	if (X509_cmp_current_time(X509_get0_notBefore(cert)) >= 0) {
		format_asn1_time(X509_get0_notBefore(cert), when, sizeof(when));
		return set_error(err, errlen, "certificate in %s %s is not valid before %s", cert_setting, cert_path,
		                 when);
	}
	return true;
}

/* Load a CA bundle for verifying peers; on the accepting side also name its CAs in the certificate request. */
static bool load_ca(SSL_CTX *ctx, const char *setting, const char *path, bool list_for_clients, char *err,
                    size_t errlen)
{
	char r[256];

	if (!check_readable(TLS_FILE_CA, setting, path, err, errlen))
		return false;
	if (SSL_CTX_load_verify_locations(ctx, path, NULL) != 1)
		return file_error(err, errlen, TLS_FILE_CA, setting, path, ssl_first_reason(r, sizeof(r)), "");
	if (list_for_clients) {
		STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(path);

		if (names == NULL)
			return file_error(err, errlen, TLS_FILE_CA, setting, path, ssl_first_reason(r, sizeof(r)), "");
		SSL_CTX_set_client_CA_list(ctx, names);
	}
	return true;
}

/*
 * Direct TLS clients announce ALPN "postgresql". Like PostgreSQL, refuse a
 * client that offers ALPN without it (a TLS connection meant for another
 * protocol); a client offering no ALPN at all never gets here.
 */
static int alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen, const unsigned char *in,
                       unsigned int inlen, void *arg)
{
	unsigned int i = 0;

	(void)ssl;
	(void)arg;
	while (i < inlen) {
		unsigned int n = in[i];

		if (n == 0 || i + 1 + n > inlen)
			return SSL_TLSEXT_ERR_ALERT_FATAL;
		if (n == sizeof(alpn_wire) - 2 && memcmp(in + i + 1, alpn_wire + 1, n) == 0) {
			*out = in + i + 1;
			*outlen = (unsigned char)n;
			return SSL_TLSEXT_ERR_OK;
		}
		i += 1 + n;
	}
	return SSL_TLSEXT_ERR_ALERT_FATAL;
}

/* Settings both directions share: no compression, no session resumption (doc/tls.md; doc/architecture.md "TLS defaults"). */
static void common_setup(SSL_CTX *ctx)
{
	SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION);
	SSL_CTX_set_num_tickets(ctx, 0);
	SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
	/* the stream buffer may retry a write from a moved buffer and accepts short writes, like write(2) */
	SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
	                          SSL_MODE_RELEASE_BUFFERS);
	/*
	 * Read whatever the socket holds, not a record's 5-byte header and then
	 * its body: two read()s per record otherwise (doc/tls.md). The stream
	 * buffer asks SSL_has_pending() for bytes OpenSSL read ahead.
	 */
	SSL_CTX_set_read_ahead(ctx, 1);
	SSL_CTX_set_default_passwd_cb(ctx, no_password);
}

/* Why client certificates must be verified, for the error text; NULL if they need not be. */
static const char *verify_reason(const CfGlobals *g, bool need_client_cert_verify)
{
	if (g->client_tls_sslmode == SSLMODE_VERIFY_CA)
		return "client_tls_sslmode=verify-ca";
	if (g->client_tls_sslmode == SSLMODE_VERIFY_FULL)
		return "client_tls_sslmode=verify-full";
	if (g->auth_type == AUTH_CERT)
		return "auth_type=cert";
	if (need_client_cert_verify)
		return "hba rules use the cert method";
	return NULL;
}

bool tls_build_client_ctx(const CfGlobals *g, bool need_client_cert_verify, SSL_CTX **out, char *err, size_t errlen)
{
	const char *reason = verify_reason(g, need_client_cert_verify);
	SSL_CTX *ctx;
	char r[256];

	if (g->auth_type == AUTH_CERT && g->client_tls_sslmode != SSLMODE_VERIFY_FULL)
		return set_error(err, errlen, "auth_type=cert requires client_tls_sslmode=verify-full");
	if (g->client_tls_sslmode == SSLMODE_DISABLE) {
		*out = NULL;
		return true;
	}
	if (!is_set(g->client_tls_key_file) || !is_set(g->client_tls_cert_file))
		return set_error(err, errlen,
		                 "To allow TLS connections from clients, client_tls_key_file and "
		                 "client_tls_cert_file must be set.");
	if (reason != NULL && !is_set(g->client_tls_ca_file)) {
		/* PgBouncer's texts; the hba case is ours */
		if (g->auth_type == AUTH_CERT)
			return set_error(err, errlen, "auth_type=cert requires client_tls_ca_file");
		if (g->client_tls_sslmode >= SSLMODE_VERIFY_CA)
			return set_error(err, errlen, "client_tls_sslmode requires client_tls_ca_file (%s)", reason);
		return set_error(err, errlen,
		                 "client certificates must be verified (%s) but client_tls_ca_file is not set", reason);
	}

	ctx = SSL_CTX_new(TLS_server_method());
	if (ctx == NULL)
		return set_error(err, errlen, "SSL_CTX_new() failed: %s", ssl_reason(r, sizeof(r)));
	common_setup(ctx);
	SSL_CTX_set_options(ctx, SSL_OP_CIPHER_SERVER_PREFERENCE);
	if (!SSL_CTX_set_session_id_context(ctx, session_id_ctx, sizeof(session_id_ctx) - 1)) {
		set_error(err, errlen, "SSL_CTX_set_session_id_context() failed: %s", ssl_reason(r, sizeof(r)));
		goto failed;
	}
	/* ciphers first: an @SECLEVEL in them governs the key sizes accepted below */
	if (!apply_ciphers(ctx, "client_tls_ciphers", g->client_tls_ciphers, "client_tls13_ciphers",
	                   g->client_tls13_ciphers, err, errlen) ||
	    !apply_protocols(ctx, "client_tls_protocols", g->client_tls_protocols, err, errlen) ||
	    !apply_ecdhcurve(ctx, g->client_tls_ecdhcurve, err, errlen) ||
	    !apply_dheparams(ctx, g->client_tls_dheparams, err, errlen) ||
	    !load_keypair(ctx, "client_tls_key_file", g->client_tls_key_file, "client_tls_cert_file",
	                  g->client_tls_cert_file, err, errlen))
		goto failed;

	/* never the system CA bundle here: only client_tls_ca_file can vouch for a client */
	if (is_set(g->client_tls_ca_file)) {
		if (!load_ca(ctx, "client_tls_ca_file", g->client_tls_ca_file, true, err, errlen))
			goto failed;
		/* hba `cert` lines alone need a CA but not a certificate from every TLS client */
		bool required = g->client_tls_sslmode >= SSLMODE_VERIFY_CA || g->auth_type == AUTH_CERT;
		if (reason != NULL && required)
			SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
		else
			SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL); /* asked for, optional; one sent must verify */
	} else {
		SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
	}
	SSL_CTX_set_alpn_select_cb(ctx, alpn_select, NULL);
	*out = ctx;
	return true;

failed:
	SSL_CTX_free(ctx);
	ERR_clear_error();
	return false;
}

bool tls_build_server_ctx(const CfGlobals *g, SSL_CTX **out, char *err, size_t errlen)
{
	bool verify = g->server_tls_sslmode == SSLMODE_VERIFY_CA || g->server_tls_sslmode == SSLMODE_VERIFY_FULL;
	bool has_key = is_set(g->server_tls_key_file), has_cert = is_set(g->server_tls_cert_file);
	SSL_CTX *ctx;
	char r[256];

	if (g->server_tls_sslmode == SSLMODE_DISABLE) {
		*out = NULL;
		return true;
	}
	if (verify && !is_set(g->server_tls_ca_file))
		return set_error(err, errlen,
		                 "server_tls_sslmode=%s verifies servers but server_tls_ca_file is not set",
		                 config_enum_name(cf_sslmodes, g->server_tls_sslmode));
	if (has_key != has_cert)
		return set_error(err, errlen, "%s is set but %s is not",
		                 has_key ? "server_tls_key_file" : "server_tls_cert_file",
		                 has_key ? "server_tls_cert_file" : "server_tls_key_file");

	ctx = SSL_CTX_new(TLS_client_method());
	if (ctx == NULL)
		return set_error(err, errlen, "SSL_CTX_new() failed: %s", ssl_reason(r, sizeof(r)));
	common_setup(ctx);
	if (!apply_ciphers(ctx, "server_tls_ciphers", g->server_tls_ciphers, "server_tls13_ciphers",
	                   g->server_tls13_ciphers, err, errlen) ||
	    !apply_protocols(ctx, "server_tls_protocols", g->server_tls_protocols, err, errlen))
		goto failed;
	if (has_key && !load_keypair(ctx, "server_tls_key_file", g->server_tls_key_file, "server_tls_cert_file",
	                             g->server_tls_cert_file, err, errlen))
		goto failed;
	if (verify) {
		if (!load_ca(ctx, "server_tls_ca_file", g->server_tls_ca_file, false, err, errlen))
			goto failed;
		SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
	} else {
		SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
	}
	/* PostgreSQL 17+ checks it when offered; older servers ignore it */
	if (SSL_CTX_set_alpn_protos(ctx, alpn_wire, sizeof(alpn_wire) - 1) != 0) {
		set_error(err, errlen, "SSL_CTX_set_alpn_protos() failed: %s", ssl_reason(r, sizeof(r)));
		goto failed;
	}
	*out = ctx;
	return true;

failed:
	SSL_CTX_free(ctx);
	ERR_clear_error();
	return false;
}

void tls_contexts_init(TlsContexts *t)
{
	memset(t, 0, sizeof(*t));
	t->client_sslmode = SSLMODE_DISABLE;
	t->server_sslmode = SSLMODE_DISABLE;
}

void tls_contexts_free(TlsContexts *t)
{
	SSL_CTX_free(t->client_ctx);
	SSL_CTX_free(t->server_ctx);
	free(t->server_key);
	tls_contexts_init(t);
}

static const char *str_or_empty(const char *s)
{
	return s != NULL ? s : "";
}

/* The server_tls_* settings as one string, to tell whether a reload changed them. */
static char *server_settings_key(const CfGlobals *g)
{
	const char *parts[] = {g->server_tls_ca_file,   g->server_tls_cert_file, g->server_tls_key_file,
	                       g->server_tls_protocols, g->server_tls_ciphers,   g->server_tls13_ciphers};
	size_t len = 16;
	char *key;
	int off;

	for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
		len += strlen(str_or_empty(parts[i])) + 1;
	key = malloc(len);
	if (key == NULL)
		return NULL;
	off = snprintf(key, len, "%d", g->server_tls_sslmode);
	for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
		off += snprintf(key + off, len - (size_t)off, "\n%s", str_or_empty(parts[i]));
	return key;
}

/* A cipher list that needs no check: unset, or a keyword apply_ciphers() leaves to OpenSSL's default or ALL. */
static bool cipher_keyword(const char *value)
{
	return !is_set(value) || strcasecmp(value, "default") == 0 || strcasecmp(value, "secure") == 0 ||
	       strcasecmp(value, "fast") == 0 || strcasecmp(value, "normal") == 0 || strcasecmp(value, "all") == 0;
}

/*
 * Whether the server context can wait for the first server connection:
 * TLS only if the server offers it, and nothing that could fail to load
 * or parse except the protocol list, which tls_parse_protocols() checks
 * without OpenSSL.
 */
static bool server_ctx_deferrable(const CfGlobals *g, char *err, size_t errlen, bool *ok)
{
	unsigned mask;

	*ok = true;
	if ((g->server_tls_sslmode != SSLMODE_ALLOW && g->server_tls_sslmode != SSLMODE_PREFER) ||
	    is_set(g->server_tls_key_file) || is_set(g->server_tls_cert_file) ||
	    !cipher_keyword(g->server_tls_ciphers) || is_set(g->server_tls13_ciphers))
		return false;
	*ok = tls_parse_protocols("server_tls_protocols", g->server_tls_protocols, &mask, err, errlen);
	return true;
}

bool tls_server_ctx_ensure(TlsContexts *t, const CfGlobals *g, char *err, size_t errlen)
{
	if (t->server_ctx != NULL || !t->server_deferred)
		return true;
	return tls_build_server_ctx(g, &t->server_ctx, err, errlen);
}

bool tls_contexts_reload(TlsContexts *cur, const CfGlobals *g, bool need_client_cert_verify, char *err, size_t errlen)
{
	SSL_CTX *client_ctx = NULL, *server_ctx = NULL;
	bool deferred, ok;
	char *key;

	if (!tls_build_client_ctx(g, need_client_cert_verify, &client_ctx, err, errlen))
		return false;
	deferred = server_ctx_deferrable(g, err, errlen, &ok);
	if (!ok || (!deferred && !tls_build_server_ctx(g, &server_ctx, err, errlen))) {
		SSL_CTX_free(client_ctx);
		return false;
	}
	key = server_settings_key(g);
	if (key == NULL) {
		SSL_CTX_free(client_ctx);
		SSL_CTX_free(server_ctx);
		return set_error(err, errlen, "out of memory");
	}
	cur->server_changed = cur->server_key == NULL || strcmp(cur->server_key, key) != 0;
	SSL_CTX_free(cur->client_ctx);
	SSL_CTX_free(cur->server_ctx);
	free(cur->server_key);
	cur->client_ctx = client_ctx;
	cur->server_ctx = server_ctx;
	cur->client_sslmode = g->client_tls_sslmode;
	cur->server_sslmode = g->server_tls_sslmode;
	cur->server_key = key;
	cur->server_deferred = deferred;
	return true;
}

SSL *tls_client_ssl_new(const TlsContexts *t)
{
	SSL *ssl;

	if (t->client_ctx == NULL)
		return NULL;
	ssl = SSL_new(t->client_ctx);
	if (ssl == NULL)
		ERR_clear_error();
	return ssl;
}

SSL *tls_server_ssl_new(const TlsContexts *t, const char *host, char *err, size_t errlen)
{
	char r[256];
	SSL *ssl;

	if (t->server_ctx == NULL) {
		set_error(err, errlen, "server TLS is disabled");
		return NULL;
	}
	ssl = SSL_new(t->server_ctx);
	if (ssl == NULL) {
		set_error(err, errlen, "SSL_new() failed: %s", ssl_reason(r, sizeof(r)));
		return NULL;
	}
	if (!tls_set_server_hostname(ssl, host, t->server_sslmode == SSLMODE_VERIFY_FULL, err, errlen)) {
		SSL_free(ssl);
		return NULL;
	}
	return ssl;
}

bool tls_set_server_hostname(SSL *ssl, const char *host, bool verify_name, char *err, size_t errlen)
{
	unsigned char addr[sizeof(struct in6_addr)];
	bool is_ip;
	char r[256];

	if (!is_set(host) || host[0] == '/' || host[0] == '@') {
		if (verify_name)
			return set_error(err, errlen, "server_tls_sslmode=verify-full: no host name to verify");
		return true;
	}
	is_ip = inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1;
	if (!is_ip && SSL_set_tlsext_host_name(ssl, host) != 1)
		return set_error(err, errlen, "cannot set TLS server name \"%s\": %s", host, ssl_reason(r, sizeof(r)));
	if (!verify_name)
		return true;
	if (is_ip) {
		if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host) != 1)
			return set_error(err, errlen, "cannot verify against IP address \"%s\": %s", host,
			                 ssl_reason(r, sizeof(r)));
	} else {
		SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
		if (SSL_set1_host(ssl, host) != 1)
			return set_error(err, errlen, "cannot verify against host name \"%s\": %s", host,
			                 ssl_reason(r, sizeof(r)));
	}
	return true;
}

bool tls_alpn_is_postgresql(const SSL *ssl)
{
	const unsigned char *proto = NULL;
	unsigned int len = 0;

	SSL_get0_alpn_selected(ssl, &proto, &len);
	return proto != NULL && len == sizeof(alpn_wire) - 2 && memcmp(proto, alpn_wire + 1, len) == 0;
}

/* Bits of an RFC 7919 group, 0 for anything else. */
static int ffdhe_bits(int nid)
{
	switch (nid) {
	case NID_ffdhe2048:
		return 2048;
	case NID_ffdhe3072:
		return 3072;
	case NID_ffdhe4096:
		return 4096;
	case NID_ffdhe6144:
		return 6144;
	case NID_ffdhe8192:
		return 8192;
	default:
		return 0;
	}
}

/*
 * The key exchange part of tls_describe(): the negotiated group (ECDHE and
 * TLS 1.3 finite-field groups), else an ephemeral key OpenSSL still holds,
 * else for TLS <= 1.2 DHE the group the context was given.
 */
static void describe_kx(SSL *s, const SSL_CIPHER *cipher, char *buf, size_t len)
{
	int nid = SSL_get_negotiated_group(s), bits = 0, slot;
	EVP_PKEY *key = NULL;

	if (nid > 0 && (bits = ffdhe_bits(nid)) == 0) {
		const char *name = OBJ_nid2sn(nid);

		if (name != NULL)
			snprintf(buf, len, "/ECDH=%s", name);
		return;
	}
	if (bits == 0 && (SSL_get_peer_tmp_key(s, &key) == 1 || SSL_get_tmp_key(s, &key) == 1)) {
		if (EVP_PKEY_is_a(key, "DH"))
			bits = EVP_PKEY_get_bits(key);
		EVP_PKEY_free(key);
	}
	if (bits == 0 && SSL_CIPHER_get_kx_nid(cipher) == NID_kx_dhe && (slot = dh_bits_slot()) >= 0)
		bits = (int)(intptr_t)SSL_CTX_get_ex_data(SSL_get_SSL_CTX(s), slot);
	ERR_clear_error();
	if (bits > 0)
		snprintf(buf, len, "/DH=%d", bits);
}

void tls_describe(const SSL *ssl, char *buf, size_t len)
{
	const SSL_CIPHER *cipher;
	int n;

	if (len == 0)
		return;
	buf[0] = '\0';
	if (ssl == NULL || (cipher = SSL_get_current_cipher(ssl)) == NULL)
		return;
	n = snprintf(buf, len, "%s/%s", SSL_get_version(ssl), SSL_CIPHER_get_name(cipher));
	if (n < 0 || (size_t)n >= len)
		return;
	/* the getters are SSL_ctrl() macros, which take no const */
	describe_kx((SSL *)ssl, cipher, buf + n, len - (size_t)n);
}

int tls_peer_cert_names(SSL *ssl, char names[][TLS_NAME_LEN], int max)
{
	int n = 0;
	X509 *cert = ssl ? SSL_get1_peer_certificate(ssl) : NULL;

	/* only a certificate that verified against client_tls_ca_file names anybody */
	if (cert == NULL || SSL_get_verify_result(ssl) != X509_V_OK) {
		X509_free(cert);
		return 0;
	}
	X509_NAME *subj = X509_get_subject_name(cert);
	int pos = -1;
	while (n < max && (pos = X509_NAME_get_index_by_NID(subj, NID_commonName, pos)) >= 0) {
		ASN1_STRING *d = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subj, pos));
		unsigned char *utf8 = NULL;
		int len = ASN1_STRING_to_UTF8(&utf8, d);
		/* a name with an embedded NUL or one too long is nobody's */
		if (len > 0 && len < TLS_NAME_LEN && memchr(utf8, 0, (size_t)len) == NULL) {
			memcpy(names[n], utf8, (size_t)len);
			names[n++][len] = '\0';
		}
		OPENSSL_free(utf8);
	}
	GENERAL_NAMES *sans = X509_get_ext_d2i(cert, NID_subject_alt_name, NULL, NULL);
	for (int i = 0; sans && i < sk_GENERAL_NAME_num(sans) && n < max; i++) {
		const GENERAL_NAME *gn = sk_GENERAL_NAME_value(sans, i);
		if (gn->type != GEN_DNS && gn->type != GEN_EMAIL)
			continue;
		const ASN1_IA5STRING *s = gn->d.ia5;
		int len = ASN1_STRING_length(s);
		const unsigned char *p = ASN1_STRING_get0_data(s);
		if (len > 0 && len < TLS_NAME_LEN && memchr(p, 0, (size_t)len) == NULL) {
			memcpy(names[n], p, (size_t)len);
			names[n++][len] = '\0';
		}
	}
	GENERAL_NAMES_free(sans);
	X509_free(cert);
	return n;
}
