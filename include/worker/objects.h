/*
 * The worker's objects: databases, users, pools and connections (PgSocket
 * for both clients and servers). Every connection state is a list; exactly
 * one function, change_state(), moves a socket between them.
 */
#ifndef PGB_WORKER_OBJECTS_H
#define PGB_WORKER_OBJECTS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <sys/un.h>

#include "common/config.h"
#include "common/list.h"
#include "common/log.h"
#include "common/userlist.h"
#include "worker/prepare.h"
#include "worker/reqqueue.h"
#include "worker/sbuf.h"
#include "worker/session_tail.h"
#include "common/scram.h"

#define MAX_TRACKED    16  /* tracked parameters per connection */
#define CANCEL_KEY_LEN 8   /* bytes of a cancel key (protocol 3.0) */
#define MAX_SERVER_KEY 256 /* longest server cancel key (protocol 3.2) */
_Static_assert(MAX_TRACKED <= 16, "PgSocket.vars_unreported has a bit per tracked parameter");

typedef enum SocketState {
	CL_FREE,           /* not in use */
	CL_JUSTFREE,       /* closed, freed at the end of the loop pass (justfree list) */
	CL_LOGIN,          /* startup and authentication (login_clients list) */
	CL_WAITING_LOGIN,  /* authenticated, waiting for the pool's first server (pool->waiting_clients) */
	CL_WAITING,        /* queued for a server (pool->waiting_clients) */
	CL_ACTIVE,         /* logged in; linked to a server or idle (pool->active_clients) */
	CL_WAITING_CANCEL, /* cancel request not yet forwarded (pool->waiting_cancel_req) */
	CL_ACTIVE_CANCEL,  /* cancel request being sent (pool->active_cancel_req) */

	SV_FREE,           /* not in use */
	SV_JUSTFREE,       /* closed, freed at the end of the loop pass (justfree list) */
	SV_LOGIN,          /* connecting and logging in (pool->new_servers) */
	SV_IDLE,           /* ready for a client (pool->idle_servers) */
	SV_ACTIVE,         /* linked to a client (pool->active_servers) */
	SV_USED,           /* idle for longer than server_check_delay (pool->used_servers) */
	SV_TESTED,         /* running the reset or check query (pool->tested_servers) */
	SV_ACTIVE_CANCEL,  /* sending a cancel request (pool->active_cancel_servers) */
	SV_BEING_CANCELED, /* released but cancels for it are in flight (pool->being_canceled_servers) */
	SOCKET_STATE_COUNT
} SocketState;

typedef struct PgPool PgPool;
typedef struct PgSocket PgSocket;
typedef struct AuthQuery AuthQuery; /* an auth_query lookup in progress (auth_query.c) */
typedef struct AuthJob AuthJob;     /* a PAM or LDAP check in progress (auth_threads.c) */

/* A worker's cached index of a global budget entry (include/shm.h). */
typedef struct BudgetRef {
	int idx;   /* entry + 1; 0 = not looked up yet; -1 = table full: a per-worker limit applies */
	bool want; /* our bit is set in the entry's want_mask */
	bool need; /* budget tick: some pool of ours still waits for room here */
} BudgetRef;

/* The global budget units a server connection holds (released when it is freed). */
typedef struct BudgetHold {
	bool taken; /* idx[] is valid */
	int idx[3]; /* pool, database and user entries; -1 = none taken there (per-worker limit) */
} BudgetHold;

/* Value of one tracked parameter (client_encoding, DateStyle, ...). */
typedef struct VarValue {
	char *value; /* NULL = none; interned by var_set(): equal values are equal pointers */
} VarValue;

/*
 * A socket's tracked values: one interned tuple of interned texts, shared
 * by every socket with the same values (doc/architecture.md, "Tracked
 * parameters"). A socket carries a pointer to it (NULL: nothing set) rather
 * than MAX_TRACKED of them, and a client and a server agree when their
 * pointers are equal. Read with sock_var(), changed with sock_var_set().
 */
