/*
 * Moving logged-in clients between workers (include/worker/migrate.h;
 * doc/workers.md "Rebalancing long-lived clients"). The giver packs a
 * movable client, sends the bytes with its socket attached, and forgets it
 * without touching the connection; the receiver rebuilds it and reads the
 * socket from where the giver stopped. A client is movable only when no
 * byte of its stream sits in the pooler: no server linked, nothing
 * buffered either way, no COPY, not logging in, plain (no TLS state).
 * One exception: a client waiting for a server has its request buffered
 * and nothing else; those bytes travel with it, and the receiver takes
 * them up as if they had just been read.
 */
#include "autoconfig.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/channel.h"
#include "common/log.h"
#include "common/util.h"
#include "worker/client.h"
#include "worker/handover_codec.h"
#include "worker/migrate.h"
#include "worker/server.h"
#include "worker/pool.h"
#include "worker/prepare.h"
#include "worker/txn.h"
#include "worker/worker.h"

_Static_assert(HANDOVER_CANCEL_KEY_LEN == CANCEL_KEY_LEN, "the codec carries the whole cancel key");

bool migrate_counts(const PgSocket *c)
{
	return !c->is_server && !c->is_private && !c->is_internal && c->db && !c->db->admin && c->pool && c->login_user;
}

/* Bytes on their way through a socket's buffers, either way. */
static bool in_flight(const SBuf *sb)
{
	return sb->fd < 0 || sb->pkt_remain || sb->send_pos != sb->send_end || sb->out_pos < sb->out.len ||
	       sb->writing || sb->connecting || sb->waiting_src || sb->in_process || sb->resume_pending ||
	       sbuf_unsent(sb) || sbuf_ring_holds(sb);
}

/*
 * Why a session-mode client's server cannot go along now (doc/workers.md,
 * "Session-mode clients move too"), or NULL: between queries, with
 * ReadyForQuery sent and the session idle (status I, not in a transaction
 * block: a block's state lives in the backend and would move too, but a
 * client that opens one usually runs it to its end at once), no COPY,
 * nothing buffered either way, nothing the pooler itself runs on it, and a
 * plain connection: a TLS one's state lives in this process.
 */
static const char *server_unmovable_reason(const PgSocket *c, bool *lasting)
{
	const PgSocket *s = c->link;
	if (s->link_mode != POOL_SESSION)
		return "linked to a server"; /* transaction or statement mode: inside a transaction */
	if (socket_is_tls(s)) {
		*lasting = true;
		return "TLS server connection";
	}
	if (s->close_needed) {
		*lasting = true; /* closed when its client leaves */
		return "server to be closed";
	}
	if (s->sstmts) {
		/* the pooler's statements of an earlier transaction-mode pool: their map lives here */
		*lasting = true;
		return "server holds the pooler's prepared statements";
	}
	if (s->state != SV_ACTIVE || !s->ready || s->txn_status != 'I' || s->copy_mode || s->setting_vars ||
	    s->resetting || s->checking || s->session.open || s->session.owed || s->rq.count || s->held_for_check ||
	    s->cancels_pending > 0 || s->auth_query || s->welcome_pending || s->tls_pending || s->tls_host)
		return "in a query or transaction";
	if (in_flight(&s->sb) || s->sb.pos != s->sb.end || s->sb.paused)
		return "bytes in flight";
	return NULL;
}

const char *migrate_unmovable_reason(const PgSocket *c, bool *lasting)
{
	const SBuf *sb = &c->sb;
	*lasting = true;
	if (c->replication != REPLICATION_NONE)
		return "replication connection";
	if (socket_is_tls(c))
		return "TLS connection";
	if (c->db->placeholder || c->own_placeholder)
		return "unknown database";
	*lasting = false;
	/* waiting for a server: its buffered request goes along (migrate_pack) */
	bool waiting = c->state == CL_WAITING;
	if (c->state != CL_ACTIVE && !waiting)
		return "not logged in";
	if (c->link) {
		const char *why = server_unmovable_reason(c, lasting);
		if (why)
			return why;
	}
	if (c->copy_mode || c->query_start || c->xact_start)
		return "in a query or transaction";
	if (c->auth_query)
		return "auth_query lookup running";
	if (in_flight(sb))
		return "bytes in flight";
	if (waiting ? sb->end - sb->pos > MIGRATE_MAX_REQUEST : sb->pos != sb->end || sb->paused)
		return "bytes in flight";
	if (wk.pause_mode != P_NONE || c->db->paused || c->db->disabled)
		return "paused"; /* a worker started meanwhile is not paused: the client would run there */
	return NULL;
}

