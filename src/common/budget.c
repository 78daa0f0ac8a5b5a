/*
 * The global budget: an open-addressing table of per-pool, per-database and
 * per-user server counts in shared memory, plus the client counter. Units
 * are taken with compare-and-swap and never with a lock (see include/shm.h).
 */
#include "autoconfig.h"

#include "common/budget.h"

#include <sched.h>
#include <string.h>

#define STATE_MASK  0xffu
#define CLAIM_SPINS 10000 /* sched_yield() rounds to wait for another worker's claim */

static uint64_t key_hash(BudgetKind kind, const char *db, const char *user)
{
	/* FNV-1a: only spreads keys over the table; equal keys are compared in full */
	uint64_t h = 1469598103934665603ull;
	const char *parts[] = {db, user};
	h = (h ^ (uint8_t)kind) * 1099511628211ull;
	for (int p = 0; p < 2; p++) {
		for (const char *c = parts[p]; *c; c++)
			h = (h ^ (uint8_t)*c) * 1099511628211ull;
		h = (h ^ 0xffu) * 1099511628211ull;
	}
	return h;
}

static bool key_equal(const BudgetEntry *e, uint64_t hash, BudgetKind kind, const char *db, const char *user)
{
	return e->hash == hash && e->kind == (uint32_t)kind && strcmp(e->db, db) == 0 && strcmp(e->user, user) == 0;
}

int budget_lookup(GlobalBudget *gb, int self, BudgetKind kind, const char *db, const char *user)
{
	if (strlen(db) >= SHM_BUDGET_DBNAME || strlen(user) >= SHM_BUDGET_USER)
		return -1;
	uint64_t hash = key_hash(kind, db, user);
	for (uint32_t probe = 0; probe < SHM_BUDGET_ENTRIES; probe++) {
		int idx = (int)((hash + probe) % SHM_BUDGET_ENTRIES);
		BudgetEntry *e = &gb->entries[idx];
		uint32_t st = atomic_load(&e->state);
		if ((st & STATE_MASK) == BUDGET_EMPTY) {
			uint32_t claim = BUDGET_CLAIMING | ((uint32_t)self << 8);
			if (atomic_compare_exchange_strong(&e->state, &st, claim)) {
				e->kind = (uint32_t)kind;
				e->hash = hash;
				strcpy(e->db, db);
				strcpy(e->user, user);
				atomic_store(&e->state, BUDGET_READY); /* seq_cst: the key is visible first */
				return idx;
			}
			/* someone else claimed it first: see what it becomes */
		}
		for (int spin = 0; (st & STATE_MASK) == BUDGET_CLAIMING; spin++) {
			if (spin >= CLAIM_SPINS)
				return -1; /* not finished: per-worker limits rather than a duplicate entry */
			sched_yield();
			st = atomic_load(&e->state);
		}
		if ((st & STATE_MASK) == BUDGET_READY && key_equal(e, hash, kind, db, user))
			return idx;
	}
	return -1;
}

void budget_stats_add(GlobalBudget *gb, int idx, const uint64_t delta[SHM_STATS_FIELDS])
{
	for (int f = 0; f < SHM_STATS_FIELDS; f++)
		if (delta[f])
			atomic_fetch_add(&gb->db_stats[idx][f], delta[f]);
}

void budget_stats_read(const GlobalBudget *gb, int idx, uint64_t out[SHM_STATS_FIELDS])
{
	for (int f = 0; f < SHM_STATS_FIELDS; f++)
		out[f] = atomic_load(&gb->db_stats[idx][f]);
}

const GlobalBudget *budget_predecessor;

