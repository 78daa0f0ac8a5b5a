/*
 * Server assignment: give a waiting client an idle server of its pool,
 * launch new server connections within the pool's limits (one login in
 * flight per pool; limits counted across all workers in the global budget),
 * give idle servers back to workers whose clients wait, replay tracked
 * parameters, and fail queued clients when the server refuses logins.
 */
#include "autoconfig.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/budget.h"
#include "common/log.h"
#include "common/pktbuf.h"
#include "common/util.h"
#include "worker/hooks.h"
#include "worker/welcome.h"
#include "worker/objects.h"
#include "worker/pool.h"
#include "worker/pool_policy.h"
#include "worker/pool_settings.h"
#include "worker/server.h"
#include "worker/txn.h"
#include "worker/worker.h"

static bool pool_paused(const PgPool *pool)
{
	return wk.pause_mode != P_NONE || pool->db->paused;
}

bool pool_retry_wait(const PgPool *pool)
{
	return policy_login_retry_wait(pool->last_login_failed, pool->last_failed_time, wk.now,
	                               wk.cf.g.server_login_retry);
}

/* ---- the global budget (include/shm.h, common/budget.c) ---- */

static GlobalBudget *gbudget(void)
{
	return wk.slot ? &wk.shm->budget : NULL;
}

/* budget_entry() the first time: look the entry up. */
static void budget_entry_lookup(BudgetRef *ref, BudgetKind kind, const char *db, const char *user)
{
	int idx = gbudget() ? budget_lookup(gbudget(), wk.id, kind, db, user) : -1;
	ref->idx = idx < 0 ? -1 : idx + 1;
	static bool warned;
	if (idx < 0 && gbudget() && !warned) {
		warned = true;
		log_warning("global budget table full (%d entries): limits of %s/%s and others apply per worker",
		            SHM_BUDGET_ENTRIES, *db ? db : "*", *user ? user : "*");
	}
}

/* The entry index behind ref, looked up once; -1 = per-worker limits (no segment, or table full). */
static inline int budget_entry(BudgetRef *ref, BudgetKind kind, const char *db, const char *user)
{
	if (ref->idx == 0)
		budget_entry_lookup(ref, kind, db, user);
	return ref->idx > 0 ? ref->idx - 1 : -1;
}

static int pool_entry(PgPool *pool)
{
	return budget_entry(&pool->budget, BUDGET_POOL, pool->db->name, pool->user->name);
}

static int db_entry(PgDatabase *db)
{
	return budget_entry(&db->budget, BUDGET_DB, db->name, "");
}

static int user_entry(PgUser *u)
{
	return budget_entry(&u->budget, BUDGET_USER, "", u->name);
}

/* The ref of the pool's limit k (LIMIT_*: pool_size, max_db_connections, max_user_connections). */
static BudgetRef *limit_ref(PgPool *pool, int k)
{
	return k == LIMIT_POOL ? &pool->budget : k == LIMIT_DB ? &pool->db->budget : &pool->user->budget;
}

/* The budget entry of the pool's limit k, looked up once; -1: counted per worker. */
static inline int limit_entry(PgPool *pool, int k)
{
	static const BudgetKind kinds[LIMIT_COUNT] = {BUDGET_POOL, BUDGET_DB, BUDGET_USER};
	BudgetRef *ref = limit_ref(pool, k);
	if (__builtin_expect(ref->idx == 0, 0)) /* the names only for the first lookup */
		return budget_entry(ref, kinds[k], k == LIMIT_USER ? "" : pool->db->name,
		                    k == LIMIT_DB ? "" : pool->user->name);
	return ref->idx > 0 ? ref->idx - 1 : -1;
}

/* This worker's servers under the pool's limit k: what counts when it has no entry. */
static int limit_local(const PgPool *pool, int k)
{
	return k == LIMIT_POOL ? pool_server_count(pool)
	       : k == LIMIT_DB ? pool->db->server_count
	                       : pool->user->server_count;
}

/*
 * During an online restart the old tree's connections count too
 * (doc/workers.md "Upgrading"): its count for the same key as our entry e,
 * while the master says that tree still runs. Inline: read whenever a
 * client waits for a server, and almost always without an old tree.
 */
static inline int foreign(int e)
{
	if (__builtin_expect(!budget_predecessor, 1) || !atomic_load(&wk.shm->scaler.predecessor_live))
		return 0;
	return budget_foreign_count(gbudget(), e);
}

/*
 * The part of limit that this tree can use: what the old tree of an online
 * restart holds (foreign()) is not ours to share among our workers. Fair
 * shares and give-backs are reckoned on it, as take_units() does, or a
 * worker would keep servers "below the limit" while another one's clients
 * wait for room the old tree holds. At least 1, so that a limit the old
 * tree fills alone still counts as reached; 0 (no limit) stays 0.
 */
static int tree_limit(int e, int limit)
{
	if (limit <= 0 || e < 0)
		return limit;
	int room = limit - foreign(e);
	return room > 0 ? room : 1;
}

int pool_global_servers(PgPool *pool)
{
	int e = pool_entry(pool);
	return e >= 0 ? budget_count(gbudget(), e) + foreign(e) : pool_server_count(pool);
}

/* Say (or stop saying) that our clients wait for room in the entry behind ref. */
static void budget_set_want(BudgetRef *ref, bool on)
{
	if (ref->idx <= 0 || ref->want == on)
		return;
	budget_want(gbudget(), wk.id, ref->idx - 1, on);
	ref->want = on;
}

/*
 * All or nothing: one unit of each of n entries (idx[k] < 0: the entry did
 * not fit in the table, so the worker's own count `local[k]` is checked
 * against the limit instead). Returns -1 on success, else the k that had no
 * room; on failure nothing stays taken.
 */
static int take_units(BudgetHold *hold, int n, const int idx[], const int limit[], const int local[])
{
	*hold = (BudgetHold){.taken = true, .idx = {-1, -1, -1}};
	for (int k = 0; k < n; k++) {
		/* room left by the old tree of an online restart, if it still runs */
		int room = limit[k] > 0 && idx[k] >= 0 ? limit[k] - foreign(idx[k]) : limit[k];
		bool ok = idx[k] >= 0 ? (limit[k] <= 0 || room > 0) && budget_take(gbudget(), wk.id, idx[k], room)
		                      : limit[k] <= 0 || local[k] < limit[k];
		if (!ok) {
			budget_hold_release(hold);
			return k;
		}
		hold->idx[k] = idx[k];
	}
	return -1;
}

/*
 * One unit of the pool's (below pool_limit), the database's and the user's
 * server budget. Returns NULL on success, else the ref of the entry that had
 * no room.
 */
