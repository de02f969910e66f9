//! The transactional outbox: enqueue a job in the same PostgreSQL
//! transaction as the business change, and let a relay publish it.
//!
//! A web request that commits an order and *then* enqueues the confirmation
//! mail loses the mail when the enqueue fails; one that enqueues first sends
//! a mail for an order that was rolled back. [`Outbox::enqueue`] writes the
//! job (Confluent-framed Avro, encoded by the same [`Codec`] the
//! [`Producer`](crate::Producer) uses, plus its `kjob-*` headers) into the
//! `kjob_outbox` table **inside the caller's transaction**: the job exists
//! if and only if the order does. A [`Relay`] publishes committed rows with
//! `acks=all` and marks them sent only after the broker acknowledged.
//!
//! ```text
//! let tx = client.transaction().await?;
//! tx.execute("INSERT INTO orders (id, email) VALUES ($1, $2)", &[&id, &email]).await?;
//! outbox.enqueue(&tx, &SendOrderConfirmation { order_id: id.clone(), .. }).await?;
//! tx.commit().await?;   // order and job together, or neither
//! ```
//!
//! **Applications not written in Rust** enqueue with one SQL call inside
//! their own transaction, `SELECT kjob.enqueue(topic => ..., key => ...,
//! job => '{...}'::jsonb)`, which [`migrate`] installs: same table, same key
//! lock, same relay, the JSON encoded by the relay against the topic's
//! registered contract. See [`sql_api`].
//!
//! # Per-key commit order
//!
//! Kafka consumers see a key's jobs in partition order, so the relay must
//! publish a key's jobs in the order their transactions **committed**. A
//! `bigserial` alone does not give that: transaction A takes id 10, B takes
//! id 11 and commits first; a relay that sees B's row (and not yet A's)
//! publishes 11, then 10.
//!
//! kjob makes the id order the commit order per key. [`Outbox::enqueue`]
//! takes a transaction-scoped advisory lock on the key's hash
//! (`pg_advisory_xact_lock(table class, hash(key))`) and only then draws the
//! row's id, in the same statement. The lock is held until the inserting
//! transaction ends, so a second transaction enqueueing for the same key
//! waits until the first has committed (or rolled back) before it draws its
//! id. Hence, per key: a larger id belongs to a transaction that committed
//! later, and any snapshot that sees a key's row with id *n* also sees every
//! committed row of that key below *n*. The relay reads unsent rows in id
//! order, which is a per-key prefix of the commit order.
//!
//! The alternatives were worse here: ordering by `pg_current_xact_id()`
//! (xid8) orders by transaction *start*, not commit; snapshot-xmin fencing
//! only guarantees "no gaps below", still not commit order; logical decoding
//! (Debezium) gives true commit order but needs a replication slot and
//! `wal_level=logical`.
//!
//! What it costs, and what to do about it:
//! * Transactions that enqueue for the **same key** run their remainder one
//!   after another (different keys never wait, barring a 1-in-2³¹ hash
//!   collision). Enqueue last, right before `COMMIT`, so the lock is short.
//! * A transaction that enqueues for several keys can deadlock with another
//!   that takes the same keys in the opposite order; PostgreSQL aborts one of
//!   them (SQLSTATE `40P01`) after `deadlock_timeout`. Enqueue a
//!   transaction's jobs in a stable order (say, sorted by key), or retry the
//!   transaction on `40P01` like any serialization failure.
//!
//! # The relay
//!
//! * **Publishing**: rows are read in id order, produced with the kjob
//!   [`Producer`](crate::Producer) settings (`acks=all`, idempotence) plus
//!   `enable.gapless.guarantee` and no local message timeout, and marked sent
//!   (or deleted, with a zero retention) only after every acknowledgement
//!   of the batch arrived. A key's rows are marked only up to its first
//!   failure; the failed row is retried with backoff and holds the rest of its
//!   key back, so a later row never overtakes it. While the broker is away the
//!   batch simply waits (rows stay in PostgreSQL; nothing is dropped) and a
//!   `stalled` publish error is counted every 10 s. Why no timeout: in
//!   librdkafka's idempotent producer, a queued message that times out is
//!   skipped while later ones are still sent, which would let a key's later
//!   row land before an earlier one; `enable.gapless.guarantee` (marked
//!   experimental by librdkafka, which logs a `CONFWARN` for it) turns the
//!   remaining gap-prone errors into a fatal error, after which the relay
//!   starts a fresh producer and republishes.
//! * **A row the broker will never take** (larger than the topic's
//!   `max.message.bytes`, a topic that does not exist while auto-creation is
//!   off) is retried with backoff (up to a minute apart) and holds its key
//!   back; other keys flow. Its refusal makes the producer fatal (gapless
//!   guarantee), and rows of other keys that failed only because of that
//!   are sent again at once by a fresh producer, without a backoff. A
//!   failed row is retried alone for its key (the rows behind it wait).
//!   **Caveat:** the *first* time a row is refused, a later row of the same
//!   key that was in the same batch can still reach Kafka (librdkafka may
//!   deliver a request queued behind the refused one before the fatal error
//!   stops the producer). The relay keeps one request in flight and retries
//!   a failed row alone, which removed the overtaking the tests saw before
//!   (3 of 9 runs, all on retries that carried the next row along); it has
//!   not been seen since, but nothing in librdkafka rules it out. Per-key
//!   commit order therefore holds for every row that can be published; a
//!   row the broker refuses for good may be overtaken by its successors.
//!   `kjob outbox status` counts it as failing and shows the error. Fix the
//!   cause, or delete the row (`DELETE FROM kjob_outbox WHERE id = ...`);
//!   the key then moves on.
//! * **Duplicates, never losses**: a relay killed after the broker's ack but
//!   before marking republishes the row. It keeps its `kjob-id`, so
//!   [`PgMarkers`](crate::idempotency::PgMarkers) recognises it; and since
//!   every relay publishes a per-key prefix in id order, the *first*
//!   occurrences of a key's jobs in Kafka are still in commit order.
//! * **Waking**: `enqueue` calls `pg_notify` (delivered at commit only); the
//!   relay `LISTEN`s and also polls every [`Relay::poll_interval`], so a lost
//!   notification or a disabled one ([`Outbox::notify`]) costs latency, not
//!   jobs.
//! * **Several relays**: rows carry a bucket (hash of the key, 0..63). A
//!   relay publishes only buckets it holds a session advisory lock on; each
//!   holds about 64 / (live relays) of them and hands surplus buckets back
//!   between batches, so relays share the load, a bucket (hence a key) is
//!   only ever relayed by one of them at a time, and a crashed relay's
//!   buckets are taken over as soon as PostgreSQL ends its session. Relay
//!   sessions show as `kjob-relay <table>` in `pg_stat_activity`; a lost
//!   session is reconnected with backoff (its unmarked rows are published
//!   again, with the same `kjob-id`).
//! * **Retention**: sent rows are kept for [`Relay::retention`] (default one
//!   hour: enough to answer "was job X published, when?") and then deleted in
//!   batches by the relay holding bucket 0. `Duration::ZERO` deletes rows as
//!   soon as they are acknowledged (least table churn).
//!
//! # The table
//!
//! [`migration_sql`] is the one definition (`framework/src/outbox/schema.sql`);
//! [`Outbox::migrate`] and `kjob outbox migrate` apply it, and
//! `kjob outbox migrate --print` prints it for your own migration tool.
//!
//! # Observability
//!
//! See [`OutboxMetrics`]: `kjob_outbox_lag_seconds` (age of the oldest unsent
//! row), `kjob_outbox_published_total` (rate it for rows/s),
//! `kjob_outbox_publish_errors_total{reason}`, `kjob_outbox_unsent`,
//! `kjob_outbox_buckets_held`, `kjob_outbox_relays`. `kjob outbox status` and
//! `kjob status --database-url` show the same from the database.

