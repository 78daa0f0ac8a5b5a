"""The pooling engine in session mode (spec/behaviours.md §1-4, §9-12): queries
of every protocol flavour pass through intact, servers are reused and reset,
pool limits and timeouts act as documented, and the pool recovers when a
server dies."""

import concurrent.futures
import errno
import hashlib
import os
import re
import signal
import socket
import threading
import time

import psycopg
import pytest
from psycopg import errors

from conftest import DEADLINE, free_port, parent_pid, Postgres, wait_for
from helpers import backend_state, Background, pool_row, show, wait_reset, wait_running, wait_server_idle
from pgwire import error_fields, message, PgWire, query_message, startup_packet



# ---------------------------------------------------------------------------
# queries


def test_simple_query(bouncer):
    b = bouncer()
    with b.connect(autocommit=True) as conn:
        assert conn.execute("SELECT 1, 'abc', NULL::text").fetchone() == (1, "abc", None)
        assert conn.execute("SELECT current_database(), current_user").fetchone() == ("postgres", "postgres")


def test_extended_protocol(bouncer):
    b = bouncer()
    with b.connect(autocommit=True) as conn:
        assert conn.execute("SELECT %s::int + %s::int", [40, 2]).fetchone() == (42,)
        assert conn.execute("SELECT %s || %s", ["foo", "bar"]).fetchone() == ("foobar",)
        # prepared statements (named Parse/Bind) are fine in session mode
        for i in range(6):
            assert conn.execute("SELECT %s::int * 3", [i], prepare=True).fetchone() == (i * 3,)
        prepared = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0]
        assert prepared >= 1
        # binary results
        with conn.cursor(binary=True) as cur:
            assert cur.execute("SELECT %s::bigint", [2**40]).fetchone() == (2**40,)
        # executemany pipelines several Bind/Execute before one Sync
        conn.execute("CREATE TEMP TABLE em (a int)")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO em VALUES (%s)", [(i,) for i in range(50)])
        assert conn.execute("SELECT count(*), sum(a) FROM em").fetchone() == (50, sum(range(50)))


def test_pipeline_mode(bouncer):
    b = bouncer()
    with b.connect(autocommit=True) as conn:
        with conn.pipeline():
            curs = [conn.execute("SELECT %s::int", [i]) for i in range(20)]
        assert [c.fetchone()[0] for c in curs] == list(range(20))
        # an error inside a pipeline aborts the rest up to the Sync; the connection stays usable
        with pytest.raises(errors.DivisionByZero):
            with conn.pipeline() as p:
                conn.execute("SELECT %s::int", [1])
                conn.execute("SELECT 1 / %s::int", [0])
                conn.execute("SELECT %s::int", [3])
                p.sync()
        assert conn.execute("SELECT %s::text", ["after pipeline"]).fetchone() == ("after pipeline",)


def test_multiple_statements(bouncer):
    b = bouncer()
    with b.connect(autocommit=True) as conn:
        cur = conn.execute("CREATE TEMP TABLE ms (a int); INSERT INTO ms VALUES (1), (2), (3); "
                           "SELECT sum(a) FROM ms; SELECT 'last'")
        results = []
        while True:
            if cur.description:
                results.append(cur.fetchall())
            if not cur.nextset():
                break
        assert [[(6,)], [("last",)]] == results


def test_error_outside_transaction(bouncer):
    b = bouncer()
    with b.connect(autocommit=True) as conn:
        with pytest.raises(errors.DivisionByZero) as exc:
            conn.execute("SELECT 1/0")
        assert exc.value.sqlstate == "22012"
        assert conn.execute("SELECT 'after error'").fetchone() == ("after error",)
        with pytest.raises(errors.UndefinedTable):
            conn.execute("SELECT * FROM no_such_table_here WHERE a = %s", [1])
        assert conn.execute("SELECT %s::int", [5]).fetchone() == (5,)


def test_error_inside_transaction_and_rollback(bouncer):
    b = bouncer()
    with b.connect() as conn:  # not autocommit: psycopg opens a transaction
        conn.execute("CREATE TEMP TABLE tx (a int)")
        conn.execute("INSERT INTO tx VALUES (1)")
        with pytest.raises(errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        with pytest.raises(errors.InFailedSqlTransaction) as exc:
            conn.execute("SELECT 1")
        assert exc.value.sqlstate == "25P02"
        conn.rollback()
        assert conn.execute("SELECT 'recovered'").fetchone() == ("recovered",)
        conn.rollback()
        # a simple-protocol transaction with an error inside
        conn.autocommit = True
        with pytest.raises(errors.DivisionByZero):
            conn.execute("BEGIN; SELECT 1/0; COMMIT")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        conn.execute("ROLLBACK")
        assert conn.execute("SELECT 2").fetchone() == (2,)


def test_large_result_set(bouncer):
    b = bouncer()
    with b.connect(autocommit=True) as conn:
        cur = conn.execute("SELECT i, 'row-' || i || repeat('x', 40) FROM generate_series(1, 200000) i")
        n = total = 0
        for i, text in cur:
            n += 1
            total += i
            if text != f"row-{i}" + "x" * 40:
                pytest.fail(f"row {n} garbled: {text!r}")
        assert n == 200000
        assert total == 200000 * 200001 // 2


def test_large_single_value_both_ways(bouncer):
    b = bouncer()
    with b.connect(autocommit=True) as conn:
        big = conn.execute("SELECT repeat('abcdefgh', 1000000)").fetchone()[0]
        assert len(big) == 8_000_000 and big == "abcdefgh" * 1000000
        # and a multi-MB parameter from the client to the server
        payload = "0123456789" * 600_000
        assert conn.execute("SELECT length(%s), md5(%s)", [payload, payload]).fetchone() == (
            len(payload), hashlib.md5(payload.encode()).hexdigest())
        assert conn.execute("SELECT 'small after big'").fetchone() == ("small after big",)


@pytest.mark.parametrize("mode", ["session", "transaction"])
def test_connections_work_after_giving_their_buffers_back(bouncer, mode):
    """Idle connections give their buffers back (doc/benchmarks.md, "Memory per
    idle client"): a client that never ran a query, and a client and server idle
    for more than a second (the janitor's trim), take new ones and pass packets
    larger than pkt_buf, pipelines and results intact, in either direction."""
    b = bouncer(ini_overrides={"pool_mode": mode, "pkt_buf": "512"})
    payload = "0123456789abcdef" * 4096  # 64 KB: a buffer grown for one packet
    with b.connect() as fresh, b.connect() as used:
        assert used.execute("SELECT 1").fetchone() == (1,)
        time.sleep(1.5)  # no assertion on time: lets the janitor (every 1/3 s) see both idle a second
        for conn in (fresh, used):
            assert conn.execute("SELECT length(%s), md5(%s)", [payload, payload]).fetchone() == (
                len(payload), hashlib.md5(payload.encode()).hexdigest())
            assert conn.execute("SELECT repeat('xy', 50000)").fetchone()[0] == "xy" * 50000
            with conn.pipeline():
                curs = [conn.execute("SELECT %s::int", [i]) for i in range(30)]
            assert [c.fetchone()[0] for c in curs] == list(range(30))
        time.sleep(1.5)
        assert used.execute("SELECT 'small after idle'").fetchone() == ("small after idle",)


@pytest.mark.parametrize("mode", ["session", "transaction"])
def test_many_busy_connections_give_their_buffers_back_between_events(bouncer, mode):
    """Beyond 512 KB of input buffers held, linked clients and servers
    give theirs back at the end of every event too (doc/benchmarks.md, "Memory
    per active client"): 100 clients at once, each in a transaction on its own
    server, pass packets larger than pkt_buf, partial packets, COPY both ways
    and pipelines intact through buffers taken anew at each event."""
    # 16 KB buffers: the bound is 32 of them, which the 200 sockets cross
    b = bouncer(ini_overrides={"pool_mode": mode, "pkt_buf": "16384", "default_pool_size": "105",
                               "min_workers": "1", "max_workers": "1"})
    payload = "0123456789abcdef" * 4096  # 64 KB: more than a buffer, forwarded in parts
    conns = [b.connect() for _ in range(100)]
    start = threading.Barrier(len(conns))

    def work(i):
        conn = conns[i]
        conn.execute("CREATE TEMP TABLE t (i int, s text)")  # the transaction: linked from now on
        start.wait(timeout=DEADLINE)  # every client holds a server and a buffer before the rest
        for rnd in range(3):
            assert conn.execute("SELECT length(%s), md5(%s)", [payload, payload]).fetchone() == (
                len(payload), hashlib.md5(payload.encode()).hexdigest())
            assert conn.execute("SELECT repeat('xy', 20000)").fetchone()[0] == "xy" * 20000
            with conn.pipeline():
                curs = [conn.execute("SELECT %s::int + %s", [i, k]) for k in range(10)]
            assert [c.fetchone()[0] for c in curs] == [i + k for k in range(10)]
            with conn.cursor().copy("COPY t FROM STDIN") as cp:
                for k in range(100):
                    cp.write_row((k, f"row {k} of client {i}"))
            with conn.cursor().copy("COPY (SELECT * FROM t ORDER BY i, s) TO STDOUT") as cp:
                out = b"".join(bytes(data) for data in cp)
            assert out.count(b"\n") == 100 * (rnd + 1) and out.endswith(f"row 99 of client {i}\n".encode())
        conn.rollback()
        assert conn.execute("SELECT 'after'").fetchone() == ("after",)

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(conns)) as pool:
            futures = [pool.submit(work, i) for i in range(len(conns))]
            _, stuck = concurrent.futures.wait(futures, timeout=DEADLINE)
            if stuck:
                b.send_signal(signal.SIGQUIT)  # the stuck clients get EOF, so that their threads end
            assert not stuck, f"{len(stuck)} clients got no answer within {DEADLINE}s"
            for f in futures:
                f.result()
    finally:
        for conn in conns:
            conn.close()


