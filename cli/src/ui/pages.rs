//! The read-only pages: overview, route, replay dry run, DLQ browser and
//! dead-letter detail. Everything taken from records goes through maud's
//! escaping; nothing here writes to Kafka.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup, DOCTYPE};
use serde::Deserialize;

use kjob::dlq::store::Coordinates;
use kjob::groups::GroupMember;

use super::actions::{redrive_form, resolve_form};
use super::assets::layout;
use super::sampler::{Point, RouteView};
use super::Shared;
use crate::dlq::{empty_as_none, Select};
use crate::replay::{plan_rows, target_from, TargetSpec};
use crate::time::format_ms;

/// A page that says what went wrong (escaped), with the given status.
pub fn error_page(status: StatusCode, message: &str) -> Response {
    let body = html! {
        (DOCTYPE)
        html lang="en" {
            head { meta charset="utf-8"; title { "kjob · " (status.as_u16()) } link rel="stylesheet" href="/assets/style.css"; }
            body { main { h1 { (status) } div.error { (message) } p { a href="/" { "Back to the overview" } } } }
        }
    };
    (status, body).into_response()
}

/// A refused request: its status and the message the page shows.
#[derive(Debug)]
pub struct Refusal(pub StatusCode, pub String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        error_page(self.0, &self.1)
    }
}

/// 502 when Kafka or the registry failed, else `status` (the request
/// itself was wrong: an unknown record, group or target).
pub fn upstream_or(e: &anyhow::Error, status: StatusCode) -> StatusCode {
    use kjob::Error as E;
    match e.downcast_ref::<E>() {
        Some(
            E::Kafka { .. }
            | E::Registry { .. }
            | E::RegistryTimeout { .. }
            | E::RegistryUnauthorized { .. }
            | E::Delivery { .. }
            | E::Authentication { .. }
            | E::NotAuthorized { .. }
            | E::CreateTopic { .. }
            | E::Worker(_),
        ) => StatusCode::BAD_GATEWAY,
        _ => status,
    }
}

fn live_every(state: &Shared) -> u64 {
    state.sample_every.as_secs().max(1)
}

/// A small inline SVG line of the last values (the newest on the right).
pub fn sparkline(values: &[f64], width: u32, height: u32) -> Markup {
    // One sample draws as a flat line rather than nothing.
    let one;
    let values = match values {
        [v] => {
            one = [*v, *v];
            &one[..]
        }
        _ => values,
    };
    let max = values.iter().copied().fold(0.0, f64::max).max(1e-9);
    let n = values.len().max(2) - 1;
    let points: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let x = f64::from(width) * i as f64 / n as f64;
            let y = f64::from(height) - 2.0 - (f64::from(height) - 4.0) * (v / max);
            format!("{x:.1},{y:.1}")
        })
        .collect();
    html! {
        svg width=(width) height=(height) viewBox={"0 0 " (width) " " (height)} role="img" {
            line x1="0" y1=(height - 1) x2=(width) y2=(height - 1) stroke="#e4e7ec" stroke-width="1" {}
            polyline fill="none" stroke="#2563eb" stroke-width="1.5" points=(points.join(" ")) {}
        }
    }
}

fn series(history: &[Point], f: impl Fn(&Point) -> f64) -> Vec<f64> {
    history.iter().map(f).collect()
}

fn metric(label: &str, value: String, spark: Option<Vec<f64>>) -> Markup {
    html! {
        div.metric {
            div.label { (label) }
            div.value { (value) }
            @if let Some(v) = spark { (sparkline(&v, 160, 32)) }
        }
    }
}

