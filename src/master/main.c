/*
 * The master process: command line, configuration, pidfile, daemonizing,
 * listening sockets and signals. It never touches client traffic; the
 * pooling code lives in the workers it supervises.
 */
#include "autoconfig.h"

#include <ares.h>
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <libgen.h>
#include <openssl/crypto.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef HAVE_SYSTEMD
#include <dlfcn.h>
#include <systemd/sd-daemon.h>
#endif

#include "common/config.h"
#include "common/filesnap.h"
#include "common/log.h"
#include "common/util.h"
#include "master/listen.h"
#include "master/metrics.h"
#include "master/pidfile.h"
#include "master/supervisor.h"
#include "master/upgrade.h"
#include "shm.h"
#include "common/hba.h"
#include "common/scram.h"
#include "common/userlist.h"

/* Everything the master owns. */
typedef struct Master {
	Config cf;               /* the running configuration */
	TlsContexts tls;         /* checked at start and on reload; new workers start with them */
	ListenSet listeners;     /* sockets created at start, kept until exit */
	struct event_base *base; /* the master's event loop */
	struct event *sig_events[8];
	struct event *chld_event; /* SIGCHLD; held here like sig_events, so it is never unreachable memory */
	const char *progname;
	int cmdline_verbose;       /* number of -v */
	bool quiet;                /* -q */
	bool daemon;               /* -d */
	bool detached;             /* -d, once daemonized: stderr is /dev/null */
	bool shutting_down;        /* SIGTERM/SIGINT received */
	bool retired;              /* a new master took over (-R): our workers drain, then we exit */
	pid_t worker_pid;          /* the worker process, 0 if none */
	int worker_ctl;            /* write end of the worker's control pipe */
	struct event *respawn_ev;  /* delayed respawn after a crash */
	int crashes;               /* recent crashes, for back-off */
	char private_dir[108];     /* the workers' private sockets (mode 0700), "" = none */
	bool private_dir_made;     /* ours to remove at exit */
	bool handed;               /* -R: a new master committed; we serve out our grace period */
	bool in_grace;             /* we took over; the old tree may still resume (UPGRADE_GRACE_S) */
	struct event *orphan_scan; /* every second: orphans to adopt (on_orphan_scan()) */
} Master;

static Master master;

static void usage(FILE *out)
{
	fprintf(out,
	        "%s is a connection pooler for PostgreSQL that uses every CPU core.\n"
	        "\n"
	        "Usage:\n"
	        "  %s [OPTION]... CONFIG_FILE\n"
	        "\n"
	        "Options:\n"
	        "  -d, --daemon         run in the background (needs pidfile in the config)\n"
	        "  -q, --quiet          do not log to stderr\n"
	        "  -v, --verbose        log more; repeat for even more\n"
	        "  -u, --user=USERNAME  switch to this Unix user after start\n"
	        "  -R, --reboot         online restart: take over from the running pgbouncer\n"
	        "  -V, --version        print version information and exit\n"
	        "  -h, --help           print this help and exit\n",
	        master.progname, master.progname);
}

static void print_version(void)
{
	printf("PgBouncer %s\n", PACKAGE_VERSION);
	printf("libevent %s\n", event_get_version());
	printf("adns: c-ares %s\n", ares_version(NULL));
	printf("tls: %s\n", OpenSSL_version(OPENSSL_VERSION));
}

static void apply_log_settings(const Config *cf)
{
	LogSettings ls = {
	    .logfile = cf->g.logfile,
	    .to_stderr = !master.quiet && !master.detached,
	    .syslog = cf->g.syslog != 0,
	    .syslog_ident = cf->g.syslog_ident,
	    .syslog_facility = cf->g.syslog_facility,
	    .verbose = cf->g.verbose,
	};
	log_configure(&ls);
}

/* What workers left in the private directory: worker.<id>/.s.PGSQL.<port> (a worker that died). */
static void remove_private_sockets(void)
{
	DIR *d = opendir(master.private_dir);
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		char path[sizeof(master.private_dir) + 300];
		if (strncmp(e->d_name, "worker.", 7) != 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s/.s.PGSQL.%d", master.private_dir, e->d_name,
		         master.cf.g.listen_port);
		unlink(path);
		snprintf(path, sizeof(path), "%s/%s", master.private_dir, e->d_name);
		rmdir(path);
	}
	closedir(d);
}

/*
 * The directory of the workers' private sockets, where a console reaches
 * one specific worker (admin fan-out): only this user may enter it. Made
 * after the listeners, so that a second instance on the same port fails
 * before it touches ours.
 */
