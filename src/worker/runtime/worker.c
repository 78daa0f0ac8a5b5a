/*
 * The worker process's services to every room above it: its state (wk),
 * the clock of the loop pass, the channel to the master, the client counts
 * and the counters published to shared memory, the listeners (the private
 * socket too), and the shutdown that exits once nothing is left to wait
 * for. The loop itself is in loop/worker_main.c.
 */
#include "autoconfig.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdnoreturn.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/budget.h"
#include "common/channel.h"
#include "common/log.h"
#include "common/schedstat.h"
#include "common/util.h"
#include "worker/hooks.h"
#include "worker/objects.h"
#include "worker/worker.h"

Worker wk;

/* How long listeners rest after accept() lacked a resource (worker_accept_failed()). */
#define ACCEPT_REST_USEC USEC_PER_SEC

/* How long an exiting worker waits for room for what it still has to tell the master. */
#define WORKER_EXIT_FLUSH_MS 1000

/* ---- listeners ---- */

static char private_dir[108]; /* the workers' private sockets: "" when the name does not fit */
static int private_fd = -1;
static struct event *private_ev;
static char private_path[160]; /* this worker's socket */
static char private_sub[128];  /* and its directory */
static struct stat private_st; /* the socket file as bound: a successor may have replaced it */

static void on_private_accept(evutil_socket_t fd, short what, void *arg)
{
	for (int n = 0; n < 16; n++) {
		int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (cfd < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ||
			    !worker_accept_failed(errno, "on the private socket"))
				return;
			continue;
		}
		wk.now = get_time_usec();
		hooks.accept(cfd, true, true, NULL, 0); /* client_accept() */
	}
}

static void private_accept_pause(bool pause)
{
	if (!private_ev || private_fd < 0)
		return;
	if (pause)
		event_del(private_ev);
	else
		event_add(private_ev, NULL);
}

static void remove_private_socket(void)
{
	struct stat st;
	/* after an online restart the new tree's worker of this slot owns the name (doc/workers.md "Upgrading") */
	if (private_fd >= 0 && private_path[0] && lstat(private_path, &st) == 0 && st.st_dev == private_st.st_dev &&
	    st.st_ino == private_st.st_ino) {
		unlink(private_path);
		rmdir(private_sub);
	}
}

void worker_private_listen(void)
{
	if (!private_socket_dir(wk.cf.g.unix_socket_dir, wk.cf.g.listen_port, private_dir, sizeof(private_dir))) {
		log_warning("private socket directory name too long; this worker is reachable only through the "
		            "shared listeners");
		private_dir[0] = '\0';
		return;
	}
	snprintf(private_sub, sizeof(private_sub), "%s/worker.%d", private_dir, wk.id);
	snprintf(private_path, sizeof(private_path), "%s/.s.PGSQL.%d", private_sub, wk.cf.g.listen_port);
	if (mkdir(private_sub, 0700) < 0 && errno != EEXIST) {
		log_warning("mkdir(%s) failed: %s", private_sub, strerror(errno));
		return;
	}
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	pgb_strlcpy(sa.sun_path, private_path, sizeof(sa.sun_path));
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		log_warning("socket() failed: %s", strerror(errno));
		return;
	}
	unlink(private_path); /* left by a crashed predecessor in this slot */
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 128) < 0) {
		log_warning("private socket %s: bind()/listen() failed: %s", private_path, strerror(errno));
		close(fd);
		return;
	}
	if (lstat(private_path, &private_st) < 0)
		memset(&private_st, 0, sizeof(private_st));
	private_fd = fd;
	static bool registered;
	if (!registered)
		atexit(remove_private_socket);
	registered = true;
	private_ev = event_new(wk.base, fd, EV_READ | EV_PERSIST, on_private_accept, NULL);
	event_add(private_ev, NULL);
}

/*
 * A worker of a tree that took over and then went away (a new master that
 * died in its grace period, doc/workers.md "Upgrading") removed the socket
 * file of our slot, which it had bound in our stead, and its directory:
 * made again, so that consoles and an adopting master find us.
 */
void worker_private_check(void)
{
	struct stat st;
	if (private_fd < 0 || !private_path[0] || lstat(private_path, &st) == 0 || errno != ENOENT)
		return;
	event_free(private_ev);
	private_ev = NULL;
	close(private_fd);
	private_fd = -1;
	worker_private_listen();
	if (private_fd >= 0)
		log_info("private socket %s had been removed: listening on it again", private_path);
}

