//! One failing part must not stop unrelated work.
//!
//! A job that waits for a downstream (the schema registry, an open circuit
//! breaker) is *parked*: it holds no handler slot, so the worker's other
//! jobs (other keys, other routes) keep running. Before parking, waiting
//! jobs held their slots: during a registry outage a route with one new
//! writer schema stopped completely, and a breaker's parked jobs starved
//! every other route of the worker.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kjob::layers::breaker::{Breaker, BreakerState};
use kjob::retry::RetryPolicy;
use kjob::{Job, JobContext, JobError, Producer, Worker};
use kjob_integration_tests::*;
use serde::{Deserialize, Serialize};

/// A newer producer's contract: `TestJob` with one optional field more.
/// The worker's reader is `TestJob` v1; it resolves v2 records to it.
#[derive(Serialize, Deserialize)]
struct TestJobV2 {
    key: String,
    seq: i64,
    behaviour: String,
    note: Option<String>,
}

impl Job for TestJobV2 {
    const NAME: &'static str = TestJob::NAME;
    const VERSION: u32 = 2;
    const SCHEMA: &'static str = r#"{"type":"record","name":"TestJob","namespace":"kjob.test",
        "fields":[{"name":"key","type":"string"},{"name":"seq","type":"long"},
        {"name":"behaviour","type":"string","default":"ok"},
        {"name":"note","type":["null","string"],"default":null}]}"#;
    fn key(&self) -> String {
        self.key.clone()
    }
}

fn proxied(config: &kjob::KafkaConfig, proxy: &CutProxy) -> String {
    let url = &config.schema_registry_url;
    let rest = url.strip_prefix("http://").expect("an http registry URL");
    let path = rest.find('/').map_or("", |i| &rest[i..]);
    format!("http://{}{path}", proxy.bootstrap())
}

fn upstream(config: &kjob::KafkaConfig) -> String {
    let rest = config
        .schema_registry_url
        .strip_prefix("http://")
        .expect("an http registry URL");
    rest.split('/').next().unwrap_or(rest).to_string()
}

