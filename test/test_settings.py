"""
The ranges of the [pgbouncer] settings, from the one parameter table
(src/common/config.c): a value out of range, or one that does not parse, is
refused with a message naming the setting and what it accepts, the same way
at start (fatal), on RELOAD (the running value stays) and by the console's
SET (SET failed, the running value stays). A sample of each type: ints,
times, reals, enums, bools. Every bound is in test/unit/test_config.c.
"""
import re

import psycopg
import pytest

from helpers import console, row

# (setting, value, message). Values that parse but lie outside the range are
# refused by the whole-file check ("FILE: message"); values that do not parse
# by the line ("FILE:LINE: message").
OUT_OF_RANGE = [
    ("default_pool_size", "-1", "default_pool_size must be at least 0 (got -1)"),
    ("max_client_conn", "-10", "max_client_conn must be at least 0 (got -10)"),
    ("scram_iterations", "0", "scram_iterations must be at least 1 (got 0)"),
    ("query_timeout", "3000000000", "query_timeout must be between 0 and 2147483647 seconds (got 3000000000)"),
    ("server_lifetime", "2147483647.5",
     "server_lifetime must be between 0 and 2147483647 seconds (got 2147483647.5)"),
    ("worker_scale_up_threshold", "1.25", "worker_scale_up_threshold must be above 0 and at most 1 (got 1.25)"),
]
NOT_PARSED = [
    ("pool_mode", "sessions", 'invalid value "sessions" for parameter pool_mode: '
                              "must be one of session, transaction, statement"),
    ("log_connections", "yes", 'invalid value "yes" for parameter log_connections: '
                               "must be an integer (0 = off, anything else = on)"),
    ("server_idle_timeout", "10s", 'invalid value "10s" for parameter server_idle_timeout: '
                                   "must be between 0 and 2147483647 seconds"),
    ("default_pool_size", "many", 'invalid value "many" for parameter default_pool_size: '
                                  "must be an integer, at least 0"),
]
ALL = OUT_OF_RANGE + NOT_PARSED


def ids(cases):
    return [f"{k}={v}" for k, v, _ in cases]


def where(b, key, value):
    """What the loader puts before the message: the file, and the line when the value did not parse."""
    path = re.escape(str(b.ini_path))
    if (key, value) in [(k, v) for k, v, _ in NOT_PARSED]:
        return path + r":\d+: "
    return path + ": "


@pytest.mark.parametrize("key,value,message", ALL, ids=ids(ALL))
def test_refused_at_start(bouncer, key, value, message):
    b = bouncer(ini_overrides={key: value}, start=False)
    b.start(wait=False)
    assert b.wait_exit() == 1
    log = b.log_text()
    assert re.search(where(b, key, value) + re.escape(message) + "$", log, re.MULTILINE), log
    assert "FATAL cannot load config file" in log
    assert "worker 0 started" not in log


def test_refused_on_reload(bouncer):
    """Each refused reload (SIGHUP or the console's RELOAD) keeps the whole
    running configuration; a value in range is then taken."""
    b = bouncer(ini_overrides={"default_pool_size": 7})
    conn = console(b)
    for key, value, message in ALL:
        before = row(conn, "SHOW CONFIG", key=key)["value"]
        kept = b.settings.get(key)
        b.update(**{key: value})
        b.write_ini()
        # SIGHUP: the master keeps its configuration, and so do the workers
        mark = b.log_mark()
        b.reload()
        b.wait_log(where(b, key, value) + re.escape(message) + "$", after=mark)
        b.wait_log(r"config file loading failed; keeping the running configuration", after=mark)
        assert row(conn, "SHOW CONFIG", key=key)["value"] == before, key
        # the console's RELOAD reads the file first and refuses at once
        mark = b.log_mark()
        with pytest.raises(psycopg.Error) as info:
            conn.execute("RELOAD")
        assert info.value.diag.message_primary == "RELOAD failed, see logs for additional details"
        b.wait_log(where(b, key, value) + re.escape(message) + "$", after=mark)
        assert row(conn, "SHOW CONFIG", key=key)["value"] == before, key
        assert row(conn, "SHOW CONFIG", key="default_pool_size")["value"] == "7"
        b.update(**{key: kept})
        b.write_ini()
    # the file is valid again: a RELOAD applies it
    b.update(default_pool_size=9)
    b.write_ini()
    conn.execute("RELOAD")
    assert row(conn, "SHOW CONFIG", key="default_pool_size")["value"] == "9"


def test_refused_by_set(bouncer):
    """The console's SET answers SET failed after a NOTICE with the reason; the old value stays."""
    b = bouncer()
    conn = console(b)
    seen = []
    conn.add_notice_handler(lambda d: seen.append(d.message_primary))
    for key, value, message in ALL:
        before = row(conn, "SHOW CONFIG", key=key)["value"]
        seen.clear()
        with pytest.raises(psycopg.Error) as info:
            conn.execute(f"SET {key} = '{value}'")
        assert (info.value.diag.severity, info.value.diag.message_primary) == ("ERROR", "SET failed"), key
        assert message in seen, (key, seen)
        assert row(conn, "SHOW CONFIG", key=key)["value"] == before, key
    # values in range are taken, at the edges of the range too
    for key, value in [("default_pool_size", "0"), ("query_timeout", "2147483647"),
                       ("worker_scale_up_threshold", "1"), ("pool_mode", "Transaction"), ("log_connections", "5")]:
        conn.execute(f"SET {key} = '{value}'")
    assert row(conn, "SHOW CONFIG", key="query_timeout")["value"] == "2.14748e+09"
    assert row(conn, "SHOW CONFIG", key="pool_mode")["value"] == "transaction"
    assert row(conn, "SHOW CONFIG", key="log_connections")["value"] == "5"  # a bool as given, as PgBouncer