typedef struct VarSet {
	char *v[MAX_TRACKED]; /* interned texts; NULL = not set. Only the first var_count() exist */
} VarSet;

/*
 * A pool's last sock_vars_fill(): a client with the tuple `from` got `to`
 * (a reference to each). Cleared when the pool's defaults change.
 */
typedef struct VarFill {
	const VarSet *from, *to;
} VarFill;

/* A [databases] entry as the worker uses it (or an auto-database, or the admin db). */
typedef struct PgDatabase {
	List node;                  /* in databases list (sorted by name) */
	char name[CF_MAX_DBNAME];   /* client-side name */
	CfDatabase cf;              /* own copy of the entry (strings owned) */
	bool admin;                 /* the pgbouncer pseudo-database */
	bool auto_db;               /* created from the "*" entry */
	bool paused;                /* PAUSE db / KILL db */
	bool disabled;              /* DISABLE db */
	bool placeholder;           /* unknown database: auth runs, then "no such database" */
	int client_count;           /* current client connections */
	int server_count;           /* current server connections */
	usec_t inactive_since;      /* auto-db: when it last had no pools in use */
	struct PgUser *forced_user; /* from user= */
	int host_index;             /* round-robin position in a host list */
	BudgetRef budget;           /* its global server count (max_db_connections) */
	BudgetRef client_budget;    /* its global client count (max_db_client_connections) */
} PgDatabase;

/* A user: from auth_file, [users], or created for the admin console. */
typedef struct PgUser {
	List node; /* in users list (sorted) */
	char name[USERLIST_MAX_USER + 1];
	char *secret; /* password or secret; NULL = unknown in auth_file */
	SecretKind kind;
	const CfUser *cf;    /* [users] entry or NULL (points into the running Config) */
	bool has_scram_keys; /* pass-through keys from a client's SCRAM login */
	uint8_t scram_client_key[SCRAM_KEY_LEN];
	uint8_t scram_server_key[SCRAM_KEY_LEN];
	ScramSecret *adhoc_scram; /* verifier built from a plain password (cached) */
	bool from_auth_query;     /* secret came from auth_query: looked up again at each login */
	bool from_pam;            /* secret is the password PAM last accepted (for server logins) */
	bool in_auth_file;        /* listed in the auth_file as last read */
	usec_t secret_time;       /* when auth_query or PAM last gave the secret (0: unknown) */
	int client_count;         /* current client connections of this login user */
	int server_count;         /* current server connections of this pool user */
	BudgetRef budget;         /* its global server count (max_user_connections) */
	BudgetRef client_budget;  /* its global client count (max_user_client_connections) */
	/*
	 * "" for a user of every database (auth_file, [users], PAM, the
	 * console). A user that auth_query found is one per database, named
	 * here: each database's lookup may ask another server (auth_dbname,
	 * auth_query per database), so its secret and pass-through keys are
	 * that database's only (doc/auth_query.md). SHOW USERS shows one row per name.
	 */
	char scope[CF_MAX_DBNAME];
} PgUser;

/* Counters of a pool (SHOW STATS). */
typedef struct PgStats {
	uint64_t server_assignment_count;
	uint64_t xact_count;
	uint64_t query_count;
	uint64_t client_bytes;
	uint64_t server_bytes;
	uint64_t xact_time;  /* usec */
	uint64_t query_time; /* usec */
	uint64_t wait_time;  /* usec */
	uint64_t client_parse_count;
	uint64_t server_parse_count;
	uint64_t bind_count;
	uint64_t client_login_count; /* welcomes sent (post-1.25.2 PgBouncer) */
} PgStats;

/* Every field of a PgStats is a uint64_t counter: sums go field by field. */
#define PGSTATS_FIELDS (sizeof(PgStats) / sizeof(uint64_t))

static inline void pgstats_add(PgStats *dst, const PgStats *src)
{
	uint64_t *d = (uint64_t *)dst;
	const uint64_t *s = (const uint64_t *)src;
	for (size_t f = 0; f < PGSTATS_FIELDS; f++)
		d[f] += s[f];
}

