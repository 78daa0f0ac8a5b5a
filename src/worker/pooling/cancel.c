/*
 * Cancel keys and CancelRequest handling: clients get pooler-made keys
 * (with room for peer_id and worker id bits); a CancelRequest with such a
 * key is sent on a new connection to the server the client is linked to,
 * with that server's own key. A key of another peer_id goes to that
 * [peers] entry (doc/architecture.md, "Cancel routing"; doc/pgbouncer.5.md "[peers]").
 */
#include "autoconfig.h"

#include <openssl/rand.h>
#include <pthread.h>
#include <sys/random.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include "common/channel.h"
#include "common/config.h"
#include "common/log.h"
#include "common/proto.h"
#include "common/util.h"
#include "worker/dns.h"
#include "worker/cancel.h"
#include "worker/hooks.h"
#include "worker/objects.h"
#include "worker/pool.h"
#include "worker/pool_settings.h"
#include "worker/worker.h"

/*
 * Random bytes for cancel keys, taken from the kernel's CSPRNG 512 at a
 * time: a getrandom() per login was one syscall in 18 of a plain login
 * (OpenSSL's generator costs more instructions: its fork check is a
 * getpid() syscall per call, and AES-CTR). A byte handed out is wiped
 * from the pool, and a child of fork() starts with an empty pool, so two
 * processes never give out the same key.
 */
static struct {
	uint8_t bytes[512]; /* unused random bytes: bytes[0..left) */
	size_t left;        /* how many are left */
	bool atfork;        /* the fork handler is registered */
} key_pool;

static void key_pool_forget(void)
{
	memset(key_pool.bytes, 0, sizeof(key_pool.bytes));
	key_pool.left = 0;
}

static bool key_random(uint8_t *k, size_t n)
{
	if (key_pool.left < n) {
		if (!key_pool.atfork)
			key_pool.atfork = pthread_atfork(NULL, NULL, key_pool_forget) == 0;
		if (!key_pool.atfork ||
		    getrandom(key_pool.bytes, sizeof(key_pool.bytes), GRND_NONBLOCK) != (ssize_t)sizeof(key_pool.bytes))
			return RAND_bytes(k, (int)n) == 1; /* OpenSSL only if the kernel cannot answer */
		key_pool.left = sizeof(key_pool.bytes);
	}
	key_pool.left -= n;
	memcpy(k, key_pool.bytes + key_pool.left, n);
	memset(key_pool.bytes + key_pool.left, 0, n);
	return true;
}

/*
 * Key layout (8 bytes): byte 0 random with the top bit clear; bytes 1-2 the
 * peer_id (low, high) when peering is on; byte 3 the worker id; byte 7's
 * two low bits are the forwarding TTL (11) when peering is on. The rest is
 * random.
 */
void cancel_gen_key(PgSocket *c)
{
	uint8_t *k = c->cancel_key;
	if (!key_random(k, CANCEL_KEY_LEN))
		log_warning("no random bytes for a cancel key");
	k[0] &= 0x7f;
	if (wk.cf.g.peer_id > 0) {
		k[1] = (uint8_t)(wk.cf.g.peer_id & 0xff);
		k[2] = (uint8_t)((wk.cf.g.peer_id >> 8) & 0xff);
		k[7] |= 0x03;
	}
	k[3] = (uint8_t)wk.id;
	c->cancel_key_len = CANCEL_KEY_LEN;
}

static PgSocket *find_client_by_key(const uint8_t *key)
{
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		List *lists[] = {&p->active_clients, &p->waiting_clients};
		for (int l = 0; l < 2; l++) {
			List *j;
			list_for_each(j, lists[l])
			{
				PgSocket *c = container_of(j, PgSocket, node);
				if (c->cancel_key_len == CANCEL_KEY_LEN &&
				    memcmp(c->cancel_key, key, CANCEL_KEY_LEN) == 0)
					return c;
			}
		}
	}
	return NULL;
}

/* Cancel connections on their way (their target may need to forget them). */
static List inflight = {&inflight, &inflight};

/*
 * A cancel connection is done: its server, parked in being_canceled when
 * its client let go of it meanwhile, can serve others now (a late cancel
 * must never hit another client's query, doc/architecture.md "Cancel routing").
 */
static void peer_conn_done(int peer_id);

static void hold_release(int hold_fd)
{
	if (hold_fd >= 0)
		close(hold_fd);
}

