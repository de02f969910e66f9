//! Where strict-order chains are persisted: `<main>.order` on Kafka for
//! the worker, memory for the test harness.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::KafkaConfig;
use crate::error::{Error, Result};

/// Where chains are persisted: `<main>.order` on Kafka for the worker,
/// memory for the test harness.
pub(crate) trait OrderStore: Send + Sync {
    /// Enqueues the record *now* (so callers holding a lock decide the log
    /// order) and resolves once it is acknowledged. `None` is a tombstone.
    fn write(
        &self,
        topic: &str,
        partition: i32,
        key: &[u8],
        value: Option<Vec<u8>>,
    ) -> BoxFuture<'static, Result<()>>;

    /// Every record of `topic`'s `partition` up to its current end, in log
    /// order.
    #[allow(clippy::type_complexity)]
    fn load(
        &self,
        topic: &str,
        partition: i32,
    ) -> BoxFuture<'static, Result<Vec<(Vec<u8>, Option<Vec<u8>>)>>>;
}

/// The Kafka store: the worker's idempotent producer (acks=all) and a
/// plain assigned consumer for loading.
pub(crate) struct KafkaStore {
    pub producer: FutureProducer,
    pub config: KafkaConfig,
    /// The worker's group: the loading consumer reads under it (it never
    /// joins or commits), as the worker's model grants it.
    pub group: String,
}

impl OrderStore for KafkaStore {
    fn write(
        &self,
        topic: &str,
        partition: i32,
        key: &[u8],
        value: Option<Vec<u8>>,
    ) -> BoxFuture<'static, Result<()>> {
        let mut record: FutureRecord<'_, [u8], Vec<u8>> =
            FutureRecord::to(topic).partition(partition).key(key);
        if let Some(v) = &value {
            record = record.payload(v);
        }
        let topic = topic.to_string();
        match self.producer.send_result(record) {
            Ok(delivery) => Box::pin(async move {
                match delivery.await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err((e, _))) => Err(Error::kafka(format!("writing {topic}"), e)),
                    Err(_) => Err(Error::Unacknowledged { topic }),
                }
            }),
            Err((e, _)) => {
                let e = Error::kafka(format!("enqueueing to {topic}"), e);
                Box::pin(async move { Err(e) })
            }
        }
    }

    fn load(
        &self,
        topic: &str,
        partition: i32,
    ) -> BoxFuture<'static, Result<Vec<(Vec<u8>, Option<Vec<u8>>)>>> {
        let (config, topic, group) = (self.config.clone(), topic.to_string(), self.group.clone());
        Box::pin(async move {
            tokio::task::spawn_blocking(move || read_partition(&config, &topic, partition, &group))
                .await
                .map_err(|e| Error::Task {
                    what: "loading the strict-order state",
                    reason: e.to_string(),
                })?
        })
    }
}

/// Reads one partition from its start to the end offset taken first.
/// Blocking.
#[allow(clippy::type_complexity)]
fn read_partition(
    config: &KafkaConfig,
    topic: &str,
    partition: i32,
    group: &str,
) -> Result<Vec<(Vec<u8>, Option<Vec<u8>>)>> {
    let consumer: BaseConsumer = crate::membership::reader(config, group)
        .create()
        .map_err(|e| Error::kafka("creating the order-state reader", e))?;
    let timeout = Duration::from_secs(10);
    let (low, high) = consumer
        .fetch_watermarks(topic, partition, timeout)
        .map_err(|e| Error::kafka(format!("watermarks of {topic}:{partition}"), e))?;
    let mut out = Vec::new();
    if high <= low {
        return Ok(out);
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(low))
        .map_err(|e| Error::kafka("building assignment", e))?;
    consumer
        .assign(&tpl)
        .map_err(|e| Error::kafka(format!("assigning {topic}:{partition}"), e))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if std::time::Instant::now() > deadline {
            return Err(Error::ReadTimeout {
                topic: format!("{topic}:{partition}"),
                after: Duration::from_secs(60),
            });
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                if m.offset() < high {
                    if let Some(k) = m.key() {
                        out.push((k.to_vec(), m.payload().map(<[u8]>::to_vec)));
                    }
                }
                if m.offset() + 1 >= high {
                    return Ok(out);
                }
            }
            Some(Err(e)) => return Err(Error::kafka(format!("reading {topic}:{partition}"), e)),
            // Compaction can leave gaps: done once the position passed the end.
            None => {
                let at = consumer.position().ok().and_then(|p| {
                    p.find_partition(topic, partition)
                        .and_then(|e| e.offset().to_raw())
                });
                if at.is_some_and(|o| o >= high) {
                    return Ok(out);
                }
            }
        }
    }
}

/// The harness's store: a log per (topic, partition) in memory.
#[derive(Default)]
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) struct MemoryStore {
    #[allow(clippy::type_complexity)]
    logs: Mutex<HashMap<(String, i32), Vec<(Vec<u8>, Option<Vec<u8>>)>>>,
}

impl OrderStore for MemoryStore {
    fn write(
        &self,
        topic: &str,
        partition: i32,
        key: &[u8],
        value: Option<Vec<u8>>,
    ) -> BoxFuture<'static, Result<()>> {
        self.logs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((topic.to_string(), partition))
            .or_default()
            .push((key.to_vec(), value));
        Box::pin(async { Ok(()) })
    }

    fn load(
        &self,
        topic: &str,
        partition: i32,
    ) -> BoxFuture<'static, Result<Vec<(Vec<u8>, Option<Vec<u8>>)>>> {
        let records = self
            .logs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(topic.to_string(), partition))
            .cloned()
            .unwrap_or_default();
        Box::pin(async move { Ok(records) })
    }
}
