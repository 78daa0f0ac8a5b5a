// node-postgres with named queries ({name, text, values}): each is prepared
// once per connection under the given name, so all clients use the same
// names, through the pooler; a client that leaves inside a transaction; and
// pipeline mode with DISCARD ALL ahead of named queries.
//
// Environment: PGHOST PGPORT PGUSER PGPASSWORD PGDATABASE, DRV_CLIENTS
// concurrent connections, DRV_ITERATIONS per connection, DRV_SHARED=1: fail
// unless some server backend served two clients. Exits non-zero on any error
// or wrong result.
'use strict';
const { Client } = require('pg');

const TABLE = 'drv_node';
const LONG_QUERY = `SELECT $1::int + 1 AS n /* ${'long '.repeat(40000)}*/`;
const clients = parseInt(process.env.DRV_CLIENTS || '10', 10);
const iterations = parseInt(process.env.DRV_ITERATIONS || '20', 10);
const mustShare = process.env.DRV_SHARED === '1';

function check(what, got, want) {
  if (JSON.stringify(got) !== JSON.stringify(want)) {
    throw new Error(`${what}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
  }
}

// Runs a named query (a simple one without a name); an error names the query and carries PostgreSQL's SQLSTATE.
async function q(conn, what, name, text, values) {
  try {
    return await conn.query(name ? { name, text, values } : text);
  } catch (e) {
    throw new Error(`${what}: ${e.message}${e.code ? ` (SQLSTATE ${e.code})` : ''}`);
  }
}

// 3 named queries whose text is this client's and iteration's own: 600 in all
// with 10 clients x 20 iterations, more than the servers keep
// (max_prepared_statements = 200 each).
async function distinct(conn, c, i, at) {
  for (let j = 0; j < 3; j++) {
    const k = c * 1000 + i * 10 + j;
    const r = await q(conn, `${at}: distinct ${k}`, `d${k}`, `SELECT $1::int + ${k} AS n`, [i]);
    check(`${at}: distinct ${k}`, r.rows[0].n, k + i);
  }
}

// A client that leaves inside a transaction (an INSERT, then Terminate
// without COMMIT): the pooler must roll it back before it lends the server
// again, so the row inserted here must never show.
async function abandon(c, i) {
  const other = new Client();
  await other.connect();
  await q(other, 'abandon: BEGIN', null, 'BEGIN');
  await q(other, 'abandon: insert', 'insert', `INSERT INTO ${TABLE} (client, iter, v) VALUES ($1, $2, $3)`, [c, i, 1000000]);
  await other.end();
}

// node-postgres's pipeline mode sends DISCARD ALL and the named queries behind
// it at once, one of a text the servers have already ('add', which every
// client prepares): PostgreSQL runs the command first, so what the queries
// behind it prepare stays, and later runs of them (a Bind, no Parse) work.
async function pipelined(c) {
  const conn = new Client({ pipeline: true });
  await conn.connect();
  try {
    const sent = [
      q(conn, 'pipeline: slow', null, 'SELECT pg_sleep(0.05)'), // the rest is sent before DISCARD ALL is answered
      q(conn, 'pipeline: DISCARD ALL', null, 'DISCARD ALL'),
      q(conn, 'pipeline: add', 'add', 'SELECT $1::int + $2::int AS n', [c, 1]),
      q(conn, 'pipeline: own', `own${c}`, `SELECT $1::int * ${c} AS n`, [2]),
    ];
    const [, , add, own] = await Promise.all(sent);
    check('pipeline: add', add.rows[0].n, c + 1);
    check('pipeline: own', own.rows[0].n, 2 * c);
    const again = await Promise.all([
      q(conn, 'pipeline: add again', 'add', 'SELECT $1::int + $2::int AS n', [c, 2]),
      q(conn, 'pipeline: own again', `own${c}`, `SELECT $1::int * ${c} AS n`, [3]),
    ]);
    check('pipeline: again', again.map((r) => r.rows[0].n), [c + 2, 3 * c]);
  } finally {
    await conn.end();
  }
}

async function client(c, pids) {
  const conn = new Client();
  await conn.connect();
  try {
    let sum = 0;
    for (let i = 0; i < iterations; i++) {
      const at = `iteration ${i}`;
      let r = await q(conn, `${at}: add`, 'add', 'SELECT $1::int + $2::int AS n', [c, i]);
      check(`${at}: add`, r.rows[0].n, c + i);
      r = await q(conn, `${at}: concat`, 'concat', "SELECT $1::text || '-' || $2::text AS s", [`c${c}`, `${i}`]);
      check(`${at}: concat`, r.rows[0].s, `c${c}-${i}`);
      r = await q(conn, `${at}: series`, 'series', 'SELECT g FROM generate_series(1, $1::int) g', [i + 1]);
      check(`${at}: series`, r.rows.map((row) => row.g), Array.from({ length: i + 1 }, (_, k) => k + 1));
      await distinct(conn, c, i, at);
      r = await q(conn, `${at}: long`, 'long', LONG_QUERY, [i]); // longer than the pooler's packet buffer
      check(`${at}: long`, r.rows[0].n, i + 1);
      r = await q(conn, `${at}: pid`, 'pid', 'SELECT pg_backend_pid() AS pid', []);
      pids.add(r.rows[0].pid);

      // a transaction: named queries inside it, then COMMIT
      const v = c * 1000 + i;
      await q(conn, `${at}: BEGIN`, null, 'BEGIN'); // simple protocol
      try {
        await q(conn, `${at}: insert`, 'insert', `INSERT INTO ${TABLE} (client, iter, v) VALUES ($1, $2, $3)`, [c, i, v]);
        r = await q(conn, `${at}: count`, 'count', `SELECT count(*)::int AS n FROM ${TABLE} WHERE client = $1`, [c]);
        check(`${at}: count`, r.rows[0].n, i + 1);
        await q(conn, `${at}: COMMIT`, null, 'COMMIT');
      } catch (e) {
        await conn.query('ROLLBACK').catch(() => {});
        throw e;
      }
      sum += v;
      if (i === 7) await abandon(c, i);
    }
    await pipelined(c);
    // the distinct statements again: the servers evicted most of them
    for (let i = 0; i < iterations; i++) await distinct(conn, c, i, `again, iteration ${i}`);
    const r = await q(conn, 'final sum', 'sum', `SELECT coalesce(sum(v), 0)::int AS s FROM ${TABLE} WHERE client = $1`, [c]);
    check('final sum', r.rows[0].s, sum);
  } finally {
    await conn.end();
  }
}

async function main() {
  const setup = new Client();
  await setup.connect();
  await setup.query(`DROP TABLE IF EXISTS ${TABLE}`);
  await setup.query(`CREATE TABLE ${TABLE} (client int, iter int, v int)`);
  await setup.end();

  const seen = []; // per client: the backend pids it saw
  const runs = [];
  for (let c = 1; c <= clients; c++) {
    seen[c] = new Set();
    runs.push(client(c, seen[c]).catch((e) => { throw new Error(`client ${c}: ${e.message}`); }));
  }
  const failed = (await Promise.allSettled(runs)).filter((r) => r.status === 'rejected');
  for (const f of failed) console.error(f.reason.message);
  if (failed.length) throw new Error(`${failed.length} of ${clients} clients failed`);
  const users = new Map(); // backend pid -> how many clients it served
  for (const pids of seen.slice(1)) for (const p of pids) users.set(p, (users.get(p) || 0) + 1);
  const shared = [...users.values()].filter((n) => n > 1).length;
  if (mustShare && shared === 0) {
    throw new Error(`no server backend served two clients (${users.size} backends): the servers were not shared`);
  }
  console.log(`node-postgres: ${clients} clients x ${iterations} iterations ok, ${users.size} server backends, `
    + `${shared} of them served several clients`);
}

const timer = setTimeout(() => { console.error('node-postgres: timed out after 5 minutes'); process.exit(1); }, 300000);
main().then(() => clearTimeout(timer), (e) => {
  console.error(`node-postgres: ${e.message}`);
  process.exit(1);
});
