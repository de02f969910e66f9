//! The worker: a consumer-group member that runs handlers and commits only
//! what they finished.
//!
//! ```no_run
//! # use kjob::{Job, JobContext, JobError, KafkaConfig, Worker};
//! # #[derive(serde::Serialize, serde::Deserialize)] struct SendMail { order_id: String }
//! # impl Job for SendMail { const NAME: &'static str = "mail"; const VERSION: u32 = 1;
//! #   const SCHEMA: &'static str = r#"{"type":"record","name":"SendMail","fields":[{"name":"order_id","type":"string"}]}"#;
//! #   fn key(&self) -> String { self.order_id.clone() } }
//! async fn send_mail(job: SendMail, ctx: JobContext) -> Result<(), JobError> {
//!     println!("mail for {} (attempt {})", job.order_id, ctx.attempt);
//!     Ok(())
//! }
//! # async fn run() -> kjob::Result<()> {
//! Worker::builder(KafkaConfig::from_env(), "mailer")
//!     .handle(send_mail)
//!     .build()?
//!     .run() // until SIGTERM / SIGINT
//!     .await
//! # }
//! ```
//!
//! The files follow one job's path (`ARCHITECTURE.md` at the repository
//! root lists the steps):
//!
//! * `builder` (what users configure) → `provision` (topics, preflight) →
//!   `run` (the wiring);
//! * `poll` (the poll thread: the rdkafka adapter; copies each record out of
//!   librdkafka as a `polled::Polled`, carries out the scheduler's
//!   pause/resume/seek/commit, handles rebalances) → `scheduler` (every
//!   decision about lanes, concurrency, the in-flight bound, due-time holds
//!   and the commit watermark; no rdkafka in it) → `hub` (the scheduler
//!   behind one lock, completions) and `dispatcher` (async tasks running
//!   `Run` batches);
//! * `pipeline` (one attempt, top to bottom) → its stages before the
//!   handler (`stages`: delays and retries not due yet; `strict`: strict
//!   order; `park`: waiting without a slot) → the handler (`route`, with
//!   `handler`'s extractors and the `watchdog`) → the decision (`decision`:
//!   done, retry tier or DLQ) → the forward (`forward`).
//!
//! The watermark arithmetic is in `offsets.rs`, the clock in `clock.rs`.

mod backtrace;
mod builder;
mod debounce;
mod decision;
mod describe;
mod dispatcher;
mod fairness;
mod forward;
mod handler;
mod hub;
mod intake;
mod job_span;
mod limits;
pub(crate) mod park;
pub(crate) mod pipeline;
mod poll;
pub(crate) mod polled;
mod priority;
mod provision;
mod read_ahead;
mod readers;
pub(crate) mod record;
mod recycle;
mod refusal;
pub(crate) mod route;
mod run;
pub(crate) mod scheduler;
mod settle;
mod shared_tiers;
mod split_queue;
mod stages;
pub(crate) mod state;
pub(crate) mod strict;
mod wake;
mod watchdog;

pub use crate::error::Limit;
pub use crate::membership::{GroupProtocol, GROUP_PROTOCOL_ENV, INSTANCE_ID_ENV};
pub use builder::{Worker, WorkerBuilder};
pub use fairness::Fairness;
pub use handler::{Ext, FromParts, Handler, Parts, State};
pub use priority::Priority;
pub(crate) use route::Attempt;
pub use run::shutdown_signal;
pub use shared_tiers::SharedTiers;
pub use state::{OrderingMode, WorkerStats};
