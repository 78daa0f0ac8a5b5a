"""Details where PgBouncer users and their scripts rely on PgBouncer 1.25.2's
exact behaviour (issue 31): connection ids, the log lines of a server
closed after a RELOAD, a DNS failure in a host list and a safe shutdown,
TLS set-up errors, and tracked parameters in the startup options. Each test
runs the same steps against the binary under test and, through the
either_bin fixture, against PgBouncer 1.25.2 when it is there
(doc/testing.md); steps that only one of them has are marked by
`either_bin.peer`.
"""

import re
import time

import psycopg
import pytest

from conftest import wait_for
from helpers import Background, conn_on, console, rows, two_workers
from pgwire import PgWire, error_fields, message


def one_worker(either_bin, **ini):
    """Settings for a single worker: ours gets max_workers = 1 (PgBouncer,
    one process, refuses a setting it does not know)."""
    if not either_bin.peer:
        ini["max_workers"] = 1
    return ini


# ---------------------------------------------------------------------------
# tracked parameters given in the startup options


def test_startup_option_applied_once_in_canonical_form(bouncer, either_bin, pg):
    """`options=-c DateStyle=ISO` on a server whose DateStyle is `ISO, MDY`:
    one SET reaches PostgreSQL, after which the pooler keeps the canonical
    `ISO, MDY` for the client, so that its next transactions on that server
    send none; verbose = 2 logs the SET and the canonical value."""
    pg.create_role("canon_user", password="canon")
    pg.sql("ALTER ROLE canon_user SET log_statement = 'all'")
    pg.sql("ALTER ROLE canon_user SET DateStyle = 'ISO, MDY'")
    b = bouncer(ini_overrides=one_worker(either_bin, pool_mode="transaction", default_pool_size=1, verbose=2),
                users_txt='"canon_user" "canon"\n', binary=either_bin)
    mark = pg.log_size()
    c = b.connect(autocommit=True, user="canon_user", password="canon", options="-c DateStyle=ISO")
    assert c.info.parameter_status("DateStyle") == "ISO"
    for _ in range(3):
        assert c.execute("SHOW DateStyle").fetchone() == ("ISO, MDY",)
    assert c.execute("SELECT '2024-03-01'::date::text").fetchone() == ("2024-03-01",)

    statements = re.findall(r"statement: (.*)", pg.log_text(mark))
    sets = [s for s in statements if re.search(r"(?i)\bset\b.*datestyle", s)]
    assert sets and len(sets) == 1, statements
    log = b.log_text()
    assert len(re.findall(r"SET \"?DateStyle\"?='ISO';", log)) == 1, log
    assert "setting DateStyle to its canonical version ISO -> ISO, MDY" in log


# ---------------------------------------------------------------------------
# RELOAD that changes a server TLS setting


def test_reload_of_server_tls_replaces_servers(bouncer, either_bin, pg_ssl):
    """A RELOAD that changes server_tls_protocols: an idle server is closed
    at once (`database configuration changed`), one lent to a client in a
    transaction when the transaction ends (`close_needed`, PgBouncer's
    text), and the client's next query runs on a new server that uses the
    new setting."""
    dbs = {"postgres": pg_ssl.connstr("postgres"), "other": pg_ssl.connstr("postgres")}
    ini = one_worker(either_bin, pool_mode="transaction", server_tls_sslmode="require", log_disconnections=1)
    b = bouncer(ini_overrides=ini, databases=dbs, binary=either_bin)
    admin = console(b, host=str(b.dir))
    idle = b.connect(dbname="other", autocommit=True)
    idle.execute("SELECT 1")
    busy = b.connect(autocommit=True)
    busy.execute("BEGIN")
    old_pid = busy.execute("SELECT pg_backend_pid()").fetchone()[0]
    assert rows(admin, "SHOW SERVERS")[0]["tls"].startswith("TLSv1.3/")

    mark = b.log_mark()
    b.update(server_tls_protocols="tlsv1.2")
    b.write_ini()
    admin.execute("RELOAD")
    b.wait_log(r"S-0x[0-9a-f]+: other/postgres@127\.0\.0\.1:\d+ closing because: database configuration changed "
               r"\(age=\d+s\)", after=mark)
    (lent,) = [r for r in rows(admin, "SHOW SERVERS") if r["database"] == "postgres"]
    assert lent["close_needed"] == 1
    # the transaction goes on on its server
    assert busy.execute("SELECT pg_backend_pid()").fetchone()[0] == old_pid
    busy.execute("COMMIT")
    b.wait_log(r"S-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:\d+ closing because: close_needed \(age=\d+s\)",
               after=mark)
    assert busy.execute("SELECT pg_backend_pid()").fetchone()[0] != old_pid
    (new,) = [r for r in rows(admin, "SHOW SERVERS") if r["database"] == "postgres"]
    assert new["close_needed"] == 0 and new["tls"].startswith("TLSv1.2/"), new
    assert idle.execute("SELECT 2").fetchone() == (2,)


