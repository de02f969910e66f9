//! Replay plans as data: the target an operator asked for, checked, and
//! the dry-run rows. `kjob replay` prints them; the dashboard renders them.

use anyhow::Result;

use super::{plan, ReplayRow, ReplayTarget};
use crate::problem::Problem;
use crate::time::{parse_datetime_flag, parse_duration_flag};
use kjob::config::KafkaConfig;
use kjob::retry::discover_tiers;
use kjob::topics::list_topics;

/// The replay target as the CLI's flags give it (at most one set; none
/// means `--to-latest`), shared with the dashboard's replay form.
#[derive(Debug, Default)]
pub struct TargetSpec<'a> {
    /// `--to-datetime`.
    pub to_datetime: Option<&'a str>,
    /// `--by-duration`.
    pub by_duration: Option<&'a str>,
    /// `--to-offset`.
    pub to_offset: Option<i64>,
    /// `--shift-by`.
    pub shift_by: Option<i64>,
    /// `--to-earliest`.
    pub to_earliest: bool,
}

/// Validates and converts a [`TargetSpec`]; errors name the flag. The
/// formats are Kafka's (see [`crate::time`]): `--by-duration PT2H`,
/// `--to-datetime 2026-12-01T09:00:00+01:00`. A negative duration (Java's
/// `Duration.parse` reads `-PT30M`) points into the future, where nothing
/// was written yet; Kafka's tool resets to the log end there, kjob refuses
/// and names `--to-latest`, which says so.
pub fn target_from(spec: &TargetSpec<'_>) -> Result<ReplayTarget> {
    if let Some(t) = spec.to_datetime {
        return Ok(ReplayTarget::ToDatetime(parse_datetime_flag(
            "--to-datetime",
            t,
        )?));
    }
    if let Some(d) = spec.by_duration {
        let ms = parse_duration_flag("--by-duration", d)?;
        if ms < 0 {
            return Err(Problem::usage(format!(
                "--by-duration `{d}` is negative: it points {} into the future, where nothing was written yet; to skip everything pending use --to-latest",
                humantime::format_duration(std::time::Duration::from_millis(ms.unsigned_abs()))
            ))
            .into());
        }
        return Ok(ReplayTarget::ByDuration(std::time::Duration::from_millis(
            ms.unsigned_abs(),
        )));
    }
    if let Some(o) = spec.to_offset {
        if o < 0 {
            return Err(Problem::usage(format!("--to-offset must be 0 or more, got {o}")).into());
        }
        return Ok(ReplayTarget::ToOffset(o));
    }
    if let Some(n) = spec.shift_by {
        return Ok(ReplayTarget::ShiftBy(n));
    }
    if spec.to_earliest {
        return Ok(ReplayTarget::ToEarliest);
    }
    Ok(ReplayTarget::ToLatest)
}

/// The replay plan (the dry-run table's rows) for `group` on `topic`, and
/// on its retry tiers with `include_tiers`. Nothing is written. Blocking.
pub fn plan_rows(
    config: &KafkaConfig,
    group: &str,
    topic: &str,
    include_tiers: bool,
    partitions: Option<&[i32]>,
    target: ReplayTarget,
) -> Result<Vec<ReplayRow>> {
    let mut topics = vec![topic.to_string()];
    if include_tiers {
        topics.extend(
            discover_tiers(topic, &list_topics(config)?)
                .into_iter()
                .map(|(_, t)| t),
        );
    }
    Ok(plan(config, group, &topics, partitions, target)?)
}
