"""Online restart, `pgbouncer -R` (doc/workers.md "Upgrading"): the new
master takes the running one's listening sockets over its control socket,
starts its workers on them, and the old workers stop accepting and finish
their clients before the old tree exits."""

import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from conftest import parent_pid, pg_bindir, pid_alive, record_kills, stop_pooler, wait_for
from helpers import (assert_cancels, Background, BusyTransactions, conn_on, pool_row, preload_shim, rows,
                     scram_salt, two_workers, workers)
from test_auth_query import apg, setup  # noqa: F401 (fixtures)

QUIET = {"log_connections": 0, "log_disconnections": 0}
TWO = {**QUIET, "min_workers": 2, "max_workers": 2}


@pytest.fixture
def old_trees(request):
    """Old masters that a test replaced, (pid, process group): stopped at
    teardown as the harness stops a pooler (record_kills() names what it killed)."""
    trees = []
    yield trees
    killed = []
    for pid, pgid in trees:
        killed += stop_pooler(pid if pid_alive(pid) else None, pgid)
    if killed:
        record_kills(request.node.nodeid, [f"old tree: {what}" for what in killed])


def upgrade(b, old_trees, args=()):
    """`pgbouncer -R [ARGS] INI` on b's ini, which becomes b's process; returns
    the old master's pid and its workers' pids."""
    old_pid = b.pid
    old_workers = [w["pid"] for w in workers(b)]
    old_trees.append((old_pid, os.getpgid(old_pid)))
    mark = b.log_mark()
    b.proc = None
    if "-d" in args:
        # the pidfile names the old master until the new one replaces it
        b.start(["-R", *args], wait=False)
        assert b.proc.wait(timeout=30) == 0, b.describe()
        b._pid = wait_for(lambda: (p := b._read_pidfile()) != old_pid and p, "the new pid in the pidfile")
        b._pgid = os.getpgid(b._pid)
        b.wait_log(r"process up", after=mark)
    else:
        b.start(["-R", *args])  # waits for the new master's `process up`
    assert b.pid != old_pid
    b.wait_log(rf"online restart: pid {b.pid} took over; not accepting any more", after=mark)
    return old_pid, old_workers


def cancels_in_a_block(c, times):
    """assert_cancels() for a session client inside a transaction block: each cancel is undone with
    ROLLBACK TO SAVEPOINT, so the block (which keeps the client where it is) goes on."""
    import psycopg
    for _ in range(times):
        c.execute("SAVEPOINT before_sleep")
        timer = threading.Timer(0.3, c.cancel)
        timer.start()
        with pytest.raises(psycopg.errors.QueryCanceled) as exc:
            c.execute("SELECT pg_sleep(20)")
        timer.join()
        assert exc.value.sqlstate == "57014"
        c.execute("ROLLBACK TO SAVEPOINT before_sleep")
    assert c.execute("SELECT 1").fetchone() == (1,)


def local_port(conn):
    """The client's own port: SHOW CLIENTS's `port` of its connection."""
    with socket.socket(fileno=os.dup(conn.fileno())) as s:
        return s.getsockname()[1]


def serving_tree(b):
    """The pids of the workers that answer SHOW WORKERS: all children of b's master."""
    pids = [w["pid"] for w in workers(b)]
    assert pids and all(parent_pid(p) == b.pid for p in pids), (pids, b.pid)
    return pids


