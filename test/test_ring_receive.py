"""Receives through io_uring (doc/architecture.md, "Batched receives").

After a few reads of its own, a logged-in pooled client's plain socket and
a logged-in server's are read by one multishot receive in the worker's
io_uring, not by a recv() per readiness event. Each story here runs three times:
with the ring (the default where the kernel allows it), with batched sends
only (PGBOUNCER_IO_URING=send) and without io_uring (=0, the path of
kernels and builds without it), and a user sees the same in all three. /proc tells which path the worker took.
"""

import hashlib
import os
import socket
import threading
import time

import psycopg
import pytest

from conftest import wait_for
from helpers import Background, rows, workers
from pgwire import PgWire

TX = {"pool_mode": "transaction", "default_pool_size": "2", "max_client_conn": "100"}

MODES = [pytest.param(None, id="ring"), pytest.param({"PGBOUNCER_IO_URING": "send"}, id="send-only"),
         pytest.param({"PGBOUNCER_IO_URING": "0"}, id="epoll")]


def uring_fdinfo(pid):
    """The fdinfo of the worker's io_uring instances: one dict each."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:[io_uring]":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                info = {}
                for line in f:
                    k, _, v = line.partition(":")
                    info[k.strip()] = v.strip()
            out.append(info)
        except FileNotFoundError:
            continue
    return out


def worker_pid(b):
    ws = [w for w in workers(b) if w["state"] == "active"]
    assert len(ws) == 1
    return ws[0]["pid"]


def completions(pid):
    """Completions reaped so far, summed over the worker's rings."""
    return sum(int(i.get("CqHead", 0)) for i in uring_fdinfo(pid))


@pytest.fixture(params=MODES)
def mode(request):
    return request.param


def start(bouncer, mode, **ini):
    return bouncer(ini_overrides={**TX, **ini}, env=mode)


def test_long_lived_clients_get_their_own_answers(bouncer, mode):
    """Eight long-lived clients share two servers for 60 queries each, some with results larger than the
    worker's receive buffers: every answer is the asker's own and intact. With the ring the worker reaps
    its receives from a second io_uring; without it, it has none."""
    b = start(bouncer, mode)
    pid = worker_pid(b)
    before = completions(pid)
    errors = []

    def run(k):
        try:
            with b.connect(autocommit=True) as c:
                for i in range(60):
                    if i % 15 == 7:
                        text = c.execute("SELECT string_agg(md5((%s * 1000 + g)::text), '') "
                                         "FROM generate_series(1, 3000) g", (k,)).fetchone()[0]
                        want = "".join(hashlib.md5(str(k * 1000 + g).encode()).hexdigest() for g in range(1, 3001))
                        assert text == want
                    else:
                        assert c.execute("SELECT %s::int, %s::text", (k, f"q{i}")).fetchone() == (k, f"q{i}")
        except Exception as e:  # reported below, with the client's number
            errors.append((k, repr(e)))

    all_clients(run, 8)
    assert not errors
    rings = uring_fdinfo(pid)
    if mode is None:
        assert len(rings) == 2, rings  # the send queue's and the receive ring
        # 8 x 60 queries and their answers: most of them came through the rings
        assert completions(pid) - before > 8 * 60
    elif mode["PGBOUNCER_IO_URING"] == "send":
        assert len(rings) == 1, rings  # the send queue's only
    else:
        assert rings == []


def test_large_messages_both_ways(bouncer, mode):
    """A long-lived client sends a 3 MB parameter and gets it back, in a pipeline of extended-protocol
    statements: the bytes arrive intact both ways."""
    b = start(bouncer, mode)
    blob = os.urandom(3 * 1024 * 1024)
    with b.connect(autocommit=True) as c:
        for i in range(6):  # long-lived: past the reads of its own
            assert c.execute("SELECT %s::int", (i,)).fetchone() == (i,)
        with c.pipeline():
            curs = [c.execute("SELECT %s::bytea, %s::int", (blob, n)) for n in range(3)]
        for n, cur in enumerate(curs):
            got, k = cur.fetchone()
            assert k == n and bytes(got) == blob


def test_waiting_client_that_leaves_disturbs_nobody(bouncer, pg, mode):
    """With one server, a long-lived client waits for it and its connection is shut down under it; the
    client holding the server commits its transaction, and the next client is served."""
    b = start(bouncer, mode, default_pool_size="1", query_wait_timeout="30")
    pg.sql("CREATE TABLE IF NOT EXISTS ring_leaver (i int)")
    pg.sql("TRUNCATE ring_leaver")
    holder = b.connect(autocommit=False)
    leaver = b.connect(autocommit=True)
    for i in range(6):  # long-lived: past the reads of its own
        assert leaver.execute("SELECT %s::int", (i,)).fetchone() == (i,)
    holder.execute("INSERT INTO ring_leaver VALUES (1)")
    waiting = Background(lambda: leaver.execute("SELECT 'never'"))
    wait_for(lambda: rows_of(b)["cl_waiting"] == 1, "the client to wait")
    sock = socket.socket(fileno=os.dup(leaver.pgconn.socket))
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()
    with pytest.raises(psycopg.OperationalError):
        waiting.result(timeout=10)
    wait_for(lambda: rows_of(b)["cl_waiting"] == 0, "the leaver to be gone")
    holder.commit()
    assert pg.sql("SELECT count(*) FROM ring_leaver") == [(1,)]
    with b.connect(autocommit=True) as c:
        assert c.execute("SELECT 'served'").fetchone() == ("served",)
    holder.close()


