//! A layer that runs every attempt inside one PostgreSQL transaction,
//! committed only when the handler returned `Ok`.
//!
//! Why a layer and not code in each handler: the rule "a job's database
//! effects happen together with its success, or not at all" then holds for
//! every route the layer is on, and a handler cannot forget the rollback on
//! its error path. With kjob's at-least-once delivery, put the idempotency
//! marker ([`kjob::idempotency::PgMarkers`]) in the same transaction and
//! the effects are exactly once.
//!
//! How it fits together:
//! * the layer takes a connection from a pool and sends `BEGIN`;
//! * the handler takes the transaction as an argument, `Ext(tx): Ext<Tx>`,
//!   and runs its statements through [`Tx::client`];
//! * `Ok` from the handler: the layer sends `COMMIT`, and a failed commit
//!   fails the attempt (classified like any `tokio_postgres` error, so a
//!   lost connection is retried);
//! * an error, a timeout or a panic below the layer: `ROLLBACK`. A timeout
//!   or a panic can leave the connection mid-statement, so the pool also
//!   rolls back whenever it recycles a connection (see [`pool`]).
//!
//! ```no_run
//! use kjob::{Ext, JobContext, JobError, KafkaConfig, Worker};
//! use kjob_example_handler_crate::contracts::RenderInvoice;
//! use kjob_example_handler_crate::tx::{pool, PgTransaction, Tx};
//!
//! async fn render(job: RenderInvoice, _ctx: JobContext, Ext(tx): Ext<Tx>) -> Result<(), JobError> {
//!     tx.client()
//!         .await
//!         .execute("INSERT INTO invoices (order_id, total_cents) VALUES ($1, 0)", &[&job.order_id])
//!         .await?; // committed only if this handler returns Ok
//!     Ok(())
//! }
//!
//! # fn main() -> anyhow::Result<()> {
//! let db = pool("postgres://postgres@127.0.0.1:54329/kjob")?;
//! let worker = Worker::builder(KafkaConfig::from_env(), "billing")
//!     .layer_for("invoices.render", PgTransaction::new(db))
//!     .handle_on("invoices.render", render)
//!     .build()?;
//! # drop(worker);
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

use deadpool_postgres::{ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use futures::future::BoxFuture;
use kjob::layers::{from_fn, AttemptService, FromFnService, Middleware, Next, Request};
use kjob::{JobError, ResultExt};
use tokio::sync::{Mutex, MutexGuard};
use tokio_postgres::NoTls;

/// A connection pool whose connections are always handed out outside any
/// transaction: recycling a connection sends `ROLLBACK` (a no-op, with a
/// warning on the server, when nothing is open), so a transaction that a
/// panic or a timeout left open never leaks into the next job's.
pub fn pool(url: &str) -> anyhow::Result<Pool> {
    let mut cfg = deadpool_postgres::Config::new();
    cfg.url = Some(url.to_string());
    cfg.manager = Some(ManagerConfig {
        recycling_method: RecyclingMethod::Custom("ROLLBACK".into()),
    });
    Ok(cfg.create_pool(Some(Runtime::Tokio1), NoTls)?)
}

/// The open transaction of one attempt, for the handler (`Ext<Tx>`).
#[derive(Clone)]
pub struct Tx {
    conn: Arc<Mutex<Object>>,
}

impl Tx {
    /// The connection the transaction is open on. Statements run on it are
    /// part of the transaction; don't send `COMMIT` or `ROLLBACK` yourself,
    /// the layer does.
    pub async fn client(&self) -> MutexGuard<'_, Object> {
        self.conn.lock().await
    }
}

/// The layer (see the module docs).
#[derive(Clone)]
pub struct PgTransaction {
    pool: Pool,
}

impl PgTransaction {
    /// A layer taking its connections from `pool` (make it with [`pool`]).
    pub fn new(pool: Pool) -> Self {
        Self { pool }
    }
}

impl Middleware for PgTransaction {
    fn call(&self, mut req: Request, next: Next) -> BoxFuture<'static, Result<(), JobError>> {
        let pool = self.pool.clone();
        Box::pin(async move {
            // No connection means no transaction to run the job in: a
            // database that is down is worth a retry, not a dead letter.
            // Waiting for a free connection holds no handler slot.
            let conn = req.wait(pool.get()).await.network()?;
            conn.batch_execute("BEGIN").await?;
            let tx = Tx {
                conn: Arc::new(Mutex::new(conn)),
            };
            req.extensions_mut().insert(tx.clone());
            let result = next.run(req).await;
            let conn = tx.conn.lock().await;
            match result {
                // A failed COMMIT is a failed attempt: nothing was written.
                Ok(()) => Ok(conn.batch_execute("COMMIT").await?),
                Err(e) => {
                    // The job's own error is what counts; a failed rollback
                    // is cleaned up by the pool's recycling ROLLBACK.
                    if let Err(rollback) = conn.batch_execute("ROLLBACK").await {
                        tracing::warn!(error = %rollback, "ROLLBACK failed");
                    }
                    Err(e)
                }
            }
        })
    }
}

/// The layer is the fn above, around every attempt of the routes it is on.
impl tower::Layer<AttemptService> for PgTransaction {
    type Service = FromFnService<PgTransaction>;
    fn layer(&self, inner: AttemptService) -> Self::Service {
        from_fn(self.clone()).layer(inner)
    }
}
