//! `kjob status`: how a route is doing, read from Kafka alone (no worker
//! needed): per topic of the route (main and retry tiers) the partitions,
//! lag, age of the oldest pending job and handled per second, plus the
//! unresolved DLQ count. `--watch` refreshes; `--json` is for scripts.

use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use clap::Args;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use serde::Serialize;

use kjob::config::KafkaConfig;
use kjob::dlq::store::{DlqReader, Filter};
use kjob::lag::{group_lag, oldest_pending_ages, PartitionLag};
use kjob::retry::discover_tiers;
use kjob::topics::list_topics;

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Consumer group of the workers.
    #[arg(long)]
    group: String,
    /// The route's main topic.
    #[arg(long)]
    topic: String,
    /// Refresh every N seconds until interrupted.
    #[arg(long, value_name = "SECONDS")]
    watch: Option<u64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also show the transactional outbox in this PostgreSQL database
    /// (unsent rows, relay lag, publish rate, relays).
    #[cfg(feature = "postgres")]
    #[arg(long = "database-url")]
    database_url: Option<String>,
    /// The outbox table, with --database-url.
    #[cfg(feature = "postgres")]
    #[arg(long, default_value = kjob::outbox::DEFAULT_TABLE)]
    outbox_table: String,
}

/// One topic of a route.
#[derive(Debug, Serialize)]
pub struct TopicStatus {
    /// Topic name.
    pub topic: String,
    /// `main` or `retry tier`.
    pub role: String,
    /// Partition count.
    pub partitions: usize,
    /// Records not yet committed by the group (for a tier: jobs waiting).
    pub lag: i64,
    /// Age of the oldest pending record, seconds.
    pub oldest_pending_seconds: f64,
    /// Committed records per second over the sampling interval.
    pub handled_per_second: f64,
    /// Per-partition lag.
    pub partition_lag: Vec<(i32, i64)>,
}

/// A route's status.
#[derive(Debug, Serialize)]
pub struct RouteStatus {
    /// Consumer group.
    pub group: String,
    /// Main topic.
    pub topic: String,
    /// Main topic and tiers.
    pub topics: Vec<TopicStatus>,
    /// Dead letters without an audit entry.
    pub dlq_unresolved: Option<usize>,
    /// The outbox feeding the route, when asked for (`--database-url`).
    #[cfg(feature = "postgres")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outbox: Option<kjob::outbox::OutboxStatus>,
}

fn sample(config: &KafkaConfig, group: &str, topics: &[String]) -> Result<Vec<PartitionLag>> {
    Ok(group_lag(config, group, topics)?)
}

fn committed_sum(rows: &[PartitionLag], topic: &str) -> i64 {
    rows.iter()
        .filter(|r| r.topic == topic)
        .map(|r| r.committed.unwrap_or(r.start))
        .sum()
}

/// Reads the status; `interval` is how long handled-per-second samples.
pub fn read_status(
    config: &KafkaConfig,
    group: &str,
    main: &str,
    interval: Duration,
) -> Result<RouteStatus> {
    let mut topics = vec![main.to_string()];
    topics.extend(
        discover_tiers(main, &list_topics(config)?)
            .into_iter()
            .map(|(_, t)| t),
    );
    let first = sample(config, group, &topics)?;
    let started = Instant::now();
    std::thread::sleep(interval);
    let rows = sample(config, group, &topics)?;
    let secs = started.elapsed().as_secs_f64().max(1e-3);
    let ages = oldest_pending_ages(config, &rows)?;
    let dlq_unresolved = DlqReader::new(config, main)
        .list(&Filter::default(), false)
        .ok()
        .map(|v| v.len());
    let statuses = topics
        .iter()
        .map(|t| {
            let mine: Vec<&PartitionLag> = rows.iter().filter(|r| &r.topic == t).collect();
            TopicStatus {
                topic: t.clone(),
                role: if t == main {
                    "main".into()
                } else {
                    "retry tier".into()
                },
                partitions: mine.len(),
                lag: mine.iter().map(|r| r.lag()).sum(),
                oldest_pending_seconds: ages
                    .iter()
                    .filter(|(at, _, _)| at == t)
                    .map(|(_, _, a)| *a)
                    .fold(0.0, f64::max),
                handled_per_second: ((committed_sum(&rows, t) - committed_sum(&first, t)).max(0)
                    as f64)
                    / secs,
                partition_lag: mine.iter().map(|r| (r.partition, r.lag())).collect(),
            }
        })
        .collect();
    Ok(RouteStatus {
        group: group.to_string(),
        topic: main.to_string(),
        topics: statuses,
        dlq_unresolved,
        #[cfg(feature = "postgres")]
        outbox: None,
    })
}

fn print(status: &RouteStatus, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(status)?);
        return Ok(());
    }
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "topic",
        "role",
        "partitions",
        "lag / waiting",
        "oldest pending",
        "handled/s",
    ]);
    for s in &status.topics {
        t.add_row(vec![
            s.topic.clone(),
            s.role.clone(),
            s.partitions.to_string(),
            s.lag.to_string(),
            format!("{:.1}s", s.oldest_pending_seconds),
            format!("{:.1}", s.handled_per_second),
        ]);
    }
    println!("group `{}`, route `{}`", status.group, status.topic);
    println!("{t}");
    match status.dlq_unresolved {
        Some(n) => println!("DLQ `{}.dlq`: {n} unresolved", status.topic),
        None => println!("DLQ `{}.dlq`: none", status.topic),
    }
    #[cfg(feature = "postgres")]
    if let Some(outbox) = &status.outbox {
        super::outbox::print_status(outbox);
    }
    Ok(())
}

pub async fn run(config: &KafkaConfig, args: StatusArgs) -> Result<()> {
    #[cfg(feature = "postgres")]
    let outbox = match &args.database_url {
        Some(url) => Some((
            super::outbox::connect(url).await?,
            kjob::outbox::OutboxTable::new(&args.outbox_table)?,
        )),
        None => None,
    };
    let interval = Duration::from_secs(args.watch.unwrap_or(1).max(1));
    loop {
        let (config, group, topic) = (config.clone(), args.group.clone(), args.topic.clone());
        let kafka =
            tokio::task::spawn_blocking(move || read_status(&config, &group, &topic, interval));
        #[cfg(feature = "postgres")]
        let (kafka, outbox_status) = {
            let read = async {
                match &outbox {
                    Some((client, table)) => {
                        kjob::outbox::read_status(client, table, Some(&args.topic), interval)
                            .await
                            .map(Some)
                    }
                    None => Ok(None),
                }
            };
            tokio::join!(kafka, read)
        };
        #[cfg(not(feature = "postgres"))]
        let kafka = kafka.await;
        #[allow(unused_mut)]
        let mut status = kafka.map_err(|e| anyhow!("background task: {e}"))??;
        #[cfg(feature = "postgres")]
        {
            status.outbox = outbox_status?;
        }
        if args.watch.is_some() && !args.json {
            print!("\x1b[2J\x1b[H");
        }
        print(&status, args.json)?;
        if args.watch.is_none() {
            return Ok(());
        }
    }
}
