"""LDAP authentication (doc/ldap.md): auth_type = ldap with auth_ldap_options,
and the hba method ldap, with PostgreSQL's pg_hba LDAP options, against a
real OpenLDAP directory (test/ldapfixture.py). The client is asked for a
cleartext password, which a thread of the worker checks by a simple bind or
a search+bind; a refusal is FATAL 08P01 "LDAP authentication failed" with
the directory's reason in the log, a directory that hangs holds up nobody
else, and the check ends at client_login_timeout.

The directory's users are not in auth_file; PostgreSQL (trust) has roles of
the same names, so a session shows who logged in.
"""

import re
import socket
import threading
import time
from pathlib import Path

import psycopg
import pytest

from conftest import DEADLINE, free_port, wait_for
from helpers import (conn_on, console, expect_error, raw_login_error, row, rows, two_workers, worker_of,
                     workers)
from ldapfixture import MAILS, PEOPLE, READER, READER_PASSWORD, USERS, ldap_server  # noqa: F401 (fixture)
from pgwire import PgWire

BASE = "dc=example,dc=net"
ALICE, BOB = "alice", "bob"


@pytest.fixture(scope="module")
def roles(pg):
    for name in [*USERS, MAILS[ALICE]]:
        pg.create_role(name)


@pytest.fixture
def d(ldap_server, roles):
    return ldap_server


def simple(d, port=None, **more):
    """Simple bind options: DN uid=<user>,ou=people,dc=example,dc=net."""
    opts = f'ldapserver={d.host} ldapport={port or d.port} ldapprefix="uid=" ldapsuffix=",{PEOPLE}"'
    return " ".join([opts, *(f"{k}={v}" for k, v in more.items())])


def search(d, port=None, **more):
    """Search+bind options, searching as the reader account."""
    opts = (f'ldapserver={d.host} ldapport={port or d.port} ldapbasedn="{BASE}" ldapbinddn="{READER}" '
            f'ldapbindpasswd="{READER_PASSWORD}"')
    return " ".join([opts, *(f"{k}={v}" for k, v in more.items())])


def ldap_pooler(bouncer, d, options, args=(), **ini):
    return bouncer(ini_overrides={"auth_type": "ldap", "auth_ldap_options": options, **ini}, env=d.env(),
                   args=args)


def hba_ldap_pooler(bouncer, d, run_as, options, **ini):
    """auth_type = hba: the console user by trust (the console helpers log in without a password),
    everyone else through an ldap line with these options."""
    b = bouncer(ini_overrides={"auth_type": "hba", **ini}, env=d.env(), start=False)
    hba = run_as.write(b.dir / "hba.conf", "host all pgbouncer 127.0.0.1/32 trust\nlocal all all trust\n"
                                           f"host all all 127.0.0.1/32 ldap {options}\n")
    b.update(auth_hba_file=str(hba))
    b.write_ini()
    return b.start()


def who(b, user, password=None, **kw):
    """Logs in (the directory's password by default) and returns current_user."""
    with b.connect(user=user, password=USERS.get(user) if password is None else password, autocommit=True,
                   **kw) as conn:
        return conn.execute("SELECT current_user").fetchone()[0]


def refused(b, user, password, why, after=0):
    """The client sees FATAL 08P01 "LDAP authentication failed"; the log says why (a regex)."""
    err = raw_login_error(b, user, password)
    assert (err["C"], err["M"]) == ("08P01", "LDAP authentication failed"), err
    b.wait_log(rf"WARNING C-0x[0-9a-f]+: postgres/\S+@127\.0\.0\.1:\d+ LDAP authentication failed "
               rf"for user {re.escape(user)}: {why}", after=after)


# ---- the option forms ----


def test_simple_bind(bouncer, d):
    b = ldap_pooler(bouncer, d, simple(d))
    assert who(b, ALICE) == ALICE
    assert who(b, BOB) == BOB
    # the password is asked for in clear text: the directory needs it itself
    w = PgWire(b.port)
    w.startup(user=ALICE)
    m = w.read_msg()
    assert m[0] == b"R" and m[1][:4] == b"\0\0\0\x03", m
    w.close()
    # the directory knows its users: nothing about auth_file
    assert "no such user" not in b.log_text()


