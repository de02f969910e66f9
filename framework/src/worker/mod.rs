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
//! The rooms follow one job's path, one room per step of `ARCHITECTURE.md`
//! at the repository root; each room's `mod.rs` says what enters it and
//! what leaves:
//!
//! 2. `builder`: what users configure, `build()`, and the provisioning
//!    before the first poll;
//! 3. `intake`: the poll thread, the only code that talks to the consumer;
//! 4. `scheduler`: every decision about lanes, concurrency, the in-flight
//!    bound, due-time holds and the commit watermark; no rdkafka in it;
//! 5. `dispatch`: the hub (the scheduler behind one lock) and the
//!    dispatcher tasks running `Run` batches;
//! 6. to 9. one attempt, top to bottom in `pipeline`: `before` (delays and
//!    retries not due yet, debounce, strict order, parking), `handler`,
//!    `decision` (done, retry tier or DLQ) and `settle` (the forward, then
//!    the count and the log);
//! 10. the commit: `scheduler::commits` says what may be committed,
//!     `intake::poll::commit` commits it.
//!
//! `run` wires the rooms and shuts them down in order. Below them all:
//! `state` (settings, counters, the route table) and `wake` (the poll
//! thread's wake-up). The watermark arithmetic is in `offsets.rs`, the
//! clock in `clock.rs`.

pub(crate) mod before;
mod builder;
mod decision;
mod dispatch;
pub(crate) mod handler;
pub(crate) mod intake;
pub(crate) mod pipeline;
mod run;
pub(crate) mod scheduler;
mod settle;
pub(crate) mod state;
mod wake;

pub use crate::error::StopLimit;
pub use crate::membership::{GroupProtocol, GROUP_PROTOCOL_ENV, INSTANCE_ID_ENV};
pub use builder::shared_tiers::SharedTiers;
pub use builder::{Worker, WorkerBuilder};
pub(crate) use handler::route::Attempt;
pub use handler::{Ext, FromParts, Handler, Parts, State};
pub use run::shutdown_signal;
pub use scheduler::fairness::Fairness;
pub use scheduler::priority::Priority;
pub use state::{OrderingMode, WorkerStats};