fn members_table(state_name: &str, members: &[GroupMember]) -> Markup {
    html! {
        p.muted { "group state: " strong { (state_name) } ", " (members.len()) " member(s)" }
        @if !members.is_empty() {
            table.members {
                thead { tr { th { "client id" } th { "host" } th { "member id" } th { "assignment" } } }
                tbody {
                    @for m in members {
                        tr {
                            td.mono { (m.client_id) } td { (m.host) } td.mono { (m.id) }
                            td.mono {
                                @for (t, parts) in &m.assignment {
                                    div { (t) ": " (parts.iter().map(i32::to_string).collect::<Vec<_>>().join(", ")) }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn route_card(v: &RouteView) -> Markup {
    let hist: Vec<Point> = v.history.iter().copied().collect();
    let last = hist.last().copied().unwrap_or_default();
    let route_href = format!(
        "/route?topic={}&group={}",
        urlencode(&v.key.topic),
        urlencode(&v.key.group)
    );
    html! {
        section.card.route data-topic=(v.key.topic) data-group=(v.key.group) {
            h2 {
                a href=(route_href) { (v.key.topic) } " " small { "group " (v.key.group) }
                @if let Some(p) = hist.last() { " " small.sampled { "· sampled " (format_ms(Some(p.at_ms))) } }
            }
            @if let Some(e) = &v.error { div.error { "sampling failed: " (e) } }
            @if let Some(s) = &v.status {
                div.metrics {
                    (metric("lag (main + tiers)", last.lag.to_string(), Some(hist.iter().map(|p| p.lag as f64).collect())))
                    (metric("handled/s", format!("{:.1}", last.handled), Some(series(&hist, |p| p.handled))))
                    (metric("retried/s", format!("{:.1}", last.retried), Some(series(&hist, |p| p.retried))))
                    (metric("dead-lettered/s", format!("{:.1}", last.dead_lettered), Some(series(&hist, |p| p.dead_lettered))))
                    div.metric {
                        div.label { "DLQ unresolved" }
                        div.value.dlq-unresolved {
                            a href={"/dlq?topic=" (urlencode(&v.key.topic))} {
                                (s.dlq_unresolved.map_or("-".to_string(), |n| n.to_string()))
                            }
                        }
                    }
                }
                table {
                    thead { tr { th { "topic" } th { "role" } th.num { "partitions" } th.num { "lag / waiting" } th.num { "oldest pending" } th.num { "handled/s" } } }
                    tbody {
                        @for t in &s.topics {
                            tr {
                                td.mono { (t.topic) } td { (t.role) } td.num { (t.partitions) }
                                td.num.lag data-topic=(t.topic) { (t.lag) }
                                td.num { (format!("{:.1}s", t.oldest_pending_seconds)) }
                                td.num { (format!("{:.1}", t.handled_per_second)) }
                            }
                        }
                    }
                }
            } @else if v.error.is_none() {
                p.muted { "sampling…" }
            }
            (members_table(&v.group_state, &v.members))
        }
    }
}

/// `GET /`: every route with lag, rates, DLQ and members.
pub async fn overview(State(state): State<Shared>) -> Markup {
    let routes = state.routes.read().map(|r| r.clone()).unwrap_or_default();
    layout(
        &state,
        "Overview",
        html! {
            h1 { "Routes" }
            div #overview data-live=(live_every(&state)) {
                @if let Some(p) = state.problem.read().ok().and_then(|p| p.clone()) {
                    div.error { (p) }
                }
                @if routes.is_empty() {
                    p.notice { "No routes yet: routes appear when a group with live members consumes them (the first round can take a few seconds on a cluster with many groups), or name them with --route TOPIC=GROUP." }
                }
                @for v in &routes { (route_card(v)) }
            }
        },
    )
}

/// Percent-encodes a query value (topic and group names are plain, but a
/// link must not break on an odd one).
pub fn urlencode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// `?topic=&group=`.
#[derive(Deserialize)]
pub struct RouteQuery {
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

/// `GET /route`: partitions, tiers, lag chart, members, replay form.
pub async fn route(State(state): State<Shared>, Query(q): Query<RouteQuery>) -> Response {
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
    let now = kjob::dlq::now_ms();
    layout(&state, &q.topic, html! {
        h1 { "Route " code { (q.topic) } " · group " code { (q.group) } }
        div #route data-live=(live_every(&state)) {
            @if let Some(e) = &v.error { div.error { "sampling failed: " (e) } }
            section.card { h2 { "Lag" } (lag_chart(&hist)) }
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
                    h2 { "Retry tiers" }
                    table {
                        thead { tr { th { "tier" } th.num { "jobs waiting" } th { "next due" } } }
                        tbody {
                            @for t in s.topics.iter().filter(|t| t.role != "main") {
                                tr {
                                    td.mono { (t.topic) } td.num { (t.lag) }
                                    td { @match t.next_due_ms {
                                        Some(ms) => { (format_ms(Some(ms))) " (" (if ms > now { format!("in {:.0}s", (ms - now) as f64 / 1000.0) } else { "now".into() }) ")" }
                                        None => { "-" }
                                    } }
                                }
                            }
                        }
                    }
                }
            }
            section.card { h2 { "Members" } (members_table(&v.group_state, &v.members)) }
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
pub struct ReplayQuery {
    topic: String,
    group: String,
    to: String,
    #[serde(default)]
    value: String,
    #[serde(default)]
    include_tiers: Option<String>,
}

/// `GET /replay`: the same dry-run table `kjob replay` prints.
pub async fn replay(State(state): State<Shared>, Query(q): Query<ReplayQuery>) -> Response {
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

/// The DLQ browser's query: the filters, plus `all` to include audited ones.
#[derive(Deserialize, Default)]
pub struct DlqQuery {
    #[serde(default)]
    topic: String,
    #[serde(default, deserialize_with = "empty_as_none")]
    job: Option<String>,
    #[serde(default, deserialize_with = "empty_as_none")]
    class: Option<String>,
    #[serde(default, deserialize_with = "empty_as_none")]
    since: Option<String>,
    #[serde(default, deserialize_with = "empty_as_none")]
    until: Option<String>,
    #[serde(default)]
    all: Option<String>,
}

impl DlqQuery {
    fn select(&self) -> Select {
        Select {
            topic: self.topic.clone(),
            job: self.job.clone(),
            class: self.class.clone(),
            since: self.since.clone(),
            until: self.until.clone(),
        }
    }
}

/// `GET /dlq`: the DLQ of one route, filtered, with the actions.
pub async fn dlq_list(State(state): State<Shared>, Query(q): Query<DlqQuery>) -> Response {
    if q.topic.trim().is_empty() {
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
    let select = q.select();
    let all = q.all.is_some();
    let rows = crate::dlq::list(&state.config, &select, all).await;
    let topic = q.topic.clone();
    layout(&state, "Dead letters", html! {
        h1 { "Dead letters of " code { (topic) } }
        form.inline method="get" action="/dlq" {
            input type="hidden" name="topic" value=(topic);
            label { "job" input name="job" value=(q.job.clone().unwrap_or_default()); }
            label { "error class" input name="class" placeholder="e.g. permanent" value=(q.class.clone().unwrap_or_default()); }
            label { "since" input name="since" placeholder="2h or 2026-11-29T10:00:00" value=(q.since.clone().unwrap_or_default()); }
            label { "until" input name="until" value=(q.until.clone().unwrap_or_default()); }
            label { "re-driven / resolved too" input type="checkbox" name="all" value="on" checked[all]; }
            button.secondary type="submit" { "Filter" }
        }
        @match &rows {
            Err(e) => div.error { (format!("{e:#}")) },
            Ok(rows) => {
                p.muted.count { (rows.len()) " shown, " (rows.iter().filter(|(_, a)| a.is_none()).count()) " unresolved" }
                div.scroll { table.dlq {
                    thead { tr { th { "partition:offset" } th { "job" } th { "key" } th.num { "attempts" } th { "error class" } th { "error" } th { "failed at" } th { "status" } } }
                    tbody {
                        @for (d, a) in rows {
                            tr data-at=(d.at.to_string()) {
                                td.mono { a href={"/dlq/show?topic=" (urlencode(&topic)) "&at=" (d.at)} { (d.at) } }
                                td { (d.headers.job.clone().unwrap_or_else(|| "-".into())) }
                                td.mono.key { (d.key.clone().unwrap_or_else(|| "-".into())) }
                                td.num { (d.headers.attempt.map_or("-".into(), |a| a.to_string())) }
                                td { (d.headers.error_class.clone().unwrap_or_else(|| "-".into())) }
                                td.wrap { (kjob::headers::truncate_utf8(d.headers.error.as_deref().unwrap_or("-"), 120)) }
                                td { (format_ms(d.timestamp_ms)) }
                                td.status { (a.as_ref().map_or("unresolved".to_string(), |a| format!("{} by {}", a.action, a.by))) }
                            }
                        }
                    }
                } }
            }
        }
        @if state.allow_actions {
            section.card.actions {
                h2 { "Re-drive or resolve everything shown (unresolved only)" }
                (redrive_form(&state, &select, None))
                (resolve_form(&state, &select, None))
            }
        }
    }).into_response()
}

/// `?topic=&at=partition:offset`.
#[derive(Deserialize)]
pub struct ShowQuery {
    topic: String,
    at: String,
}

/// `GET /dlq/show`: one dead letter as `kjob dlq show` prints it.
pub async fn dlq_show(State(state): State<Shared>, Query(q): Query<ShowQuery>) -> Response {
    let at: Coordinates = match q.at.parse() {
        Ok(a) => a,
        Err(e) => return error_page(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let shown = match crate::dlq::show(&state.config, &q.topic, at).await {
        Ok(v) => v,
        Err(e) => return error_page(upstream_or(&e, StatusCode::NOT_FOUND), &format!("{e:#}")),
    };
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
                        tr { th { "key" } td.mono.key { (text(&shown["key"])) } }
                        tr { th { "failed at" } td { (text(&shown["failed_at"])) } }
                    }
                }
                h2 { "Headers" }
                table.headers {
                    tbody { @for (k, v) in &headers { tr { td.mono { (k) } td.mono { (text(v)) } } } }
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
                            @for (k, v) in a { tr { th { (k) } td { (if k == "at_ms" { format_ms(v.as_i64()) } else { text(v) }) } } }
                        } },
                        None => p.muted { "unresolved: no audit entry yet" },
                    }
                }
                @if state.allow_actions && audit.is_none() {
                    section.card.actions {
                        h2 { "Actions" }
                        (redrive_form(&state, &select, Some(at)))
                        (resolve_form(&state, &select, Some(at)))
                    }
                }
            }
        }
    }).into_response()
}
