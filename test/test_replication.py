"""Replication connections through the pooler (spec/behaviours.md §1.2, §8;
admin.md SHOW CLIENTS/SERVERS `replication`; cli.md "login attempt"): each
replication client gets a server connection of its own that carries its
startup parameters, the replication protocol streams through unchanged, and
normal clients of the same pool do not notice. Real clients (psql,
pg_recvlogical, pg_basebackup) and a raw protocol client, against the
session's PostgreSQL (wal_level=logical, see conftest.py)."""

import re
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time

import pytest

from conftest import DEADLINE, Postgres, child_env, pg_bindir, wait_for
from pgwire import error_fields, message, PgWire, query_message


def tool(name):
    """A PostgreSQL client program of the same version as the server."""
    path = pg_bindir() / name
    if not path.exists():
        found = shutil.which(name)
        if not found:
            pytest.skip(f"{name} is not installed")
        return found
    return str(path)


def conninfo(b, dbname="postgres", **extra):
    parts = [f"host=127.0.0.1 port={b.port} dbname={dbname} user=postgres connect_timeout=10"]
    parts += [f"{k}={v}" for k, v in extra.items()]
    return " ".join(parts)


def run(args, timeout=DEADLINE * 2):
    out = subprocess.run([str(a) for a in args], env=child_env(), capture_output=True, text=True,
                         timeout=timeout, stdin=subprocess.DEVNULL)
    return out


def psql(b, sql, **extra):
    """One command through psql (simple query protocol, as replication needs); returns its rows."""
    out = run([tool("psql"), "-X", "-At", "-F", "|", "-d", conninfo(b, **extra), "-c", sql])
    assert out.returncode == 0, f"psql failed ({out.returncode}):\n{out.stdout}{out.stderr}"
    return [line.split("|") for line in out.stdout.splitlines()]