const char *worker_private_dir(void)
{
	return private_dir;
}

static void listeners_arm(bool arm)
{
	for (int i = 0; i < wk.n_listeners; i++) {
		WorkerListener *l = &wk.listeners[i];
		/* `active` stays as it is: a rest does not undo PAUSE, SUSPEND or a drain, nor make them */
		if (l->fd < 0 || !l->active)
			continue;
		if (arm)
			event_add(&l->ev, NULL);
		else
			event_del(&l->ev);
	}
	private_accept_pause(!arm);
}

bool worker_accept_failed(int err, const char *where)
{
	switch (err) {
	case ECONNABORTED:
	case EPROTO:
	case EPERM:
	case ENETDOWN:
	case ENETUNREACH:
	case EHOSTDOWN:
	case EHOSTUNREACH:
	case ENOPROTOOPT:
	case EOPNOTSUPP:
	case ENONET:
		/* that connection failed (and is gone from the queue): the next one may be fine */
		log_debug("accept()%s%s failed: %s", where ? " " : "", where ? where : "", strerror(err));
		return true;
	default:
		break;
	}
	/*
	 * EMFILE (the process's file limit), ENFILE, ENOBUFS, ENOMEM: the
	 * connection stays queued and the listener readable, so trying again at
	 * once would spin the event loop and flood the log. Rest, as PgBouncer
	 * does; the clients already connected are served meanwhile.
	 */
	log_warning("accept()%s%s failed: %s; not accepting new connections for %d s", where ? " " : "",
	            where ? where : "", strerror(err), (int)(ACCEPT_REST_USEC / USEC_PER_SEC));
	listeners_arm(false); /* each time: one resumed meanwhile (RESUME) may be armed */
	wk.accept_rest_until = get_time_usec() + ACCEPT_REST_USEC;
	return false;
}

void worker_accept_resume_due(void)
{
	if (!wk.accept_rest_until || wk.now < wk.accept_rest_until)
		return;
	wk.accept_rest_until = 0;
	listeners_arm(true);
}

static void on_accept(evutil_socket_t fd, short what, void *arg)
{
	WorkerListener *l = arg;
	/*
	 * One connection per wakeup while logins come one at a time: the
	 * listener is level-triggered, so when more are queued the loop's next
	 * epoll_wait(), which runs anyway, reports it again at once. Taking
	 * them in a loop until EAGAIN cost a failed accept4() for almost every
	 * login (0.94 per login at 50 clients of pgbench -C; doc/benchmarks.md,
	 * "Logins against PgBouncer 1.25.2"). A listener ready in two passes
	 * in a row has a queue: then up to 32 are taken at once, as before, so
	 * that a login storm is not accepted one per pass behind busy clients.
	 * Connections that failed in the queue are skipped.
	 */
	bool queue = l->last_pass + 1 == wk.loop_pass;
	l->last_pass = wk.loop_pass;
	int taken = 0;
	for (int tries = 0; tries < 32; tries++) {
		/* the peer's address comes with it: no getpeername() per login */
		struct sockaddr_storage peer;
		socklen_t peer_len = sizeof(peer);
		int cfd = accept4(fd, (struct sockaddr *)&peer, &peer_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (cfd < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
			    worker_accept_failed(errno, NULL))
				continue;
			return;
		}
		wk.now = get_time_usec();
		hooks.accept(cfd, l->is_unix, false, &peer, peer_len); /* client_accept() */
		if (!queue || ++taken >= 32)
			return;
	}
}

void worker_listen_pause(bool pause)
{
	for (int i = 0; i < wk.n_listeners; i++) {
		WorkerListener *l = &wk.listeners[i];
		if (l->fd < 0)
			continue;
		if (pause && l->active) {
			event_del(&l->ev);
			l->active = false;
		} else if (!pause && !l->active) {
			event_add(&l->ev, NULL);
			l->active = true;
		}
	}
}

static void close_listener(WorkerListener *l)
{
	if (l->active)
		event_del(&l->ev);
	l->active = false;
	close(l->fd);
	l->fd = -1;
}

