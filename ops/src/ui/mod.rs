//! The web dashboard for operators: served by `kjob ui`, or by a worker
//! next to its `/metrics` ([`Dashboard::router_on`]).
//!
//! Server-rendered HTML (maud escapes everything taken from records), a few
//! lines of plain JavaScript that refresh the live parts of a page, and
//! assets compiled into the binary. Every number comes from the same
//! functions the terminal commands use (`status`, `dlq`, `replay`), so the
//! page and `kjob status` cannot disagree; the DLQ pages page through an
//! index of the DLQ kept by this process ([`crate::dlq::index`], with the
//! CLI's filter semantics, checked against `Filter::matches` in its tests),
//! and their actions run the CLI's re-drive and resolve. The batches page
//! reads the batch state topic as `kjob batches` does, and cancels as
//! `kjob batches cancel` does; the schedules page reads and steers a
//! group's cron schedules through [`crate::schedules`], and every page
//! shows the paused ones in a banner (`controls`). Read-only unless
//! started with `--allow-actions`; an access token is required off
//! loopback.

mod actions;
mod actor;
mod assets;
mod auth;
mod batches;
mod controls;
mod dead_letters;
mod dlq_query;
mod history;
mod in_force;
mod indexes;
mod pages;
mod route;
mod sampler;
mod schedules;
mod view;
mod waiting;
mod workers;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use axum::routing::{get, post};
use axum::Router;

use kjob::config::KafkaConfig;

pub use actor::ProxyAddr;

/// How long a request waits for a DLQ index that is still reading: a small
/// DLQ is then shown whole at its first request; a large one shows what
/// is read so far, with the progress. (The DLQ pages and the actions on
/// them both wait this long.)
const FIRST_READ_WAIT: Duration = Duration::from_secs(3);
pub use sampler::{RouteKey, RouteView};

/// The dashboard's settings. Build one, then [`Dashboard::serve`] it on its
/// own listener (`kjob ui`) or add [`Dashboard::router_on`] to a worker's
/// HTTP endpoint (`WorkerBuilder::http_routes`), next to `/metrics`.
///
/// Defaults are the safe ones: read-only, no token (so loopback only when
/// served on its own), routes found from live groups, sampled every 5 s.
#[derive(Clone, Debug)]
pub struct Dashboard {
    config: KafkaConfig,
    allow_actions: bool,
    token: Option<String>,
    routes: Vec<RouteKey>,
    discover: bool,
    only_groups: Vec<String>,
    sample_every: Duration,
    by: String,
    proxy: actor::ProxyAuth,
}

impl Dashboard {
    /// A read-only dashboard over the cluster and registry of `config`.
    pub fn new(config: KafkaConfig) -> Self {
        Self {
            config,
            allow_actions: false,
            token: None,
            routes: Vec::new(),
            discover: true,
            only_groups: Vec::new(),
            sample_every: Duration::from_secs(5),
            by: "unknown".into(),
            proxy: actor::ProxyAuth::default(),
        }
    }

    /// Show the re-drive and resolve buttons and accept their POSTs
    /// (otherwise they answer 403).
    pub fn allow_actions(mut self, yes: bool) -> Self {
        self.allow_actions = yes;
        self
    }

    /// The access token every request must carry (`?token=` once, then a
    /// cookie, or `Authorization: Bearer`). An empty token means none.
    pub fn token(mut self, token: Option<String>) -> Self {
        self.token = token.filter(|t| !t.is_empty());
        self
    }

    /// A route to show even while its group has no members.
    pub fn route(mut self, key: RouteKey) -> Self {
        self.routes.push(key);
        self
    }

    /// Whether routes of groups with live members are found on their own
    /// (on by default).
    pub fn discover(mut self, yes: bool) -> Self {
        self.discover = yes;
        self
    }

    /// Finds routes only among these consumer groups (live or idle), not
    /// the whole cluster's: a team's dashboard, or a cluster with many
    /// groups. Empty (the default): every group.
    pub fn groups(mut self, groups: Vec<String>) -> Self {
        self.only_groups = groups;
        self
    }

    /// How often lag and rates are sampled (the sparklines' resolution); at
    /// least 200 ms.
    pub fn sample_every(mut self, every: Duration) -> Self {
        self.sample_every = every;
        self
    }

    /// Who the audit log names for actions taken on this dashboard.
    pub fn by(mut self, who: impl Into<String>) -> Self {
        self.by = who.into();
        self
    }

    /// The request header in which an authenticating reverse proxy names
    /// the signed-in user (`X-Forwarded-User` behind oauth2-proxy), to be
    /// recorded in the audit instead of [`by`](Self::by). Off by default;
    /// it needs [`trusted_proxies`](Self::trusted_proxies), since anyone who
    /// reaches the dashboard directly could send it.
    pub fn user_header(mut self, name: Option<String>) -> Self {
        self.proxy.header = name
            .map(|n| n.trim().to_ascii_lowercase())
            .filter(|n| !n.is_empty());
        self
    }

    /// The addresses (or CIDR blocks) the proxy connects from: the user
    /// header is believed only from these peers, and ignored (the actor is
    /// then [`by`](Self::by)) from any other.
    pub fn trusted_proxies(mut self, addrs: Vec<ProxyAddr>) -> Self {
        self.proxy.trusted = addrs;
        self
    }

