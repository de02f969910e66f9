//! A group's cron schedules as operators see them, and the operators'
//! three actions on one: pause, resume and trigger now.
//!
//! What the schedules did comes from the group's compacted state topic
//! (`<group>.schedules.state`, written by the leader); who leads comes from
//! the group itself (the member owning partition 0 of `<group>.schedules`),
//! so with no such member the answer is "no leader" however recent the
//! state is. `kjob schedules` and the dashboard's schedules page both read
//! [`read`].
//!
//! An action writes the schedule's [`ScheduleControl`] (the leader honours
//! it within about a second) and a [`ScheduleAudit`] under its own key in
//! the same topic, so the audit survives compaction. A trigger enqueues
//! nothing itself: only the leader holds the code that makes the job, so it
//! fires the trigger as `cron:<name>:manual:<asked at>` (see
//! [`kjob::schedule::manual_id`]), which no tick's id can equal.

use kjob::schedule::{
    audit_key, control_key, leader_topic, manual_id, next_tick, read_schedule_topic, state_topic,
    ScheduleAudit, ScheduleControl, ScheduleState,
};
use kjob::{KafkaConfig, Producer};
use rdkafka::message::OwnedHeaders;

use crate::problem::Problem;

/// One schedule: what the leader recorded and what operators asked.
#[derive(Clone, Debug)]
pub struct ScheduleRow {
    /// The leader's record.
    pub state: ScheduleState,
    /// The operators' control, if any was ever written.
    pub control: Option<ScheduleControl>,
    /// The next tick after now (`None` for an expression with no more).
    pub next_ms: Option<i64>,
}

impl ScheduleRow {
    /// Whether the schedule is paused now.
    pub fn paused(&self) -> bool {
        self.control.as_ref().is_some_and(|c| c.paused)
    }

    /// A manual trigger asked for and not fired yet: its request time.
    pub fn pending_trigger(&self) -> Option<i64> {
        let asked = self.control.as_ref()?.trigger_ms?;
        match self.state.last_trigger_ms {
            Some(done) if done >= asked => None,
            _ => Some(asked),
        }
    }
}

/// A group's schedules.
#[derive(Clone, Debug)]
pub struct Schedules {
    /// The group.
    pub group: String,
    /// The member firing them now, as `client.id@host`; `None` when no
    /// member owns partition 0 of the leader topic.
    pub leader: Option<String>,
    /// By name.
    pub rows: Vec<ScheduleRow>,
    /// Every operator action, newest first.
    pub audit: Vec<ScheduleAudit>,
}

impl Schedules {
    /// The paused schedules, by name.
    pub fn paused(&self) -> impl Iterator<Item = &ScheduleRow> {
        self.rows.iter().filter(|r| r.paused())
    }
}

/// The member that fires `group`'s schedules now: the owner of partition 0
/// of `<group>.schedules`, as `client.id@host`. `None` when no member owns
/// it (the leader left or its session expired, and no one took over yet).
/// Blocking.
pub fn current_leader(config: &KafkaConfig, group: &str) -> anyhow::Result<Option<String>> {
    let topic = leader_topic(group);
    let groups = crate::groups::describe_groups(config, Some(group))?;
    Ok(groups
        .iter()
        .flat_map(|g| g.members.iter())
        .find(|m| {
            m.assignment
                .iter()
                .any(|(t, ps)| *t == topic && ps.contains(&0))
        })
        .map(|m| format!("{}@{}", m.client_id, m.host.trim_start_matches('/'))))
}

/// `group`'s schedules, their controls and audit, and the leader. Empty
/// rows when the state topic does not exist. Blocking.
pub fn read(config: &KafkaConfig, group: &str) -> anyhow::Result<Schedules> {
    let mut topic = read_schedule_topic(config, group)?;
    let leader = current_leader(config, group)?;
    let now = kjob::clock::now_ms();
    let mut rows: Vec<ScheduleRow> = topic
        .states
        .into_values()
        .map(|state| ScheduleRow {
            next_ms: next_tick(&state.cron, now),
            control: topic.controls.remove(&state.schedule),
            state,
        })
        .collect();
    rows.sort_by(|a, b| a.state.schedule.cmp(&b.state.schedule));
    topic.audit.reverse();
    Ok(Schedules {
        group: group.to_string(),
        leader,
        rows,
        audit: topic.audit,
    })
}

/// What [`act`] does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Stop firing ticks (they pass as skipped) until resumed.
    Pause {
        /// Why (required: it is shown on every dashboard page meanwhile).
        reason: String,
    },
    /// Fire ticks again from the next one on.
    Resume,
    /// Have the leader enqueue the schedule's job once, now.
    Trigger,
}

