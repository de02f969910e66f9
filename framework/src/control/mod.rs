//! Group-wide controls: a route paused for every worker of a group.
//!
//! Operators write to the group's compacted control topic,
//! `<group>.control` (one partition, compacted; every worker creates it at
//! start, and so does the first operator action): the
//! latest [`RouteControl`] of a route under `route:<topic>`, and one
//! [`ControlAudit`] per action under `route:<topic>:audit:<ms>` (its own
//! key, so compaction keeps every one). Topic names hold no `:`, so the
//! keys cannot be confused.
//!
//! The same topic carries operators' cancels of single waiting jobs
//! ([`JobCancel`], under `cancel:<main topic>:<topic>:<partition>:<offset>`
//! of the record the operator saw): a worker that reaches a record of the
//! route's retry tiers or delay topics with that job id and due time
//! finishes it as cancelled, without running it. Matching by id and due
//! time, not by offset, also catches the copies a delayed job leaves as it
//! hops from bucket to bucket.
//!
//! Every worker reads the topic to its end before it subscribes (a worker
//! that starts while a route is paused never fetches it), then tails it on
//! a thread of its own. The poll thread pauses the assigned partitions of a
//! paused route's main topic at the consumer, after every assignment too,
//! and resumes them on resume unless the scheduler holds them for its own
//! reasons. Pausing only stops fetching: jobs already fetched or running
//! finish and are committed as usual. Only the main topic is paused: the
//! route's retry tiers and delay topics keep flowing, so its retries and
//! delayed jobs already waiting still run when due.

mod beat;
mod follow;

pub(crate) use beat::{beat, BeatSource, Durations};
pub use beat::{worker_key, DurationBuckets, TenantLoad, WorkerBeat, BEAT_EVERY};
pub(crate) use follow::{follow, InForce};

use std::collections::{HashMap, HashSet};

use rdkafka::message::Message;
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::config::KafkaConfig;
use crate::error::Result;

/// The compacted topic of `group`'s controls.
pub fn control_topic(group: &str) -> String {
    format!("{group}.control")
}

/// The control topic's settings: compacted, with small segments so that
/// the heartbeats (one per worker every five seconds) are compacted away
/// within minutes and a full read stays short.
pub const TOPIC_CONFIG: &[(&str, &str)] = &[
    ("cleanup.policy", "compact"),
    ("segment.ms", "600000"),
    ("min.cleanable.dirty.ratio", "0.1"),
    ("delete.retention.ms", "600000"),
];

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

/// The key of the [`JobCancel`] of the record at `topic:partition:offset`
/// of route `main`.
pub fn cancel_key(main: &str, topic: &str, partition: i32, offset: i64) -> String {
    format!("cancel:{main}:{topic}:{partition}:{offset}")
}

/// How long past its due time a cancel is kept: a record is normally
/// reached at its due time, but a group that is down or far behind reaches
/// it later. Older cancels are ignored by workers and removed by the next
/// operator action.
pub const CANCEL_KEPT_MS: i64 = 7 * 24 * 3_600_000;

/// An operator's cancel of one job waiting in a route's retry tier or
/// delay topic: the worker that reaches it (or a copy of it a delay hop
/// wrote) finishes it without running it. "Move to now" is a copy on the
/// main topic followed by one of these for the original.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobCancel {
    /// The route's main topic.
    pub topic: String,
    /// The job id (`kjob-id`).
    pub id: String,
    /// Its due time as written (`kjob-run-at`, else `kjob-due-at`): with
    /// the id, what tells this waiting record (and its hop copies) from
    /// another attempt of the same job.
    pub due_ms: i64,
    /// Where the operator saw it: `topic:partition:offset`.
    pub source: String,
    /// `cancelled`, or `moved to now` (a copy runs on the main topic).
    pub action: String,
    /// Who.
    pub by: String,
    /// When (epoch ms).
    pub at_ms: i64,
    /// Why.
    #[serde(default)]
    pub reason: Option<String>,
}

