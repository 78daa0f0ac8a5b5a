/*
 * Unit tests of the configuration module: the parameter table against the
 * spec, value syntax, the ini loader with its error messages, %include,
 * [databases]/[users]/[peers], validation, SET and SHOW CONFIG formatting.
 */
#include "autoconfig.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "unit.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/config.h"
#include "common/log.h"
#include "common/util.h"

/*
 * Every [pgbouncer] parameter in SHOW CONFIG order, written from
 * spec/config.md §2 and DESIGN.md §7: name, the `default` column as SHOW
 * CONFIG prints it (NULL = SQL NULL), `changeable`, and whether the row is
 * hidden from SHOW CONFIG.
 */
typedef struct ExpectedParam {
	const char *name;
	const char *def;
	const char *changeable;
	bool hidden;
} ExpectedParam;

#ifdef __linux__
#define EXPECTED_DEFER "1"
#else
#define EXPECTED_DEFER "0"
#endif

static const ExpectedParam expected_params[] = {
    {"admin_users", "", "yes", false},
    {"application_name_add_host", "0", "yes", false},
    {"auth_dbname", NULL, "yes", false},
    {"auth_file", NULL, "yes", false},
    {"auth_hba_file", "", "yes", false},
    {"auth_ident_file", NULL, "yes", false},
    {"auth_ldap_options", NULL, "yes", false},
    {"auth_query",
     "SELECT rolname, CASE WHEN rolvaliduntil < now() THEN NULL ELSE rolpassword END FROM pg_authid WHERE "
     "rolname=$1 AND rolcanlogin",
     "yes", false},
    {"auth_type", "md5", "yes", false},
    {"auth_user", NULL, "yes", false},
    {"autodb_idle_timeout", "3600", "yes", false},
    {"cancel_wait_timeout", "10", "yes", false},
    {"client_idle_timeout", "0", "yes", false},
    {"client_login_timeout", "60", "yes", false},
    {"client_tls13_ciphers", NULL, "yes", false},
    {"client_tls_ca_file", "", "yes", false},
    {"client_tls_cert_file", "", "yes", false},
    {"client_tls_ciphers", "default", "yes", false},
    {"client_tls_dheparams", "auto", "yes", false},
    {"client_tls_ecdhcurve", "auto", "yes", false},
    {"client_tls_key_file", "", "yes", false},
    {"client_tls_protocols", "secure", "yes", false},
    {"client_tls_sslmode", "disable", "yes", false},
    {"conffile", NULL, "yes", false},
    {"default_pool_size", "20", "yes", false},
    {"disable_pqexec", "0", "no", false},
    {"dns_max_ttl", "15", "yes", false},
    {"dns_nxdomain_ttl", "15", "yes", false},
    {"dns_zone_check_period", "0", "yes", false},
    {"idle_transaction_timeout", "0", "yes", false},
    {"ignore_startup_parameters", "", "yes", false},
    {"job_name", "pgbouncer", "no", false},
    {"listen_addr", "", "no", false},
    {"listen_backlog", "128", "no", false},
    {"listen_port", "6432", "no", false},
    {"log_connections", "1", "yes", false},
    {"log_disconnections", "1", "yes", false},
    {"log_pooler_errors", "1", "yes", false},
    {"log_stats", "1", "yes", false},
    {"logfile", "", "yes", false},
    {"login_notify_message", "", "yes", false},
    {"max_client_conn", "100", "yes", false},
    {"max_db_client_connections", "0", "yes", false},
    {"max_db_connections", "0", "yes", false},
    {"max_packet_size", "2147483647", "yes", false},
    {"max_prepared_statements", "200", "yes", false},
    {"max_user_client_connections", "0", "yes", false},
    {"max_user_connections", "0", "yes", false},
    {"max_workers", "0", "yes", false},
    {"metrics_listen", "", "no", false},
    {"metrics_max_connections", "16", "yes", false},
    {"min_pool_size", "0", "yes", false},
    {"min_workers", "1", "yes", false},
    {"peer_id", "0", "yes", false},
    {"pidfile", "", "no", false},
    {"pkt_buf", "4096", "no", false},
    {"pool_mode", "session", "yes", false},
    {"pool_idle_timeout", "0", "yes", false},
    {"query_timeout", "0", "yes", false},
    {"query_wait_notify", "5", "yes", false},
    {"query_wait_timeout", "120", "yes", false},
    {"reserve_pool_size", "0", "yes", false},
    {"reserve_pool_timeout", "5", "yes", false},
    {"resolv_conf", "", "no", false},
    {"sbuf_loopcnt", "5", "yes", false},
    {"scram_iterations", "4096", "yes", false},
    {"server_check_delay", "30", "yes", false},
    {"server_check_query", "<empty>", "yes", false},
    {"server_connect_timeout", "15", "yes", false},
    {"server_fast_close", "0", "yes", false},
    {"server_idle_timeout", "600", "yes", false},
    {"server_lifetime", "3600", "yes", false},
    {"server_login_retry", "15", "yes", false},
    {"server_reset_query", "DISCARD ALL", "yes", false},
    {"server_reset_query_always", "0", "yes", false},
    {"server_round_robin", "0", "yes", false},
    {"server_tls13_ciphers", NULL, "yes", false},
    {"server_tls_ca_file", "", "yes", false},
    {"server_tls_cert_file", "", "yes", false},
    {"server_tls_ciphers", "default", "yes", false},
    {"server_tls_key_file", "", "yes", false},
    {"server_tls_protocols", "secure", "yes", false},
    {"server_tls_sslmode", "prefer", "yes", false},
    {"service_name", NULL, "no", true},
    {"so_reuseport", "0", "no", false},
    {"stats_period", "60", "yes", false},
    {"stats_users", "", "yes", false},
    {"suspend_timeout", "10", "yes", false},
    {"syslog", "0", "yes", false},
    {"syslog_facility", "daemon", "yes", false},
    {"syslog_ident", "pgbouncer", "yes", false},
    {"tcp_defer_accept", EXPECTED_DEFER, "yes", false},
    {"tcp_keepalive", "1", "yes", false},
    {"tcp_keepcnt", "0", "yes", false},
    {"tcp_keepidle", "0", "yes", false},
    {"tcp_keepintvl", "0", "yes", false},
    {"tcp_socket_buffer", "0", "yes", false},
    {"tcp_user_timeout", "0", "yes", false},
    {"track_extra_parameters", "IntervalStyle", "no", false},
    {"transaction_timeout", "0", "yes", false},
    {"unix_socket_dir", "/tmp", "no", false},
    {"unix_socket_group", "", "no", false},
    {"unix_socket_mode", "0777", "no", false},
    {"user", NULL, "no", false},
    {"verbose", NULL, "yes", false},
    {"worker_cpu_affinity", "off", "yes", false},
    {"worker_drain_timeout", "0", "yes", false},
    {"worker_orphan_timeout", "60", "yes", false},
    {"worker_scale_cooldown", "10", "yes", false},
    {"worker_scale_down_samples", "30", "yes", false},
    {"worker_scale_down_threshold", "0.5", "yes", false},
    {"worker_scale_interval", "1", "yes", false},
    {"worker_scale_up_samples", "2", "yes", false},
    {"worker_scale_up_threshold", "0.75", "yes", false},
    {"worker_state_file", "", "yes", false},
    {"worker_watchdog_timeout", "5", "yes", false},
};

#define N_EXPECTED (sizeof(expected_params) / sizeof(expected_params[0]))

/* ---------------------------------------------------------------------- */
/* fixtures */

static char tmpdir[64];          /* mkdtemp'd, removed at the end */
static char saved_cwd[PATH_MAX]; /* restored after tests that chdir */
static char last_path[PATH_MAX]; /* path of the last file written by load_text() */
static char err[CF_ERRMSG_LEN];  /* error text of the last load */

static int group_setup(void **state)
{
	(void)state;
	unit_tmpdir("test_config", tmpdir, sizeof(tmpdir));
	if (!getcwd(saved_cwd, sizeof(saved_cwd)))
		return -1;
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	if (chdir(saved_cwd) != 0)
		return -1;
	unit_rmtree(tmpdir);
	return 0;
}

/* Write tmpdir/name (name may contain one directory level, created here). */
static void write_fixture(const char *name, const char *content, char *path_out)
{
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
	if (strchr(name, '/')) {
		char *slash = strrchr(path, '/');
		*slash = '\0';
		if (mkdir(path, 0700) != 0 && errno != EEXIST)
			fail_msg("mkdir %s: %s", path, strerror(errno));
		*slash = '/';
	}
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	assert_int_equal(fputs(content, f) >= 0, 1);
	assert_int_equal(fclose(f), 0);
	if (path_out)
		snprintf(path_out, PATH_MAX, "%s", path);
}

/* Write `content` to a file, init `cf` and load it; the error text goes to err. */
static bool load_text(Config *cf, const char *content)
{
	write_fixture("test.ini", content, last_path);
	config_init(cf);
	err[0] = '\0';
	return config_load(cf, last_path, err, sizeof(err));
}

