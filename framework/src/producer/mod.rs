//! Enqueueing jobs: encode, produce, and return only once the broker has them.
//!
//! The producer runs with `acks=all` and `enable.idempotence=true`: a job the
//! call reports as enqueued is on every in-sync replica, and librdkafka's
//! internal retries cannot duplicate or reorder it. If the broker cannot be
//! reached, the call fails after `delivery.timeout.ms`; a job is never
//! dropped silently.

mod delayed;

pub(crate) use delayed::DelayTopicCheck;

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use opentelemetry::KeyValue;
use rdkafka::error::KafkaError;
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::util::Timeout;

use crate::telemetry::spans::{self, JobSpan};

use crate::codec::Codec;
use crate::config::KafkaConfig;
use crate::error::{Error, Result};
use crate::headers::JobHeaders;
use crate::job::Job;

/// A fresh job id: a UUIDv7, so ids sort by creation time in logs and tables.
pub fn new_job_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// The headers every enqueued job starts with (also used by the test
/// harness, so its records look exactly like produced ones).
pub fn enqueue_headers<J: Job>(job: &J, id: &str) -> JobHeaders {
    JobHeaders {
        job: Some(J::NAME.to_string()),
        version: Some(J::VERSION),
        id: Some(id.to_string()),
        attempt: Some(1),
        tenant: job.tenant(),
        ..Default::default()
    }
}

/// A job ready to be written anywhere (Kafka, an outbox row): its
/// Confluent-framed payload, its fresh id, its enqueue headers with the
/// producer span's trace context, and that span.
pub(crate) struct PreparedJob {
    pub payload: Vec<u8>,
    pub id: String,
    pub headers: JobHeaders,
    pub span: JobSpan,
}

/// Registers (or looks up) `J`'s contract for `topic`, encodes `job`, and
/// builds its headers and producer span, with a fresh id unless `id` gives
/// one (a cron tick's deterministic id). The one enqueue preparation,
/// shared by [`Producer::enqueue_to`] and the outbox.
///
/// `operation` is the messaging operation, `send` (to Kafka) or `create`
/// (an outbox row, sent later), and names the span with `topic`;
/// `bootstrap`, the servers written to, gives `server.address`.
pub(crate) async fn prepare_job<J: Job>(
    codec: &Codec,
    topic: &str,
    job: &J,
    operation: &'static str,
    bootstrap: Option<&str>,
    extra: Option<KeyValue>,
    id: Option<String>,
) -> Result<PreparedJob> {
    let contract = codec.register::<J>(topic).await?;
    let payload = Codec::encode(&contract, job)?;
    let id = id.unwrap_or_else(new_job_id);
    let span = JobSpan::producer(operation, topic, || {
        let mut attrs = vec![
            KeyValue::new("messaging.system", "kafka"),
            KeyValue::new("messaging.operation.name", operation),
            KeyValue::new("messaging.operation.type", operation),
            KeyValue::new("messaging.destination.name", topic.to_string()),
            KeyValue::new("messaging.kafka.message.key", job.key()),
            KeyValue::new("messaging.message.id", id.clone()),
            KeyValue::new("kjob.job", J::NAME),
            KeyValue::new("kjob.version", i64::from(J::VERSION)),
        ];
        attrs.extend(bootstrap.map(spans::server_attributes).unwrap_or_default());
        attrs.extend(extra);
        attrs
    });
    let mut headers = enqueue_headers(job, &id);
    span.inject(&mut headers);
    Ok(PreparedJob {
        payload,
        id,
        headers,
        span,
    })
}

/// A producer span's `error.type`: `permanent` when the broker refused the
/// record for good (too large, not authorized, invalid), `transient`
/// otherwise (a timeout, an unreachable broker).
fn send_error_type(e: &Error) -> &'static str {
    if e.is_permanent() {
        "permanent"
    } else {
        "transient"
    }
}

/// Where an enqueued job landed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enqueued {
    /// The job id (`kjob-id`).
    pub id: String,
    /// Topic written to.
    pub topic: String,
    /// Partition the broker acknowledged.
    pub partition: i32,
    /// Offset the broker acknowledged.
    pub offset: i64,
}

/// The producer-side size cap kjob sets (64 MiB): far above any broker
/// default, so the target topic's `max.message.bytes` is what limits a
/// forward, and a refusal is reported by the broker with its reason.
pub const MAX_MESSAGE_BYTES: &str = "67108864";

/// Default `delivery.timeout.ms`: how long an enqueue may wait for the broker.
pub const DEFAULT_DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// A handle for enqueueing jobs. Cheap to clone; share one per process.
#[derive(Clone)]
pub struct Producer {
    inner: FutureProducer,
    codec: Arc<Codec>,
    delivery_timeout: Duration,
    bootstrap: String,
    /// Delay topics' existence and `retention.ms`, cached.
    delay_topics: DelayTopicCheck,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("bootstrap", &self.bootstrap)
            .field("delivery_timeout", &self.delivery_timeout)
            .finish()
    }
}

