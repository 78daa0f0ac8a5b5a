"""Server host names resolved asynchronously (c-ares), cached, shown in SHOW DNS_HOSTS."""

import psycopg
import pytest


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
    assert "127.0.0.1" in addrs.split(",") or "::1" in addrs.split(",")
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
