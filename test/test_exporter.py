"""pgbouncer_exporter (the Prometheus community's Go exporter) scraping a
2-worker pooler through its console: no error, and the values the console
gives (doc/monitoring.md). Skipped, saying why, when the exporter binary is
not there: PGBOUNCER_EXPORTER names it, else build/tools/ (where
scripts/build-exporter puts it), PATH and $GOPATH/bin are searched."""

import os
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from conftest import DEADLINE, free_port, wait_for
from helpers import two_workers

parser = pytest.importorskip(
    "prometheus_client.parser", reason="python3-prometheus-client is not installed (scripts/debian-packages)")

ROOT = Path(__file__).resolve().parent.parent


def find_exporter():
    named = os.environ.get("PGBOUNCER_EXPORTER")
    if named:
        return named if os.access(named, os.X_OK) else None
    candidates = [ROOT / "build" / "tools" / "pgbouncer_exporter"]
    found = shutil.which("pgbouncer_exporter")
    if found:
        candidates.append(Path(found))
    gopath = os.environ.get("GOPATH") or str(Path.home() / "go")
    candidates.append(Path(gopath) / "bin" / "pgbouncer_exporter")
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    return None


EXPORTER = find_exporter()
pytestmark = pytest.mark.skipif(
    EXPORTER is None,
    reason="pgbouncer_exporter not found (set PGBOUNCER_EXPORTER, or run scripts/build-exporter; "
           "it needs the Go module proxy to serve github.com/prometheus-community/pgbouncer_exporter)")


def rows(conn, sql):
    cur = conn.execute(sql)
    cols = [d.name for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=DEADLINE) as r:
        text = r.read().decode()
    samples = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_exporter_scrapes_two_workers(bouncer, tmp_path):
    # lib/pq, the exporter's driver, may send extra_float_digits at login (the exporter's own advice)
    b = bouncer(ini_overrides={"min_workers": 2, "max_workers": 2, "pool_mode": "transaction",
                               "stats_users": "stats", "ignore_startup_parameters": "extra_float_digits"},
                users_txt='"postgres" "postgres"\n"pgbouncer" "pgbouncer"\n"stats" "stats"\n')
    two_workers(b)
    # a known load: 3 clients inside a transaction, 2 idle ones
    busy = [b.connect(autocommit=True) for _ in range(3)]
    for c in busy:
        c.execute("BEGIN")
        c.execute("SELECT 1")
    idle = [b.connect(autocommit=True) for _ in range(2)]
    for c in idle:
        c.execute("SELECT 1")

    eport = free_port()
    log = open(tmp_path / "exporter.log", "wb")
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
        samples = wait_for(ready, "pgbouncer_exporter to answer")
        with b.admin() as admin:
            pools = {(r["database"], r["user"]): r for r in rows(admin, "SHOW POOLS")}
            lists = {r["list"]: r["items"] for r in rows(admin, "SHOW LISTS")}
            stats = {r["database"]: r for r in rows(admin, "SHOW STATS")}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    out = (tmp_path / "exporter.log").read_text(errors="replace")
    assert not re.search(r"level=(error|ERROR)", out), out

    assert samples[("pgbouncer_up", ())] == 1, out
    p = pools[("postgres", "postgres")]
    assert (p["cl_active"], p["sv_active"]) == (5, 3)
    key = ("pgbouncer_pools_client_active_connections", (("database", "postgres"), ("user", "postgres")))
    assert samples[key] == 5
    key = ("pgbouncer_pools_server_active_connections", (("database", "postgres"), ("user", "postgres")))
    assert samples[key] == 3
    # the list counts as one pooler gives them (each object once)
    assert lists["databases"] == 2 and lists["pools"] >= 1
    for name in ("databases", "users", "pools"):
        found = [v for (n, lb), v in samples.items() if n == f"pgbouncer_lists_{name}" or
                 (n.startswith("pgbouncer_") and n.endswith(f"_{name}") and not lb and "lists" in n)]
        if found:
            assert found[0] == lists[name], name
    xacts = [v for (n, lb), v in samples.items()
             if n.startswith("pgbouncer_stats_sql_transactions_pooled") and dict(lb).get("database") == "postgres"]
    assert xacts and xacts[0] == stats["postgres"]["total_xact_count"]
    for c in busy:
        c.execute("COMMIT")
