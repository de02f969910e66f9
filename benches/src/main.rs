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
//! stop when the N-th is done. The last line is the ratio. With
//! `--timeline-ms W`, each loop also prints how many records it handled in
//! each window of W ms, to show where a run was slow (a short run's start
//! is: librdkafka fetches and decompresses ahead on its own thread then).
//!
//! Other modes (`--mode`):
//! * `io`: the handler awaits `--sleep-ms` of simulated I/O; reports jobs/s
//!   against the ideal `concurrency / sleep`.
//! * `latency`: a producer in another process enqueues `--rate` jobs/s for
//!   `--secs`, stamping each with its enqueue time; reports enqueue ->
//!   handler start p50/p99.
//! * `rss`: a worker in another process handles `--rate` jobs/s for
//!   `--secs`; reports that process's peak RSS (VmHWM).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kjob::{JobContext, JobError, KafkaConfig, Producer, Worker, WorkerStats};
use kjob_benches::{arg, BenchJob};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message};

fn flag(name: &str) -> Option<String> {
    let flag = format!("--{name}");
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| *a == flag)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// A plain consumer in a fresh group (named after `what`) on `topic`, from
/// the beginning, with the fetch settings kjob's worker uses: the baseline is
/// then the best this consumer can do, not librdkafka's defaults (whose 1 s
/// `fetch.queue.backoff.ms` idles a consumer that drains its queue fast).
fn raw_consumer(config: &KafkaConfig, what: &str, topic: &str) -> anyhow::Result<BaseConsumer> {
    let group = format!("bench-{what}-{}", uuid::Uuid::new_v4().simple());
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &config.bootstrap_servers)
        .set("group.id", &group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "100")
        .set("fetch.queue.backoff.ms", "10")
        .create()?;
    c.subscribe(&[topic])?;
    Ok(c)
}

/// How many records a loop had handled when, for `--timeline-ms`. Without
/// the flag it records nothing: the loops it watches are the ones measured.
#[derive(Default)]
struct Timeline {
    step: Option<Duration>,
    first: Option<Instant>,
    marks: Vec<(Duration, u64)>,
}

impl Timeline {
    fn from_args() -> Self {
        let ms = arg("timeline-ms", 0);
        Self {
            step: (ms > 0).then(|| Duration::from_millis(ms)),
            ..Self::default()
        }
    }

    fn mark(&mut self, handled: u64) {
        if self.step.is_none() {
            return;
        }
        let first = *self.first.get_or_insert_with(Instant::now);
        self.marks.push((first.elapsed(), handled));
    }

    /// Records handled in each window of `step` from the first mark, in
    /// thousands.
    fn windows(&self, step: Duration) -> Vec<u64> {
        let (Some(&(last, _)), false) = (self.marks.last(), step.is_zero()) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let (mut before, mut i) = (0u64, 0usize);
        let mut end = step;
        while end < last + step {
            while i < self.marks.len() && self.marks[i].0 <= end {
                i += 1;
            }
            // Whole thousands reached, so the windows add up to the total.
            let at = i.checked_sub(1).map_or(0, |j| self.marks[j].1) / 1000;
            out.push(at.saturating_sub(before));
            before = at;
            end += step;
        }
        out
    }

    /// Prints the windows when `--timeline-ms` asked for them.
    fn print(&self, what: &str) {
        if let Some(step) = self.step {
            let w: Vec<String> = self.windows(step).iter().map(u64::to_string).collect();
            println!(
                "{what}, thousands per {} ms: {}",
                step.as_millis(),
                w.join(" ")
            );
        }
    }
}