def all_clients(run, n):
    """run(k) for k in 0..n-1, each in a thread of its own; returns when all are done."""
    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a client is still running"


def rows_of(b):
    with b.admin() as con:
        return next(r for r in rows(con, "SHOW POOLS") if r["database"] == "postgres")


def test_server_that_dies_mid_query(bouncer, pg, mode):
    """A long-lived client's server is terminated while it runs a query: the client gets an error, other
    clients and the pooler carry on, and the client's next query runs on a new server."""
    b = start(bouncer, mode)
    c = b.connect(autocommit=True)
    other = b.connect(autocommit=True)
    for i in range(6):
        assert c.execute("SELECT %s::int", (i,)).fetchone() == (i,)
        assert other.execute("SELECT %s::int", (i,)).fetchone() == (i,)
    sleeping = Background(lambda: c.execute("SELECT pg_sleep(30)"))
    victim = wait_for(lambda: pg.sql("SELECT pid FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)'"),
                      "the query to run")[0][0]
    pg.sql("SELECT pg_terminate_backend(%s)", [victim])
    with pytest.raises(psycopg.Error):
        sleeping.result(timeout=20)
    assert other.execute("SELECT 'still here'").fetchone() == ("still here",)
    if c.closed:
        c = b.connect(autocommit=True)
    assert c.execute("SELECT pg_backend_pid() <> %s", (victim,)).fetchone() == (True,)
    c.close()
    other.close()


@pytest.mark.parametrize("loopcnt", [1, 5])
def test_read_limit_per_event_never_stalls_a_stream(bouncer, mode, loopcnt):
    """sbuf_loopcnt stops a socket's reads after that many; through the ring what it left in the socket's
    stash is taken up again in the same wake-up, after the others, as epoll would report the socket again:
    two long-lived clients fetching large results side by side both get them whole."""
    b = start(bouncer, mode, sbuf_loopcnt=str(loopcnt))
    errors = []

    def fetch(k):
        try:
            with b.connect(autocommit=True) as c:
                for i in range(5):
                    c.execute("SELECT %s::int", (i,))
                for _ in range(3):
                    got = c.execute("SELECT %s::int, repeat('y', 2000) FROM generate_series(1, 2000)",
                                    (k,)).fetchall()
                    assert got == [(k, "y" * 2000)] * 2000
        except Exception as e:  # reported below
            errors.append((k, repr(e)))

    all_clients(fetch, 2)
    assert not errors


def cpu_ticks(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])


def test_mass_close_leaves_the_worker_serving(bouncer, pg, mode):
    """2,300 long-lived clients closed in one loop pass (KILL of their
    database): with the ring, each close cancels a receive, and their
    completions are more than the completion queue holds, so the kernel
    keeps the rest aside until the worker asks. The worker asks: it does
    not spin on a ring that stays readable, and a client of another
    database goes on being answered."""
    b = bouncer(ini_overrides={**TX, "max_client_conn": "3000", "max_workers": "1"},
                databases={"postgres": pg.connstr("postgres"), "other": pg.connstr("postgres")}, env=mode)
    pid = worker_pid(b)
    survivor = b.connect(dbname="other", autocommit=True)
    for i in range(6):  # on the ring too
        assert survivor.execute("SELECT %s::int", (i,)).fetchone() == (i,)
    admin = b.admin()  # opened before the descriptors pass 1024 (libpq waits with poll(), psycopg too)
    clients = []
    try:
        for _ in range(2300):
            w = PgWire(b.port)
            w.login()
            for _ in range(5):
                assert w.simple_query("SELECT 1")[0] == [["1"]]
            clients.append(w)
        admin.execute("KILL postgres")
        time.sleep(0.5)
        t0 = cpu_ticks(pid)
        time.sleep(2)
        spent = cpu_ticks(pid) - t0
        answer = Background(lambda: survivor.execute("SELECT 'survivor'").fetchone())
        assert answer.result(timeout=20) == ("survivor",)
        # idle but for the answer: a spinning loop would take about 200 ticks in 2 s
        assert spent < 50, f"the idle worker used {spent} clock ticks in 2 s"
    finally:
        for w in clients:
            w.close()
        admin.close()
