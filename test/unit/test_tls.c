/*
 * Unit tests for the TLS configuration module: certificates are made at test
 * time with OpenSSL (a CA, leaves it signed, self-signed, expired and
 * not-yet-valid ones, a stray key), and handshakes run in memory over a BIO
 * pair between the pooler's client-facing and server-facing contexts.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "common/config.h"
#include "common/tls.h"

#define DAY (24L * 3600L)

/* Files written by the group setup. */
static char dir[64];
static char ca_pem[128], srv_pem[128], srv_key[128], rsa_pem[128], rsa_key[128], self_pem[128], self_key[128],
    cli_pem[128], cli_key[128], expired_pem[128], expired_key[128], future_pem[128], future_key[128], other_key[128],
    garbage_pem[128], enc_key[128], empty_dir[128], missing[128];

static long serial = 1;

/* ---- certificate factory ---- */

static EVP_PKEY *new_key(void)
{
	EVP_PKEY *k = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");

	assert_non_null(k);
	return k;
}

static void add_ext(X509 *x, X509 *issuer, int nid, const char *value)
{
	X509V3_CTX v3;
	X509_EXTENSION *ext;

	X509V3_set_ctx(&v3, issuer != NULL ? issuer : x, x, NULL, NULL, 0);
	ext = X509V3_EXT_conf_nid(NULL, &v3, nid, value);
	assert_non_null(ext);
	assert_int_equal(X509_add_ext(x, ext, -1), 1);
	X509_EXTENSION_free(ext);
}

/*
 * A certificate for `key` named `cn`, valid from now+from to now+to seconds,
 * signed by issuer/issuer_key (self-signed when NULL); `san` may be NULL.
 */
static X509 *new_cert(EVP_PKEY *key, const char *cn, const char *san, bool ca, long from, long to, X509 *issuer,
                      EVP_PKEY *issuer_key)
{
	X509 *x = X509_new();
	X509_NAME *name;

	assert_non_null(x);
	assert_int_equal(X509_set_version(x, 2), 1);
	assert_int_equal(ASN1_INTEGER_set(X509_get_serialNumber(x), serial++), 1);
	assert_non_null(X509_gmtime_adj(X509_getm_notBefore(x), from));
	assert_non_null(X509_gmtime_adj(X509_getm_notAfter(x), to));
	assert_int_equal(X509_set_pubkey(x, key), 1);
	name = X509_get_subject_name(x);
	assert_int_equal(X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0), 1);
	assert_int_equal(X509_set_issuer_name(x, issuer != NULL ? X509_get_subject_name(issuer) : name), 1);
	if (ca) {
		add_ext(x, issuer, NID_basic_constraints, "critical,CA:TRUE");
		add_ext(x, issuer, NID_key_usage, "critical,keyCertSign,cRLSign");
	} else {
		add_ext(x, issuer, NID_basic_constraints, "critical,CA:FALSE");
	}
	if (san != NULL)
		add_ext(x, issuer, NID_subject_alt_name, san);
	assert_true(X509_sign(x, issuer_key != NULL ? issuer_key : key, EVP_sha256()) > 0);
	return x;
}

static void write_cert(const char *path, X509 *x)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	assert_int_equal(PEM_write_X509(f, x), 1);
	fclose(f);
}

static void write_key(const char *path, EVP_PKEY *k, const char *passphrase)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	if (passphrase != NULL)
		assert_int_equal(PEM_write_PrivateKey(f, k, EVP_aes_128_cbc(), (unsigned char *)passphrase,
		                                      (int)strlen(passphrase), NULL, NULL),
		                 1);
	else
		assert_int_equal(PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL), 1);
	fclose(f);
}

static void path(char *buf, const char *name)
{
	snprintf(buf, 128, "%s/%s", dir, name);
}

/* Write a leaf/self-signed pair; an EC P-256 key unless `k` is given (taken over). */
static void make_pair_key(EVP_PKEY *k, char *pem, char *key, const char *base, const char *cn, const char *san,
                          long from, long to, X509 *issuer, EVP_PKEY *issuer_key)
{
	char name[64];
	X509 *x = new_cert(k, cn, san, false, from, to, issuer, issuer_key);

	snprintf(name, sizeof(name), "%s.pem", base);
	path(pem, name);
	snprintf(name, sizeof(name), "%s.key", base);
	path(key, name);
	write_cert(pem, x);
	write_key(key, k, NULL);
	X509_free(x);
	EVP_PKEY_free(k);
}

static void make_pair(char *pem, char *key, const char *base, const char *cn, const char *san, long from, long to,
                      X509 *issuer, EVP_PKEY *issuer_key)
{
	make_pair_key(new_key(), pem, key, base, cn, san, from, to, issuer, issuer_key);
}

static int setup_files(void **state)
{
	EVP_PKEY *ca_k, *k;
	X509 *ca;
	FILE *f;

	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/test_tls.XXXXXX");
	assert_non_null(mkdtemp(dir));

	ca_k = new_key();
	ca = new_cert(ca_k, "Test CA", NULL, true, -DAY, 30 * DAY, NULL, NULL);
	path(ca_pem, "ca.pem");
	write_cert(ca_pem, ca);

	make_pair(srv_pem, srv_key, "srv", "localhost", "DNS:localhost,IP:127.0.0.1", -DAY, 30 * DAY, ca, ca_k);
	/* RSA, for TLS 1.2 DHE (there are no DHE-ECDSA suites) */
	k = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)2048);
	assert_non_null(k);
	make_pair_key(k, rsa_pem, rsa_key, "rsa", "localhost", "DNS:localhost", -DAY, 30 * DAY, ca, ca_k);
	make_pair(cli_pem, cli_key, "cli", "alice", NULL, -DAY, 30 * DAY, ca, ca_k);
	make_pair(self_pem, self_key, "self", "selfsigned", "DNS:selfsigned", -DAY, 30 * DAY, NULL, NULL);
	make_pair(expired_pem, expired_key, "expired", "expired", NULL, -10 * DAY, -DAY, NULL, NULL);
	make_pair(future_pem, future_key, "future", "future", NULL, DAY, 10 * DAY, NULL, NULL);

	k = new_key();
	path(other_key, "other.key");
	write_key(other_key, k, NULL);
	path(enc_key, "enc.key");
	write_key(enc_key, k, "secret"); /* same key as other.key, but encrypted */
	EVP_PKEY_free(k);

	path(garbage_pem, "garbage.pem");
	f = fopen(garbage_pem, "w");
	assert_non_null(f);
	fputs("this is not a certificate\n", f);
	fclose(f);

	path(empty_dir, "empty");
	assert_int_equal(mkdir(empty_dir, 0700), 0);
	path(missing, "missing.pem");

	X509_free(ca);
	EVP_PKEY_free(ca_k);
	return 0;
}

