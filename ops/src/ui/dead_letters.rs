//! The DLQ browser, paged from the dashboard's index of the DLQ (the
//! filters of `kjob dlq list`, plus search, sort and counts), and one dead
//! letter in full as `kjob dlq show` reads it (by its coordinates); the
//! action forms appear only with `--allow-actions`.

use axum::extract::{Extension, Query as Params, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};
use serde::Deserialize;

use crate::dlq::store::Coordinates;

use super::actions::{redrive_form, resolve_form};
use super::actor::Actor;
use super::assets::layout;
use super::auth::FormToken;
use super::dlq_query::DlqQuery;
use super::pages::{error_page, upstream_or, urlencode};
use super::view::{cut, header_time, prose, when, CELL_CHARS, ERROR_CHARS};
use super::Shared;
use crate::dlq::index::{Row, Sort};
use crate::dlq::Select;

/// `GET /dlq`: the DLQ of one route from the dashboard's index: the counts
/// per error class and per job first, then one page of dead letters,
/// sorted and searched, with a checkbox per unresolved row and the
/// actions. Values are cut to their column (the detail page has them
/// whole), so one huge key cannot push the other columns off the screen.
pub(super) async fn dlq_list(
    State(state): State<Shared>,
    Extension(token): Extension<FormToken>,
    Extension(Actor(actor)): Extension<Actor>,
    Params(q): Params<DlqQuery>,
) -> Response {
    if q.select.topic.trim().is_empty() {
        return dlq_index_of_routes(&state);
    }
    let select = &q.select;
    let topic = select.topic.clone();
    let index = state.dlq_index(&topic).await;
    if let Ok(i) = &index {
        i.wait_caught_up(super::FIRST_READ_WAIT).await;
    }
    let page = index.as_ref().map_err(|e| format!("{e:#}")).and_then(|i| {
        let query = q.index_query().map_err(|e| format!("{e:#}"))?;
        Ok((i.query(&query), i.progress(), query))
    });
    let now = kjob::clock::now_ms();
    let actions = state.allow_actions;
    layout(&state, "Dead letters", html! {
        h1 { "Dead letters of " code { (topic) } }
        @match &page {
            Err(e) => div.error { (prose(e)) },
            Ok((p, progress, query)) => {
                @if !progress.caught_up {
                    div.notice #indexing data-live="2" {
                        "Indexing this DLQ: " (progress.read) " of " (progress.stored) " record(s) read; the counts and rows below cover what is read so far."
                        @if let Some(why) = &progress.problem { " " (prose(why)) }
                    }
                }
                section.card.counts #counts {
                    p.muted.totals.count data-read=(progress.read) data-stored=(p.stored) data-unresolved=(p.unresolved) data-matched=(p.matched) {
                        (p.stored) " stored, " (p.unresolved) " unresolved, " (p.matched) " matching"
                    }
                    div.columns {
                        div { h2 { "By error class" }
                            table.by-class { tbody { @for (name, n) in &p.by_class { tr {
                                td { @match name {
                                    Some(c) => a data-class=(c) href=(q.href(&[("class", c.clone()), ("page", String::new())])) { (cut(c, CELL_CHARS)) },
                                    None => span.muted { "(none)" },
                                } }
                                td.num { (n) }
                            } } } }
                        }
                        div { h2 { "By job" }
                            table.by-job { tbody { @for (name, n) in &p.by_job { tr {
                                td { @match name {
                                    Some(j) => a data-job=(j) href=(q.href(&[("job", j.clone()), ("page", String::new())])) { (cut(j, CELL_CHARS)) },
                                    None => span.muted { "(none)" },
                                } }
                                td.num { (n) }
                            } } } }
                        }
                    }
                }
                (filter_form(&q, &topic))
                @let pages = p.matched.div_ceil(query.limit.max(1)).max(1);
                @let number = q.page();
                @let from = (query.offset + 1).min(p.matched);
                @let to = (query.offset + p.rows.len()).min(p.matched);
                (pager(&q, number, pages, from, to, p.matched))
                @if actions {
                    form #selected method="post" action="/dlq/redrive" {
                        input type="hidden" name="csrf" value=(token.0);
                        input type="hidden" name="topic" value=(topic);
                        (rows_table(&q, &p.rows, &topic, true, now))
                        @if actions && p.rows.iter().any(|r| r.audit.is_none()) {
                            section.card.actions.selection {
                                h2 { "Selected rows" }
                                div.inline {
                                    label { "to" select name="to" {
                                        option value="retry" { "first retry tier" }
                                        option value="main" { "main topic" }
                                    } }
                                    label { "rate (records/s)" input type="number" name="rate" min="1" value="100"; }
                                    button #redrive-selected type="submit" { "Preview re-drive of selected" }
                                    label { "reason (resolve only, audited)" input name="reason" size="30"; }
                                    button.danger #resolve-selected type="submit" formaction="/dlq/resolve" { "Resolve selected" }
                                }
                            }
                        }
                    }
                } @else {
                    (rows_table(&q, &p.rows, &topic, false, now))
                }
                (pager(&q, number, pages, from, to, p.matched))
            }
        }
        @if actions && page.is_ok() {
            section.card.actions {
                h2 { "Re-drive or resolve everything matching the filter (unresolved only)" }
                p.muted.actor { "Audited as " code { (actor) } }
                (redrive_form(&token, select, q.q.as_deref(), None))
                (resolve_form(&token, select, q.q.as_deref(), None))
            }
        }
    }).into_response()
}