/* Loading `content` must fail with exactly "<path>:<suffix>". */
static void expect_load_error(const char *content, const char *suffix)
{
	Config cf;
	char want[CF_ERRMSG_LEN + PATH_MAX];

	assert_false(load_text(&cf, content));
	snprintf(want, sizeof(want), "%s:%s", last_path, suffix);
	assert_string_equal(err, want);
	config_free(&cf);
}

/* Loading `content` must succeed (fails the test with the message otherwise). */
static void load_ok(Config *cf, const char *content)
{
	if (!load_text(cf, content))
		fail_msg("load failed: %s", err);
}

static const char *value_of(const Config *cf, const char *name, char *buf, size_t len)
{
	const CfParam *p = config_find_param(name);
	assert_non_null(p);
	return config_format_value(cf, p, buf, len) ? buf : NULL;
}

/* ---------------------------------------------------------------------- */
/* the parameter table */

static void test_param_table_matches_spec(void **state)
{
	(void)state;
	size_t n = 0;
	char buf[CF_ERRMSG_LEN];

	for (const CfParam *p = cf_params; p->name; p++, n++) {
		assert_true(n < N_EXPECTED);
		const ExpectedParam *e = &expected_params[n];
		assert_string_equal(p->name, e->name);
		assert_string_equal(p->reloadable ? "yes" : "no", e->changeable);
		assert_int_equal(p->hidden, e->hidden);
		bool has_def = config_format_default(p, buf, sizeof(buf));
		if (e->def) {
			if (!has_def)
				fail_msg("%s: default is NULL, expected \"%s\"", p->name, e->def);
			assert_string_equal(buf, e->def);
		} else if (has_def) {
			fail_msg("%s: default is \"%s\", expected NULL", p->name, buf);
		}
		assert_ptr_equal(config_find_param(e->name), p);
	}
	assert_int_equal(n, N_EXPECTED);
}

static void test_param_flags(void **state)
{
	(void)state;
	const char *unimpl[] = {
#ifndef HAVE_LDAP
	    "auth_ldap_options",
#endif
	    "dns_zone_check_period", "job_name", "service_name"};
	int n_unimpl = 0;

	for (const CfParam *p = cf_params; p->name; p++) {
		bool want = false;
		for (size_t i = 0; i < sizeof(unimpl) / sizeof(unimpl[0]); i++)
			if (strcmp(p->name, unimpl[i]) == 0)
				want = true;
		if (p->unimplemented != want)
			fail_msg("%s: unimplemented flag is %d", p->name, p->unimplemented);
		n_unimpl += p->unimplemented;
		if (p->type == CF_ENUM)
			assert_non_null(p->enums);
	}
	assert_int_equal(n_unimpl, (int)(sizeof(unimpl) / sizeof(unimpl[0])));
	assert_null(config_find_param("Listen_Port"));
	assert_null(config_find_param("nosuch"));
}

/* After config_init every value equals its SHOW CONFIG default (verbose: 0, no default;
 * unix_socket_mode: the value in decimal, the default in octal as written). */
static void test_init_values_are_defaults(void **state)
{
	(void)state;
	Config cf;
	char v[CF_ERRMSG_LEN], d[CF_ERRMSG_LEN];

	config_init(&cf);
	for (const CfParam *p = cf_params; p->name; p++) {
		bool hv = config_format_value(&cf, p, v, sizeof(v));
		bool hd = config_format_default(p, d, sizeof(d));
		if (strcmp(p->name, "verbose") == 0) {
			assert_true(hv);
			assert_string_equal(v, "0");
			assert_false(hd);
			continue;
		}
		if (strcmp(p->name, "unix_socket_mode") == 0) {
			assert_string_equal(v, "511");
			assert_string_equal(d, "0777");
			continue;
		}
		assert_int_equal(hv, hd);
		if (hv)
			assert_string_equal(v, d);
	}
	assert_int_equal(cf.g.listen_port, 6432);
	assert_int_equal(cf.g.unix_socket_mode, 0777);
	assert_int_equal(cf.g.auth_type, AUTH_MD5);
	assert_int_equal(cf.g.server_tls_sslmode, SSLMODE_PREFER);
	assert_string_equal(cf.g.client_tls_dheparams, "auto");
	assert_int_equal(cf.g.max_packet_size, 2147483647u);
	assert_int_equal(cf.g.server_lifetime, 3600 * USEC_PER_SEC);
	assert_true(cf.g.worker_scale_up_threshold == 0.75);
	assert_true(cf.g.worker_scale_down_threshold == 0.5);
	assert_int_equal(cf.g.worker_scale_interval, USEC_PER_SEC);
	assert_int_equal(cf.g.worker_cpu_affinity, AFFINITY_OFF);
	assert_null(cf.g.auth_file);
	assert_string_equal(cf.g.admin_users, "");
	assert_string_equal(cf.g.worker_state_file, "");
	assert_int_equal(cf.n_dbs, 0);
	assert_true(config_validate(&cf, err, sizeof(err)));
	config_free(&cf);
}

/* ---------------------------------------------------------------------- */
/* value syntax (through config_set, the same path the loader uses) */

static void set_ok(Config *cf, const char *name, const char *value)
{
	char e[CF_ERRMSG_LEN];
	if (!config_set(cf, name, value, e, sizeof(e)))
		fail_msg("config_set(%s, \"%s\") failed: %s", name, value, e);
}

static void set_invalid(Config *cf, const char *name, const char *value)
{
	char e[CF_ERRMSG_LEN], want[CF_ERRMSG_LEN + 64], before[CF_ERRMSG_LEN], after[CF_ERRMSG_LEN];
	const char *b = value_of(cf, name, before, sizeof(before));

	if (config_set(cf, name, value, e, sizeof(e)))
		fail_msg("config_set(%s, \"%s\") unexpectedly succeeded", name, value);
	/* the message names the value and the parameter, then says what it accepts */
	snprintf(want, sizeof(want), "invalid value \"%s\" for parameter %s: must be ", value, name);
	if (strncmp(e, want, strlen(want)) != 0)
		fail_msg("\"%s\" does not start with \"%s\"", e, want);
	/* a rejected value changes nothing */
	const char *a = value_of(cf, name, after, sizeof(after));
	assert_int_equal(a == NULL, b == NULL);
	if (a)
		assert_string_equal(a, b);
}

static void test_int_syntax(void **state)
{
	(void)state;
	Config cf;
	char buf[64];

	config_init(&cf);
	set_ok(&cf, "unix_socket_mode", "0777");
	assert_int_equal(cf.g.unix_socket_mode, 511);
	assert_string_equal(value_of(&cf, "unix_socket_mode", buf, sizeof(buf)), "511");
	set_ok(&cf, "unix_socket_mode", "0640");
	assert_int_equal(cf.g.unix_socket_mode, 416);
	set_ok(&cf, "max_client_conn", "0x1f");
	assert_int_equal(cf.g.max_client_conn, 31);
	set_ok(&cf, "max_client_conn", "250");
	assert_int_equal(cf.g.max_client_conn, 250);
	set_ok(&cf, "default_pool_size", "-5"); /* negative is syntactically fine */
	assert_int_equal(cf.g.default_pool_size, -5);
	set_invalid(&cf, "max_client_conn", "08");
	set_invalid(&cf, "max_client_conn", "09");
	set_invalid(&cf, "max_client_conn", "0x");
	set_invalid(&cf, "max_client_conn", "10kB");
	set_invalid(&cf, "tcp_socket_buffer", "1MB");
	set_invalid(&cf, "max_client_conn", "1.5");
	set_invalid(&cf, "max_client_conn", "");
	set_invalid(&cf, "max_client_conn", "abc");
	set_invalid(&cf, "max_client_conn", "99999999999");
	assert_int_equal(cf.g.max_client_conn, 250);

	set_ok(&cf, "max_packet_size", "4294967295");
	assert_int_equal(cf.g.max_packet_size, 4294967295u);
	assert_string_equal(value_of(&cf, "max_packet_size", buf, sizeof(buf)), "4294967295");
	set_ok(&cf, "max_packet_size", "0x10");
	assert_int_equal(cf.g.max_packet_size, 16);
	set_invalid(&cf, "max_packet_size", "-1");
	set_invalid(&cf, "max_packet_size", "4294967296");
	set_invalid(&cf, "max_packet_size", "");
	config_free(&cf);
}

