"""No single process takes the pooler down (doc/workers.md, "Listener slots",
"When a worker hangs"): every listener slot has a live acceptor after drains
and crashes, and a worker whose event loop stops gets no new clients and is
replaced."""

import os
import shutil
import subprocess
import signal
from pathlib import Path

import psycopg
import pytest

from conftest import wait_for
from helpers import conn_on, console, preload_shim, rows, worker_of

TWO = {"min_workers": 2, "max_workers": 2, "log_connections": 0, "log_disconnections": 0}


def private_console(b, worker):
    """A console on one given worker, through its private socket (never through a hung worker)."""
    return psycopg.connect(host=str(b.dir / f"pgbouncer-workers.{b.port}" / f"worker.{worker}"), port=b.port,
                           user="pgbouncer", dbname="pgbouncer", autocommit=True, connect_timeout=10)


def show_workers(b, via=0):
    """SHOW WORKERS by worker id, from worker `via` ({} while it is being replaced)."""
    try:
        with private_console(b, via) as c:
            return {r["worker"]: r for r in rows(c, "SHOW WORKERS")}
    except psycopg.OperationalError:
        return {}


def states(b):
    return [w["state"] for w in show_workers(b).values()]


def logins(b, n, timeout=5):
    """n new logins over TCP, each with a connect timeout; returns the workers that served them."""
    served = []
    for _ in range(n):
        with psycopg.connect(host="127.0.0.1", port=b.port, dbname="postgres", user="postgres",
                             connect_timeout=timeout) as c:
            assert c.execute("SELECT 1").fetchone() == (1,)
            served.append(worker_of(c))
    return served


def test_drain_then_crash_keeps_every_listener_served(bouncer):
    """Worker 1 drains and hands its listener slot to worker 0; worker 0 is
    then killed. The respawned worker 0 accepts on both slots: every new
    login is served, none waits in a queue nobody accepts from."""
    b = bouncer(ini_overrides=TWO)
    wait_for(lambda: states(b) == ["active", "active"], "two workers")
    assert show_workers(b)[0]["listeners"] == "0"
    assert show_workers(b)[1]["listeners"] == "1"

    b.update(max_workers=1, min_workers=1)
    b.write_ini()
    b.reload()
    wait_for(lambda: list(show_workers(b)) == [0], "worker 1 drained and gone")
    assert show_workers(b)[0]["listeners"] == "0,1"

    victim = show_workers(b)[0]["pid"]
    os.kill(victim, signal.SIGKILL)
    b.wait_log(rf"worker 0 \(pid {victim}\) was terminated by signal 9")
    wait_for(lambda: (lambda w: 0 in w and w[0]["pid"] != victim and w[0]["state"] == "active")(show_workers(b)),
             "worker 0 respawned")
    assert show_workers(b)[0]["listeners"] == "0,1"
    b.wait_log(r"worker 0 started, pid \d+; it also accepts on listener slots nobody served")
    # the kernel spreads new connections over both slots' queues: each must be served
    assert logins(b, 10) == [0] * 10


def test_crash_with_a_survivor_hands_the_slot_over_and_back(bouncer):
    """Worker 1 dies: its slot goes to worker 0 at once, and back to the new worker 1."""
    b = bouncer(ini_overrides=TWO)
    wait_for(lambda: states(b) == ["active", "active"], "two workers")
    victim = show_workers(b)[1]["pid"]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: (lambda w: 1 in w and w[1]["pid"] != victim and w[1]["state"] == "active")(show_workers(b)),
             "worker 1 respawned")
    wait_for(lambda: {k: w["listeners"] for k, w in show_workers(b).items()} == {0: "0", 1: "1"},
             "each worker on its own slot again")
    # every login is served (a slot without an acceptor would make some time out), on both workers
    served = logins(b, 20)
    wait_for(lambda: set(served + logins(b, 4)) == {0, 1}, "logins on both workers")


