/*
 * The orphaned worker (include/worker/orphan.h; the user's view is
 * doc/workers.md "When the master dies"). Its clients, listening sockets
 * and shared memory outlive the master; what it needs is a master again.
 * One started with the same configuration finds this worker's adoption
 * socket in the private directory, takes copies of its listening sockets,
 * its shared memory and its SCRAM salt key (the CH_ORPHAN_HELLO exchange
 * of include/common/channel.h), and from then on the connection is this
 * worker's control channel: once the new tree has served for its grace
 * period the new master tells us to drain and gives us a socket to one of
 * its workers, exactly as the old master does at -R.
 */
#include "autoconfig.h"

#include "worker/orphan.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/budget.h"
#include "common/channel.h"
#include "common/log.h"
#include "common/scram.h"
#include "common/util.h"
#include "worker/admin_state.h"
#include "worker/worker.h"

#define ORPHAN_PROTOCOL  1
#define HELLO_TIMEOUT_S  5   /* a connection that does not say hello within it is closed */
#define REAP_INTERVAL_MS 200 /* how often a masterless worker looks for siblings that died */

static int lfd = -1;             /* the adoption socket */
static struct event *lev;        /* its accepts */
static int pending = -1;         /* a connection that has not said hello yet */
static struct event *pending_ev; /* its hello, or its timeout */
static struct event *timeout_ev; /* worker_orphan_timeout */
static struct event *reap_ev;    /* siblings that died while no master runs */
static char path[160];           /* <private dir>/worker.<id>/adopt */
static struct stat bound;        /* the file as we bound it */

static void remove_socket(void)
{
	struct stat st;
	if (path[0] && lstat(path, &st) == 0 && st.st_dev == bound.st_dev && st.st_ino == bound.st_ino)
		unlink(path);
}

static void drop_pending(void)
{
	if (pending_ev)
		event_free(pending_ev);
	pending_ev = NULL;
	if (pending >= 0)
		close(pending);
	pending = -1;
}

static bool send_or_log(int fd, ChannelMsg *m, int attach)
{
	if (channel_send(fd, m, attach))
		return true;
	log_warning("adoption: could not answer the new master: %s", strerror(errno));
	return false;
}

/* What a master sends at -R for its tree, for this worker alone (include/common/channel.h, CH_ORPHAN_HELLO). */
static bool answer_hello(int fd)
{
	for (int i = 0; i < wk.n_listeners; i++) {
		WorkerListener *l = &wk.listeners[i];
		if (l->fd < 0)
			continue;
		ChannelMsg m = {.type = CH_UP_LISTENER, .id = l->is_unix ? UINT32_MAX : l->id};
		if (!send_or_log(fd, &m, l->fd))
			return false;
	}
	if (wk.shm_fd >= 0) {
		ChannelMsg m = {.type = CH_UP_SEGMENT};
		if (!send_or_log(fd, &m, wk.shm_fd))
			return false;
	}
	uint8_t key[SCRAM_SALT_KEY_LEN];
	scram_salt_key_get(key);
	bool ok = true;
	for (uint32_t i = 0; ok && i < SCRAM_SALT_KEY_LEN / 8; i++) {
		ChannelMsg part = {.type = CH_UP_SALT_KEY, .id = i};
		memcpy(&part.arg, key + i * 8, 8);
		ok = send_or_log(fd, &part, -1);
	}
	explicit_bzero(key, sizeof(key));
	ChannelMsg end = {.type = CH_UP_END, .id = CLIENT_STATE_VERSION, .arg = wk.id};
	return ok && send_or_log(fd, &end, -1);
}

static void on_hello(evutil_socket_t fd, short what, void *arg)
{
	ChannelMsg m = {0};
	int rfd = -1;
	int r = (what & EV_READ) ? channel_recv(fd, &m, &rfd) : 0;
	if (rfd >= 0)
		close(rfd);
	if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return;
	if (r != 1 || m.type != CH_ORPHAN_HELLO || m.arg != ORPHAN_PROTOCOL || wk.master_fd >= 0 ||
	    wk.run_state != RUN_ACTIVE) {
		if (r == 1)
			log_warning("adoption: refused a connection (%s, protocol %lld)", channel_msg_name(m.type),
			            (long long)m.arg);
		drop_pending();
		return;
	}
	struct ucred cr;
	socklen_t len = sizeof(cr);
	pid_t pid = getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) == 0 ? cr.pid : 0;
	/* a few small messages: sent blocking, bounded by the timeout */
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	struct timeval tv = {HELLO_TIMEOUT_S, 0};
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (!answer_hello(fd)) {
		drop_pending();
		return;
	}
	int conn = pending;
	pending = -1;
	drop_pending();
	worker_master_attach(conn);
	log_info("adopted by a new master (pid %d): this worker hands its clients to the new tree once that has "
	         "served for its grace period",
	         (int)pid);
	admin_state_adopted();
}

