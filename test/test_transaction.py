"""Transaction and statement pooling (issue 9; spec/behaviours.md §3.2, §4, §6, §9,
§12, spec/cli.md §7): a server is lent for one transaction and goes back at
ReadyForQuery 'I' with nothing outstanding, statement mode refuses transaction
blocks, pool_mode per database / per user / on the console, the tracked
parameters follow each client, the timeouts act in transaction mode, two
workers share one global pool budget, and odd or abandoned protocol sequences
never hand a dirty server to the next client.

Every test runs more clients than servers so that sharing really happens, and
proves it from PostgreSQL's side (pg_backend_pid, pg_stat_activity). Protocol-
level prepared statements (max_prepared_statements) are tested elsewhere.
"""

import hashlib
import socket
import random
import struct
import threading
import time

import psycopg
import pytest
from psycopg import errors
from psycopg.pq import TransactionStatus

from conftest import wait_for
from helpers import (
    backend_state, Background, conn_on, pool_row, show, two_workers, wait_reset, wait_running, workers,
)
from pgwire import data_row as decode_row, error_fields, message, PgWire, query_message

# query_wait_timeout well below the default 120 s: a client that would wait for
# a session-bound server fails in seconds instead of minutes
TX = {"pool_mode": "transaction", "query_wait_timeout": 15}
STMT = {"pool_mode": "statement", "query_wait_timeout": 15}
STMT_ERROR = "transaction blocks not allowed in statement pooling mode"


# ---------------------------------------------------------------------------
# helpers: raw extended protocol


def parse_msg(sql, name=""):
    return message(b"P", name.encode() + b"\0" + sql.encode() + b"\0" + struct.pack("!H", 0))


def bind_msg(stmt="", portal=""):
    # no parameter formats, no parameters, no result formats (all text)
    return message(b"B", portal.encode() + b"\0" + stmt.encode() + b"\0" + struct.pack("!HHH", 0, 0, 0))


def describe_portal(portal=""):
    return message(b"D", b"P" + portal.encode() + b"\0")


def describe_statement(name=""):
    return message(b"D", b"S" + name.encode() + b"\0")


def close_msg(kind, name=""):
    """Close of a statement (kind b"S") or portal (b"P")."""
    return message(b"C", kind + name.encode() + b"\0")


def execute_msg(portal="", max_rows=0):
    return message(b"E", portal.encode() + b"\0" + struct.pack("!I", max_rows))


SYNC = message(b"S")
# division by zero at execution (a constant 1/0 would already fail at Bind, when it is planned)
DIV_ZERO = "SELECT 1/(random()*0)::int"
FLUSH = message(b"H")


def extended(sql):
    """Parse/Bind/Describe/Execute of an unnamed statement, without Sync."""
    return parse_msg(sql) + bind_msg() + describe_portal() + execute_msg()


def read_ready(w, count=1):
    """Messages up to and including the count-th ReadyForQuery; fails on EOF."""
    got = []
    for _ in range(count):
        part = w.read_until(b"Z")
        got += part
        assert part and part[-1][0] == b"Z", f"connection closed before ReadyForQuery: {got!r}"
    return got


def read_types(w, types):
    """Reads exactly len(types) messages (ParameterStatus and NoticeResponse
    skipped) and checks their types; returns them."""
    got = []
    while len(got) < len(types):
        m = w.read_msg()
        assert m is not None, f"connection closed after {got!r}, expected {types!r}"
        if m[0] in (b"S", b"N"):
            continue
        got.append(m)
    assert [t for t, _ in got] == list(types), got
    return got


def query(w, sql):
    """Simple Query: (rows, error fields or None, transaction status of the ReadyForQuery)."""
    w.send(query_message(sql))
    rows, err = [], None
    msgs = read_ready(w)
    for mtype, body in msgs:
        if mtype == b"D":
            rows.append(decode_row(body))
        elif mtype == b"E":
            err = error_fields(body)
    return rows, err, msgs[-1][1]


def summary(msgs):
    """What a client sees of a message stream: types, rows, error codes, ReadyForQuery status.
    ParameterStatus and notices are left out (the pooler may report parameters at other points)."""
    out = []
    for mtype, body in msgs:
        if mtype in (b"S", b"N"):
            continue
        if mtype == b"D":
            out.append(("D", tuple(decode_row(body))))
        elif mtype == b"E":
            out.append(("E", error_fields(body).get("C")))
        elif mtype in (b"Z", b"C"):
            out.append((mtype.decode(), body))
        else:
            out.append((mtype.decode(), None))
    return out


def run_until_marker(w, payload):
    """Sends payload followed by a marker query and returns the summary of
    everything received up to the marker's ReadyForQuery."""
    w.send(payload + query_message("SELECT 'end-marker'"))
    msgs = []
    while True:
        m = w.read_msg()
        assert m is not None, f"connection closed, got {summary(msgs)!r}"
        msgs.append(m)
        if m[0] == b"D" and decode_row(m[1]) == ["end-marker"]:
            break
    msgs += read_ready(w)
    return summary(msgs)


# ---------------------------------------------------------------------------
# helpers: pools and backends


def tx_bouncer(bouncer, pg, app, mode=TX, **ini):
    """A pooler whose [databases] postgres entry tags its servers with application_name=app."""
    return bouncer(ini_overrides=dict(mode, **ini),
                   databases={"postgres": pg.connstr("postgres", application_name=app)})


def backends(pg, app, state=None):
    """pids of the PostgreSQL backends of the pooler's servers (tagged with app)."""
    if state is None:
        rows = pg.sql("SELECT pid FROM pg_stat_activity WHERE application_name = %s", [app])
    else:
        rows = pg.sql("SELECT pid FROM pg_stat_activity WHERE application_name = %s AND state LIKE %s",
                      [app, state])
    return {r[0] for r in rows}


def run_counting_backends(pg, app, target, argsets):
    """Runs target(*args) in one thread per argument tuple; returns the most
    server connections of application `app` PostgreSQL had while they ran."""
    threads = [threading.Thread(target=target, args=args) for args in argsets]
    for t in threads:
        t.start()
    most = 0
    while any(t.is_alive() for t in threads):
        most = max(most, len(backends(pg, app)))
        time.sleep(0.01)
    for t in threads:
        t.join()
    return most


def wait_waiting(b, n=1, database="postgres", user="postgres"):
    wait_for(lambda: (pool_row(b, database, user) or {}).get("cl_waiting") == n,
             f"SHOW POOLS to show cl_waiting = {n} for {database}/{user}")


def wait_no_linked_server(b, database="postgres", user="postgres"):
    """Waits until no server of the pool is linked to a client (sv_active = 0)."""
    def settled():
        row = pool_row(b, database, user) or {}
        return row.get("sv_active") == 0 and row.get("sv_tested") == 0 and row
    return wait_for(settled, f"every server of {database}/{user} to be back in the pool")


def expect_close_logged(b, mark, reason, server):
    """The log lines PgBouncer writes when a timeout closes a client (and its server)."""
    b.wait_log(rf"LOG C-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:\d+ closing because: {reason} "
               r"\(age=\d+s\)$", after=mark)
    b.wait_log(rf"WARNING C-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:\d+ pooler error: {reason}$", after=mark)
    if server:
        b.wait_log(rf"LOG S-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:\d+ closing because: {reason} "
                   r"\(age=\d+s\)$", after=mark)


def fresh_table(pg, name, columns="a int, b int"):
    pg.sql(f"DROP TABLE IF EXISTS {name}")
    pg.sql(f"CREATE TABLE {name} ({columns})")
    pg.sql(f"GRANT ALL ON {name} TO PUBLIC")


def client(b, **kw):
    """A psycopg client through the pooler, autocommit unless told otherwise. psycopg's
    automatic server-side preparation is off: protocol-level prepared statements in
    transaction mode (max_prepared_statements) are another file's subject."""
    kw.setdefault("autocommit", True)
    kw.setdefault("prepare_threshold", None)
    return b.connect(**kw)


def pid_of(conn):
    return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def check_shared(b, **kw):
    """Transaction/statement pooling on a pool of one server: a client that is
    connected and idle does not keep the server; both run on the same backend."""
    first = client(b, **kw)
    second = client(b, **kw)
    p1 = pid_of(first)
    p2 = pid_of(second)  # with a session-bound server this waits until query_wait_timeout
    assert p1 == p2, "a pool of one server gave two different backends"
    assert pid_of(first) == p1
    first.close()
    second.close()
    return p1


def check_session_bound(b, **kw):
    """Session pooling on a pool of one server: a second client waits until the
    first one leaves, then gets its server."""
    first = client(b, **kw)
    p1 = pid_of(first)
    second = client(b, **kw)
    job = Background(lambda: pid_of(second))
    wait_waiting(b, 1, kw.get("dbname", "postgres"), kw.get("user", "postgres"))
    assert not job.done()
    first.close()
    assert job.result() == p1
    second.close()


# ---------------------------------------------------------------------------
# 1. transaction pooling


def test_ten_clients_share_two_servers(bouncer, pg):
    """10 clients connected at the same time on default_pool_size = 2: all are
    served, by at most two backends, and idle clients hold no server."""
    app = "tx_share"
    fresh_table(pg, "tx_share_t")
    b = tx_bouncer(bouncer, pg, app, default_pool_size=2)
    conns = [client(b) for _ in range(10)]
    pids = set()
    # one thread, clients taking turns: with session-bound servers the third would wait
    # until query_wait_timeout
    for rnd in range(3):
        for n, conn in enumerate(conns):
            pid, value = conn.execute("SELECT pg_backend_pid(), %s::int", [n * 10 + rnd]).fetchone()
            assert value == n * 10 + rnd
            pids.add(pid)
            # a transaction with two statements in between
            with conn.transaction():
                conn.execute("INSERT INTO tx_share_t VALUES (%s, %s)", [n, rnd])
                pids.add(pid_of(conn))
    assert 1 <= len(pids) <= 2, f"{len(pids)} backends served a pool of 2: {pids}"
    assert pg.sql("SELECT count(*) FROM tx_share_t")[0][0] == 30
    row = wait_no_linked_server(b)
    assert row["cl_active"] == 10 and row["cl_waiting"] == 0, row
    assert row["sv_idle"] + row["sv_used"] <= 2, row
    assert row["pool_mode"] == "transaction", row

    # and concurrently: every client runs transactions in its own thread
    failures = []

    def run_client(n, conn):
        try:
            for i in range(15):
                with conn.transaction():
                    conn.execute("INSERT INTO tx_share_t VALUES (%s, %s)", [n, 100 + i])
                    pid = pid_of(conn)
                    # inside the transaction the backend does not change
                    assert conn.execute("SELECT pg_backend_pid(), count(*) FROM tx_share_t "
                                        "WHERE a = %s AND b = %s", [n, 100 + i]).fetchone() == (pid, 1)
                pids.add(pid)
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            failures.append(repr(e))

    most = run_counting_backends(pg, app, run_client, list(enumerate(conns)))
    assert not failures, failures
    assert pg.sql("SELECT count(*) FROM tx_share_t WHERE b >= 100")[0][0] == 150
    assert 1 <= len(pids) <= 2, f"{len(pids)} backends served a pool of 2: {pids}"
    assert most <= 2, f"{most} server connections for a pool of 2"


def test_server_stays_linked_in_transaction_and_failed_transaction(bouncer, pg):
    """ReadyForQuery 'T' and 'E' keep the server with the client; 'I' gives it back."""
    b = tx_bouncer(bouncer, pg, "tx_linked", default_pool_size=1)
    a = PgWire(b.port)
    a.login()
    rows, err, status = query(a, "SELECT pg_backend_pid()")
    pid = int(rows[0][0])
    assert (err, status) == (None, b"I")
    assert query(a, "BEGIN") == ([], None, b"T")
    xid = query(a, "SELECT txid_current()")[0][0][0]

    other = client(b)
    job = Background(lambda: other.execute(
        "SELECT pg_backend_pid(), txid_current_if_assigned() IS NULL").fetchone())
    wait_waiting(b, 1)
    assert not job.done()
    # still the same transaction on the same backend
    assert query(a, "SELECT pg_backend_pid(), txid_current()")[0] == [[str(pid), xid]]
    # an error: status 'E', the server stays linked
    rows, err, status = query(a, "SELECT 1/0")
    assert (err["C"], status) == ("22012", b"E")
    rows, err, status = query(a, "SELECT 1")
    assert (err["C"], status) == ("25P02", b"E")
    row = pool_row(b)
    assert row["cl_waiting"] == 1 and row["sv_active"] == 1, row
    assert not job.done()
    assert query(a, "ROLLBACK") == ([], None, b"I")
    # released: the waiting client gets the very server, outside any transaction
    assert job.result() == (pid, True)
    assert other.info.transaction_status == TransactionStatus.IDLE
    # and the first client gets it back for its next transaction
    assert query(a, "SELECT pg_backend_pid(), txid_current_if_assigned()") == ([[str(pid), None]], None, b"I")


