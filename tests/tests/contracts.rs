//! Contracts across deploys, against the real registry and Kafka: the
//! subject is the topic's everywhere (`kjob schema check | register`,
//! `Producer::prepare_to`, the worker's check at start), and the deploy
//! gate over the jobs still waiting (`kjob schema check --in-flight`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kjob::codec::Codec;
use kjob::headers::JobHeaders;
use kjob::{Error, Job, JobContext, JobError, KafkaConfig, Producer, Worker};
use kjob_integration_tests::*;
use serde::{Deserialize, Serialize};

use crate::dashboard as support;
use support::{dashboard, session};

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

#[derive(Clone, Debug, Serialize, Deserialize)]
struct InvoiceV2Defaulted {
    order_id: String,
    amount: i64,
    currency: String,
}
impl Job for InvoiceV2Defaulted {
    const NAME: &'static str = "invoices.generate";
    const VERSION: u32 = 2;
    const SCHEMA: &'static str = V2_DEFAULTED;
    fn key(&self) -> String {
        self.order_id.clone()
    }
}

/// What one worker of the rolling deploy handled: the writer version of
/// each job (`kjob-version`).
type Seen = Arc<Mutex<Vec<Option<u32>>>>;

/// A worker of `group` on `topic` reading contract `J`; `poison-*` jobs
/// fail as invalid input and go to the DLQ.
fn deploy_worker<J: Job + Clone + HasId>(
    config: &KafkaConfig,
    topic: &str,
    group: &str,
    seen: Seen,
) -> Running {
    let w = Worker::builder(config.clone(), group)
        .handle_on(topic, move |job: J, ctx: JobContext| {
            let seen = seen.clone();
            async move {
                if job.id().starts_with("poison") {
                    return Err(JobError::invalid_input("cannot invoice this order"));
                }
                seen.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(ctx.version);
                Ok(())
            }
        })
        .metrics_endpoint("127.0.0.1:0".parse().expect("address"))
        .build()
        .expect("worker builds");
    start(w)
}

trait HasId {
    fn id(&self) -> &str;
}
impl HasId for InvoiceV1 {
    fn id(&self) -> &str {
        &self.order_id
    }
}
impl HasId for InvoiceV2Defaulted {
    fn id(&self) -> &str {
        &self.order_id
    }
}

