//! Delayed jobs against the real stack: `Producer::enqueue_in` through the
//! route's delay topics, served by a worker *process* (so it can be
//! SIGKILLed). Each job must run no earlier than its due time, none may be
//! lost across a kill and restart of the worker, and the lateness is
//! measured and printed (`-- --nocapture`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use kjob::delay::{delay_topics, DelayError};
use kjob::{Error, KafkaConfig, Producer};
use kjob_integration_tests::*;
use rand::Rng;
use rdkafka::Message as _;

const JOBS: i64 = 1_000;

/// One run of a job: when it ran and when it was due (epoch ms).
#[derive(Clone, Copy, Debug)]
struct Ran {
    at: i64,
    due: i64,
}

fn runs(record: &Path) -> HashMap<i64, Vec<Ran>> {
    let mut m: HashMap<i64, Vec<Ran>> = HashMap::new();
    for line in read_lines(record) {
        let mut f = line.split(' ');
        if f.next() != Some("ran") {
            continue;
        }
        let nums: Vec<i64> = f.filter_map(|x| x.parse().ok()).collect();
        if let [seq, at, due] = nums[..] {
            if seq >= 0 {
                m.entry(seq).or_default().push(Ran { at, due });
            }
        }
    }
    m
}

fn spawn_worker(topic: &str, group: &str, record: &Path, instance: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_test-worker"))
        .env("KJOB_TEST_TOPIC", topic)
        .env("KJOB_TEST_GROUP", group)
        .env("KJOB_TEST_RECORD", record)
        .env("KJOB_TEST_DELAYED", "1")
        .env("KJOB_TEST_CONCURRENCY", "256")
        // A restart within the session takes its partitions straight back.
        .env("KJOB_INSTANCE_ID", instance)
        .spawn()
        .expect("test-worker runs")
}

