/*
 * auth_query messages: the extended-protocol request, the reading of the
 * RowDescription/DataRow that answer it, and the set-up hint logged when it
 * fails. Pure code, unit-tested in test/unit/test_auth_query.c.
 */
#include "autoconfig.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/auth_query_msg.h"

#define TEXT_OID 25

void authq_write_request(PktBuf *pb, const char *query, const char *login)
{
	size_t llen = strlen(login);

	pktbuf_start_msg(pb, 'P');
	pktbuf_put_string(pb, ""); /* unnamed statement */
	pktbuf_put_string(pb, query);
	pktbuf_put_u16(pb, 1);
	pktbuf_put_u32(pb, TEXT_OID);
	pktbuf_finish_msg(pb);

	pktbuf_start_msg(pb, 'B');
	pktbuf_put_string(pb, ""); /* unnamed portal */
	pktbuf_put_string(pb, ""); /* of the unnamed statement */
	pktbuf_put_u16(pb, 0);     /* parameter formats: all text */
	pktbuf_put_u16(pb, 1);
	pktbuf_put_u32(pb, (uint32_t)llen);
	pktbuf_put_bytes(pb, login, llen);
	pktbuf_put_u16(pb, 0); /* result formats: all text */
	pktbuf_finish_msg(pb);

	pktbuf_start_msg(pb, 'D');
	pktbuf_put_u8(pb, 'P');
	pktbuf_put_string(pb, "");
	pktbuf_finish_msg(pb);

	pktbuf_start_msg(pb, 'E');
	pktbuf_put_string(pb, "");
	pktbuf_put_u32(pb, 0); /* no row limit */
	pktbuf_finish_msg(pb);

	pktbuf_start_msg(pb, 'S');
	pktbuf_finish_msg(pb);
}

int authq_row_columns(const uint8_t *body, uint32_t len)
{
	PktReader r;
	uint16_t n;
	pktreader_init(&r, body, len);
	if (!pktreader_get_u16(&r, &n))
		return -1;
	return n;
}

/* One column value of a DataRow: NULL pointer for SQL NULL. */
static bool get_value(PktReader *r, const uint8_t **val, uint32_t *vlen)
{
	uint32_t l;
	if (!pktreader_get_u32(r, &l))
		return false;
	if (l == 0xffffffffu) {
		*val = NULL;
		*vlen = 0;
		return true;
	}
	*vlen = l;
	return pktreader_get_bytes(r, l, val);
}

AuthqRow authq_parse_row(const uint8_t *body, uint32_t len, size_t max_secret, char **secret, char *err, size_t errlen)
{
	PktReader r;
	uint16_t n;
	const uint8_t *name, *pw;
	uint32_t name_len, pw_len;

	*secret = NULL;
	pktreader_init(&r, body, len);
	if (!pktreader_get_u16(&r, &n) || n != 2) {
		snprintf(err, errlen, "auth_query must return 2 columns (user name, password)");
		return AUTHQ_ROW_BAD;
	}
	if (!get_value(&r, &name, &name_len) || !get_value(&r, &pw, &pw_len) || pktreader_remaining(&r) != 0) {
		snprintf(err, errlen, "malformed DataRow from server");
		return AUTHQ_ROW_BAD;
	}
	if (!pw)
		return AUTHQ_ROW_NULL;
	if (pw_len > max_secret) {
		snprintf(err, errlen, "auth_query returned a password of %u bytes (at most %zu are allowed)", pw_len,
		         max_secret);
		return AUTHQ_ROW_BAD;
	}
	if (memchr(pw, '\0', pw_len)) {
		snprintf(err, errlen, "auth_query returned a password with a NUL byte");
		return AUTHQ_ROW_BAD;
	}
	*secret = malloc(pw_len + 1);
	if (!*secret) {
		snprintf(err, errlen, "out of memory");
		return AUTHQ_ROW_BAD;
	}
	memcpy(*secret, pw, pw_len);
	(*secret)[pw_len] = '\0';
	return AUTHQ_ROW_SECRET;
}

