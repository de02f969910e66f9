//! `kjob schedules`: a group's cron schedules, from its state topic alone.
//!
//! Each row is what the last schedule leader recorded: the expression, the
//! topic, the catch-up policy, the last tick fired and the next tick due.
//! The leader is read from the group itself: the member that owns
//! partition 0 of `<group>.schedules` fires, so with no such member the
//! answer is "no leader", however recently the state was written.

use anyhow::Result;
use clap::Args;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

use crate::output::{json, outln};
use crate::Ctx;
use kjob::schedule::{format_tick, next_tick, read_states, state_topic};
use kjob_ops::terminal::{for_terminal, CELL_WIDTH};
use kjob_ops::time::format_ms;

#[derive(Args, Debug)]
pub(crate) struct SchedulesArgs {
    /// The consumer group whose workers run the schedules.
    #[arg(long)]
    group: String,
}

pub(crate) async fn run(ctx: &Ctx, args: SchedulesArgs) -> Result<()> {
    let (c, g) = (ctx.config.clone(), args.group.clone());
    let states = tokio::task::spawn_blocking(move || read_states(&c, &g)).await??;
    let (c, g) = (ctx.config.clone(), args.group.clone());
    let leader = tokio::task::spawn_blocking(move || current_leader(&c, &g)).await??;
    let now = kjob::dlq::now_ms();
    let mut rows: Vec<_> = states.into_values().collect();
    rows.sort_by(|a, b| a.schedule.cmp(&b.schedule));
    if ctx.json() {
        let out: Vec<serde_json::Value> = rows
            .iter()
            .map(|s| {
                serde_json::json!({
                    "schedule": s.schedule,
                    "cron": s.cron,
                    "topic": s.topic,
                    "catch_up": s.catch_up,
                    "last_fired": s.last_fired_ms.map(format_tick),
                    "next_tick": next_tick(&s.cron, now).map(format_tick),
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
        "last fired tick",
        "next tick",
        "last recorded by",
    ]);
    // The rows come from records in the state topic: any producer to it
    // chose their text.
    let cell = |v: &str| for_terminal(v, CELL_WIDTH);
    for s in rows {
        table.add_row([
            cell(&s.schedule),
            cell(&s.cron),
            cell(&s.topic),
            cell(&s.catch_up),
            s.last_fired_ms.map_or("never".into(), format_tick),
            next_tick(&s.cron, now).map_or("none".into(), format_tick),
            format!("{} at {}", cell(&s.leader), format_ms(Some(s.updated_ms))),
        ]);
    }
    outln!("{table}")?;
    Ok(())
}

/// The member that fires the group's schedules now: the owner of partition
/// 0 of `<group>.schedules`, as `client.id@host`. `None` when no member owns
/// it (the leader left or its session expired, and no one took over yet).
fn current_leader(config: &kjob::KafkaConfig, group: &str) -> Result<Option<String>> {
    let topic = kjob::schedule::leader_topic(group);
    let groups = kjob_ops::groups::describe_groups(config, Some(group))?;
    Ok(groups
        .iter()
        .flat_map(|g| g.members.iter())
        .find(|m| {
            m.assignment
                .iter()
                .any(|(t, ps)| *t == topic && ps.contains(&0))
        })
        .map(|m| format!("{}@{}", m.client_id, m.host.trim_start_matches('/'))))
}
