/*
 * The rebalancing plan: from each worker's client counts and busy ratio,
 * which worker hands how many of its movable clients to which other one
 * (doc/workers.md, "Rebalancing long-lived clients"). A pure function, no
 * I/O, so it can be unit-tested alone; the master carries the plan out.
 */
#ifndef PGB_MASTER_REBALANCE_H
#define PGB_MASTER_REBALANCE_H

#include <stdbool.h>

#define REBALANCE_MAX_MOVES 64

/* One worker as the plan sees it. */
typedef struct RebalanceWorker {
	int slot;      /* worker slot number (copied into the moves) */
	int clients;   /* logged-in clients, movable or not (consoles not counted) */
	int movable;   /* of which could move now (between transactions, plain socket) */
	double busy;   /* last busy ratio, 0..1 */
	bool draining; /* hands over everything movable and takes nothing */
} RebalanceWorker;

/* Move up to `count` movable clients of worker slot `from` to worker slot `to`. */
typedef struct RebalanceMove {
	int from;
	int to;
	int count;
} RebalanceMove;

typedef struct RebalanceConfig {
	int min_tolerance;      /* clients: counts within this of their target are even */
	double tolerance_ratio; /* ... or within this share of the mean, whichever is larger */
	double busy_gap;        /* busy ratios further apart than this let clients move inside the tolerance */
	double busy_full;       /* a worker this busy takes no clients, except from a draining one */
} RebalanceConfig;

/* The defaults the master uses (doc/workers.md): 2 clients or 10%, busy gap 0.25, full at 0.9. */
RebalanceConfig rebalance_default_config(void);

/* How far from its target a worker's count may be: max(min_tolerance, ceil(mean * tolerance_ratio)). */
int rebalance_tolerance(const RebalanceConfig *cfg, int total_clients, int n_active);

/*
 * The plan: up to max_moves moves written to out, the number returned (0:
 * even, nothing to do). Targets: every client spread evenly over the
 * workers that are not draining. A draining worker gives every movable
 * client. Otherwise a worker gives only when some worker's count is more
 * than the tolerance away from its target, and then gives down to its
 * target (never more than it can move); receivers fill up to theirs. When
 * the counts are even but the busy ratios differ by more than busy_gap,
 * the busiest worker gives a few clients to the least busy one, never
 * leaving the tolerance band, so that the count rule never moves them back.
 */
int rebalance_plan(const RebalanceWorker *w, int n, const RebalanceConfig *cfg, RebalanceMove *out, int max_moves);

#endif
