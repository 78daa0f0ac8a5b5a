/*
 * The LDAP options of auth_ldap_options and hba `ldap` lines, with the
 * names and meanings of PostgreSQL's pg_hba options (doc/ldap.md): reading
 * them word by word, the checks on their combination, and the strings a
 * check builds from them for one user. An ldapurl is parsed by libldap.
 */
#include "autoconfig.h"

#include "common/ldap_options.h"

#include "common/ldap_dl.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hba.h"
#include "common/util.h"

void ldap_options_init(LdapOptions *o)
{
	memset(o, 0, sizeof(*o));
	o->scope = LDAP_OPTS_SCOPE_SUB;
}

static void free_servers(LdapOptions *o)
{
	for (int i = 0; i < o->n_servers; i++)
		free(o->servers[i]);
	free(o->servers);
	o->servers = NULL;
	o->n_servers = 0;
}

static void clear_secret(char *s)
{
	if (s) {
		explicit_bzero(s, strlen(s));
		free(s);
	}
}

void ldap_options_free(LdapOptions *o)
{
	free_servers(o);
	free(o->prefix);
	free(o->suffix);
	free(o->basedn);
	free(o->binddn);
	clear_secret(o->bindpasswd);
	free(o->search_attr);
	free(o->search_filter);
	ldap_options_init(o);
}

LdapOptions *ldap_options_copy(const LdapOptions *o)
{
	LdapOptions *c = xmalloc(sizeof(*c));
	*c = *o;
	c->servers = o->n_servers ? xmalloc(sizeof(char *) * (size_t)o->n_servers) : NULL;
	for (int i = 0; i < o->n_servers; i++)
		c->servers[i] = xstrdup(o->servers[i]);
	c->prefix = xstrdup_or_null(o->prefix);
	c->suffix = xstrdup_or_null(o->suffix);
	c->basedn = xstrdup_or_null(o->basedn);
	c->binddn = xstrdup_or_null(o->binddn);
	c->bindpasswd = xstrdup_or_null(o->bindpasswd);
	c->search_attr = xstrdup_or_null(o->search_attr);
	c->search_filter = xstrdup_or_null(o->search_filter);
	return c;
}

static void set_string(char **field, const char *value)
{
	free(*field);
	*field = xstrdup(value);
}

/* ldapserver: names separated by blanks, tried in that order. */
static bool set_servers(LdapOptions *o, const char *value, char *err, size_t errlen)
{
	free_servers(o);
	const char *p = value;
	for (;;) {
		while (*p == ' ' || *p == '\t')
			p++;
		if (!*p)
			break;
		size_t n = strcspn(p, " \t");
		o->servers = xrealloc(o->servers, sizeof(char *) * (size_t)(o->n_servers + 1));
		char *host = xmalloc(n + 1);
		memcpy(host, p, n);
		host[n] = '\0';
		o->servers[o->n_servers++] = host;
		p += n;
	}
	if (o->n_servers == 0)
		return set_error(err, errlen, "ldapserver is empty");
	return true;
}

static bool set_port(LdapOptions *o, const char *value, char *err, size_t errlen)
{
	int port = 0;
	const char *p = value;
	for (; *p >= '0' && *p <= '9' && port <= 65535; p++)
		port = port * 10 + (*p - '0');
	if (p == value || *p || port < 1 || port > 65535)
		return set_error(err, errlen, "invalid ldapport \"%s\": must be a port number (1 to 65535)", value);
	o->port = port;
	return true;
}

