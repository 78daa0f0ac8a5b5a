/*
 * Online restart (-R): the control socket of a running master and the
 * new master's side of the hand-over. The protocol is the CH_UP_* messages
 * of include/common/channel.h on a SOCK_SEQPACKET unix socket in the
 * private directory (mode 0700); both sides check that the peer runs as
 * the same user. The user's view is doc/workers.md "Upgrading".
 */
#include "autoconfig.h"

#include "master/upgrade.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/channel.h"
#include "common/log.h"
#include "common/scram.h"
#include "common/util.h"

#define UPGRADE_PROTOCOL  1
#define UPGRADE_TIMEOUT_S 30 /* one step of the hand-over */

static bool control_path(const char *private_dir, struct sockaddr_un *sa)
{
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	int n = snprintf(sa->sun_path, sizeof(sa->sun_path), "%s/master", private_dir);
	return private_dir[0] && n > 0 && (size_t)n < sizeof(sa->sun_path);
}

static bool peer_uid(int fd, uid_t *uid, pid_t *pid)
{
	struct ucred cr;
	socklen_t len = sizeof(cr);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
		return false;
	*uid = cr.uid;
	*pid = cr.pid;
	return true;
}

static void set_timeouts(int fd)
{
	struct timeval tv = {UPGRADE_TIMEOUT_S, 0};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* ---- the new master ---- */

/*
 * The control connections to the masters before us, kept while their trees
 * run: cancel requests for their clients go there (doc/workers.md
 * "Upgrading"). The first is the master we took over from; the others it
 * handed us at its own retirement (CH_UP_PRED), so that a tree older than
 * it stays reachable after it has exited. EOF on one: that master exited.
 */
#define UPGRADE_MAX_PRED 8

static struct {
	int fd;
	struct event *ev;
	ChannelOut *out; /* cancel requests to it, queued while its socket is full */
	pid_t pid;
} pred[UPGRADE_MAX_PRED];
static int n_pred;
static void (*pred_gone_fn)(pid_t pid);

void upgrade_on_pred_gone(void (*fn)(pid_t pid))
{
	pred_gone_fn = fn;
}

static void on_pred(evutil_socket_t fd, short what, void *arg);
static bool orphans_forward_cancel(const ChannelMsg *c, int fd);
static void orphans_watch(struct event_base *base);

static void pred_close(int i)
{
	channel_out_free(pred[i].out);
	event_free(pred[i].ev);
	close(pred[i].fd);
	pred[i] = pred[--n_pred];
}

static void pred_add(struct event_base *base, int fd, pid_t pid)
{
	if (n_pred == UPGRADE_MAX_PRED) {
		log_warning("online restart: more than %d older processes still run; cancel requests for the "
		            "clients of pid %d will not reach them",
		            UPGRADE_MAX_PRED, (int)pid);
		close(fd);
		return;
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	pred[n_pred].fd = fd;
	pred[n_pred].pid = pid;
	pred[n_pred].ev = event_new(base, fd, EV_READ | EV_PERSIST, on_pred, NULL);
	event_add(pred[n_pred].ev, NULL);
	char peer[32];
	snprintf(peer, sizeof(peer), "the old process (pid %d)", (int)pid);
	pred[n_pred].out = channel_out_new(base, fd, peer);
	n_pred++;
}

static void on_pred(evutil_socket_t fd, short what, void *arg)
{
	int i = 0;
	while (i < n_pred && pred[i].fd != fd)
		i++;
	if (i == n_pred)
		return;
	ChannelMsg m;
	int rfd;
	int r = channel_recv(fd, &m, &rfd);
	if (r == 1 && m.type == CH_UP_PRED && rfd >= 0) {
		log_debug("online restart: pid %d passed on its connection to pid %lld", (int)pred[i].pid,
		          (long long)m.arg);
		pred_add(event_get_base(pred[i].ev), rfd, (pid_t)m.arg);
		return;
	}
	if (rfd >= 0)
		close(rfd);
	if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
		log_debug("online restart: the control connection to pid %d is closed", (int)pred[i].pid);
		pid_t pid = pred[i].pid;
		pred_close(i);
		if (pred_gone_fn)
			pred_gone_fn(pid); /* if it died before its workers left, they are orphans to adopt */
	}
}

static void orphans_goodbye(void);

void upgrade_goodbye(void)
{
	orphans_goodbye();
	ChannelMsg m = {.type = CH_UP_BYE};
	for (int i = 0; i < n_pred; i++)
		if (!channel_send(pred[i].fd, &m, -1)) /* a master past its grace period ignores it */
			log_debug("online restart: could not say goodbye to pid %d: %s", (int)pred[i].pid,
			          strerror(errno));
}

/* Each older tree gets its own copy of the requester's socket; only the one with the key answers. */
bool upgrade_forward_cancel(const ChannelMsg *m, int fd)
{
	ChannelMsg c = *m;
	c.id = 0;
	bool sent = false;
	for (int i = 0; i < n_pred; i++) {
		if (channel_out_send(pred[i].out, &c, fd)) {
			sent = true;
			continue;
		}
		/* another failure is logged by the channel */
		if (errno == EPIPE || errno == ECONNRESET)
			pred_close(i--); /* that master has exited */
	}
	return orphans_forward_cancel(&c, fd) || sent;
}

/* At our own retirement: the connections to older trees go to the master that replaces us. */
static void pass_preds_on(int conn)
{
	while (n_pred > 0) {
		/* the cancels still queued for it go first: the new master gets the socket, not our queue */
		(void)channel_out_finish(pred[0].out, 1000);
		ChannelMsg m = {.type = CH_UP_PRED, .arg = (int64_t)pred[0].pid};
		if (!channel_send(conn, &m, pred[0].fd))
			log_warning("online restart: could not pass on the connection to pid %d: %s", (int)pred[0].pid,
			            strerror(errno));
		pred_close(0);
	}
}

/*
 * The sockets, shared memory and salt key a running master (or an
 * orphaned worker) sends, up to CH_UP_END (its arg in *end_arg). A
 * listening socket already received (the same listener id: several
 * orphans hold the unix socket) is closed. 1 = done, 0 = closed, -1 =
 * error (errno), 2 = an unexpected message (its type in *bad).
 */
static int receive_tree(int fd, Takeover *t, int64_t *end_arg, uint32_t *bad)
{
	for (;;) {
		ChannelMsg m;
		int rfd;
		int r = channel_recv(fd, &m, &rfd);
		if (r <= 0)
			return r;
		if (m.type == CH_UP_END) {
			*end_arg = m.arg;
			t->client_state_version = m.id;
			return 1;
		}
		if (m.type == CH_UP_SEGMENT && rfd >= 0) {
			if (t->shm_fd < 0)
				t->shm_fd = rfd;
			else
				close(rfd); /* the same segment, from another orphan */
			continue;
		}
		if (m.type == CH_UP_SALT_KEY && rfd < 0 && m.id < SCRAM_SALT_KEY_LEN / 8) {
			memcpy(t->salt_key + m.id * 8, &m.arg, 8);
			t->have_salt_key = m.id == SCRAM_SALT_KEY_LEN / 8 - 1; /* the parts come in order */
			continue;
		}
		if (m.type != CH_UP_LISTENER || rfd < 0) {
			if (rfd >= 0)
				close(rfd);
			*bad = m.type;
			return 2;
		}
		int slot = m.id == UINT32_MAX ? -1 : (int)(m.id / LISTEN_MAX_TCP);
		bool have = false;
		for (int i = 0; i < t->n && !have; i++)
			have = t->s[i].id == m.id;
		if (have) {
			close(rfd);
			continue;
		}
		fcntl(rfd, F_SETFL, fcntl(rfd, F_GETFL) | O_NONBLOCK);
		t->s = xrealloc(t->s, sizeof(*t->s) * (size_t)(t->n + 1));
		InheritedSocket *s = &t->s[t->n++];
		memset(s, 0, sizeof(*s));
		s->fd = rfd;
		s->id = m.id;
		s->slot = slot;
		s->salen = sizeof(s->sa);
		if (getsockname(rfd, (struct sockaddr *)&s->sa, &s->salen) < 0)
			s->salen = 0;
	}
}

bool upgrade_connect(const char *private_dir, Takeover *t)
{
	struct sockaddr_un sa;
	struct stat st;
	memset(t, 0, sizeof(*t));
	t->conn = -1;
	t->shm_fd = -1;
	if (!private_dir || !control_path(private_dir, &sa))
		return false;
	/* only a directory of ours: someone else's could hand us sockets of their choosing */
	if (lstat(private_dir, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
		return false;
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		fatal("socket() failed: %s", strerror(errno));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		log_debug("online restart: connect(%s): %s", sa.sun_path, strerror(errno));
		close(fd);
		return false;
	}
	uid_t uid;
	if (!peer_uid(fd, &uid, &t->old_pid) || uid != geteuid())
		fatal("online restart: %s is not served by this user's pgbouncer", sa.sun_path);
	set_timeouts(fd);
	log_info("online restart: taking over from the running process (pid %d)", (int)t->old_pid);
	ChannelMsg hello = {.type = CH_UP_HELLO, .arg = UPGRADE_PROTOCOL};
	if (!channel_send(fd, &hello, -1))
		fatal("online restart: could not talk to pid %d: %s", (int)t->old_pid, strerror(errno));
	int64_t workers = 0;
	uint32_t bad = 0;
	int r = receive_tree(fd, t, &workers, &bad);
	if (r == 0)
		fatal("online restart: pid %d refused the hand-over (its log says why)", (int)t->old_pid);
	if (r < 0)
		fatal("online restart: no answer from pid %d: %s", (int)t->old_pid, strerror(errno));
	if (r == 2)
		fatal("online restart: unexpected message %u from pid %d", bad, (int)t->old_pid);
	t->workers = (int)workers;
	t->conn = fd;
	log_info("online restart: received %d listening sockets; the old process runs %d workers", t->n, t->workers);
	return true;
}

/*
 * One socket pair per old worker: one end to the old master (for its
 * worker, CH_HANDOFF), the other to one of ours (CH_ADOPT), so the old
 * tree's movable clients come over with their state (doc/workers.md
 * "Upgrading"). Only if our workers read the old binary's client state
 * format: ours or an older one still decoded (doc/architecture.md, "The
 * handover codec"). We ask for that format by its number, which the old
 * master checks is its own.
 */
static void offer_handoffs(Takeover *t, UpgradeAdoptFn adopt_fn)
{
	if (!client_state_readable(t->client_state_version)) {
		log_info("online restart: pid %d cannot hand its clients over (client state format %u, this binary "
		         "reads %u to %u): they finish there",
		         (int)t->old_pid, t->client_state_version, CLIENT_STATE_VERSION_OLDEST, CLIENT_STATE_VERSION);
		return;
	}
	int sent = 0;
	for (int k = 0; k < t->workers && k < 64; k++) {
		int sp[2];
		if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0) {
			log_warning("online restart: socketpair() failed: %s", strerror(errno));
			break;
		}
		int big = 1 << 20; /* room for many clients' state; the kernel caps it at wmem_max */
		(void)setsockopt(sp[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
		ChannelMsg m = {.type = CH_UP_HANDOFF, .id = (uint32_t)k, .arg = t->client_state_version};
		bool ok = adopt_fn(k, sp[1]) && channel_send(t->conn, &m, sp[0]);
		close(sp[0]);
		close(sp[1]);
		if (!ok)
			break;
		sent++;
	}
	log_info("online restart: %d of pid %d's %d workers will hand their clients to this process", sent,
	         (int)t->old_pid, t->workers);
}

void upgrade_commit(Takeover *t, UpgradeAdoptFn adopt_fn, struct event_base *base)
{
	if (t->n_orphans > 0 && base)
		orphans_watch(base); /* they hand over at upgrade_release_orphans() */
	if (t->conn < 0)
		return;
	if (adopt_fn)
		offer_handoffs(t, adopt_fn);
	ChannelMsg m = {.type = CH_UP_COMMIT, .arg = (int64_t)getpid()};
	int rfd = -1;
	bool done = false;
	if (!channel_send(t->conn, &m, -1) || channel_recv(t->conn, &m, &rfd) != 1 || m.type != CH_UP_DONE)
		log_warning("online restart: pid %d did not confirm the hand-over (%s); it may still be accepting",
		            (int)t->old_pid, errno ? strerror(errno) : "closed");
	else {
		log_info("online restart: pid %d stopped accepting and finishes its clients", (int)t->old_pid);
		done = true;
	}
	if (rfd >= 0)
		close(rfd);
	if (done && base) {
		/* kept: cancels for the clients still there pass through it (upgrade_forward_cancel()) */
		pred_add(base, t->conn, t->old_pid);
	} else
		close(t->conn);
	t->conn = -1;
	/*
	 * Killed between sending its sockets and our commit: its workers are
	 * orphans now, to adopt as when its connection closes later (and if it
	 * lives on, there is nobody to adopt).
	 */
	if (!done && pred_gone_fn)
		pred_gone_fn(t->old_pid);
}

/* ---- the new master and the workers of a tree whose master died ---- */

#define ORPHAN_PROTOCOL 1 /* CH_ORPHAN_HELLO's; the worker's loop/orphan.c speaks it too */

static struct {
	int fd;
	struct event *ev;
	ChannelOut *out; /* cancel requests and orders to it, queued while its socket is full */
	pid_t pid;
	int id;        /* its worker id in the old tree */
	bool released; /* told to drain and hand its clients over */
} orphan[UPGRADE_MAX_ORPHANS];
static int n_orphan;
static uint32_t orphan_format;           /* the orphans' CLIENT_STATE_VERSION */
static UpgradeCancelFn orphan_cancel_fn; /* a cancel an orphan could not place: to a client moved to our tree */

static void orphan_close(int i)
{
	channel_out_free(orphan[i].out);
	if (orphan[i].ev)
		event_free(orphan[i].ev);
	close(orphan[i].fd);
	orphan[i] = orphan[--n_orphan];
}

/* One orphaned worker, through its adoption socket: its sockets into t. */
/*
 * Adoption sockets that did not answer lately (a stopped orphan holds a
 * connection for the whole timeout): a scan skips them for a while, so
 * that the running master's periodic look does not stall its loop at every
 * tick (doc/workers.md "When the master dies").
 */
#define ADOPT_RETRY_US (30 * (int64_t)1000000)
static struct {
	ino_t ino;
	int64_t at; /* monotonic usec of the failure */
} adopt_failed[UPGRADE_MAX_ORPHANS];

static bool adopt_failed_lately(ino_t ino)
{
	int64_t now = (int64_t)get_mono_usec();
	for (int i = 0; i < UPGRADE_MAX_ORPHANS; i++)
		if (adopt_failed[i].at && adopt_failed[i].ino == ino && now - adopt_failed[i].at < ADOPT_RETRY_US)
			return true;
	return false;
}

static void adopt_failed_note(ino_t ino)
{
	int oldest = 0;
	for (int i = 0; i < UPGRADE_MAX_ORPHANS; i++) {
		if (adopt_failed[i].ino == ino || !adopt_failed[i].at) {
			oldest = i;
			break;
		}
		if (adopt_failed[i].at < adopt_failed[oldest].at)
			oldest = i;
	}
	adopt_failed[oldest].ino = ino;
	adopt_failed[oldest].at = (int64_t)get_mono_usec();
}

static bool adopt_one(const char *sock, Takeover *t)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(sock) >= sizeof(sa.sun_path) || n_orphan == UPGRADE_MAX_ORPHANS)
		return false;
	pgb_strlcpy(sa.sun_path, sock, sizeof(sa.sun_path));
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return false;
	uid_t uid;
	pid_t pid = 0;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || !peer_uid(fd, &uid, &pid) || uid != geteuid()) {
		log_debug("adoption: %s: %s", sock, errno ? strerror(errno) : "another user's");
		close(fd);
		return false;
	}
	set_timeouts(fd);
	ChannelMsg hello = {.type = CH_ORPHAN_HELLO, .arg = ORPHAN_PROTOCOL};
	int64_t id = -1;
	uint32_t bad = 0;
	int r = channel_send(fd, &hello, -1) ? receive_tree(fd, t, &id, &bad) : -1;
	if (r != 1 || id < 0 || id >= UPGRADE_MAX_ORPHANS) {
		if (r == 2)
			log_warning("adoption: unexpected message %u from pid %d", bad, (int)pid);
		else
			log_warning("adoption: pid %d (%s) did not answer: %s", (int)pid, sock,
			            r == 0 ? "it refused" : strerror(errno));
		close(fd);
		return false;
	}
	orphan[n_orphan++] = (typeof(orphan[0])){.fd = fd, .pid = pid, .id = (int)id};
	t->orphan_pids[t->n_orphans++] = pid;
	log_info("adoption: worker %d (pid %d) of a tree whose master died hands over its sockets", (int)id, (int)pid);
	return true;
}

