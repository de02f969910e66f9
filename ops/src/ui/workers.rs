//! `GET /workers?group=`: a group's worker processes, from the group's
//! member list joined with the heartbeats each worker publishes on
//! `<group>.control` every five seconds ([`crate::control::workers`]):
//! host, pid, uptime, resident memory, busy handler slots, jobs per second
//! and the assignment. Read-only.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::html;
use serde::Deserialize;

use super::assets::layout;
use super::batches::status_of;
use super::pages::{error_page, live_every, urlencode};
use super::view::{age, cut, rate, when, CELL_CHARS};
use super::Shared;

/// `?group=`.
#[derive(Deserialize)]
pub(super) struct WorkersQuery {
    #[serde(default)]
    group: Option<String>,
}

/// Bytes as MiB with one decimal.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// `GET /workers`.
pub(super) async fn workers(
    State(state): State<Shared>,
    Query(q): Query<WorkersQuery>,
) -> Response {
    let group = q
        .group
        .as_deref()
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(str::to_string);
    let chooser = html! {
        form.inline method="get" action="/workers" {
            label { "consumer group" input name="group" value=(group.as_deref().unwrap_or_default()) size="40"; }
            button.secondary type="submit" { "Show" }
        }
    };
    let Some(group) = group else {
        let mut groups: Vec<String> = state
            .routes
            .read()
            .map(|r| r.iter().map(|v| v.key.group.clone()).collect())
            .unwrap_or_default();
        groups.sort();
        groups.dedup();
        return layout(&state, "Workers", html! {
            h1 { "Workers" }
            (chooser)
            ul.groups { @for g in &groups { li { a href={"/workers?group=" (urlencode(g))} { code { (g) } } } } }
        })
        .into_response();
    };
    state.watch_group(&group);
    let (c, g) = (state.config.clone(), group.clone());
    let rows = match tokio::task::spawn_blocking(move || crate::control::workers(&c, &g)).await {
        Ok(Ok(rows)) => rows,
        Ok(Err(e)) => return error_page(status_of(&e), &format!("{e:#}")),
        Err(e) => {
            return error_page(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("background task: {e}"),
            )
        }
    };
    let now = kjob::clock::now_ms();
    layout(&state, "Workers", html! {
        h1 { "Workers of group " code { (group) } }
        (chooser)
        div #workers data-live=(live_every(&state)) {
            @if rows.is_empty() {
                p.notice.empty { "No member and no heartbeat: no worker of this group is running." }
            } @else {
                table.workers {
                    thead { tr {
                        th { "client id" } th { "host" } th.num { "pid" } th { "up" } th.num { "RSS" }
                        th.num { "busy / slots" } th.num { "jobs/s" } th { "assignment" } th { "heartbeat" }
                    } }
                    tbody {
                        @for r in &rows {
                            tr data-client=(r.client_id) data-member=(r.member.is_some()) data-stale=(r.stale(now)) {
                                td.mono { (cut(&r.client_id, CELL_CHARS)) }
                                td.mono { (cut(r.beat.as_ref().map(|b| b.host.as_str()).or(r.member.as_ref().map(|m| m.host.trim_start_matches('/'))).unwrap_or("-"), CELL_CHARS)) }
                                td.num { (r.beat.as_ref().map_or("-".into(), |b| b.pid.to_string())) }
                                td.up { (r.beat.as_ref().map_or("-".into(), |b| age(b.started_ms, now).trim_end_matches(" ago").to_string())) }
                                td.num.rss { (r.beat.as_ref().and_then(|b| b.rss_bytes).map_or("-".into(), mib)) }
                                td.num.busy { (r.beat.as_ref().map_or("-".into(), |b| format!("{} / {}", b.busy, b.slots))) }
                                td.num.rate { (r.beat.as_ref().map_or("-".into(), |b| rate(b.jobs_per_second))) }
                                td.mono.assignment {
                                    @let assignment = r.member.as_ref().map(|m| m.assignment.clone()).or(r.beat.as_ref().map(|b| b.assignment.clone())).unwrap_or_default();
                                    @if assignment.is_empty() { "-" }
                                    @for (t, ps) in &assignment {
                                        div { (cut(t, CELL_CHARS)) ": " (ps.iter().map(i32::to_string).collect::<Vec<_>>().join(", ")) }
                                    }
                                }
                                td.time {
                                    @match &r.beat {
                                        Some(b) => { (when(Some(b.at_ms), now)) @if r.stale(now) { " " span.bad.stale { "stale" } } },
                                        None => span.muted { "none (an older kjob, or the control topic is not writable)" },
                                    }
                                    @if r.member.is_none() { " " span.bad.gone { "not a member" } }
                                }
                            }
                        }
                    }
                }
            }
        }
        p.muted { "Members come from the group coordinator; the rest from the heartbeat each worker writes to " code { (kjob::control::control_topic(&group)) } " every 5 s (a clean stop removes it; a stale one is a worker that died or cannot reach Kafka)." }
    })
    .into_response()
}
