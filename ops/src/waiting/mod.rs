//! What is waiting in a route's retry tiers and delay topics: the records
//! a group has not committed yet, with when each is due.
//!
//! A tier or delay topic holds records of one delay, so its arrival order
//! is its due order, and what a group still has to handle there starts at
//! its committed offset. The read is bounded: at most `per_partition`
//! records from the committed offset of each partition (the ones due
//! first), with the count of the rest. It uses a manual assignment, never
//! the group itself, so it commits nothing and joins nothing. Cancelling
//! one of these jobs or moving it to "now" is [`act()`]'s.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use kjob::config::KafkaConfig;
use kjob::error::{Error, Result};
use kjob::headers::JobHeaders;

mod act;
pub use act::{act, Acted, WaitingAction, WaitingAt, MOVED_FROM};

use crate::lag::PartitionLag;
use crate::topics::{route_topics, Role};

/// The most records read per partition, whatever a caller asks.
pub const MAX_PER_PARTITION: usize = 500;

/// One record waiting in a tier or delay topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitingRecord {
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// The record key, as text (lossy).
    pub key: Option<String>,
    /// Its headers, parsed.
    pub headers: JobHeaders,
    /// When it was written (epoch ms).
    pub timestamp_ms: Option<i64>,
}

impl WaitingRecord {
    /// When the job runs: a delayed job's `kjob-run-at`, else a retry's
    /// `kjob-due-at`.
    pub fn due_ms(&self) -> Option<i64> {
        self.headers.run_at_ms.or(self.headers.due_at_ms)
    }

    /// Whether it is a job of route `main`: in a shared tier or bucket, the
    /// route it names (`kjob-route`, else where it was first consumed).
    pub fn of_route(&self, main: &str) -> bool {
        match self.headers.route() {
            Some(route) => route == main.as_bytes(),
            None => self.headers.original_topic.as_deref() == Some(main),
        }
    }
}

/// The topics of a route where jobs wait for their time: its retry tiers
/// and delay topics, its own or the group's shared ones.
pub(crate) fn holds(role: &Role) -> bool {
    matches!(
        role,
        Role::RetryTier | Role::Delay | Role::SharedRetryTier | Role::SharedDelay
    )
}

/// One partition of a waiting topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitingPartition {
    /// Its number.
    pub partition: i32,
    /// The group's committed offset, if any.
    pub committed: Option<i64>,
    /// The log end offset.
    pub end: i64,
    /// Records the group has not committed.
    pub waiting: i64,
    /// The first of them (at most the bound asked for), in offset order.
    pub records: Vec<WaitingRecord>,
}

/// A retry tier or delay topic of a route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitingTopic {
    /// The topic.
    pub topic: String,
    /// [`Role::RetryTier`], [`Role::Delay`] or a shared one
    /// ([`Role::SharedRetryTier`], [`Role::SharedDelay`]: its counts are
    /// every route's, its records this route's).
    pub role: Role,
    /// Its delay (`30s`, `1d`).
    pub delay: Option<String>,
    /// Its partitions.
    pub partitions: Vec<WaitingPartition>,
}

impl WaitingTopic {
    /// Records not committed by the group, over every partition.
    pub fn waiting(&self) -> i64 {
        self.partitions.iter().map(|p| p.waiting).sum()
    }
}

/// Where the unread part of a partition starts and ends: from the committed
/// offset (the log start if the group never committed or retention passed
/// it) to at most `max` records further, never past the end.
pub fn window(lag: &PartitionLag, max: usize) -> Option<(i64, i64)> {
    let from = lag.committed.unwrap_or(lag.start).max(lag.start);
    let to = lag
        .end
        .min(from.saturating_add(i64::try_from(max).unwrap_or(i64::MAX)));
    (to > from).then_some((from, to))
}

/// The retry tiers and delay topics of route `main` for `group` (the
/// group's shared ones included), shortest
/// delay first, each with the first `per_partition` records the group has
/// not committed (capped at [`MAX_PER_PARTITION`]). Blocking.
pub fn waiting(
    config: &KafkaConfig,
    main: &str,
    group: &str,
    per_partition: usize,
) -> Result<Vec<WaitingTopic>> {
    let per_partition = per_partition.clamp(1, MAX_PER_PARTITION);
    let names = kjob::topics::list_topics(config)?;
    let topics: Vec<_> = route_topics(main, Some(group), &names)
        .into_iter()
        .filter(|t| holds(&t.role))
        .collect();
    if topics.is_empty() {
        return Ok(Vec::new());
    }
    let wanted: Vec<String> = topics.iter().map(|t| t.topic.clone()).collect();
    let lag = crate::lag::group_lag(config, group, &wanted)?;
    let windows: Vec<(&PartitionLag, (i64, i64))> = lag
        .iter()
        .filter_map(|l| Some((l, window(l, per_partition)?)))
        .collect();
    let mut read = read_windows(config, &windows)?;
    Ok(topics
        .into_iter()
        .map(|t| {
            let mut partitions: Vec<WaitingPartition> = lag
                .iter()
                .filter(|l| l.topic == t.topic)
                .map(|l| WaitingPartition {
                    partition: l.partition,
                    committed: l.committed,
                    end: l.end,
                    waiting: (l.end - l.committed.unwrap_or(l.start).max(l.start)).max(0),
                    // A shared topic's other routes' jobs are theirs to show.
                    records: read
                        .remove(&(t.topic.clone(), l.partition))
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|r| {
                            !matches!(t.role, Role::SharedRetryTier | Role::SharedDelay)
                                || r.of_route(main)
                        })
                        .collect(),
                })
                .collect();
            partitions.sort_by_key(|p| p.partition);
            WaitingTopic {
                topic: t.topic,
                role: t.role,
                delay: t.delay,
                partitions,
            }
        })
        .collect())
}

