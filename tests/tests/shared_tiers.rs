//! Shared retry tiers (`WorkerBuilder::shared_retry_tiers`) against the real
//! stack: two routes with different retry policies retry through one set of
//! `<group>.retry.<delay>` topics, across a SIGKILL of the worker.

use std::collections::{HashMap, HashSet};
use std::process::{Child, Command};
use std::time::Duration;

use kjob::Producer;
use kjob_integration_tests::*;

fn spawn_worker(
    main: &str,
    second: &str,
    group: &str,
    record: &std::path::Path,
    effects: &str,
) -> Child {
    Command::new(env!("CARGO_BIN_EXE_test-worker"))
        .env("KJOB_TEST_EFFECTS", effects)
        .env("KJOB_DATABASE_URL", ensure_postgres())
        .env("KJOB_TEST_TOPIC", main)
        .env("KJOB_TEST_GROUP", group)
        .env("KJOB_TEST_RECORD", record)
        .env("KJOB_TEST_SHARED_TIERS", "1")
        .env("KJOB_TEST_TIERS_MS", "1000")
        .env("KJOB_TEST_SECOND_TOPIC", second)
        .env("KJOB_TEST_SECOND_TIERS_MS", "1000,2000")
        .env("KJOB_TEST_DELAY_MS", "5")
        .env("KJOB_TEST_CONCURRENCY", "16")
        .env("KJOB_INSTANCE_ID", "shared-0")
        .spawn()
        .expect("test-worker runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_routes_retry_through_shared_tiers_across_a_sigkill() {
    init_logging();
    let config = ensure_stack();
    let (mail, crm) = (unique("shared.mail"), unique("shared.crm"));
    let group = unique("gshared");
    create_topic(&config, &mail, 2).await;
    create_topic(&config, &crm, 3).await;
    let producer = Producer::new(&config).expect("producer");
    // mail fails each job once (one hop through the 1 s tier); crm twice
    // (the 1 s tier, then the 2 s tier only its policy has).
    let n = 150;
    let mail_seqs: Vec<i64> = (0..n).collect();
    let crm_seqs: Vec<i64> = (10_000..10_000 + n).collect();
    let record = std::env::temp_dir().join(unique("shared-record"));
    let (db, effects) = effects_table("shared_effects").await;
    let mut first = spawn_worker(&mail, &crm, &group, &record, &effects);
    for (topic, seqs, behaviour) in [
        (&mail, &mail_seqs, "fail-first"),
        (&crm, &crm_seqs, "fail-twice"),
    ] {
        for seq in seqs {
            producer
                .enqueue_to(
                    topic,
                    &TestJob::with(format!("k{}", seq % 20), *seq, behaviour),
                )
                .await
                .expect("enqueue");
        }
    }
    let done = |lines: &[String]| lines.iter().filter(|l| l.starts_with("done ")).count();
    eventually(Duration::from_secs(90), "a third done", || {
        done(&read_lines(&record)) >= (2 * n as usize) / 3
    })
    .await;
    first.kill().expect("SIGKILL");
    let _ = first.wait();
    let mut second = spawn_worker(&mail, &crm, &group, &record, &effects);
    let all: HashSet<i64> = mail_seqs.iter().chain(&crm_seqs).copied().collect();
    eventually(Duration::from_secs(120), "every job done", || {
        let finished: HashSet<i64> = read_lines(&record)
            .iter()
            .filter_map(|l| l.strip_prefix("done "))
            .filter_map(|s| s.parse().ok())
            .collect();
        finished == all
    })
    .await;
    let (t1, t2) = (format!("{group}.retry.1s"), format!("{group}.retry.2s"));
    wait_committed_at_end(&config, &group, &mail, 2).await;
    wait_committed_at_end(&config, &group, &crm, 3).await;
    wait_committed_at_end(&config, &group, &t1, 3).await;
    wait_committed_at_end(&config, &group, &t2, 3).await;
    let _ = second.kill();
    let _ = second.wait();

    // The layout: the shared tiers exist with the larger route's partition
    // count; neither route has tiers of its own.
    let counts = kjob::topics::partition_counts(
        &config,
        &[
            t1.clone(),
            t2.clone(),
            format!("{mail}.retry.1s"),
            format!("{crm}.retry.1s"),
            format!("{crm}.retry.2s"),
        ],
    )
    .expect("metadata");
    assert_eq!(
        counts,
        vec![Some(3), Some(3), None, None, None],
        "{counts:?}"
    );
    // Every record in a shared tier names its route.
    let mut routes: HashMap<String, usize> = HashMap::new();
    for r in read_all(&config, &t1)
        .iter()
        .chain(read_all(&config, &t2).iter())
    {
        let route =
            kjob::headers::find(rdkafka::message::Message::headers(r), kjob::headers::ROUTE)
                .unwrap_or("none")
                .to_string();
        *routes.entry(route).or_default() += 1;
    }
    assert_eq!(
        routes.keys().filter(|r| **r != mail && **r != crm).count(),
        0,
        "{routes:?}"
    );
    assert!(
        routes.get(&mail).copied().unwrap_or(0) >= n as usize,
        "{routes:?}"
    );
    assert!(
        routes.get(&crm).copied().unwrap_or(0) >= 2 * n as usize,
        "{routes:?}"
    );
    assert!(
        read_all(&config, &t2).iter().all(|r| {
            kjob::headers::find(rdkafka::message::Message::headers(r), kjob::headers::ROUTE)
                == Some(crm.as_str())
        }),
        "only crm's policy has a 2 s tier"
    );

    // Each job's effect, once.
    let (rows, distinct) = effects_once(&db, &effects).await;
    let lines = read_lines(&record);
    let failed = lines.iter().filter(|l| l.starts_with("failed ")).count();
    println!(
        "{} jobs, {failed} planned failures, {rows} effects; tier records by route {routes:?}",
        all.len()
    );
    assert_eq!(rows, all.len() as i64, "every job's effect, once");
    assert_eq!(distinct, rows, "no effect twice");
}

/// A worker whose handler fails every job as invalid input while `broken`.
fn breakable(
    config: &kjob::KafkaConfig,
    topic: &str,
    group: &str,
    broken: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handled: std::sync::Arc<std::sync::Mutex<Vec<(i64, String)>>>,
) -> Running {
    let w = kjob::Worker::builder(config.clone(), group)
        .handle_on(topic, move |job: TestJob, ctx: kjob::JobContext| {
            let (broken, handled) = (broken.clone(), handled.clone());
            async move {
                if broken.load(std::sync::atomic::Ordering::SeqCst) {
                    return Err(kjob::JobError::invalid_input("bad deploy"));
                }
                handled
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((job.seq, ctx.topic.to_string()));
                Ok(())
            }
        })
        .retry(kjob::retry::RetryPolicy::tiers([Duration::from_secs(1)]))
        .shared_retry_tiers()
        .dlq_partitions(1)
        .build()
        .expect("worker builds");
    start(w)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_see_redrive_and_plan_the_shared_tiers() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    init_logging();
    let config = ensure_stack();
    let exe = env!("CARGO_BIN_EXE_kjob-cli");
    let topic = unique("shared.ops");
    let group = unique("gsharedops");
    let tier = format!("{group}.retry.1s");
    create_topic(&config, &topic, 2).await;
    let producer = Producer::new(&config).expect("producer");
    for i in 0..4 {
        producer
            .enqueue_to(&topic, &TestJob::ok(format!("k{i}"), i))
            .await
            .expect("enqueue");
    }
    let broken = Arc::new(AtomicBool::new(true));
    let handled: Arc<Mutex<Vec<(i64, String)>>> = Default::default();
    let w = breakable(&config, &topic, &group, broken.clone(), handled.clone());
    eventually(Duration::from_secs(30), "four dead letters", || {
        kjob::WorkerStats::get(&w.stats.dead_lettered) == 4
    })
    .await;
    w.stop().await;
    let counts = kjob::topics::partition_counts(&config, &[format!("{topic}.dlq"), tier.clone()])
        .expect("metadata");
    assert_eq!(
        counts,
        vec![Some(1), Some(2)],
        "a DLQ of its own size, the tier the main's"
    );

    // status names the group's shared tier, with the route's own topics.
    let status: serde_json::Value = serde_json::from_str(&kjob_ok(
        exe,
        &config,
        &["status", "--topic", &topic, "--group", &group, "--json"],
    ))
    .expect("status --json");
    let roles: Vec<(String, String)> = status["topics"]
        .as_array()
        .expect("topics")
        .iter()
        .map(|t| {
            (
                t["topic"].as_str().unwrap_or("").to_string(),
                t["role"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert!(
        roles.contains(&(tier.clone(), "shared retry tier".to_string())),
        "{roles:?}"
    );

    // A re-drive goes to the shared tier, naming the route; the fixed
    // worker handles every job from there.
    broken.store(false, Ordering::SeqCst);
    let w = breakable(&config, &topic, &group, broken.clone(), handled.clone());
    let done = kjob_ok(
        exe,
        &config,
        &["dlq", "retry", "--topic", &topic, "--execute"],
    );
    assert!(
        done.contains(&format!("re-drove 4 record(s) to `{tier}`")),
        "{done}"
    );
    eventually(Duration::from_secs(30), "re-driven jobs handled", || {
        handled.lock().map(|h| h.len() == 4).unwrap_or(false)
    })
    .await;
    w.stop().await;
    let from: Vec<String> = handled
        .lock()
        .expect("lock")
        .iter()
        .map(|(_, t)| t.clone())
        .collect();
    assert!(from.iter().all(|t| *t == tier), "{from:?}");

    // The plan: the route's main, its 1-partition DLQ and one shared tier,
    // sized like the main topic.
    let plan: serde_json::Value = serde_json::from_str(&kjob_ok(
        exe,
        &config,
        &[
            "topics",
            "plan",
            "--topic",
            &topic,
            "--tiers",
            "1s",
            "--shared-tiers",
            "--group",
            &group,
            "--json",
        ],
    ))
    .expect("plan --json");
    assert_eq!(plan["after"]["partitions"], 2 + 1 + 2, "{plan}");
    let shared: Vec<&serde_json::Value> = plan["topics"]
        .as_array()
        .expect("topics")
        .iter()
        .filter(|t| t["role"] == "shared_retry_tier")
        .collect();
    assert_eq!(shared.len(), 1, "{plan}");
    assert_eq!(shared[0]["topic"], tier.as_str());
    assert_eq!(shared[0]["action"], "keep", "{plan}");

    // With shared delay buckets of 1 partition: seven more to create.
    let plan: serde_json::Value = serde_json::from_str(&kjob_ok(
        exe,
        &config,
        &[
            "topics",
            "plan",
            "--topic",
            &topic,
            "--tiers",
            "1s",
            "--delays-on",
            &topic,
            "--shared-tiers",
            "--shared-delays",
            "--shared-partitions",
            "1",
            "--group",
            &group,
            "--json",
        ],
    ))
    .expect("plan --json");
    let buckets: Vec<&serde_json::Value> = plan["topics"]
        .as_array()
        .expect("topics")
        .iter()
        .filter(|t| t["role"] == "shared_delay")
        .collect();
    assert_eq!(buckets.len(), 7, "{plan}");
    assert!(
        buckets.iter().all(|b| b["action"] == "create"
            && b["topic"]
                .as_str()
                .is_some_and(|t| t.starts_with(&format!("{group}.delay.")))),
        "{plan}"
    );
    assert_eq!(plan["after"]["partitions"], 2 + 1 + 2 + 7, "{plan}");
}

/// A worker of `topic` whose handler fails `fail-first` jobs once and
/// `fail-twice` jobs twice, recording `(seq, topic, attempt)` of each
/// success; its retries wait 3 s.
fn flaky(
    config: &kjob::KafkaConfig,
    topic: &str,
    group: &str,
    shared: bool,
    handled: std::sync::Arc<std::sync::Mutex<Vec<(i64, String, u32)>>>,
) -> Running {
    let mut b = kjob::Worker::builder(config.clone(), group)
        .handle_on(topic, move |job: TestJob, ctx: kjob::JobContext| {
            let handled = handled.clone();
            async move {
                let fails = if job.behaviour == "fail-twice" { 2 } else { 1 };
                if ctx.attempt <= fails {
                    return Err(kjob::JobError::server("planned"));
                }
                handled.lock().unwrap_or_else(|p| p.into_inner()).push((
                    job.seq,
                    ctx.topic.to_string(),
                    ctx.attempt,
                ));
                Ok(())
            }
        })
        .retry(kjob::retry::RetryPolicy::tiers([Duration::from_secs(3)]).max_attempts(4));
    if shared {
        b = b.shared_retry_tiers();
    }
    start(b.build().expect("worker builds"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_to_shared_tiers_runs_what_waits_in_the_routes_own_tiers() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("shared.upgrade");
    let group = unique("gupgrade");
    let (own, shared) = (format!("{topic}.retry.3s"), format!("{group}.retry.3s"));
    create_topic(&config, &topic, 2).await;
    let producer = Producer::new(&config).expect("producer");
    for seq in 0..30 {
        let behaviour = if seq < 20 { "fail-first" } else { "fail-twice" };
        producer
            .enqueue_to(&topic, &TestJob::with(format!("k{seq}"), seq, behaviour))
            .await
            .expect("enqueue");
    }
    // The per-route layout: every job fails into the route's own tier, and
    // the worker stops before any is due.
    let handled: std::sync::Arc<std::sync::Mutex<Vec<(i64, String, u32)>>> = Default::default();
    let old = flaky(&config, &topic, &group, false, handled.clone());
    eventually(
        Duration::from_secs(30),
        "30 jobs in the route's own tier",
        || kjob::WorkerStats::get(&old.stats.retried) >= 30,
    )
    .await;
    old.stop().await;
    assert!(handled.lock().expect("lock").is_empty(), "none was due yet");
    let parked: i64 = end_offsets(&config, &own, 2).iter().sum();
    assert_eq!(parked, 30);

    // The upgrade: the new worker shares its tiers, and still runs what
    // waits in the old one; what fails again goes to the shared tier.
    let new = flaky(&config, &topic, &group, true, handled.clone());
    eventually(Duration::from_secs(60), "every job handled", || {
        handled.lock().map(|h| h.len() >= 30).unwrap_or(false)
    })
    .await;
    wait_committed_at_end(&config, &group, &own, 2).await;
    new.stop().await;
    let mut got = handled.lock().expect("lock").clone();
    got.sort();
    let seqs: Vec<i64> = got.iter().map(|(s, _, _)| *s).collect();
    assert_eq!(
        seqs,
        (0..30).collect::<Vec<i64>>(),
        "each job once: {got:?}"
    );
    for (seq, from, attempt) in &got {
        let (want_topic, want_attempt) = if *seq < 20 { (&own, 2) } else { (&shared, 3) };
        assert_eq!(
            (from, *attempt),
            (want_topic, want_attempt),
            "seq {seq}: {got:?}"
        );
    }
}

/// `ran <seq> <at> <due>` lines: each run of a job, when it ran and when
/// it was due (epoch ms).
fn runs(record: &std::path::Path) -> HashMap<i64, Vec<(i64, i64)>> {
    let mut m: HashMap<i64, Vec<(i64, i64)>> = HashMap::new();
    for line in read_lines(record) {
        let nums: Vec<i64> = line
            .strip_prefix("ran ")
            .map(|r| r.split(' ').filter_map(|x| x.parse().ok()).collect())
            .unwrap_or_default();
        if let [seq, at, due] = nums[..] {
            m.entry(seq).or_default().push((at, due));
        }
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_routes_delay_and_retry_through_shared_buckets_across_a_sigkill() {
    init_logging();
    let config = ensure_stack();
    let (mail, crm) = (unique("sharedd.mail"), unique("sharedd.crm"));
    let group = unique("gsharedd");
    create_topic(&config, &mail, 2).await;
    create_topic(&config, &crm, 3).await;
    let record = std::env::temp_dir().join(unique("sharedd-record"));
    let (db, effects) = effects_table("sharedd_effects").await;
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_test-worker"))
            .env("KJOB_TEST_EFFECTS", &effects)
            .env("KJOB_DATABASE_URL", ensure_postgres())
            .env("KJOB_TEST_TOPIC", &mail)
            .env("KJOB_TEST_GROUP", &group)
            .env("KJOB_TEST_RECORD", &record)
            .env("KJOB_TEST_SHARED_TIERS", "1")
            .env("KJOB_TEST_SHARED_DELAYS", "1")
            .env("KJOB_TEST_DELAYED", "1")
            .env("KJOB_TEST_TIERS_MS", "1000")
            .env("KJOB_TEST_SECOND_TOPIC", &crm)
            .env("KJOB_TEST_SECOND_TIERS_MS", "1000")
            .env("KJOB_TEST_CONCURRENCY", "64")
            .env("KJOB_INSTANCE_ID", "sharedd-0")
            .spawn()
            .expect("test-worker runs")
    };
    let mut first = spawn();
    let buckets = kjob::delay::delay_topics(&group);
    wait_topics_exist(&config, &buckets, "the group's shared delay buckets").await;
    // The producer writes where the workers read: the group's buckets.
    let producer = Producer::new(&config)
        .expect("producer")
        .shared_delay_buckets(&group);
    // 150 jobs per route, due 0.2-12 s from now; every fifth fails once
    // (its retry goes through the shared 1 s tier).
    let n = 150i64;
    let mut earliest: HashMap<i64, i64> = HashMap::new();
    let before = kjob::dlq::now_ms();
    for (topic, base) in [(&mail, 0), (&crm, 10_000)] {
        for i in 0..n {
            let seq = base + i;
            let delay = Duration::from_millis(200 + (i as u64 * 7_919) % 11_800);
            let behaviour = if i % 5 == 0 { "fail-first" } else { "ok" };
            let e = producer
                .enqueue_in_to(
                    topic,
                    &TestJob::with(format!("k{}", i % 20), seq, behaviour),
                    delay,
                )
                .await
                .expect("delayed enqueue");
            assert!(
                e.topic == *topic || e.topic.starts_with(&format!("{group}.delay.")),
                "{e:?}"
            );
            earliest.insert(seq, before + delay.as_millis() as i64);
        }
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    first.kill().expect("SIGKILL");
    let _ = first.wait();
    let mut second = spawn();
    eventually(Duration::from_secs(120), "every delayed job done", || {
        let finished: HashSet<i64> = read_lines(&record)
            .iter()
            .filter_map(|l| l.strip_prefix("done "))
            .filter_map(|s| s.parse().ok())
            .collect();
        earliest.keys().all(|s| finished.contains(s))
    })
    .await;
    let _ = second.kill();
    let _ = second.wait();

    let ran = runs(&record);
    let mut late = Vec::new();
    for (seq, floor) in &earliest {
        let r = ran.get(seq).expect("every job ran");
        for (at, due) in r {
            assert!(at >= due, "job {seq} ran {} ms early", due - at);
        }
        assert!(r[0].0 >= *floor, "job {seq} ran before its delay");
        late.push(r[0].0 - floor);
    }
    late.sort_unstable();
    println!(
        "{} delayed jobs through shared buckets across a SIGKILL: lateness p50 {} ms, max {} ms",
        late.len(),
        late[late.len() / 2],
        late[late.len() - 1]
    );
    // Neither route has delay topics of its own; every record in the
    // shared buckets names one of the two routes.
    let own: Vec<String> = kjob::delay::delay_topics(&mail)
        .into_iter()
        .chain(kjob::delay::delay_topics(&crm))
        .collect();
    let counts = kjob::topics::partition_counts(&config, &own).expect("metadata");
    assert!(counts.iter().all(Option::is_none), "{counts:?}");
    let mut routes: HashMap<String, usize> = HashMap::new();
    for t in &buckets {
        for r in read_all(&config, t) {
            let route =
                kjob::headers::find(rdkafka::message::Message::headers(&r), kjob::headers::ROUTE)
                    .unwrap_or("none")
                    .to_string();
            *routes.entry(route).or_default() += 1;
        }
    }
    assert!(routes.keys().all(|r| *r == mail || *r == crm), "{routes:?}");
    assert!(
        routes.contains_key(&mail) && routes.contains_key(&crm),
        "{routes:?}"
    );
    let (rows, distinct) = effects_once(&db, &effects).await;
    println!("bucket records by route {routes:?}; {rows} effects");
    assert_eq!(rows, earliest.len() as i64, "every job's effect, once");
    assert_eq!(distinct, rows, "no effect twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_to_shared_delay_buckets_runs_what_waits_in_the_routes_own() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("sharedd.upgrade");
    let group = unique("gupgraded");
    create_topic(&config, &topic, 2).await;
    // The per-route layout: jobs parked in the route's own delay topics
    // (created as its worker would), by a producer not told of sharing.
    let own = kjob::delay::delay_topics(&topic);
    let parts: Vec<(String, i32)> = own.iter().map(|t| (t.clone(), 2)).collect();
    kjob::topics::create_topics_with(&config, &parts, &[("retention.ms", "604800000")])
        .await
        .expect("own delay topics");
    kjob::topics::wait_visible(&config, &own)
        .await
        .expect("visible");
    let producer = Producer::new(&config).expect("producer");
    let before = kjob::dlq::now_ms();
    for seq in 0..20i64 {
        producer
            .enqueue_in_to(
                &topic,
                &TestJob::ok(format!("k{seq}"), seq),
                Duration::from_secs(15),
            )
            .await
            .expect("delayed enqueue");
    }
    // The upgraded worker shares its buckets, and still serves the old.
    let handled: std::sync::Arc<std::sync::Mutex<Vec<(i64, String, i64)>>> = Default::default();
    let h = handled.clone();
    let worker = kjob::Worker::builder(config.clone(), &group)
        .handle_on(&topic, move |job: TestJob, ctx: kjob::JobContext| {
            let h = h.clone();
            async move {
                h.lock()
                    .expect("lock")
                    .push((job.seq, ctx.topic.to_string(), kjob::dlq::now_ms()));
                Ok::<(), kjob::JobError>(())
            }
        })
        .delayed_jobs_on(&topic)
        .shared_retry_tiers_with(kjob::SharedTiers::new().delay_buckets())
        .build()
        .expect("worker builds");
    let running = start(worker);
    eventually(Duration::from_secs(60), "every parked job handled", || {
        handled.lock().map(|h| h.len() >= 20).unwrap_or(false)
    })
    .await;
    running.stop().await;
    let mut got = handled.lock().expect("lock").clone();
    got.sort();
    assert_eq!(
        got.iter().map(|(s, _, _)| *s).collect::<Vec<i64>>(),
        (0..20).collect::<Vec<i64>>(),
        "each once: {got:?}"
    );
    for (seq, from, at) in &got {
        assert!(*at >= before + 15_000, "job {seq} ran early");
        assert!(
            from.starts_with(&format!("{group}.delay.")),
            "job {seq} hopped on into the shared buckets, ran from {from}"
        );
    }
}

/// When something happened (epoch ms), shared with the handlers.
type Times = std::sync::Arc<std::sync::Mutex<Vec<(i64, i64)>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_one_routes_retries_in_a_shared_tier_does_not_queue_another_routes_behind_it() {
    const BULK: i64 = 1_000;
    const URGENT: i64 = 10;
    init_logging();
    let config = ensure_stack();
    let (bulk, urgent) = (unique("flood.bulk"), unique("flood.urgent"));
    let group = unique("gflood");
    create_topic(&config, &bulk, 1).await;
    create_topic(&config, &urgent, 1).await;
    let producer = Producer::new(&config).expect("producer");
    // (start, end) of each bulk retry; (due, start) of each urgent one.
    let (bulk_runs, urgent_runs): (Times, Times) = Default::default();
    let (b, u) = (bulk_runs.clone(), urgent_runs.clone());
    // Every job fails once into the one shared 5 s tier (one partition, so
    // bulk's retries sit ahead of urgent's in the log). A bulk retry takes
    // 300 ms, so its 1 000 retries keep the worker's 32 slots busy for
    // about 9 s, past urgent's retries' due time.
    let worker = kjob::Worker::builder(config.clone(), &group)
        .handle_on(&bulk, move |_job: TestJob, ctx: kjob::JobContext| {
            let b = b.clone();
            async move {
                if ctx.attempt == 1 {
                    return Err(kjob::JobError::server("planned"));
                }
                let start = kjob::dlq::now_ms();
                tokio::time::sleep(Duration::from_millis(300)).await;
                let end = kjob::dlq::now_ms();
                b.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((start, end));
                Ok(())
            }
        })
        .handle_on(&urgent, move |_job: TestJob, ctx: kjob::JobContext| {
            let u = u.clone();
            async move {
                if ctx.attempt == 1 {
                    return Err(kjob::JobError::server("planned"));
                }
                let due = ctx.due_at_ms.unwrap_or(0);
                u.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((due, kjob::dlq::now_ms()));
                Ok(())
            }
        })
        // No jitter: a jittered record ahead in the tier may be due later
        // than urgent's and hold it (up to the jitter's spread); that is
        // the tier's order, not the worker's, and not what this measures.
        .retry(
            kjob::retry::RetryPolicy::tiers([Duration::from_secs(5)])
                .max_attempts(3)
                .jitter(0.0),
        )
        .shared_retry_tiers_with(kjob::SharedTiers::new().partitions(1))
        .concurrency(32)
        .build()
        .expect("worker builds");
    let running = start(worker);
    // Enqueued at once, not one acknowledgement at a time: sent one by
    // one on a loaded machine, the first attempts (and so the retries'
    // due times) spread over seconds, the worker keeps up with them, and
    // no flood is left when urgent's retries come due.
    let jobs: Vec<TestJob> = (0..BULK)
        .map(|seq| TestJob::with(format!("b{seq}"), seq, "ok"))
        .collect();
    for r in producer.enqueue_batch_to(&bulk, &jobs).await {
        r.expect("enqueue acknowledged");
    }
    eventually(
        Duration::from_secs(60),
        "bulk's first attempts all failed into the shared tier",
        || kjob::WorkerStats::get(&running.stats.retried) >= BULK as u64,
    )
    .await;
    for seq in 0..URGENT {
        producer
            .enqueue_to(&urgent, &TestJob::with(format!("u{seq}"), seq, "ok"))
            .await
            .expect("enqueue");
    }
    let len = |t: &Times| t.lock().map(|v| v.len()).unwrap_or(0);
    eventually(Duration::from_secs(60), "urgent's retries handled", || {
        len(&urgent_runs) == URGENT as usize
    })
    .await;
    eventually(Duration::from_secs(60), "the flood drained", || {
        len(&bulk_runs) == BULK as usize
    })
    .await;
    let (bulk_runs, urgent_runs) = (
        bulk_runs.lock().expect("lock").clone(),
        urgent_runs.lock().expect("lock").clone(),
    );
    // Bulk retries started while each urgent retry was due but waiting.
    let overtaken: Vec<usize> = urgent_runs
        .iter()
        .map(|(due, start)| {
            bulk_runs
                .iter()
                .filter(|(s, _)| s > due && s < start)
                .count()
        })
        .collect();
    let still_due = |at: i64| bulk_runs.iter().filter(|(s, _)| *s > at).count();
    let left: Vec<usize> = urgent_runs.iter().map(|(due, _)| still_due(*due)).collect();
    let late: Vec<i64> = urgent_runs.iter().map(|(due, start)| start - due).collect();
    eprintln!("bulk retries started while urgent's waited: {overtaken:?}; bulk retries still to start then: {left:?}; urgent's lateness (ms): {late:?}");
    // The flood outlasted urgent's due time, so the test means something.
    assert!(
        left.iter().all(|n| *n > 100),
        "bulk's flood was over before urgent's retries were due: {left:?}"
    );
    // First-in first-out, every bulk retry ahead in the tier starts first
    // (several hundred). Taking turns, an urgent retry waits for a free
    // slot: a few bulk starts, or, when it comes due as a wave of 32 bulk
    // retries ends, at most that wave's refill and a few more (32 in two
    // of three runs, 33 in one, with lateness of about one bulk retry's
    // 300 ms).
    assert!(
        overtaken.iter().all(|n| *n <= 48),
        "urgent's due retries waited behind bulk's: {overtaken:?} bulk retries started ahead of them"
    );
    // At most about one bulk retry's 300 ms late; behind the flood it
    // would be seconds.
    assert!(
        late.iter().all(|ms| *ms < 1_000),
        "urgent's retries ran late: {late:?} ms"
    );
    wait_committed_at_end(&config, &group, &format!("{group}.retry.5s"), 1).await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_counts_each_routes_part_of_a_shared_tier() {
    init_logging();
    let config = ensure_stack();
    let exe = env!("CARGO_BIN_EXE_kjob-cli");
    let (mail, crm) = (unique("share.mail"), unique("share.crm"));
    let group = unique("gshare");
    let tier = format!("{group}.retry.30s");
    create_topic(&config, &mail, 2).await;
    create_topic(&config, &crm, 2).await;
    let producer = Producer::new(&config).expect("producer");
    for (topic, n) in [(&mail, 3), (&crm, 5)] {
        for seq in 0..n {
            producer
                .enqueue_to(topic, &TestJob::ok(format!("k{seq}"), seq))
                .await
                .expect("enqueue");
        }
    }
    // Every first attempt fails into the shared 30 s tier; the worker
    // stops before any is due, so all 8 wait there uncommitted.
    let fail = |_job: TestJob, _ctx: kjob::JobContext| async {
        Err::<(), _>(kjob::JobError::server("planned"))
    };
    let w = start(
        kjob::Worker::builder(config.clone(), &group)
            .handle_on(&mail, fail)
            .handle_on(&crm, fail)
            .retry(kjob::retry::RetryPolicy::tiers([Duration::from_secs(30)]).max_attempts(2))
            .shared_retry_tiers()
            .build()
            .expect("worker builds"),
    );
    eventually(Duration::from_secs(30), "8 jobs in the shared tier", || {
        kjob::WorkerStats::get(&w.stats.retried) >= 8
    })
    .await;
    w.stop().await;
    for (topic, mine) in [(&mail, 3), (&crm, 5)] {
        let status: serde_json::Value = serde_json::from_str(&kjob_ok(
            exe,
            &config,
            &["status", "--topic", topic, "--group", &group, "--json"],
        ))
        .expect("status --json");
        let row = status["topics"]
            .as_array()
            .expect("topics")
            .iter()
            .find(|t| t["topic"] == tier.as_str())
            .cloned()
            .unwrap_or_default();
        assert_eq!(row["lag"], 8, "the tier's lag is both routes': {row}");
        assert_eq!(
            (
                &row["route_waiting"]["jobs"],
                &row["route_waiting"]["exact"]
            ),
            (&serde_json::json!(mine), &serde_json::json!(true)),
            "{topic}'s part: {row}"
        );
        let table = kjob_ok(
            exe,
            &config,
            &["status", "--topic", topic, "--group", &group],
        );
        assert!(table.contains(&format!("8 ({mine} this route)")), "{table}");
    }
}
