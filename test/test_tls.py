"""TLS between clients and the pooler and between the pooler and PostgreSQL
(spec/behaviours.md §1.1 and §13, spec/config.md client_tls_* and server_tls_*,
doc/tls.md): the answer to SSLRequest per client_tls_sslmode, direct TLS with
ALPN, client certificates and auth_type=cert, the `tls` column and log text,
certificate reload, start-up errors for bad TLS files, server TLS modes against
a cluster that only takes TLS, hostile input around the handshake, and the
regression test for the fix that lets a server certificate without
client_tls_ca_file work on a machine without a system CA bundle.

The certificates come from the tls_files fixture (test/tlsfiles.py); the
TLS-only cluster is pg_ssl (conftest.py). Raw clients use Python's ssl module,
which (unlike libpq 15) can also speak direct TLS.
"""

import os
import re
import signal
import socket
import ssl
import threading
import time
from pathlib import Path

import psycopg
import pytest

from conftest import DEADLINE, port_listening, wait_for
from pgwire import PgWire, query_message, request_packet, SSL_REQUEST, startup_packet

SYSTEM_PGBOUNCER = Path("/usr/sbin/pgbouncer")
NO_CA_ENV = {"SSL_CERT_FILE": "/nonexistent/cert.pem", "SSL_CERT_DIR": "/nonexistent/certs"}
USERS_TXT = '"postgres" "postgres"\n"alice" "alice"\n"pgbouncer" "pgbouncer"\n'
# "<protocol>/<cipher>[/ECDH=<group> | /DH=<bits>]", e.g. TLSv1.3/TLS_AES_256_GCM_SHA384/ECDH=X25519
TLS_TEXT = re.compile(r"TLSv1\.[0-3]/[A-Za-z0-9_-]+(/(ECDH=[A-Za-z0-9_-]+|DH=\d+))?")
CLOSED = (ConnectionError, ssl.SSLError, socket.timeout, OSError)


# ---------------------------------------------------------------------------
# helpers


def client_tls(tls_files, mode="require", ca=False, **extra):
    """[pgbouncer] settings for client TLS with the test server certificate."""
    ini = {"client_tls_sslmode": mode, "client_tls_key_file": str(tls_files.server_key),
           "client_tls_cert_file": str(tls_files.server_cert), "log_connections": 1, "log_disconnections": 1}
    if ca:
        ini["client_tls_ca_file"] = str(tls_files.ca_cert)
    ini.update(extra)
    return ini


def tls_bouncer(bouncer, tls_files, mode="require", ca=False, users_txt=USERS_TXT, **extra):
    return bouncer(ini_overrides=client_tls(tls_files, mode, ca, **extra), users_txt=users_txt)


def show(b, what):
    """SHOW <what> as dicts, through the Unix socket (which never needs TLS)."""
    with psycopg.connect(host=str(b.dir), port=b.port, dbname="pgbouncer", user="pgbouncer",
                         autocommit=True, connect_timeout=10) as conn:
        cur = conn.execute(f"SHOW {what}")
        cols = [d.name for d in cur.description]
        return [dict(zip(cols, row)) for row in cur.fetchall()]


def client_context(alpn=None, cert=None, key=None, ca=None, max_version=None):
    """A Python TLS client context; verifies the pooler only when `ca` is given."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if ca:
        ctx.load_verify_locations(cafile=str(ca))
    else:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if alpn:
        ctx.set_alpn_protocols(alpn)
    if cert:
        ctx.load_cert_chain(str(cert), str(key))
    if max_version:
        ctx.maximum_version = max_version
    return ctx


class TlsWire(PgWire):
    """PgWire over TLS: a close without close_notify (or a TLS alert) is an EOF too."""

    def _fill(self, n):
        try:
            return super()._fill(n)
        except (ssl.SSLError, ConnectionError):
            return False


def tls_wire(port, ctx=None, direct=False):
    """A PgWire whose socket speaks TLS: after SSLRequest and its 'S', or
    direct TLS (the ClientHello is the first thing sent)."""
    w = TlsWire(port)
    if not direct:
        w.send(request_packet(SSL_REQUEST))
        answer = w.read_byte()
        assert answer == b"S", f"SSLRequest answered {answer!r}, expected b'S' (TLS enabled)"
    w.sock = (ctx or client_context()).wrap_socket(w.sock, server_hostname="localhost")
    return w


def read_to_eof(sock):
    """Everything the peer sends until it closes; TLS errors and resets count
    as the close. The peer must close within the socket's timeout (DEADLINE)."""
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
    except socket.timeout:
        raise AssertionError(f"the pooler did not close the connection (got {data[:40]!r})") from None
    except CLOSED:
        return data


def peer_cert(port):
    """The DER certificate a new TLS connection to the pooler is shown."""
    w = tls_wire(port)
    try:
        return w.sock.getpeercert(binary_form=True)
    finally:
        w.close()


def login_fails(connect):
    """Calls connect(); returns the error text it must fail with."""
    with pytest.raises(psycopg.OperationalError) as e:
        conn = connect()
        conn.close()
    return str(e.value)


def check_tls_select(conn):
    assert conn.pgconn.ssl_in_use, "the connection does not use TLS"
    assert conn.execute("SELECT 1").fetchone() == (1,)


def tls_connect(b, tls_files, sslmode="require", user="postgres", **kw):
    """psycopg over TLS to the pooler; the test CA is the root for verify-*."""
    kw.setdefault("sslrootcert", str(tls_files.ca_cert))
    return b.connect(user=user, sslmode=sslmode, **kw)


class Bystander:
    """A TLS client that keeps running queries in a thread while a test
    misbehaves next to it; on leaving, it must have seen no error."""

    def __init__(self, b, tls_files):
        self.conn = tls_connect(b, tls_files, autocommit=True, application_name="bystander")
        check_tls_select(self.conn)
        self.errors = []
        self.count = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        i = 0
        while not self.done.is_set():
            try:
                row = self.conn.execute("SELECT %s::int", [i]).fetchone()
                assert row == (i,), row
                self.count += 1
            except Exception as e:  # reported by __exit__
                self.errors.append(e)
                return
            i += 1
            time.sleep(0.01)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        self.done.set()
        self.thread.join(DEADLINE)
        if exc_type is None:
            assert not self.errors, f"the bystander saw errors: {self.errors!r}"
            assert self.count > 0, "the bystander ran no query"
            check_tls_select(self.conn)


