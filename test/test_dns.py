"""Server host names resolved asynchronously (c-ares), cached, shown in SHOW DNS_HOSTS."""

import os
import random
import socket
import struct
import threading
import time

import psycopg
import pytest

from conftest import wait_for
from helpers import backend_state


def test_host_name_resolves_and_is_cached(bouncer, pg):
    b = bouncer(databases={"bydns": f"host=localhost port={pg.port} dbname=postgres"},
                ini_overrides={"dns_max_ttl": 30})
    with b.connect(dbname="bydns") as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("postgres",)
    with b.admin() as admin:
        rows = admin.execute("SHOW DNS_HOSTS").fetchall()
        lists = dict(admin.execute("SHOW LISTS").fetchall())
    assert len(rows) == 1
    name, ttl, addrs = rows[0]
    assert name == "localhost"
    assert 0 < ttl <= 30
    assert "127.0.0.1:0" in addrs.split(",") or "[::1]:0" in addrs.split(",")  # PgBouncer's form
    assert lists["dns_names"] == 1


def test_unresolvable_host_fails_the_client(bouncer, pg):
    b = bouncer(databases={"nowhere": "host=no-such-host.invalid port=5432 dbname=postgres",
                           "postgres": pg.connstr("postgres")}, start=False)
    # a resolver nobody answers on: the test does not depend on the machine's DNS
    resolv = b.dir / "resolv.conf"
    b.run_as.write(resolv, "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    b.update(resolv_conf=str(resolv))
    b.write_ini()
    b.start()
    with pytest.raises(psycopg.OperationalError) as exc:
        b.connect(dbname="nowhere")
    assert 'could not resolve host "no-such-host.invalid"' in str(exc.value)
    b.wait_log(r'could not resolve host "no-such-host.invalid"')
    # the pooler is fine and other databases still work
    with b.connect() as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_host_list_disable_moves_on_after_a_failure(bouncer, pg):
    """load_balance_hosts=disable: a dead first host is left for the next one after it fails."""
    # PostgreSQL listens on 127.0.0.1 only, so 127.0.0.2 refuses the connection
    b = bouncer(databases={"pair": f"host=127.0.0.2,127.0.0.1 port={pg.port} dbname=postgres "
                                   f"load_balance_hosts=disable"},
                ini_overrides={"server_login_retry": 0.2})
    with b.connect(dbname="pair") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    with b.admin() as admin:
        servers = admin.execute("SHOW SERVERS").fetchall()
        dbs = {r[0]: r for r in admin.execute("SHOW DATABASES").fetchall()}
    assert [r[5] for r in servers] == ["127.0.0.1"]
    assert dbs["pair"][10] == "disable"
    b.wait_log(r"connect failed")


def test_name_answered_at_once_opens_one_server(bouncer, pg):
    """`localhost` is answered from /etc/hosts inside the lookup call itself:
    the launch that asked uses that answer, and the pool does not start a
    second connection meanwhile (one login in flight per pool)."""
    b = bouncer(databases={"bydns": f"host=localhost port={pg.port} dbname=postgres application_name=dns_once"},
                ini_overrides={"pool_mode": "transaction", "min_workers": 1, "max_workers": 1})
    with b.connect(dbname="bydns") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    with b.admin() as admin:
        servers = admin.execute("SHOW SERVERS").fetchall()
    assert len(servers) == 1, servers
    assert pg.sql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dns_once'") == [(1,)]


class FakeDns:
    """A UDP name server on a loopback address of its own, port 53 (c-ares takes no
    other port from a resolv.conf): A records from `zone`, NXDOMAIN for other names."""

    def __init__(self, zone):
        self.zone = zone
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for _ in range(20):
            self.addr = f"127.53.{random.randint(1, 254)}.{random.randint(1, 254)}"
            try:
                self.sock.bind((self.addr, 53))
                break
            except OSError:
                continue
        else:
            raise AssertionError("no loopback address free for port 53")
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while not self.stop.is_set():
            try:
                data, peer = self.sock.recvfrom(512)
            except socket.timeout:
                continue
            pos, labels = 12, []
            while data[pos]:
                labels.append(data[pos + 1:pos + 1 + data[pos]].decode())
                pos += 1 + data[pos]
            qtype = struct.unpack("!H", data[pos + 1:pos + 3])[0]
            pos += 5
            ips = self.zone.get(".".join(labels).lower())
            answers = [socket.inet_aton(ip) for ip in ips or ()] if qtype == 1 else []
            header = struct.pack("!HHHHHH", struct.unpack("!H", data[:2])[0], 0x8180 if ips else 0x8183, 1,
                                 len(answers), 0, 0)
            body = b"".join(b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 1, 4) + a for a in answers)
            self.sock.sendto(header + data[12:pos] + body, peer)

    def close(self):
        self.stop.set()
        self.thread.join()
        self.sock.close()


