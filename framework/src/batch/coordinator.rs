//! The coordinator: the owner of a partition of the batch topic folds its
//! events ([`super::fold`]), writes the callbacks, and snapshots.
//!
//! Correctness rests on one order: a snapshot round writes every batch
//! changed since the last one to the compacted state topic (into the same
//! partition number as its events), waits for the broker, and only then
//! commits the batch topic's offsets. So every event below the committed
//! offset is in a snapshot, and a new owner (after a rebalance, a crash or
//! a SIGKILL) loads the snapshots and reads on from the committed offset;
//! an event it reads again below a batch's snapshot is skipped by the
//! fold. Nothing is lost, nothing counts twice.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::event::{Callback, Event};
use super::fold::BatchState;
use super::{callback_id, coordinator_group, state_topic, BatchReport};
use crate::clock::now_ms;
use crate::config::KafkaConfig;
use crate::error::{Error, Result};
use crate::headers::JobHeaders;
use crate::producer::Producer;
use crate::telemetry::metrics::Metrics;

/// How often changed batches are snapshotted and the offsets committed.
const SNAPSHOT_EVERY: Duration = Duration::from_millis(500);

/// Partitions given up in a rebalance, for the loop to drop.
#[derive(Default)]
struct Revoked(Mutex<Vec<i32>>);

struct Ctx(Arc<Revoked>);

impl ClientContext for Ctx {}

impl ConsumerContext for Ctx {
    fn pre_rebalance(&self, _: &rdkafka::consumer::BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let mut r = self.0 .0.lock().unwrap_or_else(PoisonError::into_inner);
            r.extend(tpl.elements().iter().map(|e| e.partition()));
        }
    }
}

/// One owned partition's batches.
#[derive(Default)]
struct Part {
    batches: HashMap<String, BatchState>,
    dirty: HashSet<String>,
    /// The offset after the last event applied (to commit).
    next: Option<i64>,
}

struct Coordinator {
    config: KafkaConfig,
    topic: String,
    producer: Producer,
    metrics: Metrics,
    parts: HashMap<i32, Part>,
}

impl Coordinator {
    async fn part(&mut self, partition: i32) -> Result<&mut Part> {
        if !self.parts.contains_key(&partition) {
            let (config, topic) = (self.config.clone(), self.topic.clone());
            let batches = tokio::task::spawn_blocking(move || {
                super::read_states(&config, &topic, Some(partition))
            })
            .await
            .map_err(|e| Error::Task {
                what: "reading the batch snapshots",
                reason: e.to_string(),
            })??;
            info!(topic = %self.topic, partition, batches = batches.len(), "coordinating batches of this partition");
            self.parts.insert(
                partition,
                Part {
                    batches,
                    ..Default::default()
                },
            );
        }
        self.parts.get_mut(&partition).ok_or(Error::Task {
            what: "loading a batch partition",
            reason: "lost".into(),
        })
    }

    async fn apply(&mut self, partition: i32, offset: i64, payload: Option<&[u8]>) -> Result<()> {
        let event = match payload.map(serde_json::from_slice::<Event>) {
            Some(Ok(e)) => Some(e),
            Some(Err(e)) => {
                warn!(topic = %self.topic, partition, offset, error = %e, "not a batch event; skipped");
                None
            }
            None => None,
        };
        let part = self.part(partition).await?;
        part.next = Some(offset + 1);
        let Some(event) = event else { return Ok(()) };
        let batch = event.batch().to_string();
        let state = part
            .batches
            .entry(batch.clone())
            .or_insert_with(|| BatchState::new(&batch, partition));
        state.apply(&event, offset, now_ms());
        part.dirty.insert(batch.clone());
        let due: Vec<Callback> = state.due().into_iter().cloned().collect();
        for cb in due {
            self.fire(partition, &batch, &cb).await?;
        }
        Ok(())
    }

    /// Writes a callback, then the `fired` event that keeps the next owner
    /// from writing it again (if this one dies in between, it does, with
    /// the same job id).
    async fn fire(&mut self, partition: i32, batch: &str, cb: &Callback) -> Result<()> {
        let Some(state) = self
            .parts
            .get(&partition)
            .and_then(|p| p.batches.get(batch))
        else {
            return Ok(());
        };
        let report = BatchReport {
            batch: batch.to_string(),
            total: state.total,
            succeeded: state.succeeded,
            dead_lettered: state.dead_lettered,
        };
        let headers = JobHeaders {
            job: Some(cb.job.clone()),
            version: Some(cb.version),
            id: Some(callback_id(batch, cb.when)),
            attempt: Some(1),
            batch_report: serde_json::to_string(&report).ok(),
            ..Default::default()
        };
        self.producer
            .send_raw(
                &cb.topic,
                Some(cb.key.as_bytes()),
                Some(&cb.payload),
                headers.to_owned_headers(),
            )
            .await?;
        let at_ms = now_ms();
        let fired = Event::Fired {
            batch: batch.to_string(),
            when: cb.when,
            at_ms,
        };
        self.producer
            .send_raw_to(
                &self.topic,
                Some(partition),
                Some(batch.as_bytes()),
                Some(&fired.to_json()),
                OwnedHeaders::new().insert(Header {
                    key: "kjob-batch-event",
                    value: Some("fired"),
                }),
            )
            .await?;
        if let Some(s) = self
            .parts
            .get_mut(&partition)
            .and_then(|p| p.batches.get_mut(batch))
        {
            if !s.has_fired(cb.when) {
                s.fired.push((cb.when, at_ms));
            }
        }
        info!(batch, callback = cb.when.as_str(), topic = %cb.topic, total = report.total, succeeded = report.succeeded, dead_lettered = report.dead_lettered, "batch callback enqueued");
        Ok(())
    }

