/*
 * The worker process: its global state (wk) and its services to the rooms
 * above (runtime/worker.c): the clock, the master channel, client counts,
 * publishing, listeners, shutdown. Its loop is loop/worker_main.c. Each
 * module has its own header (objects.h, client.h, server.h, pool.h, txn.h,
 * ...); all of them run inside the worker's single libevent loop
 * (doc/architecture.md, "Rooms of the worker").
 */
#ifndef PGB_WORKER_WORKER_H
#define PGB_WORKER_WORKER_H

#include <event2/event.h>
#include <event2/event_struct.h>
#include <stdarg.h>
#include <stdnoreturn.h>

#include "common/channel.h"
#include "common/config.h"
#include "common/list.h"
#include "common/log.h"
#include "shm.h"
#include "common/hba.h"
#include "worker/objects.h"
#include "common/tls.h"
#include "worker_entry.h"

/*
 * A worker may stand in for every listener slot (each with every TCP
 * address) when the others drained or crashed, and has the unix socket.
 */
#define WORKER_MAX_LISTENERS (SHM_MAX_WORKERS * LISTEN_MAX_TCP + 1)

/* Listening sockets handed over by the master. */
typedef struct WorkerListener {
	int fd;
	uint32_t id; /* the master's listener id (for hand-over messages) */
	bool is_unix;
	struct event ev;    /* accept event */
	bool active;        /* ev is armed */
	uint64_t last_pass; /* wk.loop_pass when on_accept() last ran */
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
		/* the times to the nanosecond: an edit within the second of the last read is seen too */
		long dev, ino, mode, uid, gid, mtime, mtime_ns, ctime, ctime_ns, size;
	} auth_file_stat;

	RunState run_state;
	PauseMode pause_mode;
	bool pause_inherited; /* the pause came from the master at start, not from a console here (admin_state.c) */
	uint64_t next_id;     /* SHOW CLIENTS/SERVERS id counter (without shm) */
	uint64_t next_internal_id; /* ids of connections nobody sees (socket_new_internal()) */
	int client_count;          /* all client connections (for max_client_conn) */
	int private_clients;       /* of which came in on the private socket (peer consoles) */
	uint64_t reloads;          /* SIGHUPs handled (RELOAD waits for the master's) */
	bool reload_failed; /* the last SIGHUP's config file or TLS set-up did not load (RELOAD answers an error) */
	uint32_t cf_gen;    /* bumped whenever the running config changes (reload, console SET) */
	usec_t now;         /* time at the start of the current callback */
	uint64_t loop_pass; /* event-loop passes so far (worker_main) */
	usec_t start_time;
	usec_t stats_older_at;          /* when the pools' older_stats were taken (start_time before the first tick) */
	usec_t stats_newer_at;          /* when their newer_stats were taken */
	int master_fd;                  /* control pipe to the master (-1 = none) */
	pid_t parent_master;            /* the master that forked us, while it lives (0 = gone: an orphan) */
	bool may_outlive;               /* CH_SETTLE came: serve on if the master dies (loop/orphan.c) */
	int shm_fd;                     /* the tree's shared memory (memfd), for a master that adopts us (-1 = none) */
	ChannelOut *master_out;         /* sends on master_fd, queued while it is full (NULL = none) */
	uint64_t accepted;              /* accepted connections */
	uint64_t moved_in;              /* clients adopted from other workers (src/worker/handover/migrate.c) */
	uint64_t moved_out;             /* clients handed to other workers */
	uint64_t move_failed;           /* clients picked for a move that stayed */
	int intakes;                    /* batches of moved clients still arriving (no exit before they end) */
	PgStats retired_stats;          /* totals of the pools freed so far */
	int cmdline_verbose;            /* verbosity from -v (a file's verbose overrides it) */
	ShmSegment *shm;                /* shared with the master */
	WorkerSlot *slot;               /* this worker's slot in it */
	struct event *publish_ev;       /* publishes busy time and counters */
	int schedstat_fd;               /* /proc/self/schedstat, for the run-queue wait (-1 = none) */
	struct event *drain_timeout_ev; /* worker_drain_timeout */
	bool retiring;                  /* draining because a new tree took over (-R): idle servers go early */
	bool shutdown_closing;          /* a safe shutdown is closing the clients left, then exits */
	usec_t servers_gone_at;         /* a safe shutdown's last server closed then (0 = not yet) */
	int handoff_fd;                 /* retiring: socket to a new tree's worker for our clients (-1 = none) */
	int drain_fd;                   /* draining: the socket of the master's last move order, kept (-1 = none) */
	int drain_to;                   /* draining: the worker that order named */
	bool handoff_due;               /* retiring or draining: a client's transaction ended in this loop pass */
	usec_t accept_rest_until;       /* accept() lacked a resource: listeners rest until then (0 = not resting) */
} Worker;

