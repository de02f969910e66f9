//! Topic provisioning through the admin API.
//!
//! Workers check their topics at startup so a typo or a missing route is a
//! clear error before any job is touched, and they create their own DLQ
//! topics (with the main topic's partition count) when allowed to.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;
use rdkafka::{Offset, TopicPartitionList};

use crate::config::KafkaConfig;
use crate::error::{Error, Result};

pub(crate) mod names;
pub use names::{dlq_audit_topic, dlq_topic, order_topic, route_of};

/// Every topic name in the cluster. Blocking.
pub fn list_topics(config: &KafkaConfig) -> Result<Vec<String>> {
    let md = cluster_metadata(config)?;
    Ok(md.topics().iter().map(|t| t.name().to_string()).collect())
}

/// How long a metadata request may take before it is reported as failed.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// A client context that remembers librdkafka's last error event, and
/// the last authentication error apart (a later "all brokers are down"
/// must not hide it), so a failed metadata request can say *why* (a
/// refused password, a TLS handshake failure) instead of only "timed out".
#[derive(Default)]
pub(crate) struct LastError(Mutex<Errors>);

#[derive(Default, Clone)]
struct Errors {
    last: Option<String>,
    authentication: Option<String>,
}

impl LastError {
    fn get(&self) -> Errors {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl ClientContext for LastError {
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!(%error, reason, "librdkafka error while fetching metadata");
        let mut errors = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if error
            .rdkafka_error_code()
            .is_some_and(is_authentication_error)
        {
            errors.authentication = Some(reason.to_string());
        }
        errors.last = Some(reason.to_string());
    }
}

impl ConsumerContext for LastError {}

/// Whether an error code means the credentials or the TLS setup were
/// refused: retrying with the same config cannot help.
pub(crate) fn is_authentication_error(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::Authentication
            | RDKafkaErrorCode::SaslAuthenticationFailed
            | RDKafkaErrorCode::SSL
            | RDKafkaErrorCode::UnsupportedSASLMechanism
            | RDKafkaErrorCode::IllegalSASLState
    )
}

fn metadata_client(config: &KafkaConfig) -> Result<BaseConsumer<LastError>> {
    config
        .client_config(&[])
        .create_with_context(LastError::default())
        .map_err(|e| Error::kafka("creating metadata client", e))
}

/// Fetches metadata (all topics, or one), failing fast and clearly when the
/// cluster refuses the credentials: a wrong password is reported as such
/// within a second or two, not as a 10 s timeout.
fn fetch_metadata(
    config: &KafkaConfig,
    client: &BaseConsumer<LastError>,
    topic: Option<&str>,
) -> Result<rdkafka::metadata::Metadata> {
    let deadline = Instant::now() + METADATA_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt = left.min(Duration::from_secs(2));
        let err = match client.fetch_metadata(topic, attempt) {
            Ok(md) => return Ok(md),
            Err(e) => e,
        };
        // Serve the queued log and error events, so the context sees them.
        // `poll` reports a served event and an empty queue alike (`None`),
        // so drain for a short, bounded time instead of "until empty".
        let drain_until = Instant::now() + Duration::from_millis(200);
        while Instant::now() < drain_until {
            let _ = client.poll(Duration::from_millis(5));
        }
        let errors = client.context().get();
        if let Some(reason) = errors.authentication {
            return Err(Error::Authentication {
                bootstrap: config.bootstrap_servers.clone(),
                message: reason,
            });
        }
        if Instant::now() >= deadline {
            let context = match errors.last {
                Some(reason) => format!(
                    "fetching metadata from {} (last client error: {reason})",
                    config.bootstrap_servers
                ),
                None => format!("fetching metadata from {}", config.bootstrap_servers),
            };
            return Err(Error::kafka(context, err));
        }
    }
}

/// Metadata of every topic in the cluster, from a short-lived client.
fn cluster_metadata(config: &KafkaConfig) -> Result<rdkafka::metadata::Metadata> {
    let client = metadata_client(config)?;
    fetch_metadata(config, &client, None)
}

