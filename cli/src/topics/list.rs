//! `kjob topics list`: every kjob topic of the cluster with its role and
//! its route or group, by the rules the worker names them with
//! ([`kjob::deployment::classify`]), or exactly as a worker's model says
//! (`--model`, from `KJOB_DESCRIBE=json ./worker`).

use std::collections::BTreeMap;

use anyhow::Result;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use serde_json::json;

use super::blocking;
use crate::output::{json, outln};
use crate::Ctx;
use kjob::deployment::{classify, Role};
use kjob_ops::topics::{topic_partitions, TopicInfo};

/// One row of the listing.
struct Row {
    topic: String,
    role: Option<Role>,
    route: Option<String>,
    group: Option<String>,
    delay: Option<String>,
}

impl Row {
    /// What the row belongs to, as the table's `route` column shows it.
    fn owner(&self) -> String {
        match (&self.route, &self.group) {
            (Some(r), _) => r.clone(),
            (None, Some(g)) => format!("group {g}"),
            (None, None) => "-".into(),
        }
    }

    /// Sorts a route's or group's topics together, main first, then by
    /// role and delay.
    fn key(&self) -> (String, Option<Role>, u128, String) {
        let delay = self
            .delay
            .as_deref()
            .and_then(kjob::deployment::delay_duration)
            .map_or(0, |d| d.as_millis());
        let owner = self
            .route
            .clone()
            .or(self.group.clone())
            .unwrap_or_default();
        (owner, self.role, delay, self.topic.clone())
    }
}

pub(super) async fn run(ctx: &Ctx, all: bool, model: Option<std::path::PathBuf>) -> Result<()> {
    let c = ctx.config.clone();
    let infos: BTreeMap<String, TopicInfo> = blocking(move || topic_partitions(&c)).await?;
    let names: Vec<String> = infos.keys().cloned().collect();
    let mut rows: Vec<Row> = match &model {
        Some(path) => {
            let model = crate::model::load(path)?;
            model
                .topics
                .into_iter()
                .map(|t| Row {
                    route: t.route.filter(|_| !t.role.group_wide()),
                    group: t.role.group_wide().then(|| model.group.clone()),
                    topic: t.topic,
                    role: Some(t.role),
                    delay: t.delay,
                })
                .collect()
        }
        None => {
            // The groups tell a group's shared tiers from a route's own;
            // without the right to list them the roles are still named,
            // with shared tiers read as a route's.
            let c = ctx.config.clone();
            let groups = match blocking(move || Ok(kjob_ops::groups::group_names(&c)?)).await {
                Ok(g) => g,
                Err(e) => {
                    eprintln!("kjob: could not list the consumer groups ({e}); a group's shared tiers, control and cron topics may show as a route's or not at all");
                    Vec::new()
                }
            };
            classify(&names, &groups)
                .into_iter()
                .map(|(topic, c)| Row {
                    topic,
                    role: Some(c.role),
                    route: c.route,
                    group: c.group,
                    delay: c.delay,
                })
                .collect()
        }
    };
    rows.sort_by_key(Row::key);
    if all {
        let known: std::collections::BTreeSet<String> =
            rows.iter().map(|r| r.topic.clone()).collect();
        for n in &names {
            if !known.contains(n) && !n.starts_with("__") {
                rows.push(Row {
                    topic: n.clone(),
                    role: None,
                    route: None,
                    group: None,
                    delay: None,
                });
            }
        }
    }
    let partitions = |t: &str| infos.get(t).map(|i| i.partitions);
    if ctx.json() {
        let out: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                json!({
                    "topic": r.topic,
                    "role": r.role.map(|x| x.label()),
                    "route": r.route,
                    "group": r.group,
                    "delay": r.delay,
                    "partitions": partitions(&r.topic),
                    "exists": infos.contains_key(&r.topic),
                })
            })
            .collect();
        return json(&json!({ "topics": out }));
    }
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(vec!["topic", "role", "route", "partitions"]);
    for r in &rows {
        let role = match (r.role, &r.delay) {
            (Some(role), Some(d)) => format!("{} {d}", role.label()),
            (Some(role), None) => role.label().to_string(),
            (None, _) => "-".into(),
        };
        table.add_row(vec![
            r.topic.clone(),
            role,
            r.owner(),
            partitions(&r.topic).map_or_else(|| "missing".into(), |n| n.to_string()),
        ]);
    }
    outln!("{table}")?;
    let routes = rows.iter().filter(|r| r.role == Some(Role::Main)).count();
    let missing = rows
        .iter()
        .filter(|r| !infos.contains_key(&r.topic))
        .count();
    match missing {
        0 => outln!("{} route(s), {} topic(s)", routes, rows.len())?,
        m => outln!(
            "{} route(s), {} topic(s), {m} of them missing on {}",
            routes,
            rows.len(),
            ctx.config.bootstrap_servers
        )?,
    }
    Ok(())
}
