//! The handler-crate example's handlers as a worker *process* on the real
//! stack, for the duplicate-delivery test (which must SIGKILL it).
//! Environment: `KJOB_TEST_RENDER_TOPIC`, `KJOB_TEST_MAIL_TOPIC`,
//! `KJOB_TEST_GROUP`, `KJOB_TEST_COMMIT_MS`, `KJOB_DATABASE_URL`.

use std::sync::Arc;
use std::time::Duration;

use kjob::{KafkaConfig, Worker};
use kjob_example_handler_crate::memory::MemoryMailer;
use kjob_example_handler_crate::pg::PgStore;
use kjob_example_handler_crate::{register_on, Deps};

fn env(name: &str) -> anyhow::Result<String> {
    std::env::var(name).map_err(|_| anyhow::anyhow!("missing environment variable {name}"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kjob_integration_tests::init_logging();
    let store = PgStore::connect(&env("KJOB_DATABASE_URL")?).await?;
    let commit = Duration::from_millis(env("KJOB_TEST_COMMIT_MS")?.parse()?);
    let config = KafkaConfig::from_env().set("session.timeout.ms", "6000");
    let deps = Deps {
        store,
        mailer: Arc::new(MemoryMailer::default()),
    };
    let builder = Worker::builder(config, env("KJOB_TEST_GROUP")?).commit_interval(commit);
    register_on(
        builder,
        deps,
        &env("KJOB_TEST_RENDER_TOPIC")?,
        &env("KJOB_TEST_MAIL_TOPIC")?,
    )
    .build()?
    .run()
    .await?;
    Ok(())
}