/// `/dlq` without a topic: every route's DLQ with its unresolved count.
fn dlq_index_of_routes(state: &Shared) -> Response {
    let routes = state.routes.read().map(|r| r.clone()).unwrap_or_default();
    layout(state, "Dead letters", html! {
        h1 { "Dead letters" }
        table {
            thead { tr { th { "route" } th { "group" } th.num { "unresolved" } } }
            tbody { @for v in &routes { tr {
                td { a href={"/dlq?topic=" (urlencode(&v.key.topic))} { (v.key.topic) } }
                td { (v.key.group) }
                td.num { (v.status.as_ref().and_then(|s| s.dlq_unresolved).map_or("-".to_string(), |n| n.to_string())) }
            } } }
        }
    }).into_response()
}

/// The search and filter form over one DLQ, keeping the sort.
fn filter_form(q: &DlqQuery, topic: &str) -> Markup {
    html! {
        form.inline method="get" action="/dlq" {
            input type="hidden" name="topic" value=(topic);
            label { "search (key, job id, error, payload)" input name="q" size="30" value=(q.q.clone().unwrap_or_default()); }
            label { "job" input name="job" value=(q.select.job.clone().unwrap_or_default()); }
            label { "error class" input name="class" placeholder="e.g. permanent" value=(q.select.class.clone().unwrap_or_default()); }
            label { "since" input name="since" placeholder="2h or 2026-11-29T10:00:00" value=(q.select.since.clone().unwrap_or_default()); }
            label { "until" input name="until" value=(q.select.until.clone().unwrap_or_default()); }
            label { "re-driven / resolved too" input type="checkbox" name="all" value="on" checked[q.all.is_some()]; }
            input type="hidden" name="sort" value=(q.sort().name());
            input type="hidden" name="dir" value=(if q.desc() { "desc" } else { "asc" });
            button.secondary type="submit" { "Filter" }
        }
    }
}

/// The page's rows, with a checkbox per unresolved row when actions are
/// allowed (the table then sits in the selection form).
fn rows_table(q: &DlqQuery, rows: &[Row], topic: &str, actions: bool, now: i64) -> Markup {
    let dash = |v: Option<&str>, cut_at: bool, max: usize| match v {
        Some(v) if !v.is_empty() => {
            let shown = cut(v, max);
            if cut_at && shown.len() == v.len() {
                format!("{v}…")
            } else {
                shown.into_owned()
            }
        }
        _ => "-".to_string(),
    };
    html! {
    div.scroll { table.dlq {
        thead { tr {
            @if actions { th.c-pick { "" } }
            th.c-at { (q.sort_link(Sort::At, "partition:offset")) }
            th.c-job { (q.sort_link(Sort::Job, "job")) }
            th.c-key { (q.sort_link(Sort::Key, "key")) }
            th.num.c-attempts { (q.sort_link(Sort::Attempts, "attempts")) }
            th.c-class { (q.sort_link(Sort::Class, "error class")) }
            th.c-error { "error" }
            th.c-time { (q.sort_link(Sort::Time, "failed at")) }
            th.c-status { "status" }
        } }
        tbody {
            @for r in rows {
                tr data-at=(r.at.to_string()) {
                    @if actions { td { @if r.audit.is_none() { input.pick type="checkbox" name="at" value=(r.at.to_string()); } } }
                    td.mono { a href={"/dlq/show?topic=" (urlencode(topic)) "&at=" (r.at)} { (r.at) } }
                    td { (dash(r.job.as_deref(), false, CELL_CHARS)) }
                    td.mono.key { (dash(r.key.as_deref(), r.key_cut, CELL_CHARS)) }
                    td.num { (if r.attempt == 0 { "-".to_string() } else { r.attempt.to_string() }) }
                    td { (dash(r.class.as_deref(), false, CELL_CHARS)) }
                    td.wrap { (dash(Some(&r.error), r.error_cut, ERROR_CHARS)) }
                    td.time { (when((r.timestamp_ms > 0).then_some(r.timestamp_ms), now)) }
                    td.status {
                        (r.audit.as_ref().map_or("unresolved".to_string(), |a| cut(&format!("{} by {}", a.action, a.by), CELL_CHARS).into_owned()))
                        // A job dead-lettered again is this one row; its
                        // earlier dead letters link from here.
                        @if !r.earlier.is_empty() {
                            span.earlier {
                                " · dead-lettered " (r.earlier.len() + 1) " times, earlier: "
                                @for (i, e) in r.earlier.iter().enumerate() {
                                    @if i > 0 { ", " }
                                    a.mono href={"/dlq/show?topic=" (urlencode(topic)) "&at=" (e)} { (e) }
                                }
                            }
                        }
                    }
                }
            }
        }
    } }
    }
}

