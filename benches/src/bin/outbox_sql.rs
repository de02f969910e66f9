//! The SQL enqueue (`kjob.enqueue`), measured three ways, in one run:
//!
//! 1. **What one call adds inside an application transaction.** On one
//!    connection, `--inserts` transactions of each kind, alternating so both
//!    see the same machine: `BEGIN; INSERT order; INSERT INTO app_jobs
//!    (body) VALUES ($json); COMMIT` (the plain INSERT of the same JSON into
//!    a table of the app's own) and `BEGIN; INSERT order; SELECT
//!    kjob.enqueue(topic, key, $json); COMMIT`. Per kind, p50/p99 of the
//!    statement and of the whole transaction (the enqueue's `NOTIFY` costs
//!    at `COMMIT`). No relay runs meanwhile.
//! 2. **Relay throughput with JSON rows** (encoding included): `--jobs` rows
//!    (10 000 keys) written with `kjob.enqueue_many` (4 connections, 1 000
//!    per call), then one relay starts and the clock runs until every row is
//!    encoded, acknowledged (acks=all) and marked.
//! 3. **Commit to published at `--rate` jobs/s** for `--seconds`: 4
//!    connections, one `kjob.enqueue` per transaction, a relay running; per
//!    job, from `COMMIT` returning to the relay marking the row sent (after
//!    the broker's ack) and to a consumer receiving it.
//!
//! `cargo run --release -p kjob-benches --bin outbox_sql -- --inserts 5000 --jobs 100000 --rate 1000 --seconds 10`

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use kjob::outbox::{OutboxTable, Relay};
use kjob::KafkaConfig;
use kjob_benches::{arg, BenchJob};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio_postgres::{Client, NoTls};

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    )
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn summary(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (percentile(v, 0.5), percentile(v, 0.99))
}

async fn pg(url: &str) -> anyhow::Result<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

fn job(seq: i64, keys: i64) -> (String, serde_json::Value) {
    let key = format!("k{}", seq % keys.max(1));
    let body = serde_json::json!({"key": key, "seq": seq, "behaviour": "ok"});
    (key, body)
}

struct Setup {
    url: String,
    config: KafkaConfig,
    table: OutboxTable,
    topic: String,
    client: Client,
}

async fn setup(url: &str, config: &KafkaConfig) -> anyhow::Result<Setup> {
    let table = OutboxTable::new(&unique("kjob_outbox_sqlbench"))?;
    let topic = unique("kjob.bench.sql").replace('_', ".");
    kjob::topics::create_topics(config, &[(topic.clone(), 6)]).await?;
    // The route's contract, as its kjob producer or worker registers it.
    kjob::codec::Codec::from_config(config)?
        .register::<BenchJob>(&topic)
        .await?;
    let client = pg(url).await?;
    kjob::outbox::migrate(&client, &table).await?;
    Ok(Setup {
        url: url.to_string(),
        config: config.clone(),
        table,
        topic,
        client,
    })
}

impl Setup {
    async fn drop(&self) -> anyhow::Result<()> {
        self.client
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {t}, {t}_orders, {t}_app_jobs; DROP SCHEMA IF EXISTS {s} CASCADE",
                t = self.table.name(),
                s = self.table.functions_schema()
            ))
            .await?;
        Ok(())
    }
}

