//! `kjob dlq`: how an operator reviews a DLQ.
//!
//! `list` shows what is unresolved, `show` one record in full, `retry`
//! re-drives (dry run first), and `resolve` closes a record without
//! re-driving it. Every action is audited in `<topic>.dlq.audit`.

use std::sync::atomic::AtomicBool;

use anyhow::{bail, Result};
use clap::Subcommand;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use indicatif::{ProgressBar, ProgressStyle};

use kjob::config::KafkaConfig;
use kjob_ops::dlq::store::{AuditEntry, Coordinates, DeadLetter};
use kjob_ops::dlq::{
    execute_redrive, list, omitted_payload, plan_redrive, resolve_records, show, Select, Target,
};
use kjob_ops::terminal::{
    cut_json_strings, for_terminal, json_for_terminal, CELL_WIDTH, LINE_WIDTH,
};
use kjob_ops::time::format_ms;

#[derive(Subcommand, Debug)]
pub enum DlqCommand {
    /// Unresolved dead letters as a table (all with --all).
    List {
        #[command(flatten)]
        select: Select,
        /// Include records already re-driven or resolved.
        #[arg(long)]
        all: bool,
        /// One JSON array instead of a table, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// One dead letter in full: headers and the payload decoded through the registry, as JSON.
    Show {
        /// DLQ topic or its main topic.
        #[arg(long)]
        topic: String,
        /// `partition:offset` in the DLQ.
        at: Coordinates,
        /// Compact JSON on one line (the default is indented JSON).
        #[arg(long)]
        json: bool,
    },
    /// Re-drive dead letters into the first retry tier (or the main topic). Dry run unless --execute.
    Retry {
        #[command(flatten)]
        select: Select,
        /// Specific records (`partition:offset`); otherwise the filters pick.
        at: Vec<Coordinates>,
        /// Where to send them.
        #[arg(long, value_enum, default_value_t = Target::Retry)]
        to: Target,
        /// Show what would move (the default).
        #[arg(long, conflicts_with = "execute")]
        dry_run: bool,
        /// Actually re-drive.
        #[arg(long)]
        execute: bool,
        /// Records per second at most, to spare a recovering downstream.
        #[arg(long, default_value_t = 100)]
        rate: u32,
        /// Who is doing this (recorded in the audit log).
        #[arg(long, env = "USER", default_value = "unknown")]
        by: String,
    },
    /// Mark dead letters handled without re-driving them (audited).
    Resolve {
        #[command(flatten)]
        select: Select,
        /// Specific records (`partition:offset`); otherwise the filters pick.
        at: Vec<Coordinates>,
        /// Why (required; kept in the audit log).
        #[arg(long)]
        reason: String,
        /// Who is doing this.
        #[arg(long, env = "USER", default_value = "unknown")]
        by: String,
    },
}

/// The dead letters as a table. Every cell that comes from a record (or
/// its audit entry) goes through [`for_terminal`]: whoever produced the
/// record chose its bytes.
fn table(rows: &[(DeadLetter, Option<AuditEntry>)], with_status: bool) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    let mut header = vec![
        "partition:offset",
        "job",
        "key",
        "attempts",
        "error class",
        "error",
        "failed at",
    ];
    if with_status {
        header.push("status");
    }
    t.set_header(header);
    for (d, a) in rows {
        let h = &d.headers;
        let cell = |v: Option<&str>| for_terminal(v.unwrap_or("-"), CELL_WIDTH);
        let mut row = vec![
            d.at.to_string(),
            cell(h.job.as_deref()),
            cell(d.key.as_deref()),
            h.attempt.map_or("-".into(), |a| a.to_string()),
            cell(h.error_class.as_deref()),
            cell(h.error.as_deref()),
            format_ms(d.timestamp_ms),
        ];
        if with_status {
            row.push(a.as_ref().map_or("unresolved".into(), |a| {
                for_terminal(&format!("{} by {}", a.action, a.by), CELL_WIDTH)
            }));
        }
        t.add_row(row);
    }
    t
}

/// One row of `list --json`.
fn summary(d: &DeadLetter, a: &Option<AuditEntry>) -> serde_json::Value {
    let h = &d.headers;
    serde_json::json!({
        "at": d.at.to_string(),
        "id": h.id,
        "job": h.job,
        "key": d.key,
        "attempt": h.attempt,
        "error_class": h.error_class,
        "error": h.error,
        "failed_at_ms": d.timestamp_ms,
        "payload_omitted": omitted_payload(d),
        "status": a.as_ref().map_or("unresolved".to_string(), |a| a.action.clone()),
        "audit": a,
    })
}

pub async fn run(config: &KafkaConfig, cmd: DlqCommand) -> Result<()> {
    match cmd {
        DlqCommand::List { select, all, json } => {
            let rows = list(config, &select, all).await?;
            if json {
                let out: Vec<serde_json::Value> = rows.iter().map(|(d, a)| summary(d, a)).collect();
                println!("{}", json_for_terminal(&serde_json::to_string(&out)?));
                return Ok(());
            }
            println!("{}", table(&rows, all));
            let unresolved = rows.iter().filter(|(_, a)| a.is_none()).count();
            println!("{} shown, {unresolved} unresolved", rows.len());
            Ok(())
        }
        DlqCommand::Show { topic, at, json } => {
            let out = show(config, &topic, at).await?;
            if json {
                // Exact values, for scripts (escaped, never cut).
                println!("{}", json_for_terminal(&serde_json::to_string(&out)?));
            } else {
                // For reading: still JSON, long strings cut.
                let readable = cut_json_strings(&out, LINE_WIDTH);
                println!(
                    "{}",
                    json_for_terminal(&serde_json::to_string_pretty(&readable)?)
                );
            }
            Ok(())
        }
        DlqCommand::Retry {
            select,
            at,
            to,
            dry_run: _,
            execute,
            rate,
            by,
        } => {
            if rate == 0 {
                bail!("--rate must be at least 1 record per second");
            }
            let plan = plan_redrive(config, &select, &at, to).await?;
            let rows: Vec<(DeadLetter, Option<AuditEntry>)> =
                plan.picked.iter().cloned().map(|d| (d, None)).collect();
            println!("{}", table(&rows, false));
            if !execute {
                println!(
                    "dry run: {} record(s) would be re-driven to `{}`; pass --execute to do it",
                    plan.picked.len(),
                    plan.target_topic
                );
                return Ok(());
            }
            let bar = ProgressBar::new(plan.picked.len() as u64).with_style(
                ProgressStyle::with_template("re-drive [{bar:30}] {pos}/{len} {per_sec}")?,
            );
            let never = AtomicBool::new(false);
            let done = execute_redrive(
                config,
                &plan,
                rate,
                &by,
                |n| bar.set_position(n as u64),
                &never,
            )
            .await?;
            bar.finish();
            println!("re-drove {done} record(s) to `{}`", plan.target_topic);
            Ok(())
        }
        DlqCommand::Resolve {
            select,
            at,
            reason,
            by,
        } => {
            let (dlq, n) = resolve_records(config, &select, &at, &reason, &by).await?;
            println!("resolved {n} record(s) in `{dlq}`");
            Ok(())
        }
    }
}
