"""systemd socket activation (doc/packaging.md, "Socket activation"): the
sockets systemd passes (LISTEN_PID/LISTEN_FDS/LISTEN_FDNAMES) are the
listeners every worker serves, TCP and unix, instead of listen_addr and
unix_socket_dir. systemd-socket-activate plays systemd: it binds the
sockets, waits for the first connection, then execs the pooler with them.
"""

import os
import re
import shutil
import threading

import psycopg
import pytest

from conftest import DEADLINE, free_port, parent_pid, port_listening, wait_for

ACTIVATE = shutil.which("systemd-socket-activate")

pytestmark = pytest.mark.skipif(
    ACTIVATE is None, reason="systemd-socket-activate not installed (Debian package 'systemd')")


def socket_inodes(pid):
    """The inodes of the sockets process `pid` holds open."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        m = re.fullmatch(r"socket:\[(\d+)\]", target)
        if m:
            found.add(int(m.group(1)))
    return found


def fd_inode(pid, fd):
    target = os.readlink(f"/proc/{pid}/fd/{fd}")
    m = re.fullmatch(r"socket:\[(\d+)\]", target)
    assert m, f"fd {fd} of {pid} is {target}, not a socket"
    return int(m.group(1))


def workers_of(master):
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if parent_pid(int(entry)) == master:
                    pids.append(int(entry))
            except (OSError, ValueError):
                pass
    return pids


def start_activated(bouncer, run_as, workers, listen_addr="127.0.0.1"):
    """A pooler started by systemd-socket-activate with a TCP socket on the
    instance's port (fd 3) and a unix socket in a directory other than
    unix_socket_dir (fd 4). Returns (bouncer, the unix socket's directory)."""
    port = free_port()
    b = bouncer(ini_overrides={"listen_port": port, "listen_addr": listen_addr, "min_workers": workers,
                               "max_workers": workers}, start=False)
    sockdir = run_as.mkdir("activated-", b.dir)
    b.wrapper = ["setpriv", f"--reuid={run_as.uid}", f"--regid={run_as.gid}", "--clear-groups",
                 ACTIVATE, "-l", f"127.0.0.1:{port}", "-l", str(sockdir / f".s.PGSQL.{port}"),
                 "--fdname=pgbouncer-tcp:pgbouncer-unix", "-E", "LC_ALL=C"]
    # systemd-socket-activate passes only the variables named: keep the sanitizers' (scripts/test --sanitize)
    for var in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"):
        if var in os.environ:
            b.wrapper += ["-E", var]
    if not run_as.root:
        b.wrapper = b.wrapper[4:]
    b.start(wait=False)
    wait_for(lambda: port_listening(port), "systemd-socket-activate to listen")
    # systemd-socket-activate execs the pooler at the first connection, which the pooler then serves
    first = {}

    def knock():
        try:
            with psycopg.connect(host="127.0.0.1", port=port, dbname="postgres", user="postgres",
                                 connect_timeout=DEADLINE, autocommit=True) as conn:
                first["row"] = conn.execute("SELECT 1").fetchone()
        except Exception as e:  # reported by the assertion below
            first["error"] = e

    t = threading.Thread(target=knock)
    t.start()
    b.wait_ready()
    t.join(DEADLINE)
    assert first.get("row") == (1,), f"the connection that woke the pooler: {first}\n{b.log_text()}"
    wait_for(lambda: len(workers_of(b.pid)) >= workers, f"{workers} workers")
    return b, sockdir


@pytest.mark.parametrize("workers", [1, 2])
def test_activated_sockets_are_served(bouncer, run_as, workers):
    b, sockdir = start_activated(bouncer, run_as, workers)
    log = b.log_text()
    assert re.search(r"listening on 127\.0\.0\.1:\d+ \(passed by systemd\)", log), log
    assert f"listening on unix:{sockdir}/.s.PGSQL.{b.port} (passed by systemd)" in log, log
    assert "listen_addr is not used: the listening sockets come from systemd" in log
    # unix_socket_dir (the instance directory) got no socket of its own
    assert not (b.dir / f".s.PGSQL.{b.port}").exists()
    assert "nowhere to listen on" not in log

    # TCP and unix, several clients at once
    conns = [b.connect(autocommit=True) for _ in range(4)]
    conns += [b.connect(host=str(sockdir), autocommit=True) for _ in range(4)]
    for i, conn in enumerate(conns):
        assert conn.execute("SELECT %s::int", [i]).fetchone() == (i,)
    with b.admin(host=str(sockdir)) as admin:
        clients = [r for r in admin.execute("SHOW CLIENTS").fetchall() if r[1] == "postgres"]
    assert len(clients) == 8

    # every worker accepts from the sockets systemd made (one accept queue), none of its own
    tcp, unix = fd_inode(b.pid, 3), fd_inode(b.pid, 4)
    workers_now = workers_of(b.pid)
    assert len(workers_now) == workers
    for w in workers_now:
        held = socket_inodes(w)
        assert tcp in held and unix in held, f"worker {w} does not hold the activated sockets"
    for conn in conns:
        conn.close()

    # a shutdown leaves the unix socket file to whoever made it
    assert b.stop() == 0
    assert (sockdir / f".s.PGSQL.{b.port}").exists()


def test_activation_without_listen_addr(bouncer, run_as):
    """listen_addr empty (no warning for it): the passed sockets are enough."""
    b, sockdir = start_activated(bouncer, run_as, 1, listen_addr="")
    assert "listen_addr is not used" not in b.log_text()
    with b.connect(host=str(sockdir), autocommit=True) as conn:
        assert conn.execute("SELECT 2").fetchone() == (2,)


def test_respawned_worker_serves_the_activated_sockets(bouncer, run_as):
    import signal
    b, sockdir = start_activated(bouncer, run_as, 2)
    tcp = fd_inode(b.pid, 3)
    victim = sorted(workers_of(b.pid))[0]
    os.kill(victim, signal.SIGKILL)

    def replaced():
        now = workers_of(b.pid)
        return len(now) == 2 and victim not in now and all(tcp in socket_inodes(w) for w in now)
    wait_for(replaced, "a new worker holding the activated TCP socket")
    for _ in range(6):
        with b.connect(autocommit=True) as conn:
            assert conn.execute("SELECT 3").fetchone() == (3,)


def test_unusable_passed_sockets_are_refused(bouncer, run_as):
    """Only listening stream sockets are taken: datagram ones are named in a
    warning, and with nothing else to serve the start fails."""
    import socket
    port = free_port()
    b = bouncer(ini_overrides={"listen_port": port, "listen_addr": ""}, start=False)
    b.wrapper = ["setpriv", f"--reuid={run_as.uid}", f"--regid={run_as.gid}", "--clear-groups",
                 ACTIVATE, "--datagram", "-l", f"127.0.0.1:{port}", "-E", "LC_ALL=C"]
    if not run_as.root:
        b.wrapper = b.wrapper[4:]
    for var in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"):
        if var in os.environ:
            b.wrapper += ["-E", var]
    b.start(wait=False)

    def udp_bound():
        with open("/proc/net/udp") as f:
            return any(int(row.split()[1].rsplit(":", 1)[1], 16) == port for row in list(f)[1:])
    wait_for(udp_bound, "systemd-socket-activate to bind the datagram socket")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"wake up", ("127.0.0.1", port))
    assert b.wait_exit() != 0
    log = b.log_text()
    assert "which is not a stream socket: ignored" in log, log
    assert "nowhere to listen on: none of the sockets systemd passed can be used" in log, log


def test_listen_fds_for_another_process_are_ignored(bouncer):
    """LISTEN_PID names someone else (variables left by a parent): the pooler
    opens its own listeners as usual."""
    b = bouncer(env={"LISTEN_PID": "1", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "a:b"})
    assert "passed by systemd" not in b.log_text()
    assert (b.dir / f".s.PGSQL.{b.port}").exists()
    with b.connect(autocommit=True) as conn:
        assert conn.execute("SELECT 4").fetchone() == (4,)
