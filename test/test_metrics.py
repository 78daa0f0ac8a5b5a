"""The built-in Prometheus endpoint (metrics_listen, doc/monitoring.md):
/metrics parsed with prometheus_client's text parser, its values compared
with the console's SHOW POOLS/STATS/LISTS/DATABASES/CLIENTS/VERSION for a
known load on a 2-worker pooler, under pgbouncer_exporter's names (that the
exporter itself emits the same families is test_exporter.py's), plus the
per-worker and scaler figures; and the limits that keep the master small
whatever reaches the port (doc/monitoring.md "Limits")."""

import collections
import os
import re
import signal
import socket
import time
import urllib.error
import urllib.request

import pytest

from conftest import DEADLINE, free_port, wait_for
from helpers import states, two_workers

parser = pytest.importorskip(
    "prometheus_client.parser", reason="python3-prometheus-client is not installed (scripts/debian-packages)")


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=DEADLINE) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert r.headers["Connection"] == "close"  # no kept-alive connection for a worker to inherit
        text = r.read().decode()
    samples = {}
    types = {}
    for family in parser.text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types, text


def value(samples, metric, /, **labels):
    key = (metric, tuple(sorted(labels.items())))
    assert key in samples, f"{metric}{labels} not in /metrics: " + ", ".join(
        sorted({f"{n}{dict(lb)}" for n, lb in samples if n == metric}))
    return samples[key]


