//! Deploys under load: a SIGTERM with a backlog stops in seconds and loses
//! nothing; the main topic stays evenly spread across members after a join
//! and a leave.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kjob::{JobContext, JobError, Producer, Worker};
use kjob_integration_tests::*;

fn spawn_worker(
    topic: &str,
    group: &str,
    record: &Path,
    delay_ms: u64,
    concurrency: usize,
) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_test-worker"))
        .env("KJOB_TEST_TOPIC", topic)
        .env("KJOB_TEST_GROUP", group)
        .env("KJOB_TEST_RECORD", record)
        .env("KJOB_TEST_DELAY_MS", delay_ms.to_string())
        .env("KJOB_TEST_CONCURRENCY", concurrency.to_string())
        .spawn()
        .expect("spawning test-worker")
}

fn done(record: &Path) -> HashMap<i64, u32> {
    let mut m = HashMap::new();
    for line in read_lines(record) {
        if let Some(seq) = line.strip_prefix("done ").and_then(|s| s.parse().ok()) {
            *m.entry(seq).or_default() += 1;
        }
    }
    m
}

/// 40 000 queued jobs over 10 000 keys, 64 handlers of 100 ms running: a
/// SIGTERM drops what has not started (it is uncommitted; the next owner
/// runs it) and waits only for the running handlers. Before, every key's
/// next job counted as in flight: 10 000 x 100 ms / 64 is 15 s of waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_backlog_exits_in_seconds_and_loses_nothing() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("deploy.term");
    let group = unique("g");
    create_topic(&config, &topic, 12).await;
    let producer = Producer::new(&config).expect("producer");
    const N: i64 = 40_000;
    enqueue_n(&producer, &topic, N, 10_000, "ok").await;

    let dir = std::env::temp_dir().join(unique("kjob-deploy"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let record = dir.join("record");
    let mut worker = spawn_worker(&topic, &group, &record, 100, 64);
    eventually(Duration::from_secs(60), "the worker is busy", || {
        done(&record).len() >= 2_000
    })
    .await;
    let sent = Instant::now();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &worker.id().to_string()])
        .status()
        .expect("kill")
        .success());
    let status = worker.wait().expect("wait");
    let took = sent.elapsed();
    assert!(status.success(), "graceful exit, got {status:?}");
    let handled = done(&record).len();
    assert!(
        (handled as i64) < N,
        "the SIGTERM must land with a backlog (handled {handled})"
    );
    // Running handlers take 100 ms; the grace period is 20 s.
    assert!(
        took < Duration::from_secs(3),
        "SIGTERM to exit took {took:?} with a backlog"
    );

    let mut again = spawn_worker(&topic, &group, &record, 0, 256);
    eventually(Duration::from_secs(120), "every job handled", || {
        done(&record).len() as i64 == N
    })
    .await;
    wait_committed_at_end(&config, &group, &topic, 12).await;
    again.kill().expect("kill");
    let _ = again.wait();
}

/// How many partitions of `topic` each member holds.
fn spread(members: &[&Running], topic: &str) -> Vec<usize> {
    members
        .iter()
        .map(|m| {
            m.stats
                .assignment()
                .iter()
                .filter(|(t, _)| t == topic)
                .count()
        })
        .collect()
}

/// With one consumer per worker serving the main topic and its tiers,
/// an assignor that balances partition *counts* could give one member only
/// (mostly idle) tier partitions. kjob's default assigns each topic on its
/// own, so every member holds an even share of the main topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn main_topic_partitions_stay_evenly_spread_after_a_join_and_a_leave() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("deploy.spread");
    let group = unique("g");
    create_topic(&config, &topic, 12).await;
    let seen: Arc<Mutex<usize>> = Default::default();
    let make = || {
        let seen = seen.clone();
        Worker::builder(config.clone(), &group)
            .handle_on(&topic, move |_job: TestJob, _ctx: JobContext| {
                *seen.lock().unwrap() += 1;
                async { Ok::<(), JobError>(()) }
            })
            .build()
            .expect("worker builds")
    };
    let even = |counts: &[usize]| {
        let share = 12 / counts.len();
        counts.iter().sum::<usize>() == 12 && counts.iter().all(|c| c.abs_diff(share) <= 1)
    };
    let a = start(make());
    let b = start(make());
    let c = start(make());
    eventually(
        Duration::from_secs(60),
        "three members share the main topic evenly",
        || even(&spread(&[&a, &b, &c], &topic)),
    )
    .await;
    let d = start(make());
    eventually(Duration::from_secs(60), "four members after a join", || {
        even(&spread(&[&a, &b, &c, &d], &topic))
    })
    .await;
    b.stop().await;
    eventually(
        Duration::from_secs(60),
        "three members after a leave",
        || even(&spread(&[&a, &c, &d], &topic)),
    )
    .await;
    // Tiers are spread on their own too: no member is left with only tiers.
    let tier = format!("{topic}.retry.5s");
    assert!(even(&spread(&[&a, &c, &d], &tier)));
    for m in [a, c, d] {
        m.stop().await;
    }
}
