//! The worker's side of a batch: a finished job's `done` event, written and
//! acknowledged before the job's offset may be committed.
//!
//! One event per job would cost a produce per job; the recorder gathers
//! what finishes within [`LINGER`] into one event per batch (at most
//! [`MAX_IDS`] ids each), and answers every job of it once the broker has
//! that event. The job waits for the answer parked, without a handler slot.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::message::OwnedHeaders;
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

use super::event::Event;
use crate::producer::Producer;

/// How long finished jobs are gathered before their events are written.
const LINGER: Duration = Duration::from_millis(2);
/// The most job ids in one event (about 40 bytes each in JSON).
const MAX_IDS: usize = 5000;

struct Finished {
    batch: String,
    id: String,
    ok: bool,
    acked: oneshot::Sender<bool>,
}

/// Records finished batch jobs on the batch topic. Cheap to share.
pub(crate) struct Recorder {
    tx: mpsc::UnboundedSender<Finished>,
}

impl Recorder {
    /// A recorder writing to `topic` through `producer`; its task ends when
    /// the recorder is dropped.
    pub(crate) fn start(producer: Producer, topic: String) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(gather(producer, topic, rx));
        Self { tx }
    }

    /// Records that job `id` of `batch` finished (`ok`: it succeeded;
    /// otherwise it was dead-lettered). `true` once the broker has it.
    pub(crate) async fn record(&self, batch: &str, id: &str, ok: bool) -> bool {
        let (acked, rx) = oneshot::channel();
        let sent = self.tx.send(Finished {
            batch: batch.to_string(),
            id: id.to_string(),
            ok,
            acked,
        });
        sent.is_ok() && rx.await.unwrap_or(false)
    }
}

async fn gather(producer: Producer, topic: String, mut rx: mpsc::UnboundedReceiver<Finished>) {
    while let Some(first) = rx.recv().await {
        tokio::time::sleep(LINGER).await;
        let mut round = vec![first];
        while let Ok(f) = rx.try_recv() {
            round.push(f);
        }
        // Written concurrently with the next round's gathering.
        tokio::spawn(write(producer.clone(), topic.clone(), round));
    }
}

async fn write(producer: Producer, topic: String, round: Vec<Finished>) {
    let mut per_batch: HashMap<String, Vec<Finished>> = HashMap::new();
    for f in round {
        per_batch.entry(f.batch.clone()).or_default().push(f);
    }
    let mut writes = Vec::new();
    for (batch, jobs) in per_batch {
        let mut jobs = jobs;
        while !jobs.is_empty() {
            let rest = jobs.split_off(jobs.len().min(MAX_IDS));
            let chunk = std::mem::replace(&mut jobs, rest);
            let (producer, topic, batch) = (producer.clone(), topic.clone(), batch.clone());
            writes.push(async move {
                let (mut ok, mut dead) = (Vec::new(), Vec::new());
                for f in &chunk {
                    if f.ok {
                        ok.push(f.id.clone());
                    } else {
                        dead.push(f.id.clone());
                    }
                }
                let event = Event::Done {
                    batch: batch.clone(),
                    ok,
                    dead,
                };
                let sent = producer
                    .send_raw(
                        &topic,
                        Some(batch.as_bytes()),
                        Some(&event.to_json()),
                        OwnedHeaders::new(),
                    )
                    .await;
                if let Err(e) = &sent {
                    warn!(batch = %batch, topic = %topic, jobs = chunk.len(), error = %e, "could not record finished batch jobs; they run again");
                }
                for f in chunk {
                    let _ = f.acked.send(sent.is_ok());
                }
            });
        }
    }
    futures::future::join_all(writes).await;
}