static void hold_release_fd(int *hold_fd)
{
	hold_release(*hold_fd);
	*hold_fd = -1;
}

static void start_requests(PgPool *pool);

/* A cancel for `target` is no longer on its way: a server parked for it may serve again. */
static void target_done(PgSocket *target)
{
	if (target && --target->cancels_pending == 0 && target->state == SV_BEING_CANCELED)
		pool_server_ready(target);
}

static void cancel_conn_done(PgSocket *cs)
{
	PgSocket *target = cs->cancel_target;
	PgSocket *req = cs->cancel_req;
	PgPool *pool = cs->pool;
	int peer = cs->cancel_peer;
	cs->cancel_target = NULL;
	cs->cancel_req = NULL;
	cs->cancel_peer = 0;
	if (cs->cancel_hold_fd >= 0) {
		/* the requester learns that its cancel has been delivered */
		close(cs->cancel_hold_fd);
		cs->cancel_hold_fd = -1;
	}
	sbuf_close(&cs->sb);
	change_state(cs, SV_JUSTFREE);
	if (req) {
		req->cancel_req = NULL;
		disconnect_client(req, false, "cancel request done"); /* closes the requester's socket */
	}
	target_done(target);
	if (peer)
		peer_conn_done(peer);
	if (pool)
		start_requests(pool); /* room for the next one of the pool */
}

void cancel_server_gone(PgSocket *server)
{
	if (server->cancels_pending <= 0 || !server->pool)
		return;
	PgPool *pool = server->pool;
	List *i, *tmp;
	list_for_each(i, &pool->active_cancel_servers)
	{
		PgSocket *cs = container_of(i, PgSocket, node);
		if (cs->cancel_target == server)
			cs->cancel_target = NULL;
	}
	list_for_each(i, &inflight)
	{
		PgSocket *cs = container_of(i, PgSocket, node);
		if (cs->cancel_target == server)
			cs->cancel_target = NULL;
	}
	server->cancels_pending = 0;
	/* a waiting request for it has nothing left to cancel */
	list_for_each_safe(i, &pool->waiting_cancel_req, tmp)
	{
		PgSocket *req = container_of(i, PgSocket, node);
		if (req->cancel_target == server) {
			req->cancel_target = NULL;
			disconnect_client(req, false, "cancel request for a server that is gone");
		}
	}
}

void cancel_client_gone(PgSocket *c)
{
	if (c->state != CL_WAITING_CANCEL && c->state != CL_ACTIVE_CANCEL)
		return;
	hold_release_fd(&c->cancel_hold_fd);
	if (c->cancel_req) {
		/* closed by someone else (KILL_CLIENT): its connection goes on and keeps the server parked */
		c->cancel_req->cancel_req = NULL;
		c->cancel_req = NULL;
	}
	PgSocket *target = c->cancel_target; /* a waiting request's, not sent yet */
	c->cancel_target = NULL;
	target_done(target);
}

/* The connection that carries one CancelRequest to PostgreSQL. */
static SBufAction cancel_conn_cb(SBuf *sb, SBufEvent ev, const PktHdr *hdr, const uint8_t *data, uint32_t avail)
{
	PgSocket *s = sb->owner;
	switch (ev) {
	case SBEV_CONNECTED: {
		uint8_t pkt[16 + MAX_SERVER_KEY];
		uint32_t len = 12 + s->server_key_len;
		pkt[0] = (uint8_t)(len >> 24);
		pkt[1] = (uint8_t)(len >> 16);
		pkt[2] = (uint8_t)(len >> 8);
		pkt[3] = (uint8_t)len;
		uint32_t code = PROTO_CANCEL_CODE;
		pkt[4] = (uint8_t)(code >> 24);
		pkt[5] = (uint8_t)(code >> 16);
		pkt[6] = (uint8_t)(code >> 8);
		pkt[7] = (uint8_t)code;
		uint32_t pid = s->cancel_server_pid;
		pkt[8] = (uint8_t)(pid >> 24);
		pkt[9] = (uint8_t)(pid >> 16);
		pkt[10] = (uint8_t)(pid >> 8);
		pkt[11] = (uint8_t)pid;
		memcpy(pkt + 12, s->server_key, s->server_key_len);
		if (!sbuf_send(sb, pkt, len)) {
			cancel_conn_done(s);
			return SB_CLOSED;
		}
		/* PostgreSQL closes the connection when it has read the request */
		return SB_CONSUMED;
	}
	case SBEV_PACKET:
		return SB_SKIP;
	case SBEV_CONNECT_FAILED:
		if (s->cancel_peer)
			log_warning("cancel forwarding to peer %d failed: %s", s->cancel_peer,
			            strerror(sb->last_errno));
		cancel_conn_done(s);
		return SB_CLOSED;
	default:
		cancel_conn_done(s);
		return SB_CLOSED;
	}
}

