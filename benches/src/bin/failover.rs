//! Failover time: from a SIGKILL of one of two worker processes to the first
//! job the survivor handles from a partition the dead one owned.
//!
//! ```bash
//! ./dev stack up && cargo run --release -p kjob-benches --bin failover
//! ```
//!
//! Runs three settings in turn, each in a fresh group and topic, with jobs
//! arriving at a steady 200/s on 4 partitions:
//! * `librdkafka defaults`: classic protocol, 45 s session (kjob before);
//! * `classic` (kjob's default): 10 s session, 500 ms heartbeat;
//! * `KIP-848`: `group.protocol=consumer`; the session is the broker's `group.consumer.session.timeout.ms` (10 s on `./dev`'s
//!   stack, 45 s on a broker with default settings).
//!
//! Then the restart case (`--restart-only` runs it alone): one worker,
//! SIGKILLed and started again 1 s later, with and without a static-member
//! id (`KJOB_INSTANCE_ID`).
//!
//! The driver re-runs this binary as the worker (`failover worker`), which
//! prints the partition of every job it handles; the driver timestamps each
//! line as it arrives.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kjob::{KafkaConfig, Producer};
use kjob_benches::BenchJob;

const PARTITIONS: i32 = 4;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kjob_benches::no_logs();
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("worker") {
        return kjob_benches::printing_worker().await;
    }
    let settings: [(&str, &[(&str, &str)]); 3] = [
        (
            "librdkafka defaults (classic, 45 s session)",
            &[
                ("group.protocol", "classic"),
                ("session.timeout.ms", "45000"),
                ("heartbeat.interval.ms", "3000"),
            ],
        ),
        (
            "kjob default: classic (10 s session)",
            &[("group.protocol", "classic")],
        ),
        (
            "KIP-848 (broker session 10 s)",
            &[("group.protocol", "consumer")],
        ),
    ];
    let only_restart = args.iter().any(|a| a == "--restart-only");
    if !only_restart {
        println!("| setting | SIGKILL -> first job of a dead member's partition |");
        println!("|---|---|");
        for (name, overrides) in settings {
            let secs = run_once(overrides).await?;
            println!("| {name} | {secs:.1} s |");
        }
        println!();
    }
    // The lone worker restarted by its supervisor 1 s after a SIGKILL.
    println!("| lone worker, classic, restarted 1 s after a SIGKILL | SIGKILL -> restarted worker's first job |");
    println!("|---|---|");
    for (name, instance) in [
        ("no instance id (dynamic member)", false),
        ("KJOB_INSTANCE_ID set (static member)", true),
    ] {
        let secs = restart_once(instance).await?;
        println!("| {name} | {secs:.1} s |");
    }
    Ok(())
}

fn spawn_worker(topic: &str, group: &str, overrides: &[(&str, &str)]) -> anyhow::Result<Child> {
    spawn_member(topic, group, overrides, None)
}

/// [`spawn_worker`], with a static-member id when `instance` is given.
fn spawn_member(
    topic: &str,
    group: &str,
    overrides: &[(&str, &str)],
    instance: Option<&str>,
) -> anyhow::Result<Child> {
    let o: Vec<String> = overrides.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("worker")
        .env("BENCH_TOPIC", topic)
        .env("BENCH_GROUP", group)
        .env("BENCH_RDKAFKA", o.join(","))
        .env_remove("KJOB_INSTANCE_ID")
        .stdout(Stdio::piped());
    if let Some(id) = instance {
        cmd.env("KJOB_INSTANCE_ID", id);
    }
    Ok(cmd.spawn()?)
}

