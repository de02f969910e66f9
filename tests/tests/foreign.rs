//! Jobs written by a producer that is not kjob's: a service in another
//! language with its own Confluent Avro serializer. Its records carry no
//! `kjob-*` header at all, and each must still be its own job with a
//! stable id, so an idempotent handler has one effect per record.

use std::sync::Arc;
use std::time::Duration;

use kjob::idempotency::{Mark, PgMarkers};
use kjob::{Job, JobContext, JobError, Worker};
use kjob_integration_tests::*;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer as _, ThreadedProducer};
use rdkafka::ClientConfig;
use tokio::sync::Mutex;

/// Registers the test contract through the registry's own REST API, as a
/// Java or Python producer's serializer would, and returns the schema id.
async fn register_by_rest(registry: &str, subject: &str) -> u32 {
    let body = serde_json::json!({ "schema": TestJob::SCHEMA });
    let resp: serde_json::Value = reqwest::Client::new()
        .post(format!("{registry}/subjects/{subject}/versions"))
        .header("Content-Type", "application/vnd.schemaregistry.v1+json")
        .json(&body)
        .send()
        .await
        .expect("registry answers")
        .error_for_status()
        .expect("registration accepted")
        .json()
        .await
        .expect("registry returns JSON");
    resp["id"].as_u64().expect("schema id in response") as u32
}

