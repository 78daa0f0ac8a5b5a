/*
 * Effective per-pool settings: the fallback from a [users] entry to a
 * [databases] entry to [pgbouncer], written once per setting
 * (include/worker/pool_settings.h).
 */
#include "autoconfig.h"

#include "worker/pool_settings.h"
#include "worker/worker.h"

static usec_t secs(int s)
{
	return (usec_t)s * USEC_PER_SEC;
}

/* A string setting that is set and not empty, else NULL. */
static const char *nonempty(const char *s)
{
	return s && *s ? s : NULL;
}

/* A user entry's value of a setting where 0 and below mean "inherit" (NULL entry: none). */
#define USER_OVERRIDE(u, field) ((u) && (u)->cf && (u)->cf->field > 0 ? (u)->cf->field : 0)

void pool_settings_refresh(PgPool *pool)
{
	pool->mode = pool_configured_mode(pool);
	pool->size = pool_configured_size(pool);
	pool->reserve = pool_configured_reserve(pool);
	pool->max_db = db_max_connections(pool->db);
	pool->max_user = user_max_connections(pool->user);
	pool->settings_gen = wk.cf_gen + 1;
}

int pool_configured_size(const PgPool *pool)
{
	if (pool->user->cf && pool->user->cf->pool_size != CF_UNSET)
		return pool->user->cf->pool_size;
	return db_pool_size(pool->db);
}

int pool_configured_reserve(const PgPool *pool)
{
	if (pool->user->cf && pool->user->cf->reserve_pool_size != CF_UNSET)
		return pool->user->cf->reserve_pool_size;
	return db_reserve_pool_size(pool->db);
}

int pool_configured_mode(const PgPool *pool)
{
	if (pool->db->admin)
		return POOL_STATEMENT;
	if (pool->user->cf && pool->user->cf->pool_mode != CF_UNSET)
		return pool->user->cf->pool_mode;
	if (pool->db->cf.pool_mode != CF_UNSET)
		return pool->db->cf.pool_mode;
	return wk.cf.g.pool_mode;
}

usec_t pool_server_lifetime(const PgPool *pool)
{
	return db_server_lifetime(pool->db);
}

int db_pool_size(const PgDatabase *db)
{
	return config_db_pool_size(&wk.cf, &db->cf);
}

int db_reserve_pool_size(const PgDatabase *db)
{
	return config_db_reserve_pool_size(&wk.cf, &db->cf);
}

int db_min_pool_size(const PgDatabase *db)
{
	return db->cf.min_pool_size != CF_UNSET ? db->cf.min_pool_size : wk.cf.g.min_pool_size;
}

int db_server_port(const PgDatabase *db)
{
	return db->cf.port > 0 ? db->cf.port : 5432;
}

usec_t db_server_lifetime(const PgDatabase *db)
{
	return db->cf.server_lifetime > 0 ? secs(db->cf.server_lifetime) : wk.cf.g.server_lifetime;
}

int db_max_connections(const PgDatabase *db)
{
	return db->cf.max_db_connections > 0 ? db->cf.max_db_connections : wk.cf.g.max_db_connections;
}

int db_max_client_connections(const PgDatabase *db)
{
	return db->cf.max_db_client_connections > 0 ? db->cf.max_db_client_connections
	                                            : wk.cf.g.max_db_client_connections;
}

const char *db_auth_user(const PgDatabase *db)
{
	return nonempty(db->cf.auth_user) ? db->cf.auth_user : nonempty(wk.cf.g.auth_user);
}

const char *db_auth_query(const PgDatabase *db)
{
	return nonempty(db->cf.auth_query) ? db->cf.auth_query : nonempty(wk.cf.g.auth_query);
}

const char *db_auth_dbname(const PgDatabase *db)
{
	if (nonempty(db->cf.auth_dbname))
		return db->cf.auth_dbname;
	return nonempty(wk.cf.g.auth_dbname) ? wk.cf.g.auth_dbname : db->name;
}

int user_max_connections(const PgUser *u)
{
	int v = USER_OVERRIDE(u, max_user_connections);
	return v > 0 ? v : wk.cf.g.max_user_connections;
}

int user_max_client_connections(const PgUser *u)
{
	int v = USER_OVERRIDE(u, max_user_client_connections);
	return v > 0 ? v : wk.cf.g.max_user_client_connections;
}

usec_t user_query_timeout(const PgUser *u)
{
	int v = USER_OVERRIDE(u, query_timeout);
	return v > 0 ? secs(v) : wk.cf.g.query_timeout;
}

usec_t user_idle_transaction_timeout(const PgUser *u)
{
	int v = USER_OVERRIDE(u, idle_transaction_timeout);
	return v > 0 ? secs(v) : wk.cf.g.idle_transaction_timeout;
}

usec_t user_transaction_timeout(const PgUser *u)
{
	int v = USER_OVERRIDE(u, transaction_timeout);
	return v > 0 ? secs(v) : wk.cf.g.transaction_timeout;
}

usec_t user_client_idle_timeout(const PgUser *u)
{
	int v = USER_OVERRIDE(u, client_idle_timeout);
	return v > 0 ? secs(v) : wk.cf.g.client_idle_timeout;
}

usec_t client_query_wait_timeout(const PgUser *u, const PgDatabase *db)
{
	/* 0 is a value here (wait for ever), so only CF_UNSET inherits */
	if (u && u->cf && u->cf->query_wait_timeout != CF_UNSET)
		return secs(u->cf->query_wait_timeout);
	if (db->cf.query_wait_timeout != CF_UNSET)
		return secs(db->cf.query_wait_timeout);
	return wk.cf.g.query_wait_timeout;
}

int peer_pool_size(const CfPeer *p)
{
	return p->pool_size != CF_UNSET ? p->pool_size : wk.cf.g.default_pool_size;
}
