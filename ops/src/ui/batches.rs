//! The batches pages: every batch of a batch topic with a progress bar
//! (succeeded and dead-lettered out of the total), one batch in full, and
//! its cancellation.
//!
//! The numbers are the coordinators' snapshots on the state topic, read by
//! [`crate::batches::list`], the function behind `kjob batches list`, so
//! the page and the terminal cannot disagree; a snapshot trails its batch
//! by at most half a second. The cancel button runs
//! [`crate::batches::cancel`], as `kjob batches cancel --execute` does: the
//! `cancelled` event it writes names the actor and the reason, and is the
//! batch's audit record (shown on the detail page once applied).

use axum::extract::{Extension, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Form;
use maud::{html, Markup};
use serde::Deserialize;

use kjob::batch::{BatchState, DEFAULT_TOPIC};

use super::actor::Actor;
use super::assets::layout;
use super::auth::{check_csrf, FormToken};
use super::pages::{error_page, live_every, upstream_or, urlencode};
use super::view::{cut, when, CELL_CHARS};
use super::Shared;
use crate::problem::{kind_of, Kind};

/// `?topic=` (the workers' `batches_on`; `kjob.batches` when absent).
#[derive(Deserialize)]
pub(super) struct ListQuery {
    #[serde(default)]
    topic: Option<String>,
}

/// `?topic=&batch=`.
#[derive(Deserialize)]
pub(super) struct ShowQuery {
    #[serde(default)]
    topic: Option<String>,
    batch: String,
}

/// The batch topic a request names, the default one when it names none.
fn topic_of(topic: &Option<String>) -> String {
    topic
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .unwrap_or(DEFAULT_TOPIC)
        .to_string()
}

/// The status code of a failed batch call: the request was wrong (400),
/// names no batch (404), was refused as the batch stands (409), Kafka did
/// not answer (502).
pub(super) fn status_of(e: &anyhow::Error) -> StatusCode {
    match kind_of(e) {
        Kind::Usage => StatusCode::BAD_REQUEST,
        Kind::NotFound => StatusCode::NOT_FOUND,
        Kind::Refused => StatusCode::CONFLICT,
        Kind::Unreachable => StatusCode::BAD_GATEWAY,
        Kind::Failed => upstream_or(e, StatusCode::INTERNAL_SERVER_ERROR),
    }
}

/// Every batch of `topic`, off the async runtime (the read blocks).
async fn read(state: &Shared, topic: &str) -> Result<Vec<BatchState>, Response> {
    let (config, t) = (state.config.clone(), topic.to_string());
    match tokio::task::spawn_blocking(move || crate::batches::list(&config, &t)).await {
        Ok(Ok(all)) => Ok(all),
        Ok(Err(e)) => Err(error_page(status_of(&e), &format!("{e:#}"))),
        Err(e) => Err(error_page(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("background task: {e}"),
        )),
    }
}

/// Open and running batches first (they are what an operator looks for),
/// each group newest first as `list` returns them.
fn open_first(all: &mut [BatchState]) {
    all.sort_by_key(|b| !b.is_open());
}

/// Percent of `part` in `whole`, one decimal, for a bar segment's width.
fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0".into();
    }
    format!("{:.1}", 100.0 * part.min(whole) as f64 / whole as f64)
}

/// The progress bar: succeeded (green) then dead-lettered (red) out of the
/// total, with the numbers as text beside it. An open batch's total is what
/// was enqueued so far (its seal fixes it), which the text says.
fn progress(b: &BatchState) -> Markup {
    let finished = b.finished();
    html! {
        div.batch-progress {
            div.bar role="progressbar" aria-valuemin="0" aria-valuemax=(b.total) aria-valuenow=(finished)
                title={(b.succeeded) " succeeded, " (b.dead_lettered) " dead-lettered of " (b.total)} {
                span.seg.succeeded style={"width:" (percent(b.succeeded, b.total)) "%"} {}
                span.seg.dead style={"width:" (percent(b.dead_lettered, b.total)) "%"} {}
            }
            span.counts {
                span.finished { (finished) " / " (b.total) }
                @if b.sealed_ms.is_none() { " " span.muted { "(so far)" } }
                " · " span.ok { (b.succeeded) " ok" }
                @if b.dead_lettered > 0 { " · " span.bad { (b.dead_lettered) " dead-lettered" } }
            }
        }
    }
}