    /// Snapshots what changed, then commits: see the module docs.
    async fn snapshot(&mut self, consumer: &StreamConsumer<Ctx>) {
        let state = state_topic(&self.topic);
        let mut writes = Vec::new();
        for (p, part) in &self.parts {
            for b in &part.dirty {
                if let Some(s) = part.batches.get(b) {
                    let body = serde_json::to_vec(s).unwrap_or_default();
                    let (producer, state, p, b) =
                        (self.producer.clone(), state.clone(), *p, b.clone());
                    writes.push(async move {
                        producer
                            .send_raw_to(
                                &state,
                                Some(p),
                                Some(b.as_bytes()),
                                Some(&body),
                                OwnedHeaders::new(),
                            )
                            .await
                    });
                }
            }
        }
        let results = futures::future::join_all(writes).await;
        if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
            warn!(topic = %state, error = %e, "could not snapshot batches; offsets not committed, trying again");
            return;
        }
        let mut tpl = TopicPartitionList::new();
        for (p, part) in &mut self.parts {
            part.dirty.clear();
            if let Some(next) = part.next {
                let _ = tpl.add_partition_offset(&self.topic, *p, Offset::Offset(next));
            }
        }
        if tpl.count() > 0 {
            if let Err(e) = consumer.commit(&tpl, CommitMode::Async) {
                debug!(error = %e, "batch offsets not committed; the next round does");
            }
        }
        self.publish_metrics();
    }

    fn publish_metrics(&self) {
        let now = now_ms();
        let open: Vec<&BatchState> = self
            .parts
            .values()
            .flat_map(|p| p.batches.values())
            .filter(|s| s.is_open())
            .collect();
        let oldest = open
            .iter()
            .filter_map(|s| s.opened_ms.or(Some(s.updated_ms)))
            .min()
            .map_or(0.0, |t| ((now - t).max(0) as f64) / 1000.0);
        self.metrics
            .snapshot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .batches = Some((open.len(), oldest));
    }
}

/// Runs the coordinator until `stop`: joins the coordinator group of
/// `topic` and folds the partitions it is given.
pub(crate) async fn run(
    config: KafkaConfig,
    membership: crate::membership::GroupSettings,
    topic: String,
    producer: Producer,
    metrics: Metrics,
    stop: CancellationToken,
) {
    let revoked = Arc::new(Revoked::default());
    let group = coordinator_group(&topic);
    // The worker's group settings (session, heartbeat, protocol, instance
    // id), so a SIGKILLed coordinator's partitions move as fast as its
    // worker's.
    let consumer: StreamConsumer<Ctx> = match membership
        .member(&config, &group, &[])
        .create_with_context(Ctx(revoked.clone()))
    {
        Ok(c) => c,
        Err(e) => {
            warn!(error = %e, "could not create the batch coordinator's consumer; batches of this worker are not coordinated");
            return;
        }
    };
    if let Err(e) = consumer.subscribe(&[topic.as_str()]) {
        warn!(topic = %topic, error = %e, "could not subscribe to the batch topic");
        return;
    }
    let mut c = Coordinator {
        config,
        topic,
        producer,
        metrics,
        parts: HashMap::new(),
    };
    c.publish_metrics();
    let mut tick = tokio::time::interval(SNAPSHOT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            _ = tick.tick() => {
                drop_revoked(&mut c, &revoked);
                c.snapshot(&consumer).await;
            }
            m = consumer.recv() => {
                drop_revoked(&mut c, &revoked);
                match m {
                    Ok(m) => {
                        let (p, o) = (m.partition(), m.offset());
                        let payload = m.payload().map(<[u8]>::to_vec);
                        drop(m);
                        if let Err(e) = c.apply(p, o, payload.as_deref()).await {
                            // Not applied: read again from the last commit.
                            warn!(partition = p, offset = o, error = %e, "could not apply a batch event; re-reading the partition");
                            c.parts.remove(&p);
                            tokio::time::sleep(Duration::from_millis(500)).await;
                            rewind(&consumer, &c.topic, p);
                        }
                    }
                    Err(e) => {
                        debug!(error = %e, "batch coordinator consumer error");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }
    }
    c.snapshot(&consumer).await;
}

/// Seeks `partition` back to its committed offset (the start without one).
fn rewind(consumer: &StreamConsumer<Ctx>, topic: &str, partition: i32) {
    let mut tpl = TopicPartitionList::new();
    let _ = tpl.add_partition(topic, partition);
    let at = consumer
        .committed_offsets(tpl, Duration::from_secs(5))
        .ok()
        .and_then(|t| t.find_partition(topic, partition).map(|e| e.offset()))
        .filter(|o| matches!(o, Offset::Offset(_)))
        .unwrap_or(Offset::Beginning);
    if let Err(e) = consumer.seek(topic, partition, at, Duration::from_secs(5)) {
        warn!(topic, partition, error = %e, "could not rewind the batch partition");
    }
}

fn drop_revoked(c: &mut Coordinator, revoked: &Revoked) {
    let gone: Vec<i32> =
        std::mem::take(&mut *revoked.0.lock().unwrap_or_else(PoisonError::into_inner));
    for p in gone {
        if c.parts.remove(&p).is_some() {
            info!(topic = %c.topic, partition = p, "no longer coordinating this partition's batches");
        }
    }
}