def test_pipeline_with_syncs_and_error_keeps_server_until_last_ready(bouncer, pg):
    """A client ends a transaction and, in the same write, sends a pipeline of
    extended-protocol segments with several Syncs: an error in the middle (the
    rest of its segment skipped by PostgreSQL), Describe of a statement,
    Execute with a row limit (PortalSuspended), Close, an empty query, and a
    last segment whose Sync comes late (with and without Flush). Another client
    is queued all along: the server must stay with the first client until the
    ReadyForQuery of its last Sync, although several ReadyForQuery 'I' pass by."""
    b = tx_bouncer(bouncer, pg, "tx_pipeline", default_pool_size=1)
    a = PgWire(b.port)
    a.login()
    pid = query(a, "SELECT pg_backend_pid()")[0][0][0]
    assert query(a, "BEGIN") == ([], None, b"T")
    other = client(b)
    job = Background(lambda: pid_of(other))
    wait_waiting(b, 1)

    a.send(query_message("COMMIT")
           + extended("SELECT pg_backend_pid()") + SYNC
           + extended(DIV_ZERO) + extended("SELECT 'skipped after error'") + SYNC
           + parse_msg("SELECT 'described'") + describe_statement() + SYNC
           + parse_msg("SELECT generate_series(1, 3)") + bind_msg() + execute_msg(max_rows=2)
           + execute_msg(max_rows=2) + SYNC
           + close_msg(b"S") + close_msg(b"P") + SYNC
           + parse_msg("") + bind_msg() + execute_msg() + SYNC
           + extended("SELECT pg_backend_pid()") + FLUSH)
    assert read_types(a, [b"C", b"Z"])[1][1] == b"I"
    got = read_types(a, [b"1", b"2", b"T", b"D", b"C", b"Z"])
    assert (decode_row(got[3][1]), got[5][1]) == ([pid], b"I")
    got = read_types(a, [b"1", b"2", b"T", b"E", b"Z"])
    assert (error_fields(got[3][1])["C"], got[4][1]) == ("22012", b"I")
    assert read_types(a, [b"1", b"t", b"T", b"Z"])[3][1] == b"I"
    got = read_types(a, [b"1", b"2", b"D", b"D", b"s", b"D", b"C", b"Z"])
    assert [decode_row(m[1]) for m in got if m[0] == b"D"] == [["1"], ["2"], ["3"]]
    read_types(a, [b"3", b"3", b"Z"])
    read_types(a, [b"1", b"2", b"I", b"Z"])
    got = read_types(a, [b"1", b"2", b"T", b"D", b"C"])
    assert decode_row(got[3][1]) == [pid]

    # the last segment awaits its Sync: the other client is still waiting
    assert not job.done() and pool_row(b)["cl_waiting"] == 1
    # Flush is not a request, and a segment without Sync or Flush is owed answers
    a.send(FLUSH)
    a.send(extended("SELECT 'still mine'") + FLUSH)
    assert decode_row(read_types(a, [b"1", b"2", b"T", b"D", b"C"])[3][1]) == ["still mine"]
    a.send(extended("SELECT 'no flush'"))
    assert not job.done() and pool_row(b)["cl_waiting"] == 1
    a.send(SYNC)
    got = read_types(a, [b"1", b"2", b"T", b"D", b"C", b"Z"])
    assert (decode_row(got[3][1]), got[5][1]) == (["no flush"], b"I")
    assert job.result() == int(pid)
    # the first client is served again, through the pool
    a.send(extended("SELECT 'again'") + SYNC)
    got = read_types(a, [b"1", b"2", b"T", b"D", b"C", b"Z"])
    assert decode_row(got[3][1]) == ["again"]


def test_simple_query_pipeline_behind_queued_client(bouncer, pg):
    """Simple Queries sent in one write (end of a transaction, a whole
    transaction, more statements) by a client whose TimeZone differs from the
    server's, while another client is queued: every answer goes to the right
    client and the queued one is served after the last ReadyForQuery."""
    fresh_table(pg, "tx_simple_pipe", "a int")
    b = tx_bouncer(bouncer, pg, "tx_simple_pipe", default_pool_size=1)
    other = client(b)
    pid = pid_of(other)
    a = PgWire(b.port)
    a.login(options="-c TimeZone=Asia/Tokyo")
    assert query(a, "BEGIN") == ([], None, b"T")
    job = Background(lambda: other.execute("SELECT pg_backend_pid(), current_setting('TimeZone'), "
                                           "(SELECT count(*) FROM tx_simple_pipe)").fetchone())
    wait_waiting(b, 1)
    statements = ["COMMIT", "SELECT current_setting('TimeZone'), pg_backend_pid()", "BEGIN",
                  "INSERT INTO tx_simple_pipe VALUES (1)", "SELECT count(*) FROM tx_simple_pipe",
                  "COMMIT", "SELECT 'last'"]
    a.send(b"".join(query_message(q) for q in statements))
    answers = []
    for _ in statements:
        msgs = read_ready(a)
        answers.append(([decode_row(m[1]) for m in msgs if m[0] == b"D"], msgs[-1][1]))
    assert answers == [([], b"I"), ([["Asia/Tokyo", str(pid)]], b"I"), ([], b"T"), ([], b"T"),
                       ([["1"]], b"T"), ([], b"I"), ([["last"]], b"I")]
    server_tz = pg.sql("SHOW TimeZone")[0][0]
    assert job.result() == (pid, server_tz, 1)
    assert query(a, "SHOW TimeZone") == ([["Asia/Tokyo"]], None, b"I")


def test_server_kept_until_result_reaches_slow_client(bouncer, pg):
    """A client that reads its large result slowly keeps the server until the
    pooler has passed everything on; the queued client is served afterwards and
    both results are intact."""
    b = tx_bouncer(bouncer, pg, "tx_slow_reader", default_pool_size=1)
    other = client(b)
    pid = pid_of(other)
    w = PgWire(b.port, host=str(b.dir))  # unix socket: small buffers towards the client
    w.login()
    rows = 3000
    big = f"SELECT i, repeat('r', 1000) FROM generate_series(1, {rows}) i"
    w.send(query_message(big))
    wait_for(lambda: (backend_state(pg, pid) or (None, None))[1] == big, "PostgreSQL to run the big query")
    job = Background(lambda: other.execute("SELECT 'other', pg_backend_pid()").fetchone())
    wait_waiting(b, 1)
    got = 0
    for mtype, body in iter(w.read_msg, None):
        if mtype == b"D":
            got += 1
            row = decode_row(body)
            assert row == [str(got), "r" * 1000], row[0]
            if got == 100:
                # most of the result is still on its way: the server is not free yet
                assert pool_row(b)["cl_waiting"] == 1 and not job.done()
        elif mtype == b"Z":
            assert body == b"I"
            break
    assert got == rows
    assert job.result() == ("other", pid)
    assert query(w, "SELECT 'after'") == ([["after"]], None, b"I")


def test_pause_waits_for_transactions_not_for_clients(bouncer, pg):
    """PAUSE in transaction mode waits for the transactions in progress to end
    (spec/admin.md), not for clients to disconnect; queries sent while paused
    wait and run after RESUME, on the same connections."""
    app = "tx_pause"
    b = tx_bouncer(bouncer, pg, app, default_pool_size=2)
    idle = client(b)
    pid_of(idle)  # connected, between transactions
    in_tx = client(b, autocommit=False)
    pid = pid_of(in_tx)  # inside a transaction
    admin = b.admin()
    pause = Background(lambda: admin.execute("PAUSE").statusmessage)
    # the transaction goes on while the PAUSE waits for it
    assert in_tx.execute("SELECT pg_backend_pid(), 'still in my transaction'").fetchone() == (
        pid, "still in my transaction")
    assert not pause.done()
    in_tx.commit()
    assert pause.result() == "PAUSE"
    wait_for(lambda: not backends(pg, app), "the paused pool's servers to be closed")
    job = Background(lambda: idle.execute("SELECT 'after resume'").fetchone())
    wait_waiting(b, 1)
    admin.execute("RESUME")
    assert job.result() == ("after resume",)
    assert in_tx.execute("SELECT 'in_tx too'").fetchone() == ("in_tx too",)
    in_tx.commit()


def test_large_messages_and_executemany_with_shared_server(bouncer, pg):
    """Multi-megabyte parameters and results, and executemany's long
    Bind/Execute pipelines, in transaction mode on a shared server: the
    pooler follows message boundaries far beyond its buffer size."""
    fresh_table(pg, "tx_big", "a int, t text")
    b = tx_bouncer(bouncer, pg, "tx_big", default_pool_size=1)
    a = client(b)
    other = client(b)
    pid = pid_of(other)
    payload = "0123456789" * 600_000
    assert a.execute("SELECT length(%s), md5(%s), pg_backend_pid()", [payload, payload]).fetchone() == (
        len(payload), hashlib.md5(payload.encode()).hexdigest(), pid)
    assert pid_of(other) == pid
    assert a.execute("SELECT repeat('abcdefgh', 1000000)").fetchone()[0] == "abcdefgh" * 1000000
    assert pid_of(other) == pid
    with a.cursor() as cur:
        cur.executemany("INSERT INTO tx_big VALUES (%s, %s)", [(i, "x" * (i % 300)) for i in range(3000)])
    assert other.execute("SELECT count(*), sum(a) FROM tx_big").fetchone() == (3000, sum(range(3000)))
    with a.transaction():
        with a.cursor() as cur:
            cur.executemany("INSERT INTO tx_big VALUES (%s, %s)", [(i, "y") for i in range(3000)])
    assert other.execute("SELECT count(*) FROM tx_big").fetchone() == (6000,)


def test_server_killed_between_transactions_is_invisible(bouncer, pg):
    """PostgreSQL terminates the pool's server while its clients are between
    transactions: none of them held it, so none of them sees an error; their
    next queries run on a new server. One killed inside a transaction ends
    that client's connection only."""
    app = "tx_killed"
    b = tx_bouncer(bouncer, pg, app, default_pool_size=1)
    a = client(b)
    c = client(b)
    pid = pid_of(a)
    assert pid_of(c) == pid
    mark = b.log_mark()
    pg.sql("SELECT pg_terminate_backend(%s)", [pid])
    # (once the pooler has seen it go: a query racing the close would be a different test)
    b.wait_log(r"S-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:\d+ closing because", after=mark)
    new_a = pid_of(a)
    assert new_a != pid and pid_of(c) == new_a
    # inside a transaction the client holding the server does see it go
    in_tx = client(b, autocommit=False)
    assert pid_of(in_tx) == new_a
    pg.sql("SELECT pg_terminate_backend(%s)", [new_a])
    with pytest.raises(psycopg.OperationalError):
        in_tx.execute("SELECT 1")
    assert pid_of(a) not in (pid, new_a)
    assert c.execute("SELECT 'c fine'").fetchone() == ("c fine",)


