//! `kjob routes pause|resume|list`: a route paused for a whole group (every
//! worker stops fetching its main topic; running jobs finish), audited on
//! the group's control topic. See `kjob_ops::control`.

use anyhow::Result;
use clap::Subcommand;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

use crate::output::{json, outln};
use crate::Ctx;
use kjob_ops::control::{act, read, RouteAction};
use kjob_ops::terminal::{for_terminal, CELL_WIDTH};
use kjob_ops::time::format_ms;

#[derive(Subcommand, Debug)]
pub(crate) enum RoutesCommand {
    /// Stop every worker of the group from fetching the route's main topic (running jobs finish).
    Pause {
        /// The consumer group.
        #[arg(long)]
        group: String,
        /// The route's main topic.
        #[arg(long)]
        topic: String,
        /// Why (required; shown on every dashboard page while paused).
        #[arg(long)]
        reason: String,
        /// Who is doing this, for the audit log (default: KJOB_OPERATOR, else $USER, else uid@host).
        #[arg(long, value_name = "NAME", default_value_t = crate::operator::default_name())]
        by: String,
    },
    /// Let the group's workers fetch the route again.
    Resume {
        /// The consumer group.
        #[arg(long)]
        group: String,
        /// The route's main topic.
        #[arg(long)]
        topic: String,
        /// Who is doing this, for the audit log (default: KJOB_OPERATOR, else $USER, else uid@host).
        #[arg(long, value_name = "NAME", default_value_t = crate::operator::default_name())]
        by: String,
    },
    /// The group's paused routes and the audit of pauses and resumes.
    List {
        /// The consumer group.
        #[arg(long)]
        group: String,
    },
}

pub(crate) async fn run(ctx: &Ctx, cmd: RoutesCommand) -> Result<()> {
    let cell = |v: &str| for_terminal(v, CELL_WIDTH);
    let (group, topic, by, action) = match cmd {
        RoutesCommand::List { group } => {
            let (c, g) = (ctx.config.clone(), group.clone());
            let state = tokio::task::spawn_blocking(move || read(&c, &g)).await??;
            let mut paused: Vec<_> = state.routes.values().filter(|r| r.paused).collect();
            paused.sort_by(|a, b| a.topic.cmp(&b.topic));
            if ctx.json() {
                let rows: Vec<serde_json::Value> = paused
                    .iter()
                    .map(|r| serde_json::json!({"topic": r.topic, "by": r.by, "at": format_ms(Some(r.at_ms)), "reason": r.reason}))
                    .collect();
                let audit: Vec<serde_json::Value> = state
                    .audit
                    .iter()
                    .map(|a| serde_json::json!({"subject": a.subject, "action": a.action, "by": a.by, "at": format_ms(Some(a.at_ms)), "reason": a.reason}))
                    .collect();
                return json(&serde_json::json!({"group": group, "paused": rows, "audit": audit}));
            }
            if paused.is_empty() {
                outln!("no route is paused for group `{}`", cell(&group))?;
            } else {
                let mut table = Table::new();
                table.load_preset(UTF8_FULL_CONDENSED).set_header([
                    "paused route",
                    "by",
                    "since",
                    "reason",
                ]);
                for r in paused {
                    table.add_row([
                        cell(&r.topic),
                        cell(&r.by),
                        format_ms(Some(r.at_ms)),
                        cell(r.reason.as_deref().unwrap_or("-")),
                    ]);
                }
                outln!("{table}")?;
            }
            return Ok(());
        }
        RoutesCommand::Pause {
            group,
            topic,
            reason,
            by,
        } => (group, topic, by, RouteAction::Pause { reason }),
        RoutesCommand::Resume { group, topic, by } => (group, topic, by, RouteAction::Resume),
    };
    let done = act(&ctx.config, &group, &topic, &by, action).await?;
    if ctx.json() {
        return json(&serde_json::json!({
            "group": group, "topic": topic, "action": done.action, "by": done.by,
            "at": format_ms(Some(done.at_ms)), "reason": done.reason,
        }));
    }
    outln!(
        "{} route `{}` for group `{}` as {}; its workers apply it within about a second",
        done.action,
        cell(&topic),
        cell(&group),
        cell(&done.by)
    )?;
    Ok(())
}
