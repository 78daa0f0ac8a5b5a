"""The admin console answers for every worker (DESIGN.md §5; doc/workers.md):
SHOW merges the rows of all workers, process commands apply to all, a worker
that does not answer is named in a NOTICE; the private per-worker sockets."""

import os
import signal
import stat
import threading
import time

import psycopg
import pytest

from conftest import DEADLINE, wait_for
from helpers import Background, conn_on, kv, rows, states, worker_of, workers

TWO = {"min_workers": 2, "max_workers": 2, "log_connections": 0, "log_disconnections": 0}


def two_workers(ini=None, **kw):
    """The bouncer factory call for two workers, waiting until both are active."""
    def start(bouncer):
        b = bouncer(ini_overrides={**TWO, **(ini or {})}, **kw)
        wait_for(lambda: states(b) == ["active", "active"], "two active workers")
        return b
    return start


def on_worker(b, worker, admin=False, **kw):
    """A connection (client or console) that landed on the given worker."""
    def attempt():
        conn = b.admin(**kw) if admin else b.connect(**kw)
        if worker_of(conn) == worker:
            return conn
        conn.close()
        return None
    return wait_for(attempt, f"a {'console' if admin else 'client'} on worker {worker}")


def private_dir(b):
    return b.dir / f"pgbouncer-workers.{b.port}"


def private_console(b, worker):
    """A console reaching one specific worker through its private socket."""
    return psycopg.connect(host=str(private_dir(b) / f"worker.{worker}"), port=b.port, user="pgbouncer",
                           dbname="pgbouncer", autocommit=True, connect_timeout=10)


def test_private_sockets_dir_mode_and_removed_at_exit(bouncer):
    b = two_workers()(bouncer)
    d = private_dir(b)
    st = os.stat(d)
    assert stat.S_IMODE(st.st_mode) == 0o700
    for w in (0, 1):
        assert stat.S_ISSOCK(os.stat(d / f"worker.{w}" / f".s.PGSQL.{b.port}").st_mode)
        with private_console(b, w) as conn:
            assert worker_of(conn) == w
    assert b.stop(signal.SIGTERM) == 0
    assert not d.exists()


def test_private_console_does_not_fan_out(bouncer):
    b = two_workers()(bouncer)
    held = [on_worker(b, w, application_name=f"held{w}") for w in (0, 1)]
    for w in (0, 1):
        with private_console(b, w) as conn:
            apps = {r["application_name"] for r in rows(conn, "SHOW CLIENTS") if r["database"] == "postgres"}
            assert apps == {f"held{w}"}
            pool = next(r for r in rows(conn, "SHOW POOLS") if r["database"] == "postgres")
            assert pool["cl_active"] == 1
    del held


@pytest.mark.parametrize("console_worker", [0, 1])
def test_show_clients_and_servers_of_both_workers(bouncer, console_worker):
    b = two_workers()(bouncer)
    clients = {}
    for w, n in ((0, 3), (1, 2)):
        for k in range(n):
            clients[f"c{w}_{k}"] = on_worker(b, w, application_name=f"c{w}_{k}")
    # session mode: a client that ran a query holds its server
    for name in ("c0_0", "c1_0"):
        clients[name].execute("SELECT 1")
    with on_worker(b, console_worker, admin=True) as conn:
        cl = [r for r in rows(conn, "SHOW CLIENTS") if r["database"] == "postgres"]
        assert sorted(r["application_name"] for r in cl) == sorted(clients)
        assert len({r["id"] for r in rows(conn, "SHOW CLIENTS")}) == len(rows(conn, "SHOW CLIENTS"))
        sv = [r for r in rows(conn, "SHOW SERVERS") if r["state"] == "active"]
        assert sorted(r["application_name"] for r in sv) == ["c0_0", "c1_0"]
        # column types as with one worker
        cur = conn.execute("SHOW CLIENTS")
        assert [d.type_code for d in cur.description][6] == 23
        sockets = [r for r in rows(conn, "SHOW SOCKETS") if r["database"] == "postgres" and r["type"] == "C"]
        assert len(sockets) == 5


def test_show_clients_and_sockets_keep_one_poolers_row_order(bouncer):
    """The merged rows come pool by pool, sorted by (database, user), and
    within a pool by state (spec: active, waiting, ...; servers after the
    clients in SOCKETS), not worker after worker: a console on worker 1 is
    listed before the clients of postgres, the active client of worker 1
    before the waiting one of worker 0."""
    b = two_workers({"default_pool_size": 1})(bouncer)
    for w in (0, 1):  # each worker's pool has had a server: logins need none below
        with on_worker(b, w) as c:
            c.execute("SELECT 1")
    holder = on_worker(b, 1, autocommit=True, application_name="holder")
    holder.execute("SELECT 1")  # session mode: keeps the only server
    waiter = on_worker(b, 0, autocommit=True, application_name="waiter")
    waiting = Background(lambda: waiter.execute("SELECT 2").fetchone())
    conn = on_worker(b, 1, admin=True)
    wait_for(lambda: next(r for r in rows(conn, "SHOW POOLS") if r["database"] == "postgres")["cl_waiting"] == 1,
             "the waiter to queue")
    cl = [(r["database"], r["state"], r["application_name"]) for r in rows(conn, "SHOW CLIENTS")]
    assert cl == [("pgbouncer", "idle", ""), ("postgres", "active", "holder"), ("postgres", "waiting", "waiter")]
    so = [(r["database"], r["type"], r["state"]) for r in rows(conn, "SHOW SOCKETS")]
    assert so == [("pgbouncer", "C", "cl_active"), ("postgres", "C", "cl_active"), ("postgres", "C", "cl_waiting"),
                  ("postgres", "S", "sv_active")]
    holder.close()
    assert waiting.result() == (2,)


def test_show_pools_and_stats_sum_both_workers(bouncer):
    b = two_workers({"stats_period": 1})(bouncer)
    c0 = [on_worker(b, 0, autocommit=True) for _ in range(2)]
    c1 = [on_worker(b, 1, autocommit=True) for _ in range(3)]

    def totals(conn):
        return next(r for r in rows(conn, "SHOW STATS_TOTALS") if r["database"] == "postgres")

    with on_worker(b, 0, admin=True) as conn:
        before = totals(conn)["query_count"] if any(
            r["database"] == "postgres" for r in rows(conn, "SHOW STATS_TOTALS")) else 0
        for c in c0:
            for _ in range(4):
                c.execute("SELECT 1")
        for c in c1:
            for _ in range(5):
                c.execute("SELECT 1")
        pool = next(r for r in rows(conn, "SHOW POOLS") if r["database"] == "postgres")
        assert pool["cl_active"] == 5
        assert pool["sv_idle"] + pool["sv_used"] + pool["sv_active"] >= 2  # one server per worker at least
        after = totals(conn)
        assert after["query_count"] - before == 2 * 4 + 3 * 5
        stats = next(r for r in rows(conn, "SHOW STATS") if r["database"] == "postgres")
        assert stats["total_query_count"] == after["query_count"]
        assert kv(conn, "SHOW TOTALS")["total_query_count"] >= after["query_count"]
        # the merged row equals the sum of what each worker says on its private socket
        per_worker = []
        for w in (0, 1):
            with private_console(b, w) as pc:
                per_worker.append(next(r for r in rows(pc, "SHOW POOLS") if r["database"] == "postgres"))
        assert pool["cl_active"] == sum(p["cl_active"] for p in per_worker)
        assert [p["cl_active"] for p in per_worker] == [2, 3]
        db = next(r for r in rows(conn, "SHOW DATABASES") if r["name"] == "postgres")
        assert db["current_client_connections"] == 5
        user = next(r for r in rows(conn, "SHOW USERS") if r["name"] == "postgres")
        assert user["current_client_connections"] == 5


