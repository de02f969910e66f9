//! Short delays on time: how late do jobs due now, or due in under a
//! second, start, alone and beside a delay flood?
//!
//! ```bash
//! ./dev stack up && cargo run --release -p kjob-benches --bin delays
//! ```
//!
//! One worker (`--concurrency`, default 64, kjob's default) serves one route on 8 partitions that
//! takes delayed jobs. A producer sends `--rate` (100) jobs/s for `--secs`
//! (20) per phase, each with its own key: a quarter due now
//! (`enqueue_in(0)`), the rest with a delay uniform in 0–1 s. Jobs due that
//! soon go to the main topic and wait out their time in the worker. The
//! handler records `start - kjob-run-at` (the producer's clock reading at
//! the call plus the delay), so the figure includes the enqueue itself.
//!
//! 1. **alone**: the short delays only;
//! 2. **delay flood**: `--flood` (5 000) jobs enqueued at once with a 3 s
//!    delay (all due within the same second, through the delay topics)
//!    while the short delays go on; the flood's own lateness is printed
//!    too.
//!
//! A job due now is late by its enqueue's acknowledgement at least, so its
//! lateness less that is printed too: the worker's own part.
//!
//! The issue's bound: short delays p99 ≤ 20 ms late and max ≤ 100 ms
//! alone; during the flood, p99 ≤ 2 × alone + 20 ms.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kjob::{JobContext, JobError, KafkaConfig, Producer, Worker};
use kjob_benches::{arg, BenchJob};
use rand::Rng as _;

/// Seqs from here on are the flood's.
const FLOOD_BASE: i64 = 1_000_000_000;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// p50, p99 and max of `v` (ms), and how many.
fn summary(mut v: Vec<i64>) -> String {
    v.sort_unstable();
    let Some(&max) = v.last() else {
        return "none".into();
    };
    let pct = |p: f64| v[((v.len() - 1) as f64 * p) as usize];
    format!("{} / {} / {} ms ({})", pct(0.5), pct(0.99), max, v.len())
}

/// Sends short delays at `rate`/s for `secs`; returns how many were sent.
async fn short_delays(
    producer: Producer,
    topic: String,
    rate: u64,
    secs: u64,
    first_seq: i64,
    acks: &Acks,
) -> anyhow::Result<i64> {
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate.max(1)));
    let until = Instant::now() + Duration::from_secs(secs);
    let mut pending = Vec::new();
    let mut seq = first_seq;
    while Instant::now() < until {
        tick.tick().await;
        let delay = if seq % 4 == 0 {
            Duration::ZERO
        } else {
            Duration::from_millis(rand::rng().random_range(1..1_000))
        };
        let job = BenchJob {
            key: format!("s{seq}"),
            seq,
            behaviour: "ok".into(),
        };
        seq += 1;
        let (p, t) = (producer.clone(), topic.clone());
        pending.push(tokio::spawn(async move {
            let asked = Instant::now();
            p.enqueue_in_to(&t, &job, delay)
                .await
                .map(|_| (job.seq, asked.elapsed().as_millis() as i64))
        }));
    }
    let mut took = Vec::with_capacity(pending.len());
    for h in pending {
        let (seq, ms) = h.await?.context("short-delay enqueue")?;
        took.push(ms);
        if let Ok(mut a) = acks.lock() {
            a.insert(seq, ms);
        }
    }
    eprintln!("enqueue -> acknowledged: {}", summary(took));
    Ok(seq - first_seq)
}

/// Each short delay's enqueue → acknowledged time (ms), by seq: the worst
/// jobs are printed with theirs, to tell the enqueue's part of a late start
/// from the worker's.
type Acks = Arc<Mutex<std::collections::HashMap<i64, i64>>>;

/// `(seq, lateness ms)` of every job handled since the last take.
type Samples = Arc<Mutex<Vec<(i64, i64)>>>;

fn take(samples: &Samples) -> Vec<(i64, i64)> {
    samples
        .lock()
        .map(|mut v| std::mem::take(&mut *v))
        .unwrap_or_default()
}

