//! `kjob topics delete --route T | --group G`: the topics that belong to a
//! route or a group by the worker's own rules
//! ([`kjob::deployment::classify`]), deleted only with `--execute`, and
//! never while a live member reads them.
//!
//! A route is its main topic and its own tiers, delay topics, DLQ, DLQ
//! audit trail and order topic. A group is its shared tiers and delay
//! buckets, its control topic and its cron topics, and the consumer group
//! itself (its committed offsets); the routes it served are deleted one by
//! one with `--route`, since another group may read them.

use std::time::Duration;

use anyhow::{anyhow, Result};
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use serde_json::json;

use super::blocking;
use crate::output::{json, outln};
use crate::Ctx;
use kjob::deployment::{classify, Role};
use kjob_ops::groups::{describe_groups, group_names, Group};
use kjob_ops::problem::Problem;
use kjob_ops::suggest::did_you_mean;
use kjob_ops::topics::topic_partitions;

/// Who reads `topics` now: `client.id@host (group)` of every live member
/// assigned one of them.
fn live_readers(groups: &[Group], topics: &[(String, Role, usize)]) -> Vec<String> {
    let mut out: Vec<String> = groups
        .iter()
        .flat_map(|g| {
            g.members
                .iter()
                .filter(|m| {
                    m.assignment
                        .iter()
                        .any(|(t, _)| topics.iter().any(|(x, _, _)| x == t))
                })
                .map(move |m| format!("{}@{} (group {})", m.client_id, m.host, g.name))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

pub(super) async fn run(
    ctx: &Ctx,
    route: Option<String>,
    group: Option<String>,
    execute: bool,
) -> Result<()> {
    let c = ctx.config.clone();
    let infos = blocking(move || topic_partitions(&c)).await?;
    let names: Vec<String> = infos.keys().cloned().collect();
    let c = ctx.config.clone();
    let groups = blocking(move || Ok(group_names(&c)?)).await?;
    let roles = classify(&names, &groups);
    let size = |t: &str| infos.get(t).map_or(0, |i| i.partitions);
    let (what, targets): (String, Vec<(String, Role, usize)>) = match (&route, &group) {
        (Some(r), None) => {
            let mut t: Vec<(String, Role, usize)> = roles
                .iter()
                .filter(|(_, c)| c.route.as_deref() == Some(r.as_str()) && !c.role.group_wide())
                .map(|(t, c)| (t.clone(), c.role, size(t)))
                .collect();
            if infos.contains_key(r) && !t.iter().any(|(n, _, _)| n == r) {
                t.insert(0, (r.clone(), Role::Main, size(r)));
            }
            if t.is_empty() {
                let mains = roles
                    .iter()
                    .filter(|(_, c)| c.role == Role::Main)
                    .map(|(t, _)| t.as_str());
                return Err(anyhow!(Problem::not_found(format!(
                    "no topic belongs to route `{r}` on {}{}",
                    ctx.config.bootstrap_servers,
                    did_you_mean(r, mains)
                ))));
            }
            (format!("route {r}"), t)
        }
        (None, Some(g)) => {
            if !groups.contains(g) {
                return Err(anyhow!(Problem::not_found(format!(
                    "no consumer group `{g}` on {}{}",
                    ctx.config.bootstrap_servers,
                    did_you_mean(g, groups.iter().map(String::as_str))
                ))));
            }
            let t = roles
                .iter()
                .filter(|(_, c)| c.group.as_deref() == Some(g.as_str()))
                .map(|(t, c)| (t.clone(), c.role, size(t)))
                .collect();
            (format!("group {g}"), t)
        }
        _ => {
            return Err(anyhow!(Problem::usage(
                "name what to delete: --route TOPIC (a main topic and its own topics) or --group GROUP (its shared and control topics and its offsets)"
            )))
        }
    };
    // Refuse while anyone reads them: a live member would recreate a
    // topic it owns (or fail), and a route's jobs would be lost with it.
    refuse_while_read(&ctx.config, &what, &targets, group.as_deref()).await?;
    let deletes_group = group.is_some();
    if execute {
        delete(&ctx.config, &targets, group.as_deref()).await?;
    }
    let state = if execute {
        "deleted"
    } else {
        "would be deleted"
    };
    if ctx.json() {
        let topics: Vec<serde_json::Value> = targets
            .iter()
            .map(|(t, role, n)| {
                json!({ "topic": t, "role": role.label(), "partitions": n, "state": state })
            })
            .collect();
        return json(&json!({
            "dry_run": !execute,
            "route": route,
            "group": group,
            "group_offsets": deletes_group.then_some(state),
            "topics": topics,
        }));
    }
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(vec!["topic", "role", "partitions", "state"]);
    for (t, role, n) in &targets {
        table.add_row(vec![
            t.clone(),
            role.label().to_string(),
            n.to_string(),
            state.to_string(),
        ]);
    }
    outln!("{table}")?;
    let partitions: usize = targets.iter().map(|(_, _, n)| n).sum();
    outln!(
        "{what}: {} topic(s), {partitions} partition(s){} {state}",
        targets.len(),
        if deletes_group {
            " and the group's committed offsets"
        } else {
            ""
        }
    )?;
    if !execute {
        outln!("dry run: add --execute to delete")?;
    }
    Ok(())
}

/// Refuses while a live member reads `targets`, or is a member of `group`.
async fn refuse_while_read(
    config: &kjob::KafkaConfig,
    what: &str,
    targets: &[(String, Role, usize)],
    group: Option<&str>,
) -> Result<()> {
    let c = config.clone();
    let described = blocking(move || Ok(describe_groups(&c, None)?)).await?;
    let mut live = live_readers(&described, targets);
    if let Some(g) = group {
        for d in described.iter().filter(|d| d.name == g) {
            for m in &d.members {
                live.push(format!("{}@{} (group {})", m.client_id, m.host, d.name));
            }
        }
        live.sort();
        live.dedup();
    }
    if live.is_empty() {
        return Ok(());
    }
    Err(anyhow!(Problem::refused(format!(
            "{what} has live members: {}; stop them first (a worker that shut down cleanly has left; a killed one leaves when its session times out)",
        live.join(", ")
    ))))
}

/// Deletes `targets` and, when named, `group` (its committed offsets).
async fn delete(
    config: &kjob::KafkaConfig,
    targets: &[(String, Role, usize)],
    group: Option<&str>,
) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = config
        .client_config(&[])
        .create()
        .map_err(|e| kjob::Error::kafka("creating admin client", e))?;
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let names: Vec<&str> = targets.iter().map(|(t, _, _)| t.as_str()).collect();
    if !names.is_empty() {
        for r in admin
            .delete_topics(&names, &opts)
            .await
            .map_err(|e| kjob::Error::kafka("deleting topics", e))?
        {
            if let Err((topic, code)) = r {
                return Err(anyhow!("deleting topic {topic}: {code}"));
            }
        }
    }
    if let Some(g) = group {
        for r in admin
            .delete_groups(&[g], &opts)
            .await
            .map_err(|e| kjob::Error::kafka("deleting the group", e))?
        {
            if let Err((name, code)) = r {
                return Err(anyhow!("deleting group {name}: {code}"));
            }
        }
    }
    Ok(())
}
