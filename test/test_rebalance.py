"""Rebalancing long-lived clients between workers (doc/workers.md, "Rebalancing
long-lived clients"): a scale-up splits persistent clients, a drain hands them
over, and a moved client keeps its prepared statements, parameters and cancel key."""

import os
import re
import shutil
import socket
import subprocess
import struct
import time

import psycopg
import pytest

from conftest import wait_for
from helpers import (assert_cancels, BusyTransactions, conn_on, pool_row, rows, states, two_workers, worker_of,
                     workers)
from pgwire import (CANCEL_REQUEST, SSL_REQUEST, PgWire, data_row, error_fields, message, query_message,
                    request_packet)
from test_auth_query import apg, setup  # noqa: F401 (fixtures)

# One worker to start with; the tests raise min_workers to add the second.
BASE = {
    "min_workers": 1,
    "max_workers": 2,
    "worker_scale_interval": 0.5,
    "worker_scale_up_threshold": 0.99,
    "worker_scale_up_samples": 100,
    "worker_scale_down_threshold": 0.01,
    "worker_scale_down_samples": 100,
    "log_connections": 0,
    "log_disconnections": 0,
    "max_client_conn": 200,
    "default_pool_size": 50,  # session mode: every client may hold a server
}

N = 40


def private_console(b, worker, **kw):
    """A console of one worker alone: its private socket is never fanned out."""
    return psycopg.connect(host=str(b.dir / f"pgbouncer-workers.{b.port}" / f"worker.{worker}"), port=b.port,
                           user="pgbouncer", dbname="pgbouncer", autocommit=True, connect_timeout=10, **kw)


def local_port(conn):
    s = socket.socket(fileno=os.dup(conn.pgconn.socket))
    try:
        return s.getsockname()[1]
    finally:
        s.close()


def ports_of(b, worker):
    """The client ports (database postgres) that one worker holds."""
    with private_console(b, worker) as con:
        return {r["port"] for r in rows(con, "SHOW CLIENTS") if r["database"] == "postgres"}


def clients_of(b, worker):
    with private_console(b, worker) as con:
        return len([r for r in rows(con, "SHOW CLIENTS") if r["database"] == "postgres"])


def spread(b, n_workers):
    return [clients_of(b, w) for w in range(n_workers)]


def add_second_worker(b):
    b.update(min_workers=2, max_workers=2)
    b.write_ini()
    b.reload()


def clients_of_db_on(b, worker, db):
    """Clients of database db that SHOW CLIENTS lists on one worker's private console (-1: no console yet)."""
    try:
        with private_console(b, worker, password="pgbouncer") as con:
            return len([r for r in rows(con, "SHOW CLIENTS") if r["database"] == db])
    except psycopg.OperationalError:
        return -1