def pgbench(b, seconds, clients, connect_each=False):
    script = b.dir / "select1.sql"
    b.run_as.write(script, "SELECT 1;\n")
    return subprocess.Popen(
        [str(pg_bindir() / "pgbench"), "-h", "127.0.0.1", "-p", str(b.port), "-U", "postgres", "-n",
         *(["-C"] if connect_each else []), "-c", str(clients), "-j", "2", "-T", str(seconds), "-f",
         str(script), "postgres"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def assert_clean_run(load):
    out, _ = load.communicate(timeout=90)
    assert load.returncode == 0, out
    assert "number of failed transactions: 0 " in out, out
    assert "aborted" not in out and "error" not in out.lower(), out
    return int(out.split("number of transactions actually processed: ")[1].split()[0])


def xacts(b):
    return sum(w["xact_count"] for w in workers(b))


def test_reboot_with_nothing_running_starts_normally(bouncer):
    b = bouncer(ini_overrides=QUIET, args=["-R"])
    b.wait_log(r"old process not found, try to continue normally")
    assert b.connect().execute("SELECT 1").fetchone() == (1,)


def test_reboot_next_to_a_pooler_without_control_socket_fails_cleanly(bouncer, run_pgbouncer):
    """A pooler that has no control socket (a build from before -R worked) cannot be taken over:
    -R then starts as without it and stops at the live unix socket, leaving the running one alone."""
    b = bouncer(ini_overrides=QUIET)
    (b.dir / f"pgbouncer-workers.{b.port}" / "master").unlink()
    mark = b.log_mark()
    run = run_pgbouncer(["-R", b.ini_path])
    assert run.rc == 1
    log = b.log_text()[mark:]
    assert "old process not found, try to continue normally" in log
    assert "unix socket is in use, cannot continue" in log
    assert b.alive() and int(b.pidfile.read_text()) == b.pid
    with b.connect() as tcp, b.connect(host=str(b.dir)) as unix:
        assert tcp.execute("SELECT 7").fetchone() == (7,)
        assert unix.execute("SELECT 8").fetchone() == (8,)


@pytest.mark.parametrize("mode", ["session", "transaction"])
def test_upgrade_under_steady_load(bouncer, old_trees, mode):
    b = bouncer(ini_overrides={**TWO, "pool_mode": mode})
    two_workers(b)
    load = pgbench(b, seconds=10, clients=4)
    try:
        wait_for(lambda: xacts(b) > 100, "the load to run on the old tree")
        old_pid, old_workers = upgrade(b, old_trees)
        # the new tree has taken every socket: a new client lands on it
        assert not set(serving_tree(b)) & set(old_workers)
        assert b.connect().execute("SELECT 2").fetchone() == (2,)
    finally:
        done = assert_clean_run(load)
    assert done > 100
    # pgbench's connections were the old tree's last clients
    wait_for(lambda: not pid_alive(old_pid), "the old master to exit once its clients left")
    assert not any(pid_alive(p) for p in old_workers)
    assert int(b.pidfile.read_text()) == b.pid
    assert len(serving_tree(b)) == 2


def test_upgrade_under_connection_churn(bouncer, old_trees):
    b = bouncer(ini_overrides=TWO)
    two_workers(b)
    load = pgbench(b, seconds=12, clients=6, connect_each=True)
    try:
        # twice in a row: the second new master takes over from the first
        for _ in range(2):
            wait_for(lambda: xacts(b) > 50, "the load to run on the current tree")
            old_pid, old_workers = upgrade(b, old_trees)
            # every new connection goes to the new tree, so the old one runs out of clients
            wait_for(lambda: not pid_alive(old_pid), "the old master to exit", timeout=30)
            assert not any(pid_alive(p) for p in old_workers)
        wait_for(lambda: xacts(b) > 50, "the load to run on the new tree")
    finally:
        assert_clean_run(load)
    serving_tree(b)
    assert "could not accept" not in b.log_text()


def test_persistent_client_finishes_on_old_tree(bouncer, old_trees):
    b = bouncer(ini_overrides=TWO)
    two_workers(b)
    held = b.connect(autocommit=True)
    held.execute("SET application_name = 'kept'")
    held.execute("BEGIN")  # inside a transaction block, a session client cannot move with its server
    old_pid, old_workers = upgrade(b, old_trees)
    # the old tree stays for its client, which notices nothing
    assert held.execute("SHOW application_name").fetchone() == ("kept",)
    assert pid_alive(old_pid)
    held.close()
    wait_for(lambda: not pid_alive(old_pid), "the old master to exit after its last client")
    # what the old tree left behind is the new one's: the unix socket, the pidfile, the
    # workers' private sockets (the console reaches both new workers through them)
    with b.connect(host=str(b.dir)) as unix_client:
        assert unix_client.execute("SELECT 3").fetchone() == (3,)
    assert int(b.pidfile.read_text()) == b.pid
    conn_on(b, 0)
    conn_on(b, 1)
    with b.admin() as admin:
        clients = [r for r in rows(admin, "SHOW CLIENTS") if r["database"] == "postgres"]
    assert len(clients) == 2, clients


def test_failed_new_master_leaves_old_tree_serving(bouncer, old_trees):
    b = bouncer(ini_overrides=TWO)
    old_proc = b.proc
    old_trees.append((b.pid, os.getpgid(b.pid)))
    # the new master fails after it has taken the sockets: its TLS files are missing
    b.update(client_tls_sslmode="require", client_tls_key_file=str(b.dir / "missing.key"),
             client_tls_cert_file=str(b.dir / "missing.crt"))
    b.write_ini()
    mark = b.log_mark()
    b.proc = None
    b.start(["-R"], wait=False)
    assert b.proc.wait(timeout=30) == 1
    b.wait_log(r"TLS setup failed", after=mark)
    # the old master notices the failure after the new one has exited: wait on the old one
    b.proc = old_proc
    b.wait_log(r"online restart by pid \d+ abandoned; carrying on", after=mark)
    # the old tree serves on as before, on TCP and on its unix socket (the failed one left it alone)
    with b.connect() as tcp, b.connect(host=str(b.dir)) as unix:
        assert tcp.execute("SELECT 5").fetchone() == (5,)
        assert unix.execute("SELECT 6").fetchone() == (6,)
    assert int(b.pidfile.read_text()) == b.pid
    # and a good new master can still replace it
    b.update(client_tls_sslmode=None, client_tls_key_file=None, client_tls_cert_file=None)
    b.write_ini()
    old_pid, _ = upgrade(b, old_trees)
    wait_for(lambda: not pid_alive(old_pid), "the old master to exit")


@pytest.mark.parametrize("how", ["SIGUSR1", "PAUSE", "PAUSE postgres", "SUSPEND"])
def test_reboot_refused_while_paused(bouncer, old_trees, run_pgbouncer, how):
    """-R while the pooler is paused is refused, as PgBouncer's: the clients waiting in the old
    tree could not move (nothing moves from a paused worker) and, once the new tree had the
    sockets, no console could resume them; they waited until query_wait_timeout. The old tree
    serves on, a RESUME lets them through, and -R works then."""
    b = bouncer(ini_overrides={**TWO, "pool_mode": "transaction", "max_prepared_statements": 10})
    two_workers(b)
    clients = [b.connect(autocommit=True, prepare_threshold=0) for _ in range(4)]
    for c in clients:
        c.execute("SELECT %s::int", (1,))
    admin = b.admin(prepare_threshold=None)
    mark = b.log_mark()
    if how == "SIGUSR1":
        b.send_signal(signal.SIGUSR1)
        b.wait_log(r"got SIGUSR1, pausing all activity", after=mark)
    else:
        admin.execute(how)
    waiting = [Background(lambda c=c: c.execute("SELECT %s::int + 1", (5,)).fetchone())
               for c in clients] if how != "SUSPEND" else []
    run = run_pgbouncer(["-R", b.ini_path])
    assert run.rc == 1, run
    why = {"SUSPEND": r"the pooler is suspended \(SUSPEND\)",
           "PAUSE postgres": r"database postgres is paused \(PAUSE postgres\)"}.get(
        how, r"the pooler is paused \(PAUSE\)")
    b.wait_log(rf"online restart refused: {why}; RESUME first", after=mark)
    assert "refused the hand-over" in run.stderr
    assert int(b.pidfile.read_text()) == b.pid
    assert b.alive()
    admin.execute("RESUME postgres" if how == "PAUSE postgres" else "RESUME")
    for w in waiting:
        assert w.result(timeout=20) == (6,)
    admin.close()  # a console connection would keep the old tree
    old_pid, _ = upgrade(b, old_trees)
    wait_for(lambda: not pid_alive(old_pid), "the old tree to exit once its clients have moved")
    for c in clients:
        assert c.execute("SELECT %s::int * 2", (4,)).fetchone() == (8,)


def test_pool_limits_count_the_old_tree(bouncer, old_trees):
    """While the old tree finishes, its server connections count against the new tree's limits,
    and it gives back those its remaining clients cannot use."""
    b = bouncer(ini_overrides={**QUIET, "min_workers": 1, "max_workers": 1, "default_pool_size": 2,
                               "pool_mode": "session"})
    held = [b.connect(autocommit=True) for _ in range(2)]
    for c in held:
        c.execute("BEGIN")  # each holds a server for its session, inside a block: they stay
        c.execute("SELECT 1")
    old_pid, _ = upgrade(b, old_trees)
    answer = []
    waiter = threading.Thread(
        target=lambda: answer.append(b.connect(autocommit=True).execute("SELECT 42").fetchone()))
    waiter.start()
    try:
        # the pool's 2 servers are the old tree's: the new tree's client waits instead of opening a third
        wait_for(lambda: (pool_row(b) or {}).get("cl_waiting") == 1, "the new tree's client to wait for room")
        p = pool_row(b)
        assert p["sv_active"] + p["sv_idle"] + p["sv_login"] == 0, p
        assert pid_alive(old_pid)
        # one old client leaves: the old tree, which takes no new clients, closes the server it
        # freed at once, and the new tree's client gets that room while the other old client stays
        held[0].close()
        waiter.join(timeout=60)
        assert answer == [(42,)]
        assert held[1].execute("SELECT 43").fetchone() == (43,)
        assert pid_alive(old_pid)
    finally:
        for c in held:
            c.close()
        waiter.join(timeout=60)
    wait_for(lambda: not pid_alive(old_pid), "the old master to exit with its last client")


def test_new_workers_share_the_room_the_old_tree_leaves(bouncer, old_trees):
    """The old tree's servers count against the new tree's limits, and the new workers share what
    is left between them: an idle server of one new worker goes to the other one's waiting client
    (doc/workers.md "Limits span all workers"), as it would without the old tree. It stayed with
    its worker, the limit counted as not reached, and the client got query_wait_timeout."""
    b = bouncer(ini_overrides={**TWO, "pool_mode": "transaction", "default_pool_size": 3,
                               "query_wait_timeout": 8})
    two_workers(b)
    held = b.connect()
    held.execute("SELECT 1")  # inside a transaction: stays on the old tree with its server
    old_pid, _ = upgrade(b, old_trees)
    idle = conn_on(b, 1)
    assert idle.execute("SELECT 1").fetchone() == (1,)  # worker 1's server, idle from now on
    busy = conn_on(b, 0)
    busy.execute("BEGIN")
    busy.execute("SELECT 2")  # worker 0's server: the 2 the old tree leaves are taken
    waiter = conn_on(b, 0)
    answer = Background(lambda: waiter.execute("SELECT 3").fetchone())
    assert answer.result(timeout=20) == (3,)
    assert pid_alive(old_pid)
    busy.execute("COMMIT")
    held.commit()
    wait_for(lambda: not pid_alive(old_pid), "the old tree to exit once its client has moved")


def backlogs(port):
    """The backlog (ss's Send-Q) of every socket listening on TCP `port`."""
    out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    return sorted(int(line.split()[2]) for line in out.splitlines())


def test_new_settings_apply_to_taken_sockets(bouncer, old_trees):
    """The file is read afresh: a changed listen_backlog applies to the sockets taken over."""
    b = bouncer(ini_overrides={**TWO, "listen_backlog": 128})
    two_workers(b)
    assert backlogs(b.port) == [128, 128]
    b.update(listen_backlog=77)
    b.write_ini()
    old_pid, _ = upgrade(b, old_trees)
    wait_for(lambda: not pid_alive(old_pid), "the old master to exit")
    assert backlogs(b.port) == [77, 77]


def test_scram_salts_stay_across_upgrade(bouncer, old_trees, monkeypatch):
    """The salts of a plain-text password user and of an unknown user are derived from a key the
    new tree gets from the old one: a client sees the same salts before and after."""
    b = bouncer(ini_overrides={**QUIET, "auth_type": "scram-sha-256"},
                users_txt='"postgres" "pw one"\n"pgbouncer" "pw one"\n')
    monkeypatch.setenv("PGPASSWORD", "pw one")  # for the console upgrade() reads
    before = {u: scram_salt(b, u) for u in ("postgres", "nobody_here")}
    upgrade(b, old_trees)
    assert {u: scram_salt(b, u) for u in ("postgres", "nobody_here")} == before


def test_upgrade_daemon_twice(bouncer, old_trees):
    b = bouncer(ini_overrides={**QUIET, "min_workers": 1, "max_workers": 2}, args=["-d"])
    first = b.pid
    old_pid, _ = upgrade(b, old_trees, args=["-d"])
    assert old_pid == first
    wait_for(lambda: not pid_alive(first), "the first master to exit (no clients)")
    # the new master took the control socket over as well: it can be replaced in turn
    second = b.pid
    upgrade(b, old_trees, args=["-d"])
    wait_for(lambda: not pid_alive(second), "the second master to exit")
    with b.connect() as client:
        assert client.execute("SELECT 4").fetchone() == (4,)
    assert int(b.pidfile.read_text()) == b.pid
    serving_tree(b)
    # a normal stop of the last one still cleans up
    b.stop(signal.SIGTERM)
    assert not b.pidfile.exists()


def test_upgrade_without_unix_socket(bouncer, old_trees):
    """Without unix_socket_dir the control socket lives in /tmp/pgbouncer-workers.<port>."""
    b = bouncer(ini_overrides={**QUIET, "unix_socket_dir": ""})
    old_pid, _ = upgrade(b, old_trees)
    wait_for(lambda: not pid_alive(old_pid), "the old master to exit")
    with b.connect() as client:
        assert client.execute("SELECT 9").fetchone() == (9,)
    serving_tree(b)


def test_upgrade_keeps_serving_metrics(bouncer, old_trees):
    """metrics_listen: the new master binds the port while the old one still
    holds it (SO_REUSEPORT), so -R does not stop at "cannot listen"; after
    the old tree is gone /metrics comes from the new master."""
    from conftest import free_port
    from test_metrics import scrape, value
    mport = free_port()
    b = bouncer(ini_overrides={**QUIET, "metrics_listen": f"127.0.0.1:{mport}"})
    assert value(scrape(mport)[0], "pgbouncer_up") == 1
    old_pid, _ = upgrade(b, old_trees)
    wait_for(lambda: not pid_alive(old_pid), "the old master to exit")
    assert "cannot listen" not in b.log_text()
    samples, _, _ = scrape(mport)
    assert value(samples, "pgbouncer_up") == 1


@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_upgrade_hands_persistent_clients_over(bouncer, old_trees, mode):
    """Persistent clients between transactions (session mode: not holding a server yet) move to the
    new tree's workers with their state: the old tree exits while they are still connected, and
    they carry on with prepared statements, TimeZone and cancel keys intact."""
    import psycopg
    n = 20
    b = bouncer(ini_overrides={**TWO, "pool_mode": mode, "default_pool_size": 30})
    two_workers(b)
    for _ in range(2 * n):  # the old tree's ids run ahead of the count of its clients
        b.connect().close()
    clients = [b.connect(autocommit=True) for _ in range(n)]
    if mode == "transaction":
        for i, c in enumerate(clients):
            c.execute("SET TimeZone = 'Asia/Tokyo'")
            res = c.pgconn.prepare(b"up_stmt", b"SELECT $1::int + %d" % i)
            assert res.status == psycopg.pq.ExecStatus.COMMAND_OK
            c.execute("SELECT %s::int * 2", (i,), prepare=True)
    mark = b.log_mark()
    old_pid, old_workers = upgrade(b, old_trees)
    wait_for(lambda: not pid_alive(old_pid), "the old master to exit while its clients stay connected")
    log = b.log_text()[mark:]
    assert "handed" in log and "clients to the new process" in log, log
    assert "could not take a client" not in log and "could not move" not in log, log
    new_workers = serving_tree(b)
    assert not set(new_workers) & set(old_workers)
    with b.admin() as admin:
        held = [r for r in rows(admin, "SHOW CLIENTS") if r["database"] == "postgres"]
    assert len(held) == n, held
    # the new tree's own clients never take a handed-over client's id: KILL_CLIENT hits one client
    fresh = [b.connect(autocommit=True) for _ in range(n)]
    victim = clients.pop()
    with b.admin() as admin:
        ids = [r["id"] for r in rows(admin, "SHOW CLIENTS")]
        assert len(ids) == len(set(ids)), sorted(ids)
        # the column is an int4: a driver reading it into 32 bits gets every id
        server_ids = [r["id"] for r in rows(admin, "SHOW SERVERS")]
        assert all(1 <= i <= 2**31 - 1 for i in ids + server_ids), sorted(ids + server_ids)
        vid = next(r["id"] for r in held if r["port"] == local_port(victim))
        admin.execute(f"KILL_CLIENT {vid}")
    with pytest.raises(psycopg.OperationalError, match="admin forced disconnect"):
        victim.execute("SELECT 1")
    for f in fresh:
        assert f.execute("SELECT 1").fetchone() == (1,)
        f.close()
    for i, c in enumerate(clients):
        assert c.execute("SELECT %s::int", (i,)).fetchone() == (i,)
        if mode == "transaction":
            res = c.pgconn.exec_prepared(b"up_stmt", [b"100"])
            assert res.status == psycopg.pq.ExecStatus.TUPLES_OK, res.error_message
            assert res.get_value(0, 0) == str(100 + i).encode()
            assert c.execute("SELECT %s::int * 2", (i,), prepare=True).fetchone() == (2 * i,)
            assert c.execute("SHOW TimeZone").fetchone() == ("Asia/Tokyo",)
    # its cancel key was made by the old tree; the request lands on either new worker
    c = clients[0]
    assert_cancels(c)
    for c in clients:
        c.close()


@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_new_worker_killed_in_the_grace_period_still_gets_the_old_clients(bouncer, old_trees, mode):
    """-R, then kill -9 of one of the new tree's workers during the grace period, before the old
    workers hand their clients over: the new master gives the hand-over socket that worker read to
    another of its workers, the old tree's persistent clients move there and the old tree exits.
    Before, the old worker met a closed socket (`the new process's worker no longer takes clients
    (Broken pipe): the rest finish here`), and the old tree ran for as long as its clients stayed."""
    b = bouncer(ini_overrides={**TWO, "pool_mode": mode})
    two_workers(b)
    clients = [conn_on(b, w) for w in (0, 1) for _ in range(3)]
    for c in clients:
        c.execute("SET application_name = 'kept'")
    old_pid = b.pid
    old_trees.append((old_pid, os.getpgid(old_pid)))
    mark = b.log_mark()
    b.proc = None
    b.start(["-R"])  # up: the old tree serves on for its grace period
    b.wait_log(r"online restart: \d+ of pid \d+'s 2 workers will hand their clients to this process", after=mark)
    new_workers = subprocess.run(["pgrep", "-P", str(b.pid)], capture_output=True, text=True).stdout.split()
    assert len(new_workers) == 2, new_workers
    assert "not accepting any more" not in b.log_text()[mark:]
    os.kill(int(new_workers[1]), signal.SIGKILL)
    wait_for(lambda: not pid_alive(old_pid), "the old master to exit once its clients moved")
    log = b.log_text()[mark:]
    assert "no longer takes clients" not in log, log
    assert "takes on the clients of the old tree's worker" in log, log
    for c in clients:
        assert c.execute("SHOW application_name").fetchone() == ("kept",)
        c.close()


def test_ids_stay_int4_and_apart_across_upgrades(bouncer, old_trees):
    """SHOW's `id` is an int4: through three online restarts in a row (each new tree's ids start
    2^30 above the old tree's, so the third goes round the int4 range) every id a client or server
    shows stays within it, no two connections share one, and KILL_CLIENT with the id of a client
    handed over three times closes that client and no other."""
    import psycopg
    b = bouncer(ini_overrides={**TWO, "pool_mode": "transaction"})
    two_workers(b)
    kept = b.connect(autocommit=True)
    assert kept.execute("SELECT 1").fetchone() == (1,)
    others = []
    for round_ in range(3):
        old_pid, _ = upgrade(b, old_trees)
        wait_for(lambda: not pid_alive(old_pid), "the old master to exit once its clients moved")
        others.append(b.connect(autocommit=True))
        assert others[-1].execute("SELECT %s::int", (round_,)).fetchone() == (round_,)
        assert kept.execute("SELECT %s::int", (round_,)).fetchone() == (round_,)
        with b.admin() as admin:
            ids = [r["id"] for r in rows(admin, "SHOW CLIENTS")] + [r["id"] for r in rows(admin, "SHOW SERVERS")]
        assert all(1 <= i <= 2**31 - 1 for i in ids), (round_, sorted(ids))
        assert len(ids) == len(set(ids)), (round_, sorted(ids))
    with b.admin() as admin:
        mine = [r["id"] for r in rows(admin, "SHOW CLIENTS") if r["port"] == local_port(kept)]
        assert len(mine) == 1, mine
        admin.execute(f"KILL_CLIENT {mine[0]}")
    with pytest.raises(psycopg.OperationalError, match="admin forced disconnect"):
        kept.execute("SELECT 1")
    for i, c in enumerate(others):
        assert c.execute("SELECT %s::int", (i,)).fetchone() == (i,)
        c.close()


def test_new_login_after_moved_sessions_gets_a_server_of_the_full_pool(bouncer, old_trees):
    """Session mode, the pool full with three sessions that -R moves with their servers. On the new
    tree no server has logged in, so a new login waits for its pool's first welcome; when one of the
    moved sessions ends its server is idle there, and it gives way to a fresh login: the new client
    is served at once, not after client_login_timeout (it waited 8 s for it before)."""
    b = bouncer(ini_overrides={**QUIET, "min_workers": 1, "max_workers": 1, "pool_mode": "session",
                               "default_pool_size": 3, "client_login_timeout": 8})
    held = [b.connect(autocommit=True) for _ in range(3)]
    for c in held:
        assert c.execute("SELECT 1").fetchone() == (1,)
    old_pid, _ = upgrade(b, old_trees)
    wait_for(lambda: not pid_alive(old_pid), "the old tree to exit once its sessions moved")
    held[0].close()
    wait_for(lambda: pool_row(b)["sv_idle"] == 1, "the ended session's server idle on the new tree")
    started = time.monotonic()
    with b.connect(connect_timeout=20, autocommit=True) as c:
        assert c.execute("SELECT 7").fetchone() == (7,)
    assert time.monotonic() - started < 5
    for c in held[1:]:
        assert c.execute("SELECT 2").fetchone() == (2,)
        c.close()


def test_moved_servers_of_a_changed_database_are_not_reused(bouncer, old_trees, pg):
    """-R with the database's entry changed (another dbname): a session moved with its server ends,
    and the new tree does not lend that server, still connected to the old database, to anyone: it
    closes when released, as after a RELOAD."""
    b = bouncer(ini_overrides={**QUIET, "min_workers": 1, "max_workers": 1, "pool_mode": "session",
                               "default_pool_size": 2}, databases={"app": pg.connstr("postgres")})
    a = b.connect(dbname="app", autocommit=True)
    assert a.execute("SELECT current_database()").fetchone() == ("postgres",)
    b.databases["app"] = pg.connstr("template1")
    b.write_ini()
    old_pid, _ = upgrade(b, old_trees)
    wait_for(lambda: not pid_alive(old_pid), "the old tree to exit once the session moved")
    assert a.execute("SELECT current_database()").fetchone() == ("postgres",)  # its session goes on
    a.close()
    clients = [b.connect(dbname="app", autocommit=True) for _ in range(2)]
    assert [c.execute("SELECT current_database()").fetchone()[0] for c in clients] == ["template1"] * 2
    for c in clients:
        c.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGQUIT], ids=["TERM", "INT", "QUIT"])
