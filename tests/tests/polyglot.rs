//! The SQL enqueue (`kjob.enqueue`) from Python, Node, PHP and Java, each
//! with its ordinary PostgreSQL driver, against the real stack: the
//! language's script (`tests/polyglot/<lang>/enqueue.*`, protocol in
//! `tests/polyglot/README.md`) runs as a subprocess, a kjob relay publishes
//! and a real kjob worker handles the jobs. Per language:
//!
//! * the committed transaction's jobs are each handled exactly once, and its
//!   order row is there;
//! * the rolled-back transaction publishes nothing (no row, no record, no
//!   run) and leaves no order row;
//! * the job whose `seq` is a string (the contract says long) is
//!   dead-lettered to `<topic>.dlq` (class `outbox.encode`, the JSON as
//!   payload, `seq` named in the error) and the job of the same key after it
//!   still runs;
//! * the delayed job runs no earlier than its `run_at`;
//! * an insert-time check (a job that is not an object) reaches the driver
//!   as an error naming what to pass.
//!
//! Also the direct-to-Kafka recipes (`tests/polyglot/<lang>/direct.*`): jobs
//! produced with each language's Confluent-compatible Avro serializer,
//! without kjob's headers, are handled once each.
//!
//! The tools come from `./dev polyglot` (run by `./dev test`) in
//! `.stack/polyglot`; a missing one fails the test naming it, never skips.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use kjob::headers;
use kjob_integration_tests::sql_enqueue::SqlFixture;
use kjob_integration_tests::*;
use rdkafka::message::Message;

fn polyglot_dir() -> PathBuf {
    std::env::var_os("KJOB_POLYGLOT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".stack/polyglot"))
}

fn scripts() -> PathBuf {
    repo_root().join("tests/polyglot")
}

/// Fails (never skips) when `what` is missing, saying how to get it.
fn require(ok: bool, what: &str) {
    assert!(
        ok,
        "{what} is missing: run `./dev polyglot` (./dev test runs it) to install the other-language test tools into .stack/polyglot"
    );
}

fn on_path(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The command running `lang`'s script `name` (`enqueue` or `direct`).
fn command(lang: &str, name: &str) -> Command {
    let dir = polyglot_dir();
    match lang {
        "python" => {
            require(on_path("python3"), "python3");
            require(
                dir.join("python/.complete").exists(),
                "the Python packages (psycopg, confluent-kafka) in .stack/polyglot/python",
            );
            let mut c = Command::new("python3");
            c.arg(scripts().join(format!("python/{name}.py")))
                .env("PYTHONPATH", dir.join("python"));
            c
        }
        "node" => {
            require(on_path("node"), "node");
            require(
                dir.join("node/.complete").exists(),
                "the Node packages (pg, @confluentinc/kafka-javascript) in .stack/polyglot/node",
            );
            let mut c = Command::new("node");
            c.arg(scripts().join(format!("node/{name}.js")))
                .env("NODE_PATH", dir.join("node/node_modules"));
            c
        }
        "php" => {
            let pdo = Command::new("php").arg("-m").output().is_ok_and(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .any(|l| l == "pdo_pgsql")
            });
            require(pdo, "php with pdo_pgsql (Debian's php-cli and php-pgsql)");
            let mut c = Command::new("php");
            c.arg(scripts().join(format!("php/{name}.php")));
            c
        }
        "java" => {
            require(on_path("java"), "java");
            require(
                dir.join("java/.complete").exists(),
                "the Java jars (postgresql JDBC, Apicurio serde) in .stack/polyglot/java/lib",
            );
            let class = if name == "enqueue" {
                "Enqueue"
            } else {
                "Direct"
            };
            let mut c = Command::new("java");
            c.args([
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-Xshare:auto",
                "-cp",
            ])
            .arg(format!("{}/java/lib/*", dir.display()))
            .arg(scripts().join(format!("java/{class}.java")));
            c
        }
        other => panic!("no such language: {other}"),
    }
}

/// How long one script may take. A script that waits on a socket forever
/// (seen once: a registry client without a request timeout) would otherwise
/// hang the whole suite; it is killed, and the test fails with its output.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(240);

/// The exit code a direct recipe uses when its client stalled or failed
/// before it sent anything (seen once: the Node recipe, silent for 240 s on
/// a loaded 2-core CI machine): running it again cannot duplicate a job.
const STALLED_BEFORE_SEND: i32 = 3;

/// Runs a script, failing the test with its output unless it succeeds within
/// [`SCRIPT_TIMEOUT`], and parses the JSON line it prints last.
fn run(c: Command, what: &str) -> serde_json::Value {
    match run_once(c, what) {
        Ok(v) => v,
        Err(e) => panic!("{}", e.1),
    }
}

/// [`run`], but a script that exits with [`STALLED_BEFORE_SEND`] is run once
/// more (with a note in the test's output); any other failure, or a second
/// stall, fails the test.
fn run_allowing_one_stall(mut make: impl FnMut() -> Command, what: &str) -> serde_json::Value {
    match run_once(make(), what) {
        Ok(v) => v,
        Err((Some(STALLED_BEFORE_SEND), msg)) => {
            println!(
                "{what} stalled or failed before sending anything; running it once more:\n{msg}"
            );
            run(make(), what)
        }
        Err(e) => panic!("{}", e.1),
    }
}

/// One run of a script: its last JSON line, or its exit code (if it exited)
/// and a message with its output.
fn run_once(mut c: Command, what: &str) -> Result<serde_json::Value, (Option<i32>, String)> {
    use std::io::Read;
    use std::process::Stdio;
    let started = std::time::Instant::now();
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    // Both pipes are drained while the script runs, so a chatty script
    // never blocks on a full pipe.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out_reader = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err_reader = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() < SCRIPT_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Err(e) => panic!("{what}: waiting for it: {e}"),
        }
    };
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    let Some(status) = status else {
        return Err((None, format!("{what} did not finish within {SCRIPT_TIMEOUT:?} and was killed; its output so far:\n{stdout}\n{stderr}")));
    };
    if !status.success() {
        return Err((
            status.code(),
            format!("{what} failed ({status}):\n{stdout}\n{stderr}"),
        ));
    }
    println!("{what}: {:.1?}", started.elapsed());
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("{what} printed no JSON line:\n{stdout}\n{stderr}"));
    Ok(serde_json::from_str(line).unwrap_or_else(|e| panic!("{what}: {e}: {line}")))
}

