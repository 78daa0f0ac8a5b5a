"""Command line, boot sequence, pidfile, daemon mode, signals and log format
(spec/cli.md §1-5): what an operator sees on the terminal and in the log."""

import os
import re
import signal
import socket
import stat
import subprocess

import pytest

from conftest import free_port, parent_pid, pid_alive, port_accepts, wait_for

VERSION = "1.25.2"
TRY_HELP = 'Try "{prog} --help" for more information.'
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \S+ \[\d+\] (LOG|WARNING|ERROR|FATAL|DEBUG|NOISE) ")


def output_and_log(run, b):
    """Everything a user could read after a failed start: terminal and logfile."""
    return run.stdout + run.stderr + b.log_text()


def unix_socket(b):
    return b.dir / f".s.PGSQL.{b.port}"


# ---------------------------------------------------------------------------
# options


def test_version(run_pgbouncer):
    rc, out, err = run_pgbouncer(["-V"])
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == f"PgBouncer {VERSION}"
    for prefix in ("libevent ", "adns: ", "tls: "):
        assert any(line.startswith(prefix) for line in lines[1:]), f"no line starting {prefix!r} in:\n{out}"


def test_version_long_option(run_pgbouncer):
    rc, out, _ = run_pgbouncer(["--version"])
    assert rc == 0
    assert out.splitlines()[0] == f"PgBouncer {VERSION}"


@pytest.mark.parametrize("opt", ["-h", "--help"])
def test_help_goes_to_stdout(run_pgbouncer, opt):
    rc, out, err = run_pgbouncer([opt])
    assert rc == 0
    assert err == ""
    # the usage text lists the options of spec/cli.md
    for long_opt in ("--daemon", "--quiet", "--verbose", "--user", "--reboot", "--version", "--help"):
        assert long_opt in out, f"{long_opt} missing from usage:\n{out}"


@pytest.mark.parametrize("opt", ["-Z", "--no-such-option"])
def test_unknown_option(run_pgbouncer, opt):
    rc, out, err = run_pgbouncer([opt, "pgbouncer.ini"])
    assert rc == 1
    assert TRY_HELP.format(prog="pgbouncer") in err


def test_program_name_comes_from_argv0(run_pgbouncer, pgbouncer_bin, run_as, session_dir):
    link_dir = run_as.mkdir("argv0-", session_dir)
    link = link_dir / "mybouncer"
    link.symlink_to(pgbouncer_bin)
    rc, _, err = run_pgbouncer(["--no-such-option"], binary=link)
    assert rc == 1
    assert TRY_HELP.format(prog="mybouncer") in err


@pytest.mark.parametrize("args", [[], ["a.ini", "b.ini"]], ids=["none", "two"])
def test_config_file_argument_required(run_pgbouncer, args):
    rc, _, err = run_pgbouncer(args)
    assert rc == 1
    assert "pgbouncer: no configuration file specified" in err
    assert TRY_HELP.format(prog="pgbouncer") in err


# ---------------------------------------------------------------------------
# start-up


def test_start_logs_boot_lines(bouncer):
    b = bouncer(ini_overrides={"max_client_conn": 123})
    log = b.log_text()
    assert re.search(
        r"kernel file descriptor limit: \d+ \(hard: \d+\); max_client_conn: 123, max expected fd use: \d+", log
    ), log
    assert re.search(rf"process up: PgBouncer {re.escape(VERSION)}, libevent \S+ \(\S+\), adns: .+, tls: .+", log), log
    assert f"listening on 127.0.0.1:{b.port}" in log
    # step 7 comes before step 9
    assert log.index("kernel file descriptor limit") < log.index("process up")


def test_pidfile_written_and_removed(bouncer):
    b = bouncer()
    assert b.pidfile.read_text() == f"{b.pid}\n"
    assert stat.S_IMODE(b.pidfile.stat().st_mode) == 0o644
    assert b.stop(signal.SIGTERM) == 0
    assert not b.pidfile.exists()