fn raw_loop(config: &KafkaConfig, topic: &str, n: u64) -> anyhow::Result<f64> {
    let c = raw_consumer(config, "raw", topic)?;
    let mut seen = 0u64;
    let mut bytes = 0usize;
    let mut first = None;
    let mut timeline = Timeline::from_args();
    let deadline = Instant::now() + Duration::from_secs(300);
    while seen < n {
        anyhow::ensure!(Instant::now() < deadline, "raw loop saw only {seen} of {n}");
        if let Some(r) = c.poll(Duration::from_millis(100)) {
            let m = r?;
            first.get_or_insert_with(Instant::now);
            bytes += m.payload().map_or(0, <[u8]>::len);
            if seen.is_multiple_of(1000) {
                timeline.mark(seen);
            }
            seen += 1;
        }
    }
    let secs = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
    timeline.mark(seen);
    timeline.print("raw rdkafka loop");
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
    let sleep = Duration::from_millis(arg("sleep-ms", 0));
    // Total time the handlers' sleeps really took (µs): tokio's timer fires
    // on a millisecond tick, so a 5 ms sleep lasts somewhat longer.
    let slept = Arc::new(AtomicU64::new(0));
    let slept_in = slept.clone();
    let worker = Worker::builder(config.clone(), group)
        .handle_on(topic, move |_job: BenchJob, _ctx: JobContext| {
            counter.fetch_add(1, Ordering::Relaxed);
            let slept = slept_in.clone();
            async move {
                if !sleep.is_zero() {
                    let t = Instant::now();
                    tokio::time::sleep(sleep).await;
                    slept.fetch_add(t.elapsed().as_micros() as u64, Ordering::Relaxed);
                }
                Ok::<(), JobError>(())
            }
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
    let cpu0 = process_cpu_secs();
    let mut timeline = Timeline::from_args();
    while WorkerStats::get(&stats.handled) < n {
        timeline.mark(WorkerStats::get(&stats.handled));
        anyhow::ensure!(
            Instant::now() < deadline,
            "kjob worker handled only {}",
            WorkerStats::get(&stats.handled)
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let secs = first.elapsed().as_secs_f64();
    timeline.mark(WorkerStats::get(&stats.handled));
    timeline.print("kjob worker");
    if !sleep.is_zero() {
        let mean_ms = slept.load(Ordering::Relaxed) as f64 / 1000.0 / n as f64;
        println!("handler sleep of {sleep:?} lasted {mean_ms:.2} ms on average");
    }
    if let (Some(a), Some(b)) = (cpu0, process_cpu_secs()) {
        println!(
            "kjob worker CPU: {:.2} cores busy on average (process user+system time / wall time)",
            (b - a) / secs
        );
    }
    let _ = tx.send(());
    running.await??;
    Ok(n as f64 / secs)
}

/// User + system CPU seconds of this process so far (Linux `/proc`).
fn process_cpu_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // USER_HZ is 100 on every Linux this runs on.
    Some((utime + stime) / 100.0)
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// Enqueues `rate` jobs/s for `secs` on `topic`, each stamped (seq) with its
/// enqueue time in epoch microseconds. Runs as its own process.
async fn steady_producer(topic: &str, rate: u64, secs: u64) -> anyhow::Result<()> {
    let producer = Producer::new(&KafkaConfig::from_env())?;
    producer.prepare::<BenchJob>().await?;
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let end = Instant::now() + Duration::from_secs(secs);
    let mut pending = futures::stream::FuturesUnordered::new();
    let mut i = 0u64;
    while Instant::now() < end {
        tick.tick().await;
        let (p, t) = (producer.clone(), topic.to_string());
        let job = BenchJob {
            key: format!("k{}", i % 10_000),
            seq: now_us(),
            behaviour: "ok".into(),
        };
        pending.push(async move { p.enqueue_to(&t, &job).await.map(|_| ()) });
        i += 1;
        while let Some(Some(r)) =
            futures::FutureExt::now_or_never(futures::StreamExt::next(&mut pending))
        {
            r?;
        }
    }
    while let Some(r) = futures::StreamExt::next(&mut pending).await {
        r?;
    }
    Ok(())
}

fn spawn_self(args: &[&str]) -> anyhow::Result<std::process::Child> {
    Ok(std::process::Command::new(std::env::current_exe()?)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()?)
}

async fn create_topic(config: &KafkaConfig, partitions: i32) -> anyhow::Result<String> {
    let topic = format!(
        "kjob.bench.{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    );
    kjob::topics::create_topics(config, &[(topic.clone(), partitions)])
        .await
        .context("creating the bench topic")?;
    Ok(topic)
}

/// Enqueue -> handler start latency at a steady rate.
async fn latency(config: &KafkaConfig) -> anyhow::Result<()> {
    let (rate, secs) = (arg("rate", 5_000), arg("secs", 20));
    let topic = create_topic(config, arg("partitions", 12) as i32).await?;
    Producer::new(config)?.prepare::<BenchJob>().await?;
    let samples = Arc::new(std::sync::Mutex::new(Vec::<i64>::new()));
    let s = samples.clone();
    let group = format!("bench-latency-{}", uuid::Uuid::new_v4().simple());
    let worker = Worker::builder(config.clone(), group)
        .handle_on(&topic, move |job: BenchJob, _ctx: JobContext| {
            let lat = now_us() - job.seq;
            if let Ok(mut v) = s.lock() {
                v.push(lat);
            }
            async { Ok::<(), JobError>(()) }
        })
        .build()?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run_until(async {
        let _ = rx.await;
    }));
    // The baseline in the same run: a raw consumer in its own group reads
    // the same records; its latency is now - the record's CreateTime (ms).
    let stop_raw = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let raw = {
        let (config, topic, stop) = (config.clone(), topic.clone(), stop_raw.clone());
        std::thread::spawn(move || raw_latencies(&config, &topic, &stop))
    };
    // Let the worker join before the producer starts.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut child = spawn_self(&[
        "--mode",
        "produce",
        "--topic",
        &topic,
        "--rate",
        &rate.to_string(),
        "--secs",
        &secs.to_string(),
    ])?;
    let status = tokio::task::spawn_blocking(move || child.wait()).await??;
    anyhow::ensure!(status.success(), "producer process failed: {status}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = tx.send(());
    running.await??;
    stop_raw.store(true, Ordering::Relaxed);
    let mut r = raw
        .join()
        .map_err(|_| anyhow::anyhow!("raw consumer thread panicked"))??;
    let mut v = samples.lock().map(|v| v.clone()).unwrap_or_default();
    v.sort_unstable();
    r.sort_unstable();
    anyhow::ensure!(!v.is_empty(), "no job was handled");
    anyhow::ensure!(!r.is_empty(), "the raw consumer saw no record");
    let pct = |v: &[i64], p: f64| v[((v.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
    println!(
        "raw consumer, same records (now - CreateTime, ms clock): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        pct(&r, 0.5),
        pct(&r, 0.99),
        pct(&r, 1.0)
    );
    println!(
        "latency at {rate} jobs/s for {secs} s ({} jobs, producer in another process): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        v.len(),
        pct(&v, 0.5),
        pct(&v, 0.99),
        pct(&v, 1.0)
    );
    Ok(())
}

/// Latencies (µs) a plain consumer sees for every record of `topic` until
/// `stop`: the floor that Kafka, the producer's batching and the fetch set.
fn raw_latencies(
    config: &KafkaConfig,
    topic: &str,
    stop: &std::sync::atomic::AtomicBool,
) -> anyhow::Result<Vec<i64>> {
    let c = raw_consumer(config, "latency-raw", topic)?;
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        if let Some(r) = c.poll(Duration::from_millis(20)) {
            if let Some(ts) = r?.timestamp().to_millis() {
                out.push(now_us() - ts * 1000);
            }
        }
    }
    Ok(out)
}

/// Peak RSS of a worker process alone at a steady rate.
async fn rss(config: &KafkaConfig) -> anyhow::Result<()> {
    let (rate, secs) = (arg("rate", 10_000), arg("secs", 60));
    let topic = create_topic(config, arg("partitions", 12) as i32).await?;
    Producer::new(config)?.prepare::<BenchJob>().await?;
    let child = spawn_self(&[
        "--mode",
        "rss-worker",
        "--topic",
        &topic,
        "--secs",
        &(secs + 8).to_string(),
    ])?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    steady_producer(&topic, rate, secs).await?;
    let out = tokio::task::spawn_blocking(move || child.wait_with_output()).await??;
    let text = String::from_utf8_lossy(&out.stdout);
    println!(
        "worker process at {rate} jobs/s for {secs} s: {}",
        text.trim()
    );
    Ok(())
}

/// The worker process of the `rss` mode: handles until `--secs` pass, then
/// prints its handled count and peak RSS.
async fn rss_worker(topic: &str, secs: u64) -> anyhow::Result<()> {
    let group = format!("bench-rss-{}", uuid::Uuid::new_v4().simple());
    let worker = Worker::builder(KafkaConfig::from_env(), group)
        .handle_on(topic, |_job: BenchJob, _ctx: JobContext| async {
            Ok::<(), JobError>(())
        })
        .build()?;
    let stats = worker.stats();
    worker
        .run_until(tokio::time::sleep(Duration::from_secs(secs)))
        .await?;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM"))
        .unwrap_or("VmHWM: unknown")
        .split_whitespace()
        .skip(1)
        .collect::<Vec<_>>()
        .join(" ");
    println!(
        "{} jobs handled, peak RSS (VmHWM) {hwm}",
        WorkerStats::get(&stats.handled)
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kjob_benches::no_logs();
    let config = KafkaConfig::from_env();
    match flag("mode").as_deref() {
        None | Some("throughput") | Some("io") => {}
        Some("latency") => return latency(&config).await,
        Some("rss") => return rss(&config).await,
        Some("produce") => {
            let topic = flag("topic").context("--topic")?;
            return steady_producer(&topic, arg("rate", 5_000), arg("secs", 20)).await;
        }
        Some("rss-worker") => {
            let topic = flag("topic").context("--topic")?;
            return rss_worker(&topic, arg("secs", 60)).await;
        }
        Some(other) => anyhow::bail!("unknown --mode {other}: throughput, io, latency or rss"),
    }
    let n = arg("jobs", 200_000);
    let partitions = arg("partitions", 6) as i32;
    let keys = arg("keys", 10_000);
    let topic = create_topic(&config, partitions).await?;
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

    let sleep_ms = arg("sleep-ms", 0);
    if sleep_ms > 0 {
        let concurrency = arg("concurrency", 64);
        let kjob = kjob_worker(&config, &topic, n).await?;
        let ideal = concurrency as f64 * 1000.0 / sleep_ms as f64;
        println!("kjob worker ({sleep_ms} ms I/O, concurrency {concurrency}): {kjob:>10.0} jobs/s");
        println!(
            "kjob/ideal ratio: {:.2} (ideal {ideal:.0} jobs/s)",
            kjob / ideal
        );
        return Ok(());
    }
    let cfg = config.clone();
    let t = topic.clone();
    let raw = tokio::task::spawn_blocking(move || raw_loop(&cfg, &t, n)).await??;
    println!("raw rdkafka loop:        {raw:>10.0} records/s");
    let kjob = kjob_worker(&config, &topic, n).await?;
    println!("kjob worker (no-op):     {kjob:>10.0} jobs/s");
    println!("kjob/raw-loop ratio: {:.2}", kjob / raw);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeline_counts_what_was_handled_in_each_window() {
        let mut t = Timeline::default();
        t.mark(7);
        assert!(t.marks.is_empty(), "nothing is recorded without the flag");
        for (ms, n) in [(0, 0), (5, 1_000), (25, 5_000), (41, 6_000)] {
            t.marks.push((Duration::from_millis(ms), n));
        }
        assert_eq!(t.windows(Duration::from_millis(20)), vec![1, 4, 1]);
        assert_eq!(t.windows(Duration::from_millis(50)), vec![6]);
        // 1 500 in each window: the thousands reached, not each window's
        // own count cut down (1 and 1), so the windows add up to 3.
        t.marks = vec![
            (Duration::ZERO, 0),
            (Duration::from_millis(10), 1_500),
            (Duration::from_millis(30), 3_000),
        ];
        assert_eq!(t.windows(Duration::from_millis(20)), vec![1, 2]);
        assert!(t.windows(Duration::ZERO).is_empty());
        assert!(Timeline::default()
            .windows(Duration::from_millis(20))
            .is_empty());
    }
}
