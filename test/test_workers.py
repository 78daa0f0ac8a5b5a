"""Master and workers: scaling up under load and draining back, crash respawn,
warm start, SHOW WORKERS / SHOW SCALER (DESIGN.md §2-§4, §6)."""

import os
import re
import signal
import subprocess
import threading
import time

import psycopg
import pytest

from conftest import pg_bindir, wait_for
from helpers import console, row, rows, states, worker_of, workers

# Fast, low thresholds so a small loopback load moves the scaler.
SCALING = {
    "min_workers": 1,
    "max_workers": 2,
    "worker_scale_interval": 0.5,
    "worker_scale_up_threshold": 0.10,
    "worker_scale_up_samples": 2,
    "worker_scale_down_threshold": 0.03,
    "worker_scale_down_samples": 4,
    "worker_scale_cooldown": 1,
    "log_connections": 0,
    "log_disconnections": 0,
}



def scaler(b):
    with b.admin() as conn:
        cur = conn.execute("SHOW SCALER")
        names = [d.name for d in cur.description]
        return dict(zip(names, cur.fetchone()))



def churn(b, seconds, clients=8):
    """pgbench -C (a new connection per transaction), bounded in time."""
    script = b.dir / "select1.sql"
    b.run_as.write(script, "SELECT 1;\n")
    return subprocess.Popen(
        [str(pg_bindir() / "pgbench"), "-h", "127.0.0.1", "-p", str(b.port), "-U", "postgres", "-n", "-C",
         "-c", str(clients), "-j", "2", "-T", str(seconds), "-f", str(script), "postgres"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_show_workers_columns_and_idle_busy(bouncer):
    b = bouncer(ini_overrides={"min_workers": 1, "max_workers": 2})
    with b.admin() as conn:
        cur = conn.execute("SHOW WORKERS")
        assert [d.name for d in cur.description] == [
            "worker", "pid", "state", "busy", "busy_avg", "cl_active", "cl_waiting", "sv_active", "sv_idle",
            "accepted", "tls_handshakes", "xact_count", "query_count", "started", "uptime", "wait", "wait_avg",
            "moved_in", "moved_out", "not_movable", "move_failed", "listeners"]
        assert [d.type_code for d in cur.description] == [
            23, 23, 25, 1700, 1700, 23, 23, 23, 23, 20, 20, 20, 20, 25, 20, 1700, 1700, 20, 20, 23, 20, 25]
    # an idle pooler reads below 0.05 (wait for a couple of scaler samples first)
    time.sleep(2.5)
    rows = workers(b)
    assert len(rows) == 1
    w = rows[0]
    assert w["worker"] == 0 and w["state"] == "active"
    assert float(w["busy"]) < 0.05
    # its few wake-ups a second may each wait for a CPU on a busy machine (measured: up to 0.013
    # under a load average of 11 on 2 cores), but never add up to anything near a threshold
    assert float(w["wait"]) < 0.25
    children = [int(p) for p in os.popen(f"pgrep -P {b.pid}").read().split()]
    assert w["pid"] in children


def test_show_scaler_row(bouncer):
    b = bouncer(ini_overrides={"min_workers": 1, "max_workers": 2, "worker_scale_interval": 0.5})
    with b.admin() as conn:
        cur = conn.execute("SHOW SCALER")
        assert [d.name for d in cur.description] == [
            "current", "target", "min_workers", "max_workers", "last_decision", "last_reason", "last_change",
            "tcp_migrate_req", "cpus", "cpus_from", "idle_cpus", "throttled"]
        assert [d.type_code for d in cur.description] == [23, 23, 23, 23, 25, 25, 25, 23, 1700, 25, 1700, 1700]
        row = cur.fetchone()
    assert row[0] == 1 and row[2] == 1 and row[3] == 2
    # the CPU allowance, whatever limits this machine (test_cpu_allowance.py sets them)
    assert row[8] > 0 and row[9] in ("physical cores", "affinity", "cgroup cpuset", "cgroup quota")
    wait_for(lambda: scaler(b)["last_reason"].startswith("steady"), "a steady scaler sample")
    # after two samples the idle CPU of the allowance is known; no quota: nothing throttled
    s = wait_for(lambda: (lambda r: r if r["idle_cpus"] is not None else None)(scaler(b)), "idle_cpus known")
    assert 0 <= s["idle_cpus"] <= s["cpus"] + 1 and s["throttled"] == 0


def test_stats_user_can_read_show_workers(bouncer):
    b = bouncer(ini_overrides={"stats_users": "postgres", "auth_type": "trust"})
    with b.admin(user="postgres") as conn:
        assert len(conn.execute("SHOW WORKERS").fetchall()) == 1
        assert conn.execute("SHOW SCALER").fetchone() is not None


def test_scales_up_under_load_and_drains_back(bouncer):
    b = bouncer(ini_overrides=SCALING)
    load = churn(b, seconds=20)
    try:
        wait_for(lambda: states(b) == ["active", "active"], "a second active worker under load", timeout=25)
        # clients that stay connected keep a draining worker visible
        held = [b.connect() for _ in range(12)]
        for c in held:
            c.execute("SELECT 1")
        assert {worker_of(c) for c in held} == {0, 1}, "reuseport should spread clients over both workers"
    finally:
        load.terminate()
        load.wait(timeout=30)
    b.wait_log(r"scaling up to 2 workers: mean load \d\.\d\d > 0\.10 for 2 samples")

    wait_for(lambda: "draining" in states(b), "a draining worker once the load stopped", timeout=30)
    b.wait_log(r"scaling down to 1 workers: draining worker 1: load")
    # the clients on the draining worker still work
    for c in held:
        assert c.execute("SELECT 7").fetchone() == (7,)
    for c in held:
        c.close()
    wait_for(lambda: states(b) == ["active"], "back to one worker", timeout=30)
    b.wait_log(r"worker 1 \(pid \d+\) exited after draining")


def test_worker_crash_respawn_other_worker_unaffected(bouncer):
    b = bouncer(ini_overrides={"min_workers": 2, "max_workers": 2})
    wait_for(lambda: states(b) == ["active", "active"], "two workers")
    conns = []
    survivor = wait_for(lambda: next((c for c in [b.connect()] if worker_of(c) == 1), None),
                        "a client on worker 1")
    victim = next(w for w in workers(b) if w["worker"] == 0)

    errors, count = [], [0]
    stop = threading.Event()

    def run_queries():
        while not stop.is_set():
            try:
                assert survivor.execute("SELECT 1").fetchone() == (1,)
                count[0] += 1
            except Exception as e:  # any error is a failure of the test
                errors.append(e)
                return

    t = threading.Thread(target=run_queries)
    t.start()
    try:
        os.kill(victim["pid"], signal.SIGKILL)
        b.wait_log(rf"worker 0 \(pid {victim['pid']}\) was terminated by signal 9")
        wait_for(lambda: any(w["worker"] == 0 and w["pid"] != victim["pid"] and w["state"] == "active"
                             for w in workers(b)), "worker 0 respawned")
    finally:
        stop.set()
        t.join(timeout=30)
    assert errors == []
    assert count[0] > 0
    # new clients are served again by both workers
    for _ in range(5):
        with psycopg.connect(host="127.0.0.1", port=b.port, dbname="postgres", user="postgres") as c:
            assert c.execute("SELECT 2").fetchone() == (2,)
    del conns


def test_warm_start_restores_saved_count(bouncer):
    state = "workers.state"
    b = bouncer(ini_overrides={"min_workers": 2, "max_workers": 2})
    b.update(worker_state_file=str(b.dir / state))
    b.write_ini()
    b.send_signal(signal.SIGQUIT)
    b.wait_exit()
    b.proc = None
    b.start()
    wait_for(lambda: states(b) == ["active", "active"], "two workers")
    assert (b.dir / state).read_text() == "pgbouncer-workers 1\ncount 2\n"
    assert b.stop(signal.SIGTERM) == 0

    # restart allowing fewer: the saved count wins over min_workers
    b.update(min_workers=1)
    b.write_ini()
    b.proc = None
    b.start()
    b.wait_log(r"warm start: 2 workers \(saved 2 in .*workers\.state\)")
    wait_for(lambda: states(b) == ["active", "active"], "two workers after the restart")


def test_warm_start_corrupt_file_starts_min_workers(bouncer):
    b = bouncer(ini_overrides={"min_workers": 1, "max_workers": 2}, start=False)
    path = b.dir / "workers.state"
    b.run_as.write(path, "pgbouncer-workers 1\ncount two\n")
    b.update(worker_state_file=str(path))
    b.write_ini()
    b.start()
    b.wait_log(r"warm start: .*; starting 1 workers \(min_workers\)")
    assert states(b) == ["active"]


def test_warm_start_clamped_to_max(bouncer):
    b = bouncer(ini_overrides={"min_workers": 1, "max_workers": 1}, start=False)
    path = b.dir / "workers.state"
    b.run_as.write(path, "pgbouncer-workers 1\ncount 2\n")
    b.update(worker_state_file=str(path))
    b.write_ini()
    b.start()
    b.wait_log(r"warm start: 1 workers \(saved 2 in ")
    assert states(b) == ["active"]


def test_broken_reload_changes_nothing(bouncer):
    b = bouncer(ini_overrides={"min_workers": 1, "max_workers": 2, "default_pool_size": 20})
    b.update(default_pool_size=5, max_workers="two")
    b.write_ini()
    mark = b.log_mark()
    b.reload()
    b.wait_log(r"pgbouncer\.ini:\d+: invalid value \"two\" for parameter max_workers", after=mark)
    with b.admin() as conn:
        rows = dict((r[0], r[1]) for r in conn.execute("SHOW CONFIG").fetchall())
    assert rows["default_pool_size"] == "20"
    assert rows["max_workers"] == "2"


def test_sigterm_stops_every_worker(bouncer):
    b = bouncer(ini_overrides={"min_workers": 2, "max_workers": 2})
    wait_for(lambda: states(b) == ["active", "active"], "two workers")
    pids = [w["pid"] for w in workers(b)]
    assert b.stop(signal.SIGTERM) == 0
    for pid in pids:
        wait_for(lambda: not os.path.exists(f"/proc/{pid}"), f"worker {pid} to exit")


def test_show_workers_same_from_every_worker(bouncer):
    b = bouncer(ini_overrides={"min_workers": 2, "max_workers": 2})
    wait_for(lambda: states(b) == ["active", "active"], "two workers")
    answers, landed = set(), set()
    for _ in range(30):
        with b.admin() as conn:
            landed.add(worker_of(conn))
            rows = conn.execute("SHOW WORKERS").fetchall()
            answers.add(tuple((r[0], r[1], r[2]) for r in rows))
        if len(landed) == 2:
            break
    assert landed == {0, 1}, "console connections should land on both workers"
    assert len(answers) == 1


def test_cpu_affinity_cores(bouncer):
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    b = bouncer(ini_overrides={"min_workers": 2, "max_workers": 2, "worker_cpu_affinity": "cores"})
    wait_for(lambda: states(b) == ["active", "active"], "two workers")
    pinned = {}
    for w in workers(b):
        with open(f"/proc/{w['pid']}/status") as f:
            line = next(l for l in f if l.startswith("Cpus_allowed_list:"))
        pinned[w["worker"]] = line.split(":")[1].strip()
    assert len(set(pinned.values())) == 2, pinned
    assert all("-" not in v and "," not in v for v in pinned.values()), pinned
    # the master itself is not pinned
    with open(f"/proc/{b.pid}/status") as f:
        master = next(l for l in f if l.startswith("Cpus_allowed_list:")).split(":")[1].strip()
    assert master not in pinned.values()


def test_cancel_reaches_the_owner_worker(bouncer):
    """A CancelRequest lands on whichever worker the kernel picks; it must reach the query anyway."""
    b = bouncer(ini_overrides={"min_workers": 2, "max_workers": 2})
    wait_for(lambda: states(b) == ["active", "active"], "two workers")
    for owner in (0, 1):
        conn = wait_for(lambda: next((c for c in [b.connect(autocommit=True)] if worker_of(c) == owner), None),
                        f"a client on worker {owner}")
        for attempt in range(6):  # each cancel is a new connection: both workers receive some
            timer = threading.Timer(0.3, conn.cancel)
            timer.start()
            with pytest.raises(psycopg.errors.QueryCanceled) as exc:
                conn.execute("SELECT pg_sleep(20)")
            timer.join()
            assert exc.value.sqlstate == "57014"
        conn.close()


def test_drain_timeout_closes_remaining_clients(bouncer):
    """A reload that lowers max_workers drains a worker; worker_drain_timeout bounds the wait."""
    b = bouncer(ini_overrides={"min_workers": 2, "max_workers": 2, "worker_drain_timeout": 1})
    wait_for(lambda: states(b) == ["active", "active"], "two workers")
    held = wait_for(lambda: next((c for c in [b.connect(autocommit=True)] if worker_of(c) == 1), None),
                    "a client on worker 1")
    held.execute("BEGIN")  # inside a transaction block: it cannot move with its server
    held.execute("SELECT 1")
    b.update(min_workers=1, max_workers=1)
    b.write_ini()
    b.reload()
    b.wait_log(r"draining worker 1")
    b.wait_log(r"worker_drain_timeout reached, closing the remaining clients")
    with pytest.raises(psycopg.OperationalError) as exc:
        held.execute("SELECT 1")
    assert "server shutting down" in str(exc.value)
    wait_for(lambda: states(b) == ["active"], "one worker left")


# Worker settings that cannot work, with the message that names the setting and its range.
REFUSED = [
    ({"min_workers": 70}, "min_workers must be between 1 and 64 (got 70)"),
    ({"min_workers": 0}, "min_workers must be between 1 and 64 (got 0)"),
    ({"max_workers": -1}, "max_workers must be at least 0 (got -1)"),
    ({"min_workers": 3, "max_workers": 2}, r"min_workers must be between 1 and max_workers \(2\) \(got 3\)"),
    ({"worker_scale_up_samples": 129}, "worker_scale_up_samples must be between 1 and 128 (got 129)"),
    ({"worker_scale_down_samples": 200}, "worker_scale_down_samples must be between 1 and 128 (got 200)"),
    ({"worker_scale_up_threshold": 1.5}, "worker_scale_up_threshold must be above 0 and at most 1 (got 1.5)"),
    ({"worker_scale_down_threshold": 0.9},
     r"worker_scale_down_threshold must be above 0 and below worker_scale_up_threshold \(0.75\) \(got 0.9\)"),
    ({"worker_scale_interval": 0}, "worker_scale_interval must be above 0 and at most 2147483647 seconds (got 0)"),
    ({"worker_scale_up_samples": 0}, "worker_scale_up_samples must be between 1 and 128 (got 0)"),
    ({"worker_scale_up_threshold": 0}, "worker_scale_up_threshold must be above 0 and at most 1 (got 0)"),
    ({"worker_scale_down_threshold": 0}, "worker_scale_down_threshold must be above 0 and at most 1 (got 0)"),
]
REFUSED_IDS = ["-".join(f"{k}={v}" for k, v in s.items()) for s, _ in REFUSED]


def config_values(conn, keys):
    return {r["key"]: r["value"] for r in rows(conn, "SHOW CONFIG") if r["key"] in keys}


def literal(message):
    """A message as a regex: parentheses escaped unless the entry already did it."""
    return message if "\\(" in message else re.escape(message)


@pytest.mark.parametrize("settings,message", REFUSED, ids=REFUSED_IDS)
def test_out_of_range_worker_setting_refused_at_start(bouncer, settings, message):
    """The master exits with the reason instead of starting (min_workers = 70 used to crash it)."""
    b = bouncer(ini_overrides={"max_workers": 2, **settings}, start=False)
    b.start(wait=False)
    assert b.wait_exit() == 1
    log = b.log_text()
    assert re.search(r"pgbouncer\.ini: " + literal(message) + "$", log, re.MULTILINE), log
    assert "FATAL cannot load config file" in log
    assert "worker 0 started" not in log


@pytest.mark.parametrize("settings,message", [REFUSED[0], REFUSED[5], REFUSED[7]],
                         ids=[REFUSED_IDS[0], REFUSED_IDS[5], REFUSED_IDS[7]])
def test_out_of_range_worker_setting_refused_on_reload(bouncer, settings, message):
    b = bouncer(ini_overrides={"min_workers": 1, "max_workers": 2})
    before = config_values(console(b), settings)
    b.update(**settings)
    b.write_ini()
    mark = b.log_mark()
    b.reload()
    b.wait_log(r"pgbouncer\.ini: " + literal(message) + "$", after=mark)
    b.wait_log(r"config file loading failed; keeping the running configuration", after=mark)
    assert config_values(console(b), settings) == before
    assert states(b) == ["active"]


@pytest.mark.parametrize("key,value,message", [
    ("min_workers", "70", "min_workers must be between 1 and 64 (got 70)"),
    ("worker_scale_up_samples", "200", "worker_scale_up_samples must be between 1 and 128 (got 200)"),
    ("worker_scale_down_threshold", "0.8",
     "worker_scale_down_threshold must be above 0 and below worker_scale_up_threshold (0.75) (got 0.8)"),
])
def test_out_of_range_worker_setting_refused_by_set(bouncer, key, value, message):
    """Refused on every worker: the console passes SET on to the other one."""
    b = bouncer(ini_overrides={"min_workers": 2, "max_workers": 2})
    wait_for(lambda: states(b) == ["active", "active"], "two workers")
    conn = console(b)
    before = row(conn, "SHOW CONFIG", key=key)["value"]
    seen = []
    conn.add_notice_handler(lambda d: seen.append(d.message_primary))
    with pytest.raises(psycopg.Error) as info:
        conn.execute(f"SET {key} = '{value}'")
    assert (info.value.diag.severity, info.value.diag.message_primary) == ("ERROR", "SET failed")
    assert message in seen
    assert row(conn, "SHOW CONFIG", key=key)["value"] == before
    b.wait_log(re.escape(message))
    # a value in range is still taken
    conn.execute(f"SET {key} = '{before}'")


def test_max_workers_above_the_worker_table_clamped_and_logged_once(bouncer):
    b = bouncer(ini_overrides={"min_workers": 1, "max_workers": 100})
    note = "max_workers = 100 clamped to 64, the size of the worker table"
    b.wait_log(re.escape(note))
    assert scaler(b)["max_workers"] == 64
    # a reload that keeps the setting does not say it again (RELOAD answers once the master has reloaded)
    console(b).execute("RELOAD")
    assert b.log_text().count(note) == 1
    assert scaler(b)["max_workers"] == 64


def test_min_workers_above_the_cores_logged(bouncer):
    b = bouncer(ini_overrides={"min_workers": 1, "max_workers": 0})
    cores = scaler(b)["max_workers"]
    b.update(min_workers=cores + 1)
    b.write_ini()
    mark = b.log_mark()
    b.reload()
    b.wait_log(re.escape(f"max_workers = 0 ({cores} physical cores) raised to min_workers ({cores + 1})"),
               after=mark)
    wait_for(lambda: len(states(b)) == cores + 1, f"{cores + 1} workers")
    assert scaler(b)["max_workers"] == cores + 1


def test_min_workers_above_the_cores_with_explicit_max_logged(bouncer):
    """min_workers above the physical cores (max_workers set too) is run as asked, and said so once."""
    b = bouncer(ini_overrides={"min_workers": 1, "max_workers": 0})
    cores = scaler(b)["max_workers"]
    if cores >= 64:
        pytest.skip("needs fewer than 64 physical cores")
    b.update(min_workers=cores + 1, max_workers=cores + 1)
    b.write_ini()
    mark = b.log_mark()
    b.reload()
    note = f"min_workers = {cores + 1} is above the {cores} physical cores; running at least {cores + 1} workers anyway"
    b.wait_log(re.escape(note), after=mark)
    wait_for(lambda: len(states(b)) == cores + 1, f"{cores + 1} workers")
    console(b).execute("RELOAD")
    assert b.log_text().count(note) == 1


def test_warm_start_above_max_workers_clamped(bouncer):
    """A saved count above max_workers (and above the worker table) is clamped, not replaced by min_workers."""
    b = bouncer(ini_overrides={"min_workers": 1, "max_workers": 2}, start=False)
    path = b.dir / "workers.state"
    b.run_as.write(path, "pgbouncer-workers 1\ncount 100\n")
    b.update(worker_state_file=str(path))
    b.write_ini()
    b.start()
    b.wait_log(r"warm start: 2 workers \(saved 100 in .*workers\.state, clamped to \[min_workers 1, max_workers 2\]\)")
    wait_for(lambda: states(b) == ["active", "active"], "two workers")


def test_warm_start_file_not_regular_is_ignored(bouncer):
    """A worker_state_file that is a FIFO (or another non-regular file) is
    not opened for reading as one: open() of a FIFO waits for a writer, and
    the master would hang at start before it forks any worker."""
    b = bouncer(ini_overrides={"min_workers": 1, "max_workers": 2}, start=False)
    path = b.dir / "workers.state"
    os.mkfifo(path)
    b.run_as.own(path)
    b.update(worker_state_file=str(path))
    b.write_ini()
    b.start()
    b.wait_log(r"warm start: .*not a regular file.*; starting 1 workers \(min_workers\)")
    assert states(b) == ["active"]


def test_warm_start_stale_temporary_file_not_regular(bouncer):
    """What is left at worker_state_file's temporary name (PATH.tmp) is
    replaced, whatever it is: a FIFO there would make open() for writing wait
    for a reader, and the master hang at its first save of the count."""
    b = bouncer(ini_overrides={"min_workers": 1, "max_workers": 2}, start=False)
    path = b.dir / "workers.state"
    os.mkfifo(str(path) + ".tmp")
    b.run_as.own(str(path) + ".tmp")
    b.update(worker_state_file=str(path))
    b.write_ini()
    b.start()
    assert states(b) == ["active"]
    wait_for(lambda: path.exists() and path.read_text() == "pgbouncer-workers 1\ncount 1\n", "the count saved")
    assert not os.path.exists(str(path) + ".tmp")


def test_warm_start_file_set_on_reload_is_written(bouncer):
    """worker_state_file set by a RELOAD while two workers run: the count is
    saved then, not at the next scaling decision (which may never come), so
    that a restart finds two."""
    b = bouncer(ini_overrides={"min_workers": 2, "max_workers": 2})
    wait_for(lambda: states(b) == ["active", "active"], "two workers")
    path = b.dir / "workers.state"
    b.update(worker_state_file=str(path), min_workers=1)
    b.write_ini()
    b.reload()
    wait_for(lambda: path.exists() and path.read_text() == "pgbouncer-workers 1\ncount 2\n", "the count saved")
    assert b.stop(signal.SIGTERM) == 0
    b.proc = None
    b.start()
    b.wait_log(r"warm start: 2 workers \(saved 2 in .*workers\.state\)")
