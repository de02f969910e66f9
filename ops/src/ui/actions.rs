//! The mutating actions, only with `--allow-actions`: re-drive (dry-run
//! preview first, then a cancellable background task with progress) and
//! resolve (a reason is required). Both go through the CLI's own
//! functions, so they are audited in `<topic>.dlq.audit` exactly as
//! `kjob dlq retry` and `kjob dlq resolve` audit.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use maud::{html, Markup};
use serde::Deserialize;

use crate::dlq::store::Coordinates;

use super::actor::Actor;
use super::assets::layout;
use super::auth::{check_csrf, FormToken};
use super::pages::{error_page, upstream_or, urlencode, Refusal};
use super::view::{cut, prose, when, CELL_CHARS};
use super::{AppState, Shared};
use crate::dlq::index::Query;
use crate::dlq::store::{AuditEntry, DeadLetter};
use crate::dlq::{
    empty_as_none, execute_redrive, execute_resolve, fetch, plan_redrive_of, ResolvePlan, Select,
    Target,
};

/// Re-drives at most this many records per second unless the form says less.
const DEFAULT_RATE: u32 = 100;

/// A re-drive running in the background.
pub(super) struct Task {
    /// Where the records go, for the page's heading.
    target: String,
    /// The route's DLQ, for the link back.
    topic: String,
    total: usize,
    done: AtomicUsize,
    cancel: AtomicBool,
    outcome: Mutex<Option<Result<String, String>>>,
}

fn hidden_select(select: &Select, search: Option<&str>, at: Option<Coordinates>) -> Markup {
    let opt = |v: &Option<String>| v.clone().unwrap_or_default();
    html! {
        @if let Some(q) = search { input type="hidden" name="q" value=(q); }
        input type="hidden" name="topic" value=(select.topic);
        input type="hidden" name="job" value=(opt(&select.job));
        input type="hidden" name="class" value=(opt(&select.class));
        input type="hidden" name="since" value=(opt(&select.since));
        input type="hidden" name="until" value=(opt(&select.until));
        @if let Some(at) = at { input type="hidden" name="at" value=(at.to_string()); }
    }
}

/// The re-drive form (a dry-run preview comes first), with the anti-CSRF
/// token of the session that loads the page.
pub(super) fn redrive_form(
    token: &FormToken,
    select: &Select,
    search: Option<&str>,
    at: Option<Coordinates>,
) -> Markup {
    html! {
        form.inline.redrive method="post" action="/dlq/redrive" {
            input type="hidden" name="csrf" value=(token.0);
            (hidden_select(select, search, at))
            label { "to" select name="to" {
                option value="retry" { "first retry tier" }
                option value="main" { "main topic" }
            } }
            label { "rate (records/s)" input type="number" name="rate" min="1" value=(DEFAULT_RATE); }
            button #redrive-preview type="submit" { "Preview re-drive" }
        }
    }
}

/// The resolve form; the browser and the server both require a reason.
pub(super) fn resolve_form(
    token: &FormToken,
    select: &Select,
    search: Option<&str>,
    at: Option<Coordinates>,
) -> Markup {
    html! {
        form.inline.resolve method="post" action="/dlq/resolve" {
            input type="hidden" name="csrf" value=(token.0);
            (hidden_select(select, search, at))
            label { "reason (required, audited)" input #reason name="reason" required size="40"; }
            button.danger #resolve type="submit" { "Resolve" }
        }
    }
}

/// The fields both actions post.
#[derive(Deserialize)]
pub(super) struct ActionForm {
    #[serde(default)]
    csrf: String,
    /// The DLQ and the filters, as `kjob dlq` takes them.
    #[serde(flatten)]
    select: Select,
    /// Coordinates, comma-separated (the detail page's one record, or the
    /// checked rows: the form's repeated `at` fields are joined).
    #[serde(default, deserialize_with = "empty_as_none")]
    at: Option<String>,
    /// The DLQ page's search, for "everything matching".
    #[serde(default, deserialize_with = "empty_as_none")]
    q: Option<String>,
    #[serde(default)]
    to: Target,
    #[serde(default, deserialize_with = "empty_as_none")]
    rate: Option<String>,
    #[serde(default)]
    execute: Option<String>,
    #[serde(default)]
    reason: String,
}

impl ActionForm {
    /// The form from its fields, repeated `at` fields (one per checked row)
    /// joined into one list; any other repeated field keeps its last value.
    fn parse(pairs: Vec<(String, String)>) -> Result<Self, Refusal> {
        let mut fields = serde_json::Map::new();
        let mut at: Vec<String> = Vec::new();
        for (k, v) in pairs {
            if k == "at" {
                at.extend(
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_string),
                );
            } else {
                fields.insert(k, serde_json::Value::String(v));
            }
        }
        if !at.is_empty() {
            fields.insert("at".into(), serde_json::Value::String(at.join(",")));
        }
        serde_json::from_value(serde_json::Value::Object(fields)).map_err(|e| {
            Refusal(
                StatusCode::BAD_REQUEST,
                format!("the form does not parse: {e}"),
            )
        })
    }
    /// The index query of "everything matching": the form's filters and
    /// search.
    fn query(&self) -> Result<Query, Refusal> {
        let filter = self
            .select
            .filter()
            .map_err(|e| Refusal(StatusCode::BAD_REQUEST, format!("{e:#}")))?;
        Ok(Query {
            filter,
            search: self.q.clone(),
            ..Default::default()
        })
    }
    fn at(&self) -> Result<Vec<Coordinates>, Refusal> {
        self.at
            .iter()
            .flat_map(|s| s.split(','))
            .map(|c| {
                c.trim()
                    .parse()
                    .map_err(|e: kjob::Error| Refusal(StatusCode::BAD_REQUEST, e.to_string()))
            })
            .collect()
    }
    fn rate(&self) -> Result<u32, Refusal> {
        match &self.rate {
            None => Ok(DEFAULT_RATE),
            Some(r) => r.parse::<u32>().ok().filter(|r| *r >= 1).ok_or_else(|| {
                Refusal(
                    StatusCode::BAD_REQUEST,
                    format!("rate `{r}` must be a whole number of records per second, at least 1"),
                )
            }),
        }
    }
}

