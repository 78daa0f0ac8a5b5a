"""The master dies; the workers do not (doc/workers.md "When the master dies").
Its workers keep serving the clients they have and keep accepting new ones;
a master started again with the same configuration (no -R needed) adopts
them: their clients move to its workers with no error, the old workers exit.
Not adopted within worker_orphan_timeout, they shut down safely."""

import os
import signal
import threading

import psycopg
import pytest

from conftest import parent_pid, pid_alive, wait_for
from helpers import Background, assert_cancels, conn_on, rows, worker_of, workers
from test_upgrade import Writer, old_trees  # noqa: F401 (fixture)

TWO = {"min_workers": 2, "max_workers": 2, "log_connections": 0, "log_disconnections": 0,
       "pool_mode": "transaction"}


def tcp(b, **kw):
    return psycopg.connect(host="127.0.0.1", port=b.port, dbname="postgres", user="postgres", autocommit=True,
                           connect_timeout=5, **kw)


def clients_on_both_workers(b, n=8):
    """n idle clients, at least one on each of the two workers."""
    conns = []
    for _ in range(40):
        conns.append(tcp(b))
        if len(conns) >= n and {worker_of(c) for c in conns} == {0, 1}:
            return conns
    pytest.fail("the clients all landed on one worker")


def kill_master(b, old_trees):
    """kill -9 of b's master; returns its workers' pids (they become orphans)."""
    pids = sorted(w["pid"] for w in workers(b))
    old_trees.append((b.pid, os.getpgid(b.pid)))
    proc = b.proc
    os.kill(b.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    b.proc = None
    return pids


@pytest.mark.parametrize("args", [[], ["-R"]], ids=["plain", "reboot"])
def test_workers_outlive_a_killed_master_and_a_new_master_adopts_them(bouncer, old_trees, pg, args):  # noqa: F811
    """kill -9 of the master under a committing writer: the workers serve on
    (old and new clients), a start with the same configuration (plain, or
    with -R) adopts them, every client moves to the new tree without an
    error, nothing committed is lost."""
    b = bouncer(ini_overrides=TWO)
    wait_for(lambda: sorted(w["state"] for w in workers(b)) == ["active", "active"], "two workers")
    conns = clients_on_both_workers(b)
    for c in conns:
        c.execute("SET application_name = 'kept'")
    writer = Writer(b, pg, f"orphan_writer_{len(args)}")
    wait_for(lambda: len(writer.committed) > 20, "the writer to commit")
    mark = b.log_mark()
    orphans = kill_master(b, old_trees)
    b.wait_log(r"master process went away; this worker serves on and waits up to 60 s", after=mark)

    # no master: the clients still run queries, new ones log in on both workers
    for c in conns:
        assert c.execute("SELECT 1").fetchone() == (1,)
    served = set()
    for _ in range(20):
        with tcp(b) as c:
            assert c.execute("SELECT 2").fetchone() == (2,)
            served.add(worker_of(c))
    assert served == {0, 1}
    before = len(writer.committed)
    wait_for(lambda: len(writer.committed) > before + 20, "the writer to commit without a master")
    # a cancel request lands on either worker; one for the other worker's client goes to its private socket
    one_each = [next(c for c in conns if worker_of(c) == w) for w in (0, 1)]
    for c in one_each:
        assert_cancels(c, times=3)
    # the console works; what needs the master says why it cannot
    with tcp(b) as _, psycopg.connect(host="127.0.0.1", port=b.port, dbname="pgbouncer", user="pgbouncer",
                                      autocommit=True, connect_timeout=5) as admin:
        assert len(rows(admin, "SHOW WORKERS")) == 2
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState,
                           match="RELOAD needs the master process, which is gone"):
            admin.execute("RELOAD")

    # a start with the same configuration adopts the orphans
    b.start(args)
    b.wait_log(r"adoption: 2 workers of a tree whose master died serve on; received \d+ listening sockets",
               after=mark)
    b.wait_log(r"adoption: 2 of 2 workers of the old tree hand their clients to this process", after=mark)
    wait_for(lambda: not any(pid_alive(p) for p in orphans), "the adopted workers to exit")
    assert b._read_pidfile() == b.pid
    pids = [w["pid"] for w in workers(b)]
    assert len(pids) == 2 and all(parent_pid(p) == b.pid for p in pids)
    # the clients are served by the new tree, with what they had set
    for c in conns:
        assert c.execute("SHOW application_name").fetchone() == ("kept",)
        assert c.execute("SELECT 3").fetchone() == (3,)
    with b.admin() as admin:
        assert sum(r["cl_active"] + r["cl_waiting"] for r in rows(admin, "SHOW WORKERS")) >= len(conns)
    before = len(writer.committed)
    wait_for(lambda: len(writer.committed) > before + 20, "the writer to commit on the new tree")
    writer.finish(pg)
    assert writer.errors == 0, f"the writer met {writer.errors} errors"
    for c in conns:
        c.close()


