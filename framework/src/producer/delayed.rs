//! Delayed jobs from the producer's side: `enqueue_in` / `enqueue_at`
//! write the job to the delay topic of its first hop, after checking that
//! the route's delay topics exist and keep records long enough
//! ([`DelayTopicCheck`], shared with the outbox relay).

use super::prepare_job;
use super::Enqueued;
use super::{send_error_type, PreparedJob, Producer};
use crate::config::KafkaConfig;
use crate::delay;
use crate::delay::DelayError;
use crate::error::Error;
use crate::error::Result;
use crate::headers::JobHeaders;
use crate::job::Job;
use opentelemetry::KeyValue;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;
use std::time::SystemTime;
use std::time::UNIX_EPOCH;

/// Whether a delayed job's delay topics exist and keep records long
/// enough, with their `retention.ms` cached for [`RETENTION_CACHE`], so a
/// burst of delayed enqueues asks the cluster once a minute, not per job.
/// Shared by [`Producer::check_delay_topics`] and the outbox relay (which
/// checks with its plain connection settings: the relay's producer
/// settings do not make an admin client).
#[derive(Clone)]
pub(crate) struct DelayTopicCheck {
    pub(super) config: KafkaConfig,
    /// The namespace of shared delay buckets (`<ns>.delay.<bucket>`), when
    /// the workers share them (`SharedTiers::delay_buckets`); else each
    /// route's own (`<main>.delay.<bucket>`).
    namespace: Option<Arc<str>>,
    /// An async lock: concurrent delayed enqueues wait for one reading
    /// instead of each asking the cluster.
    retention: Arc<tokio::sync::Mutex<HashMap<String, (Instant, i64)>>>,
}

impl DelayTopicCheck {
    pub(crate) fn new(config: &KafkaConfig) -> Self {
        Self {
            config: config.clone(),
            namespace: None,
            retention: Arc::default(),
        }
    }

    /// Writes to the shared delay buckets of `namespace` from now on.
    pub(crate) fn share(&mut self, namespace: &str) {
        self.namespace = Some(Arc::from(namespace));
        self.retention = Arc::default();
    }

    /// Whether jobs go to shared delay buckets (and name their route).
    pub(crate) fn is_shared(&self) -> bool {
        self.namespace.is_some()
    }

    /// The delay topic of bucket `bucket` for a job of main topic `main`.
    pub(crate) fn topic(&self, main: &str, bucket: usize) -> String {
        delay::delay_topic(self.namespace.as_deref().unwrap_or(main), bucket)
    }

    /// Where a job of `main` due at `run_at_ms` is written at `now_ms`,
    /// with the headers that takes: its run time, and for a bucket its
    /// release (`kjob-due-at`) and, in a shared bucket, its route
    /// (`kjob-route`). Due too soon for any bucket, it is the main topic,
    /// where the worker waits out the rest (in a bucket it would wait
    /// behind records due up to a bucket later). One rule for the
    /// producer, `kjob enqueue` and the outbox relay.
    pub(crate) fn first_hop(
        &self,
        main: &str,
        now_ms: i64,
        run_at_ms: i64,
        headers: &mut JobHeaders,
    ) -> String {
        headers.run_at_ms = Some(run_at_ms);
        let Some(hop) = delay::first_hop(now_ms, run_at_ms) else {
            return main.to_string();
        };
        headers.due_at_ms = Some(hop.release_ms);
        if self.is_shared() {
            headers.set_route(main);
        }
        self.topic(main, hop.bucket)
    }

    /// See [`Producer::check_delay_topics`].
    pub(crate) async fn check(&self, main: &str, now_ms: i64, run_at_ms: i64) -> Result<()> {
        let mut buckets = delay::path(now_ms, run_at_ms);
        buckets.sort_unstable();
        buckets.dedup();
        let err = |reason| Error::Delay {
            topic: main.to_string(),
            reason,
        };
        let topics: Vec<(usize, String)> =
            buckets.iter().map(|b| (*b, self.topic(main, *b))).collect();
        let mut cache = self.retention.lock().await;
        let unknown: Vec<String> = {
            topics
                .iter()
                .filter(|(_, t)| {
                    cache
                        .get(t)
                        .is_none_or(|(at, _)| at.elapsed() >= RETENTION_CACHE)
                })
                .map(|(_, t)| t.clone())
                .collect()
        };
        if !unknown.is_empty() {
            let counts = crate::topics::partition_counts_async(&self.config, &unknown).await?;
            if let Some((t, _)) = unknown.iter().zip(&counts).find(|(_, c)| c.is_none()) {
                return Err(err(match &self.namespace {
                    Some(ns) => DelayError::NoSharedTopic {
                        topic: t.clone(),
                        namespace: ns.to_string(),
                    },
                    None => DelayError::NoTopic {
                        topic: t.clone(),
                        main: main.to_string(),
                    },
                }));
            }
            let read = crate::topics::retention_ms(&self.config, &unknown).await;
            for (t, r) in unknown.iter().zip(read) {
                match r {
                    Ok(ms) => {
                        cache.insert(t.clone(), (Instant::now(), ms));
                    }
                    Err(reason) => {
                        return Err(err(DelayError::RetentionUnknown {
                            topic: t.clone(),
                            reason,
                        }))
                    }
                }
            }
        }
        for (b, t) in &topics {
            let ms = cache.get(t).map_or(-1, |(_, ms)| *ms);
            delay::check_retention(t, *b, ms).map_err(err)?;
        }
        Ok(())
    }
}

