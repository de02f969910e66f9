//! `kjob waiting`, through the real binary against the real stack: what
//! waits in a route's retry tier for a group, a cancel and a move to "now"
//! that are dry runs until `--execute`, and the refusals an operator meets
//! (a record already acted on, one without a job id, the main topic, bad
//! coordinates, an offset past the end). A worker honouring them is the
//! dashboard's browser test (`ui.rs`).

use std::time::Duration;

use kjob::headers::JobHeaders;
use kjob::{KafkaConfig, Producer};
use kjob_integration_tests::*;
use rdkafka::Message;

const KJOB: &str = env!("CARGO_BIN_EXE_kjob-cli");

fn kjob(config: &KafkaConfig, args: &[&str]) -> CliOut {
    run_kjob(KJOB, config, args)
}

fn ok(config: &KafkaConfig, args: &[&str]) -> String {
    kjob_ok(KJOB, config, args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_jobs_are_listed_cancelled_or_moved_to_now_and_refusals_name_why() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("waitcli");
    let group = unique("g");
    ok(
        &config,
        &[
            "topics",
            "create",
            "--topic",
            &topic,
            "--partitions",
            "1",
            "--tiers",
            "1h",
            "--execute",
        ],
    );
    let tier = kjob::retry::tier_topic(&topic, Duration::from_secs(3600));
    let producer = Producer::new(&config).expect("producer");
    let due = kjob::dlq::now_ms() + 3_600_000;
    // Two retries of this group waiting an hour, and a record without a
    // job id (written by hand).
    for (i, id) in ["job-a", "job-b"].iter().enumerate() {
        let h = JobHeaders {
            job: Some("kjob.test.job".into()),
            id: Some((*id).into()),
            attempt: Some(2),
            due_at_ms: Some(due + i as i64),
            group: Some(group.clone()),
            ..JobHeaders::default()
        };
        producer
            .send_raw(&tier, Some(b"k"), Some(b"payload"), h.to_owned_headers())
            .await
            .expect("a waiting retry");
    }
    producer
        .send_raw(
            &tier,
            Some(b"k"),
            Some(b"x"),
            rdkafka::message::OwnedHeaders::new(),
        )
        .await
        .expect("a headerless record");
    let base = [
        "waiting",
        "--topic",
        topic.as_str(),
        "--group",
        group.as_str(),
    ];
    let with = |rest: &[&str]| -> Vec<String> {
        base.iter().chain(rest).map(|s| (*s).to_string()).collect()
    };
    let run = |rest: &[&str]| {
        let args = with(rest);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        kjob(&config, &refs)
    };
    let list = run(&[]);
    assert_eq!(list.code, 0, "{}{}", list.stdout, list.stderr);
    assert!(
        list.stdout.contains("3 shown, 3 waiting") && list.stdout.contains("job-a"),
        "{}",
        list.stdout
    );
    let at_a = format!("{tier}:0:0");
    let at_b = format!("{tier}:0:1");
    // A dry run by default: nothing written, not even the control topic.
    let dry = run(&["cancel", &at_a, "--reason", "refunded by hand"]);
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    assert!(
        dry.stdout.contains("dry run") && dry.stdout.contains("job-a"),
        "{}",
        dry.stdout
    );
    let control = kjob::control::control_topic(&group);
    assert_eq!(
        kjob::topics::partition_counts(&config, std::slice::from_ref(&control)).expect("metadata")
            [0],
        None,
        "a dry run writes nothing"
    );
    // A cancel needs a reason.
    let no_reason = run(&["cancel", &at_a, "--reason", " ", "--execute"]);
    assert_eq!(no_reason.code, 2, "{}", no_reason.stderr);
    assert!(
        no_reason.stderr.contains("needs a reason"),
        "{}",
        no_reason.stderr
    );
    // Cancel one for real, move the other to now.
    let done = run(&["cancel", &at_a, "--reason", "refunded by hand", "--execute"]);
    assert_eq!(done.code, 0, "{}", done.stderr);
    assert!(
        done.stdout.starts_with("cancelled job `job-a`"),
        "{}",
        done.stdout
    );
    let moved = run(&["now", &at_b, "--execute", "--json"]);
    assert_eq!(moved.code, 0, "{}", moved.stderr);
    let moved: serde_json::Value = serde_json::from_str(moved.stdout.trim()).expect("JSON");
    assert_eq!(moved["action"], "moved to now");
    assert_eq!(moved["executed"], true);
    // The copy is on the main topic, due now, for this group only.
    let main = read_all(&config, &topic);
    assert_eq!(main.len(), 1, "one copy");
    let h = JobHeaders::parse(main[0].headers());
    assert_eq!(h.id.as_deref(), Some("job-b"));
    assert_eq!(h.attempt, Some(2), "its attempt count kept");
    assert_eq!((h.due_at_ms, h.run_at_ms), (None, None), "due now");
    assert_eq!(h.group.as_deref(), Some(group.as_str()));
    assert!(
        h.extra
            .iter()
            .any(|(k, v)| k == kjob::headers::MOVED_FROM && v == at_b.as_bytes()),
        "it says where it waited: {:?}",
        h.extra
    );
    assert_eq!(main[0].payload(), Some(&b"payload"[..]));
    // Both stay listed until a worker reaches them, marked.
    let list = run(&[]);
    assert!(
        list.stdout.contains("cancelled by ops-tester")
            && list.stdout.contains("moved to now by ops-tester"),
        "{}",
        list.stdout
    );
    // Refusals, each with its reason and exit code.
    let again = run(&["now", &at_a, "--execute"]);
    assert_eq!(again.code, 1, "{}", again.stderr);
    assert!(
        again.stderr.contains("already cancelled by ops-tester"),
        "{}",
        again.stderr
    );
    let headerless = run(&["cancel", &format!("{tier}:0:2"), "--reason", "r"]);
    assert_eq!(headerless.code, 1, "{}", headerless.stderr);
    assert!(
        headerless.stderr.contains("no kjob-id"),
        "{}",
        headerless.stderr
    );
    let main_topic = run(&["now", &format!("{topic}:0:0")]);
    assert_eq!(main_topic.code, 2, "{}", main_topic.stderr);
    assert!(
        main_topic
            .stderr
            .contains("not a retry tier or delay topic")
            && main_topic.stderr.contains(&tier),
        "{}",
        main_topic.stderr
    );
    let past = run(&["now", &format!("{tier}:0:9")]);
    assert_eq!(past.code, 3, "{}", past.stderr);
    let bad = run(&["now", "nonsense"]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(
        bad.stderr.contains("topic:partition:offset"),
        "{}",
        bad.stderr
    );
    // A record the group committed past no longer waits.
    commit_offsets(&config, &group, &tier, &[(0, 1)]);
    let gone = run(&["now", &at_a]);
    assert_eq!(gone.code, 1, "{}", gone.stderr);
    assert!(
        gone.stderr.contains("already committed past"),
        "{}",
        gone.stderr
    );
    // Audited on the group's control topic, in order.
    let audit = kjob::control::read_control(&config, &group)
        .expect("controls")
        .audit;
    let acts: Vec<(&str, &str, &str)> = audit
        .iter()
        .map(|a| (a.subject.as_str(), a.action.as_str(), a.by.as_str()))
        .collect();
    assert_eq!(
        acts,
        [
            ("job:job-a", "cancelled", "ops-tester"),
            ("job:job-b", "moved to now", "ops-tester"),
        ]
    );
}
