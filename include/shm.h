/*
 * The shared-memory contract between the master and its workers: one
 * MAP_SHARED segment created by the master before the first fork (a memfd,
 * so that a new master at an online restart can map it too; an anonymous
 * mapping where memfd_create() fails).
 *
 * Rules: every field has exactly one writer (the master, or the worker that
 * owns a slot); counters are 64-bit, monotonic and written with C11 atomics;
 * readers take deltas; no lock ever crosses a process boundary.
 * The one shared counter, next_socket_id, is only ever bumped with fetch-add.
 *
 * Slot state table (writer in brackets):
 *
 *   SLOT_FREE      [master]  unused; the master may fork a worker into it
 *   SLOT_STARTING  [master]  forked, not accepting yet
 *   SLOT_ACTIVE    [worker]  accepting and serving
 *   SLOT_DRAINING  [master]  told to stop accepting; finishing its clients
 *   SLOT_EXITING   [worker]  nothing left; about to exit
 *
 * The master resets a slot (all counters to zero, state FREE) after reaping
 * its worker, so a respawned worker starts from clean numbers.
 *
 * The global budget (GlobalBudget, below) is the one place with several
 * writers: pool limits span all workers, so a worker takes a unit of a
 * budget entry with compare-and-swap ("increment if below the limit") and
 * gives it back with an atomic decrement. Each worker also keeps its own
 * share per entry (held[w], written by worker w only), so that the master,
 * after reaping a worker, subtracts exactly that worker's share. Budget
 * entry state table (in `state`, low byte; the claimer's slot above it):
 *
 *   BUDGET_EMPTY     never used; a worker claims it with CAS
 *   BUDGET_CLAIMING  [claimer] writing the key; others wait briefly
 *   BUDGET_READY     key fixed for the life of the tree; counts live
 *   BUDGET_DEAD      [master] the claimer died mid-claim; lookups skip it
 *
 * Entries are never freed: a pool that goes away leaves an entry with a
 * count of 0, found again by name if the pool comes back.
 */
#ifndef PGB_SHM_H
#define PGB_SHM_H

#include <signal.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>

/*
 * A console's SHUTDOWN WAIT_FOR_CLIENTS / WAIT_FOR_SERVERS, from a worker to
 * its master: the shutdown of SIGTERM / SIGINT, but asked for from inside,
 * which a SUSPEND does not turn into an immediate exit (main.c, on_signal).
 */
#define SIG_CONSOLE_SHUTDOWN_CLIENTS (SIGRTMIN + 1)
#define SIG_CONSOLE_SHUTDOWN_SERVERS (SIGRTMIN + 2)

#define SHM_MAGIC       0x50474257u /* "PGBW" */
#define SHM_VERSION     8u
#define SHM_MAX_WORKERS 64
#define SHM_CACHELINE   64

#define SHM_WAIT_UNKNOWN UINT64_MAX /* WorkerSlot.wait_ns when /proc/self/schedstat cannot be read */

#define SHM_STATS_FIELDS 12 /* = PGSTATS_FIELDS (worker/objects.h) */

#define SHM_BUDGET_ENTRIES 4096 /* pools + databases + users with a global server count */
#define SHM_BUDGET_DBNAME  64   /* = CF_MAX_DBNAME */
#define SHM_BUDGET_USER    128  /* = USERLIST_MAX_USER + 1 */

typedef enum SlotState {
	SLOT_FREE = 0,     /* unused */
	SLOT_STARTING = 1, /* forked, not yet accepting */
	SLOT_ACTIVE = 2,   /* accepting */
	SLOT_DRAINING = 3, /* not accepting, finishing its clients */
	SLOT_EXITING = 4,  /* about to exit */
} SlotState;