/// How long a delay topic's retention, once read, is trusted.
const RETENTION_CACHE: Duration = Duration::from_secs(60);

/// Milliseconds since the epoch of `t` (0 before the epoch).
pub(super) fn epoch_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Producer {
    /// Enqueues a job on its main topic to run `delay` from now (Celery's
    /// `countdown`, Sidekiq's `perform_in`): never earlier, typically a few
    /// milliseconds later. Any delay up to 30 days; see [`crate::delay`]
    /// for how it waits (delay topics, no side database) and what it means
    /// for per-key order (a delayed job does not block its key).
    pub async fn enqueue_in<J: Job>(&self, job: &J, delay: Duration) -> Result<Enqueued> {
        self.enqueue_in_to(J::NAME, job, delay).await
    }

    /// Enqueues a job on its main topic to run at `at` (Celery's `eta`). A
    /// time already passed runs as soon as a worker gets to it.
    pub async fn enqueue_at<J: Job>(&self, job: &J, at: SystemTime) -> Result<Enqueued> {
        self.enqueue_at_to(J::NAME, job, at).await
    }

    /// [`Producer::enqueue_in`] on an explicit main topic.
    pub async fn enqueue_in_to<J: Job>(
        &self,
        topic: &str,
        job: &J,
        delay: Duration,
    ) -> Result<Enqueued> {
        delay::check_delay(delay).map_err(|reason| Error::Delay {
            topic: topic.to_string(),
            reason,
        })?;
        let now_ms = epoch_ms(SystemTime::now());
        self.enqueue_delayed(topic, job, now_ms, now_ms + delay.as_millis() as i64)
            .await
    }

    /// [`Producer::enqueue_at`] on an explicit main topic. The job is
    /// encoded against `topic`'s subject, exactly as [`Producer::enqueue_to`]
    /// does, and written to the first of `topic`'s delay topics it passes.
    pub async fn enqueue_at_to<J: Job>(
        &self,
        topic: &str,
        job: &J,
        at: SystemTime,
    ) -> Result<Enqueued> {
        let now_ms = epoch_ms(SystemTime::now());
        self.enqueue_delayed(topic, job, now_ms, epoch_ms(at)).await
    }

    /// The delayed enqueue, from one reading of the clock (`now_ms`), so
    /// the first hop is planned from the same instant the delay counts from.
    pub(super) async fn enqueue_delayed<J: Job>(
        &self,
        topic: &str,
        job: &J,
        now_ms: i64,
        run_at_ms: i64,
    ) -> Result<Enqueued> {
        let delay = Duration::from_millis(run_at_ms.saturating_sub(now_ms).max(0) as u64);
        delay::check_delay(delay).map_err(|reason| Error::Delay {
            topic: topic.to_string(),
            reason,
        })?;
        self.check_delay_topics(topic, now_ms, run_at_ms).await?;
        let PreparedJob {
            payload,
            id,
            headers,
            span,
        } = prepare_job(
            &self.codec,
            topic,
            job,
            "send",
            Some(&self.bootstrap),
            Some(KeyValue::new("kjob.run_at_ms", run_at_ms)),
            None,
        )
        .await?;
        let key = job.key();
        match self
            .send_delayed_from(
                now_ms,
                topic,
                Some(key.as_bytes()),
                &payload,
                headers,
                run_at_ms,
            )
            .await
        {
            Ok((delay_topic, partition, offset)) => {
                // The span names the main topic; the record is in the
                // first delay topic on the way.
                span.set(KeyValue::new("kjob.topic", delay_topic.clone()));
                span.set(KeyValue::new(
                    "messaging.destination.partition.id",
                    partition.to_string(),
                ));
                span.set(KeyValue::new("messaging.kafka.offset", offset));
                Ok(Enqueued {
                    id,
                    topic: delay_topic,
                    partition,
                    offset,
                })
            }
            Err(e) => {
                span.fail(send_error_type(&e), &e.to_string());
                Err(e)
            }
        }
    }

    /// Writes an encoded job (its enqueue headers already built) to the
    /// first delay topic of main topic `main`, to run at `run_at_ms`, and
    /// returns the topic, partition and offset. The CLI's `kjob enqueue
    /// --in` uses it; call [`Producer::check_delay_topics`] first.
    pub async fn send_delayed(
        &self,
        main: &str,
        key: Option<&[u8]>,
        payload: &[u8],
        headers: JobHeaders,
        run_at_ms: i64,
    ) -> Result<(String, i32, i64)> {
        let now_ms = epoch_ms(SystemTime::now());
        self.send_delayed_from(now_ms, main, key, payload, headers, run_at_ms)
            .await
    }

    pub(super) async fn send_delayed_from(
        &self,
        now_ms: i64,
        main: &str,
        key: Option<&[u8]>,
        payload: &[u8],
        mut headers: JobHeaders,
        run_at_ms: i64,
    ) -> Result<(String, i32, i64)> {
        let target = self
            .delay_topics
            .first_hop(main, now_ms, run_at_ms, &mut headers);
        let (partition, offset) = self
            .send_raw(&target, key, Some(payload), headers.to_owned_headers())
            .await?;
        Ok((target, partition, offset))
    }

    /// Checks, before anything is written, that every delay topic a job
    /// enqueued now for `run_at_ms` passes through exists and keeps records
    /// long enough ([`delay::check_retention`]).
    pub async fn check_delay_topics(&self, main: &str, now_ms: i64, run_at_ms: i64) -> Result<()> {
        self.delay_topics.check(main, now_ms, run_at_ms).await
    }
}