static BudgetRef *take_budget(PgPool *pool, int pool_limit, BudgetHold *hold)
{
	const PgPool *set = pool_settings(pool);
	int idx[LIMIT_COUNT], limit[LIMIT_COUNT] = {pool_limit, set->max_db, set->max_user}, local[LIMIT_COUNT];
	for (int k = 0; k < LIMIT_COUNT; k++) {
		idx[k] = limit_entry(pool, k);
		local[k] = limit_local(pool, k);
	}
	int full = take_units(hold, LIMIT_COUNT, idx, limit, local);
	return full < 0 ? NULL : limit_ref(pool, full);
}

const char *pool_take_client_budget(PgSocket *c, int max_db, int max_user)
{
	PgDatabase *db = c->db;
	PgUser *u = c->login_user;
	static const char *const names[2] = {"max_db_client_connections", "max_user_client_connections"};
	int idx[2] = {budget_entry(&db->client_budget, BUDGET_DB_CLIENTS, db->name, ""),
	              budget_entry(&u->client_budget, BUDGET_USER_CLIENTS, "", u->name)};
	int limit[2] = {max_db, max_user};
	int local[2] = {db->client_count, u->client_count};
	int full = take_units(&c->budget, 2, idx, limit, local);
	return full < 0 ? NULL : names[full];
}

bool pool_move_client_budget(PgSocket *c, int to, int moved[2])
{
	GlobalBudget *gb = gbudget();
	moved[0] = moved[1] = -1;
	if (!gb || to < 0 || to >= SHM_MAX_WORKERS || to == wk.id)
		return false;
	for (int k = 0; k < 2; k++)
		if (c->budget.taken && c->budget.idx[k] >= 0 && budget_move(gb, wk.id, to, c->budget.idx[k]))
			moved[k] = c->budget.idx[k];
	budget_clients_move(gb, wk.id, to);
	return true;
}

void pool_unmove_client_budget(PgSocket *c, int to, const int moved[2])
{
	GlobalBudget *gb = gbudget();
	for (int k = 0; k < 2; k++)
		if (moved[k] >= 0 && !budget_move(gb, to, wk.id, moved[k]))
			c->budget.idx[k] = -1; /* the master reset `to` meanwhile: the unit went with it */
	budget_clients_move(gb, to, wk.id);
}

void pool_adopt_client_budget(PgSocket *c, const int *moved)
{
	GlobalBudget *gb = gbudget();
	PgDatabase *db = c->db;
	PgUser *u = c->login_user;
	int own[2] = {budget_entry(&db->client_budget, BUDGET_DB_CLIENTS, db->name, ""),
	              budget_entry(&u->client_budget, BUDGET_USER_CLIENTS, "", u->name)};
	c->budget = (BudgetHold){.taken = true, .idx = {-1, -1, -1}};
	for (int k = 0; k < 2; k++) {
		if (moved && moved[k] >= 0 && moved[k] == own[k]) {
			c->budget.idx[k] = own[k];
			continue;
		}
		if (moved && moved[k] >= 0 && gb)
			budget_give(gb, wk.id, moved[k]);
		/* no limit: it was checked where the client logged in */
		if (own[k] >= 0 && budget_take(gb, wk.id, own[k], 0))
			c->budget.idx[k] = own[k];
	}
}

void pool_drop_moved_client_budget(const int moved[2])
{
	GlobalBudget *gb = gbudget();
	if (!gb)
		return;
	for (int k = 0; k < 2; k++)
		if (moved[k] >= 0)
			budget_give(gb, wk.id, moved[k]);
	budget_clients_add(gb, wk.id, -1);
}

bool pool_move_server_budget(PgSocket *s, int to, int moved[3])
{
	GlobalBudget *gb = gbudget();
	moved[0] = moved[1] = moved[2] = -1;
	if (!gb || to < 0 || to >= SHM_MAX_WORKERS || to == wk.id)
		return false;
	for (int k = 0; k < 3; k++)
		if (s->budget.taken && s->budget.idx[k] >= 0 && budget_move(gb, wk.id, to, s->budget.idx[k]))
			moved[k] = s->budget.idx[k];
	return true;
}

void pool_unmove_server_budget(PgSocket *s, int to, const int moved[3])
{
	GlobalBudget *gb = gbudget();
	for (int k = 0; k < 3; k++)
		if (moved[k] >= 0 && !budget_move(gb, to, wk.id, moved[k]))
			s->budget.idx[k] = -1; /* the master reset `to` meanwhile: the unit went with it */
}

void pool_adopt_server_budget(PgSocket *s, const int *moved)
{
	GlobalBudget *gb = gbudget();
	PgPool *pool = s->pool;
	int own[3] = {pool_entry(pool), db_entry(pool->db), user_entry(pool->user)};
	s->budget = (BudgetHold){.taken = true, .idx = {-1, -1, -1}};
	for (int k = 0; k < 3; k++) {
		if (moved && moved[k] >= 0 && moved[k] == own[k]) {
			s->budget.idx[k] = own[k];
			continue;
		}
		if (moved && moved[k] >= 0 && gb)
			budget_give(gb, wk.id, moved[k]);
		/* no limit: the connection exists; it was counted where it was made (another tree: the giver gave
		   its unit back as it sent it, so for the instant between the two neither tree counts it) */
		if (own[k] >= 0 && budget_take(gb, wk.id, own[k], 0))
			s->budget.idx[k] = own[k];
	}
}

void pool_drop_moved_server_budget(const int moved[3])
{
	GlobalBudget *gb = gbudget();
	if (!gb)
		return;
	for (int k = 0; k < 3; k++)
		if (moved[k] >= 0)
			budget_give(gb, wk.id, moved[k]);
}

/* Whether the pool has clients (or auth_query lookups) that wait for a server. */
static bool pool_needs_server(const PgPool *pool)
{
	return !list_empty(&pool->waiting_clients) || auth_query_waiting(pool);
}

/* Whether another worker may wait for room in the entry behind ref (not looked up yet: maybe). */
static inline bool others_may_want(GlobalBudget *gb, const BudgetRef *ref)
{
	return ref->idx == 0 || (ref->idx > 0 && budget_others_want(gb, wk.id, ref->idx - 1));
}

static bool pool_should_yield_slow(PgPool *pool, usec_t idle_for);

/*
 * Our clients of the pool: logged in, waiting for a server, or waiting for
 * the welcome that the pool's first login provides (and one for auth_query
 * lookups that wait for it: `lookups`). They weigh our fair share of the
 * pool (budget_fair_share()).
 */