def test_log_goes_to_stderr_unless_quiet(bouncer):
    loud = bouncer()
    assert "process up" in loud.stderr()
    quiet = bouncer(args=["-q"])
    assert "process up" in quiet.log_text()
    assert quiet.stderr() == ""


def test_log_line_format(bouncer):
    b = bouncer()
    b.reload()
    assert b.stop(signal.SIGINT) == 0
    lines = b.log_text().splitlines()
    assert len(lines) >= 3
    for line in lines:
        # an embedded newline continues a message on a TAB-indented line
        assert LOG_LINE.match(line) or line.startswith("\t"), f"bad log line: {line!r}"
    # the pid in a line is the pid of a pgbouncer process; the master logs its own
    assert f"[{b.proc.pid}] LOG process up" in b.log_text()


def test_unopenable_logfile(bouncer, run_pgbouncer):
    missing = "/nonexistent-pgbouncer-test-dir/pgbouncer.log"
    b = bouncer(ini_overrides={"logfile": missing}, start=False)
    run = run_pgbouncer([b.ini_path])
    assert run.rc == 1
    assert missing in run.stderr


def test_nowhere_to_listen(bouncer, run_pgbouncer):
    b = bouncer(ini_overrides={"listen_addr": "", "unix_socket_dir": ""}, start=False)
    run = run_pgbouncer([b.ini_path])
    assert run.rc == 1
    assert "nowhere to listen on" in output_and_log(run, b)


def test_tcp_port_taken(bouncer, run_pgbouncer):
    # a plain socket without SO_REUSEPORT owns the port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        b = bouncer(ini_overrides={"listen_port": port}, start=False)
        run = run_pgbouncer([b.ini_path])
    assert run.rc == 1
    assert "failed to listen on any address in listen_addr list" in output_and_log(run, b)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs to be started as root")
def test_refuses_to_run_as_root(bouncer, run_pgbouncer):
    b = bouncer(start=False)
    run = run_pgbouncer([b.ini_path], as_root=True)
    assert run.rc == 1
    assert "PgBouncer should not run as root" in output_and_log(run, b)
    assert not b.pidfile.exists()
    assert not unix_socket(b).exists()


# ---------------------------------------------------------------------------
# broken configuration


# id: (settings to change, verbatim line to add, text the error must contain besides file:line)
BROKEN_CONFIGS = {
    "bad-int": ({"listen_port": "abc"}, None, "abc"),
    # on reload listen_port keeps its boot value, so break a reloadable integer instead
    "bad-int-reloadable": ({"max_client_conn": "abc"}, None, "abc"),
    "unknown-key": ({}, "no_such_setting = 1", "unknown parameter: pgbouncer/no_such_setting"),
    "syntax": ({}, "this line has no equals sign", "syntax error"),
}
START_CASES = ["bad-int", "unknown-key", "syntax"]
RELOAD_CASES = ["bad-int-reloadable", "unknown-key", "syntax"]


def break_ini(b, case):
    """Writes a broken ini; returns (line number of the culprit, expected text or None).

    b.settings keeps the broken values: restore them before writing a good file again."""
    settings, line, text = BROKEN_CONFIGS[case]
    b.update(**settings)
    b.write_ini(extra_lines=[line] if line else [])
    return b.line_of(line or next(iter(settings))), text


@pytest.mark.parametrize("case", START_CASES)
def test_broken_config_at_start(bouncer, run_pgbouncer, case):
    b = bouncer(start=False)
    line, text = break_ini(b, case)
    run = run_pgbouncer([b.ini_path])
    seen = output_and_log(run, b)
    assert run.rc == 1
    assert f"{b.ini_path}:{line}" in seen
    assert "cannot load config file" in seen
    if text:
        assert text in seen
    assert not b.pidfile.exists()