void migrate_count(uint32_t *movable, uint32_t *unmovable)
{
	*movable = *unmovable = 0;
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		if (p->db->admin)
			continue;
		List *lists[2] = {&p->active_clients, &p->waiting_clients};
		for (int l = 0; l < 2; l++) {
			List *j;
			list_for_each(j, lists[l])
			{
				PgSocket *c = container_of(j, PgSocket, node);
				bool lasting;
				if (!migrate_counts(c))
					continue;
				if (migrate_unmovable_reason(c, &lasting))
					(*unmovable)++;
				else
					(*movable)++;
			}
		}
	}
}

/* ---- packing ---- */

/*
 * The client as the codec's plain struct (include/worker/handover_codec.h),
 * borrowing its strings; the caller frees the two arrays.
 */
/* A session-mode client's server as the codec's struct, borrowing its strings; the caller frees vars. */
static void server_to_handover(const PgSocket *s, const int *moved, HandoverServer *hs)
{
	if (moved) {
		hs->units_moved = true;
		for (int k = 0; k < 3; k++)
			hs->units.entry[k] = moved[k];
	}
	hs->id = s->id;
	hs->pool_user = s->pool->user->name;
	socket_remote(s, &hs->remote);
	hs->connect_time = (uint64_t)s->connect_time;
	hs->request_time = (uint64_t)s->request_time;
	hs->backend_pid = s->backend_pid;
	hs->key = s->server_key;
	hs->key_len = s->server_key ? s->server_key_len : 0;
	for (int i = 0; i < var_count(); i++)
		if (sock_var(s, i))
			hs->nvars++;
	hs->vars = xcalloc(hs->nvars ? hs->nvars : 1, sizeof(*hs->vars));
	for (int i = 0, k = 0; i < var_count(); i++)
		if (sock_var(s, i))
			hs->vars[k++] = (HandoverVar){.name = var_name(i), .value = sock_var(s, i)};
	hs->bytes_in = s->sb.bytes_in;
	hs->bytes_out = s->sb.bytes_out;
	hs->session_tail = s->session.tail;
	hs->db_definition = db_definition_hash(&s->pool->db->cf);
	hs->close_needed = s->close_needed;
}

static void client_to_handover(const PgSocket *c, const int *moved, HandoverClient *hc)
{
	const PgUser *u = c->login_user;
	memset(hc, 0, sizeof(*hc));
	if (moved) {
		hc->units_moved = true;
		hc->units.entry[0] = moved[0];
		hc->units.entry[1] = moved[1];
	}
	hc->id = c->id;
	hc->database = c->db->name;
	hc->user = u->name;
	hc->is_unix = c->is_unix;
	socket_remote(c, &hc->remote);
	socket_local_addr(c, &hc->local); /* the receiver asks its socket; zero if unknown */
	hc->peer_pid = (uint32_t)c->peer_pid;
	hc->peer_uid = (uint32_t)c->peer_uid;
	hc->connect_time = (uint64_t)c->connect_time;
	hc->request_time = (uint64_t)c->request_time;
	hc->auth_method = c->auth_method;
	memcpy(hc->cancel_key, c->cancel_key, sizeof(hc->cancel_key));
	hc->app_name = c->app_name_raw;
	hc->bytes_in = c->sb.bytes_in;
	hc->bytes_out = c->sb.bytes_out;

	for (int i = 0; i < var_count(); i++)
		if (sock_var(c, i))
			hc->nvars++;
	hc->vars = xcalloc(hc->nvars ? hc->nvars : 1, sizeof(*hc->vars));
	for (int i = 0, k = 0; i < var_count(); i++)
		if (sock_var(c, i))
			hc->vars[k++] = (HandoverVar){.name = var_name(i), .value = sock_var(c, i)};

	/* the receiver prepares them lazily, with the result type the client was given */
	hc->nstmts = prepare_client_count(&c->stmts);
	hc->stmts = xcalloc(hc->nstmts ? hc->nstmts : 1, sizeof(*hc->stmts));
	uint32_t k = 0;
	for (const ClientStmt *cs = prepare_client_first(&c->stmts); cs && k < hc->nstmts;
	     cs = prepare_client_next(cs), k++) {
		size_t keylen;
		const PreparedStmt *ps = prepare_client_stmt(cs);
		hc->stmts[k].name = prepare_client_name(cs);
		hc->stmts[k].body = prepare_stmt_key(ps, &keylen);
		hc->stmts[k].body_len = (uint32_t)keylen;
		hc->stmts[k].desc = prepare_stmt_desc(ps);
	}
	hc->nstmts = k;

	/* the login's secret, for a receiver that never saw this user (auth_query, SCRAM pass-through) */
	if (u->secret) {
		HandoverSecret *s = &hc->secret;
		hc->has_secret = true;
		s->text = u->secret;
		s->kind = (uint32_t)u->kind;
		s->from_auth_query = u->from_auth_query;
		s->from_pam = u->from_pam;
		s->has_scram_keys = u->has_scram_keys;
		if (u->has_scram_keys) {
			memcpy(s->scram_client_key, u->scram_client_key, SCRAM_KEY_LEN);
			memcpy(s->scram_server_key, u->scram_server_key, SCRAM_KEY_LEN);
		}
		/* when auth_query or PAM gave it: a receiver keeps the newer of its own and this one */
		s->time = (u->from_auth_query || u->from_pam) ? (uint64_t)u->secret_time : 0;
	}

	/* a waiting client's buffered request, since when it waits, and whether it got its NOTICE */
	if (c->state == CL_WAITING && c->sb.end > c->sb.pos) {
		hc->request = c->sb.buf + c->sb.pos;
		hc->request_len = c->sb.end - c->sb.pos;
		hc->wait_start = (uint64_t)c->wait_start;
		hc->wait_notice_sent = c->wait_notice_sent;
	}
}

