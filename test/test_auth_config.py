"""Authentication settings the pooler cannot honour are refused when the
configuration is loaded (spec/config.md: `ldap` and `pam` exist only in
builds with that support), at start, on RELOAD and with the console's SET,
instead of being accepted and then failing every login.

auth_dbname (doc/pgbouncer.5.md): a name that is not configured, or the
admin console's `pgbouncer`, fails the logins that need auth_query with
`bouncer config error` (a database entry's own auth_dbname first); a global
`auth_dbname = pgbouncer` is not loaded at all. These run against PgBouncer
1.25.2 too (either_bin), which does the same.
"""

import pytest

from helpers import build_has_pam, console, expect_error, raw_login_error, row
from ldapfixture import build_has_ldap


@pytest.fixture
def unsupported(pgbouncer_bin, method):
    """Only in a build without libpam or libldap (test_pam.py and test_ldap.py test the others)."""
    if method == "pam" and build_has_pam(pgbouncer_bin):
        pytest.skip("this build has PAM: test_pam.py covers auth_type = pam")
    if method == "ldap" and build_has_ldap(pgbouncer_bin):
        pytest.skip("this build has LDAP: test_ldap.py covers auth_type = ldap")



@pytest.mark.parametrize("method", ["pam", "ldap"])
def test_unsupported_auth_type_refused_at_start(bouncer, run_pgbouncer, method, unsupported):
    b = bouncer(ini_overrides={"auth_type": method}, start=False)
    run = run_pgbouncer([b.ini_path])
    seen = run.stdout + run.stderr + b.log_text()
    assert run.rc == 1, seen
    assert f"{b.ini_path}:{b.line_of('auth_type')}" in seen, seen
    assert f'auth_type "{method}" is not supported by this build (built without lib{method}' in seen, seen
    assert "cannot load config file" in seen, seen


@pytest.mark.parametrize("method", ["pam", "ldap"])
def test_unsupported_auth_type_refused_on_reload_and_set(bouncer, method, unsupported):
    b = bouncer(ini_overrides={"auth_type": "trust"})
    conn = console(b)
    b.update(auth_type=method)
    b.write_ini()
    expect_error(conn, "RELOAD", "RELOAD failed, see logs for additional details", sqlstate="F0000")
    b.wait_log(rf'auth_type "{method}" is not supported by this build')
    mark = b.log_mark()
    expect_error(conn, f"SET auth_type = '{method}'", "SET failed")
    b.wait_log(rf'auth_type "{method}" is not supported by this build', after=mark)
    assert row(conn, "SHOW CONFIG", key="auth_type")["value"] == "trust"
    # logins go on with the old setting
    with b.connect(autocommit=True) as c:
        assert c.execute("SELECT 1").fetchone() == (1,)


# ---------------------------------------------------------------------------
# auth_dbname

AUTHDB_ROLE, AUTHDB_PW = "authdb_role", "authdb pw"  # known to PostgreSQL only: logins need auth_query


def authdb_pooler(bouncer, pg, either_bin, ini=None, databases=None, start=True):
    """A pooler (ours or PgBouncer 1.25.2) that looks AUTHDB_ROLE up with
    auth_query as the superuser `postgres` (trusted by the test cluster)."""
    pg.create_role(AUTHDB_ROLE, password=AUTHDB_PW)
    settings = {"auth_type": "scram-sha-256", "auth_user": "postgres",
                "auth_query": "SELECT usename, passwd FROM pg_shadow WHERE usename = $1"}
    settings.update(ini or {})
    return bouncer(ini_overrides=settings, databases=databases, binary=either_bin, start=start)


def authdb_login(b, dbname):
    with b.connect(dbname=dbname, user=AUTHDB_ROLE, password=AUTHDB_PW, autocommit=True) as conn:
        return conn.execute("SELECT current_user").fetchone()[0]


def test_auth_dbname_not_configured(bouncer, pg, either_bin):
    """A global auth_dbname that names no database entry fails the login
    that needs a lookup; a database entry's own auth_dbname wins over it."""
    b = authdb_pooler(bouncer, pg, either_bin, ini={"auth_dbname": "authdb_nosuch"}, databases={
        "postgres": pg.connstr("postgres"),
        "own_authdb": pg.connstr("postgres", auth_dbname="postgres"),
    })
    mark = b.log_mark()
    err = raw_login_error(b, AUTHDB_ROLE, AUTHDB_PW, database="postgres")
    assert (err["C"], err["M"]) == ("08P01", "bouncer config error")
    b.wait_log(r'authentication database "authdb_nosuch" is not configured\.', after=mark)
    assert authdb_login(b, "own_authdb") == AUTHDB_ROLE
    assert b.alive()


def test_auth_dbname_pgbouncer_on_entries(bouncer, pg, either_bin):
    """auth_dbname = pgbouncer on a database entry, `*` among them, fails
    those entries' logins (each logged) and nothing else."""
    b = authdb_pooler(bouncer, pg, either_bin, databases={
        "postgres": pg.connstr("postgres"),
        "console_authdb": pg.connstr("postgres", auth_dbname="pgbouncer"),
        "*": pg.connstr("postgres", auth_dbname="pgbouncer"),
    })
    mark = b.log_mark()
    for dbname in ("console_authdb", "console_authdb", "authdb_auto"):
        err = raw_login_error(b, AUTHDB_ROLE, AUTHDB_PW, database=dbname)
        assert (err["C"], err["M"]) == ("08P01", "bouncer config error"), dbname
    line = 'cannot use the reserved "pgbouncer" database as an auth_dbname'
    b.wait_log("(?s)" + (line + ".*") * 2 + line, after=mark)
    assert authdb_login(b, "postgres") == AUTHDB_ROLE
    assert b.alive()


def test_auth_dbname_pgbouncer_global_refused(bouncer, run_pgbouncer, pg, either_bin):
    """A global auth_dbname = pgbouncer is not loaded: at start the pooler
    exits, a RELOAD keeps the running value, SET fails."""
    line = 'cannot use the reserved "pgbouncer" database as an auth_dbname'
    b = authdb_pooler(bouncer, pg, either_bin, ini={"auth_dbname": "pgbouncer"}, start=False)
    run = run_pgbouncer([b.ini_path], binary=either_bin)
    seen = run.stdout + run.stderr + b.log_text()
    assert run.rc == 1, seen
    assert line in seen and "cannot load config file" in seen, seen

    b.update(auth_dbname="postgres")
    b.write_ini()
    b.start()
    conn = console(b, password="pgbouncer")
    b.update(auth_dbname="pgbouncer")
    b.write_ini()
    mark = b.log_mark()
    expect_error(conn, "RELOAD", "RELOAD failed, see logs for additional details", sqlstate="F0000")
    b.wait_log(line, after=mark)
    mark = b.log_mark()
    expect_error(conn, "SET auth_dbname = 'pgbouncer'", "SET failed")
    b.wait_log(line, after=mark)
    assert row(conn, "SHOW CONFIG", key="auth_dbname")["value"] == "postgres"
    assert authdb_login(b, "postgres") == AUTHDB_ROLE