/// The unresolved dead letters an action applies to, picked through the
/// dashboard's index: the named coordinates (each must be held and
/// unresolved), or everything matching the form's filters and search. The
/// records themselves are then read by their coordinates. Refused while
/// the index is still reading the DLQ, since "everything" would then be
/// only part of it.
async fn picked(state: &AppState, f: &ActionForm) -> Result<(String, Vec<DeadLetter>), Response> {
    let index = state
        .dlq_index(&f.select.topic)
        .await
        .map_err(|e| error_page(upstream_or(&e, StatusCode::NOT_FOUND), &format!("{e:#}")))?;
    if !index.wait_caught_up(super::FIRST_READ_WAIT).await {
        let progress = index.progress();
        return Err(error_page(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!(
                "the dashboard is still indexing this DLQ ({} of {} records read); try again in a moment",
                progress.read, progress.stored
            ),
        ));
    }
    let mut at = f.at().map_err(IntoResponse::into_response)?;
    if at.is_empty() {
        at = index.matching_unresolved(&f.query().map_err(IntoResponse::into_response)?);
    } else {
        index
            .check_unresolved(&at)
            .map_err(|why| error_page(StatusCode::BAD_REQUEST, &why))?;
    }
    let main = index.main_topic().to_string();
    let letters = fetch(&state.config, &main, &at)
        .await
        .map_err(|e| error_page(upstream_or(&e, StatusCode::NOT_FOUND), &format!("{e:#}")))?;
    Ok((main, letters))
}

/// Rows a re-drive preview lists; the count covers all of them.
const PREVIEW_ROWS: usize = 200;

/// The dry run of a re-drive: what would move, what is held back and why,
/// and the button that executes it with the same selection.
fn redrive_preview(
    state: &Shared,
    token: &FormToken,
    f: &ActionForm,
    plan: &crate::dlq::RedrivePlan,
    rate: u32,
) -> Response {
    let now = kjob::clock::now_ms();
    let to = match f.to {
        Target::Retry => "retry",
        Target::Main => "main",
    };
    layout(state, "Re-drive preview", html! {
        h1 { "Re-drive preview (dry run)" }
        p.notice.preview {
            (plan.picked.len()) " record(s) would be re-driven to " code { (plan.target_topic) }
            " at most " (rate) " per second."
        }
        table.dlq {
            thead { tr { th.c-at { "partition:offset" } th.c-job { "job" } th.c-key { "key" } th.c-class { "error class" } th.c-time { "failed at" } } }
            tbody { @for d in plan.picked.iter().take(PREVIEW_ROWS) { tr {
                td.mono { (d.at) } td { (cut(d.headers.job.as_deref().unwrap_or_default(), CELL_CHARS)) }
                td.mono.key { (cut(d.key.as_deref().unwrap_or_default(), CELL_CHARS)) }
                td { (cut(d.headers.error_class.as_deref().unwrap_or_default(), CELL_CHARS)) }
                td.time { (when(d.timestamp_ms, now)) }
            } } }
        }
        @if plan.picked.len() > PREVIEW_ROWS {
            p.muted { "… and " (plan.picked.len() - PREVIEW_ROWS) " more" }
        }
        @if !plan.held.is_empty() {
            p.notice.held #redrive-held {
                (plan.held.len()) " record(s) held back, left in place: "
                (plan.checked_against.as_deref().unwrap_or("the reader")) " cannot read them, so a re-drive would send them straight back."
            }
            table.dlq {
                thead { tr { th.c-at { "partition:offset" } th.c-job { "job" } th { "why it is held back" } } }
                tbody { @for h in plan.held.iter().take(PREVIEW_ROWS) { tr {
                    td.mono { (h.letter.at) } td { (cut(h.letter.headers.job.as_deref().unwrap_or_default(), CELL_CHARS)) }
                    td { (cut(&h.reason, 400)) }
                } } }
            }
        }
        @if !plan.picked.is_empty() {
            form.inline method="post" action="/dlq/redrive" {
                input type="hidden" name="csrf" value=(token.0);
                (hidden_select(&f.select, f.q.as_deref(), None))
                @if let Some(a) = &f.at { input type="hidden" name="at" value=(a); }
                input type="hidden" name="to" value=(to);
                input type="hidden" name="rate" value=(rate);
                input type="hidden" name="execute" value="1";
                button #redrive-execute type="submit" { "Re-drive " (plan.picked.len()) " record(s)" }
            }
        }
        p { a href={"/dlq?topic=" (urlencode(&f.select.topic))} { "Back to the dead letters" } }
    }).into_response()
}

