"""Integration-test harness: a throwaway PostgreSQL per session and pgbouncer
processes per test, both run as an unprivileged user when the tests run as root.

Fixtures:
  pg              session-wide PostgreSQL cluster (host, port, sockdir, sql(), create_role())
  bouncer         factory: bouncer(ini_overrides=..., databases=..., users_txt=..., args=..., start=...)
  run_pgbouncer   one-shot run of the binary: run_pgbouncer(args) -> (rc, stdout, stderr)
  pgbouncer_bin   path of the binary under test (env PGBOUNCER_BIN, default build/pgbouncer)
  peer_bin        PgBouncer 1.25.2 to compare with (env PGBOUNCER_PEER; skips when absent)
  either_bin      parametrized: the binary under test, then PgBouncer 1.25.2 (bouncer(binary=...))
  tls_files       session-wide test CA, certificates and keys (test/tlsfiles.py)
  pg_ssl          session-wide second cluster that accepts TCP logins over TLS only
  hidden_ca_wrapper  argv prefix running pgbouncer where /etc/ssl/certs is empty (root only)

Plain helpers for tests (from conftest import ...): wait_for, free_port,
port_accepts, port_listening, pid_alive, parent_pid.

Every wait has a generous deadline (PGB_TEST_DEADLINE seconds, default 30); tests
wait for conditions and never assert on how long something took. Set PGB_KEEP_TMP=1
to keep the session's temporary directory for inspection.

At teardown every pooler process must exit by itself (stop_pooler()); one that has
to be killed is reported with a PoolerKilledWarning naming the test. Under
`scripts/test --sanitize` (PGB_SANITIZE_DIR, PGB_SANITIZE_INDEX) the harness also
records which sanitizer report files appeared during which test, and the kills.
"""

import collections
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest

from tlsfiles import TlsFiles

try:
    import psycopg
    from psycopg import sql as pgsql
except ImportError:  # reported in pytest_configure with a hint
    psycopg = None

REPO = Path(__file__).resolve().parent.parent
DEADLINE = float(os.environ.get("PGB_TEST_DEADLINE", "30"))
TEST_USER = "pgbtest"

# Per-test records used to attach logs to a failing test's report.
BOUNCERS_KEY = pytest.StashKey[list]()
RUNS_KEY = pytest.StashKey[list]()
PG_LOG_MARK_KEY = pytest.StashKey[int]()

# Set while the session's PostgreSQL exists (hooks have no access to fixtures).
_session_pg = None

# scripts/test --sanitize: the directory the sanitizers write their reports to,
# and the file where the harness records which test each report (and each
# pooler process it had to kill) belongs to, one tab-separated line each.
SANITIZE_DIR = os.environ.get("PGB_SANITIZE_DIR") or None
SANITIZE_INDEX = os.environ.get("PGB_SANITIZE_INDEX") or None

# How long cleanup lets a pooler stop by itself (SIGTERM) before it uses SIGQUIT.
STOP_GRACE = float(os.environ.get("PGB_TEST_STOP_GRACE", "10"))


class PoolerKilledWarning(UserWarning):
    """A pooler process did not exit by itself at teardown and was killed
    (SIGKILL): an exit-time report (LeakSanitizer) it would have written is lost."""


def pytest_configure(config):
    if psycopg is None:
        raise pytest.UsageError(
            f"psycopg 3 is not importable by {sys.executable}; run the tests with Debian's "
            "/usr/bin/python3 (packages python3-pytest, python3-psycopg) or through scripts/test"
        )


# ---------------------------------------------------------------------------
# small helpers


def wait_for(cond, what, timeout=DEADLINE, interval=0.05):
    """Polls cond() until it returns something truthy and returns that value.

    Fails the test with `what` in the message when the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


_ports_handed_out = set()


def free_port():
    """A loopback TCP port nobody listens on, never the same one twice per session."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _ports_handed_out:
            _ports_handed_out.add(port)
            return port


