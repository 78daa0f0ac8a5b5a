"""Real Python drivers as their users run them, against transaction pooling
with protocol-level prepared statements: CLIENTS concurrent connections share
a pool of POOL_SIZE servers, each runs prepared statements and transactions
and checks every result. Any error from the pooler fails the test; the only
errors a test expects are PostgreSQL's own (division by zero) and it checks
the connection goes on working after them.

- psycopg 3: prepare_threshold 0 and 1 (every statement a named server-side
  statement, `_pg3_N`, the same names on every connection), with and without
  autocommit, a query canceled with conn.cancel(); pipeline mode with
  executemany and an error mid-pipeline.
- asyncpg: its statement cache (default; `__asyncpg_stmt_N__`), fetch,
  fetchrow, fetchval, executemany, prepare(), copy_records_to_table (the
  data sent without waiting for CopyInResponse), transactions (one rolled
  back), a query timeout (asyncpg cancels the query).

Every client also runs a statement of 200 kB, cursors read a few rows at a
time inside transactions, and 3 statements of its own per iteration (600 in all,
more than the 200 that each server keeps) and all of them again at the end,
so that the pooler evicts and prepares again what it evicted.

Each runs with one worker and with two (the pool budget is shared, the
clients' statements live with them). node-postgres, pgx and pgjdbc run in
scripts/drivers."""

import asyncio
import collections
import concurrent.futures
import multiprocessing
import threading

import psycopg
import pytest

try:
    import asyncpg
except ImportError:  # reported by the asyncpg tests with a hint
    asyncpg = None

POOL_SIZE = 2
CLIENTS = 10
ITERATIONS = 20
DEADLINE = 120  # seconds for all clients of one test together

WORKERS = [pytest.param({"min_workers": 1, "max_workers": 1}, id="1worker"),
           pytest.param({"min_workers": 2, "max_workers": 2}, id="2workers")]


@pytest.fixture(params=WORKERS)
def txpool(request, bouncer):
    """A pooler in transaction mode, POOL_SIZE servers for everyone, prepared
    statements on (the default 200, said explicitly)."""
    b = bouncer(ini_overrides={"pool_mode": "transaction", "default_pool_size": POOL_SIZE,
                               "max_prepared_statements": 200, "max_client_conn": 100, "query_wait_timeout": 60,
                               **request.param})
    b.workers = request.param["max_workers"]
    return b


@pytest.fixture
def table(pg, request):
    """A fresh table (client, iter, v) named after the test."""
    name = "drv_" + "".join(ch if ch.isalnum() else "_" for ch in request.node.name).lower()[:50]
    pg.sql(f"DROP TABLE IF EXISTS {name}")
    pg.sql(f"CREATE TABLE {name} (client int, iter int, v int)")
    return name


def run_threads(fn):
    """Runs fn(c) for c in 1..CLIENTS in threads; returns their results.
    Fails with every client's error if any failed or did not finish."""
    ex = concurrent.futures.ThreadPoolExecutor(CLIENTS)
    try:
        futures = {c: ex.submit(fn, c) for c in range(1, CLIENTS + 1)}
        _, pending = concurrent.futures.wait(futures.values(), timeout=DEADLINE)
        fail_clients({c: ("did not finish" if f in pending else f.exception()) for c, f in futures.items()})
        return [futures[c].result() for c in sorted(futures)]
    finally:
        # a stuck thread ends when the bouncer fixture's teardown closes its connection
        ex.shutdown(wait=False, cancel_futures=True)


def fail_clients(outcomes):
    """outcomes: client -> None (fine), an exception, or a text. Fails the test
    listing every client that did not succeed."""
    errors = [f"client {c}: {e if isinstance(e, str) else describe(e)}" for c, e in outcomes.items()
              if e is not None]
    if errors:
        pytest.fail(f"{len(errors)} of {CLIENTS} clients failed:\n" + "\n".join(errors), pytrace=False)


class ClientError(Exception):
    """An error of a client's call, with the call's name in front."""


def describe(e):
    if isinstance(e, ClientError):
        return str(e)
    state = getattr(e, "sqlstate", None)
    return f"{type(e).__name__}" + (f" (SQLSTATE {state})" if state else "") + f": {e}"