impl Producer {
    /// A producer with the default delivery timeout.
    pub fn new(config: &KafkaConfig) -> Result<Self> {
        Self::with_delivery_timeout(config, DEFAULT_DELIVERY_TIMEOUT)
    }

    /// A producer whose enqueue gives up after `timeout` without a broker
    /// acknowledgement (librdkafka's `delivery.timeout.ms`).
    pub fn with_delivery_timeout(config: &KafkaConfig, timeout: Duration) -> Result<Self> {
        let codec = Arc::new(Codec::from_config(config)?);
        Self::with_codec(config, codec, timeout)
    }

    /// A producer sharing an existing registry client (and its caches).
    pub fn with_codec(config: &KafkaConfig, codec: Arc<Codec>, timeout: Duration) -> Result<Self> {
        let timeout_ms = timeout.as_millis().max(1).to_string();
        let inner: FutureProducer = config
            .client_config(&[
                ("acks", "all"),
                ("enable.idempotence", "true"),
                ("delivery.timeout.ms", &timeout_ms),
                ("linger.ms", "5"),
                ("compression.type", "lz4"),
                // librdkafka's own 1 000 000-byte cap is below the broker's
                // default (1 048 588), so a record a Java producer wrote to
                // a main topic could not be forwarded to its tier or DLQ.
                // The broker and the topic's max.message.bytes decide.
                ("message.max.bytes", MAX_MESSAGE_BYTES),
            ])
            .create()
            .map_err(|e| Error::kafka("creating producer", e))?;
        Ok(Self {
            inner,
            codec,
            delivery_timeout: timeout,
            bootstrap: config.bootstrap_servers.clone(),
            delay_topics: DelayTopicCheck::new(config),
        })
    }

    /// Writes delayed jobs to the shared delay buckets
    /// `<namespace>.delay.<bucket>` (naming each job's route in
    /// `kjob-route`) instead of the route's own `<topic>.delay.<bucket>`:
    /// the layout of workers built with
    /// [`SharedTiers::delay_buckets`](crate::SharedTiers::delay_buckets),
    /// whose namespace is their group unless they name another.
    pub fn shared_delay_buckets(mut self, namespace: &str) -> Self {
        self.delay_topics.share(namespace);
        self
    }

    /// The registry client this producer encodes with.
    pub fn codec(&self) -> &Arc<Codec> {
        &self.codec
    }

    /// The bootstrap servers, for spans' `server.address`.
    pub(crate) fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// The connection settings it was made with.
    pub(crate) fn config(&self) -> &KafkaConfig {
        &self.delay_topics.config
    }

    /// The underlying rdkafka producer: the outbox relay sends through it
    /// without waiting per record, to keep its batches in flight; the
    /// strict-order state enqueues through it under a lock.
    pub(crate) fn raw(&self) -> &FutureProducer {
        &self.inner
    }

    /// Registers `J`'s compiled-in schema for its main topic (`J::NAME`)
    /// now, so an incompatible contract fails at startup rather than at the
    /// first job. A producer that enqueues to another topic
    /// ([`Producer::enqueue_to`], a route on `handle_on`) prepares that one
    /// with [`Producer::prepare_to`]: the subject is the topic's, not the
    /// contract's.
    pub async fn prepare<J: Job>(&self) -> Result<()> {
        self.prepare_to::<J>(J::NAME).await
    }

    /// Registers `J`'s compiled-in schema under `topic`'s subject
    /// (`<topic>-value`) now: a contract the registry refuses there fails
    /// this call, naming the subject, the versions and the field.
    pub async fn prepare_to<J: Job>(&self, topic: &str) -> Result<()> {
        self.codec.register::<J>(topic).await.map(|_| ())
    }

    /// Enqueues a job on its main topic (`J::NAME`).
    pub async fn enqueue<J: Job>(&self, job: &J) -> Result<Enqueued> {
        self.enqueue_to(J::NAME, job).await
    }

    /// Enqueues a job on an explicit topic (tests, or a route renamed by
    /// configuration). The schema is registered under that topic's subject.
    pub async fn enqueue_to<J: Job>(&self, topic: &str, job: &J) -> Result<Enqueued> {
        self.enqueue_with_id_to(topic, job, None).await
    }

