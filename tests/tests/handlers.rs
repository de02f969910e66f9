//! Handler crates: the in-memory harness and the real worker agree on the
//! same scripted failures, and an idempotent handler survives a duplicate
//! delivery (kill between side effect and commit) against real PostgreSQL.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kjob::retry::RetryPolicy;
use kjob::testing::Harness;
use kjob::{JobContext, JobError, Producer, Worker, WorkerBuilder, WorkerStats};
use kjob_example_handler_crate::contracts::RenderInvoice;
use kjob_example_handler_crate::deps::Order;
use kjob_example_handler_crate::pg::PgStore;
use kjob_integration_tests::*;
use rdkafka::Message;
use tokio::sync::oneshot;

/// (key, attempt, topic) of every handler call.
type Calls = Arc<Mutex<Vec<(String, u32, String)>>>;

/// A scripted handler: the job's key says how it fails.
fn scripted(builder: WorkerBuilder, topic: &str, calls: Calls) -> WorkerBuilder {
    builder
        .handle_on(topic, move |job: TestJob, ctx: JobContext| {
            calls
                .lock()
                .unwrap()
                .push((job.key.clone(), ctx.attempt, ctx.topic.to_string()));
            async move {
                match (job.key.as_str(), ctx.attempt) {
                    ("flaky", 1 | 2) => Err(JobError::server("503")),
                    ("perm", _) => Err(JobError::invalid_input("bad")),
                    ("boom", _) => panic!("scripted panic"),
                    ("slow429", 1) => {
                        Err(JobError::retry_after(Duration::from_millis(1500), "429"))
                    }
                    ("dead", _) => Err(JobError::timeout("always times out")),
                    _ => Ok(()),
                }
            }
        })
        .retry(RetryPolicy::tiers([Duration::from_secs(1), Duration::from_secs(2)]).jitter(0.0))
}

const KEYS: [&str; 6] = ["ok", "flaky", "perm", "boom", "slow429", "dead"];