/*
 * A new connection that carries a CancelRequest; it keeps hold_fd (the
 * requester's socket, or -1) open until it is done: PgBouncer answers a
 * cancel only once it has been delivered, so a client's next query cannot
 * meet its own late cancel.
 */
static PgSocket *cancel_conn_new(const struct sockaddr_storage *remote, socklen_t len, int hold_fd, usec_t since)
{
	PgSocket *cs = socket_new(true);
	cs->pool = NULL;
	cs->connect_time = since; /* when the request came: cancel_wait_timeout counts from there */
	socket_set_remote(cs, (const struct sockaddr *)remote, len);
	cs->cancel_hold_fd = hold_fd;
	list_append(&inflight, &cs->node);
	return cs;
}

/*
 * Cancel requests in their pool, as PgBouncer has them: a request waits
 * (SHOW CLIENTS waiting_cancel_req) until the pool has room for its cancel
 * connection, then is sent (active_cancel_req) on a connection of its own
 * (SHOW SERVERS active_cancel). The pool's servers and cancel connections
 * together stay within twice its pool_size, so that no client, however
 * many CancelRequests it sends, makes the pooler open more connections
 * to PostgreSQL than that (doc/pgbouncer.1.md, "SHOW POOLS").
 */
static int cancel_room(const PgPool *pool)
{
	int size = pool_effective_size(pool);
	if (size <= 0)
		return INT_MAX; /* a pool of unlimited size: its cancels too */
	int room = 2 * size - pool_server_count(pool);
	return room > 1 ? room : 1;
}

/* Inside start_requests(): a cancel connection that fails at once does not start the next from its close. */
static bool starting;

/* Send the request on a cancel connection of its pool. */
static void start_request(PgSocket *req)
{
	PgSocket *server = req->cancel_target;
	struct sockaddr_storage ss;
	socklen_t len = socket_remote(server, &ss);
	PgSocket *cs = socket_new(true);
	cs->pool = req->pool;
	cs->db = server->db;
	cs->login_user = server->login_user;
	cs->connect_time = req->connect_time; /* when the request came: cancel_wait_timeout counts from there */
	cs->cancel_hold_fd = -1;
	socket_set_remote(cs, (const struct sockaddr *)&ss, len);
	cs->cancel_server_pid = server->backend_pid;
	socket_set_server_key(cs, server->server_key, server->server_key_len);
	/* the server stays parked for the connection now, not for the request */
	cs->cancel_target = server;
	req->cancel_target = NULL;
	cs->cancel_req = req;
	req->cancel_req = cs;
	change_state(req, CL_ACTIVE_CANCEL);
	change_state(cs, SV_ACTIVE_CANCEL);
	if (!sbuf_connect(&cs->sb, wk.base, (struct sockaddr *)&ss, len, 512, 1 << 20, NULL, cancel_conn_cb, cs))
		cancel_conn_done(cs);
}

static void start_requests(PgPool *pool)
{
	if (starting)
		return;
	starting = true;
	while (!list_empty(&pool->waiting_cancel_req) && pool->n_state[SV_ACTIVE_CANCEL] < cancel_room(pool))
		start_request(container_of(pool->waiting_cancel_req.next, PgSocket, node));
	starting = false;
}

/*
 * The request for `server`'s query, in its pool, holding the requester's
 * socket. It counts as a client connection (max_client_conn) until it is
 * done, as in PgBouncer; disconnect_client() counts it out.
 */
static PgSocket *request_new(PgSocket *client, PgSocket *server, int hold_fd, usec_t since)
{
	PgSocket *req = socket_new(false);
	req->pool = server->pool;
	req->db = client->db;
	req->login_user = client->login_user;
	req->connect_time = req->request_time = since;
	req->cancel_hold_fd = hold_fd;
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	if (hold_fd >= 0 && getpeername(hold_fd, (struct sockaddr *)&ss, &len) == 0)
		socket_set_remote(req, (const struct sockaddr *)&ss, len);
	worker_clients_add(1);
	req->cancel_target = server;
	server->cancels_pending++;
	change_state(req, CL_WAITING_CANCEL);
	return req;
}

