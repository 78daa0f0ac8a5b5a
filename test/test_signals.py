"""Signals with live clients and servers: the shutdown modes of spec/cli.md §4
(SIGTERM waits for clients, SIGINT for servers, a second one exits at once,
SIGQUIT at once) and SIGUSR1/SIGUSR2 pause and resume."""

import signal
import socket
import threading

import psycopg
import pytest

from conftest import port_accepts, wait_for


def backend_pid(conn):
    return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def test_sigterm_waits_for_clients_then_exits(bouncer):
    b = bouncer()
    conn = b.connect()
    conn.autocommit = True
    assert conn.execute("SELECT 1").fetchone() == (1,)

    mark = b.log_mark()
    b.send_signal(signal.SIGTERM)
    b.wait_log(r"got SIGTERM, shutting down, waiting for all clients disconnect", after=mark)

    # new TCP connections are refused, the existing client keeps working
    wait_for(lambda: not port_accepts(b.port), "the TCP listener to close")
    assert conn.execute("SELECT 2").fetchone() == (2,)
    assert b.alive()

    conn.close()
    assert b.wait_exit() == 0
    assert "client connections dropped, exiting" in b.log_text()
    assert not b.pidfile.exists()


def test_second_sigterm_exits_at_once(bouncer):
    b = bouncer()
    conn = b.connect()
    conn.execute("SELECT 1")
    b.send_signal(signal.SIGTERM)
    b.wait_log(r"got SIGTERM, shutting down")
    b.send_signal(signal.SIGTERM)
    assert b.wait_exit() == 0
    assert "got SIGTERM while shutting down, fast exit" in b.log_text()


def test_sigint_waits_for_servers_then_exits(bouncer):
    b = bouncer()
    conn = b.connect()
    conn.autocommit = True
    conn.execute("SELECT 1")  # links a server for the whole session

    b.send_signal(signal.SIGINT)
    b.wait_log(r"got SIGINT, shutting down, waiting for all servers connections to be released")
    # the session still holds its server, so the pooler keeps running
    assert conn.execute("SELECT 3").fetchone() == (3,)
    assert b.alive()
    # a new client cannot log in any more
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(host="127.0.0.1", port=b.port, dbname="postgres", user="postgres", connect_timeout=5)

    conn.close()
    assert b.wait_exit() == 0
    assert "server connections dropped, exiting" in b.log_text()


def test_second_sigint_exits_at_once(bouncer):
    b = bouncer()
    conn = b.connect()
    conn.execute("SELECT 1")
    b.send_signal(signal.SIGINT)
    b.wait_log(r"got SIGINT, shutting down")
    b.send_signal(signal.SIGINT)
    assert b.wait_exit() == 0
    assert "got SIGINT while shutting down, fast exit" in b.log_text()


def test_sigquit_with_clients_exits_at_once(bouncer):
    b = bouncer()
    conn = b.connect()
    conn.execute("SELECT 1")
    assert b.stop(signal.SIGQUIT) == 0
    assert "got SIGQUIT, fast exit" in b.log_text()
    with pytest.raises(psycopg.OperationalError):
        conn.execute("SELECT 1")


def gone(pid):
    """Not even a zombie: the process was reaped."""
    try:
        with open(f"/proc/{pid}/stat"):
            return False
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("how", ["SIGQUIT", "second SIGTERM"])
def test_fast_exit_waits_for_the_workers_to_exit(bouncer, how):
    """A fast exit is still an exit of the whole pooler: the master passes
    SIGQUIT on and exits once its workers have exited by themselves (it
    reaps them), so that nothing of it runs, or waits to be reaped by init,
    when the master's exit is seen (doc/pgbouncer.1.md, SIGNALS)."""
    b = bouncer(ini_overrides={"min_workers": 2, "max_workers": 2})
    wait_for(lambda: len(workers_of(b)) == 2, "two workers")
    pids = workers_of(b)
    conn = b.connect()
    conn.execute("SELECT 1")
    if how == "SIGQUIT":
        b.send_signal(signal.SIGQUIT)
    else:
        b.send_signal(signal.SIGTERM)
        b.wait_log(r"got SIGTERM, shutting down")
        b.send_signal(signal.SIGTERM)
    assert b.wait_exit() == 0
    assert [p for p in pids if not gone(p)] == []
    assert "did not exit" not in b.log_text()


def workers_of(b):
    with open(f"/proc/{b.pid}/task/{b.pid}/children") as f:
        return [int(p) for p in f.read().split()]


