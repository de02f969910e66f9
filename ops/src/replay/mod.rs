//! Replay: moving a consumer group's committed offsets, the way Kafka's
//! `kafka-consumer-groups --reset-offsets` does, with kjob's safety rails.
//!
//! Replay *is* an offset reset: the jobs are still in the log, so handling
//! them again means committing an earlier position and letting workers run.
//! The rails:
//!
//! * **plan first**: every target is resolved and validated for every
//!   partition before anything is written; bad input (unknown group or
//!   topic, a datetime in the future, an offset past the end) changes nothing;
//! * **refuse while the group is live**, naming its members, because a
//!   running member would overwrite the reset with its next commit (Kafka's
//!   own tool refuses for the same reason);
//! * **all or nothing**: the new offsets go to the group coordinator in one
//!   commit request;
//! * **shadow groups**: replay into a separate group seeded with the target
//!   offsets, leaving the live group untouched.
//!
//! Everything here is blocking (admin round trips); call it from
//! `spawn_blocking` in async code.

pub mod offsets_file;
mod target;

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use crate::lag::{group_lag, PartitionLag};
use kjob::clock::now_ms;
use kjob::config::KafkaConfig;
use kjob::error::{Error, Result};

pub use target::{plan_rows, target_from, TargetSpec};

/// Where to move the committed offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayTarget {
    /// The first offset at or after this time (epoch ms); the end offset for
    /// partitions with nothing that recent.
    ToDatetime(i64),
    /// `ToDatetime(now - duration)`.
    ByDuration(Duration),
    /// This exact offset on every selected partition.
    ToOffset(i64),
    /// The committed offset plus (or minus) this, clamped to the log.
    ShiftBy(i64),
    /// The log start.
    ToEarliest,
    /// The log end (skip everything pending).
    ToLatest,
}

/// One partition of a replay plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayRow {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// The group's committed offset now (next to read), if any.
    pub committed: Option<i64>,
    /// The offset the plan commits.
    pub target: i64,
    /// Log start offset.
    pub start: i64,
    /// Log end offset.
    pub end: i64,
}

impl ReplayRow {
    /// Jobs that will be handled again: between the target and the current
    /// commit. Negative means the reset skips that many pending jobs.
    pub fn replayed(&self) -> i64 {
        self.committed.unwrap_or(self.end) - self.target
    }
}

/// A live member of a consumer group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Member id assigned by the coordinator.
    pub id: String,
    /// The member's `client.id`.
    pub client_id: String,
    /// The member's host.
    pub host: String,
}

fn admin_consumer(config: &KafkaConfig, group: &str) -> Result<BaseConsumer> {
    config
        .client_config(&[("group.id", group), ("enable.auto.commit", "false")])
        .create()
        .map_err(|e| Error::kafka("creating replay client", e))
}

/// The live members of `group` and whether the coordinator knows the group
/// at all (a group with committed offsets but no members is known, "Empty").
/// Asked in the group's own protocol, so the members of a KIP-848 group are
/// seen too ([`crate::groups`]).
pub fn members(config: &KafkaConfig, group: &str) -> Result<(bool, Vec<Member>)> {
    let Some(g) = crate::groups::describe_groups(config, Some(group))?
        .into_iter()
        .find(|g| g.name == group)
    else {
        return Ok((false, Vec::new()));
    };
    let known = !g.state.eq_ignore_ascii_case("dead");
    let members = g
        .members
        .into_iter()
        .map(|m| Member {
            id: m.id,
            client_id: m.client_id,
            host: m.host,
        })
        .collect();
    Ok((known, members))
}

