/*
 * SCRAM-SHA-256 (RFC 5802/7677, as PostgreSQL speaks it) for clients logging
 * into the pooler and for the pooler logging into servers, plus PostgreSQL's
 * MD5 password hashing. All crypto is OpenSSL's; SASLprep is libidn's.
 */
#include "autoconfig.h"

#include "common/scram.h"
#include "common/util.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stringprep.h>
#include <sys/random.h>

#define SCRAM_PREFIX "SCRAM-SHA-256$"

/* Base64 text of a gs2 header "n,," / "y,," (no authzid): the c= of a client-final. */
#define CBIND_N "biws"
#define CBIND_Y "eSws"

/* Enough for any base64 text of a bounded binary value. */
#define B64_LEN(n) ((((n) + 2) / 3) * 4 + 1)

/* client-first-bare "," server-first "," client-final-without-proof */
#define AUTH_MSG_MAX (3 * SCRAM_MAX_MSG + 3)

static char test_nonce[64]; /* scram_set_test_nonce(); "" = random */

static bool b64_char(char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '/';
}

/* Base64 of in into out (NUL-terminated); false if out is too small. */
static bool b64_encode(const uint8_t *in, size_t len, char *out, size_t outlen)
{
	if (len > INT_MAX / 2 || outlen < B64_LEN(len))
		return false;
	EVP_EncodeBlock((unsigned char *)out, in, (int)len);
	return true;
}

/*
 * Strict base64 decode: length a multiple of 4, only the alphabet, '=' only
 * as the last one or two characters. EVP_DecodeBlock itself skips blanks and
 * counts padding as zero bytes, so the text is checked first and the padding
 * subtracted after.
 */
static bool b64_decode(const char *in, size_t inlen, uint8_t *out, size_t outcap, size_t *outlen)
{
	uint8_t tmp[SCRAM_MAX_MSG];
	size_t pad = 0;
	int n;

	if (inlen % 4 != 0 || inlen / 4 * 3 > sizeof(tmp))
		return false;
	for (size_t i = 0; i < inlen; i++) {
		if (b64_char(in[i]) && pad == 0)
			continue;
		if (in[i] == '=' && i + 2 >= inlen) {
			pad++;
			continue;
		}
		return false;
	}
	if (inlen == 0) {
		*outlen = 0;
		return true;
	}
	n = EVP_DecodeBlock(tmp, (const unsigned char *)in, (int)inlen);
	if (n < 0 || (size_t)n < pad || (size_t)n - pad > outcap) {
		OPENSSL_cleanse(tmp, sizeof(tmp));
		return false;
	}
	*outlen = (size_t)n - pad;
	memcpy(out, tmp, *outlen);
	OPENSSL_cleanse(tmp, sizeof(tmp));
	return true;
}

/* Decode base64 that must hold exactly len bytes. */
static bool b64_decode_exact(const char *in, size_t inlen, uint8_t *out, size_t len)
{
	size_t got;

	return b64_decode(in, inlen, out, len, &got) && got == len;
}

static bool sha256(const void *data, size_t len, uint8_t out[SCRAM_KEY_LEN])
{
	unsigned int outlen = 0;

	return EVP_Digest(data, len, out, &outlen, EVP_sha256(), NULL) == 1 && outlen == SCRAM_KEY_LEN;
}

static bool hmac_sha256(const uint8_t *key, size_t keylen, const void *data, size_t len, uint8_t out[SCRAM_KEY_LEN])
{
	unsigned int outlen = 0;

	if (keylen > INT_MAX)
		return false;
	return HMAC(EVP_sha256(), key, (int)keylen, data, len, out, &outlen) != NULL && outlen == SCRAM_KEY_LEN;
}

/*
 * SASLprep (RFC 4013) with PostgreSQL's fallback: a password that is not
 * valid UTF-8 or holds prohibited or unassigned code points is used as is.
 * Unassigned code points are refused (as PostgreSQL does), so a verifier
 * made by PostgreSQL and one made here agree. Returns a malloc'd string.
 */
static char *saslprep_dup(const char *password)
{
	char *out = NULL;

	if (stringprep_profile(password, &out, "SASLprep", STRINGPREP_NO_UNASSIGNED) == STRINGPREP_OK && out != NULL)
		return out;
	free(out);
	return strdup(password);
}

