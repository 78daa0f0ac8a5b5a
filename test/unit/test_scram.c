/*
 * Unit tests for SCRAM-SHA-256 (both directions, pass-through) and
 * PostgreSQL's MD5 hashing: RFC 7677's example, verifiers made by
 * PostgreSQL 15 and values computed independently with Python's hashlib.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/scram.h"

/* RFC 7677 section 3 */
#define RFC_CLIENT_NONCE "rOprNGfwEbeRWgbNEkqO"
#define RFC_SERVER_NONCE "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
#define RFC_SALT_B64     "W22ZaJ0SNY7soEsUEjb6gQ=="
#define RFC_CLIENT_FIRST "n,,n=user,r=" RFC_CLIENT_NONCE
#define RFC_SERVER_FIRST "r=" RFC_CLIENT_NONCE RFC_SERVER_NONCE ",s=" RFC_SALT_B64 ",i=4096"
#define RFC_CLIENT_FINAL "c=biws,r=" RFC_CLIENT_NONCE RFC_SERVER_NONCE ",p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
#define RFC_SERVER_FINAL "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
/* the verifier for "pencil" with that salt, computed with Python's hashlib */
#define RFC_VERIFIER                                                                                                   \
	"SCRAM-SHA-256$4096:" RFC_SALT_B64 "$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:"                            \
	"wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU="
/* ClientKey = HMAC(SaltedPassword, "Client Key") for it, also from hashlib */
static const uint8_t rfc_client_key[SCRAM_KEY_LEN] = {
    0xa6, 0x0f, 0xc9, 0x23, 0xd6, 0x7e, 0x86, 0x44, 0xa9, 0x2d, 0x16, 0xb9, 0x6e, 0xda, 0x5e, 0xf4,
    0x65, 0x6b, 0x0c, 0x72, 0x5c, 0x48, 0x43, 0x74, 0xbe, 0x25, 0x53, 0x55, 0x76, 0x99, 0x6e, 0x8b,
};

static ScramSecret rfc_secret(void)
{
	ScramSecret s;

	assert_true(scram_parse_secret(RFC_VERIFIER, &s));
	return s;
}

/* Run a client and a server against each other; returns whether the server accepted the proof. */
static bool exchange(ScramClient *cl, ScramServer *sv, const ScramSecret *secret, bool *client_ok)
{
	char c1[SCRAM_MAX_MSG], c2[SCRAM_MAX_MSG], s2[SCRAM_MAX_MSG], err[128];

	*client_ok = false;
	assert_true(scram_client_first(cl, c1, sizeof(c1)));
	assert_true(scram_server_first(sv, secret, c1, strlen(c1), err, sizeof(err)));
	assert_true(
	    scram_client_final(cl, sv->server_first, strlen(sv->server_first), c2, sizeof(c2), err, sizeof(err)));
	if (!scram_server_final(sv, c2, strlen(c2), s2, sizeof(s2), err, sizeof(err))) {
		assert_string_equal(err, "SCRAM client proof does not match");
		return false;
	}
	*client_ok = scram_client_verify_final(cl, s2, strlen(s2), err, sizeof(err));
	return true;
}

static void test_rfc7677_client(void **state)
{
	ScramClient cl;
	char buf[SCRAM_MAX_MSG], err[128];

	scram_client_init_password(&cl, "pencil");
	scram_set_test_nonce(RFC_CLIENT_NONCE);
	assert_true(scram_client_first_user(&cl, "user", buf, sizeof(buf)));
	assert_string_equal(buf, RFC_CLIENT_FIRST);
	assert_true(
	    scram_client_final(&cl, RFC_SERVER_FIRST, strlen(RFC_SERVER_FIRST), buf, sizeof(buf), err, sizeof(err)));
	assert_string_equal(buf, RFC_CLIENT_FINAL);
	assert_true(scram_client_verify_final(&cl, RFC_SERVER_FINAL, strlen(RFC_SERVER_FINAL), err, sizeof(err)));

	/* one changed byte in the server signature */
	assert_false(
	    scram_client_verify_final(&cl, "v=7rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=", 46, err, sizeof(err)));
	assert_string_equal(err, "SCRAM server signature does not match");

	/* the test nonce is used once: the next one is random, 18 bytes in base64 */
	assert_true(scram_client_first(&cl, buf, sizeof(buf)));
	assert_int_equal(strlen(cl.client_nonce), 24);
	assert_string_not_equal(cl.client_nonce, RFC_CLIENT_NONCE);
	assert_int_equal(strncmp(buf, "n,,n=,r=", 8), 0);
}

