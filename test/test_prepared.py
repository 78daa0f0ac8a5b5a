"""Protocol-level prepared statements in transaction and statement pooling
(issue 9 point 5, spec/behaviours.md §5, spec/admin.md, spec/config.md
max_prepared_statements).

A client's named statements live with the client: whichever server its next
transaction gets, its Bind/Describe work (the pooler prepares the statement
there first, invisibly), two clients' statements of the same name never
clash, and each server holds at most max_prepared_statements of them (least
recently used evicted). The client sees PostgreSQL's own behaviour: a name
reused without Close is ERROR 42P05, an unknown name is ERROR 26000, Close of
an unknown name is answered by CloseComplete, DEALLOCATE ALL / DISCARD ALL
forget its statements; the connection stays usable after each error.

Where the exact message sequence matters the tests speak the protocol
themselves (PgWire from test_bad_input.py); elsewhere psycopg 3 with
prepare_threshold=0 (named statements _pg3_<n>, the same names in every
connection) stands for a real driver. Statements that return pg_backend_pid()
tell which server ran them; occupy() sends a client's next transaction to
another server than a given one (or to that one).
"""

import asyncio
import collections
import socket
import struct
import threading
import time

import psycopg
import pytest

try:
    import asyncpg
except ImportError:  # reported by the test that uses it, with a hint
    asyncpg = None

from conftest import wait_for
from helpers import conn_on, console, row, rows, two_workers
from pgwire import data_row as datarow, error_fields, message, PgWire, query_message

TX = {"pool_mode": "transaction", "default_pool_size": 2, "pkt_buf": 4096, "query_wait_timeout": 10}


# ---------------------------------------------------------------------------
# extended-protocol messages


def cstr(text):
    return (text if isinstance(text, bytes) else text.encode()) + b"\0"


def parse(name, query, oids=()):
    return message(b"P", cstr(name) + cstr(query) + struct.pack(f"!H{len(oids)}I", len(oids), *oids))


def bind(stmt, params=(), portal="", param_formats=(), result_formats=()):
    """Bind; parameters are str/int (sent as text), bytes (sent as they are) or None (NULL)."""
    parts = [cstr(portal), cstr(stmt), struct.pack(f"!H{len(param_formats)}H", len(param_formats), *param_formats),
             struct.pack("!H", len(params))]
    for p in params:
        if p is None:
            parts.append(struct.pack("!i", -1))
        else:
            value = p if isinstance(p, bytes) else str(p).encode()
            parts.append(struct.pack("!i", len(value)) + value)
    parts.append(struct.pack(f"!H{len(result_formats)}H", len(result_formats), *result_formats))
    return message(b"B", b"".join(parts))


def describe(kind, name):
    return message(b"D", kind + cstr(name))


def execute(portal="", max_rows=0):
    return message(b"E", cstr(portal) + struct.pack("!I", max_rows))


def close(kind, name):
    return message(b"C", kind + cstr(name))


def run(name, params=()):
    """Bind + Execute of a named statement (unnamed portal)."""
    return bind(name, params) + execute()


SYNC = message(b"S")
FLUSH = message(b"H")


def ready_for_query_count(data):
    """How many ReadyForQuery the client messages in `data` ask for (Sync and Query)."""
    n = pos = 0
    while pos < len(data):
        mtype = data[pos : pos + 1]
        (length,) = struct.unpack("!I", data[pos + 1 : pos + 5])
        pos += 1 + length
        n += mtype in (b"S", b"Q")
    return n


class Reply:
    """What the pooler answered, without NoticeResponse and ParameterStatus."""

    def __init__(self, msgs):
        self.msgs = [m for m in msgs if m[0] not in (b"N", b"S")]

    @property
    def types(self):
        """Message types as a string, e.g. '12DCZ' (ParseComplete, BindComplete, DataRow, ...)."""
        return "".join(m[0].decode() for m in self.msgs)

    @property
    def rows(self):
        return [datarow(body) for mtype, body in self.msgs if mtype == b"D"]

    @property
    def errors(self):
        """(severity, SQLSTATE, message) of each ErrorResponse."""
        found = []
        for mtype, body in self.msgs:
            if mtype == b"E":
                f = error_fields(body)
                found.append((f.get("S"), f.get("C"), f.get("M")))
        return found

    @property
    def status(self):
        """Transaction status of the last ReadyForQuery."""
        z = [body for mtype, body in self.msgs if mtype == b"Z"]
        return z[-1].decode() if z else None

    def __repr__(self):
        return f"Reply({self.types!r}, rows={self.rows!r}, errors={self.errors!r})"


def exchange(w, *msgs):
    """Sends the messages in one write and reads until every Sync/Query is answered."""
    data = b"".join(msgs)
    w.send(data)
    got, want = [], ready_for_query_count(data)
    while want:
        m = w.read_msg()
        assert m is not None, f"connection closed after {Reply(got)!r}"
        got.append(m)
        want -= m[0] == b"Z"
    return Reply(got)


def raw_client(b, app=None):
    """A raw protocol client logged in through the pooler (application_name=app)."""
    w = PgWire(b.port)
    w.login(**({"application_name": app} if app else {}))
    return w


def param_types(reply):
    """Parameter type OIDs of each ParameterDescription in a reply."""
    found = []
    for mtype, body in reply.msgs:
        if mtype == b"t":
            (n,) = struct.unpack("!H", body[:2])
            found.append(list(struct.unpack(f"!{n}I", body[2 : 2 + 4 * n])))
    return found


def no_such(name):
    return ("ERROR", "26000", f'prepared statement "{name}" does not exist')


def already(name):
    return ("ERROR", "42P05", f'prepared statement "{name}" already exists')


def failing_start(failing):
    """Messages that fail at once, and what comes back for them up to the
    ReadyForQuery: an error of the server (at execution) or one the pooler
    gives itself (a Bind of a name the client never prepared)."""
    if failing == "server error":
        return parse("", "SELECT 1 / (random() * 0)::int") + bind("") + execute(), "12EZ"
    return run("never"), "EZ"


def server_statements(w):
    """Query texts of the named statements on the server the raw client gets
    (with default_pool_size = 1 that is the only one)."""
    found, err = w.simple_query("SELECT statement FROM pg_prepared_statements")
    assert err is None, err
    return sorted(r[0] for r in found)


class Held:
    """Open transactions of occupy(); rollback() gives their servers back."""

    def __init__(self, conns):
        self.conns = conns

    def rollback(self):
        for c in self.conns:
            c.rollback()


def occupy(b, pid, leave=False, pool_size=2):
    """Takes all `pool_size` servers in open transactions, then gives back
    every one but backend `pid` (so the next transaction of any other client
    runs elsewhere), or with leave=True only `pid` (so it runs there)."""
    holders = []
    for _ in range(pool_size):
        c = b.connect()  # not autocommit: the open transaction keeps the server
        holders.append((c.execute("SELECT pg_backend_pid()").fetchone()[0], c))
    on_pid = [c for p, c in holders if p == pid]
    assert on_pid, f"backend {pid} is not among the pool's servers {[p for p, _ in holders]}"
    keep = [c for p, c in holders if (p != pid) == leave]
    for _, c in holders:
        if c not in keep:
            c.rollback()
    return Held(keep)


def read_n(w, n):
    """The next n messages (without NoticeResponse and ParameterStatus), when
    no ReadyForQuery is due (after a Flush)."""
    got = []
    while len(got) < n:
        m = w.read_msg()
        assert m is not None, f"connection closed after {Reply(got)!r}"
        if m[0] not in (b"N", b"S"):
            got.append(m)
    return Reply(got)


def prepared_of_client(b, w):
    """SHOW CLIENTS prepared_statements of the raw client `w` (found by its port:
    a DISCARD ALL may change its application_name)."""
    port = w.sock.getsockname()[1]
    with console(b) as admin:
        found = [r for r in rows(admin, "SHOW CLIENTS") if r["port"] == port]
    assert len(found) == 1, found
    return found[0]["prepared_statements"]


def client_list(b):
    with console(b) as admin:
        return rows(admin, "SHOW CLIENTS")


def prepared_of_servers(b):
    with console(b) as admin:
        return sorted(r["prepared_statements"] for r in rows(admin, "SHOW SERVERS") if r["database"] == "postgres")


def pool_mode_of(b, database="postgres", user="postgres"):
    with console(b) as admin:
        found = [r for r in rows(admin, "SHOW POOLS") if r["database"] == database and r["user"] == user]
    return found[0]["pool_mode"] if found else None


def stats_totals(b):
    with console(b) as admin:
        r = row(admin, "SHOW STATS_TOTALS", database="postgres")
        return r["client_parse_count"], r["server_parse_count"], r["bind_count"]


# ---------------------------------------------------------------------------
# statements follow their client from server to server


def test_statement_follows_client_to_another_server(bouncer):
    b = bouncer(ini_overrides=TX)
    w = raw_client(b)
    r = exchange(w, parse("S_1", "SELECT $1::int * 2, pg_backend_pid()"), run("S_1", [21]), SYNC)
    assert r.types == "12DCZ", r
    assert r.rows[0][0] == "42"
    first = int(r.rows[0][1])

    holder = occupy(b, first)
    # Describe alone, then Bind/Execute, each in its own transaction on the other server
    r = exchange(w, describe(b"S", "S_1"), SYNC)
    assert r.types == "tTZ", r
    r = exchange(w, run("S_1", [5]), SYNC)
    assert r.types == "2DCZ", r
    assert r.rows[0][0] == "10"
    second = int(r.rows[0][1])
    assert second != first, "occupy() should have kept the first server busy"
    holder.rollback()

    # and back on the first server (which has it already) with a Describe in the same pipeline
    holder = occupy(b, second)
    r = exchange(w, describe(b"S", "S_1"), run("S_1", [7]), SYNC)
    assert r.types == "tT2DCZ", r
    assert r.rows[0][0] == "14" and int(r.rows[0][1]) != second
    holder.rollback()
    assert w.simple_query("SELECT 'still fine'") == ([["still fine"]], None)


def test_statements_survive_the_loss_of_their_server(bouncer, pg):
    """The server that has the client's statements dies while idle: on the new
    one the pooler prepares them again."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    w = raw_client(b)
    r = exchange(w, parse("a", "SELECT 'a', pg_backend_pid()"), parse("b", "SELECT 'b' || $1::text"), run("a"), SYNC)
    assert r.types == "112DCZ", r
    old = int(r.rows[0][1])
    mark = b.log_mark()
    pg.sql("SELECT pg_terminate_backend(%s)", [old])
    b.wait_log(r"S-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:\d+ closing because", after=mark)
    r = exchange(w, run("a"), run("b", ["!"]), describe(b"S", "b"), SYNC)
    assert r.types == "2DC2DCtTZ", r
    assert r.rows[0][0] == "a" and int(r.rows[0][1]) != old and r.rows[1] == ["b!"]
    assert prepared_of_servers(b) == [2]


@pytest.mark.parametrize("mode", ["transaction", "statement"])
def test_same_name_different_texts_never_clash(bouncer, mode):
    b = bouncer(ini_overrides=dict(TX, pool_mode=mode, default_pool_size=1))
    a, c = raw_client(b, "clash_a"), raw_client(b, "clash_c")
    assert exchange(a, parse("S_1", "SELECT 'a:' || $1::text"), SYNC).types == "1Z"
    # the same name with another text and another parameter count, on the same (only) server
    assert exchange(c, parse("S_1", "SELECT 'c:' || $1::text, $2::int * 10"), SYNC).types == "1Z"
    for i in range(3):
        r = exchange(a, run("S_1", [i]), SYNC)
        assert (r.types, r.rows) == ("2DCZ", [[f"a:{i}"]]), r
        r = exchange(c, run("S_1", [i, i]), SYNC)
        assert (r.types, r.rows) == ("2DCZ", [[f"c:{i}", str(i * 10)]]), r
    # Describe answers with each client's own statement
    r = exchange(a, describe(b"S", "S_1"), SYNC)
    assert (r.types, param_types(r)) == ("tTZ", [[25]]), r
    r = exchange(c, describe(b"S", "S_1"), SYNC)
    assert (r.types, param_types(r)) == ("tTZ", [[25, 23]]), r
    # one server holds both, under names of its own
    assert server_statements(a) == ["SELECT 'a:' || $1::text", "SELECT 'c:' || $1::text, $2::int * 10"]
    assert prepared_of_client(b, a) == 1
    assert prepared_of_client(b, c) == 1
    assert prepared_of_servers(b) == [2]
    a.close()
    c.close()


WORKLOAD = [
    ("SELECT %s::int + 1000", lambda n, i: n * 100 + i + 1000),
    ("SELECT %s::int * 7", lambda n, i: (n * 100 + i) * 7),
    ("SELECT 'text ' || %s::text", lambda n, i: f"text {n * 100 + i}"),
    ("SELECT length(%s::text) + 100000", lambda n, i: len(str(n * 100 + i)) + 100000),
]


@pytest.mark.parametrize("mode,limit", [("transaction", 200), ("transaction", 2), ("statement", 3)])
def test_driver_clients_share_few_servers(bouncer, mode, limit):
    """8 psycopg clients with prepare_threshold=0 on 2 servers: every client
    names its statements _pg3_0, _pg3_1, ... in its own order, so the same name
    means another query in each client; with a small limit, servers evict all
    the time."""
    b = bouncer(ini_overrides=dict(TX, pool_mode=mode, max_prepared_statements=limit))
    failures = []

    def client(n):
        try:
            with b.connect(autocommit=True, prepare_threshold=0, application_name=f"drv{n}") as conn:
                order = WORKLOAD[n % 4:] + WORKLOAD[:n % 4]
                for i in range(6):
                    for sql, want in order:
                        assert conn.execute(sql, [n * 100 + i]).fetchone() == (want(n, i),), sql
                    if mode == "transaction":
                        with conn.transaction():
                            for sql, want in reversed(order):
                                assert conn.execute(sql, [n * 100 + i]).fetchone() == (want(n, i),), sql
                    with conn.pipeline():
                        curs = [(conn.execute(sql, [n * 100 + i]), want) for sql, want in order]
                    assert [c.fetchone() for c, _ in curs] == [(want(n, i),) for _, want in curs]
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            failures.append(f"client {n}: {e!r}")

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    client_parses, _, binds = stats_totals(b)
    assert client_parses >= 8 * len(WORKLOAD), "the clients did not use named statements"
    assert binds >= 8 * 6 * len(WORKLOAD)
    assert all(n <= limit for n in prepared_of_servers(b))


def test_answers_the_pooler_makes_up_keep_their_order(bouncer):
    """The ParseComplete for a statement the server has already and the
    CloseComplete of a Close (neither goes to the server) arrive in their place
    among the server's answers, as PostgreSQL would send them; a portal
    outlives the Close of its statement."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    a, c = raw_client(b), raw_client(b)
    assert exchange(a, parse("k", "SELECT 'known'"), SYNC).types == "1Z"
    r = exchange(c, parse("o", "SELECT 'o'"), run("o"),
                 parse("k2", "SELECT 'known'"), close(b"S", "o"), describe(b"S", "k2"), run("k2"),
                 close(b"S", "nothing"), parse("p", "SELECT 'p'"), bind("p"), close(b"S", "p"), execute(), SYNC)
    assert (r.types, r.rows) == ("12DC13tT2DC3123DCZ", [["o"], ["known"], ["p"]]), r
    for name in ("o", "p"):
        assert exchange(c, run(name), SYNC).errors == [no_such(name)]
    assert exchange(c, run("k2"), SYNC).rows == [["known"]]