int budget_foreign_count(const GlobalBudget *gb, int idx)
{
	const GlobalBudget *pb = budget_predecessor;
	if (!pb)
		return 0;
	const BudgetEntry *own = &gb->entries[idx];
	BudgetKind kind = (BudgetKind)own->kind;
	for (uint32_t probe = 0; probe < SHM_BUDGET_ENTRIES; probe++) {
		const BudgetEntry *e = &pb->entries[(own->hash + probe) % SHM_BUDGET_ENTRIES];
		uint32_t st = atomic_load(&e->state) & STATE_MASK;
		if (st == BUDGET_EMPTY)
			return 0;
		if (st == BUDGET_READY && key_equal(e, own->hash, kind, own->db, own->user)) {
			int32_t n = atomic_load(&e->count);
			return n > 0 ? n : 0;
		}
	}
	return 0;
}

int budget_foreign_clients(void)
{
	if (!budget_predecessor)
		return 0;
	int32_t n = atomic_load(&budget_predecessor->clients);
	return n > 0 ? n : 0;
}

bool budget_take(GlobalBudget *gb, int self, int idx, int limit)
{
	BudgetEntry *e = &gb->entries[idx];
	int32_t cur = atomic_load(&e->count);
	do {
		if (limit > 0 && cur >= limit)
			return false;
	} while (!atomic_compare_exchange_weak(&e->count, &cur, cur + 1));
	atomic_fetch_add(&e->held[self], 1);
	return true;
}

void budget_give(GlobalBudget *gb, int self, int idx)
{
	BudgetEntry *e = &gb->entries[idx];
	if (atomic_load(&e->held[self]) == 0)
		return; /* nothing of ours left (cannot happen unless the master reset us) */
	atomic_fetch_sub(&e->held[self], 1);
	atomic_fetch_sub(&e->count, 1);
}

int budget_held(GlobalBudget *gb, int w, int idx)
{
	return atomic_load(&gb->entries[idx].held[w]);
}

void budget_want(GlobalBudget *gb, int self, int idx, bool on)
{
	uint64_t bit = 1ull << self;
	if (on)
		atomic_fetch_or(&gb->entries[idx].want_mask, bit);
	else
		atomic_fetch_and(&gb->entries[idx].want_mask, ~bit);
}

/* Bit w: worker w holds servers of the entry or waits for room in it. */
static uint64_t participant_mask(const BudgetEntry *e)
{
	uint64_t mask = atomic_load(&e->want_mask);
	for (int w = 0; w < SHM_MAX_WORKERS; w++)
		if (atomic_load(&e->held[w]) > 0)
			mask |= 1ull << w;
	return mask;
}

void budget_set_demand(GlobalBudget *gb, int self, int idx, int clients)
{
	uint16_t d = clients < 0 ? 0 : clients > UINT16_MAX ? UINT16_MAX : (uint16_t)clients;
	if (atomic_load(&gb->entries[idx].demand[self]) != d)
		atomic_store(&gb->entries[idx].demand[self], d);
}

/*
 * The limit split among the participants so that the shares add up to the
 * limit exactly: a sum above it would let a worker that holds "its share"
 * keep room that another worker's share counts on, and that one would
 * starve (a pool of 2, shares rounded up to 2 and 1). Each participant gets
 * limit * weight / total rounded down, the rest goes one by one to the
 * largest remainders (ties: the lower worker number), and a participant
 * with weight gets at least 1 while others have more. Every worker
 * computes the same split from the same counters.
 */
static int split_share(int limit, const uint64_t weight[SHM_MAX_WORKERS], uint64_t mask, int self)
{
	int share[SHM_MAX_WORKERS] = {0};
	uint64_t total = 0;
	for (int w = 0; w < SHM_MAX_WORKERS; w++)
		if (mask & (1ull << w))
			total += weight[w];
	if (total == 0 || limit <= 0)
		return 0;
	int given = 0;
	uint64_t rem[SHM_MAX_WORKERS] = {0};
	for (int w = 0; w < SHM_MAX_WORKERS; w++)
		if (mask & (1ull << w)) {
			share[w] = (int)((uint64_t)limit * weight[w] / total);
			rem[w] = (uint64_t)limit * weight[w] % total;
			given += share[w];
		}
	while (given < limit) {
		int best = -1;
		for (int w = 0; w < SHM_MAX_WORKERS; w++)
			if ((mask & (1ull << w)) && weight[w] > 0 && (best < 0 || rem[w] > rem[best]))
				best = w;
		share[best]++;
		rem[best] = 0;
		given++;
	}
	for (int w = 0; w < SHM_MAX_WORKERS; w++) {
		if (!(mask & (1ull << w)) || weight[w] == 0 || share[w] > 0)
			continue;
		int richest = -1;
		for (int v = 0; v < SHM_MAX_WORKERS; v++)
			if (share[v] > 1 && (richest < 0 || share[v] > share[richest]))
				richest = v;
		if (richest < 0)
			break; /* fewer servers than workers with clients: some get none */
		share[richest]--;
		share[w]++;
	}
	return share[self];
}

