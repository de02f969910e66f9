//! Uniqueness on the real stack (`kjob::layers::unique`, state in
//! PostgreSQL): a job whose key was handled within the window is skipped,
//! also by a worker started after a restart; a failed attempt claims
//! nothing; once the window passed the key runs again; a key computed from
//! the job works across record keys.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kjob::layers::unique::Unique;
use kjob::{JobContext, JobError, Producer, Worker};
use kjob_integration_tests::*;

async fn client(url: &str) -> Arc<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connecting to PostgreSQL");
    tokio::spawn(connection);
    Arc::new(client)
}

type Ran = Arc<Mutex<Vec<i64>>>;

fn worker(
    config: &kjob::KafkaConfig,
    topic: &str,
    group: &str,
    unique: Unique,
    ran: Ran,
) -> Worker {
    Worker::builder(config.clone(), group)
        .handle_on(topic, move |job: TestJob, ctx: JobContext| {
            let ran = ran.clone();
            async move {
                if job.behaviour == "fail-first" && ctx.attempt == 1 {
                    return Err(JobError::retryable("test: first attempt fails"));
                }
                ran.lock().unwrap_or_else(|e| e.into_inner()).push(job.seq);
                Ok(())
            }
        })
        .layer_for(topic, unique)
        .retry(kjob::retry::RetryPolicy::tiers([Duration::from_secs(1)]))
        .build()
        .expect("worker builds")
}

fn ran_now(ran: &Ran) -> Vec<i64> {
    ran.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_handled_within_the_window_is_skipped_across_a_restart() {
    init_logging();
    let config = ensure_stack();
    let db = client(&ensure_postgres()).await;
    let table = unique("kjob_unique").replace('.', "_");
    let window = Duration::from_secs(8);
    let layer = Unique::new(db.clone(), &table, window).expect("valid table name");
    layer.create_table().await.expect("create table");
    let topic = unique("unique");
    let group = unique("g");
    create_topic(&config, &topic, 2).await;
    let producer = Producer::new(&config).expect("producer");
    let ran: Ran = Arc::default();
    let running = start(worker(&config, &topic, &group, layer.clone(), ran.clone()));
    // A first attempt that fails claims nothing: its retry runs.
    let mut flaky = TestJob::ok("shop-a", 1);
    flaky.behaviour = "fail-first".into();
    producer.enqueue_to(&topic, &flaky).await.expect("enqueue");
    eventually(Duration::from_secs(30), "shop-a's retry ran", || {
        ran_now(&ran) == [1]
    })
    .await;
    // Within the window: skipped. Another key runs.
    producer
        .enqueue_to(&topic, &TestJob::ok("shop-a", 2))
        .await
        .expect("enqueue");
    producer
        .enqueue_to(&topic, &TestJob::ok("shop-b", 3))
        .await
        .expect("enqueue");
    eventually(Duration::from_secs(30), "shop-b ran", || {
        ran_now(&ran).contains(&3)
    })
    .await;
    eventually(Duration::from_secs(30), "shop-a skipped", || {
        layer.skipped() == 1
    })
    .await;
    running.stop().await;
    // A new worker (a restart) reads the same state.
    let after = Unique::new(db.clone(), &table, window).expect("valid table name");
    let running = start(worker(&config, &topic, &group, after.clone(), ran.clone()));
    producer
        .enqueue_to(&topic, &TestJob::ok("shop-a", 4))
        .await
        .expect("enqueue");
    eventually(
        Duration::from_secs(30),
        "shop-a skipped after the restart",
        || after.skipped() == 1,
    )
    .await;
    // Once the window passed, the key runs again.
    tokio::time::sleep(window).await;
    producer
        .enqueue_to(&topic, &TestJob::ok("shop-a", 5))
        .await
        .expect("enqueue");
    eventually(
        Duration::from_secs(30),
        "shop-a ran after its window",
        || ran_now(&ran).contains(&5),
    )
    .await;
    running.stop().await;
    let mut all = ran_now(&ran);
    all.sort_unstable();
    assert_eq!(all, [1, 3, 5], "skipped jobs never reached the handler");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_computed_from_the_job_spans_record_keys() {
    init_logging();
    let config = ensure_stack();
    let db = client(&ensure_postgres()).await;
    let table = unique("kjob_unique").replace('.', "_");
    // Unique by the job's behaviour field, whatever its record key.
    let layer = Unique::new(db, &table, Duration::from_secs(60))
        .expect("valid table name")
        .key_with(|req| req.job::<TestJob>().map(|j| j.behaviour.clone()));
    layer.create_table().await.expect("create table");
    let topic = unique("unique.fn");
    create_topic(&config, &topic, 1).await;
    let ran: Ran = Arc::default();
    let running = start(worker(
        &config,
        &topic,
        &unique("g"),
        layer.clone(),
        ran.clone(),
    ));
    let producer = Producer::new(&config).expect("producer");
    // Not a lock (jobs of other record keys run side by side): the first
    // is handled and claimed before the others come.
    producer
        .enqueue_to(&topic, &TestJob::ok("k0", 0))
        .await
        .expect("enqueue");
    let check = client(&ensure_postgres()).await;
    let sql = format!("SELECT count(*) FROM {table}");
    let start_at = std::time::Instant::now();
    loop {
        let n: i64 = check.query_one(&sql, &[]).await.expect("count").get(0);
        if n == 1 {
            break;
        }
        assert!(
            start_at.elapsed() < Duration::from_secs(30),
            "the first job never claimed its key"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for seq in 1..5 {
        producer
            .enqueue_to(&topic, &TestJob::ok(format!("k{seq}"), seq))
            .await
            .expect("enqueue");
    }
    eventually(Duration::from_secs(30), "four skipped", || {
        layer.skipped() == 4
    })
    .await;
    running.stop().await;
    assert_eq!(ran_now(&ran), [0], "one of the five ran: the first");
    // Bad input: a table name that is not one, and a zero window.
    let db = client(&ensure_postgres()).await;
    assert!(Unique::new(db.clone(), "x; DROP TABLE y", Duration::from_secs(1)).is_err());
    assert!(Unique::new(db, "ok_table", Duration::ZERO).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_does_not_answer_retries_the_job_and_skips_nothing() {
    init_logging();
    let config = ensure_stack();
    let url = ensure_postgres();
    let table = unique("kjob_unique").replace('.', "_");
    Unique::new(client(&url).await, &table, Duration::from_secs(60))
        .expect("valid table name")
        .create_table()
        .await
        .expect("create table");
    // A client whose connection is gone: every query fails.
    let (dead, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connecting to PostgreSQL");
    tokio::spawn(connection).abort();
    let layer = Unique::new(Arc::new(dead), &table, Duration::from_secs(60)).expect("valid");
    let topic = unique("unique.down");
    create_topic(&config, &topic, 1).await;
    let ran: Ran = Arc::default();
    let running = start(worker(
        &config,
        &topic,
        &unique("g"),
        layer.clone(),
        ran.clone(),
    ));
    let producer = Producer::new(&config).expect("producer");
    producer
        .enqueue_to(&topic, &TestJob::ok("shop-a", 1))
        .await
        .expect("enqueue");
    eventually(Duration::from_secs(30), "the attempt was retried", || {
        kjob::WorkerStats::get(&running.stats.retried) >= 1
    })
    .await;
    running.stop().await;
    assert_eq!(layer.skipped(), 0, "never skipped for want of an answer");
    assert!(ran_now(&ran).is_empty(), "not run without its check");
}