def test_names_and_texts(bouncer):
    """Close and Parse of one name in one pipeline, with the same text or
    another; two names for one text (one Closed, the other lives on); one text
    with other parameter types is another statement."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    w, other = raw_client(b), raw_client(b)
    assert exchange(other, parse("a", "SELECT $1"), SYNC).types == "1Z"  # the server has "SELECT $1" already
    r = exchange(w, parse("x", "SELECT 'x1'"), close(b"S", "x"), parse("x", "SELECT 'x1'"), run("x"),
                 close(b"S", "x"), parse("x", "SELECT 'x2'"), run("x"), SYNC)
    assert (r.types, r.rows) == ("1312DC312DCZ", [["x1"], ["x2"]]), r
    r = exchange(w, parse("a", "SELECT $1"), parse("b", "SELECT $1"), parse("c", "SELECT $1", [23]),
                 describe(b"S", "a"), describe(b"S", "c"), run("a", ["7"]), run("b", ["8"]), run("c", ["9"]), SYNC)
    assert (r.types, r.rows) == ("111tTtT2DC2DC2DCZ", [["7"], ["8"], ["9"]]), r
    assert param_types(r) == [[25], [23]]  # unknown -> text; int4 as declared
    r = exchange(w, close(b"S", "a"), run("b", ["8"]), SYNC, run("a", ["7"]), SYNC)
    assert (r.types, r.rows, r.errors) == ("32DCZEZ", [["8"]], [no_such("a")]), r
    r = exchange(w, describe(b"S", "b"), describe(b"S", "c"), SYNC)
    assert param_types(r) == [[25], [23]], r
    assert exchange(other, run("a", ["other"]), SYNC).rows == [["other"]]
    # an empty query text is a statement too
    r = exchange(w, parse("empty", ""), run("empty"), SYNC)
    assert r.types == "12IZ", r
    assert prepared_of_client(b, w) == 4


@pytest.mark.parametrize("param, values, query, want", [
    # a timestamptz literal without an offset is read in the TimeZone of the session that parses it
    ("TimeZone", ["UTC", "Asia/Tokyo", "UTC"],
     "SELECT extract(epoch FROM '2020-01-02 03:04:05'::timestamptz)::int + $1::int",
     ["1577934245", "1577901845", "1577934245"]),
    ("DateStyle", ["ISO, MDY", "ISO, DMY", "ISO, MDY"], "SELECT ('03/04/2020'::date + $1::int)::text",
     ["2020-03-04", "2020-04-03", "2020-03-04"]),
    # the same bytes are another text in another client_encoding
    ("client_encoding", ["UTF8", "LATIN1", "UTF8"], "SELECT octet_length('\u00e9') + $1::int", ["2", "4", "2"]),
])
def test_same_text_parsed_in_other_settings_is_another_statement(bouncer, param, values, query, want):
    """PostgreSQL reads some tracked parameters when it parses a text:
    clients that prepare the same text with other values must get their own
    reading of it, as each would on its own connection, not the statement
    another client prepared on the shared server."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    clients = []
    for value in values:
        w = PgWire(b.port)
        w.login(**{param: value})
        clients.append(w)
    got = []
    for w in clients:
        r = exchange(w, parse("s", query), run("s", ["0"]), SYNC)
        assert r.types == "12DCZ", r
        got.append(r.rows[0][0])
    assert got == want
    again = [exchange(w, run("s", ["0"]), SYNC).rows[0][0] for w in reversed(clients)]
    assert again == list(reversed(want))
    # the clients of the same settings still share one statement on the server
    assert len(server_statements(clients[0])) == len(set(values))


def test_statement_prepared_again_after_a_set_is_not_another_clients(bouncer):
    """A client prepares a text in UTC, then SETs TimeZone, then its statement
    is prepared again (invisibly) on a server that lacks it, in the client's
    new setting. That server's statement is the Tokyo reading of the text: a
    client in UTC that prepares the same text there must still get the UTC
    reading, as on its own connection."""
    query = "SELECT extract(epoch FROM '2020-01-02 03:04:05'::timestamptz)::int + $1::int, pg_backend_pid()"
    utc, tokyo = "1577934245", "1577901845"
    b = bouncer(ini_overrides=TX)
    a = PgWire(b.port)
    a.login(TimeZone="UTC")
    r = exchange(a, parse("s", query), run("s", ["0"]), SYNC)
    assert r.rows[0][0] == utc
    first = int(r.rows[0][1])
    assert a.simple_query("SET TimeZone = 'Asia/Tokyo'")[1] is None

    holder = occupy(b, first)  # a's statement goes to the other server, in Tokyo
    r = exchange(a, run("s", ["0"]), SYNC)
    assert r.types == "2DCZ", r
    second = int(r.rows[0][1])
    assert second != first
    holder.rollback()

    holder = occupy(b, second, leave=True)  # and b's Parse of the same text goes there too
    other = PgWire(b.port)
    other.login(TimeZone="UTC")
    r = exchange(other, parse("t", query), run("t", ["0"]), SYNC)
    assert int(r.rows[0][1]) == second
    assert r.rows[0][0] == utc, "the UTC client got the statement parsed in the other client's TimeZone"
    holder.rollback()


def test_a_leaving_clients_names_are_free_for_the_next(bouncer):
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    for n in range(3):
        w = raw_client(b)
        r = exchange(w, parse("S_1", f"SELECT 'client {n}'"), parse("S_2", "SELECT 'shared'"), run("S_1"), run("S_2"),
                     SYNC)
        assert (r.types, r.rows) == ("112DC2DCZ", [[f"client {n}"], ["shared"]]), r
        w.close()
        wait_for(lambda: not [r for r in client_list(b) if r["database"] == "postgres"], "the client to leave")


def test_driver_rollback_deallocates_all(bouncer):
    """psycopg answers a rollback() with ROLLBACK and DEALLOCATE ALL (its
    cache is cleared) and then prepares again under new names; a client that
    shares the server goes on with its own statements, which the DEALLOCATE
    ALL dropped on the server."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    conn = b.connect(prepare_threshold=0)  # not autocommit: rollback() ends a transaction
    bystander = b.connect(autocommit=True, prepare_threshold=0)
    queries = ["SELECT %s::int + 1", "SELECT %s::int + 2", "SELECT %s::text || '!'"]
    for _ in range(3):
        for i in range(2):
            assert conn.execute(queries[0], [i]).fetchone() == (i + 1,)
            assert conn.execute(queries[1], [i]).fetchone() == (i + 2,)
            assert conn.execute(queries[2], [i]).fetchone() == (f"{i}!",)
        conn.rollback()
        for i in range(2):
            assert bystander.execute("SELECT %s::int * 100", [i]).fetchone() == (i * 100,)
    _, _, binds = stats_totals(b)
    assert binds >= 3 * 2 * 3, "psycopg did not use named statements"


def test_driver_pipeline_with_an_error_in_the_middle(bouncer):
    """psycopg pipelines of prepared statements on a shared server, one of
    them failing: what precedes is done, the rest up to the Sync is skipped,
    and every client goes on. (The statements are prepared before the first
    failing pipeline: psycopg 3.1 loses track of a Parse that an error skips.)"""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    conns = [b.connect(autocommit=True, prepare_threshold=0) for _ in range(3)]

    def good_pipeline(n, conn):
        with conn.pipeline():
            curs = [conn.execute("SELECT 1 / %s::int", [1]), conn.execute("SELECT %s::text", [f"c{n}"]),
                    conn.execute("SELECT %s::int + %s::int", [n, 10])]
        assert [c.fetchone() for c in curs] == [(1,), (f"c{n}",), (n + 10,)]

    for n, conn in enumerate(conns):
        good_pipeline(n, conn)
    for round_ in range(3):
        for n, conn in enumerate(conns):
            with pytest.raises(psycopg.errors.DivisionByZero):
                with conn.pipeline() as p:
                    first = conn.execute("SELECT %s::int + %s::int", [n, round_])
                    conn.execute("SELECT 1 / %s::int", [0])
                    conn.execute("SELECT %s::text", ["skipped"])
                    p.sync()
            assert first.fetchone() == (n + round_,)
            good_pipeline(n, conn)


def test_pipelined_transactions_hop_between_servers(bouncer):
    """Raw clients send many Sync-separated transactions in one write, on two
    servers that keep two statements each: after every Sync the rest of the
    pipeline may continue on another server, which gets what it lacks."""
    b = bouncer(ini_overrides=dict(TX, max_prepared_statements=2))
    failures = []

    def client(n):
        try:
            w = raw_client(b)
            r = exchange(w, *[parse(f"s{k}", f"SELECT $1::int * {k + 1} + {n * 1000}") for k in range(5)], SYNC)
            assert r.types == "11111Z", r
            for round_ in range(5):
                order = [(k + round_ + n) % 5 for k in range(5)] * 3
                msgs = []
                for i, k in enumerate(order):
                    msgs += [run(f"s{k}", [i]), SYNC]
                r = exchange(w, *msgs)
                assert r.types == "2DCZ" * len(order), r
                assert r.rows == [[str(i * (k + 1) + n * 1000)] for i, k in enumerate(order)], r
            w.close()
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            failures.append(f"client {n}: {e!r}")

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    assert all(n <= 2 for n in prepared_of_servers(b))


def test_flush_instead_of_sync(bouncer):
    """Drivers that send Parse or Describe with a Flush and wait for the answer
    before they Bind get it without a Sync: the ParseComplete the pooler makes
    up for a statement the server has already, and the Describe of a statement
    it must prepare on this server first."""
    b = bouncer(ini_overrides=TX)
    a, c = raw_client(b), raw_client(b)
    text = "SELECT $1::int * 3, pg_backend_pid()"
    r = exchange(a, parse("x", text), run("x", [1]), SYNC)
    assert r.types == "12DCZ", r
    first = int(r.rows[0][1])

    held = occupy(b, first, leave=True)  # c runs on the server that has the text
    c.send(parse("y", text) + FLUSH)
    assert read_n(c, 1).types == "1"
    c.send(describe(b"S", "y") + FLUSH)
    assert read_n(c, 2).types == "tT"
    c.send(run("y", [2]) + FLUSH)
    r = read_n(c, 3)
    assert (r.types, r.rows) == ("2DC", [["6", str(first)]]), r
    c.send(SYNC)
    assert read_n(c, 1).types == "Z"
    held.rollback()

    held = occupy(b, first)  # a runs on the other server
    a.send(describe(b"S", "x") + FLUSH)
    assert read_n(a, 2).types == "tT"
    a.send(run("x", [3]) + FLUSH)
    r = read_n(a, 3)
    assert r.types == "2DC" and r.rows[0][0] == "9" and int(r.rows[0][1]) != first, r
    a.send(SYNC)
    assert read_n(a, 1).types == "Z"
    held.rollback()


def test_answers_of_the_pooler_itself_come_on_flush(bouncer):
    """CloseComplete and the errors the pooler gives itself reach a client that
    sent Flush, before any Sync, as PostgreSQL's would."""
    b = bouncer(ini_overrides=TX)
    w = raw_client(b)
    assert exchange(w, parse("s", "SELECT 's'"), SYNC).types == "1Z"
    w.send(close(b"S", "s") + FLUSH)
    assert read_n(w, 1).types == "3"
    w.send(SYNC)
    assert read_n(w, 1).types == "Z"
    w.send(run("never") + FLUSH)
    assert read_n(w, 1).errors == [no_such("never")]
    w.send(SYNC)
    assert read_n(w, 1).types == "Z"
    w.send(parse("s", "SELECT 1") + FLUSH)
    assert read_n(w, 1).types == "1"
    w.send(parse("s", "SELECT 1") + FLUSH)
    assert read_n(w, 1).errors == [already("s")]
    w.send(SYNC)
    r = read_n(w, 1)
    assert (r.types, r.status) == ("Z", "I"), r


def test_statement_whose_table_is_dropped(bouncer, pg):
    """The table goes away: on the server that has the statement and on one
    where the pooler must prepare it, the client gets PostgreSQL's error at
    Bind, keeps its statement, and it works again once the table is back."""
    pg.sql("DROP TABLE IF EXISTS prep_dropped")
    pg.sql("CREATE TABLE prep_dropped (v int)")
    b = bouncer(ini_overrides=TX)
    w = raw_client(b)
    r = exchange(w, parse("cnt", "SELECT count(*), pg_backend_pid() FROM prep_dropped"), run("cnt"), SYNC)
    assert r.types == "12DCZ", r
    first = int(r.rows[0][1])
    pg.sql("DROP TABLE prep_dropped")
    gone = ("ERROR", "42P01", 'relation "prep_dropped" does not exist')
    for leave in (False, True, False):
        held = occupy(b, first, leave=leave)
        r = exchange(w, run("cnt"), SYNC)
        assert (r.types, r.errors, r.status) == ("EZ", [gone], "I"), (leave, r)
        held.rollback()
    pg.sql("CREATE TABLE prep_dropped (v int)")
    pg.sql("INSERT INTO prep_dropped VALUES (1), (2)")
    for leave in (False, True):
        held = occupy(b, first, leave=leave)
        r = exchange(w, run("cnt"), SYNC)
        assert r.types == "2DCZ" and r.rows[0][0] == "2" and (int(r.rows[0][1]) == first) == leave, (leave, r)
        held.rollback()
    r = exchange(w, parse("cnt", "SELECT 1"), SYNC)
    assert (r.types, r.errors) == ("EZ", [already("cnt")]), r


# ---------------------------------------------------------------------------
# eviction


def lru_after(accesses, limit):
    lru = collections.OrderedDict()
    for k in accesses:
        lru.pop(k, None)
        lru[k] = True
        while len(lru) > limit:
            lru.popitem(last=False)
    return set(lru)


@pytest.mark.parametrize("limit", [1, 2, 3, 4, 5])
def test_eviction_keeps_at_most_limit_per_server(bouncer, limit):
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1, max_prepared_statements=limit))
    w = raw_client(b, "evict")
    count = limit + 3
    texts = [f"SELECT $1::int + {k}" for k in range(count)]
    accesses = []

    def use(k, first=False):
        r = exchange(w, (parse(f"s{k}", texts[k]) if first else b"") + run(f"s{k}", [100]), SYNC)
        assert r.types == ("12DCZ" if first else "2DCZ"), r
        assert r.rows == [[str(100 + k)]]
        accesses.append(k)
        # the server holds the `limit` most recently used statements, never more
        assert server_statements(w) == sorted(texts[j] for j in lru_after(accesses, limit)), accesses

    for k in range(count):
        use(k, first=True)
    # evicted statements come back when used; a use refreshes a statement's place
    for k in [0, count - 1, 1, 0, 2, count - 1, count - 2, 0, 1]:
        use(k)
    # all of them in one pipeline (one Sync): statements are evicted while the pipeline runs
    r = exchange(w, *[run(f"s{k}", [1]) for k in range(count)], *[run(f"s{k}", [2]) for k in range(count)], SYNC)
    assert r.types == "2DC" * 2 * count + "Z", r
    assert r.rows == [[str(1 + k)] for k in range(count)] + [[str(2 + k)] for k in range(count)]
    assert len(server_statements(w)) == limit
    assert prepared_of_servers(b) == [limit]
    assert prepared_of_client(b, w) == count
    # another client parses as many and binds them all in one pipeline
    other = raw_client(b)
    r = exchange(other, *[parse(f"s{k}", f"SELECT $1::int - {k}") for k in range(count)],
                 *[run(f"s{k}", [100]) for k in range(count)], SYNC)
    assert r.types == "1" * count + "2DC" * count + "Z", r
    assert r.rows == [[str(100 - k)] for k in range(count)]
    assert prepared_of_servers(b) == [limit]