/// Each callback with whether it fired (and when), or why it will not.
fn callbacks(b: &BatchState, now: i64) -> Markup {
    html! {
        @if b.callbacks.is_empty() { span.muted { "none" } }
        @for c in &b.callbacks {
            div.callback data-when=(c.when.as_str()) {
                code { (c.when.as_str()) } " " (cut(&c.job, CELL_CHARS)) ": "
                @match b.fired.iter().find(|(w, _)| *w == c.when) {
                    Some((_, at)) => span.fired { "fired " (when(Some(*at), now)) },
                    None if b.cancelled.is_some() => span.never { "never (cancelled)" },
                    None => span.waiting { "waiting" },
                }
            }
        }
    }
}

fn show_href(topic: &str, batch: &str) -> String {
    format!(
        "/batches/show?topic={}&batch={}",
        urlencode(topic),
        urlencode(batch)
    )
}

/// `GET /batches`: one row per batch, open ones first.
pub(super) async fn list(State(state): State<Shared>, Query(q): Query<ListQuery>) -> Response {
    let topic = topic_of(&q.topic);
    let mut all = match read(&state, &topic).await {
        Ok(all) => all,
        Err(r) => return r,
    };
    open_first(&mut all);
    let now = kjob::clock::now_ms();
    let open = all.iter().filter(|b| b.is_open()).count();
    layout(&state, "Batches", html! {
        h1 { "Batches on " code { (topic) } }
        form.inline method="get" action="/batches" {
            label { "batch topic" input name="topic" value=(topic) size="40"; }
            button.secondary type="submit" { "Show" }
        }
        div #batches data-live=(live_every(&state)) {
            @if all.is_empty() {
                p.notice.empty { "No batches recorded on " code { (kjob::batch::state_topic(&topic)) } " (workers keep it with " code { "batches_on(\"" (topic) "\")" } ")." }
            } @else {
                p.muted.summary { (open) " open or running, " (all.len()) " in all" }
                table.batches {
                    thead { tr { th { "batch" } th { "status" } th.c-progress { "progress" } th { "opened" } th { "callbacks" } } }
                    tbody {
                        @for b in &all {
                            tr data-batch=(b.batch) data-status=(b.status().as_str()) {
                                td.mono { a href=(show_href(&topic, &b.batch)) { (cut(&b.batch, CELL_CHARS)) } }
                                td { span.status class=(b.status().as_str()) { (b.status().as_str()) } }
                                td { (progress(b)) }
                                td.time { (when(b.opened_ms, now)) }
                                td { (callbacks(b, now)) }
                            }
                        }
                    }
                }
            }
        }
    }).into_response()
}