def check_sharing(b, pids_per_client):
    """The clients really shared the servers: some backend served several
    clients, and with one worker there were at most POOL_SIZE backends in all.
    (Two workers hand budget units to each other by closing an idle server
    and opening one in the other worker, so their clients see more backends
    over time.)"""
    users = collections.Counter(pid for pids in pids_per_client for pid in pids)
    assert any(n > 1 for n in users.values()), f"no server backend served two clients: {dict(users)}"
    if b.workers == 1:
        assert len(users) <= POOL_SIZE, f"{CLIENTS} clients saw {len(users)} server backends: {dict(users)}"


class Step:
    """Names the call that failed: `with Step("iteration 3: add"): ...` turns
    an error or a failed check inside into ClientError("iteration 3: add: ...")."""

    def __init__(self, what):
        self.what = what

    def __enter__(self):
        return self

    def __exit__(self, typ, e, tb):
        if e is None or isinstance(e, (ClientError, asyncio.CancelledError, KeyboardInterrupt)):
            return False
        raise ClientError(f"{self.what}: {describe(e)}") from e


# a statement longer than the pooler's packet buffer
LONG_QUERY = "SELECT $1::int + 1 /* " + "long " * 40000 + "*/"


def distinct_statements(c, i):
    """(constant, parameter, result) of 3 statements whose text is client c's and
    iteration i's own: 600 in all, more than the servers keep (200 each), so
    that they evict, and re-prepare what a client uses again."""
    for j in range(3):
        k = c * 1000 + i * 10 + j
        yield k, i, k + i


# ---------------------------------------------------------------------------
# psycopg 3


def psycopg_distinct(conn, c, i, at):
    for k, param, result in distinct_statements(c, i):
        with Step(f"{at}: distinct {k}"):
            assert conn.execute(f"SELECT %s::int + {k}", (param,)).fetchone() == (result,)