def test_limit_lowered_at_runtime(bouncer):
    """max_prepared_statements can change while servers hold statements (SET
    on the console): the next statement a server gets brings it down to the
    new limit."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1, max_prepared_statements=5))
    w = raw_client(b)
    assert exchange(w, *[parse(f"s{k}", f"SELECT {k}") for k in range(5)], SYNC).types == "11111Z"
    assert len(server_statements(w)) == 5
    with console(b) as admin:
        admin.execute("SET max_prepared_statements = 2")
    r = exchange(w, parse("n", "SELECT 'new'"), run("n"), SYNC)
    assert (r.types, r.rows) == ("12DCZ", [["new"]]), r
    assert server_statements(w) == ["SELECT 'new'", "SELECT 4"]
    assert exchange(w, run("s0"), SYNC).rows == [["0"]]
    assert server_statements(w) == ["SELECT 'new'", "SELECT 0"]
    assert prepared_of_servers(b) == [2]
    assert prepared_of_client(b, w) == 6


def test_eviction_on_shared_servers(bouncer):
    """Four clients with five statements each on two servers that keep three:
    two clients at a time hold a transaction (so both servers are in use), and
    in the same transaction the server never shows more than three."""
    limit = 3
    b = bouncer(ini_overrides=dict(TX, max_prepared_statements=limit))
    clients = [raw_client(b) for _ in range(4)]
    for n, w in enumerate(clients):
        r = exchange(w, *[parse(f"q{k}", f"SELECT $1::int * {k + 1} + {n * 1000}, pg_backend_pid()")
                          for k in range(5)], SYNC)
        assert r.types == "11111Z", r
    for round_ in range(2):
        for pair in ((0, 1), (2, 3), (0, 2), (1, 3), (3, 0)):
            for n in pair:
                assert clients[n].simple_query("BEGIN") == ([], None)
            pids = set()
            for n in pair:
                w = clients[n]
                for k in (list(range(5)) if round_ == 0 else [4, 0, 3, 1, 2]):
                    r = exchange(w, run(f"q{k}", [round_]), SYNC)
                    assert (r.types, r.status) == ("2DCZ", "T"), r
                    assert r.rows[0][0] == str(round_ * (k + 1) + n * 1000)
                    pids.add(r.rows[0][1])
                    count, err = w.simple_query("SELECT count(*) FROM pg_prepared_statements")
                    assert err is None and 1 <= int(count[0][0]) <= limit, (count, err)
            assert len(pids) == 2, f"the two open transactions ran on {pids}"
            for n in pair:
                assert clients[n].simple_query("COMMIT") == ([], None)
    assert all(n <= limit for n in prepared_of_servers(b))
    assert [prepared_of_client(b, w) for w in clients] == [5] * 4


# ---------------------------------------------------------------------------
# errors as PostgreSQL gives them


def test_simple_queries_between_extended_messages(bouncer):
    """A simple Query may come between extended-protocol messages, with or
    without a Sync before it; its ReadyForQuery may give the server back."""
    b = bouncer(ini_overrides=TX)
    w, other = raw_client(b), raw_client(b)
    assert exchange(other, parse("s", "SELECT 'other'"), SYNC).types == "1Z"
    r = exchange(w, parse("s", "SELECT 's'"), query_message("SELECT 'q'"), run("s"), SYNC,
                 query_message("SELECT 'q2'"), describe(b"S", "s"), run("s"), query_message("SELECT 'q3'"))
    assert (r.types, r.rows) == ("1TDCZ2DCZTDCZtT2DCTDCZ", [["q"], ["s"], ["q2"], ["s"], ["q3"]]), r
    assert exchange(other, run("s"), SYNC).rows == [["other"]]


def test_reused_name_is_an_error(bouncer):
    """The second Parse lands on a server that lacks the statement: the pooler
    itself must say what PostgreSQL would."""
    b = bouncer(ini_overrides=TX)
    w = raw_client(b)
    r = exchange(w, parse("dup", "SELECT 'first', pg_backend_pid()"), run("dup"), SYNC)
    assert r.types == "12DCZ", r
    first = int(r.rows[0][1])
    holder = occupy(b, first)
    for text in ("SELECT 'second'", "SELECT 'first', pg_backend_pid()"):  # another text or the same: both refused
        r = exchange(w, parse("dup", text), run("dup"), SYNC)
        assert (r.types, r.errors, r.status) == ("EZ", [already("dup")], "I"), r
    # in a pipeline: what came before is answered, the rest up to the Sync is skipped
    r = exchange(w, parse("other", "SELECT 'other'"), run("other"), parse("dup", "SELECT 'third'"), run("dup"),
                 run("other"), SYNC)
    assert (r.types, r.rows, r.errors) == ("12DCEZ", [["other"]], [already("dup")]), r
    # the name keeps its first statement and the connection works
    r = exchange(w, run("dup"), run("other"), SYNC)
    assert r.types == "2DC2DCZ", r
    assert r.rows[0][0] == "first" and int(r.rows[0][1]) != first and r.rows[1] == ["other"]
    holder.rollback()
    assert w.simple_query("SELECT 'usable'") == ([["usable"]], None)


def test_reused_name_is_logged(bouncer, either_bin):
    """A second Parse of `test` without a Close: both log PgBouncer's line.
    PgBouncer 1.25.2 closes the client (FATAL 08P01); we answer
    PostgreSQL's 42P05 and keep it (doc/transaction.md, "Errors a client
    can get")."""
    b = bouncer(ini_overrides=dict(TX, max_prepared_statements=100), binary=either_bin)
    w = raw_client(b)
    assert exchange(w, parse("test", "SELECT 1"), SYNC).types == "1Z"
    mark = b.log_mark()
    if either_bin.peer:
        w.send(parse("test", "SELECT 1") + SYNC)
        w.expect_fatal("prepared statement name is already in use", alone=True)
    else:
        r = exchange(w, parse("test", "SELECT 1"), SYNC)
        assert (r.types, r.errors, r.status) == ("EZ", [already("test")], "I"), r
        assert w.simple_query("SELECT 'usable'") == ([["usable"]], None)
    b.wait_log(r" ERROR C-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:\d+ "
               r"prepared statement 'test' was already prepared$", after=mark)


def test_unknown_name_is_an_error(bouncer):
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    w = raw_client(b)
    r = exchange(w, run("never"), SYNC)
    assert (r.types, r.errors, r.status) == ("EZ", [no_such("never")], "I"), r
    r = exchange(w, describe(b"S", "never"), SYNC)
    assert (r.types, r.errors, r.status) == ("EZ", [no_such("never")], "I"), r
    # in a pipeline between good statements
    r = exchange(w, parse("good", "SELECT 'good'"), run("good"), run("never"), run("good"), SYNC,
                 run("good"), SYNC)
    assert (r.types, r.rows, r.errors) == ("12DCEZ2DCZ", [["good"], ["good"]], [no_such("never")]), r
    # after the first error everything up to the Sync is skipped: one error only
    r = exchange(w, run("never"), describe(b"S", "never2"), parse("good", "SELECT 'dup'"), run("never3"), SYNC)
    assert (r.types, r.errors) == ("EZ", [no_such("never")]), r
    # a name that another client has prepared on the same (only) server is still unknown to this one
    other = raw_client(b)
    assert exchange(other, parse("theirs", "SELECT 'theirs'"), run("theirs"), SYNC).types == "12DCZ"
    for msg in (run("theirs"), describe(b"S", "theirs")):
        r = exchange(w, msg, SYNC)
        assert (r.types, r.errors) == ("EZ", [no_such("theirs")]), r
    assert exchange(other, run("theirs"), SYNC).rows == [["theirs"]]
    assert w.simple_query("SELECT 'usable'") == ([["usable"]], None)


@pytest.mark.parametrize("error", ["unknown", "reused"])
def test_error_inside_transaction_fails_it(bouncer, pg, error):
    """As in PostgreSQL, the error aborts the client's transaction block:
    ReadyForQuery says 'E' and a COMMIT rolls back. The transaction runs on
    another server than the one the statement was prepared on."""
    table = f"prep_tx_{error}"
    pg.sql(f"DROP TABLE IF EXISTS {table}")
    pg.sql(f"CREATE TABLE {table} (v int)")
    b = bouncer(ini_overrides=TX)
    w = raw_client(b)
    r = exchange(w, parse("mine", "SELECT pg_backend_pid()"), run("mine"), SYNC)
    holder = occupy(b, int(r.rows[0][0]))
    assert w.simple_query("BEGIN") == ([], None)
    assert w.simple_query(f"INSERT INTO {table} VALUES (1)") == ([], None)
    bad = run("never") if error == "unknown" else parse("mine", "SELECT 2")
    r = exchange(w, bad, SYNC)
    assert (r.types, r.errors, r.status) == ("EZ", [no_such("never") if error == "unknown" else already("mine")],
                                             "E"), r
    w.send(query_message("COMMIT"))
    r = Reply(w.read_until(b"Z"))
    assert r.types == "CZ" and r.msgs[0][1] == b"ROLLBACK\0" and r.status == "I", r
    holder.rollback()
    assert pg.sql(f"SELECT count(*) FROM {table}") == [(0,)]
    assert w.simple_query("SELECT 'usable'") == ([["usable"]], None)


def test_statement_messages_in_an_aborted_transaction(bouncer):
    """In a failed transaction block PostgreSQL refuses Parse and Describe
    with 25P02 (a Parse of a query the server has already included, and one
    of a name in use), still reports an unknown name with 26000, and carries
    out a Close; after ROLLBACK what the refused Parses named does not exist."""
    aborted = ("ERROR", "25P02", "current transaction is aborted, commands ignored until end of transaction block")
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    w, other = raw_client(b), raw_client(b)
    assert exchange(other, parse("o", "SELECT 'known'"), SYNC).types == "1Z"
    assert exchange(w, parse("s", "SELECT 's'"), SYNC).types == "1Z"
    assert w.simple_query("BEGIN") == ([], None)
    assert w.simple_query("SELECT 1 / 0")[1]["C"] == "22012"
    seen = {}
    for label, msg in [("parse of a known query", parse("x", "SELECT 'known'")),
                       ("parse of a new query", parse("y", "SELECT 'new'")),
                       ("describe", describe(b"S", "s")),
                       ("parse of a name in use", parse("s", "SELECT 'dup'")),
                       ("bind of an unknown name", run("nope")),
                       ("close", close(b"S", "s"))]:
        r = exchange(w, msg, SYNC)
        seen[label] = (r.types, r.errors, r.status)
    assert seen == {
        "parse of a known query": ("EZ", [aborted], "E"),
        "parse of a new query": ("EZ", [aborted], "E"),
        "describe": ("EZ", [aborted], "E"),
        "parse of a name in use": ("EZ", [aborted], "E"),
        "bind of an unknown name": ("EZ", [no_such("nope")], "E"),
        "close": ("3Z", [], "E"),
    }
    assert w.simple_query("ROLLBACK") == ([], None)
    for name in ("x", "y", "s"):
        assert exchange(w, run(name), SYNC).errors == [no_such(name)], name
    assert prepared_of_client(b, w) == 0
    assert exchange(other, run("o"), SYNC).rows == [["known"]]


def test_parse_pipelined_in_an_aborted_transaction(bouncer):
    """The same in pipelines: a Parse of a query the server has, sent behind
    a Query or an Execute whose answers are still to come, or behind another
    Parse and Sync, while the block has failed, gets 25P02 as from
    PostgreSQL (not a ParseComplete from the pooler), so the name stays free:
    after ROLLBACK it does not exist, and a driver's new Parse of it works."""
    aborted = ("ERROR", "25P02", "current transaction is aborted, commands ignored until end of transaction block")
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    w, other = raw_client(b), raw_client(b)
    known = "SELECT 'known ' || $1::text"
    assert exchange(other, parse("o", known), SYNC).types == "1Z"
    assert w.simple_query("BEGIN") == ([], None)
    assert w.simple_query("SELECT 1 / 0")[1]["C"] == "22012"
    r = exchange(w, query_message("SELECT 1"), parse("x", known), run("x", ["w"]), SYNC)
    assert (r.types, r.errors, r.status) == ("EZEZ", [aborted, aborted], "E"), r
    r = exchange(w, parse("", "SELECT 2"), bind(""), execute(), SYNC, parse("y", known), SYNC)
    assert (r.types, r.errors, r.status) == ("EZEZ", [aborted, aborted], "E"), r
    r = exchange(w, parse("p", "SELECT 'new'"), SYNC, parse("z", known), SYNC)
    assert (r.types, r.errors, r.status) == ("EZEZ", [aborted, aborted], "E"), r
    assert w.simple_query("ROLLBACK") == ([], None)
    for name in ("x", "y", "z", "p"):
        assert exchange(w, run(name), SYNC).errors == [no_such(name)], name
    assert prepared_of_client(b, w) == 0
    r = exchange(w, parse("x", known), run("x", ["again"]), SYNC)
    assert (r.types, r.rows, r.errors) == ("12DCZ", [["known again"]], []), r
    assert exchange(other, run("o", ["o"]), SYNC).rows == [["known o"]]


def test_close_unknown_names_and_close_then_reparse(bouncer):
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    w, other = raw_client(b), raw_client(b)
    r = exchange(w, close(b"S", "nope"), close(b"S", ""), close(b"P", "nope"), SYNC)
    assert (r.types, r.status) == ("333Z", "I"), r
    # both clients name a statement "c", on the one server
    r = exchange(w, parse("c", "SELECT 'first'"), run("c"), SYNC)
    assert (r.types, r.rows) == ("12DCZ", [["first"]]), r
    r = exchange(other, parse("c", "SELECT 'theirs'"), run("c"), SYNC)
    assert (r.types, r.rows) == ("12DCZ", [["theirs"]]), r
    # Close, then the same name for another text, in one pipeline
    r = exchange(w, close(b"S", "c"), parse("c", "SELECT 'second', $1::int"), run("c", [7]), SYNC)
    assert (r.types, r.rows) == ("312DCZ", [["second", "7"]]), r
    # Close alone, then the closed name is unknown
    r = exchange(w, close(b"S", "c"), SYNC, run("c"), SYNC)
    assert (r.types, r.errors) == ("3ZEZ", [no_such("c")]), r
    # closing twice is fine too
    assert exchange(w, close(b"S", "c"), SYNC).types == "3Z"
    assert prepared_of_client(b, w) == 0
    # the other client's "c" was never touched
    assert exchange(other, run("c"), SYNC).rows == [["theirs"]]
    r = exchange(w, parse("c", "SELECT 'third'"), run("c"), SYNC)
    assert (r.types, r.rows) == ("12DCZ", [["third"]]), r
    assert exchange(other, run("c"), SYNC).rows == [["theirs"]]