def test_copy_in_and_out(bouncer):
    b = bouncer()
    with b.connect(autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE cp (id int, t text)")
        with conn.cursor() as cur:
            with cur.copy("COPY cp (id, t) FROM STDIN") as copy:
                for i in range(20000):
                    copy.write_row((i, f"line {i}"))
        assert conn.execute("SELECT count(*), sum(id) FROM cp").fetchone() == (20000, sum(range(20000)))
        rows = []
        with conn.cursor() as cur:
            with cur.copy("COPY (SELECT id, t FROM cp ORDER BY id) TO STDOUT") as copy:
                for row in copy.rows():
                    rows.append(row)
        assert len(rows) == 20000
        assert rows[0] == ("0", "line 0") and rows[-1] == ("19999", "line 19999")
        # a failing COPY leaves the connection usable
        with pytest.raises(errors.InvalidTextRepresentation):
            with conn.cursor() as cur:
                with cur.copy("COPY cp (id, t) FROM STDIN") as copy:
                    copy.write(b"notanumber\tx\n")
        assert conn.execute("SELECT count(*) FROM cp").fetchone() == (20000,)


def test_server_reused_after_failed_copy(bouncer, pg):
    b = bouncer()
    with b.connect(autocommit=True) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        conn.execute("CREATE TEMP TABLE cpf (id int)")
        with pytest.raises(errors.InvalidTextRepresentation):
            with conn.cursor() as cur:
                with cur.copy("COPY cpf FROM STDIN") as copy:
                    copy.write(b"x\n")
        # nothing else runs: the last thing the server did was the failed COPY
    wait_reset(b, pg, pid)
    with b.connect(autocommit=True) as conn:
        assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] == pid


def test_notice_and_notify(bouncer):
    b = bouncer()
    notices = []
    with b.connect(autocommit=True) as listener, b.connect(autocommit=True) as sender:
        listener.add_notice_handler(lambda diag: notices.append((diag.severity, diag.message_primary)))
        listener.execute("DO $$ BEGIN RAISE NOTICE 'hello %', 42; END $$")
        assert ("NOTICE", "hello 42") in notices

        got = []
        listener.add_notify_handler(lambda n: got.append((n.channel, n.payload)))
        listener.execute("LISTEN pgb_chan")
        sender.execute("NOTIFY pgb_chan, 'the payload'")

        def delivered():
            listener.execute("SELECT 1")  # notifications are read along with a result
            return ("pgb_chan", "the payload") in got

        wait_for(delivered, "the notification to reach the listening client")


# ---------------------------------------------------------------------------
# server reuse and reset


def test_session_pool_reuses_server_after_reset(bouncer, pg):
    b = bouncer()
    with b.connect(autocommit=True) as first:
        pid = first.execute("SELECT pg_backend_pid()").fetchone()[0]
        first.execute("CREATE TEMP TABLE only_mine (a int)")
        first.execute("SET work_mem = '7MB'")
        first.execute("PREPARE p1 AS SELECT 1")
    wait_reset(b, pg, pid)
    with b.connect(autocommit=True) as second:
        assert second.execute("SELECT pg_backend_pid()").fetchone()[0] == pid
        assert second.execute("SELECT to_regclass('pg_temp.only_mine')").fetchone() == (None,)
        assert second.execute("SHOW work_mem").fetchone() == (pg.sql("SHOW work_mem")[0][0],)
        assert second.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() == (0,)


def test_server_closed_when_client_leaves_inside_transaction(bouncer, pg):
    b = bouncer()
    conn = b.connect()
    conn.execute("CREATE TEMP TABLE half (a int)")  # opens a transaction
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    conn.close()
    wait_for(lambda: backend_state(pg, pid) is None, "the server in a transaction to be closed")
    with b.connect(autocommit=True) as conn2:
        assert conn2.execute("SELECT pg_backend_pid()").fetchone()[0] != pid
        assert conn2.execute("SELECT to_regclass('pg_temp.half')").fetchone() == (None,)


def test_tracked_parameters_replayed_on_reused_server(bouncer, pg):
    b = bouncer()
    with b.connect(autocommit=True) as plain:
        pid = plain.execute("SELECT pg_backend_pid()").fetchone()[0]
        default_datestyle = plain.execute("SHOW DateStyle").fetchone()[0]
    assert default_datestyle != "German, DMY"
    wait_reset(b, pg, pid)
    with b.connect(autocommit=True, options="-c DateStyle=German", application_name="pgb-app") as conn:
        assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] == pid
        assert conn.execute("SHOW DateStyle").fetchone() == ("German, DMY",)
        assert conn.execute("SHOW application_name").fetchone() == ("pgb-app",)
        assert pg.sql("SELECT application_name FROM pg_stat_activity WHERE pid = %s", [pid])[0][0] == "pgb-app"
    wait_reset(b, pg, pid)
    # the next client without wishes gets the server's defaults back
    with b.connect(autocommit=True) as after:
        assert after.execute("SELECT pg_backend_pid()").fetchone()[0] == pid
        assert after.execute("SHOW DateStyle").fetchone() == (default_datestyle,)
        assert after.execute("SHOW application_name").fetchone() == ("",)


def test_set_timezone_does_not_leak(bouncer, pg):
    b = bouncer()
    default_tz = pg.sql("SHOW TimeZone")[0][0]
    other = "Asia/Tokyo" if default_tz != "Asia/Tokyo" else "Europe/Paris"
    with b.connect(autocommit=True) as first:
        pid = first.execute("SELECT pg_backend_pid()").fetchone()[0]
        first.execute(f"SET TimeZone = '{other}'")
        assert first.execute("SHOW TimeZone").fetchone() == (other,)
        assert first.info.parameter_status("TimeZone") == other
    wait_reset(b, pg, pid)
    with b.connect(autocommit=True) as second:
        assert second.execute("SELECT pg_backend_pid()").fetchone()[0] == pid
        assert second.execute("SHOW TimeZone").fetchone() == (default_tz,)
        assert second.info.parameter_status("TimeZone") == default_tz