@pytest.fixture
def fake_dns():
    if os.geteuid() != 0:
        pytest.skip("binding port 53 needs root")
    servers = []

    def make(zone):
        servers.append(FakeDns(zone))
        return servers[-1]
    yield make
    for s in servers:
        s.close()


def test_server_of_an_address_gone_from_dns_is_closed(bouncer, pg, fake_dns):
    """A name that resolves to another address after dns_max_ttl (a failover
    that moved it): servers connected to the old address get close_needed and
    are closed once their client is done, as with PgBouncer, instead of
    serving on from the old address until server_lifetime."""
    zone = {"db.example.test": ["127.0.0.1"]}
    dns = fake_dns(zone)
    b = bouncer(databases={"moved": f"host=db.example.test port={pg.port} dbname=postgres"}, start=False,
                ini_overrides={"pool_mode": "transaction", "dns_max_ttl": 1, "query_wait_timeout": 2,
                               "min_workers": 1, "max_workers": 1})
    resolv = b.dir / "resolv.conf"
    b.run_as.write(resolv, f"nameserver {dns.addr}\noptions timeout:1 attempts:1\n")
    b.update(resolv_conf=str(resolv))
    b.write_ini()
    b.start()
    holder = b.connect(dbname="moved", autocommit=True)
    holder.execute("BEGIN")
    pid = holder.execute("SELECT pg_backend_pid()").fetchone()[0]
    zone["db.example.test"] = ["127.0.0.2"]  # PostgreSQL listens on 127.0.0.1 only: this one refuses
    time.sleep(1.5)  # the cached answer expires
    # a second client needs a server: the name is looked up again, and its new address refuses
    with b.connect(dbname="moved", autocommit=True) as second:
        with pytest.raises(psycopg.OperationalError):
            second.execute("SELECT 1")
    with b.admin() as admin:
        servers = admin.execute("SHOW SERVERS").fetchall()
        hosts = admin.execute("SHOW DNS_HOSTS").fetchall()
    assert [(r[5], r[13]) for r in servers] == [("127.0.0.1", 1)], servers
    assert [(r[0], r[2]) for r in hosts] == [("db.example.test", "127.0.0.2:0")], hosts
    holder.execute("COMMIT")  # released: closed, not put back in the pool
    wait_for(lambda: backend_state(pg, pid) is None, "the server of the old address to be closed")
    b.wait_log(r"closing because: server address no longer in DNS")
    holder.close()


def test_address_that_refuses_is_followed_by_the_next_at_once(bouncer, pg, fake_dns):
    """A name with two addresses, one of which refuses connections (as `localhost` with ::1 first on
    a Debian host whose PostgreSQL listens on 127.0.0.1 only): the server connection that got the
    refusing one is followed at once by one to the next address, as libpq would, so the clients
    never wait server_login_retry (15 s here, past their query_wait_timeout of 5 s)."""
    dns = fake_dns({"db.example.test": ["127.0.0.2", "127.0.0.1"]})  # PostgreSQL: 127.0.0.1 only
    b = bouncer(databases={"two": f"host=db.example.test port={pg.port} dbname=postgres"}, start=False,
                ini_overrides={"query_wait_timeout": 5, "server_login_retry": 15, "min_workers": 1,
                               "max_workers": 1})
    resolv = b.dir / "resolv.conf"
    b.run_as.write(resolv, f"nameserver {dns.addr}\noptions timeout:1 attempts:1\n")
    b.update(resolv_conf=str(resolv))
    b.write_ini()
    b.start()
    # session mode: each client holds a server of its own, so the connections go to both addresses
    clients = [b.connect(dbname="two", autocommit=True) for _ in range(3)]
    for c in clients:
        assert c.execute("SELECT 1").fetchone() == (1,)
    b.wait_log(r"connect failed: Connection refused")
    with b.admin() as admin:
        servers = admin.execute("SHOW SERVERS").fetchall()
    assert sorted(r[5] for r in servers) == ["127.0.0.1"] * 3, servers
    for c in clients:
        c.close()


