"""Session-mode clients move too (doc/workers.md, "Session-mode clients move
too"): an idle session client moves to another worker together with its
server connection, so its PostgreSQL session (SET values, temporary tables,
LISTEN, advisory locks, SQL-level prepared statements) goes on unchanged;
a drain and a scale-up split such clients as they split transaction-mode ones."""

import threading
import time

import psycopg
import pytest

from conftest import wait_for
from helpers import rows, states, workers
from test_rebalance import BASE, N, add_second_worker, even, local_port, ports_of, private_console

SESSION = {**BASE, "pool_mode": "session"}


def open_sessions(b, n):
    """n session clients, each with a session of its own on its server: a SET value, a temporary table, a
    LISTEN, an advisory lock and a prepared statement. Returns [(conn, backend pid)]."""
    out = []
    for i in range(n):
        c = b.connect(autocommit=True)
        c.execute(f"SET application_name = 'sess{i}'")
        c.execute(f"SET pgb.mark = 'x{i}'")
        c.execute("CREATE TEMP TABLE t (i int)")
        c.execute("INSERT INTO t VALUES (%s)", (i,))
        c.execute(f"LISTEN chan{i}")
        c.execute("SELECT pg_advisory_lock(%s)", (1000 + i,))
        c.execute(f"PREPARE p AS SELECT $1::int + {i}")
        out.append((c, c.execute("SELECT pg_backend_pid()").fetchone()[0]))
    return out


def assert_sessions_intact(sessions):
    for i, (c, pid) in enumerate(sessions):
        assert c.execute("SELECT pg_backend_pid()").fetchone()[0] == pid, f"client {i} changed its server"
        assert c.execute("SELECT current_setting('pgb.mark')").fetchone() == (f"x{i}",)
        assert c.execute("SELECT i FROM t").fetchall() == [(i,)]
        assert c.execute("SELECT pg_listening_channels()").fetchall() == [(f"chan{i}",)]
        assert c.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() "
                         "AND objid = %s", (1000 + i,)).fetchone() == (1,)
        assert c.execute("EXECUTE p(1)").fetchone() == (1 + i,)


def servers_by_pid(console):
    return {r["remote_pid"]: r for r in rows(console, "SHOW SERVERS") if r["database"] == "postgres"}


def test_scale_up_moves_session_clients_with_their_servers(bouncer, pg):
    """40 session clients, each holding its server with a session of its own, all on one worker; a second
    worker is added: they split evenly, each keeps its backend and its whole session, SHOW SERVERS on the
    new worker lists the moved servers with their connect times, and SHOW WORKERS counts the moves."""
    b = bouncer(ini_overrides=SESSION)
    sessions = open_sessions(b, N)
    with b.admin() as con:
        before = servers_by_pid(con)
    assert set(before) == {pid for _, pid in sessions}
    # idle: all movable now (the gauges are published every 100 ms)
    wait_for(lambda: [(w["not_movable"], w["cl_active"]) for w in workers(b)] == [(0, N)], "all movable")
    mark = b.log_mark()
    add_second_worker(b)
    counts = wait_for(lambda: even(b, N), "an even split of the session clients", timeout=30)
    b.wait_log(r"moved \d+ clients to worker 1", after=mark)
    assert_sessions_intact(sessions)
    # the moved servers are worker 1's now, with the connect time they had
    with private_console(b, 1) as con:
        moved = servers_by_pid(con)
    assert len(moved) == counts[1]
    for pid, row in moved.items():
        assert row["connect_time"] == before[pid]["connect_time"], row
        assert row["state"] == "active" and row["link"]
    w0, w1 = (next(w for w in workers(b) if w["worker"] == k) for k in (0, 1))
    assert w0["moved_out"] == w1["moved_in"] == counts[1]
    assert w0["move_failed"] == w1["move_failed"] == 0
    # every backend is still there, none was added
    pids = {r[0] for r in pg.sql("SELECT pid FROM pg_stat_activity WHERE datname = 'postgres' "
                                 "AND application_name LIKE 'sess%'")}
    assert pids == {pid for _, pid in sessions}
    # a NOTIFY reaches a moved client's LISTEN
    moved_ports = ports_of(b, 1)
    i, (c, _) = next((i, s) for i, s in enumerate(sessions) if local_port(s[0]) in moved_ports)
    got = []
    c.add_notify_handler(got.append)
    pg.sql(f"NOTIFY chan{i}, 'hello'")
    wait_for(lambda: c.execute("SELECT 1") and got, "the notification on the moved client")
    assert [(n.channel, n.payload) for n in got] == [(f"chan{i}", "hello")]


def test_cancel_reaches_a_moved_session_clients_backend(bouncer):
    b = bouncer(ini_overrides=SESSION)
    sessions = open_sessions(b, 10)
    add_second_worker(b)
    wait_for(lambda: even(b, 10, tolerance=3), "the session clients split")
    moved_ports = ports_of(b, 1)
    c, pid = next(s for s in sessions if local_port(s[0]) in moved_ports)
    errors = []

    def sleep():
        try:
            c.execute("SELECT pg_sleep(20)")
        except psycopg.errors.QueryCanceled as e:
            errors.append(e)

    t = threading.Thread(target=sleep)
    t.start()
    time.sleep(0.5)
    c.cancel()
    t.join(timeout=10)
    assert not t.is_alive(), "the cancel did not reach the backend"
    assert len(errors) == 1 and errors[0].sqlstate == "57014"
    assert c.execute("SELECT pg_backend_pid()").fetchone()[0] == pid


