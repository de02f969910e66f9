//! Contracts across deploys, against the real registry and Kafka: the
//! subject is the topic's everywhere (`kjob schema check | register`,
//! `Producer::prepare_to`, the worker's check at start), and the deploy
//! gate over the jobs still waiting (`kjob schema check --in-flight`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use kjob::codec::Codec;
use kjob::headers::JobHeaders;
use kjob::{Error, Job, JobContext, JobError, KafkaConfig, Producer, Worker};
use kjob_integration_tests::*;
use serde::{Deserialize, Serialize};

const KJOB: &str = env!("CARGO_BIN_EXE_kjob-cli");

/// v1 of the newcomer's contract: an order id and an amount.
const V1: &str = r#"{"type":"record","name":"NewcomerInvoice","namespace":"kjob.test","fields":[
 {"name":"order_id","type":"string"},{"name":"amount","type":"long"}]}"#;
/// v2 adds a required field (no default): it cannot read v1's records.
const V2_REQUIRED: &str = r#"{"type":"record","name":"NewcomerInvoice","namespace":"kjob.test","fields":[
 {"name":"order_id","type":"string"},{"name":"amount","type":"long"},{"name":"currency","type":"string"}]}"#;
/// The same field with a default: reads v1's records.
const V2_DEFAULTED: &str = r#"{"type":"record","name":"NewcomerInvoice","namespace":"kjob.test","fields":[
 {"name":"order_id","type":"string"},{"name":"amount","type":"long"},{"name":"currency","type":"string","default":"EUR"}]}"#;