/// Starts a worker and waits until it created the route's delay topics.
async fn setup(partitions: i32) -> (KafkaConfig, String, String, PathBuf, Child) {
    init_logging();
    let config = ensure_stack();
    let topic = unique("delayed");
    let group = unique("g");
    create_topic(&config, &topic, partitions).await;
    let dir = std::env::temp_dir().join(unique("kjob-delayed"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let record = dir.join("record");
    let child = spawn_worker(&topic, &group, &record, &format!("{group}-w"));
    wait_topics_exist(&config, &delay_topics(&topic), "the worker's delay topics").await;
    // Wait until the worker has joined its group and runs jobs (a new
    // group's first join waits group.initial.rebalance.delay.ms, 3 s by
    // default): a probe job on the main topic.
    let producer = Producer::new(&config).expect("producer");
    producer
        .enqueue_to(&topic, &TestJob::ok("probe", -1))
        .await
        .expect("probe enqueued");
    let start = Instant::now();
    while !read_lines(&record).iter().any(|l| l == "done -1") {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the worker never ran the probe job"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (config, topic, group, record, child)
}

/// Enqueues `JOBS` jobs with random delays of 1–20 s; returns, per seq,
/// the earliest time it may run (taken before the call, so the producer's
/// own run time is at or after it).
async fn enqueue_delayed(producer: &Producer, topic: &str) -> HashMap<i64, i64> {
    let mut rng = rand::rng();
    let plan: Vec<(TestJob, Duration)> = (0..JOBS)
        .map(|i| {
            (
                TestJob::ok(format!("k{}", i % 50), i),
                Duration::from_millis(rng.random_range(1_000..=20_000)),
            )
        })
        .collect();
    let before = kjob::dlq::now_ms();
    let results = join_all(
        plan.iter()
            .map(|(job, d)| producer.enqueue_in_to(topic, job, *d)),
    )
    .await;
    for r in results {
        let e = r.expect("delayed enqueue acknowledged");
        // Under 1.25 s (the shortest bucket plus the lead) a job is due too
        // soon for a bucket and waits on the main topic.
        assert!(
            e.topic.starts_with(&format!("{topic}.delay.")) || e.topic == topic,
            "{e:?}"
        );
    }
    plan.iter()
        .map(|(job, d)| (job.seq, before + d.as_millis() as i64))
        .collect()
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// Checks every job ran, none before its time, and returns the sorted
/// lateness (ms) of each job's first run.
fn check(ran: &HashMap<i64, Vec<Ran>>, earliest: &HashMap<i64, i64>) -> Vec<i64> {
    let missing: Vec<&i64> = earliest.keys().filter(|s| !ran.contains_key(s)).collect();
    assert!(missing.is_empty(), "delayed jobs lost: {missing:?}");
    let mut late = Vec::new();
    for (seq, runs) in ran {
        let floor = earliest[seq];
        for r in runs {
            assert!(
                r.due >= floor,
                "job {seq}: due {} before asked {floor}",
                r.due
            );
            assert!(r.at >= r.due, "job {seq} ran {} ms early", r.due - r.at);
        }
        late.push(runs[0].at - runs[0].due);
    }
    late.sort_unstable();
    late
}

fn report(what: &str, late: &[i64]) {
    println!(
        "{what}: {} jobs, lateness p50 {} ms, p99 {} ms, max {} ms",
        late.len(),
        percentile(late, 0.50),
        percentile(late, 0.99),
        late.last().copied().unwrap_or(0)
    );
}

fn stop(mut child: Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

async fn wait_all(record: &Path, n: usize, within: Duration) {
    let start = Instant::now();
    while runs(record).len() < n && start.elapsed() < within {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_jobs_run_no_earlier_than_due() {
    let (config, topic, _group, record, child) = setup(3).await;
    let producer = Producer::new(&config).expect("producer");
    let earliest = enqueue_delayed(&producer, &topic).await;
    wait_all(&record, JOBS as usize, Duration::from_secs(60)).await;
    stop(child);
    let ran = runs(&record);
    let late = check(&ran, &earliest);
    report("delayed jobs, steady worker", &late);
    // The first seconds follow the burst of 1 000 enqueues (every first hop
    // arrives at once); the rest is the steady state.
    let start = earliest.values().min().copied().unwrap_or(0) - 1_000;
    let mut steady: Vec<i64> = ran
        .values()
        .map(|r| r[0])
        .filter(|r| r.due >= start + 4_000)
        .map(|r| r.at - r.due)
        .collect();
    steady.sort_unstable();
    report(
        "  of which due 4 s or more after the enqueue burst",
        &steady,
    );
    let dup = ran.values().filter(|r| r.len() > 1).count();
    assert_eq!(dup, 0, "no worker restart, so no job runs twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_jobs_survive_a_worker_kill() {
    let (config, topic, group, record, mut child) = setup(3).await;
    let producer = Producer::new(&config).expect("producer");
    let earliest = enqueue_delayed(&producer, &topic).await;
    // Mid-run: about half of the jobs are due.
    tokio::time::sleep(Duration::from_secs(9)).await;
    child.kill().expect("SIGKILL the worker");
    let _ = child.wait();
    let killed_at = kjob::dlq::now_ms();
    let child = spawn_worker(&topic, &group, &record, &format!("{group}-w"));
    wait_all(&record, JOBS as usize, Duration::from_secs(90)).await;
    stop(child);
    let ran = runs(&record);
    let late = check(&ran, &earliest);
    report("delayed jobs, worker SIGKILLed and restarted", &late);
    // The jobs due well away from the outage show the precision; the rest
    // waited for the restart.
    let mut away: Vec<i64> = ran
        .values()
        .map(|r| r[0])
        .filter(|r| r.due < killed_at - 1_000 || r.due > killed_at + 10_000)
        .map(|r| r.at - r.due)
        .collect();
    away.sort_unstable();
    report(
        "  of which due >1 s before the kill or >10 s after it",
        &away,
    );
    let twice = ran.values().filter(|r| r.len() > 1).count();
    println!("  run twice after the kill (uncommitted when killed): {twice}");
    // Lateness is bounded by the restart, not carried into later hops: the
    // jobs due once the new worker runs jobs again are on time. (Hops used
    // to be planned from the previous planned release, so catch-up hops
    // written after the restart were due before records already waiting
    // in their bucket: 23-88 jobs per run more than 1 s late, up to 13 s.)
    let back = ran
        .values()
        .flatten()
        .map(|r| r.at)
        .filter(|at| *at > killed_at)
        .min()
        .expect("jobs ran after the restart");
    let mut after: Vec<i64> = ran
        .values()
        .map(|r| r[0])
        .filter(|r| r.due > back + 1_000)
        .map(|r| r.at - r.due)
        .collect();
    after.sort_unstable();
    report(
        "  of which due 1 s or more after the worker was back",
        &after,
    );
    assert!(!after.is_empty());
    let over: Vec<&i64> = after.iter().filter(|l| **l > 500).collect();
    assert!(
        over.len() <= after.len() / 100,
        "at most 1 % of the jobs due after the restart run over 500 ms late: {} of {} (max {:?})",
        over.len(),
        after.len(),
        after.last()
    );
}

/// The premise of a held bucket is that its records are due in write
/// order. A job due at once (a short delay, a time passed) used to go
/// through the 1 s bucket and wait behind a job due later: the second job
/// below ran 738-825 ms late. Now it never enters a bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_due_now_does_not_wait_behind_a_later_one() {
    let (config, topic, _group, record, child) = setup(1).await;
    let producer = Producer::new(&config).expect("producer");
    // Jobs 1 and 2 share a key; 3 and 4 have keys of their own (a job
    // waiting out its run time on the main topic keeps its key's order, so
    // a later job of the same key would wait behind it, as it should).
    let enqueued = |seq: i64, d: Duration| {
        let (p, t) = (producer.clone(), topic.clone());
        let key = if seq <= 2 {
            "same-key".to_string()
        } else {
            format!("k{seq}")
        };
        async move {
            let before = kjob::dlq::now_ms();
            let e = p
                .enqueue_in_to(&t, &TestJob::ok(key, seq), d)
                .await
                .expect("enqueued");
            (seq, before + d.as_millis() as i64, e.topic)
        }
    };
    let mut asked = vec![enqueued(1, Duration::from_millis(1_500)).await];
    tokio::time::sleep(Duration::from_millis(20)).await;
    asked.push(enqueued(2, Duration::ZERO).await);
    asked.push(enqueued(3, Duration::from_millis(300)).await);
    let before = kjob::dlq::now_ms();
    let five_ago = std::time::SystemTime::now() - Duration::from_secs(5);
    let past = producer
        .enqueue_at_to(&topic, &TestJob::ok("k4", 4), five_ago)
        .await
        .expect("enqueued at a time passed");
    // It keeps the time asked in `kjob-run-at`, not the time it was sent.
    let asked_ms = five_ago
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let job4 = read_all(&config, &topic)
        .into_iter()
        .find(|m| m.offset() == past.offset && m.partition() == past.partition)
        .expect("the record of job 4");
    assert_eq!(
        kjob::headers::find(job4.headers(), kjob::headers::RUN_AT),
        Some(asked_ms.to_string().as_str())
    );
    asked.push((4, before, past.topic));
    for (seq, _, t) in &asked {
        if *seq == 1 {
            assert!(t.starts_with(&format!("{topic}.delay.")), "{t}");
        } else {
            assert_eq!(*t, topic, "job {seq} is due too soon for a bucket");
        }
    }
    wait_all(&record, 5, Duration::from_secs(30)).await;
    stop(child);
    let ran = runs(&record);
    for (seq, earliest, _) in &asked {
        let r = ran
            .get(seq)
            .and_then(|r| r.first())
            .unwrap_or_else(|| panic!("job {seq} ran"));
        let late = r.at - earliest;
        println!("job {seq}: ran {late} ms after it was due");
        assert!(late >= 0, "job {seq} ran {} ms early", -late);
        // Behind job 1 in the 1 s bucket it was 738-825 ms late.
        assert!(
            late < 300,
            "job {seq} ran {late} ms late: it waited behind a job due later"
        );
    }
}

/// A producer outside kjob delays a job with `kjob-run-at` on the main
/// topic: a short remainder is waited out there, a longer one goes through
/// the route's delay buckets. Neither runs early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_main_topic_record_with_a_run_time_waits_for_it() {
    let (config, topic, _group, record, child) = setup(1).await;
    let codec = kjob::codec::Codec::from_config(&config).expect("codec");
    let contract = codec
        .register::<TestJob>(&topic)
        .await
        .expect("contract registered");
    let producer = Producer::new(&config).expect("producer");
    let mut asked = Vec::new();
    for (seq, ahead_ms) in [(11i64, 600i64), (12, 3_000)] {
        let payload = kjob::codec::Codec::encode(&contract, &TestJob::ok(format!("f{seq}"), seq))
            .expect("encoded");
        let run_at = kjob::dlq::now_ms() + ahead_ms;
        let headers = rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
            key: kjob::headers::RUN_AT,
            value: Some(run_at.to_string().as_bytes()),
        });
        producer
            .send_raw(&topic, Some(b"foreign"), Some(&payload), headers)
            .await
            .expect("written to the main topic");
        asked.push((seq, run_at));
    }
    wait_all(&record, 2, Duration::from_secs(30)).await;
    stop(child);
    let ran = runs(&record);
    for (seq, run_at) in &asked {
        let r = ran
            .get(seq)
            .and_then(|r| r.first())
            .unwrap_or_else(|| panic!("job {seq} ran"));
        let late = r.at - run_at;
        println!("foreign job {seq}: ran {late} ms after its kjob-run-at");
        assert!(late >= 0, "job {seq} ran {} ms early", -late);
        assert!(late < 1_000, "job {seq} ran {late} ms late");
    }
    // The 3 s one went through a bucket (the 1 s one: 3 s minus the lead).
    let c = config.clone();
    let bucket = kjob::delay::delay_topic(&topic, 0);
    let ends = tokio::task::spawn_blocking(move || try_end_offsets(&c, &bucket, 1))
        .await
        .expect("task");
    assert!(
        ends.is_some_and(|e| e.iter().sum::<i64>() >= 1),
        "the longer delay hopped through the delay buckets"
    );
}

/// Only the routes declared to take delayed jobs get delay topics; a delay
/// on another route is refused naming the setting, and an unknown route
/// in the setting fails the build.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_topics_only_for_the_routes_that_delay() {
    init_logging();
    let config = ensure_stack();
    let (delaying, plain) = (unique("delaying"), unique("plain"));
    create_topic(&config, &delaying, 2).await;
    create_topic(&config, &plain, 2).await;
    async fn ok(_: TestJob, _: kjob::JobContext) -> Result<(), kjob::JobError> {
        Ok(())
    }
    let worker = kjob::Worker::builder(config.clone(), unique("g"))
        .handle_on(&delaying, ok)
        .handle_on(&plain, ok)
        .delayed_jobs_on(&delaying)
        .build()
        .expect("worker builds");
    let running = start(worker);
    wait_topics_exist(
        &config,
        &delay_topics(&delaying),
        "the delaying route's delay topics",
    )
    .await;
    let (c, p) = (config.clone(), delay_topics(&plain));
    let plain_counts = tokio::task::spawn_blocking(move || kjob::topics::partition_counts(&c, &p))
        .await
        .expect("task")
        .expect("metadata");
    assert!(
        plain_counts.iter().all(Option::is_none),
        "no delay topic for a route that does not delay: {plain_counts:?}"
    );
    let producer = Producer::new(&config).expect("producer");
    match producer
        .enqueue_in_to(&plain, &TestJob::ok("k", 1), Duration::from_secs(30))
        .await
    {
        Err(Error::Delay {
            reason: DelayError::NoTopic { .. },
            ..
        }) => {}
        other => panic!("a delay on the plain route is refused: {other:?}"),
    }
    let e = producer
        .enqueue_in_to(&plain, &TestJob::ok("k", 1), Duration::from_secs(30))
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("delayed_jobs_on"), "{e}");
    producer
        .enqueue_in_to(&delaying, &TestJob::ok("k", 2), Duration::from_secs(2))
        .await
        .expect("a delay on the delaying route");
    running.stop().await;
    let unknown = kjob::Worker::builder(config.clone(), unique("g"))
        .handle_on(&plain, ok)
        .delayed_jobs_on("no-such-route")
        .build();
    assert!(
        matches!(
            unknown,
            Err(Error::NoSuchRoute {
                setting: "delayed_jobs_on",
                ..
            })
        ),
        "{:?}",
        unknown.err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delays_are_refused_before_anything_is_written() {
    init_logging();
    let config = ensure_stack();
    let producer = Producer::new(&config).expect("producer");
    let job = TestJob::ok("k", 1);

    // No delay topics at all.
    let bare = unique("delayed-bare");
    create_topic(&config, &bare, 1).await;
    match producer
        .enqueue_in_to(&bare, &job, Duration::from_secs(5))
        .await
    {
        Err(Error::Delay {
            reason: DelayError::NoTopic { topic, .. },
            ..
        }) => assert_eq!(topic, format!("{bare}.delay.1s")),
        other => panic!("expected NoTopic, got {other:?}"),
    }

    // Delay topics that keep records for one hour.
    let short = unique("delayed-short");
    create_topic(&config, &short, 1).await;
    let delays: Vec<(String, i32)> = delay_topics(&short).into_iter().map(|t| (t, 1)).collect();
    kjob::topics::create_topics_with(&config, &delays, &[("retention.ms", "3600000")])
        .await
        .expect("creating delay topics");
    let err = producer
        .enqueue_in_to(&short, &job, Duration::from_secs(2 * 3600))
        .await
        .expect_err("2 h through a 1 h bucket that keeps 1 h is refused");
    let text = err.to_string();
    assert!(
        matches!(
            err,
            Error::Delay {
                reason: DelayError::RetentionTooShort { .. },
                ..
            }
        ),
        "{text}"
    );
    assert!(
        text.contains(&format!("{short}.delay.1h")) && text.contains("retention.ms=7200000"),
        "names the topic and the fix: {text}"
    );
    let err = producer
        .enqueue_in_to(&short, &job, Duration::from_secs(31 * 86_400))
        .await
        .expect_err("31 days is refused");
    assert!(err.to_string().contains("30 days"), "{err}");
    for (t, _) in &delays {
        assert_eq!(
            end_offsets(&config, t, 1),
            vec![0],
            "nothing written to {t}"
        );
    }
    // Ten minutes passes the 10 m bucket and shorter ones: accepted.
    let ok = producer
        .enqueue_in_to(&short, &job, Duration::from_secs(601))
        .await
        .expect("10 min fits");
    assert_eq!(ok.topic, format!("{short}.delay.10m"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_whose_delay_topics_exist_drains_them_though_it_no_longer_delays() {
    init_logging();
    let config = ensure_stack();
    let route = unique("undelayed");
    create_topic(&config, &route, 2).await;
    // An earlier layout gave the route delay topics, and a job waits there.
    let topics: Vec<(String, i32)> = delay_topics(&route).into_iter().map(|t| (t, 2)).collect();
    kjob::topics::create_topics_with(&config, &topics, &[("retention.ms", "604800000")])
        .await
        .expect("delay topics");
    wait_topics_exist(&config, &delay_topics(&route), "the delay topics").await;
    let producer = Producer::new(&config).expect("producer");
    let sent_at = kjob::dlq::now_ms();
    producer
        .enqueue_in_to(&route, &TestJob::ok("k", 7), Duration::from_secs(4))
        .await
        .expect("enqueued into the existing delay topics");
    let ran: Arc<Mutex<Vec<(i64, i64)>>> = Arc::default();
    let log = ran.clone();
    // The new worker does not declare delayed jobs for the route.
    let worker = kjob::Worker::builder(config.clone(), unique("g"))
        .handle_on(&route, move |job: TestJob, _ctx: kjob::JobContext| {
            let log = log.clone();
            async move {
                log.lock().unwrap().push((job.seq, kjob::dlq::now_ms()));
                Ok::<(), kjob::JobError>(())
            }
        })
        .build()
        .expect("worker builds");
    let running = start(worker);
    eventually(Duration::from_secs(30), "the waiting job ran", || {
        !ran.lock().unwrap().is_empty()
    })
    .await;
    running.stop().await;
    let ran = ran.lock().unwrap().clone();
    assert_eq!(ran.len(), 1, "{ran:?}");
    assert!(
        ran[0].1 >= sent_at + 4000,
        "never early: ran {} ms after the enqueue",
        ran[0].1 - sent_at
    );
}