/* One (database, pool user) pool. */
struct PgPool {
	List node; /* in pools list, sorted by (database, user) */
	PgDatabase *db;
	PgUser *user;

	List active_clients;         /* CL_ACTIVE */
	List waiting_clients;        /* CL_WAITING, CL_WAITING_LOGIN */
	List active_cancel_req;      /* CL_ACTIVE_CANCEL */
	List waiting_cancel_req;     /* CL_WAITING_CANCEL */
	List active_servers;         /* SV_ACTIVE */
	List idle_servers;           /* SV_IDLE */
	List used_servers;           /* SV_USED */
	List tested_servers;         /* SV_TESTED */
	List new_servers;            /* SV_LOGIN */
	List active_cancel_servers;  /* SV_ACTIVE_CANCEL */
	List being_canceled_servers; /* SV_BEING_CANCELED */
	/* sockets of the pool in each state: the lists' lengths, kept by change_state() */
	int n_state[SOCKET_STATE_COUNT];

	/* the welcome: ParameterStatus messages of the first server login */
	bool welcome_ready;
	PktBuf welcome_params;          /* 'S' messages except tracked ones */
	VarValue defaults[MAX_TRACKED]; /* tracked parameters' server defaults */
	/*
	 * welcome_params and the 'S' messages of the tracked values in
	 * welcome_vals, as sent to the last client welcomed: the next client
	 * with the same (interned) values gets a copy. Valid while
	 * welcome_cache_gen == var_names_gen() + 1 (0: invalid).
	 */
	PktBuf welcome_cache;
	VarValue welcome_vals[MAX_TRACKED];
	uint32_t welcome_cache_gen;
	VarFill last_fill; /* the clients of a pool mostly start with the same values */

	bool last_login_failed; /* within server_login_retry of a failure */
	/*
	 * A name with several addresses: how many the last launch's host had,
	 * and the connects refused in a row since one last succeeded
	 * (server.c, next_address_at_once()).
	 */
	int launch_addrs;
	int connect_fail_run;
	usec_t last_failed_time;
	char failed_msg[256];       /* cached reason for the fast-fail message */
	usec_t last_lifetime_close; /* spacing of server_lifetime closes */
	usec_t unused_since;        /* pool_idle_timeout: first seen without clients and servers; 0 = in use */
	BudgetRef budget;           /* its global server count (pool_size, reserve, min_pool_size) */
	/* effective settings, asked several times per transaction: cached per config generation (pool.h) */
	int mode;              /* pool_mode */
	int size;              /* pool_size */
	int reserve;           /* reserve_pool_size */
	int max_db;            /* max_db_connections of its database */
	int max_user;          /* max_user_connections of its user */
	uint32_t settings_gen; /* wk.cf_gen + 1 when they were computed; 0 = never */

	PgStats stats;       /* totals */
	PgStats flushed;     /* the part of them added to the tree's totals (pool_stats_flush()) */
	unsigned wake_gen;   /* pool_wake_waiters() calls: one that ran inside another changed its lists */
	PgStats older_stats; /* snapshot at the start of the previous period */
	PgStats newer_stats; /* snapshot at the start of the current period */
};

/*
 * A peer's IP address, kept in each connection: 28 bytes instead of a
 * sockaddr_storage's 128 (doc/benchmarks.md, "Memory per idle client").
 * For a Unix socket only the family is here; a server's socket path is
 * in PgSocket.remote_path.
 */
typedef union PeerAddr {
	struct sockaddr sa;
	struct sockaddr_in in;
	struct sockaddr_in6 in6;
} PeerAddr;

/*
 * A client or server connection. Every client carries one, so the fields
 * are ordered for as little padding as the compiler needs (744 bytes on
 * x86-64; doc/benchmarks.md, "Memory per idle client"): keep it so when
 * adding one.
 */
