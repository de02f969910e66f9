//! The DLQ browser and one dead letter in full, through the same functions
//! as `kjob dlq list` and `kjob dlq show`; the action forms appear only
//! with `--allow-actions`.

use axum::extract::{Extension, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::html;
use serde::Deserialize;

use crate::dlq::store::Coordinates;

use super::actions::{redrive_form, resolve_form};
use super::assets::layout;
use super::auth::FormToken;
use super::pages::{error_page, upstream_or, urlencode};
use super::view::{cut, header_time, prose, when, CELL_CHARS, ERROR_CHARS};
use super::Shared;
use crate::dlq::Select;

/// The DLQ browser's query: the filters, plus `all` to include audited ones.
#[derive(Deserialize, Default)]
pub(super) struct DlqQuery {
    /// The DLQ and the filters, as `kjob dlq list` takes them.
    #[serde(flatten)]
    select: Select,
    #[serde(default)]
    all: Option<String>,
}

/// `GET /dlq`: the DLQ of one route, filtered, with the actions. Values
/// are cut to their column (the detail page has them whole), so one huge
/// key cannot push the other columns off the screen.
pub(super) async fn dlq_list(
    State(state): State<Shared>,
    Extension(token): Extension<FormToken>,
    Query(q): Query<DlqQuery>,
) -> Response {
    let DlqQuery { select, all } = q;
    if select.topic.trim().is_empty() {
        let routes = state.routes.read().map(|r| r.clone()).unwrap_or_default();
        return layout(&state, "Dead letters", html! {
            h1 { "Dead letters" }
            table {
                thead { tr { th { "route" } th { "group" } th.num { "unresolved" } } }
                tbody { @for v in &routes { tr {
                    td { a href={"/dlq?topic=" (urlencode(&v.key.topic))} { (v.key.topic) } }
                    td { (v.key.group) }
                    td.num { (v.status.as_ref().and_then(|s| s.dlq_unresolved).map_or("-".to_string(), |n| n.to_string())) }
                } } }
            }
        }).into_response();
    }
    let all = all.is_some();
    let rows = crate::dlq::list(&state.config, &select, all).await;
    let topic = select.topic.clone();
    let now = kjob::dlq::now_ms();
    let dash = |v: &Option<String>, max: usize| match v {
        Some(v) => cut(v, max).into_owned(),
        None => "-".to_string(),
    };
    layout(&state, "Dead letters", html! {
        h1 { "Dead letters of " code { (topic) } }
        form.inline method="get" action="/dlq" {
            input type="hidden" name="topic" value=(topic);
            label { "job" input name="job" value=(select.job.clone().unwrap_or_default()); }
            label { "error class" input name="class" placeholder="e.g. permanent" value=(select.class.clone().unwrap_or_default()); }
            label { "since" input name="since" placeholder="2h or 2026-11-29T10:00:00" value=(select.since.clone().unwrap_or_default()); }
            label { "until" input name="until" value=(select.until.clone().unwrap_or_default()); }
            label { "re-driven / resolved too" input type="checkbox" name="all" value="on" checked[all]; }
            button.secondary type="submit" { "Filter" }
        }
        @match &rows {
            Err(e) => div.error { (prose(&format!("{e:#}"))) },
            Ok(rows) => {
                p.muted.count { (rows.len()) " shown, " (rows.iter().filter(|(_, a)| a.is_none()).count()) " unresolved" }
                div.scroll { table.dlq {
                    thead { tr { th.c-at { "partition:offset" } th.c-job { "job" } th.c-key { "key" } th.num.c-attempts { "attempts" } th.c-class { "error class" } th.c-error { "error" } th.c-time { "failed at" } th.c-status { "status" } } }
                    tbody {
                        @for (d, a) in rows {
                            tr data-at=(d.at.to_string()) {
                                td.mono { a href={"/dlq/show?topic=" (urlencode(&topic)) "&at=" (d.at)} { (d.at) } }
                                td { (dash(&d.headers.job, CELL_CHARS)) }
                                td.mono.key { (dash(&d.key, CELL_CHARS)) }
                                td.num { (d.headers.attempt.map_or("-".into(), |a| a.to_string())) }
                                td { (dash(&d.headers.error_class, CELL_CHARS)) }
                                td.wrap { (dash(&d.headers.error, ERROR_CHARS)) }
                                td.time { (when(d.timestamp_ms, now)) }
                                td.status { (a.as_ref().map_or("unresolved".to_string(), |a| cut(&format!("{} by {}", a.action, a.by), CELL_CHARS).into_owned())) }
                            }
                        }
                    }
                } }
            }
        }
        @if state.allow_actions {
            section.card.actions {
                h2 { "Re-drive or resolve everything shown (unresolved only)" }
                (redrive_form(&token, &select, None))
                (resolve_form(&token, &select, None))
            }
        }
    }).into_response()
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
    Query(q): Query<ShowQuery>,
) -> Response {
    let at: Coordinates = match q.at.parse() {
        Ok(a) => a,
        Err(e) => return error_page(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let shown = match crate::dlq::show(&state.config, &q.topic, at).await {
        Ok(v) => v,
        Err(e) => return error_page(upstream_or(&e, StatusCode::NOT_FOUND), &format!("{e:#}")),
    };
    let now = kjob::dlq::now_ms();
    let payload = serde_json::to_string_pretty(&shown["payload"]).unwrap_or_default();
    let headers = shown["headers"].as_object().cloned().unwrap_or_default();
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
                        (redrive_form(&token, &select, Some(at)))
                        (resolve_form(&token, &select, Some(at)))
                    }
                }
            }
        }
    }).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_takes_the_cli_selection_with_empty_fields_as_absent() {
        let uri: axum::http::Uri = "/dlq?topic=orders&job=&class=permanent&since=2h&all=on"
            .parse()
            .unwrap();
        let Query(q) = Query::<DlqQuery>::try_from_uri(&uri).unwrap();
        assert_eq!(q.select.topic, "orders");
        assert_eq!(q.select.job, None, "an empty field is a filter not given");
        assert_eq!(q.select.class.as_deref(), Some("permanent"));
        assert_eq!(q.select.since.as_deref(), Some("2h"));
        assert!(q.all.is_some());
        let uri: axum::http::Uri = "/dlq".parse().unwrap();
        let Query(q) = Query::<DlqQuery>::try_from_uri(&uri).unwrap();
        assert!(q.select.topic.is_empty(), "no topic: the list of routes");
    }
}