@pytest.mark.parametrize("threshold", [0, 1])
def test_psycopg_prepared_statements(txpool, table, threshold):
    """prepare_threshold=0 prepares every statement at its first execution, 1
    at its second; even-numbered clients autocommit, odd ones run every
    iteration in psycopg's implicit transaction and commit."""

    def client(c):
        with txpool.connect(prepare_threshold=threshold, autocommit=c % 2 == 0) as conn:
            return run_client(conn, c)

    def run_client(conn, c):
        pids, total = set(), 0
        for i in range(ITERATIONS):
            at = f"iteration {i}"
            with Step(f"{at}: add"):
                assert conn.execute("SELECT %s::int + %s::int", (c, i)).fetchone() == (c + i,)
            with Step(f"{at}: concat"):
                assert conn.execute("SELECT %s::text || '-' || %s::text", (f"c{c}", str(i))).fetchone() == \
                    (f"c{c}-{i}",)
            with Step(f"{at}: series"):
                rows = conn.execute("SELECT g FROM generate_series(1, %s::int) g", (i + 1,)).fetchall()
                assert rows == [(k,) for k in range(1, i + 2)]
            psycopg_distinct(conn, c, i, at)
            with Step(f"{at}: long"):
                assert conn.execute(LONG_QUERY.replace("$1", "%s"), (i,)).fetchone() == (i + 1,)
            with Step(f"{at}: pid"):
                pids.add(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
            v = c * 1000 + i
            with Step(f"{at}: transaction"):
                with conn.transaction():
                    conn.execute(f"INSERT INTO {table} (client, iter, v) VALUES (%s, %s, %s)", (c, i, v))
                    assert conn.execute(f"SELECT count(*) FROM {table} WHERE client = %s", (c,)).fetchone() == \
                        (i + 1,)
                    with conn.cursor(name=f"cur{c}") as cur:  # a server-side cursor, read 3 rows at a time
                        cur.itersize = 3
                        cur.execute("SELECT g FROM generate_series(1, %s::int) g", (10 + i,))
                        assert sum(g for (g,) in cur) == (10 + i) * (11 + i) // 2
            total += v
            if i == 7:
                with Step(f"{at}: cancel"):
                    with pytest.raises(psycopg.errors.QueryCanceled):
                        with conn.transaction():
                            conn.execute("SELECT 1")  # the client holds its server from here
                            timer = threading.Timer(0.5, conn.cancel)
                            timer.start()
                            try:
                                conn.execute("SELECT pg_sleep(5)")
                            finally:
                                timer.cancel()
            if not conn.autocommit:
                with Step(f"{at}: commit"):
                    conn.commit()
        for i in range(ITERATIONS):  # again: the servers evicted most of them
            psycopg_distinct(conn, c, i, f"again, iteration {i}")
        with Step("final sum"):
            assert conn.execute(f"SELECT coalesce(sum(v), 0)::int FROM {table} WHERE client = %s",
                                (c,)).fetchone() == (total,)
            conn.commit()
        return pids

    check_sharing(txpool, run_threads(client))


@pytest.mark.parametrize("threshold", [None, 0], ids=["threshold_default", "threshold0"])
def test_psycopg_pipeline(txpool, table, threshold):
    """Pipeline mode: several statements, a transaction and executemany per
    Sync; every third iteration a division by zero mid-pipeline (PostgreSQL's
    error, which aborts the rest of that pipeline) and the connection goes on."""

    def client(c):
        with txpool.connect(prepare_threshold=threshold, autocommit=True) as conn:
            return run_client(conn, c)

    def run_client(conn, c):
        pids, total = set(), 0
        for i in range(ITERATIONS):
            at = f"iteration {i}"
            v = c * 1000 + i
            with Step(f"{at}: pipeline"):
                with conn.pipeline():
                    add = conn.execute("SELECT %s::int + %s::int", (c, i))
                    concat = conn.execute("SELECT %s::text || '-' || %s::text", (f"c{c}", str(i)))
                    with conn.transaction():
                        conn.execute(f"INSERT INTO {table} (client, iter, v) VALUES (%s, %s, %s)", (c, i, v))
                        count = conn.execute(f"SELECT count(*) FROM {table} WHERE client = %s", (c,))
                    with conn.cursor() as cur:
                        cur.executemany(f"INSERT INTO {table} (client, iter, v) VALUES (%s, %s, %s)",
                                        [(-c, i, k) for k in range(3)])
                    pid = conn.execute("SELECT pg_backend_pid()")
                assert add.fetchone() == (c + i,)
                assert concat.fetchone() == (f"c{c}-{i}",)
                assert count.fetchone() == (i + 1,)
                pids.add(pid.fetchone()[0])
            total += v
            if i % 3 == 2:
                with Step(f"{at}: pipeline with an error"):
                    with pytest.raises(psycopg.errors.DivisionByZero):
                        with conn.pipeline():
                            before = conn.execute("SELECT %s::int * 2", (i,))
                            conn.execute("SELECT 1 / %s::int", (0,))
                            # skipped by the server after the error; its text is new to this
                            # connection each time, because psycopg 3.1 takes a statement
                            # skipped that way for prepared (prepare_threshold=0) and would
                            # Bind it next time without a Parse
                            conn.execute(f"SELECT %s::int * 3 + {i}", (i,))
                    assert before.fetchone() == (i * 2,)
                with Step(f"{at}: after the error"):
                    assert conn.execute("SELECT %s::int * 3", (i,)).fetchone() == (i * 3,)
        with Step("final sums"):
            assert conn.execute(f"SELECT coalesce(sum(v), 0)::int FROM {table} WHERE client = %s",
                                (c,)).fetchone() == (total,)
            assert conn.execute(f"SELECT count(*) FROM {table} WHERE client = %s", (-c,)).fetchone() == \
                (3 * ITERATIONS,)
        return pids

    check_sharing(txpool, run_threads(client))


# ---------------------------------------------------------------------------
# asyncpg


ASYNCPG_PROCESSES = 5  # CLIENTS connections in that many processes


def test_asyncpg_statement_cache(txpool, table):
    """asyncpg's statement cache (default size): each query is prepared once
    per connection under `__asyncpg_stmt_N__` and reused; fetch, fetchrow,
    fetchval, executemany, an explicit prepare(), a committed transaction per
    iteration and, every third, a rolled-back one (division by zero).

    asyncpg numbers its statements per process, so the connections run in
    ASYNCPG_PROCESSES processes (as an application's worker processes do):
    each process's connections share no name, the processes use the same ones."""
    if asyncpg is None:
        pytest.fail("asyncpg is not importable: install the Debian package python3-asyncpg "
                    "(scripts/test does)", pytrace=False)
    groups = [list(range(p, CLIENTS + 1, ASYNCPG_PROCESSES)) for p in range(1, ASYNCPG_PROCESSES + 1)]
    pool = multiprocessing.get_context("fork").Pool(ASYNCPG_PROCESSES)
    try:
        run = pool.map_async(asyncpg_process, [(txpool.port, table, g) for g in groups], chunksize=1)
        try:
            outcomes = dict(item for result in run.get(timeout=DEADLINE + 30) for item in result.items())
        except multiprocessing.TimeoutError:
            pytest.fail(f"the asyncpg processes did not finish within {DEADLINE + 30}s", pytrace=False)
    finally:
        pool.terminate()
        pool.join()
    fail_clients({c: (None if isinstance(o, set) else o) for c, o in outcomes.items()})
    check_sharing(txpool, list(outcomes.values()))


def asyncpg_process(args):
    """One process's asyncpg connections, concurrently. Returns client ->
    the backend pids it saw, or its error as text."""
    port, table, clients = args

    async def main():
        tasks = [asyncio.create_task(asyncpg_client(port, table, c)) for c in clients]
        _, pending = await asyncio.wait(tasks, timeout=DEADLINE)
        for t in pending:
            t.cancel()
        return {c: ("did not finish" if t in pending else describe(t.exception()) if t.exception() else t.result())
                for c, t in zip(clients, tasks)}

    return asyncio.run(main())


async def asyncpg_distinct(conn, c, i, at):
    for k, param, result in distinct_statements(c, i):
        with Step(f"{at}: distinct {k}"):
            assert await conn.fetchval(f"SELECT $1::int + {k}", param) == result


async def asyncpg_client(port, table, c):
    conn = await asyncpg.connect(host="127.0.0.1", port=port, user="postgres", database="postgres",
                                 timeout=10, command_timeout=60)
    try:
        pids, total = set(), 0
        triple = None
        for i in range(ITERATIONS):
            at = f"iteration {i}"
            with Step(f"{at}: fetchval"):
                assert await conn.fetchval("SELECT $1::int + $2::int", c, i) == c + i
            with Step(f"{at}: fetchrow"):
                row = await conn.fetchrow("SELECT $1::text || '-' || $2::text AS s, $3::int * 2 AS d",
                                          f"c{c}", str(i), i)
                assert (row["s"], row["d"]) == (f"c{c}-{i}", i * 2)
            with Step(f"{at}: fetch"):
                rows = await conn.fetch("SELECT g FROM generate_series(1, $1::int) g", i + 1)
                assert [r["g"] for r in rows] == list(range(1, i + 2))
            with Step(f"{at}: prepare"):
                if triple is None:
                    triple = await conn.prepare("SELECT $1::int * 3")
                assert await triple.fetchval(i) == i * 3
            await asyncpg_distinct(conn, c, i, at)
            with Step(f"{at}: long"):
                assert await conn.fetchval(LONG_QUERY, i) == i + 1
            with Step(f"{at}: pid"):
                pids.add(await conn.fetchval("SELECT pg_backend_pid()"))
            with Step(f"{at}: copy"):  # the rows and CopyDone go out before PostgreSQL's CopyInResponse
                assert await conn.copy_records_to_table(table, records=[(-c, i, 3)]) == "COPY 1"
            v = c * 1000 + i
            with Step(f"{at}: transaction"):
                async with conn.transaction():
                    await conn.executemany(f"INSERT INTO {table} (client, iter, v) VALUES ($1, $2, $3)",
                                           [(c, i, v), (-c, i, 1), (-c, i, 2)])
                    assert await conn.fetchval(f"SELECT count(*) FROM {table} WHERE client = $1", c) == i + 1
                    # a cursor: a portal read 3 rows at a time
                    got = [r["g"] async for r in conn.cursor("SELECT g FROM generate_series(1, $1::int) g", 10 + i,
                                                             prefetch=3)]
                    assert got == list(range(1, 11 + i))
            total += v
            if i == 7:
                with Step(f"{at}: cancel"):
                    with pytest.raises(asyncio.TimeoutError):  # asyncpg sends a cancel request
                        async with conn.transaction():
                            await conn.fetchval("SELECT 1")  # the client holds its server from here
                            await conn.fetchval("SELECT pg_sleep(5)", timeout=0.5)
            if i % 3 == 2:
                with Step(f"{at}: failing transaction"):
                    with pytest.raises(asyncpg.DivisionByZeroError):
                        async with conn.transaction():
                            await conn.execute(f"INSERT INTO {table} (client, iter, v) VALUES ($1, $2, $3)",
                                               c, i, 1_000_000)
                            await conn.fetchval("SELECT 1 / $1::int", 0)
        for i in range(ITERATIONS):  # again: the servers evicted most of them
            await asyncpg_distinct(conn, c, i, f"again, iteration {i}")
        with Step("final sums"):
            assert await conn.fetchval(f"SELECT coalesce(sum(v), 0)::int FROM {table} WHERE client = $1",
                                       c) == total
            assert await conn.fetchval(f"SELECT count(*) FROM {table} WHERE client = $1", -c) == 3 * ITERATIONS
        return pids
    finally:
        await conn.close(timeout=10)