#[derive(Clone, Debug, Serialize, Deserialize)]
struct InvoiceV1 {
    order_id: String,
    amount: i64,
}
impl Job for InvoiceV1 {
    const NAME: &'static str = "invoices.generate";
    const VERSION: u32 = 1;
    const SCHEMA: &'static str = V1;
    fn key(&self) -> String {
        self.order_id.clone()
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct InvoiceV2 {
    order_id: String,
    amount: i64,
    currency: String,
}
impl Job for InvoiceV2 {
    const NAME: &'static str = "invoices.generate";
    const VERSION: u32 = 2;
    const SCHEMA: &'static str = V2_REQUIRED;
    fn key(&self) -> String {
        self.order_id.clone()
    }
}

fn kjob(config: &KafkaConfig, args: &[&str]) -> CliOut {
    run_kjob(KJOB, config, args)
}

/// A `schemas/` directory holding `<name>.v<N>.avsc` files.
fn schemas(files: &[(&str, u32, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(unique("kjob-schemas"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for (name, version, text) in files {
        std::fs::write(dir.join(format!("{name}.v{version}.avsc")), text)
            .expect("writing a contract file");
    }
    dir
}

fn path(dir: &Path) -> &str {
    dir.to_str().expect("a UTF-8 temp path")
}

async fn handle_v2(_job: InvoiceV2, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_on_another_topic_is_checked_under_that_topics_subject() {
    init_logging();
    let config = ensure_stack();
    // The newcomer's case: contract `<u>.invoices.generate` on topic
    // `<u>.newcomer.invoices.generate` (handle_on), v1 enqueued, then a v2
    // that adds a required field.
    let u = unique("contracts");
    let contract = format!("{u}.invoices.generate");
    let topic = format!("{u}.newcomer.invoices.generate");
    let subject = format!("{topic}-value");
    create_topic(&config, &topic, 1).await;
    let producer = Producer::new(&config).expect("producer");
    producer
        .enqueue_to(
            &topic,
            &InvoiceV1 {
                order_id: "o-1".into(),
                amount: 5,
            },
        )
        .await
        .expect("v1 enqueued");
    let v2 = schemas(&[(&contract, 2, V2_REQUIRED)]);

    // The command the newcomer ran, with no flag: the contract's own
    // subject is empty, the registry holds the record under the topic's,
    // so it warns, checks there too and exits 1.
    let plain = kjob(&config, &["schema", "check", "--dir", path(&v2)]);
    assert_eq!(plain.code, 1, "{}{}", plain.stdout, plain.stderr);
    assert!(
        plain.stderr.contains("warning") && plain.stderr.contains(&subject),
        "{}",
        plain.stderr
    );
    assert!(
        plain.stdout.contains(&subject) && plain.stdout.contains("currency"),
        "{}",
        plain.stdout
    );

    // Named with --topic: the subject it used is printed, exit 1.
    let named = kjob(
        &config,
        &[
            "schema",
            "check",
            "--dir",
            path(&v2),
            "--topic",
            &topic,
            "--json",
        ],
    );
    assert_eq!(named.code, 1, "{}{}", named.stdout, named.stderr);
    let v: serde_json::Value = serde_json::from_str(named.stdout.trim()).expect("JSON");
    assert_eq!(v["contracts"][0]["subject"], subject.as_str());
    assert_eq!(v["contracts"][0]["found_by"], "--topic");
    assert_eq!(v["contracts"][0]["result"], "incompatible");

    // A compatible v2 passes under the same subject.
    let ok = schemas(&[(&contract, 2, V2_DEFAULTED)]);
    let passes = kjob(
        &config,
        &["schema", "check", "--dir", path(&ok), "--topic", &topic],
    );
    assert_eq!(passes.code, 0, "{}{}", passes.stdout, passes.stderr);

    // --topic with several contracts in the directory needs --contract.
    let two = schemas(&[(&contract, 2, V2_DEFAULTED), ("other.contract", 1, V1)]);
    let ambiguous = kjob(
        &config,
        &["schema", "check", "--dir", path(&two), "--topic", &topic],
    );
    assert_eq!(ambiguous.code, 2, "{}", ambiguous.stderr);
    assert!(
        ambiguous.stderr.contains("--contract"),
        "{}",
        ambiguous.stderr
    );

    // The producer checks the topic's subject when asked to prepare it.
    match producer.prepare_to::<InvoiceV2>(&topic).await {
        Err(Error::SchemaRejected {
            subject: s,
            message,
            ..
        }) => {
            assert_eq!(s, subject);
            assert!(message.contains("currency"), "{message}");
        }
        other => panic!("expected SchemaRejected, got {other:?}"),
    }

    // A worker whose reader cannot read the newest writer of its topic
    // refuses to start, naming the subject.
    let worker = Worker::builder(config.clone(), unique("g"))
        .handle_on(&topic, handle_v2)
        .build()
        .expect("built");
    let started = tokio::time::timeout(Duration::from_secs(60), worker.run()).await;
    match started {
        Ok(Err(Error::ReaderCannotRead {
            subject: s,
            writer_version,
            reason,
            ..
        })) => {
            assert_eq!(s, subject);
            assert_eq!(writer_version, 1);
            assert!(reason.contains("currency"), "{reason}");
        }
        other => panic!("expected ReaderCannotRead, got {other:?}"),
    }

    // Registering for a SQL-enqueued topic: --topic names the subject.
    let sql_topic = format!("{u}.sql.invoices.generate");
    let v1 = schemas(&[(&contract, 1, V1)]);
    let reg = kjob(
        &config,
        &[
            "schema",
            "register",
            "--dir",
            path(&v1),
            "--topic",
            &sql_topic,
        ],
    );
    assert_eq!(reg.code, 0, "{}", reg.stderr);
    assert!(
        reg.stdout.contains(&format!("-> {sql_topic}-value (id ")),
        "{}",
        reg.stdout
    );
}

/// Writes `n` v1 jobs straight into `topic` (a retry tier), framed with
/// the id v1 has under `main`'s subject, due in five minutes.
async fn park_v1(producer: &Producer, main: &str, topic: &str, n: usize) {
    let contract = producer
        .codec()
        .register::<InvoiceV1>(main)
        .await
        .expect("v1 registered");
    for i in 0..n {
        let job = InvoiceV1 {
            order_id: format!("o-{i}"),
            amount: 1,
        };
        let body = Codec::encode(&contract, &job).expect("encoded");
        let h = JobHeaders {
            job: Some(InvoiceV1::NAME.into()),
            id: Some(format!("j-{i}")),
            attempt: Some(2),
            due_at_ms: Some(kjob::dlq::now_ms() + 300_000),
            ..JobHeaders::default()
        };
        producer
            .send_raw(
                topic,
                Some(job.order_id.as_bytes()),
                Some(&body),
                h.to_owned_headers(),
            )
            .await
            .expect("parked in the tier");
    }
}

fn in_flight(config: &KafkaConfig, dir: &Path, main: &str, group: &str) -> CliOut {
    let dir = dir.to_str().expect("UTF-8");
    kjob(
        config,
        &[
            "schema",
            "check",
            "--in-flight",
            "--group",
            group,
            "--dir",
            dir,
            "--topic",
            main,
            // The subject check is not what this looks at.
            "--compatibility",
            "NONE",
            "--json",
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_flight_gate_names_the_tier_holding_jobs_the_new_reader_cannot_read() {
    init_logging();
    let config = ensure_stack();
    let main = unique("inflight");
    let group = unique("g");
    let made = kjob(
        &config,
        &[
            "topics",
            "create",
            "--topic",
            &main,
            "--partitions",
            "1",
            "--tiers",
            "5m",
            "--execute",
        ],
    );
    assert_eq!(made.code, 0, "{}", made.stderr);
    let tier = kjob::retry::tier_topic(&main, Duration::from_secs(300));
    let producer = Producer::new(&config).expect("producer");
    park_v1(&producer, &main, &tier, 3).await;
    // Two more on the main topic, which the group never read.
    for i in 0..2 {
        producer
            .enqueue_to(
                &main,
                &InvoiceV1 {
                    order_id: format!("m-{i}"),
                    amount: 1,
                },
            )
            .await
            .expect("enqueued");
    }

    // v3 adds a required field: the gate exits 1 and names the tier.
    let contract = InvoiceV1::NAME;
    let breaking = schemas(&[(contract, 3, V2_REQUIRED)]);
    let out = in_flight(&config, &breaking, &main, &group);
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("JSON");
    assert_eq!(v["unreadable_waiting"], 5, "{v}");
    let rows = v["in_flight"].as_array().cloned().unwrap_or_default();
    let row = |topic: &str| {
        rows.iter()
            .find(|r| r["topic"] == topic)
            .cloned()
            .unwrap_or_else(|| panic!("no row for {topic}: {rows:?}"))
    };
    assert_eq!(row(&tier)["jobs"], 3);
    assert_eq!(row(&tier)["role"], "retry tier");
    assert_eq!(row(&tier)["readable"], false);
    assert!(
        row(&tier)["result"]
            .as_str()
            .unwrap_or_default()
            .contains("currency"),
        "{rows:?}"
    );
    assert_eq!(row(&main)["jobs"], 2);
    assert!(out.stderr.contains("5 waiting jobs"), "{}", out.stderr);

    // With a default, v3 reads them all: exit 0.
    let compatible = schemas(&[(contract, 3, V2_DEFAULTED)]);
    let out = in_flight(&config, &compatible, &main, &group);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("JSON");
    assert_eq!(v["unreadable_waiting"], 0);
    assert!(
        v["in_flight"]
            .as_array()
            .is_some_and(|r| r.iter().all(|r| r["readable"] == true)),
        "{v}"
    );

    // --in-flight without a group or a model is a usage error.
    let dir = &compatible.to_str().expect("UTF-8");
    let bare = kjob(&config, &["schema", "check", "--in-flight", "--dir", dir]);
    assert_eq!(bare.code, 2, "{}", bare.stderr);
    assert!(bare.stderr.contains("--group"), "{}", bare.stderr);
}