bool upgrade_find_orphans(const char *private_dir, Takeover *t)
{
	struct stat st;
	/* only a directory of ours: someone else's could hand us sockets of their choosing */
	if (!private_dir || !private_dir[0] || lstat(private_dir, &st) < 0 || !S_ISDIR(st.st_mode) ||
	    st.st_uid != geteuid())
		return false;
	DIR *d = opendir(private_dir);
	if (!d)
		return false;
	int before = t->n_orphans;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		int id;
		char tail;
		if (sscanf(e->d_name, "worker.%d%c", &id, &tail) != 1 || id < 0 || id >= UPGRADE_MAX_ORPHANS)
			continue;
		char sock[160];
		int n = snprintf(sock, sizeof(sock), "%s/%s/adopt", private_dir, e->d_name);
		if (n > 0 && (size_t)n < sizeof(sock) && lstat(sock, &st) == 0 && S_ISSOCK(st.st_mode) &&
		    st.st_uid == geteuid() && !adopt_failed_lately(st.st_ino) && !adopt_one(sock, t))
			adopt_failed_note(st.st_ino);
	}
	closedir(d);
	if (t->n_orphans == before)
		return false;
	t->workers = t->n_orphans;
	orphan_format = t->client_state_version;
	log_info("adoption: %d workers of a tree whose master died serve on; received %d listening sockets",
	         t->n_orphans, t->n);
	return true;
}

