//! Priority lanes under a bulk flood: does urgent work stay fast while a
//! bulk send of 200 000 jobs lands on the same worker?
//!
//! ```bash
//! ./dev stack up && cargo run --release -p kjob-benches --bin priority
//! ```
//!
//! One worker serves two routes: `critical` (4 partitions) and `bulk`
//! (8 partitions), both with a 2 ms handler. Critical jobs arrive at a
//! steady 200/s from their own producer (as password resets come from
//! another process than a bulk send); each carries its enqueue time, and
//! the handler records enqueue -> done and, against the time the broker
//! acknowledged the job, ack -> start (the part the worker alone adds).
//! Per setting (critical `High` / bulk `Low`, then both at
//! the default `Normal` for comparison), in a fresh group and topics:
//!
//! 1. **baseline**: critical alone for `--secs` (default 10);
//! 2. **flood**: 200 000 bulk jobs enqueued at once, critical still at
//!    200/s for `--secs`; bulk throughput is what bulk handled in that window.
//!
//! `--burst 1`: critical also arrives during the bulk enqueue burst, so
//! the flood figure covers the burst itself (urgent records fetched
//! between bulk batches).
//!
//! The figure that matters is critical's p99 during the flood against its
//! p99 without it (target: at most 2x), and bulk's throughput with lanes
//! against without them.

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kjob::{JobContext, JobError, KafkaConfig, Priority, Producer, Worker};
use kjob_benches::{arg, BenchJob};

const BULK: i64 = 200_000;
const CRITICAL_RATE: u64 = 200;
const HANDLER: Duration = Duration::from_millis(2);

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

struct Phase {
    p50_ms: f64,
    p99_ms: f64,
    n: usize,
}

