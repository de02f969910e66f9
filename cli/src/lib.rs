//! The `kjob` command line, for operators. Flags follow Kafka's own tools
//! (`--bootstrap-server`, `--command-config`, `--topic`, `--group`,
//! `--dry-run`, `--execute`, `--replication-factor`, `--config k=v`) so
//! muscle memory carries over.
//!
//! Every command reads Kafka (and the registry) directly; no worker has to
//! run. Anything that changes state is a dry run unless `--execute` is
//! given. `--json` (or `--output json`) prints JSON objects with named
//! fields instead of tables, everywhere. Errors go to stderr as one line
//! (several when they list things), with the exit codes `kjob --help` lists; a
//! closed pipe ends the command quietly.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(unreachable_pub, missing_docs)]
// Output goes through `output::outln!`, whose errors reach `main`, so a
// closed pipe is handled in one place instead of panicking in `println!`.
#![deny(clippy::print_stdout)]

mod acls;
mod batches;
mod dlq;
mod enqueue;
mod exit;
mod groups;
mod legacy;
mod model;
mod operator;
#[cfg(feature = "postgres")]
mod outbox;
mod output;
mod replay;
mod routes;
mod schedules;
mod schema;
mod status;
mod topics;
mod ui;
mod waiting;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use kjob::config::KafkaConfig;
pub use output::Format;

/// kjob: operate background jobs on Apache Kafka from the command line.
#[derive(Parser, Debug)]
#[command(
    name = "kjob",
    version,
    about = "kjob: operate background jobs on Apache Kafka (dead letters, replays, lag, topics, groups, schemas, the outbox).",
    long_about = None,
    after_help = exit::AFTER_HELP,
)]
pub struct Cli {
    /// Kafka bootstrap servers (host:port,...). Default: the file of
    /// --command-config, else 127.0.0.1:9092.
    #[arg(
        long = "bootstrap-server",
        env = "KJOB_BOOTSTRAP_SERVERS",
        global = true,
        help_heading = "Connection and security",
        value_name = "HOST:PORT"
    )]
    bootstrap_server: Option<String>,
    /// Schema registry (Confluent-compatible API base URL).
    #[arg(
        long = "schema-registry",
        env = "KJOB_SCHEMA_REGISTRY_URL",
        global = true,
        help_heading = "Connection and security",
        value_name = "URL"
    )]
    schema_registry: Option<String>,
    /// A properties file of librdkafka settings (key=value lines, as
    /// Kafka's tools take it): client certificates, OAUTHBEARER,
    /// client.rack, ... Flags and KJOB_* variables win over it.
    #[arg(
        long = "command-config",
        env = "KJOB_KAFKA_CONFIG_FILE",
        global = true,
        help_heading = "Connection and security",
        value_name = "FILE"
    )]
    command_config: Option<PathBuf>,
    /// Kafka `security.protocol` (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL).
    /// The SASL password is read from `KJOB_SASL_PASSWORD` (or the
    /// --command-config file) only: a flag would show it in `ps`.
    #[arg(
        long = "security-protocol",
        env = "KJOB_SECURITY_PROTOCOL",
        global = true,
        help_heading = "Connection and security"
    )]
    security_protocol: Option<String>,
    /// Kafka `sasl.mechanism`, e.g. SCRAM-SHA-512.
    #[arg(
        long = "sasl-mechanism",
        env = "KJOB_SASL_MECHANISM",
        global = true,
        help_heading = "Connection and security"
    )]
    sasl_mechanism: Option<String>,
    /// Kafka `sasl.username` (the principal the ACLs name).
    #[arg(
        long = "sasl-username",
        env = "KJOB_SASL_USERNAME",
        global = true,
        help_heading = "Connection and security"
    )]
    sasl_username: Option<String>,
    /// Kafka `ssl.ca.location`: CA certificate (PEM) of the brokers.
    #[arg(
        long = "ssl-ca-location",
        env = "KJOB_SSL_CA_LOCATION",
        global = true,
        help_heading = "Connection and security"
    )]
    ssl_ca_location: Option<String>,
    /// How long to wait for Kafka to answer before giving up, as
    /// milliseconds (Kafka's tools) or a duration (10s, 1m).
    #[arg(long, global = true,
        help_heading = "Connection and security", default_value = "10s", value_parser = parse_timeout, value_name = "TIMEOUT")]
    timeout: Duration,
    /// Print JSON (one object per result, named fields) instead of tables.
    #[arg(long, global = true, help_heading = "Output")]
    json: bool,
    /// Output format; `--output json` is `--json`.
    #[arg(
        long,
        global = true,
        help_heading = "Output",
        value_enum,
        value_name = "FORMAT"
    )]
    output: Option<Format>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The kafka-acls commands that grant a worker exactly what its model (KJOB_DESCRIBE=json) lists.
    #[command(
        after_help = "Example:\n  kjob acls --model model.json --principal User:shop-worker"
    )]
    Acls(acls::AclsArgs),
    /// Batches of jobs with a callback: list, show, cancel (dry run unless --execute).
    #[command(subcommand)]
    #[command(after_help = "Example:\n  kjob batches list --topic newsletter.batches")]
    Batches(batches::BatchesCommand),
    /// Review dead letters: list, show, re-drive, resolve (dry run unless --execute).
    #[command(subcommand)]
    #[command(
        after_help = "Examples:\n  kjob dlq list --topic orders.confirmation --key 4711\n  kjob dlq retry --topic orders.confirmation --grep 'timed out' --since 2h --execute"
    )]
    Dlq(dlq::DlqCommand),
    /// Enqueue a job (--data, --data-file or stdin), encoded against the topic's latest schema.
    #[command(
        after_help = "Example:\n  kjob enqueue --topic orders.confirmation --key 4711 --data '{\"order_id\": \"4711\"}'"
    )]
    Enqueue(enqueue::EnqueueArgs),
    /// Consumer groups: list them, describe one (members, assignment, lag per partition).
    #[command(subcommand)]
    #[command(after_help = "Example:\n  kjob groups describe --group orders")]
    Groups(groups::GroupsCommand),
    /// The transactional outbox: create its table, run a relay, show its state.
    #[cfg(feature = "postgres")]
    #[command(subcommand)]
    #[command(after_help = "Example:\n  kjob outbox status --database-url postgres://app@db/shop")]
    Outbox(outbox::OutboxCommand),
    /// Reset a group's offsets to handle jobs again, or undo a reset from a file (dry run unless --execute).
    #[command(
        after_help = "Example:\n  kjob replay --group orders --topic orders.confirmation --by-duration PT2H"
    )]
    Replay(replay::ReplayArgs),
    /// Pause or resume a route for a whole group (every worker stops fetching it), audited.
    #[command(subcommand)]
    #[command(
        after_help = "Example:\n  kjob routes pause --group orders --topic orders.confirmation --reason 'mail provider down'"
    )]
    Routes(routes::RoutesCommand),
    /// A group's cron schedules: next and last tick, the leader; pause, resume or trigger one.
    #[command(after_help = "Example:\n  kjob schedules --group orders")]
    Schedules(schedules::SchedulesArgs),
    /// Check or register job contracts against the schema registry, or export a crate's to `schemas/`.
    #[command(subcommand)]
    #[command(
        after_help = "Example:\n  kjob schema check --dir schemas --topic orders.confirmation"
    )]
    Schema(schema::SchemaCommand),
    /// A route's topics by role, lag, oldest pending job and DLQ, from Kafka alone.
    #[command(after_help = "Example:\n  kjob status --group orders --topic orders.confirmation")]
    Status(status::StatusArgs),
    /// A route's topics: list them, describe one, create them (dry run unless --execute).
    #[command(subcommand)]
    #[command(after_help = "Example:\n  kjob topics list")]
    Topics(topics::TopicsCommand),
    /// A web dashboard: routes, lag, retries and the DLQ in the browser.
    #[command(after_help = "Example:\n  kjob ui --group orders")]
    Ui(ui::UiArgs),
    /// What waits in a route's retry tiers and delay topics, due first; cancel one or run it now (dry run unless --execute).
    #[command(after_help = "Example:\n  kjob waiting --group orders --topic orders.confirmation")]
    Waiting(waiting::WaitingArgs),
}

