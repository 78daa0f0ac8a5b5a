"""auth_type = pam and the hba method pam (doc/pgbouncer.5.md, auth_type):
the client's cleartext password is checked by PAM service "pgbouncer" in a
thread of the worker, off the event loop.

The service file is /etc/pam.d/pgbouncer (Linux-PAM reads no other place
for a program that names no config dir). The module installs one for the
run, only where none exists (or one this suite left), and removes it at the
end: pam_exec runs a checker script with the password on its standard
input, which accepts the pairs of a table file; a second account rule
refuses one user with pam_deny. The checker can be made to wait for a
release file, so that a test can hold a check while it looks at the pooler.
"""

import os
import re
import threading
import time
from pathlib import Path

import psycopg
import pytest

from conftest import wait_for
from helpers import backend_state, build_has_pam
from test_auth import pwpg  # noqa: F401 (fixture)
from pgwire import PgWire

SERVICE = Path("/etc/pam.d/pgbouncer")
MARKER = "# written by test_pam.py of the pgbouncer test suite"
PAM_USER = "pgb_pam_user"
PAM_PASSWORD = "pam pw 1"
EXPIRED = "pgb_pam_expired"  # right password, refused by the account rule (pam_deny)
SLOW = "pgb_pam_slow"  # its check waits for the release file

CHECKER = """#!/usr/bin/python3
# pam_exec expose_authtok: the password on stdin; PAM_USER, PAM_RHOST in the environment
import os, sys, time
d = os.path.dirname(os.path.abspath(__file__))
pw = sys.stdin.buffer.read().split(b"\\0")[0].decode()
user = os.environ.get("PAM_USER", "")
with open(os.path.join(d, "seen"), "a") as f:
    f.write("%s %s\\n" % (user, os.environ.get("PAM_RHOST", "")))
if user == "{slow}":
    open(os.path.join(d, "slow-started"), "w").close()
    for _ in range(600):  # at most 60 s
        if os.path.exists(os.path.join(d, "slow-release")):
            break
        time.sleep(0.1)
table = {{}}
for line in open(os.path.join(d, "table")).read().splitlines():
    u, _, p = line.partition(":")
    table[u] = p
sys.exit(0 if user and table.get(user) == pw else 1)
"""


@pytest.fixture(scope="module")
def pam_dir(pgbouncer_bin, run_as, session_dir, pg):
    if not build_has_pam(pgbouncer_bin):
        pytest.skip("this pgbouncer was built without PAM")
    if os.geteuid() != 0:
        pytest.skip("installing /etc/pam.d/pgbouncer needs root")
    if SERVICE.exists() and MARKER not in SERVICE.read_text(errors="replace"):
        pytest.skip(f"{SERVICE} exists and is not this suite's: left alone")
    d = run_as.mkdir("pam-", session_dir)
    os.chmod(d, 0o755)
    run_as.write(d / "check", CHECKER.format(slow=SLOW), mode=0o755)
    run_as.write(d / "table", f"{PAM_USER}:{PAM_PASSWORD}\n{EXPIRED}:{PAM_PASSWORD}\n{SLOW}:{PAM_PASSWORD}\n")
    run_as.write(d / "seen", "")
    SERVICE.write_text(
        f"{MARKER}; removed at its end\n"
        f"auth    required pam_exec.so expose_authtok quiet {d}/check\n"
        f"account [success=1 default=ignore] pam_succeed_if.so quiet user notin {EXPIRED}\n"
        "account requisite pam_deny.so\n"
        "account required pam_permit.so\n")
    for role in (PAM_USER, EXPIRED, SLOW):
        pg.create_role(role)
    yield d
    if SERVICE.exists() and MARKER in SERVICE.read_text(errors="replace"):
        SERVICE.unlink()


@pytest.fixture
def pam_check(pam_dir):
    for name in ("slow-started", "slow-release"):
        (pam_dir / name).unlink(missing_ok=True)
    return pam_dir


