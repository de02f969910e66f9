//! `kjob batches`: batches from their state topic: list, show, cancel
//! (dry run unless `--execute`; the cancel event records who and why).

use anyhow::Result;
use clap::Subcommand;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

use crate::output::{json, outln};
use crate::Ctx;
use kjob::batch::{BatchState, DEFAULT_TOPIC};
use kjob_ops::terminal::{for_terminal, CELL_WIDTH};
use kjob_ops::time::format_ms;

#[derive(Subcommand, Debug)]
pub(crate) enum BatchesCommand {
    /// Every batch: state, counts, age, callbacks.
    List {
        /// The batch topic (its workers' `batches_on`).
        #[arg(long, default_value = DEFAULT_TOPIC)]
        topic: String,
        /// Only batches still open or running.
        #[arg(long)]
        open: bool,
    },
    /// One batch in full.
    Show {
        /// The batch id.
        #[arg(long)]
        batch: String,
        /// The batch topic.
        #[arg(long, default_value = DEFAULT_TOPIC)]
        topic: String,
    },
    /// Cancel an open or running batch: no callback fires; finished jobs stay finished. Dry run unless --execute.
    Cancel {
        /// The batch id.
        #[arg(long)]
        batch: String,
        /// The batch topic.
        #[arg(long, default_value = DEFAULT_TOPIC)]
        topic: String,
        /// Why (required; kept with the batch).
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
}

/// A batch as JSON, for `--json`.
fn as_json(b: &BatchState, now: i64) -> serde_json::Value {
    serde_json::json!({
        "batch": b.batch,
        "status": b.status().as_str(),
        "total": b.total,
        "succeeded": b.succeeded,
        "dead_lettered": b.dead_lettered,
        "finished": b.finished(),
        "late": b.late,
        "sealed": b.sealed_ms.is_some(),
        "opened": b.opened_ms.map(|t| format_ms(Some(t))),
        "opened_by": b.opened_by,
        "age_seconds": b.opened_ms.map(|t| (now - t).max(0) / 1000),
        "completed": b.completed_ms.map(|t| format_ms(Some(t))),
        "callbacks": b.callbacks.iter().map(|c| serde_json::json!({
            "when": c.when.as_str(),
            "job": c.job,
            "topic": c.topic,
            "fired": b.fired.iter().find(|(w, _)| *w == c.when).map(|(_, t)| format_ms(Some(*t))),
        })).collect::<Vec<_>>(),
        "cancelled": b.cancelled.as_ref().map(|c| serde_json::json!({
            "at": format_ms(Some(c.at_ms)), "by": c.by, "reason": c.reason,
        })),
        "partition": b.partition,
    })
}

fn callbacks(b: &BatchState) -> String {
    if b.callbacks.is_empty() {
        return "none".into();
    }
    b.callbacks
        .iter()
        .map(|c| {
            let state = match b.fired.iter().find(|(w, _)| *w == c.when) {
                Some((_, t)) => format!("fired {}", format_ms(Some(*t))),
                None if b.cancelled.is_some() => "never (cancelled)".into(),
                None => "waiting".into(),
            };
            format!(
                "{} {}: {state}",
                c.when.as_str(),
                for_terminal(&c.job, CELL_WIDTH)
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn age(b: &BatchState, now: i64) -> String {
    b.opened_ms.map_or("?".into(), |t| {
        humantime::format_duration(std::time::Duration::from_secs(
            ((now - t).max(0) / 1000) as u64,
        ))
        .to_string()
    })
}

pub(crate) async fn run(ctx: &Ctx, cmd: BatchesCommand) -> Result<()> {
    let now = kjob::clock::now_ms();
    match cmd {
        BatchesCommand::List { topic, open } => {
            let (c, t) = (ctx.config.clone(), topic.clone());
            let mut all =
                tokio::task::spawn_blocking(move || kjob_ops::batches::list(&c, &t)).await??;
            if open {
                all.retain(BatchState::is_open);
            }
            if ctx.json() {
                let rows: Vec<_> = all.iter().map(|b| as_json(b, now)).collect();
                return json(&serde_json::json!({ "topic": topic, "batches": rows }));
            }
            if all.is_empty() {
                outln!(
                    "no batches recorded on `{}`",
                    kjob::batch::state_topic(&topic)
                )?;
                return Ok(());
            }
            let mut table = Table::new();
            table.load_preset(UTF8_FULL_CONDENSED).set_header([
                "batch",
                "status",
                "finished/total",
                "succeeded",
                "dead-lettered",
                "age",
                "callbacks",
            ]);
            for b in &all {
                table.add_row([
                    for_terminal(&b.batch, CELL_WIDTH),
                    b.status().as_str().to_string(),
                    format!("{}/{}", b.finished(), b.total),
                    b.succeeded.to_string(),
                    b.dead_lettered.to_string(),
                    age(b, now),
                    callbacks(b),
                ]);
            }
            outln!("{table}")?;
        }
        BatchesCommand::Show { batch, topic } => {
            let (c, t, id) = (ctx.config.clone(), topic.clone(), batch.clone());
            let b =
                tokio::task::spawn_blocking(move || kjob_ops::batches::show(&c, &t, &id)).await??;
            if ctx.json() {
                return json(&as_json(&b, now));
            }
            print_batch(&b, now)?;
        }
        BatchesCommand::Cancel {
            batch,
            topic,
            reason,
            by,
            dry_run: _,
            execute,
        } => {
            if reason.trim().is_empty() {
                return Err(kjob_ops::problem::Problem::usage(
                    "--reason must say why the batch is cancelled",
                )
                .into());
            }
            if !execute {
                let (c, t, id) = (ctx.config.clone(), topic.clone(), batch.clone());
                let b = tokio::task::spawn_blocking(move || kjob_ops::batches::show(&c, &t, &id))
                    .await??;
                outln!(
                    "dry run: batch `{}` ({}, {} of {} finished) would be cancelled: no callback fires; pass --execute to do it",
                    for_terminal(&b.batch, CELL_WIDTH),
                    b.status().as_str(),
                    b.finished(),
                    b.total
                )?;
                return Ok(());
            }
            let b = kjob_ops::batches::cancel(&ctx.config, &topic, &batch, &by, &reason).await?;
            outln!(
                "cancelled batch `{}` ({} of {} finished); recorded by {}",
                for_terminal(&b.batch, CELL_WIDTH),
                b.finished(),
                b.total,
                for_terminal(&by, CELL_WIDTH)
            )?;
        }
    }
    Ok(())
}

/// `kjob batches show`'s text: one line per fact of the batch.
fn print_batch(b: &BatchState, now: i64) -> Result<()> {
    outln!("batch:         {}", for_terminal(&b.batch, CELL_WIDTH))?;
    outln!("status:        {}", b.status().as_str())?;
    outln!(
        "jobs:          {} of {} finished: {} succeeded, {} dead-lettered{}",
        b.finished(),
        b.total,
        b.succeeded,
        b.dead_lettered,
        if b.sealed_ms.is_some() {
            ""
        } else {
            " (not sealed: more may come)"
        }
    )?;
    if b.late > 0 {
        outln!(
            "late:          {} enqueued after the seal (not counted)",
            b.late
        )?;
    }
    outln!(
        "opened:        {} by {} ({} ago)",
        format_ms(b.opened_ms),
        for_terminal(b.opened_by.as_deref().unwrap_or("?"), CELL_WIDTH),
        age(b, now)
    )?;
    outln!(
        "sealed:        {}",
        b.sealed_ms.map_or("no".into(), |t| format_ms(Some(t)))
    )?;
    outln!(
        "completed:     {}",
        b.completed_ms.map_or("no".into(), |t| format_ms(Some(t)))
    )?;
    outln!("callbacks:     {}", callbacks(b))?;
    if let Some(c) = &b.cancelled {
        outln!(
            "cancelled:     {} by {}: {}",
            format_ms(Some(c.at_ms)),
            for_terminal(&c.by, CELL_WIDTH),
            for_terminal(&c.reason, CELL_WIDTH)
        )?;
    }
    Ok(())
}
