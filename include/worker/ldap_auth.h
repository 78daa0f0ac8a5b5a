/*
 * LDAP authentication (auth_type = ldap, hba method ldap): the client's
 * cleartext password is checked against a directory by a simple bind or a
 * search+bind, in threads of the worker (auth_threads.c), never in its
 * event loop. See doc/ldap.md.
 */
#ifndef PGB_WORKER_LDAP_AUTH_H
#define PGB_WORKER_LDAP_AUTH_H

#include <stdbool.h>

#include "worker/objects.h"

struct LdapOptions;

/*
 * Before the client is asked for its password: prepare its check with the
 * hba rule's options, or auth_ldap_options when `rule` is NULL. False
 * (client closed) when there is nothing to check with.
 */
bool ldap_auth_prepare(PgSocket *c, const struct LdapOptions *rule) __attribute__((warn_unused_result));

/*
 * The password arrived: check it. The client is not read until the answer,
 * which finishes its login or closes it with "LDAP authentication failed";
 * so does the check's deadline (client_login_timeout). False (client
 * closed) when the check cannot be started.
 */
bool ldap_auth_start(PgSocket *c, const char *password) __attribute__((warn_unused_result));

#endif
