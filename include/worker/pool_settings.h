/*
 * Effective values of the settings that a [databases] or [users] entry can
 * override: each accessor applies the one fallback rule of its setting
 * (user entry, else database entry, else [pgbouncer]), so no caller
 * resolves a setting inline. Times are in microseconds; 0 = off.
 */
#ifndef PGB_WORKER_POOL_SETTINGS_H
#define PGB_WORKER_POOL_SETTINGS_H

#include "common/config.h"
#include "worker/objects.h"

/*
 * The settings a pool asks for often, computed again after a config change
 * (PgPool.mode, size, reserve, max_db, max_user; read through pool_settings()
 * and its accessors in worker/pool.h).
 */
void pool_settings_refresh(PgPool *pool);

/*
 * Uncached; the pool code asks the cached pool_effective_size(),
 * pool_reserve_size() and pool_effective_mode() of worker/pool.h.
 */
/* pool_size: user entry, else database entry, else default_pool_size; 0 = unlimited */
int pool_configured_size(const PgPool *pool);
/* reserve_pool_size: user entry, else database entry, else global */
int pool_configured_reserve(const PgPool *pool);
/* pool_mode: POOL_STATEMENT for the admin db, else user entry, else database entry, else global */
int pool_configured_mode(const PgPool *pool);
/* server_lifetime of the pool's database; 0 = no limit */
usec_t pool_server_lifetime(const PgPool *pool);

/* pool_size of a database entry, else default_pool_size (SHOW DATABASES) */
int db_pool_size(const PgDatabase *db);
/* reserve_pool_size of a database entry, else global (SHOW DATABASES) */
int db_reserve_pool_size(const PgDatabase *db);
/* min_pool_size: database entry, else global */
int db_min_pool_size(const PgDatabase *db);
/* port of the database entry's server (5432 when the entry has none, as for the console's) */
int db_server_port(const PgDatabase *db);
/* server_lifetime: database entry when > 0, else global */
usec_t db_server_lifetime(const PgDatabase *db);
/* max_db_connections: database entry when > 0, else global; 0 = unlimited */
int db_max_connections(const PgDatabase *db);
/* max_db_client_connections: database entry when > 0, else global; 0 = unlimited */
int db_max_client_connections(const PgDatabase *db);

/* auth_user: database entry, else global; NULL when neither is set (or both are empty) */
const char *db_auth_user(const PgDatabase *db);
/* auth_query: database entry, else global; NULL when empty */
const char *db_auth_query(const PgDatabase *db);
/* auth_dbname: database entry, else global, else the database itself */
const char *db_auth_dbname(const PgDatabase *db);

/* The user-level settings below take a user without a [users] entry, or NULL, as "global". */
/* max_user_connections: user entry when > 0, else global; 0 = unlimited */
int user_max_connections(const PgUser *u);
/* max_user_client_connections: user entry when > 0, else global; 0 = unlimited */
int user_max_client_connections(const PgUser *u);
/* query_timeout: user entry when > 0, else global */
usec_t user_query_timeout(const PgUser *u);
/* idle_transaction_timeout: user entry when > 0, else global */
usec_t user_idle_transaction_timeout(const PgUser *u);
/* transaction_timeout: user entry when > 0, else global */
usec_t user_transaction_timeout(const PgUser *u);
/* client_idle_timeout: user entry when > 0, else global */
usec_t user_client_idle_timeout(const PgUser *u);

/* query_wait_timeout of a client of login user u in database db: user entry, else database entry, else global */
usec_t client_query_wait_timeout(const PgUser *u, const PgDatabase *db);

/* pool_size of a [peers] entry, else default_pool_size */
int peer_pool_size(const CfPeer *p);

#endif
