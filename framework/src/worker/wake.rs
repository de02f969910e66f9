//! The poll thread's wake-up, in a room of its own: the intake's queues,
//! the hub's completions and the consumer context all ring it, and none of
//! them should depend on another for that.

#[cfg(test)]
use std::sync::atomic::Ordering;

/// Wakes the poll thread when any queue it reads turns non-empty, or when
/// a completion leaves it a consumer action ([`crate::worker::dispatch::hub::Hub`]).
///
/// librdkafka wakes a thread blocked in one queue only for that queue, and
/// the poll thread reads many. So it blocks in none: it parks, and every
/// queue's non-empty callback (the main queue's too) unparks it. The
/// callbacks run on librdkafka's threads and take no lock of its own, so
/// they cannot deadlock with it; an unpark that comes before the park makes
/// the park return at once, so none is lost.
#[derive(Default)]
pub(crate) struct Wake {
    thread: std::sync::OnceLock<std::thread::Thread>,
    /// Wake-ups so far, for the tests.
    #[cfg(test)]
    pub(crate) notified: std::sync::atomic::AtomicUsize,
}

impl Wake {
    /// Called once, on the poll thread, before its first wait.
    pub(crate) fn register(&self) {
        let _ = self.thread.set(std::thread::current());
    }

    /// A queue turned non-empty, or the poll thread has an action to carry
    /// out.
    pub(crate) fn notify(&self) {
        #[cfg(test)]
        self.notified.fetch_add(1, Ordering::Relaxed);
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }
}
