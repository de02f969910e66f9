//! A record the broker accepted on a main topic must never block its
//! partition because kjob cannot forward it. Near the broker's size limit
//! it is dead-lettered whole; where even that is refused, an envelope with
//! its coordinates is dead-lettered instead. Either way, the jobs behind it
//! run and the partition's commit reaches the end.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kjob::{JobContext, JobError, KafkaConfig, Producer, Worker};
use kjob_integration_tests::*;
use rand::RngCore;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer as _, ThreadedProducer};
use rdkafka::ClientConfig;

const BIG: usize = 1_040_000;

/// Writes `bytes` of incompressible garbage with a producer configured for
/// it, as a Java producer with default settings could.
fn produce_big(config: &KafkaConfig, topic: &str) {
    let mut payload = vec![0u8; BIG];
    rand::rng().fill_bytes(&mut payload);
    payload[0] = 0xff; // not Confluent-framed
    let p: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &config.bootstrap_servers)
        .set("message.max.bytes", "2000000")
        .create()
        .expect("big producer");
    p.send(
        BaseRecord::to(topic)
            .partition(0)
            .key("big")
            .payload(&payload),
    )
    .map_err(|(e, _)| e)
    .expect("queued");
    p.flush(Duration::from_secs(30))
        .expect("broker took the big record");
}

async fn run(dlq_limit: Option<&str>) -> (String, rdkafka::message::OwnedMessage) {
    init_logging();
    let config = ensure_stack();
    let topic = unique("oversized");
    let group = unique("g");
    create_topic(&config, &topic, 1).await;
    if let Some(limit) = dlq_limit {
        kjob::topics::create_topics_with(
            &config,
            &[(format!("{topic}.dlq"), 1)],
            &[("max.message.bytes", limit)],
        )
        .await
        .expect("small DLQ");
    }
    let producer = Producer::new(&config).expect("producer");
    enqueue_n(&producer, &topic, 20, 5, "ok").await;
    produce_big(&config, &topic);
    let behind: Vec<TestJob> = (20..40).map(|i| TestJob::ok(format!("k{i}"), i)).collect();
    for r in producer.enqueue_batch_to(&topic, &behind).await {
        r.expect("enqueued");
    }

    let seen: Arc<Mutex<HashSet<i64>>> = Default::default();
    let handler = {
        let seen = seen.clone();
        move |job: TestJob, _ctx: JobContext| {
            seen.lock().unwrap().insert(job.seq);
            async { Ok::<(), JobError>(()) }
        }
    };
    let worker = Worker::builder(config.clone(), &group)
        .handle_on(&topic, handler)
        .commit_interval(Duration::from_millis(200))
        .build()
        .expect("worker builds");
    let running = start(worker);
    eventually(
        Duration::from_secs(30),
        "the jobs behind the big record ran",
        || seen.lock().unwrap().len() == 40,
    )
    .await;
    wait_committed_at_end(&config, &group, &topic, 1).await;
    running.stop().await;
    let dlq = read_all(&config, &format!("{topic}.dlq"));
    assert_eq!(dlq.len(), 1, "exactly the big record is dead-lettered");
    (topic, dlq.into_iter().next().expect("one dead letter"))
}

/// `kjob dlq show --json` on a dead letter, parsed.
fn show(topic: &str, at: &str) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kjob-cli"))
        .args(["dlq", "show", "--topic", topic, at, "--json"])
        .output()
        .expect("running kjob");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("show --json prints JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_near_the_brokers_limit_is_dead_lettered_whole() {
    let (topic, dead) = run(None).await;
    assert_eq!(dead.payload().map(<[u8]>::len), Some(BIG));
    assert_eq!(
        kjob::headers::find(dead.headers(), kjob::headers::ERROR_CLASS),
        Some("decode.not_framed")
    );
    // show caps the hex dump and says how much it left out.
    let shown = show(&topic, "0:0");
    assert_eq!(shown["payload"]["size"], BIG);
    assert_eq!(
        shown["payload"]["hex"].as_str().map(str::len),
        Some(2 * 4096)
    );
    assert_eq!(shown["payload"]["hex_omitted_bytes"], BIG - 4096);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_its_dlq_refuses_is_dead_lettered_as_an_envelope_with_its_coordinates() {
    let (topic, dead) = run(Some("200000")).await;
    assert_eq!(dead.payload(), None, "payload omitted");
    assert_eq!(
        kjob::headers::find(dead.headers(), kjob::headers::ERROR_CLASS),
        Some("forward.rejected")
    );
    let error = kjob::headers::find(dead.headers(), kjob::headers::ERROR).unwrap_or("");
    assert!(error.contains("record too large"), "{error}");
    assert_eq!(
        kjob::headers::find(dead.headers(), kjob::dlq::PAYLOAD_OMITTED),
        Some(format!("{BIG} bytes at {topic}:0:20").as_str())
    );
    assert_eq!(
        kjob::headers::find(dead.headers(), kjob::headers::ORIGINAL_OFFSET),
        Some("20")
    );
    let shown = show(&topic, "0:0");
    let omitted = shown["payload"]["omitted"].as_str().unwrap_or("");
    assert!(omitted.contains(&format!("{topic}:0:20")), "{shown}");
}
