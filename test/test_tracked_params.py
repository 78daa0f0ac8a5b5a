"""Tracked parameters are replayed on each server a client gets, as SQL the
pooler writes (spec/behaviours.md, track_extra_parameters in spec/config.md).
A client's startup values must reach PostgreSQL as values, never as SQL: each
tracked parameter is tried with a value that would run a statement if it were
pasted into the SET unquoted."""

import os
import socket
import struct
import uuid

import pytest

from pgwire import PgWire


TRACKED = ["DateStyle", "client_encoding", "TimeZone", "standard_conforming_strings", "application_name",
           "IntervalStyle", "search_path"]


@pytest.fixture
def tracking(bouncer):
    """A transaction-mode pooler that tracks search_path too, with one server per pool."""
    return bouncer(ini_overrides={
        "pool_mode": "transaction",
        "default_pool_size": 1,
        "track_extra_parameters": "IntervalStyle, search_path",
    })


def table_exists(pg, name):
    return bool(pg.sql("SELECT 1 FROM pg_class WHERE relname = %s", [name]))


def injections(table):
    """Values that would create `table` if the pooler wrote them into SQL without quoting."""
    return [
        f"public; CREATE TABLE public.{table}(x int)",
        f"x'; CREATE TABLE public.{table}(x int); --",
        f"x\\'; CREATE TABLE public.{table}(x int); --",
        f"x\"; CREATE TABLE public.{table}(x int); --",
    ]


@pytest.mark.parametrize("param", TRACKED)
def test_startup_value_is_never_sql(tracking, pg, param):
    b = tracking
    table = "pwned_" + uuid.uuid4().hex[:8]
    for value in injections(table):
        w = PgWire(b.port)
        try:
            w.startup(**{param: value})
            first = w.authenticate(password="postgres")
            if first is None or first[0] != b"R":
                continue  # refused at login: nothing ran
            w.read_until(b"Z", b"E")
            rows, err = w.simple_query(f"SELECT current_setting('{param}')")
            if err is None:
                # taken as a value: what the client sent (TimeZone may come back upper-cased)
                assert [[r[0].lower()] for r in rows] == [[value.lower()]], (param, value, rows)
        finally:
            w.close()
        assert not table_exists(pg, table), f"{param}={value!r} ran as SQL"
    # the pooler still serves everyone
    with b.connect(autocommit=True, password="postgres") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_search_path_with_quoted_names_is_replayed_exactly(tracking, pg):
    """A list with quoted schema names reaches the server as the client wrote it."""
    b = tracking
    value = '"$user", public, "We\'ird ""one"""'
    w = PgWire(b.port)
    w.login(password="postgres", search_path=value)
    assert w.simple_query("SHOW search_path") == ([[value]], None)
    # another client with another value takes the one server in between
    other = PgWire(b.port)
    other.login(password="postgres", search_path="pg_catalog")
    assert other.simple_query("SHOW search_path") == ([["pg_catalog"]], None)
    other.close()
    assert w.simple_query("SHOW search_path") == ([[value]], None)
    w.close()


def test_a_value_the_server_does_not_report_is_not_left_to_the_next_client(tracking, pg):
    """A tracked parameter that PostgreSQL does not report (search_path
    before PostgreSQL 18) has no pool default: a client that sent none must
    get the server's own value, not the one the pooler SET there for the
    server's previous client; and the client that sent one still gets it."""
    b = tracking
    default = pg.sql("SELECT boot_val FROM pg_settings WHERE name = 'search_path'")[0][0]
    own = PgWire(b.port)
    own.login(password="postgres", search_path="pg_catalog")
    assert own.simple_query("SHOW search_path") == ([["pg_catalog"]], None)
    other = PgWire(b.port)
    other.login(password="postgres")
    for _ in range(2):
        assert other.simple_query("SHOW search_path") == ([[default]], None)
        assert own.simple_query("SHOW search_path") == ([["pg_catalog"]], None)
    other.close()
    own.close()


def test_a_value_in_another_case_is_its_clients_own(tracking, pg):
    """application_name (and search_path, whose quoted names are) is case
    sensitive: a client whose value differs from the server's previous
    client's only in case runs under its own, on PostgreSQL and in
    pg_stat_activity, not under the other client's spelling."""
    b = tracking
    first = PgWire(b.port)
    first.login(password="postgres", application_name="myapp", search_path='"Sales"')
    assert first.simple_query("SELECT current_setting('application_name'), current_setting('search_path')") == (
        [["myapp", '"Sales"']], None)
    second = PgWire(b.port)
    second.login(password="postgres", application_name="MyApp", search_path='"sales"')
    for _ in range(2):
        assert second.simple_query("SELECT current_setting('application_name'), current_setting('search_path')") == (
            [["MyApp", '"sales"']], None)
        assert first.simple_query("SELECT current_setting('application_name')") == ([["myapp"]], None)
    first.close()
    second.close()


