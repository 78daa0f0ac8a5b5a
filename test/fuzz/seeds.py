#!/usr/bin/env python3
"""Writes the seed corpora of test/fuzz/corpus/<target>/ (run from anywhere;
the files are checked in, this only documents how the binary ones were made).
Each seed is a small valid input, so that libFuzzer starts from the formats'
happy paths; crash inputs that scripts/fuzz keeps go next to them."""
import base64
import hashlib
import hmac
import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"


def put(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data.encode() if isinstance(data, str) else data)


def msg(t, body=b""):
    return t.encode() + struct.pack("!I", len(body) + 4) + body


def cstr(s):
    return s.encode() + b"\0"


# ---- config ----
put("fuzz_config", "basic.ini", """[databases]
app = host=127.0.0.1 port=5432 dbname=app pool_size=10 pool_mode=transaction
repl = host=/var/run/postgresql,10.0.0.2 port=5433 user=u password='p w' load_balance_hosts=disable
* = host=localhost connect_query='SELECT 1' client_encoding=UTF8 datestyle=ISO timezone=UTC
[users]
alice = pool_mode=session max_user_connections=4 query_timeout=30
[peers]
1 = host=10.0.0.1 port=6432 pool_size=2
[pgbouncer]
listen_addr = 127.0.0.1, ::1
listen_port = 6432
auth_type = scram-sha-256
auth_file = userlist.txt
admin_users = admin, ops
pool_mode = transaction
max_client_conn = 100
default_pool_size = 20
server_lifetime = 3600.5
min_workers = 1
max_workers = 4
worker_scale_up_threshold = 0.75
ignore_startup_parameters = extra_float_digits,options
max_packet_size = 0x7fffffff
unix_socket_mode = 0777
%include other.ini
""")
put("fuzz_config", "ldap.ini", "[pgbouncer]\nauth_type = ldap\nauth_ldap_options = ldapurl=\"ldaps://h:636/"
    "ou=people,dc=x??sub?(|(uid=$username)(mail=$username))\" ldapbinddn=\"cn=r,dc=x\" ldapbindpasswd=\"p w\"\n"
    "[databases]\n")
put("fuzz_config", "minimal.ini", "[pgbouncer]\nlisten_port=1\n[databases]\nx=\n")
put("fuzz_config", "quoted.ini", "; comment\n# comment\n[databases]\n\"my db\" = dbname='it''s' host=h\n[pgbouncer]\nauth_query = SELECT usename, passwd FROM pg_shadow WHERE usename=$1\n")

# ---- userlist ----
put("fuzz_userlist", "basic.txt", '''; comment
"app" "app-secret"
"admin" "md545f2603610af569b6155c45067268c6b"
"scram" "SCRAM-SHA-256$4096:c2FsdHNhbHRzYWx0$nRD6rEj3Pm8rAfqC0FNcUBjCxxx6zq4R0ZnTN3Ec5Bc=:m1lrWZgNE56lKs1mrzJ2L9AtGcEHEvdzqYAPDAMSgE0="
"quo""ted" ""
''')
put("fuzz_userlist", "stop.txt", '"a" "b"\n# stops here\n"c" "d"\n')

# ---- hba: hba text NUL ident text NUL dbname NUL user ----
put("fuzz_hba", "basic", b"\0".join([b"""# TYPE DATABASE USER ADDRESS METHOD
local all all peer map=omap
host all all 127.0.0.1/32 trust
host sameuser,app +grp,alice 10.0.0.0 255.0.0.0 md5
hostssl all all ::1/128 cert map=certmap
hostnossl replication all all scram-sha-256
host "quoted db" all 0.0.0.0/0 reject
host @dbs.txt @users.txt samehost ldap
host all bob 10.1.0.0/16 ldap ldapserver="a b" ldapport=1389 ldaptls=1 ldapprefix="uid=" ldapsuffix=",dc=x"
host all carol ::1/128 ldap ldapurl="ldap://h/dc=x?mail?one" ldapbinddn=cn=r,ldapbindpasswd=p
""", b"""# MAP SYSTEM DB
omap root postgres
omap /^(.*)$ \\1
certmap alice all
""", b"app", b"alice"]))

# ---- startup packets ----
def startup(params, code=0x00030000):
    body = struct.pack("!I", code) + b"".join(cstr(k) + cstr(v) for k, v in params) + b"\0"
    return struct.pack("!I", len(body) + 4) + body


put("fuzz_startup", "startup", startup([("user", "alice"), ("database", "app"), ("application_name", "psql")]))
put("fuzz_startup", "replication", startup([("user", "r"), ("replication", "database"), ("options", "-c x=1")]))
put("fuzz_startup", "v32", startup([("user", "a"), ("_pq_.x", "1"), ("replication", "on")], 0x00030002))
put("fuzz_startup", "ssl", struct.pack("!II", 8, 80877103))
put("fuzz_startup", "gss", struct.pack("!II", 8, 80877104))
put("fuzz_startup", "cancel", struct.pack("!III", 16, 80877102, 1234) + b"kkkk")