/* From an adopted worker: what it tells its master (ignored), the cancels it could not place, its exit. */
static void on_orphan(evutil_socket_t fd, short what, void *arg)
{
	int i = 0;
	while (i < n_orphan && orphan[i].fd != fd)
		i++;
	if (i == n_orphan)
		return;
	ChannelMsg m;
	int rfd;
	int r = channel_recv(fd, &m, &rfd);
	if (r == 1 && m.type == CH_CANCEL && rfd >= 0) {
		/*
		 * A key that names another worker of the old tree (byte 3) goes to
		 * it; one that no old worker has (id CANCEL_NOT_HERE, or its worker
		 * is gone) may be a client moved to our tree. Never back to the
		 * orphans: what they return is not passed on again, so nothing loops.
		 */
		uint8_t key[sizeof(m.arg)]; /* the cancel key's 8 bytes */
		memcpy(key, &m.arg, sizeof(key));
		int to = -1;
		for (int j = 0; m.id == 0 && j < n_orphan && to < 0; j++)
			if (j != i && orphan[j].id == key[3] && orphan[j].out)
				to = j;
		ChannelMsg c = m;
		c.id = 0;
		if (to >= 0)
			(void)channel_out_send(orphan[to].out, &c, rfd); /* a failure is logged by the channel */
		else if (orphan_cancel_fn)
			orphan_cancel_fn(&c, rfd);
	}
	if (rfd >= 0)
		close(rfd);
	if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
		if (orphan[i].released)
			log_info("adoption: worker %d (pid %d) of the old tree has exited", orphan[i].id,
			         (int)orphan[i].pid);
		else
			log_warning("adoption: worker %d (pid %d) of the old tree went away before handing over",
			            orphan[i].id, (int)orphan[i].pid);
		orphan_close(i);
	}
}

