//! What operators put in force, shown on every page while it lasts: the
//! paused schedules and routes of every group the dashboard knows (the
//! groups of its routes and those whose schedules page was opened), and
//! the route page's pause and resume (`POST /route/pause`, `/route/resume`,
//! through [`crate::control::act`], as `kjob routes pause|resume`).
//!
//! A banner needs no request of its own: the layout reads a snapshot that a
//! background task refreshes every sampling interval, and that an action
//! refreshes at once for its group, so the page that confirms a pause
//! already shows it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Form;
use maud::html;
use serde::Deserialize;

use kjob::control::{read_control, ControlState};
use kjob::schedule::{read_schedule_topic, ScheduleControl};

use super::actor::Actor;
use super::assets::layout;
use super::auth::{check_csrf, FormToken};
use super::batches::status_of;
use super::in_force::{Held, InForce};
use super::pages::{error_page, urlencode};
use crate::control::RouteAction;

use super::{AppState, Shared};

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

    /// Records `group`'s schedule controls as just read.
    pub(super) fn set_in_force<'a>(
        &self,
        group: &str,
        controls: impl IntoIterator<Item = &'a ScheduleControl>,
    ) {
        let now = controls.into_iter().filter(|c| c.paused).map(|c| InForce {
            group: group.to_string(),
            held: Held::Schedule(c.schedule.clone()),
            by: c.by.clone(),
            at_ms: c.at_ms,
            reason: c.reason.clone().unwrap_or_default(),
        });
        self.replace(group, |h| matches!(h, Held::Schedule(_)), now);
    }

    /// Records `group`'s route controls as just read.
    pub(super) fn set_routes_in_force(&self, group: &str, state: &ControlState) {
        let now = state.routes.values().filter(|c| c.paused).map(|c| InForce {
            group: group.to_string(),
            held: Held::Route(c.topic.clone()),
            by: c.by.clone(),
            at_ms: c.at_ms,
            reason: c.reason.clone().unwrap_or_default(),
        });
        self.replace(group, |h| matches!(h, Held::Route(_)), now);
    }

    /// Replaces the controls of `group` of one kind by `now`.
    fn replace(&self, group: &str, kind: fn(&Held) -> bool, now: impl Iterator<Item = InForce>) {
        if let Ok(mut m) = self.in_force.write() {
            let mut all: Vec<InForce> = m
                .remove(group)
                .unwrap_or_default()
                .into_iter()
                .filter(|c| !kind(&c.held))
                .chain(now)
                .collect();
            all.sort_by(|a, b| a.held.cmp(&b.held));
            if !all.is_empty() {
                m.insert(group.to_string(), all);
            }
        }
    }

    /// Records the tenants of `group`'s fair routes from its workers' last
    /// beats, summed per route and tenant; a worker whose last beat is
    /// older than three beat intervals (it crashed) counts no more.
    pub(super) fn set_tenants(&self, group: &str, state: &ControlState) {
        let now = kjob::clock::now_ms();
        let fresh = 3 * kjob::control::BEAT_EVERY.as_millis() as i64;
        let mut sum: BTreeMap<(String, String), (usize, usize)> = BTreeMap::new();
        for b in state.workers.values().filter(|b| now - b.at_ms <= fresh) {
            for t in &b.tenants {
                let e = sum.entry((t.topic.clone(), t.tenant.clone())).or_default();
                e.0 += t.ready;
                e.1 += t.running;
            }
        }
        let all = sum
            .into_iter()
            .map(
                |((topic, tenant), (ready, running))| kjob::control::TenantLoad {
                    topic,
                    tenant,
                    ready,
                    running,
                },
            )
            .collect();
        if let Ok(mut m) = self.tenants.write() {
            m.insert(group.to_string(), all);
        }
    }

    /// The tenants sharing route `topic` of `group`, busiest first.
    pub(super) fn tenants_of(&self, group: &str, topic: &str) -> Vec<kjob::control::TenantLoad> {
        let mut out: Vec<kjob::control::TenantLoad> = self
            .tenants
            .read()
            .ok()
            .and_then(|m| m.get(group).cloned())
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t.topic == topic)
            .collect();
        out.sort_by(|a, b| {
            (b.ready + b.running)
                .cmp(&(a.ready + a.running))
                .then(a.tenant.cmp(&b.tenant))
        });
        out
    }

    /// The route control of `topic` for `group` as last read, if paused.
    pub(super) fn route_paused(&self, group: &str, topic: &str) -> Option<InForce> {
        let m = self.in_force.read().ok()?;
        m.get(group)?
            .iter()
            .find(|c| c.held == Held::Route(topic.to_string()))
            .cloned()
    }

    fn known_groups(&self) -> BTreeSet<String> {
        let mut out: BTreeSet<String> = self.watched.lock().map(|w| w.clone()).unwrap_or_default();
        if let Ok(routes) = self.routes.read() {
            out.extend(routes.iter().map(|r| r.key.group.clone()));
        }
        out
    }
}