/* SaltedPassword = PBKDF2-HMAC-SHA-256(password, salt, iterations). */
static bool salted_password(const char *prepped, const uint8_t *salt, size_t salt_len, int iterations,
                            uint8_t out[SCRAM_KEY_LEN])
{
	size_t plen = strlen(prepped);

	if (plen > INT_MAX || salt_len > INT_MAX || iterations < 1)
		return false;
	return PKCS5_PBKDF2_HMAC(prepped, (int)plen, salt, (int)salt_len, iterations, EVP_sha256(), SCRAM_KEY_LEN,
	                         out) == 1;
}

/* ClientKey, StoredKey and ServerKey from a SaltedPassword. */
static bool derive_keys(const uint8_t salted[SCRAM_KEY_LEN], uint8_t client_key[SCRAM_KEY_LEN],
                        uint8_t stored_key[SCRAM_KEY_LEN], uint8_t server_key[SCRAM_KEY_LEN])
{
	return hmac_sha256(salted, SCRAM_KEY_LEN, "Client Key", 10, client_key) &&
	       sha256(client_key, SCRAM_KEY_LEN, stored_key) &&
	       hmac_sha256(salted, SCRAM_KEY_LEN, "Server Key", 10, server_key);
}

/* A fresh nonce: base64 of SCRAM_NONCE_LEN random bytes, or the test nonce. */
static bool make_nonce(char *out, size_t outlen)
{
	uint8_t raw[SCRAM_NONCE_LEN];

	if (test_nonce[0] != '\0') {
		size_t n = strlen(test_nonce);
		if (n >= outlen)
			return false;
		memcpy(out, test_nonce, n + 1);
		test_nonce[0] = '\0';
		return true;
	}
	if (RAND_bytes(raw, sizeof(raw)) != 1)
		return false;
	return b64_encode(raw, sizeof(raw), out, outlen);
}

void scram_set_test_nonce(const char *nonce)
{
	if (nonce == NULL || strlen(nonce) >= sizeof(test_nonce))
		test_nonce[0] = '\0';
	else
		memcpy(test_nonce, nonce, strlen(nonce) + 1);
}

/* A nonce is printable ASCII other than ',' (RFC 5802 "printable"). */
static bool valid_nonce(const char *s, size_t len)
{
	if (len == 0)
		return false;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < 0x21 || s[i] > 0x7e || s[i] == ',')
			return false;
	}
	return true;
}

/* Decimal 1..INT_MAX, digits only. */
static bool parse_iterations(const char *s, size_t len, int *out)
{
	long v = 0;

	if (len == 0 || len > 10)
		return false;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		v = v * 10 + (s[i] - '0');
	}
	if (v < 1 || v > INT_MAX)
		return false;
	*out = (int)v;
	return true;
}

/*
 * Copy a received message into a NUL-terminated buffer of SCRAM_MAX_MSG + 1
 * bytes, refusing overlong ones and embedded NULs.
 */
static bool take_message(const char *in, size_t len, char *buf, char *err, size_t errlen)
{
	if (in == NULL)
		return set_error(err, errlen, "missing SCRAM message");
	if (len > SCRAM_MAX_MSG)
		return set_error(err, errlen, "SCRAM message too long");
	if (memchr(in, '\0', len) != NULL)
		return set_error(err, errlen, "malformed SCRAM message: NUL byte");
	memcpy(buf, in, len);
	buf[len] = '\0';
	return true;
}

/*
 * Read attribute "<name>=<value>" at p; the value runs to the next ',' or the
 * end. Returns where it stopped (at ',' or NUL), or NULL with err set when the
 * attribute there is missing or another one. Because attributes are read in
 * their one fixed order, an unknown or repeated attribute is caught here too.
 */
static const char *read_attr(const char *p, char name, const char **val, size_t *vlen, char *err, size_t errlen)
{
	const char *end;

	if (*p == '\0') {
		set_error(err, errlen, "malformed SCRAM message: missing attribute '%c'", name);
		return NULL;
	}
	if (p[0] != name || p[1] != '=') {
		if (p[0] >= 'a' && p[0] <= 'z' && p[1] == '=')
			set_error(err, errlen, "malformed SCRAM message: unexpected attribute '%c', expected '%c'",
			          p[0], name);
		else
			set_error(err, errlen, "malformed SCRAM message: expected attribute '%c'", name);
		return NULL;
	}
	*val = p + 2;
	end = strchr(*val, ',');
	if (end == NULL)
		end = *val + strlen(*val);
	*vlen = (size_t)(end - *val);
	return end;
}

