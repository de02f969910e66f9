//! The deployment model against the real stack: a worker binary prints its
//! model with `KJOB_DESCRIBE=json`, and once it has started, the topics on
//! the broker that belong to it are exactly the model's; `kjob topics
//! list` names each with the model's role, with or without the model file;
//! `kjob acls` prints one grant per topic and group. Plus the book's ACL
//! table, checked against the rules the model's grants come from.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use kjob::deployment::{acls, Deployment};
use kjob::KafkaConfig;
use kjob_integration_tests::*;

const KJOB: &str = env!("CARGO_BIN_EXE_kjob-cli");
const WORKER: &str = env!("CARGO_BIN_EXE_test-worker");

/// The test worker's environment for `topic` and `group`, plus `extra`.
fn command(
    topic: &str,
    group: &str,
    record: &Path,
    extra: &[(&str, &str)],
) -> std::process::Command {
    let mut c = std::process::Command::new(WORKER);
    c.env("KJOB_TEST_TOPIC", topic)
        .env("KJOB_TEST_GROUP", group)
        .env("KJOB_TEST_RECORD", record)
        .envs(extra.iter().copied());
    c
}

/// The model the binary prints with `KJOB_DESCRIBE=json`, without
/// connecting (it returns at once, with status 0).
fn describe(topic: &str, group: &str, record: &Path, extra: &[(&str, &str)]) -> Deployment {
    let out = command(topic, group, record, extra)
        .env("KJOB_DESCRIBE", "json")
        .env("KJOB_BOOTSTRAP_SERVERS", "127.0.0.1:1")
        .output()
        .expect("running test-worker");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let start = stdout.find("{\n").expect("a JSON object on stdout");
    Deployment::from_json(stdout[start..].trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// Every topic on the broker whose name is one of `owners` or starts with
/// `<owner>.`.
fn broker_topics(config: &KafkaConfig, owners: &[&str]) -> BTreeSet<String> {
    kjob::topics::list_topics(config)
        .unwrap()
        .into_iter()
        .filter(|t| {
            owners
                .iter()
                .any(|o| t == o || t.starts_with(&format!("{o}.")))
        })
        .collect()
}

/// Starts the worker, waits until every topic of `model` exists, and
/// checks that nothing else of its names was created; then lists the
/// topics through `kjob topics list` with and without the model, and the
/// grants through `kjob acls`.
async fn provisions_exactly(
    config: &KafkaConfig,
    model: &Deployment,
    owners: &[&str],
    mut worker: std::process::Command,
) {
    let mut child = worker.spawn().expect("spawning test-worker");
    let want: BTreeSet<String> = model.topic_names().into_iter().collect();
    let wanted: Vec<String> = want.iter().cloned().collect();
    wait_topics_exist(config, &wanted, "the model's topics").await;
    // The heartbeat creates the control topic last; give a stray topic
    // time to show.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let on_broker = broker_topics(config, owners);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        on_broker, want,
        "the broker's topics of this worker (left) and its model (right)"
    );
    let dir = std::env::temp_dir().join(unique("kjob-model"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("model.json");
    std::fs::write(&file, model.to_json()).unwrap();
    let file = file.to_string_lossy().to_string();
    for args in [
        vec!["topics", "list", "--json"],
        vec!["topics", "list", "--json", "--model", file.as_str()],
    ] {
        let listed: serde_json::Value =
            serde_json::from_str(&kjob_ok(KJOB, config, &args)).unwrap();
        for t in &model.topics {
            let row = listed["topics"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["topic"] == t.topic.as_str())
                .unwrap_or_else(|| panic!("{args:?} misses {}", t.topic));
            assert_eq!(row["role"], t.role.label(), "{args:?}: {}", t.topic);
            assert_eq!(row["exists"], true, "{args:?}: {}", t.topic);
        }
    }
    let printed = kjob_ok(
        KJOB,
        config,
        &[
            "acls",
            "--model",
            file.as_str(),
            "--principal",
            "User:kjob-worker",
        ],
    );
    let commands: Vec<&str> = printed
        .lines()
        .filter(|l| l.starts_with("kafka-acls "))
        .collect();
    assert_eq!(
        commands.len(),
        model.topics.len() + model.groups.len(),
        "{printed}"
    );
    assert!(
        commands
            .iter()
            .all(|c| c.contains("--allow-principal User:kjob-worker")),
        "{printed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_cron_delays_and_strict_order_create_exactly_the_model() {
    init_logging();
    let config = ensure_stack();
    let (topic, callbacks, batches, group) = (
        unique("model.a"),
        unique("model.cb"),
        unique("model.batches"),
        unique("model-g"),
    );
    create_topic(&config, &topic, 2).await;
    create_topic(&config, &callbacks, 1).await;
    let record = std::env::temp_dir().join(unique("kjob-model-record"));
    let extra = [
        ("KJOB_TEST_STRICT", "1"),
        ("KJOB_TEST_DELAYED", "1"),
        ("KJOB_TEST_SCHEDULE", "nightly=0 0 3 * * *"),
        ("KJOB_TEST_BATCHES", batches.as_str()),
        ("KJOB_TEST_CALLBACK_TOPIC", callbacks.as_str()),
        ("KJOB_TEST_TIERS_MS", "1000,5000"),
    ];
    let model = describe(&topic, &group, &record, &extra);
    assert_eq!(model.group, group);
    assert_eq!(
        model
            .groups
            .iter()
            .map(|g| g.group.clone())
            .collect::<Vec<_>>(),
        vec![group.clone(), kjob::batch::coordinator_group(&batches)]
    );
    // main, 2 tiers, 7 delays, DLQ, order; the callback route's main, tier
    // and DLQ... every one named in the model and nothing else.
    let names = model.topic_names();
    for t in [
        topic.clone(),
        format!("{topic}.retry.1s"),
        format!("{topic}.retry.5s"),
        format!("{topic}.delay.1d"),
        format!("{topic}.dlq"),
        format!("{topic}.order"),
        format!("{callbacks}.dlq"),
        format!("{group}.schedules"),
        format!("{group}.schedules.state"),
        format!("{group}.control"),
        batches.clone(),
        format!("{batches}.state"),
    ] {
        assert!(names.contains(&t), "{t} in {names:?}");
    }
    provisions_exactly(
        &config,
        &model,
        &[&topic, &callbacks, &batches, &group],
        command(&topic, &group, &record, &extra),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fairness_and_shared_tiers_and_buckets_create_exactly_the_model() {
    init_logging();
    let config = ensure_stack();
    let (topic, second, group) = (unique("model.f"), unique("model.s"), unique("model-sh"));
    create_topic(&config, &topic, 2).await;
    create_topic(&config, &second, 3).await;
    let record = std::env::temp_dir().join(unique("kjob-model-record"));
    let extra = [
        ("KJOB_TEST_SHARED_TIERS", "1"),
        ("KJOB_TEST_SHARED_DELAYS", "1"),
        ("KJOB_TEST_SECOND_TOPIC", second.as_str()),
        ("KJOB_TEST_DELAYED", "1"),
    ];
    let model = describe(&topic, &group, &record, &extra);
    let shared = model
        .topic(&format!("{group}.retry.2s"))
        .expect("a shared tier");
    assert_eq!(shared.shared_by, vec![second.clone()], "{model:#?}");
    assert!(model.topic(&format!("{group}.delay.10s")).is_some());
    assert!(model.topic(&format!("{topic}.delay.10s")).is_none());
    provisions_exactly(
        &config,
        &model,
        &[&topic, &second, &group],
        command(&topic, &group, &record, &extra),
    )
    .await;
}

#[test]
fn describe_refuses_a_form_it_does_not_know() {
    let record = std::env::temp_dir().join(unique("kjob-model-record"));
    let out = command("t", "g", &record, &[])
        .env("KJOB_DESCRIBE", "yaml")
        .output()
        .expect("running test-worker");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("KJOB_DESCRIBE") && err.contains("json"),
        "{err}"
    );
}

/// The rows of the table under `## ACLs a worker needs` in the security
/// chapter: (role, operations).
fn book_rows() -> Vec<(String, Vec<String>)> {
    let text = std::fs::read_to_string(repo_root().join("docs/src/security.md")).unwrap();
    let section = text
        .split("## ACLs a worker needs")
        .nth(1)
        .expect("the section")
        .split("\n## ")
        .next()
        .unwrap_or_default();
    section
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| role "))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let ops = cells[3]
                .split(',')
                .map(|o| o.trim().to_string())
                .filter(|o| !o.is_empty())
                .collect();
            (cells[1].to_string(), ops)
        })
        .collect()
}

#[test]
fn the_book_s_acl_table_holds_a_row_for_every_rule_the_model_uses() {
    let rows = book_rows();
    let rules: Vec<(String, Vec<String>)> = acls::rows()
        .iter()
        .map(|r| {
            (
                r.label().to_string(),
                r.operations
                    .iter()
                    .map(|o| o.as_str().to_string())
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        rows, rules,
        "docs/src/security.md's table (left) against kjob::deployment::acls::rows (right)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_delete_takes_a_route_s_or_a_group_s_topics_and_refuses_while_members_live() {
    init_logging();
    let config = ensure_stack();
    let (topic, other, group) = (unique("del.r"), unique("del.keep"), unique("del-g"));
    create_topic(&config, &topic, 2).await;
    create_topic(&config, &other, 1).await;
    let worker = kjob::Worker::builder(config.clone(), &group)
        .handle_on(&topic, |_: TestJob, _: kjob::JobContext| async {
            Ok::<(), kjob::JobError>(())
        })
        .delayed_jobs(true)
        .build()
        .unwrap();
    let model = worker.deployment();
    let running = start(worker);
    wait_topics_exist(&config, &model.topic_names(), "the worker's topics").await;
    let route: BTreeSet<String> = model
        .topics
        .iter()
        .filter(|t| t.route.as_deref() == Some(topic.as_str()))
        .map(|t| t.topic.clone())
        .collect();
    assert_eq!(
        route.len(),
        1 + 4 + 7 + 1,
        "main, 4 tiers, 7 delays, DLQ: {route:?}"
    );
    eventually(
        Duration::from_secs(30),
        "the worker holds its partitions",
        || {
            kjob_ops::groups::describe_groups(&config, Some(&group))
                .is_ok_and(|g| g.iter().any(|g| !g.assigned_topics().is_empty()))
        },
    )
    .await;
    let refused = run_kjob(
        KJOB,
        &config,
        &["topics", "delete", "--route", &topic, "--execute"],
    );
    assert_ne!(refused.code, 0, "{}", refused.stdout);
    assert!(
        refused.stderr.contains("live members") && refused.stderr.contains(&group),
        "{}",
        refused.stderr
    );
    let refused = run_kjob(KJOB, &config, &["topics", "delete", "--group", &group]);
    assert_ne!(refused.code, 0, "{}", refused.stdout);
    running.stop().await;
    let listed = |args: &[&str]| -> (BTreeSet<String>, serde_json::Value) {
        let v: serde_json::Value = serde_json::from_str(&kjob_ok(KJOB, &config, args)).unwrap();
        let topics = v["topics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["topic"].as_str().unwrap_or_default().to_string())
            .collect();
        (topics, v)
    };
    let (dry, v) = listed(&["topics", "delete", "--route", &topic, "--json"]);
    assert_eq!(dry, route, "the dry run names exactly the route's topics");
    assert_eq!(v["dry_run"], true);
    assert!(
        kjob::topics::list_topics(&config).unwrap().contains(&topic),
        "a dry run deletes nothing"
    );
    let (done, _) = listed(&["topics", "delete", "--route", &topic, "--execute", "--json"]);
    assert_eq!(done, route);
    eventually(
        Duration::from_secs(30),
        "the route's topics are gone",
        || {
            let left = kjob::topics::list_topics(&config).unwrap_or_default();
            !left.iter().any(|t| route.contains(t))
        },
    )
    .await;
    let left = kjob::topics::list_topics(&config).unwrap();
    assert!(left.contains(&other), "an unrelated topic stays");
    let control = kjob::control::control_topic(&group);
    assert!(
        left.contains(&control),
        "the group's control topic is the group's, not the route's"
    );
    let (gone, v) = listed(&["topics", "delete", "--group", &group, "--execute", "--json"]);
    assert_eq!(gone, BTreeSet::from([control.clone()]));
    assert_eq!(v["group_offsets"], "deleted");
    eventually(
        Duration::from_secs(30),
        "the group and its control topic are gone",
        || {
            !kjob::topics::list_topics(&config)
                .unwrap_or_default()
                .contains(&control)
                && !kjob_ops::groups::group_names(&config)
                    .unwrap_or_default()
                    .contains(&group)
        },
    )
    .await;
    let unknown = run_kjob(KJOB, &config, &["topics", "delete", "--route", "del.nope"]);
    assert_ne!(unknown.code, 0);
    assert!(
        unknown.stderr.contains("no topic belongs to route"),
        "{}",
        unknown.stderr
    );
}

use crate::dashboard as support;

/// After a route's workers are gone (the demo ended, every worker
/// crashed), the dashboard's overview still lists it, found through the
/// offsets its group committed, marked as having no live member, with the
/// jobs that arrived since counted as lag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_keeps_a_route_whose_workers_are_gone() {
    init_logging();
    let config = ensure_stack();
    let (topic, group) = (unique("gone.r"), unique("gone-g"));
    create_topic(&config, &topic, 2).await;
    let worker = kjob::Worker::builder(config.clone(), &group)
        .handle_on(&topic, |_: TestJob, _: kjob::JobContext| async {
            Ok::<(), kjob::JobError>(())
        })
        .build()
        .unwrap();
    let running = start(worker);
    let producer = kjob::Producer::new(&config).unwrap();
    enqueue_n(&producer, &topic, 10, 5, "ok").await;
    wait_committed_at_end(&config, &group, &topic, 2).await;
    running.stop().await;
    enqueue_n(&producer, &topic, 7, 5, "ok").await;
    // Only this group: the stack holds every other test's idle groups,
    // which a whole-cluster dashboard would sample too.
    let (_ui, base) = support::discovering_dashboard(&config, &["--group", &group]).await;
    let card = |page: &str| -> Option<String> {
        let start = page.find(&format!("data-topic=\"{topic}\" data-group=\"{group}\""))?;
        let rest = &page[start..];
        Some(rest[..rest.find("</section>").unwrap_or(rest.len())].to_string())
    };
    let mut last = String::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let page = reqwest::get(format!("{base}/"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap_or_default();
        if let Some(c) = card(&page) {
            last = c;
            if last.contains("lag (main + tiers)") && last.contains(">7<") {
                break;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the overview did not show the route with its lag of 7: {last}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(last.contains("no live member"), "{last}");
}

/// Bad input to the model's commands: a missing or garbage model file and a
/// principal that is not TYPE:NAME are usage errors naming the fix, before
/// anything is printed.
#[test]
fn the_model_commands_refuse_a_missing_or_garbage_model_and_a_bad_principal() {
    let config = ensure_stack();
    let dir = std::env::temp_dir().join(unique("kjob-model-bad"));
    std::fs::create_dir_all(&dir).unwrap();
    let garbage = dir.join("garbage.json");
    std::fs::write(&garbage, b"\x00\xffnot json {").unwrap();
    let garbage = garbage.to_string_lossy().to_string();
    let missing = dir.join("missing.json").to_string_lossy().to_string();
    for args in [
        vec!["acls", "--model", missing.as_str()],
        vec!["acls", "--model", garbage.as_str()],
        vec!["topics", "list", "--model", missing.as_str()],
        vec!["topics", "list", "--model", garbage.as_str()],
    ] {
        let out = run_kjob(KJOB, &config, &args);
        assert_eq!(out.code, 2, "{args:?}: a usage error\n{}", out.stderr);
        assert!(out.stdout.is_empty(), "{args:?}: {}", out.stdout);
        assert!(
            out.stderr.contains("KJOB_DESCRIBE=json"),
            "{args:?}: {}",
            out.stderr
        );
    }
    let model = dir.join("model.json");
    let worker = kjob::Worker::builder(config.clone(), "g")
        .handle_on("t", |_: TestJob, _: kjob::JobContext| async {
            Ok::<(), kjob::JobError>(())
        })
        .build()
        .unwrap();
    std::fs::write(&model, worker.deployment().to_json()).unwrap();
    let model = model.to_string_lossy().to_string();
    let out = run_kjob(
        KJOB,
        &config,
        &["acls", "--model", &model, "--principal", "worker"],
    );
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("TYPE:NAME"), "{}", out.stderr);
}
