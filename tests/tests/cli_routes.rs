//! A route as `kjob status`, `kjob topics` and `kjob groups` show it,
//! through the real binary against the real stack: every topic by role,
//! unknown names as errors with near names, a missing DLQ with the command
//! that creates it, `--watch` into a file, and groups and topics listed and
//! described as Kafka's tools do.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kjob::{JobContext, JobError, KafkaConfig, Producer, Worker};
use kjob_integration_tests::*;

const KJOB: &str = env!("CARGO_BIN_EXE_kjob-cli");

fn kjob(config: &KafkaConfig, args: &[&str]) -> CliOut {
    run_kjob(KJOB, config, args)
}

fn ok(config: &KafkaConfig, args: &[&str]) -> String {
    kjob_ok(KJOB, config, args)
}

fn parse_json(what: &str, out: &str) -> serde_json::Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_an_unknown_group_or_topic_and_suggests_near_ones() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("status.known");
    let group = unique("status-workers");
    create_topic(&config, &topic, 1).await;
    produce_raw(&config, &topic, 0, "k", b"x");
    commit_offsets(&config, &group, &topic, &[(0, 1)]);

    let typo_group = format!("{group}x");
    let o = kjob(
        &config,
        &["status", "--group", &typo_group, "--topic", &topic],
    );
    assert_eq!(o.code, 3, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stderr
            .contains(&format!("group `{typo_group}` is unknown"))
            && o.stderr.contains(&format!("did you mean `{group}`")),
        "{}",
        o.stderr
    );
    assert!(
        o.stdout.is_empty(),
        "no lag printed for an unknown group: {}",
        o.stdout
    );
    let o = kjob(
        &config,
        &["status", "--group", "no-such-group-xyz", "--topic", &topic],
    );
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(o.stderr.contains("no-such-group-xyz"), "{}", o.stderr);

    let typo_topic = topic.replace("known", "knwon");
    let o = kjob(
        &config,
        &["status", "--group", &group, "--topic", &typo_topic],
    );
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(
        o.stderr
            .contains(&format!("topic `{typo_topic}` does not exist"))
            && o.stderr.contains(&format!("did you mean `{topic}`")),
        "{}",
        o.stderr
    );
    // The right names work, and the lag is the group's.
    let status = parse_json(
        "status",
        &ok(
            &config,
            &["status", "--group", &group, "--topic", &topic, "--json"],
        ),
    );
    assert_eq!(status["topics"][0]["lag"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_every_topic_of_the_route_by_role() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("roles");
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
            "1s,5s",
            "--delays",
            "--strict-order",
            "--execute",
        ],
    );
    // The group's cron topics, as a worker with schedules makes them, and
    // the DLQ's audit trail, as the first resolve makes it.
    for t in [
        kjob::schedule::leader_topic(&group),
        kjob::schedule::state_topic(&group),
        format!("{topic}.dlq.audit"),
    ] {
        create_topic(&config, &t, 1).await;
    }
    commit_offsets(&config, &group, &topic, &[(0, 0)]);
    let status = parse_json(
        "status --json",
        &ok(
            &config,
            &["status", "--group", &group, "--topic", &topic, "--json"],
        ),
    );
    let got: Vec<(String, String)> = status["topics"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|t| {
            (
                t["topic"].as_str().unwrap_or_default().to_string(),
                t["role"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let mut want: Vec<(String, String)> = vec![
        (topic.clone(), "main".into()),
        (format!("{topic}.retry.1s"), "retry tier".into()),
        (format!("{topic}.retry.5s"), "retry tier".into()),
    ];
    for bucket in ["1s", "3s", "10s", "1m", "10m", "1h", "1d"] {
        want.push((format!("{topic}.delay.{bucket}"), "delay".into()));
    }
    want.extend([
        (format!("{topic}.dlq"), "dlq".into()),
        (format!("{topic}.dlq.audit"), "dlq audit".into()),
        (format!("{topic}.order"), "strict order".into()),
        (kjob::schedule::leader_topic(&group), "cron leader".into()),
        (kjob::schedule::state_topic(&group), "cron state".into()),
    ]);
    assert_eq!(got, want);
    // Lag only where the group consumes; records everywhere.
    for t in status["topics"].as_array().cloned().unwrap_or_default() {
        let consumed = ["main", "retry tier", "delay", "cron leader"]
            .contains(&t["role"].as_str().unwrap_or_default());
        assert_eq!(t["lag"].is_i64(), consumed, "{t}");
        assert!(t["records"].is_i64(), "{t}");
    }
    let table = ok(&config, &["status", "--group", &group, "--topic", &topic]);
    for role in [
        "retry tier 5s",
        "delay 1d",
        "dlq audit",
        "strict order",
        "cron state",
    ] {
        assert!(table.contains(role), "the table lacks `{role}`: {table}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_watch_into_a_file_has_no_terminal_codes_and_counts_the_dlq() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("watch");
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
            "1s",
            "--execute",
        ],
    );
    commit_offsets(&config, &group, &topic, &[(0, 0)]);
    let dlq = format!("{topic}.dlq");
    for i in 0..3 {
        produce_raw(&config, &dlq, 0, &format!("k{i}"), b"x");
    }
    ok(
        &config,
        &[
            "dlq",
            "resolve",
            "--topic",
            &topic,
            "0:1",
            "--reason",
            "handled",
            "--execute",
        ],
    );

    let watch = |json: bool| {
        let out = std::env::temp_dir().join(unique("watch-out"));
        let file = std::fs::File::create(&out).expect("output file");
        let mut args = vec![
            "status", "--group", &group, "--topic", &topic, "--watch", "1",
        ];
        if json {
            args.push("--json");
        }
        let mut child = Command::new(KJOB)
            .args(&args)
            .env("KJOB_BOOTSTRAP_SERVERS", &config.bootstrap_servers)
            .env("KJOB_SCHEMA_REGISTRY_URL", &config.schema_registry_url)
            .stdout(Stdio::from(file))
            .stderr(Stdio::piped())
            .spawn()
            .expect("running kjob status --watch");
        // Wait for two refreshes (a refresh's reads take longer on a broker
        // holding many topics), bounded so a watch that never refreshes fails.
        let refreshed = |text: &str| {
            if json {
                text.matches('\n').count() >= 2
            } else {
                text.matches("--- ").count() >= 2
            }
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while std::time::Instant::now() < deadline
            && !refreshed(&std::fs::read_to_string(&out).unwrap_or_default())
        {
            std::thread::sleep(Duration::from_millis(200));
        }
        let _ = child.kill();
        let _ = child.wait();
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        (text, err)
    };
    let (text, err) = watch(false);
    assert!(
        !text.contains('\u{1b}'),
        "terminal codes in the file: {text:?}"
    );
    let reports = text.matches("--- ").count();
    assert!(reports >= 2, "{reports} refreshes in 60 s: {text}{err}");
    assert!(
        text.contains(&format!("DLQ `{dlq}`: 3 stored, 2 unresolved")),
        "{text}{err}"
    );
    let (text, err) = watch(true);
    assert!(!text.contains('\u{1b}'));
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 2, "{text}{err}");
    for line in lines {
        let v = parse_json("a --watch --json line", line);
        assert_eq!(v["dlq"]["stored"], 3);
        assert_eq!(v["dlq"]["unresolved"], 2);
        assert_eq!(v["dlq"]["exact"], true);
        assert!(v["dlq"]["error"].is_null());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_dlq_names_the_command_that_creates_it() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("nodlq");
    create_topic(&config, &topic, 3).await;
    let right = format!("kjob topics create --topic {topic} --partitions 3 --tiers none --execute");
    for given in [topic.clone(), format!("{topic}.dlq")] {
        let o = kjob(&config, &["dlq", "list", "--topic", &given]);
        assert_eq!(o.code, 3, "{}{}", o.stdout, o.stderr);
        assert!(
            o.stderr.contains(&right),
            "`{right}` not suggested: {}",
            o.stderr
        );
        assert!(
            !o.stderr.contains(&format!("--topic {topic}.dlq")),
            "a route whose main topic is the DLQ: {}",
            o.stderr
        );
    }
    // The suggested command does it: the DLQ with the main topic's
    // partitions, nothing else.
    let args: Vec<&str> = right.split_whitespace().skip(1).collect();
    ok(&config, &args);
    let list = ok(&config, &["dlq", "list", "--topic", &topic]);
    assert!(list.contains("0 shown, 0 unresolved"), "{list}");
    let described = parse_json(
        "topics describe",
        &ok(
            &config,
            &["topics", "describe", "--topic", &topic, "--json"],
        ),
    );
    let topics: Vec<(String, i64)> = described["topics"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|t| {
            (
                t["topic"].as_str().unwrap_or_default().to_string(),
                t["partitions"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        topics,
        vec![(topic.clone(), 3), (format!("{topic}.dlq"), 3)]
    );
    // Neither the main topic nor its DLQ: the names near it.
    let o = kjob(&config, &["dlq", "list", "--topic", &format!("{topic}x")]);
    assert_eq!(o.code, 3);
    assert!(
        o.stderr.contains(&format!("did you mean `{topic}`")),
        "{}",
        o.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_and_topics_are_listed_and_described_as_kafkas_tools_do() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("described");
    let group = unique("g");
    // create: a dry run first, then --replication-factor and --config k=v.
    let dry = ok(
        &config,
        &[
            "topics",
            "create",
            "--topic",
            &topic,
            "--partitions",
            "2",
            "--tiers",
            "5s",
            "--strict-order",
            "--replication-factor",
            "1",
            "--config",
            "retention.ms=3600000",
        ],
    );
    assert!(
        dry.contains("dry run: 4 topic(s) would be created"),
        "{dry}"
    );
    assert!(
        kjob::topics::partition_counts(&config, std::slice::from_ref(&topic)).expect("metadata")[0]
            .is_none(),
        "the dry run created nothing"
    );
    ok(
        &config,
        &[
            "topics",
            "create",
            "--topic",
            &topic,
            "--partitions",
            "2",
            "--tiers",
            "5s",
            "--strict-order",
            "--replication-factor",
            "1",
            "--config",
            "retention.ms=3600000",
            "--execute",
        ],
    );
    let described = parse_json(
        "topics describe --json",
        &ok(
            &config,
            &["topics", "describe", "--topic", &topic, "--json"],
        ),
    );
    let topics = described["topics"].as_array().cloned().unwrap_or_default();
    let roles: Vec<&str> = topics.iter().filter_map(|t| t["role"].as_str()).collect();
    assert_eq!(roles, vec!["main", "retry tier", "dlq", "strict order"]);
    for t in &topics {
        assert_eq!(t["partitions"], 2, "{t}");
        assert_eq!(t["replication_factor"], 1, "{t}");
        assert_eq!(t["configs"]["retention.ms"], "3600000", "{t}");
        assert_eq!(
            t["partition_details"][0]["replicas"]
                .as_array()
                .map(Vec::len),
            Some(1)
        );
    }
    assert_eq!(topics[3]["configs"]["cleanup.policy"], "compact");
    let table = ok(&config, &["topics", "describe", "--topic", &topic]);
    assert!(
        table.contains("retention.ms=3600000") && table.contains("leader"),
        "{table}"
    );
    // A bad --config is a usage error naming it.
    let o = kjob(
        &config,
        &[
            "topics",
            "create",
            "--topic",
            &unique("badcfg"),
            "--config",
            "retention.ms",
            "--execute",
        ],
    );
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("retention.ms"), "{}", o.stderr);
    // list: the route's topics, by role.
    let list = ok(&config, &["topics", "list"]);
    for (t, role) in [
        (topic.clone(), "main"),
        (format!("{topic}.retry.5s"), "retry tier 5s"),
        (format!("{topic}.order"), "strict order"),
    ] {
        assert!(
            list.lines()
                .any(|l| l.contains(&format!(" {t} ")) && l.contains(role)),
            "`{t}` as `{role}` missing: {list}"
        );
    }

    // groups: a live worker's member, its assignment and lag per partition.
    let producer = Producer::new(&config).expect("producer");
    kjob::codec::Codec::from_config(&config)
        .expect("codec")
        .register::<TestJob>(&topic)
        .await
        .expect("registering");
    let handled: Arc<Mutex<usize>> = Arc::default();
    let seen = handled.clone();
    let worker = Worker::builder(config.clone(), &group)
        .handle_on::<TestJob, _>(&topic, move |_j: TestJob, _c: JobContext| {
            let seen = seen.clone();
            async move {
                *seen.lock().unwrap_or_else(|p| p.into_inner()) += 1;
                Ok::<(), JobError>(())
            }
        })
        .retry(kjob::retry::RetryPolicy::tiers([Duration::from_secs(5)]))
        .build()
        .expect("worker");
    let running = start(worker);
    enqueue_n(&producer, &topic, 6, 3, "ok").await;
    wait_committed_at_end(&config, &group, &topic, 2).await;
    let mut described = serde_json::Value::Null;
    eventually(Duration::from_secs(30), "the member is described", || {
        let o = kjob(
            &config,
            &["groups", "describe", "--group", &group, "--json"],
        );
        if o.code != 0 {
            return false;
        }
        described = parse_json("groups describe", &o.stdout);
        described["members"]
            .as_array()
            .is_some_and(|m| m.len() == 1)
            && described["members"][0]["assignment"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
    })
    .await;
    let member = &described["members"][0];
    assert!(
        member["client_id"].is_string() && member["host"].is_string(),
        "{member}"
    );
    assert!(
        member["assignment"].as_array().is_some_and(|a| a
            .iter()
            .any(|t| t["topic"] == topic.as_str() && t["partitions"] == serde_json::json!([0, 1]))),
        "{member}"
    );
    let main_rows: Vec<&serde_json::Value> = described["partitions"]
        .as_array()
        .map(|p| p.iter().filter(|r| r["topic"] == topic.as_str()).collect())
        .unwrap_or_default();
    assert_eq!(main_rows.len(), 2, "{described}");
    assert!(main_rows
        .iter()
        .all(|r| r["lag"] == 0 && r["client_id"] == member["client_id"]));
    let table = ok(&config, &["groups", "describe", "--group", &group]);
    assert!(
        table.contains("1 member(s)") && table.contains("log end offset"),
        "{table}"
    );
    let list = ok(&config, &["groups", "list"]);
    assert!(
        list.lines()
            .any(|l| l.contains(&group) && l.contains("Stable") && l.contains(&topic)),
        "{list}"
    );
    running.stop().await;
    // A mistyped group: not found, with the near name.
    let o = kjob(
        &config,
        &["groups", "describe", "--group", &format!("{group}z")],
    );
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(
        o.stderr.contains(&format!("did you mean `{group}`")),
        "{}",
        o.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_plan_counts_today_and_after_and_names_what_to_delete_once_drained() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("plan");
    let made = kjob(
        &config,
        &[
            "topics",
            "create",
            "--topic",
            &topic,
            "--partitions",
            "2",
            "--tiers",
            "5s,30s",
            "--delays",
            "--execute",
        ],
    );
    assert_eq!(made.code, 0, "{}{}", made.stdout, made.stderr);
    let delayed = format!("{topic}.delay.1m");
    wait_topics_exist(&config, std::slice::from_ref(&delayed), "the delay topics").await;
    produce_raw(&config, &delayed, 0, "k", b"left behind");
    // The route no longer takes delayed jobs, and gets a third tier.
    let o = kjob(
        &config,
        &["topics", "plan", "--topic", &topic, "--tiers", "5s,30s,5m"],
    );
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let line = |t: &str| {
        o.stdout
            .lines()
            .find(|l| l.contains(&format!("{t} ")))
            .unwrap_or_else(|| panic!("no row for {t}: {}", o.stdout))
            .to_string()
    };
    assert!(
        line(&format!("{topic}.retry.5m")).contains("create"),
        "{}",
        o.stdout
    );
    assert!(
        line(&format!("{topic}.retry.30s")).contains("keep"),
        "{}",
        o.stdout
    );
    assert!(
        line(&delayed).contains("delete once drained (1 records stored)"),
        "{}",
        o.stdout
    );
    assert!(
        line(&format!("{topic}.delay.1d")).contains("delete: drained"),
        "{}",
        o.stdout
    );
    // main + 2 tiers + 7 delay + dlq today; main + 3 tiers + dlq after.
    assert!(
        o.stdout.contains("today: 11 topics, 22 partitions")
            && o.stdout.contains("after: 5 topics, 10 partitions"),
        "{}",
        o.stdout
    );
    let j = kjob(&config, &["topics", "plan", "--topic", &topic, "--json"]);
    let v = parse_json("kjob topics plan --json", &j.stdout);
    assert_eq!(v["after"]["topics"], 6, "{v}");
    let bad = kjob(
        &config,
        &["topics", "plan", "--topic", &topic, "--delays-on", "nope"],
    );
    assert_eq!(bad.code, 2, "{}{}", bad.stdout, bad.stderr);
    assert!(
        bad.stderr
            .contains("`nope` is not one of the --topic routes"),
        "{}",
        bad.stderr
    );
}
