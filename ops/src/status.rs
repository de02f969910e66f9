//! A route's status as data: every topic of the route by role (main, retry
//! tiers, delay topics, DLQ and its audit, strict order, the group's cron
//! topics), lag, oldest pending job, rates and the DLQ, read from Kafka
//! alone. `kjob status` prints it; the dashboard samples it.
//!
//! The DLQ part is a bounded read, so a `--watch` refresh costs the same
//! whatever the DLQ holds: the records stored come from its watermarks, the
//! unresolved ones from the last [`DLQ_AUDIT_TAIL`] audit entries (beyond
//! that the count is an upper bound, and says so). A DLQ that could not be
//! read is an error in [`DlqStatus::error`], not a missing DLQ.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;

use crate::dlq::store::DlqReader;
use crate::lag::{group_lag, pending_heads, PartitionLag};
use crate::problem::Problem;
use crate::suggest::did_you_mean;
use crate::topics::{Role, RouteTopic};
use kjob::config::KafkaConfig;
use kjob::topics::{dlq_topic, list_topics, route_of};

/// How many audit entries a status reads at most (from the end of the
/// audit topic) to count the unresolved dead letters.
pub const DLQ_AUDIT_TAIL: i64 = 10_000;

/// One partition's lag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PartitionLagEntry {
    /// Partition number.
    pub partition: i32,
    /// Records not yet committed by the group.
    pub lag: i64,
}

/// One topic of a route.
#[derive(Clone, Debug, Serialize)]
pub struct TopicStatus {
    /// Topic name.
    pub topic: String,
    /// `main`, `retry tier`, `delay`, `dlq`, `dlq audit`, `strict order`,
    /// `cron leader` or `cron state` (see [`Role::label`]).
    pub role: String,
    /// For a retry tier or delay topic, its delay (`30s`, `1d`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay: Option<String>,
    /// Partition count.
    pub partitions: usize,
    /// Records stored (log end minus log start, summed).
    pub records: i64,
    /// Records not yet committed by the group (for a tier or delay topic:
    /// jobs waiting); `None` for topics the group does not consume.
    pub lag: Option<i64>,
    /// Age of the oldest pending record, seconds (consumed topics only).
    pub oldest_pending_seconds: Option<f64>,
    /// Committed records per second over the sampling interval (consumed
    /// topics only).
    pub handled_per_second: Option<f64>,
    /// Per-partition lag (consumed topics only).
    pub partition_lag: Vec<PartitionLagEntry>,
    /// When the next waiting job of a retry tier is due (epoch ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_due_ms: Option<i64>,
    /// On a shared tier or delay bucket, whose `lag` is every sharing
    /// route's: this route's part of it, counted from the records' route
    /// header.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route_waiting: Option<RouteShare>,
}

/// A route's jobs among what waits in a shared tier or delay bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RouteShare {
    /// This route's records among the uncommitted ones read.
    pub jobs: i64,
    /// Whether every uncommitted record was read; `false` when there were
    /// more than [`crate::waiting::ROUTE_COUNT_BOUND`]: `jobs` is then a
    /// lower bound.
    pub exact: bool,
}

impl TopicStatus {
    /// What waits here for this route: its share on a shared topic, the
    /// lag elsewhere.
    pub fn route_lag(&self) -> Option<i64> {
        self.route_waiting.map(|s| s.jobs).or(self.lag)
    }

    /// The lag as operators read it: `120` on a route's own topic,
    /// `120 (40 this route)` on a shared one (`≥40` when only part of it
    /// was read), `-` for a topic the group does not consume.
    pub fn lag_text(&self) -> String {
        match (self.lag, self.route_waiting) {
            (None, _) => "-".into(),
            (Some(l), None) => l.to_string(),
            (Some(l), Some(s)) => {
                let at_least = if s.exact { "" } else { "≥" };
                format!("{l} ({at_least}{} this route)", s.jobs)
            }
        }
    }
}

