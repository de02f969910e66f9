//! Rolling deploys under load: N worker processes on one route at a steady
//! rate, each restarted in turn with SIGTERM, per group protocol.
//!
//! ```bash
//! # the single node
//! ./dev stack up && cargo run --release -p kjob-benches --bin rolling -- [WORKERS] [RATE]
//! # the three-broker SASL_SSL cluster (KafkaConfig::from_env reads the
//! # KJOB_SECURITY_PROTOCOL, KJOB_SASL_* and KJOB_SSL_CA_LOCATION it exports)
//! ./dev stack up --brokers 3 && source .stack/cluster/client.env
//! cargo run --release -p kjob-benches --features cluster --bin rolling -- 4 2000
//! ```
//!
//! Flags after the positional ones: `--protocols eager,cooperative,static,kip848`
//! (a subset, in that order; all four by default), `--partitions N` (12).
//!
//! Reports per restart the longest time any main-topic partition went
//! without a handled job, SIGTERM to exit, and main-topic partitions per
//! worker afterwards; per protocol, the enqueue rate reached, the largest
//! backlog seen, the drain time once the feed stopped, lost (must be 0) and
//! duplicates. Workers get their protocol the way a deployment would: through
//! `KJOB_GROUP_PROTOCOL` and `KJOB_INSTANCE_ID`.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kjob::{KafkaConfig, Producer};
use kjob_benches::BenchJob;

/// How long after each SIGTERM the stall is measured (covers the leave, the
/// replacement's start and its join).
const WINDOW: Duration = Duration::from_secs(12);
/// Load before the first restart, so every worker is in and warm.
const WARMUP: Duration = Duration::from_secs(15);

/// A protocol under test, as a deployment would configure it.
struct Protocol {
    /// The `--protocols` name.
    key: &'static str,
    /// The name in the tables.
    name: &'static str,
    /// `KJOB_GROUP_PROTOCOL`, if not the default.
    group_protocol: Option<&'static str>,
    /// librdkafka overrides (`BENCH_RDKAFKA`).
    rdkafka: &'static [(&'static str, &'static str)],
    /// Whether each worker gets a stable `KJOB_INSTANCE_ID`.
    static_ids: bool,
}

const PROTOCOLS: [Protocol; 4] = [
    Protocol {
        key: "eager",
        name: "classic eager range (default)",
        group_protocol: Some("classic"),
        rdkafka: &[],
        static_ids: false,
    },
    Protocol {
        key: "cooperative",
        name: "classic cooperative-sticky",
        group_protocol: Some("classic"),
        rdkafka: &[("partition.assignment.strategy", "cooperative-sticky")],
        static_ids: false,
    },
    Protocol {
        key: "static",
        name: "classic + static membership",
        group_protocol: Some("classic"),
        rdkafka: &[],
        static_ids: true,
    },
    Protocol {
        key: "kip848",
        name: "KIP-848 (range)",
        group_protocol: Some("consumer"),
        rdkafka: &[],
        static_ids: false,
    },
];

/// What the driver has seen: every handled job, and how often each seq was handled.
#[derive(Default)]
struct Seen {
    /// (worker slot, partition, seq, when).
    events: Vec<(usize, i32, i64, Instant)>,
    /// seq -> deliveries.
    counts: HashMap<i64, u32>,
}

type Shared = Arc<Mutex<Seen>>;

fn spawn(topic: &str, group: &str, p: &Protocol, slot: usize) -> anyhow::Result<Child> {
    let o: Vec<String> = p.rdkafka.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut c = Command::new(std::env::current_exe()?);
    c.arg("worker")
        .env("BENCH_TOPIC", topic)
        .env("BENCH_GROUP", group)
        .env("BENCH_RDKAFKA", o.join(","))
        .env_remove("KJOB_GROUP_PROTOCOL")
        .env_remove("KJOB_INSTANCE_ID")
        .stdout(Stdio::piped());
    if let Some(gp) = p.group_protocol {
        c.env("KJOB_GROUP_PROTOCOL", gp);
    }
    if p.static_ids {
        c.env("KJOB_INSTANCE_ID", format!("{group}-{slot}"));
    }
    Ok(c.spawn()?)
}

