//! Fair share per tenant under one tenant's flood: do the other tenants'
//! jobs of the same route stay fast while tenant A's import lands?
//!
//! ```bash
//! ./dev stack up && cargo run --release -p kjob-benches --bin fairness -- --flood 200000 --secs 10
//! ```
//!
//! `--concurrency N` sets the route's slots (default 64). `--bound N` sets `max_in_flight_per_partition` (default: kjob's, 5 000):
//! how much of a flood the worker fetches, so how far past it fairness
//! reaches, at the cost of the memory the peak RSS column shows.
//!
//! One route (8 partitions, 64 slots, a 5 ms handler). Tenants B, C, D and
//! E each enqueue 20 jobs/s, every job stamped with its enqueue time; the
//! handler records enqueue -> start. Per setting (`fair_by_tenant`, then
//! without fairness), in fresh topics and group:
//!
//! 1. **baseline**: B–E alone for `--secs`;
//! 2. **flood**: tenant A enqueues `--flood` jobs at once (each its own
//!    key, like a product import), B–E still at 20/s for `--secs`; A's
//!    throughput is what A handled in that window.
//!
//! A third run floods with fairness while B–E stay idle: what the route
//! gives A alone, its capacity on this machine.
//!
//! The figures: B–E's p99 during the flood against their p99 alone
//! (target ≤ 2×), and A's throughput against the route's capacity
//! (nominally 64 slots / 5 ms = 12 800 jobs/s, and as measured with B–E
//! idle; target ≥ 80 %).

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kjob::{Job, JobContext, JobError, KafkaConfig, Producer, Worker};
use kjob_benches::arg;
use serde::{Deserialize, Serialize};

const HANDLER: Duration = Duration::from_millis(5);
/// Slots by default (`--concurrency N` sets another).
const CONCURRENCY: usize = 64;
const RATE_PER_TENANT: u64 = 20;
const OTHERS: [&str; 4] = ["b", "c", "d", "e"];

/// The test contract's shape; its tenant travels in `behaviour`.
#[derive(Clone, Serialize, Deserialize)]
#[serde(rename = "TestJob")]
struct TenantJob {
    key: String,
    seq: i64,
    behaviour: String,
}

