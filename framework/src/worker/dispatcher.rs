//! Dispatcher tasks: where `Run` batches execute on the async runtime.
//!
//! The worker starts one dispatcher per runtime thread. Each receives its
//! share of every batch the scheduler releases and drives those attempts
//! concurrently in one `FuturesUnordered`, so no task is spawned per record
//! and the poll thread wakes each dispatcher once per batch, not per
//! record. Completions go back to the poll thread in batches: whatever
//! finished together is sent as one message.

use std::sync::mpsc::Sender;
use std::sync::Arc;

use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use rdkafka::message::OwnedMessage;
use tokio::sync::mpsc::UnboundedReceiver;

use super::pipeline::Pipeline;
use super::poll::Done;
use super::scheduler::Job;
use crate::dlq::now_ms;

/// Runs batches from `jobs` until the channel closes and every attempt
/// finished (or the task is aborted at the end of the grace period).
pub(super) async fn run(
    pipeline: Arc<Pipeline>,
    mut jobs: UnboundedReceiver<Vec<Job<OwnedMessage>>>,
    done: Sender<Done>,
) {
    let mut running = FuturesUnordered::new();
    let mut open = true;
    loop {
        tokio::select! {
            batch = jobs.recv(), if open => match batch {
                Some(batch) => {
                    for job in batch {
                        let p = pipeline.clone();
                        running.push(async move {
                            let a = p.attempt(&job.item, rand::random::<f64>(), now_ms()).await;
                            (job.ticket, a.outcome.is_final())
                        });
                    }
                }
                None => open = false,
            },
            Some(first) = running.next(), if !running.is_empty() => {
                let mut finished = vec![first];
                while let Some(Some(more)) = running.next().now_or_never() {
                    finished.push(more);
                }
                if done.send(finished).is_err() {
                    return;
                }
            }
            else => return,
        }
    }
}