def test_hung_worker_gets_no_new_clients_and_is_replaced(bouncer):
    """Worker 1 is stopped (SIGSTOP) for longer than worker_watchdog_timeout:
    it is shown as hung, its listener slot goes to worker 0 (so every new
    login succeeds, all on worker 0), the console leaves it out at once
    instead of waiting for it, and once it stays silent for twice the
    timeout it is killed and its slot gets a new worker."""
    b = bouncer(ini_overrides=dict(TWO, worker_watchdog_timeout=2))
    wait_for(lambda: states(b) == ["active", "active"], "two workers")
    stopped = show_workers(b)[1]["pid"]
    os.kill(stopped, signal.SIGSTOP)
    try:
        wait_for(lambda: states(b) == ["active", "hung"], "worker 1 shown as hung")
        assert show_workers(b)[0]["listeners"] == "0,1"
        b.wait_log(rf"worker 1 \(pid {stopped}\) has not run its event loop for \d+\.\d s: "
                   r"new connections go to worker 0")
        assert logins(b, 10) == [0] * 10
        # the merged console does not wait for the hung worker: it says so
        notices = []
        with b.admin(connect_timeout=5) as c:  # its private socket would answer for worker 0 alone
            assert worker_of(c) == 0
            c.add_notice_handler(lambda d: notices.append(d.message_primary))
            rows(c, "SHOW POOLS")
        assert any("worker 1" in n and "hung" in n for n in notices), notices
        wait_for(lambda: show_workers(b).get(1, {}).get("pid") not in (None, stopped), "worker 1 replaced",
                 timeout=30)
    finally:
        try:
            os.kill(stopped, signal.SIGCONT)
        except ProcessLookupError:
            pass
    b.wait_log(rf"worker 1 \(pid {stopped}\) has not run its event loop for \d+\.\d s: killing it")
    wait_for(lambda: show_workers(b)[1]["state"] == "active", "the new worker 1 active")
    wait_for(lambda: {k: w["listeners"] for k, w in show_workers(b).items()} == {0: "0", 1: "1"},
             "each worker on its own slot again")
    served = logins(b, 20)  # each with a connect timeout: none may wait on a slot nobody serves
    wait_for(lambda: set(served + logins(b, 4)) == {0, 1}, "logins on the new worker 1 too")


