//! The integration suite: every test against the real stack that can share
//! a process with the others, in one test binary.
//!
//! One binary instead of one per file: each of them linked rdkafka, the
//! Avro and HTTP stacks and the support library again (about 70 MB and
//! seconds of linking each, some sixty times), which was most of a fresh
//! build's disk and a good part of its time. Each file stays its own module
//! with its own doc comment saying what it proves; run one with
//! `cargo test -p kjob-integration-tests --test suite spine::`.
//!
//! Kept as binaries of their own (see `tests/Cargo.toml`): the tests that
//! install a process-wide tracing subscriber or set the process's
//! environment (`job_logs`, `tracing_otlp`, `tracing_otlp_http`), and the
//! `./dev test --cluster` tests (`cluster_*`, `broker_restart`).

/// The dashboard process and HTTP session that several modules drive.
#[path = "support/dashboard.rs"]
mod dashboard;

mod backpressure;
mod batch_read;
mod batches;
mod breaker;
mod cli_conventions;
mod cli_routes;
mod concurrent_first_enqueue;
mod concurrent_table_creation;
mod contracts;
mod cron;
mod debounce;
mod delayed;
mod deployment;
mod deploys;
mod dlq_cli;
mod docker_compose;
mod enqueue_cli;
mod evolution;
mod failure_path;
mod fairness;
mod foreign;
mod handlers;
mod isolation;
mod limits;
mod lost_partition;
mod metrics_conventions;
mod observability;
mod ordered_retry;
mod outbox;
mod outbox_sql;
mod oversized;
mod panic_backtrace;
mod polyglot;
mod priority;
mod readme;
mod rebalance;
mod reconnect;
mod registry_client;
mod registry_outage;
mod replay;
mod retry_after;
mod schema_export;
mod shared_tiers;
mod spine;
mod transaction_layer;
mod ui;
mod ui_dlq_index;
mod ui_in_worker;
mod ui_proxy_user;
mod unique;
mod waiting_cli;
