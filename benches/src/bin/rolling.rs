//! Rolling deploys under load: N worker processes on one route at a steady
//! rate, each restarted in turn with SIGTERM, per group protocol.
//!
//! ```bash
//! ./dev stack up && cargo run --release -p kjob-benches --bin rolling -- [WORKERS] [RATE]
//! ```
//!
//! Reports per restart the longest time any main-topic partition went
//! without a handled job, SIGTERM to exit, and main-topic partitions per
//! worker afterwards; per protocol, lost (must be 0) and duplicates.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kjob::{KafkaConfig, Producer};
use kjob_benches::BenchJob;

const PARTITIONS: i32 = 12;

/// A protocol under test: its name, librdkafka settings, and whether each
/// worker gets a static-member id.
type Setting = (&'static str, &'static [(&'static str, &'static str)], bool);

/// Progress seen by the driver: (worker slot, partition, seq, when).
type Events = Arc<Mutex<Vec<(usize, i32, i64, Instant)>>>;

fn spawn(
    topic: &str,
    group: &str,
    rd: &[(&str, &str)],
    instance: Option<String>,
) -> anyhow::Result<Child> {
    let o: Vec<String> = rd.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut c = Command::new(std::env::current_exe()?);
    c.arg("worker")
        .env("BENCH_TOPIC", topic)
        .env("BENCH_GROUP", group)
        .env("BENCH_RDKAFKA", o.join(","))
        .stdout(Stdio::piped());
    if let Some(id) = instance {
        c.env("BENCH_INSTANCE", id);
    }
    Ok(c.spawn()?)
}

fn watch(child: &mut Child, slot: usize, events: Events) {
    if let Some(out) = child.stdout.take() {
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let mut it = line.split_whitespace();
                let (Some(p), Some(s)) = (it.next(), it.next()) else {
                    continue;
                };
                if let (Ok(p), Ok(s)) = (p.parse(), s.parse()) {
                    if let Ok(mut e) = events.lock() {
                        e.push((slot, p, s, Instant::now()));
                    }
                }
            }
        });
    }
}

/// Longest gap between handled jobs of any partition within `[from, to]`.
fn longest_stall(events: &[(usize, i32, i64, Instant)], from: Instant, to: Instant) -> Duration {
    let mut last: HashMap<i32, Instant> = HashMap::new();
    let mut worst = Duration::ZERO;
    for p in 0..PARTITIONS {
        last.insert(p, from);
    }
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("worker") {
        return kjob_benches::printing_worker().await;
    }
    let workers: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(3);
    let rate: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(400);
    let protocols: [Setting; 4] = [
        (
            "classic eager range (default)",
            &[("group.protocol", "classic")],
            false,
        ),
        (
            "classic cooperative-sticky",
            &[
                ("group.protocol", "classic"),
                ("partition.assignment.strategy", "cooperative-sticky"),
            ],
            false,
        ),
        (
            "classic + static membership",
            &[("group.protocol", "classic")],
            true,
        ),
        (
            "KIP-848 (range)",
            &[("group.protocol", "consumer")],
            false,
        ),
    ];
    println!("{workers} workers, {rate} jobs/s, {PARTITIONS} partitions\n");
    println!("| protocol | restart | longest partition stall | SIGTERM -> exit | main partitions per worker after |");
    println!("|---|---|---|---|---|");
    let mut totals = Vec::new();
    for (name, rd, static_ids) in protocols {
        let (lost, dups) = run(name, rd, static_ids, workers, rate).await?;
        totals.push((name, lost, dups));
    }
    println!("\n| protocol | lost | duplicates |\n|---|---|---|");
    for (name, lost, dups) in totals {
        println!("| {name} | {lost} | {dups} |");
    }
    Ok(())
}

async fn run(
    name: &str,
    rd: &[(&str, &str)],
    static_ids: bool,
    n: usize,
    rate: u64,
) -> anyhow::Result<(usize, usize)> {
    let config = KafkaConfig::from_env();
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let topic = format!("bench.rolling.{}", &suffix[..8]);
    let group = format!("bench-rolling-{}", &suffix[..8]);
    kjob::topics::create_topics(&config, &[(topic.clone(), PARTITIONS)]).await?;
    let producer = Producer::new(&config)?;
    producer.prepare::<BenchJob>().await?;
    let events: Events = Default::default();
    let instance = |i: usize| static_ids.then(|| format!("{group}-{i}"));
    let mut children = Vec::new();
    for i in 0..n {
        let mut c = spawn(&topic, &group, rd, instance(i))?;
        watch(&mut c, i, events.clone());
        children.push(c);
    }
    let produced = Arc::new(Mutex::new(0i64));
    let feed = {
        let (producer, topic, produced) = (producer.clone(), topic.clone(), produced.clone());
        tokio::spawn(async move {
            let mut seq = 0i64;
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate.max(1)));
            loop {
                tick.tick().await;
                if producer
                    .enqueue_to(&topic, &BenchJob::new(seq, 10_000))
                    .await
                    .is_ok()
                {
                    seq += 1;
                    if let Ok(mut p) = produced.lock() {
                        *p = seq;
                    }
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(15)).await;
    for (i, child) in children.iter_mut().enumerate() {
        let from = Instant::now();
        let pid = child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status()?;
        let _ = child.wait();
        let exit = from.elapsed();
        let mut c = spawn(&topic, &group, rd, instance(i))?;
        watch(&mut c, i, events.clone());
        *child = c;
        tokio::time::sleep(Duration::from_secs(12)).await;
        let to = Instant::now();
        let ev = events.lock().map(|e| e.clone()).unwrap_or_default();
        let stall = longest_stall(&ev, from, to);
        let per = spread(&ev, to - Duration::from_secs(3), to, n);
        println!(
            "| {name} | {} | {:.2} s | {:.2} s | {:?} |",
            i + 1,
            stall.as_secs_f64(),
            exit.as_secs_f64(),
            per
        );
    }
    feed.abort();
    let want = produced.lock().map(|p| *p).unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut distinct, mut total) = (0usize, 0usize);
    while Instant::now() < deadline {
        let ev = events.lock().map(|e| e.clone()).unwrap_or_default();
        let seqs: HashSet<i64> = ev.iter().map(|e| e.2).filter(|s| *s < want).collect();
        distinct = seqs.len();
        total = ev.iter().filter(|e| e.2 < want).count();
        if distinct as i64 == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for c in &mut children {
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let _ = c.wait();
    }
    Ok((want as usize - distinct, total - distinct))
}
