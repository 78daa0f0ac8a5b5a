/*
 * The shared-memory contract between the master and its workers: one
 * anonymous MAP_SHARED segment created by the master before the first fork.
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
 */
#ifndef PGB_SHM_H
#define PGB_SHM_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>

#define SHM_MAGIC       0x50474257u /* "PGBW" */
#define SHM_VERSION     1u
#define SHM_MAX_WORKERS 64
#define SHM_CACHELINE   64

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
	_Atomic uint64_t sample_time_ns;               /* monotonic time of the last busy_ns update [worker] */
	_Atomic uint64_t accepted;                     /* accepted connections [worker] */
	_Atomic uint64_t tls_handshakes;               /* completed TLS handshakes with clients [worker] */
	_Atomic uint64_t xact_count;                   /* transactions [worker] */
	_Atomic uint64_t query_count;                  /* queries [worker] */
	_Atomic uint64_t bytes_in;                     /* bytes from clients [worker] */
	_Atomic uint64_t bytes_out;                    /* bytes to clients [worker] */
	_Atomic uint32_t cl_active;                    /* current gauges [worker] */
	_Atomic uint32_t cl_waiting;
	_Atomic uint32_t sv_active;
	_Atomic uint32_t sv_idle;
} WorkerSlot;

/* The scaler's published view, for SHOW WORKERS / SHOW SCALER [master]. */
typedef struct ScalerView {
	alignas(SHM_CACHELINE) _Atomic uint32_t current; /* active workers */
	_Atomic uint32_t target;                         /* where the scaler is heading */
	_Atomic uint32_t min_workers;
	_Atomic uint32_t max_workers;                     /* resolved (0 = cores already replaced) */
	_Atomic uint32_t last_decision;                   /* ScaleDecision */
	_Atomic uint64_t last_change_us;                  /* wall clock of the last change, 0 = none */
	_Atomic uint32_t tcp_migrate_req;                 /* net.ipv4.tcp_migrate_req at start */
	char last_reason[128];                            /* written by the master between seq bumps */
	_Atomic uint32_t reason_seq;                      /* odd while last_reason is being written */
	_Atomic uint32_t busy_milli[SHM_MAX_WORKERS];     /* last busy ratio x1000 per slot */
	_Atomic uint32_t busy_avg_milli[SHM_MAX_WORKERS]; /* moving average x1000 per slot */
} ScalerView;

typedef struct ShmSegment {
	uint32_t magic;     /* SHM_MAGIC */
	uint32_t version;   /* SHM_VERSION */
	uint32_t n_slots;   /* SHM_MAX_WORKERS */
	uint32_t slot_size; /* sizeof(WorkerSlot), checked by workers */
	ScalerView scaler;
	WorkerSlot slots[SHM_MAX_WORKERS];
	alignas(SHM_CACHELINE) _Atomic uint64_t next_socket_id; /* SHOW CLIENTS/SERVERS ids, unique in the tree
	                                                           [every worker, fetch-add] */
} ShmSegment;

_Static_assert(sizeof(WorkerSlot) % SHM_CACHELINE == 0, "worker slots must fill whole cache lines");
_Static_assert(alignof(WorkerSlot) == SHM_CACHELINE, "worker slots must be cache-line aligned");

#endif