def rows(admin, sql):
    cur = admin.execute(sql)
    cols = [d.name for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


@pytest.fixture
def metered(bouncer):
    mport = free_port()
    b = bouncer(ini_overrides={"min_workers": 2, "max_workers": 2, "pool_mode": "transaction",
                               "reserve_pool_size": 3, "metrics_listen": f"127.0.0.1:{mport}"})
    two_workers(b)
    return b, mport


def test_metrics_off_by_default(bouncer):
    b = bouncer()
    with b.admin() as admin:
        conf = {r["key"]: r for r in rows(admin, "SHOW CONFIG")}
    assert conf["metrics_listen"]["value"] == ""
    assert conf["metrics_listen"]["changeable"] == "no"
    assert conf["metrics_max_connections"]["value"] == "16"
    assert conf["metrics_max_connections"]["changeable"] == "yes"
    assert "metrics" not in b.log_text()


def test_metrics_match_the_console(metered, pg):
    b, mport = metered
    pg.sql("CREATE TABLE IF NOT EXISTS metrics_t (i int)")
    # a known load: 3 clients inside a transaction (each holds a server), 2 idle ones
    busy = [b.connect(autocommit=True) for _ in range(3)]
    for c in busy:
        c.execute("BEGIN")
        c.execute("SELECT 1")
    idle = [b.connect(autocommit=True, application_name='report "daily"') for _ in range(2)]
    for c in idle:
        for _ in range(5):
            c.execute("SELECT 1")

    admin = b.admin()
    samples, types, text = scrape(mport)
    pools = {(r["database"], r["user"]): r for r in rows(admin, "SHOW POOLS")}
    stats = {r["database"]: r for r in rows(admin, "SHOW STATS")}
    lists = {r["list"]: r["items"] for r in rows(admin, "SHOW LISTS")}
    dbs = {r["name"]: r for r in rows(admin, "SHOW DATABASES")}
    clients = collections.Counter((r["database"], r["user"], r["application_name"] or "", r["state"])
                                  for r in rows(admin, "SHOW CLIENTS"))
    version = rows(admin, "SHOW VERSION")[0]["version"]
    again, _, _ = scrape(mport)

    assert value(samples, "pgbouncer_up") == 1
    assert value(samples, "pgbouncer_version_info", version=version) == 1
    build = [dict(lb) for n, lb in samples if n == "pgbouncer_build_info"]
    assert len(build) == 1 and f"PgBouncer {build[0]['version']}" == version, build
    assert build[0]["libevent"] and build[0]["c_ares"] and build[0]["openssl"].startswith("OpenSSL"), build

    p = pools[("postgres", "postgres")]
    assert p["cl_active"] == 5 and p["sv_active"] == 3  # the load is what we think it is
    for col, metric in [("cl_active", "client_active_connections"), ("cl_waiting", "client_waiting_connections"),
                        ("sv_active", "server_active_connections"), ("sv_idle", "server_idle_connections"),
                        ("sv_used", "server_used_connections"), ("sv_login", "server_login_connections")]:
        assert value(samples, f"pgbouncer_pools_{metric}", database="postgres", user="postgres") == p[col], col
    assert types["pgbouncer_pools_client_active_connections"] == "gauge"

    s = stats["postgres"]
    assert s["total_xact_count"] >= 10  # the open transactions count when they end
    for col, metric, scale in [("total_xact_count", "sql_transactions_pooled", 1),
                               ("total_query_count", "queries_pooled", 1),
                               ("total_received", "received_bytes", 1), ("total_sent", "sent_bytes", 1),
                               ("total_query_time", "queries_duration_seconds", 1e-6),
                               ("total_wait_time", "client_wait_seconds", 1e-6),
                               ("total_server_assignment_count", "server_assignments", 1)]:
        # the exporter's name, and the earlier one this endpoint keeps
        for family in (f"pgbouncer_stats_totals_{metric}", f"pgbouncer_stats_{metric}"):
            # the counter family is reported without its _total suffix by the parser
            assert types[family] == "counter"
            got = value(samples, f"{family}_total", database="postgres")
            got2 = value(again, f"{family}_total", database="postgres")
            want = float(s[col]) * scale
            assert got - 1e-9 <= want <= got2 + 1e-9, (family, got, want, got2)

    for name in ("databases", "users", "pools", "used_clients", "used_servers", "free_clients", "free_servers",
                 "login_clients"):
        assert value(samples, f"pgbouncer_{name}") == lists[name], name
        assert types[f"pgbouncer_{name}"] == "gauge"
    assert value(samples, "pgbouncer_cached_dns_names") == lists["dns_names"]
    assert value(samples, "pgbouncer_in_flight_dns_queries") == lists["dns_queries"]
    # SHOW LISTS counts each object once with 2 workers (one pooler, doc/monitoring.md)
    assert value(samples, "pgbouncer_databases") == len(dbs)
    # renamed to the exporter's names (doc/monitoring.md, "Metric names")
    assert not [k for k in samples if k[0].startswith("pgbouncer_lists_")]
    assert not [k for k in samples if k[0] == "pgbouncer_databases_reserve_pool_size"]

    # one sample per database, user, application_name and state, counting SHOW CLIENTS' rows
    assert clients[("postgres", "postgres", "", "active")] == 3
    assert clients[("postgres", "postgres", 'report "daily"', "idle")] == 2
    got = {tuple(dict(lb)[k] for k in ("database", "user", "application_name", "state")): v
           for (n, lb), v in samples.items() if n == "pgbouncer_client_connections"}
    assert got == clients and types["pgbouncer_client_connections"] == "gauge"

    d = dbs["postgres"]
    labels = dict(name="postgres", host=d["host"] or "", port=str(d["port"]), database=d["database"],
                  force_user=d["force_user"] or "", pool_mode=d["pool_mode"] or "")
    assert value(samples, "pgbouncer_databases_current_connections", **labels) == d["current_connections"]
    assert value(samples, "pgbouncer_databases_pool_size", **labels) == d["pool_size"]
    assert value(samples, "pgbouncer_databases_reserve_pool", **labels) == d["reserve_pool_size"] == 3

    # the scrape's own console login is nobody's client
    assert value(samples, "pgbouncer_pools_client_active_connections", database="pgbouncer",
                 user="pgbouncer") == pools[("pgbouncer", "pgbouncer")]["cl_active"]
    assert not any(r["application_name"] == "metrics" for r in rows(admin, "SHOW CLIENTS"))

    # per worker: both active; the figures they publish (every 100 ms) catch up with the still load
    def workers_agree():
        now, _, _ = scrape(mport)
        workers = {r["worker"]: r for r in rows(admin, "SHOW WORKERS")}
        return len(workers) == 2 and all(
            value(now, "pgbouncer_worker_state", worker=str(w), state="active") == 1
            and 0 <= value(now, "pgbouncer_worker_busy_ratio", worker=str(w)) <= 1
            and 0 <= value(now, "pgbouncer_worker_wait_avg_ratio", worker=str(w)) <= 1
            and value(now, "pgbouncer_worker_client_active_connections", worker=str(w)) == r["cl_active"]
            and value(now, "pgbouncer_worker_server_active_connections", worker=str(w)) == r["sv_active"]
            and value(now, "pgbouncer_worker_clients_moved_in_total", worker=str(w)) == r["moved_in"]
            and value(now, "pgbouncer_worker_clients_moved_out_total", worker=str(w)) == r["moved_out"]
            and value(now, "pgbouncer_worker_clients_not_movable", worker=str(w)) == r["not_movable"]
            and value(now, "pgbouncer_worker_client_move_failures_total", worker=str(w)) == r["move_failed"]
            for w, r in workers.items()) and sum(
            value(now, "pgbouncer_worker_server_active_connections", worker=str(w)) for w in workers) == 3
    wait_for(workers_agree, "the per-worker metrics to match SHOW WORKERS")
    assert value(samples, "pgbouncer_scaler_current_workers") == 2
    assert value(samples, "pgbouncer_scaler_min_workers") == 2
    assert value(samples, "pgbouncer_scaler_decisions_total", decision="hold") >= 1
    assert types["pgbouncer_scaler_decisions"] == "counter"
    info = [k for k in samples if k[0] == "pgbouncer_scaler_last_decision_info"]
    assert len(info) == 1
    # the kind of reason, never its figures (which would make a new series at every sample)
    reason = dict(info[0][1])["reason"]
    assert reason in {"steady", "cooldown", "load_high", "load_low", "no_idle_cpu", "throttled", "at_cpu_allowance",
                      "at_max_workers", "at_min_workers", "below_min_workers", "above_max_workers",
                      "no_samples", "start"}, reason

    for c in busy:
        c.execute("COMMIT")


def test_metrics_other_paths_and_methods(metered):
    b, mport = metered
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{mport}/", timeout=DEADLINE)
    assert e.value.code == 404
    req = urllib.request.Request(f"http://127.0.0.1:{mport}/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=DEADLINE)
    assert e.value.code == 405 and e.value.headers["Allow"] == "GET, HEAD"
    # many scrapes in a row leave no console connection behind
    for _ in range(20):
        samples, _, _ = scrape(mport)
        assert value(samples, "pgbouncer_up") == 1
    with b.admin() as admin:
        assert rows(admin, "SHOW LISTS") and len(rows(admin, "SHOW CLIENTS")) == 1
    # scrapes at the same time each get their own console connection
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda _: value(scrape(mport)[0], "pgbouncer_up"), range(6)))
    assert results == [1] * 6
    # nor a login or closing line per scrape (the master's connection is unix(<its pid>))
    assert f"unix({b.pid})" not in b.log_text()