/// Resolves `target` for every selected partition of `topics` for `group`.
/// Nothing is written. `partitions = None` selects all.
pub fn plan(
    config: &KafkaConfig,
    group: &str,
    topics: &[String],
    partitions: Option<&[i32]>,
    target: ReplayTarget,
) -> Result<Vec<ReplayRow>> {
    let positions = group_lag(config, group, topics)?;
    let (known, _) = members(config, group)?;
    if !known && positions.iter().all(|p| p.committed.is_none()) {
        return Err(Error::UnknownGroup {
            group: group.to_string(),
            topics: topics.to_vec(),
        });
    }
    if let Some(wanted) = partitions {
        for p in wanted {
            if !positions.iter().any(|x| x.partition == *p) {
                return Err(Error::ReplayTarget {
                    reason: format!("partition {p} does not exist in {topics:?}"),
                });
            }
        }
    }
    let selected: Vec<PartitionLag> = positions
        .into_iter()
        .filter(|p| partitions.is_none_or(|w| w.contains(&p.partition)))
        .collect();
    let now = now_ms();
    let at_time = match target {
        ReplayTarget::ToDatetime(ms) => Some(ms),
        ReplayTarget::ByDuration(d) => Some(now - d.as_millis() as i64),
        _ => None,
    };
    if let Some(ms) = at_time {
        if ms > now {
            return Err(Error::ReplayTarget {
                reason: format!(
                    "--to-datetime is {} s in the future; nothing was written after it yet",
                    (ms - now) / 1000
                ),
            });
        }
    }
    let by_time = match at_time {
        Some(ms) => Some(offsets_for_time(config, group, &selected, ms)?),
        None => None,
    };
    let mut rows = Vec::new();
    for (i, p) in selected.iter().enumerate() {
        let target = match target {
            ReplayTarget::ToDatetime(_) | ReplayTarget::ByDuration(_) => by_time
                .as_ref()
                .and_then(|t| t.get(i).copied())
                .unwrap_or(p.end),
            ReplayTarget::ToOffset(o) => {
                if o > p.end {
                    return Err(Error::ReplayTarget {
                        reason: format!(
                            "--to-offset {o} is beyond the end of {}:{} (end offset {})",
                            p.topic, p.partition, p.end
                        ),
                    });
                }
                if o < p.start {
                    return Err(Error::ReplayTarget {
                        reason: format!(
                            "--to-offset {o} is before the log start of {}:{} ({}); retention removed those records",
                            p.topic, p.partition, p.start
                        ),
                    });
                }
                o
            }
            ReplayTarget::ShiftBy(n) => (p.committed.unwrap_or(p.end) + n).clamp(p.start, p.end),
            ReplayTarget::ToEarliest => p.start,
            ReplayTarget::ToLatest => p.end,
        };
        rows.push(ReplayRow {
            topic: p.topic.clone(),
            partition: p.partition,
            committed: p.committed,
            target,
            start: p.start,
            end: p.end,
        });
    }
    Ok(rows)
}

fn offsets_for_time(
    config: &KafkaConfig,
    group: &str,
    parts: &[PartitionLag],
    ms: i64,
) -> Result<Vec<i64>> {
    let c = admin_consumer(config, group)?;
    let mut tpl = TopicPartitionList::new();
    for p in parts {
        tpl.add_partition_offset(&p.topic, p.partition, Offset::Offset(ms))
            .map_err(|e| Error::kafka("building time query", e))?;
    }
    let found = c
        .offsets_for_times(tpl, Duration::from_secs(10))
        .map_err(|e| Error::kafka("looking up offsets for time", e))?;
    Ok(parts
        .iter()
        .map(|p| {
            match found
                .find_partition(&p.topic, p.partition)
                .map(|e| e.offset())
            {
                Some(Offset::Offset(o)) if o >= 0 => o,
                // No record at or after the time: nothing to replay there.
                _ => p.end,
            }
        })
        .collect())
}

/// Commits the plan's targets for `group` in one request, after checking
/// the group has no live members. `group` may differ from the group the plan
/// was made for: that is a shadow replay.
pub fn apply(config: &KafkaConfig, group: &str, rows: &[ReplayRow]) -> Result<()> {
    let (_, live) = members(config, group)?;
    if !live.is_empty() {
        let members: Vec<String> = live
            .iter()
            .map(|m| format!("{} ({} on {})", m.id, m.client_id, m.host))
            .collect();
        return Err(Error::GroupHasMembers {
            group: group.to_string(),
            members,
        });
    }
    let mut tpl = TopicPartitionList::new();
    for r in rows {
        tpl.add_partition_offset(&r.topic, r.partition, Offset::Offset(r.target))
            .map_err(|e| Error::kafka("building the reset", e))?;
    }
    let c = admin_consumer(config, group)?;
    c.commit(&tpl, CommitMode::Sync)
        .map_err(|e| Error::kafka(format!("committing the reset for group `{group}`"), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replayed_counts_jobs_between_target_and_commit() {
        let row = |committed, target| ReplayRow {
            topic: "t".into(),
            partition: 0,
            committed,
            target,
            start: 0,
            end: 100,
        };
        assert_eq!(row(Some(80), 50).replayed(), 30);
        assert_eq!(row(Some(80), 90).replayed(), -10, "skips pending jobs");
        assert_eq!(row(None, 40).replayed(), 60);
    }
}