static int teardown_files(void **state)
{
	const char *files[] = {rsa_pem,    rsa_key,   ca_pem,  srv_pem,     srv_key,     self_pem,
	                       self_key,   cli_pem,   cli_key, expired_pem, expired_key, future_pem,
	                       future_key, other_key, enc_key, garbage_pem};

	(void)state;
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++)
		unlink(files[i]);
	rmdir(empty_dir);
	rmdir(dir);
	return 0;
}

/* ---- helpers ---- */

static void set(Config *cf, const char *name, const char *value)
{
	char err[CF_ERRMSG_LEN];

	if (!config_set(cf, name, value, err, sizeof(err)))
		fail_msg("config_set(%s, %s): %s", name, value, err);
}

/* A config with client TLS on `mode` using the given pair, server TLS off. */
static void client_config(Config *cf, const char *mode, const char *cert, const char *key)
{
	config_init(cf);
	set(cf, "client_tls_sslmode", mode);
	set(cf, "client_tls_cert_file", cert);
	set(cf, "client_tls_key_file", key);
	set(cf, "server_tls_sslmode", "disable");
}

/* Build the client-facing ctx and expect it to fail with exactly/containing `want`. */
static void expect_client_error(const Config *cf, bool need, const char *want)
{
	SSL_CTX *ctx = (SSL_CTX *)&serial; /* sentinel: must stay untouched */
	char err[TLS_ERR_LEN] = "";

	assert_false(tls_build_client_ctx(&cf->g, need, &ctx, err, sizeof(err)));
	assert_ptr_equal(ctx, (SSL_CTX *)&serial);
	if (strstr(err, want) == NULL)
		fail_msg("error \"%s\" does not contain \"%s\"", err, want);
	assert_int_equal(ERR_peek_error(), 0); /* the queue is left clean */
}

static SSL_CTX *build_client(const Config *cf, bool need)
{
	SSL_CTX *ctx = NULL;
	char err[TLS_ERR_LEN] = "";

	if (!tls_build_client_ctx(&cf->g, need, &ctx, err, sizeof(err)))
		fail_msg("tls_build_client_ctx: %s", err);
	assert_non_null(ctx);
	return ctx;
}

static SSL_CTX *build_server(const Config *cf)
{
	SSL_CTX *ctx = NULL;
	char err[TLS_ERR_LEN] = "";

	if (!tls_build_server_ctx(&cf->g, &ctx, err, sizeof(err)))
		fail_msg("tls_build_server_ctx: %s", err);
	assert_non_null(ctx);
	return ctx;
}

static void expect_server_error(const Config *cf, const char *want)
{
	SSL_CTX *ctx = NULL;
	char err[TLS_ERR_LEN] = "";

	assert_false(tls_build_server_ctx(&cf->g, &ctx, err, sizeof(err)));
	assert_null(ctx);
	if (strstr(err, want) == NULL)
		fail_msg("error \"%s\" does not contain \"%s\"", err, want);
}

/* Drive both ends over a BIO pair until the handshake is done (true) or one end fails (false). */
static bool handshake(SSL *cl, SSL *sv)
{
	BIO *b1 = NULL, *b2 = NULL;
	bool cdone = false, sdone = false;

	assert_int_equal(BIO_new_bio_pair(&b1, 0, &b2, 0), 1);
	SSL_set_bio(cl, b1, b1);
	SSL_set_bio(sv, b2, b2);
	SSL_set_connect_state(cl);
	SSL_set_accept_state(sv);
	for (int i = 0; i < 100 && !(cdone && sdone); i++) {
		SSL *ends[2] = {cl, sv};
		bool *done[2] = {&cdone, &sdone};

		for (int e = 0; e < 2; e++) {
			int r, why;

			if (*done[e])
				continue;
			r = SSL_do_handshake(ends[e]);
			if (r == 1) {
				*done[e] = true;
				continue;
			}
			why = SSL_get_error(ends[e], r);
			if (why != SSL_ERROR_WANT_READ && why != SSL_ERROR_WANT_WRITE) {
				ERR_clear_error();
				return false;
			}
		}
	}
	return cdone && sdone;
}

/* Send a byte each way, so post-handshake messages (session tickets) get processed. */
static void exchange(SSL *cl, SSL *sv)
{
	char c = 0;

	assert_int_equal(SSL_write(sv, "s", 1), 1);
	assert_int_equal(SSL_read(cl, &c, 1), 1);
	assert_int_equal(c, 's');
	assert_int_equal(SSL_write(cl, "c", 1), 1);
	assert_int_equal(SSL_read(sv, &c, 1), 1);
	assert_int_equal(c, 'c');
}

/* Handshake between an SSL from `accept_ctx` and one from `connect_ctx`; returns success, describes both ends. */
static bool connect_pair(SSL_CTX *accept_ctx, SSL_CTX *connect_ctx, const char *host, bool verify_name, char *sv_desc,
                         char *cl_desc, bool *alpn_pg)
{
	SSL *sv = SSL_new(accept_ctx), *cl = SSL_new(connect_ctx);
	char err[TLS_ERR_LEN];
	bool ok;

	assert_non_null(sv);
	assert_non_null(cl);
	assert_true(tls_set_server_hostname(cl, host, verify_name, err, sizeof(err)));
	ok = handshake(cl, sv);
	if (ok)
		exchange(cl, sv);
	if (sv_desc != NULL)
		tls_describe(sv, sv_desc, TLS_DESCRIBE_LEN);
	if (cl_desc != NULL)
		tls_describe(cl, cl_desc, TLS_DESCRIBE_LEN);
	if (alpn_pg != NULL)
		*alpn_pg = tls_alpn_is_postgresql(sv) && tls_alpn_is_postgresql(cl);
	SSL_free(sv);
	SSL_free(cl);
	return ok;
}