/* One worker's published numbers. 64-byte aligned so slots never share a cache line. */
typedef struct WorkerSlot {
	alignas(SHM_CACHELINE) _Atomic uint32_t state; /* SlotState */
	_Atomic int32_t pid;                           /* worker pid, 0 when free [master] */
	_Atomic uint64_t start_time_us;                /* wall clock at fork [master] */
	_Atomic uint64_t busy_ns;                      /* event-loop time spent working [worker] */
	_Atomic uint64_t wait_ns;        /* time runnable but waiting for a CPU, from the kernel's schedstat;
	                             SHM_WAIT_UNKNOWN when the kernel has none [worker] */
	_Atomic uint64_t sample_time_ns; /* monotonic time of the last busy_ns/wait_ns update [worker] */
	_Atomic uint64_t accepted;       /* accepted connections [worker] */
	_Atomic uint64_t tls_handshakes; /* completed TLS handshakes with clients [worker] */
	_Atomic uint64_t xact_count;     /* transactions [worker] */
	_Atomic uint64_t query_count;    /* queries [worker] */
	_Atomic uint64_t bytes_in;       /* bytes from clients [worker] */
	_Atomic uint64_t bytes_out;      /* bytes to clients [worker] */
	_Atomic uint32_t cl_active;      /* current gauges [worker] */
	_Atomic uint32_t cl_waiting;
	_Atomic uint32_t sv_active;
	_Atomic uint32_t sv_idle;
	_Atomic uint64_t stats[SHM_STATS_FIELDS]; /* PgStats totals of all its pools, freed ones included,
	                                             in PgStats order: the pooler's stats line [worker] */
	/* rebalancing (doc/workers.md, "Rebalancing long-lived clients") */
	_Atomic uint32_t cl_movable;   /* logged-in clients that could move to another worker now [worker] */
	_Atomic uint32_t cl_unmovable; /* logged-in clients that cannot (in a transaction, TLS, ...) [worker] */
	_Atomic uint64_t moved_in;     /* clients taken over from other workers [worker] */
	_Atomic uint64_t moved_out;    /* clients handed over to other workers [worker] */
	_Atomic uint64_t
	    move_failed; /* clients picked for a move that stayed (state too large, send failed) [worker] */
	/* ScalerView.config_gen of the configuration this worker runs; a console's RELOAD waits until every
	   worker has caught up [worker] */
	_Atomic uint64_t config_gen;
	/* the master's view of the worker (doc/workers.md, "When a worker hangs") */
	_Atomic uint64_t listener_mask; /* bit k: it accepts on listener slot k [master] */
	_Atomic uint32_t hung;          /* 1: its loop has not published for worker_watchdog_timeout [master] */
} WorkerSlot;

/* "starting", "active", "draining", "exiting" ("free" for anything else): SHOW WORKERS and /metrics */
static inline const char *slot_state_name(uint32_t st)
{
	switch (st) {
	case SLOT_STARTING:
		return "starting";
	case SLOT_ACTIVE:
		return "active";
	case SLOT_DRAINING:
		return "draining";
	case SLOT_EXITING:
		return "exiting";
	default:
		return "free";
	}
}

/* slot_state_name(), but "hung" for a serving worker the watchdog has flagged: SHOW WORKERS and /metrics */
static inline const char *worker_slot_state_name(WorkerSlot *s)
{
	uint32_t st = atomic_load(&s->state);
	if ((st == SLOT_ACTIVE || st == SLOT_DRAINING) && atomic_load(&s->hung))
		return "hung";
	return slot_state_name(st);
}

/* The scaler's decisions: made by the master (master/scaler.h), shown by the workers' SHOW SCALER. */
typedef enum ScaleDecision {
	SCALE_HOLD = 0, /* keep the current count */
	SCALE_UP = 1,   /* add a worker */
	SCALE_DOWN = 2, /* drain a worker */
} ScaleDecision;

/* "hold", "up", "down" ("unknown" for anything else) */
static inline const char *scaler_decision_name(ScaleDecision d)
{
	switch (d) {
	case SCALE_HOLD:
		return "hold";
	case SCALE_UP:
		return "up";
	case SCALE_DOWN:
		return "down";
	}
	return "unknown";
}

