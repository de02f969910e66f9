// Enqueue kjob jobs from Node with pg, inside the app's transaction.
// Run by tests/tests/polyglot.rs; see tests/polyglot/README.md for the protocol.
'use strict';
const { Client } = require('pg');

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`missing environment variable ${name}`);
  return v;
};
const schema = env('KJOB_SQL_SCHEMA');
const topic = env('KJOB_TEST_TOPIC');
const orders = env('KJOB_APP_TABLE');
const seq = Number(env('KJOB_TEST_SEQ'));

// A bad job carries its seq as a string: the contract says long.
const job = (key, n, bad = false) => ({ key, seq: bad ? String(n) : n, behaviour: 'ok' });

async function main() {
  const db = new Client({ connectionString: env('KJOB_DATABASE_URL') });
  await db.connect();
  const enqueue = async (key, body, runAt) => {
    const sql = runAt
      ? `SELECT ${schema}.enqueue(topic => $1, key => $2, job => $3::jsonb, run_at => now() + $4::interval) AS id,
                (extract(epoch FROM now() + $4::interval) * 1000)::bigint AS run_at_ms`
      : `SELECT ${schema}.enqueue(topic => $1, key => $2, job => $3::jsonb) AS id`;
    const params = [topic, key, JSON.stringify(body)];
    if (runAt) params.push(runAt);
    return (await db.query(sql, params)).rows[0];
  };
  const many = async (jobs) =>
    (await db.query(`SELECT ${schema}.enqueue_many($1, $2::jsonb) AS ids`, [topic, JSON.stringify(jobs)])).rows[0].ids;
  const out = {};

  // 1. Committed: the order and its jobs together.
  await db.query('BEGIN');
  await db.query(`INSERT INTO ${orders} (order_id, lang) VALUES ($1, 'node')`, [`o${seq}`]);
  const a = (await enqueue('js-a', job('js-a', seq))).id;
  const b = (await enqueue('js-b', job('js-b', seq + 1))).id;
  const m = await many([{ key: 'js-a', job: job('js-a', seq + 2) }, { key: 'js-c', job: job('js-c', seq + 3) }]);
  await db.query('COMMIT');
  out.committed = [a, b, ...m];

  // 2. Rolled back: neither the order nor its jobs.
  await db.query('BEGIN');
  await db.query(`INSERT INTO ${orders} (order_id, lang) VALUES ($1, 'node')`, [`o${seq + 10}`]);
  const r = [(await enqueue('js-r', job('js-r', seq + 10))).id];
  r.push(...(await many([{ key: 'js-r', job: job('js-r', seq + 11) }])));
  await db.query('ROLLBACK');
  out.rolled_back = r;

  // 3. A job that does not fit the contract, then a good one of the same key.
  await db.query('BEGIN');
  out.bad = (await enqueue('js-bad', job('js-bad', seq + 20, true))).id;
  out.bad_follower = (await enqueue('js-bad', job('js-bad', seq + 21))).id;
  await db.query('COMMIT');

  // 4. Delayed: runs no earlier than run_at.
  await db.query('BEGIN');
  const d = await enqueue('js-d', job('js-d', seq + 30), '2 seconds');
  await db.query('COMMIT');
  out.delayed = d.id;
  out.delayed_run_at_ms = Number(d.run_at_ms);

  // An insert-time check fails the statement (and so the transaction).
  await db.query('BEGIN');
  try {
    await enqueue('js-x', [1, 2]);
    out.insert_error = null;
  } catch (e) {
    out.insert_error = `${e.code}: ${e.message}`;
  }
  await db.query('ROLLBACK');

  await db.end();
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
