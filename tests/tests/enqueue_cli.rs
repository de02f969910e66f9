//! `kjob enqueue` through the real CLI binary against the real stack: a
//! JSON job encoded against the subject's latest schema, a file of JSON
//! lines, values that do not fit (refused with the field and the reason,
//! nothing written), and `--in` through delay topics made by
//! `kjob topics create --delays`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kjob::codec::Codec;
use kjob::headers::JobHeaders;
use kjob::{JobContext, JobError, KafkaConfig, Worker};
use kjob_integration_tests::*;
use rdkafka::message::Message;

fn kjob(config: &KafkaConfig, args: &[&str]) -> CliOut {
    run_kjob(env!("CARGO_BIN_EXE_kjob-cli"), config, args)
}

fn ok(config: &KafkaConfig, args: &[&str]) -> String {
    kjob_ok(env!("CARGO_BIN_EXE_kjob-cli"), config, args)
}

fn refused(config: &KafkaConfig, args: &[&str], needles: &[&str]) {
    fails_with(config, args, 1, needles)
}

fn fails_with(config: &KafkaConfig, args: &[&str], code: i32, needles: &[&str]) {
    let o = kjob(config, args);
    assert_eq!(
        o.code, code,
        "kjob {args:?} should fail with {code}: {}{}",
        o.stdout, o.stderr
    );
    for n in needles {
        assert!(o.stderr.contains(n), "stderr lacks `{n}`: {}", o.stderr);
    }
}

