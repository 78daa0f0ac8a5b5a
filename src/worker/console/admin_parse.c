/*
 * The admin console's command syntax; see include/worker/admin_parse.h.
 */
#include "autoconfig.h"

#include <ctype.h>
#include <strings.h>

#include "worker/admin_parse.h"

static const char *skip_space(const char *p)
{
	while (isspace((unsigned char)*p))
		p++;
	return p;
}

/* A quoted string ending at `quote` ("" or '' inside is one quote), the opening quote at *pp. */
static AdminParse read_quoted(const char **pp, char quote, char *out, size_t outlen)
{
	const char *p = *pp + 1;
	size_t n = 0;
	for (;;) {
		if (!*p)
			return ADMIN_PARSE_SYNTAX;
		if (*p == quote) {
			if (p[1] != quote) {
				p++;
				break;
			}
			p++;
		}
		if (n + 1 >= outlen)
			return ADMIN_PARSE_TOO_LONG;
		out[n++] = *p++;
	}
	out[n] = '\0';
	*pp = p;
	return ADMIN_PARSE_OK;
}

AdminParse admin_read_ident(const char **pp, char *out, size_t outlen)
{
	const char *p = skip_space(*pp);
	if (*p == '"') {
		AdminParse r = read_quoted(&p, '"', out, outlen);
		if (r == ADMIN_PARSE_OK)
			*pp = p;
		return r;
	}
	size_t n = 0;
	while (isalnum((unsigned char)*p) || *p == '_') {
		if (n + 1 >= outlen)
			return ADMIN_PARSE_TOO_LONG;
		out[n++] = *p++;
	}
	if (n == 0)
		return ADMIN_PARSE_SYNTAX;
	out[n] = '\0';
	*pp = p;
	return ADMIN_PARSE_OK;
}

bool admin_at_end(const char *p)
{
	p = skip_space(p);
	if (*p == ';')
		p++;
	return *skip_space(p) == '\0';
}

AdminParse admin_parse_arg(const char *p, char *arg, size_t arglen)
{
	arg[0] = '\0';
	if (admin_at_end(p))
		return ADMIN_PARSE_OK;
	AdminParse r = admin_read_ident(&p, arg, arglen);
	if (r != ADMIN_PARSE_OK)
		return r;
	return admin_at_end(p) && arg[0] ? ADMIN_PARSE_OK : ADMIN_PARSE_SYNTAX;
}

AdminParse admin_parse_set(const char *p, char *key, size_t keylen, char *val, size_t vallen)
{
	AdminParse r = admin_read_ident(&p, key, keylen);
	if (r != ADMIN_PARSE_OK)
		return r;
	p = skip_space(p);
	if (*p == '=')
		p++;
	else if (strncasecmp(p, "to", 2) == 0 && isspace((unsigned char)p[2]))
		p += 2;
	else
		return ADMIN_PARSE_SYNTAX;
	p = skip_space(p);
	r = *p == '\'' ? read_quoted(&p, '\'', val, vallen) : admin_read_ident(&p, val, vallen);
	if (r != ADMIN_PARSE_OK)
		return r;
	return admin_at_end(p) ? ADMIN_PARSE_OK : ADMIN_PARSE_SYNTAX;
}