struct PgSocket {
	List node; /* in the list of its state */
	SBuf sb;   /* the socket */
	SocketState state;
	bool is_server;
	bool admin_user;             /* console: full access */
	bool stats_user;             /* console: read-only */
	bool tls_direct;             /* clients: TLS started without SSLRequest (ALPN must say postgresql) */
	PgPool *pool;                /* NULL while logging in (clients) */
	PgPool *counted_in;          /* the pool whose n_state counts this socket (change_state) */
	PgSocket *link;              /* linked peer */
	PgUser *login_user;          /* clients: who logged in; servers: pool user */
	PgDatabase *db;              /* clients: chosen database (maybe placeholder) */
	PgDatabase *own_placeholder; /* clients: stand-in for an unknown database, freed with the socket */
	uint64_t id;                 /* SHOW CLIENTS/SERVERS id (shared counter) */

	struct sockaddr_un *remote_path; /* servers and cancel connections over a Unix socket: its path (else NULL) */
	struct AdminFanout *fanout;      /* consoles: peer connections for fanned-out commands, or NULL */
	PeerAddr remote;                 /* peer address (ours is asked of the socket when shown: socket_local_addr) */
	int peer_pid;                    /* SO_PEERCRED pid for unix clients, else 0 */
	uid_t peer_uid;                  /* SO_PEERCRED uid */
	bool is_unix;                    /* came in over the unix socket */
	bool is_private;                 /* came in over this worker's private socket: never fanned out */
	bool adopted;                    /* clients: moved here from another worker (the master maps its key) */
	bool is_internal;                /* is_private from another worker's process: a console's peer connection,
	                                   hidden from every SHOW and counted nowhere */
	bool from_master;                /* is_internal from the master (metrics_listen): answered for the
	                                   whole pooler like an operator's console */
	bool pause_db_noop;              /* consoles: their last PAUSE db found it paused already (by an earlier
	                                   command): undoing that part leaves it paused */
	char txn_status;                 /* last ReadyForQuery status: I, T, E */
	bool copy_mode;                  /* COPY in progress */
	uint8_t auth_method;             /* AUTH_* used for this client (in a byte: no padding) */
	bool welcome_pending;            /* server: its connect_query's ParameterStatus still make its pool's welcome */
	bool addr_gone; /* server: close_needed because its host name no longer resolves to its address */
	/*
	 * server: tracked parameters (a bit per index) that the pooler SET
	 * here but that the server does not report: its value is a client's,
	 * not its own, until a RESET (replay_vars())
	 */
	uint16_t vars_unreported;

	usec_t connect_time; /* when connected */
	usec_t request_time; /* last client request / server activity */
	usec_t query_start;  /* current query's start (0 = none) */
	usec_t xact_start;   /* current transaction's start (0 = none) */
	usec_t wait_start;   /* when it started waiting for a server */
	usec_t queued_start; /* the request it waited with began then: its query_start (count_request()) */

	/* tracked parameters: clients their wish, servers their current value (sock_var()) */
	const VarSet *vars;
	char *app_name_raw; /* application_name as given (before add_host) */

	uint8_t cancel_key[CANCEL_KEY_LEN]; /* clients: our key */
	uint32_t cancel_key_len;
	uint32_t server_key_len;
	/*
	 * servers: PostgreSQL's key (BackendKeyData); cancel connections: the
	 * key they send. Allocated, since it may be up to MAX_SERVER_KEY bytes
	 * long, so that a client does not carry the room (doc/benchmarks.md,
	 * "Memory per idle client").
	 */
	uint8_t *server_key;
	uint32_t backend_pid; /* servers: PostgreSQL pid from BackendKeyData */
	BudgetHold budget;    /* units of the global budget, given back when freed: servers' pool, database and
	                         user server counts; clients' database and user client counts */

	/* authentication */
	uint8_t md5_salt[4];
	ScramServer *scram_srv; /* client SCRAM exchange in progress */
	ScramClient *scram_cli; /* server SCRAM login in progress */
	AuthQuery *auth_query;  /* clients: their lookup (queued or running); servers: the lookup they run */
	AuthJob *auth_job;      /* clients: their PAM or LDAP check (prepared, queued or running) */