def test_values_are_read_in_their_clients_encoding(tracking, pg):
    """PostgreSQL reads a Query in the client_encoding the server has when
    it arrives: the replay's SET of client_encoding comes first, alone, so
    that the values after it are read in the new client's encoding, not in
    the previous client's. A LATIN1 client's non-ASCII application_name is
    not refused, and a UTF8 client after a LATIN1 one gets its own schema."""
    b = tracking
    pg.sql('CREATE SCHEMA IF NOT EXISTS "café"')
    latin1 = PgWire(b.port)
    # the harness writes parameters in UTF-8: this name is LATIN1's bytes
    body = struct.pack("!I", 196608) + b"user\0postgres\0database\0postgres\0client_encoding\0LATIN1\0" + \
        b"application_name\0caf\xe9\0\0"
    latin1.send(struct.pack("!I", len(body) + 4) + body)
    first = latin1.authenticate(password="postgres")
    assert first is not None and first[0] == b"R", first
    assert latin1.read_until(b"Z", b"E")[-1][0] == b"Z"
    rows, err = latin1.simple_query("SELECT current_setting('client_encoding'), current_setting('application_name')")
    assert err is None and rows[0][0] == "LATIN1" and rows[0][1].startswith("caf"), (rows, err)
    utf8 = PgWire(b.port)
    utf8.login(password="postgres", search_path='"café"')
    for _ in range(2):
        assert utf8.simple_query("SELECT current_schema()") == ([["café"]], None)
        assert latin1.simple_query("SELECT current_setting('client_encoding')") == ([["LATIN1"]], None)
    utf8.close()
    latin1.close()


def test_application_name_with_backslash_and_quote(tracking):
    b = tracking
    value = "it's a \\path\\ o'clock"
    w = PgWire(b.port)
    w.login(password="postgres", application_name=value)
    assert w.simple_query("SHOW application_name") == ([[value]], None)
    w.close()


def test_application_name_add_host_names_a_client_that_sent_none(bouncer):
    """application_name_add_host gives a client that sent no application_name
    `app - ADDRESS`, and a Unix socket's address names this machine
    (doc/pgbouncer.5.md); the server runs under that name too."""
    b = bouncer(ini_overrides={"pool_mode": "transaction", "default_pool_size": 1, "application_name_add_host": 1})
    named = b.connect(autocommit=True, application_name="named")
    w = PgWire(b.port)
    w.login(password="postgres")
    local_port = w.sock.getsockname()[1]
    expected = f"app - 127.0.0.1:{local_port}"
    assert w.simple_query("SHOW application_name") == ([[expected]], None)
    over_unix = b.connect(autocommit=True, host=str(b.dir))
    unix_name = f"app - unix({os.getpid()}@{socket.gethostname()}):{b.port}"
    for _ in range(2):
        assert named.execute("SHOW application_name").fetchone()[0].startswith("named - 127.0.0.1:")
        assert w.simple_query("SHOW application_name") == ([[expected]], None)
        assert over_unix.execute("SHOW application_name").fetchone() == (unix_name,)
    assert over_unix.info.parameter_status("application_name") == unix_name
    w.close()


@pytest.mark.parametrize("mode", ["session", "transaction"])
def test_connect_query_sets_the_pool_defaults(bouncer, pg, mode):
    """A tracked parameter that the database's connect_query sets is every
    server's value, so it is the default clients are told and get, as with
    PgBouncer; a client's own value still wins, and a client that comes
    after it on the same server gets the connect_query's value back."""
    conninfo = pg.connstr("postgres") + " connect_query='SET TimeZone = ''Asia/Tokyo''; SET DateStyle = German'"
    b = bouncer(ini_overrides={"pool_mode": mode, "default_pool_size": 1}, databases={"postgres": conninfo})
    sql = "SELECT current_setting('TimeZone'), current_setting('DateStyle'), '2020-01-02 03:04:05+00'::timestamptz::text"
    tokyo = ("Asia/Tokyo", "German, DMY", "02.01.2020 12:04:05 JST")
    for _ in range(2):
        plain = b.connect(autocommit=True)
        assert plain.execute(sql).fetchone() == tokyo
        assert (plain.info.parameter_status("TimeZone"), plain.info.parameter_status("DateStyle")) == tokyo[:2]
        plain.close()
        own = b.connect(autocommit=True, options="-c TimeZone=Europe/Paris")
        assert own.execute(sql).fetchone() == ("Europe/Paris", "German, DMY", "02.01.2020 04:04:05 CET")
        own.close()


def test_values_stay_each_clients_own_while_hundreds_come_and_go(tracking):
    """Clients with the same values share them in the pooler, and a client's
    change is its own (doc/architecture.md, "Tracked parameters"): clients
    that stay keep their values, and get them on the one server, while 300
    others with values of their own log in, change one and leave, and those
    that stay change theirs too."""
    b = tracking
    stay = []
    for i in range(8):
        w = PgWire(b.port)
        # pairs of clients with the same values
        w.login(password="postgres", application_name=f"stay{i // 2}", search_path=f"s{i // 2}, public")
        stay.append(w)

    def check(round_):
        for i, w in enumerate(stay):
            app = f"stay{i // 2}" if i % 2 == 0 or round_ == 0 else f"moved{i}-{round_}"
            assert w.simple_query("SELECT current_setting('application_name'), current_setting('search_path')") \
                == ([[app, f"s{i // 2}, public"]], None), (i, round_)

    check(0)
    for round_ in range(1, 4):
        for k in range(100):
            w = PgWire(b.port)
            w.login(password="postgres", application_name=f"passing{round_}-{k}",
                    IntervalStyle="iso_8601" if k % 2 else "postgres")
            assert w.simple_query("SET search_path = pg_catalog") == ([], None)
            assert w.simple_query("SELECT current_setting('application_name'), current_setting('search_path')") \
                == ([[f"passing{round_}-{k}", "pg_catalog"]], None)
            w.close()
        # one of each pair takes a name of its own: its twin keeps the shared one
        for i, w in enumerate(stay):
            if i % 2:
                assert w.simple_query(f"SET application_name = 'moved{i}-{round_}'") == ([], None)
        check(round_)
    for w in stay:
        w.close()
