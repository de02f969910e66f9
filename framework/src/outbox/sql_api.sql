-- kjob's SQL enqueue for the outbox table {table}: {functions}.enqueue and
-- {functions}.enqueue_many, callable from any language's PostgreSQL driver
-- inside the application's own transaction. Installed by
-- kjob::outbox::migrate and `kjob outbox migrate` right after the table
-- (schema.sql). Idempotent: CREATE OR REPLACE on every deploy.
--
-- The guarantees are Outbox::enqueue's (see the kjob::outbox docs):
--  * the row exists if and only if the caller's transaction commits;
--  * per key, relay order is commit order: the key's advisory lock
--    pg_advisory_xact_lock({key_class}, fnv1a64(key) & 0x7fffffff), the
--    same lock the Rust path takes, is held before the row id is drawn;
--  * kjob-id is assigned here, so a republished row is a known duplicate.

CREATE SCHEMA IF NOT EXISTS {functions};

-- FNV-1a, 64 bit, of the key's UTF-8 bytes: kjob::outbox's fnv64, from
-- which the key lock and the bucket are derived. PostgreSQL's bigint
-- arithmetic refuses to overflow, so the product is computed in 32-bit
-- halves: h * 0x100000001b3 = h * 435 + (h << 40), mod 2^64.
CREATE OR REPLACE FUNCTION {functions}.fnv1a64(data bytea) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
    lo bigint := 2216829733;  -- 0x84222325, low half of the offset basis
    hi bigint := 3421674724;  -- 0xcbf29ce4, high half
    l bigint;
BEGIN
    FOR i IN 0 .. length(data) - 1 LOOP
        lo := lo # get_byte(data, i);
        l := lo * 435;
        hi := (hi * 435 + (l >> 32) + (lo << 8)) & 4294967295;
        lo := l & 4294967295;
    END LOOP;
    RETURN (hi << 32) | lo;
END
$fn$;

-- A UUIDv7 (RFC 9562: 48-bit Unix milliseconds, version 7, random rest),
-- the kind of id kjob's producers assign, from gen_random_uuid() (core
-- since PostgreSQL 13): its first 6 bytes replaced by the time, its version
-- nibble turned from 4 into 7. No extension needed.
CREATE OR REPLACE FUNCTION {functions}.uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $fn$
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$fn$;

-- What is wrong with one job, in words that say what to pass instead, or
-- NULL. The checks that need no registry; the rest (does the job fit the
-- contract, is the topic a route) the relay finds out, and a job that
-- fails them is dead-lettered with class outbox.encode.
CREATE OR REPLACE FUNCTION {functions}.problem(
    topic text, key text, job jsonb, run_at timestamptz, version integer, headers jsonb)
RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS $fn$
SELECT CASE
    WHEN topic IS NULL OR topic = '' THEN
        'topic is empty: pass the route''s main topic, e.g. ''orders.confirmation'''
    WHEN length(topic) > 249 OR topic !~ '^[A-Za-z0-9._-]+$' THEN
        format('topic %L is not a Kafka topic name (letters, digits, ".", "_" and "-", at most 249)', topic)
    WHEN topic ~ '\.(dlq|dlq\.audit|order)$' OR topic ~ '\.(retry|delay)\.[^.]+$' THEN
        format('topic %L is one of kjob''s own topics (a DLQ, retry tier, delay topic or order log): pass the route''s main topic', topic)
    WHEN key IS NULL OR key = '' THEN
        'key is empty: pass the job''s key (jobs with one key run in order), e.g. the order id'
    WHEN job IS NULL THEN
        'job is NULL: pass the job as a JSON object, e.g. ''{"order_id": "4711"}''::jsonb'
    WHEN jsonb_typeof(job) <> 'object' THEN
        format('job must be a JSON object (the fields of the route''s contract), got %s %s', jsonb_typeof(job), left(job::text, 60))
    WHEN version IS NOT NULL AND version < 1 THEN
        format('version %s is not a subject version (1, 2, ...): pass NULL for the latest', version)
    WHEN run_at > clock_timestamp() + interval '30 days' THEN
        format('run_at %s is more than 30 days ahead, the longest delay kjob accepts: enqueue it later (or from a cron schedule)', run_at)
    WHEN headers IS NOT NULL AND jsonb_typeof(headers) <> 'object' THEN
        'headers must be a JSON object of strings, e.g. ''{"traceparent": "00-..."}''::jsonb'
    WHEN headers IS NOT NULL AND EXISTS (
            SELECT 1 FROM jsonb_each(headers) h WHERE jsonb_typeof(h.value) <> 'string') THEN
        'headers must be a JSON object of strings: every value a string'
    WHEN headers IS NOT NULL AND EXISTS (
            SELECT 1 FROM jsonb_object_keys(headers) k
            WHERE k IN ('kjob-id', 'kjob-attempt', 'kjob-tenant', 'kjob-run-at', 'kjob-due-at')) THEN
        'headers cannot set kjob-id, kjob-attempt, kjob-tenant, kjob-run-at or kjob-due-at: kjob sets them (pass tenant => ... and run_at => ...)'