static void test_bool_syntax(void **state)
{
	(void)state;
	Config cf;
	char buf[64];

	config_init(&cf);
	set_ok(&cf, "log_stats", "0");
	assert_int_equal(cf.g.log_stats, 0);
	assert_string_equal(value_of(&cf, "log_stats", buf, sizeof(buf)), "0");
	set_ok(&cf, "log_stats", "7"); /* any non-zero is on, and shown as written (PgBouncer's SHOW CONFIG) */
	assert_true(cf.g.log_stats);
	assert_string_equal(value_of(&cf, "log_stats", buf, sizeof(buf)), "7");
	set_ok(&cf, "log_stats", "-2");
	assert_string_equal(value_of(&cf, "log_stats", buf, sizeof(buf)), "-2");
	set_ok(&cf, "so_reuseport", "1");
	assert_int_equal(cf.g.so_reuseport, 1);
	const char *words[] = {"on", "off", "true", "false", "yes", "no", "ON", ""};
	for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
		set_invalid(&cf, "server_round_robin", words[i]);
	config_free(&cf);
}

static void test_time_syntax(void **state)
{
	(void)state;
	Config cf;
	char buf[64];

	config_init(&cf);
	set_ok(&cf, "query_timeout", "0.5");
	assert_int_equal(cf.g.query_timeout, 500000);
	assert_string_equal(value_of(&cf, "query_timeout", buf, sizeof(buf)), "0.5");
	set_ok(&cf, "query_timeout", "1.5");
	assert_int_equal(cf.g.query_timeout, 1500000);
	set_ok(&cf, "query_timeout", "30");
	assert_int_equal(cf.g.query_timeout, 30 * USEC_PER_SEC);
	assert_string_equal(value_of(&cf, "query_timeout", buf, sizeof(buf)), "30");
	set_ok(&cf, "query_timeout", ".25");
	assert_int_equal(cf.g.query_timeout, 250000);
	set_ok(&cf, "query_timeout", "0.000001");
	assert_int_equal(cf.g.query_timeout, 1);
	set_ok(&cf, "query_timeout", "2.0000009"); /* below a microsecond is dropped */
	assert_int_equal(cf.g.query_timeout, 2 * USEC_PER_SEC);
	set_ok(&cf, "server_lifetime", "86400");
	assert_int_equal(cf.g.server_lifetime, 86400 * USEC_PER_SEC);
	assert_string_equal(value_of(&cf, "server_lifetime", buf, sizeof(buf)), "86400");
	const char *bad[] = {"10s", "500ms", "1min", "1e3", "0x10", "-1", "+1", "inf", "nan", "", ".", "1.2.3", "1 5"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		set_invalid(&cf, "query_timeout", bad[i]);
	set_invalid(&cf, "server_lifetime", "99999999999999999999");
	config_free(&cf);
}

static void test_real_and_enum_syntax(void **state)
{
	(void)state;
	Config cf;
	char buf[64];

	config_init(&cf);
	set_ok(&cf, "worker_scale_up_threshold", "0.9");
	assert_true(cf.g.worker_scale_up_threshold == 0.9);
	assert_string_equal(value_of(&cf, "worker_scale_up_threshold", buf, sizeof(buf)), "0.9");
	set_ok(&cf, "worker_scale_up_threshold", "1");
	assert_true(cf.g.worker_scale_up_threshold == 1.0);
	const char *bad_real[] = {"1e-1", "-0.5", "abc", "", "0x1", "nan", "50%"};
	for (size_t i = 0; i < sizeof(bad_real) / sizeof(bad_real[0]); i++)
		set_invalid(&cf, "worker_scale_down_threshold", bad_real[i]);

	set_ok(&cf, "auth_type", "SCRAM-SHA-256");
	assert_int_equal(cf.g.auth_type, AUTH_SCRAM_SHA_256);
	assert_string_equal(value_of(&cf, "auth_type", buf, sizeof(buf)), "scram-sha-256");
	set_ok(&cf, "auth_type", "Trust");
	assert_int_equal(cf.g.auth_type, AUTH_TRUST);
	set_ok(&cf, "pool_mode", "TRANSACTION");
	assert_int_equal(cf.g.pool_mode, POOL_TRANSACTION);
	assert_string_equal(value_of(&cf, "pool_mode", buf, sizeof(buf)), "transaction");
	set_ok(&cf, "client_tls_sslmode", "Verify-Full");
	assert_int_equal(cf.g.client_tls_sslmode, SSLMODE_VERIFY_FULL);
	set_ok(&cf, "client_tls_dheparams", "legacy");
	assert_string_equal(cf.g.client_tls_dheparams, "legacy");
	set_ok(&cf, "worker_cpu_affinity", "Cores");
	assert_int_equal(cf.g.worker_cpu_affinity, AFFINITY_CORES);
	assert_string_equal(value_of(&cf, "worker_cpu_affinity", buf, sizeof(buf)), "cores");
	set_invalid(&cf, "pool_mode", "bogus");
	set_invalid(&cf, "pool_mode", "");
	set_invalid(&cf, "auth_type", "password");
	/* known to PgBouncer, but only in builds with LDAP or PAM */
	char e[CF_ERRMSG_LEN];
#ifdef HAVE_LDAP
	assert_true(config_set(&cf, "auth_type", "LDAP", e, sizeof(e)));
	assert_int_equal(cf.g.auth_type, AUTH_LDAP);
	set_ok(&cf, "auth_type", "trust");
#else
	assert_false(config_set(&cf, "auth_type", "LDAP", e, sizeof(e)));
	assert_string_equal(e, "auth_type \"ldap\" is not supported by this build (built without libldap: configure "
	                       "--with-ldap)");
	assert_int_equal(cf.g.auth_type, AUTH_TRUST);
#endif
#ifdef HAVE_PAM
	assert_true(config_set(&cf, "auth_type", "pam", e, sizeof(e)));
	assert_int_equal(cf.g.auth_type, AUTH_PAM);
	set_ok(&cf, "auth_type", "trust");
#else
	assert_false(config_set(&cf, "auth_type", "pam", e, sizeof(e)));
	assert_string_equal(e, "auth_type \"pam\" is not supported by this build (built without libpam: configure "
	                       "--with-pam)");
	assert_int_equal(cf.g.auth_type, AUTH_TRUST);
#endif
	set_invalid(&cf, "worker_cpu_affinity", "on");
	set_invalid(&cf, "client_tls_sslmode", "verify_full");
	/* the admin console's database cannot run auth_query: refused when set, as PgBouncer words it */
	set_ok(&cf, "auth_dbname", "postgres");
	assert_false(config_set(&cf, "auth_dbname", "pgbouncer", e, sizeof(e)));
	assert_string_equal(e, "cannot use the reserved \"pgbouncer\" database as an auth_dbname");
	assert_string_equal(cf.g.auth_dbname, "postgres");
	config_free(&cf);
}

static void test_string_syntax(void **state)
{
	(void)state;
	Config cf;
	char buf[64];

	config_init(&cf);
	set_ok(&cf, "server_reset_query", "");
	assert_string_equal(cf.g.server_reset_query, "");
	assert_string_equal(value_of(&cf, "server_reset_query", buf, sizeof(buf)), "");
	set_ok(&cf, "auth_file", "~/userlist.txt"); /* no ~ expansion */
	assert_string_equal(cf.g.auth_file, "~/userlist.txt");
	set_ok(&cf, "admin_users", "a, b");
	assert_string_equal(cf.g.admin_users, "a, b");
	set_invalid(&cf, "listen_port", "");

	char e[CF_ERRMSG_LEN];
	assert_false(config_set(&cf, "nosuch", "1", e, sizeof(e)));
	assert_string_equal(e, "unknown parameter: pgbouncer/nosuch");
	assert_false(config_set(&cf, "Listen_Port", "1", e, sizeof(e)));
	assert_string_equal(e, "unknown parameter: pgbouncer/Listen_Port");
	config_free(&cf);
}

/* ---------------------------------------------------------------------- */
/* the ini file */

static void test_comments_and_whitespace(void **state)
{
	(void)state;
	Config cf;

	load_ok(&cf, "; leading comment\n"
	             "# another\n"
	             "   ; indented comment\n"
	             "\n"
	             "  [pgbouncer]  \n"
	             "server_reset_query = DISCARD ALL ; x\n"
	             "listen_addr = 127.0.0.1 # not a comment\n"
	             "\tmax_client_conn\t=\t55   \n"
	             "pool_mode=transaction\r\n"
	             "logfile =\n"
	             "default_pool_size = 3\n"
	             "default_pool_size = 4\n"
	             "\t# key = value in a comment\n");
	assert_string_equal(cf.g.server_reset_query, "DISCARD ALL ; x");
	assert_string_equal(cf.g.listen_addr, "127.0.0.1 # not a comment");
	assert_int_equal(cf.g.max_client_conn, 55);
	assert_int_equal(cf.g.pool_mode, POOL_TRANSACTION);
	assert_string_equal(cf.g.logfile, "");
	assert_int_equal(cf.g.default_pool_size, 4);
	assert_string_equal(cf.g.conffile, last_path);
	assert_string_equal(cf.path, last_path);
	config_free(&cf);

	/* a comment may follow a section header, as PgBouncer 1.25 allows */
	load_ok(&cf, "[pgbouncer] ; main settings\n"
	             "max_client_conn = 7\n"
	             "[databases]# the databases\n"
	             "db1 = host=h1\n"
	             "[users]\t; per user\n");
	assert_int_equal(cf.g.max_client_conn, 7);
	assert_int_equal(cf.n_dbs, 1);
	assert_string_equal(cf.dbs[0].host, "h1");
	config_free(&cf);
}

static void test_quoted_keys(void **state)
{
	(void)state;
	Config cf;

	load_ok(&cf, "[pgbouncer]\n"
	             "'listen_port' = 7000\n"
	             "\"max_client_conn\" = 9\n"
	             "[databases]\n"
	             "'my db' = dbname=x\n"
	             "\"we\"\"ird\" = port=5433\n"
	             "'a=b;c' = host=h\n"
	             "my.db-1* = port=5434\n");
	assert_int_equal(cf.g.listen_port, 7000);
	assert_int_equal(cf.g.max_client_conn, 9);
	assert_int_equal(cf.n_dbs, 4);
	assert_non_null(config_find_db(&cf, "my db"));
	assert_string_equal(config_find_db(&cf, "my db")->dbname, "x");
	assert_non_null(config_find_db(&cf, "we\"ird"));
	assert_int_equal(config_find_db(&cf, "we\"ird")->port, 5433);
	assert_string_equal(config_find_db(&cf, "a=b;c")->host, "h");
	assert_int_equal(config_find_db(&cf, "my.db-1*")->port, 5434);
	config_free(&cf);
}

static void test_syntax_errors(void **state)
{
	(void)state;
	expect_load_error("[pgbouncer]\nlisten_port 6432\n", "2: syntax error");
	expect_load_error("[pgbouncer\n", "1: syntax error");
	expect_load_error("[pgbouncer] x\n", "1: syntax error");
	expect_load_error("[pgbouncer] x ; comment\n", "1: syntax error");
	expect_load_error("[pgbouncer]\n\n\n'unterminated = 1\n", "4: syntax error");
	expect_load_error("[pgbouncer]\n\"unterminated = 1\n", "2: syntax error");
	expect_load_error("[pgbouncer]\n= 5\n", "2: syntax error");
	expect_load_error("[pgbouncer]\nfoo bar = 1\n", "2: syntax error");
	expect_load_error("[pgbouncer]\nkey@x = 1\n", "2: syntax error");
	expect_load_error("[pgbouncer]\n'a'b = 1\n", "2: syntax error");
	expect_load_error("[pgbouncer]\n# ok\n%includex foo\n", "3: syntax error");
	expect_load_error("[pgbouncer]\n%include\n", "2: syntax error");
	expect_load_error("[pgbouncer]\n%include   \n", "2: syntax error");
	expect_load_error("[pgbouncer]\n%foo bar\n", "2: syntax error");
	/* the first error stops the load */
	expect_load_error("[pgbouncer]\nlisten_port\nfoo = 1\n", "2: syntax error");
}

static void test_semantic_errors(void **state)
{
	(void)state;
	expect_load_error("[pgbouncer]\nlisten_port = 1\nfoo = 1\n", "3: unknown parameter: pgbouncer/foo");
	expect_load_error("[pgbouncer]\nListen_Port = 5\n", "2: unknown parameter: pgbouncer/Listen_Port");
	expect_load_error(
	    "[pgbouncer]\nlisten_port = abc\n",
	    "2: invalid value \"abc\" for parameter listen_port: must be an integer, between 1 and 65535");
	expect_load_error("[pgbouncer]\nlisten_port =\n",
	                  "2: invalid value \"\" for parameter listen_port: must be an integer, between 1 and 65535");
	expect_load_error(
	    "[pgbouncer]\nquery_timeout = 10s\n",
	    "2: invalid value \"10s\" for parameter query_timeout: must be between 0 and 2147483647 seconds");
	expect_load_error(
	    "[pgbouncer]\nlog_stats = on\n",
	    "2: invalid value \"on\" for parameter log_stats: must be an integer (0 = off, anything else = on)");
	expect_load_error("[pgbouncer]\n[Databases]\n", "2: unknown section: [Databases]");
	expect_load_error("[pgbouncer]\n[foo]\nx = 1\n", "2: unknown section: [foo]");
	expect_load_error("listen_port = 1\n[pgbouncer]\n", "1: parameter \"listen_port\" outside of any section");
	expect_load_error("\n; c\nfoo = host=x\n", "3: parameter \"foo\" outside of any section");
}

static void test_missing_main_section(void **state)
{
	(void)state;
	Config cf;
	char want[CF_ERRMSG_LEN + PATH_MAX];

	assert_false(load_text(&cf, "[databases]\nfoo =\n"));
	snprintf(want, sizeof(want), "%s: main section missing", last_path);
	assert_string_equal(err, want);
	config_free(&cf);

	assert_false(load_text(&cf, ""));
	assert_string_equal(err, want);
	config_free(&cf);

	config_init(&cf);
	assert_false(config_load(&cf, "/nonexistent/dir/x.ini", err, sizeof(err)));
	assert_string_equal(err, "/nonexistent/dir/x.ini: could not read config file: No such file or directory");
	config_free(&cf);
}

static void test_repeated_main_section(void **state)
{
	(void)state;
	Config cf;

	load_ok(&cf, "[pgbouncer]\n"
	             "max_client_conn = 5\n"
	             "listen_port = 7001\n"
	             "pool_mode = transaction\n"
	             "server_reset_query =\n"
	             "verbose = 2\n"
	             "[databases]\n"
	             "x = port=1234\n"
	             "[pgbouncer]\n"
	             "pool_mode = statement\n");
	assert_int_equal(cf.g.max_client_conn, 100); /* back to the default */
	assert_string_equal(cf.g.server_reset_query, "DISCARD ALL");
	assert_int_equal(cf.g.listen_port, 6432); /* boot-only too, as PgBouncer at start */
	assert_int_equal(cf.g.pool_mode, POOL_STATEMENT);
	assert_int_equal(cf.g.verbose, 2); /* no default to re-apply */
	assert_string_equal(cf.g.conffile, last_path);
	assert_int_equal(config_find_db(&cf, "x")->port, 1234);
	config_free(&cf);
}

static void test_verbose_keeps_preset(void **state)
{
	(void)state;
	Config cf;

	write_fixture("verbose.ini", "[pgbouncer]\nlisten_port = 7002\n", last_path);
	config_init(&cf);
	assert_int_equal(cf.g.verbose, 0);
	cf.g.verbose = 3; /* e.g. the -v count */
	assert_true(config_load(&cf, last_path, err, sizeof(err)));
	assert_int_equal(cf.g.verbose, 3);
	config_free(&cf);

	write_fixture("verbose.ini", "[pgbouncer]\nverbose = 1\n", last_path);
	config_init(&cf);
	cf.g.verbose = 3;
	assert_true(config_load(&cf, last_path, err, sizeof(err)));
	assert_int_equal(cf.g.verbose, 1);
	config_free(&cf);
}

/* ---------------------------------------------------------------------- */
/* %include */

static void test_include_nested_relative_to_cwd(void **state)
{
	(void)state;
	Config cf;
	char main_path[PATH_MAX];

	/* inc1.ini exists in the CWD (tmpdir) and, as a decoy, beside main.ini */
	write_fixture("sub/main.ini",
	              "[databases]\n"
	              "%include inc1.ini\n"
	              "max_client_conn = 8\n"
	              "  %include   inc3.ini   \n",
	              main_path);
	write_fixture("sub/inc1.ini", "this is not valid\n", NULL);
	write_fixture("inc1.ini", "db1 = port=5431\n%include inc2.ini\n", NULL);
	write_fixture("inc2.ini", "db2 = port=5432\n[pgbouncer]\nlisten_port = 7100\n", NULL);
	write_fixture("inc3.ini", "[databases]\ndb3 = port=5433\n", NULL);

	assert_int_equal(chdir(tmpdir), 0);
	config_init(&cf);
	bool ok = config_load(&cf, main_path, err, sizeof(err));
	assert_int_equal(chdir(saved_cwd), 0);
	if (!ok)
		fail_msg("load failed: %s", err);
	assert_int_equal(cf.n_dbs, 3);
	assert_int_equal(config_find_db(&cf, "db1")->port, 5431);
	assert_int_equal(config_find_db(&cf, "db2")->port, 5432);
	assert_int_equal(config_find_db(&cf, "db3")->port, 5433);
	assert_int_equal(cf.g.listen_port, 7100);
	/* the section state of inc2.ini carried over into main.ini */
	assert_int_equal(cf.g.max_client_conn, 8);
	assert_string_equal(cf.g.conffile, main_path);
	config_free(&cf);
}

static void test_include_errors(void **state)
{
	(void)state;
	Config cf;
	char main_path[PATH_MAX], want[CF_ERRMSG_LEN + PATH_MAX];

	assert_int_equal(chdir(tmpdir), 0);

	write_fixture("imain.ini", "[pgbouncer]\n%include nothere.ini\n", main_path);
	config_init(&cf);
	assert_false(config_load(&cf, main_path, err, sizeof(err)));
	snprintf(want, sizeof(want), "%s:2: could not read included file \"nothere.ini\": No such file or directory",
	         main_path);
	assert_string_equal(err, want);
	config_free(&cf);

	/* an error inside an included file names that file and its line */
	write_fixture("ibad.ini", "listen_port = 7000\nbogus = 1\n", NULL);
	write_fixture("imain.ini", "[pgbouncer]\n%include ibad.ini\n", main_path);
	config_init(&cf);
	assert_false(config_load(&cf, main_path, err, sizeof(err)));
	assert_string_equal(err, "ibad.ini:2: unknown parameter: pgbouncer/bogus");
	config_free(&cf);

	/* a file including itself hits the depth limit */
	write_fixture("self.ini", "[pgbouncer]\n%include self.ini\n", NULL);
	config_init(&cf);
	assert_false(config_load(&cf, "self.ini", err, sizeof(err)));
	assert_string_equal(err, "self.ini:2: %include nesting too deep (max 10 levels): self.ini");
	config_free(&cf);

	assert_int_equal(chdir(saved_cwd), 0);
}

/* main.ini -> c1.ini -> ... -> c<depth>.ini; the last one sets max_client_conn. */
static bool load_include_chain(Config *cf, int depth)
{
	char name[32], content[64], main_path[PATH_MAX];

	for (int i = 1; i <= depth; i++) {
		snprintf(name, sizeof(name), "c%d.ini", i);
		if (i < depth)
			snprintf(content, sizeof(content), "%%include c%d.ini\n", i + 1);
		else
			snprintf(content, sizeof(content), "max_client_conn = %d\n", 1000 + depth);
		write_fixture(name, content, NULL);
	}
	write_fixture("chain.ini", "[pgbouncer]\n%include c1.ini\n", main_path);
	assert_int_equal(chdir(tmpdir), 0);
	config_init(cf);
	bool ok = config_load(cf, main_path, err, sizeof(err));
	assert_int_equal(chdir(saved_cwd), 0);
	return ok;
}

static void test_include_depth(void **state)
{
	(void)state;
	Config cf;

	if (!load_include_chain(&cf, CF_MAX_INCLUDE_DEPTH))
		fail_msg("depth 10 failed: %s", err);
	assert_int_equal(cf.g.max_client_conn, 1010);
	config_free(&cf);

	assert_false(load_include_chain(&cf, CF_MAX_INCLUDE_DEPTH + 1));
	assert_string_equal(err, "c10.ini:1: %include nesting too deep (max 10 levels): c11.ini");
	config_free(&cf);
}

/* ---------------------------------------------------------------------- */
/* [databases], [users], [peers] */

static void test_databases(void **state)
{
	(void)state;
	Config cf;
	const CfDatabase *db;

	load_ok(&cf, "[pgbouncer]\n"
	             "[databases]\n"
	             "full = dbname=real host=db.example port=6543 user=u password=p auth_user=au "
	             "auth_query='SELECT p FROM f($1) WHERE x = ''y''' auth_dbname=adb pool_size=7 min_pool_size=2 "
	             "reserve_pool=3 max_db_connections=11 max_db_client_connections=12 server_lifetime=99 "
	             "pool_mode=Transaction load_balance_hosts=disable connect_query='SET a=1; SET b=2' "
	             "client_encoding=UTF8 datestyle=ISO timezone=UTC application_name=app query_wait_timeout=9\n"
	             "spaced = host = h1   port =  5433\n"
	             "empty =\n"
	             "* = host=fallback\n"
	             "garbage = pool_size=abc min_pool_size=5x\n"
	             "alias = reserve_pool_size=4 host=a,b,c\n"
	             "dup = port=1000\n"
	             "second = port=1\n"
	             "dup = port=2000\n");
	assert_int_equal(cf.n_dbs, 8);

	db = config_find_db(&cf, "full");
	assert_non_null(db);
	assert_string_equal(db->name, "full");
	assert_string_equal(db->dbname, "real");
	assert_string_equal(db->host, "db.example");
	assert_int_equal(db->port, 6543);
	assert_string_equal(db->user, "u");
	assert_string_equal(db->password, "p");
	assert_string_equal(db->auth_user, "au");
	assert_string_equal(db->auth_query, "SELECT p FROM f($1) WHERE x = 'y'");
	assert_string_equal(db->auth_dbname, "adb");
	assert_int_equal(db->pool_size, 7);
	assert_int_equal(db->min_pool_size, 2);
	assert_int_equal(db->reserve_pool_size, 3);
	assert_int_equal(db->max_db_connections, 11);
	assert_int_equal(db->max_db_client_connections, 12);
	assert_int_equal(db->server_lifetime, 99);
	assert_int_equal(db->pool_mode, POOL_TRANSACTION);
	assert_int_equal(db->load_balance_hosts, LB_DISABLE);
	assert_string_equal(db->connect_query, "SET a=1; SET b=2");
	assert_string_equal(db->client_encoding, "UTF8");
	assert_string_equal(db->datestyle, "ISO");
	assert_string_equal(db->timezone, "UTC");
	assert_string_equal(db->application_name, "app");
	assert_int_equal(db->query_wait_timeout, 9);
	assert_int_equal(db->line, 3);
	assert_non_null(strstr(db->connstr, "connect_query='SET a=1; SET b=2'"));
	assert_int_equal(strncmp(db->connstr, "dbname=real host=db.example", 27), 0);

	db = config_find_db(&cf, "spaced");
	assert_string_equal(db->host, "h1");
	assert_int_equal(db->port, 5433);
	assert_string_equal(db->connstr, "host = h1   port =  5433");

	db = config_find_db(&cf, "empty");
	assert_string_equal(db->connstr, "");
	assert_null(db->dbname);
	assert_null(db->host);
	assert_null(db->user);
	assert_int_equal(db->port, 5432);
	assert_int_equal(db->pool_size, CF_UNSET);
	assert_int_equal(db->min_pool_size, CF_UNSET);
	assert_int_equal(db->reserve_pool_size, CF_UNSET);
	assert_int_equal(db->pool_mode, CF_UNSET);
	assert_int_equal(db->query_wait_timeout, CF_UNSET);
	assert_int_equal(db->server_lifetime, 0);
	assert_int_equal(db->load_balance_hosts, LB_ROUND_ROBIN);

	assert_string_equal(config_find_db(&cf, "*")->host, "fallback");
	assert_int_equal(config_find_db(&cf, "garbage")->pool_size, 0);
	assert_int_equal(config_find_db(&cf, "garbage")->min_pool_size, 5);
	assert_int_equal(config_find_db(&cf, "alias")->reserve_pool_size, 4);
	assert_string_equal(config_find_db(&cf, "alias")->host, "a,b,c");

	/* a repeated name replaces the earlier entry in place */
	db = config_find_db(&cf, "dup");
	assert_int_equal(db->port, 2000);
	assert_int_equal(db->line, 11);
	assert_string_equal(cf.dbs[6].name, "dup");
	assert_string_equal(cf.dbs[7].name, "second");
	assert_null(config_find_db(&cf, "nosuch"));
	assert_null(config_find_db(&cf, "FULL"));
	config_free(&cf);
}

static void test_database_errors(void **state)
{
	(void)state;
	char name63[64], name64[65], text[256], want[256];
	Config cf;

	expect_load_error("[pgbouncer]\n[databases]\npgbouncer = port=5432\n",
	                  "3: database name \"pgbouncer\" is reserved");
	expect_load_error("[pgbouncer]\n[databases]\n'pgbouncer' =\n", "3: database name \"pgbouncer\" is reserved");

	memset(name63, 'a', 63);
	name63[63] = '\0';
	memset(name64, 'b', 64);
	name64[64] = '\0';
	snprintf(text, sizeof(text), "[pgbouncer]\n[databases]\n%s = port=1\n", name63);
	load_ok(&cf, text);
	assert_int_equal(config_find_db(&cf, name63)->port, 1);
	config_free(&cf);
	snprintf(text, sizeof(text), "[pgbouncer]\n[databases]\n\n%s = port=1\n", name64);
	snprintf(want, sizeof(want), "4: database name \"%s\" is too long (max 63 bytes)", name64);
	expect_load_error(text, want);

	expect_load_error("[pgbouncer]\n[databases]\nd = host=x foo=1\n", "3: unrecognized connection parameter: foo");
	expect_load_error("[pgbouncer]\n[databases]\nd = Host=x\n", "3: unrecognized connection parameter: Host");
	expect_load_error("[pgbouncer]\n[databases]\nd = port=0\n", "3: invalid port: \"0\"");
	expect_load_error("[pgbouncer]\n[databases]\nd = port=abc\n", "3: invalid port: \"abc\"");
	expect_load_error("[pgbouncer]\n[databases]\nd = port=70000\n", "3: invalid port: \"70000\"");
	expect_load_error("[pgbouncer]\n[databases]\nd = host=''\n", "3: empty value for connection parameter: host");
	expect_load_error("[pgbouncer]\n[databases]\nd = port=5 host=\n",
	                  "3: empty value for connection parameter: host");
	expect_load_error("[pgbouncer]\n[databases]\nd = host='abc\n",
	                  "3: syntax error in connection string: unterminated quoted value for host");
	expect_load_error("[pgbouncer]\n[databases]\nd = host='a'b\n",
	                  "3: syntax error in connection string: garbage after quoted value of host");
	expect_load_error("[pgbouncer]\n[databases]\nd = host\n",
	                  "3: syntax error in connection string: missing \"=\" after \"host\"");
	expect_load_error("[pgbouncer]\n[databases]\nd = =x\n",
	                  "3: syntax error in connection string: missing key before \"=\"");
	expect_load_error("[pgbouncer]\n[databases]\nd = pool_mode=bogus\n",
	                  "3: invalid value \"bogus\" for pool_mode");
	expect_load_error("[pgbouncer]\n[databases]\nd = load_balance_hosts=random\n",
	                  "3: invalid value \"random\" for load_balance_hosts");
}

static void test_users(void **state)
{
	(void)state;
	Config cf;
	const CfUser *u;

	load_ok(&cf, "[pgbouncer]\n"
	             "[users]\n"
	             "alice = pool_mode=statement pool_size=3 reserve_pool_size=1 max_user_connections=4 "
	             "max_user_client_connections=5 query_timeout=6 idle_transaction_timeout=7 transaction_timeout=8 "
	             "client_idle_timeout=9 query_wait_timeout=0\n"
	             "bob =\n"
	             "'carol x' = pool_size = 2\n");
	assert_int_equal(cf.n_users, 3);
	u = config_find_user(&cf, "alice");
	assert_non_null(u);
	assert_int_equal(u->pool_mode, POOL_STATEMENT);
	assert_int_equal(u->pool_size, 3);
	assert_int_equal(u->reserve_pool_size, 1);
	assert_int_equal(u->max_user_connections, 4);
	assert_int_equal(u->max_user_client_connections, 5);
	assert_int_equal(u->query_timeout, 6);
	assert_int_equal(u->idle_transaction_timeout, 7);
	assert_int_equal(u->transaction_timeout, 8);
	assert_int_equal(u->client_idle_timeout, 9);
	assert_int_equal(u->query_wait_timeout, 0);
	assert_int_equal(u->line, 3);

	u = config_find_user(&cf, "bob");
	assert_int_equal(u->pool_mode, CF_UNSET);
	assert_int_equal(u->pool_size, CF_UNSET);
	assert_int_equal(u->reserve_pool_size, CF_UNSET);
	assert_int_equal(u->query_wait_timeout, CF_UNSET);
	assert_int_equal(u->query_timeout, 0);
	assert_int_equal(config_find_user(&cf, "carol x")->pool_size, 2);
	assert_null(config_find_user(&cf, "Alice"));
	config_free(&cf);

	expect_load_error("[pgbouncer]\n[users]\nu = host=x\n", "3: unrecognized user parameter: host");
	expect_load_error("[pgbouncer]\n[users]\nu = pool_mode=x\n", "3: invalid value \"x\" for pool_mode");
}

static void test_peers(void **state)
{
	(void)state;
	Config cf;
	const CfPeer *p;

	load_ok(&cf, "[pgbouncer]\n"
	             "peer_id = 1\n"
	             "[peers]\n"
	             "1 = host=/tmp port=7001 pool_size=3\n"
	             "65535 = host=peer.example\n");
	assert_int_equal(cf.n_peers, 2);
	p = config_find_peer(&cf, 1);
	assert_non_null(p);
	assert_string_equal(p->host, "/tmp");
	assert_int_equal(p->port, 7001);
	assert_int_equal(p->pool_size, 3);
	p = config_find_peer(&cf, 65535);
	assert_string_equal(p->host, "peer.example");
	assert_int_equal(p->port, 6432);
	assert_int_equal(p->pool_size, CF_UNSET);
	assert_null(config_find_peer(&cf, 2));
	config_free(&cf);

	expect_load_error("[pgbouncer]\n[peers]\n0 = host=h\n",
	                  "3: invalid peer id \"0\": must be an integer from 1 to 65535");
	expect_load_error("[pgbouncer]\n[peers]\n65536 = host=h\n",
	                  "3: invalid peer id \"65536\": must be an integer from 1 to 65535");
	expect_load_error("[pgbouncer]\n[peers]\nabc = host=h\n",
	                  "3: invalid peer id \"abc\": must be an integer from 1 to 65535");
	expect_load_error("[pgbouncer]\n[peers]\n2 = port=5\n", "3: host was not provided for peer 2");
	expect_load_error("[pgbouncer]\n[peers]\n3 = host=h user=x\n", "3: unrecognized peer parameter: user");
	expect_load_error("[pgbouncer]\n[peers]\n3 = host=h port=0\n", "3: invalid port: \"0\"");
}

/* ---------------------------------------------------------------------- */
/* validation */

/* Apply name=value pairs to a fresh config and check config_validate's answer. */
static void expect_validate(const char *const *settings, const char *want)
{
	Config cf;
	char e[CF_ERRMSG_LEN];

	config_init(&cf);
	for (const char *const *s = settings; *s; s += 2)
		set_ok(&cf, s[0], s[1]);
	e[0] = '\0';
	bool ok = config_validate(&cf, e, sizeof(e));
	if (want) {
		if (ok)
			fail_msg("validation passed, expected: %s", want);
		assert_string_equal(e, want);
	} else if (!ok) {
		fail_msg("validation failed: %s", e);
	}
	config_free(&cf);
}

#define V(...) ((const char *const[]){__VA_ARGS__, NULL})

/* config_validate() refuses worker settings by their ranges and worker_bounds_check() (test_worker_bounds.c has every bound) */
static void test_validate_workers(void **state)
{
	(void)state;
	expect_validate(V("min_workers", "4", "max_workers", "2"),
	                "min_workers must be between 1 and max_workers (2) (got 4)");
	expect_validate(V("min_workers", "2", "max_workers", "2"), NULL);
	expect_validate(V("min_workers", "8", "max_workers", "0"), NULL); /* 0 = one per core */
	expect_validate(V("min_workers", "70"), "min_workers must be between 1 and 64 (got 70)");
	expect_validate(V("max_workers", "100"), NULL); /* clamped to 64 by the master, with a log line */
	expect_validate(V("worker_scale_up_samples", "129"),
	                "worker_scale_up_samples must be between 1 and 128 (got 129)");
	expect_validate(V("worker_scale_interval", "0.1", "worker_scale_cooldown", "0", "worker_drain_timeout", "2.5"),
	                NULL);
}

static void test_validate_other(void **state)
{
	(void)state;
	expect_validate(V("listen_port", "0"), "listen_port must be between 1 and 65535 (got 0)");
	expect_validate(V("listen_port", "65536"), "listen_port must be between 1 and 65535 (got 65536)");
	expect_validate(V("listen_port", "65535"), NULL);
	expect_validate(V("pkt_buf", "511"), "pkt_buf must be at least 512 (got 511)");
	expect_validate(V("pkt_buf", "512"), NULL);
	expect_validate(V("peer_id", "16384"), "peer_id must be between 0 and 16383 (got 16384)");
	expect_validate(V("peer_id", "16383"), NULL);
	expect_validate(V("unix_socket_mode", "010000"), "unix_socket_mode must be between 0 and 4095 (got 4096)");

	/* through the loader the message carries the file name */
	Config cf;
	char want[CF_ERRMSG_LEN + PATH_MAX];
	assert_false(load_text(&cf, "[pgbouncer]\nmin_workers = 4\nmax_workers = 2\n"));
	snprintf(want, sizeof(want), "%s: min_workers must be between 1 and max_workers (2) (got 4)", last_path);
	assert_string_equal(err, want);
	config_free(&cf);
}

/* ---------------------------------------------------------------------- */
/* the ranges of the parameter table */

/* Every numeric row has a range that holds its default; the others have none. */
static void test_range_table(void **state)
{
	(void)state;
	Config cf;
	char e[CF_ERRMSG_LEN];
	config_init(&cf);
	for (const CfParam *p = cf_params; p->name; p++) {
		bool numeric = p->type == CF_INT || p->type == CF_UINT || p->type == CF_TIME || p->type == CF_REAL;
		if (!numeric) {
			if (p->min != 0 || p->max != 0 || p->min_excl)
				fail_msg("%s: a range on a non-numeric parameter", p->name);
			continue;
		}
		if (!(p->min < p->max))
			fail_msg("%s: empty range [%g, %g]", p->name, p->min, p->max);
		if (p->type == CF_TIME && (p->min < 0 || p->max > CF_TIME_MAX_SEC))
			fail_msg("%s: time range beyond 0..CF_TIME_MAX_SEC", p->name);
		if (!config_check_range(&cf, p, e, sizeof(e)))
			fail_msg("default out of range: %s", e);
	}
	config_free(&cf);
}

/* Set name = value (parsing must accept it) and expect config_check_range()'s answer. */
static void expect_range(const char *name, const char *value, const char *want)
{
	Config cf;
	char e[CF_ERRMSG_LEN] = "";
	const CfParam *p = config_find_param(name);
	assert_non_null(p);
	config_init(&cf);
	set_ok(&cf, name, value);
	bool ok = config_check_range(&cf, p, e, sizeof(e));
	if (want) {
		if (ok)
			fail_msg("%s = %s in range, expected: %s", name, value, want);
		assert_string_equal(e, want);
		/* config_validate() says the same */
		e[0] = '\0';
		assert_false(config_validate(&cf, e, sizeof(e)));
		assert_string_equal(e, want);
	} else if (!ok) {
		fail_msg("%s = %s refused: %s", name, value, e);
	}
	config_free(&cf);
}

static void test_range_check(void **state)
{
	(void)state;
	/* ints: both bounds, and "at least" when the top is the type's */
	expect_range("default_pool_size", "-1", "default_pool_size must be at least 0 (got -1)");
	expect_range("default_pool_size", "0", NULL);
	expect_range("default_pool_size", "2147483647", NULL);
	expect_range("max_client_conn", "-5", "max_client_conn must be at least 0 (got -5)");
	expect_range("listen_port", "0x10000", "listen_port must be between 1 and 65535 (got 65536)");
	expect_range("scram_iterations", "0", "scram_iterations must be at least 1 (got 0)");
	expect_range("stats_period", "0", "stats_period must be at least 1 (got 0)");
	expect_range("min_workers", "65", "min_workers must be between 1 and 64 (got 65)");
	expect_range("metrics_max_connections", "0", "metrics_max_connections must be at least 1 (got 0)");
	expect_range("metrics_max_connections", "1", NULL);
	/* times: seconds, as written, with fractions; the top keeps deadlines from overflowing */
	expect_range("query_timeout", "2147483647", NULL);
	expect_range("query_timeout", "2147483648",
	             "query_timeout must be between 0 and 2147483647 seconds (got 2147483648)");
	expect_range("server_lifetime", "99999999999.25",
	             "server_lifetime must be between 0 and 2147483647 seconds (got 99999999999.25)");
	expect_range("worker_scale_interval", "0",
	             "worker_scale_interval must be above 0 and at most 2147483647 seconds (got 0)");
	expect_range("worker_scale_interval", "0.000001", NULL);
	/* reals: the bottom excluded */
	expect_range("worker_scale_up_threshold", "0",
	             "worker_scale_up_threshold must be above 0 and at most 1 (got 0)");
	expect_range("worker_scale_up_threshold", "1", NULL);
	/* enums, bools and strings have no range beyond their syntax */
	expect_range("pool_mode", "statement", NULL);
	expect_range("server_round_robin", "-7", NULL);
	expect_range("admin_users", "", NULL);
}

/* What each type accepts, in words: the text SET and the loader put after "must be". */
static void test_range_text(void **state)
{
	(void)state;
	char buf[256];
	static const struct {
		const char *name, *text;
	} cases[] = {
	    {"listen_port", "between 1 and 65535"},
	    {"default_pool_size", "at least 0"},
	    {"max_packet_size", "at least 0"},
	    {"query_timeout", "between 0 and 2147483647 seconds"},
	    {"worker_scale_interval", "above 0 and at most 2147483647 seconds"},
	    {"worker_scale_down_threshold", "above 0 and at most 1"},
	    {"pool_mode", "one of session, transaction, statement"},
	    {"log_connections", "an integer (0 = off, anything else = on)"},
	    {"logfile", "any text"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		config_range_text(config_find_param(cases[i].name), buf, sizeof(buf));
		assert_string_equal(buf, cases[i].text);
	}
	/* a value that does not parse gets the same words */
	Config cf;
	char e[CF_ERRMSG_LEN];
	config_init(&cf);
	assert_false(config_set(&cf, "pool_mode", "sessions", e, sizeof(e)));
	assert_string_equal(e, "invalid value \"sessions\" for parameter pool_mode: must be one of session, "
	                       "transaction, statement");
	assert_false(config_set(&cf, "worker_scale_up_threshold", "high", e, sizeof(e)));
	assert_string_equal(e, "invalid value \"high\" for parameter worker_scale_up_threshold: must be a decimal "
	                       "number, above 0 and at most 1");
	config_free(&cf);
}

/* ---------------------------------------------------------------------- */
/* whole-Config operations */

static void test_keep_boot_values(void **state)
{
	(void)state;
	Config running, loaded;

	config_init(&running);
	set_ok(&running, "listen_port", "7000");
	set_ok(&running, "pidfile", "/run/a.pid");
	set_ok(&running, "max_client_conn", "10");
	config_init(&loaded);
	set_ok(&loaded, "listen_port", "8000");
	set_ok(&loaded, "pidfile", "/x.pid");
	set_ok(&loaded, "user", "nobody");
	set_ok(&loaded, "max_client_conn", "9");
	config_keep_boot_values(&loaded, &running);
	assert_int_equal(loaded.g.listen_port, 7000);
	assert_string_equal(loaded.g.pidfile, "/run/a.pid");
	assert_null(loaded.g.user);
	assert_int_equal(loaded.g.max_client_conn, 9);
	config_free(&running);
	config_free(&loaded);
}

static void test_copy(void **state)
{
	(void)state;
	Config cf, copy;

	load_ok(&cf, "[pgbouncer]\nauth_file = /etc/u.txt\n"
	             "[databases]\nd1 = host=h1 connect_query='SELECT 1'\nd2 =\n"
	             "[users]\nu1 = pool_size=4\n"
	             "[peers]\n7 = host=p7\n");
	assert_true(config_copy(&copy, &cf));
	config_free(&cf);
	assert_null(cf.dbs);
	assert_int_equal(cf.n_dbs, 0);

	assert_string_equal(copy.g.auth_file, "/etc/u.txt");
	assert_string_equal(copy.g.server_reset_query, "DISCARD ALL");
	assert_string_equal(copy.g.conffile, last_path);
	assert_string_equal(copy.path, last_path);
	assert_int_equal(copy.n_dbs, 2);
	assert_string_equal(config_find_db(&copy, "d1")->host, "h1");
	assert_string_equal(config_find_db(&copy, "d1")->connect_query, "SELECT 1");
	assert_string_equal(config_find_db(&copy, "d1")->connstr, "host=h1 connect_query='SELECT 1'");
	assert_int_equal(config_find_user(&copy, "u1")->pool_size, 4);
	assert_string_equal(config_find_peer(&copy, 7)->host, "p7");

	/* the copy is independent: changing it does not touch a second copy */
	Config copy2;
	assert_true(config_copy(&copy2, &copy));
	set_ok(&copy, "auth_file", "/other");
	assert_string_equal(copy2.g.auth_file, "/etc/u.txt");
	config_free(&copy);
	config_free(&copy2);
}

static void test_format(void **state)
{
	(void)state;
	Config cf;
	char buf[CF_ERRMSG_LEN];
	const CfParam *p;

	config_init(&cf);
	assert_null(value_of(&cf, "auth_file", buf, sizeof(buf)));
	assert_string_equal(value_of(&cf, "admin_users", buf, sizeof(buf)), "");
	assert_string_equal(value_of(&cf, "server_lifetime", buf, sizeof(buf)), "3600");
	assert_string_equal(value_of(&cf, "auth_type", buf, sizeof(buf)), "md5");
	assert_string_equal(value_of(&cf, "max_packet_size", buf, sizeof(buf)), "2147483647");
	assert_string_equal(value_of(&cf, "verbose", buf, sizeof(buf)), "0");
	set_ok(&cf, "auth_file", "/etc/userlist.txt");
	assert_string_equal(value_of(&cf, "auth_file", buf, sizeof(buf)), "/etc/userlist.txt");
	set_ok(&cf, "worker_scale_cooldown", "2.25");
	assert_string_equal(value_of(&cf, "worker_scale_cooldown", buf, sizeof(buf)), "2.25");

	p = config_find_param("unix_socket_mode");
	assert_true(config_format_default(p, buf, sizeof(buf)));
	assert_string_equal(buf, "0777"); /* as written; the value is decimal, "511" */
	p = config_find_param("auth_dbname");
	assert_false(config_format_default(p, buf, sizeof(buf)));
	p = config_find_param("verbose");
	assert_false(config_format_default(p, buf, sizeof(buf)));
	/* a small buffer truncates but terminates */
	p = config_find_param("auth_query");
	assert_true(config_format_default(p, buf, 7));
	assert_string_equal(buf, "SELECT");

	assert_string_equal(config_enum_name(cf_pool_modes, POOL_STATEMENT), "statement");
	assert_string_equal(config_enum_name(cf_pool_modes, 99), "?");
	assert_string_equal(config_enum_name(cf_sslmodes, SSLMODE_VERIFY_CA), "verify-ca");
	assert_string_equal(config_enum_name(cf_auth_types, AUTH_SCRAM_SHA_256), "scram-sha-256");
	int v = -1;
	assert_true(config_enum_parse(cf_sslmodes, "VERIFY-CA", &v));
	assert_int_equal(v, SSLMODE_VERIFY_CA);
	assert_false(config_enum_parse(cf_sslmodes, "verify", &v));
	assert_int_equal(v, SSLMODE_VERIFY_CA);
	config_free(&cf);
}

static void test_list_contains(void **state)
{
	(void)state;
	assert_true(config_list_contains("admin, bob", "bob"));
	assert_true(config_list_contains("admin, bob", "admin"));
	assert_false(config_list_contains("admin, bob", "Admin"));
	assert_false(config_list_contains("admin, bob", "adm"));
	assert_false(config_list_contains("admin, bob", "bo"));
	assert_false(config_list_contains("admin, bob", "admin, bob"));
	assert_true(config_list_contains("alice bob,carol\tdave,,  ,erin", "carol"));
	assert_true(config_list_contains("alice bob,carol\tdave,,  ,erin", "dave"));
	assert_true(config_list_contains("alice bob,carol\tdave,,  ,erin", "erin"));
	assert_true(config_list_contains("alice bob,carol\tdave,,  ,erin", "alice"));
	assert_true(config_list_contains("extra_float_digits", "extra_float_digits"));
	assert_false(config_list_contains("", "x"));
	assert_false(config_list_contains(NULL, "x"));
	assert_false(config_list_contains("a,b", ""));
}

#ifdef HAVE_LDAP
/*
 * auth_ldap_options is read when it is set, so that a mistake is refused
 * with its line, naming the word; auth_type = ldap needs it (doc/ldap.md).
 */
static void test_ldap_options_setting(void **state)
{
	(void)state;
	Config cf;
	load_ok(&cf, "[pgbouncer]\nauth_type = ldap\n"
	             "auth_ldap_options = ldapserver=\"h1 h2\" ldapprefix=\"uid=\" ldapsuffix=\",dc=x\"\n");
	assert_int_equal(cf.g.auth_type, AUTH_LDAP);
	config_free(&cf);
	expect_load_error("[pgbouncer]\nauth_ldap_options = ldapserver=h ldapprefix=uid= ldapfoo=1\n",
	                  "2: invalid auth_ldap_options: unrecognized LDAP option \"ldapfoo\"");
	expect_load_error("[pgbouncer]\nauth_ldap_options = ldapserver=h ldapprefix=uid= ldapbasedn=dc=x\n",
	                  "2: invalid auth_ldap_options: ldapbasedn cannot be used with ldapprefix or ldapsuffix: "
	                  "search+bind and simple bind do not mix");
	expect_load_error("[pgbouncer]\nauth_ldap_options = ldapserver=h ldapprefix=\"uid=\n",
	                  "2: invalid auth_ldap_options: unterminated quoted string");
	expect_load_error("[pgbouncer]\nauth_type = ldap\n", " auth_type ldap needs auth_ldap_options (doc/ldap.md)");
	/* SET keeps the old value on a mistake */
	config_init(&cf);
	char e[CF_ERRMSG_LEN];
	set_ok(&cf, "auth_ldap_options", "ldapserver=h ldapbasedn=dc=x");
	assert_false(
	    config_set_checked(&cf, "auth_ldap_options", "ldapserver=h ldapbasedn=dc=x ldaptls=yes", e, sizeof(e)));
	assert_string_equal(e, "invalid auth_ldap_options: invalid ldaptls \"yes\": must be 1 or 0");
	assert_string_equal(cf.g.auth_ldap_options, "ldapserver=h ldapbasedn=dc=x");
	set_ok(&cf, "auth_ldap_options", "");
	set_ok(&cf, "auth_type", "ldap");
	assert_false(config_validate(&cf, e, sizeof(e)));
	config_free(&cf);
}
#endif

/* Unimplemented parameters are accepted; a non-default value logs a warning. */
static void test_unimplemented_warns(void **state)
{
	(void)state;
	char logpath[PATH_MAX];
	Config cf;

	snprintf(logpath, sizeof(logpath), "%s/warn.log", tmpdir);
	LogSettings ls = {.logfile = logpath, .to_stderr = false};
	log_configure(&ls);

	config_init(&cf);
	set_ok(&cf, "job_name", "pgbouncer"); /* the default: no warning */
	set_ok(&cf, "dns_zone_check_period", "0");
	set_ok(&cf, "auth_ldap_options", "");
	char *text = read_file(logpath, NULL);
	assert_true(text == NULL || strstr(text, "not implemented") == NULL);
	free(text);

	set_ok(&cf, "job_name", "other");
	set_ok(&cf, "dns_zone_check_period", "60");
	set_ok(&cf, "service_name", "svc");
	assert_string_equal(cf.g.job_name, "other");
	assert_int_equal(cf.g.dns_zone_check_period, 60 * USEC_PER_SEC);
	assert_string_equal(cf.g.service_name, "svc");
	text = read_file(logpath, NULL);
	assert_non_null(text);
	assert_non_null(
	    strstr(text, "WARNING parameter job_name is accepted but not implemented; the value is ignored"));
	assert_non_null(strstr(text, "parameter dns_zone_check_period is accepted but not implemented"));
	assert_non_null(strstr(text, "parameter service_name is accepted but not implemented"));
	free(text);
	config_free(&cf);

	LogSettings back = {.to_stderr = true};
	log_configure(&back);
}

/* Which settings rebuild the TLS contexts or the log on a console SET (worker and master alike). */
static void test_param_kinds(void **state)
{
	(void)state;
	const char *tls[] = {"client_tls_sslmode", "client_tls_key_file", "server_tls_ca_file", "client_tls13_ciphers"};
	for (size_t k = 0; k < sizeof(tls) / sizeof(tls[0]); k++) {
		assert_non_null(config_find_param(tls[k]));
		assert_true(config_param_is_tls(config_find_param(tls[k])));
		assert_false(config_param_is_log(config_find_param(tls[k])));
	}
	const char *log[] = {"verbose", "logfile", "syslog", "syslog_ident", "syslog_facility"};
	for (size_t k = 0; k < sizeof(log) / sizeof(log[0]); k++) {
		assert_non_null(config_find_param(log[k]));
		assert_true(config_param_is_log(config_find_param(log[k])));
		assert_false(config_param_is_tls(config_find_param(log[k])));
	}
	const CfParam *other = config_find_param("default_pool_size");
	assert_false(config_param_is_tls(other) || config_param_is_log(other));
	assert_false(config_param_is_tls(config_find_param("auth_type"))); /* the console treats it apart */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_param_table_matches_spec),
	    cmocka_unit_test(test_param_flags),
	    cmocka_unit_test(test_init_values_are_defaults),
	    cmocka_unit_test(test_int_syntax),
	    cmocka_unit_test(test_bool_syntax),
	    cmocka_unit_test(test_time_syntax),
	    cmocka_unit_test(test_real_and_enum_syntax),
	    cmocka_unit_test(test_string_syntax),
	    cmocka_unit_test(test_comments_and_whitespace),
	    cmocka_unit_test(test_quoted_keys),
	    cmocka_unit_test(test_syntax_errors),
	    cmocka_unit_test(test_semantic_errors),
	    cmocka_unit_test(test_missing_main_section),
	    cmocka_unit_test(test_repeated_main_section),
	    cmocka_unit_test(test_verbose_keeps_preset),
	    cmocka_unit_test(test_include_nested_relative_to_cwd),
	    cmocka_unit_test(test_include_errors),
	    cmocka_unit_test(test_include_depth),
	    cmocka_unit_test(test_databases),
	    cmocka_unit_test(test_database_errors),
	    cmocka_unit_test(test_users),
	    cmocka_unit_test(test_peers),
	    cmocka_unit_test(test_validate_workers),
	    cmocka_unit_test(test_validate_other),
	    cmocka_unit_test(test_range_table),
	    cmocka_unit_test(test_range_check),
	    cmocka_unit_test(test_range_text),
	    cmocka_unit_test(test_keep_boot_values),
	    cmocka_unit_test(test_copy),
	    cmocka_unit_test(test_format),
	    cmocka_unit_test(test_list_contains),
	    cmocka_unit_test(test_unimplemented_warns),
	    cmocka_unit_test(test_param_kinds),
#ifdef HAVE_LDAP
	    cmocka_unit_test(test_ldap_options_setting),
#endif
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
