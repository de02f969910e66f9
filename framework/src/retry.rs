//! Retry timing: how long to wait before the next attempt.
//!
//! Kept pure (no clocks, randomness passed in) so the arithmetic is unit
//! tested and shared by every place that schedules a retry.

use std::time::Duration;

/// How a route retries transient failures.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Total attempts including the first. After the last one fails with a
    /// retryable error the job is dead-lettered as `retries_exhausted`.
    pub max_attempts: u32,
    /// Wait before the second attempt.
    pub initial_backoff: Duration,
    /// Upper bound for any computed wait (a handler's `RetryAfter` may ask
    /// for longer and is honoured).
    pub max_backoff: Duration,
    /// Fraction of the wait randomised (0.0 to 1.0), so a thousand jobs that
    /// failed together against one outage do not retry in lockstep.
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 8,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(30),
            jitter: 0.2,
        }
    }
}

impl RetryPolicy {
    /// The wait after `attempt` (1-based) failed: `initial * 2^(attempt-1)`,
    /// capped at `max_backoff`, then reduced by up to `jitter` using `unit`
    /// (a random number in `[0, 1)`). Jitter only ever *shortens* the capped
    /// wait, so the cap holds. A handler's `retry_after` is a floor that
    /// jitter never undercuts.
    pub fn backoff(&self, attempt: u32, retry_after: Option<Duration>, unit: f64) -> Duration {
        let exp = attempt.saturating_sub(1).min(30);
        let base = self
            .initial_backoff
            .saturating_mul(1u32 << exp)
            .min(self.max_backoff);
        let jitter = self.jitter.clamp(0.0, 1.0) * unit.clamp(0.0, 1.0);
        let wait = base.mul_f64(1.0 - jitter);
        match retry_after {
            Some(floor) => wait.max(floor),
            None => wait,
        }
    }

    /// Whether another attempt is allowed after `attempt` failed.
    pub fn allows_another(&self, attempt: u32) -> bool {
        attempt < self.max_attempts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            jitter: 0.5,
        }
    }

    #[test]
    fn doubles_then_caps() {
        let p = policy();
        let waits: Vec<u128> = (1..=6)
            .map(|a| p.backoff(a, None, 0.0).as_millis())
            .collect();
        assert_eq!(waits, vec![100, 200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn jitter_only_shortens() {
        let p = policy();
        assert_eq!(p.backoff(2, None, 0.999_999).as_millis(), 100);
        assert!(p.backoff(10, None, 0.3) <= p.max_backoff);
    }

    #[test]
    fn retry_after_is_a_floor() {
        let p = policy();
        let wait = p.backoff(1, Some(Duration::from_secs(7)), 0.9);
        assert_eq!(wait, Duration::from_secs(7));
    }

    #[test]
    fn huge_attempt_numbers_do_not_overflow() {
        assert_eq!(
            policy().backoff(u32::MAX, None, 0.0),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn attempts_are_bounded() {
        let p = policy();
        assert!(p.allows_another(4));
        assert!(!p.allows_another(5));
    }
}