/* upgrade_commit() for adopted orphans: their connections are watched from now on. */
static void orphans_watch(struct event_base *base)
{
	for (int i = 0; i < n_orphan; i++) {
		if (orphan[i].ev)
			continue;
		fcntl(orphan[i].fd, F_SETFL, fcntl(orphan[i].fd, F_GETFL) | O_NONBLOCK);
		orphan[i].ev = event_new(base, orphan[i].fd, EV_READ | EV_PERSIST, on_orphan, NULL);
		event_add(orphan[i].ev, NULL);
		char peer[48];
		snprintf(peer, sizeof(peer), "the old tree's worker %d (pid %d)", orphan[i].id, (int)orphan[i].pid);
		orphan[i].out = channel_out_new(base, orphan[i].fd, peer);
	}
}

/* Each adopted worker gets its own copy of the requester's socket; only the one with the key answers. */
static bool orphans_forward_cancel(const ChannelMsg *c, int fd)
{
	bool sent = false;
	for (int i = 0; i < n_orphan; i++)
		if (orphan[i].out && channel_out_send(orphan[i].out, c, fd))
			sent = true;
	return sent;
}

/* Stopping on purpose before they handed over: the adopted workers stop too (they drain and exit). */
static void orphans_goodbye(void)
{
	for (int i = 0; i < n_orphan; i++) {
		if (orphan[i].released || !orphan[i].out)
			continue;
		orphan[i].released = true;
		ChannelMsg drain = {.type = CH_DRAIN};
		(void)channel_out_send(orphan[i].out, &drain, -1);
		(void)channel_out_finish(orphan[i].out, 1000);
	}
}