def test_cancels_reach_clients_of_the_adopted_tree(bouncer, old_trees):  # noqa: F811
    """Cancel requests for clients of the orphaned workers land on either
    tree (both accept during the new master's grace period) and reach their
    client: before the hand-over, while a client's query keeps it on its old
    worker, and after it moved."""
    b = bouncer(ini_overrides=TWO)
    wait_for(lambda: len(workers(b)) == 2, "two workers")
    conns = clients_on_both_workers(b, 2)
    busy = tcp(b)
    mark = b.log_mark()
    orphans = kill_master(b, old_trees)
    # a query that runs across the hand-over keeps its client on the old worker until it ends
    result = {}

    def sleeper():
        try:
            busy.execute("SELECT pg_sleep(30)")
        except psycopg.Error as e:
            result["error"] = e

    t = threading.Thread(target=sleeper)
    t.start()
    wait_for(lambda: any(r["state"] == "active" and r["query"].startswith("SELECT pg_sleep")
                         for r in pg_activity(b)), "the sleep to run")
    b.start()
    for c in conns:  # within the grace period: every request lands on one of four acceptors
        assert_cancels(c, times=2)
    b.wait_log(r"adoption: 2 of 2 workers of the old tree hand their clients to this process", after=mark)
    assert any(pid_alive(p) for p in orphans)  # the sleeper's worker waits for its query
    busy.cancel()
    t.join(timeout=20)
    assert not t.is_alive()
    assert isinstance(result.get("error"), psycopg.errors.QueryCanceled), result
    wait_for(lambda: not any(pid_alive(p) for p in orphans), "the adopted workers to exit")
    for c in conns + [busy]:  # moved to the new tree: cancels still reach them
        assert_cancels(c, times=2)
        c.close()


def pg_activity(b):
    with tcp(b) as c:
        return rows(c, "SELECT state, query FROM pg_stat_activity WHERE backend_type = 'client backend'")


def test_orphans_not_adopted_shut_down_after_the_timeout(bouncer, old_trees):  # noqa: F811
    b = bouncer(ini_overrides={**TWO, "worker_orphan_timeout": 2})
    wait_for(lambda: len(workers(b)) == 2, "two workers")
    conn = tcp(b)
    mark = b.log_mark()
    orphans = kill_master(b, old_trees)
    b.wait_log(r"waits up to 2 s \(worker_orphan_timeout\)", after=mark)
    assert conn.execute("SELECT 1").fetchone() == (1,)
    b.wait_log(r"no new master adopted this worker within worker_orphan_timeout \(2 s\): shutting down",
               after=mark)
    wait_for(lambda: not any(pid_alive(p) for p in orphans), "the orphans to exit")
    with pytest.raises(psycopg.OperationalError):
        tcp(b)
    conn.close()
    # nothing is left in the way of an ordinary start
    b.start()
    with tcp(b) as c:
        assert c.execute("SELECT 1").fetchone() == (1,)


def test_orphan_timeout_zero_keeps_the_old_behaviour(bouncer, old_trees):  # noqa: F811
    b = bouncer(ini_overrides={**TWO, "worker_orphan_timeout": 0})
    wait_for(lambda: len(workers(b)) == 2, "two workers")
    mark = b.log_mark()
    orphans = kill_master(b, old_trees)
    b.wait_log(r"master process went away, exiting", after=mark)
    wait_for(lambda: not any(pid_alive(p) for p in orphans), "the workers to exit with their master")


