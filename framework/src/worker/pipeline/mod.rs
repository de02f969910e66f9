//! One attempt: a record from bytes to its final outcome, top to bottom,
//! numbered as the steps of ARCHITECTURE.md:
//!
//! 6. before the handler: an operator's cancel, then the stages of its
//!    topic's role ([`crate::worker::before::stages`]: a delayed job or a retry that is
//!    not due yet hops on), a debounce window ([`crate::worker::before::debounce`]) and
//!    strict order on routes that ask for it ([`crate::worker::before::strict`]: a key's
//!    later jobs wait behind its job in the retry path);
//! 7. the handler ([`crate::worker::handler::route`]): decode with the route's contract, the
//!    layers, the handler, under panic capture and the handler timeout; a
//!    wait for a downstream is parked, without a slot ([`crate::worker::before::park`]);
//! 8. the decision ([`crate::worker::decision`]): handled, the next retry tier, or
//!    the DLQ;
//! 9. the forward and settling ([`crate::worker::settle`]): the forward,
//!    acknowledged before the offset may be released ([`crate::worker::settle::forward`]),
//!    counted and logged;
//! 10. toward the commit: a job of a batch is recorded on the batch topic
//!     first (the commit itself is the poll thread's).
//!
//! The worker and the test harness run exactly this; they differ only in
//! the [`Sink`] forwards go to and the clock. Nothing here sleeps for a
//! retry: it waits in its tier topic, not in the worker.
//!
//! Beside this file: `unrun.rs`, the records that end before their handler
//! (cancelled, debounced, moved to another group, unrouted), and
//! `context.rs`, the handler's `JobContext` and consumer span.

mod context;
mod unrun;

pub(crate) use context::context_for;
use context::handle_span;

use std::sync::Arc;

use opentelemetry::trace::FutureExt as _;
use opentelemetry::KeyValue;
use rdkafka::message::Message;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error};

use crate::headers::{HeaderView, JobHeaders};
use crate::job::JobContext;
use crate::telemetry::metrics::Metrics;
use crate::telemetry::spans::JobSpan;
use crate::worker::before::park::Waiter;
use crate::worker::before::stages;
use crate::worker::before::strict::Gate;
pub(crate) use crate::worker::decision::Outcome;
use crate::worker::handler::route::Attempt;
use crate::worker::settle;
use crate::worker::settle::forward::Forwarder;
pub(crate) use crate::worker::settle::forward::Sink;
use crate::worker::state::{RouteEntry, TopicRole, WorkerStats};

/// How one attempt ended, for the dispatcher (`outcome`) and, with the
/// `testing` feature, for the harness's report (the job id, contract and
/// attempt number). Without that feature those fields do not exist, so the
/// production path neither computes nor carries them.
#[derive(Clone, Debug)]
pub(crate) struct Attempted {
    pub outcome: Outcome,
    /// The job id the handler saw.
    #[cfg(feature = "testing")]
    pub id: Arc<str>,
    /// The contract name.
    #[cfg(feature = "testing")]
    pub job: &'static str,
    /// The attempt number.
    #[cfg(feature = "testing")]
    pub attempt: u32,
}

impl Attempted {
    /// The id is made only when the harness will read it: an attempt that
    /// ends before its handler may have to format it from the record's
    /// coordinates.
    #[cfg(feature = "testing")]
    pub(super) fn new(
        outcome: Outcome,
        id: impl FnOnce() -> Arc<str>,
        job: &'static str,
        attempt: u32,
    ) -> Self {
        Self {
            outcome,
            id: id(),
            job,
            attempt,
        }
    }

    /// Without the harness only the outcome is kept.
    #[cfg(not(feature = "testing"))]
    #[inline]
    pub(super) fn new(
        outcome: Outcome,
        _id: impl FnOnce() -> Arc<str>,
        _job: &'static str,
        _attempt: u32,
    ) -> Self {
        Self { outcome }
    }

    fn released(id: Arc<str>, job: &'static str, attempt: u32) -> Self {
        Self::new(Outcome::Released, || id, job, attempt)
    }
}

