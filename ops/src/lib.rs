//! Operator functions for kjob, returning data instead of printing it, and
//! the web dashboard built on them.
//!
//! The `kjob` CLI prints what these return and the dashboard renders it, so
//! the terminal and the browser can never disagree. A worker binary can
//! serve the dashboard next to its `/metrics` with [`ui::Dashboard::router_on`]
//! and `WorkerBuilder::http_routes`, without pulling in the CLI's clap,
//! indicatif or comfy-table (the `clap` feature only adds derives for the
//! CLI's flags).
//!
//! This crate holds what only operators need, so that `kjob` stays what
//! handler crates and worker binaries need: [`batches`] (their state and
//! cancellation), [`status`] (a route by role),
//! [`topics`] (a route's topics, as the worker names them), [`groups`],
//! [`lag`], [`dlq`] (reading, re-driving and resolving dead letters),
//! [`replay`] (offset resets and their undo file), [`control`] (routes paused for a whole group), [`schedules`] (cron schedules, their leader, pause, resume and trigger), [`contracts`] (`schemas/`
//! files against the registry), [`connectivity`] (whether Kafka answers, and
//! why not), [`problem`] (the kind of a failure: the CLI's exit code),
//! [`suggest`] (near names), [`time`] (Kafka's duration and datetime
//! formats) and [`terminal`] (record text made safe to print).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(unreachable_pub, missing_docs)]

pub mod batches;
pub mod connectivity;
pub mod contracts;
pub mod control;
pub mod dlq;
pub mod groups;
pub mod lag;
pub mod problem;
pub mod replay;
pub mod schedules;
pub mod status;
pub mod suggest;
pub mod terminal;
pub mod time;
pub mod topics;
pub mod ui;
pub mod waiting;
