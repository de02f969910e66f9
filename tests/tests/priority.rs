//! Priority lanes on the real stack: urgent jobs enqueued behind a bulk
//! backlog on the same worker run before the backlog, and the backlog still
//! drains.
//!
//! Not a timing test: it counts how many bulk jobs finish between the urgent
//! enqueue and the last urgent completion. Without priorities the two
//! routes would take turns for slots (one bulk job per urgent one); with
//! them the urgent jobs take the free slots first.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kjob::{JobContext, JobError, Priority, Producer, Worker};
use kjob_integration_tests::*;

const BULK: i64 = 200;
const URGENT: i64 = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urgent_jobs_overtake_a_bulk_backlog_and_the_backlog_still_drains() {
    let (before, last) = urgent_behind_bulk(
        "prio",
        BULK,
        Duration::from_millis(50),
        Duration::from_millis(5),
        8,
    )
    .await;
    // About a second of bulk progress (4 slots x 50 ms) covers fetching the
    // urgent records; first-in first-out they would wait for the ~190
    // bulk jobs already fetched ahead of them.
    assert!(
        last - before <= 80,
        "the urgent jobs waited for {} bulk jobs (enqueued at {before}, last handled at {last})",
        last - before
    );
}

/// Enqueues `bulk_n` jobs on a low-priority route (each sleeping
/// `bulk_sleep`), starts a worker of four slots, and once `started` of them
/// finished enqueues [`URGENT`] jobs on a high-priority route (each
/// sleeping `urgent_sleep`). Waits until the backlog drained and every
/// offset of both routes is committed; returns how many bulk jobs had
/// finished at the urgent enqueue and when the last urgent job finished.
async fn urgent_behind_bulk(
    prefix: &str,
    bulk_n: i64,
    bulk_sleep: Duration,
    urgent_sleep: Duration,
    started: u64,
) -> (u64, u64) {
    init_logging();
    let config = ensure_stack();
    let urgent = unique(&format!("{prefix}.urgent"));
    let bulk = unique(&format!("{prefix}.bulk"));
    create_topic(&config, &urgent, 2).await;
    create_topic(&config, &bulk, 2).await;
    let producer = Producer::new(&config).expect("producer");
    // A key each: every job is ready at once, none waits behind its key.
    enqueue_n(&producer, &bulk, bulk_n, bulk_n, "ok").await;

    let bulk_done = Arc::new(AtomicU64::new(0));
    // Bulk completions counted when each urgent job finished.
    let urgent_seen: Arc<Mutex<Vec<u64>>> = Arc::default();
    let (b, b2, u) = (bulk_done.clone(), bulk_done.clone(), urgent_seen.clone());
    let group = unique(&format!("{prefix}-g"));
    let worker = Worker::builder(config.clone(), &group)
        .handle_on(&bulk, move |_job: TestJob, _ctx: JobContext| {
            let b = b.clone();
            async move {
                tokio::time::sleep(bulk_sleep).await;
                b.fetch_add(1, Ordering::Relaxed);
                Ok::<(), JobError>(())
            }
        })
        .handle_on(&urgent, move |_job: TestJob, _ctx: JobContext| {
            let (b, u) = (b2.clone(), u.clone());
            async move {
                tokio::time::sleep(urgent_sleep).await;
                u.lock().unwrap().push(b.load(Ordering::Relaxed));
                Ok::<(), JobError>(())
            }
        })
        .priority(&urgent, Priority::High)
        .priority(&bulk, Priority::Low)
        .concurrency(4)
        .build()
        .expect("worker builds");
    let running = start(worker);

    eventually(Duration::from_secs(60), "the bulk backlog started", || {
        bulk_done.load(Ordering::Relaxed) >= started
    })
    .await;
    let before = bulk_done.load(Ordering::Relaxed);
    enqueue_n(&producer, &urgent, URGENT, URGENT, "ok").await;
    eventually(Duration::from_secs(60), "every urgent job handled", || {
        urgent_seen.lock().unwrap().len() == URGENT as usize
    })
    .await;
    let last = urgent_seen
        .lock()
        .unwrap()
        .iter()
        .copied()
        .max()
        .unwrap_or(0);
    eprintln!(
        "urgent jobs enqueued after {before} of {bulk_n} bulk jobs; all {URGENT} handled by bulk job {last}"
    );

    // The backlog drains, and every offset is committed.
    eventually(Duration::from_secs(120), "the bulk backlog drained", || {
        bulk_done.load(Ordering::Relaxed) == bulk_n as u64
    })
    .await;
    wait_committed_at_end(&config, &group, &bulk, 2).await;
    wait_committed_at_end(&config, &group, &urgent, 2).await;
    running.stop().await;
    (before, last)
}

