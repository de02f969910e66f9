//! `kjob dlq`: how an operator reviews a DLQ, after Symfony Messenger's
//! `messenger:failed:*`.
//!
//! `list` shows what is unresolved, `show` one record in full, `retry`
//! re-drives and `resolve` closes a record without re-driving it; both are
//! dry runs unless `--execute` is given. Every action is audited in
//! `<topic>.dlq.audit`.

use std::sync::atomic::AtomicBool;

use anyhow::Result;
use clap::Subcommand;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::output::{json, outln};
use crate::Ctx;
use kjob_ops::dlq::precheck::Reader;
use kjob_ops::dlq::store::{AuditEntry, Coordinates, DeadLetter};
use kjob_ops::dlq::{
    execute_redrive, execute_resolve, list, omitted_payload, plan_redrive, plan_resolve, show,
    RedrivePlan, ResolvePlan, Select, Target,
};
use kjob_ops::problem::Problem;
use kjob_ops::terminal::{
    cut_json_strings, for_terminal, json_for_terminal, CELL_WIDTH, LINE_WIDTH,
};
use kjob_ops::time::format_ms;

#[derive(Subcommand, Debug)]
pub(crate) enum DlqCommand {
    /// Unresolved dead letters as a table (all with --all), oldest first.
    List {
        #[command(flatten)]
        select: Select,
        /// Include records already re-driven or resolved.
        #[arg(long)]
        all: bool,
        /// Show at most N records (the oldest first).
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
    },
    /// One dead letter in full: headers and the payload decoded through the registry, as JSON.
    Show {
        /// DLQ topic or its main topic.
        #[arg(long)]
        topic: String,
        /// `partition:offset` in the DLQ.
        at: Coordinates,
    },
    /// Re-drive dead letters into the first retry tier (or the main topic). Dry run unless --execute.
    ///
    /// Each record's writer schema is checked first against the live reader (the newest
    /// version under the route's subject) or --reader: the ones it cannot read would come
    /// straight back, so they are held back, left in place with the reason.
    Retry {
        #[command(flatten)]
        select: Select,
        /// Specific records (`partition:offset`); otherwise the filters pick.
        at: Vec<Coordinates>,
        /// Where to send them.
        #[arg(long, value_enum, default_value_t = Target::Retry)]
        to: Target,
        /// Check against this reader instead of the live one (the contract about to be
        /// deployed, `schemas/<name>.v<N>.avsc`).
        #[arg(long, value_name = "FILE")]
        reader: Option<std::path::PathBuf>,
        /// Show what would move (the default).
        #[arg(long, conflicts_with = "execute")]
        dry_run: bool,
        /// Actually re-drive.
        #[arg(long)]
        execute: bool,
        /// Records per second at most, to spare a recovering downstream.
        #[arg(long, default_value_t = 100)]
        rate: u32,
        /// Who is doing this, for the audit log (default: KJOB_OPERATOR, else $USER, else uid@host).
        #[arg(long, value_name = "NAME", default_value_t = crate::operator::default_name())]
        by: String,
    },
    /// Mark dead letters handled without re-driving them (audited). Dry run unless --execute.
    Resolve {
        #[command(flatten)]
        select: Select,
        /// Specific records (`partition:offset`); otherwise the filters pick.
        at: Vec<Coordinates>,
        /// Why (required; kept in the audit log).
        #[arg(long)]
        reason: String,
        /// Resolve at most N records (the oldest first).
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// Show what would be resolved (the default).
        #[arg(long, conflicts_with = "execute")]
        dry_run: bool,
        /// Actually resolve.
        #[arg(long)]
        execute: bool,
        /// Who is doing this, for the audit log (default: KJOB_OPERATOR, else $USER, else uid@host).
        #[arg(long, value_name = "NAME", default_value_t = crate::operator::default_name())]
        by: String,
    },
}

/// The dead letters as a table. Every cell that comes from a record (or
/// its audit entry) goes through [`for_terminal`]: whoever produced the
/// record chose its bytes.
fn table(rows: &[(DeadLetter, Option<AuditEntry>)], with_status: bool) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    // A job dead-lettered again is one row, its newest dead letter; the
    // column appears only when some row has earlier ones.
    let with_history = rows.iter().any(|(d, _)| !d.earlier.is_empty());
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
    if with_history {
        header.push("earlier");
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
        if with_history {
            row.push(earlier(&d.earlier));
        }
        t.add_row(row);
    }
    t
}

