//! The attempt pipeline: one record, from bytes to a final outcome.
//!
//! decode with the route's contract → run the handler (timeout, panic
//! capture) → classify → [`next_step`] (done, next retry tier, or DLQ) →
//! forward and wait for the acknowledgement. The worker and the test harness
//! run exactly this; they differ only in where a forward goes (a [`Sink`]:
//! Kafka, or the harness's in-memory logs) and in the clock they pass.
//!
//! Nothing here sleeps: a retry waits in its tier topic, not in the worker.

use std::sync::Arc;

use futures::future::BoxFuture;
use opentelemetry::trace::FutureExt as _;
use opentelemetry::KeyValue;
use rdkafka::message::{Message, OwnedHeaders};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use super::decision::{next_step, Next};
use super::park::Waiter;
use super::state::{RouteEntry, WorkerStats};
use crate::classify::ErrorClass;
use crate::dlq::envelope_headers;
use crate::error::Result;
use crate::headers::JobHeaders;
use crate::job::JobContext;
use crate::producer::Producer;
use crate::telemetry::metrics::Metrics;
use crate::telemetry::spans::JobSpan;
use crate::topics::dlq_topic;

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

/// How one attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The handler returned `Ok`.
    Handled,
    /// Forwarded to a retry tier.
    Retried,
    /// A delayed job not due yet, forwarded to its next delay topic.
    Delayed,
    /// Forwarded to the DLQ (or an envelope of it).
    DeadLettered,
    /// Not run: parked in a retry tier behind its key's job in the retry
    /// path (a strict-order route, [`super::strict`]).
    Held,
    /// Not finished: the worker stopped (or the record has no route); the
    /// offset stays unfinished and the record is re-delivered.
    Abandoned,
}

impl Outcome {
    /// Whether the offset may be marked done.
    pub(crate) fn is_final(&self) -> bool {
        !matches!(self, Outcome::Abandoned)
    }
}

/// One attempt's result with what a report needs (the harness's).
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) struct Attempted {
    pub outcome: Outcome,
    /// The job id the handler saw.
    pub id: String,
    /// The contract name.
    pub job: &'static str,
    /// The attempt number.
    pub attempt: u32,
}

/// Everything an attempt needs besides the record.
pub(crate) struct Pipeline {
    pub routes: rustc_hash::FxHashMap<String, RouteEntry>,
    pub group: String,
    pub sink: Arc<dyn Sink>,
    pub metrics: Metrics,
    pub stats: Arc<WorkerStats>,
    /// Cancelled at the end of the shutdown grace period: forwards that are
    /// still retrying give up (the record is re-delivered).
    pub cancel: CancellationToken,
    /// The chains of the strict-order routes, if any ([`super::strict`]).
    pub strict: Option<Arc<super::strict::Strict>>,
    /// Where "now" comes from (the harness's is virtual).
    pub clock: crate::clock::Clock,
    /// Whether waiting jobs give their slot back ([`super::park`]); off
    /// only to measure what parking changes.
    pub park: bool,
}

/// The context a handler sees for `msg`.
pub(crate) fn context_for<M: Message>(
    msg: &M,
    headers: &JobHeaders,
    group: &str,
    job: &str,
) -> JobContext {
    JobContext {
        id: headers.job_id(msg.topic(), msg.partition(), msg.offset()),
        job: headers.job.clone().unwrap_or_else(|| job.to_string()),
        version: headers.version,
        attempt: headers.attempt.unwrap_or(1).max(1),
        topic: msg.topic().to_string(),
        partition: msg.partition(),
        offset: msg.offset(),
        key: msg.key().map(|k| String::from_utf8_lossy(k).into_owned()),
        timestamp_ms: msg.timestamp().to_millis(),
        tenant: headers.tenant.clone(),
        group: group.to_string(),
        due_at_ms: headers.due_at_ms,
    }
}

