//! `GET /waiting`: the jobs sitting in a route's retry tiers and delay
//! topics, with their due times, through [`crate::waiting::waiting`] (a
//! bounded read from the group's committed offsets; nothing is committed).
//! Read-only: see the book's dashboard chapter for why "move to now" and
//! "cancel a delayed job" are not offered yet.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};
use serde::Deserialize;

use super::assets::layout;
use super::pages::{error_page, live_every, upstream_or, urlencode};
use super::view::{cut, when, CELL_CHARS};
use super::Shared;
use crate::waiting::{WaitingTopic, MAX_PER_PARTITION};

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

fn topic_card(t: &WaitingTopic, now: i64) -> Markup {
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
                    } }
                    tbody {
                        @for p in &t.partitions { @for r in &p.records {
                            tr data-at={(r.partition) ":" (r.offset)} data-id=(r.headers.id.as_deref().unwrap_or_default()) {
                                td.mono { (r.partition) ":" (r.offset) }
                                td { (cut(r.headers.job.as_deref().unwrap_or("-"), CELL_CHARS)) }
                                td.mono.key { (cut(r.key.as_deref().unwrap_or_default(), CELL_CHARS)) }
                                td.mono.id { (cut(r.headers.id.as_deref().unwrap_or("-"), CELL_CHARS)) }
                                td.num { (r.headers.attempt.map_or("-".to_string(), |a| a.to_string())) }
                                td.time.due { (when(r.due_ms(), now)) }
                                td.time { (when(r.timestamp_ms, now)) }
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
        crate::waiting::waiting(&config, &topic, &group, limit)
    })
    .await;
    let topics = match read {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            let e = anyhow::Error::from(e);
            return error_page(upstream_or(&e, StatusCode::BAD_REQUEST), &format!("{e:#}"));
        }
        Err(e) => {
            return error_page(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("background task: {e}"),
            )
        }
    };
    let now = kjob::dlq::now_ms();
    layout(&state, "Waiting", html! {
        h1 { "Waiting in " code { (q.topic) } " · group " code { (q.group) } }
        p.muted { "Retry tiers and delay topics, from the group's committed offsets: at most " (limit) " records per partition, due first. A delayed job is due at its " code { "kjob-run-at" } ", a retry at its " code { "kjob-due-at" } "." }
        div #waiting data-live=(live_every(&state)) {
            @if topics.is_empty() {
                p.notice.empty { "This route has no retry tier or delay topic yet." }
            }
            @for t in &topics { (topic_card(t, now)) }
        }
        p { a href={"/route?topic=" (urlencode(&q.topic)) "&group=" (urlencode(&q.group))} { "Back to the route" } }
    }).into_response()
}
