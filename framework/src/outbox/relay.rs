//! The relay: publishes committed outbox rows in per-key commit order.
//! The design (ordering, buckets, retention) is in the [module docs](super).

use super::connection::{drive, pg_config, refresh_gauges, AbortOnDrop};
use std::collections::{BTreeSet, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use rand::seq::SliceRandom;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use tokio::sync::Notify;
use tokio_postgres::{Client, NoTls};
use tokio_util::sync::CancellationToken;

use super::delivery::{collateral, plan, Pending, Plan, RowFate};
use super::metrics::OutboxMetrics;
use super::prepare::{prepare, Prepared};
use super::rows::{Row, Statements};
use super::{live_relays, OutboxError, OutboxTable, BUCKETS, PRESENCE_LOCK};
use crate::codec::Codec;
use crate::config::KafkaConfig;
use crate::producer::{DelayTopicCheck, Producer, DEFAULT_DELIVERY_TIMEOUT};

/// librdkafka settings the relay adds to the kjob producer's (`acks=all`,
/// idempotence). A user's [`KafkaConfig::set`] still wins.
///
/// * No local message timeout: PostgreSQL is the buffer, the relay never
///   gives up on a row; and a locally timed-out message is exactly what
///   would open a gap (a later row of the key landing before an earlier
///   one) in librdkafka's idempotent producer.
/// * `enable.gapless.guarantee`: any other error that could leave a gap
///   becomes fatal; the relay then recreates the producer and republishes.
/// * One produce request in flight per connection: with several, a request
///   carrying a key's later row can be accepted while the one before it is
///   refused for good (say, too large for the topic), before the refusal has
///   made the producer fatal. One at a time, the fatal error comes first.
/// * Reconnect within a second once the broker is back.
const RELAY_DEFAULTS: &[(&str, &str)] = &[
    ("delivery.timeout.ms", "0"),
    ("enable.gapless.guarantee", "true"),
    ("reconnect.backoff.max.ms", "1000"),
    ("max.in.flight.requests.per.connection", "1"),
];

/// How long a batch may wait for acknowledgements before each `stalled`
/// error is counted and logged.
const STALL_WARNING: Duration = Duration::from_secs(10);

/// How often buckets are rebalanced between relays.
const REBALANCE_EVERY: Duration = Duration::from_secs(1);

/// How often sent rows past their retention are deleted.
const CLEANUP_EVERY: Duration = Duration::from_secs(30);

/// Rows deleted per cleanup statement (keeps each statement short).
const CLEANUP_CHUNK: i64 = 10_000;

/// Live counters of a relay, for tests, benchmarks and embedding programs.
#[derive(Debug, Default)]
pub struct RelayStats {
    /// Rows acknowledged by the broker and marked sent.
    pub published: AtomicU64,
    /// Rows whose publish failed (each failure counted once).
    pub publish_errors: AtomicU64,
    /// Batches published.
    pub batches: AtomicU64,
    /// Buckets this relay holds now.
    pub buckets_held: AtomicUsize,
    /// JSON rows that could not be encoded against their contract and
    /// were dead-lettered (class `outbox.encode`); also counted in
    /// `published` (the row is done).
    pub dead_lettered: AtomicU64,
}

/// Publishes outbox rows to Kafka. Run it in its own process
/// (`kjob outbox relay`), with a worker
/// ([`WorkerBuilder::outbox_relay`](crate::WorkerBuilder::outbox_relay)), or
/// anywhere with `tokio::spawn(relay.run_until(stop))`; several may run at
/// once.
pub struct Relay {
    database_url: String,
    kafka: KafkaConfig,
    table: OutboxTable,
    batch_size: i64,
    poll_interval: Duration,
    retention: Duration,
    metrics: OutboxMetrics,
    metrics_addr: Option<SocketAddr>,
    stats: Arc<RelayStats>,
    /// Encodes JSON rows (shared by every producer the relay makes, so
    /// fetched contracts survive a producer replacement). Made on first
    /// use: a bad registry URL fails the run, not the constructor.
    codec: Option<Arc<Codec>>,
    /// Checks delayed rows' delay topics, with the plain connection
    /// settings (the relay producer's own do not make an admin client).
    delay_topics: DelayTopicCheck,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The database URL may carry a password: never print it.
        f.debug_struct("Relay")
            .field("table", &self.table.name())
            .field("bootstrap", &self.kafka.bootstrap_servers)
            .field("batch_size", &self.batch_size)
            .field("poll_interval", &self.poll_interval)
            .field("retention", &self.retention)
            .finish_non_exhaustive()
    }
}

