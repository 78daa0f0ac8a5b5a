/*
 * Worker lifecycle in the master: listener slots (one SO_REUSEPORT socket
 * per worker slot per address, kept open for the life of the tree), fork
 * with a control channel, drain, reap, respawn with back-off, and the
 * scaler tick that turns the workers' busy counters into decisions.
 */
#include "autoconfig.h"

#include "master/supervisor.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uthash.h>

#include "common/budget.h"
#include "common/channel.h"
#include "common/console_state.h"
#include "common/log.h"
#include "common/util.h"
#include "master/cpu_allowance.h"
#include "master/cpu_idle.h"
#include "master/rebalance.h"
#include "master/scaler.h"
#include "master/upgrade.h"
#include "master/warmstart.h"
#include "master/metrics.h"
#include "shm.h"
#include "worker_entry.h"

#define MAX_ADDRS LISTEN_MAX_TCP /* TCP listen addresses */

#define REBALANCE_SAMPLES     3  /* ticks a plan must stay uneven before clients move */
#define REBALANCE_FRESH_TICKS 10 /* after a worker starts, ticks in which a plan runs at once */

#define CPUS_REREAD_US INT64_C(60000000) /* the CPU allowance is read again every minute */

/* One worker slot as the master sees it. */
typedef struct WorkerProc {
	pid_t pid;       /* 0 = no process */
	int ctl;         /* master end of the control channel, -1 = none */
	ChannelOut *out; /* sends on ctl, queued while the worker reads slowly (NULL = no worker) */
	bool draining;   /* told to drain; its exit is expected */
	bool wanted;     /* the slot should have a worker (respawn after a crash) */
	int crashes;     /* consecutive crashes, for back-off */
	struct event *respawn_ev;
	struct event *ctl_ev; /* messages from the worker (forwarded cancels) */
	SchedCounters prev;   /* the worker's counters at the previous tick */
	bool have_prev;
	Saturation sat;  /* at the last tick with a reading: busy, wait, load (the scaler's input) */
	double busy_avg; /* exponential moving averages */
	double wait_avg;
	uint64_t holds;   /* bit k: it was given listener slot k and not told to drop it */
	bool hung;        /* the watchdog found its loop silent; its slots went to another worker */
	bool hung_killed; /* still silent: SIGKILL sent, the reaper respawns the slot */
} WorkerProc;

/*
 * How far above the old tree's ids a new tree's start (-R): half of the
 * int4 range the ids go round in (shm_socket_id()).
 */
#define SOCKET_IDS_PER_TREE (UINT64_C(1) << 30)

/*
 * Our end of an old-tree worker's hand-over socket (-R, adoption), kept
 * while the old tree runs: a worker of ours that dies does not close it,
 * and another worker reads on from where it stopped (each message is one
 * whole client).
 */
typedef struct OldIntake {
	int fd;
	int k;    /* the old worker's index */
	int to;   /* our worker reading it, -1 = none (given at the next tick) */
	int dead; /* the worker that read it last and died */
} OldIntake;

static struct {
	struct event_base *base;
	Config *cf;
	const TlsContexts *tls; /* the master's, inherited by new workers */
	ListenSet *ls;
	int cmdline_verbose;
	ShmSegment *shm;
	WorkerProc w[SHM_MAX_WORKERS];
	int lfd[SHM_MAX_WORKERS][MAX_ADDRS]; /* listener slot sockets, -1 = not made yet */
	int served_by[SHM_MAX_WORKERS];      /* worker slot accepting on listener slot k (-1 = none) */
	ScalerHistory hist;
	ScalerConfig scf;
	WorkerBounds bounds; /* as last resolved; its note (what was clamped) has been logged */
	struct event *tick_ev;
	bool shutting_down;
	bool frozen;         /* a new master (-R) has our sockets: no scaling until it commits or gives up */
	bool retiring;       /* a new master took over: our workers drain, nothing respawns */
	int shm_fd;          /* the segment's memfd, -1 = anonymous mapping */
	pid_t pred_pids[64]; /* the master we took over from (-R), or the orphans we adopted, while they run */
	int n_pred_pids;
	pid_t pred_master;        /* -R: the master of pred_pids; 0: they are adopted orphans */
	OldIntake old_intake[64]; /* our ends of the old tree's hand-over sockets, while it runs */
	int n_old_intake;
	bool settled;          /* our workers may outlive us (CH_SETTLE; doc/workers.md "When the master dies") */
	CpuAllowance allow;    /* the CPUs we may use (doc/workers.md, "The CPU allowance") */
	CpuReading cpu_prev;   /* /proc/stat and the quota cgroup at the previous tick */
	int64_t allow_read_us; /* monotonic time it was last read */
	int rb_streak;         /* consecutive ticks with an uneven plan */
	int rb_quiet;          /* ticks to wait after a move, until the counts are published again */
	int rb_fresh;          /* ticks left in which a plan runs at once: a worker was just added */
	bool rb_now;           /* plan at this tick whatever the history (a drain started) */
	ConsoleState console;  /* the console's pause and database flags, for workers started later */
	bool starting;         /* supervisor_start() forks the first workers: each takes its own slot only */
	struct event *watchdog_ev;
	int64_t watchdog_last_us;  /* monotonic time of the last watchdog pass */
	char saved_path[PATH_MAX]; /* the worker_state_file the count was last saved to, "" = none yet */
} sv;

/* ---- moved clients' cancel keys ---- */

/* Where a moved client lives now: its cancel key still names the worker that made it. */
typedef struct MovedKey {
	uint64_t key; /* the 8 key bytes */
	int slot;
	UT_hash_handle hh;
} MovedKey;

static MovedKey *moved_keys;

static void moved_set(uint64_t key, int slot)
{
	MovedKey *m;
	HASH_FIND(hh, moved_keys, &key, sizeof(key), m);
	if (!m) {
		m = xcalloc(1, sizeof(*m));
		m->key = key;
		HASH_ADD(hh, moved_keys, key, sizeof(m->key), m);
	}
	m->slot = slot;
}

static void moved_gone(uint64_t key, int slot)
{
	MovedKey *m;
	HASH_FIND(hh, moved_keys, &key, sizeof(key), m);
	if (m && m->slot == slot) {
		HASH_DEL(moved_keys, m);
		free(m);
	}
}

static int moved_find(uint64_t key)
{
	MovedKey *m;
	HASH_FIND(hh, moved_keys, &key, sizeof(key), m);
	return m ? m->slot : -1;
}

/* A worker is gone: so are the moved clients it held. */
static void moved_forget_slot(int slot)
{
	MovedKey *m, *tmp;
	HASH_ITER(hh, moved_keys, m, tmp)
	{
		if (m->slot == slot) {
			HASH_DEL(moved_keys, m);
			free(m);
		}
	}
}

static int n_addrs(void)
{
	return sv.ls->n_tcp < MAX_ADDRS ? sv.ls->n_tcp : MAX_ADDRS;
}

static uint32_t listener_id(int slot, int addr)
{
	return (uint32_t)(slot * MAX_ADDRS + addr);
}

static int64_t mono_us(void)
{
	return get_mono_usec();
}

/* ---- shared memory ---- */

