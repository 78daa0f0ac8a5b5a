"""systemd integration (doc/packaging.md): with NOTIFY_SOCKET set, as a
Type=notify unit runs it, the master says READY=1 (with its pid) once it
serves, RELOADING=1 then READY=1 around a reload, and STOPPING=1 at
shutdown. The test plays systemd's side of the notification socket."""

import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from conftest import DEADLINE


def built_with_systemd(binary):
    """The build loads libsystemd when NOTIFY_SOCKET is set (doc/packaging.md): it names the library."""
    return b"libsystemd.so.0" in Path(binary).read_bytes()


class NotifySocket:
    """The datagram socket systemd would listen on; messages() collects what arrived."""

    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        os.chmod(self.path, 0o777)  # the pooler runs as the unprivileged test user
        self.sock.settimeout(DEADLINE)
        self.got = []

    def wait_for(self, field):
        """Reads datagrams until one has `field` (e.g. READY=1); returns that one as a dict."""
        while True:
            data = self.sock.recv(4096).decode()
            msg = dict(line.split("=", 1) for line in data.splitlines() if "=" in line)
            self.got.append(msg)
            key, value = field.split("=", 1)
            if msg.get(key) == value:
                return msg

    def close(self):
        self.sock.close()


@pytest.fixture
def notify(bouncer, pgbouncer_bin, run_as, session_dir):
    if not built_with_systemd(pgbouncer_bin):
        pytest.skip("built without libsystemd (configure found no libsystemd-dev)")
    d = run_as.mkdir("notify-", session_dir)  # a directory the pooler's user can reach
    n = NotifySocket(d / "sock")
    yield n
    n.close()


def test_ready_reload_and_stop_are_notified(bouncer, notify):
    b = bouncer(env={"NOTIFY_SOCKET": notify.path}, ini_overrides={"min_workers": 2, "max_workers": 2})
    ready = notify.wait_for("READY=1")
    assert ready["MAINPID"] == str(b.pid)
    # it serves when it says so
    with b.connect(autocommit=True, password="postgres") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)

    b.reload()
    reloading = notify.wait_for("RELOADING=1")
    assert int(reloading["MONOTONIC_USEC"]) > 0
    notify.wait_for("READY=1")

    b.send_signal(signal.SIGTERM)
    notify.wait_for("STOPPING=1")
    assert b.wait_exit() == 0


def test_daemon_reports_its_own_pid(bouncer, notify):
    """With -d the process systemd started exits; MAINPID names the one that stays."""
    b = bouncer(env={"NOTIFY_SOCKET": notify.path}, args=["-d"])
    ready = notify.wait_for("READY=1")
    assert ready["MAINPID"] == str(b.pid)
    b.send_signal(signal.SIGINT)
    notify.wait_for("STOPPING=1")


def test_no_notify_socket_changes_nothing(bouncer):
    b = bouncer()
    with b.connect(autocommit=True, password="postgres") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_online_restart_moves_mainpid(bouncer, notify):
    """pgbouncer -R: the old master (systemd's main pid) names the new one as
    MAINPID when it hands over, and never says STOPPING=1 (doc/workers.md "Upgrading")."""
    b = bouncer(env={"NOTIFY_SOCKET": notify.path})
    old_pid = b.pid
    assert notify.wait_for("READY=1")["MAINPID"] == str(old_pid)
    held = b.connect(autocommit=True, password="postgres")
    held.execute("SELECT 1")
    old = b.proc
    b.proc = None
    try:
        b.start(["-R"])
        # two datagrams name the new pid, in either order (two processes send them): the old master's
        # hand-over (MAINPID alone) and the new master's READY=1
        seen = []
        while not (any("READY" not in m for m in seen) and any(m.get("READY") == "1" for m in seen)):
            seen.append(notify.wait_for(f"MAINPID={b.pid}"))
        # stopping what is left of the old tree is not the service stopping; it may also have
        # exited by itself already, its last client (held) having moved to the new tree
        os.kill(old_pid, signal.SIGTERM)
        held.close()
        assert old.wait(timeout=DEADLINE) == 0
        b.reload()  # RELOADING=1 from the new master comes after anything the old one sent
        notify.wait_for("RELOADING=1")
        assert not any("STOPPING" in m for m in notify.got), notify.got
    finally:
        if old.poll() is None:
            os.killpg(old.pid, signal.SIGKILL)


def test_libsystemd_is_mapped_only_under_systemd(bouncer, notify, pgbouncer_bin):
    """The master loads libsystemd when NOTIFY_SOCKET is set, at its first message; a pooler started
    otherwise maps neither it nor the libraries it pulls in (an idle pooler's memory, doc/packaging.md)."""
    if not built_with_systemd(pgbouncer_bin):
        pytest.skip("built without libsystemd (configure found no libsystemd-dev)")

    def maps_libsystemd(pid):
        return "libsystemd.so" in Path(f"/proc/{pid}/maps").read_text()

    plain = bouncer()
    assert not maps_libsystemd(plain.pid)
    told = bouncer(env={"NOTIFY_SOCKET": notify.path})
    assert notify.wait_for("READY=1")["MAINPID"] == str(told.pid)
    assert maps_libsystemd(told.pid)
