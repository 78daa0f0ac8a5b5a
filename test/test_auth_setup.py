"""pgbouncer-auth-setup, the auth_query bootstrap (DESIGN.md §1): the role,
schema, SECURITY DEFINER lookup function and grants it makes, what the lookup
returns to whom, the printed settings, re-runs, and --check naming each
missing piece with the statement that fixes it.

The tool is a libpq client; it runs against the session's PostgreSQL in
databases and with roles of this module's own (unique names, dropped at the end).
"""

import base64
import hashlib
import hmac
import os
import re
import secrets
import subprocess
from pathlib import Path

import psycopg
import pytest
from psycopg import sql as pgsql

from conftest import DEADLINE, REPO, Run, child_env, free_port

PASSWORD = "auth pw 'quoted' \"too\""
APP_PASSWORD = "app secret"


def tool_path():
    """pgbouncer-auth-setup sits next to the pgbouncer binary under test."""
    pgbouncer = Path(os.environ.get("PGBOUNCER_BIN", REPO / "build" / "pgbouncer")).resolve()
    path = pgbouncer.parent / "pgbouncer-auth-setup"
    if not path.is_file():
        pytest.fail(f"{path} not found: build it (make -C build)", pytrace=False)
    return path


def scram_matches(secret, password):
    """True when a SCRAM-SHA-256 verifier was made from this (ASCII) password."""
    m = re.fullmatch(r"SCRAM-SHA-256\$(\d+):([^$]+)\$([^:]+):(.+)", secret)
    assert m, f"not a SCRAM secret: {secret!r}"
    iterations, salt = int(m[1]), base64.b64decode(m[2])
    stored_key, server_key = base64.b64decode(m[3]), base64.b64decode(m[4])
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    return (hashlib.sha256(client_key).digest() == stored_key
            and hmac.new(salted, b"Server Key", "sha256").digest() == server_key)


def setting(stdout, key):
    """The value of `key = value` in the printed block."""
    m = re.search(rf"^{re.escape(key)} = (.*)$", stdout, re.MULTILINE)
    assert m, f"no '{key} = ...' line in:\n{stdout}"
    return m[1]


def userlist_lines(stdout):
    return [line for line in stdout.splitlines() if line.startswith('"')]


def fixes(stdout):
    """The statements after 'fix:' in --check output (continuation lines joined)."""
    found, current = [], None
    for line in stdout.splitlines():
        if line.startswith("           fix: "):
            current = [line[len("           fix: "):]]
            found.append(current)
        elif current is not None and line.startswith(" " * 16):
            current.append(line[16:])
        else:
            current = None
    return ["\n".join(lines) for lines in found]


class Env:
    """This module's databases and roles, and a runner for the tool."""

    def __init__(self, pg):
        self.pg = pg
        tag = secrets.token_hex(4)
        self.db = f"auth_setup_{tag}"
        self.db2 = f"auth_setup2_{tag}"
        self.auth = f"pgb_auth_{tag}"
        self.app = f"app_{tag}"
        self.superuser = f"super_{tag}"
        self.nologin = f"nologin_{tag}"
        self.expired = f"expired_{tag}"
        self.other = f"other_{tag}"
        self.nosuper = f"nosuper_{tag}"
        self.roles = [self.auth, self.app, self.superuser, self.nologin, self.expired, self.other, self.nosuper]
        self.tool = tool_path()

    def create(self):
        for db in (self.db, self.db2):
            self.pg.sql(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(db)))
        self.pg.create_role(self.app, password=APP_PASSWORD)
        self.pg.create_role(self.superuser, password="super secret", superuser=True)
        self.pg.create_role(self.other, password="other secret")
        self.pg.create_role(self.nosuper, password="nosuper secret")
        self.pg.sql(pgsql.SQL("CREATE ROLE {} NOLOGIN PASSWORD 'nologin secret'").format(
            pgsql.Identifier(self.nologin)))
        self.pg.sql(pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD 'expired secret' VALID UNTIL '2000-01-01'").format(
            pgsql.Identifier(self.expired)))

    def drop(self, extra_roles=()):
        for db in (self.db, self.db2):
            self.pg.sql(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(db)))
        for role in [*self.roles, *extra_roles]:
            self.pg.sql(pgsql.SQL("DROP ROLE IF EXISTS {}").format(pgsql.Identifier(role)))

    def conninfo(self, dbname=None, user="postgres"):
        parts = [f"host={self.pg.host}", f"port={self.pg.port}", f"user={user}", "connect_timeout=10"]
        if dbname:
            parts.append(f"dbname={dbname}")
        return " ".join(parts)

    def run(self, *args):
        out = subprocess.run([str(self.tool), *map(str, args)], env=child_env(), stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=DEADLINE)
        return Run(out.returncode, out.stdout, out.stderr)

    def setup(self, *args):
        """The bootstrap of this module's database as the tests expect it."""
        r = self.run("--user", self.auth, "--password", PASSWORD, *args, self.conninfo(), self.db)
        assert r.rc == 0, f"bootstrap failed ({r.rc}):\n{r.stdout}\n{r.stderr}"
        return r

    def check(self, *args, db=None):
        return self.run("--check", "--user", self.auth, *args, self.conninfo(), db or self.db)

    def sql(self, query, params=None, dbname=None):
        return self.pg.sql(query, params, dbname=dbname or self.db)

    def connect(self, user, dbname=None):
        return self.pg.connect(dbname=dbname or self.db, user=user)

    def secret(self, role):
        return self.pg.sql("SELECT rolpassword FROM pg_authid WHERE rolname = %s", [role])[0][0]


