/*
 * The auth_hba_file and auth_ident_file: a tokenizer shared by both (fields,
 * quoting, comma lists, comments), the rule and map parsers, and the rule
 * matching that picks a client's authentication method when auth_type=hba.
 */
#include "autoconfig.h"

#include "common/hba.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/filesnap.h"
#include "common/ldap_options.h"
#include "common/util.h"

/* One word of a line; quoted words are never keywords. */
typedef struct Token {
	char *text;
	bool quoted; /* some part of it was inside "..." */
} Token;

/* A whitespace-separated column: one token, or a comma list of them. */
typedef struct Field {
	Token *tokens;
	int n;
} Field;

/* The columns of one line. */
typedef struct Line {
	Field *fields;
	int n;
} Line;

static bool is_blank(char c)
{
	return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
}

static void line_free(Line *l)
{
	for (int i = 0; i < l->n; i++) {
		for (int j = 0; j < l->fields[i].n; j++)
			free(l->fields[i].tokens[j].text);
		free(l->fields[i].tokens);
	}
	free(l->fields);
	l->fields = NULL;
	l->n = 0;
}

/*
 * Read one token at *pp, up to a blank, a comma or a `#` outside quotes.
 * Inside quotes `""` stands for one `"`. False on an unterminated quote.
 */
static bool read_token(const char **pp, const char *end, Token *t)
{
	const char *p = *pp;
	char *buf = xmalloc((size_t)(end - p) + 1);
	size_t len = 0;
	bool in_quotes = false;

	t->quoted = false;
	while (p < end) {
		char c = *p;
		if (in_quotes) {
			if (c == '"') {
				if (p + 1 < end && p[1] == '"') {
					buf[len++] = '"';
					p += 2;
					continue;
				}
				in_quotes = false;
				p++;
				continue;
			}
		} else {
			if (is_blank(c) || c == ',' || c == '#')
				break;
			if (c == '"') {
				in_quotes = true;
				t->quoted = true;
				p++;
				continue;
			}
		}
		buf[len++] = c;
		p++;
	}
	if (in_quotes) {
		free(buf);
		return false;
	}
	buf[len] = '\0';
	t->text = buf;
	*pp = p;
	return true;
}

/*
 * Split the line [p, end) into fields. A comma joins the next token (also
 * after blanks) to the same field. False with the reason in *why.
 */
static bool tokenize_line(const char *p, const char *end, Line *out, const char **why)
{
	out->fields = NULL;
	out->n = 0;
	for (;;) {
		while (p < end && is_blank(*p))
			p++;
		if (p == end || *p == '#')
			return true;
		out->fields = xrealloc(out->fields, sizeof(Field) * (size_t)(out->n + 1));
		Field *f = &out->fields[out->n++];
		f->tokens = NULL;
		f->n = 0;
		for (;;) {
			Token t;
			if (!read_token(&p, end, &t)) {
				*why = "unterminated quoted string";
				return false;
			}
			if (!t.quoted && t.text[0] == '\0') {
				free(t.text);
				*why = "empty item in a comma list";
				return false;
			}
			f->tokens = xrealloc(f->tokens, sizeof(Token) * (size_t)(f->n + 1));
			f->tokens[f->n++] = t;
			if (p == end || *p != ',')
				break;
			p++;
			while (p < end && is_blank(*p))
				p++;
			if (p == end || *p == '#') {
				*why = "comma list ends with a comma";
				return false;
			}
		}
	}
}

bool hba_split_words(const char *text, bool (*fn)(void *arg, const char *word), void *arg, const char **why)
{
	const char *end = text + strlen(text);
	Line l;
	*why = NULL;
	if (!tokenize_line(text, end, &l, why)) {
		line_free(&l);
		return false;
	}
	bool ok = true;
	for (int i = 0; i < l.n && ok; i++)
		for (int j = 0; j < l.fields[i].n && ok; j++)
			ok = fn(arg, l.fields[i].tokens[j].text);
	line_free(&l);
	return ok;
}

/* Call fn for every line of text, with 1-based line numbers. */
static void for_each_line(const char *text, void (*fn)(void *arg, int lineno, const char *p, const char *end),
                          void *arg)
{
	const char *p = text;
	int lineno = 0;
	while (*p) {
		const char *eol = strchr(p, '\n');
		const char *end = eol ? eol : p + strlen(p);
		fn(arg, ++lineno, p, end);
		p = eol ? eol + 1 : end;
	}
}