def test_show_lists_counts_objects_once_and_sums_connections(bouncer):
    b = two_workers()(bouncer)
    held = [on_worker(b, w) for w in (0, 1, 1)]
    per_worker = []
    for w in (0, 1):
        with private_console(b, w) as pc:
            per_worker.append(kv(pc, "SHOW LISTS"))
    with b.admin() as conn:
        lists = kv(conn, "SHOW LISTS")
        cur = conn.execute("SHOW LISTS")
        assert [d.type_code for d in cur.description] == [25, 23]
        mem = rows(conn, "SHOW MEM")
    assert list(lists) == list(per_worker[0])
    # both workers have the same databases, users and (postgres, postgres) pool: each counts once
    for key in ("databases", "users", "pools"):
        assert lists[key] == max(per_worker[0][key], per_worker[1][key]), key
    # connections are each worker's own: the three held clients and this console (the private
    # consoles above are gone; the peer connections of this console count nowhere)
    with b.admin() as conn:
        wait_for(lambda: kv(conn, "SHOW LISTS")["used_clients"] == 3 + 1, "the private consoles to be gone")
    client_cache = next(r for r in mem if r["name"] == "client_cache")
    assert client_cache["used"] >= 3
    del held


def test_pause_and_resume_apply_to_both_workers(bouncer):
    b = two_workers()(bouncer)
    # each worker's pool has had a server (so that logins need none while paused)
    for w in (0, 1):
        with on_worker(b, w) as c:
            c.execute("SELECT 1")
    with b.admin() as conn:
        conn.execute("PAUSE")
        for w in (0, 1):
            with private_console(b, w) as pc:
                assert kv(pc, "SHOW STATE")["paused"] == "yes"
        assert kv(conn, "SHOW STATE")["paused"] == "yes"
        c0 = on_worker(b, 0, autocommit=True)
        c1 = on_worker(b, 1, autocommit=True)
        done = []

        def query(c, tag):
            c.execute("SELECT 1")
            done.append(tag)

        threads = [threading.Thread(target=query, args=(c, w)) for w, c in ((0, c0), (1, c1))]
        for t in threads:
            t.start()
        wait_for(lambda: next(r for r in rows(conn, "SHOW POOLS") if r["database"] == "postgres")["cl_waiting"] == 2,
                 "a query waiting on each worker")
        assert done == [], "queries must wait while every worker is paused"
        conn.execute("RESUME")
        for t in threads:
            t.join(timeout=20)
        assert sorted(done) == [0, 1]
        assert kv(conn, "SHOW STATE")["active"] == "yes"


def test_pause_waits_for_a_busy_server_on_the_other_worker(bouncer):
    b = two_workers()(bouncer)
    holder = on_worker(b, 1, autocommit=True)
    holder.execute("SELECT 1")  # session mode: the server stays linked until disconnect
    conn = on_worker(b, 0, admin=True)
    result = []
    t = threading.Thread(target=lambda: result.append(conn.execute("PAUSE").statusmessage))
    t.start()
    with private_console(b, 1) as pc:
        wait_for(lambda: kv(pc, "SHOW STATE")["paused"] == "yes", "worker 1 to start pausing")
    time.sleep(0.5)
    assert result == [], "PAUSE answered while worker 1 still had a server in use"
    holder.close()
    t.join(timeout=20)
    assert result == ["PAUSE"]
    conn.execute("RESUME")


def test_cancel_of_a_pending_pause_resumes_every_worker(bouncer):
    b = two_workers()(bouncer)
    holder = on_worker(b, 1, autocommit=True)
    holder.execute("SELECT 1")  # keeps worker 1's PAUSE pending
    conn = on_worker(b, 0, admin=True)
    outcome = []

    def pause():
        try:
            conn.execute("PAUSE")
            outcome.append("PAUSE")
        except psycopg.InternalError as e:  # an aborted command ends with a bare ReadyForQuery
            outcome.append(str(e))

    t = threading.Thread(target=pause)
    t.start()
    with private_console(b, 1) as pc:
        wait_for(lambda: kv(pc, "SHOW STATE")["paused"] == "yes", "worker 1 to start pausing")
        time.sleep(0.3)
        conn.cancel()
        t.join(timeout=20)
        assert outcome == ["got no result from the query"]
        wait_for(lambda: kv(pc, "SHOW STATE")["active"] == "yes", "worker 1 to resume")
    with private_console(b, 0) as pc:
        assert kv(pc, "SHOW STATE")["active"] == "yes"
    assert holder.execute("SELECT 2").fetchone() == (2,)


def paused_by(command, b, worker):
    """Whether `command` (PAUSE or PAUSE postgres) holds on the worker."""
    if command == "PAUSE":
        return pause_state(b, worker) == "paused"
    return db_flags(b, worker, "postgres")[0] == 1


@pytest.mark.parametrize("busy", [0, 1])
@pytest.mark.parametrize("command", ["PAUSE", "PAUSE postgres"])
def test_cancel_of_a_pending_pause_undoes_it_on_the_worker_that_paused_at_once(bouncer, command, busy):
    """An operator gives up on a PAUSE that waits for a busy server (Ctrl-C in
    psql sends a cancel). As on one pooler, nothing stays paused: not on the
    worker that waited, nor on the one whose part was done at once, whichever
    of them the console is on."""
    b = two_workers()(bouncer)
    holder = on_worker(b, busy, autocommit=True)
    holder.execute("SELECT 1")  # session mode: keeps worker `busy`'s part of the PAUSE waiting
    conn = on_worker(b, 0, admin=True)
    pause = Background(lambda: conn.execute(command))
    wait_for(lambda: all(paused_by(command, b, w) for w in (0, 1)), "both workers to start pausing")
    time.sleep(0.3)
    assert not pause.done(), f"{command} answered while worker {busy} still had a server in use"
    conn.cancel()
    with pytest.raises(psycopg.InternalError, match="got no result from the query"):
        pause.result()  # an abandoned PAUSE ends with a bare ReadyForQuery
    for w in (0, 1):
        wait_for(lambda: not paused_by(command, b, w), f"worker {w} to drop the pause")
    # a client on either worker gets a server
    for w in (0, 1):
        with conn_on(b, w) as c:
            assert Background(lambda: c.execute("SELECT 3").fetchone()).result(10) == (3,)
    assert holder.execute("SELECT 2").fetchone() == (2,)
    assert kv(conn, "SHOW STATE")["active"] == "yes"


