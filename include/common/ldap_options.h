/*
 * LDAP options in PostgreSQL's pg_hba syntax (auth_ldap_options, and the
 * rest of an hba `ldap` line): reading them, the checks a combination must
 * pass, and what a check makes of them for one user (the DN of a simple
 * bind, the search filter, the servers' URLs). Pure code: parsing an
 * ldapurl is libldap's, nothing here connects. User's view: doc/ldap.md.
 */
#ifndef PGB_COMMON_LDAP_OPTIONS_H
#define PGB_COMMON_LDAP_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>

/* Where a search looks (ldapurl's scope; subtree without an ldapurl). */
typedef enum LdapScope {
	LDAP_OPTS_SCOPE_BASE, /* the base DN itself */
	LDAP_OPTS_SCOPE_ONE,  /* its children */
	LDAP_OPTS_SCOPE_SUB,  /* the whole subtree */
} LdapScope;

/* The options of one `ldap` method: simple bind, or search+bind when a base DN is set. */
typedef struct LdapOptions {
	char **servers; /* ldapserver (or the ldapurl's host): names or addresses, tried in order */
	int n_servers;
	int port;              /* ldapport or the URL's port; 0: the scheme's (389, ldaps 636) */
	bool ldaps;            /* ldapscheme=ldaps or an ldaps:// URL: TLS from the first byte */
	bool starttls;         /* ldaptls=1: StartTLS before binding */
	char *prefix;          /* simple bind: DN = prefix + user name + suffix */
	char *suffix;          /* simple bind */
	char *basedn;          /* search+bind: where the user's entry is searched for */
	char *binddn;          /* search+bind: who searches (NULL: anonymous) */
	char *bindpasswd;      /* search+bind: binddn's password; never logged */
	char *search_attr;     /* search+bind: the attribute that holds the user name (NULL: uid) */
	char *search_filter;   /* search+bind: a filter with $username in it (NULL: attribute match) */
	LdapScope scope;       /* search+bind */
	bool simple_set;       /* an option of simple bind was given */
	const char *search_by; /* the first option of search+bind given, for the mix error (static) */
} LdapOptions;

/* Empty options, as before the first option. */
void ldap_options_init(LdapOptions *o);
void ldap_options_free(LdapOptions *o);
/* A copy that lives on its own (for a check running while the rules reload). */
LdapOptions *ldap_options_copy(const LdapOptions *o);

/*
 * Take one option `name=value` (a whole word, quotes already removed).
 * False with the reason, which names the word, in err.
 */
bool ldap_options_add(LdapOptions *o, const char *word, char *err, size_t errlen) __attribute__((warn_unused_result));

/* After the last option: whether they make one usable method; false with the reason in err. */
bool ldap_options_check(const LdapOptions *o, char *err, size_t errlen) __attribute__((warn_unused_result));

/*
 * A whole option list (auth_ldap_options), split into words as an hba
 * line is (spaces, "quotes", commas): init, add each word, check. On
 * failure *o is freed and err names the offending word.
 */
bool ldap_options_parse(LdapOptions *o, const char *text, char *err, size_t errlen) __attribute__((warn_unused_result));

/* Search+bind (a base DN is set) rather than simple bind. */
bool ldap_options_search(const LdapOptions *o);

/* The DN a simple bind uses for `user`; false when it does not fit in buf. */
bool ldap_options_bind_dn(const LdapOptions *o, const char *user, char *buf, size_t len);

/*
 * The filter a search+bind uses for `user`: the ldapsearchfilter with each
 * $username replaced, else (attribute=user). False when the name holds a
 * character that would change the filter (`*`, `(`, `)`, `\`, `/`) or the
 * result does not fit in buf.
 */
bool ldap_options_filter(const LdapOptions *o, const char *user, char *buf, size_t len);

/* The URL of server i, "ldap://host:port" or "ldaps://..." ([host] for IPv6); false when too long. */
bool ldap_options_server_url(const LdapOptions *o, int i, char *buf, size_t len);

/* The port that is used: the option's, or the scheme's. */
int ldap_options_port(const LdapOptions *o);

#endif
