//! A batch's state, folded from its events: pure, no Kafka in it, so the
//! counting rules are tested on their own (at-least-once delivery means
//! every `done` may arrive twice, and an event may be read again after a
//! coordinator failover).
//!
//! Memory: an open batch keeps one entry per finished job id (a 128-bit id
//! and a flag, about 40 bytes in the map: 200 000 jobs take about 8 MB);
//! once complete it keeps only the dead-lettered ids, which a re-drive may
//! still turn into successes.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use serde::{Deserialize, Serialize};

use super::event::{Callback, Event, When};

/// Where a batch stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Jobs may still be added: not sealed.
    Open,
    /// Sealed; jobs are still running.
    Running,
    /// Every job finished.
    Complete,
    /// Cancelled by an operator: no callback fires.
    Cancelled,
}

impl Status {
    /// `open`, `running`, `complete`, `cancelled`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Open => "open",
            Status::Running => "running",
            Status::Complete => "complete",
            Status::Cancelled => "cancelled",
        }
    }
}

/// Who cancelled a batch, when and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cancel {
    /// Epoch ms.
    pub at_ms: i64,
    /// `--by`.
    pub by: String,
    /// `--reason`.
    pub reason: String,
}

/// One batch as the coordinator knows it; also the value of its snapshot
/// on the compacted state topic (what `kjob batches` reads).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchState {
    /// The batch id.
    pub batch: String,
    /// Its partition of the batch topic.
    pub partition: i32,
    /// When it was first opened (epoch ms).
    pub opened_ms: Option<i64>,
    /// Which process opened it first.
    pub opened_by: Option<String>,
    /// Its callbacks (from the first open that had any).
    pub callbacks: Vec<Callback>,
    /// Jobs enqueued into it (before its seal).
    pub total: u64,
    /// Jobs enqueued after its seal: refused by the sealing process, but
    /// another process may not know; not part of the total.
    pub late: u64,
    /// When it was sealed (epoch ms).
    pub sealed_ms: Option<i64>,
    /// Jobs that succeeded.
    pub succeeded: u64,
    /// Jobs dead-lettered (a re-drive that succeeds moves one back).
    pub dead_lettered: u64,
    /// When every job had finished (epoch ms).
    pub completed_ms: Option<i64>,
    /// The callbacks written, with when.
    pub fired: Vec<(When, i64)>,
    /// Set when an operator cancelled it.
    pub cancelled: Option<Cancel>,
    /// The last change (epoch ms).
    pub updated_ms: i64,
    /// The batch topic offset after the last event applied: a coordinator
    /// that reads an event again below it skips it.
    pub next_offset: i64,
    /// Finished job ids: `true` succeeded, `false` dead-lettered.
    #[serde(with = "id_map")]
    ids: HashMap<u128, bool>,
}

/// A job id as 128 bits: a UUID's own (kjob's ids are UUIDv7s), otherwise
/// two independent 64-bit hashes of the text.
pub(crate) fn id_bits(id: &str) -> u128 {
    if let Ok(u) = uuid::Uuid::parse_str(id) {
        return u.as_u128();
    }
    let half = |salt: u8| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        salt.hash(&mut h);
        id.hash(&mut h);
        h.finish()
    };
    (u128::from(half(1)) << 64) | u128::from(half(2))
}

impl BatchState {
    /// A batch first seen in `partition`.
    pub fn new(batch: &str, partition: i32) -> Self {
        Self {
            batch: batch.to_string(),
            partition,
            ..Default::default()
        }
    }

    /// Where it stands.
    pub fn status(&self) -> Status {
        if self.cancelled.is_some() {
            Status::Cancelled
        } else if self.completed_ms.is_some() {
            Status::Complete
        } else if self.sealed_ms.is_some() {
            Status::Running
        } else {
            Status::Open
        }
    }

    /// Jobs finished so far.
    pub fn finished(&self) -> u64 {
        self.succeeded + self.dead_lettered
    }

    /// Finished job ids held (memory: see the module docs).
    pub fn ids_held(&self) -> usize {
        self.ids.len()
    }

    /// Whether the callback `when` was written.
    pub fn has_fired(&self, when: When) -> bool {
        self.fired.iter().any(|(w, _)| *w == when)
    }

