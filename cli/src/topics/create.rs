//! `kjob topics create`: a route's topics (main, retry tiers, DLQ, and on
//! request its delay topics and strict-order topic), as
//! `kafka-topics --create` makes them; existing ones are left alone. A dry
//! run unless `--execute`.

use std::collections::BTreeMap;

use anyhow::{anyhow, Result};
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use serde_json::json;

use super::{blocking, parse_tiers};
use crate::output::{json, outln};
use crate::Ctx;
use kjob::delay::{delay_topics, CREATED_RETENTION};
use kjob::retry::RetryPolicy;
use kjob::topics::{create_topics_replicated, dlq_topic, order_topic};
use kjob_ops::problem::Problem;
use kjob_ops::topics::{parse_config, Role};

/// `kjob topics create`'s flags.
#[derive(clap::Args, Debug)]
pub(crate) struct CreateArgs {
    /// Main topic (the job's name).
    #[arg(long)]
    topic: String,
    /// Partitions for every topic of the route.
    #[arg(long, default_value_t = 6)]
    partitions: i32,
    /// Replicas per partition (default: the brokers' default.replication.factor).
    #[arg(long, value_name = "N")]
    replication_factor: Option<i32>,
    /// A topic config for every topic created, as `key=value` (repeatable),
    /// e.g. `--config min.insync.replicas=2`.
    #[arg(long = "config", value_name = "KEY=VALUE")]
    configs: Vec<String>,
    /// Retry tiers, comma-separated (`5s,30s,5m,30m`), or `none`.
    #[arg(long, default_value = "5s,30s,5m,30m")]
    tiers: String,
    /// Also the delay topics `<topic>.delay.<bucket>` (1s..1d) that
    /// `enqueue_in` / `kjob enqueue --in` write to, keeping records 7 days.
    #[arg(long)]
    delays: bool,
    /// Also the compacted `<topic>.order` topic a route under
    /// `WorkerBuilder::strict_order` keeps its waiting jobs' order in.
    #[arg(long)]
    strict_order: bool,
    /// Show what would be created (the default).
    #[arg(long, conflicts_with = "execute")]
    dry_run: bool,
    /// Create the topics.
    #[arg(long)]
    execute: bool,
}

/// One topic to create: name, role, and its configs.
struct Wanted {
    topic: String,
    role: Role,
    configs: Vec<(String, String)>,
}

/// `kjob topics create`.
pub(super) async fn run(ctx: &Ctx, args: CreateArgs) -> Result<()> {
    let (partitions, replication_factor, execute) =
        (args.partitions, args.replication_factor, args.execute);
    if partitions < 1 {
        return Err(
            Problem::usage(format!("--partitions must be at least 1, got {partitions}")).into(),
        );
    }
    if let Some(rf) = replication_factor {
        if rf < 1 {
            return Err(Problem::usage(format!(
                "--replication-factor must be at least 1, got {rf}"
            ))
            .into());
        }
    }
    let wanted = wanted(&args)?;
    let names: Vec<String> = wanted.iter().map(|w| w.topic.clone()).collect();
    let (c, n) = (ctx.config.clone(), names.clone());
    let existing = blocking(move || Ok(kjob::topics::partition_counts(&c, &n)?)).await?;
    if execute {
        create_missing(ctx, &wanted, &existing, partitions, replication_factor).await?;
        // Visible to the next command (an `enqueue --in` right after).
        kjob::topics::wait_visible(&ctx.config, &names).await?;
    }
    let rows: Vec<serde_json::Value> = wanted
        .iter()
        .zip(&existing)
        .map(|(w, exists)| {
            let state = match (exists, execute) {
                (Some(_), _) => "exists",
                (None, true) => "created",
                (None, false) => "would be created",
            };
            json!({
                "topic": w.topic,
                "role": w.role.label(),
                "state": state,
                "partitions": exists.map_or(partitions as usize, |n| n),
                "replication_factor": replication_factor,
                "configs": w.configs.iter().cloned().collect::<BTreeMap<_, _>>(),
            })
        })
        .collect();
    if ctx.json() {
        return json(&json!({ "dry_run": !execute, "route": args.topic, "topics": rows }));
    }
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(vec!["topic", "role", "partitions", "configs", "state"]);
    for (w, r) in wanted.iter().zip(&rows) {
        let configs: Vec<String> = w.configs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        table.add_row(vec![
            w.topic.clone(),
            w.role.label().to_string(),
            r["partitions"].to_string(),
            if configs.is_empty() {
                "-".into()
            } else {
                configs.join(",")
            },
            r["state"].as_str().unwrap_or_default().to_string(),
        ]);
    }
    outln!("{table}")?;
    let missing = existing.iter().filter(|e| e.is_none()).count();
    if execute {
        outln!(
            "created {missing} topic(s); {} existed",
            existing.len() - missing
        )?;
    } else {
        outln!(
            "dry run: {missing} topic(s) would be created (replication factor {}); pass --execute to create them",
            replication_factor.map_or("the brokers' default".to_string(), |r| r.to_string())
        )?;
    }
    Ok(())
}