static void test_rfc7677_server(void **state)
{
	ScramSecret secret;
	ScramServer sv;
	uint8_t salt[16];
	char buf[SCRAM_MAX_MSG], err[128];

	/* the verifier built here from "pencil" equals the one computed independently */
	memcpy(salt, "\x5b\x6d\x99\x68\x9d\x12\x35\x8e\xec\xa0\x4b\x14\x12\x36\xfa\x81", 16);
	assert_true(scram_build_secret_salt("pencil", salt, 16, 4096, &secret));
	assert_true(scram_format_secret(&secret, buf, sizeof(buf)));
	assert_string_equal(buf, RFC_VERIFIER);

	scram_set_test_nonce(RFC_SERVER_NONCE);
	assert_true(scram_server_first(&sv, &secret, RFC_CLIENT_FIRST, strlen(RFC_CLIENT_FIRST), err, sizeof(err)));
	assert_int_equal(sv.cbind_flag, 'n');
	assert_string_equal(sv.server_first, RFC_SERVER_FIRST);
	assert_true(
	    scram_server_final(&sv, RFC_CLIENT_FINAL, strlen(RFC_CLIENT_FINAL), buf, sizeof(buf), err, sizeof(err)));
	assert_string_equal(buf, RFC_SERVER_FINAL);
	assert_true(sv.done);
	assert_memory_equal(sv.client_key, rfc_client_key, SCRAM_KEY_LEN);

	/* the exchange is over: a repeated client-final is refused */
	assert_false(
	    scram_server_final(&sv, RFC_CLIENT_FINAL, strlen(RFC_CLIENT_FINAL), buf, sizeof(buf), err, sizeof(err)));
	assert_string_equal(err, "unexpected SCRAM message");
}

static void test_round_trip(void **state)
{
	ScramSecret secret;
	ScramClient cl;
	ScramServer sv;
	bool client_ok;

	assert_true(scram_build_secret("correct horse", 4096, &secret));
	assert_int_equal(secret.salt_len, 16);
	scram_client_init_password(&cl, "correct horse");
	assert_true(exchange(&cl, &sv, &secret, &client_ok));
	assert_true(client_ok);
	assert_true(sv.done);
	assert_int_equal(strlen(sv.server_nonce), 24);
	assert_int_equal(strncmp(sv.server_first + 2, cl.client_nonce, strlen(cl.client_nonce)), 0);

	/* wrong password: the server refuses the proof */
	scram_client_init_password(&cl, "correct horse!");
	assert_false(exchange(&cl, &sv, &secret, &client_ok));
	assert_false(sv.done);
}

static void test_pass_through(void **state)
{
	ScramSecret secret, other;
	ScramClient cl, relay;
	ScramServer sv, backend;
	uint8_t client_key[SCRAM_KEY_LEN];
	bool client_ok;

	/* a client logs into the pooler with its password */
	assert_true(scram_build_secret("s3cret", 4096, &secret));
	scram_client_init_password(&cl, "s3cret");
	assert_true(exchange(&cl, &sv, &secret, &client_ok));
	assert_true(client_ok);
	memcpy(client_key, sv.client_key, SCRAM_KEY_LEN);

	/* the pooler logs into a server holding the same secret, without the password */
	scram_client_init_keys(&relay, client_key, secret.server_key);
	assert_false(relay.have_password);
	assert_true(exchange(&relay, &backend, &secret, &client_ok));
	assert_true(client_ok);
	assert_memory_equal(backend.client_key, client_key, SCRAM_KEY_LEN);

	/* the same password with another salt is another secret: the keys do not fit */
	assert_true(scram_build_secret("s3cret", 4096, &other));
	scram_client_init_keys(&relay, client_key, other.server_key);
	assert_false(exchange(&relay, &backend, &other, &client_ok));
}

static void test_channel_binding_flags(void **state)
{
	ScramSecret secret = rfc_secret();
	ScramServer sv;
	ScramClient cl;
	char c1[SCRAM_MAX_MSG], c2[SCRAM_MAX_MSG], s2[SCRAM_MAX_MSG], err[128];
	const char *bare;

	/* channel binding requested: not supported */
	assert_false(scram_server_first(&sv, &secret, "p=tls-server-end-point,,n=,r=abc", 32, err, sizeof(err)));
	assert_string_equal(err, "channel binding is not supported");

	/* 'y' (client could bind, thinks we cannot): accepted, then c= must be base64("y,,") */
	scram_client_init_password(&cl, "pencil");
	assert_true(scram_client_first(&cl, c1, sizeof(c1)));
	bare = c1 + 3;
	snprintf(s2, sizeof(s2), "y,,%s", bare);
	assert_true(scram_server_first(&sv, &secret, s2, strlen(s2), err, sizeof(err)));
	assert_int_equal(sv.cbind_flag, 'y');
	assert_true(
	    scram_client_final(&cl, sv.server_first, strlen(sv.server_first), c2, sizeof(c2), err, sizeof(err)));
	/* our client wrote c=biws; with 'y' that is a mismatch */
	assert_false(scram_server_final(&sv, c2, strlen(c2), s2, sizeof(s2), err, sizeof(err)));
	assert_string_equal(err, "SCRAM channel binding check failed");
}