/* After an attribute: skip its ',' (a missing next attribute is reported when read). */
static const char *next_attr(const char *p)
{
	return *p == ',' ? p + 1 : p;
}

/* AuthMessage = client-first-bare "," server-first "," client-final-without-proof */
static bool auth_message(char *out, const char *first_bare, const char *server_first, const char *final_wo_proof,
                         size_t final_len, size_t *outlen)
{
	int n;

	if (final_len > SCRAM_MAX_MSG)
		return false;
	n = snprintf(out, AUTH_MSG_MAX, "%s,%s,%.*s", first_bare, server_first, (int)final_len, final_wo_proof);
	if (n < 0 || (size_t)n >= AUTH_MSG_MAX)
		return false;
	*outlen = (size_t)n;
	return true;
}

/* --- verifiers --- */

bool scram_parse_secret(const char *text, ScramSecret *out)
{
	const char *p, *colon, *dollar;
	ScramSecret s;
	size_t len;

	memset(&s, 0, sizeof(s));
	if (text == NULL || strncmp(text, SCRAM_PREFIX, strlen(SCRAM_PREFIX)) != 0 || strlen(text) > SCRAM_MAX_MSG)
		return false;
	p = text + strlen(SCRAM_PREFIX);

	colon = strchr(p, ':');
	if (colon == NULL || !parse_iterations(p, (size_t)(colon - p), &s.iterations))
		return false;
	p = colon + 1;

	dollar = strchr(p, '$');
	if (dollar == NULL || !b64_decode(p, (size_t)(dollar - p), s.salt, sizeof(s.salt), &s.salt_len) ||
	    s.salt_len == 0)
		return false;
	p = dollar + 1;

	colon = strchr(p, ':');
	if (colon == NULL || !b64_decode_exact(p, (size_t)(colon - p), s.stored_key, SCRAM_KEY_LEN))
		return false;
	p = colon + 1;

	len = strlen(p);
	if (!b64_decode_exact(p, len, s.server_key, SCRAM_KEY_LEN))
		return false;

	*out = s;
	return true;
}

bool scram_build_secret_salt(const char *password, const uint8_t *salt, size_t salt_len, int iterations,
                             ScramSecret *out)
{
	uint8_t salted[SCRAM_KEY_LEN], client_key[SCRAM_KEY_LEN];
	ScramSecret s;
	char *prepped;
	bool ok;

	if (password == NULL || salt_len == 0 || salt_len > SCRAM_MAX_SALT || iterations < 1)
		return false;
	prepped = saslprep_dup(password);
	if (prepped == NULL)
		return false;

	memset(&s, 0, sizeof(s));
	s.iterations = iterations;
	memcpy(s.salt, salt, salt_len);
	s.salt_len = salt_len;
	ok = salted_password(prepped, salt, salt_len, iterations, salted) &&
	     derive_keys(salted, client_key, s.stored_key, s.server_key);
	if (ok)
		*out = s;

	OPENSSL_cleanse(salted, sizeof(salted));
	OPENSSL_cleanse(client_key, sizeof(client_key));
	OPENSSL_cleanse(prepped, strlen(prepped));
	free(prepped);
	return ok;
}

static uint8_t salt_key[SCRAM_SALT_KEY_LEN];
static bool salt_key_ready;

void scram_salt_key_get(uint8_t key[SCRAM_SALT_KEY_LEN])
{
	if (!salt_key_ready)
		scram_salt_key_init();
	memcpy(key, salt_key, SCRAM_SALT_KEY_LEN);
}

void scram_salt_key_set(const uint8_t key[SCRAM_SALT_KEY_LEN])
{
	memcpy(salt_key, key, SCRAM_SALT_KEY_LEN);
	salt_key_ready = true;
}