def rows_of(conn, sql):
    cur = conn.execute(sql)
    names = [d.name for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def repl_wire(b, replication, **params):
    """A raw replication connection through the pooler, logged in; returns (wire, welcome messages)."""
    w = PgWire(b.port)
    welcome = w.login(replication=replication, **params)
    return w, welcome


def read_copy_data(w, want, deadline):
    """Reads CopyData until the decoded logical changes contain `want`; returns them.

    Standby status updates are sent back for every keepalive that asks for one."""
    text = ""
    while want not in text:
        assert time.monotonic() < deadline, f"no {want!r} in the stream; got {text!r}"
        m = w.read_msg()
        assert m is not None, f"connection closed while streaming; got {text!r}"
        mtype, body = m
        assert mtype == b"d", (mtype, body)
        if body[:1] == b"w":  # XLogData: start, end, time, then the change
            text += body[25:].decode() + "\n"
        elif body[:1] == b"k" and body[17:18] == b"\x01":  # keepalive asking for a reply
            w.send(standby_status(struct.unpack("!Q", body[1:9])[0]))
    return text


def standby_status(lsn):
    """A Standby Status Update ('r') in a CopyData message from the client."""
    return message(b"d", b"r" + struct.pack("!QQQQB", lsn, lsn, lsn, 0, 0))


@pytest.fixture
def repl_bouncer(bouncer, pg):
    """A pooler with a `replication` database entry: physical replication tools (pg_basebackup,
    pg_receivewal) always send the database name `replication`, which picks the pool."""
    return bouncer(ini_overrides={"log_connections": 1, "log_disconnections": 1},
                   databases={"postgres": pg.connstr("postgres"), "replication": pg.connstr("postgres")})


@pytest.fixture
def table(pg):
    pg.sql("DROP TABLE IF EXISTS repl_t")
    pg.sql("CREATE TABLE repl_t (id int PRIMARY KEY, v text)")
    yield "repl_t"
    pg.sql("DROP TABLE IF EXISTS repl_t")


@pytest.fixture
def slots(pg):
    """Names of replication slots to drop after the test."""
    names = []
    yield names
    for name in names:
        wait_for(lambda: not pg.sql("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active",
                                    [name]), f"slot {name} to be released")
        pg.sql("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
               [name])


# ---------------------------------------------------------------------------
# the replication protocol through the pooler


@pytest.mark.parametrize("replication,dbname", [("database", "postgres"), ("true", "")])
def test_identify_system_matches_postgresql(repl_bouncer, pg, replication, dbname):
    b = repl_bouncer
    mark = b.log_mark()
    ((systemid, timeline, xlogpos, db),) = psql(b, "IDENTIFY_SYSTEM", replication=replication)
    assert systemid == str(pg.sql("SELECT system_identifier FROM pg_control_system()")[0][0])
    assert int(timeline) >= 1 and re.fullmatch(r"[0-9A-F]+/[0-9A-F]+", xlogpos)
    assert db == dbname  # logical replication is bound to the database, physical is not
    logged = {"database": "database", "true": "yes"}[replication]
    b.wait_log(rf"login attempt: db=postgres user=postgres tls=no replication={logged}$", after=mark)


def test_replication_values_and_garbage(repl_bouncer):
    """PostgreSQL booleans choose physical replication; false and non-booleans a normal connection."""
    b = repl_bouncer
    for value, logged in [("on", "yes"), ("1", "yes"), ("YES", "yes"), ("off", "no"), ("0", "no"),
                          ("garbage", "no")]:
        mark = b.log_mark()
        w, _ = repl_wire(b, value)
        rows, err = w.simple_query("SELECT 1" if logged == "no" else "IDENTIFY_SYSTEM")
        assert err is None and len(rows) == 1, (value, rows, err)
        w.close()
        b.wait_log(rf"login attempt: db=postgres user=postgres tls=no replication={logged}$", after=mark)


def test_welcome_and_startup_parameters_reach_the_walsender(repl_bouncer, pg):
    """The dedicated server's StartupMessage carries the client's tracked parameters and its
    `options` verbatim: a physical walsender accepts no SET, so they could not come later."""
    b = repl_bouncer
    w, welcome = repl_wire(b, "true", application_name="walrus", options="-c work_mem=7MB")
    status = {body.split(b"\0")[0].decode(): body.split(b"\0")[1].decode()
              for mtype, body in welcome if mtype == b"S"}
    assert status["application_name"] == "walrus"
    assert status["server_version"] == pg.sql("SHOW server_version")[0][0]
    assert [m[0] for m in welcome][-2:] == [b"K", b"Z"]
    assert w.simple_query("SHOW work_mem") == ([["7MB"]], None)
    assert w.simple_query("SHOW application_name") == ([["walrus"]], None)
    wait_for(lambda: pg.sql("SELECT application_name FROM pg_stat_replication") == [("walrus",)],
             "the walsender of this client alone")
    w.close()
    wait_for(lambda: not pg.sql("SELECT 1 FROM pg_stat_replication"), "the walsender to exit")


def test_logical_slot_and_stream_with_pg_recvlogical(repl_bouncer, pg, table, slots):
    b = repl_bouncer
    slots.append("recv_slot")
    out = run([tool("pg_recvlogical"), "-d", conninfo(b), "-S", "recv_slot", "-P", "test_decoding",
               "--create-slot"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert pg.sql("SELECT plugin, slot_type FROM pg_replication_slots WHERE slot_name = 'recv_slot'") == \
        [("test_decoding", "logical")]
    pg.sql("INSERT INTO repl_t VALUES (1, 'through the pooler')")
    endpos = pg.sql("SELECT pg_current_wal_insert_lsn()::text")[0][0]
    out = run([tool("pg_recvlogical"), "-d", conninfo(b), "-S", "recv_slot", "--start", "-f", "-",
               f"--endpos={endpos}", "--no-loop"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "table public.repl_t: INSERT: id[integer]:1 v[text]:'through the pooler'" in out.stdout, out.stdout


def test_logical_stream_both_ways_raw(bouncer, pg, table):
    """CREATE_REPLICATION_SLOT and START_REPLICATION on one connection: CopyBoth, CopyData in
    both directions and CopyDone pass unchanged; the stream outlives query_timeout; afterwards
    the same connection runs replication commands again."""
    b = bouncer(ini_overrides={"query_timeout": 1, "idle_transaction_timeout": 1})
    w, _ = repl_wire(b, "database")
    rows, err = w.simple_query("CREATE_REPLICATION_SLOT raw_slot TEMPORARY LOGICAL test_decoding")
    assert err is None and rows[0][0] == "raw_slot", (rows, err)
    pg.sql("INSERT INTO repl_t VALUES (2, 'streamed')")
    w.send(query_message("START_REPLICATION SLOT raw_slot LOGICAL 0/0"))
    m = w.read_msg()
    assert m[0] == b"W", m  # CopyBothResponse
    deadline = time.monotonic() + DEADLINE
    text = read_copy_data(w, "INSERT", deadline)
    assert "table public.repl_t: INSERT: id[integer]:2 v[text]:'streamed'" in text
    # client -> server CopyData: a status update, then more changes flow
    w.send(standby_status(0))
    time.sleep(2.5)  # longer than query_timeout and idle_transaction_timeout
    pg.sql("INSERT INTO repl_t VALUES (3, 'later')")
    assert "v[text]:'later'" in read_copy_data(w, "'later'", deadline)
    # end the stream: CopyDone from us, the server's CopyDone, then CommandComplete and ReadyForQuery
    w.send(message(b"c"))
    types = [t for t, _ in w.read_until(b"Z")]
    assert types[-1:] == [b"Z"] and b"c" in types and b"C" in types, types
    rows, err = w.simple_query("IDENTIFY_SYSTEM")
    assert err is None and rows[0][3] == "postgres", (rows, err)
    w.close()


def test_physical_base_backup(repl_bouncer, pg, tmp_path):
    """pg_basebackup -X stream: two replication connections at once (backup and WAL stream)."""
    b = repl_bouncer
    target = tmp_path / "backup"
    out = run([tool("pg_basebackup"), "-d", conninfo(b), "-D", target, "-X", "stream", "-c", "fast",
               "--no-sync", "--no-manifest"], timeout=max(DEADLINE * 4, 120))
    assert out.returncode == 0, out.stdout + out.stderr
    major = pg.sql("SHOW server_version_num")[0][0][:-4]
    assert (target / "PG_VERSION").read_text().strip() == major
    assert any((target / "pg_wal").iterdir()), "the WAL stream wrote nothing"
    # both were physical replication clients with servers of their own
    assert b.log_text().count("replication=yes") >= 2


def reachable_endpos(pg):
    """The WAL insert position, made sure to be flushed: the walsender streams
    only flushed WAL, and with the test cluster's synchronous_commit = off a
    record written after the last commit (a standby snapshot, say) could stay
    unflushed for as long as nothing else writes, so that pg_receivewal
    waited for it until the test's timeout. A synchronous commit after it
    flushes everything up to there."""
    endpos = pg.sql("SELECT pg_current_wal_insert_lsn()::text")[0][0]
    pg.sql("SET synchronous_commit = on; SELECT txid_current()")
    return endpos


def test_pg_receivewal_streams(repl_bouncer, pg, tmp_path):
    b = repl_bouncer
    target = tmp_path / "wal"
    target.mkdir()
    pg.sql("SELECT txid_current()")  # some WAL to receive
    endpos = reachable_endpos(pg)
    out = run([tool("pg_receivewal"), "-d", conninfo(b), "-D", target, "--no-loop", "--no-sync",
               f"--endpos={endpos}"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert any(f.name.endswith(".partial") or len(f.name) == 24 for f in target.iterdir()), \
        list(target.iterdir())


# ---------------------------------------------------------------------------
# dedicated servers


def servers(admin):
    return rows_of(admin, "SHOW SERVERS")


def clients(admin):
    return [c for c in rows_of(admin, "SHOW CLIENTS") if c["database"] != "pgbouncer"]


def test_replication_clients_never_share_a_server(repl_bouncer, pg):
    b = repl_bouncer
    admin = b.admin(prepare_threshold=None)
    normal = b.connect(autocommit=True)
    assert normal.execute("SELECT 1").fetchone() == (1,)
    logical, _ = repl_wire(b, "database")
    physical, _ = repl_wire(b, "yes")
    cl = {c["replication"]: c for c in clients(admin)}
    assert set(cl) == {"none", "logical", "physical"}
    sv = {s["ptr"]: s for s in servers(admin)}
    assert len(sv) == 3
    for kind in ("none", "logical", "physical"):
        server = sv[cl[kind]["link"]]
        assert server["link"] == cl[kind]["ptr"]
        assert server["replication"] == kind and server["state"] == "active"
    pool = rows_of(admin, "SHOW POOLS")
    assert [(p["database"], p["sv_active"], p["cl_active"]) for p in pool if p["database"] == "postgres"] == \
        [("postgres", 3, 3)]
    # each walsender is a PostgreSQL backend of its own
    wait_for(lambda: pg.sql("SELECT count(*) FROM pg_stat_replication")[0][0] == 2, "two walsenders")

    logical.close()
    wait_for(lambda: [s["replication"] for s in servers(admin)].count("logical") == 0,
             "the logical replication server to close with its client")
    b.wait_log(r"closing because: replication client closed")
    # the normal client's server is the one it had
    assert normal.execute("SELECT 2").fetchone() == (2,)
    assert sorted(s["replication"] for s in servers(admin)) == ["none", "physical"]
    assert physical.simple_query("IDENTIFY_SYSTEM")[1] is None
    physical.close()
    wait_for(lambda: [s["replication"] for s in servers(admin)] == ["none"],
             "the physical replication server to close with its client")
    # the normal server went back to the pool and is reused; replication servers never are
    normal.close()
    wait_for(lambda: [s["state"] for s in servers(admin)] == ["idle"], "the normal server to be idle")
    w, _ = repl_wire(b, "database")
    sv = servers(admin)
    assert sorted((s["replication"], s["state"]) for s in sv) == [("logical", "active"), ("none", "idle")]
    w.close()


def test_idle_time_before_the_first_command_is_no_query_time(repl_bouncer):
    """The wait for a replication client's own server is a login wait
    (wait_time); the time it then spends before its first command is not
    the command's (query_time, xact_time in SHOW STATS)."""
    b = repl_bouncer
    admin = b.admin(prepare_threshold=None)
    w, _ = repl_wire(b, "database")
    time.sleep(1.5)
    assert w.simple_query("IDENTIFY_SYSTEM")[1] is None

    def stats():
        rows = [r for r in rows_of(admin, "SHOW STATS") if r["database"] == "postgres"]
        return rows[0] if rows and rows[0]["total_query_count"] == 1 else None

    st = wait_for(stats, "the command in SHOW STATS")
    assert st["total_query_time"] < 1_000_000 and st["total_xact_time"] < 1_000_000, st
    w.close()


def test_full_pool_evicts_an_idle_server(bouncer, pg):
    b = bouncer(ini_overrides={"default_pool_size": 1})
    admin = b.admin(prepare_threshold=None)
    with b.connect(autocommit=True) as normal:
        normal.execute("SELECT 1")
    wait_for(lambda: [s["state"] for s in servers(admin)] == ["idle"], "an idle server")
    w, _ = repl_wire(b, "database")
    assert [(s["replication"], s["state"]) for s in servers(admin)] == [("logical", "active")]
    assert w.simple_query("IDENTIFY_SYSTEM")[1] is None
    w.close()
    wait_for(lambda: servers(admin) == [], "the replication server to close")
    with b.connect(autocommit=True) as normal:
        assert normal.execute("SELECT 3").fetchone() == (3,)


def walsender_refusal(port, user, replication):
    """The ErrorResponse fields a replication login of `user` gets at `port`."""
    w = PgWire(port)
    w.startup(user=user, replication=replication)
    m = w.authenticate(user, user)  # the pooler sends no AuthenticationOk before its server logged in
    if m is not None and m[0] == b"R":  # PostgreSQL itself does
        m = w.read_until(b"E")[-1]
    assert m is not None and m[0] == b"E", m
    assert w.at_eof()
    return error_fields(m[1])


@pytest.mark.parametrize("replication", ["database", "true"])
def test_walsender_refusal_reaches_only_its_client(bouncer, pg, either_bin, replication):
    """A role without the REPLICATION attribute: its replication login fails
    with PgBouncer's `login failed` (SQLSTATE 08P01), to which we add
    PostgreSQL's reason (1.25.2 says no more than `login failed`). The
    refusal does not mark the pool failed: normal clients of the same pool
    still log in at once (1.25.2 holds them for server_login_retry)."""
    pg.create_role("norepl", "norepl")  # LOGIN, but no REPLICATION attribute
    reason = walsender_refusal(pg.port, "norepl", replication)["M"]
    b = bouncer(users_txt='"norepl" "norepl"\n"pgbouncer" "pgbouncer"\n', binary=either_bin)
    mark = b.log_mark()
    err = walsender_refusal(b.port, "norepl", replication)
    want = "login failed" if either_bin.peer else f"login failed: {reason}"
    assert err == {"S": "FATAL", "C": "08P01", "M": want}
    b.wait_log(rf"^.*login failed: FATAL:? {re.escape(reason)}$", after=mark)
    if either_bin.peer:
        return
    with b.connect(user="norepl", autocommit=True) as normal:
        assert normal.execute("SELECT current_user").fetchone() == ("norepl",)


@pytest.fixture(scope="module")
def pw_repl_pg(run_as, session_dir):
    """A cluster of its own where replication logins of `repl_pw` need a SCRAM
    password while its normal logins are trusted, as a pg_hba.conf with
    separate `replication` lines often has it."""
    server = Postgres(run_as, session_dir)
    try:
        server.start()
        server.sql("CREATE ROLE repl_pw LOGIN REPLICATION PASSWORD 'pw'")
        run_as.write(server.datadir / "pg_hba.conf",
                     "local all all trust\n"
                     "host replication repl_pw 127.0.0.1/32 scram-sha-256\n"
                     "host all all 127.0.0.1/32 trust\n", mode=0o600)
        server.sql("SELECT pg_reload_conf()")

        def needs_password():
            w = PgWire(server.port)
            w.startup(user="repl_pw", replication="true")
            m = w.read_msg()
            w.close()
            return m is not None and m[0] == b"R" and m[1][:4] == b"\0\0\0\x0a"

        wait_for(needs_password, "the new pg_hba.conf to be in effect")
        server.scram_secret = server.sql("SELECT rolpassword FROM pg_authid WHERE rolname = 'repl_pw'")[0][0]
        yield server
    finally:
        server.stop()


def test_replication_login_the_pooler_cannot_do_fails_only_its_client(bouncer, pw_repl_pg):
    """A replication login that fails on the pooler's side (here: PostgreSQL
    asks for SCRAM, and the auth_file has only the role's SCRAM secret, no
    client proof to log in with) fails its own client, as a walsender's
    refusal does: it says nothing about the normal logins of the pool, which
    neither wait for server_login_retry nor lose their place in the queue."""
    pg = pw_repl_pg
    b = bouncer(users_txt=f'"repl_pw" "{pg.scram_secret}"\n"pgbouncer" "pgbouncer"\n',
                databases={"postgres": pg.connstr("postgres")})
    mark = b.log_mark()
    w = PgWire(b.port)
    w.startup(user="repl_pw", replication="true")
    m = w.read_until(b"E")
    err = error_fields(m[-1][1])
    assert (err["S"], err["C"], err["M"]) == ("FATAL", "08P01", "server login failed: wrong password type"), err
    assert w.at_eof()
    b.wait_log(r"closing because: server login failed: wrong password type", after=mark)
    with b.connect(user="repl_pw", autocommit=True) as normal:
        assert normal.execute("SELECT current_user").fetchone() == ("repl_pw",)


def test_reconnect_closes_replication_servers_at_once(repl_bouncer):
    b = repl_bouncer
    admin = b.admin(prepare_threshold=None)
    w, _ = repl_wire(b, "database")
    normal = b.connect(autocommit=True)
    normal.execute("SELECT 1")
    admin.execute("RECONNECT")
    m = w.read_until(b"E")
    assert m and m[-1][0] == b"E" and error_fields(m[-1][1])["S"] == "FATAL", m
    assert w.at_eof()
    # the normal client keeps its server until it lets it go
    assert normal.execute("SELECT 5").fetchone() == (5,)
    wait_for(lambda: all(s["replication"] == "none" for s in servers(admin)), "the replication server to go")


class GatedProxy:
    """A TCP proxy to PostgreSQL that passes nothing while its gate is shut:
    a server connection made then stays in its login until open()."""

    def __init__(self, target_port):
        self.target_port = target_port
        self.gate = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        self.socks = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                pooler, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(pooler,), daemon=True).start()

    def _serve(self, pooler):
        self.gate.wait()
        server = socket.create_connection(("127.0.0.1", self.target_port))
        self.socks += [pooler, server]
        threading.Thread(target=self._pump, args=(pooler, server), daemon=True).start()
        self._pump(server, pooler)

    @staticmethod
    def _pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def open(self):
        self.gate.set()

    def close(self):
        self.gate.set()
        self.listener.close()
        for sock in self.socks:
            sock.close()


def test_pause_holds_a_replication_login_in_progress(bouncer, pg):
    """A PAUSE that comes while a replication client's own server logs in:
    that server does not start a session in the pause (where PAUSE would
    wait for its stream to end); the client waits, as new clients do, and
    gets its server after RESUME."""
    proxy = GatedProxy(pg.port)
    try:
        b = bouncer(databases={"postgres": f"host=127.0.0.1 port={proxy.port} dbname=postgres"})
        admin = b.admin(prepare_threshold=None)
        w = PgWire(b.port)
        w.startup(replication="database")
        wait_for(lambda: proxy.accepted == 1, "the replication server's connect")
        admin.execute("PAUSE")
        proxy.open()
        time.sleep(1)  # the login would be over by now
        assert [(p["cl_waiting"], p["sv_active"]) for p in rows_of(admin, "SHOW POOLS")
                if p["database"] == "postgres"] == [(1, 0)]
        assert [c["state"] for c in clients(admin)] == ["waiting"]
        admin.execute("RESUME")
        types = [t for t, _ in w.read_until(b"Z")]
        assert types[0] == b"R" and types[-1] == b"Z", types
        rows, err = w.simple_query("IDENTIFY_SYSTEM")
        assert err is None and rows[0][3] == "postgres", (rows, err)
        w.close()
    finally:
        proxy.close()


def test_reconnect_during_a_replication_login_gives_a_new_server(bouncer, pg):
    """RECONNECT while a replication client's own server logs in: that server
    had served nobody yet, so its client is not welcomed into a session that
    ends at once; it gets another server, as a normal waiting client does."""
    proxy = GatedProxy(pg.port)
    try:
        b = bouncer(databases={"postgres": f"host=127.0.0.1 port={proxy.port} dbname=postgres"})
        admin = b.admin(prepare_threshold=None)
        mark = b.log_mark()
        w = PgWire(b.port)
        w.startup(replication="database")
        wait_for(lambda: proxy.accepted == 1, "the replication server's connect")
        admin.execute("RECONNECT")
        proxy.open()
        types = [t for t, _ in w.read_until(b"Z", b"E")]
        assert types[0] == b"R" and types[-1] == b"Z", types
        time.sleep(1)  # a few janitor rounds, which close a marked replication server
        rows, err = w.simple_query("IDENTIFY_SYSTEM")
        assert err is None and rows[0][3] == "postgres", (rows, err)
        assert proxy.accepted == 2
        assert [(s["replication"], s["close_needed"]) for s in servers(admin)] == [("logical", 0)]
        b.wait_log(r"S-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:\d+ closing because: ", after=mark)
        w.close()
    finally:
        proxy.close()


def test_reload_of_pool_settings_keeps_the_stream(bouncer, pg, table):
    """A RELOAD that changes only pool settings of the entry (size, mode, limits) leaves a
    streaming replication client alone; one that changes where its servers connect ends the
    stream with an error at once (doc/pgbouncer.1.md "REPLICATION CONNECTIONS")."""
    b = bouncer()
    w, _ = repl_wire(b, "database")
    rows, err = w.simple_query("CREATE_REPLICATION_SLOT reload_slot TEMPORARY LOGICAL test_decoding")
    assert err is None, err
    w.send(query_message("START_REPLICATION SLOT reload_slot LOGICAL 0/0"))
    assert w.read_msg()[0] == b"W"
    deadline = time.monotonic() + DEADLINE
    base = pg.connstr("postgres")
    b.databases["postgres"] = f"{base} pool_size=7 pool_mode=transaction max_db_connections=5"
    b.write_ini()
    admin = b.admin(prepare_threshold=None)
    admin.execute("RELOAD")
    assert [(s["replication"], s["close_needed"]) for s in servers(admin)] == [("logical", 0)]
    time.sleep(1)  # a few janitor rounds, which close a marked replication server
    pg.sql("INSERT INTO repl_t VALUES (4, 'after the reload')")
    assert "v[text]:'after the reload'" in read_copy_data(w, "'after the reload'", deadline)
    assert [s["replication"] for s in servers(admin)] == ["logical"]
    b.databases["postgres"] = f"host=localhost port={pg.port} dbname=postgres"
    b.write_ini()
    admin.execute("RELOAD")
    m = w.read_until(b"E")
    assert m and m[-1][0] == b"E", m
    assert error_fields(m[-1][1])["M"] == "database configuration changed"
    assert w.at_eof()


def test_hba_replication_keyword_is_physical_only(bouncer, run_as, pg):
    b = bouncer(ini_overrides={"auth_type": "hba"}, start=False)
    hba = run_as.write(b.dir / "hba.conf",
                       "host replication postgres 127.0.0.1/32 trust\n"
                       "host all postgres 127.0.0.1/32 reject\n")
    b.update(auth_hba_file=str(hba))
    b.write_ini()
    b.start()
    w, _ = repl_wire(b, "true")
    assert w.simple_query("IDENTIFY_SYSTEM")[1] is None
    w.close()
    for params in ({"replication": "database"}, {}):
        w = PgWire(b.port)
        w.startup(**params)
        w.expect_fatal("login rejected")
        w.close()


def test_replication_to_admin_console_is_refused(bouncer):
    b = bouncer()
    w = PgWire(b.port)
    w.startup(user="pgbouncer", database="pgbouncer", replication="database")
    w.expect_fatal("replication connections are not supported by the admin console")


# ---------------------------------------------------------------------------
# back-pressure: small socket buffers make every write partial


@pytest.fixture
def small_buffers(bouncer, pg):
    return bouncer(ini_overrides={"tcp_socket_buffer": 4096, "pkt_buf": 4096},
                   databases={"postgres": pg.connstr("postgres"), "replication": pg.connstr("postgres")})


def test_base_backup_with_small_socket_buffers(small_buffers, pg, tmp_path):
    b = small_buffers
    target = tmp_path / "backup"
    out = run([tool("pg_basebackup"), "-d", conninfo(b), "-D", target, "-X", "stream", "-c", "fast",
               "--no-sync", "--no-manifest"], timeout=max(DEADLINE * 4, 120))
    assert out.returncode == 0, out.stdout + out.stderr
    assert (target / "PG_VERSION").exists()
    assert any((target / "pg_wal").iterdir()), "the WAL stream wrote nothing"


def test_pg_receivewal_stops_at_endpos_with_small_socket_buffers(small_buffers, pg, tmp_path):
    b = small_buffers
    target = tmp_path / "wal"
    target.mkdir()
    pg.sql("CREATE TABLE IF NOT EXISTS repl_fill (v text)")
    pg.sql("INSERT INTO repl_fill SELECT repeat('x', 1000) FROM generate_series(1, 5000)")
    endpos = reachable_endpos(pg)
    out = run([tool("pg_receivewal"), "-d", conninfo(b), "-D", target, "--no-loop", "--no-sync",
               f"--endpos={endpos}"])
    assert out.returncode == 0, out.stdout + out.stderr
    pg.sql("DROP TABLE repl_fill")


def test_pg_receivewal_stops_when_told(small_buffers, pg, tmp_path):
    """SIGINT asks pg_receivewal to finish: it ends its COPY and exits while data flows."""
    b = small_buffers
    target = tmp_path / "wal"
    target.mkdir()
    proc = subprocess.Popen([str(tool("pg_receivewal")), "-d", conninfo(b), "-D", str(target), "--no-loop",
                             "--no-sync", "-v"], env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    try:
        wait_for(lambda: any(target.iterdir()), "pg_receivewal to start writing")
        pg.sql("CREATE TABLE IF NOT EXISTS repl_fill2 (v text)")
        pg.sql("INSERT INTO repl_fill2 SELECT repeat('y', 1000) FROM generate_series(1, 5000)")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=DEADLINE)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        pg.sql("DROP TABLE IF EXISTS repl_fill2")
