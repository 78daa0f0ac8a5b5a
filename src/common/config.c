/*
 * Configuration: the [pgbouncer] parameter table with its value syntax and
 * SHOW CONFIG formatting, and the ini loader (%include, [databases], [users],
 * [peers] connection strings) that builds a Config from pgbouncer.ini.
 */
#include "autoconfig.h"

#include "common/config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/log.h"
#include "common/util.h"
#include "common/worker_bounds.h"

/* ---------------------------------------------------------------------- */
/* enum word lists */

#ifdef HAVE_PAM
#define HAS_PAM 1
#else
#define HAS_PAM 0
#endif
#ifdef HAVE_LDAP
#include "common/ldap_options.h"
#define HAS_LDAP 1
#else
#define HAS_LDAP 0
#endif

const CfEnum cf_auth_types[] = {
    {"any", AUTH_ANY},   {"trust", AUTH_TRUST}, {"plain", AUTH_PLAIN},
    {"md5", AUTH_MD5},   {"cert", AUTH_CERT},   {"hba", AUTH_HBA},
    {"ldap", AUTH_LDAP}, {"pam", AUTH_PAM},     {"scram-sha-256", AUTH_SCRAM_SHA_256},
    {NULL, 0},
};

const CfEnum cf_pool_modes[] = {
    {"session", POOL_SESSION},
    {"transaction", POOL_TRANSACTION},
    {"statement", POOL_STATEMENT},
    {NULL, 0},
};

const CfEnum cf_sslmodes[] = {
    {"disable", SSLMODE_DISABLE},
    {"allow", SSLMODE_ALLOW},
    {"prefer", SSLMODE_PREFER},
    {"require", SSLMODE_REQUIRE},
    {"verify-ca", SSLMODE_VERIFY_CA},
    {"verify-full", SSLMODE_VERIFY_FULL},
    {NULL, 0},
};

static const CfEnum load_balance_modes[] = {
    {"round-robin", LB_ROUND_ROBIN},
    {"disable", LB_DISABLE},
    {NULL, 0},
};

static const CfEnum cpu_affinities[] = {
    {"off", AFFINITY_OFF},
    {"cores", AFFINITY_CORES},
    {NULL, 0},
};

/* ---------------------------------------------------------------------- */
/* the parameter table */

#ifdef __linux__
#define TCP_DEFER_ACCEPT_DEFAULT "1"
#else
#define TCP_DEFER_ACCEPT_DEFAULT "0"
#endif

#define DEFAULT_AUTH_QUERY                                                                                             \
	"SELECT rolname, CASE WHEN rolvaliduntil < now() THEN NULL ELSE rolpassword END FROM pg_authid WHERE "         \
	"rolname=$1 AND rolcanlogin"

#define RELOAD true
#define BOOT   false

#define PARAM(n, t, d, r)                                                                                              \
	{                                                                                                              \
		.name = #n, .type = (t), .offset = offsetof(CfGlobals, n), .def = (d), .reloadable = (r)               \
	}
/* a number in [lo, hi] (seconds for a CF_TIME) */
#define PARAM_NUM(n, t, d, r, lo, hi)                                                                                  \
	{                                                                                                              \
		.name = #n, .type = (t), .offset = offsetof(CfGlobals, n), .def = (d), .reloadable = (r), .min = (lo), \
		.max = (hi)                                                                                            \
	}
/* a number in (lo, hi]: lo itself refused */
#define PARAM_ABOVE(n, t, d, r, lo, hi)                                                                                \
	{                                                                                                              \
		.name = #n, .type = (t), .offset = offsetof(CfGlobals, n), .def = (d), .reloadable = (r), .min = (lo), \
		.max = (hi), .min_excl = true                                                                          \
	}
#define PARAM_INT(n, d, r, lo, hi) PARAM_NUM(n, CF_INT, d, r, lo, hi)
/* an int with no upper bound but the type's */
#define PARAM_COUNT(n, d, r)       PARAM_NUM(n, CF_INT, d, r, 0, INT_MAX)
#define PARAM_TIME(n, d, r)        PARAM_NUM(n, CF_TIME, d, r, 0, CF_TIME_MAX_SEC)
#define PARAM_ENUM(n, e, d, r)                                                                                         \
	{                                                                                                              \
		.name = #n, .type = CF_ENUM, .offset = offsetof(CfGlobals, n), .def = (d), .reloadable = (r),          \
		.enums = (e)                                                                                           \
	}
/* accepted, but a non-default value only earns a warning */
#define PARAM_UNIMPL(n, t, d, r, hid)                                                                                  \
	{                                                                                                              \
		.name = #n, .type = (t), .offset = offsetof(CfGlobals, n), .def = (d), .reloadable = (r),              \
		.hidden = (hid), .unimplemented = true                                                                 \
	}
#define PARAM_UNIMPL_TIME(n, d, r)                                                                                     \
	{                                                                                                              \
		.name = #n, .type = CF_TIME, .offset = offsetof(CfGlobals, n), .def = (d), .reloadable = (r),          \
		.unimplemented = true, .min = 0, .max = CF_TIME_MAX_SEC                                                \
	}

/*
 * The ranges: what cannot work is refused (a negative count or size, a
 * port outside 1..65535, a time whose deadline would overflow); PgBouncer
 * checks few of these, see doc/pgbouncer.5.md "Value types".
 */
