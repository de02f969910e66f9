//! The schedules page: a group's cron schedules with their next and last
//! fire, the leader, and (with actions allowed) pause, resume and trigger
//! now, each audited through [`crate::schedules::act`], the function behind
//! `kjob schedules pause|resume|trigger`.
//!
//! The page says what the leader will do, not what it did: a pause or a
//! trigger is applied by the leader within about a second, so a trigger
//! shows as pending until the leader records it.

use axum::extract::{Extension, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Form;
use maud::{html, Markup};
use serde::Deserialize;

use kjob::schedule::{manual_id, state_topic};

use super::actor::Actor;
use super::assets::layout;
use super::auth::{check_csrf, FormToken};
use super::batches::status_of;
use super::pages::{error_page, live_every, urlencode};
use super::view::{cut, when, CELL_CHARS};
use super::Shared;
use crate::schedules::{Action, ScheduleRow, Schedules};

/// `?group=`.
#[derive(Deserialize)]
pub(super) struct ListQuery {
    #[serde(default)]
    group: Option<String>,
}

fn href(group: &str) -> String {
    format!("/schedules?group={}", urlencode(group))
}

/// The groups the dashboard knows, for the page without `?group=`.
fn known_groups(state: &Shared) -> Vec<String> {
    let mut out: Vec<String> = state
        .routes
        .read()
        .map(|r| r.iter().map(|v| v.key.group.clone()).collect())
        .unwrap_or_default();
    out.sort();
    out.dedup();
    out
}

fn row_actions(token: &FormToken, group: &str, r: &ScheduleRow) -> Markup {
    let name = &r.state.schedule;
    let hidden = html! {
        input type="hidden" name="csrf" value=(token.0);
        input type="hidden" name="group" value=(group);
        input type="hidden" name="schedule" value=(name);
    };
    html! {
        @if r.paused() {
            form.inline.resume method="post" action="/schedules/resume" {
                (hidden) button.secondary.resume type="submit" { "Resume" }
            }
        } @else {
            form.inline.pause method="post" action="/schedules/pause" {
                (hidden)
                input.reason name="reason" required placeholder="reason (required, audited)" size="22";
                button.danger.pause type="submit" { "Pause" }
            }
        }
        form.inline.trigger method="post" action="/schedules/trigger" {
            (hidden) button.trigger type="submit" { "Trigger now" }
        }
    }
}

fn table(state: &Shared, token: &FormToken, s: &Schedules, now: i64) -> Markup {
    html! {
        table.schedules {
            thead { tr {
                th { "schedule" } th { "cron (UTC)" } th { "topic" } th { "catch-up" } th { "state" }
                th { "last fired tick" } th { "next tick" } th { "manual trigger" } th { "last recorded by" }
                @if state.allow_actions { th { "actions" } }
            } }
            tbody {
                @for r in &s.rows {
                    @let st = &r.state;
                    tr data-schedule=(st.schedule) data-paused=(r.paused()) {
                        td.mono { (cut(&st.schedule, CELL_CHARS)) }
                        td.mono { (cut(&st.cron, CELL_CHARS)) }
                        td.mono { (cut(&st.topic, CELL_CHARS)) }
                        td { (cut(&st.catch_up, CELL_CHARS)) }
                        td.state {
                            @match r.control.as_ref().filter(|c| c.paused) {
                                Some(c) => {
                                    span.status.paused { "paused" }
                                    " by " strong.by { (cut(&c.by, CELL_CHARS)) } " " (when(Some(c.at_ms), now))
                                    @if let Some(why) = &c.reason { div.reason.muted { (cut(why, CELL_CHARS)) } }
                                },
                                None => span.status.running { "running" },
                            }
                        }
                        td.time.last { (when(st.last_fired_ms, now)) }
                        td.time.next {
                            @if r.paused() { span.muted { "none while paused" } } @else { (when(r.next_ms, now)) }
                        }
                        td.time.manual {
                            @if let Some(asked) = r.pending_trigger() {
                                span.pending { "pending since " (when(Some(asked), now)) }
                            } @else if let Some(done) = st.last_trigger_ms {
                                span.fired.mono { (manual_id(&st.schedule, done)) }
                            } @else { "-" }
                        }
                        td.mono { (cut(&st.leader, CELL_CHARS)) " " (when(Some(st.updated_ms), now)) }
                        @if state.allow_actions { td { (row_actions(token, &s.group, r)) } }
                    }
                }
            }
        }
    }
}

/// `GET /schedules`: a group's schedules, or the group to choose.
pub(super) async fn list(
    State(state): State<Shared>,
    Extension(token): Extension<FormToken>,
    Query(q): Query<ListQuery>,
) -> Response {
    let group = q
        .group
        .as_deref()
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(str::to_string);
    let chooser = html! {
        form.inline method="get" action="/schedules" {
            label { "consumer group" input name="group" value=(group.as_deref().unwrap_or_default()) size="40"; }
            button.secondary type="submit" { "Show" }
        }
    };
    let Some(group) = group else {
        let groups = known_groups(&state);
        return layout(&state, "Schedules", html! {
            h1 { "Schedules" }
            (chooser)
            @if groups.is_empty() { p.muted { "Name the group whose workers run the schedules." } }
            ul.groups { @for g in &groups { li { a href=(href(g)) { code { (g) } } } } }
        })
        .into_response();
    };
    state.watch_group(&group);
    let (config, g) = (state.config.clone(), group.clone());
    let s = match tokio::task::spawn_blocking(move || crate::schedules::read(&config, &g)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return error_page(status_of(&e), &format!("{e:#}")),
        Err(e) => {
            return error_page(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("background task: {e}"),
            )
        }
    };
    state.set_in_force(&group, s.rows.iter().filter_map(|r| r.control.as_ref()));
    let now = kjob::clock::now_ms();
    layout(&state, "Schedules", html! {
        h1 { "Schedules of group " code { (group) } }
        (chooser)
        div #schedules data-live=(live_every(&state)) {
            p.leader {
                "leader: "
                @match &s.leader {
                    Some(l) => strong.leader-name { (cut(l, CELL_CHARS)) },
                    None => span.bad { "no leader (no member owns partition 0 of " code { (kjob::schedule::leader_topic(&group)) } ")" },
                }
            }
            @if s.rows.is_empty() {
                p.notice.empty { "No schedules recorded on " code { (state_topic(&group)) } ": a schedule is recorded once a leader runs it." }
            } @else {
                (table(&state, &token, &s, now))
            }
            @if !s.audit.is_empty() {
                section.card.audit {
                    h2 { "Audit" }
                    table {
                        thead { tr { th { "when" } th { "schedule" } th { "action" } th { "by" } th { "reason or job" } } }
                        tbody { @for a in s.audit.iter().take(50) { tr data-action=(a.action) {
                            td.time { (when(Some(a.at_ms), now)) }
                            td.mono { (cut(&a.schedule, CELL_CHARS)) }
                            td { (a.action) }
                            td { (cut(&a.by, CELL_CHARS)) }
                            td.mono { (cut(a.reason.as_deref().or(a.job_id.as_deref()).unwrap_or("-"), CELL_CHARS)) }
                        } } }
                    }
                }
            }
        }
        p.muted { "A pause holds every tick (they pass as skipped: a resume carries on from the next tick and never catches up on them). Trigger now has the leader enqueue the job once as " code { "cron:<name>:manual:<time>" } ", also while paused. The leader applies both within about a second." }
    })
    .into_response()
}

