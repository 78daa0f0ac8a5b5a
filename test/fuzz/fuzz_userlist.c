/*
 * libFuzzer target: the auth_file parser (userlist.txt) and the secret
 * classification it applies to each password.
 */
#include "autoconfig.h"

#include "common/userlist.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = fuzz_strndup(data, size);
	UserList ul = {0};
	char err[256];
	(void)userlist_parse(&ul, text, err, sizeof(err));
	for (int i = 0; i < ul.n_users; i++) {
		const UserEntry *u = &ul.users[i];
		if (!u->name || !u->secret || strlen(u->name) > USERLIST_MAX_USER ||
		    strlen(u->secret) > USERLIST_MAX_SECRET)
			abort(); /* the documented bounds */
		if (userlist_find(&ul, u->name) == NULL || userlist_secret_kind(u->secret) != u->kind)
			abort();
	}
	(void)userlist_secret_kind(text);
	userlist_free(&ul);
	free(text);
	return 0;
}
