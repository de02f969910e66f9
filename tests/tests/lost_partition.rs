//! A worker cut off from the cluster for longer than its session loses its
//! partitions ("lost": it may not commit for them), though it kept handling
//! what it had fetched. When a partition comes back to it and nobody moved
//! the group's committed position meanwhile, what it finished is not run
//! again. If another member moved the position, everything from there runs
//! again, as the commit rule requires.
//!
//! The worker under test reaches the shared broker through a proxy that the
//! test cuts (`CutProxy::kafka`); a second worker, where there is one, uses
//! the broker directly. The session (10 s) expires on both sides during a
//! 14 s cut, which is how a partition or a coordinator outage loses it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kjob::{JobContext, JobError, KafkaConfig, Producer, Worker, WorkerStats};
use kjob_integration_tests::*;

const JOBS: i64 = 600;

/// A worker whose handler takes 10 ms and records deliveries in `d`;
/// `gate` (if any) blocks every call after the `n`th.
fn worker(
    config: KafkaConfig,
    topic: &str,
    group: &str,
    d: Deliveries,
    gate: Option<(u64, Arc<tokio::sync::Notify>)>,
) -> Running {
    let calls = Arc::new(AtomicU64::new(0));
    let w = Worker::builder(config, group)
        .handle_on(topic, move |job: TestJob, _ctx: JobContext| {
            let (d, gate, calls) = (d.clone(), gate.clone(), calls.clone());
            async move {
                if let Some((n, gate)) = gate {
                    if calls.fetch_add(1, Ordering::Relaxed) >= n {
                        gate.notified().await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                d.record(job.seq);
                Ok::<(), JobError>(())
            }
        })
        .concurrency(4)
        .commit_interval(Duration::from_millis(200))
        .shutdown_grace(Duration::from_secs(2))
        .build()
        .expect("worker builds");
    start(w)
}

async fn holds_partition(stats: &WorkerStats, topic: &str) {
    eventually(
        Duration::from_secs(60),
        "the worker holds the partition",
        || stats.assignment().iter().any(|(t, _)| t == topic),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_back_unchanged_after_a_lost_session_redoes_nothing_finished() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("lostsame");
    let group = unique("g");
    create_topic(&config, &topic, 1).await;
    let proxy = CutProxy::kafka(&config.bootstrap_servers).await;
    let mut via = config.clone();
    via.bootstrap_servers = proxy.bootstrap();
    let d = Deliveries::new(JOBS + 100);
    let a = worker(via, &topic, &group, d.clone(), None);
    holds_partition(&a.stats, &topic).await;
    let producer = Producer::new(&config).expect("producer");
    enqueue_seqs(&producer, &topic, 0..JOBS, JOBS).await;
    eventually(Duration::from_secs(30), "100 handled", || d.total() >= 100).await;

    // Cut for longer than the session: the worker goes on with what it
    // fetched, cannot commit, and its assignment is lost.
    proxy.cut();
    let at_cut = d.total();
    tokio::time::sleep(Duration::from_secs(14)).await;
    let during = d.total() - at_cut;
    proxy.restore();
    let back = Instant::now();
    enqueue_seqs(&producer, &topic, JOBS..JOBS + 100, JOBS).await;
    eventually(
        Duration::from_secs(60),
        "jobs enqueued after the cut ran",
        || d.any_in(JOBS..JOBS + 100),
    )
    .await;
    let again = back.elapsed();
    eventually(Duration::from_secs(60), "every job ran", || {
        d.distinct() == JOBS + 100
    })
    .await;
    wait_committed_at_end(&config, &group, &topic, 1).await;
    let skipped = WorkerStats::get(&a.stats.skipped_finished);
    a.stop().await;
    println!(
        "cut after {at_cut} jobs; {during} handled during the 14 s cut; handling again {again:?} \
         after the restore; {skipped} finished records skipped, {} run twice",
        d.duplicates()
    );
    assert!(during > 0, "the worker finished work while it was cut off");
    assert!(skipped > 0, "what it finished meanwhile was recognised");
    // Only jobs running at the cut and not finished before the loss may
    // run again: at most the concurrency.
    assert!(d.duplicates() <= 4, "{} run twice", d.duplicates());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_whose_position_another_member_moved_runs_again_from_there() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("lostmoved");
    let group = unique("g");
    create_topic(&config, &topic, 1).await;
    let proxy = CutProxy::kafka(&config.bootstrap_servers).await;
    let mut via = config.clone();
    via.bootstrap_servers = proxy.bootstrap();
    let (da, db) = (Deliveries::new(JOBS), Deliveries::new(JOBS));
    let a = worker(via, &topic, &group, da.clone(), None);
    holds_partition(&a.stats, &topic).await;
    let producer = Producer::new(&config).expect("producer");
    enqueue_seqs(&producer, &topic, 0..JOBS, JOBS).await;
    eventually(Duration::from_secs(30), "100 handled", || da.total() >= 100).await;

    proxy.cut();
    // Another member takes the partition once A's session expired, runs 50
    // jobs and stops, committing a position A never had.
    let gate = Arc::new(tokio::sync::Notify::new());
    let b = worker(config.clone(), &topic, &group, db.clone(), Some((50, gate)));
    eventually(Duration::from_secs(40), "B ran 50 jobs", || {
        db.total() >= 50
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    b.stop().await;
    let a_before = da.total();
    let a_finished: Vec<i64> = (0..JOBS).filter(|s| da.any_in(*s..*s + 1)).collect();
    proxy.restore();
    eventually(Duration::from_secs(60), "A ran the rest", || {
        (0..JOBS).all(|s| da.any_in(s..s + 1) || db.any_in(s..s + 1))
    })
    .await;
    wait_committed_at_end(&config, &group, &topic, 1).await;
    let skipped = WorkerStats::get(&a.stats.skipped_finished);
    a.stop().await;
    println!(
        "A finished {} jobs before the restore; B ran {}; A ran {} more after it, {} of them a second time; {skipped} skipped",
        a_finished.len(),
        db.total(),
        da.total() - a_before,
        da.duplicates()
    );
    assert_eq!(skipped, 0, "a moved position drops what A remembered");
    assert!(
        da.duplicates() > 0,
        "A ran again what it had finished at or after B's position"
    );
}