@pytest.mark.parametrize("command", ["DEALLOCATE ALL", "DISCARD ALL", "deallocate prepare all",
                                     "extended DEALLOCATE ALL"])
def test_deallocate_all_and_discard_all_forget_the_clients_statements(bouncer, command):
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    a, c = raw_client(b), raw_client(b)
    assert exchange(a, parse("s", "SELECT 'a1'"), parse("t", "SELECT 'a2'"), SYNC).types == "11Z"
    assert exchange(c, parse("s", "SELECT 'c1'"), SYNC).types == "1Z"
    assert prepared_of_client(b, a) == 2
    assert prepared_of_servers(b) == [3]
    if command.startswith("extended "):  # as an unnamed statement of the extended protocol
        r = exchange(a, parse("", command.split(" ", 1)[1]), bind(""), execute(), SYNC)
        assert (r.types, r.msgs[2][1]) == ("12CZ", b"DEALLOCATE ALL\0"), r
    else:
        assert a.simple_query(command) == ([], None)
    assert prepared_of_client(b, a) == 0
    assert prepared_of_client(b, c) == 1
    assert prepared_of_servers(b) == [0]  # PostgreSQL has dropped them all there
    for name in ("s", "t"):
        r = exchange(a, run(name), SYNC)
        assert (r.types, r.errors) == ("EZ", [no_such(name)]), r
    r = exchange(a, parse("s", "SELECT 'a3'"), run("s"), SYNC)
    assert (r.types, r.rows) == ("12DCZ", [["a3"]]), r
    assert prepared_of_client(b, a) == 1
    # the other client on the same server keeps its statement (the command dropped it on the server)
    r = exchange(c, run("s"), SYNC)
    assert (r.types, r.rows) == ("2DCZ", [["c1"]]), r
    assert prepared_of_client(b, c) == 1
    assert a.simple_query("SELECT 'usable'") == ([["usable"]], None)


DEALLOCATE_ALL = {"query": query_message("DEALLOCATE ALL"),
                  "extended": parse("", "DEALLOCATE ALL") + bind("") + execute()}


@pytest.mark.parametrize("how", DEALLOCATE_ALL)
def test_statements_parsed_behind_deallocate_all_in_a_pipeline(bouncer, how):
    """A pipeline sends DEALLOCATE ALL and, before its answer, a Parse that
    the pooler prepares on the server under its own name: the command drops
    what was prepared before it, not that statement, nor the client's name
    for it. Forgetting them made the pooler prepare the statement there
    again for the next client of the same text, and PostgreSQL refused that
    with "prepared statement "PGBOUNCER_1" already exists" on every Bind."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1, max_prepared_statements=1))
    w, other = raw_client(b), raw_client(b)
    text = "SELECT 'w', $1::int"
    r = exchange(w, parse("mine", text), run("mine", [1]), SYNC)
    assert r.rows == [["w", "1"]], r
    assert exchange(other, parse("u", "SELECT 'u'"), SYNC).types == "1Z"  # evicts text from the server
    r = exchange(other, DEALLOCATE_ALL[how], parse("same", text), parse("new", "SELECT 'new'"), SYNC)
    assert r.errors == [], r
    assert prepared_of_client(b, other) == 2
    for i in (2, 3):
        r = exchange(w, run("mine", [i]), SYNC)
        assert (r.types, r.rows) == ("2DCZ", [["w", str(i)]]), r
    r = exchange(other, run("same", [4]), run("new"), run("u"), SYNC)
    assert (r.rows, r.errors) == ([["w", "4"], ["new"]], [no_such("u")]), r


def test_eviction_skipped_behind_deallocate_all(bouncer):
    """An eviction sent behind a DEALLOCATE ALL and then skipped (an error
    between them) closes a statement the command has dropped already: it
    must not count as still on the server, or the next client's Bind of it
    goes there unprepared and fails."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1, max_prepared_statements=1))
    w, other = raw_client(b), raw_client(b)
    r = exchange(w, parse("mine", "SELECT 'w', $1::int"), run("mine", [1]), SYNC)
    assert r.rows == [["w", "1"]], r
    r = exchange(other, DEALLOCATE_ALL["extended"], run("never"), parse("p", "SELECT 'p'"), SYNC)
    assert r.errors == [no_such("never")], r
    r = exchange(w, run("mine", [2]), SYNC)
    assert (r.types, r.rows) == ("2DCZ", [["w", "2"]]), r

@pytest.mark.parametrize("command", ["DEALLOCATE ALL", "DISCARD ALL"])
def test_statements_prepared_behind_a_deallocate_all_in_one_write(bouncer, command):
    """A client that pipelines the command and the Parses after it (node-postgres
    with pipeline: true, say): PostgreSQL runs the command first, so the
    statements prepared behind it stay, as on a direct connection, for this
    client and on the server for the others. Whether the server had the
    statement before (another client's) or not (evicted), and whether an
    error skips the Parse after the command (the next use prepares it
    again) or nothing is dropped ahead of it at all."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1, max_prepared_statements=2))
    a, other = raw_client(b), raw_client(b)
    text_q, text_r = "SELECT 'q ' || $1::text", "SELECT 'r ' || $1::text"
    slow = query_message("SELECT pg_sleep(0.1)")  # the rest arrives before the command is answered
    assert exchange(other, parse("q", text_q), parse("r", text_r), SYNC).types == "11Z"

    # the server has the text already (the other client's)
    r = exchange(a, slow, query_message(command), parse("mine", text_q), run("mine", ["a1"]), SYNC)
    assert (r.types, r.rows, r.errors) == ("TDCZCZ12DCZ", [[""], ["q a1"]], []), r
    r = exchange(a, run("mine", ["a2"]), SYNC)
    assert (r.types, r.rows) == ("2DCZ", [["q a2"]]), r
    assert prepared_of_client(b, a) == 1
    for name, want in (("q", "q o1"), ("r", "r o1")):
        r = exchange(other, run(name, ["o1"]), SYNC)
        assert (r.types, r.rows) == ("2DCZ", [[want]]), r

    # the server does not have it (evicted by two others): the Parse behind the command prepares it
    assert exchange(other, parse("s", "SELECT 's'"), parse("t", "SELECT 't'"), SYNC).types == "11Z"
    r = exchange(a, slow, query_message(command), parse("mine2", text_r), run("mine2", ["a3"]), SYNC)
    assert (r.types, r.rows, r.errors) == ("TDCZCZ12DCZ", [[""], ["r a3"]], []), r
    for w, name, want in ((a, "mine2", "r a4"), (other, "r", "r a4"), (a, "mine2", "r a4")):
        r = exchange(w, run(name, ["a4"]), SYNC)
        assert (r.types, r.rows, r.errors) == ("2DCZ", [[want]], []), r
    fresh = raw_client(b)  # a new client preparing that text on that server
    r = exchange(fresh, parse("n", text_r), run("n", ["f"]), SYNC)
    assert (r.types, r.rows, r.errors) == ("12DCZ", [["r f"]], []), r

    # an error after the command: the Parse behind it is skipped, the next use prepares it again
    failing = parse("", "SELECT 1 / (random() * 0)::int") + bind("") + execute()
    r = exchange(a, slow, query_message(command), failing, parse("mine3", text_q), run("mine3"), SYNC)
    assert (r.types, [e[1] for e in r.errors]) == ("TDCZCZ12EZ", ["22012"]), r
    r = exchange(a, run("mine3", ["x"]), SYNC)
    assert (r.types, r.errors) == ("EZ", [no_such("mine3")]), r
    r = exchange(other, run("q", ["o2"]), SYNC)
    assert (r.types, r.rows, r.errors) == ("2DCZ", [["q o2"]], []), r

    # nothing dropped ahead, then an error: the server keeps what it had
    assert exchange(other, run("q", ["o3"]), SYNC).rows == [["q o3"]]
    r = exchange(a, query_message("SELECT 1"), failing, parse("mine4", text_q), run("mine4"), SYNC)
    assert (r.types, [e[1] for e in r.errors]) == ("TDCZ12EZ", ["22012"]), r
    r = exchange(other, run("q", ["o4"]), SYNC)
    assert (r.types, r.rows, r.errors) == ("2DCZ", [["q o4"]], []), r
    r = exchange(a, parse("mine4", text_q), run("mine4", ["a5"]), SYNC)
    assert (r.types, r.rows, r.errors) == ("12DCZ", [["q a5"]], []), r
    assert a.simple_query("SELECT 'usable'") == ([["usable"]], None)


@pytest.mark.parametrize("how", ["DO $$BEGIN EXECUTE 'DEALLOCATE ALL'; END$$", 'DEALLOCATE "PGBOUNCER_1"'])
def test_statements_dropped_where_the_pooler_cannot_see(bouncer, how):
    """Another client drops the server's statements in a way whose answer
    does not say so (DEALLOCATE ALL run by a function or DO block, whose
    CommandComplete says DO). The next Bind or Describe of each dropped
    statement on that server fails once with 26000 under the client's name;
    the pooler then prepares it again, for this client and for others,
    instead of failing every use. An SQL DEALLOCATE of the server-side name
    says DEALLOCATE: that server is closed when released
    (test_sql_prepare_never_replaces_another_clients_statement), and the
    next Bind, on a new one, prepares it again without an error."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    a, other, culprit = raw_client(b), raw_client(b), raw_client(b)
    r = exchange(a, parse("s", "SELECT 's ' || $1::text"), run("s", ["0"]), SYNC)
    assert (r.types, r.rows) == ("12DCZ", [["s 0"]]), r
    assert exchange(other, parse("o", "SELECT 's ' || $1::text"), SYNC).types == "1Z"
    assert culprit.simple_query(how) == ([], None)
    r = exchange(a, run("s", ["1"]), SYNC)
    if how.startswith("DEALLOCATE"):
        assert (r.types, r.rows, r.errors) == ("2DCZ", [["s 1"]], []), r
        return
    assert (r.types, r.errors) == ("EZ", [no_such("s")]), r
    for w, name in ((a, "s"), (other, "o"), (a, "s")):
        r = exchange(w, run(name, ["2"]), SYNC)
        assert (r.types, r.rows, r.errors) == ("2DCZ", [["s 2"]], []), r
    fresh = raw_client(b)
    r = exchange(fresh, parse("f", "SELECT 's ' || $1::text"), run("f", ["3"]), SYNC)
    assert (r.types, r.rows, r.errors) == ("12DCZ", [["s 3"]], []), r

    # a Describe finds out the same way
    assert culprit.simple_query(how) == ([], None)
    r = exchange(other, describe(b"S", "o"), SYNC)
    assert (r.types, r.errors) == ("EZ", [no_such("o")]), r
    r = exchange(other, describe(b"S", "o"), run("o", ["4"]), SYNC)
    assert (r.types, r.rows, r.errors) == ("tT2DCZ", [["s 4"]], []), r


def test_reset_query_always_drops_statements_on_the_server_only(bouncer):
    """With server_reset_query_always, DISCARD ALL runs on every release: the
    server's statements are gone, the client's are not, and the pooler
    prepares them again for each transaction."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1, server_reset_query_always=1))
    w, other = raw_client(b), raw_client(b)
    r = exchange(w, parse("s", "SELECT 'w ' || $1::text"), run("s", ["0"]), SYNC)
    assert (r.types, r.rows) == ("12DCZ", [["w 0"]]), r
    assert exchange(other, parse("s", "SELECT 'other'"), SYNC).types == "1Z"
    for i in range(1, 4):
        r = exchange(w, run("s", [i]), SYNC)
        assert (r.types, r.rows) == ("2DCZ", [[f"w {i}"]]), r
        assert exchange(other, run("s"), SYNC).rows == [["other"]]
    assert server_statements(w) == []  # the reset ran: between transactions the server holds none
    assert prepared_of_client(b, w) == 1
    assert prepared_of_client(b, other) == 1
    assert stats_totals(b) == (2, 2 + 3 * 2, 3 * 2 + 1)


def test_failing_parse_in_a_pipeline(bouncer):
    """A Parse that the server rejects leaves the name unknown (26000 on Bind,
    free for a new Parse), also when another client has a good statement of
    that name on the same server."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    w, other = raw_client(b), raw_client(b)
    assert exchange(other, parse("bad", "SELECT 'not bad'"), SYNC).types == "1Z"
    r = exchange(w, parse("ok", "SELECT 'ok'"), run("ok"), parse("bad", "SELEC 'bad'"), run("bad"), run("ok"), SYNC,
                 run("bad"), SYNC,
                 run("ok"), SYNC)
    assert r.types == "12DCEZEZ2DCZ", r
    assert r.rows == [["ok"], ["ok"]]
    assert [e[:2] for e in r.errors] == [("ERROR", "42601"), no_such("bad")[:2]], r
    assert r.errors[1] == no_such("bad")
    assert exchange(other, run("bad"), SYNC).rows == [["not bad"]]
    # the name is free: parsing it again is no "already exists"
    r = exchange(w, parse("bad", "SELECT 'fixed'"), run("bad"), SYNC)
    assert (r.types, r.rows) == ("12DCZ", [["fixed"]]), r
    assert exchange(other, run("bad"), SYNC).rows == [["not bad"]]


@pytest.mark.parametrize("failing", ["server error", "unknown name", "reused name"])
def test_statement_needed_after_an_error_in_the_same_pipeline(bouncer, failing):
    """After an error the server skips everything up to the Sync, also a Parse
    the pooler would add for a statement this server lacks: the statement must
    not count as prepared there."""
    b = bouncer(ini_overrides=TX)
    w = raw_client(b)
    r = exchange(w, parse("s", "SELECT 's', pg_backend_pid()"), parse("div", "SELECT 1 / $1::int"), run("s"), SYNC)
    assert r.types == "112DCZ", r
    first = int(r.rows[0][1])
    held = occupy(b, first)
    bad = {"server error": run("div", [0]), "unknown name": run("never"),
           "reused name": parse("s", "SELECT 'again'")}[failing]
    r = exchange(w, bad, run("s"), describe(b"S", "s"), SYNC)
    assert r.types == "EZ" and len(r.errors) == 1, r
    # the same server (the other one is still held), where "s" was never prepared
    r = exchange(w, run("s"), SYNC)
    assert r.types == "2DCZ", r
    assert r.rows[0][0] == "s" and int(r.rows[0][1]) != first, r
    r = exchange(w, run("div", [1]), SYNC)
    assert (r.types, r.rows) == ("2DCZ", [["1"]]), r
    held.rollback()