void scram_salt_key_init(void)
{
	/*
	 * The kernel's CSPRNG first: the master needs no other OpenSSL call at
	 * start, and RAND_bytes() would load OpenSSL's providers there, about
	 * 2.5 MB resident (doc/benchmarks.md, "Memory against PgBouncer 1.25.2").
	 */
	if (getrandom(salt_key, sizeof(salt_key), 0) != (ssize_t)sizeof(salt_key) &&
	    RAND_bytes(salt_key, sizeof(salt_key)) != 1)
		abort(); /* no CSPRNG: nothing about authentication can be trusted */
	salt_key_ready = true;
}

void scram_salt_for(const char *name, uint8_t salt[SCRAM_DERIVED_SALT_LEN])
{
	uint8_t mac[SCRAM_KEY_LEN];
	if (!salt_key_ready)
		scram_salt_key_init();
	if (!hmac_sha256(salt_key, sizeof(salt_key), name, strlen(name), mac))
		RAND_bytes(mac, sizeof(mac));
	memcpy(salt, mac, SCRAM_DERIVED_SALT_LEN);
}

bool scram_build_secret(const char *password, int iterations, ScramSecret *out)
{
	uint8_t salt[16];

	if (RAND_bytes(salt, sizeof(salt)) != 1)
		return false;
	return scram_build_secret_salt(password, salt, sizeof(salt), iterations, out);
}

bool scram_verify_plain_password(const ScramSecret *s, const char *password)
{
	ScramSecret again;
	bool ok;

	if (password == NULL || password[0] == '\0')
		return false;
	ok = scram_build_secret_salt(password, s->salt, s->salt_len, s->iterations, &again) &&
	     scram_secure_equal(again.stored_key, s->stored_key, SCRAM_KEY_LEN) &&
	     scram_secure_equal(again.server_key, s->server_key, SCRAM_KEY_LEN);
	OPENSSL_cleanse(&again, sizeof(again));
	return ok;
}

bool scram_format_secret(const ScramSecret *s, char *buf, size_t len)
{
	char salt[B64_LEN(SCRAM_MAX_SALT)], stored[B64_LEN(SCRAM_KEY_LEN)], server[B64_LEN(SCRAM_KEY_LEN)];
	int n;

	if (s->salt_len == 0 || s->salt_len > SCRAM_MAX_SALT || s->iterations < 1)
		return false;
	if (!b64_encode(s->salt, s->salt_len, salt, sizeof(salt)) ||
	    !b64_encode(s->stored_key, SCRAM_KEY_LEN, stored, sizeof(stored)) ||
	    !b64_encode(s->server_key, SCRAM_KEY_LEN, server, sizeof(server)))
		return false;
	n = snprintf(buf, len, SCRAM_PREFIX "%d:%s$%s:%s", s->iterations, salt, stored, server);
	return n >= 0 && (size_t)n < len;
}

/* --- server side --- */

