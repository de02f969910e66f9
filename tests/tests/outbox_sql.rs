//! The SQL enqueue (`kjob.enqueue`, `kjob.enqueue_many`) from Rust's side,
//! against the real stack: that it takes the very lock and bucket of
//! `Outbox::enqueue`, that Rust and SQL writers of one key publish in commit
//! order, that a job which does not fit its contract is dead-lettered and
//! re-driven by `kjob dlq retry` once the contract is fixed, that the
//! migration upgrades a table of an older kjob (concurrently, repeatably),
//! and what the insert-time checks say. The other languages' side is
//! `tests/tests/polyglot.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kjob::codec::subject_for_topic;
use kjob::headers;
use kjob::outbox::{bucket_of, Outbox, OutboxTable, Relay};
use kjob::registry::Registration;
use kjob_integration_tests::sql_enqueue::{pg, SqlFixture};
use kjob_integration_tests::*;
use rdkafka::message::Message;
use tokio_postgres::error::SqlState;

/// The outbox table as kjob made it before JSON jobs (payload NOT NULL, no
/// payload_json, run_at or schema_version), to upgrade.
const OLD_SCHEMA: &str = "CREATE TABLE {table} (
    id bigserial PRIMARY KEY, bucket smallint NOT NULL, job_id text NOT NULL,
    topic text NOT NULL, key text NOT NULL, payload bytea NOT NULL, headers jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(), sent_at timestamptz,
    attempts integer NOT NULL DEFAULT 0, retry_at timestamptz, last_error text);
    CREATE INDEX {table}_unsent ON {table} (id) WHERE sent_at IS NULL;";

