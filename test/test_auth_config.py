"""Authentication settings the pooler cannot honour are refused when the
configuration is loaded (spec/config.md: `ldap` and `pam` exist only in
builds with that support), at start, on RELOAD and with the console's SET,
instead of being accepted and then failing every login."""

import pytest

from helpers import build_has_pam, console, expect_error, row
from ldapfixture import build_has_ldap


@pytest.fixture
def unsupported(pgbouncer_bin, method):
    """Only in a build without libpam or libldap (test_pam.py and test_ldap.py test the others)."""
    if method == "pam" and build_has_pam(pgbouncer_bin):
        pytest.skip("this build has PAM: test_pam.py covers auth_type = pam")
    if method == "ldap" and build_has_ldap(pgbouncer_bin):
        pytest.skip("this build has LDAP: test_ldap.py covers auth_type = ldap")



@pytest.mark.parametrize("method", ["pam", "ldap"])
def test_unsupported_auth_type_refused_at_start(bouncer, run_pgbouncer, method, unsupported):
    b = bouncer(ini_overrides={"auth_type": method}, start=False)
    run = run_pgbouncer([b.ini_path])
    seen = run.stdout + run.stderr + b.log_text()
    assert run.rc == 1, seen
    assert f"{b.ini_path}:{b.line_of('auth_type')}" in seen, seen
    assert f'auth_type "{method}" is not supported by this build (built without lib{method}' in seen, seen
    assert "cannot load config file" in seen, seen


@pytest.mark.parametrize("method", ["pam", "ldap"])
def test_unsupported_auth_type_refused_on_reload_and_set(bouncer, method, unsupported):
    b = bouncer(ini_overrides={"auth_type": "trust"})
    conn = console(b)
    b.update(auth_type=method)
    b.write_ini()
    expect_error(conn, "RELOAD", "RELOAD failed, see logs for additional details", sqlstate="F0000")
    b.wait_log(rf'auth_type "{method}" is not supported by this build')
    mark = b.log_mark()
    expect_error(conn, f"SET auth_type = '{method}'", "SET failed")
    b.wait_log(rf'auth_type "{method}" is not supported by this build', after=mark)
    assert row(conn, "SHOW CONFIG", key="auth_type")["value"] == "trust"
    # logins go on with the old setting
    with b.connect(autocommit=True) as c:
        assert c.execute("SELECT 1").fetchone() == (1,)
