"""The log lines operators rely on (spec/cli.md §5): the failure lines of a
refused login and of the pool limits, each with the client's
`C-0x...: db/user@host:port` prefix, and the DEBUG (-v) and NOISE (-vv)
lines that follow a login and a pool along their way."""

import re

import psycopg
import pytest

from helpers import conn_on, raw_login_error, two_workers, workers
from pgwire import PgWire, query_message

PASSWORD = "log pw"
USERS = f'"postgres" "{PASSWORD}"\n"pgbouncer" "pgbouncer"\n'


def prefix(user="postgres", db="postgres"):
    """The client prefix of spec/cli.md §5 for a TCP client on loopback."""
    return rf"C-0x[0-9a-f]+: {re.escape(db)}/{re.escape(user)}@127\.0\.0\.1:\d+ "


def login(b, password=PASSWORD, **kw):
    with b.connect(password=password, autocommit=True, **kw) as conn:
        return conn.execute("SELECT 1").fetchone()[0]


# ---------------------------------------------------------------------------
# failure lines


@pytest.mark.parametrize("auth_type", ["md5", "plain", "scram-sha-256"])
def test_wrong_password_lines(bouncer, auth_type):
    b = bouncer(ini_overrides={"auth_type": auth_type}, users_txt=USERS)
    mark = b.log_mark()
    raw_login_error(b, "postgres", "not the password")
    want = "SASL authentication failed" if auth_type == "scram-sha-256" else "password authentication failed"
    b.wait_log(prefix() + f"pooler error: {want}$", after=mark)
    b.wait_log(prefix() + rf"closing because: {want} \(age=\d+s\)$", after=mark)
    # the line operators alert on is there whatever the exchange
    b.wait_log(prefix() + ".*password authentication failed", after=mark)


def test_wrong_password_levels(bouncer):
    """pooler error is a WARNING, the close a LOG line (spec/cli.md §5)."""
    b = bouncer(ini_overrides={"auth_type": "md5"}, users_txt=USERS)
    mark = b.log_mark()
    raw_login_error(b, "postgres", "wrong")
    b.wait_log(r"\[\d+\] WARNING " + prefix() + "pooler error: password authentication failed$", after=mark)
    b.wait_log(r"\[\d+\] LOG " + prefix() + r"closing because: password authentication failed", after=mark)


def test_unknown_user_lines(bouncer):
    b = bouncer(ini_overrides={"auth_type": "md5"}, users_txt=USERS)
    mark = b.log_mark()
    raw_login_error(b, "nobody_here", "whatever")
    # the user is unknown: no user in the prefix
    p = prefix(user="(nouser)")
    b.wait_log(p + "login attempt: db=postgres user=nobody_here tls=no replication=no$", after=mark)
    b.wait_log(p + "login failed: db=postgres user=nobody_here$", after=mark)
    b.wait_log(p + "no such user: nobody_here$", after=mark)
    b.wait_log(p + "pooler error: password authentication failed$", after=mark)


def test_unknown_database_line(bouncer):
    b = bouncer(ini_overrides={"auth_type": "md5"}, users_txt=USERS)
    mark = b.log_mark()
    err = raw_login_error(b, "postgres", PASSWORD, database="no_such_db")
    assert err["M"] == "no such database: no_such_db"
    b.wait_log(prefix(db="no_such_db") + "login failed: db=no_such_db user=postgres$", after=mark)
    b.wait_log(prefix(db="no_such_db") + "pooler error: no such database: no_such_db$", after=mark)


def hba_pooler(bouncer, run_as, hba):
    b = bouncer(ini_overrides={"auth_type": "hba"}, users_txt=USERS, start=False)
    path = run_as.write(b.dir / "hba.conf", hba)
    b.update(auth_hba_file=str(path))
    b.write_ini()
    return b.start()


def test_hba_reject_line(bouncer, run_as):
    b = hba_pooler(bouncer, run_as, "host all postgres 127.0.0.1/32 reject\nhost all all 127.0.0.1/32 md5\n")
    mark = b.log_mark()
    raw_login_error(b, "postgres", PASSWORD)
    b.wait_log(prefix() + "pooler error: login rejected$", after=mark)
    b.wait_log(prefix() + r"closing because: login rejected \(age=\d+s\)$", after=mark)


