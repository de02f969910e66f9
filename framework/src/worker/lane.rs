//! Running records: one tokio task per ordering lane.
//!
//! A lane is a sequence of records that must run one after another (same
//! key, same partition, or a single record in unordered mode). The task runs
//! the head record to a *final* outcome (handled, or dead-lettered and
//! acknowledged), marks its offset done, then takes the next record of the
//! lane. Retries happen inside the task with backoff, so the record's offset
//! stays in flight and the commit watermark cannot pass it, while other lanes
//! and partitions keep flowing and the poll thread keeps polling.

use std::sync::Arc;

use rdkafka::message::{Message, OwnedMessage};
use tracing::{debug, error, warn};

use super::route::Attempt;
use super::state::{LaneKey, Shared, Tp, WorkerStats};
use crate::classify::ErrorClass;
use crate::dlq::forward_headers;
use crate::headers::JobHeaders;
use crate::job::JobContext;
use crate::topics::dlq_topic;

/// Runs a lane until its queue is empty (or the partition is revoked, or the
/// worker stops).
pub(crate) async fn run_lane(
    shared: Arc<Shared>,
    tp: Tp,
    epoch: u64,
    lane: LaneKey,
    first: OwnedMessage,
) {
    let mut msg = first;
    loop {
        let finished = process(&shared, &msg).await;
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
            let resume = p.paused && !p.revoked && p.tracker.in_flight() <= resume_below;
            if resume {
                p.paused = false;
                st.to_resume.push(tp.clone());
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

/// Runs one record to a final outcome. Returns `true` when the offset may be
/// marked done (handled, or safely in the DLQ), `false` when the worker is
/// stopping and the record must be re-delivered instead.
async fn process(shared: &Shared, msg: &OwnedMessage) -> bool {
    let Some(route) = shared.routes.get(msg.topic()) else {
        // Unreachable: the consumer subscribes to route topics only. Do not
        // mark it done, so it is never lost.
        error!(topic = msg.topic(), "record from a topic without a route");
        return false;
    };
    let headers = JobHeaders::parse(msg.headers());
    let mut attempt = headers.attempt.unwrap_or(1).max(1);
    loop {
        let ctx = JobContext {
            id: headers.id.clone().unwrap_or_default(),
            job: headers
                .job
                .clone()
                .unwrap_or_else(|| route.job_name().to_string()),
            version: headers.version,
            attempt,
            topic: msg.topic().to_string(),
            partition: msg.partition(),
            offset: msg.offset(),
            key: msg.key().map(|k| String::from_utf8_lossy(k).into_owned()),
            timestamp_ms: msg.timestamp().to_millis(),
            tenant: headers.tenant.clone(),
            group: shared.settings.group.clone(),
        };
        let outcome = {
            let Ok(_permit) = shared.concurrency.acquire().await else {
                return false;
            };
            route.run(msg.payload(), ctx).await
        };
        let (class, message, retry_after) = match outcome {
            Attempt::Done => {
                WorkerStats::bump(&shared.stats.handled);
                debug!(
                    topic = msg.topic(),
                    partition = msg.partition(),
                    offset = msg.offset(),
                    attempt,
                    "handled"
                );
                return true;
            }
            Attempt::Failed {
                class,
                message,
                retry_after,
            } => (class, message, retry_after),
        };
        if class.is_retryable() && shared.settings.retry.allows_another(attempt) {
            let wait = shared
                .settings
                .retry
                .backoff(attempt, retry_after, rand::random::<f64>());
            WorkerStats::bump(&shared.stats.retried);
            warn!(
                topic = msg.topic(), partition = msg.partition(), offset = msg.offset(),
                attempt, class = class.as_str(), error = %message, wait_ms = wait.as_millis() as u64,
                "attempt failed; retrying"
            );
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shared.cancel.cancelled() => return false,
            }
            attempt += 1;
            continue;
        }
        let (class, message) = if class.is_retryable() {
            (
                ErrorClass::RetriesExhausted,
                format!("gave up after {attempt} attempts; last failure {class}: {message}"),
            )
        } else {
            (class, message)
        };
        return dead_letter(shared, msg, attempt, class, &message).await;
    }
}

/// Writes the record to its DLQ and waits for the acknowledgement, retrying
/// the write until it succeeds or the worker is told to give up. Only an
/// acknowledged dead letter releases the source offset.
async fn dead_letter(
    shared: &Shared,
    msg: &OwnedMessage,
    attempt: u32,
    class: ErrorClass,
    message: &str,
) -> bool {
    let target = dlq_topic(msg.topic());
    let headers = forward_headers(
        msg,
        &shared.settings.group,
        attempt,
        class.as_str(),
        message,
    );
    warn!(
        topic = msg.topic(), partition = msg.partition(), offset = msg.offset(),
        attempt, class = class.as_str(), error = %message, dlq = %target, "dead-lettering"
    );
    let mut wait = std::time::Duration::from_millis(200);
    loop {
        match shared
            .producer
            .send_raw(
                &target,
                msg.key(),
                msg.payload(),
                headers.to_owned_headers(),
            )
            .await
        {
            Ok(_) => {
                WorkerStats::bump(&shared.stats.dead_lettered);
                if class == ErrorClass::Panic {
                    WorkerStats::bump(&shared.stats.panicked);
                }
                return true;
            }
            Err(e) => {
                error!(dlq = %target, error = %e, "DLQ write failed; the source offset stays uncommitted and the write is retried");
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shared.cancel.cancelled() => return false,
                }
                wait = (wait * 2).min(std::time::Duration::from_secs(10));
            }
        }
    }
}
