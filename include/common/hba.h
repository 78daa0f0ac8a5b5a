/*
 * The auth_hba_file (a subset of pg_hba.conf) and the auth_ident_file:
 * reading them into rules and maps, and choosing the rule for a client.
 * Pure code without worker state, so that it is unit-tested alone.
 */
#ifndef PGB_COMMON_HBA_H
#define PGB_COMMON_HBA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "common/config.h"

/* Which connections a rule is for (its first column). */
typedef enum HbaConnType {
	HBA_LOCAL,     /* Unix socket */
	HBA_HOST,      /* TCP, with or without TLS */
	HBA_HOSTSSL,   /* TCP with TLS */
	HBA_HOSTNOSSL, /* TCP without TLS */
} HbaConnType;

/* The database or user column of a rule. */
typedef struct HbaNames {
	bool all;         /* keyword `all` */
	bool sameuser;    /* database column: keyword `sameuser` */
	bool replication; /* database column: keyword `replication` (physical replication) */
	char **names;     /* names given literally or read from @files */
	int n_names;
} HbaNames;

/* One line of the hba file that parsed. */
typedef struct HbaRule {
	int line; /* line number in the file, for logs */
	HbaConnType type;
	HbaNames db;
	HbaNames user;
	bool addr_all;            /* no address test: `local`, or address `all` */
	int family;               /* AF_INET or AF_INET6 when !addr_all */
	uint8_t addr[16];         /* network address (4 bytes used for AF_INET) */
	uint8_t mask[16];         /* netmask, from /len or the mask column */
	int method;               /* AUTH_TRUST, AUTH_REJECT, AUTH_MD5, AUTH_PLAIN, AUTH_PEER, AUTH_CERT,
	                     AUTH_SCRAM_SHA_256, AUTH_LDAP (builds with LDAP) or AUTH_PAM (with PAM) */
	char *map;                /* map=NAME option, or NULL */
	struct LdapOptions *ldap; /* AUTH_LDAP: the options after the method; else NULL */
} HbaRule;

/* The rules of one hba file, in file order (the first match wins). */
typedef struct HbaRules {
	HbaRule *rules;
	int n_rules;
} HbaRules;

/* One `mapname system-username database-username` line of the ident file. */
typedef struct IdentEntry {
	char *map;
	char *system_user;
	char *db_user; /* NULL when the keyword `all` was given */
} IdentEntry;

/* The auth_ident_file, in file order. */
typedef struct IdentMap {
	IdentEntry *entries;
	int n_entries;
} IdentMap;

/*
 * Receives one message per line that was skipped ("could not parse hba
 * config line N: why"); the caller logs it. May be NULL.
 */
typedef void (*HbaWarnFn)(void *arg, const char *msg);

/*
 * Split text into words as the option columns of an hba line are split
 * (blanks, "quotes" with "" for a quote, comma lists, `#` comments) and
 * call fn with each word, quotes removed, until it returns false. False
 * then, or with the reason in *why when the text does not split.
 */
bool hba_split_words(const char *text, bool (*fn)(void *arg, const char *word), void *arg, const char **why)
    __attribute__((warn_unused_result));

/*
 * Parse the text of an hba file into *out (initialised here). `dir` is the
 * directory that relative @file names are read from. Lines that do not
 * parse are reported through warn and skipped; parsing never fails.
 */
void hba_parse(HbaRules *out, const char *text, const char *dir, HbaWarnFn warn, void *warn_arg);

/*
 * Read and parse the hba file at path. When it cannot be read: false with
 * "could not open auth_hba_file PATH: reason" in err and *out left empty.
 */
bool hba_load(HbaRules *out, const char *path, HbaWarnFn warn, void *warn_arg, char *err, size_t errlen)
    __attribute__((warn_unused_result));

void hba_free(HbaRules *rules);

/*
 * The first rule that applies to a client, or NULL when none does.
 * `remote` is the client's address (ignored for Unix-socket clients).
 */
const HbaRule *hba_match(const HbaRules *rules, bool is_unix, bool is_tls, const char *dbname, const char *username,
                         bool is_physical_replication, const struct sockaddr *remote);

/* Whether any rule uses `cert`: then TLS must ask clients for a certificate. */
bool hba_uses_cert(const HbaRules *rules);

/* Whether the configuration's hba file (auth_type=hba only) has a `cert` line; read quietly. */
bool hba_config_uses_cert(const CfGlobals *g);

/* Parse an ident file's text into *out (initialised here); bad lines are reported and skipped. */
void ident_parse(IdentMap *out, const char *text, HbaWarnFn warn, void *warn_arg);

/* Read and parse the ident file; false with "could not open auth_ident_file ..." in err. */
bool ident_load(IdentMap *out, const char *path, HbaWarnFn warn, void *warn_arg, char *err, size_t errlen)
    __attribute__((warn_unused_result));

void ident_free(IdentMap *map);

/* Whether map `map_name` lets the OS / certificate name `system_name` log in as `db_user`. */
bool ident_map_allows(const IdentMap *map, const char *map_name, const char *system_name, const char *db_user);

#endif