bool migrate_pack(const PgSocket *c, const int *moved, const int *server_moved, PktBuf *pb)
{
	HandoverClient hc;
	client_to_handover(c, moved, &hc);
	if (c->link) {
		hc.has_server = true;
		server_to_handover(c->link, server_moved, &hc.server);
	}
	handover_encode(&hc, pb);
	free(hc.vars);
	free(hc.stmts);
	free(hc.server.vars);
	return pb->len <= MIGRATE_MAX_STATE;
}

/* ---- the socket pair ---- */

bool migrate_send(int sock, const PktBuf *state, int fd, int server_fd)
{
	int fds[2] = {fd, server_fd};
	/* a SOCK_SEQPACKET message goes whole or not at all, its descriptors with it */
	return fd_send(sock, state->buf, state->len, fds, server_fd >= 0 ? 2 : 1, MSG_DONTWAIT) == (ssize_t)state->len;
}

int migrate_recv(int sock, uint8_t *buf, size_t cap, size_t *len, int fds[2], int *nfds)
{
	bool truncated;
	ssize_t n = fd_recv(sock, buf, cap, fds, 2, nfds, MSG_DONTWAIT, &truncated);
	if (n < 0)
		return -1;
	if (n == 0 && *nfds == 0)
		return 0;
	*len = truncated ? 0 : (size_t)n; /* a truncated state cannot be used */
	return 1;
}

/* ---- giving ---- */

/*
 * After a successful send: forget a session-mode client's server here too,
 * keeping PostgreSQL's connection open (no Terminate; only our descriptor
 * closes). units_moved: its server units went to the receiver.
 */
static void forget_server(PgSocket *s, bool units_moved)
{
	PgSocket *c = s->link;
	s->link = NULL;
	s->sb.dst = NULL;
	if (c) {
		c->link = NULL;
		c->sb.dst = NULL;
	}
	s->pool->db->server_count--;
	s->pool->user->server_count--;
	if (units_moved)
		s->budget.taken = false; /* the receiver holds them now (pool_move_server_budget()) */
	else
		budget_hold_release(&s->budget);
	sbuf_close(&s->sb); /* plain socket: close() of our descriptor only; the session lives on */
	change_state(s, SV_JUSTFREE);
}

void migrate_forget(PgSocket *c, bool units_moved)
{
	/* as disconnect_client() counts a logged-in client out, without a word to it */
	c->db->client_count--;
	c->login_user->client_count--;
	if (units_moved) {
		/* the receiver holds them now (pool_move_client_budget()) */
		c->budget.taken = false;
		wk.client_count--;
	} else {
		budget_hold_release(&c->budget);
		worker_clients_add(-1);
	}
	sbuf_close(&c->sb); /* plain socket: close() of our descriptor only; the connection lives on */
	change_state(c, CL_JUSTFREE);
}

/* A client that stays after all: its sockets may go back to the receive ring. */
static void stay_on_ring(PgSocket *c)
{
	sbuf_use_ring(&c->sb);
	if (c->link)
		sbuf_use_ring(&c->link->sb);
}

/*
 * Send up to count movable clients over sock (left open) to worker `to` of
 * this tree (-1: of another tree). *gone: the other end is closed or full.
 */