mod connection;
mod delivery;
mod metrics;
mod prepare;
mod relay;
mod rows;
pub mod sql_api;

use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;
use rdkafka::message::Headers as _;
use serde::Serialize;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, GenericClient, Transaction};

pub use metrics::OutboxMetrics;
pub use relay::{Relay, RelayStats};

use crate::codec::Codec;
use crate::config::KafkaConfig;
use crate::job::Job;
use crate::producer::{prepare_job, PreparedJob};

/// The default outbox table.
pub const DEFAULT_TABLE: &str = "kjob_outbox";

/// Number of key-hash buckets relays divide the work into. Fixed: every
/// row stores its bucket, so relays never recompute it.
pub const BUCKETS: i16 = 64;

const SCHEMA_SQL: &str = include_str!("schema.sql");

/// Advisory-lock object id of the "relay present" lock (shared mode), so
/// relays can count each other. Bucket locks use 0..BUCKETS.
pub(crate) const PRESENCE_LOCK: i32 = -1;

/// Advisory-lock object id (with the relay class) that migrations before
/// [`crate::ddl`] serialised on; still taken, for mixed-version deploys.
const MIGRATION_LOCK: i32 = -2;

/// What can go wrong in the outbox. Each variant says what to do.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// Registry, encoding or Kafka errors, as everywhere in kjob.
    #[error(transparent)]
    Kjob(#[from] crate::Error),
    /// The table is missing.
    #[error("outbox table `{table}` does not exist: run `kjob outbox migrate --database-url <url> --table {table}` (or call `Outbox::migrate`) first")]
    NotMigrated {
        /// The configured table.
        table: String,
    },
    /// A PostgreSQL call failed; `context` says which.
    #[error("PostgreSQL: {context}: {}", describe(.source))]
    Database {
        /// What kjob was doing.
        context: String,
        /// The driver's error (its SQLSTATE tells retryable from not).
        #[source]
        source: tokio_postgres::Error,
    },
    /// A setting is invalid.
    #[error("invalid outbox configuration: {0}")]
    Config(String),
}