def test_signal_inherited_as_ignored_still_handled(bouncer, run_as):
    """A pooler started from a script with `cmd &` inherits SIGINT/SIGQUIT ignored."""
    b = bouncer(start=False)
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    old_quit = signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    try:
        b.start()
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGQUIT, old_quit)
    assert b.stop(signal.SIGQUIT) == 0


def test_sigusr1_pauses_and_sigusr2_resumes(bouncer):
    b = bouncer()
    conn = b.connect()
    conn.autocommit = True
    conn.execute("SELECT 1")
    conn.close()  # the server goes back to the pool

    b.send_signal(signal.SIGUSR1)
    b.wait_log(r"got SIGUSR1, pausing all activity")

    # a new client can log in (the pool has its welcome) but its query waits
    waiter = b.connect()
    waiter.autocommit = True
    result = {}

    def run():
        result["row"] = waiter.execute("SELECT 42").fetchone()

    t = threading.Thread(target=run)
    t.start()
    admin = b.admin()
    wait_for(lambda: admin.execute("SHOW POOLS").fetchall() and any(
        r[0] == "postgres" and r[3] == 1 for r in admin.execute("SHOW POOLS").fetchall()),
        "the query to wait in the paused pool")
    assert "row" not in result

    b.send_signal(signal.SIGUSR2)
    b.wait_log(r"got SIGUSR2, continuing from PAUSE$")  # PgBouncer's words: the state it leaves
    t.join(timeout=30)
    assert result.get("row") == (42,)

    mark = b.log_mark()
    b.send_signal(signal.SIGUSR2)
    b.wait_log(r"got SIGUSR2, but not paused/suspended", after=mark)


def test_sigusr2_resumes_from_suspend(bouncer, either_bin):
    """SIGUSR2 during a SUSPEND says which state it leaves, as PgBouncer
    does ("continuing from SUSPEND", not PAUSE)."""
    ini = {} if either_bin.peer else {"max_workers": 1}
    b = bouncer(ini_overrides=ini, binary=either_bin)
    admin = b.admin()
    admin.execute("SUSPEND")  # RESUMEd when this console leaves: it stays open
    mark = b.log_mark()
    b.send_signal(signal.SIGUSR2)
    b.wait_log(r"got SIGUSR2, continuing from SUSPEND$", after=mark)
    assert dict(admin.execute("SHOW STATE").fetchall())["suspended"] == "no"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_shutdown_signal_during_suspend_exits_at_once(bouncer, either_bin, sig):
    """SIGTERM or SIGINT while a console holds a SUSPEND: the suspended
    clients could not finish, so pgbouncer goes down at once with status 1,
    as PgBouncer does (spec/cli.md §2, §4), instead of waiting for ever."""
    ini = {} if either_bin.peer else {"max_workers": 1}
    b = bouncer(ini_overrides=ini, binary=either_bin)
    admin = b.admin()
    admin.execute("SUSPEND")
    b.send_signal(sig)
    assert b.wait_exit() == 1
    assert "FATAL suspend was in progress, going down immediately" in b.log_text()


def test_console_shutdown_during_suspend_waits(bouncer, either_bin):
    """SHUTDOWN WAIT_FOR_CLIENTS from the console that holds a SUSPEND is a
    safe shutdown, not the signal's immediate exit: once that console
    leaves (which ends the SUSPEND), pgbouncer exits with status 0."""
    ini = {} if either_bin.peer else {"max_workers": 1}
    b = bouncer(ini_overrides=ini, binary=either_bin)
    admin = b.admin()
    admin.execute("SUSPEND")
    admin.execute("SHUTDOWN WAIT_FOR_CLIENTS")
    assert b.alive()
    admin.close()
    assert b.wait_exit() == 0
    assert "suspend was in progress" not in b.log_text()


def test_worker_crash_is_respawned(bouncer):
    """kill -9 of the worker: the master starts a new one and clients can connect again."""
    import os

    b = bouncer()
    conn = b.connect()
    conn.execute("SELECT 1")
    children = [int(p) for p in os.popen(f"pgrep -P {b.pid}").read().split()]
    assert len(children) == 1
    os.kill(children[0], signal.SIGKILL)
    b.wait_log(r"worker 0 \(pid \d+\) was terminated by signal 9")

    def new_worker():
        pids = [int(p) for p in os.popen(f"pgrep -P {b.pid}").read().split()]
        return pids and pids[0] != children[0]

    wait_for(new_worker, "a new worker")
    conn2 = wait_for(lambda: _try_connect(b), "a client to connect through the new worker")
    assert conn2.execute("SELECT 5").fetchone() == (5,)


def _try_connect(b):
    try:
        return b.connect()
    except psycopg.OperationalError:
        return None