@pytest.mark.parametrize("failing", ["server error", "unknown name"])
def test_parse_of_a_known_text_after_an_error_is_skipped_too(bouncer, failing):
    """The server has the query already (another client's), so the pooler would
    answer the Parse itself; after an error in the same pipeline it must skip
    it as PostgreSQL does: no ParseComplete, and the name stays unknown."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    w, other = raw_client(b), raw_client(b)
    assert exchange(other, parse("o", "SELECT 'known'"), SYNC).types == "1Z"
    bad, answered = failing_start(failing)
    r = exchange(w, bad, parse("x", "SELECT 'known'"), run("x"), SYNC)
    assert r.types == answered, r
    r = exchange(w, run("x"), SYNC)
    assert (r.types, r.errors) == ("EZ", [no_such("x")]), r
    assert prepared_of_client(b, w) == 0
    r = exchange(w, parse("x", "SELECT 'known'"), run("x"), SYNC)
    assert (r.types, r.rows) == ("12DCZ", [["known"]]), r


@pytest.mark.parametrize("failing", ["server error", "unknown name"])
def test_close_and_reparse_after_an_error_are_skipped(bouncer, failing):
    """After an error, PostgreSQL skips a Close (the statement lives on) and a
    Parse of a name in use (no second error) up to the Sync."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    w = raw_client(b)
    assert exchange(w, parse("s", "SELECT 's'"), SYNC).types == "1Z"
    bad, answered = failing_start(failing)
    r = exchange(w, bad, close(b"S", "s"), parse("s", "SELECT 'other'"), run("s"), SYNC)
    assert r.types == answered and len(r.errors) == 1, r
    r = exchange(w, run("s"), SYNC)
    assert (r.types, r.rows) == ("2DCZ", [["s"]]), r
    assert prepared_of_client(b, w) == 1


def test_failing_bind_after_the_pooler_prepared_the_statement(bouncer):
    """The Parse the pooler adds succeeds and the client's Bind then fails
    (wrong parameter count): the statement is prepared on that server all the
    same, and the next Bind there works."""
    b = bouncer(ini_overrides=TX)
    w = raw_client(b)
    r = exchange(w, parse("s", "SELECT $1::int + 1, pg_backend_pid()"), run("s", [1]), SYNC)
    first = int(r.rows[0][1])
    held = occupy(b, first)
    r = exchange(w, run("s", []), SYNC)
    assert r.types == "EZ" and r.errors[0][:2] == ("ERROR", "08P01"), r
    # PostgreSQL's words, with the client's statement name in them (not the server-side one)
    assert r.errors[0][2] == 'bind message supplies 0 parameters, but prepared statement "s" requires 1', r
    r = exchange(w, run("s", [2]), SYNC)
    assert r.types == "2DCZ" and r.rows[0][0] == "3" and int(r.rows[0][1]) != first, r
    held.rollback()


@pytest.mark.parametrize("failing", ["server error", "unknown name"])
def test_query_of_a_skipped_parse_is_not_on_the_server(bouncer, failing):
    """A Parse skipped after an error prepared nothing on the server: the same
    query under another name in the next pipeline must be prepared for real."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    w, other = raw_client(b), raw_client(b)
    bad, answered = failing_start(failing)
    r = exchange(w, bad, parse("n", "SELECT 'skipped'"), SYNC)
    assert r.types == answered, r
    assert server_statements(w) == []
    for client, name in ((w, "m"), (other, "n")):
        r = exchange(client, parse(name, "SELECT 'skipped'"), run(name), SYNC)
        assert (r.types, r.rows) == ("12DCZ", [["skipped"]]), r


@pytest.mark.parametrize("failing", ["server error", "unknown name"])
def test_parse_skipped_after_an_error_evicts_nothing(bouncer, failing):
    """With room for one statement, a Parse that follows an error in the same
    pipeline is skipped (as PostgreSQL skips it): the name stays unknown, and
    the statement the server holds stays usable (no eviction happened)."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1, max_prepared_statements=1))
    w = raw_client(b)
    r = exchange(w, parse("a", "SELECT 'a'"), run("a"), SYNC)
    assert (r.types, r.rows) == ("12DCZ", [["a"]]), r
    bad, answered = failing_start(failing)
    r = exchange(w, bad, parse("b", "SELECT 'b'"), run("b"), SYNC)
    assert r.types == answered and len(r.errors) == 1, r
    r = exchange(w, run("a"), SYNC)
    assert (r.types, r.rows) == ("2DCZ", [["a"]]), r
    r = exchange(w, run("b"), SYNC)
    assert (r.types, r.errors) == ("EZ", [no_such("b")]), r
    r = exchange(w, parse("b", "SELECT 'b'"), run("b"), run("a"), SYNC)
    assert (r.types, r.rows) == ("12DC2DCZ", [["b"], ["a"]]), r
    assert server_statements(w) == ["SELECT 'a'"]
    assert prepared_of_client(b, w) == 2


def test_skipped_close_and_parse_of_a_known_text_leave_the_statement_counted(bouncer):
    """Behind an Execute a Parse of a text the server has goes out behind a Close
    of it. When an error has the server skip both, the server keeps its
    statement, which the pooler must keep counting (and close in due course)
    even when nobody else used that statement any more: else each round leaves
    one more PGBOUNCER_<n> on the server, beyond max_prepared_statements."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1, max_prepared_statements=2))
    w = raw_client(b)
    for _ in range(4):
        # the client's Close leaves the statement held by the server's list alone
        r = exchange(w, parse("k", "SELECT 'known'"), run("k"), close(b"S", "k"), SYNC)
        assert (r.types, r.rows) == ("12DC3Z", [["known"]]), r
        bad, answered = failing_start("server error")
        r = exchange(w, bad, parse("x", "SELECT 'known'"), run("x"), SYNC)
        assert r.types == answered, r
    on_server = server_statements(w)
    assert len(on_server) <= 2, on_server
    assert prepared_of_servers(b) == [len(on_server)]


def test_bind_of_never_parsed_statement_then_pipeline_goes_on(bouncer):
    """A Bind for a statement never parsed, with Flush and Describe of the portal,
    and the client's other statement prepared on another server."""
    b = bouncer(ini_overrides=TX)
    w = raw_client(b)
    r = exchange(w, parse("p", "SELECT pg_backend_pid()"), run("p"), SYNC)
    first = int(r.rows[0][0])
    holder = occupy(b, first)
    r = exchange(w, bind("ghost", [1]), FLUSH, describe(b"P", ""), execute(), SYNC,
                 bind("p"), describe(b"P", ""), execute(), SYNC)
    assert r.types == "EZ2TDCZ", r
    assert r.errors == [no_such("ghost")]
    assert int(r.rows[0][0]) != first
    holder.rollback()


# ---------------------------------------------------------------------------
# big and odd statements


def test_long_names_and_texts_beyond_pkt_buf(bouncer):
    b = bouncer(ini_overrides=TX)  # pkt_buf = 4096
    name_a = "n" * 59 + "a"  # 60 bytes (PostgreSQL's limit is 63)
    name_b = "n" * 59 + "b"
    text_a = "SELECT $1::int + length('" + "x" * 100_000 + "'), pg_backend_pid()"
    text_b = "SELECT $1::int - length('" + "y" * 100_000 + "'), pg_backend_pid() -- " + "z" * 5000
    w = raw_client(b, "long")
    r = exchange(w, parse(name_a, text_a), parse(name_b, text_b), run(name_a, [1]), run(name_b, [1]), SYNC)
    assert r.types == "112DC2DCZ", r
    assert [v[0] for v in r.rows] == ["100001", "-99999"]
    first = int(r.rows[0][1])
    # a second client with the same long name for another long text
    other = raw_client(b)
    r = exchange(other, parse(name_a, text_b), run(name_a, [2]), SYNC)
    assert (r.types, r.rows[0][0]) == ("12DCZ", "-99998"), r
    # on the other server the pooler must send the 100 kB Parse itself
    holder = occupy(b, first)
    r = exchange(w, describe(b"S", name_a), run(name_a, [3]), run(name_b, [3]), SYNC)
    assert r.types == "tT2DC2DCZ", r
    assert [v[0] for v in r.rows] == ["100003", "-99997"]
    assert int(r.rows[0][1]) != first
    holder.rollback()
    r = exchange(other, run(name_a, [4]), SYNC)
    assert (r.types, r.rows[0][0]) == ("2DCZ", "-99996"), r
    assert prepared_of_client(b, w) == 2


def test_messages_that_arrive_in_pieces(bouncer):
    """A 100 kB Parse and the rest of its pipeline trickle in: a piece of the
    header first, then small chunks (pkt_buf = 4096)."""
    b = bouncer(ini_overrides=TX)
    w = raw_client(b)
    text = "SELECT length('" + "p" * 100_000 + "') + $1::int"
    data = parse("piece" * 12, text) + run("piece" * 12, [1]) + describe(b"S", "piece" * 12) + SYNC
    w.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    w.send(data[:3])
    time.sleep(0.05)  # (not a timing assertion: lets the pooler see a partial header)
    for i, pos in enumerate(range(3, len(data), 1500)):
        w.send(data[pos : pos + 1500])
        if i % 10 == 0:
            time.sleep(0.005)
    r = Reply(w.read_until(b"Z"))
    assert (r.types, r.rows) == ("12DCtTZ", [["100001"]]), r
    r = exchange(w, run("piece" * 12, [2]), SYNC)
    assert (r.types, r.rows) == ("2DCZ", [["100002"]]), r


def test_parse_with_65535_parameter_types(bouncer):
    b = bouncer(ini_overrides=TX)
    w = raw_client(b)
    oids = [23] * 65535  # int4
    text = "SELECT $1::int + $65535::int, pg_backend_pid()"
    r = exchange(w, parse("many", text, oids), describe(b"S", "many"), SYNC)
    assert r.types == "1tTZ", r
    assert struct.unpack("!H", r.msgs[1][1][:2]) == (65535,)
    params = [1] + [None] * 65533 + [2]
    r = exchange(w, run("many", params), SYNC)
    assert r.types == "2DCZ", r
    assert r.rows[0][0] == "3"
    first = int(r.rows[0][1])
    holder = occupy(b, first)  # the pooler re-sends the 256 kB Parse on the other server
    r = exchange(w, run("many", [40] + [None] * 65533 + [2]), SYNC)
    assert r.types == "2DCZ", r
    assert r.rows[0][0] == "42" and int(r.rows[0][1]) != first
    holder.rollback()
    # the same text with other parameter types is another statement
    r = exchange(w, parse("few", text.replace("$65535", "$2"), [23, 23]), run("few", [1, 1]), SYNC)
    assert (r.types, r.rows[0][0]) == ("12DCZ", "2"), r


def test_odd_statement_names(bouncer):
    """Any name is the client's own: also the pooler's own naming scheme,
    quotes, spaces and UTF-8."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    names = ["PGBOUNCER_1", "PGBOUNCER_2", 'quote"d', "semi; colon", "ünïcødé 名前", " "]
    w, other = raw_client(b), raw_client(b)
    r = exchange(w, *[parse(n, f"SELECT 'w{i}'") for i, n in enumerate(names)], *[run(n) for n in names], SYNC)
    assert r.types == "1" * len(names) + "2DC" * len(names) + "Z", r
    assert r.rows == [[f"w{i}"] for i in range(len(names))]
    r = exchange(other, *[parse(n, f"SELECT 'other{i}'") for i, n in enumerate(reversed(names))],
                 *[run(n) for n in names], SYNC)
    assert r.rows == [[f"other{len(names) - 1 - i}"] for i in range(len(names))], r
    r = exchange(w, run('quote"d'), describe(b"S", "ünïcødé 名前"), SYNC)
    assert (r.types, r.rows) == ("2DCtTZ", [["w2"]]), r
    assert exchange(w, run("ünïcødé"), SYNC).errors == [no_such("ünïcødé")]
    assert exchange(w, parse("ünïcødé 名前", "SELECT 1"), SYNC).errors == [already("ünïcødé 名前")]


def test_server_side_names_do_not_reach_other_clients_statements(bouncer):
    """The names the pooler gives statements on the server (PGBOUNCER_<n> in
    PgBouncer) are no way into another client's statements: a name this
    client has not parsed is unknown to it, whatever the server holds."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    w, other = raw_client(b), raw_client(b)
    assert exchange(other, parse("secret", "SELECT 'the other client''s'"), SYNC).types == "1Z"
    found, err = w.simple_query("SELECT name FROM pg_prepared_statements")
    assert err is None and len(found) == 1, (found, err)
    for name in dict.fromkeys([found[0][0], "PGBOUNCER_1"]):
        r = exchange(w, run(name), SYNC)
        assert (r.types, r.errors) == ("EZ", [no_such(name)]), (name, r)
        r = exchange(w, describe(b"S", name), SYNC)
        assert (r.types, r.errors) == ("EZ", [no_such(name)]), (name, r)
        assert exchange(w, close(b"S", name), SYNC).types == "3Z"
    assert exchange(other, run("secret"), SYNC).rows == [["the other client's"]]


def test_rollback_prepared_in_a_failed_transaction_on_a_server_that_has_it(bouncer):
    """In a failed transaction PostgreSQL still takes a Parse of ROLLBACK: when
    the server already has that text (another client prepared it), the client's
    Parse must still succeed, and its ROLLBACK end the transaction (pgjdbc does
    this after an error inside a transaction)."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    w, other = raw_client(b), raw_client(b)
    assert exchange(other, parse("theirs", "ROLLBACK"), SYNC).types == "1Z"
    rows, err = w.simple_query("BEGIN")
    assert err is None
    rows, err = w.simple_query("SELECT 1 / 0")
    assert err["C"] == "22012"
    r = exchange(w, parse("mine", "ROLLBACK"), SYNC)
    assert (r.types, r.errors, r.status) == ("1Z", [], "E"), r
    r = exchange(w, run("mine"), SYNC)
    assert (r.types, r.errors, r.status) == ("2CZ", [], "I"), r
    # a statement that is no transaction exit is refused there, and its name stays free
    rows, err = w.simple_query("BEGIN")
    rows, err = w.simple_query("SELECT 1 / 0")
    r = exchange(w, parse("later", "SELECT 'later'"), SYNC)
    assert r.types == "EZ" and r.errors[0][1] == "25P02", r
    assert exchange(w, run("mine"), SYNC).status == "I"
    r = exchange(w, parse("later", "SELECT 'later'"), run("later"), SYNC)
    assert (r.types, r.rows) == ("12DCZ", [["later"]]), r


def test_sql_prepare_left_on_a_shared_server_is_not_reached_by_bind(bouncer):
    """A statement some client left on the shared server with SQL PREPARE is
    not another client's through a protocol Bind or Describe of its name:
    26000, as for any name that client never prepared; SQL EXECUTE still
    finds it (shared by nature, doc/transaction.md)."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    w, other = raw_client(b), raw_client(b)
    rows, err = other.simple_query("PREPARE left_behind AS SELECT 'the other client''s'")
    assert err is None, err
    for msgs in ((run("left_behind"), SYNC), (describe(b"S", "left_behind"), SYNC)):
        r = exchange(w, *msgs)
        assert (r.types, r.errors) == ("EZ", [no_such("left_behind")]), r
    rows, err = w.simple_query("EXECUTE left_behind")
    assert (rows, err) == ([["the other client's"]], None)