def test_libldap_is_loaded_by_the_first_ldap_login(bouncer, d):
    """libldap is loaded when LDAP is first needed, not at start (doc/ldap.md): a pooler maps it only
    from its first LDAP login on, and the login works as when it was linked."""
    def maps_libldap(pid):
        return "libldap" in Path(f"/proc/{pid}/maps").read_text()

    b = ldap_pooler(bouncer, d, simple(d), min_workers=1, max_workers=1)
    (worker,) = [int(p) for p in Path(f"/proc/{b.pid}/task/{b.pid}/children").read_text().split()]
    assert not maps_libldap(b.pid) and not maps_libldap(worker)
    assert who(b, ALICE) == ALICE
    assert maps_libldap(worker)


@pytest.mark.parametrize("extra,user", [
    ({}, ALICE),
    ({"ldapsearchattribute": "mail"}, MAILS[ALICE]),
    ({"ldapsearchfilter": '"(|(uid=$username)(mail=$username))"'}, BOB),
    ({"ldapsearchfilter": '"(|(uid=$username)(mail=$username))"'}, MAILS[ALICE]),
])
def test_search_bind(bouncer, d, extra, user):
    b = ldap_pooler(bouncer, d, search(d, **extra))
    password = USERS[ALICE] if user == MAILS[ALICE] else USERS[user]
    assert who(b, user, password) == user


def test_search_needs_the_bind_dn(bouncer, d):
    """Anonymous clients may not search this directory: without ldapbinddn the user is not found,
    with a wrong ldapbindpasswd the search bind fails; each says so in the log."""
    b = ldap_pooler(bouncer, d, f'ldapserver={d.host} ldapport={d.port} ldapbasedn="{BASE}"')
    refused(b, ALICE, USERS[ALICE], r'search for \(uid=alice\) under "dc=example,dc=net": Insufficient access')
    b = ldap_pooler(bouncer, d, f'ldapserver={d.host} ldapport={d.port} ldapbasedn="{BASE}" '
                                f'ldapbinddn="{READER}" ldapbindpasswd=wrong')
    refused(b, ALICE, USERS[ALICE], rf'bind as ldapbinddn "{READER}": Invalid credentials')


@pytest.mark.parametrize("url,user", [
    # no filter: the URL's attribute
    ("ldap://127.0.0.1:{port}/ou=people,dc=example,dc=net?uid?sub", ALICE),
    # a filter, and scope one (the children of ou=people)
    ("ldap://127.0.0.1:{port}/ou=people,dc=example,dc=net??one?(mail=$username@example.net)", BOB),
    # ldaps in the URL
    ("ldaps://127.0.0.1:{ldaps_port}/dc=example,dc=net?uid?sub", ALICE),
])
def test_ldapurl(bouncer, d, url, user):
    url = url.format(port=d.port, ldaps_port=d.ldaps_port)
    b = ldap_pooler(bouncer, d, f'ldapurl="{url}" ldapbinddn="{READER}" ldapbindpasswd="{READER_PASSWORD}"')
    assert who(b, user) == user
    with pytest.raises(psycopg.OperationalError, match="LDAP authentication failed"):
        who(b, user, "wrong")


def test_ldapurl_scope_base_finds_no_user(bouncer, d):
    """An ldapurl without a scope searches the base DN itself (PostgreSQL's meaning): no user there."""
    url = f"ldap://127.0.0.1:{d.port}/ou=people,dc=example,dc=net?uid"
    b = ldap_pooler(bouncer, d, f'ldapurl="{url}" ldapbinddn="{READER}" ldapbindpasswd="{READER_PASSWORD}"')
    refused(b, ALICE, USERS[ALICE], r"\(uid=alice\) under \"ou=people,dc=example,dc=net\": no such entry")


@pytest.mark.parametrize("form", ["simple", "search"])
def test_tls(bouncer, d, form):
    """ldapscheme=ldaps (TLS from the first byte) and ldaptls=1 (StartTLS), with the directory's
    certificate checked against the CA that LDAPTLS_CACERT names."""
    make = simple if form == "simple" else search
    b = ldap_pooler(bouncer, d, make(d, port=d.ldaps_port, ldapscheme="ldaps"))
    assert who(b, ALICE) == ALICE
    b = ldap_pooler(bouncer, d, make(d, ldaptls=1))
    assert who(b, BOB) == BOB
    # a pooler that does not trust the CA refuses the directory
    b = bouncer(ini_overrides={"auth_type": "ldap", "auth_ldap_options": make(d, ldaptls=1)},
                env={"LDAPTLS_CACERT": str(d.tls_files.other_ca_cert)})
    refused(b, ALICE, USERS[ALICE], rf"StartTLS with ldap://127\.0\.0\.1:{d.port}: Connect error")