def test_tracked_parameters_restored_without_reset_query(bouncer, pg):
    """Even when no reset query runs, a client gets the pool's defaults of
    the tracked parameters, not what the previous client SET."""
    b = bouncer(ini_overrides={"server_reset_query": ""})
    default_tz = pg.sql("SHOW TimeZone")[0][0]
    with b.connect(autocommit=True) as first:
        pid = first.execute("SELECT pg_backend_pid()").fetchone()[0]
        default_style = first.execute("SHOW DateStyle").fetchone()[0]
        first.execute("SET TimeZone = 'Asia/Tokyo'")
        first.execute("SET DateStyle = 'German'")
        first.execute("SET work_mem = '9MB'")  # not tracked: this one does leak without a reset
    wait_server_idle(b)
    with b.connect(autocommit=True) as second:
        assert second.execute("SELECT pg_backend_pid()").fetchone()[0] == pid
        assert second.execute("SHOW TimeZone").fetchone() == (default_tz,)
        assert second.execute("SHOW DateStyle").fetchone() == (default_style,)
        assert second.execute("SHOW work_mem").fetchone() == ("9MB",)


def test_invalid_tracked_parameter_value(bouncer):
    b = bouncer()
    w = PgWire(b.port)
    w.login(options="-c TimeZone=No/Such_Zone")
    w.send(query_message("SELECT 1"))
    w.expect_fatal("invalid server parameter")
    with b.connect(autocommit=True) as conn:
        assert conn.execute("SELECT 'pool fine'").fetchone() == ("pool fine",)


def test_application_name_goes_out_with_the_first_message(bouncer, pg):
    """In session mode the SET of a printable application_name is not waited
    for: it reaches the server in the same write as the client's first
    message, simple or extended, and that message already runs under it."""
    b = bouncer(ini_overrides={"default_pool_size": 1})
    mark = b.log_mark()
    pid = None
    names = ["first-app", "it's a \\path\\; DROP TABLE nothing; --", "third app"]
    for i, name in enumerate(names):
        if i % 2 == 0:
            w = PgWire(b.port)
            w.login(application_name=name)
            rows, err = w.simple_query("SELECT pg_backend_pid(), current_setting('application_name')")
            w.close()
            assert err is None, err
            row = (int(rows[0][0]), rows[0][1])
        else:
            with b.connect(autocommit=True, application_name=name) as conn:
                row = conn.execute("SELECT pg_backend_pid(), current_setting('application_name')",
                                   prepare=True).fetchone()
        pid = pid or row[0]
        assert row == (pid, name)  # one server throughout: nothing failed
        wait_reset(b, pg, pid)
    # a name PostgreSQL would rewrite is waited for, as every other tracked parameter is
    with pg.connect(application_name="caf\u00e9") as direct:
        rewritten = direct.execute("SELECT current_setting('application_name')").fetchone()[0]
    with b.connect(autocommit=True, application_name="caf\u00e9") as conn:
        assert conn.execute("SELECT pg_backend_pid(), current_setting('application_name')").fetchone() == \
            (pid, rewritten)
    assert "SET failed" not in b.log_text()[mark:]


