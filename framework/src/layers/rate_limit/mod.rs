//! A token-bucket rate limit, shared by every route that uses the same
//! [`RateLimit`] value: one downstream's budget, whichever job spends it.
//!
//! ```
//! # use kjob::layers::rate_limit::RateLimit;
//! let crm = RateLimit::per_second("crm", 20.0);
//! // builder.layer_for("crm.sync", crm.clone()).layer_for("crm.backfill", crm)
//! ```
//!
//! An attempt waits for a token before it runs; it never fails for want of
//! one, so a burst costs time, not attempts.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use std::sync::{Mutex, PoisonError};
use tokio::time::Instant;

use super::{from_fn, AttemptService, FromFnService, Middleware, Next, Request};
use crate::classify::JobError;

/// See the module docs. Cloning shares the bucket.
#[derive(Clone)]
pub struct RateLimit {
    name: Arc<str>,
    bucket: Arc<Mutex<Bucket>>,
    per_second: f64,
    burst: f64,
}

struct Bucket {
    tokens: f64,
    last: Instant,
}

impl RateLimit {
    /// At most `per_second` attempts per second on average, with bursts of
    /// up to one second's worth.
    pub fn per_second(name: &str, per_second: f64) -> Self {
        let per_second = per_second.max(0.001);
        let burst = per_second.max(1.0);
        Self {
            name: name.into(),
            bucket: Arc::new(Mutex::new(Bucket {
                tokens: burst,
                last: Instant::now(),
            })),
            per_second,
            burst,
        }
    }

    /// The downstream this budget is for.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Takes a token, waiting for it if the bucket is empty. A caller
    /// that must wait reserves the next token to come (the bucket goes
    /// below zero) and sleeps until it is due, so waiters are served in
    /// arrival order and each wakes once, however many wait: parked jobs
    /// ([`Request::wait`]) can be many.
    async fn acquire(&self) {
        let wait = {
            let mut b = self.bucket.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            let refill = now.duration_since(b.last).as_secs_f64() * self.per_second;
            b.tokens = (b.tokens + refill).min(self.burst) - 1.0;
            b.last = now;
            if b.tokens >= 0.0 {
                return;
            }
            Duration::from_secs_f64(-b.tokens / self.per_second)
        };
        tokio::time::sleep(wait).await;
    }
}

impl Middleware for RateLimit {
    fn call(&self, req: Request, next: Next) -> BoxFuture<'static, Result<(), JobError>> {
        let limit = self.clone();
        Box::pin(async move {
            // Parked while it waits for its token: no slot is held.
            req.wait(limit.acquire()).await;
            next.run(req).await
        })
    }
}

impl tower::Layer<AttemptService> for RateLimit {
    type Service = FromFnService<RateLimit>;
    fn layer(&self, inner: AttemptService) -> Self::Service {
        from_fn(self.clone()).layer(inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_beyond_the_budget_waits_instead_of_failing() {
        let limit = RateLimit::per_second("crm", 10.0);
        let start = Instant::now();
        for _ in 0..30 {
            limit.acquire().await;
        }
        let took = start.elapsed();
        // 10 at once (the burst), then 20 more at 10/s.
        assert!(took >= Duration::from_millis(1_990), "{took:?}");
        assert!(took < Duration::from_millis(2_100), "{took:?}");
    }
}
