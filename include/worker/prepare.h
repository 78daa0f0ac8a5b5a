/*
 * Protocol-level prepared statements in transaction and statement mode
 * (doc/transaction.md): a worker-wide registry gives every distinct Parse
 * body a server-side name PGBOUNCER_<id>; each client maps its own
 * statement names to registry entries, and each server remembers, in LRU
 * order, which entries it has prepared (at most max_prepared_statements).
 * Pure bookkeeping: no sockets, no event loop.
 */
#ifndef PGB_WORKER_PREPARE_H
#define PGB_WORKER_PREPARE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PREPARE_NAME_PREFIX "PGBOUNCER_"
#define PREPARE_NAME_LEN    32 /* room for the prefix and a 64-bit id */

/* One distinct statement: query text, NUL, parameter count and type OIDs (the Parse body after the name). */
typedef struct PreparedStmt PreparedStmt;

/* A client's statements: its name -> registry entry. */
typedef struct ClientStmt ClientStmt;
typedef struct ClientStmtMap {
	ClientStmt *head; /* uthash head; NULL = none */
	ClientStmt *last; /* the last one found: a client binds the same statement again and again */
} ClientStmtMap;
/* A server's prepared statements in LRU order (uthash head; NULL = none). */
typedef struct ServerStmt ServerStmt;

/* The registry entry for a Parse body, made if new; the caller holds one reference. */
PreparedStmt *prepare_stmt_get(const uint8_t *key, size_t keylen);
/*
 * The same for a Parse body parsed in environment `env` (opaque bytes: the
 * client's settings that PostgreSQL reads when it parses the text,
 * txn_client_env()): the same text in another environment is another
 * statement (doc/transaction.md, "Protocol-level prepared statements").
 */
PreparedStmt *prepare_stmt_get_in(const uint8_t *body, size_t bodylen, const uint8_t *env, size_t envlen);
/*
 * The same for a client moved from another worker, whose statement was
 * described there with result type `desc` (0 = unknown): if this worker's
 * servers describe the text differently, the client gets an entry of its
 * own, retired, so that its next Bind fails with 0A000 as it would have
 * there (doc/transaction.md, "Schema changes").
 */
PreparedStmt *prepare_stmt_get_described(const uint8_t *body, size_t bodylen, const uint8_t *env, size_t envlen,
                                         uint64_t desc);
void prepare_stmt_unref(PreparedStmt *ps);
uint64_t prepare_stmt_id(const PreparedStmt *ps);
const uint8_t *prepare_stmt_key(const PreparedStmt *ps, size_t *keylen); /* the Parse body */
const uint8_t *prepare_stmt_env(const PreparedStmt *ps, size_t *envlen); /* the environment it was parsed in */
const char *prepare_stmt_name(const PreparedStmt *ps);                   /* "PGBOUNCER_<id>" */
size_t prepare_registry_count(void);                                     /* distinct statements in the worker */
/*
 * Its result type, as a hash of the description the server gave when the
 * pooler first prepared it (txn_row_desc_hash()); 0 = not known yet.
 */
uint64_t prepare_stmt_desc(const PreparedStmt *ps);
void prepare_stmt_set_desc(PreparedStmt *ps, uint64_t desc);
/*
 * Its text now has another result type: out of the registry, so that a
 * Parse of the same text gets a new entry (and a new name); those who hold
 * it keep it (doc/transaction.md, "Schema changes").
 */
void prepare_stmt_retire(PreparedStmt *ps);
bool prepare_stmt_retired(const PreparedStmt *ps);
/* The entry numbered id, or NULL once nobody uses it (a walk: for rare paths only). */
PreparedStmt *prepare_stmt_by_id(uint64_t id);

/* ---- a client's names ---- */

/* The client's statement called name, or NULL. */
ClientStmt *prepare_client_find(ClientStmtMap *map, const char *name);
PreparedStmt *prepare_client_stmt(const ClientStmt *cs);
uint64_t prepare_client_gen(const ClientStmt *cs);              /* unique per mapping made (to undo a failed Parse) */
void prepare_client_set_stmt(ClientStmt *cs, PreparedStmt *ps); /* the name now means ps (takes a reference) */
/* Map name to ps (takes a reference). The name must not be mapped already. */
ClientStmt *prepare_client_add(ClientStmtMap *map, const char *name, PreparedStmt *ps);
void prepare_client_remove(ClientStmtMap *map, ClientStmt *cs);
/* A Close in flight: out of the map (the name is free), kept until the Close is answered or skipped. */
void prepare_client_detach(ClientStmtMap *map, ClientStmt *cs);
void prepare_client_reattach(ClientStmtMap *map, ClientStmt *cs); /* skipped: back, over a later mapping of the name */
void prepare_client_free(ClientStmt *cs);                         /* a detached one, for good */
bool prepare_client_remove_gen(ClientStmtMap *map, uint64_t gen); /* false if that mapping is gone already */
void prepare_client_clear(ClientStmtMap *map);
/* The same, but for the mappings keep() says to keep (by their gen). */
void prepare_client_clear_except(ClientStmtMap *map, bool (*keep)(uint64_t gen, void *arg), void *arg);
unsigned prepare_client_count(const ClientStmtMap *map);
/* Walk a client's map (a moved client's state, src/worker/handover/migrate.c): first, next (NULL at the end), its name. */
ClientStmt *prepare_client_first(const ClientStmtMap *map);
ClientStmt *prepare_client_next(const ClientStmt *cs);
const char *prepare_client_name(const ClientStmt *cs);

/* ---- a server's set ---- */

/* Whether the server has ps prepared; a hit becomes the most recently used. */
bool prepare_server_has(ServerStmt **set, const PreparedStmt *ps, bool touch);
/* Record ps as prepared on the server (takes a reference), most recently used. */
void prepare_server_add(ServerStmt **set, PreparedStmt *ps);
/*
 * While the set holds more than max entries, remove the least recently
 * used one other than keep; returns it (the caller closes it on the server
 * and unrefs it) or NULL when within the limit.
 */
PreparedStmt *prepare_server_evict(ServerStmt **set, unsigned max, const PreparedStmt *keep);
void prepare_server_remove_id(ServerStmt **set, uint64_t id);        /* its Parse failed (or a stand-in of it) */
PreparedStmt *prepare_server_find_id(ServerStmt **set, uint64_t id); /* the server's statement numbered id, or NULL */
/*
 * The server's statement of ps has another result type than ps: ps is no
 * longer there for anyone, and a stand-in with its name (no text, retired)
 * takes its place in the LRU order, so that the statement is still closed
 * on the server when it is evicted.
 */
void prepare_server_orphan(ServerStmt **set, PreparedStmt *ps);
/*
 * The server still has statement PGBOUNCER_<id> although nobody uses it any
 * more (its registry entry is gone: a Close of it was skipped after an
 * error): a stand-in with that name (or `name`, that of a stand-in whose
 * Close was skipped) joins the set, so that the statement counts against
 * max_prepared_statements and is closed when evicted.
 */
void prepare_server_add_stand_in(ServerStmt **set, uint64_t id, const char *name);
void prepare_server_clear(ServerStmt **set);
/* The same, but for the statements keep() says to keep (by their id). */
void prepare_server_clear_except(ServerStmt **set, bool (*keep)(uint64_t id, void *arg), void *arg);
unsigned prepare_server_count(ServerStmt *const *set);
size_t prepare_server_stmt_size(void); /* one server's record of one statement (SHOW MEM) */

#endif