def test_hba_no_match_line(bouncer, run_as):
    b = hba_pooler(bouncer, run_as, "host all nobody_else 127.0.0.1/32 md5\n")
    mark = b.log_mark()
    raw_login_error(b, "postgres", PASSWORD)
    b.wait_log(prefix() + "pooler error: no authentication method is found$", after=mark)


def test_max_client_conn_line(bouncer):
    b = bouncer(ini_overrides={"auth_type": "md5", "max_client_conn": 1}, users_txt=USERS)
    with b.connect(password=PASSWORD, autocommit=True) as held:
        held.execute("SELECT 1")
        mark = b.log_mark()
        err = raw_login_error(b, "postgres", PASSWORD)
        assert err["M"] == "no more connections allowed (max_client_conn)"
        b.wait_log(prefix() + r"pooler error: no more connections allowed \(max_client_conn\)$", after=mark)


@pytest.mark.parametrize("setting", ["max_user_client_connections", "max_db_client_connections"])
def test_client_limit_lines(bouncer, setting):
    b = bouncer(ini_overrides={"auth_type": "md5", setting: 1}, users_txt=USERS)
    with b.connect(password=PASSWORD, autocommit=True) as held:
        held.execute("SELECT 1")
        mark = b.log_mark()
        err = raw_login_error(b, "postgres", PASSWORD)
        assert err["M"] == f"client connections exceeded ({setting})"
        b.wait_log(prefix() + rf"pooler error: client connections exceeded \({setting}\)$", after=mark)


def test_reserve_pool_line(bouncer):
    b = bouncer(ini_overrides={"default_pool_size": 1, "reserve_pool_size": 1, "reserve_pool_timeout": 0.1})
    with b.connect(autocommit=True) as a:
        a.execute("SELECT 1")  # the session holds the pool's one server
        mark = b.log_mark()
        with b.connect(autocommit=True) as c:
            assert c.execute("SELECT 2").fetchone()[0] == 2
        b.wait_log(r"WARNING taking connection from reserve_pool$", after=mark)


# ---------------------------------------------------------------------------
# -v and -vv


def debug_lines(text):
    return [line for line in text.splitlines() if re.search(r"\] (DEBUG|NOISE) ", line)]


def one_login(b, last=None):
    """One login and query; the log from its start until `last` (default: the client's close) was written."""
    mark = b.log_mark()
    assert login(b) == 1
    b.wait_log(last or (prefix() + "closing because: client close request"), after=mark)
    return b.log_text()[mark:]


RELEASED = r"S-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:\d+ released by its client$"


LOGIN_DEBUG = [
    prefix(user="(nouser)", db="(nodb)") + r"got connection: 127\.0\.0\.1:\d+$",
    prefix(user="postgres") + r"startup packet: db=postgres user=postgres, \d+ parameters, protocol 3\.\d+$",
    prefix() + "auth method: md5$",
    prefix() + "authentication ok$",
    r"new pool postgres/postgres$",
    prefix() + "pool postgres/postgres: waits for its first server login$",
    r"pool postgres/postgres: launch decided \(0 servers in all workers, pool size \d+\)$",
    r"S-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:\d+ launching new connection to server$",
    r"S-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:\d+ server login: authentication ok$",
    r"S-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:\d+ server login: ready for query$",
    prefix() + r"linked to server S-0x[0-9a-f]+$",
    r"S-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:\d+ released by its client$",
]

LOGIN_NOISE = [
    prefix(user="(nouser)", db="(nodb)") + "startup parameter: user=postgres$",
    prefix(user="(nouser)", db="(nodb)") + "startup parameter: database=postgres$",
    r"S-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:\d+ server login: authentication request \d+$",
    r"S-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:\d+ server login: parameter server_version=",
    r"S-0x[0-9a-f]+: postgres/postgres@127\.0\.0\.1:\d+ server login: backend key data$",
]


def assert_lines(text, patterns, level):
    for p in patterns:
        assert re.search(rf"\] {level} {p}", text, re.MULTILINE), f"no {level} line {p!r} in:\n{text}"


def test_no_debug_lines_without_verbose(bouncer):
    b = bouncer(ini_overrides={"auth_type": "md5"}, users_txt=USERS)
    text = one_login(b)
    assert "login attempt" in text
    assert debug_lines(b.log_text()) == []


