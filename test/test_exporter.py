"""pgbouncer_exporter (the Prometheus community's Go exporter) against a
2-worker pooler, and the pooler's own /metrics (metrics_listen) beside it:
the exporter scrapes through the console without an error, and every
family it emits is in /metrics with the same name, type and labels, with the
same series and values where both describe the same load (doc/monitoring.md,
"Metric names").

The exporter is found through PGBOUNCER_EXPORTER (.ci/run sets it to
../shared/peers/pgbouncer_exporter-0.12.1 when that file is there), else in
build/tools/ (where scripts/build-exporter puts it), PATH and $GOPATH/bin;
without it the tests are skipped and say why."""

import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import DEADLINE, free_port, wait_for
from helpers import two_workers

parser = pytest.importorskip(
    "prometheus_client.parser", reason="python3-prometheus-client is not installed (scripts/debian-packages)")

ROOT = Path(__file__).resolve().parent.parent


def find_exporter():
    """(path, None), or (None, why it is not there)."""
    named = os.environ.get("PGBOUNCER_EXPORTER")
    if named:
        if os.path.isfile(named) and os.access(named, os.X_OK):
            return named, None
        return None, f"PGBOUNCER_EXPORTER={named} is not an executable file"
    candidates = [ROOT / "build" / "tools" / "pgbouncer_exporter"]
    found = shutil.which("pgbouncer_exporter")
    if found:
        candidates.append(Path(found))
    gopath = os.environ.get("GOPATH") or str(Path.home() / "go")
    candidates.append(Path(gopath) / "bin" / "pgbouncer_exporter")
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c), None
    return None, ("pgbouncer_exporter not found: set PGBOUNCER_EXPORTER to the binary (.ci/run uses "
                  "../shared/peers/pgbouncer_exporter-0.12.1 when it is there), or run scripts/build-exporter "
                  "(it needs the Go module proxy to serve github.com/prometheus-community/pgbouncer_exporter)")


EXPORTER, WHY_NOT = find_exporter()
pytestmark = pytest.mark.skipif(EXPORTER is None, reason=WHY_NOT or "")

# What the exporter says about itself, which has no counterpart in the pooler:
# the Go runtime, its own process, its HTTP handler and its build (the pooler
# has pgbouncer_build_info instead; doc/monitoring.md, "Metric names").
EXPORTER_ITSELF = ("go_", "process_", "promhttp_", "pgbouncer_exporter_build_info")

# The families /metrics has beyond the exporter's, as doc/monitoring.md lists them.
OURS_ONLY_PREFIXES = ("pgbouncer_worker_", "pgbouncer_scaler_")
OURS_ONLY = {"pgbouncer_build_info",
             "pgbouncer_databases_min_pool_size", "pgbouncer_databases_max_client_connections",
             "pgbouncer_databases_current_client_connections"} | {
    f"pgbouncer_stats_{n}" for n in (  # SHOW STATS under the names this endpoint gave it first
        "server_assignments", "sql_transactions_pooled", "queries_pooled", "received_bytes", "sent_bytes",
        "server_in_transaction_seconds", "queries_duration_seconds", "client_wait_seconds", "client_parses",
        "server_parses", "binds")}