/* The 'y' flag end to end: rewrite the client's messages as a 'y' client would send them. */
static void test_channel_binding_y_accepted(void **state)
{
	ScramSecret secret = rfc_secret();
	ScramServer sv;
	char buf[SCRAM_MAX_MSG], err[128];
	const char *first = "y,,n=user,r=" RFC_CLIENT_NONCE;
	/* AuthMessage includes "c=eSws": proof computed with Python's hashlib */
	const char *final =
	    "c=eSws,r=" RFC_CLIENT_NONCE RFC_SERVER_NONCE ",p=FoqiHTtQEDE8lz1CdaEe3tK4mS+iMDTl77SPyDS53DY=";

	scram_set_test_nonce(RFC_SERVER_NONCE);
	assert_true(scram_server_first(&sv, &secret, first, strlen(first), err, sizeof(err)));
	assert_true(scram_server_final(&sv, final, strlen(final), buf, sizeof(buf), err, sizeof(err)));
	assert_string_equal(buf, "v=dI4KpiQJwBr1+V+K6U1dA6l6I4I9DUNXWND4pcpRU3U=");
	assert_memory_equal(sv.client_key, rfc_client_key, SCRAM_KEY_LEN);
}

static void expect_server_first_error(const char *msg, size_t len, const char *want)
{
	ScramSecret secret = rfc_secret();
	ScramServer sv;
	char err[128] = "";

	assert_false(scram_server_first(&sv, &secret, msg, len, err, sizeof(err)));
	assert_string_equal(err, want);
	assert_string_equal(sv.server_first, "");
}

static void test_server_first_malformed(void **state)
{
	char big[SCRAM_MAX_MSG + 2];

	expect_server_first_error("", 0, "malformed SCRAM message: invalid channel binding flag");
	expect_server_first_error("x,,n=,r=abc", 11, "malformed SCRAM message: invalid channel binding flag");
	expect_server_first_error("n", 1, "malformed SCRAM message: comma expected after channel binding flag");
	expect_server_first_error("n,", 2, "malformed SCRAM message: comma expected after gs2 header");
	expect_server_first_error("n,a=bob,n=,r=abc", 16, "authorization identity is not supported");
	expect_server_first_error("n,,m=ext,n=,r=abc", 17, "unsupported SCRAM extension");
	expect_server_first_error("n,,r=abc", 8, "malformed SCRAM message: unexpected attribute 'r', expected 'n'");
	expect_server_first_error("n,,n=user", 9, "malformed SCRAM message: missing attribute 'r'");
	expect_server_first_error("n,,n=user,", 10, "malformed SCRAM message: missing attribute 'r'");
	expect_server_first_error("n,,n=,s=abc", 11, "malformed SCRAM message: unexpected attribute 's', expected 'r'");
	expect_server_first_error("n,,n=,r=", 8, "malformed SCRAM message: invalid nonce");
	expect_server_first_error("n,,n=,r=ab\x01", 11, "malformed SCRAM message: invalid nonce");
	expect_server_first_error("n,,n=,r=ab c", 12, "malformed SCRAM message: invalid nonce");
	expect_server_first_error("n,,n=,r=ab\xc3\xa9", 12, "malformed SCRAM message: invalid nonce");
	expect_server_first_error("n,,n=,r=abc,r=def", 17, "malformed SCRAM message: unexpected data after nonce");
	expect_server_first_error("n,,n=,r=abc,x=1", 15, "malformed SCRAM message: unexpected data after nonce");
	expect_server_first_error("n,,n=,r=abc,", 12, "malformed SCRAM message: unexpected data after nonce");
	expect_server_first_error("n,,n=,r=a\0c", 11, "malformed SCRAM message: NUL byte");

	/* SCRAM_MAX_MSG bytes are allowed, one more is not */
	memset(big, 'A', sizeof(big));
	memcpy(big, "n,,n=,r=", 8);
	expect_server_first_error(big, SCRAM_MAX_MSG + 1, "SCRAM message too long");
	/* fits as a message, but the reply (nonce + ours + salt) would not */
	expect_server_first_error(big, SCRAM_MAX_MSG, "SCRAM message too long");
}

static void expect_server_final_error(const char *final, size_t len, const char *want)
{
	ScramSecret secret = rfc_secret();
	ScramServer sv;
	char buf[SCRAM_MAX_MSG], err[128] = "";

	scram_set_test_nonce(RFC_SERVER_NONCE);
	assert_true(scram_server_first(&sv, &secret, RFC_CLIENT_FIRST, strlen(RFC_CLIENT_FIRST), err, sizeof(err)));
	assert_false(scram_server_final(&sv, final, len, buf, sizeof(buf), err, sizeof(err)));
	assert_string_equal(err, want);
	assert_false(sv.done);
}

