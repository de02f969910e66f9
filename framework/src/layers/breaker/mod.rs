//! A circuit breaker per downstream that *defers* jobs instead of failing
//! them.
//!
//! A downstream answering 503 for an hour would otherwise walk every job
//! through every retry tier into the DLQ. With a breaker, after
//! `failure_threshold` consecutive retryable failures the breaker opens:
//! jobs that reach it wait, parked in memory without a concurrency slot
//! ([`Request::wait`]), until `open_for` has passed, while the worker's
//! other routes and keys keep running. Parked jobs count in their
//! partition's in-flight bound: a partition full of them is paused, the
//! others go on. Then one job goes through as a probe (half-open):
//! success closes the breaker and releases everyone, failure opens it
//! again. A parked job's attempt count does not move, and nothing is
//! dead-lettered because the breaker is open; only the attempts that
//! tripped it and the probes reach the downstream and fail. A parked job
//! has not started, so a revoke of its partition or a SIGTERM releases it
//! at once (uncommitted: the next owner runs it) instead of waiting out
//! the grace period for a breaker that stays open.
//!
//! Share one [`Breaker`] value between every route that calls the same
//! downstream. Each worker whose jobs went through it exports its state as
//! `kjob_breaker_state{breaker, state}` (1 for the state it is in: `closed`,
//! `half_open` or `open`) and the jobs it holds as
//! `kjob_breaker_parked{breaker}`.
//!
//! ```
//! # use kjob::layers::breaker::Breaker;
//! # use std::time::Duration;
//! let payments = Breaker::new("payments").failure_threshold(5).open_for(Duration::from_secs(10));
//! // builder.layer_for("payments.capture", payments.clone())
//! ```

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{from_fn, AttemptService, FromFnService, Middleware, Next, Request};
use crate::classify::JobError;
use crate::telemetry::metrics::GuardGauge;

/// The states, as exported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls pass.
    Closed,
    /// One probe is in flight; everyone else waits for its answer.
    HalfOpen,
    /// Calls wait until the open period ends.
    Open,
}

#[derive(Debug)]
enum Phase {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen,
}

struct Inner {
    name: String,
    phase: Mutex<Phase>,
    changed: Notify,
    parked: AtomicI64,
    /// The worker gauges it last showed itself in (an address; 0: none), so
    /// the common case costs one atomic load per call.
    noted_by: AtomicUsize,
    threshold: u32,
    open_for: Duration,
}

/// See the module docs. Cloning shares the state.
#[derive(Clone)]
pub struct Breaker {
    inner: Arc<Inner>,
}

/// How a breaker shows on the `/metrics` of each worker whose jobs go
/// through it (`kjob_breaker_state`, `kjob_breaker_parked`).
struct Gauge(Weak<Inner>);

impl GuardGauge for Gauge {
    fn read(&self) -> Option<(String, &'static str, i64)> {
        let inner = self.0.upgrade()?;
        let breaker = Breaker {
            inner: inner.clone(),
        };
        let state = match breaker.state() {
            BreakerState::Closed => "closed",
            BreakerState::HalfOpen => "half_open",
            BreakerState::Open => "open",
        };
        Some((
            inner.name.clone(),
            state,
            inner.parked.load(Ordering::Relaxed),
        ))
    }

    fn same(&self, other: &dyn GuardGauge) -> bool {
        self.id() == other.id()
    }

    fn id(&self) -> usize {
        self.0.as_ptr() as usize
    }
}

impl Breaker {
    /// A closed breaker for downstream `name` (5 failures, open for 10 s).
    pub fn new(name: &str) -> Self {
        Self::build(name, 5, Duration::from_secs(10))
    }

    fn build(name: &str, threshold: u32, open_for: Duration) -> Self {
        let inner = Arc::new(Inner {
            name: name.to_string(),
            phase: Mutex::new(Phase::Closed { failures: 0 }),
            changed: Notify::new(),
            parked: AtomicI64::new(0),
            noted_by: AtomicUsize::new(0),
            threshold: threshold.max(1),
            open_for,
        });
        Self { inner }
    }

    /// Consecutive retryable failures that open the breaker.
    pub fn failure_threshold(self, n: u32) -> Self {
        Self::build(&self.inner.name, n, self.inner.open_for)
    }

    /// How long it stays open before a probe.
    pub fn open_for(self, d: Duration) -> Self {
        Self::build(&self.inner.name, self.inner.threshold, d)
    }