	/* protocol state */
	bool setting_vars;     /* server: running SET for tracked parameters */
	bool vars_pipelined;   /* server: that SET went ahead of the client's messages (replay_vars) */
	bool vars_enc_first;   /* server: that SET's client_encoding went first, in a Query of its own (replay_vars) */
	bool held_for_check;   /* server: its client's message waits (ANS_CHECK, its unnamed statement; txn.c) */
	bool held_for_flush;   /* client: its next message waits until the pooler's answers to it are sent (client.c) */
	bool request_counted;  /* client: the message held by SB_WAIT was counted (count_request()) already */
	bool console_counted;  /* console: its first message was counted in SHOW STATS (count_console()) */
	bool resetting;        /* server: running reset/check query */
	bool lent;             /* server: given out since its login or its last check (server_check_delay = 0) */
	bool checking;         /* server: running server_check_query for a waiting client */
	bool reset_running;    /* server: running server_reset_query */
	bool reset_failed;     /* server: its reset or check query answered an ErrorResponse */
	bool close_needed;     /* server: close when released */
	bool stale_stmt;       /* server: close_needed because a prepared statement's result type changed */
	bool ready;            /* server: saw ReadyForQuery, no query running */
	bool wait_notice_sent; /* query_wait_notify NOTICE sent */
	char link_mode;        /* server: POOL_* in force when it was linked to its client; holds until released */
	uint8_t replication;   /* a ReplicationMode, in a byte (no padding): clients: what the startup asked for;
	                         servers: dedicated to such a client (doc/pgbouncer.1.md, "REPLICATION CONNECTIONS") */
	SessionTail session;   /* server linked in session mode: what its client sent that is still owed an answer */
	uint32_t cancel_server_pid; /* cancel connections: the backend pid they send with server_key */
	int cancels_pending;        /* servers: cancel connections still on their way to PostgreSQL */
	int cancel_peer;            /* cancel connections to a [peers] entry: its peer_id (0 otherwise) */
	int cancel_hold_fd;         /* cancel requests and [peers] cancel connections: the requester's socket, closed
	                               when done (-1: none) */
	PgSocket *cancel_target;    /* cancel connections and waiting cancel requests: the server whose query they
	                               cancel (NULL once it is gone) */
	PgSocket *cancel_req; /* a cancel request and the cancel connection that carries it: each other (or NULL) */

	/* replication (doc/pgbouncer.1.md, "REPLICATION CONNECTIONS") */
	char *repl_options;  /* replication clients: the `options` startup parameter, verbatim */
	PktBuf *repl_params; /* replication servers: ParameterStatus of their login, their client's welcome */

	/* transaction and statement mode (doc/transaction.md) */
	ReqQueue rq;            /* servers: requests still to be answered while linked */
	ClientStmtMap stmts;    /* clients: their protocol-level prepared statements by name */
	ServerStmt *sstmts;     /* servers: the statements prepared on them, LRU order */
	uint64_t unnamed_owner; /* servers: id of the client whose Parse made the unnamed statement (0: none) */

	/* TLS */
	SSL *tls_pending; /* servers: the SSL to use once PostgreSQL answers 'S' to the SSLRequest */
	char *tls_host;   /* servers, while the server TLS context is deferred (TlsContexts.server_deferred):
	                     the host name its SSL is made for at the 'S' answer; set = SSLRequest wanted */
};

/* Whether the connection runs over TLS (hostssl/hostnossl rules, SHOW `tls`). */
static inline bool socket_is_tls(const PgSocket *s)
{
	return s->sb.ssl != NULL;
}

/* objects.c */
/* With --enable-cassert: the pool's n_state counts equal its lists' lengths (janitor tick). */
void pool_check_counts(const PgPool *pool);
void objects_init(void);
/* Move a socket to the list of its new state (the only place that does). */
void change_state(PgSocket *s, SocketState st);
/* A zeroed client or server connection, in no list yet, with the next connection id of the tree. */
PgSocket *socket_new(bool is_server);
/* The same with a given id (a client moved from another worker keeps its own). */
PgSocket *socket_new_with_id(bool is_server, uint64_t id);
/*
 * Ids of connections nobody sees (another worker's console, the master's
 * /metrics scrape): the top bit set, so that they take none of the ids
 * SHOW CLIENTS shows and KILL_CLIENT takes.
 */