def test_cancel_reaches_a_first_query_sent_behind_its_set(bouncer, pg):
    b = bouncer(ini_overrides={"default_pool_size": 1})
    with b.connect(autocommit=True, application_name="one") as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    wait_reset(b, pg, pid)
    with b.connect(autocommit=True, application_name="two") as conn:
        timer = threading.Timer(0.5, conn.cancel)
        timer.start()
        started = time.monotonic()
        with pytest.raises(errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(30)")
        timer.join()
        assert time.monotonic() - started < 20
        assert conn.execute("SELECT current_setting('application_name')").fetchone() == ("two",)


def test_options_forms(bouncer):
    b = bouncer()
    opts = r"-c DateStyle=SQL,\ DMY --TimeZone=UTC -capplication_name=opt-app"
    with b.connect(autocommit=True, options=opts) as conn:
        assert conn.execute("SHOW DateStyle").fetchone() == ("SQL, DMY",)
        assert conn.execute("SHOW TimeZone").fetchone() == ("UTC",)
        assert conn.execute("SHOW application_name").fetchone() == ("opt-app",)


@pytest.mark.parametrize("opts", ["-c application_name=a\\", "-c application_name=a\\\\", "--application-name=a\\ b\\"])
def test_options_backslash_as_postgresql_reads_it(bouncer, pg, opts):
    """A backslash takes the next character as it is, and one that ends
    `options` escapes nothing and is dropped, as PostgreSQL reads it."""
    b = bouncer()
    sql = "SELECT current_setting('application_name')"
    direct = PgWire(pg.port)
    direct.login(options=opts)
    expected = direct.simple_query(sql)
    direct.close()
    pooled = PgWire(b.port)
    pooled.login(password="postgres", options=opts)
    assert pooled.simple_query(sql) == expected
    pooled.close()


@pytest.mark.parametrize("params", [
    {"options": "-c TimeZone=UTC", "TimeZone": "Asia/Tokyo"},
    {"TimeZone": "Asia/Tokyo", "options": "-c TimeZone=UTC"},
])
def test_startup_parameter_wins_over_options(bouncer, pg, params):
    """PostgreSQL applies `options` first and the startup packet's own
    parameters after it, wherever `options` is in the packet: a client gets
    the same values through the pooler, in the welcome and on the server."""
    b = bouncer()
    sql = "SELECT current_setting('TimeZone')"
    direct = PgWire(pg.port)
    welcome = direct.login(**params)
    expected = [m for m in welcome if m[0] == b"S" and m[1].startswith(b"TimeZone\0")]
    assert direct.simple_query(sql) == ([["Asia/Tokyo"]], None)
    direct.close()
    pooled = PgWire(b.port)
    welcome = pooled.login(password="postgres", **params)
    assert [m for m in welcome if m[0] == b"S" and m[1].startswith(b"TimeZone\0")] == expected
    assert pooled.simple_query(sql) == ([["Asia/Tokyo"]], None)
    pooled.close()


def test_client_timezone_wins_over_server_state(bouncer, pg):
    b = bouncer()
    with b.connect(autocommit=True, options="-c TimeZone=Europe/Helsinki") as first:
        pid = first.execute("SELECT pg_backend_pid()").fetchone()[0]
        assert first.execute("SHOW TimeZone").fetchone() == ("Europe/Helsinki",)
    wait_reset(b, pg, pid)
    with b.connect(autocommit=True, options="-c TimeZone=America/Chicago") as second:
        assert second.execute("SELECT pg_backend_pid()").fetchone()[0] == pid
        assert second.execute("SHOW TimeZone").fetchone() == ("America/Chicago",)


# ---------------------------------------------------------------------------
# limits and timeouts


def test_pool_size_limit_queues_clients(bouncer, pg):
    b = bouncer(ini_overrides={"default_pool_size": 2})
    c1 = b.connect(autocommit=True)
    c2 = b.connect(autocommit=True)
    pid1 = c1.execute("SELECT pg_backend_pid()").fetchone()[0]
    pid2 = c2.execute("SELECT pg_backend_pid()").fetchone()[0]
    assert pid1 != pid2
    c3 = b.connect(autocommit=True)  # login works: the pool has its welcome
    job = Background(lambda: c3.execute("SELECT pg_backend_pid()").fetchone()[0])
    wait_for(lambda: (pool_row(b) or {}).get("cl_waiting") == 1, "SHOW POOLS to show cl_waiting = 1")
    row = pool_row(b)
    assert row["cl_active"] == 2 and row["sv_active"] == 2
    assert not job.done()
    c1.close()
    assert job.result() == pid1  # the released server, after its reset
    wait_for(lambda: (pool_row(b) or {}).get("cl_waiting") == 0, "the queue to drain")
    assert c2.execute("SELECT 2").fetchone() == (2,)


def test_max_client_conn(bouncer):
    b = bouncer(ini_overrides={"max_client_conn": 2})
    c1 = b.connect(autocommit=True)
    c2 = b.connect(autocommit=True)
    with pytest.raises(psycopg.OperationalError, match=re.escape("no more connections allowed (max_client_conn)")):
        b.connect(autocommit=True)
    w = PgWire(b.port)
    w.startup()
    w.expect_fatal("no more connections allowed (max_client_conn)")
    # the console is exempt
    with b.admin() as admin:
        assert show(admin, "POOLS")
    c1.close()
    wait_for(lambda: _can_connect(b), "a slot to free up after a client left")
    assert c2.execute("SELECT 1").fetchone() == (1,)


def test_connection_limits_survive_failed_logins(bouncer, pg):
    """Logins that fail in every possible way give their slot back."""
    b = bouncer(ini_overrides={"max_client_conn": 2, "max_db_client_connections": 2,
                               "max_user_client_connections": 2, "auth_type": "md5",
                               "server_login_retry": 1},
                databases={"postgres": pg.connstr("postgres"), "broken": pg.connstr("pgb_no_such_database")})
    for _ in range(3):
        w = PgWire(b.port)
        w.startup()
        w.authenticate(password="wrong")
        w = PgWire(b.port)
        w.startup(database="nosuchdb")
        w.authenticate(password="postgres")
        w = PgWire(b.port)
        w.startup(database="broken")
        w.authenticate(password="postgres")
        w = PgWire(b.port)
        w.send(b"garbage!")
        w.expect_closed()
        w = PgWire(b.port)
        w.send(b"\0\0\0\x10\x04\xd2\x16\x2e" + b"12345678")  # CancelRequest, unknown key
        w.expect_closed()
        w = PgWire(b.port)
        w.startup()
        w.close()
        with b.connect(autocommit=True, password="postgres") as conn:
            conn.execute("SELECT 1")
    # each limit of 2 still admits two clients at once
    def two_clients():
        try:
            c1 = b.connect(autocommit=True, password="postgres")
            c2 = b.connect(autocommit=True, password="postgres")
        except psycopg.OperationalError:
            return False
        ok = c1.execute("SELECT 1").fetchone() == c2.execute("SELECT 1").fetchone() == (1,)
        c1.close()
        c2.close()
        return ok
    wait_for(two_clients, "two clients to be admitted again")


def _can_connect(b):
    try:
        with b.connect(autocommit=True) as c:
            return c.execute("SELECT 1").fetchone() == (1,)
    except psycopg.OperationalError:
        return False


def test_query_wait_timeout(bouncer):
    b = bouncer(ini_overrides={"default_pool_size": 1, "query_wait_timeout": 1})
    holder = b.connect(autocommit=True)
    holder.execute("SELECT 1")
    waiter = b.connect(autocommit=True)
    with pytest.raises(psycopg.OperationalError) as exc:
        waiter.execute("SELECT 'never'")
    assert "query_wait_timeout" in str(exc.value)
    assert exc.value.sqlstate in (None, "08P01")
    assert holder.execute("SELECT 'holder fine'").fetchone() == ("holder fine",)


def test_console_set_pool_size_serves_a_client_already_waiting(bouncer):
    """A full pool with a waiting client: the pooler keeps its size cached and skips the
    launch check while full, so a larger default_pool_size set on the console must still
    reach the pool and give the waiting client a second server."""
    b = bouncer(ini_overrides={"default_pool_size": 1, "query_wait_timeout": 60})
    holder = b.connect()  # session mode: holds the pool's one server
    holder.execute("SELECT 1")
    waiter = b.connect(autocommit=True)
    bg = Background(lambda: waiter.execute("SELECT 'served'").fetchone())
    wait_for(lambda: int(pool_row(b)["cl_waiting"]) == 1, "a waiting client")
    with b.admin() as admin:
        assert admin.execute("SET default_pool_size = 2").statusmessage == "SET default_pool_size=2"
    assert bg.result() == ("served",)
    row = pool_row(b)
    assert (int(row["sv_active"]), int(row["cl_waiting"])) == (2, 0)
    assert holder.execute("SELECT 'holder fine'").fetchone() == ("holder fine",)


def test_query_wait_timeout_raw_sqlstate(bouncer):
    b = bouncer(ini_overrides={"default_pool_size": 1, "query_wait_timeout": 1})
    holder = b.connect(autocommit=True)
    holder.execute("SELECT 1")
    w = PgWire(b.port)
    w.login()
    w.send(b"Q\x00\x00\x00\x0dSELECT 1\x00")
    w.expect_fatal("query_wait_timeout")


def test_client_idle_timeout(bouncer):
    b = bouncer(ini_overrides={"client_idle_timeout": 1})
    mark = b.log_mark()
    idle = b.connect(autocommit=True)
    b.wait_log(r"C-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:\d+ closing because: client_idle_timeout", after=mark)
    with pytest.raises(psycopg.OperationalError):
        idle.execute("SELECT 1")
    w = PgWire(b.port)
    w.login()
    w.expect_fatal("client_idle_timeout")


def test_server_killed_mid_query(bouncer, pg):
    b = bouncer()
    victim = b.connect(autocommit=True)
    pid = victim.execute("SELECT pg_backend_pid()").fetchone()[0]
    job = Background(lambda: victim.execute("SELECT pg_sleep(30)"))
    wait_running(pg, "SELECT pg_sleep(30)")
    mark = b.log_mark()
    pg.sql("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(psycopg.OperationalError) as exc:
        job.result()
    msg = str(exc.value)
    assert ("server conn crashed?" in msg or "terminating connection" in msg
            or "server closed the connection" in msg), msg
    b.wait_log(r"S-0x[0-9a-f]+: .*closing because: server conn crashed\?", after=mark)
    # the pool recovers with a new server
    with b.connect(autocommit=True) as fresh:
        new_pid = fresh.execute("SELECT pg_backend_pid()").fetchone()[0]
        assert new_pid != pid
        assert fresh.execute("SELECT 'recovered'").fetchone() == ("recovered",)


def test_server_killed_while_client_idle(bouncer, pg):
    b = bouncer()
    conn = b.connect(autocommit=True)
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    pg.sql("SELECT pg_terminate_backend(%s)", [pid])
    wait_for(lambda: backend_state(pg, pid) is None, "the backend to exit")
    b.wait_log(r"S-0x[0-9a-f]+: .*closing because: server conn crashed\?")
    with pytest.raises(psycopg.OperationalError):
        conn.execute("SELECT 1")
    with b.connect(autocommit=True) as fresh:
        assert fresh.execute("SELECT pg_backend_pid()").fetchone()[0] != pid


def test_idle_pooled_server_killed(bouncer, pg):
    b = bouncer()
    with b.connect(autocommit=True) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    wait_reset(b, pg, pid)
    pg.sql("SELECT pg_terminate_backend(%s)", [pid])
    b.wait_log(r"S-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:\d+ closing because")
    with b.connect(autocommit=True) as conn:
        # the first request waits for a new server; a big one must survive the wait intact
        payload = "k" * 3_000_000
        assert conn.execute("SELECT length(%s), pg_backend_pid() <> %s", [payload, pid]).fetchone() == (
            3_000_000, True)


def test_cancel(bouncer, pg):
    b = bouncer()
    conn = b.connect(autocommit=True)
    conn.execute("SELECT 1")
    job = Background(lambda: conn.execute("SELECT pg_sleep(30)"))
    wait_running(pg, "SELECT pg_sleep(30)")
    conn.cancel()
    with pytest.raises(errors.QueryCanceled) as exc:
        job.result()
    assert exc.value.sqlstate == "57014"
    assert conn.execute("SELECT 'alive after cancel'").fetchone() == ("alive after cancel",)


def test_cancel_reaches_a_server_over_a_unix_socket(bouncer, pg):
    """The cancel goes to the socket path the server connection used (kept
    for servers only, doc/benchmarks.md, "Memory per idle client")."""
    b = bouncer(databases={"postgres": f"host={pg.sockdir} port={pg.port} dbname=postgres"})
    conn = b.connect(autocommit=True)
    conn.execute("SELECT 1")
    job = Background(lambda: conn.execute("SELECT pg_sleep(30)"))
    wait_running(pg, "SELECT pg_sleep(30)")
    conn.cancel()
    with pytest.raises(errors.QueryCanceled):
        job.result()
    assert conn.execute("SELECT 'alive after cancel'").fetchone() == ("alive after cancel",)


def test_cancel_reaches_a_server_over_an_abstract_unix_socket(bouncer, run_as, session_dir):
    """host=@name: the cancel connection uses the abstract name with its own
    length, as the server connection did (with the whole sockaddr_un length
    the name had NUL padding, named no socket, and the query ran on)."""
    server = Postgres(run_as, session_dir)
    name = f"@pgbt-abstract-{server.port}"
    server.settings["unix_socket_directories"] = f"'{server.sockdir},{name}'"
    try:
        server.start()
        b = bouncer(databases={"abstract": f"host={name} port={server.port} dbname=postgres"})
        conn = b.connect(dbname="abstract", autocommit=True)
        conn.execute("SELECT 1")
        job = Background(lambda: conn.execute("SELECT pg_sleep(30)"))
        wait_running(server, "SELECT pg_sleep(30)")
        conn.cancel()
        with pytest.raises(errors.QueryCanceled):
            job.result()
        assert conn.execute("SELECT 'alive after cancel'").fetchone() == ("alive after cancel",)
        conn.close()
    finally:
        server.stop()


def test_cancel_of_idle_client_is_harmless(bouncer):
    b = bouncer()
    conn = b.connect(autocommit=True)
    conn.execute("SELECT 1")
    conn.cancel()
    other = b.connect(autocommit=True)
    conn.cancel()
    assert conn.execute("SELECT 'still ok'").fetchone() == ("still ok",)
    assert other.execute("SELECT 'other ok'").fetchone() == ("other ok",)


# ---------------------------------------------------------------------------
# databases and users


def test_forced_user(bouncer, pg):
    pg.create_role("pgb_forced", password="forcedpw")
    b = bouncer(databases={"forced": pg.connstr("postgres", user="pgb_forced"),
                           "postgres": pg.connstr("postgres")})
    with b.connect(dbname="forced", autocommit=True) as conn:
        assert conn.execute("SELECT current_user, session_user").fetchone() == ("pgb_forced", "pgb_forced")
    with b.connect(autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)


def test_auto_database(bouncer, pg):
    if not pg.sql("SELECT 1 FROM pg_database WHERE datname = 'pgb_autodb'"):
        pg.sql("CREATE DATABASE pgb_autodb")
    b = bouncer(databases={"*": f"host={pg.host} port={pg.port}"})
    with b.connect(dbname="pgb_autodb", autocommit=True) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("pgb_autodb",)
    with b.connect(dbname="postgres", autocommit=True) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("postgres",)
    b.wait_log(r"registered new auto-database: pgb_autodb")


@pytest.mark.parametrize("extra", ["pool_size=7", "pool_mode=transaction", "max_db_connections=5",
                                   "application_name=reloaded"])
def test_reload_keeps_servers_of_an_entry_whose_connection_is_the_same(bouncer, pg, extra):
    """Only a change of how servers connect (dbname, host, port, user, connect_query,
    auth_dbname, auth_query, load_balance_hosts) replaces them on RELOAD (doc/pgbouncer.5.md
    "RELOADING"); a new pool size, pool_mode or limit keeps the session's server."""
    b = bouncer()
    conn = b.connect(autocommit=True)
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    b.databases["postgres"] = f"{pg.connstr('postgres')} {extra}"
    b.write_ini()
    with b.admin() as admin:
        admin.execute("RELOAD")
        assert [r["close_needed"] for r in show(admin, "SERVERS")] == [0]
    assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] == pid
    conn.close()
    wait_server_idle(b)
    with b.connect(autocommit=True) as conn:
        assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] == pid
    assert "database configuration changed" not in b.log_text()


