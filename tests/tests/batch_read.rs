//! Records read from each partition's own queue in batches.
//!
//! The worker takes main-topic records from librdkafka a batch at a time
//! and copies each before librdkafka's message is destroyed; finished
//! records go back to the poll thread, whose buffers the next records
//! reuse (framework/src/worker/intake/split_queue.rs, recycle.rs). These tests
//! drive that from many threads at once against the real broker: attempts
//! finishing in any order, a join that revokes partitions while their
//! records are in flight, a stop while jobs run, and a stop that abandons
//! jobs. Each handler checks what it reads (key, payload, headers) against
//! what was enqueued, so a record read from a reused buffer, or another
//! record's bytes, fails the test.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kjob::{JobContext, JobError, KafkaConfig, Producer, Worker};
use kjob_integration_tests::*;

const KEYS: i64 = 97;

/// Per start: (key, seq, job id).
type Starts = Arc<Mutex<Vec<(String, i64, String)>>>;

/// A worker whose handler checks its record and sleeps 0-15 ms, chosen by
/// the seq, so attempts finish in any order on every dispatcher; with
/// `block`, "block" jobs sleep for a minute instead.
fn worker(
    config: &KafkaConfig,
    group: &str,
    topic: &str,
    starts: Starts,
    grace: Duration,
    block: bool,
) -> Worker {
    Worker::builder(config.clone(), group)
        .handle_on(topic, move |job: TestJob, ctx: JobContext| {
            let starts = starts.clone();
            async move {
                // The payload decoded, the key and the headers read from
                // the record must all be this job's.
                assert_eq!(
                    job.key,
                    format!("k{}", job.seq % KEYS),
                    "payload of another record"
                );
                assert_eq!(
                    ctx.key.as_deref(),
                    Some(job.key.as_str()),
                    "key of another record"
                );
                assert!(!ctx.id.is_empty(), "kjob-id header read");
                assert_eq!(ctx.attempt, 1, "kjob-attempt header read");
                starts
                    .lock()
                    .unwrap()
                    .push((job.key.clone(), job.seq, ctx.id.to_string()));
                let ms = if block && job.behaviour == "block" {
                    60_000
                } else {
                    (job.seq.wrapping_mul(7919) % 16) as u64
                };
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok::<(), JobError>(())
            }
        })
        .concurrency(64)
        .max_in_flight_per_partition(256)
        .commit_interval(Duration::from_millis(200))
        .shutdown_grace(grace)
        .build()
        .expect("worker builds")
}

/// Every seq in `0..n` started, each with one job id, and each key's first
/// starts in enqueue order.
fn check(starts: &Starts, n: i64) {
    let s = starts.lock().unwrap();
    let mut first: HashMap<&str, Vec<i64>> = HashMap::new();
    let mut ids: HashMap<i64, &str> = HashMap::new();
    for (key, seq, id) in s.iter() {
        match ids.get(seq) {
            None => {
                ids.insert(*seq, id);
                first.entry(key.as_str()).or_default().push(*seq);
            }
            Some(seen) => assert_eq!(seen, id, "seq {seq} ran again under another job id"),
        }
    }
    assert_eq!(ids.len() as i64, n, "every job started");
    let distinct: HashSet<&str> = ids.values().copied().collect();
    assert_eq!(distinct.len() as i64, n, "every job has its own id");
    for (key, seqs) in &first {
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "key {key} started out of order: {seqs:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn records_finish_in_any_order_across_a_join_and_a_stop() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("batch_read.join");
    let group = unique("g");
    create_topic(&config, &topic, 4).await;
    let producer = Producer::new(&config).expect("producer");
    const N: i64 = 6_000;
    enqueue_n(&producer, &topic, N, KEYS, "ok").await;

    let starts: Starts = Default::default();
    let grace = Duration::from_secs(10);
    let member = || {
        start(worker(
            &config,
            &group,
            &topic,
            starts.clone(),
            grace,
            false,
        ))
    };
    let a = member();
    eventually(Duration::from_secs(60), "A is running jobs", || {
        starts.lock().unwrap().len() >= 500
    })
    .await;
    // B's join revokes some of A's partitions while their records run.
    let b = member();
    eventually(Duration::from_secs(60), "A and B ran more", || {
        starts.lock().unwrap().len() >= 2_500
    })
    .await;
    // A stops with jobs running.
    a.stop().await;
    eventually(Duration::from_secs(120), "every job started", || {
        let s = starts.lock().unwrap();
        s.iter().map(|(_, q, _)| *q).collect::<HashSet<_>>().len() as i64 == N
    })
    .await;
    wait_committed_at_end(&config, &group, &topic, 4).await;
    b.stop().await;
    check(&starts, N);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stop_that_abandons_running_jobs_closes_and_loses_nothing() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("batch_read.abandon");
    let group = unique("g");
    create_topic(&config, &topic, 2).await;
    let producer = Producer::new(&config).expect("producer");
    const N: i64 = 400;
    enqueue_n(&producer, &topic, N, KEYS, "block").await;

    let starts: Starts = Default::default();
    let grace = Duration::from_millis(300);
    let a = start(worker(&config, &group, &topic, starts.clone(), grace, true));
    eventually(Duration::from_secs(60), "jobs are blocked", || {
        starts.lock().unwrap().len() >= 64
    })
    .await;
    // The grace period ends with 64 jobs running: they are abandoned.
    let t = Instant::now();
    a.stop().await;
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "the worker closed {:?} after the stop: abandoned jobs kept it open",
        t.elapsed()
    );
    // Nothing was committed past them: a new worker, whose jobs do not
    // block, runs every job, the abandoned ones again.
    let again: Starts = Default::default();
    let b = start(worker(&config, &group, &topic, again.clone(), grace, false));
    wait_committed_at_end(&config, &group, &topic, 2).await;
    b.stop().await;
    let firsts: HashSet<i64> = starts.lock().unwrap().iter().map(|(_, q, _)| *q).collect();
    check(&again, N);
    let seen: HashSet<i64> = again.lock().unwrap().iter().map(|(_, q, _)| *q).collect();
    assert!(
        firsts.is_subset(&seen),
        "an abandoned job was not run again"
    );
}
