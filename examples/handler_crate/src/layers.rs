//! A layer of the crate's own: every attempt logged with its job, attempt,
//! outcome and duration, one line per attempt, whatever the handler does.
//!
//! Layers are plain `tower` layers over kjob's attempt service: they see
//! the decoded job and its context before the handler, and the handler's
//! result after it.

use std::task::{Context, Poll};
use std::time::Instant;

use futures::future::BoxFuture;
use kjob::layers::{AttemptService, Request};
use kjob::JobError;

/// Logs every attempt (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct JobLog;

impl tower::Layer<AttemptService> for JobLog {
    type Service = Logged;
    fn layer(&self, inner: AttemptService) -> Logged {
        Logged { inner }
    }
}

/// The service [`JobLog`] wraps around an attempt.
#[derive(Clone)]
pub struct Logged {
    inner: AttemptService,
}

impl tower::Service<Request> for Logged {
    type Response = ();
    type Error = JobError;
    type Future = BoxFuture<'static, Result<(), JobError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), JobError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let (job, id, attempt) = (
            req.ctx().job.clone(),
            req.ctx().id.clone(),
            req.ctx().attempt,
        );
        let fut = self.inner.call(req);
        Box::pin(async move {
            let started = Instant::now();
            let result = fut.await;
            let ms = started.elapsed().as_millis() as u64;
            match &result {
                Ok(()) => tracing::info!(%job, %id, attempt, ms, "attempt ok"),
                Err(e) => tracing::info!(%job, %id, attempt, ms, error = %e, "attempt failed"),
            }
            result
        })
    }
}
