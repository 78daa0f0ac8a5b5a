"""A server that misbehaves during the pooler's login to it.

PostgreSQL itself never sends these answers, so a small scripted listener
plays the server for one database of the pooler, while a real PostgreSQL
serves a second database whose client (the bystander) must not notice
anything. Each case expects a clean login failure for the client of the
hostile database, a log line saying why, and a pooler that stays up.
"""

import base64
import socket
import struct
import threading
import time

import psycopg
import pytest

from helpers import check_unharmed, wait_server_idle
from pgwire import PgWire



class ScriptedServer:
    """Listens on a free loopback port; every accepted connection runs `script(conn)` in a thread."""

    def __init__(self, script):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.script = script
        self.connections = 0
        self.accepted_at = []  # time.monotonic() of each connection
        self.errors = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            self.accepted_at.append(time.monotonic())
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn):
        conn.settimeout(30)
        try:
            self.script(Wire(conn))
        except (OSError, EOFError) as e:
            self.errors.append(e)
        finally:
            conn.close()

    def close(self):
        self.sock.close()


class Wire:
    """The server end of one connection."""

    def __init__(self, conn):
        self.conn = conn

    def _recv(self, n):
        data = b""
        while len(data) < n:
            chunk = self.conn.recv(n - len(data))
            if not chunk:
                raise EOFError("pooler closed the connection")
            data += chunk
        return data

    def read_startup(self):
        """The pooler's StartupMessage (answering an SSLRequest with 'N' first)."""
        while True:
            (length,) = struct.unpack("!I", self._recv(4))
            body = self._recv(length - 4)
            if struct.unpack("!I", body[:4])[0] == 80877103:
                self.conn.sendall(b"N")
                continue
            return body

    def read_msg(self):
        kind = self._recv(1)
        (length,) = struct.unpack("!I", self._recv(4))
        return kind, self._recv(length - 4)

    def send(self, kind, body):
        self.conn.sendall(kind + struct.pack("!I", len(body) + 4) + body)

    def auth(self, code, payload=b""):
        self.send(b"R", struct.pack("!I", code) + payload)

    def wait_close(self):
        try:
            while self.conn.recv(4096):
                pass
        except OSError:
            pass


def client_nonce_of(sasl_initial):
    """The client nonce from a SASLInitialResponse body."""
    mech_end = sasl_initial.index(b"\0")
    (dlen,) = struct.unpack("!i", sasl_initial[mech_end + 1:mech_end + 5])
    first = sasl_initial[mech_end + 5:mech_end + 5 + dlen].decode()
    return dict(kv.split("=", 1) for kv in first.split(",")[2:])["r"]


def scram_until_server_first(server_first_of):
    """A script: SASL offer, then the server-first message made by server_first_of(client_nonce)."""

    def script(w):
        w.read_startup()
        w.auth(10, b"SCRAM-SHA-256\0\0")
        kind, body = w.read_msg()
        assert kind == b"p"
        w.auth(11, server_first_of(client_nonce_of(body)).encode())
        w.wait_close()

    return script


SALT = base64.b64encode(b"0123456789abcdef").decode()


@pytest.fixture
def hostile(bouncer, pg):
    """(bouncer, bystander, server) for a scripted server behind database `hostile`."""
    made = []

    def make(script, **ini):
        server = ScriptedServer(script)
        made.append(server)
        b = bouncer(databases={
            "postgres": pg.connstr("postgres"),
            "hostile": f"host=127.0.0.1 port={server.port} dbname=postgres user=postgres password=secret",
        }, ini_overrides={"max_workers": 1, "server_login_retry": 1, **ini})
        bystander = b.connect(autocommit=True, password="postgres")
        assert bystander.execute("SELECT 1").fetchone() == (1,)
        return b, bystander, server

    yield make
    for s in made:
        s.close()


def login_error(b):
    with pytest.raises(psycopg.OperationalError) as e:
        b.connect(dbname="hostile", password="postgres", autocommit=True).execute("SELECT 1")
    return str(e.value)