/// The earlier dead letters of a row's job, as a cell: `2 (0:3, 0:7)`.
fn earlier(at: &[Coordinates]) -> String {
    if at.is_empty() {
        return "-".into();
    }
    let list: Vec<String> = at.iter().map(Coordinates::to_string).collect();
    for_terminal(&format!("{} ({})", at.len(), list.join(", ")), CELL_WIDTH)
}

/// One dead letter as JSON (a row of `list --json`, a record of the
/// actions' JSON).
fn summary(d: &DeadLetter, a: Option<&AuditEntry>) -> serde_json::Value {
    let h = &d.headers;
    json!({
        "at": d.at.to_string(),
        "partition": d.at.partition,
        "offset": d.at.offset,
        "id": h.id,
        "job": h.job,
        "key": d.key,
        "attempt": h.attempt,
        "error_class": h.error_class,
        "error": h.error,
        "failed_at_ms": d.timestamp_ms,
        "payload_omitted": omitted_payload(d),
        "status": a.map_or("unresolved".to_string(), |a| a.action.clone()),
        "audit": a,
        // The same job's earlier dead letters, oldest first.
        "earlier": d.earlier.iter().map(Coordinates::to_string).collect::<Vec<_>>(),
    })
}

/// `--reader FILE`: a contract file's schema; a usage error naming the
/// file otherwise.
fn reader_file(path: &std::path::Path) -> Result<Reader> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Problem::usage(format!("--reader {}: {e}", path.display())))?;
    let schema = apache_avro::Schema::parse_str(&text).map_err(|e| {
        Problem::usage(format!(
            "--reader {}: not an Avro schema: {e}",
            path.display()
        ))
    })?;
    Ok(Reader::File {
        shown: format!("--reader {}", path.display()),
        schema: Box::new(schema),
    })
}

/// The records a re-drive holds back, with why (nothing when none is).
fn held_back(plan: &kjob_ops::dlq::RedrivePlan) -> Result<()> {
    if let Some(why) = &plan.not_checked {
        outln!(
            "not checked against a reader: {}",
            for_terminal(why, LINE_WIDTH)
        )?;
    }
    if plan.held.is_empty() {
        return Ok(());
    }
    outln!(
        "held back, left in place ({} record(s)): the reader cannot read their writer",
        plan.held.len()
    )?;
    for h in &plan.held {
        outln!("  {}  {}", h.letter.at, for_terminal(&h.reason, LINE_WIDTH))?;
    }
    Ok(())
}

fn plain(rows: &[DeadLetter]) -> Vec<(DeadLetter, Option<AuditEntry>)> {
    rows.iter().cloned().map(|d| (d, None)).collect()
}