static int tickets_seen;

static int count_ticket(SSL *ssl, SSL_SESSION *sess)
{
	(void)ssl;
	(void)sess;
	tickets_seen++;
	return 0; /* we did not keep a reference */
}

static int store_objects(SSL_CTX *ctx)
{
	return sk_X509_OBJECT_num(X509_STORE_get0_objects(SSL_CTX_get_cert_store(ctx)));
}

/* ---- protocol lists ---- */

static void expect_protocols(const char *value, unsigned want)
{
	unsigned mask = 0;
	char err[TLS_ERR_LEN] = "";

	if (!tls_parse_protocols("client_tls_protocols", value, &mask, err, sizeof(err)))
		fail_msg("\"%s\": %s", value ? value : "(null)", err);
	if (mask != want)
		fail_msg("\"%s\": mask %#x, want %#x", value ? value : "(null)", mask, want);
}

static void expect_protocols_error(const char *value, const char *want)
{
	unsigned mask = 12345;
	char err[TLS_ERR_LEN] = "";

	assert_false(tls_parse_protocols("server_tls_protocols", value, &mask, err, sizeof(err)));
	assert_int_equal(mask, 12345);
	if (strstr(err, want) == NULL || strstr(err, "server_tls_protocols") == NULL)
		fail_msg("error \"%s\" does not name the setting and \"%s\"", err, want);
}

static void test_protocol_words(void **state)
{
	(void)state;
	expect_protocols(NULL, TLS_PROTO_TLSV1_2 | TLS_PROTO_TLSV1_3);
	expect_protocols("", TLS_PROTO_TLSV1_2 | TLS_PROTO_TLSV1_3);
	expect_protocols("secure", TLS_PROTO_TLSV1_2 | TLS_PROTO_TLSV1_3);
	expect_protocols("default", TLS_PROTO_TLSV1_2 | TLS_PROTO_TLSV1_3);
	expect_protocols("all", TLS_PROTO_ALL);
	expect_protocols("tlsv1", TLS_PROTO_ALL);
	expect_protocols("tlsv1.0", TLS_PROTO_TLSV1_0);
	expect_protocols("tlsv1.1", TLS_PROTO_TLSV1_1);
	expect_protocols("tlsv1.2", TLS_PROTO_TLSV1_2);
	expect_protocols("tlsv1.3", TLS_PROTO_TLSV1_3);
	expect_protocols("TLSv1.3", TLS_PROTO_TLSV1_3);
	expect_protocols("tlsv1.0:tlsv1.1", TLS_PROTO_TLSV1_0 | TLS_PROTO_TLSV1_1);
	expect_protocols("tlsv1.2, tlsv1.3", TLS_PROTO_TLSV1_2 | TLS_PROTO_TLSV1_3);
	expect_protocols("tlsv1.0,tlsv1.2", TLS_PROTO_TLSV1_0 | TLS_PROTO_TLSV1_2);
}

static void test_protocol_negation(void **state)
{
	(void)state;
	expect_protocols("all,!tlsv1.0", TLS_PROTO_TLSV1_1 | TLS_PROTO_TLSV1_2 | TLS_PROTO_TLSV1_3);
	/* a list starting with ! starts from all */
	expect_protocols("!tlsv1.0", TLS_PROTO_TLSV1_1 | TLS_PROTO_TLSV1_2 | TLS_PROTO_TLSV1_3);
	expect_protocols("!tlsv1.0:!tlsv1.1", TLS_PROTO_TLSV1_2 | TLS_PROTO_TLSV1_3);
	expect_protocols("secure,!tlsv1.3", TLS_PROTO_TLSV1_2);
	expect_protocols("!TLSV1.3", TLS_PROTO_TLSV1_0 | TLS_PROTO_TLSV1_1 | TLS_PROTO_TLSV1_2);
	/* ! later in the list removes from what is there, it does not start from all */
	expect_protocols("tlsv1.3,!tlsv1.0", TLS_PROTO_TLSV1_3);
}

static void test_protocol_errors(void **state)
{
	(void)state;
	expect_protocols_error("tlsv1.4", "unknown protocol \"tlsv1.4\"");
	expect_protocols_error("legacy", "unknown protocol \"legacy\"");
	expect_protocols_error("tlsv1.2,sslv3", "unknown protocol \"sslv3\"");
	expect_protocols_error("!all", "enables no protocol");
	expect_protocols_error("tlsv1.2,!tlsv1.2", "enables no protocol");
	expect_protocols_error("!", "unknown protocol");
}

static void test_protocols_applied(void **state)
{
	Config cf;
	SSL_CTX *ctx;

	(void)state;
	client_config(&cf, "require", self_pem, self_key);
	ctx = build_client(&cf, false);
	assert_int_equal(SSL_CTX_get_min_proto_version(ctx), TLS1_2_VERSION);
	assert_int_equal(SSL_CTX_get_max_proto_version(ctx), TLS1_3_VERSION);
	SSL_CTX_free(ctx);

	set(&cf, "client_tls_protocols", "tlsv1.2");
	ctx = build_client(&cf, false);
	assert_int_equal(SSL_CTX_get_min_proto_version(ctx), TLS1_2_VERSION);
	assert_int_equal(SSL_CTX_get_max_proto_version(ctx), TLS1_2_VERSION);
	SSL_CTX_free(ctx);

	/* a hole between the lowest and the highest is switched off */
	set(&cf, "client_tls_protocols", "tlsv1.1,tlsv1.3");
	ctx = build_client(&cf, false);
	assert_int_equal(SSL_CTX_get_min_proto_version(ctx), TLS1_1_VERSION);
	assert_int_equal(SSL_CTX_get_max_proto_version(ctx), TLS1_3_VERSION);
	assert_true(SSL_CTX_get_options(ctx) & SSL_OP_NO_TLSv1_2);
	assert_false(SSL_CTX_get_options(ctx) & SSL_OP_NO_TLSv1_3);
	SSL_CTX_free(ctx);

	set(&cf, "client_tls_protocols", "tlsv1.2,bogus");
	expect_client_error(&cf, false, "invalid client_tls_protocols: tlsv1.2,bogus (unknown protocol \"bogus\")");
	config_free(&cf);
}