def wait_exit_or_up(b):
    """Starts b expecting a start-up failure; returns (exit code, log + stderr).
    Fails at once when pgbouncer comes up instead."""
    b.start(wait=False)

    def ended():
        if not b.alive():
            return True
        if "process up" in b.log_text():
            raise AssertionError(f"pgbouncer started instead of failing\n{b.describe()}")
        return False

    wait_for(ended, "pgbouncer to exit")
    return b.returncode, b.log_text() + b.stderr()


# ---------------------------------------------------------------------------
# client side: SSLRequest, modes, verification by libpq


@pytest.mark.parametrize("mode", ["disable", "allow", "prefer", "require", "verify-ca", "verify-full"])
def test_ssl_request_answer(bouncer, tls_files, mode):
    b = tls_bouncer(bouncer, tls_files, mode, ca=True)
    w = PgWire(b.port)
    w.send(request_packet(SSL_REQUEST))
    assert w.read_byte() == (b"N" if mode == "disable" else b"S")
    w.close()


@pytest.mark.parametrize("mode", ["allow", "prefer", "require"])
def test_libpq_sslmodes_against_pooler(bouncer, tls_files, mode):
    """libpq's require, verify-ca and verify-full all succeed with the test CA
    as root; the pooler's certificate names 127.0.0.1 and localhost."""
    b = tls_bouncer(bouncer, tls_files, mode)
    for sslmode in ("require", "verify-ca", "verify-full"):
        with tls_connect(b, tls_files, sslmode, autocommit=True) as conn:
            check_tls_select(conn)
    with tls_connect(b, tls_files, "verify-full", host="localhost", hostaddr="127.0.0.1") as conn:
        check_tls_select(conn)


def test_libpq_verify_full_wrong_name(bouncer, tls_files):
    b = tls_bouncer(bouncer, tls_files)
    err = login_fails(lambda: tls_connect(b, tls_files, "verify-full", host="not-in-cert.invalid",
                                          hostaddr="127.0.0.1"))
    assert "does not match host name" in err, err
    with tls_connect(b, tls_files, "verify-full") as conn:
        check_tls_select(conn)


@pytest.mark.parametrize("sslmode", ["verify-ca", "verify-full"])
def test_libpq_verify_wrong_ca(bouncer, tls_files, sslmode):
    b = tls_bouncer(bouncer, tls_files)
    err = login_fails(lambda: tls_connect(b, tls_files, sslmode, sslrootcert=str(tls_files.other_ca_cert)))
    assert "certificate verify failed" in err, err
    with tls_connect(b, tls_files, sslmode) as conn:
        check_tls_select(conn)


@pytest.mark.parametrize("mode", ["require", "verify-ca", "verify-full"])
def test_required_tls_refuses_plain_tcp(bouncer, tls_files, mode):
    b = tls_bouncer(bouncer, tls_files, mode, ca=True)
    w = PgWire(b.port)
    w.startup()
    w.expect_fatal("SSL required")
    err = login_fails(lambda: b.connect(sslmode="disable"))
    assert "SSL required" in err, err


def test_unix_socket_never_needs_tls(bouncer, tls_files):
    b = tls_bouncer(bouncer, tls_files, "verify-full", ca=True)
    with b.connect(host=str(b.dir), autocommit=True) as conn:
        assert not conn.pgconn.ssl_in_use
        assert conn.execute("SELECT 1").fetchone() == (1,)
    w = PgWire(b.port, host=str(b.dir))
    w.send(request_packet(SSL_REQUEST))
    assert w.read_byte() == b"N"
    w.login()
    assert w.simple_query("SELECT 2") == ([["2"]], None)
    w.close()


def test_tls_column_and_login_log(bouncer, tls_files):
    """SHOW CLIENTS `tls` is empty for a plain client and protocol/cipher/group
    text for a TLS client; the login log line carries the same text (or `no`)."""
    b = tls_bouncer(bouncer, tls_files, "prefer")
    plain = b.connect(sslmode="disable", autocommit=True, application_name="plain-client")
    secure = tls_connect(b, tls_files, autocommit=True, application_name="tls-client")
    assert not plain.pgconn.ssl_in_use
    check_tls_select(secure)
    plain.execute("SELECT 1")
    rows = {r["application_name"]: r for r in show(b, "CLIENTS")}
    assert rows["plain-client"]["tls"] == ""
    tls_text = rows["tls-client"]["tls"]
    assert tls_text.startswith("TLSv1.3/"), tls_text
    assert TLS_TEXT.fullmatch(tls_text), tls_text
    for name, expected in (("plain-client", "no"), ("tls-client", tls_text)):
        port = rows[name]["port"]
        m = b.wait_log(rf"C-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:{port} login attempt: "
                       r"db=postgres user=postgres tls=(\S+) replication=no$")
        assert m.group(1) == expected, m.group(0)


def test_tls12_column_names_the_group(bouncer, tls_files):
    b = tls_bouncer(bouncer, tls_files, client_tls_protocols="tlsv1.2")
    w = tls_wire(b.port, client_context(max_version=ssl.TLSVersion.TLSv1_2))
    w.login(application_name="tls12-client")
    assert w.sock.version() == "TLSv1.2"
    row = next(r for r in show(b, "CLIENTS") if r["application_name"] == "tls12-client")
    assert row["tls"].startswith(f"TLSv1.2/{w.sock.cipher()[0]}/"), row["tls"]
    assert TLS_TEXT.fullmatch(row["tls"]), row["tls"]
    w.close()


def test_client_tls_protocols_refuses_older_clients(bouncer, tls_files):
    b = tls_bouncer(bouncer, tls_files, client_tls_protocols="tlsv1.3")
    with pytest.raises(CLOSED):
        tls_wire(b.port, client_context(max_version=ssl.TLSVersion.TLSv1_2))
    w = tls_wire(b.port)
    assert w.sock.version() == "TLSv1.3"
    w.login()
    w.close()


def test_client_tls13_ciphers(bouncer, tls_files):
    b = tls_bouncer(bouncer, tls_files, client_tls13_ciphers="TLS_CHACHA20_POLY1305_SHA256")
    w = tls_wire(b.port)
    assert w.sock.cipher()[0] == "TLS_CHACHA20_POLY1305_SHA256"
    w.login()
    w.close()


