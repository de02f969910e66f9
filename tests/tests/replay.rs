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
        .handle_on::<TestJob, _>(topic, move |job: TestJob, _c: JobContext| {
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
        err.contains("live member") && err.contains("rdkafka"),
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