/* ldapurl: scheme, host and port, base DN, attribute, scope, filter, as PostgreSQL reads them. */
static bool set_url(LdapOptions *o, const char *value, char *err, size_t errlen)
{
	char why[300];
	if (!ldap_dl_load(why, sizeof(why)))
		return set_error(err, errlen, "ldapurl \"%s\" cannot be read: %s", value, why);
	LDAPURLDesc *d = NULL;
	int rc = ldap_url_parse(value, &d);
	if (rc != LDAP_URL_SUCCESS)
		return set_error(err, errlen, "invalid ldapurl \"%s\" (libldap's URL error %d)", value, rc);
	bool ok = false;
	if (strcmp(d->lud_scheme, "ldap") != 0 && strcmp(d->lud_scheme, "ldaps") != 0) {
		set_error(err, errlen, "invalid ldapurl \"%s\": the scheme must be ldap or ldaps", value);
		goto out;
	}
	if (d->lud_exts) {
		set_error(err, errlen, "invalid ldapurl \"%s\": extensions are not supported", value);
		goto out;
	}
	if (d->lud_attrs && d->lud_attrs[0] && d->lud_attrs[1]) {
		set_error(err, errlen, "invalid ldapurl \"%s\": one search attribute at most", value);
		goto out;
	}
	o->ldaps = strcmp(d->lud_scheme, "ldaps") == 0;
	if (d->lud_host && *d->lud_host && !set_servers(o, d->lud_host, err, errlen))
		goto out;
	o->port = d->lud_port;
	set_string(&o->basedn, d->lud_dn ? d->lud_dn : "");
	if (d->lud_attrs && d->lud_attrs[0])
		set_string(&o->search_attr, d->lud_attrs[0]);
	o->scope = d->lud_scope == LDAP_SCOPE_ONELEVEL  ? LDAP_OPTS_SCOPE_ONE
	           : d->lud_scope == LDAP_SCOPE_SUBTREE ? LDAP_OPTS_SCOPE_SUB
	                                                : LDAP_OPTS_SCOPE_BASE;
	if (d->lud_filter)
		set_string(&o->search_filter, d->lud_filter);
	if (!o->search_by)
		o->search_by = "ldapurl";
	ok = true;
out:
	ldap_free_urldesc(d);
	return ok;
}

/* The options of search+bind, in the order a mix error names them. */
static const char *const search_options[] = {"ldapbasedn", "ldapbinddn", "ldapbindpasswd", "ldapsearchattribute",
                                             "ldapsearchfilter"};

bool ldap_options_add(LdapOptions *o, const char *word, char *err, size_t errlen)
{
	const char *eq = strchr(word, '=');
	if (!eq || eq == word)
		return set_error(err, errlen, "LDAP option not in name=value format: \"%s\"", word);
	char name[32];
	size_t nlen = (size_t)(eq - word);
	if (nlen >= sizeof(name))
		return set_error(err, errlen, "unrecognized LDAP option \"%.*s\"", (int)nlen, word);
	memcpy(name, word, nlen);
	name[nlen] = '\0';
	const char *value = eq + 1;

	if (strcmp(name, "ldapserver") == 0)
		return set_servers(o, value, err, errlen);
	if (strcmp(name, "ldapport") == 0)
		return set_port(o, value, err, errlen);
	if (strcmp(name, "ldapscheme") == 0) {
		if (strcmp(value, "ldap") != 0 && strcmp(value, "ldaps") != 0)
			return set_error(err, errlen, "invalid ldapscheme \"%s\": must be ldap or ldaps", value);
		o->ldaps = strcmp(value, "ldaps") == 0;
		return true;
	}
	if (strcmp(name, "ldaptls") == 0) {
		/* PostgreSQL takes anything but 1 for "no": a typo must not turn TLS off silently */
		if (strcmp(value, "1") != 0 && strcmp(value, "0") != 0)
			return set_error(err, errlen, "invalid ldaptls \"%s\": must be 1 or 0", value);
		o->starttls = value[0] == '1';
		return true;
	}
	if (strcmp(name, "ldapurl") == 0)
		return set_url(o, value, err, errlen);
	if (strcmp(name, "ldapprefix") == 0 || strcmp(name, "ldapsuffix") == 0) {
		set_string(name[4] == 'p' ? &o->prefix : &o->suffix, value);
		o->simple_set = true;
		return true;
	}
	char **search_fields[] = {&o->basedn, &o->binddn, &o->bindpasswd, &o->search_attr, &o->search_filter};
	for (size_t i = 0; i < sizeof(search_options) / sizeof(search_options[0]); i++) {
		if (strcmp(name, search_options[i]) != 0)
			continue;
		if (search_fields[i] == &o->bindpasswd) {
			clear_secret(o->bindpasswd);
			o->bindpasswd = NULL;
		}
		set_string(search_fields[i], value);
		if (!o->search_by)
			o->search_by = search_options[i];
		return true;
	}
	return set_error(err, errlen, "unrecognized LDAP option \"%s\"", name);
}

