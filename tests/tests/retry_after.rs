//! `JobError::retry_after(d)`: the job runs again no sooner than `d` after
//! the downstream answered, and a wait longer than the last retry tier does
//! not hold up the records behind it in that tier (a tier is read first-in
//! first-out).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kjob::retry::RetryPolicy;
use kjob::{JobContext, JobError, Producer, Worker};
use kjob_integration_tests::*;

/// Per seq: (attempt, started, ended) of every handler call.
type Calls = Arc<Mutex<HashMap<i64, Vec<(u32, Instant, Instant)>>>>;

/// Behaviours: `slow-429:<ms>:<after_ms>` runs `ms`, then answers a
/// Retry-After of `after_ms` on the first attempt; `flaky` fails once.
fn worker(config: &kjob::KafkaConfig, topic: &str, group: &str, calls: Calls) -> Running {
    let w = Worker::builder(config.clone(), group)
        .handle_on(topic, move |job: TestJob, ctx: JobContext| {
            let calls = calls.clone();
            async move {
                let started = Instant::now();
                let mut parts = job.behaviour.split(':');
                let result = match (parts.next(), ctx.attempt) {
                    (Some("slow-429"), 1) => {
                        let ms: u64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                        let after: u64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        Err(JobError::retry_after(
                            Duration::from_millis(after),
                            "429 Too Many Requests",
                        ))
                    }
                    (Some("flaky"), 1) => Err(JobError::server("503")),
                    _ => Ok(()),
                };
                calls.lock().unwrap().entry(job.seq).or_default().push((
                    ctx.attempt,
                    started,
                    Instant::now(),
                ));
                result
            }
        })
        .retry(
            RetryPolicy::tiers([Duration::from_secs(1)])
                .jitter(0.0)
                .max_attempts(3),
        )
        .commit_interval(Duration::from_millis(200))
        .build()
        .expect("worker builds");
    start(w)
}

/// The second attempt's start, less the first attempt's end.
fn gap(calls: &Calls, seq: i64) -> Duration {
    let calls = calls.lock().unwrap();
    let c = &calls[&seq];
    assert_eq!(c.len(), 2, "two attempts of {seq}: {c:?}");
    c[1].1.duration_since(c[0].2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_counts_from_the_answer_and_a_long_one_does_not_hold_up_its_tier() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("retryafter");
    let group = unique("g");
    create_topic(&config, &topic, 1).await;
    let calls: Calls = Arc::default();
    let running = worker(&config, &topic, &group, calls.clone());
    let producer = Producer::new(&config).expect("producer");
    // 0: answers after 2 s with Retry-After 3 s.
    // 1: Retry-After 8 s, longer than the only (1 s) tier.
    // 2: fails plainly just after 1 entered the tier; its 1 s retry must
    //    not wait behind 1's 8 s.
    for (seq, behaviour) in [(0, "slow-429:2000:3000"), (1, "slow-429:0:8000")] {
        producer
            .enqueue_to(&topic, &TestJob::with(format!("k{seq}"), seq, behaviour))
            .await
            .expect("enqueued");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    producer
        .enqueue_to(&topic, &TestJob::with("k2", 2, "flaky"))
        .await
        .expect("enqueued");
    eventually(Duration::from_secs(60), "every job ran twice", || {
        let c = calls.lock().unwrap();
        (0..3).all(|s| c.get(&s).is_some_and(|v| v.len() == 2))
    })
    .await;
    wait_committed_at_end(&config, &group, &topic, 1).await;
    running.stop().await;
    let (g0, g1, g2) = (gap(&calls, 0), gap(&calls, 1), gap(&calls, 2));
    println!(
        "after the answer: Retry-After 3 s ran again {g0:?} later, 8 s {g1:?}, plain 1 s {g2:?}"
    );
    assert!(
        g0 >= Duration::from_millis(3_000),
        "never sooner than 3 s after the answer: {g0:?}"
    );
    assert!(g0 < Duration::from_millis(4_500), "{g0:?}");
    assert!(
        g1 >= Duration::from_millis(8_000),
        "never sooner than 8 s: {g1:?}"
    );
    assert!(g1 < Duration::from_millis(9_500), "{g1:?}");
    assert!(
        g2 < Duration::from_millis(2_500),
        "the tier's next record was not held up by the long wait: {g2:?}"
    );
    let dlq =
        try_end_offsets(&config, &format!("{topic}.dlq"), 1).map_or(0, |e| e.iter().sum::<i64>());
    assert_eq!(dlq, 0);
}