/// The urgent route's partitions are read through queues of their own
/// (`framework/src/worker/intake/mod.rs`), split again after every assignment.
/// Across a member joining and leaving, with urgent jobs enqueued all the
/// while: every job runs, each key's jobs first run in enqueue order (a
/// split queue read before the records still in the main queue would run
/// newer offsets first), and every offset is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urgent_partitions_read_first_keep_order_and_lose_nothing_across_rebalances() {
    const KEYS: i64 = 40;
    const FIRST: i64 = 1_500;
    const MORE: i64 = 1_500;
    init_logging();
    let config = ensure_stack();
    let (urgent, bulk) = (unique("prio.split.urgent"), unique("prio.split.bulk"));
    create_topic(&config, &urgent, 4).await;
    create_topic(&config, &bulk, 4).await;
    let producer = Producer::new(&config).expect("producer");
    enqueue_n(&producer, &bulk, 3_000, 100, "ok").await;
    enqueue_n(&producer, &urgent, FIRST, KEYS, "ok").await;

    // (key, seq) in the order handlers started, over both members.
    let seen: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
    let group = unique("prio-split-g");
    let member = |seen: Arc<Mutex<Vec<(String, i64)>>>, mine: Arc<AtomicU64>| {
        Worker::builder(config.clone(), &group)
            .handle_on(&bulk, |_job: TestJob, _ctx: JobContext| async move {
                tokio::time::sleep(Duration::from_millis(1)).await;
                Ok::<(), JobError>(())
            })
            .handle_on(&urgent, move |job: TestJob, _ctx: JobContext| {
                let (seen, mine) = (seen.clone(), mine.clone());
                async move {
                    seen.lock().unwrap().push((job.key.clone(), job.seq));
                    mine.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    Ok::<(), JobError>(())
                }
            })
            .priority(&urgent, Priority::High)
            .priority(&bulk, Priority::Low)
            .concurrency(8)
            .build()
            .expect("worker builds")
    };
    let count = |seen: &Arc<Mutex<Vec<(String, i64)>>>| seen.lock().unwrap().len() as i64;
    let a = start(member(seen.clone(), Arc::default()));
    eventually(Duration::from_secs(60), "urgent jobs started", || {
        count(&seen) >= 300
    })
    .await;
    let by_b = Arc::new(AtomicU64::new(0));
    let b = start(member(seen.clone(), by_b.clone()));
    // More urgent jobs while the group rebalances, same keys, later seqs.
    let jobs: Vec<TestJob> = (FIRST..FIRST + MORE)
        .map(|i| TestJob::with(format!("k{}", i % KEYS), i, "ok"))
        .collect();
    for r in producer.enqueue_batch_to(&urgent, &jobs).await {
        r.expect("enqueue acknowledged");
    }
    eventually(
        Duration::from_secs(60),
        "the second member took part",
        || by_b.load(Ordering::Relaxed) >= 200,
    )
    .await;
    b.stop().await;
    eventually(Duration::from_secs(120), "every urgent job handled", || {
        let s = seen.lock().unwrap();
        let distinct: std::collections::HashSet<i64> = s.iter().map(|(_, q)| *q).collect();
        distinct.len() as i64 == FIRST + MORE
    })
    .await;
    wait_committed_at_end(&config, &group, &urgent, 4).await;
    wait_committed_at_end(&config, &group, &bulk, 4).await;
    a.stop().await;

    // Per key, the first start of each job in enqueue order.
    let s = seen.lock().unwrap();
    let mut first: std::collections::HashMap<&str, Vec<i64>> = Default::default();
    let mut once = std::collections::HashSet::new();
    for (key, seq) in s.iter() {
        if once.insert(*seq) {
            first.entry(key.as_str()).or_default().push(*seq);
        }
    }
    for (key, seqs) in &first {
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "key {key} started out of order: {seqs:?}"
        );
    }
    eprintln!(
        "{} starts for {} urgent jobs over two rebalances, {} by the second member",
        s.len(),
        FIRST + MORE,
        by_b.load(Ordering::Relaxed)
    );
}

/// A bulk backlog far past the read-ahead limit (4 096 jobs of a level
/// waiting for a slot at this concurrency: `framework/src/worker/intake/read_ahead.rs`)
/// is held unread at that limit, level by level: urgent records enqueued
/// behind it are still read at once, and the held backlog is read again
/// as it drains, to the last job, every offset committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_held_at_the_read_ahead_limit_keeps_urgent_records_readable_and_drains() {
    // By the 200th, the poll thread has read thousands of bulk jobs ahead
    // of four slots (1 ms each) and holds the bulk level.
    let (before, last) = urgent_behind_bulk(
        "ahead",
        12_000,
        Duration::from_millis(1),
        Duration::ZERO,
        200,
    )
    .await;
    // Read at once, they wait for the bulk jobs of about one fetch (48-124
    // in runs here, alone or beside this file's other tests); held with
    // the bulk level, until under half the limit of bulk jobs waited (808
    // with every level held together).
    assert!(
        last - before <= 400,
        "the urgent jobs waited for {} bulk jobs (enqueued at {before}, last handled at {last})",
        last - before
    );
}
