//! The worker's side of a batch: a finished job's `done` event, on the
//! batch topic before the job's offset is committed.
//!
//! A job of a batch that finished is pushed here (a lock and a push; the
//! job does not wait) before the scheduler marks its offset done. A writer
//! task gathers what was pushed within [`LINGER`] into one event per batch
//! (at most [`MAX_IDS`] ids each) and writes it, retrying until the broker
//! has it. Before every offset commit the poll thread passes
//! [`Recorder::barrier`]: it waits until everything pushed so far is
//! acknowledged, or skips that commit. So a committed offset never covers a
//! job whose completion could still be lost; a worker killed before the
//! event was written re-runs the job (its next owner does), and the
//! coordinator counts it once by its id.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::message::OwnedHeaders;
use tokio::sync::Notify;
use tracing::warn;

use super::event::Event;
use crate::producer::Producer;

/// How long finished jobs are gathered before their events are written.
const LINGER: Duration = Duration::from_millis(2);
/// The most job ids in one event (about 40 bytes each in JSON).
const MAX_IDS: usize = 5000;

#[derive(Default)]
struct Pending {
    /// (batch, job id, succeeded)
    jobs: Vec<(String, String, bool)>,
    /// Jobs pushed since the start (the last one's sequence number).
    pushed: u64,
    closed: bool,
}

#[derive(Default)]
struct Shared {
    pending: Mutex<Pending>,
    /// Jobs whose events the broker acknowledged, in push order.
    acked: Mutex<u64>,
    acked_changed: Condvar,
    wake: Notify,
}

/// Records finished batch jobs on the batch topic. Shared by the pipeline
/// (which pushes) and the poll thread (which passes the barrier).
pub(crate) struct Recorder {
    shared: Arc<Shared>,
}

impl Recorder {
    /// A recorder writing to `topic` through `producer`; its writer ends,
    /// after writing what is left, when the recorder is dropped.
    pub(crate) fn start(producer: Producer, topic: String) -> Self {
        let shared = Arc::new(Shared::default());
        tokio::spawn(write_loop(producer, topic, shared.clone()));
        Self { shared }
    }

    /// Job `id` of `batch` finished (`ok`: succeeded; otherwise it was
    /// dead-lettered). Call it before the job's offset may be marked done.
    pub(crate) fn push(&self, batch: &str, id: &str, ok: bool) {
        let first = {
            let mut p = self
                .shared
                .pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            p.jobs.push((batch.to_string(), id.to_string(), ok));
            p.pushed += 1;
            p.jobs.len() == 1
        };
        if first {
            self.shared.wake.notify_one();
        }
    }

    /// Blocks (the poll thread) until every job pushed before this call is
    /// acknowledged on the batch topic; `false` after `within` without
    /// that (the commit must then wait for the next round).
    pub(crate) fn barrier(&self, within: Duration) -> bool {
        let target = self
            .shared
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pushed;
        let deadline = Instant::now() + within;
        let mut acked = self
            .shared
            .acked
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        while *acked < target {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            acked = self
                .shared
                .acked_changed
                .wait_timeout(acked, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.shared
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .closed = true;
        self.shared.wake.notify_one();
    }
}

async fn write_loop(producer: Producer, topic: String, shared: Arc<Shared>) {
    loop {
        let (jobs, through, closed) = {
            let mut p = shared
                .pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            (std::mem::take(&mut p.jobs), p.pushed, p.closed)
        };
        if jobs.is_empty() {
            if closed {
                return;
            }
            shared.wake.notified().await;
            // Gather what finishes meanwhile into the same events.
            tokio::time::sleep(LINGER).await;
            continue;
        }
        write_round(&producer, &topic, jobs).await;
        *shared.acked.lock().unwrap_or_else(PoisonError::into_inner) = through;
        shared.acked_changed.notify_all();
    }
}

/// Writes one round's events, retrying each until the broker has it: the
/// jobs are done in the scheduler already, so their events must not be
/// dropped (their offsets stay uncommitted meanwhile).
async fn write_round(producer: &Producer, topic: &str, jobs: Vec<(String, String, bool)>) {
    let mut per_batch: HashMap<String, (Vec<String>, Vec<String>)> = HashMap::new();
    for (batch, id, ok) in jobs {
        let e = per_batch.entry(batch).or_default();
        if ok {
            e.0.push(id);
        } else {
            e.1.push(id);
        }
    }
    let mut events = Vec::new();
    for (batch, (ok, dead)) in per_batch {
        for chunk in ok.chunks(MAX_IDS) {
            events.push(Event::Done {
                batch: batch.clone(),
                ok: chunk.to_vec(),
                dead: Vec::new(),
            });
        }
        for chunk in dead.chunks(MAX_IDS) {
            events.push(Event::Done {
                batch: batch.clone(),
                ok: Vec::new(),
                dead: chunk.to_vec(),
            });
        }
    }
    let writes = events.into_iter().map(|event| async move {
        let body = event.to_json();
        let mut wait = Duration::from_millis(100);
        loop {
            let sent = producer
                .send_raw(
                    topic,
                    Some(event.batch().as_bytes()),
                    Some(&body),
                    OwnedHeaders::new(),
                )
                .await;
            match sent {
                Ok(_) => return,
                Err(e) => {
                    warn!(batch = %event.batch(), topic, error = %e, "could not record finished batch jobs; retrying (their offsets stay uncommitted)");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
            }
        }
    });
    futures::future::join_all(writes).await;
}