static int pool_demand(const PgPool *pool, bool lookups)
{
	const int *n = pool->n_state;
	return n[CL_ACTIVE] + n[CL_WAITING] + n[CL_WAITING_LOGIN] + lookups;
}

static void publish_demand(PgPool *pool)
{
	int e = pool_entry(pool);
	if (e >= 0)
		budget_set_demand(gbudget(), wk.id, e, pool_demand(pool, auth_query_waiting(pool)));
}

/*
 * Whether a free server of the pool, idle for idle_for (0: just released),
 * should go to another worker whose clients wait for room.
 */
static inline bool pool_should_yield(PgPool *pool, usec_t idle_for)
{
	GlobalBudget *gb = gbudget();
	/* the common case, at every release: nobody else waits for room here */
	return gb &&
	       (others_may_want(gb, &pool->budget) || others_may_want(gb, &pool->db->budget) ||
	        others_may_want(gb, &pool->user->budget)) &&
	       pool_should_yield_slow(pool, idle_for);
}

/*
 * How long a free server of a transaction-mode pool with none of its
 * worker's clients waiting stays idle before it goes to another worker
 * whose clients wait, whatever the fair shares (pool_should_yield_slow()).
 */
#define YIELD_IDLE_USEC (USEC_PER_SEC / 2)

static __attribute__((noinline)) bool pool_should_yield_slow(PgPool *pool, usec_t idle_for)
{
	GlobalBudget *gb = gbudget();
	if (pool->db->admin)
		return false;
	publish_demand(pool);
	int ep = pool_entry(pool), ed = db_entry(pool->db), eu = user_entry(pool->user);
	if (!(ep >= 0 && budget_others_want(gb, wk.id, ep)) && !(ed >= 0 && budget_others_want(gb, wk.id, ed)) &&
	    !(eu >= 0 && budget_others_want(gb, wk.id, eu)))
		return false;
	/*
	 * In transaction mode logged-in clients take a server at every
	 * transaction: a free server is theirs up to the fair share, or it
	 * would go back and forth between workers, a new login each time.
	 */
	bool waiting = pool_needs_server(pool);
	bool needs = waiting || (pool_effective_mode(pool) != POOL_SESSION && !list_empty(&pool->active_clients));
	/*
	 * ...but not one idle for a while, none of ours waiting, while another
	 * worker's clients wait: one pooler would give it to them. By client
	 * counts both may hold no more than their share, and a client of the
	 * other worker inside a transaction would keep the rest waiting for as
	 * long as it lasts (doc/workers.md "Limits span all workers").
	 */
	if (needs && !waiting && idle_for >= YIELD_IDLE_USEC)
		needs = false;
	int e;
	if ((e = pool_entry(pool)) >= 0 &&
	    budget_should_yield(gb, wk.id, e, tree_limit(e, pool_effective_size(pool)), needs))
		return true;
	if ((e = db_entry(pool->db)) >= 0 &&
	    budget_should_yield(gb, wk.id, e, tree_limit(e, db_max_connections(pool->db)), needs))
		return true;
	if ((e = user_entry(pool->user)) >= 0 &&
	    budget_should_yield(gb, wk.id, e, tree_limit(e, user_max_connections(pool->user)), needs))
		return true;
	return false;
}

void pool_budget_forget(PgPool *pool)
{
	budget_set_want(&pool->budget, false);
	budget_set_want(&pool->db->budget, false);
	budget_set_want(&pool->user->budget, false); /* set again by another pool of the user if it still waits */
}

/*
 * A worker of a tree that a new one took over (-R) only serves the clients
 * it has: an idle server beyond those of them that hold none can never be
 * used, while the new tree counts it against its limits (doc/workers.md
 * "Upgrading"). How many such servers the pool has.
 */
static int retiring_idle_excess(const PgPool *pool)
{
	const int *n = pool->n_state;
	int unlinked = n[CL_ACTIVE] + n[CL_WAITING] - n[SV_ACTIVE];
	return n[SV_IDLE] + n[SV_USED] - (unlinked > 0 ? unlinked : 0);
}

void pool_budget_tick(void)
{
	if (!gbudget())
		return;
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *pool = container_of(i, PgPool, node);
		pool->db->budget.need = pool->user->budget.need = false;
	}
	list_for_each(i, &wk.pools)
	{
		PgPool *pool = container_of(i, PgPool, node);
		if (pool->budget.idx > 0) /* a pool that never launched has no entry yet: its first launch publishes */
			publish_demand(pool);
		/* a paused pool, or one whose logins fail, waits for other reasons: it asks nobody to give back */
		bool can_use = !pool_paused(pool) && !pool_retry_wait(pool);
		if (pool_needs_server(pool) && can_use)
			pool->db->budget.need = pool->user->budget.need = true;
		else
			budget_set_want(&pool->budget, false);
	}
	list_for_each(i, &wk.pools)
	{
		PgPool *pool = container_of(i, PgPool, node);
		if (!pool->db->budget.need)
			budget_set_want(&pool->db->budget, false);
		if (!pool->user->budget.need)
			budget_set_want(&pool->user->budget, false);
		/* an idle server another worker waits for: the longest idle one goes */
		List *n = list_first(&pool->used_servers);
		if (!n)
			n = list_last(&pool->idle_servers);
		if (n && pool_should_yield(pool, wk.now - container_of(n, PgSocket, node)->request_time))
			disconnect_server(container_of(n, PgSocket, node), true, "given back to another worker");
		else if (n && wk.retiring && retiring_idle_excess(pool) > 0)
			disconnect_server(container_of(n, PgSocket, node), true, "given back to the new process");
		/* room may have come free in another worker */
		if (pool_needs_server(pool))
			pool_maybe_launch(pool);
	}
}

/*
 * Append the statement that gives tracked parameter `idx` the client's
 * `value` to q. Both go through the quoting functions of common/pktbuf.h,
 * whoever sent them (the name quoted once per spelling, var_ident()).
 * search_path is a list whose SET syntax quotes each element, so
 * `SET search_path = '<value>'` would make the whole list one schema name;
 * set_config() takes the value as the server reported it, like a startup
 * parameter does (doc/transaction.md, "Tracked parameters").
 */
static void append_set(PktBuf *q, int idx, const char *value)
{
	const char *name = var_name(idx);
	if (strcasecmp(name, "search_path") == 0) {
		pktbuf_put_bytes(q, "SELECT pg_catalog.set_config(", 29);
		pktbuf_put_sql_literal(q, name);
		pktbuf_put_u8(q, ',');
		pktbuf_put_sql_literal(q, value);
		pktbuf_put_bytes(q, ",false);", 8);
		return;
	}
	const char *ident = var_ident(idx);
	pktbuf_put_bytes(q, "SET ", 4);
	pktbuf_put_bytes(q, ident, strlen(ident));
	pktbuf_put_u8(q, '=');
	pktbuf_put_sql_literal(q, value);
	pktbuf_put_u8(q, ';');
}