# ---- client messages: each preceded by a direction byte (0 client, 1 server) ----
def c(t, body=b""):
    return b"\0" + msg(t, body)


def s(t, body=b""):
    return b"\1" + msg(t, body)


parse = cstr("s1") + cstr("SELECT $1::int") + struct.pack("!HI", 1, 23)
bind = cstr("") + cstr("s1") + struct.pack("!HH", 1, 0) + struct.pack("!HI", 1, 1) + b"1" + struct.pack("!HH", 1, 0)
put("fuzz_client_msg", "extended", b"".join([
    c("P", parse), c("B", bind), c("D", b"P\0"), c("E", cstr("") + struct.pack("!I", 0)), c("S"),
    s("1"), s("2"), s("T", struct.pack("!H", 0)), s("C", cstr("SELECT 1")), s("Z", b"I"),
    c("P", parse), c("C", b"Ss1\0"), c("S"), s("3"), s("Z", b"I"),
]))
put("fuzz_client_msg", "error", b"".join([
    c("P", parse), c("B", bind), c("E", cstr("") + struct.pack("!I", 0)), c("S"),
    s("E", b"SERROR\0C26000\0Mprepared statement \"PGBOUNCER_1\" does not exist\0\0"), s("Z", b"E"),
]))
put("fuzz_client_msg", "simple", c("Q", cstr("BEGIN")) + s("C", cstr("BEGIN")) + s("Z", b"T")
    + c("Q", cstr("COPY t FROM STDIN")) + s("G", b"\0\0\0") + c("d", b"1\n") + c("c") + s("C", cstr("COPY 1"))
    + s("Z", b"T") + c("X"))
many = b"".join(c("P", cstr(f"s{i}") + cstr(f"SELECT {i}") + b"\0\0") for i in range(8))
put("fuzz_client_msg", "evict", many + c("S") + b"".join(s("1") for _ in range(8)) + s("Z", b"I"))

# ---- SCRAM (RFC 5802), with the nonces the targets fix ----
def scram_keys(password, salt, iters):
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iters)
    ck = hmac.new(salted, b"Client Key", "sha256").digest()
    sk = hmac.new(salted, b"Server Key", "sha256").digest()
    return ck, sk


def b64(b):
    return base64.b64encode(b).decode()


def xor(a, b):
    return bytes(x ^ y for x, y in zip(a, b))


SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"  # fuzz_scram_server.c
CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"  # fuzz_scram_client.c
salt = b"W22ZaJ0SNY7soEsUEjb6gQ=="  # the raw salt of the server target's verifier

# server target: the client's two messages, valid for password "pencil"
ck, sk = scram_keys("pencil", salt, 4096)
cnonce = "fyko+d2lbbFgONRv9qkxdawL"
first_bare = f"n=user,r={cnonce}"
server_first = f"r={cnonce}{SERVER_NONCE},s={b64(salt)},i=4096"
final_wo = f"c=biws,r={cnonce}{SERVER_NONCE}"
auth = f"{first_bare},{server_first},{final_wo}".encode()
proof = xor(ck, hmac.new(hashlib.sha256(ck).digest(), auth, "sha256").digest())
put("fuzz_scram_server", "valid", f"n,,{first_bare}".encode() + b"\0" + f"{final_wo},p={b64(proof)}".encode())
put("fuzz_scram_server", "wrong_proof", f"n,,{first_bare}".encode() + b"\0" + f"{final_wo},p={b64(bytes(32))}".encode())
put("fuzz_scram_server", "cbind", b"y,,n=,r=abc\0c=eSws,r=abc" + SERVER_NONCE.encode() + b",p=AAAA")

# client target: the server's two messages, for the target's pass-through keys
ck = bytes([1, 2, 3] + [0] * 29)
sk = bytes([4, 5, 6] + [0] * 29)
first_bare = f"n=,r={CLIENT_NONCE}"
server_first = f"r={CLIENT_NONCE}{SERVER_NONCE},s={b64(salt)},i=4096"
final_wo = f"c=biws,r={CLIENT_NONCE}{SERVER_NONCE}"
auth = f"{first_bare},{server_first},{final_wo}".encode()
put("fuzz_scram_client", "valid", server_first.encode() + b"\0v=" + b64(hmac.new(sk, auth, "sha256").digest()).encode())
put("fuzz_scram_client", "error", server_first.encode() + b"\0e=invalid-proof")
put("fuzz_scram_client", "secret", b"SCRAM-SHA-256$4096:c2FsdHNhbHRzYWx0$nRD6rEj3Pm8rAfqC0FNcUBjCxxx6zq4R0ZnTN3Ec5Bc="
    b":m1lrWZgNE56lKs1mrzJ2L9AtGcEHEvdzqYAPDAMSgE0=")

# ---- auth_query: selector byte (0 columns, 1 row, 2 hint) + data ----
put("fuzz_auth_query", "columns", b"\0" + struct.pack("!H", 2) + cstr("usename") + bytes(18) + cstr("passwd") + bytes(18))
put("fuzz_auth_query", "row", b"\x07" + struct.pack("!HI", 2, 5) + b"alice" + struct.pack("!I", 35)
    + b"md545f2603610af569b6155c45067268c6b")
