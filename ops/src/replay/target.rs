//! Replay plans as data: the target an operator asked for, checked, and
//! the dry-run rows. `kjob replay` prints them; the dashboard renders them.

use anyhow::{anyhow, bail, Result};

use super::{plan, ReplayRow, ReplayTarget};
use crate::time::parse_time;
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

/// Validates and converts a [`TargetSpec`]; errors name the flag.
pub fn target_from(spec: &TargetSpec<'_>) -> Result<ReplayTarget> {
    if let Some(t) = spec.to_datetime {
        return Ok(ReplayTarget::ToDatetime(parse_absolute(t)?));
    }
    if let Some(d) = spec.by_duration {
        let d = humantime::parse_duration(d)
            .map_err(|e| anyhow!("--by-duration `{d}` is not a duration like 2h or 30m: {e}"))?;
        return Ok(ReplayTarget::ByDuration(d));
    }
    if let Some(o) = spec.to_offset {
        if o < 0 {
            bail!("--to-offset must be 0 or more, got {o}");
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

fn parse_absolute(s: &str) -> Result<i64> {
    if humantime::parse_rfc3339_weak(s).is_err() {
        bail!("--to-datetime `{s}` is not a date-time like 2026-11-29T10:00:00");
    }
    parse_time("--to-datetime", s)
}
