//! What the soak checks at the end: committed offsets, keys in a topic, counts in PostgreSQL.

use super::*;
use kjob::KafkaConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use std::time::{Duration, Instant};

pub(crate) fn consumer(config: &KafkaConfig, group: &str) -> anyhow::Result<BaseConsumer> {
    Ok(config
        .rdkafka_config()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?)
}

/// Per topic: (end offsets summed, whether the group's committed offset
/// equals the end offset on every partition that has records).
pub(crate) fn committed_at_end(
    config: &KafkaConfig,
    group: &str,
    topic: &str,
) -> anyhow::Result<(i64, bool)> {
    let c = consumer(config, group)?;
    let mut tpl = TopicPartitionList::new();
    let mut ends = Vec::new();
    for p in 0..PARTITIONS {
        tpl.add_partition(topic, p);
        ends.push(c.fetch_watermarks(topic, p, Duration::from_secs(10))?.1);
    }
    let got = c.committed_offsets(tpl, Duration::from_secs(10))?;
    let all = (0..PARTITIONS).all(|p| {
        let end = ends[p as usize];
        let committed = match got.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        };
        end == 0 || committed == Some(end)
    });
    Ok((ends.iter().sum(), all))
}

/// Keys of every record in `topic`.
pub(crate) fn keys_in(config: &KafkaConfig, topic: &str) -> anyhow::Result<Vec<String>> {
    let c = consumer(
        config,
        &format!("chaos-reader-{}", uuid::Uuid::new_v4().simple()),
    )?;
    let mut tpl = TopicPartitionList::new();
    let mut total = 0i64;
    for p in 0..PARTITIONS {
        let (lo, hi) = c.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        total += hi - lo;
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    let mut keys = Vec::new();
    let start = Instant::now();
    while (keys.len() as i64) < total {
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(60),
            "read only {} of {total} records of {topic}",
            keys.len()
        );
        if let Some(m) = c.poll(Duration::from_millis(200)) {
            let m = m?;
            keys.push(String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned());
        }
    }
    Ok(keys)
}

pub(crate) async fn count(pg: &tokio_postgres::Client, sql: &str) -> anyhow::Result<i64> {
    Ok(pg.query_one(sql, &[]).await?.get(0))
}
