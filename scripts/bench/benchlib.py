"""Helpers for the benchmarks in scripts/bench/ (Python standard library only).

A throwaway PostgreSQL and poolers run as the unprivileged user pgbtest when
we are root; the CPU of a pooler's process tree comes from /proc; a tiny
PostgreSQL wire-protocol client talks to the admin console and measures
connection churn with failures sorted by the stage at which they happened.
"""

import errno
import os
import pathlib
import pwd
import re
import shutil
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_AS_USER = "pgbtest"
CLK_TCK = os.sysconf("SC_CLK_TCK")
START_TIMEOUT = 30  # seconds for a server to come up
STOP_TIMEOUT = 10  # seconds after the stop signal before SIGKILL


def log(msg=""):
    print(msg, flush=True)


class BenchError(Exception):
    pass


# --- running things as the unprivileged user ---


class RunAs:
    """Who PostgreSQL and the poolers run as: pgbtest when we are root, else us."""

    def __init__(self):
        self.root = os.geteuid() == 0
        if self.root:
            try:
                pw = pwd.getpwnam(RUN_AS_USER)
            except KeyError:
                raise BenchError(f"user {RUN_AS_USER} does not exist (useradd --system "
                                 f"--no-create-home --shell /usr/sbin/nologin {RUN_AS_USER})")
        else:
            pw = pwd.getpwuid(os.geteuid())
        self.uid, self.gid = pw.pw_uid, pw.pw_gid

    def popen_kwargs(self):
        return {"user": self.uid, "group": self.gid, "extra_groups": []} if self.root else {}

    def own(self, path):
        if self.root:
            os.chown(path, self.uid, self.gid)

    def write(self, path, text, mode=0o644):
        path.write_text(text)
        os.chmod(path, mode)
        self.own(path)


def child_env():
    """Our environment without libpq variables that could redirect a connection."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_listening(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def wait_for(cond, what, timeout, step=0.05):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


def tail(path, lines=20):
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} unreadable)"


def default_pg_bindir():
    best, bestv = None, -1
    for d in Path("/usr/lib/postgresql").glob("*/bin"):
        v = d.parent.name.split(".")[0]
        if v.isdigit() and int(v) > bestv and (d / "initdb").exists():
            best, bestv = d, int(v)
    return str(best) if best else "/usr/lib/postgresql/15/bin"


# --- CPU accounting from /proc ---


def read_stat(pid):
    """(ppid, utime+stime, cutime+cstime) of a process in clock ticks, or None if it is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may contain spaces and parentheses
    fields = data[data.rindex(")") + 2:].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return int(fields[1]), utime + stime, cutime + cstime


def proc_cpu_seconds(pid):
    """utime+stime of one process in seconds, None if it is gone."""
    st = read_stat(pid)
    return st[1] / CLK_TCK if st else None