void worker_listen_close(void)
{
	for (int i = 0; i < wk.n_listeners; i++)
		if (wk.listeners[i].fd >= 0)
			close_listener(&wk.listeners[i]);
}

/* Shutdown modes stop TCP accepts; the unix socket stays for admin logins. */
static void close_tcp_listeners(void)
{
	for (int i = 0; i < wk.n_listeners; i++) {
		WorkerListener *l = &wk.listeners[i];
		if (!l->is_unix && l->fd >= 0)
			close_listener(l);
	}
}

static int total_servers(void)
{
	int n = 0;
	List *i;
	list_for_each(i, &wk.pools) n += pool_server_count(container_of(i, PgPool, node));
	return n;
}

/*
 * Exit, after the messages still queued for the master went out (a moved
 * client's news, a cancel to forward): the master reads them within the
 * wait unless it is stuck or exiting itself.
 */
noreturn void worker_exit(void)
{
	pools_stats_flush(); /* its counts stay in the tree's SHOW STATS totals */
	if (wk.master_out)
		(void)channel_out_finish(wk.master_out, WORKER_EXIT_FLUSH_MS);
	exit(0);
}

/* How long a safe shutdown goes on after its last server closed (a janitor tick). */
#define SHUTDOWN_LINGER (USEC_PER_SEC / 3)

void worker_close_clients(List *list, const char *reason)
{
	List *j, *t;
	list_for_each_safe(j, list, t) disconnect_client(container_of(j, PgSocket, node), true, "%s", reason);
}

/* Close every client still logging in or in a pool, other workers' consoles aside, with `reason`. */
static void close_all_clients(const char *reason)
{
	worker_close_clients(&wk.login_clients, reason);
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *pool = container_of(i, PgPool, node);
		List *lists[] = {&pool->active_clients, &pool->waiting_clients};
		for (int l = 0; l < 2; l++) {
			List *j, *t;
			list_for_each_safe(j, lists[l], t)
			{
				PgSocket *c = container_of(j, PgSocket, node);
				if (!c->is_internal)
					disconnect_client(c, true, "%s", reason);
			}
		}
	}
}

void worker_check_shutdown(void)
{
	/* consoles of other workers reaching this one through its private socket do not hold it up */
	int clients = wk.client_count - wk.private_clients;
	if (wk.intakes > 0)
		return; /* moved clients are on their way here: they would be lost */
	if (wk.run_state == RUN_SHUTDOWN_CLIENTS && clients <= 0) {
		log_info("client connections dropped, exiting");
		worker_exit();
	}
	if (wk.run_state == RUN_SHUTDOWN_SERVERS && total_servers() == 0 && !wk.shutdown_closing) {
		/*
		 * The last server is gone; the clients left finished their
		 * transactions. For a janitor tick a client's next query still
		 * gets its answer, `server shutting down`, as in PgBouncer, which
		 * exits at its next tick; then those left are told the same
		 * rather than cut off by the exit (doc/pgbouncer.1.md, "SHUTDOWN").
		 * Their closes call us again.
		 */
		usec_t now = get_time_usec();
		if (!wk.servers_gone_at)
			wk.servers_gone_at = now;
		if (now - wk.servers_gone_at < SHUTDOWN_LINGER)
			return; /* the janitor calls again */
		wk.shutdown_closing = true;
		close_all_clients("server shutting down");
		log_info("server connections dropped, exiting");
		worker_exit();
	}
	if (wk.run_state == RUN_DRAINING && clients <= 0) {
		if (wk.slot)
			atomic_store(&wk.slot->state, SLOT_EXITING);
		log_info("worker %d drained, exiting", wk.id);
		worker_exit();
	}
}

void worker_socket_gone(PgSocket *s)
{
	(void)s;
	worker_check_shutdown();
}

static void drop_waiting_clients(const char *reason)
{
	List *i;
	list_for_each(i, &wk.pools) worker_close_clients(&container_of(i, PgPool, node)->waiting_clients, reason);
}

/* Close idle servers (used by PAUSE and the safe shutdown). */
void worker_close_idle_servers(void)
{
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		List *lists[] = {&p->idle_servers, &p->used_servers};
		for (int l = 0; l < 2; l++) {
			List *j, *t;
			list_for_each_safe(j, lists[l], t)
			    disconnect_server(container_of(j, PgSocket, node), true, "pause mode");
		}
	}
}

