/*
 * libldap, loaded with dlopen() the first time LDAP is needed (an ldapurl
 * to parse, an LDAP login): linked, it and the libraries it pulls in
 * (GnuTLS, p11-kit, ...) made 2.8 MiB of an idle pooler's memory
 * (doc/benchmarks.md, "Memory against PgBouncer 1.25.2, as merged").
 *
 * Include this instead of <ldap.h> and <openldap.h>. The libldap functions the pooler
 * calls keep their names: each is a macro for the loaded function, valid
 * once ldap_dl_load() returned true (the entry points call it).
 */
#ifndef PGB_COMMON_LDAP_DL_H
#define PGB_COMMON_LDAP_DL_H

#include <openldap.h> /* ldap_init_fd(); it includes <ldap.h> */
#include <stdbool.h>
#include <stddef.h>

typedef struct LdapApi {
	__typeof__(ldap_url_parse) *url_parse;
	__typeof__(ldap_free_urldesc) *free_urldesc;
	__typeof__(ldap_set_option) *set_option;
	__typeof__(ldap_get_option) *get_option;
	__typeof__(ldap_msgfree) *msgfree;
	__typeof__(ldap_memfree) *memfree;
	__typeof__(ldap_unbind_ext) *unbind_ext;
	__typeof__(ldap_start_tls_s) *start_tls_s;
	__typeof__(ldap_search_ext_s) *search_ext_s;
	__typeof__(ldap_sasl_bind_s) *sasl_bind_s;
	__typeof__(ldap_install_tls) *install_tls;
	__typeof__(ldap_init_fd) *init_fd;
	__typeof__(ldap_get_dn) *get_dn;
	__typeof__(ldap_first_entry) *first_entry;
	__typeof__(ldap_err2string) *err2string;
	__typeof__(ldap_count_entries) *count_entries;
} LdapApi;

/* The loaded functions; NULL until ldap_dl_load() succeeded. */
extern const LdapApi *ldap_dl;

/*
 * Load libldap (once; later calls answer at once). False with the reason in
 * err when it cannot be loaded. Call it from the main thread, before any
 * thread uses the functions.
 */
bool ldap_dl_load(char *err, size_t errlen);

#ifndef PGB_LDAP_DL_IMPL
#define ldap_url_parse     (ldap_dl->url_parse)
#define ldap_free_urldesc  (ldap_dl->free_urldesc)
#define ldap_set_option    (ldap_dl->set_option)
#define ldap_get_option    (ldap_dl->get_option)
#define ldap_msgfree       (ldap_dl->msgfree)
#define ldap_memfree       (ldap_dl->memfree)
#define ldap_unbind_ext    (ldap_dl->unbind_ext)
#define ldap_start_tls_s   (ldap_dl->start_tls_s)
#define ldap_search_ext_s  (ldap_dl->search_ext_s)
#define ldap_sasl_bind_s   (ldap_dl->sasl_bind_s)
#define ldap_install_tls   (ldap_dl->install_tls)
#define ldap_init_fd       (ldap_dl->init_fd)
#define ldap_get_dn        (ldap_dl->get_dn)
#define ldap_first_entry   (ldap_dl->first_entry)
#define ldap_err2string    (ldap_dl->err2string)
#define ldap_count_entries (ldap_dl->count_entries)
#endif

#endif
