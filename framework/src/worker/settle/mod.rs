//! After the decision ([`Decision`]): the attempt is logged and counted, a
//! retry or dead letter is forwarded (and acknowledged) before the source
//! offset may be released, and strict order's chain for the key follows.
//!
//! The room of step 9 in ARCHITECTURE.md. **Enters:** the decision's
//! [`Decision`] for an attempt. **Leaves:** the forward written and
//! acknowledged (`forward`), the attempt counted and logged, and its
//! offset finished for the scheduler, which moves the watermark (step 10).

pub(in crate::worker) mod forward;

use rdkafka::message::Message;
use tracing::{debug, warn};

use crate::classify::ErrorClass;
use crate::telemetry::spans::JobSpan;
use crate::worker::before::strict::{self, Gate};
use crate::worker::decision::{next_step, Decision, Outcome};
use crate::worker::handler::route::Attempt;
use crate::worker::settle::forward::Forwarder;
use crate::worker::state::{RouteEntry, WorkerStats};

/// The attempt being settled, as its log lines name it.
pub(super) struct AttemptLog<'a> {
    pub(super) id: &'a str,
    pub(super) job: &'static str,
    pub(super) attempt: u32,
    pub(super) duration_ms: u64,
    pub(super) span: &'a JobSpan,
}

/// How an attempt settles: at once, or through a forward still to await.
pub(super) enum Settling<F> {
    /// A job done outside strict order: counted and logged, nothing to
    /// await (nearly every attempt).
    Now(Outcome),
    /// A retry, a dead letter, a release or strict order's chain: boxed,
    /// so its state (a forward, a state write) is not part of every
    /// attempt's future, which stays small enough to move and allocate
    /// cheaply.
    Later(std::pin::Pin<Box<F>>),
}

/// Decides where the attempt's `result` sends `msg` ([`next_step`]) and
/// settles it: without an await when it is done outside strict order.
/// Synchronous, so the decision's values never live in the attempt's
/// future. `unit` is the jitter's draw; `failed_at_ms` when it ended.
#[allow(clippy::too_many_arguments)]
pub(super) fn decide<'a, M: Message>(
    fw: &'a Forwarder,
    entry: &'a RouteEntry,
    msg: &'a M,
    result: Attempt,
    gate: Option<Gate<'a, 'a>>,
    a: AttemptLog<'a>,
    unit: f64,
    failed_at_ms: i64,
) -> Settling<impl std::future::Future<Output = Outcome> + 'a> {
    let next = next_step(
        &result,
        msg,
        &entry.main,
        &entry.tiers_at,
        &fw.group,
        &entry.retry,
        a.attempt,
        unit,
        failed_at_ms,
    );
    match (next, gate) {
        (Decision::Handled, None) => Settling::Now(done(fw, msg, &a)),
        (next, gate) => {
            // A retry's or a dead letter's lines carry the job's fields,
            // as the handler's did.
            let log = crate::worker::handler::job_span::log_span(entry, msg, a.id, a.attempt);
            Settling::Later(Box::pin(tracing::Instrument::instrument(
                async move { settle(fw, entry, msg, next, gate, &a).await },
                log,
            )))
        }
    }
}

/// Carries out `next` for `msg`, under strict order when `gate` is set.
pub(super) async fn settle<M: Message>(
    fw: &Forwarder,
    entry: &RouteEntry,
    msg: &M,
    next: Decision,
    gate: Option<Gate<'_, '_>>,
    a: &AttemptLog<'_>,
) -> Outcome {
    let (id, job, attempt, duration_ms) = (a.id, a.job, a.attempt, a.duration_ms);
    let at = At(msg);
    // A finished job leaves its key's chain (strict order), so the next
    // one can run; if that state write fails, the record is re-delivered.
    // The gate's futures are boxed: strict order is rare, and unboxed its
    // state write would make every attempt's future kilobytes larger.
    let finished = |outcome: Outcome| async move {
        match gate {
            Some(g) if !Box::pin(g.finished(entry, id)).await => Outcome::Released,
            _ => outcome,
        }
    };
    match next {
        Decision::Released => Outcome::Released,
        Decision::Handled if gate.is_none() => done(fw, msg, a),
        Decision::Handled => {
            done(fw, msg, a);
            finished(Outcome::Handled).await
        }
        Decision::Retry {
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
                if !Box::pin(g.retrying(&entry.main, id, headers.due_at_ms, &topic)).await {
                    return Outcome::Released;
                }
            }
            let pin = gate.map(|g| g.partition());
            let outcome =
                Box::pin(fw.forward_as(&topic, &entry.main, msg, &headers, pin, Outcome::Retried))
                    .await;
            if let Some(g) = gate {
                g.forwarded(&entry.main);
            }
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
        Decision::DeadLetter {
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

/// Counts and logs a job its handler finished: all that settling a done
/// job outside strict order takes, with nothing to await.
pub(super) fn done<M: Message>(fw: &Forwarder, msg: &M, a: &AttemptLog<'_>) -> Outcome {
    let (id, job, attempt, duration_ms) = (a.id, a.job, a.attempt, a.duration_ms);
    WorkerStats::bump(&fw.stats.handled);
    fw.metrics.outcome(job, "ok");
    debug!(job.id = %id, job.type = job, attempt, at = %At(msg), duration_ms, outcome = "ok", "job handled");
    Outcome::Handled
}

/// `partition:offset` of a record, formatted only if a log line is written.
struct At<'a, M>(&'a M);

impl<M: Message> std::fmt::Display for At<'_, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.0.partition(), self.0.offset())
    }
}
