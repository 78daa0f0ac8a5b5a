"""The admin console (spec/admin.md): who may log in, the command grammar,
every SHOW with its columns and wire types, and the process-control
commands, all seen through real clients (psycopg, psql, and a raw
protocol client where the exact bytes matter)."""

import os
import re
import select
import signal
import socket
import struct
import subprocess
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import psycopg
import pytest

from conftest import DEADLINE, wait_for
from helpers import console, expect_error, kv, row, rows, two_workers

VERSION = "1.25.2"

# RowDescription type OIDs and their typlen (None = variable length)
TEXT, INT4, INT8, NUMERIC, BYTEA = 25, 23, 20, 1700, 17
TYPLEN = {TEXT: None, INT4: 4, INT8: 8, NUMERIC: None, BYTEA: None}

# ---------------------------------------------------------------------------
# the columns of every SHOW, written from spec/admin.md §4


def _cols(typ, names):
    return [(n, typ) for n in names.split()]


SOCKET_COLUMNS = [
    ("type", TEXT), ("user", TEXT), ("database", TEXT), ("replication", TEXT), ("state", TEXT),
    ("addr", TEXT), ("port", INT4), ("local_addr", TEXT), ("local_port", INT4),
    ("connect_time", TEXT), ("request_time", TEXT), ("wait", INT4), ("wait_us", INT4),
    ("close_needed", INT4), ("ptr", TEXT), ("link", TEXT), ("remote_pid", INT4), ("tls", TEXT),
    ("application_name", TEXT), ("prepared_statements", INT4), ("id", INT4),
]
BUFFER_COLUMNS = _cols(INT4, "recv_pos pkt_pos pkt_remain send_pos send_remain pkt_avail send_avail")

SHOW_COLUMNS = {
    "STATS": [("database", TEXT)] + _cols(NUMERIC, """
        total_server_assignment_count total_xact_count total_query_count total_received total_sent
        total_xact_time total_query_time total_wait_time total_client_parse_count
        total_server_parse_count total_bind_count total_client_login_count
        avg_server_assignment_count avg_xact_count avg_query_count avg_recv avg_sent avg_xact_time
        avg_query_time avg_wait_time avg_client_parse_count avg_server_parse_count avg_bind_count
        avg_client_login_count"""),
    "STATS_TOTALS": [("database", TEXT)] + _cols(NUMERIC, """
        server_assignment_count xact_count query_count bytes_received bytes_sent xact_time
        query_time wait_time client_parse_count server_parse_count bind_count client_login_count"""),
    "STATS_AVERAGES": [("database", TEXT)] + _cols(NUMERIC, """
        server_assignment_count xact_count query_count bytes_received bytes_sent xact_time
        query_time wait_time avg_client_parse_count avg_server_parse_count avg_bind_count
        avg_client_login_count"""),
    "TOTALS": [("name", TEXT), ("value", NUMERIC)],
    "SERVERS": SOCKET_COLUMNS,
    "CLIENTS": SOCKET_COLUMNS,
    "SOCKETS": SOCKET_COLUMNS + BUFFER_COLUMNS,
    "ACTIVE_SOCKETS": SOCKET_COLUMNS + BUFFER_COLUMNS,
    "POOLS": [("database", TEXT), ("user", TEXT)] + _cols(INT4, """
        cl_active cl_waiting cl_active_cancel_req cl_waiting_cancel_req sv_active sv_active_cancel
        sv_being_canceled sv_idle sv_used sv_tested sv_login maxwait maxwait_us""")
    + [("pool_mode", TEXT), ("load_balance_hosts", TEXT)],
    "PEER_POOLS": _cols(INT4, "peer_id cl_active_cancel_req cl_waiting_cancel_req sv_active_cancel sv_login"),
    "DATABASES": [
        ("name", TEXT), ("host", TEXT), ("port", INT4), ("database", TEXT), ("force_user", TEXT),
        ("pool_size", INT4), ("min_pool_size", INT4), ("reserve_pool_size", INT4), ("server_lifetime", INT4),
        ("pool_mode", TEXT), ("load_balance_hosts", TEXT), ("max_connections", INT4),
        ("current_connections", INT4), ("max_client_connections", INT4), ("current_client_connections", INT4),
        ("paused", INT4), ("disabled", INT4),
    ],
    "USERS": [
        ("name", TEXT), ("pool_size", TEXT), ("reserve_pool_size", TEXT), ("pool_mode", TEXT),
        ("max_user_connections", INT4), ("current_connections", INT4), ("max_user_client_connections", INT4),
        ("current_client_connections", INT4),
    ],
    "PEERS": [("peer_id", INT4), ("host", TEXT), ("port", INT4), ("pool_size", INT4)],
    "LISTS": [("list", TEXT), ("items", INT4)],
    "CONFIG": _cols(TEXT, "key value default changeable"),
    "MEM": [("name", TEXT)] + _cols(INT4, "size used free memtotal"),
    "DNS_HOSTS": [("hostname", TEXT), ("ttl", INT8), ("addrs", TEXT)],
    "DNS_ZONES": [("zonename", TEXT), ("serial", INT8), ("count", INT4)],
    "VERSION": [("version", TEXT)],
    "STATE": [("key", TEXT), ("value", TEXT)],
    "FDS": [
        ("fd", INT4), ("task", TEXT), ("user", TEXT), ("database", TEXT), ("addr", TEXT), ("port", INT4),
        ("cancel", INT8), ("link", INT4), ("client_encoding", TEXT), ("std_strings", TEXT),
        ("datestyle", TEXT), ("timezone", TEXT), ("password", TEXT), ("scram_client_key", BYTEA),
        ("scram_server_key", BYTEA),
    ],
}
READ_ONLY_SHOWS = [name for name in SHOW_COLUMNS if name != "FDS"]

LISTS_ROWS = ["databases", "users", "peers", "pools", "peer_pools", "free_clients", "used_clients",
              "login_clients", "free_servers", "used_servers", "dns_names", "dns_zones", "dns_queries",
              "dns_pending"]
TOTALS_ROWS = [
    "total_server_assignment_count", "total_xact_count", "total_query_count", "total_client_bytes",
    "total_server_bytes", "total_xact_time", "total_query_time", "total_wait_time", "total_ps_client_parse_count",
    "total_ps_server_parse_count", "total_ps_bind_count", "total_client_login_count",
    "avg_server_assignment_count", "avg_xact_count", "avg_query_count", "avg_client_bytes", "avg_server_bytes",
    "avg_xact_time", "avg_query_time", "avg_wait_time", "avg_ps_client_parse_count", "avg_ps_server_parse_count",
    "avg_ps_bind_count", "avg_client_login_count",
]
# post-1.25.2 parameters an implementation may add (login_notify_message is in CONFIG_ROWS)
OPTIONAL_CONFIG_KEYS = {"pool_idle_timeout"}
# parameters this project adds (DESIGN.md §7)
EXTENSION_CONFIG_KEYS = {"min_workers", "max_workers", "worker_scale_interval", "worker_scale_up_threshold",
                         "worker_scale_up_samples", "worker_scale_down_threshold", "worker_scale_down_samples",
                         "worker_scale_cooldown", "worker_drain_timeout", "worker_state_file", "worker_cpu_affinity",
                         "worker_watchdog_timeout", "worker_orphan_timeout",
                         "metrics_listen", "metrics_max_connections"}

DEFAULT_AUTH_QUERY = ("SELECT rolname, CASE WHEN rolvaliduntil < now() THEN NULL ELSE rolpassword END "
                      "FROM pg_authid WHERE rolname=$1 AND rolcanlogin")
# SHOW CONFIG: (key, default, changeable) in row order, from spec/config.md §2 (None = NULL)
CONFIG_ROWS = [
    ("admin_users", "", "yes"), ("application_name_add_host", "0", "yes"), ("auth_dbname", None, "yes"),
    ("auth_file", None, "yes"), ("auth_hba_file", "", "yes"), ("auth_ident_file", None, "yes"),
    ("auth_ldap_options", None, "yes"), ("auth_query", DEFAULT_AUTH_QUERY, "yes"), ("auth_type", "md5", "yes"),
    ("auth_user", None, "yes"), ("autodb_idle_timeout", "3600", "yes"), ("cancel_wait_timeout", "10", "yes"),
    ("client_idle_timeout", "0", "yes"), ("client_login_timeout", "60", "yes"),
    ("client_tls13_ciphers", None, "yes"), ("client_tls_ca_file", "", "yes"), ("client_tls_cert_file", "", "yes"),
    ("client_tls_ciphers", "default", "yes"), ("client_tls_dheparams", "auto", "yes"),
    ("client_tls_ecdhcurve", "auto", "yes"), ("client_tls_key_file", "", "yes"),
    ("client_tls_protocols", "secure", "yes"), ("client_tls_sslmode", "disable", "yes"),
    ("conffile", None, "yes"), ("default_pool_size", "20", "yes"), ("disable_pqexec", "0", "no"),
    ("dns_max_ttl", "15", "yes"), ("dns_nxdomain_ttl", "15", "yes"), ("dns_zone_check_period", "0", "yes"),
    ("idle_transaction_timeout", "0", "yes"), ("ignore_startup_parameters", "", "yes"),
    ("job_name", "pgbouncer", "no"), ("listen_addr", "", "no"), ("listen_backlog", "128", "no"),
    ("listen_port", "6432", "no"), ("log_connections", "1", "yes"), ("log_disconnections", "1", "yes"),
    ("log_pooler_errors", "1", "yes"), ("log_stats", "1", "yes"), ("logfile", "", "yes"),
    ("login_notify_message", "", "yes"),
    ("max_client_conn", "100", "yes"), ("max_db_client_connections", "0", "yes"),
    ("max_db_connections", "0", "yes"), ("max_packet_size", "2147483647", "yes"),
    ("max_prepared_statements", "200", "yes"), ("max_user_client_connections", "0", "yes"),
    ("max_user_connections", "0", "yes"), ("min_pool_size", "0", "yes"), ("peer_id", "0", "yes"),
    ("pidfile", "", "no"), ("pkt_buf", "4096", "no"), ("pool_mode", "session", "yes"),
    ("query_timeout", "0", "yes"), ("query_wait_notify", "5", "yes"), ("query_wait_timeout", "120", "yes"),
    ("reserve_pool_size", "0", "yes"), ("reserve_pool_timeout", "5", "yes"), ("resolv_conf", "", "no"),
    ("sbuf_loopcnt", "5", "yes"), ("scram_iterations", "4096", "yes"), ("server_check_delay", "30", "yes"),
    ("server_check_query", "<empty>", "yes"), ("server_connect_timeout", "15", "yes"),
    ("server_fast_close", "0", "yes"), ("server_idle_timeout", "600", "yes"), ("server_lifetime", "3600", "yes"),
    ("server_login_retry", "15", "yes"), ("server_reset_query", "DISCARD ALL", "yes"),
    ("server_reset_query_always", "0", "yes"), ("server_round_robin", "0", "yes"),
    ("server_tls13_ciphers", None, "yes"), ("server_tls_ca_file", "", "yes"), ("server_tls_cert_file", "", "yes"),
    ("server_tls_ciphers", "default", "yes"), ("server_tls_key_file", "", "yes"),
    ("server_tls_protocols", "secure", "yes"), ("server_tls_sslmode", "prefer", "yes"),
    ("so_reuseport", "0", "no"), ("stats_period", "60", "yes"), ("stats_users", "", "yes"),
    ("suspend_timeout", "10", "yes"), ("syslog", "0", "yes"), ("syslog_facility", "daemon", "yes"),
    ("syslog_ident", "pgbouncer", "yes"), ("tcp_defer_accept", "1", "yes"), ("tcp_keepalive", "1", "yes"),
    ("tcp_keepcnt", "0", "yes"), ("tcp_keepidle", "0", "yes"), ("tcp_keepintvl", "0", "yes"),
    ("tcp_socket_buffer", "0", "yes"), ("tcp_user_timeout", "0", "yes"),
    ("track_extra_parameters", "IntervalStyle", "no"), ("transaction_timeout", "0", "yes"),
    ("unix_socket_dir", "/tmp", "no"), ("unix_socket_group", "", "no"), ("unix_socket_mode", "0777", "no"),
    ("user", None, "no"), ("verbose", None, "yes"),
]

