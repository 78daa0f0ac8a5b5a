/*
 * pgbouncer-auth-setup: prepares PostgreSQL for auth_query. Creates the
 * auth_user role, a schema with a SECURITY DEFINER lookup function and every
 * grant pgbouncer needs (USAGE on the schema included), prints the settings
 * to paste, and with --check names each missing piece with the SQL that fixes it.
 */
#include "autoconfig.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#define PROGNAME "pgbouncer-auth-setup"

/* exit statuses (documented in doc/pgbouncer-auth-setup.1.md) */
#define EXIT_ALL_OK  0 /* set-up done / everything checked is in place */
#define EXIT_PROBLEM 1 /* something is missing or could not be fixed; the output says what */
#define EXIT_USAGE   2 /* bad arguments, no connection, not a superuser, server too old */

#define NAME_MAX_BYTES     63    /* NAMEDATALEN - 1: longer names are truncated by PostgreSQL */
#define PASSWORD_MAX_BYTES 65535 /* longest password an auth_file line may hold (USERLIST_MAX_SECRET) */
#define RANDOM_PW_BYTES    24    /* 192 bits, 32 characters once encoded */
#define MIN_SERVER_VERSION 100000

/* the fixed search_path of the lookup function, as written and as stored in pg_proc.proconfig */
#define FN_SEARCH_PATH     "pg_catalog, pg_temp"
#define FN_PROCONFIG_ENTRY "search_path=" FN_SEARCH_PATH
#define FN_RESULT          "TABLE(usename name, passwd text)"
#define FN_ARGUMENTS       "p_usename text"

typedef struct Options {
	const char *conninfo;   /* superuser conninfo or URI */
	char **dbnames;         /* target databases; none = the conninfo's own */
	int n_dbnames;          /* entries in dbnames */
	const char *user;       /* the auth_user role */
	const char *schema;     /* schema holding the lookup function */
	const char *function;   /* name of the lookup function */
	char *password;         /* auth_user password: given, read, generated, or NULL */
	bool password_given;    /* --password or --password-file was used */
	bool password_made;     /* password was generated for a new role */
	const char *probe_user; /* role to look up as auth_user at the end */
	bool check;             /* --check: report only, change nothing */
	bool quiet;             /* fewer messages (see usage) */
} Options;

/*
 * SQL spellings of the names, quoted by the server (quote_ident knows its
 * keywords) once per run, and the statements built from them.
 */
typedef struct Names {
	char *user;       /* quoted auth_user */
	char *user_lit;   /* auth_user as a string literal */
	char *schema;     /* quoted schema */
	char *function;   /* quoted function name */
	char *fn_sig;     /* schema.function(text), for GRANT/ALTER/DROP */
	char *fn_body;    /* the function body (SQL) */
	char *fn_create;  /* the whole CREATE OR REPLACE FUNCTION statement */
	char *auth_query; /* the auth_query pgbouncer runs */
	char *bootstrap;  /* quoted name of the bootstrap superuser, for OWNER TO fixes */
} Names;

/* What --check (and the verification after a set-up) found. */
typedef struct Report {
	FILE *out;    /* where lines go */
	bool show_ok; /* print OK lines too */
	int checked;  /* items looked at */
	int problems; /* items missing */
} Report;

/* What is known about the auth_user role, cluster-wide. */
typedef struct RoleState {
	bool exists;    /* pg_roles has it */
	bool can_login; /* rolcanlogin */
	bool superuser; /* rolsuper */
	bool no_conn;   /* rolconnlimit = 0: PostgreSQL refuses every login */
} RoleState;

static Options opt = {
    .user = "pgbouncer_auth",
    .schema = "pgbouncer",
    .function = "get_auth",
};
static Names names;

/* ---------------------------------------------------------------------------
 * messages and memory
 */

