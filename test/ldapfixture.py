"""A throwaway OpenLDAP directory for the LDAP tests (test_ldap.py), made once per session.

    directory = ldap_server  # the session fixture below (import it into a test module)

It runs Debian's slapd as the unprivileged test user with a slapd.conf of
its own in the session directory (never the system's configuration), on
two private ports of 127.0.0.1: plain LDAP (which also offers StartTLS)
and LDAPS, with the certificate of test/tlsfiles.py (CN=localhost, SAN
127.0.0.1, signed by the test CA). The tree:

  dc=example,dc=net
    cn=reader            a service account (password READER_PASSWORD) for search+bind
    ou=people
      uid=alice          mail alice@example.net, password USERS["alice"]
      uid=bob            mail bob@example.net, password USERS["bob"]
      uid=carol, uid=dave   both mail shared@example.net (a search that finds two entries)

Access: anonymous clients may only bind; the reader and any bound user may
read. So a search+bind needs ldapbinddn: a search without it finds nothing.

A pooler trusts the test CA through LDAPTLS_CACERT (directory.env()),
libldap's own way to name a CA file, as ldap.conf's TLS_CACERT would.
directory.hung() stops slapd (SIGSTOP) for a `with` block: its sockets
still accept connections, but nothing answers.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import DEADLINE, child_env, free_port, wait_for

SLAPD = "/usr/sbin/slapd"
SLAPADD = "/usr/sbin/slapadd"
LDAPWHOAMI = "/usr/bin/ldapwhoami"
SCHEMAS = Path("/etc/ldap/schema")
MODULES = Path("/usr/lib/ldap")

BASE = "dc=example,dc=net"
PEOPLE = f"ou=people,{BASE}"
READER = f"cn=reader,{BASE}"
READER_PASSWORD = "reader pw 7"
USERS = {"alice": "alice pw 1", "bob": "bob pw 2", "carol": "carol pw 3", "dave": "dave pw 4"}
MAILS = {"alice": "alice@example.net", "bob": "bob@example.net", "carol": "shared@example.net",
         "dave": "shared@example.net"}


def build_has_ldap(binary):
    """Whether this pgbouncer was built with LDAP: one built without it (configure --without-ldap, or
    no libldap found) says so when it loads auth_type = ldap. The probe's listen_port = 0 makes any
    build stop at the configuration."""
    with tempfile.TemporaryDirectory() as tmp:
        ini = Path(tmp) / "probe.ini"
        ini.write_text("[pgbouncer]\nauth_type = ldap\nlisten_port = 0\n[databases]\n")
        out = subprocess.run([str(binary), str(ini)], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                             env=child_env(), timeout=DEADLINE)
    assert out.returncode != 0, f"the probe configuration loaded:\n{out.stdout}{out.stderr}"
    return "built without libldap" not in out.stdout + out.stderr


def _ldif():
    entries = [
        f"dn: {BASE}\nobjectClass: dcObject\nobjectClass: organization\ndc: example\no: Example\n",
        f"dn: {PEOPLE}\nobjectClass: organizationalUnit\nou: people\n",
        f"dn: {READER}\nobjectClass: simpleSecurityObject\nobjectClass: organizationalRole\ncn: reader\n"
        f"userPassword: {READER_PASSWORD}\n",
    ]
    for uid, password in USERS.items():
        entries.append(f"dn: uid={uid},{PEOPLE}\nobjectClass: inetOrgPerson\nuid: {uid}\ncn: {uid.title()}\n"
                       f"sn: {uid.title()}\nmail: {MAILS[uid]}\nuserPassword: {password}\n")
    return "\n".join(entries)


class Directory:
    """One slapd: host, port (ldap://), ldaps_port (ldaps://), ca (the CA file that signed its certificate)."""

    host = "127.0.0.1"

    def __init__(self, run_as, base, tls_files):
        self.run_as = run_as
        self.dir = run_as.mkdir("slapd-", base)
        self.port = free_port()
        self.ldaps_port = free_port()
        self.ca = tls_files.ca_cert
        self.tls_files = tls_files
        self.proc = None
        self.log = self.dir / "slapd.log"

    def env(self):
        """Environment for a pooler that must trust the directory's certificate."""
        return {"LDAPTLS_CACERT": str(self.ca)}

    @property
    def url(self):
        return f"ldap://{self.host}:{self.port}"

    @property
    def ldaps_url(self):
        return f"ldaps://{self.host}:{self.ldaps_port}"

    def _conf(self):
        schemas = "".join(f"include {SCHEMAS / name}.schema\n" for name in ("core", "cosine", "inetorgperson"))
        return (
            f"{schemas}"
            f"pidfile {self.dir / 'slapd.pid'}\n"
            f"argsfile {self.dir / 'slapd.args'}\n"
            f"modulepath {MODULES}\n"
            "moduleload back_mdb\n"
            f"TLSCACertificateFile {self.tls_files.ca_cert}\n"
            f"TLSCertificateFile {self.tls_files.server_cert}\n"
            f"TLSCertificateKeyFile {self.tls_files.server_key}\n"
            "database mdb\n"
            "maxsize 10485760\n"
            f'suffix "{BASE}"\n'
            f'rootdn "cn=admin,{BASE}"\n'
            f"directory {self.dir / 'db'}\n"
            "access to attrs=userPassword by anonymous auth by * none\n"
            f'access to * by dn.exact="{READER}" read by users read by anonymous auth by * none\n'
        )

    def _run(self, args, **kw):
        out = subprocess.run(args, cwd=self.dir, env=child_env(), capture_output=True, text=True,
                             timeout=DEADLINE, **self.run_as.popen_kwargs(), **kw)
        if out.returncode != 0:
            raise AssertionError(f"{args[0]} failed ({out.returncode}):\n{out.stdout}{out.stderr}")
        return out

    def whoami(self, url, dn, password, starttls=False):
        """ldapwhoami against the directory: the DN it answers, or raises."""
        args = [LDAPWHOAMI, "-x", "-H", url, "-D", dn, "-w", password, "-o", "nettimeout=5"]
        if starttls:
            args.append("-ZZ")
        env = {**child_env(), **self.env()}
        out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=DEADLINE)
        if out.returncode != 0:
            raise AssertionError(f"ldapwhoami {url} failed ({out.returncode}): {out.stderr.strip()}")
        return out.stdout.strip()

    def start(self):
        conf = self.run_as.write(self.dir / "slapd.conf", self._conf())
        (self.dir / "db").mkdir()
        self.run_as.own(self.dir / "db")
        ldif = self.run_as.write(self.dir / "tree.ldif", _ldif())
        self._run([SLAPADD, "-f", str(conf), "-l", str(ldif)])
        log = open(self.log, "ab")
        # -d 0: in the foreground (so that this process is slapd itself), no debug output
        self.proc = subprocess.Popen([SLAPD, "-f", str(conf), "-h", f"{self.url}/ {self.ldaps_url}/", "-d", "0"],
                                     cwd=self.dir, env=child_env(), stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     **self.run_as.popen_kwargs())
        log.close()

        def up():
            if self.proc.poll() is not None:
                raise AssertionError(f"slapd exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                self.whoami(self.url, READER, READER_PASSWORD)
                return True
            except AssertionError:
                return False

        wait_for(up, "slapd to answer a bind", interval=0.1)
        # the TLS set-up works too, or every TLS test would fail for the same reason
        self.whoami(self.ldaps_url, f"uid=alice,{PEOPLE}", USERS["alice"])
        return self

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    @contextlib.contextmanager
    def hung(self):
        """slapd stopped (SIGSTOP) for the block, and running again after it whatever happens."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        try:
            yield self
        finally:
            os.kill(self.proc.pid, signal.SIGCONT)


@pytest.fixture(scope="session")
def ldap_server(run_as, session_dir, tls_files, pgbouncer_bin):
    """The session's directory (Directory above); skips where slapd or a pooler with LDAP is missing."""
    if not build_has_ldap(pgbouncer_bin):
        pytest.skip("this pgbouncer was built without LDAP")
    for tool in (SLAPD, SLAPADD, LDAPWHOAMI):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed (Debian packages slapd and ldap-utils)")
    directory = Directory(run_as, session_dir, tls_files)
    try:
        directory.start()
        yield directory
    finally:
        directory.stop()
