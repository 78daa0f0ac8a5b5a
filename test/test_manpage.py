"""The admin console reference in doc/pgbouncer.1.md (ADMIN CONSOLE) says
what the console does: every "Columns:" list is the RowDescription the
console sends, in order, and every command SHOW HELP lists is described."""

import re
from pathlib import Path

MANPAGE = Path(__file__).resolve().parent.parent / "doc" / "pgbouncer.1.md"


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
