/*
 * Prepared-statement bookkeeping for transaction and statement mode: the
 * worker's registry of distinct Parse bodies, clients' name maps and
 * servers' LRU sets (include/worker/prepare.h, doc/transaction.md).
 */
#include "autoconfig.h"

#include "worker/prepare.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * uthash's FNV-1a instead of its default (Jenkins): about half the
 * instructions for the short keys looked up at every Bind and Describe
 * (a client's statement name, an 8-byte statement id).
 */
#define HASH_FUNCTION(keyptr, keylen, hashv) HASH_FNV(keyptr, keylen, hashv)
#include <uthash.h>

#include "common/util.h"

struct PreparedStmt {
	uint64_t id;                 /* server-side name PGBOUNCER_<id> */
	char name[PREPARE_NAME_LEN]; /* that name, made once (a renamed Bind needs it every time) */
	unsigned refcount;           /* client mappings and server sets holding it */
	size_t keylen;
	size_t bodylen; /* the Parse body at the start of key; the parse environment after it */
	uint8_t *key;   /* query text, NUL, parameter count and type OIDs; then the environment */
	uint64_t desc;  /* its result type (txn_row_desc_hash()) when first prepared; 0 = not known yet */
	bool retired;   /* in `retired`, no longer found by its text: its result type changed (prepare_stmt_retire()) */
	UT_hash_handle hh;
};

struct ClientStmt {
	char *name; /* the client's statement name */
	PreparedStmt *ps;
	uint64_t gen;
	UT_hash_handle hh;
};

struct ServerStmt {
	uint64_t id; /* ps->id: the hash key */
	PreparedStmt *ps;
	UT_hash_handle hh; /* uthash keeps insertion order: the first entry is the least recently used */
};

static PreparedStmt *registry;
static PreparedStmt *retired; /* entries still held but never handed out again for their text */
static uint64_t next_id = 1;
static uint64_t next_gen = 1;

/* A new entry for a key (a Parse body of bodylen bytes, then its environment), in no hash yet. */
static PreparedStmt *stmt_new(const uint8_t *key, size_t keylen, size_t bodylen)
{
	PreparedStmt *ps = xcalloc(1, sizeof(*ps));
	ps->id = next_id++;
	snprintf(ps->name, sizeof(ps->name), PREPARE_NAME_PREFIX "%llu", (unsigned long long)ps->id);
	ps->keylen = keylen;
	ps->bodylen = bodylen;
	ps->key = xmalloc(keylen ? keylen : 1);
	if (keylen)
		memcpy(ps->key, key, keylen);
	return ps;
}

static PreparedStmt *get_key(const uint8_t *key, size_t keylen, size_t bodylen)
{
	PreparedStmt *ps;
	HASH_FIND(hh, registry, key, keylen, ps);
	if (!ps) {
		ps = stmt_new(key, keylen, bodylen);
		HASH_ADD_KEYPTR(hh, registry, ps->key, ps->keylen, ps);
	}
	ps->refcount++;
	return ps;
}

/* The key of a Parse body in an environment: the two, one after the other (a buffer kept for the next call). */
static const uint8_t *join_key(const uint8_t *body, size_t bodylen, const uint8_t *env, size_t envlen)
{
	static uint8_t *buf;
	static size_t cap;
	if (bodylen + envlen > cap) {
		cap = bodylen + envlen;
		buf = xrealloc(buf, cap);
	}
	if (bodylen)
		memcpy(buf, body, bodylen);
	if (envlen)
		memcpy(buf + bodylen, env, envlen);
	return buf;
}

PreparedStmt *prepare_stmt_get(const uint8_t *key, size_t keylen)
{
	return get_key(key, keylen, keylen);
}

PreparedStmt *prepare_stmt_get_in(const uint8_t *body, size_t bodylen, const uint8_t *env, size_t envlen)
{
	if (!envlen)
		return get_key(body, bodylen, bodylen);
	return get_key(join_key(body, bodylen, env, envlen), bodylen + envlen, bodylen);
}

PreparedStmt *prepare_stmt_get_described(const uint8_t *body, size_t bodylen, const uint8_t *env, size_t envlen,
                                         uint64_t desc)
{
	PreparedStmt *ps = prepare_stmt_get_in(body, bodylen, env, envlen);
	if (!desc || ps->desc == desc)
		return ps;
	if (!ps->desc) {
		ps->desc = desc; /* the first preparation here compares with it (ANS_CHECK) */
		return ps;
	}
	/* this worker's servers give the text another result type now: an entry of its own, retired */
	prepare_stmt_unref(ps);
	ps = stmt_new(join_key(body, bodylen, env, envlen), bodylen + envlen, bodylen);
	ps->desc = desc;
	ps->retired = true;
	ps->refcount = 1;
	HASH_ADD_KEYPTR(hh, retired, ps->key, ps->keylen, ps);
	return ps;
}

void prepare_stmt_unref(PreparedStmt *ps)
{
	if (!ps || --ps->refcount > 0)
		return;
	/* unused: an identical query parsed later gets a new number */
	if (ps->retired)
		HASH_DELETE(hh, retired, ps);
	else
		HASH_DELETE(hh, registry, ps);
	free(ps->key);
	free(ps);
}

uint64_t prepare_stmt_id(const PreparedStmt *ps)
{
	return ps->id;
}

const uint8_t *prepare_stmt_key(const PreparedStmt *ps, size_t *keylen)
{
	*keylen = ps->bodylen;
	return ps->key;
}

const uint8_t *prepare_stmt_env(const PreparedStmt *ps, size_t *envlen)
{
	*envlen = ps->keylen - ps->bodylen;
	return ps->key + ps->bodylen;
}

const char *prepare_stmt_name(const PreparedStmt *ps)
{
	return ps->name;
}

uint64_t prepare_stmt_desc(const PreparedStmt *ps)
{
	return ps->desc;
}

void prepare_stmt_set_desc(PreparedStmt *ps, uint64_t desc)
{
	ps->desc = desc;
}

bool prepare_stmt_retired(const PreparedStmt *ps)
{
	return ps->retired;
}

void prepare_stmt_retire(PreparedStmt *ps)
{
	if (ps->retired)
		return;
	HASH_DELETE(hh, registry, ps);
	ps->retired = true;
	HASH_ADD_KEYPTR(hh, retired, ps->key, ps->keylen, ps);
}

PreparedStmt *prepare_stmt_by_id(uint64_t id)
{
	PreparedStmt *ps, *tmp;
	HASH_ITER(hh, registry, ps, tmp)
	{
		if (ps->id == id)
			return ps;
	}
	HASH_ITER(hh, retired, ps, tmp)
	{
		if (ps->id == id)
			return ps;
	}
	return NULL;
}

size_t prepare_registry_count(void)
{
	return HASH_COUNT(registry);
}

/* ---- clients ---- */

ClientStmt *prepare_client_find(ClientStmtMap *map, const char *name)
{
	ClientStmt *cs = map->last;
	if (cs && strcmp(cs->name, name) == 0)
		return cs;
	HASH_FIND_STR(map->head, name, cs);
	if (cs)
		map->last = cs;
	return cs;
}

PreparedStmt *prepare_client_stmt(const ClientStmt *cs)
{
	return cs->ps;
}

uint64_t prepare_client_gen(const ClientStmt *cs)
{
	return cs->gen;
}

void prepare_client_set_stmt(ClientStmt *cs, PreparedStmt *ps)
{
	ps->refcount++;
	prepare_stmt_unref(cs->ps);
	cs->ps = ps;
}

ClientStmt *prepare_client_add(ClientStmtMap *map, const char *name, PreparedStmt *ps)
{
	ClientStmt *cs = xcalloc(1, sizeof(*cs));
	cs->name = xstrdup(name);
	cs->ps = ps;
	cs->gen = next_gen++;
	ps->refcount++;
	HASH_ADD_KEYPTR(hh, map->head, cs->name, strlen(cs->name), cs);
	return cs;
}

void prepare_client_free(ClientStmt *cs)
{
	prepare_stmt_unref(cs->ps);
	free(cs->name);
	free(cs);
}

void prepare_client_remove(ClientStmtMap *map, ClientStmt *cs)
{
	if (map->last == cs)
		map->last = NULL;
	HASH_DELETE(hh, map->head, cs);
	prepare_client_free(cs);
}

void prepare_client_detach(ClientStmtMap *map, ClientStmt *cs)
{
	if (map->last == cs)
		map->last = NULL;
	HASH_DELETE(hh, map->head, cs);
}

void prepare_client_reattach(ClientStmtMap *map, ClientStmt *cs)
{
	ClientStmt *later = prepare_client_find(map, cs->name);
	if (later)
		prepare_client_remove(map, later);
	HASH_ADD_KEYPTR(hh, map->head, cs->name, strlen(cs->name), cs);
}

bool prepare_client_remove_gen(ClientStmtMap *map, uint64_t gen)
{
	ClientStmt *cs, *tmp;
	HASH_ITER(hh, map->head, cs, tmp)
	{
		if (cs->gen == gen) {
			prepare_client_remove(map, cs);
			return true;
		}
	}
	return false;
}

void prepare_client_clear(ClientStmtMap *map)
{
	prepare_client_clear_except(map, NULL, NULL);
}

void prepare_client_clear_except(ClientStmtMap *map, bool (*keep)(uint64_t gen, void *arg), void *arg)
{
	ClientStmt *cs, *tmp;
	HASH_ITER(hh, map->head, cs, tmp)
	{
		if (!keep || !keep(cs->gen, arg))
			prepare_client_remove(map, cs);
	}
}

unsigned prepare_client_count(const ClientStmtMap *map)
{
	return HASH_COUNT(map->head);
}

ClientStmt *prepare_client_first(const ClientStmtMap *map)
{
	return map->head;
}

ClientStmt *prepare_client_next(const ClientStmt *cs)
{
	return cs->hh.next;
}

const char *prepare_client_name(const ClientStmt *cs)
{
	return cs->name;
}

/* ---- servers ---- */

bool prepare_server_has(ServerStmt **set, const PreparedStmt *ps, bool touch)
{
	ServerStmt *ss;
	uint64_t id = ps->id;
	/* the most recently used (the end of uthash's insertion order), as at every Bind of one statement */
	if (*set && ((ServerStmt *)ELMT_FROM_HH((*set)->hh.tbl, (*set)->hh.tbl->tail))->ps == ps)
		return true;
	HASH_FIND(hh, *set, &id, sizeof(id), ss);
	if (!ss)
		return false;
	if (touch && ss->hh.next) {
		/* to the end of the insertion order: most recently used (unless it is already) */
		HASH_DELETE(hh, *set, ss);
		HASH_ADD(hh, *set, id, sizeof(ss->id), ss);
	}
	return true;
}

void prepare_server_add(ServerStmt **set, PreparedStmt *ps)
{
	ServerStmt *ss = xcalloc(1, sizeof(*ss));
	ss->id = ps->id;
	ss->ps = ps;
	ps->refcount++;
	HASH_ADD(hh, *set, id, sizeof(ss->id), ss);
}

PreparedStmt *prepare_server_evict(ServerStmt **set, unsigned max, const PreparedStmt *keep)
{
	if (HASH_COUNT(*set) <= max)
		return NULL;
	ServerStmt *ss, *tmp;
	HASH_ITER(hh, *set, ss, tmp)
	{
		if (ss->ps == keep)
			continue;
		PreparedStmt *ps = ss->ps;
		HASH_DELETE(hh, *set, ss);
		free(ss);
		return ps;
	}
	return NULL;
}

PreparedStmt *prepare_server_find_id(ServerStmt **set, uint64_t id)
{
	ServerStmt *ss;
	HASH_FIND(hh, *set, &id, sizeof(id), ss);
	return ss ? ss->ps : NULL;
}

/* A stand-in that only keeps a server-side name, closed when it is the least recently used; no reference yet. */
static PreparedStmt *stand_in(const char *name)
{
	PreparedStmt *stub = stmt_new(NULL, 0, 0);
	snprintf(stub->name, sizeof(stub->name), "%s", name);
	stub->retired = true;
	HASH_ADD_KEYPTR(hh, retired, stub->key, 0, stub); /* where prepare_stmt_unref() looks for a retired one */
	return stub;
}

void prepare_server_orphan(ServerStmt **set, PreparedStmt *ps)
{
	ServerStmt *ss;
	uint64_t id = ps->id;
	HASH_FIND(hh, *set, &id, sizeof(id), ss);
	if (!ss || ss->ps != ps)
		return;
	PreparedStmt *stub = stand_in(ps->name);
	stub->refcount = 1;
	HASH_DELETE(hh, *set, ss);
	ss->id = stub->id;
	ss->ps = stub;
	HASH_ADD(hh, *set, id, sizeof(ss->id), ss);
	prepare_stmt_unref(ps);
}

void prepare_server_add_stand_in(ServerStmt **set, uint64_t id, const char *name)
{
	char own[PREPARE_NAME_LEN];
	if (!name) {
		snprintf(own, sizeof(own), PREPARE_NAME_PREFIX "%llu", (unsigned long long)id);
		name = own;
	}
	prepare_server_add(set, stand_in(name));
}

void prepare_server_remove_id(ServerStmt **set, uint64_t id)
{
	ServerStmt *ss, *tmp;
	HASH_FIND(hh, *set, &id, sizeof(id), ss);
	if (!ss) {
		/* a stand-in that took its place has an id of its own, and its name (prepare_server_add_stand_in()) */
		char name[PREPARE_NAME_LEN];
		snprintf(name, sizeof(name), PREPARE_NAME_PREFIX "%llu", (unsigned long long)id);
		HASH_ITER(hh, *set, ss, tmp)
		{
			if (ss->ps->retired && strcmp(ss->ps->name, name) == 0)
				break;
		}
		if (!ss)
			return;
	}
	HASH_DELETE(hh, *set, ss);
	prepare_stmt_unref(ss->ps);
	free(ss);
}

void prepare_server_clear(ServerStmt **set)
{
	prepare_server_clear_except(set, NULL, NULL);
}

void prepare_server_clear_except(ServerStmt **set, bool (*keep)(uint64_t id, void *arg), void *arg)
{
	ServerStmt *ss, *tmp;
	HASH_ITER(hh, *set, ss, tmp)
	{
		if (keep && keep(ss->id, arg))
			continue;
		HASH_DELETE(hh, *set, ss);
		prepare_stmt_unref(ss->ps);
		free(ss);
	}
}

size_t prepare_server_stmt_size(void)
{
	return sizeof(ServerStmt);
}

unsigned prepare_server_count(ServerStmt *const *set)
{
	return HASH_COUNT(*set);
}
