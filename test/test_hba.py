"""auth_type = hba: the method of each client comes from the first matching
line of auth_hba_file (spec/config.md §8, §9; behaviours.md §2; errors of
cli.md §7). Every database entry forces the server user `postgres`, so any
login user that passes authentication gets a working session."""

import os
import pwd
import struct

import psycopg
import pytest

from conftest import wait_for
from helpers import conn_on, rows, scram_secret_of
from ldapfixture import build_has_ldap
from pgwire import error_fields, md5_secret, PgWire

PASSWORD = "hba pw"

# the OS user this test runs as: the peer of our Unix-socket connections
OS_USER = pwd.getpwuid(os.geteuid()).pw_name

# first authentication request codes
TRUST, PLAIN, MD5, SASL = 0, 3, 5, 10


def userlist(*names, secret=PASSWORD):
    return "".join(f'"{n}" "{secret}"\n' for n in names) + '"postgres" "postgres"\n"pgbouncer" "pgbouncer"\n'


def hba_bouncer(bouncer, run_as, pg, hba, users, ident=None, dbs=("postgres",), files=None, **ini):
    """A pooler with auth_type=hba, the given hba (and ident) text, and extra
    files (name -> text) next to the hba file; every database in `dbs` is
    PostgreSQL's `postgres` database with forced user postgres."""
    b = bouncer(ini_overrides={"auth_type": "hba", **ini}, users_txt=users,
                databases={d: pg.connstr("postgres", user="postgres") for d in dbs}, start=False)
    for name, text in (files or {}).items():
        run_as.write(b.dir / name, text)
    b.hba_path = run_as.write(b.dir / "hba.conf", hba)
    b.update(auth_hba_file=str(b.hba_path))
    if ident is not None:
        b.update(auth_ident_file=str(run_as.write(b.dir / "ident.conf", ident)))
    b.write_ini()
    return b.start()


def wire(b, unix):
    return PgWire(b.port, host=str(b.dir)) if unix else PgWire(b.port)


def first_request(b, user, database="postgres", unix=False):
    """The pooler's first answer to a StartupMessage: the authentication
    request code (0 = logged in without a password), or the error fields."""
    w = wire(b, unix)
    try:
        w.startup(user=user, database=database)
        m = w.read_msg()
        assert m is not None, "connection closed without an answer"
        if m[0] == b"R":
            return struct.unpack("!I", m[1][:4])[0]
        assert m[0] == b"E", m
        return error_fields(m[1])
    finally:
        w.close()


def login_error(b, user, password=PASSWORD, database="postgres", unix=False):
    """Logs in over a raw socket; returns (SQLSTATE, message) of the FATAL error that ends it."""
    w = wire(b, unix)
    try:
        w.startup(user=user, database=database)
        m = w.authenticate(user, password)
        assert m is not None and m[0] == b"E", f"expected a login error, got {m!r}"
        err = error_fields(m[1])
        assert err["S"] == "FATAL" and set(err) == {"S", "C", "M"}, err
        assert w.at_eof(), "the connection should be closed after a FATAL error"
        return err["C"], err["M"]
    finally:
        w.close()


def query(b, user, password=PASSWORD, database="postgres", unix=False):
    """Logs in with psycopg (TCP or the Unix socket) and runs a query through the pooler."""
    host = str(b.dir) if unix else "127.0.0.1"
    with psycopg.connect(host=host, port=b.port, dbname=database, user=user, password=password,
                         connect_timeout=10, autocommit=True) as conn:
        return conn.execute("SELECT current_user, 40 + 2").fetchone()


def assert_refused(b, user, message, password=PASSWORD, database="postgres", unix=False):
    """What a user sees: psycopg's error text, and on the wire FATAL 08P01 with exactly that message."""
    host = str(b.dir) if unix else "127.0.0.1"
    with pytest.raises(psycopg.OperationalError, match=message):
        psycopg.connect(host=host, port=b.port, dbname=database, user=user, password=password,
                        connect_timeout=10).close()
    assert login_error(b, user, password, database, unix) == ("08P01", message)


# ---------------------------------------------------------------------------
# methods


@pytest.fixture(scope="module")
def scram_secret(pg):
    return scram_secret_of(pg, "pgb_hba_scram_src", PASSWORD)