def rows(conn, sql):
    cur = conn.execute(sql)
    cols = [d.name for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def scrape(port):
    """{family name: (type, label names, {(sample name, labels): value})}; counters are named
    without _total, as prometheus_client's parser names them."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=DEADLINE) as r:
        text = r.read().decode()
    families = {}
    for f in parser.text_string_to_metric_families(text):
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in f.samples}
        families[f.name] = (f.type, frozenset(k for s in f.samples for k in s.labels), samples)
    return families


def sample(families, family, name=None, **labels):
    return families[family][2][(name or family, tuple(sorted(labels.items())))]


@pytest.fixture
def side_by_side(bouncer, tmp_path):
    """A 2-worker pooler with metrics_listen and a known load (3 clients inside a
    transaction, 2 idle ones with an application_name), the exporter scraping its
    console: yields (pooler, exporter's port, /metrics port, exporter's log)."""
    mport = free_port()
    # lib/pq, the exporter's driver, may send extra_float_digits at login (the exporter's own advice)
    b = bouncer(ini_overrides={"min_workers": 2, "max_workers": 2, "pool_mode": "transaction",
                               "metrics_listen": f"127.0.0.1:{mport}",
                               "stats_users": "stats", "ignore_startup_parameters": "extra_float_digits"},
                users_txt='"postgres" "postgres"\n"pgbouncer" "pgbouncer"\n"stats" "stats"\n')
    two_workers(b)
    busy = [b.connect(autocommit=True) for _ in range(3)]
    for c in busy:
        c.execute("BEGIN")
        c.execute("SELECT 1")
    idle = [b.connect(autocommit=True, application_name="reporting") for _ in range(2)]
    for c in idle:
        c.execute("SELECT 1")

    eport = free_port()
    logpath = tmp_path / "exporter.log"
    log = open(logpath, "wb")
    proc = subprocess.Popen(
        [EXPORTER, f"--web.listen-address=127.0.0.1:{eport}",
         f"--pgBouncer.connectionString=postgres://stats:stats@127.0.0.1:{b.port}/pgbouncer?sslmode=disable"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        def ready():
            try:
                return scrape(eport)
            except OSError:
                return None
        wait_for(ready, "pgbouncer_exporter to answer")
        yield b, eport, mport, logpath
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        for c in busy:
            c.execute("COMMIT")


def test_exporter_scrapes_two_workers(side_by_side):
    """The exporter's figures are the console's, for the whole pooler."""
    b, eport, _, logpath = side_by_side
    samples = scrape(eport)
    with b.admin() as admin:
        pools = {(r["database"], r["user"]): r for r in rows(admin, "SHOW POOLS")}
        lists = {r["list"]: r["items"] for r in rows(admin, "SHOW LISTS")}
        stats = {r["database"]: r for r in rows(admin, "SHOW STATS")}
    out = logpath.read_text(errors="replace")
    assert not re.search(r"level=(error|ERROR)", out), out

    assert sample(samples, "pgbouncer_up") == 1, out
    p = pools[("postgres", "postgres")]
    assert (p["cl_active"], p["sv_active"]) == (5, 3)
    assert sample(samples, "pgbouncer_pools_client_active_connections", database="postgres", user="postgres") == 5
    assert sample(samples, "pgbouncer_pools_server_active_connections", database="postgres", user="postgres") == 3
    # the list counts as one pooler gives them (each object once)
    assert lists["databases"] == 2 and lists["pools"] >= 1
    for name in ("databases", "users", "pools"):
        assert sample(samples, f"pgbouncer_{name}") == lists[name], name
    assert sample(samples, "pgbouncer_stats_totals_sql_transactions_pooled",
                  "pgbouncer_stats_totals_sql_transactions_pooled_total",
                  database="postgres") == stats["postgres"]["total_xact_count"]


def test_metrics_has_every_exporter_family(side_by_side):
    """Every family the exporter emits is in /metrics with its name, type and
    label names; what /metrics has beyond them is the documented list."""
    _, eport, mport, _ = side_by_side
    theirs, ours = scrape(eport), scrape(mport)
    assert sample(ours, "pgbouncer_up") == 1
    compared = {n: f for n, f in theirs.items() if not n.startswith(EXPORTER_ITSELF)}
    assert len(compared) >= 40, sorted(theirs)  # the exporter did see the pooler
    missing = sorted(n for n in compared if n not in ours)
    assert not missing, f"exporter families /metrics lacks: {missing}"
    differ = {n: ((t, sorted(lb)), (ours[n][0], sorted(ours[n][1])))
              for n, (t, lb, _) in compared.items() if (t, lb) != ours[n][:2]}
    assert not differ, f"(type, labels) of the exporter vs /metrics: {differ}"
    extra = sorted(n for n in ours if n not in compared and n not in OURS_ONLY
                   and not n.startswith(OURS_ONLY_PREFIXES))
    assert not extra, f"families of /metrics that are neither the exporter's nor documented as ours: {extra}"


def test_metrics_and_exporter_agree(side_by_side):
    """Where both describe the same thing (not the exporter's own console
    connection, which /metrics does not make), the series and their values
    are the same."""
    b, eport, mport, _ = side_by_side

    def comparable(families):
        out = {}
        for name, (_, _, samples) in families.items():
            for (sname, labels), v in samples.items():
                lb = dict(labels)
                if (name.startswith(("pgbouncer_config_", "pgbouncer_databases_")) or
                        name in ("pgbouncer_version_info", "pgbouncer_databases", "pgbouncer_users",
                                 "pgbouncer_pools") or
                        (name.startswith(("pgbouncer_pools_", "pgbouncer_stats_totals_",
                                          "pgbouncer_client_connections")) and lb.get("database") == "postgres")):
                    out[(sname, labels)] = v
        return out

    deadline = time.monotonic() + DEADLINE
    while True:
        exported = {n: f for n, f in scrape(eport).items() if not n.startswith(EXPORTER_ITSELF)}
        theirs = comparable(exported)
        ours = comparable({n: f for n, f in scrape(mport).items() if n in exported})
        diff = {k: (theirs.get(k), ours.get(k)) for k in theirs.keys() | ours.keys() if theirs.get(k) != ours.get(k)}
        if not diff or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not diff, f"exporter vs /metrics: {diff}"
    # what was compared covers the load
    assert theirs[("pgbouncer_client_connections", (("application_name", ""), ("database", "postgres"),
                                                    ("state", "active"), ("user", "postgres")))] == 3
    assert theirs[("pgbouncer_client_connections", (("application_name", "reporting"), ("database", "postgres"),
                                                    ("state", "idle"), ("user", "postgres")))] == 2
    assert len([k for k in theirs if k[0] == "pgbouncer_databases_reserve_pool"]) == 2
    assert len([k for k in theirs if k[0].startswith("pgbouncer_stats_totals_")]) == 11
