"""Pool limits span all workers (DESIGN.md §5): default_pool_size, max_db_connections,
max_user_connections, max_client_conn and min_pool_size count the connections of every
worker; a worker whose clients wait gets an idle server another worker gives back; a
crashed or drained worker's share comes back."""

import os
import re
import signal
import threading
import time

import psycopg
import pytest

from conftest import wait_for
from helpers import conn_on, two_workers, worker_of, workers

TWO = {"min_workers": 2, "max_workers": 2, "pool_mode": "transaction"}
USERS = '"postgres" "postgres"\n"pgbouncer" "pgbouncer"\n"glimit_u2" "pw"\n'


def backends(pg, app):
    return pg.sql("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [app])[0][0]



def run_clients(b, pg, app, clients, dbs=("postgres",), users=("postgres",)):
    """Concurrent clients (new connections, spread by the kernel) run short queries while
    pg_stat_activity is polled; returns (most backends seen, workers that served, errors).
    Needs log_connections (the default) to count server logins."""
    errors, served = [], set()

    def client(n):
        try:
            for k in range(3):
                with b.connect(autocommit=True, dbname=dbs[n % len(dbs)], user=users[n % len(users)]) as conn:
                    served.add(worker_of(conn))
                    for i in range(3):
                        assert conn.execute("SELECT %s::int + %s::int, pg_sleep(0.02)",
                                            [n, i]).fetchone()[0] == n + i
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    most = 0
    while any(t.is_alive() for t in threads):
        most = max(most, backends(pg, app))
        time.sleep(0.01)
    for t in threads:
        t.join()
    logins = b.log_text().count("new connection to server")
    # give-backs must not turn into a reconnect per query (36 client connections ran 108 queries)
    assert logins < 36, f"{logins} server logins: servers bounce between workers"
    return most, served, errors


def test_default_pool_size_is_global(bouncer, pg):
    app = "glimit_pool"
    b = bouncer(ini_overrides=dict(TWO, default_pool_size=2),
                databases={"postgres": pg.connstr("postgres", application_name=app)})
    two_workers(b)
    most, served, errors = run_clients(b, pg, app, clients=12)
    assert not errors, errors
    assert served == {0, 1}, f"clients were served by workers {served} only"
    assert 1 <= most <= 2, f"{most} server connections for a pool of 2 over two workers"


def test_max_db_connections_is_global(bouncer, pg):
    app = "glimit_db"
    pg.create_role("glimit_u2", password="pw")
    b = bouncer(ini_overrides=dict(TWO, default_pool_size=10, max_db_connections=2), users_txt=USERS,
                databases={"postgres": pg.connstr("postgres", application_name=app)})
    two_workers(b)
    most, served, errors = run_clients(b, pg, app, clients=12, users=("postgres", "glimit_u2"))
    assert not errors, errors
    assert served == {0, 1}, f"clients were served by workers {served} only"
    assert 1 <= most <= 2, f"{most} server connections for max_db_connections = 2 over two workers"


def test_max_user_connections_is_global(bouncer, pg):
    app = "glimit_user"
    conn = pg.connstr("postgres", application_name=app)
    b = bouncer(ini_overrides=dict(TWO, default_pool_size=10, max_user_connections=2),
                databases={"db_a": conn, "db_b": conn})
    two_workers(b)
    most, served, errors = run_clients(b, pg, app, clients=12, dbs=("db_a", "db_b"))
    assert not errors, errors
    assert served == {0, 1}, f"clients were served by workers {served} only"
    assert 1 <= most <= 2, f"{most} server connections for max_user_connections = 2 over two workers"


def test_max_client_conn_is_global(bouncer):
    b = bouncer(ini_overrides=dict(TWO, max_client_conn=4))
    two_workers(b)
    pids = {w["worker"]: w["pid"] for w in workers(b)}
    held = [conn_on(b, 0), conn_on(b, 0), conn_on(b, 1), conn_on(b, 1)]
    # every further client is refused, whichever worker the kernel gives it to
    mark = b.log_mark()
    refused_by = set()
    for _ in range(40):
        with pytest.raises(psycopg.OperationalError) as exc:
            b.connect()
        assert "no more connections allowed (max_client_conn)" in str(exc.value)
        log = b.log_text()[mark:]
        refused_by = {w for w, pid in pids.items()
                      if re.search(rf"\[{pid}\] WARNING .*no more connections allowed \(max_client_conn\)", log)}
        if refused_by == {0, 1}:
            break
    assert refused_by == {0, 1}, f"only workers {refused_by} were tried"
    held.pop().close()
    wait_for(lambda: _connects(b), "a client accepted again once one left")
    for c in held:
        assert c.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.parametrize("setting", ["max_db_client_connections", "max_user_client_connections"])
def test_client_connection_caps_are_global(bouncer, setting):
    """Two clients of the database (user) on each worker would be four; the cap of 3 holds across both."""
    b = bouncer(ini_overrides=dict(TWO, **{setting: 3}))
    two_workers(b)
    held = [conn_on(b, 0), conn_on(b, 1), conn_on(b, 1)]
    for _ in range(20):
        with pytest.raises(psycopg.OperationalError) as exc:
            b.connect()
        assert f"client connections exceeded ({setting})" in str(exc.value)
    held.pop().close()
    # the unit comes back when the client goes: a new client is let in again
    def admitted():
        try:
            c = b.connect(autocommit=True)
        except psycopg.OperationalError as e:
            assert setting in str(e)
            return None
        return c
    held.append(wait_for(admitted, "a client admitted again once one left"))
    for c in held:
        assert c.execute("SELECT 1").fetchone() == (1,)


def _connects(b):
    try:
        with psycopg.connect(host="127.0.0.1", port=b.port, dbname="postgres", user="postgres",
                             connect_timeout=10) as c:
            return c.execute("SELECT 1").fetchone() == (1,)
    except psycopg.OperationalError as e:
        assert "max_client_conn" in str(e)
        return False


def hold_idle_servers(b, pg, app, worker, n):
    """n servers of the pool opened by clients of `worker`, left idle there (the clients go away)."""
    conns = [conn_on(b, worker) for _ in range(n)]
    for c in conns:
        c.execute("BEGIN")
        c.execute("SELECT 1")
    wait_for(lambda: backends(pg, app) == n, f"{n} servers")
    for c in conns:
        c.execute("COMMIT")
        c.close()


def test_idle_servers_are_given_back_to_another_worker(bouncer, pg):
    app = "glimit_giveback"
    # without a give-back, the client of worker 1 would wait past query_wait_timeout
    b = bouncer(ini_overrides=dict(TWO, default_pool_size=2, query_wait_timeout=10),
                databases={"postgres": pg.connstr("postgres", application_name=app)})
    two_workers(b)
    hold_idle_servers(b, pg, app, worker=0, n=2)
    mark = b.log_mark()
    a, c = conn_on(b, 1), conn_on(b, 1)
    a.execute("BEGIN")
    c.execute("BEGIN")
    assert a.execute("SELECT 'a'").fetchone() == ("a",)
    assert c.execute("SELECT 'c'").fetchone() == ("c",)
    b.wait_log(r"given back to another worker", after=mark)
    assert backends(pg, app) <= 2
    a.execute("COMMIT")
    c.execute("COMMIT")


def test_idle_server_within_its_share_goes_to_a_waiting_client(bouncer, pg):
    """Worker 0's one client sits between transactions on the server it
    used; worker 1's two clients share the pool's other server, one of them
    inside a transaction. By client count each worker's fair share of the
    pool of 2 is 1, so neither held more than its share, and worker 1's
    second client waited for the whole query_wait_timeout although a server
    was idle (pgjdbc with two connections of one thread, one in a
    transaction, hit this). One PgBouncer would give it the idle server: a
    server idle for half a second goes to the waiting worker whatever the
    shares."""
    app = "glimit_starved"
    b = bouncer(ini_overrides=dict(TWO, default_pool_size=2, query_wait_timeout=10),
                databases={"postgres": pg.connstr("postgres", application_name=app)})
    two_workers(b)
    quiet = conn_on(b, 0)
    assert quiet.execute("SELECT 'quiet'").fetchone() == ("quiet",)
    holder, waiter = conn_on(b, 1), conn_on(b, 1)
    holder.execute("BEGIN")
    assert holder.execute("SELECT 'holder'").fetchone() == ("holder",)
    wait_for(lambda: backends(pg, app) == 2, "the pool of 2 in use")
    mark = b.log_mark()
    started = time.monotonic()
    assert waiter.execute("SELECT 'waiter'").fetchone() == ("waiter",)
    assert time.monotonic() - started < 8, "served only near query_wait_timeout"
    b.wait_log(r"given back to another worker", after=mark)
    assert backends(pg, app) <= 2
    holder.execute("COMMIT")
    # and back: worker 0's client gets a server again
    assert quiet.execute("SELECT 'again'").fetchone() == ("again",)
    for c in (quiet, holder, waiter):
        c.close()


def test_busy_worker_leaves_a_server_to_the_other_workers_logins(bouncer, pg):
    """Clients that stay logged in on worker 0 and keep the whole pool busy do not starve
    the logins of worker 1: its share of the pool follows its clients, and a client
    waiting for its welcome counts (node-postgres with 10 connections on a pool of 2
    timed out 6 logins when it did not)."""
    app = "glimit_busy"
    b = bouncer(ini_overrides=dict(TWO, default_pool_size=2, client_login_timeout=10, query_wait_timeout=20),
                databases={"postgres": pg.connstr("postgres", application_name=app)})
    two_workers(b)
    busy = [conn_on(b, 0) for _ in range(4)]
    stop = threading.Event()
    errors = []

    def loop(c):
        try:
            while not stop.is_set():
                c.execute("SELECT pg_sleep(0.005)")
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            errors.append(repr(e))

    threads = [threading.Thread(target=loop, args=(c,)) for c in busy]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: backends(pg, app) == 2, "the pool of 2 busy on worker 0")
        late = [conn_on(b, 1) for _ in range(2)]
        for i, c in enumerate(late):
            assert c.execute("SELECT %s::int", [i]).fetchone() == (i,)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    assert backends(pg, app) <= 2


