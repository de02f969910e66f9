//! The schema registry goes down while a worker runs.
//!
//! A worker that has not yet cached a record's writer schema cannot decode
//! it. The record is fine and the handler never ran, so the job must wait
//! for the registry with its attempt count unchanged: not walk the retry
//! tiers (with the default tiers a 30 s outage would otherwise park jobs
//! for 5 minutes, and a long one would dead-letter them). A stop or revoke
//! while jobs wait must not wait for the registry.
//!
//! The worker reaches the shared registry through a proxy this test cuts
//! (`CutProxy::tcp`); the producer and everything else use it directly.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kjob::retry::RetryPolicy;
use kjob::{JobContext, JobError, KafkaConfig, Producer, Worker};
use kjob_integration_tests::*;

const PARTITIONS: i32 = 2;

/// `kjob_registry_waiting` counts the whole process's waiting jobs, so the
/// two tests take turns.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `(seq, attempt)` of every handler call.
type Calls = Arc<Mutex<Vec<(i64, u32)>>>;

/// A worker whose registry is `registry_url`, recording its handler calls.
/// Tiers of 1 s and three attempts: without the wait, a job would reach
/// the DLQ about 3 s into an outage.
fn worker(
    config: &KafkaConfig,
    registry_url: &str,
    topic: &str,
    group: &str,
    calls: Calls,
) -> Running {
    let mut through_proxy = config.clone();
    through_proxy.schema_registry_url = registry_url.to_string();
    let w = Worker::builder(through_proxy, group)
        .handle_on(topic, move |job: TestJob, ctx: JobContext| {
            let calls = calls.clone();
            async move {
                calls.lock().unwrap().push((job.seq, ctx.attempt));
                Ok::<(), JobError>(())
            }
        })
        .retry(RetryPolicy::tiers([Duration::from_secs(1)]).max_attempts(3))
        .commit_interval(Duration::from_millis(200))
        .metrics_endpoint(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .build()
        .expect("worker builds");
    start(w)
}

/// The proxy's URL for the stack's registry.
fn proxied(config: &KafkaConfig, proxy: &CutProxy) -> String {
    let url = &config.schema_registry_url;
    let rest = url.strip_prefix("http://").expect("an http registry URL");
    let path = rest.find('/').map_or("", |i| &rest[i..]);
    format!("http://{}{path}", proxy.bootstrap())
}

fn upstream(config: &KafkaConfig) -> String {
    let rest = config
        .schema_registry_url
        .strip_prefix("http://")
        .expect("an http registry URL");
    rest.split('/').next().unwrap_or(rest).to_string()
}

/// `kjob_registry_waiting` on the worker's `/metrics`.
async fn waiting_gauge(running: &Running) -> Option<f64> {
    let addr = running.stats.endpoint.get()?;
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find(|l| l.starts_with("kjob_registry_waiting"))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse().ok())
}

/// Records in the route's tier and DLQ.
fn forwarded(config: &KafkaConfig, topic: &str) -> (i64, i64) {
    let sum = |t: String| try_end_offsets(config, &t, PARTITIONS).map_or(0, |e| e.iter().sum());
    (
        sum(format!("{topic}.retry.1s")),
        sum(format!("{topic}.dlq")),
    )
}

async fn assigned(running: &Running) {
    let stats = running.stats.clone();
    eventually(
        Duration::from_secs(60),
        "the worker holds its partitions",
        || {
            stats
                .assignment()
                .iter()
                .filter(|(t, _)| !t.contains(".retry."))
                .count()
                == PARTITIONS as usize
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_wait_for_the_registry_instead_of_walking_the_retry_tiers() {
    let _turn = ONE_AT_A_TIME.lock().await;
    init_logging();
    let config = ensure_stack();
    let topic = unique("regout");
    let group = unique("g");
    create_topic(&config, &topic, PARTITIONS).await;
    let proxy = CutProxy::tcp(&upstream(&config)).await;
    let calls: Calls = Arc::default();
    let running = worker(
        &config,
        &proxied(&config, &proxy),
        &topic,
        &group,
        calls.clone(),
    );
    assigned(&running).await;

    // The registry goes away before the worker has decoded anything, so it
    // has no writer schema cached. 200 jobs arrive meanwhile.
    proxy.cut();
    let producer = Producer::new(&config).expect("producer");
    enqueue_n(&producer, &topic, 200, 50, "ok").await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(
        calls.lock().unwrap().is_empty(),
        "no job could be decoded while the registry was down"
    );
    assert_eq!(
        forwarded(&config, &topic),
        (0, 0),
        "8 s into the outage nothing went to the 1 s tier or the DLQ"
    );
    let waiting = waiting_gauge(&running).await;
    assert!(
        waiting.is_some_and(|w| w >= 1.0),
        "kjob_registry_waiting shows the waiting jobs: {waiting:?}"
    );

    proxy.restore();
    let back = Instant::now();
    eventually(
        Duration::from_secs(30),
        "every job ran once the registry answered",
        || calls.lock().unwrap().len() >= 200,
    )
    .await;
    let resumed = back.elapsed();
    wait_committed_at_end(&config, &group, &topic, PARTITIONS).await;
    let waiting = waiting_gauge(&running).await;
    assert_eq!(
        waiting,
        Some(0.0),
        "nothing waits once the registry answers"
    );
    running.stop().await;

    let calls = calls.lock().unwrap().clone();
    let mut seqs: Vec<i64> = calls.iter().map(|(s, _)| *s).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs, (0..200).collect::<Vec<_>>(), "every job ran");
    assert_eq!(calls.len(), 200, "each exactly once");
    assert!(
        calls.iter().all(|(_, a)| *a == 1),
        "on its first attempt: the outage did not count"
    );
    assert_eq!(forwarded(&config, &topic), (0, 0), "no tier, no DLQ");
    println!("registry back -> all 200 handled in {resumed:?}");
    assert!(resumed < Duration::from_secs(10), "resumed in {resumed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_while_jobs_wait_for_the_registry_is_quick_and_loses_nothing() {
    let _turn = ONE_AT_A_TIME.lock().await;
    init_logging();
    let config = ensure_stack();
    let topic = unique("regstop");
    let group = unique("g");
    create_topic(&config, &topic, PARTITIONS).await;
    let proxy = CutProxy::tcp(&upstream(&config)).await;
    let calls: Calls = Arc::default();
    let first = worker(
        &config,
        &proxied(&config, &proxy),
        &topic,
        &group,
        calls.clone(),
    );
    assigned(&first).await;
    proxy.cut();
    let producer = Producer::new(&config).expect("producer");
    enqueue_n(&producer, &topic, 50, 50, "ok").await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    // The grace period is 30 s; waiting jobs are released at once.
    let stopping = Instant::now();
    first.stop().await;
    let took = stopping.elapsed();
    println!("stop with 50 jobs waiting for the registry: {took:?}");
    assert!(took < Duration::from_secs(5), "stopped in {took:?}");
    assert!(calls.lock().unwrap().is_empty());

    // Nothing was committed for them: the next worker runs all 50, first attempts.
    proxy.restore();
    let second = worker(
        &config,
        &config.schema_registry_url,
        &topic,
        &group,
        calls.clone(),
    );
    eventually(
        Duration::from_secs(60),
        "the next worker ran every job",
        || calls.lock().unwrap().len() >= 50,
    )
    .await;
    wait_committed_at_end(&config, &group, &topic, PARTITIONS).await;
    second.stop().await;
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 50, "each exactly once");
    assert!(calls.iter().all(|(_, a)| *a == 1));
    assert_eq!(forwarded(&config, &topic), (0, 0));
}