static void warn_line(HbaWarnFn warn, void *arg, const char *what, int lineno, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void warn_line(HbaWarnFn warn, void *arg, const char *what, int lineno, const char *fmt, ...)
{
	char why[512], msg[600];
	va_list ap;
	if (!warn)
		return;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	snprintf(msg, sizeof(msg), "could not parse %s config line %d: %s", what, lineno, why);
	warn(arg, msg);
}

/* ---- hba rules ---- */

static void names_add(HbaNames *n, const char *name)
{
	n->names = xrealloc(n->names, sizeof(char *) * (size_t)(n->n_names + 1));
	n->names[n->n_names++] = xstrdup(name);
}

static void names_free(HbaNames *n)
{
	for (int i = 0; i < n->n_names; i++)
		free(n->names[i]);
	free(n->names);
	n->names = NULL;
	n->n_names = 0;
}

static bool names_contain(const HbaNames *n, const char *name)
{
	for (int i = 0; i < n->n_names; i++) {
		if (strcmp(n->names[i], name) == 0)
			return true;
	}
	return false;
}

/* Collects the tokens of an @file. */
typedef struct IncludeCtx {
	HbaNames *names;
	bool ok;
} IncludeCtx;

static void include_line(void *arg, int lineno, const char *p, const char *end)
{
	IncludeCtx *ctx = arg;
	Line l;
	const char *why;
	(void)lineno;
	if (!ctx->ok)
		return;
	if (!tokenize_line(p, end, &l, &why)) {
		ctx->ok = false;
	} else {
		for (int i = 0; i < l.n; i++)
			for (int j = 0; j < l.fields[i].n; j++)
				names_add(ctx->names, l.fields[i].tokens[j].text);
	}
	line_free(&l);
}

/* Add the names of @file (relative to dir unless absolute); false with why in errbuf. */
static bool read_include(HbaNames *names, const char *file, const char *dir, char *errbuf, size_t errlen)
{
	char path[4096];
	if (!*file)
		return set_error(errbuf, errlen, "empty file name after @");
	if (file[0] == '/' || !dir || !*dir)
		snprintf(path, sizeof(path), "%s", file);
	else
		snprintf(path, sizeof(path), "%s/%s", dir, file);
	char *text = filesnap_read(path, NULL);
	if (!text)
		return set_error(errbuf, errlen, "could not open file %s: %s", path, strerror(errno));
	IncludeCtx ctx = {names, true};
	for_each_line(text, include_line, &ctx);
	free(text);
	if (!ctx.ok)
		return set_error(errbuf, errlen, "unterminated quoted string in file %s", path);
	return true;
}

/* The database (is_db) or user column. */
static bool parse_names(HbaNames *names, const Field *f, bool is_db, const char *dir, char *errbuf, size_t errlen)
{
	for (int i = 0; i < f->n; i++) {
		const Token *t = &f->tokens[i];
		if (t->quoted) {
			names_add(names, t->text);
		} else if (strcmp(t->text, "all") == 0) {
			names->all = true;
		} else if (is_db && strcmp(t->text, "sameuser") == 0) {
			names->sameuser = true;
		} else if (is_db && strcmp(t->text, "replication") == 0) {
			names->replication = true;
		} else if (is_db && (strcmp(t->text, "samerole") == 0 || strcmp(t->text, "samegroup") == 0)) {
			return set_error(errbuf, errlen, "unsupported database keyword \"%s\"", t->text);
		} else if (!is_db && t->text[0] == '+') {
			return set_error(errbuf, errlen, "group membership (\"%s\") is not supported", t->text);
		} else if (t->text[0] == '@') {
			if (!read_include(names, t->text + 1, dir, errbuf, errlen))
				return false;
		} else {
			names_add(names, t->text);
		}
	}
	return true;
}

/* A mask of `bits` leading one bits over `len` bytes. */
static void mask_from_len(uint8_t *mask, int len, int bits)
{
	memset(mask, 0, 16);
	for (int i = 0; i < len; i++) {
		int b = bits - 8 * i;
		mask[i] = b >= 8 ? 0xff : b <= 0 ? 0 : (uint8_t)(0xff << (8 - b));
	}
}

/* A numeric IPv4 or IPv6 address; returns the family or 0. */
static int parse_ip(const char *s, uint8_t *out)
{
	if (inet_pton(AF_INET, s, out) == 1)
		return AF_INET;
	if (inet_pton(AF_INET6, s, out) == 1)
		return AF_INET6;
	return 0;
}

/*
 * The address column: `all`, ADDR/LEN, or ADDR with the mask in the next
 * column (*used is set to the number of columns taken).
 */
static bool parse_address(HbaRule *r, const Line *l, int idx, int *used, char *errbuf, size_t errlen)
{
	const Field *f = &l->fields[idx];
	if (f->n != 1)
		return set_error(errbuf, errlen, "multiple values in the address column");
	const Token *t = &f->tokens[0];
	*used = 1;
	if (!t->quoted && strcmp(t->text, "all") == 0) {
		r->addr_all = true;
		return true;
	}
	if (!t->quoted && (strcmp(t->text, "samehost") == 0 || strcmp(t->text, "samenet") == 0))
		return set_error(errbuf, errlen, "address keyword \"%s\" is not supported", t->text);

	char addr[256];
	if (strlen(t->text) >= sizeof(addr))
		return set_error(errbuf, errlen, "invalid IP address \"%s\"", t->text);
	strcpy(addr, t->text);
	char *slash = strchr(addr, '/');
	if (slash)
		*slash = '\0';
	r->family = parse_ip(addr, r->addr);
	if (!r->family)
		return set_error(errbuf, errlen, "invalid IP address \"%s\" (host names are not supported)", addr);
	int alen = r->family == AF_INET ? 4 : 16;
	if (slash) {
		const char *d = slash + 1;
		int bits = 0;
		if (!*d)
			return set_error(errbuf, errlen, "invalid CIDR mask in address \"%s\"", t->text);
		for (; *d; d++) {
			if (*d < '0' || *d > '9' || bits > 128)
				return set_error(errbuf, errlen, "invalid CIDR mask in address \"%s\"", t->text);
			bits = bits * 10 + (*d - '0');
		}
		if (bits > 8 * alen)
			return set_error(errbuf, errlen, "invalid CIDR mask in address \"%s\"", t->text);
		mask_from_len(r->mask, alen, bits);
		return true;
	}
	/* no /len: the next column is the mask */
	if (idx + 1 >= l->n)
		return set_error(errbuf, errlen, "end-of-line before netmask");
	const Field *mf = &l->fields[idx + 1];
	if (mf->n != 1 || parse_ip(mf->tokens[0].text, r->mask) != r->family)
		return set_error(errbuf, errlen, "invalid IP mask \"%s\"", mf->tokens[0].text);
	*used = 2;
	return true;
}

static bool parse_method(HbaRule *r, const Field *f, char *errbuf, size_t errlen)
{
	static const struct {
		const char *name;
		int method;
	} methods[] = {
	    {"trust", AUTH_TRUST},
	    {"reject", AUTH_REJECT},
	    {"md5", AUTH_MD5},
	    {"password", AUTH_PLAIN},
	    {"peer", AUTH_PEER},
	    {"cert", AUTH_CERT},
	    {"scram-sha-256", AUTH_SCRAM_SHA_256},
#ifdef HAVE_LDAP
	    {"ldap", AUTH_LDAP},
#endif
#ifdef HAVE_PAM
	    {"pam", AUTH_PAM},
#endif
	};
	if (f->n != 1)
		return set_error(errbuf, errlen, "multiple values in the method column");
#ifndef HAVE_LDAP
	if (strcmp(f->tokens[0].text, "ldap") == 0)
		return set_error(
		    errbuf, errlen,
		    "authentication method \"ldap\" is not supported by this build (built without libldap)");
#endif
	for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
		if (strcmp(f->tokens[0].text, methods[i].name) == 0) {
			r->method = methods[i].method;
			return true;
		}
	}
	return set_error(errbuf, errlen, "unsupported authentication method \"%s\"", f->tokens[0].text);
}