static void shm_create(void)
{
	/*
	 * A memfd rather than an anonymous mapping, so that a new master at an
	 * online restart can map it too (read-only: our budget counts add to its
	 * own while we finish, doc/workers.md "Upgrading").
	 */
	void *p = MAP_FAILED;
	sv.shm_fd = memfd_create("pgbouncer-shm", MFD_CLOEXEC);
	if (sv.shm_fd >= 0 && ftruncate(sv.shm_fd, sizeof(ShmSegment)) == 0)
		p = mmap(NULL, sizeof(ShmSegment), PROT_READ | PROT_WRITE, MAP_SHARED, sv.shm_fd, 0);
	if (p == MAP_FAILED) {
		if (sv.shm_fd >= 0)
			close(sv.shm_fd);
		sv.shm_fd = -1;
		p = mmap(NULL, sizeof(ShmSegment), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	}
	if (p == MAP_FAILED)
		fatal("mmap() of the shared segment failed: %s", strerror(errno));
	/*
	 * Both mappings start zeroed, so no memset: writing the whole 2 MB
	 * (mostly the budget table) made every page resident in the master
	 * although a pooler touches a few of them (doc/benchmarks.md,
	 * "Memory against PgBouncer 1.25.2").
	 */
	sv.shm = p;
	sv.shm->magic = SHM_MAGIC;
	sv.shm->version = SHM_VERSION;
	sv.shm->n_slots = SHM_MAX_WORKERS;
	sv.shm->slot_size = sizeof(WorkerSlot);
}

static void slot_reset(int i)
{
	WorkerSlot *s = &sv.shm->slots[i];
	atomic_store(&s->state, SLOT_FREE);
	atomic_store(&s->pid, 0);
	atomic_store(&s->start_time_us, 0);
	atomic_store(&s->busy_ns, 0);
	atomic_store(&s->wait_ns, 0);
	atomic_store(&s->sample_time_ns, 0);
	atomic_store(&s->accepted, 0);
	atomic_store(&s->tls_handshakes, 0);
	atomic_store(&s->xact_count, 0);
	atomic_store(&s->query_count, 0);
	atomic_store(&s->bytes_in, 0);
	atomic_store(&s->bytes_out, 0);
	atomic_store(&s->cl_active, 0);
	atomic_store(&s->cl_waiting, 0);
	atomic_store(&s->sv_active, 0);
	atomic_store(&s->sv_idle, 0);
	atomic_store(&s->cl_movable, 0);
	atomic_store(&s->cl_unmovable, 0);
	atomic_store(&s->moved_in, 0);
	atomic_store(&s->moved_out, 0);
	atomic_store(&s->move_failed, 0);
	atomic_store(&s->hung, 0);
	atomic_store(&s->listener_mask, 0);
	atomic_store(&sv.shm->scaler.busy_milli[i], 0);
	atomic_store(&sv.shm->scaler.busy_avg_milli[i], 0);
	atomic_store(&sv.shm->scaler.wait_milli[i], 0);
	atomic_store(&sv.shm->scaler.wait_avg_milli[i], 0);
	sv.w[i].have_prev = false;
	sv.w[i].sat = (Saturation){.valid = false};
	sv.w[i].busy_avg = sv.w[i].wait_avg = 0;
}

static void publish_reason(ScaleDecision d, const char *reason)
{
	ScalerView *v = &sv.shm->scaler;
	atomic_fetch_add(&v->reason_seq, 1);
	snprintf(v->last_reason, sizeof(v->last_reason), "%s", reason);
	atomic_fetch_add(&v->reason_seq, 1);
	atomic_store(&v->last_decision, (uint32_t)d);
	if ((unsigned)d < 3)
		atomic_fetch_add(&v->decisions[d], 1);
}

/* ---- counting ---- */

static bool is_active(int i)
{
	return sv.w[i].pid > 0 && !sv.w[i].draining;
}

static int active_count(void)
{
	int n = 0;
	for (int i = 0; i < SHM_MAX_WORKERS; i++)
		n += is_active(i);
	return n;
}

int supervisor_live_workers(void)
{
	int n = 0;
	for (int i = 0; i < SHM_MAX_WORKERS; i++)
		n += sv.w[i].pid > 0;
	return n;
}

static int wanted_count(void)
{
	int n = 0;
	for (int i = 0; i < SHM_MAX_WORKERS; i++)
		n += sv.w[i].wanted;
	return n;
}

/* Active and not flagged by the watchdog: it can accept on a listener slot. */
static bool is_serving(int i)
{
	return is_active(i) && !sv.w[i].hung;
}

/* The live, non-draining, responsive worker with the lowest slot other than `except`; -1 if none. */
static int survivor(int except)
{
	for (int i = 0; i < SHM_MAX_WORKERS; i++)
		if (i != except && is_serving(i))
			return i;
	return -1;
}

/*
 * Send a message to worker i (doc/architecture.md "Control channel"): queued
 * behind earlier ones while its channel is full. False when there is no
 * worker or it is gone (EPIPE), or the message could not be queued (the
 * channel logs that).
 */
static bool tell(int i, const ChannelMsg *m, int fd)
{
	if (sv.w[i].pid <= 0 || !sv.w[i].out) {
		errno = EPIPE;
		return false;
	}
	return channel_out_send(sv.w[i].out, m, fd);
}

/* Worker i reads orders: forked and not about to exit (it stores SLOT_EXITING before its exit). */
static bool takes_orders(int i)
{
	uint32_t st = atomic_load(&sv.shm->slots[i].state);
	return sv.w[i].pid > 0 && sv.w[i].out && st != SLOT_FREE && st != SLOT_EXITING;
}

/* ---- listener slots ---- */

/* Each worker's listener slots into its shm slot: SHOW WORKERS `listeners`. */
static void publish_listeners(void)
{
	for (int i = 0; i < SHM_MAX_WORKERS; i++)
		atomic_store(&sv.shm->slots[i].listener_mask, sv.w[i].pid > 0 ? sv.w[i].holds : 0);
}

static bool ensure_listener_slot(int k)
{
	for (int a = 0; a < n_addrs(); a++) {
		if (sv.lfd[k][a] >= 0)
			continue;
		int fd = k == 0 ? sv.ls->tcp[a].fd : listen_open_slot(sv.ls, sv.ls->tcp[a].addr_index, &sv.cf->g);
		if (fd < 0)
			return false;
		sv.lfd[k][a] = fd;
	}
	return true;
}

/* Tell worker `to` to accept on listener slot k as well (hand-over after a drain or crash). */
static void hand_over(int k, int to)
{
	for (int a = 0; a < n_addrs(); a++) {
		if (sv.lfd[k][a] < 0)
			continue;
		ChannelMsg m = {.type = CH_TAKE_LISTENER, .id = listener_id(k, a)};
		(void)tell(to, &m, sv.lfd[k][a]); /* a failure is logged by the channel; a dead worker's is reaped */
	}
	sv.served_by[k] = to;
	sv.w[to].holds |= UINT64_C(1) << k;
	publish_listeners();
}

static void take_back(int k, int from)
{
	for (int a = 0; a < n_addrs(); a++) {
		if (sv.lfd[k][a] < 0)
			continue;
		ChannelMsg m = {.type = CH_DROP_LISTENER, .id = listener_id(k, a)};
		(void)tell(from, &m, -1);
	}
	sv.w[from].holds &= ~(UINT64_C(1) << k);
	publish_listeners();
}

/*
 * Listener slot k has nobody accepting on it: no worker was ever given it,
 * or the one that accepts on it is gone, draining or hung. Such a slot is
 * given to a worker being started (spawn()) or to a survivor
 * (adopt_orphans()), so that its accept queue never waits for nobody
 * (doc/workers.md, "Listener slots").
 */
static bool slot_orphaned(int k)
{
	if (n_addrs() > 0 && sv.lfd[k][0] < 0)
		return false;
	int by = sv.served_by[k];
	return by < 0 || !is_serving(by);
}

/* Give every listener slot nobody serves to a survivor. */
static void adopt_orphans(void)
{
	for (int k = 0; k < SHM_MAX_WORKERS; k++) {
		if (!slot_orphaned(k))
			continue;
		int s = survivor(-1);
		if (s < 0)
			return;
		if (n_addrs() > 0)
			hand_over(k, s);
	}
}

void supervisor_close_tcp(void)
{
	for (int k = 0; k < SHM_MAX_WORKERS; k++)
		for (int a = 0; a < MAX_ADDRS; a++)
			if (sv.lfd[k][a] >= 0) {
				close(sv.lfd[k][a]);
				sv.lfd[k][a] = -1;
			}
	/* listen_close_all() must not close slot 0 twice, nor a slot duplicate a closed socket */
	for (int a = 0; a < sv.ls->n_tcp; a++)
		sv.ls->tcp[a].fd = -1;
	for (int a = 0; a < sv.ls->n_addrs; a++)
		sv.ls->addrs[a].inherited_fd = -1;
}

/* ---- CPU affinity ---- */

/* Worker i gets a physical core of its own among the allowed CPUs (the same cores the allowance counts). */
static void pin_to_core(int i)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(sv.allow.n_core_cpus > 0 ? sv.allow.core_cpus[i % sv.allow.n_core_cpus] : 0, &set);
	if (sched_setaffinity(0, sizeof(set), &set) < 0)
		log_warning("sched_setaffinity() failed: %s", strerror(errno));
}

/* ---- fork ---- */

static void on_ctl(evutil_socket_t fd, short what, void *arg);
static void arm_watchdog(void);