def test_cancel_of_a_wait_close_keeps_the_pause_of_another_console(bouncer):
    """During a failover one console waits in PAUSE; in another the operator
    runs RECONNECT and WAIT_CLOSE, then gives that up (cancel). Only the
    WAIT_CLOSE is abandoned: the pooler stays paused on every worker and the
    PAUSE still answers once the busy server is released."""
    b = two_workers()(bouncer)
    holder = on_worker(b, 1, autocommit=True)
    holder.execute("SELECT 1")
    pauser = on_worker(b, 0, admin=True)
    pause = Background(lambda: pauser.execute("PAUSE").statusmessage)
    wait_for(lambda: all(pause_state(b, w) == "paused" for w in (0, 1)), "both workers to start pausing")
    for w in (0, 1):  # the console's own part waits, or is done at once
        other = on_worker(b, w, admin=True)
        other.execute("RECONNECT")
        wait_close = Background(lambda: other.execute("WAIT_CLOSE"))
        time.sleep(0.5)
        assert not wait_close.done()
        other.cancel()
        with pytest.raises(psycopg.InternalError, match="got no result from the query"):
            wait_close.result()
        time.sleep(0.3)
        assert [pause_state(b, k) for k in (0, 1)] == ["paused", "paused"]
        assert not pause.done(), "the PAUSE was abandoned by another console's cancel"
        other.close()
    holder.close()
    assert pause.result() == "PAUSE"
    pauser.execute("RESUME")


def private_client(b, worker, dbname="postgres"):
    """A client of `dbname` on one specific worker (its private socket), so that no other worker sees it."""
    return psycopg.connect(host=str(private_dir(b) / f"worker.{worker}"), port=b.port, user="postgres",
                           dbname=dbname, autocommit=True, connect_timeout=10)


def test_kill_pauses_a_database_on_every_worker(bouncer, pg):
    """KILL closes every connection and leaves each database that had any
    paused until RESUME db. As on one pooler, a new client of such a
    database waits whichever worker it lands on, also one that had never
    served that database (there its login waits too: no server has given
    it the parameters of p0's welcome, and none may connect while paused)."""
    b = two_workers(databases={n: pg.connstr("postgres") for n in ("postgres", "p0")})(bouncer)
    private_client(b, 0, "p0").execute("SELECT 1")  # p0 has a pool on worker 0 only
    with b.admin() as conn:
        conn.execute("KILL")
        assert next(r for r in rows(conn, "SHOW DATABASES") if r["name"] == "p0")["paused"] == 1

        def late_query():
            with private_client(b, 1, "p0") as late:
                return late.execute("SELECT 4").fetchone()

        query = Background(late_query)
        time.sleep(0.5)
        ran = query.done()
        conn.execute("RESUME p0")
        assert query.result() == (4,)
    assert not ran, "a query of the killed database ran on worker 1 before RESUME p0"


def test_disable_of_an_auto_database_holds_on_every_worker(bouncer, pg):
    """An auto-database (`*`) exists where a client used it first, here on
    worker 0 only. DISABLE of it answers DISABLE, and as on one pooler a new
    login to it is refused on whichever worker it lands."""
    b = two_workers(databases={"postgres": pg.connstr("postgres"), "*": pg.connstr("postgres")})(bouncer)
    private_client(b, 0, "shop").execute("SELECT 1")
    with on_worker(b, 1, admin=True) as conn:
        assert conn.execute("DISABLE shop").statusmessage == "DISABLE"
    for w in (0, 1):
        with pytest.raises(psycopg.OperationalError, match='database "shop" is disabled'):
            private_client(b, w, "shop").close()


def test_suspend_refused_by_one_worker_suspends_none(bouncer, pg):
    """A database is paused on worker 1 only (an operator paused it through
    that worker's private socket); SHOW DATABASES shows it paused. SUSPEND
    then fails as on one pooler with a paused database, and no worker is
    left suspended while the other one serves."""
    b = two_workers(databases={n: pg.connstr("postgres") for n in ("postgres", "p0")})(bouncer)
    with private_console(b, 1) as pc:
        pc.execute("PAUSE p0")
    with b.admin() as conn:
        assert next(r for r in rows(conn, "SHOW DATABASES") if r["name"] == "p0")["paused"] == 1
        outcome = None
        try:
            outcome = conn.execute("SUSPEND").statusmessage
        except psycopg.Error as e:
            outcome = e.diag.message_primary
        states_after = [pause_state(b, w) for w in (0, 1)]
        if "suspended" in states_after:
            conn.execute("RESUME")
    assert (outcome, states_after) == ("cannot suspend with paused databases", ["active", "active"])


def three_workers(bouncer, pg):
    b = bouncer(ini_overrides={**TWO, "min_workers": 3, "max_workers": 3},
                databases={n: pg.connstr("postgres") for n in ("postgres", "p0")})
    wait_for(lambda: states(b) == ["active"] * 3, "three active workers")
    return b


def test_suspend_refused_by_one_worker_is_undone_on_the_others(bouncer, pg):
    """Three workers, a database paused on worker 2 only. A console on
    worker 0 gives SUSPEND: worker 2 refuses it, so worker 1, which had
    suspended already, is resumed too before the error reaches the console;
    a NOTICE names the worker that refused."""
    b = three_workers(bouncer, pg)
    with private_console(b, 2) as pc:
        pc.execute("PAUSE p0")
    conn = on_worker(b, 0, admin=True)
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    with pytest.raises(psycopg.errors.ProtocolViolation, match="^cannot suspend with paused databases$"):
        conn.execute("SUSPEND")
    assert [pause_state(b, w) for w in (0, 1, 2)] == ["active"] * 3
    assert any(n.startswith("worker 2 (pid ") and "refused it" in n for n in notices), notices
    for w in (0, 1):
        with private_client(b, w) as c:
            assert c.execute("SELECT 5").fetchone() == (5,)
    conn.close()


@pytest.mark.parametrize("console_on, busy", [(0, True), (0, False), (1, False)])
def test_pause_refused_by_one_worker_pauses_none(bouncer, console_on, busy):
    """Worker 1 is paused through its private socket, so the pooler counts
    as paused (SHOW STATE) and PAUSE fails as on one paused pooler, "already
    suspended/paused". Worker 0 is not left paused, whether its own PAUSE
    was done at once, still waiting for a busy server, or never given (the
    console's own worker refused first)."""
    b = two_workers()(bouncer)
    holder = None
    if busy:
        holder = on_worker(b, 0, autocommit=True)
        holder.execute("SELECT 1")  # session mode: worker 0's PAUSE would wait for it
    with private_console(b, 1) as pc:
        pc.execute("PAUSE")
    conn = on_worker(b, console_on, admin=True)
    assert kv(conn, "SHOW STATE")["paused"] == "yes"
    with pytest.raises(psycopg.errors.ProtocolViolation, match="^already suspended/paused$"):
        Background(lambda: conn.execute("PAUSE")).result(10)
    assert [pause_state(b, w) for w in (0, 1)] == ["active", "paused"]
    with private_client(b, 0) as c:
        assert Background(lambda: c.execute("SELECT 6").fetchone()).result(10) == (6,)
    if holder:
        assert holder.execute("SELECT 2").fetchone() == (2,)
    conn.execute("RESUME")
    assert [pause_state(b, w) for w in (0, 1)] == ["active", "active"]