#ifdef HAVE_LDAP
/* An ldap rule's options: every word to the end of the line, comma lists included (doc/ldap.md). */
static bool parse_ldap_options(HbaRule *r, const Line *l, int idx, char *errbuf, size_t errlen)
{
	LdapOptions o;
	ldap_options_init(&o);
	for (int i = idx; i < l->n; i++) {
		for (int j = 0; j < l->fields[i].n; j++) {
			if (!ldap_options_add(&o, l->fields[i].tokens[j].text, errbuf, errlen)) {
				ldap_options_free(&o);
				return false;
			}
		}
	}
	if (!ldap_options_check(&o, errbuf, errlen)) {
		ldap_options_free(&o);
		return false;
	}
	r->ldap = xmalloc(sizeof(*r->ldap));
	*r->ldap = o;
	return true;
}
#endif

/* Options after the method: map=NAME, or an ldap rule's LDAP options. */
static bool parse_options(HbaRule *r, const Line *l, int idx, char *errbuf, size_t errlen)
{
#ifdef HAVE_LDAP
	if (r->method == AUTH_LDAP)
		return parse_ldap_options(r, l, idx, errbuf, errlen);
#endif
	for (int i = idx; i < l->n; i++) {
		const Field *f = &l->fields[i];
		if (f->n != 1)
			return set_error(errbuf, errlen, "multiple values in an option");
		const char *opt = f->tokens[0].text;
		if (strncmp(opt, "map=", 4) != 0)
			return set_error(errbuf, errlen, "unsupported option \"%s\"", opt);
		if (!opt[4])
			return set_error(errbuf, errlen, "empty map name");
		free(r->map);
		r->map = xstrdup(opt + 4);
	}
	return true;
}

