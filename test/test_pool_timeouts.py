"""Pool maintenance and timeouts off the happy path (spec/config.md,
spec/behaviours.md §4, §11-14): health checks before reuse, unlimited
server lifetime, min_pool_size for forced users, host lists whose first
name does not resolve, the safe shutdown, query_timeout at login,
server_fast_close and pool_idle_timeout."""

import socket
import threading
import time

import psycopg
import pytest

from conftest import free_port, wait_for
from helpers import backend_state, pool_row, show
from pgwire import message, PgWire


def backends_of(pg, user):
    """PostgreSQL pids of the client backends logged in as `user`."""
    rows = pg.sql("SELECT pid FROM pg_stat_activity WHERE usename = %s AND backend_type = 'client backend'",
                  [user])
    return sorted(r[0] for r in rows)


def test_check_query_runs_before_every_reuse_with_delay_zero(bouncer, pg):
    """server_check_delay = 0: each transaction of a transaction-mode client
    gets a server that has just answered server_check_query."""
    pg.sql("CREATE SEQUENCE IF NOT EXISTS pgb_checks")
    before = pg.sql("SELECT last_value, is_called FROM pgb_checks")[0]
    start = before[0] if before[1] else 0
    b = bouncer(ini_overrides={"pool_mode": "transaction", "server_check_delay": 0,
                               "server_check_query": "SELECT nextval('pgb_checks')"})
    with b.connect(autocommit=True) as conn:
        for _ in range(10):
            assert conn.execute("SELECT 1").fetchone() == (1,)
    checks = pg.sql("SELECT last_value FROM pgb_checks")[0][0] - start
    # the first transaction has a freshly logged-in server, every later one a checked one
    assert checks >= 9, f"only {checks} checks for 10 transactions"


class DoomableProxy:
    """A TCP proxy to PostgreSQL whose existing connections can be doomed: a
    doomed connection closes, silently, as soon as the pooler sends on it,
    like a server that died while the pooler was not looking. New
    connections work."""

    def __init__(self, target_port):
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            conn = {"socks": (client, server), "doomed": False}
            self.conns.append(conn)
            threading.Thread(target=self._pump, args=(client, server, conn, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, conn, False), daemon=True).start()

    @staticmethod
    def _close(conn):
        for s in conn["socks"]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _pump(self, src, dst, conn, from_pooler):
        try:
            while True:
                data = src.recv(65536)
                if not data or (from_pooler and conn["doomed"]):
                    break
                dst.sendall(data)
        except OSError:
            pass
        self._close(conn)

    def doom_existing(self):
        for conn in self.conns:
            conn["doomed"] = True

    def close(self):
        self.listener.close()
        for conn in self.conns:
            self._close(conn)


def test_dead_server_not_handed_out_with_check_delay_zero(bouncer, pg):
    """A server that died unnoticed fails its check, and the client's next
    transaction runs on a new server instead of failing."""
    proxy = DoomableProxy(pg.port)
    try:
        b = bouncer(ini_overrides={"pool_mode": "transaction", "server_check_delay": 0,
                                   "server_check_query": "SELECT 1", "default_pool_size": 1},
                    databases={"postgres": f"host=127.0.0.1 port={proxy.port} dbname=postgres"})
        conn = b.connect(autocommit=True)
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        proxy.doom_existing()
        assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] != pid
        b.wait_log(r"S-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:\d+ closing because: server conn crashed\?")
    finally:
        proxy.close()


def test_server_lifetime_zero_means_no_limit(bouncer, pg):
    b = bouncer(ini_overrides={"server_lifetime": 0, "query_wait_timeout": 5})
    with b.connect(autocommit=True) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    with b.admin() as admin:
        row = {r["key"]: r["value"] for r in show(admin, "CONFIG")}
    assert row["server_lifetime"] == "0"
    # the same server serves the next client: nothing closed it
    for _ in range(3):
        with b.connect(autocommit=True) as conn:
            assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] == pid
    assert "server lifetime over" not in b.log_text()