static int give_batch(int sock, int to, int64_t count, int *failed, const char **why, bool *gone)
{
	int moved = 0;
	bool full = false;
	PktBuf pb;
	pktbuf_init(&pb, 1024);
	List *i;
	*gone = false;
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		if (p->db->admin)
			continue;
		/* idle clients first; then those waiting for a server, the queue's tail first (the latest to be served) */
		List *lists[2] = {&p->active_clients, &p->waiting_clients};
		for (int l = 0; l < 2; l++) {
			List *j, *t;
			for (j = l ? lists[l]->prev : lists[l]->next, t = l ? j->prev : j->next; j != lists[l];
			     j = t, t = l ? j->prev : j->next) {
				if (moved >= count || full)
					break;
				PgSocket *c = container_of(j, PgSocket, node);
				bool lasting;
				if (!migrate_counts(c) || migrate_unmovable_reason(c, &lasting))
					continue;
				/*
				 * The receive ring lets go of the sockets first; what it had
				 * taken from them meanwhile keeps the client here for now.
				 */
				bool released = sbuf_ring_release(&c->sb);
				if (c->link && !sbuf_ring_release(&c->link->sb))
					released = false;
				if (!released) {
					stay_on_ring(c);
					continue;
				}
				pktbuf_reset(&pb);
				/* its units go first: the totals never dip while it is on its way */
				int units_to[2], sunits_to[3];
				bool units = pool_move_client_budget(c, to, units_to);
				PgSocket *s = c->link; /* an idle session-mode client's server goes along */
				bool sunits = s && pool_move_server_budget(s, to, sunits_to);
				if (!migrate_pack(c, units ? units_to : NULL, sunits ? sunits_to : NULL, &pb)) {
					if (units)
						pool_unmove_client_budget(c, to, units_to);
					if (sunits)
						pool_unmove_server_budget(s, to, sunits_to);
					stay_on_ring(c);
					(*failed)++;
					*why = "state too large";
					continue;
				}
				if (!migrate_send(sock, &pb, c->sb.fd, s ? s->sb.fd : -1)) {
					/* nothing went: the client stays here, untouched */
					int e = errno;
					if (units)
						pool_unmove_client_budget(c, to, units_to);
					if (sunits)
						pool_unmove_server_budget(s, to, sunits_to);
					stay_on_ring(c);
					errno = e;
					(*failed)++;
					*why = strerror(errno);
					full = errno == EAGAIN || errno == EWOULDBLOCK || errno == EPIPE ||
					       errno == ECONNRESET;
					*gone = errno == EPIPE || errno == ECONNRESET;
					continue;
				}
				if (s)
					forget_server(s, sunits);
				migrate_forget(c, units);
				moved++;
			}
		}
	}
	pktbuf_free(&pb);
	return moved;
}

void migrate_give(int sock, int to, int64_t count)
{
	int failed = 0;
	const char *why = NULL;
	bool gone;
	int moved = give_batch(sock, to, count, &failed, &why, &gone);
	if (wk.run_state == RUN_DRAINING && !gone) {
		/*
		 * Draining: the order's socket is kept until the next order, so
		 * that a client that runs one transaction after another goes at
		 * the end of one of them (migrate_drain_due()), not only if an
		 * order comes at the instant it is between two.
		 */
		if (wk.drain_fd >= 0)
			close(wk.drain_fd);
		wk.drain_fd = sock;
		wk.drain_to = to;
	} else {
		close(sock);
	}
	wk.moved_out += (uint64_t)moved;
	wk.move_failed += (uint64_t)failed;
	if (count == 0 && moved == 0 && failed == 0)
		return; /* a drain's channel only (supervisor.c's drain()): nothing to say */
	uint32_t movable, unmovable;
	migrate_count(&movable, &unmovable);
	if (failed)
		log_info("moved %d clients to worker %d (%lld asked; %d could not move: %s; %u not movable now)", moved,
		         to, (long long)count, failed, why, unmovable);
	else
		log_info("moved %d clients to worker %d (%lld asked; %u not movable now)", moved, to, (long long)count,
		         unmovable);
	worker_publish();
	worker_check_shutdown(); /* a draining worker may have nobody left */
}

/*
 * The worker the kept socket leads to drains or is gone: it would pass the
 * clients on again, and the socket would hold up its own exit (its
 * intake). Closed; the master's next order brings another.
 */
static bool drain_target_gone(void)
{
	if (wk.drain_fd < 0)
		return true;
	if (!wk.shm || wk.drain_to < 0 || wk.drain_to >= SHM_MAX_WORKERS)
		return false;
	const WorkerSlot *s = &wk.shm->slots[wk.drain_to];
	uint32_t st = atomic_load(&s->state);
	if (atomic_load(&s->pid) > 0 && (st == SLOT_ACTIVE || st == SLOT_STARTING))
		return false;
	close(wk.drain_fd);
	wk.drain_fd = -1;
	return true;
}

void migrate_drain_check(void)
{
	(void)drain_target_gone();
}