def test_welcome_names_each_parameter_once_after_reloads(bouncer, pg):
    """A reload that changes how servers connect makes the pool's welcome
    again from the next server login: a client is told each server
    parameter once, however many such reloads came before."""
    b = bouncer()

    def welcome_names():
        w = PgWire(b.port)
        msgs = w.login()
        w.close()
        return [body.split(b"\0")[0].decode() for t, body in msgs if t == b"S"]

    first = welcome_names()
    assert len(first) == len(set(first)) and "server_version" in first
    for k in range(3):
        b.databases["postgres"] = f"{pg.connstr('postgres')} connect_query='SELECT {k}'"
        b.write_ini()
        with b.admin() as admin:
            admin.execute("RELOAD")
        names = welcome_names()
        assert sorted(names) == sorted(first), names


def test_reload_applies_a_changed_star_entry_to_auto_databases(bouncer, pg):
    """A changed `*` entry replaces the servers of the automatically created databases, and
    their new servers use the new definition (doc/pgbouncer.5.md "RELOADING")."""
    star = f"host={pg.host} port={pg.port}"
    b = bouncer(databases={"*": star})
    conn = b.connect(autocommit=True)
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    b.databases["*"] = f"{star} dbname=template1"
    b.write_ini()
    with b.admin() as admin:
        admin.execute("RELOAD")
        assert [r["close_needed"] for r in show(admin, "SERVERS")] == [1]
        assert {r["name"]: r["database"] for r in show(admin, "DATABASES")}["postgres"] == "template1"
    # the session keeps its server until it ends
    assert conn.execute("SELECT pg_backend_pid(), current_database()").fetchone() == (pid, "postgres")
    conn.close()
    wait_for(lambda: backend_state(pg, pid) is None, "the replaced server to close")
    with b.connect(autocommit=True) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("template1",)


def test_removed_database_leaves_show_pools(bouncer, pg):
    """RELOAD without an entry drops the database: its clients get "database removed", and
    its pools leave SHOW POOLS and SHOW STATS; the entry added again gets one pool again."""
    dbs = {"postgres": pg.connstr("postgres"), "dropme": pg.connstr("postgres")}
    b = bouncer(databases=dbs)
    conn = b.connect(dbname="dropme", autocommit=True)
    conn.execute("SELECT 1")
    admin = b.admin(prepare_threshold=None)
    b.databases = {"postgres": dbs["postgres"]}
    b.write_ini()
    admin.execute("RELOAD")
    with pytest.raises(psycopg.OperationalError, match="database removed"):
        conn.execute("SELECT 1")
    assert "dropme" not in [r["database"] for r in show(admin, "POOLS")]
    assert "dropme" not in [r["database"] for r in show(admin, "STATS")]
    b.databases = dbs
    b.write_ini()
    admin.execute("RELOAD")
    with b.connect(dbname="dropme", autocommit=True) as again:
        again.execute("SELECT 1")
        assert [(r["user"], r["cl_active"]) for r in show(admin, "POOLS") if r["database"] == "dropme"] == \
            [("postgres", 1)]


def test_unknown_database(bouncer):
    b = bouncer()
    with pytest.raises(psycopg.OperationalError, match=re.escape("no such database: nosuchdb")):
        b.connect(dbname="nosuchdb")
    w = PgWire(b.port)
    w.startup(database="nosuchdb")
    first = w.authenticate()
    assert first[0] == b"E"
    err = error_fields(first[1])
    assert (err["S"], err["C"], err["M"]) == ("FATAL", "08P01", "no such database: nosuchdb")
    assert w.at_eof()


def test_unknown_database_reported_after_auth(bouncer):
    """An unknown database is only revealed to a client that knows the password."""
    b = bouncer(ini_overrides={"auth_type": "md5"})
    w = PgWire(b.port)
    w.startup(database="nosuchdb")
    first = w.authenticate(password="wrong")
    assert error_fields(first[1])["M"] == "password authentication failed"
    w = PgWire(b.port)
    w.startup(database="nosuchdb")
    first = w.authenticate(password="postgres")
    assert error_fields(first[1])["M"] == "no such database: nosuchdb"