    /// The current state.
    pub fn state(&self) -> BreakerState {
        match *self.lock() {
            Phase::Closed { .. } => BreakerState::Closed,
            Phase::HalfOpen => BreakerState::HalfOpen,
            Phase::Open { .. } => BreakerState::Open,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.inner
            .phase
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until this attempt may call the downstream. Returns whether it
    /// is the half-open probe.
    async fn admit(&self) -> bool {
        let mut parked = false;
        let probe = loop {
            let notified = self.inner.changed.notified();
            let wait = {
                let mut phase = self.lock();
                match *phase {
                    Phase::Closed { .. } => break false,
                    Phase::Open { until } if Instant::now() >= until => {
                        *phase = Phase::HalfOpen;
                        break true;
                    }
                    Phase::Open { until } => Some(until),
                    Phase::HalfOpen => None,
                }
            };
            if !parked {
                parked = true;
                self.inner.parked.fetch_add(1, Ordering::Relaxed);
            }
            match wait {
                Some(until) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(until) => {}
                        _ = notified => {}
                    }
                }
                None => notified.await,
            }
        };
        if parked {
            self.inner.parked.fetch_sub(1, Ordering::Relaxed);
        }
        probe
    }

    /// Records the downstream's answer.
    fn record(&self, probe: bool, result: &Result<(), JobError>) {
        let failed = matches!(result, Err(e) if e.class().is_retryable());
        let mut phase = self.lock();
        let next = match (&*phase, failed) {
            (_, false) if probe || matches!(*phase, Phase::Closed { .. }) => {
                Phase::Closed { failures: 0 }
            }
            (Phase::Closed { failures }, true) if failures + 1 < self.inner.threshold => {
                Phase::Closed {
                    failures: failures + 1,
                }
            }
            (Phase::Closed { .. }, true) => Phase::Open {
                until: Instant::now() + self.inner.open_for,
            },
            (_, true) if probe => Phase::Open {
                until: Instant::now() + self.inner.open_for,
            },
            // A call admitted before the breaker opened answered late.
            _ => return,
        };
        let reopened = matches!(next, Phase::Open { .. }) && !matches!(*phase, Phase::Open { .. });
        let closed = matches!(next, Phase::Closed { failures: 0 })
            && !matches!(*phase, Phase::Closed { .. });
        *phase = next;
        drop(phase);
        if reopened {
            tracing::warn!(breaker = %self.inner.name, open_for = ?self.inner.open_for, "circuit breaker open: jobs for this downstream wait");
        }
        if closed {
            tracing::info!(breaker = %self.inner.name, "circuit breaker closed: the downstream answers again");
        }
        self.inner.changed.notify_waiters();
    }
}

impl Middleware for Breaker {
    fn call(&self, req: Request, next: Next) -> BoxFuture<'static, Result<(), JobError>> {
        let breaker = self.clone();
        if let Some(g) = req.worker_gauges() {
            let at = Arc::as_ptr(g) as usize;
            if self.inner.noted_by.swap(at, Ordering::Relaxed) != at {
                g.note_guard(Box::new(Gauge(Arc::downgrade(&self.inner))));
            }
        }
        Box::pin(async move {
            // Parked while the breaker is open: its slot serves other jobs.
            let probe = req.wait(breaker.admit()).await;
            let result = next.run(req).await;
            breaker.record(probe, &result);
            result
        })
    }
}

impl tower::Layer<AttemptService> for Breaker {
    type Service = FromFnService<Breaker>;
    fn layer(&self, inner: AttemptService) -> Self::Service {
        from_fn(self.clone()).layer(inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn it_opens_after_the_threshold_parks_callers_and_closes_on_a_good_probe() {
        let b = Breaker::new("t")
            .failure_threshold(2)
            .open_for(Duration::from_secs(10));
        let fail: Result<(), JobError> = Err(JobError::server("503"));
        assert!(!b.admit().await);
        b.record(false, &fail);
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(!b.admit().await);
        b.record(false, &fail);
        assert_eq!(b.state(), BreakerState::Open);
        // A caller now waits the open period, then is the probe.
        let start = Instant::now();
        assert!(
            b.admit().await,
            "the first caller after the open period probes"
        );
        assert!(start.elapsed() >= Duration::from_secs(10));
        assert_eq!(b.state(), BreakerState::HalfOpen);
        // A failed probe re-opens; a good one closes.
        b.record(true, &fail);
        assert_eq!(b.state(), BreakerState::Open);
        assert!(b.admit().await);
        b.record(true, &Ok(()));
        assert_eq!(b.state(), BreakerState::Closed);
        // Permanent errors say nothing about the downstream's health.
        for _ in 0..5 {
            b.record(false, &Err(JobError::invalid_input("bad")));
        }
        assert_eq!(b.state(), BreakerState::Closed);
    }
}
