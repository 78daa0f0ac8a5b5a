/*
 * Cancel keys and CancelRequest handling: clients get pooler-made keys
 * (with room for peer_id and worker id bits); a CancelRequest with such a
 * key is sent on a new connection to the server the client is linked to,
 * with that server's own key.
 */
#include "config.h"

#include <openssl/rand.h>
#include <sys/random.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <errno.h>
#include <string.h>

#include "common/channel.h"
#include "common/log.h"
#include "common/util.h"
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
static void cancel_conn_done(PgSocket *cs)
{
	PgSocket *target = cs->cancel_target;
	cs->cancel_target = NULL;
	sbuf_close(&cs->sb);
	change_state(cs, SV_JUSTFREE);
	if (target && --target->cancels_pending == 0 && target->state == SV_BEING_CANCELED)
		pool_server_ready(target);
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
	if (!sbuf_connect(&cs->sb, wk.base, (struct sockaddr *)&cs->remote, len, 512, 1 << 20, cancel_conn_cb, cs))
		cancel_conn_done(cs);
	return "cancel request handled";
}

void cancel_handle_request(PgSocket *req, const uint8_t *key)
{
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