def test_old_master_stopped_in_its_grace_period_leaves_the_new_trees_files(bouncer, old_trees, sig):
    """-R, then the old master is told to stop within its grace period (a script that stops the old pid,
    or systemd, which names it until it retires): it exits without removing the unix socket file, the
    pidfile or the private sockets, which are the new master's since the hand-over."""
    import psycopg
    b = bouncer(ini_overrides=TWO)
    two_workers(b)
    old_proc = b.proc
    old_pid, _ = upgrade(b, old_trees)
    b.wait_log(r"keeps serving for its grace period")
    os.kill(old_pid, sig)
    old_proc.wait(timeout=30)
    sock = b.dir / f".s.PGSQL.{b.port}"
    assert sock.exists() and b._read_pidfile() == b.pid
    with psycopg.connect(host=str(b.dir), port=b.port, dbname="postgres", user="postgres",
                         connect_timeout=5) as c:
        assert c.execute("SELECT 1").fetchone() == (1,)
    with b.admin() as admin:  # the console fans out through the private sockets
        assert len(rows(admin, "SHOW WORKERS")) == 2


def test_reboot_with_the_pidfile_on_a_full_file_system(bouncer, old_trees):
    """The pidfile's file system is full when `pgbouncer -R` runs: the new master cannot write its
    pidfile. Both trees serve at that moment, so it says so (ERROR) and carries on, with the old
    pidfile removed rather than left naming a process that retires; the clients move without an
    error. Before, the new master exited with FATAL, and the old one, resuming, hit the same FATAL:
    nothing served. Needs root for the small tmpfs."""
    from test_orphans import clients_on_both_workers, errors_over
    b = bouncer(ini_overrides=TWO, start=False)
    run = b.dir / "run"
    run.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=1777", "tmpfs", str(run)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        b.pidfile = run / "pgbouncer.pid"
        b.update(pidfile=str(b.pidfile))
        b.write_ini()
        b.start()
        two_workers(b)
        conns = clients_on_both_workers(b, 4)
        subprocess.run(["dd", "if=/dev/zero", f"of={run}/fill", "bs=4k"], capture_output=True)
        old_pid, _ = upgrade(b, old_trees)
        assert "could not write pidfile" in b.log_text()
        wait_for(lambda: not pid_alive(old_pid), "the old master to retire and exit")
        assert errors_over(conns, 2) == []
        assert not b.pidfile.exists()
        with b.connect() as c:
            assert c.execute("SELECT 3").fetchone() == (3,)
        for c in conns:
            c.close()
    finally:
        b.stop()
        subprocess.run(["umount", "-l", str(run)])

