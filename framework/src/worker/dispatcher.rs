//! Dispatcher tasks: where `Run` batches execute on the async runtime.
//!
//! The worker starts one dispatcher per runtime thread. Each receives its
//! share of every batch the poll thread releases and drives those attempts
//! concurrently in one `FuturesUnordered`, so no task is spawned per record
//! and the poll thread wakes each dispatcher once per batch, not per
//! record. Whatever finished together is reported to the scheduler in one
//! call ([`Hub::finished`]), and the jobs that frees up start here at once:
//! a slot is refilled without waiting for the poll thread.

use std::sync::Arc;

use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use tokio::sync::mpsc::UnboundedReceiver;

use super::hub::Hub;
use super::park::Waiter;
use super::pipeline::Pipeline;
use super::polled::Polled;
use super::scheduler::{Job, Ticket};
use crate::dlq::now_ms;

/// Runs batches from `jobs`, and what their completions release, until the
/// channel closes and every attempt finished (or the task is aborted at the
/// end of the grace period). `me` is this dispatcher's index in the hub.
pub(super) async fn run(
    pipeline: Arc<Pipeline>,
    hub: Arc<Hub>,
    me: usize,
    mut jobs: UnboundedReceiver<Vec<Job<Polled>>>,
) {
    let mut running = FuturesUnordered::new();
    let start = |running: &mut FuturesUnordered<_>, batch: Vec<Job<Polled>>| {
        // One clock read per batch: its jobs start together.
        let now = now_ms();
        for job in batch {
            let p = pipeline.clone();
            let waiter = match pipeline.park {
                true => Waiter::new(hub.clone(), job.ticket, job.released),
                false => Waiter::holding(job.released),
            };
            running.push(async move {
                let a = p
                    .attempt(&job.item, &waiter, rand::random::<f64>(), now)
                    .await;
                (job.ticket, a.outcome.is_final())
            });
        }
    };
    let mut open = true;
    loop {
        tokio::select! {
            batch = jobs.recv(), if open => match batch {
                Some(batch) => start(&mut running, batch),
                None => open = false,
            },
            Some(first) = running.next(), if !running.is_empty() => {
                let mut finished: Vec<(Ticket, bool)> = vec![first];
                while let Some(Some(more)) = running.next().now_or_never() {
                    finished.push(more);
                }
                let released = hub.finished(me, finished);
                if !released.is_empty() {
                    start(&mut running, released);
                }
            }
            else => return,
        }
    }
}