/* Cancel the query of the client holding `key` in this worker; the reason for the log. */
static const char *cancel_by_key(const uint8_t *key, int hold_fd)
{
	const char *why = NULL;
	PgSocket *c = find_client_by_key(key);
	PgSocket *server = c ? c->link : NULL;
	if (!c) {
		why = "cancel request for unknown client";
	} else if (c->db && c->db->admin) {
		/* a cancel aimed at a console session aborts its pending PAUSE/WAIT_CLOSE */
		hooks.console_cancel(c); /* admin_console_cancel() */
		why = "cancel request for console client";
	} else if (!server || (server->setting_vars && !server->vars_pipelined)) {
		/* a pipelined SET has the client's query right behind it: that one is cancelled */
		why = "cancel request for idle client";
	}
	if (why) {
		hold_release(hold_fd);
		return why;
	}
	PgPool *pool = server->pool;
	PgSocket *req = request_new(c, server, hold_fd, wk.now);
	start_requests(pool);
	return req->state == CL_WAITING_CANCEL ? "cancel request queued: the pool's cancel connections are busy"
	                                       : "cancel request handled";
}

/* ---- forwarding to [peers] ---- */

#define PEER_QUEUE_MAX 256 /* cancels waiting for a peer connection slot; more are dropped */

typedef struct PeerQueue {
	int id;
	int active; /* forwarding connections open */
	int head, count;
	uint8_t keys[PEER_QUEUE_MAX][CANCEL_KEY_LEN];
	int hold_fds[PEER_QUEUE_MAX]; /* the requesters' sockets (cancel_conn_new) */
	usec_t since[PEER_QUEUE_MAX]; /* when each came (cancel_wait_timeout) */
} PeerQueue;

static PeerQueue **peer_queues;
static int n_peer_queues;

int cancel_peer_queue_count(void)
{
	return n_peer_queues;
}

size_t cancel_peer_queue_size(void)
{
	return sizeof(PeerQueue);
}

static PeerQueue *peer_queue(int id)
{
	for (int k = 0; k < n_peer_queues; k++)
		if (peer_queues[k]->id == id)
			return peer_queues[k];
	peer_queues = xrealloc(peer_queues, sizeof(*peer_queues) * (size_t)(n_peer_queues + 1));
	PeerQueue *q = xcalloc(1, sizeof(*q));
	q->id = id;
	peer_queues[n_peer_queues++] = q;
	return q;
}

/* Connections to a peer at once: its pool_size, at least 1. */
static int peer_max_connections(const CfPeer *p)
{
	int size = peer_pool_size(p);
	return size > 0 ? size : 1;
}

/* Open one connection to the peer and send it the key. False: the address is not known yet. */
static bool peer_connect(PeerQueue *q, const CfPeer *p, const uint8_t *key, int hold_fd, usec_t since)
{
	struct sockaddr_storage ss;
	socklen_t len;
	char err[320];
	DnsResult r = dns_address(p->host, p->port > 0 ? p->port : 6432, &ss, &len, err, sizeof(err));
	if (r == DNS_PENDING)
		return false;
	if (r == DNS_FAIL) {
		log_warning("cancel forwarding to peer %d failed: %s", p->id, err);
		hold_release(hold_fd);
		return true;
	}
	PgSocket *cs = cancel_conn_new(&ss, len, hold_fd, since);
	/* the packet is the key itself: its first half where a backend pid goes, the rest as the secret */
	cs->cancel_server_pid =
	    ((uint32_t)key[0] << 24) | ((uint32_t)key[1] << 16) | ((uint32_t)key[2] << 8) | (uint32_t)key[3];
	socket_set_server_key(cs, key + 4, CANCEL_KEY_LEN - 4);
	if (!sbuf_connect(&cs->sb, wk.base, (struct sockaddr *)&ss, len, 512, 1 << 20, NULL, cancel_conn_cb, cs)) {
		/*
		 * Failed at once (a unix socket that is not there): no slot was
		 * taken, so peer_drain() goes on to the next key itself instead of
		 * being re-entered from peer_conn_done().
		 */
		log_warning("cancel forwarding to peer %d failed: %s", p->id, strerror(cs->sb.last_errno));
		cancel_conn_done(cs);
		return true;
	}
	cs->cancel_peer = p->id;
	q->active++;
	return true;
}