def test_metrics_follow_a_worker_restart(metered):
    """Worker 0 killed: the next scrape asks a live one, and pgbouncer_up stays 1."""
    b, mport = metered
    with b.admin() as admin:
        w0 = [r for r in rows(admin, "SHOW WORKERS") if r["worker"] == 0][0]["pid"]
    os.kill(w0, signal.SIGKILL)
    deadline = time.monotonic() + DEADLINE
    ok = False
    while time.monotonic() < deadline and not ok:
        samples, _, _ = scrape(mport)
        ok = value(samples, "pgbouncer_up") == 1 and value(samples, "pgbouncer_scaler_current_workers") == 2
        time.sleep(0.2)
    assert ok


def test_metrics_listen_refused_at_start(bouncer):
    b = bouncer(ini_overrides={"metrics_listen": "no-port-here"}, start=False)
    b.start(wait=False)
    assert b.wait_exit() != 0
    assert "metrics_listen: 'no-port-here' is not host:port" in b.log_text()


def test_metrics_up_0_when_no_worker_answers(metered):
    """Workers stopped: the scrape gives up on the console (pgbouncer_up 0) but
    still reports the workers and the scaler from shared memory, and the log
    names the worker it waited for."""
    b, mport = metered
    with b.admin() as admin:
        workers = {r["worker"]: r["pid"] for r in rows(admin, "SHOW WORKERS")}
    pids = list(workers.values())
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        samples, _, _ = scrape(mport)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert value(samples, "pgbouncer_up") == 0
    assert not [k for k in samples if k[0].startswith("pgbouncer_pools_")]
    assert value(samples, "pgbouncer_scaler_current_workers") == 2
    assert len([k for k in samples if k[0] == "pgbouncer_worker_state"]) == 2
    assert (f"metrics: the console connection timed out: worker 0 (pid {workers[0]}) did not answer within 5 s"
            in b.log_text())
    wait_for(lambda: value(scrape(mport)[0], "pgbouncer_up") == 1, "pgbouncer_up 1 again")