impl OutboxError {
    pub(crate) fn db(context: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> Self {
        let context = context.into();
        move |source| OutboxError::Database { context, source }
    }
}

/// The server's message and SQLSTATE when there is one: tokio-postgres'
/// own `Display` says only "db error".
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

/// FNV-1a, 64 bit: stable across processes, versions and platforms (unlike
/// `std`'s hasher), which bucket and lock ids must be.
pub(crate) fn fnv64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn positive_i32(h: u64) -> i32 {
    // 31 bits: advisory lock keys are int4; positive keeps pg_locks readable.
    (h & 0x7fff_ffff) as i32
}

/// The bucket (0..[`BUCKETS`]) a key is relayed in.
pub fn bucket_of(key: &str) -> i16 {
    (fnv64(key.as_bytes()) % BUCKETS as u64) as i16
}

/// A validated outbox table name and the lock ids and channel derived from
/// it, so two outbox tables in one database never share locks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxTable {
    name: String,
    unqualified: String,
    channel: String,
    key_class: i32,
    relay_class: i32,
    functions: String,
}

impl OutboxTable {
    /// `name` is a plain table name with an optional `schema.` prefix
    /// (letters, digits, `_`; folded to lower case like PostgreSQL does).
    pub fn new(name: &str) -> Result<Self, OutboxError> {
        let name = name.to_ascii_lowercase();
        let parts: Vec<&str> = name.split('.').collect();
        let valid = parts.len() <= 2
            && parts.iter().all(|p| {
                !p.is_empty()
                    && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && !p.starts_with(|c: char| c.is_ascii_digit())
            });
        if !valid || name.len() > 100 {
            return Err(OutboxError::Config(format!(
                "`{name}` is not a plain table name (letters, digits, `_`, optionally `schema.table`)"
            )));
        }
        let unqualified = parts.last().copied().unwrap_or(DEFAULT_TABLE).to_string();
        if unqualified.len() > 50 {
            return Err(OutboxError::Config(format!(
                "table name `{unqualified}` is too long for its index names (50 characters at most)"
            )));
        }
        Ok(Self {
            channel: name.replace('.', "__"),
            key_class: positive_i32(fnv64(format!("kjob:key:{name}").as_bytes())),
            relay_class: positive_i32(fnv64(format!("kjob:relay:{name}").as_bytes())),
            functions: sql_api::default_schema(&name),
            unqualified,
            name,
        })
    }

    /// Installs the SQL enqueue functions ([`sql_api`]) into schema `name`
    /// instead of the default (`kjob` for [`DEFAULT_TABLE`], `kjob_<table>`
    /// for any other table, so each table's functions write to it alone).
    pub fn with_functions_schema(mut self, name: &str) -> Result<Self, OutboxError> {
        self.functions = sql_api::validate_schema(name)?;
        Ok(self)
    }

    /// The schema holding this table's SQL enqueue functions
    /// (`<schema>.enqueue`, `<schema>.enqueue_many`).
    pub fn functions_schema(&self) -> &str {
        &self.functions
    }

