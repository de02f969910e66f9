//! `kjob schedules`: a group's cron schedules, from its state topic alone,
//! and `kjob schedules pause|resume|trigger` (audited in the same topic;
//! see `kjob_ops::schedules`).
//!
//! Each row is what the last schedule leader recorded: the expression, the
//! topic, the catch-up policy, the last tick fired and the next tick due.
//! The leader is read from the group itself: the member that owns
//! partition 0 of `<group>.schedules` fires, so with no such member the
//! answer is "no leader", however recently the state was written.

use anyhow::Result;
use clap::{Args, Subcommand};
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

use crate::output::{json, outln};
use crate::Ctx;
use kjob::schedule::{format_tick, state_topic};
use kjob_ops::schedules::{act, read, Action};
use kjob_ops::terminal::{for_terminal, CELL_WIDTH};
use kjob_ops::time::format_ms;

#[derive(Args, Debug)]
pub(crate) struct SchedulesArgs {
    /// The consumer group whose workers run the schedules.
    #[arg(long)]
    group: String,
    #[command(subcommand)]
    action: Option<ScheduleCommand>,
}

/// What to do with one schedule (none: list them all).
#[derive(Subcommand, Debug)]
pub(crate) enum ScheduleCommand {
    /// Stop firing a schedule: its ticks pass as skipped until resumed (a resume never catches up on them).
    Pause {
        /// The schedule's name.
        schedule: String,
        /// Why (required; shown on every dashboard page while paused).
        #[arg(long)]
        reason: String,
        /// Who is doing this, for the audit log (default: KJOB_OPERATOR, else $USER, else uid@host).
        #[arg(long, value_name = "NAME", default_value_t = crate::operator::default_name())]
        by: String,
    },
    /// Fire a paused schedule again, from its next tick on.
    Resume {
        /// The schedule's name.
        schedule: String,
        /// Who is doing this, for the audit log (default: KJOB_OPERATOR, else $USER, else uid@host).
        #[arg(long, value_name = "NAME", default_value_t = crate::operator::default_name())]
        by: String,
    },
    /// Have the leader enqueue the schedule's job once now, as `cron:<name>:manual:<time>`.
    Trigger {
        /// The schedule's name.
        schedule: String,
        /// Who is doing this, for the audit log (default: KJOB_OPERATOR, else $USER, else uid@host).
        #[arg(long, value_name = "NAME", default_value_t = crate::operator::default_name())]
        by: String,
    },
}

async fn run_action(ctx: &Ctx, group: &str, command: ScheduleCommand) -> Result<()> {
    let (schedule, by, action) = match command {
        ScheduleCommand::Pause {
            schedule,
            reason,
            by,
        } => (schedule, by, Action::Pause { reason }),
        ScheduleCommand::Resume { schedule, by } => (schedule, by, Action::Resume),
        ScheduleCommand::Trigger { schedule, by } => (schedule, by, Action::Trigger),
    };
    let done = act(&ctx.config, group, &schedule, &by, action).await?;
    if ctx.json() {
        return json(&serde_json::json!({
            "group": group, "schedule": done.schedule, "action": done.action,
            "by": done.by, "at": format_ms(Some(done.at_ms)), "reason": done.reason,
            "job_id": done.job_id,
        }));
    }
    let cell = |v: &str| for_terminal(v, CELL_WIDTH);
    match &done.job_id {
        Some(id) => outln!(
            "{} `{}` as {}: the leader enqueues job {} within a second",
            done.action,
            cell(&done.schedule),
            cell(&done.by),
            cell(id)
        ),
        None => outln!(
            "{} `{}` as {}; the leader applies it within a second",
            done.action,
            cell(&done.schedule),
            cell(&done.by)
        ),
    }?;
    Ok(())
}

pub(crate) async fn run(ctx: &Ctx, args: SchedulesArgs) -> Result<()> {
    if let Some(command) = args.action {
        return run_action(ctx, &args.group, command).await;
    }
    let (c, g) = (ctx.config.clone(), args.group.clone());
    let all = tokio::task::spawn_blocking(move || read(&c, &g)).await??;
    let (leader, rows) = (all.leader, all.rows);
    if ctx.json() {
        let out: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                let s = &r.state;
                serde_json::json!({
                    "schedule": s.schedule,
                    "cron": s.cron,
                    "topic": s.topic,
                    "catch_up": s.catch_up,
                    "last_fired": s.last_fired_ms.map(format_tick),
                    "next_tick": r.next_ms.map(format_tick),
                    "paused": r.paused(),
                    "paused_by": r.control.as_ref().filter(|c| c.paused).map(|c| &c.by),
                    "pause_reason": r.control.as_ref().filter(|c| c.paused).and_then(|c| c.reason.as_ref()),
                    "last_trigger": s.last_trigger_ms.map(format_tick),
                    "pending_trigger": r.pending_trigger().map(format_tick),
                    "leader": s.leader,
                    "updated": format_ms(Some(s.updated_ms)),
                })
            })
            .collect();
        return json(
            &serde_json::json!({ "group": args.group, "leader": leader, "schedules": out }),
        );
    }
    if rows.is_empty() {
        outln!(
            "no schedules recorded for group `{}` (topic {} is empty or missing)",
            args.group,
            state_topic(&args.group)
        )?;
        return Ok(());
    }
    outln!(
        "leader: {}",
        leader.as_deref().map_or(
            "no leader (no member owns partition 0 of the schedules topic)".into(),
            |l| for_terminal(l, CELL_WIDTH)
        )
    )?;
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header([
        "schedule",
        "cron (UTC)",
        "topic",
        "catch-up",
        "state",
        "last fired tick",
        "next tick",
        "last recorded by",
    ]);
    // The rows come from records in the state topic: any producer to it
    // chose their text.
    let cell = |v: &str| for_terminal(v, CELL_WIDTH);
    for r in rows {
        let state = match r.control.as_ref().filter(|c| c.paused) {
            Some(c) => format!(
                "paused by {}: {}",
                cell(&c.by),
                cell(c.reason.as_deref().unwrap_or("-"))
            ),
            None => "running".into(),
        };
        let s = r.state;
        table.add_row([
            cell(&s.schedule),
            cell(&s.cron),
            cell(&s.topic),
            cell(&s.catch_up),
            state,
            s.last_fired_ms.map_or("never".into(), format_tick),
            r.next_ms.map_or("none".into(), format_tick),
            format!("{} at {}", cell(&s.leader), format_ms(Some(s.updated_ms))),
        ]);
    }
    outln!("{table}")?;
    Ok(())
}