/// The registry is cut while a worker that has v1's writer schema cached
/// gets v1 and v2 jobs interleaved on the same partitions: the v2 jobs
/// wait (parked, on their first attempt), the v1 jobs keep running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_whose_schema_is_cached_keep_running_while_the_registry_is_cut() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("isoreg");
    let group = unique("g");
    const PARTITIONS: i32 = 4;
    const EACH: i64 = 60;
    create_topic(&config, &topic, PARTITIONS).await;
    let proxy = CutProxy::tcp(&upstream(&config)).await;
    let mut through_proxy = config.clone();
    through_proxy.schema_registry_url = proxied(&config, &proxy);
    // (seq, attempt, when) of every handler call.
    let calls: Arc<Mutex<Vec<(i64, u32, Instant)>>> = Arc::default();
    let seen = calls.clone();
    let worker = Worker::builder(through_proxy, &group)
        .handle_on(&topic, move |job: TestJob, ctx: JobContext| {
            let seen = seen.clone();
            async move {
                seen.lock()
                    .unwrap()
                    .push((job.seq, ctx.attempt, Instant::now()));
                Ok::<(), JobError>(())
            }
        })
        .retry(RetryPolicy::tiers([Duration::from_secs(1)]).max_attempts(3))
        // Fewer slots than waiting v2 jobs: before parking, they took them all.
        .concurrency(4)
        .commit_interval(Duration::from_millis(200))
        .build()
        .expect("worker builds");
    let running = start(worker);
    let producer = Producer::new(&config).expect("producer");

    // The worker handles v1 jobs: v1's writer schema is cached.
    enqueue_n(&producer, &topic, 10, 10, "ok").await;
    eventually(Duration::from_secs(60), "the warm-up ran", || {
        calls.lock().unwrap().len() >= 10
    })
    .await;
    // A newer producer registers v2 while the registry is still up. Only
    // registered, not enqueued: a v2 job the worker ran before the cut
    // would cache v2's writer schema too (the CI run that found it).
    let v2 = |seq: i64| TestJobV2 {
        key: format!("v2-{seq}"),
        seq,
        behaviour: "ok".into(),
        note: Some("from the new deploy".into()),
    };
    producer
        .codec()
        .register::<TestJobV2>(&topic)
        .await
        .expect("v2 registers");

    proxy.cut();
    let cut_at = Instant::now();
    for i in 0..EACH {
        producer
            .enqueue_to(&topic, &v2(2_000 + i))
            .await
            .expect("v2");
        producer
            .enqueue_to(&topic, &TestJob::ok(format!("v1-{i}"), 100 + i))
            .await
            .expect("v1");
    }
    // The outage lasts 8 s.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let during: Vec<(i64, u32, Instant)> = calls.lock().unwrap().clone();
    let v1_during = during
        .iter()
        .filter(|(s, _, t)| (100..100 + EACH).contains(s) && *t > cut_at)
        .count();
    let v2_during = during.iter().filter(|(s, _, _)| *s >= 1_000).count();
    println!("during the outage: {v1_during} of {EACH} v1 jobs handled, {v2_during} v2");
    assert!(
        v1_during as f64 >= 0.95 * EACH as f64,
        "cached-schema jobs keep running during the outage: {v1_during} of {EACH}"
    );
    assert_eq!(v2_during, 0, "v2 jobs cannot be decoded while it is cut");
    let sum = |t: String| try_end_offsets(&config, &t, PARTITIONS).map_or(0, |e| e.iter().sum());
    assert_eq!(
        sum(format!("{topic}.retry.1s")),
        0,
        "nothing walked the tiers"
    );

    proxy.restore();
    eventually(
        Duration::from_secs(30),
        "the v2 jobs ran once the registry answered",
        || {
            calls
                .lock()
                .unwrap()
                .iter()
                .filter(|(s, _, _)| *s >= 1_000)
                .count()
                >= EACH as usize
        },
    )
    .await;
    wait_committed_at_end(&config, &group, &topic, PARTITIONS).await;
    running.stop().await;
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), (10 + 2 * EACH) as usize, "each exactly once");
    assert!(
        calls.iter().all(|(_, a, _)| *a == 1),
        "on its first attempt"
    );
    assert_eq!(sum(format!("{topic}.retry.1s")), 0);
    assert_eq!(sum(format!("{topic}.dlq")), 0);
}