    /// The (possibly schema-qualified) table name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The `LISTEN`/`NOTIFY` channel.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// Advisory-lock class of the relays' bucket locks (pg_locks `classid`).
    pub fn relay_class(&self) -> i32 {
        self.relay_class
    }

    /// Advisory-lock class of the per-key enqueue locks: a transaction
    /// waiting on another one's key shows up in `pg_locks` with this
    /// `classid`.
    pub fn key_class(&self) -> i32 {
        self.key_class
    }
}

impl Default for OutboxTable {
    fn default() -> Self {
        // The constant is valid by construction.
        Self::new(DEFAULT_TABLE).unwrap_or_else(|_| unreachable!("default table name is valid"))
    }
}

/// The migration for `table`: the text of `schema.sql` with the table name
/// filled in, then the SQL enqueue functions of [`sql_api`]. Idempotent.
pub fn migration_sql(table: &OutboxTable) -> String {
    let tables = SCHEMA_SQL
        .replace("{table}", &table.name)
        .replace("{name}", &table.unqualified);
    format!("{tables}\n{}", sql_api::sql(table))
}

/// Applies [`migration_sql`] in one transaction, serialised so deploys that
/// migrate concurrently do not race on `CREATE` (see [`crate::ddl`]).
///
/// It holds kjob's DDL lock, which is one key for every table: a lock per
/// table name let `app.kjob_outbox` and `kjob_outbox` (with `app` on the
/// search path), one table spelled two ways, be created at once. It also
/// still takes the per-table lock earlier kjob versions take alone, so a
/// rolling deploy that mixes versions stays serialised.
pub async fn migrate(client: &Client, table: &OutboxTable) -> Result<(), OutboxError> {
    let sql = format!(
        "SELECT pg_advisory_xact_lock({}, {MIGRATION_LOCK});\n{}",
        table.relay_class,
        migration_sql(table)
    );
    crate::ddl::create_serialised(client, &sql)
        .await
        .map_err(OutboxError::db(format!(
            "migrating outbox table `{}`",
            table.name
        )))
}

/// Where an outbox job was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxEnqueued {
    /// The job id (`kjob-id`) the record will carry, however often it is
    /// published.
    pub id: String,
    /// The row id: the relay order within the job's key.
    pub row: i64,
    /// The topic the relay will publish to.
    pub topic: String,
}

/// Writes jobs into the outbox table inside the caller's transaction.
/// Cheap to clone; share one per process (it caches registered schemas).
#[derive(Clone, Debug)]
pub struct Outbox {
    codec: Arc<Codec>,
    table: OutboxTable,
    notify: bool,
    insert_sql: Arc<str>,
}

fn insert_sql(table: &OutboxTable, notify: bool) -> String {
    // One round trip: lock the key, (queue the wake-up), then insert; the
    // id default is evaluated after the lock was granted.
    let wake = if notify {
        ", wake AS (SELECT pg_notify($3, ''))"
    } else {
        ""
    };
    let from = if notify { "lock, wake" } else { "lock" };
    format!(
        "WITH lock AS (SELECT pg_advisory_xact_lock($1, $2)){wake}
         INSERT INTO {t} (bucket, job_id, topic, key, payload, headers)
         SELECT $4, $5, $6, $7, $8, $9 FROM {from}
         RETURNING id",
        t = table.name
    )
}

impl Outbox {
    /// An outbox encoding against the registry in `config`, writing to
    /// [`DEFAULT_TABLE`].
    pub fn new(config: &KafkaConfig) -> Result<Self, OutboxError> {
        Ok(Self::with_codec(Arc::new(Codec::new(
            &config.schema_registry_url,
        )?)))
    }

    /// An outbox sharing a registry client (for example
    /// [`Producer::codec`](crate::Producer::codec)), so both encode with the
    /// same registered schema ids.
    pub fn with_codec(codec: Arc<Codec>) -> Self {
        let table = OutboxTable::default();
        Self {
            codec,
            insert_sql: insert_sql(&table, true).into(),
            notify: true,
            table,
        }
    }

    /// Writes to `name` instead of `kjob_outbox` (one table per service, or
    /// per test).
    pub fn table(mut self, name: &str) -> Result<Self, OutboxError> {
        self.table = OutboxTable::new(name)?;
        self.insert_sql = insert_sql(&self.table, self.notify).into();
        Ok(self)
    }