def test_no_session_tickets(bouncer, tls_files):
    """PostgreSQL clients never resume sessions: the pooler sends no tickets (DESIGN.md §8)."""
    b = tls_bouncer(bouncer, tls_files)
    w = tls_wire(b.port)
    w.login()
    assert w.simple_query("SELECT 1") == ([["1"]], None)  # tickets would have arrived by now
    assert w.sock.session is not None and not w.sock.session.has_ticket
    w.close()


def test_tls_with_two_workers(bouncer, tls_files):
    """TLS logins work whichever worker takes them, and SHOW WORKERS counts the handshakes."""
    b = tls_bouncer(bouncer, tls_files, min_workers=2, max_workers=2)
    wait_for(lambda: len([w for w in show(b, "WORKERS") if w["state"] == "active"]) == 2, "two active workers")
    before = sum(w["tls_handshakes"] for w in show(b, "WORKERS"))
    for i in range(20):
        with tls_connect(b, tls_files, "verify-full", autocommit=True) as conn:
            assert conn.pgconn.ssl_in_use
            assert conn.execute("SELECT %s::int", [i]).fetchone() == (i,)
    after = sum(w["tls_handshakes"] for w in show(b, "WORKERS"))
    assert after - before >= 20, (before, after)


# ---------------------------------------------------------------------------
# direct TLS (PostgreSQL 17 sslnegotiation=direct)


def test_direct_tls_with_alpn(bouncer, tls_files):
    b = tls_bouncer(bouncer, tls_files)
    w = tls_wire(b.port, client_context(alpn=["postgresql"]), direct=True)
    assert w.sock.selected_alpn_protocol() == "postgresql"
    w.startup(application_name="direct-client")
    first = w.read_msg()
    assert first is not None and first[0] == b"R", first
    assert w.read_until(b"Z")[-1][0] == b"Z"
    assert w.simple_query("SELECT 3") == ([["3"]], None)
    row = next(r for r in show(b, "CLIENTS") if r["application_name"] == "direct-client")
    assert row["tls"].startswith("TLSv1.3/"), row
    w.close()


@pytest.mark.parametrize("alpn", [None, ["http/1.1"]], ids=["no-alpn", "other-alpn"])
def test_direct_tls_without_postgresql_alpn_is_closed(bouncer, tls_files, alpn):
    b = tls_bouncer(bouncer, tls_files)
    # control: the same pooler takes direct TLS that announces "postgresql"
    ok = tls_wire(b.port, client_context(alpn=["postgresql"]), direct=True)
    ok.login()
    ok.close()
    with Bystander(b, tls_files):
        sock = socket.create_connection(("127.0.0.1", b.port), timeout=DEADLINE)
        try:
            tls = client_context(alpn=alpn).wrap_socket(sock, server_hostname="localhost")
        except CLOSED:
            pass  # refused during the handshake
        else:
            try:
                tls.sendall(startup_packet({"user": "postgres", "database": "postgres"}))
            except CLOSED:
                pass
            data = read_to_eof(tls)
            assert not data.startswith(b"R"), f"logged in without ALPN postgresql: {data!r}"
            tls.close()
    assert b.alive()


def test_direct_tls_when_disabled_is_not_served(bouncer, tls_files):
    b = tls_bouncer(bouncer, tls_files, "disable")
    sock = socket.create_connection(("127.0.0.1", b.port), timeout=DEADLINE)
    try:
        client_context(alpn=["postgresql"]).wrap_socket(sock, server_hostname="localhost")
    except CLOSED:
        pass
    else:
        pytest.fail("a TLS handshake succeeded with client_tls_sslmode=disable")
    finally:
        sock.close()
    with b.connect(autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


# ---------------------------------------------------------------------------
# client certificates


@pytest.mark.parametrize("mode", ["verify-ca", "verify-full"])
def test_verify_modes_need_a_client_certificate(bouncer, tls_files, mode):
    b = tls_bouncer(bouncer, tls_files, mode, ca=True)
    good = {"sslcert": str(tls_files.client_cert("postgres")), "sslkey": str(tls_files.client_key("postgres"))}
    with tls_connect(b, tls_files, "verify-full", **good) as conn:
        check_tls_select(conn)
    missing = str(b.dir / "no-such-client.crt")  # libpq sends no certificate
    login_fails(lambda: tls_connect(b, tls_files, "verify-full", sslcert=missing))
    login_fails(lambda: tls_connect(b, tls_files, "verify-full", sslcert=str(tls_files.foreign_client_cert),
                                    sslkey=str(tls_files.foreign_client_key)))
    assert b.alive()
    with tls_connect(b, tls_files, "verify-full", **good) as conn:
        check_tls_select(conn)


def test_client_certificate_optional_with_ca(bouncer, tls_files):
    """With client_tls_ca_file and sslmode require a certificate is asked
    for but optional; one that is sent must verify."""
    b = tls_bouncer(bouncer, tls_files, "require", ca=True)
    with tls_connect(b, tls_files, sslcert=str(b.dir / "no-such-client.crt")) as conn:
        check_tls_select(conn)
    with tls_connect(b, tls_files, sslcert=str(tls_files.client_cert("alice")),
                     sslkey=str(tls_files.client_key("alice"))) as conn:
        check_tls_select(conn)
    login_fails(lambda: tls_connect(b, tls_files, sslcert=str(tls_files.foreign_client_cert),
                                    sslkey=str(tls_files.foreign_client_key)))


def test_no_client_certificate_request_without_ca(bouncer, tls_files):
    """Without client_tls_ca_file the pooler asks no client for a certificate:
    one that libpq would send is never looked at."""
    b = tls_bouncer(bouncer, tls_files, "require")
    with tls_connect(b, tls_files, sslcert=str(tls_files.foreign_client_cert),
                     sslkey=str(tls_files.foreign_client_key)) as conn:
        check_tls_select(conn)


@pytest.fixture
def cert_bouncer(bouncer, tls_files):
    return tls_bouncer(bouncer, tls_files, "verify-full", ca=True, auth_type="cert")


def test_cert_auth_cn_is_the_user(cert_bouncer, tls_files):
    with tls_connect(cert_bouncer, tls_files, "verify-full", sslcert=str(tls_files.client_cert("postgres")),
                     sslkey=str(tls_files.client_key("postgres"))) as conn:
        check_tls_select(conn)
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)


