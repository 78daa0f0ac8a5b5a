"""Helpers shared by the integration tests: the console (rows of a SHOW as
dicts), pools and backends, workers, clients run in the background, and the
check that a pooler and a bystander client came through a bad input
unharmed. Fixtures live in conftest.py; the raw protocol client in pgwire.py.
"""

import os
import shutil
import subprocess
import threading
import time

import psycopg
import pytest

from conftest import wait_for
from pgwire import error_fields, message, PgWire

def check_unharmed(b, bystander):
    """The pooler is up, the bystander keeps working, and a new client can log in."""
    assert b.alive(), f"pooler died\n{b.describe()}"
    for i in range(3):
        assert bystander.execute("SELECT %s::int * 2", [i]).fetchone() == (i * 2,)
    assert bystander.execute("SELECT 'still here'").fetchone() == ("still here",)
    with b.connect(autocommit=True, password="postgres") as fresh:
        assert fresh.execute("SELECT 42").fetchone() == (42,)
    w = PgWire(b.port)
    w.login(password="postgres")
    assert w.simple_query("SELECT 7") == ([["7"]], None)
    w.close()


def console(b, user="pgbouncer", **kw):
    """A console connection. psycopg would switch a statement it has run five
    times to the extended protocol, which the console refuses: never prepare."""
    return b.admin(user=user, prepare_threshold=None, **kw)


def rows(conn, command):
    """Runs a SHOW; returns its rows as dicts keyed by column name."""
    cur = conn.execute(command)
    names = [d.name for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def row(conn, command, **match):
    """The one row of `command` whose columns equal `match`."""
    found = [r for r in rows(conn, command) if all(r[k] == v for k, v in match.items())]
    assert len(found) == 1, f"{command}: expected one row with {match}, got {found}"
    return found[0]


def kv(conn, command):
    """A SHOW as a dict of its first column to its second (STATE, LISTS, TOTALS, CONFIG)."""
    return {r[0]: r[1] for r in conn.execute(command).fetchall()}


def expect_error(conn, command, message, sqlstate="08P01"):
    """The console answers `command` with ERROR `message` and stays usable."""
    with pytest.raises(psycopg.Error) as info:
        conn.execute(command)
    diag = info.value.diag
    assert (diag.severity, diag.sqlstate, diag.message_primary) == ("ERROR", sqlstate, message), command
    assert conn.execute("SHOW VERSION").fetchone()[0].startswith("PgBouncer ")


def show(admin, what):
    """Rows of `SHOW what` on the console, as dicts."""
    return rows(admin, f"SHOW {what}")


def pool_row(b, database="postgres", user="postgres"):
    with b.admin() as admin:
        for row in show(admin, "POOLS"):
            if row["database"] == database and row["user"] == user:
                return row
    return None


def backend_state(pg, pid):
    """(state, query) of a backend in pg_stat_activity, or None when it is gone."""
    rows = pg.sql("SELECT state, query FROM pg_stat_activity WHERE pid = %s", [pid])
    return tuple(rows[0]) if rows else None


def wait_reset(b, pg, pid):
    """Waits until the pooler's server_reset_query has run on backend `pid`
    and the pooler has the server back among its idle ones."""
    wait_for(lambda: backend_state(pg, pid) == ("idle", "DISCARD ALL"),
             f"DISCARD ALL to finish on backend {pid}")
    wait_server_idle(b)


def wait_server_idle(b, database="postgres", user="postgres"):
    """Waits until SHOW POOLS shows a free server (idle or used) and none busy."""
    def settled():
        row = pool_row(b, database, user) or {}
        free = row.get("sv_idle", 0) + row.get("sv_used", 0)
        return free >= 1 and row.get("sv_active") == 0 and row.get("sv_tested") == 0
    wait_for(settled, "a released server to be idle in the pool")


class Background:
    """Runs fn() in a thread; result() returns its value or raises its exception."""

    def __init__(self, fn):
        self._value = self._error = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn):
        try:
            self._value = fn()
        except BaseException as e:  # noqa: B902 - handed to the test thread
            self._error = e

    def done(self):
        return not self._thread.is_alive()

    def result(self, timeout=30):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "background query did not finish"
        if self._error is not None:
            raise self._error
        return self._value


class BusyTransactions:
    """Each connection (autocommit) runs one short transaction after another
    in a thread of its own, for at most `seconds`, until stop(); stop()
    joins them and raises the first error any of them met. Such a client is
    between two transactions only for an instant."""

    def __init__(self, conns, seconds=40):
        self._stop = threading.Event()
        self._errors = []
        self._threads = [threading.Thread(target=self._loop, args=(c, seconds), daemon=True) for c in conns]
        for t in self._threads:
            t.start()

    def _loop(self, conn, seconds):
        deadline = time.monotonic() + seconds
        try:
            while not self._stop.is_set() and time.monotonic() < deadline:
                with conn.transaction():
                    conn.execute("SELECT pg_sleep(0.005)")
        except Exception as e:  # noqa: B902 - handed to the test thread by stop()
            self._errors.append(e)

    def stop(self):
        self._stop.set()
        for t in self._threads:
            t.join()
        if self._errors:
            raise self._errors[0]


