/*
 * Configuration: the parameter table of [pgbouncer], the [databases],
 * [users] and [peers] sections, and the ini loader that fills a Config.
 * A Config is a plain value: loading builds a new one, and only a load that
 * succeeded replaces the running one (so a broken reload changes nothing).
 */
#ifndef PGB_COMMON_CONFIG_H
#define PGB_COMMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef int64_t usec_t; /* microseconds */

#define USEC_PER_SEC         ((usec_t)1000000)
#define CF_ERRMSG_LEN        512
#define CF_MAX_INCLUDE_DEPTH 10
#define CF_MAX_DBNAME        64 /* database names must be shorter than this */

/* Types of [pgbouncer] parameters, as doc/pgbouncer.5.md ("Value types") names them. */
typedef enum CfType {
	CF_INT,    /* int, strtol base auto-detect */
	CF_UINT,   /* unsigned int (max_packet_size) */
	CF_BOOL,   /* an int: 0 = off, anything else = on */
	CF_TIME,   /* seconds with optional fraction; stored as usec_t */
	CF_REAL,   /* fraction such as 0.75 (scaler thresholds); stored as double */
	CF_ENUM,   /* word from a fixed list, case-insensitive; stored as int */
	CF_STRING, /* raw value, NULL when unset; stored as char * */
	CF_LIST,   /* comma-separated list; stored raw as char * */
} CfType;

typedef struct CfEnum {
	const char *name; /* canonical lower-case word */
	int value;
} CfEnum;

/* Enumerations used by parameters and connection strings. */
enum {
	AUTH_ANY,
	AUTH_TRUST,
	AUTH_PLAIN,
	AUTH_MD5,
	AUTH_CERT,
	AUTH_HBA,
	AUTH_LDAP,
	AUTH_PAM,
	AUTH_SCRAM_SHA_256,
	AUTH_PEER,
	AUTH_REJECT
};
enum { POOL_SESSION, POOL_TRANSACTION, POOL_STATEMENT };
enum { SSLMODE_DISABLE, SSLMODE_ALLOW, SSLMODE_PREFER, SSLMODE_REQUIRE, SSLMODE_VERIFY_CA, SSLMODE_VERIFY_FULL };
enum { LB_ROUND_ROBIN, LB_DISABLE };
enum { AFFINITY_OFF, AFFINITY_CORES };

/* Values of the [pgbouncer] section. Field names are the parameter names. */
typedef struct CfGlobals {
	char *admin_users;
	int application_name_add_host;
	char *auth_dbname;
	char *auth_file;
	char *auth_hba_file;
	char *auth_ident_file;
	char *auth_ldap_options;
	char *auth_query;
	int auth_type;
	char *auth_user;
	usec_t autodb_idle_timeout;
	usec_t cancel_wait_timeout;
	usec_t client_idle_timeout;
	usec_t client_login_timeout;
	char *client_tls13_ciphers;
	char *client_tls_ca_file;
	char *client_tls_cert_file;
	char *client_tls_ciphers;
	char *client_tls_dheparams;
	char *client_tls_ecdhcurve;
	char *client_tls_key_file;
	char *client_tls_protocols;
	int client_tls_sslmode;
	char *conffile;
	int default_pool_size;
	int disable_pqexec;
	usec_t dns_max_ttl;
	usec_t dns_nxdomain_ttl;
	usec_t dns_zone_check_period;
	usec_t idle_transaction_timeout;
	char *ignore_startup_parameters;
	char *job_name;
	char *listen_addr;
	int listen_backlog;
	int listen_port;
	int log_connections;
	int log_disconnections;
	int log_pooler_errors;
	int log_stats;
	char *logfile;
	char *login_notify_message;
	int max_client_conn;
	int max_db_client_connections;
	int max_db_connections;
	unsigned int max_packet_size;
	int max_prepared_statements;
	int max_user_client_connections;
	int max_user_connections;
	int max_workers;
	char *metrics_listen;
	int metrics_max_connections;
	int min_pool_size;
	int min_workers;
	int peer_id;
	char *pidfile;
	int pkt_buf;
	int pool_mode;
	usec_t pool_idle_timeout;
	usec_t query_timeout;
	int query_wait_notify;
	usec_t query_wait_timeout;
	int reserve_pool_size;
	usec_t reserve_pool_timeout;
	char *resolv_conf;
	int sbuf_loopcnt;
	int scram_iterations;
	usec_t server_check_delay;
	char *server_check_query;
	usec_t server_connect_timeout;
	int server_fast_close;
	usec_t server_idle_timeout;
	usec_t server_lifetime;
	usec_t server_login_retry;
	char *server_reset_query;
	int server_reset_query_always;
	int server_round_robin;
	char *server_tls13_ciphers;
	char *server_tls_ca_file;
	char *server_tls_cert_file;
	char *server_tls_ciphers;
	char *server_tls_key_file;
	char *server_tls_protocols;
	int server_tls_sslmode;
	char *service_name;
	int so_reuseport;
	int stats_period;
	char *stats_users;
	usec_t suspend_timeout;
	int syslog;
	char *syslog_facility;
	char *syslog_ident;
	int tcp_defer_accept;
	int tcp_keepalive;
	int tcp_keepcnt;
	int tcp_keepidle;
	int tcp_keepintvl;
	int tcp_socket_buffer;
	int tcp_user_timeout;
	char *track_extra_parameters;
	usec_t transaction_timeout;
	char *unix_socket_dir;
	char *unix_socket_group;
	int unix_socket_mode;
	char *user;
	int verbose;
	int worker_cpu_affinity;
	usec_t worker_drain_timeout;
	usec_t worker_scale_cooldown;
	double worker_scale_down_threshold;
	int worker_scale_down_samples;
	usec_t worker_scale_interval;
	int worker_scale_up_samples;
	double worker_scale_up_threshold;
	char *worker_state_file;
	usec_t worker_watchdog_timeout;
	usec_t worker_orphan_timeout;
} CfGlobals;

