//! Operator actions on dead letters: re-drive and resolve, both audited.
//!
//! Order of writes, so nothing is lost and nothing is silently dropped:
//! a re-drive first produces the record to its target and waits for the
//! acknowledgement, and only then writes the audit entry that removes it
//! from the unresolved list. A crash in between leaves the dead letter
//! listed (and re-drivable again): a possible duplicate, never a loss.
//!
//! **JSON dead letters.** A job enqueued from SQL (`kjob.enqueue`) that the
//! outbox relay could not encode is dead-lettered as the JSON the
//! application wrote ([`headers::PAYLOAD_FORMAT`] `json`, class
//! `outbox.encode`): its contract did not fit it. Re-driving it as is would
//! hand a worker bytes it cannot decode, so a re-drive first encodes it
//! again, against the **latest** version registered under the main topic's
//! subject: the fix for "missing field" or "no such field" is a new version
//! of the contract (a default, the new field), and a pinned version never
//! changes. If it still does not fit, the re-drive fails with the field
//! named and the dead letter stays unresolved. When the data was wrong
//! instead, enqueue a corrected job and `kjob dlq resolve` this one.

use rdkafka::message::OwnedHeaders;

use super::store::{AuditEntry, Coordinates, DeadLetter};
use kjob::config::KafkaConfig;
use kjob::dlq::{now_ms, REDRIVEN_FROM};
use kjob::error::{Error, Result};
use kjob::headers::{self, JobHeaders};
use kjob::producer::Producer;
use kjob::retry::discover_tiers;
use kjob::topics::{create_topics_with, dlq_audit_topic, dlq_topic, list_topics, partition_counts};

/// Where a re-drive sends dead letters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedriveTarget {
    /// The shortest retry tier (the default): the record runs as soon as a
    /// worker sees it, through the same path as any retry.
    FirstTier,
    /// The main topic, behind whatever is queued there.
    Main,
}

/// Resolves the topic a re-drive of `main`'s dead letters goes to: for
/// [`RedriveTarget::FirstTier`] the route's shortest tier, or, for a route
/// whose tiers are shared (`WorkerBuilder::shared_retry_tiers`), the
/// shortest `<group>.retry.<delay>` of the first of `groups` (the groups
/// that dead-lettered the records) that has them. Blocking.
pub fn target_topic(
    config: &KafkaConfig,
    main: &str,
    target: RedriveTarget,
    groups: &[String],
) -> Result<String> {
    match target {
        RedriveTarget::Main => {
            if partition_counts(config, &[main.to_string()])?[0].is_none() {
                return Err(Error::MissingTopic {
                    topic: main.to_string(),
                    bootstrap: config.bootstrap_servers.clone(),
                });
            }
            Ok(main.to_string())
        }
        RedriveTarget::FirstTier => {
            let all = list_topics(config)?;
            std::iter::once(main)
                .chain(groups.iter().map(String::as_str))
                .find_map(|at| discover_tiers(at, &all).into_iter().next())
                .map(|(_, t)| t)
                .ok_or_else(|| Error::NoRetryTiers {
                    topic: main.to_string(),
                })
        }
    }
}

/// The headers of a re-driven record: a fresh set of attempts (an operator
/// decided it is worth trying again), due now, with the failure history and
/// the original coordinates kept, and a pointer back to the dead letter.
pub fn redrive_headers(d: &DeadLetter, main: &str, target: &str) -> OwnedHeaders {
    let to_tier = target != main;
    let mut h: JobHeaders = d.headers.clone();
    // A shared tier holds several routes' records: this one names its own.
    if to_tier && !target.starts_with(&format!("{main}.")) {
        h.extra.retain(|(k, _)| k != kjob::headers::ROUTE);
        h.extra
            .push((kjob::headers::ROUTE.to_string(), main.as_bytes().to_vec()));
    }
    h.attempt = Some(1);
    h.due_at_ms = if to_tier { Some(now_ms()) } else { None };
    h.extra.retain(|(k, _)| k != REDRIVEN_FROM);
    h.extra.push((
        REDRIVEN_FROM.to_string(),
        format!("{}:{}", dlq_topic(main), d.at).into_bytes(),
    ));
    h.to_owned_headers()
}