def wait_running(pg, sql_prefix):
    """Waits until PostgreSQL runs a query starting with sql_prefix; returns its pid."""
    def find():
        rows = pg.sql("SELECT pid FROM pg_stat_activity WHERE state = 'active' AND query LIKE %s",
                      [sql_prefix + "%"])
        return rows[0][0] if rows else None
    return wait_for(find, f"PostgreSQL to run {sql_prefix!r}")


def workers(b):
    """SHOW WORKERS as a list of dicts."""
    with b.admin() as conn:
        return rows(conn, "SHOW WORKERS")


def states(b):
    return sorted(w["state"] for w in workers(b))


def worker_of(conn):
    """The worker id a client landed on: the pooler puts it into byte 3 of the cancel key."""
    return conn.info.backend_pid & 0xFF


def conn_on(b, worker, **kw):
    """A client connection that landed on the given worker (others are closed at once)."""
    def attempt():
        try:
            c = b.connect(autocommit=True, **kw)
        except psycopg.OperationalError as e:
            # under max_client_conn, the close of a previous attempt may not be seen yet
            assert "max_client_conn" in str(e)
            return None
        if worker_of(c) == worker:
            return c
        c.close()
        return None
    return wait_for(attempt, f"a client on worker {worker}")


def two_workers(b):
    wait_for(lambda: states(b) == ["active", "active"], "two workers")


def raw_login_error(b, user, password, database="postgres"):
    """Logs in over a raw socket; returns the ErrorResponse fields (asserting it was FATAL and final)."""
    w = PgWire(b.port)
    w.startup(user=user, database=database)
    first = w.authenticate(user, password)
    assert first is not None and first[0] == b"E", f"expected a login error, got {first!r}"
    err = error_fields(first[1])
    assert err["S"] == "FATAL", err
    assert set(err) == {"S", "C", "M"}, err
    assert w.at_eof()
    return err


def scram_secret_of(server, role, password):
    """A SCRAM verifier made by PostgreSQL itself (pg_authid.rolpassword)."""
    server.create_role(role, password=password)
    (secret,) = server.sql("SELECT rolpassword FROM pg_authid WHERE rolname = %s", [role])[0]
    assert secret.startswith("SCRAM-SHA-256$"), secret
    return secret


def build_has_pam(binary):
    """Whether this pgbouncer was built with PAM (configure found libpam)."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
    return "libpam.so" in out


def scram_salt(b, user):
    """The salt of the SCRAM server-first message the pooler sends to `user`."""
    w = PgWire(b.port)
    w.startup(user=user)
    kind, body = w.read_msg()
    assert (kind, body[:4]) == (b"R", b"\0\0\0\x0a")
    first = b"n,,n=,r=clientnonce0123456789"
    w.send(message(b"p", b"SCRAM-SHA-256\0" + len(first).to_bytes(4, "big") + first))
    kind, body = w.read_msg()
    w.close()
    assert (kind, body[:4]) == (b"R", b"\0\0\0\x0b"), (kind, body)
    return dict(kv.split("=", 1) for kv in body[4:].decode().split(","))["s"]


def assert_cancels(c, times=4):
    """A pg_sleep on psycopg connection c is cancelled `times` times in a row (57014), and c still works."""
    for _ in range(times):
        timer = threading.Timer(0.3, c.cancel)
        timer.start()
        with pytest.raises(psycopg.errors.QueryCanceled) as exc:
            c.execute("SELECT pg_sleep(20)")
        timer.join()
        assert exc.value.sqlstate == "57014"
    assert c.execute("SELECT 1").fetchone() == (1,)


def preload_shim(session_dir, tmp_path, name, source, **variables):
    """Compiles `source` (C that stands in for libc functions, reaching the real ones with
    dlsym(RTLD_NEXT)) into a library in the session directory, which the run-as user can read;
    returns (env, so): the environment that preloads it into a pooler, with the variables given,
    and the library's path (the caller removes it). Skips the test without a C compiler."""
    cc = shutil.which("cc")
    if not cc:
        pytest.skip(f"no C compiler for the {name} shim")
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    so = session_dir / f"{name}-{os.getpid()}-{tmp_path.name}.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(src), "-ldl"], check=True)
    os.chmod(so, 0o755)
    env = {"LD_PRELOAD": str(so), **variables}
    # an ASan build (scripts/test --sanitize) refuses to start when another library is preloaded
    # before its runtime; the shim must come first to stand in for libc, so that check is turned
    # off, keeping the harness's other ASan options
    asan = os.environ.get("ASAN_OPTIONS")
    env["ASAN_OPTIONS"] = (asan + ":" if asan else "") + "verify_asan_link_order=0"
    return env, so