def test_a_tree_that_carried_on_after_an_aborted_upgrade_is_adopted(bouncer, old_trees):  # noqa: F811
    """-R whose new master is killed in its grace period: the old tree
    carries on, and its workers' private sockets, which the new workers had
    taken and removed as they exited, are there again; when the old master
    is killed later, a new start still adopts the old workers."""
    b = bouncer(ini_overrides=TWO)
    wait_for(lambda: len(workers(b)) == 2, "two workers")
    old_proc, old_pid = b.proc, b.pid
    old_trees.append((old_pid, os.getpgid(old_pid)))
    mark = b.log_mark()
    b.proc = None
    b.start(["-R"])
    new = b.proc
    old_trees.append((new.pid, new.pid))
    b.wait_log(r"online restart: pid \d+ stopped accepting and finishes its clients", after=mark)
    os.kill(new.pid, signal.SIGKILL)
    new.wait(timeout=30)
    b.proc = old_proc
    b.wait_log(rf"online restart: pid {new.pid} went away \d+\.\d s after taking over", after=mark)
    private = b.dir / f"pgbouncer-workers.{b.port}"
    wait_for(lambda: all((private / f"worker.{i}" / f".s.PGSQL.{b.port}").exists() for i in (0, 1)),
             "the old workers' private sockets to be back")
    with b.admin() as admin:  # the merged console reaches both workers again
        assert sorted(r["pid"] for r in rows(admin, "SHOW WORKERS")) == sorted(
            w["pid"] for w in workers(b))
    conn = tcp(b)
    mark = b.log_mark()
    orphans = kill_master(b, old_trees)
    b.start()
    b.wait_log(r"adoption: 2 of 2 workers of the old tree hand their clients to this process", after=mark)
    wait_for(lambda: not any(pid_alive(p) for p in orphans), "the adopted workers to exit")
    assert conn.execute("SELECT 1").fetchone() == (1,)
    conn.close()


def test_old_master_killed_in_its_upgrade_grace_period_leaves_orphans_the_new_master_adopts(
        bouncer, old_trees):  # noqa: F811
    """-R, then kill -9 of the old master while it still serves in its grace
    period: its workers serve on as orphans and the new master, already
    running, adopts them at once; their clients move with no error."""
    b = bouncer(ini_overrides=TWO)
    wait_for(lambda: len(workers(b)) == 2, "two workers")
    conns = clients_on_both_workers(b, 4)
    old_proc, old_pid = b.proc, b.pid
    old_workers = [w["pid"] for w in workers(b)]
    old_trees.append((old_pid, os.getpgid(old_pid)))
    mark = b.log_mark()
    b.proc = None
    b.start(["-R"])
    b.wait_log(r"online restart: pid \d+ took over; this process keeps serving for its grace period", after=mark)
    os.kill(old_pid, signal.SIGKILL)
    old_proc.wait(timeout=30)
    b.wait_log(r"adoption: 2 of 2 workers of the old tree hand their clients to this process", after=mark)
    wait_for(lambda: not any(pid_alive(p) for p in old_workers), "the old workers to exit")
    for c in conns:
        assert c.execute("SELECT 1").fetchone() == (1,)
        c.close()
    assert b._read_pidfile() == b.pid


def test_new_master_killed_while_adopting_leaves_the_orphans_serving(bouncer, old_trees):  # noqa: F811
    """The master that adopts the orphans is itself killed (kill -9) right
    after they handed it their sockets, within its grace period: its own
    workers exit with it, the orphans serve on as before, and the next start
    adopts them; the clients never see an error."""
    b = bouncer(ini_overrides=TWO)
    wait_for(lambda: len(workers(b)) == 2, "two workers")
    conns = clients_on_both_workers(b, 4)
    mark = b.log_mark()
    orphans = kill_master(b, old_trees)
    b.start(wait=False)
    adopter = b.proc
    old_trees.append((adopter.pid, adopter.pid))
    b.wait_log(r"adoption: 2 workers of a tree whose master died serve on", after=mark)
    os.kill(adopter.pid, signal.SIGKILL)
    adopter.wait(timeout=30)
    b.proc = None
    wait_for(lambda: b.log_text()[mark:].count("master process went away; this worker serves on") >= 4,
             "the orphans to be orphans again")
    assert "hand their clients to this process" not in b.log_text()[mark:]
    assert all(pid_alive(p) for p in orphans)
    for c in conns:
        assert c.execute("SELECT 1").fetchone() == (1,)
    with tcp(b) as c:
        assert c.execute("SELECT 2").fetchone() == (2,)
    mark2 = b.log_mark()
    b.start()
    b.wait_log(r"adoption: 2 of 2 workers of the old tree hand their clients to this process", after=mark2)
    wait_for(lambda: not any(pid_alive(p) for p in orphans), "the adopted workers to exit")
    for c in conns:
        assert c.execute("SELECT 3").fetchone() == (3,)
        c.close()


