"""The CPU allowance (doc/workers.md, "The CPU allowance"): what
max_workers = 0 means in a cgroup cpuset of one CPU, under a CFS quota and
under taskset, as SHOW SCALER, the log and /metrics show it, and that a
RELOAD reads it again. The cgroup tests need root and writable cgroup v1
hierarchies (cpu, cpuset) and skip with the reason elsewhere; the unit
tests (test/unit/test_cpu_allowance.c) cover cgroup v2 and the parsing."""

import itertools
import os
import re
import shutil
import subprocess
import time
import urllib.request
from decimal import Decimal
from pathlib import Path

import pytest

from conftest import DEADLINE, free_port, pg_bindir, wait_for
from helpers import console, states, workers

# thresholds a small loopback login storm crosses at once (as test_workers.py's SCALING)
STORM_SCALING = {
    "min_workers": 1,
    "max_workers": 0,
    "worker_scale_interval": 0.5,
    "worker_scale_up_threshold": 0.10,
    "worker_scale_up_samples": 2,
    "worker_scale_down_threshold": 0.03,
    "worker_scale_down_samples": 4,
    "worker_scale_cooldown": 1,
    "log_connections": 0,
    "log_disconnections": 0,
}

_names = itertools.count()


def scaler(b):
    with b.admin() as conn:
        cur = conn.execute("SHOW SCALER")
        return dict(zip([d.name for d in cur.description], cur.fetchone()))


def v1_hierarchy(controller):
    """(mount point, our cgroup in it) of the cgroup v1 hierarchy with `controller`, or a skip."""
    ours = None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            ours = path
    if ours is None:
        pytest.skip(f"no cgroup v1 {controller} hierarchy here (/proc/self/cgroup has no {controller} line)")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, (fstype, _source, options) = left.split(), right.split()[:3]
        if fstype == "cgroup" and controller in options.split(",") and ours.startswith(fields[3]):
            return Path(fields[4]), ours[len(fields[3].rstrip("/")):]
    pytest.skip(f"the cgroup v1 {controller} hierarchy is not mounted here")


class Cgroup:
    """A child of our own cgroup in one v1 hierarchy, removed at the end of the test."""

    def __init__(self, controller):
        mount, ours = v1_hierarchy(controller)
        self.parent = mount / ours.lstrip("/")
        self.path = self.parent / f"pgbtest-{os.getpid()}-{next(_names)}"
        try:
            self.path.mkdir()
        except OSError as e:
            pytest.skip(f"cannot make a {controller} cgroup under {self.parent}: {e}")

    def read(self, name, parent=False):
        return ((self.parent if parent else self.path) / name).read_text().strip()

    def write(self, name, value):
        (self.path / name).write_text(f"{value}\n")

    def tasks(self):
        return [int(p) for p in self.read("tasks").split()]

    def remove(self):
        """Waits for the processes to leave (the pooler is stopped by then), moves stragglers to the parent."""
        try:
            wait_for(lambda: not self.tasks(), f"the processes in {self.path} to exit", timeout=DEADLINE)
        except AssertionError:
            for pid in self.tasks():
                try:
                    (self.parent / "tasks").write_text(f"{pid}\n")
                except OSError:
                    pass  # it exited meanwhile
        wait_for(lambda: self._rmdir(), f"{self.path} to be removed", timeout=10)

    def _rmdir(self):
        try:
            self.path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            return False


@pytest.fixture
def cgroups(run_as):
    """Factory of cgroups; list it before `bouncer` so that the pooler has stopped when they are removed."""
    if not run_as.root:
        pytest.skip("making cgroups needs root")
    made = []

    def make(controller):
        cg = Cgroup(controller)
        made.append(cg)
        return cg

    yield make
    for cg in reversed(made):
        cg.remove()


def started_in(run_as, cgs):
    """A Bouncer wrapper that puts pgbouncer into the cgroups and drops privileges, then execs it."""
    moves = "".join(f"echo $$ > {cg.path / 'tasks'} && " for cg in cgs)
    probe = subprocess.run(["sh", "-c", moves + "true"], capture_output=True, text=True, timeout=DEADLINE)
    if probe.returncode != 0:
        pytest.skip(f"cannot move a process into {', '.join(str(cg.path) for cg in cgs)}: {probe.stderr.strip()}")
    return ["sh", "-c", f'{moves}exec setpriv --reuid={run_as.uid} --regid={run_as.gid} --clear-groups "$@"', "sh"]