def test_crashed_worker_budget_returns(bouncer, pg):
    app = "glimit_crash"
    b = bouncer(ini_overrides=dict(TWO, default_pool_size=2, query_wait_timeout=10),
                databases={"postgres": pg.connstr("postgres", application_name=app)})
    two_workers(b)
    holders = [conn_on(b, 0), conn_on(b, 0)]
    for h in holders:
        h.execute("BEGIN")
        h.execute("SELECT 1")
    wait_for(lambda: backends(pg, app) == 2, "2 servers held by worker 0")
    victim = next(w for w in workers(b) if w["worker"] == 0)
    os.kill(victim["pid"], signal.SIGKILL)
    b.wait_log(rf"worker 0 \(pid {victim['pid']}\) was terminated by signal 9")
    wait_for(lambda: any(w["worker"] == 0 and w["pid"] != victim["pid"] and w["state"] == "active"
                         for w in workers(b)), "worker 0 respawned")
    # the full pool again, on both workers: two transactions at once
    fresh = [conn_on(b, 0), conn_on(b, 1)]
    for f in fresh:
        f.execute("BEGIN")
        assert f.execute("SELECT 2").fetchone() == (2,)
    assert backends(pg, app) == 2
    for f in fresh:
        f.execute("COMMIT")


def test_drained_worker_budget_returns(bouncer, pg):
    app = "glimit_drain"
    b = bouncer(ini_overrides=dict(TWO, default_pool_size=2, query_wait_timeout=10),
                databases={"postgres": pg.connstr("postgres", application_name=app)})
    two_workers(b)
    hold_idle_servers(b, pg, app, worker=1, n=2)
    b.update(min_workers=1, max_workers=1)
    b.write_ini()
    b.reload()
    b.wait_log(r"worker 1 \(pid \d+\) exited after draining")
    fresh = [b.connect(autocommit=True), b.connect(autocommit=True)]
    for f in fresh:
        f.execute("BEGIN")
        assert f.execute("SELECT 3").fetchone() == (3,)
    wait_for(lambda: backends(pg, app) == 2, "the full pool on the remaining worker")
    for f in fresh:
        f.execute("COMMIT")


def test_min_pool_size_counts_all_workers(bouncer, pg):
    app = "glimit_min"
    b = bouncer(ini_overrides=dict(TWO, default_pool_size=5),
                databases={"postgres": pg.connstr("postgres", application_name=app)})
    two_workers(b)
    # a client on each worker: each worker logged one server in for its welcome
    clients = [conn_on(b, 0), conn_on(b, 1)]
    wait_for(lambda: backends(pg, app) == 2, "one server per worker")
    b.update(min_pool_size=3)
    b.write_ini()
    b.reload()
    wait_for(lambda: backends(pg, app) >= 3, "min_pool_size servers")
    # several janitor rounds of both workers: nobody tops up past the global minimum (per worker: 6)
    time.sleep(2)
    assert backends(pg, app) == 3
    for c in clients:
        assert c.execute("SELECT 1").fetchone() == (1,)
        c.close()