void worker_start_shutdown(RunState mode)
{
	if (wk.run_state != RUN_ACTIVE && wk.run_state != RUN_DRAINING)
		return;
	wk.run_state = mode;
	close_tcp_listeners();
	if (mode == RUN_SHUTDOWN_SERVERS) {
		wk.pause_mode = P_PAUSE;
		drop_waiting_clients("server shutting down");
		worker_close_idle_servers();
	}
	worker_check_shutdown();
}

void worker_apply_log_settings(void)
{
	LogSettings ls = {.logfile = wk.cf.g.logfile,
	                  .to_stderr = log_to_stderr_setting(),
	                  .syslog = wk.cf.g.syslog != 0,
	                  .syslog_ident = wk.cf.g.syslog_ident,
	                  .syslog_facility = wk.cf.g.syslog_facility,
	                  .verbose = wk.cf.g.verbose};
	log_configure(&ls);
}

void worker_tune_listeners(void)
{
	for (int i = 0; i < wk.n_listeners; i++)
		if (wk.listeners[i].fd >= 0 && !wk.listeners[i].is_unix)
			tune_tcp_listener(wk.listeners[i].fd);
}

bool worker_tell_master(const ChannelMsg *m, int fd)
{
	if (!wk.master_out) {
		errno = EPIPE;
		return false;
	}
	return channel_out_send(wk.master_out, m, fd);
}

void worker_tell_master_set(const char *name, const char *value, uint64_t missed)
{
	if (!wk.master_out)
		return;
	size_t nl = strlen(name) + 1, vl = strlen(value) + 1;
	int fd = memfd_create("pgbouncer-set", MFD_CLOEXEC);
	bool ok = fd >= 0 && write(fd, name, nl) == (ssize_t)nl && write(fd, value, vl) == (ssize_t)vl;
	ChannelMsg m = {.type = CH_SET};
	memcpy(&m.arg, &missed, sizeof(missed));
	if (!ok)
		log_warning("SET %s: the master was not told (could not write it: %s): workers started later use the "
		            "file's value",
		            name, strerror(errno));
	else
		(void)worker_tell_master(&m, fd); /* a failure is logged by the channel */
	if (fd >= 0)
		close(fd);
}

bool worker_tls_reload(char *err, size_t errlen)
{
	bool hba_cert = wk.cf.g.auth_type == AUTH_HBA && wk.hba && hba_uses_cert(wk.hba);
	if (!tls_contexts_reload(&wk.tls, &wk.cf.g, hba_cert, err, errlen))
		return false;
	if (wk.tls.server_changed) {
		/* servers finish their current client, then reconnect with the new settings */
		List *i;
		list_for_each(i, &wk.pools)
		{
			PgPool *pool = container_of(i, PgPool, node);
			pool_mark_close_needed(pool);
			pool->last_login_failed = false; /* the new settings deserve a try */
		}
	}
	return true;
}

void worker_clients_add(int delta)
{
	wk.client_count += delta;
	if (wk.slot)
		budget_clients_add(&wk.shm->budget, wk.id, delta);
}

void worker_client_gone(PgSocket *c)
{
	if (c->is_private) {
		wk.client_count--;
		wk.private_clients--;
	} else {
		worker_clients_add(-1);
	}
}

int worker_global_clients(void)
{
	if (!wk.slot)
		return wk.client_count;
	/* during an online restart the old tree's clients count too (doc/workers.md "Upgrading") */
	int old_tree = atomic_load(&wk.shm->scaler.predecessor_live) ? budget_foreign_clients() : 0;
	return budget_clients(&wk.shm->budget) + old_tree;
}

void worker_count_tls_handshake(void)
{
	if (wk.slot)
		atomic_fetch_add(&wk.slot->tls_handshakes, 1);
}

void worker_clock_tick(void)
{
	wk.now = get_time_usec();
}

_Static_assert(PGSTATS_FIELDS == SHM_STATS_FIELDS, "the slot publishes every PgStats counter");

void worker_stats_total(PgStats *out)
{
	*out = wk.retired_stats;
	List *i;
	list_for_each(i, &wk.pools) pgstats_add(out, &container_of(i, PgPool, node)->stats);
}

