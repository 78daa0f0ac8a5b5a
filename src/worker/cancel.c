/*
 * Cancel keys and CancelRequest handling: clients get pooler-made keys
 * (with room for peer_id and worker id bits); a CancelRequest with such a
 * key is sent on a new connection to the server the client is linked to,
 * with that server's own key. A key of another peer_id goes to that
 * [peers] entry (spec/behaviours.md §9, doc/pgbouncer.5.md "[peers]").
 */
#include "config.h"

#include <openssl/rand.h>
#include <sys/random.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <errno.h>
#include <string.h>

#include "common/channel.h"
#include "common/config.h"
#include "common/log.h"
#include "common/util.h"
#include "worker/dns.h"
#include "worker/worker.h"

/*
 * Key layout (8 bytes): byte 0 random with the top bit clear; bytes 1-2 the
 * peer_id (low, high) when peering is on; byte 3 the worker id; byte 7's
 * two low bits are the forwarding TTL (11) when peering is on. The rest is
 * random.
 */
void cancel_gen_key(PgSocket *c)
{
	uint8_t *k = c->cancel_key;
	/*
	 * One getrandom() from the kernel's CSPRNG: cheaper per login than
	 * OpenSSL's generator (its fork check and AES-CTR showed in churn
	 * profiles); OpenSSL only if the kernel cannot answer.
	 */
	if (getrandom(k, CANCEL_KEY_LEN, GRND_NONBLOCK) != CANCEL_KEY_LEN && RAND_bytes(k, CANCEL_KEY_LEN) != 1)
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
 * must never hit another client's query, spec/behaviours.md §9).
 */
static void peer_conn_done(int peer_id);

static void cancel_conn_done(PgSocket *cs)
{
	PgSocket *target = cs->cancel_target;
	int peer = cs->cancel_peer;
	cs->cancel_target = NULL;
	cs->cancel_peer = 0;
	sbuf_close(&cs->sb);
	change_state(cs, SV_JUSTFREE);
	if (target && --target->cancels_pending == 0 && target->state == SV_BEING_CANCELED)
		pool_server_ready(target);
	if (peer)
		peer_conn_done(peer);
}

void cancel_server_gone(PgSocket *server)
{
	List *i;
	list_for_each(i, &inflight)
	{
		PgSocket *cs = container_of(i, PgSocket, node);
		if (cs->cancel_target == server)
			cs->cancel_target = NULL;
	}
	server->cancels_pending = 0;
}

/* The connection that carries one CancelRequest to PostgreSQL. */
static SBufAction cancel_conn_cb(SBuf *sb, SBufEvent ev, const PktHdr *hdr, const uint8_t *data, uint32_t avail)
{
	PgSocket *s = sb->owner;
	switch (ev) {
	case SBEV_CONNECTED: {
		uint8_t pkt[16 + MAX_SERVER_KEY];
		uint32_t len = 12 + s->cancel_server_key_len;
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
		memcpy(pkt + 12, s->cancel_server_key, s->cancel_server_key_len);
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

/* Cancel the query of the client holding `key` in this worker; the reason for the log. */
static const char *cancel_by_key(const uint8_t *key)
{
	PgSocket *c = find_client_by_key(key);
	if (!c)
		return "cancel request for unknown client";
	if (c->db && c->db->admin) {
		/* a cancel aimed at a console session aborts its pending PAUSE/WAIT_CLOSE */
		admin_console_cancel(c);
		return "cancel request for console client";
	}
	PgSocket *server = c->link;
	if (!server || server->setting_vars)
		return "cancel request for idle client";
	PgSocket *cs = socket_new(true);
	cs->pool = NULL;
	cs->db = server->db;
	cs->login_user = server->login_user;
	cs->remote = server->remote;
	cs->cancel_server_pid = server->backend_pid;
	memcpy(cs->cancel_server_key, server->cancel_key, server->cancel_key_len);
	cs->cancel_server_key_len = server->cancel_key_len;
	socklen_t len = server->remote.ss_family == AF_INET    ? sizeof(struct sockaddr_in)
	                : server->remote.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
	                                                       : sizeof(struct sockaddr_un);
	list_append(&inflight, &cs->node);
	cs->cancel_target = server;
	server->cancels_pending++;
	if (!sbuf_connect(&cs->sb, wk.base, (struct sockaddr *)&cs->remote, len, 512, 1 << 20, NULL, cancel_conn_cb,
	                  cs))
		cancel_conn_done(cs);
	return "cancel request handled";
}

/* ---- forwarding to [peers] ---- */

#define PEER_QUEUE_MAX 256 /* cancels waiting for a peer connection slot; more are dropped */

typedef struct PeerQueue {
	int id;
	int active; /* forwarding connections open */
	int head, count;
	uint8_t keys[PEER_QUEUE_MAX][CANCEL_KEY_LEN];
} PeerQueue;

static PeerQueue **peer_queues;
static int n_peer_queues;

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
static bool peer_connect(PeerQueue *q, const CfPeer *p, const uint8_t *key)
{
	struct sockaddr_storage ss;
	socklen_t len;
	char err[320];
	DnsResult r = dns_address(p->host, p->port > 0 ? p->port : 6432, &ss, &len, err, sizeof(err));
	if (r == DNS_PENDING)
		return false;
	if (r == DNS_FAIL) {
		log_warning("cancel forwarding to peer %d failed: %s", p->id, err);
		return true;
	}
	PgSocket *cs = socket_new(true);
	cs->pool = NULL;
	cs->remote = ss;
	cs->cancel_peer = p->id;
	/* the packet is the key itself: its first half where a backend pid goes, the rest as the secret */
	cs->cancel_server_pid =
	    ((uint32_t)key[0] << 24) | ((uint32_t)key[1] << 16) | ((uint32_t)key[2] << 8) | (uint32_t)key[3];
	memcpy(cs->cancel_server_key, key + 4, CANCEL_KEY_LEN - 4);
	cs->cancel_server_key_len = CANCEL_KEY_LEN - 4;
	list_append(&inflight, &cs->node);
	q->active++;
	if (!sbuf_connect(&cs->sb, wk.base, (struct sockaddr *)&ss, len, 512, 1 << 20, NULL, cancel_conn_cb, cs)) {
		log_warning("cancel forwarding to peer %d failed: %s", p->id, strerror(cs->sb.last_errno));
		cancel_conn_done(cs);
	}
	return true;
}

/* Send queued keys while the peer has free slots (and its address is known). */
static void peer_drain(PeerQueue *q)
{
	const CfPeer *p = config_find_peer(&wk.cf, q->id);
	if (!p) {
		q->count = 0; /* removed by a reload */
		return;
	}
	while (q->count > 0 && q->active < peer_max_connections(p)) {
		if (!peer_connect(q, p, q->keys[q->head]))
			return; /* the lookup's end calls cancel_peers_wake() */
		q->head = (q->head + 1) % PEER_QUEUE_MAX;
		q->count--;
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
static const char *peer_forward(const uint8_t *key, int owner, char *why, size_t whylen)
{
	if ((key[7] & 0x03) == 0) {
		snprintf(why, whylen, "cancel request for peer %d dropped: forwarding limit reached", owner);
		return why;
	}
	if (!config_find_peer(&wk.cf, owner)) {
		snprintf(why, whylen, "cancel request for unknown peer %d", owner);
		return why;
	}
	PeerQueue *q = peer_queue(owner);
	if (q->count >= PEER_QUEUE_MAX) {
		snprintf(why, whylen, "cancel request for peer %d dropped: %d already wait", owner, q->count);
		return why;
	}
	uint8_t *slot = q->keys[(q->head + q->count) % PEER_QUEUE_MAX];
	memcpy(slot, key, CANCEL_KEY_LEN);
	slot[7]--; /* the TTL bits are not 00: this only counts them down */
	q->count++;
	peer_drain(q);
	snprintf(why, whylen, "cancel request forwarded to peer %d", owner);
	return why;
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
			disconnect_client(req, false, "%s", peer_forward(key, owner, why, sizeof(why)));
			return;
		}
		key[7] |= 0x03; /* back to the key as we handed it out */
	}
	/* byte 3 names the worker that handed out the key: a foreign key goes there through the master */
	if (key[3] != (uint8_t)wk.id && wk.master_fd >= 0) {
		ChannelMsg m = {.type = CH_CANCEL};
		memcpy(&m.arg, key, CANCEL_KEY_LEN);
		if (!channel_send(wk.master_fd, &m, -1))
			log_warning("could not forward a cancel request to worker %d: %s", key[3], strerror(errno));
		disconnect_client(req, false, "cancel request forwarded to worker %d", key[3]);
		return;
	}
	disconnect_client(req, false, "%s", cancel_by_key(key));
}

void cancel_forwarded(const uint8_t *key)
{
	const char *what = cancel_by_key(key);
	log_debug("forwarded %s", what);
}
