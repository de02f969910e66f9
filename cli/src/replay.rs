//! `kjob replay`: reset a group's offsets to handle jobs again, with a dry
//! run first. Flags follow `kafka-consumer-groups --reset-offsets`.

use anyhow::{anyhow, Result};
use clap::{ArgGroup, Args};
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

use kjob::config::KafkaConfig;
use kjob_ops::replay::{apply, plan_rows, target_from, ReplayRow, ReplayTarget, TargetSpec};

#[derive(Args, Debug)]
#[command(group(ArgGroup::new("target").required(true).args(["to_datetime", "by_duration", "to_offset", "shift_by", "to_earliest", "to_latest"])))]
pub struct ReplayArgs {
    /// Consumer group whose offsets move.
    #[arg(long)]
    group: String,
    /// The job route's main topic.
    #[arg(long)]
    topic: String,
    /// Also reset the route's retry-tier topics.
    #[arg(long)]
    include_tiers: bool,
    /// Only these partitions (comma-separated).
    #[arg(long, value_delimiter = ',')]
    partitions: Option<Vec<i32>>,
    /// First record at or after this time (2026-11-29T10:00:00, UTC unless an offset is given).
    #[arg(long)]
    to_datetime: Option<String>,
    /// That long ago (e.g. 2h, 30m, 1day).
    #[arg(long)]
    by_duration: Option<String>,
    /// An exact offset on every selected partition.
    #[arg(long, allow_negative_numbers = true)]
    to_offset: Option<i64>,
    /// Move by N (negative = back), clamped to the log.
    #[arg(long, allow_negative_numbers = true)]
    shift_by: Option<i64>,
    /// The log start.
    #[arg(long)]
    to_earliest: bool,
    /// The log end.
    #[arg(long)]
    to_latest: bool,
    /// Replay into this group (seeded with the targets); the live group is untouched.
    #[arg(long)]
    shadow_group: Option<String>,
    /// Show the plan only (the default).
    #[arg(long, conflicts_with = "execute")]
    dry_run: bool,
    /// Apply the plan.
    #[arg(long)]
    execute: bool,
}

impl ReplayArgs {
    fn target(&self) -> Result<ReplayTarget> {
        target_from(&TargetSpec {
            to_datetime: self.to_datetime.as_deref(),
            by_duration: self.by_duration.as_deref(),
            to_offset: self.to_offset,
            shift_by: self.shift_by,
            to_earliest: self.to_earliest,
        })
    }
}

fn table(rows: &[ReplayRow]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "topic",
        "partition",
        "committed now",
        "target",
        "log end",
        "jobs handled again",
    ]);
    for r in rows {
        t.add_row(vec![
            r.topic.clone(),
            r.partition.to_string(),
            r.committed.map_or("-".into(), |c| c.to_string()),
            r.target.to_string(),
            r.end.to_string(),
            r.replayed().to_string(),
        ]);
    }
    t
}

pub async fn run(config: &KafkaConfig, args: ReplayArgs) -> Result<()> {
    let target = args.target()?;
    let config = config.clone();
    tokio::task::spawn_blocking(move || -> Result<()> {
        let rows = plan_rows(
            &config,
            &args.group,
            &args.topic,
            args.include_tiers,
            args.partitions.as_deref(),
            target,
        )?;
        println!("{}", table(&rows));
        let total: i64 = rows.iter().map(|r| r.replayed().max(0)).sum();
        let into = args.shadow_group.as_deref().unwrap_or(&args.group);
        if !args.execute {
            println!("dry run: {total} job(s) would be handled again by group `{into}`; pass --execute to apply");
            return Ok(());
        }
        apply(&config, into, &rows)?;
        println!("reset group `{into}`: {total} job(s) will be handled again");
        Ok(())
    })
    .await
    .map_err(|e| anyhow!("background task: {e}"))?
}