void upgrade_on_orphan_cancel(UpgradeCancelFn fn)
{
	orphan_cancel_fn = fn;
}

void upgrade_release_orphans(UpgradeAdoptFn adopt_fn, int64_t drain_timeout_ms)
{
	int sent = 0, n = 0;
	for (int i = 0; i < n_orphan; i++) {
		if (orphan[i].released)
			continue;
		orphan[i].released = true;
		n++;
		int sp[2] = {-1, -1};
		bool pair = socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) == 0;
		if (!pair)
			log_warning("adoption: socketpair() failed: %s", strerror(errno));
		else {
			int big = 1 << 20; /* room for many clients' state; the kernel caps it at wmem_max */
			(void)setsockopt(sp[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
		}
		bool movable = pair && adopt_fn && client_state_readable(orphan_format) && adopt_fn(i, sp[1]);
		ChannelMsg drain = {.type = CH_DRAIN, .id = 1, .arg = drain_timeout_ms};
		ChannelMsg h = {.type = CH_HANDOFF};
		/* the order of -R; one with no clients may exit before it reads the second */
		if (channel_out_send(orphan[i].out, &drain, -1) && movable) {
			(void)channel_out_send(orphan[i].out, &h, sp[0]);
			sent++;
		}
		if (pair) {
			close(sp[0]);
			close(sp[1]);
		}
	}
	if (n > 0)
		log_info("adoption: %d of %d workers of the old tree hand their clients to this process", sent, n);
}

void upgrade_close_unused(Takeover *t)
{
	for (int i = 0; i < t->n; i++) {
		if (t->s[i].fd < 0)
			continue;
		char host[64] = "?";
		int port = 0;
		sockaddr_host_port((struct sockaddr *)&t->s[i].sa, host, sizeof(host), &port);
		log_warning("online restart: %s:%d (listener slot %d) is not in this configuration: closed", host, port,
		            t->s[i].slot);
		close(t->s[i].fd);
		t->s[i].fd = -1;
	}
	free(t->s);
	t->s = NULL;
	t->n = 0;
}

/* ---- the running master ---- */

static struct {
	int lfd;
	struct event *lev;
	int conn;
	struct event *cev;
	pid_t peer;
	bool exported;
	char path[108];
	dev_t dev;
	ino_t ino;
	UpgradeExportFn export_fn;
	UpgradeRetireFn retire_fn;
	UpgradeCancelFn cancel_fn;
	int succ; /* the new master's connection, kept once we retired: its cancels for our clients */
	struct event *succ_ev;
	int handoff[64]; /* CH_UP_HANDOFF sockets, for our workers once we retire */
	int n_handoff;
	int next_handoff;
	pid_t grace_pid;        /* the new master during our grace period, else 0 */
	struct event *grace_ev; /* UPGRADE_GRACE_S after CH_UP_DONE: retire */
	int64_t grace_start_us;
	UpgradeResumeFn resume_fn;
	UpgradeHandedFn handed_fn;
} up = {.lfd = -1, .conn = -1, .succ = -1};

void upgrade_on_resume(UpgradeResumeFn fn)
{
	up.resume_fn = fn;
}

void upgrade_on_handed(UpgradeHandedFn fn)
{
	up.handed_fn = fn;
}

static void close_handoffs(void)
{
	for (int i = up.next_handoff; i < up.n_handoff; i++)
		close(up.handoff[i]);
	up.n_handoff = up.next_handoff = 0;
}

int upgrade_next_handoff(void)
{
	return up.next_handoff < up.n_handoff ? up.handoff[up.next_handoff++] : -1;
}

static void close_conn(void)
{
	if (up.cev) {
		event_free(up.cev);
		up.cev = NULL;
	}
	if (up.conn >= 0)
		close(up.conn);
	up.conn = -1;
	if (up.exported) {
		close_handoffs(); /* given up: no worker of ours will use them */
		log_info("online restart by pid %d abandoned; carrying on", (int)up.peer);
		up.exported = false;
		up.export_fn(-1);
	}
}

/* The grace period is over (or the new master stops on purpose): hand the tree over as -R does. */
static void grace_end(void)
{
	pid_t pid = up.grace_pid;
	up.grace_pid = 0;
	evtimer_del(up.grace_ev);
	if (up.succ >= 0)
		pass_preds_on(up.succ);
	up.retire_fn(pid); /* its workers take the sockets with upgrade_next_handoff() */
	close_handoffs();
}

static void on_grace(evutil_socket_t fd, short what, void *arg)
{
	if (up.grace_pid > 0)
		grace_end();
}

/* The new master died within the grace period: this tree never stopped serving, it carries on. */
static void grace_abort(void)
{
	pid_t pid = up.grace_pid;
	up.grace_pid = 0;
	evtimer_del(up.grace_ev);
	close_handoffs(); /* the new workers they led to have exited with their master */
	log_warning("online restart: pid %d went away %.1f s after taking over, within the grace period "
	            "(%d s): this process carries on",
	            (int)pid, (double)(get_mono_usec() - up.grace_start_us) / 1e6, UPGRADE_GRACE_S);
	up.export_fn(-1); /* scaling again */
	if (up.resume_fn)
		up.resume_fn(pid);
}

/* From the master that took over: cancel requests it could not place in its tree, and its goodbye. */
static void on_succ(evutil_socket_t fd, short what, void *arg)
{
	ChannelMsg m;
	int rfd;
	int r = channel_recv(fd, &m, &rfd);
	if (r == 1 && m.type == CH_CANCEL && rfd >= 0)
		up.cancel_fn(&m, rfd); /* the owner gets its own copy of the requester's socket */
	if (rfd >= 0)
		close(rfd);
	if (r == 1 && m.type == CH_UP_BYE && up.grace_pid > 0) {
		log_info("online restart: pid %d is stopping; this process hands over now", (int)up.grace_pid);
		grace_end();
	}
	if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
		event_free(up.succ_ev);
		up.succ_ev = NULL;
		close(up.succ);
		up.succ = -1;
		if (up.grace_pid > 0)
			grace_abort();
	}
}

