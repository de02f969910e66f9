//! The records that end before their handler: an operator cancelled them,
//! a newer job of their key superseded them (debounce), a re-drive moved
//! them to another group, or no route of this worker takes them. Each is
//! finished, counted and logged; nothing runs.

use crate::headers::JobHeaders;
use crate::worker::before::park::Waiter;
use crate::worker::decision::next_step;
use crate::worker::decision::Outcome;
use crate::worker::handler::route::Attempt;
use crate::worker::pipeline::context::{context_for, handle_span};
use crate::worker::pipeline::Attempted;
use crate::worker::pipeline::Pipeline;
use crate::worker::settle::{self, settle};
use crate::worker::state::RouteEntry;
use crate::worker::state::TopicRole;
use crate::worker::state::WorkerStats;
use rdkafka::message::Message;
use std::sync::Arc;
use tracing::error;
use tracing::info;

impl Pipeline {
    /// Whether the record with `headers` of `entry` (a tier or delay topic)
    /// is a waiting job an operator cancelled.
    pub(super) fn is_cancelled(&self, entry: &RouteEntry, headers: &JobHeaders) -> bool {
        let (Some(in_force), Some(id), Some(due)) = (
            &self.in_force,
            headers.id.as_deref(),
            headers.run_at_ms.or(headers.due_at_ms),
        ) else {
            return false;
        };
        in_force.cancelled(&entry.main, id, due)
    }

    /// A debounced job: superseded at once if a newer job of its key was
    /// fetched, otherwise parked until `window` after it was written and
    /// checked again. `None`: it runs; `Released` if its partition went
    /// while it waited.
    pub(super) async fn debounced<M: Message>(
        &self,
        d: &crate::worker::before::debounce::Debounce,
        window: std::time::Duration,
        msg: &M,
        key: &[u8],
        waiter: &Waiter,
    ) -> Option<Outcome> {
        let (topic, partition, offset) = (msg.topic(), msg.partition(), msg.offset());
        if d.superseded(topic, partition, key, offset) {
            return Some(Outcome::Superseded);
        }
        let written = msg
            .timestamp()
            .to_millis()
            .unwrap_or_else(|| self.clock.now_ms());
        let left = written.saturating_add(window.as_millis() as i64) - self.clock.now_ms();
        if left > 0 {
            let sleep = tokio::time::sleep(std::time::Duration::from_millis(left as u64));
            if waiter.wait(sleep).await.is_none() {
                return Some(Outcome::Released);
            }
            if d.superseded(topic, partition, key, offset) {
                return Some(Outcome::Superseded);
            }
        }
        d.running(topic, partition, key, offset);
        None
    }

    /// Whether a main-topic record is a copy another group's operator moved
    /// to "now" ([`crate::headers::MOVED_FROM`]).
    pub(super) fn moved_for_another_group(&self, entry: &RouteEntry, headers: &JobHeaders) -> bool {
        entry.role == TopicRole::Main
            && headers.group.as_deref().is_some_and(|g| *g != *self.group)
            && headers
                .extra
                .iter()
                .any(|(k, _)| k == crate::headers::MOVED_FROM)
    }

    /// Finishes a cancelled waiting job without running it: counted,
    /// logged, out of its key's chain on a strict-order route, and
    /// recorded as not succeeded in its batch.
    pub(super) async fn cancelled<M: Message>(
        &self,
        entry: &RouteEntry,
        msg: &M,
        headers: &JobHeaders,
        job: &'static str,
    ) -> Outcome {
        let id = headers.id.as_deref().unwrap_or_default();
        if let Some(g) = self.strict.as_deref().and_then(|s| s.gate(entry, msg)) {
            if !g.finished(entry, id).await {
                return Outcome::Released;
            }
        }
        WorkerStats::bump(&self.fw.stats.cancelled);
        self.fw.metrics.outcome(job, "cancelled");
        info!(
            job.id = %id, job.type = job, topic = msg.topic(), partition = msg.partition(),
            offset = msg.offset(), outcome = "cancelled", "waiting job cancelled by an operator; not run"
        );
        if let (Some(recorder), Some(batch)) = (&self.batches, &headers.batch) {
            recorder.push(batch, id, false);
        }
        Outcome::Cancelled
    }

    /// A record in a shared retry tier or delay bucket that names no route of this worker
    /// (a hostile or mistaken `kjob-route`, or a route only newer workers
    /// serve, mid-deploy): dead-lettered into the DLQ of the route the
    /// tier's entry stands for, with an error that names the route, so it
    /// is neither lost nor run by the wrong handler. `kjob dlq retry`
    /// re-drives it once a worker serves that route.
    pub(super) async fn unrouted<M: Message>(
        &self,
        topic_entry: &RouteEntry,
        msg: &M,
        headers: JobHeaders,
    ) -> Attempted {
        let headers = &headers;
        let named = headers
            .route()
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .or_else(|| headers.original_topic.clone());
        let message = match &named {
            Some(route) => format!(
                "the shared topic `{}` holds a record of route `{}`, which this worker does not serve (its routes there: {}); run a worker with that route and re-drive it with `kjob dlq retry`",
                msg.topic(),
                crate::headers::truncate_utf8(route, 200),
                topic_entry.sharers.as_ref().map_or(String::new(), |s| {
                    let mut m: Vec<&str> = s.keys().map(String::as_str).collect();
                    m.sort_unstable();
                    m.join(", ")
                }),
            ),
            None => format!(
                "the shared topic `{}` holds a record that names no route (no `{}` header)",
                msg.topic(),
                crate::headers::ROUTE
            ),
        };
        error!(topic = msg.topic(), partition = msg.partition(), offset = msg.offset(), %message, "dead-lettering a record without a route of this worker");
        let attempt = headers.attempt.unwrap_or(1).max(1);
        let now_ms = self.clock.now_ms();
        let failed = Attempt::Failed {
            class: crate::ErrorClass::PermanentInvalidInput,
            message,
            retry_after: None,
            backtrace: None,
        };
        let next = next_step(
            &failed,
            msg,
            &topic_entry.main,
            &topic_entry.tiers_at,
            &self.fw.group,
            &topic_entry.retry,
            attempt,
            0.0,
            now_ms,
        );
        let job = topic_entry.handler.job_name();
        let id = headers.job_id(msg.topic(), msg.partition(), msg.offset());
        let view = headers.view();
        let ctx = context_for(msg, &view, Arc::from(id.as_str()), &self.group, None, job);
        let span = handle_span(msg, topic_entry, &ctx, &view, Some(headers), &self.server);
        let settling = settle::AttemptLog {
            id: &id,
            job,
            attempt,
            duration_ms: 0,
            span: &span,
        };
        let outcome = settle(&self.fw, topic_entry, msg, next, None, &settling).await;
        Attempted::new(outcome, || Arc::from(id), job, attempt)
    }
}