/*
 * No worker came of it: the listener slot opened for it (or part of it)
 * is in the SO_REUSEPORT group already and gets its share of the new
 * connections, so a survivor accepts on it meanwhile.
 */
static bool spawn_failed(void)
{
	adopt_orphans();
	return false;
}

static bool spawn(int i)
{
	if (n_addrs() > 0 && !ensure_listener_slot(i)) {
		log_error("worker %d: cannot open its listener slot", i);
		return spawn_failed();
	}
	int ctl[2];
	if (!channel_pair(ctl)) {
		log_error("socketpair() failed: %s", strerror(errno));
		return spawn_failed();
	}
	slot_reset(i);
	atomic_store(&sv.shm->slots[i].state, SLOT_STARTING);
	atomic_store(&sv.shm->slots[i].start_time_us, (uint64_t)get_time_usec());
	/*
	 * Its own slot, and every slot nobody accepts on: after a drain the
	 * drained worker's slot went to the survivor, and if that survivor is
	 * the worker being replaced here, the slot would otherwise keep its
	 * queue with no acceptor (doc/workers.md, "Listener slots"). That
	 * holds while the drained worker still runs too (a client in a
	 * transaction keeps it): it closed its copy when it began to drain.
	 * A slot whose own worker serves it again is left to that worker.
	 */
	uint64_t takes = UINT64_C(1) << i;
	for (int k = 0; k < SHM_MAX_WORKERS && !sv.starting; k++)
		if (k != i && !is_serving(k) && slot_orphaned(k))
			takes |= UINT64_C(1) << k;
	pid_t pid = fork();
	if (pid < 0) {
		log_error("fork() failed: %s", strerror(errno));
		close(ctl[0]);
		close(ctl[1]);
		atomic_store(&sv.shm->slots[i].state, SLOT_FREE);
		return spawn_failed();
	}
	if (pid == 0) {
		/*
		 * The worker builds its own loop. The master's must let go of its
		 * signals and events without touching the epoll instance it shares
		 * with the parent (reinit gives it a private one), and before the
		 * fds it watches are closed below.
		 */
		event_reinit(sv.base);
		event_base_free(sv.base);
		metrics_forget_in_child();
		/* the worker: keep our listener slot, the unix socket and our channel end only */
		close(ctl[0]);
		for (int j = 0; j < SHM_MAX_WORKERS; j++) {
			channel_out_forget_in_child(sv.w[j].out); /* e.g. a move's socket end, which must see EOF */
			if (sv.w[j].ctl >= 0)
				close(sv.w[j].ctl);
		}
		upgrade_forget_in_child();
		/* the master's copies of the old tree's hand-over sockets: a worker's copy would hide their EOF */
		for (int j = 0; j < sv.n_old_intake; j++)
			close(sv.old_intake[j].fd);
		/*
		 * Every slot it takes, each with all addresses, and the unix
		 * socket: a respawn after a drain may take many slots at once.
		 */
		WorkerSocket *wl = xcalloc((size_t)__builtin_popcountll(takes) * MAX_ADDRS + 1, sizeof(*wl));
		int k = 0;
		for (int s = 0; s < SHM_MAX_WORKERS; s++)
			for (int a = 0; a < MAX_ADDRS; a++) {
				if (sv.lfd[s][a] < 0)
					continue;
				if (takes >> s & 1)
					wl[k++] = (WorkerSocket){.fd = sv.lfd[s][a], .id = listener_id(s, a)};
				else
					close(sv.lfd[s][a]);
			}
		if (sv.ls->unix_sock.fd >= 0)
			wl[k++] = (WorkerSocket){.fd = sv.ls->unix_sock.fd, .is_unix = true, .id = UINT32_MAX};
		if (sv.cf->g.worker_cpu_affinity == AFFINITY_CORES)
			pin_to_core(i);
		log_set_fatal_hook(NULL);
		exit(worker_main(i, sv.cf, sv.tls, &sv.console, wl, k, ctl[1], sv.cmdline_verbose, sv.shm, sv.shm_fd));
	}
	close(ctl[1]);
	sv.w[i].pid = pid;
	sv.w[i].ctl = ctl[0];
	fcntl(ctl[0], F_SETFL, fcntl(ctl[0], F_GETFL) | O_NONBLOCK);
	char peer[32];
	snprintf(peer, sizeof(peer), "worker %d", i);
	channel_out_free(sv.w[i].out);
	sv.w[i].out = channel_out_new(sv.base, ctl[0], peer);
	if (sv.w[i].ctl_ev)
		event_free(sv.w[i].ctl_ev);
	sv.w[i].ctl_ev = event_new(sv.base, ctl[0], EV_READ | EV_PERSIST, on_ctl, (void *)(intptr_t)i);
	event_add(sv.w[i].ctl_ev, NULL);
	sv.w[i].draining = false;
	sv.w[i].wanted = true;
	sv.w[i].hung = sv.w[i].hung_killed = false;
	sv.w[i].holds = takes;
	atomic_store(&sv.shm->slots[i].pid, pid);
	if (sv.settled) {
		ChannelMsg m = {.type = CH_SETTLE};
		(void)tell(i, &m, -1);
	}
	/* this slot's listeners were served by a survivor meanwhile: take them back */
	int prev = sv.served_by[i];
	if (prev >= 0 && prev != i && sv.w[prev].pid > 0)
		take_back(i, prev);
	for (int k = 0; k < SHM_MAX_WORKERS; k++)
		if (takes >> k & 1)
			sv.served_by[k] = i;
	publish_listeners();
	if (takes != UINT64_C(1) << i)
		log_info("worker %d started, pid %d; it also accepts on listener slots nobody served (mask 0x%llx)", i,
		         (int)pid, (unsigned long long)(takes & ~(UINT64_C(1) << i)));
	else
		log_info("worker %d started, pid %d", i, (int)pid);
	sv.rb_fresh = REBALANCE_FRESH_TICKS; /* its share of the long-lived clients goes to it at once */
	return true;
}

/* Forward a cancel request to the worker that has the client: a moved one's, else key byte 3's. */
static void route_cancel(int from, ChannelMsg *m, int rfd)
{
	uint64_t k;
	memcpy(&k, &m->arg, sizeof(k));
	uint8_t key[8];
	memcpy(key, &m->arg, sizeof(key));
	int owner = moved_find(k);
	if (owner < 0)
		owner = key[3];
	bool unknown = m->id == CANCEL_NOT_HERE && owner == from;
	if (unknown || owner >= SHM_MAX_WORKERS || sv.w[owner].pid <= 0 || !sv.w[owner].out) {
		/* no client of this tree has the key: after -R it may be one the old tree still serves */
		if (upgrade_forward_cancel(m, rfd))
			log_debug("cancel request passed to the old process");
		else if (unknown)
			log_debug("cancel request for an unknown client of worker %d", from);
		else
			log_debug("cancel request for worker %d, which is not running", owner);
		return;
	}
	m->id = 0;
	if (!tell(owner, m, rfd))
		log_debug("cancel request for worker %d not forwarded: %s", owner, strerror(errno));
}

void supervisor_cancel_to_moved(ChannelMsg *m, int fd)
{
	uint64_t k;
	memcpy(&k, &m->arg, sizeof(k));
	int owner = moved_find(k);
	m->id = CANCEL_FINAL; /* it came back from the adopted tree: it goes no further */
	if (owner < 0 || !tell(owner, m, fd))
		log_debug("cancel request from the adopted tree for no client of this one: dropped");
}

void supervisor_cancel_from_successor(ChannelMsg *m, int fd)
{
	m->id = 0;
	route_cancel(-1, m, fd);
}

static void (*console_set_handler)(const char *name, const char *value);

void supervisor_on_console_set(void (*fn)(const char *name, const char *value))
{
	console_set_handler = fn;
}

/*
 * CH_SET: "name\0value\0" in the attached memfd; arg, the workers the
 * console did not reach (starting while it ran): they get it from here.
 */
static void console_set(int from, uint64_t missed, int fd)
{
	ChannelMsg fwd = {.type = CH_SET};
	for (int i = 0; i < SHM_MAX_WORKERS; i++)
		if (i != from && (missed >> i & 1) && sv.w[i].pid > 0 && tell(i, &fwd, fd))
			log_debug("worker %d was starting during a console SET: sent it the SET", i);
	char buf[2048];
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
	if (n <= 0)
		return;
	buf[n] = '\0';
	size_t name_len = strlen(buf);
	if (name_len + 1 >= (size_t)n || !console_set_handler)
		return; /* no value */
	console_set_handler(buf, buf + name_len + 1);
}

