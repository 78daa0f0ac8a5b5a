"""Malformed and hostile input on the client port (spec/behaviours.md §1,
spec/cli.md §7): every bad packet gets the documented FATAL (SQLSTATE 08P01)
or a silent close, and neither the pooler nor a well-behaved client that is
connected at the same time notices anything.

The raw protocol client is test/pgwire.py; check_unharmed() is in
test/helpers.py.
"""

import os
import re
import socket
import struct
import subprocess
import threading
import time

import pytest

from conftest import pid_alive, SANITIZE_DIR, wait_for
from helpers import check_unharmed, workers
from pgwire import (
    CANCEL_REQUEST, error_fields, GSSENC_REQUEST, message, PgWire, PROTO_V2, PROTO_V3,
    query_message, request_packet, SSL_REQUEST, startup_packet,
)


# ---------------------------------------------------------------------------
# fixtures


@pytest.fixture
def with_bystander(bouncer):
    """A running pooler plus a well-behaved client that has already used a server.

    Returns (bouncer, bystander); call check_unharmed() at the end of a test."""

    def make(**ini):
        b = bouncer(ini_overrides=ini)
        bystander = b.connect(autocommit=True, password="postgres")
        assert bystander.execute("SELECT 1").fetchone() == (1,)
        return b, bystander

    return make



BAD_HEADER = re.compile(r"bad packet header: '[0-9a-f]+'")


# ---------------------------------------------------------------------------
# startup phase


def test_garbage_startup_packet(with_bystander):
    b, bystander = with_bystander()
    w = PgWire(b.port)
    w.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    err = w.expect_fatal(BAD_HEADER)
    assert err["M"].startswith("bad packet header: '47455420"), err
    check_unharmed(b, bystander)


@pytest.mark.parametrize("length", [0, 4, 7, -1, -8], ids=["zero", "four", "seven", "minus1", "minus8"])
def test_startup_length_out_of_range(with_bystander, length):
    b, bystander = with_bystander()
    w = PgWire(b.port)
    w.send(struct.pack("!iI", length, PROTO_V3) + b"user\0postgres\0\0")
    w.expect_fatal(BAD_HEADER)
    check_unharmed(b, bystander)


def test_startup_longer_than_startup_limit(with_bystander):
    b, bystander = with_bystander()
    w = PgWire(b.port)
    w.send(struct.pack("!II", 70000, PROTO_V3) + b"x" * 100)
    w.expect_fatal(BAD_HEADER)
    check_unharmed(b, bystander)