bool scram_server_first(ScramServer *st, const ScramSecret *secret, const char *client_first, size_t len, char *err,
                        size_t errlen)
{
	char msg[SCRAM_MAX_MSG + 1];
	char salt[B64_LEN(SCRAM_MAX_SALT)];
	const char *p, *bare, *val;
	ScramSecret sec;
	size_t vlen;
	int n;

	/* secret may point into st */
	memmove(&sec, secret, sizeof(sec));
	memset(st, 0, sizeof(*st));
	st->secret = sec;
	OPENSSL_cleanse(&sec, sizeof(sec));
	secret = &st->secret;
	if (secret->iterations < 1 || secret->salt_len == 0 || secret->salt_len > SCRAM_MAX_SALT)
		return set_error(err, errlen, "invalid SCRAM secret");
	if (!take_message(client_first, len, msg, err, errlen))
		return false;

	/* gs2 header: cbind flag, then an authzid we do not support */
	p = msg;
	switch (*p) {
	case 'n':
	case 'y':
		st->cbind_flag = *p;
		break;
	case 'p':
		return set_error(err, errlen, "channel binding is not supported");
	default:
		return set_error(err, errlen, "malformed SCRAM message: invalid channel binding flag");
	}
	if (*++p != ',')
		return set_error(err, errlen, "malformed SCRAM message: comma expected after channel binding flag");
	p++;
	if (p[0] == 'a' && p[1] == '=')
		return set_error(err, errlen, "authorization identity is not supported");
	if (*p != ',')
		return set_error(err, errlen, "malformed SCRAM message: comma expected after gs2 header");
	bare = ++p;

	if (p[0] == 'm' && p[1] == '=')
		return set_error(err, errlen, "unsupported SCRAM extension");
	/* the user name: PostgreSQL takes it from the startup packet instead */
	p = read_attr(p, 'n', &val, &vlen, err, errlen);
	if (p == NULL)
		return false;
	p = read_attr(next_attr(p), 'r', &val, &vlen, err, errlen);
	if (p == NULL)
		return false;
	if (!valid_nonce(val, vlen))
		return set_error(err, errlen, "malformed SCRAM message: invalid nonce");
	if (*p != '\0')
		return set_error(err, errlen, "malformed SCRAM message: unexpected data after nonce");

	memcpy(st->client_nonce, val, vlen);
	st->client_nonce[vlen] = '\0';
	memcpy(st->client_first_bare, bare, strlen(bare) + 1);

	if (!make_nonce(st->server_nonce, sizeof(st->server_nonce)))
		return set_error(err, errlen, "could not generate nonce");
	if (!b64_encode(secret->salt, secret->salt_len, salt, sizeof(salt)))
		return set_error(err, errlen, "invalid SCRAM secret");
	n = snprintf(st->server_first, sizeof(st->server_first), "r=%s%s,s=%s,i=%d", st->client_nonce, st->server_nonce,
	             salt, secret->iterations);
	if (n < 0 || (size_t)n >= sizeof(st->server_first)) {
		st->server_first[0] = '\0';
		return set_error(err, errlen, "SCRAM message too long");
	}
	return true;
}

bool scram_server_final(ScramServer *st, const char *client_final, size_t len, char *server_final,
                        size_t server_final_len, char *err, size_t errlen)
{
	char msg[SCRAM_MAX_MSG + 1], authmsg[AUTH_MSG_MAX];
	char sigtext[B64_LEN(SCRAM_KEY_LEN)];
	uint8_t proof[SCRAM_KEY_LEN], sig[SCRAM_KEY_LEN], client_key[SCRAM_KEY_LEN], check[SCRAM_KEY_LEN];
	const char *p, *val, *proof_attr;
	size_t vlen, cn_len, sn_len, amlen;
	bool ok = false;
	int n;

	if (st->server_first[0] == '\0' || st->done)
		return set_error(err, errlen, "unexpected SCRAM message");
	if (!take_message(client_final, len, msg, err, errlen))
		return false;

	p = read_attr(msg, 'c', &val, &vlen, err, errlen);
	if (p == NULL)
		return false;
	{
		const char *want = st->cbind_flag == 'y' ? CBIND_Y : CBIND_N;
		uint8_t raw[SCRAM_MAX_MSG];
		size_t rawlen;

		if (!b64_decode(val, vlen, raw, sizeof(raw), &rawlen))
			return set_error(err, errlen, "malformed SCRAM message: invalid base64 in channel binding");
		if (vlen != strlen(want) || memcmp(val, want, vlen) != 0)
			return set_error(err, errlen, "SCRAM channel binding check failed");
	}

	p = read_attr(next_attr(p), 'r', &val, &vlen, err, errlen);
	if (p == NULL)
		return false;
	cn_len = strlen(st->client_nonce);
	sn_len = strlen(st->server_nonce);
	if (vlen != cn_len + sn_len || memcmp(val, st->client_nonce, cn_len) != 0 ||
	    memcmp(val + cn_len, st->server_nonce, sn_len) != 0)
		return set_error(err, errlen, "SCRAM nonce mismatch");

	proof_attr = next_attr(p);
	p = read_attr(proof_attr, 'p', &val, &vlen, err, errlen);
	if (p == NULL)
		return false;
	if (*p != '\0')
		return set_error(err, errlen, "malformed SCRAM message: unexpected data after proof");
	if (!b64_decode_exact(val, vlen, proof, sizeof(proof)))
		return set_error(err, errlen, "malformed SCRAM message: invalid client proof");

	/* client-final-without-proof ends before the ',' in front of "p=" */
	if (!auth_message(authmsg, st->client_first_bare, st->server_first, msg, (size_t)(proof_attr - 1 - msg),
	                  &amlen)) {
		set_error(err, errlen, "SCRAM message too long");
		goto out;
	}

	/* ClientKey = ClientProof XOR HMAC(StoredKey, AuthMessage); H(ClientKey) must be StoredKey */
	if (!hmac_sha256(st->secret.stored_key, SCRAM_KEY_LEN, authmsg, amlen, sig)) {
		set_error(err, errlen, "SCRAM computation failed");
		goto out;
	}
	for (size_t i = 0; i < SCRAM_KEY_LEN; i++)
		client_key[i] = proof[i] ^ sig[i];
	if (!sha256(client_key, SCRAM_KEY_LEN, check)) {
		set_error(err, errlen, "SCRAM computation failed");
		goto out;
	}
	if (!scram_secure_equal(check, st->secret.stored_key, SCRAM_KEY_LEN)) {
		set_error(err, errlen, "SCRAM client proof does not match");
		goto out;
	}

	/* ServerSignature = HMAC(ServerKey, AuthMessage) */
	if (!hmac_sha256(st->secret.server_key, SCRAM_KEY_LEN, authmsg, amlen, sig) ||
	    !b64_encode(sig, SCRAM_KEY_LEN, sigtext, sizeof(sigtext))) {
		set_error(err, errlen, "SCRAM computation failed");
		goto out;
	}
	n = snprintf(server_final, server_final_len, "v=%s", sigtext);
	if (n < 0 || (size_t)n >= server_final_len) {
		set_error(err, errlen, "SCRAM output buffer too small");
		goto out;
	}
	memcpy(st->client_key, client_key, SCRAM_KEY_LEN);
	st->done = true;
	ok = true;
out:
	OPENSSL_cleanse(client_key, sizeof(client_key));
	OPENSSL_cleanse(authmsg, sizeof(authmsg));
	return ok;
}