/* Sentinel for "not set in this entry; inherit the global value". */
#define CF_UNSET (-1)

/* One [databases] entry. Strings are NULL when not given. */
typedef struct CfDatabase {
	char *name;                    /* entry name clients connect to; "*" = auto-database */
	char *dbname;                  /* server-side database; NULL = name */
	char *host;                    /* host, list, /dir or @abstract; NULL = unix_socket_dir */
	int port;                      /* server port (5432 default) */
	char *user;                    /* forced user */
	char *password;                /* password of the forced user */
	char *auth_user;               /* per-db auth_user */
	char *auth_query;              /* per-db auth_query */
	char *auth_dbname;             /* per-db auth_dbname */
	int pool_size;                 /* CF_UNSET or >= 0 (0 = unlimited) */
	int min_pool_size;             /* CF_UNSET or value */
	int reserve_pool_size;         /* CF_UNSET or value */
	int max_db_connections;        /* <= 0 falls back to the global */
	int max_db_client_connections; /* <= 0 falls back to the global */
	int server_lifetime;           /* seconds; 0 = global */
	int pool_mode;                 /* CF_UNSET or POOL_* */
	int load_balance_hosts;        /* LB_* */
	char *connect_query;           /* run once per new server connection */
	char *client_encoding;         /* sent in the server StartupMessage */
	char *datestyle;
	char *timezone;
	char *application_name;
	int query_wait_timeout; /* seconds; CF_UNSET = inherit */
	char *connstr;          /* the raw connection string, as written */
	int line;               /* where it was defined */
} CfDatabase;

/* One [users] entry. */
typedef struct CfUser {
	char *name;
	int pool_mode;                   /* CF_UNSET or POOL_* */
	int pool_size;                   /* CF_UNSET or value */
	int reserve_pool_size;           /* CF_UNSET or value */
	int max_user_connections;        /* <= 0 falls back to the global */
	int max_user_client_connections; /* <= 0 falls back to the global */
	int query_timeout;               /* seconds; 0 = global */
	int idle_transaction_timeout;    /* seconds; 0 = global */
	int transaction_timeout;         /* seconds; 0 = global */
	int client_idle_timeout;         /* seconds; 0 = global */
	int query_wait_timeout;          /* seconds; CF_UNSET = inherit (0 allowed) */
	int line;
} CfUser;

/* One [peers] entry. */
typedef struct CfPeer {
	int id;        /* 1..65535 */
	char *host;    /* required */
	int port;      /* 6432 default */
	int pool_size; /* CF_UNSET = default_pool_size */
	int line;
} CfPeer;

/* A whole loaded configuration. */
typedef struct Config {
	CfGlobals g;
	CfDatabase *dbs; /* in file order; later duplicates replace earlier ones */
	int n_dbs;
	CfUser *users;
	int n_users;
	CfPeer *peers;
	int n_peers;
	char *path; /* the file given on the command line */
} Config;

/* Largest time value, in seconds (~68 years): a deadline now + value cannot overflow usec_t. */
#define CF_TIME_MAX_SEC 2147483647.0

/*
 * One row of the parameter table. For CF_INT, CF_UINT, CF_TIME and CF_REAL
 * the value must lie in [min, max] (min excluded when min_excl), in the
 * unit the file uses (seconds for CF_TIME): config_validate() refuses a
 * value outside with "NAME must be RANGE (got VALUE)" (config_range_text()).
 * CF_ENUM allows the words of enums, CF_BOOL any integer.
 */
typedef struct CfParam {
	const char *name;
	CfType type;
	size_t offset;       /* offset of the value in CfGlobals */
	const char *def;     /* default as written in a config file; NULL = unset */
	bool reloadable;     /* false: boot-time only (SHOW CONFIG changeable = no) */
	bool hidden;         /* accepted but absent from SHOW CONFIG */
	bool unimplemented;  /* accepted, but setting it has no effect (warned) */
	const CfEnum *enums; /* for CF_ENUM */
	double min, max;     /* numeric types: the range of accepted values */
	bool min_excl;       /* min itself is refused ("above 0") */
} CfParam;

/* The parameter table, in SHOW CONFIG order, terminated by a NULL name. */
extern const CfParam cf_params[];