static void rule_free(HbaRule *r)
{
	names_free(&r->db);
	names_free(&r->user);
	free(r->map);
	r->map = NULL;
#ifdef HAVE_LDAP
	if (r->ldap) {
		ldap_options_free(r->ldap);
		free(r->ldap);
		r->ldap = NULL;
	}
#endif
}

static bool parse_rule(HbaRule *r, const Line *l, const char *dir, char *errbuf, size_t errlen)
{
	const Field *f = &l->fields[0];
	if (f->n != 1)
		return set_error(errbuf, errlen, "multiple values in the connection type column");
	const char *type = f->tokens[0].text;
	if (strcmp(type, "local") == 0)
		r->type = HBA_LOCAL;
	else if (strcmp(type, "host") == 0)
		r->type = HBA_HOST;
	else if (strcmp(type, "hostssl") == 0)
		r->type = HBA_HOSTSSL;
	else if (strcmp(type, "hostnossl") == 0)
		r->type = HBA_HOSTNOSSL;
	else
		return set_error(errbuf, errlen, "unsupported connection type \"%s\"", type);

	int need = r->type == HBA_LOCAL ? 4 : 5;
	if (l->n < need)
		return set_error(errbuf, errlen, "end-of-line before authentication method");
	if (!parse_names(&r->db, &l->fields[1], true, dir, errbuf, errlen) ||
	    !parse_names(&r->user, &l->fields[2], false, dir, errbuf, errlen))
		return false;
	int idx = 3;
	if (r->type == HBA_LOCAL) {
		r->addr_all = true;
	} else {
		int used;
		if (!parse_address(r, l, idx, &used, errbuf, errlen))
			return false;
		idx += used;
		if (idx >= l->n)
			return set_error(errbuf, errlen, "end-of-line before authentication method");
	}
	if (!parse_method(r, &l->fields[idx], errbuf, errlen))
		return false;
	return parse_options(r, l, idx + 1, errbuf, errlen);
}

/* State of one hba_parse() run. */
typedef struct HbaCtx {
	HbaRules *out;
	const char *dir;
	HbaWarnFn warn;
	void *warn_arg;
} HbaCtx;