def test_bind_details_survive_on_another_server(bouncer):
    """A Bind the pooler forwards under another name keeps its portal name,
    parameter and result formats; a named portal is fetched in parts."""
    b = bouncer(ini_overrides=TX)
    w = raw_client(b)
    r = exchange(w, parse("g", "SELECT generate_series(1, $1::int), $2::text, pg_backend_pid()"), SYNC)
    assert r.types == "1Z", r
    held = None
    for _ in range(2):
        r = exchange(w, bind("g", [struct.pack("!i", 5), "t"], portal="cur", param_formats=[1, 0],
                             result_formats=[1, 0, 0]),
                     execute("cur", 2), execute("cur", 2), execute("cur", 0), SYNC)
        assert r.types == "2DDsDDsDCZ", r
        assert [row[:2] for row in r.rows] == [[struct.pack("!i", k).decode(), "t"] for k in range(1, 6)]
        pid = int(r.rows[0][2])
        if held:
            assert pid != first
            held.rollback()
        else:
            first = pid
            held = occupy(b, first)


def test_aborted_transaction_on_a_server_without_the_statement(bouncer):
    """Bind in a failed transaction on a server that lacks the statement: the
    client gets PostgreSQL's 25P02 (as it would for any Bind there), and after
    ROLLBACK the statement works on that server."""
    b = bouncer(ini_overrides=TX)
    w = raw_client(b)
    r = exchange(w, parse("s", "SELECT 's', pg_backend_pid()"), run("s"), SYNC)
    first = int(r.rows[0][1])
    held = occupy(b, first)
    assert w.simple_query("BEGIN") == ([], None)
    rows_, err = w.simple_query("SELECT 1 / 0")
    assert err["C"] == "22012", err
    r = exchange(w, run("s"), SYNC)
    assert r.types == "EZ" and r.errors[0][1] == "25P02" and r.status == "E", r
    assert w.simple_query("ROLLBACK") == ([], None)
    r = exchange(w, run("s"), SYNC)
    assert r.types == "2DCZ" and r.rows[0][0] == "s" and int(r.rows[0][1]) != first, r
    held.rollback()


def test_default_limit_is_200(bouncer):
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    w = raw_client(b)
    count = 250
    r = exchange(w, *[parse(f"d{k}", f"SELECT {k}") for k in range(count)], *[run(f"d{k}") for k in range(count)],
                 SYNC)
    assert r.types == "1" * count + "2DC" * count + "Z", r.types
    assert r.rows == [[str(k)] for k in range(count)]
    assert len(server_statements(w)) == 200
    assert prepared_of_servers(b) == [200]
    assert prepared_of_client(b, w) == count


def test_unnamed_statements_pass_through(bouncer):
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    w, other = raw_client(b), raw_client(b)
    r = exchange(w, parse("", "SELECT 'one ' || $1::text"), bind("", ["x"]), execute(),
                 parse("", "SELECT 'two ' || $1::text, $2::int"), describe(b"S", ""), bind("", ["y", 2]), execute(),
                 SYNC)
    assert (r.types, r.rows) == ("12DC1tT2DCZ", [["one x"], ["two y", "2"]]), r
    # another client's unnamed statement on the same server, then this one's again
    r = exchange(other, parse("", "SELECT 'other'"), bind(""), execute(), SYNC)
    assert (r.types, r.rows) == ("12DCZ", [["other"]]), r
    r = exchange(w, parse("", "SELECT 'three'"), describe(b"S", ""), bind(""), execute(), SYNC)
    assert (r.types, r.rows) == ("1tT2DCZ", [["three"]]), r
    assert server_statements(w) == []
    assert prepared_of_client(b, w) == 0
    assert stats_totals(b) == (0, 0, 0)


def test_close_of_the_unnamed_statement_by_another_client(bouncer):
    """Client B closes the unnamed statement while the server's is client
    A's: B has none there, so, as PostgreSQL answers a Close of a statement
    that does not exist, B gets CloseComplete, and A's statement stays."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    a, other = raw_client(b), raw_client(b)
    assert exchange(a, parse("", "SELECT 5"), SYNC).errors == []
    closed = exchange(other, close(b"S", ""), SYNC)
    assert (closed.types, closed.errors) == ("3Z", []), closed
    got = exchange(a, bind(""), execute(), SYNC)
    assert (got.errors, got.rows) == ([], [["5"]]), got
    # its own unnamed statement a client closes for real
    assert exchange(a, close(b"S", ""), SYNC).types == "3Z"
    assert [e[1] for e in exchange(a, bind(""), execute(), SYNC).errors] == ["26000"]


def unnamed_then_duplicate(w):
    """The unnamed statement, then a named Parse refused as a duplicate
    (42P05), then a Bind of the unnamed statement: a failed Parse of a
    named statement leaves the unnamed one alone."""
    assert exchange(w, parse("", "SELECT 5"), SYNC).errors == []
    assert exchange(w, parse("dup", "SELECT 1"), SYNC).errors == []
    dup = exchange(w, parse("dup", "SELECT 2"), SYNC)
    return dup.errors, exchange(w, bind(""), execute(), SYNC)


def test_refused_duplicate_leaves_the_unnamed_statement(bouncer, pg):
    direct = PgWire(pg.port)
    direct.login()
    want_errors, want = unnamed_then_duplicate(direct)
    direct.close()
    assert [e[1] for e in want_errors] == ["42P05"] and want.rows == [["5"]]
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    errors, got = unnamed_then_duplicate(raw_client(b))
    assert errors == want_errors
    assert (got.errors, got.rows) == ([], [["5"]]), got


def parses_of_one_name(w):
    """A name whose Parse is still unanswered when the client parses it
    again: whether that is a duplicate (42P05) depends on the first Parse's
    fate, decided by the server, so each pipeline is answered as
    PostgreSQL answers it."""
    replies = [
        # failed, then the same text again behind a Sync: the same error twice
        exchange(w, parse("s1", "SELEC 1"), SYNC, parse("s1", "SELEC 1"), SYNC),
        # and a Bind of the name after both: it does not exist
        exchange(w, parse("s2", "SELECT 1/0"), bind("s2"), execute(), SYNC, parse("s3", "SELEC 2"), SYNC,
                 parse("s3", "SELEC 2"), SYNC, bind("s3"), execute(), SYNC),
        # prepared, then again behind a Sync: a duplicate
        exchange(w, parse("s4", "SELECT 4"), SYNC, parse("s4", "SELECT 4"), SYNC, bind("s4"), execute(), SYNC),
        # in one part of the pipeline: a duplicate, or skipped with the first
        exchange(w, parse("s5", "SELECT 5"), parse("s5", "SELECT 6"), SYNC),
        exchange(w, parse("s6", "SELEC 6"), parse("s6", "SELEC 6"), SYNC),
        # a statement the server has already (answered by the pooler), behind a failing part
        exchange(w, parse("s7", "SELEC 7"), SYNC, parse("s8", "SELECT 8"), SYNC, parse("s8", "SELECT 8"), SYNC,
                 bind("s8"), execute(), SYNC),
        # skipped with an error ahead of it, then parsed again: the name was free
        exchange(w, parse("s9", "SELECT 1/0"), bind("s9"), execute(), parse("s10", "SELECT 10"), SYNC,
                 parse("s10", "SELECT 10"), SYNC, bind("s10"), execute(), SYNC),
    ]
    return [(r.types, r.errors, r.rows) for r in replies]


def deallocate_then_parse(w):
    """DEALLOCATE ALL through the extended protocol (as psycopg 3 sends
    it), then, in the same pipeline, a Parse of a name the client had: on
    PostgreSQL the name is free by then."""
    assert exchange(w, parse("s1", "SELECT 1"), SYNC).errors == []
    r = exchange(w, parse("", "DEALLOCATE ALL"), bind(""), execute(), parse("s1", "SELECT 2"), run("s1"), SYNC)
    return r.types, r.errors, r.rows


def test_parse_of_a_name_behind_deallocate_all_in_the_pipeline(bouncer, pg):
    direct = PgWire(pg.port)
    direct.login()
    want = deallocate_then_parse(direct)
    direct.close()
    assert want == ("12C12DCZ", [], [["2"]])
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    assert deallocate_then_parse(raw_client(b)) == want


def test_parse_again_of_a_name_whose_parse_is_unanswered(bouncer, pg):
    direct = PgWire(pg.port)
    direct.login()
    want = parses_of_one_name(direct)
    direct.close()
    assert [e[1] for e in want[0][1]] == ["42601", "42601"]
    assert [e[1] for e in want[2][1]] == ["42P05"] and want[2][2] == [["4"]]
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    other = raw_client(b)
    # the one server has SELECT 8 prepared already: s8's first Parse is answered by the pooler
    assert exchange(other, parse("x", "SELECT 8"), SYNC).errors == []
    assert parses_of_one_name(raw_client(b)) == want


@pytest.mark.parametrize("limit", [200, 0])
def test_unnamed_statement_of_another_client_is_never_bound(bouncer, limit):
    """pgx's QueryExecModeDescribeExec parses and describes the unnamed
    statement, then binds it in a second round trip. Between the two the
    server may have served another client, whose unnamed statement it then
    holds: the Bind must fail as on a server without one (PostgreSQL's own
    26000), never run the other client's query with this client's
    parameters. The client's own unnamed statement on a server that nobody
    else's Parse replaced keeps working across transactions."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1, max_prepared_statements=limit))
    w, other = raw_client(b), raw_client(b)
    r = exchange(w, parse("", "SELECT 'mine ' || $1::text"), describe(b"S", ""), SYNC)
    assert (r.types, r.errors) == ("1tTZ", []), r
    r = exchange(w, bind("", ["x"]), execute(), SYNC)
    assert (r.types, r.rows) == ("2DCZ", [["mine x"]]), r
    r = exchange(other, parse("", "SELECT 'other ' || $1::text"), describe(b"S", ""), SYNC)
    assert r.errors == [], r
    r = exchange(other, bind("", ["y"]), execute(), SYNC)
    assert (r.types, r.rows) == ("2DCZ", [["other y"]]), r
    for m in (bind("", ["x"]) + execute(), describe(b"S", "")):
        r = exchange(w, m, SYNC)
        assert (r.rows, r.errors, r.status) == (
            [], [("ERROR", "26000", "unnamed prepared statement does not exist")], "I"), r
    r = exchange(w, query_message("BEGIN"), bind("", ["x"]), execute(), SYNC, query_message("ROLLBACK"))
    assert (r.rows, r.errors) == ([], [("ERROR", "26000", "unnamed prepared statement does not exist")]), r
    r = exchange(w, parse("", "SELECT 'mine again'"), bind(""), execute(), SYNC)
    assert (r.types, r.rows) == ("12DCZ", [["mine again"]]), r


def test_max_prepared_statements_zero_turns_it_off(bouncer):
    """Off: named statements go to the server under the client's own name, as
    with no pooler; prepared on one server, they are unknown on another."""
    b = bouncer(ini_overrides=dict(TX, max_prepared_statements=0))
    w = raw_client(b, "off")
    r = exchange(w, parse("S_1", "SELECT pg_backend_pid()"), run("S_1"), SYNC)
    assert r.types == "12DCZ", r
    first = int(r.rows[0][0])
    holder = occupy(b, first)
    assert holder.conns[0].execute("SELECT name FROM pg_prepared_statements").fetchall() == [("S_1",)]
    r = exchange(w, run("S_1"), SYNC)
    assert (r.types, r.errors) == ("EZ", [no_such("S_1")]), r
    holder.rollback()
    assert prepared_of_client(b, w) == 0
    assert stats_totals(b) == (0, 0, 0)


@pytest.mark.parametrize("where", ["global", "database", "user"])
def test_session_mode_passes_names_through(bouncer, pg, where):
    """In session mode (the global pool_mode, a database's or a user's) the
    client owns its server: names reach it as the client wrote them."""
    ini, db_extra, users = dict(TX, pool_mode="session"), {}, None
    if where == "database":
        ini["pool_mode"], db_extra = "transaction", {"pool_mode": "session"}
    elif where == "user":
        ini["pool_mode"], users = "transaction", "postgres = pool_mode=session"
    b = bouncer(ini_overrides=ini, databases={"postgres": pg.connstr("postgres", **db_extra)}, start=False)
    if users:
        b.write_ini(extra_lines=["[users]", users])
    b.start()
    w = raw_client(b)
    assert pool_mode_of(b) == "session"
    r = exchange(w, parse("S_1", "SELECT 'mine'"), run("S_1"), SYNC)
    assert (r.types, r.rows) == ("12DCZ", [["mine"]]), r
    found, err = w.simple_query("SELECT name FROM pg_prepared_statements")
    assert (found, err) == ([["S_1"]], None)


@pytest.mark.parametrize("where", ["database", "user"])
def test_transaction_mode_of_one_pool_tracks_statements(bouncer, pg, where):
    """Global session mode, transaction mode for one database or user: there
    the pooler renames and shares as in global transaction mode."""
    ini, db_extra = dict(TX, pool_mode="session", default_pool_size=1), {}
    if where == "database":
        db_extra = {"pool_mode": "transaction"}
    b = bouncer(ini_overrides=ini, databases={"postgres": pg.connstr("postgres", **db_extra)}, start=False)
    if where == "user":
        b.write_ini(extra_lines=["[users]", "postgres = pool_mode=transaction"])
    b.start()
    a, c = raw_client(b), raw_client(b)
    assert pool_mode_of(b) == "transaction"
    assert exchange(a, parse("S_1", "SELECT 'a'"), SYNC).types == "1Z"
    assert exchange(c, parse("S_1", "SELECT 'c'"), SYNC).types == "1Z"
    assert exchange(a, run("S_1"), SYNC).rows == [["a"]]
    assert exchange(c, run("S_1"), SYNC).rows == [["c"]]
    assert "S_1" not in [r[0] for r in a.simple_query("SELECT name FROM pg_prepared_statements")[0]]


# ---------------------------------------------------------------------------
# stats and SHOW columns


def test_parse_and_bind_stats_and_show_columns(bouncer):
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1, max_prepared_statements=1, stats_period=1))
    a, c = raw_client(b, "stats_a"), raw_client(b, "stats_c")
    x = "SELECT 'x' || $1::text"
    r = exchange(a, parse("s1", x), run("s1", [1]), SYNC)
    assert (r.types, r.rows) == ("12DCZ", [["x1"]]), r
    assert stats_totals(b) == (1, 1, 1)
    for i in (2, 3):
        assert exchange(a, run("s1", [i]), SYNC).rows == [[f"x{i}"]]
    assert stats_totals(b) == (1, 1, 3)
    # the same text from another client is on the server already: no server Parse
    r = exchange(c, parse("t1", x), run("t1", [4]), SYNC)
    assert (r.types, r.rows) == ("12DCZ", [["x4"]]), r
    assert stats_totals(b) == (2, 1, 4)
    # unnamed statements are not counted
    r = exchange(a, parse("", "SELECT 'unnamed'"), run(""), SYNC)
    assert (r.types, r.rows) == ("12DCZ", [["unnamed"]]), r
    assert stats_totals(b) == (2, 1, 4)
    # a second statement evicts the first (limit 1) ...
    r = exchange(a, parse("s2", "SELECT 'y'"), run("s2"), SYNC)
    assert (r.types, r.rows) == ("12DCZ", [["y"]]), r
    assert stats_totals(b) == (3, 2, 5)
    # ... so the other client's Bind makes the pooler prepare it again
    assert exchange(c, run("t1", [5]), SYNC).rows == [["x5"]]
    assert stats_totals(b) == (3, 3, 6)
    with console(b) as admin:
        stats = row(admin, "SHOW STATS", database="postgres")
        totals = {r["name"]: r["value"] for r in rows(admin, "SHOW TOTALS")}
    assert (stats["total_client_parse_count"], stats["total_server_parse_count"], stats["total_bind_count"]) == (
        3, 3, 6)
    assert (totals["total_ps_client_parse_count"], totals["total_ps_server_parse_count"],
            totals["total_ps_bind_count"]) == (3, 3, 6)
    assert prepared_of_client(b, a) == 2
    assert prepared_of_client(b, c) == 1
    assert prepared_of_servers(b) == [1]

    # averages (per second over stats_period) follow while the client keeps parsing and binding
    n = [0]

    def averages_move():
        n[0] += 1
        assert exchange(a, parse(f"more{n[0]}", f"SELECT {n[0]}"), run(f"more{n[0]}"), SYNC).types == "12DCZ"
        with console(b) as admin:
            avg = row(admin, "SHOW STATS_AVERAGES", database="postgres")
            stats = row(admin, "SHOW STATS", database="postgres")
        return (avg["avg_client_parse_count"] > 0 and avg["avg_server_parse_count"] > 0 and avg["avg_bind_count"] > 0
                and stats["avg_client_parse_count"] > 0 and stats["avg_bind_count"] > 0)

    wait_for(averages_move, "non-zero parse and bind averages", interval=0.2)