METHODS = [
    # (method, stored secret kind, first request, message for a wrong password)
    ("trust", "plain", TRUST, None),
    ("password", "plain", PLAIN, "password authentication failed"),
    ("password", "scram", PLAIN, "password authentication failed"),
    ("md5", "plain", MD5, "password authentication failed"),
    ("md5", "md5", MD5, "password authentication failed"),
    ("md5", "scram", SASL, "SASL authentication failed"),  # upgraded to SCRAM for a SCRAM secret
    ("scram-sha-256", "plain", SASL, "SASL authentication failed"),
    ("scram-sha-256", "scram", SASL, "SASL authentication failed"),
]


@pytest.mark.parametrize("method,kind,request_code,wrong_msg", METHODS, ids=[f"{m}-{k}" for m, k, _, _ in METHODS])
def test_method_of_matching_line(bouncer, run_as, pg, scram_secret, method, kind, request_code, wrong_msg):
    secret = {"plain": PASSWORD, "md5": md5_secret("alice", PASSWORD), "scram": scram_secret}[kind]
    b = hba_bouncer(bouncer, run_as, pg, f"host all all 127.0.0.1/32 {method}\n", userlist("alice", secret=secret))
    assert first_request(b, "alice") == request_code
    assert query(b, "alice") == ("postgres", 42)
    if wrong_msg:
        assert_refused(b, "alice", wrong_msg, password="wrong")
        # an unknown user runs the method's exchange and fails like a wrong password (md5 is
        # upgraded only for a stored SCRAM secret, which an unknown user does not have)
        if method == "md5":
            request_code, wrong_msg = MD5, "password authentication failed"
        assert first_request(b, "nobody_here") == request_code
        assert login_error(b, "nobody_here") == ("08P01", wrong_msg)
    else:
        assert_refused(b, "nobody_here", '"trust" authentication failed')


def test_reject_unsupported_and_no_match(bouncer, run_as, pg, pgbouncer_bin):
    b = hba_bouncer(bouncer, run_as, pg,
                    "host all rejected 127.0.0.1/32 reject\n"
                    "host all ldapuser 127.0.0.1/32 ldap ldapserver=127.0.0.1 ldapprefix=\"cn=\"\n"
                    "host all alice 127.0.0.1/32 password\n",
                    userlist("rejected", "ldapuser", "alice"))
    assert_refused(b, "rejected", "login rejected")
    if build_has_ldap(pgbouncer_bin):
        # ldap asks for the password in clear text, for the directory (test_ldap.py checks the rest)
        assert first_request(b, "ldapuser") == PLAIN
    else:
        # a method this build does not have: the line is skipped
        assert_refused(b, "ldapuser", "no authentication method is found")
    assert_refused(b, "bob", "no authentication method is found")
    assert_refused(b, "alice", "no authentication method is found", unix=True)  # only a host line
    assert query(b, "alice") == ("postgres", 42)


def test_no_hba_file_set(bouncer, run_as, pg):
    b = hba_bouncer(bouncer, run_as, pg, "host all all 127.0.0.1/32 trust\n", userlist("alice"))
    b.update(auth_hba_file=None)
    mark = b.log_mark()
    b.write_ini()
    b.reload()
    b.wait_log(r"auth_hba_file is not set", after=mark)
    wait_for(lambda: first_request(b, "alice") != TRUST, "the rules to be dropped")
    assert_refused(b, "alice", "no authentication method is found")


# ---------------------------------------------------------------------------
# the type, database, user and address columns


def test_local_and_host_lines(bouncer, run_as, pg):
    b = hba_bouncer(bouncer, run_as, pg,
                    "local all all trust\n"
                    "host all all 127.0.0.1/32 password\n",
                    userlist("alice"))
    assert first_request(b, "alice", unix=True) == TRUST
    assert query(b, "alice", password=None, unix=True) == ("postgres", 42)
    assert first_request(b, "alice") == PLAIN
    assert query(b, "alice") == ("postgres", 42)
    assert_refused(b, "alice", "password authentication failed", password="wrong")


def test_hostnossl_matches_plain_tcp(bouncer, run_as, pg):
    # no TLS on the wire yet: a hostssl line never matches, hostnossl matches every TCP client
    b = hba_bouncer(bouncer, run_as, pg,
                    "hostssl all all 0.0.0.0/0 trust\n"
                    "hostnossl all all 127.0.0.1/32 md5\n",
                    userlist("alice"))
    assert first_request(b, "alice") == MD5
    assert query(b, "alice") == ("postgres", 42)
    assert_refused(b, "alice", "no authentication method is found", unix=True)