impl Action {
    fn audit_name(&self) -> &'static str {
        match self {
            Action::Pause { .. } => "paused",
            Action::Resume => "resumed",
            Action::Trigger => "triggered",
        }
    }
}

/// Pauses, resumes or triggers `schedule` of `group` as `by`, and audits it.
/// Refused for a pause of a paused schedule, a resume of a running one, and
/// a pause without a reason; not found for a schedule no leader recorded.
/// Returns the audit entry written (a trigger's names its job id).
pub async fn act(
    config: &KafkaConfig,
    group: &str,
    schedule: &str,
    by: &str,
    action: Action,
) -> anyhow::Result<ScheduleAudit> {
    if let Action::Pause { reason } = &action {
        if reason.trim().is_empty() {
            return Err(Problem::usage(
                "a pause needs a reason: it is shown on every dashboard page while the schedule is paused",
            )
            .into());
        }
    }
    let topic = {
        let (c, g) = (config.clone(), group.to_string());
        tokio::task::spawn_blocking(move || read_schedule_topic(&c, &g)).await??
    };
    if !topic.states.contains_key(schedule) {
        let hint = crate::suggest::did_you_mean(schedule, topic.states.keys().map(String::as_str));
        return Err(Problem::not_found(format!(
            "no schedule `{schedule}` recorded on `{}`{hint}; a schedule is recorded once a leader runs it",
            state_topic(group)
        ))
        .into());
    }
    let now = kjob::clock::now_ms();
    let mut control = topic
        .controls
        .get(schedule)
        .cloned()
        .unwrap_or_else(|| ScheduleControl {
            schedule: schedule.to_string(),
            ..ScheduleControl::default()
        });
    let mut entry = ScheduleAudit {
        schedule: schedule.to_string(),
        action: action.audit_name().to_string(),
        by: by.to_string(),
        at_ms: now,
        reason: None,
        job_id: None,
    };
    match &action {
        Action::Pause { reason } => {
            if control.paused {
                return Err(Problem::refused(format!(
                    "schedule `{schedule}` is already paused (by {} at {})",
                    control.by,
                    crate::time::format_ms(Some(control.at_ms))
                ))
                .into());
            }
            control.paused = true;
            control.by = by.to_string();
            control.at_ms = now;
            control.reason = Some(reason.trim().to_string());
            entry.reason = control.reason.clone();
        }
        Action::Resume => {
            if !control.paused {
                return Err(
                    Problem::refused(format!("schedule `{schedule}` is not paused")).into(),
                );
            }
            control.paused = false;
            control.by = by.to_string();
            control.at_ms = now;
            control.reason = None;
        }
        Action::Trigger => {
            control.trigger_ms = Some(now);
            control.trigger_by = Some(by.to_string());
            entry.job_id = Some(manual_id(schedule, now));
        }
    }
    let producer = Producer::new(config)?;
    let state = state_topic(group);
    // The audit first: an action is never in force without its record.
    let audit_body = serde_json::to_vec(&entry)?;
    producer
        .send_raw(
            &state,
            Some(audit_key(schedule, now).as_bytes()),
            Some(&audit_body),
            OwnedHeaders::new(),
        )
        .await?;
    let body = serde_json::to_vec(&control)?;
    producer
        .send_raw(
            &state,
            Some(control_key(schedule).as_bytes()),
            Some(&body),
            OwnedHeaders::new(),
        )
        .await?;
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(control: Option<ScheduleControl>, last_trigger_ms: Option<i64>) -> ScheduleRow {
        ScheduleRow {
            state: ScheduleState {
                schedule: "r".into(),
                cron: "* * * * * *".into(),
                topic: "t".into(),
                catch_up: "latest".into(),
                since_ms: 0,
                settled_ms: None,
                last_fired_ms: None,
                updated_ms: 0,
                leader: "h:1".into(),
                last_trigger_ms,
            },
            control,
            next_ms: None,
        }
    }

    #[test]
    fn a_trigger_is_pending_until_the_leader_records_it() {
        assert_eq!(row(None, None).pending_trigger(), None);
        let asked = ScheduleControl {
            trigger_ms: Some(50),
            ..ScheduleControl::default()
        };
        assert_eq!(row(Some(asked.clone()), None).pending_trigger(), Some(50));
        assert_eq!(
            row(Some(asked.clone()), Some(40)).pending_trigger(),
            Some(50)
        );
        assert_eq!(row(Some(asked.clone()), Some(50)).pending_trigger(), None);
        assert!(!row(Some(asked), None).paused());
        let paused = ScheduleControl {
            paused: true,
            ..ScheduleControl::default()
        };
        assert!(row(Some(paused), None).paused());
    }
}