@pytest.fixture(scope="module")
def env(pg):
    e = Env(pg)
    e.drop()
    e.create()
    extra = []
    e.extra_roles = extra  # tests that make roles of their own register them here
    try:
        yield e
    finally:
        e.drop(extra)


@pytest.fixture
def ready(env):
    """Every test starts from a complete set-up (re-running it is harmless)."""
    env.setup()
    return env


def lookup(env, user, query, *, search_path=None):
    """A connection as `user` and a function that runs the printed auth_query
    (with its $1) for a login name, as pgbouncer would."""
    conn = env.connect(user)

    def run(name):
        return conn.execute(query.replace("$1", "%s"), [name]).fetchall()

    if search_path:
        conn.execute(f"SET search_path = {search_path}")
    return conn, run


# ---------------------------------------------------------------------------
# the bootstrap


def test_bootstrap_creates_role_schema_function_and_prints_settings(env):
    r = env.setup()
    assert setting(r.stdout, "auth_user") == env.auth
    assert setting(r.stdout, "auth_query") == "SELECT usename, passwd FROM pgbouncer.get_auth($1)"
    quoted_pw = PASSWORD.replace('"', '""')
    assert userlist_lines(r.stdout) == [f'"{env.auth}" "{quoted_pw}"']
    assert "0600" in r.stdout

    (login, superuser), = env.pg.sql("SELECT rolcanlogin, rolsuper FROM pg_roles WHERE rolname = %s", [env.auth])
    assert login and not superuser
    # the server got a SCRAM secret computed client-side, and it matches the printed password
    assert scram_matches(env.secret(env.auth), PASSWORD)

    assert env.sql("SELECT 1 FROM pg_namespace WHERE nspname = 'pgbouncer'") == [(1,)]
    (secdef, config, volatile, result, owner_super), = env.sql(
        "SELECT p.prosecdef, p.proconfig, p.provolatile, pg_get_function_result(p.oid), o.rolsuper"
        "  FROM pg_proc p JOIN pg_roles o ON o.oid = p.proowner"
        " WHERE p.oid = to_regprocedure('pgbouncer.get_auth(text)')")
    assert secdef and owner_super and volatile == "s"
    assert config == ["search_path=pg_catalog, pg_temp"]
    assert result == "TABLE(usename name, passwd text)"
    (usage, execute, create), = env.sql(
        "SELECT has_schema_privilege(%s, 'pgbouncer', 'USAGE'),"
        "       has_function_privilege(%s, 'pgbouncer.get_auth(text)', 'EXECUTE'),"
        "       has_schema_privilege(%s, 'pgbouncer', 'CREATE')", [env.auth] * 3)
    assert usage and execute and not create


def test_lookup_returns_secrets_of_login_roles_only(ready):
    env = ready
    query = setting(env.setup().stdout, "auth_query")
    conn, run = lookup(env, env.auth, query)
    with conn:
        assert run(env.app) == [(env.app, env.secret(env.app))]
        assert env.secret(env.app).startswith("SCRAM-SHA-256$")
        assert run(env.superuser) == [], "a superuser's secret must never be returned"
        assert run(env.auth) == [], "the auth_user's own secret must never be returned"
        assert run(env.nologin) == [], "a NOLOGIN role's secret must not be returned"
        assert run("no_such_role_" + env.app) == []
        # like the default auth_query: an expired password reads as NULL
        assert run(env.expired) == [(env.expired, None)]
        # names are compared in full, not truncated to 63 bytes
        assert run(env.app + "x" * 80) == []