    /// The pages as an axum router for a server listening on `listen`,
    /// with the sampler started on the current runtime: for a worker's
    /// endpoint, `WorkerBuilder::http_routes(dashboard.router_on(addr)?)`
    /// beside `.metrics_endpoint(addr)`. The router guards itself (token,
    /// CSRF, read-only). As with [`Dashboard::serve`], an address that is
    /// not loopback needs a [`token`](Self::token): the pages show payloads.
    pub fn router_on(self, listen: SocketAddr) -> Result<Router> {
        if !listen.ip().is_loopback() && self.token.is_none() {
            bail!(
                "{listen} is not a loopback address, so the dashboard needs an access token (kjob ui --token, or KJOB_UI_TOKEN)"
            );
        }
        self.router()
    }

    fn router(self) -> Result<Router> {
        if self.sample_every < Duration::from_millis(200) {
            bail!("--sample-every must be at least 200ms");
        }
        if let Some(h) = &self.proxy.header {
            if self.proxy.trusted.is_empty() {
                bail!("--user-header {h} needs --trusted-proxy: the addresses the authenticating proxy connects from (anyone else could send the header)");
            }
            if axum::http::HeaderName::from_bytes(h.as_bytes()).is_err() {
                bail!("--user-header `{h}` is not a header name");
            }
        }
        let state = Arc::new(AppState {
            config: self.config,
            allow_actions: self.allow_actions,
            token: self.token,
            form_key: auth::new_form_key(),
            by: self.by,
            proxy: self.proxy,
            routes: RwLock::new(Vec::new()),
            problem: RwLock::new(None),
            sample_every: self.sample_every,
            tasks: Mutex::new(HashMap::new()),
            indexes: Mutex::new(HashMap::new()),
            watched: Mutex::new(Default::default()),
            in_force: RwLock::new(Default::default()),
            control_gen: Default::default(),
            control_apply: Mutex::new(()),
            history: Default::default(),
            tenants: Default::default(),
        });
        sampler::spawn(state.clone(), self.routes, self.discover, self.only_groups);
        controls::spawn(state.clone());
        history::spawn(state.clone());
        Ok(router(state))
    }

    /// Serves the dashboard on `listen` until `stop` completes. Anything but
    /// a loopback address needs a token.
    pub async fn serve(
        self,
        listen: SocketAddr,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        let mode = if self.allow_actions {
            "actions allowed"
        } else {
            "read-only"
        };
        let app = self.router_on(listen)?;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        let addr = listener.local_addr()?;
        // The token is not printed: whoever started the dashboard knows it.
        // Where to point the browser; a closed stdout must not stop the
        // dashboard (nor panic as `println!` would).
        {
            use std::io::Write as _;
            let _ = writeln!(std::io::stdout(), "kjob ui: http://{addr}/ ({mode})");
        }
        // The peer address decides whether a proxy's user header counts.
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(stop)
        .await
        .context("serving the dashboard")
    }
}

/// Parses `TOPIC=GROUP` (the CLI's `--route`).
impl std::str::FromStr for RouteKey {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
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
}

/// Everything a request handler reads.
pub(crate) struct AppState {
    config: KafkaConfig,
    allow_actions: bool,
    token: Option<String>,
    /// The key of the anti-CSRF form tokens (random per process; each
    /// session's token is derived from it, see `auth`).
    form_key: Vec<u8>,
    by: String,
    /// Whose user header to believe (see `actor`).
    proxy: actor::ProxyAuth,
    routes: RwLock<Vec<RouteView>>,
    /// Why the last sampling round could not list topics or groups.
    problem: RwLock<Option<String>>,
    sample_every: Duration,
    tasks: Mutex<HashMap<u64, Arc<actions::Task>>>,
    /// The DLQ indexes by main topic, each followed by its own tailer.
    indexes: Mutex<HashMap<String, Arc<crate::dlq::index::DlqIndex>>>,
    /// Groups whose controls are shown though no route names them.
    watched: Mutex<std::collections::BTreeSet<String>>,
    /// The controls in force by group, for every page's banner.
    in_force: RwLock<in_force::InForceMap>,
    /// Bumped by every control action, so that a background refresh read
    /// before it does not overwrite the action's newer read.
    control_gen: std::sync::atomic::AtomicU64,
    /// Held while the banner's controls are replaced, so that a check of
    /// `control_gen` and the write it allows are one step.
    control_apply: Mutex<()>,
    /// The charts' last day, per route and minute.
    history: history::History,
    /// The tenants sharing each fair route, by group, summed over the
    /// group's live workers' heartbeats (see `controls`).
    tenants: RwLock<HashMap<String, Vec<kjob::control::TenantLoad>>>,
}

type Shared = Arc<AppState>;

fn router(state: Shared) -> Router {
    Router::new()
        .route("/", get(pages::overview))
        .route("/route", get(route::route))
        .route("/replay", get(route::replay))
        .route("/route/pause", post(controls::pause_route))
        .route("/route/resume", post(controls::resume_route))
        .route("/waiting", get(waiting::waiting))
        .route("/waiting/act", post(waiting::act))
        .route("/dlq", get(dead_letters::dlq_list))
        .route("/dlq/show", get(dead_letters::dlq_show))
        .route("/dlq/redrive", post(actions::redrive))
        .route("/dlq/resolve", post(actions::resolve))
        .route("/batches", get(batches::list))
        .route("/batches/show", get(batches::show))
        .route("/batches/cancel", post(batches::cancel))
        .route("/workers", get(workers::workers))
        .route("/schedules", get(schedules::list))
        .route("/schedules/pause", post(schedules::pause))
        .route("/schedules/resume", post(schedules::resume))
        .route("/schedules/trigger", post(schedules::trigger))
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
