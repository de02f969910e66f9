//! The route page (partitions, tiers, lag chart, members) and the replay
//! dry run, read-only.

use axum::extract::{Extension, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};
use serde::Deserialize;

use super::assets::layout;
use super::auth::FormToken;
use super::pages::{error_page, live_every, members_table, sparkline, upstream_or, urlencode};
use super::sampler::Point;
use super::view::{cut, prose, when, CELL_CHARS};
use super::Shared;
use crate::replay::{plan_rows, target_from, TargetSpec};
use crate::time::format_ms;

/// `?topic=&group=`.
#[derive(Deserialize)]
pub(super) struct RouteQuery {
    topic: String,
    group: String,
}

fn lag_chart(history: &[Point]) -> Markup {
    let (w, h) = (720u32, 140u32);
    let values: Vec<f64> = history.iter().map(|p| p.lag as f64).collect();
    let max = values.iter().copied().fold(0.0, f64::max);
    html! {
        div.lag-chart {
            (sparkline(&values, w, h))
            p.muted {
                "lag over the last " (history.len()) " samples; max " (max as i64)
                @if let (Some(a), Some(b)) = (history.first(), history.last()) {
                    ", " (format_ms(Some(a.at_ms))) " – " (format_ms(Some(b.at_ms)))
                }
            }
        }
    }
}

/// The last day at one point a minute ([`super::history`]): lag, the
/// minute's handled, retried and dead-lettered jobs, and handler p50/p99.
fn day_charts(minutes: &[super::history::Minute]) -> Markup {
    let series =
        |f: fn(&super::history::Minute) -> f64| -> Vec<f64> { minutes.iter().map(f).collect() };
    let durations: Vec<&super::history::Minute> =
        minutes.iter().filter(|m| m.p50_ms.is_some()).collect();
    let last = |v: &[f64]| v.last().copied().unwrap_or(0.0);
    let charts: [(&str, &str, Vec<f64>); 4] = [
        ("lag", "lag", series(|m| m.lag as f64)),
        ("handled", "handled / min", series(|m| m.handled)),
        ("retried", "retried / min", series(|m| m.retried)),
        ("dead", "dead-lettered / min", series(|m| m.dead_lettered)),
    ];
    html! {
        @if minutes.is_empty() {
            p.muted.none { "No minute recorded yet: the first point appears at the end of this minute." }
        } @else {
            div.metrics {
                @for (class, label, values) in &charts {
                    div.metric.day data-series=(class) {
                        div.label { (label) }
                        div.value { (format!("{:.0}", last(values))) }
                        (sparkline(values, 240, 40))
                    }
                }
                div.metric.day data-series="p50" {
                    div.label { "handler p50 (ms)" }
                    div.value.p50 { (durations.last().and_then(|m| m.p50_ms).map_or("-".into(), |v| format!("{v:.1}"))) }
                    (sparkline(&durations.iter().filter_map(|m| m.p50_ms).collect::<Vec<_>>(), 240, 40))
                }
                div.metric.day data-series="p99" {
                    div.label { "handler p99 (ms)" }
                    div.value.p99 { (durations.last().and_then(|m| m.p99_ms).map_or("-".into(), |v| format!("{v:.1}"))) }
                    (sparkline(&durations.iter().filter_map(|m| m.p99_ms).collect::<Vec<_>>(), 240, 40))
                }
            }
            p.muted.span {
                span.minutes { (minutes.len()) } " minutes recorded"
                @if let (Some(a), Some(b)) = (minutes.first(), minutes.last()) {
                    ", " (format_ms(Some(a.minute_ms))) " – " (format_ms(Some(b.minute_ms)))
                }
                "; kept on " code { (super::history::TOPIC) } " for 25 hours"
            }
        }
    }
}

