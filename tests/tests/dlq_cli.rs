//! The operator workflow on a real DLQ, through the real `kjob` CLI:
//! list, show, dry run, re-drive after a fix, resolve, and clear errors.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kjob::{KafkaConfig, Producer, WorkerStats};
use kjob_integration_tests::*;

fn kjob(config: &KafkaConfig, args: &[&str]) -> CliOut {
    run_kjob(env!("CARGO_BIN_EXE_kjob-cli"), config, args)
}

fn ok(config: &KafkaConfig, args: &[&str]) -> String {
    kjob_ok(env!("CARGO_BIN_EXE_kjob-cli"), config, args)
}

fn fails(config: &KafkaConfig, args: &[&str], code: i32, needle: &str) {
    let o = kjob(config, args);
    assert_eq!(
        o.code, code,
        "kjob {args:?}: expected exit {code}, got {}: {}{}",
        o.code, o.stdout, o.stderr
    );
    assert!(
        o.stderr.contains(needle),
        "kjob {args:?}: stderr lacks `{needle}`: {}",
        o.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_reviews_redrives_and_resolves_dead_letters() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("dlqcli");
    let group = unique("g");
    create_topic(&config, &topic, 1).await;
    let producer = Producer::new(&config).unwrap();
    for i in 0..6 {
        producer
            .enqueue_to(&topic, &TestJob::ok(format!("order-{i}"), i))
            .await
            .unwrap();
    }

    // A broken deploy dead-letters all six.
    let broken = Arc::new(AtomicBool::new(true));
    let handled: Arc<Mutex<Vec<i64>>> = Default::default();
    let w = start_breakable_worker(&config, &topic, &group, broken.clone(), handled.clone());
    eventually(Duration::from_secs(30), "six dead letters", || {
        WorkerStats::get(&w.stats.dead_lettered) == 6
    })
    .await;
    w.stop().await;

    let list = ok(&config, &["dlq", "list", "--topic", &topic]);
    assert!(list.contains("6 shown, 6 unresolved"), "{list}");
    assert!(
        list.contains("permanent.invalid_input") && list.contains("order-3"),
        "{list}"
    );
    let filtered = ok(
        &config,
        &[
            "dlq",
            "list",
            "--topic",
            &format!("{topic}.dlq"),
            "--class",
            "permanent",
            "--job",
            "kjob.test.job",
            "--since",
            "1h",
        ],
    );
    assert!(filtered.contains("6 shown"), "{filtered}");
    let none = ok(
        &config,
        &["dlq", "list", "--topic", &topic, "--class", "decode"],
    );
    assert!(none.contains("0 shown"), "{none}");
    // --json: the same rows for scripts.
    let rows: serde_json::Value =
        serde_json::from_str(&ok(&config, &["dlq", "list", "--topic", &topic, "--json"]))
            .expect("list --json prints JSON");
    let rows = rows.as_array().expect("an array");
    assert_eq!(rows.len(), 6);
    assert!(rows
        .iter()
        .all(|r| r["error_class"] == "permanent.invalid_input" && r["status"] == "unresolved"));
    let compact = ok(
        &config,
        &["dlq", "show", "--topic", &topic, "0:2", "--json"],
    );
    assert_eq!(compact.trim().lines().count(), 1, "one line: {compact}");

    // show: headers and the payload decoded through the registry.
    let shown = ok(&config, &["dlq", "show", "--topic", &topic, "0:2"]);
    let json: serde_json::Value = serde_json::from_str(&shown).expect("show prints JSON");
    let seq = json["payload"]["seq"].as_i64().expect("decoded seq");
    assert_eq!(json["payload"]["key"], format!("order-{seq}"));
    assert_eq!(
        json["headers"]["kjob-error-class"],
        "permanent.invalid_input"
    );
    assert_eq!(json["headers"]["kjob-original-topic"], topic.as_str());

    // Resolve one with a reason; it leaves the list but stays audited.
    let at5: serde_json::Value =
        serde_json::from_str(&ok(&config, &["dlq", "show", "--topic", &topic, "0:5"])).unwrap();
    let resolved_seq = at5["payload"]["seq"].as_i64().expect("decoded seq");
    ok(
        &config,
        &[
            "dlq",
            "resolve",
            "--topic",
            &topic,
            "0:5",
            "--reason",
            "customer cancelled",
        ],
    );
    let list = ok(&config, &["dlq", "list", "--topic", &topic]);
    assert!(list.contains("5 shown, 5 unresolved"), "{list}");
    let all = ok(&config, &["dlq", "list", "--topic", &topic, "--all"]);
    assert!(
        all.contains("6 shown, 5 unresolved") && all.contains("resolved by ops-tester"),
        "{all}"
    );
    let audit = read_all(&config, &format!("{topic}.dlq.audit"));
    assert_eq!(audit.len(), 1);
    use rdkafka::Message;
    let entry: serde_json::Value = serde_json::from_slice(audit[0].payload().unwrap()).unwrap();
    assert_eq!(entry["reason"], "customer cancelled");
    assert_eq!(entry["by"], "ops-tester");

    // Dry run (the default) changes nothing.
    let dry = ok(&config, &["dlq", "retry", "--topic", &topic]);
    assert!(
        dry.contains("dry run: 5 record(s) would be re-driven"),
        "{dry}"
    );
    assert_eq!(
        end_offsets(&config, &format!("{topic}.retry.1s"), 1),
        vec![0]
    );

    // Fix the deploy, re-drive, and the worker handles them.
    broken.store(false, Ordering::SeqCst);
    let w = start_breakable_worker(&config, &topic, &group, broken.clone(), handled.clone());
    let done = ok(
        &config,
        &[
            "dlq",
            "retry",
            "--topic",
            &topic,
            "--execute",
            "--rate",
            "50",
        ],
    );
    assert!(done.contains("re-drove 5 record(s)"), "{done}");
    eventually(Duration::from_secs(30), "re-driven jobs handled", || {
        handled.lock().unwrap().len() == 5
    })
    .await;
    w.stop().await;
    let mut seqs = handled.lock().unwrap().clone();
    seqs.sort();
    let expected: Vec<i64> = (0..6).filter(|s| *s != resolved_seq).collect();
    assert_eq!(seqs, expected, "the resolved one was not re-driven");
    let list = ok(&config, &["dlq", "list", "--topic", &topic]);
    assert!(list.contains("0 shown, 0 unresolved"), "{list}");
    let all = ok(&config, &["dlq", "list", "--topic", &topic, "--all"]);
    assert!(all.contains("retried by ops-tester"), "{all}");

    // Bad input: clear errors, non-zero exits, nothing changed.
    fails(
        &config,
        &["dlq", "show", "--topic", &topic, "0:999"],
        1,
        "no dead letter at 0:999",
    );
    fails(
        &config,
        &["dlq", "retry", "--topic", &topic, "0:1", "--execute"],
        1,
        "already retried",
    );
    fails(
        &config,
        &["dlq", "list", "--topic", &topic, "--since", "last tuesday"],
        1,
        "--since `last tuesday`",
    );
    fails(
        &config,
        &["dlq", "list", "--topic", &unique("nope")],
        1,
        "does not exist",
    );
    fails(
        &config,
        &["dlq", "show", "--topic", &topic, "zero:one"],
        2,
        "partition",
    );
    fails(
        &config,
        &["dlq", "resolve", "--topic", &topic, "0:1"],
        2,
        "--reason",
    );
    fails(
        &config,
        &["dlq", "resolve", "--topic", &topic, "--reason", "x"],
        1,
        "name the records",
    );
    fails(
        &config,
        &["topics", "create", "--topic", "x", "--tiers", "5 parsecs"],
        1,
        "not a delay",
    );
    let all = ok(&config, &["dlq", "list", "--topic", &topic, "--all"]);
    assert!(all.contains("6 shown, 0 unresolved"), "{all}");
}