/* ---- the client-facing context ---- */

/*
 * The operator fix: key + certificate and no client_tls_ca_file must work
 * without any system CA bundle, and must not load one.
 */
static void test_client_without_ca(void **state)
{
	const char *modes[] = {"allow", "prefer", "require"};
	SSL_CTX *probe;
	Config cf;

	(void)state;
	/* SSL_CERT_FILE names a real CA: anything reading the default paths would load it */
	assert_int_equal(setenv("SSL_CERT_FILE", ca_pem, 1), 0);
	assert_int_equal(setenv("SSL_CERT_DIR", empty_dir, 1), 0);
	probe = SSL_CTX_new(TLS_server_method());
	assert_int_equal(SSL_CTX_set_default_verify_paths(probe), 1);
	assert_int_equal(store_objects(probe), 1); /* the probe shows the check below can see it */
	SSL_CTX_free(probe);

	for (size_t i = 0; i < 3; i++) {
		SSL_CTX *ctx;

		client_config(&cf, modes[i], srv_pem, srv_key);
		ctx = build_client(&cf, false);
		assert_int_equal(SSL_CTX_get_verify_mode(ctx), SSL_VERIFY_NONE);
		assert_int_equal(store_objects(ctx), 0);
		assert_true(sk_X509_NAME_num(SSL_CTX_get_client_CA_list(ctx)) <= 0);
		SSL_CTX_free(ctx);
		config_free(&cf);
	}

	/* and with no system bundle at all */
	assert_int_equal(setenv("SSL_CERT_FILE", missing, 1), 0);
	assert_int_equal(setenv("SSL_CERT_DIR", missing, 1), 0);
	client_config(&cf, "require", self_pem, self_key);
	SSL_CTX_free(build_client(&cf, false));
	config_free(&cf);
	unsetenv("SSL_CERT_FILE");
	unsetenv("SSL_CERT_DIR");
}

static void test_client_disabled(void **state)
{
	SSL_CTX *ctx = (SSL_CTX *)&serial;
	char err[TLS_ERR_LEN] = "";
	Config cf;

	(void)state;
	config_init(&cf); /* default: client_tls_sslmode=disable, no files */
	assert_true(tls_build_client_ctx(&cf.g, true, &ctx, err, sizeof(err)));
	assert_null(ctx);
	config_free(&cf);
}

static void test_client_needs_key_and_cert(void **state)
{
	Config cf;

	(void)state;
	client_config(&cf, "prefer", self_pem, "");
	expect_client_error(&cf, false,
	                    "To allow TLS connections from clients, client_tls_key_file and client_tls_cert_file "
	                    "must be set.");
	set(&cf, "client_tls_key_file", self_key);
	set(&cf, "client_tls_cert_file", "");
	expect_client_error(&cf, false,
	                    "To allow TLS connections from clients, client_tls_key_file and client_tls_cert_file "
	                    "must be set.");
	config_free(&cf);
}

static void test_client_verify_needs_ca(void **state)
{
	Config cf;

	(void)state;
	client_config(&cf, "verify-ca", srv_pem, srv_key);
	expect_client_error(&cf, false,
	                    "client_tls_sslmode requires client_tls_ca_file (client_tls_sslmode=verify-ca)");
	set(&cf, "client_tls_sslmode", "verify-full");
	expect_client_error(&cf, false,
	                    "client_tls_sslmode requires client_tls_ca_file (client_tls_sslmode=verify-full)");
	set(&cf, "auth_type", "cert");
	expect_client_error(&cf, false, "auth_type=cert requires client_tls_ca_file");
	config_free(&cf);

	/* the caller knows about hba cert rules */
	client_config(&cf, "require", srv_pem, srv_key);
	expect_client_error(&cf, true,
	                    "client certificates must be verified (hba rules use the cert method) but "
	                    "client_tls_ca_file is not set");
	config_free(&cf);
}

static void test_auth_cert_needs_verify_full(void **state)
{
	Config cf;

	(void)state;
	client_config(&cf, "require", srv_pem, srv_key);
	set(&cf, "client_tls_ca_file", ca_pem);
	set(&cf, "auth_type", "cert");
	expect_client_error(&cf, false, "auth_type=cert requires client_tls_sslmode=verify-full");
	set(&cf, "client_tls_sslmode", "disable");
	expect_client_error(&cf, false, "auth_type=cert requires client_tls_sslmode=verify-full");
	set(&cf, "client_tls_sslmode", "verify-full");
	SSL_CTX_free(build_client(&cf, false));
	config_free(&cf);
}

static void test_client_with_ca(void **state)
{
	SSL_CTX *ctx;
	Config cf;

	(void)state;
	client_config(&cf, "verify-ca", srv_pem, srv_key);
	set(&cf, "client_tls_ca_file", ca_pem);
	ctx = build_client(&cf, false);
	assert_int_equal(SSL_CTX_get_verify_mode(ctx), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT);
	assert_int_equal(store_objects(ctx), 1);
	assert_int_equal(sk_X509_NAME_num(SSL_CTX_get_client_CA_list(ctx)), 1);
	SSL_CTX_free(ctx);

	/* asked for but optional */
	set(&cf, "client_tls_sslmode", "require");
	ctx = build_client(&cf, false);
	assert_int_equal(SSL_CTX_get_verify_mode(ctx), SSL_VERIFY_PEER);
	SSL_CTX_free(ctx);

	/* hba cert rules need the CA, but clients of other rules need not send a certificate */
	ctx = build_client(&cf, true);
	assert_int_equal(SSL_CTX_get_verify_mode(ctx), SSL_VERIFY_PEER);
	SSL_CTX_free(ctx);
	config_free(&cf);
}