def test_cert_auth_cn_of_another_user(cert_bouncer, tls_files):
    ctx = client_context(cert=tls_files.client_cert("alice"), key=tls_files.client_key("alice"))
    w = tls_wire(cert_bouncer.port, ctx)
    w.startup(user="postgres")
    w.expect_fatal("certificate authentication failed")
    err = login_fails(lambda: tls_connect(cert_bouncer, tls_files, sslcert=str(tls_files.client_cert("alice")),
                                          sslkey=str(tls_files.client_key("alice"))))
    assert "certificate authentication failed" in err, err


@pytest.mark.parametrize("cert", ["none", "wrong-ca"])
def test_cert_auth_without_valid_certificate(cert_bouncer, tls_files, cert):
    if cert == "none":
        kw = {"sslcert": str(cert_bouncer.dir / "no-such-client.crt")}
    else:
        kw = {"sslcert": str(tls_files.foreign_client_cert), "sslkey": str(tls_files.foreign_client_key)}
    err = login_fails(lambda: tls_connect(cert_bouncer, tls_files, **kw))
    assert "certificate authentication failed" not in err, f"the handshake itself should fail: {err}"
    assert cert_bouncer.alive()
    # control: the pooler does serve a client with a good certificate
    with tls_connect(cert_bouncer, tls_files, sslcert=str(tls_files.client_cert("postgres")),
                     sslkey=str(tls_files.client_key("postgres"))) as conn:
        check_tls_select(conn)


# ---------------------------------------------------------------------------
# certificate reload


def reload_bouncer(bouncer, tls_files):
    """Two workers serving copies of the first server certificate, kept in the instance directory."""
    b = bouncer(ini_overrides={"min_workers": 2, "max_workers": 2}, start=False, users_txt=USERS_TXT)
    key = tls_files.copy(tls_files.server_key, b.dir, "pooler.key", b.run_as)
    cert = tls_files.copy(tls_files.server_cert, b.dir, "pooler.crt", b.run_as)
    b.update(**client_tls(tls_files, client_tls_key_file=str(key), client_tls_cert_file=str(cert)))
    b.write_ini()
    b.start()
    return b, key, cert


def every_new_connection_sees(b, der, n=12):
    return all(peer_cert(b.port) == der for _ in range(n))


def test_sighup_loads_renewed_certificate_in_place(bouncer, tls_files):
    """The ACME case: the files are replaced under the same names, then SIGHUP."""
    b, key, cert = reload_bouncer(bouncer, tls_files)
    old, new = tls_files.der(tls_files.server_cert), tls_files.der(tls_files.server2_cert)
    assert every_new_connection_sees(b, old)
    key.write_bytes(tls_files.server2_key.read_bytes())
    cert.write_bytes(tls_files.server2_cert.read_bytes())
    b.reload()
    wait_for(lambda: every_new_connection_sees(b, new), "new connections to get the renewed certificate")
    with tls_connect(b, tls_files, "verify-full") as conn:
        check_tls_select(conn)


def test_admin_reload_loads_new_certificate_files(bouncer, tls_files):
    b, key, cert = reload_bouncer(bouncer, tls_files)
    established = tls_connect(b, tls_files, autocommit=True)
    check_tls_select(established)
    b.update(client_tls_key_file=str(tls_files.server2_key), client_tls_cert_file=str(tls_files.server2_cert))
    b.write_ini()
    with psycopg.connect(host=str(b.dir), port=b.port, dbname="pgbouncer", user="pgbouncer",
                         autocommit=True) as admin:
        admin.execute("RELOAD")
    new = tls_files.der(tls_files.server2_cert)
    wait_for(lambda: every_new_connection_sees(b, new), "new connections to get the new certificate")
    check_tls_select(established)  # a connection made before the reload goes on


def test_reload_with_bad_certificate_keeps_the_old_one(bouncer, tls_files):
    b, key, cert = reload_bouncer(bouncer, tls_files)
    old = tls_files.der(tls_files.server_cert)
    assert every_new_connection_sees(b, old)
    established = tls_connect(b, tls_files, autocommit=True)
    check_tls_select(established)
    mark = b.log_mark()
    key.write_bytes(tls_files.wrong_key.read_bytes())  # no longer the certificate's key
    b.reload()
    b.wait_log(rf"{re.escape(str(key))}.*does not match|does not match.*{re.escape(str(key))}", after=mark)
    assert b.alive()
    assert every_new_connection_sees(b, old)
    check_tls_select(established)
    with tls_connect(b, tls_files, "verify-full") as conn:
        check_tls_select(conn)


def test_console_reload_with_bad_certificate_fails(bouncer, tls_files):
    """RELOAD on the console says when the TLS files did not load (spec/admin.md
    RELOAD: F0000 on a TLS error), where it used to answer RELOAD as if the new
    certificate were in use. The other settings are taken, the old TLS set-up stays;
    once the files are fixed, RELOAD succeeds and serves the new certificate."""
    b, key, cert = reload_bouncer(bouncer, tls_files)
    old, new = tls_files.der(tls_files.server_cert), tls_files.der(tls_files.server2_cert)
    established = tls_connect(b, tls_files, autocommit=True)
    check_tls_select(established)
    mark = b.log_mark()
    cert.write_bytes(tls_files.server2_cert.read_bytes())  # the renewed certificate, the key not yet
    b.update(server_login_retry=7)
    b.write_ini()
    with psycopg.connect(host=str(b.dir), port=b.port, dbname="pgbouncer", user="pgbouncer",
                         autocommit=True) as admin:
        with pytest.raises(psycopg.Error) as e:
            admin.execute("RELOAD")
        assert e.value.sqlstate == "F0000", e.value
        assert e.value.diag.message_primary == "RELOAD failed, see logs for additional details"
        b.wait_log(rf"ERROR TLS setup failed: failed to load private key file \"{re.escape(str(key))}\": key "
                   r"values mismatch \(client_tls_key_file does not match", after=mark)
        b.wait_log(r"ERROR TLS configuration could not be reloaded, keeping old configuration", after=mark)
        cfg = {r[0]: r[1] for r in admin.execute("SHOW CONFIG").fetchall()}
        assert cfg["server_login_retry"] == "7"
        assert every_new_connection_sees(b, old)
        check_tls_select(established)
        key.write_bytes(tls_files.server2_key.read_bytes())
        assert admin.execute("RELOAD").statusmessage == "RELOAD"
    assert every_new_connection_sees(b, new)
    check_tls_select(established)


