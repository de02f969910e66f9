//! `kjob groups list | describe`: consumer groups as
//! `kafka-consumer-groups --list | --describe` shows them: state, protocol,
//! members (client id, host, assignment) and the lag of every partition
//! the group is assigned or has committed on.

use anyhow::{anyhow, Result};
use clap::Subcommand;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use serde_json::json;

use crate::output::{json, outln};
use crate::Ctx;
use kjob_ops::groups::{committed_topics, describe_groups, group_names, Group};
use kjob_ops::lag::group_lag;
use kjob_ops::problem::Problem;
use kjob_ops::suggest::did_you_mean;
use kjob_ops::terminal::{for_terminal, CELL_WIDTH};

#[derive(Subcommand, Debug)]
pub(crate) enum GroupsCommand {
    /// Every consumer group: state, protocol, members and the topics assigned.
    List,
    /// One group: its members (client id, host, assignment) and the lag of each partition.
    Describe {
        /// The consumer group.
        #[arg(long)]
        group: String,
    },
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| anyhow!("background task: {e}"))?
}

fn assignment(a: &[(String, Vec<i32>)]) -> String {
    a.iter()
        .map(|(t, ps)| {
            let ps: Vec<String> = ps.iter().map(i32::to_string).collect();
            format!("{t}:{}", ps.join(","))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn members_json(g: &Group) -> Vec<serde_json::Value> {
    g.members
        .iter()
        .map(|m| {
            json!({
                "id": m.id,
                "client_id": m.client_id,
                "host": m.host,
                "assignment": m.assignment.iter().map(|(t, ps)| json!({"topic": t, "partitions": ps})).collect::<Vec<_>>(),
            })
        })
        .collect()
}

pub(crate) async fn run(ctx: &Ctx, cmd: GroupsCommand) -> Result<()> {
    match cmd {
        GroupsCommand::List => list(ctx).await,
        GroupsCommand::Describe { group } => describe(ctx, group).await,
    }
}

/// `kjob groups list`: every group with its state, protocol, members and
/// assigned topics.
async fn list(ctx: &Ctx) -> Result<()> {
    let config = ctx.config.clone();
    let groups = blocking(move || Ok(describe_groups(&config, None)?)).await?;
    let mut groups: Vec<Group> = groups;
    groups.sort_by(|a, b| a.name.cmp(&b.name));
    if ctx.json() {
        let out: Vec<serde_json::Value> = groups
            .iter()
            .map(|g| {
                json!({
                    "group": g.name,
                    "state": g.state,
                    "protocol": g.protocol,
                    "members": g.members.len(),
                    "topics": g.assigned_topics(),
                })
            })
            .collect();
        return json(&json!({ "groups": out }));
    }
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "group",
        "state",
        "protocol",
        "members",
        "assigned topics",
    ]);
    for g in &groups {
        let topics = g.assigned_topics();
        t.add_row(vec![
            for_terminal(&g.name, CELL_WIDTH),
            g.state.clone(),
            g.protocol.clone(),
            g.members.len().to_string(),
            if topics.is_empty() {
                "-".into()
            } else {
                topics.join(", ")
            },
        ]);
    }
    outln!("{t}")?;
    outln!("{} group(s)", groups.len())?;
    Ok(())
}

/// `kjob groups describe`: one group's members and, per partition it
/// reads or committed, the offsets, lag and owner.
async fn describe(ctx: &Ctx, group: String) -> Result<()> {
    let config = ctx.config.clone();
    let g = group.clone();
    let (described, topics, rows) = blocking(move || {
        let described = describe_groups(&config, Some(&g))?
            .into_iter()
            .find(|d| d.name == g);
        let mut topics = committed_topics(&config, &g)?;
        if let Some(d) = &described {
            topics.extend(d.assigned_topics());
        }
        topics.sort();
        topics.dedup();
        let known = described
            .as_ref()
            .is_some_and(|d| !d.state.eq_ignore_ascii_case("dead"));
        if !known && topics.is_empty() {
            let names = group_names(&config).unwrap_or_default();
            return Err(Problem::not_found(format!(
                "group `{g}` is unknown: no members and no committed offsets{}; `kjob groups list` lists the groups",
                did_you_mean(&g, names.iter().map(String::as_str))
            ))
            .into());
        }
        let rows = if topics.is_empty() {
            Vec::new()
        } else {
            group_lag(&config, &g, &topics)?
        };
        Ok((described, topics, rows))
    })
    .await?;
    let (state, protocol) = described
        .as_ref()
        .map_or(("Empty".to_string(), String::new()), |d| {
            (d.state.clone(), d.protocol.clone())
        });
    let owner = |topic: &str, partition: i32| {
        described.as_ref().and_then(|d| {
            d.members.iter().find(|m| {
                m.assignment
                    .iter()
                    .any(|(t, ps)| t == topic && ps.contains(&partition))
            })
        })
    };
    if ctx.json() {
        let partitions: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                let m = owner(&r.topic, r.partition);
                json!({
                    "topic": r.topic,
                    "partition": r.partition,
                    "committed": r.committed,
                    "log_start": r.start,
                    "log_end": r.end,
                    "lag": r.lag(),
                    "member": m.map(|m| &m.id),
                    "client_id": m.map(|m| &m.client_id),
                    "host": m.map(|m| &m.host),
                })
            })
            .collect();
        return json(&json!({
            "group": group,
            "state": state,
            "protocol": protocol,
            "members": described.as_ref().map(members_json).unwrap_or_default(),
            "topics": topics,
            "partitions": partitions,
        }));
    }
    let count = described.as_ref().map_or(0, |d| d.members.len());
    outln!("group `{group}`: {state}, protocol {protocol}, {count} member(s)")?;
    if let Some(d) = described.as_ref().filter(|d| !d.members.is_empty()) {
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED);
        t.set_header(vec!["member", "client id", "host", "assignment"]);
        for m in &d.members {
            t.add_row(vec![
                for_terminal(&m.id, CELL_WIDTH),
                for_terminal(&m.client_id, CELL_WIDTH),
                for_terminal(&m.host, CELL_WIDTH),
                assignment(&m.assignment),
            ]);
        }
        outln!("{t}")?;
    }
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "topic",
        "partition",
        "current offset",
        "log end offset",
        "lag",
        "client id",
        "host",
    ]);
    for r in &rows {
        let m = owner(&r.topic, r.partition);
        t.add_row(vec![
            r.topic.clone(),
            r.partition.to_string(),
            r.committed.map_or("-".into(), |c| c.to_string()),
            r.end.to_string(),
            r.lag().to_string(),
            m.map_or("-".into(), |m| for_terminal(&m.client_id, CELL_WIDTH)),
            m.map_or("-".into(), |m| for_terminal(&m.host, CELL_WIDTH)),
        ]);
    }
    outln!("{t}")?;
    let lag: i64 = rows.iter().map(|r| r.lag()).sum();
    outln!("total lag {lag} over {} partition(s)", rows.len())?;
    Ok(())
}