    /// Whether enqueue sends a `NOTIFY` (default on). A committing
    /// transaction that notified takes a brief global lock, which can limit
    /// very high commit rates; off, relays find rows by polling.
    pub fn notify(mut self, yes: bool) -> Self {
        self.notify = yes;
        self.insert_sql = insert_sql(&self.table, yes).into();
        self
    }

    /// The table this outbox writes to.
    pub fn outbox_table(&self) -> &OutboxTable {
        &self.table
    }

    /// Creates the table if needed (see [`migrate`]).
    pub async fn migrate(&self, client: &Client) -> Result<(), OutboxError> {
        migrate(client, &self.table).await
    }

    /// Writes `job` for its main topic (`J::NAME`) inside `tx`. It is
    /// published after `tx` commits, and never if `tx` rolls back.
    ///
    /// Holds the key's lock until `tx` ends (see the module docs): enqueue
    /// as the last step before `COMMIT`.
    pub async fn enqueue<J: Job>(
        &self,
        tx: &Transaction<'_>,
        job: &J,
    ) -> Result<OutboxEnqueued, OutboxError> {
        self.enqueue_to(tx, J::NAME, job).await
    }

    /// [`Outbox::enqueue`] to an explicit topic.
    pub async fn enqueue_to<J: Job>(
        &self,
        tx: &Transaction<'_>,
        topic: &str,
        job: &J,
    ) -> Result<OutboxEnqueued, OutboxError> {
        let PreparedJob {
            payload,
            id,
            headers,
            span,
        } = prepare_job(
            &self.codec,
            topic,
            job,
            "create",
            None,
            Some(KeyValue::new("kjob.outbox", self.table.name.clone())),
            None,
        )
        .await?;
        let mut map = serde_json::Map::new();
        for h in headers.to_owned_headers().iter() {
            let value = h.value.map(String::from_utf8_lossy).unwrap_or_default();
            map.insert(h.key.to_string(), serde_json::Value::String(value.into()));
        }
        let headers = serde_json::Value::Object(map);
        let key = job.key();
        let bucket = bucket_of(&key);
        let key_lock = positive_i32(fnv64(key.as_bytes()));
        let row = tx
            .query_typed_one(
                &self.insert_sql,
                &[
                    (&self.table.key_class, Type::INT4),
                    (&key_lock, Type::INT4),
                    (&self.table.channel, Type::TEXT),
                    (&bucket, Type::INT2),
                    (&id, Type::TEXT),
                    (&topic, Type::TEXT),
                    (&key, Type::TEXT),
                    (&payload, Type::BYTEA),
                    (&headers, Type::JSONB),
                ],
            )
            .await;
        let row = match row {
            Ok(row) => row,
            Err(e) => {
                span.fail("database", &e.to_string());
                if e.code() == Some(&SqlState::UNDEFINED_TABLE) {
                    return Err(OutboxError::NotMigrated {
                        table: self.table.name.clone(),
                    });
                }
                return Err(OutboxError::db(format!(
                    "writing `{}` to outbox table `{}`",
                    J::NAME,
                    self.table.name
                ))(e));
            }
        };
        let row: i64 = row
            .try_get(0)
            .map_err(OutboxError::db("reading the row id"))?;
        Ok(OutboxEnqueued {
            id,
            row,
            topic: topic.to_string(),
        })
    }
}

/// The outbox as an operator sees it (`kjob outbox status`, `kjob status`).
#[derive(Clone, Debug, Serialize)]
pub struct OutboxStatus {
    /// Table name.
    pub table: String,
    /// Rows not yet published.
    pub unsent: i64,
    /// Of those, rows for the topic asked about.
    pub unsent_for_topic: Option<i64>,
    /// Age of the oldest unsent row, seconds (0 when none): the relay lag.
    pub oldest_unsent_seconds: f64,
    /// Unsent rows whose last publish attempt failed.
    pub failing: i64,
    /// The most recent publish error of a failing row.
    pub last_error: Option<String>,
    /// Rows the relay dead-lettered (JSON jobs that did not fit their
    /// contract, class `outbox.encode`) among the sent rows still kept
    /// ([`crate::outbox::Relay`]'s retention, 1 h by default): what
    /// `kjob dlq list --class outbox.encode` lists, counted at the source.
    pub dead_lettered: i64,
    /// Relays connected now (holding the presence lock).
    pub relays: i64,
    /// Rows published per second over the sampling interval (approximate:
    /// ids drawn by rolled-back transactions count as published).
    pub published_per_second: f64,
}