/// Writes audit entries to `<topic>.dlq.audit` (compacted, created on first use).
pub struct AuditLog {
    producer: Producer,
    topic: String,
}

impl AuditLog {
    /// Opens (and if needed creates) the audit topic of `main`'s DLQ.
    pub async fn open(config: &KafkaConfig, producer: Producer, main: &str) -> Result<Self> {
        let topic = dlq_audit_topic(main);
        create_topics_with(
            config,
            &[(topic.clone(), 1)],
            &[("cleanup.policy", "compact")],
        )
        .await?;
        Ok(Self { producer, topic })
    }

    /// Records what happened to the dead letter at `at` and waits for the
    /// acknowledgement.
    pub async fn record(&self, at: Coordinates, entry: &AuditEntry) -> Result<()> {
        let body = serde_json::to_vec(entry).map_err(|e| Error::Json {
            what: "a DLQ audit entry",
            source: std::sync::Arc::new(e),
        })?;
        let key = at.to_string();
        self.producer
            .send_raw(
                &self.topic,
                Some(key.as_bytes()),
                Some(&body),
                OwnedHeaders::new(),
            )
            .await
            .map(|_| ())
    }
}

/// Re-drives one dead letter to `target` and then audits it as `retried`.
pub async fn redrive(
    producer: &Producer,
    audit: &AuditLog,
    main: &str,
    d: &DeadLetter,
    target: &str,
    by: &str,
) -> Result<()> {
    let json = if is_json(d) {
        Some(encode_json_letter(producer, main, d).await?)
    } else {
        None
    };
    let (payload, letter) = match &json {
        Some((bytes, letter)) => (Some(bytes.as_slice()), letter),
        None => (d.payload.as_deref(), d),
    };
    producer
        .send_raw(
            target,
            d.key.as_deref().map(str::as_bytes),
            payload,
            redrive_headers(letter, main, target),
        )
        .await?;
    audit
        .record(
            d.at,
            &AuditEntry {
                action: "retried".into(),
                by: by.to_string(),
                at_ms: now_ms(),
                reason: None,
                target: Some(target.to_string()),
            },
        )
        .await
}

/// Whether `d` holds a JSON job (see the [module docs](self)).
pub fn is_json(d: &DeadLetter) -> bool {
    d.headers
        .extra
        .iter()
        .any(|(k, v)| k == headers::PAYLOAD_FORMAT && v.as_slice() == b"json")
}

/// Encodes a JSON dead letter against the latest contract of `main`, and
/// the dead letter as it reads once its payload is Avro (the JSON-only
/// headers removed; the failure history kept).
async fn encode_json_letter(
    producer: &Producer,
    main: &str,
    d: &DeadLetter,
) -> Result<(Vec<u8>, DeadLetter)> {
    let fail = |message: String| Error::Encode {
        job: d.headers.job.clone().unwrap_or_else(|| main.to_string()),
        message: format!("dead letter {}: {message}", d.at),
    };
    let job: serde_json::Value = serde_json::from_slice(d.payload.as_deref().unwrap_or(b""))
        .map_err(|e| {
            fail(format!(
                "its payload is marked JSON but does not parse: {e}"
            ))
        })?;
    let encoded = producer
        .codec()
        .encode_json(main, None, &job)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let mut letter = d.clone();
    letter
        .headers
        .extra
        .retain(|(k, _)| k != headers::PAYLOAD_FORMAT && k != headers::SCHEMA_VERSION);
    Ok((encoded.bytes, letter))
}

/// Marks a dead letter as handled without re-driving it.
pub async fn resolve(audit: &AuditLog, at: Coordinates, by: &str, reason: &str) -> Result<()> {
    audit
        .record(
            at,
            &AuditEntry {
                action: "resolved".into(),
                by: by.to_string(),
                at_ms: now_ms(),
                reason: Some(reason.to_string()),
                target: None,
            },
        )
        .await
}
