/*
 * The global budget in shared memory (include/shm.h): server connections
 * per pool, database and user, and client connections, counted across all
 * workers with atomics. Pure logic on a GlobalBudget, used by workers to
 * take and give back units and by the master to return a dead worker's share.
 */
#ifndef PGB_COMMON_BUDGET_H
#define PGB_COMMON_BUDGET_H

#include <stdbool.h>

#include "shm.h"

/*
 * The entry of (kind, db, user), created if new. Returns its index, or -1
 * when the table is full, a name is too long, or a claim by another worker
 * does not finish (the caller then falls back to a per-worker limit).
 */
int budget_lookup(GlobalBudget *gb, int self, BudgetKind kind, const char *db, const char *user)
    __attribute__((warn_unused_result));

/* Add a worker's new counts to the SHOW STATS totals of the database of entry idx (db_stats). */
void budget_stats_add(GlobalBudget *gb, int idx, const uint64_t delta[SHM_STATS_FIELDS]);

/* The SHOW STATS totals of the database of entry idx, as far as the workers have added them. */
void budget_stats_read(const GlobalBudget *gb, int idx, uint64_t out[SHM_STATS_FIELDS]);

/* One unit of entry idx for worker self, if the count is below limit (limit <= 0: no limit). */
bool budget_take(GlobalBudget *gb, int self, int idx, int limit) __attribute__((warn_unused_result));

/*
 * Online restart (doc/workers.md "Upgrading"): the old tree's table, mapped
 * read-only by the new master before its workers fork (NULL: none). While
 * the old tree runs, its counts add to ours: budget_foreign_count() gives
 * the count of the entry with the same key as our entry idx (0 if none).
 */
extern const GlobalBudget *budget_predecessor;
int budget_foreign_count(const GlobalBudget *gb, int idx);
int budget_foreign_clients(void);

/* Give back a unit that worker self took. */
void budget_give(GlobalBudget *gb, int self, int idx);

/* Servers of the entry across all workers (inline: asked at every release). */
static inline int budget_count(GlobalBudget *gb, int idx)
{
	return atomic_load(&gb->entries[idx].count);
}

/* Servers of the entry held by worker w. */
int budget_held(GlobalBudget *gb, int w, int idx);

/* Worker self has (on) or no longer has clients waiting for room in the entry. */
void budget_want(GlobalBudget *gb, int self, int idx, bool on);

/* Whether a worker other than self waits for room in the entry (inline: asked at every release). */
static inline bool budget_others_want(GlobalBudget *gb, int self, int idx)
{
	return (atomic_load(&gb->entries[idx].want_mask) & ~(1ull << self)) != 0;
}

/* Worker self serves `clients` logged-in clients that use the entry (published at its budget tick). */
void budget_set_demand(GlobalBudget *gb, int self, int idx, int clients);

/*
 * Worker self's fair share of the entry's limit: divided among the
 * participants in proportion to the clients each serves when they said
 * (budget_set_demand(); a participant with clients gets at least 1 while
 * the limit allows), else evenly; the shares add up to the limit exactly.
 */
int budget_fair_share(GlobalBudget *gb, int self, int idx, int limit);

/*
 * Whether worker self should give one of its servers of the entry to a
 * waiting worker: someone else waits, the entry is at limit, and self holds
 * more than its fair share (budget_fair_share()), or needs none itself.
 */
bool budget_should_yield(GlobalBudget *gb, int self, int idx, int limit, bool self_needs);

/* Client connections: worker self gained (+1) or lost (-1) one. */
void budget_clients_add(GlobalBudget *gb, int self, int delta);
int budget_clients(GlobalBudget *gb);

/*
 * A client moving from worker `from` to worker `to` of the tree takes its
 * units along without the totals dipping, so that no login slips in while
 * it is on its way: its client connection (budget_clients_move) and its
 * units of entries (budget_move). False if `from` held none (the master
 * reset it): nothing moved.
 */
void budget_clients_move(GlobalBudget *gb, int from, int to);
bool budget_move(GlobalBudget *gb, int from, int to, int idx);

/* Master, after reaping worker w: give back everything it held, drop its wishes and half-made entries. */
void budget_reset_worker(GlobalBudget *gb, int w);

#endif