def test_metrics_use_the_next_worker_when_a_private_socket_is_gone(metered):
    b, mport = metered
    sock = b.dir / f"pgbouncer-workers.{b.port}" / "worker.0" / f".s.PGSQL.{b.port}"
    assert sock.exists()
    sock.unlink()
    samples, _, _ = scrape(mport)
    assert value(samples, "pgbouncer_up") == 1
    assert value(samples, "pgbouncer_databases") == 2


# ---- limits (doc/monitoring.md "Limits") ----

def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1])


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def peer_closed(sock):
    """True once the pooler has closed `sock` (EOF or reset); reads away what it sent before."""
    sock.setblocking(False)
    try:
        while True:
            if sock.recv(65536) == b"":
                return True
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def connect(mport):
    return socket.create_connection(("127.0.0.1", mport), timeout=DEADLINE)


@pytest.fixture
def one_worker_metered(bouncer):
    mport = free_port()
    b = bouncer(ini_overrides={"min_workers": 1, "max_workers": 1, "metrics_listen": f"127.0.0.1:{mport}"})
    return b, mport


@pytest.mark.parametrize("filler", ["header lines", "one header line"])
def test_metrics_endless_request_head_is_cut_off(one_worker_metered, filler):
    """A request line, then header bytes without end: the pooler closes the
    connection at its bound on the head, and the master's memory does not
    grow with what the client sends (it used to keep all of it)."""
    b, mport = one_worker_metered
    assert value(scrape(mport)[0], "pgbouncer_up") == 1
    before = rss_kb(b.pid)
    s = connect(mport)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    chunk = (b"X-Filler: " + b"y" * 90 + b"\r\n") * 640 if filler == "header lines" else b"y" * 64000
    sent, closed = 0, False
    while sent < 64 << 20 and not closed:
        try:
            s.sendall(chunk)
            sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            closed = True
    closed = closed or wait_for(lambda: peer_closed(s), "the pooler to close the connection")
    s.close()
    assert closed
    assert sent < 4 << 20, f"the pooler read {sent} bytes of a request head"
    grown = rss_kb(b.pid) - before
    assert grown < 20 * 1024, f"the master grew by {grown} kB"
    assert "metrics: closed a connection whose request head was over 8192 bytes" in b.log_text()
    assert value(scrape(mport)[0], "pgbouncer_up") == 1


def test_metrics_connections_are_capped(one_worker_metered):
    """200 connections held open without a request: the master keeps
    metrics_max_connections (16) of them, closes the others, and its
    descriptors stay bounded; a scrape still gets through while they are
    open, taking the place of the oldest idle one."""
    b, mport = one_worker_metered
    base = fd_count(b.pid)
    most = base
    conns = []
    for _ in range(200):
        conns.append(connect(mport))
        most = max(most, fd_count(b.pid))

    def over_cap_closed():
        nonlocal most
        most = max(most, fd_count(b.pid))
        return sum(peer_closed(c) for c in conns) >= 200 - 16
    try:
        # well under the 30 s after which idle connections used to go
        wait_for(over_cap_closed, "the connections over the cap to close", timeout=20)
        assert most <= base + 16 + 1, f"{most - base} descriptors more in the master"
        samples, _, _ = scrape(mport)
        assert value(samples, "pgbouncer_up") == 1
        assert fd_count(b.pid) <= base + 16 + 1
    finally:
        for c in conns:
            c.close()
    assert value(scrape(mport)[0], "pgbouncer_up") == 1


def test_metrics_idle_and_trickling_connections_are_closed(one_worker_metered):
    """A connection that sends nothing, and one that sends its head a byte a
    second, are closed when their request has not arrived within its 5
    seconds; idle connections used to stay 30 s, trickling ones for ever."""
    b, mport = one_worker_metered
    idle = connect(mport)
    trickle = connect(mport)
    trickle.sendall(b"GET /metrics HTTP/1.1\r\n")
    closed = {"idle": False, "trickle": False}
    deadline = time.monotonic() + 20  # well under the 30 s idle connections had before
    while not all(closed.values()) and time.monotonic() < deadline:
        closed["idle"] = closed["idle"] or peer_closed(idle)
        if not closed["trickle"]:
            try:
                trickle.send(b"X")
            except OSError:
                closed["trickle"] = True
            closed["trickle"] = closed["trickle"] or peer_closed(trickle)
        time.sleep(0.5)
    idle.close()
    trickle.close()
    assert closed == {"idle": True, "trickle": True}
    assert "metrics: closed a connection that sent no complete request within 5 s" in b.log_text()
    assert value(scrape(mport)[0], "pgbouncer_up") == 1