def even(b, total, tolerance=4):
    try:
        counts = spread(b, 2)
    except psycopg.OperationalError:  # worker 1 not listening yet
        return None
    ok = sum(counts) == total and all(abs(c - total // 2) <= tolerance for c in counts)
    return counts if ok else None


def worker_row(b, n):
    return next(w for w in workers(b) if w["worker"] == n)


@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_scale_up_splits_persistent_clients(bouncer, mode):
    """40 clients on one worker; a second worker is added: each ends with 20 +- 4, all still work."""
    b = bouncer(ini_overrides={**BASE, "pool_mode": mode})
    clients = [b.connect(autocommit=True) for _ in range(N)]
    if mode == "transaction":
        for c in clients:  # used, and between transactions
            assert c.execute("SELECT 1").fetchone() == (1,)
    # session mode: a client that has no server yet moves alone
    assert {worker_of(c) for c in clients} == {0}
    assert spread(b, 1) == [N]
    mark = b.log_mark()
    add_second_worker(b)
    counts = wait_for(lambda: even(b, N), "an even split of the persistent clients")
    assert sum(counts) == N
    b.wait_log(r"moved \d+ clients to worker 1", after=mark)
    for i, c in enumerate(clients):
        assert c.execute("SELECT %s::int", (i,)).fetchone() == (i,)
    w0, w1 = worker_row(b, 0), worker_row(b, 1)
    assert w0["moved_out"] == w1["moved_in"] == counts[1]
    assert w0["moved_in"] == w1["moved_out"] == 0
    assert w0["move_failed"] == w1["move_failed"] == 0
    if mode == "session":
        # every client holds its server now, idle between queries: it would move with it
        # (test_session_moves.py), and SHOW WORKERS counts none as not movable
        wait_for(lambda: sum(w["not_movable"] for w in workers(b)) == 0, "all clients movable")
        assert even(b, N)


def test_unix_socket_clients_move(bouncer):
    """Clients of the Unix socket move like TCP ones; SHOW CLIENTS still shows them as unix."""
    b = bouncer(ini_overrides={**BASE, "pool_mode": "statement"})
    clients = [b.connect(host=str(b.dir), autocommit=True) for _ in range(N)]
    add_second_worker(b)
    wait_for(lambda: even(b, N), "an even split")
    with private_console(b, 1) as con:
        moved = [r for r in rows(con, "SHOW CLIENTS") if r["database"] == "postgres"]
    assert moved and all(r["addr"] == "unix" for r in moved)
    for i, c in enumerate(clients):
        assert c.execute("SELECT %s::int", (i,)).fetchone() == (i,)


def test_client_in_a_transaction_stays_and_carries_on(bouncer, pg):
    """An open transaction pins its client to its worker; it commits normally after the others moved."""
    b = bouncer(ini_overrides={**BASE, "pool_mode": "transaction"})
    pg.sql("DROP TABLE IF EXISTS rebalance_t")
    pg.sql("CREATE TABLE rebalance_t (x int)")
    pinned = b.connect()
    pinned.execute("INSERT INTO rebalance_t VALUES (1)")  # BEGIN implied: the transaction stays open
    others = [b.connect(autocommit=True) for _ in range(N - 1)]
    pinned_port = local_port(pinned)
    add_second_worker(b)
    wait_for(lambda: even(b, N), "an even split")
    assert pinned_port in ports_of(b, 0)
    pinned.execute("INSERT INTO rebalance_t VALUES (2)")
    pinned.commit()
    assert pg.sql("SELECT count(*) FROM rebalance_t")[0][0] == 2
    for c in others:
        assert c.execute("SELECT 1").fetchone() == (1,)


def test_clients_waiting_for_a_server_move_with_their_request(bouncer):
    """Clients queued for a server (transaction mode, the pool held by open
    transactions) are movable: each goes with the request it is waiting to
    have run, simple or extended, and gets its answer on the new worker."""
    b = bouncer(ini_overrides={**BASE, "pool_mode": "transaction", "default_pool_size": 2})
    holders = [b.connect() for _ in range(2)]
    for h in holders:
        h.execute("SELECT 1")  # a transaction stays open: both servers are taken
    waiting = []
    for i in range(N):
        w = PgWire(b.port)
        w.login()
        if i % 4 == 0:
            # a batch of the extended protocol, a named statement among it
            w.send(message(b"P", b"s%d\0SELECT $1::int + 1000\0\0\0" % i)
                   + message(b"B", b"\0s%d\0\0\0\0\1" % i + struct.pack("!i", len(str(i))) + str(i).encode()
                             + b"\0\0") + message(b"E", b"\0\0\0\0\0") + message(b"S"))
        else:
            w.send(query_message(f"SELECT {i} + 1000"))
        waiting.append(w)
    wait_for(lambda: pool_row(b, "postgres", "postgres")["cl_waiting"] == N, f"{N} clients waiting")
    mark = b.log_mark()
    add_second_worker(b)
    counts = wait_for(lambda: even(b, N + 2), "an even split, waiting clients included")
    b.wait_log(r"moved \d+ clients to worker 1", after=mark)
    assert counts[1] >= N // 2 - 4
    with private_console(b, 1) as con:
        assert sum(r["cl_waiting"] for r in rows(con, "SHOW POOLS") if r["database"] == "postgres") > 0
    for h in holders:
        h.commit()
    for i, w in enumerate(waiting):
        msgs = w.read_until(b"Z", b"E")
        kinds = [m[0] for m in msgs]
        assert b"E" not in kinds, [error_fields(m[1]) for m in msgs if m[0] == b"E"]
        (row,) = [data_row(m[1]) for m in msgs if m[0] == b"D"]
        assert row == [str(i + 1000)], (i, row)
        if i % 4 == 0:
            assert kinds[:2] == [b"1", b"2"]
        w.send(query_message("SELECT 7"))
        assert w.read_until(b"Z")[-1][0] == b"Z"
        w.close()
    assert worker_row(b, 1)["moved_in"] == counts[1]


def test_moved_waiting_clients_keep_their_query_wait_timeout(bouncer):
    """Clients moved while waiting go on waiting from when they started:
    query_wait_timeout does not start again on the new worker."""
    b = bouncer(ini_overrides={**BASE, "pool_mode": "transaction", "default_pool_size": 1,
                               "query_wait_timeout": 10})
    holder = b.connect()
    holder.execute("SELECT 1")  # the one server stays in this transaction
    waiting = []
    for _ in range(10):  # 11 clients: 6 and 5 is the split, so 5 of them move
        w = PgWire(b.port)
        w.login()
        w.send(query_message("SELECT 1"))
        waiting.append((w, time.monotonic()))
    wait_for(lambda: pool_row(b, "postgres", "postgres")["cl_waiting"] == 10, "ten clients waiting")
    time.sleep(max(0.0, 4 - (time.monotonic() - waiting[0][1])))
    add_second_worker(b)

    def waiting_on_worker_1():
        try:
            with private_console(b, 1) as con:
                return sum(r["cl_waiting"] for r in rows(con, "SHOW POOLS") if r["database"] == "postgres")
        except psycopg.OperationalError:  # worker 1 not listening yet
            return 0

    assert wait_for(waiting_on_worker_1, "waiting clients on worker 1", timeout=5) == 5
    for w, started in waiting:
        w.expect_fatal("query_wait_timeout")
        waited = time.monotonic() - started
        # 10 s from the first wait (plus the janitor's period), not 10 s from the move, 4 s or more later
        assert 9.5 < waited < 12.5, waited
    holder.rollback()
    assert holder.execute("SELECT 1").fetchone() == (1,)


def test_moved_client_keeps_prepared_statements_timezone_and_cancel(bouncer):
    b = bouncer(ini_overrides={**BASE, "pool_mode": "transaction"})
    clients = [b.connect(autocommit=True) for _ in range(N)]
    for i, c in enumerate(clients):
        c.execute("SET TimeZone = 'Asia/Tokyo'")
        res = c.pgconn.prepare(b"rb_stmt", b"SELECT $1::int + %d" % i)
        assert res.status == psycopg.pq.ExecStatus.COMMAND_OK
        c.execute("SELECT %s::int * 2", (i,), prepare=True)  # psycopg's own named statement
    add_second_worker(b)
    wait_for(lambda: even(b, N), "an even split")
    moved_ports = ports_of(b, 1)
    moved = [(i, c) for i, c in enumerate(clients) if local_port(c) in moved_ports]
    assert len(moved) >= N // 2 - 4
    for i, c in moved:
        res = c.pgconn.exec_prepared(b"rb_stmt", [b"100"])
        assert res.status == psycopg.pq.ExecStatus.TUPLES_OK, res.error_message
        assert res.get_value(0, 0) == str(100 + i).encode()
        assert c.execute("SELECT %s::int * 2", (i,), prepare=True).fetchone() == (2 * i,)
        assert c.execute("SHOW TimeZone").fetchone() == ("Asia/Tokyo",)
    # a cancel request lands on either worker; it must reach the moved client's query
    i, c = moved[0]
    assert_cancels(c)


def test_moved_client_keeps_its_statements_result_type(bouncer, pg):
    """Clients prepare a statement on worker 0; the table changes; half of
    them move to worker 1. There, as on PostgreSQL (and on worker 0), the
    statement prepared before the change fails with 0A000 instead of
    returning the new columns to a client that was given two
    (doc/transaction.md, "Schema changes")."""
    pg.sql("DROP TABLE IF EXISTS rb_schema")
    pg.sql("CREATE TABLE rb_schema (a int, b int)")
    pg.sql("INSERT INTO rb_schema VALUES (1, 2)")
    b = bouncer(ini_overrides={**BASE, "pool_mode": "transaction"})
    clients = [b.connect(autocommit=True) for _ in range(N)]
    for c in clients:
        assert c.pgconn.prepare(b"rb_s", b"SELECT * FROM rb_schema").status == psycopg.pq.ExecStatus.COMMAND_OK
        res = c.pgconn.exec_prepared(b"rb_s", [])
        assert (res.status, res.nfields) == (psycopg.pq.ExecStatus.TUPLES_OK, 2)
    pg.sql("ALTER TABLE rb_schema ADD COLUMN c int DEFAULT 7")
    add_second_worker(b)
    wait_for(lambda: even(b, N), "an even split")
    moved_ports = ports_of(b, 1)
    moved = [c for c in clients if local_port(c) in moved_ports]
    assert len(moved) >= N // 2 - 4
    got = []
    for c in moved:
        res = c.pgconn.exec_prepared(b"rb_s", [])
        got.append((res.status, res.error_field(psycopg.pq.DiagnosticField.SQLSTATE)))
    assert set(got) == {(psycopg.pq.ExecStatus.FATAL_ERROR, b"0A000")}, got
    # the driver's retry: the text prepared again gives the new columns
    c = moved[0]
    assert c.pgconn.prepare(b"rb_s2", b"SELECT * FROM rb_schema").status == psycopg.pq.ExecStatus.COMMAND_OK
    res = c.pgconn.exec_prepared(b"rb_s2", [])
    assert (res.status, res.nfields) == (psycopg.pq.ExecStatus.TUPLES_OK, 3)


def test_tls_clients_stay(bouncer, tls_files):
    """A TLS client's state lives in its worker: it stays, and SHOW WORKERS counts it as not movable."""
    b = bouncer(ini_overrides={**BASE, "pool_mode": "transaction", "client_tls_sslmode": "allow",
                               "client_tls_key_file": str(tls_files.server_key),
                               "client_tls_cert_file": str(tls_files.server_cert)})
    tls = [b.connect(autocommit=True, sslmode="require") for _ in range(10)]
    plain = [b.connect(autocommit=True, sslmode="disable") for _ in range(30)]
    assert all(c.pgconn.ssl_in_use for c in tls) and not any(c.pgconn.ssl_in_use for c in plain)
    add_second_worker(b)
    wait_for(lambda: even(b, N), "an even split")
    on_0 = ports_of(b, 0)
    assert {local_port(c) for c in tls} <= on_0
    assert worker_row(b, 0)["not_movable"] == 10
    assert worker_row(b, 1)["moved_in"] == 20
    for c in tls + plain:
        assert c.execute("SELECT 1").fetchone() == (1,)


def test_cancel_reaches_moved_client_from_either_worker(bouncer, pg):
    """A CancelRequest for a moved client's key, sent straight to each worker through its private
    socket: to the worker that made the key (which no longer has the client) and to the one that
    has it now. Both must cancel its query."""
    b = bouncer(ini_overrides={**BASE, "pool_mode": "transaction"})
    raw = []
    for _ in range(N):
        w = PgWire(b.port)
        key = next(body for t, body in w.login() if t == b"K")
        raw.append((w, key))
    add_second_worker(b)
    wait_for(lambda: even(b, N), "an even split")
    moved_ports = ports_of(b, 1)
    w, key = next((w, key) for w, key in raw if w.sock.getsockname()[1] in moved_ports)
    assert key[3] == 0  # made by worker 0
    for via in (0, 1):
        w.send(query_message("SELECT pg_sleep(20)"))
        wait_for(lambda: len(pg.sql("SELECT 1 FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(20)' "
                                      "AND state = 'active'") or []) == 1, "the query to run")
        c = PgWire(b.port, host=str(b.dir / f"pgbouncer-workers.{b.port}" / f"worker.{via}"))
        c.send(request_packet(CANCEL_REQUEST, key))
        c.expect_closed()
        msgs = w.read_until(b"Z")
        errs = [error_fields(body) for t, body in msgs if t == b"E"]
        assert errs and errs[0]["C"] == "57014", (via, msgs)
        c.close()
    rows_, err = w.simple_query("SELECT 1")
    assert rows_ == [["1"]] and err is None
    for w, _ in raw:
        w.close()


@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_drain_hands_clients_over(bouncer, mode):
    """Scaling down with persistent clients on the drained worker: they move, the drain ends, none fails."""
    b = bouncer(ini_overrides={**BASE, "pool_mode": mode, "min_workers": 2, "max_workers": 2,
                               "worker_drain_timeout": 0})
    wait_for(lambda: states(b) == ["active", "active"], "two workers")
    clients = [b.connect(autocommit=True) for _ in range(N)]
    if mode == "transaction":
        for c in clients:
            assert c.execute("SELECT 1").fetchone() == (1,)
    on_1 = [c for c in clients if worker_of(c) == 1]
    assert on_1, "the kernel put no client on worker 1"
    mark = b.log_mark()
    b.update(min_workers=1, max_workers=1)
    b.write_ini()
    b.reload()
    b.wait_log(r"draining worker 1", after=mark)
    b.wait_log(r"worker 1 drained, exiting", after=mark)
    wait_for(lambda: states(b) == ["active"], "one worker left")
    assert "worker_drain_timeout reached" not in b.log_text()[mark:]
    for i, c in enumerate(clients):
        assert c.execute("SELECT %s::int", (i,)).fetchone() == (i,)
    assert clients_of(b, 0) == N


def test_drain_hands_busy_clients_over(bouncer):
    """Clients that run one transaction after another are between two only
    for an instant, which a move order seldom meets: a draining worker
    gives each at the end of one of its transactions, so the drain ends
    (without worker_drain_timeout) while they keep working."""
    b = bouncer(ini_overrides={**BASE, "pool_mode": "transaction", "min_workers": 2, "max_workers": 2,
                               "worker_drain_timeout": 0})
    wait_for(lambda: states(b) == ["active", "active"], "two workers")
    clients = [b.connect(autocommit=True) for _ in range(8)]
    for c in clients:
        c.execute("SELECT 1")
    assert any(worker_of(c) == 1 for c in clients), "the kernel put no client on worker 1"
    busy = BusyTransactions(clients)
    try:
        mark = b.log_mark()
        b.update(min_workers=1, max_workers=1)
        b.write_ini()
        b.reload()
        b.wait_log(r"draining worker 1", after=mark)
        b.wait_log(r"worker 1 drained, exiting", after=mark, timeout=15)
    finally:
        busy.stop()
    for i, c in enumerate(clients):
        assert c.execute("SELECT %s::int", (i,)).fetchone() == (i,)
    assert clients_of(b, 0) == 8


def test_auth_query_users_move(bouncer, apg, setup):
    """Users known only through auth_query (MD5 and SCRAM secrets, SCRAM pass-through to the
    server): the new worker never looked them up, yet their moved clients keep working."""
    from test_auth_query import APPDB, MD5_PW, MD5_ROLE, SCRAM_PW, SCRAM_ROLE, start
    b = start(bouncer, apg, setup, ini={**BASE, "pool_mode": "transaction"})
    logins = [(MD5_ROLE, MD5_PW), (SCRAM_ROLE, SCRAM_PW)] * 10
    clients = [b.connect(dbname=APPDB, user=u, password=p, autocommit=True) for u, p in logins]
    for c in clients:
        c.execute("SELECT 1")
    add_second_worker(b)

    wait_for(lambda: clients_of_db_on(b, 1, APPDB) >= 8, "clients moved to worker 1")
    for (u, _), c in zip(logins, clients):
        assert c.execute("SELECT current_user").fetchone() == (u,)


def test_client_too_large_to_move_stays_untouched(bouncer):
    """A client whose state does not fit in one hand-over message (prepared statements of more than
    128 kB) is not moved: a drain leaves it working where it is and counts the failed attempt."""
    from helpers import conn_on
    b = bouncer(ini_overrides={**BASE, "pool_mode": "transaction", "min_workers": 2, "max_workers": 2,
                               "worker_drain_timeout": 0})
    wait_for(lambda: states(b) == ["active", "active"], "two workers")
    heavy = conn_on(b, 1)
    for k in range(30):  # 30 statements of 5 kB of query text each
        res = heavy.pgconn.prepare(b"big%d" % k, b"SELECT '" + b"x" * 5000 + b"'::text || $1::int")
        assert res.status == psycopg.pq.ExecStatus.COMMAND_OK
    light = conn_on(b, 1)
    mark = b.log_mark()
    b.update(min_workers=1, max_workers=1)
    b.write_ini()
    b.reload()
    b.wait_log(r"moved \d+ clients to worker 0 \(\d+ asked; 1 could not move: state too large", after=mark)
    assert light.execute("SELECT 1").fetchone() == (1,)
    assert states(b) == ["active", "draining"]
    res = heavy.pgconn.exec_prepared(b"big7", [b"1"])
    assert res.status == psycopg.pq.ExecStatus.TUPLES_OK, res.error_message
    assert res.get_value(0, 0) == b"x" * 5000 + b"1"
    assert clients_of(b, 1) == 1
    assert worker_row(b, 1)["move_failed"] >= 1
    heavy.close()
    wait_for(lambda: states(b) == ["active"], "the drain to end once the client left")


def stop_worker_1_before_it_takes_clients(b, mark, before_stop=None):
    """SIGSTOP worker 1, added since log mark, once it serves and before the
    master's order to take clients reaches it; returns its pid."""
    import signal
    pid = int(b.wait_log(r"worker 1 started, pid (\d+)", after=mark).group(1))
    # Worker 1 takes clients only once it serves ("active"), and the master
    # orders the move at its next tick: the master waits meanwhile, so that
    # worker 1 is stopped after it comes up and before the order reaches it.
    os.kill(b.pid, signal.SIGSTOP)
    try:
        def worker_1_active():
            with private_console(b, 0, password="pgbouncer") as con:
                return [r["state"] for r in rows(con, "SHOW WORKERS") if r["worker"] == 1] == ["active"]
        wait_for(worker_1_active, "worker 1 serving")
        if before_stop:
            before_stop()
        os.kill(pid, signal.SIGSTOP)
    finally:
        os.kill(b.pid, signal.SIGCONT)
    return pid


def test_moved_clients_keep_their_place_in_max_client_conn(bouncer):
    """A client on its way to another worker still counts: the giver hands
    its units over to the receiver before it sends it. Here the receiver
    is stopped, so the clients stay on their way; a new login must still
    find max_client_conn full, as one PgBouncer would."""
    import signal
    b = bouncer(ini_overrides={**BASE, "pool_mode": "transaction", "max_client_conn": 20,
                               "max_db_client_connections": 20})
    held = [b.connect(autocommit=True) for _ in range(20)]
    mark = b.log_mark()
    add_second_worker(b)
    pid = stop_worker_1_before_it_takes_clients(b, mark)
    try:
        b.wait_log(r"moved [1-9]\d* clients to worker 1", after=mark)
        # worker 0 answers; a login the kernel queues for the stopped worker 1 times out and is tried again
        for _ in range(50):
            try:
                extra = b.connect(autocommit=True, connect_timeout=1)
            except psycopg.OperationalError as e:
                if "max_client_conn" in str(e):
                    break
                continue
            extra.close()
            pytest.fail("a 21st client logged in while 20 were on their way to worker 1")
        else:
            pytest.fail("no login reached worker 0")
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: even(b, 20), "an even split")
    for i, c in enumerate(held):
        assert c.execute("SELECT %s::int", (i,)).fetchone() == (i,)
    with b.admin() as con:
        (db,) = [r for r in rows(con, "SHOW DATABASES") if r["name"] == "postgres"]
    assert db["current_client_connections"] == 20


def test_moved_waiting_client_gets_one_wait_notice(bouncer):
    """query_wait_notify sends its NOTICE once per wait: a client that got
    it and then moved while still waiting does not get it again."""
    b = bouncer(ini_overrides={**BASE, "pool_mode": "transaction", "default_pool_size": 1,
                               "query_wait_notify": 1})
    holder = b.connect()
    holder.execute("SELECT 1")  # the one server stays in this transaction
    waiting = []
    for i in range(10):
        w = PgWire(b.port)
        w.login()
        w.send(query_message(f"SELECT {i}"))
        waiting.append(w)
    wait_for(lambda: pool_row(b, "postgres", "postgres")["cl_waiting"] == 10, "ten clients waiting")
    time.sleep(1.5)  # every one of them has its NOTICE
    add_second_worker(b)
    wait_for(lambda: even(b, 11), "an even split, waiting clients included")
    time.sleep(1.5)  # the janitor of worker 1 runs meanwhile
    holder.rollback()
    notices = []
    for i, w in enumerate(waiting):
        msgs = w.read_until(b"Z")
        assert [data_row(body) for t, body in msgs if t == b"D"] == [[str(i)]]
        notices.append([t for t, _ in msgs].count(b"N"))
        w.close()
    assert notices == [1] * 10, notices


def test_moved_client_does_not_bring_back_an_old_secret(bouncer, apg, setup):
    """A user in [users] but not in the auth_file is found through auth_query.
    Its clients log in on worker 0 and a second worker takes half of them,
    with their secret; then the password changes in PostgreSQL. On worker 1
    the secret they brought must stay an auth_query secret, looked up again
    at the next login: the old password must not log in there (where servers
    logged in before the change sit idle), and the new one must."""
    from psycopg import sql as pgsql
    from test_auth_query import APPDB, start_with_users_entry
    role = "authq_rb_users"
    apg.create_role(role, password="old pw")
    try:
        b, users = start_with_users_entry(bouncer, apg, setup, role, {**BASE, "pool_mode": "transaction"})
        clients = [b.connect(dbname=APPDB, user=role, password="old pw", autocommit=True) for _ in range(10)]
        b.update(min_workers=2, max_workers=2)
        b.write_ini(text=b.render_ini() + users)
        b.reload()

        wait_for(lambda: clients_of_db_on(b, 1, APPDB) >= 3, "clients moved to worker 1")
        for c in clients:  # worker 1 logs in to PostgreSQL for them
            assert c.execute("SELECT current_user").fetchone() == (role,)
        apg.sql(pgsql.SQL("ALTER ROLE {} PASSWORD 'new pw'").format(pgsql.Identifier(role)))
        landed = set()
        for _ in range(40):
            with pytest.raises(psycopg.OperationalError, match="SASL authentication failed"):
                b.connect(dbname=APPDB, user=role, password="old pw", autocommit=True)
            c = b.connect(dbname=APPDB, user=role, password="new pw", autocommit=True)
            landed.add(worker_of(c))
            assert c.execute("SELECT current_user").fetchone() == (role,)
            c.close()
            if landed == {0, 1}:
                break
        assert landed == {0, 1}
    finally:
        apg.sql(pgsql.SQL("DROP ROLE IF EXISTS {}").format(pgsql.Identifier(role)))


def login_where_answered(b, user, password, database):
    """A raw login on whichever worker answers at once (an SSLRequest first):
    a connection that a stopped worker would take is closed unanswered, before
    it has sent that worker a startup packet."""
    for _ in range(200):
        w = PgWire(b.port)
        w.send(request_packet(SSL_REQUEST))
        w.sock.settimeout(0.3)
        try:
            answer = w.sock.recv(1)
        except socket.timeout:
            w.close()
            continue
        w.sock.settimeout(30)
        assert answer == b"N"
        w.login(user=user, database=database, password=password)
        return w
    pytest.fail("no worker answered")


def test_moved_client_brings_a_newer_auth_query_secret(bouncer, apg, setup, monkeypatch):
    """Worker 0 found a role's secret through auth_query; then the password
    changes in PostgreSQL, and clients log in with the new one on worker 1
    alone (worker 0 stopped meanwhile). A drain moves them to worker 0,
    which must log in to PostgreSQL for them with the secret they brought
    (and its SCRAM keys), not with its own from before the change."""
    import signal
    from psycopg import sql as pgsql
    from test_auth_query import APPDB, start
    monkeypatch.setenv("PGPASSWORD", "pgbouncer")  # the console's password, for the helpers
    role = "authq_rb_newer"
    apg.create_role(role, password="old pw")
    try:
        b = start(bouncer, apg, setup, auth_type="scram-sha-256",
                  ini={**BASE, "pool_mode": "transaction", "min_workers": 2, "max_workers": 2})
        two_workers(b)
        old = conn_on(b, 0, dbname=APPDB, user=role, password="old pw")
        assert old.execute("SELECT current_user").fetchone() == (role,)
        old.close()
        apg.sql(pgsql.SQL("ALTER ROLE {} PASSWORD 'new pw'").format(pgsql.Identifier(role)))
        # the servers logged in with the old password go: the moved clients need new ones
        apg.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role])
        pid0 = worker_row(b, 0)["pid"]
        os.kill(pid0, signal.SIGSTOP)
        try:
            clients = [login_where_answered(b, role, "new pw", APPDB) for _ in range(4)]
        finally:
            os.kill(pid0, signal.SIGCONT)
        for w in clients:
            assert w.simple_query("SELECT current_user") == ([[role]], None)
        apg.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role])
        wait_for(lambda: not apg.sql("SELECT 1 FROM pg_stat_activity WHERE usename = %s", [role]),
                 "the role's servers to be gone")
        b.update(min_workers=1, max_workers=1)
        b.write_ini()
        b.reload()
        wait_for(lambda: clients_of_db_on(b, 0, APPDB) == 4, "the clients to move to worker 0")
        for w in clients:  # worker 0 logs in to PostgreSQL for them
            assert w.simple_query("SELECT current_user") == ([[role]], None)
    finally:
        apg.sql(pgsql.SQL("DROP ROLE IF EXISTS {}").format(pgsql.Identifier(role)))


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
def test_clients_whose_socket_did_not_come_free_their_place(bouncer, run_as):
    """The receiving worker is out of file descriptors: the clients it is
    sent arrive without their socket (the kernel closes their connection).
    Their place in max_client_conn and max_db_client_connections, handed
    over with them, must come back: the pooler may take as many clients
    again as before."""
    import signal
    b = bouncer(ini_overrides={**BASE, "pool_mode": "transaction", "max_client_conn": 20,
                               "max_db_client_connections": 20, "log_connections": 1})
    held = [b.connect(autocommit=True) for _ in range(20)]
    mark = b.log_mark()
    add_second_worker(b)

    def open_its_log():  # a login logs: worker 1 opens its log file now, not when it has no descriptor left
        with private_console(b, 1, password="pgbouncer"):
            pass
    pid = stop_worker_1_before_it_takes_clients(b, mark, before_stop=open_its_log)

    def nofile(soft):
        subprocess.run(["prlimit", f"--pid={pid}", f"--nofile={soft}:{hard}"], check=True, **run_as.popen_kwargs())
    with open(f"/proc/{pid}/limits") as f:
        hard = next(line.split()[4] for line in f if line.startswith("Max open files"))
    in_use = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
    # room for one more descriptor: the socket pair of the move, not the clients
    nofile(next(n for n in range(1, 1 << 16) if n not in in_use) + 1)
    try:
        b.wait_log(r"moved [1-9]\d* clients to worker 1", after=mark)
        os.kill(pid, signal.SIGCONT)
        b.wait_log(r"took 0 clients from worker 0; [1-9]\d* could not be taken", after=mark)
    finally:
        os.kill(pid, signal.SIGCONT)
        nofile(hard)
    alive = []
    for c in held:
        try:
            assert c.execute("SELECT 1").fetchone() == (1,)
            alive.append(c)
        except psycopg.OperationalError:
            pass
    assert 0 < len(alive) < 20
    wait_for(lambda: even(b, len(alive)), "an even split of the clients left")
    more = [b.connect(autocommit=True) for _ in range(20 - len(alive))]
    for i, c in enumerate(alive + more):
        assert c.execute("SELECT %s::int", (i,)).fetchone() == (i,)
    with pytest.raises(psycopg.OperationalError, match="max_client_conn"):
        b.connect(autocommit=True)
    with b.admin() as con:
        (db,) = [r for r in rows(con, "SHOW DATABASES") if r["name"] == "postgres"]
    assert db["current_client_connections"] == 20


