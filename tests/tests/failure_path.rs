//! The failure path against the real stack: retry tiers with due times,
//! forward-then-commit, DLQ routing per error class, and an outage.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kjob::headers::{self, JobHeaders};
use kjob::retry::RetryPolicy;
use kjob::{JobContext, JobError, KafkaConfig, Producer, Worker, WorkerStats};
use kjob_integration_tests::*;
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer as _, ThreadedProducer};
use rdkafka::ClientConfig;

/// One handler call: seq, attempt, wall time (ms), due time of the retry.
#[derive(Clone, Debug)]
struct Call {
    seq: i64,
    attempt: u32,
    at_ms: i64,
    due_ms: Option<i64>,
}

type Calls = Arc<Mutex<Vec<Call>>>;

fn now_ms() -> i64 {
    kjob::dlq::now_ms()
}

/// A handler acting out `behaviour`; `down` simulates an outage.
fn handler(
    calls: Calls,
    down: Arc<AtomicBool>,
) -> impl Fn(TestJob, JobContext) -> futures::future::BoxFuture<'static, Result<(), JobError>>
       + Send
       + Sync
       + 'static {
    move |job: TestJob, ctx: JobContext| {
        let calls = calls.clone();
        let down = down.clone();
        Box::pin(async move {
            calls.lock().unwrap().push(Call {
                seq: job.seq,
                attempt: ctx.attempt,
                at_ms: now_ms(),
                due_ms: ctx.due_at_ms,
            });
            match job.behaviour.as_str() {
                "always-503" => Err(JobError::server("503 from test downstream")),
                "permanent" => Err(JobError::not_found("test: gone")),
                "panic" => panic!("test: handler bug"),
                "429-first" if ctx.attempt == 1 => {
                    Err(JobError::retry_after(Duration::from_secs(3), "429"))
                }
                "hang-first" if ctx.attempt == 1 => {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    Ok(())
                }
                _ if down.load(Ordering::SeqCst) => Err(JobError::server("outage: 503")),
                _ => Ok(()),
            }
        })
    }
}

async fn setup(partitions: i32) -> (KafkaConfig, String, String, Producer) {
    init_logging();
    let config = ensure_stack();
    let topic = unique("fail");
    let group = unique("g");
    create_topic(&config, &topic, partitions).await;
    let producer = Producer::new(&config).unwrap();
    (config, topic, group, producer)
}

/// Records in a topic; 0 while it does not exist yet.
fn total_records(config: &KafkaConfig, topic: &str, partitions: i32) -> i64 {
    try_end_offsets(config, topic, partitions).map_or(0, |e| e.iter().sum())
}