/// Refreshes the controls of every known group each sampling interval.
/// Only a weak hold, as the sampler: it ends with the pages.
pub(super) fn spawn(state: Shared) {
    let weak = Arc::downgrade(&state);
    drop(state);
    tokio::spawn(async move {
        while let Some(state) = weak.upgrade() {
            for group in state.known_groups() {
                // An action's own read, newer than this one, must win.
                let generation = state.control_gen.load(Ordering::Acquire);
                let (c, g) = (state.config.clone(), group.clone());
                // A group without schedules reads an absent topic: cheap.
                if let Ok(Ok((t, r))) = tokio::task::spawn_blocking(move || {
                    anyhow::Ok((read_schedule_topic(&c, &g)?, read_control(&c, &g)?))
                })
                .await
                {
                    let _one_step = state
                        .control_apply
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    if state.control_gen.load(Ordering::Acquire) == generation {
                        state.set_in_force(&group, t.controls.values());
                        state.set_routes_in_force(&group, &r);
                    }
                    state.history.absorb(&group, &r.beats);
                    state.set_tenants(&group, &r);
                }
            }
            let every = state.sample_every;
            drop(state);
            tokio::time::sleep(every).await;
        }
    });
}

/// The route page's pause and resume form.
#[derive(Deserialize)]
pub(super) struct RouteForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    topic: String,
    #[serde(default)]
    group: String,
    #[serde(default)]
    reason: String,
}

async fn route_action(
    state: Shared,
    token: FormToken,
    by: String,
    f: RouteForm,
    action: RouteAction,
) -> Response {
    if let Err(r) = check_csrf(&token, &f.csrf) {
        return r.into_response();
    }
    if f.topic.trim().is_empty() || f.group.trim().is_empty() {
        return error_page(StatusCode::BAD_REQUEST, "name the route's topic and group");
    }
    let done = match crate::control::act(&state.config, &f.group, &f.topic, &by, action).await {
        Ok(done) => done,
        Err(e) => return error_page(status_of(&e), &format!("{e:#}")),
    };
    state.watch_group(&f.group);
    state.control_gen.fetch_add(1, Ordering::AcqRel);
    let (c, g) = (state.config.clone(), f.group.clone());
    if let Ok(Ok(r)) = tokio::task::spawn_blocking(move || read_control(&c, &g)).await {
        let _one_step = state
            .control_apply
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.set_routes_in_force(&f.group, &r);
    }
    let back = format!(
        "/route?topic={}&group={}",
        urlencode(&f.topic),
        urlencode(&f.group)
    );
    layout(&state, "Route", html! {
        h1 { "Route " code { (f.topic) } " " (done.action) }
        p.notice.done {
            (done.action) " route " code { (f.topic) } " for group " code { (f.group) } " as " strong { (by) } ". "
            "Every worker of the group applies it within about a second; jobs already fetched finish."
        }
        p { a href=(back) { "Back to the route" } " · " a href="/" { "Overview" } }
    })
    .into_response()
}

/// `POST /route/pause`: needs a reason (400), 409 when already paused.
pub(super) async fn pause_route(
    State(state): State<Shared>,
    Extension(token): Extension<FormToken>,
    Extension(Actor(by)): Extension<Actor>,
    Form(f): Form<RouteForm>,
) -> Response {
    let reason = f.reason.trim().to_string();
    route_action(state, token, by, f, RouteAction::Pause { reason }).await
}

/// `POST /route/resume`: 409 when not paused.
pub(super) async fn resume_route(
    State(state): State<Shared>,
    Extension(token): Extension<FormToken>,
    Extension(Actor(by)): Extension<Actor>,
    Form(f): Form<RouteForm>,
) -> Response {
    route_action(state, token, by, f, RouteAction::Resume).await
}
