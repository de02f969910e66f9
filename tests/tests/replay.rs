//! Replay by offset reset against the real stack, through the `kjob` CLI:
//! exact ranges by datetime, dry runs, refusal while live, shadow groups,
//! and bad input that changes nothing.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use kjob::{JobContext, JobError, KafkaConfig, Producer, Worker};
use kjob_integration_tests::*;

fn kjob(config: &KafkaConfig, args: &[&str]) -> (i32, String, String) {
    let o = run_kjob(env!("CARGO_BIN_EXE_kjob-cli"), config, args);
    (o.code, o.stdout, o.stderr)
}

fn start_worker(
    config: &KafkaConfig,
    topic: &str,
    group: &str,
    seen: Arc<Mutex<Vec<i64>>>,
) -> Running {
    let w = Worker::builder(config.clone(), group)
        .handle_on(topic, move |job: TestJob, _c: JobContext| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(job.seq);
                Ok::<(), JobError>(())
            }
        })
        .commit_interval(Duration::from_millis(200))
        .build()
        .unwrap();
    start(w)
}

async fn drain(config: &KafkaConfig, topic: &str, group: &str, n: usize) -> Vec<i64> {
    let seen: Arc<Mutex<Vec<i64>>> = Default::default();
    let w = start_worker(config, topic, group, seen.clone());
    eventually(Duration::from_secs(30), "jobs handled", || {
        seen.lock().unwrap().len() >= n
    })
    .await;
    let ends = end_offsets(config, topic, 2);
    eventually(Duration::from_secs(30), "committed", || {
        committed_offsets(config, group, topic, 2)
            .iter()
            .zip(&ends)
            .all(|(c, e)| *e == 0 || *c == Some(*e))
    })
    .await;
    w.stop().await;
    let out = seen.lock().unwrap().clone();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_by_datetime_dry_run_refusal_and_shadow_group() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("replay");
    let group = unique("g");
    create_topic(&config, &topic, 2).await;
    let producer = Producer::new(&config).unwrap();
    for i in 0..20 {
        producer
            .enqueue_to(&topic, &TestJob::ok(format!("k{i}"), i))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let cut = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for i in 20..35 {
        producer
            .enqueue_to(&topic, &TestJob::ok(format!("k{i}"), i))
            .await
            .unwrap();
    }
    let first = drain(&config, &topic, &group, 35).await;
    assert_eq!(first.len(), 35);
    let before = committed_offsets(&config, &group, &topic, 2);

    // Dry run (the default): a table, nothing written.
    let (code, out, err) = kjob(
        &config,
        &[
            "replay",
            "--group",
            &group,
            "--topic",
            &topic,
            "--to-datetime",
            &cut,
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("dry run: 15 job(s) would be handled again"),
        "{out}"
    );
    assert_eq!(
        committed_offsets(&config, &group, &topic, 2),
        before,
        "dry run changed nothing"
    );

    // Refused while a member is live, naming it.
    let live_seen: Arc<Mutex<Vec<i64>>> = Default::default();
    let live = start_worker(&config, &topic, &group, live_seen.clone());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (code, out, err) = kjob(
        &config,
        &[
            "replay",
            "--group",
            &group,
            "--topic",
            &topic,
            "--to-datetime",
            &cut,
            "--execute",
        ],
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        // The member is named by its client id (kjob-<group>-<host>-<pid>).
        err.contains("live member") && err.contains(&format!("kjob-{group}-")),
        "{err}"
    );
    live.stop().await;
    assert_eq!(
        committed_offsets(&config, &group, &topic, 2),
        before,
        "refusal changed nothing"
    );

    // Shadow replay of everything: the live group is untouched.
    let shadow = unique("shadow");
    let (code, out, err) = kjob(
        &config,
        &[
            "replay",
            "--group",
            &group,
            "--topic",
            &topic,
            "--to-earliest",
            "--shadow-group",
            &shadow,
            "--execute",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let replayed: HashSet<i64> = drain(&config, &topic, &shadow, 35)
        .await
        .into_iter()
        .collect();
    assert_eq!(
        replayed.len(),
        35,
        "the shadow group handled the whole range"
    );
    assert_eq!(
        committed_offsets(&config, &group, &topic, 2),
        before,
        "live group untouched"
    );

    // The real replay: exactly the jobs at or after the cut.
    let (code, out, err) = kjob(
        &config,
        &[
            "replay",
            "--group",
            &group,
            "--topic",
            &topic,
            "--to-datetime",
            &cut,
            "--execute",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let again: HashSet<i64> = drain(&config, &topic, &group, 15)
        .await
        .into_iter()
        .collect();
    assert_eq!(again, (20..35).collect::<HashSet<i64>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_replay_input_is_refused_and_changes_nothing() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("replay.bad");
    let group = unique("g");
    create_topic(&config, &topic, 2).await;
    let producer = Producer::new(&config).unwrap();
    for i in 0..6 {
        producer
            .enqueue_to(&topic, &TestJob::ok(format!("k{i}"), i))
            .await
            .unwrap();
    }
    drain(&config, &topic, &group, 6).await;
    let before = committed_offsets(&config, &group, &topic, 2);
    let future = humantime::format_rfc3339_seconds(SystemTime::now() + Duration::from_secs(3600))
        .to_string();
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (
            vec![
                "--group",
                "no-such-group-xyz",
                "--topic",
                &topic,
                "--to-earliest",
            ],
            3,
            "unknown",
        ),
        (
            vec![
                "--group",
                &group,
                "--topic",
                "no.such.topic.xyz",
                "--to-earliest",
            ],
            3,
            "does not exist",
        ),
        (
            vec![
                "--group",
                &group,
                "--topic",
                &topic,
                "--to-datetime",
                &future,
            ],
            2,
            "future",
        ),
        (
            vec!["--group", &group, "--topic", &topic, "--to-offset", "9999"],
            2,
            "beyond the end",
        ),
        (
            vec![
                "--group",
                &group,
                "--topic",
                &topic,
                "--by-duration",
                "fortnight-ish",
            ],
            2,
            "--by-duration",
        ),
        (
            vec![
                "--group",
                &group,
                "--topic",
                &topic,
                "--to-datetime",
                "tuesday",
            ],
            2,
            "--to-datetime",
        ),
        (
            vec![
                "--group",
                &group,
                "--topic",
                &topic,
                "--partitions",
                "7",
                "--to-earliest",
            ],
            2,
            "partition 7",
        ),
        (vec!["--group", &group, "--topic", &topic], 2, "required"),
        (
            vec![
                "--group",
                &group,
                "--topic",
                &topic,
                "--to-earliest",
                "--to-latest",
            ],
            2,
            "cannot be used",
        ),
    ];
    for (args, code, needle) in cases {
        let mut full = vec!["replay"];
        full.extend(args.iter().copied());
        full.push("--execute");
        let (got, out, err) = kjob(&config, &full);
        assert_eq!(got, code, "{full:?}: {out}{err}");
        assert!(
            err.contains(needle),
            "{full:?}: stderr lacks `{needle}`: {err}"
        );
    }
    assert_eq!(
        committed_offsets(&config, &group, &topic, 2),
        before,
        "nothing changed"
    );
}

/// `t` (epoch ms) as Kafka's tool writes datetimes: UTC with `Z`, with an
/// offset, and the local form without one (which Kafka reads as UTC).
fn datetimes(ms: i64) -> Vec<String> {
    let utc =
        humantime::format_rfc3339_millis(SystemTime::UNIX_EPOCH + Duration::from_millis(ms as u64))
            .to_string(); // 2026-12-01T09:00:00.123Z
    let local = utc.trim_end_matches('Z').to_string();
    // The same instant one hour east: +01:00 shows the hour plus one.
    let plus_one = humantime::format_rfc3339_millis(
        SystemTime::UNIX_EPOCH + Duration::from_millis(ms as u64 + 3_600_000),
    )
    .to_string()
    .trim_end_matches('Z')
    .to_string()
        + "+01:00";
    vec![utc, local, plus_one]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_takes_kafkas_iso_durations_and_datetimes_with_offsets() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("replay.iso");
    let group = unique("g");
    create_topic(&config, &topic, 1).await;
    for i in 0..4 {
        produce_raw(&config, &topic, 0, &format!("k{i}"), b"x");
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let cut = kjob::clock::now_ms();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for i in 4..7 {
        produce_raw(&config, &topic, 0, &format!("k{i}"), b"x");
    }
    commit_offsets(&config, &group, &topic, &[(0, 7)]);
    // Every form of the cut names the same target: 3 jobs again.
    for at in datetimes(cut) {
        let (code, out, err) = kjob(
            &config,
            &[
                "replay",
                "--group",
                &group,
                "--topic",
                &topic,
                "--to-datetime",
                &at,
            ],
        );
        assert_eq!(code, 0, "--to-datetime {at}: {out}{err}");
        assert!(
            out.contains("dry run: 3 job(s) would be handled again"),
            "--to-datetime {at}: {out}"
        );
        assert!(
            out.contains("target time"),
            "the time it resolved to: {out}"
        );
    }
    // ISO-8601 durations as Java's Duration.parse reads them.
    for (d, jobs) in [("PT1H", 7), ("P1DT3H", 7), ("PT0.5S", 0), ("1h", 7)] {
        let (code, out, err) = kjob(
            &config,
            &[
                "replay",
                "--group",
                &group,
                "--topic",
                &topic,
                "--by-duration",
                d,
                "--json",
            ],
        );
        assert_eq!(code, 0, "--by-duration {d}: {out}{err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON");
        assert_eq!(v["replayed"], jobs, "--by-duration {d}: {v}");
    }
    // A negative one points into the future: refused, naming --to-latest.
    let (code, _, err) = kjob(
        &config,
        &[
            "replay",
            "--group",
            &group,
            "--topic",
            &topic,
            "--by-duration",
            "-PT30M",
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--to-latest") && err.contains("future"),
        "{err}"
    );
    let (code, _, err) = kjob(
        &config,
        &[
            "replay",
            "--group",
            &group,
            "--topic",
            &topic,
            "--by-duration",
            "P1Y",
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("PT2H"), "names the forms: {err}");
    assert_eq!(committed_offsets(&config, &group, &topic, 1), vec![Some(7)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_export_writes_kafkas_csv_and_from_file_undoes_the_reset() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("replay.undo");
    let group = unique("g");
    create_topic(&config, &topic, 2).await;
    for i in 0..10 {
        produce_raw(&config, &topic, i % 2, &format!("k{i}"), b"x");
    }
    commit_offsets(&config, &group, &topic, &[(0, 3), (1, 4)]);
    let file = std::env::temp_dir().join(format!("{}.csv", unique("offsets")));
    let path = file.to_str().unwrap_or_default();
    let (code, out, err) = kjob(
        &config,
        &[
            "replay",
            "--group",
            &group,
            "--topic",
            &topic,
            "--to-earliest",
            "--export",
            path,
            "--execute",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("--from-file"), "says how to undo: {out}");
    let csv = std::fs::read_to_string(&file).expect("the export");
    assert_eq!(csv, format!("{topic},0,3\n{topic},1,4\n"));
    assert_eq!(
        committed_offsets(&config, &group, &topic, 2),
        vec![Some(0), Some(0)]
    );
    // Kafka's own tool reads the file (a dry run, so nothing moves).
    let kafka = std::process::Command::new(repo_root().join("dev"))
        .args([
            "kafka-class",
            "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
            "--bootstrap-server",
            &config.bootstrap_servers,
            "--group",
            &group,
            "--reset-offsets",
            "--from-file",
            path,
            "--dry-run",
        ])
        .output()
        .expect("running ConsumerGroupCommand");
    let said = String::from_utf8_lossy(&kafka.stdout);
    assert!(
        kafka.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&kafka.stderr)
    );
    let mut rows: Vec<(String, String)> = said
        .lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.len() >= 4 && cols[1] == topic)
                .then(|| (cols[2].to_string(), cols[3].to_string()))
        })
        .collect();
    rows.sort();
    assert_eq!(
        rows,
        vec![("0".to_string(), "3".to_string()), ("1".into(), "4".into())],
        "Kafka's tool plans the same offsets: {said}"
    );
    // --from-file: a dry run, then the undo.
    let (code, out, err) = kjob(&config, &["replay", "--group", &group, "--from-file", path]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("dry run"), "{out}");
    assert_eq!(
        committed_offsets(&config, &group, &topic, 2),
        vec![Some(0), Some(0)]
    );
    let (code, out, err) = kjob(
        &config,
        &[
            "replay",
            "--group",
            &group,
            "--from-file",
            path,
            "--execute",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        committed_offsets(&config, &group, &topic, 2),
        vec![Some(3), Some(4)]
    );
    // A file kjob cannot use: named, nothing changed.
    let bad = std::env::temp_dir().join(format!("{}.csv", unique("bad")));
    std::fs::write(&bad, format!("{topic},0,1\n{topic},zero,1\n")).expect("writing");
    let (code, _, err) = kjob(
        &config,
        &[
            "replay",
            "--group",
            &group,
            "--from-file",
            bad.to_str().unwrap_or_default(),
            "--execute",
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("line 2"), "{err}");
    std::fs::write(&bad, format!("{topic},7,1\n")).expect("writing");
    let (code, _, err) = kjob(
        &config,
        &[
            "replay",
            "--group",
            &group,
            "--from-file",
            bad.to_str().unwrap_or_default(),
            "--execute",
        ],
    );
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("partition 7"), "{err}");
    assert_eq!(
        committed_offsets(&config, &group, &topic, 2),
        vec![Some(3), Some(4)]
    );
}

/// `--include-tiers` counts jobs as the main topic's records, and the
/// tiers' records (retries of those jobs) beside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_with_its_tiers_counts_jobs_not_records() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("replaytiers");
    let group = unique("g");
    let (code, out, err) = kjob(
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
    assert_eq!(code, 0, "{out}{err}");
    let tier = kjob::retry::tier_topic(&topic, Duration::from_secs(1));
    for i in 0..4 {
        produce_raw(&config, &topic, 0, &format!("k{i}"), b"job");
    }
    for i in 0..3 {
        produce_raw(&config, &tier, 0, &format!("k{i}"), b"retry");
    }
    commit_offsets(&config, &group, &topic, &[(0, 4)]);
    commit_offsets(&config, &group, &tier, &[(0, 3)]);
    let (code, out, err) = kjob(
        &config,
        &[
            "replay",
            "--group",
            &group,
            "--topic",
            &topic,
            "--to-earliest",
            "--include-tiers",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(
            "dry run: 4 job(s) (7 records, 3 of them in retry tiers) would be handled again"
        ),
        "{out}"
    );
    let (code, out, _) = kjob(
        &config,
        &[
            "replay",
            "--group",
            &group,
            "--topic",
            &topic,
            "--to-earliest",
            "--include-tiers",
            "--json",
        ],
    );
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON");
    assert_eq!(
        (
            v["jobs"].as_i64(),
            v["tier_records"].as_i64(),
            v["replayed"].as_i64()
        ),
        (Some(4), Some(3), Some(7))
    );
}
