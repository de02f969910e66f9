//! Batches: fan out many jobs, then run one callback when every one of
//! them has finished (Sidekiq's batches, Celery's chords).
//!
//! ```no_run
//! # use kjob::prelude::*;
//! # #[derive(serde::Serialize, serde::Deserialize, Job)]
//! # #[job(name = "mail.send", version = 1, key = to)]
//! # struct SendMail { to: String }
//! # #[derive(serde::Serialize, serde::Deserialize, Job)]
//! # #[job(name = "report.send", version = 1, key = campaign)]
//! # struct SendReport { campaign: String }
//! # async fn f(producer: Producer) -> kjob::Result<()> {
//! let batch = producer
//!     .batch("newsletter-2026-12")?
//!     .on_complete(SendReport { campaign: "2026-12".into() });
//! for to in ["a@example.com", "b@example.com"] {
//!     batch.enqueue(&SendMail { to: to.into() }).await?;
//! }
//! batch.seal().await?; // the total is known from here on
//! # Ok(()) }
//! ```
//!
//! The worker that runs the callback's route reads the counts from
//! [`crate::JobContext::batch_report`]. Workers that run the batch's jobs,
//! and at least one that coordinates, are built with
//! [`crate::WorkerBuilder::batches`].
//!
//! How it holds under at-least-once delivery:
//! - every job carries its batch id (`kjob-batch`); when it finished
//!   (succeeded, or dead-lettered after its attempts or as permanent), its
//!   worker writes a `done` event, keyed by the batch id, to the batch
//!   topic (`kjob.batches`), and the job's offset may be committed only
//!   once the broker acknowledged that event: a worker killed in between
//!   runs the job again and writes it again;
//! - the owner of the batch's partition of that topic (a consumer group of
//!   the workers, `kjob.batches.coordinator`) folds the events, counting
//!   by job id, so a redelivered `done` never counts twice, and snapshots
//!   the fold to the compacted `kjob.batches.state` before it commits: a
//!   new owner resumes from the snapshots and the committed offset;
//! - when the sealed batch's last job finished, the owner writes the
//!   callback with the job id `batch:<id>:complete` (or `:success`) and
//!   records that it did: if it dies between the two, the next owner
//!   writes it again with the same id, which `PgMarkers` recognises as a
//!   duplicate.
//!
//! A job re-driven from the DLQ that then succeeds moves one count from
//! dead-lettered to succeeded, also after the callback fired: `on_complete`
//! does not fire again (`kjob batches show` has the new counts), and an
//! `on_success` that waited because something was dead-lettered fires now
//! if nothing is left dead-lettered.

pub(crate) mod coordinator;
pub mod event;
mod fold;
pub(crate) mod recorder;
pub(crate) mod report;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use rdkafka::message::OwnedHeaders;

pub use event::{Callback, Event, When};
pub use fold::{BatchState, Cancel, Status};
pub use report::BatchReport;

use crate::codec::Codec;
use crate::error::{Error, Result};
use crate::job::Job;
use crate::producer::{prepare_job, Enqueued, Producer};

/// The batch topic when none is named: one per cluster, shared by every
/// group that uses batches.
pub const DEFAULT_TOPIC: &str = "kjob.batches";

/// Its partition count when a worker creates it: the coordinators of 6
/// workers share the folding; the events are small.
pub const DEFAULT_PARTITIONS: i32 = 6;

/// The longest batch id, in bytes: it is a record key and part of the
/// callback's job id.
pub const MAX_ID_BYTES: usize = 200;

/// How many enqueued jobs a handle counts before it writes an `added`
/// event (also written by [`Batch::flush`] and [`Batch::seal`]).
const ADDED_EVERY: u64 = 1000;

/// The compacted topic holding one snapshot per batch of `topic`.
pub fn state_topic(topic: &str) -> String {
    format!("{topic}.state")
}

/// Every batch's last snapshot on the state topic of `topic`, or only
/// those of `partition` (a coordinator taking it over). Empty when the state
/// topic does not exist; an unreadable record is skipped with a warning.
/// Blocking.
pub fn read_states(
    config: &crate::KafkaConfig,
    topic: &str,
    partition: Option<i32>,
) -> Result<std::collections::HashMap<String, BatchState>> {
    use rdkafka::message::Message as _;
    let mut out = std::collections::HashMap::new();
    let state = state_topic(topic);
    let Some(records) = crate::topics::read_topic_as(config, &state, &coordinator_group(topic))?
    else {
        return Ok(out);
    };
    for m in records
        .iter()
        .filter(|m| partition.is_none_or(|p| m.partition() == p))
    {
        let Some(key) = m.key().map(|k| String::from_utf8_lossy(k).into_owned()) else {
            continue;
        };
        match m.payload().map(serde_json::from_slice::<BatchState>) {
            None => {
                out.remove(&key);
            }
            Some(Ok(s)) => {
                out.insert(key, s);
            }
            Some(Err(e)) => {
                tracing::warn!(topic = %state, batch = %key, error = %e, "unreadable batch snapshot; ignored")
            }
        }
    }
    Ok(out)
}