def test_several_servers_first_down(bouncer, d):
    """Servers are tried in order: nothing listens on 127.0.0.2, the second one answers."""
    opts = f'ldapserver="127.0.0.2 {d.host}" ldapport={d.port} ldapprefix="uid=" ldapsuffix=",{PEOPLE}"'
    b = ldap_pooler(bouncer, d, opts)
    assert who(b, ALICE) == ALICE
    # with only the one that is down, the reason names it
    b = ldap_pooler(bouncer, d, opts.replace(f' {d.host}"', '"'))
    refused(b, ALICE, USERS[ALICE], rf"could not connect to ldap://127\.0\.0\.2:{d.port}: Connection refused$")


# ---- refusals ----


@pytest.mark.parametrize("form,user,password,why", [
    ("simple", ALICE, "wrong", rf'bind as "uid=alice,{PEOPLE}": Invalid credentials$'),
    ("simple", "nobody", "x", rf'bind as "uid=nobody,{PEOPLE}": Invalid credentials$'),
    ("search", ALICE, "wrong", rf'bind as "uid=alice,{PEOPLE}": Invalid credentials$'),
    ("search", "nobody", "x", r'\(uid=nobody\) under "dc=example,dc=net": no such entry'),
    ("search", "al*", "x", r"the user name has a character that LDAP filters reserve"),
])
def test_refused(bouncer, d, form, user, password, why):
    b = ldap_pooler(bouncer, d, (simple if form == "simple" else search)(d))
    mark = b.log_mark()
    refused(b, user, password, why, after=mark)
    b.wait_log(r"C-0x[0-9a-f]+: .* pooler error: LDAP authentication failed$", after=mark)
    # the next login goes through
    assert who(b, ALICE) == ALICE


def test_not_unique(bouncer, d):
    b = ldap_pooler(bouncer, d, search(d, ldapsearchattribute="mail"))
    refused(b, MAILS["carol"], USERS["carol"],
            r'\(mail=shared@example\.net\) under "dc=example,dc=net": more than one entry \(LDAP user is not unique\)')


def test_empty_password_never_reaches_the_directory(bouncer, d):
    """An empty password would be an anonymous bind, which a directory accepts."""
    b = ldap_pooler(bouncer, d, simple(d))
    w = PgWire(b.port)
    w.startup(user=ALICE)
    w.read_msg()
    w.send(b"p" + (5).to_bytes(4, "big") + b"\0")
    w.expect_fatal("empty password returned by client")


def test_directory_down(bouncer, d):
    port = free_port()
    b = ldap_pooler(bouncer, d, simple(d, port=port))
    refused(b, ALICE, USERS[ALICE], rf"could not connect to ldap://127\.0\.0\.1:{port}: Connection refused$")


# ---- a directory that hangs ----


@pytest.mark.parametrize("scheme", ["ldap", "ldaps"])
def test_hung_directory_blocks_nobody(bouncer, d, run_as, scheme):
    """slapd stopped: its sockets accept, nothing answers. While an LDAP login waits, another
    client's queries and an md5 login through the same worker go on; the LDAP login fails at
    client_login_timeout with "LDAP authentication failed"."""
    opts = simple(d) if scheme == "ldap" else simple(d, port=d.ldaps_port, ldapscheme="ldaps")
    b = bouncer(ini_overrides={"auth_type": "hba", "max_workers": 1, "client_login_timeout": 2},
                users_txt='"postgres" "postgres"\n"pgbouncer" "pgbouncer"\n', env=d.env(), start=False)
    hba = run_as.write(b.dir / "hba.conf", f"host all {ALICE},{BOB} 127.0.0.1/32 ldap {opts}\n"
                                           "host all postgres 127.0.0.1/32 md5\n"
                                           "local all all trust\n")
    b.update(auth_hba_file=str(hba))
    b.write_ini()
    b.start(["-v"])
    bystander = b.connect(user="postgres", password="postgres", autocommit=True)
    result = {}

    def ldap_login(user):
        try:
            result[user] = who(b, user)
        except Exception as e:  # checked below
            result[user] = e

    with d.hung():
        mark = b.log_mark()
        waiting = threading.Thread(target=ldap_login, args=(ALICE,))
        waiting.start()
        try:
            b.wait_log(r"LDAP check queued \(simple bind\)$", after=mark)
            # the worker's loop goes on while the check waits
            for i in range(5):
                assert bystander.execute("SELECT %s::int", [i]).fetchone() == (i,)
            assert who(b, "postgres", "postgres") == "postgres"
            assert ALICE not in result, result
            # a client that leaves during its check is closed, its check forgotten
            w = PgWire(b.port)
            w.startup(user=BOB)
            w.read_msg()
            mark2 = b.log_mark()
            password = USERS[BOB].encode() + b"\0"
            w.send(b"p" + (len(password) + 4).to_bytes(4, "big") + password)
            b.wait_log(r"LDAP check queued \(simple bind\)$", after=mark2)
            w.close()
            b.wait_log(r"closing because: client disconnected during LDAP authentication", after=mark2)
        finally:
            waiting.join(timeout=DEADLINE)
        assert isinstance(result[ALICE], psycopg.OperationalError), result
        assert "LDAP authentication failed" in str(result[ALICE])
        b.wait_log(r"LDAP authentication failed for user alice: no answer from the directory before "
                   r"client_login_timeout$", after=mark)
        assert "client_login_timeout" not in re.findall(r"closing because: (\S+)", b.log_text()[mark:])
    # the directory is back, and so are the worker's LDAP threads
    assert who(b, ALICE) == ALICE
    assert bystander.execute("SELECT 1").fetchone() == (1,)