async fn decoded(
    codec: &Codec,
    config: &KafkaConfig,
    topic: &str,
) -> Vec<(String, serde_json::Value, JobHeaders)> {
    let mut out = Vec::new();
    for m in read_all(config, topic) {
        let json = codec.decode_to_json(m.payload()).await.expect("decodes");
        let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
        out.push((key, json, JobHeaders::parse(m.headers())));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_encodes_against_the_latest_schema_and_refuses_what_does_not_fit() {
    init_logging();
    let config = ensure_stack();
    let codec = Codec::from_config(&config).expect("codec");
    let topic = unique("enqueue");
    create_topic(&config, &topic, 2).await;

    // No schema yet: a clear error (not found), nothing written.
    fails_with(
        &config,
        &[
            "enqueue",
            "--topic",
            &topic,
            "--data",
            r#"{"key":"a","seq":1,"behaviour":"ok"}"#,
        ],
        3,
        &["no schema is registered", &format!("{topic}-value")],
    );
    codec
        .register::<TestJob>(&topic)
        .await
        .expect("registering the contract");

    let out = ok(
        &config,
        &[
            "enqueue",
            "--topic",
            &topic,
            "--key",
            "cust-1",
            "--data",
            r#"{"key":"cust-1","seq":7,"behaviour":"ok"}"#,
        ],
    );
    assert!(out.contains("enqueued"), "{out}");
    let records = decoded(&codec, &config, &topic).await;
    assert_eq!(records.len(), 1);
    let (key, json, headers) = &records[0];
    assert_eq!(key, "cust-1");
    assert_eq!(
        json,
        &serde_json::json!({"key":"cust-1","seq":7,"behaviour":"ok"})
    );
    assert!(
        headers.id.is_some() && headers.attempt == Some(1),
        "{headers:?}"
    );

    // A value that does not fit: the field and the reason, nothing written.
    refused(
        &config,
        &[
            "enqueue",
            "--topic",
            &topic,
            "--data",
            r#"{"key":"a","seq":"seven","behaviour":"ok"}"#,
        ],
        &["seq", "expected a long", "\"seven\"", "nothing was written"],
    );
    refused(
        &config,
        &[
            "enqueue",
            "--topic",
            &topic,
            "--data",
            r#"{"key":"a","behaviour":"ok"}"#,
        ],
        &["seq", "missing"],
    );
    refused(
        &config,
        &[
            "enqueue",
            "--topic",
            &topic,
            "--data",
            r#"{"key":"a","seq":1,"behaviour":"ok","colour":"red"}"#,
        ],
        &["colour", "no such field"],
    );

    // A file with one bad line among good ones: the whole file is refused.
    let dir = std::env::temp_dir().join(unique("kjob-enqueue"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let bad = dir.join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"key\":\"k1\",\"seq\":1,\"behaviour\":\"ok\"}\n\n{\"key\":\"k2\",\"seq\":2,\"behaviour\":\"ok\"}\n{\"key\":\"k3\",\"behaviour\":\"ok\"}\nnot json\n",
    )
    .expect("writing file");
    refused(
        &config,
        &[
            "enqueue",
            "--topic",
            &topic,
            "--data-file",
            bad.to_str().unwrap_or_default(),
            "--key-field",
            "key",
        ],
        &["line 4: field seq", "line 5: not JSON", "2 of 4"],
    );
    assert_eq!(
        decoded(&codec, &config, &topic).await.len(),
        1,
        "nothing of the bad file was written"
    );

    // A good file: every line, keyed by its field, in order per key.
    let good = dir.join("good.jsonl");
    let lines: Vec<String> = (0..100)
        .map(|i| {
            format!(
                "{{\"key\":\"k{}\",\"seq\":{i},\"behaviour\":\"ok\"}}",
                i % 5
            )
        })
        .collect();
    std::fs::write(&good, lines.join("\n")).expect("writing file");
    ok(
        &config,
        &[
            "enqueue",
            "--topic",
            &topic,
            "--data-file",
            good.to_str().unwrap_or_default(),
            "--key-field",
            "key",
        ],
    );
    let records = decoded(&codec, &config, &topic).await;
    assert_eq!(records.len(), 101);
    for (key, json, _) in &records[..] {
        assert_eq!(
            json["key"].as_str(),
            Some(key.as_str()),
            "keyed by its field"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_in_runs_the_job_after_the_delay() {
    init_logging();
    let config = ensure_stack();
    let codec = Codec::from_config(&config).expect("codec");
    let topic = unique("enqueue-in");
    let created = ok(
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
            "--delays",
            "--execute",
        ],
    );
    assert!(created.contains(&format!("{topic}.delay.1d")), "{created}");
    codec
        .register::<TestJob>(&topic)
        .await
        .expect("registering the contract");

    let ran: Arc<Mutex<Vec<(i64, i64)>>> = Arc::default();
    let seen = ran.clone();
    let worker = Worker::builder(config.clone(), unique("g"))
        .handle_on(&topic, move |_job: TestJob, ctx: JobContext| {
            let seen = seen.clone();
            async move {
                seen.lock()
                    .expect("lock")
                    .push((kjob::dlq::now_ms(), ctx.due_at_ms.unwrap_or(-1)));
                Ok::<(), JobError>(())
            }
        })
        .delayed_jobs(true)
        .build()
        .expect("worker");
    let running = start(worker);

    let before = kjob::dlq::now_ms();
    let out = ok(
        &config,
        &[
            "enqueue",
            "--topic",
            &topic,
            "--key",
            "a",
            "--in",
            "3s",
            "--data",
            r#"{"key":"a","seq":1,"behaviour":"ok"}"#,
        ],
    );
    assert!(out.contains(&format!("{topic}.delay.1s")), "{out}");
    eventually(Duration::from_secs(30), "the delayed job ran", || {
        !ran.lock().expect("lock").is_empty()
    })
    .await;
    let (at, due) = ran.lock().expect("lock")[0];
    assert!(
        due >= before + 3_000,
        "due {due} is at least 3 s after {before}"
    );
    assert!(at >= due, "ran {} ms early", due - at);
    println!("kjob enqueue --in 3s: ran {} ms after due", at - due);
    running.stop().await;

    // Longer than 30 days: a usage error before anything is written.
    fails_with(
        &config,
        &[
            "enqueue",
            "--topic",
            &topic,
            "--in",
            "31days",
            "--data",
            r#"{"key":"a","seq":2,"behaviour":"ok"}"#,
        ],
        2,
        &["30 days"],
    );
}