fn summarize(mut v: Vec<i64>) -> Phase {
    v.sort_unstable();
    if v.is_empty() {
        return Phase {
            p50_ms: f64::NAN,
            p99_ms: f64::NAN,
            n: 0,
        };
    }
    let pct = |p: f64| v[((v.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
    Phase {
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        n: v.len(),
    }
}

/// Enqueues critical jobs at 200/s for `secs`, each stamped with its
/// enqueue time (in `seq`); returns `(seq, acknowledged at)` per job.
async fn critical_load(
    producer: Producer,
    topic: String,
    secs: u64,
) -> anyhow::Result<Vec<(i64, i64)>> {
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / CRITICAL_RATE));
    let until = Instant::now() + Duration::from_secs(secs);
    let mut pending = Vec::new();
    while Instant::now() < until {
        tick.tick().await;
        let seq = now_us();
        let job = BenchJob {
            key: format!("c{}", seq % 64),
            seq,
            behaviour: "ok".into(),
        };
        let (p, t) = (producer.clone(), topic.clone());
        pending.push(tokio::spawn(async move {
            p.enqueue_to(&t, &job).await.map(|_| (seq, now_us()))
        }));
    }
    let mut acks = Vec::with_capacity(pending.len());
    for h in pending {
        acks.push(h.await?.context("critical enqueue")?);
    }
    Ok(acks)
}

/// Enqueue -> done, and ack -> start, of the critical jobs handled.
fn phase(samples: &Mutex<Vec<(i64, i64, i64)>>, acks: &[(i64, i64)]) -> (Phase, Phase) {
    let taken = samples
        .lock()
        .map(|mut v| std::mem::take(&mut *v))
        .unwrap_or_default();
    let acked: std::collections::HashMap<i64, i64> = acks.iter().copied().collect();
    let done = summarize(taken.iter().map(|(seq, _, done)| done - seq).collect());
    let start = summarize(
        taken
            .iter()
            .filter_map(|(seq, start, _)| acked.get(seq).map(|ack| (start - ack).max(0)))
            .collect(),
    );
    (done, start)
}

async fn run(
    config: &KafkaConfig,
    name: &str,
    critical_p: Priority,
    bulk_p: Priority,
    burst: bool,
    secs: u64,
) -> anyhow::Result<()> {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let critical = format!("bench.prio.critical.{}", &suffix[..8]);
    let bulk = format!("bench.prio.bulk.{}", &suffix[..8]);
    kjob::topics::create_topics(config, &[(critical.clone(), 4), (bulk.clone(), 8)])
        .await
        .context("creating the bench topics")?;
    let producer = Producer::new(config)?;
    producer.prepare::<BenchJob>().await?;
    let urgent = Producer::new(config)?;
    urgent.prepare::<BenchJob>().await?;

    // (seq, start, done) per critical job handled.
    let samples = Arc::new(Mutex::new(Vec::<(i64, i64, i64)>::new()));
    let bulk_done = Arc::new(AtomicU64::new(0));
    let (s, b) = (samples.clone(), bulk_done.clone());
    let worker = Worker::builder(config.clone(), format!("bench-prio-{}", &suffix[..8]))
        .handle_on(&critical, move |job: BenchJob, _ctx: JobContext| {
            let s = s.clone();
            async move {
                let start = now_us();
                tokio::time::sleep(HANDLER).await;
                if let Ok(mut v) = s.lock() {
                    v.push((job.seq, start, now_us()));
                }
                Ok::<(), JobError>(())
            }
        })
        .handle_on(&bulk, move |_job: BenchJob, _ctx: JobContext| {
            let b = b.clone();
            async move {
                tokio::time::sleep(HANDLER).await;
                b.fetch_add(1, AtomicOrdering::Relaxed);
                Ok::<(), JobError>(())
            }
        })
        .priority(&critical, critical_p)
        .priority(&bulk, bulk_p)
        .build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run_until(async {
        let _ = stopped.await;
    }));
    // Join, and warm the path up.
    tokio::time::sleep(Duration::from_secs(5)).await;
    critical_load(urgent.clone(), critical.clone(), 2).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    samples.lock().map(|mut v| v.clear()).ok();

    let acks = critical_load(urgent.clone(), critical.clone(), secs).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (baseline, baseline_start) = phase(&samples, &acks);

    // The flood: every bulk job enqueued at once, before critical resumes
    // (with `--burst 1`, critical goes on during the enqueue burst too).
    let during = burst.then(|| tokio::spawn(critical_load(urgent.clone(), critical.clone(), secs)));
    let flood_start = Instant::now();
    let jobs: Vec<BenchJob> = (0..BULK).map(|i| BenchJob::new(i, 10_000)).collect();
    for chunk in jobs.chunks(20_000) {
        for r in producer.enqueue_batch_to(&bulk, chunk).await {
            r.context("bulk enqueue")?;
        }
    }
    let enqueued_in = flood_start.elapsed();
    let bulk_before = bulk_done.load(AtomicOrdering::Relaxed);
    let window = Instant::now();
    let acks = match during {
        Some(h) => h.await??,
        None => critical_load(urgent.clone(), critical.clone(), secs).await?,
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (flood, flood_start_lat) = phase(&samples, &acks);
    let bulk_rate = (bulk_done.load(AtomicOrdering::Relaxed) - bulk_before) as f64
        / window.elapsed().as_secs_f64();
    let _ = stop.send(());
    running.await??;
    if critical_p == Priority::High {
        kjob_benches::flood_row(
            &format!("priority bulk flood: {BULK} Low jobs at once"),
            "High route at 200/s, enqueue -> done",
            baseline.p99_ms,
            flood.p99_ms,
        );
    }
    println!(
        "| {name} | {:.1} / {:.1} ms ({}) | {:.1} / {:.1} ms ({}) | {:.2}x | {:.1} / {:.1} ms | {:.1} / {:.1} ms | {:.0} jobs/s | {:.1} s |",
        baseline.p50_ms,
        baseline.p99_ms,
        baseline.n,
        flood.p50_ms,
        flood.p99_ms,
        flood.n,
        flood.p99_ms / baseline.p99_ms,
        baseline_start.p50_ms,
        baseline_start.p99_ms,
        flood_start_lat.p50_ms,
        flood_start_lat.p99_ms,
        bulk_rate,
        enqueued_in.as_secs_f64(),
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kjob_benches::no_logs();
    let config = KafkaConfig::from_env();
    let secs = arg("secs", 10);
    // 1: critical jobs also arrive during the bulk enqueue burst.
    let burst = arg("burst", 0) == 1;
    println!(
        "critical {CRITICAL_RATE}/s, handlers {HANDLER:?}, {BULK} bulk jobs at once, {secs} s per phase\n"
    );
    println!("| setting | critical enqueue -> done p50 / p99 alone (jobs) | same during the flood (jobs) | p99 ratio | ack -> start p50 / p99 alone | same during the flood | bulk handled during the flood | bulk enqueue took |");
    println!("|---|---|---|---|---|---|---|---|");
    run(
        &config,
        "critical High, bulk Low",
        Priority::High,
        Priority::Low,
        burst,
        secs,
    )
    .await?;
    run(
        &config,
        "both Normal (no priorities)",
        Priority::Normal,
        Priority::Normal,
        burst,
        secs,
    )
    .await?;
    Ok(())
}
