//! The firing loop: who leads (the owner of `<group>.schedules` partition
//! 0), what was fired (the compacted `<group>.schedules.state`), and the
//! enqueue of each tick with its deterministic id.
//!
//! Operators steer a schedule through the same state topic, under keys no
//! schedule can have (a schedule name holds no `:`): `<name>:control` is
//! the latest [`ScheduleControl`] (paused or not, the latest manual
//! trigger), and `<name>:audit:<ms>` one [`ScheduleAudit`] per action, each
//! under its own key so compaction keeps them all. Only the leader writes
//! the `<name>` state record; operators write only the other two, so
//! neither overwrites the other's fields.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rdkafka::message::{Message, OwnedHeaders};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{format_tick, manual_id, plan, tick_id, Schedule};
use crate::clock::now_ms;
use crate::config::KafkaConfig;
use crate::error::{Error, Result};
use crate::producer::Producer;
use crate::telemetry::metrics::Metrics;
use crate::worker::WorkerStats;

/// The one-partition topic whose partition-0 owner fires the group's
/// schedules.
pub fn leader_topic(group: &str) -> String {
    format!("{group}.schedules")
}

/// The compacted topic with one [`ScheduleState`] per schedule.
pub fn state_topic(group: &str) -> String {
    format!("{group}.schedules.state")
}

/// What the state topic records per schedule (JSON, keyed by name).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleState {
    /// The schedule's name.
    pub schedule: String,
    /// Its cron expression (with seconds, UTC).
    pub cron: String,
    /// The topic its jobs go to.
    pub topic: String,
    /// Its catch-up policy.
    pub catch_up: String,
    /// When a leader first saw it (epoch ms): no tick before is fired.
    pub since_ms: i64,
    /// Every tick up to here was fired or skipped by the policy.
    pub settled_ms: Option<i64>,
    /// The last tick fired (epoch ms).
    pub last_fired_ms: Option<i64>,
    /// When this record was written (epoch ms).
    pub updated_ms: i64,
    /// Which process wrote it (`host:pid`).
    pub leader: String,
    /// The request time of the latest manual trigger fired (the
    /// control's `trigger_ms`): a later request fires once more.
    #[serde(default)]
    pub last_trigger_ms: Option<i64>,
}

/// What operators asked of one schedule, under `<name>:control` in the
/// state topic (JSON). The leader reads it at take-over and then about
/// once a second, so a pause or a trigger takes effect within a second.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleControl {
    /// The schedule's name.
    pub schedule: String,
    /// While true the leader fires no tick: each passes as skipped, so a
    /// resume carries on with the next tick and never catches up on the
    /// paused ones (an operator who wants one run uses a trigger).
    pub paused: bool,
    /// Who paused or resumed it last.
    #[serde(default)]
    pub by: String,
    /// When (epoch ms).
    #[serde(default)]
    pub at_ms: i64,
    /// Why it was paused.
    #[serde(default)]
    pub reason: Option<String>,
    /// When the latest manual trigger was asked for (epoch ms). The leader
    /// fires it once, as `cron:<name>:manual:<this time>`, even while the
    /// schedule is paused: the operator asked for this run.
    #[serde(default)]
    pub trigger_ms: Option<i64>,
    /// Who asked for it.
    #[serde(default)]
    pub trigger_by: Option<String>,
}

/// One operator action on a schedule, under `<name>:audit:<at_ms>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleAudit {
    /// The schedule's name.
    pub schedule: String,
    /// `paused`, `resumed` or `triggered`.
    pub action: String,
    /// Who.
    pub by: String,
    /// When (epoch ms).
    pub at_ms: i64,
    /// Why (a pause needs one).
    #[serde(default)]
    pub reason: Option<String>,
    /// The job id a trigger enqueues.
    #[serde(default)]
    pub job_id: Option<String>,
}

/// The key of a schedule's [`ScheduleControl`] in the state topic.
pub fn control_key(schedule: &str) -> String {
    format!("{schedule}:control")
}

/// The key of one [`ScheduleAudit`] in the state topic.
pub fn audit_key(schedule: &str, at_ms: i64) -> String {
    format!("{schedule}:audit:{at_ms}")
}

/// Everything the state topic holds: the leader's state, the operators'
/// controls (by schedule name) and their audit, oldest first.
#[derive(Clone, Debug, Default)]
pub struct ScheduleTopic {
    /// The leader's state per schedule.
    pub states: HashMap<String, ScheduleState>,
    /// The operators' control per schedule.
    pub controls: HashMap<String, ScheduleControl>,
    /// Every audited action, oldest first.
    pub audit: Vec<ScheduleAudit>,
}

/// Reads the state topic of `group` to its end: the last state per
/// schedule. Empty when the topic does not exist. Blocking.
pub fn read_states(config: &KafkaConfig, group: &str) -> Result<HashMap<String, ScheduleState>> {
    Ok(read_schedule_topic(config, group)?.states)
}