END
$fn$;

-- The two functions that write rows name the table, schema-qualified as
-- this migration resolved it, so the caller's search_path does not matter.
-- One schema holds the functions of one outbox table: the schema's comment
-- says which, and migrating another table into it is refused.
DO $kjob_api$
DECLARE
    target text;
    bound text;
BEGIN
    SELECT format('%I.%I', n.nspname, c.relname) INTO target
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = '{table}'::regclass;
    bound := obj_description('{functions}'::regnamespace, 'pg_namespace');
    IF bound LIKE 'kjob SQL enqueue for outbox table %'
       AND bound <> 'kjob SQL enqueue for outbox table ' || target THEN
        RAISE EXCEPTION 'schema {functions} already holds the SQL enqueue of another outbox table (%)', bound
            USING HINT = 'install this table''s functions into another schema: kjob outbox migrate --table {table} --sql-schema <name>';
    END IF;

    EXECUTE replace($body$
CREATE OR REPLACE FUNCTION {functions}.enqueue(
    topic text, key text, job jsonb,
    run_at timestamptz DEFAULT NULL, tenant text DEFAULT NULL,
    version integer DEFAULT NULL, headers jsonb DEFAULT NULL)
RETURNS text LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_variable
DECLARE
    problem text := {functions}.problem(topic, key, job, run_at, version, headers);
    h bigint;
    id text;
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = '{functions}.enqueue: ' || problem;
    END IF;
    h := {functions}.fnv1a64(convert_to(key, 'UTF8'));
    id := {functions}.uuid_v7()::text;
    -- The key's lock before the row id is drawn (see the file's head).
    PERFORM pg_advisory_xact_lock({key_class}, (h & 2147483647)::integer);
    INSERT INTO @TABLE@ (bucket, job_id, topic, key, payload_json, headers, run_at, schema_version)
    VALUES ((h & 63)::smallint, id, topic, key, job,
            coalesce(headers, '{}'::jsonb)
                || jsonb_build_object('kjob-id', id, 'kjob-attempt', '1')
                || CASE WHEN tenant IS NULL THEN '{}'::jsonb
                        ELSE jsonb_build_object('kjob-tenant', tenant) END,
            run_at, version);
    PERFORM pg_notify('{channel}', '');
    RETURN id;
END
$fn$;

CREATE OR REPLACE FUNCTION {functions}.enqueue_many(topic text, jobs jsonb)
RETURNS text[] LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_variable
DECLARE
    bad record;
    items jsonb[];
    hashes bigint[];
    ids text[];
    lock_id integer;