# ---------------------------------------------------------------------------
# SHUTDOWN WAIT_FOR_SERVERS with a client waiting for a server


def shutdown_with_a_waiting_client(b, inside, waiting):
    """`inside` is in a transaction on the pool's only server, `waiting` has
    a query queued behind it; SHUTDOWN WAIT_FOR_SERVERS. The waiting client
    gets `server shutting down` at once, the other one finishes its
    transaction and is then told the same, and the pooler exits."""
    admin = console(b, host=str(b.dir))
    inside.execute("BEGIN")
    pid = inside.execute("SELECT pg_backend_pid()").fetchone()[0]
    queued = Background(lambda: waiting.execute("SELECT 'never'").fetchone())
    port = wait_for(lambda: [r["port"] for r in rows(admin, "SHOW CLIENTS") if r["state"] == "waiting"],
                    "a client waiting for the server")[0]
    mark = b.log_mark()
    admin.execute("SHUTDOWN WAIT_FOR_SERVERS")
    b.wait_log(r"LOG SHUTDOWN WAIT_FOR_SERVERS command issued", after=mark)
    with pytest.raises(psycopg.OperationalError, match="server shutting down"):
        queued.result()
    b.wait_log(rf"C-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:{port} closing because: server shutting down "
               r"\(age=\d+s\)", after=mark)
    # the transaction goes on and commits on its server
    assert inside.execute("SELECT pg_backend_pid()").fetchone()[0] == pid
    inside.execute("COMMIT")
    with pytest.raises(psycopg.OperationalError, match="server shutting down"):
        inside.execute("SELECT 1")
    b.wait_log(r"LOG server connections dropped, exiting", after=mark)
    assert b.wait_exit() == 0


def test_shutdown_wait_for_servers_with_a_waiting_client(bouncer, either_bin):
    ini = one_worker(either_bin, pool_mode="transaction", default_pool_size=1)
    b = bouncer(ini_overrides=ini, binary=either_bin)
    shutdown_with_a_waiting_client(b, b.connect(autocommit=True), b.connect(autocommit=True))


def test_shutdown_wait_for_servers_with_a_waiting_client_on_another_worker(bouncer):
    """The same with two workers: the pool's one server (default_pool_size
    counts across workers) is on worker 0, the waiting client on worker 1."""
    b = bouncer(ini_overrides={"pool_mode": "transaction", "default_pool_size": 1, "min_workers": 2,
                               "max_workers": 2})
    two_workers(b)
    shutdown_with_a_waiting_client(b, conn_on(b, 0), conn_on(b, 1))


# ---------------------------------------------------------------------------
# connection ids, and a host list whose first name does not resolve