/// How many records `kjob status` reads at most per shared tier or delay
/// bucket to count one route's share of what waits there.
pub const ROUTE_COUNT_BOUND: usize = 10_000;

/// Of the records the group has not committed in `lags` (the partitions of
/// one shared tier or delay bucket), how many are route `main`'s, and
/// whether every one was read (at most [`ROUTE_COUNT_BOUND`] are, spread
/// over the partitions; past that the count is a lower bound). Blocking.
pub fn count_of_route(
    config: &KafkaConfig,
    main: &str,
    lags: &[PartitionLag],
) -> Result<(i64, bool)> {
    let per = (ROUTE_COUNT_BOUND / lags.len().max(1)).max(1);
    let windows: Vec<(&PartitionLag, (i64, i64))> = lags
        .iter()
        .filter_map(|l| Some((l, window(l, per)?)))
        .collect();
    let complete = windows.iter().all(|(l, (_, to))| *to >= l.end);
    let read = read_windows(config, &windows)?;
    let wanted: i64 = windows.iter().map(|(_, (from, to))| to - from).sum();
    let got: i64 = read.values().map(|v| v.len() as i64).sum();
    let mine = read.values().flatten().filter(|r| r.of_route(main)).count();
    // A read cut short (records deleted under it, or the 30 s limit) is a
    // lower bound too.
    Ok((mine as i64, complete && got >= wanted))
}

/// A consumer for manual assignments only: it joins no group and commits
/// nothing (the group id is required by librdkafka, never used).
fn reader(config: &KafkaConfig) -> Result<BaseConsumer> {
    config
        .client_config(&[
            ("group.id", "kjob-waiting-reader"),
            ("enable.auto.commit", "false"),
            ("enable.partition.eof", "false"),
        ])
        .create()
        .map_err(|e| Error::kafka("creating the waiting reader", e))
}

/// The records of each `(partition, [from, to))` window, by topic and
/// partition. Gives up after 30 s (a partition whose records were deleted
/// under the read ends early: what is left is returned).
fn read_windows(
    config: &KafkaConfig,
    windows: &[(&PartitionLag, (i64, i64))],
) -> Result<HashMap<(String, i32), Vec<WaitingRecord>>> {
    let mut out: HashMap<(String, i32), Vec<WaitingRecord>> = HashMap::new();
    if windows.is_empty() {
        return Ok(out);
    }
    let consumer = reader(config)?;
    let mut tpl = TopicPartitionList::new();
    let mut ends: HashMap<(String, i32), i64> = HashMap::new();
    for (l, (from, to)) in windows {
        tpl.add_partition_offset(&l.topic, l.partition, Offset::Offset(*from))
            .map_err(|e| Error::kafka("building the waiting assignment", e))?;
        ends.insert((l.topic.clone(), l.partition), *to);
    }
    consumer
        .assign(&tpl)
        .map_err(|e| Error::kafka("assigning the waiting reader", e))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ends.is_empty() && Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let at = (m.topic().to_string(), m.partition());
                let Some(to) = ends.get(&at).copied() else {
                    continue;
                };
                if m.offset() >= to {
                    ends.remove(&at);
                    continue;
                }
                // Copied first: rdkafka's own header accessor panics on a
                // header name that is not UTF-8.
                let copy = kjob::headers::owned_record(&m);
                out.entry(at.clone()).or_default().push(WaitingRecord {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: copy.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                    headers: JobHeaders::parse(copy.headers()),
                    timestamp_ms: m.timestamp().to_millis(),
                });
                if m.offset() + 1 >= to {
                    ends.remove(&at);
                }
            }
            Some(Err(e)) => return Err(Error::kafka("reading what waits", e)),
            None => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lag(committed: Option<i64>, start: i64, end: i64) -> PartitionLag {
        PartitionLag {
            topic: "t.retry.30s".into(),
            partition: 0,
            committed,
            start,
            end,
        }
    }

    #[test]
    fn the_window_starts_at_the_commit_and_is_bounded() {
        assert_eq!(window(&lag(Some(10), 0, 100), 20), Some((10, 30)));
        assert_eq!(window(&lag(Some(95), 0, 100), 20), Some((95, 100)));
        // Nothing uncommitted: nothing to read.
        assert_eq!(window(&lag(Some(100), 0, 100), 20), None);
        // Never committed, or retention deleted past the commit.
        assert_eq!(window(&lag(None, 40, 100), 5), Some((40, 45)));
        assert_eq!(window(&lag(Some(3), 40, 100), 5), Some((40, 45)));
    }

    #[test]
    fn a_delayed_job_is_due_at_its_run_time_a_retry_at_its_due_time() {
        let mut r = WaitingRecord {
            partition: 0,
            offset: 0,
            key: None,
            headers: JobHeaders::default(),
            timestamp_ms: None,
        };
        assert_eq!(r.due_ms(), None);
        r.headers.due_at_ms = Some(5);
        assert_eq!(r.due_ms(), Some(5));
        r.headers.run_at_ms = Some(9);
        assert_eq!(r.due_ms(), Some(9));
    }

    #[test]
    fn a_shared_topics_record_belongs_to_the_route_it_names() {
        let mut r = WaitingRecord {
            partition: 0,
            offset: 0,
            key: None,
            headers: JobHeaders::default(),
            timestamp_ms: None,
        };
        assert!(!r.of_route("mails"));
        r.headers.original_topic = Some("mails".into());
        assert!(r.of_route("mails"));
        r.headers
            .extra
            .push((kjob::headers::ROUTE.into(), b"invoices".to_vec()));
        assert!(r.of_route("invoices"), "the route header decides");
        assert!(!r.of_route("mails"));
    }
}
