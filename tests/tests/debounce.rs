//! Debounce on the real stack: of a key's jobs written within the window
//! of each other only the newest runs, the rest finish as superseded
//! without a handler call, and a SIGKILL while they wait changes nothing:
//! the next worker picks the same survivors, and nothing is lost.

use std::collections::HashMap;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kjob::{JobContext, Producer, Worker, WorkerStats};
use kjob_integration_tests::*;

async fn enqueue_all(producer: &Producer, topic: &str, jobs: &[TestJob]) {
    for chunk in jobs.chunks(500) {
        let sent =
            futures::future::join_all(chunk.iter().map(|j| producer.enqueue_to(topic, j))).await;
        for s in sent {
            s.expect("enqueue");
        }
    }
}

/// `keys` keys with `per_key` jobs each, seq = key × 1000 + n (the newest
/// of a key has the highest seq), interleaved as a burst of changes is.
fn burst(keys: i64, per_key: i64) -> Vec<TestJob> {
    let mut jobs = Vec::new();
    for n in 0..per_key {
        for k in 0..keys {
            jobs.push(TestJob::ok(format!("key-{k}"), k * 1000 + n));
        }
    }
    jobs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_jobs_for_a_hundred_keys_make_a_hundred_handler_calls() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("debounce");
    create_topic(&config, &topic, 4).await;
    let calls: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
    let c = calls.clone();
    let w = Worker::builder(config.clone(), unique("g"))
        .handle_on(&topic, move |job: TestJob, _ctx: JobContext| {
            let c = c.clone();
            async move {
                c.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((job.key, job.seq));
                Ok::<(), kjob::JobError>(())
            }
        })
        .debounce(&topic, Duration::from_secs(3))
        .build()
        .expect("worker builds");
    let running = start(w);
    eventually(Duration::from_secs(30), "the worker consumes", || {
        running
            .stats
            .ready
            .load(std::sync::atomic::Ordering::Acquire)
    })
    .await;
    let producer = Producer::new(&config).expect("producer");
    let jobs = burst(100, 100);
    enqueue_all(&producer, &topic, &jobs).await;
    eventually(Duration::from_secs(60), "every job finished", || {
        WorkerStats::get(&running.stats.superseded)
            + calls.lock().unwrap_or_else(|e| e.into_inner()).len() as u64
            >= 10_000
    })
    .await;
    // A moment more: nothing else may run.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let calls = calls.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert_eq!(calls.len(), 100, "one handler call per key");
    let mut by_key: HashMap<String, Vec<i64>> = HashMap::new();
    for (k, seq) in &calls {
        by_key.entry(k.clone()).or_default().push(*seq);
    }
    for k in 0..100 {
        assert_eq!(
            by_key.get(&format!("key-{k}")).map(Vec::as_slice),
            Some(&[k * 1000 + 99][..]),
            "key-{k}: only its newest job ran"
        );
    }
    assert_eq!(WorkerStats::get(&running.stats.superseded), 9_900);
    running.stop().await;
}

fn spawn_worker(topic: &str, group: &str, record: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_test-worker"))
        .env("KJOB_TEST_TOPIC", topic)
        .env("KJOB_TEST_GROUP", group)
        .env("KJOB_TEST_RECORD", record)
        .env("KJOB_TEST_DEBOUNCE_MS", "4000")
        // A restart within the session takes its partitions straight back.
        .env("KJOB_INSTANCE_ID", "debounce-0")
        .spawn()
        .expect("test-worker runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_while_jobs_wait_out_their_window_picks_the_same_survivors() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("debounce.kill");
    let group = unique("g");
    create_topic(&config, &topic, 2).await;
    let record = std::env::temp_dir().join(unique("debounce-record"));
    let mut worker = spawn_worker(&topic, &group, &record);
    let producer = Producer::new(&config).expect("producer");
    // Once a first job ran, the worker is fetching.
    const WARM: i64 = 999_999;
    producer
        .enqueue_to(&topic, &TestJob::ok("warm-up", WARM))
        .await
        .expect("enqueue");
    eventually(
        Duration::from_secs(60),
        "the worker runs a first job",
        || {
            read_lines(&record)
                .iter()
                .any(|l| l == &format!("done {WARM}"))
        },
    )
    .await;
    enqueue_all(&producer, &topic, &burst(20, 10)).await;
    // Killed while every job still waits out its window: none ran.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    worker.kill().expect("SIGKILL");
    let _ = worker.wait();
    let done = |lines: &[String]| -> Vec<i64> {
        lines
            .iter()
            .filter_map(|l| l.strip_prefix("done "))
            .filter_map(|s| s.parse().ok())
            .filter(|seq| *seq != WARM)
            .collect()
    };
    assert!(
        done(&read_lines(&record)).is_empty(),
        "nothing ran before the kill"
    );
    let mut again = spawn_worker(&topic, &group, &record);
    eventually(Duration::from_secs(60), "a job per key", || {
        done(&read_lines(&record)).len() >= 20
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let _ = again.kill();
    let _ = again.wait();
    let mut ran = done(&read_lines(&record));
    ran.sort_unstable();
    let newest: Vec<i64> = (0..20).map(|k| k * 1000 + 9).collect();
    assert_eq!(ran, newest, "exactly the newest job of each key, once");
}

#[test]
fn debounce_is_refused_with_strict_order_a_zero_window_or_an_unknown_route() {
    let config = kjob::KafkaConfig::new("127.0.0.1:1", "http://127.0.0.1:1");
    let handler = |_job: TestJob, _ctx: JobContext| async { Ok::<(), kjob::JobError>(()) };
    let refused = |b: kjob::WorkerBuilder| match b.build() {
        Ok(_) => panic!("built"),
        Err(e) => e.to_string(),
    };
    let strict = refused(
        Worker::builder(config.clone(), "g")
            .handle_on("t", handler)
            .strict_order("t")
            .debounce("t", Duration::from_secs(1)),
    );
    assert!(strict.contains("choose one"), "{strict}");
    let zero = refused(
        Worker::builder(config.clone(), "g")
            .handle_on("t", handler)
            .debounce("t", Duration::ZERO),
    );
    assert!(zero.contains("longer than zero"), "{zero}");
    let unknown = refused(
        Worker::builder(config, "g")
            .handle_on("t", handler)
            .debounce("other", Duration::from_secs(1)),
    );
    assert!(unknown.contains("other"), "{unknown}");
}
