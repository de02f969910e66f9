//! The overview page and what every page shares: error pages, sparklines,
//! the members table. Everything taken from records goes through maud's
//! escaping; nothing here writes to Kafka. The route and DLQ pages live in
//! `route.rs` and `dead_letters.rs`.

use std::borrow::Cow;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup, DOCTYPE};

use crate::groups::GroupMember;

use super::assets::layout;
use super::sampler::{Point, RouteView};
use super::view::{cut, neutralise_bidi, prose, rate, CELL_CHARS};
use super::Shared;
use crate::time::format_ms;

/// A page that says what went wrong (escaped, bidi controls shown), with
/// the given status.
pub(super) fn error_page(status: StatusCode, message: &str) -> Response {
    let body = html! {
        (DOCTYPE)
        html lang="en" {
            head { meta charset="utf-8"; title { "kjob · " (status.as_u16()) } link rel="stylesheet" href="/assets/style.css"; }
            body { main { h1 { (status) } div.error { (prose(message)) } p { a href="/" { "Back to the overview" } } } }
        }
    };
    (status, neutralise_bidi(body)).into_response()
}

/// A refused request: its status and the message the page shows.
#[derive(Debug)]
pub(super) struct Refusal(pub StatusCode, pub String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        error_page(self.0, &self.1)
    }
}

/// 502 when Kafka or the registry failed, else `status` (the request
/// itself was wrong: an unknown record, group or target).
pub(super) fn upstream_or(e: &anyhow::Error, status: StatusCode) -> StatusCode {
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
            | E::ReadTimeout { .. }
            | E::NoOffsets { .. }
            | E::Task { .. },
        ) => StatusCode::BAD_GATEWAY,
        _ => status,
    }
}

pub(super) fn live_every(state: &Shared) -> u64 {
    state.sample_every.as_secs().max(1)
}

/// A small inline SVG line of the last values (the newest on the right).
pub(super) fn sparkline(values: &[f64], width: u32, height: u32) -> Markup {
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

/// The members of `group`: which process each is (host and pid, read
/// from the `client.id` kjob workers set by default, see
/// `kjob::config::default_client_id`), where it connects from (the address
/// the coordinator reports) and what it was assigned.
pub(super) fn members_table(group: &str, state_name: &str, members: &[GroupMember]) -> Markup {
    html! {
        p.muted { "group state: " strong { (state_name) } ", " (members.len()) " member(s)" }
        @if !members.is_empty() {
            table.members {
                thead { tr { th { "client id" } th { "host" } th.num { "pid" } th { "address" } th { "member id" } th { "assignment" } } }
                tbody {
                    @for m in members {
                        @let process = kjob::config::host_and_pid(&m.client_id, group);
                        tr {
                            td.mono { (cut(&m.client_id, CELL_CHARS)) }
                            td.host { (process.as_ref().map_or(Cow::Borrowed("-"), |(h, _)| cut(h, CELL_CHARS))) }
                            td.num.pid { (process.as_ref().map_or("-".to_string(), |(_, p)| p.to_string())) }
                            td.mono.nowrap { (cut(&m.host, CELL_CHARS)) }
                            td.mono { (cut(&m.id, CELL_CHARS)) }
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
                @if v.members.is_empty() { " " small.no-members { "no live member" } }
            }
            @if let Some(e) = &v.error { div.error { "sampling failed: " (prose(e)) } }
            @if let Some(s) = &v.status {
                div.metrics {
                    (metric("lag (main + tiers)", last.lag.to_string(), Some(hist.iter().map(|p| p.lag as f64).collect())))
                    (metric("handled/s", rate(last.handled), Some(series(&hist, |p| p.handled))))
                    (metric("retried/s", rate(last.retried), Some(series(&hist, |p| p.retried))))
                    (metric("dead-lettered/s", rate(last.dead_lettered), Some(series(&hist, |p| p.dead_lettered))))
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
                                td.num.lag data-topic=(t.topic) { (t.lag_text()) }
                                td.num { (t.oldest_pending_seconds.map_or("-".to_string(), |s| format!("{:.1}s", s.max(0.0) + 0.0))) }
                                td.num { (t.handled_per_second.map_or("-".to_string(), rate)) }
                            }
                        }
                    }
                }
            } @else if v.error.is_none() {
                p.muted { "sampling…" }
            }
            (members_table(&v.key.group, &v.group_state, &v.members))
        }
    }
}

/// `GET /`: every route with lag, rates, DLQ and members.
pub(super) async fn overview(State(state): State<Shared>) -> Markup {
    let routes = state.routes.read().map(|r| r.clone()).unwrap_or_default();
    layout(
        &state,
        "Overview",
        html! {
            h1 { "Routes" }
            div #overview data-live=(live_every(&state)) {
                @if let Some(p) = state.problem.read().ok().and_then(|p| p.clone()) {
                    div.error { (prose(&p)) }
                }
                @if routes.is_empty() {
                    p.notice { "No routes yet: routes appear when a group consumes them, with live members or through the offsets a kjob group committed (the first rounds can take a few seconds on a cluster with many groups), or name them with --route TOPIC=GROUP." }
                }
                @for v in &routes { (route_card(v)) }
            }
        },
    )
}

pub(super) use super::view::urlencode;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_sample_still_draws_a_line() {
        let svg = sparkline(&[3.0], 100, 20).into_string();
        assert!(svg.contains("points=\"0.0,2.0 100.0,2.0\""), "{svg}");
    }

    #[test]
    fn member_fields_are_escaped() {
        let m = GroupMember {
            id: "<b>id</b>".into(),
            client_id: "<script>x()</script>".into(),
            host: "\"><img src=x>".into(),
            assignment: vec![("<t>".into(), vec![0])],
        };
        let html = members_table("g", "Stable", &[m]).into_string();
        assert!(!html.contains("<script>") && !html.contains("<img") && !html.contains("<t>"));
        assert!(html.contains("&lt;script&gt;x()&lt;/script&gt;"), "{html}");
    }

    #[test]
    fn members_show_the_host_and_pid_of_kjob_client_ids() {
        let member = |client_id: &str| GroupMember {
            id: "m-1".into(),
            client_id: client_id.into(),
            host: "/127.0.0.1".into(),
            assignment: Vec::new(),
        };
        let html = members_table(
            "billing-workers",
            "Stable",
            &[member("kjob-billing-workers-web-1-4242"), member("rdkafka")],
        )
        .into_string();
        assert!(html.contains("<td class=\"host\">web-1</td>"), "{html}");
        assert!(html.contains("<td class=\"num pid\">4242</td>"), "{html}");
        assert!(html.contains("<td class=\"host\">-</td>"), "{html}");
        assert!(html.contains("/127.0.0.1"), "{html}");
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(urlencode("orders.a b&c=d"), "orders.a+b%26c%3Dd");
    }
}