#define NONCE RFC_CLIENT_NONCE RFC_SERVER_NONCE
#define PROOF "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="

static void test_server_final_malformed(void **state)
{
	ScramServer sv;
	char big[SCRAM_MAX_MSG + 2], buf[SCRAM_MAX_MSG], err[128];

#define E(msg, want) expect_server_final_error(msg, strlen(msg), want)
	E("r=" NONCE ",p=" PROOF, "malformed SCRAM message: unexpected attribute 'r', expected 'c'");
	E("c=biws", "malformed SCRAM message: missing attribute 'r'");
	E("c=biws,r=" NONCE, "malformed SCRAM message: missing attribute 'p'");
	E("c=biws,p=" PROOF, "malformed SCRAM message: unexpected attribute 'p', expected 'r'");
	E("c=b!ws,r=" NONCE ",p=" PROOF, "malformed SCRAM message: invalid base64 in channel binding");
	E("c=biw,r=" NONCE ",p=" PROOF, "malformed SCRAM message: invalid base64 in channel binding");
	E("c=eSws,r=" NONCE ",p=" PROOF, "SCRAM channel binding check failed");
	E("c=biws,r=" RFC_CLIENT_NONCE ",p=" PROOF, "SCRAM nonce mismatch");
	E("c=biws,r=" NONCE "x,p=" PROOF, "SCRAM nonce mismatch");
	E("c=biws,r=" RFC_CLIENT_NONCE "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k1,p=" PROOF, "SCRAM nonce mismatch");
	E("c=biws,r=" NONCE ",r=" NONCE ",p=" PROOF, "malformed SCRAM message: unexpected attribute 'r', expected 'p'");
	E("c=biws,r=" NONCE ",x=1,p=" PROOF, "malformed SCRAM message: unexpected attribute 'x', expected 'p'");
	E("c=biws,r=" NONCE ",p=" PROOF ",x=1", "malformed SCRAM message: unexpected data after proof");
	E("c=biws,r=" NONCE ",p=" PROOF ",", "malformed SCRAM message: unexpected data after proof");
	E("c=biws,r=" NONCE ",p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ",
	  "malformed SCRAM message: invalid client proof");
	E("c=biws,r=" NONCE ",p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndV==",
	  "malformed SCRAM message: invalid client proof");
	E("c=biws,r=" NONCE ",p=dHzbZapW Ik4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
	  "malformed SCRAM message: invalid client proof");
	E("c=biws,r=" NONCE ",p=AAAA", "malformed SCRAM message: invalid client proof");
	E("c=biws,r=" NONCE ",p=", "malformed SCRAM message: invalid client proof");
	E("c=biws,r=" NONCE ",p=eHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=", "SCRAM client proof does not match");
#undef E
	memset(big, 'A', sizeof(big));
	memcpy(big, "c=biws,r=", 9);
	expect_server_final_error(big, SCRAM_MAX_MSG + 1, "SCRAM message too long");

	/* a client-final before any client-first */
	memset(&sv, 0, sizeof(sv));
	assert_false(
	    scram_server_final(&sv, RFC_CLIENT_FINAL, strlen(RFC_CLIENT_FINAL), buf, sizeof(buf), err, sizeof(err)));
	assert_string_equal(err, "unexpected SCRAM message");

	/* a correct proof but no room for the answer */
	scram_set_test_nonce(RFC_SERVER_NONCE);
	{
		ScramSecret secret = rfc_secret();
		assert_true(
		    scram_server_first(&sv, &secret, RFC_CLIENT_FIRST, strlen(RFC_CLIENT_FIRST), err, sizeof(err)));
	}
	assert_false(scram_server_final(&sv, RFC_CLIENT_FINAL, strlen(RFC_CLIENT_FINAL), buf, 10, err, sizeof(err)));
	assert_string_equal(err, "SCRAM output buffer too small");
	assert_false(sv.done);
}

static void expect_client_final_error(const char *server_first, size_t len, const char *want)
{
	ScramClient cl;
	char buf[SCRAM_MAX_MSG], err[128] = "";

	scram_client_init_password(&cl, "pencil");
	scram_set_test_nonce(RFC_CLIENT_NONCE);
	assert_true(scram_client_first(&cl, buf, sizeof(buf)));
	assert_false(scram_client_final(&cl, server_first, len, buf, sizeof(buf), err, sizeof(err)));
	assert_string_equal(err, want);
	assert_false(scram_client_verify_final(&cl, RFC_SERVER_FINAL, strlen(RFC_SERVER_FINAL), err, sizeof(err)));
	assert_string_equal(err, "unexpected SCRAM message");
}