async fn insert_cost(s: &Setup, n: usize) -> anyhow::Result<()> {
    let t = s.table.name();
    s.client
        .batch_execute(&format!(
            "CREATE TABLE {t}_orders (id bigserial PRIMARY KEY, email text NOT NULL);
             CREATE TABLE {t}_app_jobs (id bigserial PRIMARY KEY, body jsonb NOT NULL)"
        ))
        .await?;
    let order = s
        .client
        .prepare(&format!("INSERT INTO {t}_orders (email) VALUES ($1)"))
        .await?;
    let plain = s
        .client
        .prepare(&format!("INSERT INTO {t}_app_jobs (body) VALUES ($1)"))
        .await?;
    let enqueue = s
        .client
        .prepare(&format!(
            "SELECT {}.enqueue(topic => $1, key => $2, job => $3)",
            s.table.functions_schema()
        ))
        .await?;
    let (mut plain_stmt, mut plain_tx, mut kjob_stmt, mut kjob_tx) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    // Warm-up: plans cached, pages in memory.
    for i in 0..(n / 10).max(50) + n {
        let (key, body) = job(i as i64, 10_000);
        let warm = i < (n / 10).max(50);
        for with_kjob in [false, true] {
            let started = Instant::now();
            s.client.batch_execute("BEGIN").await?;
            s.client.execute(&order, &[&"a@example.com"]).await?;
            let at = Instant::now();
            if with_kjob {
                s.client
                    .query_one(&enqueue, &[&s.topic, &key, &body])
                    .await?;
            } else {
                s.client.execute(&plain, &[&body]).await?;
            }
            let stmt = at.elapsed();
            s.client.batch_execute("COMMIT").await?;
            let tx = started.elapsed();
            if warm {
                continue;
            }
            if with_kjob {
                kjob_stmt.push(ms(stmt));
                kjob_tx.push(ms(tx));
            } else {
                plain_stmt.push(ms(stmt));
                plain_tx.push(ms(tx));
            }
        }
    }
    let (ps50, ps99) = summary(&mut plain_stmt);
    let (pt50, pt99) = summary(&mut plain_tx);
    let (ks50, ks99) = summary(&mut kjob_stmt);
    let (kt50, kt99) = summary(&mut kjob_tx);
    println!("  plain INSERT of the JSON:  statement p50 {ps50:.3} ms, p99 {ps99:.3} ms; transaction p50 {pt50:.3} ms, p99 {pt99:.3} ms");
    println!("  kjob.enqueue of the JSON:  statement p50 {ks50:.3} ms, p99 {ks99:.3} ms; transaction p50 {kt50:.3} ms, p99 {kt99:.3} ms");
    println!(
        "  added by kjob.enqueue:     statement p50 {:+.3} ms, p99 {:+.3} ms; transaction p50 {:+.3} ms, p99 {:+.3} ms",
        ks50 - ps50,
        ks99 - ps99,
        kt50 - pt50,
        kt99 - pt99
    );
    // The rows of this part are not relayed.
    s.client.batch_execute(&format!("TRUNCATE {t}")).await?;
    Ok(())
}