/// What the control topic holds.
#[derive(Clone, Debug, Default)]
pub struct ControlState {
    /// The latest control per route (main topic).
    pub routes: HashMap<String, RouteControl>,
    /// The latest beat per worker (`client.id`).
    pub workers: HashMap<String, WorkerBeat>,
    /// Every beat read, in order (those compaction has not removed yet):
    /// the handler durations of each interval, for the dashboard's history.
    pub beats: Vec<WorkerBeat>,
    /// Every audited action, oldest first.
    pub audit: Vec<ControlAudit>,
    /// Operators' cancels of waiting jobs, by key ([`cancel_key`]).
    pub cancels: HashMap<String, JobCancel>,
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
        if let Some(id) = key.strip_prefix("worker:") {
            match payload.map(serde_json::from_slice::<WorkerBeat>) {
                None => {
                    self.workers.remove(id);
                }
                Some(Ok(b)) => {
                    if !b.durations.is_empty() {
                        self.beats.push(b.clone());
                    }
                    self.workers.insert(id.to_string(), b);
                }
                Some(Err(e)) => {
                    warn!(topic = %topic, key = %key, error = %e, "unreadable worker beat; ignored")
                }
            }
            return;
        }
        if key.starts_with("cancel:") {
            match payload.map(serde_json::from_slice::<JobCancel>) {
                None => {
                    self.cancels.remove(key);
                }
                Some(Ok(c)) => {
                    self.cancels.insert(key.to_string(), c);
                }
                Some(Err(e)) => {
                    warn!(topic = %topic, key = %key, error = %e, "unreadable job cancel; ignored")
                }
            }
            return;
        }
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
    let Some(records) = crate::topics::read_topic_as(config, &topic, group)? else {
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

/// Creates `group`'s control topic (compacted, one partition) when it is
/// missing: part of the worker's provisioning, before its first poll, as
/// its deployment model lists it. A worker that may not (an ACL) logs it
/// and runs on: no pause reaches it and it beats only once an operator's
/// first action (or an admin) created the topic.
pub(crate) async fn provision(config: &KafkaConfig, group: &str) {
    let topic = control_topic(group);
    if let Err(e) =
        crate::topics::create_topics_with(config, &[(topic.clone(), 1)], TOPIC_CONFIG).await
    {
        warn!(topic = %topic, error = %e, "the control topic could not be created: no operator pause reaches this worker and it publishes no heartbeat until it exists");
    }
}

#[cfg(test)]
mod tests {
    use super::beat::*;
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
    fn duration_quantiles_are_within_a_tenth_and_merge_across_workers() {
        let d = Durations::default();
        for ms in 1..=100 {
            d.record("j", f64::from(ms) / 1000.0);
        }
        let taken = d.take();
        let mut b = DurationBuckets::default();
        b.merge(&taken["j"]);
        assert_eq!(b.count(), 100);
        let p50 = b.quantile_ms(0.5).unwrap_or_default();
        let p99 = b.quantile_ms(0.99).unwrap_or_default();
        assert!((45.0..=55.0).contains(&p50), "p50 {p50}");
        assert!((90.0..=109.0).contains(&p99), "p99 {p99}");
        // Taken means zeroed.
        assert!(d.take()["j"].is_empty());
        // Another worker's slow jobs move the merged p99.
        let mut other = DurationBuckets::default();
        for _ in 0..10 {
            other.merge(&[(DurationBuckets::index(2.0), 1)]);
        }
        b.merge(
            &other
                .counts
                .iter()
                .map(|(k, v)| (*k, *v))
                .collect::<Vec<_>>(),
        );
        let p99 = b.quantile_ms(0.99).unwrap_or_default();
        assert!((1800.0..=2200.0).contains(&p99), "merged p99 {p99}");
        assert_eq!(DurationBuckets::default().quantile_ms(0.5), None);
    }

    #[test]
    fn a_cancel_matches_its_job_and_due_time_and_expires() {
        let c = JobCancel {
            topic: "orders".into(),
            id: "j1".into(),
            due_ms: 1_000,
            source: "orders.delay.1h:0:7".into(),
            action: "cancelled".into(),
            by: "ops".into(),
            at_ms: 10,
            reason: None,
        };
        let mut s = ControlState::default();
        let key = cancel_key("orders", "orders.delay.1h", 0, 7);
        s.apply("t", &key, Some(&serde_json::to_vec(&c).unwrap_or_default()));
        let h = InForce::default();
        assert!(
            !h.cancelled("orders", "j1", 1_000),
            "nothing before it is read"
        );
        h.set_cancels(s.cancels.values(), 500);
        assert!(h.cancelled("orders", "j1", 1_000));
        // Another attempt of the same job, another job, another route.
        assert!(!h.cancelled("orders", "j1", 2_000));
        assert!(!h.cancelled("orders", "j2", 1_000));
        assert!(!h.cancelled("mails", "j1", 1_000));
        // Long past its due time it is no longer held.
        h.set_cancels(s.cancels.values(), 1_000 + CANCEL_KEPT_MS + 1);
        assert!(!h.cancelled("orders", "j1", 1_000));
        // A tombstone removes it.
        s.apply("t", &key, None);
        assert!(s.cancels.is_empty());
    }

    #[test]
    fn holds_bump_their_version_only_on_a_change() {
        let h = InForce::default();
        let v0 = h.version();
        h.set(HashSet::from(["a".to_string()]));
        assert!(h.is_paused("a") && !h.is_paused("b"));
        let v1 = h.version();
        assert_ne!(v0, v1);
        h.set(HashSet::from(["a".to_string()]));
        assert_eq!(h.version(), v1);
    }
}