def test_kill_refused_by_one_worker_names_the_worker_that_did_it(bouncer, pg):
    """KILL cannot be undone: when worker 1 refuses it (it is paused), the
    console gets the error, and a NOTICE says that worker 0 had closed its
    connections already."""
    b = two_workers()(bouncer)
    victim = on_worker(b, 0, autocommit=True)
    victim.execute("SELECT 1")
    with private_console(b, 1) as pc:
        pc.execute("PAUSE")
        pid1 = next(r["pid"] for r in rows(pc, "SHOW WORKERS") if r["worker"] == 1)
    conn = on_worker(b, 0, admin=True)
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    with pytest.raises(psycopg.errors.ProtocolViolation, match="^already suspended/paused$"):
        conn.execute("KILL")
    assert any(n.startswith("worker 0 (pid ") and "carried it out already" in n for n in notices), notices
    assert f"worker 1 (pid {pid1}) refused it" in notices
    with pytest.raises(psycopg.OperationalError, match="database removed"):
        victim.execute("SELECT 1")
    conn.execute("RESUME")
    conn.execute("RESUME postgres")


def test_resume_of_what_one_worker_has_paused_succeeds(bouncer, pg):
    """A worker with nothing to resume is no refusal: RESUME db and RESUME
    answer as on one pooler that is paused (SHOW DATABASES, SHOW STATE), and
    the worker that was paused resumes."""
    b = two_workers(databases={n: pg.connstr("postgres") for n in ("postgres", "p0")})(bouncer)
    with private_console(b, 1) as pc:
        pc.execute("PAUSE p0")
    for console_on in (0, 1):
        with on_worker(b, console_on, admin=True) as conn:
            assert conn.execute("RESUME p0").statusmessage == "RESUME"
            assert db_flags(b, 1, "p0") == (0, 0)
            with pytest.raises(psycopg.errors.ProtocolViolation, match="^database p0 is not paused$"):
                conn.execute("RESUME p0")  # not paused anywhere: the error, as on one pooler
        with private_console(b, 1) as pc:
            pc.execute("PAUSE p0" if console_on == 0 else "PAUSE")
    with on_worker(b, 0, admin=True) as conn:
        assert conn.execute("RESUME").statusmessage == "RESUME"
    assert [pause_state(b, w) for w in (0, 1)] == ["active", "active"]


def test_disable_of_a_database_no_worker_has_leaves_nothing_behind(bouncer, pg):
    """DISABLE of a name no worker has fails as on one pooler, and no worker
    remembers it: a later login to that auto-database gets in everywhere."""
    b = two_workers(databases={"postgres": pg.connstr("postgres"), "*": pg.connstr("postgres")})(bouncer)
    with b.admin() as conn:
        with pytest.raises(psycopg.errors.ProtocolViolation, match="^no such database: shop$"):
            conn.execute("DISABLE shop")
    for w in (0, 1):
        with private_client(b, w, "shop") as c:
            assert c.execute("SELECT 1").fetchone() == (1,)


def test_kill_and_auto_database_disable_reach_workers_started_later(bouncer, pg):
    """The console is on worker 1, which has neither p0 nor the auto-database
    shop (worker 0 has both). After KILL and DISABLE shop, a worker that
    replaces worker 0 has p0 paused and refuses shop, as worker 1 does."""
    b = two_workers(databases={"postgres": pg.connstr("postgres"), "p0": pg.connstr("postgres"),
                               "*": pg.connstr("postgres")})(bouncer)
    private_client(b, 0, "p0").execute("SELECT 1")
    private_client(b, 0, "shop").execute("SELECT 1")
    with on_worker(b, 1, admin=True) as conn:
        assert conn.execute("KILL").statusmessage == "KILL"
        assert conn.execute("DISABLE shop").statusmessage == "DISABLE"
    assert db_flags(b, 1, "p0") == (1, 0)
    respawn(b, 0)
    assert db_flags(b, 0, "p0") == (1, 0)
    for w in (0, 1):
        with pytest.raises(psycopg.OperationalError, match='database "shop" is disabled'):
            private_client(b, w, "shop").close()
    with b.admin() as conn:
        conn.execute("RESUME p0")
        conn.execute("RESUME shop")  # KILL paused it too: it had a pool on worker 0
        conn.execute("ENABLE shop")
    for w in (0, 1):
        with private_client(b, w, "shop") as c:
            assert c.execute("SELECT 1").fetchone() == (1,)


def stopped_while(b, worker, conn, *commands, warm=True):
    """Give the console's commands while `worker` is stopped (SIGSTOP): each
    answers with a NOTICE that it is left out. Then let it run again. warm:
    the console has talked to the worker before (else its first command
    there is a login that never completes)."""
    with private_console(b, 1 - worker) as c:
        pid = next(r["pid"] for r in rows(c, "SHOW WORKERS") if r["worker"] == worker)
    if warm:
        rows(conn, "SHOW CLIENTS")
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    os.kill(pid, signal.SIGSTOP)
    try:
        for command in commands:
            conn.execute(command)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert len([n for n in notices if f"worker {worker}" in n]) == len(commands), notices


@pytest.mark.parametrize("first", ["PAUSE", "SUSPEND"])
def test_pause_and_resume_while_a_worker_is_stopped_end_resumed(bouncer, first):
    """The operator pauses (or suspends) and resumes while worker 1 is
    stopped (both answer with a NOTICE that it is left out). When worker 1
    runs again the pooler is not paused: the last word was RESUME. The
    PAUSE written to worker 1 before it was left out is stale there."""
    b = two_workers()(bouncer)
    conn = on_worker(b, 0, admin=True)
    stopped_while(b, 1, conn, first, "RESUME")
    wait_for(lambda: [pause_state(b, w) for w in (0, 1)] == ["active", "active"], "both workers active")
    time.sleep(1)  # nothing late pauses it again
    assert [pause_state(b, w) for w in (0, 1)] == ["active", "active"]
    with b.connect() as c:
        assert c.execute("SELECT 1").fetchone() == (1,)
    conn.close()


def test_pause_while_a_worker_is_stopped_holds_there_once_it_runs(bouncer):
    """PAUSE alone while worker 1 is stopped: PAUSE is the last word, so
    worker 1 is paused once it runs again, and the next RESUME reaches it."""
    b = two_workers()(bouncer)
    conn = on_worker(b, 0, admin=True)
    stopped_while(b, 1, conn, "PAUSE")
    wait_for(lambda: [pause_state(b, w) for w in (0, 1)] == ["paused", "paused"], "both workers paused")
    time.sleep(1)
    assert [pause_state(b, w) for w in (0, 1)] == ["paused", "paused"]
    assert kv(conn, "SHOW STATE")["paused"] == "yes"
    conn.execute("RESUME")
    assert [pause_state(b, w) for w in (0, 1)] == ["active", "active"]
    conn.close()