async fn throughput(s: &Setup, jobs: u64) -> anyhow::Result<()> {
    let started = Instant::now();
    let per_writer = jobs / 4;
    let mut tasks = Vec::new();
    for w in 0..4u64 {
        let (url, table, topic) = (s.url.clone(), s.table.clone(), s.topic.clone());
        tasks.push(tokio::spawn(async move {
            let client = pg(&url).await?;
            let stmt = client
                .prepare(&format!(
                    "SELECT {}.enqueue_many($1, $2)",
                    table.functions_schema()
                ))
                .await?;
            let mut i = 0;
            while i < per_writer {
                let n = 1000.min(per_writer - i);
                let batch: Vec<serde_json::Value> = (0..n)
                    .map(|j| {
                        let (key, body) = job((w * per_writer + i + j) as i64, 10_000);
                        serde_json::json!({"key": key, "job": body})
                    })
                    .collect();
                client
                    .query_one(&stmt, &[&topic, &serde_json::Value::Array(batch)])
                    .await?;
                i += n;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let total = per_writer * 4;
    println!(
        "  enqueue_many: {total} jobs in {:.1?} ({:.0} jobs/s, 4 connections, 1 000 per call and transaction)",
        started.elapsed(),
        total as f64 / started.elapsed().as_secs_f64()
    );
    let relay = Relay::new(&s.url, s.config.clone())
        .table(s.table.name())?
        .retention(Duration::from_secs(3600));
    let stats = relay.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run_until(async {
        let _ = stopped.await;
    }));
    let started = Instant::now();
    while stats.published.load(Ordering::Relaxed) < total {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(300),
            "relay did not finish ({} of {total}, {} dead-lettered)",
            stats.published.load(Ordering::Relaxed),
            stats.dead_lettered.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        stats.dead_lettered.load(Ordering::Relaxed) == 0,
        "rows were dead-lettered"
    );
    println!(
        "  relay, JSON rows encoded against the registry's contract: {total} jobs in {secs:.2}s = {:.0} jobs/s ({} batches)",
        total as f64 / secs,
        stats.batches.load(Ordering::Relaxed)
    );
    let _ = stop.send(());
    running.await??;
    Ok(())
}

fn consumer(config: &KafkaConfig, topic: &str) -> anyhow::Result<BaseConsumer> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &config.bootstrap_servers)
        .set("group.id", unique("kjob-bench-outbox-sql"))
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "5")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..6 {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    Ok(c)
}

async fn latency(s: &Setup, rate: u64, seconds: u64) -> anyhow::Result<()> {
    let relay = Relay::new(&s.url, s.config.clone()).table(s.table.name())?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run_until(async {
        let _ = stopped.await;
    }));
    let received: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let c = consumer(&s.config, &s.topic)?;
    let reader = {
        let (received, done) = (received.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                if let Some(Ok(m)) = c.poll(Duration::from_millis(50)) {
                    let at = Instant::now();
                    if let Some(id) = kjob::headers::find(m.headers(), kjob::headers::ID) {
                        if let Ok(mut r) = received.lock() {
                            r.insert(id.to_string(), at);
                        }
                    }
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await; // relay and consumer settle
    let writers = 4u64;
    let total = rate * seconds;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let (url, table, topic) = (s.url.clone(), s.table.clone(), s.topic.clone());
        let every = Duration::from_secs_f64(writers as f64 / rate as f64);
        tasks.push(tokio::spawn(async move {
            let client = pg(&url).await?;
            let stmt = client
                .prepare(&format!(
                    "SELECT {}.enqueue($1, $2, $3)",
                    table.functions_schema()
                ))
                .await?;
            let mut tick = tokio::time::interval(every);
            let mut commits = Vec::new();
            for i in 0..total / writers {
                tick.tick().await;
                let (key, body) = job((w * total + i) as i64, 10_000);
                client.batch_execute("BEGIN").await?;
                let id: String = client
                    .query_one(&stmt, &[&topic, &key, &body])
                    .await?
                    .get(0);
                client.batch_execute("COMMIT").await?;
                commits.push((id, Instant::now(), SystemTime::now()));
            }
            anyhow::Ok(commits)
        }));
    }
    let mut commits = Vec::new();
    for t in tasks {
        commits.extend(t.await??);
    }
    let started = Instant::now();
    while received.lock().map(|r| r.len()).unwrap_or(0) < commits.len() {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(60),
            "not every job arrived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    done.store(true, Ordering::Relaxed);
    let _ = reader.join();
    let _ = stop.send(());
    running.await??;
    let sent: HashMap<String, f64> = s
        .client
        .query(
            &format!(
                "SELECT job_id, extract(epoch FROM sent_at)::float8 FROM {}",
                s.table.name()
            ),
            &[],
        )
        .await?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let received = received
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    let (mut to_marked, mut to_consumer) = (Vec::new(), Vec::new());
    for (id, at, wall) in &commits {
        let wall = wall.duration_since(UNIX_EPOCH)?.as_secs_f64();
        if let Some(s) = sent.get(id) {
            to_marked.push((s - wall) * 1000.0);
        }
        if let Some(r) = received.get(id) {
            to_consumer.push(r.duration_since(*at).as_secs_f64() * 1000.0);
        }
    }
    for (name, v) in [
        ("commit -> marked sent (after ack)", &mut to_marked),
        ("commit -> consumer received", &mut to_consumer),
    ] {
        v.sort_by(f64::total_cmp);
        println!(
            "  {name}: n={} p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            v.len(),
            percentile(v, 0.5),
            percentile(v, 0.99),
            v.last().copied().unwrap_or(f64::NAN)
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kjob_benches::no_logs();
    let config = KafkaConfig::from_env();
    let url = std::env::var("KJOB_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:54329/kjob".into());
    let inserts = arg("inserts", 5000) as usize;
    let jobs = arg("jobs", 100_000);
    let rate = arg("rate", 1000);
    let seconds = arg("seconds", 10);

    println!("insert cost ({inserts} transactions of each kind, alternating, one connection):");
    let s = setup(&url, &config).await?;
    insert_cost(&s, inserts).await?;
    s.drop().await?;
    println!("relay throughput ({jobs} JSON jobs, 6 partitions, 10 000 keys, batch 1000):");
    let s = setup(&url, &config).await?;
    throughput(&s, jobs).await?;
    s.drop().await?;
    println!("latency ({rate} jobs/s, one kjob.enqueue per transaction, {seconds} s):");
    let s = setup(&url, &config).await?;
    latency(&s, rate, seconds).await?;
    s.drop().await?;
    Ok(())
}