/* Send queued keys while the peer has free slots (and its address is known). */
static void peer_drain(PeerQueue *q)
{
	const CfPeer *p = config_find_peer(&wk.cf, q->id);
	if (!p) {
		/* removed by a reload */
		for (; q->count > 0; q->count--, q->head = (q->head + 1) % PEER_QUEUE_MAX)
			hold_release(q->hold_fds[q->head]);
		return;
	}
	while (q->count > 0 && q->active < peer_max_connections(p)) {
		/* taken off the queue first: the key and its hold_fd are passed on once */
		int at = q->head;
		q->head = (q->head + 1) % PEER_QUEUE_MAX;
		q->count--;
		if (!peer_connect(q, p, q->keys[at], q->hold_fds[at], q->since[at])) {
			/* the lookup's end calls cancel_peers_wake(): back at the head until then */
			q->head = at;
			q->count++;
			return;
		}
	}
}

static void peer_conn_done(int peer_id)
{
	PeerQueue *q = peer_queue(peer_id);
	q->active--;
	peer_drain(q);
}

void cancel_peers_wake(void)
{
	for (int k = 0; k < n_peer_queues; k++)
		peer_drain(peer_queues[k]);
}

/* A key of peer `owner`: passed on with one less hop of TTL. Returns the reason for the log. */
static const char *peer_forward(const uint8_t *key, int owner, int hold_fd, char *why, size_t whylen)
{
	PeerQueue *q = NULL;
	bool dropped = true;
	if ((key[7] & 0x03) == 0)
		snprintf(why, whylen, "cancel request for peer %d dropped: forwarding limit reached", owner);
	else if (!config_find_peer(&wk.cf, owner))
		snprintf(why, whylen, "cancel request for unknown peer %d", owner);
	else if ((q = peer_queue(owner))->count >= PEER_QUEUE_MAX)
		snprintf(why, whylen, "cancel request for peer %d dropped: %d already wait", owner, q->count);
	else
		dropped = false;
	if (dropped) {
		hold_release(hold_fd);
		return why;
	}
	int at = (q->head + q->count) % PEER_QUEUE_MAX;
	memcpy(q->keys[at], key, CANCEL_KEY_LEN);
	q->keys[at][7]--; /* the TTL bits are not 00: this only counts them down */
	q->hold_fds[at] = hold_fd;
	q->since[at] = wk.now;
	q->count++;
	peer_drain(q);
	snprintf(why, whylen, "cancel request forwarded to peer %d", owner);
	return why;
}

/* The requester's socket, held open by whoever delivers the cancel (-1 if it cannot be). */
static int hold_of(PgSocket *req)
{
	return req->sb.fd >= 0 ? fcntl(req->sb.fd, F_DUPFD_CLOEXEC, 0) : -1;
}

/*
 * No master (an orphaned worker, doc/workers.md "When the master dies"):
 * a key of another worker goes straight to that worker's private socket as
 * a CancelRequest of its own. One small write on a unix socket: it either
 * goes at once or not at all.
 */
static bool cancel_to_worker_socket(int worker, const uint8_t *key)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int n = snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/worker.%d/.s.PGSQL.%d", worker_private_dir(), worker,
	                 wk.cf.g.listen_port);
	if (!worker_private_dir()[0] || n < 0 || (size_t)n >= sizeof(sa.sun_path))
		return false;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return false;
	uint8_t pkt[16] = {0, 0, 0, 16};
	uint32_t code = htonl(PROTO_CANCEL_CODE);
	memcpy(pkt + 4, &code, 4);
	memcpy(pkt + 8, key, CANCEL_KEY_LEN);
	bool ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && write(fd, pkt, sizeof(pkt)) == sizeof(pkt);
	close(fd);
	return ok;
}