    /// Applies the event read at `offset` of the batch's partition, at
    /// wall-clock `now_ms`. An event below [`BatchState::next_offset`] was
    /// applied already (read again after a failover) and is skipped.
    pub fn apply(&mut self, event: &Event, offset: i64, now_ms: i64) {
        if offset < self.next_offset {
            return;
        }
        self.next_offset = offset + 1;
        self.updated_ms = now_ms;
        match event {
            Event::Open {
                at_ms,
                by,
                callbacks,
                ..
            } => {
                if self.opened_ms.is_none() {
                    self.opened_ms = Some(*at_ms);
                    self.opened_by = Some(by.clone());
                }
                if self.callbacks.is_empty() {
                    self.callbacks = callbacks.clone();
                }
            }
            Event::Added { count, .. } => {
                if self.sealed_ms.is_some() {
                    self.late += count;
                } else {
                    self.total += count;
                }
            }
            Event::Sealed { at_ms, .. } => {
                if self.sealed_ms.is_none() {
                    self.sealed_ms = Some(*at_ms);
                }
            }
            Event::Done { ok, dead, .. } => {
                for id in ok {
                    self.finish(id_bits(id), true);
                }
                for id in dead {
                    self.finish(id_bits(id), false);
                }
            }
            Event::Cancelled {
                at_ms, by, reason, ..
            } => {
                if self.cancelled.is_none() && self.completed_ms.is_none() {
                    self.cancelled = Some(Cancel {
                        at_ms: *at_ms,
                        by: by.clone(),
                        reason: reason.clone(),
                    });
                }
            }
            Event::Fired { when, at_ms, .. } => {
                if !self.has_fired(*when) {
                    self.fired.push((*when, *at_ms));
                }
            }
        }
        if self.completed_ms.is_none() && self.sealed_ms.is_some() && self.finished() >= self.total
        {
            self.completed_ms = Some(now_ms);
            // Every job has been seen: a later `ok` for an unknown id is a
            // redelivery, so only the dead-lettered ids stay (a re-drive
            // may still turn one into a success).
            self.ids.retain(|_, ok| !*ok);
        }
    }

    fn finish(&mut self, id: u128, ok: bool) {
        match self.ids.get(&id).copied() {
            // Counted already (a redelivery), or succeeded before.
            Some(true) => {}
            Some(false) if ok => {
                // Re-driven from the DLQ, and it succeeded this time.
                self.dead_lettered = self.dead_lettered.saturating_sub(1);
                self.succeeded += 1;
                if self.completed_ms.is_some() {
                    self.ids.remove(&id);
                } else {
                    self.ids.insert(id, true);
                }
            }
            Some(false) => {}
            // Complete: every job was counted, so an unknown id is a
            // redelivery of one whose id was let go.
            None if self.completed_ms.is_some() => {}
            None => {
                self.ids.insert(id, ok);
                if ok {
                    self.succeeded += 1;
                } else {
                    self.dead_lettered += 1;
                }
            }
        }
    }

    /// The callbacks due now and not written yet: `complete` once every
    /// job finished, `success` once every job finished and none is
    /// dead-lettered (possibly later, after a re-drive). None once
    /// cancelled.
    pub fn due(&self) -> Vec<&Callback> {
        if self.cancelled.is_some() || self.completed_ms.is_none() {
            return Vec::new();
        }
        self.callbacks
            .iter()
            .filter(|c| !self.has_fired(c.when))
            .filter(|c| c.when == When::Complete || self.dead_lettered == 0)
            .collect()
    }

    /// Whether an operator still needs to look at it: open or running.
    pub fn is_open(&self) -> bool {
        matches!(self.status(), Status::Open | Status::Running)
    }
}