# ---- the configuration ----


def test_hba_ldap_line(bouncer, d, run_as):
    """Each hba line carries its own options; other lines keep their methods."""
    b = bouncer(ini_overrides={"auth_type": "hba"}, users_txt='"postgres" "postgres"\n"pgbouncer" "pgbouncer"\n',
                env=d.env(), start=False)
    hba = run_as.write(b.dir / "hba.conf", f"host all {ALICE} 127.0.0.1/32 ldap {simple(d)}\n"
                                           f"host all {BOB} 127.0.0.1/32 ldap {search(d, ldaptls=1)}\n"
                                           "host all postgres 127.0.0.1/32 password\n"
                                           "local all all trust\n")
    b.update(auth_hba_file=str(hba))
    b.write_ini()
    b.start()
    assert who(b, ALICE) == ALICE
    assert who(b, BOB) == BOB
    assert who(b, "postgres", "postgres") == "postgres"
    with pytest.raises(psycopg.OperationalError, match="LDAP authentication failed"):
        who(b, BOB, USERS[ALICE])
    # a line whose options do not parse is skipped with a warning that names the word
    mark = b.log_mark()
    run_as.write(hba, f"host all {ALICE} 127.0.0.1/32 ldap {simple(d)} ldapfoo=1\nlocal all all trust\n")
    with b.admin(host=str(b.dir)) as admin:
        admin.execute("RELOAD")
    b.wait_log(r'could not parse hba config line 1: unrecognized LDAP option "ldapfoo"', after=mark)
    with pytest.raises(psycopg.OperationalError, match="no authentication method is found"):
        who(b, ALICE)


def test_malformed_options_refused_at_start(bouncer, run_pgbouncer, d):
    b = bouncer(ini_overrides={"auth_type": "ldap", "auth_ldap_options": simple(d) + " ldapsufix=x"}, start=False)
    run = run_pgbouncer([b.ini_path])
    seen = run.stdout + run.stderr + b.log_text()
    assert run.rc == 1, seen
    assert f"{b.ini_path}:{b.line_of('auth_ldap_options')}" in seen, seen
    assert 'invalid auth_ldap_options: unrecognized LDAP option "ldapsufix"' in seen, seen
    assert "cannot load config file" in seen, seen
    # auth_type ldap needs the options
    b.update(auth_ldap_options=None)
    b.write_ini()
    run = run_pgbouncer([b.ini_path])
    assert run.rc == 1
    assert "auth_type ldap needs auth_ldap_options" in run.stdout + run.stderr + b.log_text()