FAKE_PARAMS = {
    "client_encoding": "UTF-8",
    "default_transaction_isolation": "read committed",
    "standard_conforming_strings": "on",
    "datestyle": "ISO",
    "timezone": "GMT",
}

# admin-only commands a stats user must be refused (arguments chosen so that
# an admin running them would succeed or fail for another reason)
ADMIN_ONLY = ["PAUSE", "PAUSE postgres", "RESUME", "RESUME postgres", "SUSPEND", "KILL postgres", "KILL_CLIENT 1",
              "DISABLE postgres", "ENABLE postgres", "RECONNECT", "RECONNECT postgres", "WAIT_CLOSE", "RELOAD",
              "SHUTDOWN", "SET default_pool_size = 7", "SHOW FDS"]

# ---------------------------------------------------------------------------
# helpers


def pooled(b, **kw):
    """A client of a pooled database, in autocommit mode so that a session
    leaves no transaction open."""
    kw.setdefault("autocommit", True)
    return b.connect(**kw)



def version_ok(conn):
    assert conn.execute("SHOW VERSION").fetchone() == (f"PgBouncer {VERSION}",)



def expect_login_failure(b, message, **kw):
    with pytest.raises(psycopg.OperationalError) as info:
        pooled(b, **kw)
    assert f"FATAL:  {message}" in str(info.value)


def expect_fatal_on_next_query(conn, message):
    with pytest.raises(psycopg.OperationalError) as info:
        conn.execute("SELECT 1")
    assert message in str(info.value)


def backend_pid(conn):
    return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def local_port(conn):
    with socket.socket(fileno=os.dup(conn.pgconn.socket)) as s:
        return s.getsockname()[1]


def unix_socket_path(b):
    return str(b.dir / f".s.PGSQL.{b.port}")


def notices(conn):
    """Collects (severity, sqlstate, message, detail) of every notice
    (psycopg's Diagnostic is only valid inside the handler)."""
    seen = []
    conn.add_notice_handler(
        lambda d: seen.append((d.severity, d.sqlstate, d.message_primary, d.message_detail)))
    return seen


@pytest.fixture
def pool():
    with ThreadPoolExecutor(max_workers=4) as ex:
        yield ex


def users_txt(*names):
    return "".join(f'"{n}" "{n}"\n' for n in names)


