"""The saturation signal (doc/workers.md, "The saturation signal"): a worker
starved of CPU by other processes reads as saturated, because the scaler
counts the time it waited in the kernel's run queue as well as its busy time."""

import os
import re
import subprocess
import sys
import time

import pytest

from conftest import pg_bindir, wait_for
from helpers import states, workers

# A worker pinned to one core that shares it with three CPU hogs gets about a
# quarter of it: busy stays under 0.4, below the up threshold of 0.5, while
# busy + wait reads 0.65-0.9 as long as clients (pinned to the other cores, with
# PostgreSQL left there by the kernel) keep it runnable. A hog on the other
# core too starves the clients instead of the worker, so there is none.
STARVED = {
    "min_workers": 1,
    "max_workers": 2,
    "worker_cpu_affinity": "cores",
    "worker_scale_interval": 0.5,
    "worker_scale_up_threshold": 0.5,
    "worker_scale_up_samples": 2,
    "worker_scale_down_threshold": 0.01,
    "worker_scale_down_samples": 128,
    "worker_scale_cooldown": 1,
    "log_connections": 0,
    "log_disconnections": 0,
}

HOG_SECONDS = 60  # each hog stops by itself after this, even if the test dies


def hog(cpu):
    """A busy loop pinned to one CPU, bounded in time; killed by the test when done."""
    code = ("import os, time\n"
            f"os.sched_setaffinity(0, {{{cpu}}})\n"
            f"end = time.monotonic() + {HOG_SECONDS}\n"
            "while time.monotonic() < end:\n"
            "    pass\n")
    return subprocess.Popen([sys.executable, "-c", code])


def physical_cores():
    """Distinct (package, core) pairs of the online CPUs, as the scaler counts them."""
    cores = set()
    for cpu in os.sched_getaffinity(0):
        top = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        try:
            with open(f"{top}/physical_package_id") as p, open(f"{top}/core_id") as c:
                cores.add((p.read().strip(), c.read().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return len(cores)


def pinned_cpu(pid):
    with open(f"/proc/{pid}/status") as f:
        allowed = next(l for l in f if l.startswith("Cpus_allowed_list:")).split(":")[1].strip()
    assert re.fullmatch(r"\d+", allowed), f"worker not pinned to one CPU: {allowed}"
    return int(allowed)


def load(b, seconds, cpus, clients=32):
    """pgbench (persistent connections, SELECT 1) through the pooler on the given CPUs, bounded in time."""
    script = b.dir / "select1.sql"
    b.run_as.write(script, "SELECT 1;\n")
    return subprocess.Popen(
        [str(pg_bindir() / "pgbench"), "-h", "127.0.0.1", "-p", str(b.port), "-U", "postgres", "-n",
         "-c", str(clients), "-j", "2", "-T", str(seconds), "-f", str(script), "postgres"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, cpus))


def stop(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait(timeout=30)


def test_starved_worker_scales_up(bouncer):
    """CPU hogs pinned to worker 0's core and a client load from the other cores: worker 1 is added."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or physical_cores() < 2:
        pytest.skip("needs two physical cores (the wait counts below the core count)")
    b = bouncer(ini_overrides=STARVED)
    w0 = workers(b)[0]
    cpu0 = pinned_cpu(w0["pid"])
    others = set(cpus) - {cpu0}
    mark = b.log_mark()
    procs = [hog(cpu0) for _ in range(3)]
    try:
        procs.append(load(b, 45, others))
        # SHOW WORKERS shows both parts: the starved worker waits for its CPU
        wait_for(lambda: float(workers(b)[0]["wait"]) > 0.1, "a run-queue wait on the starved worker", timeout=30)
        m = b.wait_log(r"scaling up to 2 workers: mean load (\d\.\d\d) > 0\.50 for 2 samples "
                       r"\(busy\+wait 0:(\d\.\d\d)\+(\d\.\d\d); idle CPUs (\d+\.\d\d)\)", timeout=45, after=mark)
        wait_for(lambda: states(b) == ["active", "active"], "a second active worker", timeout=15)
    finally:
        stop(procs)
    mean, busy, wait, idle = (float(x) for x in m.groups())
    # the decision counted the wait, as far as the other core had idle CPU for another worker
    # (doc/workers.md, "Adding a worker only into idle CPU"): a part of the load that crossed the threshold
    assert wait > 0 and idle > 0, m.group(0)
    # (each of the four is rounded to 0.01 on its own)
    assert abs(mean - min(1.0, busy + min(wait, idle))) <= 0.021, m.group(0)


def test_no_worker_added_without_idle_cpu(bouncer):
    """The starved worker of the test above, but the other core is full as
    well (a hog beside the clients and PostgreSQL): another worker would get
    no idle CPU, only take it from the database, so the scaler holds and says
    why (doc/workers.md, "Adding a worker only into idle CPU")."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) != 2 or physical_cores() != 2:
        pytest.skip("needs exactly two physical cores, both of them made busy by the test")
    b = bouncer(ini_overrides=STARVED)
    w0 = workers(b)[0]
    cpu0 = pinned_cpu(w0["pid"])
    (cpu1,) = set(cpus) - {cpu0}
    mark = b.log_mark()
    procs = [hog(cpu0) for _ in range(3)] + [hog(cpu1)]
    try:
        procs.append(load(b, 30, {cpu1}))
        wait_for(lambda: float(workers(b)[0]["wait"]) > 0.1, "a run-queue wait on the starved worker", timeout=30)

        def holds():
            with b.admin() as conn:
                cur = conn.execute("SHOW SCALER")
                names = [d.name for d in cur.description]
                row = dict(zip(names, cur.fetchone()))
            return row if "no idle CPU for another worker" in (row["last_reason"] or "") else None

        row = wait_for(holds, "the scaler to hold for want of idle CPU", timeout=30)
        assert re.fullmatch(r"no idle CPU for another worker \(idle 0\.\d\d of 2 CPUs\)", row["last_reason"]), row
        assert row["idle_cpus"] is not None and float(row["idle_cpus"]) < 0.5, row
        time.sleep(3)  # six more samples: it keeps holding
        assert states(b) == ["active"]
    finally:
        stop(procs)
    assert "scaling up" not in b.log_text()[mark:]
