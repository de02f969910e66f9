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