void migrate_drain_due(void)
{
	if (drain_target_gone())
		return;
	int failed = 0;
	const char *why = NULL;
	bool gone;
	int moved = give_batch(wk.drain_fd, wk.drain_to, INT64_MAX, &failed, &why, &gone);
	wk.move_failed += (uint64_t)failed;
	if (gone) {
		close(wk.drain_fd);
		wk.drain_fd = -1; /* the next order brings another */
	}
	if (moved == 0)
		return;
	wk.moved_out += (uint64_t)moved;
	log_info("moved %d clients to worker %d at the end of a transaction", moved, wk.drain_to);
	worker_publish();
	worker_check_shutdown(); /* nobody left: exit, which closes our end */
}

void migrate_handoff_start(int sock)
{
	if (wk.handoff_fd >= 0)
		close(wk.handoff_fd);
	wk.handoff_fd = sock;
	log_info("handing clients to the new process as they become movable");
	migrate_handoff_tick();
}

/* Hand what is movable to the new tree: at a tick, or at the end of a loop pass in which a transaction ended. */
static void handoff_give(bool at_tick)
{
	if (wk.handoff_fd < 0)
		return;
	int failed = 0;
	const char *why = NULL;
	bool gone;
	/* a send that finds the buffer full leaves the rest for the next tick */
	int moved = give_batch(wk.handoff_fd, -1, INT64_MAX, &failed, &why, &gone);
	if (gone) {
		log_warning("the new process's worker no longer takes clients (%s): the rest finish here", why);
		close(wk.handoff_fd);
		wk.handoff_fd = -1;
		wk.move_failed += (uint64_t)failed;
	}
	if (moved == 0)
		return;
	wk.moved_out += (uint64_t)moved;
	uint32_t movable, unmovable;
	migrate_count(&movable, &unmovable);
	/* at most one line per client: each goes once */
	log_info("handed %d clients to the new process%s (%u not movable now)", moved,
	         at_tick ? "" : " at the end of a transaction", unmovable);
	worker_publish();
	worker_check_shutdown(); /* nobody left: exit, which closes our end (the new worker reads to EOF) */
}

void migrate_handoff_tick(void)
{
	handoff_give(true);
}

void migrate_handoff_due(void)
{
	handoff_give(false);
}

/* ---- taking ---- */

/* Tell the client why it cannot go on, then close it (it has no worker of its own any more). */
static void refuse(int fd, const char *why)
{
	PktBuf pb;
	pktbuf_init(&pb, 128);
	pktbuf_write_error(&pb, "FATAL", "08P01", why);
	(void)!write(fd, pb.buf, pb.len);
	pktbuf_free(&pb);
	close(fd);
}

/* A unit's budget entry from a message: an index of the table, or -1 (none, or not one of its indexes). */
static int unit_entry(int32_t e)
{
	return e >= 0 && e < SHM_BUDGET_ENTRIES ? e : -1;
}

/* The units the giver moved here for a client, whether or not its state decodes (same tree only). */
static bool moved_units(const uint8_t *data, size_t len, bool same_tree, int moved[2])
{
	HandoverUnits units;
	if (!same_tree || !handover_peek_units(data, len, &units))
		return false;
	moved[0] = unit_entry(units.entry[0]);
	moved[1] = unit_entry(units.entry[1]);
	return true;
}

/*
 * Take the login's secret if we lack one, or if auth_query or PAM gave us
 * an older one than the client brings.
 */
static void adopt_secret(PgUser *u, const HandoverSecret *s)
{
	/*
	 * A secret we lack is taken with its origin, even for a user we know
	 * without one (a [users] entry): one from auth_query is looked up again
	 * at the next login here too, never kept as if from the auth_file, and
	 * the password PAM accepted stays for server logins only. One that
	 * auth_query or PAM gave here too is replaced by a newer one: ours,
	 * found before the password changed, would fail the server logins the
	 * client needs (doc/workers.md "Rebalancing long-lived clients").
	 */
	bool newer = u->secret && strcmp(u->secret, s->text) != 0 &&
	             ((s->from_auth_query && u->from_auth_query) || (s->from_pam && u->from_pam)) &&
	             (usec_t)s->time > u->secret_time;
	if (!u->secret || newer) {
		user_set_secret(u, s->text, (SecretKind)s->kind);
		u->from_auth_query = s->from_auth_query;
		u->from_pam = s->from_pam;
		u->secret_time = (usec_t)s->time;
	}
	/* keys made with another secret than ours would log in with a password the server may no longer take */
	if (!u->has_scram_keys && s->has_scram_keys && u->secret && strcmp(u->secret, s->text) == 0) {
		memcpy(u->scram_client_key, s->scram_client_key, SCRAM_KEY_LEN);
		memcpy(u->scram_server_key, s->scram_server_key, SCRAM_KEY_LEN);
		u->has_scram_keys = true;
	}
}