static void hba_line(void *arg, int lineno, const char *p, const char *end)
{
	HbaCtx *ctx = arg;
	Line l;
	const char *why = NULL;
	char err[512] = "";

	if (!tokenize_line(p, end, &l, &why)) {
		warn_line(ctx->warn, ctx->warn_arg, "hba", lineno, "%s", why);
		line_free(&l);
		return;
	}
	if (l.n == 0) {
		line_free(&l);
		return;
	}
	HbaRule r;
	memset(&r, 0, sizeof(r));
	r.line = lineno;
	if (parse_rule(&r, &l, ctx->dir, err, sizeof(err))) {
		HbaRules *out = ctx->out;
		out->rules = xrealloc(out->rules, sizeof(HbaRule) * (size_t)(out->n_rules + 1));
		out->rules[out->n_rules++] = r;
	} else {
		warn_line(ctx->warn, ctx->warn_arg, "hba", lineno, "%s", err);
		rule_free(&r);
	}
	line_free(&l);
}

void hba_parse(HbaRules *out, const char *text, const char *dir, HbaWarnFn warn, void *warn_arg)
{
	HbaCtx ctx = {out, dir, warn, warn_arg};
	out->rules = NULL;
	out->n_rules = 0;
	for_each_line(text, hba_line, &ctx);
}

bool hba_load(HbaRules *out, const char *path, HbaWarnFn warn, void *warn_arg, char *err, size_t errlen)
{
	char *text = filesnap_read(path, NULL);
	out->rules = NULL;
	out->n_rules = 0;
	if (!text)
		return set_error(err, errlen, "could not open auth_hba_file %s: %s", path, strerror(errno));
	/* @files are relative to the directory of the hba file */
	char *dir = xstrdup(path);
	char *slash = strrchr(dir, '/');
	if (slash)
		*(slash == dir ? slash + 1 : slash) = '\0';
	else
		strcpy(dir, ".");
	hba_parse(out, text, dir, warn, warn_arg);
	free(dir);
	free(text);
	return true;
}

void hba_free(HbaRules *rules)
{
	for (int i = 0; i < rules->n_rules; i++)
		rule_free(&rules->rules[i]);
	free(rules->rules);
	rules->rules = NULL;
	rules->n_rules = 0;
}

static bool conn_type_matches(HbaConnType type, bool is_unix, bool is_tls)
{
	switch (type) {
	case HBA_LOCAL:
		return is_unix;
	case HBA_HOST:
		return !is_unix;
	case HBA_HOSTSSL:
		return !is_unix && is_tls;
	case HBA_HOSTNOSSL:
		return !is_unix && !is_tls;
	}
	return false;
}

static bool db_matches(const HbaNames *n, const char *dbname, const char *username, bool physical_replication)
{
	/* as in PostgreSQL: physical replication matches only the replication keyword */
	if (physical_replication)
		return n->replication;
	if (n->all || names_contain(n, dbname))
		return true;
	return n->sameuser && strcmp(dbname, username) == 0;
}

static bool addr_matches(const HbaRule *r, const struct sockaddr *remote)
{
	const uint8_t *a;
	int len;
	if (r->addr_all)
		return true;
	if (!remote)
		return false;
	if (remote->sa_family == AF_INET) {
		a = (const uint8_t *)&((const struct sockaddr_in *)remote)->sin_addr;
		len = 4;
	} else if (remote->sa_family == AF_INET6) {
		const struct in6_addr *a6 = &((const struct sockaddr_in6 *)remote)->sin6_addr;
		a = (const uint8_t *)a6;
		len = 16;
		/* an IPv4 client on a dual-stack socket arrives as ::ffff:a.b.c.d */
		if (r->family == AF_INET && IN6_IS_ADDR_V4MAPPED(a6)) {
			a += 12;
			len = 4;
		}
	} else {
		return false;
	}
	if ((len == 4) != (r->family == AF_INET))
		return false;
	for (int i = 0; i < len; i++) {
		if ((a[i] & r->mask[i]) != (r->addr[i] & r->mask[i]))
			return false;
	}
	return true;
}

const HbaRule *hba_match(const HbaRules *rules, bool is_unix, bool is_tls, const char *dbname, const char *username,
                         bool is_physical_replication, const struct sockaddr *remote)
{
	if (!rules)
		return NULL;
	for (int i = 0; i < rules->n_rules; i++) {
		const HbaRule *r = &rules->rules[i];
		if (!conn_type_matches(r->type, is_unix, is_tls))
			continue;
		if (!db_matches(&r->db, dbname, username, is_physical_replication))
			continue;
		if (!r->user.all && !names_contain(&r->user, username))
			continue;
		if (!is_unix && !addr_matches(r, remote))
			continue;
		return r;
	}
	return NULL;
}