fn ids(v: &serde_json::Value, field: &str) -> Vec<String> {
    v[field]
        .as_array()
        .unwrap_or_else(|| panic!("no array `{field}` in {v}"))
        .iter()
        .map(|x| x.as_str().unwrap_or_default().to_string())
        .collect()
}

fn id(v: &serde_json::Value, field: &str) -> String {
    v[field]
        .as_str()
        .unwrap_or_else(|| panic!("no string `{field}` in {v}"))
        .to_string()
}

async fn sql_enqueue_from(lang: &str) {
    let fx = SqlFixture::new(lang).await;
    let orders = format!("{}_orders", fx.table.name());
    fx.client
        .batch_execute(&format!(
            "CREATE TABLE {orders} (order_id text PRIMARY KEY, lang text NOT NULL)"
        ))
        .await
        .expect("creating the app's own table");
    let seq = 1_000;
    let mut c = command(lang, "enqueue");
    c.env("KJOB_DATABASE_URL", &fx.url)
        .env("KJOB_SQL_SCHEMA", fx.schema())
        .env("KJOB_TEST_TOPIC", &fx.topic)
        .env("KJOB_APP_TABLE", &orders)
        .env("KJOB_TEST_SEQ", seq.to_string());
    let out = run(c, &format!("{lang} enqueue script"));

    // Committed: each job handled exactly once, with the id the call returned.
    let committed = ids(&out, "committed");
    assert_eq!(committed.len(), 4, "{out}");
    let seqs: Vec<i64> = (seq..seq + 4).collect();
    let bad_follower = seq + 21;
    let delayed = seq + 30;
    let mut all = seqs.clone();
    all.extend([bad_follower, delayed]);
    fx.wait_handled(&all, Duration::from_secs(60)).await;
    fx.wait_all_sent(Duration::from_secs(30)).await;
    // Time for a duplicate to show up, were there one.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (s, want) in seqs.iter().zip(&committed) {
        let runs = fx.runs(*s);
        assert_eq!(runs.len(), 1, "seq {s} ran {} times: {runs:?}", runs.len());
        assert_eq!(
            &runs[0].id, want,
            "seq {s} carries the id kjob.enqueue returned"
        );
    }
    // The key's commit order is its run order (py-a: seq, then seq + 2).
    let a_first = fx.runs(seq)[0].at_ms;
    let a_second = fx.runs(seq + 2)[0].at_ms;
    assert!(a_first <= a_second, "one key's jobs run in enqueue order");
    let order_rows: i64 = fx
        .client
        .query_one(&format!("SELECT count(*) FROM {orders}"), &[])
        .await
        .expect("counting orders")
        .get(0);
    assert_eq!(order_rows, 1, "the committed order row only");

    // Rolled back: nothing anywhere.
    let rolled = ids(&out, "rolled_back");
    assert_eq!(rolled.len(), 2, "{out}");
    for s in [seq + 10, seq + 11] {
        assert!(fx.runs(s).is_empty(), "rolled-back seq {s} ran");
    }
    let rows: i64 = fx
        .client
        .query_one(
            &format!(
                "SELECT count(*) FROM {} WHERE job_id = ANY($1)",
                fx.table.name()
            ),
            &[&rolled],
        )
        .await
        .expect("counting rows")
        .get(0);
    assert_eq!(rows, 0, "no outbox row of the rolled-back transaction");
    let main = read_all(&fx.config, &fx.topic);
    let in_kafka: Vec<String> = main
        .iter()
        .filter_map(|m| headers::find(m.headers(), headers::ID).map(str::to_string))
        .collect();
    for r in &rolled {
        assert!(!in_kafka.contains(r), "rolled-back job {r} reached Kafka");
    }

    // The bad row: dead-lettered with the field named; its key moved on.
    let bad = id(&out, "bad");
    let dlq = read_all(&fx.config, &format!("{}.dlq", fx.topic));
    let letter = dlq
        .iter()
        .find(|m| headers::find(m.headers(), headers::ID) == Some(bad.as_str()))
        .unwrap_or_else(|| {
            panic!(
                "job {bad} is not in {}.dlq ({} records)",
                fx.topic,
                dlq.len()
            )
        });
    let h = |name: &str| {
        headers::find(letter.headers(), name)
            .unwrap_or("")
            .to_string()
    };
    assert_eq!(h(headers::ERROR_CLASS), "outbox.encode");
    assert!(
        h(headers::ERROR).starts_with("seq: expected a long"),
        "the error names the field: {}",
        h(headers::ERROR)
    );
    assert_eq!(h(headers::PAYLOAD_FORMAT), "json");
    let payload: serde_json::Value =
        serde_json::from_slice(letter.payload().unwrap_or(b"")).expect("the payload is the JSON");
    assert_eq!(payload["seq"], serde_json::json!((seq + 20).to_string()));
    assert!(fx.runs(seq + 20).is_empty(), "the bad job never ran");
    assert_eq!(
        fx.runs(bad_follower).len(),
        1,
        "the bad row's key was not held back"
    );
    assert_eq!(fx.runs(bad_follower)[0].id, id(&out, "bad_follower"));

    // Delayed: not before run_at.
    let run_at = out["delayed_run_at_ms"].as_i64().unwrap_or(i64::MAX);
    let d = fx.runs(delayed);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].id, id(&out, "delayed"));
    assert!(
        d[0].at_ms >= run_at,
        "the delayed job ran {} ms before its run_at",
        run_at - d[0].at_ms
    );
    println!(
        "{lang}: delayed job ran {} ms after its run_at",
        d[0].at_ms - run_at
    );

    // The insert-time check reached the driver.
    let err = out["insert_error"].as_str().unwrap_or("");
    assert!(
        err.contains("must be a JSON object"),
        "{lang}: the driver reported: {err:?}"
    );
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn python_psycopg_enqueues_in_its_transaction() {
    sql_enqueue_from("python").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn node_pg_enqueues_in_its_transaction() {
    sql_enqueue_from("node").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn php_pdo_enqueues_in_its_transaction() {
    sql_enqueue_from("php").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn java_jdbc_enqueues_in_its_transaction() {
    sql_enqueue_from("java").await;
}

/// Jobs a language produced straight to Kafka with its Confluent-compatible
/// serializer, `n` of them (seq 2000..), the first half with a `kjob-id`
/// header and the rest with no kjob header at all: each handled once.
async fn direct_from(lang: &str) {
    let fx = SqlFixture::new(&format!("direct_{lang}")).await;
    let n = 20;
    let make = || {
        let mut c = command(lang, "direct");
        c.env("KJOB_BOOTSTRAP_SERVERS", &fx.config.bootstrap_servers)
            .env("KJOB_SCHEMA_REGISTRY_URL", &fx.config.schema_registry_url)
            .env("KJOB_TEST_TOPIC", &fx.topic)
            .env("KJOB_TEST_SEQ", "2000")
            .env("KJOB_TEST_COUNT", n.to_string())
            .env(
                "KJOB_SCHEMA",
                include_str!("../../schemas/kjob.test.job.v1.avsc"),
            );
        c
    };
    let out = run_allowing_one_stall(make, &format!("{lang} direct recipe"));
    assert_eq!(out["produced"], serde_json::json!(n), "{out}");
    let seqs: Vec<i64> = (2000..2000 + n).collect();
    fx.wait_handled(&seqs, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut ids: HashMap<i64, String> = HashMap::new();
    for s in &seqs {
        let runs = fx.runs(*s);
        assert_eq!(runs.len(), 1, "{lang}: seq {s} ran {} times", runs.len());
        ids.insert(*s, runs[0].id.clone());
    }
    // With a kjob-id the job keeps it; without, kjob derives one from where
    // the record entered the route (<topic>:<partition>:<offset>).
    assert_eq!(ids[&2000], format!("{lang}-2000"));
    let last = ids[&(2000 + n - 1)].clone();
    assert!(
        last.starts_with(&format!("{}:", fx.topic)),
        "{lang}: a header-less job's id is derived: {last}"
    );
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn python_confluent_serializer_direct_to_kafka() {
    direct_from("python").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn node_confluent_serializer_direct_to_kafka() {
    direct_from("node").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn java_apicurio_serializer_direct_to_kafka() {
    direct_from("java").await;
}
