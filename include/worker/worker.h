/*
 * The worker process: its global state and the functions the worker's
 * modules (client, server, pool, admin, janitor) call on each other.
 * Everything here runs inside the worker's single libevent loop.
 */
#ifndef PGB_WORKER_WORKER_H
#define PGB_WORKER_WORKER_H

#include <event2/event.h>
#include <event2/event_struct.h>
#include <stdarg.h>

#include "common/config.h"
#include "common/list.h"
#include "common/log.h"
#include "shm.h"
#include "worker/hba.h"
#include "worker/objects.h"
#include "worker/pool_settings.h"
#include "worker/tls.h"

#define WORKER_MAX_LISTENERS 256

/* Listening sockets handed over by the master. */
typedef struct WorkerListener {
	int fd;
	uint32_t id; /* the master's listener id (for hand-over messages) */
	bool is_unix;
	struct event ev; /* accept event */
	bool active;     /* ev is armed */
} WorkerListener;

/* What the worker is doing overall. */
typedef enum RunState {
	RUN_ACTIVE,           /* normal operation */
	RUN_SHUTDOWN_SERVERS, /* SIGINT / SHUTDOWN WAIT_FOR_SERVERS */
	RUN_SHUTDOWN_CLIENTS, /* SIGTERM / SHUTDOWN WAIT_FOR_CLIENTS */
	RUN_DRAINING,         /* scale-down: not accepting, exits when its clients are gone */
} RunState;

typedef enum PauseMode {
	P_NONE,    /* running */
	P_PAUSE,   /* PAUSE: no new server assignments */
	P_SUSPEND, /* SUSPEND: nothing is read */
} PauseMode;

typedef struct Worker {
	int id;                  /* worker number (0..) */
	struct event_base *base; /* the loop */
	Config cf;               /* running configuration */
	TlsContexts tls;         /* TLS contexts built from cf (the old ones stay if a reload fails) */
	WorkerListener *listeners;
	int n_listeners;
	struct event *janitor_ev; /* maintenance tick, ~1/3 s */
	struct event *stats_ev;   /* stats_period tick */
	struct event *sig_ev[8];
	struct event *master_ev; /* EOF on the master pipe */

	List databases;     /* PgDatabase, sorted by name */
	List users;         /* PgUser, sorted by name */
	List pools;         /* PgPool, sorted by (db, user) */
	List login_clients; /* CL_LOGIN */
	List justfree;      /* closed sockets freed at the end of the pass */
	List autodb_idle;   /* auto-databases without pools in use */
	PgDatabase *admin_db;
	PgUser *admin_user; /* the "pgbouncer" user */
	UserList userlist;  /* auth_file contents */
	HbaRules *hba;      /* auth_hba_file rules (auth_type=hba; NULL otherwise) */
	IdentMap *ident;    /* auth_ident_file maps (auth_type=hba; NULL otherwise) */
	struct stat_key {
		long dev, ino, mode, uid, gid, mtime, size;
	} auth_file_stat;

	RunState run_state;
	PauseMode pause_mode;
	uint64_t next_id;    /* SHOW CLIENTS/SERVERS id counter (without shm) */
	int client_count;    /* all client connections (for max_client_conn) */
	int private_clients; /* of which came in on the private socket (peer consoles) */
	uint64_t reloads;    /* SIGHUPs handled (RELOAD waits for the master's) */
	uint32_t cf_gen;     /* bumped whenever the running config changes (reload, console SET) */
	usec_t now;          /* time at the start of the current callback */
	usec_t start_time;
	int master_fd;                  /* control pipe to the master (-1 = none) */
	uint64_t accepted;              /* accepted connections */
	int cmdline_verbose;            /* verbosity from -v (a file's verbose overrides it) */
	ShmSegment *shm;                /* shared with the master */
	WorkerSlot *slot;               /* this worker's slot in it */
	struct event *publish_ev;       /* publishes busy time and counters */
	struct event *drain_timeout_ev; /* worker_drain_timeout */
} Worker;

extern Worker wk;

/* worker.c */
int worker_main(int id, Config *cf, const TlsContexts *tls, WorkerListener *listeners, int n_listeners, int master_fd,
                int cmdline_verbose, ShmSegment *shm);
void worker_listen_pause(bool pause);
void worker_clock_tick(void);                     /* wk.now = the time now; every event callback starts with it */
bool worker_tls_reload(char *err, size_t errlen); /* rebuild TLS from wk.cf; false keeps the old contexts */
void worker_count_tls_handshake(void);
void worker_check_shutdown(void);
void worker_close_idle_servers(void);      /* PAUSE and the safe shutdown */
void worker_start_shutdown(RunState mode); /* SIGTERM / SIGINT semantics */
void worker_reload(void);
void worker_clients_add(int delta); /* client connections of this worker, also in the global count */
int worker_global_clients(void);    /* client connections of all workers (max_client_conn) */