/* The client's own state from the decoded message: address, times, key, parameters, prepared statements. */
static void adopt_state(PgSocket *c, const HandoverClient *hc)
{
	c->is_unix = hc->is_unix;
	socket_set_remote(c, (const struct sockaddr *)&hc->remote, sizeof(hc->remote));
	c->peer_pid = (int)hc->peer_pid;
	c->peer_uid = (uid_t)hc->peer_uid;
	c->connect_time = (usec_t)hc->connect_time;
	c->request_time = (usec_t)hc->request_time;
	c->auth_method = (uint8_t)hc->auth_method;
	memcpy(c->cancel_key, hc->cancel_key, CANCEL_KEY_LEN);
	c->cancel_key_len = CANCEL_KEY_LEN;
	c->app_name_raw = hc->app_name && *hc->app_name ? xstrdup(hc->app_name) : NULL;
	for (uint32_t k = 0; k < hc->nvars; k++) {
		int idx = var_index(hc->vars[k].name);
		if (idx >= 0)
			sock_var_set(c, idx, hc->vars[k].value);
	}
	for (uint32_t k = 0; k < hc->nstmts; k++) {
		const HandoverStmt *hs = &hc->stmts[k];
		if (prepare_client_find(&c->stmts, hs->name))
			continue;
		size_t envlen;
		const uint8_t *env = txn_client_env(c, &envlen); /* the moved client's settings, set above */
		PreparedStmt *ps = prepare_stmt_get_described(hs->body, hs->body_len, env, envlen, hs->desc);
		prepare_client_add(&c->stmts, hs->name, ps);
		prepare_stmt_unref(ps); /* the mapping holds its own reference */
	}
}

/* The server units the giver moved here with a session-mode client (same tree only). */
static bool moved_server_units(const uint8_t *data, size_t len, bool same_tree, int moved[3])
{
	HandoverServerUnits units;
	if (!same_tree || !handover_peek_server_units(data, len, &units))
		return false;
	for (int k = 0; k < 3; k++)
		moved[k] = unit_entry(units.entry[k]);
	return true;
}

/*
 * The server connection an idle session-mode client brought, linked to it
 * as before (doc/workers.md, "Session-mode clients move too"): its backend,
 * key, applied parameters, age and counters are the giver's.
 */
static void adopt_server(PgSocket *c, const HandoverServer *hs, int fd, const int *moved)
{
	PgSocket *s = socket_new_with_id(true, hs->id); /* it keeps its id: SHOW SERVERS */
	PgPool *pool = c->pool;
	s->pool = pool;
	s->login_user = pool->user;
	s->db = pool->db;
	socket_set_remote(s, (const struct sockaddr *)&hs->remote, sizeof(hs->remote));
	s->is_unix = hs->remote.ss_family == AF_UNIX;
	s->connect_time = (usec_t)hs->connect_time;
	s->request_time = (usec_t)hs->request_time;
	s->backend_pid = hs->backend_pid;
	if (hs->key_len > 0) {
		s->server_key = xmalloc(hs->key_len);
		memcpy(s->server_key, hs->key, hs->key_len);
		s->server_key_len = hs->key_len;
	}
	for (uint32_t k = 0; k < hs->nvars; k++) {
		int idx = var_index(hs->vars[k].name);
		if (idx >= 0)
			sock_var_set(s, idx, hs->vars[k].value);
	}
	/*
	 * Connected by an entry this worker's does not match (an online restart
	 * with [databases] changed; a RELOAD meanwhile): it goes on serving its
	 * session, then closes when released, as db_load() has a reload's close.
	 */
	if (hs->close_needed || hs->db_definition != db_definition_hash(&pool->db->cf)) {
		s->close_needed = true;
		if (wk.cf.g.verbose > 0)
			slog(LG_DEBUG, s, "moved here from another definition of %s: closes when released",
			     pool->db->name);
	}
	s->txn_status = 'I';
	s->ready = true;
	s->lent = true;
	s->link_mode = POOL_SESSION;
	session_tail_reset(&s->session);
	s->session.tail = hs->session_tail & 7; /* a SessionTailKind; nothing owed: it was idle */
	pool_adopt_server_budget(s, moved);     /* no limit: the connection exists and was counted */
	pool->db->server_count++;
	pool->user->server_count++;
	s->link = c;
	c->link = s;
	change_state(s, SV_ACTIVE);
	sbuf_set_nonblocking(fd);
	sbuf_attach(&s->sb, wk.base, fd, (uint32_t)wk.cf.g.pkt_buf, wk.cf.g.max_packet_size, server_cb, s);
	sbuf_use_ring(&s->sb);
	s->sb.bytes_in = hs->bytes_in;
	s->sb.bytes_out = hs->bytes_out;
	c->sb.dst = &s->sb;
	s->sb.dst = &c->sb;
	if (wk.cf.g.verbose > 0)
		slog(LG_DEBUG, s, "moved here with its client (backend pid %u)", s->backend_pid);
}