TLS_NOT_APPLIED = "TLS settings could not be applied, still using old configuration"


def console_notices(b):
    """An admin console over the Unix socket and the list its NOTICE texts go to."""
    admin = psycopg.connect(host=str(b.dir), port=b.port, dbname="pgbouncer", user="pgbouncer", autocommit=True,
                            connect_timeout=10)
    seen = []
    admin.add_notice_handler(lambda d: seen.append(d.message_primary))
    return admin, seen


def test_admin_set_of_tls_settings_rebuilds_or_keeps_tls(bouncer, tls_files):
    """SET of a client_tls_* key takes effect for new connections; a value TLS
    cannot use is stored with a NOTICE while the running TLS stays (spec/admin.md §3)."""
    b = tls_bouncer(bouncer, tls_files, max_workers=1)
    admin, seen = console_notices(b)
    with admin:
        admin.execute("SET client_tls_protocols = 'tlsv1.2'")
        assert seen == []
        with tls_connect(b, tls_files, application_name="after-set") as conn:
            check_tls_select(conn)
            tls = [r for r in admin.execute("SHOW CLIENTS").fetchall() if "after-set" in r]
            assert len(tls) == 1 and any(str(v).startswith("TLSv1.2/") for v in tls[0]), tls
        # a certificate that does not go with the key: taken, but the running TLS stays
        cur = admin.execute(f"SET client_tls_cert_file = '{tls_files.server2_cert}'")
        assert cur.statusmessage == f"SET client_tls_cert_file={tls_files.server2_cert}"
        assert seen == [TLS_NOT_APPLIED]
        cfg = {r[0]: r[1] for r in admin.execute("SHOW CONFIG").fetchall()}
        assert cfg["client_tls_cert_file"] == str(tls_files.server2_cert)
        assert every_new_connection_sees(b, tls_files.der(tls_files.server_cert), n=3)
        # the matching key completes the pair: now it is used
        admin.execute(f"SET client_tls_key_file = '{tls_files.server2_key}'")
        assert seen == [TLS_NOT_APPLIED]
        assert every_new_connection_sees(b, tls_files.der(tls_files.server2_cert), n=3)
        admin.execute("SET client_tls_protocols = 'secure'")
        with tls_connect(b, tls_files, application_name="after-reset") as conn:
            check_tls_select(conn)
            tls = [r for r in admin.execute("SHOW CLIENTS").fetchall() if "after-reset" in r]
            assert len(tls) == 1 and any(str(v).startswith("TLSv1.3/") for v in tls[0]), tls
    b.wait_log(r"ERROR TLS setup failed: failed to load private key file .*\(client_tls_key_file")


def test_admin_set_enables_tls_step_by_step(bouncer, tls_files):
    """The order PgBouncer takes: mode first, then key, then certificate. Each
    incomplete step is accepted with a NOTICE and changes nothing; the last one
    turns TLS on in every worker."""
    b = bouncer(ini_overrides={"min_workers": 2, "max_workers": 2}, users_txt=USERS_TXT)
    admin, seen = console_notices(b)
    with admin:
        cur = admin.execute("SET client_tls_sslmode = 'require'")
        assert cur.statusmessage == "SET client_tls_sslmode=require"
        assert seen == [TLS_NOT_APPLIED]  # once, though both workers answered
        with b.connect(sslmode="disable", autocommit=True) as conn:  # still the old configuration
            assert conn.execute("SELECT 1").fetchone() == (1,)
        cur = admin.execute(f"SET client_tls_key_file = '{tls_files.server_key}'")
        assert cur.statusmessage == f"SET client_tls_key_file={tls_files.server_key}"
        assert seen == [TLS_NOT_APPLIED] * 2
        cur = admin.execute(f"SET client_tls_cert_file = '{tls_files.server_cert}'")
        assert cur.statusmessage == f"SET client_tls_cert_file={tls_files.server_cert}"
        assert seen == [TLS_NOT_APPLIED] * 2
        cfg = {r[0]: r[1] for r in admin.execute("SHOW CONFIG").fetchall()}
        assert (cfg["client_tls_sslmode"], cfg["client_tls_key_file"], cfg["client_tls_cert_file"]) == (
            "require", str(tls_files.server_key), str(tls_files.server_cert))
    for _ in range(6):  # new connections land on either worker
        with tls_connect(b, tls_files, "verify-full") as conn:
            check_tls_select(conn)
        assert "SSL required" in login_fails(lambda: b.connect(sslmode="disable"))


def test_admin_set_auth_type_cert_with_tls(bouncer, tls_files):
    """auth_type=cert needs client certificates: refused while the TLS
    settings in force cannot ask for them, taken (with the NOTICE) while TLS
    settings set before it are still incomplete, in force once they are."""
    b = tls_bouncer(bouncer, tls_files, "require")
    admin, seen = console_notices(b)
    good = {"sslcert": str(tls_files.client_cert("postgres")), "sslkey": str(tls_files.client_key("postgres"))}
    with admin:
        with pytest.raises(psycopg.Error, match="SET failed"):
            admin.execute("SET auth_type = 'cert'")
        assert {r[0]: r[1] for r in admin.execute("SHOW CONFIG").fetchall()}["auth_type"] == "trust"
        admin.execute("SET client_tls_sslmode = 'verify-full'")  # no CA file yet
        assert seen == [TLS_NOT_APPLIED]
        assert admin.execute("SET auth_type = 'cert'").statusmessage == "SET auth_type=cert"
        assert seen == [TLS_NOT_APPLIED] * 2
        admin.execute(f"SET client_tls_ca_file = '{tls_files.ca_cert}'")
        assert seen == [TLS_NOT_APPLIED] * 2
    with tls_connect(b, tls_files, "verify-full", **good) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
    login_fails(lambda: tls_connect(b, tls_files, "verify-full", sslcert=str(b.dir / "no-such-client.crt")))


def test_admin_set_client_tls13_ciphers(bouncer, tls_files):
    b = tls_bouncer(bouncer, tls_files, min_workers=2, max_workers=2)
    w = tls_wire(b.port)
    assert w.sock.cipher()[0] != "TLS_CHACHA20_POLY1305_SHA256"  # not the server's first choice
    w.close()
    admin, seen = console_notices(b)
    with admin:
        admin.execute("SET client_tls13_ciphers = 'TLS_CHACHA20_POLY1305_SHA256'")
        assert seen == []
    for _ in range(6):
        w = tls_wire(b.port)
        assert w.sock.cipher()[0] == "TLS_CHACHA20_POLY1305_SHA256"
        w.login()
        w.close()