fn job_json(key: &str, seq: i64) -> serde_json::Value {
    serde_json::json!({"key": key, "seq": seq, "behaviour": "ok"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sql_enqueue_takes_the_rust_paths_key_lock_and_bucket() {
    init_logging();
    let url = ensure_postgres();
    let config = ensure_stack();
    let name = unique("kjob_outbox_lock").replace('.', "_");
    let table = OutboxTable::new(&name).expect("table");
    let s = table.functions_schema().to_string();
    let mut a = pg(&url).await;
    let b = pg(&url).await;
    kjob::outbox::migrate(&a, &table).await.expect("migrate");

    // Buckets: the SQL FNV-1a port agrees with Rust's on every key,
    // including multi-byte UTF-8.
    let mut keys: Vec<String> = (0..300).map(|i| format!("order-{i}")).collect();
    keys.extend(["ü", "日本語のキー", "🦀 crab", "a", &"long".repeat(100)].map(String::from));
    let jobs: Vec<serde_json::Value> = keys
        .iter()
        .map(|k| serde_json::json!({"key": k, "job": job_json(k, 1)}))
        .collect();
    let tx = a.transaction().await.expect("BEGIN");
    tx.query_one(
        &format!("SELECT {s}.enqueue_many('kjob.test.lock', $1)"),
        &[&serde_json::Value::Array(jobs)],
    )
    .await
    .expect("enqueue_many");
    let rows = tx
        .query(&format!("SELECT key, bucket FROM {name}"), &[])
        .await
        .expect("reading buckets");
    assert_eq!(rows.len(), keys.len());
    for r in rows {
        let key: String = r.get(0);
        let bucket: i16 = r.get(1);
        assert_eq!(bucket, bucket_of(&key), "bucket of {key:?}");
    }
    tx.rollback().await.expect("ROLLBACK");

    // Locks: a transaction holding a key through Outbox::enqueue makes the
    // SQL enqueue of that key wait (here: time out), not of another key;
    // and the other way round.
    let outbox = Outbox::new(&config)
        .expect("outbox")
        .table(&name)
        .expect("table");
    let topic = unique("kjob.test.lock");
    let held = a.transaction().await.expect("BEGIN");
    outbox
        .enqueue_to(&held, &topic, &TestJob::ok("K", 1))
        .await
        .expect("Rust enqueue holds K");
    b.batch_execute("SET lock_timeout = '300ms'")
        .await
        .expect("SET");
    let sql_one = format!("SELECT {s}.enqueue($1, $2, $3)");
    let waits = b
        .query_one(&sql_one, &[&topic, &"K", &job_json("K", 2)])
        .await
        .err()
        .unwrap_or_else(|| panic!("the SQL enqueue of K did not wait for the Rust transaction"));
    assert_eq!(waits.code(), Some(&SqlState::LOCK_NOT_AVAILABLE), "{waits}");
    let many = b
        .query_one(
            &format!("SELECT {s}.enqueue_many($1, $2)"),
            &[&topic, &serde_json::json!([{"key": "other", "job": job_json("other", 3)}, {"key": "K", "job": job_json("K", 4)}])],
        )
        .await
        .err()
        .unwrap_or_else(|| panic!("enqueue_many with K did not wait"));
    assert_eq!(many.code(), Some(&SqlState::LOCK_NOT_AVAILABLE), "{many}");
    b.query_one(&sql_one, &[&topic, &"K2", &job_json("K2", 5)])
        .await
        .expect("another key does not wait");
    held.rollback().await.expect("ROLLBACK");

    let mut b = b;
    let sql_held = b.transaction().await.expect("BEGIN");
    sql_held
        .query_one(&sql_one, &[&topic, &"K", &job_json("K", 6)])
        .await
        .expect("SQL enqueue holds K");
    a.batch_execute("SET lock_timeout = '300ms'")
        .await
        .expect("SET");
    let tx = a.transaction().await.expect("BEGIN");
    let rust_waits = outbox.enqueue_to(&tx, &topic, &TestJob::ok("K", 7)).await;
    assert!(
        rust_waits.is_err(),
        "Outbox::enqueue of K did not wait for the SQL transaction"
    );
    drop(tx);
    sql_held.rollback().await.expect("ROLLBACK");
    a.batch_execute(&format!("DROP TABLE {name}; DROP SCHEMA {s} CASCADE"))
        .await
        .expect("cleanup");
}

/// Rust and SQL writers interleaved on shared keys: per key, the first
/// occurrences in Kafka are in commit order (ground truth: a per-key counter
/// bumped after the enqueue, its row lock held to commit), rolled-back jobs
/// never appear, and every committed one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rust_and_sql_writers_of_one_key_publish_in_commit_order() {
    let fx = SqlFixture::new("order").await;
    let t = fx.table.name().to_string();
    fx.client
        .batch_execute(&format!(
            "CREATE TABLE {t}_counters (key text PRIMARY KEY, n bigint NOT NULL DEFAULT 0);
             CREATE TABLE {t}_commits (job_id text PRIMARY KEY, key text NOT NULL, n bigint NOT NULL);
             INSERT INTO {t}_counters (key) SELECT 'key-' || i FROM generate_series(0, 7) i;"
        ))
        .await
        .expect("bookkeeping tables");
    let outbox = Outbox::new(&fx.config)
        .expect("outbox")
        .table(&t)
        .expect("table");
    let keys: Arc<Vec<String>> = Arc::new((0..8).map(|i| format!("key-{i}")).collect());
    let mut tasks = Vec::new();
    for w in 0..4u64 {
        let (url, outbox, t, topic, keys) = (
            fx.url.clone(),
            outbox.clone(),
            t.clone(),
            fx.topic.clone(),
            keys.clone(),
        );
        let schema = fx.schema().to_string();
        tasks.push(tokio::spawn(async move {
            let mut client = pg(&url).await;
            let bump = client
                .prepare(&format!(
                    "WITH c AS (UPDATE {t}_counters SET n = n + 1 WHERE key = $1 RETURNING n)
                     INSERT INTO {t}_commits (job_id, key, n) SELECT $2, $1, n FROM c"
                ))
                .await
                .expect("prepare bump");
            let sql = w % 2 == 1; // writers 1 and 3 enqueue through SQL
            let mut rolled_back = Vec::new();
            for i in 0..40u64 {
                let mut chosen: Vec<&String> = keys
                    .iter()
                    .filter(|_| rand::random::<u8>() < 96)
                    .take(3)
                    .collect();
                if chosen.is_empty() {
                    chosen.push(&keys[(i % 8) as usize]);
                }
                chosen.sort(); // one lock order for every writer
                let tx = client.transaction().await.expect("BEGIN");
                let mut ids = Vec::new();
                for (j, key) in chosen.iter().enumerate() {
                    let seq = (w * 1_000 + i * 10 + j as u64) as i64;
                    let id = if sql {
                        let row = tx
                            .query_one(
                                &format!("SELECT {schema}.enqueue($1, $2, $3)"),
                                &[&topic, key, &job_json(key, seq)],
                            )
                            .await
                            .expect("SQL enqueue");
                        row.get::<_, String>(0)
                    } else {
                        outbox
                            .enqueue_to(&tx, &topic, &TestJob::ok(key.as_str(), seq))
                            .await
                            .expect("Rust enqueue")
                            .id
                    };
                    ids.push((key.to_string(), id));
                }
                for (key, id) in &ids {
                    tx.execute(&bump, &[key, id]).await.expect("bump");
                }
                if i % 7 == 6 {
                    tx.rollback().await.expect("ROLLBACK");
                    rolled_back.extend(ids.into_iter().map(|(_, id)| id));
                } else {
                    tx.commit().await.expect("COMMIT");
                }
            }
            rolled_back
        }));
    }
    let mut rolled_back = Vec::new();
    for t in tasks {
        rolled_back.extend(t.await.expect("writer"));
    }
    fx.wait_all_sent(Duration::from_secs(60)).await;
    let rows = fx
        .client
        .query(
            &format!("SELECT key, job_id FROM {t}_commits ORDER BY key, n"),
            &[],
        )
        .await
        .expect("commits");
    let mut expected: HashMap<String, Vec<String>> = HashMap::new();
    for r in rows {
        expected.entry(r.get(0)).or_default().push(r.get(1));
    }
    let mut seen: HashSet<String> = HashSet::new();
    let mut firsts: HashMap<String, Vec<String>> = HashMap::new();
    for m in read_all(&fx.config, &fx.topic) {
        let Some(id) = headers::find(m.headers(), headers::ID) else {
            continue;
        };
        let key = String::from_utf8_lossy(m.key().unwrap_or(b"")).into_owned();
        if key == "probe" || !seen.insert(id.to_string()) {
            continue;
        }
        firsts.entry(key).or_default().push(id.to_string());
    }
    let committed: usize = expected.values().map(Vec::len).sum();
    assert!(committed > 100, "only {committed} jobs committed");
    assert_eq!(firsts, expected, "per key, Kafka order == commit order");
    for id in &rolled_back {
        assert!(!seen.contains(id), "rolled-back job {id} was published");
    }
    println!(
        "{committed} committed jobs from 2 Rust and 2 SQL writers over 8 keys in commit order; {} rolled back, none published",
        rolled_back.len()
    );
    fx.client
        .batch_execute(&format!("DROP TABLE {t}_counters, {t}_commits"))
        .await
        .expect("cleanup");
    fx.finish().await;
}

/// A JSON job that does not fit the contract goes to the DLQ without
/// holding its key; `kjob dlq list/show` show it; `kjob dlq retry` fails
/// naming the field while the contract is unchanged, and re-drives it once
/// a version that fits is registered. Also: a topic with no subject, and a
/// pinned version (registered, and not).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_that_does_not_fit_is_dead_lettered_and_retried_once_the_contract_is_fixed() {
    let fx = SqlFixture::new("dlq").await;
    let kjob_cli = env!("CARGO_BIN_EXE_kjob-cli");
    let s = fx.schema().to_string();
    let enqueue = format!("SELECT {s}.enqueue(topic => $1, key => $2, job => $3, version => $4)");
    let unregistered = unique("kjob.test.sql.nosubject");
    create_topic(&fx.config, &unregistered, 1).await;
    create_topic(&fx.config, &format!("{unregistered}.dlq"), 1).await;
    let mut with_locale = job_json("k", 1);
    with_locale["locale"] = serde_json::json!("de");
    let mut ids = Vec::new();
    for (topic, key, job, version) in [
        (&fx.topic, "k", with_locale, None::<i32>),
        (&fx.topic, "k", job_json("k", 2), None),
        (&fx.topic, "p", job_json("p", 3), Some(1)),
        (&fx.topic, "p", job_json("p", 4), Some(99)),
        (&unregistered, "u", job_json("u", 5), None),
    ] {
        let row = fx
            .client
            .query_one(&enqueue, &[topic, &key, &job, &version])
            .await
            .expect("enqueue");
        ids.push(row.get::<_, String>(0));
    }
    fx.wait_handled(&[2, 3], Duration::from_secs(30)).await;
    fx.wait_all_sent(Duration::from_secs(30)).await;
    assert!(fx.runs(1).is_empty() && fx.runs(4).is_empty());
    let dead = |topic: &str, id: &str| {
        read_all(&fx.config, &format!("{topic}.dlq"))
            .into_iter()
            .find(|m| headers::find(m.headers(), headers::ID) == Some(id))
            .map(|m| {
                (
                    headers::find(m.headers(), headers::ERROR)
                        .unwrap_or("")
                        .to_string(),
                    m.partition(),
                    m.offset(),
                )
            })
    };
    let (locale_error, p, o) = dead(&fx.topic, &ids[0]).expect("the locale job is dead-lettered");
    assert!(
        locale_error.starts_with("locale: record TestJob has no such field"),
        "{locale_error}"
    );
    let (v99, _, _) = dead(&fx.topic, &ids[3]).expect("the v99 job is dead-lettered");
    assert!(v99.contains("has no version 99"), "{v99}");
    let (nosubject, _, _) =
        dead(&unregistered, &ids[4]).expect("the unregistered topic's job is dead-lettered");
    assert!(
        nosubject.contains("no schema is registered under subject"),
        "{nosubject}"
    );

    // The operator's view: `kjob outbox status` counts the three.
    let status = kjob_ok(
        kjob_cli,
        &fx.config,
        &[
            "outbox",
            "status",
            "--json",
            "--database-url",
            &fx.url,
            "--table",
            fx.table.name(),
        ],
    );
    let status: serde_json::Value = serde_json::from_str(status.trim()).expect("status --json");
    assert_eq!(status["dead_lettered"], 3, "{status}");
    let list = kjob_ok(
        kjob_cli,
        &fx.config,
        &[
            "dlq",
            "list",
            "--topic",
            &fx.topic,
            "--class",
            "outbox.encode",
            "--json",
        ],
    );
    let list: serde_json::Value = serde_json::from_str(list.trim()).expect("list --json");
    let listed: Vec<&str> = list
        .as_array()
        .expect("an array")
        .iter()
        .filter_map(|d| d["id"].as_str())
        .collect();
    assert!(
        listed.contains(&ids[0].as_str()) && listed.contains(&ids[3].as_str()),
        "{list}"
    );
    let at = format!("{p}:{o}");
    let show = kjob_ok(
        kjob_cli,
        &fx.config,
        &["dlq", "show", "--topic", &fx.topic, &at, "--json"],
    );
    let show: serde_json::Value = serde_json::from_str(show.trim()).expect("show --json");
    assert_eq!(show["payload_format"], "json", "{show}");
    assert_eq!(show["payload"]["locale"], "de", "{show}");
    assert_eq!(show["headers"]["kjob-error-class"], "outbox.encode");

    // Retry before the contract changed: refused, naming the field; still listed.
    let refused = run_kjob(
        kjob_cli,
        &fx.config,
        &["dlq", "retry", "--topic", &fx.topic, &at, "--execute"],
    );
    assert_ne!(
        refused.code, 0,
        "retry of an unfixed job succeeded: {}",
        refused.stdout
    );
    assert!(refused.stderr.contains("locale"), "{}", refused.stderr);

    // The contract is fixed: a version with `locale` (default "en").
    let v2 = r#"{"type":"record","name":"TestJob","namespace":"kjob.test","fields":[
        {"name":"key","type":"string"},{"name":"seq","type":"long"},
        {"name":"behaviour","type":"string","default":"ok"},
        {"name":"locale","type":"string","default":"en"}]}"#;
    let codec = kjob::codec::Codec::from_config(&fx.config).expect("codec");
    let reg = codec
        .client()
        .register(&subject_for_topic(&fx.topic), v2)
        .await
        .expect("registering v2");
    assert!(matches!(reg, Registration::Id(_)), "{reg:?}");
    kjob_ok(
        kjob_cli,
        &fx.config,
        &["dlq", "retry", "--topic", &fx.topic, &at, "--execute"],
    );
    fx.wait_handled(&[1], Duration::from_secs(30)).await;
    let runs = fx.runs(1);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].id, ids[0], "the re-driven job keeps its kjob-id");
    let after = kjob_ok(
        kjob_cli,
        &fx.config,
        &["dlq", "list", "--topic", &fx.topic, "--json"],
    );
    assert!(
        !after.contains(&ids[0]),
        "the re-driven job is no longer unresolved: {after}"
    );
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_migration_upgrades_an_older_table_concurrently_and_repeatably() {
    init_logging();
    let url = ensure_postgres();
    let config = ensure_stack();
    let name = unique("kjob_outbox_old").replace('.', "_");
    let table = OutboxTable::new(&name).expect("table");
    let s = table.functions_schema().to_string();
    let client = pg(&url).await;
    client
        .batch_execute(&OLD_SCHEMA.replace("{table}", &name))
        .await
        .expect("the old table");
    let topic = unique("kjob.test.sql.upgrade");
    create_topic(&config, &topic, 1).await;
    let outbox = Outbox::new(&config)
        .expect("outbox")
        .table(&name)
        .expect("table");
    {
        let mut c = pg(&url).await;
        let tx = c.transaction().await.expect("BEGIN");
        outbox
            .enqueue_to(&tx, &topic, &TestJob::ok("old", 1))
            .await
            .expect("a row written before the upgrade");
        tx.commit().await.expect("COMMIT");
    }
    // Four deploys migrate at once, then one more later.
    let runs = (0..4).map(|_| {
        let (url, table) = (url.clone(), table.clone());
        tokio::spawn(async move {
            let c = pg(&url).await;
            kjob::outbox::migrate(&c, &table).await
        })
    });
    for r in futures::future::join_all(runs).await {
        r.expect("task").expect("a concurrent migration succeeds");
    }
    kjob::outbox::migrate(&client, &table)
        .await
        .expect("migrating again");
    let cols: Vec<String> = client
        .query(
            "SELECT attname::text FROM pg_attribute WHERE attrelid = $1::text::regclass AND attnum > 0 AND NOT attisdropped",
            &[&name],
        )
        .await
        .expect("columns")
        .iter()
        .map(|r| r.get(0))
        .collect();
    for c in ["payload_json", "run_at", "schema_version"] {
        assert!(cols.iter().any(|x| x == c), "{c} missing: {cols:?}");
    }
    // Both kinds of rows now: the old Avro one, a new Rust one, a JSON one.
    let mut c = pg(&url).await;
    let tx = c.transaction().await.expect("BEGIN");
    outbox
        .enqueue_to(&tx, &topic, &TestJob::ok("new", 2))
        .await
        .expect("Rust enqueue after the upgrade");
    let json_id: String = tx
        .query_one(
            &format!("SELECT {s}.enqueue($1, 'json', $2)"),
            &[&topic, &job_json("json", 3)],
        )
        .await
        .expect("SQL enqueue after the upgrade")
        .get(0);
    tx.commit().await.expect("COMMIT");
    let neither = client
        .execute(
            &format!("INSERT INTO {name} (bucket, job_id, topic, key, headers) VALUES (0, 'x', 't', 'k', '{{}}')"),
            &[],
        )
        .await
        .err()
        .unwrap_or_else(|| panic!("a row with neither payload was accepted"));
    assert_eq!(
        neither.code(),
        Some(&SqlState::CHECK_VIOLATION),
        "{neither}"
    );
    let relay = Relay::new(&url, config.clone())
        .table(&name)
        .expect("table")
        .poll_interval(Duration::from_millis(100));
    let stats = relay.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run_until(async {
        let _ = stopped.await;
    }));
    let started = Instant::now();
    while stats.published.load(std::sync::atomic::Ordering::Relaxed) < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the relay did not publish the 3 rows"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(());
    running.await.expect("relay task").expect("relay ran");
    let records = read_all(&config, &topic);
    assert_eq!(records.len(), 3);
    assert!(records
        .iter()
        .any(|m| headers::find(m.headers(), headers::ID) == Some(json_id.as_str())));

    // A second table's functions into the same schema: refused, naming the fix.
    let other = unique("kjob_outbox_other").replace('.', "_");
    let into_same = OutboxTable::new(&other)
        .expect("table")
        .with_functions_schema(&s)
        .expect("schema name");
    let err = kjob::outbox::migrate(&client, &into_same)
        .await
        .err()
        .unwrap_or_else(|| panic!("a second table's functions replaced the first's"));
    assert!(
        err.to_string()
            .contains("already holds the SQL enqueue of another outbox table"),
        "{err}"
    );
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {name}, {other}; DROP SCHEMA {s} CASCADE"
        ))
        .await
        .expect("cleanup");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_time_checks_fail_the_call_and_enqueue_many_keeps_its_order() {
    init_logging();
    let url = ensure_postgres();
    let name = unique("kjob_outbox_checks").replace('.', "_");
    let table = OutboxTable::new(&name).expect("table");
    let s = table.functions_schema().to_string();
    let mut client = pg(&url).await;
    kjob::outbox::migrate(&client, &table)
        .await
        .expect("migrate");
    let cases: [(&str, &str); 10] = [
        ("'', 'k', '{}'", "topic is empty"),
        ("'bad topic!', 'k', '{}'", "is not a Kafka topic name"),
        ("'orders.dlq', 'k', '{}'", "one of kjob's own topics"),
        ("'orders.retry.5s', 'k', '{}'", "one of kjob's own topics"),
        ("'orders', '', '{}'", "key is empty"),
        ("'orders', 'k', '[1]'", "must be a JSON object"),
        ("'orders', 'k', NULL", "job is NULL"),
        (
            "'orders', 'k', '{}', run_at => now() + interval '31 days'",
            "more than 30 days ahead",
        ),
        (
            "'orders', 'k', '{}', version => 0",
            "is not a subject version",
        ),
        (
            "'orders', 'k', '{}', headers => '{\"kjob-id\": \"mine\"}'",
            "cannot set kjob-id",
        ),
    ];
    for (args, want) in cases {
        let e = client
            .query_one(&format!("SELECT {s}.enqueue({args})"), &[])
            .await
            .err()
            .unwrap_or_else(|| panic!("{args} was accepted"));
        assert_eq!(
            e.code(),
            Some(&SqlState::INVALID_PARAMETER_VALUE),
            "{args}: {e}"
        );
        let msg = e
            .as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_default();
        assert!(msg.contains(want), "{args}: {msg}");
        assert!(msg.starts_with(&format!("{s}.enqueue: ")), "{msg}");
    }
    // Not JSON text at all: PostgreSQL's own cast error, before kjob runs
    // (the book's insert-time section names it).
    let e = client
        .query_one(
            &format!("SELECT {s}.enqueue('orders', 'k', '{{\"order_id\": '::jsonb)"),
            &[],
        )
        .await
        .err()
        .unwrap_or_else(|| panic!("malformed JSON was accepted"));
    assert_eq!(
        e.code(),
        Some(&SqlState::INVALID_TEXT_REPRESENTATION),
        "{e}"
    );
    let e = client
        .query_one(
            &format!("SELECT {s}.enqueue_many('orders', $1)"),
            &[&serde_json::json!([{"key": "a", "job": {}}, {"key": "b", "job": {}, "run_at": 5}])],
        )
        .await
        .err()
        .unwrap_or_else(|| panic!("a numeric run_at was accepted"));
    let msg = e
        .as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_default();
    assert!(
        msg.contains("jobs[1] run_at must be a timestamp string"),
        "{msg}"
    );

    // enqueue_many: ids in array order, rows in array order, headers set.
    let tx = client.transaction().await.expect("BEGIN");
    let jobs = serde_json::json!([
        {"key": "z", "job": {"n": 1}, "tenant": "shop-7"},
        {"key": "a", "job": {"n": 2}, "headers": {"traceparent": "00-abc-def-01"}},
        {"key": "z", "job": {"n": 3}, "run_at": "2020-01-01T00:00:00Z", "version": 2},
    ]);
    let ids: Vec<String> = tx
        .query_one(&format!("SELECT {s}.enqueue_many('orders', $1)"), &[&jobs])
        .await
        .expect("enqueue_many")
        .get(0);
    let empty: Vec<String> = tx
        .query_one(&format!("SELECT {s}.enqueue_many('orders', '[]')"), &[])
        .await
        .expect("an empty batch")
        .get(0);
    assert!(empty.is_empty());
    let rows = tx
        .query(
            &format!("SELECT job_id, payload_json->>'n', headers, schema_version, run_at IS NOT NULL FROM {name} ORDER BY id"),
            &[],
        )
        .await
        .expect("rows");
    let got: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        got,
        ids.iter()
            .cloned()
            .zip(["1", "2", "3"].map(String::from))
            .collect::<Vec<_>>()
    );
    let h0: serde_json::Value = rows[0].get(2);
    assert_eq!(h0["kjob-tenant"], "shop-7");
    assert_eq!(h0["kjob-id"], ids[0].as_str());
    assert_eq!(h0["kjob-attempt"], "1");
    let h1: serde_json::Value = rows[1].get(2);
    assert_eq!(h1["traceparent"], "00-abc-def-01");
    assert_eq!(rows[2].get::<_, Option<i32>>(3), Some(2));
    assert!(rows[2].get::<_, bool>(4));
    // UUIDv7: version 7, and the time is now.
    let v7 = uuid::Uuid::parse_str(&ids[0]).expect("a UUID");
    assert_eq!(v7.get_version_num(), 7);
    let (secs, _) = v7.get_timestamp().expect("v7 carries a time").to_unix();
    let now = kjob::dlq::now_ms() / 1000;
    assert!(
        (now - secs as i64).abs() < 60,
        "uuid time {secs} vs now {now}"
    );
    tx.rollback().await.expect("ROLLBACK");
    client
        .batch_execute(&format!("DROP TABLE {name}; DROP SCHEMA {s} CASCADE"))
        .await
        .expect("cleanup");
}