/// The fields the three actions post.
#[derive(Deserialize)]
pub(super) struct ActionForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    group: String,
    #[serde(default)]
    schedule: String,
    #[serde(default)]
    reason: String,
}

async fn run(
    state: Shared,
    token: FormToken,
    by: String,
    f: ActionForm,
    action: Action,
) -> Response {
    if let Err(r) = check_csrf(&token, &f.csrf) {
        return r.into_response();
    }
    if f.group.trim().is_empty() || f.schedule.trim().is_empty() {
        return error_page(StatusCode::BAD_REQUEST, "name the group and the schedule");
    }
    let done = match crate::schedules::act(&state.config, &f.group, &f.schedule, &by, action).await
    {
        Ok(done) => done,
        Err(e) => return error_page(status_of(&e), &format!("{e:#}")),
    };
    // The banner of the confirmation page already shows the change (and
    // a background read begun before it is discarded).
    state
        .control_gen
        .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    let (config, g) = (state.config.clone(), f.group.clone());
    if let Ok(Ok(t)) =
        tokio::task::spawn_blocking(move || kjob::schedule::read_schedule_topic(&config, &g)).await
    {
        let _one_step = state
            .control_apply
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.set_in_force(&f.group, t.controls.values());
    }
    layout(&state, "Schedule", html! {
        h1 { "Schedule " code { (f.schedule) } " " (done.action) }
        p.notice.done {
            (done.action) " schedule " code { (f.schedule) } " of group " code { (f.group) } " as " strong { (by) } ". "
            @if let Some(id) = &done.job_id { "The leader enqueues job " code.job-id { (id) } " within about a second." }
            @else { "The leader applies it within about a second." }
        }
        p { a href=(href(&f.group)) { "Back to the schedules" } }
    })
    .into_response()
}

/// `POST /schedules/pause`: needs a reason (400 without one); 409 when
/// already paused.
pub(super) async fn pause(
    State(state): State<Shared>,
    Extension(token): Extension<FormToken>,
    Extension(Actor(by)): Extension<Actor>,
    Form(f): Form<ActionForm>,
) -> Response {
    let reason = f.reason.trim().to_string();
    run(state, token, by, f, Action::Pause { reason }).await
}

/// `POST /schedules/resume`: 409 when not paused.
pub(super) async fn resume(
    State(state): State<Shared>,
    Extension(token): Extension<FormToken>,
    Extension(Actor(by)): Extension<Actor>,
    Form(f): Form<ActionForm>,
) -> Response {
    run(state, token, by, f, Action::Resume).await
}

/// `POST /schedules/trigger`: the leader enqueues the job once.
pub(super) async fn trigger(
    State(state): State<Shared>,
    Extension(token): Extension<FormToken>,
    Extension(Actor(by)): Extension<Actor>,
    Form(f): Form<ActionForm>,
) -> Response {
    run(state, token, by, f, Action::Trigger).await
}
