//! `kjob ui`: a web dashboard for operators, served by the CLI.
//!
//! Server-rendered HTML (maud escapes everything taken from records), a few
//! lines of plain JavaScript that refresh the live parts of a page, and
//! assets compiled into the binary. Every number comes from the same
//! functions the terminal commands use (`status`, `dlq`, `replay`), so the
//! page and `kjob status` cannot disagree. Read-only unless started with
//! `--allow-actions`; an access token is required off loopback.

mod actions;
mod assets;
mod auth;
mod dead_letters;
mod pages;
mod route;
mod sampler;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use axum::routing::{get, post};
use axum::Router;
use clap::Args;

use kjob::config::KafkaConfig;

pub use sampler::{RouteKey, RouteView};

/// `kjob ui`'s flags.
#[derive(Args, Debug)]
pub struct UiArgs {
    /// Address to serve on. Anything but loopback needs --token.
    #[arg(long, default_value = "127.0.0.1:9470")]
    listen: SocketAddr,
    /// Access token every request must carry (`?token=` once, then a
    /// cookie; or `Authorization: Bearer`). Required off loopback.
    #[arg(long, env = "KJOB_UI_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Show the re-drive and resolve buttons and accept their POSTs
    /// (read-only otherwise: the POST endpoints answer 403).
    #[arg(long)]
    allow_actions: bool,
    /// A route to show even while its group has no members, as
    /// TOPIC=GROUP (repeatable). Routes of groups with live members are
    /// found on their own.
    #[arg(long = "route", value_name = "TOPIC=GROUP", value_parser = parse_route)]
    routes: Vec<RouteKey>,
    /// Show only the --route routes (no discovery from live groups).
    #[arg(long)]
    no_discover: bool,
    /// How often to sample lag and rates (the sparklines' resolution).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    sample_every: Duration,
    /// Who the audit log names for actions taken on this dashboard.
    #[arg(long, env = "USER", default_value = "unknown")]
    by: String,
}

fn parse_route(s: &str) -> Result<RouteKey, String> {
    match s.split_once('=') {
        Some((t, g)) if !t.trim().is_empty() && !g.trim().is_empty() => Ok(RouteKey {
            topic: t.trim().to_string(),
            group: g.trim().to_string(),
        }),
        _ => Err(format!(
            "`{s}` is not TOPIC=GROUP, e.g. orders.confirmation=kjob-demo"
        )),
    }
}

/// Everything a request handler reads.
pub struct AppState {
    config: KafkaConfig,
    allow_actions: bool,
    token: Option<String>,
    /// The anti-CSRF token every form carries (random per process).
    csrf: String,
    by: String,
    routes: RwLock<Vec<RouteView>>,
    /// Why the last sampling round could not list topics or groups.
    problem: RwLock<Option<String>>,
    sample_every: Duration,
    tasks: Mutex<HashMap<u64, Arc<actions::Task>>>,
}

type Shared = Arc<AppState>;

/// Checks the flags, starts the sampler and serves until interrupted.
pub async fn run(config: &KafkaConfig, args: UiArgs) -> Result<()> {
    let token = args.token.filter(|t| !t.is_empty());
    if !args.listen.ip().is_loopback() && token.is_none() {
        bail!(
            "--listen {} is not a loopback address, so the dashboard needs an access token: pass --token or set KJOB_UI_TOKEN",
            args.listen
        );
    }
    if args.sample_every < Duration::from_millis(200) {
        bail!("--sample-every must be at least 200ms");
    }
    let state = Arc::new(AppState {
        config: config.clone(),
        allow_actions: args.allow_actions,
        token,
        csrf: uuid::Uuid::new_v4().simple().to_string(),
        by: args.by,
        routes: RwLock::new(Vec::new()),
        problem: RwLock::new(None),
        sample_every: args.sample_every,
        tasks: Mutex::new(HashMap::new()),
    });
    sampler::spawn(state.clone(), args.routes, !args.no_discover);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    let mode = if args.allow_actions {
        "actions allowed"
    } else {
        "read-only"
    };
    // The token is not printed: whoever started the dashboard knows it.
    println!("kjob ui: http://{addr}/ ({mode})");
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .context("serving the dashboard")
}

fn router(state: Shared) -> Router {
    Router::new()
        .route("/", get(pages::overview))
        .route("/route", get(route::route))
        .route("/replay", get(route::replay))
        .route("/dlq", get(dead_letters::dlq_list))
        .route("/dlq/show", get(dead_letters::dlq_show))
        .route("/dlq/redrive", post(actions::redrive))
        .route("/dlq/resolve", post(actions::resolve))
        .route("/tasks/{id}", get(actions::task_page))
        .route("/tasks/{id}/cancel", post(actions::cancel))
        .route("/assets/style.css", get(assets::css))
        .route("/assets/app.js", get(assets::js))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::guard,
        ))
        .with_state(state)
}

impl AppState {
    fn route_view(&self, topic: &str, group: &str) -> Option<RouteView> {
        self.routes
            .read()
            .ok()?
            .iter()
            .find(|r| r.key.topic == topic && r.key.group == group)
            .cloned()
    }
}
