//! Retry tiers: where a failed job waits, and until when.
//!
//! A retryable failure does not sleep in the worker. The job is forwarded to
//! a *delay topic* (`<topic>.retry.<delay>`) with an absolute due time in the
//! `kjob-due-at` header; the same worker consumes the tier and pauses the
//! tier's partition until the head record is due. Each tier has one fixed
//! delay, so records in a tier partition become due in (almost) the order
//! they were written, and a not-yet-due head means nothing behind it is due.
//!
//! The attempt number picks the tier: the first failure goes to tier 0, the
//! second to tier 1, and attempts beyond the last tier reuse it. With the
//! defaults (5 s, 30 s, 5 m, 30 m) a job that keeps failing is retried for
//! about 36 minutes before it is dead-lettered as `retries_exhausted`, long
//! enough to ride out a typical downstream outage without a retry storm:
//! retry traffic per job is bounded by the number of tiers.
//!
//! This module is pure arithmetic (randomness is passed in), unit tested,
//! and shared by the worker and the in-memory test harness.

use std::time::Duration;

/// How a route retries transient failures.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Delay of each tier, shortest first. Each gets a topic
    /// `<topic>.retry.<delay>`.
    pub tiers: Vec<Duration>,
    /// Total attempts including the first. After the last one fails with a
    /// retryable error the job is dead-lettered as `retries_exhausted`.
    pub max_attempts: u32,
    /// Extra random delay, as a fraction of the tier delay (0.0 to 1.0), so a
    /// thousand jobs that failed together against one outage do not come
    /// back in lockstep. Jitter only ever *adds*: a job never runs before
    /// its tier's delay.
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            tiers: vec![
                Duration::from_secs(5),
                Duration::from_secs(30),
                Duration::from_secs(5 * 60),
                Duration::from_secs(30 * 60),
            ],
            max_attempts: 5,
            jitter: 0.1,
        }
    }
}

/// Where and until when a failed job waits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPlan {
    /// Index into [`RetryPolicy::tiers`].
    pub tier: usize,
    /// How long from now until the job is due.
    pub wait: Duration,
    /// How long the tier holds the record: `wait`, except for a
    /// `Retry-After` longer than the last tier, which the tier releases
    /// after its own delay (a tier is read first-in first-out, so a longer
    /// hold would stop the records behind it) and which then hops on
    /// ([`RetryPolicy::hop`]) until it is due.
    pub release: Duration,
}

/// Why a [`RetryPolicy`] cannot be used. Each message says what to change.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RetryPolicyError {
    /// `max_attempts(0)`: a job must be tried at least once.
    #[error("max_attempts must be at least 1")]
    NoAttempts,
    /// Retries allowed, but nowhere to wait for them.
    #[error("max_attempts is {max_attempts} but the policy has no tiers; add a tier (e.g. RetryPolicy::tiers([30s])) or set max_attempts(1)")]
    NoTiers {
        /// The configured attempts.
        max_attempts: u32,
    },
    /// A tier of zero would retry at once, in a tight loop.
    #[error("tier delays must be positive")]
    ZeroDelay,
    /// Jitter is a fraction of the delay.
    #[error("jitter must be between 0.0 and 1.0, not {0}")]
    Jitter(f64),
    /// A per-route policy names a topic no handler is registered for.
    #[error(
        "no handler is registered for this topic; register one, or fix the topic name in retry_for"
    )]
    NoSuchRoute,
}

impl RetryPolicy {
    /// A policy with the given tiers and `max_attempts = tiers + 1` (each
    /// tier used once), with 10% jitter.
    pub fn tiers(tiers: impl IntoIterator<Item = Duration>) -> Self {
        let tiers: Vec<Duration> = tiers.into_iter().collect();
        Self {
            max_attempts: tiers.len() as u32 + 1,
            tiers,
            jitter: 0.1,
        }
    }

    /// Sets the attempt limit (including the first attempt).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// Sets the jitter fraction.
    pub fn jitter(mut self, fraction: f64) -> Self {
        self.jitter = fraction.clamp(0.0, 1.0);
        self
    }