PgSocket *migrate_adopt(const uint8_t *data, size_t len, int fd, int server_fd, bool same_tree, char *err,
                        size_t errlen)
{
	/* first: units moved here for the client (and its server) must be given back should it not be taken */
	int moved[2], smoved[3];
	bool units = moved_units(data, len, same_tree, moved);
	bool sunits = moved_server_units(data, len, same_tree, smoved);
	HandoverClient hc;
	PgSocket *c = NULL;
	if (!handover_decode(data, len, &hc, err, errlen))
		goto fail;
	if (hc.has_server != (server_fd >= 0)) {
		snprintf(err, errlen,
		         hc.has_server ? "its server connection did not come"
		                       : "a server connection it "
		                         "did not announce came");
		goto fail;
	}
	PgDatabase *db = db_find(hc.database);
	if (!db)
		db = db_register_auto(hc.database);
	if (!db || db->admin || db->placeholder) {
		snprintf(err, errlen, "no such database here: %s", hc.database);
		goto fail;
	}
	c = socket_new_with_id(false, hc.id); /* it keeps its id: SHOW CLIENTS, KILL_CLIENT */
	adopt_state(c, &hc);
	/* a secret auth_query found is its database's (objects.h, PgUser.scope) */
	PgUser *u =
	    hc.has_secret && hc.secret.from_auth_query ? user_add_scoped(hc.database, hc.user) : user_add(hc.user);
	if (hc.has_secret)
		adopt_secret(u, &hc.secret);

	/* counted as a login would count it; limits were checked where it logged in */
	c->db = db;
	c->login_user = u;
	c->pool = pool_get(db, db->forced_user ? db->forced_user : u);
	if (hc.has_server && strcmp(hc.server.pool_user, c->pool->user->name) != 0) {
		/* its session is logged in as another user than this worker's pool would use (a changed forced user) */
		snprintf(err, errlen, "its server is logged in as %s, this pool's user is %s", hc.server.pool_user,
		         c->pool->user->name);
		goto fail;
	}
	if (units)
		wk.client_count++; /* in the pooler's count already: the giver moved it to us */
	else
		worker_clients_add(1);
	pool_adopt_client_budget(c, units ? moved : NULL); /* no limit: never refused, always counted */
	db->client_count++;
	u->client_count++;
	c->adopted = true;
	change_state(c, CL_ACTIVE);
	sbuf_set_nonblocking(fd); /* passed over a unix socket: from whatever made it */
	sbuf_accept(&c->sb, wk.base, fd, (uint32_t)wk.cf.g.pkt_buf, wk.cf.g.max_packet_size, client_cb, c);
	c->sb.startup = false;
	sbuf_use_ring(&c->sb); /* a logged-in pooled client (TLS and replication ones do not move) */
	c->sb.bytes_in = hc.bytes_in;
	c->sb.bytes_out = hc.bytes_out;
	if (hc.request_len > 0) {
		/* taken up from the event loop, as if just read: it asks this worker's pool for a server */
		c->wait_start = (usec_t)hc.wait_start;
		c->wait_notice_sent = hc.wait_notice_sent; /* sent once per wait */
		sbuf_preload(&c->sb, hc.request, hc.request_len);
	}
	if (hc.has_server)
		adopt_server(c, &hc.server, server_fd, sunits ? smoved : NULL);
	handover_free(&hc);
	return c;
fail:
	handover_free(&hc);
	if (units)
		pool_drop_moved_client_budget(moved);
	if (sunits)
		pool_drop_moved_server_budget(smoved);
	if (c) {
		pgb_assert(c->state == CL_FREE);
		change_state(c, CL_JUSTFREE); /* freed by the janitor with what it holds */
	}
	if (server_fd >= 0)
		close(server_fd); /* the backend sees its connection close and ends the session */
	refuse(fd, "could not move the connection to another worker");
	return NULL;
}

/* ---- the receiving end of one batch ---- */

typedef struct Intake {
	List node; /* in intakes */
	int sock;
	int from;
	bool old_tree; /* from a retiring tree (-R): open until that worker exits */
	bool stopping; /* shut down for reading: what is queued is still taken */
	int adopted;
	int failed;
	struct event *ev;
} Intake;