static void test_client_final_malformed(void **state)
{
	ScramClient cl;
	char big[SCRAM_MAX_MSG + 2], buf[SCRAM_MAX_MSG], err[128];

#define E(msg, want) expect_client_final_error(msg, strlen(msg), want)
	E("r=someoneelse" RFC_SERVER_NONCE ",s=" RFC_SALT_B64 ",i=4096",
	  "SCRAM server nonce does not extend client nonce");
	E("r=" RFC_CLIENT_NONCE ",s=" RFC_SALT_B64 ",i=4096", "SCRAM server nonce does not extend client nonce");
	E("r=rOprNGfwEbeRWgbNEk,s=" RFC_SALT_B64 ",i=4096", "SCRAM server nonce does not extend client nonce");
	E("r=" NONCE "\x7f,s=" RFC_SALT_B64 ",i=4096", "malformed SCRAM message: invalid nonce");
	E("r=" NONCE ",s=" RFC_SALT_B64 ",i=0", "malformed SCRAM message: invalid iteration count");
	E("r=" NONCE ",s=" RFC_SALT_B64 ",i=-1", "malformed SCRAM message: invalid iteration count");
	E("r=" NONCE ",s=" RFC_SALT_B64 ",i=4k", "malformed SCRAM message: invalid iteration count");
	E("r=" NONCE ",s=" RFC_SALT_B64 ",i=", "malformed SCRAM message: invalid iteration count");
	E("r=" NONCE ",s=" RFC_SALT_B64 ",i=2147483648", "malformed SCRAM message: invalid iteration count");
	E("r=" NONCE ",s=W22ZaJ0SNY7soEsUEjb6gQ=,i=4096", "malformed SCRAM message: invalid salt");
	E("r=" NONCE ",s=W22ZaJ0SNY7s=oEsUEjb6gQ==,i=4096", "malformed SCRAM message: invalid salt");
	E("r=" NONCE ",s=,i=4096", "malformed SCRAM message: invalid salt");
	E("r=" NONCE ",s=W22ZaJ0SNY7soEsUEjb6gQ=A,i=4096", "malformed SCRAM message: invalid salt");
	E("r=" NONCE ",i=4096", "malformed SCRAM message: unexpected attribute 'i', expected 's'");
	E("r=" NONCE ",s=" RFC_SALT_B64, "malformed SCRAM message: missing attribute 'i'");
	E("s=" RFC_SALT_B64 ",i=4096", "malformed SCRAM message: unexpected attribute 's', expected 'r'");
	E("m=x,r=" NONCE ",s=" RFC_SALT_B64 ",i=4096", "unsupported SCRAM extension");
	E("r=" NONCE ",s=" RFC_SALT_B64 ",i=4096,x=1",
	  "malformed SCRAM message: unexpected data after iteration count");
	E("", "malformed SCRAM message: missing attribute 'r'");
#undef E
	memset(big, 'A', sizeof(big));
	memcpy(big, "r=" RFC_CLIENT_NONCE, 22);
	expect_client_final_error(big, SCRAM_MAX_MSG + 1, "SCRAM message too long");

	/* server-first before our client-first */
	scram_client_init_password(&cl, "pencil");
	assert_false(
	    scram_client_final(&cl, RFC_SERVER_FIRST, strlen(RFC_SERVER_FIRST), buf, sizeof(buf), err, sizeof(err)));
	assert_string_equal(err, "unexpected SCRAM message");
}

static void test_client_verify_final_malformed(void **state)
{
	ScramClient cl;
	char buf[SCRAM_MAX_MSG], err[128];

	scram_client_init_password(&cl, "pencil");
	scram_set_test_nonce(RFC_CLIENT_NONCE);
	assert_true(scram_client_first_user(&cl, "user", buf, sizeof(buf)));
	assert_true(
	    scram_client_final(&cl, RFC_SERVER_FIRST, strlen(RFC_SERVER_FIRST), buf, sizeof(buf), err, sizeof(err)));

#define E(msg, want)                                                                                                   \
	do {                                                                                                           \
		assert_false(scram_client_verify_final(&cl, msg, strlen(msg), err, sizeof(err)));                      \
		assert_string_equal(err, want);                                                                        \
	} while (0)
	E("e=invalid-proof", "SCRAM error from server: invalid-proof");
	E("v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4", "malformed SCRAM message: invalid server signature");
	E("v=AAAA", "malformed SCRAM message: invalid server signature");
	E(RFC_SERVER_FINAL ",x=1", "malformed SCRAM message: unexpected data after server signature");
	E("r=abc", "malformed SCRAM message: unexpected attribute 'r', expected 'v'");
	E("", "malformed SCRAM message: missing attribute 'v'");
#undef E
	/* still fine with the right one */
	assert_true(scram_client_verify_final(&cl, RFC_SERVER_FINAL, strlen(RFC_SERVER_FINAL), err, sizeof(err)));
}

