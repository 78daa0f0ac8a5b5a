"""Client authentication against the auth_file (trust, plain, md5,
scram-sha-256; spec/behaviours.md §2, errors of spec/cli.md §7) and the
pooler's own login to a PostgreSQL that asks for md5 or SCRAM passwords,
including SCRAM pass-through with only a stored SCRAM secret."""

import base64
import hashlib
import hmac
import os
import re

import psycopg
import pytest

from conftest import Postgres, wait_for
from helpers import conn_on, raw_login_error, rows, scram_salt, scram_secret_of
from pgwire import md5_secret, message, PgWire

PASSWORD = "s3cret pw"



def scram_secret(password, salt=b"pgbouncer-salt16", iterations=4096):
    """A SCRAM-SHA-256 verifier of an ASCII password, computed as PostgreSQL does."""
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    stored = hashlib.sha256(hmac.new(salted, b"Client Key", "sha256").digest()).digest()
    server = hmac.new(salted, b"Server Key", "sha256").digest()
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored)}:{b64(server)}"



def userlist(*entries):
    return "".join(f'"{u}" "{p}"\n' for u, p in entries) + '"pgbouncer" "pgbouncer"\n'



def can_login(b, user, password, database="postgres"):
    with b.connect(dbname=database, user=user, password=password, autocommit=True) as conn:
        return conn.execute("SELECT current_user").fetchone()[0]


@pytest.fixture(scope="module")
def secrets(pg):
    """Stored secrets of PASSWORD for user postgres, one per kind."""
    return {
        "plain": PASSWORD,
        "md5": md5_secret("postgres", PASSWORD),
        # a SCRAM verifier does not depend on the role name
        "scram": scram_secret_of(pg, "pgb_auth_scram_src", PASSWORD),
    }


# ---------------------------------------------------------------------------
# client authentication (the session cluster trusts the pooler)


def test_trust_known_user(bouncer):
    b = bouncer(ini_overrides={"auth_type": "trust"})
    assert can_login(b, "postgres", None) == "postgres"
    assert can_login(b, "postgres", "any password is ignored") == "postgres"


def test_trust_unknown_user(bouncer):
    b = bouncer(ini_overrides={"auth_type": "trust"})
    with pytest.raises(psycopg.OperationalError, match='"trust" authentication failed'):
        can_login(b, "nobody_here", None)
    err = raw_login_error(b, "nobody_here", None)
    assert (err["C"], err["M"]) == ("08P01", '"trust" authentication failed')


def test_trust_does_not_admit_users_listed_only_in_users_section(bouncer, pg):
    """A [users] entry gives a user settings, not a login: without an auth
    file entry (or auth_query) trust refuses it like an unknown user."""
    pg.create_role("pgb_only_in_users")
    b = bouncer(ini_overrides={"auth_type": "trust"}, start=False)
    b.write_ini(text=b.render_ini() + "[users]\npgb_only_in_users = pool_mode=session\n"
                "postgres = pool_mode=session\n")
    b.start()
    err = raw_login_error(b, "pgb_only_in_users", None)
    assert (err["C"], err["M"]) == ("08P01", '"trust" authentication failed')
    assert can_login(b, "postgres", None) == "postgres"
    with b.admin() as admin:
        assert "pgb_only_in_users" in [r[0] for r in admin.execute("SHOW USERS").fetchall()]


# (auth_type, stored secret kind) -> message for a wrong password, or the exchange expected
MATRIX = [
    ("plain", "plain", "password authentication failed"),
    ("plain", "md5", "password authentication failed"),
    ("plain", "scram", "password authentication failed"),
    ("md5", "plain", "password authentication failed"),
    ("md5", "md5", "password authentication failed"),
    ("md5", "scram", "SASL authentication failed"),  # md5 is upgraded to SCRAM for a SCRAM secret
    ("scram-sha-256", "plain", "SASL authentication failed"),
    ("scram-sha-256", "scram", "SASL authentication failed"),
]