void cancel_handle_request(PgSocket *req, const uint8_t *key_in)
{
	uint8_t key[CANCEL_KEY_LEN];
	memcpy(key, key_in, CANCEL_KEY_LEN);
	if (wk.cf.g.peer_id > 0) {
		/* bytes 1-2 name the peer that handed out the key */
		int owner = key[1] | key[2] << 8;
		if (owner != wk.cf.g.peer_id) {
			char why[128];
			disconnect_client(req, false, "%s", peer_forward(key, owner, hold_of(req), why, sizeof(why)));
			return;
		}
		key[7] |= 0x03; /* back to the key as we handed it out */
	}
	/*
	 * byte 3 names the worker that handed out the key: a foreign key goes
	 * there through the master. A key of ours that no client here has may
	 * belong to a client moved to another worker (doc/workers.md,
	 * "Rebalancing long-lived clients"): the master knows where it went.
	 */
	bool foreign = key[3] != (uint8_t)wk.id;
	if (!wk.master_out && foreign) {
		bool sent = cancel_to_worker_socket(key[3], key_in);
		disconnect_client(req, false, "cancel request %s worker %d's private socket (no master)",
		                  sent ? "forwarded to" : "could not be forwarded to", key[3]);
		return;
	}
	if (wk.master_out && (foreign || !find_client_by_key(key))) {
		ChannelMsg m = {.type = CH_CANCEL, .id = foreign ? 0 : CANCEL_NOT_HERE};
		memcpy(&m.arg, key, CANCEL_KEY_LEN);
		/*
		 * The request's socket goes along (a copy, if it waits in the
		 * channel's queue): the owner holds it until the cancel is delivered.
		 * A failure is logged by the channel.
		 */
		(void)worker_tell_master(&m, req->sb.fd);
		if (foreign)
			disconnect_client(req, false, "cancel request forwarded to worker %d", key[3]);
		else
			disconnect_client(req, false, "cancel request forwarded to the master (moved client?)");
		return;
	}
	disconnect_client(req, false, "%s", cancel_by_key(key, hold_of(req)));
}

/*
 * cancel_wait_timeout: a cancel not passed on within it, still queued for
 * a peer or still connecting, is dropped and its requester let go
 * (doc/pgbouncer.5.md). One that has been sent waits for the receiver to
 * close, as in PgBouncer. The queues go first: a dropped connection lets
 * the next queued cancel go.
 */
void cancel_check_timeouts(void)
{
	usec_t limit = wk.cf.g.cancel_wait_timeout;
	if (limit <= 0)
		return;
	for (int k = 0; k < n_peer_queues; k++) {
		PeerQueue *q = peer_queues[k];
		while (q->count > 0 && wk.now - q->since[q->head] > limit) {
			log_info("cancel request for peer %d dropped: not forwarded within cancel_wait_timeout", q->id);
			hold_release(q->hold_fds[q->head]);
			q->head = (q->head + 1) % PEER_QUEUE_MAX;
			q->count--;
		}
	}
	List *i, *tmp;
	list_for_each(i, &wk.pools)
	{
		PgPool *pool = container_of(i, PgPool, node);
		List *j, *t2;
		list_for_each_safe(j, &pool->waiting_cancel_req, t2)
		{
			PgSocket *req = container_of(j, PgSocket, node);
			if (wk.now - req->connect_time <= limit)
				break; /* in the order they came */
			log_info("cancel request dropped: not forwarded within cancel_wait_timeout");
			disconnect_client(req, false, "cancel request not forwarded within cancel_wait_timeout");
		}
		/* a connection that closes lets a waiting one start: those go at the next pass */
		list_for_each_safe(j, &pool->active_cancel_servers, t2)
		{
			PgSocket *cs = container_of(j, PgSocket, node);
			if (cs->sb.connecting && wk.now - cs->connect_time > limit) {
				log_info("cancel request dropped: not forwarded within cancel_wait_timeout");
				cancel_conn_done(cs);
			}
		}
	}
	list_for_each_safe(i, &inflight, tmp)
	{
		PgSocket *cs = container_of(i, PgSocket, node);
		if (!cs->sb.connecting || wk.now - cs->connect_time <= limit)
			continue;
		log_info("cancel request for peer %d dropped: not forwarded within cancel_wait_timeout",
		         cs->cancel_peer);
		cancel_conn_done(cs);
	}
}

void cancel_forwarded(const uint8_t *key, int hold_fd, bool final)
{
	if (!final && wk.master_out && hold_fd >= 0 && !find_client_by_key(key)) {
		/*
		 * the master sent it here and no client has it: back to the master,
		 * which passes it to the tree we replaced if that one still runs
		 * (doc/workers.md "Upgrading"), or drops it
		 */
		ChannelMsg m = {.type = CH_CANCEL, .id = CANCEL_NOT_HERE};
		memcpy(&m.arg, key, CANCEL_KEY_LEN);
		(void)worker_tell_master(&m, hold_fd); /* a failure is logged by the channel */
		hold_release(hold_fd);
		log_debug("forwarded cancel request for unknown client: returned to the master");
		return;
	}
	const char *what = cancel_by_key(key, hold_fd);
	log_debug("forwarded %s", what);
}
