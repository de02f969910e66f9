//! What operators put in force, shown on every page while it lasts: the
//! paused schedules of every group the dashboard knows (the groups of its
//! routes and those whose schedules page was opened).
//!
//! A banner needs no request of its own: the layout reads a snapshot that a
//! background task refreshes every sampling interval, and that an action
//! refreshes at once for its group, so the page that confirms a pause
//! already shows it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kjob::schedule::{read_schedule_topic, ScheduleControl};

use super::{AppState, Shared};

/// One control in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct InForce {
    /// The group it applies to.
    pub(super) group: String,
    /// The schedule it holds.
    pub(super) schedule: String,
    /// Who put it in force.
    pub(super) by: String,
    /// Since when (epoch ms).
    pub(super) at_ms: i64,
    /// Why.
    pub(super) reason: String,
}

impl AppState {
    /// Every control in force, by group.
    pub(super) fn in_force(&self) -> Vec<InForce> {
        self.in_force
            .read()
            .map(|m| m.values().flatten().cloned().collect())
            .unwrap_or_default()
    }

    /// Starts showing `group`'s controls (its schedules page was opened).
    pub(super) fn watch_group(&self, group: &str) {
        if let Ok(mut w) = self.watched.lock() {
            w.insert(group.to_string());
        }
    }

    /// Records `group`'s controls as just read.
    pub(super) fn set_in_force<'a>(
        &self,
        group: &str,
        controls: impl IntoIterator<Item = &'a ScheduleControl>,
    ) {
        let mut now: Vec<InForce> = controls
            .into_iter()
            .filter(|c| c.paused)
            .map(|c| InForce {
                group: group.to_string(),
                schedule: c.schedule.clone(),
                by: c.by.clone(),
                at_ms: c.at_ms,
                reason: c.reason.clone().unwrap_or_default(),
            })
            .collect();
        now.sort_by(|a, b| a.schedule.cmp(&b.schedule));
        if let Ok(mut m) = self.in_force.write() {
            if now.is_empty() {
                m.remove(group);
            } else {
                m.insert(group.to_string(), now);
            }
        }
    }

    fn known_groups(&self) -> BTreeSet<String> {
        let mut out: BTreeSet<String> = self.watched.lock().map(|w| w.clone()).unwrap_or_default();
        if let Ok(routes) = self.routes.read() {
            out.extend(routes.iter().map(|r| r.key.group.clone()));
        }
        out
    }
}

/// The map behind [`AppState::in_force`].
pub(super) type InForceMap = BTreeMap<String, Vec<InForce>>;

/// Refreshes the controls of every known group each sampling interval.
/// Only a weak hold, as the sampler: it ends with the pages.
pub(super) fn spawn(state: Shared) {
    let weak = Arc::downgrade(&state);
    drop(state);
    tokio::spawn(async move {
        while let Some(state) = weak.upgrade() {
            for group in state.known_groups() {
                let (c, g) = (state.config.clone(), group.clone());
                // A group without schedules reads an absent topic: cheap.
                if let Ok(Ok(t)) =
                    tokio::task::spawn_blocking(move || read_schedule_topic(&c, &g)).await
                {
                    state.set_in_force(&group, t.controls.values());
                }
            }
            let every = state.sample_every;
            drop(state);
            tokio::time::sleep(every).await;
        }
    });
}
