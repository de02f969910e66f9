//! `kjob replay`: reset a group's offsets to handle jobs again, with a dry
//! run first. Flags and formats follow `kafka-consumer-groups
//! --reset-offsets`: ISO-8601 durations (`--by-duration PT2H`), datetimes
//! with an offset (`--to-datetime 2026-12-01T09:00:00+01:00`, UTC without
//! one), and its offsets CSV for `--export` (the committed offsets before
//! the reset: the undo file) and `--from-file` (restore them).

use std::path::PathBuf;

use anyhow::{anyhow, Context as _, Result};
use clap::{ArgGroup, Args};
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use serde_json::json;

use crate::output::{json, outln};
use crate::Ctx;
use kjob_ops::replay::offsets_file::{parse, plan_from_file, write_current_offsets};
use kjob_ops::replay::{apply, plan_rows, target_from, ReplayRow, ReplayTarget, TargetSpec};
use kjob_ops::time::format_ms_exact;

#[derive(Args, Debug)]
#[command(group(ArgGroup::new("target").required(true).args(["to_datetime", "by_duration", "to_offset", "shift_by", "to_earliest", "to_latest", "from_file"])))]
pub(crate) struct ReplayArgs {
    /// Consumer group whose offsets move.
    #[arg(long)]
    group: String,
    /// The job route's main topic (not needed with --from-file).
    #[arg(long, required_unless_present = "from_file")]
    topic: Option<String>,
    /// Also reset the route's retry-tier topics.
    #[arg(long)]
    include_tiers: bool,
    /// Only these partitions (comma-separated).
    #[arg(long, value_delimiter = ',')]
    partitions: Option<Vec<i32>>,
    /// First record at or after this time: YYYY-MM-DDTHH:mm:SS[.sss] with an
    /// offset (2026-12-01T09:00:00+01:00, ...Z) or without one (UTC, as
    /// Kafka's tool reads it).
    #[arg(long, value_name = "DATETIME")]
    to_datetime: Option<String>,
    /// That long ago: ISO-8601 as Kafka's tool takes it (PT2H, PT30M,
    /// P1DT3H) or a short form (2h, 30m, 1day).
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
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
    /// Commit the offsets of this CSV file (`topic,partition,offset` lines,
    /// as `--export` and `kafka-consumer-groups --reset-offsets --export`
    /// write them): undoes an earlier replay.
    #[arg(long, value_name = "FILE")]
    from_file: Option<PathBuf>,
    /// Write the group's committed offsets before the reset to this CSV
    /// file (Kafka's format), for `--from-file` to restore them. Written on
    /// a dry run too; with --execute, before anything is reset.
    #[arg(long, value_name = "FILE")]
    export: Option<PathBuf>,
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

fn row_json(r: &ReplayRow) -> serde_json::Value {
    json!({
        "topic": r.topic,
        "partition": r.partition,
        "committed": r.committed,
        "target": r.target,
        "log_start": r.start,
        "log_end": r.end,
        "replayed": r.replayed(),
    })
}

pub(crate) async fn run(ctx: &Ctx, args: ReplayArgs) -> Result<()> {
    let config = ctx.config.clone();
    let json_out = ctx.json();
    let target = match &args.from_file {
        Some(_) => None,
        None => Some(args.target()?),
    };
    tokio::task::spawn_blocking(move || -> Result<()> {
        let into = args.shadow_group.as_deref().unwrap_or(&args.group).to_string();
        let (rows, notes) = match (&args.from_file, target) {
            (Some(path), _) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading --from-file {}", path.display()))?;
                plan_from_file(&config, &into, &parse(&text, &args.group)?)?
            }
            (None, Some(target)) => {
                let topic = args.topic.as_deref().unwrap_or_default();
                let rows = plan_rows(
                    &config,
                    &args.group,
                    topic,
                    args.include_tiers,
                    args.partitions.as_deref(),
                    target,
                )?;
                let notes = match target {
                    ReplayTarget::ToDatetime(ms) => {
                        vec![format!("target time {} (UTC)", format_ms_exact(ms))]
                    }
                    ReplayTarget::ByDuration(d) => vec![format!(
                        "target time {} (UTC)",
                        format_ms_exact(kjob::clock::now_ms() - d.as_millis() as i64)
                    )],
                    _ => Vec::new(),
                };
                (rows, notes)
            }
            (None, None) => return Err(anyhow!("no replay target")),
        };
        // The undo file holds what is committed for the group that moves.
        let exported = match &args.export {
            Some(path) => Some(export_current(&config, path, &args.group, &into, &rows)?),
            None => None,
        };
        let total: i64 = rows.iter().map(|r| r.replayed().max(0)).sum();
        // A tier's records are retries of jobs: the jobs are the main
        // topics' records, and the tiers' are counted beside them.
        let in_tiers = tier_records(&rows, &args.group);
        let jobs = total - in_tiers;
        let counted = match in_tiers {
            0 => format!("{jobs} job(s)"),
            n => format!("{jobs} job(s) ({total} records, {n} of them in retry tiers)"),
        };
        if args.execute {
            apply(&config, &into, &rows)?;
        }
        if json_out {
            return json(&json!({
                "group": args.group,
                "into": into,
                "dry_run": !args.execute,
                "rows": rows.iter().map(row_json).collect::<Vec<_>>(),
                "replayed": total,
                "jobs": jobs,
                "tier_records": in_tiers,
                "notes": notes,
                "export": exported.as_ref().map(|(p, lines, skipped)| json!({
                    "file": p.display().to_string(),
                    "lines": lines,
                    "without_commit": skipped,
                })),
            }));
        }
        outln!("{}", table(&rows))?;
        for n in &notes {
            outln!("{n}")?;
        }
        if let Some((path, lines, skipped)) = &exported {
            let left_out = if *skipped > 0 {
                format!(" ({skipped} partition(s) without a committed offset left out)")
            } else {
                String::new()
            };
            outln!(
                "wrote the committed offsets of group `{into}` ({lines} line(s)) to {}{left_out}; undo with `kjob replay --group {into} --from-file {} --execute`",
                path.display(),
                path.display()
            )?;
        }
        if !args.execute {
            outln!("dry run: {counted} would be handled again by group `{into}`; pass --execute to apply")?;
            return Ok(());
        }
        outln!("reset group `{into}`: {counted} will be handled again")?;
        Ok(())
    })
    .await
    .map_err(|e| anyhow!("background task: {e}"))?
}