static List intakes = {&intakes, &intakes};

static uint8_t intake_buf[MIGRATE_MAX_STATE + 1];

static void intake_done(Intake *in)
{
	list_del(&in->node);
	event_free(in->ev);
	close(in->sock);
	if (in->failed)
		log_warning("took %d clients from worker %d; %d could not be taken", in->adopted, in->from, in->failed);
	else
		log_debug("took %d clients from worker %d", in->adopted, in->from);
	free(in);
	wk.intakes--;
	worker_publish();
	worker_check_shutdown(); /* a draining worker waited for this batch; the master moves it on */
}

static void on_intake(evutil_socket_t fd, short what, void *arg)
{
	Intake *in = arg;
	worker_clock_tick();
	for (;;) {
		size_t len = 0;
		int fds[2], nfds;
		int r = migrate_recv(in->sock, intake_buf, sizeof(intake_buf), &len, fds, &nfds);
		int cfd = fds[0];
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (r <= 0) {
			intake_done(in);
			return;
		}
		if (cfd < 0) {
			/*
			 * The state came without its socket: the kernel closed the
			 * connection, having no descriptor for it here (the process's
			 * limit). The units the giver moved here for it go back, or
			 * max_client_conn would count it for as long as we run.
			 */
			int moved[2], smoved[3];
			if (len > 0 && len <= MIGRATE_MAX_STATE && moved_units(intake_buf, len, !in->old_tree, moved))
				pool_drop_moved_client_budget(moved);
			if (len > 0 && len <= MIGRATE_MAX_STATE &&
			    moved_server_units(intake_buf, len, !in->old_tree, smoved))
				pool_drop_moved_server_budget(smoved);
			if (fds[1] >= 0)
				close(fds[1]);
			in->failed++;
			log_warning("could not take a client from worker %d: its socket did not come (out of file "
			            "descriptors?)",
			            in->from);
			continue;
		}
		char err[128];
		PgSocket *c = NULL;
		if (len > 0 && len <= MIGRATE_MAX_STATE) {
			c = migrate_adopt(intake_buf, len, cfd, fds[1], !in->old_tree, err, sizeof(err));
		} else {
			if (fds[1] >= 0)
				close(fds[1]);
			refuse(cfd, "could not move the connection");
		}
		if (!c) {
			in->failed++;
			log_warning("could not take a client from worker %d: %s", in->from,
			            len > 0 && len <= MIGRATE_MAX_STATE ? err : "state too large");
			continue;
		}
		in->adopted++;
		wk.moved_in++;
		if (wk.master_out) {
			/*
			 * Cancel requests carry the giver's number in the key: the
			 * master will route them here. A batch tells it hundreds at
			 * once: the channel queues what its socket has no room for.
			 */
			ChannelMsg m = {.type = CH_MOVED, .id = (uint32_t)wk.id};
			memcpy(&m.arg, c->cancel_key, CANCEL_KEY_LEN);
			(void)worker_tell_master(&m, -1); /* a failure is logged by the channel */
		}
		if (wk.cf.g.verbose > 0)
			slog(LG_DEBUG, c, "moved here from worker %d", in->from);
	}
}

void migrate_take(int sock, int from, bool old_tree)
{
	Intake *in = xcalloc(1, sizeof(*in));
	list_init(&in->node);
	list_append(&intakes, &in->node);
	in->sock = sock;
	in->from = from;
	in->old_tree = old_tree;
	wk.intakes++;
	fcntl(sock, F_SETFL, fcntl(sock, F_GETFL) | O_NONBLOCK);
	in->ev = event_new(wk.base, sock, EV_READ | EV_PERSIST, on_intake, in);
	event_add(in->ev, NULL);
}

void migrate_stop_old_tree_intakes(void)
{
	List *i;
	list_for_each(i, &intakes)
	{
		Intake *in = container_of(i, Intake, node);
		if (!in->old_tree || in->stopping)
			continue;
		/*
		 * The giver's next send fails (EPIPE) and its clients finish there;
		 * what it sent before is still queued here and taken before EOF.
		 */
		in->stopping = true;
		if (shutdown(in->sock, SHUT_RD) < 0)
			log_debug("shutdown() of a hand-over socket: %s", strerror(errno));
	}
}

void migrate_client_closed(PgSocket *c)
{
	if (!c->adopted || !wk.master_out || c->cancel_key_len != CANCEL_KEY_LEN)
		return;
	ChannelMsg m = {.type = CH_MOVED_GONE, .id = (uint32_t)wk.id};
	memcpy(&m.arg, c->cancel_key, CANCEL_KEY_LEN);
	(void)worker_tell_master(&m, -1); /* a failure is logged by the channel */
}
