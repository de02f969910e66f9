//! The worker's side of the control topic: read to its end before the
//! first fetch, then followed on a thread of its own; what is in force is
//! kept in [`InForce`], which the poll thread and the pipeline read.

use super::control_topic;
use super::read_control;
use super::ControlState;
use super::JobCancel;
use super::CANCEL_KEPT_MS;
use crate::config::KafkaConfig;
use crate::error::Error;
use crate::error::Result;
use rdkafka::consumer::BaseConsumer;
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::Offset;
use rdkafka::TopicPartitionList;
use std::collections::HashMap;
use std::collections::HashSet;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::sync::PoisonError;
use std::sync::RwLock;
use std::time::Duration;
use tracing::info;
use tracing::warn;

/// What the control topic puts in force, as the worker last read it: the
/// main topics operators paused and the waiting jobs they cancelled.
/// Shared by the tail thread (writer) and the poll thread and pipeline
/// (readers; the poll thread compares `version` to see a change without
/// taking the lock). Not a "hold": that word is the scheduler's, for a
/// record kept until its due time.
#[derive(Debug, Default)]
pub(crate) struct InForce {
    paused: RwLock<HashSet<String>>,
    version: AtomicU64,
    /// Cancelled waiting jobs: `(main topic, job id)` to their due times.
    cancels: RwLock<HashMap<(String, String), Vec<i64>>>,
    /// Whether any cancel is in force: the hot path's one atomic load.
    any_cancel: AtomicBool,
}

impl InForce {
    /// Whether an operator paused `topic` (its partitions stay paused).
    #[inline]
    pub(crate) fn is_paused(&self, topic: &str) -> bool {
        self.paused
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(topic)
    }

    /// Bumped at every change.
    #[inline]
    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Whether an operator cancelled the job `id` of route `main` due at
    /// `due_ms` (see [`JobCancel`]).
    #[inline]
    pub(crate) fn cancelled(&self, main: &str, id: &str, due_ms: i64) -> bool {
        if !self.any_cancel.load(Ordering::Acquire) {
            return false;
        }
        self.cancels
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(main.to_string(), id.to_string()))
            .is_some_and(|due| due.contains(&due_ms))
    }

    /// Replaces the cancels in force by those of `all` not older than
    /// [`CANCEL_KEPT_MS`] past their due time at `now_ms`.
    pub(super) fn set_cancels<'a>(
        &self,
        all: impl IntoIterator<Item = &'a JobCancel>,
        now_ms: i64,
    ) {
        let mut map: HashMap<(String, String), Vec<i64>> = HashMap::new();
        for c in all {
            if c.due_ms.saturating_add(CANCEL_KEPT_MS) >= now_ms {
                map.entry((c.topic.clone(), c.id.clone()))
                    .or_default()
                    .push(c.due_ms);
            }
        }
        let any = !map.is_empty();
        *self.cancels.write().unwrap_or_else(PoisonError::into_inner) = map;
        self.any_cancel.store(any, Ordering::Release);
    }

    pub(super) fn set(&self, now: HashSet<String>) {
        let mut paused = self.paused.write().unwrap_or_else(PoisonError::into_inner);
        if *paused != now {
            info!(paused = ?now, "routes paused for the group");
            *paused = now;
            self.version.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// The tail thread of one worker: it stops when this is dropped (the
/// worker's run ends, however it ends).
#[derive(Debug)]
pub(crate) struct Following {
    pub(crate) in_force: Arc<InForce>,
    stop: Arc<AtomicBool>,
}

impl Drop for Following {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// How long the tail waits for a record before it looks at `stop`.
const TAIL_POLL: Duration = Duration::from_millis(300);

/// Reads the control topic of `group` to its end (so the caller starts
/// with what is in force), then follows it on a thread until the returned
/// [`Following`] is dropped. Blocking. A first read that fails (the topic
/// is not readable by this principal, say) is logged and the worker starts
/// with nothing held: a worker that cannot start is worse than a pause
/// applied late, and the tail keeps trying.
pub(crate) fn follow(
    config: &KafkaConfig,
    group: &str,
    in_force: Arc<InForce>,
) -> Result<Following> {
    match read_control(config, group) {
        Ok(first) => {
            in_force.set(first.paused());
            in_force.set_cancels(first.cancels.values(), crate::clock::now_ms());
        }
        Err(e) => {
            warn!(topic = %control_topic(group), error = %e, "could not read the group's controls; starting with no route paused")
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let following = Following {
        in_force: in_force.clone(),
        stop: stop.clone(),
    };
    let (config, group, h) = (config.clone(), group.to_string(), in_force);
    std::thread::Builder::new()
        .name("kjob-control".into())
        .spawn(move || tail(&config, &group, &h, &stop))
        .map_err(|e| Error::PollThread {
            reason: format!("starting the control tail: {e}"),
        })?;
    Ok(following)
}

/// Follows the control topic from its start (it is compacted: small),
/// waiting for it to exist. Errors are logged and retried: the last
/// state read stays in force meanwhile.
fn tail(config: &KafkaConfig, group: &str, in_force: &InForce, stop: &AtomicBool) {
    let topic = control_topic(group);
    let mut warned = false;
    while !stop.load(Ordering::Acquire) {
        match crate::topics::partition_counts(config, std::slice::from_ref(&topic)) {
            Ok(c) if c.first().copied().flatten().is_some() => {}
            Ok(_) => {
                std::thread::sleep(Duration::from_secs(2));
                continue;
            }
            Err(e) => {
                // Once: an ACL that refuses it refuses it every time.
                if !std::mem::replace(&mut warned, true) {
                    warn!(topic = %topic, error = %e, "control topic metadata; retrying");
                }
                std::thread::sleep(Duration::from_secs(2));
                continue;
            }
        }
        let consumer: BaseConsumer = match crate::membership::reader(config, group).create() {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "creating the control reader; retrying");
                std::thread::sleep(Duration::from_secs(2));
                continue;
            }
        };
        let mut tpl = TopicPartitionList::new();
        // Manual assignment: no group membership, no commits.
        if tpl
            .add_partition_offset(&topic, 0, Offset::Beginning)
            .and_then(|()| consumer.assign(&tpl))
            .is_err()
        {
            std::thread::sleep(Duration::from_secs(2));
            continue;
        }
        let mut state = ControlState::default();
        while !stop.load(Ordering::Acquire) {
            match consumer.poll(TAIL_POLL) {
                Some(Ok(m)) => {
                    if let Some(key) = m.key().map(|k| String::from_utf8_lossy(k).into_owned()) {
                        let cancel = key.starts_with("cancel:");
                        state.apply(&topic, &key, m.payload());
                        state.audit.clear();
                        state.beats.clear();
                        in_force.set(state.paused());
                        if cancel {
                            in_force.set_cancels(state.cancels.values(), crate::clock::now_ms());
                        }
                    }
                }
                Some(Err(e)) => warn!(topic = %topic, error = %e, "reading the control topic"),
                None => {}
            }
        }
    }
}