def test_overlong_server_nonce(hostile):
    b, bystander, server = hostile(scram_until_server_first(
        lambda cn: f"r={cn}{'x' * 5000},s={SALT},i=4096"))
    mark = b.log_mark()
    msg = login_error(b)
    assert "server login failed" in msg, msg
    line = b.wait_log(r"server login failed: SCRAM exchange with server failed: .*", after=mark).group(0)
    assert "malformed" in line or "too long" in line, line
    check_unharmed(b, bystander)


def test_server_nonce_not_extending_ours(hostile):
    b, bystander, server = hostile(scram_until_server_first(lambda cn: f"r=someoneelse,s={SALT},i=4096"))
    mark = b.log_mark()
    assert "server login failed" in login_error(b)
    b.wait_log(r"SCRAM server nonce does not extend client nonce", after=mark)
    check_unharmed(b, bystander)


def test_absurd_iteration_count_is_refused_not_computed(hostile):
    """2^31-1 PBKDF2 rounds would stall the worker for half an hour; the pooler refuses to start them."""
    b, bystander, server = hostile(scram_until_server_first(lambda cn: f"r={cn}srv,s={SALT},i=2147483647"))
    mark = b.log_mark()
    assert "server login failed" in login_error(b)
    b.wait_log(r"SCRAM iteration count 2147483647 is above the limit", after=mark)
    check_unharmed(b, bystander)


def test_garbage_server_first(hostile):
    b, bystander, server = hostile(scram_until_server_first(lambda cn: "\x01\x02 not scram at all"))
    mark = b.log_mark()
    assert "server login failed" in login_error(b)
    b.wait_log(r"SCRAM exchange with server failed", after=mark)
    check_unharmed(b, bystander)


def test_overlong_server_final(hostile):
    """A well-formed server-first, then a server-final far above the SCRAM size limit."""

    def script(w):
        w.read_startup()
        w.auth(10, b"SCRAM-SHA-256\0\0")
        kind, body = w.read_msg()
        w.auth(11, f"r={client_nonce_of(body)}srv,s={SALT},i=4096".encode())
        kind, body = w.read_msg()
        assert kind == b"p" and body.startswith(b"c=biws,r="), body
        w.auth(12, b"v=" + b"A" * 5000)
        w.wait_close()

    b, bystander, server = hostile(script)
    mark = b.log_mark()
    assert "server login failed" in login_error(b)
    b.wait_log(r"server login failed: invalid server signature: .*", after=mark)
    check_unharmed(b, bystander)


def test_unknown_auth_request(hostile):
    def script(w):
        w.read_startup()
        w.auth(99)
        w.wait_close()

    b, bystander, server = hostile(script)
    assert "server login failed" in login_error(b)
    check_unharmed(b, bystander)


def test_oversized_server_packet_during_login(hostile):
    """A length field far above max_packet_size: the server is dropped, not buffered."""

    def script(w):
        w.read_startup()
        w.conn.sendall(b"R" + struct.pack("!I", 0x7FFFFFF0) + b"\0" * 1024)
        w.wait_close()

    b, bystander, server = hostile(script)
    mark = b.log_mark()
    login_error(b)
    b.wait_log(r"server login failed: login packet 'R' of 2147483633 bytes is too large", after=mark)
    check_unharmed(b, bystander)


def test_server_closes_mid_login(hostile):
    def script(w):
        w.read_startup()
        w.conn.sendall(b"R\0\0")  # half a header, then gone

    b, bystander, server = hostile(script)
    login_error(b)
    check_unharmed(b, bystander)


# ---------------------------------------------------------------------------
# no reconnect storm: a failed login of any kind waits server_login_retry


def send_length(length):
    """A script: after the startup packet, a message header with this length field, then silence."""

    def script(w):
        w.read_startup()
        w.conn.sendall(b"R" + struct.pack("!I", length) + b"\0" * 16)
        w.wait_close()

    return script


def close_after_startup(w):
    w.read_startup()


def attempts_in_first(server, seconds):
    """Connection attempts within `seconds` of the first one."""
    t0 = server.accepted_at[0]
    return sum(1 for t in server.accepted_at if t - t0 < seconds)


