/*
 * libFuzzer target: the auth_hba_file and auth_ident_file parsers, and
 * rule matching over what parsed. The input is the hba text, a NUL, the
 * ident text, a NUL, then the client's database and user names.
 */
#include "autoconfig.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "fuzz.h"
#include "common/hba.h"

static void ignore(void *arg, const char *msg)
{
	(void)arg;
	(void)msg;
}

static void match_all(const HbaRules *rules, const char *db, const char *user)
{
	struct sockaddr_in v4 = {.sin_family = AF_INET};
	struct sockaddr_in6 v6 = {.sin6_family = AF_INET6};
	v4.sin_addr.s_addr = htonl(0x7f000001);
	v6.sin6_addr.s6_addr[15] = 1;
	for (int m = 0; m < 8; m++) {
		const struct sockaddr *sa = (m & 4) ? (const struct sockaddr *)&v6 : (const struct sockaddr *)&v4;
		const HbaRule *r = hba_match(rules, m == 0, m & 1, db, user, m & 2, sa);
		if (r && (r < rules->rules || r >= rules->rules + rules->n_rules))
			abort();
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *f[4];
	size_t n[4];
	fuzz_split(data, size, 4, f, n);
	char *hba_text = fuzz_strndup(f[0], n[0]);
	char *ident_text = fuzz_strndup(f[1], n[1]);
	char *db = fuzz_strndup(f[2], n[2]);
	char *user = fuzz_strndup(f[3], n[3]);

	HbaRules rules;
	/* @file names are read relative to a directory that does not exist */
	hba_parse(&rules, hba_text, "/nonexistent/pgb-fuzz", ignore, NULL);
	match_all(&rules, *db ? db : "db", *user ? user : "alice");
	(void)hba_uses_cert(&rules);

	IdentMap map;
	ident_parse(&map, ident_text, ignore, NULL);
	for (int i = 0; i < rules.n_rules; i++)
		if (rules.rules[i].map)
			(void)ident_map_allows(&map, rules.rules[i].map, user, db);
	(void)ident_map_allows(&map, "map", user, db);

	ident_free(&map);
	hba_free(&rules);
	free(hba_text);
	free(ident_text);
	free(db);
	free(user);
	return 0;
}
