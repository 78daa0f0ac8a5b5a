"""A small raw PostgreSQL protocol client for the tests: packets built and
read byte by byte, so a test can send what no driver sends (malformed or
hostile input) and read what a driver hides (the SQLSTATE of a failed login,
the cancel key, every message of a pipeline).

PgWire is one connection; startup_packet(), message() and friends build
packets; error_fields() and data_row() read them; ScramClient is the client
side of SCRAM-SHA-256; md5_secret() and scram_secret_of() make auth_file
secrets.
"""

import base64
import hashlib
import hmac
import os
import re
import socket
import struct

from conftest import DEADLINE

PROTO_V3 = 0x00030000


PROTO_V2 = 0x00020000


SSL_REQUEST = 80877103


GSSENC_REQUEST = 80877104


CANCEL_REQUEST = 80877102


def startup_packet(params, code=PROTO_V3):
    """A StartupMessage: int32 length, int32 code, key\\0value\\0 pairs, \\0."""
    body = struct.pack("!I", code)
    for key, value in params.items():
        body += key.encode() + b"\0" + value.encode() + b"\0"
    body += b"\0"
    return struct.pack("!I", len(body) + 4) + body


def request_packet(code, extra=b""):
    """SSLRequest, GSSENCRequest or CancelRequest (length, code, payload)."""
    return struct.pack("!II", 8 + len(extra), code) + extra


def message(mtype, body=b""):
    """A typed message: type byte, int32 length (counting itself), body."""
    return mtype + struct.pack("!I", len(body) + 4) + body


def query_message(sql):
    return message(b"Q", sql.encode() + b"\0")


def error_fields(body):
    """Fields of an ErrorResponse/NoticeResponse body: {'S': ..., 'C': ..., 'M': ...}."""
    fields = {}
    for part in body.split(b"\0"):
        if part:
            fields[chr(part[0])] = part[1:].decode(errors="replace")
    return fields


def md5_response(user, password, salt):
    inner = hashlib.md5((password + user).encode()).hexdigest()
    return "md5" + hashlib.md5(inner.encode() + salt).hexdigest()


def data_row(body):
    """Values of a DataRow body: str, or None for SQL NULL."""
    (n,) = struct.unpack("!H", body[:2])
    pos, row = 2, []
    for _ in range(n):
        (ln,) = struct.unpack("!i", body[pos : pos + 4])
        pos += 4
        if ln < 0:
            row.append(None)
        else:
            row.append(body[pos : pos + ln].decode())
            pos += ln
    return row


