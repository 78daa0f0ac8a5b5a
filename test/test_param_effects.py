"""
The effect of [pgbouncer] settings that no other test shows
(doc/pgbouncer.5.md): each test sets one and shows what a client sees.
"""
import contextlib
import grp
import os
import re
import shutil
import signal
import subprocess
import socket
import struct
import time

import psycopg
import pytest

from conftest import wait_for
from pgwire import CANCEL_REQUEST, PgWire


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


@pytest.mark.parametrize("on", [1, 0])
def test_log_pooler_errors(bouncer, on):
    """An error the pooler sends a client is logged as "pooler error" only
    with log_pooler_errors; the client gets it either way."""
    b = bouncer(ini_overrides={"log_pooler_errors": on})
    mark = b.log_mark()
    with pytest.raises(psycopg.OperationalError, match="no such database: nodb"):
        psycopg.connect(host="127.0.0.1", port=b.port, dbname="nodb", user="postgres")
    b.wait_log(r"closing because: no such database", after=mark)
    logged = re.search(r'pooler error: no such database: nodb', b.log_text()[mark:]) is not None
    assert logged == bool(on)


@pytest.mark.parametrize("rr", [0, 1])
def test_server_round_robin(bouncer, rr):
    """Two idle server connections: by default (LIFO) the last one used is
    handed out again; with server_round_robin they take turns (FIFO)."""
    b = bouncer(ini_overrides={"server_round_robin": rr, "pool_mode": "transaction"})
    c1, c2 = b.connect(autocommit=True), b.connect(autocommit=True)
    c1.execute("BEGIN")
    c2.execute("BEGIN")  # two server connections now
    first, second = (c.execute("SELECT pg_backend_pid()").fetchone()[0] for c in (c1, c2))
    c1.execute("COMMIT")
    c2.execute("COMMIT")  # idle: first, then second (the most recent)
    pids = [c1.execute("SELECT pg_backend_pid()").fetchone()[0] for _ in range(4)]
    assert {first, second} == {pids[0], pids[1]} or rr == 0
    if rr:
        assert pids[0] == first and pids[1] == second and pids[2] == first, (first, second, pids)
    else:
        assert pids == [second] * 4, (first, second, pids)


def test_autodb_idle_timeout(bouncer, pg):
    """A database made from the `*` entry is freed once unused for
    autodb_idle_timeout: SHOW DATABASES no longer lists it."""
    b = bouncer(ini_overrides={"autodb_idle_timeout": 1, "server_idle_timeout": 1},
                databases={"*": f"host={pg.host} port={pg.port}"})
    with b.connect(dbname="template1") as conn:
        conn.execute("SELECT 1")

    def listed():
        with b.admin() as adm:
            return "template1" in [r[0] for r in adm.execute("SHOW DATABASES").fetchall()]

    assert listed()
    wait_for(lambda: not listed(), "the auto-database freed", timeout=6)


def test_unix_socket_group(bouncer, run_as):
    """unix_socket_group: the socket file gets that group, not the one it
    would inherit from its directory (a setgid directory of another group)."""
    if not run_as.root:
        pytest.skip("needs root to make a directory of another group")
    b = bouncer(ini_overrides={"unix_socket_group": grp.getgrgid(run_as.gid).gr_name}, start=False)
    sockdir = b.dir / "sock"
    sockdir.mkdir()
    os.chown(sockdir, run_as.uid, 0)
    os.chmod(sockdir, 0o2775)
    b.update(unix_socket_dir=str(sockdir))
    b.write_ini()
    b.start()
    st = os.stat(sockdir / f".s.PGSQL.{b.port}")
    assert st.st_gid == run_as.gid
    b.stop()
    b.update(unix_socket_group=None)
    b.write_ini()
    b.start()
    assert os.stat(sockdir / f".s.PGSQL.{b.port}").st_gid == 0, "without it, the directory's group"


@pytest.mark.parametrize("loopcnt", [1, 0])
def test_sbuf_loopcnt(bouncer, loopcnt):
    """sbuf_loopcnt bounds the reads on one connection per event: with 1
    the worker goes back to its event loop after every read of a large
    result, with 0 (no limit) it reads on while there is data. strace
    counts the worker's reads and its event-loop waits, so the worker runs
    without io_uring: through the receive ring a server's reads are no
    syscalls, and a socket the limit stopped is taken up again in the same
    wake-up, after the others (doc/architecture.md, "Batched receives")."""
    if not shutil.which("strace"):
        pytest.skip("needs strace")
    b = bouncer(ini_overrides={"sbuf_loopcnt": loopcnt, "min_workers": 1, "max_workers": 1},
                env={"PGBOUNCER_IO_URING": "0"})
    conn = b.connect(autocommit=True)
    conn.execute("SELECT 1")
    (worker,) = [int(p) for p in open(f"/proc/{b.pid}/task/{b.pid}/children").read().split()]
    st = subprocess.Popen(["strace", "-c", "-e", "trace=epoll_wait,recvfrom", "-p", str(worker)],
                          stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)  # attached
        rows = conn.execute("SELECT repeat('x', 1000) FROM generate_series(1, 5000)").fetchall()
        assert len(rows) == 5000
    finally:
        st.send_signal(signal.SIGINT)
        out = st.communicate(timeout=10)[1]
    calls = {line.split()[-1]: int(line.split()[3]) for line in out.splitlines()
             if line.split() and line.split()[-1] in ("epoll_wait", "recvfrom")}
    if "recvfrom" not in calls:
        pytest.skip(f"strace could not trace the worker: {out}")
    ratio = calls.get("epoll_wait", 0) / calls["recvfrom"]
    if loopcnt == 1:
        assert ratio > 0.8, calls
    else:
        assert ratio < 0.12, calls


def test_disable_pqexec(bouncer):
    """disable_pqexec: a simple Query message ends the session with
    "PQexec disallowed"; the extended protocol works."""
    b = bouncer(ini_overrides={"disable_pqexec": 1})
    with b.connect(autocommit=True) as conn:
        assert conn.execute("SELECT %s::int", (5,)).fetchone() == (5,)
    w = PgWire(b.port)
    try:
        w.login(password="postgres")
        rows, err = w.simple_query("SELECT 1; SELECT 2")
        assert rows == [] and err["S"] == "FATAL" and err["M"] == "PQexec disallowed", err
    finally:
        w.close()