def test_public_cannot_call_the_lookup(ready):
    env = ready
    with env.connect(env.other) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for schema pgbouncer"):
            conn.execute("SELECT * FROM pgbouncer.get_auth(%s)", [env.app])
    # even with USAGE on the schema, the function itself is not PUBLIC's
    env.sql(pgsql.SQL("GRANT USAGE ON SCHEMA pgbouncer TO {}").format(pgsql.Identifier(env.other)))
    try:
        with env.connect(env.other) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege,
                               match="permission denied for function get_auth"):
                conn.execute("SELECT * FROM pgbouncer.get_auth(%s)", [env.app])
    finally:
        env.sql(pgsql.SQL("REVOKE USAGE ON SCHEMA pgbouncer FROM {}").format(pgsql.Identifier(env.other)))


def test_printed_query_ignores_a_hostile_search_path(ready):
    """A same-named function and an always-true '=' in a schema the caller
    puts first change neither which function the printed auth_query calls
    nor how the lookup compares names."""
    env = ready
    query = setting(env.setup().stdout, "auth_query")
    auth = pgsql.Identifier(env.auth)
    env.sql("CREATE SCHEMA evil")
    try:
        env.sql("CREATE FUNCTION evil.get_auth(p text) RETURNS TABLE (usename name, passwd text)"
                " LANGUAGE sql AS $$ SELECT p::name, 'evil secret'::text $$")
        env.sql("CREATE FUNCTION evil.always(name, text) RETURNS bool LANGUAGE sql AS 'SELECT true'")
        env.sql("CREATE OPERATOR evil.= (LEFTARG = name, RIGHTARG = text, FUNCTION = evil.always)")
        env.sql(pgsql.SQL("GRANT USAGE ON SCHEMA evil TO {}").format(auth))
        env.sql(pgsql.SQL("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA evil TO {}").format(auth))
        conn, run = lookup(env, env.auth, query, search_path="evil, pg_catalog, public")
        with conn:
            # the trap works: an unqualified call lands in evil
            assert conn.execute("SELECT * FROM get_auth(%s)", [env.app]).fetchall() == [(env.app, "evil secret")]
            assert run(env.app) == [(env.app, env.secret(env.app))]

        # and it is the fixed search_path of the function that keeps evil.= out
        with env.connect("postgres") as conn:
            conn.autocommit = False
            conn.execute("ALTER FUNCTION pgbouncer.get_auth(text) RESET search_path")
            conn.execute(pgsql.SQL("SET LOCAL ROLE {}").format(auth))
            conn.execute("SET LOCAL search_path = evil, pg_catalog")
            rows = conn.execute(query.replace("$1", "%s"), [env.app]).fetchall()
            conn.rollback()
        assert len(rows) > 1, "without the pinned search_path the hostile operator should have matched every row"
    finally:
        env.sql("DROP SCHEMA evil CASCADE")


def test_rerun_changes_nothing(ready):
    env = ready

    def state():
        return env.sql(
            "SELECT p.oid, p.proacl::text, p.prosrc, n.nspacl::text, a.rolpassword"
            "  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace, pg_authid a"
            " WHERE p.oid = to_regprocedure('pgbouncer.get_auth(text)') AND a.rolname = %s", [env.auth])

    before = state()
    r = env.run("--user", env.auth, env.conninfo(), env.db)
    assert r.rc == 0, r.stderr
    assert state() == before
    assert "its password was not changed" in r.stderr
    assert "up to date" in r.stderr
    # no password known: a placeholder the user must replace, and the same settings
    assert userlist_lines(r.stdout) == [f'"{env.auth}" "<current password of {env.auth}>"']
    assert setting(r.stdout, "auth_query") == "SELECT usename, passwd FROM pgbouncer.get_auth($1)"

    # with the same password, the printed block is the same each time
    assert env.setup().stdout == env.setup().stdout
    assert scram_matches(env.secret(env.auth), PASSWORD)


OLDER_FUNCTIONS = {
    # the hand-made function of many older guides: other result columns
    "other columns": "CREATE FUNCTION pgbouncer.get_auth(p_usename text)"
                     " RETURNS TABLE (username text, password text) LANGUAGE plpgsql SECURITY DEFINER AS $$"
                     " BEGIN RETURN QUERY SELECT usename::text, passwd::text FROM pg_catalog.pg_shadow"
                     " WHERE usename = p_usename; END $$",
    "other parameter name": "CREATE FUNCTION pgbouncer.get_auth(i_username text)"
                            " RETURNS TABLE (usename name, passwd text) LANGUAGE sql SECURITY DEFINER"
                            " AS $$ SELECT usename, passwd::text FROM pg_catalog.pg_shadow"
                            " WHERE usename = i_username $$",
}


