"""auth_query at run time (spec/behaviours.md §2, errors of spec/cli.md §7):
roles that exist only in PostgreSQL log in through the pooler with the
secret that auth_query finds, set up with the bootstrap `pgbouncer-auth-setup`.

The module runs a PostgreSQL cluster of its own whose TCP logins need
passwords (md5 or SCRAM, as each role's secret is stored), so that a login
through the pooler proves SCRAM pass-through: the pooler never knows a
plain password except the auth_user's.
"""

import re
import subprocess
import threading

import psycopg
import pytest
from psycopg import sql as pgsql

from conftest import DEADLINE, Postgres, Run, child_env, wait_for
from helpers import raw_login_error
from pgwire import PgWire
from test_auth_setup import setting, tool_path, userlist_lines

AUTH = "pgb_authq"  # the auth_user the bootstrap makes
AUTH_PW = "auth q pw"
MD5_ROLE, MD5_PW = "authq_md5", "md5 role pw"
SCRAM_ROLE, SCRAM_PW = "authq_scram", "scram role pw"
SUPER_AUTH, SUPER_PW = "authq_super", "super pw"  # for the default auth_query (pg_authid)
APPDB, OTHERDB, EVILDB = "authq_app", "authq_other", "authq_evil"


@pytest.fixture(scope="module")
def apg(run_as, session_dir):
    """A cluster whose TCP logins need passwords, except the superuser `postgres`."""
    server = Postgres(run_as, session_dir)
    try:
        server.start()
        for db in (APPDB, OTHERDB, EVILDB):
            server.sql(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(db)))
        with server.connect() as conn:
            conn.execute("SET password_encryption = 'md5'")
            conn.execute(pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                pgsql.Identifier(MD5_ROLE), pgsql.Literal(MD5_PW)))
            conn.execute("SET password_encryption = 'scram-sha-256'")
            conn.execute(pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                pgsql.Identifier(SCRAM_ROLE), pgsql.Literal(SCRAM_PW)))
            conn.execute(pgsql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
                pgsql.Identifier(SUPER_AUTH), pgsql.Literal(SUPER_PW)))
        # md5 here means: an md5 exchange for an md5 secret, SCRAM for a SCRAM secret
        run_as.write(server.datadir / "pg_hba.conf",
                     "local all all trust\n"
                     "host all postgres 127.0.0.1/32 trust\n"
                     "host all all 127.0.0.1/32 md5\n", mode=0o600)
        server.sql("SELECT pg_reload_conf()")

        def needs_password():
            try:
                server.connect(user=SCRAM_ROLE).close()
                return False
            except psycopg.OperationalError:
                return True

        wait_for(needs_password, "the new pg_hba.conf to be in effect")
        yield server
    finally:
        server.stop()


class Setup:
    """Runs pgbouncer-auth-setup against the module's cluster."""

    def __init__(self, pg):
        self.pg = pg
        self.tool = tool_path()
        self.conninfo = f"host={pg.host} port={pg.port} user=postgres connect_timeout=10"

    def run(self, *args):
        out = subprocess.run([str(self.tool), *map(str, args)], env=child_env(), stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=DEADLINE)
        return Run(out.returncode, out.stdout, out.stderr)

    def bootstrap(self, *dbs):
        r = self.run("--user", AUTH, "--password", AUTH_PW, self.conninfo, *(dbs or (APPDB,)))
        assert r.rc == 0, f"bootstrap failed ({r.rc}):\n{r.stdout}\n{r.stderr}"
        return r

    def check(self, db=APPDB):
        return self.run("--check", "--user", AUTH, self.conninfo, db)


@pytest.fixture(scope="module")
def setup(apg):
    s = Setup(apg)
    r = s.bootstrap(APPDB, EVILDB)
    s.auth_user = setting(r.stdout, "auth_user")
    s.auth_query = setting(r.stdout, "auth_query")
    (s.userlist_line,) = userlist_lines(r.stdout)
    assert s.auth_user == AUTH
    return s