/// Per key: the (attempt, topic) sequence, sorted.
fn by_key(calls: &Calls) -> BTreeMap<String, Vec<(u32, String)>> {
    let mut out: BTreeMap<String, Vec<(u32, String)>> = BTreeMap::new();
    for (k, a, t) in calls.lock().unwrap().iter() {
        out.entry(k.clone()).or_default().push((*a, t.clone()));
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_harness_and_the_real_worker_agree_on_scripted_failures() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("agree");
    create_topic(&config, &topic, 1).await;

    // In memory.
    let mem_calls: Calls = Default::default();
    let mut h = Harness::new(scripted(
        Worker::builder(config.clone(), "agree"),
        &topic,
        mem_calls.clone(),
    ))
    .unwrap();
    for (i, k) in KEYS.iter().enumerate() {
        h.enqueue_to(&topic, &TestJob::ok(*k, i as i64)).unwrap();
    }
    h.run_until_idle().await;
    let key_of_id: BTreeMap<String, String> = h
        .records(&topic)
        .iter()
        .map(|m| {
            (
                job_id(m),
                String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
            )
        })
        .collect();
    let mem_dead: BTreeMap<String, String> = h
        .dead_letters()
        .iter()
        .map(|d| {
            (
                key_of_id.get(&d.id).cloned().unwrap_or_default(),
                d.class.clone(),
            )
        })
        .collect();

    // On the real stack.
    let real_calls: Calls = Default::default();
    let group = unique("g");
    let worker = scripted(
        Worker::builder(config.clone(), &group),
        &topic,
        real_calls.clone(),
    )
    .build()
    .unwrap();
    let stats = worker.stats();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(worker.run_until(async {
        let _ = rx.await;
    }));
    let producer = Producer::new(&config).unwrap();
    for (i, k) in KEYS.iter().enumerate() {
        producer
            .enqueue_to(&topic, &TestJob::ok(*k, i as i64))
            .await
            .unwrap();
    }
    eventually(Duration::from_secs(60), "all six jobs final", || {
        WorkerStats::get(&stats.handled) + WorkerStats::get(&stats.dead_lettered) == 6
    })
    .await;
    let _ = tx.send(());
    task.await.unwrap().unwrap();
    let real_dead: BTreeMap<String, String> = read_all(&config, &format!("{topic}.dlq"))
        .iter()
        .map(|m| {
            let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
            let class = kjob::headers::find(m.headers(), kjob::headers::ERROR_CLASS)
                .unwrap_or("")
                .to_string();
            (key, class)
        })
        .collect();

    assert_eq!(
        by_key(&mem_calls),
        by_key(&real_calls),
        "same attempts through the same tiers"
    );
    assert_eq!(
        mem_dead, real_dead,
        "same dead letters with the same classes"
    );
    let expected: BTreeMap<String, String> = [
        ("perm", "permanent.invalid_input"),
        ("boom", "bug.panic"),
        ("dead", "retries_exhausted"),
    ]
    .into_iter()
    .map(|(k, c)| (k.to_string(), c.to_string()))
    .collect();
    assert_eq!(real_dead, expected);
    let flaky = &by_key(&real_calls)["flaky"];
    assert_eq!(
        flaky.iter().map(|(a, _)| *a).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert_eq!(flaky[2].1, format!("{topic}.retry.2s"));
    assert_eq!(
        by_key(&real_calls)["slow429"][1].1,
        format!("{topic}.retry.2s"),
        "1.5 s needs the 2 s tier"
    );
}

fn job_id(m: &rdkafka::message::OwnedMessage) -> String {
    kjob::headers::find(m.headers(), kjob::headers::ID)
        .unwrap_or("")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_delivery_after_a_kill_has_its_effect_once_in_postgres() {
    init_logging();
    let config = ensure_stack();
    let db = ensure_postgres();
    let store = PgStore::connect(&db).await.unwrap();
    let (client, conn) = tokio_postgres::connect(&db, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);

    let render = unique("invoices.render");
    let mail = unique("invoices.mail");
    let group = unique("g");
    create_topic(&config, &render, 1).await;
    create_topic(&config, &mail, 1).await;
    let order_id = unique("order");
    store
        .add_order(&Order {
            id: order_id.clone(),
            total_cents: 999,
        })
        .await
        .unwrap();

    let spawn = |commit_ms: u64| {
        std::process::Command::new(env!("CARGO_BIN_EXE_invoice-worker"))
            .env("KJOB_TEST_RENDER_TOPIC", &render)
            .env("KJOB_TEST_MAIL_TOPIC", &mail)
            .env("KJOB_TEST_GROUP", &group)
            .env("KJOB_TEST_COMMIT_MS", commit_ms.to_string())
            .env("KJOB_DATABASE_URL", &db)
            .spawn()
            .expect("spawning invoice-worker")
    };
    let producer = Producer::new(&config).unwrap();
    let enqueued = producer
        .enqueue_to(
            &render,
            &RenderInvoice {
                order_id: order_id.clone(),
                tenant: "shop".into(),
            },
        )
        .await
        .unwrap();

    // First worker: stores the invoice, then dies before it commits.
    let mut first = spawn(600_000);
    wait_rows(
        &client,
        "SELECT count(*) FROM invoices WHERE order_id = $1",
        &order_id,
        1,
    )
    .await;
    first.kill().unwrap();
    first.wait().unwrap();
    assert_eq!(
        committed_offsets(&config, &group, &render, 1)[0],
        None,
        "died before committing"
    );

    // Second worker: the job is delivered again; the marker stops a second invoice.
    let mut second = spawn(200);
    wait_rows(
        &client,
        "SELECT count(*) FROM invoice_deliveries WHERE job_id = $1",
        &enqueued.id,
        2,
    )
    .await;
    let end = end_offsets(&config, &render, 1)[0];
    eventually(Duration::from_secs(30), "committed", || {
        committed_offsets(&config, &group, &render, 1)[0] == Some(end)
    })
    .await;
    second.kill().unwrap();
    second.wait().unwrap();
    let count: i64 = client
        .query_one(
            "SELECT count(*) FROM invoices WHERE order_id = $1",
            &[&order_id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(count, 1, "delivered twice, invoiced once");
    let marker: i64 = client
        .query_one(
            "SELECT count(*) FROM invoice_jobs_processed WHERE key = $1",
            &[&enqueued.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(marker, 1);
}

async fn wait_rows(client: &tokio_postgres::Client, sql: &str, arg: &str, want: i64) {
    for _ in 0..600 {
        let n: i64 = client.query_one(sql, &[&arg]).await.unwrap().get(0);
        if n >= want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {want} rows: {sql} [{arg}]");
}
