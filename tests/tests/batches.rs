//! Batches against the real stack: exact counts with dead letters and a
//! re-drive, a batch across two routes, exactly one callback under
//! SIGKILLs of workers and of the batch's coordinator, cancellation, and
//! the bad inputs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kjob::batch::{state_topic, BatchReport, When};
use kjob::retry::RetryPolicy;
use kjob::{Error, JobContext, JobError, KafkaConfig, Producer, Worker};
use kjob_integration_tests::*;
use rdkafka::message::Message;

const KJOB: &str = env!("CARGO_BIN_EXE_kjob-cli");

type Reports = Arc<Mutex<Vec<(String, BatchReport)>>>;

/// A worker on `routes` (jobs fail as invalid input while `broken` is set
/// and their behaviour is `breakable`) and on the callback topic, whose
/// reports go to `reports`.
fn worker(
    config: &KafkaConfig,
    group: &str,
    batches: &str,
    routes: &[&str],
    callbacks: &str,
    broken: Arc<AtomicBool>,
    reports: Reports,
) -> Worker {
    let mut b = Worker::builder(config.clone(), group)
        .metrics_endpoint("127.0.0.1:0".parse().unwrap())
        .batches_on(batches)
        .batch_callback::<TestJob>()
        .retry(RetryPolicy::tiers([Duration::from_secs(1)]));
    for r in routes {
        let broken = broken.clone();
        b = b.handle_on(r, move |job: TestJob, _ctx: JobContext| {
            let broken = broken.clone();
            async move {
                if job.behaviour == "breakable" && broken.load(Ordering::SeqCst) {
                    return Err(JobError::invalid_input("test: broken until fixed"));
                }
                Ok(())
            }
        });
    }
    b.handle_on(callbacks, move |_job: TestJob, ctx: JobContext| {
        let reports = reports.clone();
        async move {
            let r = ctx
                .batch_report
                .ok_or_else(|| JobError::invalid_input("no report"))?;
            reports.lock().unwrap().push((ctx.id.to_string(), r));
            Ok(())
        }
    })
    .build()
    .expect("worker builds")
}

/// [`worker`] on `s`'s topics, started, once its batch topics exist.
async fn serve(s: &Setup, routes: &[&str], broken: Arc<AtomicBool>, reports: Reports) -> Running {
    let w = worker(
        &s.config,
        &s.group,
        &s.batches,
        routes,
        &s.callbacks,
        broken,
        reports,
    );
    let running = start(w);
    wait_topics_exist(
        &s.config,
        &[s.batches.clone(), state_topic(&s.batches)],
        "the batch topics",
    )
    .await;
    running
}

struct Setup {
    config: KafkaConfig,
    batches: String,
    a: String,
    b: String,
    callbacks: String,
    group: String,
    producer: Producer,
}

async fn setup() -> Setup {
    init_logging();
    let config = ensure_stack();
    let (a, b, callbacks) = (unique("batch.a"), unique("batch.b"), unique("batch.cb"));
    create_topic(&config, &a, 3).await;
    create_topic(&config, &b, 2).await;
    create_topic(&config, &callbacks, 1).await;
    Setup {
        producer: Producer::new(&config).unwrap(),
        batches: unique("batches"),
        group: unique("g"),
        config,
        a,
        b,
        callbacks,
    }
}

fn reports_of(reports: &Reports, id: &str) -> Vec<BatchReport> {
    reports
        .lock()
        .unwrap()
        .iter()
        .filter(|(i, _)| i == id)
        .map(|(_, r)| r.clone())
        .collect()
}

/// `kjob batches show --json`; `Null` until the batch's first snapshot.
fn try_show(config: &KafkaConfig, topic: &str, batch: &str) -> serde_json::Value {
    let o = run_kjob(
        KJOB,
        config,
        &[
            "batches", "show", "--topic", topic, "--batch", batch, "--json",
        ],
    );
    serde_json::from_str(&o.stdout).unwrap_or(serde_json::Value::Null)
}