def test_mass_move_keeps_every_cancel_key(bouncer, pg, monkeypatch):
    """1,000 transaction-mode clients on one worker; a second worker takes
    about half at once and tells the master each one's cancel key, a burst
    far beyond the control channel's socket buffer while the master does
    not read (stopped here, as a master kept off the CPU would be). None may
    be lost: no message dropped in the log, and a cancel for any moved
    client, sent to the pooler's port, stops its query."""
    import signal
    # 1,000 sockets push psycopg's own descriptors past select()'s limit of 1024: wait with epoll instead
    monkeypatch.setattr(psycopg.waiting, "wait", psycopg.waiting.wait_epoll)
    total = 1000
    b = bouncer(ini_overrides={**BASE, "pool_mode": "transaction", "max_client_conn": total + 100,
                               "default_pool_size": 30})
    clients = {}
    for _ in range(total):
        w = PgWire(b.port)
        key = next(body for t, body in w.login() if t == b"K")
        clients[w.sock.getsockname()[1]] = (w, key)
    assert spread(b, 1) == [total]
    mark = b.log_mark()
    add_second_worker(b)
    pid = stop_worker_1_before_it_takes_clients(b, mark)
    try:
        sent = int(b.wait_log(r"moved (\d+) clients to worker 1", after=mark).group(1))
        assert sent >= total // 3
        os.kill(b.pid, signal.SIGSTOP)
        os.kill(pid, signal.SIGCONT)
        wait_for(lambda: clients_of(b, 1) == sent, "worker 1 to take the clients")
    finally:
        os.kill(pid, signal.SIGCONT)
        os.kill(b.pid, signal.SIGCONT)
    moved = sorted(ports_of(b, 1))
    sample = [clients[p] for p in moved[:: len(moved) // 20][:20]]
    assert all(key[3] == 0 for _, key in sample)  # keys made by worker 0
    for w, _ in sample:
        w.send(query_message("SELECT pg_sleep(10)"))
    wait_for(lambda: len(pg.sql("SELECT 1 FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(10)' "
                                "AND state = 'active'") or []) == len(sample), "the queries to run")
    started = time.monotonic()
    for _, key in sample:  # to the TCP port: either worker may get it
        c = PgWire(b.port)
        c.send(request_packet(CANCEL_REQUEST, key))
        c.expect_closed()
        c.close()
    for i, (w, _) in enumerate(sample):
        msgs = w.read_until(b"Z")
        errs = [error_fields(body) for t, body in msgs if t == b"E"]
        assert errs and errs[0]["C"] == "57014", (i, msgs)
    assert time.monotonic() - started < 8, "the cancels took as long as the queries"
    log = b.log_text()[mark:]
    assert "could not tell the master" not in log  # how a lost message read before the channel queued
    assert not re.search(r"control channel to .* dropped", log)
    for w, _ in clients.values():
        w.close()