static void test_client_first_user_escaping(void **state)
{
	ScramClient cl;
	char buf[SCRAM_MAX_MSG];

	scram_client_init_keys(&cl, rfc_client_key, rfc_client_key);
	scram_set_test_nonce("abc");
	assert_true(scram_client_first_user(&cl, "a=b,c", buf, sizeof(buf)));
	assert_string_equal(buf, "n,,n=a=3Db=2Cc,r=abc");
	assert_string_equal(cl.client_first_bare, "n=a=3Db=2Cc,r=abc");
	/* buffer too small */
	assert_false(scram_client_first(&cl, buf, 10));
}

static void test_client_unusable_password(void **state)
{
	ScramClient cl;
	char buf[SCRAM_MAX_MSG];
	char *longpw = malloc(USERLIST_MAX_SECRET + 2);

	assert_non_null(longpw);
	/* as long as an auth_file password may be: usable */
	memset(longpw, 'x', USERLIST_MAX_SECRET);
	longpw[USERLIST_MAX_SECRET] = '\0';
	scram_client_init_password(&cl, longpw);
	assert_true(scram_client_first(&cl, buf, sizeof(buf)));
	/* one byte more does not fit */
	longpw[USERLIST_MAX_SECRET] = 'x';
	longpw[USERLIST_MAX_SECRET + 1] = '\0';
	scram_client_init_password(&cl, longpw);
	assert_false(scram_client_first(&cl, buf, sizeof(buf)));
	free(longpw);

	scram_client_init_password(&cl, "");
	assert_false(scram_client_first(&cl, buf, sizeof(buf)));
}

static void test_parse_secret(void **state)
{
	static const char *bad[] = {
	    "",
	    "md545f2603610af569b6155c45067268c6b",
	    "SCRAM-SHA-256",
	    "SCRAM-SHA-1$4096:" RFC_SALT_B64 "$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:"
	    "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=",
	    "SCRAM-SHA-256$0:" RFC_SALT_B64 "$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:"
	    "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=",
	    "SCRAM-SHA-256$-1:" RFC_SALT_B64 "$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:"
	    "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=",
	    "SCRAM-SHA-256$:" RFC_SALT_B64 "$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:"
	    "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=",
	    "SCRAM-SHA-256$4096:$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:"
	    "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=",
	    "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ=$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:"
	    "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=",
	    "SCRAM-SHA-256$4096:" RFC_SALT_B64 "$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4q=:"
	    "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=",
	    "SCRAM-SHA-256$4096:" RFC_SALT_B64 "$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:"
	    "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU",
	    "SCRAM-SHA-256$4096:" RFC_SALT_B64 "$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:"
	    "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU= ",
	    "SCRAM-SHA-256$4096:" RFC_SALT_B64 "$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:"
	    "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=:AAAA",
	    "SCRAM-SHA-256$4096:" RFC_SALT_B64 "$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=",
	    "SCRAM-SHA-256$4096:" RFC_SALT_B64,
	    "SCRAM-SHA-256$4096",
	};
	ScramSecret s;
	char buf[256];

	assert_true(scram_parse_secret(RFC_VERIFIER, &s));
	assert_int_equal(s.iterations, 4096);
	assert_int_equal(s.salt_len, 16);
	assert_memory_equal(s.salt, "\x5b\x6d\x99\x68\x9d\x12\x35\x8e\xec\xa0\x4b\x14\x12\x36\xfa\x81", 16);
	assert_true(scram_format_secret(&s, buf, sizeof(buf)));
	assert_string_equal(buf, RFC_VERIFIER);
	assert_false(scram_format_secret(&s, buf, strlen(RFC_VERIFIER)));
	assert_true(scram_format_secret(&s, buf, strlen(RFC_VERIFIER) + 1));

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memset(&s, 0x55, sizeof(s));
		if (scram_parse_secret(bad[i], &s))
			fail_msg("accepted bad secret: \"%s\"", bad[i]);
		assert_int_equal(s.iterations, 0x55555555); /* untouched */
	}
}

static void test_build_and_verify_plain(void **state)
{
	ScramSecret a, b, parsed;
	char buf[256];

	assert_true(scram_build_secret("hunter2", 4096, &a));
	assert_true(scram_build_secret("hunter2", 4096, &b));
	assert_int_equal(a.iterations, 4096);
	assert_memory_not_equal(a.salt, b.salt, 16);
	assert_memory_not_equal(a.stored_key, b.stored_key, SCRAM_KEY_LEN);
	assert_true(scram_verify_plain_password(&a, "hunter2"));
	assert_true(scram_verify_plain_password(&b, "hunter2"));
	assert_false(scram_verify_plain_password(&a, "hunter3"));
	assert_false(scram_verify_plain_password(&a, ""));

	assert_true(scram_format_secret(&a, buf, sizeof(buf)));
	assert_true(scram_parse_secret(buf, &parsed));
	assert_memory_equal(&parsed, &a, sizeof(a));

	assert_false(scram_build_secret("x", 0, &a));
	assert_false(scram_build_secret_salt("x", (const uint8_t *)"salt", 0, 4096, &a));

	{
		ScramSecret rfc = rfc_secret();
		assert_true(scram_verify_plain_password(&rfc, "pencil"));
		assert_false(scram_verify_plain_password(&rfc, "Pencil"));
	}
}

