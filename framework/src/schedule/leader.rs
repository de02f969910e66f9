//! The firing loop: who leads (the owner of `<group>.schedules` partition
//! 0), what was fired (the compacted `<group>.schedules.state`), and the
//! enqueue of each tick with its deterministic id.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use rdkafka::message::{Message, OwnedHeaders};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{format_tick, plan, tick_id, Schedule};
use crate::config::KafkaConfig;
use crate::dlq::now_ms;
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
}

/// Reads the state topic of `group` to its end: the last state per
/// schedule. Empty when the topic does not exist. Blocking.
pub fn read_states(config: &KafkaConfig, group: &str) -> Result<HashMap<String, ScheduleState>> {
    let mut out = HashMap::new();
    let topic = state_topic(group);
    let Some(records) = crate::topics::read_topic(config, &topic)? else {
        return Ok(out);
    };
    for m in records {
        let Some(key) = m.key().map(|k| String::from_utf8_lossy(k).into_owned()) else {
            continue;
        };
        match m.payload() {
            None => {
                out.remove(&key);
            }
            Some(p) => match serde_json::from_slice::<ScheduleState>(p) {
                Ok(s) => {
                    out.insert(key, s);
                }
                Err(e) => {
                    warn!(topic = %topic, key = %key, error = %e, "unreadable schedule state; ignored")
                }
            },
        }
    }
    Ok(out)
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
}

impl Firing {
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
        let mut states = tokio::task::spawn_blocking(move || read_states(&config, &group))
            .await
            .map_err(|e| Error::Task {
                what: "reading the schedule state",
                reason: e.to_string(),
            })??;
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
            };
            let state = match states.get(&s.name) {
                Some(old) => ScheduleState {
                    since_ms: old.since_ms,
                    settled_ms: old.settled_ms,
                    last_fired_ms: old.last_fired_ms,
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
            let settled = state.settled_ms.unwrap_or(state.since_ms);
            let now = now_ms();
            let p = plan(cron, settled, now, s.catch_up);
            let Some(through) = p.settled else { continue };
            if p.skipped > 0 {
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
    let firing = Firing {
        config,
        group,
        producer,
        stats,
        metrics,
        schedules,
    };
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