@pytest.mark.parametrize("older", OLDER_FUNCTIONS)
def test_bootstrap_replaces_an_older_function_that_differs_in_its_signature(ready, older):
    """CREATE OR REPLACE cannot change a function's result columns or
    parameter names: over an older hand-made get_auth(text) the bootstrap
    drops it first, and grants afresh."""
    env = ready
    env.sql("DROP FUNCTION pgbouncer.get_auth(text)")
    env.sql(OLDER_FUNCTIONS[older])
    env.sql(pgsql.SQL("GRANT EXECUTE ON FUNCTION pgbouncer.get_auth(text) TO {}").format(pgsql.Identifier(env.auth)))
    try:
        r = env.run("--user", env.auth, "--password", PASSWORD, env.conninfo(), env.db)
        assert r.rc == 0, r.stderr
        assert "function pgbouncer.get_auth(text) replaced" in r.stderr
        r = env.check()
        assert r.rc == 0, r.stdout
        assert env.sql("SELECT has_function_privilege(%s, 'pgbouncer.get_auth(text)', 'EXECUTE')",
                       [env.other]) == [(False,)]
    finally:
        env.sql("DROP FUNCTION pgbouncer.get_auth(text)")  # the next set-up makes it anew


def test_generated_password_for_a_new_role_in_the_conninfo_database(env):
    auth2 = env.auth + "_gen"
    env.extra_roles.append(auth2)
    # no DBNAME: the database named in CONNINFO is prepared
    r = env.run("--user", auth2, env.conninfo(env.db2))
    assert r.rc == 0, r.stderr
    assert "generated password" in r.stderr
    (line,) = userlist_lines(r.stdout)
    m = re.fullmatch(rf'"{auth2}" "([A-Za-z0-9_-]{{32}})"', line)
    assert m, line
    assert scram_matches(env.secret(auth2), m[1])
    assert env.sql("SELECT to_regprocedure('pgbouncer.get_auth(text)') IS NOT NULL", dbname=env.db2) == [(True,)]

    # a second run keeps the password it generated
    secret = env.secret(auth2)
    r = env.run("--user", auth2, env.conninfo(env.db2))
    assert r.rc == 0, r.stderr
    assert env.secret(auth2) == secret
    assert m[1] not in r.stdout


def test_password_from_a_file_sets_a_new_password(ready, tmp_path):
    env = ready
    pwfile = tmp_path / "pw"
    pwfile.write_text("from a file\nignored second line\n")
    try:
        r = env.run("--user", env.auth, "--password-file", pwfile, env.conninfo(), env.db)
        assert r.rc == 0, r.stderr
        assert "its password was set to the one given" in r.stderr
        assert userlist_lines(r.stdout) == [f'"{env.auth}" "from a file"']
        assert scram_matches(env.secret(env.auth), "from a file")
    finally:
        env.setup()  # back to PASSWORD


def test_odd_names_are_quoted(env):
    user = f'pgb "odd" {env.auth}'
    env.extra_roles.append(user)
    r = env.run("--user", user, "--password", "pw", "--schema", "Auth Schema", "--function", "select",
                env.conninfo(), env.db2)
    assert r.rc == 0, r.stderr
    assert setting(r.stdout, "auth_user") == user
    query = setting(r.stdout, "auth_query")
    assert query == 'SELECT usename, passwd FROM "Auth Schema"."select"($1)'
    assert userlist_lines(r.stdout) == ['"pgb ""odd"" {}" "pw"'.format(env.auth)]
    with env.connect(user, dbname=env.db2) as conn:
        query = query.replace("$1", "%s")
        assert conn.execute(query, [env.app]).fetchall() == [(env.app, env.secret(env.app))]
        assert conn.execute(query, [user]).fetchall() == []
    r = env.run("--check", "--user", user, "--schema", "Auth Schema", "--function", "select",
                env.conninfo(), env.db2)
    assert r.rc == 0, r.stdout


