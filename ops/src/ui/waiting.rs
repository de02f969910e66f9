//! `GET /waiting`: the jobs sitting in a route's retry tiers and delay
//! topics, with their due times, through [`crate::waiting::waiting`] (a
//! bounded read from the group's committed offsets; nothing is committed).
//! With actions allowed each row can be cancelled (a reason required) or
//! moved to "now": `POST /waiting/act`, through [`crate::waiting::act`] as
//! `kjob waiting cancel|now --execute`, audited on the group's control
//! topic with the request's actor.

use axum::extract::{Extension, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Form;
use maud::{html, Markup};
use serde::Deserialize;

use super::actor::Actor;
use super::assets::layout;
use super::auth::{check_csrf, FormToken};
use super::batches::status_of;
use super::pages::{error_page, live_every, upstream_or, urlencode};
use super::view::{cut, when, CELL_CHARS};
use super::Shared;
use crate::waiting::{WaitingAction, WaitingAt, WaitingTopic, MAX_PER_PARTITION};
use kjob::control::JobCancel;

/// Records shown per partition unless `?limit=` says otherwise.
const DEFAULT_LIMIT: usize = 20;

/// `?topic=&group=&limit=`.
#[derive(Deserialize)]
pub(super) struct WaitingQuery {
    topic: String,
    group: String,
    #[serde(default)]
    limit: Option<String>,
}

/// What a row's form needs besides the record: the route, the group and
/// the form token, when actions are allowed.
struct RowForms<'a> {
    main: &'a str,
    group: &'a str,
    csrf: Option<&'a str>,
    /// The group's cancels of waiting jobs in force.
    cancels: Vec<&'a JobCancel>,
}

impl RowForms<'_> {
    /// The cancel of the job `id` due at `due`, if one is in force.
    fn cancel_of(&self, id: Option<&str>, due: Option<i64>) -> Option<&JobCancel> {
        let (id, due) = (id?, due?);
        self.cancels
            .iter()
            .find(|c| c.topic == self.main && c.id == id && c.due_ms == due)
            .copied()
    }
}

fn row_actions(f: &RowForms<'_>, at: &str, cancelled: Option<&JobCancel>, now: i64) -> Markup {
    if let Some(c) = cancelled {
        return html! {
            span.cancelled { (c.action) " by " strong { (c.by) } " " (when(Some(c.at_ms), now)) }
        };
    }
    let Some(csrf) = f.csrf else {
        return html! {};
    };
    html! {
        form.inline.waiting-act method="post" action="/waiting/act" {
            input type="hidden" name="csrf" value=(csrf);
            input type="hidden" name="topic" value=(f.main);
            input type="hidden" name="group" value=(f.group);
            input type="hidden" name="at" value=(at);
            input.reason name="reason" placeholder="reason (to cancel)" size="14";
            button.secondary.now type="submit" name="action" value="now" { "Run now" }
            button.danger.cancel type="submit" name="action" value="cancel" { "Cancel" }
        }
    }
}

fn topic_card(t: &WaitingTopic, now: i64, forms: &RowForms<'_>) -> Markup {
    let shown: usize = t.partitions.iter().map(|p| p.records.len()).sum();
    let waiting = t.waiting();
    html! {
        section.card.waiting data-topic=(t.topic) {
            h2 {
                code { (t.topic) } " "
                small { (t.role.label()) @if let Some(d) = &t.delay { " · " (d) } " · " span.count { (waiting) } " waiting" }
            }
            @if waiting == 0 {
                p.muted.none { "nothing waiting" }
            } @else {
                table.dlq {
                    thead { tr {
                        th.c-at { "partition:offset" } th.c-job { "job" } th.c-key { "key" }
                        th { "job id" } th.c-attempts { "attempt" } th.c-time { "due" } th.c-time { "written" }
                        th.c-act { "act (audited)" }
                    } }
                    tbody {
                        @for p in &t.partitions { @for r in &p.records {
                            @let cancelled = forms.cancel_of(r.headers.id.as_deref(), r.due_ms());
                            tr data-at={(r.partition) ":" (r.offset)} data-id=(r.headers.id.as_deref().unwrap_or_default()) data-cancelled=[cancelled.map(|c| c.action.as_str())] {
                                td.mono { (r.partition) ":" (r.offset) }
                                td { (cut(r.headers.job.as_deref().unwrap_or("-"), CELL_CHARS)) }
                                td.mono.key { (cut(r.key.as_deref().unwrap_or_default(), CELL_CHARS)) }
                                td.mono.id { (cut(r.headers.id.as_deref().unwrap_or("-"), CELL_CHARS)) }
                                td.num { (r.headers.attempt.map_or("-".to_string(), |a| a.to_string())) }
                                td.time.due { (when(r.due_ms(), now)) }
                                td.time { (when(r.timestamp_ms, now)) }
                                td.act { (row_actions(forms, &format!("{}:{}:{}", t.topic, r.partition, r.offset), cancelled, now)) }
                            }
                        } }
                    }
                }
                @if (shown as i64) < waiting {
                    p.muted.more { "the first " (shown) " of " (waiting) " by partition (due first); raise " code { "?limit=" } " to see more" }
                }
            }
        }
    }
}

