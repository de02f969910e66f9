//! The worker binary of the handler crate: real PostgreSQL, a mailer that
//! logs, and the crate's own `register`. Runs until SIGTERM/SIGINT.
//!
//! ```text
//! ./dev stack up
//! KJOB_DATABASE_URL=postgres://postgres@127.0.0.1:54329/kjob cargo run -p kjob-example-handler-crate
//! curl -s 127.0.0.1:9464/metrics | grep kjob_
//! ```

use std::sync::Arc;

use futures::future::BoxFuture;
use kjob::{KafkaConfig, Worker};
use kjob_example_handler_crate::deps::{MailError, Mailer};
use kjob_example_handler_crate::pg::PgStore;
use kjob_example_handler_crate::{register, Deps};

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
    let url = std::env::var("KJOB_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:54329/kjob".into());
    let store = PgStore::connect(&url).await?;
    let config = KafkaConfig::from_env();
    kjob::topics::create_topics(
        &config,
        &[("invoices.render".into(), 6), ("invoices.mail".into(), 6)],
    )
    .await?;
    let deps = Deps {
        store,
        mailer: Arc::new(LogMailer),
    };
    register(Worker::builder(config, "invoices"), deps)
        .build()?
        .run()
        .await?;
    Ok(())
}
