//! The tailer: one thread per index with its own consumer (no group, no
//! commits), assigned every partition of the DLQ and of its audit topic,
//! which reads both from their start and then follows them (see the
//! [index docs](super) for how that keeps it correct).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::{DlqIndex, Incoming};
use crate::dlq::store::{AuditEntry, Coordinates};
use kjob::config::KafkaConfig;
use kjob::headers::JobHeaders;
use kjob::topics::{dlq_audit_topic, dlq_topic, partition_counts};

/// How often partitions and watermarks are looked at again.
const REFRESH: Duration = Duration::from_secs(3);

/// Records applied under one write lock: large enough to build a million
/// entries quickly, small enough that a page request never waits long.
const BATCH: usize = 4096;

/// Starts the tailer of `index` on a thread of its own. It stops once the
/// index is dropped.
pub fn spawn(config: &KafkaConfig, index: &Arc<DlqIndex>) -> std::io::Result<()> {
    let weak = Arc::downgrade(index);
    let config = config.clone();
    std::thread::Builder::new()
        .name(format!("kjob-dlq-index-{}", index.main_topic()))
        .spawn(move || run(config, weak))
        .map(|_| ())
}

/// Where the tailer stands in one topic.
struct Positions {
    topic: String,
    /// Next offset to read, per partition.
    next: HashMap<i32, i64>,
    /// High watermark at the last refresh.
    high: HashMap<i32, i64>,
    /// Low watermark at the last refresh.
    low: HashMap<i32, i64>,
}

impl Positions {
    fn new(topic: String) -> Self {
        Self {
            topic,
            next: HashMap::new(),
            high: HashMap::new(),
            low: HashMap::new(),
        }
    }
    fn caught_up(&self) -> bool {
        self.high
            .iter()
            .all(|(p, h)| self.next.get(p).copied().unwrap_or(0) >= *h)
    }
    /// Records stored at the last refresh.
    fn stored(&self) -> u64 {
        let low = |p: &i32| self.low.get(p).copied().unwrap_or(0);
        self.high
            .iter()
            .map(|(p, h)| (h - low(p)).max(0) as u64)
            .sum()
    }
}

fn run(config: KafkaConfig, index: Weak<DlqIndex>) {
    let Some(main) = index.upgrade().map(|i| i.main_topic().to_string()) else {
        return;
    };
    let consumer: BaseConsumer = match config
        .client_config(&[
            ("group.id", "kjob-ui-dlq-index"),
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("enable.partition.eof", "false"),
            ("auto.offset.reset", "earliest"),
        ])
        .create()
    {
        Ok(c) => c,
        Err(e) => {
            if let Some(i) = index.upgrade() {
                i.set_progress(
                    0,
                    false,
                    Some(format!("creating the index's consumer: {e}")),
                );
            }
            return;
        }
    };
    let mut dlq = Positions::new(dlq_topic(&main));
    let mut audit = Positions::new(dlq_audit_topic(&main));
    let mut last_refresh: Option<Instant> = None;
    loop {
        let Some(idx) = index.upgrade() else { return };
        if last_refresh.is_none_or(|t| t.elapsed() >= REFRESH) {
            let problem = refresh(&config, &consumer, &idx, &mut dlq, &mut audit).err();
            let done = problem.is_none() && dlq.caught_up() && audit.caught_up();
            idx.set_progress(dlq.stored(), done, problem);
            last_refresh = Some(Instant::now());
        }
        let mut letters: Vec<BorrowedMessage<'_>> = Vec::new();
        let mut audits: Vec<(Coordinates, Option<AuditEntry>)> = Vec::new();
        let mut wait = Duration::from_millis(200);
        while letters.len() + audits.len() < BATCH {
            match consumer.poll(wait) {
                None => {
                    // Idle: the consumer's positions pass what records
                    // show (a transaction marker ends a partition).
                    if let Ok(tpl) = consumer.position() {
                        for e in tpl.elements() {
                            if let Offset::Offset(n) = e.offset() {
                                let pos = if e.topic() == dlq.topic {
                                    &mut dlq
                                } else {
                                    &mut audit
                                };
                                let next = pos.next.entry(e.partition()).or_insert(n);
                                *next = (*next).max(n);
                            }
                        }
                    }
                    break;
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "DLQ index: poll");
                    break;
                }
                Some(Ok(m)) => {
                    if m.topic() == dlq.topic {
                        dlq.next.insert(m.partition(), m.offset() + 1);
                        letters.push(m);
                    } else {
                        audit.next.insert(m.partition(), m.offset() + 1);
                        if let Some(a) = audit_record(&m) {
                            audits.push(a);
                        }
                    }
                }
            }
            wait = Duration::ZERO;
        }
        if !letters.is_empty() {
            idx.add(
                letters
                    .iter()
                    .map(|m| Incoming {
                        at: Coordinates {
                            partition: m.partition(),
                            offset: m.offset(),
                        },
                        timestamp_ms: m.timestamp().to_millis(),
                        key: m.key(),
                        headers: JobHeaders::parse(m.headers()),
                        payload: m.payload(),
                    })
                    .collect(),
            );
        }
        if !audits.is_empty() {
            idx.audit(audits);
        }
        // Caught up as soon as the positions reach the last high watermarks
        // seen, without waiting for the next refresh.
        if !idx.progress().caught_up && dlq.caught_up() && audit.caught_up() && !dlq.high.is_empty()
        {
            idx.set_progress(dlq.stored(), true, None);
        }
    }
}

