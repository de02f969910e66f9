//! Dispatcher tasks: where `Run` batches execute on the async runtime.
//!
//! The worker starts one dispatcher per runtime thread but one ([`count`]:
//! the poll thread and librdkafka's threads need a core too). Each receives its
//! share of every batch the poll thread releases and drives those attempts
//! concurrently in one `FuturesUnordered`, so no task is spawned per record
//! and the poll thread wakes each dispatcher once per batch, not per
//! record. Whatever finished together is reported to the scheduler in one
//! call ([`Hub::finished`]), and the jobs that frees up start here at once:
//! a slot is refilled without waiting for the poll thread.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::clock::now_ms;
use crate::worker::before::park::Waiter;
use crate::worker::dispatch::hub::Hub;
use crate::worker::intake::polled::Polled;
use crate::worker::pipeline::Pipeline;
use crate::worker::scheduler::{Job, Ticket};

/// How many dispatchers a runtime of `workers` threads gets: all but one,
/// at least one.
pub(in crate::worker) fn count(workers: usize) -> usize {
    workers.saturating_sub(1).max(1)
}

/// Runs batches from `jobs`, and what their completions release, until the
/// channel closes and every attempt finished (or the task is aborted at the
/// end of the grace period). `me` is this dispatcher's index in the hub.
pub(in crate::worker) async fn run(
    pipeline: Arc<Pipeline>,
    hub: Arc<Hub>,
    me: usize,
    mut jobs: UnboundedReceiver<Vec<Job<Polled>>>,
) {
    let mut running = FuturesUnordered::new();
    // Reused across completion batches: one pair of allocations per
    // dispatcher, not per batch.
    let mut finished: Vec<(Ticket, bool)> = Vec::new();
    let mut records: Vec<Polled> = Vec::new();
    // Each job's future is boxed and polled once right here. Most finish
    // at that first poll (a handler that does not wait) and never enter
    // `running`: no task node, ready queue or waker per job. One that is
    // pending moves into `running`, which polls it again with its own
    // waker before anything can wake it (a future only has to wake the
    // waker of its latest poll), so the first poll's waker does nothing.
    let start = |running: &mut FuturesUnordered<_>,
                 finished: &mut Vec<(Ticket, bool)>,
                 records: &mut Vec<Polled>,
                 batch: Vec<Job<Polled>>| {
        // One clock read per batch: its jobs start together.
        let now = now_ms();
        let mut first = Context::from_waker(futures::task::noop_waker_ref());
        let mut rest = batch.into_iter();
        let mut next = rest.next();
        while let Some(job) = next {
            next = rest.next();
            // The poll thread wrote each record on another core, long
            // before it runs here: its first read is a cache miss, and
            // those misses were a sixth of this thread's time in a no-op
            // run. Fetched while the jobs before it run, two steps ahead:
            // the record's fields for the job after next, then the bytes
            // those fields point to for the next (CHANGELOG.md's benchmark history,
            // issue 29's ninth step).
            if let Some(after) = rest.as_slice().first() {
                after.item.prefetch_fields();
            }
            if let Some(n) = &next {
                n.item.prefetch_bytes();
            }
            // Borrowed, not cloned: an `Arc` clone per job is an atomic
            // add on a cache line every dispatcher touches.
            let p = &*pipeline;
            let waiter = match pipeline.park {
                true => Waiter::new(hub.clone(), job.ticket, job.released),
                false => Waiter::holding(job.released),
            };
            let mut attempt = Box::pin(one(p, job.item, job.ticket, waiter, now));
            match attempt.as_mut().poll(&mut first) {
                Poll::Ready((ticket, last, record)) => {
                    finished.push((ticket, last));
                    records.push(record);
                }
                Poll::Pending => running.push(attempt),
            }
        }
    };
    let mut open = true;
    loop {
        tokio::select! {
            batch = jobs.recv(), if open => match batch {
                Some(batch) => start(&mut running, &mut finished, &mut records, batch),
                None => open = false,
            },
            Some(first) = running.next(), if !running.is_empty() => {
                let mut next = Some(first);
                while let Some((ticket, last, record)) = next {
                    finished.push((ticket, last));
                    records.push(record);
                    next = running.next().now_or_never().flatten();
                }
            }
            else => return,
        }
        // What finished since the last report, at its first poll or in
        // `running`, is reported in one call; the jobs that frees start at
        // once, and what of those finishes at once is reported next.
        let mut rounds = 0u32;
        while !finished.is_empty() {
            // Destroyed and reused on the poll thread, not here (see
            // crate::worker::intake::recycle).
            hub.returned.give(&mut records);
            let released = hub.finished(me, &mut finished);
            if !released.is_empty() {
                start(&mut running, &mut finished, &mut records, released);
            }
            // A long run of jobs that all finish at once still lets this
            // runtime thread's other tasks (timers, commits) have a turn.
            rounds += 1;
            if rounds.is_multiple_of(YIELD_EVERY) {
                tokio::task::yield_now().await;
            }
        }
    }
}

/// How many completion reports in a row a dispatcher makes before it
/// yields to its runtime thread's other tasks.
const YIELD_EVERY: u32 = 32;

/// One job's attempt as a dispatcher drives it: what it allocates per job
/// (boxed before its first poll). It hands the record back with the ticket
/// for the scheduler and whether the attempt was final.
///
/// Kept under `MAX_JOB_FUTURE` (a test checks): glibc's per-thread cache
/// serves requests up to 1 032 bytes without a lock or a search, and
/// anything larger is freed through its bins, where coalescing
/// (`malloc_consolidate`) took a sixth of this thread's time when an
/// attempt's future was 1.8 KiB.
///
/// An `async` block, not an `async fn`: an `async fn`'s future keeps its
/// arguments twice (as received and as moved into its body).
#[allow(clippy::manual_async_fn)]
fn one(
    p: &Pipeline,
    record: Polled,
    ticket: Ticket,
    waiter: Waiter,
    now: i64,
) -> impl std::future::Future<Output = (Ticket, bool, Polled)> + '_ {
    async move {
        let a = p
            .attempt(&record, &waiter, rand::random::<f64>(), now)
            .await;
        (ticket, a.outcome.is_final(), record)
    }
}

/// The bound on [`one`]'s future: below glibc's thread cache limit, with
/// room to spare.
#[cfg(test)]
const MAX_JOB_FUTURE: usize = 896;

#[cfg(test)]
mod tests {
    /// The size of the future `make` would return, without calling it.
    fn future_size<F: std::future::Future>(_: impl FnOnce() -> F) -> usize {
        std::mem::size_of::<F>()
    }

    #[test]
    #[allow(unreachable_code, clippy::diverging_sub_expression)]
    fn a_jobs_future_stays_within_the_allocators_thread_cache() {
        let size = future_size(|| {
            let (p, record, ticket, waiter): (
                &super::Pipeline,
                super::Polled,
                super::Ticket,
                super::Waiter,
            ) = unreachable!("only the type is needed");
            super::one(p, record, ticket, waiter, 0)
        });
        assert!(
            size <= super::MAX_JOB_FUTURE,
            "a job's future is {size} bytes, over {}: box what it holds across an await on a rare path",
            super::MAX_JOB_FUTURE
        );
    }

    #[test]
    fn one_runtime_thread_is_left_for_the_poll_and_broker_threads() {
        assert_eq!(super::count(0), 1);
        assert_eq!(super::count(1), 1);
        assert_eq!(super::count(2), 1);
        assert_eq!(super::count(8), 7);
    }
}