class Raw:
    """A minimal protocol-3 client that shows every message as it arrives."""

    def __init__(self, b, user="pgbouncer", dbname="pgbouncer", unix=False, **params):
        if unix:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(unix_socket_path(b))
        else:
            self.sock = socket.create_connection(("127.0.0.1", b.port))
        self.sock.settimeout(DEADLINE)
        self.buf = b""
        body = struct.pack("!I", 196608)
        for k, v in {"user": user, "database": dbname, **params}.items():
            body += k.encode() + b"\0" + v.encode() + b"\0"
        body += b"\0"
        self.sock.sendall(struct.pack("!I", len(body) + 4) + body)
        self.login = self.messages()
        b._connections.append(self)

    def close(self):
        self.sock.close()

    def _recv(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def read(self):
        """(type, body) of the next message, or ("EOF", b"") when the server closed."""
        try:
            head = self._recv(5)
            typ, length = chr(head[0]), struct.unpack("!I", head[1:])[0]
            return typ, self._recv(length - 4)
        except (EOFError, ConnectionResetError):
            return "EOF", b""

    def messages(self):
        """Messages up to and including ReadyForQuery, EOF, or an
        authentication request that needs an answer."""
        out = []
        while True:
            m = self.read()
            out.append(m)
            if m[0] in ("Z", "EOF") or (m[0] == "R" and m[1][:4] != b"\0\0\0\0"):
                return out

    def until_eof(self):
        out = []
        while not out or out[-1][0] != "EOF":
            out.append(self.read())
        return out

    def send(self, typ, body):
        self.sock.sendall(typ.encode() + struct.pack("!I", len(body) + 4) + body)

    def send_query(self, sql):
        self.send("Q", sql.encode() + b"\0")

    def query(self, sql):
        self.send_query(sql)
        return self.messages()

    def pending(self, timeout=0.3):
        """True if the server has sent something we have not read."""
        return bool(self.buf) or bool(select.select([self.sock], [], [], timeout)[0])


def fields(body):
    """The fields of an ErrorResponse/NoticeResponse as {code: text}."""
    out = {}
    for part in body.split(b"\0"):
        if part:
            out[chr(part[0])] = part[1:].decode()
    return out


def tags(msgs):
    return [m[1].rstrip(b"\0").decode() for m in msgs if m[0] == "C"]


def errors(msgs):
    return [fields(m[1]) for m in msgs if m[0] == "E"]


def ready(msgs):
    return msgs[-1] == ("Z", b"I")


def run_psql(b, args, user="pgbouncer", as_pooler_user=False, run_as=None, unix=False):
    cmd = ["psql", "-X", "-w", "-h", str(b.dir) if unix else "127.0.0.1", "-p", str(b.port), "-U", user,
           "-d", "pgbouncer", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    kw = run_as.popen_kwargs() if as_pooler_user else {}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=DEADLINE, **kw)


# ---------------------------------------------------------------------------
# access


def test_admin_user_has_full_access(bouncer):
    b = bouncer()
    admin = console(b)
    for name in SHOW_COLUMNS:
        admin.execute(f"SHOW {name}")
    assert admin.execute("PAUSE").statusmessage == "PAUSE"
    assert admin.execute("RESUME").statusmessage == "RESUME"
    assert admin.execute("RECONNECT").statusmessage == "RECONNECT"


def test_stats_user_is_read_only(bouncer):
    b = bouncer(ini_overrides={"stats_users": "watcher"}, users_txt=users_txt("pgbouncer", "postgres", "watcher"))
    ro = console(b, user="watcher")
    for name in READ_ONLY_SHOWS:
        cur = ro.execute(f"SHOW {name}")
        assert cur.statusmessage == "SHOW", name
    for command in ADMIN_ONLY:
        expect_error(ro, command, "admin access needed")
    # nothing of that happened
    assert kv(ro, "SHOW STATE") == {"active": "yes", "paused": "no", "suspended": "no"}
    assert row(ro, "SHOW CONFIG", key="default_pool_size")["value"] == "20"
    # the fake parameters are open to every console user
    seen = notices(ro)
    assert ro.execute("SET datestyle = 'ISO'").statusmessage == "SET"
    assert seen == [("NOTICE", "00000", "SET ignored", None)]
    assert ro.execute("SHOW client_encoding").fetchall() == [("UTF-8",)]


def test_stats_user_cannot_kill_client(bouncer):
    b = bouncer(ini_overrides={"stats_users": "watcher"}, users_txt=users_txt("pgbouncer", "postgres", "watcher"))
    victim = pooled(b)
    victim.execute("SELECT 1")
    ro = console(b, user="watcher")
    client = row(ro, "SHOW CLIENTS", database="postgres")
    expect_error(ro, f"KILL_CLIENT {client['id']}", "admin access needed")
    assert victim.execute("SELECT 1").fetchone() == (1,)


def test_user_in_neither_list_is_not_allowed(bouncer):
    b = bouncer(ini_overrides={"stats_users": "watcher"}, users_txt=users_txt("pgbouncer", "postgres", "watcher"))
    expect_login_failure(b, "not allowed", dbname="pgbouncer", user="postgres")
    # the same user may use a normal database
    assert pooled(b, user="postgres").execute("SELECT 1").fetchone() == (1,)


def test_admin_users_list_is_split_on_commas_and_spaces(bouncer):
    b = bouncer(ini_overrides={"admin_users": "alice, pgbouncer bob", "stats_users": "carol,dave"},
                users_txt=users_txt("pgbouncer", "postgres", "alice", "Alice", "bob", "carol", "dave"))
    for user in ("alice", "bob", "pgbouncer"):
        assert console(b, user=user).execute("RECONNECT").statusmessage == "RECONNECT"
    for user in ("carol", "dave"):
        expect_error(console(b, user=user), "RECONNECT", "admin access needed")
    # membership is case-sensitive
    expect_login_failure(b, "not allowed", dbname="pgbouncer", user="Alice")


def test_password_is_checked_before_console_access(bouncer):
    b = bouncer(ini_overrides={"auth_type": "md5", "stats_users": "watcher"},
                users_txt='"pgbouncer" "secret"\n"watcher" "w"\n"postgres" "postgres"\n')
    expect_login_failure(b, "password authentication failed", dbname="pgbouncer", user="pgbouncer",
                         password="wrong")
    admin = console(b, password="secret")
    assert admin.execute("RECONNECT").statusmessage == "RECONNECT"
    ro = console(b, user="watcher", password="w")
    expect_error(ro, "RECONNECT", "admin access needed")
    expect_login_failure(b, "not allowed", dbname="pgbouncer", user="postgres", password="postgres")


def test_auth_type_any(bouncer):
    b = bouncer(ini_overrides={"auth_type": "any"}, users_txt="")
    # admin_users get admin rights without any password or auth_file entry
    admin = console(b)
    assert admin.execute("RECONNECT").statusmessage == "RECONNECT"
    # anybody else gets read-only access
    anyone = console(b, user="somebody")
    assert rows(anyone, "SHOW VERSION") == [{"version": f"PgBouncer {VERSION}"}]
    expect_error(anyone, "PAUSE", "admin access needed")
    assert row(admin, "SHOW CLIENTS", user="somebody")["database"] == "pgbouncer"


def test_same_uid_unix_socket_user_pgbouncer_needs_no_password(bouncer, run_as):
    if os.geteuid() != 0 and run_as.uid != os.geteuid():
        pytest.skip("cannot run a client as the pooler's OS user")
    # md5 with a password nobody knows: only the peer-uid rule can let psql in
    b = bouncer(ini_overrides={"auth_type": "md5"}, users_txt='"pgbouncer" "unguessable"\n"postgres" "x"\n')
    out = run_psql(b, ["-c", "RECONNECT"], as_pooler_user=True, run_as=run_as, unix=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "RECONNECT"
    # another user over the same socket goes through normal authentication
    out = run_psql(b, ["-c", "SHOW VERSION"], user="postgres", as_pooler_user=True, run_as=run_as, unix=True)
    assert out.returncode != 0
    assert "password" in out.stderr
    # and so does pgbouncer over TCP
    out = run_psql(b, ["-c", "SHOW VERSION"], as_pooler_user=True, run_as=run_as)
    assert out.returncode != 0
    assert "password" in out.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect with a uid other than the pooler's")
def test_other_uid_on_unix_socket_gets_no_free_pass(bouncer):
    b = bouncer(ini_overrides={"auth_type": "md5"}, users_txt='"pgbouncer" "unguessable"\n')
    # we are root, the pooler is not: the socket peer uid differs
    raw = Raw(b, unix=True)
    assert raw.login[0][0] == "R"
    assert struct.unpack("!I", raw.login[0][1][:4])[0] == 5  # asked for an md5 password


def test_only_admin_users_are_exempt_from_max_db_client_connections(bouncer):
    b = bouncer(ini_overrides={"max_db_client_connections": 1, "stats_users": "watcher"},
                users_txt=users_txt("pgbouncer", "postgres", "watcher"))
    first = console(b, user="watcher")
    expect_login_failure(b, "client connections exceeded (max_db_client_connections)", dbname="pgbouncer",
                         user="watcher")
    admins = [console(b), console(b)]
    for conn in [first] + admins:
        version_ok(conn)


def test_stats_users_are_held_to_max_user_client_connections(bouncer):
    """Counted over all workers, like the pooled databases; admin_users are exempt on the console."""
    b = bouncer(ini_overrides={"max_user_client_connections": 1, "stats_users": "watcher",
                               "admin_users": "pgbouncer", "min_workers": 2, "max_workers": 2},
                users_txt=users_txt("pgbouncer", "postgres", "watcher"))
    first = console(b, user="watcher")
    for _ in range(3):
        expect_login_failure(b, "client connections exceeded (max_user_client_connections)", dbname="pgbouncer",
                             user="watcher")
    admins = [console(b), console(b)]
    for conn in [first] + admins:
        version_ok(conn)
    first.close()

    def watcher_gets_in():
        try:
            version_ok(console(b, user="watcher"))
            return True
        except psycopg.OperationalError:
            return False

    wait_for(watcher_gets_in, "the stats user's slot to be free")


def test_admin_db_is_exempt_from_max_client_conn(bouncer):
    b = bouncer(ini_overrides={"max_client_conn": 1})
    first = pooled(b)
    expect_login_failure(b, "no more connections allowed (max_client_conn)")
    admin = console(b)
    version_ok(admin)
    first.execute("SELECT 1")


# ---------------------------------------------------------------------------
# login and the console's pool


def test_welcome_parameters(bouncer):
    b = bouncer()
    raw = Raw(b, application_name="my-app")
    params = [tuple(x.decode() for x in m[1].split(b"\0")[:2]) for m in raw.login if m[0] == "S"]
    assert params == [
        ("server_version", f"{VERSION}/bouncer"),
        ("client_encoding", "UTF8"),
        ("server_encoding", "UTF8"),
        ("DateStyle", "ISO"),
        ("TimeZone", "GMT"),
        ("standard_conforming_strings", "on"),
        ("is_superuser", "on"),
        ("application_name", "my-app"),
    ]
    assert [m[0] for m in raw.login] == ["R"] + ["S"] * len(params) + ["K", "Z"]
    assert raw.login[0][1] == struct.pack("!I", 0)
    assert ready(raw.login)

    conn = console(b)
    assert conn.info.parameter_status("server_version") == f"{VERSION}/bouncer"
    assert conn.info.parameter_status("client_encoding") == "UTF8"
    assert conn.info.parameter_status("is_superuser") == "on"
    assert conn.info.parameter_status("application_name") is None


def test_console_pool_is_pgbouncer_pgbouncer_statement(bouncer):
    b = bouncer(ini_overrides={"stats_users": "watcher"}, users_txt=users_txt("pgbouncer", "postgres", "watcher"))
    admin = console(b)
    ro = console(b, user="watcher")
    pools = [r for r in rows(admin, "SHOW POOLS") if r["database"] == "pgbouncer"]
    assert len(pools) == 1, pools
    p = pools[0]
    assert (p["user"], p["pool_mode"], p["cl_active"], p["cl_waiting"], p["sv_active"], p["load_balance_hosts"]) == (
        "pgbouncer", "statement", 2, 0, 0, None)
    db = row(admin, "SHOW DATABASES", name="pgbouncer")
    assert (db["host"], db["port"], db["database"], db["force_user"], db["pool_mode"], db["current_client_connections"],
            db["paused"], db["disabled"]) == (None, b.port, "pgbouncer", "pgbouncer", "statement", 2, 0, 0)
    assert "pgbouncer" in [r["database"] for r in rows(ro, "SHOW STATS")]
    # the users of the console are counted as what they logged in as
    users = {r["name"]: r for r in rows(admin, "SHOW USERS")}
    assert users["watcher"]["current_client_connections"] == 1
    assert users["pgbouncer"]["current_client_connections"] == 1


def test_console_database_row_ignores_global_pool_settings(bouncer, either_bin):
    """The console's row in SHOW DATABASES: pool size 2, and no
    min_pool_size or reserve_pool_size of its own, whatever the globals
    say (PgBouncer shows 0 for both); the limits are the global ones."""
    ini = {"min_pool_size": 2, "reserve_pool_size": 3, "max_db_connections": 11, "server_lifetime": 99}
    if not either_bin.peer:
        ini["max_workers"] = 1
    b = bouncer(ini_overrides=ini, binary=either_bin)
    db = row(console(b), "SHOW DATABASES", name="pgbouncer")
    assert (db["pool_size"], db["min_pool_size"], db["reserve_pool_size"], db["server_lifetime"],
            db["max_connections"]) == (2, 0, 0, 99, 11)


def test_console_sees_itself_in_show_clients(bouncer):
    b = bouncer()
    admin = console(b, application_name="console-app")
    me = row(admin, "SHOW CLIENTS", port=local_port(admin))
    assert (me["type"], me["user"], me["database"], me["replication"], me["addr"], me["local_addr"],
            me["local_port"], me["link"], me["remote_pid"], me["tls"], me["application_name"],
            me["close_needed"], me["prepared_statements"]) == (
        "C", "pgbouncer", "pgbouncer", "none", "127.0.0.1", "127.0.0.1", b.port, "", 0, "", "console-app", 0, 0)
    assert me["ptr"].startswith("0x")
    assert me["id"] > 0


def test_unix_socket_console_in_show_clients(bouncer):
    b = bouncer()
    raw = Raw(b, unix=True)
    assert ready(raw.login)
    conn = console(b)
    me = row(conn, "SHOW CLIENTS", addr="unix")
    assert (me["port"], me["local_addr"], me["local_port"], me["remote_pid"], me["database"]) == (
        b.port, "unix", b.port, os.getpid(), "pgbouncer")


def test_timestamps(bouncer):
    b = bouncer()
    conn = console(b)
    me = row(conn, "SHOW CLIENTS", port=local_port(conn))
    stamp = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+$")
    assert stamp.match(me["connect_time"]), me["connect_time"]
    assert stamp.match(me["request_time"]), me["request_time"]


# ---------------------------------------------------------------------------
# grammar and protocol


@pytest.mark.parametrize("command", ["SHOW VERSION", "show version", "Show Version;", "  sHoW   VeRsIoN  ;  ",
                                     "SELECT version", "select VERSION;", 'SHOW "VERSION"'])
def test_keywords_are_case_insensitive(bouncer, command):
    b = bouncer()
    conn = console(b)
    cur = conn.execute(command)
    assert cur.statusmessage == "SHOW"
    assert cur.fetchall() == [(f"PgBouncer {VERSION}",)]


@pytest.mark.parametrize("command", ["FOO", "SHOW", "SHOW NOSUCH", "SHOW VERSION; SHOW HELP", "SHOW VERSION extra",
                                     "PAUSE postgres extra", "SELECT 1", "SHOW 'version'", "RELOAD now",
                                     "SUSPEND now", "SHUTDOWN NOW", "SET default_pool_size 7", "SHOW VERSION;;"])
def test_invalid_command(bouncer, command):
    b = bouncer()
    expect_error(console(b), command, f"invalid command '{command}', use SHOW HELP;")


def test_errors_carry_only_severity_code_and_message(bouncer):
    b = bouncer()
    raw = Raw(b)
    msgs = raw.query("NO SUCH COMMAND")
    assert [m[0] for m in msgs] == ["E", "Z"]
    assert errors(msgs) == [{"S": "ERROR", "C": "08P01", "M": "invalid command 'NO SUCH COMMAND', use SHOW HELP;"}]
    assert ready(msgs)
    assert tags(raw.query("SHOW VERSION")) == ["SHOW"]
    b.wait_log(r"ERROR .*invalid command 'NO SUCH COMMAND', use SHOW HELP;")


def test_overlong_words_are_bad_arguments(bouncer):
    b = bouncer()
    conn = console(b)
    expect_error(conn, "A" * 16, "bad arguments")
    expect_error(conn, "A" * 15, f"invalid command '{'A' * 15}', use SHOW HELP;")
    expect_error(conn, "PAUSE " + "d" * 64, "bad arguments")
    expect_error(conn, "PAUSE " + "d" * 63, "no such database: " + "d" * 63)
    expect_error(conn, "SET " + "k" * 64 + " = 1", "bad arguments")
    expect_error(conn, "SET no_such_key = '" + "v" * 256 + "'", "bad arguments")
    expect_error(conn, "SET no_such_key = '" + "v" * 255 + "'", "SET failed")


def test_arguments_are_not_case_folded(bouncer):
    b = bouncer()
    conn = console(b)
    expect_error(conn, "PAUSE POSTGRES", "no such database: POSTGRES")
    assert conn.execute('PAUSE "postgres"').statusmessage == "PAUSE"
    assert conn.execute("RESUME postgres").statusmessage == "RESUME"


def test_quoted_identifier_with_doubled_quote(bouncer, pg):
    b = bouncer(databases={"'we\"ird'": pg.connstr("postgres"), "postgres": pg.connstr("postgres")})
    conn = console(b)
    assert conn.execute('DISABLE "we""ird"').statusmessage == "DISABLE"
    assert row(conn, "SHOW DATABASES", name='we"ird')["disabled"] == 1


def test_extended_protocol_is_refused_and_closes(bouncer):
    b = bouncer()
    conn = console(b)
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SHOW %s", ["VERSION"])
    assert info.value.diag.message_primary == "extended query protocol not supported by admin console"
    with pytest.raises(psycopg.OperationalError):
        conn.execute("SHOW VERSION")

    conn = b.admin()  # console() would disable prepare=True
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SHOW VERSION", prepare=True)
    assert info.value.diag.message_primary == "extended query protocol not supported by admin console"

    raw = Raw(b)
    raw.send("P", b"\0SHOW VERSION\0\0\0")
    raw.send("S", b"")
    msgs = raw.until_eof()
    assert msgs[0] == ("E", b"SERROR\0C08P01\0Mextended query protocol not supported by admin console\0\0")
    # a ReadyForQuery and FATAL "bad packet" follow the error (PgBouncer's), no answer to the Sync
    assert [m[0] for m in msgs[1:]] == ["Z", "E", "EOF"]
    assert msgs[2] == ("E", b"SFATAL\0C08P01\0Mbad packet\0\0")


@pytest.mark.parametrize("mtype,body", [("F", b"\0\0\0\0\0\0\0\0\0\0"), ("S", b""), ("H", b""),
                                        ("D", b"S\0"), ("C", b"S\0")])
def test_unknown_message_type_is_refused_and_closes(bouncer, mtype, body):
    """Only Parse, Bind and Execute are "extended query protocol"; any other
    message but Query and Terminate, Sync included, is an unsupported type."""
    b = bouncer()
    raw = Raw(b)
    raw.send(mtype, body)
    msgs = raw.until_eof()
    want = f"unsupported packet type for admin console: {ord(mtype)}".encode()
    assert msgs[0] == ("E", b"SERROR\0C08P01\0M" + want + b"\0\0")
    assert [m[0] for m in msgs[1:]] == ["Z", "E", "EOF"]
    assert msgs[2] == ("E", b"SFATAL\0C08P01\0Mbad packet\0\0")


def test_terminate_closes_quietly(bouncer):
    b = bouncer()
    raw = Raw(b)
    raw.send("X", b"")
    assert raw.read() == ("EOF", b"")
    wait_for(lambda: len(rows(console(b), "SHOW CLIENTS")) == 1, "the console client to be gone")


# ---------------------------------------------------------------------------
# SHOW: columns, types, and what the rows say


def test_show_columns_and_types(bouncer):
    b = bouncer()
    client = pooled(b)
    client.execute("SELECT 1")
    conn = console(b)
    problems = []
    for name, expected in SHOW_COLUMNS.items():
        for command in (f"SHOW {name}", f"SHOW {name.lower()}"):
            cur = conn.execute(command)
            got = [(d.name, d.type_code) for d in cur.description]
            if got != expected:
                problems.append(f"{command}: {got} != {expected}")
            sizes = [(d.name, d.internal_size) for d in cur.description]
            if sizes != [(n, TYPLEN[t]) for n, t in expected]:
                problems.append(f"{command}: typlen {sizes}")
            if cur.statusmessage != "SHOW":
                problems.append(f"{command}: tag {cur.statusmessage!r}")
    assert not problems, "\n".join(problems)


def test_show_help(bouncer):
    b = bouncer()
    conn = console(b)
    seen = notices(conn)
    cur = conn.execute("SHOW HELP")
    assert cur.statusmessage == "SHOW"
    assert cur.description is None
    assert len(seen) == 1
    severity, sqlstate, message, detail = seen[0]
    assert (severity, sqlstate, message) == ("NOTICE", "00000", "Console usage")
    for word in ("SHOW HELP", "CONFIG", "DATABASES", "POOLS", "CLIENTS", "SERVERS", "FDS", "STATS", "SET key = arg",
                 "RELOAD", "PAUSE", "RESUME", "DISABLE", "ENABLE", "RECONNECT", "KILL", "KILL_CLIENT", "SUSPEND",
                 "SHUTDOWN", "WAIT_FOR_CLIENTS", "WAIT_CLOSE"):
        assert word in detail


# SHOW HELP's detail: PgBouncer's "Console usage" layout, each SHOW subject once
HELP_DETAIL = """
\tSHOW HELP|CONFIG|USERS|DATABASES|POOLS|CLIENTS|SERVERS|VERSION
\tSHOW PEERS|PEER_POOLS
\tSHOW WORKERS|SCALER
\tSHOW FDS|SOCKETS|ACTIVE_SOCKETS|LISTS|MEM|STATE
\tSHOW DNS_HOSTS|DNS_ZONES
\tSHOW STATS|STATS_TOTALS|STATS_AVERAGES|TOTALS
\tSET key = arg
\tRELOAD
\tPAUSE [<db>]
\tRESUME [<db>]
\tDISABLE <db>
\tENABLE <db>
\tRECONNECT [<db>]
\tKILL [<db>]
\tKILL_CLIENT <client_id>
\tSUSPEND
\tSHUTDOWN
\tSHUTDOWN WAIT_FOR_SERVERS|WAIT_FOR_CLIENTS
\tWAIT_CLOSE [<db>]"""


@pytest.mark.parametrize("workers", [1, 2])
def test_show_help_lists_each_subject_once_and_each_works(bouncer, workers):
    b = bouncer(ini_overrides={"min_workers": workers, "max_workers": workers})
    conn = console(b)
    wait_for(lambda: [r["state"] for r in rows(conn, "SHOW WORKERS")] == ["active"] * workers,
             f"{workers} active workers")
    seen = notices(conn)
    conn.execute("SHOW HELP")
    detail = seen[0][3]
    assert detail == HELP_DETAIL
    listed = [name for line in detail.splitlines() if line.startswith("\tSHOW ")
              for name in line[len("\tSHOW "):].split("|")]
    assert sorted(listed) == sorted(set(listed)), f"listed twice: {listed}"
    assert set(listed) == set(SHOW_COLUMNS) | {"HELP", "WORKERS", "SCALER"}
    for name in listed:
        cur = conn.execute(f"SHOW {name}")
        assert cur.statusmessage == "SHOW", name
        if name in SHOW_COLUMNS:
            assert [(d.name, d.type_code) for d in cur.description] == SHOW_COLUMNS[name], name
    assert len(seen) == 2  # HELP's, run twice; no other notice (e.g. a worker left out)


def test_psql_show_help_and_tables(bouncer):
    b = bouncer()
    out = run_psql(b, ["-c", "SHOW HELP"])
    assert out.returncode == 0, out.stderr
    assert "NOTICE:  Console usage" in out.stderr
    assert "DETAIL:" in out.stderr and "SHOW HELP" in out.stderr
    out = run_psql(b, ["-c", "SHOW VERSION"])
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[2].strip() == f"PgBouncer {VERSION}"
    assert "(1 row)" in out.stdout
    for command in ("SHOW DATABASES", "SHOW POOLS", "SHOW CLIENTS", "SHOW CONFIG", "SHOW STATS", "SHOW USERS"):
        out = run_psql(b, ["-c", command])
        assert out.returncode == 0, f"{command}: {out.stderr}"
        assert out.stderr == ""
    out = run_psql(b, ["-A", "-t", "-c", "SHOW DATABASES"])
    assert [line.split("|")[0] for line in out.stdout.splitlines()] == ["pgbouncer", "postgres"]


def test_show_version(bouncer):
    b = bouncer()
    assert rows(console(b), "SHOW VERSION") == [{"version": f"PgBouncer {VERSION}"}]


def test_show_config_rows(bouncer, either_bin):
    """Every row's default and changeable, and values as PgBouncer 1.25.2
    prints them: unix_socket_mode's value in decimal, its default "0777"."""
    long_query = "SELECT usename, passwd FROM pg_shadow WHERE usename = $1" + " AND true" * 200
    b = bouncer(ini_overrides={"default_pool_size": 11, "query_timeout": "0.5", "unix_socket_mode": "0700",
                               "auth_query": long_query, "application_name_add_host": 5},
                binary=either_bin)
    conf = rows(console(b), "SHOW CONFIG")
    skip = OPTIONAL_CONFIG_KEYS | EXTENSION_CONFIG_KEYS
    got = [(r["key"], r["default"], r["changeable"]) for r in conf if r["key"] not in skip]
    # login_notify_message came after 1.25.2
    assert got == [r for r in CONFIG_ROWS if not (either_bin.peer and r[0] == "login_notify_message")]
    values = {r["key"]: r["value"] for r in conf}
    assert values["listen_port"] == str(b.port)
    assert values["listen_addr"] == "127.0.0.1"
    assert values["default_pool_size"] == "11"
    assert values["query_timeout"] == "0.5"
    assert values["unix_socket_mode"] == "448"
    assert values["admin_users"] == "pgbouncer"
    assert values["auth_type"] == "trust"
    assert values["pool_mode"] == "session"
    assert values["server_lifetime"] == "3600"
    assert values["auth_user"] is None
    assert values["conffile"] == str(b.ini_path)
    assert values["auth_query"] == long_query  # in full, however long
    assert values["application_name_add_host"] == "5"  # a bool as the number given


def test_set_reloadable_parameter(bouncer):
    b = bouncer()
    conn = console(b)
    assert conn.execute("SET default_pool_size = 7").statusmessage == "SET default_pool_size=7"
    assert row(conn, "SHOW CONFIG", key="default_pool_size")["value"] == "7"
    assert row(conn, "SHOW DATABASES", name="postgres")["pool_size"] == 7
    assert conn.execute("set query_timeout to '0.5'").statusmessage == "SET query_timeout=0.5"
    assert row(conn, "SHOW CONFIG", key="query_timeout")["value"] == "0.5"
    assert conn.execute("SET pool_mode = transaction").statusmessage == "SET pool_mode=transaction"
    assert row(conn, "SHOW CONFIG", key="pool_mode")["value"] == "transaction"
    assert conn.execute("SET server_reset_query = 'SELECT ''x'''").statusmessage == "SET server_reset_query=SELECT 'x'"
    assert row(conn, "SHOW CONFIG", key="server_reset_query")["value"] == "SELECT 'x'"
    # RELOAD brings back the file's values
    conn.execute("RELOAD")
    assert row(conn, "SHOW CONFIG", key="default_pool_size")["value"] == "20"
    assert row(conn, "SHOW CONFIG", key="pool_mode")["value"] == "session"


def test_set_non_reloadable_parameter_changes_nothing(bouncer):
    b = bouncer()
    conn = console(b)
    assert conn.execute("SET listen_port = 1234").statusmessage == "SET listen_port=1234"
    assert row(conn, "SHOW CONFIG", key="listen_port")["value"] == str(b.port)
    assert conn.execute("SET pkt_buf = 8192").statusmessage == "SET pkt_buf=8192"
    assert row(conn, "SHOW CONFIG", key="pkt_buf")["value"] == "4096"


@pytest.mark.parametrize("command", ["SET no_such_key = 1", "SET default_pool_size = 'abc'",
                                     "SET pool_mode = bogus", "SET log_stats = 'yes'", "SET query_timeout = '10s'"])
def test_set_failed(bouncer, command):
    b = bouncer()
    conn = console(b)
    expect_error(conn, command, "SET failed")
    assert row(conn, "SHOW CONFIG", key="default_pool_size")["value"] == "20"
    assert row(conn, "SHOW CONFIG", key="pool_mode")["value"] == "session"


def test_fake_parameters(bouncer):
    b = bouncer()
    conn = console(b)
    for name, value in FAKE_PARAMS.items():
        for spelled in (name, name.upper()):
            cur = conn.execute(f"SHOW {spelled}")
            assert [(d.name, d.type_code) for d in cur.description] == [(name, TEXT)]
            assert cur.fetchall() == [(value,)]
    seen = notices(conn)
    for name in FAKE_PARAMS:
        assert conn.execute(f"SET {name} = 'whatever'").statusmessage == "SET"
    assert seen == [("NOTICE", "00000", "SET ignored", None)] * 5
    assert conn.execute("SHOW timezone").fetchall() == [("GMT",)]


def test_stats_after_queries(bouncer):
    b = bouncer()
    conn = console(b)
    client = pooled(b)
    for _ in range(3):
        client.execute("SELECT 1")
    with client.transaction():
        client.execute("SELECT 2")
        client.execute("SELECT 3")
    stats = row(conn, "SHOW STATS", database="postgres")
    assert stats["total_query_count"] == 7  # BEGIN, 2 selects, COMMIT + 3
    assert stats["total_xact_count"] == 4
    assert stats["total_server_assignment_count"] == 1  # session mode: once
    assert stats["total_received"] > 0 and stats["total_sent"] > 0
    assert stats["total_query_time"] > 0 and stats["total_xact_time"] > 0
    assert all(isinstance(v, Decimal) for k, v in stats.items() if k != "database")
    totals = row(conn, "SHOW STATS_TOTALS", database="postgres")
    assert (totals["query_count"], totals["xact_count"], totals["bytes_received"], totals["bytes_sent"]) == (
        stats["total_query_count"], stats["total_xact_count"], stats["total_received"], stats["total_sent"])
    averages = row(conn, "SHOW STATS_AVERAGES", database="postgres")
    # the rates move with the clock; the times per query do not
    assert averages["query_time"] == stats["avg_query_time"]
    assert [r["database"] for r in rows(conn, "SHOW STATS")] == ["pgbouncer", "postgres"]
    t = rows(conn, "SHOW TOTALS")
    assert [r["name"] for r in t] == TOTALS_ROWS
    tv = {r["name"]: r["value"] for r in t}
    all_stats = rows(conn, "SHOW STATS")
    assert tv["total_query_count"] == sum(r["total_query_count"] for r in all_stats)
    assert tv["total_client_bytes"] == sum(r["total_received"] for r in all_stats)
    # a later query keeps counting
    client.execute("SELECT 4")
    assert row(conn, "SHOW STATS", database="postgres")["total_query_count"] == 8


def test_xact_counted_at_its_first_query(bouncer, either_bin):
    """A transaction is in total_xact_count from its first query on, as in
    PgBouncer; its time is added when it ends."""
    b = bouncer(binary=either_bin)
    conn = console(b)
    client = pooled(b)
    client.execute("BEGIN")
    client.execute("SELECT 1")
    during = row(conn, "SHOW STATS", database="postgres")
    assert (during["total_xact_count"], during["total_query_count"], during["total_xact_time"]) == (1, 2, 0)
    client.execute("COMMIT")
    after = row(conn, "SHOW STATS", database="postgres")
    assert (after["total_xact_count"], after["total_query_count"]) == (1, 3)
    assert after["total_xact_time"] > 0


@pytest.mark.parametrize("workers", [1, 2])
def test_console_commands_count_in_totals(bouncer, either_bin, workers):
    """The console is the `pgbouncer` database in SHOW STATS and TOTALS, as
    PgBouncer counts it: a console connection's first command is one
    transaction and one query, later ones count nothing, and no time or
    bytes accrue. With two workers each command goes to both; it still
    counts once (PgBouncer 1.25.2 has one process)."""
    if either_bin.peer and workers > 1:
        pytest.skip("PgBouncer 1.25.2 has no workers")
    b = bouncer(binary=either_bin,
                ini_overrides=None if either_bin.peer else {"min_workers": workers, "max_workers": workers})
    if workers > 1:
        two_workers(b)
        mark = sum(r["total_xact_count"] for r in rows(console(b), "SHOW STATS") if r["database"] == "pgbouncer")
    else:
        mark = 0
    client = pooled(b)
    for _ in range(4):
        client.execute("SELECT 1")
    for _ in range(2):
        with client.transaction():  # BEGIN, SELECT, COMMIT
            client.execute("SELECT 2")
    for command in ("SHOW VERSION", "SHOW POOLS", "SHOW STATE", "SHOW LISTS"):
        with console(b) as one:  # one command per connection, as psql -c gives
            one.execute(command)
    conn = console(b)
    for command in ("SHOW VERSION", "SHOW POOLS", "SHOW STATE"):
        conn.execute(command)
    totals = kv(conn, "SHOW TOTALS")
    stats = {r["database"]: r for r in rows(conn, "SHOW STATS")}
    assert (totals["total_xact_count"], totals["total_query_count"]) == (4 + 2 + 4 + 1 + mark, 4 + 6 + 4 + 1 + mark)
    pgb = stats["pgbouncer"]
    assert (pgb["total_xact_count"], pgb["total_query_count"]) == (5 + mark, 5 + mark)
    assert [pgb[k] for k in ("total_server_assignment_count", "total_received", "total_sent", "total_xact_time",
                             "total_query_time", "total_wait_time")] == [0] * 6
    assert (stats["postgres"]["total_xact_count"], stats["postgres"]["total_query_count"]) == (6, 10)


def test_query_and_xact_time_include_the_wait_for_a_server(bouncer):
    """A query starts when the client sends it, not when it gets a server
    (spec/admin.md §4, counting rules): the time a request spent queued
    counts in total_query_time and total_xact_time as well as in
    total_wait_time, as with PgBouncer."""
    b = bouncer(ini_overrides={"pool_mode": "transaction", "default_pool_size": 1})
    conn = console(b)
    holder = Raw(b, user="postgres", dbname="postgres")
    assert holder.query("BEGIN")[-1] == ("Z", b"T")
    waiter = Raw(b, user="postgres", dbname="postgres")
    before = row(conn, "SHOW STATS", database="postgres")["total_wait_time"]  # the first login's
    waiter.send_query("SELECT 1")
    wait_for(lambda: row(conn, "SHOW POOLS", database="postgres")["maxwait"] >= 1,
             "the second client to wait a second for the server")
    assert ready(holder.query("COMMIT"))
    assert ready(waiter.messages())
    s = row(conn, "SHOW STATS", database="postgres")
    assert s["total_query_count"] == 3 and s["total_xact_count"] == 2
    waited = s["total_wait_time"] - before
    assert waited >= 1000000
    # the waiter's query lasted its wait and more; the holder's transaction
    # outlasted that wait, the waiter's began with it
    assert s["total_query_time"] >= waited
    assert s["total_xact_time"] >= 2 * waited


@pytest.mark.parametrize("workers", [1, 2])
def test_averages_cover_the_current_period(bouncer, workers):
    """The avg_* columns are the counts since the snapshot taken at the start
    of the previous stats_period (at start, within the first) divided by the
    time since it (spec/admin.md §4): activity shows in them at once, not
    only once a stats_period has passed, as PgBouncer shows it."""
    b = bouncer(ini_overrides={"stats_period": 3600, "min_workers": workers, "max_workers": workers})
    conn = console(b)
    clients = [pooled(b) for _ in range(2)]
    for n in range(100):
        clients[n % 2].execute("SELECT 1")
    s = row(conn, "SHOW STATS", database="postgres")
    # 100 queries within well under 100 s of the start
    assert s["avg_query_count"] >= 1 and s["avg_xact_count"] >= 1
    assert s["avg_recv"] > 0 and s["avg_sent"] > 0
    assert s["avg_query_time"] > 0 and s["avg_xact_time"] > 0
    assert s["avg_client_login_count"] >= 0
    a = row(conn, "SHOW STATS_AVERAGES", database="postgres")
    assert a["query_count"] >= 1 and a["query_time"] > 0
    t = kv(conn, "SHOW TOTALS")
    assert t["avg_query_count"] >= 1 and t["avg_client_bytes"] > 0


def test_login_waiting_for_the_first_server_counts_as_wait_time(bouncer):
    """The first client of a pool waits (state waiting, spec/behaviours.md
    §3.1) until the pool's first server has logged in: that wait goes into
    total_wait_time as a queued request's does, as PgBouncer counts it."""
    b = bouncer()
    conn = console(b)
    pooled(b)
    s = row(conn, "SHOW STATS", database="postgres")
    assert s["total_query_count"] == 0 and s["total_server_assignment_count"] == 0
    assert s["total_wait_time"] > 0


def test_client_logins_are_counted(bouncer):
    """Successful logins per database (the post-1.25.2 client_login_count
    columns, spec/admin.md §4); a refused login counts nowhere."""
    b = bouncer(ini_overrides={"auth_type": "md5", "stats_period": 1, "min_workers": 2, "max_workers": 2})
    conn = console(b, password="pgbouncer")
    for _ in range(3):
        pooled(b, password="postgres").close()
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        pooled(b, password="wrong")
    stats = row(conn, "SHOW STATS", database="postgres")
    assert stats["total_client_login_count"] == 3
    assert row(conn, "SHOW STATS", database="pgbouncer")["total_client_login_count"] >= 1  # this console
    assert row(conn, "SHOW STATS_TOTALS", database="postgres")["client_login_count"] == 3
    tv = kv(conn, "SHOW TOTALS")
    assert tv["total_client_login_count"] == sum(r["total_client_login_count"] for r in rows(conn, "SHOW STATS"))

    def averaged():
        pooled(b, password="postgres").close()
        s = row(conn, "SHOW STATS", database="postgres")
        return s["avg_client_login_count"] > 0 and s

    s = wait_for(averaged, "logins to show in avg_client_login_count")
    a = row(conn, "SHOW STATS_AVERAGES", database="postgres")
    assert a["avg_client_login_count"] >= 0
    assert kv(conn, "SHOW TOTALS")["avg_client_login_count"] >= 0
    assert s["avg_client_login_count"] > 0
    b.wait_log(r"stats: .* binds/s, \d+ client logins/s, in \d+ B/s")


def test_show_clients_servers_pools_databases(bouncer, pg):
    b = bouncer()
    conn = console(b)
    client = pooled(b, application_name="worker-1")
    # logged in but not linked: idle; no server yet
    c = row(conn, "SHOW CLIENTS", database="postgres")
    assert (c["state"], c["link"], c["user"], c["addr"], c["port"]) == ("idle", "", "postgres", "127.0.0.1",
                                                                         local_port(client))
    assert c["application_name"] == "worker-1"
    pid = backend_pid(client)
    c = row(conn, "SHOW CLIENTS", database="postgres")
    s = row(conn, "SHOW SERVERS", database="postgres")
    assert (c["state"], c["link"]) == ("active", s["ptr"])
    assert (s["type"], s["user"], s["state"], s["addr"], s["port"], s["link"], s["remote_pid"], s["close_needed"],
            s["application_name"], s["wait"], s["wait_us"]) == (
        "S", "postgres", "active", "127.0.0.1", pg.port, c["ptr"], pid, 0, "worker-1", 0, 0)
    assert s["id"] != c["id"]
    p = row(conn, "SHOW POOLS", database="postgres")
    assert (p["user"], p["cl_active"], p["cl_waiting"], p["sv_active"], p["sv_idle"], p["sv_login"], p["maxwait"],
            p["pool_mode"], p["load_balance_hosts"]) == ("postgres", 1, 0, 1, 0, 0, 0, "session", None)
    d = row(conn, "SHOW DATABASES", name="postgres")
    assert (d["host"], d["port"], d["database"], d["force_user"], d["pool_size"], d["min_pool_size"],
            d["reserve_pool_size"], d["server_lifetime"], d["pool_mode"], d["load_balance_hosts"],
            d["max_connections"], d["current_connections"], d["max_client_connections"],
            d["current_client_connections"], d["paused"], d["disabled"]) == (
        "127.0.0.1", pg.port, "postgres", None, 20, 0, 0, 3600, None, None, 0, 1, 0, 1, 0, 0)
    socks = rows(conn, "SHOW SOCKETS")
    assert {(r["type"], r["state"]) for r in socks} >= {("C", "cl_active"), ("S", "sv_active")}
    lists = kv(conn, "SHOW LISTS")
    assert list(lists) == LISTS_ROWS
    assert (lists["databases"], lists["pools"], lists["used_clients"], lists["used_servers"],
            lists["login_clients"]) == (2, 2, 2, 1, 0)
    # the session ends: the server goes back to idle
    client.close()
    wait_for(lambda: row(conn, "SHOW POOLS", database="postgres")["sv_idle"] == 1, "the server to become idle")
    assert row(conn, "SHOW SERVERS", database="postgres")["state"] == "idle"
    assert [r for r in rows(conn, "SHOW CLIENTS") if r["database"] == "postgres"] == []
    # no connection object is kept for reuse here: free_* stay 0 (doc/pgbouncer.1.md, SHOW LISTS)
    lists = kv(conn, "SHOW LISTS")
    assert (lists["used_clients"], lists["free_clients"], lists["free_servers"]) == (1, 0, 0)


def test_show_clients_wait_counts_a_running_query(bouncer):
    """SHOW CLIENTS wait/wait_us: the time since the client's current query
    started (spec/admin.md §4), also while that query runs on a server, as
    PgBouncer shows it: how a console finds long-running queries. Between
    queries it is 0."""
    b = bouncer()
    conn = console(b)
    r = Raw(b, user="postgres", dbname="postgres")
    assert ready(r.login)
    r.send_query("SELECT pg_sleep(4)")

    def running_a_second():
        c = row(conn, "SHOW CLIENTS", database="postgres")
        return c["wait"] >= 1 and c

    c = wait_for(running_a_second, "the running query's age in SHOW CLIENTS wait", timeout=4)
    assert c["state"] == "active" and c["link"] != ""
    assert 0 <= c["wait_us"] < 1000000
    assert ready(r.messages())
    c = row(conn, "SHOW CLIENTS", database="postgres")
    assert (c["wait"], c["wait_us"]) == (0, 0)


def test_show_servers_over_unix_socket_shows_the_servers_port(bouncer, pg):
    """A server reached through its socket directory is shown as unix with the server's port, not ours."""
    b = bouncer(databases={"postgres": f"host={pg.sockdir} port={pg.port} dbname=postgres"})
    conn = console(b)
    client = pooled(b)
    client.execute("SELECT 1")
    s = row(conn, "SHOW SERVERS", database="postgres")
    assert (s["addr"], s["port"]) == ("unix", pg.port)
    assert row(conn, "SHOW CLIENTS", database="postgres")["port"] == local_port(client)


def test_show_databases_overrides(bouncer, pg):
    b = bouncer(databases={
        "postgres": pg.connstr("postgres"),
        "forced": pg.connstr("postgres", user="postgres", pool_size=3, pool_mode="transaction",
                             max_db_connections=4, server_lifetime=100, reserve_pool_size=2),
        "multi": f"host=127.0.0.1,localhost port={pg.port} dbname=postgres load_balance_hosts=disable",
    })
    conn = console(b)
    assert [r["name"] for r in rows(conn, "SHOW DATABASES")] == ["forced", "multi", "pgbouncer", "postgres"]
    f = row(conn, "SHOW DATABASES", name="forced")
    assert (f["force_user"], f["pool_size"], f["pool_mode"], f["max_connections"], f["server_lifetime"],
            f["reserve_pool_size"]) == ("postgres", 3, "transaction", 4, 100, 2)
    m = row(conn, "SHOW DATABASES", name="multi")
    assert (m["host"], m["load_balance_hosts"]) == ("127.0.0.1,localhost", "disable")


def test_show_users_overrides(bouncer):
    b = bouncer(start=False)
    b.write_ini(text=b.render_ini() + "[users]\npostgres = pool_size=5 reserve_pool_size=12 pool_mode=transaction "
                "max_user_connections=9\nconfigonly = max_user_client_connections=3\n")
    b.start()
    conn = console(b)
    users = {r["name"]: r for r in rows(conn, "SHOW USERS")}
    assert list(users) == sorted(users)
    assert {"configonly", "pgbouncer", "postgres"} <= set(users)
    pu = users["postgres"]
    assert (pu["pool_size"], pu["reserve_pool_size"], pu["pool_mode"], pu["max_user_connections"],
            pu["max_user_client_connections"]) == ("        5", "       12", "transaction", 9, 0)
    cu = users["configonly"]
    assert (cu["pool_size"], cu["reserve_pool_size"], cu["pool_mode"], cu["max_user_connections"],
            cu["max_user_client_connections"]) == ("", "", None, 0, 3)
    client = pooled(b)
    client.execute("SELECT 1")
    pu = row(conn, "SHOW USERS", name="postgres")
    assert (pu["current_connections"], pu["current_client_connections"]) == (1, 1)
    assert row(conn, "SHOW POOLS", database="postgres")["pool_mode"] == "transaction"


def test_show_state(bouncer):
    b = bouncer()
    conn = console(b)
    assert rows(conn, "SHOW STATE") == [{"key": "active", "value": "yes"}, {"key": "paused", "value": "no"},
                                        {"key": "suspended", "value": "no"}]
    conn.execute("PAUSE")
    assert kv(conn, "SHOW STATE") == {"active": "no", "paused": "yes", "suspended": "no"}
    conn.execute("RESUME")
    conn.execute("SUSPEND")
    assert kv(conn, "SHOW STATE") == {"active": "no", "paused": "no", "suspended": "yes"}
    conn.execute("RESUME")
    assert kv(conn, "SHOW STATE") == {"active": "yes", "paused": "no", "suspended": "no"}


MEM_ROWS = ["user_cache", "credentials_cache", "db_cache", "peer_cache", "peer_pool_cache", "pool_cache",
            "outstanding_request_cache", "server_cache", "client_cache", "iobuf_cache", "var_list_cache",
            "server_prepared_statement_cache"]


def test_show_mem(bouncer, either_bin):
    """PgBouncer's rows, in its order; var_list_cache holds the tracked
    parameter values of the connections (doc/workers.md, "SHOW MEM")."""
    b = bouncer(binary=either_bin)
    client = pooled(b)
    assert client.execute("SELECT 1").fetchone() == (1,)
    mem = rows(console(b), "SHOW MEM")
    assert [r["name"] for r in mem] == MEM_ROWS
    for r in mem:
        assert r["size"] > 0 and r["used"] >= 0 and r["free"] >= 0
        assert r["memtotal"] == r["size"] * (r["used"] + r["free"])
    by_name = {r["name"]: r for r in mem}
    assert by_name["var_list_cache"]["used"] > 0  # the client's and its server's values
    assert by_name["client_cache"]["used"] >= 2 and by_name["server_cache"]["used"] >= 1


def test_show_peers(bouncer):
    b = bouncer(start=False)
    b.write_ini(text=b.render_ini() + "[peers]\n2 = host=127.0.0.1 port=7000 pool_size=3\n1 = host=/tmp\n")
    b.start()
    conn = console(b)
    assert rows(conn, "SHOW PEERS") == [
        {"peer_id": 1, "host": "/tmp", "port": 6432, "pool_size": 20},
        {"peer_id": 2, "host": "127.0.0.1", "port": 7000, "pool_size": 3},
    ]
    assert rows(conn, "SHOW PEER_POOLS") == []
    assert kv(conn, "SHOW LISTS")["peers"] == 2


def test_show_fds_lists_listeners_clients_and_servers(bouncer, pg):
    b = bouncer()
    conn = console(b)
    client = pooled(b)
    client.execute("SELECT 1")
    fds = rows(conn, "SHOW FDS")
    assert [r["task"] for r in fds] == ["pooler", "pooler", "client", "client", "server"]
    assert {(r["addr"], r["port"], r["user"], r["database"]) for r in fds[:2]} == {
        ("127.0.0.1", b.port, None, None), ("unix", b.port, None, None)}
    by_port = {r["port"]: r for r in fds}
    mine, theirs, server = by_port[local_port(conn)], by_port[local_port(client)], by_port[pg.port]
    assert (mine["user"], mine["database"], mine["addr"], mine["link"]) == ("pgbouncer", "pgbouncer", "127.0.0.1", 0)
    assert (theirs["user"], theirs["database"], theirs["link"]) == ("postgres", "postgres", server["fd"])
    assert (server["task"], server["user"], server["database"], server["link"]) == (
        "server", "postgres", "postgres", theirs["fd"])
    assert len({r["fd"] for r in fds}) == len(fds)


def test_show_active_sockets_lists_only_busy_ones(bouncer):
    b = bouncer()
    conn = console(b)
    pooled(b).execute("SELECT 1")
    # between queries nothing sits in any buffer but the console's own command
    assert [r["port"] for r in rows(conn, "SHOW ACTIVE_SOCKETS")] == [local_port(conn)]
    assert len(rows(conn, "SHOW SOCKETS")) >= 3


# ---------------------------------------------------------------------------
# PAUSE / RESUME / SUSPEND


def test_pause_waits_for_servers_and_queues_queries(bouncer, pool):
    b = bouncer()
    holder = pooled(b)
    holder.execute("SELECT 1")  # session mode: the server stays linked until disconnect
    raw = Raw(b)
    raw.send_query("PAUSE")
    conn = console(b)
    wait_for(lambda: kv(conn, "SHOW STATE")["paused"] == "yes", "the pause to start")
    assert not raw.pending(), "PAUSE answered while a server was still in use"
    expect_error(conn, "PAUSE", "already suspended/paused")
    expect_error(conn, "PAUSE postgres", "already suspended/paused")
    expect_error(conn, "KILL postgres", "already suspended/paused")
    holder.close()
    msgs = raw.messages()
    assert tags(msgs) == ["PAUSE"] and ready(msgs)
    # the idle server was closed too
    wait_for(lambda: rows(conn, "SHOW SERVERS") == [], "servers to be closed")

    # a new client can log in but its query waits
    waiter = pooled(b)
    fut = pool.submit(lambda: waiter.execute("SELECT 42").fetchone())
    wait_for(lambda: row(conn, "SHOW POOLS", database="postgres")["cl_waiting"] == 1, "the query to queue")
    assert row(conn, "SHOW CLIENTS", database="postgres")["state"] == "waiting"
    assert not fut.done()
    assert conn.execute("RESUME").statusmessage == "RESUME"
    assert fut.result(timeout=DEADLINE) == (42,)
    assert kv(conn, "SHOW STATE")["active"] == "yes"


def test_pause_is_immediate_without_servers(bouncer):
    b = bouncer()
    conn = console(b)
    assert conn.execute("PAUSE").statusmessage == "PAUSE"
    assert conn.execute("RESUME").statusmessage == "RESUME"


def test_resume_when_not_paused(bouncer):
    b = bouncer()
    conn = console(b)
    expect_error(conn, "RESUME", "pooler is not paused/suspended")


def test_pause_db(bouncer, pool, pg):
    b = bouncer(databases={"postgres": pg.connstr("postgres"), "other": pg.connstr("postgres")})
    conn = console(b)
    expect_error(conn, "PAUSE nosuch", "no such database: nosuch")
    expect_error(conn, "PAUSE pgbouncer", "cannot pause admin db: pgbouncer")
    expect_error(conn, "RESUME nosuch", "no such database: nosuch")
    expect_error(conn, "RESUME postgres", "database postgres is not paused")

    holder = pooled(b)
    holder.execute("SELECT 1")
    raw = Raw(b)
    raw.send_query("PAUSE postgres")
    wait_for(lambda: row(conn, "SHOW DATABASES", name="postgres")["paused"] == 1, "postgres to be paused")
    assert not raw.pending(), "PAUSE db answered while its server was still in use"
    # other databases keep working
    assert pooled(b, dbname="other").execute("SELECT 7").fetchone() == (7,)
    holder.close()
    assert tags(raw.messages()) == ["PAUSE"]

    waiter = pooled(b)
    fut = pool.submit(lambda: waiter.execute("SELECT 42").fetchone())
    wait_for(lambda: row(conn, "SHOW POOLS", database="postgres")["cl_waiting"] == 1, "the query to queue")
    # a global RESUME does not clear a database pause
    expect_error(conn, "RESUME", "pooler is not paused/suspended")
    assert not fut.done()
    assert conn.execute("RESUME postgres").statusmessage == "RESUME"
    assert fut.result(timeout=DEADLINE) == (42,)
    assert row(conn, "SHOW DATABASES", name="postgres")["paused"] == 0


def test_pause_db_registers_auto_database(bouncer, pg):
    b = bouncer(databases={"*": pg.connstr("postgres")})
    conn = console(b)
    assert conn.execute("PAUSE somedb").statusmessage == "PAUSE"
    assert row(conn, "SHOW DATABASES", name="somedb")["paused"] == 1


def test_pause_console_may_leave_while_waiting(bouncer):
    b = bouncer()
    holder = pooled(b)
    holder.execute("SELECT 1")
    raw = Raw(b)
    raw.send_query("PAUSE")
    conn = console(b)
    wait_for(lambda: kv(conn, "SHOW STATE")["paused"] == "yes", "the pause to start")
    raw.close()
    wait_for(lambda: len(rows(conn, "SHOW CLIENTS")) == 2, "the waiting console to be gone")
    holder.close()
    wait_for(lambda: rows(conn, "SHOW SERVERS") == [], "the server to be closed")
    # the pause stays until somebody resumes
    assert kv(conn, "SHOW STATE")["paused"] == "yes"
    assert conn.execute("RESUME").statusmessage == "RESUME"
    assert pooled(b).execute("SELECT 2").fetchone() == (2,)


def test_resume_ends_a_pending_pause(bouncer):
    b = bouncer()
    holder = pooled(b)
    holder.execute("SELECT 1")
    raw = Raw(b)
    raw.send_query("PAUSE")
    conn = console(b)
    wait_for(lambda: kv(conn, "SHOW STATE")["paused"] == "yes", "the pause to start")
    assert conn.execute("RESUME").statusmessage == "RESUME"
    # the waiting console is released (with no command tag: its PAUSE did not happen)
    assert raw.messages() == [("Z", b"I")]
    assert tags(raw.query("SHOW STATE")) == ["SHOW"]
    assert holder.execute("SELECT 2").fetchone() == (2,)


def test_sigusr2_resumes_a_console_pause(bouncer):
    b = bouncer()
    conn = console(b)
    conn.execute("PAUSE")
    b.send_signal(signal.SIGUSR2)
    wait_for(lambda: kv(conn, "SHOW STATE")["active"] == "yes", "SIGUSR2 to resume", timeout=3)


def test_cancel_request_aborts_pending_pause(bouncer):
    b = bouncer()
    holder = pooled(b)
    holder.execute("SELECT 1")
    raw = Raw(b)
    key = next(m[1] for m in raw.login if m[0] == "K")
    raw.send_query("PAUSE")
    conn = console(b)
    wait_for(lambda: kv(conn, "SHOW STATE")["paused"] == "yes", "the pause to start")
    with socket.create_connection(("127.0.0.1", b.port)) as s:
        s.sendall(struct.pack("!II", 16, 80877102) + key)
        s.settimeout(DEADLINE)
        assert s.recv(100) == b""
    wait_for(lambda: kv(conn, "SHOW STATE")["active"] == "yes", "the cancel to resume the pooler")
    assert raw.messages() == [("Z", b"I")]
    assert holder.execute("SELECT 2").fetchone() == (2,)


def test_suspend_and_resume(bouncer, pool, pg):
    b = bouncer(databases={"postgres": pg.connstr("postgres"), "other": pg.connstr("postgres")})
    conn = console(b)
    expect_error(conn, "SUSPEND postgres", "invalid command 'SUSPEND postgres', use SHOW HELP;")
    conn.execute("PAUSE other")
    expect_error(conn, "SUSPEND", "cannot suspend with paused databases")
    conn.execute("RESUME other")

    client = pooled(b)
    client.execute("SELECT 1")
    assert conn.execute("SUSPEND").statusmessage == "SUSPEND"
    expect_error(conn, "SUSPEND", "already suspended/paused")
    expect_error(conn, "PAUSE", "already suspended/paused")
    # nothing is read from the pooled sockets, and new connections are not accepted
    query = pool.submit(lambda: client.execute("SELECT 6").fetchone())
    login = pool.submit(lambda: pooled(b).execute("SELECT 5").fetchone())
    with pytest.raises(TimeoutError):
        query.result(timeout=0.5)
    assert not login.done()
    # the console itself goes on
    assert row(conn, "SHOW POOLS", database="postgres")["sv_active"] == 1
    assert conn.execute("RESUME").statusmessage == "RESUME"
    assert query.result(timeout=DEADLINE) == (6,)
    assert login.result(timeout=DEADLINE) == (5,)
    assert client.execute("SELECT 7").fetchone() == (7,)


def test_suspend_is_lifted_when_its_console_disconnects(bouncer):
    b = bouncer()
    watcher = console(b)
    conn = console(b)
    conn.execute("SUSPEND")
    assert kv(watcher, "SHOW STATE")["suspended"] == "yes"
    conn.close()
    wait_for(lambda: kv(watcher, "SHOW STATE")["active"] == "yes", "the automatic RESUME")
    version_ok(console(b))


def test_suspend_timeout_closes_unflushed_sockets(bouncer):
    """SUSPEND answers once every socket has flushed its buffers; a client that does not read
    its (large) result never flushes, so after suspend_timeout it is closed (with its server)
    and SUSPEND completes. Other clients are unharmed and carry on after RESUME."""
    b = bouncer(ini_overrides={"suspend_timeout": 1, "log_disconnections": 1})
    conn = console(b)
    bystander = pooled(b)
    assert bystander.execute("SELECT 1").fetchone() == (1,)
    stuck = Raw(b, user="postgres", dbname="postgres")
    stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    # ~50 MB, far more than the kernel buffers between us and the pooler hold
    stuck.send_query("SELECT repeat('x', 1000) FROM generate_series(1, 50000)")
    wait_for(lambda: any(r["send_remain"] > 0 for r in rows(conn, "SHOW SOCKETS") if r["type"] == "S"),
             "the pooler to hold output the stuck client does not read")
    mark = b.log_mark()
    assert conn.execute("SUSPEND").statusmessage == "SUSPEND"
    b.wait_log(r"SUSPEND: closing 2 sockets that did not flush within suspend_timeout", after=mark)
    b.wait_log(r"C-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:\d+ closing because: suspend_timeout", after=mark)
    assert kv(conn, "SHOW STATE")["suspended"] == "yes"
    # the stuck client gets what was already on its way, then the end of the connection
    stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    assert stuck.until_eof()[-1][0] == "EOF"
    assert [c["state"] for c in rows(conn, "SHOW CLIENTS") if c["database"] == "postgres"] == ["active"]
    assert conn.execute("RESUME").statusmessage == "RESUME"
    assert bystander.execute("SELECT 2").fetchone() == (2,)
    assert pooled(b).execute("SELECT 3").fetchone() == (3,)


# ---------------------------------------------------------------------------
# DISABLE / ENABLE, KILL, KILL_CLIENT


def test_disable_and_enable(bouncer):
    b = bouncer()
    conn = console(b)
    existing = pooled(b)
    existing.execute("SELECT 1")
    assert conn.execute("DISABLE postgres").statusmessage == "DISABLE"
    assert row(conn, "SHOW DATABASES", name="postgres")["disabled"] == 1
    expect_login_failure(b, 'database "postgres" is disabled')
    assert existing.execute("SELECT 2").fetchone() == (2,)
    assert conn.execute("ENABLE postgres").statusmessage == "ENABLE"
    assert row(conn, "SHOW DATABASES", name="postgres")["disabled"] == 0
    assert pooled(b).execute("SELECT 3").fetchone() == (3,)


def test_disable_enable_errors(bouncer):
    b = bouncer()
    conn = console(b)
    expect_error(conn, "DISABLE", "a database is required")
    expect_error(conn, "ENABLE", "a database is required")
    expect_error(conn, "DISABLE nosuch", "no such database: nosuch")
    expect_error(conn, "ENABLE nosuch", "no such database: nosuch")
    expect_error(conn, "DISABLE pgbouncer", "cannot disable admin db: pgbouncer")
    expect_error(conn, "ENABLE pgbouncer", "cannot disable admin db: pgbouncer")


def test_kill_db(bouncer, pool):
    b = bouncer()
    conn = console(b)
    expect_error(conn, "KILL nosuch", "no such database: nosuch")
    expect_error(conn, "KILL pgbouncer", "cannot kill admin db: pgbouncer")
    victim = pooled(b)
    victim.execute("SELECT 1")
    idle = pooled(b)
    assert conn.execute("KILL postgres").statusmessage == "KILL"
    expect_fatal_on_next_query(victim, "database removed")
    expect_fatal_on_next_query(idle, "database removed")
    assert rows(conn, "SHOW SERVERS") == []
    d = row(conn, "SHOW DATABASES", name="postgres")
    assert (d["paused"], d["current_connections"], d["current_client_connections"]) == (1, 0, 0)
    # a new client waits until RESUME db
    fut = pool.submit(lambda: pooled(b).execute("SELECT 9").fetchone())
    wait_for(lambda: any(r["state"] == "waiting" for r in rows(conn, "SHOW CLIENTS")), "the new client to wait")
    assert not fut.done()
    assert conn.execute("RESUME postgres").statusmessage == "RESUME"
    assert fut.result(timeout=DEADLINE) == (9,)
    version_ok(conn)


def test_kill_without_db_kills_every_database_with_pools(bouncer, pg):
    b = bouncer(databases={"postgres": pg.connstr("postgres"), "other": pg.connstr("postgres"),
                           "unused": pg.connstr("postgres")})
    conn = console(b)
    c1 = pooled(b)
    c1.execute("SELECT 1")
    c2 = pooled(b, dbname="other")
    c2.execute("SELECT 1")
    assert conn.execute("KILL").statusmessage == "KILL"
    expect_fatal_on_next_query(c1, "database removed")
    expect_fatal_on_next_query(c2, "database removed")
    paused = {r["name"]: r["paused"] for r in rows(conn, "SHOW DATABASES")}
    assert paused == {"other": 1, "pgbouncer": 0, "postgres": 1, "unused": 0}
    version_ok(conn)
    conn.execute("RESUME postgres")
    conn.execute("RESUME other")
    assert pooled(b).execute("SELECT 2").fetchone() == (2,)


def test_kill_client(bouncer):
    b = bouncer()
    conn = console(b)
    victim = pooled(b)
    victim.execute("SELECT 1")
    bystander = pooled(b)
    bystander.execute("SELECT 1")
    target = row(conn, "SHOW CLIENTS", port=local_port(victim))
    assert conn.execute(f"KILL_CLIENT {target['id']}").statusmessage == "KILL_CLIENT"
    expect_fatal_on_next_query(victim, "admin forced disconnect")
    assert bystander.execute("SELECT 2").fetchone() == (2,)
    assert target["id"] not in [r["id"] for r in rows(conn, "SHOW CLIENTS")]
    expect_error(conn, f"KILL_CLIENT {target['id']}", "client not found")
    expect_error(conn, "KILL_CLIENT abc", "invalid client pointer supplied")
    expect_error(conn, "KILL_CLIENT 999999", "client not found")


def test_kill_client_sends_fatal(bouncer):
    b = bouncer()
    conn = console(b)
    victim = Raw(b, user="postgres", dbname="postgres")
    target = row(conn, "SHOW CLIENTS", database="postgres")
    conn.execute(f"KILL_CLIENT {target['id']}")
    assert victim.read() == ("E", b"SFATAL\0C08P01\0Madmin forced disconnect\0\0")
    assert victim.read() == ("EOF", b"")


def test_kill_client_of_a_console(bouncer):
    b = bouncer()
    conn = console(b)
    other = console(b)
    target = row(conn, "SHOW CLIENTS", port=local_port(other))
    assert conn.execute(f"KILL_CLIENT {target['id']}").statusmessage == "KILL_CLIENT"
    expect_fatal_on_next_query(other, "admin forced disconnect")


# ---------------------------------------------------------------------------
# RECONNECT / WAIT_CLOSE


def test_reconnect_replaces_idle_servers(bouncer):
    b = bouncer()
    conn = console(b)
    expect_error(conn, "RECONNECT nosuch", "no such database: nosuch")
    expect_error(conn, "RECONNECT pgbouncer", "cannot reconnect admin db: pgbouncer")
    with pooled(b) as first:
        old = backend_pid(first)
    wait_for(lambda: row(conn, "SHOW POOLS", database="postgres")["sv_idle"] == 1, "the server to be idle")
    assert conn.execute("RECONNECT postgres").statusmessage == "RECONNECT"
    wait_for(lambda: rows(conn, "SHOW SERVERS") == [], "the idle server to be closed")
    assert backend_pid(pooled(b)) != old


def test_reconnect_closes_busy_servers_when_released(bouncer):
    b = bouncer()
    conn = console(b)
    busy = pooled(b)
    old = backend_pid(busy)
    assert conn.execute("RECONNECT").statusmessage == "RECONNECT"
    assert row(conn, "SHOW SERVERS", database="postgres")["close_needed"] == 1
    # the session goes on with its server
    assert backend_pid(busy) == old
    raw = Raw(b)
    raw.send_query("WAIT_CLOSE postgres")
    assert not raw.pending(), "WAIT_CLOSE answered while a server still had close_needed"
    busy.close()
    msgs = raw.messages()
    assert tags(msgs) == ["WAIT_CLOSE"] and ready(msgs)
    assert rows(conn, "SHOW SERVERS") == []
    assert backend_pid(pooled(b)) != old


def test_wait_close(bouncer):
    b = bouncer()
    conn = console(b)
    expect_error(conn, "WAIT_CLOSE nosuch", "no such database: nosuch")
    expect_error(conn, "WAIT_CLOSE pgbouncer", "cannot wait in admin db: pgbouncer")
    assert conn.execute("WAIT_CLOSE").statusmessage == "WAIT_CLOSE"
    assert conn.execute("WAIT_CLOSE postgres").statusmessage == "WAIT_CLOSE"
    busy = pooled(b)
    busy.execute("SELECT 1")
    conn.execute("RECONNECT")
    raw = Raw(b)
    raw.send_query("WAIT_CLOSE")
    assert not raw.pending()
    busy.close()
    assert tags(raw.messages()) == ["WAIT_CLOSE"]
    version_ok(conn)


# ---------------------------------------------------------------------------
# RELOAD / SHUTDOWN


def test_reload(bouncer):
    b = bouncer()
    conn = console(b)
    b.update(default_pool_size=13)
    b.write_ini()
    assert conn.execute("RELOAD").statusmessage == "RELOAD"
    assert row(conn, "SHOW CONFIG", key="default_pool_size")["value"] == "13"


def test_reload_with_broken_file(bouncer):
    b = bouncer()
    conn = console(b)
    b.update(default_pool_size=13)
    b.write_ini(extra_lines=["no_such_setting = 1"])
    expect_error(conn, "RELOAD", "RELOAD failed, see logs for additional details", sqlstate="F0000")
    b.wait_log(r"unknown parameter: pgbouncer/no_such_setting")
    assert b.alive()
    b.write_ini()
    assert conn.execute("RELOAD").statusmessage == "RELOAD"
    assert row(conn, "SHOW CONFIG", key="default_pool_size")["value"] == "13"


def test_shutdown_exits_without_reply(bouncer):
    b = bouncer()
    raw = Raw(b)
    raw.send_query("SHUTDOWN")
    assert b.wait_exit() == 0
    assert raw.read() == ("EOF", b"")


def test_shutdown_wait_for_clients(bouncer):
    b = bouncer()
    client = pooled(b)
    client.execute("SELECT 1")
    conn = console(b)
    assert conn.execute("SHUTDOWN WAIT_FOR_CLIENTS").statusmessage == "SHUTDOWN"
    # existing clients keep working; new TCP connections are refused
    assert client.execute("SELECT 2").fetchone() == (2,)
    with pytest.raises(psycopg.OperationalError):
        pooled(b)
    # the Unix socket still takes console logins, and only those
    raw = Raw(b, unix=True)
    assert ready(raw.login)
    fatal = Raw(b, user="postgres", dbname="postgres", unix=True)
    assert errors(fatal.login) == [{"S": "FATAL", "C": "08P01", "M": "pooler is shutting down"}]
    version_ok(conn)
    client.close()
    raw.close()
    assert b.alive()
    conn.close()
    assert b.wait_exit() == 0


def test_shutdown_wait_for_servers(bouncer):
    b = bouncer()
    client = pooled(b)
    client.execute("SELECT 1")
    conn = console(b)
    assert conn.execute("SHUTDOWN WAIT_FOR_SERVERS").statusmessage == "SHUTDOWN"
    assert b.alive()
    version_ok(conn)
    # only console logins, over the Unix socket
    with pytest.raises(psycopg.OperationalError):
        pooled(b)
    fatal = Raw(b, user="postgres", dbname="postgres", unix=True)
    assert errors(fatal.login) == [{"S": "FATAL", "C": "08P01", "M": "pooler is shutting down"}]
    assert ready(Raw(b, unix=True).login)
    client.close()  # session mode: releasing the server lets it close
    assert b.wait_exit() == 0


def test_resume_during_shutdown(bouncer):
    b = bouncer()
    client = pooled(b)
    client.execute("SELECT 1")
    conn = console(b)
    conn.execute("SHUTDOWN WAIT_FOR_SERVERS")
    expect_error(conn, "RESUME", "pooler is shutting down")
