//! `kjob topics list | describe | create | delete | plan`: the topics of
//! kjob's routes and groups, as `kafka-topics --list | --describe |
//! --create | --delete` shows, makes and removes them, by role (main, retry
//! tiers, delay topics, DLQ and its audit, strict order, and a group's
//! shared, control and cron topics). `create` and `delete` are dry runs
//! unless `--execute` is given.

use std::collections::BTreeMap;

use anyhow::{anyhow, Result};
use clap::Subcommand;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use serde_json::json;

mod create;
mod delete;
mod describe;
mod list;

use crate::output::{json, outln};
use crate::Ctx;
use kjob::retry::parse_delay;
use kjob_ops::problem::Problem;
use kjob_ops::suggest::did_you_mean;
use kjob_ops::topics::{topic_partitions, PlanAction};

#[derive(Subcommand, Debug)]
pub(crate) enum TopicsCommand {
    /// Every route (a main topic with its tiers, delay topics, DLQ, ...), one row per topic.
    List {
        /// Also topics that belong to no route (internal `__` topics stay hidden).
        #[arg(long)]
        all: bool,
        /// A worker's model (`KJOB_DESCRIBE=json ./worker > model.json`): list exactly
        /// its topics, with those missing on the cluster marked.
        #[arg(long, value_name = "FILE")]
        model: Option<std::path::PathBuf>,
    },
    /// A route's topics: partitions, replication factor, configs, leaders and replicas.
    Describe {
        /// The route's main topic.
        #[arg(long)]
        topic: String,
    },
    /// What a worker's routes need, topic by topic and partition by partition, today and
    /// after: what to create, and what to delete once drained. Reads only.
    Plan {
        /// A route's main topic (repeatable: every route of the worker).
        #[arg(long = "topic", required = true)]
        topics: Vec<String>,
        /// Retry tiers of every route, comma-separated, or `none`.
        #[arg(long, default_value = "5s,30s,5m,30m")]
        tiers: String,
        /// A route that takes delayed jobs (`WorkerBuilder::delayed_jobs_on`; repeatable).
        #[arg(long = "delays-on", value_name = "TOPIC")]
        delays_on: Vec<String>,
        /// A route under `WorkerBuilder::strict_order` (repeatable).
        #[arg(long = "strict-order-on", value_name = "TOPIC")]
        strict_on: Vec<String>,
        /// Partitions of a route whose main topic does not exist yet.
        #[arg(long, default_value_t = 6)]
        partitions: i32,
        /// The routes' consumer group: a topic to let go of is drained when the group has
        /// handled everything in it (without: when it holds no records).
        #[arg(long)]
        group: Option<String>,
        /// The routes share retry tiers named after --group (`<group>.retry.<delay>`,
        /// `WorkerBuilder::shared_retry_tiers`); --strict-order-on routes keep their own.
        #[arg(long, requires = "group")]
        shared_tiers: bool,
        /// With --shared-tiers: the --delays-on routes share delay buckets too
        /// (`<group>.delay.<bucket>`, `SharedTiers::delay_buckets`).
        #[arg(long, requires = "shared_tiers")]
        shared_delays: bool,
        /// Partitions of the shared tiers and buckets to create
        /// (`SharedTiers::partitions`; default: the widest sharing main topic's).
        #[arg(long, value_name = "N", requires = "shared_tiers")]
        shared_partitions: Option<usize>,
        /// Partitions of the DLQs to create (`WorkerBuilder::dlq_partitions`; default: the
        /// main topic's).
        #[arg(long, value_name = "N")]
        dlq_partitions: Option<usize>,
    },
    /// Create a route: `<topic>`, `<topic>.retry.<delay>` per tier and `<topic>.dlq`
    /// (existing ones are left alone). Dry run unless --execute.
    Create(create::CreateArgs),
    /// Delete a route's topics or a group's own topics and offsets, refused while a member is
    /// live (dry run unless --execute).
    Delete {
        /// A route: its main topic and its own tiers, delay topics, DLQ, audit trail, order topic.
        #[arg(long, conflicts_with = "group", required_unless_present = "group")]
        route: Option<String>,
        /// A group: its shared tiers and buckets, control and cron topics, and its offsets.
        #[arg(long)]
        group: Option<String>,
        /// Show what would be deleted (the default).
        #[arg(long, conflicts_with = "execute")]
        dry_run: bool,
        /// Delete them.
        #[arg(long)]
        execute: bool,
    },
}

