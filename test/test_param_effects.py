"""
The effect of [pgbouncer] settings that no other test shows
(doc/pgbouncer.5.md): each test sets one and shows what a client sees.
"""
import contextlib
import re
import socket
import struct
import time

import psycopg
import pytest

from pgwire import CANCEL_REQUEST


@contextlib.contextmanager
def blackhole():
    """A loopback port whose connects hang: its accept queue is full, so the
    kernel drops further SYNs (as a host that does not answer would)."""
    lsn = socket.socket()
    lsn.bind(("127.0.0.1", 0))
    lsn.listen(0)
    port = lsn.getsockname()[1]
    fill = []
    for _ in range(3):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        fill.append(s)
    time.sleep(0.1)
    try:
        yield port
    finally:
        for s in fill:
            s.close()
        lsn.close()


def test_server_connect_timeout(bouncer):
    """A server that does not answer the connect is given up after
    server_connect_timeout (not when the kernel gives up, minutes later);
    meanwhile, as in PgBouncer, the client waits for the next attempt."""
    with blackhole() as port:
        b = bouncer(ini_overrides={"server_connect_timeout": 1},
                    databases={"hole": f"host=127.0.0.1 port={port} dbname=postgres"})
        mark = b.log_mark()
        t0 = time.monotonic()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(host="127.0.0.1", port=b.port, dbname="hole", user="postgres", connect_timeout=3)
        b.wait_log(r"S-0x[0-9a-f]+: hole/postgres@127\.0\.0\.1:\d+ closing because: connect timeout", after=mark,
                   timeout=1)
        assert time.monotonic() - t0 < 4.5


def test_cancel_wait_timeout(bouncer):
    """A cancel that cannot be passed on (here to a peer whose connects
    hang) is dropped after cancel_wait_timeout: the requester, which waits
    for the pooler to close its connection, is let go."""
    with blackhole() as port:
        b = bouncer(ini_overrides={"peer_id": 1, "cancel_wait_timeout": 1}, start=False)
        b.write_ini(text=b.render_ini() + f"[peers]\n2 = host=127.0.0.1 port={port}\n")
        b.start()
        key = bytes([0x11, 2, 0, 0, 0x22, 0x33, 0x44, 0x57])  # peer 2's key, TTL bits 11
        mark = b.log_mark()
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", b.port), timeout=5) as s:
            s.sendall(struct.pack("!II", 16, CANCEL_REQUEST) + key)
            assert s.recv(1) == b""
        assert 0.8 < time.monotonic() - t0 < 3.5
        b.wait_log(r"cancel request for peer 2 dropped: not forwarded within cancel_wait_timeout", after=mark)


def test_so_reuseport_off_refuses_a_taken_port(bouncer):
    """so_reuseport = 0 (the default): a second pgbouncer on a port the
    first listens on fails to start, as PgBouncer does, instead of taking
    half of its connections. With so_reuseport = 1 on both, it starts."""
    a = bouncer()
    b = bouncer(ini_overrides={"listen_port": a.port}, start=False)
    b.start(wait=False)
    assert b.wait_exit() == 1
    assert re.search(rf"cannot listen on 127\.0\.0\.1:{a.port}: bind\(\): Address already in use", b.log_text())
    assert "failed to listen on any address" in b.log_text()
    a.stop()
    c = bouncer(ini_overrides={"listen_port": a.port, "so_reuseport": 1})
    d = bouncer(ini_overrides={"listen_port": a.port, "so_reuseport": 1})
    assert c.alive() and d.alive()