def test_metrics_bound_logged_once_per_interval(one_worker_metered):
    """30 connections against metrics_max_connections = 2 (set by RELOAD):
    one log line at the first of the 28 closed, then one line counting the
    27 others after the 10 s interval, not a line per connection."""
    b, mport = one_worker_metered
    b.update(metrics_max_connections=2)
    b.write_ini()
    with b.admin() as admin:
        admin.execute("RELOAD")
        assert {r["key"]: r["value"] for r in rows(admin, "SHOW CONFIG")}["metrics_max_connections"] == "2"
    mark = b.log_mark()
    conns = [connect(mport) for _ in range(30)]
    try:
        wait_for(lambda: sum(peer_closed(c) for c in conns) >= 28, "the connections over the cap to close")
        bound = "metrics: metrics_max_connections (2) reached: closed the oldest connection without a request"

        def lines():
            return [ln for ln in b.log_text()[mark:].splitlines() if bound in ln]
        assert len(lines()) == 1 and "more times" not in lines()[0], lines()
        m = b.wait_log(re.escape(bound) + r".*\((\d+) more times in the last 10 s\)", after=mark)
        assert int(m.group(1)) == 27
        assert len(lines()) == 2, lines()
    finally:
        for c in conns:
            c.close()


def raw_request(mport, data, half_close=False):
    with connect(mport) as s:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


def test_metrics_head_and_raw_requests(one_worker_metered):
    """HEAD gets the head alone; a client that shuts its sending side after
    the request (nc -N, say) still gets the answer; what is not an HTTP/1.x
    request gets 400."""
    b, mport = one_worker_metered
    with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{mport}/metrics", method="HEAD"),
                                timeout=DEADLINE) as r:
        assert r.status == 200 and int(r.headers["Content-Length"]) > 0 and r.read() == b""
    answer = raw_request(mport, b"GET /metrics HTTP/1.0\r\n\r\n", half_close=True)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b"\npgbouncer_up 1\n" in answer, answer[:200]
    head, body = answer.split(b"\r\n\r\n", 1)
    assert f"content-length: {len(body)}".encode() in head.lower()
    assert raw_request(mport, b"\x16\x03\x01\x00\xa5\x01\n\n").startswith(b"HTTP/1.1 400 ")


def test_metrics_connection_open_at_a_fork_is_closed(one_worker_metered):
    """A worker forked while a metrics connection is open holds no copy of
    it: the connection closes when the master closes it (here at the request
    deadline), not when that worker exits."""
    b, mport = one_worker_metered
    with b.admin() as admin:
        w0 = rows(admin, "SHOW WORKERS")[0]["pid"]
    idle = connect(mport)
    os.kill(w0, signal.SIGKILL)  # the master forks a new worker 0 while `idle` is open

    def respawned():
        with b.admin() as admin:
            return [r["pid"] for r in rows(admin, "SHOW WORKERS") if r["pid"] != w0 and r["state"] == "active"]
    wait_for(respawned, "worker 0 to be replaced")
    wait_for(lambda: peer_closed(idle), "the master to close the idle connection", timeout=20)
    idle.close()


# ---- counters never go back (doc/workers.md, "The admin console with several workers") ----

def stats_totals(b):
    """SHOW STATS's total_query_count and total_xact_count of postgres, and SHOW TOTALS's query count."""
    with b.admin() as admin:
        row = next(r for r in rows(admin, "SHOW STATS") if r["database"] == "postgres")
        totals = {r["name"]: r["value"] for r in rows(admin, "SHOW TOTALS")}
    return row["total_query_count"], row["total_xact_count"], totals["total_query_count"]


def pooled_queries(mport):
    return value(scrape(mport)[0], "pgbouncer_stats_totals_queries_pooled_total", database="postgres")