/*
 * CH_CONSOLE_STATE: what the console's last command left (the attached
 * memfd), kept for the workers started from now on. When it ends a PAUSE or
 * SUSPEND, the workers that took that over at start resume: the console's
 * RESUME reached them as peers, but a SUSPEND that ends because its console
 * went away reaches nobody else (doc/workers.md "Console state").
 */
static void console_state(int from, int fd)
{
	struct stat st;
	if (fstat(fd, &st) < 0 || st.st_size < 1 || st.st_size > (off_t)CS_MAX_LEN) {
		log_warning("worker %d reported a console state that cannot be read", from);
		return;
	}
	char *buf = xmalloc((size_t)st.st_size);
	ConsoleState next = {0};
	bool ok =
	    pread(fd, buf, (size_t)st.st_size, 0) == st.st_size && console_state_decode(&next, buf, (size_t)st.st_size);
	free(buf);
	if (!ok) {
		log_warning("worker %d reported a malformed console state", from);
		console_state_free(&next);
		return;
	}
	bool resumed = console_state_pause(&sv.console) != CS_RUNNING && console_state_pause(&next) == CS_RUNNING;
	console_state_free(&sv.console);
	sv.console = next;
	if (!resumed)
		return;
	ChannelMsg m = {.type = CH_CONSOLE_RESUME};
	for (int i = 0; i < SHM_MAX_WORKERS; i++)
		if (i != from)
			(void)tell(i, &m, -1);
}

/*
 * CH_CONSOLE_LEFT_OUT: a console command of worker `from` left out the
 * workers in `mask`. Each gets the state `from` reported before (same
 * channel, so already read) and takes it over: what it missed, or a stale
 * command it will refuse, changes nothing (doc/workers.md "Console state").
 */
static void console_left_out(int from, uint64_t mask)
{
	ConsoleState running = {0};
	const ConsoleState *cs = &sv.console;
	if (!cs->len) {
		console_state_begin(&running, CS_RUNNING);
		cs = &running;
	}
	int fd = memfd_create("pgbouncer-console-state", MFD_CLOEXEC);
	bool ok = fd >= 0 && write(fd, cs->buf, cs->len) == (ssize_t)cs->len;
	console_state_free(&running);
	ChannelMsg m = {.type = CH_CONSOLE_SYNC};
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		if (i == from || !(mask >> i & 1) || sv.w[i].pid <= 0)
			continue;
		if (!ok)
			log_warning("could not hand worker %d the console's state it was left out of (could not write "
			            "it): it may differ",
			            i);
		else if (tell(i, &m, fd))
			log_debug("worker %d was left out of a console command: sent it the pooler's state", i);
	}
	if (fd >= 0)
		close(fd);
}

const char *supervisor_paused_why(char *buf, size_t len)
{
	char pause = console_state_pause(&sv.console);
	if (pause != CS_RUNNING) {
		snprintf(buf, len, "the pooler is %s",
		         pause == CS_SUSPENDED ? "suspended (SUSPEND)" : "paused (PAUSE)");
		return buf;
	}
	size_t pos = 0;
	char kind;
	const char *name;
	while (console_state_next(&sv.console, &pos, &kind, &name))
		if (kind == CS_DB_PAUSED) {
			snprintf(buf, len, "database %s is paused (PAUSE %s)", name, name);
			return buf;
		}
	return NULL;
}

bool supervisor_suspended(void)
{
	return console_state_pause(&sv.console) == CS_SUSPENDED;
}

void supervisor_console_signal(bool pause)
{
	/* every worker gets the signal too; this is for the ones started later */
	if (!pause)
		console_state_set_pause(&sv.console, CS_RUNNING);
	else if (console_state_pause(&sv.console) == CS_RUNNING)
		console_state_set_pause(&sv.console, CS_PAUSED);
}

/*
 * Messages from a worker: cancels for other workers' clients, news of moved
 * clients, console SETs and state, workers a console command left out.
 */
static void on_ctl(evutil_socket_t fd, short what, void *arg)
{
	int from = (int)(intptr_t)arg;
	for (;;) {
		ChannelMsg m;
		int rfd;
		int r = channel_recv(fd, &m, &rfd);
		if (r <= 0) {
			if (rfd >= 0)
				close(rfd);
			if (r == 0)
				event_del(sv.w[from].ctl_ev); /* the worker is gone; the reaper cleans up */
			return;
		}
		uint64_t k;
		memcpy(&k, &m.arg, sizeof(k));
		switch (m.type) {
		case CH_CANCEL:
			route_cancel(from, &m, rfd);
			break;
		case CH_MOVED:
			moved_set(k, from);
			break;
		case CH_MOVED_GONE:
			moved_gone(k, from);
			break;
		case CH_SET: {
			uint64_t missed;
			memcpy(&missed, &m.arg, sizeof(missed));
			if (rfd >= 0)
				console_set(from, missed, rfd);
			break;
		}
		case CH_CONSOLE_STATE:
			if (rfd >= 0)
				console_state(from, rfd);
			break;
		case CH_CONSOLE_LEFT_OUT:
			console_left_out(from, k);
			break;
		default:
			break;
		}
		if (rfd >= 0)
			close(rfd); /* the owner has its own copy now */
	}
}

static int lowest_free_slot(void)
{
	for (int i = 0; i < SHM_MAX_WORKERS; i++)
		if (sv.w[i].pid == 0 && !sv.w[i].wanted)
			return i;
	return -1;
}

static int highest_active(void)
{
	for (int i = SHM_MAX_WORKERS - 1; i >= 0; i--)
		if (is_active(i))
			return i;
	return -1;
}

/* The highest slot whose worker crashed and waits for its respawn; -1 if none. */
static int highest_pending(void)
{
	for (int i = SHM_MAX_WORKERS - 1; i >= 0; i--)
		if (sv.w[i].wanted && sv.w[i].pid == 0)
			return i;
	return -1;
}

static void save_count(void)
{
	const char *path = sv.cf->g.worker_state_file;
	if (!path || !*path)
		return;
	char err[256];
	snprintf(sv.saved_path, sizeof(sv.saved_path), "%s", path);
	if (!warmstart_write(path, wanted_count(), err, sizeof(err)))
		log_warning("could not write worker_state_file: %s", err);
}

/* worker_state_file changed (RELOAD, SET): the count goes there now, not at the next change of it. */
static void save_count_if_moved(void)
{
	const char *path = sv.cf->g.worker_state_file;
	if (path && *path && strcmp(path, sv.saved_path) != 0 && !sv.retiring && !sv.shutting_down &&
	    wanted_count() > 0)
		save_count();
}

static bool order_move(int from, int to, int count);

static void drain(int i)
{
	WorkerProc *w = &sv.w[i];
	w->draining = true;
	w->wanted = false;
	atomic_store(&sv.shm->slots[i].state, SLOT_DRAINING);
	/* someone else accepts on its listener slots (its own and any it stood in for) before it stops */
	int s = survivor(i);
	if (s >= 0 && n_addrs() > 0)
		adopt_orphans();
	w->holds = 0; /* it closes them when it starts draining */
	publish_listeners();
	int64_t timeout_ms = sv.cf->g.worker_drain_timeout / 1000;
	ChannelMsg m = {.type = CH_DRAIN, .arg = timeout_ms};
	(void)tell(i, &m, -1);
	/*
	 * An order for no client at once: the draining worker keeps its socket,
	 * and a client goes over it at the end of one of its transactions
	 * (migrate_drain_due()); busy clients are seldom movable at the ticks
	 * that bring the other orders.
	 */
	if (s >= 0)
		(void)order_move(i, s, 0);
}

/* ---- rebalancing (doc/workers.md, "Rebalancing long-lived clients") ---- */

/*
 * Order worker `from` to hand up to count clients to worker `to` over a new
 * socket pair. Not to or from a worker that is exiting or has exited (its
 * exit may not be reaped yet): the order would go nowhere.
 */
