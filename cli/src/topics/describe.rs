//! `kjob topics describe`: a route's topics, as `kafka-topics --describe`
//! shows them (partitions, replication factor, configs, then leaders and
//! replicas per partition), each with its role in the route.

use anyhow::Result;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use serde_json::json;

use super::blocking;
use crate::output::{json, outln};
use crate::Ctx;
use kjob_ops::problem::Problem;
use kjob_ops::suggest::did_you_mean;
use kjob_ops::topics::{route_topics, topic_configs, topic_partitions};

/// `kjob topics describe --topic <main>`.
pub(super) async fn run(ctx: &Ctx, topic: &str) -> Result<()> {
    let c = ctx.config.clone();
    let infos = blocking(move || topic_partitions(&c)).await?;
    let names: Vec<String> = infos.keys().cloned().collect();
    if !infos.contains_key(topic) {
        let candidates = names
            .iter()
            .map(String::as_str)
            .filter(|t| !t.starts_with("__"));
        return Err(Problem::not_found(format!(
            "topic `{topic}` does not exist on {}{}",
            ctx.config.bootstrap_servers,
            did_you_mean(topic, candidates)
        ))
        .into());
    }
    let members = route_topics(topic, None, &names);
    let topics: Vec<String> = members.iter().map(|t| t.topic.clone()).collect();
    let configs = topic_configs(&ctx.config, &topics)
        .await
        .unwrap_or_default();
    let mut described = Vec::new();
    for (i, t) in members.iter().enumerate() {
        if let Some(info) = infos.get(&t.topic) {
            let mut info = info.clone();
            info.configs = configs.get(i).cloned().unwrap_or_default();
            described.push((t, info));
        }
    }
    if ctx.json() {
        let out: Vec<serde_json::Value> = described
            .iter()
            .map(|(t, info)| {
                json!({
                    "topic": info.topic,
                    "role": t.role.label(),
                    "delay": t.delay,
                    "partitions": info.partitions,
                    "replication_factor": info.replication_factor,
                    "configs": info.configs,
                    "partition_details": info.partition_details,
                })
            })
            .collect();
        return json(&json!({ "route": topic, "topics": out }));
    }
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(vec![
        "topic",
        "role",
        "partitions",
        "replication factor",
        "configs",
    ]);
    for (t, info) in &described {
        let role = match &t.delay {
            Some(d) => format!("{} {d}", t.role.label()),
            None => t.role.label().to_string(),
        };
        let configs: Vec<String> = info
            .configs
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        table.add_row(vec![
            info.topic.clone(),
            role,
            info.partitions.to_string(),
            info.replication_factor.to_string(),
            if configs.is_empty() {
                "-".into()
            } else {
                configs.join(",")
            },
        ]);
    }
    outln!("{table}")?;
    let mut parts = Table::new();
    parts.load_preset(UTF8_FULL_CONDENSED);
    parts.set_header(vec!["topic", "partition", "leader", "replicas", "isr"]);
    let ids = |v: &[i32]| v.iter().map(i32::to_string).collect::<Vec<_>>().join(",");
    for (_, info) in &described {
        for p in &info.partition_details {
            parts.add_row(vec![
                info.topic.clone(),
                p.partition.to_string(),
                p.leader.to_string(),
                ids(&p.replicas),
                ids(&p.isr),
            ]);
        }
    }
    outln!("{parts}")?;
    Ok(())
}