/* Append the statement that gives tracked parameter `idx` back the server's own value. */
static void append_reset(PktBuf *q, int idx)
{
	const char *ident = var_ident(idx);
	pktbuf_put_bytes(q, "RESET ", 6);
	pktbuf_put_bytes(q, ident, strlen(ident));
	pktbuf_put_u8(q, ';');
}

/*
 * What the replay does for tracked parameter `idx` of client c on server
 * s: nothing, a SET of the client's value, or a RESET. A value the server
 * never reported (a name in track_extra_parameters that PostgreSQL does
 * not report, search_path before PostgreSQL 18) is SET whenever the
 * client has one, since the pooler cannot know what the server has; a
 * client without one gets the server's own back if a SET put another
 * client's there, or it would see that client's value.
 */
enum { VAR_KEEP, VAR_SET, VAR_RESET };

static int var_action(const PgSocket *c, const PgSocket *s, int idx)
{
	const char *want = sock_var(c, idx), *have = sock_var(s, idx);
	if (!want)
		return !have && (s->vars_unreported & (1u << idx)) ? VAR_RESET : VAR_KEEP;
	if (var_same_value(idx, want, have))
		return VAR_KEEP;
	return VAR_SET;
}

/*
 * Whether `SET <idx> = '<value>'` cannot fail on an idle server: an
 * application_name of printable ASCII, which PostgreSQL takes whatever it
 * says (it only replaces other characters) and which is valid in every
 * server encoding. Such a SET may go out ahead of the client's messages.
 */
static bool set_cannot_fail(int idx, const char *value)
{
	if (strcasecmp(var_name(idx), "application_name") != 0)
		return false;
	for (const unsigned char *p = (const unsigned char *)value; *p; p++)
		if (*p < 0x20 || *p > 0x7e)
			return false;
	return true;
}

/*
 * Replay the client's tracked parameters on its new server. Returns true if
 * a SET query was sent that the client waits for.
 *
 * A SET that cannot fail is not waited for: it is queued for the server
 * and goes out in the same write as the client's message that asked for
 * the server, and its answer is swallowed when it comes (doc/transaction.md,
 * "Tracked parameters"). A login, or in transaction mode a transaction on
 * a server another application used last, then costs one round trip to
 * PostgreSQL less. The server stays not ready until the answers to what
 * followed the SET: in transaction mode the pooler's own answers (a Parse
 * the server has already) go out at once, as nothing precedes them in the
 * request queue, and when they answered all the client sent, the SET's
 * answer makes the server ready. Any other SET is answered before the
 * client's message leaves, so that its failure can still refuse the client.
 */
static bool replay_vars(PgSocket *c, PgSocket *s)
{
	int n = var_count();
	/* values are interned: the same values are the same pointers, the common case at every link */
	if (c->vars == s->vars && !s->vars_unreported)
		return false;
	int first = -1, count = 0;
	bool pipeline = c->sb.dst == &s->sb;
	for (int i = 0; i < n; i++) {
		int act = var_action(c, s, i);
		if (act == VAR_KEEP)
			continue;
		if (first < 0)
			first = i;
		count++;
		pipeline = pipeline && act == VAR_SET && set_cannot_fail(i, sock_var(c, i));
	}
	if (first < 0)
		return false;
	/*
	 * PostgreSQL reads a Query in the client_encoding the server has when
	 * it arrives: a new one goes first, in a Query of its own, so that the
	 * values after it are read in the client's encoding, not in the
	 * previous client's (a LATIN1 name in a UTF8 session is refused). The
	 * server answers each Query (handle_internal_query()). Never pipelined:
	 * a client_encoding may fail.
	 */
	const int enc = VAR_CLIENT_ENCODING;
	bool enc_first = count > 1 && var_action(c, s, enc) == VAR_SET;
	PktBuf own = {0};
	PktBuf *q = pipeline ? sbuf_own_queue(&c->sb) : NULL;
	if (!q) {
		pipeline = false;
		pktbuf_init(&own, 128);
		q = &own;
	}
	if (enc_first) {
		pktbuf_start_msg(q, 'Q');
		append_set(q, enc, sock_var(c, enc));
		pktbuf_put_u8(q, 0);
		pktbuf_finish_msg(q);
		slog_debug(s, "applying tracked parameters: %s", (const char *)q->buf + 5);
	}
	size_t start = q->len;
	pktbuf_start_msg(q, 'Q');
	for (int i = first; i < n; i++) {
		int act = var_action(c, s, i);
		if (act == VAR_KEEP || (enc_first && i == enc))
			continue;
		/* a failed SET or RESET closes the server: what it has is decided here */
		if (act == VAR_RESET) {
			append_reset(q, i);
			s->vars_unreported &= (uint16_t) ~(1u << i);
			continue;
		}
		append_set(q, i, sock_var(c, i));
		if (!sock_var(s, i))
			s->vars_unreported |= (uint16_t)(1u << i);
	}
	pktbuf_put_u8(q, 0);
	pktbuf_finish_msg(q);
	/* the statement text, after the type byte and the length */
	slog_debug(s, "applying tracked parameters: %s", (const char *)q->buf + start + 5);
	if (!pipeline) {
		bool ok = sbuf_send(&s->sb, own.buf, own.len);
		pktbuf_free(&own);
		if (!ok)
			return false;
	}
	s->setting_vars = true;
	s->vars_pipelined = pipeline;
	s->vars_enc_first = enc_first;
	s->ready = false;
	return !pipeline; /* a pipelined SET goes out with the client's message (sbuf's batch) */
}

static void link_client_server(PgSocket *c, PgSocket *s)
{
	PgPool *pool = c->pool;
	pgb_assert((!c->link || c->link == s) && (!s->link || s->link == c) && !c->is_server && s->is_server);
	c->link = s;
	s->link = c;
	c->sb.dst = &s->sb;
	s->sb.dst = &c->sb;
	s->lent = true;
	/*
	 * A RELOAD or SET that changes pool_mode applies from the next link:
	 * what the client sent under the old mode is answered under it.
	 */
	s->link_mode = (char)(c->replication != REPLICATION_NONE ? POOL_SESSION : pool_effective_mode(pool));
	if (s->link_mode == POOL_SESSION) {
		session_tail_reset(&s->session);
		s->unnamed_owner = 0; /* not followed in session mode: nobody's once the link may end (txn.c) */
	}
	change_state(s, SV_ACTIVE);
	if (c->state != CL_ACTIVE)
		change_state(c, CL_ACTIVE);
	pool->stats.server_assignment_count++;
	slog_debug(c, "linked to server S-%p", (const void *)s);
	if (c->wait_start) {
		pool->stats.wait_time += (uint64_t)(wk.now - c->wait_start);
		c->queued_start = c->wait_start;
		c->wait_start = 0;
	}
	/* the server's parameter values become visible to the client through its own SETs */
	if (c->replication == REPLICATION_NONE)
		replay_vars(c, s);
	txn_check_invariants(c);
}