def start(bouncer, apg, setup, auth_type="md5", ini=None, databases=None, users=(), auth_line=None):
    """A pooler configured with what the bootstrap printed (one worker, so
    that SHOW USERS sees every user the pooler found)."""
    settings = {"auth_type": auth_type, "auth_user": setup.auth_user, "auth_query": setup.auth_query,
                "max_workers": 1}
    settings.update(ini or {})
    if databases is None:
        databases = {APPDB: apg.connstr(APPDB), OTHERDB: apg.connstr(OTHERDB)}
    users_txt = (auth_line or setup.userlist_line) + "\n" + "".join(f'"{u}" "{p}"\n' for u, p in users)
    users_txt += '"pgbouncer" "pgbouncer"\n'
    return bouncer(ini_overrides=settings, databases=databases, users_txt=users_txt)


def start_with_users_entry(bouncer, apg, setup, role, ini):
    """start() with `role` in a [users] section (settings only, not in the
    auth_file): returns the pooler and that section, to write again with
    every later ini."""
    users = f"[users]\n{role} = pool_mode=transaction\n"
    b = start(bouncer, apg, setup, ini=ini)
    b.write_ini(text=b.render_ini() + users)
    b.reload()
    return b, users


def login(b, user, password, dbname=APPDB, **kw):
    """current_user and the server's pid, through the pooler."""
    with b.connect(dbname=dbname, user=user, password=password, autocommit=True, **kw) as conn:
        return conn.execute("SELECT current_user, pg_backend_pid()").fetchone()


def idle_servers(b, dbname, user):
    with b.admin(password="pgbouncer") as admin:
        cur = admin.execute("SHOW POOLS")
        cols = [d.name for d in cur.description]
        for r in cur.fetchall():
            row = dict(zip(cols, r))
            if (row["database"], row["user"]) == (dbname, user):
                return row["sv_idle"]
    return 0


def grant(apg, statement, db=APPDB):
    apg.sql(pgsql.SQL(statement).format(auth=pgsql.Identifier(AUTH)), dbname=db)


# ---------------------------------------------------------------------------
# logins with the secret auth_query finds


@pytest.mark.parametrize("role,password,auth_type,wrong_msg", [
    (MD5_ROLE, MD5_PW, "md5", "password authentication failed"),
    (MD5_ROLE, MD5_PW, "plain", "password authentication failed"),
    (SCRAM_ROLE, SCRAM_PW, "md5", "SASL authentication failed"),  # md5 is upgraded to SCRAM
    (SCRAM_ROLE, SCRAM_PW, "scram-sha-256", "SASL authentication failed"),
], ids=["md5-secret-md5", "md5-secret-plain", "scram-secret-md5", "scram-secret-scram"])
def test_role_only_in_postgres_logs_in(bouncer, apg, setup, role, password, auth_type, wrong_msg):
    b = start(bouncer, apg, setup, auth_type)
    user, pid = login(b, role, password)
    assert user == role
    # the next login looks the user up again, and reuses the pool's server once it is reset and idle
    wait_for(lambda: idle_servers(b, APPDB, role) == 1, "the first login's server to be idle again")
    assert login(b, role, password) == (role, pid)
    with pytest.raises(psycopg.OperationalError, match=re.escape(wrong_msg)):
        login(b, role, password + "x")
    err = raw_login_error(b, role, "wrong", database=APPDB)
    assert (err["C"], err["M"]) == ("08P01", wrong_msg)
    # the lookups ran as the auth_user on a pooled server of (database, auth_user)
    with b.admin(password="pgbouncer") as admin:
        pools = {(r[0], r[1]) for r in admin.execute("SHOW POOLS").fetchall()}
    assert (APPDB, AUTH) in pools and (APPDB, role) in pools


def test_unknown_role_gets_no_such_user(bouncer, apg, setup):
    b = start(bouncer, apg, setup)
    err = raw_login_error(b, "authq_nobody", "pw", database=APPDB)
    assert (err["C"], err["M"]) == ("08P01", "no such user")
    b.wait_log(r"no such user: authq_nobody")
    # nor are roles the lookup hides (superusers, the auth_user itself) found
    err = raw_login_error(b, "postgres", "pw", database=APPDB)
    assert (err["C"], err["M"]) == ("08P01", "no such user")