def port_accepts(port, host="127.0.0.1"):
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def port_listening(port):
    """True if a socket listens on TCP `port` (IPv4 or IPv6). Unlike
    port_accepts() this opens no connection, so it leaves no trace in the log."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)  # header
                for row in f:
                    local, state = row.split()[1], row.split()[3]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A = LISTEN
                        return True
        except FileNotFoundError:
            continue
    return False


def pid_alive(pid):
    """True if pid exists and is not a zombie (an orphaned daemon may stay a
    zombie when PID 1 does not reap)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # the state follows the parenthesised command name, which may contain spaces
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def parent_pid(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def live_group(pgid, states=None):
    """{pid: parent pid} of the processes of process group `pgid` that have not
    exited. Zombies do not count: a worker that outlives its master is
    reparented to PID 1, which may reap late or never (kill(-pgid, 0) still
    succeeds while the group holds only zombies). With `states` (a string of
    /proc state letters), only the processes in one of those states."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # fields: state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X") and (states is None or fields[0] in states):
            found[int(entry)] = int(fields[1])
    return found


def _signal(pid, sig):
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_pooler(master, pgid, master_stopping=False, grace=STOP_GRACE):
    """Stops a pooler's process tree so that every process exits by itself
    (and runs its exit-time checks, LeakSanitizer's among them); returns what
    had to be killed, as sentences (empty when nothing was).

    `master` is the master's pid (None or dead: only workers are left) and
    `pgid` the tree's process group. SIGTERM makes the master shut down; each
    worker gets SIGTERM too, until it exits: a worker that is shutting down
    exits at a second SIGTERM even with clients connected, and the master exits
    after its last worker. Only after `grace` seconds does it fall back to
    SIGQUIT, upon which the master SIGKILLs its workers (supervisor_kill_all),
    and then to SIGKILL. With `master_stopping` (the master already got SIGTERM
    or SIGINT) the master is not signalled: a second SIGTERM is its fast exit.
    A process left stopped (SIGSTOP) gets SIGCONT first."""
    killed = []
    initial = live_group(pgid)
    if not initial:
        return killed
    # A process a test left stopped (SIGSTOP, state T) could not exit. Only those
    # get SIGCONT: one to the whole group could reach a worker that is already
    # exiting while LeakSanitizer attaches to it (ptrace), discard the SIGSTOP of
    # that attach, and leave the sanitizer waiting for a stop that never comes.
    for pid in live_group(pgid, states="T"):
        _signal(pid, signal.SIGCONT)
    if master is not None and not master_stopping:
        _signal(master, signal.SIGTERM)
    start = time.monotonic()
    next_round = start + 0.05  # the master forwards its SIGTERM first
    while True:
        procs = live_group(pgid)
        if not procs:
            return killed
        now = time.monotonic()
        if now - start > grace:
            break
        if now >= next_round:
            # the workers: processes of the group from before the first signal whose
            # parent is the master or outside the group (orphans), not a task that a
            # sanitizer clones at exit (LeakSanitizer's, whose parent is the exiting one)
            for pid, ppid in procs.items():
                if pid != master and pid in initial and (ppid == master or ppid not in procs):
                    _signal(pid, signal.SIGTERM)
            next_round = now + 0.25
        time.sleep(0.01)

    def names(pids):
        return ", ".join(f"{'master' if p == master else 'worker'} {p}" for p in sorted(pids))

    procs = live_group(pgid)
    if master in procs:
        workers = [p for p, ppid in procs.items() if ppid == master]
        if workers:
            killed.append(f"{names(workers)} SIGKILLed by the master at SIGQUIT "
                          f"(still running {grace:g}s after SIGTERM)")
        _signal(master, signal.SIGQUIT)
        # the master's exit, and the death of the workers it killed
        deadline = time.monotonic() + 10
        while live_group(pgid) and time.monotonic() < deadline:
            time.sleep(0.01)
    procs = live_group(pgid)
    if procs:
        killed.append(f"{names(procs)} SIGKILLed by the harness (still running after SIGTERM and SIGQUIT)")
        for pid in procs:
            _signal(pid, signal.SIGKILL)
    return killed


def tail(text, max_lines=300):
    lines = text.splitlines()
    if len(lines) <= max_lines:
        return text
    return f"[... {len(lines) - max_lines} earlier lines omitted ...]\n" + "\n".join(lines[-max_lines:])


def read_text(path):
    try:
        return Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return ""


# ---------------------------------------------------------------------------
# who runs the servers


class RunAs:
    """The OS user that PostgreSQL and pgbouncer run as.

    As root that is the unprivileged TEST_USER (PostgreSQL refuses root and
    pgbouncer must too); otherwise the current user."""

    def __init__(self):
        self.root = os.geteuid() == 0
        if self.root:
            try:
                pw = pwd.getpwnam(TEST_USER)
            except KeyError:
                subprocess.run(
                    ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", TEST_USER],
                    check=True,
                )
                pw = pwd.getpwnam(TEST_USER)
        else:
            pw = pwd.getpwuid(os.geteuid())
        self.name, self.uid, self.gid = pw.pw_name, pw.pw_uid, pw.pw_gid

    def popen_kwargs(self):
        """Popen arguments that drop privileges in the child when we are root."""
        if not self.root:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def own(self, path):
        """Gives a file or directory we created to the run-as user."""
        if self.root:
            os.chown(path, self.uid, self.gid)

    def mkdir(self, prefix, parent=None):
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        self.own(path)
        return path

    def write(self, path, text, mode=0o644):
        path = Path(path)
        path.write_text(text)
        os.chmod(path, mode)
        self.own(path)
        return path


def child_env():
    """Environment for server processes: ours, minus libpq variables that
    could redirect a connection, with a predictable locale."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


@pytest.fixture(scope="session")
def run_as():
    return RunAs()


@pytest.fixture(scope="session")
def session_dir(run_as):
    """One temporary directory per session, traversable by the run-as user
    (pytest's own tmp_path lives under a root-only directory)."""
    base = Path(tempfile.mkdtemp(prefix="pgbt-"))
    os.chmod(base, 0o755)
    run_as.own(base)
    yield base
    _kill_leftovers(base)
    if os.environ.get("PGB_KEEP_TMP") != "1":
        shutil.rmtree(base, ignore_errors=True)
    else:
        print(f"\nkept test directory {base}")


def _kill_leftovers(base):
    """Last-resort cleanup: SIGKILL any process whose command line mentions the
    session directory (a daemon that a failing test could not stop)."""
    marker = str(base).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if marker in cmdline:
            try:
                os.kill(int(entry), signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="session")
def pgbouncer_bin(run_as, session_dir):
    """The binary under test. When the run-as user cannot execute it where it
    is (e.g. a checkout under /root), a copy in the session directory is used."""
    path = Path(os.environ.get("PGBOUNCER_BIN", REPO / "build" / "pgbouncer")).resolve()
    if not path.is_file():
        pytest.fail(f"pgbouncer binary not found at {path}: build it (scripts/test, or make -C build) "
                    "or set PGBOUNCER_BIN", pytrace=False)
    try:
        subprocess.run([str(path), "-V"], capture_output=True, timeout=DEADLINE, **run_as.popen_kwargs())
    except PermissionError:
        bindir = run_as.mkdir("bin-", session_dir)
        os.chmod(bindir, 0o755)
        copy = bindir / "pgbouncer"
        shutil.copy2(path, copy)
        os.chmod(copy, 0o755)
        path = copy
    return path


PEER_NAME = "pgbouncer-1.25.2"


@pytest.fixture(scope="session")
def peer_bin():
    """PgBouncer 1.25.2, the release this project replaces, to run the same
    steps against (env PGBOUNCER_PEER, default ../shared/peers/pgbouncer-1.25.2
    beside the checkout); the test is skipped when it is absent."""
    path = Path(os.environ.get("PGBOUNCER_PEER", REPO.parent / "shared" / "peers" / PEER_NAME))
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.skip(f"{PEER_NAME} not found at {path} (set PGBOUNCER_PEER to compare with it)")
    return path.resolve()


@pytest.fixture(params=["ours", PEER_NAME])
def either_bin(request):
    """Each test that uses it runs twice: with the binary under test
    (pgbouncer_bin) and with PgBouncer 1.25.2 (peer_bin, skipped when
    absent). Pass it as bouncer(binary=either_bin); `either_bin.peer` says
    which one it is, for the few steps only one of them has."""
    path = request.getfixturevalue("peer_bin" if request.param == PEER_NAME else "pgbouncer_bin")
    return PoolerBinary(path, request.param == PEER_NAME)


class PoolerBinary:
    """A pooler binary's path (str() and os.fspath() give it) and whether it
    is the peer, PgBouncer 1.25.2."""

    def __init__(self, path, peer):
        self.path, self.peer = Path(path), peer

    def __fspath__(self):
        return str(self.path)

    def __str__(self):
        return str(self.path)


# ---------------------------------------------------------------------------
# PostgreSQL


def pg_bindir():
    """Highest installed PostgreSQL server bindir (override with PG_BINDIR)."""
    if os.environ.get("PG_BINDIR"):
        return Path(os.environ["PG_BINDIR"])
    candidates = []
    for d in Path("/usr/lib/postgresql").glob("*/bin"):
        if (d / "initdb").exists() and d.parent.name.split(".")[0].isdigit():
            candidates.append((int(d.parent.name.split(".")[0]), d))
    if candidates:
        return max(candidates)[1]
    out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


class Postgres:
    """A throwaway cluster listening on 127.0.0.1:<free port> and a Unix socket in its directory.

    `settings` are extra postgresql.conf lines (name -> value as written, they
    override the harness's own); `hba` replaces pg_hba.conf. The harness's own
    connections (sql(), the readiness check) go over TCP unless
    `setup_over_socket` is set, e.g. for a cluster whose TCP logins need TLS."""

    host = "127.0.0.1"

    def __init__(self, run_as, base, settings=None, hba=None, setup_over_socket=False):
        self.run_as = run_as
        self.bindir = pg_bindir()
        self.dir = run_as.mkdir("pg-", base)
        self.sockdir = self.dir
        self.datadir = self.dir / "data"
        self.logfile = self.dir / "postgresql.log"
        self.port = free_port()
        self.settings = dict(settings or {})
        self.hba = hba
        self.setup_host = str(self.sockdir) if setup_over_socket else self.host
        self.proc = None

    def _run(self, args):
        out = subprocess.run(args, cwd=self.dir, env=child_env(), capture_output=True, text=True,
                             timeout=120, **self.run_as.popen_kwargs())
        if out.returncode != 0:
            raise AssertionError(f"{args[0]} failed ({out.returncode}):\n{out.stdout}{out.stderr}")

    def start(self):
        self._run([str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", "postgres", "--auth=trust",
                   "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"])
        with open(self.datadir / "postgresql.conf", "a") as f:
            f.write(
                "\n# added by the pgbouncer test harness\n"
                "listen_addresses = '127.0.0.1'\n"
                f"port = {self.port}\n"
                f"unix_socket_directories = '{self.sockdir}'\n"
                "max_connections = 200\n"
                "password_encryption = 'scram-sha-256'\n"
                "fsync = off\n"
                "synchronous_commit = off\n"
                "full_page_writes = off\n"
                "logging_collector = off\n"
                # replication through the pooler (test_replication.py): logical decoding
                # needs wal_level=logical; initdb's pg_hba.conf already trusts replication
                "wal_level = logical\n"
                "max_wal_senders = 10\n"
                "max_replication_slots = 10\n"
            )
            f.writelines(f"{name} = {value}\n" for name, value in self.settings.items())
        if self.hba is not None:
            self.run_as.write(self.datadir / "pg_hba.conf", self.hba, mode=0o600)
        log = open(self.logfile, "ab")
        self.run_as.own(self.logfile)
        self.proc = subprocess.Popen([str(self.bindir / "postgres"), "-D", str(self.datadir)],
                                     cwd=self.dir, env=child_env(), stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                     **self.run_as.popen_kwargs())
        log.close()

        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"postgres exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                self.sql("SELECT 1")
                return True
            except psycopg.OperationalError:
                return False

        wait_for(ready, "PostgreSQL to accept connections", timeout=max(DEADLINE, 60), interval=0.1)

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self._run([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "stop", "-m", "immediate",
                           "-w", "-t", "30"])
            except (AssertionError, subprocess.TimeoutExpired):
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def connect(self, dbname="postgres", user="postgres", **kw):
        kw.setdefault("autocommit", True)
        kw.setdefault("host", self.setup_host)
        return psycopg.connect(port=self.port, dbname=dbname, user=user, connect_timeout=10, **kw)

    def sql(self, query, params=None, dbname="postgres"):
        """Runs one statement as superuser; returns its rows (or None without a result)."""
        with self.connect(dbname=dbname) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else None

    def create_role(self, name, password=None, superuser=False):
        """Creates (or updates) a login role; the password is stored as SCRAM."""
        # utility statements take no bound parameters: compose the literal client-side
        if not self.sql("SELECT 1 FROM pg_roles WHERE rolname = %s", [name]):
            self.sql(pgsql.SQL("CREATE ROLE {} LOGIN").format(pgsql.Identifier(name)))
        self.sql(pgsql.SQL("ALTER ROLE {} {} PASSWORD {}").format(
            pgsql.Identifier(name), pgsql.SQL("SUPERUSER" if superuser else "NOSUPERUSER"),
            pgsql.Literal(password)))

    def connstr(self, dbname="postgres", **extra):
        """A [databases] entry pointing at this cluster over TCP."""
        parts = [f"host={self.host}", f"port={self.port}", f"dbname={dbname}"]
        parts += [f"{k}={v}" for k, v in extra.items()]
        return " ".join(parts)

    def log_size(self):
        try:
            return self.logfile.stat().st_size
        except FileNotFoundError:
            return 0

    def log_text(self, since=0):
        try:
            with open(self.logfile, "rb") as f:
                f.seek(since)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""


@pytest.fixture(scope="session")
def pg(run_as, session_dir):
    global _session_pg
    server = Postgres(run_as, session_dir)
    _session_pg = server
    try:
        server.start()
        yield server
    finally:
        server.stop()
        _session_pg = None


# ---------------------------------------------------------------------------
# TLS: test certificates, a TLS-only PostgreSQL, a machine without a CA bundle

TLS_USERS = ("postgres", "alice", "pgbcert")  # who gets a client certificate CN=<user>


@pytest.fixture(scope="session")
def tls_files(run_as, session_dir):
    """The test CA, certificates and keys of test/tlsfiles.py, made once per session."""
    return TlsFiles.create(session_dir / "tls", run_as, users=TLS_USERS)


@pytest.fixture(scope="session")
def pg_ssl(run_as, session_dir, tls_files):
    """A second cluster whose TCP logins must use TLS (pg_hba.conf has only
    `hostssl` lines, plus `local` for the harness). Its certificate is
    tls_files.server_cert (localhost, 127.0.0.1); client certificates are
    checked against the test CA, and the role pgbcert must present one (cert
    method). It also listens on 127.0.0.2, an address its certificate does not name."""
    server = Postgres(run_as, session_dir, settings={
        "listen_addresses": "'127.0.0.1,127.0.0.2'",
        "ssl": "on",
        "ssl_cert_file": f"'{tls_files.server_cert}'",
        "ssl_key_file": f"'{tls_files.server_key}'",
        "ssl_ca_file": f"'{tls_files.ca_cert}'",
    }, hba=("local all all trust\n"
            "hostssl all pgbcert 127.0.0.0/8 cert\n"
            "hostssl all all 127.0.0.0/8 trust\n"), setup_over_socket=True)
    try:
        server.start()
        server.sql("CREATE ROLE pgbcert LOGIN")
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def hidden_ca_wrapper(run_as):
    """An argv prefix (Bouncer `wrapper=`) that runs pgbouncer where the
    system CA bundle does not exist: in a private mount namespace with an
    empty tmpfs over /etc/ssl/certs (OpenSSL's default file and directory
    both live there on Debian), as the run-as user. Needs root; skips the
    test when a mount namespace cannot be made here."""
    if not run_as.root:
        pytest.skip("hiding the system CA bundle needs root (a private mount namespace)")
    for tool in ("unshare", "setpriv", "mount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    script = ('mount -t tmpfs -o mode=0755 none /etc/ssl/certs && '
              f'exec setpriv --reuid={run_as.uid} --regid={run_as.gid} --clear-groups "$@"')
    wrapper = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
    probe = subprocess.run([*wrapper, "sh", "-c", "test -z \"$(ls -A /etc/ssl/certs)\" && id -u"],
                           capture_output=True, text=True, timeout=DEADLINE)
    if probe.returncode != 0 or probe.stdout.strip() != str(run_as.uid):
        pytest.skip(f"cannot hide /etc/ssl/certs in a mount namespace here: {probe.stderr.strip()}")
    return wrapper


# ---------------------------------------------------------------------------
# pgbouncer


Run = collections.namedtuple("Run", "rc stdout stderr")


class Bouncer:
    """One pgbouncer instance with its own directory, ini, port and Unix socket.

    The ini is rendered from `settings` ([pgbouncer]), `databases` and the
    userlist; change them with update() and write_ini(). The process is
    started in a new session so that cleanup can kill it with all its children.
    """

    def __init__(self, binary, run_as, base, pg, ini_overrides=None, databases=None, users_txt=None,
                 wrapper=None, env=None):
        self.binary = binary
        self.run_as = run_as
        self.wrapper = list(wrapper or [])  # argv prefix; it must drop privileges itself (hidden_ca_wrapper)
        self.env = dict(env or {})  # added to the environment
        self.dir = run_as.mkdir("bouncer-", base)
        self.name = self.dir.name
        self.port = free_port()  # the port of the running process (its boot value)
        self.ini_path = self.dir / "pgbouncer.ini"
        self.logfile = self.dir / "pgbouncer.log"
        self.pidfile = self.dir / "pgbouncer.pid"
        self.userlist = self.dir / "userlist.txt"
        self.stdout_path = self.dir / "stdout.txt"
        self.stderr_path = self.dir / "stderr.txt"
        self.settings = {
            "listen_addr": "127.0.0.1",
            "listen_port": self.port,
            "unix_socket_dir": str(self.dir),
            "logfile": str(self.logfile),
            "pidfile": str(self.pidfile),
            "auth_type": "trust",
            "auth_file": str(self.userlist),
            "admin_users": "pgbouncer",
        }
        self.update(**(ini_overrides or {}))
        self.port = self._configured_port()
        if databases is None:
            databases = {"postgres": pg.connstr("postgres")}
        self.databases = dict(databases)
        if users_txt is None:
            users_txt = '"postgres" "postgres"\n"pgbouncer" "pgbouncer"\n'
        run_as.write(self.userlist, users_txt, mode=0o600)
        self.write_ini()

        self.proc = None  # the process we started (the launcher, for -d)
        self.daemon = False
        self._pid = None  # the daemon's pid once known
        self._pgid = None
        self._log_start = 0
        self._connections = []

    # --- configuration ---

    def update(self, **settings):
        """Changes [pgbouncer] settings in memory; None removes a key. Call write_ini() to apply."""
        for key, value in settings.items():
            if value is None:
                self.settings.pop(key, None)
            else:
                self.settings[key] = value

    def _configured_port(self):
        try:
            return int(self.settings.get("listen_port", self.port))
        except ValueError:  # a deliberately broken value
            return self.port

    def render_ini(self, extra_lines=()):
        lines = ["[pgbouncer]"]
        lines += [f"{k} = {v}" for k, v in self.settings.items()]
        lines += list(extra_lines)
        # no blank line before the next section: PgBouncer reports an error on a
        # line followed by blank lines at the line where parsing resumed
        lines += ["[databases]"]
        lines += [f"{k} = {v}" for k, v in self.databases.items()]
        return "\n".join(lines) + "\n"

    def write_ini(self, extra_lines=(), text=None):
        """Writes the ini from the current settings (extra_lines go verbatim at
        the end of [pgbouncer]), or exactly `text` when given."""
        self.run_as.write(self.ini_path, text if text is not None else self.render_ini(extra_lines))

    def line_of(self, key_or_line):
        """1-based line number in the ini of `key = ...` or of a verbatim line."""
        key_re = re.compile(rf"^\s*{re.escape(key_or_line)}\s*=")
        for number, line in enumerate(self.ini_path.read_text().splitlines(), 1):
            if key_re.match(line) or line.strip() == key_or_line.strip():
                return number
        raise KeyError(f"{key_or_line!r} not in {self.ini_path}")

    # --- process ---

    @property
    def pid(self):
        """The pgbouncer (master) process: the daemon for -d, else our child."""
        return self._pid if self.daemon else (self.proc.pid if self.proc else None)

    @property
    def returncode(self):
        return self.proc.poll() if self.proc else None

    def start(self, args=(), wait=True):
        """Starts `pgbouncer ARGS INI` in the instance directory."""
        assert self.proc is None or not self.alive(), "already running"
        self.daemon = "-d" in args or "--daemon" in args
        self._pid = None
        self.port = self._configured_port()
        self._log_start = len(self.log_text())
        out = open(self.stdout_path, "ab")
        err = open(self.stderr_path, "ab")
        env = child_env()
        env.update(self.env)
        # a wrapper execs pgbouncer in this process, so proc.pid stays pgbouncer's pid
        self.proc = subprocess.Popen([*self.wrapper, str(self.binary), *args, str(self.ini_path)],
                                     cwd=self.dir, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                     start_new_session=True,
                                     **({} if self.wrapper else self.run_as.popen_kwargs()))
        out.close()
        err.close()
        self._pgid = self.proc.pid
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout=DEADLINE):
        """Waits until the log says `process up` and the TCP port is listening.

        With -d the launcher must exit 0 first and the pidfile names the daemon."""
        if self.daemon:
            try:
                rc = self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"pgbouncer -d did not return within {timeout:g}s\n{self.describe()}")
            assert rc == 0, f"pgbouncer -d exited with {rc}\n{self.describe()}"
            self._pid = wait_for(self._read_pidfile, f"pidfile {self.pidfile}", timeout)
            try:
                self._pgid = os.getpgid(self._pid)
            except ProcessLookupError:
                pass

        def up():
            if not self.alive():
                raise AssertionError(f"pgbouncer exited before it was up (rc={self.returncode})\n"
                                     f"{self.describe()}")
            return "process up" in self.log_text()[self._log_start:] and port_listening(self.port)

        try:
            wait_for(up, "pgbouncer to log 'process up' and listen on its TCP port", timeout)
        except AssertionError as e:
            if "timed out" in str(e):
                raise AssertionError(f"{e}\n{self.describe()}") from None
            raise

    def _read_pidfile(self):
        text = read_text(self.pidfile)
        return int(text) if text.endswith("\n") and text.strip().isdigit() else None

    def alive(self):
        if self.daemon:
            return self._pid is not None and pid_alive(self._pid)
        return self.proc is not None and self.proc.poll() is None

    def send_signal(self, sig):
        os.kill(self.pid, sig)

    def wait_exit(self, timeout=DEADLINE):
        """Waits for the process to end; returns its exit code (None for a daemon)."""
        if self.daemon:
            wait_for(lambda: not self.alive(), f"pgbouncer (pid {self._pid}) to exit", timeout)
            return None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"pgbouncer (pid {self.proc.pid}) still running after {timeout:g}s\n"
                                 f"{self.describe()}") from None

    def stop(self, sig=signal.SIGTERM, timeout=DEADLINE):
        """Sends `sig` and waits for the exit; returns the exit code (None for a daemon)."""
        self.send_signal(sig)
        return self.wait_exit(timeout)

    def reload(self):
        """SIGHUP, then waits for `got SIGHUP` to be logged (not for the reload to finish)."""
        mark = self.log_mark()
        self.send_signal(signal.SIGHUP)
        self.wait_log(r"got SIGHUP, re-reading config", after=mark)

    def cleanup(self):
        """Always leaves nothing running: stop_pooler() (SIGTERM until every
        process has exited by itself, SIGQUIT and SIGKILL only after a grace
        period). Returns what had to be killed (see stop_pooler())."""
        for conn in self._connections:
            try:
                conn.close()
            except Exception:
                pass
        self._connections.clear()
        if self.proc is None:
            return []
        master = self.pid if self.alive() else None
        # a second SIGTERM (or SIGINT) is the master's fast exit, which kills the workers
        stopping = master is not None and re.search(rf"\[{master}\] LOG got SIG(TERM|INT), shutting down",
                                                    self.log_text()[self._log_start:]) is not None
        killed = []
        if self._pgid:
            killed = stop_pooler(master, self._pgid, master_stopping=stopping)
        elif master is not None:  # no group known: the master alone
            self.send_signal(signal.SIGQUIT)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            killed.append(f"pid {self.proc.pid} SIGKILLed by the harness")
            self.proc.wait()
        return killed

    # --- logs and output ---

    def log_text(self):
        return read_text(self.logfile)

    def log_mark(self):
        """Current end of the log; pass as `after=` to wait for newer lines only."""
        return len(self.log_text())

    def wait_log(self, pattern, timeout=DEADLINE, after=0):
        """Waits until the log (from offset `after`) matches the regex; returns the match."""
        regex = re.compile(pattern, re.MULTILINE)

        def found():
            m = regex.search(self.log_text(), after)
            if m is None and self.proc is not None and not self.alive():
                # the process is gone: one last look, then give up early
                m = regex.search(self.log_text(), after)
                if m is None:
                    raise AssertionError(f"pgbouncer exited (rc={self.returncode}) without logging "
                                         f"{pattern!r}\n{self.describe()}")
            return m

        try:
            return wait_for(found, f"log line matching {pattern!r}", timeout)
        except AssertionError as e:
            if "timed out" in str(e):
                raise AssertionError(f"{e}\n{self.describe()}") from None
            raise

    def stdout(self):
        return read_text(self.stdout_path)

    def stderr(self):
        return read_text(self.stderr_path)

    def describe(self):
        """The end of the log and of stderr, for assertion messages (the whole
        log and output are attached to the failing test's report)."""
        return (f"--- {self.logfile} (end)\n{tail(self.log_text(), 10)}\n"
                f"--- stderr (end)\n{tail(self.stderr(), 10)}")

    # --- clients ---

    def connect(self, dbname="postgres", user="postgres", **kw):
        """A psycopg connection through the pooler's TCP port (closed at teardown);
        host= may name the Unix socket directory instead, or a name for TLS to verify."""
        kw.setdefault("host", "127.0.0.1")
        kw.setdefault("connect_timeout", 10)
        conn = psycopg.connect(port=self.port, dbname=dbname, user=user, **kw)
        self._connections.append(conn)
        return conn

    def admin(self, user="pgbouncer", **kw):
        """A connection to the admin console (autocommit: it has no transactions)."""
        kw.setdefault("autocommit", True)
        return self.connect(dbname="pgbouncer", user=user, **kw)