def children_of(pid):
    """Direct children of pid (what `pgrep -P pid` prints)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = read_stat(int(entry))
            if st and st[0] == pid:
                out.append(int(entry))
    return sorted(out)


def process_tree(root_pid):
    """root_pid and all its descendants, from the ppid of every /proc/*/stat."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = read_stat(int(entry))
            if st:
                children.setdefault(st[0], []).append(int(entry))
    tree, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def tree_cpu_seconds(root_pid):
    """CPU of a process tree: utime+stime of every live member, plus cutime+cstime
    of the root (its reaped children: a worker that exited between two readings
    still counts once the master has reaped it)."""
    total = 0
    for pid in process_tree(root_pid):
        st = read_stat(pid)
        if st:
            total += st[1] + (st[2] if pid == root_pid else 0)
    return total / CLK_TCK


# --- CPU of everything else (is the run disturbed?) ---


def stat_with_start(pid):
    """(ppid, utime+stime+cutime+cstime in ticks, start time) of a process, or None if it is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()  # the command name may contain spaces and parentheses
    return int(fields[1]), sum(int(x) for x in fields[11:15]), int(fields[19])


def steal_seconds():
    """CPU time the hypervisor gave to others (all CPUs), from /proc/stat."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return int(fields[8]) / CLK_TCK


class OtherLoad:
    """CPU used during a run by processes that are not part of the benchmark
    (another program, a test suite), plus steal: a disturbed run shows here.

    Per process, like the poolers' figure: a process that exited counts through
    the cutime of the parent that reaped it. Kernel threads are left out
    (ksoftirqd does the benchmark's own loopback networking)."""

    def __init__(self, exclude_roots):
        self.exclude_roots = exclude_roots  # () -> pids whose trees are the benchmark's
        self.before = self._snapshot()
        self.steal = steal_seconds()

    def _snapshot(self):
        procs = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                st = stat_with_start(int(entry))
                if st and st[0] != 2 and int(entry) != 2:  # kthreadd and its kernel threads
                    procs[int(entry)] = st
        for root in self.exclude_roots():
            for pid in process_tree(root):
                procs.pop(pid, None)
        return procs

    def seconds(self):
        ticks = 0
        for pid, (_, total, start) in self._snapshot().items():
            old = self.before.get(pid)
            ticks += total - old[1] if old and old[2] == start else total
        return ticks / CLK_TCK + steal_seconds() - self.steal


# --- PostgreSQL ---


class Postgres:
    def __init__(self, bindir, run_as, tmp, max_connections=200):
        self.bindir = Path(bindir)
        self.run_as = run_as
        self.tmp = tmp
        self.datadir = tmp / "pgdata"
        self.logfile = tmp / "postgresql.log"
        self.port = free_port()
        self.max_connections = max_connections
        self.started = False

    def version(self):
        out = subprocess.run([str(self.bindir / "postgres"), "--version"], capture_output=True, text=True)
        return out.stdout.strip()

    def _pg(self, args, timeout):
        return subprocess.run(args, env=child_env(), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout, cwd=self.tmp, **self.run_as.popen_kwargs())

    def start(self):
        r = self._pg([str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", "postgres",
                      "--auth=trust", "-E", "UTF8", "--locale=C", "--no-instructions"], timeout=120)
        if r.returncode != 0:
            raise BenchError(f"initdb failed:\n{r.stdout}{r.stderr}")
        with open(self.datadir / "postgresql.conf", "a") as f:
            f.write("\n# scripts/bench\n"
                    "listen_addresses = '127.0.0.1'\n"
                    f"port = {self.port}\n"
                    f"unix_socket_directories = '{self.tmp}'\n"
                    f"max_connections = {self.max_connections}\n"
                    "fsync = off\n"
                    "synchronous_commit = off\n"
                    "full_page_writes = off\n")
        self.started = True  # from here on, cleanup tries to stop it
        r = self._pg([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-l", str(self.logfile),
                      "-w", "-t", str(START_TIMEOUT), "start"], timeout=START_TIMEOUT + 10)
        if r.returncode != 0:
            raise BenchError(f"PostgreSQL did not start:\n{r.stderr}\n{tail(self.logfile)}")

    def stop(self):
        if not self.started:
            return
        self.started = False
        try:
            self._pg([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "immediate", "-w",
                      "-t", "30", "stop"], timeout=40)
        except subprocess.TimeoutExpired:
            pass
        # whatever is left (pg_ctl failed or timed out): SIGKILL the postmaster's tree
        try:
            pid = int((self.datadir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return
        for p in reversed(process_tree(pid)):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


# --- poolers ---


def binary_version(binary):
    """First line of `binary --version`, marked when its build checks invariants."""
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
    version = out.stdout.splitlines()[0].strip() if out.stdout else "?"
    return version + " (built with --enable-cassert: not a release build)" if cassert_build(binary) else version


def cassert_build(binary):
    """Whether the binary's build directory was configured with --enable-cassert (scripts/test's build is):
    its invariant checks cost instructions, so benchmark a build without it."""
    status = pathlib.Path(binary).resolve().parent / "config.status"
    if not status.exists():
        return False
    out = subprocess.run([str(status), "--config"], capture_output=True, text=True)
    return "--enable-cassert" in out.stdout


class Pooler:
    """One pgbouncer (ours or the system's) with its own directory, ini and port.

    `settings` are extra [pgbouncer] lines (name -> value); they can be changed
    later with reload(). The user pgbouncer is the admin console's (trust).
    `wrapper` is a command prefix that runs the pooler in the same process
    (valgrind), so the pid we start is still the pooler's."""

    BASE = {
        "listen_addr": "127.0.0.1",
        "auth_type": "trust",
        "pool_mode": "session",
        "default_pool_size": "20",
        "max_client_conn": "500",
        "admin_users": "pgbouncer",
        "log_connections": "0",
        "log_disconnections": "0",
        "log_pooler_errors": "1",
    }

    def __init__(self, name, binary, run_as, tmp, pg, settings=None, wrapper=()):
        self.name = name
        self.binary = Path(binary)
        self.wrapper = list(wrapper)
        self.run_as = run_as
        self.pg = pg
        self.dir = tmp / name
        self.port = free_port()
        self.ini = self.dir / "pgbouncer.ini"
        self.logfile = self.dir / "pgbouncer.log"
        self.pidfile = self.dir / "pgbouncer.pid"
        self.proc = None
        self.pid = None
        self.settings = dict(settings or {})
        self.dir.mkdir()
        run_as.own(self.dir)
        run_as.write(self.dir / "userlist.txt", '"postgres" ""\n"pgbouncer" ""\n', mode=0o600)
        self.write_ini()

    def write_ini(self):
        s = dict(self.BASE)
        s.update({"listen_port": str(self.port), "unix_socket_dir": str(self.dir),
                  "auth_file": str(self.dir / "userlist.txt"), "logfile": str(self.logfile),
                  "pidfile": str(self.pidfile)})
        s.update(self.settings)
        body = "".join(f"{k} = {v}\n" for k, v in s.items())
        tmp = self.dir / "pgbouncer.ini.new"
        self.run_as.write(tmp, f"[databases]\npostgres = host=127.0.0.1 port={self.pg.port} dbname=postgres\n"
                               f"[pgbouncer]\n{body}")
        os.replace(tmp, self.ini)

    def version(self):
        return binary_version(self.binary)

    def start(self):
        with open(self.dir / "stdout.txt", "ab") as out, open(self.dir / "stderr.txt", "ab") as err:
            # foreground, in its own session: our Ctrl-C does not reach it, we stop it
            self.proc = subprocess.Popen(self.wrapper + [str(self.binary), str(self.ini)], cwd=self.dir,
                                         env=child_env(),
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                         start_new_session=True, **self.run_as.popen_kwargs())
        self.pid = self.proc.pid

        def up():
            if self.proc.poll() is not None:
                raise BenchError(f"{self.name} pooler exited with {self.proc.returncode}:\n"
                                 f"{tail(self.dir / 'stderr.txt')}\n{tail(self.logfile)}")
            # the pidfile may exist still empty (slow under valgrind)
            return self.pidfile.exists() and self.pidfile.read_text().strip() != "" and port_listening(self.port)

        wait_for(up, f"{self.name} pooler to listen on port {self.port}", START_TIMEOUT)
        pid = int(self.pidfile.read_text().split()[0])
        if pid != self.pid:
            raise BenchError(f"{self.name} pooler: pidfile says {pid}, we started {self.pid}")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def reload(self, **settings):
        """Rewrite the ini with these settings changed and send SIGHUP."""
        self.settings.update({k: str(v) for k, v in settings.items()})
        self.write_ini()
        os.kill(self.pid, signal.SIGHUP)

    def children(self):
        return children_of(self.pid)

    def cpu_seconds(self):
        return tree_cpu_seconds(self.pid)

    def log_lines(self):
        try:
            return self.logfile.read_text(errors="replace").splitlines()
        except OSError:
            return []

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGINT)  # safe shutdown in both versions
                self.proc.wait(timeout=STOP_TIMEOUT)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        self._kill_group()
        try:
            self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass

    def _kill_group(self):
        # the master if stuck, and any worker left behind (the group is the master's own session)
        if self.pid:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


LOG_TIME_RE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.(\d{3}) (\S+) \[(\d+)\] (\S+) (.*)$")


def parse_log_line(line):
    """(epoch seconds, pid, level, message) of a pgbouncer log line, or None."""
    m = LOG_TIME_RE.match(line)
    if not m:
        return None
    t = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
    return t, int(m.group(4)), m.group(5), m.group(6)


def make_certificate(tmp, run_as, key_type):
    """A self-signed server certificate (CN=localhost) and its key, for both poolers."""
    tls_dir = tmp / "tls"
    tls_dir.mkdir()
    newkey = ["-newkey", "rsa:2048"] if key_type == "rsa" else \
        ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]
    cert, key = tls_dir / "pooler.crt", tls_dir / "pooler.key"
    out = subprocess.run(["openssl", "req", "-x509", *newkey, "-nodes", "-keyout", str(key), "-out", str(cert),
                          "-days", "30", "-subj", "/CN=localhost",
                          "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise BenchError(f"openssl req failed:\n{out.stderr}")
    os.chmod(key, 0o600)
    for path in (tls_dir, cert, key):
        run_as.own(path)
    return cert, key


# --- pgbench ---


def pgbench_cmd(pg_bindir, script, port, seconds, clients, jobs, churn=True, rate=None, user="postgres",
                dbname="postgres", protocol="simple", transactions=None):
    """pgbench for `seconds` (-T), or for `transactions` per client (-t) when given."""
    length = ["-t", str(transactions)] if transactions else ["-T", str(seconds)]
    cmd = [str(Path(pg_bindir) / "pgbench"), "-n", "-M", protocol, "-f", str(script),
           "-c", str(clients), "-j", str(jobs), *length,
           "-h", "127.0.0.1", "-p", str(port), "-U", user]
    if churn:
        cmd.append("-C")
    if rate:
        cmd += ["-R", str(rate)]
    return cmd + [dbname]


def pgbench_start(cmd):
    return subprocess.Popen(cmd, env=child_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def pgbench_finish(proc, timeout):
    """Waits for a pgbench started with pgbench_start; returns
    (exit code, tps or None, transactions or None, aborted clients, stdout+stderr)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    # -C reports "(including reconnection times)", else "(without initial connection time)"
    tps = re.search(r"^tps = ([0-9.]+) \((?:without initial connection|including reconnection) times?\)",
                    out, re.M)
    xacts = re.search(r"^number of transactions actually processed: (\d+)", out, re.M)
    aborted = len(re.findall(r"client \d+ aborted", err))
    return (proc.returncode, float(tps.group(1)) if tps else None, int(xacts.group(1)) if xacts else None,
            aborted, out + err)


def pgbench(cmd, timeout):
    """Runs pgbench to the end; returns (tps, transactions); any failure is an error."""
    code, tps, xacts, aborted, text = pgbench_finish(pgbench_start(cmd), timeout)
    failed = re.search(r"^number of failed transactions: (\d+)", text, re.M)
    if code != 0 or tps is None or xacts is None or aborted or (failed and int(failed.group(1))):
        raise BenchError(f"pgbench failed (exit {code}): {' '.join(cmd)}\n{text}")
    return tps, xacts


# --- measured runs ---


class Result:
    def __init__(self, tps, xacts, cpu, other):
        self.tps = tps
        self.xacts = xacts
        self.cpu = cpu  # pooler CPU seconds during the run
        self.other = other  # CPU seconds of everything else (OtherLoad)

    @property
    def cpu_per_1000(self):
        return self.cpu / self.xacts * 1000 if self.xacts else float("nan")


def postmaster_pid(pg):
    try:
        return int((pg.datadir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def measure_pgbench(cmd, pooler, pg, timeout):
    """One measured pgbench run through `pooler`: its throughput, the pooler's
    CPU, and the CPU anything else took meanwhile (pgbench and the poolers must
    be our children, PostgreSQL is left out through its postmaster)."""
    other = OtherLoad(lambda: [os.getpid(), postmaster_pid(pg)])
    before = pooler.cpu_seconds()
    tps, xacts = pgbench(cmd, timeout)
    after = pooler.cpu_seconds()
    return Result(tps, xacts, after - before, other.seconds())


def ratio(a, b):
    return a / b if b else float("nan")


def plural(n, word):
    return f"{n} {word}{'' if n == 1 else 'es' if word.endswith('s') else 's'}"


# --- syscalls ---


# Syscalls a pooler is expected to make; the rest is reported as "other".
# (perf's syscalls:sys_enter_* wildcard works too, but takes ~15 s per pid to tear down.)
TRACED_SYSCALLS = ("recvfrom", "sendto", "recvmsg", "sendmsg", "read", "write", "readv", "writev",
                   "epoll_wait", "epoll_pwait", "epoll_ctl", "accept", "accept4", "connect", "socket",
                   "close", "shutdown", "setsockopt", "getsockopt", "getsockname", "getpeername", "fcntl",
                   "ioctl", "getpid", "getrandom", "clock_gettime", "gettimeofday", "io_uring_enter")


def perf_syscalls(pids, out_path, run):
    """Syscalls made by the processes `pids` while run() runs (run returns its
    number of transactions), counted with perf's syscall tracepoints (far less
    intrusive than strace's ptrace). Returns (transactions, {syscall: count}),
    the dict with "total" and "other" (syscalls not in TRACED_SYSCALLS)."""
    perf = shutil.which("perf")
    if not perf:
        raise BenchError("counting syscalls needs perf (Debian package linux-perf)")
    events = ["raw_syscalls:sys_enter"] + [f"syscalls:sys_enter_{n}" for n in TRACED_SYSCALLS]
    perf_proc = subprocess.Popen([perf, "stat", "-x", ",", "-o", str(out_path), "-e", ",".join(events),
                                  "-p", ",".join(str(p) for p in pids)], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        time.sleep(1)  # let perf attach its counters
        if perf_proc.poll() is not None:
            raise BenchError(f"perf stat failed: {perf_proc.stderr.read().decode(errors='replace')}")
        xacts = run()
    finally:
        if perf_proc.poll() is None:
            perf_proc.send_signal(signal.SIGINT)
        try:
            perf_proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            perf_proc.kill()
            perf_proc.wait()
    counts = {}
    for line in Path(out_path).read_text().splitlines():
        parts = line.split(",")
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        if parts[2] == "raw_syscalls:sys_enter":
            counts["total"] = int(parts[0])
        elif parts[2].startswith("syscalls:sys_enter_"):
            counts[parts[2][len("syscalls:sys_enter_"):]] = int(parts[0])
    if "total" not in counts:
        raise BenchError(f"perf counted nothing (see {out_path})")
    counts["other"] = counts["total"] - sum(v for k, v in counts.items() if k != "total")
    return xacts, counts


# --- instructions under callgrind ---


def callgrind_dump(pooler, run_as, seen):
    """Dumps every process of the pooler tree (callgrind zeroes its counters at each
    dump); returns the user-space instructions (Ir) since the previous dump."""
    control = shutil.which("callgrind_control")
    for pid in process_tree(pooler.pid):
        r = subprocess.run([control, "-d", str(pid)], capture_output=True, text=True, timeout=120,
                           **run_as.popen_kwargs())
        if r.returncode != 0:
            raise BenchError(f"callgrind_control -d {pid} failed: {r.stdout}{r.stderr}")
    total = 0
    for f in sorted(set(pooler.dir.glob("callgrind.out.*.*")) - seen):
        seen.add(f)
        m = re.search(r"^(?:summary|totals):\s+(\d+)", f.read_text(errors="replace"), re.M)
        if not m:
            raise BenchError(f"no summary line in {f}")
        total += int(m.group(1))
    return total


ALLOC_FUNCTIONS = ("malloc", "calloc", "realloc", "free")


def callgrind_calls(files, names=ALLOC_FUNCTIONS):
    """Calls to each of `names` (the libc functions, from any caller: the pooler's
    own and its libraries', e.g. OpenSSL's CRYPTO_malloc) counted in callgrind dump
    files: {name: calls}."""
    counts = dict.fromkeys(names, 0)
    for f in files:
        ids, cfn = {}, None
        for line in f.read_text(errors="replace").splitlines():
            if line.startswith("cfn="):
                m = re.match(r"\((\d+)\)(?: (.*))?$", line[4:])
                if m:  # "(id) name" defines an id, "(id)" refers to one
                    cfn = ids.setdefault(m.group(1), m.group(2)) if m.group(2) else ids.get(m.group(1))
                else:
                    cfn = line[4:]
                cfn = cfn.split("'")[0] if cfn else cfn  # callgrind's "'2" marks a recursion level
            elif line.startswith("calls=") and cfn in counts:
                counts[cfn] += int(line[6:].split()[0])
    return counts


def callgrind_per_xact(name, binary, run_as, tmp, pg, settings, run, xacts, unit="transactions", forks=False,
                       allocs=None):
    """User-space instructions per transaction of a pooler started again under
    callgrind: run(pooler, n) runs n transactions per client and returns how many
    ran; after a warm-up run, (I2 - I1) / (x2 - x1) over a run of xacts[0] and one
    of xacts[1]. forks: the pooler forks a worker after start-up (ours). Strings are not compressed in the dumps, so that each dump (kept
    in tmp/NAME-callgrind) names its own functions. allocs: a dict to fill with the
    calls per transaction of each of ALLOC_FUNCTIONS, the same way."""
    valgrind = shutil.which("valgrind")
    if not valgrind or not shutil.which("callgrind_control"):
        raise BenchError("the instruction counts need valgrind (Debian package valgrind)")
    out = tmp / f"{name}-callgrind" / "callgrind.out.%p"
    p = Pooler(name + "-callgrind", binary, run_as, tmp, pg, settings,
               wrapper=[valgrind, "--tool=callgrind", "--trace-children=yes", "--compress-strings=no",
                        f"--callgrind-out-file={out}"])
    seen = set()
    try:
        p.start()
        if forks:
            wait_for(lambda: len(process_tree(p.pid)) > 1, "the worker under valgrind", 60)
        run(p, xacts[0])  # warm-up: server connections
        callgrind_dump(p, run_as, seen)
        x1 = run(p, xacts[0])
        before = set(seen)
        i1 = callgrind_dump(p, run_as, seen)
        c1 = callgrind_calls(seen - before)
        x2 = run(p, xacts[1])
        before = set(seen)
        i2 = callgrind_dump(p, run_as, seen)
        c2 = callgrind_calls(seen - before)
        log(f"  {name}: {i1} instructions over {x1} {unit}, {i2} over {x2}")
        if allocs is not None:
            allocs.update({f: (c2[f] - c1[f]) / (x2 - x1) for f in ALLOC_FUNCTIONS})
        return (i2 - i1) / (x2 - x1)
    finally:
        p.stop()


# --- where the kernel time goes ---


# (label, syscalls or kernel paths; each given as the names it may appear
# under in a call chain, as the entry point can be a tail call) whose samples
# with their callees make up the share. The shares overlap: the peer's receive
# path and its wakeup run inside our send.
KERNEL_SPLIT = (
    ("send", (("__x64_sys_sendto", "__sys_sendto"), ("__x64_sys_sendmsg", "__sys_sendmsg", "___sys_sendmsg"),
              ("__x64_sys_write", "ksys_write"), ("__x64_sys_writev", "do_writev"))),
    ("  peer's receive path", (("net_rx_action",),)),
    ("  peer's wakeup", (("sock_def_readable",),)),
    ("recv", (("__x64_sys_recvfrom", "__sys_recvfrom"), ("__x64_sys_recvmsg", "__sys_recvmsg", "___sys_recvmsg"),
              ("__x64_sys_read", "ksys_read"))),
    ("epoll_wait", (("__x64_sys_epoll_wait", "do_epoll_wait"), ("__x64_sys_epoll_pwait",))),
    ("epoll_ctl", (("__x64_sys_epoll_ctl", "do_epoll_ctl"),)),
    ("preempted", (("exit_to_user_mode_loop",),)),
)


def context_switches(pids):
    """(voluntary, involuntary) context switches of the live processes among pids."""
    vol = invol = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        vol += int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", text, re.M).group(1))
        invol += int(re.search(r"^nonvoluntary_ctxt_switches:\s+(\d+)", text, re.M).group(1))
    return vol, invol


def user_system_seconds(pids):
    """(utime, stime) of the live processes among pids, in seconds."""
    user = system = 0
    for pid in pids:
        try:
            data = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = data[data.rindex(")") + 2:].split()
        user += int(fields[11])
        system += int(fields[12])
    return user / CLK_TCK, system / CLK_TCK


# A login's own kernel paths, added to KERNEL_SPLIT for the churn benchmarks
# (close's work runs in task_work at the return to user space).
LOGIN_SPLIT = KERNEL_SPLIT + (
    ("accept", (("__x64_sys_accept4", "__sys_accept4", "__x64_sys_accept", "do_accept"),)),
    ("close", (("__x64_sys_close", "close_fd"), ("task_work_run",))),
    ("getrandom, getpid", (("__x64_sys_getrandom",), ("__x64_sys_getpid",))),
)


def perf_kernel_split(pids, out_path, run, split=KERNEL_SPLIT):
    """Where the processes `pids` spend their CPU while run() runs (run returns
    its number of transactions): `perf record -e cpu-clock -g` (a software
    clock, so it works in a VM without a PMU), reduced to the shares of
    `split` (KERNEL_SPLIT by default) and of user space, plus utime/stime and context switches per
    transaction from /proc. Returns (transactions, {label: value})."""
    perf = shutil.which("perf")
    if not perf:
        raise BenchError("the kernel split needs perf (Debian package linux-perf)")
    perf_proc = subprocess.Popen([perf, "record", "-q", "-e", "cpu-clock", "-F", "2000", "-g", "-o",
                                  str(out_path), "-p", ",".join(str(p) for p in pids)],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 start_new_session=True)
    try:
        time.sleep(1)  # let perf attach
        if perf_proc.poll() is not None:
            raise BenchError(f"perf record failed: {perf_proc.stderr.read().decode(errors='replace')}")
        cs0, t0 = context_switches(pids), user_system_seconds(pids)
        xacts = run()
        cs1, t1 = context_switches(pids), user_system_seconds(pids)
    finally:
        if perf_proc.poll() is None:
            perf_proc.send_signal(signal.SIGINT)
        try:
            perf_proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            perf_proc.kill()
            perf_proc.wait()
    report = subprocess.run([perf, "report", "-i", str(out_path), "--children", "--sort", "sym", "--stdio",
                             "-g", "none"], capture_output=True, text=True, timeout=300).stdout
    children, user = {}, 0.0
    for line in report.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+([\d.]+)%\s+\[([.k])\]\s+(\S+)", line)
        if m:
            children[m.group(4)] = float(m.group(1))
            if m.group(3) == ".":
                user += float(m.group(2))
    if not children:
        raise BenchError(f"perf recorded no samples (see {out_path})")
    x = max(xacts, 1)
    out = {label: sum(max(children.get(f, 0.0) for f in names) for names in paths)
           for label, paths in split}
    out["user space"] = user
    out["utime us/xact"] = (t1[0] - t0[0]) / x * 1e6
    out["stime us/xact"] = (t1[1] - t0[1]) / x * 1e6
    out["voluntary cs/xact"] = (cs1[0] - cs0[0]) / x
    out["involuntary cs/xact"] = (cs1[1] - cs0[1]) / x
    return xacts, out


# --- a minimal PostgreSQL wire-protocol client ---


PROTOCOL_V3 = 196608


def startup_packet(user, database):
    body = struct.pack("!I", PROTOCOL_V3)
    for k, v in (("user", user), ("database", database)):
        body += k.encode() + b"\0" + v.encode() + b"\0"
    body += b"\0"
    return struct.pack("!I", len(body) + 4) + body


def query_packet(sql):
    body = sql.encode() + b"\0"
    return b"Q" + struct.pack("!I", len(body) + 4) + body


TERMINATE = b"X" + struct.pack("!I", 4)


class PgServerError(Exception):
    def __init__(self, fields):
        self.fields = fields
        super().__init__(f"{fields.get('S', 'ERROR')} {fields.get('C', '?')}: {fields.get('M', '')}")


def parse_error(body):
    fields = {}
    for part in body.split(b"\0"):
        if part:
            fields[chr(part[0])] = part[1:].decode(errors="replace")
    return fields


class PgConn:
    """Just enough of the protocol for SELECT and SHOW: startup (trust), simple
    query, terminate. Raises OSError for socket trouble, PgServerError for an
    ErrorResponse."""

    def __init__(self, port, user="postgres", database="postgres", host="127.0.0.1", timeout=5.0):
        self.buf = bytearray()
        self.authenticated = False  # AuthenticationOk seen
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect((host, port))
            self.local_port = self.sock.getsockname()[1]
            self.sock.sendall(startup_packet(user, database))
            while True:
                t, body = self._message()
                if t == b"R":
                    code = struct.unpack("!I", body[:4])[0]
                    if code != 0:
                        raise PgServerError({"M": f"authentication method {code} not supported"})
                    self.authenticated = True
                elif t == b"Z":
                    return
        except BaseException:
            self.sock.close()
            raise

    def _message(self):
        while True:
            if len(self.buf) >= 5:
                n = struct.unpack("!I", self.buf[1:5])[0]
                if len(self.buf) >= n + 1:
                    t, body = bytes(self.buf[:1]), bytes(self.buf[5:n + 1])
                    del self.buf[:n + 1]
                    if t == b"E":
                        raise PgServerError(parse_error(body))
                    return t, body
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionResetError(errno.ECONNRESET, "EOF from the server")
            self.buf += data

    def query(self, sql):
        """Rows of the last result set (lists of str or None) and the column names."""
        self.sock.sendall(query_packet(sql))
        cols, rows, error = [], [], None
        while True:
            try:
                t, body = self._message()
            except PgServerError as e:
                error = e  # the ReadyForQuery follows
                continue
            if t == b"T":
                n = struct.unpack("!H", body[:2])[0]
                cols, rows, pos = [], [], 2
                for _ in range(n):
                    end = body.index(b"\0", pos)
                    cols.append(body[pos:end].decode())
                    pos = end + 1 + 18
            elif t == b"D":
                n = struct.unpack("!H", body[:2])[0]
                row, pos = [], 2
                for _ in range(n):
                    ln = struct.unpack("!i", body[pos:pos + 4])[0]
                    pos += 4
                    if ln < 0:
                        row.append(None)
                    else:
                        row.append(body[pos:pos + ln].decode())
                        pos += ln
                rows.append(row)
            elif t == b"Z":
                if error:
                    raise error
                return cols, rows

    def close(self):
        try:
            self.sock.sendall(TERMINATE)
        except OSError:
            pass
        self.sock.close()


class Admin:
    """The admin console (dbname=pgbouncer user=pgbouncer), reconnecting when
    the connection was lost (its worker drained or was killed)."""

    def __init__(self, port, timeout=5.0):
        self.port = port
        self.timeout = timeout
        self.conn = None

    def show(self, what):
        """SHOW <what> as a list of dicts."""
        for attempt in range(3):
            try:
                if self.conn is None:
                    self.conn = PgConn(self.port, "pgbouncer", "pgbouncer", timeout=self.timeout)
                cols, rows = self.conn.query(f"SHOW {what}")
                return [dict(zip(cols, r)) for r in rows]
            except (OSError, PgServerError):
                self.close()
                if attempt == 2:
                    raise
                time.sleep(0.05)

    def close(self):
        if self.conn:
            self.conn.close()
            self.conn = None


# one connection's life, for churn measurements: where it failed
STAGE_CONNECT = "connect"      # connect() itself: refused, timed out
STAGE_STARTUP = "startup"      # after connect, before AuthenticationOk
STAGE_INFLIGHT = "in-flight"   # after AuthenticationOk


def churn_once(port, timeout=5.0, sql="SELECT 1"):
    """One connection: startup, one query, terminate. Returns None on success,
    else (stage, kind, local port or 0)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    local_port, stage = 0, STAGE_CONNECT
    try:
        s.connect(("127.0.0.1", port))
        local_port = s.getsockname()[1]
        stage = STAGE_STARTUP
        s.sendall(startup_packet("postgres", "postgres"))
        buf = bytearray()
        want_ready = 1  # ReadyForQuery messages still to come: after startup, after the query
        sent_query = False
        while want_ready:
            if len(buf) >= 5:
                n = struct.unpack("!I", buf[1:5])[0]
                if len(buf) >= n + 1:
                    t = buf[0]
                    if t == ord("E"):
                        f = parse_error(bytes(buf[5:n + 1]))
                        return stage, f"error {f.get('C', '?')} {f.get('M', '')}", local_port
                    if t == ord("R"):
                        stage = STAGE_INFLIGHT
                    if t == ord("Z"):
                        want_ready -= 1
                        if not sent_query:
                            s.sendall(query_packet(sql))
                            sent_query = True
                            want_ready += 1
                    del buf[:n + 1]
                    continue
            data = s.recv(65536)
            if not data:
                return stage, "eof", local_port
            buf += data
        s.sendall(TERMINATE)
        return None
    except ConnectionRefusedError:
        return stage, "refused", local_port
    except ConnectionResetError:
        return stage, "reset", local_port
    except BrokenPipeError:
        return stage, "broken pipe", local_port
    except socket.timeout:
        return stage, "timeout", local_port
    except OSError as e:
        return stage, f"oserror {errno.errorcode.get(e.errno, e.errno)}", local_port
    finally:
        s.close()