def keep_logging_in(b, seconds):
    """Clients of the hostile database log in again and again for `seconds`; each must fail."""
    end = time.monotonic() + seconds
    tries = 0
    while time.monotonic() < end:
        tries += 1
        with pytest.raises(psycopg.OperationalError):
            b.connect(dbname="hostile", password="postgres", connect_timeout=3).execute("SELECT 1")
        time.sleep(0.05)
    return tries


@pytest.mark.parametrize("length", [0x7FFFFFFF, 0xFFFFFFFF, 2, 0])
def test_malformed_login_length_waits_server_login_retry(hostile, length):
    """8,687 attempts in 8 s were seen before; now at most 1 + 5 / server_login_retry."""
    b, bystander, server = hostile(send_length(length), server_login_retry=2)
    mark = b.log_mark()
    keep_logging_in(b, 6)
    assert 1 <= attempts_in_first(server, 5) <= 1 + 5 // 2, server.accepted_at
    b.wait_log(r"server login failed: .*(length|too large)", after=mark)
    check_unharmed(b, bystander)


def test_server_closing_during_login_waits_server_login_retry(hostile):
    b, bystander, server = hostile(close_after_startup, server_login_retry=2)
    keep_logging_in(b, 6)
    assert 1 <= attempts_in_first(server, 5) <= 1 + 5 // 2, server.accepted_at
    check_unharmed(b, bystander)


def test_client_gone_while_waiting_stops_the_attempts(hostile):
    """A client waiting for a retry that disconnects causes no more attempts."""
    b, bystander, server = hostile(close_after_startup, server_login_retry=1, query_wait_timeout=60)
    w = PgWire(b.port)
    w.startup(database="hostile")
    w.sock.settimeout(2)
    with pytest.raises(TimeoutError):  # authenticated; AuthenticationOk waits for a server login
        w.authenticate(password="postgres")
    deadline = time.monotonic() + 10
    while server.connections < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.connections >= 2, "the pooler should retry while its client waits"
    w.close()
    time.sleep(1.5)  # one retry that had started may still arrive
    settled = server.connections
    time.sleep(3)
    assert server.connections == settled, f"{server.connections - settled} attempts after the client left"
    with b.admin() as admin:
        cur = admin.execute("SHOW POOLS")
        names = [d.name for d in cur.description]
        pools = [dict(zip(names, r)) for r in cur.fetchall() if r[0] == "hostile"]
    assert all(p["cl_waiting"] == 0 for p in pools), pools
    check_unharmed(b, bystander)


# ---------------------------------------------------------------------------
# malformed messages: a precise error for the client and a log line


def trust_welcome(w):
    """The pooler's startup, a trust login and a minimal welcome up to ReadyForQuery."""
    w.read_startup()
    w.auth(0)
    for name, value in (("client_encoding", "UTF8"), ("server_version", "15.0"),
                        ("standard_conforming_strings", "on"), ("DateStyle", "ISO, MDY")):
        w.send(b"S", name.encode() + b"\0" + value.encode() + b"\0")
    w.send(b"K", struct.pack("!II", 4242, 99))
    w.send(b"Z", b"I")


def answer_set(w, body):
    w.send(b"C", b"SET\0")
    w.send(b"Z", b"I")


def login_then(step, on_set=answer_set):
    """A script: trust login with a minimal welcome, then `step(w)` for the
    pooler's queries; its SETs of tracked parameters go to `on_set(w, body)`."""

    def script(w):
        trust_welcome(w)
        while True:
            kind, body = w.read_msg()
            if kind == b"X":
                return
            if kind == b"Q" and (body.startswith(b"SET ") or b"set_config" in body):
                on_set(w, body)
                continue
            if not step(w, kind, body):
                w.wait_close()
                return

    return script


def during_login(send):
    def script(w):
        w.read_startup()
        send(w)
        w.wait_close()

    return script