/// `GET /route`: partitions, tiers, lag chart, members, replay form.
pub(super) async fn route(
    State(state): State<Shared>,
    Extension(token): Extension<FormToken>,
    Query(q): Query<RouteQuery>,
) -> Response {
    let Some(v) = state.route_view(&q.topic, &q.group) else {
        return error_page(
            StatusCode::NOT_FOUND,
            &format!(
                "no route `{}` for group `{}` is being sampled; start the dashboard with --route {}={}",
                q.topic, q.group, q.topic, q.group
            ),
        );
    };
    let hist: Vec<Point> = v.history.iter().copied().collect();
    let now = kjob::clock::now_ms();
    state.watch_group(&q.group);
    let paused = state.route_paused(&q.group, &q.topic);
    layout(&state, &q.topic, html! {
        h1 { "Route " code { (q.topic) } " · group " code { (q.group) } }
        section.card #route-control data-paused=(paused.is_some()) {
            @match &paused {
                Some(p) => p { span.status.paused { "paused" } " for the whole group by " strong.by { (p.by) } " " (when(Some(p.at_ms), now)) ": " span.reason { (p.reason) } },
                None => p { span.status.running { "running" } " · no worker of the group is held from fetching it" },
            }
            @if state.allow_actions {
                @if paused.is_some() {
                    form.inline.resume-route method="post" action="/route/resume" {
                        input type="hidden" name="csrf" value=(token.0);
                        input type="hidden" name="topic" value=(q.topic);
                        input type="hidden" name="group" value=(q.group);
                        button.secondary #resume-route type="submit" { "Resume route" }
                    }
                } @else {
                    form.inline.pause-route method="post" action="/route/pause" {
                        input type="hidden" name="csrf" value=(token.0);
                        input type="hidden" name="topic" value=(q.topic);
                        input type="hidden" name="group" value=(q.group);
                        label { "reason (required, audited)" input #pause-reason name="reason" required size="36"; }
                        button.danger #pause-route type="submit" { "Pause route for the group" }
                    }
                    p.muted { "Every worker of the group stops fetching the main topic within about a second; jobs already fetched finish and are committed. Its retry tiers and delay topics keep flowing: retries and delayed jobs that fall due still run." }
                }
            }
        }
        div #route data-live=(live_every(&state)) {
            @if let Some(e) = &v.error { div.error { "sampling failed: " (prose(e)) } }
            section.card { h2 { "Lag" } (lag_chart(&hist)) }
            section.card #day { h2 { "Last 24 hours" " " small { "one point a minute, across restarts" } } (day_charts(&state.history.of(&v.key))) }
            section.card {
                h2 { "Partitions" }
                table {
                    thead { tr { th { "topic" } th.num { "partition" } th.num { "committed" } th.num { "end" } th.num { "lag" } } }
                    tbody {
                        @for r in &v.rows {
                            tr {
                                td.mono { (r.topic) } td.num { (r.partition) }
                                td.num { (r.committed.map_or("-".to_string(), |c| c.to_string())) }
                                td.num { (r.end) } td.num.lag { (r.lag()) }
                            }
                        }
                    }
                }
            }
            @if let Some(s) = &v.status {
                section.card {
                    h2 { "Retry tiers" " " small { a #waiting-link href={"/waiting?topic=" (urlencode(&q.topic)) "&group=" (urlencode(&q.group))} { "what is waiting, with due times" } } }
                    table {
                        thead { tr { th { "tier" } th.num { "jobs waiting" } th { "next due" } } }
                        tbody {
                            @for t in s.topics.iter().filter(|t| t.role == "retry tier" || t.role == "shared retry tier") {
                                tr {
                                    td.mono { (t.topic) } td.num { (t.route_lag().unwrap_or(0)) }
                                    td { (when(t.next_due_ms, now)) }
                                }
                            }
                        }
                    }
                }
            }
            @let tenants = state.tenants_of(&q.group, &q.topic);
            @if !tenants.is_empty() {
                section.card #tenants {
                    h2 { "Tenants" " " small { "sharing the route's slots (fair share), from the workers' heartbeats" } }
                    table {
                        thead { tr { th { "tenant" } th.num { "running" } th.num { "ready" } } }
                        tbody {
                            @for t in &tenants {
                                tr data-tenant=(t.tenant) {
                                    td.tenant { (cut(if t.tenant.is_empty() { "(no tenant)" } else { &t.tenant }, CELL_CHARS)) }
                                    td.num.running { (t.running) }
                                    td.num.ready { (t.ready) }
                                }
                            }
                        }
                    }
                }
            }
            section.card { h2 { "Members" " " small { a #workers-link href={"/workers?group=" (urlencode(&q.group))} { "the workers: uptime, memory, busy slots, jobs/s" } } } (members_table(&q.group, &v.group_state, &v.members)) }
        }
        section.card {
            h2 { "Replay (dry run)" }
            form.inline method="get" action="/replay" {
                input type="hidden" name="topic" value=(q.topic);
                input type="hidden" name="group" value=(q.group);
                label { "target" select name="to" {
                    option value="by-duration" { "by duration (e.g. 1h)" }
                    option value="to-datetime" { "to date-time" }
                    option value="shift-by" { "shift by N" }
                    option value="to-offset" { "to offset" }
                    option value="to-earliest" { "to earliest" }
                    option value="to-latest" { "to latest" }
                } }
                label { "value" input name="value" placeholder="1h"; }
                label { "retry tiers too" input type="checkbox" name="include_tiers" value="on"; }
                button type="submit" { "Plan" }
            }
        }
    }).into_response()
}

/// `GET /replay?topic&group&to&value&include_tiers`.
#[derive(Deserialize)]
pub(super) struct ReplayQuery {
    topic: String,
    group: String,
    to: String,
    #[serde(default)]
    value: String,
    #[serde(default)]
    include_tiers: Option<String>,
}

/// `GET /replay`: the same dry-run table `kjob replay` prints.
pub(super) async fn replay(State(state): State<Shared>, Query(q): Query<ReplayQuery>) -> Response {
    let value = q.value.trim().to_string();
    let num = |flag: &str| -> Result<i64, String> {
        value
            .parse::<i64>()
            .map_err(|_| format!("{flag} needs a whole number, got `{value}`"))
    };
    let spec = match q.to.as_str() {
        "by-duration" => Ok(TargetSpec {
            by_duration: Some(&value),
            ..Default::default()
        }),
        "to-datetime" => Ok(TargetSpec {
            to_datetime: Some(&value),
            ..Default::default()
        }),
        "shift-by" => num("--shift-by").map(|n| TargetSpec {
            shift_by: Some(n),
            ..Default::default()
        }),
        "to-offset" => num("--to-offset").map(|n| TargetSpec {
            to_offset: Some(n),
            ..Default::default()
        }),
        "to-earliest" => Ok(TargetSpec {
            to_earliest: true,
            ..Default::default()
        }),
        "to-latest" => Ok(TargetSpec::default()),
        other => Err(format!("unknown replay target `{other}`")),
    };
    let target = match spec
        .map_err(anyhow::Error::msg)
        .and_then(|s| target_from(&s))
    {
        Ok(t) => t,
        Err(e) => return error_page(StatusCode::BAD_REQUEST, &format!("{e:#}")),
    };
    let (config, group, topic, tiers) = (
        state.config.clone(),
        q.group.clone(),
        q.topic.clone(),
        q.include_tiers.is_some(),
    );
    let rows = tokio::task::spawn_blocking(move || {
        plan_rows(&config, &group, &topic, tiers, None, target)
    })
    .await;
    let rows = match rows {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            return error_page(upstream_or(&e, StatusCode::BAD_REQUEST), &format!("{e:#}"))
        }
        Err(e) => {
            return error_page(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("background task: {e}"),
            )
        }
    };
    let total: i64 = rows.iter().map(|r| r.replayed().max(0)).sum();
    layout(&state, "Replay", html! {
        h1 { "Replay dry run: " code { (q.topic) } " · group " code { (q.group) } }
        table.replay {
            thead { tr { th { "topic" } th.num { "partition" } th.num { "committed now" } th.num { "target" } th.num { "log end" } th.num { "jobs handled again" } } }
            tbody {
                @for r in &rows {
                    tr {
                        td.mono { (r.topic) } td.num { (r.partition) }
                        td.num { (r.committed.map_or("-".to_string(), |c| c.to_string())) }
                        td.num { (r.target) } td.num { (r.end) } td.num { (r.replayed()) }
                    }
                }
            }
        }
        p.notice { "dry run: " (total) " job(s) would be handled again by group " code { (q.group) } ". To apply it, stop the group's workers and run "
            code { "kjob replay --group " (q.group) " --topic " (q.topic) " … --execute" } "." }
    }).into_response()
}
