//! The time kjob reads: wall-clock milliseconds since the Unix epoch, the
//! unit of every time header (`kjob-due-at`, `kjob-first-failed-at`, ...).
//!
//! The attempt pipeline reads it through a `Clock` (crate-private), so the test harness
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
}
