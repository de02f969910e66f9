//! How far a group is behind, and how old its oldest pending job is, read
//! from Kafka alone (no worker needed): `kjob status`, the dashboard, a
//! replay plan and the demo's final check. The reading itself is kjob's
//! [`LagReader`], the one the worker keeps for its lag metric.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use kjob::config::KafkaConfig;
use kjob::error::{Error, Result};
pub use kjob::lag::{LagReader, PartitionLag};

/// Committed and end offsets of `group` for every partition of `topics`.
/// Blocking (several broker round trips): use `spawn_blocking` in async code.
/// For repeated reads, keep a [`LagReader`].
pub fn group_lag(
    config: &KafkaConfig,
    group: &str,
    topics: &[String],
) -> Result<Vec<PartitionLag>> {
    LagReader::new(config, group)?.read(topics)
}

/// Age in seconds of the first uncommitted record of each partition with
/// lag, read from Kafka (the record at the committed offset). Partitions
/// without lag are absent. Blocking.
pub fn oldest_pending_ages(
    config: &KafkaConfig,
    rows: &[PartitionLag],
) -> Result<Vec<(String, i32, f64)>> {
    Ok(pending_heads(config, rows)?
        .into_iter()
        .map(|h| (h.topic, h.partition, h.age_seconds))
        .collect())
}

/// The first uncommitted record of a partition with lag.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingHead {
    /// Topic name.
    pub topic: String,
    /// Partition number.
    pub partition: i32,
    /// How long ago it was written, seconds.
    pub age_seconds: f64,
    /// When it is due (retry tiers set `kjob-due-at`; `None` elsewhere):
    /// the next time a tier's partition releases a job.
    pub due_at_ms: Option<i64>,
}

/// The first uncommitted record of each partition with lag (the record at
/// the committed offset): its age and, for retry tiers, when it is due.
/// Partitions without lag are absent. Blocking.
pub fn pending_heads(config: &KafkaConfig, rows: &[PartitionLag]) -> Result<Vec<PendingHead>> {
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
    let now = kjob::clock::now_ms();
    let mut out: Vec<PendingHead> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while out.len() < pending.len() && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            if out
                .iter()
                .any(|h| h.topic == m.topic() && h.partition == m.partition())
            {
                continue;
            }
            let ts = m.timestamp().to_millis().unwrap_or(now);
            // Copied first: rdkafka's own header accessor panics on a header
            // name that is not UTF-8.
            let copy = kjob::headers::owned_record(&m);
            out.push(PendingHead {
                topic: m.topic().to_string(),
                partition: m.partition(),
                age_seconds: ((now - ts).max(0) as f64) / 1000.0,
                due_at_ms: kjob::headers::JobHeaders::parse(copy.headers()).due_at_ms,
            });
        }
    }
    Ok(out)
}