/// Everything an attempt needs besides the record.
pub(crate) struct Pipeline {
    pub(crate) routes: rustc_hash::FxHashMap<String, RouteEntry>,
    /// Forwards, the group, the counters and the metrics.
    pub(crate) fw: Forwarder,
    /// The chains of the strict-order routes, if any ([`crate::worker::before::strict`]).
    pub(crate) strict: Option<Arc<crate::worker::before::strict::Strict>>,
    /// Where "now" comes from (the harness's is virtual).
    pub(crate) clock: crate::clock::Clock,
    /// Whether waiting jobs give their slot back ([`crate::worker::before::park`]); off
    /// only to measure what parking changes.
    pub(crate) park: bool,
    /// `server.address` and `server.port` for the attempts' spans (the
    /// first bootstrap server; none in the harness).
    pub(crate) server: Vec<KeyValue>,
    /// Where a finished job of a batch is recorded ([`crate::batch`]).
    pub(crate) batches: Option<Arc<crate::batch::recorder::Recorder>>,
    /// What operators put in force on the group's control topic: here,
    /// the waiting jobs they cancelled ([`crate::control::JobCancel`]).
    pub(crate) in_force: Option<Arc<crate::control::InForce>>,
    /// The debounced routes and the newest job of each key fetched on them
    /// ([`crate::worker::before::debounce`]).
    pub(crate) debounce: Option<Arc<crate::worker::before::debounce::Debounce>>,
    /// The group, shared by every job's context.
    group: Arc<str>,
    /// Per route topic: its name and its contract's, shared by every
    /// job's context (no copy per attempt).
    names: rustc_hash::FxHashMap<String, Names>,
}

/// The shared strings of one route topic's contexts.
pub(crate) struct Names {
    topic: Arc<str>,
    job: Arc<str>,
}

/// A record [`Pipeline::prepare`] cannot make ready for its handler
/// without awaiting something first. Its headers are boxed: this is the
/// rare path, and the common one stays small.
enum Waits<'a> {
    /// A record of a shared tier or bucket that names no route here.
    Unrouted(Box<JobHeaders>),
    /// A record that may wait or hop first ([`Pipeline::before`]).
    Before(&'a RouteEntry, Box<JobHeaders>, Option<Gate<'a, 'a>>),
}

/// What the handler stage needs, prepared from the record's headers,
/// which are gone by then.
struct Ready<'a> {
    entry: &'a RouteEntry,
    /// Strict order's gate for the record's key, on a route that asks.
    gate: Option<Gate<'a, 'a>>,
    ctx: JobContext,
    span: JobSpan,
    /// The job's id and attempt number, out of `ctx` (which moves into
    /// the handler's future).
    id: Arc<str>,
    attempt: u32,
    /// The batch the job belongs to, if any ([`crate::batch`]).
    batch: Option<String>,
    /// When the handler starts (later than the attempt's start if it
    /// waited first).
    now_ms: i64,
}

