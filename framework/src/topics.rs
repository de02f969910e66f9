//! Topic provisioning through the admin API.
//!
//! Workers check their topics at startup so a typo or a missing route is a
//! clear error before any job is touched, and they create their own DLQ
//! topics (with the main topic's partition count) when allowed to.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

use crate::config::KafkaConfig;
use crate::error::{Error, Result};

/// The dead-letter topic of a main topic.
pub fn dlq_topic(main: &str) -> String {
    format!("{main}.dlq")
}

/// The compacted audit topic of a main topic's DLQ: one record per dead
/// letter that was re-driven or resolved, keyed by its coordinates.
pub fn dlq_audit_topic(main: &str) -> String {
    format!("{main}.dlq.audit")
}

/// Every topic name in the cluster. Blocking.
pub fn list_topics(config: &KafkaConfig) -> Result<Vec<String>> {
    let md = cluster_metadata(config)?;
    Ok(md.topics().iter().map(|t| t.name().to_string()).collect())
}

/// Metadata of every topic in the cluster, from a short-lived client.
fn cluster_metadata(config: &KafkaConfig) -> Result<rdkafka::metadata::Metadata> {
    let consumer: BaseConsumer = config
        .client_config(&[])
        .create()
        .map_err(|e| Error::kafka("creating metadata client", e))?;
    consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .map_err(|e| {
            Error::kafka(
                format!("fetching metadata from {}", config.bootstrap_servers),
                e,
            )
        })
}

/// Partition counts of the given topics; `None` for topics that do not exist.
/// Blocking (metadata request): call from `spawn_blocking` in async code.
pub fn partition_counts(config: &KafkaConfig, topics: &[String]) -> Result<Vec<Option<usize>>> {
    let md = cluster_metadata(config)?;
    Ok(topics
        .iter()
        .map(|t| {
            md.topics()
                .iter()
                .find(|m| m.name() == t && m.error().is_none())
                .map(|m| m.partitions().len())
        })
        .collect())
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
                NewTopic::new(t, *p, TopicReplication::Fixed(-1)),
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
                return Err(Error::Config(format!(
                    "not allowed to create topic `{t}`: grant CREATE on the topic (or cluster) to this principal, or create it beforehand"
                )))
            }
            Err((t, code)) => {
                return Err(Error::Config(format!("creating topic `{t}` failed: {code}")))
            }
        }
    }
    Ok(())
}
