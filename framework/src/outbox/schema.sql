-- The kjob transactional outbox: kjob::outbox::Outbox::migrate and
-- `kjob outbox migrate` run exactly this text, with the configured table
-- name (default kjob_outbox) filled in, followed by the SQL enqueue
-- functions (sql_api.sql). Idempotent: safe on every deploy.

CREATE TABLE IF NOT EXISTS {table} (
    -- Relay order. Assigned while the inserting transaction holds its key's
    -- advisory lock (see the kjob::outbox module docs), so for one key the
    -- id order is the commit order. Across keys it means nothing.
    id          bigserial   PRIMARY KEY,
    -- Hash bucket of the key (0..63). Relays divide the work by bucket.
    bucket      smallint    NOT NULL,
    -- kjob-id, assigned at insert, so a republished row keeps its id and
    -- consumers (kjob::idempotency::PgMarkers) recognise the duplicate.
    job_id      text        NOT NULL,
    topic       text        NOT NULL,
    key         text        NOT NULL,
    -- Confluent-framed Avro: exactly the bytes Producer::enqueue would send
    -- (rows written by Outbox::enqueue). NULL for a JSON job.
    payload     bytea,
    -- A JSON job (rows written by kjob.enqueue): the relay encodes it to
    -- Avro against the topic's registered contract. Exactly one of payload
    -- and payload_json is set.
    payload_json jsonb,
    -- When the job is to run; NULL or past: now. A future run_at goes to
    -- the route's delay topics (kjob::delay).
    run_at      timestamptz,
    -- The subject version a JSON job is encoded against; NULL: the latest.
    schema_version integer,
    -- The record headers (kjob-job, kjob-version, kjob-id, kjob-attempt,
    -- kjob-tenant, traceparent) as a JSON object of strings.
    headers     jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- When the broker acknowledged (acks=all). NULL: not published yet.
    sent_at     timestamptz,
    -- Failed publish attempts; the row (and the rest of its key) waits until
    -- retry_at. last_error says why.
    attempts    integer     NOT NULL DEFAULT 0,
    retry_at    timestamptz,
    last_error  text,
    CONSTRAINT {name}_one_payload CHECK ((payload IS NULL) <> (payload_json IS NULL))
);

-- Tables made by kjob versions before JSON jobs: add the columns once. The
-- catalog check first, so the migration run on every deploy takes no
-- ACCESS EXCLUSIVE lock on a live table once they exist. The constraint is
-- NOT VALID (existing rows all have a payload; new rows are checked).
DO $kjob_migrate$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_attribute
        WHERE attrelid = '{table}'::regclass AND attname = 'payload_json' AND NOT attisdropped
    ) THEN
        ALTER TABLE {table}
            ADD COLUMN payload_json jsonb,
            ADD COLUMN run_at timestamptz,
            ADD COLUMN schema_version integer,
            ALTER COLUMN payload DROP NOT NULL,
            ADD CONSTRAINT {name}_one_payload
                CHECK ((payload IS NULL) <> (payload_json IS NULL)) NOT VALID;
    END IF;
END
$kjob_migrate$;

-- The relay's work queue: unsent rows in id order.
CREATE INDEX IF NOT EXISTS {name}_unsent ON {table} (id) WHERE sent_at IS NULL;

-- Keys held back after a failed publish (normally empty).
CREATE INDEX IF NOT EXISTS {name}_failing ON {table} (key, id)
    WHERE sent_at IS NULL AND retry_at IS NOT NULL;
