//! The forward: a record written to a retry tier, a delay bucket or the
//! DLQ, with its acknowledgement awaited before the source offset may be
//! released (forward-then-commit: a crash in between yields a duplicate,
//! never a loss). The pipeline, its stages and strict order all forward
//! through the one [`Forwarder`].

use std::sync::Arc;

use futures::future::BoxFuture;
use rdkafka::message::{Message, OwnedHeaders};
use tokio_util::sync::CancellationToken;
use tracing::error;

use crate::dlq::envelope_headers;
use crate::error::Result;
use crate::headers::JobHeaders;
use crate::producer::Producer;
use crate::telemetry::metrics::Metrics;
use crate::topics::dlq_topic;
use crate::worker::decision::Outcome;
use crate::worker::state::{RouteEntry, WorkerStats};

/// Where forwarded records go: Kafka for the worker, memory for the harness.
pub(crate) trait Sink: Send + Sync {
    /// Writes a record and resolves once it is acknowledged.
    /// `partition` pins the record to that partition (strict-order
    /// routes keep a key on its main partition's number); `None` lets the
    /// key pick it.
    fn send<'a>(
        &'a self,
        topic: &'a str,
        partition: Option<i32>,
        key: Option<&'a [u8]>,
        payload: Option<&'a [u8]>,
        headers: OwnedHeaders,
    ) -> BoxFuture<'a, Result<(i32, i64)>>;
}

impl Sink for Producer {
    fn send<'a>(
        &'a self,
        topic: &'a str,
        partition: Option<i32>,
        key: Option<&'a [u8]>,
        payload: Option<&'a [u8]>,
        headers: OwnedHeaders,
    ) -> BoxFuture<'a, Result<(i32, i64)>> {
        Box::pin(self.send_raw_to(topic, partition, key, payload, headers))
    }
}

/// How a forward ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Forwarded {
    /// Written to its target and acknowledged.
    Sent,
    /// The target refused the record for good; an envelope without the
    /// payload was dead-lettered and acknowledged instead.
    Enveloped,
    /// The worker gave up at the end of its grace period; not written.
    Cancelled,
}

/// Forwards records, and counts what became of the attempts that did.
pub(crate) struct Forwarder {
    pub(crate) sink: Arc<dyn Sink>,
    /// The group whose view of the job a forward carries (`kjob-group`).
    pub(crate) group: String,
    pub(crate) stats: Arc<WorkerStats>,
    pub(crate) metrics: Metrics,
    /// Cancelled at the end of the shutdown grace period: forwards that are
    /// still retrying give up (the record is re-delivered).
    cancel: CancellationToken,
    /// Each main topic's contract name, for records that carry none.
    contracts: rustc_hash::FxHashMap<String, &'static str>,
}

impl Forwarder {
    /// A forwarder for the routes of `routes`.
    pub(crate) fn new(
        sink: Arc<dyn Sink>,
        group: String,
        stats: Arc<WorkerStats>,
        metrics: Metrics,
        cancel: CancellationToken,
        routes: &rustc_hash::FxHashMap<String, RouteEntry>,
    ) -> Self {
        let contracts = routes
            .values()
            .map(|e| (e.main.clone(), e.handler.job_name()))
            .collect();
        Self {
            sink,
            group,
            stats,
            metrics,
            cancel,
            contracts,
        }
    }

    pub(crate) async fn forward<M: Message>(
        &self,
        target: &str,
        main: &str,
        msg: &M,
        headers: &JobHeaders,
        partition: Option<i32>,
    ) -> Forwarded {
        // Every hop names its contract, as it carries its `kjob-id`: a
        // record from another producer has no `kjob-job` of its own, and
        // operators filter dead letters by it.
        // A topic not named after the route (a shared retry tier) holds
        // several routes' records: each names its own in `kjob-route`.
        let names_route = target
            .strip_prefix(main)
            .is_some_and(|rest| rest.starts_with('.'));
        let marked = !names_route && headers.route() != Some(main.as_bytes());
        let named;
        let headers = match (&headers.job, self.contracts.get(main)) {
            (job, contract) if marked || (job.is_none() && contract.is_some()) => {
                let mut h = headers.clone();
                if let (None, Some(job)) = (&h.job, contract) {
                    h.job = Some((*job).to_string());
                }
                if marked {
                    h.set_route(main);
                }
                named = h;
                &named
            }
            _ => headers,
        };
        let mut wait = std::time::Duration::from_millis(200);
        let mut envelope: Option<(String, JobHeaders)> = None;
        loop {
            let (topic, hdrs, payload, pin) = match &envelope {
                None => (target, headers, msg.payload(), partition),
                Some((dlq, h)) => (dlq.as_str(), h, None, None),
            };
            match self
                .sink
                .send(topic, pin, msg.key(), payload, hdrs.to_owned_headers())
                .await
            {
                Ok(_) if envelope.is_some() => return Forwarded::Enveloped,
                Ok(_) => return Forwarded::Sent,
                Err(e) if e.is_permanent() && envelope.is_none() => {
                    error!(
                        target, at = %format_args!("{}:{}:{}", msg.topic(), msg.partition(), msg.offset()),
                        cause = %e, "forward refused for good; dead-lettering an envelope without the payload"
                    );
                    envelope = Some((
                        dlq_topic(main),
                        envelope_headers(headers, msg, target, &e.to_string()),
                    ));
                }
                Err(e) => {
                    error!(topic, error = %e, "forward failed; the source offset stays uncommitted and the write is retried");
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = self.cancel.cancelled() => return Forwarded::Cancelled,
                    }
                    wait = (wait * 2).min(std::time::Duration::from_secs(10));
                }
            }
        }
    }

    /// Forwards the record and says what became of the attempt: `sent` once
    /// it is acknowledged, `DeadLettered` if an envelope went to the DLQ
    /// instead, `Released` if the worker gave up. The worker's counters
    /// follow the outcome.
    pub(crate) async fn forward_as<M: Message>(
        &self,
        target: &str,
        main: &str,
        msg: &M,
        headers: &JobHeaders,
        partition: Option<i32>,
        sent: Outcome,
    ) -> Outcome {
        let outcome = match self.forward(target, main, msg, headers, partition).await {
            Forwarded::Sent => sent,
            Forwarded::Enveloped => Outcome::DeadLettered,
            Forwarded::Cancelled => Outcome::Released,
        };
        let counter = match outcome {
            Outcome::Retried => Some(&self.stats.retried),
            Outcome::Delayed => Some(&self.stats.delay_hops),
            Outcome::Held => Some(&self.stats.held),
            Outcome::DeadLettered => Some(&self.stats.dead_lettered),
            Outcome::Handled
            | Outcome::Released
            | Outcome::Cancelled
            | Outcome::Superseded
            | Outcome::Duplicate => None,
        };
        if let Some(c) = counter {
            WorkerStats::bump(c);
        }
        outcome
    }
}
