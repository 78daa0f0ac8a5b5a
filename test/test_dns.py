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
