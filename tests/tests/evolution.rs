//! Rolling deploys: producers and workers of different contract versions
//! sharing one topic, against the real registry.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use apache_avro::AvroSchema;
use kjob::{
    Error, Job, JobContext, JobError, KafkaConfig, OrderingMode, Producer, Worker, WorkerStats,
};
use kjob_integration_tests::*;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, AvroSchema)]
#[avro(namespace = "kjob.test")]
#[serde(rename = "TestOrder")]
struct OrderV1 {
    order_id: String,
    amount: i64,
    legacy_ref: String,
}
impl Job for OrderV1 {
    const NAME: &'static str = "kjob.test.order";
    const VERSION: u32 = 1;
    const SCHEMA: &'static str = include_str!("../../schemas/kjob.test.order.v1.avsc");
    fn key(&self) -> String {
        self.order_id.clone()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, AvroSchema)]
#[avro(namespace = "kjob.test")]
#[serde(rename = "TestOrder")]
struct OrderV2 {
    order_id: String,
    amount: i64,
    currency: String,
}
impl Job for OrderV2 {
    const NAME: &'static str = "kjob.test.order";
    const VERSION: u32 = 2;
    const SCHEMA: &'static str = include_str!("../../schemas/kjob.test.order.v2.avsc");
    fn key(&self) -> String {
        self.order_id.clone()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct OrderV3 {
    order_id: String,
    amount: i64,
    currency: String,
    region: String,
}
impl Job for OrderV3 {
    const NAME: &'static str = "kjob.test.order";
    const VERSION: u32 = 3;
    const SCHEMA: &'static str = include_str!("../fixtures/kjob.test.order.v3.avsc");
    fn key(&self) -> String {
        self.order_id.clone()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, AvroSchema)]
#[avro(namespace = "kjob.test")]
#[serde(rename = "TestCustomer")]
struct CustomerV1 {
    customer_id: String,
}
impl Job for CustomerV1 {
    const NAME: &'static str = "kjob.test.customer";
    const VERSION: u32 = 1;
    const SCHEMA: &'static str = include_str!("../../schemas/kjob.test.customer.v1.avsc");
    fn key(&self) -> String {
        self.customer_id.clone()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct CustomerV2 {
    customer_ref: String,
}
impl Job for CustomerV2 {
    const NAME: &'static str = "kjob.test.customer";
    const VERSION: u32 = 2;
    const SCHEMA: &'static str = include_str!("../../schemas/kjob.test.customer.v2.avsc");
    fn key(&self) -> String {
        self.customer_ref.clone()
    }
}

/// Runs a worker for `J` on `topic` until `n` jobs were handled, returning them in handling order.
async fn consume<J: Job + Clone>(
    config: &KafkaConfig,
    topic: &str,
    group: &str,
    n: usize,
) -> Vec<J> {
    let seen: Arc<Mutex<Vec<J>>> = Default::default();
    let s = seen.clone();
    let w = Worker::builder(config.clone(), group)
        .handle_on(topic, move |job: J, _ctx: JobContext| {
            let s = s.clone();
            async move {
                s.lock().unwrap().push(job);
                Ok::<(), JobError>(())
            }
        })
        .ordering(OrderingMode::PerPartition)
        .build()
        .unwrap();
    let stats = w.stats();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(w.run_until(async {
        let _ = rx.await;
    }));
    eventually(Duration::from_secs(30), "jobs handled", || {
        seen.lock().unwrap().len() >= n
    })
    .await;
    let _ = tx.send(());
    task.await.unwrap().unwrap();
    assert_eq!(
        WorkerStats::get(&stats.dead_lettered),
        0,
        "nothing dead-lettered"
    );
    let out = seen.lock().unwrap().clone();
    out
}

fn v1(i: i64) -> OrderV1 {
    OrderV1 {
        order_id: format!("o{i}"),
        amount: i,
        legacy_ref: format!("L{i}"),
    }
}
fn v2(i: i64) -> OrderV2 {
    OrderV2 {
        order_id: format!("o{i}"),
        amount: i,
        currency: "CHF".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_and_new_producers_and_workers_read_each_other_in_order() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("evo.order");
    create_topic(&config, &topic, 1).await;
    let old = Producer::new(&config).unwrap();
    let new = Producer::new(&config).unwrap();

    // Mid-deploy: v1 and v2 producers interleave on one partition.
    for i in 0..10 {
        if i % 2 == 0 {
            old.enqueue_to(&topic, &v1(i)).await.unwrap();
        } else {
            new.enqueue_to(&topic, &v2(i)).await.unwrap();
        }
    }

    // A v2 worker reads both; v1 records get the default currency, in order.
    let got: Vec<OrderV2> = consume(&config, &topic, &unique("g"), 10).await;
    let expected: Vec<OrderV2> = (0..10)
        .map(|i| {
            if i % 2 == 0 {
                OrderV2 {
                    currency: "EUR".into(),
                    ..v2(i)
                }
            } else {
                v2(i)
            }
        })
        .collect();
    assert_eq!(got, expected);

    // A v1 worker (not yet upgraded) reads both too: `currency` is ignored,
    // the removed `legacy_ref` takes its default.
    let got: Vec<OrderV1> = consume(&config, &topic, &unique("g"), 10).await;
    let expected: Vec<OrderV1> = (0..10)
        .map(|i| {
            if i % 2 == 0 {
                v1(i)
            } else {
                OrderV1 {
                    legacy_ref: String::new(),
                    ..v1(i)
                }
            }
        })
        .collect();
    assert_eq!(got, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_field_is_read_through_its_alias() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("evo.customer");
    create_topic(&config, &topic, 1).await;
    let producer = Producer::new(&config).unwrap();
    producer
        .enqueue_to(
            &topic,
            &CustomerV1 {
                customer_id: "c-1".into(),
            },
        )
        .await
        .unwrap();
    let got: Vec<CustomerV2> = consume(&config, &topic, &unique("g"), 1).await;
    assert_eq!(
        got,
        vec![CustomerV2 {
            customer_ref: "c-1".into()
        }]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incompatible_contract_is_refused_at_producer_start_and_flagged_by_check() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("evo.break");
    create_topic(&config, &topic, 1).await;
    let producer = Producer::new(&config).unwrap();
    producer.enqueue_to(&topic, &v1(1)).await.unwrap();
    producer.enqueue_to(&topic, &v2(2)).await.unwrap();

    // The CI gate sees it first: `kjob schema check` on a v3 file.
    let dir = std::env::temp_dir().join(unique("kjob-schemas"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{topic}.v3.avsc")), OrderV3::SCHEMA).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kjob-cli"))
        .args(["schema", "check", "--dir"])
        .arg(&dir)
        .env("KJOB_SCHEMA_REGISTRY_URL", &config.schema_registry_url)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("INCOMPATIBLE with v2 (backward)") && stdout.contains("region"),
        "{stdout}"
    );
    assert!(stdout.contains("BACKWARD"), "{stdout}");

    // A compatible directory passes.
    std::fs::remove_file(dir.join(format!("{topic}.v3.avsc"))).unwrap();
    std::fs::write(dir.join(format!("{topic}.v2.avsc")), OrderV2::SCHEMA).unwrap();
    let ok = std::process::Command::new(env!("CARGO_BIN_EXE_kjob-cli"))
        .args(["schema", "check", "--dir"])
        .arg(&dir)
        .env("KJOB_SCHEMA_REGISTRY_URL", &config.schema_registry_url)
        .output()
        .unwrap();
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );

    // And a v3 producer fails at startup, naming subject, versions and field.
    let v3_producer = Producer::new(&config).unwrap();
    let err = v3_producer
        .enqueue_to(
            &topic,
            &OrderV3 {
                order_id: "o".into(),
                amount: 1,
                currency: "EUR".into(),
                region: "eu".into(),
            },
        )
        .await
        .expect_err("the registry refuses v3");
    match &err {
        Error::SchemaRejected {
            subject,
            version,
            message,
            ..
        } => {
            assert_eq!(subject, &format!("{topic}-value"));
            assert_eq!(*version, 3);
            assert!(
                message.contains("region") && message.contains("version 2"),
                "{message}"
            );
        }
        other => panic!("expected SchemaRejected, got {other:?}"),
    }
    assert_eq!(end_offsets(&config, &topic, 1), vec![2], "nothing written");
}

#[test]
fn contract_files_match_the_rust_types() {
    for (file, derived) in [
        (OrderV1::SCHEMA, OrderV1::get_schema()),
        (OrderV2::SCHEMA, OrderV2::get_schema()),
        (CustomerV1::SCHEMA, CustomerV1::get_schema()),
    ] {
        let parsed = apache_avro::Schema::parse_str(file).unwrap();
        assert_eq!(parsed.canonical_form(), derived.canonical_form());
    }
}