static bool order_move(int from, int to, int count)
{
	if (!takes_orders(from) || !takes_orders(to))
		return false;
	int sp[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0) {
		log_warning("socketpair() for a client move failed: %s", strerror(errno));
		return false;
	}
	int big = 1 << 20; /* room for many clients' state; the kernel caps it at wmem_max */
	(void)setsockopt(sp[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	ChannelMsg take = {.type = CH_ADOPT, .id = (uint32_t)from};
	ChannelMsg give = {.type = CH_MIGRATE, .id = (uint32_t)to, .arg = count};
	/* a failure is logged by the channel, unless the worker has just exited */
	bool ok = tell(to, &take, sp[1]) && tell(from, &give, sp[0]);
	/* the workers (or the queues to them) hold their own ends now; a failed give closes the taker's at EOF */
	close(sp[0]);
	close(sp[1]);
	return ok;
}

/*
 * Once per tick: plan from the counts the workers publish and, when the
 * plan stays uneven for REBALANCE_SAMPLES ticks (at once for a draining
 * worker or a worker just added), send the orders. After a move one tick
 * passes before the next plan, so that it sees the new counts (not for a
 * draining worker: it gives what has become movable at every tick).
 */
static void rebalance_tick(bool now)
{
	if (sv.rb_fresh > 0)
		sv.rb_fresh--;
	bool quiet = sv.rb_quiet > 0;
	if (quiet)
		sv.rb_quiet--;
	RebalanceWorker rw[SHM_MAX_WORKERS];
	int n = 0;
	bool drain = false;
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		WorkerProc *w = &sv.w[i];
		if (!takes_orders(i) || w->hung)
			continue; /* a hung worker neither gives nor takes: its counts are stale */
		WorkerSlot *slot = &sv.shm->slots[i];
		uint32_t st = atomic_load(&slot->state);
		if (st != SLOT_ACTIVE && st != SLOT_DRAINING)
			continue; /* starting (not serving yet) or exiting */
		int movable = (int)atomic_load(&slot->cl_movable);
		rw[n++] = (RebalanceWorker){.slot = i,
		                            .clients = movable + (int)atomic_load(&slot->cl_unmovable),
		                            .movable = movable,
		                            .busy = w->sat.load, /* busy + wait: what the scaler reads */
		                            .draining = w->draining};
		drain |= w->draining && movable > 0;
	}
	if (quiet && !now && !drain)
		return; /* a draining worker's moves never overshoot: they need no pause */
	RebalanceConfig cf = rebalance_default_config();
	RebalanceMove mv[REBALANCE_MAX_MOVES];
	int k = rebalance_plan(rw, n, &cf, mv, REBALANCE_MAX_MOVES);
	if (k == 0) {
		sv.rb_streak = 0;
		return;
	}
	if (!drain && !now && sv.rb_fresh <= 0 && ++sv.rb_streak < REBALANCE_SAMPLES)
		return;
	for (int j = 0; j < k; j++)
		(void)order_move(mv[j].from, mv[j].to, mv[j].count);
	sv.rb_streak = 0;
	sv.rb_fresh = 0;
	sv.rb_quiet = 1;
}

/* ---- the scaler tick ---- */

/*
 * Read the CPU allowance again (at start, RELOAD, and every minute: a
 * container can be resized while it runs); logged when it changes.
 * Returns whether it changed.
 */
static bool read_cpu_allowance(void)
{
	CpuAllowance a;
	cpu_allowance_read_self(&a);
	sv.allow_read_us = mono_us();
	bool first = sv.allow.max_workers == 0; /* never read: an allowance is at least 1 */
	bool changed = first || a.cpus != sv.allow.cpus || a.from != sv.allow.from ||
	               a.max_workers != sv.allow.max_workers || a.n_core_cpus != sv.allow.n_core_cpus ||
	               memcmp(a.core_cpus, sv.allow.core_cpus, sizeof(a.core_cpus)) != 0;
	sv.allow = a;
	if (changed) {
		char what[96];
		cpu_allowance_describe(&a, what, sizeof(what));
		log_info("CPU allowance%s: %s (max_workers = 0 means %d)", first ? "" : " changed", what,
		         a.max_workers);
	}
	atomic_store(&sv.shm->scaler.cpus_milli, (uint32_t)llround(a.cpus * 1000));
	atomic_store(&sv.shm->scaler.cpus_from, (uint32_t)a.from);
	return changed;
}

/* The scaler's settings from the configuration; a clamp is logged when it first applies. */
static void resolve_scaler_config(void)
{
	const CfGlobals *g = &sv.cf->g;
	int cpus = sv.allow.max_workers;
	char what[96];
	cpu_allowance_describe(&sv.allow, what, sizeof(what));
	WorkerBounds b = worker_bounds_resolve(g, cpus, what);
	if (b.note[0] && strcmp(b.note, sv.bounds.note) != 0)
		log_warning("%s", b.note);
	sv.bounds = b;
	int min = b.min_workers, max = b.max_workers;
	sv.scf = (ScalerConfig){.min_workers = min,
	                        .max_workers = max,
	                        .up_threshold = g->worker_scale_up_threshold,
	                        .up_samples = g->worker_scale_up_samples,
	                        .down_threshold = g->worker_scale_down_threshold,
	                        .down_samples = g->worker_scale_down_samples,
	                        .cooldown_us = g->worker_scale_cooldown,
	                        .cores = cpus,
	                        .cpus = sv.allow.cpus};
	atomic_store(&sv.shm->scaler.min_workers, (uint32_t)min);
	atomic_store(&sv.shm->scaler.max_workers, (uint32_t)max);
}

static uint32_t milli(double ratio)
{
	return (uint32_t)lround(ratio * 1000);
}

/* One sample of the active workers' load: busy + run-queue wait (doc/workers.md, "The saturation signal"). */
static void sample_workers(ScalerSample *out, char *ratios, size_t len)
{
	int n = 0;
	double sum = 0, sum_cpu = 0, sum_wait = 0;
	size_t off = 0;
	ratios[0] = '\0';
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		WorkerProc *w = &sv.w[i];
		if (w->pid <= 0)
			continue;
		WorkerSlot *s = &sv.shm->slots[i];
		SchedCounters cur = {.time_ns = atomic_load(&s->sample_time_ns),
		                     .busy_ns = atomic_load(&s->busy_ns),
		                     .wait_ns = atomic_load(&s->wait_ns)};
		if (w->have_prev) {
			Saturation r = scaler_saturation(&w->prev, &cur);
			if (r.valid) {
				w->sat = r;
				w->busy_avg = w->busy_avg * 0.8 + r.busy * 0.2;
				w->wait_avg = w->wait_avg * 0.8 + r.wait * 0.2;
			}
		}
		w->prev = cur;
		w->have_prev = true;
		atomic_store(&sv.shm->scaler.busy_milli[i], milli(w->sat.busy));
		atomic_store(&sv.shm->scaler.busy_avg_milli[i], milli(w->busy_avg));
		atomic_store(&sv.shm->scaler.wait_milli[i], milli(w->sat.wait));
		atomic_store(&sv.shm->scaler.wait_avg_milli[i], milli(w->wait_avg));
		if (w->draining)
			continue;
		n++;
		sum += w->sat.load;
		sum_cpu += w->sat.busy;
		sum_wait += w->sat.wait;
		if (off < len)
			off += (size_t)snprintf(ratios + off, len - off, "%s%d:%.2f+%.2f", off ? " " : "", i,
			                        w->sat.busy, w->sat.wait);
	}
	/* how much of the allowance nobody used, and whether the cgroup's quota was hit */
	CpuReading cur;
	int64_t now = mono_us();
	cpu_reading_take(&sv.allow, now, &cur);
	CpuIdle idle = cpu_idle_between(&sv.cpu_prev, &cur, &sv.allow);
	sv.cpu_prev = cur;
	if (!idle.valid)
		idle = (CpuIdle){.idle_cpus = -1, .throttled = 0};
	atomic_store(&sv.shm->scaler.idle_milli, idle.idle_cpus < 0 ? UINT32_MAX : milli(idle.idle_cpus));
	atomic_store(&sv.shm->scaler.throttled_milli, milli(idle.throttled));
	*out = scaler_sample_make_full(now, n, sum, sum_cpu, sum_wait, idle.idle_cpus, idle.throttled);
	/* the log line's "(busy+wait 0:0.41+0.39; idle CPUs 0.25)": what of the wait counted */
	if (idle.idle_cpus >= 0 && off < len)
		snprintf(ratios + off, len - off, "; idle CPUs %.2f", idle.idle_cpus);
}