/// The id map as two base64 strings of 16-byte ids, `ok` and `dead`: a
/// fraction of a JSON list of strings.
mod id_map {
    use std::collections::HashMap;

    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize, Default)]
    struct Ids {
        ok: String,
        dead: String,
    }

    pub(crate) fn serialize<S: Serializer>(
        m: &HashMap<u128, bool>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let (mut ok, mut dead) = (Vec::new(), Vec::new());
        for (id, good) in m {
            let out = if *good { &mut ok } else { &mut dead };
            out.extend_from_slice(&id.to_be_bytes());
        }
        let e = &base64::engine::general_purpose::STANDARD;
        Ids {
            ok: e.encode(ok),
            dead: e.encode(dead),
        }
        .serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<HashMap<u128, bool>, D::Error> {
        let ids = Ids::deserialize(d)?;
        let e = &base64::engine::general_purpose::STANDARD;
        let mut out = HashMap::new();
        for (text, good) in [(ids.ok, true), (ids.dead, false)] {
            let bytes = e
                .decode(text.as_bytes())
                .map_err(serde::de::Error::custom)?;
            for chunk in bytes.chunks_exact(16) {
                let mut b = [0u8; 16];
                b.copy_from_slice(chunk);
                out.insert(u128::from_be_bytes(b), good);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cb(when: When) -> Callback {
        Callback {
            when,
            topic: "t".into(),
            job: "j".into(),
            version: 1,
            key: "k".into(),
            payload: vec![1],
        }
    }

    fn done(ok: &[&str], dead: &[&str]) -> Event {
        Event::Done {
            batch: "b".into(),
            ok: ok.iter().map(|s| s.to_string()).collect(),
            dead: dead.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn opened(callbacks: Vec<Callback>) -> BatchState {
        let mut s = BatchState::new("b", 0);
        s.apply(
            &Event::Open {
                batch: "b".into(),
                at_ms: 1,
                by: "me".into(),
                callbacks,
            },
            0,
            1,
        );
        s
    }

    fn seal(s: &mut BatchState, added: u64) {
        let at = s.next_offset;
        s.apply(
            &Event::Added {
                batch: "b".into(),
                count: added,
            },
            at,
            2,
        );
        s.apply(
            &Event::Sealed {
                batch: "b".into(),
                at_ms: 2,
            },
            at + 1,
            2,
        );
    }

    #[test]
    fn counts_by_id_and_fires_at_the_last_job() {
        let mut s = opened(vec![cb(When::Complete), cb(When::Success)]);
        seal(&mut s, 3);
        assert_eq!(s.status(), Status::Running);
        s.apply(&done(&["a", "b"], &[]), 10, 3);
        s.apply(&done(&["a"], &[]), 11, 3); // a redelivery
        assert_eq!((s.succeeded, s.finished()), (2, 2));
        assert!(s.due().is_empty());
        s.apply(&done(&[], &["c"]), 12, 4);
        assert_eq!(s.status(), Status::Complete);
        let due: Vec<When> = s.due().iter().map(|c| c.when).collect();
        assert_eq!(due, [When::Complete], "success waits: one dead-lettered");
        assert_eq!(s.ids_held(), 1, "only the dead-lettered id is kept");
        s.apply(
            &Event::Fired {
                batch: "b".into(),
                when: When::Complete,
                at_ms: 5,
            },
            13,
            5,
        );
        assert!(s.due().is_empty());
        // Re-driven, it succeeds: the counts move and success fires now.
        s.apply(&done(&["c"], &[]), 14, 6);
        assert_eq!((s.succeeded, s.dead_lettered), (3, 0));
        let due: Vec<When> = s.due().iter().map(|c| c.when).collect();
        assert_eq!(due, [When::Success]);
        // A late redelivery of a success changes nothing.
        s.apply(&done(&["a"], &[]), 15, 7);
        assert_eq!((s.succeeded, s.dead_lettered), (3, 0));
    }

    #[test]
    fn an_empty_batch_completes_at_its_seal_and_a_cancelled_one_never_fires() {
        let mut s = opened(vec![cb(When::Complete)]);
        seal(&mut s, 0);
        assert_eq!(s.status(), Status::Complete);
        assert_eq!(s.due().len(), 1);

        let mut c = opened(vec![cb(When::Complete)]);
        seal(&mut c, 2);
        c.apply(
            &Event::Cancelled {
                batch: "b".into(),
                at_ms: 3,
                by: "ops".into(),
                reason: "stuck".into(),
            },
            5,
            3,
        );
        c.apply(&done(&["x", "y"], &[]), 6, 4);
        assert_eq!(c.status(), Status::Cancelled);
        assert_eq!(c.succeeded, 2, "finished jobs stay counted");
        assert!(c.due().is_empty());
    }

    #[test]
    fn events_read_again_below_the_snapshot_are_skipped_and_late_adds_are_kept_apart() {
        let mut s = opened(vec![]);
        s.apply(
            &Event::Added {
                batch: "b".into(),
                count: 5,
            },
            1,
            1,
        );
        let snap: BatchState = serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
        assert_eq!(snap, s);
        let mut again = snap;
        again.apply(
            &Event::Added {
                batch: "b".into(),
                count: 5,
            },
            1,
            1,
        );
        assert_eq!(again.total, 5, "offset 1 was in the snapshot");
        seal(&mut again, 0);
        again.apply(
            &Event::Added {
                batch: "b".into(),
                count: 2,
            },
            10,
            1,
        );
        assert_eq!((again.total, again.late), (5, 2));
    }

    proptest! {
        /// Whatever the order and the duplication of done events, and
        /// wherever a snapshot is taken and the fold resumed from it, the
        /// counts are exact and the batch completes exactly when the last
        /// job's first done is applied.
        #[test]
        fn counts_are_exact_under_redelivery_and_failover(
            n in 0usize..40,
            dead_every in 1usize..7,
            dups in proptest::collection::vec(0usize..40, 0..40),
            cut in 0usize..200,
        ) {
            let ids: Vec<String> = (0..n).map(|i| uuid::Uuid::from_u128(i as u128 + 1).to_string()).collect();
            let mut events = vec![
                Event::Added { batch: "b".into(), count: n as u64 },
                Event::Sealed { batch: "b".into(), at_ms: 1 },
            ];
            for (i, id) in ids.iter().enumerate() {
                let dead = i % dead_every == 0;
                events.push(if dead { done(&[], &[id]) } else { done(&[id], &[]) });
            }
            for d in &dups {
                if let Some(id) = ids.get(*d) {
                    let dead = d % dead_every == 0;
                    events.push(if dead { done(&[], &[id]) } else { done(&[id], &[]) });
                }
            }
            let mut s = opened(vec![cb(When::Complete)]);
            let cut = cut.min(events.len());
            for (i, e) in events.iter().enumerate().take(cut) {
                s.apply(e, 1 + i as i64, 1);
            }
            // Failover: a snapshot, and everything read again from the start.
            let mut s: BatchState = serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
            for (i, e) in events.iter().enumerate() {
                s.apply(e, 1 + i as i64, 1);
            }
            let dead = (0..n).filter(|i| i % dead_every == 0).count() as u64;
            prop_assert_eq!(s.dead_lettered, dead);
            prop_assert_eq!(s.succeeded, n as u64 - dead);
            prop_assert_eq!(s.status(), Status::Complete);
            prop_assert_eq!(s.due().len(), 1);
        }
    }
}
