//! One failing part must not stop the rest: what a waiting job costs the
//! worker's other jobs, with parking (kjob's default) and without it (the
//! waiting job holds its handler slot, as before), in the same run.
//!
//! ```bash
//! ./dev stack up && cargo run --release -p kjob-benches --bin isolation
//! ```
//!
//! * **Registry outage with a new writer schema.** One worker (default
//!   concurrency) on a 12-partition route has v1's writer schema cached.
//!   A newer producer registers v2; the worker's registry (reached through a
//!   proxy the bench cuts) is down for `--outage-s` (15) while 300 v2 and
//!   300 v1 jobs arrive interleaved. Reported: v1 jobs handled during the
//!   outage, v2 handler calls and tier records during it, and the time from
//!   the registry's return until all are handled.
//! * **An open breaker beside a healthy route.** Route A calls a downstream
//!   that answers 503 for `--down-s` (20) behind a `Breaker`; 2 000 jobs
//!   arrive on it. Route B, on the same worker, gets 20 jobs/s. Reported:
//!   B's enqueue -> start p50/p99 alone (before the outage) and during it,
//!   and the share of B's jobs that started during the outage.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kjob::layers::breaker::Breaker;
use kjob::retry::RetryPolicy;
use kjob::{Job, JobContext, JobError, KafkaConfig, Producer, Worker};
use kjob_benches::{arg, BenchJob};
use kjob_integration_tests::{create_topic, try_end_offsets, unique, CutProxy};
use serde::{Deserialize, Serialize};

/// `BenchJob` with one optional field more: a newer producer's contract.
#[derive(Serialize, Deserialize)]
#[serde(rename = "TestJob")]
struct BenchJobV2 {
    key: String,
    seq: i64,
    behaviour: String,
    note: Option<String>,
}

impl Job for BenchJobV2 {
    const NAME: &'static str = BenchJob::NAME;
    const VERSION: u32 = 2;
    const SCHEMA: &'static str = r#"{"type":"record","name":"TestJob","namespace":"kjob.test",
        "fields":[{"name":"key","type":"string"},{"name":"seq","type":"long"},
        {"name":"behaviour","type":"string","default":"ok"},
        {"name":"note","type":["null","string"],"default":null}]}"#;
    fn key(&self) -> String {
        self.key.clone()
    }
}

fn registry_host(config: &KafkaConfig) -> (String, String) {
    let rest = config
        .schema_registry_url
        .strip_prefix("http://")
        .unwrap_or(&config.schema_registry_url);
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    (host.to_string(), format!("/{path}"))
}

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p) as usize]
}

/// Seqs of the v1 jobs sent before the outage (the alone figure).
const ALONE_BASE: i64 = 3_000_000;

/// p99 of start - sent (ms) over the seqs in `range` that started.
fn start_p99(
    calls: &[(i64, Instant)],
    sent: &HashMap<i64, Instant>,
    range: std::ops::Range<i64>,
) -> f64 {
    let waits: Vec<f64> = calls
        .iter()
        .filter(|(s, _)| range.contains(s))
        .filter_map(|(s, at)| {
            sent.get(s)
                .map(|t| at.duration_since(*t).as_secs_f64() * 1e3)
        })
        .collect();
    pct(waits, 0.99)
}