bool ldap_options_check(const LdapOptions *o, char *err, size_t errlen)
{
	if (o->simple_set && o->search_by)
		return set_error(err, errlen,
		                 "%s cannot be used with ldapprefix or ldapsuffix: search+bind and simple bind "
		                 "do not mix",
		                 o->search_by);
	if (!o->simple_set && !o->basedn)
		return set_error(err, errlen,
		                 "the LDAP options need ldapbasedn (or an ldapurl: search+bind) or ldapprefix "
		                 "or ldapsuffix (simple bind)");
	if (o->search_attr && o->search_filter)
		return set_error(err, errlen, "ldapsearchattribute cannot be used with ldapsearchfilter");
	if (o->n_servers == 0)
		return set_error(err, errlen,
		                 "the LDAP options name no server: set ldapserver (or an ldapurl with a host)");
	if (o->ldaps && o->starttls)
		return set_error(err, errlen, "ldaptls=1 (StartTLS) cannot be used with ldaps");
	return true;
}

/* Collects the words of ldap_options_parse(). */
typedef struct ParseCtx {
	LdapOptions *o;
	char *err;
	size_t errlen;
} ParseCtx;

static bool parse_word(void *arg, const char *word)
{
	ParseCtx *ctx = arg;
	return ldap_options_add(ctx->o, word, ctx->err, ctx->errlen);
}

bool ldap_options_parse(LdapOptions *o, const char *text, char *err, size_t errlen)
{
	ParseCtx ctx = {o, err, errlen};
	const char *why = NULL;
	ldap_options_init(o);
	if (!hba_split_words(text, parse_word, &ctx, &why)) {
		if (why)
			set_error(err, errlen, "%s", why);
		ldap_options_free(o);
		return false;
	}
	if (!ldap_options_check(o, err, errlen)) {
		ldap_options_free(o);
		return false;
	}
	return true;
}

bool ldap_options_search(const LdapOptions *o)
{
	return o->basedn != NULL;
}

bool ldap_options_bind_dn(const LdapOptions *o, const char *user, char *buf, size_t len)
{
	int n = snprintf(buf, len, "%s%s%s", o->prefix ? o->prefix : "", user, o->suffix ? o->suffix : "");
	return n >= 0 && (size_t)n < len;
}

bool ldap_options_filter(const LdapOptions *o, const char *user, char *buf, size_t len)
{
	static const char var[] = "$username";
	if (strpbrk(user, "*()\\/"))
		return false;
	if (!o->search_filter) {
		int n = snprintf(buf, len, "(%s=%s)", o->search_attr ? o->search_attr : "uid", user);
		return n >= 0 && (size_t)n < len;
	}
	size_t out = 0, ulen = strlen(user);
	for (const char *p = o->search_filter; *p;) {
		const char *piece = p;
		size_t plen = 1;
		if (strncmp(p, var, sizeof(var) - 1) == 0) {
			piece = user;
			plen = ulen;
			p += sizeof(var) - 1;
		} else {
			p++;
		}
		if (out + plen >= len)
			return false;
		memcpy(buf + out, piece, plen);
		out += plen;
	}
	buf[out] = '\0';
	return true;
}

int ldap_options_port(const LdapOptions *o)
{
	return o->port ? o->port : o->ldaps ? 636 : 389;
}

bool ldap_options_server_url(const LdapOptions *o, int i, char *buf, size_t len)
{
	const char *host = o->servers[i];
	bool v6 = strchr(host, ':') != NULL;
	int n = snprintf(buf, len, "%s://%s%s%s:%d", o->ldaps ? "ldaps" : "ldap", v6 ? "[" : "", host, v6 ? "]" : "",
	                 ldap_options_port(o));
	return n >= 0 && (size_t)n < len;
}
