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
//! Shipped layers, one folder each: [`rate_limit`] (a token bucket shared
//! by every route that uses it) and [`breaker`] (a circuit breaker per
//! downstream that parks jobs while open instead of burning their attempts).

pub mod breaker;
pub mod rate_limit;

use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tower::util::BoxCloneSyncService;

use crate::classify::JobError;
use crate::job::JobContext;

/// One attempt, as a layer sees it.
pub struct Request {
    ctx: JobContext,
    job: Box<dyn Any + Send>,
    extensions: http::Extensions,
    /// Set when the handler is called: until then a revoke or a stop may
    /// release the attempt (a job parked by a layer is not kept waiting).
    started: Option<Arc<AtomicBool>>,
}

impl Request {
    pub(crate) fn new<J: Send + 'static>(job: J, ctx: JobContext) -> Self {
        Self {
            ctx,
            job: Box::new(job),
            extensions: http::Extensions::new(),
            started: None,
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