put("fuzz_auth_query", "row_null", b"\x07" + struct.pack("!HI", 2, 5) + b"alice" + struct.pack("!i", -1))
put("fuzz_auth_query", "hint", b"\x02" + b"\0".join([b"42501", b"permission denied for function user_lookup",
                                                    b"pgbouncer", b"postgres", b"SELECT * FROM pgbouncer.user_lookup($1)"]))
put("fuzz_auth_query", "hint_schema", b"\x05" + b"\0".join([b"3F000", b"schema \"pgbouncer\" does not exist",
                                                           b"Auth User", b"db", b""]))

# ---- server messages at login (fuzz_server_msg): backend messages as sent ----
def auth(code, data=b""):
    return msg("R", struct.pack("!I", code) + data)


put("fuzz_server_msg", "md5_login", auth(5, b"salt") + auth(0) + b"".join(
    msg("S", cstr(k) + cstr(v)) for k, v in [("server_version", "16.4"), ("client_encoding", "UTF8"),
                                              ("DateStyle", "ISO, MDY"), ("standard_conforming_strings", "on")])
    + msg("K", struct.pack("!I", 4242) + b"k" * 4) + msg("Z", b"I"))
# the SCRAM exchange of fuzz_scram_client's "valid" seed, framed as the server sends it
sfirst, sfinal = (CORPUS / "fuzz_scram_client" / "valid").read_bytes().split(b"\0", 1)
put("fuzz_server_msg", "scram_login", auth(10, cstr("SCRAM-SHA-256-PLUS") + cstr("SCRAM-SHA-256") + b"\0")
    + auth(11, sfirst) + auth(12, sfinal) + auth(0) + msg("S", cstr("TimeZone") + cstr("UTC")) + msg("Z", b"I"))
put("fuzz_server_msg", "error", msg("N", b"SWARNING\0VWARNING\0C01000\0Mnotice\0\0")
    + msg("E", b"SFATAL\0VFATAL\0C28P01\0Mpassword authentication failed for user \"u\"\0Fauth.c\0L1\0Rx\0\0"))
put("fuzz_server_msg", "malformed", msg("S", b"name-without-nul") + msg("E", b"Mno S or C\0\0"))

# ---- client SASL messages (fuzz_sasl): SASLInitialResponse then SASLResponse ----
cfirst, cfinal = (CORPUS / "fuzz_scram_server" / "valid").read_bytes().split(b"\0", 1)
put("fuzz_sasl", "valid", msg("p", cstr("SCRAM-SHA-256") + struct.pack("!I", len(cfirst)) + cfirst) + msg("p", cfinal))
put("fuzz_sasl", "no_data", msg("p", cstr("SCRAM-SHA-256") + struct.pack("!i", -1)))
put("fuzz_sasl", "other_mech", msg("p", cstr("SCRAM-SHA-256-PLUS") + struct.pack("!I", 3) + b"p=x"))

# ---- extended-protocol names (fuzz_txn_msg): client name NUL, messages (a byte after each cuts it) ----
bind_named = msg("B", cstr("") + cstr("stmt1") + struct.pack("!HH", 1, 0) + struct.pack("!HI", 1, 1) + b"1"
                 + struct.pack("!HH", 1, 0))
put("fuzz_txn_msg", "bind", b"stmt1\0" + bind_named + b"\x09" + msg("B", cstr("p") + cstr("") + b"\0\0\0\0\0\0"))
put("fuzz_txn_msg", "describe_close", b"s\0" + msg("D", b"Ss\0") + msg("D", b"P\0") + msg("C", b"Ss\0")
    + msg("C", b"P\0"))
put("fuzz_txn_msg", "error", b"my_stmt\0" + msg("E", b"SERROR\0VERROR\0C26000\0"
    b"Mprepared statement \"PGBOUNCER_12\" does not exist\0Fprepare.c\0L1\0\0")
    + msg("E", b"SERROR\0C08P01\0Mbind message supplies 1 parameters, but prepared statement "
          b"\"PGBOUNCER_3\" requires 2\0\0"))

# ---- console commands (fuzz_admin): the query text ----
for name, q in [("show", "SHOW POOLS;"), ("set", "SET default_pool_size = '20'"), ("set_to", "set \"log_connections\" TO 0 ;"),
                ("kill", "KILL \"my \"\"db\"\"\""), ("pause", "  pause app  ;  "), ("set_quoted", "SET a='it''s'")]:
    put("fuzz_admin", name, q)

# ---- a moving client's state (fuzz_handover) ----
# Not written here: v2_waiting and v2_auth_query are the two messages of
# test/unit/handover_v2_fixtures.h (version 2, captured from a running
# pooler); v3_waiting, v3_auth_query and v3_minimal are what
# handover_encode() makes of them and of a client with its required fields
# only. Make them again with the codec itself after a format change.