fn show(config: &KafkaConfig, topic: &str, batch: &str) -> serde_json::Value {
    let out = kjob_ok(
        KJOB,
        config,
        &[
            "batches", "show", "--topic", topic, "--batch", batch, "--json",
        ],
    );
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_across_two_routes_counts_dead_letters_and_a_redrive_and_fires_once() {
    let s = setup().await;
    let (broken, reports) = (Arc::new(AtomicBool::new(true)), Reports::default());
    let running = serve(&s, &[&s.a, &s.b], broken.clone(), reports.clone()).await;

    let id = unique("newsletter");
    let batch = s
        .producer
        .batch(&id)
        .unwrap()
        .topic(&s.batches)
        .callback_to(When::Complete, &s.callbacks, TestJob::ok("report", 1))
        .callback_to(When::Success, &s.callbacks, TestJob::ok("report", 2));
    for i in 0..10 {
        let behaviour = if i < 3 { "breakable" } else { "ok" };
        batch
            .enqueue_to(&s.a, &TestJob::with(format!("k{i}"), i, behaviour))
            .await
            .unwrap();
        batch
            .enqueue_to(&s.b, &TestJob::ok(format!("k{i}"), 100 + i))
            .await
            .unwrap();
    }
    batch.seal().await.unwrap();
    let complete = kjob::batch::callback_id(&id, When::Complete);
    let success = kjob::batch::callback_id(&id, When::Success);
    eventually(Duration::from_secs(60), "the complete callback", || {
        !reports_of(&reports, &complete).is_empty()
    })
    .await;
    assert_eq!(
        reports_of(&reports, &complete),
        [BatchReport {
            batch: id.clone(),
            total: 20,
            succeeded: 17,
            dead_lettered: 3
        }]
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        reports_of(&reports, &success).is_empty(),
        "success waits while 3 are dead-lettered"
    );
    let v = show(&s.config, &s.batches, &id);
    assert_eq!(v["status"], "complete", "{v}");
    assert_eq!(
        (v["succeeded"].as_u64(), v["dead_lettered"].as_u64()),
        (Some(17), Some(3)),
        "{v}"
    );

    // Fixed: re-drive one, and it counts as a success after the callback.
    broken.store(false, Ordering::SeqCst);
    let dlq = kjob::topics::dlq_topic(&s.a);
    let letters: Vec<String> = kjob::topics::read_topic(&s.config, &dlq)
        .unwrap()
        .unwrap()
        .iter()
        .map(|m| format!("{}:{}", m.partition(), m.offset()))
        .collect();
    assert_eq!(letters.len(), 3, "{letters:?}");
    kjob_ok(
        KJOB,
        &s.config,
        &["dlq", "retry", "--topic", &s.a, &letters[0], "--execute"],
    );
    let others = &letters[1..];
    eventually(Duration::from_secs(30), "the re-driven job counted", || {
        show(&s.config, &s.batches, &id)["succeeded"] == 18
    })
    .await;
    assert!(
        reports_of(&reports, &success).is_empty(),
        "2 still dead-lettered"
    );
    // The other two: now nothing is dead-lettered, and success fires.
    let mut args = vec!["dlq", "retry", "--topic", s.a.as_str()];
    args.extend(others.iter().map(String::as_str));
    args.push("--execute");
    kjob_ok(KJOB, &s.config, &args);
    eventually(Duration::from_secs(30), "the success callback", || {
        !reports_of(&reports, &success).is_empty()
    })
    .await;
    assert_eq!(
        reports_of(&reports, &success),
        [BatchReport {
            batch: id.clone(),
            total: 20,
            succeeded: 20,
            dead_lettered: 0
        }]
    );
    assert_eq!(
        reports_of(&reports, &complete).len(),
        1,
        "complete fired once"
    );
    // The snapshot follows within half a second.
    eventually(Duration::from_secs(10), "the snapshot", || {
        show(&s.config, &s.batches, &id)["succeeded"] == 20
    })
    .await;
    let v = show(&s.config, &s.batches, &id);
    assert_eq!(
        (v["succeeded"].as_u64(), v["dead_lettered"].as_u64()),
        (Some(20), Some(0)),
        "{v}"
    );
    let list = kjob_ok(KJOB, &s.config, &["batches", "list", "--topic", &s.batches]);
    assert!(
        list.contains(&id) && list.contains("20/20") && list.contains("complete"),
        "{list}"
    );
    running.stop().await;
}

#[derive(serde::Serialize, serde::Deserialize, kjob::Job)]
#[job(name = "kjob.test.batch_noroute", version = 1, key = id)]
struct NoRoute {
    id: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_batch_fires_at_its_seal_and_bad_input_is_refused() {
    let s = setup().await;
    let reports = Reports::default();
    let w = worker(
        &s.config,
        &s.group,
        &s.batches,
        &[&s.a],
        &s.callbacks,
        Default::default(),
        reports.clone(),
    );
    // A callback type no route of the worker handles fails build().
    let e = Worker::builder(s.config.clone(), &s.group)
        .handle_on(&s.a, |_: TestJob, _: JobContext| async {
            Ok::<(), JobError>(())
        })
        .batches_on(&s.batches)
        .batch_callback::<NoRoute>()
        .build()
        .err()
        .expect("build refuses");
    assert!(e.to_string().contains("kjob.test.batch_noroute"), "{e}");
    // Ids.
    for bad in ["", &"x".repeat(201)] {
        let e = s.producer.batch(bad).expect_err("refused");
        assert!(matches!(e, Error::Batch { .. }), "{e}");
    }
    // No batch topic yet: the first enqueue says what creates it.
    let missing = s
        .producer
        .batch("early")
        .unwrap()
        .topic(&unique("nobatches"));
    let e = missing
        .enqueue_to(&s.a, &TestJob::ok("k", 1))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("does not exist") && e.contains("WorkerBuilder::batches()"),
        "{e}"
    );

    let running = start(w);
    wait_topics_exist(
        &s.config,
        &[s.batches.clone(), state_topic(&s.batches)],
        "the batch topics",
    )
    .await;
    let id = unique("empty");
    let empty = s
        .producer
        .batch(&id)
        .unwrap()
        .topic(&s.batches)
        .callback_to(When::Complete, &s.callbacks, TestJob::ok("report", 1));
    empty.seal().await.unwrap();
    let e = empty
        .enqueue_to(&s.a, &TestJob::ok("k", 1))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("sealed"), "{e}");
    let cb = kjob::batch::callback_id(&id, When::Complete);
    eventually(
        Duration::from_secs(30),
        "the empty batch's callback",
        || !reports_of(&reports, &cb).is_empty(),
    )
    .await;
    assert_eq!(
        reports_of(&reports, &cb),
        [BatchReport {
            batch: id.clone(),
            total: 0,
            succeeded: 0,
            dead_lettered: 0
        }]
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_batch_fires_no_callback_and_keeps_its_finished_jobs() {
    let s = setup().await;
    let reports = Reports::default();
    let running = serve(&s, &[&s.a], Default::default(), reports.clone()).await;
    let id = unique("stuck");
    let batch = s
        .producer
        .batch(&id)
        .unwrap()
        .topic(&s.batches)
        .on_complete(TestJob::ok("report", 1));
    for i in 0..3 {
        batch
            .enqueue_to(&s.a, &TestJob::ok(format!("k{i}"), i))
            .await
            .unwrap();
    }
    batch.flush().await.unwrap();
    eventually(
        Duration::from_secs(30),
        "three finished, not sealed",
        || {
            let v = try_show(&s.config, &s.batches, &id);
            v["finished"] == 3 && v["status"] == "open"
        },
    )
    .await;
    // The open batch shows on /metrics, with its age.
    let addr = *running.stats.endpoint.get().expect("metrics endpoint");
    let gauge = |text: &str, name: &str| -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(name) && l.contains(&s.group))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(gauge(&text, "kjob_batches_open{"), Some(1.0), "{text}");
    assert!(
        gauge(&text, "kjob_batch_oldest_open_seconds{").is_some_and(|a| a > 0.0),
        "{text}"
    );
    let cancel = [
        "batches",
        "cancel",
        "--topic",
        &s.batches,
        "--batch",
        &id,
        "--reason",
        "never sealed",
    ];
    let dry = kjob_ok(KJOB, &s.config, &cancel);
    assert!(
        dry.contains("dry run") && dry.contains("--execute"),
        "{dry}"
    );
    assert_eq!(show(&s.config, &s.batches, &id)["status"], "open");
    let mut exec = cancel.to_vec();
    exec.push("--execute");
    let done = kjob_ok(KJOB, &s.config, &exec);
    assert!(done.contains("cancelled batch"), "{done}");
    eventually(Duration::from_secs(30), "cancelled", || {
        show(&s.config, &s.batches, &id)["status"] == "cancelled"
    })
    .await;
    let v = show(&s.config, &s.batches, &id);
    assert_eq!(v["cancelled"]["by"], "ops-tester", "{v}");
    assert_eq!(v["cancelled"]["reason"], "never sealed", "{v}");
    assert_eq!(v["succeeded"], 3, "finished jobs stay finished: {v}");
    // Sealing it now fires nothing; a second cancel is refused.
    batch.seal().await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        reports.lock().unwrap().is_empty(),
        "no callback for a cancelled batch"
    );
    let again = run_kjob(KJOB, &s.config, &exec);
    assert_ne!(again.code, 0, "{}{}", again.stdout, again.stderr);
    assert!(again.stderr.contains("cancelled"), "{}", again.stderr);
    let unknown = run_kjob(
        KJOB,
        &s.config,
        &["batches", "show", "--topic", &s.batches, "--batch", "nope"],
    );
    assert_ne!(unknown.code, 0);
    assert!(
        unknown.stderr.contains("no batch `nope`"),
        "{}",
        unknown.stderr
    );
    running.stop().await;
}