def test_config_error_at_start_goes_to_the_logfile(bouncer, run_pgbouncer):
    """A value below its minimum stops the start; the reason is in the log
    file as well as on stderr, for a pooler started by a service manager."""
    b = bouncer(ini_overrides={"pkt_buf": 100}, start=False)
    run = run_pgbouncer([b.ini_path])
    assert run.rc == 1
    assert "pkt_buf must be at least 512 (got 100)" in run.stderr
    log = b.log_text()
    assert re.search(r"\[\d+\] ERROR .*pkt_buf must be at least 512 \(got 100\)", log), log
    assert re.search(r"\[\d+\] FATAL cannot load config file", log), log
    assert not b.pidfile.exists()


# ---------------------------------------------------------------------------
# pidfile and another instance


def test_live_pidfile_blocks_second_instance(bouncer, run_pgbouncer):
    first = bouncer()
    second = bouncer(ini_overrides={"pidfile": str(first.pidfile)}, start=False)
    run = run_pgbouncer([second.ini_path])
    assert run.rc == 1
    assert f"pidfile '{first.pidfile}' exists, another instance running?" in output_and_log(run, second)
    # the first instance and its pidfile are untouched
    assert first.alive()
    assert first.pidfile.read_text() == f"{first.pid}\n"
    assert port_accepts(first.port)


def test_stale_pidfile_is_removed(bouncer, run_as):
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert not pid_alive(dead.pid)
    b = bouncer(start=False)
    run_as.write(b.pidfile, f"{dead.pid}\n")
    b.start()
    assert "stale pidfile, removing" in b.log_text()
    assert b.pidfile.read_text() == f"{b.pid}\n"


def test_unix_socket_exists_while_running(bouncer):
    b = bouncer()
    sock = unix_socket(b)
    assert stat.S_ISSOCK(sock.stat().st_mode)
    assert b.stop(signal.SIGINT) == 0
    assert not sock.exists()


def test_unix_socket_in_use_blocks_second_instance(bouncer, run_pgbouncer):
    first = bouncer()
    second = bouncer(ini_overrides={"unix_socket_dir": str(first.dir), "listen_port": first.port}, start=False)
    run = run_pgbouncer([second.ini_path])
    assert run.rc == 1
    assert "unix socket is in use, cannot continue" in output_and_log(run, second)
    assert first.alive()
    assert stat.S_ISSOCK(unix_socket(first).stat().st_mode)


def test_postgres_lock_file_blocks_unix_port(bouncer, run_pgbouncer, run_as):
    # what a PostgreSQL listening in the same directory on the same port leaves behind
    b = bouncer(start=False)
    run_as.write(b.dir / f".s.PGSQL.{b.port}.lock", "12345\n")
    run = run_pgbouncer([b.ini_path])
    assert run.rc == 1
    assert f"unix port {b.port} is in use" in output_and_log(run, b)


# ---------------------------------------------------------------------------
# daemon mode


def test_daemon(bouncer):
    b = bouncer(args=["-d"])  # waits for the launcher to exit 0 and the daemon to be up
    assert b.returncode == 0
    daemon = b.pid
    assert b.pidfile.read_text() == f"{daemon}\n"
    assert daemon != b.proc.pid
    assert pid_alive(daemon)
    assert parent_pid(daemon) != os.getpid()  # detached: not our child
    assert f"process up: PgBouncer {VERSION}" in b.log_text()
    assert b.stderr() == ""  # -d implies quiet
    assert port_accepts(b.port)

    b.send_signal(signal.SIGTERM)
    wait_for(lambda: not pid_alive(daemon), "the daemon to exit after SIGTERM")
    assert not b.pidfile.exists()


def test_daemon_needs_pidfile(bouncer, run_pgbouncer):
    b = bouncer(ini_overrides={"pidfile": None}, start=False)
    run = run_pgbouncer(["-d", b.ini_path])
    assert run.rc == 1
    assert "daemon needs pidfile configured" in output_and_log(run, b)


