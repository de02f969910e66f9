//! A worker *process* for the crash and shutdown tests: they need to SIGKILL
//! and SIGTERM a real process, which an in-process worker cannot simulate.
//!
//! Configured by environment: `KJOB_TEST_TOPIC`, `KJOB_TEST_GROUP`,
//! `KJOB_TEST_RECORD` (a file; `start <seq>` and `done <seq>` lines are
//! appended with one write each, so they survive SIGKILL), and
//! `KJOB_TEST_DELAY_MS` (simulated handler latency).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kjob::{JobContext, JobError, KafkaConfig, Worker};
use kjob_integration_tests::{append_line, TestJob};

fn env(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("missing environment variable {name}"))
}

#[tokio::main]
async fn main() -> Result<(), String> {
    kjob_integration_tests::init_logging();
    let topic = env("KJOB_TEST_TOPIC")?;
    let group = env("KJOB_TEST_GROUP")?;
    let record = Arc::new(PathBuf::from(env("KJOB_TEST_RECORD")?));
    let delay = Duration::from_millis(
        env("KJOB_TEST_DELAY_MS")
            .ok()
            .and_then(|d| d.parse().ok())
            .unwrap_or(0),
    );
    let handler = move |job: TestJob, _ctx: JobContext| {
        let record = record.clone();
        async move {
            append_line(&record, &format!("start {}", job.seq));
            tokio::time::sleep(delay).await;
            append_line(&record, &format!("done {}", job.seq));
            Ok::<(), JobError>(())
        }
    };
    Worker::builder(KafkaConfig::from_env(), group)
        .handle_on::<TestJob, _>(&topic, handler)
        .concurrency(64)
        .commit_interval(Duration::from_millis(200))
        .shutdown_grace(Duration::from_secs(20))
        .build()
        .map_err(|e| e.to_string())?
        .run()
        .await
        .map_err(|e| e.to_string())
}