pub(crate) async fn run(ctx: &Ctx, cmd: DlqCommand) -> Result<()> {
    let config = &ctx.config;
    match cmd {
        DlqCommand::List { select, all, limit } => list_cmd(ctx, &select, all, limit).await,
        DlqCommand::Show { topic, at } => show_cmd(ctx, &topic, at).await,
        DlqCommand::Retry {
            select,
            at,
            to,
            reader,
            dry_run: _,
            execute,
            rate,
            by,
        } => {
            if rate == 0 {
                return Err(Problem::usage("--rate must be at least 1 record per second").into());
            }
            let reader = match reader {
                None => Reader::Live,
                Some(path) => reader_file(&path)?,
            };
            let plan = plan_redrive(config, &select, &at, to, &reader).await?;
            if !ctx.json() {
                outln!("{}", table(&plain(&plan.picked), false))?;
                held_back(&plan)?;
            }
            if !execute {
                if ctx.json() {
                    return json(&redrive_json(&plan, None));
                }
                outln!(
                    "dry run: {} record(s) would be re-driven to `{}`{}; pass --execute to do it",
                    plan.picked.len(),
                    plan.target_topic,
                    match plan.held.len() {
                        0 => String::new(),
                        n => format!(", {n} held back"),
                    }
                )?;
                return Ok(());
            }
            if plan.picked.is_empty() && !plan.held.is_empty() {
                return Err(Problem::refused(format!(
                    "nothing re-driven: all {} record(s) are held back, the reader cannot read them (see above); deploy a reader that can, or check one with --reader",
                    plan.held.len()
                ))
                .into());
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
            bar.finish_and_clear();
            if ctx.json() {
                return json(&redrive_json(&plan, Some(done)));
            }
            outln!("re-drove {done} record(s) to `{}`", plan.target_topic)?;
            Ok(())
        }
        DlqCommand::Resolve {
            select,
            at,
            reason,
            limit,
            dry_run: _,
            execute,
            by,
        } => {
            if reason.trim().is_empty() {
                return Err(
                    Problem::usage("--reason must say why the records need no re-drive").into(),
                );
            }
            let plan = plan_resolve(config, &select, &at, limit).await?;
            let limited = if plan.picked.len() < plan.matched {
                format!(" (--limit {}; {} match)", plan.picked.len(), plan.matched)
            } else {
                String::new()
            };
            if !execute {
                if ctx.json() {
                    return json(&resolve_json(&plan, None));
                }
                outln!("{}", table(&plain(&plan.picked), false))?;
                outln!(
                    "dry run: {} record(s) would be resolved in `{}`{limited}; pass --execute to do it",
                    plan.picked.len(),
                    plan.dlq
                )?;
                return Ok(());
            }
            let n = execute_resolve(config, &plan, &reason, &by).await?;
            if ctx.json() {
                return json(&resolve_json(&plan, Some(n)));
            }
            outln!("resolved {n} record(s) in `{}`{limited}", plan.dlq)?;
            Ok(())
        }
    }
}

/// `kjob dlq list`: the dead letters `select` picks, newest first.
async fn list_cmd(ctx: &Ctx, select: &Select, all: bool, limit: Option<usize>) -> Result<()> {
    let rows = list(&ctx.config, select, all).await?;
    let unresolved = rows.iter().filter(|(_, a)| a.is_none()).count();
    let shown = &rows[..limit.unwrap_or(rows.len()).min(rows.len())];
    if ctx.json() {
        let out: Vec<serde_json::Value> =
            shown.iter().map(|(d, a)| summary(d, a.as_ref())).collect();
        return json(&out);
    }
    outln!("{}", table(shown, all))?;
    let limited = if shown.len() < rows.len() {
        format!(" (--limit {}; {} match)", shown.len(), rows.len())
    } else {
        String::new()
    };
    outln!("{} shown, {unresolved} unresolved{limited}", shown.len())?;
    Ok(())
}

/// `kjob dlq show`: one dead letter, whole.
async fn show_cmd(ctx: &Ctx, topic: &str, at: Coordinates) -> Result<()> {
    let out = show(&ctx.config, topic, at).await?;
    if ctx.json() {
        // Exact values, for scripts (escaped, never cut).
        return json(&out);
    }
    // For reading: still JSON, long strings cut.
    let readable = cut_json_strings(&out, LINE_WIDTH);
    outln!(
        "{}",
        json_for_terminal(&serde_json::to_string_pretty(&readable)?)
    )?;
    Ok(())
}

/// `kjob dlq retry --json`'s answer: the plan, and how many were
/// re-driven (`None`: a dry run).
fn redrive_json(plan: &RedrivePlan, done: Option<usize>) -> serde_json::Value {
    let records: Vec<serde_json::Value> = plan.picked.iter().map(|d| summary(d, None)).collect();
    let held: Vec<serde_json::Value> = plan
        .held
        .iter()
        .map(|h| {
            let mut v = summary(&h.letter, None);
            v["held_because"] = json!(h.reason);
            v
        })
        .collect();
    json!({
        "dry_run": done.is_none(),
        "dlq": kjob::topics::dlq_topic(&plan.main),
        "target_topic": plan.target_topic,
        "checked_against": plan.checked_against,
        "not_checked": plan.not_checked,
        "records": records,
        "held": held,
        "redriven": done.unwrap_or(0),
    })
}

/// `kjob dlq resolve --json`'s answer: the plan, and how many were
/// resolved (`None`: a dry run).
fn resolve_json(plan: &ResolvePlan, resolved: Option<usize>) -> serde_json::Value {
    let records: Vec<serde_json::Value> = plan.picked.iter().map(|d| summary(d, None)).collect();
    json!({
        "dry_run": resolved.is_none(),
        "dlq": plan.dlq,
        "matched": plan.matched,
        "records": records,
        "resolved": resolved.unwrap_or(0),
    })
}