def test_copy_in_and_out_with_shared_server(bouncer, pg):
    """COPY FROM STDIN / TO STDOUT outside and inside a transaction while
    another client shares the only server."""
    fresh_table(pg, "tx_copy", "id int, t text")
    b = tx_bouncer(bouncer, pg, "tx_copy", default_pool_size=1)
    a = client(b)
    other = client(b)
    pid = pid_of(a)
    with a.cursor() as cur:
        with cur.copy("COPY tx_copy (id, t) FROM STDIN") as copy:
            for i in range(5000):
                copy.write_row((i, f"line {i}"))
    assert pid_of(other) == pid  # the server went back after the COPY
    rows = []
    with a.cursor() as cur:
        with cur.copy("COPY (SELECT id, t FROM tx_copy ORDER BY id) TO STDOUT") as copy:
            rows.extend(copy.rows())
    assert len(rows) == 5000 and rows[0] == ("0", "line 0") and rows[-1] == ("4999", "line 4999")
    assert other.execute("SELECT count(*) FROM tx_copy").fetchone() == (5000,)

    # inside a transaction: the server stays with the copying client until COMMIT
    a.autocommit = False
    with a.cursor() as cur:
        with cur.copy("COPY tx_copy (id, t) FROM STDIN") as copy:
            for i in range(5000, 5100):
                copy.write_row((i, "in tx"))
    job = Background(lambda: other.execute("SELECT count(*) FROM tx_copy").fetchone())
    wait_waiting(b, 1)
    with a.cursor() as cur:
        with cur.copy("COPY (SELECT count(*) FROM tx_copy) TO STDOUT") as copy:
            assert list(copy.rows()) == [("5100",)]
    assert not job.done()
    a.commit()
    assert job.result() == (5100,)


@pytest.mark.parametrize("end", ["copydone", "copyfail"])
def test_extended_protocol_copy_with_early_sync(bouncer, pg, end):
    """COPY FROM STDIN through Parse/Bind/Execute with the Sync sent at once, as
    libpq's PQexecParams does, then the data, CopyDone or CopyFail, and
    libpq's second Sync: PostgreSQL ignores the first Sync during COPY and
    answers one ReadyForQuery. The client sees what PostgreSQL sends, the
    queued client gets the server after that ReadyForQuery."""
    fresh_table(pg, "tx_extcopy", "a int")
    b = tx_bouncer(bouncer, pg, "tx_extcopy", default_pool_size=1)
    finish = message(b"c") if end == "copydone" else message(b"f", b"changed my mind\0")

    def run(w):
        w.send(parse_msg("COPY tx_extcopy FROM STDIN") + bind_msg() + execute_msg() + SYNC)
        first = summary(read_types(w, [b"1", b"2", b"G"]))
        w.send(message(b"d", b"1\n2\n") + finish + SYNC)
        return first, summary(read_ready(w))

    direct = PgWire(pg.port)
    direct.login()
    expected = run(direct)
    direct.close()
    assert expected[1][-1] == ("Z", b"I")
    pg.sql("TRUNCATE tx_extcopy")

    other = client(b)
    pid = pid_of(other)
    a = PgWire(b.port)
    a.login()
    a.send(parse_msg("COPY tx_extcopy FROM STDIN") + bind_msg() + execute_msg() + SYNC)
    assert summary(read_types(a, [b"1", b"2", b"G"])) == expected[0]
    job = Background(lambda: other.execute("SELECT pg_backend_pid(), count(*) FROM tx_extcopy").fetchone())
    wait_waiting(b, 1)  # the server is inside the COPY
    a.send(message(b"d", b"1\n2\n") + finish + SYNC)
    assert summary(read_ready(a)) == expected[1]
    assert job.result() == (pid, 2 if end == "copydone" else 0)
    assert run_until_marker(a, b"") == [("T", None), ("D", ("end-marker",)), ("C", b"SELECT 1\0"), ("Z", b"I")]


def test_copy_fail_from_client_releases_clean_server(bouncer, pg):
    """A client CopyFail: PostgreSQL's error reaches the client, nothing is
    inserted, and the server serves the next client normally."""
    fresh_table(pg, "tx_copyfail", "a int")
    b = tx_bouncer(bouncer, pg, "tx_copyfail", default_pool_size=1)
    a = PgWire(b.port)
    a.login()
    pid = query(a, "SELECT pg_backend_pid()")[0][0][0]
    a.send(query_message("COPY tx_copyfail FROM STDIN"))
    read_types(a, [b"G"])
    a.send(message(b"d", b"1\n2\n"))
    a.send(message(b"f", b"client gave up\0"))
    msgs = read_types(a, [b"E", b"Z"])
    err = error_fields(msgs[0][1])
    assert err["C"] == "57014" and "client gave up" in err["M"], err
    assert msgs[1][1] == b"I"
    with client(b) as other:
        assert other.execute("SELECT pg_backend_pid(), count(*) FROM tx_copyfail").fetchone() == (int(pid), 0)
        assert other.info.transaction_status == TransactionStatus.IDLE
    assert query(a, "SELECT 'after copyfail'") == ([["after copyfail"]], None, b"I")


def test_copy_error_before_copydone(bouncer, pg):
    """PostgreSQL rejects a row before the client sent CopyDone; the client's
    late CopyData/CopyDone go nowhere and both clients keep working. Inside a
    transaction the failed COPY keeps the server until ROLLBACK."""
    fresh_table(pg, "tx_copyerr", "a int")
    b = tx_bouncer(bouncer, pg, "tx_copyerr", default_pool_size=1)
    a = PgWire(b.port)
    a.login()
    pid = query(a, "SELECT pg_backend_pid()")[0][0][0]
    a.send(query_message("COPY tx_copyerr FROM STDIN"))
    read_types(a, [b"G"])
    a.send(message(b"d", b"notanumber\n"))
    msgs = read_types(a, [b"E", b"Z"])
    assert error_fields(msgs[0][1])["C"] == "22P02"
    assert msgs[1][1] == b"I"
    with client(b) as other:
        assert pid_of(other) == int(pid)
        # the late rest of the COPY, then a query: the client sees only its query's answer
        a.send(message(b"d", b"2\n") + message(b"c"))
        assert query(a, "SELECT 'after copy error'") == ([["after copy error"]], None, b"I")
        assert other.execute("SELECT count(*) FROM tx_copyerr").fetchone() == (0,)

        # the same inside a transaction
        assert query(a, "BEGIN") == ([], None, b"T")
        a.send(query_message("COPY tx_copyerr FROM STDIN"))
        read_types(a, [b"G"])
        a.send(message(b"d", b"3\n") + message(b"d", b"bad\n"))
        msgs = read_types(a, [b"E", b"Z"])
        assert error_fields(msgs[0][1])["C"] == "22P02"
        assert msgs[1][1] == b"E"
        a.send(message(b"c"))
        job = Background(lambda: other.execute("SELECT count(*) FROM tx_copyerr").fetchone())
        wait_waiting(b, 1)
        assert not job.done()
        rows, err, status = query(a, "SELECT 1")
        assert (err["C"], status) == ("25P02", b"E")
        assert query(a, "ROLLBACK") == ([], None, b"I")
        assert job.result() == (0,)
    assert pg.sql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tx_copyerr' "
                  "AND state <> 'idle'")[0][0] == 0


COPY_AHEAD = {
    # asyncpg's copy_records_to_table: the Query, the data and CopyDone in one write
    "simple": (query_message("COPY tx_copyahead FROM STDIN") + message(b"d", b"1\n2\n") + message(b"c"), 1, 2),
    # the extended protocol with libpq's early Sync and the Sync after CopyDone, all at once
    "extended": (parse_msg("COPY tx_copyahead FROM STDIN") + bind_msg() + execute_msg() + SYNC +
                 message(b"d", b"1\n2\n") + message(b"c") + SYNC, 1, 2),
    # the COPY fails: the server ignores the data that follows
    "failed": (query_message("COPY tx_no_such_table FROM STDIN") + message(b"d", b"1\n") + message(b"c"), 1, 0),
    # in a transaction block, with the next statements behind
    "transaction": (query_message("BEGIN") + query_message("COPY tx_copyahead FROM STDIN") +
                    message(b"d", b"1\n2\n3\n") + message(b"c") + query_message("SELECT count(*) FROM tx_copyahead") +
                    query_message("COMMIT"), 4, 3),
}


@pytest.mark.parametrize("case", list(COPY_AHEAD))
def test_copy_data_sent_before_copy_in_response(bouncer, pg, case):
    """A client that sends its COPY data and CopyDone right behind the COPY,
    without waiting for CopyInResponse, as asyncpg's copy_records_to_table
    does: it gets what PostgreSQL answers a direct connection (the rows
    copied), and the server goes back to the pool for the next client."""
    payload, readies, rows = COPY_AHEAD[case]
    fresh_table(pg, "tx_copyahead", "a int")
    direct = PgWire(pg.port)
    direct.login()
    direct.send(payload)
    expected = summary(read_ready(direct, readies))
    direct.close()
    assert expected[-1] == ("Z", b"I")
    pg.sql("TRUNCATE tx_copyahead")

    b = tx_bouncer(bouncer, pg, "tx_copyahead", default_pool_size=1)
    other = client(b)
    pid = pid_of(other)
    a = PgWire(b.port)
    a.login()
    a.send(payload)
    assert summary(read_ready(a, readies)) == expected
    job = Background(lambda: other.execute("SELECT pg_backend_pid(), count(*) FROM tx_copyahead").fetchone())
    assert job.result() == (pid, rows)
    assert query(a, "SELECT 'after copy'") == ([["after copy"]], None, b"I")


@pytest.mark.parametrize("state", ["in-transaction", "failed-transaction", "in-copy", "terminate"])
def test_client_disconnect_mid_transaction_never_lends_dirty_server(bouncer, pg, state):
    """A client leaves inside a transaction (open, aborted, or in the middle of
    a COPY): its server is closed, not lent, and the next client sees nothing of it."""
    app = "tx_dirty"
    fresh_table(pg, "tx_dirty_t", "a int")
    default_work_mem = pg.sql("SHOW work_mem")[0][0]
    b = tx_bouncer(bouncer, pg, app, default_pool_size=1)
    c = client(b)  # the next client of that server, connected all along
    pid = pid_of(c)
    a = PgWire(b.port)
    a.login()
    assert query(a, "SELECT pg_backend_pid()")[0] == [[str(pid)]]
    assert query(a, "BEGIN")[2] == b"T"
    assert query(a, "SET LOCAL work_mem = '13MB'")[1] is None
    assert query(a, "INSERT INTO tx_dirty_t VALUES (1)")[1] is None
    assert query(a, "CREATE TEMP TABLE tx_dirty_tmp (a int)")[1] is None
    if state == "failed-transaction":
        assert query(a, "SELECT 1/0")[2] == b"E"
    elif state == "in-copy":
        a.send(query_message("COPY tx_dirty_t FROM STDIN"))
        read_types(a, [b"G"])
        a.send(message(b"d", b"5\n6\n"))
    elif state == "terminate":
        a.send(message(b"X"))  # a polite goodbye, inside the transaction
        assert a.at_eof()
    a.close()

    # PostgreSQL's side: that server connection is closed, its transaction rolled back with it
    wait_for(lambda: backend_state(pg, pid) is None, "the server left inside a transaction to be closed")
    got = c.execute("SELECT current_setting('work_mem'), txid_current_if_assigned(), "
                    "(SELECT count(*) FROM tx_dirty_t), to_regclass('pg_temp.tx_dirty_tmp'), "
                    "pg_backend_pid() <> %s", [pid]).fetchone()
    assert got == (default_work_mem, None, 0, None, True)
    assert c.info.transaction_status == TransactionStatus.IDLE
    assert c.execute("SELECT 'clean'").fetchone() == ("clean",)
    assert pg.sql("SELECT count(*) FROM tx_dirty_t")[0][0] == 0
    assert not backends(pg, app, "idle in transaction%")


def test_cancel_reaches_the_server_the_client_holds(bouncer, pg):
    """Two clients sleep on two servers; cancelling one stops that one only. Inside
    a transaction the cancelled client keeps its server (status 'E')."""
    b = tx_bouncer(bouncer, pg, "tx_cancel", default_pool_size=2)
    idle = client(b)  # a third client, idle between transactions: holds no server
    idle_pid = pid_of(idle)
    a = client(b, autocommit=False)  # not autocommit: the sleep runs inside a transaction
    other = client(b)
    pid_of(a)
    job_a = Background(lambda: a.execute("SELECT pg_sleep(30)"))
    a_pid = wait_running(pg, "SELECT pg_sleep(30)")
    job_other = Background(lambda: other.execute("SELECT pg_sleep(1.5), pg_backend_pid()").fetchone())
    other_pid = wait_running(pg, "SELECT pg_sleep(1.5)")
    assert other_pid != a_pid
    a.cancel()
    with pytest.raises(errors.QueryCanceled) as exc:
        job_a.result()
    assert exc.value.sqlstate == "57014"
    assert job_other.result() == ("", other_pid)
    # the cancelled client is in a failed transaction on the same server
    assert a.info.transaction_status == TransactionStatus.INERROR
    a.rollback()
    with a.transaction():
        assert pid_of(a) == a_pid
    assert pid_of(idle) in (a_pid, other_pid) and idle_pid in (a_pid, other_pid)