def test_database_column(bouncer, run_as, pg):
    b = hba_bouncer(bouncer, run_as, pg,
                    "host sameuser all 127.0.0.1/32 trust\n"
                    "host @dbs.txt all 127.0.0.1/32 password\n"
                    "host db_c,\"db_d\" all 127.0.0.1/32 md5\n"
                    "host postgres all 127.0.0.1/32 scram-sha-256\n"
                    "host all all 127.0.0.1/32 reject\n",
                    userlist("alice", "bob"),
                    dbs=("postgres", "alice", "db_a", "db_b", "db_c", "db_d", "other"),
                    files={"dbs.txt": "# databases for password logins\ndb_a, db_b\n"})
    assert first_request(b, "alice", database="alice") == TRUST
    assert query(b, "alice", password=None, database="alice") == ("postgres", 42)
    assert first_request(b, "bob", database="alice") == {"S": "FATAL", "C": "08P01", "M": "login rejected"}
    assert first_request(b, "bob", database="db_a") == PLAIN
    assert query(b, "bob", database="db_b") == ("postgres", 42)
    assert first_request(b, "bob", database="db_c") == MD5
    assert query(b, "bob", database="db_d") == ("postgres", 42)
    assert first_request(b, "bob", database="postgres") == SASL
    assert query(b, "bob", database="postgres") == ("postgres", 42)
    assert_refused(b, "bob", "login rejected", database="other")
    # names are case-sensitive
    assert_refused(b, "bob", "login rejected", database="DB_A")


def test_user_column(bouncer, run_as, pg):
    b = hba_bouncer(bouncer, run_as, pg,
                    "host all alice 127.0.0.1/32 trust\n"
                    "host all @users.txt 127.0.0.1/32 password\n"
                    "host all carol,dave 127.0.0.1/32 md5\n"
                    "host all all 127.0.0.1/32 reject\n",
                    userlist("alice", "bob", "bert", "carol", "dave", "erin"),
                    files={"users.txt": "bob bert\n"})
    assert first_request(b, "alice") == TRUST
    assert query(b, "alice", password=None) == ("postgres", 42)
    assert first_request(b, "bob") == PLAIN
    assert query(b, "bert") == ("postgres", 42)
    assert first_request(b, "carol") == MD5
    assert query(b, "dave") == ("postgres", 42)
    assert_refused(b, "erin", "login rejected")
    assert_refused(b, "Alice", "login rejected")


def test_address_column(bouncer, run_as, pg):
    b = hba_bouncer(bouncer, run_as, pg,
                    "host all u1 10.0.0.0/8 trust\n"            # not our address
                    "host all u1 127.0.0.0/8 password\n"
                    "host all u2 127.0.0.1 255.255.255.255 md5\n"  # separate mask column
                    "host all u3 127.0.0.2 255.255.255.255 trust\n"
                    "host all u3 ::1/128 trust\n"               # IPv6: never an IPv4 client
                    "host all u3 192.168.0.0 255.255.0.0 trust\n"
                    "host all all 0.0.0.0/0 scram-sha-256\n",
                    userlist("u1", "u2", "u3"))
    assert first_request(b, "u1") == PLAIN
    assert query(b, "u1") == ("postgres", 42)
    assert first_request(b, "u2") == MD5
    assert query(b, "u2") == ("postgres", 42)
    assert first_request(b, "u3") == SASL
    assert query(b, "u3") == ("postgres", 42)


def test_first_matching_line_wins(bouncer, run_as, pg):
    b = hba_bouncer(bouncer, run_as, pg,
                    "host all alice 127.0.0.1/32 reject\n"
                    "host all all 127.0.0.1/32 trust\n"
                    "host all bob 127.0.0.1/32 reject\n",
                    userlist("alice", "bob"))
    assert_refused(b, "alice", "login rejected")
    assert query(b, "bob", password=None) == ("postgres", 42)


def test_unparsable_lines_are_skipped(bouncer, run_as, pg):
    b = hba_bouncer(bouncer, run_as, pg,
                    "# a comment\n"
                    "host all alice 127.0.0.1/32 radius\n"
                    "host all alice samehost trust\n"
                    "host all alice 127.0.0.1/32 trust # the line that is used\n"
                    "host all bob 127.0.0.1/32 trust clientcert=verify-full\n",
                    userlist("alice", "bob"))
    b.wait_log(r'WARNING could not parse hba config line 2: unsupported authentication method "radius"')
    b.wait_log(r"WARNING could not parse hba config line 3: ")
    b.wait_log(r"WARNING could not parse hba config line 5: ")
    assert "line 4" not in b.log_text()
    assert query(b, "alice", password=None) == ("postgres", 42)
    assert_refused(b, "bob", "no authentication method is found")


# ---------------------------------------------------------------------------
# peer and ident maps


