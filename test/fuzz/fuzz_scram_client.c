/*
 * libFuzzer target: the SCRAM-SHA-256 client side, as a server the pooler
 * logs into drives it: server-first-message (AuthenticationSASLContinue
 * data), NUL, server-final-message (AuthenticationSASLFinal data). The
 * client uses pass-through keys, so that a large iteration count in the
 * input costs nothing; the client nonce is fixed. The whole input is also
 * read as a stored SCRAM verifier (auth_file, auth_query).
 */
#include "autoconfig.h"

#include "fuzz.h"
#include "common/scram.h"

#define FUZZ_CLIENT_NONCE "rOprNGfwEbeRWgbNEkqO"

static void fuzz_secret(const uint8_t *data, size_t size)
{
	char *text = fuzz_strndup(data, size);
	ScramSecret s;
	char buf[512];
	if (scram_parse_secret(text, &s)) {
		if (s.iterations < 1 || s.salt_len == 0 || s.salt_len > SCRAM_MAX_SALT)
			abort();
		if (!scram_format_secret(&s, buf, sizeof(buf)))
			abort(); /* what parsed formats again */
	}
	free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint8_t client_key[SCRAM_KEY_LEN] = {1, 2, 3}, server_key[SCRAM_KEY_LEN] = {4, 5, 6};
	const uint8_t *f[2];
	size_t n[2];
	fuzz_split(data, size, 2, f, n);
	char *first = (char *)fuzz_copy(f[0], n[0]);
	char *final = (char *)fuzz_copy(f[1], n[1]);
	ScramClient *st = calloc(1, sizeof(*st));
	char buf[SCRAM_MAX_MSG], err[128];

	scram_client_init_keys(st, client_key, server_key);
	scram_set_test_nonce(FUZZ_CLIENT_NONCE);
	if (!scram_client_first(st, buf, sizeof(buf)))
		abort();
	if (scram_client_final(st, first, n[0], buf, sizeof(buf), err, sizeof(err)))
		(void)scram_client_verify_final(st, final, n[1], err, sizeof(err));
	scram_set_test_nonce(NULL);
	free(st);
	free(first);
	free(final);
	fuzz_secret(data, size);
	return 0;
}