/// Confluent wire format by hand: magic 0, schema id (big-endian), Avro body.
fn confluent_frame(schema_id: u32, job: &TestJob) -> Vec<u8> {
    let schema = apache_avro::Schema::parse_str(TestJob::SCHEMA).expect("schema");
    let value = apache_avro::to_value(job).expect("to avro value");
    let body = apache_avro::writer::datum::GenericDatumWriter::builder(&schema)
        .build()
        .expect("datum writer")
        .write_value_to_vec(value)
        .expect("avro body");
    let mut out = vec![0u8];
    out.extend_from_slice(&schema_id.to_be_bytes());
    out.extend_from_slice(&body);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_headerless_jobs_from_a_foreign_producer_have_a_thousand_effects() {
    init_logging();
    let config = ensure_stack();
    let db = ensure_postgres();
    let topic = unique("foreign.jobs");
    let group = unique("g");
    create_topic(&config, &topic, 3).await;
    let id = register_by_rest(&config.schema_registry_url, &format!("{topic}-value")).await;

    const N: i64 = 1_000;
    let raw: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &config.bootstrap_servers)
        .create()
        .expect("raw producer");
    for seq in 0..N {
        // Every 10th job fails once, so its id must survive a retry hop.
        let behaviour = if seq % 10 == 0 { "fail-first" } else { "ok" };
        let job = TestJob::with(format!("k{}", seq % 50), seq, behaviour);
        let payload = confluent_frame(id, &job);
        let key = job.key.clone();
        let mut record = BaseRecord::to(&topic).key(&key).payload(&payload);
        loop {
            match raw.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    record = back;
                    raw.poll(Duration::from_millis(50));
                }
            }
        }
    }
    raw.flush(Duration::from_secs(30)).expect("flushed");

    let (client, conn) = tokio_postgres::connect(&db, tokio_postgres::NoTls)
        .await
        .expect("postgres");
    tokio::spawn(conn);
    let markers = PgMarkers::new(&markers_table(&group)).expect("table name");
    markers.create_table(&client).await.expect("marker table");
    let effects = format!("{}_effects", markers_table(&group));
    client
        .batch_execute(&format!(
            "CREATE TABLE {effects} (seq bigint NOT NULL, job_id text NOT NULL)"
        ))
        .await
        .expect("effects table");
    let client = Arc::new(Mutex::new(client));

    let handler = {
        let (client, markers, effects) = (client.clone(), markers.clone(), effects.clone());
        move |job: TestJob, ctx: JobContext| {
            let (client, markers, effects) = (client.clone(), markers.clone(), effects.clone());
            async move {
                if job.behaviour == "fail-first" && ctx.attempt == 1 {
                    return Err(JobError::server("test: first attempt fails"));
                }
                let mut client = client.lock().await;
                let tx = client
                    .transaction()
                    .await
                    .map_err(|e| JobError::network(e.to_string()))?;
                let mark = markers
                    .mark(&tx, &ctx.id, &ctx.job)
                    .await
                    .map_err(|e| JobError::network(e.to_string()))?;
                if mark == Mark::First {
                    tx.execute(
                        &format!("INSERT INTO {effects} (seq, job_id) VALUES ($1, $2)"),
                        &[&job.seq, &ctx.id.to_string()],
                    )
                    .await
                    .map_err(|e| JobError::network(e.to_string()))?;
                }
                tx.commit()
                    .await
                    .map_err(|e| JobError::network(e.to_string()))?;
                Ok(())
            }
        }
    };
    let worker = Worker::builder(config.clone(), &group)
        .handle_on(&topic, handler)
        .retry(kjob::retry::RetryPolicy::tiers([Duration::from_secs(1)]))
        .commit_interval(Duration::from_millis(200))
        .build()
        .expect("worker builds");
    let running = start(worker);
    wait_committed_at_end(&config, &group, &topic, 3).await;
    let tier = format!("{topic}.retry.1s");
    eventually(Duration::from_secs(60), "every retry handled", || {
        let ends = end_offsets(&config, &tier, 3);
        ends.iter().sum::<i64>() == N / 10
            && committed_offsets(&config, &group, &tier, 3)
                .iter()
                .zip(&ends)
                .all(|(c, e)| *e == 0 || *c == Some(*e))
    })
    .await;
    running.stop().await;

    let client = client.lock().await;
    let count: i64 = client
        .query_one(&format!("SELECT count(DISTINCT seq) FROM {effects}"), &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(count, N, "one effect per foreign job");
    let rows: i64 = client
        .query_one(&format!("SELECT count(*) FROM {effects}"), &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(rows, N, "and no job had its effect twice");

    // The retried jobs carry the id derived from their main-topic record,
    // written into kjob-id on the hop.
    for m in read_all(&config, &tier) {
        let id = kjob::headers::find(m.headers(), kjob::headers::ID).expect("kjob-id written");
        let origin = kjob::headers::JobHeaders::parse(m.headers());
        // As with kjob-id: every hop names the route's contract, so
        // `kjob dlq list --job` finds records of other producers too.
        assert_eq!(
            origin.job.as_deref(),
            Some("kjob.test.job"),
            "kjob-job written"
        );
        assert_eq!(
            id,
            format!(
                "{topic}:{}:{}",
                origin.original_partition.expect("origin partition"),
                origin.original_offset.expect("origin offset")
            )
        );
    }
}

fn markers_table(group: &str) -> String {
    format!("foreign_{}", group.replace(['.', '-'], "_"))
}

/// Headers built through librdkafka's C API, because rdkafka's `Header`
/// takes the name as `&str` and so cannot write what a buggy or hostile
/// producer in another language can: a name that is not UTF-8.
fn headers_with_raw_name(name: &[u8], value: &[u8]) -> rdkafka::message::OwnedHeaders {
    let headers = rdkafka::message::OwnedHeaders::new();
    // `as_borrowed` is the native header list (rdkafka's own cast).
    let ptr = headers.as_borrowed() as *const rdkafka::message::BorrowedHeaders
        as *mut rdkafka::bindings::rd_kafka_headers_t;
    // SAFETY: `ptr` is the live header list owned by `headers`; librdkafka
    // copies name and value.
    let err = unsafe {
        rdkafka::bindings::rd_kafka_header_add(
            ptr,
            name.as_ptr().cast(),
            name.len() as isize,
            value.as_ptr().cast(),
            value.len() as isize,
        )
    };
    assert_eq!(
        err,
        rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
    );
    headers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_name_that_is_not_utf8_neither_crashes_nor_loses_the_job() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("foreign.badheader");
    let group = unique("g");
    create_topic(&config, &topic, 1).await;
    let id = register_by_rest(&config.schema_registry_url, &format!("{topic}-value")).await;
    let raw: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &config.bootstrap_servers)
        .create()
        .expect("raw producer");
    // Job 0 fails once, so its headers are also copied onto a retry tier;
    // job 1 behind it is a plain one.
    for (seq, behaviour) in [(0i64, "fail-first"), (1, "ok")] {
        let job = TestJob::with("k", seq, behaviour);
        let payload = confluent_frame(id, &job);
        let record = BaseRecord::to(&topic)
            .key("k")
            .payload(&payload)
            .headers(headers_with_raw_name(b"x-trace-\xff\xfe", b"v"));
        raw.send(record).map_err(|(e, _)| e).expect("queued");
    }
    raw.flush(Duration::from_secs(30)).expect("flushed");

    let handled = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = handled.clone();
    let worker = Worker::builder(config.clone(), &group)
        .handle_on(&topic, move |job: TestJob, ctx: JobContext| {
            let seen = seen.clone();
            async move {
                if job.behaviour == "fail-first" && ctx.attempt == 1 {
                    return Err(JobError::server("test: first attempt fails"));
                }
                seen.lock().expect("lock").push(job.seq);
                Ok(())
            }
        })
        .retry(kjob::retry::RetryPolicy::tiers([Duration::from_secs(1)]))
        .commit_interval(Duration::from_millis(200))
        .build()
        .expect("worker builds");
    let running = start(worker);
    eventually(Duration::from_secs(30), "both jobs handled", || {
        handled.lock().expect("lock").len() == 2
    })
    .await;
    running.stop().await;
    let mut seqs = handled.lock().expect("lock").clone();
    seqs.sort_unstable();
    assert_eq!(seqs, vec![0, 1], "each job handled once, none lost");
    // The hop kept the header, its bad bytes replaced.
    let tier = read_all(&config, &format!("{topic}.retry.1s"));
    assert_eq!(tier.len(), 1);
    let h = tier[0].headers().expect("headers on the hop");
    let kept = (0..rdkafka::message::Headers::count(h))
        .filter_map(|i| rdkafka::message::Headers::try_get(h, i))
        .find(|h| h.key.starts_with("x-trace-"))
        .expect("the header travelled with the job");
    assert_eq!(kept.key, "x-trace-\u{fffd}\u{fffd}");
    assert_eq!(kept.value, Some(&b"v"[..]));

    // The operator side: a dead letter written with such a name (by a tool
    // that is not kjob) lists instead of crashing `kjob dlq`.
    let dlq = format!("{topic}.dlq");
    let payload = confluent_frame(id, &TestJob::with("k", 2, "ok"));
    let letter = BaseRecord::to(&dlq).key("k").payload(&payload).headers(
        headers_with_raw_name(b"kjob-error-class\xff", b"x").insert(rdkafka::message::Header {
            key: kjob::headers::ERROR_CLASS,
            value: Some("permanent.invalid_input"),
        }),
    );
    raw.send(letter).map_err(|(e, _)| e).expect("queued");
    raw.flush(Duration::from_secs(30)).expect("flushed");
    let list = kjob_ok(
        env!("CARGO_BIN_EXE_kjob-cli"),
        &config,
        &["dlq", "list", "--topic", &topic],
    );
    assert!(list.contains("1 shown"), "{list}");
    assert!(list.contains("permanent.invalid_input"), "{list}");
}
