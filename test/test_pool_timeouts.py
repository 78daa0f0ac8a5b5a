"""Pool maintenance and timeouts off the happy path (spec/config.md,
spec/behaviours.md §4, §11-14): health checks before reuse, unlimited
server lifetime, min_pool_size for forced users, host lists whose first
name does not resolve, the safe shutdown, query_timeout at login,
server_fast_close and pool_idle_timeout."""

import socket
import threading

import psycopg
import pytest

from conftest import free_port, wait_for
from test_bad_input import PgWire
from test_pooling import backend_state, pool_row, show


def test_server_lifetime_zero_means_no_limit(bouncer, pg):
    b = bouncer(ini_overrides={"server_lifetime": 0, "query_wait_timeout": 5})
    with b.connect(autocommit=True) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    with b.admin() as admin:
        row = {r["key"]: r["value"] for r in show(admin, "CONFIG")}
    assert row["server_lifetime"] == "0"
    # the same server serves the next client: nothing closed it
    for _ in range(3):
        with b.connect(autocommit=True) as conn:
            assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] == pid
    assert "server lifetime over" not in b.log_text()
