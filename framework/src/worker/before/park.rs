//! Parking: a job that waits for a downstream gives its handler slot back.
//!
//! An attempt may have to wait before its handler can run: for the schema
//! registry to serve its writer schema, for an open breaker, for a rate
//! limit's next token. Holding a concurrency slot meanwhile would let one
//! failing downstream stop every other job of the worker, so such a wait
//! goes through [`Waiter::wait`]: if the awaited future is not ready at
//! once, the job is *parked* (its slot goes back to the scheduler, its lane
//! stays taken, so its key's later jobs keep waiting behind it), and when
//! the future is ready the job asks for a slot again and goes on once it
//! has one. A wait that is ready at once costs nothing.
//!
//! A parked job has not started, so a revoke of its partition or a stop
//! releases it: [`Waiter::wait`] then answers `None` and the attempt ends
//! unfinished (re-delivered to the partition's next owner).

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::worker::scheduler::{Released, Ticket};

/// Where parked jobs give their slot back and ask for it again: the
/// worker's hub. The test harness has none (a wait there keeps its slot).
pub(crate) trait Slots: Send + Sync {
    /// The job gives its slot back while it waits.
    fn park(&self, ticket: Ticket);
    /// The job can go on. `None`: it has its slot back already; otherwise
    /// the receiver fires once it has.
    fn unpark(&self, ticket: Ticket) -> Option<oneshot::Receiver<()>>;
}

/// One attempt's means to wait without holding a slot. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Waiter {
    slots: Option<(Arc<dyn Slots>, Ticket)>,
    released: Released,
}

impl Waiter {
    /// A waiter for the job `ticket`, released by `released` (its
    /// partition's token).
    pub(crate) fn new(slots: Arc<dyn Slots>, ticket: Ticket, released: Released) -> Self {
        Self {
            slots: Some((slots, ticket)),
            released,
        }
    }

    /// A waiter that keeps the slot while it waits (the harness, and
    /// attempts run outside a scheduler).
    pub(crate) fn holding(released: Released) -> Self {
        Self {
            slots: None,
            released,
        }
    }

    /// Whether a wait gives the slot back (a worker's job; the harness's
    /// keep theirs): only such a job may wait long for others.
    pub(crate) fn parks(&self) -> bool {
        self.slots.is_some()
    }

    /// Cancelled when the job's partition is revoked or the worker stops.
    pub(crate) fn released(&self) -> &CancellationToken {
        &self.released
    }

    /// Awaits `until`, parked if it is not ready at once. `None` if the job
    /// was released meanwhile (it must end unfinished).
    pub(crate) async fn wait<F: Future>(&self, until: F) -> Option<F::Output> {
        let mut until = std::pin::pin!(until);
        if let Poll::Ready(v) = futures::poll!(until.as_mut()) {
            return Some(v);
        }
        if let Some((slots, ticket)) = &self.slots {
            slots.park(*ticket);
        }
        let value = tokio::select! {
            v = until => v,
            _ = self.released.cancelled() => return None,
        };
        if let Some((slots, ticket)) = &self.slots {
            if let Some(granted) = slots.unpark(*ticket) {
                tokio::select! {
                    r = granted => r.ok()?,
                    _ = self.released.cancelled() => return None,
                }
            }
        }
        Some(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Records park/unpark calls and grants later on request.
    #[derive(Default)]
    struct Log {
        calls: Mutex<Vec<&'static str>>,
        pending: Mutex<Option<oneshot::Sender<()>>>,
    }

    impl Slots for Log {
        fn park(&self, _: Ticket) {
            self.calls.lock().unwrap().push("park");
        }
        fn unpark(&self, _: Ticket) -> Option<oneshot::Receiver<()>> {
            self.calls.lock().unwrap().push("unpark");
            let (tx, rx) = oneshot::channel();
            *self.pending.lock().unwrap() = Some(tx);
            Some(rx)
        }
    }

    fn ticket() -> Ticket {
        Ticket::for_test(7)
    }

    #[tokio::test(start_paused = true)]
    async fn a_ready_wait_never_parks_and_a_pending_one_parks_until_granted() {
        let log = Arc::new(Log::default());
        let w = Waiter::new(log.clone(), ticket(), Default::default());
        assert_eq!(w.wait(async { 1 }).await, Some(1));
        assert!(
            log.calls.lock().unwrap().is_empty(),
            "no park for a ready wait"
        );

        let grant = {
            let log = log.clone();
            async move {
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                let tx = log.pending.lock().unwrap().take();
                tx.expect("asked for a slot").send(()).unwrap();
            }
        };
        let wait = w.wait(async {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            2
        });
        let (v, ()) = tokio::join!(wait, grant);
        assert_eq!(v, Some(2));
        assert_eq!(*log.calls.lock().unwrap(), ["park", "unpark"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_ends_a_parked_wait_and_a_wait_for_a_grant() {
        let log = Arc::new(Log::default());
        let released = std::sync::Arc::new(CancellationToken::new());
        let w = Waiter::new(log.clone(), ticket(), released.clone());
        let cancel = async {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            released.cancel();
        };
        let (v, ()) = tokio::join!(w.wait(std::future::pending::<()>()), cancel);
        assert_eq!(v, None);

        // Waiting for a grant that never comes: released too.
        let released = std::sync::Arc::new(CancellationToken::new());
        let w = Waiter::new(log.clone(), ticket(), released.clone());
        let cancel = async {
            tokio::time::sleep(std::time::Duration::from_secs(3)).await;
            released.cancel();
        };
        let wait = w.wait(tokio::time::sleep(std::time::Duration::from_secs(1)));
        let (v, ()) = tokio::join!(wait, cancel);
        assert_eq!(v, None);
    }
}
