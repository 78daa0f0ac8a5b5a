/*
 * The worker process: a libevent loop that accepts clients on the
 * listeners inherited from the master, runs the janitor and stats timers,
 * reacts to the signals the master passes on, and exits when the master
 * goes away or a shutdown has finished.
 */
#include "autoconfig.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdnoreturn.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/budget.h"
#include "common/channel.h"
#include "common/log.h"
#include "common/schedstat.h"
#include "common/util.h"
#include "worker/dns.h"
#include "worker/admin.h"
#include "worker/admin_fanout.h"
#include "worker/admin_state.h"
#include "worker/auth.h"
#include "worker/auth_query.h"
#include "worker/auth_threads.h"
#include "worker/cancel.h"
#include "worker/client.h"
#include "worker/hooks.h"
#include "worker/janitor.h"
#include "worker/migrate.h"
#include "worker/objects.h"
#include "worker/pool.h"
#include "worker/sendq.h"
#include "worker/server.h"
#include "worker/worker.h"

Worker wk;

/* How long listeners rest after accept() lacked a resource (worker_accept_failed()). */
#define ACCEPT_REST_USEC USEC_PER_SEC

/* How long an exiting worker waits for room for what it still has to tell the master. */
#define WORKER_EXIT_FLUSH_MS 1000

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
	admin_fanout_accept_pause(!arm);
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
	/* take what the kernel has queued, a bounded number per wakeup for fairness */
	for (int n = 0; n < 32; n++) {
		/* the peer's address comes with it: no getpeername() per login */
		struct sockaddr_storage peer;
		socklen_t peer_len = sizeof(peer);
		int cfd = accept4(fd, (struct sockaddr *)&peer, &peer_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (cfd < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ||
			    !worker_accept_failed(errno, NULL))
				return;
			continue;
		}
		wk.now = get_time_usec();
		client_accept(cfd, l->is_unix, false, &peer, peer_len);
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
static noreturn void worker_exit(void)
{
	if (wk.master_out)
		(void)channel_out_finish(wk.master_out, WORKER_EXIT_FLUSH_MS);
	exit(0);
}

/* How long a safe shutdown goes on after its last server closed (a janitor tick). */
#define SHUTDOWN_LINGER (USEC_PER_SEC / 3)

/* Close every client of one state list with `reason`. */
static void close_clients(List *list, const char *reason)
{
	List *j, *t;
	list_for_each_safe(j, list, t) disconnect_client(container_of(j, PgSocket, node), true, "%s", reason);
}

/* Close every client still logging in or in a pool, other workers' consoles aside, with `reason`. */
static void close_all_clients(const char *reason)
{
	close_clients(&wk.login_clients, reason);
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
	list_for_each(i, &wk.pools) close_clients(&container_of(i, PgPool, node)->waiting_clients, reason);
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

void worker_reload(void)
{
	Config next;
	wk.reload_failed = true; /* until everything below has loaded */
	if (!config_reload(&wk.cf, wk.cmdline_verbose, &next))
		return;
	config_keep_boot_values(&next, &wk.cf);
	config_free(&wk.cf);
	wk.cf = next;
	wk.cf_gen++;
	worker_apply_log_settings();
	objects_load_userlist(false);
	auth_load_hba();
	objects_load_databases();
	wk.cf_gen++; /* again: closes during the loading above may have cached values of the half-loaded state */
	worker_tune_listeners();
	char terr[TLS_ERR_LEN];
	if (!worker_tls_reload(terr, sizeof(terr))) {
		log_error("%s", terr);
		log_error("TLS configuration could not be reloaded, keeping old configuration");
		return;
	}
	wk.reload_failed = false;
}

bool worker_tell_master(const ChannelMsg *m, int fd)
{
	if (!wk.master_out) {
		errno = EPIPE;
		return false;
	}
	return channel_out_send(wk.master_out, m, fd);
}

void worker_tell_master_set(const char *name, const char *value)
{
	if (!wk.master_out)
		return;
	size_t nl = strlen(name) + 1, vl = strlen(value) + 1;
	int fd = memfd_create("pgbouncer-set", MFD_CLOEXEC);
	bool ok = fd >= 0 && write(fd, name, nl) == (ssize_t)nl && write(fd, value, vl) == (ssize_t)vl;
	ChannelMsg m = {.type = CH_SET};
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

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	wk.now = get_time_usec();
	switch (sig) {
	case SIGHUP:
		worker_reload();
		wk.reloads++;
		if (wk.slot)
			atomic_store(&wk.slot->config_gen, atomic_load(&wk.shm->scaler.config_gen));
		admin_wait_close_check(); /* a console's RELOAD waits for this */
		break;
	case SIGTERM:
		if (wk.run_state == RUN_SHUTDOWN_CLIENTS || wk.run_state == RUN_SHUTDOWN_SERVERS)
			worker_exit();
		worker_start_shutdown(RUN_SHUTDOWN_CLIENTS);
		break;
	case SIGINT:
		if (wk.run_state == RUN_SHUTDOWN_CLIENTS || wk.run_state == RUN_SHUTDOWN_SERVERS)
			worker_exit();
		worker_start_shutdown(RUN_SHUTDOWN_SERVERS);
		break;
	case SIGQUIT:
		worker_exit();
	case SIGUSR1:
		if (wk.pause_mode != P_NONE) {
			log_info("got SIGUSR1, but already paused/suspended");
		} else {
			log_info("got SIGUSR1, pausing all activity");
			wk.pause_mode = P_PAUSE;
			worker_close_idle_servers();
		}
		break;
	case SIGUSR2:
		if (wk.run_state == RUN_SHUTDOWN_CLIENTS || wk.run_state == RUN_SHUTDOWN_SERVERS) {
			log_info("got SIGUSR2 while shutting down, ignoring");
		} else if (wk.pause_mode == P_NONE) {
			log_info("got SIGUSR2, but not paused/suspended");
		} else {
			log_info("got SIGUSR2, continuing from PAUSE/SUSPEND");
			admin_resume_all();
		}
		break;
	}
}

void worker_clock_tick(void)
{
	wk.now = get_time_usec();
}

static void on_janitor(evutil_socket_t fd, short what, void *arg)
{
	janitor_run();
	worker_accept_resume_due();
	if (wk.run_state == RUN_SHUTDOWN_SERVERS)
		worker_check_shutdown();
}

static void on_stats(evutil_socket_t fd, short what, void *arg)
{
	worker_clock_tick();
	stats_period_tick();
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
	migrate_count(&movable, &unmovable);
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

static void on_publish(evutil_socket_t fd, short what, void *arg)
{
	wk.now = get_time_usec();
	if (wk.pause_mode != P_SUSPEND)
		pool_budget_tick();
	migrate_handoff_tick(); /* retiring (-R): clients that became movable go to the new tree */
	migrate_drain_check();
	worker_publish();
}

static WorkerListener *add_listener(int fd, uint32_t id, bool is_unix)
{
	for (int i = 0; !is_unix && i < wk.n_listeners; i++)
		if (wk.listeners[i].fd >= 0 && !wk.listeners[i].is_unix && wk.listeners[i].id == id) {
			close(fd); /* already accepting on it: the master's hand-over crossed our own */
			return &wk.listeners[i];
		}
	WorkerListener *l = NULL;
	for (int i = 0; i < wk.n_listeners && !l; i++)
		if (wk.listeners[i].fd < 0 && !wk.listeners[i].active)
			l = &wk.listeners[i]; /* one dropped before: slots come and go with hand-overs */
	if (!l && wk.n_listeners >= WORKER_MAX_LISTENERS) {
		log_warning("too many listeners; closing the handed-over one");
		close(fd);
		return NULL;
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
	return l;
}

static void drop_listener(uint32_t id)
{
	for (int i = 0; i < wk.n_listeners; i++) {
		WorkerListener *l = &wk.listeners[i];
		if (l->fd >= 0 && !l->is_unix && l->id == id)
			close_listener(l);
	}
}

static void on_drain_timeout(evutil_socket_t fd, short what, void *arg)
{
	worker_clock_tick();
	log_info("worker_drain_timeout reached, closing the remaining clients");
	close_clients(&wk.login_clients, "server shutting down");
	List *p;
	list_for_each(p, &wk.pools)
	{
		PgPool *pool = container_of(p, PgPool, node);
		close_clients(&pool->active_clients, "server shutting down");
		close_clients(&pool->waiting_clients, "server shutting down");
	}
	worker_check_shutdown();
}

/* Scale-down: stop accepting (the master gave our listener slot to another worker), finish, exit. */
static void start_drain(int64_t timeout_ms)
{
	if (wk.run_state != RUN_ACTIVE)
		return;
	log_info("worker %d draining", wk.id);
	for (int i = 0; i < wk.n_listeners; i++) {
		WorkerListener *l = &wk.listeners[i];
		if (l->fd < 0)
			continue;
		if (l->active)
			event_del(&l->ev);
		l->active = false;
		close(l->fd);
		l->fd = -1;
	}
	wk.run_state = RUN_DRAINING;
	migrate_stop_old_tree_intakes();
	if (timeout_ms > 0) {
		struct timeval tv = {(time_t)(timeout_ms / 1000), (suseconds_t)((timeout_ms % 1000) * 1000)};
		wk.drain_timeout_ev = evtimer_new(wk.base, on_drain_timeout, NULL);
		evtimer_add(wk.drain_timeout_ev, &tv);
	}
	worker_check_shutdown();
}

static void on_master(evutil_socket_t fd, short what, void *arg)
{
	for (;;) {
		ChannelMsg m;
		int rfd;
		int r = channel_recv(fd, &m, &rfd);
		if (r == 0) {
			/* the master is gone: nobody supervises us any more */
			log_warning("master process went away, exiting");
			exit(0);
		}
		if (r < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK) {
				log_warning("control channel failed: %s; exiting", strerror(errno));
				exit(0);
			}
			return;
		}
		wk.now = get_time_usec();
		switch (m.type) {
		case CH_TAKE_LISTENER:
			if (rfd >= 0)
				add_listener(rfd, m.id, false);
			break;
		case CH_DROP_LISTENER:
			drop_listener(m.id);
			break;
		case CH_DRAIN:
			wk.retiring = m.id == 1;
			start_drain(m.arg);
			break;
		case CH_MIGRATE:
			if (rfd >= 0)
				migrate_give(rfd, (int)m.id, m.arg); /* it closes rfd */
			break;
		case CH_HANDOFF:
			if (rfd >= 0)
				migrate_handoff_start(rfd); /* kept until we exit */
			break;
		case CH_ADOPT:
			if (rfd >= 0)
				migrate_take(rfd, (int)m.id, m.arg == 1); /* read until the giver closes its end */
			break;
		case CH_CONSOLE_RESUME:
			admin_state_master_resume();
			break;
		case CH_CONSOLE_SYNC:
			if (rfd >= 0) {
				admin_state_sync(rfd);
				close(rfd);
			}
			break;
		case CH_CANCEL: {
			uint8_t key[CANCEL_KEY_LEN];
			memcpy(key, &m.arg, CANCEL_KEY_LEN);
			cancel_forwarded(key, rfd); /* it closes rfd once the cancel is delivered */
			break;
		}
		default:
			if (rfd >= 0)
				close(rfd);
			log_warning("unknown control message %u", m.type);
		}
	}
}

/*
 * The calls that go up a room, set before anything can use them
 * (include/worker/hooks.h, where each is explained).
 */
static void connect_rooms(void)
{
	SocketHook *cl = hooks.client_gone, *sv = hooks.server_gone;
	cl[CLIENT_GONE_LOOKUP] = auth_query_client_gone;
	cl[CLIENT_GONE_AUTH_JOB] = auth_job_client_gone;
	cl[CLIENT_GONE_SERVER] = server_client_gone;
	cl[CLIENT_GONE_MOVED] = migrate_client_closed;
	cl[CLIENT_GONE_COUNT] = worker_client_gone;
	cl[CLIENT_GONE_CONSOLE] = admin_fanout_client_gone;
	cl[CLIENT_GONE_SHUTDOWN] = worker_socket_gone;
	sv[SERVER_GONE_LOOKUP] = auth_query_server_gone;
	sv[SERVER_GONE_CANCEL] = cancel_server_gone;
	sv[SERVER_GONE_LAUNCH] = server_closed;
	sv[SERVER_GONE_SHUTDOWN] = worker_socket_gone;
	hooks.pool_gone = pool_budget_forget;
	hooks.db_added = admin_state_inherit_db;
	hooks.lookups_waiting = auth_query_waiting_slow;
	hooks.lookups_wake = auth_query_wake_slow;
	hooks.lookups_fail = auth_query_pool_failed;
	hooks.lookup_packet = auth_query_server_packet;
	hooks.console_cancel = admin_console_cancel;
	hooks_check();
}

int worker_main(int id, Config *cf, const TlsContexts *tls, const ConsoleState *console, WorkerSocket *sockets, int n,
                int master_fd, int cmdline_verbose, ShmSegment *shm)
{
	memset(&wk, 0, sizeof(wk));
	connect_rooms();
	wk.id = id;
	wk.cf = *cf; /* the worker owns its copy from now on */
	/* the master built (and checked) the contexts; the worker holds its own references */
	tls_contexts_init(&wk.tls);
	if (tls) {
		wk.tls = *tls;
		wk.tls.server_key = xstrdup_or_null(tls->server_key);
		if (wk.tls.client_ctx)
			SSL_CTX_up_ref(wk.tls.client_ctx);
		if (wk.tls.server_ctx)
			SSL_CTX_up_ref(wk.tls.server_ctx);
	}
	wk.cmdline_verbose = cmdline_verbose;
	wk.listeners = xcalloc(WORKER_MAX_LISTENERS, sizeof(*wk.listeners));
	wk.master_fd = master_fd;
	wk.handoff_fd = -1;
	wk.drain_fd = -1;
	wk.shm = shm;
	wk.slot = shm && shm->magic == SHM_MAGIC && shm->slot_size == sizeof(WorkerSlot) ? &shm->slots[id] : NULL;
	wk.schedstat_fd = wk.slot ? schedstat_open_self() : -1;
	if (wk.slot) /* the master forked this worker with its current configuration */
		atomic_store(&wk.slot->config_gen, atomic_load(&shm->scaler.config_gen));
	wk.start_time = wk.now = get_time_usec();
	wk.stats_older_at = wk.stats_newer_at = wk.start_time;
	wk.base = event_base_new();
	if (!wk.base)
		fatal("event_base_new() failed");
	sbuf_set_wake_hook(worker_clock_tick);
	sbuf_set_loopcnt(&wk.cf.g.sbuf_loopcnt);
	objects_init();
	auth_load_hba();
	dns_init();

	static const int sigs[] = {SIGHUP, SIGTERM, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2};
	signal(SIGPIPE, SIG_IGN);
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
		wk.sig_ev[i] = evsignal_new(wk.base, sigs[i], on_signal, NULL);
		if (!wk.sig_ev[i] || evsignal_add(wk.sig_ev[i], NULL) < 0)
			fatal("could not install handler for signal %d", sigs[i]);
	}
	/* a PAUSE or SUSPEND of the console holds from the first accept on (doc/workers.md "Console state") */
	admin_state_inherit(console);
	for (int i = 0; i < n; i++)
		add_listener(sockets[i].fd, sockets[i].id, sockets[i].is_unix);
	free(sockets);
	struct timeval jt = {0, 333333};
	wk.janitor_ev = event_new(wk.base, -1, EV_PERSIST, on_janitor, NULL);
	event_add(wk.janitor_ev, &jt);
	struct timeval st = {wk.cf.g.stats_period, 0}; /* at least 1 s (the parameter table) */
	wk.stats_ev = event_new(wk.base, -1, EV_PERSIST, on_stats, NULL);
	event_add(wk.stats_ev, &st);
	if (master_fd >= 0) {
		int fl = fcntl(master_fd, F_GETFL);
		fcntl(master_fd, F_SETFL, fl | O_NONBLOCK);
		wk.master_ev = event_new(wk.base, master_fd, EV_READ | EV_PERSIST, on_master, NULL);
		event_add(wk.master_ev, NULL);
		wk.master_out = channel_out_new(wk.base, master_fd, "the master");
	}
	struct timeval pt = {0, 100000};
	wk.publish_ev = event_new(wk.base, -1, EV_PERSIST, on_publish, NULL);
	event_add(wk.publish_ev, &pt);
	worker_publish();
	admin_fanout_listen();
	if (wk.slot)
		atomic_store(&wk.slot->state, SLOT_ACTIVE);
	/* one pass at a time: the sends a pass queued are submitted together at its end (worker/sendq.h) */
	sbuf_init_sends();
	while (event_base_loop(wk.base, EVLOOP_ONCE) == 0) {
		sendq_flush();
		/*
		 * Retiring (-R) or draining: a client between two transactions is
		 * offered to the new tree or the other worker now that its answer
		 * is sent; a client that runs one after another is seldom between
		 * two at a tick (on_publish(), the master's move orders).
		 */
		if (wk.handoff_due) {
			wk.handoff_due = false;
			migrate_handoff_due();
			migrate_drain_due();
		}
	}
	return 0;
}
