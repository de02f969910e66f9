//! The worker binary of the handler crate: real PostgreSQL, a mailer that
//! logs, and the crate's own `register`. Runs until SIGTERM/SIGINT.
//!
//! ```text
//! ./dev stack up
//! cargo run -p kjob-example-handler-crate -- --help
//! KJOB_GROUP=invoices-staging cargo run -p kjob-example-handler-crate
//! ```
//!
//! `kjob schema export --from <this binary>` writes the crate's contracts
//! to `schemas/` (the binary answers `KJOB_SCHEMA_EXPORT=1` and exits).
//!
//! Every setting is an environment variable with a default, so a container
//! image needs no arguments. It needs the topics (created if missing) and
//! PostgreSQL with the crate's tables (created at start); a render job for
//! an order id that has no `orders` row is dead-lettered as not found.

use std::net::SocketAddr;
use std::sync::Arc;

use futures::future::BoxFuture;
use kjob::{KafkaConfig, Worker};
use kjob_example_handler_crate::contracts::CONTRACTS;
use kjob_example_handler_crate::deps::{MailError, Mailer};
use kjob_example_handler_crate::pg::PgStore;
use kjob_example_handler_crate::{register_on, Deps};
use kjob_ops::ui::{Dashboard, RouteKey};

/// The worker's settings, from the environment (a container image needs
/// no arguments). Plain variables rather than a flags parser, so that the
/// handler crate pulls in no CLI dependencies.
struct Settings {
    render_topic: String,
    mail_topic: String,
    group: String,
    database_url: String,
    metrics: SocketAddr,
    /// Serve the operator dashboard beside /metrics (`KJOB_UI=1`).
    ui: bool,
    ui_token: Option<String>,
}

const USAGE: &str = "kjob-example-handler-crate: runs the invoice handlers until SIGTERM or SIGINT.

Environment (default in brackets):
  KJOB_RENDER_TOPIC   topic of RenderInvoice jobs      [invoices.render]
  KJOB_MAIL_TOPIC     topic of SendInvoiceMail jobs    [invoices.mail]
  KJOB_GROUP          consumer group                   [invoices]
  KJOB_DATABASE_URL   PostgreSQL with orders/invoices  [postgres://postgres@127.0.0.1:54329/kjob]
  KJOB_METRICS_ADDR   /metrics, /healthz, /readyz      [127.0.0.1:9464]
  KJOB_UI             1: the read-only dashboard at the same address, for
                      the worker's routes                  [off]
  KJOB_UI_TOKEN       the dashboard's access token (required unless
                      KJOB_METRICS_ADDR is loopback)
  plus KJOB_BOOTSTRAP_SERVERS and KJOB_SCHEMA_REGISTRY_URL";

impl Settings {
    fn from_env() -> anyhow::Result<Self> {
        let var = |name: &str, default: &str| {
            std::env::var(name)
                .ok()
                .filter(|v| !v.trim().is_empty())
                .unwrap_or_else(|| default.to_string())
        };
        let metrics = var("KJOB_METRICS_ADDR", "127.0.0.1:9464");
        Ok(Self {
            render_topic: var("KJOB_RENDER_TOPIC", "invoices.render"),
            mail_topic: var("KJOB_MAIL_TOPIC", "invoices.mail"),
            group: var("KJOB_GROUP", "invoices"),
            database_url: var(
                "KJOB_DATABASE_URL",
                "postgres://postgres@127.0.0.1:54329/kjob",
            ),
            metrics: metrics.parse().map_err(|e| {
                anyhow::anyhow!("KJOB_METRICS_ADDR=`{metrics}` is not host:port ({e})")
            })?,
            ui: var("KJOB_UI", "0") == "1",
            ui_token: std::env::var("KJOB_UI_TOKEN").ok(),
        })
    }
}

/// Stands in for an SMTP client.
struct LogMailer;

impl Mailer for LogMailer {
    fn send(&self, to: &str, subject: &str) -> BoxFuture<'_, Result<(), MailError>> {
        tracing::info!(to, subject, "mail sent");
        Box::pin(async { Ok(()) })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Run by `kjob schema export --from ...`: print the contracts, stop.
    if kjob::schema::export::serve(CONTRACTS) {
        return Ok(());
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .init();
    if std::env::args().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return Ok(());
    }
    let args = Settings::from_env()?;
    let store = PgStore::connect(&args.database_url).await?;
    let config = KafkaConfig::from_env();
    kjob::topics::create_topics(
        &config,
        &[(args.render_topic.clone(), 6), (args.mail_topic.clone(), 6)],
    )
    .await?;
    let deps = Deps {
        store,
        mailer: Arc::new(LogMailer),
    };
    let mut builder = Worker::builder(config.clone(), &args.group).metrics_endpoint(args.metrics);
    if args.ui {
        // The same pages as `kjob ui`, read-only, on the metrics address.
        let mut dashboard = Dashboard::new(config).token(args.ui_token);
        for topic in [&args.render_topic, &args.mail_topic] {
            dashboard = dashboard.route(RouteKey {
                topic: topic.clone(),
                group: args.group.clone(),
            });
        }
        builder = builder.http_routes(dashboard.router_on(args.metrics)?);
    }
    register_on(builder, deps, &args.render_topic, &args.mail_topic)
        .build()?
        .run()
        .await?;
    Ok(())
}