def test_v_logs_a_login_path_in_debug_lines(bouncer):
    b = bouncer(ini_overrides={"auth_type": "md5"}, users_txt=USERS, args=["-v"])
    text = one_login(b, RELEASED)
    assert_lines(text, LOGIN_DEBUG, "DEBUG")
    assert not re.search(r"\] NOISE ", b.log_text()), "NOISE lines at -v"


def test_vv_adds_noise_lines(bouncer):
    b = bouncer(ini_overrides={"auth_type": "md5"}, users_txt=USERS, args=["-v", "-v"])
    text = one_login(b, RELEASED)
    assert_lines(text, LOGIN_DEBUG, "DEBUG")
    assert_lines(text, LOGIN_NOISE, "NOISE")


def test_verbose_setting_in_the_ini(bouncer):
    """verbose = 2 in the file does what -vv does; a reload back to 0 stops them."""
    # one worker: the console that shows the reloaded value is the one that serves the next login
    b = bouncer(ini_overrides={"auth_type": "md5", "verbose": 2, "max_workers": 1}, users_txt=USERS)
    text = one_login(b, RELEASED)
    assert_lines(text, LOGIN_DEBUG, "DEBUG")
    assert_lines(text, LOGIN_NOISE, "NOISE")
    b.update(verbose=0)
    b.write_ini()
    b.reload()
    # the worker has applied the reload once SHOW CONFIG says so
    with b.admin(password="pgbouncer") as admin:
        rows = admin.execute("SHOW CONFIG").fetchall()
        assert [r[1] for r in rows if r[0] == "verbose"] == ["0"]
    mark = b.log_mark()
    assert login(b) == 1
    b.wait_log(prefix() + "closing because: client close request", after=mark)
    assert debug_lines(b.log_text()[mark:]) == []


def test_transaction_mode_release_and_pool_full_lines(bouncer):
    """A pool's path at -vv: each transaction's server is linked and released,
    and a client that finds the pool full is told why no server is launched."""
    b = bouncer(ini_overrides={"auth_type": "md5", "pool_mode": "transaction", "default_pool_size": 1},
                users_txt=USERS, args=["-vv"])
    with b.connect(password=PASSWORD) as a:
        a.execute("SELECT 1")  # a transaction holds the one server
        mark = b.log_mark()
        w = PgWire(b.port)
        w.login(user="postgres", password=PASSWORD)
        w.send(query_message("SELECT 2"))
        b.wait_log(r"NOISE pool postgres/postgres: no launch: pool full \(1 >= 1\)", after=mark)
        a.rollback()
        b.wait_log(r"DEBUG S-0x[0-9a-f]+: .* released by C-0x[0-9a-f]+ \(transaction end\)$", after=mark)
        w.read_until(b"Z")
        w.close()


def test_closing_line_at_debug_without_log_disconnections(bouncer):
    b = bouncer(ini_overrides={"auth_type": "md5", "log_disconnections": 0}, users_txt=USERS, args=["-v"])
    mark = b.log_mark()
    assert login(b) == 1
    b.wait_log(r"DEBUG " + prefix() + r"closing because: client close request \(age=\d+s\)$", after=mark)
    assert not re.search(r"LOG .*closing because", b.log_text()[mark:])


def test_console_set_verbose(bouncer):
    """SET verbose on the console takes effect without a reload, and back."""
    b = bouncer(ini_overrides={"auth_type": "md5", "max_workers": 1}, users_txt=USERS)
    with b.admin(password="pgbouncer") as admin:
        admin.execute("SET verbose = 1")
        text = one_login(b, RELEASED)
        assert_lines(text, LOGIN_DEBUG, "DEBUG")
        admin.execute("SET verbose = 0")
        mark = b.log_mark()
        assert login(b) == 1
        b.wait_log(prefix() + "closing because: client close request", after=mark)
        assert debug_lines(b.log_text()[mark:]) == []


def test_console_set_verbose_reaches_every_worker(bouncer):
    b = bouncer(ini_overrides={"min_workers": 2, "max_workers": 2})
    two_workers(b)
    with b.admin() as admin:
        admin.execute("SET verbose = 2")
    for w in workers(b):
        mark = b.log_mark()
        with conn_on(b, w["worker"]) as c:
            c.execute("SELECT 1")
        b.wait_log(rf"\[{w['pid']}\] NOISE " + prefix(user="(nouser)", db="(nodb)") + "startup parameter: user=postgres$",
                   after=mark)