async fn registry_outage(
    config: &KafkaConfig,
    park: bool,
    outage: Duration,
) -> anyhow::Result<String> {
    const PARTITIONS: i32 = 12;
    const EACH: i64 = 300;
    let topic = unique("bench-isoreg");
    create_topic(config, &topic, PARTITIONS).await;
    let (host, path) = registry_host(config);
    let proxy = CutProxy::tcp(&host).await;
    let mut via = config.clone();
    via.schema_registry_url = format!("http://{}{path}", proxy.bootstrap());
    let calls: Arc<Mutex<Vec<(i64, Instant)>>> = Arc::default();
    let seen = calls.clone();
    let worker = Worker::builder(via, unique("bench-g"))
        .handle_on(&topic, move |job: BenchJob, _ctx: JobContext| {
            let seen = seen.clone();
            async move {
                seen.lock()
                    .map_err(|_| JobError::permanent("poisoned"))?
                    .push((job.seq, Instant::now()));
                Ok::<(), JobError>(())
            }
        })
        .retry(RetryPolicy::tiers([Duration::from_secs(1)]).max_attempts(3))
        .park_waiting_jobs(park)
        .build()?;
    let stop = tokio_util::sync::CancellationToken::new();
    let s = stop.clone();
    let run = tokio::spawn(async move { worker.run_until(s.cancelled_owned()).await });
    let producer = Producer::new(config)?;
    let count =
        |calls: &Arc<Mutex<Vec<(i64, Instant)>>>| calls.lock().map(|c| c.len()).unwrap_or(0);
    for i in 0..12 {
        producer
            .enqueue_to(&topic, &BenchJob::new(1_000_000 + i, 12))
            .await?;
    }
    while count(&calls) < 12 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let v2 = |seq: i64| BenchJobV2 {
        key: format!("v2-{seq}"),
        seq,
        behaviour: "ok".into(),
        note: Some("new deploy".into()),
    };
    // The cached-schema jobs alone first, sent as during the outage (one
    // after another, each acknowledged), for the flood row's base.
    let mut sent: HashMap<i64, Instant> = HashMap::new();
    for i in 0..EACH {
        sent.insert(ALONE_BASE + i, Instant::now());
        producer
            .enqueue_to(&topic, &BenchJob::new(ALONE_BASE + i, 1_000))
            .await?;
        producer
            .enqueue_to(&topic, &BenchJob::new(ALONE_BASE + EACH + i, 1_000))
            .await?;
    }
    while count(&calls) < 12 + 2 * EACH as usize {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    producer.enqueue_to(&topic, &v2(2_000_000)).await?;
    proxy.cut();
    let cut = Instant::now();
    for i in 0..EACH {
        producer.enqueue_to(&topic, &v2(10_000 + i)).await?;
        sent.insert(i, Instant::now());
        producer
            .enqueue_to(&topic, &BenchJob::new(i, 1_000))
            .await?;
    }
    tokio::time::sleep(outage.saturating_sub(cut.elapsed())).await;
    let during: Vec<(i64, Instant)> = calls.lock().map(|c| c.clone()).unwrap_or_default();
    let v1 = during.iter().filter(|(s, _)| (0..EACH).contains(s)).count();
    let v2_calls = during
        .iter()
        .filter(|(s, _)| *s >= 10_000 && *s < 1_000_000)
        .count();
    let tier = try_end_offsets(config, &format!("{topic}.retry.1s"), PARTITIONS)
        .map_or(0, |e| e.iter().sum::<i64>());
    proxy.restore();
    let back = Instant::now();
    let total = (12 + 1 + 4 * EACH) as usize;
    while count(&calls) < total && back.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let all = back.elapsed();
    stop.cancel();
    run.await??;
    if park {
        kjob_benches::flood_row(
            &format!("registry outage ({outage:?}) with {EACH} jobs of a new schema arriving"),
            "jobs whose schema is cached, enqueue -> start",
            start_p99(&during, &sent, ALONE_BASE..ALONE_BASE + EACH),
            start_p99(&during, &sent, 0..EACH),
        );
    }
    Ok(format!(
        "| {} | {v1} of {EACH} | {v2_calls} calls, {tier} tier records | {:.1} s |",
        if park {
            "parked (default)"
        } else {
            "holding its slot (before)"
        },
        all.as_secs_f64()
    ))
}

async fn breaker_beside_healthy(
    config: &KafkaConfig,
    park: bool,
    down: Duration,
) -> anyhow::Result<String> {
    let (a, b) = (unique("bench-isobrk-a"), unique("bench-isobrk-b"));
    create_topic(config, &a, 4).await;
    create_topic(config, &b, 4).await;
    let up_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let calls = Arc::new(AtomicU64::new(0));
    let started: Arc<Mutex<HashMap<i64, Instant>>> = Arc::default();
    let (u, c, st) = (up_at.clone(), calls.clone(), started.clone());
    let worker = Worker::builder(config.clone(), unique("bench-g"))
        .handle_on(&a, move |_job: BenchJob, _ctx: JobContext| {
            let (u, c) = (u.clone(), c.clone());
            async move {
                let healthy = u
                    .lock()
                    .ok()
                    .and_then(|g| *g)
                    .is_some_and(|t| Instant::now() >= t);
                if healthy {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    Ok(())
                } else {
                    c.fetch_add(1, Ordering::Relaxed);
                    Err(JobError::server("503 Service Unavailable"))
                }
            }
        })
        .handle_on(&b, move |job: BenchJob, _ctx: JobContext| {
            let st = st.clone();
            async move {
                if let Ok(mut m) = st.lock() {
                    m.insert(job.seq, Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok::<(), JobError>(())
            }
        })
        .layer_for(
            &a,
            Breaker::new(&unique("bench-downstream"))
                .failure_threshold(5)
                .open_for(Duration::from_secs(5)),
        )
        .retry(RetryPolicy::tiers([Duration::from_secs(1), Duration::from_secs(5)]).max_attempts(8))
        .park_waiting_jobs(park)
        .build()?;
    let stop = tokio_util::sync::CancellationToken::new();
    let s = stop.clone();
    let run = tokio::spawn(async move { worker.run_until(s.cancelled_owned()).await });
    let producer = Arc::new(Producer::new(config)?);
    // B alone for 10 s (the baseline), then the outage on A.
    let sent: Arc<Mutex<HashMap<i64, Instant>>> = Arc::default();
    let feed = {
        let (producer, sent, b) = (producer.clone(), sent.clone(), b.clone());
        let seconds = 10 + down.as_secs();
        tokio::spawn(async move {
            let tick = Duration::from_millis(50);
            let start = Instant::now();
            for seq in 0..(seconds * 20) as i64 {
                let due = start + tick * seq as u32;
                tokio::time::sleep(due.saturating_duration_since(Instant::now())).await;
                if let Ok(mut m) = sent.lock() {
                    m.insert(seq, Instant::now());
                }
                let _ = producer.enqueue_to(&b, &BenchJob::new(seq, 1_000)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(10)).await;
    let outage_from = Instant::now();
    if let Ok(mut g) = up_at.lock() {
        *g = Some(outage_from + down);
    }
    let jobs: Vec<BenchJob> = (0..2_000).map(|i| BenchJob::new(i, 2_000)).collect();
    for r in producer.enqueue_batch_to(&a, &jobs).await {
        r?;
    }
    feed.await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.cancel();
    run.await??;
    let sent = sent.lock().map(|m| m.clone()).unwrap_or_default();
    let started = started.lock().map(|m| m.clone()).unwrap_or_default();
    let outage_to = outage_from + down;
    let (mut alone, mut during, mut sent_during, mut started_during) =
        (Vec::new(), Vec::new(), 0, 0);
    for (seq, at) in &sent {
        let begun = started.get(seq);
        if *at < outage_from {
            if let Some(t) = begun {
                alone.push(t.duration_since(*at).as_secs_f64() * 1000.0);
            }
        } else if *at < outage_to {
            sent_during += 1;
            if let Some(t) = begun.filter(|t| **t < outage_to) {
                started_during += 1;
                during.push(t.duration_since(*at).as_secs_f64() * 1000.0);
            }
        }
    }
    Ok(format!(
        "| {} | {:.1} / {:.1} ms | {:.1} / {:.1} ms | {started_during} of {sent_during} | {} |",
        if park {
            "parked (default)"
        } else {
            "holding their slots (before)"
        },
        pct(alone.clone(), 0.5),
        pct(alone, 0.99),
        pct(during.clone(), 0.5),
        pct(during, 0.99),
        calls.load(Ordering::Relaxed),
    ))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kjob_benches::no_logs();
    let config = KafkaConfig::from_env();
    let outage = Duration::from_secs(arg("outage-s", 15));
    let down = Duration::from_secs(arg("down-s", 20));
    println!("Registry down for {outage:?}, 300 v2 + 300 v1 jobs on 12 partitions, v1 cached:\n");
    println!("| waiting jobs | v1 handled during the outage | v2 during the outage | registry back -> all handled |");
    println!("|---|---|---|---|");
    for park in [true, false] {
        println!("{}", registry_outage(&config, park, outage).await?);
    }
    println!("\nRoute A's downstream answers 503 for {down:?} (breaker: 5 failures, open 5 s; 2 000 jobs); route B gets 20 jobs/s:\n");
    println!("| parked jobs | B enqueue -> start p50 / p99 alone | during the outage | B started during the outage | calls to the dead downstream |");
    println!("|---|---|---|---|---|");
    for park in [true, false] {
        println!("{}", breaker_beside_healthy(&config, park, down).await?);
    }
    Ok(())
}