/*
 * SASLprep must agree with PostgreSQL, or a verifier made by one fails
 * against the other. These verifiers were made by PostgreSQL 15
 * (CREATE ROLE ... PASSWORD with password_encryption = scram-sha-256).
 */
static void test_saslprep_matches_postgres(void **state)
{
	static const struct {
		const char *password;
		const char *verifier;
	} pg[] = {
	    /* soft hyphen is mapped to nothing: "IX" */
	    {"I\xc2\xad"
	     "X",
	     "SCRAM-SHA-256$4096:RBPU1zinKcJ+B9AMtpkCUQ==$8+UOx392Yl7mx6sj//T5IYQ55crVhYPG3umpLB98Pog=:"
	     "KieXP4OaZubTeo7PepqMFh0y5iZ0hHWdHB9JHBN08S4="},
	    /* U+2168 ROMAN NUMERAL NINE, NFKC: "IX" */
	    {"\xe2\x85\xa8", "SCRAM-SHA-256$4096:2sceqWwfBHFWD9pM5cL52A==$+ffjf7SbX02L5NbpbHLtXLk1ANeNO4tcL5zfMF8fyR4=:"
	                     "WDNOShi2zydxdptRkOA4QAJrpprx1yDE88RYfNXO8Qg="},
	    /* U+00AA (would map to "a") + U+0221 (unassigned in Unicode 3.2): used unchanged */
	    {"\xc2\xaa\xc8\xa1",
	     "SCRAM-SHA-256$4096:JxyFfCG1F+nx5TLKJdF/3g==$sMY+aUsbUipe2lln3N/5PHJi7a9QmopajiYuvdwQ1Os=:"
	     "3ky/Cf4dnOJR9M7fMRiXXqi4sMhM9xlpyskxWXcSLRU="},
	    /* U+0627 then "1": bidi rule broken, used unchanged */
	    {"\xd8\xa7"
	     "1",
	     "SCRAM-SHA-256$4096:boMUC8lIA0ypKHw5eXM5gw==$wjCmL47ve+rjaeFf2Wn62kzUPRZKCymVTQ+xd0wTD/Y=:"
	     "+TlHpJ/piAVXl0FHTn56aa0yCrsbGJmKbenyMbqCsrs="},
	    /* U+3000 IDEOGRAPHIC SPACE maps to " " */
	    {"a\xe3\x80\x80"
	     "b",
	     "SCRAM-SHA-256$4096:VODQT7gbM5MNN9wox5adOQ==$XJO2jF9NRcpBCDtbQlmCDU7JWlefI43Me1WQafbRIN0=:"
	     "IzyHoYrjoMZcRLComUuKq1R/ry8XKY+JeoEnrvbQTqs="},
	    /* U+0085 is prohibited: used unchanged */
	    {"\xc2\xaa\xc2\x85",
	     "SCRAM-SHA-256$4096:xjPVB2e/B+C6GamWP86hoQ==$StjMQpsv/cdAgKZYAd8iy8vB6Yw69R9IOtKWLIscOUk=:"
	     "iDtFdAbmtwjZ4CwaF2DELV+wFnu1O6eHWrLRXhsuGqY="},
	    /* ASCII control character */
	    {"ab\x07"
	     "c",
	     "SCRAM-SHA-256$4096:lYQN6rz0iGSRKERPT2QlGg==$d+yIiH+0z9zjeukKhdXQyQh9BKjB5BRaKUfh2tMGKF8=:"
	     "ASXW9WbHpAsP2oXJwK74+iCr7g8v2efJa1mynrrphpc="},
	    {"pencil", "SCRAM-SHA-256$4096:EoYrazwtnZZAzvjiWlr/Nw==$tBn6qeTVr4f9qIF4wVx/TjrtFBYpK+EZvOKoHeFKqQE=:"
	               "va0y0rSgJE1qSbi2hgo6iQYhb9RDqAhkPnuBZBKVQYg="},
	};
	ScramSecret s;

	for (size_t i = 0; i < sizeof(pg) / sizeof(pg[0]); i++) {
		assert_true(scram_parse_secret(pg[i].verifier, &s));
		if (!scram_verify_plain_password(&s, pg[i].password))
			fail_msg("SASLprep differs from PostgreSQL for case %zu", i);
	}
	/* the mapped ones equal their mapping */
	assert_true(scram_parse_secret(pg[0].verifier, &s));
	assert_true(scram_verify_plain_password(&s, "IX"));
	assert_true(scram_parse_secret(pg[1].verifier, &s));
	assert_true(scram_verify_plain_password(&s, "IX"));
	assert_true(scram_parse_secret(pg[4].verifier, &s));
	assert_true(scram_verify_plain_password(&s, "a b"));
	/* the unchanged one does not equal a partial mapping */
	assert_true(scram_parse_secret(pg[2].verifier, &s));
	assert_false(scram_verify_plain_password(&s, "a\xc8\xa1"));

	/* the client side applies the same SASLprep: log in with U+2168 against the "IX" verifier */
	{
		ScramClient cl;
		ScramServer sv;
		bool client_ok;

		assert_true(scram_parse_secret(pg[0].verifier, &s));
		scram_client_init_password(&cl, "\xe2\x85\xa8");
		assert_string_equal(cl.password, "IX");
		assert_true(exchange(&cl, &sv, &s, &client_ok));
		assert_true(client_ok);
	}
}