def test_malformed_options_refused_on_reload_and_set(bouncer, d, run_as):
    good = simple(d)
    # auth_type = ldap: a reload with a bad list keeps the options in force, and logins go on
    b = ldap_pooler(bouncer, d, good)
    mark = b.log_mark()
    b.update(auth_ldap_options=good.replace("ldapprefix", "ldapprefx"))
    b.write_ini()
    b.reload()
    b.wait_log(r'invalid auth_ldap_options: unrecognized LDAP option "ldapprefx"', after=mark)
    assert who(b, ALICE) == ALICE
    # the console's RELOAD and SET say so too (the console comes in through a local trust line)
    b = bouncer(ini_overrides={"auth_type": "hba", "auth_ldap_options": good}, env=d.env(), start=False)
    b.update(auth_hba_file=str(run_as.write(b.dir / "hba.conf", "local all all trust\n")))
    b.write_ini()
    b.start()
    conn = console(b, host=str(b.dir))
    mark = b.log_mark()
    b.update(auth_ldap_options=good.replace("ldapprefix", "ldapprefx"))
    b.write_ini()
    expect_error(conn, "RELOAD", "RELOAD failed, see logs for additional details", sqlstate="F0000")
    b.wait_log(r'invalid auth_ldap_options: unrecognized LDAP option "ldapprefx"', after=mark)
    mark = b.log_mark()
    expect_error(conn, f"SET auth_ldap_options = '{good} ldapbasedn=dc=x'", "SET failed")
    b.wait_log(r"invalid auth_ldap_options: ldapbasedn cannot be used with ldapprefix or ldapsuffix", after=mark)
    assert row(conn, "SHOW CONFIG", key="auth_ldap_options")["value"] == good


# ---- workers ----


def test_two_workers(bouncer, d, run_as):
    b = hba_ldap_pooler(bouncer, d, run_as, simple(d), min_workers=2, max_workers=2)
    two_workers(b)
    for worker in (0, 1):
        c = conn_on(b, worker, user=ALICE, password=USERS[ALICE])
        assert c.execute("SELECT current_user").fetchone() == (ALICE,)
        with pytest.raises(psycopg.OperationalError, match="LDAP authentication failed"):
            who(b, ALICE, "wrong")


def test_moved_client_keeps_working(bouncer, d, run_as):
    """LDAP clients logged in on one worker; a second worker takes some of them over. They are
    authenticated already: the handover carries no password, and they go on working."""
    b = hba_ldap_pooler(bouncer, d, run_as, simple(d), min_workers=1, max_workers=2, pool_mode="transaction",
                    worker_scale_interval=0.5, worker_scale_up_threshold=0.99, worker_scale_up_samples=100,
                    worker_scale_down_threshold=0.01, worker_scale_down_samples=100)
    clients = [b.connect(user=user, password=USERS[user], autocommit=True) for user in (ALICE, BOB) * 4]
    for c in clients:
        assert worker_of(c) == 0
        c.execute("SELECT 1")
    mark = b.log_mark()
    b.update(min_workers=2)
    b.write_ini()
    b.reload()
    b.wait_log(r"moved \d+ clients to worker 1", after=mark)
    wait_for(lambda: any(w["worker"] == 1 and w["moved_in"] > 0 for w in workers(b)), "a client moved in")
    for i, c in enumerate(clients):
        assert c.execute("SELECT current_user, %s::int", [i]).fetchone() == (("alice", "bob")[i % 2], i)
    with console(b) as admin:
        moved = [r for r in rows(admin, "SHOW CLIENTS") if r["user"] in (ALICE, BOB)]
    assert len(moved) == len(clients)


# ---- the password stays out of the log ----


def test_password_never_logged(bouncer, d, run_as):
    b = bouncer(ini_overrides={"auth_type": "hba"}, users_txt='"postgres" "postgres"\n"pgbouncer" "pgbouncer"\n',
                env=d.env(), start=False)
    hba = run_as.write(b.dir / "hba.conf", f"host all {ALICE} 127.0.0.1/32 ldap {search(d)}\n"
                                           f"host all all 127.0.0.1/32 ldap {simple(d, ldaptls=1)}\n")
    b.update(auth_hba_file=str(hba))
    b.write_ini()
    b.start(["-v", "-v"])
    assert who(b, ALICE) == ALICE
    assert who(b, BOB) == BOB
    for user, password in ((ALICE, "alice wrong pw"), (BOB, "bob wrong pw"), ("nobody", "nobody pw")):
        with pytest.raises(psycopg.OperationalError, match="LDAP authentication failed"):
            who(b, user, password)
    seen = b.log_text() + b.stderr() + b.stdout()
    assert "LDAP authentication failed for user bob" in seen
    assert "LDAP authentication ok" in seen  # verbose=2: the debug lines are there
    for secret in [*USERS.values(), "alice wrong pw", "bob wrong pw", "nobody pw", READER_PASSWORD]:
        assert secret not in seen, f"{secret!r} is in the log"