/// Partition counts of the given topics; `None` for topics that do not exist.
/// A topic the principal may not even describe is an error naming the ACL,
/// not `None`: a cluster hides such topics from a full listing, and
/// reporting them as missing would send the operator to create a topic
/// that exists. Blocking (metadata requests): call from `spawn_blocking` in
/// async code.
pub fn partition_counts(config: &KafkaConfig, topics: &[String]) -> Result<Vec<Option<usize>>> {
    let client = metadata_client(config)?;
    let mut counts = Vec::with_capacity(topics.len());
    for t in topics {
        // By name, never the whole cluster: a cluster with tens of thousands
        // of partitions answers a full metadata request too slowly for a
        // worker's start. Asking by name also tells a missing topic from one
        // hidden by ACLs.
        let one = fetch_metadata(config, &client, Some(t))?;
        let entry = one.topics().iter().find(|m| m.name() == t);
        match entry.and_then(|m| m.error()) {
            Some(e) if RDKafkaErrorCode::from(e) == RDKafkaErrorCode::TopicAuthorizationFailed => {
                return Err(config.not_authorized(
                    "Describe",
                    format!("topic `{t}` (it may exist)"),
                    &format!("--topic {t}"),
                    RDKafkaErrorCode::from(e).to_string(),
                ))
            }
            Some(_) => counts.push(None),
            None => counts.push(entry.map(|m| m.partitions().len()).filter(|n| *n > 0)),
        }
    }
    Ok(counts)
}

/// The group an operator tool's reads run under ([`read_topic`]): they join
/// and commit nothing, but librdkafka looks the group up, so under ACLs an
/// operator's principal needs Describe on it.
pub const OPERATOR_READER_GROUP: &str = "kjob-cli-reader";

/// A consumer for an operator tool's own reads, by manual assignment,
/// under [`OPERATOR_READER_GROUP`]: it joins and commits nothing. For
/// reads [`read_topic`] does not fit (a range per partition, streamed,
/// such as `kjob schema check --in-flight` over a backlog of millions).
///
/// A range whose start retention removed meanwhile is read from the
/// earliest record still stored (`auto.offset.reset=earliest`), never
/// skipped to the end.
pub fn operator_consumer(config: &KafkaConfig) -> Result<BaseConsumer> {
    crate::membership::reader(config, OPERATOR_READER_GROUP)
        .set("auto.offset.reset", "earliest")
        .create()
        .map_err(|e| Error::kafka("creating reader", e))
}

/// Reads every record currently in `topic` (up to the end offsets taken at
/// the start), in partition and offset order, with a manual assignment (no
/// membership, no commits), under [`OPERATOR_READER_GROUP`]: the DLQ
/// reader, the dashboard's history. `None` if the topic does not exist.
/// Blocking; gives up after 60 s.
pub fn read_topic(config: &KafkaConfig, topic: &str) -> Result<Option<Vec<OwnedMessage>>> {
    read_topic_tail(config, topic, None)
}

/// [`read_topic`] under `group` (a worker reads its control, schedule and
/// batch state under a group its model grants).
pub fn read_topic_as(
    config: &KafkaConfig,
    topic: &str,
    group: &str,
) -> Result<Option<Vec<OwnedMessage>>> {
    read_topic_tail_as(config, topic, None, group)
}

/// [`read_topic`], of at most the last `max_per_partition` records of each
/// partition when given: a bounded read for views refreshed often.
pub fn read_topic_tail(
    config: &KafkaConfig,
    topic: &str,
    max_per_partition: Option<i64>,
) -> Result<Option<Vec<OwnedMessage>>> {
    read_topic_tail_as(config, topic, max_per_partition, OPERATOR_READER_GROUP)
}

