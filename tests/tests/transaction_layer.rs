//! The handler crate's `PgTransaction` layer against real Kafka and real
//! PostgreSQL: an attempt's rows survive only when the handler returned
//! `Ok`. Failed, panicked and timed-out attempts leave nothing behind, and
//! retries run in a fresh transaction on a clean connection (a panic is a
//! bug: dead-lettered, never retried).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kjob::retry::RetryPolicy;
use kjob::{Ext, JobContext, JobError, Producer, Worker};
use kjob_example_handler_crate::tx::{pool, PgTransaction, Tx};
use kjob_integration_tests::*;

const JOBS: i64 = 40;
/// How each job's first attempt ends, by `seq % 4`: `ok` commits, `error`
/// and `timeout` are retried once and commit then, `panic` goes to the DLQ.
const FIRST_ATTEMPT: [&str; 4] = ["ok", "error", "panic", "timeout"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_attempts_that_returned_ok_leave_rows() {
    init_logging();
    let config = ensure_stack();
    let db = ensure_postgres();
    let (client, connection) = tokio_postgres::connect(&db, tokio_postgres::NoTls)
        .await
        .expect("connect to PostgreSQL");
    tokio::spawn(connection);
    let table = unique("tx_effects").replace(['.', '-'], "_");
    client
        .batch_execute(&format!(
            "CREATE TABLE {table} (seq bigint NOT NULL, attempt int NOT NULL)"
        ))
        .await
        .expect("create table");

    let topic = unique("txlayer");
    create_topic(&config, &topic, 2).await;
    let producer = Producer::new(&config).expect("producer");
    enqueue_n(&producer, &topic, JOBS, JOBS, "ok").await;

    let attempts = Arc::new(AtomicU64::new(0));
    let (a, t) = (attempts.clone(), table.clone());
    let worker = Worker::builder(config.clone(), unique("txlayer-g"))
        .layer_for(&topic, PgTransaction::new(pool(&db).expect("pool")))
        .handle_on(
            &topic,
            move |job: TestJob, ctx: JobContext, Ext(tx): Ext<Tx>| {
                let (a, t) = (a.clone(), t.clone());
                async move {
                    a.fetch_add(1, Ordering::Relaxed);
                    let attempt = i32::try_from(ctx.attempt).unwrap_or(i32::MAX);
                    tx.client()
                        .await
                        .execute(
                            &format!("INSERT INTO {t} (seq, attempt) VALUES ($1, $2)"),
                            &[&job.seq, &attempt],
                        )
                        .await?;
                    if ctx.attempt > 1 {
                        return Ok(());
                    }
                    match FIRST_ATTEMPT[(job.seq % 4) as usize] {
                        "error" => Err(JobError::server("503 after the insert")),
                        "panic" => panic!("a bug after the insert"),
                        // Longer than the handler timeout: dropped mid-attempt.
                        "timeout" => {
                            tokio::time::sleep(Duration::from_secs(10)).await;
                            Ok(())
                        }
                        _ => Ok(()),
                    }
                }
            },
        )
        .handler_timeout(Duration::from_secs(1))
        .retry(RetryPolicy::tiers([Duration::from_secs(1)]).jitter(0.0))
        .build()
        .expect("worker builds");
    let running = start(worker);

    let count = |sql: String| {
        let client = &client;
        async move {
            client
                .query_one(&sql, &[])
                .await
                .expect("count")
                .get::<_, i64>(0)
        }
    };
    let committing = JOBS - JOBS / 4;
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while count(format!("SELECT count(*) FROM {table}")).await < committing {
        assert!(
            std::time::Instant::now() < deadline,
            "not every ok, error and timeout job committed its row within 90 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Let anything that would wrongly commit late do so before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    running.stop().await;

    let rows = count(format!("SELECT count(*) FROM {table}")).await;
    let distinct = count(format!("SELECT count(DISTINCT seq) FROM {table}")).await;
    let left_behind = count(format!(
        "SELECT count(*) FROM {table} WHERE (attempt = 1 AND seq % 4 <> 0) OR seq % 4 = 2"
    ))
    .await;
    let retried_rows = count(format!("SELECT count(*) FROM {table} WHERE attempt = 2")).await;
    assert_eq!(
        left_behind, 0,
        "a failed, panicked or timed-out attempt left its insert behind"
    );
    assert_eq!(rows, committing, "one committed row per committing job");
    assert_eq!(
        distinct, committing,
        "every ok, error and timeout job committed"
    );
    assert_eq!(
        retried_rows,
        JOBS / 2,
        "the error and timeout jobs committed on their second attempt"
    );
    assert_eq!(
        attempts.load(Ordering::Relaxed),
        (JOBS + JOBS / 2) as u64,
        "one attempt per job, and a second for each error and timeout job"
    );
}