def test_deadline_of_a_queued_check(bouncer, d):
    """Every thread waits on a hung directory, so the next check waits in the queue; its deadline
    comes first (its client connected first). It fails with the user's name in the log (the
    request was freed before the log line used it) and the worker goes on."""
    b = ldap_pooler(bouncer, d, simple(d), args=["-v"], max_workers=1, client_login_timeout=4)
    queued_user = "queued-user-with-a-long-name"

    def send_password(w, password):
        data = password.encode() + b"\0"
        w.send(b"p" + (len(data) + 4).to_bytes(4, "big") + data)

    with d.hung():
        first = PgWire(b.port)
        first.startup(user=queued_user)
        assert first.read_msg()[0] == b"R"
        # the holders' deadlines well after the first's: none of their threads is free before it
        time.sleep(1)
        mark = b.log_mark()
        holders = []
        for _ in range(8):  # the pool's threads, each held by the hung directory
            w = PgWire(b.port)
            w.startup(user=ALICE)
            assert w.read_msg()[0] == b"R"
            send_password(w, USERS[ALICE])
            holders.append(w)
        wait_for(lambda: len(re.findall(r"LDAP check queued", b.log_text()[mark:])) == 8, "8 checks running")
        mark = b.log_mark()
        send_password(first, "x")
        first.expect_fatal("LDAP authentication failed")
        b.wait_log(rf"LDAP authentication failed for user {queued_user}: no answer from the directory before "
                   r"client_login_timeout$", after=mark)
        for w in holders:
            w.expect_fatal("LDAP authentication failed")
            w.close()
        first.close()
    assert who(b, ALICE) == ALICE


def hung_and_answering(bouncer, d, run_as):
    """One worker, client_login_timeout 30 s; alice's LDAP logins go to a directory that accepts
    connections and never answers (a listening socket nobody reads: the caller closes it), bob's
    to the real one. Returns (that socket, the pooler)."""
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead.listen(64)
    b = bouncer(ini_overrides={"auth_type": "hba", "max_workers": 1, "client_login_timeout": 30}, env=d.env(),
                start=False)
    hung = simple(d, port=dead.getsockname()[1])
    hba = run_as.write(b.dir / "hba.conf", f"host all {ALICE} 127.0.0.1/32 ldap {hung}\n"
                                           f"host all {BOB} 127.0.0.1/32 ldap {simple(d)}\n"
                                           "local all all trust\n")
    b.update(auth_hba_file=str(hba))
    b.write_ini()
    b.start(["-v"])
    return dead, b


def start_checks(b, user, n):
    """n raw clients that log in as user and send the directory's password: n LDAP checks
    submitted; returns the clients, waiting for their answers."""
    clients = []
    for _ in range(n):
        w = PgWire(b.port)
        w.startup(user=user)
        assert w.read_msg()[0] == b"R"
        password = USERS[user].encode() + b"\0"
        w.send(b"p" + (len(password) + 4).to_bytes(4, "big") + password)
        clients.append(w)
    return clients


def test_clients_that_leave_free_their_threads(bouncer, d, run_as):
    """A directory that accepts connections and never answers holds the eight threads of eight
    checks; their clients leave. The checks are cut short then, not at their deadline: another
    user's login, to a directory that answers, goes through at once."""
    dead, b = hung_and_answering(bouncer, d, run_as)
    try:
        mark = b.log_mark()
        for w in start_checks(b, ALICE, 8):
            w.close()
        wait_for(lambda: len(re.findall(r"client disconnected during LDAP authentication",
                                        b.log_text()[mark:])) == 8, "the eight clients seen leaving")
        start = time.monotonic()
        assert who(b, BOB) == BOB
        assert time.monotonic() - start < 5
    finally:
        dead.close()


def test_hung_directory_leaves_threads_for_another(bouncer, d, run_as):
    """Eight clients stay connected while their directory accepts and never answers (their checks
    run until client_login_timeout, 30 s here): another user's login to a directory that answers
    goes through at once, not after those deadlines. A directory's checks hold at most eight of the
    worker's LDAP threads; before, the eight were all the worker had (doc/ldap.md, "When the
    directory does not answer")."""
    dead, b = hung_and_answering(bouncer, d, run_as)
    holders = []
    try:
        mark = b.log_mark()
        holders = start_checks(b, ALICE, 10)  # two more than a directory may hold: they wait in the queue
        wait_for(lambda: len(re.findall(r"LDAP check queued", b.log_text()[mark:])) == 10, "10 checks submitted")
        start = time.monotonic()
        assert who(b, BOB) == BOB
        # well before the holders' deadline (30 s), which is when a starved login would get a thread
        assert time.monotonic() - start < 15
        # the ten still wait for their answer
        assert "LDAP authentication failed for user alice" not in b.log_text()[mark:]
    finally:
        for w in holders:
            w.close()
        dead.close()