def pam_pooler(bouncer, **ini):
    # one worker: the slow check and the bystander share its event loop
    return bouncer(ini_overrides={"auth_type": "pam", "max_workers": 1, **ini})


def who(b, user, password, **kw):
    with b.connect(user=user, password=password, autocommit=True, **kw) as conn:
        return conn.execute("SELECT current_user").fetchone()[0]


def test_pam_login(bouncer, pam_check):
    b = pam_pooler(bouncer)
    assert who(b, PAM_USER, PAM_PASSWORD) == PAM_USER
    # the password went to PAM with the client's address
    assert f"{PAM_USER} 127.0.0.1" in (pam_check / "seen").read_text().splitlines()
    # the request is a cleartext password request (PAM needs the password itself)
    w = PgWire(b.port)
    w.startup(user=PAM_USER)
    m = w.read_msg()
    assert m[0] == b"R" and m[1][:4] == b"\0\0\0\x03", m
    w.close()
    # a second login reuses the pool
    assert who(b, PAM_USER, PAM_PASSWORD) == PAM_USER


@pytest.mark.parametrize("user,password,why", [
    (PAM_USER, "wrong", "pam_authenticate"),
    ("pgb_pam_nobody", PAM_PASSWORD, "pam_authenticate"),
    (EXPIRED, PAM_PASSWORD, "pam_acct_mgmt"),
])
def test_pam_refusal(bouncer, pam_check, user, password, why):
    b = pam_pooler(bouncer)
    mark = b.log_mark()
    with pytest.raises(psycopg.OperationalError, match="PAM authentication failed"):
        who(b, user, password)
    b.wait_log(rf"WARNING C-0x[0-9a-f]+: postgres/\S+@127\.0\.0\.1:\d+ PAM authentication failed for user "
               rf"{user}: {why}: ", after=mark)
    b.wait_log(r"C-0x[0-9a-f]+: .* pooler error: PAM authentication failed$", after=mark)
    # nothing about auth_file: PAM knows its own users
    assert "no such user" not in b.log_text()[mark:]
    assert who(b, PAM_USER, PAM_PASSWORD) == PAM_USER


def test_empty_password_never_reaches_pam(bouncer, pam_check):
    b = pam_pooler(bouncer)
    w = PgWire(b.port)
    w.startup(user=PAM_USER)
    w.read_msg()
    w.send(b"p" + (5).to_bytes(4, "big") + b"\0")
    w.expect_fatal("empty password returned by client")


def test_hba_pam_line(bouncer, pam_check, run_as):
    b = bouncer(ini_overrides={"auth_type": "hba"},
                users_txt='"postgres" "postgres"\n"pgbouncer" "pgbouncer"\n', start=False)
    hba = run_as.write(b.dir / "hba.conf", f"host all {PAM_USER} 127.0.0.1/32 pam\n"
                       "host all postgres 127.0.0.1/32 password\n"
                       "local all all password\n")
    b.update(auth_hba_file=str(hba))
    b.write_ini()
    b.start()
    assert who(b, PAM_USER, PAM_PASSWORD) == PAM_USER
    # PAM knows the user, whatever auth_file says
    assert "no such user" not in b.log_text()
    with pytest.raises(psycopg.OperationalError, match="PAM authentication failed"):
        who(b, PAM_USER, "wrong")
    # another line's method is untouched
    assert who(b, "postgres", "postgres") == "postgres"
    # the password PAM accepted is kept for server logins only: the password line does not take it
    mark = b.log_mark()
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        who(b, PAM_USER, PAM_PASSWORD, host=str(b.dir))
    b.wait_log(rf"no such user: {PAM_USER}$", after=mark)


