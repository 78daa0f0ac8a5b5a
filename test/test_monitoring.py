"""One pooler to monitor (issue 13, point 3): with two workers the SHOW
commands a monitor reads give the values one PgBouncer would give for the
same clients. Every test runs the same clients against a 1-worker and a
2-worker pooler and compares what the console says."""

import re
import time

from conftest import wait_for
from helpers import conn_on, console, kv, rows, two_workers

ONE = {"min_workers": 1, "max_workers": 1, "log_connections": 0, "log_disconnections": 0}
TWO = {"min_workers": 2, "max_workers": 2, "log_connections": 0, "log_disconnections": 0}



def start(bouncer, pg, n, **ini):
    dbs = {"postgres": pg.connstr("postgres"), "other": pg.connstr("postgres")}
    b = bouncer(ini_overrides={**(TWO if n == 2 else ONE), **ini}, databases=dbs)
    if n == 2:
        two_workers(b)
    return b


def clients(b, n):
    """The same five clients on either pooler: with two workers, spread over both."""
    held = []
    for k, (db, user) in enumerate([("postgres", "postgres"), ("postgres", "postgres"), ("other", "postgres"),
                                    ("postgres", "postgres"), ("other", "postgres")]):
        if n == 2:
            held.append(conn_on(b, k % 2, dbname=db, user=user))
        else:
            held.append(b.connect(dbname=db, user=user, autocommit=True))
    return held


def snapshot(b):
    """What a monitor reads, from a console that has run one command already (its peer
    connections, if any, are up)."""
    conn = console(b)
    conn.execute("SHOW VERSION")
    lists = kv(conn, "SHOW LISTS")
    pools = {(r["database"], r["user"]): r for r in rows(conn, "SHOW POOLS")}
    cls = rows(conn, "SHOW CLIENTS")
    dbs = {r["name"]: r for r in rows(conn, "SHOW DATABASES")}
    users = {r["name"]: r for r in rows(conn, "SHOW USERS")}
    socks = rows(conn, "SHOW SOCKETS")
    mem = {r["name"]: r for r in rows(conn, "SHOW MEM")}
    conn.close()
    return {"lists": lists, "pools": pools, "clients": cls, "dbs": dbs, "users": users, "sockets": socks,
            "mem": mem}


def both(bouncer, pg):
    out = []
    for n in (1, 2):
        b = start(bouncer, pg, n)
        held = clients(b, n)
        out.append(snapshot(b))
        for c in held:
            c.close()
        b.stop()
    return out


def test_lists_count_each_database_user_and_pool_once(bouncer, pg):
    one, two = both(bouncer, pg)
    for key in ("databases", "users", "peers", "pools", "peer_pools", "free_clients", "used_clients",
                "login_clients", "free_servers", "dns_names", "dns_zones"):
        assert two["lists"][key] == one["lists"][key], (key, one["lists"], two["lists"])


def test_internal_consoles_never_show(bouncer, pg):
    one, two = both(bouncer, pg)
    for snap in (one, two):
        assert not [c for c in snap["clients"] if (c["application_name"] or "").startswith("console of worker")]
    assert len(two["clients"]) == len(one["clients"])
    assert [c["database"] for c in two["sockets"] if c["type"] == "C"].count("pgbouncer") == 1
    admin = ("pgbouncer", "pgbouncer")
    for col in ("cl_active", "cl_waiting", "cl_active_cancel_req", "cl_waiting_cancel_req"):
        assert two["pools"][admin][col] == one["pools"][admin][col] == (1 if col == "cl_active" else 0), col
    assert two["dbs"]["pgbouncer"]["current_client_connections"] == \
        one["dbs"]["pgbouncer"]["current_client_connections"]
    assert two["users"]["pgbouncer"]["current_client_connections"] == \
        one["users"]["pgbouncer"]["current_client_connections"]
    assert two["mem"]["client_cache"]["used"] == one["mem"]["client_cache"]["used"]


STATS_LINE = re.compile(r"^\S+ \S+ \S+ \[(\d+)\] LOG stats: (\d+) xacts/s, (\d+) queries/s", re.MULTILINE)


def stats_lines(b, n):
    """The stats lines of the same 40 queries on 2 clients, once they are all counted."""
    mark = b.log_mark()
    c0, c1 = (conn_on(b, 0), conn_on(b, 1)) if n == 2 else (b.connect(autocommit=True), b.connect(autocommit=True))
    for _ in range(20):
        c1.execute("SELECT 1")
        c0.execute("SELECT 1")
    c0.close()
    c1.close()

    def settled():
        lines = [m.groups() for m in STATS_LINE.finditer(b.log_text(), mark)]
        # the queries are in, and two lines without any came after them
        return lines if len(lines) >= 3 and lines[-1][2] == lines[-2][2] == "0" and \
            sum(int(q) for _, _, q in lines) > 0 else None
    return wait_for(settled, "the stats lines to count the queries")


def test_one_stats_line_for_the_whole_pooler(bouncer, pg):
    counted = []
    for n in (1, 2):
        b = start(bouncer, pg, n, stats_period=1, log_stats=1)
        time.sleep(1.2)  # a first line, before the clients
        lines = stats_lines(b, n)
        # one process writes them: one line a second for the pooler, not one per worker
        assert len({pid for pid, _, _ in lines}) == 1, lines
        counted.append((sum(int(x) for _, x, _ in lines), sum(int(q) for _, _, q in lines)))
        b.stop()
    # stats_period = 1: a rate is a count; both workers' queries are in the line
    assert counted[1] == counted[0], counted
    assert counted[0][1] >= 40, counted


def test_show_mem_has_pgbouncers_rows(bouncer, pg):
    one, two = both(bouncer, pg)
    for name in ("user_cache", "credentials_cache", "db_cache", "peer_cache", "peer_pool_cache", "pool_cache",
                 "outstanding_request_cache", "server_cache", "client_cache", "iobuf_cache", "var_list_cache",
                 "server_prepared_statement_cache"):
        assert name in one["mem"], (name, list(one["mem"]))
        assert name in two["mem"], name
    # connections are in one worker each
    assert two["mem"]["client_cache"]["used"] == one["mem"]["client_cache"]["used"]
    # memory is per process: every worker holds its own copy of the databases, users and credentials
    for name in ("user_cache", "db_cache", "pool_cache"):
        assert two["mem"][name]["used"] >= one["mem"][name]["used"] > 0, name
    assert two["mem"]["credentials_cache"]["used"] == 2 * one["mem"]["credentials_cache"]["used"] > 0
    assert one["lists"]["free_clients"] == one["lists"]["free_servers"] == 0  # nothing is cached (doc/workers.md)
    for r in two["mem"].values():
        assert r["memtotal"] == r["size"] * (r["used"] + r["free"]), r