/* objects.c */
void objects_init(void);
void change_state(PgSocket *s, SocketState st);
PgSocket *socket_new(bool is_server);
void socket_free_justfree(void);
PgDatabase *db_find(const char *name);
PgDatabase *db_register_auto(const char *name);
PgDatabase *db_add(const CfDatabase *cf);
PgUser *user_find(const char *name);
PgUser *user_add(const char *name);
void user_set_secret(PgUser *u, const char *secret, SecretKind kind);
PgPool *pool_get(PgDatabase *db, PgUser *user);
void pool_free(PgPool *pool); /* one without clients and servers; its statistics go with it */
PgPool *pool_find(PgDatabase *db, PgUser *user);
void objects_load_databases(void);
void objects_load_userlist(bool force);
void disconnect_client(PgSocket *c, bool notify, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void disconnect_server(PgSocket *s, bool notify, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void client_send_error(PgSocket *c, bool fatal_err, const char *sqlstate, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
const char *state_name(SocketState st, bool for_sockets);
int pool_mode_refresh(PgPool *pool); /* pool_effective_mode() after a config change */

/* The pool's pool_mode (user, database, global); asked several times per transaction, so inline. */
static inline int pool_effective_mode(const PgPool *pool)
{
	if (__builtin_expect(pool->mode_gen == wk.cf_gen + 1, 1))
		return pool->mode;
	return pool_mode_refresh((PgPool *)pool);
}
int pool_server_count(const PgPool *pool);
int pool_client_count(const PgPool *pool);
void slog(LogLevel level, const PgSocket *s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void format_addr(const struct sockaddr_storage *ss, char *buf, size_t len, int *port);
int var_index(const char *name);
const char *var_name(int idx);
void var_learn_name(int idx, const char *name); /* a server reported it: use its spelling from now on */
int var_count(void);
void var_set(VarValue *v, const char *value); /* interns a copy (NULL clears): equal texts, equal pointers */
void tune_tcp_socket(int fd);

/* client.c */
void client_accept(int fd, bool is_unix, bool is_private);
SBufAction client_cb(SBuf *sb, SBufEvent ev, const PktHdr *hdr, const uint8_t *data, uint32_t avail);
bool client_send_welcome(PgSocket *c);
void client_server_assigned(PgSocket *c);

/* server.c */
SBufAction server_cb(SBuf *sb, SBufEvent ev, const PktHdr *hdr, const uint8_t *data, uint32_t avail);
/* Both take over `hold` (units already taken from the global budget) and give it back if they fail. */
bool server_launch(PgPool *pool, BudgetHold *hold);
bool server_launch_replication(PgPool *pool, PgSocket *client, BudgetHold *hold); /* dedicated, linked to client */
void server_release(PgSocket *server);
/* Idle outside a transaction, nothing outstanding or unsent: it can go back to the pool (or be closed) now. */
bool server_between_transactions(const PgSocket *server);
void server_reset_or_ready(PgSocket *server, bool always_reset); /* released and ready: reset query, then idle */
bool server_param_status(PgSocket *server, const uint8_t *body, uint32_t len); /* false: malformed */

/* txn.c: transaction and statement mode (doc/transaction.md) */
/* A message of a client linked to a server in transaction/statement mode: queued, maybe rewritten. */
SBufAction txn_client_packet(PgSocket *c, const PktHdr *hdr, const uint8_t *data, uint32_t avail);
/* A message of a linked server in transaction/statement mode: answers pop requests; may release it; counts its bytes. */
SBufAction txn_server_packet(PgSocket *s, const PktHdr *hdr, const uint8_t *data, uint32_t avail);
void txn_release(PgSocket *s); /* unlink from its client and return it to the pool */
/* A CommandComplete of the reset query: DISCARD ALL / DEALLOCATE ALL empty the server's statements. */
void txn_server_discard_check(PgSocket *s, const uint8_t *data, uint32_t len);

/* pool.c */
bool pool_find_server(PgSocket *client);
/* Within server_login_retry of a failed login of the pool, with no server to use (not while paused). */
bool pool_login_failing(const PgPool *pool);
/* If pool_login_failing(): close `client` with the cached error and return true. */
bool pool_fast_fail(PgSocket *client, const PgPool *pool);
void pool_server_ready(PgSocket *server);
void pool_wake_waiters(PgPool *pool);
void pool_drop_gone_waiters(PgPool *pool); /* close waiting clients that hung up (janitor) */
void pool_login_failed(PgPool *pool, const char *sqlstate, const char *msg, bool from_server);
void pool_maybe_launch(PgPool *pool);
void pool_mark_close_needed(PgPool *pool);     /* every server reconnects once it is free */
PgSocket *pool_take_idle(PgPool *pool);        /* for internal work; a used server is checked first (NULL meanwhile) */
void pool_replication_ready(PgSocket *server); /* its login is done: link it to its client, welcome the client */
int pool_global_servers(PgPool *pool);         /* servers of the pool in all workers (per worker if no budget) */
void pool_launch_min(PgPool *pool, int min);   /* min_pool_size: one more server while all workers have < min */
void pool_budget_tick(void);                   /* ~10/s: give idle servers to waiting workers, retry waiters */
void budget_hold_release(BudgetHold *hold);    /* give back a server's or client's units */
/* A logging-in client's unit of its database's and login user's client count; NULL, or the limit that is full. */
const char *pool_take_client_budget(PgSocket *c, int max_db, int max_user);
void pool_budget_forget(PgPool *pool); /* the pool is freed: it waits for room nowhere any more */

/* janitor.c */
void janitor_run(void);
void stats_period_tick(void);

/* admin.c */
bool admin_handle_query(PgSocket *c, const char *query);
void admin_pause_done_check(void);
void admin_wait_close_check(void);
void admin_console_cancel(PgSocket *console);
void admin_resume_all(void); /* leave PAUSE/SUSPEND, wake waiting clients */

/* Sums of a database's pools (SHOW STATS and friends). */
typedef struct DbStats {
	const char *name;
	PgStats total, older, newer; /* totals, and the two stats_period snapshots */
} DbStats;

/* which: 0 STATS, 1 STATS_TOTALS, 2 STATS_AVERAGES, 3 TOTALS; RowDescription, rows, CommandComplete. */
void admin_write_stats(PktBuf *pb, int which, const DbStats *arr, int n);
bool admin_console_busy(const PgSocket *c); /* a fanned-out command is still running: hold its input */

/* admin_fanout.c: the console answers for every worker (doc/workers.md) */
typedef enum FanoutMerge {
	FM_COMMAND,   /* process command: one tag once every worker has completed */
	FM_CONCAT,    /* rows of every worker, worker by worker (CLIENTS, SERVERS, SOCKETS) */
	FM_POOLS,     /* one row per (database, user): counts summed, maxwait maxed */
	FM_DATABASES, /* one row per database: connection counts summed, paused/disabled or-ed */
	FM_USERS,     /* one row per user: connection counts summed */
	FM_LISTS,     /* items summed row by row */
	FM_MEM,       /* used, free and memtotal summed */
	FM_STATE,     /* active if all are, paused/suspended if any is */
	FM_DNS,       /* one row per host name */
	FM_STATS,     /* peers answer SHOW STATS_RAW; `which` as admin_write_stats() */
} FanoutMerge;

void admin_fanout_listen(void); /* the private socket of this worker */
bool admin_fanout_wanted(const PgSocket *c);
/*
 * Send `query` to every other active or draining worker, and capture what
 * this worker's own console code answers c from now on (run it right after).
 * `waits`: the command may take long on a live worker (PAUSE, SUSPEND, ...).
 */
void admin_fanout_begin(PgSocket *c, const char *query, FanoutMerge merge, int which, bool waits);
bool admin_fanout_capture(PgSocket *c, const uint8_t *buf, size_t len); /* false: not capturing */
void admin_fanout_cancel(PgSocket *c);                                  /* a CancelRequest for c: passed to the peers */
void admin_fanout_client_gone(PgSocket *c);                             /* c is closing: drop its peer connections */

/* admin_workers.c */
bool admin_show_workers(PgSocket *c);
bool admin_show_scaler(PgSocket *c);

/* cancel.c */
void cancel_handle_request(PgSocket *req, const uint8_t *key);
void cancel_forwarded(const uint8_t *key); /* a cancel another worker received for our client */
void cancel_gen_key(PgSocket *c);
void cancel_server_gone(PgSocket *server); /* cancels on their way for it no longer point at it */
void cancel_peers_wake(void);              /* a name lookup ended: queued forwards to peers may go */

/* auth_query.c: users not in auth_file looked up with auth_query on a pooled server */
bool auth_query_wanted(const PgSocket *client);
SBufAction auth_query_start(PgSocket *client); /* instead of auth_start(); the client waits */
SBufAction auth_query_server_packet(PgSocket *server, const PktHdr *hdr, const uint8_t *data, uint32_t avail);
void auth_query_wake(PgPool *pool);          /* idle servers of the pool serve queued lookups */
bool auth_query_waiting(const PgPool *pool); /* lookups wait for a server of this pool */
/* The auth_user's login failed: lookups waiting for it fail, with the server's error when it sent one. */
void auth_query_pool_failed(PgPool *pool, const char *sqlstate, const char *msg, bool from_server);
void auth_query_client_gone(PgSocket *client);
void auth_query_server_gone(PgSocket *server);

/* auth.c */
SBufAction auth_start(PgSocket *c);
/* The same-UID Unix-socket user "pgbouncer": the console without a password (nor a lookup). */
bool auth_console_peer(const PgSocket *c);
/*
 * (Re)read auth_hba_file and auth_ident_file when auth_type=hba (on start
 * and every reload); a file that cannot be read keeps the previous contents.
 */
void auth_load_hba(void);
SBufAction auth_handle_password_msg(PgSocket *c, const uint8_t *data, uint32_t len);
void auth_login_complete(PgSocket *c);

#endif