def test_bootstrap_reports_what_it_leaves_alone(ready):
    """Another role's EXECUTE grant is not the tool's to remove: it says so,
    with the fix, and exits 1."""
    env = ready
    grant = pgsql.SQL("GRANT EXECUTE ON FUNCTION pgbouncer.get_auth(text) TO {}").format(
        pgsql.Identifier(env.other))
    env.sql(grant)
    try:
        r = env.run("--user", env.auth, "--password", PASSWORD, env.conninfo(), env.db)
        assert r.rc == 1, r.stderr
        assert f'database "{env.db}": 1 problem(s) left' in r.stderr
        assert f"fix: REVOKE EXECUTE ON FUNCTION pgbouncer.get_auth(text) FROM {env.other};" in r.stderr
        assert setting(r.stdout, "auth_user") == env.auth  # the settings are printed all the same
        assert env.sql("SELECT has_function_privilege(%s, 'pgbouncer.get_auth(text)', 'EXECUTE')",
                       [env.other]) == [(True,)]
    finally:
        env.sql(pgsql.SQL("REVOKE EXECUTE ON FUNCTION pgbouncer.get_auth(text) FROM {}").format(
            pgsql.Identifier(env.other)))


def test_bootstrap_refuses_a_schema_owned_by_a_non_superuser(env):
    schema = "owned_" + env.other
    env.sql(pgsql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(pgsql.Identifier(schema),
                                                                  pgsql.Identifier(env.other)), dbname=env.db2)
    try:
        r = env.run("--user", env.auth, "--password", PASSWORD, "--schema", schema, env.conninfo(), env.db2)
        assert r.rc == 1
        assert f"schema {schema} belongs to {env.other}, who is not a superuser" in r.stderr
        assert f"ALTER SCHEMA {schema} OWNER TO postgres;" in r.stderr
        assert env.sql("SELECT to_regprocedure(%s)::text", [f"{schema}.get_auth(text)"], dbname=env.db2) == [(None,)]
    finally:
        env.sql(pgsql.SQL("DROP SCHEMA {} CASCADE").format(pgsql.Identifier(schema)), dbname=env.db2)


def test_bootstrap_refuses_a_superuser_as_auth_user(env):
    r = env.run("--user", env.superuser, env.conninfo(), env.db2)
    assert r.rc == 1
    assert f"role {env.superuser} is a superuser" in r.stderr
    assert r.stdout == ""
    (superuser,), = env.pg.sql("SELECT rolsuper FROM pg_roles WHERE rolname = %s", [env.superuser])
    assert superuser


@pytest.mark.parametrize("attributes, password, fix", [
    ("LOGIN PASSWORD 'old' VALID UNTIL '2000-01-01'", ["--password", "new pw"], "VALID UNTIL 'infinity';"),
    ("LOGIN", [], "\\password"),
    ("LOGIN PASSWORD 'old' CONNECTION LIMIT 0", [], "CONNECTION LIMIT -1;"),
], ids=["expired", "no password", "connection limit 0"])
def test_bootstrap_of_an_existing_role_that_cannot_log_in_exits_1(env, attributes, password, fix):
    """An existing auth_user whose password expired (a new one does not
    change VALID UNTIL) or that has none cannot log in to PostgreSQL, so
    pgbouncer cannot run auth_query: the set-up is not complete."""
    user = f"{env.auth}_{len(attributes)}"
    schema = "pgbouncer_" + user
    env.extra_roles.append(user)
    env.pg.sql(pgsql.SQL("CREATE ROLE {} " + attributes).format(pgsql.Identifier(user)))
    try:
        r = env.run("--user", user, *password, "--schema", schema, env.conninfo(), env.db2)
        assert r.rc == 1, r.stderr
        assert f"role {user}: 1 problem(s) left" in r.stderr, r.stderr
        assert fix in r.stderr, r.stderr
        assert setting(r.stdout, "auth_user") == user  # the settings are printed all the same
    finally:
        env.sql(pgsql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(pgsql.Identifier(schema)), dbname=env.db2)
        env.sql(pgsql.SQL("REVOKE ALL ON DATABASE {} FROM {}").format(pgsql.Identifier(env.db2),
                                                                      pgsql.Identifier(user)), dbname=env.db2)
        env.pg.sql(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(user)))


# ---------------------------------------------------------------------------
# --check


def test_check_names_a_connection_limit_of_zero(ready):
    """PostgreSQL refuses every login of a role with CONNECTION LIMIT 0
    ("too many connections for role"), the auth_user's too."""
    env = ready
    env.pg.sql(pgsql.SQL("ALTER ROLE {} CONNECTION LIMIT 0").format(pgsql.Identifier(env.auth)))
    try:
        r = env.check()
        assert r.rc == 1, r.stdout
        assert fixes(r.stdout) == [f"ALTER ROLE {env.auth} CONNECTION LIMIT -1;"], r.stdout
    finally:
        env.pg.sql(pgsql.SQL("ALTER ROLE {} CONNECTION LIMIT -1").format(pgsql.Identifier(env.auth)))