/// `kjob_fields_dropped_total` of one worker, by writer version.
async fn dropped(running: &Running) -> Vec<(String, f64)> {
    let Some(addr) = running.stats.endpoint.get().copied() else {
        return Vec::new();
    };
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("body");
    text.lines()
        .filter(|l| l.starts_with("kjob_fields_dropped_total{"))
        .filter_map(|l| {
            let (labels, value) = l.rsplit_once(' ')?;
            let version = labels
                .split("writer_version=\"")
                .nth(1)?
                .split('"')
                .next()?;
            Some((version.to_string(), value.parse().ok()?))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_deploy_shows_what_each_check_answers() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("rolling");
    let group = unique("g");
    create_topic(&config, &topic, 2).await;
    let (old_producer, new_producer) = (
        Producer::new(&config).expect("producer"),
        Producer::new(&config).expect("producer"),
    );
    // v1 is registered before either worker starts (the old world).
    old_producer
        .prepare_to::<InvoiceV1>(&topic)
        .await
        .expect("v1");
    new_producer
        .prepare_to::<InvoiceV2Defaulted>(&topic)
        .await
        .expect("v2 is compatible");

    // Mid-deploy: an old (v1) and a new (v2) worker in one group.
    let (old_seen, new_seen): (Seen, Seen) = Default::default();
    let old = deploy_worker::<InvoiceV1>(&config, &topic, &group, old_seen.clone());
    let new = deploy_worker::<InvoiceV2Defaulted>(&config, &topic, &group, new_seen.clone());
    for w in [&old, &new] {
        let stats = w.stats.clone();
        eventually(Duration::from_secs(60), "both members assigned", || {
            stats.ready.load(std::sync::atomic::Ordering::Acquire)
        })
        .await;
    }
    // Both producers run: 20 v1 and 20 v2 jobs over both partitions, two
    // of each a poison that goes to the DLQ.
    for i in 0..20 {
        let id = |p: &str| match i {
            0 | 1 => format!("poison-{p}-{i}"),
            _ => format!("{p}-{i}"),
        };
        old_producer
            .enqueue_to(
                &topic,
                &InvoiceV1 {
                    order_id: id("a"),
                    amount: i,
                },
            )
            .await
            .expect("v1");
        new_producer
            .enqueue_to(
                &topic,
                &InvoiceV2Defaulted {
                    order_id: id("b"),
                    amount: i,
                    currency: "CHF".into(),
                },
            )
            .await
            .expect("v2");
    }
    let handled =
        || old_seen.lock().map_or(0, |s| s.len()) + new_seen.lock().map_or(0, |s| s.len());
    eventually(Duration::from_secs(60), "36 jobs handled", || {
        handled() == 36
    })
    .await;

    // The drop counter: the old worker counted exactly the v2 records it
    // read (it drops `currency`); the new one drops nothing.
    let old_v2 = old_seen
        .lock()
        .map_or(0, |s| s.iter().filter(|v| **v == Some(2)).count());
    assert!(
        old_v2 > 0,
        "the old worker read v2 records: {:?}",
        old_seen.lock().map(|s| s.clone())
    );
    let mut counted = Vec::new();
    for _ in 0..50 {
        counted = dropped(&old).await;
        if counted.iter().map(|(_, n)| *n).sum::<f64>() >= old_v2 as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The two v2 poisons decode before they fail: counted too when the old
    // worker read them.
    let poisons = 2;
    let total: f64 = counted.iter().map(|(_, n)| *n).sum();
    assert!(
        counted.iter().all(|(v, _)| v == "2")
            && total >= old_v2 as f64
            && total <= (old_v2 + poisons) as f64,
        "{counted:?} for {old_v2} v2 jobs handled"
    );
    assert!(
        dropped(&new).await.is_empty(),
        "the new reader keeps every field"
    );
    old.stop().await;
    new.stop().await;

    // The gate: a v3 that makes `currency` required reads v2 but not v1.
    // Four dead letters wait (two of each); more jobs wait in the topic.
    for i in 0..3 {
        old_producer
            .enqueue_to(
                &topic,
                &InvoiceV1 {
                    order_id: format!("late-{i}"),
                    amount: i,
                },
            )
            .await
            .expect("v1");
    }
    let v3 = schemas(&[(InvoiceV1::NAME, 3, V2_REQUIRED)]);
    let gate = kjob(
        &config,
        &[
            "schema",
            "check",
            "--in-flight",
            "--group",
            &group,
            "--dir",
            path(&v3),
            "--topic",
            &topic,
            "--compatibility",
            "NONE",
            "--json",
        ],
    );
    assert_eq!(gate.code, 1, "{}{}", gate.stdout, gate.stderr);
    let v: serde_json::Value = serde_json::from_str(gate.stdout.trim()).expect("JSON");
    // Three v1 jobs in the topic and two v1 dead letters.
    assert_eq!(v["unreadable_waiting"], 5, "{v}");
    let rows = v["in_flight"].as_array().cloned().unwrap_or_default();
    let dlq = kjob::topics::dlq_topic(&topic);
    let unreadable_in = |t: &str| -> i64 {
        rows.iter()
            .filter(|r| r["topic"] == t && r["readable"] == false)
            .filter_map(|r| r["jobs"].as_i64())
            .sum()
    };
    assert_eq!(
        (unreadable_in(&topic), unreadable_in(&dlq)),
        (3, 2),
        "{rows:?}"
    );

    // The re-drive pre-check: against v3, the v1 dead letters are held
    // back and the v2 ones would go.
    let v3_file = v3.join(format!("{}.v3.avsc", InvoiceV1::NAME));
    let v3_file = v3_file.to_str().expect("UTF-8");
    let retry = kjob(
        &config,
        &[
            "dlq", "retry", "--topic", &topic, "--reader", v3_file, "--json",
        ],
    );
    assert_eq!(retry.code, 0, "{}", retry.stderr);
    let r: serde_json::Value = serde_json::from_str(retry.stdout.trim()).expect("JSON");
    assert_eq!(r["dry_run"], true);
    assert_eq!(r["records"].as_array().map(Vec::len), Some(2), "{r}");
    assert_eq!(r["held"].as_array().map(Vec::len), Some(2), "{r}");
    assert!(
        r["held"][0]["held_because"]
            .as_str()
            .is_some_and(|w| w.contains("currency")),
        "{r}"
    );
    // Against the live reader (v2, which reads both) nothing is held.
    let live = kjob(&config, &["dlq", "retry", "--topic", &topic, "--json"]);
    let l: serde_json::Value = serde_json::from_str(live.stdout.trim()).expect("JSON");
    assert_eq!(l["held"].as_array().map(Vec::len), Some(0), "{l}");
    assert_eq!(l["records"].as_array().map(Vec::len), Some(4), "{l}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboards_redrive_holds_back_what_the_live_reader_cannot_read() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("heldui");
    let dlq = kjob::topics::dlq_topic(&topic);
    create_topic(&config, &topic, 1).await;
    create_topic(&config, &dlq, 1).await;
    let producer = Producer::new(&config).expect("producer");
    // The live reader: v1 under the topic's subject.
    let contract = producer
        .codec()
        .register::<InvoiceV1>(&topic)
        .await
        .expect("v1");
    let h = || {
        JobHeaders {
            job: Some(InvoiceV1::NAME.into()),
            id: Some(unique("id")),
            error_class: Some("permanent.invalid_input".into()),
            ..JobHeaders::default()
        }
        .to_owned_headers()
    };
    // 0:0 is bytes another producer wrote; 0:1 a v1 job.
    producer
        .send_raw(&dlq, Some(b"k0"), Some(b"not avro"), h())
        .await
        .expect("a foreign dead letter");
    let body = Codec::encode(
        &contract,
        &InvoiceV1 {
            order_id: "o-1".into(),
            amount: 1,
        },
    )
    .expect("encoded");
    producer
        .send_raw(&dlq, Some(b"o-1"), Some(&body), h())
        .await
        .expect("a v1 dead letter");

    let (_ui, base) = dashboard(&config, &["--allow-actions"]).await;
    let s = session(&base, &topic).await;
    s.settled(&format!("/dlq?topic={topic}"), |p| p.contains("0:1"))
        .await;
    let (status, preview) = s
        .post(
            "/dlq/redrive",
            &format!("topic={topic}&to=main&at=0:0&at=0:1"),
        )
        .await;
    assert_eq!(status, 200, "{preview}");
    assert!(
        preview.contains("1 record(s) would be re-driven"),
        "{preview}"
    );
    assert!(
        preview.contains("id=\"redrive-held\"") && preview.contains("wire format"),
        "{preview}"
    );
    // Executing only the held-back one re-drives nothing, and says why.
    let (status, page) = s
        .post(
            "/dlq/redrive",
            &format!("topic={topic}&to=main&rate=100&execute=1&at=0:0"),
        )
        .await;
    assert_eq!(status, 400, "{page}");
    assert!(page.contains("held back"), "{page}");
    assert_eq!(
        end_offsets(&config, &topic, 1),
        vec![0],
        "nothing re-driven"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_flight_gate_names_garbage_and_unknown_schema_ids_it_finds_waiting() {
    init_logging();
    let config = ensure_stack();
    let main = unique("inflightbad");
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
    producer.prepare_to::<InvoiceV1>(&main).await.expect("v1");
    let headers = || JobHeaders::default().to_owned_headers();
    // Bytes another producer wrote, and a frame naming an id no registry has.
    producer
        .send_raw(&tier, Some(b"k"), Some(b"garbage"), headers())
        .await
        .expect("garbage");
    let mut unknown = vec![0u8];
    unknown.extend_from_slice(&(u32::MAX - 7).to_be_bytes());
    unknown.extend_from_slice(b"\x02x");
    producer
        .send_raw(&tier, Some(b"k"), Some(&unknown), headers())
        .await
        .expect("unknown id");
    let dir = schemas(&[(InvoiceV1::NAME, 1, V1)]);
    let out = in_flight(&config, &dir, &main, &group);
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("JSON");
    assert_eq!(v["unreadable_waiting"], 1, "only the unknown id fails: {v}");
    let rows = v["in_flight"].as_array().cloned().unwrap_or_default();
    let result = |unframed: bool| {
        rows.iter()
            .find(|r| r["writer_id"].is_null() == unframed)
            .and_then(|r| r["result"].as_str().map(str::to_string))
            .unwrap_or_else(|| panic!("{rows:?}"))
    };
    assert!(result(true).contains("not framed"), "{rows:?}");
    assert!(result(false).contains("no schema with this id"), "{rows:?}");
}