/// `GET /waiting`: each retry tier and delay topic of the route with what
/// the group has not handled there yet.
pub(super) async fn waiting(
    State(state): State<Shared>,
    Extension(token): Extension<FormToken>,
    Query(q): Query<WaitingQuery>,
) -> Response {
    let limit = match q.limit.as_deref().map(str::trim).filter(|l| !l.is_empty()) {
        None => DEFAULT_LIMIT,
        Some(l) => match l.parse::<usize>() {
            Ok(n) if (1..=MAX_PER_PARTITION).contains(&n) => n,
            _ => {
                return error_page(
                    StatusCode::BAD_REQUEST,
                    &format!("limit `{l}` must be a whole number of records per partition from 1 to {MAX_PER_PARTITION}"),
                )
            }
        },
    };
    let (config, topic, group) = (state.config.clone(), q.topic.clone(), q.group.clone());
    let read = tokio::task::spawn_blocking(move || {
        anyhow::Ok((
            crate::waiting::waiting(&config, &topic, &group, limit)?,
            kjob::control::read_control(&config, &group)?,
        ))
    })
    .await;
    let (topics, control) = match read {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            return error_page(upstream_or(&e, StatusCode::BAD_REQUEST), &format!("{e:#}"));
        }
        Err(e) => {
            return error_page(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("background task: {e}"),
            )
        }
    };
    let now = kjob::clock::now_ms();
    let forms = RowForms {
        main: &q.topic,
        group: &q.group,
        csrf: state.allow_actions.then_some(token.0.as_str()),
        cancels: control.cancels.values().collect(),
    };
    layout(&state, "Waiting", html! {
        h1 { "Waiting in " code { (q.topic) } " · group " code { (q.group) } }
        p.muted { "Retry tiers and delay topics, from the group's committed offsets: at most " (limit) " records per partition, due first. A delayed job is due at its " code { "kjob-run-at" } ", a retry at its " code { "kjob-due-at" } "." }
        @if state.allow_actions {
            p.muted { "Cancel finishes a job without running it; Run now writes a copy to the main topic, for this group only, then cancels this one. The group's workers apply a cancel within about a second; a job already running when it falls due runs anyway." }
        }
        div #waiting data-live=(live_every(&state)) {
            @if topics.is_empty() {
                p.notice.empty { "This route has no retry tier or delay topic yet." }
            }
            @for t in &topics { (topic_card(t, now, &forms)) }
        }
        p { a href={"/route?topic=" (urlencode(&q.topic)) "&group=" (urlencode(&q.group))} { "Back to the route" } }
    }).into_response()
}

/// The waiting page's row form.
#[derive(Deserialize)]
pub(super) struct ActForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    topic: String,
    #[serde(default)]
    group: String,
    #[serde(default)]
    at: String,
    #[serde(default)]
    action: String,
    #[serde(default)]
    reason: String,
}

/// `POST /waiting/act`: `action=cancel` (a reason required, 400 without)
/// or `action=now`; 409 when the record no longer waits or was already
/// cancelled.
pub(super) async fn act(
    State(state): State<Shared>,
    Extension(token): Extension<FormToken>,
    Extension(Actor(by)): Extension<Actor>,
    Form(f): Form<ActForm>,
) -> Response {
    if let Err(r) = check_csrf(&token, &f.csrf) {
        return r.into_response();
    }
    if f.topic.trim().is_empty() || f.group.trim().is_empty() {
        return error_page(StatusCode::BAD_REQUEST, "name the route's topic and group");
    }
    let at: WaitingAt = match f.at.parse() {
        Ok(at) => at,
        Err(e) => return error_page(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let action = match f.action.as_str() {
        "cancel" => WaitingAction::Cancel {
            reason: f.reason.trim().to_string(),
        },
        "now" => WaitingAction::Now,
        other => {
            return error_page(
                StatusCode::BAD_REQUEST,
                &format!("unknown action `{other}`: cancel or now"),
            )
        }
    };
    let done = match crate::waiting::act(&state.config, &f.group, &f.topic, &at, &by, action, true)
        .await
    {
        Ok(done) => done,
        Err(e) => return error_page(status_of(&e), &format!("{e:#}")),
    };
    let back = format!(
        "/waiting?topic={}&group={}",
        urlencode(&f.topic),
        urlencode(&f.group)
    );
    layout(&state, "Waiting job", html! {
        h1 { "Job " code { (cut(&done.id, CELL_CHARS)) } " " (done.audit.action) }
        p.notice.done {
            (done.audit.action) " job " code { (done.id) } " (" (done.job.as_deref().unwrap_or("-")) ", due " (when(Some(done.due_ms), kjob::clock::now_ms())) ") at " code { (at.to_string()) } " as " strong { (by) } ". "
            @if let Some(copy) = &done.copy { "The copy due now is at " code { (copy) } ". " }
            "Every worker of group " code { (f.group) } " skips the waiting record from within about a second."
        }
        p { a href=(back) { "Back to what waits" } " · " a href="/" { "Overview" } }
    })
    .into_response()
}
