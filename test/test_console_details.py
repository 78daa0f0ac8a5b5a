"""Smaller PgBouncer behaviours around logins that the console and the log
show (issue 10, item 10): login_notify_message (spec/config.md, post-1.25.2)
and what the log says when PostgreSQL refuses a login (spec/cli.md §5).
The client_login_count stats are in test_admin.py, SET of TLS settings in
test_tls.py, the start-up error in the log file in test_cli.py."""

import re
from pgwire import error_fields, PgWire


NOTICE_TEXT = "Maintenance tonight at 22:00 UTC; expect a short break"


def welcome(b, user="postgres", database="postgres", host="127.0.0.1"):
    """The messages of a raw login, from AuthenticationOk to ReadyForQuery."""
    w = PgWire(b.port, host=host)
    try:
        return w.login(user=user, database=database)
    finally:
        w.close()


def notices_in(msgs):
    return [error_fields(body) for mtype, body in msgs if mtype == b"N"]


def test_login_notify_message(bouncer):
    """A NOTICE right after BackendKeyData, before ReadyForQuery, for pooled
    and console logins alike; SET changes it; empty sends none."""
    b = bouncer(ini_overrides={"login_notify_message": NOTICE_TEXT, "min_workers": 2, "max_workers": 2})
    msgs = welcome(b)
    types = [m[0] for m in msgs]
    assert types[-3:] == [b"K", b"N", b"Z"], types
    assert notices_in(msgs) == [{"S": "NOTICE", "C": "00000", "M": NOTICE_TEXT}]
    assert [n["M"] for n in notices_in(welcome(b, database="pgbouncer", user="pgbouncer", host=str(b.dir)))] == [
        NOTICE_TEXT]
    with b.admin(host=str(b.dir)) as admin:
        admin.execute("SET login_notify_message = 'read-only until noon'")
        for _ in range(4):  # every worker took it
            assert [n["M"] for n in notices_in(welcome(b))] == ["read-only until noon"]
        admin.execute("SET login_notify_message = ''")
        for _ in range(4):
            assert notices_in(welcome(b)) == []


def test_login_notify_message_default_is_none(bouncer):
    b = bouncer()
    assert notices_in(welcome(b)) == []


def test_server_login_failure_logs_the_servers_message(bouncer):
    """PostgreSQL refuses the login: the server connection's closing line
    gives PostgreSQL's message, like the client's, not a bare `login failed`."""
    b = bouncer(ini_overrides={"log_disconnections": 1},
                users_txt='"ghost" ""\n"postgres" "postgres"\n"pgbouncer" "pgbouncer"\n')
    w = PgWire(b.port)
    w.startup(user="ghost")
    err = w.expect_fatal('role "ghost" does not exist', sqlstate="28000")
    assert err["M"] == 'role "ghost" does not exist'
    w.close()
    b.wait_log(r'WARNING S-\S+ postgres/ghost@127\.0\.0\.1:\d+ server login failed: FATAL role "ghost" does not '
               r'exist')
    b.wait_log(r'LOG S-\S+ postgres/ghost@127\.0\.0\.1:\d+ closing because: role "ghost" does not exist '
               r'\(age=')
    b.wait_log(r'LOG C-\S+ postgres/ghost@127\.0\.0\.1:\d+ closing because: role "ghost" does not exist '
               r'\(age=')
    assert not re.search(r"closing because: login failed", b.log_text()), b.log_text()
