/* libldap through dlopen() (include/common/ldap_dl.h). */
#include "autoconfig.h"

#define PGB_LDAP_DL_IMPL
#include "common/ldap_dl.h"

#include <dlfcn.h>
#include <stdio.h>

const LdapApi *ldap_dl;

/* Resolve `name` into *slot; false when the library lacks it. */
static bool resolve(void *lib, const char *name, void *slot, char *err, size_t errlen)
{
	void *fn = dlsym(lib, name);
	if (!fn) {
		snprintf(err, errlen, "%s has no %s", LDAP_SONAME, name);
		return false;
	}
	*(void **)slot = fn;
	return true;
}

bool ldap_dl_load(char *err, size_t errlen)
{
	static LdapApi api;
	static char failed[256];
	if (ldap_dl)
		return true;
	if (failed[0]) {
		snprintf(err, errlen, "%s", failed);
		return false;
	}
	void *lib = dlopen(LDAP_SONAME, RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		const char *why = dlerror();
		snprintf(failed, sizeof(failed), "cannot load %s: %s", LDAP_SONAME, why ? why : "dlopen failed");
		snprintf(err, errlen, "%s", failed);
		return false;
	}
	bool ok = resolve(lib, "ldap_url_parse", &api.url_parse, failed, sizeof(failed)) &&
	          resolve(lib, "ldap_free_urldesc", &api.free_urldesc, failed, sizeof(failed)) &&
	          resolve(lib, "ldap_set_option", &api.set_option, failed, sizeof(failed)) &&
	          resolve(lib, "ldap_get_option", &api.get_option, failed, sizeof(failed)) &&
	          resolve(lib, "ldap_msgfree", &api.msgfree, failed, sizeof(failed)) &&
	          resolve(lib, "ldap_memfree", &api.memfree, failed, sizeof(failed)) &&
	          resolve(lib, "ldap_unbind_ext", &api.unbind_ext, failed, sizeof(failed)) &&
	          resolve(lib, "ldap_start_tls_s", &api.start_tls_s, failed, sizeof(failed)) &&
	          resolve(lib, "ldap_search_ext_s", &api.search_ext_s, failed, sizeof(failed)) &&
	          resolve(lib, "ldap_sasl_bind_s", &api.sasl_bind_s, failed, sizeof(failed)) &&
	          resolve(lib, "ldap_install_tls", &api.install_tls, failed, sizeof(failed)) &&
	          resolve(lib, "ldap_init_fd", &api.init_fd, failed, sizeof(failed)) &&
	          resolve(lib, "ldap_get_dn", &api.get_dn, failed, sizeof(failed)) &&
	          resolve(lib, "ldap_first_entry", &api.first_entry, failed, sizeof(failed)) &&
	          resolve(lib, "ldap_err2string", &api.err2string, failed, sizeof(failed)) &&
	          resolve(lib, "ldap_count_entries", &api.count_entries, failed, sizeof(failed));
	if (!ok) {
		dlclose(lib);
		snprintf(err, errlen, "%s", failed);
		return false;
	}
	ldap_dl = &api;
	return true;
}