/* Where the CPU allowance came from (doc/workers.md, "The CPU allowance"): SHOW SCALER's cpus_from. */
typedef enum CpusFrom {
	CPUS_FROM_CORES = 0,    /* the physical cores among the allowed CPUs */
	CPUS_FROM_AFFINITY = 1, /* the master's affinity mask */
	CPUS_FROM_CPUSET = 2,   /* the cgroup's cpuset */
	CPUS_FROM_QUOTA = 3,    /* the cgroup's CPU quota */
} CpusFrom;

/* "physical cores", "affinity", "cgroup cpuset", "cgroup quota" ("unknown" for anything else) */
static inline const char *cpus_from_name(CpusFrom f)
{
	switch (f) {
	case CPUS_FROM_CORES:
		return "physical cores";
	case CPUS_FROM_AFFINITY:
		return "affinity";
	case CPUS_FROM_CPUSET:
		return "cgroup cpuset";
	case CPUS_FROM_QUOTA:
		return "cgroup quota";
	}
	return "unknown";
}

/* The scaler's published view, for SHOW WORKERS / SHOW SCALER [master]. */
typedef struct ScalerView {
	alignas(SHM_CACHELINE) _Atomic uint32_t current; /* active workers */
	_Atomic uint32_t target;                         /* where the scaler is heading */
	_Atomic uint32_t min_workers;
	_Atomic uint32_t max_workers;                     /* resolved (0 = cores already replaced) */
	_Atomic uint32_t last_decision;                   /* ScaleDecision */
	_Atomic uint64_t last_change_us;                  /* wall clock of the last change, 0 = none */
	_Atomic uint32_t tcp_migrate_req;                 /* net.ipv4.tcp_migrate_req at start */
	_Atomic uint32_t predecessor_live;                /* 1 while the tree this one took over from (-R) still runs */
	char last_reason[128];                            /* written by the master between seq bumps */
	_Atomic uint32_t reason_seq;                      /* odd while last_reason is being written */
	_Atomic uint64_t decisions[3];                    /* decisions taken, by ScaleDecision (metrics) */
	_Atomic uint32_t busy_milli[SHM_MAX_WORKERS];     /* last busy ratio x1000 per slot */
	_Atomic uint32_t busy_avg_milli[SHM_MAX_WORKERS]; /* moving average x1000 per slot */
	_Atomic uint32_t wait_milli[SHM_MAX_WORKERS];     /* last run-queue wait ratio x1000 per slot */
	_Atomic uint32_t wait_avg_milli[SHM_MAX_WORKERS]; /* moving average x1000 per slot */
	_Atomic uint64_t config_gen; /* configurations the master has loaded: bumped by each successful reload,
	                                before the workers are signalled [master] */
	_Atomic uint32_t cpus_milli; /* the CPU allowance x1000 (1500 for a quota of 1.5 CPUs) [master] */
	_Atomic uint32_t cpus_from;  /* CpusFrom: the limit that set it [master] */
	_Atomic uint32_t
	    idle_milli; /* idle CPUs of the allowance at the last sample x1000; UINT32_MAX = unknown [master] */
	_Atomic uint32_t throttled_milli; /* share of the cgroup's quota periods throttled at the last sample x1000
	                                     [master] */
} ScalerView;

typedef enum BudgetKind {
	BUDGET_POOL = 1,         /* servers of one (database, pool user): pool_size, reserve, min_pool_size */
	BUDGET_DB = 2,           /* servers of a database, all users: max_db_connections */
	BUDGET_USER = 3,         /* servers of a pool user, all databases: max_user_connections */
	BUDGET_DB_CLIENTS = 4,   /* client connections of a database: max_db_client_connections */
	BUDGET_USER_CLIENTS = 5, /* client connections of a login user: max_user_client_connections */
} BudgetKind;

typedef enum BudgetEntryState {
	BUDGET_EMPTY = 0,    /* free */
	BUDGET_CLAIMING = 1, /* a worker is writing the key */
	BUDGET_READY = 2,    /* in use */
	BUDGET_DEAD = 3,     /* claimer died mid-claim; skipped */
} BudgetEntryState;