    /// [`Producer::enqueue_to`] with a job id of the caller's choosing, for
    /// jobs whose identity is known up front (a cron tick,
    /// `cron:<name>:<tick>`): enqueueing it twice gives two records with
    /// one id, which `PgMarkers` recognises as a duplicate.
    pub async fn enqueue_with_id_to<J: Job>(
        &self,
        topic: &str,
        job: &J,
        id: Option<String>,
    ) -> Result<Enqueued> {
        let prepared = prepare_job(
            &self.codec,
            topic,
            job,
            "send",
            Some(&self.bootstrap),
            None,
            id,
        )
        .await?;
        self.send_prepared(topic, &job.key(), prepared).await
    }

    /// Writes a prepared job with `key` and waits for the broker, closing
    /// its producer span with where it landed (or why not).
    pub(crate) async fn send_prepared(
        &self,
        topic: &str,
        key: &str,
        prepared: PreparedJob,
    ) -> Result<Enqueued> {
        let PreparedJob {
            payload,
            id,
            headers,
            span,
        } = prepared;
        let sent = self
            .send_raw(
                topic,
                Some(key.as_bytes()),
                Some(&payload),
                headers.to_owned_headers(),
            )
            .await;
        let (partition, offset) = match sent {
            Ok(at) => at,
            Err(e) => {
                span.fail(send_error_type(&e), &e.to_string());
                return Err(e);
            }
        };
        span.set(KeyValue::new(
            "messaging.destination.partition.id",
            partition.to_string(),
        ));
        span.set(KeyValue::new("messaging.kafka.offset", offset));
        Ok(Enqueued {
            id,
            topic: topic.to_string(),
            partition,
            offset,
        })
    }

    /// Enqueues many jobs concurrently (librdkafka batches them) and returns
    /// one result per job, in input order, so a caller can tell exactly which
    /// jobs the broker did not take.
    pub async fn enqueue_batch<J: Job>(&self, jobs: &[J]) -> Vec<Result<Enqueued>> {
        self.enqueue_batch_to(J::NAME, jobs).await
    }

    /// [`Producer::enqueue_batch`] on an explicit topic.
    pub async fn enqueue_batch_to<J: Job>(&self, topic: &str, jobs: &[J]) -> Vec<Result<Enqueued>> {
        join_all(jobs.iter().map(|j| self.enqueue_to(topic, j))).await
    }

    /// Produces already-encoded bytes and waits for the acknowledgement.
    /// Used for forwarding (retry, DLQ, re-drive), where the payload must
    /// travel unchanged. Hidden from the docs: it takes rdkafka's header
    /// type, and handler code has no reason to bypass the encoder.
    #[doc(hidden)]
    pub async fn send_raw(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
        headers: OwnedHeaders,
    ) -> Result<(i32, i64)> {
        self.send_raw_to(topic, None, key, payload, headers).await
    }

    /// [`Producer::send_raw`] to an explicit partition (`None`: the key
    /// picks it). Strict-order routes pin a key's forwards to its main
    /// partition's number, so one member owns all of the key's records.
    #[doc(hidden)]
    pub async fn send_raw_to(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
        headers: OwnedHeaders,
    ) -> Result<(i32, i64)> {
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(headers);
        if let Some(p) = partition {
            record = record.partition(p);
        }
        if let Some(p) = payload {
            record = record.payload(p);
        }
        if let Some(k) = key {
            record = record.key(k);
        }
        match self
            .inner
            .send(record, Timeout::After(self.delivery_timeout))
            .await
        {
            Ok(d) => Ok((d.partition, d.offset)),
            Err((e, _)) => Err(match rejection(&e) {
                Some((reason, hint)) => Error::Rejected {
                    topic: topic.to_string(),
                    reason,
                    message: e.to_string(),
                    hint,
                },
                None => Error::Delivery {
                    topic: topic.to_string(),
                    timeout: self.delivery_timeout,
                    bootstrap: self.bootstrap.clone(),
                    message: e.to_string(),
                },
            }),
        }
    }
}

/// Splits produce errors into permanent refusals (with their cause and a
/// fix) and everything else, which is transient and worth retrying.
fn rejection(e: &KafkaError) -> Option<(&'static str, &'static str)> {
    use RDKafkaErrorCode as C;
    let KafkaError::MessageProduction(code) = e else {
        return None;
    };
    Some(match code {
        C::MessageSizeTooLarge | C::InvalidMessageSize | C::MessageBatchTooLarge => (
            "record too large",
            "raise the topic's max.message.bytes, or read the original where the dead letter points",
        ),
        C::TopicAuthorizationFailed | C::ClusterAuthorizationFailed => (
            "not authorized",
            "grant WRITE on this topic to the worker's principal (kafka-acls --add --operation Write)",
        ),
        C::InvalidRecord | C::InvalidMessage | C::PolicyViolation => (
            "invalid record",
            "the broker's validation rejected it; see the broker log for the rule",
        ),
        C::InvalidTopic => ("invalid topic name", "check the route's topic name"),
        _ => return None,
    })
}
