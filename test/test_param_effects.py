"""
The effect of [pgbouncer] settings that no other test shows
(doc/pgbouncer.5.md): each test sets one and shows what a client sees.
"""
import contextlib
import socket
import time

import psycopg
import pytest


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