/// Reads the whole state topic of `group`: states, controls and audit.
/// Empty when the topic does not exist. Blocking.
pub fn read_schedule_topic(config: &KafkaConfig, group: &str) -> Result<ScheduleTopic> {
    let topic = state_topic(group);
    let Some(records) = crate::topics::read_topic_as(config, &topic, group)? else {
        return Ok(ScheduleTopic::default());
    };
    Ok(fold_records(
        &topic,
        records.iter().filter_map(|m| {
            let key = String::from_utf8_lossy(m.key()?).into_owned();
            Some((key, m.payload()))
        }),
    ))
}

/// Folds `(key, payload)` records of a state topic, in order, into what
/// they leave: the latest per key, a tombstone removing it.
fn fold_records<'a>(
    topic: &str,
    records: impl Iterator<Item = (String, Option<&'a [u8]>)>,
) -> ScheduleTopic {
    let mut out = ScheduleTopic::default();
    let mut audit: HashMap<String, ScheduleAudit> = HashMap::new();
    for (key, payload) in records {
        let unreadable = |e: serde_json::Error| warn!(topic = %topic, key = %key, error = %e, "unreadable schedule record; ignored");
        if let Some(name) = key.strip_suffix(":control") {
            match payload.map(serde_json::from_slice::<ScheduleControl>) {
                None => {
                    out.controls.remove(name);
                }
                Some(Ok(c)) => {
                    out.controls.insert(name.to_string(), c);
                }
                Some(Err(e)) => unreadable(e),
            }
        } else if key.contains(":audit:") {
            match payload.map(serde_json::from_slice::<ScheduleAudit>) {
                None => {
                    audit.remove(&key);
                }
                Some(Ok(a)) => {
                    audit.insert(key.clone(), a);
                }
                Some(Err(e)) => unreadable(e),
            }
        } else if key.contains(':') {
            // A key of a later version of kjob: not ours to read.
        } else {
            match payload.map(serde_json::from_slice::<ScheduleState>) {
                None => {
                    out.states.remove(&key);
                }
                Some(Ok(s)) => {
                    out.states.insert(key.clone(), s);
                }
                Some(Err(e)) => unreadable(e),
            }
        }
    }
    out.audit = audit.into_values().collect();
    out.audit.sort_by_key(|a| a.at_ms);
    out
}

fn whoami() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".into());
    format!("{host}:{}", std::process::id())
}

/// How often the loop looks at leadership and the clock. A tick fires at
/// most this late (plus the enqueue).
const LOOP: Duration = Duration::from_millis(100);

struct Firing {
    config: KafkaConfig,
    group: String,
    producer: Producer,
    stats: Arc<WorkerStats>,
    metrics: Metrics,
    schedules: Vec<Schedule>,
    /// The operators' controls as last read (see [`ScheduleControl`]).
    controls: Mutex<HashMap<String, ScheduleControl>>,
}

/// How often the leader reads the operators' controls again.
const CONTROLS_EVERY: Duration = Duration::from_secs(1);

impl Firing {
    fn control(&self, schedule: &str) -> Option<ScheduleControl> {
        self.controls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(schedule)
            .cloned()
    }

    /// Reads the controls again (the whole state topic, which holds a
    /// record or two per schedule and per action once compacted).
    async fn refresh_controls(&self) -> Result<()> {
        let (config, group) = (self.config.clone(), self.group.clone());
        let topic = tokio::task::spawn_blocking(move || read_schedule_topic(&config, &group))
            .await
            .map_err(|e| Error::Task {
                what: "reading the schedule controls",
                reason: e.to_string(),
            })??;
        *self.controls.lock().unwrap_or_else(PoisonError::into_inner) = topic.controls;
        Ok(())
    }

    fn leading(&self) -> bool {
        let topic = leader_topic(&self.group);
        self.stats
            .assignment()
            .iter()
            .any(|(t, p)| *t == topic && *p == 0)
    }

    async fn write(&self, state: &ScheduleState) -> Result<()> {
        let body = serde_json::to_vec(state).map_err(|e| Error::Json {
            what: "schedule state",
            source: Arc::new(e),
        })?;
        self.producer
            .send_raw(
                &state_topic(&self.group),
                Some(state.schedule.as_bytes()),
                Some(&body),
                OwnedHeaders::new(),
            )
            .await
            .map(|_| ())
    }