@pytest.mark.parametrize("case", ["broken-config", "live-pidfile"])
def test_daemon_start_error_on_stderr(bouncer, run_pgbouncer, either_bin, case):
    """With -d, stderr is given up only when pgbouncer detaches: an error
    before that (here with no logfile to read it in) is on the terminal it
    was started from, as with PgBouncer."""
    if case == "broken-config":
        b = bouncer(ini_overrides={"logfile": None}, start=False, binary=either_bin)
        b.write_ini(extra_lines=["no_such_setting = 1"])
        want = "cannot load config file"
    else:
        first = bouncer()
        b = bouncer(ini_overrides={"logfile": None, "pidfile": str(first.pidfile)}, start=False, binary=either_bin)
        want = f"pidfile '{first.pidfile}' exists, another instance running?"
    run = run_pgbouncer(["-d", b.ini_path], binary=either_bin)
    assert run.rc == 1
    assert re.search(r"\[\d+\] FATAL " + re.escape(want), run.stderr), run.stderr


# ---------------------------------------------------------------------------
# signals


def test_sigquit_fast_exit(bouncer):
    b = bouncer()
    assert b.stop(signal.SIGQUIT) == 0
    assert "got SIGQUIT, fast exit" in b.log_text()
    assert not b.pidfile.exists()


def test_sigint_safe_shutdown(bouncer):
    b = bouncer()
    assert b.stop(signal.SIGINT) == 0
    assert "got SIGINT, shutting down, waiting for all servers connections to be released" in b.log_text()


def test_sigterm_shutdown(bouncer):
    b = bouncer()
    assert b.stop(signal.SIGTERM) == 0
    assert "got SIGTERM, shutting down, waiting for all clients disconnect" in b.log_text()


def test_sighup_keeps_running(bouncer):
    b = bouncer()
    b.reload()
    assert b.alive()
    assert port_accepts(b.port)
    # and it still answers the next signal
    b.reload()
    assert b.alive()


def test_reload_applies_new_logfile(bouncer):
    # logfile is reloadable: after SIGHUP the log continues in the new file
    b = bouncer()
    new_log = b.dir / "other.log"
    b.update(logfile=str(new_log))
    b.write_ini()
    b.reload()  # logged to the old file, then the new setting takes effect
    b.send_signal(signal.SIGHUP)
    wait_for(lambda: "got SIGHUP, re-reading config" in new_log.read_text() if new_log.exists() else False,
             f"'got SIGHUP' in {new_log}")
    assert b.alive()


def test_reload_reopens_rotated_logfile(bouncer):
    b = bouncer()
    rotated = b.dir / "pgbouncer.log.1"
    os.rename(b.logfile, rotated)
    b.send_signal(signal.SIGHUP)
    # the old descriptor still writes to the renamed file; after the reload a fresh file appears
    wait_for(lambda: "got SIGHUP" in rotated.read_text(), "'got SIGHUP' in the rotated log")
    b.send_signal(signal.SIGHUP)
    b.wait_log(r"got SIGHUP, re-reading config")
    assert "process up" not in b.log_text()


def test_reload_keeps_boot_value_of_listen_port(bouncer):
    # listen_port cannot change on reload: the old port keeps working, the new one is not opened
    b = bouncer()
    new_port = free_port()
    new_log = b.dir / "after-reload.log"
    b.update(listen_port=new_port, logfile=str(new_log))
    b.write_ini()
    b.reload()
    # a second SIGHUP reaching the new logfile proves the first reload finished
    b.send_signal(signal.SIGHUP)
    wait_for(lambda: new_log.exists() and "got SIGHUP" in new_log.read_text(), "the reload to finish")
    assert b.alive()
    assert port_accepts(b.port)
    assert not port_accepts(new_port)


@pytest.mark.parametrize("case", RELOAD_CASES)
def test_reload_with_broken_config_keeps_running(bouncer, case):
    b = bouncer()
    good = dict(b.settings)
    line, text = break_ini(b, case)
    mark = b.log_mark()
    b.reload()
    b.wait_log(re.escape(f"{b.ini_path}:{line}"), after=mark)
    b.wait_log(r"config file loading failed", after=mark)
    if text:
        assert text in b.log_text()[mark:]
    assert b.alive()
    assert port_accepts(b.port)
    # the running instance still reacts: a fixed file reloads again
    b.settings = good
    b.write_ini()
    mark = b.log_mark()
    b.reload()
    # once the next signal is logged, the reload of the good file is over
    b.send_signal(signal.SIGHUP)
    b.wait_log(r"got SIGHUP, re-reading config", after=b.log_text().index("got SIGHUP", mark) + 1)
    assert "config file loading failed" not in b.log_text()[mark:]
    assert b.alive()