static void on_conn(evutil_socket_t fd, short what, void *arg)
{
	ChannelMsg m;
	int rfd;
	int r = channel_recv(fd, &m, &rfd);
	if (r == 1 && m.type == CH_UP_HANDOFF && up.exported && rfd >= 0) {
		if (m.arg != CLIENT_STATE_VERSION ||
		    up.n_handoff >= (int)(sizeof(up.handoff) / sizeof(up.handoff[0]))) {
			log_warning("online restart: pid %d offers clients a state format %lld, this process's is %u: "
			            "they finish here",
			            (int)up.peer, (long long)m.arg, CLIENT_STATE_VERSION);
			close(rfd);
		} else
			up.handoff[up.n_handoff++] = rfd;
		return;
	}
	if (rfd >= 0)
		close(rfd);
	if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return;
	if (r <= 0) {
		close_conn();
		return;
	}
	if (m.type == CH_UP_HELLO && !up.exported) {
		if (m.arg != UPGRADE_PROTOCOL) {
			log_warning("online restart: pid %d speaks hand-over protocol %lld, this process %d: refused",
			            (int)up.peer, (long long)m.arg, UPGRADE_PROTOCOL);
			close_conn();
			return;
		}
		log_info("online restart: pid %d asks for the listening sockets", (int)up.peer);
		up.exported = true;
		int workers = up.export_fn(up.conn);
		ChannelMsg end = {.type = CH_UP_END, .id = CLIENT_STATE_VERSION, .arg = workers};
		/* the salts of SCRAM logins stay as they were (scram_salt_for()) */
		uint8_t key[SCRAM_SALT_KEY_LEN];
		scram_salt_key_get(key);
		for (uint32_t i = 0; workers >= 0 && i < SCRAM_SALT_KEY_LEN / 8; i++) {
			ChannelMsg part = {.type = CH_UP_SALT_KEY, .id = i};
			memcpy(&part.arg, key + i * 8, 8);
			if (!channel_send(up.conn, &part, -1))
				workers = -1;
		}
		explicit_bzero(key, sizeof(key));
		if (workers < 0 || !channel_send(up.conn, &end, -1))
			close_conn();
	} else if (m.type == CH_UP_COMMIT && up.exported) {
		pid_t pid = (pid_t)m.arg;
		ChannelMsg done = {.type = CH_UP_DONE, .arg = (int64_t)getpid()};
		if (!channel_send(up.conn, &done, -1))
			log_warning("online restart: could not confirm to pid %d: %s", (int)pid, strerror(errno));
		up.exported = false; /* so close_conn() keeps the hand-over sockets */
		if (up.handed_fn)
			up.handed_fn(pid);
		struct event_base *base = event_get_base(up.cev);
		if (up.succ < 0) {
			/*
			 * Kept open: the new tree sends the cancel requests for our
			 * clients here, and its closing within the grace period tells
			 * us it died.
			 */
			up.succ = up.conn;
			up.conn = -1;
			up.succ_ev = event_new(base, up.succ, EV_READ | EV_PERSIST, on_succ, NULL);
			event_add(up.succ_ev, NULL);
		}
		close_conn();
		upgrade_stop_listening();
		/*
		 * Both trees accept on the same sockets for UPGRADE_GRACE_S; our
		 * clients stay here until then, so that a new master that dies
		 * now leaves a serving pooler behind (doc/workers.md "Upgrading").
		 */
		log_info("online restart: pid %d took over; this process keeps serving for its grace period (%d s)",
		         (int)pid, UPGRADE_GRACE_S);
		up.grace_pid = pid;
		up.grace_start_us = get_mono_usec();
		if (!up.grace_ev)
			up.grace_ev = evtimer_new(base, on_grace, NULL);
		struct timeval tv = {UPGRADE_GRACE_S, 0};
		if (up.succ >= 0)
			evtimer_add(up.grace_ev, &tv);
		else
			grace_end(); /* no connection to watch: nothing to wait for */
	} else {
		log_warning("online restart: unexpected message %u from pid %d", m.type, (int)up.peer);
		close_conn();
	}
}