static void __attribute__((format(printf, 1, 2))) errorf(const char *fmt, ...)
{
	va_list ap;
	fputs(PROGNAME ": ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* Progress for a set-up run; --quiet silences it. */
static void __attribute__((format(printf, 1, 2))) notef(const char *fmt, ...)
{
	va_list ap;
	if (opt.quiet)
		return;
	fputs(PROGNAME ": ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static void out_of_memory(void)
{
	errorf("out of memory");
	exit(EXIT_USAGE);
}

static char *xstrdup(const char *s)
{
	char *copy = strdup(s);
	if (!copy)
		out_of_memory();
	return copy;
}

static char *__attribute__((format(printf, 1, 2))) xasprintf(const char *fmt, ...)
{
	va_list ap;
	char *s;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&s, fmt, ap);
	va_end(ap);
	if (n < 0)
		out_of_memory();
	return s;
}

/* Strips trailing CR/LF in place. */
static void chomp(char *s)
{
	size_t n = strlen(s);
	while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r'))
		s[--n] = '\0';
}

static bool has_control_chars(const char *s)
{
	for (; *s; s++) {
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			return true;
	}
	return false;
}

/* Collapses whitespace runs to one space and trims, so bodies compare by content. */
static char *squeeze_space(const char *s)
{
	char *r = xstrdup(s), *w = r;
	bool space = true; /* drops leading space */

	for (; *s; s++) {
		if (isspace((unsigned char)*s)) {
			if (!space)
				*w++ = ' ';
			space = true;
		} else {
			*w++ = *s;
			space = false;
		}
	}
	if (w > r && w[-1] == ' ')
		w--;
	*w = '\0';
	return r;
}

/* ---------------------------------------------------------------------------
 * options
 */

static void usage(FILE *f)
{
	fprintf(f, "Usage: " PROGNAME " [OPTION]... CONNINFO [DBNAME]...\n"
	           "\n"
	           "Prepares PostgreSQL for pgbouncer's auth_query: creates the auth_user login\n"
	           "role and, in each DBNAME, a schema with a SECURITY DEFINER lookup function\n"
	           "and the grants it needs. Prints the auth_user, auth_query and userlist.txt\n"
	           "lines to use. Running it again changes nothing that is already right.\n"
	           "\n"
	           "CONNINFO is a libpq connection string or URI for a superuser. Without DBNAME\n"
	           "the database of CONNINFO is prepared.\n"
	           "\n"
	           "Options:\n"
	           "  -U, --user=NAME           auth_user role (default: pgbouncer_auth)\n"
	           "  -p, --password=PW         password for a new role, or new password for an\n"
	           "                            existing one (default: generate for a new role,\n"
	           "                            keep an existing role's password)\n"
	           "  -f, --password-file=FILE  read the password from the first line of FILE\n"
	           "                            (- for standard input)\n"
	           "  -s, --schema=NAME         schema for the lookup function (default: pgbouncer)\n"
	           "  -F, --function=NAME       lookup function name (default: get_auth)\n"
	           "  -c, --check               change nothing: report each piece as OK or MISSING\n"
	           "                            with the SQL statement that fixes it\n"
	           "  -P, --probe-user=NAME     finally log in as the auth_user (needs the password)\n"
	           "                            and run auth_query for the login role NAME\n"
	           "  -q, --quiet               no progress messages; with --check, no OK lines\n"
	           "  -h, --help                show this help and exit\n"
	           "  -V, --version             show the version and exit\n"
	           "\n"
	           "Exit status: 0 all done or all OK, 1 something is missing or failed (see the\n"
	           "messages), 2 bad usage, no connection, or not a superuser.\n");
}

static char *read_password_file(const char *path)
{
	FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
	char *line = NULL;
	size_t cap = 0;

	if (!f) {
		errorf("cannot open password file \"%s\": %s", path, strerror(errno));
		exit(EXIT_USAGE);
	}
	if (getline(&line, &cap, f) < 0) {
		errorf("password file \"%s\" is empty", path);
		exit(EXIT_USAGE);
	}
	if (f != stdin)
		fclose(f);
	chomp(line);
	return line;
}

/*
 * Whether the auth_file would take this for a stored secret (an md5 hash,
 * or what may be a SCRAM secret) rather than for a plain password:
 * pgbouncer could then not log in with it.
 */
static bool looks_like_secret(const char *pw)
{
	if (strncmp(pw, "SCRAM-SHA-256$", strlen("SCRAM-SHA-256$")) == 0)
		return true;
	if (strncmp(pw, "md5", 3) != 0 || strlen(pw) != 3 + 32)
		return false;
	for (pw += 3; *pw; pw++) {
		if (!isdigit((unsigned char)*pw) && (*pw < 'a' || *pw > 'f'))
			return false;
	}
	return true;
}

static void check_name(const char *what, const char *name)
{
	if (name[0] == '\0' || strlen(name) > NAME_MAX_BYTES || has_control_chars(name)) {
		errorf("invalid %s \"%s\": a name must have 1 to %d bytes and no control characters", what, name,
		       NAME_MAX_BYTES);
		exit(EXIT_USAGE);
	}
}

static void parse_options(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"user", required_argument, NULL, 'U'},
	    {"password", required_argument, NULL, 'p'},
	    {"password-file", required_argument, NULL, 'f'},
	    {"schema", required_argument, NULL, 's'},
	    {"function", required_argument, NULL, 'F'},
	    {"check", no_argument, NULL, 'c'},
	    {"probe-user", required_argument, NULL, 'P'},
	    {"quiet", no_argument, NULL, 'q'},
	    {"help", no_argument, NULL, 'h'},
	    {"version", no_argument, NULL, 'V'},
	    {NULL, 0, NULL, 0},
	};
	const char *password_file = NULL;
	int c;

	while ((c = getopt_long(argc, argv, "U:p:f:s:F:cP:qhV", longopts, NULL)) != -1) {
		switch (c) {
		case 'U':
			opt.user = optarg;
			break;
		case 'p':
			opt.password = xstrdup(optarg);
			/* out of sight of ps(1) from now on (it was visible until here) */
			memset(optarg, 'x', strlen(optarg));
			break;
		case 'f':
			password_file = optarg;
			break;
		case 's':
			opt.schema = optarg;
			break;
		case 'F':
			opt.function = optarg;
			break;
		case 'c':
			opt.check = true;
			break;
		case 'P':
			opt.probe_user = optarg;
			break;
		case 'q':
			opt.quiet = true;
			break;
		case 'h':
			usage(stdout);
			exit(EXIT_ALL_OK);
		case 'V':
			printf("%s (pgbouncer) %s\nlibpq %d\n", PROGNAME, PACKAGE_VERSION, PQlibVersion());
			exit(EXIT_ALL_OK);
		default:
			fprintf(stderr, "Try \"%s --help\" for more information.\n", PROGNAME);
			exit(EXIT_USAGE);
		}
	}
	if (optind >= argc) {
		errorf("no CONNINFO given");
		fprintf(stderr, "Try \"%s --help\" for more information.\n", PROGNAME);
		exit(EXIT_USAGE);
	}
	opt.conninfo = argv[optind++];
	opt.dbnames = argv + optind;
	opt.n_dbnames = argc - optind;

	if (opt.password && password_file) {
		errorf("--password and --password-file exclude each other");
		exit(EXIT_USAGE);
	}
	if (password_file)
		opt.password = read_password_file(password_file);
	if (opt.password) {
		opt.password_given = true;
		if (opt.password[0] == '\0' || strlen(opt.password) > PASSWORD_MAX_BYTES ||
		    has_control_chars(opt.password)) {
			errorf("invalid password: it must have 1 to %d bytes and no control characters",
			       PASSWORD_MAX_BYTES);
			exit(EXIT_USAGE);
		}
		if (looks_like_secret(opt.password)) {
			errorf("invalid password: the auth_file would read it as a secret (an md5 hash or a SCRAM "
			       "secret), not as the plain password pgbouncer logs in with; choose another");
			exit(EXIT_USAGE);
		}
	}
	check_name("role name", opt.user);
	/* the printed "auth_user = NAME" line: pgbouncer.ini trims the blanks around a value */
	if (opt.user[0] == ' ' || opt.user[strlen(opt.user) - 1] == ' ') {
		errorf("invalid role name \"%s\": pgbouncer.ini cannot hold a role name that begins or ends with a "
		       "space (auth_user = ...)",
		       opt.user);
		exit(EXIT_USAGE);
	}
	check_name("schema name", opt.schema);
	check_name("function name", opt.function);
	if (opt.probe_user)
		check_name("probe user name", opt.probe_user);
	/* a dedicated schema: set-up revokes CREATE from PUBLIC on it */
	if (strcmp(opt.schema, "public") == 0 || strcmp(opt.schema, "information_schema") == 0 ||
	    strncmp(opt.schema, "pg_", 3) == 0) {
		errorf("schema \"%s\" is not allowed: use a schema of its own for the lookup function", opt.schema);
		exit(EXIT_USAGE);
	}
	if (opt.probe_user && !opt.password_given && opt.check) {
		errorf("--probe-user needs the auth_user's password (--password or --password-file)");
		exit(EXIT_USAGE);
	}
}

/* 24 random bytes in URL-safe base64 without padding: 32 characters that need no quoting anywhere. */
static char *generate_password(void)
{
	unsigned char raw[RANDOM_PW_BYTES];
	char *text = malloc(4 * ((RANDOM_PW_BYTES + 2) / 3) + 1);
	char *p;

	if (!text)
		out_of_memory();
	if (RAND_bytes(raw, sizeof(raw)) != 1) {
		errorf("RAND_bytes() failed: cannot generate a password");
		exit(EXIT_USAGE);
	}
	EVP_EncodeBlock((unsigned char *)text, raw, sizeof(raw));
	for (p = text; *p; p++) {
		if (*p == '+')
			*p = '-';
		else if (*p == '/')
			*p = '_';
		else if (*p == '=')
			*p = '\0';
	}
	return text;
}

/* ---------------------------------------------------------------------------
 * libpq
 */

static void ignore_notice(void *arg, const char *message)
{
}

/*
 * Connects with the user's conninfo, overriding the database (when dbname is
 * not NULL) and the login (when user is not NULL). Later keywords override
 * earlier ones, so the conninfo cannot undo the overrides.
 */
static PGconn *db_connect(const char *dbname, const char *user, const char *password)
{
	const char *keys[6], *vals[6];
	int n = 0;
	PGconn *conn;

	keys[n] = "fallback_application_name", vals[n++] = PROGNAME;
	keys[n] = "dbname", vals[n++] = opt.conninfo;
	if (dbname)
		keys[n] = "dbname", vals[n++] = dbname;
	if (user)
		keys[n] = "user", vals[n++] = user;
	if (password)
		keys[n] = "password", vals[n++] = password;
	keys[n] = NULL, vals[n] = NULL;

	conn = PQconnectdbParams(keys, vals, 1);
	if (!conn)
		out_of_memory();
	if (PQstatus(conn) != CONNECTION_OK) {
		char *msg = xstrdup(PQerrorMessage(conn));
		chomp(msg);
		if (user)
			errorf("cannot connect to database \"%s\" as \"%s\": %s", dbname, user, msg);
		else if (dbname)
			errorf("cannot connect to database \"%s\": %s", dbname, msg);
		else
			errorf("cannot connect with CONNINFO: %s", msg);
		free(msg);
		PQfinish(conn);
		return NULL;
	}
	PQsetNoticeProcessor(conn, ignore_notice, NULL);
	return conn;
}

/* Prints a failed statement's error, naming the database and the first line of the statement. */
static void report_sql_error(PGconn *conn, PGresult *res, const char *sql)
{
	const char *nl = strchr(sql, '\n');
	char *msg = xstrdup(res ? PQresultErrorMessage(res) : PQerrorMessage(conn));
	chomp(msg);
	errorf("database \"%s\": %.*s%s failed: %s", PQdb(conn), nl ? (int)(nl - sql) : (int)strlen(sql), sql,
	       nl ? " ..." : "", msg);
	free(msg);
}

/* Runs a query (with text parameters); returns its rows, or NULL after reporting the error. */
static PGresult *db_query(PGconn *conn, const char *sql, int nparams, const char *const *params)
{
	PGresult *res = PQexecParams(conn, sql, nparams, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		report_sql_error(conn, res, sql);
		PQclear(res);
		return NULL;
	}
	return res;
}

/* Runs one statement without a result. */
static bool db_exec(PGconn *conn, const char *sql)
{
	PGresult *res = PQexec(conn, sql);
	bool ok = PQresultStatus(res) == PGRES_COMMAND_OK || PQresultStatus(res) == PGRES_TUPLES_OK;
	if (!ok)
		report_sql_error(conn, res, sql);
	PQclear(res);
	return ok;
}

static bool is_true(const PGresult *res, int row, int col)
{
	return !PQgetisnull(res, row, col) && strcmp(PQgetvalue(res, row, col), "t") == 0;
}

static char *escape_literal(PGconn *conn, const char *s)
{
	char *lit = PQescapeLiteral(conn, s, strlen(s));
	char *copy;
	if (!lit) {
		errorf("cannot quote \"%s\": %s", s, PQerrorMessage(conn));
		exit(EXIT_USAGE);
	}
	copy = xstrdup(lit);
	PQfreemem(lit);
	return copy;
}

/*
 * Every connection: pins search_path so no object of another role can stand
 * in for a catalog one, checks the server version and, unless only checking,
 * that the login is a superuser.
 */
static bool session_prepare(PGconn *conn, bool need_superuser)
{
	PGresult *res;
	bool super;

	if (PQserverVersion(conn) < MIN_SERVER_VERSION) {
		errorf("database \"%s\": PostgreSQL %d is too old: version 10 or later is needed (SCRAM)", PQdb(conn),
		       PQserverVersion(conn));
		return false;
	}
	res = db_query(conn, "SELECT pg_catalog.set_config('search_path', '" FN_SEARCH_PATH "', false)", 0, NULL);
	if (!res)
		return false;
	PQclear(res);
	res = db_query(conn, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user", 0, NULL);
	if (!res)
		return false;
	super = PQntuples(res) == 1 && is_true(res, 0, 0);
	PQclear(res);
	if (need_superuser && !super) {
		errorf("role \"%s\" is not a superuser: connect as a superuser to create the role, the "
		       "SECURITY DEFINER function reading pg_authid and the grants",
		       PQuser(conn));
		return false;
	}
	return true;
}

/* ---------------------------------------------------------------------------
 * names and statements
 */

/* The lookup: the secret of a login role, never of a superuser or of the auth_user itself. */
static char *build_body(const char *user_lit)
{
	return xasprintf("\n"
	                 "SELECT a.rolname,\n"
	                 "       CASE WHEN a.rolvaliduntil < now() THEN NULL ELSE a.rolpassword END\n"
	                 "  FROM pg_authid a\n"
	                 " WHERE a.rolname = p_usename\n"
	                 "   AND a.rolcanlogin\n"
	                 "   AND NOT a.rolsuper\n"
	                 "   AND a.rolname <> %s\n",
	                 user_lit);
}

/* $fn$ unless the body holds it: then $fn1$, $fn2$, ... */
static char *dollar_tag(const char *body)
{
	char *tag = xstrdup("$fn$");
	for (int i = 1; strstr(body, tag); i++) {
		free(tag);
		tag = xasprintf("$fn%d$", i);
	}
	return tag;
}

static bool names_load(PGconn *conn)
{
	const char *params[3] = {opt.user, opt.schema, opt.function};
	PGresult *res;
	char *tag;

	res = db_query(conn,
	               "SELECT quote_ident($1), quote_ident($2), quote_ident($3),"
	               " (SELECT quote_ident(rolname) FROM pg_roles WHERE oid = 10)",
	               3, params);
	if (!res)
		return false;
	names.user = xstrdup(PQgetvalue(res, 0, 0));
	names.schema = xstrdup(PQgetvalue(res, 0, 1));
	names.function = xstrdup(PQgetvalue(res, 0, 2));
	names.bootstrap = xstrdup(PQgetvalue(res, 0, 3));
	PQclear(res);

	names.user_lit = escape_literal(conn, opt.user);
	names.fn_sig = xasprintf("%s.%s(text)", names.schema, names.function);
	names.auth_query = xasprintf("SELECT usename, passwd FROM %s.%s($1)", names.schema, names.function);
	names.fn_body = build_body(names.user_lit);
	tag = dollar_tag(names.fn_body);
	names.fn_create = xasprintf("CREATE OR REPLACE FUNCTION %s.%s(p_usename text)\n"
	                            "RETURNS TABLE (usename name, passwd text)\n"
	                            "LANGUAGE sql STABLE SECURITY DEFINER\n"
	                            "SET search_path = " FN_SEARCH_PATH "\n"
	                            "AS %s%s%s",
	                            names.schema, names.function, tag, names.fn_body, tag);
	free(tag);
	return true;
}

/* Whether a function body (pg_proc.prosrc) is the expected lookup, whatever its layout. */
static bool same_body(const char *prosrc)
{
	char *have = squeeze_space(prosrc);
	char *want = squeeze_space(names.fn_body);
	bool same = strcmp(have, want) == 0;
	free(have);
	free(want);
	return same;
}

/* ---------------------------------------------------------------------------
 * checks: shared by --check and the verification after a set-up
 */

static void report_ok(Report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void report_missing(Report *r, const char *fix, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void report_ok(Report *r, const char *fmt, ...)
{
	va_list ap;
	r->checked++;
	if (!r->show_ok)
		return;
	fputs("  OK       ", r->out);
	va_start(ap, fmt);
	vfprintf(r->out, fmt, ap);
	va_end(ap);
	fputc('\n', r->out);
}

/* One missing piece and the statement(s) that fix it; a multi-line fix stays aligned. */
static void report_missing(Report *r, const char *fix, const char *fmt, ...)
{
	va_list ap;
	r->checked++;
	r->problems++;
	fputs("  MISSING  ", r->out);
	va_start(ap, fmt);
	vfprintf(r->out, fmt, ap);
	va_end(ap);
	fputc('\n', r->out);
	if (fix) {
		const char *line = fix;
		fputs("           fix: ", r->out);
		for (;;) {
			const char *nl = strchr(line, '\n');
			if (!nl) {
				fprintf(r->out, "%s\n", line);
				break;
			}
			fprintf(r->out, "%.*s\n                ", (int)(nl - line), line);
			line = nl + 1;
		}
	}
}

static void report_skip(Report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void report_skip(Report *r, const char *fmt, ...)
{
	va_list ap;
	if (!r->show_ok)
		return;
	fputs("  SKIP     ", r->out);
	va_start(ap, fmt);
	vfprintf(r->out, fmt, ap);
	va_end(ap);
	fputc('\n', r->out);
}

static bool role_load(PGconn *conn, RoleState *role)
{
	const char *params[1] = {opt.user};
	PGresult *res = db_query(
	    conn, "SELECT rolcanlogin, rolsuper, rolconnlimit = 0 FROM pg_roles WHERE rolname = $1", 1, params);
	if (!res)
		return false;
	memset(role, 0, sizeof(*role));
	role->exists = PQntuples(res) == 1;
	if (role->exists) {
		role->can_login = is_true(res, 0, 0);
		role->superuser = is_true(res, 0, 1);
		role->no_conn = is_true(res, 0, 2);
	}
	PQclear(res);
	return true;
}

/* Each grantee (quoted) in the rows of res as one missing REVOKE: "<revoke> FROM who;" */
static void report_extra_grantees(Report *r, PGresult *res, const char *revoke, const char *what)
{
	for (int i = 0; i < PQntuples(res); i++) {
		const char *who = PQgetvalue(res, i, 0);
		char *fix = xasprintf("%s FROM %s;", revoke, who);
		report_missing(r, fix, "%s from %s", what, who);
		free(fix);
	}
}

/* The cluster-wide part: the auth_user role. */
static bool check_role(PGconn *conn, Report *r, RoleState *role)
{
	const char *params[1] = {opt.user};
	PGresult *res;
	char *fix;

	if (!role_load(conn, role))
		return false;
	if (!role->exists) {
		fix = xasprintf("CREATE ROLE %s LOGIN;\n\\password %s   -- in psql: stores a SCRAM secret", names.user,
		                names.user);
		report_missing(r, fix, "role %s", names.user);
		free(fix);
		return true;
	}
	report_ok(r, "role %s exists", names.user);

	if (role->can_login) {
		report_ok(r, "LOGIN for role %s", names.user);
	} else {
		fix = xasprintf("ALTER ROLE %s LOGIN;", names.user);
		report_missing(r, fix, "LOGIN for role %s", names.user);
		free(fix);
	}
	if (!role->no_conn) {
		report_ok(r, "connections for role %s not limited to 0", names.user);
	} else {
		fix = xasprintf("ALTER ROLE %s CONNECTION LIMIT -1;", names.user);
		report_missing(r, fix, "connections for role %s (CONNECTION LIMIT is 0)", names.user);
		free(fix);
	}
	if (!role->superuser) {
		report_ok(r, "role %s is not a superuser", names.user);
	} else {
		fix = xasprintf("ALTER ROLE %s NOSUPERUSER;", names.user);
		report_missing(r, fix, "NOSUPERUSER for role %s (its password is stored in a file)", names.user);
		free(fix);
	}

	/* a member has the auth_user's EXECUTE grant, and may SET ROLE to it */
	res = db_query(conn,
	               "SELECT quote_ident(m.rolname) FROM pg_auth_members a"
	               "  JOIN pg_roles r ON r.oid = a.roleid JOIN pg_roles m ON m.oid = a.member"
	               " WHERE r.rolname = $1 AND NOT m.rolsuper ORDER BY 1",
	               1, params);
	if (!res)
		return false;
	if (PQntuples(res) == 0) {
		report_ok(r, "no other role is a member of %s", names.user);
	} else {
		char *revoke = xasprintf("REVOKE %s", names.user);
		char *what = xasprintf("membership in %s revoked", names.user);
		report_extra_grantees(r, res, revoke, what);
		free(revoke);
		free(what);
	}
	PQclear(res);

	/* only a superuser may read pg_authid */
	res = PQexecParams(conn,
	                   "SELECT rolpassword IS NOT NULL, coalesce(rolvaliduntil < now(), false)"
	                   " FROM pg_authid WHERE rolname = $1",
	                   1, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
		report_skip(r, "password of role %s (reading it needs a superuser)", names.user);
	} else {
		if (is_true(res, 0, 0)) {
			report_ok(r, "password of role %s is set", names.user);
		} else {
			fix = xasprintf("\\password %s   -- in psql: stores a SCRAM secret", names.user);
			report_missing(r, fix, "password of role %s", names.user);
			free(fix);
		}
		if (!is_true(res, 0, 1)) {
			report_ok(r, "password of role %s has not expired", names.user);
		} else {
			fix = xasprintf("ALTER ROLE %s VALID UNTIL 'infinity';", names.user);
			report_missing(r, fix, "unexpired password of role %s", names.user);
			free(fix);
		}
	}
	PQclear(res);
	return true;
}

/* The fixes that grant the auth_user what it needs once the function exists. */
static void report_missing_grants(Report *r, bool schema_usage)
{
	char *fix;

	fix = xasprintf("REVOKE ALL ON FUNCTION %s FROM PUBLIC;", names.fn_sig);
	report_missing(r, fix, "EXECUTE on %s revoked from PUBLIC", names.fn_sig);
	free(fix);
	fix = xasprintf("GRANT EXECUTE ON FUNCTION %s TO %s;", names.fn_sig, names.user);
	report_missing(r, fix, "EXECUTE on %s for %s", names.fn_sig, names.user);
	free(fix);
	if (schema_usage) {
		fix = xasprintf("GRANT USAGE ON SCHEMA %s TO %s;", names.schema, names.user);
		report_missing(r, fix, "USAGE on schema %s for %s", names.schema, names.user);
		free(fix);
	}
}

/* The function's definition, ownership, privileges and possible impostors. */
static bool check_function(PGconn *conn, Report *r, const RoleState *role, const char *schema_oid)
{
	/* looked up in pg_proc, not by name: that would need USAGE on the schema */
	const char *p2[2] = {schema_oid, opt.function};
	PGresult *res;
	char *fix, *fn_oid;
	bool secdef, owner_super, path_ok, public_exec, direct_grant, has_exec;

	/* other functions of that name: with an untyped $1 an overload could take the call */
	res = db_query(conn,
	               "SELECT oid::regprocedure::text FROM pg_proc"
	               " WHERE pronamespace = $1::oid AND proname = $2 AND oidvectortypes(proargtypes) <> 'text'"
	               " ORDER BY 1",
	               2, p2);
	if (!res)
		return false;
	for (int i = 0; i < PQntuples(res); i++) {
		fix = xasprintf("DROP FUNCTION %s;", PQgetvalue(res, i, 0));
		report_missing(r, fix, "%s dropped (an overload could take auth_query's call)", PQgetvalue(res, i, 0));
		free(fix);
	}
	PQclear(res);

	res = db_query(conn,
	               "SELECT p.oid, p.prosecdef, o.rolsuper,"
	               "       coalesce('" FN_PROCONFIG_ENTRY "' = ANY (p.proconfig), false),"
	               "       pg_get_function_result(p.oid), p.prosrc,"
	               "       EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a"
	               "               WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'),"
	               "       pg_get_function_arguments(p.oid)"
	               "  FROM pg_proc p JOIN pg_roles o ON o.oid = p.proowner"
	               " WHERE p.pronamespace = $1::oid AND p.proname = $2 AND oidvectortypes(p.proargtypes) = 'text'",
	               2, p2);
	if (!res)
		return false;
	if (PQntuples(res) == 0) {
		PQclear(res);
		fix = xasprintf("%s;", names.fn_create);
		report_missing(r, fix, "function %s", names.fn_sig);
		free(fix);
		report_missing_grants(r, false);
		return true;
	}
	report_ok(r, "function %s exists", names.fn_sig);

	/*
	 * CREATE OR REPLACE cannot change the result columns or the parameter:
	 * the function must go, and one created anew is PUBLIC's to execute
	 * and not the auth_user's, so its grants are to make as for a missing one.
	 */
	if (strcmp(PQgetvalue(res, 0, 4), FN_RESULT) != 0 || strcmp(PQgetvalue(res, 0, 7), FN_ARGUMENTS) != 0) {
		fix = xasprintf("DROP FUNCTION %s;", names.fn_sig);
		report_missing(r, fix,
		               "%s dropped: it is %s(%s) RETURNS %s, which CREATE OR REPLACE cannot change to "
		               "(" FN_ARGUMENTS ") RETURNS " FN_RESULT,
		               names.fn_sig, names.function, PQgetvalue(res, 0, 7), PQgetvalue(res, 0, 4));
		free(fix);
		PQclear(res);
		fix = xasprintf("%s;", names.fn_create);
		report_missing(r, fix, "function %s", names.fn_sig);
		free(fix);
		report_missing_grants(r, false);
		return true;
	}
	report_ok(r, "%s returns " FN_RESULT, names.fn_sig);
	fn_oid = xstrdup(PQgetvalue(res, 0, 0));
	secdef = is_true(res, 0, 1);
	owner_super = is_true(res, 0, 2);
	path_ok = is_true(res, 0, 3);
	public_exec = is_true(res, 0, 6);
	if (secdef) {
		report_ok(r, "SECURITY DEFINER on %s", names.fn_sig);
	} else {
		fix = xasprintf("ALTER FUNCTION %s SECURITY DEFINER;", names.fn_sig);
		report_missing(r, fix, "SECURITY DEFINER on %s", names.fn_sig);
		free(fix);
	}
	if (path_ok) {
		report_ok(r, "search_path = " FN_SEARCH_PATH " fixed on %s", names.fn_sig);
	} else {
		fix = xasprintf("ALTER FUNCTION %s SET search_path = " FN_SEARCH_PATH ";", names.fn_sig);
		report_missing(r, fix, "search_path = " FN_SEARCH_PATH " fixed on %s", names.fn_sig);
		free(fix);
	}
	if (owner_super) {
		report_ok(r, "%s is owned by a superuser", names.fn_sig);
	} else {
		fix = xasprintf("ALTER FUNCTION %s OWNER TO %s;", names.fn_sig, names.bootstrap);
		report_missing(r, fix, "a superuser as owner of %s", names.fn_sig);
		free(fix);
	}
	if (same_body(PQgetvalue(res, 0, 5))) {
		report_ok(r, "%s returns secrets of login roles only, never of superusers or %s", names.fn_sig,
		          names.user);
	} else {
		fix = xasprintf("%s;", names.fn_create);
		report_missing(r, fix, "the expected lookup in %s (its body differs)", names.fn_sig);
		free(fix);
	}
	PQclear(res);

	if (public_exec) {
		fix = xasprintf("REVOKE ALL ON FUNCTION %s FROM PUBLIC;", names.fn_sig);
		report_missing(r, fix, "EXECUTE on %s revoked from PUBLIC", names.fn_sig);
		free(fix);
	} else {
		report_ok(r, "EXECUTE on %s revoked from PUBLIC", names.fn_sig);
	}

	if (role->exists) {
		const char *p[2] = {fn_oid, opt.user};
		res = db_query(conn,
		               "SELECT has_function_privilege($2, $1::oid, 'EXECUTE'),"
		               "       EXISTS (SELECT 1 FROM pg_proc p CROSS JOIN LATERAL aclexplode(p.proacl) a"
		               "               JOIN pg_roles r ON r.oid = a.grantee"
		               "               WHERE p.oid = $1::oid AND r.rolname = $2"
		               "                 AND a.privilege_type = 'EXECUTE')",
		               2, p);
		if (!res) {
			free(fn_oid);
			return false;
		}
		has_exec = is_true(res, 0, 0);
		direct_grant = is_true(res, 0, 1);
		PQclear(res);
		/* through PUBLIC it would be lost with the REVOKE above */
		if (direct_grant || (has_exec && !public_exec)) {
			report_ok(r, "EXECUTE on %s for %s", names.fn_sig, names.user);
		} else {
			fix = xasprintf("GRANT EXECUTE ON FUNCTION %s TO %s;", names.fn_sig, names.user);
			report_missing(r, fix, "EXECUTE on %s for %s", names.fn_sig, names.user);
			free(fix);
		}

		/* anyone else who may call it can read every login role's secret */
		res = db_query(conn,
		               "SELECT quote_ident(r.rolname)"
		               "  FROM pg_proc p CROSS JOIN LATERAL aclexplode(p.proacl) a"
		               "  JOIN pg_roles r ON r.oid = a.grantee"
		               " WHERE p.oid = $1::oid AND a.privilege_type = 'EXECUTE'"
		               "   AND a.grantee <> p.proowner AND r.rolname <> $2 AND NOT r.rolsuper"
		               " ORDER BY 1",
		               2, p);
		if (!res) {
			free(fn_oid);
			return false;
		}
		if (PQntuples(res) == 0) {
			report_ok(r, "EXECUTE on %s for no other role than %s", names.fn_sig, names.user);
		} else {
			char *revoke = xasprintf("REVOKE EXECUTE ON FUNCTION %s", names.fn_sig);
			char *what = xasprintf("EXECUTE on %s revoked", names.fn_sig);
			report_extra_grantees(r, res, revoke, what);
			free(revoke);
			free(what);
		}
		PQclear(res);
	} else {
		fix = xasprintf("GRANT EXECUTE ON FUNCTION %s TO %s;", names.fn_sig, names.user);
		report_missing(r, fix, "EXECUTE on %s for %s", names.fn_sig, names.user);
		free(fix);
	}
	free(fn_oid);
	return true;
}

/* The per-database part: CONNECT, the schema, the function and the grants. */
static bool check_database(PGconn *conn, Report *r, const RoleState *role)
{
	const char *p1[1] = {opt.schema};
	PGresult *res;
	char *fix, *schema_oid;
	bool owner_super;

	{
		/* a role yet to be made gets what PUBLIC has */
		const char *p[1] = {role->exists ? opt.user : "public"};
		res = db_query(conn,
		               "SELECT has_database_privilege($1, current_database(), 'CONNECT'),"
		               "       quote_ident(current_database())",
		               1, p);
		if (!res)
			return false;
		if (is_true(res, 0, 0)) {
			report_ok(r, "CONNECT on database %s for %s", PQgetvalue(res, 0, 1), names.user);
		} else {
			fix = xasprintf("GRANT CONNECT ON DATABASE %s TO %s;", PQgetvalue(res, 0, 1), names.user);
			report_missing(r, fix, "CONNECT on database %s for %s", PQgetvalue(res, 0, 1), names.user);
			free(fix);
		}
		PQclear(res);
	}

	res = db_query(conn,
	               "SELECT n.oid, o.rolsuper FROM pg_namespace n JOIN pg_roles o ON o.oid = n.nspowner"
	               " WHERE n.nspname = $1",
	               1, p1);
	if (!res)
		return false;
	if (PQntuples(res) == 0) {
		PQclear(res);
		fix = xasprintf("CREATE SCHEMA %s;", names.schema);
		report_missing(r, fix, "schema %s", names.schema);
		free(fix);
		fix = xasprintf("%s;", names.fn_create);
		report_missing(r, fix, "function %s", names.fn_sig);
		free(fix);
		report_missing_grants(r, true);
		return true;
	}
	schema_oid = xstrdup(PQgetvalue(res, 0, 0));
	owner_super = is_true(res, 0, 1);
	PQclear(res);
	report_ok(r, "schema %s exists", names.schema);

	if (owner_super) {
		report_ok(r, "schema %s is owned by a superuser", names.schema);
	} else {
		fix = xasprintf("ALTER SCHEMA %s OWNER TO %s;", names.schema, names.bootstrap);
		report_missing(r, fix, "a superuser as owner of schema %s", names.schema);
		free(fix);
	}

	/* who else could put a function of that name (or an overload) into the schema */
	{
		const char *p[1] = {schema_oid};
		res = db_query(conn,
		               "SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END"
		               "  FROM pg_namespace n CROSS JOIN LATERAL aclexplode(n.nspacl) a"
		               "  LEFT JOIN pg_roles r ON r.oid = a.grantee"
		               " WHERE n.oid = $1::oid AND a.privilege_type = 'CREATE'"
		               "   AND a.grantee <> n.nspowner AND (a.grantee = 0 OR NOT r.rolsuper)"
		               " ORDER BY 1",
		               1, p);
	}
	if (!res) {
		free(schema_oid);
		return false;
	}
	if (PQntuples(res) == 0) {
		report_ok(r, "CREATE on schema %s for superusers only", names.schema);
	} else {
		char *revoke = xasprintf("REVOKE CREATE ON SCHEMA %s", names.schema);
		char *what = xasprintf("CREATE on schema %s revoked", names.schema);
		report_extra_grantees(r, res, revoke, what);
		free(revoke);
		free(what);
	}
	PQclear(res);

	if (!check_function(conn, r, role, schema_oid)) {
		free(schema_oid);
		return false;
	}
	free(schema_oid);

	if (role->exists) {
		const char *p[2] = {opt.user, opt.schema};
		res = db_query(conn, "SELECT has_schema_privilege($1, $2, 'USAGE')", 2, p);
		if (!res)
			return false;
		if (is_true(res, 0, 0)) {
			report_ok(r, "USAGE on schema %s for %s", names.schema, names.user);
		} else {
			fix = xasprintf("GRANT USAGE ON SCHEMA %s TO %s;", names.schema, names.user);
			report_missing(r, fix, "USAGE on schema %s for %s", names.schema, names.user);
			free(fix);
		}
		PQclear(res);
	} else {
		fix = xasprintf("GRANT USAGE ON SCHEMA %s TO %s;", names.schema, names.user);
		report_missing(r, fix, "USAGE on schema %s for %s", names.schema, names.user);
		free(fix);
	}
	return true;
}

/*
 * End to end: log in as the auth_user with its password and run auth_query
 * for probe_user, as pgbouncer would.
 */
static void probe(const char *dbname, Report *r)
{
	const char *params[1] = {opt.probe_user};
	PGconn *conn;
	PGresult *res;

	conn = db_connect(dbname, opt.user, opt.password);
	if (!conn) {
		report_missing(r, NULL, "login as %s to database %s (see the error above; check pg_hba.conf)",
		               names.user, dbname);
		return;
	}
	res = PQexecParams(conn, names.auth_query, 1, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		char *msg = xstrdup(PQresultErrorMessage(res));
		chomp(msg);
		report_missing(r, NULL, "auth_query as %s in database %s: %s", names.user, dbname, msg);
		free(msg);
	} else if (PQntuples(res) == 0 || PQgetisnull(res, 0, 1)) {
		report_missing(r, NULL,
		               "a secret for %s from auth_query as %s in database %s (no such login role, a "
		               "superuser, no password, or expired)",
		               opt.probe_user, names.user, dbname);
	} else {
		report_ok(r, "auth_query as %s in database %s finds the secret of %s", names.user, dbname,
		          opt.probe_user);
	}
	PQclear(res);
	PQfinish(conn);
}

/* ---------------------------------------------------------------------------
 * set-up
 */

/* The role, in a transaction of its own: it is shared by every database. */
static bool setup_role(PGconn *conn)
{
	const char *params[1] = {opt.user};
	PGresult *res;
	bool exists, can_login = false, superuser = false, has_password = false;
	char *verifier_lit = NULL, *sql;
	bool ok = false;

	res = db_query(conn, "SELECT rolcanlogin, rolsuper, rolpassword IS NOT NULL FROM pg_authid WHERE rolname = $1",
	               1, params);
	if (!res)
		return false;
	exists = PQntuples(res) == 1;
	if (exists) {
		can_login = is_true(res, 0, 0);
		superuser = is_true(res, 0, 1);
		has_password = is_true(res, 0, 2);
	}
	PQclear(res);

	if (superuser) {
		errorf("role %s is a superuser: pgbouncer keeps the auth_user's password in a file, so use a role "
		       "without superuser rights (ALTER ROLE %s NOSUPERUSER;) or choose another --user",
		       names.user, names.user);
		return false;
	}
	if (!exists && !opt.password) {
		opt.password = generate_password();
		opt.password_made = true;
	}
	if (opt.password) {
		/* the SCRAM secret is computed here: the plain password never reaches the server or its logs */
		char *verifier = PQencryptPasswordConn(conn, opt.password, opt.user, "scram-sha-256");
		if (!verifier) {
			char *msg = xstrdup(PQerrorMessage(conn));
			chomp(msg);
			errorf("cannot compute the SCRAM secret: %s", msg);
			free(msg);
			return false;
		}
		verifier_lit = escape_literal(conn, verifier);
		PQfreemem(verifier);
	}

	if (!db_exec(conn, "BEGIN"))
		goto out;
	if (!exists) {
		sql = xasprintf("CREATE ROLE %s LOGIN PASSWORD %s", names.user, verifier_lit);
		ok = db_exec(conn, sql);
		free(sql);
	} else {
		ok = true;
		if (!can_login) {
			sql = xasprintf("ALTER ROLE %s LOGIN", names.user);
			ok = db_exec(conn, sql);
			free(sql);
		}
		if (ok && verifier_lit) {
			sql = xasprintf("ALTER ROLE %s PASSWORD %s", names.user, verifier_lit);
			ok = db_exec(conn, sql);
			free(sql);
		}
	}
	if (!ok) {
		db_exec(conn, "ROLLBACK");
		goto out;
	}
	ok = db_exec(conn, "COMMIT");
	if (!ok)
		goto out;

	if (!exists)
		notef("role %s created%s", names.user,
		      opt.password_made ? " with a generated password (printed below, only this once)" : "");
	else if (opt.password)
		notef("role %s exists; its password was set to the one given%s", names.user,
		      can_login ? "" : ", and it may log in now");
	else if (!can_login)
		notef("role %s exists and may log in now; its password was not changed", names.user);
	else
		notef("role %s exists; its password was not changed", names.user);
	if (exists && !opt.password && !has_password)
		errorf("role %s has no password, so pgbouncer cannot log in with one: give it one with "
		       "--password or --password-file",
		       names.user);
out:
	free(verifier_lit);
	return ok;
}

/* Schema, function and grants in one database, in one transaction. */
static bool setup_database(PGconn *conn)
{
	const char *p_schema[1] = {opt.schema};
	const char *p_fn[1] = {names.fn_sig};
	const char *p_user[1] = {opt.user};
	PGresult *res;
	bool schema_existed, function_existed, function_current, function_dropped, owner_super, connect_ok;
	char *sql, *db_ident;
	bool ok = false;

	if (!db_exec(conn, "BEGIN"))
		return false;

	res = db_query(conn,
	               "SELECT o.rolsuper, quote_ident(o.rolname)"
	               "  FROM pg_namespace n JOIN pg_roles o ON o.oid = n.nspowner WHERE n.nspname = $1",
	               1, p_schema);
	if (!res)
		goto fail;
	schema_existed = PQntuples(res) == 1;
	if (schema_existed && !is_true(res, 0, 0)) {
		errorf("database \"%s\": schema %s belongs to %s, who is not a superuser and could replace the "
		       "lookup function; give it to a superuser (ALTER SCHEMA %s OWNER TO %s;) or use another "
		       "--schema",
		       PQdb(conn), names.schema, PQgetvalue(res, 0, 1), names.schema, names.bootstrap);
		PQclear(res);
		goto fail;
	}
	PQclear(res);
	sql = xasprintf("CREATE SCHEMA IF NOT EXISTS %s", names.schema);
	ok = db_exec(conn, sql);
	free(sql);
	if (!ok)
		goto fail;
	/* a dedicated schema: nobody else may add objects (or overloads) to it */
	sql = xasprintf("REVOKE CREATE ON SCHEMA %s FROM PUBLIC", names.schema);
	ok = db_exec(conn, sql);
	free(sql);
	if (!ok)
		goto fail;

	/*
	 * The definition as this tool writes it: then CREATE OR REPLACE would
	 * change nothing. It cannot change the result columns or the parameter
	 * (as in an older hand-made get_auth): such a function is dropped first.
	 */
	res = db_query(conn,
	               "SELECT p.prosrc, p.prosecdef AND p.provolatile = 's'"
	               "       AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'sql')"
	               "       AND coalesce(p.proconfig = ARRAY['" FN_PROCONFIG_ENTRY "'], false),"
	               "       pg_get_function_result(p.oid) = '" FN_RESULT "'"
	               "       AND pg_get_function_arguments(p.oid) = '" FN_ARGUMENTS "'"
	               "  FROM pg_proc p WHERE p.oid = to_regprocedure($1)",
	               1, p_fn);
	if (!res)
		goto fail;
	function_existed = PQntuples(res) == 1;
	function_dropped = function_existed && !is_true(res, 0, 2);
	function_current =
	    function_existed && !function_dropped && is_true(res, 0, 1) && same_body(PQgetvalue(res, 0, 0));
	PQclear(res);
	if (function_dropped) {
		sql = xasprintf("DROP FUNCTION %s", names.fn_sig);
		ok = db_exec(conn, sql);
		free(sql);
		if (!ok)
			goto fail;
	}
	if (!function_current && !db_exec(conn, names.fn_create))
		goto fail;
	/* CREATE OR REPLACE keeps the old owner: the definer must be able to read pg_authid */
	res = db_query(conn,
	               "SELECT o.rolsuper FROM pg_proc p JOIN pg_roles o ON o.oid = p.proowner"
	               " WHERE p.oid = to_regprocedure($1)",
	               1, p_fn);
	if (!res)
		goto fail;
	owner_super = PQntuples(res) == 1 && is_true(res, 0, 0);
	PQclear(res);
	if (!owner_super) {
		sql = xasprintf("ALTER FUNCTION %s OWNER TO CURRENT_USER", names.fn_sig);
		ok = db_exec(conn, sql);
		free(sql);
		if (!ok)
			goto fail;
	}

	sql = xasprintf("REVOKE ALL ON FUNCTION %s FROM PUBLIC", names.fn_sig);
	ok = db_exec(conn, sql);
	free(sql);
	if (!ok)
		goto fail;
	sql = xasprintf("GRANT EXECUTE ON FUNCTION %s TO %s", names.fn_sig, names.user);
	ok = db_exec(conn, sql);
	free(sql);
	if (!ok)
		goto fail;
	sql = xasprintf("GRANT USAGE ON SCHEMA %s TO %s", names.schema, names.user);
	ok = db_exec(conn, sql);
	free(sql);
	if (!ok)
		goto fail;

	/* PUBLIC has CONNECT unless a hardened set-up took it away */
	res = db_query(conn,
	               "SELECT has_database_privilege($1, current_database(), 'CONNECT'),"
	               "       quote_ident(current_database())",
	               1, p_user);
	if (!res)
		goto fail;
	connect_ok = is_true(res, 0, 0);
	db_ident = xstrdup(PQgetvalue(res, 0, 1));
	PQclear(res);
	if (!connect_ok) {
		sql = xasprintf("GRANT CONNECT ON DATABASE %s TO %s", db_ident, names.user);
		ok = db_exec(conn, sql);
		free(sql);
	}
	free(db_ident);
	if (!ok)
		goto fail;

	if (!db_exec(conn, "COMMIT"))
		return false;
	notef("database \"%s\": schema %s %s, function %s %s, grants to %s in place%s", PQdb(conn), names.schema,
	      schema_existed ? "exists" : "created", names.fn_sig,
	      function_current   ? "up to date"
	      : function_dropped ? "replaced (dropped first: its result columns or parameter differed)"
	      : function_existed ? "replaced"
	                         : "created",
	      names.user, connect_ok ? "" : " (CONNECT granted)");
	return true;

fail:
	if (PQtransactionStatus(conn) != PQTRANS_IDLE)
		db_exec(conn, "ROLLBACK");
	errorf("database \"%s\": nothing was changed in this database", PQdb(conn));
	return false;
}

/* ---------------------------------------------------------------------------
 * output
 */

/* A userlist.txt field: double quotes around, a quote inside written twice. */
static void print_userlist_field(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"')
			fputc('"', f);
		fputc(*s, f);
	}
	fputc('"', f);
}

static void print_settings(char **done, int n_done)
{
	FILE *f = stdout;

	fprintf(f, ";; --- pgbouncer.ini, section [pgbouncer] ---\n");
	fprintf(f, "auth_user = %s\n", opt.user);
	fprintf(f, "auth_query = %s\n", names.auth_query);
	if (n_done > 0) {
		fprintf(f, ";; auth_query runs in the database the client asked for; the lookup\n");
		fprintf(f, ";; function is installed in:");
		for (int i = 0; i < n_done; i++)
			fprintf(f, "%s %s", i ? "," : "", done[i]);
		fprintf(f, "\n;; To run it in one of them for every client instead:\n");
		fprintf(f, ";auth_dbname = %s\n", done[0]);
	} else {
		fprintf(f, ";; The lookup function is not installed in any database yet: see the errors.\n");
	}
	fprintf(f, "\n");
	fprintf(f, ";; --- auth_file (userlist.txt) ---\n");
	if (opt.password) {
		fprintf(f, ";; pgbouncer logs in to PostgreSQL as %s with this plain password\n", opt.user);
		fprintf(f, ";; (a SCRAM secret here could not log in). Keep the file private:\n");
		fprintf(f, ";; chmod 0600, owned by the user pgbouncer runs as.\n");
		print_userlist_field(f, opt.user);
		fputc(' ', f);
		print_userlist_field(f, opt.password);
		fputc('\n', f);
	} else {
		char *placeholder = xasprintf("<current password of %s>", opt.user);
		fprintf(f, ";; The password of %s was not changed: replace the placeholder with\n", opt.user);
		fprintf(f, ";; its current plain password (or re-run with --password to set a new\n");
		fprintf(f, ";; one). Keep the file private: chmod 0600.\n");
		print_userlist_field(f, opt.user);
		fputc(' ', f);
		print_userlist_field(f, placeholder);
		fputc('\n', f);
		free(placeholder);
	}
}

/* ---------------------------------------------------------------------------
 * main
 */

static int run_check(void)
{
	Report r = {.out = stdout, .show_ok = !opt.quiet};
	RoleState role = {0};
	bool role_done = false;
	int status = EXIT_ALL_OK;
	int n = opt.n_dbnames > 0 ? opt.n_dbnames : 1;

	for (int i = 0; i < n; i++) {
		PGconn *conn = db_connect(opt.n_dbnames > 0 ? opt.dbnames[i] : NULL, NULL, NULL);
		if (!conn || !session_prepare(conn, false) || (!names.user && !names_load(conn))) {
			status = EXIT_USAGE;
			PQfinish(conn);
			continue;
		}
		/* a check changes nothing, and the server makes sure of it */
		PQclear(PQexec(conn, "SET default_transaction_read_only = on"));
		if (!role_done) {
			fprintf(r.out, "role %s (cluster-wide):\n", names.user);
			if (!check_role(conn, &r, &role)) {
				status = EXIT_USAGE;
				PQfinish(conn);
				continue;
			}
			role_done = true;
		}
		fprintf(r.out, "database %s:\n", PQdb(conn));
		if (!check_database(conn, &r, &role))
			status = EXIT_USAGE;
		else if (opt.probe_user)
			probe(PQdb(conn), &r);
		PQfinish(conn);
	}
	if (r.problems > 0)
		fprintf(r.out,
		        "%d of %d checks MISSING: run the fix statements as a superuser, or run %s without "
		        "--check\n",
		        r.problems, r.checked, PROGNAME);
	else if (status == EXIT_ALL_OK)
		fprintf(r.out, "all %d checks OK\n", r.checked);
	if (status != EXIT_ALL_OK)
		return status;
	return r.problems > 0 ? EXIT_PROBLEM : EXIT_ALL_OK;
}

/*
 * After the role's set-up: reports what it leaves as it is though pgbouncer
 * could not log in with it (an expired password, none at all) with the fix.
 * False when something is left.
 */
static bool verify_role(PGconn *conn)
{
	Report r = {.show_ok = false};
	RoleState role;
	char *text = NULL;
	size_t len = 0;
	bool ok;

	r.out = open_memstream(&text, &len);
	if (!r.out)
		out_of_memory();
	ok = check_role(conn, &r, &role);
	fclose(r.out);
	if (r.problems > 0) {
		errorf("role %s: %d problem(s) left; apply these fixes as a superuser:", names.user, r.problems);
		fputs(text, stderr);
		ok = false;
	}
	free(text);
	return ok;
}

/*
 * After a set-up: reports what it could not put right (another owner, stray
 * grants, an overload) with the fix, then runs the probe. False when
 * something is left.
 */
static bool verify_database(PGconn *conn)
{
	Report r = {.show_ok = false};
	RoleState role;
	char *text = NULL;
	size_t len = 0;
	bool ok;

	r.out = open_memstream(&text, &len);
	if (!r.out)
		out_of_memory();
	ok = role_load(conn, &role) && check_database(conn, &r, &role);
	if (ok && opt.probe_user && opt.password)
		probe(PQdb(conn), &r);
	fclose(r.out);
	if (r.problems > 0) {
		errorf("database \"%s\": %d problem(s) left; apply these fixes as a superuser:", PQdb(conn),
		       r.problems);
		fputs(text, stderr);
		ok = false;
	} else if (ok && opt.probe_user && opt.password) {
		notef("database \"%s\": auth_query as %s finds the secret of %s", PQdb(conn), names.user,
		      opt.probe_user);
	}
	free(text);
	return ok;
}

static int run_setup(void)
{
	bool role_done = false;
	int status = EXIT_ALL_OK;
	int n = opt.n_dbnames > 0 ? opt.n_dbnames : 1;
	char **done = calloc(n, sizeof(char *));
	int n_done = 0;

	if (!done)
		out_of_memory();
	for (int i = 0; i < n; i++) {
		PGconn *conn = db_connect(opt.n_dbnames > 0 ? opt.dbnames[i] : NULL, NULL, NULL);
		if (!conn || !session_prepare(conn, true) || (!names.user && !names_load(conn))) {
			PQfinish(conn);
			/* the first database decides: without it nothing else can be right */
			if (!role_done) {
				free(done);
				return EXIT_USAGE;
			}
			status = EXIT_USAGE;
			continue;
		}
		if (!role_done) {
			if (!setup_role(conn)) {
				PQfinish(conn);
				free(done);
				return EXIT_PROBLEM;
			}
			role_done = true;
			if (!verify_role(conn))
				status = EXIT_PROBLEM;
		}
		if (!setup_database(conn)) {
			if (status == EXIT_ALL_OK)
				status = EXIT_PROBLEM;
			PQfinish(conn);
			continue;
		}
		done[n_done++] = xstrdup(PQdb(conn));
		if (!verify_database(conn) && status == EXIT_ALL_OK)
			status = EXIT_PROBLEM;
		PQfinish(conn);
	}
	if (opt.probe_user && !opt.password)
		errorf("warning: --probe-user skipped: the password of %s is not known (give --password)", opt.user);
	/* always once the role is settled: a generated password is shown nowhere else */
	print_settings(done, n_done);
	for (int i = 0; i < n_done; i++)
		free(done[i]);
	free(done);
	return status;
}

int main(int argc, char **argv)
{
	parse_options(argc, argv);
	return opt.check ? run_check() : run_setup();
}