/// The page links: first, previous, next, last and where this page is.
fn pager(
    q: &DlqQuery,
    number: usize,
    pages: usize,
    from: usize,
    to: usize,
    matched: usize,
) -> Markup {
    let link = |n: usize| q.href(&[("page", n.to_string())]);
    html! {
        nav.pager {
            span.range { "rows " (from) "–" (to) " of " (matched) }
            " · page " span.number { (number) } " of " (pages) " · "
            @if number > 1 {
                a.first href=(link(1)) { "« first" } " "
                a.prev href=(link(number - 1)) { "‹ previous" } " "
            }
            @if number < pages {
                a.next href=(link(number + 1)) { "next ›" } " "
                a.last href=(link(pages)) { "last »" }
            }
        }
    }
}

/// `?topic=&at=partition:offset`.
#[derive(Deserialize)]
pub(super) struct ShowQuery {
    topic: String,
    at: String,
}

/// `GET /dlq/show`: one dead letter as `kjob dlq show` prints it, every
/// value whole (long ones in a box of their own that wraps and scrolls),
/// times as dates with the raw value on hover.
pub(super) async fn dlq_show(
    State(state): State<Shared>,
    Extension(token): Extension<FormToken>,
    Extension(Actor(actor)): Extension<Actor>,
    Params(q): Params<ShowQuery>,
) -> Response {
    let at: Coordinates = match q.at.parse() {
        Ok(a) => a,
        Err(e) => return error_page(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    // The record is read by its coordinates; its audit entry comes from the
    // index once that has caught up (else from the audit topic).
    let indexed = match state.dlq_index(&q.topic).await {
        Ok(i) if i.wait_caught_up(super::FIRST_READ_WAIT).await => Some(i.audit_of(at)),
        _ => None,
    };
    let shown = match indexed {
        Some(audit) => crate::dlq::show_with_audit(&state.config, &q.topic, at, audit).await,
        None => crate::dlq::show(&state.config, &q.topic, at).await,
    };
    let shown = match shown {
        Ok(v) => v,
        Err(e) => return error_page(upstream_or(&e, StatusCode::NOT_FOUND), &format!("{e:#}")),
    };
    let now = kjob::clock::now_ms();
    let payload = serde_json::to_string_pretty(&shown["payload"]).unwrap_or_default();
    let mut headers = shown["headers"].as_object().cloned().unwrap_or_default();
    // A panic's backtrace is long and multi-line: a section of its own.
    let backtrace = headers
        .remove(kjob::dlq::BACKTRACE)
        .and_then(|v| v.as_str().map(str::to_string));
    let audit = shown["audit"].as_object().cloned();
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".to_string(),
        other => other.to_string(),
    };
    let select = Select {
        topic: q.topic.clone(),
        ..Default::default()
    };
    layout(&state, "Dead letter", html! {
        h1 { "Dead letter " code { (text(&shown["dlq"])) " " (at) } }
        p { a href={"/dlq?topic=" (urlencode(&q.topic)) "&all=on"} { "← all dead letters of this route" } }
        div.columns {
            section.card {
                table.fields {
                    tbody {
                        tr { th { "key" } td.mono.key { div.whole { (text(&shown["key"])) } } }
                        tr { th { "failed at" } td { (when(shown["failed_at_ms"].as_i64(), now)) } }
                    }
                }
                h2 { "Headers" }
                table.headers {
                    tbody { @for (k, v) in &headers {
                        @let value = text(v);
                        tr {
                            td.mono { (k) }
                            @match header_time(k, &value) {
                                Some(ms) => td.mono { (when(Some(ms), now)) },
                                None => td.mono { div.whole { (value) } },
                            }
                        }
                    } }
                }
            }
            div {
                section.card {
                    h2 { "Payload" }
                    pre.payload { (payload) }
                }
                @if let Some(bt) = &backtrace {
                    section.card.backtrace {
                        h2 { "Backtrace " small { "(where the handler panicked; " code { (kjob::dlq::BACKTRACE) } ")" } }
                        pre.backtrace { (bt) }
                    }
                }
                section.card.audit {
                    h2 { "Audit" }
                    @match &audit {
                        Some(a) => table { tbody {
                            @for (k, v) in a { tr { th { (k) } @if k == "at_ms" { td { (when(v.as_i64(), now)) } } @else { td { div.whole { (text(v)) } } } } }
                        } },
                        None => p.muted { "unresolved: no audit entry yet" },
                    }
                }
                @if state.allow_actions && audit.is_none() {
                    section.card.actions {
                        h2 { "Actions" }
                        p.muted.actor { "Audited as " code { (actor) } }
                        (redrive_form(&token, &select, None, Some(at)))
                        (resolve_form(&token, &select, None, Some(at)))
                    }
                }
            }
        }
    }).into_response()
}
