//! After the decision ([`Next`]): the attempt is logged and counted, a
//! retry or dead letter is forwarded (and acknowledged) before the source
//! offset may be released, and strict order's chain for the key follows.

use rdkafka::message::Message;
use tracing::{debug, warn};

use super::decision::{Next, Outcome};
use super::forward::Forwarder;
use super::state::{RouteEntry, WorkerStats};
use super::strict::{self, Gate};
use crate::classify::ErrorClass;
use crate::telemetry::spans::JobSpan;

/// The attempt being settled, as its log lines name it.
pub(super) struct Attempt<'a> {
    pub(super) id: &'a str,
    pub(super) job: &'static str,
    pub(super) attempt: u32,
    pub(super) duration_ms: u64,
    pub(super) span: &'a JobSpan,
}

/// Carries out `next` for `msg`, under strict order when `gate` is set.
pub(super) async fn settle<M: Message>(
    fw: &Forwarder,
    entry: &RouteEntry,
    msg: &M,
    next: Next,
    gate: Option<Gate<'_, '_>>,
    a: &Attempt<'_>,
) -> Outcome {
    let (id, job, attempt, duration_ms) = (a.id, a.job, a.attempt, a.duration_ms);
    let at = At(msg);
    // A finished job leaves its key's chain (strict order), so the next
    // one can run; if that state write fails, the record is re-delivered.
    let finished = |outcome: Outcome| async move {
        match gate {
            Some(g) if !g.finished(&entry.main, id).await => Outcome::Released,
            _ => outcome,
        }
    };
    match next {
        Next::Released => Outcome::Released,
        Next::Done => {
            WorkerStats::bump(&fw.stats.handled);
            fw.metrics.outcome(job, "ok");
            debug!(job.id = %id, job.type = job, attempt, at = %at, duration_ms, outcome = "ok", "job handled");
            finished(Outcome::Handled).await
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
            a.span.fail(
                class.as_str(),
                headers.error.as_deref().unwrap_or("retryable failure"),
            );
            a.span.inject(&mut headers);
            if let Some(g) = gate {
                // It heads its key's chain before it is in the tier.
                strict::set_follows(&mut headers, None);
                if !g.retrying(&entry.main, id, headers.due_at_ms).await {
                    return Outcome::Released;
                }
            }
            let pin = gate.map(|g| g.partition());
            let outcome =
                Box::pin(fw.forward_as(&topic, &entry.main, msg, &headers, pin, Outcome::Retried))
                    .await;
            match outcome {
                Outcome::Retried => {
                    fw.metrics.outcome(job, "retried");
                    outcome
                }
                Outcome::DeadLettered => {
                    fw.metrics.outcome(job, "dead_lettered");
                    finished(outcome).await
                }
                other => other,
            }
        }
        Next::DeadLetter {
            topic,
            mut headers,
            class,
            message,
        } => {
            let label = match class {
                ErrorClass::Panic => "panicked",
                _ => "dead_lettered",
            };
            warn!(
                job.id = %id, job.type = job, attempt, at = %at, duration_ms, outcome = label,
                class = class.as_str(), error = %message, dlq = %topic, "dead-lettering"
            );
            a.span.fail(class.as_str(), &message);
            a.span.inject(&mut headers);
            if gate.is_some() {
                // It no longer waits behind anything.
                strict::set_follows(&mut headers, None);
            }
            let outcome = Box::pin(fw.forward_as(
                &topic,
                &entry.main,
                msg,
                &headers,
                None,
                Outcome::DeadLettered,
            ))
            .await;
            if outcome != Outcome::DeadLettered {
                return outcome;
            }
            if class == ErrorClass::Panic {
                WorkerStats::bump(&fw.stats.panicked);
            }
            fw.metrics.outcome(job, label);
            // A dead-lettered head leaves its chain: bad input never blocks
            // a key for good.
            finished(outcome).await
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