def test_resume_a_stopped_worker_missed_reaches_it_once_it_runs(bouncer):
    """PAUSE while every worker runs, RESUME from another console while
    worker 1 is stopped: that console's login there never completes, so the
    RESUME never reaches worker 1 as a command; it resumes all the same."""
    b = two_workers()(bouncer)
    with on_worker(b, 0, admin=True) as conn:
        conn.execute("PAUSE")
    assert [pause_state(b, w) for w in (0, 1)] == ["paused", "paused"]
    conn = on_worker(b, 0, admin=True)
    stopped_while(b, 1, conn, "RESUME", warm=False)
    wait_for(lambda: [pause_state(b, w) for w in (0, 1)] == ["active", "active"], "both workers active")
    time.sleep(1)
    assert [pause_state(b, w) for w in (0, 1)] == ["active", "active"]
    conn.close()


@pytest.mark.parametrize("commands, flags", [
    (("PAUSE postgres", "RESUME postgres"), (0, 0)),
    (("DISABLE postgres", "ENABLE postgres"), (0, 0)),
    (("KILL postgres", "RESUME postgres"), (0, 0)),
    (("DISABLE postgres", "PAUSE p0"), None),
])
def test_database_commands_while_a_worker_is_stopped(bouncer, pg, commands, flags):
    """Database flags given while worker 1 is stopped: once it runs, it has
    the flags the console's commands left, not those of a stale command."""
    b = two_workers(databases={name: pg.connstr("postgres") for name in ("postgres", "p0")})(bouncer)
    conn = on_worker(b, 0, admin=True)
    stopped_while(b, 1, conn, *commands)
    want = {"postgres": flags or (0, 1), "p0": (0, 0) if flags else (1, 0)}
    for w in (0, 1):
        wait_for(lambda: {n: db_flags(b, w, n) for n in want} == want, f"worker {w}: {want}")
    time.sleep(1)
    assert [{n: db_flags(b, w, n) for n in want} for w in (0, 1)] == [want, want]
    conn.close()


def test_kill_client_on_the_other_worker(bouncer):
    b = two_workers()(bouncer)
    victim = on_worker(b, 1, application_name="victim")
    with on_worker(b, 0, admin=True) as conn:
        vid = next(r["id"] for r in rows(conn, "SHOW CLIENTS") if r["application_name"] == "victim")
        conn.execute(f"KILL_CLIENT {vid}")
        with pytest.raises(psycopg.OperationalError) as exc:
            victim.execute("SELECT 1")
        assert "admin forced disconnect" in str(exc.value)
        with pytest.raises(psycopg.errors.ProtocolViolation) as exc:
            conn.execute("KILL_CLIENT 99999999")
        assert exc.value.diag.message_primary == "client not found"


def test_kill_client_logs_only_what_failed(bouncer):
    """KILL_CLIENT of a client on the other worker succeeds: the console's
    worker, which did not have it, logs no "client not found". An id no
    worker has is logged once."""
    b = two_workers()(bouncer)
    victim = on_worker(b, 1, application_name="victim")
    with on_worker(b, 0, admin=True) as conn:
        vid = next(r["id"] for r in rows(conn, "SHOW CLIENTS") if r["application_name"] == "victim")
        mark = b.log_mark()
        conn.execute(f"KILL_CLIENT {vid}")
        with pytest.raises(psycopg.OperationalError):
            victim.execute("SELECT 1")
        with pytest.raises(psycopg.errors.ProtocolViolation):
            conn.execute("KILL_CLIENT 99999999")
        b.wait_log(r"ERROR client not found$", after=mark)
        conn.execute("SHOW VERSION")  # the log lines of the KILL_CLIENTs are written by now
    log = b.log_text()[mark:]
    assert (log.count("ERROR client not found"), log.count("pooler error: client not found")) == (1, 1), log


def test_kill_client_never_reaches_a_consoles_peer_connection(bouncer):
    """A console's connections to the other workers (for fanned-out
    commands) have ids from the same counter but are nobody's clients:
    SHOW CLIENTS hides them, and KILL_CLIENT of their id finds no client
    (it used to close them, each time the command went through one)."""
    b = two_workers()(bouncer)
    keep = [on_worker(b, w, autocommit=True) for w in (0, 1)]
    with on_worker(b, 0, admin=True) as conn:
        shown = {r["id"] for r in rows(conn, "SHOW CLIENTS")}  # the peer connection exists from here on
        mark = b.log_mark()
        for cid in range(1, max(shown) + 20):
            if cid in shown:
                continue
            with pytest.raises(psycopg.errors.ProtocolViolation) as exc:
                conn.execute(f"KILL_CLIENT {cid}")
            assert exc.value.diag.message_primary == "client not found"
        assert {r["id"] for r in rows(conn, "SHOW CLIENTS")} == shown
    assert "admin forced disconnect" not in b.log_text()[mark:]
    for c in keep:
        assert c.execute("SELECT 1").fetchone() == (1,)


def test_disable_enable_and_reconnect_apply_everywhere(bouncer):
    b = two_workers()(bouncer)
    with b.admin() as conn:
        conn.execute("DISABLE postgres")
        for w in (0, 1):
            with private_console(b, w) as pc:
                db = next(r for r in rows(pc, "SHOW DATABASES") if r["name"] == "postgres")
                assert db["disabled"] == 1
        for _ in range(6):  # new logins fail whichever worker they land on
            with pytest.raises(psycopg.OperationalError) as exc:
                psycopg.connect(host="127.0.0.1", port=b.port, dbname="postgres", user="postgres")
            assert 'database "postgres" is disabled' in str(exc.value)
        conn.execute("ENABLE postgres")
        clients = [on_worker(b, w, autocommit=True) for w in (0, 1)]
        for c in clients:
            c.execute("SELECT 1")
        conn.execute("RECONNECT postgres")
        sv = [r for r in rows(conn, "SHOW SERVERS") if r["database"] == "postgres" and r["state"] == "active"]
        assert len(sv) == 2 and all(r["close_needed"] == 1 for r in sv)
        for c in clients:
            c.close()  # session mode: the servers are released (and closed) at disconnect
        conn.execute("WAIT_CLOSE postgres")
        assert all(r["close_needed"] == 0 for r in rows(conn, "SHOW SERVERS"))


def test_set_applies_to_every_worker(bouncer):
    b = two_workers()(bouncer)
    with b.admin() as conn:
        conn.execute("SET query_wait_timeout = 77")
    for w in (0, 1):
        with private_console(b, w) as pc:
            assert kv(pc, "SHOW CONFIG")["query_wait_timeout"] == "77"


def test_reload_once_per_worker(bouncer):
    b = two_workers()(bouncer)
    b.update(default_pool_size=7)
    b.write_ini()
    mark = b.log_mark()
    with b.admin() as conn:
        conn.execute("RELOAD")
        for w in (0, 1):
            with private_console(b, w) as pc:
                assert kv(pc, "SHOW CONFIG")["default_pool_size"] == "7"
    time.sleep(0.5)
    assert b.log_text()[mark:].count("RELOAD command issued") == 1