/// [`read_topic_tail`] under `group`.
pub fn read_topic_tail_as(
    config: &KafkaConfig,
    topic: &str,
    max_per_partition: Option<i64>,
    group: &str,
) -> Result<Option<Vec<OwnedMessage>>> {
    let Some(parts) = partition_counts(config, &[topic.to_string()])?
        .pop()
        .flatten()
    else {
        return Ok(None);
    };
    let consumer: BaseConsumer = crate::membership::reader(config, group)
        .create()
        .map_err(|e| Error::kafka("creating reader", e))?;
    let timeout = Duration::from_secs(10);
    let mut tpl = TopicPartitionList::new();
    let mut remaining = 0usize;
    let mut ends = HashMap::new();
    for p in 0..parts as i32 {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, timeout)
            .map_err(|e| Error::kafka(format!("watermarks of {topic}:{p}"), e))?;
        let low = match max_per_partition {
            Some(max) => low.max(high - max.max(0)),
            None => low,
        };
        if high > low {
            tpl.add_partition_offset(topic, p, Offset::Offset(low))
                .map_err(|e| Error::kafka("building assignment", e))?;
            ends.insert(p, high);
            remaining += 1;
        }
    }
    let mut out = Vec::new();
    if remaining == 0 {
        return Ok(Some(out));
    }
    // Manual assignment: no group membership, no commits.
    consumer
        .assign(&tpl)
        .map_err(|e| Error::kafka(format!("assigning {topic}"), e))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while remaining > 0 {
        if Instant::now() > deadline {
            return Err(Error::ReadTimeout {
                topic: topic.to_string(),
                after: Duration::from_secs(60),
            });
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let end = ends.get(&m.partition()).copied().unwrap_or(0);
                if m.offset() < end {
                    let last = m.offset() + 1 >= end;
                    // Not `detach()`: see `owned_record`.
                    out.push(crate::headers::owned_record(&m));
                    if last {
                        remaining -= 1;
                    }
                }
            }
            Some(Err(e)) => return Err(Error::kafka(format!("reading {topic}"), e)),
            None => {}
        }
    }
    out.sort_by_key(|m| (m.partition(), m.offset()));
    Ok(Some(out))
}

/// Room for kjob's headers on top of a main-topic record when it is
/// forwarded: a tier or DLQ topic accepts this much more than its main topic.
pub const FORWARD_HEADROOM_BYTES: i64 = 64 * 1024;

/// The effective `max.message.bytes` of each topic (the broker's default
/// where the topic sets none); `None` where it could not be read (a missing
/// topic, or no DescribeConfigs permission).
pub async fn max_message_bytes(config: &KafkaConfig, topics: &[String]) -> Vec<Option<i64>> {
    use rdkafka::admin::ResourceSpecifier;
    let Ok(admin) = config
        .client_config(&[])
        .create::<AdminClient<DefaultClientContext>>()
    else {
        return vec![None; topics.len()];
    };
    let specs: Vec<ResourceSpecifier<'_>> = topics
        .iter()
        .map(|t| ResourceSpecifier::Topic(t.as_str()))
        .collect();
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let Ok(results) = admin.describe_configs(&specs, &opts).await else {
        return vec![None; topics.len()];
    };
    results
        .into_iter()
        .map(|r| {
            r.ok()?
                .get("max.message.bytes")?
                .value
                .as_deref()?
                .parse()
                .ok()
        })
        .collect()
}

/// The effective `retention.ms` of each topic (`-1`: kept forever), or why
/// it could not be read (a missing topic, no DescribeConfigs permission).
pub async fn retention_ms(
    config: &KafkaConfig,
    topics: &[String],
) -> Vec<std::result::Result<i64, String>> {
    use rdkafka::admin::ResourceSpecifier;
    let admin = match config
        .client_config(&[])
        .create::<AdminClient<DefaultClientContext>>()
    {
        Ok(a) => a,
        Err(e) => return vec![Err(format!("creating admin client: {e}")); topics.len()],
    };
    let specs: Vec<ResourceSpecifier<'_>> = topics
        .iter()
        .map(|t| ResourceSpecifier::Topic(t.as_str()))
        .collect();
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let results = match admin.describe_configs(&specs, &opts).await {
        Ok(r) => r,
        Err(e) => return vec![Err(e.to_string()); topics.len()],
    };
    results
        .into_iter()
        .map(|r| {
            let resource = r.map_err(|code| code.to_string())?;
            resource
                .get("retention.ms")
                .and_then(|e| e.value.as_deref())
                .ok_or_else(|| "retention.ms not reported".to_string())?
                .parse::<i64>()
                .map_err(|e| format!("retention.ms: {e}"))
        })
        .collect()
}

