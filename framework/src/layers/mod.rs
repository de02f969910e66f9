//! Middleware around every attempt, as [`tower`] layers.
//!
//! Each attempt runs through a `tower::Service<Request>` that answers
//! `Result<(), JobError>`. kjob builds the stack per route, outermost first:
//!
//! 1. the tracing span and metrics of the attempt (in the worker's pipeline);
//! 2. panic capture (a panic anywhere below is class `bug.panic`);
//! 3. the layers added with [`WorkerBuilder::layer`](crate::WorkerBuilder::layer)
//!    (every route), in the order added;
//! 4. the layers added with [`WorkerBuilder::layer_for`](crate::WorkerBuilder::layer_for)
//!    (one route), in the order added;
//! 5. the handler timeout (class `retryable.timeout`);
//! 6. the handler.
//!
//! Decoding happens before the stack and classification and routing
//! (retry tier, DLQ) after it; the concurrency limit is the scheduler's.
//! A layer sees the decoded job ([`Request::job`]) and its
//! [`JobContext`], can put values in [`Request::extensions_mut`] for the
//! handler to take with [`Ext`](crate::worker::Ext), and can
//! fail the attempt with a [`JobError`] of its own.
//!
//! Until a layer calls the inner service, the job has not started: if its
//! partition is revoked or the worker stops meanwhile (a layer that waits,
//! such as the breaker or a rate limit), kjob drops the attempt and leaves
//! the record uncommitted for the next owner. Once the handler is called,
//! the attempt runs to its end (within the grace period).
//!
//! A layer that waits for a downstream wraps the wait in [`Request::wait`]:
//! the job then gives its handler slot back while it waits (it is
//! *parked*), so one downstream that is down never takes the slots of the
//! jobs that do not need it. The job keeps its place in its key's order.
//!
//! A layer is one async fn with [`from_fn()`] (as axum's
//! `middleware::from_fn`): it gets the [`Request`] and the rest of the stack
//! as [`Next`]. A layer with state implements [`Middleware`] on it.
//!
//! Shipped layers, one folder each, all [`Middleware`]s: [`rate_limit`] (a
//! token bucket shared by every route that uses it), [`breaker`] (a
//! circuit breaker per downstream that parks jobs while open instead of
//! burning their attempts) and, with feature `postgres`, `unique` (skip a
//! job whose key was handled within a window).

pub mod breaker;
mod from_fn;
pub mod rate_limit;
#[cfg(feature = "postgres")]
pub mod unique;

pub use from_fn::{from_fn, FromFn, FromFnService, Middleware, Next};

use std::any::Any;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tower::util::BoxCloneSyncService;

use crate::classify::JobError;
use crate::job::JobContext;
use crate::telemetry::metrics::WorkerGauges;
use crate::worker::before::park::Waiter;

/// One attempt, as a layer sees it.
pub struct Request {
    ctx: JobContext,
    job: Box<dyn Any + Send>,
    extensions: http::Extensions,
    /// Set when the handler is called: until then a revoke or a stop may
    /// release the attempt (a job parked by a layer is not kept waiting).
    started: Option<Arc<AtomicBool>>,
    /// How a wait gives the slot back (none outside a worker).
    waiter: Option<Waiter>,
    /// The worker's gauges, where a breaker shows itself (none outside a
    /// worker).
    gauges: Option<Arc<WorkerGauges>>,
}

impl Request {
    pub(crate) fn new<J: Send + 'static>(job: J, ctx: JobContext) -> Self {
        Self {
            ctx,
            job: Box::new(job),
            extensions: http::Extensions::new(),
            started: None,
            waiter: None,
            gauges: None,
        }
    }

    pub(crate) fn gauges(mut self, gauges: Arc<WorkerGauges>) -> Self {
        self.gauges = Some(gauges);
        self
    }

    /// The worker's gauges, for a layer that shows its state on `/metrics`.
    pub(crate) fn worker_gauges(&self) -> Option<&Arc<WorkerGauges>> {
        self.gauges.as_ref()
    }

    pub(crate) fn waiter(mut self, waiter: Waiter) -> Self {
        self.waiter = Some(waiter);
        self
    }

    /// Waits for `until` (a downstream's budget, an open breaker, a lock)
    /// without holding one of the worker's handler slots: if `until` is not
    /// ready at once, the job is parked, and other jobs (other keys, other
    /// routes) use its slot until it can go on. Its key's later jobs still
    /// wait behind it. Use it for every wait a layer does before it calls
    /// the inner service; a wait that is ready at once costs nothing.
    ///
    /// If the job's partition is revoked or the worker stops while it
    /// waits, this never returns: the attempt is dropped unstarted and the
    /// record left for the partition's next owner.
    pub fn wait<F: Future>(&self, until: F) -> impl Future<Output = F::Output> {
        // Owns what it needs, so the request need not stay borrowed.
        let waiter = self.waiter.clone();
        async move {
            match waiter {
                None => until.await,
                Some(w) => match w.wait(until).await {
                    Some(v) => v,
                    None => std::future::pending().await,
                },
            }
        }
    }

    pub(crate) fn started_flag(mut self, flag: Arc<AtomicBool>) -> Self {
        self.started = Some(flag);
        self
    }

    /// The handler is being called: from now on the attempt runs to its end.
    pub(crate) fn mark_started(&self) {
        if let Some(f) = &self.started {
            f.store(true, Ordering::Release);
        }
    }

    /// The decoded job, if it is a `J` (layers shared by several routes
    /// look at the jobs they know).
    pub fn job<J: 'static>(&self) -> Option<&J> {
        self.job.downcast_ref()
    }

    /// The attempt's context: id, attempt number, topic, tenant, ...
    pub fn ctx(&self) -> &JobContext {
        &self.ctx
    }

    /// Values a layer hands to the handler (`Ext<T>`).
    pub fn extensions(&self) -> &http::Extensions {
        &self.extensions
    }

    /// Mutable access, for a layer to add a value for the handler.
    pub fn extensions_mut(&mut self) -> &mut http::Extensions {
        &mut self.extensions
    }

    pub(crate) fn into_parts(self) -> (Box<dyn Any + Send>, JobContext, http::Extensions) {
        (self.job, self.ctx, self.extensions)
    }
}

/// The type-erased attempt service every layer wraps.
pub type AttemptService = BoxCloneSyncService<Request, (), JobError>;

/// A layer, type-erased so that one list can hold layers of any type.
#[doc(hidden)]
pub type LayerFn = Arc<dyn Fn(AttemptService) -> AttemptService + Send + Sync>;

/// A tower layer that kjob can put around attempts: any
/// `Layer<AttemptService>` whose service answers `Result<(), JobError>`
/// and can be cloned and shared across threads. Implemented for every such
/// layer; users never implement it themselves.
pub trait AttemptLayer: Send + Sync + 'static {
    /// Erases the layer's type, so layers of any type share one list.
    #[doc(hidden)]
    fn erase(self) -> LayerFn;
}

impl<L> AttemptLayer for L
where
    L: tower::Layer<AttemptService> + Send + Sync + 'static,
    L::Service:
        tower::Service<Request, Response = (), Error = JobError> + Clone + Send + Sync + 'static,
    <L::Service as tower::Service<Request>>::Future: Send + 'static,
{
    fn erase(self) -> LayerFn {
        Arc::new(move |inner| BoxCloneSyncService::new(self.layer(inner)))
    }
}