PREV_BIN = os.environ.get("PGBOUNCER_PREV_BIN")


@pytest.mark.skipif(not PREV_BIN, reason="set PGBOUNCER_PREV_BIN to a build of the previous client state format")
def test_upgrade_from_the_previous_binary_moves_clients_with_their_state(bouncer, old_trees, pg, pgbouncer_bin):
    """-R from a binary that packs clients in the previous format (doc/architecture.md, "The handover
    codec"): idle clients move with their prepared statements, TimeZone and cancel key, a unix-socket
    client too, clients waiting for a server with their request, and the old tree exits."""
    import psycopg
    from pgwire import PgWire, data_row, query_message
    b = bouncer(ini_overrides={**TWO, "pool_mode": "transaction", "default_pool_size": 20}, binary=PREV_BIN,
                databases={"postgres": pg.connstr("postgres"), "waitdb": pg.connstr("postgres") + " pool_size=1"})
    two_workers(b)
    clients = [b.connect(autocommit=True) for _ in range(10)]
    clients.append(b.connect(host=str(b.dir), autocommit=True))
    for i, c in enumerate(clients):
        c.execute("SET TimeZone = 'Asia/Tokyo'")
        assert c.pgconn.prepare(b"prev_stmt", b"SELECT $1::int + %d" % i).status == psycopg.pq.ExecStatus.COMMAND_OK
        c.execute("SELECT %s::int * 2", (i,), prepare=True)
    waiting = []
    for i in range(4):
        w = PgWire(b.port)
        w.login(database="waitdb")  # before the pool is held: a login may need a server too
        waiting.append(w)
    holder = b.connect(dbname="waitdb")
    holder.execute("SELECT 1")  # waitdb's one server stays in this transaction: the next requests wait
    for i, w in enumerate(waiting):
        w.send(query_message(f"SELECT {i} + 1000"))
    wait_for(lambda: pool_row(b, "waitdb", "postgres")["cl_waiting"] == 4, "four clients waiting")
    mark = b.log_mark()
    b.binary = pgbouncer_bin
    old_pid, old_workers = upgrade(b, old_trees)
    log = b.log_text()[mark:]
    assert "cannot hand its clients over" not in log, log
    assert "workers will hand their clients to this process" in log, log
    holder.commit()  # the holder moves too, and the old tree gives its server back
    wait_for(lambda: not pid_alive(old_pid), "the old master to exit while its clients stay connected")
    log = b.log_text()[mark:]
    assert "could not take a client" not in log and "could not move" not in log, log
    with b.admin() as admin:
        held = [r for r in rows(admin, "SHOW CLIENTS") if r["database"] in ("postgres", "waitdb")]
    assert len(held) == len(clients) + 1 + len(waiting), held
    assert not set(serving_tree(b)) & set(old_workers)
    for i, w in enumerate(waiting):
        msgs = w.read_until(b"Z")
        assert [data_row(body) for t, body in msgs if t == b"D"] == [[str(i + 1000)]]
        w.close()
    for i, c in enumerate(clients):
        res = c.pgconn.exec_prepared(b"prev_stmt", [b"100"])
        assert res.status == psycopg.pq.ExecStatus.TUPLES_OK, res.error_message
        assert res.get_value(0, 0) == str(100 + i).encode()
        assert c.execute("SELECT %s::int * 2", (i,), prepare=True).fetchone() == (2 * i,)
        assert c.execute("SHOW TimeZone").fetchone() == ("Asia/Tokyo",)
    assert_cancels(clients[0])
    assert_cancels(clients[-1])  # the unix-socket client


