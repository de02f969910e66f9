//! The worker binary of the handler crate: real PostgreSQL, a mailer that
//! logs, and the crate's own `register`. Runs until SIGTERM/SIGINT.
//!
//! ```text
//! ./dev stack up
//! cargo run -p kjob-example-handler-crate -- --help
//! cargo run -p kjob-example-handler-crate -- --group invoices-staging
//! ```
//!
//! Every flag has an environment variable and a default, so a container
//! image needs no arguments. It needs the topics (created if missing) and
//! PostgreSQL with the crate's tables (created at start); a render job for
//! an order id that has no `orders` row is dead-lettered as not found.

use std::net::SocketAddr;
use std::sync::Arc;

use clap::Parser;

use futures::future::BoxFuture;
use kjob::{KafkaConfig, Worker};
use kjob_example_handler_crate::deps::{MailError, Mailer};
use kjob_example_handler_crate::pg::PgStore;
use kjob_example_handler_crate::{register_on, Deps};

/// Runs the invoice handlers until SIGTERM or SIGINT.
#[derive(Parser, Debug)]
struct Args {
    /// Topic of `RenderInvoice` jobs.
    #[arg(long, env = "KJOB_RENDER_TOPIC", default_value = "invoices.render")]
    render_topic: String,
    /// Topic of `SendInvoiceMail` jobs.
    #[arg(long, env = "KJOB_MAIL_TOPIC", default_value = "invoices.mail")]
    mail_topic: String,
    /// Consumer group.
    #[arg(long, env = "KJOB_GROUP", default_value = "invoices")]
    group: String,
    /// PostgreSQL holding orders, invoices and the processed markers.
    #[arg(
        long,
        env = "KJOB_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:54329/kjob"
    )]
    database_url: String,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    #[arg(long, env = "KJOB_METRICS_ADDR", default_value = "127.0.0.1:9464")]
    metrics: SocketAddr,
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
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .init();
    let args = Args::parse();
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
    let builder = Worker::builder(config, &args.group).metrics_endpoint(args.metrics);
    register_on(builder, deps, &args.render_topic, &args.mail_topic)
        .build()?
        .run()
        .await?;
    Ok(())
}