static void on_accept(evutil_socket_t fd, short what, void *arg)
{
	int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
	if (c < 0)
		return;
	uid_t uid = (uid_t)-1;
	pid_t pid = 0;
	if (!peer_uid(c, &uid, &pid) || uid != geteuid()) {
		log_warning("online restart: refused a connection from uid %d", (int)uid);
		close(c);
		return;
	}
	if (up.conn >= 0) {
		log_warning("online restart: pid %d asked while pid %d is taking over: refused", (int)pid,
		            (int)up.peer);
		close(c);
		return;
	}
	set_timeouts(c); /* sends block at most this long; reads come from the event loop */
	up.conn = c;
	up.peer = pid;
	up.cev = event_new(event_get_base(up.lev), c, EV_READ | EV_PERSIST, on_conn, NULL);
	event_add(up.cev, NULL);
}

bool upgrade_listen(struct event_base *base, const char *private_dir, UpgradeExportFn export_fn,
                    UpgradeRetireFn retire_fn, UpgradeCancelFn cancel_fn)
{
	struct sockaddr_un sa;
	struct stat st;
	up.export_fn = export_fn;
	up.retire_fn = retire_fn;
	up.cancel_fn = cancel_fn;
	if (!private_dir || !control_path(private_dir, &sa)) {
		log_warning("no private socket directory: online restart (-R) cannot find this process");
		return false;
	}
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		log_warning("socket() failed: %s", strerror(errno));
		return false;
	}
	unlink(sa.sun_path); /* a predecessor's: it handed over, or died */
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 4) < 0 || chmod(sa.sun_path, 0600) < 0 ||
	    lstat(sa.sun_path, &st) < 0) {
		log_warning("online restart control socket %s: %s; -R cannot find this process", sa.sun_path,
		            strerror(errno));
		close(fd);
		return false;
	}
	up.lfd = fd;
	pgb_strlcpy(up.path, sa.sun_path, sizeof(up.path));
	up.dev = st.st_dev;
	up.ino = st.st_ino;
	up.lev = event_new(base, fd, EV_READ | EV_PERSIST, on_accept, NULL);
	event_add(up.lev, NULL);
	return true;
}