impl Command {
    /// Whether the command talks to Kafka before anything else, so a wrong
    /// `--bootstrap-server` is reported at once, in one line.
    fn needs_kafka(&self) -> bool {
        match self {
            Command::Schema(_) | Command::Ui(_) | Command::Acls(_) => false,
            #[cfg(feature = "postgres")]
            Command::Outbox(_) => false,
            Command::Enqueue(args) => args.needs_kafka(),
            _ => true,
        }
    }
}

/// What every command gets: the Kafka settings, the output format and the
/// timeout.
pub struct Ctx {
    /// Kafka, the registry, security and librdkafka properties.
    pub config: KafkaConfig,
    /// Tables or JSON.
    pub format: Format,
    /// How long to wait for Kafka.
    pub timeout: Duration,
    /// Whether `socket.connection.setup.timeout.ms` is the CLI's (from
    /// `--timeout`) rather than the operator's own setting: a long-running
    /// relay drops the CLI's, so it keeps reconnecting.
    pub cli_set_connect_timeout: bool,
}

impl Ctx {
    /// Whether output is JSON.
    pub fn json(&self) -> bool {
        self.format == Format::Json
    }
}

/// `--timeout`: milliseconds (`5000`, as Kafka's tools take it) or a
/// duration (`5s`).
fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = match s.trim().parse::<u64>() {
        Ok(ms) => Duration::from_millis(ms),
        Err(_) => humantime::parse_duration(s.trim())
            .map_err(|e| format!("`{s}` is neither milliseconds nor a duration like 10s: {e}"))?,
    };
    if d < Duration::from_millis(100) {
        return Err(format!("`{s}` is too short: give Kafka at least 100ms"));
    }
    Ok(d)
}