static void make_private_dir(const CfGlobals *g, bool takeover)
{
	if (!private_socket_dir(g->unix_socket_dir, g->listen_port, master.private_dir, sizeof(master.private_dir))) {
		log_warning("the private socket directory name would be too long: workers get no private socket");
		master.private_dir[0] = '\0';
		return;
	}
	if (mkdir(master.private_dir, 0700) < 0) {
		struct stat st;
		if (errno != EEXIST)
			fatal("mkdir(%s) failed: %s", master.private_dir, strerror(errno));
		if (lstat(master.private_dir, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid()) {
			/*
			 * Someone else has the name (in a shared directory such as /tmp
			 * any user can take it): not ours to use or remove. A directory
			 * of a name nobody can guess serves instead.
			 */
			char alt[sizeof(master.private_dir)];
			int n = snprintf(alt, sizeof(alt), "%s.XXXXXX", master.private_dir);
			if (n < 0 || (size_t)n >= sizeof(alt) || (size_t)n + 27 >= 108 || !mkdtemp(alt)) {
				log_warning(
				    "%s is not a directory of this user, and no other could be made: workers get no "
				    "private socket",
				    master.private_dir);
				master.private_dir[0] = '\0';
				private_socket_dir_override(NULL);
				return;
			}
			log_warning(
			    "%s is not a directory of this user (another user's, or not a directory): using %s instead",
			    master.private_dir, alt);
			pgb_strlcpy(master.private_dir, alt, sizeof(master.private_dir));
			private_socket_dir_override(alt);
		} else {
			if (chmod(master.private_dir, 0700) < 0)
				fatal("chmod(%s) failed: %s", master.private_dir, strerror(errno));
			/* at an online restart they are the old workers', still serving */
			if (!takeover)
				remove_private_sockets();
		}
	}
	/* taking over, the directory becomes ours only once the old master let go (main()) */
	master.private_dir_made = !takeover;
}

/* -R: a running master's control socket; else (or without -R) the adoption sockets of orphaned workers. */
static bool try_tree_dir(const char *dir, Takeover *tk, bool master_too)
{
	return (master_too && upgrade_connect(dir, tk)) || upgrade_find_orphans(dir, tk);
}

/*
 * The running tree's control socket (-R, master_too), or the workers of a
 * tree whose master died, are in its private directory, the usual name
 * or, when another user held that name, a directory of that name with a
 * random suffix (make_private_dir()). Only directories of this user are
 * tried; upgrade_connect() and upgrade_find_orphans() check the peer too.
 * The directory found becomes ours as well.
 */
static bool find_running_tree(const CfGlobals *g, Takeover *tk, bool master_too)
{
	char dir[sizeof(master.private_dir)];
	if (!private_socket_dir(g->unix_socket_dir, g->listen_port, dir, sizeof(dir)))
		return false;
	if (try_tree_dir(dir, tk, master_too))
		return true;
	char parent[sizeof(dir)], *slash;
	pgb_strlcpy(parent, dir, sizeof(parent));
	if (!(slash = strrchr(parent, '/')))
		return false;
	*slash = '\0';
	const char *base = slash + 1;
	size_t blen = strlen(base);
	DIR *d = opendir(parent[0] ? parent : "/");
	if (!d)
		return false;
	bool found = false;
	struct dirent *e;
	while (!found && (e = readdir(d)) != NULL) {
		/* "<name>.XXXXXX", as mkdtemp() made it */
		if (strncmp(e->d_name, base, blen) != 0 || e->d_name[blen] != '.' || strlen(e->d_name) != blen + 7)
			continue;
		char alt[sizeof(dir)];
		int n = snprintf(alt, sizeof(alt), "%s/%s", parent, e->d_name);
		if (n < 0 || (size_t)n >= sizeof(alt))
			continue;
		if (try_tree_dir(alt, tk, master_too)) {
			log_info("online restart: the running process uses the private directory %s", alt);
			private_socket_dir_override(alt);
			found = true;
		}
	}
	closedir(d);
	return found;
}

static void master_exit(int code);

/*
 * An older master's control connection closed. If it died before its
 * workers left (killed in its grace period after our -R), they serve on as
 * orphans: adopt them now, as at a start, without a grace period of our
 * own (we serve already). Tried a few times while they notice.
 */
static int late_tries;

/* Orphans waiting in the private directory now: adopt them. False: none (or not ours to adopt now). */
static bool adopt_orphans_now(void)
{
	if (master.shutting_down || master.retired || master.handed)
		return false;
	Takeover t = {.conn = -1, .shm_fd = -1};
	if (!upgrade_find_orphans(master.private_dir, &t))
		return false;
	/* their listening sockets and shared memory are the ones we took at -R or at our start */
	for (int i = 0; i < t.n; i++)
		close(t.s[i].fd);
	free(t.s);
	if (t.shm_fd >= 0)
		close(t.shm_fd);
	explicit_bzero(t.salt_key, sizeof(t.salt_key));
	supervisor_predecessor_add(t.orphan_pids, t.n_orphans);
	upgrade_commit(&t, NULL, master.base);
	/* within our own grace period they wait for its end (on_takeover_settled), as a start's orphans do */
	if (supervisor_settled())
		upgrade_release_orphans(supervisor_adopt_old, master.cf.g.worker_drain_timeout / 1000);
	return true;
}

static void adopt_late(evutil_socket_t fd, short what, void *arg)
{
	if (adopt_orphans_now())
		return;
	static const int delay_ms[] = {100, 300, 600, 1000, 2000};
	if (late_tries < (int)(sizeof(delay_ms) / sizeof(delay_ms[0])) && !master.shutting_down && !master.retired) {
		struct timeval tv = {0, delay_ms[late_tries] * 1000};
		tv.tv_sec = tv.tv_usec / 1000000;
		tv.tv_usec %= 1000000;
		late_tries++;
		event_base_once(master.base, -1, EV_TIMEOUT, adopt_late, NULL, &tv);
	}
}

/*
 * Every second, a look for orphans that appeared since: a worker of a dead
 * master that was busy (or stopped) when the others were adopted notices
 * later, and would otherwise shut down at worker_orphan_timeout beside a
 * running master. A scan is a readdir of the private directory.
 */
static void on_orphan_scan(evutil_socket_t fd, short what, void *arg)
{
	(void)adopt_orphans_now();
}

static void on_pred_gone(pid_t pid)
{
	(void)pid;
	late_tries = 0;
	adopt_late(-1, 0, NULL);
}

/*
 * The unix socket file and the private directory become ours to remove at
 * exit once the old tree can no longer resume: at the end of the grace
 * period, or when we say goodbye at a shutdown (the old master then hands
 * over at once). Within the grace period an exit of ours (fatal()) leaves
 * them to the old master, which carries on with them, or to the orphans,
 * which wait on them for another master.
 */
static void claim_files(void)
{
	if (!master.in_grace)
		return;
	master.in_grace = false;
	master.listeners.unix_borrowed = false;
	master.private_dir_made = master.private_dir[0] != '\0';
}

/* UPGRADE_GRACE_S after a take-over (-R or an adoption): the old tree hands over, our workers may outlive us. */
static void on_takeover_settled(evutil_socket_t fd, short what, void *arg)
{
	claim_files();
	if (master.shutting_down)
		return;
	/*
	 * Settled first: should we die between the two, our workers serve on
	 * beside orphans that still accept, rather than orphans that stopped
	 * accepting beside workers that exit with us.
	 */
	supervisor_settle();
	upgrade_release_orphans(supervisor_adopt_old, master.cf.g.worker_drain_timeout / 1000);
}

#define REBOOT_WAIT_MS 5000 /* -R: how long a running process that does not answer may take to answer or exit */

/* Removes what this process created; runs at fatal() and at a normal exit. */
static void cleanup_at_exit(void)
{
	upgrade_stop_listening();
	supervisor_kill_all();
	listen_close_all(&master.listeners);
	if (master.private_dir_made) {
		remove_private_sockets();
		if (rmdir(master.private_dir) < 0)
			log_warning("rmdir(%s) failed: %s", master.private_dir, strerror(errno));
	}
	pidfile_remove();
}

/*
 * sd_notify() of libsystemd, loaded the first time there is something to
 * tell, and only when NOTIFY_SOCKET says systemd listens: without it
 * sd_notify() does nothing, and a pooler started otherwise does not map
 * libsystemd and the five libraries it pulls in (1 MiB of an idle
 * pooler's memory, doc/benchmarks.md "Memory against PgBouncer 1.25.2, as
 * merged"). When it cannot be loaded, a warning says so once.
 */
#ifdef HAVE_SYSTEMD
static void systemd_send(const char *text)
{
	static __typeof__(sd_notify) *fn;
	static bool tried;
	if (!getenv("NOTIFY_SOCKET"))
		return;
	if (!tried) {
		tried = true;
		void *lib = dlopen("libsystemd.so.0", RTLD_NOW | RTLD_LOCAL);
		fn = lib ? (__typeof__(sd_notify) *)dlsym(lib, "sd_notify") : NULL;
		if (!fn) {
			const char *why = dlerror();
			log_warning("NOTIFY_SOCKET is set but libsystemd could not be loaded (%s): systemd is not told "
			            "where the pooler stands",
			            why ? why : "no sd_notify");
		}
	}
	if (fn)
		(void)fn(0, text);
}
#endif

/* Online restart, old side: the new master serves on our sockets. */
static void retire(pid_t new_pid)
{
	/* first: a scrape that came in now would find no active worker to ask */
	metrics_retire();
	log_info("online restart: pid %d took over; not accepting any more, finishing the clients", (int)new_pid);
#ifdef HAVE_SYSTEMD
	/* systemd follows the new master (a Type=notify unit; doc/workers.md "Upgrading") */
	char text[64];
	snprintf(text, sizeof(text), "MAINPID=%lu", (unsigned long)new_pid);
	systemd_send(text);
#endif
	master.retired = true;
	if (master.listeners.unix_sock.fd >= 0) {
		close(master.listeners.unix_sock.fd);
		master.listeners.unix_sock.fd = -1;
	}
	supervisor_retire();
	if (supervisor_live_workers() == 0)
		master_exit(0);
}

/*
 * Online restart, old side: the new master committed. The unix socket file,
 * the private directory and the pidfile are its now, within our grace
 * period too: an exit of ours (a signal, fatal()) leaves them alone.
 */
static void handed(pid_t new_pid)
{
	(void)new_pid;
	master.handed = true;
	master.listeners.unix_borrowed = true;
	master.private_dir_made = false;
	pidfile_forget();
}

static int export_listeners(int conn);

/* Online restart, old side: the new master died within the grace period; we are the pooler again. */
static void resume(pid_t dead_pid)
{
	(void)dead_pid;
	master.handed = false;
	master.listeners.unix_borrowed = false;
	master.private_dir_made = master.private_dir[0] != '\0';
	(void)pidfile_replace(master.cf.g.pidfile); /* serving: a failure is logged */
	upgrade_listen(master.base, master.private_dir, export_listeners, retire, supervisor_cancel_from_successor);
}

/* Online restart, old side: a new master asks for our sockets (conn -1: it gave up). */
static int export_listeners(int conn)
{
	if (conn >= 0 && (master.shutting_down || master.retired)) {
		log_warning("online restart refused: this process is shutting down");
		return -1;
	}
	char why[128];
	if (conn >= 0 && supervisor_paused_why(why, sizeof(why))) {
		/* its waiting clients could not move, nor be resumed (doc/workers.md "Upgrading") */
		log_warning("online restart refused: %s; RESUME first", why);
		return -1;
	}
	return supervisor_export(conn);
}

static void master_exit(int code)
{
	cleanup_at_exit();
	metrics_stop();
	if (master.orphan_scan)
		event_free(master.orphan_scan);
	if (master.base)
		event_base_free(master.base);
	config_free(&master.cf);
	exit(code);
}

static void switch_user(const char *name)
{
	if (!name || !*name)
		return;
	errno = 0;
	struct passwd *pw = getpwnam(name);
	if (!pw)
		fatal("could not find user '%s' to switch to", name);
	if (getuid() == pw->pw_uid && geteuid() == pw->pw_uid)
		return;
	if (initgroups(pw->pw_name, pw->pw_gid) < 0)
		fatal("initgroups() failed: %s", strerror(errno));
	if (setgid(pw->pw_gid) < 0)
		fatal("setgid() failed: %s", strerror(errno));
	if (setuid(pw->pw_uid) < 0)
		fatal("setuid() failed: %s", strerror(errno));
}

static void daemonize(const Config *cf)
{
	if (!cf->g.pidfile || !cf->g.pidfile[0])
		fatal("daemon needs pidfile configured");
	int fd = open("/dev/null", O_RDWR);
	if (fd < 0)
		fatal("open(/dev/null) failed: %s", strerror(errno));
	dup2(fd, STDIN_FILENO);
	dup2(fd, STDOUT_FILENO);
	dup2(fd, STDERR_FILENO);
	if (fd > STDERR_FILENO)
		close(fd);

	pid_t pid = fork();
	if (pid < 0)
		fatal("fork() failed: %s", strerror(errno));
	if (pid > 0)
		_exit(0);
	if (setsid() < 0)
		fatal("setsid() failed: %s", strerror(errno));
	pid = fork();
	if (pid < 0)
		fatal("fork() failed: %s", strerror(errno));
	if (pid > 0)
		_exit(0);
}

static void log_fd_limit(const Config *cf)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0) {
		log_warning("getrlimit() failed: %s", strerror(errno));
		return;
	}
	/* clients, plus a server per pool slot of every configured database, plus listeners and files */
	long expected = cf->g.max_client_conn + 10;
	for (int i = 0; i < cf->n_dbs; i++) {
		expected += config_db_pool_size(cf, &cf->dbs[i]) + config_db_reserve_pool_size(cf, &cf->dbs[i]);
	}
	log_info("kernel file descriptor limit: %llu (hard: %llu); max_client_conn: %d, max expected fd use: %ld",
	         (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max, cf->g.max_client_conn, expected);
}