/* Scale first, then rebalance: a worker about to drain must not be sent clients. */
static void scale_tick(void);
static void old_intakes_move(int i, bool expected);
static void old_intakes_close(void);

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	for (int i = 0; i < sv.n_pred_pids; i++)
		if (kill(sv.pred_pids[i], 0) < 0 && errno == ESRCH)
			sv.pred_pids[i--] = sv.pred_pids[--sv.n_pred_pids];
	if (sv.n_pred_pids == 0 || sv.shutting_down)
		old_intakes_close();
	else
		old_intakes_move(-1, false); /* a reader for those whose worker died when none could take them */
	if (sv.n_pred_pids == 0 && atomic_load(&sv.shm->scaler.predecessor_live)) {
		/* its workers gave their counts back as they exited; stop looking at its table */
		atomic_store(&sv.shm->scaler.predecessor_live, 0);
		if (sv.pred_master > 0)
			log_info("online restart: the old process (pid %d) has exited", (int)sv.pred_master);
		else
			log_info("adoption: every worker of the old tree has exited");
	}
	if (sv.shutting_down || sv.retiring || sv.frozen)
		return;
	if (mono_us() - sv.allow_read_us >= CPUS_REREAD_US && read_cpu_allowance())
		resolve_scaler_config();
	scale_tick();
	bool now = sv.rb_now;
	sv.rb_now = false;
	rebalance_tick(now);
}

static void scale_tick(void)
{
	if (sv.shutting_down)
		return;
	ScalerSample sample;
	char ratios[SHM_MAX_WORKERS * 16 + 32]; /* "63:0.40+0.55 " per worker, then the idle CPUs */
	sample_workers(&sample, ratios, sizeof(ratios));
	int current = wanted_count();
	atomic_store(&sv.shm->scaler.current, (uint32_t)active_count());
	scaler_history_add(&sv.hist, &sample);
	ScalerResult r = scaler_decide(&sv.hist, &sv.scf, current, mono_us());
	publish_reason(r.decision, r.reason);
	if (r.decision == SCALE_HOLD) {
		atomic_store(&sv.shm->scaler.target, (uint32_t)current);
		return;
	}
	if (r.decision == SCALE_UP) {
		/* a proportional step: several forks at once (doc/workers.md, "Proportional steps") */
		int added = 0;
		for (int k = current; k < r.target; k++) {
			int i = lowest_free_slot();
			if (i < 0 || !spawn(i))
				break;
			added++;
		}
		if (added == 0)
			return;
		log_info("scaling up to %d workers: %s (busy+wait %s)", current + added, r.reason, ratios);
	} else {
		char drained[SHM_MAX_WORKERS * 20] = ""; /* "63, " each, or "63 (not respawned), " */
		size_t off = 0;
		int gone = 0;
		for (int k = current; k > r.target && k > 1; k--) {
			/*
			 * A crashed worker waiting for its respawn goes first: draining
			 * a running one instead would leave the pooler to a worker that
			 * does not exist yet, and to nobody while its forks fail.
			 */
			int i = highest_pending();
			bool pending = i >= 0;
			if (pending) {
				sv.w[i].wanted = false;
				if (sv.w[i].respawn_ev)
					evtimer_del(sv.w[i].respawn_ev);
			} else {
				i = highest_active();
				if (i <= 0)
					break;
				drain(i);
			}
			gone++;
			if (off < sizeof(drained))
				off += (size_t)snprintf(drained + off, sizeof(drained) - off, "%s%d%s", off ? ", " : "",
				                        i, pending ? " (not respawned)" : "");
		}
		if (gone == 0)
			return;
		log_info("scaling down to %d workers: draining worker%s %s: %s (busy+wait %s)", current - gone,
		         gone == 1 ? "" : "s", drained, r.reason, ratios);
		sv.rb_now = true; /* their movable clients go to the others now, not when they leave */
	}
	scaler_note_change(&sv.hist, mono_us());
	atomic_store(&sv.shm->scaler.last_change_us, (uint64_t)get_time_usec());
	atomic_store(&sv.shm->scaler.target, (uint32_t)wanted_count());
	save_count();
}

static void arm_tick(void)
{
	usec_t iv = sv.cf->g.worker_scale_interval; /* above 0: the parameter table's range */
	struct timeval tv = {(time_t)(iv / USEC_PER_SEC), (suseconds_t)(iv % USEC_PER_SEC)};
	if (!sv.tick_ev)
		sv.tick_ev = event_new(sv.base, -1, EV_PERSIST, on_tick, NULL);
	event_del(sv.tick_ev);
	event_add(sv.tick_ev, &tv);
}

/* ---- public ---- */

static int read_migrate_req(void)
{
	char *t = read_file("/proc/sys/net/ipv4/tcp_migrate_req", NULL);
	int v = t ? atoi(t) : 0;
	free(t);
	return v;
}

void supervisor_init(struct event_base *base, Config *cf, const TlsContexts *tls, ListenSet *ls, int cmdline_verbose)
{
	memset(&sv, 0, sizeof(sv));
	sv.base = base;
	sv.cf = cf;
	sv.tls = tls;
	sv.ls = ls;
	sv.cmdline_verbose = cmdline_verbose;
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		sv.w[i].ctl = -1;
		sv.served_by[i] = -1;
		for (int a = 0; a < MAX_ADDRS; a++)
			sv.lfd[i][a] = -1;
	}
	shm_create();
	read_cpu_allowance();
	resolve_scaler_config();
	atomic_store(&sv.shm->scaler.tcp_migrate_req, (uint32_t)read_migrate_req());
}

void supervisor_start(int takeover_count)
{
	int count = sv.scf.min_workers;
	const char *path = sv.cf->g.worker_state_file;
	if (takeover_count > 0) {
		/* online restart: as many workers as the old tree ran */
		count = warmstart_clamp(takeover_count, sv.scf.min_workers, sv.scf.max_workers);
		log_info("online restart: starting %d workers (the old process ran %d)", count, takeover_count);
	} else if (path && *path) {
		char err[256];
		int saved;
		if (warmstart_read(path, &saved, err, sizeof(err))) {
			count = warmstart_clamp(saved, sv.scf.min_workers, sv.scf.max_workers);
			if (count != saved)
				log_info("warm start: %d workers (saved %d in %s, clamped to [min_workers %d, "
				         "max_workers %d])",
				         count, saved, path, sv.scf.min_workers, sv.scf.max_workers);
			else
				log_info("warm start: %d workers (saved %d in %s)", count, saved, path);
		} else {
			log_info("warm start: %s; starting %d workers (min_workers)", err, count);
		}
	}
	sv.starting = true;
	for (int i = 0; i < count; i++)
		spawn(i);
	sv.starting = false;
	/* listener slots taken over (-R) beyond our workers: served by one of ours */
	adopt_orphans();
	save_count();
	atomic_store(&sv.shm->scaler.current, (uint32_t)active_count());
	atomic_store(&sv.shm->scaler.target, (uint32_t)count);
	publish_reason(SCALE_HOLD, "start");
	arm_tick();
	arm_watchdog();
}

void supervisor_config_changed(Config *cf)
{
	sv.cf = cf;
	read_cpu_allowance();
	resolve_scaler_config();
	arm_tick();
	save_count_if_moved();
	/* before the workers' SIGHUP: each notes the generation it reloaded to */
	if (sv.shm)
		atomic_fetch_add(&sv.shm->scaler.config_gen, 1);
}

void supervisor_settings_changed(void)
{
	resolve_scaler_config();
	arm_tick();
	save_count_if_moved();
}

void supervisor_signal_all(int sig)
{
	for (int i = 0; i < SHM_MAX_WORKERS; i++)
		if (sv.w[i].pid > 0)
			kill(sv.w[i].pid, sig);
}