static void on_accept(evutil_socket_t fd, short what, void *arg)
{
	int c = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (c < 0)
		return;
	struct ucred cr;
	socklen_t len = sizeof(cr);
	if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0 || cr.uid != geteuid()) {
		log_warning("adoption: refused a connection from uid %d", len == sizeof(cr) ? (int)cr.uid : -1);
		close(c);
		return;
	}
	if (pending >= 0 || wk.master_fd >= 0) {
		close(c); /* one new master at a time; or we have one already */
		return;
	}
	pending = c;
	pending_ev = event_new(wk.base, c, EV_READ | EV_PERSIST, on_hello, NULL);
	struct timeval tv = {HELLO_TIMEOUT_S, 0};
	event_add(pending_ev, &tv);
}

static bool adoption_listen(void)
{
	if (lfd >= 0)
		return true;
	worker_private_check(); /* its directory too, should a tree that died in its grace period have removed it */
	const char *dir = worker_private_dir();
	int n = snprintf(path, sizeof(path), "%s/worker.%d/adopt", dir, wk.id);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (!dir[0] || n < 0 || (size_t)n >= sizeof(sa.sun_path)) {
		path[0] = '\0';
		return false;
	}
	pgb_strlcpy(sa.sun_path, path, sizeof(sa.sun_path));
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return false;
	unlink(path); /* a predecessor's in this slot */
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || chmod(path, 0600) < 0 || listen(fd, 4) < 0 ||
	    lstat(path, &bound) < 0) {
		log_warning("adoption socket %s: %s", path, strerror(errno));
		close(fd);
		unlink(path);
		path[0] = '\0';
		return false;
	}
	atexit(remove_socket);
	lfd = fd;
	lev = event_new(wk.base, fd, EV_READ | EV_PERSIST, on_accept, NULL);
	event_add(lev, NULL);
	return true;
}

/*
 * No master reaps a sibling that dies while we are orphans: give back what
 * it held of the pool limits in its stead (supervisor_reap() does it with a
 * master), or our clients would wait for its servers for ever. Its pid is
 * cleared first, by one compare-and-swap, so that one sibling alone gives
 * its units back.
 */
static void on_reap(evutil_socket_t fd, short what, void *arg)
{
	if (wk.master_fd >= 0 || !wk.shm)
		return; /* adopted: the new master reaps */
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		WorkerSlot *s = &wk.shm->slots[i];
		int32_t pid = atomic_load(&s->pid);
		if (i == wk.id || pid <= 0 || kill(pid, 0) == 0 || errno != ESRCH)
			continue;
		if (!atomic_compare_exchange_strong(&s->pid, &pid, 0))
			continue;
		atomic_store(&s->state, SLOT_FREE);
		budget_reset_worker(&wk.shm->budget, i);
		log_warning("worker %d (pid %d) died while no master runs: its share of the pool limits goes back "
		            "to the workers left",
		            i, (int)pid);
	}
	struct timeval tv = {0, REAP_INTERVAL_MS * 1000};
	evtimer_add(reap_ev, &tv);
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
	if (wk.master_fd >= 0 || wk.run_state != RUN_ACTIVE)
		return; /* adopted, or already on its way out */
	worker_clock_tick();
	log_warning("no new master adopted this worker within worker_orphan_timeout (%.0f s): shutting down",
	            (double)wk.cf.g.worker_orphan_timeout / USEC_PER_SEC);
	if (lev)
		event_del(lev);
	worker_start_shutdown(RUN_SHUTDOWN_SERVERS);
}

bool orphan_begin(const char *why)
{
	if (wk.run_state == RUN_DRAINING) {
		/* its listeners went to another worker, or the new tree has the sockets: finish here */
		log_warning("master process went away%s%s; this worker finishes its drain", why ? ": " : "",
		            why ? why : "");
		return true;
	}
	usec_t limit = wk.cf.g.worker_orphan_timeout;
	if (wk.run_state != RUN_ACTIVE || !wk.may_outlive || limit <= 0)
		return false;
	bool reachable = adoption_listen();
	log_warning("master process went away%s%s; this worker serves on and waits up to %.0f s "
	            "(worker_orphan_timeout) for a master started again to adopt it%s",
	            why ? ": " : "", why ? why : "", (double)limit / USEC_PER_SEC,
	            reachable ? "" : " (it has no adoption socket: none will)");
	if (!timeout_ev)
		timeout_ev = evtimer_new(wk.base, on_timeout, NULL);
	struct timeval tv = {(time_t)(limit / USEC_PER_SEC), (suseconds_t)(limit % USEC_PER_SEC)};
	evtimer_add(timeout_ev, &tv);
	if (!reap_ev)
		reap_ev = evtimer_new(wk.base, on_reap, NULL);
	on_reap(-1, 0, NULL);
	return true;
}