impl Job for TenantJob {
    const NAME: &'static str = "kjob.bench.job";
    const VERSION: u32 = 1;
    const SCHEMA: &'static str = include_str!("../../../schemas/kjob.test.job.v1.avsc");
    fn key(&self) -> String {
        self.key.clone()
    }
    fn tenant(&self) -> Option<String> {
        Some(self.behaviour.clone())
    }
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

fn p99_ms(mut v: Vec<i64>) -> (f64, f64, usize) {
    v.sort_unstable();
    if v.is_empty() {
        return (f64::NAN, f64::NAN, 0);
    }
    let pct = |p: f64| v[((v.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
    (pct(0.5), pct(0.99), v.len())
}

/// B–E at 20 jobs/s each for `secs`, stamped with their enqueue time.
async fn others(producer: Producer, topic: String, secs: u64) -> anyhow::Result<()> {
    let every = Duration::from_micros(1_000_000 / (RATE_PER_TENANT * OTHERS.len() as u64));
    let mut tick = tokio::time::interval(every);
    let until = Instant::now() + Duration::from_secs(secs);
    let mut pending = Vec::new();
    let mut n = 0usize;
    while Instant::now() < until {
        tick.tick().await;
        let tenant = OTHERS[n % OTHERS.len()];
        n += 1;
        let job = TenantJob {
            key: format!("{tenant}-{}", n % 16),
            seq: now_us(),
            behaviour: tenant.into(),
        };
        let (p, t) = (producer.clone(), topic.clone());
        pending.push(tokio::spawn(async move { p.enqueue_to(&t, &job).await }));
    }
    for h in pending {
        h.await?.context("enqueue")?;
    }
    Ok(())
}

/// This process's peak resident memory (Linux), in MiB.
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?.to_string();
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

async fn run(
    config: &KafkaConfig,
    fair: bool,
    flood: i64,
    secs: u64,
    bound: Option<usize>,
    others_during: bool,
    slots: usize,
) -> anyhow::Result<()> {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let topic = format!("bench.fair.{}", &suffix[..8]);
    kjob::topics::create_topics(config, &[(topic.clone(), 8)])
        .await
        .context("creating the bench topic")?;
    let producer = Producer::new(config)?;
    producer.prepare::<TenantJob>().await?;
    let waits = Arc::new(Mutex::new(Vec::<i64>::new()));
    let a_done = Arc::new(AtomicU64::new(0));
    let (w, a) = (waits.clone(), a_done.clone());
    let mut builder = Worker::builder(config.clone(), format!("bench-fair-{}", &suffix[..8]))
        .handle_on(&topic, move |job: TenantJob, ctx: JobContext| {
            let (w, a) = (w.clone(), a.clone());
            async move {
                if ctx.tenant.as_deref() == Some("a") {
                    tokio::time::sleep(HANDLER).await;
                    a.fetch_add(1, AtomicOrdering::Relaxed);
                } else {
                    if let Ok(mut v) = w.lock() {
                        v.push(now_us() - job.seq);
                    }
                    tokio::time::sleep(HANDLER).await;
                }
                Ok::<(), JobError>(())
            }
        })
        .concurrency(slots);
    if let Some(n) = bound {
        builder = builder.max_in_flight_per_partition(n);
    }
    if fair {
        builder = builder.fair_by_tenant(&topic);
    }
    let worker = builder.build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run_until(async {
        let _ = stopped.await;
    }));
    // Join, and warm the path up.
    tokio::time::sleep(Duration::from_secs(5)).await;
    others(producer.clone(), topic.clone(), 2).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    waits.lock().map(|mut v| v.clear()).ok();
    others(producer.clone(), topic.clone(), secs).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let alone = p99_ms(
        waits
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default(),
    );

    let flood_start = Instant::now();
    let jobs: Vec<TenantJob> = (0..flood)
        .map(|i| TenantJob {
            key: format!("a-{i}"),
            seq: i,
            behaviour: "a".into(),
        })
        .collect();
    for chunk in jobs.chunks(20_000) {
        for r in producer.enqueue_batch_to(&topic, chunk).await {
            r.context("flood enqueue")?;
        }
    }
    let enqueued_in = flood_start.elapsed();
    let a_before = a_done.load(AtomicOrdering::Relaxed);
    let window = Instant::now();
    if others_during {
        others(producer.clone(), topic.clone(), secs).await?;
    } else {
        // The route's capacity for A: the others idle.
        tokio::time::sleep(Duration::from_secs(secs)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let during = p99_ms(
        waits
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default(),
    );
    let a_rate =
        (a_done.load(AtomicOrdering::Relaxed) - a_before) as f64 / window.elapsed().as_secs_f64();
    let _ = stop.send(());
    running.await??;
    let capacity = slots as f64 / HANDLER.as_secs_f64();
    if fair && others_during {
        kjob_benches::flood_row(
            &format!("tenant flood: tenant A sends {flood} jobs at once, {slots} slots"),
            "tenants B-E at 20/s each, enqueue -> start",
            alone.1,
            during.1,
        );
    }
    println!(
        "| {} | {flood} | {} | {:.1} / {:.1} ms ({}) | {:.1} / {:.1} ms ({}) | {:.2}x | {:.0} jobs/s ({:.0} %) | {:.1} s | {:.0} MiB |",
        match (fair, others_during) {
            (true, true) => "fair_by_tenant",
            (false, true) => "no fairness",
            (true, false) => "fair_by_tenant, B-E idle during the flood",
            (false, false) => "no fairness, B-E idle during the flood",
        },
        bound.map_or("default".to_string(), |n| n.to_string()),
        alone.0,
        alone.1,
        alone.2,
        during.0,
        during.1,
        during.2,
        during.1 / alone.1,
        a_rate,
        100.0 * a_rate / capacity,
        enqueued_in.as_secs_f64(),
        peak_rss_mib(),
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kjob_benches::no_logs();
    let config = KafkaConfig::from_env();
    let secs = arg("secs", 10);
    let flood = arg("flood", 200_000) as i64;
    let bound = match arg("bound", 0) {
        0 => None,
        n => Some(n as usize),
    };
    let slots = arg("concurrency", CONCURRENCY as u64) as usize;
    println!(
        "tenants B-E at {RATE_PER_TENANT}/s each, handler {HANDLER:?}, {slots} slots, 8 partitions, {secs} s per phase\n"
    );
    println!("| setting | flood (A's jobs) | in-flight bound per partition | B-E enqueue -> start p50 / p99 alone | during the flood | p99 ratio | A handled during the flood (of slots / 5 ms) | flood enqueue took | peak RSS so far |");
    println!("|---|---|---|---|---|---|---|---|---|");
    run(&config, true, flood, secs, bound, true, slots).await?;
    run(&config, false, flood, secs, bound, true, slots).await?;
    run(&config, true, flood, secs, bound, false, slots).await?;
    Ok(())
}