impl Pipeline {
    /// A pipeline over `routes`, forwarding to `sink`. `cancel` ends
    /// forwards still retrying at the end of the shutdown grace period.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        routes: rustc_hash::FxHashMap<String, RouteEntry>,
        group: String,
        sink: Arc<dyn Sink>,
        metrics: Metrics,
        stats: Arc<WorkerStats>,
        cancel: CancellationToken,
        strict: Option<Arc<crate::worker::before::strict::Strict>>,
        clock: crate::clock::Clock,
    ) -> Self {
        let names = routes
            .iter()
            .map(|(topic, e)| {
                let names = Names {
                    topic: Arc::from(topic.as_str()),
                    job: Arc::from(e.handler.job_name()),
                };
                (topic.clone(), names)
            })
            .collect();
        let shared_group = Arc::from(group.as_str());
        let fw = Forwarder::new(sink, group, stats, metrics, cancel, &routes);
        Self {
            group: shared_group,
            names,
            routes,
            fw,
            strict,
            clock,
            park: true,
            server: Vec::new(),
            batches: None,
            in_force: None,
            debounce: None,
        }
    }

    /// Runs one record to a final outcome at wall-clock time `now_ms`, with
    /// `unit` in `[0, 1)` for retry jitter (both parameters, so the harness
    /// is deterministic). `waiter` parks the job while it waits before its
    /// handler, and gives up when the job is released ([`crate::worker::before::park`]).
    ///
    /// Its future is allocated once per job by the dispatcher, so what it
    /// holds across an await is kept small: the record's parsed headers and
    /// every rare stage stay in [`Pipeline::prepare`] or in boxed futures.
    /// An `async` block rather than an `async fn`, whose future would keep
    /// its arguments twice.
    #[allow(clippy::manual_async_fn)]
    pub(crate) fn attempt<'a, M: Message>(
        &'a self,
        msg: &'a M,
        waiter: &'a Waiter,
        unit: f64,
        now_ms: i64,
    ) -> impl std::future::Future<Output = Attempted> + 'a {
        async move {
            let Some(topic_entry) = self.routes.get(msg.topic()) else {
                // Unreachable: the consumer subscribes to route topics only. Not
                // marked done, so it is never lost.
                error!(topic = msg.topic(), "record from a topic without a route");
                return Attempted::released(Arc::from(""), "", 0);
            };
            // Step 6, before the handler, and what the handler needs. Bound field by field: a
            // `Ready` kept in a local would stay in this future's state until
            // it ends, even once its fields moved out.
            let Ready {
                entry,
                gate,
                ctx,
                span,
                id,
                attempt,
                batch,
                now_ms,
            } = match self.prelude(topic_entry, msg, waiter, now_ms).await {
                Ok(ready) => ready,
                Err(ended) => return ended,
            };
            // Step 7: the handler.
            let job = entry.handler.job_name();
            let (result, duration_ms) = self
                .handle(entry, msg, ctx, &id, &span, waiter, now_ms)
                .await;
            if result == Attempt::Released {
                // Never ran: no outcome to count; the next owner runs it.
                debug!(job.id = %id, job.type = job, attempt, "released before its handler started");
                return Attempted::released(id, job, attempt);
            }
            // Steps 8 and 9: the decision, and settling it. A retry's wait (a
            // Retry-After above all) counts from the failure, not from when the
            // attempt began.
            // A job done needs no time: no clock read for it. A failure's
            // time is rounded up, so a wait counted from it never ends early.
            let failed_at_ms = match result {
                Attempt::Handled => now_ms,
                _ => self.clock.failed_at_ms().max(now_ms),
            };
            let settling = settle::AttemptLog {
                id: &id,
                job,
                attempt,
                duration_ms,
                span: &span,
            };
            let outcome = match settle::decide(
                &self.fw,
                entry,
                msg,
                result,
                gate,
                settling,
                unit,
                failed_at_ms,
            ) {
                settle::Settling::Now(outcome) => outcome,
                settle::Settling::Later(forward) => forward.await,
            };
            // Step 10: a job of a batch: its completion goes to the batch topic,
            // acknowledged before its offset is committed (the recorder's
            // barrier in the commit path).
            if let (Some(batch), Some(recorder)) = (&batch, &self.batches) {
                if matches!(outcome, Outcome::Handled | Outcome::DeadLettered) {
                    recorder.push(batch, &id, outcome == Outcome::Handled);
                }
            }
            Attempted::new(outcome, || id, job, attempt)
        }
    }

    /// Step 6: what must happen before the handler, and what it
    /// needs. Its future is part of the attempt's only while it is
    /// awaited, so its state shares room with the handler's.
    async fn prelude<'a, M: Message>(
        &'a self,
        topic_entry: &'a RouteEntry,
        msg: &'a M,
        waiter: &Waiter,
        now_ms: i64,
    ) -> Result<Ready<'a>, Attempted> {
        // Returns before any await: the `Ready` never lives in this
        // future's state.
        let waits = match self.prepare(topic_entry, msg, now_ms) {
            Ok(ready) => return Ok(ready),
            Err(waits) => waits,
        };
        match waits {
            Waits::Unrouted(headers) => {
                Err(Box::pin(self.unrouted(topic_entry, msg, *headers)).await)
            }
            Waits::Before(entry, headers, gate) => {
                Box::pin(self.before(entry, msg, *headers, gate, waiter, now_ms)).await
            }
        }
    }

    /// Parses `msg`'s headers and, when nothing has to be awaited before
    /// its handler (no operator's hand, no stage of its topic's role, no
    /// debounce window, no strict order), prepares the handler's context
    /// and span at once. Synchronous, so the headers are never part of the
    /// attempt's future; a record that may wait is handed on with them.
    fn prepare<'a, M: Message>(
        &'a self,
        topic_entry: &'a RouteEntry,
        msg: &'a M,
        now_ms: i64,
    ) -> Result<Ready<'a>, Waits<'a>> {
        // Borrowed: the owned form only for a record that waits.
        let headers = HeaderView::parse(msg.headers());
        let owned = || Box::new(JobHeaders::parse(msg.headers()));
        let Some(entry) = topic_entry.for_record(&headers) else {
            return Err(Waits::Unrouted(owned()));
        };
        let gate = self.strict.as_deref().and_then(|s| s.gate(entry, msg));
        // A main-topic record carries a run time only when it was enqueued
        // due too soon for a delay bucket; a group only when an operator
        // moved it.
        let debounced = match (&self.debounce, entry.role, msg.key()) {
            (Some(d), TopicRole::Main, Some(_)) => d.window(msg.topic()).is_some(),
            _ => false,
        };
        if entry.role.holds()
            || headers.run_at_ms.is_some()
            || headers.group.is_some()
            || debounced
            || gate.is_some()
        {
            return Err(Waits::Before(entry, owned(), gate));
        }
        Ok(self.ready(entry, msg, &headers, None, gate, now_ms))
    }

    /// Step 6 for a record that may wait or hop before its handler:
    /// an operator's hand, the stages of its topic's role, a debounce
    /// window, strict order. Boxed by the caller: rare, and its state (the
    /// headers above all) stays out of every attempt's future. `Err`: the
    /// attempt ended here.
    async fn before<'a, M: Message>(
        &'a self,
        entry: &'a RouteEntry,
        msg: &'a M,
        headers: JobHeaders,
        gate: Option<Gate<'a, 'a>>,
        waiter: &Waiter,
        now_ms: i64,
    ) -> Result<Ready<'a>, Attempted> {
        let job = entry.handler.job_name();
        let ended = |outcome| {
            Err(Attempted::new(
                outcome,
                || Arc::from(headers.job_id(msg.topic(), msg.partition(), msg.offset())),
                job,
                headers.attempt.unwrap_or(1).max(1),
            ))
        };
        // Step 6, before the handler. An operator's hand: a cancelled waiting job is finished unrun;
        // a job another group's operator moved to "now" is that group's.
        if entry.role.holds() && self.is_cancelled(entry, &headers) {
            let outcome = Box::pin(self.cancelled(entry, msg, &headers, job)).await;
            return ended(outcome);
        }
        if headers.group.is_some() && self.moved_for_another_group(entry, &headers) {
            WorkerStats::bump(&self.fw.stats.skipped_foreign);
            return ended(Outcome::Handled);
        }
        // The stages of the topic's role. Boxed, like every rare path:
        // their futures stay out of this one's state.
        let mut now_ms = now_ms;
        if entry.role.holds() || headers.run_at_ms.is_some() {
            // Built inside `Box::pin`, never bound to a local first: a local
            // future keeps its storage in this future's state until the end
            // of its scope, which is what boxing avoids.
            if let Some(outcome) = Box::pin(stages::before(
                &self.fw, entry, msg, &headers, waiter, now_ms,
            ))
            .await
            {
                return ended(outcome);
            }
            now_ms = now_ms.max(self.clock.now_ms());
        }
        // A debounced route's job waits out its window; a newer one of its
        // key makes it moot.
        if let (Some(d), TopicRole::Main, Some(key)) = (&self.debounce, entry.role, msg.key()) {
            if let Some(window) = d.window(msg.topic()) {
                if let Some(outcome) = Box::pin(self.debounced(d, window, msg, key, waiter)).await {
                    if outcome == Outcome::Superseded {
                        WorkerStats::bump(&self.fw.stats.superseded);
                        self.fw.metrics.outcome(job, "superseded");
                        debug!(job.type = job, partition = msg.partition(), offset = msg.offset(), outcome = "superseded", "a newer job of its key arrived; not run");
                        if let (Some(recorder), Some(batch)) = (&self.batches, &headers.batch) {
                            let id = headers.job_id(msg.topic(), msg.partition(), msg.offset());
                            recorder.push(batch, &id, true);
                        }
                    }
                    return ended(outcome);
                }
                now_ms = now_ms.max(self.clock.now_ms());
            }
        }
        // Strict order.
        if let Some(g) = &gate {
            if let Some(outcome) =
                Box::pin(g.before(&self.fw, entry, msg, &headers, waiter, now_ms)).await
            {
                return ended(outcome);
            }
        }
        Ok(self.ready(entry, msg, &headers.view(), Some(&headers), gate, now_ms))
    }

    /// The handler's context and span for `msg`, from its `headers` (and
    /// their owned form, if the caller has it, for the span).
    fn ready<'a, M: Message>(
        &'a self,
        entry: &'a RouteEntry,
        msg: &M,
        headers: &HeaderView<'_>,
        owned: Option<&JobHeaders>,
        gate: Option<Gate<'a, 'a>>,
        now_ms: i64,
    ) -> Ready<'a> {
        let id: Arc<str> = match headers.id {
            Some(id) => Arc::from(id),
            None => Arc::from(headers.job_id(msg.topic(), msg.partition(), msg.offset())),
        };
        let names = self.names.get(msg.topic());
        let job = entry.handler.job_name();
        let mut ctx = context_for(msg, headers, id, &self.group, names, job);
        match entry.role {
            // Its lateness is measured against the time it was asked for.
            TopicRole::Delay(_) => ctx.due_at_ms = headers.run_at_ms.or(ctx.due_at_ms),
            // A job due too soon for a bucket, or at a time already passed
            // when it was written: due at the later of the two.
            TopicRole::Main => {
                if let Some(run_at) = headers.run_at_ms {
                    let written = msg.timestamp().to_millis().unwrap_or(run_at);
                    ctx.due_at_ms = Some(run_at.max(written));
                }
            }
            TopicRole::Tier(_) => {}
        }
        let span = handle_span(msg, entry, &ctx, headers, owned, &self.server);
        Ready {
            entry,
            gate,
            id: ctx.id.clone(),
            attempt: ctx.attempt,
            ctx,
            span,
            batch: headers.batch.map(str::to_string),
            now_ms,
        }
    }

    /// Runs the handler stage under its span, with the attempt's metrics;
    /// returns its result and how long the handler took (ms).
    ///
    /// Not an `async fn`: what comes before the handler runs here, and the
    /// job's context and the watchdog's names move into the route's boxed
    /// future, so the future returned (part of every attempt's state) holds
    /// little more than that box.
    #[allow(clippy::too_many_arguments)]
    fn handle<'a, M: Message>(
        &'a self,
        entry: &'a RouteEntry,
        msg: &'a M,
        ctx: JobContext,
        id: &'a str,
        span: &'a JobSpan,
        waiter: &'a Waiter,
        now_ms: i64,
    ) -> impl std::future::Future<Output = (Attempt, u64)> + 'a {
        let (metrics, job) = (&self.fw.metrics, entry.handler.job_name());
        if let Some(due) = ctx.due_at_ms {
            metrics.lateness(msg.topic(), ((now_ms - due).max(0) as f64) / 1000.0);
        }
        if let Some(header) = &entry.fair {
            let tenant = crate::headers::find(msg.headers(), header).unwrap_or("");
            let written = msg.timestamp().to_millis().unwrap_or(now_ms);
            metrics.tenant_started(
                &entry.main,
                tenant,
                ((now_ms - written).max(0) as f64) / 1000.0,
            );
        }
        let started = std::time::Instant::now();
        metrics.in_flight(job, 1);
        let watched = crate::worker::handler::watchdog::Watched {
            job,
            id,
            key: msg.key(),
            topic: msg.topic(),
            partition: msg.partition(),
            offset: msg.offset(),
        };
        // The attempt's log span, boxed with the route's future only when a
        // subscriber takes it: the attempt's own future keeps its size.
        let log = crate::worker::handler::job_span::log_span(entry, msg, id, ctx.attempt);
        let run = entry.handler.run(msg.payload(), ctx, waiter, watched);
        let run = match log.is_disabled() {
            true => run,
            false => Box::pin(tracing::Instrument::instrument(run, log)),
        };
        async move {
            let result = match span.context() {
                Some(cx) => run.with_context(cx.clone()).await,
                None => run.await,
            };
            metrics.in_flight(job, -1);
            let elapsed = started.elapsed();
            if result != Attempt::Released {
                metrics.handler_seconds(job, elapsed.as_secs_f64());
                if let Some(ts) = msg.timestamp().to_millis() {
                    let done_ms = now_ms.saturating_add(elapsed.as_millis() as i64);
                    let latency = ((done_ms - ts).max(0) as f64) / 1000.0;
                    metrics.priority_latency(entry.priority, latency);
                }
            }
            (result, elapsed.as_millis() as u64)
        }
    }
}