def test_server_idle_timeout_closes_a_server_past_check_delay(bouncer, pg):
    """A server idle past server_check_delay (state used) still reaches
    server_idle_timeout: with the defaults (30 s, 600 s) every idle server
    is such a one."""
    b = bouncer(ini_overrides={"server_check_delay": 1, "server_idle_timeout": 4})
    with b.connect(autocommit=True) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    wait_for(lambda: pool_row(b)["sv_used"] == 1, "the idle server to pass server_check_delay")
    wait_for(lambda: backend_state(pg, pid) is None, "server_idle_timeout to close the used server", timeout=20)
    b.wait_log(r"S-0x[0-9a-f]+: postgres/postgres@\S+ closing because: server idle timeout")
    assert pool_row(b)["sv_used"] == 0


@pytest.mark.parametrize("limit", ["max_db_connections", "max_user_connections"])
def test_limit_evicts_a_server_past_check_delay(bouncer, pg, limit):
    """At max_db_connections / max_user_connections a login of another pool
    closes the longest-idle free server of the database / user, also one
    idle past server_check_delay (state used), instead of waiting for
    query_wait_timeout."""
    pg.create_role("pgb_evict", password="evictpw")
    b = bouncer(ini_overrides={"server_check_delay": 1, limit: 1, "query_wait_timeout": 10},
                users_txt='"postgres" "postgres"\n"pgbouncer" "pgbouncer"\n"pgb_evict" "evictpw"\n',
                databases={"postgres": pg.connstr("postgres"), "other": pg.connstr("postgres")})
    with b.connect(autocommit=True) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    wait_for(lambda: pool_row(b)["sv_used"] == 1, "the idle server to pass server_check_delay")
    # another pool of the same database, or of the same user
    other = {"user": "pgb_evict", "password": "evictpw"} if limit == "max_db_connections" else {"dbname": "other"}
    with b.connect(autocommit=True, **other) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert backend_state(pg, pid) is None
    assert "closing because: evicted" in b.log_text()


def test_reserve_pool_server_stays_for_the_next_burst(bouncer, pg):
    """A server the reserve pool opened stays, idle, after its client left
    (up to server_idle_timeout, as PgBouncer keeps it): the next client that
    finds the pool full gets it at once, no new wait for reserve_pool_timeout."""
    b = bouncer(ini_overrides={"default_pool_size": 1, "reserve_pool_size": 1, "reserve_pool_timeout": 1,
                               "query_wait_timeout": 30})
    holder = b.connect(autocommit=True)
    holder.execute("BEGIN")
    held = holder.execute("SELECT pg_backend_pid()").fetchone()[0]
    with b.connect(autocommit=True) as burst:
        reserve = burst.execute("SELECT pg_backend_pid()").fetchone()[0]
    assert reserve != held
    b.wait_log(r"taking connection from reserve_pool")
    wait_for(lambda: pool_row(b)["sv_idle"] == 1, "the reserve server to be idle")
    time.sleep(1)  # a few janitor passes
    assert pool_row(b)["sv_idle"] == 1
    with b.connect(autocommit=True) as again:
        assert again.execute("SELECT pg_backend_pid()").fetchone()[0] == reserve
    assert b.log_text().count("taking connection from reserve_pool") == 1
    assert "too many servers in the pool" not in b.log_text()
    holder.execute("COMMIT")


@pytest.mark.parametrize("timeout,reason", [("query_timeout", "query timeout"),
                                            ("transaction_timeout", "transaction timeout")])
def test_request_the_pooler_answers_does_not_start_a_timeout(bouncer, timeout, reason):
    """In transaction mode the pooler answers a Close of a prepared statement
    itself; nothing runs on the server, so query_timeout and
    transaction_timeout do not count from it, neither while the client
    idles nor for its next query."""
    b = bouncer(ini_overrides={"pool_mode": "transaction", timeout: 1})
    w = PgWire(b.port)
    w.login()
    w.send(message(b"P", b"s1\0SELECT 1\0\0\0") + message(b"S"))
    assert [m[0] for m in w.read_until(b"Z")] == [b"1", b"Z"]
    w.send(message(b"C", b"Ss1\0") + message(b"H"))  # Close, Flush: no Sync, no ReadyForQuery
    assert w.read_msg() == (b"3", b"")
    time.sleep(2)  # longer than the timeout
    assert w.simple_query("SELECT 1") == ([["1"]], None)
    assert reason not in b.log_text()
    w.close()