/// [`partition_counts`] off the async runtime's threads (it blocks on
/// the metadata request).
pub(crate) async fn partition_counts_async(
    config: &KafkaConfig,
    topics: &[String],
) -> Result<Vec<Option<usize>>> {
    let (config, topics) = (config.clone(), topics.to_vec());
    tokio::task::spawn_blocking(move || partition_counts(&config, &topics))
        .await
        .map_err(|e| Error::Task {
            what: "a metadata lookup",
            reason: e.to_string(),
        })?
}

/// Waits (10 s at most) until the cluster's metadata lists every topic of
/// `topics`. A consumer that subscribes to a topic created a moment ago
/// but not yet in the metadata it fetches is not assigned it until its next
/// metadata refresh (5 minutes by default); waiting here avoids that.
pub async fn wait_visible(config: &KafkaConfig, topics: &[String]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let counts = partition_counts_async(config, topics).await?;
        if counts.iter().all(Option::is_some) || Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates each `(topic, partitions)` that does not exist yet. Existing topics
/// are left alone. A permission problem names the topic and the ACL needed.
pub async fn create_topics(config: &KafkaConfig, topics: &[(String, i32)]) -> Result<()> {
    create_topics_with(config, topics, &[]).await
}

/// [`create_topics`] with topic configs (e.g. `cleanup.policy=compact`).
pub async fn create_topics_with(
    config: &KafkaConfig,
    topics: &[(String, i32)],
    topic_config: &[(&str, &str)],
) -> Result<()> {
    create_topics_replicated(config, topics, None, topic_config).await
}

/// [`create_topics_with`] with a replication factor (`None`: the broker's
/// `default.replication.factor`), as `kafka-topics --create
/// --replication-factor` takes it.
pub async fn create_topics_replicated(
    config: &KafkaConfig,
    topics: &[(String, i32)],
    replication: Option<i32>,
    topic_config: &[(&str, &str)],
) -> Result<()> {
    if topics.is_empty() {
        return Ok(());
    }
    let admin: AdminClient<DefaultClientContext> = config
        .client_config(&[])
        .create()
        .map_err(|e| Error::kafka("creating admin client", e))?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|(t, p)| {
            topic_config.iter().fold(
                NewTopic::new(t, *p, TopicReplication::Fixed(replication.unwrap_or(-1))),
                |n, (k, v)| n.set(k, v),
            )
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = admin
        .create_topics(&new, &opts)
        .await
        .map_err(|e| Error::kafka("creating topics", e))?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, RDKafkaErrorCode::TopicAuthorizationFailed))
            | Err((t, RDKafkaErrorCode::ClusterAuthorizationFailed)) => {
                return Err(Error::CreateTopic {
                    topic: t,
                    reason: "not authorized: grant CREATE on the topic (or cluster) to this principal, or create it beforehand".into(),
                })
            }
            Err((t, code)) => {
                return Err(Error::CreateTopic {
                    topic: t,
                    reason: code.to_string(),
                })
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_topics_name_their_route() {
        for (topic, main) in [
            ("orders.dlq", "orders"),
            ("orders.dlq.audit", "orders"),
            ("orders.retry.30s", "orders"),
            ("orders.retry.250ms", "orders"),
            ("orders.delay.1d", "orders"),
            ("orders.delay.10m", "orders"),
            ("orders", "orders"),
            ("shop.order", "shop.order"),
            ("a.retry.soon", "a.retry.soon"),
            (".dlq", ".dlq"),
        ] {
            assert_eq!(route_of(topic), main, "{topic}");
        }
        let e = Error::MissingTopic {
            topic: "orders.dlq".into(),
            bootstrap: "b:9092".into(),
        }
        .to_string();
        assert!(
            e.contains("kjob topics create --topic orders --execute`"),
            "{e}"
        );
        assert!(!e.contains("--topic orders.dlq"), "{e}");
    }
}