def test_auth_file_users_need_no_lookup(bouncer, apg, setup):
    """A user in auth_file logs in with that secret, even where auth_query would fail."""
    b = start(bouncer, apg, setup, users=[(SCRAM_ROLE, SCRAM_PW)],
              ini={"auth_query": "SELECT 'broken"})
    assert login(b, SCRAM_ROLE, SCRAM_PW)[0] == SCRAM_ROLE
    err = raw_login_error(b, MD5_ROLE, MD5_PW, database=APPDB)
    assert (err["C"], err["M"]) == ("08P01", "bouncer config error")


def test_expired_password_never_logs_in(bouncer, apg, setup):
    """auth_query returns a NULL password: the user exists but no password matches."""
    role = "authq_expired"
    apg.sql(pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD 'expired pw' VALID UNTIL '2000-01-01'").format(
        pgsql.Identifier(role)))
    try:
        b = start(bouncer, apg, setup)
        err = raw_login_error(b, role, "expired pw", database=APPDB)
        assert (err["C"], err["M"]) == ("08P01", "password authentication failed")
    finally:
        apg.sql(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(role)))


def test_secret_is_refreshed_at_each_login_and_listed(bouncer, apg, setup):
    role = "authq_changing"
    apg.create_role(role, password="first pw")
    try:
        b = start(bouncer, apg, setup)
        assert login(b, role, "first pw")[0] == role
        with b.admin(password="pgbouncer") as admin:
            names = [r[0] for r in admin.execute("SHOW USERS").fetchall()]
        assert role in names and AUTH in names
        assert names == sorted(names)

        apg.create_role(role, password="second pw")
        with pytest.raises(psycopg.OperationalError, match="SASL authentication failed"):
            login(b, role, "first pw")
        assert login(b, role, "second pw")[0] == role

        apg.sql(pgsql.SQL("ALTER ROLE {} NOLOGIN").format(pgsql.Identifier(role)))
        err = raw_login_error(b, role, "second pw", database=APPDB)
        assert (err["C"], err["M"]) == ("08P01", "no such user")
    finally:
        apg.sql(pgsql.SQL("DROP ROLE IF EXISTS {}").format(pgsql.Identifier(role)))


def test_auth_file_reload_keeps_looked_up_secrets(bouncer, apg, setup):
    """A secret that auth_query found is not the auth_file's: a RELOAD after
    an edit of the file leaves it, with the SCRAM keys of the role's logins,
    so a client logged in before the reload still gets a new server
    connection (as in PgBouncer)."""
    b = start(bouncer, apg, setup, auth_type="scram-sha-256", ini={"pool_mode": "transaction"})
    holder = b.connect(dbname=APPDB, user=SCRAM_ROLE, password=SCRAM_PW)
    other = b.connect(dbname=APPDB, user=SCRAM_ROLE, password=SCRAM_PW, autocommit=True)
    assert other.execute("SELECT current_user").fetchone() == (SCRAM_ROLE,)
    b.run_as.write(b.userlist, setup.userlist_line + '\n"pgbouncer" "new admin pw"\n', mode=0o600)
    b.reload()

    def reloaded():
        try:
            with b.admin(password="new admin pw"):
                return True
        except psycopg.OperationalError:
            return False

    wait_for(reloaded, "the reload to take the new auth_file")
    holder.execute("SELECT 1")  # its transaction keeps the pool's one server
    # a second server: logged in with the keys from before the reload
    assert other.execute("SELECT current_user").fetchone() == (SCRAM_ROLE,)
    holder.rollback()
    with b.admin(password="new admin pw") as admin:
        servers = [r for r in admin.execute("SHOW SERVERS").fetchall() if r[1] == SCRAM_ROLE]
    assert len(servers) == 2, servers