fn header_of(m: &rdkafka::message::OwnedMessage, name: &str) -> Option<String> {
    headers::find(m.headers(), name).map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_failures_walk_the_tiers_on_time_then_dead_letter() {
    let (config, topic, group, producer) = setup(2).await;
    for i in 0..6 {
        producer
            .enqueue_to(&topic, &TestJob::with(format!("k{i}"), i, "always-503"))
            .await
            .unwrap();
    }
    let calls: Calls = Default::default();
    let policy = RetryPolicy::tiers([Duration::from_secs(1), Duration::from_secs(2)]).jitter(0.2);
    let w = Worker::builder(config.clone(), &group)
        .handle_on(&topic, handler(calls.clone(), Default::default()))
        .retry(policy.clone())
        .build()
        .unwrap();
    let running = start(w);
    eventually(Duration::from_secs(40), "all six dead-lettered", || {
        WorkerStats::get(&running.stats.dead_lettered) == 6
    })
    .await;
    running.stop().await;

    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 18, "three attempts per job: {calls:?}");
    let mut lateness = Vec::new();
    for seq in 0..6 {
        let mut mine: Vec<&Call> = calls.iter().filter(|c| c.seq == seq).collect();
        mine.sort_by_key(|c| c.attempt);
        assert_eq!(
            mine.iter().map(|c| c.attempt).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        for (i, tier) in [(1usize, 1000i64), (2, 2000)] {
            let due = mine[i].due_ms.expect("a retry carries its due time");
            let waited = mine[i].at_ms - mine[i - 1].at_ms;
            assert!(
                waited >= tier,
                "attempt {} ran {waited} ms after the previous, tier is {tier} ms",
                i + 1
            );
            assert!(
                mine[i].at_ms >= due,
                "fired before due: {} < {due}",
                mine[i].at_ms
            );
            lateness.push(mine[i].at_ms - due);
        }
    }
    lateness.sort();
    let worst = *lateness.last().unwrap();
    println!(
        "retry lateness ms: p50 {} max {worst}",
        lateness[lateness.len() / 2]
    );
    assert!(
        worst <= 1500,
        "a retry fired {worst} ms after its due time (bound 1500 ms)"
    );

    // Each tier saw each job exactly once; the DLQ has all six, classified.
    for t in policy.tier_topics(&topic) {
        assert_eq!(total_records(&config, &t, 2), 6, "{t}");
    }
    let dlq = read_all(&config, &format!("{topic}.dlq"));
    assert_eq!(dlq.len(), 6);
    for m in &dlq {
        let h = JobHeaders::parse(m.headers());
        assert_eq!(h.error_class.as_deref(), Some("retries_exhausted"));
        assert_eq!(h.attempt, Some(3));
        assert_eq!(h.original_topic.as_deref(), Some(topic.as_str()));
        assert!(h.first_failed_at_ms.is_some());
        assert!(h.error.as_deref().unwrap_or("").contains("503"));
        assert!(h.due_at_ms.is_none(), "a dead letter is not scheduled");
        // Rebuilt, not appended: one header of each kind.
        let owned = m.headers().unwrap();
        use rdkafka::message::Headers;
        for name in [
            headers::ATTEMPT,
            headers::ERROR_CLASS,
            headers::ORIGINAL_TOPIC,
            headers::ID,
        ] {
            assert_eq!(owned.iter().filter(|x| x.key == name).count(), 1, "{name}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_panic_retry_after_and_timeout_route_as_classified() {
    let (config, topic, group, producer) = setup(1).await;
    producer
        .enqueue_to(&topic, &TestJob::with("p", 1, "permanent"))
        .await
        .unwrap();
    producer
        .enqueue_to(&topic, &TestJob::with("b", 2, "panic"))
        .await
        .unwrap();
    producer
        .enqueue_to(&topic, &TestJob::with("r", 3, "429-first"))
        .await
        .unwrap();
    producer
        .enqueue_to(&topic, &TestJob::with("h", 4, "hang-first"))
        .await
        .unwrap();
    producer
        .enqueue_to(&topic, &TestJob::ok("o", 5))
        .await
        .unwrap();
    let calls: Calls = Default::default();
    let policy = RetryPolicy::tiers([Duration::from_secs(1), Duration::from_secs(5)]).jitter(0.0);
    let w = Worker::builder(config.clone(), &group)
        .handle_on(&topic, handler(calls.clone(), Default::default()))
        .retry(policy.clone())
        .handler_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let running = start(w);
    eventually(
        Duration::from_secs(30),
        "retry-after and timeout jobs handled",
        || {
            let c = calls.lock().unwrap();
            c.iter().any(|c| c.seq == 3 && c.attempt == 2)
                && c.iter().any(|c| c.seq == 4 && c.attempt == 2)
        },
    )
    .await;
    let stats = running.stats.clone();
    running.stop().await;
    assert_eq!(
        WorkerStats::get(&stats.panicked),
        1,
        "the panic is counted and the worker kept going"
    );
    assert_eq!(WorkerStats::get(&stats.dead_lettered), 2);

    let calls = calls.lock().unwrap().clone();
    let of = |seq: i64| {
        calls
            .iter()
            .filter(|c| c.seq == seq)
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(of(1).len(), 1, "permanent: one attempt, no retry");
    assert_eq!(of(2).len(), 1, "panic: one attempt, no retry");
    let r = of(3);
    assert!(
        r[1].at_ms - r[0].at_ms >= 3000,
        "Retry-After 3 s honoured, waited {} ms",
        r[1].at_ms - r[0].at_ms
    );
    let h = of(4);
    assert_eq!(h.len(), 2, "timed out once, then retried");

    let dlq = read_all(&config, &format!("{topic}.dlq"));
    // Different keys run in parallel, so the DLQ order is not fixed.
    let mut classes: Vec<String> = dlq
        .iter()
        .filter_map(|m| header_of(m, headers::ERROR_CLASS))
        .collect();
    classes.sort();
    assert_eq!(
        classes,
        vec!["bug.panic".to_string(), "permanent.not_found".to_string()]
    );
    // Retry-After 3 s went to the first tier long enough (5 s), the timeout to tier 1 s.
    let five = read_all(&config, &format!("{topic}.retry.5s"));
    let one = read_all(&config, &format!("{topic}.retry.1s"));
    assert_eq!(five.len(), 1);
    assert_eq!(
        header_of(&five[0], headers::ERROR_CLASS).as_deref(),
        Some("retry_after")
    );
    assert_eq!(one.len(), 1);
    assert_eq!(
        header_of(&one[0], headers::ERROR_CLASS).as_deref(),
        Some("retryable.timeout")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_tier_of_not_yet_due_jobs_does_not_slow_the_main_topic() {
    let (config, topic, group, producer) = setup(3).await;
    let (quiet_topic, quiet_group) = (unique("fail.quiet"), unique("g"));
    create_topic(&config, &quiet_topic, 3).await;
    let policy = RetryPolicy::tiers([Duration::from_secs(3600)]);

    // 10 000 jobs parked in the 1 h tier, due in an hour.
    let contract = producer.codec().register::<TestJob>(&topic).await.unwrap();
    let tier = policy.tier_topic(&topic, 0).unwrap();
    create_topic(&config, &tier, 3).await;
    let raw: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &config.bootstrap_servers)
        .set("linger.ms", "20")
        .create()
        .unwrap();
    let due = (now_ms() + 3_600_000).to_string();
    for i in 0..10_000i64 {
        let payload =
            kjob::codec::Codec::encode(&contract, &TestJob::ok(format!("t{i}"), 1_000_000 + i))
                .unwrap();
        let h = OwnedHeaders::new()
            .insert(Header {
                key: headers::DUE_AT,
                value: Some(due.as_str()),
            })
            .insert(Header {
                key: headers::GROUP,
                value: Some(group.as_str()),
            })
            .insert(Header {
                key: headers::ATTEMPT,
                value: Some("2"),
            });
        let key = format!("t{i}");
        let mut rec = BaseRecord::to(&tier).key(&key).payload(&payload).headers(h);
        loop {
            match raw.send(rec) {
                Ok(()) => break,
                Err((_, back)) => {
                    rec = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }
    raw.flush(Duration::from_secs(30)).unwrap();

    let n = 4000;
    let jobs: Vec<TestJob> = (0..n)
        .map(|i| TestJob::ok(format!("m{}", i % 500), i))
        .collect();
    for r in producer.enqueue_batch_to(&topic, &jobs).await {
        r.unwrap();
    }
    for r in producer.enqueue_batch_to(&quiet_topic, &jobs).await {
        r.unwrap();
    }

    async fn rate(
        config: &KafkaConfig,
        topic: &str,
        group: &str,
        n: i64,
        policy: RetryPolicy,
        calls: Calls,
    ) -> f64 {
        let w = Worker::builder(config.clone(), group)
            .handle_on(topic, handler(calls.clone(), Default::default()))
            .retry(policy)
            .build()
            .unwrap();
        // From start to the last job: joining the group costs both runs the
        // same, and a fast run can finish all jobs between two polls of a
        // "first job handled" check, which made a rate from that point
        // meaningless.
        let t0 = Instant::now();
        let running = start(w);
        eventually(Duration::from_secs(120), "all main jobs", || {
            WorkerStats::get(&running.stats.handled) >= n as u64
        })
        .await;
        let r = n as f64 / t0.elapsed().as_secs_f64();
        running.stop().await;
        r
    }
    let calls: Calls = Default::default();
    let empty = rate(
        &config,
        &quiet_topic,
        &quiet_group,
        n,
        policy.clone(),
        Default::default(),
    )
    .await;
    let full = rate(&config, &topic, &group, n, policy, calls.clone()).await;
    let ratio = full / empty;
    println!("main-topic rate: empty tiers {empty:.0}/s, full tier {full:.0}/s, ratio {ratio:.2}");
    assert!(
        ratio >= 0.5,
        "a full tier slowed the main topic: ratio {ratio:.2}"
    );
    assert!(
        calls.lock().unwrap().iter().all(|c| c.seq < 1_000_000),
        "no parked job ran before it was due"
    );
}

fn spawn_worker(
    topic: &str,
    group: &str,
    record: &std::path::Path,
    commit_ms: u64,
) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_test-worker"))
        .env("KJOB_TEST_TOPIC", topic)
        .env("KJOB_TEST_GROUP", group)
        .env("KJOB_TEST_RECORD", record)
        .env("KJOB_TEST_COMMIT_MS", commit_ms.to_string())
        .env("KJOB_TEST_TIERS_MS", "3000")
        .spawn()
        .expect("spawning test-worker")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_between_forward_and_commit_duplicates_at_most_once_and_loses_nothing() {
    let (config, topic, group, producer) = setup(1).await;
    producer
        .enqueue_to(&topic, &TestJob::with("k", 7, "fail-first"))
        .await
        .unwrap();
    let tier = format!("{topic}.retry.3s");
    let dir = std::env::temp_dir().join(unique("kjob-fwd"));
    std::fs::create_dir_all(&dir).unwrap();
    let record = dir.join("record");

    // Commits effectively never happen in the first process.
    let mut first = spawn_worker(&topic, &group, &record, 600_000);
    eventually(
        Duration::from_secs(60),
        "retry forwarded and acknowledged",
        || total_records(&config, &tier, 1) >= 1,
    )
    .await;
    first.kill().expect("SIGKILL");
    first.wait().unwrap();
    assert_eq!(
        committed_offsets(&config, &group, &topic, 1)[0],
        None,
        "killed before any commit"
    );
    assert!(
        read_lines(&record).iter().all(|l| !l.starts_with("done")),
        "the retry had not run yet"
    );

    let mut second = spawn_worker(&topic, &group, &record, 200);
    eventually(Duration::from_secs(60), "the job is handled", || {
        read_lines(&record).iter().any(|l| l == "done 7")
    })
    .await;
    wait_until_committed(&config, &group, &topic, 1).await;
    wait_until_committed(&config, &group, &tier, 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    second.kill().unwrap();
    second.wait().unwrap();
    let done = read_lines(&record)
        .iter()
        .filter(|l| *l == "done 7")
        .count();
    assert!(
        (1..=2).contains(&done),
        "handled {done} times: at least once, at most once more"
    );
    assert!(
        total_records(&config, &tier, 1) <= 2,
        "at most one duplicate forward"
    );
}

async fn wait_until_committed(config: &KafkaConfig, group: &str, topic: &str, partitions: i32) {
    let ends = end_offsets(config, topic, partitions);
    eventually(Duration::from_secs(30), "committed == end", || {
        committed_offsets(config, group, topic, partitions)
            .iter()
            .zip(&ends)
            .all(|(c, e)| *e == 0 || *c == Some(*e))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_then_recovery_loses_nothing_and_retry_traffic_stays_bounded() {
    let (config, topic, group, producer) = setup(3).await;
    let n = 300i64;
    let jobs: Vec<TestJob> = (0..n).map(|i| TestJob::ok(format!("k{i}"), i)).collect();
    let down = Arc::new(AtomicBool::new(true));
    let calls: Calls = Default::default();
    let policy = RetryPolicy::tiers([
        Duration::from_secs(1),
        Duration::from_secs(2),
        Duration::from_secs(4),
    ]);
    let w = Worker::builder(config.clone(), &group)
        .handle_on(&topic, handler(calls.clone(), down.clone()))
        .retry(policy.clone())
        .build()
        .unwrap();
    let running = start(w);
    for r in producer.enqueue_batch_to(&topic, &jobs).await {
        r.unwrap();
    }
    // The downstream is down for ~4 s: first attempts and the first tier fail.
    tokio::time::sleep(Duration::from_secs(4)).await;
    down.store(false, Ordering::SeqCst);
    let stats = running.stats.clone();
    eventually(
        Duration::from_secs(60),
        "every job handled or dead-lettered",
        || WorkerStats::get(&stats.handled) + WorkerStats::get(&stats.dead_lettered) >= n as u64,
    )
    .await;
    wait_until_committed(&config, &group, &topic, 3).await;
    running.stop().await;

    let calls = calls.lock().unwrap().clone();
    let mut per_job: HashMap<i64, u32> = HashMap::new();
    for c in &calls {
        *per_job.entry(c.seq).or_default() += 1;
    }
    assert_eq!(per_job.len(), n as usize, "every job was attempted");
    assert!(
        per_job.values().all(|a| *a <= policy.max_attempts),
        "attempts bounded by the policy"
    );
    let handled = WorkerStats::get(&stats.handled);
    let dead = WorkerStats::get(&stats.dead_lettered);
    assert_eq!(
        handled + dead,
        n as u64,
        "each job ended exactly once (handled {handled}, dlq {dead})"
    );
    assert!(handled > 0, "the recovery was used");
    let retry_traffic: i64 = policy
        .tier_topics(&topic)
        .iter()
        .map(|t| total_records(&config, t, 3))
        .sum();
    assert!(
        retry_traffic <= n * (policy.max_attempts as i64 - 1),
        "retry records {retry_traffic}"
    );
    let failed = AtomicU64::new(0);
    calls.iter().filter(|c| c.attempt > 1).for_each(|_| {
        failed.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(
        failed.load(Ordering::Relaxed) as i64,
        retry_traffic,
        "every retry record ran exactly once"
    );
}