/// The route's topics the flags ask for, each with its configs (the
/// role's own, then `--config`).
fn wanted(args: &CreateArgs) -> Result<Vec<Wanted>> {
    let topic = &args.topic;
    let extra = args
        .configs
        .iter()
        .map(|c| parse_config(c))
        .collect::<Result<Vec<_>>>()?;
    let delays = parse_tiers(&args.tiers)?;
    let with = |own: &[(&str, String)]| -> Vec<(String, String)> {
        let mut all: BTreeMap<String, String> = own
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        for (k, v) in &extra {
            all.insert(k.clone(), v.clone());
        }
        all.into_iter().collect()
    };
    let mut wanted = vec![Wanted {
        topic: topic.clone(),
        role: Role::Main,
        configs: with(&[]),
    }];
    for t in RetryPolicy::tiers(delays).tier_topics(topic) {
        wanted.push(Wanted {
            topic: t,
            role: Role::RetryTier,
            configs: with(&[]),
        });
    }
    if args.delays {
        let retention = CREATED_RETENTION.as_millis().to_string();
        for t in delay_topics(topic) {
            wanted.push(Wanted {
                topic: t,
                role: Role::Delay,
                configs: with(&[("retention.ms", retention.clone())]),
            });
        }
    }
    wanted.push(Wanted {
        topic: dlq_topic(topic),
        role: Role::Dlq,
        configs: with(&[]),
    });
    if args.strict_order {
        wanted.push(Wanted {
            topic: order_topic(topic),
            role: Role::StrictOrder,
            configs: with(&[("cleanup.policy", "compact".to_string())]),
        });
    }
    Ok(wanted)
}

/// Creates the wanted topics that do not exist; a config or count the
/// brokers refuse is a usage error.
async fn create_missing(
    ctx: &Ctx,
    wanted: &[Wanted],
    existing: &[Option<usize>],
    partitions: i32,
    replication_factor: Option<i32>,
) -> Result<()> {
    for (w, exists) in wanted.iter().zip(existing) {
        if exists.is_some() {
            continue;
        }
        let cfg: Vec<(&str, &str)> = w
            .configs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        create_topics_replicated(
            &ctx.config,
            &[(w.topic.clone(), partitions)],
            replication_factor,
            &cfg,
        )
        .await
        .map_err(|e| match &e {
            kjob::Error::CreateTopic { reason, .. }
                if reason.contains("InvalidConfig")
                    || reason.contains("InvalidReplicationFactor")
                    || reason.contains("InvalidPartitions") =>
            {
                anyhow!(Problem::usage(e.to_string()))
            }
            _ => anyhow!(e),
        })?;
    }
    Ok(())
}