/// The consumer group whose members fold `topic`'s events.
pub fn coordinator_group(topic: &str) -> String {
    format!("{topic}.coordinator")
}

/// The job id of a batch's callback: derived from the batch id, so a
/// second write of it is a recognised duplicate.
pub fn callback_id(batch: &str, when: When) -> String {
    format!("batch:{batch}:{}", when.as_str())
}

/// Refuses an id that is empty, longer than [`MAX_ID_BYTES`] or holds a
/// control character (it is shown in tables and logs).
pub fn check_id(id: &str) -> Result<()> {
    let refuse = |reason: &str| {
        let mut cut = MAX_ID_BYTES.min(id.len());
        while !id.is_char_boundary(cut) {
            cut -= 1;
        }
        Err(Error::Batch {
            batch: id[..cut].to_string(),
            reason: reason.to_string(),
        })
    };
    if id.trim().is_empty() {
        return refuse("the batch id is empty; name the batch, e.g. `newsletter-2026-12`");
    }
    if id.len() > MAX_ID_BYTES {
        return refuse(&format!(
            "the batch id is {} bytes long; at most {MAX_ID_BYTES} are allowed",
            id.len()
        ));
    }
    if id.chars().any(char::is_control) {
        return refuse("the batch id holds a control character; use printable text");
    }
    Ok(())
}

// The batch capability gives the producer its entry point here, so the
// producer does not depend on the batch machinery built on it.
impl Producer {
    /// A batch of jobs whose callback runs once every one of them has
    /// finished (see [`crate::batch`]). Refuses an empty or overlong id.
    pub fn batch(&self, id: &str) -> Result<Batch> {
        Batch::new(self.clone(), id)
    }
}

type Encode =
    Arc<dyn Fn(Arc<Codec>) -> Pin<Box<dyn Future<Output = Result<Callback>> + Send>> + Send + Sync>;

/// A batch being filled, from [`Producer::batch`]. Share it (it is cheap
/// to clone) between the tasks that enqueue; other processes that add to
/// the same batch open their own handle with the same id and call
/// [`Batch::flush`] when done, before one of them seals it.
#[derive(Clone)]
pub struct Batch {
    producer: Producer,
    id: String,
    topic: String,
    callbacks: Vec<(When, Encode)>,
    opened: Arc<tokio::sync::OnceCell<()>>,
    unflushed: Arc<AtomicU64>,
    sealed: Arc<AtomicBool>,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("id", &self.id)
            .field("topic", &self.topic)
            .finish()
    }
}

impl Batch {
    pub(crate) fn new(producer: Producer, id: &str) -> Result<Self> {
        check_id(id)?;
        Ok(Self {
            producer,
            id: id.to_string(),
            topic: DEFAULT_TOPIC.to_string(),
            callbacks: Vec::new(),
            opened: Arc::default(),
            unflushed: Arc::default(),
            sealed: Arc::default(),
        })
    }

    /// The batch id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Uses another batch topic than [`DEFAULT_TOPIC`] (its workers name
    /// the same with [`crate::WorkerBuilder::batches_on`]).
    pub fn topic(mut self, topic: &str) -> Self {
        self.topic = topic.to_string();
        self
    }

