//! `kjob outbox`: create the outbox table, run a relay, and see how it is
//! doing. The relay is the same [`kjob::outbox::Relay`] a program can embed.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{anyhow, Result};
use clap::{Args, Subcommand};
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use tokio_postgres::NoTls;

use crate::output::{json, outln};
use crate::Ctx;
use kjob::outbox::{migration_sql, read_status, OutboxStatus, OutboxTable, Relay, DEFAULT_TABLE};
use kjob_ops::terminal::{for_terminal, LINE_WIDTH};

/// Where the outbox lives.
#[derive(Args, Debug, Clone)]
pub(crate) struct Database {
    /// PostgreSQL URL, e.g. postgres://user@host:5432/db.
    #[arg(long = "database-url", env = "KJOB_DATABASE_URL")]
    pub database_url: String,
    /// Outbox table (optionally schema-qualified).
    #[arg(long, default_value = DEFAULT_TABLE)]
    pub table: String,
}

#[derive(Subcommand, Debug)]
pub(crate) enum OutboxCommand {
    /// Create the outbox table, its indexes and the SQL enqueue functions
    /// (kjob.enqueue, kjob.enqueue_many); idempotent.
    Migrate {
        #[command(flatten)]
        db: Database,
        /// Print the SQL instead of running it (for your own migration tool).
        #[arg(long)]
        print: bool,
        /// Schema for the SQL enqueue functions (default: `kjob` for the
        /// default table, `kjob_<table>` for any other).
        #[arg(long)]
        sql_schema: Option<String>,
    },
    /// Publish committed outbox rows until SIGTERM/SIGINT.
    Relay {
        #[command(flatten)]
        db: Database,
        /// Rows per batch.
        #[arg(long, default_value_t = 1000)]
        batch_size: usize,
        /// Polling fallback when no notification arrives (e.g. 500ms).
        #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
        poll_interval: Duration,
        /// Keep sent rows this long (e.g. 1h; 0s deletes them on publish).
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        retention: Duration,
        /// Serve /metrics and /healthz here (e.g. 127.0.0.1:9464).
        #[arg(long)]
        metrics_addr: Option<SocketAddr>,
        /// Write delayed rows to the shared delay buckets `NS.delay.<bucket>`
        /// (workers built with `SharedTiers::delay_buckets`; NS is their
        /// group unless they name another).
        #[arg(long, value_name = "NS")]
        shared_delays: Option<String>,
    },
    /// Unsent rows, relay lag, publish rate, failing rows and live relays.
    Status {
        #[command(flatten)]
        db: Database,
    },
}

/// Connects, with an error that names the URL's host (never the password).
pub(crate) async fn connect(url: &str) -> Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.map_err(|e| {
        let host = url.rsplit('@').next().unwrap_or("the database");
        let what = format!(
            "connecting to PostgreSQL at {host} (check --database-url / KJOB_DATABASE_URL): {e}"
        );
        // A refused password is an answer; anything else, no answer.
        if e.code().is_some() {
            anyhow::Error::new(kjob_ops::problem::Problem::refused(what))
        } else {
            anyhow::Error::new(kjob_ops::problem::Problem::unreachable(what))
        }
    })?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "PostgreSQL connection closed");
        }
    });
    Ok(client)
}

/// Prints the outbox part of a status.
pub(crate) fn print_status(s: &OutboxStatus) -> Result<()> {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "outbox table",
        "unsent",
        "oldest unsent",
        "published/s",
        "failing",
        "dead-lettered",
        "relays",
    ]);
    let unsent = match s.unsent_for_topic {
        Some(n) => format!("{} ({n} for this topic)", s.unsent),
        None => s.unsent.to_string(),
    };
    t.add_row(vec![
        s.table.clone(),
        unsent,
        format!("{:.1}s", s.oldest_unsent_seconds),
        format!("{:.1}", s.published_per_second),
        s.failing.to_string(),
        s.dead_lettered.to_string(),
        s.relays.to_string(),
    ]);
    outln!("{t}")?;
    if let Some(e) = &s.last_error {
        // The broker's words about a row the application wrote.
        outln!("last publish error: {}", for_terminal(e, LINE_WIDTH))?;
    }
    if s.relays == 0 && s.unsent > 0 {
        outln!("no relay is running: start one with `kjob outbox relay --database-url ...`")?;
    }
    Ok(())
}

pub(crate) async fn run(ctx: &Ctx, cmd: OutboxCommand) -> Result<()> {
    let config = &ctx.config;
    match cmd {
        OutboxCommand::Migrate {
            db,
            print,
            sql_schema,
        } => {
            let mut table = OutboxTable::new(&db.table)?;
            if let Some(schema) = sql_schema {
                table = table.with_functions_schema(&schema)?;
            }
            if print {
                if ctx.json() {
                    return json(&serde_json::json!({ "sql": migration_sql(&table) }));
                }
                outln!("{}", migration_sql(&table))?;
                return Ok(());
            }
            let client = connect(&db.database_url).await?;
            kjob::outbox::migrate(&client, &table).await?;
            if ctx.json() {
                return json(&serde_json::json!({
                    "table": table.name(),
                    "functions_schema": table.functions_schema(),
                }));
            }
            outln!(
                "outbox table `{}` is ready; enqueue from SQL with SELECT {}.enqueue(topic => ..., key => ..., job => '{{...}}'::jsonb)",
                table.name(),
                table.functions_schema()
            )?;
            Ok(())
        }
        OutboxCommand::Relay {
            db,
            batch_size,
            poll_interval,
            retention,
            metrics_addr,
            shared_delays,
        } => {
            let _telemetry = kjob::telemetry::init()?;
            // The operator CLI fails connections fast; a relay must keep
            // trying instead.
            let mut kafka = config.clone();
            if ctx.cli_set_connect_timeout {
                kafka.overrides.remove("socket.connection.setup.timeout.ms");
            }
            let mut relay = Relay::new(db.database_url, kafka)
                .table(&db.table)?
                .batch_size(batch_size)
                .poll_interval(poll_interval)
                .retention(retention);
            if let Some(addr) = metrics_addr {
                relay = relay.metrics_endpoint(addr)?;
            }
            if let Some(ns) = &shared_delays {
                relay = relay.shared_delay_buckets(ns);
            }
            relay.run().await.map_err(|e| anyhow!(e))
        }
        OutboxCommand::Status { db } => {
            let table = OutboxTable::new(&db.table)?;
            let client = connect(&db.database_url).await?;
            let status = read_status(&client, &table, None, Duration::from_secs(1)).await?;
            if ctx.json() {
                json(&status)
            } else {
                print_status(&status)
            }
        }
    }
}
