//! The `kjob` command line, for operators. Flags follow Kafka's own tools
//! (`--bootstrap-server`, `--topic`, `--group`, `--dry-run`, `--execute`) so
//! muscle memory carries over.
//!
//! Every command reads Kafka (and the registry) directly; no worker has to
//! run. Errors go to stderr with a non-zero exit code: 2 for bad usage
//! (clap), 1 for everything that failed while running.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod dlq;
mod enqueue;
#[cfg(feature = "postgres")]
mod outbox;
mod replay;
mod schedules;
mod schema;
mod status;
mod topics;
mod ui;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use kjob::config::KafkaConfig;

/// kjob: operate background jobs on Kafka.
#[derive(Parser, Debug)]
#[command(name = "kjob", version, about)]
pub struct Cli {
    /// Kafka bootstrap servers.
    #[arg(long = "bootstrap-server", env = "KJOB_BOOTSTRAP_SERVERS", default_value = kjob::config::DEFAULT_BOOTSTRAP_SERVERS, global = true)]
    bootstrap_server: String,
    /// Schema registry (Confluent-compatible API base URL).
    #[arg(long = "schema-registry", env = "KJOB_SCHEMA_REGISTRY_URL", default_value = kjob::config::DEFAULT_SCHEMA_REGISTRY_URL, global = true)]
    schema_registry: String,
    /// Kafka `security.protocol` (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL).
    /// The SASL password is read from `KJOB_SASL_PASSWORD` only: a flag
    /// would show it in `ps`.
    #[arg(
        long = "security-protocol",
        env = "KJOB_SECURITY_PROTOCOL",
        global = true
    )]
    security_protocol: Option<String>,
    /// Kafka `sasl.mechanism`, e.g. SCRAM-SHA-512.
    #[arg(long = "sasl-mechanism", env = "KJOB_SASL_MECHANISM", global = true)]
    sasl_mechanism: Option<String>,
    /// Kafka `sasl.username` (the principal the ACLs name).
    #[arg(long = "sasl-username", env = "KJOB_SASL_USERNAME", global = true)]
    sasl_username: Option<String>,
    /// Kafka `ssl.ca.location`: CA certificate (PEM) of the brokers.
    #[arg(long = "ssl-ca-location", env = "KJOB_SSL_CA_LOCATION", global = true)]
    ssl_ca_location: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Enqueue a job (or a file of JSON lines), encoded against the topic's latest schema.
    Enqueue(enqueue::EnqueueArgs),
    /// Inspect, re-drive and resolve dead letters.
    #[command(subcommand)]
    Dlq(dlq::DlqCommand),
    /// The transactional outbox: create its table, run a relay, show its state.
    #[cfg(feature = "postgres")]
    #[command(subcommand)]
    Outbox(outbox::OutboxCommand),
    /// Reset a group's offsets to handle jobs again (dry run unless --execute).
    Replay(replay::ReplayArgs),
    /// A group's cron schedules: expression, last fired tick, next tick.
    Schedules(schedules::SchedulesArgs),
    /// Check or register job contracts against the schema registry, or export a crate's to `schemas/`.
    #[command(subcommand)]
    Schema(schema::SchemaCommand),
    /// A route's lag, oldest pending job, retry tiers and DLQ, from Kafka alone.
    Status(status::StatusArgs),
    /// Create a route's topics.
    #[command(subcommand)]
    Topics(topics::TopicsCommand),
    /// A web dashboard: routes, lag, retries and the DLQ in the browser.
    Ui(ui::UiArgs),
}

/// Parses the process arguments and runs the command.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The environment first (the password lives only there), then the flags.
    let mut config =
        KafkaConfig::new(&cli.bootstrap_server, &cli.schema_registry).security_from_env();
    if let Some(v) = &cli.security_protocol {
        config = config.security_protocol(v);
    }
    if let Some(v) = &cli.sasl_mechanism {
        config.sasl_mechanism = Some(v.clone());
    }
    if let Some(v) = &cli.sasl_username {
        config.sasl_username = Some(v.clone());
    }
    if let Some(v) = &cli.ssl_ca_location {
        config = config.ssl_ca_location(v);
    }
    let config = config
        // Fail fast when the cluster is unreachable instead of librdkafka's
        // long default retries: an operator is waiting.
        .set("socket.connection.setup.timeout.ms", "10000");
    let result = runtime.block_on(async {
        match cli.command {
            Command::Dlq(cmd) => dlq::run(&config, cmd).await,
            Command::Enqueue(args) => enqueue::run(&config, args).await,
            #[cfg(feature = "postgres")]
            Command::Outbox(cmd) => outbox::run(&config, cmd).await,
            Command::Replay(args) => replay::run(&config, args).await,
            Command::Schedules(args) => schedules::run(&config, args).await,
            Command::Schema(cmd) => schema::run(&config, cmd).await,
            Command::Status(args) => status::run(&config, args).await,
            Command::Topics(cmd) => topics::run(&config, cmd).await,
            Command::Ui(args) => ui::run(&config, args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Errors can quote records (an audit entry's operator, a
            // registry's or broker's words): made safe line by line, so a
            // message of several lines keeps them.
            let text = format!("{e:#}");
            let safe: Vec<String> = text
                .lines()
                .map(|l| kjob_ops::terminal::for_terminal(l, kjob_ops::terminal::LINE_WIDTH))
                .collect();
            eprintln!("error: {}", safe.join("\n"));
            ExitCode::FAILURE
        }
    }
}