impl Relay {
    /// A relay for [`super::DEFAULT_TABLE`] in the database at
    /// `database_url` (a libpq-style URL or key-value string), publishing to
    /// the cluster in `kafka`.
    pub fn new(database_url: impl Into<String>, kafka: KafkaConfig) -> Self {
        let table = OutboxTable::default();
        Self {
            database_url: database_url.into(),
            delay_topics: DelayTopicCheck::new(&kafka),
            kafka,
            metrics: OutboxMetrics::disabled(table.name()),
            table,
            batch_size: 1000,
            poll_interval: Duration::from_millis(500),
            retention: Duration::from_secs(3600),
            metrics_addr: None,
            stats: Arc::default(),
            codec: None,
        }
    }

    /// Encodes JSON rows with `codec` (for example the worker's), sharing
    /// its registry client and cached contracts.
    pub fn with_codec(mut self, codec: Arc<Codec>) -> Self {
        self.codec = Some(codec);
        self
    }

    /// Relays `name` instead of `kjob_outbox` (it must match the
    /// [`super::Outbox::table`] the rows were written with).
    pub fn table(mut self, name: &str) -> Result<Self, OutboxError> {
        self.table = OutboxTable::new(name)?;
        if self.metrics_addr.is_none() {
            self.metrics = OutboxMetrics::disabled(self.table.name());
        }
        Ok(self)
    }