impl Pipeline {
    /// Runs one record to a final outcome at wall-clock time `now_ms`, with
    /// `unit` in `[0, 1)` for retry jitter (both parameters, so the harness
    /// is deterministic).
    /// `waiter` parks the job while it waits before its handler, and gives
    /// up when the job is released ([`super::park`]).
    pub(crate) async fn attempt<M: Message>(
        &self,
        msg: &M,
        waiter: &Waiter,
        unit: f64,
        now_ms: i64,
    ) -> Attempted {
        let Some(entry) = self.routes.get(msg.topic()) else {
            // Unreachable: the consumer subscribes to route topics only. Not
            // marked done, so it is never lost.
            error!(topic = msg.topic(), "record from a topic without a route");
            return Attempted {
                outcome: Outcome::Abandoned,
                id: String::new(),
                job: "",
                attempt: 0,
            };
        };
        let headers = JobHeaders::parse(msg.headers());
        let job: &'static str = entry.route.job_name();
        let mut now_ms = now_ms;
        if entry.delay.is_some() {
            // Boxed, like the forwards below: the rare paths' futures stay
            // out of every attempt's state, which is moved on each dispatch.
            if let Some(outcome) =
                Box::pin(self.delay_step(entry, msg, &headers, waiter, now_ms)).await
            {
                return Attempted {
                    outcome,
                    id: headers.job_id(msg.topic(), msg.partition(), msg.offset()),
                    job,
                    attempt: headers.attempt.unwrap_or(1).max(1),
                };
            }
            now_ms = now_ms.max(crate::dlq::now_ms());
        }
        if let Some(run_at) = headers
            .run_at_ms
            .filter(|r| entry.tier.is_some() && *r > now_ms)
        {
            // A Retry-After longer than the last tier: not due yet.
            if let Some(outcome) =
                Box::pin(self.tier_hop(entry, msg, &headers, waiter, now_ms, run_at)).await
            {
                return Attempted {
                    outcome,
                    id: headers.job_id(msg.topic(), msg.partition(), msg.offset()),
                    job,
                    attempt: headers.attempt.unwrap_or(1).max(1),
                };
            }
            now_ms = now_ms.max(self.clock.now_ms());
        }
        // Strict order (opt-in per route): a key's later jobs wait behind
        // its job in the retry path ([`super::strict`]).
        let strict = self.strict_key(entry, msg);
        if let Some(gate) = strict {
            let id = headers.job_id(msg.topic(), msg.partition(), msg.offset());
            let outcome = match gate.admit(&entry.main, &id).await {
                Ok(super::strict::Admit::Run) => None,
                Ok(super::strict::Admit::Follow {
                    head, head_due_ms, ..
                }) => {
                    Box::pin(self.park(entry, msg, &headers, &id, &head, head_due_ms, now_ms)).await
                }
                Err(_) => Some(Outcome::Abandoned),
            };
            if let Some(outcome) = outcome {
                return Attempted {
                    outcome,
                    id,
                    job,
                    attempt: headers.attempt.unwrap_or(1).max(1),
                };
            }
        }
        let mut ctx = context_for(msg, &headers, &self.group, job);
        if entry.delay.is_some() {
            // Its lateness is measured against the time it was asked for.
            ctx.due_at_ms = headers.run_at_ms.or(ctx.due_at_ms);
        }
        let attempt = ctx.attempt;
        let id = ctx.id.clone();
        let span = handle_span(msg, &ctx, &headers, job);
        if let Some(due) = ctx.due_at_ms {
            self.metrics
                .lateness(msg.topic(), ((now_ms - due).max(0) as f64) / 1000.0);
        }
        let started = std::time::Instant::now();
        self.metrics.in_flight(job, 1);
        let watched = super::watchdog::Watched {
            job,
            id: &id,
            key: msg.key(),
            topic: msg.topic(),
            partition: msg.partition(),
            offset: msg.offset(),
        };
        let run = entry.route.run(msg.payload(), ctx, waiter, &watched);
        let result = match span.context() {
            Some(cx) => run.with_context(cx.clone()).await,
            None => run.await,
        };
        self.metrics.in_flight(job, -1);
        if matches!(result, crate::worker::route::Attempt::Released) {
            // Never ran: no outcome to count; the next owner runs it.
            debug!(job.id = %id, job.type = job, attempt, at = %At(msg), "released before its handler started");
            return Attempted {
                outcome: Outcome::Abandoned,
                id,
                job,
                attempt,
            };
        }
        let elapsed = started.elapsed();
        self.metrics.handler_seconds(job, elapsed.as_secs_f64());
        // A retry's wait (a Retry-After above all) counts from the failure,
        // not from when the attempt began.
        let failed_at_ms = self.clock.now_ms().max(now_ms);
        let next = next_step(
            &result,
            msg,
            &entry.main,
            &self.group,
            &entry.retry,
            attempt,
            unit,
            failed_at_ms,
        );
        let duration_ms = elapsed.as_millis() as u64;
        if let Some(ts) = msg.timestamp().to_millis() {
            let done_ms = now_ms.saturating_add(duration_ms as i64);
            self.metrics
                .priority_latency(entry.priority, ((done_ms - ts).max(0) as f64) / 1000.0);
        }
        let at = At(msg);
        let outcome = match next {
            Next::Release => Outcome::Abandoned,
            Next::Done => {
                WorkerStats::bump(&self.stats.handled);
                self.metrics.outcome(job, "ok");
                debug!(job.id = %id, job.type = job, attempt, at = %at, duration_ms, outcome = "ok", "job handled");
                match strict {
                    Some(gate) if !gate.finished(&entry.main, &id).await => Outcome::Abandoned,
                    _ => Outcome::Handled,
                }
            }
            Next::Retry {
                topic,
                mut headers,
                wait,
                class,
            } => {
                warn!(
                    job.id = %id, job.type = job, attempt, at = %at, duration_ms, outcome = "retried",
                    class = class.as_str(), error = headers.error.as_deref().unwrap_or(""), retry = %topic,
                    wait_ms = wait.as_millis() as u64, "attempt failed; scheduled a retry"
                );
                span.fail(headers.error.as_deref().unwrap_or("retryable failure"));
                span.inject(&mut headers);
                if let Some(gate) = strict {
                    // It heads its key's chain before it is in the tier.
                    super::strict::set_follows(&mut headers, None);
                    if !gate.retrying(&entry.main, &id, headers.due_at_ms).await {
                        return Attempted {
                            outcome: Outcome::Abandoned,
                            id,
                            job,
                            attempt,
                        };
                    }
                }
                let pin = strict.map(|g| g.partition());
                match Box::pin(self.forward(&topic, &entry.main, msg, &headers, pin)).await {
                    Forwarded::Sent => {
                        WorkerStats::bump(&self.stats.retried);
                        self.metrics.outcome(job, "retried");
                        Outcome::Retried
                    }
                    Forwarded::Enveloped => {
                        WorkerStats::bump(&self.stats.dead_lettered);
                        self.metrics.outcome(job, "dead_lettered");
                        match strict {
                            Some(gate) if !gate.finished(&entry.main, &id).await => {
                                Outcome::Abandoned
                            }
                            _ => Outcome::DeadLettered,
                        }
                    }
                    Forwarded::Cancelled => Outcome::Abandoned,
                }
            }
            Next::DeadLetter {
                topic,
                mut headers,
                class,
                message,
            } => {
                let label = if class == ErrorClass::Panic {
                    "panicked"
                } else {
                    "dead_lettered"
                };
                warn!(
                    job.id = %id, job.type = job, attempt, at = %at, duration_ms, outcome = label,
                    class = class.as_str(), error = %message, dlq = %topic, "dead-lettering"
                );
                span.fail(&message);
                span.inject(&mut headers);
                if strict.is_some() {
                    // It no longer waits behind anything.
                    super::strict::set_follows(&mut headers, None);
                }
                match Box::pin(self.forward(&topic, &entry.main, msg, &headers, None)).await {
                    Forwarded::Cancelled => Outcome::Abandoned,
                    Forwarded::Sent | Forwarded::Enveloped => {
                        WorkerStats::bump(&self.stats.dead_lettered);
                        if class == ErrorClass::Panic {
                            WorkerStats::bump(&self.stats.panicked);
                        }
                        self.metrics.outcome(job, label);
                        // A dead-lettered head leaves its chain: bad input
                        // never blocks a key for good.
                        match strict {
                            Some(gate) if !gate.finished(&entry.main, &id).await => {
                                Outcome::Abandoned
                            }
                            _ => Outcome::DeadLettered,
                        }
                    }
                }
            }
        };
        Attempted {
            outcome,
            id,
            job,
            attempt,
        }
    }