int budget_fair_share(GlobalBudget *gb, int self, int idx, int limit)
{
	const BudgetEntry *e = &gb->entries[idx];
	uint64_t mask = participant_mask(e) | (1ull << self);
	uint64_t weight[SHM_MAX_WORKERS] = {0}, total = 0;
	for (int w = 0; w < SHM_MAX_WORKERS; w++)
		if (mask & (1ull << w))
			total += weight[w] = atomic_load(&e->demand[w]);
	/*
	 * In proportion to the clients: a worker the scaler just added, to
	 * which rebalancing moved a few of 2,000 clients, should not take half
	 * of the pool from the worker that still serves the rest. Nobody said
	 * how many: evenly.
	 */
	if (total == 0)
		for (int w = 0; w < SHM_MAX_WORKERS; w++)
			weight[w] = (mask >> w) & 1;
	return split_share(limit, weight, mask, self);
}

bool budget_should_yield(GlobalBudget *gb, int self, int idx, int limit, bool self_needs)
{
	if (limit <= 0 || !budget_others_want(gb, self, idx) || budget_count(gb, idx) < limit)
		return false;
	return !self_needs || budget_held(gb, self, idx) > budget_fair_share(gb, self, idx, limit);
}

void budget_clients_add(GlobalBudget *gb, int self, int delta)
{
	atomic_fetch_add(&gb->clients, delta);
	atomic_fetch_add(&gb->clients_of[self], delta);
}

void budget_clients_move(GlobalBudget *gb, int from, int to)
{
	/* the receiver first: a sum taken meanwhile sees one too many, never one too few */
	atomic_fetch_add(&gb->clients_of[to], 1);
	atomic_fetch_sub(&gb->clients_of[from], 1);
}

bool budget_move(GlobalBudget *gb, int from, int to, int idx)
{
	BudgetEntry *e = &gb->entries[idx];
	if (atomic_load(&e->held[from]) == 0)
		return false;
	atomic_fetch_add(&e->held[to], 1);
	atomic_fetch_sub(&e->held[from], 1);
	return true;
}

int budget_clients(GlobalBudget *gb)
{
	return atomic_load(&gb->clients);
}

void budget_reset_worker(GlobalBudget *gb, int w)
{
	uint64_t bit = 1ull << w;
	for (int i = 0; i < SHM_BUDGET_ENTRIES; i++) {
		BudgetEntry *e = &gb->entries[i];
		uint32_t st = atomic_load(&e->state);
		if (st == (BUDGET_CLAIMING | ((uint32_t)w << 8))) {
			(void)atomic_compare_exchange_strong(&e->state, &st, BUDGET_DEAD);
			continue;
		}
		if ((st & STATE_MASK) != BUDGET_READY)
			continue;
		atomic_store(&e->demand[w], 0);
		uint16_t held = atomic_exchange(&e->held[w], 0);
		if (held)
			atomic_fetch_sub(&e->count, held);
		atomic_fetch_and(&e->want_mask, ~bit);
	}
	int32_t clients = atomic_exchange(&gb->clients_of[w], 0);
	if (clients)
		atomic_fetch_sub(&gb->clients, clients);
}