bool upgrade_send_listener(int conn, uint32_t id, int fd)
{
	ChannelMsg m = {.type = CH_UP_LISTENER, .id = id};
	if (channel_send(conn, &m, fd))
		return true;
	log_warning("online restart: could not send a listening socket: %s", strerror(errno));
	return false;
}

bool upgrade_send_segment(int conn, int fd)
{
	ChannelMsg m = {.type = CH_UP_SEGMENT};
	if (channel_send(conn, &m, fd))
		return true;
	log_warning("online restart: could not send the shared memory: %s", strerror(errno));
	return false;
}

void upgrade_stop_listening(void)
{
	struct stat st;
	if (up.lev) {
		event_free(up.lev);
		up.lev = NULL;
	}
	if (up.lfd < 0)
		return;
	close(up.lfd);
	up.lfd = -1;
	/* the new master has bound its own by now: leave that one alone */
	if (lstat(up.path, &st) == 0 && st.st_dev == up.dev && st.st_ino == up.ino)
		unlink(up.path);
}

void upgrade_forget_in_child(void)
{
	/*
	 * Only the fds: the events belong to the master's event base, which the
	 * child has let go of already. A copy left open here would keep the
	 * control socket listening after the master died (a -R would connect
	 * and wait for an answer nobody gives), or hide the EOF by which an
	 * older master, an orphan or a successor learns that a side went away.
	 */
	for (int i = 0; i < n_pred; i++) {
		channel_out_forget_in_child(pred[i].out);
		close(pred[i].fd);
	}
	for (int i = 0; i < n_orphan; i++) {
		channel_out_forget_in_child(orphan[i].out);
		close(orphan[i].fd);
	}
	int fds[] = {up.lfd, up.conn, up.succ};
	for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
		if (fds[i] >= 0)
			close(fds[i]);
	for (int i = up.next_handoff; i < up.n_handoff; i++)
		close(up.handoff[i]); /* those before next_handoff went to a worker and are closed here already */
}
