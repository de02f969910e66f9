//! # Enqueue in your database transaction
//!
//! `place_order` is what a web request handler does: it saves the order and
//! enqueues the confirmation mail **in one PostgreSQL transaction**, through
//! the outbox. If the order is not saved, no mail job exists; if it is, the
//! mail job exists too, whatever happens to the process or the broker
//! afterwards. A relay publishes committed jobs to Kafka; here it runs in
//! this process next to the worker that sends the mail.
//!
//! Run: `./dev stack up && cargo run -p kjob-example-outbox`
//! (`KJOB_DATABASE_URL` points elsewhere; in production run the relay as
//! `kjob outbox relay --database-url ...` or next to your worker.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use kjob::outbox::{Outbox, Relay};
use kjob::{Job, JobContext, JobError, KafkaConfig, Worker};
use serde::{Deserialize, Serialize};
use tokio_postgres::{Client, NoTls};

/// The mail job: a reference to the order, not a copy of it.
#[derive(Serialize, Deserialize, Job)]
#[job(
    name = "examples.outbox.order_confirmation",
    version = 1,
    key = order_id,
    tenant = tenant,
    namespace = "kjob.examples.orders"
)]
struct SendOrderConfirmation {
    order_id: String,
    tenant: String,
    #[job(default = "en")]
    locale: String,
}

/// The web request: save the order and enqueue its mail, atomically.
async fn place_order(
    db: &mut Client,
    outbox: &Outbox,
    email: &str,
    total_cents: i64,
) -> anyhow::Result<String> {
    let order_id = uuid::Uuid::now_v7().to_string();
    let tx = db.transaction().await?;
    tx.execute(
        "INSERT INTO shop_orders (id, email, total_cents) VALUES ($1, $2, $3)",
        &[&order_id, &email, &total_cents],
    )
    .await
    .context("saving the order")?; // dropping `tx` rolls back: no order, no mail
    let job = SendOrderConfirmation {
        order_id: order_id.clone(),
        tenant: "shop-1".into(),
        locale: "en".into(),
    };
    outbox.enqueue(&tx, &job).await?; // last step before COMMIT
    tx.commit().await?;
    Ok(order_id)
}

/// The worker that sends the mail of order `placed`, counting it in `sent`.
fn mailer(config: KafkaConfig, placed: String, sent: Arc<AtomicU64>) -> anyhow::Result<Worker> {
    Ok(Worker::builder(config, "examples.outbox.mailer")
        .handle(move |job: SendOrderConfirmation, ctx: JobContext| {
            let (sent, placed) = (sent.clone(), placed.clone());
            async move {
                if job.order_id == placed {
                    println!("mail for order {} sent (job {})", job.order_id, ctx.id);
                    sent.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<(), JobError>(())
            }
        })
        .build()?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = KafkaConfig::from_env();
    // `KJOB_DESCRIBE=json`: the worker's model, before any setup.
    if kjob::deployment::describe_requested()? {
        let worker = mailer(config, String::new(), Arc::default())?;
        println!("{}", worker.deployment().to_json());
        return Ok(());
    }
    let url = std::env::var("KJOB_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:54329/kjob".into());
    let (mut db, connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .with_context(|| format!("connecting to {url} (is the stack up? ./dev stack up)"))?;
    tokio::spawn(connection);

    // Setup, normally migrations: the app's table, the outbox, the topic.
    // Under kjob's DDL lock (`kjob::ddl`), so copies of this program that
    // start together do not race on CREATE TABLE IF NOT EXISTS.
    kjob::ddl::create_serialised(
        &db,
        "CREATE TABLE IF NOT EXISTS shop_orders (
             id text PRIMARY KEY,
             email text NOT NULL,
             total_cents bigint NOT NULL CHECK (total_cents > 0))",
    )
    .await?;
    let outbox = Outbox::new(&config)?;
    outbox.migrate(&db).await?;
    kjob::topics::create_topics(&config, &[(SendOrderConfirmation::NAME.to_string(), 3)]).await?;

    let placed = place_order(&mut db, &outbox, "ada@example.com", 4_200).await?;
    println!("order {placed} saved; its mail job committed with it");
    match place_order(&mut db, &outbox, "bob@example.com", 0).await {
        Ok(id) => println!("unexpected: order {id} saved"),
        Err(e) => println!("order refused ({e:#}); no mail job was enqueued either"),
    }

    // The relay publishes committed outbox rows; the worker sends the mail.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let relay = tokio::spawn(Relay::new(&url, config.clone()).run_until(async {
        let _ = stopped.await;
    }));
    let mails = Arc::new(AtomicU64::new(0));
    let worker = mailer(config, placed, mails.clone())?;
    let waiting = mails.clone();
    worker
        .run_until(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while waiting.load(Ordering::Relaxed) == 0 && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await?;
    let _ = stop.send(());
    relay.await??;
    anyhow::ensure!(
        mails.load(Ordering::Relaxed) == 1,
        "the mail job did not arrive within 60 s"
    );
    Ok(())
}