def test_unknown_databases_of_interleaved_logins(bouncer):
    """Each client is told about the database it asked for."""
    b = bouncer(ini_overrides={"auth_type": "md5"})
    a, c = PgWire(b.port), PgWire(b.port)
    a.startup(database="nosuch_a")
    request_a = a.read_msg()
    c.startup(database="nosuch_b")
    request_c = c.read_msg()
    first_a = a.authenticate(password="postgres", first=request_a)
    first_c = c.authenticate(password="postgres", first=request_c)
    assert error_fields(first_a[1])["M"] == "no such database: nosuch_a"
    assert error_fields(first_c[1])["M"] == "no such database: nosuch_b"


# ---------------------------------------------------------------------------
# logs and pidfile


def test_connection_log_lines(bouncer, pg):
    b = bouncer()
    with b.connect(autocommit=True) as conn:
        conn.execute("SELECT 1")
    assert b.pidfile.read_text().strip() == str(b.pid)
    b.wait_log(r"C-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:\d+ login attempt: "
               r"db=postgres user=postgres tls=no replication=no$")
    b.wait_log(rf"S-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:{pg.port} new connection to server "
               r"\(from 127\.0\.0\.1:\d+\)$")
    b.wait_log(r"C-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:\d+ closing because: client close request "
               r"\(age=\d+s\)$")


# ---------------------------------------------------------------------------
# flow control, concurrency, odd protocol paths


