"""The admin console reference in doc/pgbouncer.1.md (ADMIN CONSOLE) says
what the console does: every "Columns:" list is the RowDescription the
console sends, in order, and every command SHOW HELP lists is described.
And the man pages the build makes from doc/*.md (pandoc, Makefile.am)
render without a warning: man at 80 columns, groff with every warning on."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, child_env

MANPAGE = REPO / "doc" / "pgbouncer.1.md"
MAN_PAGES = ["pgbouncer.1", "pgbouncer.5", "pgbouncer-auth-setup.1"]


def documented_columns():
    """{SHOW subject: [columns]} from the page's definition items."""
    text = MANPAGE.read_text()
    section = text[text.index("# ADMIN CONSOLE"):text.index("# REPLICATION CONNECTIONS")]
    found = {}
    subjects = []
    for para in re.split(r"\n\s*\n", section):
        para = para.strip()
        heads = re.findall(r"\*\*SHOW ([A-Z_]+)\*\*", para.split("\n")[0]) if para.startswith("**SHOW") else []
        if heads:
            subjects = heads
        m = re.match(r"Columns:\s*(.*)", para, re.S)
        if m:
            cols = [c.strip() for c in " ".join(m.group(1).split()).split(",")]
            for s in subjects:
                found[s] = cols
    return found, section


def test_every_documented_column_list_is_what_the_console_sends(bouncer):
    docs, _ = documented_columns()
    assert len(docs) >= 20, sorted(docs)
    b = bouncer(ini_overrides={"min_workers": 2, "max_workers": 2})
    with b.admin() as admin:
        for subject, cols in sorted(docs.items()):
            cur = admin.execute(f"SHOW {subject}")
            assert [d.name for d in cur.description] == cols, subject


def test_every_command_in_show_help_is_described(bouncer):
    _, section = documented_columns()
    b = bouncer()
    notices = []
    with b.admin() as admin:
        admin.add_notice_handler(lambda d: notices.append(d.message_detail or ""))
        admin.execute("SHOW HELP")
    detail = "\n".join(notices)
    shows = re.findall(r"SHOW ([A-Z_|]+)", detail)
    assert shows, detail
    for group in shows:
        for subject in group.split("|"):
            assert f"**SHOW {subject}**" in section, subject
    for word in re.findall(r"^\s*([A-Z_]+)", detail, re.M):
        if word != "SHOW":
            assert f"**{word}**" in section, word


def built_page(name):
    """A man page as the build made it, beside the binary under test."""
    bindir = Path(os.environ.get("PGBOUNCER_BIN", REPO / "build" / "pgbouncer")).resolve().parent
    page, source = bindir / "doc" / name, REPO / "doc" / f"{name}.md"
    if not page.exists():
        pytest.skip(f"{page} was not built (configure found no pandoc)")
    assert page.stat().st_mtime >= source.stat().st_mtime, f"{page} is older than {source}: run make"
    return page


@pytest.mark.parametrize("name", MAN_PAGES)
def test_man_page_renders_without_warnings(name):
    page = built_page(name)
    for tool in ("man", "groff"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    env = child_env()
    env.update(MANWIDTH="80", MANROFFSEQ="", MAN_DISABLE_SECCOMP="1")
    runs = {
        "man -l (80 columns)": ["man", "--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z", str(page)],
        "groff -ww -t -man": ["groff", "-ww", "-t", "-man", "-Tutf8", "-z", str(page)],
    }
    for what, cmd in runs.items():
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert out.returncode == 0, f"{what}: exit {out.returncode}\n{out.stderr}"
        assert out.stderr == "", f"{what} warns about {page}:\n{out.stderr}"
