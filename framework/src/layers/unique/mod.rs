//! Uniqueness: skip a job whose uniqueness key was handled within a window
//! (feature `postgres`). "Recompute this shop's statistics at most once a
//! minute", "send the low-stock alert for this product at most once an
//! hour": whatever is enqueued meanwhile finishes without a handler call.
//!
//! ```no_run
//! # async fn doc(client: std::sync::Arc<tokio_postgres::Client>, config: kjob::KafkaConfig) -> anyhow::Result<()> {
//! # use kjob::prelude::*;
//! # #[derive(serde::Serialize, serde::Deserialize, Job)]
//! # #[job(name = "stats.recompute", version = 1, key = shop)]
//! # struct Recompute { shop: String }
//! # async fn recompute(_: Recompute, _: JobContext) -> Result<(), JobError> { Ok(()) }
//! use kjob::layers::unique::Unique;
//! let once_a_minute = Unique::new(client, "kjob_unique", std::time::Duration::from_secs(60))?;
//! once_a_minute.create_table().await?;
//! Worker::builder(config, "stats")
//!     .handle_on("stats.recompute", recompute)
//!     .layer_for("stats.recompute", once_a_minute)
//!     .build()?;
//! # Ok(()) }
//! ```
//!
//! **Where the state lives: PostgreSQL**, one row per `(job, key)` with
//! the time it was last handled. Not a compacted topic: every worker of the
//! group would have to read all of it (a uniqueness key computed from the
//! job lands on any partition), and hold every key handled within the
//! window in memory. A row is checked with one indexed read before the
//! handler, survives restarts and rebalances, and rows older than the
//! window are deleted as the layer goes (at most once a minute).
//!
//! **What it keeps.** The key is claimed only once the handler succeeded,
//! so a job that fails and retries is not skipped by its own earlier
//! attempt, and a crash between the handler and the claim runs the next
//! job of the key again (never one too few); so does a claim the database
//! refuses after the handler succeeded (logged). It is not a lock: with a
//! uniqueness key other than the record key, two jobs of one key running
//! at the same moment on different partitions both run. With the record
//! key (the default) a key's jobs run one after another, so that cannot
//! happen. A database error on the check fails the attempt as retryable:
//! the job is retried, never skipped by accident.
//!
//! A skipped job counts as handled (`outcome="ok"`) and in
//! [`Unique::skipped`], and is logged at debug level.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio_postgres::Client;
use tracing::{debug, warn};

use super::{from_fn, AttemptService, FromFnService, Middleware, Next, Request};
use crate::classify::JobError;

/// How a job's uniqueness key is computed (`None`: no key, the job runs).
type KeyFn = Arc<dyn Fn(&Request) -> Option<String> + Send + Sync>;

/// See the module docs. Cloning shares the client and the counters.
#[derive(Clone)]
pub struct Unique {
    client: Arc<Client>,
    table: Arc<str>,
    window: Duration,
    key: KeyFn,
    skipped: Arc<AtomicU64>,
    pruned_at: Arc<AtomicI64>,
}

impl Unique {
    /// Skips a job whose record key was handled within `window`, with the
    /// state in `table` (letters, digits and `_`, one optional `schema.`
    /// prefix) reached through `client`.
    pub fn new(client: Arc<Client>, table: &str, window: Duration) -> Result<Self, crate::Error> {
        // The same rule as the idempotency markers' table names.
        crate::idempotency::PgMarkers::new(table)?;
        if window.is_zero() {
            return Err(crate::Error::InvalidSetting {
                name: "unique window".into(),
                value: "0s".into(),
                reason: "a uniqueness window must be longer than zero".into(),
            });
        }
        Ok(Self {
            client,
            table: table.into(),
            window,
            key: Arc::new(|req: &Request| req.ctx().key.as_deref().map(str::to_string)),
            skipped: Arc::default(),
            pruned_at: Arc::default(),
        })
    }

    /// Uniqueness by something else than the record key, computed from the
    /// request (typically `req.job::<J>()`); `None` lets the job run.
    pub fn key_with(
        mut self,
        key: impl Fn(&Request) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.key = Arc::new(key);
        self
    }

    /// Creates the table if it does not exist (under kjob's DDL lock, so
    /// replicas starting together do not fail on it).
    pub async fn create_table(&self) -> Result<(), tokio_postgres::Error> {
        crate::ddl::create_serialised(
            &*self.client,
            &format!(
                "CREATE TABLE IF NOT EXISTS {} (
                    job text NOT NULL,
                    key text NOT NULL,
                    handled_at timestamptz NOT NULL,
                    PRIMARY KEY (job, key)
                )",
                self.table
            ),
        )
        .await
    }

    /// Jobs skipped since this layer was made.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    async fn handled_recently(&self, job: &str, key: &str) -> Result<bool, tokio_postgres::Error> {
        let row = self
            .client
            .query_opt(
                &format!(
                    "SELECT 1 FROM {} WHERE job = $1 AND key = $2 \
                     AND handled_at > now() - make_interval(secs => $3)",
                    self.table
                ),
                &[&job, &key, &self.window.as_secs_f64()],
            )
            .await?;
        Ok(row.is_some())
    }

    async fn claim(&self, job: &str, key: &str) -> Result<(), tokio_postgres::Error> {
        self.client
            .execute(
                &format!(
                    "INSERT INTO {} (job, key, handled_at) VALUES ($1, $2, now()) \
                     ON CONFLICT (job, key) DO UPDATE SET handled_at = EXCLUDED.handled_at",
                    self.table
                ),
                &[&job, &key],
            )
            .await?;
        // Rows past the window serve no one: removed at most once a minute.
        let now = crate::clock::now_ms();
        let last = self.pruned_at.load(Ordering::Relaxed);
        if now - last > 60_000
            && self
                .pruned_at
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            self.client
                .execute(
                    &format!(
                        "DELETE FROM {} WHERE handled_at < now() - make_interval(secs => $1)",
                        self.table
                    ),
                    &[&self.window.as_secs_f64()],
                )
                .await?;
        }
        Ok(())
    }
}

fn db_error(e: &tokio_postgres::Error) -> JobError {
    JobError::retryable(format!("uniqueness check: {e}"))
}

impl Middleware for Unique {
    fn call(&self, req: Request, next: Next) -> BoxFuture<'static, Result<(), JobError>> {
        let unique = self.clone();
        Box::pin(async move {
            let Some(key) = (unique.key)(&req) else {
                return next.run(req).await;
            };
            let job = req.ctx().job.clone();
            match unique.handled_recently(&job, &key).await {
                Ok(true) => {
                    unique.skipped.fetch_add(1, Ordering::Relaxed);
                    debug!(job.id = %req.ctx().id, job.type = %job, key = %key, "handled within the uniqueness window; skipped");
                    return Ok(());
                }
                Ok(false) => {}
                Err(e) => return Err(db_error(&e)),
            }
            next.run(req).await?;
            // The effect happened: a failed claim must not run it again. The
            // next job of the key then runs too (one more, never one too few).
            if let Err(e) = unique.claim(&job, &key).await {
                warn!(job.type = %job, key = %key, error = %e, "could not record a handled uniqueness key; the next job of the key will run");
            }
            Ok(())
        })
    }
}

impl tower::Layer<AttemptService> for Unique {
    type Service = FromFnService<Unique>;
    fn layer(&self, inner: AttemptService) -> Self::Service {
        from_fn(self.clone()).layer(inner)
    }
}