def test_second_upgrade_does_not_wait_for_the_first_tree(bouncer, old_trees):
    """A client that cannot move (session mode, holding its server inside a transaction block) keeps
    the first tree; the second tree, whose workers were taking the first one's clients, still exits
    at the next -R. Once it has, the newest master still passes the client's cancel requests to the
    first tree (the second handed its connection to the first over at its own -R), also after a
    third -R."""
    b = bouncer(ini_overrides={**TWO, "pool_mode": "session"})
    two_workers(b)
    held = b.connect(autocommit=True)
    held.execute("SET application_name = 'kept'")
    held.execute("BEGIN")
    first, _ = upgrade(b, old_trees)
    second, _ = upgrade(b, old_trees)
    wait_for(lambda: not pid_alive(second), "the second tree to exit")
    assert pid_alive(first)
    assert held.execute("SHOW application_name").fetchone() == ("kept",)
    cancels_in_a_block(held, times=2)
    third, _ = upgrade(b, old_trees)
    wait_for(lambda: not pid_alive(third), "the third tree to exit")
    cancels_in_a_block(held, times=2)
    held.close()
    wait_for(lambda: not pid_alive(first), "the first tree to exit after its last client")
    assert b.connect().execute("SELECT 5").fetchone() == (5,)


def test_client_in_a_transaction_moves_once_it_ends(bouncer, old_trees):
    """A client inside a transaction at the hand-over stays on the old tree until it commits, then
    moves to the new tree (the old worker offers its clients again at each tick) and the old tree exits."""
    b = bouncer(ini_overrides={**TWO, "pool_mode": "transaction"})
    two_workers(b)
    busy = b.connect()  # not autocommit: the first query opens a transaction
    busy.execute("CREATE TEMP TABLE up_t (v int)")
    busy.execute("INSERT INTO up_t VALUES (41)")
    old_pid, _ = upgrade(b, old_trees)
    mark = b.log_mark()
    busy.execute("UPDATE up_t SET v = v + 1")
    assert pid_alive(old_pid)  # the transaction holds the client (and its server) there
    assert busy.execute("SELECT v FROM up_t").fetchone() == (42,)
    busy.commit()
    wait_for(lambda: not pid_alive(old_pid), "the old tree to exit once the client has moved")
    assert "handed 1 clients to the new process" in b.log_text()[mark:]
    assert busy.execute("SELECT 9").fetchone() == (9,)
    busy.commit()
    with b.admin() as admin:
        held = [r for r in rows(admin, "SHOW CLIENTS") if r["database"] == "postgres"]
    assert len(held) == 1, held
    busy.close()