# ---------------------------------------------------------------------------
# two workers


def test_two_workers(bouncer):
    """Clients of both workers prepare statements of the same names with other
    texts; then idle servers that hold one worker's statements are given to the
    other worker, whose clients prepare theirs there."""
    b = bouncer(ini_overrides=dict(TX, min_workers=2, max_workers=2, query_wait_timeout=20))
    two_workers(b)
    failures = []

    def client(conn, tag):
        try:
            for i in range(5):
                for k in range(3):
                    sql = f"SELECT %s::int * {k + 1}, '{tag}'"
                    assert conn.execute(sql, [i]).fetchone() == (i * (k + 1), tag)
                with conn.transaction():
                    assert conn.execute(f"SELECT %s::text || '{tag}'", [i]).fetchone() == (f"{i}{tag}",)
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            failures.append(f"{tag}: {e!r}")

    tags = [f"w{worker}c{n}" for worker in (0, 1) for n in range(3)]
    conns = [(conn_on(b, int(tag[1]), prepare_threshold=0, application_name=tag), tag) for tag in tags]
    threads = [threading.Thread(target=client, args=(c, tag)) for c, tag in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    # the console answers for both workers: each client has its 4 statements
    prepared = {r["application_name"]: r["prepared_statements"] for r in client_list(b)}
    assert all(prepared.get(tag, 0) >= 4 for tag in tags), prepared
    for c, _ in conns:
        c.close()

    # worker 0's clients leave both servers idle, holding their statements
    first = [conn_on(b, 0, prepare_threshold=0) for _ in range(2)]
    for n, c in enumerate(first):
        c.execute("BEGIN")
        assert c.execute(f"SELECT %s::int + {n}, 'zero'", [1]).fetchone() == (1 + n, "zero")
    for c in first:
        c.execute("COMMIT")
        c.close()
    # worker 1's clients need both: the servers move, and their statements are theirs
    mark = b.log_mark()
    second = [conn_on(b, 1, prepare_threshold=0) for _ in range(2)]
    for c in second:
        c.execute("BEGIN")
    for n, c in enumerate(second):
        assert c.execute(f"SELECT %s::int - {n}, 'one'", [1]).fetchone() == (1 - n, "one")
        assert c.execute("SELECT %s::text || ' one'", [n]).fetchone() == (f"{n} one",)
    b.wait_log(r"given back to another worker", after=mark)
    for c in second:
        c.execute("COMMIT")
        assert c.execute("SELECT %s::text || ' one'", ["again"]).fetchone() == ("again one",)

# ---------------------------------------------------------------------------
# A table's columns change under a named prepared statement (a migration that
# adds a column to a table an application reads with SELECT *). On PostgreSQL
# a prepared statement's result type is fixed when it is prepared: after the
# change its Bind (or Describe) fails with 0A000 "cached plan must not change
# result type", each time, and a new Parse of the same text (what asyncpg and
# pgjdbc do on that error) gives a statement with the new columns. Through the
# pooler the same holds whether the client's statement is still on its server
# or the pooler prepares it again from its text (after an eviction, or on
# another server connection): doc/transaction.md, "Schema changes".

CHANGED = ("ERROR", "0A000", "cached plan must not change result type")
ADD_COLUMN = "ALTER TABLE pr_schema ADD COLUMN c int DEFAULT 7"
TO_TEXT = "ALTER TABLE pr_schema ALTER COLUMN b TYPE text"
SCHEMA_QUERY = "SELECT * FROM pr_schema"


def fresh_schema_table(pg):
    pg.sql("DROP TABLE IF EXISTS pr_schema")
    pg.sql("CREATE TABLE pr_schema (a int, b int)")
    pg.sql("INSERT INTO pr_schema VALUES (1, 2)")


def story(w, pg, other=None, change=ADD_COLUMN):
    """Prepare, change the table, use the old statement, prepare the text again."""
    first = exchange(w, parse("s1", SCHEMA_QUERY), describe(b"S", "s1"), bind("s1"), execute(), SYNC)
    assert first.rows == [["1", "2"]], first
    pg.sql(change)
    if other is not None:
        other()
    old = exchange(w, bind("s1"), execute(), SYNC)
    new = exchange(w, parse("s2", SCHEMA_QUERY), describe(b"S", "s2"), bind("s2"), execute(), SYNC)
    return old, new


def direct_story(pg, change=ADD_COLUMN):
    """story() on a direct connection to PostgreSQL: what the pooler must match."""
    fresh_schema_table(pg)
    direct = PgWire(pg.port)
    direct.login()
    try:
        return story(direct, pg, change=change)
    finally:
        direct.close()


def column_types(reply):
    """Type OIDs of the columns of each RowDescription in a reply."""
    found = []
    for mtype, body in reply.msgs:
        if mtype == b"T":
            (n,) = struct.unpack("!H", body[:2])
            pos, types = 2, []
            for _ in range(n):
                pos = body.index(b"\0", pos) + 1
                types.append(struct.unpack("!I", body[pos + 6 : pos + 10])[0])
                pos += 18
            found.append(types)
    return found


def evicting_pooler(bouncer):
    """One server that keeps one statement, and a client whose statement
    evicts the others' (the next Bind of theirs prepares them again)."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1, max_prepared_statements=1))
    evictor = raw_client(b)

    def evict():
        got = exchange(evictor, close(b"S", "e"), parse("e", "SELECT 42"), bind("e"), execute(), SYNC)
        assert got.rows == [["42"]], got

    return b, evict


def test_new_parse_after_schema_change_gets_new_columns(bouncer, pg):
    """The application prepares the query again under a new name (asyncpg's
    retry after InvalidCachedStatementError): on PostgreSQL that works at
    once, and so it does through the pooler. The server connection whose
    statement for that text is stale closes when its client releases it
    (otherwise the new Parse would be answered from that statement and fail
    the same way for as long as the connection lives), and the new Parse
    runs on a fresh one."""
    old, new = direct_story(pg)
    assert old.errors == [CHANGED]
    assert (new.errors, new.rows) == ([], [["1", "2", "7"]])

    fresh_schema_table(pg)
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    mark = b.log_mark()
    old, new = story(raw_client(b), pg)
    assert old.errors == [CHANGED]
    assert (new.errors, new.rows) == ([], [["1", "2", "7"]]), new
    assert "result type changed (0A000): closing the server at release" in b.log_text()[mark:]
    b.wait_log(r"closing because: a prepared statement's result type changed", after=mark)


def test_statement_prepared_again_after_schema_change_keeps_its_result_type(bouncer, pg):
    """The client's statement, described with two columns, is evicted from
    the server after the table changed: the pooler prepares its text again,
    sees that the result type is not the one the client was given, and the
    client's Bind gets PostgreSQL's 0A000 instead of rows of three columns
    (which a driver decoding with the described types cannot read: asyncpg
    raises ProtocolError). Again at the next Bind, as on PostgreSQL; the
    driver's retry (Close, then Parse of the same text under the same name)
    gets the new columns."""
    direct_old, direct_new = direct_story(pg)

    fresh_schema_table(pg)
    b, evict = evicting_pooler(bouncer)
    w = raw_client(b)
    mark = b.log_mark()
    old, new = story(w, pg, evict)
    assert (old.types, old.errors, old.status) == ("EZ", [CHANGED], "I"), old
    assert (old.types, old.errors) == (direct_old.types, direct_old.errors)
    assert (new.types, new.errors, new.rows) == (direct_new.types, direct_new.errors, direct_new.rows), new
    assert "has a new result type: its client gets 0A000" in b.log_text()[mark:]

    again = exchange(w, bind("s1"), execute(), SYNC)
    assert (again.types, again.errors) == ("EZ", [CHANGED]), again
    retry = exchange(w, close(b"S", "s1"), parse("s1", SCHEMA_QUERY), describe(b"S", "s1"), bind("s1"), execute(),
                     SYNC)
    assert (retry.types, retry.rows) == ("31tT2DCZ", [["1", "2", "7"]]), retry
    assert w.simple_query("SELECT 'still fine'") == ([["still fine"]], None)


def test_schema_change_seen_on_another_server(bouncer, pg):
    """Two servers; the client's statement is on the first only. After the
    table changed, the client's next transaction gets the second one, where
    the pooler prepares the statement: 0A000, as on PostgreSQL. Another
    client that prepared the same text before the change gets 0A000 too on
    either server (on the first from PostgreSQL itself); a client that
    prepares the text after the change gets the new columns."""
    fresh_schema_table(pg)
    b = bouncer(ini_overrides=TX)
    w, other = raw_client(b), raw_client(b)
    query = "SELECT *, pg_backend_pid() FROM pr_schema"
    r = exchange(w, parse("s1", query), describe(b"S", "s1"), bind("s1"), execute(), SYNC)
    assert r.types == "1tT2DCZ" and r.rows[0][:2] == ["1", "2"], r
    first = int(r.rows[0][2])
    r = exchange(other, parse("o1", query), bind("o1"), execute(), SYNC)
    assert r.types == "12DCZ", r

    pg.sql(ADD_COLUMN)
    holder = occupy(b, first)
    old = exchange(w, bind("s1"), execute(), SYNC)
    later = exchange(other, bind("o1"), execute(), SYNC)
    fresh = raw_client(b)
    new = exchange(fresh, parse("n1", query), describe(b"S", "n1"), bind("n1"), execute(), SYNC)
    holder.rollback()
    assert (old.types, old.errors) == ("EZ", [CHANGED]), old
    assert (later.types, later.errors) == ("EZ", [CHANGED]), later
    assert (new.types, new.errors) == ("1tT2DCZ", []), new
    assert new.rows[0][:3] == ["1", "2", "7"] and int(new.rows[0][3]) != first, new

    # back on the first server, where PostgreSQL itself refuses the old statement
    holder = occupy(b, first, leave=True)
    old = exchange(w, bind("s1"), execute(), SYNC)
    holder.rollback()
    assert (old.types, old.errors) == ("EZ", [CHANGED]), old


def test_column_type_change_seen_when_prepared_again(bouncer, pg):
    """Only a column's type changes (int to text), not the number of columns:
    the statement prepared again would return the new type's bytes where the
    client reads the old type (in binary format, a 1-byte text where an
    int4 has 4). PostgreSQL refuses the old statement, and so does the
    pooler; the new Parse describes the column as text."""
    direct_old, direct_new = direct_story(pg, change=TO_TEXT)
    assert direct_old.errors == [CHANGED]
    assert column_types(direct_new) == [[23, 25]]

    fresh_schema_table(pg)
    b, evict = evicting_pooler(bouncer)
    w = raw_client(b)
    old, new = story(w, pg, evict, change=TO_TEXT)
    assert (old.types, old.errors) == (direct_old.types, direct_old.errors), old
    assert (new.types, new.rows, column_types(new)) == (direct_new.types, direct_new.rows, [[23, 25]]), new
    binary = exchange(w, bind("s1", result_formats=(1,)), execute(), SYNC)
    assert (binary.types, binary.errors) == ("EZ", [CHANGED]), binary


def test_prepared_again_without_schema_change_is_invisible(bouncer):
    """A statement prepared again whose result type did not change: the
    client gets exactly the answers it asked for, as from a server that had
    the statement all along (no error, nothing of the pooler's Parse and
    Describe), after an eviction and on another server connection, for a
    Bind and for a Describe."""
    b, evict = evicting_pooler(bouncer)
    w = raw_client(b)
    r = exchange(w, parse("s1", "SELECT $1::int + 1 AS n"), describe(b"S", "s1"), run("s1", [1]), SYNC)
    assert r.types == "1tT2DCZ", r
    _, server_parses, _ = stats_totals(b)
    evict()
    r = exchange(w, run("s1", [2]), SYNC)
    assert (r.types, r.rows) == ("2DCZ", [["3"]]), r
    evict()
    r = exchange(w, describe(b"S", "s1"), SYNC)
    assert (r.types, param_types(r), column_types(r)) == ("tTZ", [[23]], [[23]]), r
    evict()
    r = exchange(w, run("s1", [3]), FLUSH)
    r = Reply(r.msgs + read_n(w, 3).msgs)
    assert (r.types, r.rows) == ("2DC", [["4"]]), r
    r = exchange(w, SYNC)
    assert r.types == "Z", r
    # each eviction cost one Parse of it (and one of the evictor's statement)
    assert stats_totals(b)[1] - server_parses == 6

    b = bouncer(ini_overrides=TX)
    w = raw_client(b)
    r = exchange(w, parse("s1", "SELECT $1::int + 1, pg_backend_pid()"), run("s1", [1]), SYNC)
    first = int(r.rows[0][1])
    holder = occupy(b, first)
    r = exchange(w, describe(b"S", "s1"), run("s1", [41]), SYNC)
    holder.rollback()
    assert r.types == "tT2DCZ" and r.rows[0][0] == "42" and int(r.rows[0][1]) != first, r


def test_schema_change_in_a_transaction_block(bouncer, pg):
    """Inside BEGIN, the Bind of a statement whose result type changed fails
    the transaction as on PostgreSQL: 0A000, status E, then 25P02 until the
    ROLLBACK, which works."""

    def block(w):
        r = exchange(w, parse("s1", SCHEMA_QUERY), run("s1"), SYNC)
        assert r.types == "12DCZ", r
        pg.sql(ADD_COLUMN)
        # another statement of the same client evicts s1 inside the transaction (max_prepared_statements = 1)
        got = [exchange(w, query_message("BEGIN")),
               exchange(w, parse("e", "SELECT 42"), run("e"), SYNC),
               exchange(w, run("s1"), SYNC),
               exchange(w, query_message("SELECT 1")),
               exchange(w, query_message("ROLLBACK")),
               exchange(w, run("s1"), SYNC)]
        return [(r.types, r.errors, r.status) for r in got]

    fresh_schema_table(pg)
    direct = PgWire(pg.port)
    direct.login()
    want = block(direct)
    direct.close()
    assert want[2] == ("EZ", [CHANGED], "E")

    fresh_schema_table(pg)
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1, max_prepared_statements=1))
    assert block(raw_client(b)) == want


def retry_in_a_transaction(w, pg):
    """pgjdbc's autosave=conservative: inside a transaction, a statement
    whose Bind fails with 0A000 is prepared again under a new name after
    ROLLBACK TO SAVEPOINT, and the transaction goes on."""
    first = exchange(w, parse("S_1", "SELECT * FROM pr_schema"), describe(b"S", "S_1"), bind("S_1"), execute(), SYNC)
    assert first.rows == [["1", "2"]], first
    pg.sql("ALTER TABLE pr_schema ADD COLUMN c int DEFAULT 7")
    assert exchange(w, query_message("BEGIN"), query_message("SAVEPOINT autosave")).errors == []
    old = exchange(w, bind("S_1"), execute(), SYNC)
    assert exchange(w, query_message("ROLLBACK TO SAVEPOINT autosave")).status == "T"
    new = exchange(w, parse("S_2", "SELECT * FROM pr_schema"), describe(b"S", "S_2"), bind("S_2"), execute(), SYNC)
    commit = exchange(w, query_message("COMMIT"))
    return old, new, commit


def test_retry_after_schema_change_inside_a_transaction(bouncer, pg):
    """The retry runs on the server the transaction holds, the one whose
    statement for that text is stale: the new Parse must reach it under a
    new server-side name, not be answered from the stale statement."""
    fresh_schema_table(pg)
    direct = PgWire(pg.port)
    direct.login()
    old, new, commit = retry_in_a_transaction(direct, pg)
    direct.close()
    assert (old.errors, old.status) == ([CHANGED], "E")
    assert (new.errors, new.rows, new.status) == ([], [["1", "2", "7"]], "T")
    assert (commit.errors, commit.status) == ([], "I")

    fresh_schema_table(pg)
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    old, new, commit = retry_in_a_transaction(raw_client(b), pg)
    assert (old.errors, old.status) == ([CHANGED], "E")
    assert (new.errors, new.rows, new.status) == ([], [["1", "2", "7"]], "T"), new
    assert (commit.errors, commit.status) == ([], "I")


def test_retry_after_schema_change_on_another_stale_server(bouncer, pg):
    """Both servers of the pool have the statement when the table changes.
    The client's Bind fails on one (which closes at release); its retry, a
    Parse of the same text and a Bind, gets the other one, stale as well:
    it must work there, as the one retry a driver makes (pgjdbc, asyncpg)
    does on PostgreSQL."""
    fresh_schema_table(pg)
    b = bouncer(ini_overrides=dict(TX, default_pool_size=2))
    w, other = raw_client(b), raw_client(b)
    # two open transactions: the statement gets prepared on both servers
    for c in (w, other):
        got = exchange(c, query_message("BEGIN"), parse("S_1", "SELECT * FROM pr_schema"), describe(b"S", "S_1"),
                       bind("S_1"), execute(), SYNC)
        assert (got.errors, got.rows) == ([], [["1", "2"]]), got
    pids = {exchange(c, query_message("SELECT pg_backend_pid()")).rows[0][0] for c in (w, other)}
    assert len(pids) == 2
    for c in (w, other):
        assert exchange(c, query_message("COMMIT")).status == "I"
    pg.sql("ALTER TABLE pr_schema ADD COLUMN c int DEFAULT 7")
    old = exchange(w, bind("S_1"), execute(), SYNC)
    assert old.errors == [CHANGED], old
    new = exchange(w, parse("S_2", "SELECT * FROM pr_schema"), describe(b"S", "S_2"), bind("S_2"), execute(), SYNC)
    assert (new.errors, new.rows) == ([], [["1", "2", "7"]]), new


def test_schema_change_refused_statement_does_not_run(bouncer, pg):
    """An INSERT ... RETURNING * whose result type changed: PostgreSQL
    refuses its Bind, so the row is not inserted, and the pooler, which
    prepares it again, refuses it before it runs (the Bind waits for the
    description). A pipeline behind the refused statement's Sync runs."""

    def insert_story(w, other=None):
        r = exchange(w, parse("i1", "INSERT INTO pr_schema (a, b) VALUES ($1, 0) RETURNING *"), run("i1", [10]),
                     SYNC)
        assert r.types == "12DCZ", r
        pg.sql(ADD_COLUMN)
        if other:
            other()
        r = exchange(w, run("i1", [11]), SYNC, parse("", "SELECT count(*) FROM pr_schema WHERE a = 11"), run(""),
                     SYNC)
        return r.types, r.errors, r.rows

    fresh_schema_table(pg)
    direct = PgWire(pg.port)
    direct.login()
    want = insert_story(direct)
    direct.close()
    assert want == ("EZ12DCZ", [CHANGED], [["0"]])

    fresh_schema_table(pg)
    b, evict = evicting_pooler(bouncer)
    assert insert_story(raw_client(b), evict) == want
    assert pg.sql("SELECT count(*) FROM pr_schema WHERE a = 11") == [(0,)]


def test_asyncpg_after_schema_change(bouncer, pg):
    """asyncpg, its statement cache on: after a column is added, its next
    fetch of SELECT * gets PostgreSQL's 0A000 (InvalidCachedStatementError),
    and asyncpg prepares the query again and returns the new columns, on a
    direct connection and through the pooler alike, including when the
    pooler has to prepare the cached statement on a server that never had
    it (here: after an eviction)."""
    if asyncpg is None:
        pytest.fail("asyncpg is not importable: install the Debian package python3-asyncpg "
                    "(scripts/test does)", pytrace=False)

    async def scenario(port, other=None):
        conn = await asyncpg.connect(host="127.0.0.1", port=port, user="postgres", database="postgres", timeout=10)
        try:
            before = [tuple(r) for r in await conn.fetch(SCHEMA_QUERY)]
            pg.sql(ADD_COLUMN)
            if other:
                other()
            after = [tuple(r) for r in await conn.fetch(SCHEMA_QUERY)]
            return before, after
        finally:
            await conn.close()

    fresh_schema_table(pg)
    want = asyncio.run(scenario(pg.port))
    assert want == ([(1, 2)], [(1, 2, 7)])

    fresh_schema_table(pg)
    b, evict = evicting_pooler(bouncer)
    assert asyncio.run(scenario(b.port, evict)) == want


@pytest.mark.parametrize("what", ["console KILL", "client leaves", "query_timeout"])
def test_bind_waiting_for_its_description_when_things_fail(bouncer, pg, what):
    """A statement prepared again: the client's Bind waits for the
    description of its re-prepare (doc/transaction.md, "Schema changes").
    The PostgreSQL backend is stopped (SIGSTOP) so that the wait lasts; then
    the server is killed from the console, the client leaves, or
    query_timeout ends it. The client gets an error or is gone, nothing
    hangs, and the next client is served."""
    import os
    import signal

    extra = {"query_timeout": 1} if what == "query_timeout" else {}
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1, max_prepared_statements=1, **extra))
    w, evictor = raw_client(b), raw_client(b)
    assert exchange(w, parse("s1", "SELECT 7"), bind("s1"), execute(), SYNC).rows == [["7"]]
    assert exchange(evictor, parse("e", "SELECT 42"), bind("e"), execute(), SYNC).rows == [["42"]]
    backend = int(exchange(w, query_message("SELECT pg_backend_pid()")).rows[0][0])
    os.kill(backend, signal.SIGSTOP)
    try:
        w.send(bind("s1") + execute() + SYNC)  # s1 was evicted: prepared again, the Bind waits
        time.sleep(0.3)
        if what == "console KILL":
            with b.admin() as admin:
                admin.execute("KILL postgres")
            got = w.expect_closed()
            assert got and got[-1][0] == b"E" and error_fields(got[-1][1])["M"] == "database removed", got
        elif what == "client leaves":
            w.close()
        else:
            got = w.expect_closed()
            assert got and got[-1][0] == b"E" and error_fields(got[-1][1])["M"] == "query timeout", got
    finally:
        os.kill(backend, signal.SIGCONT)
    if what == "console KILL":
        with b.admin() as admin:
            admin.execute("RESUME postgres")
    fresh = raw_client(b)
    assert exchange(fresh, parse("s1", "SELECT 8"), bind("s1"), execute(), SYNC).rows == [["8"]]
    if what != "console KILL":  # KILL closed every client of the database
        assert exchange(evictor, bind("e"), execute(), SYNC).rows == [["42"]]


