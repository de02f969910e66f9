"""Enqueue kjob jobs from Python with psycopg 3, inside the app's transaction.

Run by tests/tests/polyglot.rs; see tests/polyglot/README.md for the protocol.
"""
import json
import os

import psycopg
from psycopg.types.json import Jsonb

url = os.environ["KJOB_DATABASE_URL"]
schema = os.environ["KJOB_SQL_SCHEMA"]
topic = os.environ["KJOB_TEST_TOPIC"]
orders = os.environ["KJOB_APP_TABLE"]
seq = int(os.environ["KJOB_TEST_SEQ"])


def job(key, n, bad=False):
    # A bad job carries its seq as a string: the contract says long.
    return {"key": key, "seq": str(n) if bad else n, "behaviour": "ok"}


enqueue = f"SELECT {schema}.enqueue(topic => %s, key => %s, job => %s)"
out = {}
with psycopg.connect(url) as conn:
    # 1. Committed: the order and its jobs together.
    with conn.transaction():
        conn.execute(f"INSERT INTO {orders} (order_id, lang) VALUES (%s, 'python')", (f"o{seq}",))
        a = conn.execute(enqueue, (topic, "py-a", Jsonb(job("py-a", seq)))).fetchone()[0]
        b = conn.execute(enqueue, (topic, "py-b", Jsonb(job("py-b", seq + 1)))).fetchone()[0]
        batch = [{"key": "py-a", "job": job("py-a", seq + 2)}, {"key": "py-c", "job": job("py-c", seq + 3)}]
        many = conn.execute(f"SELECT {schema}.enqueue_many(%s, %s)", (topic, Jsonb(batch))).fetchone()[0]
    out["committed"] = [a, b] + list(many)

    # 2. Rolled back: neither the order nor its jobs.
    rolled = []
    try:
        with conn.transaction():
            conn.execute(f"INSERT INTO {orders} (order_id, lang) VALUES (%s, 'python')", (f"o{seq + 10}",))
            rolled.append(conn.execute(enqueue, (topic, "py-r", Jsonb(job("py-r", seq + 10)))).fetchone()[0])
            rolled += conn.execute(
                f"SELECT {schema}.enqueue_many(%s, %s)",
                (topic, Jsonb([{"key": "py-r", "job": job("py-r", seq + 11)}])),
            ).fetchone()[0]
            raise RuntimeError("payment declined")
    except RuntimeError:
        pass
    out["rolled_back"] = rolled

    # 3. A job that does not fit the contract (seq a string), then a good
    #    one of the same key: the first is dead-lettered, the second runs.
    with conn.transaction():
        out["bad"] = conn.execute(enqueue, (topic, "py-bad", Jsonb(job("py-bad", seq + 20, bad=True)))).fetchone()[0]
        out["bad_follower"] = conn.execute(enqueue, (topic, "py-bad", Jsonb(job("py-bad", seq + 21)))).fetchone()[0]

    # 4. Delayed: runs no earlier than run_at.
    with conn.transaction():
        row = conn.execute(
            f"SELECT {schema}.enqueue(topic => %s, key => %s, job => %s, run_at => now() + interval '2 seconds'),"
            " (extract(epoch FROM now() + interval '2 seconds') * 1000)::bigint",
            (topic, "py-d", Jsonb(job("py-d", seq + 30))),
        ).fetchone()
        out["delayed"], out["delayed_run_at_ms"] = row[0], row[1]

    # An insert-time check fails the statement (and so the transaction).
    try:
        with conn.transaction():
            conn.execute(enqueue, (topic, "py-x", Jsonb([1, 2])))
        out["insert_error"] = None
    except psycopg.errors.InvalidParameterValue as e:
        out["insert_error"] = str(e)

print(json.dumps(out))