async fn sample<C: GenericClient>(
    client: &C,
    table: &OutboxTable,
    topic: Option<&str>,
) -> Result<(i64, Option<i64>, f64, i64, i64), OutboxError> {
    let row = client
        .query_one(
            &format!(
                "SELECT count(*),
                        count(*) FILTER (WHERE topic = $1),
                        coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)::float8,
                        count(*) FILTER (WHERE retry_at IS NOT NULL),
                        coalesce(pg_sequence_last_value(pg_get_serial_sequence($2, 'id')::regclass), 0)
                 FROM {} WHERE sent_at IS NULL",
                table.name
            ),
            &[&topic.unwrap_or(""), &table.name],
        )
        .await
        .map_err(|e| {
            if e.code() == Some(&SqlState::UNDEFINED_TABLE) {
                OutboxError::NotMigrated {
                    table: table.name.clone(),
                }
            } else {
                OutboxError::db(format!("reading outbox table `{}`", table.name))(e)
            }
        })?;
    let get = |i: usize| -> Result<i64, OutboxError> {
        row.try_get(i)
            .map_err(OutboxError::db("reading outbox status"))
    };
    let age: f64 = row
        .try_get(2)
        .map_err(OutboxError::db("reading outbox status"))?;
    Ok((
        get(0)?,
        topic.map(|_| get(1)).transpose()?,
        age,
        get(3)?,
        get(4)?,
    ))
}

/// Relays holding the presence lock of `table` now.
pub async fn live_relays<C: GenericClient>(
    client: &C,
    table: &OutboxTable,
) -> Result<i64, OutboxError> {
    let row = client
        .query_one(
            "SELECT count(DISTINCT pid) FROM pg_locks
             WHERE locktype = 'advisory' AND classid::bigint = $1
               AND objid::bigint = $2 AND objsubid = 2",
            &[
                &i64::from(table.relay_class),
                &i64::from(PRESENCE_LOCK as u32),
            ],
        )
        .await
        .map_err(OutboxError::db("counting relays in pg_locks"))?;
    row.try_get(0)
        .map_err(OutboxError::db("counting relays in pg_locks"))
}

/// Reads the outbox status, sampling the publish rate over `interval`.
pub async fn read_status<C: GenericClient>(
    client: &C,
    table: &OutboxTable,
    topic: Option<&str>,
    interval: Duration,
) -> Result<OutboxStatus, OutboxError> {
    let (unsent_a, _, _, _, last_a) = sample(client, table, topic).await?;
    let started = Instant::now();
    tokio::time::sleep(interval).await;
    let (unsent, for_topic, age, failing, last) = sample(client, table, topic).await?;
    let secs = started.elapsed().as_secs_f64().max(1e-3);
    let published = ((last - unsent) - (last_a - unsent_a)).max(0);
    let last_error = client
        .query_opt(
            &format!(
                "SELECT last_error FROM {} WHERE sent_at IS NULL AND retry_at IS NOT NULL
                 ORDER BY id DESC LIMIT 1",
                table.name
            ),
            &[],
        )
        .await
        .map_err(OutboxError::db("reading the last publish error"))?
        .and_then(|r| r.try_get::<_, Option<String>>(0).ok().flatten());
    let dead_lettered: i64 = client
        .query_one(
            &format!(
                "SELECT count(*) FROM {} WHERE sent_at IS NOT NULL
                 AND starts_with(last_error, $1)",
                table.name
            ),
            &[&prepare::DEAD_LETTER_NOTE],
        )
        .await
        .and_then(|r| r.try_get(0))
        .map_err(OutboxError::db("counting dead-lettered outbox rows"))?;
    Ok(OutboxStatus {
        table: table.name.clone(),
        unsent,
        unsent_for_topic: for_topic,
        oldest_unsent_seconds: age,
        failing,
        dead_lettered,
        last_error,
        relays: live_relays(client, table).await?,
        published_per_second: published as f64 / secs,
    })
}

#[cfg(test)]
mod tests;