/// Prints one phase's row: due now, under 1 s, and the flood's own jobs;
/// answers the short delays' p99 (ms).
fn row(name: &str, taken: &[(i64, i64)], sent: i64, acks: &Acks) -> f64 {
    let short = |due_now: bool| {
        taken
            .iter()
            .filter(|(seq, _)| *seq < FLOOD_BASE && (seq % 4 == 0) == due_now)
            .map(|(_, late)| *late)
            .collect::<Vec<_>>()
    };
    let all_short: Vec<i64> = taken
        .iter()
        .filter(|(seq, _)| *seq < FLOOD_BASE)
        .map(|(_, late)| *late)
        .collect();
    let flood: Vec<i64> = taken
        .iter()
        .filter(|(seq, _)| *seq >= FLOOD_BASE)
        .map(|(_, late)| *late)
        .collect();
    let early = taken.iter().filter(|(_, late)| *late < 0).count();
    let mut worst: Vec<(i64, i64)> = taken
        .iter()
        .filter(|(seq, _)| *seq < FLOOD_BASE)
        .copied()
        .collect();
    worst.sort_unstable_by_key(|(_, late)| std::cmp::Reverse(*late));
    let acks = acks.lock().map(|a| a.clone()).unwrap_or_default();
    // A job due now is late by its enqueue's acknowledgement at least (the
    // broker's part); what is left after it is the worker's.
    let worker_part: Vec<i64> = taken
        .iter()
        .filter(|(seq, _)| *seq < FLOOD_BASE && seq % 4 == 0)
        .filter_map(|(seq, late)| acks.get(seq).map(|ack| late - ack))
        .collect();
    let worst: Vec<String> = worst
        .iter()
        .take(5)
        .map(|(seq, late)| {
            let ack = acks.get(seq).map_or("?".to_string(), |a| a.to_string());
            let kind = if seq % 4 == 0 { "now" } else { "0-1s" };
            format!("{late} ms ({kind}, ack {ack} ms)")
        })
        .collect();
    eprintln!("{name}: latest short delays: {}", worst.join(", "));
    let mut sorted = all_short.clone();
    sorted.sort_unstable();
    let p99 = sorted
        .get(((sorted.len().max(1) - 1) as f64 * 0.99) as usize)
        .copied()
        .unwrap_or(0) as f64;
    println!(
        "| {name} | {} | {} | {} | {} | {} | {early} | {sent} |",
        summary(short(true)),
        summary(worker_part),
        summary(short(false)),
        summary(all_short),
        summary(flood),
    );
    p99
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kjob_benches::no_logs();
    let config = KafkaConfig::from_env();
    let rate = arg("rate", 100);
    let secs = arg("secs", 20);
    let flood = arg("flood", 5_000) as i64;
    let concurrency = arg("concurrency", 64) as usize;
    run(&config, rate, secs, flood, concurrency).await
}

async fn run(
    config: &KafkaConfig,
    rate: u64,
    secs: u64,
    flood: i64,
    concurrency: usize,
) -> anyhow::Result<()> {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let topic = format!("bench.delays.{}", &suffix[..8]);
    kjob::topics::create_topics(config, &[(topic.clone(), 8)])
        .await
        .context("creating the bench topic")?;
    let producer = Producer::new(config)?;
    producer.prepare::<BenchJob>().await?;
    let flooder = Producer::new(config)?;
    flooder.prepare::<BenchJob>().await?;

    let samples: Samples = Arc::new(Mutex::new(Vec::new()));
    let acks: Acks = Arc::default();
    let s = samples.clone();
    let worker = Worker::builder(config.clone(), format!("bench-delays-{}", &suffix[..8]))
        .handle_on(&topic, move |job: BenchJob, ctx: JobContext| {
            let s = s.clone();
            async move {
                let late = ctx.due_at_ms.map_or(0, |due| now_ms() - due);
                if let Ok(mut v) = s.lock() {
                    v.push((job.seq, late));
                }
                Ok::<(), JobError>(())
            }
        })
        .delayed_jobs_on(&topic)
        .concurrency(concurrency)
        .build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run_until(async {
        let _ = stopped.await;
    }));
    // Join, and warm the path up.
    tokio::time::sleep(Duration::from_secs(5)).await;
    short_delays(producer.clone(), topic.clone(), rate, 2, -1_000_000, &acks).await?;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    take(&samples);

    println!(
        "short delays {rate}/s (a quarter due now, the rest 0-1 s, a key each), {secs} s per phase; \
         flood: {flood} jobs due 3 s after they were sent\n"
    );
    println!("| phase | due now: late p50 / p99 / max (jobs) | due now, less its enqueue's ack | due in 0-1 s | all short | the flood's own | early | short sent |");
    println!("|---|---|---|---|---|---|---|---|");
    let sent = short_delays(producer.clone(), topic.clone(), rate, secs, 0, &acks).await?;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let alone = row("alone", &take(&samples), sent, &acks);

    // The flood, sent in the background while the short delays go on.
    let flood_jobs: Vec<BenchJob> = (0..flood)
        .map(|i| BenchJob {
            key: format!("f{}", i % 1_000),
            seq: FLOOD_BASE + i,
            behaviour: "ok".into(),
        })
        .collect();
    let (f, t) = (flooder.clone(), topic.clone());
    let flooding = tokio::spawn(async move {
        let sends = flood_jobs
            .iter()
            .map(|j| f.enqueue_in_to(&t, j, Duration::from_secs(3)));
        for r in futures::future::join_all(sends).await {
            r.context("flood enqueue")?;
        }
        anyhow::Ok(())
    });
    let sent = short_delays(
        producer.clone(),
        topic.clone(),
        rate,
        secs,
        1_000_000,
        &acks,
    )
    .await?;
    flooding.await??;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let during = row("beside a delay flood", &take(&samples), sent, &acks);
    kjob_benches::flood_row(
        &format!("delay flood: {flood} jobs due in the same second"),
        &format!("short delays (0-1 s) at {rate}/s, due -> start"),
        alone,
        during,
    );

    let _ = stop.send(());
    running.await??;
    Ok(())
}