/* Server connections of one pool, database or user across all workers. */
typedef struct BudgetEntry {
	alignas(SHM_CACHELINE) _Atomic uint32_t state; /* BudgetEntryState | claimer slot << 8 */
	uint32_t kind;                                 /* BudgetKind [claimer, before READY] */
	uint64_t hash;                                 /* of (kind, db, user) [claimer, before READY] */
	char db[SHM_BUDGET_DBNAME];                    /* database name, "" for BUDGET_USER */
	char user[SHM_BUDGET_USER];                    /* pool user name, "" for BUDGET_DB */
	_Atomic int32_t count;                         /* servers, all workers [CAS by workers; master] */
	_Atomic uint64_t want_mask;             /* bit w: worker w has clients waiting for room here [fetch_or/and] */
	_Atomic uint16_t held[SHM_MAX_WORKERS]; /* servers of worker w [worker w; master zeroes after reaping] */
	/* logged-in clients of worker w in the pool (pool entries only; weighs the fair share) [worker w; master zeroes] */
	_Atomic uint16_t demand[SHM_MAX_WORKERS];
} BudgetEntry;

/* Limits that span the process tree (doc/workers.md, "Limits span all workers"). */
typedef struct GlobalBudget {
	alignas(SHM_CACHELINE) _Atomic int32_t clients; /* client connections, all workers (max_client_conn) */
	_Atomic int32_t clients_of[SHM_MAX_WORKERS];    /* worker w's share [worker w; master zeroes] */
	BudgetEntry entries[SHM_BUDGET_ENTRIES];
	/*
	 * SHOW STATS totals of the database of entry i (a BUDGET_DB entry), as
	 * every worker of the tree has counted them so far, exited ones included:
	 * each adds what it counted since its last addition, every 100 ms and
	 * before it answers a SHOW STATS, so the totals never go back while the
	 * tree runs (doc/workers.md, "The admin console with several workers") [every worker,
	 * fetch-add]
	 */
	alignas(SHM_CACHELINE) _Atomic uint64_t db_stats[SHM_BUDGET_ENTRIES][SHM_STATS_FIELDS];
} GlobalBudget;

typedef struct ShmSegment {
	uint32_t magic;     /* SHM_MAGIC */
	uint32_t version;   /* SHM_VERSION */
	uint32_t n_slots;   /* SHM_MAX_WORKERS */
	uint32_t slot_size; /* sizeof(WorkerSlot), checked by workers */
	ScalerView scaler;
	WorkerSlot slots[SHM_MAX_WORKERS];
	GlobalBudget budget;
	alignas(SHM_CACHELINE) _Atomic uint64_t next_socket_id; /* SHOW CLIENTS/SERVERS ids, unique in the tree
	                                                           [every worker, fetch-add] */
} ShmSegment;

/*
 * The id of the n-th connection counted by next_socket_id (n >= 1): SHOW's
 * `id` column is an int4, so the ids go round within 1..2^31-1
 * (doc/workers.md, "Connection ids").
 */
static inline uint64_t shm_socket_id(uint64_t n)
{
	return n == 0 ? 1 : (n - 1) % INT32_MAX + 1;
}

_Static_assert(sizeof(WorkerSlot) % SHM_CACHELINE == 0, "worker slots must fill whole cache lines");
/*
 * The config_gen and cpus fields took padding: the sizes, and so every
 * offset a successor reads from a version 7 segment (-R), are those of
 * version 7.
 */
_Static_assert(sizeof(WorkerSlot) == 256 && sizeof(ScalerView) == 1280, "version 7 layout changed: bump SHM_VERSION");
_Static_assert(alignof(WorkerSlot) == SHM_CACHELINE, "worker slots must be cache-line aligned");

_Static_assert(sizeof(BudgetEntry) % SHM_CACHELINE == 0, "budget entries must fill whole cache lines");

#endif
