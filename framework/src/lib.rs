//! # kjob: background jobs on Apache Kafka
//!
//! kjob moves slow, unreliable follow-up work (confirmation mails, invoice
//! PDFs, CRM syncs) out of the request path and runs it on Kafka, with the
//! guarantees a production team needs:
//!
//! * **Jobs are versioned Avro contracts** ([`Job`]) encoded in the Confluent
//!   wire format against a schema registry. Old and new binaries
//!   can read each other's records during a rolling deploy because the worker
//!   always resolves the *writer's* schema to its own compiled-in *reader*
//!   schema.
//! * **Enqueue is acknowledged** ([`Producer`]): `acks=all`, idempotence on,
//!   and the call returns the partition and offset only after the broker has
//!   the job. An unreachable broker is an error, never a silent drop.
//! * **Offsets are committed only after the handler finished**
//!   (the watermark in `offsets.rs`): the committed position of a partition is the lowest
//!   offset still in flight, so jobs that finish out of order never move the
//!   commit past an unfinished one. A crash therefore re-delivers, it never
//!   loses.
//! * **Failures are classified** ([`JobError`]) and poison records, permanent
//!   errors and handler panics are forwarded to a dead-letter topic
//!   (`<topic>.dlq`) *before* their source offset is released.
//!
//! **Cargo features.** `metrics-http` (the worker's `/metrics`, `/healthz`
//! and `/readyz` endpoint: axum and the Prometheus exporter) and `otlp`
//! (OTLP/gRPC trace export: tonic) are on by default; a handler crate that
//! does not serve them can turn them off with `default-features = false`.
//! `postgres` adds `idempotency::PgMarkers` and the `From<tokio_postgres::Error>`
//! classification, `testing` the in-memory harness, `tls` TLS for Kafka and
//! the registry.
//!
//! Start with `examples/hello` and the book (`docs/`); `ARCHITECTURE.md`
//! at the repository root follows one job through the code.
//!
//! **What is for whom.** Handler crates need the root re-exports (or
//! [`prelude`]), [`retry`], [`layers`], [`idempotency`] and, for tests,
//! `testing` (feature `testing`). Worker binaries add [`config`],
//! [`worker`], [`telemetry`], [`schedule`] and [`outbox`]; [`topics`] and
//! [`schema`] create a route's topics and export its contracts; [`control`]
//! is what operators pause for a whole group (a worker follows it). The
//! plumbing the operator side shares (`codec`, `registry`, `headers`,
//! `dlq`, `lag`, `json_avro`) is public for the `kjob-ops` crate, which the
//! `kjob` CLI and the dashboard are built on, and hidden from these docs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(unreachable_pub, missing_docs)]

// `codec`, `registry`, `headers`, `json_avro`, `dlq` and `lag` are the
// plumbing that `kjob-ops` (status, dead-letter review, replay, the
// dashboard) builds on: public for that crate, hidden from the handler API.
pub mod batch;
pub mod classify;
pub mod clock;
#[doc(hidden)]
pub mod codec;
pub mod config;
pub mod control;
#[cfg(feature = "postgres")]
pub mod ddl;
pub mod delay;
pub mod deployment;
#[doc(hidden)]
pub mod dlq;
pub mod error;
#[doc(hidden)]
pub mod headers;
pub mod idempotency;
pub mod job;
#[doc(hidden)]
pub mod json_avro;
#[doc(hidden)]
pub mod lag;
pub mod layers;
pub(crate) mod membership;
pub(crate) mod offsets;
#[cfg(feature = "postgres")]
pub mod outbox;
pub mod producer;
#[doc(hidden)]
pub mod registry;
pub mod retry;
pub mod schedule;
pub mod schema;
pub mod settings;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
pub mod topics;
pub mod worker;

pub use classify::{ErrorClass, JobError, OptionExt, ResponseExt, ResultExt};
pub use config::{KafkaConfig, Secret};
pub use error::{Error, Result};
pub use job::{Job, JobContext};
pub use kjob_derive::Job;
pub use producer::{Enqueued, Producer};
pub use worker::{
    Ext, Fairness, GroupProtocol, OrderingMode, Priority, SharedTiers, State, Worker,
    WorkerBuilder, WorkerStats,
};

/// What a handler crate needs, in one import: `use kjob::prelude::*;`.
///
/// Kept to the names a handler and its worker binary use (contracts,
/// handlers and their `State`/`Ext` extractors, errors, building and running
/// a worker, enqueueing), so a glob
/// import does not shadow the crate's own names. `ResultExt`, `OptionExt`
/// and `ResponseExt` are here for their methods (`.permanent()`,
/// `.or_not_found(..)`, `.classify_status()`).
pub mod prelude {
    pub use crate::classify::{JobError, OptionExt, ResponseExt, ResultExt};
    pub use crate::config::KafkaConfig;
    pub use crate::job::{Job, JobContext};
    pub use crate::producer::{Enqueued, Producer};
    pub use crate::retry::RetryPolicy;
    pub use crate::worker::{Ext, OrderingMode, Priority, State, Worker, WorkerBuilder};
    pub use kjob_derive::Job;
}

/// The book's chapters (`docs/src/*.md`) as doctests, so that their Rust
/// blocks cannot go stale: `cargo test --doc` compiles each one (and runs
/// those not marked `no_run`). Only under `cfg(doctest)`, so builds,
/// `cargo doc` and the packaged crate never read these files. A chapter
/// whose blocks need a feature is gated on it; `cargo test --workspace`
/// (`./dev test`) turns those features on.
#[cfg(doctest)]
mod book {
    macro_rules! chapters {
        ($($(#[$gate:meta])* $name:ident = $file:literal;)*) => {$(
            $(#[$gate])*
            #[doc = include_str!(concat!("../../docs/src/", $file))]
            pub struct $name;
        )*};
    }
    chapters! {
        Introduction = "introduction.md";
        GettingStarted = "getting-started.md";
        HowAJobFlows = "how-a-job-flows.md";
        #[cfg(feature = "testing")]
        Handlers = "handlers.md";
        FailurePath = "failure-path.md";
        Scheduling = "scheduling.md";
        Priorities = "priorities.md";
        Fairness = "fairness.md";
        Ordering = "ordering.md";
        DelayedJobs = "delayed-jobs.md";
        Cron = "cron.md";
        Batches = "batches.md";
        Limits = "limits.md";
        #[cfg(feature = "postgres")]
        Outbox = "outbox.md";
        ComingFrom = "coming-from.md";
        Topology = "topology.md";
        Deploys = "deploys.md";
        Evolution = "evolution.md";
        Dashboard = "dashboard.md";
        Cli = "cli.md";
        Observability = "observability.md";
        Security = "security.md";
        Cluster = "cluster.md";
        Settings = "settings.md";
        Troubleshooting = "troubleshooting.md";
    }
}