/// `--tiers`: comma-separated delays, or `none`.
fn parse_tiers(tiers: &str) -> Result<Vec<std::time::Duration>> {
    if tiers.trim().eq_ignore_ascii_case("none") {
        return Ok(Vec::new());
    }
    tiers
        .split(',')
        .filter(|t| !t.trim().is_empty())
        .map(|t| {
            parse_delay(t.trim()).ok_or_else(|| {
                anyhow!(Problem::usage(format!(
                    "--tiers: `{t}` is not a delay like 5s, 30s, 5m or 1h (or `none`)"
                )))
            })
        })
        .collect()
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| anyhow!("background task: {e}"))?
}

pub(crate) async fn run(ctx: &Ctx, cmd: TopicsCommand) -> Result<()> {
    match cmd {
        TopicsCommand::List { all, model } => list::run(ctx, all, model).await,
        TopicsCommand::Delete {
            route,
            group,
            dry_run: _,
            execute,
        } => delete::run(ctx, route, group, execute).await,
        TopicsCommand::Describe { topic } => describe::run(ctx, &topic).await,
        TopicsCommand::Plan {
            topics,
            tiers,
            delays_on,
            strict_on,
            partitions,
            group,
            shared_tiers,
            shared_delays,
            shared_partitions,
            dlq_partitions,
        } => {
            let routes = PlanRoutes {
                mains: topics,
                delays_on,
                strict_on,
                shared_tiers,
                shared_delays,
                shared_partitions,
                dlq_partitions,
            };
            plan(ctx, routes, &tiers, partitions, group).await
        }
        TopicsCommand::Create(args) => create::run(ctx, args).await,
    }
}

/// The routes `kjob topics plan` plans for, as its flags name them.
struct PlanRoutes {
    mains: Vec<String>,
    delays_on: Vec<String>,
    strict_on: Vec<String>,
    shared_tiers: bool,
    shared_delays: bool,
    shared_partitions: Option<usize>,
    dlq_partitions: Option<usize>,
}

/// `kjob topics plan`: see [`kjob_ops::topics::plan`].
async fn plan(
    ctx: &Ctx,
    routes: PlanRoutes,
    tiers: &str,
    partitions: i32,
    group: Option<String>,
) -> Result<()> {
    check_plan(&routes, partitions)?;
    let PlanRoutes {
        mains,
        delays_on,
        strict_on,
        shared_tiers,
        shared_delays,
        shared_partitions,
        dlq_partitions,
    } = routes;
    let delays = parse_tiers(tiers)?;
    let config = ctx.config.clone();
    let cluster = blocking(move || topic_partitions(&config)).await?;
    let counts: BTreeMap<String, usize> = cluster
        .iter()
        .map(|(t, i)| (t.clone(), i.partitions))
        .collect();
    let replication = |t: &str| cluster.get(t).map_or(0, |i| i.replication_factor);
    let mut rows = Vec::new();
    let layouts: Vec<kjob_ops::topics::RouteLayout> = mains
        .iter()
        .map(|main| kjob_ops::topics::RouteLayout {
            main: main.clone(),
            tiers: delays.clone(),
            delays: delays_on.contains(main),
            strict: strict_on.contains(main),
            shared: shared_tiers && !strict_on.contains(main),
            shared_delays: shared_delays && !strict_on.contains(main),
            dlq_partitions,
        })
        .collect();
    for layout in &layouts {
        rows.extend(kjob_ops::topics::plan(layout, &counts, partitions as usize));
    }
    if let Some(g) = group.as_deref().filter(|_| shared_tiers) {
        rows.extend(kjob_ops::topics::plan_shared(
            g,
            &layouts,
            &counts,
            partitions as usize,
            shared_partitions,
        ));
    }
    // What is left in each topic to let go of: the group's lag, or the
    // records stored.
    let going: Vec<String> = rows
        .iter()
        .filter(|r| r.action == PlanAction::DeleteOnceDrained)
        .map(|r| r.topic.clone())
        .collect();
    let left = records_left(ctx, &going, group.as_deref()).await?;
    let sum = |pick: &dyn Fn(&kjob_ops::topics::PlanRow) -> Option<usize>| -> (usize, usize) {
        rows.iter()
            .filter_map(pick)
            .fold((0, 0), |(t, p), n| (t + 1, p + n))
    };
    let (today_topics, today_parts) = sum(&|r| r.today);
    let (after_topics, after_parts) = sum(&|r| r.after);
    let rf = rows
        .iter()
        .map(|r| replication(&r.topic))
        .max()
        .unwrap_or(0)
        .max(1);
    if ctx.json() {
        let out: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                json!({
                    "topic": r.topic, "role": r.role, "today": r.today, "after": r.after,
                    "action": r.action, "records_left": left.get(&r.topic),
                })
            })
            .collect();
        return json(&json!({
            "topics": out,
            "today": { "topics": today_topics, "partitions": today_parts },
            "after": { "topics": after_topics, "partitions": after_parts },
            "replication_factor": rf,
        }));
    }
    outln!("{}", plan_table(&rows, &left, group.is_some()))?;
    outln!(
        "today: {today_topics} topics, {today_parts} partitions ({} replicas at RF {rf}); after: {after_topics} topics, {after_parts} partitions ({} replicas)",
        today_parts * rf,
        after_parts * rf
    )?;
    if !going.is_empty() {
        outln!("a worker with this layout stops reading the topics to delete: run it only once they are drained (or keep the old worker until then)")?;
    }
    Ok(())
}