@pytest.mark.parametrize("auth_type,kind,wrong_msg", MATRIX, ids=[f"{a}-{k}" for a, k, _ in MATRIX])
def test_password_methods(bouncer, secrets, auth_type, kind, wrong_msg):
    b = bouncer(ini_overrides={"auth_type": auth_type}, users_txt=userlist(("postgres", secrets[kind])))
    assert can_login(b, "postgres", PASSWORD) == "postgres"
    with pytest.raises(psycopg.OperationalError, match=re.escape(wrong_msg)):
        can_login(b, "postgres", PASSWORD + "x")
    mark = b.log_mark()
    err = raw_login_error(b, "postgres", "wrong")
    assert (err["C"], err["M"]) == ("08P01", wrong_msg)
    # the line operators alert on, whatever the exchange
    b.wait_log(r"C-0x[0-9a-f]+: postgres/postgres@[^ ]+ .*password authentication failed", after=mark)
    # a second client after the failures still logs in, and shares the pool
    assert can_login(b, "postgres", PASSWORD) == "postgres"


def test_scram_with_md5_secret_fails(bouncer, secrets):
    b = bouncer(ini_overrides={"auth_type": "scram-sha-256"}, users_txt=userlist(("postgres", secrets["md5"])))
    err = raw_login_error(b, "postgres", PASSWORD)
    assert (err["C"], err["M"]) == ("08P01", "SASL authentication failed")


@pytest.mark.parametrize("auth_type,msg", [("plain", "password authentication failed"),
                                           ("md5", "password authentication failed"),
                                           ("scram-sha-256", "SASL authentication failed")])
def test_unknown_user_looks_like_wrong_password(bouncer, secrets, auth_type, msg):
    b = bouncer(ini_overrides={"auth_type": auth_type}, users_txt=userlist(("postgres", secrets["plain"])))
    wrong = raw_login_error(b, "postgres", "wrong")
    unknown = raw_login_error(b, "no_such_user_anywhere", PASSWORD)
    assert wrong == unknown == {"S": "FATAL", "C": "08P01", "M": msg}
    # nothing in the exchange reveals that the user is unknown: same request types
    for user in ("postgres", "no_such_user_anywhere"):
        w = PgWire(b.port)
        w.startup(user=user)
        m = w.read_msg()
        assert m[0] == b"R"
        assert m[1][:4] == {"plain": b"\0\0\0\x03", "md5": b"\0\0\0\x05",
                            "scram-sha-256": b"\0\0\0\x0a"}[auth_type]
        w.close()


@pytest.mark.parametrize("auth_type", ["plain", "md5"])
def test_empty_password_message(bouncer, auth_type):
    b = bouncer(ini_overrides={"auth_type": auth_type})
    w = PgWire(b.port)
    w.startup()
    assert w.read_msg()[0] == b"R"
    w.send(message(b"p", b"\0"))
    w.expect_fatal("empty password returned by client")


@pytest.mark.parametrize("auth_type,msg", [("plain", "password authentication failed"),
                                           ("md5", "password authentication failed"),
                                           ("scram-sha-256", "SASL authentication failed")])
def test_stored_empty_password_never_matches(bouncer, auth_type, msg):
    b = bouncer(ini_overrides={"auth_type": auth_type}, users_txt=userlist(("postgres", "")))
    err = raw_login_error(b, "postgres", "x")
    assert (err["C"], err["M"]) == ("08P01", msg)


def test_scram_invalid_mechanism(bouncer):
    b = bouncer(ini_overrides={"auth_type": "scram-sha-256"}, users_txt=userlist(("postgres", PASSWORD)))
    w = PgWire(b.port)
    w.startup()
    m = w.read_msg()
    assert m[0] == b"R" and m[1][:4] == b"\0\0\0\x0a"
    assert m[1][4:] == b"SCRAM-SHA-256\0\0", "only SCRAM-SHA-256 is offered (no -PLUS)"
    first = b"n,,n=,r=abcdefghijklmnop"
    w.send(message(b"p", b"SCRAM-SHA-256-PLUS\0" + len(first).to_bytes(4, "big") + first))
    w.expect_fatal("client selected an invalid SASL authentication mechanism")


def test_scram_garbage_client_first(bouncer):
    b = bouncer(ini_overrides={"auth_type": "scram-sha-256"}, users_txt=userlist(("postgres", PASSWORD)))
    w = PgWire(b.port)
    w.startup()
    assert w.read_msg()[0] == b"R"
    junk = b"this is not scram"
    w.send(message(b"p", b"SCRAM-SHA-256\0" + len(junk).to_bytes(4, "big") + junk))
    w.expect_fatal("SASL authentication failed")


