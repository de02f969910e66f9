//! Grep by business id: every line a worker logs for an attempt, the
//! handler's own included, carries the job's id, key, route, attempt,
//! partition and offset, in the human format and in JSON. This file is its
//! own process, so its global subscriber sees every thread's events.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kjob::{JobContext, JobError, Producer, Worker};
use kjob_integration_tests::*;
use tracing_subscriber::layer::SubscriberExt as _;

/// A writer into a shared buffer, for a `fmt` layer.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Buffer {
    fn lines(&self) -> Vec<String> {
        let bytes = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(str::to_string)
            .collect()
    }
}

async fn charge(job: TestJob, ctx: JobContext) -> Result<(), JobError> {
    tracing::info!(amount = job.seq, "charging the card");
    if job.key == "order-4711" && ctx.attempt == 1 {
        return Err(JobError::retryable("the payment provider answered 503"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_line_of_an_attempt_names_the_jobs_key() {
    let (human, json) = (Buffer::default(), Buffer::default());
    let (h, j) = (human.clone(), json.clone());
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::filter::LevelFilter::INFO)
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(move || h.clone()),
        )
        .with(
            tracing_subscriber::fmt::layer()
                .json()
                .with_writer(move || j.clone()),
        );
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    let config = ensure_stack();
    let topic = unique("logs");
    create_topic(&config, &topic, 1).await;
    let producer = Producer::new(&config).expect("producer");
    for key in ["order-4711", "order-4712"] {
        producer
            .enqueue_to(&topic, &TestJob::ok(key, 7))
            .await
            .expect("enqueued");
    }
    let w = Worker::builder(config.clone(), unique("g"))
        .handle_on(&topic, charge)
        .retry(kjob::retry::RetryPolicy::tiers([Duration::from_millis(
            500,
        )]))
        .build()
        .expect("built");
    let running = start(w);
    let stats = running.stats.clone();
    eventually(
        Duration::from_secs(60),
        "three attempts handled or retried",
        || kjob::WorkerStats::get(&stats.handled) >= 2,
    )
    .await;
    running.stop().await;

    // The human format: grep the key.
    let lines = human.lines();
    let of_4711: Vec<&String> = lines.iter().filter(|l| l.contains("order-4711")).collect();
    let handler = of_4711
        .iter()
        .filter(|l| l.contains("charging the card"))
        .count();
    assert_eq!(
        handler, 2,
        "the handler's line, once per attempt: {of_4711:#?}"
    );
    let retry = of_4711
        .iter()
        .find(|l| l.contains("scheduled a retry"))
        .unwrap_or_else(|| panic!("kjob's retry line names the key: {of_4711:#?}"));
    for field in [
        "job.id=",
        "job.route=",
        "job.attempt=1",
        "partition=0",
        "offset=0",
    ] {
        assert!(retry.contains(field), "{field} in {retry}");
    }
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("order-4712") && l.contains("order-4711")),
        "each line names one job"
    );

    // JSON: the span's fields on each line.
    let spans: Vec<serde_json::Value> = json
        .lines()
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["span"]["job.key"] == "order-4711")
        .collect();
    assert!(
        spans.len() >= 3,
        "two handler lines and the retry: {spans:#?}"
    );
    let second = spans
        .iter()
        .find(|v| v["span"]["job.attempt"] == 2)
        .unwrap_or_else(|| panic!("the retried attempt: {spans:#?}"));
    assert_eq!(second["span"]["job.route"], topic.as_str());
    assert!(second["span"]["job.id"].is_string());
    assert!(second["span"]["offset"].is_number() && second["span"]["partition"] == 0);
}