extern Worker wk;

/* runtime/worker.c; worker_main() is declared in include/worker_entry.h */
/* Stop (or resume) accepting on this worker's listeners. */
void worker_listen_pause(bool pause);
/* Accept on fd too (the master's listener `id`, or the unix socket); its connections go to hooks.accept. */
void worker_add_listener(int fd, uint32_t id, bool is_unix);
void worker_drop_listener(uint32_t id); /* stop accepting on the master's listener `id` and close it */
void worker_listen_close(void);         /* a drain: every listener closed (another worker has them) */
/* This worker's private socket, for the other workers' consoles, the master's scrape and operators. */
void worker_private_listen(void);
const char *worker_private_dir(void); /* where every worker's private socket is; "" when its name is too long */
void worker_private_check(void);      /* bind the private socket again if its file was removed */
/*
 * accept() on a listener (`where`: NULL, or which one) failed with errno `err`: true when the next
 * connection may be taken at once, false when the worker's listeners (the
 * private socket too) rest for a while (the janitor arms them again).
 */
bool worker_accept_failed(int err, const char *where);
void worker_accept_resume_due(void);   /* janitor tick: end a rest that is over */
void worker_stats_total(PgStats *out); /* totals of every pool this worker has had */
void worker_apply_log_settings(void);  /* verbose, logfile and syslog settings of wk.cf take effect (reload, SET) */
void worker_clock_tick(void);          /* wk.now = the time now; every event callback starts with it */
bool worker_tls_reload(char *err, size_t errlen); /* rebuild TLS from wk.cf; false keeps the old contexts */
void worker_count_tls_handshake(void);
/* Exit once a shutdown, or a drain, has nothing left to wait for. */
void worker_check_shutdown(void);
void worker_socket_gone(PgSocket *s);      /* CLIENT_GONE_SHUTDOWN, SERVER_GONE_SHUTDOWN (hooks.h): the check above */
void worker_close_idle_servers(void);      /* PAUSE and the safe shutdown */
void worker_start_shutdown(RunState mode); /* SIGTERM / SIGINT semantics */
/* Exit now, once what is queued for the master went out (or after a second). */
noreturn void worker_exit(void);
void worker_close_clients(List *list, const char *reason); /* every client of one state list, with `reason` */
void worker_tune_listeners(void); /* tcp_keepalive (reload, console SET) reaches the next logins */
/* A console SET, for workers started later and for those in `missed` (slots the console did not reach). */
void worker_tell_master_set(const char *name, const char *value, uint64_t missed);
/*
 * Send the master a message (fd attached, -1 = none; the caller keeps its
 * own): queued behind earlier ones while the channel is full, so none is
 * lost to a master that reads slowly (doc/architecture.md "Control
 * channel"). False when there is no master or it is gone, or the message
 * could not be queued (logged by the channel).
 */
bool worker_tell_master(const ChannelMsg *m, int fd);
void worker_clients_add(int delta);   /* client connections of this worker, also in the global count */
void worker_client_gone(PgSocket *c); /* CLIENT_GONE_COUNT (hooks.h): c leaves those counts */
int worker_global_clients(void);      /* client connections of all workers (max_client_conn) */
void worker_publish(void);            /* publish counters and gauges to the slot now (also every 100 ms) */

#endif