def test_check_names_a_member_of_the_auth_user(ready):
    """A member of the auth_user role has its EXECUTE grant (and may SET
    ROLE to it): it can read every login role's secret."""
    env = ready
    names = (pgsql.Identifier(env.auth), pgsql.Identifier(env.other))
    env.pg.sql(pgsql.SQL("GRANT {} TO {}").format(*names))
    try:
        with env.connect(env.other) as conn:
            assert conn.execute("SELECT * FROM pgbouncer.get_auth(%s)", [env.app]).fetchall() != []
        r = env.check()
        assert r.rc == 1, r.stdout
        assert fixes(r.stdout) == [f"REVOKE {env.auth} FROM {env.other};"], r.stdout
        r = env.run("--user", env.auth, "--password", PASSWORD, env.conninfo(), env.db)
        assert r.rc == 1, r.stderr
        assert f"REVOKE {env.auth} FROM {env.other};" in r.stderr
    finally:
        env.pg.sql(pgsql.SQL("REVOKE {} FROM {}").format(*names))


def test_check_passes_on_a_complete_setup(ready):
    env = ready
    r = env.check()
    assert r.rc == 0, r.stdout + r.stderr
    assert "MISSING" not in r.stdout
    assert re.search(r"^all \d+ checks OK$", r.stdout, re.MULTILINE), r.stdout
    assert f"  OK       USAGE on schema pgbouncer for {env.auth}" in r.stdout


def test_check_names_the_missing_usage_grant_and_bootstrap_fixes_it(ready):
    env = ready
    env.sql(pgsql.SQL("REVOKE USAGE ON SCHEMA pgbouncer FROM {}").format(pgsql.Identifier(env.auth)))
    r = env.check()
    assert r.rc == 1, r.stdout
    lines = r.stdout.splitlines()
    i = lines.index(f"  MISSING  USAGE on schema pgbouncer for {env.auth}")
    assert lines[i + 1] == f"           fix: GRANT USAGE ON SCHEMA pgbouncer TO {env.auth};"
    assert fixes(r.stdout) == [f"GRANT USAGE ON SCHEMA pgbouncer TO {env.auth};"]
    assert re.search(r"^1 of \d+ checks MISSING", r.stdout, re.MULTILINE), r.stdout
    # the auth_user really is stuck without it
    with env.connect(env.auth) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for schema"):
            conn.execute("SELECT * FROM pgbouncer.get_auth(%s)", [env.app])

    env.setup()
    r = env.check()
    assert r.rc == 0, r.stdout


BREAKAGES = {
    "execute revoked": ("REVOKE EXECUTE ON FUNCTION pgbouncer.get_auth(text) FROM {auth}",
                        "GRANT EXECUTE ON FUNCTION pgbouncer.get_auth(text) TO {auth};"),
    "execute for public": ("GRANT EXECUTE ON FUNCTION pgbouncer.get_auth(text) TO PUBLIC",
                           "REVOKE ALL ON FUNCTION pgbouncer.get_auth(text) FROM PUBLIC;"),
    "execute for another role": ("GRANT EXECUTE ON FUNCTION pgbouncer.get_auth(text) TO {other}",
                                 "REVOKE EXECUTE ON FUNCTION pgbouncer.get_auth(text) FROM {other};"),
    "search_path reset": ("ALTER FUNCTION pgbouncer.get_auth(text) RESET search_path",
                          "ALTER FUNCTION pgbouncer.get_auth(text) SET search_path = pg_catalog, pg_temp;"),
    "security invoker": ("ALTER FUNCTION pgbouncer.get_auth(text) SECURITY INVOKER",
                         "ALTER FUNCTION pgbouncer.get_auth(text) SECURITY DEFINER;"),
    "owner not superuser": ("ALTER FUNCTION pgbouncer.get_auth(text) OWNER TO {other}",
                            "ALTER FUNCTION pgbouncer.get_auth(text) OWNER TO postgres;"),
    "create on schema": ("GRANT CREATE ON SCHEMA pgbouncer TO PUBLIC",
                         "REVOKE CREATE ON SCHEMA pgbouncer FROM PUBLIC;"),
    "overload": ("CREATE FUNCTION pgbouncer.get_auth(varchar) RETURNS int LANGUAGE sql AS 'SELECT 1'",
                 "DROP FUNCTION pgbouncer.get_auth(character varying);"),
    "connect revoked": ("REVOKE CONNECT ON DATABASE {db} FROM PUBLIC",
                        "GRANT CONNECT ON DATABASE {db} TO {auth};"),
    "role cannot log in": ("ALTER ROLE {auth} NOLOGIN", "ALTER ROLE {auth} LOGIN;"),
    "superusers not excluded": (
        "CREATE OR REPLACE FUNCTION pgbouncer.get_auth(p_usename text)"
        " RETURNS TABLE (usename name, passwd text) LANGUAGE sql STABLE SECURITY DEFINER"
        " SET search_path = pg_catalog, pg_temp"
        " AS $$ SELECT rolname, rolpassword::text FROM pg_authid WHERE rolname = p_usename $$",
        "CREATE OR REPLACE FUNCTION pgbouncer.get_auth(p_usename text)\n"),
}


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_check_prints_the_statement_that_fixes_it(ready, breakage):
    env = ready
    names = {"auth": env.auth, "other": env.other, "db": env.db}
    breaking, fix = (text.format(**names) for text in BREAKAGES[breakage])
    env.sql(breaking)
    try:
        r = env.check()
        assert r.rc == 1, r.stdout
        (printed,) = fixes(r.stdout)
        assert printed.startswith(fix), r.stdout
        # the printed statement, run as it is, repairs the set-up
        env.sql(printed)
        r = env.check()
        assert r.rc == 0, r.stdout
    finally:
        if breakage == "connect revoked":
            env.sql(pgsql.SQL("GRANT CONNECT ON DATABASE {} TO PUBLIC").format(pgsql.Identifier(env.db)))
        if breakage == "overload":
            env.sql("DROP FUNCTION IF EXISTS pgbouncer.get_auth(varchar)")