fn spawn(s: &Setup, record: &std::path::Path) -> std::process::Child {
    spawn_with(s, record, &[])
}

fn spawn_with(s: &Setup, record: &std::path::Path, env: &[(&str, &str)]) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_test-worker"))
        .envs(env.iter().copied())
        .env("KJOB_TEST_TOPIC", &s.a)
        .env("KJOB_TEST_GROUP", &s.group)
        .env("KJOB_TEST_RECORD", record)
        .env("KJOB_TEST_DELAY_MS", "5")
        .env("KJOB_TEST_CONCURRENCY", "4")
        .env("KJOB_TEST_BATCHES", &s.batches)
        .env("KJOB_TEST_CALLBACK_TOPIC", &s.callbacks)
        .spawn()
        .expect("spawning test-worker")
}

/// The pid of the process whose coordinator owns `batch`'s partition of the
/// batch topic, once its first snapshot names the partition.
async fn coordinator_of(s: &Setup, batch: &str) -> u32 {
    let partition = {
        let mut p = None;
        eventually(
            Duration::from_secs(30),
            "the batch's first snapshot",
            || {
                p = try_show(&s.config, &s.batches, batch)["partition"].as_i64();
                p.is_some()
            },
        )
        .await;
        p.unwrap_or_default() as i32
    };
    let group = kjob::batch::coordinator_group(&s.batches);
    let owner_pid = || -> Option<u32> {
        let groups = kjob_ops::groups::describe_groups(&s.config, Some(&group)).ok()?;
        let member = groups.iter().flat_map(|g| g.members.iter()).find(|m| {
            m.assignment
                .iter()
                .any(|(t, ps)| *t == s.batches && ps.contains(&partition))
        })?;
        member.client_id.rsplit('-').next()?.parse().ok()
    };
    let mut coordinator = None;
    eventually(Duration::from_secs(30), "the batch's coordinator", || {
        coordinator = owner_pid();
        coordinator.is_some()
    })
    .await;
    coordinator.unwrap_or_default()
}