    /// Checks the policy makes sense; the error says what to change.
    pub fn validate(&self) -> Result<(), RetryPolicyError> {
        if self.max_attempts == 0 {
            return Err(RetryPolicyError::NoAttempts);
        }
        if self.max_attempts > 1 && self.tiers.is_empty() {
            return Err(RetryPolicyError::NoTiers {
                max_attempts: self.max_attempts,
            });
        }
        if self.tiers.iter().any(|t| t.is_zero()) {
            return Err(RetryPolicyError::ZeroDelay);
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(RetryPolicyError::Jitter(self.jitter));
        }
        Ok(())
    }

    /// Whether another attempt is allowed after `attempt` (1-based) failed.
    pub fn allows_another(&self, attempt: u32) -> bool {
        attempt < self.max_attempts && !self.tiers.is_empty()
    }

    /// Plans the retry after `attempt` (1-based) failed. `unit` is a random
    /// number in `[0, 1)` for jitter. A handler's `retry_after` is a floor
    /// that is never shortened, and it moves the job to the first tier long
    /// enough to hold it, so a long wait does not block a short tier's head.
    pub fn plan(
        &self,
        attempt: u32,
        retry_after: Option<Duration>,
        unit: f64,
    ) -> Option<RetryPlan> {
        if !self.allows_another(attempt) {
            return None;
        }
        let last = self.tiers.len() - 1;
        let by_attempt = (attempt.saturating_sub(1) as usize).min(last);
        let by_floor = retry_after
            .map(|after| self.tiers.iter().position(|t| *t >= after).unwrap_or(last))
            .unwrap_or(0);
        let tier = by_attempt.max(by_floor);
        let base = self.tiers[tier];
        let jittered = base + base.mul_f64(self.jitter.clamp(0.0, 1.0) * unit.clamp(0.0, 1.0));
        let wait = retry_after.map_or(jittered, |after| jittered.max(after));
        Some(RetryPlan {
            tier,
            wait,
            release: jittered,
        })
    }

    /// For a record released from a tier with `left` still to wait (a long
    /// `Retry-After`): the longest tier that does not overshoot it, or
    /// `None` when even the shortest one would (the worker waits the rest).
    pub fn hop(&self, left: Duration) -> Option<usize> {
        self.tiers.iter().rposition(|t| *t <= left)
    }

    /// How long tier `tier` holds a record.
    pub fn tier_delay(&self, tier: usize) -> Option<Duration> {
        self.tiers.get(tier).copied()
    }

    /// The topic of tier `tier` for main topic `topic`.
    pub fn tier_topic(&self, topic: &str, tier: usize) -> Option<String> {
        self.tiers.get(tier).map(|d| tier_topic(topic, *d))
    }

    /// All tier topics for main topic `topic`, shortest delay first.
    pub fn tier_topics(&self, topic: &str) -> Vec<String> {
        self.tiers.iter().map(|d| tier_topic(topic, *d)).collect()
    }
}

/// `<topic>.retry.<delay>`, e.g. `orders.confirmation.retry.30s`.
pub fn tier_topic(topic: &str, delay: Duration) -> String {
    format!("{topic}.retry.{}", format_delay(delay))
}

/// Compact delay names for topic names: `250ms`, `5s`, `30s`, `5m`, `2h`.
pub fn format_delay(d: Duration) -> String {
    let ms = d.as_millis();
    if ms > 0 && ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms > 0 && ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms > 0 && ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// Parses a delay written by [`format_delay`] (`250ms`, `5s`, `5m`, `2h`).
pub fn parse_delay(s: &str) -> Option<Duration> {
    let (num, unit_ms) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3_600_000)
    } else {
        return None;
    };
    let n: u64 = num.parse().ok()?;
    Some(Duration::from_millis(n.checked_mul(unit_ms)?))
}