/*
 * Publish busy time (this process's CPU time), run-queue wait (from the
 * kernel's schedstat; doc/workers.md, "The saturation signal") and
 * counters for the master.
 */
void worker_publish(void)
{
	WorkerSlot *slot = wk.slot;
	if (!slot)
		return;
	pools_stats_flush();
	struct timespec cpu, mono;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
	clock_gettime(CLOCK_MONOTONIC, &mono);
	PgStats total;
	worker_stats_total(&total);
	const uint64_t *tv = (const uint64_t *)&total;
	for (size_t f = 0; f < PGSTATS_FIELDS; f++)
		atomic_store(&slot->stats[f], tv[f]);
	uint32_t cl_active = 0, cl_waiting = 0, sv_active = 0, sv_idle = 0;
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		cl_active += (uint32_t)p->n_state[CL_ACTIVE];
		cl_waiting += (uint32_t)(p->n_state[CL_WAITING] + p->n_state[CL_WAITING_LOGIN]);
		sv_active += (uint32_t)p->n_state[SV_ACTIVE];
		sv_idle += (uint32_t)p->n_state[SV_IDLE];
	}
	/* monotonic: freed pools (auto-db expiry) leave their numbers in wk.retired_stats */
	atomic_store(&slot->xact_count, total.xact_count);
	atomic_store(&slot->query_count, total.query_count);
	atomic_store(&slot->bytes_in, total.client_bytes);
	atomic_store(&slot->bytes_out, total.server_bytes);
	atomic_store(&slot->accepted, wk.accepted);
	atomic_store(&slot->cl_active, cl_active);
	atomic_store(&slot->cl_waiting, cl_waiting);
	atomic_store(&slot->sv_active, sv_active);
	atomic_store(&slot->sv_idle, sv_idle);
	uint32_t movable, unmovable;
	hooks.count_movable(&movable, &unmovable); /* migrate_count() */
	atomic_store(&slot->cl_movable, movable);
	atomic_store(&slot->cl_unmovable, unmovable);
	atomic_store(&slot->moved_in, wk.moved_in);
	atomic_store(&slot->moved_out, wk.moved_out);
	atomic_store(&slot->move_failed, wk.move_failed);
	uint64_t on_cpu, wait = SHM_WAIT_UNKNOWN;
	if (!schedstat_read(wk.schedstat_fd, &on_cpu, &wait))
		wait = SHM_WAIT_UNKNOWN;
	atomic_store(&slot->busy_ns, (uint64_t)cpu.tv_sec * 1000000000u + (uint64_t)cpu.tv_nsec);
	atomic_store(&slot->wait_ns, wait);
	atomic_store(&slot->sample_time_ns, (uint64_t)mono.tv_sec * 1000000000u + (uint64_t)mono.tv_nsec);
}

void worker_add_listener(int fd, uint32_t id, bool is_unix)
{
	for (int i = 0; !is_unix && i < wk.n_listeners; i++)
		if (wk.listeners[i].fd >= 0 && !wk.listeners[i].is_unix && wk.listeners[i].id == id) {
			close(fd); /* already accepting on it: the master's hand-over crossed our own */
			return;
		}
	WorkerListener *l = NULL;
	for (int i = 0; i < wk.n_listeners && !l; i++)
		if (wk.listeners[i].fd < 0 && !wk.listeners[i].active)
			l = &wk.listeners[i]; /* one dropped before: slots come and go with hand-overs */
	if (!l && wk.n_listeners >= WORKER_MAX_LISTENERS) {
		log_warning("too many listeners; closing the handed-over one");
		close(fd);
		return;
	}
	if (!l)
		l = &wk.listeners[wk.n_listeners++];
	*l = (WorkerListener){.fd = fd, .id = id, .is_unix = is_unix};
	if (!is_unix)
		tune_tcp_listener(fd);
	event_assign(&l->ev, wk.base, fd, EV_READ | EV_PERSIST, on_accept, l);
	if (wk.run_state == RUN_ACTIVE && wk.pause_mode != P_SUSPEND) {
		event_add(&l->ev, NULL);
		l->active = true;
	}
}

void worker_drop_listener(uint32_t id)
{
	for (int i = 0; i < wk.n_listeners; i++) {
		WorkerListener *l = &wk.listeners[i];
		if (l->fd >= 0 && !l->is_unix && l->id == id)
			close_listener(l);
	}
}
