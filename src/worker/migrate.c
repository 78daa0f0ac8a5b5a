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
#include "worker/migrate.h"
#include "worker/pool.h"
#include "worker/prepare.h"
#include "worker/txn.h"
#include "worker/worker.h"

#define MIGRATE_MAGIC    0x5047424du /* "PGBM" */
#define MIGRATE_VERSION  CLIENT_STATE_VERSION
#define MIGRATE_TAIL     0x50474254u /* "PGBT": ends a state that has the tail below */
#define MIGRATE_TAIL_LEN 13          /* flags, two entries, magic */

/* the tail's flags */
#define TAIL_UNITS_MOVED 0x01 /* the giver moved the client's units to the receiver (same tree only) */
#define TAIL_NOTICE_SENT 0x02 /* the waiting client got its query_wait_notify NOTICE already */

bool migrate_counts(const PgSocket *c)
{
	return !c->is_server && !c->is_private && !c->is_internal && c->db && !c->db->admin && c->pool && c->login_user;
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
	if (c->link)
		return "linked to a server";
	if (c->copy_mode || c->query_start || c->xact_start)
		return "in a query or transaction";
	if (c->auth_query)
		return "auth_query lookup running";
	if (sb->fd < 0 || sb->pkt_remain || sb->send_pos != sb->send_end || sb->out_pos < sb->out.len || sb->writing ||
	    sb->connecting || sb->waiting_src || sb->in_process || sb->resume_pending || sbuf_unsent(sb))
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

static void put_u64(PktBuf *pb, uint64_t v)
{
	pktbuf_put_u32(pb, (uint32_t)(v >> 32));
	pktbuf_put_u32(pb, (uint32_t)v);
}

static bool get_u64(PktReader *r, uint64_t *v)
{
	uint32_t hi, lo;
	if (!pktreader_get_u32(r, &hi) || !pktreader_get_u32(r, &lo))
		return false;
	*v = (uint64_t)hi << 32 | lo;
	return true;
}

static void put_blob(PktBuf *pb, const void *p, size_t len)
{
	pktbuf_put_u32(pb, (uint32_t)len);
	pktbuf_put_bytes(pb, p, len);
}

static bool get_blob(PktReader *r, const uint8_t **p, uint32_t *len)
{
	return pktreader_get_u32(r, len) && pktreader_get_bytes(r, *len, p);
}

bool migrate_pack(const PgSocket *c, const int *moved, PktBuf *pb)
{
	const PgUser *u = c->login_user;
	pktbuf_put_u32(pb, MIGRATE_MAGIC);
	pktbuf_put_u32(pb, MIGRATE_VERSION);
	put_u64(pb, c->id);
	pktbuf_put_string(pb, c->db->name);
	pktbuf_put_string(pb, u->name);
	pktbuf_put_u8(pb, c->is_unix);
	/* the format keeps a whole sockaddr_storage (an older or newer tree may read it) */
	struct sockaddr_storage remote;
	socket_remote(c, &remote);
	put_blob(pb, &remote, sizeof(remote));
	/* our address: the receiver asks the socket itself, but the format keeps the field */
	struct sockaddr_storage local;
	socket_local_addr(c, &local);
	put_blob(pb, &local, sizeof(local));
	pktbuf_put_u32(pb, (uint32_t)c->peer_pid);
	pktbuf_put_u32(pb, (uint32_t)c->peer_uid);
	put_u64(pb, (uint64_t)c->connect_time);
	put_u64(pb, (uint64_t)c->request_time);
	pktbuf_put_u32(pb, (uint32_t)c->auth_method);
	put_blob(pb, c->cancel_key, c->cancel_key_len);
	pktbuf_put_string(pb, c->app_name_raw ? c->app_name_raw : "");
	put_u64(pb, c->sb.bytes_in);
	put_u64(pb, c->sb.bytes_out);

	/* tracked parameters by name: the receiver's table may list them in another order */
	uint32_t nvars = 0;
	for (int i = 0; i < var_count(); i++)
		if (sock_var(c, i))
			nvars++;
	pktbuf_put_u32(pb, nvars);
	for (int i = 0; i < var_count(); i++)
		if (sock_var(c, i)) {
			pktbuf_put_string(pb, var_name(i));
			pktbuf_put_string(pb, sock_var(c, i));
		}

	/*
	 * prepared statements: the client's name, the Parse body and the result
	 * type the client was given (two halves of its hash, 0 = unknown); the
	 * receiver prepares them lazily
	 */
	pktbuf_put_u32(pb, prepare_client_count(&c->stmts));
	for (const ClientStmt *cs = prepare_client_first(&c->stmts); cs; cs = prepare_client_next(cs)) {
		size_t keylen;
		const PreparedStmt *ps = prepare_client_stmt(cs);
		const uint8_t *key = prepare_stmt_key(ps, &keylen);
		uint64_t desc = prepare_stmt_desc(ps);
		pktbuf_put_string(pb, prepare_client_name(cs));
		put_blob(pb, key, keylen);
		pktbuf_put_u32(pb, (uint32_t)(desc >> 32));
		pktbuf_put_u32(pb, (uint32_t)desc);
	}

	/* the login's secret, for a receiver that never saw this user (auth_query, SCRAM pass-through) */
	pktbuf_put_u8(pb, u->secret != NULL);
	pktbuf_put_u32(pb, (uint32_t)u->kind);
	pktbuf_put_string(pb, u->secret ? u->secret : "");
	pktbuf_put_u8(pb, u->from_auth_query);
	pktbuf_put_u8(pb, u->from_pam);
	pktbuf_put_u8(pb, u->has_scram_keys);
	pktbuf_put_bytes(pb, u->scram_client_key, SCRAM_KEY_LEN);
	pktbuf_put_bytes(pb, u->scram_server_key, SCRAM_KEY_LEN);

	/*
	 * Last, so that a receiver that reads no further (none yet: -R hands
	 * over to the newer binary) still takes the rest: a waiting client's
	 * buffered request and since when it waits.
	 */
	uint32_t pending = c->state == CL_WAITING ? c->sb.end - c->sb.pos : 0;
	put_blob(pb, pending ? c->sb.buf + c->sb.pos : NULL, pending);
	put_u64(pb, pending ? (uint64_t)c->wait_start : 0);
	/* when auth_query or PAM gave the secret: a receiver keeps the newer of its own and this one */
	put_u64(pb, (u->from_auth_query || u->from_pam) ? (uint64_t)u->secret_time : 0);

	/*
	 * A tail of fixed size, read from the end, so that a receiver that
	 * cannot take the client still finds the units it must give back.
	 * Older receivers stop reading before it.
	 */
	uint8_t flags = (moved ? TAIL_UNITS_MOVED : 0) | (pending && c->wait_notice_sent ? TAIL_NOTICE_SENT : 0);
	pktbuf_put_u8(pb, flags);
	pktbuf_put_u32(pb, (uint32_t)(moved ? moved[0] : -1));
	pktbuf_put_u32(pb, (uint32_t)(moved ? moved[1] : -1));
	pktbuf_put_u32(pb, MIGRATE_TAIL);
	return pb->len <= MIGRATE_MAX_STATE;
}

/* ---- the socket pair ---- */

bool migrate_send(int sock, const PktBuf *state, int fd)
{
	struct iovec iov = {.iov_base = state->buf, .iov_len = state->len};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (fd >= 0) {
		memset(&u, 0, sizeof(u));
		mh.msg_control = u.buf;
		mh.msg_controllen = sizeof(u.buf);
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	}
	ssize_t n;
	do
		n = sendmsg(sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	/* a SOCK_SEQPACKET message goes whole or not at all */
	return n == (ssize_t)state->len;
}

int migrate_recv(int sock, uint8_t *buf, size_t cap, size_t *len, int *fd)
{
	struct iovec iov = {.iov_base = buf, .iov_len = cap};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
	*fd = -1;
	ssize_t n;
	do
		n = recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -1;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
		    cm->cmsg_len >= CMSG_LEN(sizeof(int)))
			memcpy(fd, CMSG_DATA(cm), sizeof(int));
	if (n == 0 && *fd < 0)
		return 0;
	*len = (mh.msg_flags & MSG_TRUNC) ? 0 : (size_t)n; /* a truncated state cannot be used */
	return 1;
}

/* ---- giving ---- */

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
				pktbuf_reset(&pb);
				/* its units go first: the totals never dip while it is on its way */
				int units_to[2];
				bool units = pool_move_client_budget(c, to, units_to);
				if (!migrate_pack(c, units ? units_to : NULL, &pb)) {
					if (units)
						pool_unmove_client_budget(c, to, units_to);
					(*failed)++;
					*why = "state too large";
					continue;
				}
				if (!migrate_send(sock, &pb, c->sb.fd)) {
					/* nothing went: the client stays here, untouched */
					int e = errno;
					if (units)
						pool_unmove_client_budget(c, to, units_to);
					errno = e;
					(*failed)++;
					*why = strerror(errno);
					full = errno == EAGAIN || errno == EWOULDBLOCK || errno == EPIPE ||
					       errno == ECONNRESET;
					*gone = errno == EPIPE || errno == ECONNRESET;
					continue;
				}
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

/* The state's tail, if it has one: its flags and units; returns the length of the state before it. */
static size_t read_tail(const uint8_t *data, size_t len, uint8_t *flags, int moved[2])
{
	*flags = 0;
	moved[0] = moved[1] = -1;
	if (len < MIGRATE_TAIL_LEN)
		return len;
	PktReader t;
	uint32_t magic = 0, idx0, idx1;
	pktreader_init(&t, data + len - MIGRATE_TAIL_LEN, MIGRATE_TAIL_LEN);
	if (!pktreader_get_u8(&t, flags) || !pktreader_get_u32(&t, &idx0) || !pktreader_get_u32(&t, &idx1) ||
	    !pktreader_get_u32(&t, &magic) || magic != MIGRATE_TAIL) {
		*flags = 0;
		return len;
	}
	moved[0] = (int32_t)idx0;
	moved[1] = (int32_t)idx1;
	return len - MIGRATE_TAIL_LEN;
}

PgSocket *migrate_adopt(const uint8_t *data, size_t len, int fd, bool same_tree, char *err, size_t errlen)
{
	PktReader r;
	/* the tail first: units moved here for the client must be given back should it not be taken */
	uint8_t flags;
	int moved[2];
	len = read_tail(data, len, &flags, moved);
	bool units = same_tree && (flags & TAIL_UNITS_MOVED);
	pktreader_init(&r, data, len);
	uint32_t magic = 0, version = 0, nvars, nstmts, key_len, remote_len, local_len;
	uint64_t id, connect_time, request_time, bytes_in, bytes_out;
	const char *dbname, *uname, *app;
	const uint8_t *key, *remote, *local;
	uint8_t is_unix;
	PgSocket *c = NULL;
	if (!pktreader_get_u32(&r, &magic) || magic != MIGRATE_MAGIC || !pktreader_get_u32(&r, &version) ||
	    version != MIGRATE_VERSION) {
		snprintf(err, errlen, "unknown state format");
		goto fail;
	}
	if (!get_u64(&r, &id) || !pktreader_get_string(&r, &dbname) || !pktreader_get_string(&r, &uname) ||
	    !pktreader_get_u8(&r, &is_unix) || !get_blob(&r, &remote, &remote_len) ||
	    !get_blob(&r, &local, &local_len) || remote_len != sizeof(struct sockaddr_storage) ||
	    local_len != sizeof(struct sockaddr_storage)) {
		snprintf(err, errlen, "malformed state");
		goto fail;
	}
	if (strlen(dbname) >= CF_MAX_DBNAME || strlen(uname) > USERLIST_MAX_USER || !*uname) {
		snprintf(err, errlen, "malformed names");
		goto fail;
	}
	PgDatabase *db = db_find(dbname);
	if (!db)
		db = db_register_auto(dbname);
	if (!db || db->admin || db->placeholder) {
		snprintf(err, errlen, "no such database here: %s", dbname);
		goto fail;
	}

	c = socket_new_with_id(false, id); /* it keeps its id: SHOW CLIENTS, KILL_CLIENT */
	c->is_unix = is_unix != 0;
	struct sockaddr_storage peer; /* aligned: the blob is anywhere in the packet */
	memcpy(&peer, remote, sizeof(peer));
	socket_set_remote(c, (const struct sockaddr *)&peer, sizeof(peer));
	uint32_t pid, uid, auth_method;
	if (!pktreader_get_u32(&r, &pid) || !pktreader_get_u32(&r, &uid) || !get_u64(&r, &connect_time) ||
	    !get_u64(&r, &request_time) || !pktreader_get_u32(&r, &auth_method) || !get_blob(&r, &key, &key_len) ||
	    key_len != CANCEL_KEY_LEN || !pktreader_get_string(&r, &app) || !get_u64(&r, &bytes_in) ||
	    !get_u64(&r, &bytes_out) || !pktreader_get_u32(&r, &nvars) || auth_method > AUTH_REJECT) {
		snprintf(err, errlen, "malformed state");
		goto fail;
	}
	c->peer_pid = (int)pid;
	c->peer_uid = (uid_t)uid;
	c->connect_time = (usec_t)connect_time;
	c->request_time = (usec_t)request_time;
	c->auth_method = (uint8_t)auth_method;
	memcpy(c->cancel_key, key, CANCEL_KEY_LEN);
	c->cancel_key_len = CANCEL_KEY_LEN;
	c->app_name_raw = *app ? xstrdup(app) : NULL;
	for (uint32_t k = 0; k < nvars; k++) {
		const char *name, *value;
		if (!pktreader_get_string(&r, &name) || !pktreader_get_string(&r, &value)) {
			snprintf(err, errlen, "malformed parameters");
			goto fail;
		}
		int idx = var_index(name);
		if (idx >= 0)
			sock_var_set(c, idx, value);
	}
	if (!pktreader_get_u32(&r, &nstmts)) {
		snprintf(err, errlen, "malformed state");
		goto fail;
	}
	for (uint32_t k = 0; k < nstmts; k++) {
		const char *name;
		const uint8_t *body;
		uint32_t body_len, desc_hi, desc_lo;
		if (!pktreader_get_string(&r, &name) || !get_blob(&r, &body, &body_len) ||
		    !pktreader_get_u32(&r, &desc_hi) || !pktreader_get_u32(&r, &desc_lo)) {
			snprintf(err, errlen, "malformed prepared statements");
			goto fail;
		}
		if (prepare_client_find(&c->stmts, name))
			continue;
		size_t envlen;
		const uint8_t *env = txn_client_env(c, &envlen); /* the moved client's settings, set above */
		PreparedStmt *ps =
		    prepare_stmt_get_described(body, body_len, env, envlen, (uint64_t)desc_hi << 32 | desc_lo);
		prepare_client_add(&c->stmts, name, ps);
		prepare_stmt_unref(ps); /* the mapping holds its own reference */
	}
	uint8_t has_secret, from_aq, from_pam, has_keys;
	uint32_t kind;
	const char *secret;
	const uint8_t *ck, *sk;
	if (!pktreader_get_u8(&r, &has_secret) || !pktreader_get_u32(&r, &kind) || !pktreader_get_string(&r, &secret) ||
	    !pktreader_get_u8(&r, &from_aq) || !pktreader_get_u8(&r, &from_pam) || !pktreader_get_u8(&r, &has_keys) ||
	    !pktreader_get_bytes(&r, SCRAM_KEY_LEN, &ck) || !pktreader_get_bytes(&r, SCRAM_KEY_LEN, &sk)) {
		snprintf(err, errlen, "malformed user");
		goto fail;
	}
	/* a waiting client's request (absent from a giver that moved no waiting clients) */
	const uint8_t *pending = NULL;
	uint32_t pending_len = 0;
	uint64_t wait_start = 0;
	if (pktreader_remaining(&r) > 0 &&
	    (!get_blob(&r, &pending, &pending_len) || !get_u64(&r, &wait_start) || pending_len > MIGRATE_MAX_REQUEST)) {
		snprintf(err, errlen, "malformed waiting request");
		goto fail;
	}
	uint64_t secret_time = 0; /* absent from a giver that did not send it */
	if (pktreader_remaining(&r) > 0 && !get_u64(&r, &secret_time)) {
		snprintf(err, errlen, "malformed secret time");
		goto fail;
	}
	PgUser *u = user_add(uname);
	/*
	 * A secret we lack is taken with its origin, even for a user we know
	 * without one (a [users] entry): one from auth_query is looked up again
	 * at the next login here too, never kept as if from the auth_file, and
	 * the password PAM accepted stays for server logins only. One that
	 * auth_query or PAM gave here too is replaced by a newer one: ours,
	 * found before the password changed, would fail the server logins the
	 * client needs (doc/workers.md "Rebalancing long-lived clients").
	 */
	bool newer = has_secret && u->secret && strcmp(u->secret, secret) != 0 &&
	             ((from_aq && u->from_auth_query) || (from_pam && u->from_pam)) &&
	             (usec_t)secret_time > u->secret_time;
	if ((!u->secret && has_secret) || newer) {
		user_set_secret(u, secret, (SecretKind)kind);
		u->from_auth_query = from_aq != 0;
		u->from_pam = from_pam != 0;
		u->secret_time = (usec_t)secret_time;
	}
	/* keys made with another secret than ours would log in with a password the server may no longer take */
	if (!u->has_scram_keys && has_keys && has_secret && u->secret && strcmp(u->secret, secret) == 0) {
		memcpy(u->scram_client_key, ck, SCRAM_KEY_LEN);
		memcpy(u->scram_server_key, sk, SCRAM_KEY_LEN);
		u->has_scram_keys = true;
	}

	/* counted as a login would count it; limits were checked where it logged in */
	c->db = db;
	c->login_user = u;
	c->pool = pool_get(db, db->forced_user ? db->forced_user : u);
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
	c->sb.bytes_in = bytes_in;
	c->sb.bytes_out = bytes_out;
	if (pending_len > 0) {
		/* taken up from the event loop, as if just read: it asks this worker's pool for a server */
		c->wait_start = (usec_t)wait_start;
		c->wait_notice_sent = (flags & TAIL_NOTICE_SENT) != 0; /* sent once per wait */
		sbuf_preload(&c->sb, pending, pending_len);
	}
	return c;
fail:
	if (units)
		pool_drop_moved_client_budget(moved);
	if (c) {
		pgb_assert(c->state == CL_FREE);
		change_state(c, CL_JUSTFREE); /* freed by the janitor with what it holds */
	}
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
		int cfd;
		int r = migrate_recv(in->sock, intake_buf, sizeof(intake_buf), &len, &cfd);
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
			uint8_t flags;
			int moved[2];
			if (len > 0 && len <= MIGRATE_MAX_STATE) {
				(void)read_tail(intake_buf, len, &flags, moved);
				if (!in->old_tree && (flags & TAIL_UNITS_MOVED))
					pool_drop_moved_client_budget(moved);
			}
			in->failed++;
			log_warning("could not take a client from worker %d: its socket did not come (out of file "
			            "descriptors?)",
			            in->from);
			continue;
		}
		char err[128];
		PgSocket *c = len > 0 && len <= MIGRATE_MAX_STATE
		                  ? migrate_adopt(intake_buf, len, cfd, !in->old_tree, err, sizeof(err))
		                  : (refuse(cfd, "could not move the connection"), NULL);
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

void migrate_client_closed(const PgSocket *c)
{
	if (!c->adopted || !wk.master_out || c->cancel_key_len != CANCEL_KEY_LEN)
		return;
	ChannelMsg m = {.type = CH_MOVED_GONE, .id = (uint32_t)wk.id};
	memcpy(&m.arg, c->cancel_key, CANCEL_KEY_LEN);
	(void)worker_tell_master(&m, -1); /* a failure is logged by the channel */
}
