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
            "--execute",
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
        3,
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
        2,
        "--since `last tuesday`",
    );
    fails(
        &config,
        &["dlq", "list", "--topic", &unique("nope")],
        3,
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
        2,
        "name the records",
    );
    fails(
        &config,
        &["topics", "create", "--topic", "x", "--tiers", "5 parsecs"],
        2,
        "not a delay",
    );
    let all = ok(&config, &["dlq", "list", "--topic", &topic, "--all"]);
    assert!(all.contains("6 shown, 0 unresolved"), "{all}");
}

/// Whether a terminal could act on `c` rather than show it: C0 (but the
/// newlines between lines), DEL, C1, and the bidi controls. Written out
/// here rather than taken from kjob_ops, so the test does not trust the
/// code it tests.
fn acts_on_a_terminal(c: char) -> bool {
    (c.is_control() && c != '\n')
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

fn assert_terminal_safe(what: &str, out: &str) {
    let bad: Vec<String> = out
        .char_indices()
        .filter(|(_, c)| acts_on_a_terminal(*c))
        .take(5)
        .map(|(i, c)| format!("{c:?} at byte {i}"))
        .collect();
    assert!(
        bad.is_empty(),
        "{what} printed raw control or bidi characters ({}): {:?}",
        bad.join(", "),
        out.chars().take(400).collect::<String>()
    );
}

/// Writes one record as a hostile producer would: raw key, headers and
/// payload, straight to `topic`.
fn produce_hostile(
    config: &KafkaConfig,
    topic: &str,
    key: &str,
    headers: &[(&str, &str)],
    payload: &[u8],
) {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer as _, ThreadedProducer};
    let p: ThreadedProducer<DefaultProducerContext> =
        config.rdkafka_config().create().expect("creating producer");
    let mut owned = OwnedHeaders::new();
    for (k, v) in headers {
        owned = owned.insert(Header {
            key: k,
            value: Some(v.as_bytes()),
        });
    }
    p.send(
        BaseRecord::to(topic)
            .partition(0)
            .key(key)
            .payload(payload)
            .headers(owned),
    )
    .map_err(|(e, _)| e)
    .expect("queueing the record");
    p.flush(Duration::from_secs(10)).expect("flushing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_contents_reach_the_terminal_escaped_and_bounded() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("dlqtty");
    let dlq = format!("{topic}.dlq");
    kjob::topics::create_topics(
        &config,
        &[
            (topic.clone(), 1),
            (dlq.clone(), 1),
            (format!("{dlq}.audit"), 1),
        ],
    )
    .await
    .expect("creating the route's topics");

    // 0:0, escape sequences everywhere a producer controls: the key, the
    // job and error headers, a header of its own (name and value).
    let evil_key = "evil\x1b]0;PWNED\x07\x1b[2J\u{202e}desrever\u{9b}31m-key";
    let evil_error = "boom \x1b[31mred\x1b[0m \u{2066}isolated\u{2069} \x7f end";
    let headers = [
        ("kjob-job", "job\x1b[2J"),
        ("kjob-id", "id-1"),
        ("kjob-attempt", "3"),
        ("kjob-error-class", "permanent.invalid_input\u{200f}"),
        ("kjob-error", evil_error),
        ("kjob-original-topic", topic.as_str()),
        ("x-evil\x07", "\x1b]0;T\x07\u{202d}"),
    ];
    produce_hostile(&config, &dlq, evil_key, &headers, b"not avro \x1b[2J");
    // 0:1, a 100 KB key.
    let huge_key = format!("\x1b[2J{}", "k".repeat(102_400));
    produce_hostile(&config, &dlq, &huge_key, &headers, b"x");
    // 0:2, resolved by an "operator" whose name is an escape sequence (the
    // audit topic is as writable as the DLQ).
    produce_hostile(&config, &dlq, "plain", &headers, b"x");
    let audit = serde_json::json!({
        "action": "resolved",
        "by": "mallory\x1b]0;OWNED\x07\u{202e}",
        "at_ms": 1_700_000_000_000i64,
        "reason": "r\x1b[2J",
        "target": null,
    })
    .to_string();
    produce_hostile(
        &config,
        &format!("{dlq}.audit"),
        "0:2",
        &[],
        audit.as_bytes(),
    );

    // The table: nothing raw, the escaped form visible, the huge key cut.
    let list = ok(&config, &["dlq", "list", "--topic", &topic, "--all"]);
    assert_terminal_safe("dlq list", &list);
    for shown in [
        "evil\\x1b]0;PWNED\\x07\\x1b[2J\\u{202e}desrever\\u{9b}31m-key",
        "job\\x1b[2J",
        "boom \\x1b[31mred",
        "resolved by mallory\\x1b]0;OWNED\\x07\\u{202e}",
        "…(+",
    ] {
        assert!(list.contains(shown), "dlq list lacks {shown:?}: {list}");
    }
    assert!(list.len() < 20_000, "dlq list printed {} bytes", list.len());

    // show: the record in full, as JSON that still parses to the exact
    // values, with the controls JSON-escaped.
    let shown = ok(&config, &["dlq", "show", "--topic", &topic, "0:0"]);
    assert_terminal_safe("dlq show", &shown);
    assert!(shown.contains("\\u001b]0;PWNED\\u0007"), "{shown}");
    assert!(
        shown.contains("\\u202e") && shown.contains("\\u009b"),
        "{shown}"
    );
    let json: serde_json::Value = serde_json::from_str(&shown).expect("show prints JSON");
    assert_eq!(json["key"], evil_key);
    assert_eq!(json["headers"]["kjob-error"], evil_error);
    assert_eq!(json["headers"]["x-evil\x07"], "\x1b]0;T\x07\u{202d}");

    let shown = ok(&config, &["dlq", "show", "--topic", &topic, "0:1"]);
    assert_terminal_safe("dlq show (100 KB key)", &shown);
    assert!(
        shown.len() < 20_000,
        "dlq show printed {} bytes",
        shown.len()
    );
    assert!(shown.contains("…(+"), "no cut marker: {shown}");

    // --json: exact values (nothing cut), and still nothing raw.
    for args in [
        vec!["dlq", "list", "--topic", topic.as_str(), "--all", "--json"],
        vec!["dlq", "show", "--topic", topic.as_str(), "0:1", "--json"],
    ] {
        let out = ok(&config, &args);
        assert_terminal_safe(&args.join(" "), &out);
        let json: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        let keys: Vec<&str> = match json.as_array() {
            Some(rows) => rows.iter().filter_map(|r| r["key"].as_str()).collect(),
            None => json["key"].as_str().into_iter().collect(),
        };
        assert!(
            keys.contains(&huge_key.as_str()),
            "{args:?}: the 100 KB key did not round-trip exactly"
        );
        if json.is_array() {
            assert!(keys.contains(&evil_key), "{args:?}");
        }
    }

    // An error that quotes a record (the audit entry's operator) is safe too.
    let o = kjob(
        &config,
        &["dlq", "retry", "--topic", &topic, "0:2", "--execute"],
    );
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    assert_terminal_safe("dlq retry's error", &o.stderr);
    assert!(
        o.stderr
            .contains("already resolved by mallory\\x1b]0;OWNED\\x07\\u{202e}"),
        "{}",
        o.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_class_lists_the_known_classes() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("dlqclass");
    ok(
        &config,
        &[
            "topics",
            "create",
            "--topic",
            &topic,
            "--partitions",
            "1",
            "--execute",
        ],
    );
    let dlq = format!("{topic}.dlq");
    // A class of another writer's, present in the DLQ, is known too.
    produce_hostile(
        &config,
        &dlq,
        "k",
        &[("kjob-error-class", "billing.declined")],
        b"x",
    );
    for cmd in ["list", "retry", "resolve"] {
        let mut args = vec![
            "dlq",
            cmd,
            "--topic",
            topic.as_str(),
            "--class",
            "permanant",
        ];
        if cmd == "resolve" {
            args.extend(["--reason", "r"]);
        }
        fails(&config, &args, 2, "unknown error class `permanant`");
        let o = kjob(&config, &args);
        for known in [
            "did you mean `permanent`",
            "known classes:",
            "permanent.invalid_input",
            "decode",
            "retryable.timeout",
            "billing.declined",
        ] {
            assert!(
                o.stderr.contains(known),
                "dlq {cmd}: lacks `{known}`: {}",
                o.stderr
            );
        }
    }
    for class in ["permanent", "decode", "billing", "billing.declined"] {
        ok(
            &config,
            &["dlq", "list", "--topic", &topic, "--class", class],
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_is_a_dry_run_until_execute_and_limit_bounds_list_and_resolve() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("dlqresolve");
    ok(
        &config,
        &[
            "topics",
            "create",
            "--topic",
            &topic,
            "--partitions",
            "1",
            "--execute",
        ],
    );
    let dlq = format!("{topic}.dlq");
    for i in 0..5 {
        produce_hostile(
            &config,
            &dlq,
            &format!("order-{i}"),
            &[("kjob-error-class", "permanent.invalid_input")],
            b"x",
        );
    }
    let args = [
        "dlq",
        "resolve",
        "--topic",
        topic.as_str(),
        "--class",
        "permanent",
        "--reason",
        "refunded by hand",
    ];
    // The default: a dry run that writes nothing.
    let dry = ok(&config, &args);
    assert!(
        dry.contains("dry run: 5 record(s) would be resolved") && dry.contains("--execute"),
        "{dry}"
    );
    assert_eq!(
        kjob::topics::partition_counts(&config, &[format!("{dlq}.audit")]).expect("metadata")[0],
        None,
        "no audit topic, so nothing was audited"
    );
    let list = ok(&config, &["dlq", "list", "--topic", &topic]);
    assert!(list.contains("5 shown, 5 unresolved"), "{list}");
    // --limit on resolve: the oldest N, for real with --execute.
    let mut limited = args.to_vec();
    limited.extend(["--limit", "2", "--execute"]);
    let done = ok(&config, &limited);
    assert!(
        done.contains("resolved 2 record(s)") && done.contains("5 match"),
        "{done}"
    );
    assert_eq!(read_all(&config, &format!("{dlq}.audit")).len(), 2);
    let all = ok(&config, &["dlq", "list", "--topic", &topic, "--all"]);
    assert!(all.contains("resolved by ops-tester"), "{all}");
    // --limit on list: rows bounded, the count still the whole.
    let list = ok(&config, &["dlq", "list", "--topic", &topic, "--limit", "1"]);
    assert!(list.contains("1 shown, 3 unresolved"), "{list}");
    // Match the first cell of a row: a bare "0:3" also occurs in a
    // "failed at" time such as 20:39:31.
    let row = |at: &str| list.lines().any(|l| l.starts_with(&format!("│ {at} ")));
    assert!(row("0:2") && !row("0:3"), "the oldest first: {list}");
    let rows: serde_json::Value = serde_json::from_str(&ok(
        &config,
        &["dlq", "list", "--topic", &topic, "--limit", "2", "--json"],
    ))
    .expect("JSON");
    assert_eq!(rows.as_array().map(Vec::len), Some(2));
    // Without --execute, again nothing: 3 stay unresolved.
    ok(&config, &args);
    let list = ok(&config, &["dlq", "list", "--topic", &topic]);
    assert!(list.contains("3 shown, 3 unresolved"), "{list}");
}

/// The audit trail names who acted: `--by`, else `KJOB_OPERATOR`, else
/// `$USER`, else `uid <N>@<host>`; never "unknown" (a container often has
/// no `$USER`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_names_the_operator_even_without_a_user() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("dlqwho");
    let dlq = format!("{topic}.dlq");
    create_topic(&config, &topic, 1).await;
    create_topic(&config, &dlq, 1).await;
    for i in 0..3 {
        produce_raw(&config, &dlq, 0, &format!("k{i}"), b"dead");
    }
    let kjob = env!("CARGO_BIN_EXE_kjob-cli");
    let stack = [
        ("KJOB_BOOTSTRAP_SERVERS", config.bootstrap_servers.as_str()),
        (
            "KJOB_SCHEMA_REGISTRY_URL",
            config.schema_registry_url.as_str(),
        ),
    ];
    let resolve = |at: &str, env: &[(&str, &str)], by: Option<&str>| {
        let mut args = vec![
            "dlq",
            "resolve",
            "--topic",
            topic.as_str(),
            at,
            "--reason",
            "test",
            "--execute",
        ];
        if let Some(by) = by {
            args.extend(["--by", by]);
        }
        let out = run_kjob_env(kjob, &args, &[&stack[..], env].concat(), None);
        assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    };
    resolve("0:0", &[("USER", "")], None);
    resolve(
        "0:1",
        &[("USER", ""), ("KJOB_OPERATOR", "deploy-bot")],
        None,
    );
    resolve("0:2", &[("KJOB_OPERATOR", "deploy-bot")], Some("alice"));
    let list = ok(
        &config,
        &["dlq", "list", "--topic", &topic, "--all", "--json"],
    );
    let rows: serde_json::Value = serde_json::from_str(list.trim()).expect("JSON");
    let by = |i: usize| {
        rows[i]["audit"]["by"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert!(by(0).starts_with("uid ") && by(0).contains('@'), "{rows}");
    assert_eq!(
        (by(1).as_str(), by(2).as_str()),
        ("deploy-bot", "alice"),
        "{rows}"
    );
}

/// `--key` and `--grep` pick dead letters as the dashboard's search does,
/// combined with the other filters, in `list`, `retry` and `resolve`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_picked_by_key_and_by_text() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("dlqgrep");
    let dlq = format!("{topic}.dlq");
    create_topic(&config, &topic, 1).await;
    create_topic(&config, &dlq, 1).await;
    for (key, payload) in [
        ("order-4711", &b"customer-1 paid"[..]),
        ("order-4712", b"customer-2 refused"),
        ("order-47111", b"customer-3 paid"),
    ] {
        produce_raw(&config, &dlq, 0, key, payload);
    }
    let keys = |args: &[&str]| -> Vec<String> {
        let all: Vec<&str> = ["dlq", "list", "--topic", topic.as_str(), "--json"]
            .into_iter()
            .chain(args.iter().copied())
            .collect();
        let rows: serde_json::Value = serde_json::from_str(ok(&config, &all).trim()).expect("JSON");
        rows.as_array()
            .map(|r| {
                r.iter()
                    .filter_map(|r| r["key"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        keys(&["--key", "order-4711"]),
        ["order-4711"],
        "a key matches exactly"
    );
    assert_eq!(keys(&["--grep", "4711"]), ["order-4711", "order-47111"]);
    assert_eq!(
        keys(&["--grep", "paid"]),
        ["order-4711", "order-47111"],
        "the payload's text"
    );
    assert_eq!(
        keys(&["--grep", "paid", "--key", "order-47111"]),
        ["order-47111"]
    );
    assert_eq!(
        keys(&["--grep", "paid", "--since", "1h"]),
        ["order-4711", "order-47111"]
    );
    assert!(
        keys(&["--grep", "paid", "--until", "1h"]).is_empty(),
        "written within the hour"
    );
    // resolve and retry take the same filters: a dry run of the one key.
    let dry = ok(
        &config,
        &[
            "dlq",
            "resolve",
            "--topic",
            &topic,
            "--key",
            "order-4712",
            "--reason",
            "refunded",
            "--json",
        ],
    );
    let dry: serde_json::Value = serde_json::from_str(dry.trim()).expect("JSON");
    assert_eq!(dry["matched"], 1, "{dry}");
    let retry = ok(
        &config,
        &[
            "dlq", "retry", "--topic", &topic, "--grep", "refused", "--to", "main", "--json",
        ],
    );
    let retry: serde_json::Value = serde_json::from_str(retry.trim()).expect("JSON");
    let picked = retry["records"].as_array().map_or(0, Vec::len)
        + retry["held"].as_array().map_or(0, Vec::len);
    assert_eq!(picked, 1, "{retry}");
}

/// A job dead-lettered, replayed (an offset reset) and dead-lettered again
/// is one entry: its newest dead letter, with the first as its history.
/// It counts once among the unresolved, and an action on the earlier
/// coordinates is refused, naming the newer ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_dead_lettered_again_after_a_replay_is_one_entry_with_its_history() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("dlqagain");
    let group = unique("g");
    let dlq = format!("{topic}.dlq");
    create_topic(&config, &topic, 1).await;
    Producer::new(&config)
        .unwrap()
        .enqueue_to(&topic, &TestJob::ok("order-9", 1))
        .await
        .unwrap();
    let worker = || {
        kjob::Worker::builder(config.clone(), &group)
            .handle_on(&topic, |_j: TestJob, _c: kjob::JobContext| async {
                Err::<(), _>(kjob::JobError::permanent("the card was refused"))
            })
            .build()
            .unwrap()
    };
    let w = start(worker());
    eventually(Duration::from_secs(60), "dead-lettered once", || {
        read_all(&config, &dlq).len() == 1
    })
    .await;
    w.stop().await;
    ok(
        &config,
        &[
            "replay",
            "--group",
            &group,
            "--topic",
            &topic,
            "--to-earliest",
            "--execute",
        ],
    );
    let w = start(worker());
    eventually(Duration::from_secs(60), "dead-lettered again", || {
        read_all(&config, &dlq).len() == 2
    })
    .await;
    w.stop().await;

    let rows: serde_json::Value =
        serde_json::from_str(ok(&config, &["dlq", "list", "--topic", &topic, "--json"]).trim())
            .expect("JSON");
    let rows = rows.as_array().cloned().unwrap_or_default();
    assert_eq!(rows.len(), 1, "one entry for the job: {rows:#?}");
    assert_eq!(rows[0]["at"], "0:1", "the newest dead letter stands for it");
    assert_eq!(rows[0]["earlier"], serde_json::json!(["0:0"]));
    let table = ok(&config, &["dlq", "list", "--topic", &topic]);
    assert!(
        table.contains("earlier") && table.contains("1 (0:0)") && table.contains("1 unresolved"),
        "{table}"
    );
    let status = ok(
        &config,
        &["status", "--group", &group, "--topic", &topic, "--json"],
    );
    let status: serde_json::Value = serde_json::from_str(status.trim()).expect("status --json");
    assert_eq!(status["dlq_unresolved"], 1, "{status}");
    assert_eq!(status["dlq"]["exact"], true, "{status}");
    fails(
        &config,
        &[
            "dlq",
            "resolve",
            "--topic",
            &topic,
            "0:0",
            "--reason",
            "refunded",
            "--execute",
        ],
        1,
        "dead-lettered again at 0:1",
    );
    // Resolving the job's entry settles the job: nothing unresolved.
    ok(
        &config,
        &[
            "dlq",
            "resolve",
            "--topic",
            &topic,
            "0:1",
            "--reason",
            "refunded",
            "--execute",
        ],
    );
    let status = ok(
        &config,
        &["status", "--group", &group, "--topic", &topic, "--json"],
    );
    let status: serde_json::Value = serde_json::from_str(status.trim()).expect("status --json");
    assert_eq!(status["dlq_unresolved"], 0, "{status}");
}