    /// Becoming leader: the state as the previous leader left it, with a
    /// record for every schedule this worker runs.
    async fn take_over(&self) -> Result<HashMap<String, ScheduleState>> {
        let (config, group) = (self.config.clone(), self.group.clone());
        let topic = tokio::task::spawn_blocking(move || read_schedule_topic(&config, &group))
            .await
            .map_err(|e| Error::Task {
                what: "reading the schedule state",
                reason: e.to_string(),
            })??;
        let mut states = topic.states;
        *self.controls.lock().unwrap_or_else(PoisonError::into_inner) = topic.controls;
        let now = now_ms();
        for s in &self.schedules {
            let fresh = ScheduleState {
                schedule: s.name.clone(),
                cron: s.expr.clone(),
                topic: s.topic.clone(),
                catch_up: s.catch_up.as_str(),
                since_ms: now,
                settled_ms: None,
                last_fired_ms: None,
                updated_ms: now,
                leader: whoami(),
                last_trigger_ms: None,
            };
            let state = match states.get(&s.name) {
                Some(old) => ScheduleState {
                    since_ms: old.since_ms,
                    settled_ms: old.settled_ms,
                    last_fired_ms: old.last_fired_ms,
                    last_trigger_ms: old.last_trigger_ms,
                    ..fresh
                },
                None => fresh,
            };
            if states.get(&s.name) != Some(&state) {
                self.write(&state).await?;
            }
            states.insert(s.name.clone(), state);
        }
        Ok(states)
    }

    /// Fires what is due of every schedule. Stops at the first failure or
    /// lost leadership; what was not recorded is planned again next time.
    async fn fire_due(&self, states: &mut HashMap<String, ScheduleState>) {
        for s in &self.schedules {
            let Ok(cron) = &s.cron else { continue };
            let Some(state) = states.get_mut(&s.name) else {
                continue;
            };
            let control = self.control(&s.name).unwrap_or_default();
            if !self.trigger(s, state, &control).await {
                return;
            }
            let settled = state.settled_ms.unwrap_or(state.since_ms);
            let now = now_ms();
            let mut p = plan(cron, settled, now, s.catch_up);
            let Some(through) = p.settled else { continue };
            if control.paused {
                // Paused: each tick passes as settled without firing, so
                // the resume carries on from the next tick.
                p.fire.clear();
            } else if p.skipped > 0 {
                warn!(schedule = %s.name, skipped = p.skipped, policy = %s.catch_up.as_str(), from = %format_tick(settled), "missed ticks skipped by the catch-up policy");
            }
            for tick in p.fire {
                if !self.leading() {
                    return;
                }
                let id = tick_id(&s.name, tick);
                match (s.fire)(self.producer.clone(), id.clone()).await {
                    Ok(e) => {
                        info!(schedule = %s.name, job.id = %id, topic = %e.topic, late_ms = now_ms() - tick, "schedule fired");
                        WorkerStats::bump(&self.stats.schedule_fired);
                        self.metrics
                            .schedule_fired(&s.name, (now_ms() - tick) as f64 / 1000.0);
                    }
                    Err(e) => {
                        warn!(schedule = %s.name, job.id = %id, error = %e, "could not enqueue a scheduled job; trying again");
                        return;
                    }
                }
                state.settled_ms = Some(tick);
                state.last_fired_ms = Some(tick);
                state.updated_ms = now_ms();
                state.leader = whoami();
                if let Err(e) = self.write(state).await {
                    // The next leader (or this one) fires it again: same id.
                    warn!(schedule = %s.name, job.id = %id, error = %e, "could not record a fired tick");
                    return;
                }
            }
            if state.settled_ms != Some(through) {
                state.settled_ms = Some(through);
                state.updated_ms = now_ms();
                if let Err(e) = self.write(state).await {
                    warn!(schedule = %s.name, error = %e, "could not record skipped ticks");
                }
            }
        }
    }
}

impl Firing {
    /// Fires the schedule's manual trigger if one was asked for since the
    /// last one fired. False when this worker should stop firing for now
    /// (leadership lost, or the enqueue or its record failed: the trigger
    /// stays pending and is fired again, under the same id).
    async fn trigger(
        &self,
        s: &Schedule,
        state: &mut ScheduleState,
        control: &ScheduleControl,
    ) -> bool {
        let Some(asked) = control.trigger_ms else {
            return true;
        };
        if state.last_trigger_ms.is_some_and(|done| done >= asked) {
            return true;
        }
        if !self.leading() {
            return false;
        }
        let id = manual_id(&s.name, asked);
        match (s.fire)(self.producer.clone(), id.clone()).await {
            Ok(e) => {
                info!(schedule = %s.name, job.id = %id, topic = %e.topic, by = control.trigger_by.as_deref().unwrap_or("-"), "schedule triggered by hand");
            }
            Err(e) => {
                warn!(schedule = %s.name, job.id = %id, error = %e, "could not enqueue a triggered job; trying again");
                return false;
            }
        }
        state.last_trigger_ms = Some(asked);
        state.updated_ms = now_ms();
        state.leader = whoami();
        if let Err(e) = self.write(state).await {
            warn!(schedule = %s.name, job.id = %id, error = %e, "could not record a triggered run");
            return false;
        }
        true
    }
}