/// An audit record as `(coordinates, entry)`; `None` for junk (a key that
/// is no coordinates, a body that is no entry: another writer's records).
fn audit_record(m: &BorrowedMessage<'_>) -> Option<(Coordinates, Option<AuditEntry>)> {
    let at = m
        .key()
        .and_then(|k| std::str::from_utf8(k).ok())
        .and_then(|k| k.parse::<Coordinates>().ok())?;
    match m.payload() {
        None => Some((at, None)),
        Some(p) => serde_json::from_slice::<AuditEntry>(p)
            .ok()
            .map(|a| (at, Some(a))),
    }
}

/// Looks at both topics' partitions and watermarks: drops what retention
/// deleted, re-reads a recreated partition, assigns new partitions from
/// their start. Re-assigns (at the positions reached) only when something
/// changed.
fn refresh(
    config: &KafkaConfig,
    consumer: &BaseConsumer,
    index: &DlqIndex,
    dlq: &mut Positions,
    audit: &mut Positions,
) -> Result<(), String> {
    let counts = partition_counts(config, &[dlq.topic.clone(), audit.topic.clone()])
        .map_err(|e| e.to_string())?;
    let mut changed = false;
    for (pos, parts) in [&mut *dlq, &mut *audit].into_iter().zip(counts) {
        let is_dlq = pos.topic.ends_with(".dlq");
        for p in 0..parts.unwrap_or(0) as i32 {
            let (low, high) = consumer
                .fetch_watermarks(&pos.topic, p, Duration::from_secs(5))
                .map_err(|e| format!("watermarks of {}:{p}: {e}", pos.topic))?;
            pos.high.insert(p, high);
            let moved = pos.low.insert(p, low).is_some_and(|before| before < low);
            match pos.next.get(&p).copied() {
                None => {
                    pos.next.insert(p, low);
                    changed = true;
                }
                Some(next) if next > high => {
                    // Recreated: what was read is gone.
                    if is_dlq {
                        index.drop_below(p, None);
                    }
                    pos.next.insert(p, low);
                    changed = true;
                }
                Some(next) if next < low => {
                    pos.next.insert(p, low);
                    changed = true;
                }
                Some(_) => {}
            }
            // Retention deleted records: the entries below the new low
            // watermark go (checked only when it moved, not every refresh).
            if is_dlq && moved {
                index.drop_below(p, Some(low));
            }
        }
    }
    if changed {
        let mut tpl = TopicPartitionList::new();
        for pos in [&*dlq, &*audit] {
            for (p, next) in &pos.next {
                tpl.add_partition_offset(&pos.topic, *p, Offset::Offset(*next))
                    .map_err(|e| format!("building the index's assignment: {e}"))?;
            }
        }
        consumer
            .assign(&tpl)
            .map_err(|e| format!("assigning the index's partitions: {e}"))?;
    }
    Ok(())
}
