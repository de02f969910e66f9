//! A route's status as data: lag, oldest pending job, rates and the DLQ,
//! read from Kafka alone. `kjob status` prints it; the dashboard samples it.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;

use crate::dlq::store::{DlqReader, Filter};
use crate::lag::{group_lag, pending_heads, PartitionLag};
use kjob::config::KafkaConfig;
use kjob::retry::discover_tiers;
use kjob::topics::list_topics;

/// One topic of a route.
#[derive(Clone, Debug, Serialize)]
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
    /// When the next waiting job of a retry tier is due (epoch ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_due_ms: Option<i64>,
}

/// A route's status.
#[derive(Clone, Debug, Serialize)]
pub struct RouteStatus {
    /// Consumer group.
    pub group: String,
    /// Main topic.
    pub topic: String,
    /// Main topic and tiers.
    pub topics: Vec<TopicStatus>,
    /// Records written to the retry tiers per second (jobs being retried).
    pub retried_per_second: f64,
    /// Records written to the DLQ per second.
    pub dead_lettered_per_second: f64,
    /// Dead letters without an audit entry.
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
    /// Positions of the group on the main topic and its tiers.
    pub rows: Vec<PartitionLag>,
    /// End offset sum of the DLQ (`None` while it does not exist).
    pub dlq_end: Option<i64>,
}

/// The route's topics: the main topic, then its retry tiers (shortest
/// first), found among `all_topics` (see [`kjob::topics::list_topics`]).
pub fn route_topics(main: &str, all_topics: &[String]) -> Vec<String> {
    let mut topics = vec![main.to_string()];
    topics.extend(discover_tiers(main, all_topics).into_iter().map(|(_, t)| t));
    topics
}

/// Reads the positions of `group` on `topics` (see [`route_topics`]) and
/// the end of the DLQ of `topics[0]`. Blocking.
pub fn sample(config: &KafkaConfig, group: &str, topics: &[String]) -> Result<RouteSample> {
    let rows = group_lag(config, group, topics)?;
    let dlq_end = match topics.first() {
        Some(main) => group_lag(config, group, &[kjob::topics::dlq_topic(main)])
            .ok()
            .map(|r| r.iter().map(|p| p.end).sum()),
        None => None,
    };
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

/// The status of a route between two samples: lag and heads from `now`,
/// rates from the difference. Blocking (reads the pending heads and the DLQ).
pub fn status_between(
    config: &KafkaConfig,
    group: &str,
    first: &RouteSample,
    now: &RouteSample,
) -> Result<RouteStatus> {
    let main = now
        .rows
        .first()
        .map(|r| r.topic.clone())
        .unwrap_or_default();
    let mut topics: Vec<String> = Vec::new();
    for r in &now.rows {
        if !topics.contains(&r.topic) {
            topics.push(r.topic.clone());
        }
    }
    let secs = now
        .taken
        .saturating_duration_since(first.taken)
        .as_secs_f64()
        .max(1e-3);
    let rate = |a: i64, b: i64| ((b - a).max(0) as f64) / secs;
    let heads = pending_heads(config, &now.rows)?;
    let dlq_unresolved = DlqReader::new(config, &main)
        .list(&Filter::default(), false)
        .ok()
        .map(|v| v.len());
    let statuses: Vec<TopicStatus> = topics
        .iter()
        .map(|t| {
            let mine: Vec<&PartitionLag> = now.rows.iter().filter(|r| &r.topic == t).collect();
            let my_heads = heads.iter().filter(|h| &h.topic == t);
            TopicStatus {
                topic: t.clone(),
                role: if *t == main {
                    "main".into()
                } else {
                    "retry tier".into()
                },
                partitions: mine.len(),
                lag: mine.iter().map(|r| r.lag()).sum(),
                oldest_pending_seconds: my_heads.clone().map(|h| h.age_seconds).fold(0.0, f64::max),
                handled_per_second: rate(
                    committed_sum(&first.rows, t),
                    committed_sum(&now.rows, t),
                ),
                partition_lag: mine.iter().map(|r| (r.partition, r.lag())).collect(),
                next_due_ms: my_heads.filter_map(|h| h.due_at_ms).min(),
            }
        })
        .collect();
    let retried_per_second = topics
        .iter()
        .filter(|t| **t != main)
        .map(|t| rate(end_sum(&first.rows, t), end_sum(&now.rows, t)))
        .sum();
    let dead_lettered_per_second = match (first.dlq_end, now.dlq_end) {
        (Some(a), Some(b)) => rate(a, b),
        _ => 0.0,
    };
    Ok(RouteStatus {
        group: group.to_string(),
        topic: main,
        topics: statuses,
        retried_per_second,
        dead_lettered_per_second,
        dlq_unresolved,
        #[cfg(feature = "postgres")]
        outbox: None,
    })
}

/// Reads the status; `interval` is how long handled-per-second samples.
pub fn read_status(
    config: &KafkaConfig,
    group: &str,
    main: &str,
    interval: Duration,
) -> Result<RouteStatus> {
    let topics = route_topics(main, &list_topics(config)?);
    let first = sample(config, group, &topics)?;
    std::thread::sleep(interval);
    let now = sample(config, group, &topics)?;
    status_between(config, group, &first, &now)
}