@pytest.fixture
def bouncer(request, pgbouncer_bin, run_as, session_dir, pg):
    """Factory for pgbouncer instances; all are stopped at the end of the test.

        b = bouncer(ini_overrides={"max_client_conn": 10}, databases={...},
                    users_txt='"u" "p"\\n', args=["-v"], start=True)

    binary= runs another pgbouncer (e.g. the system's); wrapper= is an argv
    prefix that execs the command (and drops privileges itself, see
    hidden_ca_wrapper); env= adds environment variables.
    """
    made = request.node.stash.setdefault(BOUNCERS_KEY, [])
    request.node.stash[PG_LOG_MARK_KEY] = pg.log_size()

    def make(ini_overrides=None, databases=None, users_txt=None, args=(), start=True, binary=None,
             wrapper=None, env=None):
        b = Bouncer(binary or pgbouncer_bin, run_as, session_dir, pg, ini_overrides, databases, users_txt,
                    wrapper, env)
        made.append(b)
        if start:
            b.start(args)
        return b

    yield make
    killed = [f"pgbouncer {b.name}: {what}" for b in made for what in b.cleanup()]
    if killed:
        record_kills(request.node.nodeid, killed)
    # a build with --enable-cassert logs a broken invariant before it aborts
    broken = [line for b in made for line in b.log_text().splitlines() if "assertion failed:" in line]
    assert not broken, "pgbouncer broke an internal invariant:\n" + "\n".join(broken)


