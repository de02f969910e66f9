//! Running records: one tokio task per ordering lane.
//!
//! A lane is a sequence of records that must run one after another (same
//! key, same partition, or a single record in unordered mode). The task runs
//! the head record to a *final* outcome for this topic (handled, or forwarded
//! to a retry tier or the DLQ and acknowledged), marks its offset done, then
//! takes the next record of the lane. Nothing here sleeps: a retry waits in
//! its tier topic, not in the worker.

use std::sync::Arc;

use opentelemetry::trace::FutureExt as _;
use opentelemetry::KeyValue;
use rdkafka::message::{Message, OwnedMessage};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use crate::telemetry::spans::JobSpan;

use super::state::{LaneKey, Shared, Tp, WorkerStats};
use crate::classify::ErrorClass;
use crate::dlq::envelope_headers;
use crate::dlq::now_ms;
use crate::headers::JobHeaders;
use crate::job::JobContext;
use crate::routing::{next_step, Next};
use crate::topics::dlq_topic;

/// Runs a lane until its queue is empty (or the partition is revoked, or the
/// worker stops).
pub(crate) async fn run_lane(
    shared: Arc<Shared>,
    tp: Tp,
    epoch: u64,
    lane: LaneKey,
    first: OwnedMessage,
    cancel: CancellationToken,
) {
    let mut msg = first;
    loop {
        let finished = process(&shared, &msg, &cancel).await;
        let next = {
            let mut st = shared.lock();
            let resume_below = shared.settings.max_in_flight_per_partition / 2;
            let Some(p) = st.partitions.get_mut(&tp).filter(|p| p.epoch == epoch) else {
                // Revoked (and maybe re-assigned) while we ran: the offset is
                // not ours to mark any more; the new owner re-runs it.
                shared.changed.notify_all();
                return;
            };
            if finished {
                p.tracker.finish(msg.offset());
            }
            let stop = p.revoked || shared.is_stopping();
            let next = match p.lanes.get_mut(&lane) {
                Some(q) if !stop => q.pop_front(),
                _ => None,
            };
            if next.is_none() {
                p.lanes.remove(&lane);
                p.tasks.remove(&lane);
            }
            if p.paused && !p.revoked && p.tracker.in_flight() <= resume_below {
                p.paused = false;
                if !p.wants_pause() {
                    st.to_resume.push(tp.clone());
                }
            }
            shared.changed.notify_all();
            next
        };
        match next {
            Some(m) => msg = m,
            None => return,
        }
    }
}