def test_scram_salts_do_not_tell_unknown_users_apart(bouncer):
    """Connecting twice (to any worker) shows a known plain-password user and an unknown user each one
    stable salt of the same size, so the salt does not reveal which names exist."""
    b = bouncer(ini_overrides={"auth_type": "scram-sha-256", "min_workers": 2, "max_workers": 2},
                users_txt=userlist(("postgres", PASSWORD)))
    salts = {user: {scram_salt(b, user) for _ in range(12)} for user in ("postgres", "nobody_here")}
    assert len(salts["postgres"]) == 1 and len(salts["nobody_here"]) == 1, salts
    known, unknown = salts["postgres"].pop(), salts["nobody_here"].pop()
    assert known != unknown and len(known) == len(unknown)
    # the known user still logs in with that verifier
    assert can_login(b, "postgres", PASSWORD) == "postgres"


def test_auth_file_edit_in_the_same_second_is_read_on_reload(bouncer):
    """A RELOAD reads auth_file again only when the file changed. A new
    password of the same length written in place, with the modification
    time put back to the old one, leaves size, inode and mtime as they
    were: the change time (to the nanosecond) still tells."""
    b = bouncer(ini_overrides={"auth_type": "md5"}, users_txt=userlist(("postgres", "pw-one")))
    assert can_login(b, "postgres", "pw-one") == "postgres"
    before = os.stat(b.userlist)
    b.run_as.write(b.userlist, userlist(("postgres", "pw-two")), mode=0o600)
    os.utime(b.userlist, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(b.userlist)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    b.reload()
    wait_for(lambda: login_works(b, "postgres", "pw-two"), "the new password after RELOAD", interval=0.2)
    err = raw_login_error(b, "postgres", "pw-one")
    assert (err["C"], err["M"]) == ("08P01", "password authentication failed"), err


def test_a_worker_started_later_reads_no_file_edited_since_the_reload(bouncer):
    """auth_file is read at start and at RELOAD, as by one process: an edit
    without a RELOAD changes nothing, also on a worker that the scaler (or
    a crash) starts after the edit. Otherwise the old password would work on
    one worker and the new one on another, by the luck of the accept."""
    b = bouncer(ini_overrides={"auth_type": "md5", "min_workers": 1, "max_workers": 2},
                users_txt=userlist(("postgres", "pw-one")))
    assert can_login(b, "postgres", "pw-one") == "postgres"
    b.run_as.write(b.userlist, userlist(("postgres", "pw-two")), mode=0o600)  # no RELOAD
    with b.admin(password="pgbouncer") as admin:
        admin.execute("SET min_workers = 2")

    def active():
        with b.admin(password="pgbouncer") as admin:
            return [w["state"] for w in rows(admin, "SHOW WORKERS")] == ["active", "active"]

    wait_for(active, "a second worker")
    for worker in (0, 1):
        c = conn_on(b, worker, user="postgres", password="pw-one")
        assert c.execute("SELECT current_user").fetchone()[0] == "postgres"
        c.close()
    b.reload()
    for worker in (0, 1):
        c = conn_on(b, worker, user="postgres", password="pw-two")
        c.close()


def login_works(b, user, password):
    try:
        return can_login(b, user, password) == user
    except psycopg.OperationalError:
        return False


def test_admin_console_requires_admin_user(bouncer):
    b = bouncer(ini_overrides={"auth_type": "md5"},
                users_txt=userlist(("postgres", PASSWORD), ("someone", "pw2")))
    with b.admin(password="pgbouncer") as admin:
        assert admin.execute("SHOW VERSION").fetchone()
    err = raw_login_error(b, "someone", "pw2", database="pgbouncer")
    assert (err["C"], err["M"]) == ("08P01", "not allowed")
    err = raw_login_error(b, "pgbouncer", "wrong", database="pgbouncer")
    assert (err["C"], err["M"]) == ("08P01", "password authentication failed")


# ---------------------------------------------------------------------------
# the pooler's login to a PostgreSQL that wants passwords


@pytest.fixture(scope="module")
def pwpg(run_as, session_dir):
    """A cluster of its own whose TCP logins need md5 or SCRAM passwords
    (except for the superuser that sets it up)."""
    server = Postgres(run_as, session_dir)
    try:
        server.start()
        with server.connect() as conn:
            conn.execute("SET password_encryption = 'md5'")
            conn.execute("CREATE ROLE pgb_md5 LOGIN PASSWORD 'md5-pw'")
            conn.execute("CREATE ROLE pgb_md5_members NOLOGIN")
            conn.execute("SET password_encryption = 'scram-sha-256'")
            conn.execute("CREATE ROLE pgb_scram LOGIN PASSWORD 'scram-pw'")
        run_as.write(server.datadir / "pg_hba.conf",
                     "local all all trust\n"
                     "host all postgres 127.0.0.1/32 trust\n"
                     "host all pgb_md5 127.0.0.1/32 md5\n"
                     "host all +pgb_md5_members 127.0.0.1/32 md5\n"
                     "host all all 127.0.0.1/32 scram-sha-256\n", mode=0o600)
        server.sql("SELECT pg_reload_conf()")

        def needs_password():
            try:
                server.connect(user="pgb_scram").close()
                return False
            except psycopg.OperationalError:
                return True

        wait_for(needs_password, "the new pg_hba.conf to be in effect")
        server.scram_secret = server.sql("SELECT rolpassword FROM pg_authid WHERE rolname = 'pgb_scram'")[0][0]
        yield server
    finally:
        server.stop()


def pw_bouncer(bouncer, pwpg, auth_type, users):
    return bouncer(ini_overrides={"auth_type": auth_type}, users_txt=userlist(*users),
                   databases={"postgres": pwpg.connstr("postgres")})


@pytest.mark.parametrize("auth_type", ["trust", "scram-sha-256"])
def test_server_scram_login_with_plain_password(bouncer, pwpg, auth_type):
    b = pw_bouncer(bouncer, pwpg, auth_type, [("pgb_scram", "scram-pw")])
    assert can_login(b, "pgb_scram", "scram-pw") == "pgb_scram"
    assert can_login(b, "pgb_scram", "scram-pw") == "pgb_scram"


@pytest.mark.parametrize("stored", ["plain", "md5"])
def test_server_md5_login(bouncer, pwpg, stored):
    secret = "md5-pw" if stored == "plain" else md5_secret("pgb_md5", "md5-pw")
    b = pw_bouncer(bouncer, pwpg, "md5", [("pgb_md5", secret)])
    assert can_login(b, "pgb_md5", "md5-pw") == "pgb_md5"


@pytest.mark.parametrize("auth_type", ["scram-sha-256", "md5"])
def test_scram_pass_through(bouncer, pwpg, auth_type):
    """Only the role's SCRAM secret is stored: the client's proof gives the
    pooler the keys to log into PostgreSQL."""
    b = pw_bouncer(bouncer, pwpg, auth_type, [("pgb_scram", pwpg.scram_secret)])
    with b.connect(user="pgb_scram", password="scram-pw", autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("pgb_scram",)
    assert can_login(b, "pgb_scram", "scram-pw") == "pgb_scram"
    # a second server of the pool logs in with the same keys
    c1 = b.connect(user="pgb_scram", password="scram-pw", autocommit=True)
    c2 = b.connect(user="pgb_scram", password="scram-pw", autocommit=True)
    pids = {c.execute("SELECT pg_backend_pid()").fetchone()[0] for c in (c1, c2)}
    assert len(pids) == 2
    with pytest.raises(psycopg.OperationalError, match="SASL authentication failed"):
        can_login(b, "pgb_scram", "wrong")


def test_pass_through_keys_survive_an_auth_file_reload(bouncer, pwpg):
    """An edit of the auth_file that leaves a SCRAM pass-through user's
    secret as it was, then RELOAD: the keys its clients' logins gave stay,
    so a client logged in before the reload still gets a new server
    connection (as in PgBouncer). A removed user can no longer log in."""
    b = bouncer(ini_overrides={"auth_type": "scram-sha-256", "pool_mode": "transaction",
                               "min_workers": 1, "max_workers": 1},
                users_txt=userlist(("pgb_scram", pwpg.scram_secret), ("gone", "gone pw")),
                databases={"postgres": pwpg.connstr("postgres")})
    holder = b.connect(user="pgb_scram", password="scram-pw")
    other = b.connect(user="pgb_scram", password="scram-pw", autocommit=True)
    assert other.execute("SELECT current_user").fetchone() == ("pgb_scram",)
    b.run_as.write(b.userlist, f'"pgb_scram" "{pwpg.scram_secret}"\n"pgbouncer" "new admin pw"\n', mode=0o600)
    b.reload()
    wait_for(lambda: console_works(b, "new admin pw"), "the reload to take the new auth_file")
    holder.execute("SELECT 1")  # its transaction keeps the pool's one server
    # a second server: logged in with the keys from before the reload
    assert other.execute("SELECT current_user").fetchone() == ("pgb_scram",)
    assert pool_servers(b) == 2
    holder.rollback()
    err = raw_login_error(b, "gone", "gone pw")
    assert (err["C"], err["M"]) == ("08P01", "SASL authentication failed"), err


def console_works(b, password):
    try:
        with b.admin(password=password) as admin:
            return admin.execute("SHOW VERSION").fetchone() is not None
    except psycopg.OperationalError:
        return False


def pool_servers(b):
    with b.admin(password="new admin pw") as admin:
        (row,) = [r for r in rows(admin, "SHOW POOLS") if r["user"] == "pgb_scram"]
    return row["sv_active"] + row["sv_idle"] + row["sv_used"]


def test_server_rejects_wrong_stored_password(bouncer, pwpg):
    """The server's own error (text and SQLSTATE) reaches the waiting client."""
    b = pw_bouncer(bouncer, pwpg, "trust", [("pgb_scram", "not-the-password")])
    err = raw_login_error(b, "pgb_scram", None)
    assert err["C"] == "28P01", err
    assert err["M"] == 'password authentication failed for user "pgb_scram"', err
    b.wait_log(r"server login failed: FATAL password authentication failed for user \"pgb_scram\"")


def test_server_login_failure_fast_fail(bouncer, pwpg):
    """Within server_login_retry, the next client gets the cached error at once."""
    b = bouncer(ini_overrides={"auth_type": "trust", "server_login_retry": 30},
                users_txt=userlist(("pgb_scram", "not-the-password")),
                databases={"postgres": pwpg.connstr("postgres")})
    err = raw_login_error(b, "pgb_scram", None)
    assert err["C"] == "28P01"
    err = raw_login_error(b, "pgb_scram", None)
    assert (err["C"], err["M"]) == (
        "08P01", 'server login has been failing, cached error: password authentication failed for user '
                 '"pgb_scram" (server_login_retry)')


def test_server_wants_password_we_do_not_have(bouncer, pwpg):
    """A SCRAM secret without pass-through keys (trust client) cannot log in."""
    b = pw_bouncer(bouncer, pwpg, "trust", [("pgb_scram", pwpg.scram_secret)])
    err = raw_login_error(b, "pgb_scram", None)
    assert (err["C"], err["M"]) == ("08P01", "server login failed: wrong password type")


def test_server_login_recovers_after_retry(bouncer, pwpg):
    """Once server_login_retry has passed, a new client triggers a new login attempt."""
    b = bouncer(ini_overrides={"auth_type": "trust", "server_login_retry": 1},
                users_txt=userlist(("pgb_scram", "not-the-password")),
                databases={"postgres": pwpg.connstr("postgres")})
    assert raw_login_error(b, "pgb_scram", None)["C"] == "28P01"
    b.run_as.write(b.userlist, userlist(("pgb_scram", "scram-pw")), mode=0o600)
    b.reload()

    def works():
        try:
            return can_login(b, "pgb_scram", None) == "pgb_scram"
        except psycopg.OperationalError as e:
            assert "password authentication failed" in str(e) or "server_login_retry" in str(e), e
            return False

    wait_for(works, "the pool to log in again after server_login_retry", interval=0.3)


# ---------------------------------------------------------------------------
# a [databases] entry with user= and password= (spec/config.md §3, behaviours.md §11)

ENTRY_PW, USER_PW = "entry-pw-1", "user-pw-2"

# (auth_type, kind of the forced user's auth_file secret) -> message for a wrong password
FORCED_MATRIX = MATRIX + [("trust", "plain", None), ("trust", "md5", None)]


def set_role_password(server, role, password, md5):
    with server.connect(autocommit=True) as conn:
        conn.execute("SET password_encryption = " + ("'md5'" if md5 else "'scram-sha-256'"))
        conn.execute(f"ALTER ROLE {role} PASSWORD '{password}'")


@pytest.mark.parametrize("auth_type,kind,wrong_msg", FORCED_MATRIX, ids=[f"{a}-{k}" for a, k, _ in FORCED_MATRIX])
def test_entry_password_is_only_for_that_entrys_server_logins(bouncer, pwpg, auth_type, kind, wrong_msg):
    """`special` forces user X with a password of its own; X's auth_file
    password stays X's: X logs in to the pooler with it, not with the entry's,
    and `app`, which forces X without a password, logs into PostgreSQL with
    it (md5 server exchange for an md5 secret; a SCRAM secret alone gives a
    forced user no server login)."""
    role = "pgb_fx_" + re.sub(r"\W", "_", f"{auth_type}_{kind}")
    md5 = kind == "md5"
    pwpg.sql(f"CREATE ROLE {role} LOGIN" + (" IN ROLE pgb_md5_members" if md5 else ""))
    try:
        set_role_password(pwpg, role, ENTRY_PW, md5)
        secret = {"plain": USER_PW, "md5": md5_secret(role, USER_PW), "scram": scram_secret(USER_PW)}[kind]
        b = bouncer(ini_overrides={"auth_type": auth_type}, users_txt=userlist((role, secret)),
                    databases={"special": pwpg.connstr("postgres", user=role, password=ENTRY_PW),
                               "app": pwpg.connstr("postgres", user=role)})
        client_pw = None if auth_type == "trust" else USER_PW
        assert can_login(b, role, client_pw, database="special") == role
        if wrong_msg:
            err = raw_login_error(b, role, ENTRY_PW, database="special")
            assert (err["C"], err["M"]) == ("08P01", wrong_msg)

        # now PostgreSQL has the auth_file password: the entry without a password logs in with it
        set_role_password(pwpg, role, USER_PW, md5)
        if kind == "scram":
            err = raw_login_error(b, role, client_pw, database="app")
            assert (err["C"], err["M"]) == ("08P01", "server login failed: wrong password type")
        else:
            assert can_login(b, role, client_pw, database="app") == role
        # the pooled server of `special` still serves X
        assert can_login(b, role, client_pw, database="special") == role
    finally:
        pwpg.sql(f"DROP ROLE IF EXISTS {role}")


# ---------------------------------------------------------------------------
# passwords as long as the protocol allows

LONG_PW = ("0123456789abcdef" * 4096)[:65535]

# (auth_type, kind of the stored secret); the pooler then logs into PostgreSQL with
# SCRAM from the plain password, md5 from the md5 secret, or the client's SCRAM keys
LONG_MATRIX = [("plain", "plain"), ("plain", "md5"), ("md5", "plain"), ("md5", "md5"), ("md5", "scram"),
               ("scram-sha-256", "plain"), ("scram-sha-256", "scram")]


@pytest.mark.parametrize("auth_type,kind", LONG_MATRIX, ids=[f"{a}-{k}" for a, k in LONG_MATRIX])
def test_password_of_65535_bytes(bouncer, pwpg, auth_type, kind):
    role = "pgb_long_" + re.sub(r"\W", "_", f"{auth_type}_{kind}")
    md5 = kind == "md5"
    pwpg.sql(f"CREATE ROLE {role} LOGIN" + (" IN ROLE pgb_md5_members" if md5 else ""))
    try:
        set_role_password(pwpg, role, LONG_PW, md5)
        # pass-through needs the very verifier PostgreSQL has
        (stored,) = pwpg.sql("SELECT rolpassword FROM pg_authid WHERE rolname = %s", [role])[0]
        secret = {"plain": LONG_PW, "md5": md5_secret(role, LONG_PW), "scram": stored}[kind]
        b = pw_bouncer(bouncer, pwpg, auth_type, [(role, secret)])
        assert can_login(b, role, LONG_PW) == role
        wrong = LONG_PW[:-1] + "x"
        err = raw_login_error(b, role, wrong)
        assert err["C"] == "08P01" and err["M"] in ("password authentication failed", "SASL authentication failed")
    finally:
        pwpg.sql(f"DROP ROLE IF EXISTS {role}")


def test_password_over_65535_bytes_is_refused(bouncer):
    b = bouncer(ini_overrides={"auth_type": "plain"},
                users_txt=userlist(("postgres", PASSWORD), ("too_long", "y" * 65536)))
    b.wait_log(r"line 2: password too long")
    w = PgWire(b.port)
    w.startup()
    assert w.read_msg()[0] == b"R"
    w.send(message(b"p", b"x" * 65536 + b"\0"))
    w.expect_fatal("password too long")
    # the users before the long line were read
    assert can_login(b, "postgres", PASSWORD) == "postgres"