def test_reload_answers_after_the_slow_worker_reloaded(bouncer):
    """RELOAD's reply means every worker runs the new file: the next SHOW on
    any worker sees it, even when one worker takes its SIGHUP late."""
    b = two_workers()(bouncer)
    with b.admin() as conn:
        pids = {r["worker"]: r["pid"] for r in rows(conn, "SHOW WORKERS")}
    b.update(default_pool_size=7)
    b.write_ini()
    console = on_worker(b, 0, admin=True)
    done = {}

    def reload():
        console.execute("RELOAD")
        done["at"] = time.monotonic()

    os.kill(pids[1], signal.SIGSTOP)
    try:
        t = threading.Thread(target=reload)
        t.start()
        time.sleep(1.5)
        assert "at" not in done, "RELOAD answered while worker 1 had not reloaded"
    finally:
        resumed = time.monotonic()
        os.kill(pids[1], signal.SIGCONT)
    t.join(10)
    assert done["at"] >= resumed
    with private_console(b, 1) as pc:
        assert kv(pc, "SHOW CONFIG")["default_pool_size"] == "7"
    console.close()


def test_reload_the_master_never_runs_fails_instead_of_hanging(bouncer):
    """A console's RELOAD waits for the master to reload every worker. When
    the master does not (stopped here; or its own load of the file failed
    after the console's check passed), the console gets an error after the
    wait's cap, not a hang, and the worker keeps serving."""
    b = two_workers()(bouncer)
    b.update(default_pool_size=9)
    b.write_ini()
    console = on_worker(b, 0, admin=True)
    os.kill(b.proc.pid, signal.SIGSTOP)
    try:
        reload = Background(lambda: console.execute("RELOAD"))
        with pytest.raises(psycopg.Error) as e:
            reload.result(DEADLINE)  # a RELOAD still waiting fails here: "background query did not finish"
        assert e.value.sqlstate == "F0000"
        assert e.value.diag.message_primary == "RELOAD failed, see logs for additional details"
        # the console and the pool still answer
        assert kv(console, "SHOW CONFIG")["default_pool_size"] != "9"
        with on_worker(b, 0) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    b.wait_log(r"the master did not reload within 5 s")
    console.close()


def rows_of(b, command):
    with b.admin() as conn:
        return rows(conn, command)


def test_console_set_reaches_workers_started_later(bouncer):
    """A console SET is the running configuration of the whole pooler: a
    worker the master starts afterwards (a respawn here; a scale-up alike)
    has it too, not the file's value, and the scaler takes worker_* values."""
    b = two_workers()(bouncer)
    with b.admin() as conn:
        conn.execute("SET default_pool_size = 33")
        conn.execute("SET worker_scale_up_samples = 7")
        pids = {r["worker"]: r["pid"] for r in rows(conn, "SHOW WORKERS")}
    os.kill(pids[1], signal.SIGKILL)

    def respawned():
        with b.admin() as conn:
            ws = {w["worker"]: w for w in rows(conn, "SHOW WORKERS")}
        return 1 in ws and ws[1]["pid"] != pids[1] and ws[1]["state"] == "active"

    wait_for(respawned, "worker 1 to be started again")
    with private_console(b, 1) as pc:
        config = kv(pc, "SHOW CONFIG")
        assert config["default_pool_size"] == "33"
        assert config["worker_scale_up_samples"] == "7"
    # the scaler reads the master's copy: one worker fewer without a RELOAD
    with b.admin() as conn:
        conn.execute("SET min_workers = 1")
        conn.execute("SET max_workers = 1")
    wait_for(lambda: rows_of(b, "SHOW SCALER")[0]["max_workers"] == 1, "SHOW SCALER to show max_workers 1")
    wait_for(lambda: states(b) == ["active"], "one worker left")


def respawn(b, worker):
    """Kill a worker and wait until the master has started its replacement; reads SHOW WORKERS
    on the other worker's private socket, which answers during a SUSPEND too."""
    with private_console(b, 1 - worker) as pc:
        old = next(r["pid"] for r in rows(pc, "SHOW WORKERS") if r["worker"] == worker)
    os.kill(old, signal.SIGKILL)

    def replaced():
        with private_console(b, 1 - worker) as pc:
            w = next((r for r in rows(pc, "SHOW WORKERS") if r["worker"] == worker), None)
        return w is not None and w["pid"] not in (0, old) and w["state"] == "active"

    wait_for(replaced, f"worker {worker} to be started again")


def db_flags(b, worker, name):
    with private_console(b, worker) as pc:
        db = next(r for r in rows(pc, "SHOW DATABASES") if r["name"] == name)
    return db["paused"], db["disabled"]


def test_disable_and_pause_db_reach_workers_started_later(bouncer, pg):
    """DISABLE db, PAUSE db and KILL db are the console's word for the whole
    pooler: a worker started after them (a respawn here, a scale-up alike)
    has them too, and ENABLE / RESUME db lift them there as well."""
    b = two_workers(databases={name: pg.connstr("postgres") for name in ("postgres", "p0", "p1")})(bouncer)
    with b.admin() as conn:
        conn.execute("DISABLE postgres")
        conn.execute("PAUSE p0")
    respawn(b, 1)
    assert db_flags(b, 1, "postgres") == (0, 1)
    assert db_flags(b, 1, "p0") == (1, 0)
    for _ in range(6):  # a login fails whichever worker it lands on
        with pytest.raises(psycopg.OperationalError) as exc:
            psycopg.connect(host="127.0.0.1", port=b.port, dbname="postgres", user="postgres")
        assert 'database "postgres" is disabled' in str(exc.value)
    with b.admin() as conn:
        conn.execute("ENABLE postgres")
        conn.execute("RESUME p0")
        conn.execute("KILL p1")  # leaves p1 paused until RESUME p1
    assert db_flags(b, 1, "postgres") == (0, 0)
    assert db_flags(b, 1, "p0") == (0, 0)
    respawn(b, 0)
    assert [db_flags(b, w, "p1") for w in (0, 1)] == [(1, 0), (1, 0)]
    with b.admin() as conn:
        conn.execute("RESUME p1")
    assert [db_flags(b, w, "p1") for w in (0, 1)] == [(0, 0), (0, 0)]
    with b.connect() as c:
        assert c.execute("SELECT 1").fetchone() == (1,)


def test_disabled_auto_database_stays_disabled_on_a_worker_started_later(bouncer, pg):
    """An auto-database (`*`) disabled while it existed on one worker: a
    worker started later refuses logins to it from its first one, whatever
    other console commands reach that worker meanwhile, until ENABLE."""
    b = two_workers(databases={"postgres": pg.connstr("postgres"), "*": pg.connstr("postgres")})(bouncer)
    private_client(b, 0, "shop").execute("SELECT 1")  # shop exists on worker 0 only
    with on_worker(b, 0, admin=True) as conn:
        assert conn.execute("DISABLE shop").statusmessage == "DISABLE"
    respawn(b, 1)
    with b.admin() as conn:  # other state commands reach the new worker
        conn.execute("PAUSE postgres")
        conn.execute("RESUME postgres")
    with pytest.raises(psycopg.OperationalError, match='database "shop" is disabled'):
        private_client(b, 1, "shop").close()
    with on_worker(b, 0, admin=True) as conn:
        assert conn.execute("ENABLE shop").statusmessage == "ENABLE"
    for w in (0, 1):
        with private_client(b, w, "shop") as c:
            assert c.execute("SELECT 1").fetchone() == (1,)