    /// Rows read and published per round trip (default 1000). Larger
    /// batches raise throughput; the commit-to-publish delay does not
    /// depend on it at moderate rates.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n.clamp(1, 100_000) as i64;
        self
    }

    /// How often the relay looks for rows without a notification (default
    /// 500 ms). Bounds the delay when notifications are off or lost.
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.poll_interval = d.max(Duration::from_millis(10));
        self
    }

    /// Publishes delayed rows to the shared delay buckets
    /// `<namespace>.delay.<bucket>`, as
    /// [`Producer::shared_delay_buckets`] does: for workers built with
    /// [`SharedTiers::delay_buckets`](crate::SharedTiers::delay_buckets).
    pub fn shared_delay_buckets(mut self, namespace: &str) -> Self {
        self.delay_topics.share(namespace);
        self
    }

    /// How long sent rows are kept (default 1 h); `Duration::ZERO` deletes
    /// them as soon as they are acknowledged.
    pub fn retention(mut self, d: Duration) -> Self {
        self.retention = d;
        self
    }

    /// Serves `/metrics` (Prometheus) and `/healthz` on `addr` while running.
    pub fn metrics_endpoint(mut self, addr: SocketAddr) -> Result<Self, OutboxError> {
        self.metrics = OutboxMetrics::prometheus(self.table.name())?;
        self.metrics_addr = Some(addr);
        Ok(self)
    }

    /// Records into `exporter`, shared with a worker or another relay of
    /// the process, so one `/metrics` serves them all
    /// ([`WorkerBuilder::metrics_exporter`](crate::WorkerBuilder::metrics_exporter)).
    /// A relay run by a worker ([`WorkerBuilder::outbox_relay`](crate::WorkerBuilder::outbox_relay))
    /// without an endpoint of its own does this by itself.
    pub fn metrics_exporter(mut self, exporter: crate::telemetry::MetricsExporter) -> Self {
        self.metrics = OutboxMetrics::on(&exporter, self.table.name());
        self
    }

    /// Whether this relay serves a `/metrics` of its own.
    pub fn has_metrics_endpoint(&self) -> bool {
        self.metrics_addr.is_some()
    }

    /// The relay's instruments and gauge values.
    pub fn metrics(&self) -> OutboxMetrics {
        self.metrics.clone()
    }

    /// Live counters.
    pub fn stats(&self) -> Arc<RelayStats> {
        self.stats.clone()
    }

    /// Runs until SIGTERM or SIGINT.
    pub async fn run(self) -> Result<(), OutboxError> {
        self.run_until(crate::worker::shutdown_signal()).await
    }

    /// Runs until `stop` completes. Rows in flight at that moment are left
    /// unmarked and published again by the next relay (same `kjob-id`).
    /// Database outages are retried with backoff; only a configuration error
    /// ends the relay early.
    pub async fn run_until<F: Future<Output = ()>>(self, stop: F) -> Result<(), OutboxError> {
        crate::telemetry::default_logs();
        let cancel = CancellationToken::new();
        let run = self.run_cancellable(cancel.clone());
        tokio::pin!(run);
        tokio::pin!(stop);
        tokio::select! {
            r = &mut run => r,
            () = &mut stop => {
                cancel.cancel();
                run.await
            }
        }
    }

    fn producer(&self, codec: &Arc<Codec>) -> Result<Producer, OutboxError> {
        let mut config = self.kafka.clone();
        for (k, v) in RELAY_DEFAULTS {
            config
                .overrides
                .entry((*k).to_string())
                .or_insert_with(|| (*v).to_string());
        }
        Ok(Producer::with_codec(
            &config,
            codec.clone(),
            DEFAULT_DELIVERY_TIMEOUT,
        )?)
    }

    async fn run_cancellable(mut self, cancel: CancellationToken) -> Result<(), OutboxError> {
        // The codec encodes JSON rows against the registry's contracts
        // (Avro rows hold finished payloads).
        let codec = match self.codec.take() {
            Some(codec) => codec,
            None => Arc::new(Codec::from_config(&self.kafka)?),
        };
        self.codec = Some(codec.clone());
        let mut producer = self.producer(&codec)?;
        let _endpoint_stop = cancel.clone().drop_guard();
        // Only set when `metrics_endpoint` built an exporter, which needs
        // the `metrics-http` feature.
        #[cfg(feature = "metrics-http")]
        if let Some(addr) = self.metrics_addr {
            let bound = crate::telemetry::http::serve(
                addr,
                self.metrics.exporter().clone(),
                std::sync::Arc::new(|| true),
                None,
                cancel.child_token(),
            )
            .await?;
            tracing::info!(%bound, "outbox relay metrics endpoint");
        }
        let gauges = tokio::spawn(refresh_gauges(
            self.database_url.clone(),
            self.table.clone(),
            self.metrics.clone(),
            cancel.child_token(),
        ));
        let _gauges = AbortOnDrop(gauges);
        tracing::info!(table = self.table.name(), "outbox relay started");
        let mut backoff = Duration::from_millis(100);
        loop {
            let began = Instant::now();
            match self.session(&mut producer, &cancel).await {
                Ok(()) => {
                    tracing::info!(table = self.table.name(), "outbox relay stopped");
                    return Ok(());
                }
                Err(e) => {
                    if began.elapsed() > Duration::from_secs(30) {
                        // A session that ran a while was healthy: a new
                        // failure starts the backoff from the beginning.
                        backoff = Duration::from_millis(100);
                    }
                    self.stats.buckets_held.store(0, Ordering::Relaxed);
                    self.metrics.update(|s| s.buckets_held = 0);
                    self.metrics.error("database", 1);
                    tracing::warn!(error = %e, retry_in = ?backoff, "outbox relay: database session failed; reconnecting");
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = cancel.cancelled() => return Ok(()),
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// One database session: its advisory locks live and die with it.
    async fn session(
        &self,
        producer: &mut Producer,
        cancel: &CancellationToken,
    ) -> Result<(), OutboxError> {
        let (client, connection) = pg_config(&self.database_url, &self.table)?
            .connect(NoTls)
            .await
            .map_err(OutboxError::db("connecting to the outbox database"))?;
        let wake = Arc::new(Notify::new());
        let _driver = AbortOnDrop(tokio::spawn(drive(connection, wake.clone())));
        client
            .batch_execute(&format!("LISTEN \"{}\"", self.table.channel()))
            .await
            .map_err(OutboxError::db("LISTEN on the outbox channel"))?;
        client
            .execute(
                "SELECT pg_advisory_lock_shared($1, $2)",
                &[&self.table.relay_class(), &PRESENCE_LOCK],
            )
            .await
            .map_err(OutboxError::db("taking the relay presence lock"))?;
        let s = Statements::prepare(&client, &self.table, self.retention.is_zero()).await?;
        let mut held: BTreeSet<i16> = BTreeSet::new();
        let mut next_rebalance = Instant::now();
        let mut next_cleanup = Instant::now() + CLEANUP_EVERY;
        loop {
            if cancel.is_cancelled() {
                // Hand buckets over now rather than when the session closes.
                let _ = client.execute("SELECT pg_advisory_unlock_all()", &[]).await;
                return Ok(());
            }
            if Instant::now() >= next_rebalance {
                self.rebalance(&client, &mut held).await?;
                next_rebalance = Instant::now() + REBALANCE_EVERY;
            }
            // One relay (whoever holds bucket 0) trims sent rows.
            if held.contains(&0) && !self.retention.is_zero() && Instant::now() >= next_cleanup {
                self.cleanup(&client, &s).await?;
                next_cleanup = Instant::now() + CLEANUP_EVERY;
            }
            let rows = if held.is_empty() {
                Vec::new()
            } else {
                let buckets: Vec<i16> = held.iter().copied().collect();
                client
                    .query(&s.select, &[&buckets, &self.batch_size])
                    .await
                    .map_err(OutboxError::db("reading unsent outbox rows"))?
            };
            if rows.is_empty() {
                let until_rebalance = next_rebalance.saturating_duration_since(Instant::now());
                tokio::select! {
                    () = wake.notified() => {}
                    () = tokio::time::sleep(self.poll_interval.min(until_rebalance.max(Duration::from_millis(10)))) => {}
                    () = cancel.cancelled() => {}
                }
                continue;
            }
            let batch = rows.iter().map(Row::read).collect::<Result<Vec<_>, _>>()?;
            let Some((fates, notes)) = self.publish(producer, &batch, cancel).await else {
                continue; // cancelled: unmarked rows go to the next relay
            };
            self.settle(&client, &s, producer, &batch, fates, notes)
                .await?;
        }
    }

    /// Takes free buckets up to a fair share and releases any surplus, so
    /// relays started later get work without anyone coordinating.
    async fn rebalance(
        &self,
        client: &Client,
        held: &mut BTreeSet<i16>,
    ) -> Result<(), OutboxError> {
        let relays = live_relays(client, &self.table).await?.max(1);
        let fair = (i64::from(BUCKETS) + relays - 1) / relays;
        let fair = usize::try_from(fair).unwrap_or(BUCKETS as usize);
        while held.len() > fair {
            let Some(b) = held.pop_last() else { break };
            client
                .execute(
                    "SELECT pg_advisory_unlock($1, $2)",
                    &[&self.table.relay_class(), &i32::from(b)],
                )
                .await
                .map_err(OutboxError::db("releasing an outbox bucket"))?;
        }
        if held.len() < fair {
            // Only buckets nobody holds are worth trying; random order, so
            // relays starting together do not all contend for the same ones.
            let free = client
                .query(
                    "SELECT b FROM generate_series(0, $2 - 1) AS b
                     WHERE NOT EXISTS (
                         SELECT 1 FROM pg_locks
                         WHERE locktype = 'advisory' AND classid::bigint = $1
                           AND objid::bigint = b AND objsubid = 2)",
                    &[&i64::from(self.table.relay_class()), &i32::from(BUCKETS)],
                )
                .await
                .map_err(OutboxError::db("listing free outbox buckets"))?;
            let mut free: Vec<i32> = free
                .iter()
                .filter_map(|r| r.try_get::<_, i32>(0).ok())
                .collect();
            free.shuffle(&mut rand::rng());
            for b in free {
                if held.len() >= fair {
                    break;
                }
                let row = client
                    .query_one(
                        "SELECT pg_try_advisory_lock($1, $2)",
                        &[&self.table.relay_class(), &b],
                    )
                    .await
                    .map_err(OutboxError::db("taking an outbox bucket"))?;
                if row.try_get::<_, bool>(0).unwrap_or(false) {
                    held.insert(b as i16);
                }
            }
        }
        self.stats.buckets_held.store(held.len(), Ordering::Relaxed);
        self.metrics.update(|s| {
            s.buckets_held = held.len() as i64;
            s.relays = relays;
        });
        Ok(())
    }

    /// Prepares each row ([`prepare`]: JSON encoded, delayed jobs to their
    /// delay topic, unencodable ones to the DLQ), produces the batch in id
    /// order and waits for every acknowledgement. Returns each row's
    /// fate and, for a dead letter, the note to leave on its row.
    /// `None` if cancelled meanwhile.
    async fn publish(
        &self,
        producer: &Producer,
        batch: &[Row],
        cancel: &CancellationToken,
    ) -> Option<(Vec<RowFate>, Vec<Option<String>>)> {
        let mut pending = Vec::with_capacity(batch.len());
        let mut notes = Vec::with_capacity(batch.len());
        let codec = producer.codec().clone();
        let now_ms = crate::clock::now_ms();
        // Keys with a row librdkafka refused to queue (say, too large), or
        // with a row being retried: their later rows are not sent in this
        // batch, so none lands before it.
        let mut refused: HashSet<&str> = HashSet::new();
        for row in batch {
            if refused.contains(row.key.as_str()) {
                pending.push(Pending::HeldBack);
                notes.push(None);
                continue;
            }
            if row.attempts > 0 {
                // A row that failed before is retried alone for its key: if
                // the broker refuses it again, librdkafka may still deliver
                // a request queued behind it before the fatal error stops
                // the producer, and that later row would land first.
                refused.insert(row.key.as_str());
            }
            let out = match prepare(row, &codec, &self.delay_topics, &self.table, now_ms).await {
                Prepared::Send(out) => out,
                Prepared::Defer(reason) => {
                    refused.insert(row.key.as_str());
                    pending.push(Pending::Deferred(reason));
                    notes.push(None);
                    continue;
                }
            };
            notes.push(out.dead_letter.clone());
            let mut headers = OwnedHeaders::new_with_capacity(out.headers.len());
            for (k, v) in &out.headers {
                headers = headers.insert(Header {
                    key: k.as_str(),
                    value: Some(v.as_bytes()),
                });
            }
            let mut record = FutureRecord::to(&out.topic)
                .key(row.key.as_bytes())
                .payload(out.payload.as_slice())
                .headers(headers);
            loop {
                match producer.raw().send_result(record) {
                    Ok(delivery) => {
                        pending.push(Pending::Sent(delivery));
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                        record = r;
                        tokio::select! {
                            () = tokio::time::sleep(Duration::from_millis(5)) => {}
                            () = cancel.cancelled() => return None,
                        }
                    }
                    Err((e, _)) => {
                        refused.insert(row.key.as_str());
                        pending.push(Pending::Refused(e.to_string()));
                        break;
                    }
                }
            }
        }
        let all = join_all(pending.into_iter().map(|p| async move {
            match p {
                Pending::Sent(delivery) => match delivery.await {
                    Ok(Ok(_)) => RowFate::Acked,
                    Ok(Err((e, _))) if collateral(&e) => RowFate::Collateral,
                    Ok(Err((e, _))) => RowFate::Failed(e.to_string()),
                    Err(_) => {
                        RowFate::Failed("the producer was dropped before acknowledging".to_string())
                    }
                },
                Pending::Refused(e) => RowFate::Failed(e),
                Pending::HeldBack => RowFate::HeldBack,
                Pending::Deferred(e) => RowFate::Deferred(e),
            }
        }));
        tokio::pin!(all);
        let started = Instant::now();
        let results = loop {
            tokio::select! {
                r = &mut all => break r,
                () = tokio::time::sleep(STALL_WARNING) => {
                    self.metrics.error("stalled", 1);
                    tracing::warn!(
                        rows = batch.len(),
                        waited = ?started.elapsed(),
                        bootstrap = %self.kafka.bootstrap_servers,
                        "outbox relay: no broker acknowledgement yet; rows stay in the outbox until the broker is reachable"
                    );
                }
                () = cancel.cancelled() => return None,
            }
        };
        Some((results, notes))
    }

    /// Marks what may be marked: per key, the rows up to its first failure.
    /// Failed rows get a backoff that holds their key back.
    async fn settle(
        &self,
        client: &Client,
        s: &Statements,
        producer: &mut Producer,
        batch: &[Row],
        fates: Vec<RowFate>,
        notes: Vec<Option<String>>,
    ) -> Result<(), OutboxError> {
        let Plan {
            done,
            failed,
            first_error,
            fresh_producer,
        } = plan(batch.iter().map(|r| (r.id, r.key.as_str())), fates);
        let done_set: HashSet<i64> = done.iter().copied().collect();
        let (noted, texts): (Vec<i64>, Vec<String>) = batch
            .iter()
            .zip(notes)
            .filter(|(r, _)| done_set.contains(&r.id))
            .filter_map(|(r, n)| n.map(|n| (r.id, n)))
            .unzip();
        if !noted.is_empty() {
            self.stats
                .dead_lettered
                .fetch_add(noted.len() as u64, Ordering::Relaxed);
            self.metrics.error("encode", noted.len() as u64);
            tracing::warn!(
                rows = noted.len(),
                first = texts.first().map_or("", String::as_str),
                "outbox relay: JSON jobs that do not fit their contract were dead-lettered"
            );
            if !self.retention.is_zero() {
                client
                    .execute(&s.note, &[&noted, &texts])
                    .await
                    .map_err(OutboxError::db("noting dead-lettered outbox rows"))?;
            }
        }
        if !done.is_empty() {
            client
                .execute(&s.mark, &[&done])
                .await
                .map_err(OutboxError::db("marking outbox rows sent"))?;
            self.stats
                .published
                .fetch_add(done.len() as u64, Ordering::Relaxed);
            self.metrics.published(done.len() as u64);
        }
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        if let Some(error) = first_error {
            self.stats
                .publish_errors
                .fetch_add(failed.len() as u64, Ordering::Relaxed);
            self.metrics.error("delivery", failed.len() as u64);
            tracing::warn!(rows = failed.len(), %error, "outbox relay: publish failed; retrying with backoff");
            client
                .execute(&s.fail, &[&failed, &error])
                .await
                .map_err(OutboxError::db("recording an outbox publish failure"))?;
        }
        if fresh_producer {
            // A failed delivery may have been fatal (gapless guarantee):
            // start from a fresh producer. Dropping the old one purges and
            // flushes (up to 500 ms): off the async runtime.
            let codec = producer.codec().clone();
            let old = std::mem::replace(producer, self.producer(&codec)?);
            tokio::task::spawn_blocking(move || drop(old));
        }
        Ok(())
    }

    async fn cleanup(&self, client: &Client, s: &Statements) -> Result<(), OutboxError> {
        let secs = self.retention.as_secs_f64();
        let mut deleted_total = 0;
        for _ in 0..100 {
            let n = client
                .execute(&s.cleanup, &[&secs, &CLEANUP_CHUNK])
                .await
                .map_err(OutboxError::db("deleting sent outbox rows past retention"))?;
            deleted_total += n;
            if n < CLEANUP_CHUNK as u64 {
                break;
            }
        }
        if deleted_total > 0 {
            tracing::debug!(rows = deleted_total, "outbox retention cleanup");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_shows_the_database_password() {
        let relay = Relay::new(
            "postgres://app:s3cret@db.internal/shop",
            KafkaConfig::new("k:9092", "http://r"),
        );
        let printed = format!("{relay:?}");
        assert!(!printed.contains("s3cret"), "{printed}");
        assert!(printed.contains("kjob_outbox"), "{printed}");
    }
}
