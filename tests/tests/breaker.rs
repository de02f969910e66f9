//! The seed scenario: a downstream fails every call for 60 s while 2 000
//! jobs arrive. With a circuit breaker on its route, jobs wait instead of
//! walking the retry tiers into the DLQ: nothing is dead-lettered, the dead
//! downstream sees a bounded number of calls (the ones that tripped the
//! breaker, and probes), and every job runs once it is back.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kjob::layers::breaker::Breaker;
use kjob::retry::RetryPolicy;
use kjob::{JobContext, JobError, Producer, State, Worker};
use kjob_integration_tests::*;

/// A downstream that answers 503 until `up_at`.
struct Downstream {
    up_at: Instant,
    calls_while_down: AtomicU64,
    done: Mutex<HashSet<i64>>,
}

async fn call_downstream(
    job: TestJob,
    _ctx: JobContext,
    State(down): State<Arc<Downstream>>,
) -> Result<(), JobError> {
    if Instant::now() < down.up_at {
        down.calls_while_down.fetch_add(1, Ordering::Relaxed);
        return Err(JobError::server("503 Service Unavailable"));
    }
    down.done.lock().unwrap().insert(job.seq);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_parks_jobs_through_a_60_s_outage_without_dead_letters() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("breaker");
    let group = unique("g");
    create_topic(&config, &topic, 4).await;
    let down = Arc::new(Downstream {
        up_at: Instant::now() + Duration::from_secs(60),
        calls_while_down: AtomicU64::new(0),
        done: Mutex::new(HashSet::new()),
    });
    let worker = Worker::builder(config.clone(), &group)
        .state(down.clone())
        .handle_on(&topic, call_downstream)
        .layer_for(
            &topic,
            Breaker::new("downstream")
                .failure_threshold(5)
                .open_for(Duration::from_secs(5)),
        )
        .retry(RetryPolicy::tiers([Duration::from_secs(1), Duration::from_secs(5)]).max_attempts(8))
        .concurrency(32)
        .commit_interval(Duration::from_millis(200))
        .build()
        .expect("worker builds");
    let running = start(worker);
    let producer = Producer::new(&config).expect("producer");
    // 2 000 jobs arrive during the first 10 s of the outage.
    for batch in 0..10 {
        let jobs: Vec<TestJob> = (batch * 200..(batch + 1) * 200)
            .map(|i| TestJob::ok(format!("k{i}"), i))
            .collect();
        for r in producer.enqueue_batch_to(&topic, &jobs).await {
            r.expect("enqueued");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eventually(
        Duration::from_secs(120),
        "every job ran after the outage",
        || down.done.lock().unwrap().len() == 2_000,
    )
    .await;
    wait_committed_at_end(&config, &group, &topic, 4).await;
    running.stop().await;

    let dlq =
        try_end_offsets(&config, &format!("{topic}.dlq"), 4).map_or(0, |e| e.iter().sum::<i64>());
    assert_eq!(dlq, 0, "nothing dead-lettered because of the outage");
    let calls = down.calls_while_down.load(Ordering::Relaxed);
    // The calls that tripped the breaker (at most the concurrency), then
    // one probe per open period (12 in 60 s), each of which may fail.
    assert!(
        calls <= 32 + 5 + 15,
        "calls against the dead downstream stayed bounded: {calls} (without a breaker: 2 000 x 5)"
    );
}

/// A SIGTERM while the breaker is open: the parked jobs never started, so
/// the worker releases them at once instead of waiting out its grace
/// period for a breaker that stays open; the next worker runs them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_while_the_breaker_is_open_does_not_wait_out_the_grace_period() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("breakstop");
    let group = unique("g");
    create_topic(&config, &topic, 4).await;
    let worker = |down: Arc<Downstream>| {
        Worker::builder(config.clone(), &group)
            .state(down)
            .handle_on(&topic, call_downstream)
            .layer_for(
                &topic,
                Breaker::new("stop-downstream")
                    .failure_threshold(3)
                    .open_for(Duration::from_secs(60)),
            )
            .retry(RetryPolicy::tiers([Duration::from_secs(1)]).max_attempts(8))
            .concurrency(8)
            .shutdown_grace(Duration::from_secs(20))
            .commit_interval(Duration::from_millis(200))
            .build()
            .expect("worker builds")
    };
    let dead = Arc::new(Downstream {
        up_at: Instant::now() + Duration::from_secs(3600),
        calls_while_down: AtomicU64::new(0),
        done: Mutex::new(HashSet::new()),
    });
    let running = start(worker(dead.clone()));
    let producer = Producer::new(&config).expect("producer");
    enqueue_n(&producer, &topic, 100, 100, "ok").await;
    eventually(Duration::from_secs(60), "the breaker opened", || {
        dead.calls_while_down.load(Ordering::Relaxed) >= 3
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    let stopping = Instant::now();
    running.stop().await;
    let took = stopping.elapsed();
    println!("stop with the breaker open: {took:?} (grace 20 s)");
    assert!(took < Duration::from_secs(5), "stopped in {took:?}");

    let up = Arc::new(Downstream {
        up_at: Instant::now(),
        calls_while_down: AtomicU64::new(0),
        done: Mutex::new(HashSet::new()),
    });
    let running = start(worker(up.clone()));
    eventually(
        Duration::from_secs(60),
        "the next worker ran every job",
        || up.done.lock().unwrap().len() == 100,
    )
    .await;
    wait_committed_at_end(&config, &group, &topic, 4).await;
    running.stop().await;
    let dlq =
        try_end_offsets(&config, &format!("{topic}.dlq"), 4).map_or(0, |e| e.iter().sum::<i64>());
    assert_eq!(dlq, 0, "nothing dead-lettered");
}