/* --- client side --- */

void scram_client_init_password(ScramClient *st, const char *password)
{
	char *prepped;
	size_t n;

	memset(st, 0, sizeof(*st));
	st->have_password = true;
	/* a password too long for the buffer stays empty: scram_client_first then fails */
	prepped = saslprep_dup(password != NULL ? password : "");
	if (prepped == NULL)
		return;
	n = strlen(prepped);
	if (n < sizeof(st->password))
		memcpy(st->password, prepped, n + 1);
	OPENSSL_cleanse(prepped, n);
	free(prepped);
}

void scram_client_init_keys(ScramClient *st, const uint8_t *client_key, const uint8_t *server_key)
{
	memset(st, 0, sizeof(*st));
	st->have_password = false;
	memcpy(st->client_key, client_key, SCRAM_KEY_LEN);
	memcpy(st->server_key, server_key, SCRAM_KEY_LEN);
}

bool scram_client_first_user(ScramClient *st, const char *user, char *buf, size_t len)
{
	char name[SCRAM_MAX_MSG];
	size_t o = 0;
	int n;

	if (st->have_password && st->password[0] == '\0')
		return false;
	/* saslname: '=' and ',' are written "=3D" and "=2C" */
	for (const char *c = user != NULL ? user : ""; *c != '\0'; c++) {
		const char *rep = *c == '=' ? "=3D" : *c == ',' ? "=2C" : NULL;
		size_t rlen = rep != NULL ? 3 : 1;

		if (o + rlen >= sizeof(name))
			return false;
		if (rep != NULL)
			memcpy(name + o, rep, 3);
		else
			name[o] = *c;
		o += rlen;
	}
	name[o] = '\0';

	st->server_first[0] = '\0';
	memset(st->expected_server_sig, 0, sizeof(st->expected_server_sig));
	if (!make_nonce(st->client_nonce, sizeof(st->client_nonce)))
		return false;
	n = snprintf(st->client_first_bare, sizeof(st->client_first_bare), "n=%s,r=%s", name, st->client_nonce);
	if (n < 0 || (size_t)n >= sizeof(st->client_first_bare)) {
		st->client_first_bare[0] = '\0';
		return false;
	}
	n = snprintf(buf, len, "n,,%s", st->client_first_bare);
	return n >= 0 && (size_t)n < len;
}

bool scram_client_first(ScramClient *st, char *buf, size_t len)
{
	return scram_client_first_user(st, "", buf, len);
}