const CfParam cf_params[] = {
    PARAM(admin_users, CF_LIST, "", RELOAD),
    PARAM(application_name_add_host, CF_BOOL, "0", RELOAD),
    PARAM(auth_dbname, CF_STRING, NULL, RELOAD),
    PARAM(auth_file, CF_STRING, NULL, RELOAD),
    PARAM(auth_hba_file, CF_STRING, "", RELOAD),
    PARAM(auth_ident_file, CF_STRING, NULL, RELOAD),
#ifdef HAVE_LDAP
    PARAM(auth_ldap_options, CF_STRING, NULL, RELOAD),
#else
    PARAM_UNIMPL(auth_ldap_options, CF_STRING, NULL, RELOAD, false),
#endif
    PARAM(auth_query, CF_STRING, DEFAULT_AUTH_QUERY, RELOAD),
    PARAM_ENUM(auth_type, cf_auth_types, "md5", RELOAD),
    PARAM(auth_user, CF_STRING, NULL, RELOAD),
    PARAM_TIME(autodb_idle_timeout, "3600", RELOAD),
    PARAM_TIME(cancel_wait_timeout, "10", RELOAD),
    PARAM_TIME(client_idle_timeout, "0", RELOAD),
    PARAM_TIME(client_login_timeout, "60", RELOAD),
    PARAM(client_tls13_ciphers, CF_STRING, NULL, RELOAD),
    PARAM(client_tls_ca_file, CF_STRING, "", RELOAD),
    PARAM(client_tls_cert_file, CF_STRING, "", RELOAD),
    PARAM(client_tls_ciphers, CF_STRING, "default", RELOAD),
    /* a string, as in PgBouncer: checked when client TLS is set up (an unused bad value is no error) */
    PARAM(client_tls_dheparams, CF_STRING, "auto", RELOAD),
    PARAM(client_tls_ecdhcurve, CF_STRING, "auto", RELOAD),
    PARAM(client_tls_key_file, CF_STRING, "", RELOAD),
    PARAM(client_tls_protocols, CF_LIST, "secure", RELOAD),
    PARAM_ENUM(client_tls_sslmode, cf_sslmodes, "disable", RELOAD),
    PARAM(conffile, CF_STRING, NULL, RELOAD),
    PARAM_COUNT(default_pool_size, "20", RELOAD),
    PARAM(disable_pqexec, CF_BOOL, "0", BOOT),
    PARAM_TIME(dns_max_ttl, "15", RELOAD),
    PARAM_TIME(dns_nxdomain_ttl, "15", RELOAD),
    PARAM_UNIMPL_TIME(dns_zone_check_period, "0", RELOAD),
    PARAM_TIME(idle_transaction_timeout, "0", RELOAD),
    PARAM(ignore_startup_parameters, CF_LIST, "", RELOAD),
    PARAM_UNIMPL(job_name, CF_STRING, "pgbouncer", BOOT, false),
    PARAM(listen_addr, CF_LIST, "", BOOT),
    PARAM_COUNT(listen_backlog, "128", BOOT),
    PARAM_INT(listen_port, "6432", BOOT, 1, 65535),
    PARAM(log_connections, CF_BOOL, "1", RELOAD),
    PARAM(log_disconnections, CF_BOOL, "1", RELOAD),
    PARAM(log_pooler_errors, CF_BOOL, "1", RELOAD),
    PARAM(log_stats, CF_BOOL, "1", RELOAD),
    PARAM(logfile, CF_STRING, "", RELOAD),
    PARAM(login_notify_message, CF_STRING, "", RELOAD),
    PARAM_COUNT(max_client_conn, "100", RELOAD),
    PARAM_COUNT(max_db_client_connections, "0", RELOAD),
    PARAM_COUNT(max_db_connections, "0", RELOAD),
    PARAM_NUM(max_packet_size, CF_UINT, "2147483647", RELOAD, 0, UINT_MAX),
    PARAM_COUNT(max_prepared_statements, "200", RELOAD),
    PARAM_COUNT(max_user_client_connections, "0", RELOAD),
    PARAM_COUNT(max_user_connections, "0", RELOAD),
    PARAM_COUNT(max_workers, "0", RELOAD),
    PARAM(metrics_listen, CF_STRING, "", BOOT),
    PARAM_INT(metrics_max_connections, "16", RELOAD, 1, INT_MAX),
    PARAM_COUNT(min_pool_size, "0", RELOAD),
    PARAM_INT(min_workers, "1", RELOAD, 1, WORKERS_MAX),
    PARAM_INT(peer_id, "0", RELOAD, 0, 16383),
    PARAM(pidfile, CF_STRING, "", BOOT),
    PARAM_INT(pkt_buf, "4096", BOOT, 512, INT_MAX),
    PARAM_ENUM(pool_mode, cf_pool_modes, "session", RELOAD),
    PARAM_TIME(pool_idle_timeout, "0", RELOAD),
    PARAM_TIME(query_timeout, "0", RELOAD),
    PARAM_COUNT(query_wait_notify, "5", RELOAD),
    PARAM_TIME(query_wait_timeout, "120", RELOAD),
    PARAM_COUNT(reserve_pool_size, "0", RELOAD),
    PARAM_TIME(reserve_pool_timeout, "5", RELOAD),
    PARAM(resolv_conf, CF_STRING, "", BOOT),
    PARAM_COUNT(sbuf_loopcnt, "5", RELOAD),
    PARAM_INT(scram_iterations, "4096", RELOAD, 1, INT_MAX),
    PARAM_TIME(server_check_delay, "30", RELOAD),
    PARAM(server_check_query, CF_STRING, "<empty>", RELOAD),
    PARAM_TIME(server_connect_timeout, "15", RELOAD),
    PARAM(server_fast_close, CF_BOOL, "0", RELOAD),
    PARAM_TIME(server_idle_timeout, "600", RELOAD),
    PARAM_TIME(server_lifetime, "3600", RELOAD),
    PARAM_TIME(server_login_retry, "15", RELOAD),
    PARAM(server_reset_query, CF_STRING, "DISCARD ALL", RELOAD),
    PARAM(server_reset_query_always, CF_BOOL, "0", RELOAD),
    PARAM(server_round_robin, CF_BOOL, "0", RELOAD),
    PARAM(server_tls13_ciphers, CF_STRING, NULL, RELOAD),
    PARAM(server_tls_ca_file, CF_STRING, "", RELOAD),
    PARAM(server_tls_cert_file, CF_STRING, "", RELOAD),
    PARAM(server_tls_ciphers, CF_STRING, "default", RELOAD),
    PARAM(server_tls_key_file, CF_STRING, "", RELOAD),
    PARAM(server_tls_protocols, CF_LIST, "secure", RELOAD),
    PARAM_ENUM(server_tls_sslmode, cf_sslmodes, "prefer", RELOAD),
    PARAM_UNIMPL(service_name, CF_STRING, NULL, BOOT, true),
    PARAM(so_reuseport, CF_BOOL, "0", BOOT),
    PARAM_INT(stats_period, "60", RELOAD, 1, INT_MAX),
    PARAM(stats_users, CF_LIST, "", RELOAD),
    PARAM_TIME(suspend_timeout, "10", RELOAD),
    PARAM(syslog, CF_BOOL, "0", RELOAD),
    PARAM(syslog_facility, CF_STRING, "daemon", RELOAD),
    PARAM(syslog_ident, CF_STRING, "pgbouncer", RELOAD),
    PARAM(tcp_defer_accept, CF_BOOL, TCP_DEFER_ACCEPT_DEFAULT, RELOAD),
    PARAM(tcp_keepalive, CF_BOOL, "1", RELOAD),
    PARAM_COUNT(tcp_keepcnt, "0", RELOAD),
    PARAM_COUNT(tcp_keepidle, "0", RELOAD),
    PARAM_COUNT(tcp_keepintvl, "0", RELOAD),
    PARAM_COUNT(tcp_socket_buffer, "0", RELOAD),
    PARAM_COUNT(tcp_user_timeout, "0", RELOAD),
    PARAM(track_extra_parameters, CF_LIST, "IntervalStyle", BOOT),
    PARAM_TIME(transaction_timeout, "0", RELOAD),
    PARAM(unix_socket_dir, CF_STRING, "/tmp", BOOT),
    PARAM(unix_socket_group, CF_STRING, "", BOOT),
    PARAM_INT(unix_socket_mode, "0777", BOOT, 0, 07777),
    PARAM(user, CF_STRING, NULL, BOOT),
    /* no default: a reset keeps the value (the -v count unless the file sets it) */
    PARAM_COUNT(verbose, NULL, RELOAD),
    PARAM_ENUM(worker_cpu_affinity, cpu_affinities, "off", RELOAD),
    PARAM_TIME(worker_drain_timeout, "0", RELOAD),
    PARAM_TIME(worker_orphan_timeout, "60", RELOAD),
    PARAM_TIME(worker_scale_cooldown, "10", RELOAD),
    PARAM_INT(worker_scale_down_samples, "30", RELOAD, 1, WORKER_SAMPLES_MAX),
    PARAM_ABOVE(worker_scale_down_threshold, CF_REAL, "0.5", RELOAD, 0, 1),
    PARAM_ABOVE(worker_scale_interval, CF_TIME, "1", RELOAD, 0, CF_TIME_MAX_SEC),
    PARAM_INT(worker_scale_up_samples, "2", RELOAD, 1, WORKER_SAMPLES_MAX),
    PARAM_ABOVE(worker_scale_up_threshold, CF_REAL, "0.75", RELOAD, 0, 1),
    PARAM(worker_state_file, CF_STRING, "", RELOAD),
    PARAM_TIME(worker_watchdog_timeout, "5", RELOAD),
    {.name = NULL},
};