/* Enum word lists, for code that parses the same words elsewhere. */
extern const CfEnum cf_auth_types[]; /* auth_type words */
extern const CfEnum cf_pool_modes[]; /* session, transaction, statement */
extern const CfEnum cf_sslmodes[];   /* disable .. verify-full */

/* Find a parameter by exact (case-sensitive) name; NULL if unknown. */
const CfParam *config_find_param(const char *name);

/* A setting of the TLS contexts: a change rebuilds them (a console SET, in the workers and the master). */
bool config_param_is_tls(const CfParam *p);

/* A setting of the log (verbose, logfile, syslog*): a change reconfigures it. */
bool config_param_is_log(const CfParam *p);

/* Initialise every [pgbouncer] value to its default, no databases etc. */
void config_init(Config *cf);

/* Release everything a Config owns and zero it. */
void config_free(Config *cf);

/* Deep copy (used by SET, which changes a copy and swaps it in). */
bool config_copy(Config *dst, const Config *src) __attribute__((warn_unused_result));

/*
 * Load `path` into `cf` (which must be freshly config_init()ed). On failure
 * returns false with "FILE:LINE: problem" (or "FILE: problem") in errbuf.
 * Warnings (unimplemented parameters etc.) go to the log.
 */
bool config_load(Config *cf, const char *path, char *errbuf, size_t errlen) __attribute__((warn_unused_result));

/*
 * RELOAD and SIGHUP, in the master and in each worker: load the file the
 * running configuration came from into `next` (verbose starts at the -v
 * count). On failure the reason and "config file loading failed; keeping
 * the running configuration" are logged, `next` is freed, and false is
 * returned: the caller keeps `running` as it is.
 */
bool config_reload(const Config *running, int cmdline_verbose, Config *next) __attribute__((warn_unused_result));

/*
 * Every parameter in its range (config_check_range(), in table order),
 * then the checks across parameters (min_workers <= max_workers,
 * thresholds, ...). config_load() calls it, so a start with
 * a value out of range is fatal and a RELOAD keeps the running
 * configuration; config_set_checked() calls it for SET.
 */
bool config_validate(const Config *cf, char *errbuf, size_t errlen) __attribute__((warn_unused_result));

/*
 * After a successful reload: non-reloadable parameters keep their boot value
 * (copied from `running` into `loaded`), silently as PgBouncer does.
 */
void config_keep_boot_values(Config *loaded, const Config *running);

/*
 * Set one [pgbouncer] parameter from its text form (as in a file or SET).
 * Returns false with a message when the name is unknown or the value invalid.
 */
bool config_set(Config *cf, const char *name, const char *value, char *errbuf, size_t errlen)
    __attribute__((warn_unused_result));

/*
 * config_set() for the admin console's SET: the whole configuration must
 * still pass config_validate() with the new value (a worker setting out of
 * its range, min_workers above max_workers, ...); if not, the old value is
 * put back and the message names the setting and its range.
 */
bool config_set_checked(Config *cf, const char *name, const char *value, char *errbuf, size_t errlen)
    __attribute__((warn_unused_result));

/*
 * What a parameter accepts, in words: "between 1 and 65535", "at least 0",
 * "above 0 and at most 1", "between 0 and 2147483647 seconds", "one of
 * session, transaction, statement", "an integer (0 = off)", "any text".
 */
void config_range_text(const CfParam *p, char *buf, size_t len);

/*
 * Whether the current value of p is in its range; if not, false with
 * "NAME must be RANGE (got VALUE)" in errbuf. config_validate() checks
 * every parameter with it.
 */
bool config_check_range(const Config *cf, const CfParam *p, char *errbuf, size_t errlen)
    __attribute__((warn_unused_result));

/* Format the current value for SHOW CONFIG into buf; returns false for NULL (unset string). */
bool config_format_value(const Config *cf, const CfParam *p, char *buf, size_t len);

/*
 * The current value as text, whatever its length: a string setting's own
 * value, anything else formatted into buf; NULL for an unset string.
 */
const char *config_value_text(const Config *cf, const CfParam *p, char *buf, size_t len);

/* The default as the parameter table writes it (SHOW CONFIG `default` column); false for NULL. */
bool config_format_default(const CfParam *p, char *buf, size_t len);

/* pool_size of a [databases] entry, else default_pool_size (0 = unlimited). */
int config_db_pool_size(const Config *cf, const CfDatabase *db);
/* reserve_pool_size of a [databases] entry, else the global one. */
int config_db_reserve_pool_size(const Config *cf, const CfDatabase *db);

/* Lookup helpers. */
const CfDatabase *config_find_db(const Config *cf, const char *name);
const CfUser *config_find_user(const Config *cf, const char *name);
const CfPeer *config_find_peer(const Config *cf, int id);

/*
 * Membership in a list parameter (admin_users, stats_users,
 * ignore_startup_parameters): commas and whitespace separate, case-sensitive.
 */
bool config_list_contains(const char *list, const char *item);

/* Enum word -> value (case-insensitive); false if not in the list. */
bool config_enum_parse(const CfEnum *e, const char *word, int *value);
/* Enum value -> canonical word ("?" if unknown). */
const char *config_enum_name(const CfEnum *e, int value);

#endif