    /// A record of a delay topic ([`crate::delay`]), released at its
    /// planned hop time: forwarded to the next delay topic while at least
    /// the shortest bucket is left (`Some(outcome)`), otherwise the
    /// sub-second remainder is waited out and `None` says "run it now".
    async fn delay_step<M: Message>(
        &self,
        entry: &RouteEntry,
        msg: &M,
        headers: &JobHeaders,
        waiter: &Waiter,
        now_ms: i64,
    ) -> Option<Outcome> {
        // Without a run time (a record written by hand) it is due now.
        let run_at = headers.run_at_ms?;
        let released_ms = headers.due_at_ms.unwrap_or(now_ms);
        if let Some(hop) = crate::delay::next_hop(released_ms, run_at) {
            let mut next = headers.clone();
            next.id = Some(headers.job_id(msg.topic(), msg.partition(), msg.offset()));
            next.due_at_ms = Some(hop.release_ms);
            // Only this group hops it on: another group reading the same
            // delay topic skips the record, as it skips our retries.
            next.group = Some(self.group.clone());
            let target = crate::delay::delay_topic(&entry.main, hop.bucket);
            debug!(job.id = next.id.as_deref().unwrap_or(""), at = %At(msg), next = %target, release_ms = hop.release_ms, run_at_ms = run_at, "delayed job hops on");
            return Some(
                match self.forward(&target, &entry.main, msg, &next, None).await {
                    Forwarded::Sent => {
                        WorkerStats::bump(&self.stats.delay_hops);
                        Outcome::Delayed
                    }
                    Forwarded::Enveloped => {
                        WorkerStats::bump(&self.stats.dead_lettered);
                        Outcome::DeadLettered
                    }
                    Forwarded::Cancelled => Outcome::Abandoned,
                },
            );
        }
        let wait = run_at - crate::dlq::now_ms();
        if wait > 0 {
            let due = tokio::time::sleep(std::time::Duration::from_millis(wait as u64));
            // Parked (no slot held); a revoke or stop releases it at once.
            if waiter.wait(due).await.is_none() {
                return Some(Outcome::Abandoned);
            }
        }
        None
    }