static PgSocket *take_idle_server(PgPool *pool)
{
	List *n = list_first(&pool->idle_servers);
	return n ? container_of(n, PgSocket, node) : NULL;
}

/* Run server_check_query on a used server; it becomes idle when answered. */
static bool start_check(PgSocket *s)
{
	const char *q = wk.cf.g.server_check_query;
	if (!q || !*q) {
		change_state(s, SV_IDLE);
		return false;
	}
	PktBuf pb;
	pktbuf_init(&pb, 64);
	pktbuf_start_msg(&pb, 'Q');
	pktbuf_put_string(&pb, strcmp(q, "<empty>") == 0 ? "" : q);
	pktbuf_finish_msg(&pb);
	bool ok = sbuf_send(&s->sb, pb.buf, pb.len);
	pktbuf_free(&pb);
	if (!ok) {
		disconnect_server(s, false, "server conn crashed?");
		return true;
	}
	s->resetting = true;
	s->checking = true;
	s->ready = false;
	s->lent = false;
	change_state(s, SV_TESTED);
	return true;
}

PgSocket *pool_take_idle(PgPool *pool)
{
	PgSocket *s = take_idle_server(pool);
	if (!s) {
		List *n = list_first(&pool->used_servers);
		if (!n || start_check(container_of(n, PgSocket, node)))
			return NULL;
		s = container_of(n, PgSocket, node); /* no check query any more: idle now */
	}
	s->lent = true;
	return s;
}

bool pool_login_failing(const PgPool *pool)
{
	if (!pool_retry_wait(pool) || pool_paused(pool))
		return false;
	/* servers still logging in do not count: they may fail the same way */
	return pool_server_count(pool) == pool->n_state[SV_LOGIN];
}

bool pool_fast_fail(PgSocket *c, const PgPool *pool)
{
	if (!pool_login_failing(pool))
		return false;
	disconnect_client(c, true, "server login has been failing, cached error: %.99s (server_login_retry)",
	                  pool->failed_msg);
	return true;
}

bool pool_find_server(PgSocket *c)
{
	PgPool *pool = c->pool;
	if (!pool_paused(pool)) {
		/* a used server passes the check query first; its answer wakes the pool */
		PgSocket *s = pool_take_idle(pool);
		if (s) {
			link_client_server(c, s);
			return !s->setting_vars || s->vars_pipelined;
		}
	}
	/* the safe shutdown hands out no more servers: queueing would be for ever */
	if (wk.run_state == RUN_SHUTDOWN_SERVERS) {
		disconnect_client(c, true, "server shutting down");
		return false;
	}
	if (pool_fast_fail(c, pool))
		return false;
	if (!c->wait_start) {
		/* a client moved here while waiting keeps its place in time, and its query_wait_notify NOTICE */
		c->wait_start = wk.now;
		c->wait_notice_sent = false;
	}
	change_state(c, CL_WAITING);
	pool_maybe_launch(pool);
	return false;
}

/* Give a server to the first waiting client, or welcome clients waiting for the first login. */
void pool_server_ready(PgSocket *s)
{
	PgPool *pool = s->pool;
	const char *check = wk.cf.g.server_check_query;
	ReleaseInput in = {
	    .cancels_pending = s->cancels_pending > 0,
	    .close_needed = s->close_needed,
	    /* PAUSE and the safe shutdown close every server their client releases */
	    .paused = pool_paused(pool) || wk.run_state == RUN_SHUTDOWN_SERVERS,
	    .yield = s->replication == REPLICATION_NONE && pool_should_yield(pool, 0),
	    .lifetime = pool_server_lifetime(pool),
	    .size = pool_effective_size(pool),
	    .age = wk.now - s->connect_time,
	    .since_lifetime_close = wk.now - pool->last_lifetime_close,
	    .check_query = check && *check,
	    .check_delay = wk.cf.g.server_check_delay,
	    .lent = s->lent,
	};
	ReleaseVerdict v = policy_release(&in);
	if (v == RELEASE_HOLD) {
		/* its last client's cancel is still on its way: nobody else's query may get it */
		change_state(s, SV_BEING_CANCELED);
		txn_check_invariants(s);
		return;
	}
	change_state(s, SV_IDLE);
	txn_check_invariants(s); /* in the pool now, whether it stays there or closes below */
	switch (v) {
	case RELEASE_CLOSE_CONFIG:
		/* PgBouncer's text for a server marked while it was lent (RELOAD, RECONNECT) */
		disconnect_server(s, true, "%s",
		                  s->addr_gone || s->stale_stmt ? close_needed_reason(s) : "close_needed");
		return;
	case RELEASE_CLOSE_PAUSE:
		disconnect_server(s, true, "pause mode");
		return;
	case RELEASE_YIELD:
		disconnect_server(s, true, "given back to another worker");
		pool_wake_waiters(pool); /* a first login's welcome still goes out */
		return;
	case RELEASE_CLOSE_LIFETIME:
		pool->last_lifetime_close = wk.now;
		disconnect_server(s, true, "server lifetime over");
		return;
	case RELEASE_USED:
		change_state(s, SV_USED);
		break;
	case RELEASE_HOLD:
	case RELEASE_IDLE:
		break;
	}
	pool_wake_waiters(pool);
}

/* The next node of a walk of the waiting list: its head's first if a call inside the walk's changed the lists. */
static inline List *walk_next(PgPool *pool, unsigned *gen, List *tmp)
{
	if (pool->wake_gen == *gen)
		return tmp;
	*gen = pool->wake_gen;
	return pool->waiting_clients.next;
}

