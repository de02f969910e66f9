//! The time kjob reads: wall-clock milliseconds since the Unix epoch, the
//! unit of every time header (`kjob-due-at`, `kjob-first-failed-at`, ...).
//!
//! The attempt pipeline reads it through a `Clock`, so the test harness
//! can run the same pipeline on a virtual clock.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 if the system clock is before it).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Milliseconds since the Unix epoch, rounded up: the time a wait counts
/// from. A wait added to [`now_ms`] (rounded down) could end up to a
/// millisecond before the moment it was meant to follow; added to this it
/// never ends early.
pub(crate) fn now_ms_rounded_up() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| {
            let ms = d.as_nanos().div_ceil(1_000_000);
            i64::try_from(ms).unwrap_or(i64::MAX)
        })
        .unwrap_or(0)
}

/// Where the pipeline takes the time from.
#[derive(Clone, Debug, Default)]
pub(crate) enum Clock {
    /// The system clock (the worker).
    #[default]
    Wall,
    /// A clock that moves only when told to (the test harness).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    Virtual(Arc<AtomicI64>),
}

impl Clock {
    /// Now, in epoch milliseconds.
    pub(crate) fn now_ms(&self) -> i64 {
        match self {
            Clock::Wall => now_ms(),
            Clock::Virtual(ms) => ms.load(Ordering::Relaxed),
        }
    }

    /// Now, rounded up to the next whole millisecond: the instant a retry's
    /// wait counts from, so that a Retry-After of 8 s never runs sooner
    /// than 8 s after the answer. A virtual clock holds whole milliseconds
    /// already, so the harness and the worker compute the same due times.
    pub(crate) fn failed_at_ms(&self) -> i64 {
        match self {
            Clock::Wall => now_ms_rounded_up(),
            Clock::Virtual(ms) => ms.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_time_is_never_before_the_clock() {
        for _ in 0..1_000 {
            let before = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let up = Clock::Wall.failed_at_ms() as u128 * 1_000_000;
            assert!(up >= before, "{up} ns is before {before} ns");
        }
        let virtual_clock = Clock::Virtual(Arc::new(AtomicI64::new(1_234)));
        assert_eq!(virtual_clock.failed_at_ms(), 1_234);
        assert_eq!(virtual_clock.failed_at_ms(), virtual_clock.now_ms());
    }
}