def test_worker_that_runs_again_gets_its_slot_back(bouncer):
    """A worker stopped for longer than the timeout but shorter than twice it
    is flagged, then recovers: it is active again with its own slot, not killed."""
    b = bouncer(ini_overrides=dict(TWO, worker_watchdog_timeout=3))
    wait_for(lambda: states(b) == ["active", "active"], "two workers")
    pid = show_workers(b)[1]["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: states(b) == ["active", "hung"], "worker 1 shown as hung")
    finally:
        os.kill(pid, signal.SIGCONT)
    b.wait_log(rf"worker 1 \(pid {pid}\) runs again after \d+\.\d s")
    wait_for(lambda: {k: (w["pid"], w["state"], w["listeners"]) for k, w in show_workers(b).items()}[1]
             == (pid, "active", "1"), "worker 1 active on its own slot")
    assert show_workers(b)[0]["listeners"] == "0"
    assert "killing it" not in b.log_text()


def test_metrics_with_a_hung_worker(bouncer):
    """Worker 0 hangs: /metrics asks worker 1 instead (the scrape does not
    wait for worker 0), says pgbouncer_up 1, and shows worker 0 as hung."""
    from conftest import free_port
    from test_metrics import scrape, value
    mport = free_port()
    b = bouncer(ini_overrides=dict(TWO, worker_watchdog_timeout=3, metrics_listen=f"127.0.0.1:{mport}"))
    wait_for(lambda: states(b) == ["active", "active"], "two workers")
    pid = show_workers(b, via=1)[0]["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: show_workers(b, via=1)[0]["state"] == "hung", "worker 0 shown as hung")
        samples, _, _ = scrape(mport)
        assert value(samples, "pgbouncer_up") == 1
        assert value(samples, "pgbouncer_worker_state", worker="0", state="hung") == 1
        assert value(samples, "pgbouncer_worker_state", worker="1", state="active") == 1
        assert "metrics: the console connection timed out" not in b.log_text()
    finally:
        os.kill(pid, signal.SIGCONT)


def test_crash_of_the_stand_in_while_a_drain_runs_keeps_every_listener_served(bouncer):
    """Worker 1 drains but keeps a client in a transaction; its listener slot
    went to worker 0, which is then killed. The respawned worker 0 accepts on
    slot 1 too: the draining worker closed its copy, so no login may wait in
    slot 1's queue for nobody."""
    b = bouncer(ini_overrides=TWO)
    wait_for(lambda: states(b) == ["active", "active"], "two workers")
    held = conn_on(b, 1)
    held.execute("BEGIN")
    held.execute("SELECT 1")
    b.update(max_workers=1, min_workers=1)
    b.write_ini()
    b.reload()
    wait_for(lambda: show_workers(b).get(1, {}).get("state") == "draining", "worker 1 draining")
    wait_for(lambda: show_workers(b)[0]["listeners"] == "0,1", "slot 1 served by worker 0")

    victim = show_workers(b)[0]["pid"]
    os.kill(victim, signal.SIGKILL)
    b.wait_log(rf"worker 0 \(pid {victim}\) was terminated by signal 9")
    wait_for(lambda: (lambda w: 0 in w and w[0]["pid"] != victim and w[0]["state"] == "active")(show_workers(b)),
             "worker 0 respawned")
    assert show_workers(b)[0]["listeners"] == "0,1"
    # the kernel spreads new connections over both slots' queues: each must be served
    assert logins(b, 10) == [0] * 10
    # the client in its transaction carries on
    assert held.execute("SELECT 2").fetchone() == (2,)
    held.execute("COMMIT")
    held.close()


def test_respawn_taking_many_listener_slots_on_several_addresses(bouncer):
    """Six workers on three listen addresses drain to one, which then stands
    in for 18 listener sockets; it is killed. The respawned worker starts
    with all of them (and the unix socket) and serves every address."""
    addrs = ["127.0.0.1", "127.0.0.3", "127.0.0.4"]
    b = bouncer(ini_overrides={**TWO, "min_workers": 6, "max_workers": 6, "listen_addr": ",".join(addrs)})
    wait_for(lambda: states(b) == ["active"] * 6, "six workers")
    with console(b) as admin:
        admin.execute("SET min_workers = 1")
        admin.execute("SET max_workers = 1")
    wait_for(lambda: list(show_workers(b)) == [0], "workers 1-5 drained and gone")
    assert show_workers(b)[0]["listeners"] == "0,1,2,3,4,5"

    victim = show_workers(b)[0]["pid"]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: (lambda w: 0 in w and w[0]["pid"] != victim and w[0]["state"] == "active")(show_workers(b)),
             "worker 0 respawned")
    respawned = show_workers(b)[0]["pid"]
    assert show_workers(b)[0]["listeners"] == "0,1,2,3,4,5"
    for host in addrs:
        for _ in range(6):
            with psycopg.connect(host=host, port=b.port, dbname="postgres", user="postgres",
                                 connect_timeout=5) as c:
                assert c.execute("SELECT 1").fetchone() == (1,)
    assert show_workers(b)[0]["pid"] == respawned
    assert "terminated by signal 6" not in b.log_text()


def test_listen_addresses_beyond_sixteen_are_refused_not_left_unserved(bouncer):
    """Workers accept on 16 TCP addresses at most. A 17th is not listened
    on (an error in the log, its connections refused at once) rather than
    listened on by the master alone, where logins waited for nobody."""
    addrs = ["127.0.0.1"] + [f"127.0.1.{i}" for i in range(1, 17)]
    b = bouncer(ini_overrides={"listen_addr": ",".join(addrs)})
    b.wait_log(rf"cannot listen on 127\.0\.1\.16:{b.port}: at most 16 TCP addresses are served")
    for host in addrs[:16]:
        with psycopg.connect(host=host, port=b.port, dbname="postgres", user="postgres", connect_timeout=5) as c:
            assert c.execute("SELECT 1").fetchone() == (1,)
    with pytest.raises(psycopg.OperationalError, match="refused"):
        psycopg.connect(host=addrs[16], port=b.port, dbname="postgres", user="postgres", connect_timeout=5)


def test_one_worker_stands_in_for_every_slot_of_sixteen_addresses(bouncer):
    """17 workers on 16 addresses drain to one, which then accepts on 272
    listener sockets: every address serves every login (no socket handed
    over is closed for want of room)."""
    addrs = ["127.0.0.1"] + [f"127.0.1.{i}" for i in range(1, 16)]
    b = bouncer(ini_overrides={**TWO, "min_workers": 17, "max_workers": 17, "listen_addr": ",".join(addrs)})
    wait_for(lambda: states(b) == ["active"] * 17, "17 workers")
    with console(b) as admin:
        admin.execute("SET min_workers = 1")
        admin.execute("SET max_workers = 1")
    wait_for(lambda: list(show_workers(b)) == [0], "workers 1-16 drained and gone")
    assert show_workers(b)[0]["listeners"] == ",".join(str(k) for k in range(17))
    for host in addrs:
        for _ in range(12):
            with psycopg.connect(host=host, port=b.port, dbname="postgres", user="postgres",
                                 connect_timeout=5) as c:
                assert c.execute("SELECT 1").fetchone() == (1,)
    assert "too many listeners" not in b.log_text()


def test_crash_of_a_draining_worker_is_logged_as_a_crash(bouncer):
    """A draining worker that dies of a signal is not respawned (it was on
    its way out), but the log says it was killed, not that it drained."""
    b = bouncer(ini_overrides=TWO)
    wait_for(lambda: states(b) == ["active", "active"], "two workers")
    held = conn_on(b, 1)
    held.execute("BEGIN")
    held.execute("SELECT 1")
    with console(b) as admin:
        admin.execute("SET min_workers = 1")
        admin.execute("SET max_workers = 1")
    wait_for(lambda: show_workers(b).get(1, {}).get("state") == "draining", "worker 1 draining")
    victim = show_workers(b)[1]["pid"]
    os.kill(victim, signal.SIGKILL)
    b.wait_log(rf"worker 1 \(pid {victim}\) was terminated by signal 9 while draining")
    assert f"worker 1 (pid {victim}) exited after draining" not in b.log_text()
    wait_for(lambda: list(show_workers(b)) == [0], "worker 1 gone, not respawned")
    assert logins(b, 4) == [0] * 4


FAIL_FORK = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

pid_t fork(void)
{
	const char *flag = getenv("PGB_TEST_FAIL_FORK");
	if (flag && access(flag, F_OK) == 0) {
		errno = EAGAIN;
		return -1;
	}
	pid_t (*real)(void) = (pid_t(*)(void))dlsym(RTLD_NEXT, "fork");
	return real();
}
"""


@pytest.fixture
def failing_fork(session_dir, tmp_path):
    """(env, flag): a pooler started with env fails every fork() (EAGAIN, as at a
    process limit) while the flag file exists."""
    flag = session_dir / f"failfork-{os.getpid()}-{tmp_path.name}.flag"
    env, so = preload_shim(session_dir, tmp_path, "failfork", FAIL_FORK, PGB_TEST_FAIL_FORK=str(flag))
    yield env, flag
    flag.unlink(missing_ok=True)
    so.unlink(missing_ok=True)


def test_failed_fork_leaves_no_listener_slot_unserved(bouncer, failing_fork):
    """A scale-up whose fork() fails has opened the new worker's listener
    slot already, which takes its share of new connections: the running
    worker accepts on it until a fork succeeds."""
    env, flag = failing_fork
    b = bouncer(ini_overrides={**TWO, "min_workers": 1, "max_workers": 2}, env=env)
    wait_for(lambda: states(b) == ["active"], "one worker")
    flag.write_text("")
    with console(b) as admin:
        admin.execute("SET min_workers = 2")
    b.wait_log(r"fork\(\) failed")
    wait_for(lambda: show_workers(b)[0]["listeners"] == "0,1", "slot 1 served by worker 0")
    assert logins(b, 10) == [0] * 10
    flag.unlink()
    wait_for(lambda: states(b) == ["active", "active"], "the second worker once fork() works")


def test_respawn_whose_fork_fails_is_tried_again(bouncer, failing_fork):
    """The only worker is killed while fork() fails: its respawn is tried
    again with the back-off, not given up with the slot still counted."""
    env, flag = failing_fork
    b = bouncer(ini_overrides={**TWO, "min_workers": 1, "max_workers": 1}, env=env)
    wait_for(lambda: states(b) == ["active"], "one worker")
    victim = show_workers(b)[0]["pid"]
    flag.write_text("")
    os.kill(victim, signal.SIGKILL)
    b.wait_log(rf"worker 0 \(pid {victim}\) was terminated by signal 9")
    b.wait_log(r"fork\(\) failed")
    flag.unlink()
    wait_for(lambda: (lambda w: 0 in w and w[0]["pid"] != victim and w[0]["state"] == "active")(show_workers(b)),
             "worker 0 respawned once fork() works")
    assert logins(b, 4) == [0] * 4


def test_scale_down_gives_up_a_pending_respawn_before_a_running_worker(bouncer, failing_fork):
    """Worker 0 crashed and cannot be started again (fork() fails) when
    max_workers goes down to 1: its slot is given up, and worker 1, which
    runs, keeps serving, instead of draining with nobody to take over."""
    env, flag = failing_fork
    b = bouncer(ini_overrides=TWO, env=env)
    wait_for(lambda: states(b) == ["active", "active"], "two workers")
    victim = show_workers(b)[0]["pid"]
    flag.write_text("")
    os.kill(victim, signal.SIGKILL)
    b.wait_log(rf"worker 0 \(pid {victim}\) was terminated by signal 9")
    b.wait_log(r"fork\(\) failed")
    with private_console(b, 1) as admin:
        admin.execute("SET min_workers = 1")
        admin.execute("SET max_workers = 1")
    b.wait_log(r"scaling down to 1 workers: draining worker")
    assert logins(b, 6) == [1] * 6
    assert show_workers(b, via=1)[1]["state"] == "active"
    assert show_workers(b, via=1)[1]["listeners"] == "0,1"
    assert "scaling down to 1 workers: draining worker 0 (not respawned)" in b.log_text()
    flag.unlink()
    assert logins(b, 6) == [1] * 6
    assert list(show_workers(b, via=1)) == [1]


# Holds a worker where a test wants it: bind() of worker 1's private socket (before it calls itself
# active) waits while PGB_TEST_HOLD_BIND exists, and epoll_wait() in the process whose pid
# PGB_TEST_HOLD_LOOP holds waits while that file does (before its loop reads the master's orders).
HOLD = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static int holds_me(const char *flag)
{
	int fd = flag ? open(flag, O_RDONLY | O_CLOEXEC) : -1;
	if (fd < 0)
		return 0;
	char buf[32] = {0};
	ssize_t got = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	return got > 0 && atoi(buf) == (int)getpid();
}

int bind(int fd, const struct sockaddr *sa, socklen_t len)
{
	const char *flag = getenv("PGB_TEST_HOLD_BIND");
	if (sa->sa_family == AF_UNIX && strstr(((const struct sockaddr_un *)sa)->sun_path, "/worker.1/"))
		while (flag && access(flag, F_OK) == 0)
			usleep(20000);
	int (*real)(int, const struct sockaddr *, socklen_t) = dlsym(RTLD_NEXT, "bind");
	return real(fd, sa, len);
}

int epoll_wait(int epfd, struct epoll_event *ev, int n, int timeout)
{
	const char *flag = getenv("PGB_TEST_HOLD_LOOP");
	if (holds_me(flag)) {
		char held[4096];
		snprintf(held, sizeof(held), "%s.held", flag);
		close(open(held, O_WRONLY | O_CREAT | O_CLOEXEC, 0644)); /* the test sees the loop held */
		while (holds_me(flag))
			usleep(20000);
	}
	int (*real)(int, struct epoll_event *, int, int) = dlsym(RTLD_NEXT, "epoll_wait");
	return real(epfd, ev, n, timeout);
}
"""


def test_worker_drained_while_starting_shows_draining(bouncer, session_dir, tmp_path):
    """Worker 1 is still starting when max_workers goes back down and the master drains it: once it
    is up it shows draining, not active (its start overwrote the master's mark: SHOW WORKERS and
    /metrics called a worker active that was on its way out)."""
    hold_bind = session_dir / f"hold-bind-{os.getpid()}-{tmp_path.name}"
    hold_loop = session_dir / f"hold-loop-{os.getpid()}-{tmp_path.name}"
    env, so = preload_shim(session_dir, tmp_path, "hold", HOLD, PGB_TEST_HOLD_BIND=str(hold_bind),
                           PGB_TEST_HOLD_LOOP=str(hold_loop))
    try:
        b = bouncer(ini_overrides={**TWO, "min_workers": 1, "max_workers": 2}, env=env)
        wait_for(lambda: states(b) == ["active"], "one worker")
        hold_bind.write_text("")
        # on worker 0's own socket: a TCP login may land on the slot of worker 1, which waits
        with private_console(b, 0) as admin:
            admin.execute("SET min_workers = 2")
        wait_for(lambda: states(b) == ["active", "starting"], "worker 1 starting")
        pid = show_workers(b)[1]["pid"]
        with private_console(b, 0) as admin:
            admin.execute("SET min_workers = 1")
            admin.execute("SET max_workers = 1")
        wait_for(lambda: states(b) == ["active", "draining"], "worker 1 drained while it starts")
        hold_loop.write_text(str(pid))
        hold_bind.unlink()
        # past its start, before its loop reads the order to drain
        held = Path(f"{hold_loop}.held")
        wait_for(held.exists, "worker 1's loop held")
        assert show_workers(b)[1]["state"] == "draining"
        hold_loop.unlink()
        wait_for(lambda: states(b) == ["active"], "worker 1 gone")
    finally:
        hold_bind.unlink(missing_ok=True)
        hold_loop.unlink(missing_ok=True)
        Path(f"{hold_loop}.held").unlink(missing_ok=True)
        so.unlink(missing_ok=True)