def test_cancel_after_release_cancels_nothing(bouncer, pg):
    """A client whose server went back to the pool sends a cancel while another
    client runs a query on that very server: that query completes. Nor does
    the cancel of a queued client touch the query of the client it waits for."""
    b = tx_bouncer(bouncer, pg, "tx_cancel_late", default_pool_size=1)
    a = client(b)
    other = client(b)
    pid = pid_of(a)
    job = Background(lambda: other.execute("SELECT pg_sleep(2), pg_backend_pid()").fetchone())
    assert wait_running(pg, "SELECT pg_sleep(2)") == pid
    a.cancel()  # libpq waits until the pooler closed the cancel connection
    a.cancel()
    assert job.result() == ("", pid)
    assert a.execute("SELECT 'a fine'").fetchone() == ("a fine",)

    # a cancel from a client that is queued for a server (holds none) cancels nothing
    holder = client(b, autocommit=False)  # its sleep runs inside a transaction
    holder_job = Background(lambda: holder.execute("SELECT pg_sleep(1.5), 'holder'").fetchone())
    assert wait_running(pg, "SELECT pg_sleep(1.5)") == pid
    job = Background(lambda: a.execute("SELECT 'queued, then served', pg_backend_pid()").fetchone())
    wait_waiting(b, 1)
    a.cancel()
    assert holder_job.result() == ("", "holder")
    assert not job.done()
    holder.commit()
    assert job.result() == ("queued, then served", pid)


def test_psycopg_pipeline_mode_with_shared_server(bouncer, pg):
    """psycopg's pipeline mode (many statements, one Sync, an error in the
    middle) on a server shared with another client."""
    b = tx_bouncer(bouncer, pg, "tx_psy_pipeline", default_pool_size=1)
    a = client(b)
    other = client(b)
    pid = pid_of(other)
    with a.pipeline():
        curs = [a.execute("SELECT %s::int, pg_backend_pid()", [i]) for i in range(20)]
    assert [c.fetchone() for c in curs] == [(i, pid) for i in range(20)]
    assert pid_of(other) == pid
    with pytest.raises(errors.DivisionByZero):
        with a.pipeline() as p:
            a.execute("SELECT %s::int", [1])
            a.execute("SELECT 1 / %s::int", [0])
            a.execute("SELECT %s::int", [3])
            p.sync()
    assert pid_of(other) == pid
    assert a.info.transaction_status == TransactionStatus.IDLE
    with a.pipeline():
        with a.transaction():
            a.execute("SELECT %s::int", [4])
            cur = a.execute("SELECT pg_backend_pid(), txid_current_if_assigned() IS NULL")
    assert cur.fetchone() == (pid, True)
    assert a.execute("SELECT 'after pipelines'").fetchone() == ("after pipelines",)


def test_cancels_racing_releases_never_hit_another_client(bouncer, pg):
    """A client cancels its short queries at every possible moment (queued,
    running, just finished) while another client keeps the shared server busy:
    only the canceller's own queries are ever cancelled."""
    b = tx_bouncer(bouncer, pg, "tx_cancel_race", default_pool_size=1)
    a = client(b)
    victim = client(b)
    pid_of(a)
    stop = threading.Event()

    def victim_queries():
        n = 0
        while not stop.is_set():
            assert victim.execute("SELECT pg_sleep(0.01), %s::int", [n]).fetchone() == ("", n)
            n += 1
        return n

    job = Background(victim_queries)
    outcomes = {"done": 0, "cancelled": 0}
    try:
        for i in range(40):
            q = Background(lambda: a.execute("SELECT pg_sleep(0.02)"))
            time.sleep(random.uniform(0, 0.05))  # jitter: cancel at every stage of the query
            a.cancel()
            try:
                q.result()
                outcomes["done"] += 1
            except errors.QueryCanceled:
                outcomes["cancelled"] += 1
    finally:
        stop.set()
    assert job.result() > 0  # raises QueryCanceled if a cancel hit the victim
    assert victim.execute("SELECT 'victim fine'").fetchone() == ("victim fine",)
    assert a.execute("SELECT 'a fine'").fetchone() == ("a fine",)
    assert outcomes["done"] + outcomes["cancelled"] == 40


# ---------------------------------------------------------------------------
# 2. statement pooling


def test_statement_mode_shares_servers(bouncer, pg):
    app = "stmt_share"
    b = tx_bouncer(bouncer, pg, app, mode=STMT, default_pool_size=2)
    conns = [client(b) for _ in range(6)]
    pids = set()
    for rnd in range(3):
        for n, conn in enumerate(conns):
            pid, value = conn.execute("SELECT pg_backend_pid(), %s::int", [n + rnd]).fetchone()
            assert value == n + rnd
            pids.add(pid)
        # several statements in one Query are one implicit transaction: allowed
        cur = conns[0].execute("SELECT 1; SELECT 2")
        assert cur.fetchall() == [(1,)] and cur.nextset() and cur.fetchall() == [(2,)]
    assert 1 <= len(pids) <= 2, pids
    row = wait_no_linked_server(b)
    assert row["pool_mode"] == "statement" and row["cl_active"] == 6, row


def test_statement_mode_refuses_transaction_block(bouncer, pg):
    """BEGIN in statement mode: FATAL 08P01, the server is closed rather than
    reused inside the transaction, and the next client gets a clean server.
    As with PgBouncer, the error comes alone: the answers of the request that
    opened the block (its CommandComplete BEGIN) are not passed on first, so
    that a driver reports the error and not a confusing "received 2 results
    from command 'BEGIN'" (psycopg 3.3)."""
    app = "stmt_begin"
    b = tx_bouncer(bouncer, pg, app, mode=STMT, default_pool_size=1)
    mark = b.log_mark()
    w = PgWire(b.port)
    w.login()
    pid = int(query(w, "SELECT pg_backend_pid()")[0][0][0])
    w.send(query_message("BEGIN"))
    w.expect_fatal(STMT_ERROR, alone=True)
    wait_for(lambda: backend_state(pg, pid) is None, "the server left in a transaction block to be closed")
    b.wait_log(STMT_ERROR, after=mark)
    with client(b) as c:
        assert c.execute("SELECT pg_backend_pid() <> %s, txid_current_if_assigned()", [pid]).fetchone() == (
            True, None)
        assert c.info.transaction_status == TransactionStatus.IDLE
    # a driver opening a transaction (psycopg without autocommit sends BEGIN first)
    conn = client(b, autocommit=False)
    with pytest.raises(psycopg.OperationalError, match=STMT_ERROR):
        conn.execute("SELECT 1")
    # an extended-protocol BEGIN too
    w = PgWire(b.port)
    w.login()
    w.send(extended("BEGIN") + SYNC)
    w.expect_fatal(STMT_ERROR, alone=True)
    # a Query whose statements close the block they open is fine (doc/transaction.md);
    # one that leaves it open is not
    w = PgWire(b.port)
    w.login()
    assert query(w, "BEGIN; SELECT 'closed block'; COMMIT") == ([["closed block"]], None, b"I")
    w.send(query_message("SELECT 1; BEGIN"))
    w.expect_fatal(STMT_ERROR, alone=True)
    # a row too large for one read went out in part: the client gets it whole, then the error
    w = PgWire(b.port)
    w.login()
    w.send(query_message("SELECT repeat('x', 300000); BEGIN"))
    msgs = w.read_until(b"E")
    assert [m[0] for m in msgs] == [b"T", b"D", b"C", b"C", b"E"], [m[0] for m in msgs]
    assert msgs[1][1].endswith(b"x" * 1000) and len(msgs[1][1]) == 2 + 4 + 300000
    assert b"M" + STMT_ERROR.encode() in msgs[-1][1]
    assert w.at_eof()
    # a pipeline of statements ending in one Sync runs as one implicit transaction
    with client(b) as c:
        with c.pipeline():
            curs = [c.execute("SELECT %s::int", [i]) for i in range(3)]
        assert [cur.fetchone() for cur in curs] == [(0,), (1,), (2,)]
    wait_for(lambda: not backends(pg, app, "idle in transaction%"), "no server left in a transaction")
    with client(b) as c:
        assert c.execute("SELECT 'still served'").fetchone() == ("still served",)


def test_statement_mode_refuses_block_inside_pipeline(bouncer, pg):
    """A transaction block opened by one request of a pipeline and closed by a
    later one (a Query per statement sent together, or extended-protocol
    segments each ending in a Sync) is refused at the first ReadyForQuery that
    says 'T' or 'E', as with PgBouncer: statement mode must not let a
    multi-statement transaction through because the client pipelined it."""
    app = "stmt_pipe"
    b = tx_bouncer(bouncer, pg, app, mode=STMT, default_pool_size=1)
    pipelines = [
        query_message("BEGIN") + query_message("SELECT 2") + query_message("COMMIT"),
        query_message("BEGIN") + query_message(DIV_ZERO) + query_message("ROLLBACK"),
        extended("BEGIN") + SYNC + extended("SELECT 2") + SYNC + extended("COMMIT") + SYNC,
    ]
    for data in pipelines:
        w = PgWire(b.port)
        w.login()
        w.send(data)
        w.expect_fatal(STMT_ERROR, alone=True)
    wait_for(lambda: not backends(pg, app, "idle in transaction%"), "no server left in a transaction")
    with client(b) as c:
        assert c.execute("SELECT 'still served'").fetchone() == ("still served",)
        assert c.info.transaction_status == TransactionStatus.IDLE


# ---------------------------------------------------------------------------
# 3. pool_mode per database, per user, on the console


def test_pool_mode_per_database(bouncer, pg):
    b = bouncer(ini_overrides={"default_pool_size": 1, "query_wait_timeout": 15},
                databases={"txdb": pg.connstr("postgres", pool_mode="transaction"),
                           "stmtdb": pg.connstr("postgres", pool_mode="statement"),
                           "sessdb": pg.connstr("postgres")})
    with b.admin() as admin:
        modes = {r["name"]: r["pool_mode"] for r in show(admin, "DATABASES")}
    assert (modes["txdb"], modes["stmtdb"], modes["sessdb"]) == ("transaction", "statement", None)
    check_shared(b, dbname="txdb")
    check_shared(b, dbname="stmtdb")
    check_session_bound(b, dbname="sessdb")
    assert pool_row(b, "txdb")["pool_mode"] == "transaction"
    assert pool_row(b, "stmtdb")["pool_mode"] == "statement"
    assert pool_row(b, "sessdb")["pool_mode"] == "session"
    # transaction blocks: fine in txdb, refused in stmtdb
    with client(b, dbname="txdb", autocommit=False) as conn:
        with conn.transaction():
            assert conn.execute("SELECT txid_current_if_assigned() IS NULL").fetchone() == (True,)
    w = PgWire(b.port)
    w.login(database="stmtdb")
    w.send(query_message("BEGIN"))
    w.expect_fatal(STMT_ERROR)


def test_pool_mode_per_user_wins_over_database(bouncer, pg):
    """[users] pool_mode applies to that user's pools and wins over the
    database's; other users keep the database's mode."""
    pg.create_role("tx_user", password="pw")
    b = bouncer(ini_overrides={"default_pool_size": 1, "query_wait_timeout": 15}, start=False,
                users_txt='"postgres" "postgres"\n"pgbouncer" "pgbouncer"\n"tx_user" "pw"\n',
                databases={"postgres": pg.connstr("postgres"),
                           "stmtdb": pg.connstr("postgres", pool_mode="statement")})
    b.write_ini(text=b.render_ini() + "[users]\ntx_user = pool_mode=transaction\n")
    b.start()
    with b.admin() as admin:
        users = {r["name"]: r["pool_mode"] for r in show(admin, "USERS")}
    assert users["tx_user"] == "transaction"
    check_shared(b, user="tx_user")
    check_session_bound(b, user="postgres")
    assert pool_row(b, "postgres", "tx_user")["pool_mode"] == "transaction"
    assert pool_row(b, "postgres", "postgres")["pool_mode"] == "session"
    # on a statement-mode database the user's transaction mode wins
    check_shared(b, dbname="stmtdb", user="tx_user")
    with client(b, dbname="stmtdb", user="tx_user", autocommit=False) as conn:
        with conn.transaction():
            conn.execute("SELECT 1")
            assert conn.info.transaction_status == TransactionStatus.INTRANS
    assert pool_row(b, "stmtdb", "tx_user")["pool_mode"] == "transaction"
    w = PgWire(b.port)
    w.login(database="stmtdb")  # user postgres: the database's statement mode
    w.send(query_message("BEGIN"))
    w.expect_fatal(STMT_ERROR)