# ---------------------------------------------------------------------------
# found by trying to break the re-prepare check and the unnamed statement's owner


def test_skipped_unnamed_parse_does_not_make_the_statement_the_clients(bouncer):
    """A client's Parse of the unnamed statement behind a failing message in
    the same pipeline is skipped by the server: the unnamed statement there
    is still another client's. The client's later Bind of the unnamed
    statement must get PostgreSQL's 26000 (its own connection has none),
    never run the other client's query."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    w, other = raw_client(b), raw_client(b)
    r = exchange(other, parse("", "SELECT 'secret of other'"), bind(""), execute(), SYNC)
    assert r.rows == [["secret of other"]], r
    r = exchange(w, run("never"), parse("", "SELECT 'mine'"), SYNC)
    assert (r.types, r.errors) == ("EZ", [no_such("never")]), r
    r = exchange(w, bind(""), execute(), SYNC)
    assert (r.rows, r.errors) == ([], [("ERROR", "26000", "unnamed prepared statement does not exist")]), r


def test_result_type_learnt_when_the_statement_is_evicted_before_the_answer(bouncer, pg):
    """The Describe the pooler sends behind each Parse it makes records the
    statement's result type. In a pipeline that prepares more statements
    than the server keeps (max_prepared_statements = 1 here), a statement
    is evicted before that Describe is answered: the answer must still be
    recorded, or the statement's next re-prepare after a table change
    learns the new type instead of checking it, and the client, told of
    two columns by its own Describe, gets rows of three (as from
    PostgreSQL, it must get 0A000)."""

    def scenario(w, evict):
        r = exchange(w, parse("s1", SCHEMA_QUERY), describe(b"S", "s1"), parse("s2", "SELECT 2"), run("s1"),
                     run("s2"), SYNC)
        assert (r.types, r.rows) == ("1tT12DC2DCZ", [["1", "2"], ["2"]]), r
        pg.sql(ADD_COLUMN)
        evict()
        r = exchange(w, run("s1"), SYNC)
        return r.types, r.errors, r.rows

    fresh_schema_table(pg)
    direct = PgWire(pg.port)
    direct.login()
    want = scenario(direct, lambda: None)
    direct.close()
    assert want == ("EZ", [CHANGED], [])

    fresh_schema_table(pg)
    b, evict = evicting_pooler(bouncer)
    assert scenario(raw_client(b), evict) == want


def test_statement_prepared_again_before_its_type_is_known_then_skipped(bouncer, pg):
    """A statement whose result type is not known yet (the pooler's Describe
    behind its first Parse is still unanswered) is prepared again in the
    same pipeline, after a message that fails: the server skips that Parse.
    The client's Bind of the statement after the Sync must find it
    prepared again, not run into the pooler's name (26000): on PostgreSQL
    the statement exists."""

    def scenario(w):
        r = exchange(w, parse("s1", "SELECT 1"), parse("s2", "SELECT 2"), run("never"), run("s1"), SYNC,
                     run("s1"), run("s2"), SYNC)
        return r.types, r.errors, r.rows

    direct = PgWire(pg.port)
    direct.login()
    want = scenario(direct)
    direct.close()
    assert want == ("11EZ2DC2DCZ", [no_such("never")], [["1"], ["2"]])

    b = bouncer(ini_overrides=dict(TX, default_pool_size=1, max_prepared_statements=1))
    assert scenario(raw_client(b)) == want


@pytest.mark.parametrize("skipped", ["Parse", "Close"])
def test_skipped_unnamed_parse_then_bind_after_a_sync_in_the_same_write(bouncer, skipped):
    """As the two tests above, with the Bind of the unnamed statement sent
    after the Sync, in the same write as what the server skips (the
    client's Parse, or the pooler's Close of the other client's unnamed
    statement before a Bind): it must not run the other client's query. The
    Bind waits until the server has answered or skipped it; when the
    server answers it, the Bind runs the client's own statement."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    w, other = raw_client(b), raw_client(b)
    r = exchange(other, parse("", "SELECT 'secret of other'"), bind(""), execute(), SYNC)
    assert r.rows == [["secret of other"]], r
    first = parse("", "SELECT 'mine'") if skipped == "Parse" else bind("") + execute()
    r = exchange(w, run("never"), first, SYNC, bind(""), execute(), SYNC)
    assert (r.types, r.rows) == ("EZEZ", []), r
    assert r.errors == [no_such("never"), ("ERROR", "26000", "unnamed prepared statement does not exist")], r
    r = exchange(other, parse("", "SELECT 'other again'"), bind(""), execute(), SYNC)
    assert r.rows == [["other again"]], r
    r = exchange(w, parse("", "SELECT 'mine'"), SYNC, bind(""), execute(), SYNC, describe(b"S", ""), SYNC)
    assert (r.types, r.rows, r.errors) == ("1Z2DCZtTZ", [["mine"]], []), r


def test_skipped_close_of_another_clients_unnamed_statement(bouncer):
    """The pooler's Close of another client's unnamed statement, sent
    before a Bind of the unnamed statement, is skipped by the server after
    an error earlier in the pipeline: the other client's statement is still
    there, and a later Bind of the unnamed statement must not run it."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    w, other = raw_client(b), raw_client(b)
    r = exchange(other, parse("", "SELECT 'secret of other'"), bind(""), execute(), SYNC)
    assert r.rows == [["secret of other"]], r
    r = exchange(w, run("never"), bind(""), execute(), SYNC)
    assert (r.types, r.errors) == ("EZ", [no_such("never")]), r
    r = exchange(w, bind(""), execute(), SYNC)
    assert (r.rows, r.errors) == ([], [("ERROR", "26000", "unnamed prepared statement does not exist")]), r


def test_sql_prepare_never_replaces_another_clients_statement(bouncer):
    """The pooler's server-side statement names (PGBOUNCER_<n>) are visible
    to any client of the pool in pg_prepared_statements. One that runs SQL
    DEALLOCATE and PREPARE with such a name on its server gets that server
    closed when released, so another client's Bind never runs its SQL.
    Before (and in PgBouncer 1.25.2), the victim's next Bind returned the
    attacker's result."""
    b = bouncer(ini_overrides=dict(TX, default_pool_size=1))
    victim = PgWire(b.port)
    victim.login()
    attacker = PgWire(b.port)
    attacker.login()
    r = exchange(victim, parse("v", "SELECT 'victim-' || $1::text"), run("v", ["x"]), SYNC)
    assert r.rows == [["victim-x"]], r
    rows, err = attacker.simple_query("SELECT name FROM pg_prepared_statements WHERE statement LIKE '%victim-%'")
    assert err is None and rows, (rows, err)
    name = rows[0][0]
    rows, err = attacker.simple_query(f'DEALLOCATE "{name}"; PREPARE "{name}"(text) AS SELECT \'attacker-\' || $1')
    assert err is None, err
    r = exchange(victim, run("v", ["x"]), SYNC)
    assert r.rows == [["victim-x"]], r
    victim.close()
    attacker.close()