/// One worker alone in its group, fed 200 jobs/s, SIGKILLed and started
/// again 1 s later, as a supervisor restarts it: the seconds from the kill
/// to the first job the new process handles. A dynamic member waits out
/// the dead member's session before the group gives anyone its
/// partitions; a static one (`KJOB_INSTANCE_ID`) replaces it at once.
async fn restart_once(instance: bool) -> anyhow::Result<f64> {
    let config = KafkaConfig::from_env();
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let topic = format!("bench.restart.{}", &suffix[..8]);
    let group = format!("bench-restart-{}", &suffix[..8]);
    kjob::topics::create_topics(&config, &[(topic.clone(), PARTITIONS)]).await?;
    let producer = Producer::new(&config)?;
    producer.prepare::<BenchJob>().await?;
    let id = format!("{group}-0");
    let id = instance.then_some(id.as_str());
    let overrides = [("group.protocol", "classic")];
    let (tx, rx) = mpsc::channel();
    let mut a = spawn_member(&topic, &group, &overrides, id)?;
    watch(&mut a, 0, tx.clone());
    let feed = feed(&producer, &topic);
    let settle = Instant::now();
    let mut working = false;
    while settle.elapsed() < Duration::from_secs(120) {
        if rx.recv_timeout(Duration::from_secs(1)).is_ok() {
            working = true;
            if settle.elapsed() > Duration::from_secs(10) {
                break;
            }
        }
    }
    anyhow::ensure!(working, "the worker never handled a job");
    a.kill()?;
    let killed = Instant::now();
    let _ = a.wait();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut b = spawn_member(&topic, &group, &overrides, id)?;
    watch(&mut b, 1, tx);
    let mut took = None;
    while killed.elapsed() < Duration::from_secs(120) {
        let Ok((who, _, at)) = rx.recv_timeout(Duration::from_secs(1)) else {
            continue;
        };
        if who == 1 {
            took = Some(at.duration_since(killed).as_secs_f64());
            break;
        }
    }
    feed.abort();
    let _ = b.kill();
    let _ = b.wait();
    took.ok_or_else(|| anyhow::anyhow!("the restarted worker handled nothing within 120 s"))
}

/// A steady 200 jobs/s on `topic` until the handle is aborted.
fn feed(producer: &Producer, topic: &str) -> tokio::task::JoinHandle<()> {
    let (producer, topic) = (producer.clone(), topic.to_string());
    tokio::spawn(async move {
        let mut seq = 0i64;
        let mut tick = tokio::time::interval(Duration::from_millis(5));
        loop {
            tick.tick().await;
            let _ = producer
                .enqueue_to(&topic, &BenchJob::new(seq, 1_000))
                .await;
            seq += 1;
        }
    })
}

/// Forwards a child's handled partitions, timestamped, to `tx`.
fn watch(child: &mut Child, id: usize, tx: mpsc::Sender<(usize, i32, Instant)>) {
    if let Some(out) = child.stdout.take() {
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let partition = line
                    .split_whitespace()
                    .next()
                    .and_then(|p| p.parse::<i32>().ok());
                if let Some(p) = partition {
                    if tx.send((id, p, Instant::now())).is_err() {
                        return;
                    }
                }
            }
        });
    }
}

async fn run_once(overrides: &[(&str, &str)]) -> anyhow::Result<f64> {
    let config = KafkaConfig::from_env();
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let topic = format!("bench.failover.{}", &suffix[..8]);
    let group = format!("bench-failover-{}", &suffix[..8]);
    kjob::topics::create_topics(&config, &[(topic.clone(), PARTITIONS)]).await?;
    let producer = Producer::new(&config)?;
    producer.prepare::<BenchJob>().await?;

    let (tx, rx) = mpsc::channel();
    let mut a = spawn_worker(&topic, &group, overrides)?;
    let mut b = spawn_worker(&topic, &group, overrides)?;
    watch(&mut a, 0, tx.clone());
    watch(&mut b, 1, tx);

    let feed = feed(&producer, &topic);

    // Both members working: learn which partitions A owns.
    let mut owned_by_a = HashSet::new();
    let mut b_seen = false;
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_secs(120) {
        let Ok((id, p, _)) = rx.recv_timeout(Duration::from_secs(1)) else {
            continue;
        };
        if id == 0 {
            owned_by_a.insert(p);
        } else {
            b_seen = true;
            owned_by_a.remove(&p);
        }
        if b_seen && !owned_by_a.is_empty() && settle.elapsed() > Duration::from_secs(15) {
            break;
        }
    }
    anyhow::ensure!(
        b_seen && !owned_by_a.is_empty(),
        "the two workers never shared the partitions"
    );
    a.kill()?;
    let killed = Instant::now();
    let _ = a.wait();
    let mut took = None;
    while killed.elapsed() < Duration::from_secs(120) {
        let Ok((id, p, at)) = rx.recv_timeout(Duration::from_secs(1)) else {
            continue;
        };
        if id == 1 && owned_by_a.contains(&p) {
            took = Some(at.duration_since(killed).as_secs_f64());
            break;
        }
    }
    feed.abort();
    let _ = b.kill();
    let _ = b.wait();
    took.ok_or_else(|| anyhow::anyhow!("the survivor never took over within 120 s"))
}