def test_busy_client_moves_between_two_transactions(bouncer, old_trees):
    """A client that runs one transaction after another is between two of
    them only for an instant, which a check at each tick (0.1 s) almost
    never sees: it must move all the same (at the end of one of its
    transactions), so that the old tree and its servers go while the client
    keeps working."""
    b = bouncer(ini_overrides={**TWO, "pool_mode": "transaction"})
    two_workers(b)
    conn = b.connect(autocommit=True)
    busy = BusyTransactions([conn], seconds=30)
    try:
        old_pid, _ = upgrade(b, old_trees)
        wait_for(lambda: not pid_alive(old_pid), "the old tree to exit while the client loops", timeout=10)
    finally:
        busy.stop()
    assert conn.execute("SELECT 7").fetchone() == (7,)


@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_cancel_reaches_a_client_left_on_the_old_tree(bouncer, old_trees, mode):
    """A client that stays on the old tree (inside a transaction, or holding its server in session
    mode) sends its cancel request on a new connection, which a new worker accepts: the new master
    passes it to the old one, whose worker cancels the query (doc/workers.md "Upgrading")."""
    import psycopg
    b = bouncer(ini_overrides={**TWO, "pool_mode": mode})
    two_workers(b)
    busy = b.connect(autocommit=mode == "session")
    if mode == "session":
        busy.execute("BEGIN")  # a session client in a block stays with its server
    busy.execute("SELECT 1")  # transaction mode: opens the transaction; session: takes a server
    other = b.connect(autocommit=True)
    old_pid, _ = upgrade(b, old_trees)
    outcome = {}

    def run():
        try:
            busy.execute("SELECT pg_sleep(30)")
            outcome["result"] = "finished"
        except psycopg.Error as e:
            outcome["result"] = e

    sleeper = threading.Thread(target=run)
    sleeper.start()
    try:
        with b.connect(autocommit=True) as watcher:
            wait_for(lambda: watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)' AND state = 'active'"
            ).fetchone() == (1,), "the query to run on the old tree's server")
        assert pid_alive(old_pid)
        busy.cancel()
        sleeper.join(timeout=20)
        assert not sleeper.is_alive(), "the cancel request did not reach the old tree's client"
    finally:
        sleeper.join()
    assert isinstance(outcome["result"], psycopg.errors.QueryCanceled), outcome
    assert outcome["result"].sqlstate == "57014"
    # nothing else was disturbed: the client carries on, so does one moved to the new tree
    if mode == "transaction":
        busy.rollback()
    else:
        busy.execute("ROLLBACK")
    assert busy.execute("SELECT 7").fetchone() == (7,)
    assert other.execute("SELECT 8").fetchone() == (8,)
    busy.close()
    other.close()
    wait_for(lambda: not pid_alive(old_pid), "the old tree to exit after its last client")


def test_handed_over_auth_query_secret_is_looked_up_again(bouncer, old_trees, apg, setup, monkeypatch):
    """A user in [users] but not in the auth_file, found through auth_query
    (SCRAM pass-through to the server): its clients go to the new tree with
    their secret. There it stays an auth_query secret: after ALTER ROLE ...
    PASSWORD the old password no longer logs in, the new one does."""
    from psycopg import sql as pgsql
    import psycopg
    from test_auth_query import APPDB, start_with_users_entry
    monkeypatch.setenv("PGPASSWORD", "pgbouncer")  # the console's password, for the helpers
    role = "authq_up_users"
    apg.create_role(role, password="old pw")
    try:
        b, _ = start_with_users_entry(bouncer, apg, setup, role, {**TWO, "pool_mode": "transaction"})
        two_workers(b)
        clients = [b.connect(dbname=APPDB, user=role, password="old pw", autocommit=True) for _ in range(6)]
        for c in clients:
            assert c.execute("SELECT current_user").fetchone() == (role,)
        old_pid, _ = upgrade(b, old_trees)
        wait_for(lambda: not pid_alive(old_pid), "the old master to exit while its clients stay connected")
        for c in clients:  # the new tree logs in to PostgreSQL for them with the keys they brought
            assert c.execute("SELECT current_user").fetchone() == (role,)
        apg.sql(pgsql.SQL("ALTER ROLE {} PASSWORD 'new pw'").format(pgsql.Identifier(role)))
        for _ in range(6):  # both new workers
            with pytest.raises(psycopg.OperationalError, match="SASL authentication failed"):
                b.connect(dbname=APPDB, user=role, password="old pw", autocommit=True)
            with b.connect(dbname=APPDB, user=role, password="new pw", autocommit=True) as c:
                assert c.execute("SELECT current_user").fetchone() == (role,)
    finally:
        apg.sql(pgsql.SQL("DROP ROLE IF EXISTS {}").format(pgsql.Identifier(role)))