@pytest.mark.parametrize("role,password", [(MD5_ROLE, MD5_PW), (SCRAM_ROLE, SCRAM_PW)])
def test_reload_of_auth_file_keeps_the_fetched_secret(bouncer, apg, setup, role, password):
    """The servers of a user found by auth_query log in with what the lookup fetched. A reload
    that re-reads a changed auth_file keeps it: it did not come from the file, and the session's
    next server login needs it."""
    b = start(bouncer, apg, setup, ini={"pool_mode": "transaction", "server_lifetime": 1})
    conn = b.connect(dbname=APPDB, user=role, password=password, autocommit=True)
    first = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    b.run_as.write(b.userlist, b.userlist.read_text() + '"authq_someone" "x"\n', mode=0o600)
    with b.admin(password="pgbouncer") as admin:
        admin.execute("RELOAD")
    wait_for(lambda: not apg.sql("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [first]),
             "server_lifetime to close the first server")
    pid, user = conn.execute("SELECT pg_backend_pid(), current_user").fetchone()
    assert pid != first and user == role
    assert "server login failed" not in b.log_text()


# ---------------------------------------------------------------------------
# a broken set-up: what the log says and how the bootstrap repairs it


@pytest.mark.parametrize("revoke,regrant,missing,fix", [
    ("REVOKE USAGE ON SCHEMA pgbouncer FROM {auth}", "GRANT USAGE ON SCHEMA pgbouncer TO {auth}",
     "USAGE on schema pgbouncer", f"GRANT USAGE ON SCHEMA pgbouncer TO {AUTH};"),
    ("REVOKE EXECUTE ON FUNCTION pgbouncer.get_auth(text) FROM {auth}",
     "GRANT EXECUTE ON FUNCTION pgbouncer.get_auth(text) TO {auth}",
     "EXECUTE on function pgbouncer.get_auth", f"GRANT EXECUTE ON FUNCTION pgbouncer.get_auth(text) TO {AUTH};"),
], ids=["usage-on-schema", "execute-on-function"])
def test_missing_grant_is_named_and_bootstrap_fixes_it(bouncer, apg, setup, revoke, regrant, missing, fix):
    b = start(bouncer, apg, setup)
    assert login(b, SCRAM_ROLE, SCRAM_PW)[0] == SCRAM_ROLE
    grant(apg, revoke)
    try:
        mark = b.log_mark()
        err = raw_login_error(b, SCRAM_ROLE, SCRAM_PW, database=APPDB)
        assert (err["C"], err["M"]) == ("08P01", "bouncer config error")
        m = b.wait_log(r"^.*auth_query for user authq_scram failed: .*$", after=mark)
        line = m[0]
        assert "(SQLSTATE 42501)" in line, line
        assert f"missing grant: {missing} for the auth_user {AUTH}" in line, line
        assert fix in line, line
        assert "pgbouncer-auth-setup" in line and "pgbouncer-auth-setup --check" in line, line

        r = setup.check()
        assert r.rc == 1, r.stdout
        assert "MISSING" in r.stdout and fix in r.stdout, r.stdout

        setup.bootstrap()
        assert setup.check().rc == 0
        assert login(b, SCRAM_ROLE, SCRAM_PW)[0] == SCRAM_ROLE
    finally:
        grant(apg, regrant)


def test_default_auth_query_without_superuser_names_pg_authid(bouncer, apg, setup):
    b = start(bouncer, apg, setup, ini={"auth_query": None})
    mark = b.log_mark()
    err = raw_login_error(b, SCRAM_ROLE, SCRAM_PW, database=APPDB)
    assert (err["C"], err["M"]) == ("08P01", "bouncer config error")
    line = b.wait_log(r"^.*auth_query for user authq_scram failed: .*$", after=mark)[0]
    assert "permission denied for table pg_authid" in line and "SECURITY DEFINER" in line, line
    assert "pgbouncer-auth-setup" in line, line


def test_lookup_missing_in_database_names_the_bootstrap(bouncer, apg, setup):
    """OTHERDB was not bootstrapped: the function is not there."""
    b = start(bouncer, apg, setup)
    mark = b.log_mark()
    err = raw_login_error(b, SCRAM_ROLE, SCRAM_PW, database=OTHERDB)
    assert (err["C"], err["M"]) == ("08P01", "bouncer config error")
    line = b.wait_log(r"^.*auth_query for user authq_scram failed: .*$", after=mark)[0]
    assert f"not installed in database {OTHERDB}" in line and "auth_dbname" in line, line


def test_auth_user_with_wrong_password(bouncer, apg, setup):
    """The client hears why the lookup could not run: the server's error, then
    within server_login_retry the cached one, as for any failing pool."""
    b = start(bouncer, apg, setup, auth_line=f'"{AUTH}" "not the password"')
    mark = b.log_mark()
    err = raw_login_error(b, SCRAM_ROLE, SCRAM_PW, database=APPDB)
    assert (err["C"], err["M"]) == ("28P01", f'password authentication failed for user "{AUTH}"')
    line = b.wait_log(r"^.*auth_query cannot run: login of auth_user .*$", after=mark)[0]
    assert "password authentication failed" in line and "plain password" in line, line
    err = raw_login_error(b, SCRAM_ROLE, SCRAM_PW, database=APPDB)
    assert (err["C"], err["M"]) == (
        "08P01", f'server login has been failing, cached error: password authentication failed for user '
                 f'"{AUTH}" (server_login_retry)')


def test_console_logins_use_auth_query(bouncer, apg, setup):
    """With auth_dbname set, roles known only to PostgreSQL log into the admin
    console too; the admin and stats lists still decide who gets in."""
    b = start(bouncer, apg, setup, ini={"auth_dbname": APPDB, "stats_users": SCRAM_ROLE})
    with b.connect(dbname="pgbouncer", user=SCRAM_ROLE, password=SCRAM_PW, autocommit=True,
                   prepare_threshold=None) as conn:
        assert conn.execute("SHOW USERS").fetchall()
    err = raw_login_error(b, SCRAM_ROLE, "wrong", database="pgbouncer")
    assert (err["C"], err["M"]) == ("08P01", "SASL authentication failed")
    err = raw_login_error(b, MD5_ROLE, MD5_PW, database="pgbouncer")
    assert (err["C"], err["M"]) == ("08P01", "not allowed")
    err = raw_login_error(b, "authq_nobody", "pw", database="pgbouncer")
    assert (err["C"], err["M"]) == ("08P01", "no such user")
    # the auth_file's console user needs no lookup
    with b.admin(password="pgbouncer") as admin:
        assert admin.execute("SHOW VERSION").fetchone()


def test_disabled_auth_database_is_not_used(bouncer, apg, setup):
    """A DISABLEd database runs no lookups for the databases that use it as auth_dbname."""
    b = start(bouncer, apg, setup, ini={"auth_dbname": APPDB})
    assert login(b, SCRAM_ROLE, SCRAM_PW, dbname=OTHERDB)[0] == SCRAM_ROLE
    with b.admin(password="pgbouncer", prepare_threshold=None) as admin:
        admin.execute(f"DISABLE {APPDB}")
        err = raw_login_error(b, SCRAM_ROLE, SCRAM_PW, database=OTHERDB)
        assert (err["C"], err["M"]) == ("08P01", f'authentication database "{APPDB}" is disabled')
        admin.execute(f"ENABLE {APPDB}")
    assert login(b, SCRAM_ROLE, SCRAM_PW, dbname=OTHERDB)[0] == SCRAM_ROLE


# ---------------------------------------------------------------------------
# what the client sends does not reach the lookup


def test_hostile_search_path_cannot_change_the_lookup(bouncer, apg, setup):
    """With search_path tracked, a client's options=-c search_path=evil must
    not be applied on the auth connection: an unqualified auth_query (found
    through the auth_user's own search_path) keeps calling the real lookup,
    not the look-alike in schema evil that would let anyone in."""
    apg.sql("CREATE SCHEMA evil", dbname=EVILDB)
    try:
        apg.sql("CREATE FUNCTION evil.get_auth(p text) RETURNS TABLE (usename name, passwd text)"
                " LANGUAGE sql AS $$ SELECT p::name, 'evil pw'::text $$", dbname=EVILDB)
        grant(apg, "GRANT USAGE ON SCHEMA evil TO {auth}", db=EVILDB)
        grant(apg, "GRANT EXECUTE ON FUNCTION evil.get_auth(text) TO {auth}", db=EVILDB)
        apg.sql(pgsql.SQL("ALTER ROLE {} IN DATABASE {} SET search_path = pgbouncer").format(
            pgsql.Identifier(AUTH), pgsql.Identifier(EVILDB)))
        # the trap works: with search_path=evil the same query finds the evil secret
        with psycopg.connect(host=apg.host, port=apg.port, dbname=EVILDB, user=AUTH, password=AUTH_PW,
                             options="-c search_path=evil") as conn:
            rows = conn.execute("SELECT usename, passwd FROM get_auth(%s)", [SCRAM_ROLE]).fetchall()
            assert rows == [(SCRAM_ROLE, "evil pw")]

        b = start(bouncer, apg, setup, ini={"auth_query": "SELECT usename, passwd FROM get_auth($1)",
                                            "track_extra_parameters": "IntervalStyle, search_path"},
                  databases={EVILDB: apg.connstr(EVILDB)})
        hostile = "-c search_path=evil"
        with pytest.raises(psycopg.OperationalError, match="SASL authentication failed"):
            login(b, SCRAM_ROLE, "evil pw", dbname=EVILDB, options=hostile)
        # the owner of the role, with the same options, logs in and gets its search_path on its own server
        with b.connect(dbname=EVILDB, user=SCRAM_ROLE, password=SCRAM_PW, autocommit=True,
                       options=hostile) as conn:
            assert conn.execute("SHOW search_path").fetchone() == ("evil",)
        with pytest.raises(psycopg.OperationalError, match="SASL authentication failed"):
            login(b, SCRAM_ROLE, "evil pw", dbname=EVILDB, options=hostile)
    finally:
        apg.sql(pgsql.SQL("ALTER ROLE {} IN DATABASE {} RESET search_path").format(
            pgsql.Identifier(AUTH), pgsql.Identifier(EVILDB)))
        apg.sql("DROP SCHEMA IF EXISTS evil CASCADE", dbname=EVILDB)


# ---------------------------------------------------------------------------
# other configurations


def test_default_auth_query_with_superuser_auth_user(bouncer, apg, setup):
    """The default auth_query reads pg_authid, which needs a superuser auth_user."""
    b = start(bouncer, apg, setup, ini={"auth_user": SUPER_AUTH, "auth_query": None},
              users=[(SUPER_AUTH, SUPER_PW)])
    assert login(b, MD5_ROLE, MD5_PW)[0] == MD5_ROLE
    assert login(b, SCRAM_ROLE, SCRAM_PW)[0] == SCRAM_ROLE


def test_per_database_auth_user_and_auth_dbname(bouncer, apg, setup):
    """No global auth_user: only the database that names one looks users up,
    and auth_dbname sends the lookup to a database that has the function."""
    databases = {
        APPDB: apg.connstr(APPDB, auth_user=AUTH),
        OTHERDB: apg.connstr(OTHERDB, auth_user=AUTH, auth_dbname=APPDB),
        "plain_other": apg.connstr(OTHERDB),
    }
    b = start(bouncer, apg, setup, ini={"auth_user": None}, databases=databases)
    assert login(b, SCRAM_ROLE, SCRAM_PW)[0] == SCRAM_ROLE
    assert login(b, MD5_ROLE, MD5_PW, dbname=OTHERDB)[0] == MD5_ROLE
    with b.connect(dbname=OTHERDB, user=SCRAM_ROLE, password=SCRAM_PW, autocommit=True) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == (OTHERDB,)
    # without an auth_user the user is unknown there (the secret found for the other
    # databases does not count): the mock md5 exchange
    err = raw_login_error(b, SCRAM_ROLE, SCRAM_PW, database="plain_other")
    assert (err["C"], err["M"]) == ("08P01", "password authentication failed")
    with b.admin(password="pgbouncer") as admin:
        pools = {(r[0], r[1]) for r in admin.execute("SHOW POOLS").fetchall()}
    assert (APPDB, AUTH) in pools and (OTHERDB, AUTH) not in pools


def test_per_database_auth_query(bouncer, apg, setup):
    databases = {APPDB: apg.connstr(APPDB) + " auth_query='SELECT usename, passwd FROM pgbouncer.get_auth($1) "
                                             "WHERE usename <> ''authq_md5'''"}
    b = start(bouncer, apg, setup, ini={"auth_query": "SELECT 'the global one is not used"}, databases=databases)
    assert login(b, SCRAM_ROLE, SCRAM_PW)[0] == SCRAM_ROLE
    err = raw_login_error(b, MD5_ROLE, MD5_PW, database=APPDB)
    assert (err["C"], err["M"]) == ("08P01", "no such user")


def test_concurrent_logins_share_a_small_auth_pool(bouncer, apg, setup):
    """Many clients logging in at once queue for the auth pool's one server."""
    databases = {APPDB: apg.connstr(APPDB, auth_dbname="authdb"), "authdb": apg.connstr(APPDB, pool_size=1)}
    b = start(bouncer, apg, setup, databases=databases)
    n = 12
    results, errors = [], []
    barrier = threading.Barrier(n)

    def one(i):
        role, pw = (SCRAM_ROLE, SCRAM_PW) if i % 2 else (MD5_ROLE, MD5_PW)
        try:
            barrier.wait(timeout=DEADLINE)
            results.append(login(b, role, pw)[0])
        except Exception as e:  # reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=DEADLINE)
    assert not errors, errors
    assert sorted(results) == sorted([SCRAM_ROLE, MD5_ROLE] * (n // 2))
    # one server ran every lookup
    opened = re.findall(rf"authdb/{AUTH}@\S+ new connection to server", b.log_text())
    assert len(opened) == 1, opened
    with b.admin(password="pgbouncer") as admin:
        rows = [r for r in admin.execute("SHOW SERVERS").fetchall()]
    assert sum(1 for r in rows if r[1] == AUTH) == 1


def test_client_gone_during_lookup_disturbs_nobody(bouncer, apg, setup):
    """A client that leaves while its lookup runs (a slow auth_query) or
    waits (its auth pool paused) costs nothing: the lookup finishes or is
    dropped, and the auth_user's server stays in its pool."""
    slow = "SELECT usename, passwd FROM pgbouncer.get_auth($1) CROSS JOIN (SELECT pg_sleep(0.5)) s"
    databases = {APPDB: apg.connstr(APPDB, auth_dbname="authdb"), "authdb": apg.connstr(APPDB)}
    b = start(bouncer, apg, setup, ini={"auth_query": slow, "client_login_timeout": 1}, databases=databases)
    assert login(b, SCRAM_ROLE, SCRAM_PW)[0] == SCRAM_ROLE

    w = PgWire(b.port)
    w.startup(user=MD5_ROLE, database=APPDB)
    w.close()
    assert login(b, SCRAM_ROLE, SCRAM_PW)[0] == SCRAM_ROLE

    with b.admin(password="pgbouncer") as admin:
        admin.execute("PAUSE authdb")
        w = PgWire(b.port)
        w.startup(user=MD5_ROLE, database=APPDB)
        w.expect_fatal("client_login_timeout")
        admin.execute("RESUME authdb")
        assert login(b, MD5_ROLE, MD5_PW)[0] == MD5_ROLE
        servers = [r for r in admin.execute("SHOW SERVERS").fetchall() if r[1] == AUTH]
    assert [(r[2], r[4]) for r in servers] == [("authdb", "idle")]


@pytest.mark.parametrize("auth_type", ["plain", "scram-sha-256"])
def test_lookup_may_return_a_password_of_65535_bytes(bouncer, apg, setup, auth_type):
    """As long as the auth_file allows and a client may send; one byte more is refused."""
    role = "authq_long_pw"
    long_pw = ("0123456789abcdef" * 4096)[:65535]
    apg.create_role(role, password=long_pw)
    try:
        query = "SELECT $1::text, left(repeat('0123456789abcdef', 4097), {})"
        b = start(bouncer, apg, setup, auth_type=auth_type, ini={"auth_query": query.format(65535)})
        assert login(b, role, long_pw)[0] == role
        err = raw_login_error(b, role, long_pw[:-1] + "x", database=APPDB)
        assert err["C"] == "08P01" and err["M"] in ("password authentication failed", "SASL authentication failed")

        b = start(bouncer, apg, setup, auth_type=auth_type, ini={"auth_query": query.format(65536)})
        err = raw_login_error(b, role, long_pw, database=APPDB)
        assert (err["C"], err["M"]) == ("08P01", "bouncer config error")
        b.wait_log(r"auth_query returned a password of 65536 bytes \(at most 65535 are allowed\)")
    finally:
        apg.sql(pgsql.SQL("DROP ROLE IF EXISTS {}").format(pgsql.Identifier(role)))


def auth_request_code(w):
    import struct
    m = w.read_msg()
    assert m and m[0] == b"R", m
    return struct.unpack("!I", m[1][:4])[0]


def test_a_secret_found_for_one_database_never_opens_another(bouncer, pg):
    """Two databases whose lookups give rv_bob different secrets (as two
    clusters would; here auth_query per database says so). A login to dbB
    that another login's lookup for dbA overtakes is still checked against
    dbB's secret, and the lookups of one database never change what the
    other's logins and servers use. Before, the user had one secret per
    worker: the last lookup set it, and dbA's password opened dbB."""
    from pgwire import message
    pg.create_role("rv_bob", password="whatever")
    q = "auth_query='SELECT $1::text, ''{}''::text'"
    b = bouncer(ini_overrides={"auth_type": "plain", "auth_user": "postgres", "max_workers": 1},
                databases={"dbA": pg.connstr("postgres") + " " + q.format("secretA"),
                           "dbB": pg.connstr("postgres") + " " + q.format("secretB")},
                users_txt='"postgres" "postgres"\n"pgbouncer" "pgbouncer"\n')
    c1 = PgWire(b.port)
    c1.startup(user="rv_bob", database="dbB")
    assert auth_request_code(c1) == 3  # dbB's lookup is done: the password is asked for
    c2 = PgWire(b.port)
    c2.startup(user="rv_bob", database="dbA")
    assert auth_request_code(c2) == 3  # dbA's lookup, after it
    c1.send(message(b"p", b"secretA\0"))
    c1.expect_fatal("password authentication failed")
    c2.send(message(b"p", b"secretA\0"))
    assert c2.read_msg()[0] == b"R"
    c2.close()
    c1.close()
    # each database's own secret logs in, in either order
    for db, pw in (("dbB", "secretB"), ("dbA", "secretA"), ("dbB", "secretB")):
        w = PgWire(b.port)
        w.startup(user="rv_bob", database=db)
        assert auth_request_code(w) == 3
        w.send(message(b"p", pw.encode() + b"\0"))
        assert w.read_msg()[0] == b"R", (db, pw)
        w.close()
    with b.admin(password="pgbouncer") as admin:
        names = [r[0] for r in admin.execute("SHOW USERS").fetchall()]
    assert names.count("rv_bob") == 1, names


def test_a_verifier_with_too_many_iterations_is_refused_at_once(bouncer, pg):
    """A role stores a SCRAM verifier with 3 million iterations itself
    (ALTER ROLE needs no privilege for one's own password). Checking a
    plain password against it would run PBKDF2 for seconds on the worker's
    event loop, stalling every client there; the pooler refuses it above
    the bound servers get (doc/auth_query.md) and says why in the log, and
    other clients go on."""
    import base64
    import os as _os
    pg.create_role("rv_slow", password="x")
    b64 = lambda n: base64.b64encode(_os.urandom(n)).decode()  # noqa: E731
    verifier = f"SCRAM-SHA-256$3000000:{b64(16)}${b64(32)}:{b64(32)}"
    with pg.connect(user="rv_slow", password="x") as conn:
        conn.execute(f"ALTER ROLE rv_slow PASSWORD '{verifier}'")
    b = bouncer(ini_overrides={"auth_type": "plain", "auth_user": "postgres", "max_workers": 1},
                users_txt='"postgres" "postgres"\n"pgbouncer" "pgbouncer"\n')
    with b.connect(user="postgres", password="postgres", autocommit=True) as bystander:
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            b.connect(user="rv_slow", password="anything").close()
        assert bystander.execute("SELECT 1").fetchone() == (1,)
    assert "its SCRAM secret asks for 3000000 iterations" in b.log_text()
