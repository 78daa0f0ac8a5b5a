"""Fault runs (doc/testing.md, "Fault runs"): what clients see when a worker
is killed, PostgreSQL restarts, reloads come in storms, a server stops
answering in the middle of a transaction, or the log and state files cannot
be written. Marked `fault`: they run with the suite, and alone with
`pytest -m fault`. Durations (respawn, recovery) are printed for the record
(`-s` shows them); the assertions are about errors, never about time, except
for generous bounds that only catch a hang."""

import collections
import os
import signal
import socket
import struct
import subprocess
import threading
import time

import psycopg
import pytest

from conftest import Postgres, child_env, port_listening, wait_for
from helpers import conn_on, row, rows, two_workers, wait_running, workers
from pgwire import CANCEL_REQUEST, error_fields, PgWire, query_message

pytestmark = pytest.mark.fault

# Every load loop below stops at whichever comes first.
LOAD_SECONDS = 60
LOAD_QUERIES = 200_000
# A hang is what these bounds catch, not slowness.
HANG_BOUND = 30


class Load:
    """Threads that each run SELECT on their own connection until stopped;
    each records its successes and the first error it met (then it stops)."""

    def __init__(self, conns, sql="SELECT 1", txn=False):
        self.conns = conns
        self.sql = sql
        self.txn = txn
        self.ok = [0] * len(conns)
        self.errors = [None] * len(conns)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(len(conns))]
        for t in self.threads:
            t.start()

    def _run(self, i):
        conn = self.conns[i]
        end = time.monotonic() + LOAD_SECONDS
        for _ in range(LOAD_QUERIES):
            if self.stop.is_set() or time.monotonic() > end:
                return
            try:
                if self.txn:
                    with conn.transaction():
                        conn.execute(self.sql).fetchall()
                        conn.execute(self.sql).fetchall()
                else:
                    conn.execute(self.sql).fetchall()
                self.ok[i] += 1
            except Exception as e:  # noqa: B902 - recorded for the test to judge
                self.errors[i] = e
                return

    def wait_progress(self, idx=None, more=5):
        idx = range(len(self.conns)) if idx is None else idx
        base = {i: self.ok[i] for i in idx}
        wait_for(lambda: all(self.ok[i] >= base[i] + more or self.errors[i] for i in idx), "load to progress")

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(HANG_BOUND)
        stuck = [i for i, t in enumerate(self.threads) if t.is_alive()]
        assert not stuck, f"clients {stuck} hang in a query"


# ---------------------------------------------------------------------------
# kill -9 of a worker under load


@pytest.mark.parametrize("victim", [0, 1])
def test_kill_worker_under_load(bouncer, victim):
    """Clients of the other worker see nothing; the dead worker's clients get
    a closed connection (an error, not a hang); the master starts a new worker."""
    b = bouncer(ini_overrides={"min_workers": 2, "max_workers": 2, "log_connections": 0,
                               "log_disconnections": 0})
    two_workers(b)
    conns = {w: [conn_on(b, w) for _ in range(3)] for w in (0, 1)}
    other = 1 - victim
    load = Load(conns[victim] + conns[other])
    mine, theirs = range(0, 3), range(3, 6)
    load.wait_progress()
    old = next(w for w in workers(b) if w["worker"] == victim)
    mark = b.log_mark()
    t0 = time.monotonic()
    os.kill(old["pid"], signal.SIGKILL)
    b.wait_log(rf"worker {victim} \(pid {old['pid']}\) was terminated by signal 9", after=mark)
    wait_for(lambda: any(w["worker"] == victim and w["pid"] != old["pid"] and w["state"] == "active"
                         for w in workers(b)), f"worker {victim} respawned")
    respawn = time.monotonic() - t0
    # the survivors keep going after the respawn too
    load.wait_progress(theirs)
    wait_for(lambda: all(load.errors[i] for i in mine), "the dead worker's clients to see an error",
             timeout=HANG_BOUND)
    load.finish()
    print(f"\nworker {victim} killed under load: respawned and active after {respawn:.3f} s")
    assert [load.errors[i] for i in theirs] == [None] * 3
    assert all(load.ok[i] > 0 for i in theirs)
    for i in mine:
        assert isinstance(load.errors[i], psycopg.OperationalError), repr(load.errors[i])
    # new clients land on both workers again
    conn_on(b, victim).execute("SELECT 1")
    conn_on(b, other).execute("SELECT 1")


# ---------------------------------------------------------------------------
# PostgreSQL fast restart under load