def test_upgrade_finds_the_fallback_private_directory(bouncer, old_trees, run_as, session_dir):
    """unix_socket_dir is world-writable and another user holds the private
    directory's usual name: the pooler works from a directory with a random
    suffix, and `-R` finds the running tree there (not `unix socket is in use`)."""
    shared = session_dir / f"shared-{os.getpid()}-{threading.get_ident()}"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # like /tmp
    b = bouncer(ini_overrides={**QUIET, "unix_socket_dir": str(shared)}, start=False)
    taken = shared / f"pgbouncer-workers.{b.port}"
    taken.mkdir()  # root's, not the pooler user's
    b.start()
    b.wait_log(r"is not a directory of this user .*: using .*pgbouncer-workers\.\d+\.\w{6} instead")
    with b.connect() as c:
        c.execute("SELECT 1")
    old_pid, _ = upgrade(b, old_trees)
    assert "unix socket is in use" not in b.log_text()
    b.wait_log(r"online restart: the running process uses the private directory .*pgbouncer-workers\.\d+\.\w{6}")
    wait_for(lambda: not pid_alive(old_pid), "the old master to exit")
    with b.connect() as c, b.connect(host=str(shared)) as unix:
        assert c.execute("SELECT 2").fetchone() == (2,)
        assert unix.execute("SELECT 3").fetchone() == (3,)
    serving_tree(b)


class Writer:
    """Commits numbered rows through the pooler, one per transaction, reconnecting after an error;
    `committed` holds the ids whose COMMIT succeeded."""

    def __init__(self, b, pg, table):
        pg.sql(f"CREATE TABLE {table} (id int PRIMARY KEY)")
        self.b, self.table = b, table
        self.committed, self.errors = [], 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self):
        import psycopg
        n, conn = 0, None
        while not self.stop.is_set():
            try:
                if conn is None:
                    conn = psycopg.connect(host="127.0.0.1", port=self.b.port, dbname="postgres",
                                           user="postgres", autocommit=True, connect_timeout=5)
                n += 1
                conn.execute(f"INSERT INTO {self.table} VALUES (%s)", [n])
                self.committed.append(n)
            except Exception:
                self.errors += 1
                if conn is not None:
                    conn.close()
                conn = None
                self.stop.wait(0.05)
        if conn is not None:
            conn.close()

    def finish(self, pg):
        self.stop.set()
        self.thread.join(timeout=30)
        stored = {r[0] for r in pg.sql(f"SELECT id FROM {self.table}")}
        lost = [i for i in self.committed if i not in stored]
        assert lost == [], f"{len(lost)} committed rows lost"
        assert self.committed, "the writer committed nothing"
        return len(self.committed)


@pytest.mark.parametrize("when", ["early", "after_handover", "in_grace"])
def test_new_master_killed_during_upgrade_leaves_a_serving_pooler(bouncer, old_trees, pg, when):
    """The new master of `-R` is killed (kill -9) as soon as it asks for the
    sockets, right after the old one confirmed the hand-over, or during the
    grace period:
    the old tree still serves, the pidfile names it again, nothing
    committed is lost, and a later `-R` works."""
    b = bouncer(ini_overrides={**TWO, "pool_mode": "transaction"})
    writer = Writer(b, pg, f"upgrade_kill_{when}")
    old_proc, old_pid = b.proc, b.pid
    old_trees.append((old_pid, os.getpgid(old_pid)))
    wait_for(lambda: len(writer.committed) > 20, "the writer to commit")
    mark = b.log_mark()
    b.proc = None
    b.start(["-R"], wait=False)
    new = b.proc
    old_trees.append((new.pid, new.pid))
    if when == "early":
        b.wait_log(r"online restart: pid \d+ asks for the listening sockets", after=mark)
    else:
        b.wait_log(r"online restart: pid \d+ stopped accepting and finishes its clients", after=mark)
        if when == "in_grace":
            b.wait_log(r"process up", after=mark)
            threading.Event().wait(1.5)
    os.kill(new.pid, signal.SIGKILL)
    new.wait(timeout=30)
    b.proc, b._pgid = old_proc, os.getpgid(old_pid)
    if when == "early":
        # the kill lands before or after the commit, as it happens: either way the old tree carries on
        b.wait_log(rf"(online restart by pid {new.pid} abandoned; carrying on|online restart: pid {new.pid} went "
                   r"away \d+\.\d s after taking over)", after=mark)
    else:
        b.wait_log(rf"online restart: pid {new.pid} went away \d+\.\d s after taking over, within the grace "
                   r"period \(\d+ s\): this process carries on", after=mark)
    assert "not accepting any more" not in b.log_text()[mark:]
    wait_for(lambda: b._read_pidfile() == old_pid, "the pidfile to name the old master again")
    before = len(writer.committed)
    wait_for(lambda: len(writer.committed) > before + 20, "the writer to commit on the old tree")
    for _ in range(10):
        with b.connect(connect_timeout=5) as c:
            assert c.execute("SELECT 1").fetchone() == (1,)
    writer.finish(pg)
    # the old master listens for -R again
    upgrade(b, old_trees)
    wait_for(lambda: not pid_alive(old_pid), "the old master to exit")


# epoll_wait() fails (EBADF) in the process whose pid the flag file holds: libevent's loop returns
# -1 there, and the pooler exits through fatal("event loop failed"), as at any fatal() of a master
FAIL_LOOP = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <unistd.h>