bool scram_client_final(ScramClient *st, const char *server_first, size_t len, char *buf, size_t buflen, char *err,
                        size_t errlen)
{
	char msg[SCRAM_MAX_MSG + 1], authmsg[AUTH_MSG_MAX], final_wo_proof[SCRAM_MAX_MSG + 1];
	char prooftext[B64_LEN(SCRAM_KEY_LEN)];
	uint8_t salt[SCRAM_MAX_SALT], salted[SCRAM_KEY_LEN];
	uint8_t client_key[SCRAM_KEY_LEN], stored_key[SCRAM_KEY_LEN], server_key[SCRAM_KEY_LEN];
	uint8_t sig[SCRAM_KEY_LEN], proof[SCRAM_KEY_LEN];
	const char *p, *val, *nonce;
	size_t vlen, nonce_len, salt_len, cn_len, amlen;
	int iterations, n;
	bool ok = false;

	if (st->client_first_bare[0] == '\0' || st->server_first[0] != '\0')
		return set_error(err, errlen, "unexpected SCRAM message");
	if (!take_message(server_first, len, msg, err, errlen))
		return false;

	if (msg[0] == 'm' && msg[1] == '=')
		return set_error(err, errlen, "unsupported SCRAM extension");
	p = read_attr(msg, 'r', &nonce, &nonce_len, err, errlen);
	if (p == NULL)
		return false;
	cn_len = strlen(st->client_nonce);
	if (!valid_nonce(nonce, nonce_len))
		return set_error(err, errlen, "malformed SCRAM message: invalid nonce");
	if (nonce_len <= cn_len || memcmp(nonce, st->client_nonce, cn_len) != 0)
		return set_error(err, errlen, "SCRAM server nonce does not extend client nonce");

	p = read_attr(next_attr(p), 's', &val, &vlen, err, errlen);
	if (p == NULL)
		return false;
	if (!b64_decode(val, vlen, salt, sizeof(salt), &salt_len) || salt_len == 0)
		return set_error(err, errlen, "malformed SCRAM message: invalid salt");

	p = read_attr(next_attr(p), 'i', &val, &vlen, err, errlen);
	if (p == NULL)
		return false;
	if (!parse_iterations(val, vlen, &iterations))
		return set_error(err, errlen, "malformed SCRAM message: invalid iteration count");
	if (st->have_password && iterations > SCRAM_MAX_SERVER_ITERATIONS)
		return set_error(err, errlen, "SCRAM iteration count %d is above the limit of %d", iterations,
		                 SCRAM_MAX_SERVER_ITERATIONS);
	if (*p != '\0')
		return set_error(err, errlen, "malformed SCRAM message: unexpected data after iteration count");

	if (st->have_password) {
		if (!salted_password(st->password, salt, salt_len, iterations, salted) ||
		    !derive_keys(salted, client_key, stored_key, server_key)) {
			set_error(err, errlen, "SCRAM computation failed");
			goto out;
		}
	} else {
		memcpy(client_key, st->client_key, SCRAM_KEY_LEN);
		memcpy(server_key, st->server_key, SCRAM_KEY_LEN);
		if (!sha256(client_key, SCRAM_KEY_LEN, stored_key)) {
			set_error(err, errlen, "SCRAM computation failed");
			goto out;
		}
	}

	/* our gs2 header is always "n,,": no channel binding */
	n = snprintf(final_wo_proof, sizeof(final_wo_proof), "c=" CBIND_N ",r=%.*s", (int)nonce_len, nonce);
	if (n < 0 || (size_t)n >= sizeof(final_wo_proof) ||
	    !auth_message(authmsg, st->client_first_bare, msg, final_wo_proof, (size_t)n, &amlen)) {
		set_error(err, errlen, "SCRAM message too long");
		goto out;
	}

	/* ClientProof = ClientKey XOR HMAC(StoredKey, AuthMessage) */
	if (!hmac_sha256(stored_key, SCRAM_KEY_LEN, authmsg, amlen, sig) ||
	    !hmac_sha256(server_key, SCRAM_KEY_LEN, authmsg, amlen, st->expected_server_sig)) {
		set_error(err, errlen, "SCRAM computation failed");
		goto out;
	}
	for (size_t i = 0; i < SCRAM_KEY_LEN; i++)
		proof[i] = client_key[i] ^ sig[i];
	if (!b64_encode(proof, SCRAM_KEY_LEN, prooftext, sizeof(prooftext))) {
		set_error(err, errlen, "SCRAM computation failed");
		goto out;
	}
	n = snprintf(buf, buflen, "%s,p=%s", final_wo_proof, prooftext);
	if (n < 0 || (size_t)n >= buflen) {
		set_error(err, errlen, "SCRAM output buffer too small");
		goto out;
	}
	memcpy(st->server_first, msg, strlen(msg) + 1);
	ok = true;
out:
	OPENSSL_cleanse(salted, sizeof(salted));
	OPENSSL_cleanse(client_key, sizeof(client_key));
	OPENSSL_cleanse(server_key, sizeof(server_key));
	OPENSSL_cleanse(stored_key, sizeof(stored_key));
	return ok;
}