static void test_client_file_errors(void **state)
{
	char want[512];
	Config cf;

	(void)state;
	client_config(&cf, "require", missing, self_key);
	snprintf(want, sizeof(want),
	         "failed to load certificate file \"%s\": No such file or directory (client_tls_cert_file)", missing);
	expect_client_error(&cf, false, want);
	config_free(&cf);

	client_config(&cf, "require", self_pem, missing);
	snprintf(want, sizeof(want),
	         "failed to load private key file \"%s\": No such file or directory (client_tls_key_file)", missing);
	expect_client_error(&cf, false, want);
	config_free(&cf);

	client_config(&cf, "require", self_pem, self_key);
	set(&cf, "client_tls_ca_file", missing);
	snprintf(want, sizeof(want), "failed to load CA: No such file or directory (client_tls_ca_file %s)", missing);
	expect_client_error(&cf, false, want);
	config_free(&cf);

	client_config(&cf, "require", self_pem, empty_dir);
	snprintf(want, sizeof(want), "failed to load private key file \"%s\": Is a directory (client_tls_key_file)",
	         empty_dir);
	expect_client_error(&cf, false, want);
	config_free(&cf);

	client_config(&cf, "require", garbage_pem, self_key);
	snprintf(want, sizeof(want), "failed to load certificate file \"%s\": ", garbage_pem);
	expect_client_error(&cf, false, want);
	config_free(&cf);

	client_config(&cf, "require", self_pem, garbage_pem);
	snprintf(want, sizeof(want), "failed to load private key file \"%s\": ", garbage_pem);
	expect_client_error(&cf, false, want);
	config_free(&cf);

	client_config(&cf, "require", self_pem, self_key);
	set(&cf, "client_tls_ca_file", garbage_pem);
	snprintf(want, sizeof(want), "(client_tls_ca_file %s)", garbage_pem);
	expect_client_error(&cf, false, want);
	config_free(&cf);

	/* an encrypted key fails (it must not prompt for a passphrase) */
	client_config(&cf, "require", self_pem, enc_key);
	snprintf(want, sizeof(want), "failed to load private key file \"%s\": ", enc_key);
	expect_client_error(&cf, false, want);
	config_free(&cf);

	if (geteuid() != 0) { /* root reads anything */
		assert_int_equal(chmod(self_key, 0), 0);
		client_config(&cf, "require", self_pem, self_key);
		snprintf(want, sizeof(want), "failed to load private key file \"%s\": Permission denied", self_key);
		expect_client_error(&cf, false, want);
		config_free(&cf);
		assert_int_equal(chmod(self_key, 0600), 0);
	}
}

static void test_client_key_mismatch(void **state)
{
	char want[512];
	Config cf;

	(void)state;
	client_config(&cf, "require", self_pem, other_key);
	snprintf(want, sizeof(want),
	         "failed to load private key file \"%s\": key values mismatch (client_tls_key_file does not match "
	         "client_tls_cert_file %s)",
	         other_key, self_pem);
	expect_client_error(&cf, false, want);
	config_free(&cf);
}

static void test_client_cert_validity(void **state)
{
	char want[512];
	Config cf;

	(void)state;
	client_config(&cf, "require", expired_pem, expired_key);
	snprintf(want, sizeof(want), "certificate in client_tls_cert_file %s expired on 20", expired_pem);
	expect_client_error(&cf, false, want);
	config_free(&cf);

	client_config(&cf, "require", future_pem, future_key);
	snprintf(want, sizeof(want), "certificate in client_tls_cert_file %s is not valid before 20", future_pem);
	expect_client_error(&cf, false, want);
	config_free(&cf);
}

static void test_client_cipher_settings(void **state)
{
	const char *fine[][2] = {
	    {"client_tls_ciphers", "default"},
	    {"client_tls_ciphers", "secure"},
	    {"client_tls_ciphers", "fast"},
	    {"client_tls_ciphers", "normal"},
	    {"client_tls_ciphers", "all"},
	    {"client_tls_ciphers", "HIGH:!aNULL"},
	    {"client_tls13_ciphers", "TLS_AES_128_GCM_SHA256"},
	    {"client_tls_ecdhcurve", "auto"},
	    {"client_tls_ecdhcurve", "none"},
	    {"client_tls_ecdhcurve", "prime256v1"},
	    {"client_tls_ecdhcurve", "X25519,P-384"},
	    {"client_tls_dheparams", "none"},
	    {"client_tls_dheparams", "auto"},
	};
	const char *bad[][3] = {
	    {"client_tls_ciphers", "NO-SUCH-CIPHER", "invalid client_tls_ciphers: NO-SUCH-CIPHER"},
	    {"client_tls13_ciphers", "TLS_BOGUS",
	     "TLS setup failed: failed to set the TLSv1.3 cipher suites (client_tls13_ciphers: TLS_BOGUS"},
	    {"client_tls_ecdhcurve", "nocurve", "invalid client_tls_ecdhcurve: nocurve"},
	    {"client_tls_dheparams", "bogus", "invalid client_tls_dheparams: bogus"},
	};
	Config cf;

	(void)state;
	for (size_t i = 0; i < sizeof(fine) / sizeof(fine[0]); i++) {
		client_config(&cf, "require", self_pem, self_key);
		set(&cf, fine[i][0], fine[i][1]);
		SSL_CTX_free(build_client(&cf, false));
		config_free(&cf);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		client_config(&cf, "require", self_pem, self_key);
		set(&cf, bad[i][0], bad[i][1]);
		expect_client_error(&cf, false, bad[i][2]);
		config_free(&cf);
	}

	/* 1024-bit DH: refused at security level 2, with the way out in the message */
	client_config(&cf, "require", self_pem, self_key);
	set(&cf, "client_tls_dheparams", "legacy");
	set(&cf, "client_tls_ciphers", "DEFAULT:@SECLEVEL=2");
	expect_client_error(&cf, false,
	                    "client_tls_dheparams=legacy: OpenSSL refused DH group dh_1024_160: dh key too small (a "
	                    "1024-bit group needs @SECLEVEL=1 in client_tls_ciphers)");
	config_free(&cf);

	/* and accepted once the security level allows it */
	client_config(&cf, "require", self_pem, self_key);
	set(&cf, "client_tls_dheparams", "legacy");
	set(&cf, "client_tls_ciphers", "DEFAULT:@SECLEVEL=1");
	SSL_CTX_free(build_client(&cf, false));
	config_free(&cf);
}

