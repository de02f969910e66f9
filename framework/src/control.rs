//! Group-wide controls: a route paused for every worker of a group.
//!
//! Operators write to the group's compacted control topic,
//! `<group>.control` (one partition, created by the first action): the
//! latest [`RouteControl`] of a route under `route:<topic>`, and one
//! [`ControlAudit`] per action under `route:<topic>:audit:<ms>` (its own
//! key, so compaction keeps every one). Topic names hold no `:`, so the
//! keys cannot be confused.
//!
//! Every worker reads the topic to its end before it subscribes (a worker
//! that starts while a route is paused never fetches it), then tails it on
//! a thread of its own. The poll thread pauses the assigned partitions of a
//! paused route's main topic at the consumer, after every assignment too,
//! and resumes them on resume unless the scheduler holds them for its own
//! reasons. Pausing only stops fetching: jobs already fetched or running
//! finish and are committed as usual. Retry tiers and delay topics are
//! shared by the group's routes, so they keep flowing: a route's retries
//! already waiting still run when due.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::config::KafkaConfig;
use crate::error::{Error, Result};

/// The compacted topic of `group`'s controls.
pub fn control_topic(group: &str) -> String {
    format!("{group}.control")
}

/// The key of a route's [`RouteControl`].
pub fn route_key(topic: &str) -> String {
    format!("route:{topic}")
}

/// The key of one [`ControlAudit`] of a route.
pub fn route_audit_key(topic: &str, at_ms: i64) -> String {
    format!("route:{topic}:audit:{at_ms}")
}

/// Whether a route (its main topic) is paused for the whole group.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteControl {
    /// The route's main topic.
    pub topic: String,
    /// While true no worker of the group fetches the main topic.
    pub paused: bool,
    /// Who paused or resumed it last.
    pub by: String,
    /// When (epoch ms).
    pub at_ms: i64,
    /// Why it was paused.
    #[serde(default)]
    pub reason: Option<String>,
}

/// One operator action on the control topic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlAudit {
    /// What it is about: `route:<topic>`.
    pub subject: String,
    /// `paused` or `resumed`.
    pub action: String,
    /// Who.
    pub by: String,
    /// When (epoch ms).
    pub at_ms: i64,
    /// Why (a pause needs one).
    #[serde(default)]
    pub reason: Option<String>,
}

/// What the control topic holds.
#[derive(Clone, Debug, Default)]
pub struct ControlState {
    /// The latest control per route (main topic).
    pub routes: HashMap<String, RouteControl>,
    /// Every audited action, oldest first.
    pub audit: Vec<ControlAudit>,
}

impl ControlState {
    /// The main topics paused now.
    pub fn paused(&self) -> HashSet<String> {
        self.routes
            .iter()
            .filter(|(_, c)| c.paused)
            .map(|(topic, _)| topic.clone())
            .collect()
    }

    /// Applies one record (`None`: a tombstone).
    fn apply(&mut self, topic: &str, key: &str, payload: Option<&[u8]>) {
        let Some(rest) = key.strip_prefix("route:") else {
            return; // a key of a later version of kjob
        };
        if rest.contains(":audit:") {
            match payload.map(serde_json::from_slice::<ControlAudit>) {
                Some(Ok(a)) => self.audit.push(a),
                Some(Err(e)) => {
                    warn!(topic = %topic, key = %key, error = %e, "unreadable control audit; ignored")
                }
                None => {}
            }
        } else if !rest.contains(':') {
            match payload.map(serde_json::from_slice::<RouteControl>) {
                None => {
                    self.routes.remove(rest);
                }
                Some(Ok(c)) => {
                    self.routes.insert(rest.to_string(), c);
                }
                Some(Err(e)) => {
                    warn!(topic = %topic, key = %key, error = %e, "unreadable route control; ignored")
                }
            }
        }
    }
}