# ---------------------------------------------------------------------------
# start-up errors


def _unreadable_key(b, tls_files):
    key = tls_files.copy(tls_files.server_key, b.dir, "unreadable.key", b.run_as)
    os.chmod(key, 0)
    return {"client_tls_key_file": str(key)}, ["client_tls_key_file", str(key), "Permission denied"]


STARTUP_ERRORS = {
    "key-does-not-match": lambda b, t: (
        {"client_tls_key_file": str(t.wrong_key)},
        ["client_tls_key_file", str(t.wrong_key), "does not match", str(t.server_cert)]),
    "unreadable-key": _unreadable_key,
    "missing-key": lambda b, t: (
        {"client_tls_key_file": str(b.dir / "missing.key")},
        ["client_tls_key_file", str(b.dir / "missing.key"), "No such file or directory"]),
    "expired-cert": lambda b, t: (
        {"client_tls_cert_file": str(t.expired_cert)},
        ["client_tls_cert_file", str(t.expired_cert), "expired"]),
    "verify-ca-without-ca": lambda b, t: (
        {"client_tls_sslmode": "verify-ca"}, ["client_tls_ca_file", "verify-ca"]),
    "verify-full-without-ca": lambda b, t: (
        {"client_tls_sslmode": "verify-full"}, ["client_tls_ca_file", "verify-full"]),
    "cert-auth-without-ca": lambda b, t: (
        {"client_tls_sslmode": "verify-full", "auth_type": "cert"}, ["client_tls_ca_file"]),
    "cert-auth-needs-verify-full": lambda b, t: (
        {"auth_type": "cert", "client_tls_ca_file": str(t.ca_cert)}, ["auth_type=cert", "verify-full"]),
    "server-verify-full-without-ca": lambda b, t: (
        {"server_tls_sslmode": "verify-full"}, ["server_tls_ca_file"]),
    "unknown-protocol": lambda b, t: (
        {"client_tls_protocols": "tlsv1.2,tlsv9"}, ["client_tls_protocols", "tlsv9"]),
}


@pytest.mark.parametrize("case", list(STARTUP_ERRORS))
def test_startup_tls_error(bouncer, tls_files, case):
    b = bouncer(start=False, users_txt=USERS_TXT)
    settings, expected = STARTUP_ERRORS[case](b, tls_files)
    b.update(**client_tls(tls_files, **settings))
    b.write_ini()
    rc, text = wait_exit_or_up(b)
    assert rc == 1, f"exit code {rc}\n{text}"
    assert "TLS setup failed" in text, text
    line = next((ln for ln in text.splitlines() if all(e in ln for e in expected)), None)
    assert line is not None, f"no line naming all of {expected}:\n{text}"
    assert not port_listening(b.port)


# ---------------------------------------------------------------------------
# the fix: a server certificate without client_tls_ca_file, no system CA bundle


def test_no_ca_file_and_no_system_ca_bundle(bouncer, tls_files, hidden_ca_wrapper):
    """The regression test for fix 2 of issue 4: with client_tls_cert_file and
    client_tls_key_file but no client_tls_ca_file, on a machine without a
    system CA bundle, pgbouncer starts and serves TLS clients."""
    b = bouncer(ini_overrides=client_tls(tls_files, min_workers=2, max_workers=2), wrapper=hidden_ca_wrapper,
                env=NO_CA_ENV)
    # what the pooler sees: no bundle, and the OpenSSL variables point at nothing
    assert os.listdir(f"/proc/{b.pid}/root/etc/ssl/certs") == []
    environ = Path(f"/proc/{b.pid}/environ").read_bytes().split(b"\0")
    assert b"SSL_CERT_FILE=/nonexistent/cert.pem" in environ
    for i in range(4):
        with tls_connect(b, tls_files, autocommit=True) as conn:
            check_tls_select(conn)
    # a reload sets TLS up again, still without a bundle
    mark = b.log_mark()
    with psycopg.connect(host=str(b.dir), port=b.port, dbname="pgbouncer", user="pgbouncer",
                         autocommit=True) as admin:
        admin.execute("RELOAD")
    for i in range(4):
        with tls_connect(b, tls_files, "verify-full", autocommit=True) as conn:
            check_tls_select(conn)
    assert "TLS setup failed" not in b.log_text()[mark:], b.log_text()[mark:]


@pytest.mark.skipif(not SYSTEM_PGBOUNCER.exists(), reason=f"{SYSTEM_PGBOUNCER} is not installed")
def test_system_pgbouncer_fails_without_system_ca_bundle(bouncer, tls_files, hidden_ca_wrapper):
    """What the fix is about: PgBouncer (1.18 here) with the same settings
    starts with the bundle and dies without it."""
    ini = client_tls(tls_files)
    control = bouncer(ini_overrides=ini, binary=SYSTEM_PGBOUNCER)
    with tls_connect(control, tls_files, autocommit=True) as conn:
        check_tls_select(conn)
    control.stop(signal.SIGTERM)
    b = bouncer(ini_overrides=ini, binary=SYSTEM_PGBOUNCER, wrapper=hidden_ca_wrapper, env=NO_CA_ENV,
                start=False)
    rc, text = wait_exit_or_up(b)
    assert rc != 0, text
    assert "TLS setup failed" in text and "failed to load CA" in text, text


# ---------------------------------------------------------------------------
# server side: a cluster that takes TCP logins over TLS only


def server_tls_bouncer(bouncer, pg_ssl, tls_files, mode, ca=None, databases=None, **extra):
    # a failed TLS login is no ErrorResponse: waiting clients get client_login_timeout, soon
    ini = {"server_tls_sslmode": mode, "log_connections": 1, "log_disconnections": 1, "server_login_retry": 1,
           "client_login_timeout": 5}
    if ca is not None:
        ini["server_tls_ca_file"] = str(ca)
    ini.update(extra)
    return bouncer(ini_overrides=ini, databases=databases or {"postgres": pg_ssl.connstr("postgres")})