#define SOCKET_ID_INTERNAL (UINT64_C(1) << 63)
/* A client connection with an id of that range, unique in this worker. */
PgSocket *socket_new_internal(void);
/* Free the sockets closed during this loop pass. */
void socket_free_justfree(void);
/* The database of this name, or NULL. */
PgDatabase *db_find(const char *name);
/* A database made from the `*` entry for `name`; NULL without one. */
PgDatabase *db_register_auto(const char *name);
/* Add a [databases] entry (or update the one of that name). */
PgDatabase *db_add(const CfDatabase *cf);
/* The user of this name for every database, or NULL. */
PgUser *user_find(const char *name);
/* The user of this name for every database, made (without a secret) if missing. */
PgUser *user_add(const char *name);
/* The user of this name that auth_query found for database `scope` (made if missing by user_add_scoped()). */
PgUser *user_find_scoped(const char *scope, const char *name);
PgUser *user_add_scoped(const char *scope, const char *name);
/* Replace the user's password or verifier (NULL: none). */
void user_set_secret(PgUser *u, const char *secret, SecretKind kind);
/* The pool of (db, user), made if missing. */
PgPool *pool_get(PgDatabase *db, PgUser *user);
void pool_free(PgPool *pool); /* one without clients and servers; its statistics go with it */

/*
 * A hash of how a database entry's servers connect (the fields whose change
 * makes a RELOAD replace them): a server moved from another worker or tree
 * carries it, and the receiver closes it when released if its own entry
 * differs.
 */
uint64_t db_definition_hash(const CfDatabase *cf);

/*
 * Add what the pool (or every pool) counted since the last time to the
 * tree's SHOW STATS totals of its database in shared memory (db_stats in
 * include/shm.h): every 100 ms, before a SHOW STATS and as the worker
 * exits, so that a worker that exits (drained or crashed) leaves its counts.
 */
void pool_stats_flush(PgPool *pool);
void pools_stats_flush(void);

/* The tree's SHOW STATS totals of database `name` into out; false without shared memory or an entry. */
bool db_stats_totals(const char *name, PgStats *out);
PgPool *pool_find(PgDatabase *db, PgUser *user);
/* Apply wk.cf's [databases]: add, update, mark for reconnect. */
void objects_load_databases(void);
/* Re-read auth_file if it changed (or always with force) and apply [users]. */
void objects_load_userlist(bool force);
/*
 * Close a client; notify: send it the reason as a FATAL first. The modules
 * that hold it hear of it in the order of include/worker/hooks.h
 * (ClientGone): its server is released or closed, among others.
 */
