/*
 * The worker's life, the top room (doc/architecture.md "Rooms of the
 * worker"): worker_main() connects the rooms, sets up the loop and runs it
 * one pass at a time; the signals the master passes on, its messages, the
 * janitor, stats and publish timers, reload and drain start here.
 */
#include "autoconfig.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/channel.h"
#include "common/filesnap.h"
#include "common/log.h"
#include "common/schedstat.h"
#include "common/util.h"
#include "worker/admin.h"
#include "worker/admin_fanout.h"
#include "worker/admin_state.h"
#include "worker/auth.h"
#include "worker/auth_query.h"
#include "worker/auth_threads.h"
#include "worker/cancel.h"
#include "worker/client.h"
#include "worker/dns.h"
#include "worker/hooks.h"
#include "worker/janitor.h"
#include "worker/migrate.h"
#include "worker/objects.h"
#include "worker/orphan.h"
#include "worker/pool.h"
#include "worker/recvq.h"
#include "worker/sendq.h"
#include "worker/server.h"
#include "worker/worker.h"
#include "worker_entry.h"

static void worker_reload(void)
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
			log_info("got SIGUSR2, continuing from %s", wk.pause_mode == P_PAUSE ? "PAUSE" : "SUSPEND");
			admin_resume_all();
		}
		break;
	}
}

static void on_janitor(evutil_socket_t fd, short what, void *arg)
{
	janitor_run();
	worker_accept_resume_due();
	worker_private_check();
	if (wk.run_state == RUN_SHUTDOWN_SERVERS)
		worker_check_shutdown();
}