void pool_wake_waiters(PgPool *pool)
{
	List *i, *tmp;
	unsigned gen = ++pool->wake_gen;
	/*
	 * A woken client's buffered messages run at once (sbuf_continue(),
	 * client_server_assigned()), and may release its server again (a
	 * stray CopyDone, a query the pooler answers), which calls this
	 * function inside itself and moves the clients of both walks from one
	 * list to another: the saved next node may then be on another list,
	 * and the walk would never reach its head again. After such a call a
	 * walk starts over from the head of the waiting list (walk_next()).
	 */
	/* clients waiting for the welcome can have it now */
	if (pool->welcome_ready && pool->n_state[CL_WAITING_LOGIN] > 0) {
		list_for_each_safe(i, &pool->waiting_clients, tmp)
		{
			PgSocket *c = container_of(i, PgSocket, node);
			/* a replication client's welcome comes from its own server */
			if (c->state != CL_WAITING_LOGIN || c->replication != REPLICATION_NONE)
				continue;
			if (client_send_welcome(c))
				sbuf_continue(&c->sb);
			tmp = walk_next(pool, &gen, tmp);
		}
	}
	if (pool_paused(pool))
		return;
	/* auth_query lookups first: they are short, and their clients are still logging in */
	auth_query_wake(pool);
	list_for_each_safe(i, &pool->waiting_clients, tmp)
	{
		PgSocket *c = container_of(i, PgSocket, node);
		if (c->state != CL_WAITING)
			continue;
		PgSocket *s = take_idle_server(pool);
		if (!s)
			break; /* the rest wait on: never walk thousands of waiters per released server */
		link_client_server(c, s);
		if (!s->setting_vars || s->vars_pipelined)
			client_server_assigned(c);
		tmp = walk_next(pool, &gen, tmp);
	}
	int unserved = pool->n_state[CL_WAITING];
	/* used servers are checked for the clients still waiting; each answer wakes the pool again */
	List *n;
	while (unserved-- > 0 && (n = list_first(&pool->used_servers)) != NULL) {
		if (!start_check(container_of(n, PgSocket, node))) {
			pool_wake_waiters(pool); /* no check query any more: it is idle now */
			return;
		}
	}
	pool_maybe_launch(pool);
}

/*
 * The longest-idle free server of the pools of the same database/user:
 * from the idle lists (used = false), or from the used lists of pools
 * where nobody waits (used = true), whose servers nobody is about to check.
 */
static PgSocket *oldest_free(bool (*match)(const PgPool *, const void *), const void *key, bool used)
{
	PgSocket *oldest = NULL;
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		if (!match(p, key) || (used && p->n_state[CL_WAITING] > 0))
			continue;
		List *n = used ? list_first(&p->used_servers) : list_last(&p->idle_servers);
		if (!n)
			continue;
		PgSocket *s = container_of(n, PgSocket, node);
		if (!oldest || s->request_time < oldest->request_time)
			oldest = s;
	}
	return oldest;
}

/*
 * Close the longest-idle server of another pool of the same database/user
 * to make room: an idle one, else one idle past server_check_delay (used).
 */
static bool evict_idle(bool (*match)(const PgPool *, const void *), const void *key)
{
	PgSocket *oldest = oldest_free(match, key, false);
	if (!oldest)
		oldest = oldest_free(match, key, true);
	if (!oldest)
		return false;
	disconnect_server(oldest, true, "evicted");
	return true;
}

static bool match_db(const PgPool *p, const void *db)
{
	return p->db == db;
}

static bool match_user(const PgPool *p, const void *u)
{
	return p->user == u;
}

/* Close the longest-idle free server of this pool, to make room for a replication server or a first welcome. */
static bool evict_idle_of_pool(PgPool *pool, bool for_replication)
{
	PgSocket *oldest = NULL;
	List *lists[] = {&pool->idle_servers, &pool->used_servers};
	for (size_t l = 0; l < sizeof(lists) / sizeof(lists[0]); l++) {
		List *i;
		list_for_each(i, lists[l])
		{
			PgSocket *s = container_of(i, PgSocket, node);
			if (!oldest || s->request_time < oldest->request_time)
				oldest = s;
		}
	}
	if (!oldest)
		return false;
	disconnect_server(oldest, true, "%s",
	                  for_replication ? "evicted for a replication connection"
	                                  : "evicted for a login that waits for the pool's first welcome here");
	return true;
}

/* Close an idle server to make room in entry k (LIMIT_*) of the pool's launch. */
static bool evict_for(PgPool *pool, int k, bool for_replication)
{
	if (k == LIMIT_POOL)
		return evict_idle_of_pool(pool, for_replication);
	return k == LIMIT_DB ? evict_idle(match_db, pool->db) : evict_idle(match_user, pool->user);
}

/* The servers of the pool running server_check_query for waiting clients (a walk only while some are). */
static int checks_running(const PgPool *pool)
{
	int checks = 0;
	List *i;
	if (pool->n_state[SV_TESTED] > 0)
		list_for_each(i, &pool->tested_servers) checks += container_of(i, PgSocket, node)->checking;
	return checks;
}

/*
 * Another worker waits for room in entry x of the pool's limit k: this
 * worker's servers of it and its fair share, of the reserve pool on top
 * too for the pool's own limit.
 */
static __attribute__((noinline)) void entry_shares(PgPool *pool, GlobalBudget *gb, int k, int x, LaunchInput *in)
{
	LaunchEntry *e = &in->entry[k];
	/* the shares are reckoned on every worker's clients: ours as they are now */
	if (k == LIMIT_POOL)
		budget_set_demand(gb, wk.id, x, pool_demand(pool, in->lookups));
	e->held = budget_held(gb, wk.id, x);
	/* the share of the limit, and for the pool's own that of size + reserve (a launch from the reserve) */
	int extra = k == LIMIT_POOL ? in->reserve : 0;
	int *share[2] = {&e->share, &in->reserve_share};
	for (int r = 0; r <= (extra > 0); r++)
		*share[r] = budget_fair_share(gb, wk.id, x, tree_limit(x, e->limit + r * extra));
}

/*
 * Everything the launch decision (policy_launch()) reads, in one place:
 * for the pool, its database and its user the limit and the servers in
 * all workers; who waits and since when, logins in flight, pause,
 * server_login_retry, the servers being checked, auth_query lookups
 * waiting; and for the three, where another worker waits for room, this
 * worker's servers and fair share. `evicted`: bit k, an idle server closed
 * already for room in entry k. The pool's own numbers come first: when
 * they settle the verdict (policy_launch_still_full()), nothing more is
 * read and it returns true.
 */