/*
 * Tell systemd (a Type=notify unit; NOTIFY_SOCKET is set) where the tree
 * stands: READY=1 with the master's pid once it serves, RELOADING=1 /
 * READY=1 around a reload, STOPPING=1 at shutdown. Nothing without
 * NOTIFY_SOCKET or without libsystemd (doc/packaging.md).
 */
static void notify_systemd(const char *state)
{
	/* after an online restart the new master speaks for the service (doc/workers.md "Upgrading") */
	if (master.retired)
		return;
#ifdef HAVE_SYSTEMD
	char text[96];
	if (strcmp(state, "RELOADING=1") == 0) {
		/* systemd >= 253 wants the reload's start on the monotonic clock */
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		snprintf(text, sizeof(text), "RELOADING=1\nMONOTONIC_USEC=%llu",
		         (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000);
	} else if (strcmp(state, "READY=1") == 0) {
		snprintf(text, sizeof(text), "READY=1\nMAINPID=%lu", (unsigned long)getpid());
	} else {
		snprintf(text, sizeof(text), "%s", state);
	}
	systemd_send(text);
#else
	(void)state;
#endif
}

/*
 * The auth files of this configuration as read now, for the workers
 * forked from now on (include/common/filesnap.h): they load these bytes,
 * as the running workers did at start or RELOAD, and not an edit made
 * since then without a RELOAD.
 */
static void keep_auth_files(const Config *cf)
{
	char err[512];
	filesnap_record();
	if (cf->g.auth_file && *cf->g.auth_file) {
		UserList ul = {0};
		(void)userlist_load(&ul, cf->g.auth_file, err, sizeof(err));
		userlist_free(&ul);
	}
	if (cf->g.auth_type == AUTH_HBA && cf->g.auth_hba_file && *cf->g.auth_hba_file) {
		HbaRules rules;
		if (hba_load(&rules, cf->g.auth_hba_file, NULL, NULL, err, sizeof(err)))
			hba_free(&rules);
	}
	if (cf->g.auth_type == AUTH_HBA && cf->g.auth_ident_file && *cf->g.auth_ident_file) {
		IdentMap map;
		if (ident_load(&map, cf->g.auth_ident_file, NULL, NULL, err, sizeof(err)))
			ident_free(&map);
	}
	filesnap_record_end();
}

/* SIGHUP and RELOAD: a new configuration replaces the running one only if it loads completely. */
static bool reload_config(void)
{
	Config next;
	if (!config_reload(&master.cf, master.cmdline_verbose, &next))
		return false;
	config_keep_boot_values(&next, &master.cf);
	config_free(&master.cf);
	master.cf = next;
	apply_log_settings(&master.cf);
	/* each worker rebuilds its own; the master's are for workers started from now on */
	char terr[TLS_ERR_LEN];
	if (!tls_contexts_reload(&master.tls, &master.cf.g, hba_config_uses_cert(&master.cf.g), terr, sizeof(terr))) {
		/* PgBouncer's two lines (doc/tls.md, "Reloading certificates") */
		log_error("%s", terr);
		log_error("TLS configuration could not be reloaded, keeping old configuration");
	}
	keep_auth_files(&master.cf);
	supervisor_config_changed(&master.cf);
	return true;
}

/*
 * A console SET the workers applied (CH_SET): the master's configuration is
 * what the workers it starts from now on get, and what the scaler reads;
 * a RELOAD replaces it with the file's, as it does the workers'.
 */
static void on_console_set(const char *name, const char *value)
{
	char err[CF_ERRMSG_LEN];
	const CfParam *param = config_find_param(name);
	if (!param || !param->reloadable)
		return;
	if (!config_set_checked(&master.cf, name, value, err, sizeof(err))) {
		log_warning("console SET %s: not taken by the master: %s", name, err);
		return;
	}
	if (config_param_is_log(param))
		apply_log_settings(&master.cf);
	/* auth_type too: cert authentication asks for client certificates */
	if (config_param_is_tls(param) || strcmp(param->name, "auth_type") == 0) {
		char terr[TLS_ERR_LEN];
		if (!tls_contexts_reload(&master.tls, &master.cf.g, hba_config_uses_cert(&master.cf.g), terr,
		                         sizeof(terr)))
			log_error("%s", terr); /* the old set-up stays, as after a failed RELOAD */
	}
	supervisor_settings_changed();
}

static void on_child(evutil_socket_t sig, short what, void *arg)
{
	/* during a shutdown, or after an online restart, the tree exits with its last worker */
	if (supervisor_reap(master.shutting_down || master.retired)) {
		if (master.retired && !master.shutting_down)
			log_info("online restart: the last clients of this process left, exiting");
		master_exit(0);
	}
}

static void forward_signal(int sig)
{
	supervisor_signal_all(sig);
}

/*
 * SIGQUIT, or a second SIGTERM/SIGINT: the workers exit at once, and the
 * master after them, so that the pooler is gone when its pid is (a worker
 * that hangs is killed after FAST_EXIT_WAIT_MS).
 */
#define FAST_EXIT_WAIT_MS 3000

static void fast_exit(void)
{
	forward_signal(SIGQUIT);
	supervisor_wait_exit(FAST_EXIT_WAIT_MS);
	master_exit(0);
}

/*
 * SIGTERM (wait for the clients) or SIGINT (for the servers), or a console's
 * SHUTDOWN WAIT_FOR_* (console: the worker logged it). A signal during a
 * SUSPEND exits at once with status 1, as in PgBouncer: the suspended
 * clients could not finish, so the shutdown would never end; a console's
 * SHUTDOWN waits, the SUSPEND ends when its console leaves.
 */
static void start_shutdown(bool servers, bool console)
{
	int sig = servers ? SIGINT : SIGTERM;
	if (master.shutting_down) {
		if (!console)
			log_info("got %s while shutting down, fast exit", servers ? "SIGINT" : "SIGTERM");
		fast_exit();
	}
	master.shutting_down = true;
	notify_systemd("STOPPING=1");
	upgrade_goodbye();
	claim_files();
	if (!console) {
		if (servers)
			log_info("got SIGINT, shutting down, waiting for all servers connections to be released");
		else
			log_info("got SIGTERM, shutting down, waiting for all clients disconnect");
		if (supervisor_suspended()) {
			forward_signal(SIGQUIT);
			supervisor_wait_exit(FAST_EXIT_WAIT_MS);
			fatal("suspend was in progress, going down immediately");
		}
	}
	supervisor_close_tcp();
	forward_signal(sig);
	if (supervisor_live_workers() == 0)
		master_exit(0);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	if (sig == SIG_CONSOLE_SHUTDOWN_CLIENTS || sig == SIG_CONSOLE_SHUTDOWN_SERVERS) {
		start_shutdown(sig == SIG_CONSOLE_SHUTDOWN_SERVERS, true);
		return;
	}
	switch (sig) {
	case SIGHUP:
		log_info("got SIGHUP, re-reading config");
		notify_systemd("RELOADING=1");
		/* workers re-read only a file the master has validated */
		if (reload_config())
			forward_signal(SIGHUP);
		notify_systemd("READY=1");
		break;
	case SIGTERM:
	case SIGINT:
		start_shutdown(sig == SIGINT, false);
		break;
	case SIGQUIT:
		notify_systemd("STOPPING=1");
		upgrade_goodbye();
		log_info("got SIGQUIT, fast exit");
		fast_exit();
		break;
	case SIGUSR1:
		/* PAUSE state lives in the workers (the console changes it too): they log the outcome */
		supervisor_console_signal(true);
		forward_signal(SIGUSR1);
		break;
	case SIGUSR2:
		if (master.shutting_down) {
			log_info("got SIGUSR2 while shutting down, ignoring");
		} else {
			supervisor_console_signal(false);
			forward_signal(SIGUSR2);
		}
		break;
	}
}

static void setup_signals(void)
{
	master.chld_event = evsignal_new(master.base, SIGCHLD, on_child, NULL);
	if (!master.chld_event || evsignal_add(master.chld_event, NULL) < 0)
		fatal("could not install handler for SIGCHLD");
	/* handlers are installed even for signals inherited as ignored (`cmd &` from a script) */
	const int sigs[] = {SIGHUP,
	                    SIGTERM,
	                    SIGINT,
	                    SIGQUIT,
	                    SIGUSR1,
	                    SIGUSR2,
	                    SIG_CONSOLE_SHUTDOWN_CLIENTS,
	                    SIG_CONSOLE_SHUTDOWN_SERVERS};
	_Static_assert(sizeof(sigs) / sizeof(sigs[0]) <= sizeof(master.sig_events) / sizeof(master.sig_events[0]),
	               "a signal without an event slot");
	signal(SIGPIPE, SIG_IGN);
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
		master.sig_events[i] = evsignal_new(master.base, sigs[i], on_signal, NULL);
		if (!master.sig_events[i] || evsignal_add(master.sig_events[i], NULL) < 0)
			fatal("could not install handler for signal %d", sigs[i]);
	}
}