@pytest.fixture
def own_pg(run_as, session_dir):
    """A PostgreSQL of this test alone: it is restarted."""
    server = Postgres(run_as, session_dir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


def restart_fast(server):
    """pg_ctl stop -m fast, then the postmaster again as the harness starts it."""
    server._run([str(server.bindir / "pg_ctl"), "-D", str(server.datadir), "stop", "-m", "fast", "-w",
                 "-t", "60"])
    server.proc.wait(timeout=60)
    log = open(server.logfile, "ab")
    server.proc = subprocess.Popen([str(server.bindir / "postgres"), "-D", str(server.datadir)],
                                   cwd=server.dir, env=child_env(), stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True,
                                   **server.run_as.popen_kwargs())
    log.close()

    def ready():
        try:
            server.sql("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False
    wait_for(ready, "PostgreSQL back", timeout=60, interval=0.02)


def test_postgres_fast_restart_under_load(bouncer, own_pg):
    """Clients in flight get PostgreSQL's error or a closed connection, and
    queries succeed again soon after PostgreSQL is back."""
    b = bouncer(databases={"db": own_pg.connstr("postgres")},
                ini_overrides={"server_login_retry": 1, "log_connections": 0, "log_disconnections": 0})
    conns = [b.connect(dbname="db", autocommit=True) for _ in range(4)]
    load = Load(conns)
    load.wait_progress()
    restart_fast(own_pg)
    back = time.monotonic()
    # a fresh client's first success after PostgreSQL is back
    first_ok = None
    deadline = back + HANG_BOUND
    while time.monotonic() < deadline:
        try:
            with b.connect(dbname="db", autocommit=True, connect_timeout=HANG_BOUND) as c:
                c.execute("SELECT 1")
            first_ok = time.monotonic() - back
            break
        except psycopg.OperationalError:
            time.sleep(0.02)
    load.finish()
    took = "none" if first_ok is None else f"{first_ok:.3f} s"
    print(f"\nPostgreSQL fast restart: first query through the pooler {took} after PostgreSQL was back")
    assert first_ok is not None, "no query succeeded after PostgreSQL came back"
    # the clients of the old backends: an error that says so (admin shutdown, closed), nothing else
    for e in load.errors:
        assert e is None or isinstance(e, psycopg.OperationalError), repr(e)
    assert any(load.errors), "the restart went unnoticed: the test did not test anything"
    assert b.alive()


# ---------------------------------------------------------------------------
# SIGHUP storm under load


def test_sighup_storm_under_load(bouncer):
    """Reloads one after another while transactions run: none fails."""
    b = bouncer(ini_overrides={"min_workers": 2, "max_workers": 2, "log_connections": 0,
                               "log_disconnections": 0})
    two_workers(b)
    conns = [conn_on(b, w) for w in (0, 1) for _ in range(2)]
    load = Load(conns, txn=True)
    load.wait_progress()
    churn_errors, churn_ok = [], [0]
    stop = threading.Event()

    def churn():
        for _ in range(10_000):
            if stop.is_set():
                return
            try:
                with b.connect(autocommit=True) as c:
                    c.execute("SELECT 1")
                churn_ok[0] += 1
            except Exception as e:  # noqa: B902
                churn_errors.append(e)
                return
    t = threading.Thread(target=churn, daemon=True)
    t.start()
    for i in range(60):
        # a setting that changes, so that each reload has something to do
        b.update(default_pool_size=10 + i % 3, server_idle_timeout=600 + i)
        b.write_ini()
        b.send_signal(signal.SIGHUP)
        time.sleep(0.02)
    load.wait_progress()
    stop.set()
    t.join(HANG_BOUND)
    load.finish()
    assert load.errors == [None] * len(conns)
    assert churn_errors == []
    assert churn_ok[0] > 0
    assert b.alive()


# ---------------------------------------------------------------------------
# a server that stops answering mid-transaction


def stop_backend(pg, conn):
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    os.kill(pid, signal.SIGSTOP)
    return pid


def test_stopped_server_query_timeout(bouncer, pg):
    """query_timeout closes the server that does not answer, the client hears
    why, and other clients are served meanwhile."""
    b = bouncer(ini_overrides={"query_timeout": 2})
    conn = b.connect(autocommit=True)
    bystander = b.connect(autocommit=True)
    conn.execute("BEGIN")
    pid = stop_backend(pg, conn)
    try:
        result = {}

        def query():
            try:
                conn.execute("SELECT 2")
            except Exception as e:  # noqa: B902
                result["error"] = e
        t = threading.Thread(target=query, daemon=True)
        t.start()
        assert bystander.execute("SELECT 3").fetchone() == (3,)
        t.join(HANG_BOUND)
        assert not t.is_alive(), "the query hangs past query_timeout"
        assert isinstance(result.get("error"), psycopg.OperationalError), repr(result)
        assert "query timeout" in str(result["error"]), str(result["error"])
        b.wait_log(r"closing because: query timeout")
        assert bystander.execute("SELECT 4").fetchone() == (4,)
    finally:
        os.kill(pid, signal.SIGCONT)


def test_cancel_requests_beyond_the_pools_room_wait_their_turn(bouncer, pg):
    """A client sends six CancelRequests while PostgreSQL does not take
    them (its postmaster stopped): the pooler opens no more connections to
    it than twice the pool size, servers and cancel connections together
    (pool size 1: its server and one cancel connection). The other requests
    wait, as SHOW POOLS, CLIENTS and SERVERS show, and go once PostgreSQL
    answers again; each requester's connection is closed when its cancel is
    done, and the query is cancelled."""
    b = bouncer(ini_overrides={"default_pool_size": 1, "cancel_wait_timeout": 0})
    w = PgWire(b.port)
    key = next(body for mtype, body in w.login() if mtype == b"K")
    w.send(query_message("SELECT pg_sleep(60)"))
    wait_running(pg, "SELECT pg_sleep(60)")
    postmaster = int((pg.datadir / "postmaster.pid").read_text().split()[0])
    requesters = []
    os.kill(postmaster, signal.SIGSTOP)
    try:
        for _ in range(6):
            s = socket.create_connection(("127.0.0.1", b.port), timeout=HANG_BOUND)
            s.sendall(struct.pack("!II", 16, CANCEL_REQUEST) + key)
            requesters.append(s)

        def cancels():
            with b.admin() as admin:
                p = row(admin, "SHOW POOLS", database="postgres")
                states = collections.Counter(r["state"] for r in rows(admin, "SHOW CLIENTS") + rows(
                    admin, "SHOW SERVERS") if r["database"] == "postgres")
            return (p["cl_active_cancel_req"], p["cl_waiting_cancel_req"], p["sv_active_cancel"],
                    states["active_cancel_req"], states["waiting_cancel_req"], states["active_cancel"])

        wait_for(lambda: cancels() == (1, 5, 1, 1, 5, 1), "one cancel sent, five waiting")
    finally:
        os.kill(postmaster, signal.SIGCONT)
    for s in requesters:
        assert s.recv(1) == b"", "the requester's connection is closed once its cancel is done"
        s.close()
    reply = w.read_until(b"Z")
    err = next(error_fields(body) for mtype, body in reply if mtype == b"E")
    assert err["C"] == "57014", err
    wait_for(lambda: cancels() == (0, 0, 0, 0, 0, 0), "no cancel left")
    assert w.simple_query("SELECT 7") == ([["7"]], None)


def test_stopped_server_cancel(bouncer, pg):
    """A query runs, then its server stops answering: a cancel goes through
    the pooler to PostgreSQL, which cancels the query once the backend runs
    again; other clients are served meanwhile."""
    b = bouncer()
    conn = b.connect(autocommit=True)
    bystander = b.connect(autocommit=True)
    conn.execute("BEGIN")
    result = {}

    def query():
        try:
            conn.execute("SELECT pg_sleep(60)")
        except Exception as e:  # noqa: B902
            result["error"] = e
    t = threading.Thread(target=query, daemon=True)
    t.start()
    pid = wait_running(pg, "SELECT pg_sleep(60)")
    os.kill(pid, signal.SIGSTOP)
    continued = False
    try:
        mark = b.log_mark()
        conn.cancel()
        b.wait_log(r"closing because: cancel request handled", after=mark)
        assert bystander.execute("SELECT 3").fetchone() == (3,)
        assert t.is_alive()  # the stopped server has not answered
    finally:
        os.kill(pid, signal.SIGCONT)
        continued = True
    t.join(HANG_BOUND)
    assert continued and not t.is_alive(), "the cancelled query did not end"
    assert isinstance(result.get("error"), psycopg.errors.QueryCanceled), repr(result)
    conn.execute("ROLLBACK")
    assert conn.execute("SELECT 5").fetchone() == (5,)


# ---------------------------------------------------------------------------
# log file and state file that cannot be written


def test_logfile_full_keeps_serving(bouncer):
    """logfile = /dev/full: every write fails with ENOSPC; the pooler serves
    and says so on standard error."""
    b = bouncer(ini_overrides={"logfile": "/dev/full", "min_workers": 2, "max_workers": 2}, start=False)
    b.start(wait=False)  # the harness waits for "process up" in the log file: here it is on stderr only
    wait_for(lambda: "process up" in b.stderr() and port_listening(b.port), "pgbouncer to be up")
    two_workers(b)
    for i in range(20):
        with b.connect(autocommit=True) as c:
            assert c.execute("SELECT %s::int", [i]).fetchone() == (i,)
    assert b.alive()
    wait_for(lambda: "could not write to logfile '/dev/full': No space left on device" in b.stderr(),
             "the reason on standard error")


def test_state_file_unwritable_keeps_serving(bouncer, run_as):
    """worker_state_file in a directory the pooler may not write: it starts,
    serves, and logs why the count was not saved."""
    b = bouncer(start=False)
    ro = b.dir / "readonly"
    ro.mkdir()
    os.chmod(ro, 0o555)  # owned by root: the pooler's user cannot create files in it
    b.update(worker_state_file=str(ro / "workers.state"), min_workers=1, max_workers=2)
    b.write_ini()
    b.start()
    b.wait_log(r"could not write worker_state_file: .*(Permission denied|Read-only)")
    with b.connect(autocommit=True) as c:
        assert c.execute("SELECT 1").fetchone() == (1,)
    assert not (ro / "workers.state").exists()