/// The context a handler sees for `msg`. Shared with the test harness.
pub(crate) fn context_for(
    msg: &OwnedMessage,
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

/// Runs one record to a final outcome. Returns `true` when the offset may be
/// marked done (handled, or forwarded to a retry tier or the DLQ and
/// acknowledged), `false` when the worker is stopping or the partition was
/// revoked before the handler started, so the record must be re-delivered
/// instead.
async fn process(shared: &Shared, msg: &OwnedMessage, cancel: &CancellationToken) -> bool {
    let Some(entry) = shared.routes.get(msg.topic()) else {
        // Unreachable: the consumer subscribes to route topics only. Do not
        // mark it done, so it is never lost.
        error!(topic = msg.topic(), "record from a topic without a route");
        return false;
    };
    let headers = JobHeaders::parse(msg.headers());
    let ctx = context_for(
        msg,
        &headers,
        &shared.settings.group,
        entry.route.job_name(),
    );
    let attempt = ctx.attempt;
    let ctx_id = ctx.id.clone();
    // The route's static contract name: metric labels without allocation.
    let job: &'static str = entry.route.job_name();
    let span = handle_span(msg, &ctx, &headers, job);
    if let Some(due) = ctx.due_at_ms {
        shared
            .metrics
            .lateness(msg.topic(), ((now_ms() - due).max(0) as f64) / 1000.0);
    }
    let started = std::time::Instant::now();
    let outcome = {
        // Waiting for a slot is not running: a revoke or a shutdown must not
        // wait for it. The record stays uncommitted; the next owner runs it.
        let permit = tokio::select! {
            biased;
            _ = cancel.cancelled() => None,
            p = shared.concurrency.acquire() => p.ok(),
        };
        let Some(_permit) = permit else {
            return false;
        };
        shared.metrics.in_flight(job, 1);
        let run = entry.route.run(msg.payload(), ctx);
        let outcome = match span.context() {
            Some(cx) => run.with_context(cx.clone()).await,
            None => run.await,
        };
        shared.metrics.in_flight(job, -1);
        outcome
    };
    let elapsed = started.elapsed();
    shared.metrics.handler_seconds(job, elapsed.as_secs_f64());
    let next = next_step(
        &outcome,
        msg,
        &entry.main,
        &shared.settings.group,
        &entry.retry,
        attempt,
        rand::random::<f64>(),
        now_ms(),
    );
    let duration_ms = elapsed.as_millis() as u64;
    let id = ctx_id.as_str();
    match next {
        Next::Done => {
            WorkerStats::bump(&shared.stats.handled);
            shared.metrics.outcome(job, "ok");
            debug!(job.id = id, job.type = job, attempt, at = %format_args!("{}:{}", msg.partition(), msg.offset()), duration_ms, outcome = "ok", "job handled");
            true
        }
        Next::Retry {
            topic,
            mut headers,
            wait,
            class,
        } => {
            warn!(
                job.id = id, job.type = job, attempt, at = %format_args!("{}:{}", msg.partition(), msg.offset()), duration_ms, outcome = "retried",
                class = class.as_str(), error = headers.error.as_deref().unwrap_or(""), retry = %topic,
                wait_ms = wait.as_millis() as u64, "attempt failed; scheduled a retry"
            );
            span.fail(headers.error.as_deref().unwrap_or("retryable failure"));
            span.inject(&mut headers);
            match forward(shared, &topic, &entry.main, msg, &headers).await {
                Forwarded::Sent => {
                    WorkerStats::bump(&shared.stats.retried);
                    shared.metrics.outcome(job, "retried");
                    true
                }
                Forwarded::Enveloped => {
                    WorkerStats::bump(&shared.stats.dead_lettered);
                    shared.metrics.outcome(job, "dead_lettered");
                    true
                }
                Forwarded::Cancelled => false,
            }
        }
        Next::DeadLetter {
            topic,
            mut headers,
            class,
            message,
        } => {
            let outcome = if class == ErrorClass::Panic {
                "panicked"
            } else {
                "dead_lettered"
            };
            warn!(
                job.id = id, job.type = job, attempt, at = %format_args!("{}:{}", msg.partition(), msg.offset()), duration_ms, outcome,
                class = class.as_str(), error = %message, dlq = %topic, "dead-lettering"
            );
            span.fail(&message);
            span.inject(&mut headers);
            let sent = forward(shared, &topic, &entry.main, msg, &headers).await;
            if sent != Forwarded::Cancelled {
                WorkerStats::bump(&shared.stats.dead_lettered);
                if class == ErrorClass::Panic {
                    WorkerStats::bump(&shared.stats.panicked);
                }
                shared.metrics.outcome(job, outcome);
            }
            sent != Forwarded::Cancelled
        }
    }
}

/// The consumer span of one attempt, with OpenTelemetry messaging attributes,
/// continuing the trace carried in the record's `traceparent`.
fn handle_span(
    msg: &OwnedMessage,
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

/// How a forward ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Forwarded {
    /// Written to its target and acknowledged.
    Sent,
    /// The target refused the record for good; an envelope without the
    /// payload was dead-lettered and acknowledged instead.
    Enveloped,
    /// The worker gave up at the end of its grace period; not written.
    Cancelled,
}

/// Writes the record (payload and key unchanged, headers rebuilt) to
/// `target` and waits for the broker's acknowledgement. Only an acknowledged
/// forward releases the source offset: a crash in between yields a
/// duplicate, never a loss.
///
/// Transient failures (broker unreachable, timeouts) are retried with
/// backoff until the worker's grace period ends. A permanent refusal (the
/// record is too large for the target, the principal may not write there,
/// the broker rejects it as invalid) can never succeed, so instead of
/// blocking the partition forever the worker dead-letters an *envelope*:
/// every header, class `forward.rejected`, and the coordinates where the
/// original can still be read, without the payload. Only if the DLQ refuses
/// even that is the write retried until an operator fixes the cause, which
/// the log line names.
async fn forward(
    shared: &Shared,
    target: &str,
    main: &str,
    msg: &OwnedMessage,
    headers: &JobHeaders,
) -> Forwarded {
    let mut wait = std::time::Duration::from_millis(200);
    let mut envelope: Option<(String, JobHeaders)> = None;
    loop {
        let (topic, hdrs, payload) = match &envelope {
            None => (target, headers, msg.payload()),
            Some((dlq, h)) => (dlq.as_str(), h, None),
        };
        match shared
            .producer
            .send_raw(topic, msg.key(), payload, hdrs.to_owned_headers())
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
                    _ = shared.cancel.cancelled() => return Forwarded::Cancelled,
                }
                wait = (wait * 2).min(std::time::Duration::from_secs(10));
            }
        }
    }
}