def test_console_set_pool_mode(bouncer, pg):
    """SET pool_mode on the console is answered, shown by SHOW CONFIG and SHOW
    POOLS, and acts at the pool's next decision (doc/transaction.md: for clients
    already connected too)."""
    b = bouncer(ini_overrides={"default_pool_size": 1, "query_wait_timeout": 15})
    check_session_bound(b)
    held = client(b)
    held_pid = pid_of(held)  # session mode: this client keeps the only server
    admin = b.admin()
    assert admin.execute("SET pool_mode = transaction").statusmessage == "SET pool_mode=transaction"
    assert {r["key"]: r["value"] for r in show(admin, "CONFIG")}["pool_mode"] == "transaction"
    assert pool_row(b)["pool_mode"] == "transaction"
    # the connected client's next transaction ends with the server going back
    assert pid_of(held) == held_pid
    assert check_shared(b) == held_pid
    assert pid_of(held) == held_pid
    assert admin.execute("SET pool_mode = statement").statusmessage == "SET pool_mode=statement"
    assert pool_row(b)["pool_mode"] == "statement"
    w = PgWire(b.port)
    w.login()
    w.send(query_message("BEGIN"))
    w.expect_fatal(STMT_ERROR)
    # the console itself is always in statement mode
    assert pool_row(b, "pgbouncer", "pgbouncer")["pool_mode"] == "statement"
    admin.close()


def test_reload_changes_pool_mode(bouncer, pg):
    """pool_mode changed in the file and reloaded (SIGHUP) applies as SET does."""
    b = bouncer(ini_overrides={"default_pool_size": 1, "query_wait_timeout": 15})
    check_session_bound(b)
    b.update(pool_mode="transaction")
    b.write_ini()
    b.reload()

    def mode():
        with b.admin() as admin:
            return {r["key"]: r["value"] for r in show(admin, "CONFIG")}["pool_mode"] == "transaction"

    wait_for(mode, "SHOW CONFIG to show the reloaded pool_mode")
    assert pool_row(b)["pool_mode"] == "transaction"
    check_shared(b)


@pytest.mark.parametrize("old,new", [("session", "transaction"), ("transaction", "session"),
                                     ("transaction", "statement"), ("statement", "session")])
def test_pool_mode_changed_while_a_request_runs(bouncer, pg, old, new):
    """SET pool_mode while a client's request is on the server: its answers are
    those of the mode it was sent under (the pooler's own Parse and Describe of a
    renamed statement stay swallowed, nothing is taken for an answer to no
    request), and the new mode applies from the client's next request."""
    b = bouncer(ini_overrides={"pool_mode": old, "default_pool_size": 2, "query_wait_timeout": 15})
    w = PgWire(b.port)
    w.login()
    sleep = "SELECT pg_sleep(0.5)::text || 'slept'"
    w.send(parse_msg(sleep, "mode_s") + bind_msg("mode_s") + describe_portal() + execute_msg() + SYNC)
    with b.admin() as admin:
        wait_for(lambda: pg.sql("SELECT 1 FROM pg_stat_activity WHERE state = 'active' AND query = %s", [sleep]),
                 "the statement to run")
        admin.execute(f"SET pool_mode = {new}")
    assert summary(read_ready(w)) == [("1", None), ("2", None), ("T", None), ("D", ("slept",)),
                                      ("C", b"SELECT 1\0"), ("Z", b"I")]
    rows, err, status = query(w, "SELECT 'after'")
    assert (rows, err, status) == ([["after"]], None, b"I")
    w.close()
    # the new mode is in force: transaction and statement modes share one server between two clients
    if new != "session":
        with b.admin() as admin:
            admin.execute("SET default_pool_size = 1")
        check_shared(b)
    assert "to no request" not in b.log_text()


def test_transaction_begun_before_statement_mode_ends_normally(bouncer, pg):
    """A transaction begun in transaction mode runs to its COMMIT after SET
    pool_mode = statement; the client's next transaction block is refused."""
    b = bouncer(ini_overrides={**TX, "default_pool_size": 2})
    w = PgWire(b.port)
    w.login()
    assert query(w, "BEGIN")[2] == b"T"
    with b.admin() as admin:
        admin.execute("SET pool_mode = statement")
    assert query(w, "SELECT 'inside'") == ([["inside"]], None, b"T")
    assert query(w, "COMMIT")[1:] == (None, b"I")
    assert query(w, "SELECT 'after'")[0] == [["after"]]
    w.send(query_message("BEGIN"))
    w.expect_fatal(STMT_ERROR)


def test_session_client_between_requests_follows_new_mode(bouncer, pg):
    """A session-mode client that holds its server and pipelines two requests
    keeps it until both are answered, then gives it back once the pool is in
    transaction mode: its pipeline is answered in full and in order."""
    b = bouncer(ini_overrides={"default_pool_size": 1, "query_wait_timeout": 15})
    w = PgWire(b.port)
    w.login()
    assert query(w, "SELECT 1")[2] == b"I"  # session mode: holds the only server from now on
    with b.admin() as admin:
        admin.execute("SET pool_mode = transaction")
    w.send(query_message("SELECT pg_sleep(0.3)") + extended("SELECT 'second'") + SYNC)
    assert summary(read_ready(w, 2)) == [("T", None), ("D", ("",)), ("C", b"SELECT 1\0"), ("Z", b"I"),
                                         ("1", None), ("2", None), ("T", None), ("D", ("second",)),
                                         ("C", b"SELECT 1\0"), ("Z", b"I")]
    check_shared(b)  # the server went back: two more clients share it
    assert query(w, "SELECT 'still'")[0] == [["still"]]
    w.close()


def waiting_query(b, sql):
    """A raw client that sends sql at once (it waits for a server); read its answer with read_ready()."""
    v = PgWire(b.port)
    v.login()
    v.send(query_message(sql))
    wait_for(lambda: pool_row(b)["cl_waiting"] == 1, "the client to wait for a server")
    return v


def test_session_client_flush_with_a_body_keeps_its_server_to_the_sync(bouncer, pg):
    """A session-mode client whose pool turned to transaction mode sends a Query
    and a Flush with a body behind it: the server answers the Flush with an
    error and skips everything up to the next Sync, so the ReadyForQuery of the
    Query must not give the server back. The client waiting for it gets it only
    after the Sync, and its query runs."""
    b = bouncer(ini_overrides={"default_pool_size": 1, "query_wait_timeout": 10, "query_timeout": 5})
    w = PgWire(b.port)
    w.login()
    assert query(w, "SELECT 1")[2] == b"I"  # session mode: holds the only server from now on
    with b.admin() as admin:
        admin.execute("SET pool_mode = transaction")
    v = waiting_query(b, "SELECT 'other'")
    w.send(query_message("SELECT 'first'") + message(b"H", b"junk"))
    assert summary(read_ready(w)) == [("T", None), ("D", ("first",)), ("C", b"SELECT 1\0"), ("Z", b"I")]
    assert summary([w.read_msg()]) == [("E", "08P01")]
    w.send(SYNC)
    assert summary(read_ready(w)) == [("Z", b"I")]
    assert summary(read_ready(v)) == [("T", None), ("D", ("other",)), ("C", b"SELECT 1\0"), ("Z", b"I")]
    v.close()
    w.close()


def test_session_client_after_extended_copy_follows_new_mode(bouncer, pg):
    """libpq's PQexecParams of a COPY FROM STDIN sends Execute and Sync, then the
    data, CopyDone and another Sync: the server ignores the first Sync (it is in
    COPY) and answers one ReadyForQuery. Once the pool has turned to transaction
    mode, that client still gives its server back after its next request."""
    b = bouncer(ini_overrides={"default_pool_size": 1, "query_wait_timeout": 4})
    w = PgWire(b.port)
    w.login()
    assert query(w, "CREATE TEMP TABLE copied (x int)")[1] is None
    w.send(parse_msg("COPY copied FROM STDIN") + bind_msg() + describe_portal() + execute_msg() + SYNC)
    assert [t for t, _ in read_types(w, [b"1", b"2", b"n", b"G"])] == [b"1", b"2", b"n", b"G"]
    w.send(message(b"d", b"1\n") + message(b"c") + SYNC)
    assert summary(read_ready(w)) == [("C", b"COPY 1\0"), ("Z", b"I")]
    with b.admin() as admin:
        admin.execute("SET pool_mode = transaction")
    assert query(w, "SELECT count(*) FROM copied")[0] == [["1"]]
    v = PgWire(b.port)
    v.login()
    assert query(v, "SELECT 'other'")[:2] == ([["other"]], None)  # query_wait_timeout while w keeps it
    v.close()
    w.close()


# ---------------------------------------------------------------------------
# 4. session state: tracked parameters, server_reset_query_always


PARAMS = ["TimeZone", "DateStyle", "IntervalStyle", "application_name", "client_encoding",
          "standard_conforming_strings"]
# a value with a quote and a semicolon must reach the server as one SQL literal
VALUES_A = ["Asia/Tokyo", "German, DMY", "sql_standard", "it's; tx-app-a", "LATIN1", "off"]
VALUES_B = ["America/Chicago", "SQL, MDY", "postgres_verbose", "tx-app-b", "WIN1252", "on"]


def sql_quote(value):
    return value.replace("'", "''")


def settings_of(conn):
    cols = ", ".join(f"current_setting('{p}')" for p in PARAMS)
    row = conn.execute(f"SELECT pg_backend_pid(), {cols}").fetchone()
    return row[0], list(row[1:])