def test_without_a_master_a_cancel_on_the_wrong_worker_reaches_its_client(bouncer, old_trees):  # noqa: F811
    """No master: a cancel request that arrives at worker 1 for a client of
    worker 0 goes to worker 0's private socket and cancels the query."""
    from pgwire import CANCEL_REQUEST, PgWire, error_fields, query_message, request_packet
    b = bouncer(ini_overrides=TWO)
    wait_for(lambda: len(workers(b)) == 2, "two workers")
    private = b.dir / f"pgbouncer-workers.{b.port}"
    mark = b.log_mark()
    kill_master(b, old_trees)
    b.wait_log(r"master process went away; this worker serves on", after=mark)
    w = PgWire(b.port, host=str(private / "worker.0"))
    key = next(body for mtype, body in w.login() if mtype == b"K")
    assert key[3] == 0  # byte 3 of the key names worker 0
    w.send(query_message("SELECT pg_sleep(20)"))
    wait_for(lambda: any(r["state"] == "active" and r["query"].startswith("SELECT pg_sleep")
                         for r in pg_activity(b)), "the sleep to run")
    other = PgWire(b.port, host=str(private / "worker.1"))
    other.send(request_packet(CANCEL_REQUEST, key))
    assert other.expect_closed() == []  # a cancel request gets no answer, only the close
    errors = [error_fields(body) for mtype, body in w.read_until(b"Z") if mtype == b"E"]
    assert [e["C"] for e in errors] == ["57014"], errors
    w.close()
    other.close()


def errors_over(conns, seconds):
    """Each client runs SELECT 1 every half second for `seconds`; the errors they got."""
    import time
    errors = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        for c in conns:
            try:
                c.execute("SELECT 1")
            except psycopg.Error as e:
                errors.append(str(e).strip().splitlines()[0])
        time.sleep(0.5)
    return errors


def test_reboot_after_a_master_crash_with_a_respawned_worker(bouncer, old_trees):  # noqa: F811
    """A worker forked after the start (here: respawned after a crash) holds
    nothing of the master's: when the master is killed, its control socket
    closes with it, and `pgbouncer -R` adopts the orphans at once, as a plain
    start does. Before, the respawned worker kept the control socket
    listening: -R connected, waited 30 s for an answer and failed."""
    b = bouncer(ini_overrides=TWO)
    wait_for(lambda: len(workers(b)) == 2, "two workers")
    w1 = next(w["pid"] for w in workers(b) if w["worker"] == 1)
    mark = b.log_mark()
    os.kill(w1, signal.SIGKILL)
    b.wait_log(r"worker 1 started, pid", after=mark)
    wait_for(lambda: len(workers(b)) == 2 and w1 not in [w["pid"] for w in workers(b)], "worker 1 respawned")
    conns = clients_on_both_workers(b, 4)
    mark = b.log_mark()
    kill_master(b, old_trees)
    b.wait_log(r"master process went away; this worker serves on", after=mark)
    b.start(["-R"])
    b.wait_log(r"adoption: 2 of 2 workers of the old tree hand", after=mark, timeout=15)
    assert errors_over(conns, 3) == []
    for c in conns:
        c.close()


def test_an_orphan_that_notices_late_is_adopted_too(bouncer, old_trees):  # noqa: F811
    """Worker 1 is busy (here: stopped) when its master is killed and when
    the new master adopts worker 0; it notices a moment later. The running
    master looks for orphans every second, adopts it too, and its clients
    move without an error. Before, it shut down at worker_orphan_timeout
    and its clients got `server shutting down`."""
    b = bouncer(ini_overrides={**TWO, "worker_orphan_timeout": 5})
    wait_for(lambda: len(workers(b)) == 2, "two workers")
    conns = clients_on_both_workers(b, 4)
    w1 = next(w["pid"] for w in workers(b) if w["worker"] == 1)
    mark = b.log_mark()
    os.kill(w1, signal.SIGSTOP)
    try:
        kill_master(b, old_trees)
        b.wait_log(r"master process went away; this worker serves on", after=mark)
        b.start()
    finally:
        os.kill(w1, signal.SIGCONT)
    assert errors_over(conns, 8) == []
    wait_for(lambda: not pid_alive(w1), "the late orphan to hand over and exit")
    assert "no new master adopted this worker" not in b.log_text()[mark:]