def worker_pids(b):
    """pids of the pooler's worker processes (children of the master)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if parent_pid(int(entry)) == b.pid:
                    pids.append(int(entry))
            except (FileNotFoundError, ProcessLookupError, IndexError):
                pass
    return pids


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_slow_reader_does_not_block_others_or_buffer_everything(bouncer):
    b = bouncer()
    other = b.connect(autocommit=True)
    other.execute("SELECT 1")
    w = PgWire(b.port)
    w.login()
    # ~60 MB of result that the client does not read for a while
    w.send(query_message("SELECT i, repeat('z', 100) FROM generate_series(1, 500000) i"))
    for i in range(20):
        assert other.execute("SELECT %s::int", [i]).fetchone() == (i,)
    workers = worker_pids(b)
    assert workers, "no worker process found"
    # the stalled result stays in PostgreSQL and the socket buffers, not in the pooler
    assert max(rss_kb(p) for p in workers) < 40_000, "pooler buffers a stalled result set"
    rows = 0
    expected_tail = "z" * 100
    while True:
        mtype, body = w.read_msg()
        if mtype == b"D":
            rows += 1
            assert body.endswith(expected_tail.encode())
        elif mtype == b"Z":
            break
        else:
            assert mtype in (b"T", b"C"), (mtype, body[:100])
    assert rows == 500000
    assert w.simple_query("SELECT 'after'") == ([["after"]], None)


def tcp_queues(local_port, remote_port):
    """(send queue, receive queue) in bytes of the IPv4 TCP socket local_port -> remote_port."""
    with open("/proc/net/tcp") as f:
        next(f)
        for row in f:
            fields = row.split()
            local, remote = fields[1], fields[2]
            if int(local.split(":")[1], 16) == local_port and int(remote.split(":")[1], 16) == remote_port:
                tx, rx = fields[4].split(":")
                return int(tx, 16), int(rx, 16)
    return 0, 0


def test_client_leaves_while_its_result_is_held_in_pooler(bouncer, pg):
    """The pooler has read a whole result (ReadyForQuery included) from the
    server but could not pass it on yet, and the client goes away: that
    server has unsent data, so it is closed rather than reset and reused
    (and the pool does not get stuck)."""
    b = bouncer(ini_overrides={"default_pool_size": 1, "pkt_buf": 4 * 1024 * 1024})
    rows = 15000
    full = rows * (1 + 4 + 2 + 4 + 100)  # DataRow messages alone
    # Getting the whole result into the pooler while the client is still far
    # behind depends on how the kernel sizes socket buffers: try a few times.
    for _ in range(10):
        w = PgWire(b.port, host=str(b.dir))  # unix socket: a small, fixed buffer towards the client
        w.login()
        pid = int(w.simple_query("SELECT pg_backend_pid()")[0][0][0])
        server_port = pg.sql("SELECT client_port FROM pg_stat_activity WHERE pid = %s", [pid])[0][0]
        w.send(query_message(f"SELECT repeat('q', 100) FROM generate_series(1, {rows})"))
        wait_for(lambda: backend_state(pg, pid)[0] == "idle", "PostgreSQL to have sent the whole result")
        # read a little at a time until nothing is left between PostgreSQL and the pooler; a
        # queue can show bytes for a moment after the last of them arrived (an ACK not sent
        # yet), so a quiet client socket means "look at the queues again", up to the deadline
        received = 0
        w.sock.settimeout(1)
        deadline = time.monotonic() + DEADLINE
        while any(tcp_queues(pg.port, server_port)) or any(tcp_queues(server_port, pg.port)):
            try:
                received += len(w.sock.recv(16384))
            except socket.timeout:
                assert time.monotonic() < deadline, f"the pooler stopped passing the result on at {received}"
        w.sock.settimeout(DEADLINE)
        held = received < full - 400_000  # far more than the unix socket can hold: the rest is in the pooler
        w.close()
        if held:
            wait_for(lambda: backend_state(pg, pid) is None, "the server with unsent data to be closed")
            break
        wait_for(lambda: backend_state(pg, pid) in (None, ("idle", "DISCARD ALL")),
                 "the server to be closed or reset")
        if backend_state(pg, pid):
            wait_server_idle(b)
    else:
        pytest.fail("the pooler never held a finished result for a slow client")
    with b.connect(autocommit=True) as conn:
        assert conn.execute("SELECT 'pool not stuck'").fetchone() == ("pool not stuck",)


def test_many_concurrent_clients_share_small_pool(bouncer, pg):
    b = bouncer(ini_overrides={"default_pool_size": 3},
                databases={"postgres": pg.connstr("postgres", application_name="pgb_concurrency")})
    errors_seen = []

    def client(n):
        try:
            with b.connect(autocommit=True) as conn:
                for i in range(10):
                    assert conn.execute("SELECT %s::int + %s::int", [n, i]).fetchone() == (n + i,)
                conn.execute("SELECT pg_sleep(0.01)")
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            errors_seen.append(repr(e))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(15)]
    for t in threads:
        t.start()
    most = 0
    while any(t.is_alive() for t in threads):
        count = pg.sql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgb_concurrency'")[0][0]
        most = max(most, count)
    for t in threads:
        t.join()
    assert not errors_seen, errors_seen
    assert 1 <= most <= 3, f"{most} server connections for a pool of 3"


def test_pipelined_queries_while_queued(bouncer):
    b = bouncer(ini_overrides={"default_pool_size": 1})
    holder = b.connect(autocommit=True)
    holder.execute("SELECT 1")
    w = PgWire(b.port)
    w.login()
    w.send(query_message("SELECT 'one'") + query_message("SELECT 'two'") + query_message("SELECT 'three'"))
    wait_for(lambda: (pool_row(b) or {}).get("cl_waiting") == 1, "the raw client to be queued")
    holder.close()
    got = []
    for _ in range(3):
        for mtype, body in w.read_until(b"Z"):
            if mtype == b"D":
                got.append(body[6:].decode())
    assert got == ["one", "two", "three"]


@pytest.mark.parametrize("warm", [False, True], ids=["first-login", "cached-welcome"])
def test_startup_and_query_in_one_packet(bouncer, warm):
    b = bouncer()
    if warm:
        with b.connect(autocommit=True) as conn:
            conn.execute("SELECT 1")
    w = PgWire(b.port)
    w.send(startup_packet({"user": "postgres", "database": "postgres"}) + query_message("SELECT 'eager'"))
    msgs = w.read_until(b"Z")
    assert msgs[0] == (b"R", b"\0\0\0\0")
    assert msgs[-1][0] == b"Z"
    rows, err = [], None
    for mtype, body in w.read_until(b"Z"):
        if mtype == b"D":
            rows.append(body[6:].decode())
        elif mtype == b"E":
            err = error_fields(body)
    assert (rows, err) == (["eager"], None)


def test_welcome_sequence(bouncer):
    b = bouncer()
    keys = set()
    for _ in range(2):  # the first login waits for the server, the second gets the cached welcome
        w = PgWire(b.port)
        msgs = w.login(application_name="welcome-test")  # after AuthenticationOk
        types = [t for t, _ in msgs]
        assert types[-2:] == [b"K", b"Z"], types
        assert set(types[:-2]) == {b"S"}, types
        pairs = [body.split(b"\0")[:2] for t, body in msgs if t == b"S"]
        params = dict(pairs)
        assert len(params) == len(pairs), f"a parameter is reported twice: {pairs}"
        for name in (b"server_version", b"client_encoding", b"DateStyle", b"TimeZone",
                     b"standard_conforming_strings", b"integer_datetimes", b"IntervalStyle"):
            assert name in params, (name, params)
        assert params[b"application_name"] == b"welcome-test"
        key = msgs[-2][1]
        assert len(key) == 8
        assert key[0] & 0x80 == 0, "the pid half of the key is positive"
        keys.add(key)
        assert w.simple_query("SELECT 1") == ([["1"]], None)
    assert len(keys) == 2


def test_empty_query(bouncer):
    b = bouncer()
    w = PgWire(b.port)
    w.login()
    w.send(query_message(""))
    assert [m[0] for m in w.read_until(b"Z")] == [b"I", b"Z"]
    assert w.simple_query("SELECT 1") == ([["1"]], None)


def test_notification_reaches_idle_client(bouncer, pg):
    b = bouncer()
    w = PgWire(b.port)
    w.login()
    assert w.simple_query("LISTEN idle_chan") == ([], None)
    pg.sql("NOTIFY idle_chan, 'wake up'")
    mtype, body = w.read_msg()  # no query sent: the server pushes it through the pooler
    assert mtype == b"A"
    assert body[4:].split(b"\0")[:2] == [b"idle_chan", b"wake up"]
    assert w.simple_query("SELECT 'ok'") == ([["ok"]], None)


def test_client_leaves_during_copy_in(bouncer, pg):
    b = bouncer(ini_overrides={"default_pool_size": 1})
    w = PgWire(b.port)
    w.login()
    w.simple_query("SELECT 1")
    pid = int(w.simple_query("SELECT pg_backend_pid()")[0][0][0])
    w.send(query_message("COPY (SELECT 1) TO STDOUT") + query_message("CREATE TEMP TABLE cpi (a int)"))
    w.read_until(b"Z")
    w.read_until(b"Z")
    w.send(query_message("COPY cpi FROM STDIN"))
    assert w.read_msg()[0] == b"G"
    w.send(message(b"d", b"1\n2\n"))
    w.close()
    wait_for(lambda: backend_state(pg, pid) is None, "the server left in COPY to be closed")
    with b.connect(autocommit=True) as conn:
        assert conn.execute("SELECT 'fresh server'").fetchone() == ("fresh server",)


def test_server_check_query_on_reuse(bouncer, pg):
    b = bouncer(ini_overrides={"server_check_delay": 0, "server_check_query": "SELECT 1"})
    with b.connect(autocommit=True) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    for _ in range(3):
        wait_server_idle(b)
        with b.connect(autocommit=True) as conn:
            assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] == pid


def test_query_timeout(bouncer, pg):
    b = bouncer(ini_overrides={"query_timeout": 1})
    conn = b.connect(autocommit=True)
    with pytest.raises(psycopg.OperationalError, match="query timeout"):
        conn.execute("SELECT pg_sleep(20)")
    with b.connect(autocommit=True) as fresh:
        assert fresh.execute("SELECT 'next'").fetchone() == ("next",)


def test_idle_transaction_timeout(bouncer, pg):
    b = bouncer(ini_overrides={"idle_transaction_timeout": 1})
    w = PgWire(b.port)
    w.login()
    pid = int(w.simple_query("SELECT pg_backend_pid()")[0][0][0])
    assert w.simple_query("BEGIN") == ([], None)
    w.expect_fatal("idle transaction timeout")
    wait_for(lambda: backend_state(pg, pid) is None, "the server in the abandoned transaction to be closed")
    with b.connect(autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_server_login_error_reaches_waiting_client(bouncer, pg):
    b = bouncer(databases={"broken": pg.connstr("pgb_no_such_database"), "postgres": pg.connstr("postgres")})
    w = PgWire(b.port)
    w.startup(database="broken")
    first = w.authenticate()
    assert first[0] == b"E", first
    err = error_fields(first[1])
    assert err["S"] == "FATAL"
    assert err["C"] == "3D000"  # the server's own SQLSTATE
    assert err["M"] == 'database "pgb_no_such_database" does not exist'
    with b.connect(autocommit=True) as conn:  # other pools are unaffected
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_server_down(bouncer, pg):
    dead_port = free_port()
    b = bouncer(ini_overrides={"client_login_timeout": 1, "server_login_retry": 30},
                databases={"down": f"host=127.0.0.1 port={dead_port} dbname=postgres",
                           "postgres": pg.connstr("postgres")})
    w = PgWire(b.port)
    w.startup(database="down")
    w.expect_fatal("client_login_timeout (server down)")  # AuthenticationOk comes with the welcome
    b.wait_log(r"S-0x[0-9a-f]+: down/postgres@127\.0\.0\.1:\d+ closing because: connect failed: "
               r"Connection refused \(age=\d+s\)$")
    w = PgWire(b.port)
    w.startup(database="down")
    w.expect_fatal(re.compile(r"server login has been failing, cached error: .+ \(server_login_retry\)"))
    with b.connect(autocommit=True) as conn:
        assert conn.execute("SELECT 'other pool fine'").fetchone() == ("other pool fine",)


def test_unix_socket_client(bouncer):
    b = bouncer()
    with psycopg.connect(host=str(b.dir), port=b.port, dbname="postgres", user="postgres",
                         autocommit=True) as conn:
        assert conn.execute("SELECT 'via unix'").fetchone() == ("via unix",)
    b.wait_log(r"C-0x[0-9a-f]+: postgres/postgres@unix\(\d+\):\d+ login attempt")


def test_tcp_keepalive_options_applied(bouncer):
    """tcp_keepidle reaches the client socket: the kernel's keepalive timer shows it."""
    import subprocess
    b = bouncer(ini_overrides={"tcp_keepalive": 1, "tcp_keepidle": 77, "tcp_keepintvl": 13})
    conn = b.connect()
    conn.execute("SELECT 1")

    def keepalive_timer():
        out = subprocess.run(["ss", "-tnoH", "state", "established", "sport", "=", f":{b.port}"],
                             capture_output=True, text=True).stdout
        return "timer:(keepalive," in out and out

    out = wait_for(keepalive_timer, "the keepalive timer on the client socket")
    # idle time 77 s: the first probe is due in a bit more than a minute
    assert "timer:(keepalive,1min" in out, out


