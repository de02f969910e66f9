//! Committed offsets versus end offsets: how far a group is behind.
//!
//! This reads Kafka alone (no worker needed), so it answers "is everything
//! done?" from outside: the demo's final check, tests, and `kjob status`.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use crate::config::KafkaConfig;
use crate::error::{Error, Result};

/// One partition's position for one group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionLag {
    /// Topic name.
    pub topic: String,
    /// Partition number.
    pub partition: i32,
    /// The group's committed offset (next to read), if it committed one.
    pub committed: Option<i64>,
    /// The log start offset (earliest still stored).
    pub start: i64,
    /// The log end offset (next offset to be written).
    pub end: i64,
}

impl PartitionLag {
    /// Records not yet committed by the group. A partition without a commit
    /// counts everything still stored as lag.
    pub fn lag(&self) -> i64 {
        let from = self.committed.unwrap_or(self.start).max(self.start);
        (self.end - from).max(0)
    }
}

/// Committed and end offsets of `group` for every partition of `topics`.
/// Blocking (several broker round trips): use `spawn_blocking` in async code.
pub fn group_lag(
    config: &KafkaConfig,
    group: &str,
    topics: &[String],
) -> Result<Vec<PartitionLag>> {
    let consumer: BaseConsumer = config
        .client_config(&[("group.id", group), ("enable.auto.commit", "false")])
        .create()
        .map_err(|e| Error::kafka("creating lag client", e))?;
    let timeout = Duration::from_secs(10);
    let mut tpl = TopicPartitionList::new();
    for topic in topics {
        let md = consumer
            .fetch_metadata(Some(topic), timeout)
            .map_err(|e| Error::kafka(format!("metadata for `{topic}`"), e))?;
        let entry = md.topics().first();
        if let Some(code) = entry.and_then(|t| t.error()).map(RDKafkaErrorCode::from) {
            if code == RDKafkaErrorCode::TopicAuthorizationFailed {
                // Hidden by ACLs, which is not the same as missing.
                return Err(Error::not_authorized(
                    config,
                    "Describe",
                    format!("topic `{topic}` (it may exist)"),
                    &format!("--topic {topic}"),
                    code.to_string(),
                ));
            }
        }
        let parts = entry
            .filter(|t| t.error().is_none())
            .map(|t| t.partitions().len())
            .unwrap_or(0);
        if parts == 0 {
            return Err(Error::MissingTopic {
                topic: topic.clone(),
                bootstrap: config.bootstrap_servers.clone(),
            });
        }
        for p in 0..parts as i32 {
            tpl.add_partition(topic, p);
        }
    }
    let committed = consumer
        .committed_offsets(tpl.clone(), timeout)
        .map_err(|e| Error::kafka(format!("committed offsets of group `{group}`"), e))?;
    let mut out = Vec::new();
    for e in tpl.elements() {
        let (start, end) = consumer
            .fetch_watermarks(e.topic(), e.partition(), timeout)
            .map_err(|err| {
                Error::kafka(
                    format!("watermarks of {}:{}", e.topic(), e.partition()),
                    err,
                )
            })?;
        let committed = match committed
            .find_partition(e.topic(), e.partition())
            .map(|c| c.offset())
        {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        };
        out.push(PartitionLag {
            topic: e.topic().to_string(),
            partition: e.partition(),
            committed,
            start,
            end,
        });
    }
    Ok(out)
}

/// Age in seconds of the first uncommitted record of each partition with
/// lag, read from Kafka (the record at the committed offset). Partitions
/// without lag are absent. Blocking.
pub fn oldest_pending_ages(
    config: &KafkaConfig,
    rows: &[PartitionLag],
) -> Result<Vec<(String, i32, f64)>> {
    use rdkafka::Message;
    let pending: Vec<&PartitionLag> = rows.iter().filter(|r| r.lag() > 0).collect();
    if pending.is_empty() {
        return Ok(Vec::new());
    }
    let consumer: BaseConsumer = config
        .client_config(&[
            ("group.id", "kjob-status-reader"),
            ("enable.auto.commit", "false"),
        ])
        .create()
        .map_err(|e| Error::kafka("creating status reader", e))?;
    let mut tpl = TopicPartitionList::new();
    for r in &pending {
        let from = r.committed.unwrap_or(r.start).max(r.start);
        tpl.add_partition_offset(&r.topic, r.partition, Offset::Offset(from))
            .map_err(|e| Error::kafka("building status assignment", e))?;
    }
    consumer
        .assign(&tpl)
        .map_err(|e| Error::kafka("assigning status reader", e))?;
    let now = crate::dlq::now_ms();
    let mut out: Vec<(String, i32, f64)> = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while out.len() < pending.len() && std::time::Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            if out
                .iter()
                .any(|(t, p, _)| t == m.topic() && *p == m.partition())
            {
                continue;
            }
            let ts = m.timestamp().to_millis().unwrap_or(now);
            out.push((
                m.topic().to_string(),
                m.partition(),
                ((now - ts).max(0) as f64) / 1000.0,
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lag(committed: Option<i64>, start: i64, end: i64) -> i64 {
        PartitionLag {
            topic: "t".into(),
            partition: 0,
            committed,
            start,
            end,
        }
        .lag()
    }

    #[test]
    fn lag_arithmetic() {
        assert_eq!(lag(Some(10), 0, 10), 0);
        assert_eq!(lag(Some(4), 0, 10), 6);
        assert_eq!(
            lag(None, 3, 10),
            7,
            "no commit: everything stored is pending"
        );
        assert_eq!(
            lag(Some(1), 5, 10),
            5,
            "commit below log start: retention removed the rest"
        );
        assert_eq!(lag(Some(12), 0, 10), 0);
    }
}