def test_server_lifetime_in_a_pool_of_unlimited_size(bouncer, pg):
    """With pool size 0 (unlimited) there is no spacing of lifetime closes
    (PgBouncer's gap is server_lifetime / pool_size only for a limited
    pool): two old servers released together both close, and the next
    client gets a new one."""
    b = bouncer(ini_overrides={"default_pool_size": 0, "server_lifetime": 1})
    first, second = b.connect(autocommit=True), b.connect(autocommit=True)
    old = {c.execute("SELECT pg_backend_pid()").fetchone()[0] for c in (first, second)}
    assert len(old) == 2
    time.sleep(1.5)  # both older than server_lifetime
    first.close()
    second.close()
    with b.connect(autocommit=True) as conn:
        assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] not in old
    wait_for(lambda: all(backend_state(pg, pid) is None for pid in old), "both old servers to close")


def test_min_pool_size_fills_forced_user_pool_without_clients(bouncer, pg):
    pg.create_role("pgb_minpool", password="minpoolpw")
    b = bouncer(ini_overrides={"min_pool_size": 2},
                databases={"warm": pg.connstr("postgres", user="pgb_minpool", password="minpoolpw"),
                           "postgres": pg.connstr("postgres")})
    wait_for(lambda: len(backends_of(pg, "pgb_minpool")) == 2,
             "two servers of the forced user before any client", timeout=15)
    row = pool_row(b, "warm", "pgb_minpool")
    assert row is not None and row["cl_active"] == 0 and row["sv_idle"] == 2, row
    with b.connect(dbname="warm", autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("pgb_minpool",)


def test_host_list_skips_a_host_that_does_not_resolve(bouncer, pg):
    b = bouncer(databases={"pair": f"host=no-such-host.invalid,127.0.0.1 port={pg.port} dbname=postgres"},
                start=False)
    # a resolver nobody answers on: the test does not depend on the machine's DNS
    resolv = b.dir / "resolv.conf"
    b.run_as.write(resolv, "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    b.update(resolv_conf=str(resolv))
    b.write_ini()
    b.start()
    for _ in range(2):  # while the lookup runs, and once its failure is cached
        with b.connect(dbname="pair", autocommit=True) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == ("postgres",)
    b.wait_log(r'could not resolve host "no-such-host.invalid"')


def test_safe_shutdown_refuses_a_client_that_needs_a_server(bouncer, pg):
    """After SHUTDOWN WAIT_FOR_SERVERS a logged-in client without a server
    is told so at its next query; a client holding a server finishes."""
    b = bouncer(ini_overrides={"query_wait_timeout": 10})
    holder = b.connect(autocommit=True)
    holder.execute("SELECT 1")  # session mode: keeps its server until it leaves
    late = PgWire(b.port)
    late.login()  # logged in, no server yet
    with b.admin() as admin:
        admin.execute("SHUTDOWN WAIT_FOR_SERVERS")  # answered once the pooler is shutting down
    late.send(b"Q\x00\x00\x00\x0dSELECT 1\x00")
    late.expect_fatal("server shutting down")
    assert holder.execute("SELECT 'holder finishes'").fetchone() == ("holder finishes",)
    holder.close()
    b.wait_log(r"server connections dropped, exiting")


@pytest.mark.parametrize("setting", ["query_timeout", "query_wait_timeout"])
def test_timeouts_count_while_waiting_at_login(bouncer, pg, setting):
    """The first server of a pool never comes: a login parked until it is up
    waits for a server like a queued query (spec/behaviours.md §3.1, state
    waiting), so query_timeout and query_wait_timeout end the wait, as with
    PgBouncer, before client_login_timeout does; other pools go on."""
    dead_port = free_port()
    b = bouncer(ini_overrides={setting: 1, "client_login_timeout": 20, "server_login_retry": 30},
                databases={"down": f"host=127.0.0.1 port={dead_port} dbname=postgres",
                           "postgres": pg.connstr("postgres")})
    w = PgWire(b.port)
    w.startup(database="down")
    w.expect_fatal(setting)  # AuthenticationOk comes with the welcome
    with b.connect(autocommit=True) as conn:
        assert conn.execute("SELECT 'other pool fine'").fetchone() == ("other pool fine",)


def test_server_fast_close_after_reconnect(bouncer, pg):
    """server_fast_close = 1 in session mode: after RECONNECT an idle session
    loses its server (and its connection) at once; one inside a transaction
    finishes the transaction first."""
    b = bouncer(ini_overrides={"server_fast_close": 1})
    idle = b.connect(autocommit=True)
    idle_pid = idle.execute("SELECT pg_backend_pid()").fetchone()[0]
    busy = b.connect()
    busy_pid = busy.execute("SELECT pg_backend_pid()").fetchone()[0]  # opens a transaction
    with b.admin() as admin:
        admin.execute("RECONNECT")
    wait_for(lambda: backend_state(pg, idle_pid) is None, "the idle session's server to be closed", timeout=10)
    with pytest.raises(psycopg.OperationalError, match="database configuration changed"):
        idle.execute("SELECT 1")
    assert busy.execute("SELECT 'still in my transaction'").fetchone() == ("still in my transaction",)
    assert backend_state(pg, busy_pid) is not None
    busy.commit()
    wait_for(lambda: backend_state(pg, busy_pid) is None, "the server to close at transaction end", timeout=10)
    with b.connect(autocommit=True) as conn:
        assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] not in (idle_pid, busy_pid)


def test_server_fast_close_off_waits_for_session_end(bouncer, pg):
    b = bouncer()
    conn = b.connect(autocommit=True)
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    with b.admin() as admin:
        admin.execute("RECONNECT")
        wait_for(lambda: [r for r in show(admin, "SERVERS") if r["close_needed"] == 1],
                 "the server to be marked close_needed")
    assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] == pid
    conn.close()
    wait_for(lambda: backend_state(pg, pid) is None, "the server to close at session end")