def test_parameter_status_without_terminator_during_login(hostile):
    b, bystander, server = hostile(during_login(
        lambda w: (w.auth(0), w.send(b"S", b"client_encoding\0UTF8"))))
    mark = b.log_mark()
    msg = login_error(b)
    assert "server login failed: malformed ParameterStatus from server" in msg, msg
    b.wait_log(r"server login failed: malformed ParameterStatus from server", after=mark)
    check_unharmed(b, bystander)


def test_error_response_without_fields_during_login(hostile):
    b, bystander, server = hostile(during_login(lambda w: w.send(b"E", b"\0")))
    mark = b.log_mark()
    msg = login_error(b)
    assert "server login failed: malformed ErrorResponse from server" in msg, msg
    b.wait_log(r"server login failed: malformed ErrorResponse from server", after=mark)
    check_unharmed(b, bystander)


def test_server_closes_mid_message_during_login(hostile):
    b, bystander, server = hostile(lambda w: (w.read_startup(), w.conn.sendall(
        b"R" + struct.pack("!I", 100) + b"\0\0\0")))
    mark = b.log_mark()
    login_error(b)
    line = b.wait_log(r"server login failed: .*", after=mark).group(0)
    assert "server closed the connection in the middle of a message during login" in line, line
    assert "bouncer config error" not in b.log_text()[mark:]
    check_unharmed(b, bystander)


def run_query_against(b, sql="SELECT 1"):
    conn = b.connect(dbname="hostile", password="postgres", autocommit=True)
    with pytest.raises(psycopg.OperationalError) as e:
        conn.execute(sql)
    return str(e.value)


def test_parameter_status_without_terminator_after_login(hostile):
    def step(w, kind, body):
        w.send(b"S", b"application_name\0evil")
        return False

    b, bystander, server = hostile(login_then(step))
    mark = b.log_mark()
    run_query_against(b)
    b.wait_log(r"malformed ParameterStatus from server", after=mark)
    check_unharmed(b, bystander)


def test_server_closes_mid_message_after_login(hostile):
    def step(w, kind, body):
        w.conn.sendall(b"T" + struct.pack("!I", 200) + b"\0\1")
        w.conn.close()
        raise EOFError("closed on purpose")

    b, bystander, server = hostile(login_then(step))
    mark = b.log_mark()
    run_query_against(b)
    b.wait_log(r"server closed the connection in the middle of a message", after=mark)
    check_unharmed(b, bystander)


def test_failed_application_name_set_sent_ahead_of_the_query(hostile):
    """PostgreSQL takes any printable application_name, so the pooler sends
    that SET ahead of the client's first query without waiting for it. A
    server that fails it anyway has already received the query: the client
    gets the query's answer, the log says the SET failed, and the server
    stays in the pool."""
    sets, queries = [], []

    def fail_set(w, body):
        sets.append(body.rstrip(b"\0").decode())
        w.send(b"E", b"SERROR\0C22023\0Mno such name today\0\0")
        w.send(b"Z", b"I")

    def answer_query(w, kind, body):
        assert kind == b"Q", kind
        queries.append(body.rstrip(b"\0").decode())
        w.send(b"T", struct.pack("!H", 1) + b"x\0" + struct.pack("!IHIhih", 0, 0, 25, -1, -1, 0))
        w.send(b"D", struct.pack("!HI", 1, 2) + b"ok")
        w.send(b"C", b"SELECT 1\0")
        w.send(b"Z", b"I")
        return True

    b, bystander, server = hostile(login_then(answer_query, on_set=fail_set))
    mark = b.log_mark()
    for _ in range(2):
        w = PgWire(b.port)
        w.login(database="hostile", password="postgres", application_name="hostile-app")
        assert w.simple_query("SELECT 'ok'") == ([["ok"]], None)
        w.close()
        b.wait_log(r"parameter SET failed, the server keeps its value: no such name today", after=mark)
        mark = b.log_mark()
        wait_server_idle(b, database="hostile")
    assert server.connections == 1, (server.errors, queries)  # the server stayed in the pool
    assert sets == ["SET \"application_name\"='hostile-app';"] * 2
    assert queries == ["SELECT 'ok'", "DISCARD ALL"] * 2  # the query ran after the failed SET
    check_unharmed(b, bystander)