def pause_state(b, worker):
    with private_console(b, worker) as pc:
        state = kv(pc, "SHOW STATE")
    return next(k for k in ("active", "paused", "suspended") if state[k] == "yes")


def test_pause_holds_on_a_worker_started_during_it(bouncer):
    """A failover done as PAUSE, switch, RESUME: a worker the master starts
    in between must not let a query through."""
    b = two_workers()(bouncer)
    with b.admin() as conn:
        conn.execute("PAUSE")
    respawn(b, 1)
    assert pause_state(b, 1) == "paused"
    # clients until one waits on the new worker (the kernel spreads them)
    waiting = []
    for _ in range(12):
        waiting.append(Background(lambda: b.connect(autocommit=True).execute("SELECT 7").fetchone()))
        time.sleep(0.2)
        with private_console(b, 1) as pc:
            if rows(pc, "SHOW CLIENTS"):
                break
    with private_console(b, 1) as pc:
        assert rows(pc, "SHOW CLIENTS"), "no client reached worker 1"
    time.sleep(0.5)
    assert not any(w.done() for w in waiting), "a query ran while the pooler was paused"
    with b.admin() as conn:
        conn.execute("RESUME")
    assert [w.result() for w in waiting] == [(7,)] * len(waiting)
    assert pause_state(b, 1) == "active"


def test_suspend_holds_on_a_worker_started_during_it_and_ends_with_its_console(bouncer):
    """SUSPEND holds on a worker started during it (it does not accept); when
    the suspending console goes away without RESUME, every worker resumes,
    the new one too (the master tells it)."""
    b = two_workers()(bouncer)
    conn = b.admin()
    conn.execute("SUSPEND")
    respawn(b, 1)
    assert pause_state(b, 1) == "suspended"
    conn.close()
    for w in (0, 1):
        wait_for(lambda: pause_state(b, w) == "active", f"worker {w} to resume")
    with conn_on(b, 1) as c:
        assert c.execute("SELECT 1").fetchone() == (1,)


def test_signal_pause_reaches_workers_started_later(bouncer):
    """SIGUSR1 to the master pauses the pooler, SIGUSR2 resumes it: the
    workers started in between follow."""
    b = two_workers()(bouncer)
    os.kill(b.pid, signal.SIGUSR1)
    wait_for(lambda: pause_state(b, 1) == "paused", "worker 1 to pause")
    respawn(b, 1)
    assert pause_state(b, 1) == "paused"
    os.kill(b.pid, signal.SIGUSR2)
    wait_for(lambda: pause_state(b, 1) == "active", "worker 1 to resume")
    respawn(b, 0)
    assert pause_state(b, 0) == "active"


def test_stopped_worker_is_named_in_a_notice(bouncer):
    b = two_workers()(bouncer)
    pids = {}
    with b.admin() as conn:
        pids = {r["worker"]: r["pid"] for r in rows(conn, "SHOW WORKERS")}
    conn = on_worker(b, 0, admin=True)
    held = on_worker(b, 0, application_name="alive")
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    os.kill(pids[1], signal.SIGSTOP)
    try:
        start = time.monotonic()
        cl = rows(conn, "SHOW CLIENTS")
        elapsed = time.monotonic() - start
        assert elapsed < 5
        assert "alive" in {r["application_name"] for r in cl}
        assert any("worker 1" in n and f"pid {pids[1]}" in n for n in notices), notices
        # a command is not held up either
        notices.clear()
        conn.execute("RECONNECT")
        assert any("worker 1" in n for n in notices), notices
    finally:
        os.kill(pids[1], signal.SIGCONT)
    # worker 1 answers again
    notices.clear()
    wait_for(lambda: not rows(conn, "SHOW POOLS") is None and notices == [], "no more notices")
    del held


def test_one_worker_does_not_fan_out(bouncer):
    b = bouncer(ini_overrides={"min_workers": 1, "max_workers": 1})
    with b.admin() as conn:
        assert conn.execute("SHOW CLIENTS").fetchall()
        with pytest.raises(psycopg.errors.ProtocolViolation):
            conn.execute("SHOW STATS_RAW")
    assert os.path.isdir(private_dir(b))


@pytest.mark.parametrize("squatter", ["file", "foreign-dir", "symlink"])
def test_squatted_private_dir_does_not_stop_a_start(bouncer, tmp_path, squatter):
    """Another user (here root) took the private directory's name: the pooler
    starts anyway, with a directory of a name nobody can guess, and says so."""
    b = bouncer(ini_overrides={"min_workers": 2, "max_workers": 2}, start=False)
    d = private_dir(b)
    if squatter == "file":
        d.write_text("not a directory\n")
    elif squatter == "foreign-dir":
        d.mkdir()
        os.chmod(d, 0o777)
    else:
        (tmp_path / "elsewhere").mkdir()
        d.symlink_to(tmp_path / "elsewhere")
    b.start()
    line = b.wait_log(r"WARNING .*pgbouncer-workers\.\d+ .*using (\S+) instead").group(0)
    wait_for(lambda: sorted(w["state"] for w in workers(b)) == ["active", "active"], "two workers")
    # the console still answers for both workers
    held = [on_worker(b, w, application_name=f"held{w}") for w in (0, 1)]
    with b.admin() as admin:
        apps = {r["application_name"] for r in rows(admin, "SHOW CLIENTS") if r["database"] == "postgres"}
    assert apps == {"held0", "held1"}, line
    del held
    # the squatter's object is left alone
    assert d.is_symlink() if squatter == "symlink" else d.exists()


# ---- found by trying to break the fan-out of process commands ----

def pid_of(b, worker):
    return next(w["pid"] for w in workers(b) if w["worker"] == worker)


def outcome_of(bg):
    """A command's statusmessage, its error text, or "aborted" for a bare ReadyForQuery."""
    try:
        return bg.result(15)
    except psycopg.InternalError as e:
        assert str(e) == "got no result from the query"
        return "aborted"
    except psycopg.Error as e:
        return e.diag.message_primary


def cancelled_while_worker_1_stops(b, conn, query):
    """Console conn (on worker 0) gives `query` while worker 1 is stopped,
    and cancels it before worker 1 runs again; returns the Background of
    the query."""
    rows(conn, "SHOW CLIENTS")  # the peer connection to worker 1 is logged in
    pid1 = pid_of(b, 1)
    os.kill(pid1, signal.SIGSTOP)
    try:
        command = Background(lambda: conn.execute(query).statusmessage)
        time.sleep(0.3)
        conn.cancel()
        time.sleep(0.3)
    finally:
        os.kill(pid1, signal.SIGCONT)
    return command


def test_cancel_of_a_pause_a_stopped_worker_completes_late(bouncer):
    """The console cancels a PAUSE that worker 1, stopped for a moment, has
    not read yet: worker 1 pauses once it runs (the cancel comes after), and
    its part is undone. The reply must say what the pooler is now: either
    PAUSE with every worker paused, or an abandoned command with none paused;
    never PAUSE while nothing is paused. (The console is on the Unix socket,
    which only a running worker accepts from: the cancel reaches worker 0.)"""
    b = two_workers()(bouncer)
    conn = on_worker(b, 0, admin=True, host=str(b.dir))
    outcome = outcome_of(cancelled_while_worker_1_stops(b, conn, "PAUSE"))
    time.sleep(0.5)
    after = [pause_state(b, w) for w in (0, 1)]
    assert (outcome, after) in (("PAUSE", ["paused", "paused"]), ("aborted", ["active", "active"]))