/* ---- the server-facing context ---- */

static void test_server_ctx(void **state)
{
	SSL_CTX *ctx = (SSL_CTX *)&serial;
	char err[TLS_ERR_LEN] = "", want[512];
	Config cf;

	(void)state;
	config_init(&cf);
	/* default prefer: no CA, no verification, no system bundle */
	ctx = build_server(&cf);
	assert_int_equal(SSL_CTX_get_verify_mode(ctx), SSL_VERIFY_NONE);
	assert_int_equal(store_objects(ctx), 0);
	SSL_CTX_free(ctx);

	set(&cf, "server_tls_sslmode", "verify-full");
	expect_server_error(&cf, "server_tls_sslmode=verify-full verifies servers but server_tls_ca_file is not set");
	set(&cf, "server_tls_sslmode", "verify-ca");
	expect_server_error(&cf, "server_tls_sslmode=verify-ca verifies servers but server_tls_ca_file is not set");
	set(&cf, "server_tls_ca_file", ca_pem);
	ctx = build_server(&cf);
	assert_int_equal(SSL_CTX_get_verify_mode(ctx), SSL_VERIFY_PEER);
	assert_int_equal(store_objects(ctx), 1);
	SSL_CTX_free(ctx);

	set(&cf, "server_tls_ca_file", missing);
	snprintf(want, sizeof(want), "failed to load CA: No such file or directory (server_tls_ca_file %s)", missing);
	expect_server_error(&cf, want);
	set(&cf, "server_tls_ca_file", ca_pem);

	set(&cf, "server_tls_key_file", cli_key);
	expect_server_error(&cf, "server_tls_key_file is set but server_tls_cert_file is not");
	set(&cf, "server_tls_cert_file", self_pem);
	snprintf(want, sizeof(want),
	         "failed to load private key file \"%s\": key values mismatch (server_tls_key_file does not match "
	         "server_tls_cert_file %s)",
	         cli_key, self_pem);
	expect_server_error(&cf, want);
	set(&cf, "server_tls_cert_file", expired_pem);
	set(&cf, "server_tls_key_file", expired_key);
	snprintf(want, sizeof(want), "certificate in server_tls_cert_file %s expired on", expired_pem);
	expect_server_error(&cf, want);
	set(&cf, "server_tls_cert_file", cli_pem);
	set(&cf, "server_tls_key_file", cli_key);
	SSL_CTX_free(build_server(&cf));

	set(&cf, "server_tls_protocols", "legacy");
	expect_server_error(&cf, "invalid server_tls_protocols: legacy (unknown protocol \"legacy\")");
	set(&cf, "server_tls_protocols", "secure");
	set(&cf, "server_tls_ciphers", "NOPE");
	expect_server_error(&cf, "invalid server_tls_ciphers: NOPE");
	set(&cf, "server_tls_ciphers", "default");
	set(&cf, "server_tls13_ciphers", "NOPE");
	expect_server_error(&cf, "failed to set the TLSv1.3 cipher suites (server_tls13_ciphers: NOPE");

	set(&cf, "server_tls_sslmode", "disable");
	ctx = (SSL_CTX *)&serial;
	assert_true(tls_build_server_ctx(&cf.g, &ctx, err, sizeof(err)));
	assert_null(ctx);
	config_free(&cf);
}

/* ---- handshakes ---- */

/* Pooler accepting with srv cert (no CA), pooler connecting with verify-full. */
static void pair_config(Config *cf)
{
	client_config(cf, "require", srv_pem, srv_key);
	set(cf, "server_tls_sslmode", "verify-full");
	set(cf, "server_tls_ca_file", ca_pem);
}

static void test_handshake(void **state)
{
	char sv_desc[TLS_DESCRIBE_LEN], cl_desc[TLS_DESCRIBE_LEN];
	SSL_CTX *actx, *cctx;
	bool alpn = false;
	Config cf;

	(void)state;
	pair_config(&cf);
	actx = build_client(&cf, false);
	cctx = build_server(&cf);
	assert_true(connect_pair(actx, cctx, "localhost", true, sv_desc, cl_desc, &alpn));
	assert_string_equal(sv_desc, "TLSv1.3/TLS_AES_256_GCM_SHA384/ECDH=X25519");
	assert_string_equal(cl_desc, sv_desc);
	assert_true(alpn);

	/* TLS 1.2 and a chosen curve */
	SSL_CTX_free(actx);
	set(&cf, "client_tls_protocols", "tlsv1.2");
	set(&cf, "client_tls_ecdhcurve", "prime256v1");
	actx = build_client(&cf, false);
	assert_true(connect_pair(actx, cctx, "localhost", true, sv_desc, NULL, NULL));
	assert_string_equal(sv_desc, "TLSv1.2/ECDHE-ECDSA-AES256-GCM-SHA384/ECDH=prime256v1");

	/* no elliptic curves: TLS 1.3 over an RFC 7919 group */
	SSL_CTX_free(actx);
	set(&cf, "client_tls_protocols", "secure");
	set(&cf, "client_tls_ecdhcurve", "none");
	actx = build_client(&cf, false);
	assert_true(connect_pair(actx, cctx, "localhost", true, sv_desc, NULL, NULL));
	assert_string_equal(sv_desc, "TLSv1.3/TLS_AES_256_GCM_SHA384/DH=2048");

	SSL_CTX_free(actx);
	SSL_CTX_free(cctx);

	/* TLS 1.2 DHE with an RSA certificate: the DH size comes from client_tls_dheparams */
	set(&cf, "client_tls_cert_file", rsa_pem);
	set(&cf, "client_tls_key_file", rsa_key);
	set(&cf, "server_tls_ciphers", "DHE-RSA-AES256-GCM-SHA384");
	set(&cf, "server_tls_protocols", "tlsv1.2");
	actx = build_client(&cf, false);
	cctx = build_server(&cf);
	assert_true(connect_pair(actx, cctx, "localhost", true, sv_desc, cl_desc, NULL));
	assert_string_equal(sv_desc, "TLSv1.2/DHE-RSA-AES256-GCM-SHA384/DH=2048");
	assert_string_equal(cl_desc, sv_desc);
	SSL_CTX_free(actx);
	SSL_CTX_free(cctx);

	set(&cf, "client_tls_dheparams", "legacy");
	set(&cf, "client_tls_ciphers", "DEFAULT:@SECLEVEL=1");
	set(&cf, "server_tls_ciphers", "DHE-RSA-AES256-GCM-SHA384:@SECLEVEL=1");
	actx = build_client(&cf, false);
	cctx = build_server(&cf);
	assert_true(connect_pair(actx, cctx, "localhost", true, sv_desc, cl_desc, NULL));
	assert_string_equal(sv_desc, "TLSv1.2/DHE-RSA-AES256-GCM-SHA384/DH=1024");
	assert_string_equal(cl_desc, sv_desc);
	SSL_CTX_free(actx);
	SSL_CTX_free(cctx);

	/* dheparams=none: no DHE, the client's DHE-only list finds nothing in common */
	set(&cf, "client_tls_dheparams", "none");
	actx = build_client(&cf, false);
	cctx = build_server(&cf);
	assert_false(connect_pair(actx, cctx, "localhost", true, NULL, NULL, NULL));
	SSL_CTX_free(actx);
	SSL_CTX_free(cctx);
	config_free(&cf);

	tls_describe(NULL, sv_desc, sizeof(sv_desc));
	assert_string_equal(sv_desc, "");
}