@pytest.fixture
def run_pgbouncer(request, pgbouncer_bin, run_as, session_dir):
    """Runs the binary once and returns Run(rc, stdout, stderr).

        rc, out, err = run_pgbouncer(["-V"])
        run_pgbouncer([ini], as_root=True)        # no privilege drop
        run_pgbouncer(["-x"], binary=some_symlink)  # other argv[0]
    """
    runs = request.node.stash.setdefault(RUNS_KEY, [])

    def run(args, timeout=DEADLINE, as_root=False, cwd=None, binary=None):
        cmd = [str(binary or pgbouncer_bin), *map(str, args)]
        kwargs = {} if as_root else run_as.popen_kwargs()
        proc = subprocess.Popen(cmd, cwd=cwd or session_dir, env=child_env(), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                **kwargs)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            runs.append((cmd, "killed", out, err))
            raise AssertionError(f"{' '.join(cmd)} did not exit within {timeout:g}s\n"
                                 f"stdout:\n{out.decode(errors='replace')}\n"
                                 f"stderr:\n{err.decode(errors='replace')}")
        result = Run(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))
        runs.append((cmd, result.rc, result.stdout, result.stderr))
        return result

    return run


# ---------------------------------------------------------------------------
# teardown kills and sanitizer reports, per test


def record_kills(nodeid, killed):
    """Reports pooler processes that cleanup had to kill: a warning naming the
    test, and under scripts/test --sanitize a line in the index, which lists
    them next to the reports (a killed process may have lost its report)."""
    warnings.warn(PoolerKilledWarning("a killed process writes no exit-time sanitizer report: "
                                      + "; ".join(killed)))
    _index_append([("killed", nodeid, what) for what in killed])