static bool launch_inputs(PgPool *pool, bool for_replication, unsigned evicted, LaunchInput *in)
{
	const PgPool *set = pool_settings(pool);
	GlobalBudget *gb = gbudget();
	int x[LIMIT_COUNT];
	in->pool_waits = pool->budget.want;
	in->reserve = set->reserve;
	in->for_replication = for_replication;
	/* its idle servers came with moved sessions (doc/workers.md, "Session-mode clients move too") */
	in->welcome_login = !pool->welcome_ready && pool->n_state[CL_WAITING_LOGIN] > 0 &&
	                    pool->n_state[SV_IDLE] + pool->n_state[SV_USED] > 0;
	for (int k = 0; k < LIMIT_COUNT; k++) {
		LaunchEntry *e = &in->entry[k];
		e->limit = k == LIMIT_POOL ? set->size : k == LIMIT_DB ? set->max_db : set->max_user;
		/* the database's and the user's counts matter only under their limits */
		bool counted = k == LIMIT_POOL || e->limit > 0;
		x[k] = counted ? limit_entry(pool, k) : -1;
		e->servers = !counted ? 0 : x[k] >= 0 ? budget_count(gb, x[k]) + foreign(x[k]) : limit_local(pool, k);
		if (k == LIMIT_POOL && policy_launch_still_full(in))
			return true;
	}
	List *first = list_first(&pool->waiting_clients);
	in->reserve_timeout = wk.cf.g.reserve_pool_timeout;
	in->login_in_flight = !list_empty(&pool->new_servers);
	in->paused = pool_paused(pool) || wk.run_state == RUN_SHUTDOWN_SERVERS;
	in->retry_wait = pool_retry_wait(pool);
	in->has_waiter = first != NULL;
	in->waited = first ? wk.now - container_of(first, PgSocket, node)->wait_start : 0;
	in->lookups = auth_query_waiting(pool);
	in->waiting = pool->n_state[CL_WAITING];
	in->checking = checks_running(pool);
	in->reserve_share = 0;
	for (int k = 0; k < LIMIT_COUNT; k++) {
		LaunchEntry *e = &in->entry[k];
		e->evicted = (evicted & 1u << k) != 0;
		e->held = e->share = 0;
		e->others_want = x[k] >= 0 && e->limit > 0 && budget_others_want(gb, wk.id, x[k]);
		if (e->others_want)
			entry_shares(pool, gb, k, x[k], in);
	}
	return false;
}

/* Why no server is launched, at -vv (log_no_launch()). */
static void log_no_launch_noise(const PgPool *pool, LaunchVerdict v, const LaunchInput *in)
{
	const char *db = pool->db->name, *user = pool->user->name;
	const LaunchEntry *p = &in->entry[LIMIT_POOL];
	switch (v) {
	case LAUNCH_NO:
		log_noise("pool %s/%s: no launch: %s", db, user,
		          in->login_in_flight ? "a login is in progress"
		          : in->paused        ? "paused or shutting down"
		                              : "within server_login_retry");
		break;
	case LAUNCH_CHECKING:
		log_noise("pool %s/%s: no launch: the servers being checked serve the waiting clients", db, user);
		break;
	case LAUNCH_FULL:
		log_noise("pool %s/%s: no launch: pool full (%d >= %d)%s", db, user, p->servers, p->limit,
		          in->reserve > 0 && in->has_waiter && p->servers < p->limit + in->reserve
		              ? ", reserve_pool_timeout not reached"
		              : "");
		break;
	case LAUNCH_EVICT:
		log_noise("pool %s/%s: no launch: pool full (%d >= %d) and no idle server to close for %s", db, user,
		          p->servers, p->limit, in->for_replication ? "replication" : "a first welcome");
		break;
	case LAUNCH_DB_FULL:
		log_noise("pool %s/%s: no launch: database full (max_db_connections %d)", db, user,
		          in->entry[LIMIT_DB].limit);
		break;
	case LAUNCH_USER_FULL:
		log_noise("pool %s/%s: no launch: user full (max_user_connections %d)", db, user,
		          in->entry[LIMIT_USER].limit);
		break;
	case LAUNCH_YIELD:
		log_noise("pool %s/%s: no launch: another worker waits for this room", db, user);
		break;
	case LAUNCH_OK:
	case LAUNCH_RESERVE:
		break;
	}
}

#define log_no_launch(pool, v, in)                                                                                     \
	do {                                                                                                           \
		if (log_enabled(LG_NOISE))                                                                             \
			log_no_launch_noise(pool, v, in);                                                              \
	} while (0)

/* The entry (LIMIT_*) in which an idle server may close to make room, for a verdict; -1: none. */
static int evicting(LaunchVerdict v)
{
	return v == LAUNCH_EVICT       ? LIMIT_POOL
	       : v == LAUNCH_DB_FULL   ? LIMIT_DB
	       : v == LAUNCH_USER_FULL ? LIMIT_USER
	                               : -1;
}

/*
 * Whether a new server may be launched now, counting the servers of all
 * workers: launch_inputs() gathers the numbers, policy_launch() decides,
 * and this carries the verdict out. At a full entry an idle server closes
 * first to make room, and the numbers are gathered again; with none to
 * close, and at any other refusal, the entry that is full learns that our
 * clients wait (other workers give back idle servers, see
 * pool_budget_tick()). A launch takes its units of the global budget into
 * *hold.
 */
static bool can_launch(PgPool *pool, bool for_replication, BudgetHold *hold)
{
	unsigned evicted = 0;
	LaunchInput in;
	LaunchRoom room;
	LaunchVerdict v;
	int k;
	for (;;) {
		if (launch_inputs(pool, for_replication, evicted, &in)) {
			/* the policy's first rule, on the pool's own numbers: LAUNCH_FULL, its want bit set already */
			log_no_launch(pool, LAUNCH_FULL, &in);
			return false;
		}
		v = policy_launch(&in, &room);
		if (room.reserve)
			budget_set_want(&pool->budget, true); /* until a launch is sure */
		if ((k = evicting(v)) < 0)
			break;
		if (!evict_for(pool, k, for_replication)) {
			log_no_launch(pool, v, &in);
			budget_set_want(limit_ref(pool, k), true);
			return false;
		}
		evicted |= 1u << k;
	}
	switch (v) {
	case LAUNCH_NO:
	case LAUNCH_CHECKING:
		log_no_launch(pool, v, &in);
		return false;
	case LAUNCH_FULL:
		log_no_launch(pool, v, &in);
		budget_set_want(&pool->budget, true);
		return false;
	case LAUNCH_YIELD:
		log_no_launch(pool, v, &in);
		budget_set_want(limit_ref(pool, room.full), true);
		return false;
	case LAUNCH_EVICT:
	case LAUNCH_DB_FULL:
	case LAUNCH_USER_FULL:
	case LAUNCH_OK:
	case LAUNCH_RESERVE:
		break;
	}
	BudgetRef *full = take_budget(pool, room.limit, hold);
	if (full) {
		log_noise("pool %s/%s: no launch: the limits of all workers together are reached", pool->db->name,
		          pool->user->name);
		budget_set_want(full, true);
		return false;
	}
	if (v == LAUNCH_RESERVE)
		log_warning("taking connection from reserve_pool");
	log_debug("pool %s/%s: launch decided (%d servers in all workers, pool size %d%s)", pool->db->name,
	          pool->user->name, in.entry[LIMIT_POOL].servers, in.entry[LIMIT_POOL].limit,
	          v == LAUNCH_RESERVE ? ", from the reserve" : "");
	budget_set_want(&pool->budget, false);
	budget_set_want(&pool->db->budget, false);
	budget_set_want(&pool->user->budget, false);
	return true;
}