/// `GET /batches/show`: one batch in full, with the cancel form while it
/// is open or running and actions are allowed.
pub(super) async fn show(
    State(state): State<Shared>,
    Extension(token): Extension<FormToken>,
    Query(q): Query<ShowQuery>,
) -> Response {
    let topic = topic_of(&q.topic);
    let (config, t, id) = (state.config.clone(), topic.clone(), q.batch.clone());
    let b = match tokio::task::spawn_blocking(move || crate::batches::show(&config, &t, &id)).await
    {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return error_page(status_of(&e), &format!("{e:#}")),
        Err(e) => {
            return error_page(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("background task: {e}"),
            )
        }
    };
    let now = kjob::clock::now_ms();
    let back = format!("/batches?topic={}", urlencode(&topic));
    layout(&state, "Batch", html! {
        h1 { "Batch " code { (cut(&b.batch, CELL_CHARS)) } }
        div #batch data-live=(live_every(&state)) {
            section.card {
                p { "status " span.status class=(b.status().as_str()) { (b.status().as_str()) } }
                (progress(&b))
                table.headers {
                    tbody {
                        tr { td { "batch id" } td.mono.whole { (b.batch) } }
                        tr { td { "batch topic, partition" } td.mono { (topic) " / " (b.partition) } }
                        tr { td { "opened" } td { (when(b.opened_ms, now)) } }
                        tr { td { "opened by" } td.mono { (b.opened_by.as_deref().unwrap_or("-")) } }
                        tr { td { "sealed" } td { @if b.sealed_ms.is_some() { (when(b.sealed_ms, now)) } @else { "not yet: jobs may still be added" } } }
                        tr { td { "jobs" } td { (b.total) } }
                        tr { td { "succeeded" } td { (b.succeeded) } }
                        tr { td { "dead-lettered" } td { (b.dead_lettered) } }
                        @if b.late > 0 { tr { td { "enqueued after the seal (not counted)" } td { (b.late) } } }
                        tr { td { "complete" } td { (when(b.completed_ms, now)) } }
                        tr { td { "last change" } td { (when(Some(b.updated_ms), now)) } }
                    }
                }
            }
            section.card {
                h2 { "Callbacks" }
                @if b.callbacks.is_empty() { p.muted { "none" } } @else {
                    table {
                        thead { tr { th { "when" } th { "job" } th { "topic" } th { "key" } th { "fired" } } }
                        tbody { @for c in &b.callbacks { tr {
                            td { code { (c.when.as_str()) } }
                            td.mono { (cut(&c.job, CELL_CHARS)) " v" (c.version) }
                            td.mono { (cut(&c.topic, CELL_CHARS)) }
                            td.mono { (cut(&c.key, CELL_CHARS)) }
                            td { @match b.fired.iter().find(|(w, _)| *w == c.when) {
                                Some((_, at)) => (when(Some(*at), now)),
                                None if b.cancelled.is_some() => "never (cancelled)",
                                None => "not yet",
                            } }
                        } } }
                    }
                }
            }
            @if let Some(c) = &b.cancelled {
                section.card.cancelled {
                    h2 { "Cancelled" }
                    p { "by " strong.by { (c.by) } " " (when(Some(c.at_ms), now)) }
                    p.reason { (c.reason) }
                }
            }
        }
        @if b.is_open() && state.allow_actions {
            section.card {
                h2 { "Cancel" }
                p.muted { "No callback fires for a cancelled batch; its finished jobs stay finished, and jobs still running keep being counted." }
                form.inline.cancel-batch method="post" action="/batches/cancel" {
                    input type="hidden" name="csrf" value=(token.0);
                    input type="hidden" name="topic" value=(topic);
                    input type="hidden" name="batch" value=(b.batch);
                    label { "reason (required, recorded with the batch)" input #cancel-reason name="reason" required size="40"; }
                    button.danger #cancel-batch type="submit" { "Cancel batch" }
                }
            }
        }
        p { a href=(back) { "Back to the batches" } }
    }).into_response()
}

/// The cancel form.
#[derive(Deserialize)]
pub(super) struct CancelForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    topic: Option<String>,
    #[serde(default)]
    batch: String,
    #[serde(default)]
    reason: String,
}