def unresolvable_first_host(b, pg):
    """A database `listed` whose host list starts with a name that does not
    resolve, with load_balance_hosts = disable, looked up through a resolver
    nobody answers on (the test does not depend on the machine's DNS)."""
    resolv = b.dir / "resolv.conf"
    b.run_as.write(resolv, "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    b.update(resolv_conf=str(resolv))
    b.databases["listed"] = (f"host=no-such-host.invalid,127.0.0.1 port={pg.port} dbname=postgres "
                             "load_balance_hosts=disable")
    b.write_ini()


def linked_ids(admin, database):
    """(client id, server id) of each client of `database` that has a server."""
    servers = {r["link"]: r["id"] for r in rows(admin, "SHOW SERVERS") if r["database"] == database}
    return sorted((r["id"], servers[r["ptr"]]) for r in rows(admin, "SHOW CLIENTS")
                  if r["database"] == database and r["ptr"] in servers)


def test_connection_ids_in_creation_order(bouncer, either_bin, pg):
    """With one worker, every connection takes the next id in the order it
    is created, clients and servers alike: a new client and its new server
    have consecutive ids, and so do the console and the next client; an
    attempt whose host did not resolve takes an id too. KILL_CLIENT takes
    such an id."""
    ini = one_worker(either_bin, pool_mode="transaction", server_login_retry=1, log_disconnections=1)
    b = bouncer(ini_overrides=ini, binary=either_bin, start=False)
    unresolvable_first_host(b, pg)
    b.start()
    admin = console(b, host=str(b.dir))
    (me,) = [r["id"] for r in rows(admin, "SHOW CLIENTS")]

    first = b.connect(autocommit=True)
    first.execute("BEGIN")
    first.execute("SELECT 1")
    second = b.connect(autocommit=True)
    second.execute("BEGIN")
    second.execute("SELECT 1")  # the first one's server is taken: a new one
    assert linked_ids(admin, "postgres") == [(me + 1, me + 2), (me + 3, me + 4)]

    # the first attempt of `listed` fails its lookup: a server id of its own
    listed = b.connect(dbname="listed", autocommit=True)
    assert listed.execute("SELECT 1").fetchone() == (1,)
    listed.execute("BEGIN")
    assert listed.execute("SELECT 2").fetchone() == (2,)
    assert linked_ids(admin, "listed") == [(me + 5, me + 7)]
    assert len(re.findall(r"closing because: server DNS lookup failed", b.log_text())) == 1

    admin.execute(f"KILL_CLIENT {me + 3}")
    with pytest.raises(psycopg.OperationalError, match="admin forced disconnect"):
        second.execute("SELECT 1")
    assert first.execute("SELECT 'still here'").fetchone() == ("still here",)
    assert [r["id"] for r in rows(admin, "SHOW CLIENTS") if r["database"] == "postgres"] == [me + 1]


def test_host_list_skips_a_name_that_does_not_resolve(bouncer, either_bin, pg):
    """load_balance_hosts = disable and a first host that does not resolve:
    one `closing because: server DNS lookup failed` for the one failed
    attempt, then the next host serves, and stays in use for the next
    server connection."""
    ini = one_worker(either_bin, pool_mode="transaction", server_login_retry=1, log_disconnections=1)
    b = bouncer(ini_overrides=ini, binary=either_bin, start=False)
    unresolvable_first_host(b, pg)
    b.start()
    first = b.connect(dbname="listed", autocommit=True)
    first.execute("BEGIN")
    assert first.execute("SELECT current_database()").fetchone() == ("postgres",)
    second = b.connect(dbname="listed", autocommit=True)
    second.execute("BEGIN")
    assert second.execute("SELECT 2").fetchone() == (2,)
    admin = console(b, host=str(b.dir))
    assert [(r["addr"], r["port"]) for r in rows(admin, "SHOW SERVERS")] == [("127.0.0.1", pg.port)] * 2
    failed = re.findall(r"S-0x[0-9a-f]+: listed/postgres@\S+ closing because: server DNS lookup failed \(age=\d+s\)",
                        b.log_text())
    assert len(failed) == 1, b.log_text()


def test_connection_ids_with_two_workers(bouncer, pg):
    """With two workers, ids come from one counter for the whole pooler:
    never given twice, in creation order across the workers, and a
    console's connections to the other worker (each SHOW below goes to
    both) take none of them (doc/workers.md, "Connection ids"). Each
    client uses a database of its own, so that its server is the one its
    login opens."""
    dbs = {name: pg.connstr("postgres") for name in ("w0", "w1", "any")}
    b = bouncer(ini_overrides={"pool_mode": "transaction", "min_workers": 2, "max_workers": 2}, databases=dbs)
    two_workers(b)
    admin = console(b, host=str(b.dir))
    later = console(b, host=str(b.dir))  # a console that runs its first command below
    (c0, s0), = linked(conn_on(b, 0, dbname="w0"), admin, "w0")
    (c1, s1), = linked(conn_on(b, 1, dbname="w1"), admin, "w1")
    assert (s0, s1) == (c0 + 1, c1 + 1) and c1 > s0
    for _ in range(3):
        rows(later, "SHOW SOCKETS")
    assert linked(b.connect(dbname="any", autocommit=True), admin, "any") == [(s1 + 1, s1 + 2)]
    ids = [r["id"] for r in rows(admin, "SHOW SOCKETS")]
    assert len(ids) == len(set(ids))


def linked(conn, admin, database):
    """Opens a transaction on conn (a client of `database`, its only one);
    returns linked_ids() of that database."""
    conn.execute("BEGIN")
    conn.execute("SELECT 1")
    return linked_ids(admin, database)


# ---------------------------------------------------------------------------
# TLS set-up errors


def start_failing(b):
    """Starts b, which must fail its TLS set-up; returns its log and stderr."""
    b.start(wait=False)

    def ended():
        assert "process up" not in b.log_text(), f"pgbouncer started instead of failing\n{b.describe()}"
        return not b.alive()

    wait_for(ended, "pgbouncer to exit")
    assert b.returncode == 1, b.describe()
    return b.log_text() + b.stderr()


# each case: the settings and the start of PgBouncer's ERROR line (a regex; {dir} is the instance's directory)
TLS_SETUP_ERRORS = {
    "tls13-ciphers": ({"client_tls13_ciphers": "BOGUS"}, r"TLS setup failed: failed to set the TLSv1\.3 cipher suites"),
    "ciphers": ({"client_tls_ciphers": "BOGUS"}, r"invalid client_tls_ciphers: BOGUS"),
    "protocols": ({"client_tls_protocols": "bogus"}, r"invalid client_tls_protocols: bogus"),
    "dheparams": ({"client_tls_dheparams": "bogus"}, r"invalid client_tls_dheparams: bogus"),
    # 1.25.2 misspells the setting's name in this one
    "ecdhcurve": ({"client_tls_ecdhcurve": "bogus"}, r"invalid client_tls_ecdhe?curve: bogus"),
    "missing-key": ({"client_tls_key_file": "{dir}/missing.key"},
                    r'TLS setup failed: failed to load private key file "{dir}/missing\.key": '),
    "missing-cert": ({"client_tls_cert_file": "{dir}/missing.crt"},
                     r'TLS setup failed: failed to load certificate file "{dir}/missing\.crt": '),
    "key-not-a-key": ({"client_tls_key_file": "{ca}"}, r'TLS setup failed: failed to load private key file "{ca}": '
                                                       r"unsupported"),
    "cert-not-a-cert": ({"client_tls_cert_file": "{key}"},
                        r'TLS setup failed: failed to load certificate file "{key}": no start line'),
    "key-mismatch": ({"client_tls_key_file": "{wrong}"},
                     r'TLS setup failed: failed to load private key file "{wrong}": key values mismatch'),
    "missing-ca": ({"client_tls_ca_file": "{dir}/missing-ca.crt"}, r"TLS setup failed: failed to load CA: "),
    "ca-not-a-cert": ({"client_tls_ca_file": "{key}"},
                      r"TLS setup failed: failed to load CA: no certificate or crl found"),
    "no-key-no-cert": ({"client_tls_key_file": "", "client_tls_cert_file": ""},
                       r"To allow TLS connections from clients, client_tls_key_file and client_tls_cert_file "
                       r"must be set\."),
    "verify-full-without-ca": ({"client_tls_sslmode": "verify-full"},
                               r"client_tls_sslmode requires client_tls_ca_file"),
    "cert-auth-without-ca": ({"client_tls_sslmode": "verify-full", "auth_type": "cert"},
                             r"auth_type=cert requires client_tls_ca_file"),
    "server-ciphers": ({"server_tls_sslmode": "require", "server_tls_ciphers": "BOGUS"},
                       r"invalid server_tls_ciphers: BOGUS"),
    "server-protocols": ({"server_tls_sslmode": "require", "server_tls_protocols": "bogus"},
                         r"invalid server_tls_protocols: bogus"),
}


@pytest.mark.parametrize("case", list(TLS_SETUP_ERRORS))
def test_tls_setup_error_texts(bouncer, either_bin, tls_files, case):
    """A TLS set-up that cannot be built stops the start with PgBouncer's
    two lines: ERROR with the reason, then FATAL `TLS setup failed`. Where
    PgBouncer names no setting (or gives "(null)" as the reason) ours says
    more after its text."""
    settings, error = TLS_SETUP_ERRORS[case]
    b = bouncer(binary=either_bin, start=False)
    paths = {"dir": str(b.dir), "ca": str(tls_files.ca_cert), "key": str(tls_files.server_key),
             "wrong": str(tls_files.wrong_key)}
    ini = {"client_tls_sslmode": "require", "client_tls_key_file": str(tls_files.server_key),
           "client_tls_cert_file": str(tls_files.server_cert)}
    ini.update({k: v.format(**paths) for k, v in settings.items()})
    b.update(**ini)
    b.write_ini()
    text = start_failing(b)
    error = error.format(**{k: re.escape(v) for k, v in paths.items()})
    assert re.search(rf"\[\d+\] ERROR {error}.*\n.*\[\d+\] FATAL TLS setup failed$", text, re.MULTILINE), text


def test_reload_with_tls13_ciphers_openssl_refuses(bouncer, either_bin, tls_files):
    """RELOAD with a client_tls13_ciphers OpenSSL refuses: the console gets
    F0000, the log PgBouncer's two lines, and TLS clients are served with
    the old set-up."""
    ini = {"client_tls_sslmode": "require", "client_tls_key_file": str(tls_files.server_key),
           "client_tls_cert_file": str(tls_files.server_cert)}
    b = bouncer(ini_overrides=one_worker(either_bin, **ini), binary=either_bin)
    admin = console(b, host=str(b.dir))
    mark = b.log_mark()
    b.update(client_tls13_ciphers="BOGUS")
    b.write_ini()
    with pytest.raises(psycopg.Error) as e:
        admin.execute("RELOAD")
    assert (e.value.sqlstate, e.value.diag.message_primary) == (
        "F0000", "RELOAD failed, see logs for additional details")
    # the master and the worker each log both (their lines may interleave)
    b.wait_log(r"ERROR TLS setup failed: failed to set the TLSv1\.3 cipher suites", after=mark)
    b.wait_log(r"ERROR TLS configuration could not be reloaded, keeping old configuration", after=mark)
    with b.connect(sslmode="require", autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert conn.info.pgconn.ssl_in_use


# ---------------------------------------------------------------------------
# negative sizes in [databases], [users] and [peers]


def test_negative_entry_sizes_fall_back_to_the_global(bouncer, either_bin, pg):
    """A pool_size, min_pool_size or reserve_pool_size below 0 in an entry
    means "not set", not only -1: the [pgbouncer] value applies (an entry's
    -3 used to make a pool without a limit)."""
    ini = one_worker(either_bin, default_pool_size=7, min_pool_size=2, reserve_pool_size=3)
    dbs = {"postgres": pg.connstr("postgres"),
           "neg": pg.connstr("postgres", pool_size=-3, min_pool_size=-5, reserve_pool=-2)}
    b = bouncer(ini_overrides=ini, databases=dbs, binary=either_bin, start=False)
    b.write_ini(text=b.render_ini() + "[users]\nneguser = pool_size=-3 reserve_pool_size=-4\n"
                "[peers]\n5 = host=/tmp pool_size=-6\n")
    b.start()
    admin = console(b)
    db = next(r for r in rows(admin, "SHOW DATABASES") if r["name"] == "neg")
    assert (db["pool_size"], db["min_pool_size"], db["reserve_pool_size"]) == (7, 2, 3)
    user = next(r for r in rows(admin, "SHOW USERS") if r["name"] == "neguser")
    assert (user["pool_size"], user["reserve_pool_size"]) == ("", "")
    assert rows(admin, "SHOW PEERS") == [{"peer_id": 5, "host": "/tmp", "port": 6432, "pool_size": 7}]


# ---------------------------------------------------------------------------
# the log lines of the console's commands


def test_console_commands_log_command_issued(bouncer, either_bin):
    """Each state command logs `NAME command issued`, or `NAME 'db' command
    issued` with a database, once (not once per worker), after its argument
    was checked and before it runs: a refused one (no such database, RESUME
    when not paused) logs it too. A plain SHUTDOWN logs `SHUTDOWN command
    issued`."""
    ini = {} if either_bin.peer else {"max_workers": 2, "min_workers": 2}
    b = bouncer(ini_overrides=ini, binary=either_bin)
    if not either_bin.peer:
        two_workers(b)
    admin = console(b)
    steps = [
        ("PAUSE", None, "PAUSE command issued"),
        ("RESUME", None, "RESUME command issued"),
        ('PAUSE "postgres"', None, "PAUSE 'postgres' command issued"),
        ("RESUME postgres", None, "RESUME 'postgres' command issued"),
        ("RESUME", "pooler is not paused/suspended", "RESUME command issued"),
        ("PAUSE nosuch", "no such database: nosuch", "PAUSE 'nosuch' command issued"),
        ("DISABLE postgres", None, "DISABLE 'postgres' command issued"),
        ("ENABLE postgres", None, "ENABLE 'postgres' command issued"),
        ("RECONNECT", None, "RECONNECT command issued"),
        ("RECONNECT postgres", None, "RECONNECT 'postgres' command issued"),
        ("WAIT_CLOSE postgres", None, "WAIT_CLOSE 'postgres' command issued"),
        ("WAIT_CLOSE", None, "WAIT_CLOSE command issued"),
        ("KILL postgres", None, "KILL 'postgres' command issued"),
        ("RESUME postgres", None, "RESUME 'postgres' command issued"),
        ("KILL", None, "KILL command issued"),
        ("SUSPEND", None, "SUSPEND command issued"),
        ("RESUME", None, "RESUME command issued"),
    ]
    for command, error, line in steps:
        mark = b.log_mark()
        if error:
            with pytest.raises(psycopg.Error, match=error):
                admin.execute(command)
        else:
            admin.execute(command)
        b.wait_log(rf"LOG {re.escape(line)}\n", after=mark)
        time.sleep(0.1)
        assert b.log_text()[mark:].count(f" {line}\n") == 1, (command, b.log_text()[mark:])
    mark = b.log_mark()
    try:
        admin.execute("SHUTDOWN")
    except psycopg.OperationalError:
        pass  # the pooler exits without answering
    b.wait_log(r"LOG SHUTDOWN command issued\n", after=mark)


def test_kill_client_without_an_id(bouncer, either_bin):
    """KILL_CLIENT without an id is answered as one that is not a number:
    `invalid client pointer supplied`, not `invalid command`."""
    b = bouncer(binary=either_bin)
    admin = console(b)
    for command in ("KILL_CLIENT", "KILL_CLIENT;", "KILL_CLIENT abc"):
        with pytest.raises(psycopg.errors.ProtocolViolation) as err:
            admin.execute(command)
        assert str(err.value) == "invalid client pointer supplied", command


def test_set_of_an_unknown_parameter_logs_it(bouncer, either_bin):
    """SET of a key [pgbouncer] does not have: "SET failed", and the log
    names the key as a configuration load does (`unknown parameter:
    pgbouncer/KEY`), then the failure."""
    b = bouncer(binary=either_bin)
    admin = console(b)
    mark = b.log_mark()
    with pytest.raises(psycopg.errors.ProtocolViolation, match="^SET failed$"):
        admin.execute("SET no_such_key = 1")
    b.wait_log(r"ERROR unknown parameter: pgbouncer/no_such_key\n.*ERROR SET failed\n", after=mark)


@pytest.mark.parametrize("messages,error", [
    ([(b"P", b"\0SHOW VERSION\0\0\0"), (b"S", b"")], "extended query protocol not supported by admin console"),
    ([(b"H", b"")], "unsupported packet type for admin console: 72"),
])
def test_console_refuses_a_message_with_error_then_fatal(bouncer, either_bin, messages, error):
    """A message the console does not take: the ERROR (logged too) and a
    ReadyForQuery, then FATAL `bad packet` (`pooler error: bad packet` in
    the log) and the connection closes."""
    b = bouncer(ini_overrides=one_worker(either_bin), binary=either_bin)
    w = PgWire(b.port)
    w.login(user="pgbouncer", database="pgbouncer")
    mark = b.log_mark()
    w.send(b"".join(message(t, body) for t, body in messages))
    msgs = w.expect_closed()
    assert [m[0] for m in msgs] == [b"E", b"Z", b"E"], msgs
    assert error_fields(msgs[0][1]) == {"S": "ERROR", "C": "08P01", "M": error}
    assert error_fields(msgs[2][1]) == {"S": "FATAL", "C": "08P01", "M": "bad packet"}
    b.wait_log(rf"ERROR {error}\n.*pooler error: {error}\n.*closing because: bad packet \(age=\d+s\)\n"
               r".*pooler error: bad packet\n", after=mark)


@pytest.mark.parametrize("command", ["SET default_pool_size = 'x'", "SET pool_mode = 'nosuch'",
                                     "SET query_timeout = '5s'", "SET log_connections = 'maybe'"])
def test_set_of_a_bad_value_logs_set_failed(bouncer, either_bin, command):
    """A bad value: the error "SET failed", logged as `ERROR SET failed`
    before the `pooler error` line, as every console error is."""
    b = bouncer(binary=either_bin)
    admin = console(b)
    mark = b.log_mark()
    with pytest.raises(psycopg.errors.ProtocolViolation, match="^SET failed$"):
        admin.execute(command)
    b.wait_log(r"ERROR SET failed\n.*pooler error: SET failed\n", after=mark)


def test_console_query_is_logged_at_debug(bouncer, either_bin):
    """With verbose, each console query is logged as `got admin query:
    QUERY`."""
    b = bouncer(ini_overrides={"verbose": 1}, binary=either_bin)
    admin = console(b)
    mark = b.log_mark()
    admin.execute("SHOW VERSION")
    b.wait_log(r"DEBUG got admin query: SHOW VERSION\n", after=mark)