bool scram_client_verify_final(ScramClient *st, const char *server_final, size_t len, char *err, size_t errlen)
{
	char msg[SCRAM_MAX_MSG + 1];
	uint8_t sig[SCRAM_KEY_LEN];
	const char *p, *val;
	size_t vlen;

	if (st->server_first[0] == '\0')
		return set_error(err, errlen, "unexpected SCRAM message");
	if (!take_message(server_final, len, msg, err, errlen))
		return false;
	if (msg[0] == 'e' && msg[1] == '=')
		return set_error(err, errlen, "SCRAM error from server: %s", msg + 2);
	p = read_attr(msg, 'v', &val, &vlen, err, errlen);
	if (p == NULL)
		return false;
	if (*p != '\0')
		return set_error(err, errlen, "malformed SCRAM message: unexpected data after server signature");
	if (!b64_decode_exact(val, vlen, sig, sizeof(sig)))
		return set_error(err, errlen, "malformed SCRAM message: invalid server signature");
	if (!scram_secure_equal(sig, st->expected_server_sig, SCRAM_KEY_LEN))
		return set_error(err, errlen, "SCRAM server signature does not match");
	return true;
}

/* --- MD5 --- */

/* hex(md5(a || b)) into out (33 bytes). */
static bool md5_hex(const void *a, size_t alen, const void *b, size_t blen, char *out)
{
	static const char hex[] = "0123456789abcdef";
	uint8_t digest[EVP_MAX_MD_SIZE];
	unsigned int dlen = 0;
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	bool ok;

	ok = ctx != NULL && EVP_DigestInit_ex(ctx, EVP_md5(), NULL) == 1 && EVP_DigestUpdate(ctx, a, alen) == 1 &&
	     EVP_DigestUpdate(ctx, b, blen) == 1 && EVP_DigestFinal_ex(ctx, digest, &dlen) == 1 && dlen == 16;
	EVP_MD_CTX_free(ctx);
	if (!ok)
		return false;
	for (unsigned int i = 0; i < dlen; i++) {
		out[2 * i] = hex[digest[i] >> 4];
		out[2 * i + 1] = hex[digest[i] & 15];
	}
	out[2 * dlen] = '\0';
	return true;
}

void md5_password_hash(const char *password, const char *user, char *out)
{
	memcpy(out, "md5", 3);
	if (!md5_hex(password, strlen(password), user, strlen(user), out + 3))
		out[0] = '\0';
}

void md5_salted_response(const char *stored, bool stored_is_md5, const char *user, const uint8_t salt[4], char *out)
{
	char hashed[MD5_PASSWD_LEN + 1];

	out[0] = '\0';
	if (stored_is_md5) {
		if (strncmp(stored, "md5", 3) != 0 || strlen(stored) != MD5_PASSWD_LEN)
			return;
		memcpy(hashed, stored, MD5_PASSWD_LEN + 1);
	} else {
		md5_password_hash(stored, user, hashed);
		if (hashed[0] == '\0')
			return;
	}
	memcpy(out, "md5", 3);
	if (!md5_hex(hashed + 3, MD5_PASSWD_LEN - 3, salt, 4, out + 3))
		out[0] = '\0';
}

bool scram_secure_equal(const void *a, const void *b, size_t len)
{
	return CRYPTO_memcmp(a, b, len) == 0;
}