def churn(b, seconds, clients=8):
    """A login storm: pgbench -C (a new connection per transaction), bounded in time."""
    script = b.dir / "select1.sql"
    b.run_as.write(script, "SELECT 1;\n")
    return subprocess.Popen(
        [str(pg_bindir() / "pgbench"), "-h", "127.0.0.1", "-p", str(b.port), "-U", "postgres", "-n", "-C",
         "-c", str(clients), "-j", "2", "-T", str(seconds), "-f", str(script), "postgres"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_one_cpu_cpuset_one_worker_under_a_login_storm(cgroups, bouncer, run_as):
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs: a cpuset of one would not be narrower than the machine")
    cpu = allowed[-1]  # not CPU 0: the workers must be pinned inside the cpuset, not to the machine's first core
    cg = cgroups("cpuset")
    cg.write("cpuset.cpus", cpu)
    cg.write("cpuset.mems", re.split(r"[-,]", cg.read("cpuset.mems", parent=True))[0])
    b = bouncer(ini_overrides={**STORM_SCALING, "worker_cpu_affinity": "cores"}, wrapper=started_in(run_as, [cg]))
    assert b.pid in cg.tasks()

    s = scaler(b)
    assert s["max_workers"] == 1
    assert (s["cpus"], s["cpus_from"]) == (Decimal(1), "cgroup cpuset")
    b.wait_log(re.escape("CPU allowance: 1 CPU of the cgroup cpuset (max_workers = 0 means 1)"))

    load = churn(b, seconds=6)
    counts, reasons = set(), set()
    try:
        while load.poll() is None:
            counts.add(len(states(b)))
            reasons.add(scaler(b)["last_reason"])
            time.sleep(0.2)
    finally:
        out = load.communicate(timeout=DEADLINE)[0]
    assert load.returncode == 0, out
    assert counts == {1}, f"worker counts seen during the storm: {counts}"
    # the storm was enough to ask for more: only the allowance held the count
    assert any(r.startswith("at max_workers (1): mean ") for r in reasons), reasons
    assert "scaling up" not in b.log_text()

    # worker_cpu_affinity = cores pins the worker to the core it may use
    assert "sched_setaffinity() failed" not in b.log_text()
    assert os.sched_getaffinity(workers(b)[0]["pid"]) == {cpu}


def test_cfs_quota_half_a_cpu_then_reload(cgroups, bouncer, run_as):
    cg = cgroups("cpu")
    cg.write("cpu.cfs_period_us", 100000)
    cg.write("cpu.cfs_quota_us", 50000)
    mport = free_port()
    b = bouncer(ini_overrides={"max_workers": 0, "metrics_listen": f"127.0.0.1:{mport}"},
                wrapper=started_in(run_as, [cg]))
    assert b.pid in cg.tasks()

    s = scaler(b)
    assert s["max_workers"] == 1
    assert (s["cpus"], s["cpus_from"]) == (Decimal("0.5"), "cgroup quota")
    with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=DEADLINE) as r:
        text = r.read().decode()
    assert re.search(r"^pgbouncer_scaler_cpus 0\.5$", text, re.M), text
    assert re.search(r'^pgbouncer_scaler_cpus_info\{from="cgroup quota"\} 1$', text, re.M), text
    assert re.search(r"^pgbouncer_scaler_max_workers 1$", text, re.M), text

    # the pod is resized in place: a RELOAD reads the allowance again
    mark = b.log_mark()
    cg.write("cpu.cfs_quota_us", 150000)
    console(b).execute("RELOAD")
    s = scaler(b)
    assert (s["max_workers"], s["cpus"], s["cpus_from"]) == (2, Decimal("1.5"), "cgroup quota")
    b.wait_log(re.escape("CPU allowance changed: cgroup quota of 1.5 CPUs (max_workers = 0 means 2)"), after=mark)


def test_taskset_one_cpu(bouncer, run_as):
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs: a mask of one would not be narrower than the machine")
    if not shutil.which("taskset"):
        pytest.skip("taskset is not installed (util-linux)")
    wrapper = ["taskset", "-c", str(allowed[0])]
    if run_as.root:
        wrapper += ["setpriv", f"--reuid={run_as.uid}", f"--regid={run_as.gid}", "--clear-groups"]
    # an explicit max_workers stays the user's word; SHOW SCALER still says what the allowance is
    b = bouncer(ini_overrides={"max_workers": 2}, wrapper=wrapper)
    s = scaler(b)
    assert (s["max_workers"], s["cpus"], s["cpus_from"]) == (2, Decimal(1), "affinity")
    b.update(max_workers=0)
    b.write_ini()
    console(b).execute("RELOAD")
    s = scaler(b)
    assert (s["max_workers"], s["cpus"], s["cpus_from"]) == (1, Decimal(1), "affinity")


def test_throttled_cgroup_gets_no_second_worker(cgroups, bouncer, run_as):
    """A fifth of a CPU of quota and max_workers = 2 allowed explicitly: under a
    login storm the cgroup is throttled, SHOW SCALER and /metrics say how
    much, and the scaler adds no worker, whose CPU the quota would take from
    the one there is (doc/workers.md, "Adding a worker only into idle CPU")."""
    cg = cgroups("cpu")
    cg.write("cpu.cfs_period_us", 100000)
    cg.write("cpu.cfs_quota_us", 20000)  # below what one worker uses under the storm
    mport = free_port()
    b = bouncer(ini_overrides={**STORM_SCALING, "max_workers": 2, "metrics_listen": f"127.0.0.1:{mport}"},
                wrapper=started_in(run_as, [cg]))
    load = churn(b, seconds=8)
    counts, throttled, reasons = set(), [], set()
    try:
        while load.poll() is None:
            s = scaler(b)
            counts.add(s["current"])
            throttled.append(float(s["throttled"]))
            reasons.add(s["last_reason"])
            time.sleep(0.2)
    finally:
        out = load.communicate(timeout=DEADLINE)[0]
    assert load.returncode == 0, out
    assert counts == {1}, f"worker counts seen during the storm: {counts}"
    assert max(throttled) > 0.1, throttled
    assert any(r.startswith("throttled: the cgroup's CPU quota held the pooler back in ") for r in reasons), reasons
    with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=DEADLINE) as r:
        text = r.read().decode()
    assert re.search(r"^pgbouncer_scaler_throttled_ratio \d", text, re.M), text
    assert "scaling up" not in b.log_text()
