//! Outbox harness: relay throughput, and the delay from commit to published.
//!
//! 1. **Throughput**: `--jobs` rows (10 000 keys) are written to a fresh
//!    outbox table first; then one relay starts and the clock runs until it
//!    has published (acks=all) and marked every row. Run once keeping sent
//!    rows (retention 1 h: an UPDATE per batch) and once deleting them
//!    (retention 0: a DELETE per batch).
//! 2. **Latency**: a relay runs while `--rate` transactions per second, one
//!    job each, commit for `--seconds`. Per job: from `COMMIT` returning to
//!    (a) the relay marking the row sent (after the broker's ack; PostgreSQL's
//!    `clock_timestamp()` on the same host) and (b) a consumer receiving the
//!    record (`fetch.wait.max.ms=5`), which is an upper bound.
//!
//! `cargo run --release -p kjob-benches --bin outbox -- --jobs 100000 --rate 1000 --seconds 10`

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use kjob::outbox::{Outbox, Relay};
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

async fn pg(url: &str) -> anyhow::Result<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

struct Setup {
    url: String,
    config: KafkaConfig,
    table: String,
    topic: String,
    outbox: Outbox,
    client: Client,
}

async fn setup(url: &str, config: &KafkaConfig) -> anyhow::Result<Setup> {
    let table = unique("kjob_outbox_bench");
    let topic = unique("kjob.bench.outbox").replace('_', ".");
    kjob::topics::create_topics(config, &[(topic.clone(), 6)]).await?;
    let client = pg(url).await?;
    let outbox = Outbox::new(config)?.table(&table)?;
    outbox.migrate(&client).await?;
    Ok(Setup {
        url: url.to_string(),
        config: config.clone(),
        table,
        topic,
        outbox,
        client,
    })
}

async fn throughput(s: &Setup, jobs: u64, retention: Duration) -> anyhow::Result<()> {
    // Fill the table first: 4 connections, 100 jobs per transaction.
    let started = Instant::now();
    let per_writer = jobs / 4;
    let mut tasks = Vec::new();
    for w in 0..4u64 {
        let (url, outbox, topic) = (s.url.clone(), s.outbox.clone(), s.topic.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = pg(&url).await?;
            let mut i = 0;
            while i < per_writer {
                let tx = client.transaction().await?;
                for _ in 0..100.min(per_writer - i) {
                    let seq = (w * per_writer + i) as i64;
                    outbox
                        .enqueue_to(&tx, &topic, &BenchJob::new(seq, 10_000))
                        .await?;
                    i += 1;
                }
                tx.commit().await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let total = per_writer * 4;
    println!(
        "  enqueue: {total} jobs in {:.1?} ({:.0} jobs/s, 4 connections, 100 jobs per transaction)",
        started.elapsed(),
        total as f64 / started.elapsed().as_secs_f64()
    );
    let relay = Relay::new(&s.url, s.config.clone())
        .table(&s.table)?
        .retention(retention);
    let stats = relay.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run_until(async {
        let _ = stopped.await;
    }));
    let started = Instant::now();
    while stats.published.load(Ordering::Relaxed) < total {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(300),
            "relay did not finish"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "  relay (retention {}): {total} jobs in {secs:.2}s = {:.0} jobs/s ({} batches)",
        humantime_secs(retention),
        total as f64 / secs,
        stats.batches.load(Ordering::Relaxed)
    );
    let _ = stop.send(());
    running.await??;
    Ok(())
}

fn humantime_secs(d: Duration) -> String {
    if d.is_zero() {
        "0: delete on publish".into()
    } else {
        format!("{}s: mark sent", d.as_secs())
    }
}

fn consumer(config: &KafkaConfig, topic: &str) -> anyhow::Result<BaseConsumer> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &config.bootstrap_servers)
        .set("group.id", unique("kjob-bench-outbox"))
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
    let relay = Relay::new(&s.url, s.config.clone()).table(&s.table)?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run_until(async {
        let _ = stopped.await;
    }));
    // The consumer thread: kjob-id -> when it was received.
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
        let (url, outbox, topic) = (s.url.clone(), s.outbox.clone(), s.topic.clone());
        let every = Duration::from_secs_f64(writers as f64 / rate as f64);
        tasks.push(tokio::spawn(async move {
            let mut client = pg(&url).await?;
            let mut tick = tokio::time::interval(every);
            let mut commits = Vec::new();
            for i in 0..total / writers {
                tick.tick().await;
                let tx = client.transaction().await?;
                let at = outbox
                    .enqueue_to(&tx, &topic, &BenchJob::new((w * total + i) as i64, 10_000))
                    .await?;
                tx.commit().await?;
                commits.push((at.id, Instant::now(), SystemTime::now()));
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
                s.table
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
    let mut to_marked = Vec::new();
    let mut to_consumer = Vec::new();
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
    // BENCH_RDKAFKA=k=v,... adds librdkafka settings to the relay (as in
    // the main harness), e.g. max.in.flight.requests.per.connection=5.
    let mut config = KafkaConfig::from_env();
    for kv in std::env::var("BENCH_RDKAFKA")
        .unwrap_or_default()
        .split(',')
    {
        if let Some((k, v)) = kv.split_once('=') {
            config = config.set(k.trim(), v.trim());
        }
    }
    let url = std::env::var("KJOB_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:54329/kjob".into());
    let jobs = arg("jobs", 100_000);
    let rate = arg("rate", 1000);
    let seconds = arg("seconds", 10);

    println!("throughput ({jobs} jobs, 6 partitions, 10 000 keys, batch 1000):");
    for retention in [Duration::from_secs(3600), Duration::ZERO] {
        let s = setup(&url, &config).await?;
        throughput(&s, jobs, retention).await?;
        s.client
            .batch_execute(&format!("DROP TABLE {}", s.table))
            .await?;
    }
    println!("latency ({rate} jobs/s, one job per transaction, {seconds} s):");
    let s = setup(&url, &config).await?;
    latency(&s, rate, seconds).await?;
    s.client
        .batch_execute(&format!("DROP TABLE {}", s.table))
        .await?;
    Ok(())
}