def test_slow_check_does_not_block_the_loop(bouncer, pam_check):
    """While a check waits inside PAM, the worker serves other clients."""
    b = pam_pooler(bouncer)
    with b.connect(user=PAM_USER, password=PAM_PASSWORD, autocommit=True) as bystander:
        result = {}

        def slow_login():
            try:
                result["user"] = who(b, SLOW, PAM_PASSWORD)
            except Exception as e:  # reported below
                result["error"] = e

        t = threading.Thread(target=slow_login)
        t.start()
        try:
            wait_for(lambda: (pam_check / "slow-started").exists(), "the slow PAM check to start")
            # the check is held inside PAM: the loop still answers, and still logs in
            assert bystander.execute("SELECT 42").fetchone()[0] == 42
            assert who(b, PAM_USER, PAM_PASSWORD) == PAM_USER
            assert "user" not in result and "error" not in result
        finally:
            (pam_check / "slow-release").touch()
            t.join(timeout=60)
        assert result == {"user": SLOW}


def test_client_gone_during_check(bouncer, pam_check):
    """A client that hangs up while its check runs is closed (the janitor
    sees it) without waiting for PAM; the late answer is dropped."""
    b = bouncer(ini_overrides={"auth_type": "pam", "max_workers": 1}, args=["-v"])
    w = PgWire(b.port)
    w.startup(user=SLOW)
    w.read_msg()
    w.send(b"p" + (len(PAM_PASSWORD) + 5).to_bytes(4, "big") + PAM_PASSWORD.encode() + b"\0")
    wait_for(lambda: (pam_check / "slow-started").exists(), "the slow PAM check to start")
    mark = b.log_mark()
    w.close()
    b.wait_log(r"C-0x[0-9a-f]+: \S+@127\.0\.0\.1:\d+ closing because: client disconnected during PAM "
               r"authentication", after=mark)
    (pam_check / "slow-release").touch()
    b.wait_log(r"DEBUG PAM: answer for a client that is gone, dropped$", after=mark)
    assert who(b, PAM_USER, PAM_PASSWORD) == PAM_USER


def test_login_timeout_during_check(bouncer, pam_check):
    """client_login_timeout closes a client whose check is still in PAM; the
    late answer is dropped."""
    b = bouncer(ini_overrides={"auth_type": "pam", "max_workers": 1, "client_login_timeout": 1}, args=["-v"])
    w = PgWire(b.port)
    w.startup(user=SLOW)
    w.read_msg()
    w.send(b"p" + (len(PAM_PASSWORD) + 5).to_bytes(4, "big") + PAM_PASSWORD.encode() + b"\0")
    wait_for(lambda: (pam_check / "slow-started").exists(), "the slow PAM check to start")
    w.expect_fatal("client_login_timeout")
    mark = b.log_mark()
    (pam_check / "slow-release").touch()
    # the answer arrives for nobody; the next login goes through the same threads
    b.wait_log(r"DEBUG PAM: answer for a client that is gone, dropped$", after=mark)
    assert who(b, PAM_USER, PAM_PASSWORD) == PAM_USER
    assert not re.search(rf"{SLOW}@\S+ PAM authentication ok", b.log_text())


def test_reload_keeps_the_password_pam_accepted(bouncer, pam_check, pwpg, run_as):
    """The servers of a user that only PAM knows log in with the password PAM accepted. A
    reload that re-reads a changed auth_file keeps it: it did not come from the file, and the
    next server login of that user needs it."""
    with pwpg.connect() as c:
        c.execute(f"DROP ROLE IF EXISTS {PAM_USER}")
        c.execute("SET password_encryption = 'scram-sha-256'")
        c.execute(f"CREATE ROLE {PAM_USER} LOGIN PASSWORD '{PAM_PASSWORD}'")
        c.commit()
    b = bouncer(ini_overrides={"auth_type": "hba", "max_workers": 1, "pool_mode": "transaction",
                               "server_lifetime": 1},
                databases={"postgres": pwpg.connstr("postgres")}, start=False)
    hba = run_as.write(b.dir / "hba.conf", f"host all {PAM_USER} 127.0.0.1/32 pam\nlocal all all trust\n")
    b.update(auth_hba_file=str(hba))
    b.write_ini()
    b.start()
    conn = b.connect(user=PAM_USER, password=PAM_PASSWORD, autocommit=True)
    first = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    run_as.write(b.userlist, '"postgres" "postgres"\n"pgbouncer" "pgbouncer"\n"pgb_pam_other" "x"\n', mode=0o600)
    with b.admin(host=str(b.dir)) as admin:
        admin.execute("RELOAD")
    wait_for(lambda: backend_state(pwpg, first) is None, "server_lifetime to close the first server")
    # a new server, logged in with the password PAM accepted
    pid, user = conn.execute("SELECT pg_backend_pid(), current_user").fetchone()
    assert pid != first and user == PAM_USER
    assert "server login failed" not in b.log_text()
    assert who(b, PAM_USER, PAM_PASSWORD) == PAM_USER


