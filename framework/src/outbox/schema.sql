-- The kjob transactional outbox: kjob::outbox::Outbox::migrate and
-- `kjob outbox migrate` run exactly this text, with the configured table
-- name (default kjob_outbox) filled in. Idempotent: safe on every deploy.

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
    -- Confluent-framed Avro: exactly the bytes Producer::enqueue would send.
    payload     bytea       NOT NULL,
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
    last_error  text
);

-- The relay's work queue: unsent rows in id order.
CREATE INDEX IF NOT EXISTS {name}_unsent ON {table} (id) WHERE sent_at IS NULL;

-- Keys held back after a failed publish (normally empty).
CREATE INDEX IF NOT EXISTS {name}_failing ON {table} (key, id)
    WHERE sent_at IS NULL AND retry_at IS NOT NULL;
