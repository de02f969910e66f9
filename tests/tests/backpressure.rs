//! The in-flight bound without pausing.
//!
//! A main-topic partition at its bound is left unread in its own
//! librdkafka queue instead of being paused (a pause makes librdkafka fetch
//! and parse again all it had prefetched). These tests hold partitions at a
//! tiny bound hundreds of times and require what a pause guaranteed: every
//! job runs once, each key in order, everything is committed; and a
//! partition whose queue was left unread is read again after a rebalance.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kjob::{JobContext, JobError, KafkaConfig, Producer, Worker, WorkerBuilder};
use kjob_integration_tests::*;

/// Handler starts in order: (key, seq).
type Starts = Arc<Mutex<Vec<(String, i64)>>>;

/// A worker that records each handler start and sleeps `sleep` in it, at
/// concurrency 8.
fn recording(
    config: &KafkaConfig,
    group: &str,
    topic: &str,
    starts: Starts,
    sleep: Duration,
) -> WorkerBuilder {
    Worker::builder(config.clone(), group)
        .handle_on(topic, move |job: TestJob, _ctx: JobContext| {
            let starts = starts.clone();
            async move {
                starts.lock().unwrap().push((job.key.clone(), job.seq));
                tokio::time::sleep(sleep).await;
                Ok::<(), JobError>(())
            }
        })
        .concurrency(8)
        .commit_interval(Duration::from_millis(200))
}

fn worker(config: &KafkaConfig, group: &str, topic: &str, starts: Starts) -> Worker {
    recording(config, group, topic, starts, Duration::from_millis(1))
        // Far below each partition's backlog: every partition reaches it
        // again and again.
        .max_in_flight_per_partition(16)
        .build()
        .expect("worker builds")
}

/// A fresh topic of `partitions` with `n` jobs over `keys` keys, and a
/// fresh group name.
async fn backlog(name: &str, partitions: i32, n: i64, keys: i64) -> (KafkaConfig, String, String) {
    init_logging();
    let config = ensure_stack();
    let topic = unique(name);
    let group = unique("g");
    create_topic(&config, &topic, partitions).await;
    let producer = Producer::new(&config).expect("producer");
    enqueue_n(&producer, &topic, n, keys, "ok").await;
    (config, topic, group)
}

/// Waits until every seq in `0..n` started at least once.
async fn every_seq_started(starts: &Starts, n: i64) {
    eventually(Duration::from_secs(120), "every job started", || {
        let s = starts.lock().unwrap();
        s.iter().map(|(_, q)| *q).collect::<HashSet<_>>().len() as i64 == n
    })
    .await;
}

/// Every seq in `0..n` started exactly once (`restarts` tolerated after a
/// rebalance), and each key's first starts are in enqueue order.
fn check(starts: &Starts, n: i64, rebalanced: bool) {
    let s = starts.lock().unwrap();
    let mut first: HashMap<&str, Vec<i64>> = HashMap::new();
    let mut once = HashSet::new();
    for (key, seq) in s.iter() {
        if once.insert(*seq) {
            first.entry(key.as_str()).or_default().push(*seq);
        }
    }
    assert_eq!(once.len() as i64, n, "every job started");
    if !rebalanced {
        assert_eq!(
            s.len() as i64,
            n,
            "no job started twice without a rebalance"
        );
    }
    for (key, seqs) in &first {
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "key {key} started out of order: {seqs:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_held_at_a_tiny_bound_run_everything_once_and_in_order() {
    const N: i64 = 3_000;
    let (config, topic, group) = backlog("backpressure.once", 3, N, 60).await;

    let starts: Starts = Default::default();
    let w = start(worker(&config, &group, &topic, starts.clone()));
    eventually(Duration::from_secs(90), "every job started", || {
        starts.lock().unwrap().len() as i64 >= N
    })
    .await;
    wait_committed_at_end(&config, &group, &topic, 3).await;
    w.stop().await;
    check(&starts, N, false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_left_unread_at_the_bound_are_read_again_after_a_join() {
    const N: i64 = 4_000;
    let (config, topic, group) = backlog("backpressure.join", 4, N, 80).await;

    let starts: Starts = Default::default();
    let a = start(worker(&config, &group, &topic, starts.clone()));
    eventually(
        Duration::from_secs(60),
        "A is working through the backlog",
        || starts.lock().unwrap().len() >= 300,
    )
    .await;
    // Every partition of A is at its bound now; B's join moves some of
    // them, A keeps the others, left unread until they drain.
    let b = start(worker(&config, &group, &topic, starts.clone()));
    every_seq_started(&starts, N).await;
    wait_committed_at_end(&config, &group, &topic, 4).await;
    b.stop().await;
    a.stop().await;
    check(&starts, N, true);
}

/// A worker whose backlog of ready jobs reached the read-ahead limit
/// (`framework/src/worker/intake/read_ahead.rs`) leaves the level unread. A member
/// joining (a revoke while the level is held) and the first member leaving
/// (a shutdown while it is held) lose nothing: the second member reads the
/// moved partitions, and then all of them, to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_level_held_at_the_read_ahead_limit_survives_a_join_and_a_shutdown() {
    // A key each, so every record read is ready at once: three times the
    // limit (4 096 at concurrency 8), far under the bound (5 000 each).
    const N: i64 = 12_000;
    let (config, topic, group) = backlog("backpressure.readahead", 4, N, N).await;
    let slow = |starts: Starts| {
        recording(&config, &group, &topic, starts, Duration::from_millis(2))
            .build()
            .expect("worker builds")
    };
    let starts: Starts = Default::default();
    let a = start(slow(starts.clone()));
    eventually(
        Duration::from_secs(60),
        "A is working through the backlog",
        || starts.lock().unwrap().len() >= 500,
    )
    .await;
    let b = start(slow(starts.clone()));
    eventually(Duration::from_secs(60), "B took partitions from A", || {
        starts.lock().unwrap().len() >= 2_000
    })
    .await;
    let at_stop = starts.lock().unwrap().len();
    a.stop().await;
    every_seq_started(&starts, N).await;
    wait_committed_at_end(&config, &group, &topic, 4).await;
    b.stop().await;
    eprintln!("A stopped after {at_stop} of {N} starts");
    assert!(
        (at_stop as i64) < N / 2,
        "A stopped with most of the backlog still unread ({at_stop} of {N} started)"
    );
    check(&starts, N, true);
}
