//! `kjob ui`: the web dashboard (`kjob_ops::ui`), served by the CLI.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;
use clap::Args;

use crate::Ctx;
use kjob_ops::ui::{Dashboard, ProxyAddr, RouteKey};

/// `kjob ui`'s flags.
#[derive(Args, Debug)]
pub(crate) struct UiArgs {
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
    /// TOPIC=GROUP (repeatable). Routes of groups with live members, and of
    /// kjob groups whose workers are gone, are found on their own.
    #[arg(long = "route", value_name = "TOPIC=GROUP")]
    routes: Vec<RouteKey>,
    /// Find routes only among these consumer groups (repeatable; default: every group).
    #[arg(long = "group", value_name = "GROUP")]
    groups: Vec<String>,
    /// Show only the --route routes (no discovery from live groups).
    #[arg(long)]
    no_discover: bool,
    /// How often to sample lag and rates (the sparklines' resolution).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    sample_every: Duration,
    /// Who the audit log names for actions taken on this dashboard (unless
    /// --user-header names the user).
    #[arg(long, value_name = "NAME", default_value_t = crate::operator::default_name())]
    by: String,
    /// A header in which an authenticating reverse proxy names the
    /// signed-in user (e.g. X-Forwarded-User behind oauth2-proxy): that user
    /// is recorded in the audit instead of --by. Off by default; believed
    /// only from --trusted-proxy addresses.
    #[arg(long, value_name = "HEADER")]
    user_header: Option<String>,
    /// An address or CIDR block the proxy connects from (repeatable), e.g.
    /// 127.0.0.1 or 10.0.0.0/8. From any other peer the --user-header is
    /// ignored and --by is recorded.
    #[arg(long = "trusted-proxy", value_name = "ADDR[/PREFIX]")]
    trusted_proxies: Vec<ProxyAddr>,
}

/// Serves the dashboard until interrupted.
pub(crate) async fn run(ctx: &Ctx, args: UiArgs) -> Result<()> {
    let mut dashboard = Dashboard::new(ctx.config.clone())
        .allow_actions(args.allow_actions)
        .token(args.token)
        .discover(!args.no_discover)
        .groups(args.groups)
        .sample_every(args.sample_every)
        .by(args.by)
        .user_header(args.user_header)
        .trusted_proxies(args.trusted_proxies);
    for r in args.routes {
        dashboard = dashboard.route(r);
    }
    dashboard
        .serve(args.listen, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
}