/// The DLQ of a route, counted with a bounded read.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DlqStatus {
    /// The DLQ topic.
    pub topic: String,
    /// Whether it exists (a worker creates it at start; none means nothing
    /// was ever dead-lettered by a worker allowed to create it).
    pub exists: bool,
    /// Dead letters stored.
    pub stored: Option<i64>,
    /// Stored dead letters without an audit entry.
    pub unresolved: Option<usize>,
    /// Whether `unresolved` is exact (false: more than [`DLQ_AUDIT_TAIL`]
    /// audit entries, so it is an upper bound).
    pub exact: bool,
    /// Why the DLQ could not be read, when it could not.
    pub error: Option<String>,
}

/// A route's status.
#[derive(Clone, Debug, Serialize)]
pub struct RouteStatus {
    /// Consumer group (`None`: the route alone, records but no lag).
    pub group: Option<String>,
    /// Main topic.
    pub topic: String,
    /// Every topic of the route, by role.
    pub topics: Vec<TopicStatus>,
    /// Records written to the retry tiers per second (jobs being retried).
    pub retried_per_second: f64,
    /// Records written to the DLQ per second.
    pub dead_lettered_per_second: f64,
    /// The DLQ.
    pub dlq: DlqStatus,
    /// `dlq.unresolved`, kept for scripts that read it from before `dlq`.
    pub dlq_unresolved: Option<usize>,
    /// The outbox feeding the route, when asked for (`--database-url`).
    #[cfg(feature = "postgres")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outbox: Option<kjob::outbox::OutboxStatus>,
}

/// One reading of a route from Kafka: what rates are computed between.
#[derive(Clone, Debug)]
pub struct RouteSample {
    /// When it was taken.
    pub taken: Instant,
    /// Positions of the group on every topic of the route (main first).
    pub rows: Vec<PartitionLag>,
    /// End offset sum of the DLQ (`None` while it does not exist).
    pub dlq_end: Option<i64>,
}

/// Every topic of the route of `main` among `all_topics` (see
/// [`crate::topics::route_topics`]), main first.
pub fn route_topics(main: &str, group: Option<&str>, all_topics: &[String]) -> Vec<String> {
    crate::topics::route_topics(main, group, all_topics)
        .into_iter()
        .map(|t| t.topic)
        .collect()
}

/// The group a sample without `--group` reads positions as: it never
/// commits, so every committed offset is absent.
const NO_GROUP: &str = "kjob-status-no-group";

/// Reads the positions of `group` on `topics` (see [`route_topics`]) and
/// the end of the DLQ of `topics[0]`. Without a group only the log start
/// and end offsets mean anything. Blocking.
pub fn sample(config: &KafkaConfig, group: Option<&str>, topics: &[String]) -> Result<RouteSample> {
    let rows = group_lag(config, group.unwrap_or(NO_GROUP), topics)?;
    let dlq_end = topics.first().and_then(|main| {
        let dlq = dlq_topic(main);
        rows.iter()
            .any(|r| r.topic == dlq)
            .then(|| rows.iter().filter(|r| r.topic == dlq).map(|p| p.end).sum())
    });
    Ok(RouteSample {
        taken: Instant::now(),
        rows,
        dlq_end,
    })
}

fn committed_sum(rows: &[PartitionLag], topic: &str) -> i64 {
    rows.iter()
        .filter(|r| r.topic == topic)
        .map(|r| r.committed.unwrap_or(r.start))
        .sum()
}

fn end_sum(rows: &[PartitionLag], topic: &str) -> i64 {
    rows.iter()
        .filter(|r| r.topic == topic)
        .map(|r| r.end)
        .sum()
}

/// The DLQ of `main`, counted with a bounded read.
pub fn dlq_status(config: &KafkaConfig, main: &str) -> DlqStatus {
    let mut out = DlqStatus {
        topic: dlq_topic(main),
        ..Default::default()
    };
    match DlqReader::new(config, main).count(DLQ_AUDIT_TAIL) {
        Ok(Some(c)) => {
            out.exists = true;
            out.stored = Some(c.stored);
            out.unresolved = Some(c.unresolved);
            out.exact = c.exact;
        }
        Ok(None) => out.exact = true,
        Err(e) => out.error = Some(e.to_string()),
    }
    out
}