/// Route A's downstream fails, so its breaker opens for 30 s and parks A's
/// jobs; route B on the same worker, with two slots in all, keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_route_keeps_running_while_another_routes_breaker_is_open() {
    init_logging();
    let config = ensure_stack();
    let (a, b) = (unique("isobrk-a"), unique("isobrk-b"));
    let group = unique("g");
    create_topic(&config, &a, 2).await;
    create_topic(&config, &b, 2).await;
    let breaker = Breaker::new("iso-downstream")
        .failure_threshold(1)
        .open_for(Duration::from_secs(30));
    let a_calls = Arc::new(AtomicU64::new(0));
    let b_started: Arc<Mutex<Vec<(i64, Instant)>>> = Arc::default();
    let (ac, bs) = (a_calls.clone(), b_started.clone());
    let worker = Worker::builder(config.clone(), &group)
        .handle_on(&a, move |_job: TestJob, _ctx: JobContext| {
            let ac = ac.clone();
            async move {
                ac.fetch_add(1, Ordering::Relaxed);
                Err::<(), JobError>(JobError::server("503 Service Unavailable"))
            }
        })
        .handle_on(&b, move |job: TestJob, _ctx: JobContext| {
            let bs = bs.clone();
            async move {
                bs.lock().unwrap().push((job.seq, Instant::now()));
                Ok::<(), JobError>(())
            }
        })
        .layer_for(&a, breaker.clone())
        .retry(RetryPolicy::tiers([Duration::from_secs(1)]).max_attempts(5))
        .concurrency(2)
        .shutdown_grace(Duration::from_secs(20))
        .commit_interval(Duration::from_millis(200))
        .build()
        .expect("worker builds");
    let running = start(worker);
    let producer = Producer::new(&config).expect("producer");
    for i in 0..3 {
        producer
            .enqueue_to(&a, &TestJob::ok(format!("a{i}"), i))
            .await
            .expect("enqueued");
    }
    eventually(Duration::from_secs(60), "the breaker opened", || {
        breaker.state() == BreakerState::Open
    })
    .await;
    // Let the other A jobs (and the retry) reach the breaker and park.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let sent = Instant::now();
    for i in 0..20 {
        producer
            .enqueue_to(&b, &TestJob::ok(format!("b{i}"), 100 + i))
            .await
            .expect("enqueued");
    }
    eventually(
        Duration::from_secs(10),
        "route B ran while A's breaker is open",
        || b_started.lock().unwrap().len() >= 20,
    )
    .await;
    let took = b_started
        .lock()
        .unwrap()
        .iter()
        .map(|(_, t)| t.duration_since(sent))
        .max()
        .unwrap_or_default();
    println!("20 jobs on B handled {took:?} after they were sent, with A's breaker open");
    assert_eq!(breaker.state(), BreakerState::Open, "still open meanwhile");
    assert!(
        a_calls.load(Ordering::Relaxed) <= 2,
        "parked A jobs did not call the downstream"
    );

    let stopping = Instant::now();
    running.stop().await;
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "parked jobs are released at once on stop: {:?}",
        stopping.elapsed()
    );
    let dlq = try_end_offsets(&config, &format!("{a}.dlq"), 2).map_or(0, |e| e.iter().sum::<i64>());
    assert_eq!(dlq, 0, "nothing dead-lettered because of the breaker");
}

/// A handler that hangs holds its partition's commit; the worker says so:
/// `kjob_oldest_running_seconds{job}` shows its age on `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_handler_shows_in_the_oldest_running_gauge() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("isohung");
    let group = unique("g");
    create_topic(&config, &topic, 1).await;
    let release = Arc::new(tokio::sync::Notify::new());
    let gate = release.clone();
    let worker = Worker::builder(config.clone(), &group)
        .handle_on(&topic, move |_job: TestJob, _ctx: JobContext| {
            let gate = gate.clone();
            async move {
                gate.notified().await;
                Ok::<(), JobError>(())
            }
        })
        .slow_attempt_warning(Duration::from_secs(2))
        .commit_interval(Duration::from_millis(200))
        .metrics_endpoint(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .build()
        .expect("worker builds");
    let running = start(worker);
    let producer = Producer::new(&config).expect("producer");
    producer
        .enqueue_to(&topic, &TestJob::ok("k", 1))
        .await
        .expect("enqueued");
    let gauge = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("kjob_oldest_running_seconds{") && l.contains("kjob.test.job"))
            .and_then(|l| l.rsplit_once(' '))
            .and_then(|(_, v)| v.parse::<f64>().ok())
    };
    let addr = loop {
        if let Some(a) = running.stats.endpoint.get() {
            break *a;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let scrape = || async move {
        reqwest::get(format!("http://{addr}/metrics"))
            .await
            .expect("scrape")
            .text()
            .await
            .expect("body")
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut age = None;
    while Instant::now() < deadline {
        age = gauge(&scrape().await);
        if age.is_some_and(|a| a >= 3.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        age.is_some_and(|a| a >= 3.0),
        "the hung handler's age: {age:?}"
    );
    release.notify_waiters();
    wait_committed_at_end(&config, &group, &topic, 1).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(gauge(&scrape().await), Some(0.0), "0 once it returned");
    running.stop().await;
}