@pytest.mark.parametrize("older", OLDER_FUNCTIONS)
def test_check_fixes_for_an_older_function_keep_its_grants(ready, older):
    """Over an older get_auth(text), the printed fixes, run in order, end
    in a complete set-up: the function must be dropped, and a dropped
    function comes back executable by PUBLIC and not by the auth_user."""
    env = ready
    fn = "pgbouncer.get_auth(text)"
    env.sql("DROP FUNCTION pgbouncer.get_auth(text)")
    env.sql(OLDER_FUNCTIONS[older])
    env.sql(f"REVOKE ALL ON FUNCTION {fn} FROM PUBLIC")
    env.sql(pgsql.SQL("GRANT EXECUTE ON FUNCTION pgbouncer.get_auth(text) TO {}").format(pgsql.Identifier(env.auth)))
    try:
        r = env.check()
        assert r.rc == 1, r.stdout
        with env.connect("postgres") as conn:
            for statement in fixes(r.stdout):
                conn.execute(statement)
        assert env.sql("SELECT has_function_privilege(%s, %s, 'EXECUTE'), has_function_privilege(%s, %s, 'EXECUTE')",
                       [env.other, fn, env.auth, fn]) == [(False, True)]
        r = env.check()
        assert r.rc == 0, r.stdout
    finally:
        env.sql("DROP FUNCTION pgbouncer.get_auth(text)")  # the next set-up makes it anew


def test_check_of_a_missing_database_exits_2(env):
    r = env.check(db=env.db2 + "_none")
    assert r.rc == 2, r.stdout
    assert f'cannot connect to database "{env.db2}_none"' in r.stderr


def test_check_lists_everything_missing_in_a_fresh_database(ready):
    env = ready
    env.sql("DROP SCHEMA IF EXISTS pgbouncer CASCADE", dbname=env.db2)
    r = env.check(db=env.db2)
    assert r.rc == 1, r.stdout
    missing = re.findall(r"^  MISSING  (.*)$", r.stdout, re.MULTILINE)
    assert missing == ["schema pgbouncer", "function pgbouncer.get_auth(text)",
                       "EXECUTE on pgbouncer.get_auth(text) revoked from PUBLIC",
                       f"EXECUTE on pgbouncer.get_auth(text) for {env.auth}",
                       f"USAGE on schema pgbouncer for {env.auth}"], r.stdout
    # the fixes, in order, are a complete set-up script
    with env.connect("postgres", dbname=env.db2) as conn:
        for statement in fixes(r.stdout):
            conn.execute(statement)
    r = env.check(db=env.db2)
    assert r.rc == 0, r.stdout