/// The Kafka settings: the environment and the properties file first, then
/// the flags on top (see `kjob::config` for the precedence).
fn kafka_config(cli: &Cli) -> anyhow::Result<(KafkaConfig, bool)> {
    let mut config = KafkaConfig::from_env_with_file(cli.command_config.as_deref());
    if let Some(v) = &cli.bootstrap_server {
        config.bootstrap_servers = v.clone();
    }
    if let Some(v) = &cli.schema_registry {
        config.schema_registry_url = v.trim_end_matches('/').to_string();
    }
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
    // Fail within --timeout when the cluster is unreachable instead of
    // librdkafka's long default retries: an operator is waiting. A value
    // from the properties file is the operator's and stays.
    let key = "socket.connection.setup.timeout.ms";
    let ours = !config.overrides.contains_key(key);
    if ours {
        config = config.set(key, cli.timeout.as_millis().to_string());
    }
    config.check()?;
    Ok((config, ours))
}

/// Parses the process arguments and runs the command.
pub fn main() -> ExitCode {
    let (args, warnings) = legacy::rewrite(std::env::args_os().collect());
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version end here too (exit 0); a closed pipe
            // while printing them is not worth a word.
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(exit::USAGE));
        }
    };
    for w in warnings {
        eprintln!("warning: {w}");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::from(exit::FAILED);
        }
    };
    let result = runtime.block_on(async {
        let (config, cli_set_connect_timeout) = kafka_config(&cli)?;
        let format = if cli.json {
            Format::Json
        } else {
            cli.output.unwrap_or(Format::Table)
        };
        let ctx = Ctx {
            config,
            format,
            timeout: cli.timeout,
            cli_set_connect_timeout,
        };
        if cli.command.needs_kafka() {
            let (config, timeout) = (ctx.config.clone(), ctx.timeout);
            tokio::task::spawn_blocking(move || {
                kjob_ops::connectivity::check_kafka(&config, timeout)
            })
            .await
            .map_err(|e| anyhow::anyhow!("background task: {e}"))??;
        }
        match cli.command {
            Command::Acls(args) => acls::run(&ctx, args).await,
            Command::Dlq(cmd) => dlq::run(&ctx, cmd).await,
            Command::Enqueue(args) => enqueue::run(&ctx, args).await,
            Command::Groups(cmd) => groups::run(&ctx, cmd).await,
            #[cfg(feature = "postgres")]
            Command::Outbox(cmd) => outbox::run(&ctx, cmd).await,
            Command::Replay(args) => replay::run(&ctx, args).await,
            Command::Routes(cmd) => routes::run(&ctx, cmd).await,
            Command::Waiting(args) => waiting::run(&ctx, args).await,
            Command::Schedules(args) => schedules::run(&ctx, args).await,
            Command::Batches(cmd) => batches::run(&ctx, cmd).await,
            Command::Schema(cmd) => schema::run(&ctx, cmd).await,
            Command::Status(args) => status::run(&ctx, args).await,
            Command::Topics(cmd) => topics::run(&ctx, cmd).await,
            Command::Ui(args) => ui::run(&ctx, args).await,
        }
    });
    // Background tasks (a status read, a registry call) must not outlive
    // the answer.
    runtime.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => exit::report(&e),
    }
}

#[cfg(test)]
mod help_tests {
    use clap::{CommandFactory as _, Parser as _};

    use super::Cli;

    /// Words of a shell line, single quotes grouping (what the examples use).
    fn words(line: &str) -> Vec<String> {
        let (mut out, mut word, mut quoted) = (Vec::new(), String::new(), false);
        for c in line.chars() {
            match c {
                '\'' => quoted = !quoted,
                c if c.is_whitespace() && !quoted => {
                    if !word.is_empty() {
                        out.push(std::mem::take(&mut word));
                    }
                }
                c => word.push(c),
            }
        }
        if !word.is_empty() {
            out.push(word);
        }
        out
    }

    #[test]
    fn every_verb_has_an_example_that_parses() {
        let cli = Cli::command();
        for verb in cli.get_subcommands() {
            let help = verb
                .get_after_help()
                .map(|h| h.to_string())
                .unwrap_or_default();
            let examples: Vec<&str> = help
                .lines()
                .map(str::trim)
                .filter(|l| l.starts_with("kjob "))
                .collect();
            assert!(
                !examples.is_empty(),
                "`kjob {}` has no example",
                verb.get_name()
            );
            for e in examples {
                if let Err(err) = Cli::try_parse_from(words(e)) {
                    panic!("the example `{e}` does not parse: {err}");
                }
            }
        }
    }

    #[test]
    fn a_verbs_own_options_come_before_the_connection_flags() {
        let mut cli = Cli::command();
        // Global flags reach a subcommand when the command is built.
        cli.build();
        let help = cli
            .find_subcommand_mut("dlq")
            .and_then(|d| d.find_subcommand_mut("list"))
            .map(|l| l.render_long_help().to_string())
            .unwrap_or_default();
        let own = help.find("--key").unwrap_or(usize::MAX);
        let heading = help.find("Connection and security:").unwrap_or(0);
        let bootstrap = help.find("--bootstrap-server").unwrap_or(0);
        assert!(own < heading && heading < bootstrap, "{help}");
    }
}