/// `POST /batches/cancel`: the CLI's cancel (read-only dashboards never
/// get here: the guard answers their POSTs with 403), recorded with the
/// request's actor and the required reason.
pub(super) async fn cancel(
    State(state): State<Shared>,
    Extension(token): Extension<FormToken>,
    Extension(Actor(by)): Extension<Actor>,
    Form(f): Form<CancelForm>,
) -> Response {
    if let Err(r) = check_csrf(&token, &f.csrf) {
        return r.into_response();
    }
    let reason = f.reason.trim();
    if reason.is_empty() {
        return error_page(
            StatusCode::BAD_REQUEST,
            "a cancel needs a reason: say why this batch will never be finished (it is kept with the batch)",
        );
    }
    if f.batch.is_empty() {
        return error_page(StatusCode::BAD_REQUEST, "name the batch to cancel");
    }
    let topic = topic_of(&f.topic);
    match crate::batches::cancel(&state.config, &topic, &f.batch, &by, reason).await {
        Ok(before) => layout(&state, "Batch cancelled", html! {
            h1 { "Batch cancelled" }
            p.notice.cancelled {
                "cancelled batch " code { (f.batch) } " (it was " (before.status().as_str()) ", "
                (before.finished()) " of " (before.total) " finished) as " strong { (by) } ". "
                "Its coordinator applies the cancel within a second; no callback fires."
            }
            p { a href=(show_href(&topic, &f.batch)) { "The batch" } " · " a href={"/batches?topic=" (urlencode(&topic))} { "All batches" } }
        }).into_response(),
        Err(e) => error_page(status_of(&e), &format!("{e:#}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kjob::batch::{Callback, Cancel, Status, When};

    fn batch(id: &str, total: u64, ok: u64, dead: u64) -> BatchState {
        let mut b = BatchState::new(id, 0);
        b.total = total;
        b.succeeded = ok;
        b.dead_lettered = dead;
        b.opened_ms = Some(1_796_055_412_036);
        b
    }

    #[test]
    fn the_bar_shows_succeeded_then_dead_lettered_of_the_total() {
        let html = progress(&batch("b", 200, 150, 10)).into_string();
        assert!(html.contains("succeeded\" style=\"width:75.0%\""), "{html}");
        // Both segments are shares of the whole bar, side by side: 80% of
        // it is filled.
        assert!(html.contains("dead\" style=\"width:5.0%\""), "{html}");
        assert!(html.contains("160 / 200"), "{html}");
        assert!(html.contains("(so far)"), "an unsealed total: {html}");
        let empty = progress(&batch("e", 0, 0, 0)).into_string();
        assert!(empty.contains("width:0%"), "{empty}");
    }

    #[test]
    fn open_batches_come_first_and_keep_their_order() {
        let mut done = batch("done", 1, 1, 0);
        done.completed_ms = Some(1);
        let mut gone = batch("gone", 1, 0, 0);
        gone.cancelled = Some(Cancel {
            at_ms: 1,
            by: "x".into(),
            reason: "y".into(),
        });
        let mut all = vec![done, batch("a", 2, 0, 0), gone, batch("b", 2, 1, 0)];
        open_first(&mut all);
        let ids: Vec<&str> = all.iter().map(|b| b.batch.as_str()).collect();
        assert_eq!(ids, ["a", "b", "done", "gone"]);
        assert_eq!(all[3].status(), Status::Cancelled);
    }

    #[test]
    fn callbacks_say_whether_they_fired_and_escape_their_names() {
        let mut b = batch("b", 1, 1, 0);
        b.callbacks = vec![
            Callback {
                when: When::Complete,
                topic: "t".into(),
                job: "<script>x()</script>".into(),
                version: 1,
                key: "k".into(),
                payload: Vec::new(),
            },
            Callback {
                when: When::Success,
                topic: "t".into(),
                job: "ok".into(),
                version: 1,
                key: "k".into(),
                payload: Vec::new(),
            },
        ];
        b.fired = vec![(When::Complete, 1_796_055_412_036)];
        let html = callbacks(&b, 1_796_055_412_036).into_string();
        assert!(!html.contains("<script>"), "{html}");
        assert!(html.contains("&lt;script&gt;"), "{html}");
        assert!(html.contains("class=\"fired\""), "{html}");
        assert!(html.contains("class=\"waiting\""), "{html}");
        b.cancelled = Some(Cancel {
            at_ms: 1,
            by: "x".into(),
            reason: "y".into(),
        });
        assert!(callbacks(&b, 0).into_string().contains("never (cancelled)"));
    }
}
