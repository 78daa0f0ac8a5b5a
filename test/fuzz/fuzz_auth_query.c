/*
 * libFuzzer target: the auth_query reply parsers (RowDescription column
 * count, DataRow secret) and the set-up hint built from a server error.
 * The first byte chooses the parser.
 */
#include "autoconfig.h"

#include <stdio.h>

#include "fuzz.h"
#include "worker/auth_query_msg.h"

static void fuzz_row(const uint8_t *body, size_t size, uint8_t sel)
{
	static const size_t max_secret[] = {0, 9, 2047, 65535};
	char *secret = NULL;
	char err[256];
	AuthqRow r = authq_parse_row(body, (uint32_t)size, max_secret[sel & 3], &secret, err, sizeof(err));
	if (r == AUTHQ_ROW_SECRET) {
		if (!secret || strlen(secret) > max_secret[sel & 3])
			abort(); /* the contract: a string within the bound */
		free(secret);
	} else if (r == AUTHQ_ROW_BAD && strlen(err) >= sizeof(err)) {
		abort();
	}
}

static void fuzz_hint(const uint8_t *data, size_t size, uint8_t sel)
{
	const uint8_t *f[5];
	size_t n[5];
	char *s[5];
	fuzz_split(data, size, 5, f, n);
	for (int i = 0; i < 5; i++)
		s[i] = fuzz_strndup(f[i], n[i]);
	char small[16], big[2048];
	(void)authq_error_hint(s[0], s[1], s[2], s[3], (sel & 1) ? s[4] : NULL, big, sizeof(big));
	(void)authq_error_hint(s[0], s[1], s[2], s[3], s[4], small, sizeof(small));
	authq_quote_ident(s[2], small, sizeof(small));
	authq_quote_ident(s[3], big, sizeof(big));
	for (int i = 0; i < 5; i++)
		free(s[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	uint8_t sel = data[0];
	uint8_t *body = fuzz_copy(data + 1, size - 1);
	switch (sel % 3) {
	case 0:
		(void)authq_row_columns(body, (uint32_t)(size - 1));
		break;
	case 1:
		fuzz_row(body, size - 1, (uint8_t)(sel / 3));
		break;
	default:
		fuzz_hint(body, size - 1, (uint8_t)(sel / 3));
		break;
	}
	free(body);
	return 0;
}
