//! The stylesheet, the live-update script and the page shell, compiled
//! into the binary (no node build, nothing fetched by the browser).

use axum::http::header;
use axum::response::IntoResponse;
use maud::{html, Markup, DOCTYPE};

use super::view::neutralise_bidi;
use super::AppState;

const CSS: &str = r#"
:root { --fg:#1f2430; --muted:#667085; --line:#e4e7ec; --bg:#f7f8fa; --accent:#2563eb; --bad:#c2410c; --ok:#15803d; }
* { box-sizing:border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif; color:var(--fg); background:var(--bg); }
header { display:flex; align-items:center; gap:1.5rem; padding:.7rem 1.5rem; background:#111827; color:#fff; }
header a { color:#d1d5db; text-decoration:none; } header a:hover { color:#fff; }
header .brand { font-weight:700; color:#fff; }
header .mode { margin-left:auto; font-size:12px; padding:.15rem .5rem; border-radius:999px; background:#374151; }
header .mode.rw { background:#b45309; }
.in-force { background:#fef3c7; border-bottom:1px solid #f59e0b; color:#78350f; padding:.45rem 1.5rem; display:flex; flex-wrap:wrap; gap:.4rem 1.2rem; }
.status.paused { color:#b45309; font-weight:600; } .status.running { color:var(--ok); }
table.schedules td form.inline { margin:0; }
main { padding:1.2rem 1.5rem; max-width:1250px; }
h1 { font-size:20px; margin:.2rem 0 1rem; } h2 { font-size:16px; margin:1.2rem 0 .5rem; }
.card { background:#fff; border:1px solid var(--line); border-radius:8px; padding:1rem 1.2rem; margin-bottom:1rem; }
.card h2 { margin-top:0; } .card h2 small { color:var(--muted); font-weight:400; }
table { border-collapse:collapse; width:100%; background:#fff; }
th, td { text-align:left; padding:.35rem .6rem; border-bottom:1px solid var(--line); vertical-align:top; }
td.mono { overflow-wrap:anywhere; } td.num, td.nowrap { white-space:nowrap; }
th { font-size:12px; text-transform:uppercase; letter-spacing:.03em; color:var(--muted); font-weight:600; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; }
.metrics { display:flex; flex-wrap:wrap; gap:1rem; margin:.8rem 0; }
.metric { border:1px solid var(--line); border-radius:6px; padding:.5rem .8rem; min-width:170px; }
.metric .label { font-size:12px; color:var(--muted); } .metric .value { font-size:20px; font-weight:600; }
.metric svg { display:block; margin-top:.2rem; }
.bad { color:var(--bad); } .ok { color:var(--ok); } .muted { color:var(--muted); }
.error { background:#fef2f2; border:1px solid #fecaca; color:#991b1b; padding:.6rem .8rem; border-radius:6px; margin-bottom:1rem; }
.notice { background:#eff6ff; border:1px solid #bfdbfe; padding:.6rem .8rem; border-radius:6px; margin-bottom:1rem; }
pre { background:#0f172a; color:#e2e8f0; padding:.8rem; border-radius:6px; overflow:auto; max-height:420px; font-size:12.5px; }
code, .mono { font-family:ui-monospace,SFMono-Regular,Menlo,monospace; font-size:12.5px; }
form.inline { display:flex; flex-wrap:wrap; gap:.5rem; align-items:end; margin:.4rem 0; }
label { display:flex; flex-direction:column; font-size:12px; color:var(--muted); gap:.15rem; }
input, select { font:inherit; padding:.3rem .45rem; border:1px solid #cbd5e1; border-radius:5px; background:#fff; }
button { font:inherit; padding:.35rem .8rem; border-radius:5px; border:1px solid var(--accent); background:var(--accent); color:#fff; cursor:pointer; }
button.secondary { background:#fff; color:var(--accent); } button.danger { background:var(--bad); border-color:var(--bad); }
progress { width:100%; height:1.1rem; }
a { color:var(--accent); }
.scroll { overflow-x:auto; }
table.dlq { table-layout:fixed; }
table.dlq td { white-space:nowrap; overflow:hidden; text-overflow:ellipsis; }
table.dlq td.wrap { white-space:normal; overflow-wrap:anywhere; }
table.dlq td.time { white-space:normal; }
table.dlq th { overflow:hidden; text-overflow:ellipsis; white-space:nowrap; }
table.dlq .c-at { width:10rem; } table.dlq .c-attempts { width:6rem; } table.dlq .c-class { width:7.5rem; }
table.dlq .c-time { width:10.5rem; } table.dlq .c-status { width:7rem; }
table.dlq .c-job { width:12%; } table.dlq .c-key { width:16%; }
time.when .age { color:var(--muted); white-space:nowrap; }
table.dlq time.when .age { display:block; }
.whole { max-height:14rem; overflow:auto; white-space:pre-wrap; overflow-wrap:anywhere; }
.columns { display:grid; grid-template-columns:minmax(0,1fr) minmax(0,1fr); gap:1rem; align-items:start; }
.columns > * { min-width:0; }
table.headers { table-layout:fixed; }
table.headers td:first-child { width:40%; color:var(--muted); }
table.headers td { overflow-wrap:anywhere; }
table.dlq .c-pick { width:2rem; }
table.dlq .c-act { width:15rem; } table.dlq td.act { white-space:normal; }
table.dlq td.act input.reason { width:8rem; } table.dlq td.act button { padding:.2rem .5rem; margin:.1rem 0; }
th a.sort { color:inherit; text-decoration:none; } th a.sort:hover { text-decoration:underline; }
nav.pager { margin:.5rem 0; color:var(--muted); }
section.counts table { table-layout:fixed; } section.counts td { overflow-wrap:anywhere; }
section.counts td.num { width:7rem; } section.counts h2 { margin-top:.2rem; }
div.inline { display:flex; flex-wrap:wrap; gap:.5rem; align-items:end; }
.batch-progress { display:flex; align-items:center; gap:.6rem; min-width:16rem; }
.batch-progress .bar { flex:0 0 10rem; display:flex; height:.8rem; background:var(--line); border-radius:4px; overflow:hidden; }
.batch-progress .seg.succeeded { background:var(--ok); } .batch-progress .seg.dead { background:var(--bad); }
.batch-progress .counts { white-space:nowrap; font-variant-numeric:tabular-nums; }
span.status { font-size:12px; padding:.1rem .45rem; border-radius:999px; background:var(--line); }
span.status.open, span.status.running { background:#dbeafe; } span.status.complete { background:#dcfce7; }
span.status.cancelled { background:#fee2e2; }
table.batches td.mono { max-width:22rem; }
pre.backtrace { max-height:28rem; white-space:pre-wrap; overflow-wrap:anywhere; }
"#;

const JS: &str = r#"
// Live parts of a page carry data-live="<seconds>": fetch the page again
// and swap those parts in place (the rest, e.g. forms, stays as typed).
(function () {
  const live = document.querySelectorAll('[data-live]');
  if (!live.length) return;
  const every = 1000 * Math.max(1, Number(live[0].dataset.live) || 5);
  async function refresh() {
    try {
      const r = await fetch(location.href, { headers: { 'X-Live': '1' }, credentials: 'same-origin' });
      if (r.ok) {
        const doc = new DOMParser().parseFromString(await r.text(), 'text/html');
        for (const el of document.querySelectorAll('[data-live][id]')) {
          const fresh = doc.getElementById(el.id);
          // Never under an operator's hands: a part holding focus or a
          // typed value (a row's reason) waits for the next round.
          const typed = [...el.querySelectorAll('input:not([type=hidden])')].some(i => i.value !== i.defaultValue);
          if (fresh && !el.contains(document.activeElement) && !typed) el.replaceWith(fresh);
        }
      }
    } catch (e) { /* the next round tries again */ }
    setTimeout(refresh, every);
  }
  setTimeout(refresh, every);
})();
"#;

/// `GET /assets/style.css`.
pub(super) async fn css() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS)
}

/// `GET /assets/app.js`.
pub(super) async fn js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        JS,
    )
}

/// The page shell: navigation, the read-only/actions badge, the body;
/// bidi controls anywhere in its text are shown as escapes
/// ([`neutralise_bidi`]).
pub(super) fn layout(state: &AppState, title: &str, body: Markup) -> Markup {
    neutralise_bidi(html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · kjob" }
                link rel="stylesheet" href="/assets/style.css";
            }
            body {
                header {
                    a.brand href="/" { "kjob" }
                    a href="/" { "Overview" }
                    a href="/dlq" { "Dead letters" }
                    a href="/batches" { "Batches" }
                    a href="/schedules" { "Schedules" }
                    a href="/workers" { "Workers" }
                    @if state.allow_actions {
                        span.mode.rw { "actions allowed" }
                    } @else {
                        span.mode { "read-only" }
                    }
                }
                @let in_force = state.in_force();
                @if !in_force.is_empty() {
                    div #in-force.in-force role="status" {
                        strong { "In force: " }
                        @for c in &in_force {
                            span.control data-group=(c.group) {
                                @match &c.held {
                                    super::in_force::Held::Schedule(name) => {
                                        "schedule " a href={"/schedules?group=" (super::view::urlencode(&c.group))} { code.schedule { (name) } }
                                    },
                                    super::in_force::Held::Route(topic) => {
                                        "route " a href={"/route?topic=" (super::view::urlencode(topic)) "&group=" (super::view::urlencode(&c.group))} { code.route { (topic) } }
                                    },
                                }
                                " of " code { (c.group) } " paused by " strong { (c.by) }
                                @if let Some(d) = super::view::utc(c.at_ms) { " since " (d) }
                                ": " (c.reason)
                            }
                        }
                    }
                }
                main { (body) }
                script src="/assets/app.js" {}
            }
        }
    })
}
