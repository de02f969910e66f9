//! The spine against the real stack: enqueue, handle, commit-after-handle,
//! crashes, shutdown, rebalances, poison records, and clear errors when a
//! dependency is down.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kjob::{Error, Job, JobContext, JobError, KafkaConfig, Producer, Worker};
use kjob_integration_tests::*;
use rdkafka::message::{Headers, Message};
use tokio::sync::Notify;

type Seen = Arc<Mutex<HashMap<i64, u32>>>;

/// A handler that acts out `job.behaviour` and counts every handled seq.
fn recording_handler(
    seen: Seen,
    gate: Arc<Notify>,
) -> impl Fn(TestJob, JobContext) -> futures::future::BoxFuture<'static, Result<(), JobError>>
       + Send
       + Sync
       + 'static {
    move |job: TestJob, _ctx: JobContext| {
        let seen = seen.clone();
        let gate = gate.clone();
        Box::pin(async move {
            match job.behaviour.as_str() {
                "permanent" => return Err(JobError::invalid_input("test: permanent")),
                "panic" => panic!("test: handler bug"),
                "block" => gate.notified().await,
                "slow" => tokio::time::sleep(Duration::from_millis(3)).await,
                _ => {}
            }
            *seen.lock().unwrap().entry(job.seq).or_default() += 1;
            Ok(())
        })
    }
}

fn worker(config: &KafkaConfig, group: &str, topic: &str, seen: Seen, gate: Arc<Notify>) -> Worker {
    Worker::builder(config.clone(), group)
        .handle_on(topic, recording_handler(seen, gate))
        .commit_interval(Duration::from_millis(200))
        .build()
        .expect("worker builds")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_job_is_handled_and_kafka_reports_zero_lag() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("spine.all");
    let group = unique("g");
    create_topic(&config, &topic, 3).await;
    let producer = Producer::new(&config).unwrap();
    enqueue_n(&producer, &topic, 600, 40, "ok").await;

    let seen: Seen = Default::default();
    let running = start(worker(
        &config,
        &group,
        &topic,
        seen.clone(),
        Arc::new(Notify::new()),
    ));
    eventually(Duration::from_secs(60), "600 jobs handled", || {
        seen.lock().unwrap().len() == 600
    })
    .await;
    wait_committed_at_end(&config, &group, &topic, 3).await;
    running.stop().await;

    // Kafka's own tool, not our code, confirms the commits.
    let rows = kafka_describe_group(&config, &group, &topic);
    assert_eq!(rows.len(), 3, "one row per partition: {rows:?}");
    let ends = end_offsets(&config, &topic, 3);
    for (partition, current, log_end, lag) in rows {
        assert_eq!(current, Some(log_end), "partition {partition}");
        assert_eq!(log_end, ends[partition as usize]);
        assert_eq!(lag, Some(0), "partition {partition} lag");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_job_holds_the_commit_of_its_partition() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("spine.block");
    let group = unique("g");
    create_topic(&config, &topic, 1).await;
    let producer = Producer::new(&config).unwrap();
    for i in 0..5 {
        producer
            .enqueue_to(&topic, &TestJob::ok(format!("before{i}"), i))
            .await
            .unwrap();
    }
    let blocked = producer
        .enqueue_to(&topic, &TestJob::with("slowpoke", 100, "block"))
        .await
        .unwrap();
    for i in 0..50 {
        producer
            .enqueue_to(&topic, &TestJob::ok(format!("other{i}"), 200 + i))
            .await
            .unwrap();
    }

    let seen: Seen = Default::default();
    let gate = Arc::new(Notify::new());
    let running = start(worker(&config, &group, &topic, seen.clone(), gate.clone()));
    eventually(
        Duration::from_secs(30),
        "all unblocked jobs handled",
        || seen.lock().unwrap().len() == 55,
    )
    .await;
    // Several commit intervals pass while later jobs are done.
    eventually(
        Duration::from_secs(10),
        "watermark committed up to the blocked job",
        || committed_offsets(&config, &group, &topic, 1)[0] == Some(blocked.offset),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        committed_offsets(&config, &group, &topic, 1)[0],
        Some(blocked.offset),
        "the commit must not pass the unfinished job even though 50 later jobs finished"
    );
    gate.notify_one();
    wait_committed_at_end(&config, &group, &topic, 1).await;
    running.stop().await;
    assert_eq!(seen.lock().unwrap().get(&100), Some(&1));
}

fn spawn_worker_process(
    topic: &str,
    group: &str,
    record: &std::path::Path,
    delay_ms: u64,
) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_test-worker"))
        .env("KJOB_TEST_TOPIC", topic)
        .env("KJOB_TEST_GROUP", group)
        .env("KJOB_TEST_RECORD", record)
        .env("KJOB_TEST_DELAY_MS", delay_ms.to_string())
        .spawn()
        .expect("spawning test-worker")
}