bool hba_uses_cert(const HbaRules *rules)
{
	if (!rules)
		return false;
	for (int i = 0; i < rules->n_rules; i++) {
		if (rules->rules[i].method == AUTH_CERT)
			return true;
	}
	return false;
}

/* ---- ident maps ---- */

typedef struct IdentCtx {
	IdentMap *out;
	HbaWarnFn warn;
	void *warn_arg;
} IdentCtx;

static void ident_line(void *arg, int lineno, const char *p, const char *end)
{
	IdentCtx *ctx = arg;
	Line l;
	const char *why = NULL;

	if (!tokenize_line(p, end, &l, &why)) {
		warn_line(ctx->warn, ctx->warn_arg, "ident", lineno, "%s", why);
		goto out;
	}
	if (l.n == 0)
		goto out;
	if (l.n != 3) {
		warn_line(ctx->warn, ctx->warn_arg, "ident", lineno,
		          "expected \"map system-username database-username\", got %d columns", l.n);
		goto out;
	}
	for (int i = 0; i < 3; i++) {
		if (l.fields[i].n != 1) {
			warn_line(ctx->warn, ctx->warn_arg, "ident", lineno, "comma lists are not supported");
			goto out;
		}
	}
	const Token *sys = &l.fields[1].tokens[0], *dbu = &l.fields[2].tokens[0];
	if (!sys->quoted && sys->text[0] == '/') {
		warn_line(ctx->warn, ctx->warn_arg, "ident", lineno, "regular expressions are not supported");
		goto out;
	}
	if (!dbu->quoted && dbu->text[0] == '+') {
		warn_line(ctx->warn, ctx->warn_arg, "ident", lineno, "group membership is not supported");
		goto out;
	}
	IdentMap *m = ctx->out;
	m->entries = xrealloc(m->entries, sizeof(IdentEntry) * (size_t)(m->n_entries + 1));
	IdentEntry *e = &m->entries[m->n_entries++];
	e->map = xstrdup(l.fields[0].tokens[0].text);
	e->system_user = xstrdup(sys->text);
	e->db_user = !dbu->quoted && strcmp(dbu->text, "all") == 0 ? NULL : xstrdup(dbu->text);
out:
	line_free(&l);
}

void ident_parse(IdentMap *out, const char *text, HbaWarnFn warn, void *warn_arg)
{
	IdentCtx ctx = {out, warn, warn_arg};
	out->entries = NULL;
	out->n_entries = 0;
	for_each_line(text, ident_line, &ctx);
}

bool ident_load(IdentMap *out, const char *path, HbaWarnFn warn, void *warn_arg, char *err, size_t errlen)
{
	char *text = filesnap_read(path, NULL);
	out->entries = NULL;
	out->n_entries = 0;
	if (!text)
		return set_error(err, errlen, "could not open auth_ident_file %s: %s", path, strerror(errno));
	ident_parse(out, text, warn, warn_arg);
	free(text);
	return true;
}

void ident_free(IdentMap *map)
{
	for (int i = 0; i < map->n_entries; i++) {
		free(map->entries[i].map);
		free(map->entries[i].system_user);
		free(map->entries[i].db_user);
	}
	free(map->entries);
	map->entries = NULL;
	map->n_entries = 0;
}

bool ident_map_allows(const IdentMap *map, const char *map_name, const char *system_name, const char *db_user)
{
	if (!map || !map_name || !system_name || !db_user)
		return false;
	for (int i = 0; i < map->n_entries; i++) {
		const IdentEntry *e = &map->entries[i];
		if (strcmp(e->map, map_name) == 0 && strcmp(e->system_user, system_name) == 0 &&
		    (!e->db_user || strcmp(e->db_user, db_user) == 0))
			return true;
	}
	return false;
}

bool hba_config_uses_cert(const CfGlobals *g)
{
	HbaRules rules;
	char err[256];
	if (g->auth_type != AUTH_HBA || !g->auth_hba_file || !*g->auth_hba_file)
		return false;
	if (!hba_load(&rules, g->auth_hba_file, NULL, NULL, err, sizeof(err)))
		return false;
	bool uses = hba_uses_cert(&rules);
	hba_free(&rules);
	return uses;
}