def server_uses_tls(b, dbname="postgres"):
    with b.connect(dbname=dbname, autocommit=True) as conn:
        row = conn.execute("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
    assert row[0] is True, row
    return row[1]


@pytest.mark.parametrize("mode", ["allow", "prefer", "require", "verify-ca", "verify-full"])
def test_server_tls_modes(bouncer, pg_ssl, tls_files, mode):
    b = server_tls_bouncer(bouncer, pg_ssl, tls_files, mode, ca=tls_files.ca_cert)
    assert server_uses_tls(b).startswith("TLSv1.")
    servers = [s for s in show(b, "SERVERS") if s["database"] == "postgres"]
    assert servers and all(s["tls"].startswith("TLSv1.") and TLS_TEXT.fullmatch(s["tls"]) for s in servers), servers
    b.wait_log(rf"S-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:{pg_ssl.port} SSL established: TLSv1\.[23]/\S+$")


def test_server_tls_default_prefer_builds_its_context_at_the_first_offer(bouncer, pg_ssl, tls_files):
    """server_tls_sslmode's default (prefer) with nothing else set: the server TLS context is made when the
    first server offers TLS (doc/benchmarks.md, "Memory against PgBouncer 1.25.2"), in every worker."""
    b = bouncer(ini_overrides={"min_workers": 2, "max_workers": 2, "log_connections": 1},
                databases={"postgres": pg_ssl.connstr("postgres")})
    seen = set()
    for _ in range(30):
        with b.connect(autocommit=True) as conn:
            row = conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
            assert row == (True,)
            seen.add(conn.info.backend_pid & 0xFF)
        if seen == {0, 1}:
            break
    assert seen == {0, 1}
    b.update(server_tls_sslmode="prefer")  # a reload keeps it working
    b.write_ini()
    b.reload()
    assert server_uses_tls(b).startswith("TLSv1.")


def test_server_tls_disable_against_hostssl_only(bouncer, pg_ssl, tls_files):
    b = server_tls_bouncer(bouncer, pg_ssl, tls_files, "disable")
    err = login_fails(lambda: b.connect())
    assert "pg_hba.conf" in err and "no encryption" in err, err
    assert b.alive()


@pytest.mark.parametrize("mode", ["verify-ca", "verify-full"])
def test_server_verify_wrong_ca(bouncer, pg_ssl, tls_files, mode):
    b = server_tls_bouncer(bouncer, pg_ssl, tls_files, mode, ca=tls_files.other_ca_cert)
    mark = b.log_mark()
    login_fails(lambda: b.connect())
    assert b.alive()
    assert re.search(r"certificate verify failed", b.log_text()[mark:], re.I), b.log_text()[mark:]
    # control: with the right CA the same pooler gets in
    b.update(server_tls_ca_file=str(tls_files.ca_cert))
    b.write_ini()
    b.reload()

    def works():
        try:
            return server_uses_tls(b)
        except psycopg.OperationalError:
            return False

    wait_for(works, "logins to work with the right server_tls_ca_file")


def test_server_verify_full_checks_the_address(bouncer, pg_ssl, tls_files):
    """The certificate names 127.0.0.1 but not 127.0.0.2 (the same cluster):
    verify-full refuses the second, verify-ca does not check names."""
    dbs = {"named": pg_ssl.connstr("postgres"),
           "unnamed": f"host=127.0.0.2 port={pg_ssl.port} dbname=postgres"}
    full = server_tls_bouncer(bouncer, pg_ssl, tls_files, "verify-full", ca=tls_files.ca_cert, databases=dbs)
    assert server_uses_tls(full, "named")
    login_fails(lambda: full.connect(dbname="unnamed"))
    assert full.alive()
    assert server_uses_tls(full, "named")
    ca_only = server_tls_bouncer(bouncer, pg_ssl, tls_files, "verify-ca", ca=tls_files.ca_cert, databases=dbs)
    assert server_uses_tls(ca_only, "unnamed")


def _resolves_only_to_loopback(name):
    try:
        return {a[4][0] for a in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)} == {"127.0.0.1"}
    except socket.gaierror:
        return False


def test_server_verify_full_checks_the_host_name(bouncer, pg_ssl, tls_files):
    """A DNS name in the certificate passes, another name of the same address does not."""
    if not _resolves_only_to_loopback("localhost"):
        pytest.skip("localhost does not resolve to 127.0.0.1 only")
    other = socket.gethostname()
    if other == "localhost" or not _resolves_only_to_loopback(other):
        pytest.skip(f"no second name for 127.0.0.1 ({other!r} does not resolve to it alone)")
    dbs = {"named": f"host=localhost port={pg_ssl.port} dbname=postgres",
           "unnamed": f"host={other} port={pg_ssl.port} dbname=postgres"}
    b = server_tls_bouncer(bouncer, pg_ssl, tls_files, "verify-full", ca=tls_files.ca_cert, databases=dbs)
    assert server_uses_tls(b, "named")
    login_fails(lambda: b.connect(dbname="unnamed"))
    assert b.alive()


def test_server_client_certificate(bouncer, pg_ssl, tls_files):
    """server_tls_key_file/cert_file: PostgreSQL's `cert` method lets the role pgbcert in."""
    dbs = {"postgres": pg_ssl.connstr("postgres", user="pgbcert")}
    b = server_tls_bouncer(bouncer, pg_ssl, tls_files, "verify-full", ca=tls_files.ca_cert, databases=dbs,
                           server_tls_key_file=str(tls_files.client_key("pgbcert")),
                           server_tls_cert_file=str(tls_files.client_cert("pgbcert")))
    with b.connect(autocommit=True) as conn:
        row = conn.execute("SELECT current_user, ssl, client_dn FROM pg_stat_ssl "
                           "WHERE pid = pg_backend_pid()").fetchone()
    assert row == ("pgbcert", True, "/CN=pgbcert"), row
    without = server_tls_bouncer(bouncer, pg_ssl, tls_files, "verify-full", ca=tls_files.ca_cert, databases=dbs)
    err = login_fails(lambda: without.connect())
    assert "certificate" in err, err


# ---------------------------------------------------------------------------
# bad input around the handshake


def test_plain_data_after_ssl_request(bouncer, tls_files):
    b = tls_bouncer(bouncer, tls_files)
    with Bystander(b, tls_files):
        w = PgWire(b.port)
        w.send(request_packet(SSL_REQUEST) + startup_packet({"user": "postgres", "database": "postgres"}))
        w.expect_fatal("received unencrypted data after SSL request")
        b.wait_log(r"received unencrypted data after SSL request")
    assert b.alive()