def queries_on_both(b, n):
    from helpers import conn_on
    for w in (0, 1):
        with conn_on(b, w) as c:
            for _ in range(n):
                c.execute("SELECT 1")


def test_counters_keep_a_drained_workers_share(metered):
    """Scaling down from two workers to one keeps what the drained worker
    counted in SHOW STATS, SHOW TOTALS and /metrics: a Prometheus counter
    that went back would read as a restart and make rate() jump."""
    b, mport = metered
    queries_on_both(b, 40)
    before = stats_totals(b)
    metric_before = pooled_queries(mport)
    assert before[0] >= 80 and metric_before >= 80, (before, metric_before)
    with b.admin() as admin:
        admin.execute("SET min_workers = 1")
        admin.execute("SET max_workers = 1")
    wait_for(lambda: states(b) == ["active"], "one worker left")
    after = stats_totals(b)
    assert all(a >= x for a, x in zip(after, before)), (before, after)
    assert pooled_queries(mport) >= metric_before


def test_counters_keep_a_crashed_workers_share(metered):
    """A worker killed with SIGKILL: what SHOW STATS counted for it before
    stays counted after the master has replaced it."""
    b, mport = metered
    queries_on_both(b, 40)
    before = stats_totals(b)
    metric_before = pooled_queries(mport)
    with b.admin() as admin:
        pid = next(r["pid"] for r in rows(admin, "SHOW WORKERS") if r["worker"] == 1)
    os.kill(pid, signal.SIGKILL)

    def replaced():
        with b.admin() as admin:
            w = [r for r in rows(admin, "SHOW WORKERS") if r["worker"] == 1]
        return w and w[0]["pid"] != pid and w[0]["state"] == "active"
    wait_for(replaced, "worker 1 to be replaced")
    after = stats_totals(b)
    assert all(a >= x for a, x in zip(after, before)), (before, after)
    assert pooled_queries(mport) >= metric_before


# ---- label values (doc/monitoring.md "Metric names") ----

def raw_login(port, params):
    """A client logged in with a hand-made startup packet (bytes values, as a
    client may send them); returned once ReadyForQuery came."""
    body = b"\x00\x03\x00\x00" + b"".join(k + b"\x00" + v + b"\x00" for k, v in params.items()) + b"\x00"
    s = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
    s.sendall((len(body) + 4).to_bytes(4, "big") + body)
    got = b""
    while b"Z\x00\x00\x00\x05" not in got:
        chunk = s.recv(65536)
        assert chunk, got
        got += chunk
    return s


def test_metrics_labels_are_valid_utf8(one_worker_metered):
    """A client's application_name that is not UTF-8 (a startup packet may
    carry any bytes) still gives a body of valid UTF-8: Prometheus rejects a
    whole scrape with one label value that is not."""
    b, mport = one_worker_metered
    s = raw_login(b.port, {b"user": b"postgres", b"database": b"postgres", b"application_name": b"ab\xff\xfecd\xc3"})
    # a name that reads the same once replaced: the same sample, not a second one with the same labels
    s2 = raw_login(b.port, {b"user": b"postgres", b"database": b"postgres", b"application_name": b"ab\xc0\xaf"
                            b"cd\xed"})
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=DEADLINE) as r:
            body = r.read()
        text = body.decode("utf-8")  # raises on invalid UTF-8
        samples = {(s_.name, tuple(sorted(s_.labels.items()))): s_.value
                   for f in parser.text_string_to_metric_families(text) for s_ in f.samples}
        apps = {dict(lb)["application_name"]: v for (n, lb), v in samples.items()
                if n == "pgbouncer_client_connections" and dict(lb)["database"] == "postgres"}
        assert apps == {"ab\ufffd\ufffdcd\ufffd": 2}, apps
        assert text.count('application_name="ab\ufffd\ufffdcd\ufffd"') == 1
    finally:
        s.close()
        s2.close()
    # and what needs escaping comes back as it was sent
    odd = 'q"b\\s\nl \u00e9'
    s = raw_login(b.port, {b"user": b"postgres", b"database": b"postgres", b"application_name": odd.encode()})
    try:
        samples, _, _ = scrape(mport)
        assert value(samples, "pgbouncer_client_connections", database="postgres", user="postgres",
                     application_name=odd, state="idle") == 1
    finally:
        s.close()
