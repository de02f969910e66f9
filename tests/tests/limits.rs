//! Worker limits: after N jobs, above an RSS, or after a time, the worker
//! stops gracefully with the limit's exit status, and a restarted worker
//! carries on with nothing lost and nothing handled twice.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use kjob::Producer;
use kjob_integration_tests::*;

fn done(record: &Path) -> HashMap<i64, u32> {
    let mut m = HashMap::new();
    for line in read_lines(record) {
        if let Some(seq) = line.strip_prefix("done ").and_then(|s| s.parse().ok()) {
            *m.entry(seq).or_default() += 1;
        }
    }
    m
}

/// Runs limited workers one after another (as a supervisor would) until
/// every job is done; returns each run's exit code.
async fn supervise(limit: (&str, &str), jobs: i64, delay_ms: u64) -> (Vec<i32>, HashMap<i64, u32>) {
    init_logging();
    let config = ensure_stack();
    let topic = unique("limits");
    let group = unique("g");
    create_topic(&config, &topic, 3).await;
    let producer = Producer::new(&config).expect("producer");
    enqueue_n(&producer, &topic, jobs, 50, "ok").await;
    let dir = std::env::temp_dir().join(unique("kjob-limits"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let record = dir.join("record");
    let mut codes = Vec::new();
    let start = Instant::now();
    while (done(&record).len() as i64) < jobs {
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "supervisor gave up"
        );
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_test-worker"))
            .env("KJOB_TEST_TOPIC", &topic)
            .env("KJOB_TEST_GROUP", &group)
            .env("KJOB_TEST_RECORD", &record)
            .env("KJOB_TEST_DELAY_MS", delay_ms.to_string())
            .env(limit.0, limit.1)
            .spawn()
            .expect("test-worker runs");
        // The last worker may finish the backlog before its limit fires:
        // the supervisor then stops it (SIGTERM, exit 0) and is done.
        let status = loop {
            if let Some(status) = child.try_wait().expect("waiting for test-worker") {
                break status;
            }
            if done(&record).len() as i64 >= jobs {
                wait_committed_at_end(&config, &group, &topic, 3).await;
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &child.id().to_string()])
                    .status();
                break child.wait().expect("test-worker exits");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let code = status.code().unwrap_or(-1);
        if code != 0 {
            codes.push(code);
        }
        assert!(codes.len() < 50, "too many restarts: {codes:?}");
    }
    wait_committed_at_end(&config, &group, &topic, 3).await;
    (codes, done(&record))
}

fn assert_exactly_once(done: &HashMap<i64, u32>, jobs: i64) {
    assert_eq!(done.len() as i64, jobs, "no job lost");
    let twice: Vec<_> = done.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "handled twice across a graceful restart: {twice:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_after_jobs_restarts_without_losing_or_repeating_jobs() {
    let (codes, done) = supervise(("KJOB_STOP_AFTER_JOBS", "300"), 1_000, 2).await;
    assert!(!codes.is_empty(), "the limit fired: {codes:?}");
    assert!(
        !codes.is_empty() && codes.iter().all(|c| *c == 81),
        "exit status 81 for the job limit: {codes:?}"
    );
    assert_exactly_once(&done, 1_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_after_a_time_restarts_without_losing_or_repeating_jobs() {
    let (codes, done) = supervise(("KJOB_STOP_AFTER", "4s"), 1_000, 300).await;
    assert!(!codes.is_empty(), "the limit fired: {codes:?}");
    assert!(
        !codes.is_empty() && codes.iter().all(|c| *c == 83),
        "exit status 83 for the time limit: {codes:?}"
    );
    assert_exactly_once(&done, 1_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_above_rss_fires_and_loses_nothing() {
    // 1 byte: the limit fires at the first check after a job was handled,
    // while others still run. At least one run must end with it: a limit
    // that never fired would leave `codes` empty.
    let (codes, done) = supervise(("KJOB_STOP_ABOVE_RSS", "1"), 300, 200).await;
    assert!(
        !codes.is_empty() && codes.iter().all(|c| *c == 82),
        "exit status 82 for the memory limit: {codes:?}"
    );
    assert_exactly_once(&done, 300);
}
