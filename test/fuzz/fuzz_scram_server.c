/*
 * libFuzzer target: the SCRAM-SHA-256 server side, as a client logging
 * into the pooler drives it: client-first-message (SASLInitialResponse
 * data), NUL, client-final-message (SASLResponse data). The verifier is
 * that of password "pencil"; the server nonce is fixed, so that a seed can
 * carry a valid proof and reach the success path.
 */
#include "autoconfig.h"

#include "fuzz.h"
#include "common/scram.h"

#define FUZZ_SERVER_NONCE "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"

static ScramSecret secret;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_scram_secret(&secret);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *f[2];
	size_t n[2];
	fuzz_split(data, size, 2, f, n);
	char *first = (char *)fuzz_copy(f[0], n[0]);
	char *final = (char *)fuzz_copy(f[1], n[1]);
	ScramServer *st = calloc(1, sizeof(*st));
	char err[128], server_final[SCRAM_MAX_MSG];

	scram_set_test_nonce(FUZZ_SERVER_NONCE);
	if (scram_server_first(st, &secret, first, n[0], err, sizeof(err))) {
		if (strlen(st->server_first) >= sizeof(st->server_first))
			abort();
		if (scram_server_final(st, final, n[1], server_final, sizeof(server_final), err, sizeof(err)) &&
		    strncmp(server_final, "v=", 2) != 0)
			abort();
	}
	scram_set_test_nonce(NULL);
	free(st);
	free(first);
	free(final);
	return 0;
}