def daemon_started_as_root(bouncer, run_pgbouncer, run_as):
    """pgbouncer -d started as root with `user` set to the run-as user; returns (b, the daemon's pid)."""
    b = bouncer(ini_overrides={"user": run_as.name}, start=False)
    run = run_pgbouncer(["-d", b.ini_path], as_root=True)
    assert run.rc == 0, run
    wait_for(lambda: b.pidfile.exists() and b.pidfile.read_text().strip(), "the pidfile")
    return b, int(b.pidfile.read_text())


@pytest.mark.skipif(os.geteuid() != 0, reason="needs to be started as root")
def test_logfile_of_switched_user_survives_reload(bouncer, run_pgbouncer, run_as):
    """Started as root with `user` set, the log file is made by that user:
    the reopen at SIGHUP (logrotate's) works and the pooler logs on, where
    a root-owned file could not be opened again and stopped it."""
    b, pid = daemon_started_as_root(bouncer, run_pgbouncer, run_as)
    try:
        wait_for(lambda: "process up" in b.log_text(), "process up")
        assert b.logfile.stat().st_uid == run_as.uid
        os.kill(pid, signal.SIGHUP)
        wait_for(lambda: "got SIGHUP" in b.log_text(), "the SIGHUP line")
        os.kill(pid, signal.SIGUSR1)
        wait_for(lambda: "got SIGUSR1" in b.log_text(), "a line logged after the reopen")
        assert pid_alive(pid)
    finally:
        os.kill(pid, signal.SIGQUIT)
        wait_for(lambda: not os.path.exists(f"/proc/{pid}"), "pgbouncer to stop")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs to be started as root")
def test_user_setting_drops_root(bouncer, run_pgbouncer, run_as):
    """Started as root with `user` set, pgbouncer switches to that user
    (doc/pgbouncer.5.md "user") and serves as it."""
    b, pid = daemon_started_as_root(bouncer, run_pgbouncer, run_as)
    try:
        uids = next(line for line in open(f"/proc/{pid}/status") if line.startswith("Uid:")).split()[1:]
        assert {int(u) for u in uids} == {run_as.uid}, uids
        with b.connect(autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not os.path.exists(f"/proc/{pid}"), "pgbouncer to stop")


# ---------------------------------------------------------------------------
# scripts/lib.sh


def test_package_install_refuses_to_remove_packages(tmp_path):
    """pgb_install_packages (scripts/test, scripts/quickstart) installs with
    apt-get -y, which removes whatever conflicts: Debian's pgbouncer of the
    run lines would take this project's own pgbouncer-multiworker off the
    machine. It stops instead, and installs nothing. (dpkg-query, apt-get
    and sudo are stubs here: nothing is installed.)"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    stubs = tmp_path / "bin"
    stubs.mkdir()
    installed = tmp_path / "installed"
    for name, body in {
        "dpkg-query": 'echo not-installed',
        "sudo": 'exec "$@"',
        "apt-get": ('case " $* " in *" -s "*) echo "Remv pgbouncer-multiworker [1.25.2]";'
                    ' echo "Inst pgbouncer (1.18.0-1+deb12u1 Debian:12 [amd64])";; '
                    f'*" install "*) echo "$*" >>{installed};; esac'),
    }.items():
        (stubs / name).write_text(f"#!/bin/sh\n{body}\n")
        (stubs / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}")
    run = subprocess.run(["bash", "-c", f'source "{root}/scripts/lib.sh"; pgb_install_packages pgbouncer; echo went on'],
                         env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "went on" not in run.stdout, run
    assert "would remove pgbouncer-multiworker" in run.stderr, run.stderr
    assert not installed.exists(), installed.read_text()