fn done_counts(record: &std::path::Path) -> HashMap<i64, u32> {
    let mut m = HashMap::new();
    for line in read_lines(record) {
        if let Some(seq) = line.strip_prefix("done ").and_then(|s| s.parse().ok()) {
            *m.entry(seq).or_default() += 1;
        }
    }
    m
}

fn started(record: &std::path::Path) -> HashSet<i64> {
    read_lines(record)
        .iter()
        .filter_map(|l| l.strip_prefix("start ").and_then(|s| s.parse().ok()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_with_sigkill_loses_nothing() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("spine.kill");
    let group = unique("g");
    create_topic(&config, &topic, 3).await;
    let producer = Producer::new(&config).unwrap();
    enqueue_n(&producer, &topic, 5000, 300, "ok").await;

    let dir = std::env::temp_dir().join(unique("kjob-kill"));
    std::fs::create_dir_all(&dir).unwrap();
    let record = dir.join("record");
    let mut first = spawn_worker_process(&topic, &group, &record, 20);
    eventually(Duration::from_secs(60), "first worker is mid-run", || {
        done_counts(&record).len() >= 300
    })
    .await;
    first.kill().expect("SIGKILL");
    first.wait().unwrap();
    let before = done_counts(&record).len() as i64;
    assert!(
        before < 5000,
        "the kill must land mid-run (handled {before})"
    );
    let committed: i64 = committed_offsets(&config, &group, &topic, 3)
        .iter()
        .map(|c| c.unwrap_or(0))
        .sum();
    assert!(
        committed <= before,
        "never committed more than was handled: {committed} > {before}"
    );

    let mut second = spawn_worker_process(&topic, &group, &record, 0);
    eventually(
        Duration::from_secs(60),
        "every job handled after restart",
        || done_counts(&record).len() == 5000,
    )
    .await;
    wait_committed_at_end(&config, &group, &topic, 3).await;
    second.kill().unwrap();
    second.wait().unwrap();
    let counts = done_counts(&record);
    assert_eq!(counts.len(), 5000, "no job lost");
    // At-least-once: exactly the jobs finished after the last commit run twice.
    let dupes = counts.values().filter(|c| **c > 1).count() as i64;
    assert_eq!(
        dupes,
        before - committed,
        "re-run exactly what was done but not yet committed"
    );
    assert!(counts.values().all(|c| *c <= 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_jobs_and_commits_them() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("spine.term");
    let group = unique("g");
    create_topic(&config, &topic, 2).await;
    let producer = Producer::new(&config).unwrap();
    enqueue_n(&producer, &topic, 20, 20, "ok").await;

    let dir = std::env::temp_dir().join(unique("kjob-term"));
    std::fs::create_dir_all(&dir).unwrap();
    let record = dir.join("record");
    let mut worker = spawn_worker_process(&topic, &group, &record, 3000);
    eventually(Duration::from_secs(60), "jobs in flight", || {
        started(&record).len() == 20
    })
    .await;
    assert!(
        done_counts(&record).is_empty(),
        "still in flight when SIGTERM arrives"
    );
    let pid = worker.id().to_string();
    let sent_at = Instant::now();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let status = worker.wait().unwrap();
    assert!(status.success(), "graceful exit, got {status:?}");
    assert!(
        sent_at.elapsed() < Duration::from_secs(20),
        "shutdown bounded by the grace period"
    );
    assert_eq!(
        done_counts(&record).len(),
        20,
        "every in-flight job finished"
    );
    let ends = end_offsets(&config, &topic, 2);
    let committed = committed_offsets(&config, &group, &topic, 2);
    for (c, e) in committed.iter().zip(&ends) {
        assert!(
            *e == 0 || *c == Some(*e),
            "committed {committed:?} vs end {ends:?}"
        );
    }

    // A restarted worker finds nothing to redo.
    let mut again = spawn_worker_process(&topic, &group, &record, 0);
    tokio::time::sleep(Duration::from_secs(6)).await;
    again.kill().unwrap();
    again.wait().unwrap();
    assert!(
        done_counts(&record).values().all(|c| *c == 1),
        "no job handled twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_worker_joining_and_leaving_loses_nothing() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("spine.join");
    let group = unique("g");
    create_topic(&config, &topic, 4).await;
    let producer = Producer::new(&config).unwrap();
    enqueue_n(&producer, &topic, 4000, 300, "slow").await;

    let seen: Seen = Default::default();
    let gate = Arc::new(Notify::new());
    let a = start(worker(&config, &group, &topic, seen.clone(), gate.clone()));
    eventually(Duration::from_secs(60), "A made progress", || {
        seen.lock().unwrap().len() >= 500
    })
    .await;
    let b = start(worker(&config, &group, &topic, seen.clone(), gate.clone()));
    eventually(Duration::from_secs(60), "progress with two members", || {
        seen.lock().unwrap().len() >= 2000
    })
    .await;
    b.stop().await;
    eventually(Duration::from_secs(90), "all handled", || {
        seen.lock().unwrap().len() == 4000
    })
    .await;
    wait_committed_at_end(&config, &group, &topic, 4).await;
    a.stop().await;
    assert_eq!(seen.lock().unwrap().len(), 4000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_records_are_dead_lettered_with_a_specific_class() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("spine.poison");
    let group = unique("g");
    create_topic(&config, &topic, 1).await;
    let producer = Producer::new(&config).unwrap();
    let good = producer
        .enqueue_to(&topic, &TestJob::ok("a", 1))
        .await
        .unwrap();

    // A valid record to cut short, with its real schema id.
    let long = TestJob::ok("x".repeat(200), 0);
    let valid = {
        let c = producer.codec().register::<TestJob>(&topic).await.unwrap();
        kjob::codec::Codec::encode(&c, &long).unwrap()
    };
    produce_raw(
        &config,
        &topic,
        0,
        "r",
        b"\xde\xad\xbe\xef random garbage bytes",
    );
    produce_raw(&config, &topic, 0, "m", &[&[1u8][..], &valid[1..]].concat());
    produce_raw(
        &config,
        &topic,
        0,
        "u",
        &kjob::codec::frame(0x7fff_fff0, &valid[5..]),
    );
    produce_raw(&config, &topic, 0, "t", &valid[..valid.len() - 150]);
    producer
        .enqueue_to(&topic, &TestJob::with("p", 2, "permanent"))
        .await
        .unwrap();
    producer
        .enqueue_to(&topic, &TestJob::with("q", 3, "panic"))
        .await
        .unwrap();
    producer
        .enqueue_to(&topic, &TestJob::ok("z", 4))
        .await
        .unwrap();
    assert_eq!(good.partition, 0);

    let seen: Seen = Default::default();
    let running = start(worker(
        &config,
        &group,
        &topic,
        seen.clone(),
        Arc::new(Notify::new()),
    ));
    eventually(
        Duration::from_secs(30),
        "good jobs around the poison handled",
        || {
            let s = seen.lock().unwrap();
            s.contains_key(&1) && s.contains_key(&4)
        },
    )
    .await;
    wait_committed_at_end(&config, &group, &topic, 1).await;
    running.stop().await;

    let dlq = read_all(&config, &format!("{topic}.dlq"));
    let classes: HashMap<String, String> = dlq
        .iter()
        .map(|m| {
            let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
            let class = m
                .headers()
                .and_then(|h| h.iter().find(|h| h.key == "kjob-error-class"))
                .and_then(|h| h.value)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default();
            (key, class)
        })
        .collect();
    assert_eq!(
        classes.get("r").map(String::as_str),
        Some("decode.not_framed"),
        "{classes:?}"
    );
    assert_eq!(
        classes.get("m").map(String::as_str),
        Some("decode.not_framed"),
        "{classes:?}"
    );
    assert_eq!(
        classes.get("u").map(String::as_str),
        Some("decode.unknown_schema"),
        "{classes:?}"
    );
    assert_eq!(
        classes.get("t").map(String::as_str),
        Some("decode.body"),
        "{classes:?}"
    );
    assert_eq!(
        classes.get("p").map(String::as_str),
        Some("permanent.invalid_input"),
        "{classes:?}"
    );
    assert_eq!(
        classes.get("q").map(String::as_str),
        Some("bug.panic"),
        "{classes:?}"
    );
    assert_eq!(dlq.len(), 6, "exactly the six failures, nothing else");
    // Payloads travel byte-for-byte and carry their origin.
    let garbage = dlq.iter().find(|m| m.key() == Some(&b"r"[..])).unwrap();
    assert_eq!(
        garbage.payload(),
        Some(&b"\xde\xad\xbe\xef random garbage bytes"[..])
    );
    let h = kjob::headers::JobHeaders::parse(garbage.headers());
    assert_eq!(h.original_topic.as_deref(), Some(topic.as_str()));
    assert_eq!(h.group.as_deref(), Some(group.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_with_the_broker_down_fails_clearly_within_the_timeout() {
    init_logging();
    let live = ensure_stack();
    let config = KafkaConfig::new("127.0.0.1:1", live.schema_registry_url.clone());
    let producer = Producer::with_delivery_timeout(&config, Duration::from_secs(3)).unwrap();
    let started = Instant::now();
    let err = producer
        .enqueue_to(&unique("spine.down"), &TestJob::ok("a", 1))
        .await
        .expect_err("no broker, no acknowledgement");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(err, Error::Delivery { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("127.0.0.1:1") && text.contains("could not deliver"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_fails_clearly_when_the_registry_is_down() {
    init_logging();
    let live = ensure_stack();
    let config = KafkaConfig::new(
        live.bootstrap_servers.clone(),
        "http://127.0.0.1:1/apis/ccompat/v7",
    );
    let w = Worker::builder(config, unique("g"))
        .handle_on("whatever", |_j: TestJob, _c: JobContext| async { Ok(()) })
        .build()
        .unwrap();
    let started = Instant::now();
    let err = w
        .run_until(std::future::pending())
        .await
        .expect_err("registry down");
    assert!(started.elapsed() < Duration::from_secs(15));
    assert!(matches!(err, Error::Registry { .. }), "{err:?}");
    assert!(err.to_string().contains("127.0.0.1:1"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_refuses_to_start_on_a_missing_topic() {
    init_logging();
    let config = ensure_stack();
    let missing = unique("spine.missing");
    let w = Worker::builder(config, unique("g"))
        .handle_on(&missing, |_j: TestJob, _c: JobContext| async { Ok(()) })
        .build()
        .unwrap();
    let err = w
        .run_until(std::future::pending())
        .await
        .expect_err("missing topic");
    assert!(
        matches!(&err, Error::MissingTopic { topic, .. } if *topic == missing),
        "{err:?}"
    );
}

/// The development setting: a missing main topic is created with the
/// partition count asked for, and the worker then handles what is
/// enqueued on it. (Without the setting, the test above: a refusal.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_development_worker_creates_its_missing_main_topic() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("spine.devtopic");
    let w = Worker::builder(config.clone(), unique("g"))
        .handle_on(&topic, |_j: TestJob, _c: JobContext| async { Ok(()) })
        .create_main_topics(2)
        .build()
        .unwrap();
    let running = start(w);
    let stats = running.stats.clone();
    eventually(Duration::from_secs(60), "the main topic exists", || {
        kjob::topics::partition_counts(&config, std::slice::from_ref(&topic))
            .is_ok_and(|c| c[0].is_some())
    })
    .await;
    assert_eq!(
        kjob::topics::partition_counts(&config, std::slice::from_ref(&topic)).unwrap(),
        vec![Some(2)],
        "created with the partition count asked for"
    );
    Producer::new(&config)
        .unwrap()
        .enqueue_to(&topic, &TestJob::ok("k", 1))
        .await
        .unwrap();
    eventually(Duration::from_secs(60), "the job handled", || {
        kjob::WorkerStats::get(&stats.handled) == 1
    })
    .await;
    running.stop().await;
    let zero = Worker::builder(config, unique("g"))
        .handle_on(&topic, |_j: TestJob, _c: JobContext| async { Ok(()) })
        .create_main_topics(0)
        .build();
    assert!(
        matches!(&zero, Err(Error::InvalidSetting { name, .. }) if name == "create_main_topics"),
        "0 partitions refused"
    );
}

#[test]
fn test_job_name_is_stable() {
    assert_eq!(TestJob::NAME, "kjob.test.job");
}