int epoll_wait(int epfd, struct epoll_event *ev, int n, int timeout)
{
	const char *flag = getenv("PGB_TEST_FAIL_LOOP");
	int fd = flag ? open(flag, O_RDONLY | O_CLOEXEC) : -1;
	if (fd >= 0) {
		char buf[32] = {0};
		ssize_t got = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (got > 0 && atoi(buf) == (int)getpid()) {
			errno = EBADF;
			return -1;
		}
	}
	int (*real)(int, struct epoll_event *, int, int) = dlsym(RTLD_NEXT, "epoll_wait");
	return real(epfd, ev, n, timeout);
}
"""


def test_new_master_fatal_in_grace_leaves_the_old_trees_files(bouncer, old_trees, session_dir, tmp_path):
    """The new master of `-R` exits through fatal() within its grace period: the old master carries
    on, and the unix socket file and the private directory (the console's fan-out, the next -R) are
    still there for it; before, the new master's exit removed them, and the old tree served on
    TCP only, unreachable to a later -R."""
    import psycopg
    flag = session_dir / f"failloop-{os.getpid()}-{tmp_path.name}.flag"
    shim, so = preload_shim(session_dir, tmp_path, "failloop", FAIL_LOOP, PGB_TEST_FAIL_LOOP=str(flag))
    b = bouncer(ini_overrides=TWO)
    two_workers(b)
    old_proc, old_pid = b.proc, b.pid
    old_trees.append((old_pid, os.getpgid(old_pid)))
    mark = b.log_mark()
    b.proc = None
    b.env = {**b.env, **shim}
    try:
        b.start(["-R"])
        new = b.proc
        old_trees.append((new.pid, new.pid))
        b.wait_log(rf"online restart: pid {new.pid} took over; this process keeps serving", after=mark)
        flag.write_text(str(new.pid))
        new.wait(timeout=30)
        b.wait_log(r"event loop failed", after=mark)
        b.proc, b._pid, b._pgid = old_proc, old_pid, os.getpgid(old_pid)
        b.wait_log(rf"online restart: pid {new.pid} went away \d+\.\d s after taking over, within the grace "
                   r"period \(\d+ s\): this process carries on", after=mark)
    finally:
        b.env = {k: v for k, v in b.env.items() if k not in shim}
        flag.unlink(missing_ok=True)
        so.unlink(missing_ok=True)
    wait_for(lambda: b._read_pidfile() == old_pid, "the pidfile to name the old master again")
    assert (b.dir / f".s.PGSQL.{b.port}").exists()
    with psycopg.connect(host=str(b.dir), port=b.port, dbname="postgres", user="postgres",
                         connect_timeout=5) as c:
        assert c.execute("SELECT 1").fetchone() == (1,)
    with b.admin() as admin:  # the console fans out through the private sockets
        assert len(rows(admin, "SHOW WORKERS")) == 2
    upgrade(b, old_trees)  # the old master's control socket is still there
    wait_for(lambda: not pid_alive(old_pid), "the old master to exit")


def test_reboot_while_the_old_master_is_being_killed(bouncer, old_trees):
    """`-R` right after the running master was killed: its pidfile names a
    process that is dying (not reaped yet here); `-R` starts a new pooler
    instead of failing with `pidfile exists`."""
    b = bouncer(ini_overrides=QUIET)
    old = b.proc
    old_trees.append((old.pid, os.getpgid(old.pid)))
    mark = b.log_mark()
    os.kill(old.pid, signal.SIGKILL)
    b.proc = None
    b.start(["-R"])
    old.wait(timeout=30)
    assert "another instance running" not in b.log_text()[mark:]
    assert b._read_pidfile() == b.pid
    for _ in range(5):
        with b.connect(connect_timeout=5) as c:
            assert c.execute("SELECT 1").fetchone() == (1,)


def test_upgrade_moves_session_clients_with_their_servers(bouncer, old_trees, pg):
    """Session clients holding servers with sessions of their own: `-R` hands each to the new tree with
    its server, so the old tree exits promptly, and every session (its backend, SET values, temporary
    table, LISTEN, advisory lock, prepared statement) goes on in the new binary."""
    from test_session_moves import assert_sessions_intact, open_sessions
    b = bouncer(ini_overrides={**TWO, "pool_mode": "session", "default_pool_size": 30})
    two_workers(b)
    sessions = open_sessions(b, 20)
    mark = b.log_mark()
    old_pid, old_workers = upgrade(b, old_trees)
    wait_for(lambda: not pid_alive(old_pid), "the old master to exit while its sessions stay connected")
    log = b.log_text()[mark:]
    assert "could not take a client" not in log and "could not move" not in log, log
    new_workers = serving_tree(b)
    assert not set(new_workers) & set(old_workers)
    assert_sessions_intact(sessions)
    pids = {r[0] for r in pg.sql("SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'sess%'")}
    assert pids == {pid for _, pid in sessions}
    with b.admin() as admin:
        servers = [r for r in rows(admin, "SHOW SERVERS") if r["database"] == "postgres"]
    assert {r["remote_pid"] for r in servers} >= {pid for _, pid in sessions}


def test_foreground_reboot_as_a_supervisor_runs_it(bouncer, old_trees):
    """A supervisor runs the pooler in the foreground (no -d, logging to stderr) and replaces it with
    `pgbouncer --reboot --quiet CONFIG`, a new foreground process, while 5 session clients sleep in
    pg_sleep(2). The old process exits once its clients are handed over, the new one serves them all,
    five times in a row (issue #31, point 1)."""
    b = bouncer(ini_overrides={**QUIET, "pool_mode": "session", "min_workers": 1, "max_workers": 1})
    clients = [b.connect(autocommit=True) for _ in range(5)]
    pids = [c.execute("SELECT pg_backend_pid()").fetchone()[0] for c in clients]
    for _ in range(5):
        results, threads = [], []
        for c in clients:
            t = threading.Thread(target=lambda c=c: results.append(c.execute("SELECT pg_sleep(2), 7").fetchone()))
            t.start()
            threads.append(t)
        with b.connect(autocommit=True) as watcher:
            wait_for(lambda: watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE query LIKE "
                                             "'SELECT pg_sleep(2)%' AND state = 'active'").fetchone() == (5,),
                     "the 5 clients to sleep")
        old_proc = b.proc
        old_pid, _ = upgrade(b, old_trees, args=["--quiet"])
        for t in threads:
            t.join(timeout=30)
        assert results == [("", 7)] * 5 or [r[1] for r in results] == [7] * 5, results
        old_proc.wait(timeout=30)  # the old foreground process exits by itself
        assert old_proc.returncode == 0
        for c, pid in zip(clients, pids):
            assert c.execute("SELECT pg_backend_pid()").fetchone()[0] == pid  # same session, new process
        serving_tree(b)


def test_reboot_keeps_a_scram_client_whose_server_was_retired(bouncer, old_trees, apg, monkeypatch):
    """Transaction mode, a client logged in with SCRAM whose secret in auth_file is a SCRAM verifier (the
    pooler logs in to PostgreSQL with the keys of the client's login), server_lifetime = 3: 4 s later
    its server is past its lifetime; after -R the same client's next query succeeds: the new tree logs
    in to PostgreSQL for it with the keys the client brought (issue #31, point 1)."""
    from test_auth_query import APPDB, SCRAM_PW, SCRAM_ROLE
    (verifier,) = apg.sql("SELECT rolpassword FROM pg_authid WHERE rolname = %s", [SCRAM_ROLE])[0]
    b = bouncer(ini_overrides={**QUIET, "pool_mode": "transaction", "auth_type": "scram-sha-256",
                               "server_lifetime": 3},
                databases={APPDB: apg.connstr(APPDB)},
                users_txt=f'"{SCRAM_ROLE}" "{verifier}"\n"pgbouncer" "pgbouncer"\n')
    monkeypatch.setenv("PGPASSWORD", "pgbouncer")  # the console's logins (the helpers' SHOW WORKERS)
    c = b.connect(dbname=APPDB, user=SCRAM_ROLE, password=SCRAM_PW, autocommit=True)
    assert c.execute("SELECT current_user").fetchone() == (SCRAM_ROLE,)
    threading.Event().wait(4)
    upgrade(b, old_trees)
    assert c.execute("SELECT 2").fetchone() == (2,)


def test_upgrade_metrics_during_the_overlap(bouncer, old_trees):
    """While the old tree finishes a client after -R, every scrape is answered
    by the new master: the old one's workers drain and its console has no
    active worker to ask, so a scrape it took would say pgbouncer_up 0."""
    from conftest import free_port
    from test_metrics import scrape, value
    mport = free_port()
    b = bouncer(ini_overrides={**QUIET, "metrics_listen": f"127.0.0.1:{mport}"})
    held = b.connect()
    held.execute("BEGIN")  # in a transaction: it stays on the old tree
    try:
        old_pid, _ = upgrade(b, old_trees)
        assert pid_alive(old_pid)
        ups = [value(scrape(mport)[0], "pgbouncer_up") for _ in range(30)]
        assert pid_alive(old_pid)
        assert ups == [1] * 30, ups
    finally:
        held.close()
    wait_for(lambda: not pid_alive(old_pid), "the old master to exit")