/// The batch coordinator joins its group with the worker's settings (one
/// consumer factory): at kjob's defaults, a SIGKILLed coordinator's
/// partitions move after the worker's 10 s session, not librdkafka's 45 s,
/// so the callback follows the batch's last job (or the kill, whichever is
/// later) within the session + 2 s. Before, 33-45 s (benches/RESULTS.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_coordinator_s_callback_fires_within_the_worker_s_session() {
    let (_, late_ms) = killed_coordinator(false).await;
    assert!(
        late_ms <= 12_000,
        "the callback came {late_ms} ms after the later of the kill and the last job; \
         the worker's session is 10 s"
    );
}

/// With a static-member id (`KJOB_INSTANCE_ID`, as a StatefulSet gives
/// it), the coordinator restarted 1 s after its SIGKILL takes its batch
/// partitions (and its worker its job partitions) straight back: the
/// callback comes within 5 s of the kill, where the session (10 s) decides
/// it without the id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_static_coordinator_s_callback_fires_within_seconds() {
    let (since_kill_ms, _) = killed_coordinator(true).await;
    assert!(
        since_kill_ms <= 5_000,
        "the callback came {since_kill_ms} ms after the kill; a static member restarted 1 s \
         after it should have its partitions back at once (without the id: the 10 s session)"
    );
}

