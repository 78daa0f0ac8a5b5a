/*
 * libFuzzer target: the admin console's command syntax (admin_parse.c),
 * as admin_handle_query() reads a query: the command word, then SET's key
 * and value or one argument. The input is the query text (it stops at a
 * NUL, as a Query message's string does).
 */
#include "autoconfig.h"

#include "fuzz.h"
#include "worker/admin_parse.h"

static void check_word(AdminParse r, const char *out, size_t outlen)
{
	if (r != ADMIN_PARSE_OK)
		return;
	if (strnlen(out, outlen) >= outlen)
		abort(); /* the result always ends inside its buffer */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *query = fuzz_strndup(data, size);
	char word[16], arg[ADMIN_MAX_WORD], key[ADMIN_MAX_WORD], val[256];
	const char *p = query;
	AdminParse r = admin_read_ident(&p, word, sizeof(word));
	check_word(r, word, sizeof(word));
	if (r == ADMIN_PARSE_OK) {
		if (p < query || p > query + strlen(query))
			abort();
		r = admin_parse_set(p, key, sizeof(key), val, sizeof(val));
		check_word(r, key, sizeof(key));
		check_word(r, val, sizeof(val));
		r = admin_parse_arg(p, arg, sizeof(arg));
		check_word(r, arg, sizeof(arg));
		if (r == ADMIN_PARSE_OK && !admin_at_end(p) && !arg[0])
			abort(); /* something was left, so an argument was read */
	} else if (p != query) {
		abort(); /* a failed read leaves the position alone */
	}
	/* a tiny buffer: every word is too long for it */
	p = query;
	(void)admin_read_ident(&p, word, 1);
	free(query);
	return 0;
}