/// Reads `group`'s control topic to its end. Empty when it does not
/// exist. Blocking.
pub fn read_control(config: &KafkaConfig, group: &str) -> Result<ControlState> {
    let topic = control_topic(group);
    let mut out = ControlState::default();
    let Some(records) = crate::topics::read_topic(config, &topic)? else {
        return Ok(out);
    };
    for m in &records {
        let Some(key) = m.key().map(|k| String::from_utf8_lossy(k).into_owned()) else {
            continue;
        };
        out.apply(&topic, &key, m.payload());
    }
    out.audit.sort_by_key(|a| a.at_ms);
    Ok(out)
}

/// The paused main topics as the worker last read them, shared by the
/// tail thread (writer) and the poll thread (reader, which compares
/// `version` to see a change without taking the lock).
#[derive(Debug, Default)]
pub(crate) struct Holds {
    paused: RwLock<HashSet<String>>,
    version: AtomicU64,
}

impl Holds {
    /// Whether `topic`'s partitions are held paused.
    pub(crate) fn held(&self, topic: &str) -> bool {
        self.paused
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(topic)
    }

    /// Bumped at every change.
    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    fn set(&self, now: HashSet<String>) {
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
    pub(crate) holds: Arc<Holds>,
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
pub(crate) fn follow(config: &KafkaConfig, group: &str) -> Result<Following> {
    let holds = Arc::new(Holds::default());
    match read_control(config, group) {
        Ok(first) => holds.set(first.paused()),
        Err(e) => {
            warn!(topic = %control_topic(group), error = %e, "could not read the group's controls; starting with no route paused")
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let following = Following {
        holds: holds.clone(),
        stop: stop.clone(),
    };
    let (config, group, h) = (config.clone(), group.to_string(), holds);
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
fn tail(config: &KafkaConfig, group: &str, holds: &Holds, stop: &AtomicBool) {
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
        let consumer: BaseConsumer = match config
            .client_config(&[
                ("group.id", "kjob-control-reader"),
                ("enable.auto.commit", "false"),
                ("enable.partition.eof", "false"),
            ])
            .create()
        {
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
                        state.apply(&topic, &key, m.payload());
                        state.audit.clear();
                        holds.set(state.paused());
                    }
                }
                Some(Err(e)) => warn!(topic = %topic, error = %e, "reading the control topic"),
                None => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_controls_fold_latest_first_and_audit_in_order() {
        let pause = RouteControl {
            topic: "orders".into(),
            paused: true,
            by: "ops".into(),
            at_ms: 1,
            reason: Some("db".into()),
        };
        let resume = RouteControl {
            paused: false,
            at_ms: 2,
            ..pause.clone()
        };
        let audit = ControlAudit {
            subject: route_key("orders"),
            action: "paused".into(),
            by: "ops".into(),
            at_ms: 1,
            reason: None,
        };
        let mut s = ControlState::default();
        let (p, r, a) = (
            serde_json::to_vec(&pause).unwrap_or_default(),
            serde_json::to_vec(&resume).unwrap_or_default(),
            serde_json::to_vec(&audit).unwrap_or_default(),
        );
        s.apply("t", &route_key("orders"), Some(&p));
        s.apply("t", &route_audit_key("orders", 1), Some(&a));
        assert_eq!(s.paused(), HashSet::from(["orders".to_string()]));
        s.apply("t", &route_key("orders"), Some(&r));
        assert!(s.paused().is_empty());
        s.apply("t", &route_key("orders"), None);
        assert!(s.routes.is_empty());
        s.apply("t", "worker:x", Some(b"{}"));
        s.apply("t", &route_key("broken"), Some(b"nope"));
        assert!(s.routes.is_empty());
        assert_eq!(s.audit, [audit]);
    }

    #[test]
    fn holds_bump_their_version_only_on_a_change() {
        let h = Holds::default();
        let v0 = h.version();
        h.set(HashSet::from(["a".to_string()]));
        assert!(h.held("a") && !h.held("b"));
        let v1 = h.version();
        assert_ne!(v0, v1);
        h.set(HashSet::from(["a".to_string()]));
        assert_eq!(h.version(), v1);
    }
}
