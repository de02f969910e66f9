//! Throughput harness: how close does the kjob worker get to a raw rdkafka
//! consume loop over the same records?
//!
//! 1. Pre-produce N jobs (kjob's producer, so they are real framed Avro).
//! 2. (a) Raw loop: a `BaseConsumer` in a fresh group polls every record and
//!    touches its payload. No decode, no commit: the practical upper limit.
//! 3. (b) kjob: a worker in another fresh group with a no-op handler, so the
//!    cost measured is kjob's own: decode against the registry schema,
//!    dispatch through ordering lanes, watermark tracking, and commits.
//!
//! Both clocks start at the first record received (group join excluded) and
//! stop when the N-th is done. The last line is the ratio.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kjob::{JobContext, JobError, KafkaConfig, Producer, Worker, WorkerStats};
use kjob_benches::BenchJob;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message};

fn arg(name: &str, default: u64) -> u64 {
    let flag = format!("--{name}");
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| *a == flag)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn raw_loop(config: &KafkaConfig, topic: &str, n: u64) -> anyhow::Result<f64> {
    let group = format!("bench-raw-{}", uuid::Uuid::new_v4().simple());
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &config.bootstrap_servers)
        .set("group.id", &group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()?;
    c.subscribe(&[topic])?;
    let mut seen = 0u64;
    let mut bytes = 0usize;
    let mut first = None;
    let deadline = Instant::now() + Duration::from_secs(300);
    while seen < n {
        anyhow::ensure!(Instant::now() < deadline, "raw loop saw only {seen} of {n}");
        if let Some(r) = c.poll(Duration::from_millis(100)) {
            let m = r?;
            first.get_or_insert_with(Instant::now);
            bytes += m.payload().map_or(0, <[u8]>::len);
            seen += 1;
        }
    }
    let secs = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
    std::hint::black_box(bytes);
    Ok(n as f64 / secs)
}

async fn kjob_worker(config: &KafkaConfig, topic: &str, n: u64) -> anyhow::Result<f64> {
    let group = format!("bench-kjob-{}", uuid::Uuid::new_v4().simple());
    let handled = Arc::new(AtomicU64::new(0));
    let counter = handled.clone();
    let mut config = config.clone();
    if let Ok(extra) = std::env::var("BENCH_RDKAFKA") {
        for kv in extra.split(',') {
            if let Some((k, v)) = kv.split_once('=') {
                config = config.set(k, v);
            }
        }
    }
    let worker = Worker::builder(config.clone(), group)
        .handle_on::<BenchJob, _>(topic, move |_job: BenchJob, _ctx: JobContext| {
            counter.fetch_add(1, Ordering::Relaxed);
            async { Ok::<(), JobError>(()) }
        })
        .max_in_flight_per_partition(arg("max-in-flight", 5000) as usize)
        .concurrency(arg("concurrency", 64) as usize)
        .build()?;
    let stats = worker.stats();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run_until(async {
        let _ = rx.await;
    }));
    let deadline = Instant::now() + Duration::from_secs(300);
    while handled.load(Ordering::Relaxed) == 0 {
        anyhow::ensure!(Instant::now() < deadline, "kjob worker handled nothing");
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    let first = Instant::now();
    while WorkerStats::get(&stats.handled) < n {
        anyhow::ensure!(
            Instant::now() < deadline,
            "kjob worker handled only {}",
            WorkerStats::get(&stats.handled)
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let secs = first.elapsed().as_secs_f64();
    let _ = tx.send(());
    running.await??;
    Ok(n as f64 / secs)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n = arg("jobs", 200_000);
    let partitions = arg("partitions", 6) as i32;
    let keys = arg("keys", 10_000);
    let config = KafkaConfig::from_env();
    let topic = format!(
        "kjob.bench.{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    );
    kjob::topics::create_topics(&config, &[(topic.clone(), partitions)])
        .await
        .context("creating the bench topic")?;
    let producer = Producer::new(&config)?;
    let started = Instant::now();
    let chunk = 20_000u64;
    let mut i = 0;
    while i < n {
        let jobs: Vec<BenchJob> = (i..(i + chunk).min(n))
            .map(|s| BenchJob {
                key: format!("k{}", s % keys),
                seq: s as i64,
                behaviour: "ok".into(),
            })
            .collect();
        for r in producer.enqueue_batch_to(&topic, &jobs).await {
            r?;
        }
        i += chunk;
    }
    println!(
        "pre-produced {n} jobs on {partitions} partitions ({keys} keys) in {:.1}s",
        started.elapsed().as_secs_f64()
    );

    let cfg = config.clone();
    let t = topic.clone();
    let raw = tokio::task::spawn_blocking(move || raw_loop(&cfg, &t, n)).await??;
    println!("raw rdkafka loop:        {raw:>10.0} records/s");
    let kjob = kjob_worker(&config, &topic, n).await?;
    println!("kjob worker (no-op):     {kjob:>10.0} jobs/s");
    println!("kjob/raw-loop ratio: {:.2}", kjob / raw);
    Ok(())
}