def test_old_master_killed_between_its_sockets_and_the_commit(bouncer, old_trees):  # noqa: F811
    """-R: the old master is killed after it sent its sockets and before the
    new master's commit (the new master is stopped in that window). Its
    workers become orphans next to a running new master, which adopts them:
    their clients move with no error."""
    import time
    b = bouncer(ini_overrides={**TWO, "worker_orphan_timeout": 5})
    wait_for(lambda: len(workers(b)) == 2, "two workers")
    conns = clients_on_both_workers(b, 4)
    old_proc, old_pid = b.proc, b.pid
    old_trees.append((old_pid, os.getpgid(old_pid)))
    mark = b.log_mark()
    b.proc = None
    b.start(["-R"], wait=False)
    new = b.proc
    old_trees.append((new.pid, new.pid))
    deadline = time.monotonic() + 10
    while "listening sockets; the old process" not in b.log_text()[mark:]:
        assert time.monotonic() < deadline, b.log_text()[mark:]
        time.sleep(0.0005)
    os.kill(new.pid, signal.SIGSTOP)
    try:
        if "stopped accepting and finishes" in b.log_text()[mark:]:
            pytest.skip("the commit came before the stop")
        os.kill(old_pid, signal.SIGKILL)
        old_proc.wait(timeout=30)
    finally:
        os.kill(new.pid, signal.SIGCONT)
    b.wait_ready()
    assert errors_over(conns, 8) == []
    assert "did not confirm the hand-over" in b.log_text()[mark:]


@pytest.mark.parametrize("command", ["PAUSE", "PAUSE postgres"])
def test_an_orphan_paused_when_its_master_died_resumes_once_adopted(bouncer, old_trees, command):  # noqa: F811
    """The master dies while the pooler is paused, a client waiting in the
    pause. The new master does not know the pause, and once it has adopted
    the orphans no console reaches them (their private sockets are the new
    workers' now) and nothing moves from a paused worker: the waiting client
    hung for ever. An adopted orphan resumes; the client gets its answer."""
    b = bouncer(ini_overrides=TWO)
    wait_for(lambda: len(workers(b)) == 2, "two workers")
    conns = clients_on_both_workers(b, 2)
    conns = [next(c for c in conns if worker_of(c) == w) for w in (0, 1)]
    with b.admin(prepare_threshold=None) as admin:
        admin.execute(command)
    result = {}

    def waiter(c):
        try:
            result[worker_of(c)] = c.execute("SELECT 5").fetchone()
        except psycopg.Error as e:
            result[worker_of(c)] = e

    waiters = [threading.Thread(target=waiter, args=(c,)) for c in conns]
    for t in waiters:
        t.start()
    mark = b.log_mark()
    kill_master(b, old_trees)
    b.wait_log(r"master process went away", after=mark)
    assert result == {}, "the pause let a query through"
    b.start()
    b.wait_log(r"adopted while the pooler was paused: resuming", after=mark)
    for t in waiters:
        t.join(timeout=20)
    assert result == {0: (5,), 1: (5,)}
    with tcp(b) as fresh:
        assert fresh.execute("SELECT 6").fetchone() == (6,)


@pytest.mark.parametrize("mode", ["session", "transaction"])
def test_a_worker_that_dies_without_a_master_gives_its_pool_share_back(bouncer, old_trees, mode):  # noqa: F811
    """The master is dead; worker 0 holds the whole pool (3 servers in
    transactions) and worker 1's clients wait for one. Worker 0 is killed:
    no master reaps it, so nobody gave its units back and worker 1's
    clients waited until query_wait_timeout. Now the surviving orphan gives
    them back and its clients are served at once."""
    b = bouncer(ini_overrides={**TWO, "pool_mode": mode, "default_pool_size": 3, "query_wait_timeout": 30})
    wait_for(lambda: len(workers(b)) == 2, "two workers")
    holders = [conn_on(b, 0) for _ in range(3)]
    for h in holders:
        h.execute("BEGIN")
        h.execute("SELECT 1")
    waiters = [conn_on(b, 1) for _ in range(3)]
    pid0 = next(w["pid"] for w in workers(b) if w["worker"] == 0)
    mark = b.log_mark()
    kill_master(b, old_trees)
    b.wait_log(r"master process went away", after=mark)
    answers = [Background(lambda c=c: c.execute("SELECT 7").fetchone()) for c in waiters]
    os.kill(pid0, signal.SIGKILL)
    b.wait_log(rf"worker 0 \(pid {pid0}\) died while no master runs: its share of the pool limits goes back",
               after=mark)
    assert [a.result(10) for a in answers] == [(7,)] * 3