BEGIN
    IF jobs IS NULL OR jsonb_typeof(jobs) <> 'array' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = '{functions}.enqueue_many: jobs must be a JSON array of objects like {"key": "4711", "job": {...}, "run_at": null, "tenant": null, "version": null, "headers": null}';
    END IF;
    IF jsonb_array_length(jobs) = 0 THEN
        RETURN '{}'::text[];
    END IF;
    SELECT c.i, c.reason INTO bad FROM (
        SELECT t.i, CASE
            WHEN jsonb_typeof(t.e) <> 'object' THEN 'is not an object'
            WHEN EXISTS (SELECT 1 FROM jsonb_object_keys(t.e) k
                         WHERE k NOT IN ('key', 'job', 'run_at', 'tenant', 'version', 'headers')) THEN
                'has a field other than key, job, run_at, tenant, version and headers'
            WHEN jsonb_typeof(t.e -> 'key') IS DISTINCT FROM 'string' THEN 'key must be a string'
            WHEN coalesce(jsonb_typeof(t.e -> 'run_at'), 'null') NOT IN ('string', 'null') THEN
                'run_at must be a timestamp string (ISO 8601, e.g. "2030-01-31T10:00:00Z") or null'
            WHEN coalesce(jsonb_typeof(t.e -> 'tenant'), 'null') NOT IN ('string', 'null') THEN
                'tenant must be a string or null'
            WHEN coalesce(jsonb_typeof(t.e -> 'version'), 'null') NOT IN ('number', 'null')
                 OR (jsonb_typeof(t.e -> 'version') = 'number' AND (t.e ->> 'version')::numeric % 1 <> 0) THEN
                'version must be a whole number or null'
            ELSE {functions}.problem(topic, t.e ->> 'key', t.e -> 'job',
                    (t.e ->> 'run_at')::timestamptz, (t.e ->> 'version')::numeric::integer,
                    nullif(t.e -> 'headers', 'null'::jsonb))
        END AS reason
        FROM jsonb_array_elements(jobs) WITH ORDINALITY AS t(e, i)
    ) c WHERE c.reason IS NOT NULL ORDER BY c.i LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('{functions}.enqueue_many: jobs[%s] %s', bad.i - 1, bad.reason);
    END IF;
    SELECT array_agg(t.e ORDER BY t.i),
           array_agg({functions}.fnv1a64(convert_to(t.e ->> 'key', 'UTF8')) ORDER BY t.i)
    INTO items, hashes
    FROM jsonb_array_elements(jobs) WITH ORDINALITY AS t(e, i);
    -- Every key's lock before any row id is drawn, in one global order (by
    -- lock id), so two batches never deadlock each other.
    FOR lock_id IN SELECT DISTINCT (x & 2147483647)::integer FROM unnest(hashes) AS x ORDER BY 1 LOOP
        PERFORM pg_advisory_xact_lock({key_class}, lock_id);
    END LOOP;
    SELECT array_agg({functions}.uuid_v7()::text) INTO ids FROM unnest(items);
    INSERT INTO @TABLE@ (bucket, job_id, topic, key, payload_json, headers, run_at, schema_version)
    SELECT (u.h & 63)::smallint, u.id, topic, u.e ->> 'key', u.e -> 'job',
           coalesce(nullif(u.e -> 'headers', 'null'::jsonb), '{}'::jsonb)
               || jsonb_build_object('kjob-id', u.id, 'kjob-attempt', '1')
               || CASE WHEN u.e ->> 'tenant' IS NULL THEN '{}'::jsonb
                       ELSE jsonb_build_object('kjob-tenant', u.e ->> 'tenant') END,
           (u.e ->> 'run_at')::timestamptz, (u.e ->> 'version')::numeric::integer
    FROM unnest(items, hashes, ids) WITH ORDINALITY AS u(e, h, id, i)
    ORDER BY u.i;
    PERFORM pg_notify('{channel}', '');
    RETURN ids;
END
$fn$;
$body$, '@TABLE@', target);

    EXECUTE format('COMMENT ON SCHEMA {functions} IS %L', 'kjob SQL enqueue for outbox table ' || target);
END
$kjob_api$;