def test_failed_lookup_is_cached_for_dns_nxdomain_ttl(bouncer, pg, fake_dns):
    """A name that did not resolve is not looked up again before
    dns_nxdomain_ttl: clients fail at once meanwhile; after it, the name
    (now in the zone) is found."""
    zone = {}
    dns = fake_dns(zone)
    b = bouncer(databases={"late": f"host=db.example.test port={pg.port} dbname=postgres"}, start=False,
                ini_overrides={"dns_nxdomain_ttl": 2, "server_login_retry": 0.1, "query_wait_timeout": 5})
    resolv = b.dir / "resolv.conf"
    b.run_as.write(resolv, f"nameserver {dns.addr}\noptions timeout:1 attempts:1\n")
    b.update(resolv_conf=str(resolv))
    b.write_ini()
    b.start()
    with pytest.raises(psycopg.OperationalError, match="could not resolve host"):
        b.connect(dbname="late")
    t0 = time.monotonic()
    zone["db.example.test"] = ["127.0.0.1"]
    with pytest.raises(psycopg.OperationalError, match="could not resolve host"):
        b.connect(dbname="late")  # the failure is still cached
    assert time.monotonic() - t0 < 1.5
    time.sleep(max(0.0, 2.3 - (time.monotonic() - t0)))
    with b.connect(dbname="late") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_dns_max_ttl_zero_with_a_name_answered_at_once(bouncer, pg):
    """dns_max_ttl = 0 caches nothing: an answer from /etc/hosts, expired as
    it arrives, is still the answer of the lookup that asked (the worker
    looked the name up again and again until its stack ran out)."""
    b = bouncer(databases={"bydns": f"host=localhost port={pg.port} dbname=postgres"},
                ini_overrides={"dns_max_ttl": 0, "query_wait_timeout": 5})
    for _ in range(2):
        with b.connect(dbname="bydns") as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    assert "terminated by signal" not in b.log_text()


def test_dns_max_ttl_zero_with_a_name_server(bouncer, pg, fake_dns):
    """dns_max_ttl = 0 and an answer that comes later: the pools woken by it
    use it, instead of asking the name server again until query_wait_timeout."""
    dns = fake_dns({"db.example.test": ["127.0.0.1"]})
    b = bouncer(databases={"nocache": f"host=db.example.test port={pg.port} dbname=postgres"}, start=False,
                ini_overrides={"dns_max_ttl": 0, "query_wait_timeout": 5, "pool_mode": "transaction"})
    resolv = b.dir / "resolv.conf"
    b.run_as.write(resolv, f"nameserver {dns.addr}\noptions timeout:1 attempts:1\n")
    b.update(resolv_conf=str(resolv))
    b.write_ini()
    b.start()
    with b.connect(dbname="nocache") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_unix_socket_host_that_is_not_there_with_no_login_retry(bouncer, pg):
    """connect() to a unix socket that is not there fails inside the launch
    itself; with server_login_retry = 0 its close launched the next attempt
    from there, recursively, until the worker's stack ran out. Now the
    janitor retries and the client waits for query_wait_timeout."""
    b = bouncer(databases={"nosock": f"host=/nonexistent-dir port={pg.port} dbname=postgres",
                           "postgres": pg.connstr("postgres")},
                ini_overrides={"server_login_retry": 0, "query_wait_timeout": 2})
    with pytest.raises(psycopg.OperationalError, match="query_wait_timeout"):
        b.connect(dbname="nosock")
    b.wait_log(r"nosock/postgres@unix:\d+ connect failed: No such file or directory")
    assert "terminated by signal" not in b.log_text()
    with b.connect() as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_host_list_disable_moves_on_after_a_connect_timeout(bouncer, pg):
    """load_balance_hosts=disable: a first host that takes the connection but
    never answers fails by server_connect_timeout, and that is a failure too:
    the next attempt goes to the next host (it stayed on the dead one until
    the client's query_wait_timeout)."""
    # PostgreSQL listens on 127.0.0.1 only: 127.0.0.2 is a host that accepts and never answers
    dead = socket.socket()
    dead.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    dead.bind(("127.0.0.2", pg.port))
    dead.listen(16)  # the kernel completes the handshakes; nobody reads
    try:
        b = bouncer(databases={"pair": f"host=127.0.0.2,127.0.0.1 port={pg.port} dbname=postgres "
                                       f"load_balance_hosts=disable"},
                    ini_overrides={"server_connect_timeout": 1, "server_login_retry": 0.2,
                                   "query_wait_timeout": 8})
        with b.connect(dbname="pair") as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        with b.admin() as admin:
            servers = admin.execute("SHOW SERVERS").fetchall()
        assert [r[5] for r in servers] == ["127.0.0.1"]
        b.wait_log(r"pair/postgres@127\.0\.0\.2:\d+ closing because: connect timeout")
    finally:
        dead.close()


def test_host_list_disable_moves_on_after_a_missing_unix_socket(bouncer, pg):
    """load_balance_hosts=disable: a unix socket that is not there fails in
    connect() itself; the next attempt goes to the next host of the list."""
    b = bouncer(databases={"pair": f"host=/nonexistent-dir,127.0.0.1 port={pg.port} dbname=postgres "
                                   f"load_balance_hosts=disable"},
                ini_overrides={"server_login_retry": 0.2, "query_wait_timeout": 8})
    with b.connect(dbname="pair") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    b.wait_log(r"pair/postgres@unix:\d+ connect failed: No such file or directory")