def _index_append(records):
    if SANITIZE_INDEX and records:
        with open(SANITIZE_INDEX, "a") as f:
            f.writelines("\t".join(str(x).replace("\t", " ").replace("\n", " ") for x in r) + "\n"
                         for r in records)


def _sanitizer_files():
    try:
        return set(os.listdir(SANITIZE_DIR))
    except OSError:
        return set()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under --sanitize: which report files appeared during the test (setup,
    call and teardown, by which time every pooler it started has exited)."""
    if not SANITIZE_DIR:
        yield
        return
    before = _sanitizer_files()
    yield
    new = sorted(_sanitizer_files() - before)
    _index_append([("report", name, item.nodeid) for name in new])


# ---------------------------------------------------------------------------
# reports: attach logs to failing tests


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not rep.failed:
        return
    for b in item.stash.get(BOUNCERS_KEY, []):
        rep.sections.append((f"pgbouncer log {b.logfile}", tail(b.log_text()) or "(empty)"))
        for label, text in (("stderr", b.stderr()), ("stdout", b.stdout())):
            if text:
                rep.sections.append((f"pgbouncer {label} ({b.name})", tail(text)))
    for cmd, rc, out, err in item.stash.get(RUNS_KEY, []):
        rep.sections.append((f"pgbouncer run: {' '.join(cmd)} -> {rc}",
                             f"stdout:\n{tail(out if isinstance(out, str) else out.decode(errors='replace'))}\n"
                             f"stderr:\n{tail(err if isinstance(err, str) else err.decode(errors='replace'))}"))
    if _session_pg is not None and PG_LOG_MARK_KEY in item.stash:
        text = _session_pg.log_text(since=item.stash[PG_LOG_MARK_KEY])
        if text.strip():
            rep.sections.append(("postgresql log (during this test)", tail(text, 100)))
