"""Peering (spec/behaviours.md §3.3 and §9, spec/config.md [peers]): several
pgbouncers behind one address, each with its own peer_id, forward a
CancelRequest to the peer whose id is in the key, so a query can be
cancelled through any member of the group."""

import signal
import socket
import struct
import time

from pgwire import CANCEL_REQUEST, error_fields, PgWire, query_message


def peered(bouncer, pg, n=2, host_of=None, **ini):
    """n pgbouncers with peer_id 1..n that list each other in [peers]."""
    group = [bouncer(start=False, ini_overrides={"peer_id": i + 1, **ini}) for i in range(n)]
    host_of = host_of or (lambda b: "127.0.0.1")
    peers = "[peers]\n" + "".join(f"{i + 1} = host={host_of(b)} port={b.port}\n" for i, b in enumerate(group))
    for b in group:
        b.write_ini(text=b.render_ini() + peers)
        b.start()
    return group


def login_with_key(b):
    """A raw client logged in through b, and the cancel key the pooler gave it."""
    w = PgWire(b.port)
    welcome = w.login(password="postgres")
    body = next(body for kind, body in welcome if kind == b"K")
    assert len(body) == 8
    return w, body


def send_cancel(port, key, host="127.0.0.1"):
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(struct.pack("!II", 16, CANCEL_REQUEST) + key)
        s.settimeout(5)
        assert s.recv(1) == b"", "a CancelRequest gets no answer"


def cancelled_by(w, port, key):
    """Runs a long query on w, cancels it through `port`; the query's error fields."""
    w.send(query_message("SELECT pg_sleep(30)"))
    time.sleep(0.3)  # let the query start
    send_cancel(port, key)
    msgs = w.read_until(b"Z")
    errs = [error_fields(body) for kind, body in msgs if kind == b"E"]
    return errs[0] if errs else None


def test_cancel_through_another_peer(bouncer, pg):
    a, b = peered(bouncer, pg)
    w, key = login_with_key(a)
    assert key[1] | key[2] << 8 == 1, "the key carries the owner's peer_id"
    mark = b.log_mark()
    err = cancelled_by(w, b.port, key)
    assert err is not None and err["C"] == "57014", err
    b.wait_log(r"cancel request forwarded to peer 1", after=mark)
    # the connection goes on
    assert w.simple_query("SELECT 3") == ([["3"]], None)
    # and the owner itself still cancels directly
    err = cancelled_by(w, a.port, key)
    assert err is not None and err["C"] == "57014", err


def test_cancel_through_a_peer_on_a_unix_socket(bouncer, pg):
    a, b = peered(bouncer, pg, host_of=lambda x: str(x.dir))
    w, key = login_with_key(b)
    err = cancelled_by(w, a.port, key)
    assert err is not None and err["C"] == "57014", err


def test_cancel_through_a_peer_with_several_workers(bouncer, pg):
    """The peer's key also names its worker: forwarded cancels reach it whichever worker gets them."""
    a, b = peered(bouncer, pg, min_workers=2, max_workers=2)
    for _ in range(4):
        w, key = login_with_key(a)
        err = cancelled_by(w, b.port, key)
        assert err is not None and err["C"] == "57014", err
        w.close()


def test_forwarding_stops_when_the_ttl_runs_out(bouncer, pg):
    """A key whose TTL bits are 00 is not forwarded again; an unknown peer id is dropped."""
    a, b = peered(bouncer, pg)
    w, key = login_with_key(a)
    spent = bytearray(key)
    spent[7] &= 0xFC
    mark = b.log_mark()
    w.send(query_message("SELECT pg_sleep(1.5)"))
    time.sleep(0.3)
    send_cancel(b.port, bytes(spent))
    b.wait_log(r"cancel request for peer 1 dropped: forwarding limit reached", after=mark)
    unknown = bytearray(key)
    unknown[1], unknown[2] = 7, 0
    send_cancel(b.port, bytes(unknown))
    b.wait_log(r"cancel request for unknown peer 7", after=mark)
    msgs = w.read_until(b"Z")
    assert not [m for m in msgs if m[0] == b"E"], "nothing was cancelled"
    assert a.alive() and b.alive()


def test_peer_that_is_down(bouncer, pg):
    """Forwarding to a peer that does not listen fails quietly; the pooler stays up."""
    a, b = peered(bouncer, pg)
    w, key = login_with_key(a)
    a.stop(signal.SIGINT)  # immediate shutdown: its client is still connected
    mark = b.log_mark()
    send_cancel(b.port, key)
    b.wait_log(r"cancel forwarding to peer 1 failed", after=mark)
    assert b.alive()
    with b.connect(autocommit=True, password="postgres") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_peer_on_a_unix_socket_that_is_down(bouncer, pg):
    """A peer's unix socket that is not there fails in connect() itself: the
    cancel is dropped once (the worker retried the same queued key from
    inside its own failure until its stack ran out), and any client could
    do that with a key naming that peer."""
    a, b = peered(bouncer, pg, host_of=lambda x: str(x.dir))
    w, key = login_with_key(a)
    a.stop(signal.SIGINT)  # its socket file goes with it
    mark = b.log_mark()
    send_cancel(b.port, key)
    b.wait_log(r"cancel forwarding to peer 1 failed: No such file or directory", after=mark)
    with b.connect(autocommit=True, password="postgres") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert b.log_text()[mark:].count("cancel forwarding to peer 1 failed") == 1
    assert "terminated by signal" not in b.log_text()
