//! From a Kafka record to what the scheduler needs: its lane (by ordering
//! mode), its due time (retry tiers), and whether another group wrote it.
//! Shared by the worker's poll thread and the test harness, so both feed the
//! scheduler the same facts.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::OnceLock;

use rdkafka::message::{Message, OwnedMessage};

use crate::worker::intake::polled::Polled;

use crate::headers;
use crate::worker::scheduler::{Incoming, LaneKey, Located};
use crate::worker::state::OrderingMode as Ordering;

impl Located for OwnedMessage {
    fn topic(&self) -> &str {
        Message::topic(self)
    }
    fn partition(&self) -> i32 {
        Message::partition(self)
    }
    fn header(&self, name: &str) -> Option<&str> {
        headers::find(Message::headers(self), name)
    }
}

impl Located for Polled {
    fn topic(&self) -> &str {
        Message::topic(self)
    }
    fn partition(&self) -> i32 {
        Message::partition(self)
    }
    fn header(&self, name: &str) -> Option<&str> {
        headers::find(Message::headers(self), name)
    }
}

/// The seed of lane hashes: random per process, so the keys a producer
/// chooses cannot be aimed at one bucket of the scheduler's lane map.
fn lane_seed() -> &'static RandomState {
    static SEED: OnceLock<RandomState> = OnceLock::new();
    SEED.get_or_init(RandomState::new)
}

/// The scheduler's view of `msg`. Headers are read only for retry-tier
/// records (`kjob-due-at`, `kjob-group`); a main-topic record costs a key
/// hash and nothing else.
pub(crate) fn incoming<M: Message>(
    msg: M,
    ordering: Ordering,
    is_tier: bool,
    group: &str,
) -> Incoming<M> {
    let offset = msg.offset();
    let lane = match ordering {
        Ordering::PerKey => match msg.key() {
            Some(k) => LaneKey::Key(lane_seed().hash_one(k)),
            None => LaneKey::Partition,
        },
        Ordering::PerPartition => LaneKey::Partition,
        Ordering::Unordered => LaneKey::Offset(offset),
    };
    let (due_ms, foreign) = if is_tier {
        let due = headers::find(msg.headers(), headers::DUE_AT).and_then(|v| v.parse().ok());
        // Another group's retry: its view of the job, not ours.
        let foreign = headers::find(msg.headers(), headers::GROUP).is_some_and(|g| g != group);
        (due, foreign)
    } else {
        (None, false)
    };
    Incoming {
        offset,
        lane,
        timestamp_ms: msg.timestamp().to_millis(),
        due_ms,
        foreign,
        item: msg,
    }
}