/* ---------------------------------------------------------------------- */
/* small helpers */

static bool is_blank(char c)
{
	return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

static char *skip_blanks(char *p)
{
	while (is_blank(*p))
		p++;
	return p;
}

static void trim_trailing(char *s)
{
	size_t n = strlen(s);
	while (n > 0 && is_blank(s[n - 1]))
		s[--n] = '\0';
}

/* ---------------------------------------------------------------------- */
/* values of [pgbouncer] parameters */

typedef union CfValue {
	int i;          /* CF_INT, CF_BOOL, CF_ENUM */
	unsigned int u; /* CF_UINT */
	usec_t t;       /* CF_TIME */
	double r;       /* CF_REAL */
	char *s;        /* CF_STRING, CF_LIST */
} CfValue;

static bool is_string_type(CfType t)
{
	return t == CF_STRING || t == CF_LIST;
}

static void *field_of(const CfGlobals *g, const CfParam *p)
{
	return (char *)g + p->offset;
}

static CfValue get_value(const CfGlobals *g, const CfParam *p)
{
	CfValue v;
	void *f = field_of(g, p);
	memset(&v, 0, sizeof(v));
	switch (p->type) {
	case CF_INT:
	case CF_BOOL:
	case CF_ENUM:
		v.i = *(int *)f;
		break;
	case CF_UINT:
		v.u = *(unsigned int *)f;
		break;
	case CF_TIME:
		v.t = *(usec_t *)f;
		break;
	case CF_REAL:
		v.r = *(double *)f;
		break;
	case CF_STRING:
	case CF_LIST:
		v.s = *(char **)f;
		break;
	}
	return v;
}

/* Store a value; a string value is taken over and the old one freed. */
static void put_value(CfGlobals *g, const CfParam *p, CfValue v)
{
	void *f = field_of(g, p);
	switch (p->type) {
	case CF_INT:
	case CF_BOOL:
	case CF_ENUM:
		*(int *)f = v.i;
		break;
	case CF_UINT:
		*(unsigned int *)f = v.u;
		break;
	case CF_TIME:
		*(usec_t *)f = v.t;
		break;
	case CF_REAL:
		*(double *)f = v.r;
		break;
	case CF_STRING:
	case CF_LIST:
		free(*(char **)f);
		*(char **)f = v.s;
		break;
	}
}

/* C strtol with base auto-detection; the whole string must be a number that fits an int. */
static bool parse_int(const char *s, int *out)
{
	char *end;
	long v;

	if (!*s || is_blank(*s))
		return false;
	errno = 0;
	v = strtol(s, &end, 0);
	if (errno != 0 || *end != '\0' || v < INT_MIN || v > INT_MAX)
		return false;
	*out = (int)v;
	return true;
}

static bool parse_uint(const char *s, unsigned int *out)
{
	char *end;
	unsigned long v;

	if (!*s || is_blank(*s) || *s == '-' || *s == '+')
		return false;
	errno = 0;
	v = strtoul(s, &end, 0);
	if (errno != 0 || *end != '\0' || v > UINT_MAX)
		return false;
	*out = (unsigned int)v;
	return true;
}

/*
 * Seconds with an optional decimal fraction ("30", "0.5", "1.25"); no sign,
 * exponent or unit. Digits below one microsecond are dropped.
 */
static bool parse_time(const char *s, usec_t *out)
{
	const usec_t max_sec = (INT64_MAX - USEC_PER_SEC) / USEC_PER_SEC;
	usec_t sec = 0, frac = 0, scale = USEC_PER_SEC / 10;
	bool digits = false;
	const char *p = s;

	for (; *p >= '0' && *p <= '9'; p++) {
		int d = *p - '0';
		if (sec > (max_sec - d) / 10)
			return false;
		sec = sec * 10 + d;
		digits = true;
	}
	if (*p == '.') {
		for (p++; *p >= '0' && *p <= '9'; p++) {
			frac += (*p - '0') * scale;
			scale /= 10;
			digits = true;
		}
	}
	if (!digits || *p != '\0')
		return false;
	*out = sec * USEC_PER_SEC + frac;
	return true;
}

/* A plain non-negative decimal such as "0.75" (no sign, exponent, hex, inf or nan). */
static bool parse_real(const char *s, double *out)
{
	const char *p = s;
	bool digits = false;
	char *end;

	for (; *p >= '0' && *p <= '9'; p++)
		digits = true;
	if (*p == '.')
		for (p++; *p >= '0' && *p <= '9'; p++)
			digits = true;
	if (!digits || *p != '\0')
		return false;
	errno = 0;
	*out = strtod(s, &end);
	return errno == 0 && *end == '\0';
}

bool config_enum_parse(const CfEnum *e, const char *word, int *value)
{
	for (; e && e->name; e++) {
		if (strcasecmp(e->name, word) == 0) {
			*value = e->value;
			return true;
		}
	}
	return false;
}

const char *config_enum_name(const CfEnum *e, int value)
{
	for (; e && e->name; e++)
		if (e->value == value)
			return e->name;
	return "?";
}

/* Text -> value by the parameter's type; a string result is a new allocation. */
static bool parse_value(const CfParam *p, const char *text, CfValue *v)
{
	memset(v, 0, sizeof(*v));
	switch (p->type) {
	case CF_INT:
		return parse_int(text, &v->i);
	case CF_UINT:
		return parse_uint(text, &v->u);
	case CF_BOOL:
		/* any non-zero is on; the number is kept, as PgBouncer's SHOW CONFIG shows it */
		return parse_int(text, &v->i);
	case CF_TIME:
		return parse_time(text, &v->t);
	case CF_REAL:
		return parse_real(text, &v->r);
	case CF_ENUM:
		return config_enum_parse(p->enums, text, &v->i);
	case CF_STRING:
	case CF_LIST:
		v->s = xstrdup(text);
		return true;
	}
	return false;
}

static bool format_cfvalue(const CfParam *p, CfValue v, char *buf, size_t len)
{
	switch (p->type) {
	case CF_INT:
	case CF_BOOL:
		snprintf(buf, len, "%d", v.i);
		return true;
	case CF_UINT:
		snprintf(buf, len, "%u", v.u);
		return true;
	case CF_TIME:
		snprintf(buf, len, "%g", (double)v.t / (double)USEC_PER_SEC);
		return true;
	case CF_REAL:
		snprintf(buf, len, "%g", v.r);
		return true;
	case CF_ENUM:
		pgb_strlcpy(buf, config_enum_name(p->enums, v.i), len);
		return true;
	case CF_STRING:
	case CF_LIST:
		if (!v.s)
			return false;
		pgb_strlcpy(buf, v.s, len);
		return true;
	}
	return false;
}

/* Whether v equals the default of p (an unset string and "" count as equal). */
static bool is_default_value(const CfParam *p, CfValue v)
{
	CfValue d;
	bool same;

	if (!p->def) {
		if (is_string_type(p->type))
			return !v.s || !*v.s;
		return v.i == 0;
	}
	if (!parse_value(p, p->def, &d))
		return false;
	switch (p->type) {
	case CF_UINT:
		return v.u == d.u;
	case CF_TIME:
		return v.t == d.t;
	case CF_REAL:
		return v.r == d.r;
	case CF_STRING:
	case CF_LIST:
		same = v.s && strcmp(v.s, d.s) == 0;
		free(d.s);
		return same;
	default:
		return v.i == d.i;
	}
}

/*
 * Reset one parameter to its default. A parameter without a default
 * (verbose) keeps its value unless it is a string, which becomes unset.
 */
static void apply_default(CfGlobals *g, const CfParam *p)
{
	CfValue v;

	if (!p->def) {
		if (is_string_type(p->type)) {
			v.s = NULL;
			put_value(g, p, v);
		}
		return;
	}
	if (!parse_value(p, p->def, &v))
		fatal("config: bad built-in default \"%s\" for %s", p->def, p->name);
	put_value(g, p, v);
}

/* A time in seconds as written in a file: "30", "0.5", "3000000000" (no exponent). */
static void format_seconds(usec_t t, char *buf, size_t len)
{
	usec_t frac = t % USEC_PER_SEC;
	int n = snprintf(buf, len, "%lld", (long long)(t / USEC_PER_SEC));
	if (frac == 0 || n < 0 || (size_t)n >= len)
		return;
	char digits[8];
	snprintf(digits, sizeof(digits), "%06lld", (long long)frac);
	for (int i = 5; i > 0 && digits[i] == '0'; i--)
		digits[i] = '\0';
	snprintf(buf + n, len - (size_t)n, ".%s", digits);
}

/* A bound of p's range in the unit of the file ("%.15g": integers print in full). */
static void format_bound(double v, char *buf, size_t len)
{
	snprintf(buf, len, "%.15g", v);
}

void config_range_text(const CfParam *p, char *buf, size_t len)
{
	char lo[32], hi[32];
	size_t n;

	switch (p->type) {
	case CF_BOOL:
		pgb_strlcpy(buf, "an integer (0 = off, anything else = on)", len);
		return;
	case CF_STRING:
	case CF_LIST:
		pgb_strlcpy(buf, "any text", len);
		return;
	case CF_ENUM:
		pgb_strlcpy(buf, "one of ", len);
		for (const CfEnum *e = p->enums; e && e->name; e++) {
			n = strlen(buf);
			snprintf(buf + n, len - n, "%s%s", e == p->enums ? "" : ", ", e->name);
		}
		return;
	default:
		break;
	}
	format_bound(p->min, lo, sizeof(lo));
	format_bound(p->max, hi, sizeof(hi));
	bool open_top = (p->type == CF_INT && p->max >= INT_MAX) || (p->type == CF_UINT && p->max >= UINT_MAX);
	if (p->min_excl && open_top)
		snprintf(buf, len, "above %s", lo);
	else if (p->min_excl)
		snprintf(buf, len, "above %s and at most %s", lo, hi);
	else if (open_top)
		snprintf(buf, len, "at least %s", lo);
	else
		snprintf(buf, len, "between %s and %s", lo, hi);
	n = strlen(buf);
	if (p->type == CF_TIME)
		snprintf(buf + n, len - n, " seconds");
}

bool config_check_range(const Config *cf, const CfParam *p, char *errbuf, size_t errlen)
{
	CfValue v = get_value(&cf->g, p);
	char got[64], range[128];
	double x;

	switch (p->type) {
	case CF_INT:
		x = v.i;
		snprintf(got, sizeof(got), "%d", v.i);
		break;
	case CF_UINT:
		x = v.u;
		snprintf(got, sizeof(got), "%u", v.u);
		break;
	case CF_TIME:
		x = (double)v.t / (double)USEC_PER_SEC;
		format_seconds(v.t, got, sizeof(got));
		break;
	case CF_REAL:
		x = v.r;
		snprintf(got, sizeof(got), "%g", v.r);
		break;
	default:
		return true; /* parsing checked the others */
	}
	/* written as !(in range) so that NaN fails too */
	if (!((p->min_excl ? x > p->min : x >= p->min) && x <= p->max)) {
		config_range_text(p, range, sizeof(range));
		return set_error(errbuf, errlen, "%s must be %s (got %s)", p->name, range, got);
	}
	return true;
}

const CfParam *config_find_param(const char *name)
{
	for (const CfParam *p = cf_params; p->name; p++)
		if (strcmp(p->name, name) == 0)
			return p;
	return NULL;
}

bool config_param_is_tls(const CfParam *p)
{
	return strstr(p->name, "_tls_") || strstr(p->name, "_tls13_");
}

bool config_param_is_log(const CfParam *p)
{
	return strcmp(p->name, "verbose") == 0 || strcmp(p->name, "logfile") == 0 || strncmp(p->name, "syslog", 6) == 0;
}

bool config_set(Config *cf, const char *name, const char *value, char *errbuf, size_t errlen)
{
	const CfParam *p = config_find_param(name);
	CfValue v;

	if (!p) {
		set_error(errbuf, errlen, "unknown parameter: pgbouncer/%s", name);
		return false;
	}
	if (!value || !parse_value(p, value, &v)) {
		char range[256];
		config_range_text(p, range, sizeof(range));
		const char *kind = p->type == CF_INT || p->type == CF_UINT ? "an integer, "
		                   : p->type == CF_REAL                    ? "a decimal number, "
		                                                           : "";
		set_error(errbuf, errlen, "invalid value \"%s\" for parameter %s: must be %s%s",
		          value ? value : "(null)", name, kind, range);
		return false;
	}
	/* PgBouncer knows these words only when built with LDAP or PAM */
	if (p->offset == offsetof(CfGlobals, auth_type) &&
	    ((v.i == AUTH_LDAP && !HAS_LDAP) || (v.i == AUTH_PAM && !HAS_PAM))) {
		set_error(errbuf, errlen, "auth_type \"%s\" is not supported by this build%s",
		          config_enum_name(cf_auth_types, v.i),
		          v.i == AUTH_PAM ? " (built without libpam: configure --with-pam)"
		                          : " (built without libldap: configure --with-ldap)");
		return false;
	}
	/* the console's database has no server to run auth_query on (doc/pgbouncer.5.md "auth_dbname") */
	if (p->offset == offsetof(CfGlobals, auth_dbname) && strcmp(v.s, "pgbouncer") == 0) {
		free(v.s);
		set_error(errbuf, errlen, "cannot use the reserved \"pgbouncer\" database as an auth_dbname");
		return false;
	}
#ifdef HAVE_LDAP
	/* the options are read now, so that a mistake is refused with the file's line (doc/ldap.md) */
	if (p->offset == offsetof(CfGlobals, auth_ldap_options) && v.s && *v.s) {
		LdapOptions o;
		char why[CF_ERRMSG_LEN];
		if (!ldap_options_parse(&o, v.s, why, sizeof(why))) {
			free(v.s);
			return set_error(errbuf, errlen, "invalid auth_ldap_options: %s", why);
		}
		ldap_options_free(&o);
	}
#endif
	if (p->unimplemented && !is_default_value(p, v))
		log_warning("parameter %s is accepted but not implemented; the value is ignored", p->name);
	put_value(&cf->g, p, v);
	return true;
}

bool config_set_checked(Config *cf, const char *name, const char *value, char *errbuf, size_t errlen)
{
	const CfParam *p = config_find_param(name);
	if (!p)
		return config_set(cf, name, value, errbuf, errlen);
	CfValue old = get_value(&cf->g, p);
	bool str = is_string_type(p->type);
	if (str)
		old.s = xstrdup_or_null(old.s);
	bool ok = config_set(cf, name, value, errbuf, errlen);
	if (ok && !config_validate(cf, errbuf, errlen)) {
		put_value(&cf->g, p, old); /* frees the new string */
		return false;
	}
	if (str)
		free(old.s);
	return ok;
}

bool config_format_value(const Config *cf, const CfParam *p, char *buf, size_t len)
{
	return format_cfvalue(p, get_value(&cf->g, p), buf, len);
}

const char *config_value_text(const Config *cf, const CfParam *p, char *buf, size_t len)
{
	CfValue v = get_value(&cf->g, p);
	if (is_string_type(p->type))
		return v.s;
	return format_cfvalue(p, v, buf, len) ? buf : NULL;
}

bool config_format_default(const CfParam *p, char *buf, size_t len)
{
	if (!p->def)
		return false;
	/* as the table writes it, as PgBouncer shows it: unix_socket_mode's is "0777", its value decimal */
	snprintf(buf, len, "%s", p->def);
	return true;
}

/* ---------------------------------------------------------------------- */
/* connection strings of [databases], [users] and [peers] */

typedef enum ConnKind {
	CK_STR,       /* char *, the value as given */
	CK_INT,       /* int, atoi() */
	CK_SIZE,      /* int, atoi(); below 0 is CF_UNSET (the global applies, as in PgBouncer) */
	CK_PORT,      /* int 1..65535, else "invalid port" */
	CK_POOL_MODE, /* int, a cf_pool_modes word */
	CK_LB,        /* int, a load_balance_modes word */
} ConnKind;

typedef struct ConnKey {
	const char *name;
	ConnKind kind;
	size_t offset; /* in the entry struct */
} ConnKey;

#define DBKEY(n, k)                                                                                                    \
	{                                                                                                              \
#n, (k), offsetof(CfDatabase, n)                                                                       \
	}
static const ConnKey db_keys[] = {
    DBKEY(dbname, CK_STR),
    DBKEY(host, CK_STR),
    DBKEY(port, CK_PORT),
    DBKEY(user, CK_STR),
    DBKEY(password, CK_STR),
    DBKEY(auth_user, CK_STR),
    DBKEY(auth_query, CK_STR),
    DBKEY(auth_dbname, CK_STR),
    DBKEY(pool_size, CK_SIZE),
    DBKEY(min_pool_size, CK_SIZE),
    DBKEY(reserve_pool_size, CK_SIZE),
    {"reserve_pool", CK_SIZE, offsetof(CfDatabase, reserve_pool_size)}, /* the old name */
    DBKEY(max_db_connections, CK_INT),
    DBKEY(max_db_client_connections, CK_INT),
    DBKEY(server_lifetime, CK_INT),
    DBKEY(pool_mode, CK_POOL_MODE),
    DBKEY(load_balance_hosts, CK_LB),
    DBKEY(connect_query, CK_STR),
    DBKEY(client_encoding, CK_STR),
    DBKEY(datestyle, CK_STR),
    DBKEY(timezone, CK_STR),
    DBKEY(application_name, CK_STR),
    DBKEY(query_wait_timeout, CK_INT),
    {NULL, CK_STR, 0},
};

#define USERKEY(n, k)                                                                                                  \
	{                                                                                                              \
#n, (k), offsetof(CfUser, n)                                                                           \
	}
static const ConnKey user_keys[] = {
    USERKEY(pool_mode, CK_POOL_MODE),
    USERKEY(pool_size, CK_SIZE),
    USERKEY(reserve_pool_size, CK_SIZE),
    USERKEY(max_user_connections, CK_INT),
    USERKEY(max_user_client_connections, CK_INT),
    USERKEY(query_timeout, CK_INT),
    USERKEY(idle_transaction_timeout, CK_INT),
    USERKEY(transaction_timeout, CK_INT),
    USERKEY(client_idle_timeout, CK_INT),
    USERKEY(query_wait_timeout, CK_INT),
    {NULL, CK_STR, 0},
};

static const ConnKey peer_keys[] = {
    {"host", CK_STR, offsetof(CfPeer, host)},
    {"port", CK_PORT, offsetof(CfPeer, port)},
    {"pool_size", CK_SIZE, offsetof(CfPeer, pool_size)},
    {NULL, CK_STR, 0},
};

/*
 * Next `key=value` pair of a connection string, parsed in place: the key and
 * the (unquoted) value are NUL-terminated inside the buffer. Returns 1 for a
 * pair, 0 at the end, -1 on a syntax error (message in errbuf).
 */
static int next_conn_pair(char **pos, char **key, char **val, char *errbuf, size_t errlen)
{
	char *p = skip_blanks(*pos);
	char *kend;

	if (!*p)
		return 0;
	*key = p;
	while (*p && !is_blank(*p) && *p != '=')
		p++;
	if (p == *key) {
		set_error(errbuf, errlen, "syntax error in connection string: missing key before \"=\"");
		return -1;
	}
	kend = p;
	p = skip_blanks(p);
	if (*p != '=') {
		*kend = '\0';
		set_error(errbuf, errlen, "syntax error in connection string: missing \"=\" after \"%s\"", *key);
		return -1;
	}
	*kend = '\0';
	p = skip_blanks(p + 1);
	if (*p == '\'') {
		/* quoted: '' is a quote; unquote in place */
		char *w = p;
		*val = w;
		for (p++;; p++) {
			if (!*p) {
				set_error(errbuf, errlen,
				          "syntax error in connection string: unterminated quoted value for %s", *key);
				return -1;
			}
			if (*p == '\'') {
				if (p[1] != '\'')
					break;
				p++;
			}
			*w++ = *p;
		}
		p++; /* the closing quote */
		if (*p && !is_blank(*p)) {
			set_error(errbuf, errlen, "syntax error in connection string: garbage after quoted value of %s",
			          *key);
			return -1;
		}
		if (*p)
			p++;
		*w = '\0';
	} else {
		*val = p;
		while (*p && !is_blank(*p))
			p++;
		if (*p)
			*p++ = '\0';
	}
	if (!**val) {
		set_error(errbuf, errlen, "empty value for connection parameter: %s", *key);
		return -1;
	}
	*pos = p;
	return 1;
}

/*
 * Apply a connection string to an entry using its key table. `what` names the
 * kind of parameter in the unknown-key message ("connection", "user", "peer").
 */
static bool apply_connstr(const char *connstr, const ConnKey *keys, void *entry, const char *what, char *errbuf,
                          size_t errlen)
{
	char *buf = xstrdup(connstr);
	char *pos = buf, *key, *val;
	bool ok = true;
	int r;

	while ((r = next_conn_pair(&pos, &key, &val, errbuf, errlen)) > 0) {
		const ConnKey *k;
		void *f;
		int ival;

		for (k = keys; k->name; k++)
			if (strcmp(k->name, key) == 0)
				break;
		if (!k->name) {
			set_error(errbuf, errlen, "unrecognized %s parameter: %s", what, key);
			ok = false;
			break;
		}
		f = (char *)entry + k->offset;
		switch (k->kind) {
		case CK_STR:
			free(*(char **)f);
			*(char **)f = xstrdup(val);
			break;
		case CK_INT:
			*(int *)f = atoi(val);
			break;
		case CK_SIZE:
			ival = atoi(val);
			*(int *)f = ival < 0 ? CF_UNSET : ival;
			break;
		case CK_PORT:
			ival = atoi(val);
			if (ival <= 0 || ival > 65535) {
				set_error(errbuf, errlen, "invalid port: \"%s\"", val);
				ok = false;
			}
			*(int *)f = ival;
			break;
		case CK_POOL_MODE:
		case CK_LB:
			if (!config_enum_parse(k->kind == CK_LB ? load_balance_modes : cf_pool_modes, val, &ival)) {
				set_error(errbuf, errlen, "invalid value \"%s\" for %s", val, key);
				ok = false;
				break;
			}
			*(int *)f = ival;
			break;
		}
		if (!ok)
			break;
	}
	if (r < 0)
		ok = false;
	free(buf);
	return ok;
}

/* Free the strings of an entry listed in its key table. */
static void free_conn_strings(const ConnKey *keys, void *entry)
{
	for (const ConnKey *k = keys; k->name; k++) {
		if (k->kind == CK_STR) {
			char **f = (char **)((char *)entry + k->offset);
			free(*f);
			*f = NULL;
		}
	}
}

static void copy_conn_strings(const ConnKey *keys, void *dst, const void *src)
{
	for (const ConnKey *k = keys; k->name; k++) {
		if (k->kind == CK_STR) {
			char **d = (char **)((char *)dst + k->offset);
			char *const *s = (char *const *)((const char *)src + k->offset);
			*d = xstrdup_or_null(*s);
		}
	}
}

static void free_db(CfDatabase *db)
{
	free(db->name);
	free(db->connstr);
	free_conn_strings(db_keys, db);
}

static void free_user(CfUser *u)
{
	free(u->name);
}

static void free_peer(CfPeer *p)
{
	free_conn_strings(peer_keys, p);
}

static void init_db(CfDatabase *db)
{
	memset(db, 0, sizeof(*db));
	db->port = 5432;
	db->pool_size = CF_UNSET;
	db->min_pool_size = CF_UNSET;
	db->reserve_pool_size = CF_UNSET;
	db->max_db_connections = CF_UNSET;
	db->max_db_client_connections = CF_UNSET;
	db->server_lifetime = 0;
	db->pool_mode = CF_UNSET;
	db->load_balance_hosts = LB_ROUND_ROBIN;
	db->query_wait_timeout = CF_UNSET;
}

static void init_user(CfUser *u)
{
	memset(u, 0, sizeof(*u));
	u->pool_mode = CF_UNSET;
	u->pool_size = CF_UNSET;
	u->reserve_pool_size = CF_UNSET;
	u->max_user_connections = CF_UNSET;
	u->max_user_client_connections = CF_UNSET;
	u->query_wait_timeout = CF_UNSET;
}

static bool add_database(Config *cf, const char *name, const char *connstr, int line, char *errbuf, size_t errlen)
{
	CfDatabase db;

	if (!*name) {
		set_error(errbuf, errlen, "empty database name");
		return false;
	}
	if (strcmp(name, "pgbouncer") == 0) {
		set_error(errbuf, errlen, "database name \"pgbouncer\" is reserved");
		return false;
	}
	if (strlen(name) >= CF_MAX_DBNAME) {
		set_error(errbuf, errlen, "database name \"%s\" is too long (max %d bytes)", name, CF_MAX_DBNAME - 1);
		return false;
	}
	init_db(&db);
	if (!apply_connstr(connstr, db_keys, &db, "connection", errbuf, errlen)) {
		free_db(&db);
		return false;
	}
	db.name = xstrdup(name);
	db.connstr = xstrdup(connstr);
	db.line = line;
	for (int i = 0; i < cf->n_dbs; i++) {
		if (strcmp(cf->dbs[i].name, name) == 0) {
			free_db(&cf->dbs[i]);
			cf->dbs[i] = db;
			return true;
		}
	}
	cf->dbs = xrealloc(cf->dbs, sizeof(CfDatabase) * (size_t)(cf->n_dbs + 1));
	cf->dbs[cf->n_dbs++] = db;
	return true;
}

static bool add_user(Config *cf, const char *name, const char *connstr, int line, char *errbuf, size_t errlen)
{
	CfUser u;

	if (!*name) {
		set_error(errbuf, errlen, "empty user name");
		return false;
	}
	init_user(&u);
	if (!apply_connstr(connstr, user_keys, &u, "user", errbuf, errlen))
		return false;
	u.name = xstrdup(name);
	u.line = line;
	for (int i = 0; i < cf->n_users; i++) {
		if (strcmp(cf->users[i].name, name) == 0) {
			free_user(&cf->users[i]);
			cf->users[i] = u;
			return true;
		}
	}
	cf->users = xrealloc(cf->users, sizeof(CfUser) * (size_t)(cf->n_users + 1));
	cf->users[cf->n_users++] = u;
	return true;
}

static bool add_peer(Config *cf, const char *key, const char *connstr, int line, char *errbuf, size_t errlen)
{
	CfPeer peer;
	int id = 0;

	for (const char *p = key; *p; p++) {
		if (*p < '0' || *p > '9' || id > 65535) {
			id = -1;
			break;
		}
		id = id * 10 + (*p - '0');
	}
	if (!*key || id < 1 || id > 65535) {
		set_error(errbuf, errlen, "invalid peer id \"%s\": must be an integer from 1 to 65535", key);
		return false;
	}
	memset(&peer, 0, sizeof(peer));
	peer.id = id;
	peer.port = 6432;
	peer.pool_size = CF_UNSET;
	peer.line = line;
	if (!apply_connstr(connstr, peer_keys, &peer, "peer", errbuf, errlen)) {
		free_peer(&peer);
		return false;
	}
	if (!peer.host) {
		set_error(errbuf, errlen, "host was not provided for peer %d", id);
		return false;
	}
	for (int i = 0; i < cf->n_peers; i++) {
		if (cf->peers[i].id == id) {
			free_peer(&cf->peers[i]);
			cf->peers[i] = peer;
			return true;
		}
	}
	cf->peers = xrealloc(cf->peers, sizeof(CfPeer) * (size_t)(cf->n_peers + 1));
	cf->peers[cf->n_peers++] = peer;
	return true;
}

/* ---------------------------------------------------------------------- */
/* the ini loader */

typedef enum Section {
	SEC_NONE,      /* before the first section header */
	SEC_PGBOUNCER, /* [pgbouncer]: the parameter table */
	SEC_DATABASES, /* [databases] */
	SEC_USERS,     /* [users] */
	SEC_PEERS,     /* [peers] */
} Section;

typedef struct Loader {
	Config *cf;
	Section section; /* carried across %include */
	bool seen_main;  /* a [pgbouncer] header was seen */
	char *errbuf;
	size_t errlen;
} Loader;

static void line_error(Loader *ld, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void line_error(Loader *ld, const char *file, int line, const char *fmt, ...)
{
	char msg[CF_ERRMSG_LEN];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	set_error(ld->errbuf, ld->errlen, "%s:%d: %s", file, line, msg);
}

static bool load_file(Loader *ld, const char *path, int depth, const char *from_file, int from_line);

static bool is_key_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
	       c == '*' || c == '-';
}

/*
 * Re-apply the defaults of all parameters (each [pgbouncer] header), boot-only
 * ones too, as PgBouncer 1.25 does at start; on a reload those get their
 * running values back afterwards (config_keep_boot_values()).
 */
static void reset_settings(CfGlobals *g)
{
	for (const CfParam *p = cf_params; p->name; p++) {
		/* conffile names the file being loaded, not a setting to forget */
		if (p->offset != offsetof(CfGlobals, conffile))
			apply_default(g, p);
	}
}

/* After a section header's `]`: blanks, then the end of the line or a comment (as PgBouncer reads it). */
static bool header_rest_ok(char *p)
{
	p = skip_blanks(p);
	return *p == '\0' || *p == ';' || *p == '#';
}

static bool section_header(Loader *ld, const char *file, int lineno, char *p)
{
	char *name = skip_blanks(p + 1);
	char *end = strchr(name, ']');

	if (!end || !header_rest_ok(end + 1)) {
		line_error(ld, file, lineno, "syntax error");
		return false;
	}
	*end = '\0';
	trim_trailing(name);
	if (strcmp(name, "pgbouncer") == 0) {
		ld->section = SEC_PGBOUNCER;
		ld->seen_main = true;
		reset_settings(&ld->cf->g);
	} else if (strcmp(name, "databases") == 0) {
		ld->section = SEC_DATABASES;
	} else if (strcmp(name, "users") == 0) {
		ld->section = SEC_USERS;
	} else if (strcmp(name, "peers") == 0) {
		ld->section = SEC_PEERS;
	} else {
		line_error(ld, file, lineno, "unknown section: [%s]", name);
		return false;
	}
	return true;
}

static bool include_directive(Loader *ld, const char *file, int lineno, char *p, int depth)
{
	static const char word[] = "%include";
	char *path;

	if (strncmp(p, word, sizeof(word) - 1) != 0 || !is_blank(p[sizeof(word) - 1])) {
		line_error(ld, file, lineno, "syntax error");
		return false;
	}
	path = skip_blanks(p + sizeof(word) - 1);
	trim_trailing(path);
	if (!*path) {
		line_error(ld, file, lineno, "syntax error");
		return false;
	}
	if (depth + 1 > CF_MAX_INCLUDE_DEPTH) {
		line_error(ld, file, lineno, "%%include nesting too deep (max %d levels): %s", CF_MAX_INCLUDE_DEPTH,
		           path);
		return false;
	}
	return load_file(ld, path, depth + 1, file, lineno);
}

/*
 * Split "key = value" in place. Keys are a run of [A-Za-z0-9_.*-], or
 * 'single-quoted' (no escapes), or "double-quoted" with "" for a quote.
 */
static bool split_key_value(char *p, char **key, char **value)
{
	char *kend;

	if (*p == '\'') {
		*key = p + 1;
		kend = strchr(p + 1, '\'');
		if (!kend)
			return false;
		p = kend + 1;
	} else if (*p == '"') {
		char *w = p;
		*key = w;
		for (p++;; p++) {
			if (!*p)
				return false;
			if (*p == '"') {
				if (p[1] != '"')
					break;
				p++;
			}
			*w++ = *p;
		}
		kend = w;
		p++;
	} else {
		*key = p;
		while (is_key_char(*p))
			p++;
		if (p == *key)
			return false;
		kend = p;
	}
	p = skip_blanks(p);
	if (*p != '=')
		return false;
	*kend = '\0';
	*value = skip_blanks(p + 1);
	trim_trailing(*value);
	return true;
}

static bool process_line(Loader *ld, const char *file, int lineno, char *line, int depth)
{
	char *p = skip_blanks(line);
	char *key, *value;
	char msg[CF_ERRMSG_LEN];
	bool ok = true;

	if (*p == '\0' || *p == ';' || *p == '#')
		return true;
	if (*p == '[')
		return section_header(ld, file, lineno, p);
	if (*p == '%')
		return include_directive(ld, file, lineno, p, depth);
	if (!split_key_value(p, &key, &value)) {
		line_error(ld, file, lineno, "syntax error");
		return false;
	}
	switch (ld->section) {
	case SEC_NONE:
		line_error(ld, file, lineno, "parameter \"%s\" outside of any section", key);
		return false;
	case SEC_PGBOUNCER:
		ok = config_set(ld->cf, key, value, msg, sizeof(msg));
		break;
	case SEC_DATABASES:
		ok = add_database(ld->cf, key, value, lineno, msg, sizeof(msg));
		break;
	case SEC_USERS:
		ok = add_user(ld->cf, key, value, lineno, msg, sizeof(msg));
		break;
	case SEC_PEERS:
		ok = add_peer(ld->cf, key, value, lineno, msg, sizeof(msg));
		break;
	}
	if (!ok)
		line_error(ld, file, lineno, "%s", msg);
	return ok;
}

static bool load_file(Loader *ld, const char *path, int depth, const char *from_file, int from_line)
{
	char *buf, *line, *next;
	int lineno = 0;
	bool ok = true;

	buf = read_file(path, NULL);
	if (!buf) {
		if (from_file)
			line_error(ld, from_file, from_line, "could not read included file \"%s\": %s", path,
			           strerror(errno));
		else
			set_error(ld->errbuf, ld->errlen, "%s: could not read config file: %s", path, strerror(errno));
		return false;
	}
	for (line = buf; ok && line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		lineno++;
		ok = process_line(ld, path, lineno, line, depth);
	}
	free(buf);
	return ok;
}

bool config_load(Config *cf, const char *path, char *errbuf, size_t errlen)
{
	Loader ld = {.cf = cf, .section = SEC_NONE, .errbuf = errbuf, .errlen = errlen};
	char msg[CF_ERRMSG_LEN];

	free(cf->path);
	cf->path = xstrdup(path);
	free(cf->g.conffile);
	cf->g.conffile = xstrdup(path);

	if (!load_file(&ld, path, 0, NULL, 0))
		return false;
	if (!ld.seen_main) {
		set_error(errbuf, errlen, "%s: main section missing", path);
		return false;
	}
	if (!config_validate(cf, msg, sizeof(msg))) {
		set_error(errbuf, errlen, "%s: %s", path, msg);
		return false;
	}
	return true;
}

/* ---------------------------------------------------------------------- */
/* whole-Config operations */

bool config_reload(const Config *running, int cmdline_verbose, Config *next)
{
	char err[CF_ERRMSG_LEN];
	const char *path = running->g.conffile ? running->g.conffile : running->path;
	config_init(next);
	next->g.verbose = cmdline_verbose;
	if (config_load(next, path, err, sizeof(err)))
		return true;
	log_error("%s", err);
	log_warning("config file loading failed; keeping the running configuration");
	config_free(next);
	return false;
}

void config_init(Config *cf)
{
	memset(cf, 0, sizeof(*cf));
	for (const CfParam *p = cf_params; p->name; p++)
		apply_default(&cf->g, p);
}

void config_free(Config *cf)
{
	for (const CfParam *p = cf_params; p->name; p++) {
		if (is_string_type(p->type)) {
			char **f = field_of(&cf->g, p);
			free(*f);
		}
	}
	for (int i = 0; i < cf->n_dbs; i++)
		free_db(&cf->dbs[i]);
	free(cf->dbs);
	for (int i = 0; i < cf->n_users; i++)
		free_user(&cf->users[i]);
	free(cf->users);
	for (int i = 0; i < cf->n_peers; i++)
		free_peer(&cf->peers[i]);
	free(cf->peers);
	free(cf->path);
	memset(cf, 0, sizeof(*cf));
}

bool config_copy(Config *dst, const Config *src)
{
	memset(dst, 0, sizeof(*dst));
	dst->g = src->g;
	for (const CfParam *p = cf_params; p->name; p++) {
		if (is_string_type(p->type)) {
			char **f = field_of(&dst->g, p);
			*f = xstrdup_or_null(*f);
		}
	}
	if (src->n_dbs > 0) {
		dst->dbs = xmalloc(sizeof(CfDatabase) * (size_t)src->n_dbs);
		for (int i = 0; i < src->n_dbs; i++) {
			dst->dbs[i] = src->dbs[i];
			dst->dbs[i].name = xstrdup_or_null(src->dbs[i].name);
			dst->dbs[i].connstr = xstrdup_or_null(src->dbs[i].connstr);
			copy_conn_strings(db_keys, &dst->dbs[i], &src->dbs[i]);
		}
		dst->n_dbs = src->n_dbs;
	}
	if (src->n_users > 0) {
		dst->users = xmalloc(sizeof(CfUser) * (size_t)src->n_users);
		for (int i = 0; i < src->n_users; i++) {
			dst->users[i] = src->users[i];
			dst->users[i].name = xstrdup_or_null(src->users[i].name);
		}
		dst->n_users = src->n_users;
	}
	if (src->n_peers > 0) {
		dst->peers = xmalloc(sizeof(CfPeer) * (size_t)src->n_peers);
		for (int i = 0; i < src->n_peers; i++) {
			dst->peers[i] = src->peers[i];
			copy_conn_strings(peer_keys, &dst->peers[i], &src->peers[i]);
		}
		dst->n_peers = src->n_peers;
	}
	dst->path = xstrdup_or_null(src->path);
	return true;
}

void config_keep_boot_values(Config *loaded, const Config *running)
{
	for (const CfParam *p = cf_params; p->name; p++) {
		CfValue v;
		if (p->reloadable)
			continue;
		v = get_value(&running->g, p);
		if (is_string_type(p->type))
			v.s = xstrdup_or_null(v.s);
		put_value(&loaded->g, p, v);
	}
}

bool config_validate(const Config *cf, char *errbuf, size_t errlen)
{
	const CfGlobals *g = &cf->g;

	for (const CfParam *p = cf_params; p->name; p++)
		if (!config_check_range(cf, p, errbuf, errlen))
			return false;
	if (!worker_bounds_check(g, errbuf, errlen))
		return false;
	if (g->auth_type == AUTH_LDAP && (!g->auth_ldap_options || !*g->auth_ldap_options)) {
		set_error(errbuf, errlen, "auth_type ldap needs auth_ldap_options (doc/ldap.md)");
		return false;
	}
	return true;
}

/* ---------------------------------------------------------------------- */
/* lookups */

int config_db_pool_size(const Config *cf, const CfDatabase *db)
{
	return db->pool_size != CF_UNSET ? db->pool_size : cf->g.default_pool_size;
}

int config_db_reserve_pool_size(const Config *cf, const CfDatabase *db)
{
	return db->reserve_pool_size != CF_UNSET ? db->reserve_pool_size : cf->g.reserve_pool_size;
}

const CfDatabase *config_find_db(const Config *cf, const char *name)
{
	for (int i = 0; i < cf->n_dbs; i++)
		if (strcmp(cf->dbs[i].name, name) == 0)
			return &cf->dbs[i];
	return NULL;
}

const CfUser *config_find_user(const Config *cf, const char *name)
{
	for (int i = 0; i < cf->n_users; i++)
		if (strcmp(cf->users[i].name, name) == 0)
			return &cf->users[i];
	return NULL;
}

const CfPeer *config_find_peer(const Config *cf, int id)
{
	for (int i = 0; i < cf->n_peers; i++)
		if (cf->peers[i].id == id)
			return &cf->peers[i];
	return NULL;
}

bool config_list_contains(const char *list, const char *item)
{
	size_t ilen = strlen(item);
	const char *p = list;

	if (!list || ilen == 0)
		return false;
	while (*p) {
		const char *start;
		while (*p == ',' || is_blank(*p))
			p++;
		start = p;
		while (*p && *p != ',' && !is_blank(*p))
			p++;
		if ((size_t)(p - start) == ilen && memcmp(start, item, ilen) == 0)
			return true;
	}
	return false;
}