def test_drain_in_session_mode_moves_sessions_in_seconds(bouncer, pg):
    """Two workers with idle session clients holding servers; a drain hands them over with their servers:
    no client errors, no backend closed, and the drained worker exits without waiting for the sessions."""
    b = bouncer(ini_overrides={**SESSION, "min_workers": 2, "max_workers": 2, "worker_drain_timeout": 0})
    wait_for(lambda: states(b) == ["active", "active"], "two workers")
    sessions = open_sessions(b, N)
    assert len(ports_of(b, 1)) > 0, "the kernel put no client on worker 1"
    mark = b.log_mark()
    b.update(min_workers=1, max_workers=1)
    b.write_ini()
    b.reload()
    b.wait_log(r"worker 1 drained, exiting", after=mark, timeout=30)
    wait_for(lambda: states(b) == ["active"], "one worker left")
    assert "worker_drain_timeout reached" not in b.log_text()[mark:]
    assert_sessions_intact(sessions)
    pids = {r[0] for r in pg.sql("SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'sess%'")}
    assert pids == {pid for _, pid in sessions}


def test_session_client_in_a_transaction_moves_once_it_ends(bouncer):
    """A session client inside a transaction block stays (its block is not carried); at COMMIT it can go."""
    b = bouncer(ini_overrides=SESSION)
    sessions = open_sessions(b, 6)
    held, pid = sessions[0]
    held.execute("BEGIN")
    held.execute("SELECT 1")
    add_second_worker(b)
    wait_for(lambda: even(b, 6, tolerance=2), "the idle ones to split")
    assert local_port(held) in ports_of(b, 0), "a client inside a transaction block moved"
    assert sum(w["not_movable"] for w in workers(b)) >= 1
    held.execute("COMMIT")
    assert held.execute("SELECT pg_backend_pid()").fetchone()[0] == pid


def test_server_limits_hold_through_a_storm_of_moves(bouncer, pg):
    """A pool of 10: 10 session clients hold servers, 10 more wait for one. Workers are added and drained
    over and over; PostgreSQL never sees more than 10 connections of the pool."""
    b = bouncer(ini_overrides={**SESSION, "default_pool_size": 10, "worker_drain_timeout": 0,
                               "query_wait_timeout": 120})
    holders = open_sessions(b, 10)
    seen = []
    stop = threading.Event()
    waited = []

    def watch():
        with pg.connect() as own:  # the harness's own connection is left out of the count
            own.autocommit = True
            while not stop.is_set():
                seen.append(own.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = 'postgres' "
                                        "AND backend_type = 'client backend' AND pid <> pg_backend_pid()")
                            .fetchone()[0])
                time.sleep(0.02)

    def wait_for_a_server():
        with b.connect(autocommit=True) as c:
            waited.append(c.execute("SELECT pg_backend_pid()").fetchone()[0])

    t = threading.Thread(target=watch)
    t.start()
    waiters = [threading.Thread(target=wait_for_a_server) for _ in range(10)]
    for w in waiters:
        w.start()
    try:
        for _ in range(3):
            add_second_worker(b)
            wait_for(lambda: even(b, 20, tolerance=6), "the sessions and the waiting clients split")
            b.update(min_workers=1, max_workers=1)
            b.write_ini()
            b.reload()
            wait_for(lambda: states(b) == ["active"], "back to one worker", timeout=30)
        assert_sessions_intact(holders)
        assert waited == [], "a client got an 11th server"
        for c, _ in holders:
            c.close()
        for w in waiters:
            w.join(timeout=60)
        assert len(waited) == 10, "the waiting clients did not all get a server once the sessions ended"
    finally:
        stop.set()
        t.join(timeout=10)
    assert seen and max(seen) <= 10, f"PostgreSQL saw {max(seen)} connections of a pool of 10"


@pytest.fixture
def tls_server_bouncer(bouncer, pg_ssl, tls_files):
    return bouncer(ini_overrides={**SESSION, "server_tls_sslmode": "require"},
                   databases={"postgres": pg_ssl.connstr("postgres")})


def test_session_client_with_a_tls_server_stays(tls_server_bouncer):
    """Its server's TLS state lives in this process: such a client stays and is counted as not movable,
    while one whose server is plain moves."""
    b = tls_server_bouncer
    c = b.connect(autocommit=True)
    pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
    add_second_worker(b)
    wait_for(lambda: states(b) == ["active", "active"], "two workers")
    wait_for(lambda: sum(w["not_movable"] for w in workers(b)) == 1, "the TLS session counted as not movable")
    time.sleep(2)  # several rebalancing ticks
    assert local_port(c) in ports_of(b, 0)
    assert c.execute("SELECT pg_backend_pid()").fetchone()[0] == pid