def test_truncated_startup_then_close(with_bystander):
    b, bystander = with_bystander()
    pkt = startup_packet({"user": "postgres", "database": "postgres"})
    mark = b.log_mark()
    w = PgWire(b.port)
    w.send(pkt[: len(pkt) // 2])
    w.close()
    b.wait_log(r"C-0x[0-9a-f]+: .*closing because: client unexpected eof", after=mark)
    check_unharmed(b, bystander)


def test_header_only_then_close(with_bystander):
    b, bystander = with_bystander()
    w = PgWire(b.port)
    w.send(b"\x00\x00")
    w.close()
    check_unharmed(b, bystander)


def test_old_v2_protocol(with_bystander):
    b, bystander = with_bystander()
    w = PgWire(b.port)
    w.send(startup_packet({"user": "postgres", "database": "postgres"}, code=PROTO_V2))
    w.expect_fatal("old V2 protocol not supported")
    check_unharmed(b, bystander)


def test_unknown_protocol_version(with_bystander):
    b, bystander = with_bystander()
    w = PgWire(b.port)
    w.send(startup_packet({"user": "postgres", "database": "postgres"}, code=0x00040000))
    w.expect_fatal(BAD_HEADER)
    check_unharmed(b, bystander)


@pytest.mark.parametrize("minor,pq_params", [(2, {}), (0, {"_pq_.some_extension": "on"}),
                                              (2, {"_pq_.a": "1", "_pq_.b": "2"})],
                         ids=["3.2", "3.0-with-pq", "3.2-with-pq"])
def test_newer_protocol_is_negotiated_down(with_bystander, minor, pq_params):
    b, bystander = with_bystander()
    w = PgWire(b.port)
    params = {"user": "postgres", "database": "postgres", **pq_params}
    w.send(startup_packet(params, code=PROTO_V3 | minor))
    mtype, body = w.read_msg()
    assert mtype == b"v", (mtype, body)
    newest, count = struct.unpack("!II", body[:8])
    assert newest == PROTO_V3
    assert count == len(pq_params)
    assert body[8:].split(b"\0")[:count] == [k.encode() for k in pq_params]
    assert w.authenticate() == (b"R", b"\0\0\0\0")
    assert w.read_until(b"Z")[-1][0] == b"Z"
    assert w.simple_query("SELECT 'negotiated'") == ([["negotiated"]], None)
    check_unharmed(b, bystander)


def test_ssl_request_answered_n_then_startup(with_bystander):
    b, bystander = with_bystander()
    w = PgWire(b.port)
    w.send(request_packet(SSL_REQUEST))
    assert w.read_byte() == b"N"
    w.login()
    assert w.simple_query("SELECT 'plain'") == ([["plain"]], None)
    check_unharmed(b, bystander)


def test_gssenc_request_answered_n_then_startup(with_bystander):
    b, bystander = with_bystander()
    w = PgWire(b.port)
    w.send(request_packet(GSSENC_REQUEST))
    assert w.read_byte() == b"N"
    w.send(request_packet(SSL_REQUEST))
    assert w.read_byte() == b"N"
    w.login()
    assert w.simple_query("SELECT 1") == ([["1"]], None)
    check_unharmed(b, bystander)


def test_data_after_ssl_request(with_bystander):
    b, bystander = with_bystander()
    w = PgWire(b.port)
    w.send(request_packet(SSL_REQUEST) + startup_packet({"user": "postgres", "database": "postgres"}))
    w.expect_fatal("received unencrypted data after SSL request")
    check_unharmed(b, bystander)


def test_data_after_gssenc_request(with_bystander):
    b, bystander = with_bystander()
    w = PgWire(b.port)
    w.send(request_packet(GSSENC_REQUEST) + startup_packet({"user": "postgres", "database": "postgres"}))
    w.expect_fatal("received unencrypted data after GSSAPI encryption request")
    check_unharmed(b, bystander)


def test_missing_user(with_bystander):
    b, bystander = with_bystander()
    w = PgWire(b.port)
    w.startup(user=None)
    w.expect_fatal("no username supplied")
    check_unharmed(b, bystander)


def test_empty_user(with_bystander):
    b, bystander = with_bystander()
    w = PgWire(b.port)
    w.startup(user="")
    w.expect_fatal("no username supplied")
    check_unharmed(b, bystander)


def test_username_too_long(with_bystander):
    b, bystander = with_bystander()
    w = PgWire(b.port)
    w.startup(user="u" * 200)
    w.expect_fatal("username too long")
    check_unharmed(b, bystander)


def test_startup_without_terminator(with_bystander):
    b, bystander = with_bystander()
    w = PgWire(b.port)
    body = struct.pack("!I", PROTO_V3) + b"user\0postgres\0database\0postgres\0"  # no final NUL
    w.send(struct.pack("!I", len(body) + 4) + body)
    w.expect_fatal("invalid startup packet layout: expected terminator as last byte")
    check_unharmed(b, bystander)


def test_startup_with_5000_parameters(with_bystander):
    """Many valid parameters (a 20 kB packet, five times pkt_buf) log in as in PgBouncer."""
    b, bystander = with_bystander(ignore_startup_parameters="x")
    body = struct.pack("!I", PROTO_V3) + b"user\0postgres\0database\0postgres\0" + b"x\0001\0" * 5000 + b"\0"
    assert len(body) > 4 * 4096
    w = PgWire(b.port)
    w.send(struct.pack("!I", len(body) + 4) + body)
    assert w.authenticate(password="postgres")[0] == b"R"
    assert w.read_until(b"Z", b"E")[-1][0] == b"Z"
    assert w.simple_query("SELECT 5") == ([["5"]], None)
    check_unharmed(b, bystander)


def test_startup_larger_than_pkt_buf(with_bystander):
    """A tracked value of 9,000 bytes: the startup packet is buffered whole, the value reaches the server
    (which keeps the first 63 bytes of an application_name)."""
    b, bystander = with_bystander(pkt_buf=4096)
    value = "".join(chr(ord("a") + i % 26) for i in range(9000))
    w = PgWire(b.port)
    w.login(password="postgres", application_name=value)
    assert w.simple_query("SHOW application_name") == ([[value[:63]]], None)
    check_unharmed(b, bystander)


def test_long_options_word(with_bystander):
    """An options word of 3,000 bytes is one setting, as PgBouncer takes it (the server keeps the first 63
    bytes of an application_name)."""
    b, bystander = with_bystander()
    value = "".join(chr(ord("a") + i % 26) for i in range(3000))
    w = PgWire(b.port)
    w.login(password="postgres", options=f"-c application_name={value} -c DateStyle=German")
    assert w.simple_query("SHOW application_name") == ([[value[:63]]], None)
    assert w.simple_query("SHOW DateStyle") == ([["German, DMY"]], None)
    w2 = PgWire(b.port)
    w2.login(password="postgres", options=f"--application-name=x\\ y{value}")
    assert w2.simple_query("SHOW application_name") == ([[("x y" + value)[:63]]], None)
    check_unharmed(b, bystander)


def test_unsupported_startup_parameter(with_bystander):
    b, bystander = with_bystander()
    w = PgWire(b.port)
    w.startup(extra_float_digits="2")
    w.expect_fatal("unsupported startup parameter: extra_float_digits")
    check_unharmed(b, bystander)


def test_ignored_startup_parameter(with_bystander):
    b, bystander = with_bystander(ignore_startup_parameters="extra_float_digits")
    w = PgWire(b.port)
    w.login(extra_float_digits="2")
    assert w.simple_query("SELECT 5") == ([["5"]], None)
    check_unharmed(b, bystander)


def test_bad_options_parameter(with_bystander):
    b, bystander = with_bystander()
    w = PgWire(b.port)
    w.startup(options="DateStyle=ISO")
    w.expect_fatal("unsupported options startup parameter: only '-c config=val' and '--config=val' are allowed")
    w = PgWire(b.port)
    w.startup(options="-c work_mem=8MB")
    w.expect_fatal("unsupported startup parameter in options: work_mem")
    check_unharmed(b, bystander)


def test_cancel_request_with_unknown_key_is_not_answered(with_bystander):
    b, bystander = with_bystander()
    w = PgWire(b.port)
    w.send(request_packet(CANCEL_REQUEST, struct.pack("!I", 12345) + b"abcd"))
    assert w.expect_closed() == []
    check_unharmed(b, bystander)


def test_cancel_request_with_wrong_length_is_closed(with_bystander):
    b, bystander = with_bystander()
    w = PgWire(b.port)
    w.send(request_packet(CANCEL_REQUEST, b"\0" * 12))
    assert w.expect_closed() == []
    check_unharmed(b, bystander)


def test_second_startup_is_rejected_during_auth(with_bystander):
    b, bystander = with_bystander(auth_type="md5")
    w = PgWire(b.port)
    w.startup()
    m = w.read_msg()
    assert m[0] == b"R" and struct.unpack("!I", m[1][:4])[0] == 5
    # a second StartupMessage arrives where a PasswordMessage belongs
    w.send(startup_packet({"user": "postgres", "database": "postgres"}))
    msgs = w.expect_closed()
    assert all(t != b"Z" for t, _ in msgs), msgs
    check_unharmed(b, bystander)


def test_wrong_password(with_bystander):
    b, bystander = with_bystander(auth_type="md5")
    w = PgWire(b.port)
    w.startup()
    first = w.authenticate(password="not-the-password")
    assert first[0] == b"E"
    err = error_fields(first[1])
    assert (err["S"], err["C"], err["M"]) == ("FATAL", "08P01", "password authentication failed")
    assert w.at_eof()
    check_unharmed(b, bystander)


def test_oversized_password_message(with_bystander):
    """A password message far larger than any secret is refused before it is buffered."""
    b, bystander = with_bystander(auth_type="plain")
    w = PgWire(b.port)
    w.startup()
    kind, body = w.read_msg()
    assert kind == b"R"
    w.send(message(b"p", b"x" * 100000 + b"\0"))
    w.expect_fatal("password too long")
    assert "login failed" not in b.log_text()
    check_unharmed(b, bystander)


def _scram_first(w, client_first):
    """Sends a SASLInitialResponse for SCRAM-SHA-256 with `client_first`; returns the pooler's answer."""
    kind, body = w.read_msg()
    assert (kind, body[:4]) == (b"R", b"\0\0\0\x0a")
    w.send(message(b"p", b"SCRAM-SHA-256\0" + len(client_first).to_bytes(4, "big") + client_first))
    return w.read_msg()


def test_oversized_sasl_initial_response(with_bystander):
    b, bystander = with_bystander(auth_type="scram-sha-256")
    w = PgWire(b.port)
    w.startup()
    assert w.read_msg()[0] == b"R"
    first = b"n,,n=,r=" + b"a" * 200000
    w.send(message(b"p", b"SCRAM-SHA-256\0" + len(first).to_bytes(4, "big") + first))
    w.expect_fatal("password too long")
    check_unharmed(b, bystander)


def test_scram_overlong_client_nonce(with_bystander):
    """A client-first message above the SCRAM size limit but inside the packet limit."""
    b, bystander = with_bystander(auth_type="scram-sha-256")
    w = PgWire(b.port)
    w.startup()
    kind, body = _scram_first(w, b"n,,n=,r=" + b"a" * 1500)
    assert kind == b"E", f"an overlong client nonce was accepted: {kind!r} {body!r}"
    err = error_fields(body)
    assert (err["S"], err["C"], err["M"]) == ("FATAL", "08P01", "SASL authentication failed"), err
    assert w.at_eof()
    check_unharmed(b, bystander)


@pytest.mark.parametrize("client_final", [
    b"garbage",
    b"c=biws,r=not-the-nonce,p=AAAA",
    b"c=biws,r=%NONCE%,p=" + b"A" * 4000,
    b"c=biws,r=%NONCE%",
    b"c=biws,r=%NONCE%,p=!!!notbase64!!!",
])
def test_scram_malformed_client_final(with_bystander, client_final):
    b, bystander = with_bystander(auth_type="scram-sha-256")
    w = PgWire(b.port)
    w.startup()
    kind, body = _scram_first(w, b"n,,n=,r=clientnonce0123456789")
    assert (kind, body[:4]) == (b"R", b"\0\0\0\x0b"), (kind, body)
    server_first = dict(kv.split("=", 1) for kv in body[4:].decode().split(","))
    w.send(message(b"p", client_final.replace(b"%NONCE%", server_first["r"].encode())))
    msgs = w.read_until(b"E")
    err = error_fields(msgs[-1][1])
    assert (err["S"], err["C"]) == ("FATAL", "08P01"), err
    assert err["M"] in ("SASL authentication failed", "password authentication failed",
                        "password too long"), err
    assert w.at_eof()
    check_unharmed(b, bystander)


def test_unknown_user_is_logged(with_bystander):
    b, bystander = with_bystander(auth_type="md5")
    w = PgWire(b.port)
    w.startup(user="nobody_here")
    w.authenticate(user="nobody_here", password="x")
    b.wait_log(r"login failed: db=postgres user=nobody_here")
    b.wait_log(r"no such user: nobody_here")
    check_unharmed(b, bystander)


# ---------------------------------------------------------------------------
# after login


def test_unknown_message_type(with_bystander):
    b, bystander = with_bystander()
    w = PgWire(b.port)
    w.login()
    w.send(message(b"z"))
    w.expect_fatal("unknown pkt")
    check_unharmed(b, bystander)


@pytest.mark.parametrize("length", [0, 3, -5], ids=["zero", "three", "negative"])
def test_message_length_out_of_range(with_bystander, length):
    b, bystander = with_bystander()
    w = PgWire(b.port)
    w.login()
    w.send(b"Q" + struct.pack("!i", length) + b"SELECT 1\0")
    w.expect_fatal(BAD_HEADER)
    check_unharmed(b, bystander)


def test_message_longer_than_max_packet_size(with_bystander):
    b, bystander = with_bystander(max_packet_size=2048)
    w = PgWire(b.port)
    w.login()
    assert w.simple_query("SELECT 'small enough'") == ([["small enough"]], None)
    w.send(query_message("SELECT '" + "x" * 5000 + "'"))
    err = w.expect_fatal(BAD_HEADER)
    assert err["M"].startswith("bad packet header: '51"), err  # the type byte 'Q' comes first
    check_unharmed(b, bystander)


@pytest.mark.parametrize("before", ["nothing", "parse answered by the pooler", "sync", "error"])
def test_flush_with_a_body_in_transaction_mode(with_bystander, before):
    """A Flush carries no body. PostgreSQL answers one that has a body with
    an error and then ignores everything up to the next Sync; no request of
    the client waits for that error, so a server that got it and went back
    to the pool would ignore the next client's messages (pool of one: the
    bystander's). The pooler closes the client instead, and the server never
    sees the message."""
    b, bystander = with_bystander(pool_mode="transaction", default_pool_size=1, max_prepared_statements=10,
                                  query_wait_timeout=10)
    known = b"SELECT 'known'\0\0\0"
    assert bystander.execute("SELECT 'known'", prepare=True).fetchone() == ("known",)
    w = PgWire(b.port)
    w.login(password="postgres")
    # something that links a server first, then the Flush with a body
    first = {"nothing": b"",  # no server linked yet
             "parse answered by the pooler": message(b"P", b"mine\0" + known),
             "sync": message(b"S"),
             "error": message(b"P", b"\0SELECT 1/0\0\0\0") + message(b"B", b"\0\0" + b"\0" * 6)
             + message(b"E", b"\0" + b"\0" * 4) + message(b"S")}[before]
    w.send(first + message(b"H", b"junk"))
    err = w.expect_fatal("invalid Flush message")
    assert err["C"] == "08P01"
    check_unharmed(b, bystander)


def _rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_console_that_does_not_read(with_bystander):
    """A console client that sends thousands of SHOWs and reads none of the
    answers: PgBouncer writes one answer before it reads the next query, so
    what it holds for the client is bounded by one answer. Here every answer
    used to pile up in the worker (about 6 KB per SHOW CONFIG, 30 MB here).
    Then the client reads, and gets every answer."""
    b, bystander = with_bystander(min_workers=1, max_workers=1)
    (worker,) = workers(b)
    queries = 5000
    w = PgWire(b.port)
    w.login(user="pgbouncer", database="pgbouncer")
    before = _rss_kb(worker["pid"])
    sender = threading.Thread(target=w.send, args=(query_message("SHOW CONFIG") * queries,), daemon=True)
    sender.start()
    peak, until = before, time.monotonic() + 3
    while time.monotonic() < until:  # a fixed pooler stops reading: the sender stays blocked
        peak = max(peak, _rss_kb(worker["pid"]))
        time.sleep(0.05)
    # (under scripts/test --sanitize the allocator's quarantine keeps what each SHOW
    # freed, so RSS grows whatever the pooler holds: the bound is checked in plain runs)
    if not SANITIZE_DIR:
        assert peak - before < 10_000, f"the worker grew by {peak - before} kB holding unread answers"
    assert bystander.execute("SELECT 'meanwhile'").fetchone() == ("meanwhile",)
    # now read: every answer arrives, whole and in order
    ready, buf, pos = 0, bytearray(), 0
    while ready < queries:
        while len(buf) - pos >= 5:
            (length,) = struct.unpack("!I", buf[pos + 1 : pos + 5])
            if len(buf) - pos < 1 + length:
                break
            assert buf[pos : pos + 1] in b"TDCZ", bytes(buf[pos : pos + 64])
            ready += buf[pos : pos + 1] == b"Z"
            pos += 1 + length
        del buf[:pos]
        pos = 0
        if ready < queries:
            chunk = w.sock.recv(1 << 20)
            assert chunk, f"closed after {ready} answers"
            buf += chunk
    assert not buf, "more than the answers"
    sender.join(10)
    assert not sender.is_alive()
    assert w.simple_query("SHOW VERSION")[0][0][0].startswith("PgBouncer ")
    check_unharmed(b, bystander)


def _bind_execute_unnamed():
    return message(b"B", b"\0\0" + b"\0\0" * 3) + message(b"E", b"\0\0\0\0\0")


def _read_types(w, until, count):
    """Message types up to the count-th message of type `until`."""
    types, seen = [], 0
    while seen < count:
        m = w.read_msg()
        assert m is not None, f"closed after {types[-5:]}"
        types.append(m[0])
        seen += m[0] == until
    return types


def test_pipeline_behind_a_long_query_that_the_pooler_answers(with_bystander):
    """A client pipelines a long query, then tens of thousands of messages the
    pooler answers itself in transaction mode (Close of a statement it never
    prepared: CloseComplete in order, behind the query's answers) and does not
    read. Each used to be queued as it came, without bound while the query ran
    (80 bytes of the worker per 9-byte message): the client's input now waits
    once 4,000 requests are owed. Then everything is answered, in order; and a
    short pipeline whose only server answer PostgreSQL keeps until a Flush or
    Sync is answered too."""
    b, bystander = with_bystander(pool_mode="transaction", min_workers=1, max_workers=1)
    (worker,) = workers(b)
    w = PgWire(b.port)
    w.login()
    assert w.simple_query("SELECT 1") == ([["1"]], None)
    before = _rss_kb(worker["pid"])
    closes = 60_000
    w.send(message(b"P", b"\0SELECT pg_sleep(2)\0\0\0") + _bind_execute_unnamed()
           + message(b"C", b"Snope\0") * closes + message(b"S"))
    peak, until = before, time.monotonic() + 1.5
    while time.monotonic() < until:  # the query still runs
        peak = max(peak, _rss_kb(worker["pid"]))
        time.sleep(0.05)
    if not SANITIZE_DIR:
        assert peak - before < 2_000, f"the worker grew by {peak - before} kB for a client that does not read"
    assert bystander.execute("SELECT 'meanwhile'").fetchone() == ("meanwhile",)
    types = _read_types(w, b"Z", 1)
    assert types == [b"1", b"2", b"D", b"C"] + [b"3"] * closes + [b"Z"], (types[:6], len(types))
    # PostgreSQL keeps the ParseComplete until a Flush: the pooler asks for it when it holds the client
    w.send(message(b"P", b"\0SELECT 1\0\0\0") + message(b"C", b"Snope\0") * 5000 + message(b"S"))
    types = _read_types(w, b"Z", 1)
    assert types == [b"1"] + [b"3"] * 5000 + [b"Z"], (types[:6], len(types))
    assert w.simple_query("SELECT 2") == ([["2"]], None)
    check_unharmed(b, bystander)


def test_disconnect_mid_packet(with_bystander):
    """A client that dies halfway through a query must not leave a half
    message on a server that is then given to the next client."""
    b, bystander = with_bystander(default_pool_size=2)
    for _ in range(3):
        w = PgWire(b.port)
        w.login()
        assert w.simple_query("SELECT 1") == ([["1"]], None)
        full = query_message("SELECT '" + "y" * 200 + "'")
        w.send(full[:60])
        w.close()
        # a new client gets a server (the same or a fresh one) that answers normally
        w2 = PgWire(b.port)
        w2.login()
        assert w2.simple_query("SELECT 'clean'") == ([["clean"]], None)
        w2.close()
    check_unharmed(b, bystander)


def test_disconnect_mid_packet_before_server(with_bystander):
    b, bystander = with_bystander()
    w = PgWire(b.port)
    w.login()
    w.send(query_message("SELECT 1")[:3])
    w.close()
    check_unharmed(b, bystander)


def test_disconnect_during_auth(with_bystander):
    b, bystander = with_bystander(auth_type="md5")
    w = PgWire(b.port)
    w.startup()
    assert w.read_msg()[0] == b"R"
    w.send(b"p\x00\x00")
    w.close()
    check_unharmed(b, bystander)


def test_garbage_instead_of_password(with_bystander):
    b, bystander = with_bystander(auth_type="md5")
    w = PgWire(b.port)
    w.startup()
    assert w.read_msg()[0] == b"R"
    w.send(message(b"Q", b"SELECT 1\0"))
    msgs = w.expect_closed()
    assert all(t != b"Z" for t, _ in msgs), msgs
    check_unharmed(b, bystander)


def test_terminate_mid_stream_of_many_clients(with_bystander):
    """Many clients that log in and vanish without Terminate."""
    b, bystander = with_bystander(default_pool_size=3)
    for _ in range(10):
        w = PgWire(b.port)
        w.login()
        w.send(query_message("SELECT pg_sleep(0.01)"))
        w.close()
    check_unharmed(b, bystander)


def test_reload_to_unloadable_tls_keeps_running_config(with_bystander):
    """A reload whose TLS files cannot be loaded keeps the running TLS set-up and says why."""
    b, bystander = with_bystander()
    mark = b.log_mark()
    b.update(client_tls_sslmode="require", client_tls_key_file="/nonexistent.key",
             client_tls_cert_file="/nonexistent.crt")
    b.write_ini()
    b.reload()
    # PgBouncer's two lines: why, then that the old set-up stays
    line = b.wait_log(r"ERROR TLS setup failed: failed to load .*", after=mark).group(0)
    assert "/nonexistent.key" in line or "/nonexistent.crt" in line, line
    b.wait_log(r"ERROR TLS configuration could not be reloaded, keeping old configuration", after=mark)
    # TLS stays off as before: a plain TCP client is still served
    w = PgWire(b.port)
    w.startup()
    kind, _ = w.read_msg()
    w.close()
    assert kind == b"R"
    check_unharmed_after_tls(b, bystander)


class SoftFileLimit:
    """A process's soft limit of open files, changed with prlimit (as the
    pooler's user) and put back by restore()."""

    def __init__(self, pid, run_as):
        self.pid, self.run_as = pid, run_as
        with open(f"/proc/{pid}/limits") as f:
            self.soft = next(int(line.split()[3]) for line in f if line.startswith("Max open files"))

    def set(self, n):
        subprocess.run(["prlimit", f"--pid={self.pid}", f"--nofile={n}:"], check=True, capture_output=True,
                       **self.run_as.popen_kwargs())

    def restore(self):
        self.set(self.soft)


def test_file_limit_reached_by_idle_connections(with_bystander, run_as):
    """Connections that send nothing until the worker has no file descriptor
    left: accept() fails with EMFILE, the connection stays queued and the
    listener readable. The worker must rest before it tries again (it used to
    try at once, spinning its event loop and writing hundreds of thousands of
    log lines a second), keep serving its clients, and accept again once
    descriptors are free."""
    b, bystander = with_bystander(min_workers=1, max_workers=1)
    pid = int(workers(b)[0]["pid"])
    limit = SoftFileLimit(pid, run_as)
    limit.set(len(os.listdir(f"/proc/{pid}/fd")) + 4)
    mark = b.log_mark()
    idle = []
    try:
        idle = [socket.create_connection(("127.0.0.1", b.port), timeout=10) for _ in range(12)]
        b.wait_log(r"WARNING accept\(\) failed: Too many open files", after=mark)
        time.sleep(1.5)  # a bounded look at what the worker does while it cannot accept
        failed = b.log_text()[mark:].count("accept() failed")
        assert failed <= 5, f"{failed} accept() failures logged in about 1.5 s: the worker retries at once"
        b.wait_log(r"WARNING accept\(\) failed: Too many open files; not accepting new connections for 1 s$",
                   after=mark)
        assert bystander.execute("SELECT 'served meanwhile'").fetchone() == ("served meanwhile",)
    finally:
        for s in idle:
            s.close()
        limit.restore()
    check_unharmed(b, bystander)


def test_file_limit_reached_at_a_reload(with_bystander, run_as):
    """A worker with one file descriptor to spare gets a RELOAD, which opens
    its log file again (rotation); then connections take every descriptor
    left. The worker must go on writing its log (here: that it cannot
    accept), not stop at its next log line for want of a descriptor to
    open the file with, taking its clients along."""
    b, bystander = with_bystander(min_workers=1, max_workers=1)
    pid = int(workers(b)[0]["pid"])
    logfile = os.path.realpath(b.dir / "pgbouncer.log")
    limit = SoftFileLimit(pid, run_as)

    def log_fds():
        fds = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == logfile:
                    fds.add(int(fd))
            except FileNotFoundError:
                pass
        return fds

    in_use = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
    before = log_fds()
    assert before, "the worker has its log file open"
    limit.set(next(n for n in range(1 << 16) if n not in in_use) + 1)  # one descriptor to spare
    mark = b.log_mark()
    idle = []
    try:
        b.reload()
        wait_for(lambda: log_fds() != before, "the worker to open its log file again")
        for _ in range(4):  # each takes a descriptor, until the worker can accept no more
            idle.append(socket.create_connection(("127.0.0.1", b.port), timeout=10))
        b.wait_log(rf"\[{pid}\] WARNING accept\(\) failed: Too many open files", after=mark)
        assert pid_alive(pid)
        assert bystander.execute("SELECT 'served meanwhile'").fetchone() == ("served meanwhile",)
    finally:
        for s in idle:
            s.close()
        limit.restore()
    check_unharmed(b, bystander)
    assert int(workers(b)[0]["pid"]) == pid


def check_unharmed_after_tls(b, bystander):
    # the already-connected client keeps working; the pooler is still up
    assert bystander.execute("SELECT 1").fetchone() == (1,)
    assert b.alive()