void supervisor_wait_exit(int timeout_ms)
{
	usec_t deadline = get_time_usec() + (usec_t)timeout_ms * 1000;
	for (;;) {
		bool left = false;
		for (int i = 0; i < SHM_MAX_WORKERS; i++) {
			if (sv.w[i].pid <= 0)
				continue;
			pid_t r = waitpid(sv.w[i].pid, NULL, WNOHANG);
			if (r == sv.w[i].pid || (r < 0 && errno == ECHILD))
				sv.w[i].pid = 0;
			else
				left = true;
		}
		if (!left)
			return;
		if (get_time_usec() >= deadline)
			break;
		struct timespec ts = {0, 5 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	for (int i = 0; i < SHM_MAX_WORKERS; i++)
		if (sv.w[i].pid > 0)
			log_warning("worker %d (pid %d) did not exit within %d ms of SIGQUIT: killing it", i,
			            (int)sv.w[i].pid, timeout_ms);
}

void supervisor_kill_all(void)
{
	for (int i = 0; i < SHM_MAX_WORKERS; i++)
		if (sv.w[i].pid > 0) {
			kill(sv.w[i].pid, SIGKILL);
			sv.w[i].pid = 0;
		}
}

static void on_respawn(evutil_socket_t fd, short what, void *arg);

/* Start a worker in slot i again after a back-off: 0.1 s, doubling up to 5 s while it keeps failing. */
static void arm_respawn(int i)
{
	WorkerProc *w = &sv.w[i];
	int delay_ms = 100 << (w->crashes < 6 ? w->crashes : 6);
	if (delay_ms > 5000)
		delay_ms = 5000;
	w->crashes++;
	struct timeval tv = {delay_ms / 1000, (delay_ms % 1000) * 1000};
	if (!w->respawn_ev)
		w->respawn_ev = evtimer_new(sv.base, on_respawn, (void *)(intptr_t)i);
	evtimer_add(w->respawn_ev, &tv);
}

static void on_respawn(evutil_socket_t fd, short what, void *arg)
{
	int i = (int)(intptr_t)arg;
	/* a fork that failed (EAGAIN) is tried again: the slot stays wanted, and counted */
	if (!sv.shutting_down && !sv.retiring && sv.w[i].wanted && sv.w[i].pid == 0 && !spawn(i))
		arm_respawn(i);
}

/* ---- the watchdog (doc/workers.md, "When a worker hangs") ---- */

#define WATCHDOG_PERIOD_US 250000 /* how often the master looks at the workers' heartbeats */

/* Worker i's loop has been silent too long: its listener slots go to a responsive worker. */
static void watchdog_flag(int i, double silent_s)
{
	WorkerProc *w = &sv.w[i];
	w->hung = true;
	atomic_store(&sv.shm->slots[i].hung, 1);
	int s = survivor(i);
	if (s < 0) {
		log_warning("worker %d (pid %d) has not run its event loop for %.1f s, and no other worker can take "
		            "its connections",
		            i, (int)w->pid, silent_s);
		return;
	}
	log_warning("worker %d (pid %d) has not run its event loop for %.1f s: new connections go to worker %d", i,
	            (int)w->pid, silent_s, s);
	if (n_addrs() > 0)
		adopt_orphans();
}

/* Worker i runs again: its own slot comes back to it, slots it stood in for stay where they went. */
static void watchdog_clear(int i, double silent_s)
{
	WorkerProc *w = &sv.w[i];
	w->hung = false;
	atomic_store(&sv.shm->slots[i].hung, 0);
	log_info("worker %d (pid %d) runs again after %.1f s", i, (int)w->pid, silent_s);
	for (int k = 0; k < SHM_MAX_WORKERS && n_addrs() > 0; k++) {
		int by = sv.served_by[k];
		if (!(w->holds >> k & 1) || by == i)
			continue;
		if (k == i) {
			if (by >= 0 && sv.w[by].pid > 0)
				take_back(k, by);
			sv.served_by[k] = i;
		} else {
			take_back(k, i);
		}
	}
	/* a slot nobody could take while it hung (it was the only worker) is its own again */
	for (int k = 0; k < SHM_MAX_WORKERS; k++)
		if (w->holds >> k & 1)
			sv.served_by[k] = i;
	adopt_orphans();
	publish_listeners();
}

static void on_watchdog(evutil_socket_t fd, short what, void *arg)
{
	int64_t now_us = mono_us();
	int64_t late_us = sv.watchdog_last_us ? now_us - sv.watchdog_last_us - WATCHDOG_PERIOD_US : 0;
	sv.watchdog_last_us = now_us;
	usec_t limit = sv.cf->g.worker_watchdog_timeout;
	if (sv.shutting_down || sv.retiring)
		return;
	/* we were stopped ourselves (or the whole machine was): give the workers a period to publish */
	if (late_us > (int64_t)WATCHDOG_PERIOD_US * 4)
		return;
	int64_t now = mono_us() * 1000; /* sample_time_ns is CLOCK_MONOTONIC too */
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		WorkerProc *w = &sv.w[i];
		if (w->pid <= 0)
			continue;
		WorkerSlot *slot = &sv.shm->slots[i];
		uint32_t st = atomic_load(&slot->state);
		uint64_t seen = atomic_load(&slot->sample_time_ns);
		double silent_s = seen && now > (int64_t)seen ? (double)(now - (int64_t)seen) / 1e9 : 0;
		bool serving = st == SLOT_ACTIVE || st == SLOT_DRAINING;
		if (!serving || limit == 0 || silent_s * USEC_PER_SEC < (double)limit) {
			if (w->hung && !w->hung_killed)
				watchdog_clear(i, silent_s);
			continue;
		}
		if (!w->hung) {
			watchdog_flag(i, silent_s);
		} else if (!w->hung_killed && silent_s * USEC_PER_SEC >= 2.0 * (double)limit) {
			log_error("worker %d (pid %d) has not run its event loop for %.1f s: killing it, the slot "
			          "gets a new worker",
			          i, (int)w->pid, silent_s);
			w->hung_killed = true;
			kill(w->pid, SIGKILL);
		}
	}
}

static void arm_watchdog(void)
{
	if (sv.watchdog_ev)
		return;
	struct timeval tv = {0, WATCHDOG_PERIOD_US};
	sv.watchdog_ev = event_new(sv.base, -1, EV_PERSIST, on_watchdog, NULL);
	event_add(sv.watchdog_ev, &tv);
}

/* ---- online restart (-R) ---- */

int supervisor_export(int conn)
{
	if (conn < 0) {
		sv.frozen = false;
		return 0;
	}
	sv.frozen = true;
	for (int k = 0; k < SHM_MAX_WORKERS; k++)
		for (int a = 0; a < n_addrs(); a++)
			if (sv.lfd[k][a] >= 0 && !upgrade_send_listener(conn, listener_id(k, a), sv.lfd[k][a]))
				return -1;
	if (sv.ls->unix_sock.fd >= 0 && !upgrade_send_listener(conn, UINT32_MAX, sv.ls->unix_sock.fd))
		return -1;
	if (sv.shm_fd >= 0 && !upgrade_send_segment(conn, sv.shm_fd))
		return -1;
	return wanted_count();
}

void supervisor_predecessor(int shm_fd, pid_t master, const pid_t *pids, int n)
{
	if (shm_fd < 0)
		return;
	const ShmSegment *p = mmap(NULL, sizeof(ShmSegment), PROT_READ, MAP_SHARED, shm_fd, 0);
	close(shm_fd);
	if (p == MAP_FAILED || p->magic != SHM_MAGIC || p->version != SHM_VERSION ||
	    p->slot_size != sizeof(WorkerSlot)) {
		/* another layout (an older binary): limits count this tree only during the overlap */
		log_warning("online restart: the old process's shared memory has another layout; until it exits, "
		            "pool limits count the new process's connections only");
		if (p != MAP_FAILED)
			munmap((void *)p, sizeof(ShmSegment));
		return;
	}
	budget_predecessor = &p->budget;
	/*
	 * Clients the old tree hands over keep their ids (SHOW CLIENTS,
	 * KILL_CLIENT): ours start far above what it has given out, so that the
	 * two never meet while it runs (it would need 2^32 more connections).
	 */
	atomic_store(&sv.shm->next_socket_id, atomic_load(&p->next_socket_id) + SOCKET_IDS_PER_TREE);
	sv.pred_master = master;
	for (int i = 0; i < n && i < (int)(sizeof(sv.pred_pids) / sizeof(sv.pred_pids[0])); i++)
		if (pids[i] > 0)
			sv.pred_pids[sv.n_pred_pids++] = pids[i];
	atomic_store(&sv.shm->scaler.predecessor_live, 1);
}

void supervisor_inherit(InheritedSocket *s, int n)
{
	for (int i = 0; i < n; i++) {
		if (s[i].fd < 0 || s[i].slot <= 0 || s[i].slot >= SHM_MAX_WORKERS)
			continue;
		for (int a = 0; a < n_addrs(); a++) {
			const ListenAddr *la = &sv.ls->addrs[sv.ls->tcp[a].addr_index];
			if (sv.lfd[s[i].slot][a] < 0 &&
			    listen_addr_same((const struct sockaddr *)&la->sa, (const struct sockaddr *)&s[i].sa)) {
				sv.lfd[s[i].slot][a] = s[i].fd;
				s[i].fd = -1;
				listen_apply_options(sv.lfd[s[i].slot][a], &sv.cf->g);
				break;
			}
		}
	}
	/* slot 0's sockets are the ListenSet's (listen_setup() took them) */
	for (int a = 0; a < n_addrs(); a++)
		sv.lfd[0][a] = sv.ls->tcp[a].fd;
}

void supervisor_wait_active(int timeout_ms)
{
	for (int waited = 0; waited < timeout_ms; waited += 10) {
		int starting = 0;
		for (int i = 0; i < SHM_MAX_WORKERS; i++)
			starting += sv.w[i].pid > 0 && atomic_load(&sv.shm->slots[i].state) == SLOT_STARTING;
		if (starting == 0)
			return;
		struct timespec ts = {0, 10 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
}

/* Worker `to` reads old worker k's hand-over socket fd (CH_ADOPT); false when it could not be told. */
static bool give_old_intake(int to, int k, int fd)
{
	ChannelMsg m = {.type = CH_ADOPT, .id = (uint32_t)k, .arg = 1}; /* arg 1: from the old tree */
	return tell(to, &m, fd);
}

/* An active worker to read old worker k's clients, -1 = none now. */
static int old_intake_reader(int k)
{
	int act[SHM_MAX_WORKERS], n = 0;
	for (int i = 0; i < SHM_MAX_WORKERS; i++)
		if (is_active(i) && takes_orders(i))
			act[n++] = i;
	return n == 0 ? -1 : act[k % n];
}

bool supervisor_adopt_old(int k, int fd)
{
	int to = old_intake_reader(k);
	if (to < 0 || !give_old_intake(to, k, fd))
		return false;
	int keep;
	if (sv.n_old_intake < (int)(sizeof(sv.old_intake) / sizeof(sv.old_intake[0])) &&
	    (keep = fcntl(fd, F_DUPFD_CLOEXEC, 0)) >= 0)
		sv.old_intake[sv.n_old_intake++] = (OldIntake){.fd = keep, .k = k, .to = to, .dead = -1};
	return true;
}

/*
 * Our worker i died: the old-tree sockets it read go to another worker
 * (now, or at the next tick when none is active), or its old-tree clients
 * would finish in the old tree, which would then run as long as they stay
 * connected. One that died draining had stopped its intakes: they end.
 */
static void old_intakes_move(int i, bool expected)
{
	for (int j = 0; j < sv.n_old_intake; j++) {
		OldIntake *in = &sv.old_intake[j];
		if (in->to != i)
			continue; /* i = -1: those without a reader */
		if (i >= 0 && expected) {
			close(in->fd);
			sv.old_intake[j--] = sv.old_intake[--sv.n_old_intake];
			continue;
		}
		if (i >= 0)
			in->dead = i;
		int to = old_intake_reader(in->k);
		in->to = to >= 0 && give_old_intake(to, in->k, in->fd) ? to : -1;
		if (in->to >= 0)
			log_info("worker %d takes on the clients of the old tree's worker %d from worker %d", in->to,
			         in->k, in->dead);
	}
}

/* The old tree is gone: nothing more comes over its sockets. */
static void old_intakes_close(void)
{
	for (int j = 0; j < sv.n_old_intake; j++)
		close(sv.old_intake[j].fd);
	sv.n_old_intake = 0;
}

void supervisor_predecessor_add(const pid_t *pids, int n)
{
	for (int i = 0; i < n && sv.n_pred_pids < (int)(sizeof(sv.pred_pids) / sizeof(sv.pred_pids[0])); i++)
		if (pids[i] > 0)
			sv.pred_pids[sv.n_pred_pids++] = pids[i];
	if (sv.n_pred_pids > 0 && budget_predecessor)
		atomic_store(&sv.shm->scaler.predecessor_live, 1); /* the old tree's counts add to ours again */
}

bool supervisor_settled(void)
{
	return sv.settled;
}

void supervisor_settle(void)
{
	sv.settled = true;
	ChannelMsg m = {.type = CH_SETTLE};
	for (int i = 0; i < SHM_MAX_WORKERS; i++)
		(void)tell(i, &m, -1);
}

void supervisor_retire(void)
{
	sv.retiring = true;
	sv.frozen = false;
	int64_t timeout_ms = sv.cf->g.worker_drain_timeout / 1000;
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		WorkerProc *w = &sv.w[i];
		w->wanted = false;
		if (w->respawn_ev)
			evtimer_del(w->respawn_ev);
		if (w->pid <= 0)
			continue;
		w->draining = true;
		atomic_store(&sv.shm->slots[i].state, SLOT_DRAINING);
		ChannelMsg m = {.type = CH_DRAIN, .id = 1, .arg = timeout_ms};
		(void)tell(i, &m, -1);
		/* a socket to a new worker: our clients go there as they become movable */
		int hfd = upgrade_next_handoff();
		ChannelMsg h = {.type = CH_HANDOFF};
		if (hfd >= 0) {
			(void)tell(i, &h, hfd);
			close(hfd);
		}
	}
	/* the new tree holds the same sockets: closing ours loses nothing queued */
	supervisor_close_tcp();
	if (sv.tick_ev)
		event_del(sv.tick_ev);
}

bool supervisor_reap(bool shutting_down)
{
	int status;
	pid_t pid;
	sv.shutting_down = shutting_down;
	while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
		int i;
		for (i = 0; i < SHM_MAX_WORKERS; i++)
			if (sv.w[i].pid == pid)
				break;
		if (i == SHM_MAX_WORKERS)
			continue;
		WorkerProc *w = &sv.w[i];
		bool expected = w->draining || shutting_down;
		/* a worker that ran for a while starts the back-off afresh */
		uint64_t started = atomic_load(&sv.shm->slots[i].start_time_us);
		if (started && (uint64_t)get_time_usec() - started > 30 * (uint64_t)USEC_PER_SEC)
			w->crashes = 0;
		w->pid = 0;
		if (w->ctl_ev) {
			event_free(w->ctl_ev);
			w->ctl_ev = NULL;
		}
		channel_out_free(w->out); /* what it did not read goes nowhere now */
		w->out = NULL;
		close(w->ctl);
		w->ctl = -1;
		w->holds = 0;
		w->hung = w->hung_killed = false;
		slot_reset(i);
		publish_listeners();
		moved_forget_slot(i);
		/* whatever it held (servers it can no longer close, clients) goes back to the others */
		budget_reset_worker(&sv.shm->budget, i);
		old_intakes_move(i, expected);
		if (expected) {
			/* on its way out: not respawned, but a crash is still a crash in the log */
			const char *during = w->draining ? " while draining" : " while shutting down";
			if (WIFSIGNALED(status))
				log_error("worker %d (pid %d) was terminated by signal %d%s", i, (int)pid,
				          WTERMSIG(status), during);
			else if (WEXITSTATUS(status) != 0)
				log_error("worker %d (pid %d) exited with status %d%s", i, (int)pid,
				          WEXITSTATUS(status), during);
			else
				log_info("worker %d (pid %d) exited%s", i, (int)pid,
				         w->draining ? " after draining" : "");
			w->draining = false;
			continue;
		}
		if (WIFSIGNALED(status))
			log_error("worker %d (pid %d) was terminated by signal %d", i, (int)pid, WTERMSIG(status));
		else
			log_error("worker %d (pid %d) exited with status %d", i, (int)pid, WEXITSTATUS(status));
		/* its listener slot goes to a survivor at once; the slot is respawned with back-off */
		adopt_orphans();
		arm_respawn(i);
	}
	if (shutting_down)
		return supervisor_live_workers() == 0;
	return false;
}

ShmSegment *supervisor_shm(void)
{
	return sv.shm;
}
