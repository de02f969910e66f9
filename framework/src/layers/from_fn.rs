//! A layer from one async fn, as axum's `middleware::from_fn`: the fn gets
//! the attempt's [`Request`] and the rest of the stack as [`Next`], and
//! decides what happens around it.
//!
//! ```
//! use kjob::layers::{from_fn, Next, Request};
//! use kjob::JobError;
//!
//! async fn log_tenant(req: Request, next: Next) -> Result<(), JobError> {
//!     let tenant = req.ctx().tenant.clone();
//!     let result = next.run(req).await;
//!     if result.is_err() {
//!         eprintln!("a job of tenant {tenant:?} failed");
//!     }
//!     result
//! }
//! // builder.layer(from_fn(log_tenant))
//! # let _ = from_fn(log_tenant);
//! ```
//!
//! A layer with state of its own (a pool, a breaker's shared state)
//! implements [`Middleware`] on that state instead: the breaker and the rate
//! limit shipped with kjob do.

use std::future::Future;
use std::task::{Context, Poll};

use futures::future::BoxFuture;

use super::{AttemptService, Request};
use crate::classify::JobError;

/// What a layer does around the rest of the stack. Implemented for every
/// `Fn(Request, Next) -> impl Future<Output = Result<(), JobError>>` that
/// can be cloned and shared, and by kjob's own layers.
pub trait Middleware: Clone + Send + Sync + 'static {
    /// Handles one attempt; call `next.run(req)` to go on.
    fn call(&self, req: Request, next: Next) -> BoxFuture<'static, Result<(), JobError>>;
}

impl<F, Fut> Middleware for F
where
    F: Fn(Request, Next) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<(), JobError>> + Send + 'static,
{
    fn call(&self, req: Request, next: Next) -> BoxFuture<'static, Result<(), JobError>> {
        Box::pin(self(req, next))
    }
}

/// The rest of the stack below a layer: the inner layers and the handler.
pub struct Next {
    inner: AttemptService,
}

impl Next {
    /// Runs the rest of the stack for `req`.
    pub async fn run(self, req: Request) -> Result<(), JobError> {
        tower::ServiceExt::oneshot(self.inner, req).await
    }
}

/// A layer running `m` around every attempt it wraps (see the module docs).
pub fn from_fn<M: Middleware>(m: M) -> FromFn<M> {
    FromFn { m }
}

/// The layer [`from_fn`] makes.
#[derive(Clone)]
pub struct FromFn<M> {
    m: M,
}

impl<M: Middleware> tower::Layer<AttemptService> for FromFn<M> {
    type Service = FromFnService<M>;
    fn layer(&self, inner: AttemptService) -> Self::Service {
        FromFnService {
            m: self.m.clone(),
            inner,
        }
    }
}

/// The service a [`FromFn`] layer wraps around the stack below it.
#[derive(Clone)]
pub struct FromFnService<M> {
    m: M,
    inner: AttemptService,
}

impl<M: Middleware> tower::Service<Request> for FromFnService<M> {
    type Response = ();
    type Error = JobError;
    type Future = BoxFuture<'static, Result<(), JobError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), JobError>> {
        // The stack below is always ready: the scheduler bounds concurrency.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let next = Next {
            inner: self.inner.clone(),
        };
        self.m.call(req, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobContext;
    use std::sync::{Arc, Mutex};

    fn ctx() -> JobContext {
        JobContext {
            id: "j".into(),
            job: "t".into(),
            version: None,
            attempt: 1,
            topic: "t".into(),
            partition: 0,
            offset: 0,
            key: None,
            timestamp_ms: None,
            tenant: None,
            group: "g".into(),
            due_at_ms: None,
            batch: None,
            batch_report: None,
        }
    }

    #[tokio::test]
    async fn a_fn_runs_around_the_stack_and_can_refuse_the_attempt() {
        let seen: Arc<Mutex<Vec<&'static str>>> = Arc::default();
        let s = seen.clone();
        let handler = AttemptService::new(tower::service_fn(move |_req: Request| {
            let s = s.clone();
            async move {
                s.lock().unwrap().push("handler");
                Ok::<(), JobError>(())
            }
        }));
        let s = seen.clone();
        let around = from_fn(move |req: Request, next: Next| {
            let s = s.clone();
            async move {
                s.lock().unwrap().push("before");
                let r = next.run(req).await;
                s.lock().unwrap().push("after");
                r
            }
        });
        let svc = tower::Layer::layer(&around, handler.clone());
        tower::ServiceExt::oneshot(svc, Request::new((), ctx()))
            .await
            .unwrap();
        assert_eq!(*seen.lock().unwrap(), ["before", "handler", "after"]);

        let refuse = from_fn(|_req: Request, _next: Next| async {
            Err(JobError::permanent("refused by the layer"))
        });
        let svc = tower::Layer::layer(&refuse, handler);
        let r = tower::ServiceExt::oneshot(svc, Request::new((), ctx())).await;
        assert!(r.is_err());
        assert_eq!(seen.lock().unwrap().len(), 3, "the handler was not called");
    }
}
