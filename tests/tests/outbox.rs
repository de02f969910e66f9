//! The transactional outbox against the real stack: PostgreSQL, Kafka and
//! the registry, with relays as child processes where the test kills them.
//!
//! Ground truth for "commit order" comes from the database itself, not from
//! the outbox: every writing transaction enqueues its jobs *first* and then
//! bumps a per-key counter row (`<table>_counters`) and records the value
//! next to the job id (`<table>_commits`). The counter's row lock is held to
//! commit, so per key the counter value is the commit order. Enqueueing
//! before the bump leaves a wide window in which, without the outbox's key
//! lock, row ids would be drawn in one order and commits happen in another.

use std::collections::{HashMap, HashSet};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kjob::outbox::{Outbox, Relay, RelayStats};
use kjob::KafkaConfig;
use kjob_integration_tests::*;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::SeedableRng;
use rdkafka::message::Message;
use tokio_postgres::{Client, NoTls};

async fn pg(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connecting to PostgreSQL");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// One test's own outbox table, topic and bookkeeping tables.
struct Fixture {
    url: String,
    config: KafkaConfig,
    table: String,
    topic: String,
    outbox: Outbox,
    client: Client,
}

impl Fixture {
    async fn new(partitions: i32) -> Self {
        init_logging();
        let url = ensure_postgres();
        let config = ensure_stack();
        let table = unique("kjob_outbox_t").replace('.', "_");
        let topic = unique("kjob.test.outbox");
        create_topic(&config, &topic, partitions).await;
        let client = pg(&url).await;
        let outbox = Outbox::new(&config)
            .expect("outbox")
            .table(&table)
            .expect("table name");
        outbox.migrate(&client).await.expect("migrating");
        client
            .batch_execute(&format!(
                "CREATE TABLE {table}_counters (key text PRIMARY KEY, n bigint NOT NULL DEFAULT 0);
                 CREATE TABLE {table}_commits (job_id text PRIMARY KEY, key text NOT NULL, n bigint NOT NULL);"
            ))
            .await
            .expect("creating bookkeeping tables");
        Self {
            url,
            config,
            table,
            topic,
            outbox,
            client,
        }
    }

    async fn keys(&self, n: usize) -> Vec<String> {
        let keys: Vec<String> = (0..n).map(|i| format!("key-{i:03}")).collect();
        self.client
            .execute(
                &format!(
                    "INSERT INTO {}_counters (key) SELECT unnest($1::text[])",
                    self.table
                ),
                &[&keys],
            )
            .await
            .expect("creating counters");
        keys
    }

    async fn count(&self, filter: &str) -> i64 {
        self.client
            .query_one(
                &format!("SELECT count(*) FROM {} WHERE {filter}", self.table),
                &[],
            )
            .await
            .expect("counting outbox rows")
            .get(0)
    }

    /// key -> job ids in commit order (from the counters, not the outbox).
    async fn commit_order(&self) -> HashMap<String, Vec<String>> {
        let rows = self
            .client
            .query(
                &format!(
                    "SELECT key, job_id FROM {}_commits ORDER BY key, n",
                    self.table
                ),
                &[],
            )
            .await
            .expect("reading commits");
        let mut out: HashMap<String, Vec<String>> = HashMap::new();
        for r in rows {
            out.entry(r.get(0)).or_default().push(r.get(1));
        }
        out
    }

    fn relay(&self) -> Relay {
        Relay::new(&self.url, self.config.clone())
            .table(&self.table)
            .expect("table name")
            .poll_interval(Duration::from_millis(100))
    }

    /// A relay process (`kjob outbox relay`), so it can be SIGKILLed.
    fn relay_process(&self) -> RelayProcess {
        let child = Command::new(env!("CARGO_BIN_EXE_kjob-cli"))
            .args([
                "outbox",
                "relay",
                "--database-url",
                &self.url,
                "--table",
                &self.table,
                "--poll-interval",
                "100ms",
            ])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("starting kjob outbox relay");
        RelayProcess(child)
    }

    async fn wait_all_sent(&self, timeout: Duration) {
        let start = Instant::now();
        loop {
            let unsent = self.count("sent_at IS NULL").await;
            if unsent == 0 {
                return;
            }
            assert!(
                start.elapsed() < timeout,
                "{unsent} outbox rows still unsent after {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn drop_tables(&self) {
        let t = &self.table;
        let _ = self
            .client
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {t}, {t}_counters, {t}_commits; DROP SCHEMA IF EXISTS {} CASCADE",
                self.outbox.outbox_table().functions_schema()
            ))
            .await;
    }
}

/// A relay child process, SIGKILLed when dropped, so a failing test does
/// not leave it running.
struct RelayProcess(Child);

impl RelayProcess {
    /// SIGKILL and reap.
    fn kill(&mut self) {
        self.0.kill().expect("SIGKILL"); // std's kill is SIGKILL
        self.0.wait().expect("reaping the relay");
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Writes `txs` transactions of `per_tx` jobs on distinct random keys.
/// Every `rollback_every`-th transaction rolls back. Returns the ids of
/// rolled-back jobs.
#[allow(clippy::too_many_arguments)]
async fn writer(
    url: String,
    outbox: Outbox,
    table: String,
    topic: String,
    keys: Arc<Vec<String>>,
    txs: usize,
    per_tx: usize,
    rollback_every: usize,
    seed: u64,
) -> Vec<String> {
    let mut client = pg(&url).await;
    let bump = client
        .prepare(&format!(
            "WITH c AS (UPDATE {table}_counters SET n = n + 1 WHERE key = $1 RETURNING n)
             INSERT INTO {table}_commits (job_id, key, n) SELECT $2, $1, n FROM c"
        ))
        .await
        .expect("preparing the counter bump");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut rolled_back = Vec::new();
    for t in 0..txs {
        let mut chosen: Vec<&String> = keys.choose_multiple(&mut rng, per_tx).collect();
        // One lock order for everyone: no deadlocks between writers.
        chosen.sort();
        let tx = client.transaction().await.expect("BEGIN");
        let mut ids = Vec::with_capacity(per_tx);
        for (i, key) in chosen.iter().enumerate() {
            let seq = (seed as i64) * 10_000_000 + (t * per_tx + i) as i64;
            let job = TestJob::ok(key.as_str(), seq);
            let at = outbox
                .enqueue_to(&tx, &topic, &job)
                .await
                .expect("enqueue in the transaction");
            ids.push((key.to_string(), at.id));
        }
        for (key, id) in &ids {
            tx.execute(&bump, &[key, id]).await.expect("counter bump");
        }
        if rollback_every > 0 && t % rollback_every == rollback_every - 1 {
            tx.rollback().await.expect("ROLLBACK");
            rolled_back.extend(ids.into_iter().map(|(_, id)| id));
        } else {
            tx.commit().await.expect("COMMIT");
        }
    }
    rolled_back
}

/// Runs `n` writers concurrently.
fn writers(
    fx: &Fixture,
    keys: &Arc<Vec<String>>,
    n: usize,
    txs: usize,
    per_tx: usize,
    rollback_every: usize,
) -> tokio::task::JoinHandle<Vec<String>> {
    let tasks: Vec<_> = (0..n)
        .map(|w| {
            tokio::spawn(writer(
                fx.url.clone(),
                fx.outbox.clone(),
                fx.table.clone(),
                fx.topic.clone(),
                keys.clone(),
                txs,
                per_tx,
                rollback_every,
                w as u64 + 1,
            ))
        })
        .collect();
    tokio::spawn(async move {
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("writer task"));
        }
        all
    })
}

/// What reached Kafka, checked against the commit order:
/// * every committed job is there, no rolled-back one is;
/// * per key, the first occurrences of job ids are in commit order;
/// * every duplicate is byte-identical to its first occurrence (same
///   `kjob-id`, key, payload).
///
/// Returns the number of duplicates.
fn verify(
    config: &KafkaConfig,
    topic: &str,
    expected: &HashMap<String, Vec<String>>,
    rolled_back: &[String],
) -> usize {
    let records = read_all(config, topic);
    // kjob-id -> (key, payload) of its first copy.
    type Body = (Option<Vec<u8>>, Option<Vec<u8>>);
    let mut first: HashMap<String, Body> = HashMap::new();
    let mut order: HashMap<String, Vec<String>> = HashMap::new();
    let mut duplicates = 0;
    for m in &records {
        let id = kjob::headers::find(m.headers(), kjob::headers::ID)
            .expect("every outbox record carries kjob-id")
            .to_string();
        assert_eq!(
            kjob::headers::find(m.headers(), kjob::headers::JOB),
            Some("kjob.test.job")
        );
        assert_eq!(
            kjob::headers::find(m.headers(), kjob::headers::VERSION),
            Some("1")
        );
        let key = String::from_utf8_lossy(m.key().unwrap_or_default()).to_string();
        let body = (m.key().map(<[u8]>::to_vec), m.payload().map(<[u8]>::to_vec));
        match first.get(&id) {
            Some(seen) => {
                duplicates += 1;
                assert_eq!(seen, &body, "duplicate of {id} differs from its first copy");
            }
            None => {
                first.insert(id.clone(), body);
                order.entry(key).or_default().push(id);
            }
        }
    }
    let rolled: HashSet<&String> = rolled_back.iter().collect();
    for ids in order.values() {
        for id in ids {
            assert!(!rolled.contains(id), "rolled-back job {id} was published");
        }
    }
    let committed: usize = expected.values().map(Vec::len).sum();
    assert_eq!(
        first.len(),
        committed,
        "distinct jobs in Kafka vs committed jobs"
    );
    for (key, want) in expected {
        let got = order.get(key).cloned().unwrap_or_default();
        if &got != want {
            let at = got
                .iter()
                .zip(want)
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(want.len()));
            panic!(
                "key {key}: Kafka order differs from commit order at position {at} \
                 ({} in Kafka, {} committed)",
                got.len(),
                want.len()
            );
        }
    }
    duplicates
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rollback_publishes_nothing_and_commit_publishes_exactly_its_jobs() {
    let mut fx = Fixture::new(3).await;
    let relay = fx.relay();
    let stats = relay.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run_until(async {
        let _ = stopped.await;
    }));

    let outbox = fx.outbox.clone();
    let topic = fx.topic.clone();
    let tx = fx.client.transaction().await.expect("BEGIN");
    for seq in 0..3 {
        outbox
            .enqueue_to(&tx, &topic, &TestJob::ok("rolled", seq))
            .await
            .expect("enqueue");
    }
    tx.rollback().await.expect("ROLLBACK");

    let tx = fx.client.transaction().await.expect("BEGIN");
    let mut ids = Vec::new();
    for seq in 10..15 {
        let at = outbox
            .enqueue_to(&tx, &topic, &TestJob::ok(format!("k{}", seq % 2), seq))
            .await
            .expect("enqueue");
        assert_eq!(at.topic, topic);
        ids.push((at.id, seq));
    }
    // Not visible to the relay before COMMIT.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(stats.published.load(Ordering::Relaxed), 0);
    tx.commit().await.expect("COMMIT");

    fx.wait_all_sent(Duration::from_secs(20)).await;
    assert_eq!(fx.count("true").await, 5, "the rollback left no rows");
    assert_eq!(stats.published.load(Ordering::Relaxed), 5);
    let _ = stop.send(());
    running
        .await
        .expect("relay task")
        .expect("relay stopped cleanly");

    let records = read_all(&fx.config, &fx.topic);
    assert_eq!(records.len(), 5, "exactly the committed jobs");
    let reader = kjob::codec::ReaderSchema::new(
        apache_avro::Schema::parse_str(<TestJob as kjob::Job>::SCHEMA).expect("schema"),
    );
    let codec = kjob::codec::Codec::new(&fx.config.schema_registry_url).expect("codec");
    let mut got = Vec::new();
    for m in &records {
        let job: TestJob = reader
            .decode(&codec, m.payload())
            .await
            .expect("the payload is Confluent-framed Avro of the contract");
        let id = kjob::headers::find(m.headers(), kjob::headers::ID)
            .expect("kjob-id")
            .to_string();
        assert_eq!(m.key(), Some(job.key.as_bytes()));
        assert_eq!(
            kjob::headers::find(m.headers(), kjob::headers::ATTEMPT),
            Some("1")
        );
        got.push((id, job.seq));
    }
    got.sort_by_key(|(_, seq)| *seq);
    assert_eq!(
        got, ids,
        "the kjob-id assigned at insert is the one published"
    );
    fx.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkilled_relay_loses_nothing_and_keeps_commit_order_per_key() {
    let fx = Fixture::new(6).await;
    // The table was created by the library; the CLI's migrate must accept
    // it as is (idempotent).
    let migrated = Command::new(env!("CARGO_BIN_EXE_kjob-cli"))
        .args([
            "outbox",
            "migrate",
            "--database-url",
            &fx.url,
            "--table",
            &fx.table,
        ])
        .output()
        .expect("running kjob outbox migrate");
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    let keys = Arc::new(fx.keys(100).await);
    // 6 writers x 800 transactions x 5 jobs, every 7th rolled back:
    // 20 580 committed jobs.
    let writing = writers(&fx, &keys, 6, 800, 5, 7);

    let mut kills = 0;
    let mut relay = fx.relay_process();
    let mut sent_before = 0;
    while kills < 5 {
        // Kill only once this relay made progress, so each kill lands while
        // rows are being relayed, a few milliseconds into a batch or so.
        let start = Instant::now();
        loop {
            let sent = fx.count("sent_at IS NOT NULL").await;
            if sent >= sent_before + 1500 {
                break;
            }
            assert!(
                !(writing.is_finished() && fx.count("sent_at IS NULL").await == 0),
                "the writers finished and everything was relayed before kill {}",
                kills + 1
            );
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "relay made no progress in 60 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(rand::random_range(0..40))).await;
        relay.kill();
        kills += 1;
        sent_before = fx.count("sent_at IS NOT NULL").await;
        let unsent = fx.count("sent_at IS NULL").await;
        assert!(
            !writing.is_finished() || unsent > 0,
            "kill {kills} came after all rows were relayed"
        );
        relay = fx.relay_process();
    }
    let rolled_back = writing.await.expect("writers");
    let committed = fx.count("true").await;
    assert!(committed >= 20_000, "{committed} rows committed");
    fx.wait_all_sent(Duration::from_secs(60)).await;
    relay.kill();

    let expected = fx.commit_order().await;
    assert_eq!(
        expected.values().map(Vec::len).sum::<usize>() as i64,
        committed
    );
    let duplicates = verify(&fx.config, &fx.topic, &expected, &rolled_back);
    println!(
        "{committed} jobs, {} rolled back, 5 relay kills, {duplicates} duplicates",
        rolled_back.len()
    );
    fx.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_relays_at_once_share_buckets_without_reordering_a_key() {
    let fx = Fixture::new(6).await;
    let keys = Arc::new(fx.keys(50).await);
    let start = |relay: Relay| -> (Arc<RelayStats>, tokio::sync::oneshot::Sender<()>, _) {
        let stats = relay.stats();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(relay.run_until(async {
            let _ = stopped.await;
        }));
        (stats, stop, task)
    };
    let (a, stop_a, task_a) = start(fx.relay().batch_size(200));
    let (b, stop_b, task_b) = start(fx.relay().batch_size(200));
    let rolled_back = writers(&fx, &keys, 4, 500, 4, 10).await.expect("writers");
    fx.wait_all_sent(Duration::from_secs(60)).await;
    // Each relay ends up with its fair share of the 64 buckets.
    eventually(Duration::from_secs(10), "buckets split 32/32", || {
        a.buckets_held.load(Ordering::Relaxed) == 32 && b.buckets_held.load(Ordering::Relaxed) == 32
    })
    .await;
    let (pa, pb) = (
        a.published.load(Ordering::Relaxed),
        b.published.load(Ordering::Relaxed),
    );
    assert!(pa > 0 && pb > 0, "both relays published ({pa}, {pb})");
    let _ = stop_a.send(());
    let _ = stop_b.send(());
    task_a.await.expect("relay a").expect("relay a stopped");
    task_b.await.expect("relay b").expect("relay b stopped");

    let expected = fx.commit_order().await;
    let duplicates = verify(&fx.config, &fx.topic, &expected, &rolled_back);
    assert_eq!(
        duplicates, 0,
        "bucket locks: no double publishing without a crash"
    );
    assert_eq!(
        (pa + pb) as usize,
        expected.values().map(Vec::len).sum::<usize>()
    );
    println!("relay a published {pa}, relay b {pb}");
    fx.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_down_for_20s_commits_still_succeed_and_the_relay_catches_up() {
    let mut fx = Fixture::new(3).await;
    // The relay reaches the broker only through a proxy this test cuts; the
    // shared broker itself keeps running for everyone else.
    let proxy = CutProxy::kafka(&fx.config.bootstrap_servers).await;
    let via_proxy = KafkaConfig::new(proxy.bootstrap(), &fx.config.schema_registry_url);
    let relay = Relay::new(&fx.url, via_proxy)
        .table(&fx.table)
        .expect("table")
        .poll_interval(Duration::from_millis(100))
        .metrics_endpoint("127.0.0.1:0".parse().expect("addr"))
        .expect("metrics");
    let metrics = relay.metrics();
    let stats = relay.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run_until(async {
        let _ = stopped.await;
    }));

    let outbox = fx.outbox.clone();
    let topic = fx.topic.clone();
    let mut seq = 0i64;
    // Broker up: the relay publishes through the proxy.
    for _ in 0..20 {
        seq += 1;
        request(&mut fx.client, &outbox, &topic, seq).await;
    }
    fx.wait_all_sent(Duration::from_secs(20)).await;
    assert_eq!(stats.published.load(Ordering::Relaxed), 20);

    // Broker down for 20 s while requests keep coming, 20 per second.
    proxy.cut();
    let outage = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut during = 0;
    while outage.elapsed() < Duration::from_secs(20) {
        seq += 1;
        slowest = slowest.max(request(&mut fx.client, &outbox, &topic, seq).await);
        during += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        slowest < Duration::from_millis(500),
        "enqueue+commit took {slowest:?} with the broker down"
    );
    assert_eq!(
        fx.count("sent_at IS NULL").await,
        during,
        "nothing published while the broker is down"
    );
    assert_eq!(
        try_end_offsets(&fx.config, &fx.topic, 3).map(|e| e.iter().sum::<i64>()),
        Some(20),
        "Kafka holds only the jobs from before the outage"
    );
    // The lag is visible: the gauge, the Prometheus text, and the CLI.
    let snap = metrics.read();
    assert!(snap.lag_seconds > 15.0, "lag gauge {}", snap.lag_seconds);
    let text = metrics.render().expect("metrics enabled");
    assert!(
        text.contains("kjob_outbox_publish_errors_total{reason=\"stalled\""),
        "{text}"
    );
    assert!(text.contains("kjob_outbox_lag_seconds"), "{text}");
    let status = Command::new(env!("CARGO_BIN_EXE_kjob-cli"))
        .args([
            "outbox",
            "status",
            "--json",
            "--database-url",
            &fx.url,
            "--table",
            &fx.table,
        ])
        .output()
        .expect("kjob outbox status");
    let status: serde_json::Value =
        serde_json::from_slice(&status.stdout).expect("status prints JSON");
    assert_eq!(status["unsent"], during);
    assert_eq!(status["relays"], 1);
    assert!(status["oldest_unsent_seconds"].as_f64().unwrap_or(0.0) > 15.0);
    // `kjob status` shows the outbox feeding the route.
    let route = Command::new(env!("CARGO_BIN_EXE_kjob-cli"))
        .args([
            "status",
            "--json",
            "--topic",
            &fx.topic,
            "--database-url",
            &fx.url,
            "--outbox-table",
            &fx.table,
        ])
        .output()
        .expect("kjob status");
    let route: serde_json::Value = serde_json::from_slice(&route.stdout).unwrap_or_else(|e| {
        panic!(
            "kjob status --json: {e}: {}",
            String::from_utf8_lossy(&route.stderr)
        )
    });
    assert_eq!(route["outbox"]["unsent_for_topic"], during);

    // The broker is back: the same relay catches up on its own.
    proxy.restore();
    let catching_up = Instant::now();
    fx.wait_all_sent(Duration::from_secs(30)).await;
    println!(
        "{during} jobs written during the outage, published {:?} after it ended",
        catching_up.elapsed()
    );
    assert_eq!(stats.published.load(Ordering::Relaxed), seq as u64);
    let _ = stop.send(());
    running.await.expect("relay task").expect("relay stopped");

    let records = read_all(&fx.config, &fx.topic);
    assert_eq!(records.len() as i64, seq, "every job exactly once");
    let mut last: HashMap<Vec<u8>, i64> = HashMap::new();
    for m in &records {
        // One writer commits in seq order, so per key seq must increase.
        let key = m.key().unwrap_or_default().to_vec();
        let s = decode_seq(m.payload().unwrap_or_default());
        if let Some(prev) = last.insert(key, s) {
            assert!(prev < s, "key order: {prev} then {s}");
        }
    }
    fx.drop_tables().await;
}

/// One web request: a job enqueued in its own transaction. Returns how long
/// BEGIN..COMMIT took.
async fn request(client: &mut Client, outbox: &Outbox, topic: &str, seq: i64) -> Duration {
    let t = Instant::now();
    let tx = client.transaction().await.expect("BEGIN");
    outbox
        .enqueue_to(&tx, topic, &TestJob::ok(format!("k{}", seq % 7), seq))
        .await
        .expect("enqueue");
    tx.commit().await.expect("the web transaction commits");
    t.elapsed()
}

/// The `seq` field of a framed TestJob (string key, then a zig-zag long).
fn decode_seq(framed: &[u8]) -> i64 {
    let schema = apache_avro::Schema::parse_str(<TestJob as kjob::Job>::SCHEMA).expect("schema");
    let (_, body) = kjob::codec::split_frame(Some(framed)).expect("framed");
    let job: TestJob = kjob::codec::decode_body(0, &schema, body, &schema).expect("decodes");
    job.seq
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_row_the_broker_refuses_holds_back_only_its_key() {
    let mut fx = Fixture::new(3).await;
    let relay = fx.relay();
    let stats = relay.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run_until(async {
        let _ = stopped.await;
    }));
    // 3 MB of random text: even lz4-compressed it stays above the topic's
    // max.message.bytes (1 MB by default), so the broker refuses it for good.
    let noise: String = {
        use rand::distr::{Alphanumeric, SampleString};
        Alphanumeric.sample_string(&mut rand::rng(), 3_000_000)
    };
    let outbox = fx.outbox.clone();
    let topic = fx.topic.clone();
    let tx = fx.client.transaction().await.expect("BEGIN");
    let poison = outbox
        .enqueue_to(&tx, &topic, &TestJob::with("poisoned", 1, &noise))
        .await
        .expect("enqueue");
    let behind = outbox
        .enqueue_to(&tx, &topic, &TestJob::ok("poisoned", 2))
        .await
        .expect("enqueue");
    let other = outbox
        .enqueue_to(&tx, &topic, &TestJob::ok("healthy", 3))
        .await
        .expect("enqueue");
    tx.commit().await.expect("COMMIT");

    let attempts = format!("id = {} AND attempts >= 2", poison.row);
    let start = Instant::now();
    while fx.count(&attempts).await == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the refused row was not retried"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        fx.count(&format!("id = {} AND sent_at IS NOT NULL", other.row))
            .await,
        1
    );
    assert_eq!(
        fx.count(&format!("id = {} AND sent_at IS NULL", behind.row))
            .await,
        1,
        "the row behind the refused one waits"
    );
    let ids = |records: &[rdkafka::message::OwnedMessage]| -> Vec<String> {
        records
            .iter()
            .filter_map(|m| kjob::headers::find(m.headers(), kjob::headers::ID).map(str::to_string))
            .collect()
    };
    // Let a few retries of the refused row go by: each goes alone for its
    // key, so the row behind it is not published meanwhile. (On the very
    // first attempt it may have been: see the caveat in `kjob::outbox`.)
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let during = ids(&read_all(&fx.config, &fx.topic));
    assert_eq!(
        during.iter().filter(|id| **id == other.id).count(),
        1,
        "the healthy key flows: {during:?}"
    );
    assert!(!during.contains(&poison.id), "the refused row never lands");
    let overtaken = during.iter().filter(|id| **id == behind.id).count();
    assert!(
        overtaken <= 1,
        "retries of the refused row never carry the row behind it: {during:?}"
    );
    println!("row behind the refused one published during its first attempt: {overtaken}");
    assert!(stats.publish_errors.load(Ordering::Relaxed) >= 2);
    let status = Command::new(env!("CARGO_BIN_EXE_kjob-cli"))
        .args([
            "outbox",
            "status",
            "--json",
            "--database-url",
            &fx.url,
            "--table",
            &fx.table,
        ])
        .output()
        .expect("kjob outbox status");
    let status: serde_json::Value =
        serde_json::from_slice(&status.stdout).expect("status prints JSON");
    assert_eq!(status["failing"], 1);
    let error = status["last_error"]
        .as_str()
        .unwrap_or_default()
        .to_lowercase();
    assert!(error.contains("too large"), "last error: {error}");

    // The operator's fix: drop the refused row; its key moves on.
    fx.client
        .execute(
            &format!("DELETE FROM {} WHERE id = $1", fx.table),
            &[&poison.row],
        )
        .await
        .expect("deleting the refused row");
    fx.wait_all_sent(Duration::from_secs(20)).await;
    let _ = stop.send(());
    running.await.expect("relay task").expect("relay stopped");
    let got = ids(&read_all(&fx.config, &fx.topic));
    assert!(!got.contains(&poison.id), "the refused row never lands");
    assert_eq!(got.iter().filter(|id| **id == other.id).count(), 1);
    let copies = got.iter().filter(|id| **id == behind.id).count();
    assert!(
        (1..=1 + overtaken).contains(&copies),
        "the row behind is published once the refused row is gone: {got:?}"
    );
    fx.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_can_run_the_relay_in_process() {
    let mut fx = Fixture::new(3).await;
    let handled: Arc<std::sync::Mutex<Vec<i64>>> = Arc::default();
    let h = handled.clone();
    let worker = kjob::Worker::builder(fx.config.clone(), unique("kjob-tests-outbox"))
        .handle_on(&fx.topic, move |job: TestJob, _ctx: kjob::JobContext| {
            let h = h.clone();
            async move {
                if let Ok(mut v) = h.lock() {
                    v.push(job.seq);
                }
                Ok::<(), kjob::JobError>(())
            }
        })
        .outbox_relay(fx.relay())
        .build()
        .expect("worker");
    let running = start(worker);
    let tx = fx.client.transaction().await.expect("BEGIN");
    for seq in 1..=3 {
        fx.outbox
            .enqueue_to(&tx, &fx.topic, &TestJob::ok("k", seq))
            .await
            .expect("enqueue");
    }
    tx.commit().await.expect("COMMIT");
    eventually(Duration::from_secs(30), "3 jobs handled", || {
        handled.lock().map(|v| v.len() == 3).unwrap_or(false)
    })
    .await;
    running.stop().await;
    assert_eq!(*handled.lock().expect("lock"), vec![1, 2, 3]);
    assert_eq!(fx.count("sent_at IS NULL").await, 0);
    fx.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_relay_reconnects_when_postgres_ends_its_session() {
    let mut fx = Fixture::new(3).await;
    let relay = fx.relay();
    let stats = relay.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run_until(async {
        let _ = stopped.await;
    }));
    let (outbox, topic) = (fx.outbox.clone(), fx.topic.clone());
    for seq in 1..=50 {
        request(&mut fx.client, &outbox, &topic, seq).await;
    }
    fx.wait_all_sent(Duration::from_secs(20)).await;
    // What a failover or an administrator's pg_terminate_backend does.
    let killed: i64 = fx
        .client
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE application_name = $1",
            &[&format!("kjob-relay {}", fx.table)],
        )
        .await
        .expect("terminating the relay's sessions")
        .get(0);
    assert!(
        killed >= 1,
        "the relay's sessions carry application_name `kjob-relay <table>`"
    );
    for seq in 51..=100 {
        request(&mut fx.client, &outbox, &topic, seq).await;
    }
    fx.wait_all_sent(Duration::from_secs(20)).await;
    let _ = stop.send(());
    running.await.expect("relay task").expect("relay stopped");
    assert_eq!(stats.published.load(Ordering::Relaxed), 100);
    let records = read_all(&fx.config, &fx.topic);
    assert_eq!(records.len(), 100, "each job once");
    let mut last: HashMap<Vec<u8>, i64> = HashMap::new();
    for m in &records {
        let s = decode_seq(m.payload().unwrap_or_default());
        if let Some(prev) = last.insert(m.key().unwrap_or_default().to_vec(), s) {
            assert!(prev < s, "key order: {prev} then {s}");
        }
    }
    fx.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_notifications_the_relay_finds_rows_by_polling() {
    let mut fx = Fixture::new(3).await;
    let relay = fx.relay().poll_interval(Duration::from_millis(300));
    let stats = relay.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run_until(async {
        let _ = stopped.await;
    }));
    let quiet = fx.outbox.clone().notify(false);
    tokio::time::sleep(Duration::from_millis(500)).await; // relay idle, waiting
    let topic = fx.topic.clone();
    request(&mut fx.client, &quiet, &topic, 1).await;
    let start = Instant::now();
    fx.wait_all_sent(Duration::from_secs(5)).await;
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "found by the 300 ms poll, took {:?}",
        start.elapsed()
    );
    assert_eq!(stats.published.load(Ordering::Relaxed), 1);
    let _ = stop.send(());
    running.await.expect("relay task").expect("relay stopped");
    fx.drop_tables().await;
}