    /// A retry-tier record released before its run time (a `Retry-After`
    /// longer than the last tier, see [`crate::retry::RetryPlan::release`]):
    /// forwarded to the longest tier that does not overshoot what is left,
    /// its attempt unchanged (`Some(outcome)`), or, when less than the
    /// shortest tier is left, waited out parked (`None`: run it now).
    async fn tier_hop<M: Message>(
        &self,
        entry: &RouteEntry,
        msg: &M,
        headers: &JobHeaders,
        waiter: &Waiter,
        now_ms: i64,
        run_at: i64,
    ) -> Option<Outcome> {
        let left = std::time::Duration::from_millis((run_at - now_ms).max(0) as u64);
        let Some((tier, delay)) = entry
            .retry
            .hop(left)
            .and_then(|t| Some((t, entry.retry.tier_delay(t)?)))
        else {
            let due = tokio::time::sleep(left);
            return waiter
                .wait(due)
                .await
                .is_none()
                .then_some(Outcome::Abandoned);
        };
        let target = entry.retry.tier_topic(&entry.main, tier)?;
        let mut next = headers.clone();
        next.id = Some(headers.job_id(msg.topic(), msg.partition(), msg.offset()));
        next.due_at_ms = Some(now_ms + delay.as_millis() as i64);
        next.group = Some(self.group.clone());
        debug!(job.id = next.id.as_deref().unwrap_or(""), at = %At(msg), next = %target, run_at_ms = run_at, "retry not due yet hops on");
        Some(
            match self.forward(&target, &entry.main, msg, &next, None).await {
                Forwarded::Sent => {
                    WorkerStats::bump(&self.stats.delay_hops);
                    Outcome::Delayed
                }
                Forwarded::Enveloped => {
                    WorkerStats::bump(&self.stats.dead_lettered);
                    Outcome::DeadLettered
                }
                Forwarded::Cancelled => Outcome::Abandoned,
            },
        )
    }

    /// Writes the record (payload and key unchanged, headers rebuilt) to
    /// `target` and waits for the acknowledgement. Only an acknowledged
    /// forward releases the source offset: a crash in between yields a
    /// duplicate, never a loss.
    ///
    /// Transient failures (broker unreachable, timeouts) are retried with
    /// backoff until the worker's grace period ends. A permanent refusal
    /// (the record is too large for the target, the principal may not write
    /// there, the broker rejects it as invalid) can never succeed, so
    /// instead of blocking the partition forever the worker dead-letters an
    /// *envelope*: every header, class `forward.rejected`, and the
    /// coordinates where the original can still be read, without the
    /// payload. Only if the DLQ refuses even that is the write retried until
    /// an operator fixes the cause, which the log line names.
    pub(super) async fn forward<M: Message>(
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
        let named;
        let headers = match (&headers.job, self.routes.get(main)) {
            (None, Some(entry)) => {
                let mut h = headers.clone();
                h.job = Some(entry.route.job_name().to_string());
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
}

/// `partition:offset` of a record, formatted only if a log line is written.
struct At<'a, M>(&'a M);

impl<M: Message> std::fmt::Display for At<'_, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.0.partition(), self.0.offset())
    }
}

/// How a forward ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Forwarded {
    /// Written to its target and acknowledged.
    Sent,
    /// The target refused the record for good; an envelope without the
    /// payload was dead-lettered and acknowledged instead.
    Enveloped,
    /// The worker gave up at the end of its grace period; not written.
    Cancelled,
}

/// The consumer span of one attempt, with OpenTelemetry messaging attributes,
/// continuing the trace carried in the record's `traceparent`.
fn handle_span<M: Message>(
    msg: &M,
    ctx: &JobContext,
    headers: &JobHeaders,
    job: &'static str,
) -> JobSpan {
    JobSpan::consumer(headers, || {
        vec![
            KeyValue::new("messaging.system", "kafka"),
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.destination.name", msg.topic().to_string()),
            KeyValue::new(
                "messaging.destination.partition.id",
                i64::from(msg.partition()),
            ),
            KeyValue::new("messaging.kafka.offset", msg.offset()),
            KeyValue::new("messaging.consumer.group.name", ctx.group.clone()),
            KeyValue::new("messaging.message.id", ctx.id.clone()),
            KeyValue::new("kjob.job", job),
            KeyValue::new("kjob.version", i64::from(ctx.version.unwrap_or(0))),
            KeyValue::new("kjob.attempt", i64::from(ctx.attempt)),
        ]
    })
}
