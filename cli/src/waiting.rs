//! `kjob waiting`: what sits in a route's retry tiers and delay topics for
//! a group, due first, and `kjob waiting cancel|now` on one of those jobs
//! (dry run unless `--execute`; audited on the group's control topic, see
//! `kjob_ops::waiting`).

use anyhow::Result;
use clap::{Args, Subcommand};
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

use crate::output::{json, outln};
use crate::Ctx;
use kjob_ops::terminal::{for_terminal, CELL_WIDTH};
use kjob_ops::time::format_ms;
use kjob_ops::waiting::{act, waiting, WaitingAction, WaitingAt, MAX_PER_PARTITION};

#[derive(Args, Debug)]
pub(crate) struct WaitingArgs {
    /// The route's main topic.
    #[arg(long)]
    topic: String,
    /// The consumer group.
    #[arg(long)]
    group: String,
    #[command(subcommand)]
    action: Option<WaitingCommand>,
    /// Records listed per partition (due first), 1 to 500.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u16).range(1..=MAX_PER_PARTITION as i64))]
    limit: u16,
}

/// What to do with one waiting job (none: list them).
#[derive(Subcommand, Debug)]
pub(crate) enum WaitingCommand {
    /// Finish a waiting job without running it (a delayed job, or a retry). Dry run unless --execute.
    Cancel {
        /// Where it waits: topic:partition:offset, as listed.
        at: String,
        /// Why (required; kept in the audit).
        #[arg(long)]
        reason: String,
        /// Who is doing this, for the audit log (default: KJOB_OPERATOR, else $USER, else uid@host).
        #[arg(long, value_name = "NAME", default_value_t = crate::operator::default_name())]
        by: String,
        /// Show what would be cancelled (the default).
        #[arg(long, conflicts_with = "execute")]
        dry_run: bool,
        /// Actually cancel.
        #[arg(long)]
        execute: bool,
    },
    /// Run a waiting job now: a copy on the main topic (for this group only), then a cancel of the original. Dry run unless --execute.
    Now {
        /// Where it waits: topic:partition:offset, as listed.
        at: String,
        /// Who is doing this, for the audit log (default: KJOB_OPERATOR, else $USER, else uid@host).
        #[arg(long, value_name = "NAME", default_value_t = crate::operator::default_name())]
        by: String,
        /// Show what would be moved (the default).
        #[arg(long, conflicts_with = "execute")]
        dry_run: bool,
        /// Actually move it.
        #[arg(long)]
        execute: bool,
    },
}

pub(crate) async fn run(ctx: &Ctx, args: WaitingArgs) -> Result<()> {
    let cell = |v: &str| for_terminal(v, CELL_WIDTH);
    let (at, by, action, execute) = match args.action {
        None => return list(ctx, &args.topic, &args.group, args.limit.into()).await,
        Some(WaitingCommand::Cancel {
            at,
            reason,
            by,
            execute,
            ..
        }) => (at, by, WaitingAction::Cancel { reason }, execute),
        Some(WaitingCommand::Now {
            at, by, execute, ..
        }) => (at, by, WaitingAction::Now, execute),
    };
    let at: WaitingAt = at.parse()?;
    let done = act(
        &ctx.config,
        &args.group,
        &args.topic,
        &at,
        &by,
        action,
        execute,
    )
    .await?;
    if ctx.json() {
        return json(&serde_json::json!({
            "group": args.group, "topic": args.topic, "at": at.to_string(), "id": done.id,
            "job": done.job, "due": format_ms(Some(done.due_ms)), "action": done.audit.action,
            "by": done.audit.by, "reason": done.audit.reason, "copy": done.copy,
            "executed": done.executed,
        }));
    }
    let what = format!(
        "job `{}` ({}, due {}) at {}",
        cell(&done.id),
        cell(done.job.as_deref().unwrap_or("-")),
        format_ms(Some(done.due_ms)),
        cell(&at.to_string())
    );
    match (done.executed, &done.copy) {
        (false, Some(to)) => outln!(
            "dry run: {what} would run now (a copy due now on `{}`, then the original is cancelled); pass --execute to do it",
            cell(to)
        )?,
        (false, None) => outln!(
            "dry run: {what} would be cancelled: no worker of group `{}` runs it; pass --execute to do it",
            cell(&args.group)
        )?,
        (true, Some(to)) => outln!(
            "moved {what} to now: the copy is at {}, the original cancelled; recorded by {}",
            cell(to),
            cell(&by)
        )?,
        (true, None) => outln!(
            "cancelled {what}; the group's workers skip it from within about a second; recorded by {}",
            cell(&by)
        )?,
    }
    Ok(())
}

async fn list(ctx: &Ctx, topic: &str, group: &str, limit: usize) -> Result<()> {
    let (c, t, g) = (ctx.config.clone(), topic.to_string(), group.to_string());
    let (topics, control) = tokio::task::spawn_blocking(move || {
        anyhow::Ok((
            waiting(&c, &t, &g, limit)?,
            kjob::control::read_control(&c, &g)?,
        ))
    })
    .await??;
    // A cancelled job stays listed until a worker reaches it.
    let cancel_of = |r: &kjob_ops::waiting::WaitingRecord| {
        let (id, due) = (r.headers.id.as_deref()?, r.due_ms()?);
        control
            .cancels
            .values()
            .find(|c| c.topic == topic && c.id == id && c.due_ms == due)
            .map(|c| format!("{} by {}", c.action, c.by))
    };
    let cell = |v: &str| for_terminal(v, CELL_WIDTH);
    if ctx.json() {
        let rows: Vec<serde_json::Value> = topics
            .iter()
            .flat_map(|t| {
                t.partitions.iter().flat_map(move |p| {
                    p.records.iter().map(move |r| {
                        serde_json::json!({
                            "cancelled": cancel_of(r),
                            "at": format!("{}:{}:{}", t.topic, r.partition, r.offset),
                            "role": t.role.label(), "delay": t.delay, "id": r.headers.id,
                            "job": r.headers.job, "key": r.key, "attempt": r.headers.attempt,
                            "due": r.due_ms().map(|d| format_ms(Some(d))),
                        })
                    })
                })
            })
            .collect();
        let counts: Vec<serde_json::Value> = topics
            .iter()
            .map(|t| serde_json::json!({"topic": t.topic, "waiting": t.waiting()}))
            .collect();
        return json(&serde_json::json!({"records": rows, "topics": counts}));
    }
    if topics.is_empty() {
        outln!(
            "route `{}` has no retry tier or delay topic yet",
            cell(topic)
        )?;
        return Ok(());
    }
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_header(["at", "job", "key", "job id", "attempt", "due", "state"]);
    let (mut shown, mut total) = (0usize, 0i64);
    for t in &topics {
        total += t.waiting();
        for p in &t.partitions {
            for r in &p.records {
                shown += 1;
                table.add_row([
                    cell(&format!("{}:{}:{}", t.topic, r.partition, r.offset)),
                    cell(r.headers.job.as_deref().unwrap_or("-")),
                    cell(r.key.as_deref().unwrap_or("-")),
                    cell(r.headers.id.as_deref().unwrap_or("-")),
                    r.headers.attempt.map_or("-".to_string(), |a| a.to_string()),
                    format_ms(r.due_ms()),
                    cell(&cancel_of(r).unwrap_or_else(|| "waiting".into())),
                ]);
            }
        }
    }
    if shown > 0 {
        outln!("{table}")?;
    }
    outln!(
        "{shown} shown, {total} waiting for group `{}` (--limit {limit} per partition)",
        cell(group)
    )?;
    Ok(())
}