def test_peer(bouncer, run_as, pg):
    b = hba_bouncer(bouncer, run_as, pg,
                    f'local all "{OS_USER}" peer\n'
                    "local all mapped peer map=ops\n"
                    "local all unmapped peer map=ops\n"
                    "local all all peer\n"
                    "host all all 127.0.0.1/32 peer\n",
                    userlist(OS_USER, "mapped", "unmapped", "other"),
                    ident=f'ops "{OS_USER}" mapped\n'
                          "ops someone_else unmapped\n"
                          "ops /^regex$ unmapped\n")
    b.wait_log(r"WARNING could not parse ident config line 3: regular expressions are not supported")
    # the OS user is the database user: no password asked
    assert first_request(b, OS_USER, unix=True) == TRUST
    assert query(b, OS_USER, password=None, unix=True) == ("postgres", 42)
    # the map lets our OS user in as `mapped`, but not as `unmapped`
    assert query(b, "mapped", password=None, unix=True) == ("postgres", 42)
    assert_refused(b, "unmapped", "unix socket login rejected", unix=True)
    # without a map, another user name is refused; an unknown user just the same
    assert_refused(b, "other", "unix socket login rejected", unix=True)
    assert_refused(b, "no_such_user", "unix socket login rejected", unix=True)
    # peer cannot work over TCP
    assert_refused(b, OS_USER, "unix socket login rejected")


# ---------------------------------------------------------------------------
# reload


def test_worker_started_later_keeps_the_rules_of_the_last_reload(bouncer, run_as, pg):
    """The hba file is read at start and at RELOAD, as by one process: a
    worker that the scaler starts after an edit without RELOAD has the
    rules the others have, not the edited file's."""
    b = hba_bouncer(bouncer, run_as, pg,
                    "local pgbouncer pgbouncer password\n"
                    "host all all 127.0.0.1/32 trust\n",
                    userlist("alice"), min_workers=1, max_workers=2)
    assert query(b, "alice", password=None) == ("postgres", 42)
    run_as.write(b.hba_path, "local pgbouncer pgbouncer password\nhost all all 127.0.0.1/32 reject\n")

    def console():
        return psycopg.connect(host=str(b.dir), port=b.port, dbname="pgbouncer", user="pgbouncer",
                               password="pgbouncer", autocommit=True, connect_timeout=10)

    with console() as admin:
        admin.execute("SET min_workers = 2")

    def active():
        with console() as admin:
            return [w["state"] for w in rows(admin, "SHOW WORKERS")] == ["active", "active"]

    wait_for(active, "a second worker")
    for worker in (0, 1):
        conn_on(b, worker, user="alice").close()  # trust, on both
    b.reload()

    def rejected():
        try:
            return login_error(b, "alice") == ("08P01", "login rejected")
        except AssertionError:  # trusted still: a worker not reloaded yet
            return False

    wait_for(rejected, "the edited file after RELOAD")


def test_reload_rereads_hba_file(bouncer, run_as, pg):
    b = hba_bouncer(bouncer, run_as, pg,
                    "local pgbouncer pgbouncer password\n"
                    "host all all 127.0.0.1/32 reject\n",
                    userlist("alice"))
    assert_refused(b, "alice", "login rejected")

    # RELOAD on the console (reached through its own hba line) applies the new file
    run_as.write(b.hba_path, "local pgbouncer pgbouncer password\nhost all all 127.0.0.1/32 trust\n")
    with psycopg.connect(host=str(b.dir), port=b.port, dbname="pgbouncer", user="pgbouncer",
                         password="pgbouncer", autocommit=True, connect_timeout=10) as admin:
        admin.execute("RELOAD")
    wait_for(lambda: first_request(b, "alice") == TRUST, "the new hba file to be in effect")
    assert query(b, "alice", password=None) == ("postgres", 42)

    # SIGHUP too, even when the file's size and mtime look unchanged
    st = os.stat(b.hba_path)
    run_as.write(b.hba_path, "local pgbouncer pgbouncer password\nhost all all 127.0.0.1/32 md5  \n")
    os.utime(b.hba_path, ns=(st.st_atime_ns, st.st_mtime_ns))
    b.reload()
    wait_for(lambda: first_request(b, "alice") == MD5, "the hba file to be re-read on SIGHUP")

    # a file that cannot be read keeps the rules
    os.unlink(b.hba_path)
    mark = b.log_mark()
    b.reload()
    b.wait_log(r"could not open auth_hba_file .*hba\.conf: No such file or directory; keeping the previous hba rules",
               after=mark)
    assert first_request(b, "alice") == MD5
    assert query(b, "alice") == ("postgres", 42)
