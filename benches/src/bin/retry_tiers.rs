//! Retry-tier harness: how late do retries fire, and does a tier full of
//! not-yet-due jobs slow the main topic?
//!
//! 1. Lateness: jobs fail their first two attempts, so each passes through
//!    tier 1 s and tier 3 s. The handler records `now - kjob-due-at` for each
//!    retry; p50/p99/max are printed per tier.
//! 2. Isolation: main-topic throughput (no-op handler) with empty tiers, and
//!    with 10 000 records parked in a 1 h tier, in the same run. The last line
//!    is the ratio.
//! 3. A shared tier under another route's flood (`--flood N`, default
//!    50 000; `--flood 0` skips it): route `bulk` fails N jobs once and route
//!    `urgent` 300, each through a 1 s tier, with tiers per route and then
//!    with `shared_retry_tiers` (one 1 s tier for both), in the same run.
//!    Printed: each route's retry lateness (handler start - kjob-due-at).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kjob::headers;
use kjob::retry::RetryPolicy;
use kjob::{JobContext, JobError, KafkaConfig, Producer, Worker, WorkerStats};
use kjob_benches::BenchJob;
use rdkafka::message::{Header, OwnedHeaders};

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}.{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    )
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn run_until<F: Fn() -> bool>(
    worker: Worker,
    timeout: Duration,
    done: F,
) -> anyhow::Result<()> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run_until(async {
        let _ = rx.await;
    }));
    let deadline = Instant::now() + timeout;
    while !done() {
        anyhow::ensure!(Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = tx.send(());
    running.await??;
    Ok(())
}

async fn lateness(config: &KafkaConfig, producer: &Producer, n: i64) -> anyhow::Result<()> {
    let topic = unique("kjob.bench.late");
    kjob::topics::create_topics(config, &[(topic.clone(), 6)]).await?;
    let jobs: Vec<BenchJob> = (0..n)
        .map(|i| BenchJob {
            key: format!("k{i}"),
            seq: i,
            behaviour: "fail-twice".into(),
        })
        .collect();
    for r in producer.enqueue_batch_to(&topic, &jobs).await {
        r?;
    }
    let samples: Arc<Mutex<Vec<(u32, i64)>>> = Default::default();
    let s = samples.clone();
    let worker = Worker::builder(config.clone(), unique("bench-late"))
        .handle_on(&topic, move |_j: BenchJob, ctx: JobContext| {
            if let Some(due) = ctx.due_at_ms {
                if let Ok(mut v) = s.lock() {
                    v.push((ctx.attempt, kjob::dlq::now_ms() - due));
                }
            }
            async move {
                if ctx.attempt <= 2 {
                    Err(JobError::server("bench: fail twice"))
                } else {
                    Ok(())
                }
            }
        })
        .retry(RetryPolicy::tiers([
            Duration::from_secs(1),
            Duration::from_secs(3),
        ]))
        .build()?;
    let stats = worker.stats();
    run_until(worker, Duration::from_secs(120), || {
        WorkerStats::get(&stats.handled) >= n as u64
    })
    .await?;
    let samples = samples.lock().map(|v| v.clone()).unwrap_or_default();
    for (attempt, tier) in [(2u32, "1s"), (3, "3s")] {
        let mut v: Vec<i64> = samples
            .iter()
            .filter(|(a, _)| *a == attempt)
            .map(|(_, l)| *l)
            .collect();
        v.sort();
        println!(
            "tier {tier}: {} retries, lateness p50 {} ms, p99 {} ms, max {} ms, min {} ms",
            v.len(),
            percentile(&v, 0.5),
            percentile(&v, 0.99),
            v.last().copied().unwrap_or(0),
            v.first().copied().unwrap_or(0)
        );
    }
    Ok(())
}

async fn main_rate(
    config: &KafkaConfig,
    producer: &Producer,
    n: i64,
    parked: i64,
) -> anyhow::Result<f64> {
    let topic = unique("kjob.bench.iso");
    let group = unique("bench-iso");
    let policy = RetryPolicy::tiers([Duration::from_secs(3600)]);
    let tier = policy.tier_topic(&topic, 0).context("tier")?;
    kjob::topics::create_topics(config, &[(topic.clone(), 6), (tier.clone(), 6)]).await?;
    if parked > 0 {
        let contract = producer.codec().register::<BenchJob>(&topic).await?;
        let due = (kjob::dlq::now_ms() + 3_600_000).to_string();
        let sends = (0..parked).map(|i| {
            let payload = kjob::codec::Codec::encode(
                &contract,
                &BenchJob {
                    key: format!("p{i}"),
                    seq: i,
                    behaviour: "ok".into(),
                },
            );
            let h = OwnedHeaders::new()
                .insert(Header {
                    key: headers::DUE_AT,
                    value: Some(due.as_str()),
                })
                .insert(Header {
                    key: headers::GROUP,
                    value: Some(group.as_str()),
                });
            let (producer, tier) = (producer.clone(), tier.clone());
            async move {
                let payload = payload?;
                producer
                    .send_raw(&tier, Some(format!("p{i}").as_bytes()), Some(&payload), h)
                    .await
            }
        });
        for r in futures::future::join_all(sends).await {
            r?;
        }
    }
    let jobs: Vec<BenchJob> = (0..n)
        .map(|i| BenchJob {
            key: format!("k{}", i % 5000),
            seq: i,
            behaviour: "ok".into(),
        })
        .collect();
    for r in producer.enqueue_batch_to(&topic, &jobs).await {
        r?;
    }
    let worker = Worker::builder(config.clone(), &group)
        .handle_on(&topic, |_j: BenchJob, _c: JobContext| async {
            Ok::<(), JobError>(())
        })
        .retry(policy)
        .build()?;
    let stats = worker.stats();
    let first: Arc<Mutex<Option<Instant>>> = Default::default();
    let f = first.clone();
    run_until(worker, Duration::from_secs(300), || {
        let h = WorkerStats::get(&stats.handled);
        if h > 0 {
            if let Ok(mut g) = f.lock() {
                g.get_or_insert_with(Instant::now);
            }
        }
        h >= n as u64
    })
    .await?;
    let started = first.lock().ok().and_then(|g| *g).context("no first job")?;
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Section 3: `urgent`'s and `bulk`'s retry lateness (ms, sorted) when
/// `bulk` fails `flood` jobs once and `urgent` 300, through per-route or
/// shared 1 s tiers.
async fn flooded_tier(
    config: &KafkaConfig,
    producer: &Producer,
    flood: i64,
    shared: bool,
) -> anyhow::Result<(Vec<i64>, Vec<i64>)> {
    let (urgent, bulk) = (unique("kjob.bench.urgent"), unique("kjob.bench.bulk"));
    kjob::topics::create_topics(config, &[(urgent.clone(), 6), (bulk.clone(), 6)]).await?;
    let job = |i: i64| BenchJob {
        key: format!("k{i}"),
        seq: i,
        behaviour: "fail-first".into(),
    };
    let bulk_jobs: Vec<BenchJob> = (0..flood).map(job).collect();
    let urgent_jobs: Vec<BenchJob> = (0..300).map(job).collect();
    let late: Arc<Mutex<(Vec<i64>, Vec<i64>)>> = Default::default();
    let handler = |urgent_route: bool| {
        let late = late.clone();
        move |_j: BenchJob, ctx: JobContext| {
            if let (Some(due), true) = (ctx.due_at_ms, ctx.attempt == 2) {
                if let Ok(mut v) = late.lock() {
                    let l = kjob::dlq::now_ms() - due;
                    if urgent_route {
                        v.0.push(l)
                    } else {
                        v.1.push(l)
                    }
                }
            }
            async move {
                if ctx.attempt == 1 {
                    Err(JobError::server("bench: fail once"))
                } else {
                    Ok(())
                }
            }
        }
    };
    let mut builder = Worker::builder(config.clone(), unique("bench-flood"))
        .handle_on(&urgent, handler(true))
        .handle_on(&bulk, handler(false))
        .retry(RetryPolicy::tiers([Duration::from_secs(1)]));
    if shared {
        builder = builder.shared_retry_tiers();
    }
    let worker = builder.build()?;
    let stats = worker.stats();
    // Both floods are written while the worker runs, urgent's spread over
    // the bulk enqueue, so urgent's retries land among bulk's.
    let (p, u, b) = (producer.clone(), urgent.clone(), bulk.clone());
    let writer = tokio::spawn(async move {
        let mut urgent_jobs = urgent_jobs.into_iter();
        for chunk in bulk_jobs.chunks(((flood / 30).max(1)) as usize) {
            for r in p.enqueue_batch_to(&b, chunk).await {
                r?;
            }
            let ten: Vec<BenchJob> = urgent_jobs.by_ref().take(10).collect();
            for r in p.enqueue_batch_to(&u, &ten).await {
                r?;
            }
        }
        let rest: Vec<BenchJob> = urgent_jobs.collect();
        for r in p.enqueue_batch_to(&u, &rest).await {
            r?;
        }
        anyhow::Ok(())
    });
    let total = (flood + 300) as u64;
    run_until(worker, Duration::from_secs(300), || {
        WorkerStats::get(&stats.handled) >= total
    })
    .await?;
    writer.await??;
    let (mut u, mut b) = late.lock().map(|v| v.clone()).unwrap_or_default();
    u.sort();
    b.sort();
    Ok((u, b))
}

fn flag(name: &str, default: i64) -> anyhow::Result<i64> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .context(format!("{name} takes a number"))?
            .parse()
            .context(format!("{name} takes a number")),
        None => Ok(default),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kjob_benches::no_logs();
    let config = KafkaConfig::from_env();
    let producer = Producer::new(&config)?;
    let flood = flag("--flood", 50_000)?;
    if flood > 0 {
        // Urgent's retries alone in the shared tier: the flood row's base.
        let (alone, _) = flooded_tier(&config, &producer, 0, true).await?;
        for shared in [false, true] {
            let (u, b) = flooded_tier(&config, &producer, flood, shared).await?;
            if shared {
                kjob_benches::flood_row(
                    &format!("retry flood in a shared tier: another route retries {flood} jobs"),
                    "300 retries of route urgent, due -> start",
                    percentile(&alone, 0.99) as f64,
                    percentile(&u, 0.99) as f64,
                );
            }
            let show = |v: &[i64]| {
                format!(
                    "{} retries, lateness p50 {} ms, p99 {} ms, max {} ms",
                    v.len(),
                    percentile(v, 0.5),
                    percentile(v, 0.99),
                    v.last().copied().unwrap_or(0)
                )
            };
            let layout = if shared {
                "shared 1 s tier   "
            } else {
                "tiers per route   "
            };
            println!("{layout} urgent: {}", show(&u));
            println!("{layout} bulk ({flood}): {}", show(&b));
        }
    }
    if std::env::args().any(|a| a == "--flood-only") {
        return Ok(());
    }
    lateness(&config, &producer, 300).await?;
    let n = 100_000;
    let empty = main_rate(&config, &producer, n, 0).await?;
    println!("main topic, empty tiers:        {empty:>9.0} jobs/s");
    let full = main_rate(&config, &producer, n, 10_000).await?;
    println!("main topic, 10 000 parked jobs: {full:>9.0} jobs/s");
    println!("full/empty tier ratio: {:.2}", full / empty);
    Ok(())
}