/*
 * Waiting clients are not read (their input waits for a server), so a
 * client that hung up is not seen by the event loop. poll() asks:
 * POLLRDHUP tells a closed peer even when unread bytes precede its FIN.
 */
bool client_hung_up(const PgSocket *c)
{
	struct pollfd p = {.fd = c->sb.fd, .events = POLLRDHUP};
	return c->sb.fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

static void poll_and_drop(struct pollfd *fds, PgSocket **socks, int n)
{
	if (n == 0 || poll(fds, (nfds_t)n, 0) <= 0)
		return;
	for (int k = 0; k < n; k++)
		if (fds[k].revents & (POLLRDHUP | POLLHUP | POLLERR))
			disconnect_client(socks[k], false, "client disconnected while waiting");
}

void pool_drop_gone_waiters(PgPool *pool)
{
	enum { BATCH = 64 };
	struct pollfd fds[BATCH];
	PgSocket *socks[BATCH];
	List *i, *tmp;
	int n = 0;
	list_for_each_safe(i, &pool->waiting_clients, tmp)
	{
		PgSocket *c = container_of(i, PgSocket, node);
		if (c->sb.fd < 0)
			continue;
		fds[n] = (struct pollfd){.fd = c->sb.fd, .events = POLLRDHUP};
		socks[n++] = c;
		if (n == BATCH) {
			poll_and_drop(fds, socks, n); /* only clients before `tmp` go */
			n = 0;
		}
	}
	poll_and_drop(fds, socks, n);
}

/* The first waiting client that needs a new server; it says which kind. */
static PgSocket *first_needing_server(PgPool *pool)
{
	List *i;
	list_for_each(i, &pool->waiting_clients)
	{
		PgSocket *c = container_of(i, PgSocket, node);
		if (c->replication != REPLICATION_NONE && c->link)
			continue; /* its own server is logging in */
		return c;
	}
	return NULL;
}

void pool_maybe_launch(PgPool *pool)
{
	if (pool->db->admin)
		return;
	/* auth_query lookups need a normal server */
	PgSocket *first = first_needing_server(pool);
	if (!first && !auth_query_waiting(pool))
		return;
	bool repl = first && first->replication != REPLICATION_NONE;
	BudgetHold hold;
	if (!can_launch(pool, repl, &hold))
		return;
	if (first && client_hung_up(first)) {
		/*
		 * Not for a client that is gone (a failing login would be retried
		 * for nobody). It is not closed here, where a caller may be walking
		 * the waiting list: the janitor's pool_drop_gone_waiters() does it,
		 * then launches for the clients still there.
		 */
		budget_hold_release(&hold);
		return;
	}
	if (repl)
		(void)server_launch_replication(pool, first, &hold);
	else
		(void)server_launch(pool, &hold);
}

void pool_launch_min(PgPool *pool, int min)
{
	BudgetHold hold;
	/* below min in all workers together: the pool entry's limit is min itself */
	if (!take_budget(pool, min, &hold)) {
		log_debug("pool %s/%s: launch decided (below min_pool_size %d)", pool->db->name, pool->user->name, min);
		(void)server_launch(pool, &hold);
	}
}

void pool_replication_ready(PgSocket *s)
{
	PgSocket *c = s->link;
	if (!c) {
		disconnect_server(s, true, "replication client gone");
		return;
	}
	if (pool_paused(s->pool) || s->close_needed) {
		/*
		 * A PAUSE (or SUSPEND) came during its login: no stream starts in
		 * it (PAUSE would wait for its end). Its client waits, as new
		 * clients do, and gets a server of its own at RESUME. One marked
		 * during its login (RECONNECT, a changed entry) served nobody yet:
		 * its client gets another at once, as a normal waiting client does,
		 * instead of a welcome and the end of a session it never had.
		 */
		bool paused = pool_paused(s->pool);
		s->link = NULL;
		c->link = NULL;
		disconnect_server(s, true, "%s", paused ? "pause mode" : close_needed_reason(s));
		return;
	}
	link_client_server(c, s);
	/*
	 * It waited for its login, as a client waiting for the pool's first
	 * welcome does (wait_time): its first command starts when it comes,
	 * not at the connect (query_time, xact_time).
	 */
	c->queued_start = 0;
	if (client_send_welcome(c))
		sbuf_continue(&c->sb);
	/* the next waiting client may launch its server */
	pool_maybe_launch(s->pool);
}

void pool_login_failed(PgPool *pool, const char *sqlstate, const char *msg, bool from_server)
{
	pool->last_login_failed = true;
	pool->last_failed_time = wk.now;
	/*
	 * load_balance_hosts=disable sticks to one host of a list until an
	 * attempt there fails, however it fails: refused, a connect() that
	 * fails at once, server_connect_timeout, an error during the login.
	 */
	if (pool->db->cf.load_balance_hosts == LB_DISABLE)
		pool->db->host_index++;
	pgb_strlcpy(pool->failed_msg, msg, sizeof(pool->failed_msg));
	hooks.lookups_fail(pool, sqlstate, msg, from_server); /* lookups waiting for this pool fail at once */
	if (!from_server || (sqlstate && strcmp(sqlstate, "57P03") == 0))
		return;
	bool usable = pool->welcome_ready && !list_empty(&pool->idle_servers);
	if (usable)
		return;
	/* queued clients get the server's own error */
	List *i, *tmp;
	list_for_each_safe(i, &pool->waiting_clients, tmp)
	{
		PgSocket *c = container_of(i, PgSocket, node);
		char m[128];
		snprintf(m, sizeof(m), "%s", msg);
		if (wk.cf.g.log_pooler_errors)
			slog(LG_WARNING, c, "pooler error: %s", m);
		PktBuf pb;
		pktbuf_init(&pb, 128);
		pktbuf_write_error(&pb, "FATAL", sqlstate ? sqlstate : "08P01", m);
		(void)sbuf_send(&c->sb, pb.buf, pb.len);
		pktbuf_free(&pb);
		disconnect_client(c, false, "%s", m);
	}
}