int main(int argc, char **argv)
{
	static const struct option long_opts[] = {
	    {"daemon", no_argument, NULL, 'd'},  {"quiet", no_argument, NULL, 'q'},
	    {"verbose", no_argument, NULL, 'v'}, {"user", required_argument, NULL, 'u'},
	    {"reboot", no_argument, NULL, 'R'},  {"version", no_argument, NULL, 'V'},
	    {"help", no_argument, NULL, 'h'},    {NULL, 0, NULL, 0},
	};
	const char *cmdline_user = NULL;
	bool reboot = false;
	int c;

	master.progname = basename(argv[0]);
	master.listeners.unix_sock.fd = -1;
	while ((c = getopt_long(argc, argv, "dqvu:RVh", long_opts, NULL)) != -1) {
		switch (c) {
		case 'd':
			master.daemon = true;
			break;
		case 'q':
			master.quiet = true;
			break;
		case 'v':
			master.cmdline_verbose++;
			break;
		case 'u':
			cmdline_user = optarg;
			break;
		case 'R':
			reboot = true;
			break;
		case 'V':
			print_version();
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			fprintf(stderr, "Try \"%s --help\" for more information.\n", master.progname);
			return 1;
		}
	}
	if (optind + 1 != argc) {
		fprintf(stderr, "%s: no configuration file specified\n", master.progname);
		fprintf(stderr, "Try \"%s --help\" for more information.\n", master.progname);
		return 1;
	}

	/* 1. configuration */
	/* with -d too, as PgBouncer does: an error before the detach is seen where pgbouncer was started */
	LogSettings boot_log = {.to_stderr = !master.quiet, .verbose = master.cmdline_verbose};
	log_configure(&boot_log);
	log_set_fatal_hook(cleanup_at_exit);
	char err[CF_ERRMSG_LEN];
	config_init(&master.cf);
	/* the -v count, unless the file sets verbose (which no [pgbouncer] header resets) */
	master.cf.g.verbose = master.cmdline_verbose;
	if (!config_load(&master.cf, argv[optind], err, sizeof(err))) {
		/* a logfile read before the error (or before a failed check of the whole file) gets the reason too */
		apply_log_settings(&master.cf);
		log_error("%s", err);
		fatal("cannot load config file");
	}
	apply_log_settings(&master.cf);
	/* 3. user switch, then never as root */
	switch_user(cmdline_user ? cmdline_user : master.cf.g.user);
	if (getuid() == 0 || geteuid() == 0)
		fatal("PgBouncer should not run as root");
	/*
	 * As the user we run as, who owns a file made now: a log file opened
	 * by root would not open again at the reopen of a reload (logrotate).
	 */
	if (!log_open_file_now()) {
		fprintf(stderr, "cannot open logfile '%s': %s\n", master.cf.g.logfile, strerror(errno));
		return 1;
	}
	keep_auth_files(&master.cf);

	/*
	 * 4.-6. another instance? (with -R: take over from it) then detach;
	 * systemd's LISTEN_PID names this process, not the daemon
	 */
	listen_take_inherited();
	Takeover tk = {.conn = -1, .shm_fd = -1};
	bool takeover = false;
	if (reboot) {
		takeover = find_running_tree(&master.cf.g, &tk, true);
		/*
		 * Not found, yet its pidfile or unix socket says it runs: it may be
		 * dying (killed just now) or not listening yet. Wait a little for
		 * either, rather than refusing to start (doc/workers.md "Upgrading").
		 */
		for (int i = 0; !takeover && i < REBOOT_WAIT_MS / 50; i++) {
			pid_t old = pidfile_running(master.cf.g.pidfile);
			if (!old && !listen_unix_in_use(&master.cf.g))
				break;
			if (i == 0)
				log_info(
				    "online restart: the running process (pid %d) does not answer; waiting up to %d "
				    "ms for it to answer or exit",
				    (int)old, REBOOT_WAIT_MS);
			struct timespec ts = {0, 50 * 1000 * 1000};
			nanosleep(&ts, NULL);
			takeover = find_running_tree(&master.cf.g, &tk, true);
		}
		if (!takeover)
			log_info("old process not found, try to continue normally");
	}
	/* workers whose master died: we become their master, as at -R (doc/workers.md "When the master dies") */
	if (!takeover)
		takeover = find_running_tree(&master.cf.g, &tk, false);
	bool adopting = tk.n_orphans > 0;
	if (!takeover)
		listen_check_unix_in_use(&master.cf.g);
	if (!takeover || adopting)
		pidfile_check(master.cf.g.pidfile); /* the dead master's is stale */
	if (master.daemon) {
		daemonize(&master.cf);
		master.detached = true;
		log_stop_stderr();
	}

	/* 7.-9. */
	log_fd_limit(&master.cf);
	master.base = event_base_new();
	if (!master.base)
		fatal("event_base_new() failed");
	setup_signals();
	/* 2. TLS, after the user switch so that the files are read as the running user */
	char terr[TLS_ERR_LEN];
	tls_contexts_init(&master.tls);
	if (!tls_contexts_reload(&master.tls, &master.cf.g, hba_config_uses_cert(&master.cf.g), terr, sizeof(terr))) {
		log_error("%s", terr); /* PgBouncer's two lines (doc/tls.md) */
		fatal("TLS setup failed");
	}
	listen_setup(&master.listeners, &master.cf.g, tk.s, tk.n);
	make_private_dir(&master.cf.g, takeover);
	if (!takeover || adopting)
		pidfile_write(master.cf.g.pidfile);
	/* before the first fork: one key for every worker, and the old tree's at an online restart */
	if (tk.have_salt_key)
		scram_salt_key_set(tk.salt_key);
	else
		scram_salt_key_init();
	explicit_bzero(tk.salt_key, sizeof(tk.salt_key));
	supervisor_init(master.base, &master.cf, &master.tls, &master.listeners, master.cmdline_verbose);
	supervisor_on_console_set(on_console_set);
	metrics_start(master.base, &master.cf, supervisor_shm());
	if (takeover) {
		if (adopting)
			supervisor_predecessor(tk.shm_fd, 0, tk.orphan_pids, tk.n_orphans);
		else
			supervisor_predecessor(tk.shm_fd, tk.old_pid, &tk.old_pid, 1);
		supervisor_inherit(tk.s, tk.n);
		upgrade_close_unused(&tk);
	}
	supervisor_start(takeover ? tk.workers : 0);
	if (takeover) {
		/*
		 * Our workers accept on the same sockets: the old tree may stop now.
		 * Until they run, new connections wait in the kernel's queue; waiting
		 * for them here keeps that short.
		 */
		supervisor_wait_active(5000);
		upgrade_on_orphan_cancel(supervisor_cancel_to_moved);
		upgrade_on_pred_gone(on_pred_gone);
		upgrade_commit(&tk, supervisor_adopt_old, master.base);
		master.in_grace = true; /* the files stay borrowed: claim_files() */
		/*
		 * Both trees serve: a pidfile we cannot write (a full file system)
		 * must not stop either. The old one names a process that retires
		 * soon: gone is better than wrong.
		 */
		if (!pidfile_replace(master.cf.g.pidfile) && master.cf.g.pidfile && *master.cf.g.pidfile &&
		    unlink(master.cf.g.pidfile) == 0)
			log_warning("removed the pidfile '%s', which named the old process", master.cf.g.pidfile);
		/*
		 * Until the grace period is over, a death of ours leaves the old
		 * tree serving (the old master carries on, the orphans wait for
		 * another master) and our workers exit with us; then the old
		 * tree's clients come over and ours may outlive us.
		 */
		struct timeval tv = {UPGRADE_GRACE_S, 0};
		event_base_once(master.base, -1, EV_TIMEOUT, on_takeover_settled, NULL, &tv);
	} else
		supervisor_settle();
	upgrade_on_resume(resume);
	upgrade_on_handed(handed);
	upgrade_listen(master.base, master.private_dir, export_listeners, retire, supervisor_cancel_from_successor);
	master.orphan_scan = event_new(master.base, -1, EV_PERSIST, on_orphan_scan, NULL);
	struct timeval every = {1, 0};
	if (!master.orphan_scan || event_add(master.orphan_scan, &every) < 0)
		log_warning("could not start the periodic look for orphaned workers");
	log_info("process up: PgBouncer %s, libevent %s (%s), adns: c-ares %s, tls: %s", PACKAGE_VERSION,
	         event_get_version(), event_base_get_method(master.base), ares_version(NULL),
	         OpenSSL_version(OPENSSL_VERSION));
	notify_systemd("READY=1"); /* the listeners are open and the first workers forked */

	if (event_base_dispatch(master.base) < 0)
		fatal("event loop failed");
	master_exit(0);
}