static void test_no_session_tickets(void **state)
{
	SSL_CTX *actx, *cctx, *plain;
	Config cf;

	(void)state;
	pair_config(&cf);
	actx = build_client(&cf, false);
	cctx = build_server(&cf);
	SSL_CTX_set_session_cache_mode(cctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
	SSL_CTX_sess_set_new_cb(cctx, count_ticket);

	/* control: OpenSSL's defaults do send tickets, and the counter sees them */
	plain = SSL_CTX_new(TLS_server_method());
	assert_int_equal(SSL_CTX_use_certificate_chain_file(plain, srv_pem), 1);
	assert_int_equal(SSL_CTX_use_PrivateKey_file(plain, srv_key, SSL_FILETYPE_PEM), 1);
	tickets_seen = 0;
	assert_true(connect_pair(plain, cctx, "localhost", true, NULL, NULL, NULL));
	assert_true(tickets_seen > 0);

	tickets_seen = 0;
	assert_true(connect_pair(actx, cctx, "localhost", true, NULL, NULL, NULL));
	assert_int_equal(tickets_seen, 0);

	/* TLS 1.2 neither */
	SSL_CTX_free(actx);
	set(&cf, "client_tls_protocols", "tlsv1.2");
	actx = build_client(&cf, false);
	tickets_seen = 0;
	assert_true(connect_pair(actx, cctx, "localhost", true, NULL, NULL, NULL));
	assert_int_equal(tickets_seen, 0);

	SSL_CTX_free(plain);
	SSL_CTX_free(actx);
	SSL_CTX_free(cctx);
	config_free(&cf);
}

static void test_alpn(void **state)
{
	SSL_CTX *actx, *cctx;
	SSL *sv, *cl;
	Config cf;

	(void)state;
	pair_config(&cf);
	actx = build_client(&cf, false);
	cctx = build_server(&cf);

	/* no ALPN offered: handshake fine, nothing selected */
	sv = SSL_new(actx);
	cl = SSL_new(cctx);
	assert_int_equal(SSL_set_alpn_protos(cl, NULL, 0), 0);
	assert_true(handshake(cl, sv));
	assert_false(tls_alpn_is_postgresql(sv));
	SSL_free(sv);
	SSL_free(cl);

	/* another protocol only: refused, as PostgreSQL does */
	sv = SSL_new(actx);
	cl = SSL_new(cctx);
	assert_int_equal(SSL_set_alpn_protos(cl, (const unsigned char *)"\x02h2", 3), 0);
	assert_false(handshake(cl, sv));
	SSL_free(sv);
	SSL_free(cl);

	/* postgresql among others: selected */
	sv = SSL_new(actx);
	cl = SSL_new(cctx);
	assert_int_equal(SSL_set_alpn_protos(cl, (const unsigned char *)"\x02h2\x0apostgresql", 14), 0);
	assert_true(handshake(cl, sv));
	assert_true(tls_alpn_is_postgresql(sv));
	assert_true(tls_alpn_is_postgresql(cl));
	SSL_free(sv);
	SSL_free(cl);

	SSL_CTX_free(actx);
	SSL_CTX_free(cctx);
	config_free(&cf);
}

static void test_server_name_checks(void **state)
{
	SSL_CTX *actx, *cctx, *selfctx;
	char err[TLS_ERR_LEN];
	Config cf;
	SSL *ssl;

	(void)state;
	pair_config(&cf);
	actx = build_client(&cf, false);
	cctx = build_server(&cf);
	assert_true(connect_pair(actx, cctx, "localhost", true, NULL, NULL, NULL));
	assert_true(connect_pair(actx, cctx, "127.0.0.1", true, NULL, NULL, NULL));
	assert_false(connect_pair(actx, cctx, "otherhost", true, NULL, NULL, NULL));
	assert_false(connect_pair(actx, cctx, "10.0.0.1", true, NULL, NULL, NULL));
	/* verify-ca: the chain counts, the name does not */
	assert_true(connect_pair(actx, cctx, "otherhost", false, NULL, NULL, NULL));

	/* a certificate from outside the CA fails verify-ca */
	config_free(&cf);
	pair_config(&cf);
	set(&cf, "client_tls_cert_file", self_pem);
	set(&cf, "client_tls_key_file", self_key);
	selfctx = build_client(&cf, false);
	assert_false(connect_pair(selfctx, cctx, "selfsigned", false, NULL, NULL, NULL));
	SSL_CTX_free(selfctx);

	/* verify-full needs a name; a socket path has none */
	ssl = SSL_new(cctx);
	assert_false(tls_set_server_hostname(ssl, NULL, true, err, sizeof(err)));
	assert_string_equal(err, "server_tls_sslmode=verify-full: no host name to verify");
	assert_true(tls_set_server_hostname(ssl, "/tmp", false, err, sizeof(err)));
	SSL_free(ssl);

	SSL_CTX_free(actx);
	SSL_CTX_free(cctx);
	config_free(&cf);
}

static void test_client_certificates(void **state)
{
	SSL_CTX *actx, *cctx, *cctx_cert;
	Config cf;
	SSL *sv, *cl;

	(void)state;
	pair_config(&cf);
	cctx = build_server(&cf);
	set(&cf, "server_tls_cert_file", cli_pem);
	set(&cf, "server_tls_key_file", cli_key);
	cctx_cert = build_server(&cf);

	/* no CA: no certificate requested, so none arrives even from a peer that has one */
	actx = build_client(&cf, false);
	sv = SSL_new(actx);
	cl = SSL_new(cctx_cert);
	assert_true(handshake(cl, sv));
	assert_null(SSL_get0_peer_certificate(sv));
	SSL_free(sv);
	SSL_free(cl);
	SSL_CTX_free(actx);

	/* require + CA: optional */
	set(&cf, "client_tls_ca_file", ca_pem);
	actx = build_client(&cf, false);
	assert_true(connect_pair(actx, cctx, "localhost", true, NULL, NULL, NULL));
	sv = SSL_new(actx);
	cl = SSL_new(cctx_cert);
	assert_true(handshake(cl, sv));
	assert_non_null(SSL_get0_peer_certificate(sv));
	assert_int_equal(SSL_get_verify_result(sv), X509_V_OK);
	SSL_free(sv);
	SSL_free(cl);
	SSL_CTX_free(actx);

	/* verify-ca: mandatory */
	set(&cf, "client_tls_sslmode", "verify-ca");
	actx = build_client(&cf, false);
	assert_false(connect_pair(actx, cctx, "localhost", true, NULL, NULL, NULL));
	assert_true(connect_pair(actx, cctx_cert, "localhost", true, NULL, NULL, NULL));
	SSL_CTX_free(actx);

	SSL_CTX_free(cctx);
	SSL_CTX_free(cctx_cert);
	config_free(&cf);
}

/* ---- reload ---- */

static void test_reload(void **state)
{
	char err[TLS_ERR_LEN] = "", want[512], desc[TLS_DESCRIBE_LEN];
	SSL_CTX *old_client, *old_server;
	TlsContexts t;
	Config cf;
	SSL *ssl, *cl;

	(void)state;
	tls_contexts_init(&t);
	assert_null(tls_client_ssl_new(&t));
	assert_null(tls_server_ssl_new(&t, "localhost", err, sizeof(err)));
	assert_string_equal(err, "server TLS is disabled");

	pair_config(&cf);
	assert_true(tls_contexts_reload(&t, &cf.g, false, err, sizeof(err)));
	assert_non_null(t.client_ctx);
	assert_non_null(t.server_ctx);
	assert_true(t.server_changed);
	assert_int_equal(t.server_sslmode, SSLMODE_VERIFY_FULL);

	/* a connection made now outlives the contexts it came from */
	ssl = tls_client_ssl_new(&t);
	cl = tls_server_ssl_new(&t, "localhost", err, sizeof(err));
	assert_non_null(ssl);
	assert_non_null(cl);

	/* same settings: new contexts, servers unaffected */
	assert_true(tls_contexts_reload(&t, &cf.g, false, err, sizeof(err)));
	assert_false(t.server_changed);

	/* a broken config keeps what runs */
	old_client = t.client_ctx;
	old_server = t.server_ctx;
	set(&cf, "client_tls_key_file", other_key);
	set(&cf, "server_tls_sslmode", "require");
	assert_false(tls_contexts_reload(&t, &cf.g, false, err, sizeof(err)));
	snprintf(want, sizeof(want),
	         "TLS setup failed: failed to load private key file \"%s\": key values mismatch (client_tls_key_file "
	         "does not match client_tls_cert_file %s)",
	         other_key, srv_pem);
	assert_string_equal(err, want);
	assert_ptr_equal(t.client_ctx, old_client);
	assert_ptr_equal(t.server_ctx, old_server);
	assert_int_equal(t.server_sslmode, SSLMODE_VERIFY_FULL);

	/* the old connection still works after its contexts were replaced */
	set(&cf, "client_tls_key_file", srv_key);
	assert_true(tls_contexts_reload(&t, &cf.g, false, err, sizeof(err)));
	assert_true(t.server_changed);
	assert_int_equal(t.server_sslmode, SSLMODE_REQUIRE);
	assert_true(handshake(cl, ssl));
	tls_describe(ssl, desc, sizeof(desc));
	assert_string_equal(desc, "TLSv1.3/TLS_AES_256_GCM_SHA384/ECDH=X25519");
	SSL_free(ssl);
	SSL_free(cl);

	/* server side off */
	set(&cf, "server_tls_sslmode", "disable");
	assert_true(tls_contexts_reload(&t, &cf.g, false, err, sizeof(err)));
	assert_null(t.server_ctx);
	assert_true(t.server_changed);

	tls_contexts_free(&t);
	assert_null(t.client_ctx);
	config_free(&cf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_protocol_words),
	    cmocka_unit_test(test_protocol_negation),
	    cmocka_unit_test(test_protocol_errors),
	    cmocka_unit_test(test_protocols_applied),
	    cmocka_unit_test(test_client_without_ca),
	    cmocka_unit_test(test_client_disabled),
	    cmocka_unit_test(test_client_needs_key_and_cert),
	    cmocka_unit_test(test_client_verify_needs_ca),
	    cmocka_unit_test(test_auth_cert_needs_verify_full),
	    cmocka_unit_test(test_client_with_ca),
	    cmocka_unit_test(test_client_file_errors),
	    cmocka_unit_test(test_client_key_mismatch),
	    cmocka_unit_test(test_client_cert_validity),
	    cmocka_unit_test(test_client_cipher_settings),
	    cmocka_unit_test(test_server_ctx),
	    cmocka_unit_test(test_handshake),
	    cmocka_unit_test(test_no_session_tickets),
	    cmocka_unit_test(test_alpn),
	    cmocka_unit_test(test_server_name_checks),
	    cmocka_unit_test(test_client_certificates),
	    cmocka_unit_test(test_reload),
	};

	return cmocka_run_group_tests(tests, setup_files, teardown_files);
}
