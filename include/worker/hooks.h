/*
 * The calls that go up a room (doc/architecture.md "Rooms of the worker").
 * A file calls the rooms below it by name. Besides the callbacks it is
 * handed with an object (a socket's sbuf callback, a libevent event's, an
 * AuthPool's), it calls a room above only through one of these pointers,
 * which the loop sets at start, before the first accept (connect_rooms()
 * in worker_main.c; hooks_check() refuses a missing one): each with who
 * answers it and, for the lists, in which order.
 */
#ifndef PGB_WORKER_HOOKS_H
#define PGB_WORKER_HOOKS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/list.h"
#include "common/pktbuf.h"
#include "worker/objects.h"

struct DbStats;

typedef void (*SocketHook)(PgSocket *s);

/*
 * What disconnect_client() (objects.c) runs, in this order. A module that
 * keeps a pointer to a client, or counts it, adds its step here, where its
 * order says, and sets it in connect_rooms().
 */
typedef enum ClientGone {
	CLIENT_GONE_LOOKUP,   /* auth_query.c: its lookup is forgotten (auth_query_client_gone()) */
	CLIENT_GONE_AUTH_JOB, /* auth_threads.c: a PAM or LDAP check no longer names it (auth_job_client_gone()) */
	CLIENT_GONE_SERVER,   /* server.c: its linked server is released, or closed (server_client_gone()) */
	CLIENT_GONE_MOVED,    /* migrate.c: if adopted, its cancel key stops leading here (migrate_client_closed()) */
	CLIENT_GONE_CANCEL, /* cancel.c: a cancel request lets its requester and its server go (cancel_client_gone()) */
	CLIENT_GONE_COUNT,  /* worker.c: out of the client counts, this worker's and all (worker_client_gone()) */
	CLIENT_GONE_CONSOLE, /* admin_fanout.c: its connections to other workers close (admin_fanout_client_gone()) */
	/*
	 * Not a hook: here objects.c counts the client out of its database and
	 * user, gives back its budget units, closes its socket and moves it to
	 * wk.justfree. The steps below see it closed.
	 */
	CLIENT_GONE_CLOSED,
	CLIENT_GONE_SHUTDOWN, /* worker.c: a shutdown or drain that waited for it may end: exit (worker_socket_gone()) */
	CLIENT_GONE_STEPS
} ClientGone;

/* What disconnect_server() runs, in this order, once the client linked to the server is closed. */
typedef enum ServerGone {
	SERVER_GONE_LOOKUP, /* auth_query.c: the lookup it ran fails (auth_query_server_gone()) */
	SERVER_GONE_CANCEL, /* cancel.c: cancels on their way to it no longer name it (cancel_server_gone()) */
	/* Not a hook: here objects.c counts it out, gives back its budget units, closes its socket, wk.justfree. */
	SERVER_GONE_CLOSED,
	SERVER_GONE_LAUNCH,   /* server.c: the room it made lets its pool launch another (server_closed()) */
	SERVER_GONE_SHUTDOWN, /* worker.c: as CLIENT_GONE_SHUTDOWN (worker_socket_gone()) */
	SERVER_GONE_STEPS
} ServerGone;

typedef struct Hooks {
	/* ---- from the model (objects.c) ---- */
	SocketHook client_gone[CLIENT_GONE_STEPS]; /* disconnect_client(), above */
	SocketHook server_gone[SERVER_GONE_STEPS]; /* disconnect_server(), above */
	/* pool_free(): pool.c stops saying that its clients wait for room (pool_budget_forget()) */
	void (*pool_gone)(PgPool *pool);
	/* db_register_auto(): a PAUSE or DISABLE of it before this worker started holds (admin_state_inherit_db()) */
	void (*db_added)(PgDatabase *db);

	/* ---- from pooling/ to auth/: auth_query.c's lookups wait for a server of a pool as clients do ---- */
	bool (*lookups_waiting)(const PgPool *pool); /* auth_query_waiting_slow(); ask auth_query_waiting() */
	void (*lookups_wake)(PgPool *pool);          /* auth_query_wake_slow(): the pool's idle servers serve them */
	/* the auth_user's login to the pool failed: its lookups fail (auth_query_pool_failed()) */
	void (*lookups_fail)(PgPool *pool, const char *sqlstate, const char *msg, bool from_server);
	/* a message of a server that runs a lookup (auth_query_server_packet()) */
	SBufAction (*lookup_packet)(PgSocket *server, const PktHdr *hdr, const uint8_t *data, uint32_t avail);

	/* ---- from pooling/ to console/ ---- */
	/* a CancelRequest for a console: its wait ends (admin_console_cancel()) */
	void (*console_cancel)(PgSocket *console);

	/*
	 * ---- from fanout/ to console/: what the fan-out, the console's transport
	 * to the other workers, needs of the commands it carries (admin.c,
	 * admin_state.c) ----
	 */
	struct {
		/* merged SHOW STATS and friends, as one worker writes its own (admin_write_stats()) */
		void (*write_stats)(PktBuf *pb, int which, const struct DbStats *arr, int n, bool tree);
		/* another worker refused the command: this worker's part is undone or its wait ends (admin_abandon_part()) */
		void (*abandon_part)(PgSocket *console, const char *query, bool done_here);
		void (*kill_here)(const char *db);     /* KILL's follow-up on this worker (admin_kill_here()) */
		void (*disable_later)(const char *db); /* DISABLE's follow-up on this worker (admin_disable_later()) */
		/* the error of a command no worker had anything for, logged once (admin_log_error()) */
		void (*log_command_error)(PgSocket *console, const char *msg);
		void (*report_state)(void); /* this worker's console state to the master (admin_state_report()) */
		/* the workers a state command left out, to the master (admin_state_left_out()) */
		void (*left_out)(uint64_t workers);
	} console;

	/* ---- from runtime/ ---- */
	/* a connection accepted on a listener or the private socket becomes a client (client_accept()) */
	void (*accept)(int fd, bool is_unix, bool is_private, const struct sockaddr_storage *peer, socklen_t peer_len);
	/* worker_publish(): the logged-in clients that could move now and those that cannot (migrate_count()) */
	void (*count_movable)(uint32_t *movable, uint32_t *unmovable);
} Hooks;

extern Hooks hooks;

/* The loop has set every hook (fatal otherwise: a step added to a list above without its function). */
void hooks_check(void);

/*
 * The lookups waiting for a server, of all pools (auth_query.c's), kept
 * here, below the pool, so that the pool's question at every release costs
 * no call when none waits.
 */
extern List auth_query_queue;

/* Lookups wait for a server of this pool. */
static inline bool auth_query_waiting(const PgPool *pool)
{
	return !list_empty(&auth_query_queue) && hooks.lookups_waiting(pool);
}

/* Idle servers of the pool serve queued lookups. */
static inline void auth_query_wake(PgPool *pool)
{
	if (!list_empty(&auth_query_queue))
		hooks.lookups_wake(pool);
}

#endif