fn watch(child: &mut Child, slot: usize, seen: Shared) {
    if let Some(out) = child.stdout.take() {
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let mut it = line.split_whitespace();
                let (Some(p), Some(s)) = (it.next(), it.next()) else {
                    continue;
                };
                if let (Ok(p), Ok(s)) = (p.parse(), s.parse()) {
                    if let Ok(mut seen) = seen.lock() {
                        seen.events.push((slot, p, s, Instant::now()));
                        *seen.counts.entry(s).or_default() += 1;
                    }
                }
            }
        });
    }
}

/// Longest gap between handled jobs of any partition within `[from, to]`.
fn longest_stall(
    events: &[(usize, i32, i64, Instant)],
    partitions: i32,
    from: Instant,
    to: Instant,
) -> Duration {
    let mut last: HashMap<i32, Instant> = (0..partitions).map(|p| (p, from)).collect();
    let mut worst = Duration::ZERO;
    for (_, p, _, at) in events.iter().filter(|e| e.3 >= from && e.3 <= to) {
        if let Some(prev) = last.insert(*p, *at) {
            worst = worst.max(at.duration_since(prev));
        }
    }
    for prev in last.values() {
        worst = worst.max(to.saturating_duration_since(*prev));
    }
    worst
}

/// Main-topic partitions each live slot handled in `[from, to]`.
fn spread(
    events: &[(usize, i32, i64, Instant)],
    from: Instant,
    to: Instant,
    slots: usize,
) -> Vec<usize> {
    let mut per: Vec<HashSet<i32>> = vec![HashSet::new(); slots];
    for (slot, p, _, at) in events {
        if *at >= from && *at <= to {
            per[*slot].insert(*p);
        }
    }
    per.iter().map(HashSet::len).collect()
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// Per-protocol totals.
struct Totals {
    acked: usize,
    rate: f64,
    max_backlog: usize,
    drain: Option<Duration>,
    lost: usize,
    duplicates: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kjob_benches::no_logs();
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("worker") {
        return kjob_benches::printing_worker().await;
    }
    let positional: Vec<&String> = args
        .iter()
        .skip(1)
        .take_while(|a| !a.starts_with("--"))
        .collect();
    let workers: usize = positional.first().and_then(|a| a.parse().ok()).unwrap_or(3);
    let rate: u64 = positional
        .get(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(400);
    let partitions: i32 = flag(&args, "--partitions")
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let wanted = flag(&args, "--protocols");
    let chosen: Vec<&Protocol> = match &wanted {
        None => PROTOCOLS.iter().collect(),
        Some(list) => {
            let keys: Vec<&str> = list.split(',').map(str::trim).collect();
            for k in &keys {
                anyhow::ensure!(
                    PROTOCOLS.iter().any(|p| p.key == *k),
                    "unknown protocol {k:?} in --protocols; use eager, cooperative, static, kip848"
                );
            }
            PROTOCOLS.iter().filter(|p| keys.contains(&p.key)).collect()
        }
    };
    let config = KafkaConfig::from_env();
    println!(
        "{workers} workers, {rate} jobs/s offered, {partitions} partitions, Kafka {} ({})\n",
        config.bootstrap_servers,
        config.security_protocol.as_deref().unwrap_or("PLAINTEXT")
    );
    println!("| protocol | restart | longest partition stall | SIGTERM -> exit | main partitions per worker after |");
    println!("|---|---|---|---|---|");
    let mut totals = Vec::new();
    for p in chosen {
        let t = run(&config, p, workers, rate, partitions).await?;
        totals.push((p.name, t));
    }
    println!("\n| protocol | enqueued (rate reached) | largest backlog | drain after the feed stopped | lost | duplicates |");
    println!("|---|---|---|---|---|---|");
    for (name, t) in totals {
        println!(
            "| {name} | {} ({:.0}/s) | {} | {} | {} | {} |",
            t.acked,
            t.rate,
            t.max_backlog,
            t.drain
                .map_or("not drained in 60 s".to_string(), |d| format!(
                    "{:.1} s",
                    d.as_secs_f64()
                )),
            t.lost,
            t.duplicates
        );
    }
    Ok(())
}

/// Feeds `rate` jobs/s in batches every 10 ms, each batch enqueued
/// concurrently (an awaited enqueue at a time cannot exceed one per broker
/// round trip); records which seqs the broker acknowledged.
fn feed(
    producer: Producer,
    topic: String,
    rate: u64,
    acked: Arc<Mutex<Vec<i64>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        let started = Instant::now();
        let mut next = 0i64;
        loop {
            tick.tick().await;
            let due = (started.elapsed().as_secs_f64() * rate as f64) as i64;
            if due <= next {
                continue;
            }
            let jobs: Vec<BenchJob> = (next..due).map(|s| BenchJob::new(s, 10_000)).collect();
            next = due;
            let (producer, topic, acked) = (producer.clone(), topic.clone(), acked.clone());
            tokio::spawn(async move {
                let results = producer.enqueue_batch_to(&topic, &jobs).await;
                if let Ok(mut a) = acked.lock() {
                    for (job, r) in jobs.iter().zip(results) {
                        if r.is_ok() {
                            a.push(job.seq);
                        }
                    }
                }
            });
        }
    })
}