class PgWire:
    """One raw connection to the pooler (TCP, or its Unix socket when host is a directory)."""

    def __init__(self, port, host="127.0.0.1"):
        if str(host).startswith("/"):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(10)
            self.sock.connect(f"{host}/.s.PGSQL.{port}")
        else:
            self.sock = socket.create_connection((host, port), timeout=10)
        self.sock.settimeout(DEADLINE)
        self.buf = b""

    def close(self):
        self.sock.close()

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self, n):
        """Buffers at least n bytes; False on EOF."""
        while len(self.buf) < n:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return False
            self.buf += chunk
        return True

    def read_byte(self):
        """One byte (the answer to SSLRequest/GSSENCRequest), or None on EOF."""
        if not self._fill(1):
            return None
        b, self.buf = self.buf[:1], self.buf[1:]
        return b

    def read_msg(self):
        """(type, body) of the next message, or None when the connection closed."""
        if not self._fill(5):
            return None
        mtype = self.buf[:1]
        (length,) = struct.unpack("!I", self.buf[1:5])
        if not self._fill(1 + length):
            return None
        body = self.buf[5 : 1 + length]
        self.buf = self.buf[1 + length :]
        return mtype, body

    def at_eof(self):
        """True when the peer has closed the connection and nothing is left to read."""
        return not self.buf and not self._fill(1)

    def read_until(self, *types):
        """Messages up to and including the first one of `types` (or until EOF)."""
        got = []
        while True:
            m = self.read_msg()
            if m is None:
                return got
            got.append(m)
            if m[0] in types:
                return got

    def expect_fatal(self, text, sqlstate="08P01", alone=False):
        """Reads until an ErrorResponse, checks it, then checks that the pooler closed the connection.
        alone: the ErrorResponse is the only message the client gets."""
        msgs = self.read_until(b"E")
        assert msgs and msgs[-1][0] == b"E", f"expected an ErrorResponse, got {msgs!r}"
        assert not alone or len(msgs) == 1, f"expected the ErrorResponse alone, got {msgs!r}"
        err = error_fields(msgs[-1][1])
        assert err.get("S") == "FATAL", err
        assert err.get("C") == sqlstate, err
        if isinstance(text, re.Pattern):
            assert text.fullmatch(err.get("M", "")), err
        else:
            assert err.get("M") == text, err
        assert set(err) == {"S", "C", "M"}, f"pooler errors carry only S, C and M: {err}"
        assert self.at_eof(), "the connection should be closed after a FATAL error"
        return err

    def expect_closed(self):
        """The pooler closes without answering (anything it sent is returned)."""
        msgs = []
        while True:
            m = self.read_msg()
            if m is None:
                return msgs
            msgs.append(m)

    def startup(self, user="postgres", database="postgres", **params):
        p = {"user": user, "database": database} if user is not None else {"database": database}
        p.update(params)
        self.send(startup_packet(p))

    def authenticate(self, user="postgres", password=None, scram_password=None, first=None):
        """Answers the pooler's authentication requests (starting with `first`
        if it was already read); returns the first message that is not an
        authentication step (AuthenticationOk, or an ErrorResponse)."""
        scram = None
        while True:
            m, first = first or self.read_msg(), None
            if m is None or m[0] != b"R":
                return m
            (code,) = struct.unpack("!I", m[1][:4])
            if code == 0:
                return m
            if code == 3:
                self.send(message(b"p", password.encode() + b"\0"))
            elif code == 5:
                self.send(message(b"p", md5_response(user, password, m[1][4:8]).encode() + b"\0"))
            elif code == 10:
                mechs = m[1][4:].split(b"\0")
                assert b"SCRAM-SHA-256" in mechs, mechs
                scram = ScramClient(scram_password if scram_password is not None else password)
                client_first = scram.first().encode()
                self.send(message(b"p", b"SCRAM-SHA-256\0" + struct.pack("!I", len(client_first)) + client_first))
            elif code == 11:
                self.send(message(b"p", scram.final(m[1][4:].decode()).encode()))
            elif code == 12:
                scram.verify(m[1][4:].decode())
            else:
                raise AssertionError(f"unexpected authentication request {code}")

    def login(self, user="postgres", database="postgres", password=None, **params):
        """Startup + authentication + welcome; returns the welcome messages up to ReadyForQuery."""
        self.startup(user, database, **params)
        first = self.authenticate(user, password)
        assert first is not None and first[0] == b"R", f"login failed: {first!r} " + (
            repr(error_fields(first[1])) if first and first[0] == b"E" else "")
        msgs = self.read_until(b"Z", b"E")
        assert msgs and msgs[-1][0] == b"Z", f"no ReadyForQuery after login: {msgs!r}"
        return msgs

    def simple_query(self, sql):
        """Sends a Query; returns (rows as lists of str/None, error fields or None)."""
        self.send(query_message(sql))
        rows, err = [], None
        for mtype, body in self.read_until(b"Z"):
            if mtype == b"D":
                rows.append(data_row(body))
            elif mtype == b"E":
                err = error_fields(body)
        return rows, err


class ScramClient:
    """Client side of SCRAM-SHA-256 without channel binding (RFC 5802/7677)."""

    def __init__(self, password):
        self.password = password.encode()
        self.nonce = base64.b64encode(os.urandom(18)).decode()

    def first(self):
        self.bare = f"n=,r={self.nonce}"
        return "n,," + self.bare

    def final(self, server_first):
        attrs = dict(kv.split("=", 1) for kv in server_first.split(","))
        assert attrs["r"].startswith(self.nonce)
        salted = hashlib.pbkdf2_hmac("sha256", self.password, base64.b64decode(attrs["s"]), int(attrs["i"]))
        client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
        stored_key = hashlib.sha256(client_key).digest()
        without_proof = f"c=biws,r={attrs['r']}"
        auth_message = f"{self.bare},{server_first},{without_proof}".encode()
        signature = hmac.new(stored_key, auth_message, hashlib.sha256).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
        self.expected_server_sig = base64.b64encode(hmac.new(server_key, auth_message, hashlib.sha256).digest())
        return f"{without_proof},p={base64.b64encode(proof).decode()}"

    def verify(self, server_final):
        assert server_final == "v=" + self.expected_server_sig.decode(), server_final


def md5_secret(user, password):
    return "md5" + hashlib.md5((password + user).encode()).hexdigest()