/// Runs a 1 500-job batch on two worker processes, SIGKILLs the one whose
/// coordinator owns the batch and starts a replacement (with
/// `static_members`, the same instance id 1 s after the kill; without, a
/// new member at once). Checks exact counts and one callback; answers how
/// long (ms) after the kill, and after the later of the kill and the last
/// job, the callback came.
async fn killed_coordinator(static_members: bool) -> (i64, i64) {
    let s = setup().await;
    let dir = std::env::temp_dir().join(unique("kjob-batch-session"));
    std::fs::create_dir_all(&dir).unwrap();
    let record = dir.join("record");
    let env = [
        ("KJOB_TEST_KJOB_SESSION", "1"),
        ("KJOB_TEST_TIMES", "1"),
        ("KJOB_TEST_DELAY_MS", "20"),
        ("KJOB_TEST_CONCURRENCY", "16"),
    ];
    let ids = [format!("{}-a", s.group), format!("{}-b", s.group)];
    let spawn = |i: usize| {
        let mut env = env.to_vec();
        if static_members {
            env.push(("KJOB_INSTANCE_ID", ids[i].as_str()));
        }
        spawn_with(&s, &record, &env)
    };
    let mut workers = vec![(0, spawn(0)), (1, spawn(1))];
    wait_topics_exist(
        &s.config,
        &[s.batches.clone(), state_topic(&s.batches)],
        "the batch topics",
    )
    .await;
    let group = kjob::batch::coordinator_group(&s.batches);
    eventually(
        Duration::from_secs(60),
        "both coordinators hold partitions",
        || {
            kjob_ops::groups::describe_groups(&s.config, Some(&group))
                .map(|gs| {
                    gs.iter()
                        .flat_map(|g| g.members.iter())
                        .filter(|m| !m.assignment.is_empty())
                        .count()
                        == 2
                })
                .unwrap_or(false)
        },
    )
    .await;
    let id = unique("session");
    let batch = s
        .producer
        .batch(&id)
        .unwrap()
        .topic(&s.batches)
        .callback_to(When::Complete, &s.callbacks, TestJob::ok("report", 1));
    let n = 1500i64;
    let jobs: Vec<TestJob> = (0..n)
        .map(|i| TestJob::with(format!("k{i}"), i, "ok"))
        .collect();
    futures::future::try_join_all(jobs.iter().map(|j| batch.enqueue_to(&s.a, j)))
        .await
        .unwrap();
    batch.seal().await.unwrap();
    let pid = coordinator_of(&s, &id).await;
    let victim = workers
        .iter()
        .position(|(_, w)| w.id() == pid)
        .expect("the coordinator is one of the two workers");
    let (slot, mut victim) = workers.remove(victim);
    victim.kill().expect("SIGKILL");
    let killed_ms = kjob::clock::now_ms();
    victim.wait().unwrap();
    if static_members {
        // Its supervisor starts it again a second later.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    workers.push((slot, spawn(slot)));
    let at = |prefix: &str| -> Vec<i64> {
        read_lines(&record)
            .iter()
            .filter_map(|l| {
                l.strip_prefix(prefix)?
                    .split_whitespace()
                    .last()?
                    .parse()
                    .ok()
            })
            .collect()
    };
    eventually(Duration::from_secs(120), "the callback", || {
        !at("callbackat ").is_empty()
    })
    .await;
    for (_, mut w) in workers {
        w.kill().unwrap();
        w.wait().unwrap();
    }
    let callback_ms = at("callbackat ")[0];
    let last_ms = at("doneat ").into_iter().max().unwrap_or(killed_ms);
    let from = last_ms.max(killed_ms);
    eprintln!(
        "static members: {static_members}; kill -> callback {} ms, last job -> callback {} ms",
        callback_ms - killed_ms,
        callback_ms - last_ms
    );
    let done: std::collections::HashSet<String> = read_lines(&record)
        .iter()
        .filter_map(|l| l.strip_prefix("done ").map(str::to_string))
        .collect();
    assert_eq!(done.len(), n as usize, "every job ran");
    let want = format!(
        "callback {} {n} {n} 0",
        kjob::batch::callback_id(&id, When::Complete)
    );
    let seen: Vec<String> = read_lines(&record)
        .into_iter()
        .filter(|l| l.starts_with("callback "))
        .collect();
    assert!(
        !seen.is_empty() && seen.iter().all(|l| *l == want),
        "exact counts: {seen:?}, want {want}"
    );
    assert_eq!(
        read_all(&s.config, &s.callbacks).len(),
        1,
        "the callback was written once"
    );
    (callback_ms - killed_ms, callback_ms - from)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_callback_with_exact_counts_under_sigkills_of_workers_and_coordinators() {
    let s = setup().await;
    let dir = std::env::temp_dir().join(unique("kjob-batch-kill"));
    std::fs::create_dir_all(&dir).unwrap();
    let record = dir.join("record");
    let mut workers = vec![spawn(&s, &record), spawn(&s, &record)];
    wait_topics_exist(
        &s.config,
        &[s.batches.clone(), state_topic(&s.batches)],
        "the batch topics",
    )
    .await;
    let id = unique("newsletter");
    let batch = s
        .producer
        .batch(&id)
        .unwrap()
        .topic(&s.batches)
        .callback_to(When::Complete, &s.callbacks, TestJob::ok("report", 1));
    let n = 6000i64;
    let jobs: Vec<TestJob> = (0..n)
        .map(|i| {
            TestJob::with(
                format!("k{}", i % 500),
                i,
                if i % 1000 == 7 { "permanent" } else { "ok" },
            )
        })
        .collect();
    futures::future::try_join_all(jobs.iter().map(|j| batch.enqueue_to(&s.a, j)))
        .await
        .unwrap();
    batch.seal().await.unwrap();
    // The first kill is of the batch's coordinator: the process that owns
    // its partition of the batch topic. Then one of the two every 1.5 s
    // (each coordinates some of the partitions), replaced by a new one.
    let coordinator = Some(coordinator_of(&s, &id).await);
    let first = workers
        .iter()
        .position(|w| Some(w.id()) == coordinator)
        .expect("the coordinator is one of the two workers");
    for k in 0..5 {
        if k > 0 {
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        let finished = read_lines(&record)
            .iter()
            .filter(|l| l.starts_with("done ") || l.starts_with("dead "))
            .count();
        if k < 3 {
            assert!(
                finished < n as usize,
                "kill {k} must land mid-run ({finished} finished)"
            );
        }
        let mut victim = workers.remove(if k == 0 { first } else { k % workers.len() });
        victim.kill().expect("SIGKILL");
        victim.wait().unwrap();
        workers.push(spawn(&s, &record));
    }
    let callbacks = |lines: &[String]| -> Vec<String> {
        lines
            .iter()
            .filter(|l| l.starts_with("callback "))
            .cloned()
            .collect()
    };
    eventually(Duration::from_secs(120), "the callback", || {
        !callbacks(&read_lines(&record)).is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for mut w in workers {
        w.kill().unwrap();
        w.wait().unwrap();
    }
    let lines = read_lines(&record);
    let done: std::collections::HashSet<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("done "))
        .collect();
    let dead: std::collections::HashSet<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("dead "))
        .collect();
    assert_eq!(done.len() + dead.len(), n as usize, "every job ran");
    let want = format!(
        "callback {} {n} {} 6",
        kjob::batch::callback_id(&id, When::Complete),
        n - 6
    );
    let seen = callbacks(&lines);
    assert!(
        seen.iter().all(|l| *l == want),
        "exact counts: {seen:?}, want {want}"
    );
    let written = read_all(&s.config, &s.callbacks);
    assert_eq!(written.len(), 1, "the callback was written once");
}