/// `kjob topics plan`'s flags that no type checks: counts of at least 1,
/// and `--delays-on` / `--strict-order-on` naming `--topic` routes.
fn check_plan(routes: &PlanRoutes, partitions: i32) -> Result<()> {
    let PlanRoutes {
        mains,
        delays_on,
        strict_on,
        shared_partitions,
        dlq_partitions,
        ..
    } = routes;
    let (dlq_partitions, shared_partitions) = (*dlq_partitions, *shared_partitions);
    if dlq_partitions == Some(0) {
        return Err(Problem::usage("--dlq-partitions must be at least 1, got 0").into());
    }
    if shared_partitions == Some(0) {
        return Err(Problem::usage("--shared-partitions must be at least 1, got 0").into());
    }
    if partitions < 1 {
        return Err(
            Problem::usage(format!("--partitions must be at least 1, got {partitions}")).into(),
        );
    }
    for (flag, named) in [
        ("--delays-on", &delays_on),
        ("--strict-order-on", &strict_on),
    ] {
        if let Some(t) = named.iter().find(|t| !mains.contains(t)) {
            return Err(Problem::usage(format!(
                "{flag} `{t}` is not one of the --topic routes{}",
                did_you_mean(t, mains.iter().map(String::as_str))
            ))
            .into());
        }
    }
    Ok(())
}

/// What is left in each topic to let go of (`going`): `group`'s lag, or
/// without a group the records stored.
async fn records_left(
    ctx: &Ctx,
    going: &[String],
    group: Option<&str>,
) -> Result<BTreeMap<String, i64>> {
    if going.is_empty() {
        return Ok(BTreeMap::new());
    }
    let (config, g) = (
        ctx.config.clone(),
        group.unwrap_or("kjob-cli-plan").to_string(),
    );
    let names = going.to_vec();
    let lag = blocking(move || Ok(kjob_ops::lag::group_lag(&config, &g, &names)?)).await?;
    let mut m = BTreeMap::new();
    for p in lag {
        let n = if group.is_some() {
            p.lag()
        } else {
            p.end - p.start
        };
        *m.entry(p.topic).or_insert(0) += n.max(0);
    }
    Ok(m)
}

/// The plan as a table: each topic's partitions today and after, and what
/// to do with it (how much is left in a topic to delete).
fn plan_table(
    rows: &[kjob_ops::topics::PlanRow],
    left: &BTreeMap<String, i64>,
    by_group: bool,
) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header([
        "topic",
        "role",
        "partitions today",
        "partitions after",
        "action",
    ]);
    let dash = |n: Option<usize>| n.map_or("-".to_string(), |n| n.to_string());
    for r in rows {
        let action = match (r.action, left.get(&r.topic)) {
            (PlanAction::DeleteOnceDrained, Some(0)) => "delete: drained".to_string(),
            (PlanAction::DeleteOnceDrained, Some(n)) => {
                let what = if by_group {
                    "not yet handled"
                } else {
                    "records stored"
                };
                format!("delete once drained ({n} {what})")
            }
            (a, _) => a.label().to_string(),
        };
        table.add_row([
            r.topic.clone(),
            r.role.label().to_string(),
            dash(r.today),
            dash(r.after),
            action,
        ]);
    }
    table
}
