//! The fixture of the SQL enqueue tests (`tests/tests/outbox_sql.rs`,
//! `tests/tests/polyglot.rs`): an outbox table of the test's own with its
//! SQL functions, a route whose contract ([`TestJob`]) is registered, a
//! relay, and a real kjob worker recording every job it handles.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kjob::outbox::{OutboxTable, Relay, RelayStats};
use kjob::{JobContext, KafkaConfig, Producer, Worker};
use tokio_postgres::{Client, NoTls};

use crate::{
    create_topic, ensure_postgres, ensure_stack, init_logging, start, unique, Running, TestJob,
};

/// One run of a job by the fixture's worker.
#[derive(Clone, Debug)]
pub struct Handled {
    /// The job's `seq`.
    pub seq: i64,
    /// Its `kjob-id`.
    pub id: String,
    /// Its `behaviour` field.
    pub behaviour: String,
    /// When the handler ran (epoch ms).
    pub at_ms: i64,
    /// The attempt.
    pub attempt: u32,
}

/// Connects to PostgreSQL, driving the connection on the test's runtime.
pub async fn pg(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connecting to PostgreSQL");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A test's own route, outbox table and SQL functions, relay and worker.
pub struct SqlFixture {
    /// The PostgreSQL URL.
    pub url: String,
    /// The stack.
    pub config: KafkaConfig,
    /// The outbox table (and its functions schema).
    pub table: OutboxTable,
    /// The route's main topic (3 partitions).
    pub topic: String,
    /// A connection of the test's own.
    pub client: Client,
    /// Every job the worker handled, in the order it ran them.
    pub handled: Arc<Mutex<Vec<Handled>>>,
    /// The relay's counters.
    pub relay_stats: Arc<RelayStats>,
    worker: Option<Running>,
    relay: Option<(
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    )>,
}

impl SqlFixture {
    /// Creates the topic and the table (migrated, so with its functions in
    /// `kjob_<table>`), registers [`TestJob`]'s contract under the topic's
    /// subject, and starts the worker (delayed jobs on) and the relay. The
    /// worker has handled a probe job (seq -1) when this returns.
    pub async fn new(prefix: &str) -> Self {
        init_logging();
        let url = ensure_postgres();
        let config = ensure_stack();
        let name = unique(&format!("kjob_outbox_{prefix}")).replace('.', "_");
        let table = OutboxTable::new(&name).expect("table name");
        let topic = unique(&format!("kjob.test.sql.{prefix}"));
        create_topic(&config, &topic, 3).await;
        let client = pg(&url).await;
        kjob::outbox::migrate(&client, &table)
            .await
            .expect("migrating the outbox table");
        let handled: Arc<Mutex<Vec<Handled>>> = Arc::default();
        let h = handled.clone();
        let worker = Worker::builder(config.clone(), unique("g"))
            .handle_on(&topic, move |job: TestJob, ctx: JobContext| {
                let h = h.clone();
                async move {
                    h.lock().unwrap_or_else(|p| p.into_inner()).push(Handled {
                        seq: job.seq,
                        id: ctx.id.to_string(),
                        behaviour: job.behaviour.clone(),
                        at_ms: kjob::dlq::now_ms(),
                        attempt: ctx.attempt,
                    });
                    Ok(())
                }
            })
            .delayed_jobs(true)
            .retry(kjob::retry::RetryPolicy::tiers([Duration::from_secs(1)]))
            .build()
            .expect("worker builds");
        let worker = start(worker);
        // The probe registers the contract and shows the worker runs jobs
        // (a new group's first join takes a moment).
        let producer = Producer::new(&config).expect("producer");
        producer
            .enqueue_to(&topic, &TestJob::ok("probe", -1))
            .await
            .expect("probe enqueued");
        let relay = Relay::new(&url, config.clone())
            .table(table.name())
            .expect("table name")
            .poll_interval(Duration::from_millis(100));
        let relay_stats = relay.stats();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            relay
                .run_until(async {
                    let _ = stopped.await;
                })
                .await
                .expect("relay ran");
        });
        let fx = Self {
            url,
            config,
            table,
            topic,
            client,
            handled,
            relay_stats,
            worker: Some(worker),
            relay: Some((stop, task)),
        };
        fx.wait_handled(&[-1], Duration::from_secs(60)).await;
        fx
    }

    /// The functions schema (`<schema>.enqueue`).
    pub fn schema(&self) -> &str {
        self.table.functions_schema()
    }

    /// The runs of `seq` so far.
    pub fn runs(&self, seq: i64) -> Vec<Handled> {
        self.handled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|h| h.seq == seq)
            .cloned()
            .collect()
    }

    /// Waits until every seq in `seqs` ran at least once.
    pub async fn wait_handled(&self, seqs: &[i64], timeout: Duration) {
        let start = Instant::now();
        loop {
            let missing: Vec<i64> = seqs
                .iter()
                .copied()
                .filter(|s| self.runs(*s).is_empty())
                .collect();
            if missing.is_empty() {
                return;
            }
            assert!(
                start.elapsed() < timeout,
                "jobs {missing:?} not handled after {timeout:?} (relay published {}, dead-lettered {})",
                self.relay_stats
                    .published
                    .load(std::sync::atomic::Ordering::Relaxed),
                self.relay_stats
                    .dead_lettered
                    .load(std::sync::atomic::Ordering::Relaxed)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the relay has nothing left to publish.
    pub async fn wait_all_sent(&self, timeout: Duration) {
        let start = Instant::now();
        loop {
            let unsent: i64 = self
                .client
                .query_one(
                    &format!(
                        "SELECT count(*) FROM {} WHERE sent_at IS NULL",
                        self.table.name()
                    ),
                    &[],
                )
                .await
                .expect("counting unsent rows")
                .get(0);
            if unsent == 0 {
                return;
            }
            assert!(
                start.elapsed() < timeout,
                "{unsent} outbox rows unsent after {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the relay and the worker and drops the table and its schema.
    pub async fn finish(mut self) {
        if let Some((stop, task)) = self.relay.take() {
            let _ = stop.send(());
            task.await.expect("relay task");
        }
        if let Some(w) = self.worker.take() {
            w.stop().await;
        }
        let _ = self
            .client
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {t}, {t}_orders; DROP SCHEMA IF EXISTS {s} CASCADE",
                t = self.table.name(),
                s = self.table.functions_schema()
            ))
            .await;
    }
}