/// `POST /dlq/redrive`: without `execute` the dry-run preview, with it a
/// background task and a redirect to its progress page.
pub(super) async fn redrive(
    State(state): State<Shared>,
    Extension(token): Extension<FormToken>,
    Extension(Actor(by)): Extension<Actor>,
    Form(pairs): Form<Vec<(String, String)>>,
) -> Response {
    let f = match ActionForm::parse(pairs) {
        Ok(f) => f,
        Err(r) => return r.into_response(),
    };
    if let Err(r) = check_csrf(&token, &f.csrf) {
        return r.into_response();
    }
    let rate = match f.rate() {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let (main, letters) = match picked(&state, &f).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let live = crate::dlq::precheck::Reader::Live;
    let plan = match plan_redrive_of(&state.config, main, letters, f.to, &live).await {
        Ok(p) => p,
        Err(e) => return error_page(upstream_or(&e, StatusCode::BAD_REQUEST), &format!("{e:#}")),
    };
    if f.execute.is_none() {
        return redrive_preview(&state, &token, &f, &plan, rate);
    }
    if plan.picked.is_empty() {
        let why = match plan.held.first() {
            Some(h) => format!(
                "nothing to re-drive: the {} matching record(s) are held back ({})",
                plan.held.len(),
                h.reason
            ),
            None => "nothing to re-drive: no unresolved dead letter matches".into(),
        };
        return error_page(StatusCode::BAD_REQUEST, &why);
    }
    let task = Arc::new(Task {
        target: plan.target_topic.clone(),
        topic: f.select.topic.clone(),
        total: plan.picked.len(),
        done: AtomicUsize::new(0),
        cancel: AtomicBool::new(false),
        outcome: Mutex::new(None),
    });
    let id = match state.tasks.lock() {
        Ok(mut tasks) => {
            let id = tasks.len() as u64 + 1;
            tasks.insert(id, task.clone());
            id
        }
        Err(_) => return error_page(StatusCode::INTERNAL_SERVER_ERROR, "task registry poisoned"),
    };
    let config = state.config.clone();
    let index = state.dlq_index(&f.select.topic).await.ok();
    tokio::spawn(async move {
        let t = task.clone();
        let result = execute_redrive(
            &config,
            &plan,
            rate,
            &by,
            |n| t.done.store(n, Ordering::SeqCst),
            &task.cancel,
        )
        .await;
        // What was re-driven shows as such at once (see `resolve`).
        if let (Ok(n), Some(index)) = (&result, &index) {
            let entry = AuditEntry {
                action: "retried".into(),
                by: by.clone(),
                at_ms: kjob::clock::now_ms(),
                reason: None,
                target: Some(plan.target_topic.clone()),
            };
            index.audit(
                plan.picked
                    .iter()
                    .take(*n)
                    .map(|d| (d.at, Some(entry.clone())))
                    .collect(),
            );
        }
        let outcome = match result {
            Ok(n) if n < plan.picked.len() => Ok(format!(
                "cancelled after {n} of {} record(s)",
                plan.picked.len()
            )),
            Ok(n) => Ok(format!("re-drove {n} record(s) to {}", plan.target_topic)),
            Err(e) => Err(format!("{e:#}")),
        };
        if let Ok(mut o) = task.outcome.lock() {
            *o = Some(outcome);
        }
    });
    Redirect::to(&format!("/tasks/{id}")).into_response()
}

/// `POST /dlq/resolve`: resolves with the required reason, audited.
pub(super) async fn resolve(
    State(state): State<Shared>,
    Extension(token): Extension<FormToken>,
    Extension(Actor(by)): Extension<Actor>,
    Form(pairs): Form<Vec<(String, String)>>,
) -> Response {
    let f = match ActionForm::parse(pairs) {
        Ok(f) => f,
        Err(r) => return r.into_response(),
    };
    if let Err(r) = check_csrf(&token, &f.csrf) {
        return r.into_response();
    }
    if f.reason.trim().is_empty() {
        return error_page(
            StatusCode::BAD_REQUEST,
            "a resolve needs a reason: say why the records need no re-drive (it is kept in the audit log)",
        );
    }
    let no_filter = f.select.job.is_none()
        && f.select.class.is_none()
        && f.select.since.is_none()
        && f.select.until.is_none()
        && f.q.is_none();
    if f.at.is_none() && no_filter {
        return error_page(
            StatusCode::BAD_REQUEST,
            "name the records (check their rows) or give a filter or a search: a resolve of a whole DLQ is not taken from the dashboard",
        );
    }
    let (main, letters) = match picked(&state, &f).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let plan = ResolvePlan {
        dlq: kjob::topics::dlq_topic(&main),
        main,
        matched: letters.len(),
        picked: letters,
    };
    let done = execute_resolve(&state.config, &plan, &f.reason, &by).await;
    if done.is_ok() {
        // The page after this one shows the resolve at once; the tailer
        // applies the same entries again when it reads them (idempotent).
        if let Ok(index) = state.dlq_index(&f.select.topic).await {
            let entry = AuditEntry {
                action: "resolved".into(),
                by: by.clone(),
                at_ms: kjob::clock::now_ms(),
                reason: Some(f.reason.clone()),
                target: None,
            };
            index.audit(
                plan.picked
                    .iter()
                    .map(|d| (d.at, Some(entry.clone())))
                    .collect(),
            );
        }
    }
    match done.map(|n| (plan.dlq.clone(), n)) {
        Ok((dlq, n)) => layout(
            &state,
            "Resolved",
            html! {
                h1 { "Resolved" }
                p.notice.resolved { "resolved " (n) " record(s) in " code { (dlq) } }
                p { a href={"/dlq?topic=" (urlencode(&f.select.topic))} { "Back to the dead letters" } }
            },
        )
        .into_response(),
        Err(e) => error_page(upstream_or(&e, StatusCode::BAD_REQUEST), &format!("{e:#}")),
    }
}

fn find(state: &AppState, id: u64) -> Option<Arc<Task>> {
    state.tasks.lock().ok()?.get(&id).cloned()
}

/// `GET /tasks/{id}`: progress, outcome and a cancel button.
pub(super) async fn task_page(
    State(state): State<Shared>,
    Extension(token): Extension<FormToken>,
    Path(id): Path<u64>,
) -> Response {
    let Some(t) = find(&state, id) else {
        return error_page(
            StatusCode::NOT_FOUND,
            &format!("no task {id} (tasks live as long as the dashboard process)"),
        );
    };
    let done = t.done.load(Ordering::SeqCst);
    let outcome = t.outcome.lock().ok().and_then(|o| o.clone());
    layout(&state, "Re-drive", html! {
        h1 { "Re-drive of " (t.total) " record(s) to " code { (t.target) } }
        div #task data-live="1" data-state=(match &outcome { None => "running", Some(Ok(_)) => "finished", Some(Err(_)) => "failed" }) {
            progress max=(t.total) value=(done) {}
            p.progress { span.done { (done) } " / " (t.total) " done" }
            @match &outcome {
                None => {
                    @if t.cancel.load(Ordering::SeqCst) { p.muted { "cancelling…" } }
                    form method="post" action={"/tasks/" (id) "/cancel"} {
                        input type="hidden" name="csrf" value=(token.0);
                        button.danger #cancel type="submit" { "Cancel" }
                    }
                }
                Some(Ok(msg)) => p.notice.outcome { (msg) },
                Some(Err(msg)) => div.error.outcome { (prose(msg)) },
            }
        }
        p { a href={"/dlq?topic=" (urlencode(&t.topic)) "&all=on"} { "Back to the dead letters" } }
    }).into_response()
}

/// The cancel form's field.
#[derive(Deserialize)]
pub(super) struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

/// `POST /tasks/{id}/cancel`: stops before the next record.
pub(super) async fn cancel(
    State(state): State<Shared>,
    Extension(token): Extension<FormToken>,
    Path(id): Path<u64>,
    Form(f): Form<CsrfForm>,
) -> Response {
    if let Err(r) = check_csrf(&token, &f.csrf) {
        return r.into_response();
    }
    match find(&state, id) {
        Some(t) => {
            t.cancel.store(true, Ordering::SeqCst);
            Redirect::to(&format!("/tasks/{id}")).into_response()
        }
        None => error_page(StatusCode::NOT_FOUND, &format!("no task {id}")),
    }
}