void authq_quote_ident(const char *name, char *buf, size_t len)
{
	bool plain = *name && !(*name >= '0' && *name <= '9') && *name != '$';
	for (const char *p = name; *p && plain; p++)
		plain = (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_' || *p == '$';
	if (plain) {
		snprintf(buf, len, "%s", name);
		return;
	}
	size_t n = 0;
	if (len < 3) {
		if (len > 0)
			buf[0] = '\0';
		return;
	}
	buf[n++] = '"';
	for (const char *p = name; *p && n + 3 < len; p++) {
		if (*p == '"')
			buf[n++] = '"';
		buf[n++] = *p;
	}
	buf[n++] = '"';
	buf[n] = '\0';
}

/* If msg is "<prefix><name>", the name (up to the end of the message). */
static const char *after(const char *msg, const char *prefix)
{
	size_t l = strlen(prefix);
	return strncmp(msg, prefix, l) == 0 && msg[l] ? msg + l : NULL;
}

/*
 * The qualified name under which `query` calls function `fn` ("s.fn(" or
 * "\"s\".fn("), copied to buf; "" when the call is not schema-qualified.
 */
static void function_in_query(const char *query, const char *fn, char *buf, size_t len)
{
	size_t fl = strlen(fn);
	buf[0] = '\0';
	for (const char *p = query ? strstr(query, fn) : NULL; p; p = strstr(p + 1, fn)) {
		const char *end = p + fl;
		while (*end == ' ')
			end++;
		if (*end != '(' || p == query || p[-1] != '.')
			continue;
		const char *start = p - 1;
		if (start > query && start[-1] == '"') {
			/* a quoted schema name: back to its opening quote */
			start--;
			while (start > query && start[-1] != '"')
				start--;
			if (start == query)
				continue;
			start--;
		} else {
			while (start > query &&
			       (start[-1] == '_' || start[-1] == '$' || (start[-1] >= 'a' && start[-1] <= 'z') ||
			        (start[-1] >= 'A' && start[-1] <= 'Z') || (start[-1] >= '0' && start[-1] <= '9')))
				start--;
		}
		if (start == p - 1)
			continue;
		snprintf(buf, len, "%.*s", (int)(p + fl - start), start);
		return;
	}
}

const char *authq_error_hint(const char *sqlstate, const char *msg, const char *auth_user, const char *auth_db,
                             const char *query, char *buf, size_t len)
{
	char user[300], obj[300], fix[400];
	const char *name;

	buf[0] = '\0';
	if (!sqlstate || !msg)
		return buf;
	snprintf(fix, sizeof(fix),
	         "run " AUTHQ_SETUP_COMMAND
	         " for database %s, which makes every grant auth_query needs, or " AUTHQ_SETUP_COMMAND
	         " --check to list what is missing",
	         auth_db);
	authq_quote_ident(auth_user, user, sizeof(user));
	if (strcmp(sqlstate, "42501") == 0) {
		if ((name = after(msg, "permission denied for schema "))) {
			authq_quote_ident(name, obj, sizeof(obj));
			snprintf(
			    buf, len,
			    "missing grant: USAGE on schema %s for the auth_user %s (GRANT USAGE ON SCHEMA %s TO %s;); "
			    "fix: %s",
			    name, auth_user, obj, user, fix);
		} else if ((name = after(msg, "permission denied for function "))) {
			function_in_query(query, name, obj, sizeof(obj));
			snprintf(
			    buf, len,
			    "missing grant: EXECUTE on function %s for the auth_user %s (GRANT EXECUTE ON FUNCTION "
			    "%s(text) TO %s;); fix: %s",
			    obj[0] ? obj : name, auth_user, obj[0] ? obj : name, user, fix);
		} else if ((name = after(msg, "permission denied for table ")) ||
		           (name = after(msg, "permission denied for relation ")) ||
		           (name = after(msg, "permission denied for view "))) {
			if (strcmp(name, "pg_authid") == 0)
				snprintf(
				    buf, len,
				    "only superusers can read pg_authid: the auth_user %s must go through a SECURITY "
				    "DEFINER lookup function owned by a superuser; fix: run " AUTHQ_SETUP_COMMAND
				    ", which creates it with its grants and prints the auth_query to use "
				    "(" AUTHQ_SETUP_COMMAND " --check lists what is missing)",
				    auth_user);
			else
				snprintf(buf, len, "missing grant: SELECT on %s for the auth_user %s; fix: %s", name,
				         auth_user, fix);
		} else if ((name = after(msg, "permission denied for database "))) {
			authq_quote_ident(name, obj, sizeof(obj));
			snprintf(
			    buf, len,
			    "missing grant: CONNECT on database %s for the auth_user %s (GRANT CONNECT ON DATABASE %s "
			    "TO %s;); fix: %s",
			    name, auth_user, obj, user, fix);
		} else {
			snprintf(buf, len, "the auth_user %s lacks a privilege; fix: %s", auth_user, fix);
		}
	} else if (strcmp(sqlstate, "3F000") == 0 || strcmp(sqlstate, "42883") == 0 || strcmp(sqlstate, "42P01") == 0) {
		/* invalid_schema_name, undefined_function, undefined_table */
		snprintf(
		    buf, len,
		    "the lookup that auth_query calls is not installed in database %s; fix: run " AUTHQ_SETUP_COMMAND
		    " for database %s, or set auth_dbname to a database that has it (" AUTHQ_SETUP_COMMAND
		    " --check lists what is missing)",
		    auth_db, auth_db);
	} else if (strcmp(sqlstate, "28P01") == 0) {
		snprintf(buf, len,
		         "the auth_file must hold the plain password of the auth_user %s, the one PostgreSQL has; "
		         "fix: correct it, or set a new one with " AUTHQ_SETUP_COMMAND " --password-file FILE",
		         auth_user);
	}
	return buf;
}