/// The retry tiers of `main` among `topics`, shortest delay first: what the
/// CLI uses to find "the first retry tier" without knowing the worker's
/// configured policy.
pub fn discover_tiers(main: &str, topics: &[String]) -> Vec<(Duration, String)> {
    let prefix = format!("{main}.retry.");
    let mut tiers: Vec<(Duration, String)> = topics
        .iter()
        .filter_map(|t| {
            let d = parse_delay(t.strip_prefix(&prefix)?)?;
            Some((d, t.clone()))
        })
        .collect();
    tiers.sort();
    tiers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn attempts_map_onto_tiers_and_reuse_the_last() {
        let p = RetryPolicy::tiers([s(5), s(30), s(300)])
            .max_attempts(10)
            .jitter(0.0);
        let tiers: Vec<usize> = (1..=6)
            .map(|a| p.plan(a, None, 0.0).map(|x| x.tier).unwrap_or(99))
            .collect();
        assert_eq!(tiers, vec![0, 1, 2, 2, 2, 2]);
        assert_eq!(p.plan(1, None, 0.0).map(|x| x.wait), Some(s(5)));
    }

    #[test]
    fn attempts_are_bounded() {
        let p = RetryPolicy::tiers([s(5), s(30)]);
        assert_eq!(p.max_attempts, 3);
        assert!(p.plan(2, None, 0.0).is_some());
        assert!(p.plan(3, None, 0.0).is_none(), "third failure is final");
        assert!(RetryPolicy::tiers([])
            .max_attempts(3)
            .plan(1, None, 0.0)
            .is_none());
    }

    #[test]
    fn jitter_only_adds() {
        let p = RetryPolicy::tiers([s(10)]).jitter(0.5);
        assert_eq!(p.plan(1, None, 0.0).map(|x| x.wait), Some(s(10)));
        assert_eq!(
            p.plan(1, None, 0.5).map(|x| x.wait),
            Some(Duration::from_millis(12_500))
        );
        assert!(p.plan(1, None, 0.999).map(|x| x.wait).unwrap_or_default() < s(15));
    }

    #[test]
    fn retry_after_is_a_floor_and_picks_a_long_enough_tier() {
        let p = RetryPolicy::tiers([s(5), s(30), s(300)]).jitter(0.0);
        let plan = |after: Duration| {
            p.plan(1, Some(after), 0.0)
                .map(|x| (x.tier, x.wait, x.release))
        };
        assert_eq!(plan(s(20)), Some((1, s(30), s(30))));
        assert_eq!(
            plan(s(3600)),
            Some((2, s(3600), s(300))),
            "longer than every tier: the last tier releases it after its own delay"
        );
        let (tier, wait, _) = plan(Duration::from_millis(5200)).unwrap_or_default();
        assert_eq!(tier, 1);
        assert!(wait >= Duration::from_millis(5200));
        // Hops towards a long wait: the longest tier that fits, then none.
        assert_eq!(p.hop(s(3300)), Some(2));
        assert_eq!(p.hop(s(100)), Some(1));
        assert_eq!(p.hop(s(4)), None);
    }

    #[test]
    fn topic_names() {
        let p = RetryPolicy::default();
        assert_eq!(
            p.tier_topics("orders.confirmation"),
            vec![
                "orders.confirmation.retry.5s",
                "orders.confirmation.retry.30s",
                "orders.confirmation.retry.5m",
                "orders.confirmation.retry.30m"
            ]
        );
        assert_eq!(format_delay(Duration::from_millis(250)), "250ms");
        assert_eq!(format_delay(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_delay(s(7200)), "2h");
    }

    #[test]
    fn delays_round_trip_and_tiers_are_discovered() {
        for d in [Duration::from_millis(250), s(5), s(90), s(300), s(7200)] {
            assert_eq!(parse_delay(&format_delay(d)), Some(d));
        }
        assert_eq!(parse_delay("5x"), None);
        assert_eq!(parse_delay("s"), None);
        let topics: Vec<String> = [
            "o.retry.30s",
            "o.retry.5s",
            "o.dlq",
            "o",
            "other.retry.1s",
            "o.retry.junk",
        ]
        .iter()
        .map(|t| t.to_string())
        .collect();
        let tiers = discover_tiers("o", &topics);
        assert_eq!(
            tiers,
            vec![
                (s(5), "o.retry.5s".to_string()),
                (s(30), "o.retry.30s".to_string())
            ]
        );
    }

    #[test]
    fn validation_explains() {
        assert!(RetryPolicy::default().validate().is_ok());
        assert!(RetryPolicy::tiers([]).max_attempts(3).validate().is_err());
        assert!(RetryPolicy::tiers([s(0)]).validate().is_err());
        assert!(RetryPolicy::tiers([]).max_attempts(1).validate().is_ok());
    }
}