static void on_stats(evutil_socket_t fd, short what, void *arg)
{
	worker_clock_tick();
	stats_period_tick();
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

static void on_drain_timeout(evutil_socket_t fd, short what, void *arg)
{
	worker_clock_tick();
	log_info("worker_drain_timeout reached, closing the remaining clients");
	worker_close_clients(&wk.login_clients, "server shutting down");
	List *p;
	list_for_each(p, &wk.pools)
	{
		PgPool *pool = container_of(p, PgPool, node);
		worker_close_clients(&pool->active_clients, "server shutting down");
		worker_close_clients(&pool->waiting_clients, "server shutting down");
	}
	worker_check_shutdown();
}

/* Scale-down: stop accepting (the master gave our listener slot to another worker), finish, exit. */
static void start_drain(int64_t timeout_ms)
{
	if (wk.run_state != RUN_ACTIVE)
		return;
	log_info("worker %d draining", wk.id);
	worker_listen_close();
	wk.run_state = RUN_DRAINING;
	migrate_stop_old_tree_intakes();
	if (timeout_ms > 0) {
		struct timeval tv = {(time_t)(timeout_ms / 1000), (suseconds_t)((timeout_ms % 1000) * 1000)};
		wk.drain_timeout_ev = evtimer_new(wk.base, on_drain_timeout, NULL);
		evtimer_add(wk.drain_timeout_ev, &tv);
	}
	worker_check_shutdown();
}

static void on_master(evutil_socket_t fd, short what, void *arg);

void worker_master_attach(int fd)
{
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	wk.master_fd = fd;
	wk.master_ev = event_new(wk.base, fd, EV_READ | EV_PERSIST, on_master, NULL);
	event_add(wk.master_ev, NULL);
	wk.master_out = channel_out_new(wk.base, fd, "the master");
}

/* EOF or an error on the control channel: the master (ours, or one that adopted us) is gone. */
static void master_gone(const char *why)
{
	event_free(wk.master_ev);
	wk.master_ev = NULL;
	channel_out_free(wk.master_out); /* what it did not read goes nowhere now */
	wk.master_out = NULL;
	close(wk.master_fd);
	wk.master_fd = -1;
	wk.parent_master = 0; /* our parent is someone else now: no signal to it (admin.c) */
	if (orphan_begin(why))
		return;
	log_warning("master process went away%s%s, exiting", why ? ": " : "", why ? why : "");
	exit(0);
}

static void on_master(evutil_socket_t fd, short what, void *arg)
{
	for (;;) {
		ChannelMsg m;
		int rfd;
		int r = channel_recv(fd, &m, &rfd);
		if (r == 0) {
			master_gone(NULL);
			return;
		}
		if (r < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				master_gone(strerror(errno));
			return;
		}
		wk.now = get_time_usec();
		switch (m.type) {
		case CH_TAKE_LISTENER:
			if (rfd >= 0)
				worker_add_listener(rfd, m.id, false);
			break;
		case CH_DROP_LISTENER:
			worker_drop_listener(m.id);
			break;
		case CH_DRAIN:
			wk.retiring = m.id == 1;
			start_drain(m.arg);
			break;
		case CH_SETTLE:
			wk.may_outlive = true;
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
		case CH_SET:
			if (rfd >= 0) {
				/* a console SET this worker missed while it started: "name\0value\0" */
				char buf[2048];
				ssize_t n = pread(rfd, buf, sizeof(buf) - 1, 0);
				close(rfd);
				if (n > 0) {
					buf[n] = '\0';
					size_t nl = strlen(buf);
					if (nl + 1 < (size_t)n)
						admin_apply_set(buf, buf + nl + 1);
				}
			}
			break;
		case CH_CANCEL: {
			uint8_t key[CANCEL_KEY_LEN];
			memcpy(key, &m.arg, CANCEL_KEY_LEN);
			cancel_forwarded(key, rfd,
			                 m.id == CANCEL_FINAL); /* it closes rfd once the cancel is delivered */
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
	cl[CLIENT_GONE_CANCEL] = cancel_client_gone;
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
	hooks.console.write_stats = admin_write_stats;
	hooks.console.abandon_part = admin_abandon_part;
	hooks.console.kill_here = admin_kill_here;
	hooks.console.disable_later = admin_disable_later;
	hooks.console.log_command_error = admin_log_error;
	hooks.console.report_state = admin_state_report;
	hooks.console.left_out = admin_state_left_out;
	hooks.accept = client_accept;
	hooks.count_movable = migrate_count;
	hooks_check();
}

int worker_main(int id, Config *cf, const TlsContexts *tls, const ConsoleState *console, WorkerSocket *sockets, int n,
                int master_fd, int cmdline_verbose, ShmSegment *shm, int shm_fd)
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
	wk.master_fd = -1;
	wk.parent_master = getppid();
	wk.shm_fd = shm_fd;
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
	/* the auth files as the master read them at start or the last RELOAD (include/common/filesnap.h) */
	filesnap_replay();
	objects_init();
	auth_load_hba();
	filesnap_clear();
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
		worker_add_listener(sockets[i].fd, sockets[i].id, sockets[i].is_unix);
	free(sockets);
	struct timeval jt = {0, 333333};
	wk.janitor_ev = event_new(wk.base, -1, EV_PERSIST, on_janitor, NULL);
	event_add(wk.janitor_ev, &jt);
	struct timeval st = {wk.cf.g.stats_period, 0}; /* at least 1 s (the parameter table) */
	wk.stats_ev = event_new(wk.base, -1, EV_PERSIST, on_stats, NULL);
	event_add(wk.stats_ev, &st);
	if (master_fd >= 0)
		worker_master_attach(master_fd);
	struct timeval pt = {0, 100000};
	wk.publish_ev = event_new(wk.base, -1, EV_PERSIST, on_publish, NULL);
	event_add(wk.publish_ev, &pt);
	worker_publish();
	worker_private_listen();
	if (wk.slot) {
		/* only from starting: a master that drained us meanwhile has marked the slot draining */
		uint32_t starting = SLOT_STARTING;
		atomic_compare_exchange_strong(&wk.slot->state, &starting, SLOT_ACTIVE);
	}
	/* one pass at a time: the sends a pass queued are submitted together at its end (worker/sendq.h) */
	sbuf_init_sends();
	sbuf_init_receives(wk.base);
	while (event_base_loop(wk.base, EVLOOP_ONCE) == 0) {
		wk.loop_pass++;
		sendq_flush();
		recvq_submit(); /* receives started and stopped in the pass (worker/recvq.h) */
		/*
		 * Sockets closed in this pass are freed now that no callback holds
		 * them, into the cache of objects.c: at the janitor's 3 Hz the
		 * cache overflowed under churn and each login had its calloc().
		 */
		socket_free_justfree();
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
