//! # kjob: background jobs on Apache Kafka
//!
//! kjob moves slow, unreliable follow-up work (confirmation mails, invoice
//! PDFs, CRM syncs) out of the request path and runs it on Kafka, with the
//! guarantees a production team needs:
//!
//! * **Jobs are versioned Avro contracts** ([`Job`]) encoded in the Confluent
//!   wire format against a schema registry ([`codec`]). Old and new binaries
//!   can read each other's records during a rolling deploy because the worker
//!   always resolves the *writer's* schema to its own compiled-in *reader*
//!   schema.
//! * **Enqueue is acknowledged** ([`Producer`]): `acks=all`, idempotence on,
//!   and the call returns the partition and offset only after the broker has
//!   the job. An unreachable broker is an error, never a silent drop.
//! * **Offsets are committed only after the handler finished**
//!   ([`offsets`]): the committed position of a partition is the lowest
//!   offset still in flight, so jobs that finish out of order never move the
//!   commit past an unfinished one. A crash therefore re-delivers, it never
//!   loses.
//! * **Failures are classified** ([`JobError`]) and poison records, permanent
//!   errors and handler panics are forwarded to a dead-letter topic
//!   ([`dlq`]) *before* their source offset is released.
//!
//! Start with the `orders` example and the README's Quickstart. The commit
//! path lives in [`offsets`] (the watermark) and [`worker`] (when it is
//! committed: periodically, on revoke and on shutdown).

pub mod classify;
pub mod cli;
pub mod codec;
pub mod config;
pub mod dlq;
pub mod error;
pub mod headers;
pub mod idempotency;
pub mod job;
pub mod lag;
pub mod layers;
pub mod offsets;
#[cfg(feature = "postgres")]
pub mod outbox;
pub mod producer;
pub mod replay;
pub mod retry;
pub mod routing;
pub mod schema;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
pub mod topics;
pub mod worker;

pub use classify::{ErrorClass, JobError};
pub use config::{KafkaConfig, Secret};
pub use error::{Error, Result};
pub use job::{Job, JobContext};
pub use producer::{Enqueued, Producer};
pub use worker::{Ext, GroupProtocol, Ordering, State, Worker, WorkerBuilder, WorkerStats};