def password_message(pw):
    return b"p" + (len(pw) + 5).to_bytes(4, "big") + pw.encode() + b"\0"


def test_second_password_message_during_a_check_is_refused(bouncer, pam_check):
    """A client sends two password messages in one write: the second one,
    while the first is being checked, ends the login with FATAL (one check
    per login), and the first answer, when it comes, is dropped. Before, it
    attached a second check to the same client, whose answer could act on
    a freed socket (another client's) once the first had closed it."""
    b = bouncer(ini_overrides={"auth_type": "pam", "max_workers": 1}, args=["-v"])
    w = PgWire(b.port)
    w.startup(user=SLOW)
    w.read_msg()
    w.send(password_message(PAM_PASSWORD) + password_message(PAM_PASSWORD))
    w.expect_fatal("PAM authentication failed")
    w.close()
    with b.connect(user=PAM_USER, password=PAM_PASSWORD, autocommit=True) as bystander:
        assert bystander.execute("SELECT 1").fetchone() == (1,)
        # the first check runs (its answer comes for nobody), or, not started yet, left the queue
        started = False
        for _ in range(20):
            started = (pam_check / "slow-started").exists()
            if started:
                break
            time.sleep(0.1)
        mark = b.log_mark()
        (pam_check / "slow-release").touch()
        if started:
            b.wait_log(r"DEBUG PAM: answer for a client that is gone, dropped$", after=mark)
        assert bystander.execute("SELECT 2").fetchone() == (2,)
    assert who(b, PAM_USER, PAM_PASSWORD) == PAM_USER


def test_checks_of_clients_that_left_are_not_run(bouncer, pam_check):
    """Both PAM threads are busy (two slow checks); ten more clients send a
    password and hang up while their checks wait in the queue. Those checks
    never run: PAM is not asked for nobody (a flood of such logins would
    hold every thread, and with pam_faillock count failures against real
    accounts)."""
    gone = "pgb_pam_gone"
    b = bouncer(ini_overrides={"auth_type": "pam", "max_workers": 1}, args=["-v"])
    seen_before = (pam_check / "seen").read_text().count(f"{gone} ")
    slow = []
    for _ in range(2):
        w = PgWire(b.port)
        w.startup(user=SLOW)
        w.read_msg()
        w.send(password_message(PAM_PASSWORD))
        slow.append(w)
    mark = b.log_mark()
    leavers = []
    for _ in range(10):
        w = PgWire(b.port)
        w.startup(user=gone)
        w.read_msg()
        w.send(password_message("whatever"))
        leavers.append(w)
    wait_for(lambda: b.log_text()[mark:].count("PAM check queued") >= 10, "the ten checks to be queued")
    for w in leavers:
        w.close()
    wait_for(lambda: b.log_text()[mark:].count("client disconnected during PAM authentication") >= 10,
             "the ten clients to be closed")
    (pam_check / "slow-release").touch()
    for w in slow:
        w.read_until(b"Z")
        w.close()
    assert who(b, PAM_USER, PAM_PASSWORD) == PAM_USER
    assert (pam_check / "seen").read_text().count(f"{gone} ") == seen_before
