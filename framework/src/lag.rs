//! Committed offsets versus end offsets: how far a group is behind.
//!
//! The worker keeps a [`LagReader`] for its `kjob_consumer_lag` metric.
//! Operator views built on the same reading (one-off group lag, the age of
//! the oldest pending job, `kjob status`) live in `kjob-ops` (`kjob_ops::lag`).

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

/// A long-lived lag reader: one client for every refresh (a worker reads
/// its lag every few seconds), and every offset query batched, so a refresh
/// costs one metadata request, one committed-offsets request, and two
/// list-offsets requests per broker, whatever the partition count.
pub struct LagReader {
    consumer: BaseConsumer,
    group: String,
    bootstrap: String,
    config: KafkaConfig,
}

impl LagReader {
    /// A reader of `group`'s positions.
    pub fn new(config: &KafkaConfig, group: &str) -> Result<Self> {
        // The factory's reader: it reads `group`'s committed offsets and
        // never joins or commits.
        let consumer: BaseConsumer = crate::membership::reader(config, group)
            .create()
            .map_err(|e| Error::kafka("creating lag client", e))?;
        Ok(Self {
            consumer,
            group: group.to_string(),
            bootstrap: config.bootstrap_servers.clone(),
            config: config.clone(),
        })
    }

    /// Committed, start and end offsets of every partition of `topics`.
    /// Blocking.
    pub fn read(&self, topics: &[String]) -> Result<Vec<PartitionLag>> {
        let timeout = Duration::from_secs(10);
        let mut tpl = TopicPartitionList::new();
        for topic in topics {
            // By name: a full metadata request is slow on a cluster with
            // tens of thousands of partitions.
            let md = self
                .consumer
                .fetch_metadata(Some(topic), timeout)
                .map_err(|e| Error::kafka(format!("metadata from {}", self.bootstrap), e))?;
            let parts = md
                .topics()
                .iter()
                .find(|t| t.name() == topic && t.error().is_none())
                .map_or(0, |t| t.partitions().len());
            if parts == 0 {
                return Err(self.missing_or_hidden(topic, timeout));
            }
            for p in 0..parts as i32 {
                tpl.add_partition(topic, p);
            }
        }
        let committed = self
            .consumer
            .committed_offsets(tpl.clone(), timeout)
            .map_err(|e| Error::kafka(format!("committed offsets of group `{}`", self.group), e))?;
        // ListOffsets for every partition at once (librdkafka groups the
        // request per leader): "latest" and "earliest" as special timestamps.
        let query = |at: Offset| -> Result<TopicPartitionList> {
            let mut q = tpl.clone();
            q.set_all_offsets(at)
                .map_err(|e| Error::kafka("building an offsets query", e))?;
            self.consumer
                .offsets_for_times(q, timeout)
                .map_err(|e| Error::kafka("listing offsets", e))
        };
        let ends = query(Offset::End)?;
        let starts = query(Offset::Beginning)?;
        let at = |list: &TopicPartitionList, t: &str, p: i32| match list
            .find_partition(t, p)
            .map(|e| e.offset())
        {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        };
        let mut out = Vec::new();
        for e in tpl.elements() {
            let (t, p) = (e.topic(), e.partition());
            let (Some(start), Some(end)) = (at(&starts, t, p), at(&ends, t, p)) else {
                return Err(Error::NoOffsets {
                    topic: t.to_string(),
                    partition: p,
                });
            };
            out.push(PartitionLag {
                topic: t.to_string(),
                partition: p,
                committed: at(&committed, t, p),
                start,
                end,
            });
        }
        Ok(out)
    }

    /// A topic absent from the metadata is either missing or hidden by
    /// ACLs, which are different fixes: ask for it by name to tell.
    fn missing_or_hidden(&self, topic: &str, timeout: Duration) -> Error {
        let code = self
            .consumer
            .fetch_metadata(Some(topic), timeout)
            .ok()
            .and_then(|md| md.topics().first().and_then(|t| t.error()))
            .map(RDKafkaErrorCode::from);
        if code == Some(RDKafkaErrorCode::TopicAuthorizationFailed) {
            return self.config.not_authorized(
                "Describe",
                format!("topic `{topic}` (it may exist)"),
                &format!("--topic {topic}"),
                RDKafkaErrorCode::TopicAuthorizationFailed.to_string(),
            );
        }
        Error::MissingTopic {
            topic: topic.to_string(),
            bootstrap: self.bootstrap.clone(),
        }
    }
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
