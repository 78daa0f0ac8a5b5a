"""Test certificates and keys, made with the openssl command line at session start.

    files = TlsFiles.create(directory, run_as, users=["postgres", "alice"])

What is in it (all PEM; keys unencrypted, mode 0600, owned by the user the
servers run as, so pgbouncer and PostgreSQL can read them and libpq accepts them):

  ca_cert, ca_key            the test CA ("pgbouncer test CA")
  other_ca_cert              an unrelated CA that signed nothing we trust
  server_cert, server_key    CN=localhost, SAN DNS:localhost + IP:127.0.0.1, signed by the test CA
                             (used by pgbouncer towards clients and by the TLS PostgreSQL cluster)
  server2_cert, server2_key  a second pair like the first (a certificate renewal)
  expired_cert               like server_cert (same key: server_key), valid 2020-01-01 to 2020-01-02
  wrong_key                  a key that belongs to no certificate here
  client_cert(user), client_key(user)
                             CN=<user>, clientAuth, signed by the test CA
  foreign_client_cert, foreign_client_key
                             CN=postgres, signed by the other CA

Keys are EC P-256: quick to make, and every TLS library involved supports them.
"""

import os
import ssl
import subprocess
from pathlib import Path

SERVER_SAN = "DNS:localhost,IP:127.0.0.1"
EXPIRED_START = "20200101000000Z"
EXPIRED_END = "20200102000000Z"


class TlsFiles:
    def __init__(self, directory):
        self.dir = Path(directory)

    # --- paths ---

    def path(self, name):
        return self.dir / name

    @property
    def ca_cert(self):
        return self.path("ca.crt")

    @property
    def ca_key(self):
        return self.path("ca.key")

    @property
    def other_ca_cert(self):
        return self.path("other-ca.crt")

    @property
    def server_cert(self):
        return self.path("server.crt")

    @property
    def server_key(self):
        return self.path("server.key")

    @property
    def server2_cert(self):
        return self.path("server2.crt")

    @property
    def server2_key(self):
        return self.path("server2.key")

    @property
    def expired_cert(self):
        return self.path("expired.crt")

    @property
    def wrong_key(self):
        return self.path("wrong.key")

    def client_cert(self, user):
        return self.path(f"client-{user}.crt")

    def client_key(self, user):
        return self.path(f"client-{user}.key")

    @property
    def foreign_client_cert(self):
        return self.path("foreign-client.crt")

    @property
    def foreign_client_key(self):
        return self.path("foreign-client.key")

    @staticmethod
    def der(cert_path):
        """The DER bytes of a PEM certificate (what ssl.getpeercert(binary_form=True) returns)."""
        return ssl.PEM_cert_to_DER_cert(Path(cert_path).read_text())

    # --- making them ---

    def _openssl(self, *args):
        out = subprocess.run(["openssl", *map(str, args)], cwd=self.dir, capture_output=True, text=True,
                             timeout=60)
        if out.returncode != 0:
            raise AssertionError(f"openssl {' '.join(map(str, args))} failed ({out.returncode}):\n"
                                 f"{out.stdout}{out.stderr}")

    def _key(self, path):
        self._openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path)

    def _ca(self, name, subject):
        self._key(self.path(f"{name}.key"))
        self._openssl("req", "-x509", "-new", "-key", f"{name}.key", "-out", f"{name}.crt", "-days", "3650",
                      "-subj", subject, "-addext", "basicConstraints=critical,CA:TRUE",
                      "-addext", "keyUsage=critical,keyCertSign,cRLSign")

    def _ext(self, name, lines):
        path = self.path(f"{name}.ext")
        path.write_text("".join(line + "\n" for line in lines))
        return path

    def _csr(self, key, subject, csr):
        self._openssl("req", "-new", "-key", key, "-subj", subject, "-out", csr)

    def _sign(self, csr, cert, ext, ca="ca", days=825):
        self._openssl("x509", "-req", "-in", csr, "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
                      "-CAcreateserial", "-days", days, "-extfile", ext, "-out", cert)

    def _sign_expired(self, csr, cert, ext):
        """`openssl x509` cannot backdate; `openssl ca` takes explicit dates."""
        (self.dir / "ca-db").mkdir(exist_ok=True)
        (self.dir / "ca-db" / "index.txt").write_text("")
        (self.dir / "ca-db" / "serial").write_text("1000\n")
        conf = self.path("ca-db.cnf")
        conf.write_text(
            "[ca]\ndefault_ca = test_ca\n"
            "[test_ca]\n"
            f"database = {self.dir / 'ca-db' / 'index.txt'}\n"
            f"new_certs_dir = {self.dir / 'ca-db'}\n"
            f"serial = {self.dir / 'ca-db' / 'serial'}\n"
            "default_md = sha256\npolicy = any_name\nunique_subject = no\n"
            "[any_name]\ncommonName = supplied\n")
        self._openssl("ca", "-batch", "-notext", "-config", conf, "-cert", "ca.crt", "-keyfile", "ca.key",
                      "-in", csr, "-out", cert, "-startdate", EXPIRED_START, "-enddate", EXPIRED_END,
                      "-extfile", ext)

    @classmethod
    def create(cls, directory, run_as, users=("postgres",)):
        t = cls(directory)
        t.dir.mkdir(parents=True, exist_ok=True)
        t._ca("ca", "/CN=pgbouncer test CA")
        t._ca("other-ca", "/CN=unrelated test CA")

        server_ext = t._ext("server", ["basicConstraints=CA:FALSE", f"subjectAltName={SERVER_SAN}",
                                       "keyUsage=critical,digitalSignature,keyEncipherment",
                                       "extendedKeyUsage=serverAuth"])
        client_ext = t._ext("client", ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature",
                                       "extendedKeyUsage=clientAuth"])
        for name in ("server", "server2"):
            t._key(t.path(f"{name}.key"))
            t._csr(f"{name}.key", "/CN=localhost", f"{name}.csr")
            t._sign(f"{name}.csr", f"{name}.crt", server_ext)
        t._sign_expired("server.csr", "expired.crt", server_ext)
        t._key(t.wrong_key)
        for user in users:
            t._key(t.client_key(user))
            t._csr(t.client_key(user), f"/CN={user}", f"client-{user}.csr")
            t._sign(f"client-{user}.csr", t.client_cert(user), client_ext)
        t._key(t.foreign_client_key)
        t._csr(t.foreign_client_key, "/CN=postgres", "foreign-client.csr")
        t._sign("foreign-client.csr", t.foreign_client_cert, client_ext, ca="other-ca")

        for path in [t.dir, *t.dir.rglob("*")]:
            run_as.own(path)
            if path.is_dir():
                os.chmod(path, 0o755)
            else:
                os.chmod(path, 0o600 if path.suffix == ".key" else 0o644)
        return t

    def copy(self, src, dst_dir, name=None, run_as=None):
        """A copy of one file (same mode) in dst_dir, for tests that change or break files."""
        dst = Path(dst_dir) / (name or Path(src).name)
        dst.write_bytes(Path(src).read_bytes())
        os.chmod(dst, 0o600 if dst.suffix == ".key" else 0o644)
        if run_as is not None:
            run_as.own(dst)
        return dst
