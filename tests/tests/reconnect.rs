//! A worker cut off from the broker for less than its session timeout
//! picks up where it was once the broker is reachable again: no rejoin, no
//! job handled twice, and new jobs run after one reconnect backoff (at most
//! 1 s, kjob's setting, instead of librdkafka's 10 s).
//!
//! The shared broker keeps running; the worker reaches it only through a
//! Kafka-aware proxy that this test cuts (`CutProxy`). The time from the
//! restore to the first new job handled is printed (two runs' figures are in
//! `benches/RESULTS.md`), not asserted.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kjob::{JobContext, JobError, KafkaConfig, Producer, Worker};
use kjob_integration_tests::*;

const BEFORE: i64 = 300;
const AFTER: i64 = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_shorter_than_the_session_costs_a_reconnect_and_nothing_else() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("reconnect");
    let group = unique("reconnect-g");
    create_topic(&config, &topic, 3).await;
    let producer = Producer::new(&config).expect("producer");
    enqueue_n(&producer, &topic, BEFORE, 30, "ok").await;

    let proxy = CutProxy::kafka(&config.bootstrap_servers).await;
    let via_proxy = KafkaConfig::new(proxy.bootstrap(), &config.schema_registry_url);
    let counts: Arc<Vec<AtomicU32>> =
        Arc::new((0..BEFORE + AFTER).map(|_| AtomicU32::new(0)).collect());
    let handled = Arc::new(AtomicU64::new(0));
    let (c, h) = (counts.clone(), handled.clone());
    let worker = Worker::builder(via_proxy, &group)
        .handle_on(&topic, move |job: TestJob, _ctx: JobContext| {
            let (c, h) = (c.clone(), h.clone());
            async move {
                if let Some(slot) = usize::try_from(job.seq).ok().and_then(|i| c.get(i)) {
                    slot.fetch_add(1, Ordering::Relaxed);
                }
                h.fetch_add(1, Ordering::Relaxed);
                Ok::<(), JobError>(())
            }
        })
        .commit_interval(Duration::from_millis(200))
        .build()
        .expect("worker builds");
    let stats = worker.stats();
    let running = start(worker);
    eventually(Duration::from_secs(60), "the first jobs handled", || {
        handled.load(Ordering::Relaxed) == BEFORE as u64
    })
    .await;
    // Let the last commit land, then remember the group's view.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let rebalances = kjob::WorkerStats::get(&stats.rebalances);

    // Cut for 5 s: half the 10 s session.
    proxy.cut();
    tokio::time::sleep(Duration::from_secs(5)).await;
    proxy.restore();
    let restored = Instant::now();
    let seqs: Vec<TestJob> = (BEFORE..BEFORE + AFTER)
        .map(|s| TestJob::ok(format!("k{}", s % 30), s))
        .collect();
    for r in producer.enqueue_batch_to(&topic, &seqs).await {
        r.expect("enqueued directly to the broker");
    }
    eventually(
        Duration::from_secs(60),
        "a job enqueued after the restore was handled",
        || {
            counts[BEFORE as usize..]
                .iter()
                .any(|c| c.load(Ordering::Relaxed) > 0)
        },
    )
    .await;
    let first_after = restored.elapsed();
    eventually(Duration::from_secs(60), "every job handled", || {
        counts.iter().all(|c| c.load(Ordering::Relaxed) > 0)
    })
    .await;
    wait_committed_at_end(&config, &group, &topic, 3).await;
    let rebalances_after = kjob::WorkerStats::get(&stats.rebalances);
    running.stop().await;

    let twice = counts
        .iter()
        .filter(|c| c.load(Ordering::Relaxed) > 1)
        .count();
    eprintln!(
        "reconnect: 5 s cut; the first job enqueued after the restore ran {first_after:?} after it; \
         {twice} jobs handled twice"
    );
    assert_eq!(twice, 0, "a cut within the session redelivers nothing");
    assert_eq!(
        rebalances_after, rebalances,
        "a cut within the session causes no rebalance"
    );
}