/// Runs the group's schedules until `stop`: fires while this worker owns
/// partition 0 of the leader topic, and only watches otherwise.
pub(crate) async fn run_schedules(
    config: KafkaConfig,
    group: String,
    producer: Producer,
    stats: Arc<WorkerStats>,
    metrics: Metrics,
    schedules: Vec<Schedule>,
    stop: CancellationToken,
) {
    let firing = Arc::new(Firing {
        config,
        group,
        producer,
        stats,
        metrics,
        schedules,
        controls: Mutex::new(HashMap::new()),
    });
    // The controls are read beside the firing loop, so a slow read never
    // makes a tick late.
    {
        let (firing, stop) = (firing.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(CONTROLS_EVERY) => {}
                }
                if !firing.leading() {
                    continue;
                }
                if let Err(e) = firing.refresh_controls().await {
                    warn!(group = %firing.group, error = %e, "could not read the schedule controls; keeping the last ones");
                }
            }
        });
    }
    let mut states: Option<HashMap<String, ScheduleState>> = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(LOOP) => {}
        }
        let leading = firing.leading();
        firing
            .stats
            .schedule_leader
            .store(leading, Ordering::Release);
        firing
            .metrics
            .snapshot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .schedules = firing
            .schedules
            .iter()
            .map(|s| (s.name.clone(), leading))
            .collect();
        if !leading {
            if states.take().is_some() {
                info!(group = %firing.group, "no longer the schedule leader");
            }
            continue;
        }
        if states.is_none() {
            match firing.take_over().await {
                Ok(s) => {
                    info!(group = %firing.group, schedules = s.len(), "schedule leader: firing this group's schedules");
                    states = Some(s);
                }
                Err(e) => {
                    warn!(group = %firing.group, error = %e, "leading the schedules, but their state could not be read; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            }
        }
        if let Some(s) = states.as_mut() {
            firing.fire_due(s).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json<T: Serialize>(v: &T) -> Vec<u8> {
        serde_json::to_vec(v).unwrap_or_default()
    }

    #[test]
    fn the_state_topic_folds_into_states_controls_and_the_audit() {
        let state = ScheduleState {
            schedule: "report".into(),
            cron: "* * * * * *".into(),
            topic: "reports".into(),
            catch_up: "latest".into(),
            since_ms: 1,
            settled_ms: Some(2),
            last_fired_ms: Some(2),
            updated_ms: 3,
            leader: "h:1".into(),
            last_trigger_ms: None,
        };
        let paused = ScheduleControl {
            schedule: "report".into(),
            paused: true,
            by: "ops".into(),
            at_ms: 10,
            reason: Some("downstream migration".into()),
            trigger_ms: None,
            trigger_by: None,
        };
        let resumed = ScheduleControl {
            paused: false,
            at_ms: 20,
            ..paused.clone()
        };
        let audit = |at_ms: i64, action: &str| ScheduleAudit {
            schedule: "report".into(),
            action: action.into(),
            by: "ops".into(),
            at_ms,
            reason: None,
            job_id: None,
        };
        let (s, p, r) = (json(&state), json(&paused), json(&resumed));
        let (a1, a2) = (json(&audit(20, "resumed")), json(&audit(10, "paused")));
        let records: Vec<(String, Option<&[u8]>)> = vec![
            ("report".into(), Some(&s)),
            ("report:control".into(), Some(&p)),
            (audit_key("report", 20), Some(&a1)),
            (audit_key("report", 10), Some(&a2)),
            ("report:control".into(), Some(&r)),
            ("gone".into(), Some(&s)),
            ("gone".into(), None),
            ("report:future-kind".into(), Some(b"{}")),
            ("broken".into(), Some(b"not json")),
        ];
        let t = fold_records("g.schedules.state", records.into_iter());
        assert_eq!(t.states.len(), 1, "{:?}", t.states.keys());
        assert_eq!(t.states.get("report"), Some(&state));
        assert_eq!(t.controls.get("report"), Some(&resumed), "the latest wins");
        let actions: Vec<&str> = t.audit.iter().map(|a| a.action.as_str()).collect();
        assert_eq!(actions, ["paused", "resumed"], "oldest first");
    }

    #[test]
    fn a_state_written_before_triggers_existed_still_reads() {
        let old = br#"{"schedule":"r","cron":"* * * * * *","topic":"t","catch_up":"skip","since_ms":1,"settled_ms":null,"last_fired_ms":null,"updated_ms":1,"leader":"h:1"}"#;
        let t = fold_records("t", std::iter::once(("r".to_string(), Some(&old[..]))));
        assert_eq!(t.states.get("r").map(|s| s.last_trigger_ms), Some(None));
    }
}