async fn run(
    config: &KafkaConfig,
    p: &Protocol,
    n: usize,
    rate: u64,
    partitions: i32,
) -> anyhow::Result<Totals> {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let topic = format!("bench.rolling.{}", &suffix[..8]);
    let group = format!("bench-rolling-{}", &suffix[..8]);
    kjob::topics::create_topics(config, &[(topic.clone(), partitions)]).await?;
    let producer = Producer::new(config)?;
    producer.prepare::<BenchJob>().await?;
    let seen: Shared = Default::default();
    let mut children = Vec::new();
    for i in 0..n {
        let mut c = spawn(&topic, &group, p, i)?;
        watch(&mut c, i, seen.clone());
        children.push(c);
    }
    let acked: Arc<Mutex<Vec<i64>>> = Default::default();
    let fed_from = Instant::now();
    let feeder = feed(producer.clone(), topic.clone(), rate, acked.clone());
    // Largest backlog (acknowledged, not yet handled), sampled twice a second.
    let worst = Arc::new(AtomicUsize::new(0));
    let backlog = {
        let (seen, acked, worst) = (seen.clone(), acked.clone(), worst.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let a = acked.lock().map(|a| a.len()).unwrap_or(0);
                let s = seen.lock().map(|s| s.counts.len()).unwrap_or(0);
                worst.fetch_max(a.saturating_sub(s), Ordering::Relaxed);
            }
        })
    };
    tokio::time::sleep(WARMUP).await;
    for (i, child) in children.iter_mut().enumerate() {
        let from = Instant::now();
        let pid = child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status()?;
        let _ = child.wait();
        let exit = from.elapsed();
        let mut c = spawn(&topic, &group, p, i)?;
        watch(&mut c, i, seen.clone());
        *child = c;
        tokio::time::sleep(WINDOW).await;
        let to = Instant::now();
        let (stall, per) = match seen.lock() {
            Ok(s) => (
                longest_stall(&s.events, partitions, from, to),
                spread(&s.events, to - Duration::from_secs(3), to, n),
            ),
            Err(_) => (Duration::ZERO, Vec::new()),
        };
        println!(
            "| {} | {} | {:.2} s | {:.2} s | {:?} |",
            p.name,
            i + 1,
            stall.as_secs_f64(),
            exit.as_secs_f64(),
            per
        );
    }
    feeder.abort();
    // Let the enqueues already handed to the producer finish.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stopped = Instant::now();
    let fed_for = stopped.duration_since(fed_from).as_secs_f64() - 2.0;
    let want: HashSet<i64> = acked
        .lock()
        .map(|a| a.iter().copied().collect())
        .unwrap_or_default();
    let deadline = stopped + Duration::from_secs(60);
    let mut drain = None;
    let (mut lost, mut duplicates) = (want.len(), 0usize);
    while Instant::now() < deadline {
        if let Ok(s) = seen.lock() {
            lost = want.iter().filter(|q| !s.counts.contains_key(q)).count();
            duplicates = want
                .iter()
                .filter_map(|q| s.counts.get(q))
                .map(|c| (*c as usize).saturating_sub(1))
                .sum();
        }
        if lost == 0 {
            drain = Some(stopped.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    backlog.abort();
    let max_backlog = worst.load(Ordering::Relaxed);
    for c in &mut children {
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let _ = c.wait();
    }
    Ok(Totals {
        acked: want.len(),
        rate: want.len() as f64 / fed_for.max(1.0),
        max_backlog,
        drain,
        lost,
        duplicates,
    })
}