/// Writes the positions `into` has committed now for `rows`' partitions to
/// `path` (the undo file): the rows' own when `into` is the replayed
/// group, a shadow group's own positions (before its seed) otherwise.
/// Returns the file, its lines and the partitions left out.
fn export_current(
    config: &kjob::KafkaConfig,
    path: &std::path::Path,
    group: &str,
    into: &str,
    rows: &[ReplayRow],
) -> Result<(PathBuf, usize, usize)> {
    let current: Vec<ReplayRow> = if into == group {
        rows.to_vec()
    } else {
        let mut topics: Vec<String> = rows.iter().map(|r| r.topic.clone()).collect();
        topics.dedup();
        let now = kjob_ops::lag::group_lag(config, into, &topics)?;
        rows.iter()
            .map(|r| ReplayRow {
                committed: now
                    .iter()
                    .find(|p| p.topic == r.topic && p.partition == r.partition)
                    .and_then(|p| p.committed),
                ..r.clone()
            })
            .collect()
    };
    let (lines, skipped) = write_current_offsets(path, &current)?;
    Ok((path.to_path_buf(), lines, skipped))
}

/// How many of the records a plan hands back are in retry tiers (a route's
/// or the group's shared ones), by the worker's naming rules.
fn tier_records(rows: &[kjob_ops::replay::ReplayRow], group: &str) -> i64 {
    let topics: Vec<String> = rows.iter().map(|r| r.topic.clone()).collect();
    let roles = kjob::deployment::classify(&topics, &[group.to_string()]);
    rows.iter()
        .filter(|r| {
            roles.get(&r.topic).is_some_and(|c| {
                matches!(
                    c.role,
                    kjob::deployment::Role::RetryTier | kjob::deployment::Role::SharedRetryTier
                )
            })
        })
        .map(|r| r.replayed().max(0))
        .sum()
}