/* Not UTF-8: the bytes are used as they are (verifier from Python's hashlib). */
static void test_saslprep_invalid_utf8(void **state)
{
	ScramSecret s;
	uint8_t salt[16];
	char buf[256];

	for (int i = 0; i < 16; i++)
		salt[i] = (uint8_t)i;
	assert_true(scram_build_secret_salt("\xff\xfe"
	                                    "ab",
	                                    salt, sizeof(salt), 4096, &s));
	assert_true(scram_format_secret(&s, buf, sizeof(buf)));
	assert_string_equal(buf,
	                    "SCRAM-SHA-256$4096:AAECAwQFBgcICQoLDA0ODw==$+YVdKHZDUnopfZroEi4hS2nTis/lfZlrLrWq0GO5ooQ=:"
	                    "Xc2U25jzvl5bU1GSLVkcTP1q+LRCrPamU0xuqKfBTTo=");
}

static void test_md5(void **state)
{
	const uint8_t salt[4] = {0x01, 0x02, 0x03, 0x04};
	const uint8_t salt2[4] = {0xde, 0xad, 0xbe, 0xef};
	char out[MD5_PASSWD_LEN + 1];

	md5_password_hash("1234", "admin", out);
	assert_string_equal(out, "md545f2603610af569b6155c45067268c6b");

	/* md5(hex(md5("1234admin")) || salt), computed with Python's hashlib */
	md5_salted_response("1234", false, "admin", salt, out);
	assert_string_equal(out, "md53db460fcab3fd3a6df7db145a8d8253b");
	md5_salted_response("md545f2603610af569b6155c45067268c6b", true, "admin", salt, out);
	assert_string_equal(out, "md53db460fcab3fd3a6df7db145a8d8253b");
	md5_salted_response("md545f2603610af569b6155c45067268c6b", true, "ignored", salt2, out);
	assert_string_equal(out, "md578b732a6e6854239565dc8b2bd0002bf");

	/* a broken md5 secret gives "", which no response equals */
	md5_salted_response("md545f2603610af569b6155c45067268c6", true, "admin", salt, out);
	assert_string_equal(out, "");
	md5_salted_response("xyz45f2603610af569b6155c45067268c6b", true, "admin", salt, out);
	assert_string_equal(out, "");
}

static void test_secure_equal(void **state)
{
	assert_true(scram_secure_equal("abcd", "abcd", 4));
	assert_false(scram_secure_equal("abcd", "abce", 4));
	assert_true(scram_secure_equal("abcd", "abce", 3));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_rfc7677_client),
	    cmocka_unit_test(test_rfc7677_server),
	    cmocka_unit_test(test_round_trip),
	    cmocka_unit_test(test_pass_through),
	    cmocka_unit_test(test_channel_binding_flags),
	    cmocka_unit_test(test_channel_binding_y_accepted),
	    cmocka_unit_test(test_server_first_malformed),
	    cmocka_unit_test(test_server_final_malformed),
	    cmocka_unit_test(test_client_final_malformed),
	    cmocka_unit_test(test_client_verify_final_malformed),
	    cmocka_unit_test(test_client_first_user_escaping),
	    cmocka_unit_test(test_client_unusable_password),
	    cmocka_unit_test(test_parse_secret),
	    cmocka_unit_test(test_build_and_verify_plain),
	    cmocka_unit_test(test_saslprep_matches_postgres),
	    cmocka_unit_test(test_saslprep_invalid_utf8),
	    cmocka_unit_test(test_md5),
	    cmocka_unit_test(test_secure_equal),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