/// The status of a route between two samples: lag and heads from `now`,
/// rates from the difference. Blocking (reads the pending heads and counts
/// the DLQ).
pub fn status_between(
    config: &KafkaConfig,
    group: Option<&str>,
    first: &RouteSample,
    now: &RouteSample,
) -> Result<RouteStatus> {
    let main = now
        .rows
        .first()
        .map(|r| r.topic.clone())
        .unwrap_or_default();
    let mut names: Vec<String> = Vec::new();
    for r in &now.rows {
        if !names.contains(&r.topic) {
            names.push(r.topic.clone());
        }
    }
    let roles: Vec<RouteTopic> = crate::topics::route_topics(&main, group, &names);
    let role_of = |t: &str| roles.iter().find(|r| r.topic == t);
    let secs = now
        .taken
        .saturating_duration_since(first.taken)
        .as_secs_f64()
        .max(1e-3);
    let rate = |a: i64, b: i64| ((b - a).max(0) as f64) / secs;
    let consumed_rows: Vec<PartitionLag> = now
        .rows
        .iter()
        .filter(|r| group.is_some() && role_of(&r.topic).is_some_and(|t| t.role.consumed()))
        .cloned()
        .collect();
    let heads = pending_heads(config, &consumed_rows)?;
    let dlq = dlq_status(config, &main);
    let mut statuses: Vec<TopicStatus> = names
        .iter()
        .map(|t| {
            let mine: Vec<&PartitionLag> = now.rows.iter().filter(|r| &r.topic == t).collect();
            let (role, delay, consumed) = match role_of(t) {
                Some(r) => (
                    r.role.label().to_string(),
                    r.delay.clone(),
                    group.is_some() && r.role.consumed(),
                ),
                None => ("-".to_string(), None, false),
            };
            let my_heads = heads.iter().filter(|h| &h.topic == t);
            TopicStatus {
                topic: t.clone(),
                role,
                delay,
                partitions: mine.len(),
                records: mine.iter().map(|r| (r.end - r.start).max(0)).sum(),
                lag: consumed.then(|| mine.iter().map(|r| r.lag()).sum()),
                oldest_pending_seconds: consumed
                    .then(|| my_heads.clone().map(|h| h.age_seconds).fold(0.0, f64::max)),
                handled_per_second: consumed
                    .then(|| rate(committed_sum(&first.rows, t), committed_sum(&now.rows, t))),
                partition_lag: if consumed {
                    mine.iter()
                        .map(|r| PartitionLagEntry {
                            partition: r.partition,
                            lag: r.lag(),
                        })
                        .collect()
                } else {
                    Vec::new()
                },
                next_due_ms: my_heads.filter_map(|h| h.due_at_ms).min(),
                route_waiting: None,
            }
        })
        .collect();
    // A shared topic's lag is every route's: count this route's part.
    for s in &mut statuses {
        let shared = role_of(&s.topic)
            .is_some_and(|r| matches!(r.role, Role::SharedRetryTier | Role::SharedDelay));
        let Some(lag) = s.lag.filter(|_| shared) else {
            continue;
        };
        let counted = match lag {
            0 => Ok((0, true)),
            _ => {
                let rows: Vec<PartitionLag> = now
                    .rows
                    .iter()
                    .filter(|r| r.topic == s.topic)
                    .cloned()
                    .collect();
                crate::waiting::count_of_route(config, &main, &rows)
            }
        };
        // A topic this user may describe but not read (an ACL) keeps its
        // total lag: the status does not fail for the count.
        s.route_waiting = counted.ok().map(|(jobs, exact)| RouteShare { jobs, exact });
    }
    let retried_per_second = roles
        .iter()
        .filter(|t| t.role == Role::RetryTier)
        .map(|t| rate(end_sum(&first.rows, &t.topic), end_sum(&now.rows, &t.topic)))
        // From +0.0: `sum()` of no floats (a route without tiers) is -0.0,
        // which prints as `-0.0`.
        .fold(0.0, |a, b| a + b);
    let dead_lettered_per_second = match (first.dlq_end, now.dlq_end) {
        (Some(a), Some(b)) => rate(a, b),
        _ => 0.0,
    };
    Ok(RouteStatus {
        group: group.map(str::to_string),
        topic: main,
        topics: statuses,
        retried_per_second,
        dead_lettered_per_second,
        dlq_unresolved: dlq.unresolved,
        dlq,
        #[cfg(feature = "postgres")]
        outbox: None,
    })
}