def test_application_names_take_turns_on_one_server(bouncer, pg):
    """Clients that differ only in application_name take turns on one
    server: the SET goes out with the first message of each transaction
    instead of being waited for (doc/transaction.md, "Tracked parameters"),
    and every transaction runs under its own client's name, whether the
    first message is a Query, a Parse for the server or a Parse the pooler
    answers itself (the statement is on the server already)."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1, max_prepared_statements=10))
    mark = b.log_mark()
    names = ["app-one", "app two", "it's app three"]
    # prepare=True prepares only with a prepare_threshold (client() turns it off)
    conns = {name: client(b, application_name=name, prepare_threshold=100) for name in names}
    pids = set()
    for rnd in range(3):
        for name, conn in conns.items():
            def prepared():
                row = conn.execute("SELECT %s::int, current_setting('application_name')", (rnd,),
                                   prepare=True).fetchone()
                assert row == (rnd, name)
            if rnd == 0:
                prepared()  # a Parse: for the server, then answered by the pooler
            pid, got = conn.execute("SELECT pg_backend_pid(), current_setting('application_name')").fetchone()
            pids.add(pid)
            assert got == name
            if rnd > 0:
                prepared()
            with conn.transaction():
                assert conn.execute("SELECT current_setting('application_name')").fetchone() == (name,)
                assert pg.sql("SELECT application_name FROM pg_stat_activity WHERE pid = %s", [pid])[0][0] == name
    assert len(pids) == 1, f"a pool of one server gave backends {pids}"
    assert "SET failed" not in b.log_text()[mark:]
    with b.admin() as admin:
        stats = [r for r in show(admin, "STATS") if r["database"] == "postgres"][0]
    assert (stats["total_client_parse_count"], stats["total_server_parse_count"]) == (3, 1)


@pytest.mark.parametrize("last, app", [("Parse", "app-two"), ("Close", "app-two"), ("Parse+Flush", "app-two"),
                                       ("Parse+Flush", "app-one")])
def test_client_leaving_after_own_answer_behind_application_name_gives_server_back(bouncer, pg, last, app):
    """A client gets a server another application used last, with a Parse
    (or Close) that the pooler answers itself, maybe a Flush, and leaves
    without sending anything else. Nothing reached the server but the
    application_name SET that went out ahead (doc/transaction.md, "Tracked
    parameters") and the Flush, which starts nothing; once the SET is
    answered the server is between transactions, and a client that leaves
    then gives it back: the next client runs on the same backend, its
    prepared statement with it, and no server is closed. With the same
    application_name (no SET) only the Flush reaches the server."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1, max_prepared_statements=10))
    sql = "SELECT current_setting('application_name')"
    first = client(b, application_name="app-one", prepare_threshold=100)  # prepare=True prepares
    assert first.execute(sql, prepare=True).fetchone() == ("app-one",)  # the server has the statement
    pid = pid_of(first)
    mark = b.log_mark()
    w = PgWire(b.port)
    w.login(application_name=app)
    if last == "Close":
        # prepared in a transaction of its own, then the server goes back to app-one
        w.send(parse_msg(sql, "mine") + SYNC)
        assert summary(read_ready(w)) == [("1", None), ("Z", b"I")]
        assert first.execute(sql, prepare=True).fetchone() == ("app-one",)
        w.send(close_msg(b"S", "mine"))
        read_types(w, [b"3"])
    else:
        w.send(parse_msg(sql, "mine") + (FLUSH if last == "Parse+Flush" else b""))
        read_types(w, [b"1"])
    # the SET has run and the server is idle again (PostgreSQL says so just
    # before its ReadyForQuery, which reaches the pooler long before the goodbye)
    wait_for(lambda: pg.sql("SELECT application_name, state FROM pg_stat_activity WHERE pid = %s", [pid]) ==
             [(app, "idle")], "the application_name SET to be answered")
    assert pool_row(b)["sv_active"] == 1
    w.send(message(b"X"))
    w.close()
    wait_no_linked_server(b)
    assert pid_of(first) == pid, "the server was closed when its client left between transactions"
    assert first.execute(sql, prepare=True).fetchone() == ("app-one",)
    assert "not ready" not in b.log_text()[mark:]


def test_tracked_parameters_follow_each_client(bouncer, pg):
    """Clients with different TimeZone, DateStyle, IntervalStyle,
    application_name, client_encoding and standard_conforming_strings take
    turns on one server: each sees its own values, in SHOW and in the
    ParameterStatus it received, and a client that set nothing sees the
    pool's defaults."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    # the server's defaults, as a direct connection sees them (nothing set)
    with pg.connect() as direct:
        defaults = [direct.execute(f"SELECT current_setting('{p}')").fetchone()[0] for p in PARAMS]
    assert all(a != d for a, d in zip(VALUES_A, defaults)), defaults
    # A client that sent no application_name has the empty one. PgBouncer never
    # replays an empty value, so there it would run under the previous client's
    # name; doc/transaction.md promises that tracked parameters are set back to
    # each client's own values, so the empty name must come back too.
    assert defaults[PARAMS.index("application_name")] == ""

    a = client(b)
    c_b = client(b)
    plain = client(b)
    helsinki = client(b, options="-c TimeZone=Europe/Helsinki")
    for name, value in zip(PARAMS, VALUES_A):
        a.execute(f"SET {name} = '{sql_quote(value)}'")
    for name, value in zip(PARAMS, VALUES_B):
        c_b.execute(f"SET {name} = '{sql_quote(value)}'")
    expect_helsinki = list(defaults)
    expect_helsinki[0] = "Europe/Helsinki"
    pids = set()
    for _ in range(3):
        for conn, expected in ((a, VALUES_A), (c_b, VALUES_B), (plain, defaults), (helsinki, expect_helsinki)):
            pid, got = settings_of(conn)
            pids.add(pid)
            assert got == expected
            reported = [conn.info.parameter_status(p) for p in PARAMS]
            assert reported == expected, f"ParameterStatus seen by the client: {reported}"
    assert len(pids) == 1, f"a pool of one server gave backends {pids}"
    # a SET that PostgreSQL refuses changes nothing for the client
    with pytest.raises(errors.InvalidParameterValue):
        a.execute("SET TimeZone = 'No/Such_Zone'")
    assert c_b.execute("SHOW TimeZone").fetchone() == ("America/Chicago",)
    assert a.execute("SHOW TimeZone").fetchone() == ("Asia/Tokyo",)
    # a SET inside a transaction that is rolled back is undone by PostgreSQL and
    # the client's value follows (PostgreSQL reports the old value again)
    with a.transaction(force_rollback=True):
        a.execute("SET TimeZone = 'Australia/Perth'")
        assert a.execute("SHOW TimeZone").fetchone() == ("Australia/Perth",)
    assert c_b.execute("SHOW TimeZone").fetchone() == ("America/Chicago",)
    assert a.execute("SHOW TimeZone").fetchone() == ("Asia/Tokyo",)
    assert a.info.parameter_status("TimeZone") == "Asia/Tokyo"


def test_client_encoding_follows_each_client_with_data(bouncer, pg):
    """A LATIN1 client (client_encoding in its startup packet) and a UTF8 client
    take turns on one server writing and reading non-ASCII text: each one's
    bytes are converted with its own encoding."""
    fresh_table(pg, "tx_enc", "who text, t text")
    b = tx_bouncer(bouncer, pg, "tx_enc", default_pool_size=1)
    latin = client(b, client_encoding="LATIN1")
    utf = client(b)
    for i in range(3):
        latin.execute("INSERT INTO tx_enc VALUES ('latin', %s)", [f"café {i}"])
        utf.execute("INSERT INTO tx_enc VALUES ('utf', %s)", [f"naïve ŝ {i}"])
        assert latin.execute("SELECT t FROM tx_enc WHERE who = 'latin' ORDER BY t DESC LIMIT 1").fetchone() == (
            f"café {i}",)
        assert utf.execute("SELECT t FROM tx_enc WHERE who = 'latin' ORDER BY t DESC LIMIT 1").fetchone() == (
            f"café {i}",)
        assert utf.execute("SELECT t FROM tx_enc WHERE who = 'utf' ORDER BY t DESC LIMIT 1").fetchone() == (
            f"naïve ŝ {i}",)
    assert pid_of(latin) == pid_of(utf)
    assert latin.info.encoding == "iso8859-1" and utf.info.encoding == "utf-8"
    # stored as the characters, whatever encoding the writer used
    assert pg.sql("SELECT count(*) FROM tx_enc WHERE t LIKE 'café %' OR t LIKE 'naïve ŝ %'")[0][0] == 6


def test_tracked_value_with_backslash_and_standard_conforming_strings(bouncer, pg):
    """A tracked value with a backslash, for a client with
    standard_conforming_strings = off, replayed on a server whose previous
    client had it on (and the other way round): the value arrives intact."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    old_style = client(b)
    old_style.execute("SET standard_conforming_strings = off")
    old_style.execute("SET application_name = E'back\\\\slash \\' quote'")
    modern = client(b)
    modern.execute("SET application_name = 'plain\\slash'")
    for _ in range(3):
        assert old_style.execute("SELECT current_setting('application_name'), "
                                 "current_setting('standard_conforming_strings')").fetchone() == (
            "back\\slash ' quote", "off")
        assert modern.execute("SELECT current_setting('application_name'), "
                              "current_setting('standard_conforming_strings')").fetchone() == (
            "plain\\slash", "on")
    assert old_style.info.parameter_status("application_name") == "back\\slash ' quote"
    assert modern.info.parameter_status("application_name") == "plain\\slash"
    assert pid_of(old_style) == pid_of(modern)


def test_server_check_query_between_transactions(bouncer, pg):
    """server_check_delay = 0: every server given back is checked before its
    next client; clients taking turns see only their own results and values."""
    b = tx_bouncer(bouncer, pg, "tx_check", default_pool_size=1, server_check_delay=0,
                   server_check_query="SELECT 'check'")
    a = client(b, options="-c TimeZone=Asia/Tokyo")
    c = client(b)
    pid = pid_of(c)
    for i in range(10):
        assert a.execute("SELECT %s::int, current_setting('TimeZone'), pg_backend_pid()", [i]).fetchone() == (
            i, "Asia/Tokyo", pid)
        assert c.execute("SELECT %s::text, pg_backend_pid()", [f"c{i}"]).fetchone() == (f"c{i}", pid)
    w = PgWire(b.port)
    w.login()
    assert query(w, "SELECT 'raw'") == ([["raw"]], None, b"I")
    assert query(w, "SELECT 'raw again'") == ([["raw again"]], None, b"I")


@pytest.mark.parametrize("extra", ["IntervalStyle", "IntervalStyle, default_transaction_read_only",
                                   "intervalstyle,DEFAULT_TRANSACTION_READ_ONLY"],
                         ids=["default", "read-only-tracked", "names-in-other-case"])
def test_track_extra_parameters(bouncer, pg, extra):
    """default_transaction_read_only is reported by PostgreSQL (GUC_REPORT) but
    not tracked by default: a client's SET of it stays on the server for the
    next client, as any untracked SET does. Named in track_extra_parameters
    (matched case-insensitively) it follows its client like TimeZone."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1, track_extra_parameters=extra))
    a = client(b)
    other = client(b)
    pid = pid_of(a)
    a.execute("SET default_transaction_read_only = on")
    a.execute("SET IntervalStyle = 'sql_standard'")
    got = other.execute("SELECT pg_backend_pid(), current_setting('default_transaction_read_only'), "
                        "current_setting('IntervalStyle')").fetchone()
    tracked = "read_only" in extra.lower()
    assert got == (pid, "off" if tracked else "on", "postgres")
    assert a.execute("SELECT current_setting('default_transaction_read_only'), "
                     "current_setting('IntervalStyle')").fetchone() == ("on", "sql_standard")
    if tracked:
        # the welcome spells a tracked name as PostgreSQL does, whatever the config's
        # spelling: libpq looks names up case-sensitively
        assert other.info.parameter_status("default_transaction_read_only") == "off"
        assert a.info.parameter_status("default_transaction_read_only") == "on"
        assert other.info.parameter_status("IntervalStyle") == "postgres"


@pytest.mark.parametrize("always", [0, 1], ids=["reset-never", "reset-always"])
def test_server_reset_query_in_transaction_mode(bouncer, pg, always):
    """Without server_reset_query_always an untracked SET, a SQL PREPARE, a temp
    table and a session advisory lock stay on the server and the next client
    finds them (as in PgBouncer, doc/transaction.md); with it, DISCARD ALL runs
    on every release and nothing is left, while tracked parameters still
    follow their client."""
    default_work_mem = pg.sql("SHOW work_mem")[0][0]
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1, server_reset_query_always=always))
    a = client(b)
    other = client(b)
    pid = pid_of(a)
    a.execute("SET work_mem = '13MB'")
    a.execute("SET TimeZone = 'Asia/Tokyo'")
    a.execute("CREATE TEMP TABLE tx_leak_tmp (a int)")
    a.execute("SELECT pg_advisory_lock(4242)")
    a.execute("PREPARE tx_sql_prep AS SELECT 1")
    if always:
        wait_reset(b, pg, pid)
    got = other.execute("SELECT pg_backend_pid(), current_setting('work_mem'), current_setting('TimeZone'), "
                        "(SELECT count(*) FROM pg_prepared_statements), "
                        "to_regclass('pg_temp.tx_leak_tmp') IS NOT NULL, "
                        "(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                        "AND pid = pg_backend_pid())").fetchone()
    server_tz = pg.sql("SHOW TimeZone")[0][0]
    if always:
        assert got == (pid, default_work_mem, server_tz, 0, False, 0)
    else:
        assert got == (pid, "13MB", server_tz, 1, True, 1)
    # the client's own tracked setting comes back, untracked state only without reset
    got = a.execute("SELECT pg_backend_pid(), current_setting('work_mem'), current_setting('TimeZone')").fetchone()
    assert got == (pid, default_work_mem if always else "13MB", "Asia/Tokyo")
    assert a.info.parameter_status("TimeZone") == "Asia/Tokyo"
    if not always:
        return
    # back-to-back transactions of two clients, each reset in between: nobody
    # sees another's answer or the reset's, and each keeps its TimeZone
    stop = threading.Event()

    def other_queries():
        n = 0
        while not stop.is_set():
            assert other.execute("SELECT %s::int, current_setting('TimeZone')", [n]).fetchone() == (n, server_tz)
            n += 1
        return n

    job = Background(other_queries)
    try:
        for i in range(100):
            assert a.execute("SELECT %s::int, current_setting('TimeZone'), current_setting('work_mem')",
                             [i]).fetchone() == (i, "Asia/Tokyo", default_work_mem)
            if i % 10 == 0:
                a.execute("SET work_mem = '13MB'")
    finally:
        stop.set()
    assert job.result() > 0


# ---------------------------------------------------------------------------
# 6. timeouts in transaction mode


def test_query_wait_timeout_in_transaction_mode(bouncer, pg):
    """query_wait_timeout bounds each wait for a server, not their sum: three
    clients taking turns on one server, each waiting in all longer than the
    timeout, are all served. A client holding the only server inside a
    transaction makes another wait until query_wait_timeout; an idle client
    outside a transaction does not."""
    b = tx_bouncer(bouncer, pg, "tx_qwt", default_pool_size=1, query_wait_timeout=1)
    busy = [client(b) for _ in range(3)]
    failures = []

    def turns(conn):
        try:
            for i in range(25):
                assert conn.execute("SELECT pg_sleep(0.03), %s::int", [i]).fetchone() == ("", i)
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            failures.append(repr(e))

    # 75 queries of 30 ms one after another on one server: each client waits
    # about 1.5 s in all, but never long at a time
    threads = [threading.Thread(target=turns, args=(c,)) for c in busy]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures

    idle = client(b)
    pid = pid_of(idle)  # then idle between transactions: holds nothing
    holder = client(b, autocommit=False)
    holder.execute("SELECT 1")  # inside a transaction now
    assert holder.info.transaction_status == TransactionStatus.INTRANS
    mark = b.log_mark()
    w = PgWire(b.port)
    w.login()
    w.send(query_message("SELECT 'never'"))
    w.expect_fatal("query_wait_timeout")
    expect_close_logged(b, mark, 'query_wait_timeout', server=False)
    holder.commit()
    assert pid_of(idle) == pid
    assert holder.execute("SELECT 'holder fine'").fetchone() == ("holder fine",)
    holder.commit()


def test_query_wait_notify_in_transaction_mode(bouncer, pg):
    """A client queued behind a transaction for query_wait_notify seconds gets
    the queue NOTICE, then its answer when the server comes free."""
    b = tx_bouncer(bouncer, pg, "tx_qwn", default_pool_size=1, query_wait_notify=1)
    holder = client(b, autocommit=False)
    pid = pid_of(holder)  # inside a transaction: keeps the only server
    w = PgWire(b.port)
    w.login()
    w.send(query_message("SELECT pg_backend_pid()"))
    notice = w.read_msg()
    assert notice[0] == b"N", notice
    assert error_fields(notice[1]) == {
        "S": "NOTICE", "C": "00000",
        "M": "No server connection available in postgres backend, client being queued"}
    holder.commit()
    msgs = read_ready(w)
    assert [decode_row(m[1]) for m in msgs if m[0] == b"D"] == [[str(pid)]]
    assert msgs[-1][1] == b"I"


def test_query_timeout_in_transaction_mode(bouncer, pg):
    """A query running longer than query_timeout: FATAL "query timeout" and its
    server closed; other clients carry on."""
    app = "tx_qt"
    b = tx_bouncer(bouncer, pg, app, default_pool_size=1, query_timeout=1, query_wait_timeout=5)
    bystander = client(b)
    bystander.execute("SELECT 1")
    w = PgWire(b.port)
    w.login()
    pid = int(query(w, "SELECT pg_backend_pid()")[0][0][0])  # the bystander's server, shared
    mark = b.log_mark()
    w.send(query_message("SELECT pg_sleep(5)"))
    w.expect_fatal("query timeout")
    b.wait_log(r"S-0x[0-9a-f]+: postgres/postgres@.* closing because: query timeout", after=mark)
    # the bystander, idle all along without a server, is unharmed; the pool serves it
    # from another server than the closed one
    assert bystander.execute("SELECT 'bystander fine', pg_backend_pid() <> %s", [pid]).fetchone() == (
        "bystander fine", True)

    # a transaction idle between its statements is not a running query; a client
    # queued behind it longer than query_timeout gets "query_timeout" (spec/cli.md)
    holder = client(b, autocommit=False)
    holder.execute("SELECT 1")
    mark = b.log_mark()
    w = PgWire(b.port)
    w.login()
    w.send(query_message("SELECT 'queued'"))
    w.expect_fatal("query_timeout")
    expect_close_logged(b, mark, 'query_timeout', server=False)
    assert holder.execute("SELECT 'holder fine'").fetchone() == ("holder fine",)
    holder.commit()


def test_idle_transaction_timeout_in_transaction_mode(bouncer, pg):
    b = tx_bouncer(bouncer, pg, "tx_itt", default_pool_size=1, idle_transaction_timeout=1)
    idle_outside = PgWire(b.port)
    idle_outside.login()
    assert query(idle_outside, "SELECT 1")[2] == b"I"
    mark = b.log_mark()
    w = PgWire(b.port)
    w.login()
    pid = int(query(w, "SELECT pg_backend_pid()")[0][0][0])
    assert query(w, "BEGIN") == ([], None, b"T")
    # a query running inside the transaction for longer than the timeout is not idleness
    assert query(w, "SELECT pg_sleep(1.5), 'busy'") == ([["", "busy"]], None, b"T")
    w.expect_fatal("idle transaction timeout")
    expect_close_logged(b, mark, 'idle transaction timeout', server=True)
    wait_for(lambda: backend_state(pg, pid) is None, "the server in the abandoned transaction to be closed")
    # the client that idled outside a transaction (longer than the timeout) is untouched
    assert query(idle_outside, "SELECT 'outside fine'") == ([["outside fine"]], None, b"I")
    # a failed transaction ('E') left idle is also timed out
    w = PgWire(b.port)
    w.login()
    assert query(w, "BEGIN")[2] == b"T"
    assert query(w, "SELECT 1/0")[2] == b"E"
    w.expect_fatal("idle transaction timeout")


def test_transaction_timeout_in_transaction_mode(bouncer, pg):
    """A busy transaction that lasts longer than transaction_timeout is ended;
    a client running many short transactions for longer is not."""
    b = tx_bouncer(bouncer, pg, "tx_tt", default_pool_size=2, transaction_timeout=1)
    bystander = client(b)  # idle between transactions, holds no server
    pid_of(bystander)
    short = client(b)
    short.execute("SELECT 1")
    finished = threading.Event()

    def short_transactions():
        # one short transaction after another, until well past twice the timeout
        started, n = time.monotonic(), 0
        while not finished.is_set() or time.monotonic() - started < 2.5:
            assert short.execute("SELECT %s::int", [n]).fetchone() == (n,)
            n += 1
            time.sleep(0.05)
        return n

    job = Background(short_transactions)
    mark = b.log_mark()
    w = PgWire(b.port)
    w.login()
    assert query(w, "BEGIN") == ([], None, b"T")
    assert query(w, "SELECT 1")[2] == b"T"
    w.send(query_message("SELECT pg_sleep(8)"))  # busy, not idle: only transaction_timeout applies
    w.expect_fatal("transaction timeout")
    expect_close_logged(b, mark, 'transaction timeout', server=True)
    finished.set()
    assert job.result() > 0
    assert pid_of(bystander) in backends(pg, "tx_tt")


def test_client_idle_timeout_in_transaction_mode(bouncer, pg):
    """client_idle_timeout counts while a client has no server: in transaction
    mode that is between transactions. A client idle inside a transaction has
    a server and is left alone."""
    b = tx_bouncer(bouncer, pg, "tx_cit", default_pool_size=2, client_idle_timeout=1)
    in_tx = PgWire(b.port)
    in_tx.login()
    assert query(in_tx, "BEGIN") == ([], None, b"T")
    mark = b.log_mark()
    w = PgWire(b.port)
    w.login()
    assert query(w, "SELECT 1")[2] == b"I"
    w.expect_fatal("client_idle_timeout")
    expect_close_logged(b, mark, 'client_idle_timeout', server=False)
    # idle inside its transaction for longer than the client that was just closed
    assert query(in_tx, "SELECT 'in tx fine'") == ([["in tx fine"]], None, b"T")
    assert query(in_tx, "COMMIT") == ([], None, b"I")


def test_timeout_overrides_per_user_and_database(bouncer, pg):
    """[users] idle_transaction_timeout and query_timeout act for that user's
    pools only; a [databases] query_wait_timeout acts where the global one is
    off."""
    pg.create_role("tx_ovr_user", password="pw")
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1, query_wait_timeout=0), start=False,
                users_txt='"postgres" "postgres"\n"pgbouncer" "pgbouncer"\n"tx_ovr_user" "pw"\n',
                databases={"postgres": pg.connstr("postgres"),
                           "qwt": pg.connstr("postgres", query_wait_timeout=1)})
    b.write_ini(text=b.render_ini() + "[users]\ntx_ovr_user = idle_transaction_timeout=1 query_timeout=1\n")
    b.start()
    # the user without an override opens a transaction first and idles in it
    patient = PgWire(b.port)
    patient.login()
    assert query(patient, "BEGIN") == ([], None, b"T")
    w = PgWire(b.port)
    w.login(user="tx_ovr_user")
    assert query(w, "BEGIN") == ([], None, b"T")
    w.expect_fatal("idle transaction timeout")
    # idle in its transaction for longer than the one just closed, and untouched
    assert query(patient, "SELECT 'patient'") == ([["patient"]], None, b"T")
    assert query(patient, "COMMIT") == ([], None, b"I")
    w = PgWire(b.port)
    w.login(user="tx_ovr_user")
    w.send(query_message("SELECT pg_sleep(5)"))
    w.expect_fatal("query timeout")
    assert query(patient, "SELECT pg_sleep(1.2), 'no query_timeout here'") == (
        [["", "no query_timeout here"]], None, b"I")

    # database qwt: query_wait_timeout = 1 while the global one waits forever
    holder = client(b, dbname="qwt", autocommit=False)
    holder.execute("SELECT 1")  # holds the pool's only server inside a transaction
    w = PgWire(b.port)
    w.login(database="qwt")
    w.send(query_message("SELECT 'never'"))
    w.expect_fatal("query_wait_timeout")
    holder.commit()


def test_server_lifetime_in_transaction_mode(bouncer, pg):
    """server_lifetime is checked when a server goes back to the pool, i.e.
    after a transaction: connected clients move to a new server without
    noticing."""
    app = "tx_lifetime"
    b = tx_bouncer(bouncer, pg, app, default_pool_size=1, server_lifetime=1)
    a = client(b)
    c = client(b)
    first = pid_of(a)
    assert pid_of(c) == first

    def moved():
        pids = {pid_of(a), pid_of(c)}
        time.sleep(0.05)
        return first not in pids and pids

    pids = wait_for(moved, "the clients to be served by a server younger than server_lifetime")
    assert len(pids) == 1
    wait_for(lambda: backend_state(pg, first) is None, "the server past its lifetime to be closed")
    assert a.execute("SELECT 'a fine'").fetchone() == ("a fine",)


def test_server_idle_timeout_in_transaction_mode(bouncer, pg):
    """Servers that nobody used for server_idle_timeout are closed while their
    clients stay connected (between transactions they hold no server)."""
    app = "tx_server_idle"
    b = tx_bouncer(bouncer, pg, app, default_pool_size=2, server_idle_timeout=1)
    a = client(b)
    c = client(b)
    used = {pid_of(a), pid_of(c)}
    wait_for(lambda: not backends(pg, app), "the idle servers to be closed")
    row = pool_row(b)
    assert row["cl_active"] == 2 and row["sv_idle"] + row["sv_used"] + row["sv_active"] == 0, row
    assert not {pid_of(a), pid_of(c)} & used


# ---------------------------------------------------------------------------
# 7. two workers


def test_two_workers_transaction_mode_global_pool(bouncer, pg):
    """Two workers, five clients on each, default_pool_size = 2 counted over both:
    every client is served, its TimeZone stays its own, and PostgreSQL never
    sees more than two server connections."""
    app = "tx_two_workers"
    fresh_table(pg, "tx_two_t", "a int, b int")
    b = tx_bouncer(bouncer, pg, app, default_pool_size=2, min_workers=2, max_workers=2,
                   query_wait_timeout=30)
    two_workers(b)
    zones = ["UTC", "Asia/Tokyo", "America/Chicago", "Europe/Helsinki", "Australia/Perth"]
    conns = []
    for n in range(10):
        conns.append((n, zones[n % 5], conn_on(b, n % 2, prepare_threshold=None, options=f"-c TimeZone={zones[n % 5]}")))
    failures = []

    def run_client(n, zone, conn):
        try:
            for i in range(10):
                with conn.transaction():
                    conn.execute("INSERT INTO tx_two_t VALUES (%s, %s)", [n, i])
                    assert conn.execute("SELECT current_setting('TimeZone'), count(*) FROM tx_two_t "
                                        "WHERE a = %s", [n]).fetchone() == (zone, i + 1)
                assert conn.execute("SHOW TimeZone").fetchone() == (zone,)
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            failures.append(f"client {n}: {e!r}")

    most = run_counting_backends(pg, app, run_client, conns)
    assert not failures, failures
    assert pg.sql("SELECT count(*) FROM tx_two_t")[0][0] == 100
    assert 1 <= most <= 2, f"{most} server connections for a global pool of 2"
    with b.admin() as admin:
        rows = [r for r in show(admin, "POOLS") if r["database"] == "postgres"]
    assert sum(r["cl_active"] for r in rows) == 10, rows
    assert all(r["pool_mode"] == "transaction" for r in rows), rows

    # a cancel lands on either worker and reaches the server its client holds then
    for n, zone, conn in conns[:4]:
        job = Background(lambda: conn.execute("SELECT pg_sleep(30), %s::int", [n]))
        wait_running(pg, "SELECT pg_sleep(30)")
        conn.cancel()
        with pytest.raises(errors.QueryCanceled):
            job.result()
        assert conn.execute("SHOW TimeZone").fetchone() == (zone,)


# ---------------------------------------------------------------------------
# bad input


def test_sync_with_nothing_before_it(bouncer, pg):
    b = tx_bouncer(bouncer, pg, "tx_sync", default_pool_size=1)
    direct = PgWire(pg.port)
    direct.login()
    w = PgWire(b.port)
    w.login()
    payload = SYNC + SYNC + SYNC
    assert run_until_marker(w, payload) == run_until_marker(direct, payload) == \
        [("Z", b"I")] * 3 + [("T", None), ("D", ("end-marker",)), ("C", b"SELECT 1\0"), ("Z", b"I")]
    # the server went back: another client gets it
    pid = int(query(w, "SELECT pg_backend_pid()")[0][0][0])
    with client(b) as other:
        assert pid_of(other) == pid
    # a Sync inside a transaction answers 'T' and keeps the server
    assert query(w, "BEGIN")[2] == b"T"
    w.send(SYNC)
    assert read_types(w, [b"Z"])[0][1] == b"T"
    assert query(w, "COMMIT") == ([], None, b"I")


def test_client_leaving_between_transactions_gives_server_back(bouncer, pg):
    """A client that disconnects between transactions does not cost the pool
    its server: the same backend serves on. One that leaves while queued for a
    server does not jam the pool."""
    b = tx_bouncer(bouncer, pg, "tx_leave_clean", default_pool_size=1)
    other = client(b)
    pid = pid_of(other)
    a = client(b)
    assert pid_of(a) == pid
    a.close()
    assert pid_of(other) == pid
    # one queued behind a transaction leaves before it gets the server
    holder = client(b, autocommit=False)
    holder.execute("SELECT 1")
    w = PgWire(b.port)
    w.login()
    w.send(query_message("SELECT 'never served'"))
    wait_waiting(b, 1)
    w.close()
    holder.commit()
    # (like PgBouncer, the pooler may only notice the departure when the server
    # comes free; the query it had already read may then run or not)
    assert other.execute("SELECT 'pool still works'").fetchone() == ("pool still works",)
    row = wait_no_linked_server(b)
    assert row["cl_waiting"] == 0 and row["sv_idle"] + row["sv_used"] <= 1, row


def test_function_call_releases_server(bouncer, pg):
    """A FunctionCall (fast-path) message is a request answered by
    FunctionCallResponse and ReadyForQuery; the server goes back afterwards."""
    b = tx_bouncer(bouncer, pg, "tx_fastpath", default_pool_size=1)
    other = client(b)
    pid = pid_of(other)
    w = PgWire(b.port)
    w.login()
    # pg_backend_pid() is function oid 2026: no arguments, text result
    w.send(message(b"F", struct.pack("!IHHH", 2026, 0, 0, 0)))
    msgs = read_types(w, [b"V", b"Z"])
    assert msgs[0][1] == struct.pack("!I", len(str(pid))) + str(pid).encode()
    assert msgs[1][1] == b"I"
    assert pid_of(other) == pid


def test_messages_in_small_pieces_while_another_client_competes(bouncer, pg):
    """A client whose simple and extended messages arrive three bytes at a time,
    across transaction boundaries, while another client keeps asking for the
    only server: both get exactly their own answers."""
    b = tx_bouncer(bouncer, pg, "tx_pieces", default_pool_size=1)
    other = client(b)
    pid_of(other)
    stop = threading.Event()

    def other_queries():
        n = 0
        while not stop.is_set():
            assert other.execute("SELECT %s::int", [n]).fetchone() == (n,)
            n += 1
        return n

    job = Background(other_queries)
    a = PgWire(b.port)
    a.login()
    payload = (query_message("SELECT 'q1'") + extended("SELECT 'e1'") + SYNC + query_message("BEGIN")
               + extended("SELECT 'e2'") + SYNC + query_message("COMMIT") + extended("SELECT 'e3'") + SYNC)
    try:
        for i in range(0, len(payload), 3):
            a.send(payload[i:i + 3])
            time.sleep(0.002)  # pacing, so that pieces arrive apart
        got = []
        for _ in range(6):
            got += summary(read_ready(a))
    finally:
        stop.set()
    assert job.result() > 0
    one = ("C", b"SELECT 1\0")
    assert got == [("T", None), ("D", ("q1",)), one, ("Z", b"I"),
                   ("1", None), ("2", None), ("T", None), ("D", ("e1",)), one, ("Z", b"I"),
                   ("C", b"BEGIN\0"), ("Z", b"T"),
                   ("1", None), ("2", None), ("T", None), ("D", ("e2",)), one, ("Z", b"T"),
                   ("C", b"COMMIT\0"), ("Z", b"I"),
                   ("1", None), ("2", None), ("T", None), ("D", ("e3",)), one, ("Z", b"I")]


INTERLEAVED = [
    pytest.param(extended("SELECT 1") + query_message("SELECT 2") + extended("SELECT 3") + SYNC
                 + query_message("SELECT 4"), id="extended-then-simple"),
    pytest.param(query_message("BEGIN") + extended("INSERT INTO tx_inter VALUES (1)") + SYNC
                 + query_message("SELECT count(*) FROM tx_inter") + extended("SELECT 1/0") + SYNC
                 + query_message("ROLLBACK") + extended("SELECT count(*) FROM tx_inter") + SYNC,
                 id="in-transaction-with-error"),
    pytest.param(parse_msg("SELECT 5") + query_message("SELECT 6") + bind_msg() + execute_msg() + SYNC,
                 id="query-between-parse-and-bind"),
]


@pytest.mark.parametrize("payload", INTERLEAVED)
def test_interleaved_simple_and_extended(bouncer, pg, payload):
    """Simple Query messages mixed into extended-protocol sequences: the client
    gets exactly what PostgreSQL itself answers, and the server goes back to
    the pool afterwards."""
    fresh_table(pg, "tx_inter", "a int")
    b = tx_bouncer(bouncer, pg, "tx_inter", default_pool_size=1)
    direct = PgWire(pg.port)
    direct.login()
    expected = run_until_marker(direct, payload)
    direct.close()
    pg.sql("TRUNCATE tx_inter")
    w = PgWire(b.port)
    w.login()
    other = client(b)
    pid = pid_of(other)
    assert run_until_marker(w, payload) == expected
    assert pid_of(other) == pid
    assert query(w, "SELECT pg_backend_pid(), txid_current_if_assigned()") == ([[str(pid), None]], None, b"I")


@pytest.mark.parametrize("protocol", ["simple", "extended"])
def test_disconnect_with_pipeline_half_answered(bouncer, pg, protocol):
    """A client sends a pipeline that opens a transaction and leaves after the
    first answer: its server, which still owes answers, is closed, and the next
    client gets a server with nothing of it."""
    app = "tx_half"
    b = tx_bouncer(bouncer, pg, app, default_pool_size=1)
    steps = ["SELECT pg_backend_pid()", "BEGIN", "SET LOCAL work_mem = '13MB'", "SELECT pg_sleep(0.5)",
             "SELECT repeat('x', 1000) FROM generate_series(1, 2000)", "SELECT 'last'"]
    if protocol == "simple":
        payload = b"".join(query_message(s) for s in steps)
    else:
        payload = b"".join(extended(s) + SYNC for s in steps)
    default_work_mem = pg.sql("SHOW work_mem")[0][0]
    c = client(b)  # the next client of that server, connected all along
    pid = pid_of(c)
    a = PgWire(b.port)
    a.login()
    a.send(payload)
    first = [decode_row(body) for t, body in read_ready(a) if t == b"D"]
    assert first == [[str(pid)]]
    a.close()
    assert c.execute("SELECT 'mine', current_setting('work_mem'), txid_current_if_assigned()").fetchone() == (
        "mine", default_work_mem, None)
    assert c.info.transaction_status == TransactionStatus.IDLE
    assert c.execute("SELECT %s::text", ["second"]).fetchone() == ("second",)
    wait_for(lambda: not backends(pg, app, "idle in transaction%") and not backends(pg, app, "active"),
             "no server left inside the abandoned pipeline's transaction")
    # the server that still owed answers was closed, not lent
    wait_for(lambda: backend_state(pg, pid) is None, "the server with unanswered requests to be closed")
    wait_for(lambda: len(backends(pg, app)) <= 1, "at most one server for a pool of 1")


def _rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_pooler_answers_to_a_client_that_does_not_read(bouncer, pg):
    """Close of the unnamed statement while the server's belongs to another
    client is answered by the pooler itself (CloseComplete). A client that
    sends millions of them and reads nothing must not make the worker hold
    every answer: forwarded results stop the client's input when it does not
    read (back-pressure), and PgBouncer's own answers are bounded too. Here
    they piled up in the client's output queue (about 12 MB for 3 million,
    twice that for 6 million). Past 64 kB of them its next message waits
    until they are sent. Then the client reads and gets them all."""
    b = bouncer(ini_overrides={**TX, "min_workers": 1, "max_workers": 1, "default_pool_size": 1})
    (worker,) = workers(b)
    other = b.connect(autocommit=True)
    # the server's unnamed statement becomes another client's
    assert other.execute("SELECT %s::int", [5]).fetchone() == (5,)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)  # before connect: a small window
    sock.settimeout(30)
    sock.connect(("127.0.0.1", b.port))
    w = PgWire.__new__(PgWire)
    w.sock, w.buf = sock, b""
    w.login()
    closes = 3_000_000
    before = _rss_kb(worker["pid"])
    sender = threading.Thread(target=w.send, args=(close_msg(b"S") * closes + SYNC,), daemon=True)
    sender.start()
    peak, until = before, time.monotonic() + 4
    while time.monotonic() < until and sender.is_alive():
        peak = max(peak, _rss_kb(worker["pid"]))
        time.sleep(0.05)
    time.sleep(0.5)
    peak = max(peak, _rss_kb(worker["pid"]))
    # every CloseComplete, then the ReadyForQuery
    want = b"3\0\0\0\4" * closes + b"Z\0\0\0\5I"
    got = bytearray()
    while len(got) < len(want):
        chunk = sock.recv(1 << 20)
        assert chunk, f"closed after {len(got)} bytes"
        got += chunk
    assert got == want
    sender.join(10)
    assert peak - before < 6_000, f"the worker grew by {peak - before} kB holding unread answers"
    assert other.execute("SELECT 'unharmed'").fetchone() == ("unharmed",)