def test_pool_idle_timeout_frees_an_unused_pool(bouncer, pg):
    b = bouncer(ini_overrides={"pool_idle_timeout": 1, "server_idle_timeout": 1})
    with b.connect(autocommit=True) as conn:
        # in use for longer than pool_idle_timeout: kept
        assert conn.execute("SELECT pg_sleep(2.5), 1").fetchone() == ("", 1)
        assert pool_row(b) is not None
    wait_for(lambda: pool_row(b) is None, "the unused pool to leave SHOW POOLS", timeout=15)
    # it comes back on the next login
    with b.connect(autocommit=True) as conn:
        assert conn.execute("SELECT 'pool again'").fetchone() == ("pool again",)
        assert pool_row(b) is not None


def test_reload_of_a_new_host_ends_the_login_retry_wait(bouncer, pg):
    """A failed connect makes new clients fail at once for server_login_retry;
    a RELOAD that points the database at a working host ends that: the next
    client is served from the new host instead of getting the old host's
    cached error until the retry time is over."""
    b = bouncer(ini_overrides={"server_login_retry": 60, "query_wait_timeout": 2, "min_workers": 1,
                               "max_workers": 1},
                # PostgreSQL listens on 127.0.0.1 only: 127.0.0.2 refuses
                databases={"moving": f"host=127.0.0.2 port={pg.port} dbname=postgres"})
    with pytest.raises(psycopg.OperationalError, match="query_wait_timeout"):
        b.connect(dbname="moving")
    with pytest.raises(psycopg.OperationalError, match="server login has been failing"):
        b.connect(dbname="moving")
    b.databases["moving"] = f"host=127.0.0.1 port={pg.port} dbname=postgres"
    b.write_ini()
    b.reload()

    def reloaded():
        with b.admin() as admin:
            return {r[0]: r[1] for r in admin.execute("SHOW DATABASES").fetchall()}["moving"] == "127.0.0.1"
    wait_for(reloaded, "the new host in SHOW DATABASES")
    with b.connect(dbname="moving", autocommit=True) as conn:
        assert conn.execute("SELECT inet_server_addr()::text").fetchone() == ("127.0.0.1/32",)