void disconnect_client(PgSocket *c, bool notify, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Close a server; notify: send Terminate first. A linked client is closed with the reason; then ServerGone. */
void disconnect_server(PgSocket *s, bool notify, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void client_send_error(PgSocket *c, bool fatal_err, const char *sqlstate, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The state column of SHOW CLIENTS/SERVERS (or of SHOW SOCKETS with for_sockets). */
const char *state_name(SocketState st, bool for_sockets);

int pool_server_count(const PgPool *pool);
/* Clients of the pool in this worker, in any state. */
int pool_client_count(const PgPool *pool);
/* No clients, no servers, no cancel request, no auth_query lookup: the pool may be freed. */
bool pool_unused(const PgPool *pool);
void pool_mark_close_needed(PgPool *pool);  /* every server reconnects once it is free */
void budget_hold_release(BudgetHold *hold); /* give back a server's or client's units (pool.c takes them) */
/* Log a line prefixed with the socket's C-/S- name, db/user@addr:port. */
void slog(LogLevel level, const PgSocket *s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/*
 * slog() at DEBUG (verbose >= 1) and NOISE (verbose >= 2): the level is
 * checked inline, so a disabled line evaluates no argument and makes no call.
 */
#define slog_debug(s, ...)                                                                                             \
	do {                                                                                                           \
		if (log_enabled(LG_DEBUG))                                                                             \
			slog(LG_DEBUG, s, __VA_ARGS__);                                                                \
	} while (0)
#define slog_noise(s, ...)                                                                                             \
	do {                                                                                                           \
		if (log_enabled(LG_NOISE))                                                                             \
			slog(LG_NOISE, s, __VA_ARGS__);                                                                \
	} while (0)
/* Address text (`unix` for a Unix socket) and port of ss. */
void format_addr(const struct sockaddr_storage *ss, char *buf, size_t len, int *port);
/* Index of a tracked parameter (case-insensitive), or -1. */
int var_index(const char *name);
/* A tracked parameter's name, in PostgreSQL's spelling once a server reported it. */
const char *var_name(int idx);
void var_learn_name(int idx, const char *name); /* a server reported it: use its spelling from now on */
#define VAR_CLIENT_ENCODING 1                   /* index of client_encoding: vars_init() lists it second */
/* Whether two values of tracked parameter idx are the same setting (case matters but for PostgreSQL's own four). */
bool var_same_value(int idx, const char *a, const char *b);
int var_count(void);
uint32_t var_names_gen(void);   /* changes when a tracked name's spelling changes */
const char *var_ident(int idx); /* var_name() as pktbuf_put_sql_ident() quotes it, made once per spelling */
void var_set(VarValue *v, const char *value);      /* interns a copy (NULL clears): equal texts, equal pointers */
void var_copy(VarValue *dst, const VarValue *src); /* dst takes src's interned text (or NULL) */
/* A socket's tracked value idx (interned text), or NULL. */
static inline const char *sock_var(const PgSocket *s, int idx)
{
	return s->vars ? s->vars->v[idx] : NULL;
}
void sock_var_set(PgSocket *s, int idx, const char *value); /* interns a copy of value (NULL clears) */
void sock_var_copy(PgSocket *s, int idx, const char *text); /* text: another socket's or pool's, already interned */
/* Each value s has not set, from defaults; last: the pool's previous filling, reused for the same values. */
void sock_vars_fill(PgSocket *s, const VarValue *defaults, VarFill *last);
void var_fill_clear(VarFill *last);
void sock_vars_clear(PgSocket *s);
/* SHOW MEM var_list_cache: the size of a tuple of tracked values, tuples in use, spare ones kept for reuse. */
void var_sets_usage(size_t *size, int *used, int *spare);
void tune_tcp_socket(int fd);      /* a server socket: every TCP option of the config */
void tune_tcp_listener(int fd);    /* a client listener: the options accepted sockets inherit */
void tune_accepted_socket(int fd); /* a client socket: the options it did not inherit */
/* Set s->remote from sa (a server's Unix socket path is copied to remote_path). */
void socket_set_remote(PgSocket *s, const struct sockaddr *sa, socklen_t len);
/* s->remote as a full address again; returns its length for connect(). */
socklen_t socket_remote(const PgSocket *s, struct sockaddr_storage *ss);
/* Address text (`unix` for a Unix socket) and port of the peer (format_addr). */
void socket_remote_text(const PgSocket *s, char *buf, size_t len, int *port);
/* Our address of a connected socket (SHOW CLIENTS/SERVERS, logs); zeroed when it has none. */
void socket_local_addr(const PgSocket *s, struct sockaddr_storage *ss);
/* Set s->server_key to a copy of key (replacing an earlier one). */
void socket_set_server_key(PgSocket *s, const uint8_t *key, uint32_t len);

/* A client waiting with a message (SB_WAIT) got its server: the message is offered again. */
static inline void client_server_assigned(PgSocket *c)
{
	sbuf_continue(&c->sb);
}

/* The reason logged when a server marked close_needed closes. */
static inline const char *close_needed_reason(const PgSocket *s)
{
	if (s->stale_stmt)
		return "a prepared statement's result type changed";
	return s->addr_gone ? "server address no longer in DNS" : "database configuration changed";
}

#endif