def test_check_fixes_make_a_new_role_and_its_connect_grant(env):
    """Without the role and with CONNECT revoked from PUBLIC, the fixes run
    in order still give the new role all it needs, CONNECT included."""
    user = env.auth + "_new"
    env.extra_roles.append(user)
    db = pgsql.Identifier(env.db2)
    env.sql("DROP SCHEMA IF EXISTS pgbouncer CASCADE", dbname=env.db2)
    env.sql(pgsql.SQL("REVOKE CONNECT ON DATABASE {} FROM PUBLIC").format(db))
    try:
        r = env.run("--check", "--user", user, env.conninfo(), env.db2)
        assert r.rc == 1, r.stdout
        assert f"GRANT CONNECT ON DATABASE {env.db2} TO {user};" in fixes(r.stdout), r.stdout
        with env.connect("postgres", dbname=env.db2) as conn:
            for statement in fixes(r.stdout):
                # psql's \password is for a person to type
                conn.execute("\n".join(line for line in statement.splitlines() if not line.startswith("\\")))
        r = env.run("--check", "--user", user, env.conninfo(), env.db2)
        missing = re.findall(r"^  MISSING  (.*)$", r.stdout, re.MULTILINE)
        assert missing == [f"password of role {user}"], r.stdout
    finally:
        env.sql(pgsql.SQL("GRANT CONNECT ON DATABASE {} TO PUBLIC").format(db))
        env.sql("DROP SCHEMA IF EXISTS pgbouncer CASCADE", dbname=env.db2)


def test_check_needs_no_superuser(ready):
    env = ready
    r = env.run("--check", "--user", env.auth, env.conninfo(user=env.nosuper), env.db)
    assert r.rc == 0, r.stdout + r.stderr
    assert f"  SKIP     password of role {env.auth} (reading it needs a superuser)" in r.stdout
    assert f"  OK       USAGE on schema pgbouncer for {env.auth}" in r.stdout


def test_check_probe_logs_in_as_auth_user(ready):
    env = ready
    r = env.check("--password", PASSWORD, "--probe-user", env.app)
    assert r.rc == 0, r.stdout + r.stderr
    assert f"auth_query as {env.auth} in database {env.db} finds the secret of {env.app}" in r.stdout
    r = env.check("--password", PASSWORD, "--probe-user", env.superuser)
    assert r.rc == 1, r.stdout
    assert f"  MISSING  a secret for {env.superuser} from auth_query" in r.stdout


# ---------------------------------------------------------------------------
# errors


def test_non_superuser_is_refused(env):
    newbie = env.auth + "_never"
    r = env.run("--user", newbie, env.conninfo(user=env.nosuper), env.db)
    assert r.rc == 2
    assert f'role "{env.nosuper}" is not a superuser' in r.stderr
    assert r.stdout == ""
    assert env.pg.sql("SELECT 1 FROM pg_roles WHERE rolname = %s", [newbie]) == []


def test_connection_failure_exits_2(env):
    r = env.run(f"host=127.0.0.1 port={free_port()} user=postgres connect_timeout=5", env.db)
    assert r.rc == 2
    assert f'cannot connect to database "{env.db}"' in r.stderr
    assert "Connection refused" in r.stderr


@pytest.mark.parametrize("args, message", [
    ([], "no CONNINFO given"),
    (["--schema", "public", "x"], 'schema "public" is not allowed'),
    (["--password", "a", "--password-file", "/dev/null", "x"], "exclude each other"),
    (["--user", "", "x"], "invalid role name"),
    # pgbouncer.ini trims a value: auth_user = " pad " would name the role "pad"
    (["--user", " pad", "x"], "pgbouncer.ini cannot hold a role name that begins or ends with a space"),
    (["--user", "pad ", "x"], "pgbouncer.ini cannot hold a role name that begins or ends with a space"),
    (["--check", "--probe-user", "u", "x"], "--probe-user needs the auth_user's password"),
    # the auth_file would take them for secrets, not for passwords pgbouncer can log in with
    (["--password", "md5" + "0123456789abcdef" * 2, "x"], "the auth_file would read it as a secret"),
    (["--password", "SCRAM-SHA-256$4096:c2FsdA==$a2V5:a2V5", "x"], "the auth_file would read it as a secret"),
    (["--no-such-option", "x"], "unrecognized option"),
])
def test_usage_errors_exit_2(env, args, message):
    r = env.run(*args)
    assert r.rc == 2
    assert message in r.stderr


def test_help_and_version(env):
    r = env.run("--help")
    assert r.rc == 0 and "Usage: pgbouncer-auth-setup" in r.stdout and "--check" in r.stdout
    r = env.run("-V")
    assert r.rc == 0 and r.stdout.startswith("pgbouncer-auth-setup (pgbouncer) ")