@pytest.mark.parametrize("garbage", [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x16\x03\x01\xff\xff" + b"\x00" * 64,
                                     b"\x00" * 5000], ids=["http", "bad-record", "zeros"])
def test_garbage_instead_of_client_hello(bouncer, tls_files, garbage):
    b = tls_bouncer(bouncer, tls_files)
    with Bystander(b, tls_files):
        w = PgWire(b.port)
        w.send(request_packet(SSL_REQUEST))
        assert w.read_byte() == b"S"
        try:
            w.send(garbage)
        except CLOSED:
            pass
        data = read_to_eof(w.sock)
        assert data == b"" or data[0] == 0x15, f"expected nothing or a TLS alert, got {data[:40]!r}"
        w.close()
    with tls_connect(b, tls_files) as conn:
        check_tls_select(conn)


@pytest.mark.parametrize("stall", ["after-S", "mid-hello", "direct-mid-hello"])
def test_stalled_handshake_is_closed_after_client_login_timeout(bouncer, tls_files, stall):
    b = tls_bouncer(bouncer, tls_files, client_login_timeout=2)
    with Bystander(b, tls_files):
        w = PgWire(b.port)
        if stall != "direct-mid-hello":
            w.send(request_packet(SSL_REQUEST))
            assert w.read_byte() == b"S"
        if stall != "after-S":
            w.send(b"\x16\x03\x01\x01\x00\x01\x00\x00\xfc\x03\x03")  # a ClientHello that stops early
        mark = b.log_mark()
        data = read_to_eof(w.sock)
        assert data == b"" or data[0] == 0x15, data[:40]
        b.wait_log(r"client_login_timeout", after=mark)
        w.close()
    assert b.alive()


def test_ssl_request_inside_tls_is_refused(bouncer, tls_files):
    b = tls_bouncer(bouncer, tls_files)
    with Bystander(b, tls_files):
        w = tls_wire(b.port)
        w.send(request_packet(SSL_REQUEST))
        data = read_to_eof(w.sock)
        assert not data.startswith(b"S"), data
        w.close()
    assert b.alive()


def test_tls_client_vanishes_mid_query(bouncer, tls_files):
    b = tls_bouncer(bouncer, tls_files)
    with Bystander(b, tls_files):
        for _ in range(5):
            w = tls_wire(b.port)
            w.login()
            w.send(query_message("SELECT repeat('x', 100000) FROM generate_series(1, 50)"))
            w.sock.close()
    assert b.alive()
    # only the bystander is left of the TLS clients
    wait_for(lambda: len([r for r in show(b, "CLIENTS") if r["tls"]]) == 1, "the vanished clients to be closed")


def test_transaction_pooling_with_tls_on_both_sides(bouncer, pg_ssl, tls_files):
    """Transaction mode with prepared statements over TLS to clients and to
    PostgreSQL: 6 clients share 2 servers; the pooler's own messages (renamed
    Binds, answers it gives itself) go in order through both TLS streams."""
    ini = client_tls(tls_files, "require", pool_mode="transaction", default_pool_size=2, server_tls_sslmode="require")
    b = bouncer(ini_overrides=ini, databases={"postgres": pg_ssl.connstr("postgres")})
    conns = [tls_connect(b, tls_files, autocommit=True, prepare_threshold=0) for _ in range(6)]
    try:
        pids = set()
        for rnd in range(5):
            for i, conn in enumerate(conns):
                assert conn.pgconn.ssl_in_use
                with conn.pipeline():
                    a = conn.execute("SELECT %s::int * 2, pg_backend_pid()", [i + rnd])
                    t = conn.execute("SELECT %s::text || 'x', ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                                     [str(i)])
                n, pid = a.fetchone()
                assert n == 2 * (i + rnd)
                assert t.fetchone() == (f"{i}x", True)
                pids.add(pid)
        assert len(pids) <= 2, pids
        servers = [s for s in show(b, "SERVERS") if s["database"] == "postgres"]
        assert servers and all(s["tls"].startswith("TLSv1.") for s in servers), servers
        assert all(s["prepared_statements"] == 2 for s in servers), servers
    finally:
        for conn in conns:
            conn.close()


def test_client_tls_ciphers(bouncer, tls_files):
    """client_tls_ciphers (TLS 1.2 and older) picks what a client gets."""
    b = tls_bouncer(bouncer, tls_files, client_tls_protocols="tlsv1.2",
                    client_tls_ciphers="ECDHE+CHACHA20:DHE+CHACHA20")
    w = tls_wire(b.port, client_context(max_version=ssl.TLSVersion.TLSv1_2))
    assert "CHACHA20" in w.sock.cipher()[0], w.sock.cipher()
    w.login()
    w.close()


def server_tls_text(b):
    with b.connect(autocommit=True) as conn:
        return conn.execute("SELECT version, cipher FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()


def test_server_tls_protocols_and_ciphers(bouncer, pg_ssl, tls_files):
    """server_tls_protocols, server_tls_ciphers and server_tls13_ciphers
    decide what the pooler offers PostgreSQL: its pg_stat_ssl row shows it."""
    b = server_tls_bouncer(bouncer, pg_ssl, tls_files, "require", server_tls_protocols="tlsv1.2",
                           server_tls_ciphers="ECDHE+CHACHA20:DHE+CHACHA20")
    version, cipher = server_tls_text(b)
    assert version == "TLSv1.2" and "CHACHA20" in cipher, (version, cipher)
    b2 = server_tls_bouncer(bouncer, pg_ssl, tls_files, "require", server_tls_protocols="tlsv1.3",
                            server_tls13_ciphers="TLS_CHACHA20_POLY1305_SHA256")
    assert server_tls_text(b2) == ("TLSv1.3", "TLS_CHACHA20_POLY1305_SHA256")


def test_client_tls_ecdhcurve(bouncer, tls_files):
    """client_tls_ecdhcurve names the key-exchange group a TLS client gets;
    the tls column of SHOW CLIENTS shows it."""
    b = tls_bouncer(bouncer, tls_files, client_tls_ecdhcurve="secp384r1")
    w = tls_wire(b.port)
    w.login(application_name="ecdh-client")
    row = next(r for r in show(b, "CLIENTS") if r["application_name"] == "ecdh-client")
    assert row["tls"].endswith("/ECDH=secp384r1"), row["tls"]
    w.close()