    /// Runs `job` (on its main topic) once every job of the sealed batch
    /// finished, succeeded or dead-lettered.
    pub fn on_complete<J: Job + Send + Sync + 'static>(self, job: J) -> Self {
        self.callback(When::Complete, J::NAME, job)
    }

    /// Runs `job` (on its main topic) once every job of the sealed batch
    /// succeeded: not while any is dead-lettered.
    pub fn on_success<J: Job + Send + Sync + 'static>(self, job: J) -> Self {
        self.callback(When::Success, J::NAME, job)
    }

    /// [`Batch::on_complete`] or [`Batch::on_success`] with the callback
    /// on `topic` instead of its main topic.
    pub fn callback_to<J: Job + Send + Sync + 'static>(
        self,
        when: When,
        topic: &str,
        job: J,
    ) -> Self {
        self.callback(when, topic, job)
    }

    fn callback<J: Job + Send + Sync + 'static>(mut self, when: When, topic: &str, job: J) -> Self {
        let (job, topic) = (Arc::new(job), topic.to_string());
        let encode: Encode = Arc::new(move |codec: Arc<Codec>| {
            let (job, topic) = (job.clone(), topic.clone());
            Box::pin(async move {
                let contract = codec.register::<J>(&topic).await?;
                let payload = Codec::encode(&contract, job.as_ref())?;
                Ok(Callback {
                    when,
                    topic,
                    job: J::NAME.to_string(),
                    version: J::VERSION,
                    key: job.key(),
                    payload,
                })
            })
        });
        self.callbacks.retain(|(w, _)| *w != when);
        self.callbacks.push((when, encode));
        self
    }

    async fn send(&self, event: &Event) -> Result<()> {
        self.producer
            .send_raw(
                &self.topic,
                Some(self.id.as_bytes()),
                Some(&event.to_json()),
                OwnedHeaders::new(),
            )
            .await
            .map(|_| ())
    }

    fn missing_topic(&self) -> Error {
        Error::Batch {
            batch: self.id.clone(),
            reason: format!(
                "the batch topic `{}` does not exist; a worker built with WorkerBuilder::batches() creates it (and `{}`) at start: start one first",
                self.topic,
                state_topic(&self.topic)
            ),
        }
    }

    /// Writes the `open` event (with the callbacks) once per handle.
    async fn open(&self) -> Result<()> {
        self.opened
            .get_or_try_init(|| async {
                let names = [self.topic.clone()];
                let counts =
                    crate::topics::partition_counts_async(self.producer.config(), &names).await?;
                if counts.first().copied().flatten().is_none() {
                    return Err(self.missing_topic());
                }
                let mut callbacks = Vec::with_capacity(self.callbacks.len());
                for (_, encode) in &self.callbacks {
                    callbacks.push(encode(self.producer.codec().clone()).await?);
                }
                self.send(&Event::Open {
                    batch: self.id.clone(),
                    at_ms: crate::clock::now_ms(),
                    by: whoami(),
                    callbacks,
                })
                .await
            })
            .await
            .map(|_| ())
    }

    fn refuse_sealed(&self) -> Result<()> {
        if self.sealed.load(Ordering::Acquire) {
            return Err(Error::Batch {
                batch: self.id.clone(),
                reason: "it is sealed: its total is fixed, so no job can be added; open a new batch for more work".into(),
            });
        }
        Ok(())
    }

    /// Enqueues `job` on its main topic as a member of the batch.
    pub async fn enqueue<J: Job>(&self, job: &J) -> Result<Enqueued> {
        self.enqueue_to(J::NAME, job).await
    }

    /// [`Batch::enqueue`] on an explicit topic. A batch may span routes.
    pub async fn enqueue_to<J: Job>(&self, topic: &str, job: &J) -> Result<Enqueued> {
        self.refuse_sealed()?;
        self.open().await?;
        let mut prepared = prepare_job(
            self.producer.codec(),
            topic,
            job,
            "send",
            Some(self.producer.bootstrap()),
            None,
            None,
        )
        .await?;
        prepared.headers.batch = Some(self.id.clone());
        let enqueued = self
            .producer
            .send_prepared(topic, &job.key(), prepared)
            .await?;
        if self.unflushed.fetch_add(1, Ordering::AcqRel) + 1 >= ADDED_EVERY {
            self.flush().await?;
        }
        Ok(enqueued)
    }

    /// Writes how many jobs this handle enqueued since its last flush. Call
    /// it in a process that added jobs but does not seal.
    pub async fn flush(&self) -> Result<()> {
        let n = self.unflushed.swap(0, Ordering::AcqRel);
        if n == 0 {
            return Ok(());
        }
        let added = Event::Added {
            batch: self.id.clone(),
            count: n,
        };
        if let Err(e) = self.send(&added).await {
            self.unflushed.fetch_add(n, Ordering::AcqRel);
            return Err(e);
        }
        Ok(())
    }

    /// No more jobs: from here the total is known, and the callback fires
    /// once every job finished (at once for a batch with no jobs). Await
    /// every `enqueue` of this batch first; a later one is refused.
    pub async fn seal(&self) -> Result<()> {
        self.open().await?;
        self.sealed.store(true, Ordering::Release);
        self.flush().await?;
        self.send(&Event::Sealed {
            batch: self.id.clone(),
            at_ms: crate::clock::now_ms(),
        })
        .await
    }
}

/// `host:pid`, as the events and the dashboard name a process.
pub(crate) fn whoami() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".into());
    format!("{host}:{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_are_empty_too_long_or_hold_control_characters_are_refused() {
        assert!(check_id("newsletter-2026-12").is_ok());
        for bad in ["", "  ", "a\nb", "a\u{202e}b"] {
            let e = check_id(bad);
            if bad.contains('\u{202e}') {
                // Not a control character (a format one): allowed, and
                // neutralised where it is shown.
                assert!(e.is_ok());
                continue;
            }
            assert!(matches!(e, Err(Error::Batch { .. })), "{bad:?}");
        }
        let long = "é".repeat(150);
        let e = check_id(&long).unwrap_err().to_string();
        assert!(e.contains("300 bytes long; at most 200"), "{e}");
        assert_eq!(callback_id("b", When::Success), "batch:b:success");
    }
}