def pooler_end_option(b, client, level, option):
    """getsockopt() on the pooler's end of a client's TCP connection: each
    worker's sockets are copied into this process (pidfd_getfd(), allowed to
    the user that started pgbouncer or to root) until one has the client's
    address as its peer."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd_getfd = 438  # x86_64 and aarch64 share the new syscall numbers
    want = client.getsockname()
    for pid in worker_pids(b):
        pidfd = os.pidfd_open(pid)
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    if not os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                        continue
                except OSError:
                    continue
                copy = libc.syscall(pidfd_getfd, pidfd, int(fd), 0)
                if copy < 0 and ctypes.get_errno() == errno.EBADF:
                    continue  # closed since the listing
                assert copy >= 0, f"pidfd_getfd: {os.strerror(ctypes.get_errno())}"
                with socket.socket(fileno=copy) as s:
                    try:
                        if s.family == socket.AF_INET and s.getpeername() == want:
                            return s.getsockopt(level, option)
                    except OSError:
                        pass  # a listener or an unconnected socket
        finally:
            os.close(pidfd)
    raise AssertionError(f"no worker holds the pooler's end of {want}")


def test_tcp_keepcnt_and_user_timeout_applied(bouncer):
    """tcp_keepcnt, tcp_keepintvl and tcp_user_timeout reach the pooler's
    end of a client connection (they are not inherited from the listener)."""
    b = bouncer(ini_overrides={"tcp_keepcnt": 7, "tcp_keepintvl": 11, "tcp_user_timeout": 4321})
    w = PgWire(b.port)
    try:
        w.login()
        assert pooler_end_option(b, w.sock, socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 7
        assert pooler_end_option(b, w.sock, socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 11
        assert pooler_end_option(b, w.sock, socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 4321
    finally:
        w.close()


def test_client_sockets_follow_tcp_keepalive_and_nodelay_across_reloads(bouncer):
    """Accepted client sockets have TCP_NODELAY, and SO_KEEPALIVE as
    tcp_keepalive says: the pooler sets both on its listening sockets, where
    accepted sockets take them from (no setsockopt() per login), so a reload
    or a console SET must reach the listeners of every worker."""
    b = bouncer(ini_overrides={"min_workers": 2, "max_workers": 2})

    def check(keepalive):
        # several logins, so that both workers' listeners are seen
        for _ in range(6):
            w = PgWire(b.port)
            try:
                w.login()
                assert pooler_end_option(b, w.sock, socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
                assert pooler_end_option(b, w.sock, socket.SOL_SOCKET, socket.SO_KEEPALIVE) == keepalive
            finally:
                w.close()

    check(keepalive=1)
    for value in (0, 1):
        b.update(tcp_keepalive=value)
        b.write_ini()
        with b.admin() as conn:
            conn.execute("RELOAD")
        check(keepalive=value)
    # a console SET too, on every worker
    with b.admin() as conn:
        conn.execute("SET tcp_keepalive = 0")
    check(keepalive=0)


# ---------------------------------------------------------------------------
# the welcome


def welcome_of(port, **params):
    """One login: the types of the messages after AuthenticationOk, in order,
    the ParameterStatus pairs (in order) and the BackendKeyData bodies."""
    w = PgWire(port)
    try:
        msgs = w.login(**params)
        w.send(message(b"X"))
    finally:
        w.close()
    types = b"".join(m[0] for m in msgs)
    pairs = [tuple(v.decode() for v in body.split(b"\0")[:2]) for t, body in msgs if t == b"S"]
    keys = [body for t, body in msgs if t == b"K"]
    return types, pairs, keys


@pytest.mark.parametrize("pool_mode", ["session", "transaction"])
def test_login_sends_what_postgres_sends(bouncer, pg, pool_mode):
    """A pooled login is AuthenticationOk, one ParameterStatus per parameter
    PostgreSQL reports, with PostgreSQL's values for the client's startup
    parameters, BackendKeyData and ReadyForQuery. The pool builds the
    ParameterStatus block once and copies it to the next client with the same
    values (doc/benchmarks.md): logins alternate values to catch a stale copy."""
    b = bouncer(ini_overrides={"pool_mode": pool_mode, "default_pool_size": 2})
    logins = [{"application_name": "app_a"}, {"application_name": "app_a"}, {"application_name": "app_b"},
              {}, {"application_name": "app_a", "options": "-c DateStyle=SQL,\\ DMY"},
              {"application_name": "app_a"}, {"client_encoding": "LATIN1"}, {}]
    for params in logins:
        direct_types, direct_pairs, _ = welcome_of(pg.port, **params)
        types, pairs, keys = welcome_of(b.port, **params)
        assert types == b"S" * len(pairs) + b"KZ", (params, types)
        assert len(keys) == 1 and len(keys[0]) == 8, keys
        names = [n for n, _ in pairs]
        assert len(names) == len(set(names)), f"a parameter reported twice: {pairs}"
        assert dict(pairs) == dict(direct_pairs), (params, pairs, direct_pairs)
        # the values a client reads back are the ones it was told
        with b.connect(autocommit=True, **params) as conn:
            shown = {n: conn.execute(f"SHOW {n}").fetchone()[0]
                     for n in ("application_name", "DateStyle", "client_encoding")}
        assert {n: dict(pairs)[n] for n in shown} == shown, (params, shown)


# ---- what a failed reset or check query leaves (doc/pgbouncer.5.md, server_reset_query) ----

def test_failed_reset_query_closes_the_server(bouncer):
    """Session mode, one server. The client leaves with statement_timeout =
    1 ms and enough temporary tables that DISCARD ALL takes longer: the
    reset is cancelled and its RESET ALL rolled back. That server is
    closed, not lent: the next client never sees the previous one's
    settings (a custom tenant setting an RLS policy reads, say). Before, B
    got A's backend with app.tenant = 'tenant-A' and the 1 ms timeout."""
    b = bouncer(ini_overrides={"pool_mode": "session", "default_pool_size": 1})
    a = b.connect(autocommit=True)
    pid_a = a.execute("SELECT pg_backend_pid()").fetchone()[0]
    a.execute("DO $$BEGIN FOR i IN 1..2000 LOOP EXECUTE format('CREATE TEMP TABLE t%s (x int)', i); "
              "END LOOP; END$$")
    a.execute("SELECT set_config('app.tenant', 'tenant-A', false)")
    a.execute("SET statement_timeout = 1")
    mark = b.log_mark()
    a.close()
    b.wait_log(r"closing because: server_reset_query failed", after=mark)
    with b.connect(autocommit=True) as c:
        pid_b, tenant, timeout = c.execute("SELECT pg_backend_pid(), current_setting('app.tenant', true), "
                                           "current_setting('statement_timeout')").fetchone()
    assert pid_b != pid_a
    assert tenant in (None, "") and timeout == "0"


def test_failed_check_query_closes_the_server(bouncer):
    """server_check_query fails on a server about to be lent: that server is
    closed, and the client gets another one (a fresh login)."""
    b = bouncer(ini_overrides={"pool_mode": "transaction", "default_pool_size": 1,
                               "server_check_query": "SELECT 1/0", "server_check_delay": 0})
    with b.connect(autocommit=True) as c:
        first = c.execute("SELECT pg_backend_pid()").fetchone()[0]
        second = c.execute("SELECT pg_backend_pid()").fetchone()[0]
    assert first != second
    assert "closing because: server_check_query failed" in b.log_text()


def test_a_release_inside_the_wake_up_of_waiters_hangs_nothing(bouncer):
    """Transaction mode, one server held in a transaction; c1 waits with a
    Close the pooler answers itself and a stray CopyDone, c2 with a query.
    When the holder commits, c1 is woken first and gives its server back at
    once (the CopyDone), inside the wake-up that woke it: c2 still gets its
    answer and the worker goes on. Before, the wake-up's walk of the
    waiting list lost its way and the worker spun for ever."""
    b = bouncer(ini_overrides={"pool_mode": "transaction", "default_pool_size": 1, "max_workers": 1})
    holder = b.connect()  # not autocommit: holds the only server
    holder.execute("SELECT 1")
    c1 = PgWire(b.port)
    c1.login()
    c2 = PgWire(b.port)
    c2.login()
    c1.send(message(b"C", b"Sx\0") + message(b"c"))
    wait_for(lambda: pool_row(b)["cl_waiting"] == 1, "c1 to wait")
    c2.send(message(b"Q", b"SELECT 42\0"))
    wait_for(lambda: pool_row(b)["cl_waiting"] == 2, "c2 to wait")
    holder.commit()
    c2.sock.settimeout(DEADLINE)
    assert any(t == b"D" for t, _ in c2.read_until(b"Z"))
    with b.connect(autocommit=True) as c3:
        assert c3.execute("SELECT 1").fetchone() == (1,)
    c1.close()
    c2.close()