/// Checks that `main` exists, naming near names when not.
pub fn check_topic(config: &KafkaConfig, main: &str, all_topics: &[String]) -> Result<()> {
    if all_topics.iter().any(|t| t == main) {
        return Ok(());
    }
    let candidates = all_topics
        .iter()
        .map(String::as_str)
        .filter(|t| !t.starts_with("__") && route_of(t) == *t);
    Err(Problem::not_found(format!(
        "topic `{main}` does not exist on {}{}",
        config.bootstrap_servers,
        did_you_mean(main, candidates)
    ))
    .into())
}

/// Checks that `group` is known: it committed on the route (`sample`), or
/// the coordinator knows it (members, or offsets elsewhere). An unknown
/// group is an error naming near names. Blocking.
pub fn check_group(
    config: &KafkaConfig,
    group: &str,
    main: &str,
    sample: &RouteSample,
) -> Result<()> {
    if sample.rows.iter().any(|r| r.committed.is_some()) {
        return Ok(());
    }
    let (known, _) = crate::replay::members(config, group)?;
    if known {
        return Ok(());
    }
    let names = crate::groups::group_names(config).unwrap_or_default();
    Err(Problem::not_found(format!(
        "group `{group}` is unknown: no members and no committed offsets on `{main}` or its tiers{}; `kjob groups list` lists the groups",
        did_you_mean(group, names.iter().map(String::as_str))
    ))
    .into())
}

/// Reads the status; `interval` is how long handled-per-second samples. An
/// unknown topic or group is an error naming it (and near names).
pub fn read_status(
    config: &KafkaConfig,
    group: Option<&str>,
    main: &str,
    interval: Duration,
) -> Result<RouteStatus> {
    let all = list_topics(config)?;
    check_topic(config, main, &all)?;
    let topics = route_topics(main, group, &all);
    let first = sample(config, group, &topics)?;
    if let Some(g) = group {
        check_group(config, g, main, &first)?;
    }
    std::thread::sleep(interval);
    let now = sample(config, group, &topics)?;
    status_between(config, group, &first, &now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(lag: Option<i64>, share: Option<RouteShare>) -> TopicStatus {
        TopicStatus {
            topic: "g.retry.30s".into(),
            role: "shared retry tier".into(),
            delay: Some("30s".into()),
            partitions: 2,
            records: 8,
            lag,
            oldest_pending_seconds: None,
            handled_per_second: None,
            partition_lag: Vec::new(),
            next_due_ms: None,
            route_waiting: share,
        }
    }

    #[test]
    fn a_shared_topic_shows_the_routes_part_of_its_lag() {
        let exact = RouteShare {
            jobs: 3,
            exact: true,
        };
        let partial = RouteShare {
            jobs: 3,
            exact: false,
        };
        assert_eq!(topic(Some(8), Some(exact)).lag_text(), "8 (3 this route)");
        assert_eq!(
            topic(Some(8), Some(partial)).lag_text(),
            "8 (≥3 this route)"
        );
        assert_eq!(topic(Some(8), None).lag_text(), "8");
        assert_eq!(topic(None, None).lag_text(), "-");
        assert_eq!(topic(Some(8), Some(exact)).route_lag(), Some(3));
        assert_eq!(topic(Some(8), None).route_lag(), Some(8));
    }
}
