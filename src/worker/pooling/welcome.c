/*
 * The welcome that ends a client's login: AuthenticationOk, the
 * ParameterStatus messages (the console's fixed ones, a replication
 * client's server's, or its pool's with the client's own tracked values),
 * the pooler's BackendKeyData, ReadyForQuery. In pooling/ because the pool
 * sends it when its first server has logged in, and auth/ when a login
 * finds that done (doc/architecture.md, "Client lifecycle").
 */
#include "autoconfig.h"

#include "common/pktbuf.h"
#include "worker/cancel.h"
#include "worker/objects.h"
#include "worker/welcome.h"
#include "worker/worker.h"

/*
 * The ParameterStatus messages of a pooled client's welcome: the pool's
 * server parameters, then the client's tracked values. Clients of a pool
 * mostly share their values (the same application_name, the servers'
 * defaults), which are interned: the messages built for the last client
 * are copied when the pointers are the same.
 */
static void put_pool_params(PktBuf *pb, PgSocket *c)
{
	PgPool *pool = c->pool;
	int n = var_count();
	bool same = pool->welcome_ready && pool->welcome_cache_gen == var_names_gen() + 1;
	/* what the client is told is what it gets: servers are SET to it when they differ */
	sock_vars_fill(c, pool->defaults, &pool->last_fill);
	for (int i = 0; i < n && same; i++)
		same = sock_var(c, i) == pool->welcome_vals[i].value;
	if (!same) {
		PktBuf *wc = &pool->welcome_cache;
		if (!wc->buf)
			pktbuf_init(wc, pool->welcome_params.len + 256);
		pktbuf_reset(wc);
		pktbuf_put_bytes(wc, pool->welcome_params.buf, pool->welcome_params.len);
		for (int i = 0; i < n; i++) {
			const char *v = sock_var(c, i);
			if (v)
				pktbuf_write_param_status(wc, var_name(i), v);
			var_copy(&pool->welcome_vals[i], &(VarValue){(char *)v});
		}
		/* before welcome_ready the pool's parameters may still grow: build again next time */
		pool->welcome_cache_gen = pool->welcome_ready ? var_names_gen() + 1 : 0;
	}
	pktbuf_put_bytes(pb, pool->welcome_cache.buf, pool->welcome_cache.len);
}

bool client_send_welcome(PgSocket *c)
{
	/* built in memory kept from login to login: sbuf_send() copies what the socket does not take */
	static PktBuf pb;
	if (!pb.buf)
		pktbuf_init(&pb, 512);
	pktbuf_reset(&pb);
	pktbuf_write_auth(&pb, 0, NULL, 0);
	if (c->db->admin) {
		static const char *const fixed[][2] = {
		    {"server_version", PACKAGE_VERSION "/bouncer"},
		    {"client_encoding", "UTF8"},
		    {"server_encoding", "UTF8"},
		    {"DateStyle", "ISO"},
		    {"TimeZone", "GMT"},
		    {"standard_conforming_strings", "on"},
		    {"is_superuser", "on"},
		};
		for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
			pktbuf_write_param_status(&pb, fixed[i][0], fixed[i][1]);
		for (int i = 0; i < var_count(); i++)
			if (sock_var(c, i))
				pktbuf_write_param_status(&pb, var_name(i), sock_var(c, i));
	} else if (c->replication != REPLICATION_NONE && c->link) {
		/* what its dedicated server said at login; tracked values came through to c->vars */
		const PktBuf *params = c->link->repl_params;
		if (params)
			pktbuf_put_bytes(&pb, params->buf, params->len);
		for (int i = 0; i < var_count(); i++)
			if (sock_var(c, i))
				pktbuf_write_param_status(&pb, var_name(i), sock_var(c, i));
	} else {
		put_pool_params(&pb, c);
	}
	cancel_gen_key(c);
	uint32_t pid = ((uint32_t)c->cancel_key[0] << 24) | ((uint32_t)c->cancel_key[1] << 16) |
	               ((uint32_t)c->cancel_key[2] << 8) | c->cancel_key[3];
	pktbuf_write_backend_key(&pb, pid, c->cancel_key + 4, 4);
	if (wk.cf.g.login_notify_message && wk.cf.g.login_notify_message[0])
		pktbuf_write_notice(&pb, wk.cf.g.login_notify_message);
	pktbuf_write_ready(&pb, 'I');
	/* active before sending, so that a failed send is accounted as a logged-in client */
	/* a wait for the pool's first server login is over: it counts as a wait for a server */
	if (c->wait_start && !c->is_internal)
		c->pool->stats.wait_time += (uint64_t)(wk.now - c->wait_start);
	c->wait_start = 0; /* pool_find_server() starts the next */
	change_state(c, CL_ACTIVE);
	if (!c->is_internal)
		c->pool->stats.client_login_count++;
	if (!sbuf_send(&c->sb, pb.buf, pb.len)) {
		disconnect_client(c, false, "client unexpected eof");
		return false;
	}
	/* a pooled session's queries may come through the receive ring (worker/recvq.h) */
	if (!c->db->admin && c->replication == REPLICATION_NONE && !c->is_internal)
		sbuf_use_ring(&c->sb);
	return true;
}