def test_cancel_of_a_kill_still_kills_everywhere(bouncer, pg):
    """KILL cannot be cancelled (it closes connections at once); a cancel that
    comes while worker 1 has not answered yet must not skip the follow-up:
    p0, killed on worker 0 (its only pool), ends paused on worker 1 too, as
    the reply KILL says."""
    b = two_workers(databases={n: pg.connstr("postgres") for n in ("postgres", "p0")})(bouncer)
    private_client(b, 0, "p0").execute("SELECT 1")  # p0 has a pool on worker 0 only
    conn = on_worker(b, 0, admin=True, host=str(b.dir))
    assert outcome_of(cancelled_while_worker_1_stops(b, conn, "KILL")) == "KILL"
    assert [db_flags(b, w, "p0") for w in (0, 1)] == [(1, 0), (1, 0)]
    conn.execute("RESUME p0")


@pytest.mark.parametrize("before", ["PAUSE p0", "KILL p0"])
def test_failed_pause_db_keeps_a_pause_that_was_there_before(bouncer, pg, before):
    """p0 is paused on every worker (PAUSE p0, or KILL p0). Worker 1 is then
    paused through its private socket, so it refuses the next PAUSE p0 and
    the command fails as on one paused pooler. The undo of worker 0's part
    (RESUME p0) must not lift the pause p0 had before the command: a failed
    command changes nothing."""
    b = two_workers(databases={n: pg.connstr("postgres") for n in ("postgres", "p0")})(bouncer)
    conn = on_worker(b, 0, admin=True)
    conn.execute(before)
    with private_console(b, 1) as pc:
        pc.execute("PAUSE")
    with pytest.raises(psycopg.errors.ProtocolViolation, match="^already suspended/paused$"):
        conn.execute("PAUSE p0")
    assert [db_flags(b, w, "p0") for w in (0, 1)] == [(1, 0), (1, 0)]
    conn.execute("RESUME")
    conn.execute("RESUME p0")


def test_disable_later_is_for_peers_only(bouncer, pg):
    """DISABLE_LATER and RESUME_PART are the fan-out's own follow-up and
    undo: an operator's console on the public port gets "invalid command",
    as from one PgBouncer, and so does a stats user on a private socket."""
    b = two_workers(ini={"stats_users": "postgres", "auth_type": "trust"})(bouncer)
    for command in ("DISABLE_LATER postgres", "RESUME_PART", "RESUME_PART postgres"):
        with b.admin() as conn:
            with pytest.raises(psycopg.errors.ProtocolViolation, match="^invalid command"):
                conn.execute(command)
        with psycopg.connect(host=str(private_dir(b) / "worker.0"), port=b.port, user="postgres",
                             dbname="pgbouncer", autocommit=True, connect_timeout=10) as conn:
            with pytest.raises(psycopg.errors.ProtocolViolation, match="^invalid command"):
                conn.execute(command)
    assert [db_flags(b, w, "postgres") for w in (0, 1)] == [(0, 0), (0, 0)]



def test_kill_and_disable_follow_ups_of_a_name_that_needs_quoting(bouncer, pg):
    """An auto-database whose name has upper case, a space and a double
    quote exists on worker 0 only. KILL's follow-up pauses it on worker 1,
    and DISABLE of it (quoted as one identifier) is remembered there."""
    name = 'Sh"op x'
    b = two_workers(databases={"postgres": pg.connstr("postgres"), "*": pg.connstr("postgres")})(bouncer)
    private_client(b, 0, name).execute("SELECT 1")
    quoted = '"' + name.replace('"', '""') + '"'
    with on_worker(b, 1, admin=True) as conn:
        assert conn.execute("KILL").statusmessage == "KILL"
        assert db_flags(b, 1, name) == (1, 0)
        assert conn.execute(f"RESUME {quoted}").statusmessage == "RESUME"
        assert [db_flags(b, w, name) for w in (0, 1)] == [(0, 0), (0, 0)]
    with private_console(b, 1) as pc:
        pc.execute("ENABLE " + quoted)  # worker 1 has it now (the KILL registered it): make it lack it again
    respawn(b, 1)
    with on_worker(b, 0, admin=True) as conn:
        assert conn.execute(f"DISABLE {quoted}").statusmessage == "DISABLE"
    for w in (0, 1):
        with pytest.raises(psycopg.OperationalError, match="is disabled"):
            private_client(b, w, name).close()


def test_commands_reach_a_worker_that_was_starting(bouncer):
    """A worker is replaced (its predecessor crashed) and, while the new one
    is still starting (held here with SIGSTOP between its fork and its
    first loop), a console runs PAUSE, SET and DISABLE. The fan-out cannot
    reach it yet; the master hands it what they left, so once it runs it is
    paused, has the SET value and the database disabled, like the rest of
    the pooler. Before, it came up as if none had run."""
    b = two_workers()(bouncer)
    con = on_worker(b, 0, admin=True)  # opened first: the starting worker's slot accepts nothing meanwhile
    w0 = next(r["pid"] for r in rows(con, "SHOW WORKERS") if r["worker"] == 0)
    new = None
    for _ in range(10):  # catching it before it runs its loop is a race: a few tries
        old = next(r["pid"] for r in rows(con, "SHOW WORKERS") if r["worker"] == 1)
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + DEADLINE
        while new is None and time.monotonic() < deadline:
            for t in os.listdir(f"/proc/{b.pid}/task"):
                with open(f"/proc/{b.pid}/task/{t}/children") as f:
                    for pid in map(int, f.read().split()):
                        if pid not in (old, w0):
                            os.kill(pid, signal.SIGSTOP)
                            new = pid
        assert new, "the replacement of worker 1 was not forked"
        if next(r["state"] for r in rows(con, "SHOW WORKERS") if r["worker"] == 1) == "starting":
            break
        os.kill(new, signal.SIGCONT)
        wait_for(lambda: states(b) == ["active", "active"], "worker 1 to run")
        new = None
    if new is None:
        pytest.skip("the new worker was active before it could be held, every time")
    try:
        con.execute("PAUSE")
        con.execute("SET default_pool_size = 7")
        con.execute("DISABLE postgres")
    finally:
        os.kill(new, signal.SIGCONT)
    wait_for(lambda: states(b) == ["active", "active"], "worker 1 to run")

    def taken():
        with private_console(b, 1) as pc:
            st = kv(pc, "SHOW STATE")
            cfg = {r["key"]: r["value"] for r in rows(pc, "SHOW CONFIG")}
            db = next(r for r in rows(pc, "SHOW DATABASES") if r["name"] == "postgres")
        return st["paused"] == "yes" and cfg["default_pool_size"] == "7" and db["disabled"] == 1
    wait_for(taken, "worker 1 to be paused, with the SET value and the database disabled")
    con.execute("RESUME")
    con.execute("ENABLE postgres")
    con.close()
