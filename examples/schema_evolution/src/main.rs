//! # Schema evolution during a rolling deploy
//!
//! Version 2 of `TestOrder` adds `currency` (default "EUR") and drops
//! `legacy_ref` (which had a default). Mid-deploy, a v1 and a v2 producer
//! write to one topic, and an old (v1) and a new (v2) worker share one
//! consumer group. Every record is read by whichever worker owns its
//! partition, in whatever version it was written: Avro resolution fills in
//! defaults and drops unknown fields.
//!
//! Run: `./dev stack up && cargo run -p kjob-example-schema-evolution`

use std::time::Duration;

use kjob::{Job, JobContext, JobError, KafkaConfig, Producer, Worker, WorkerStats};
use serde::{Deserialize, Serialize};

/// The contract as the old binary knows it. Both versions keep their
/// `.avsc` file: the files are the history the registry checks a new
/// version against, and the derive compares each with its struct.
#[derive(Serialize, Deserialize, Job)]
#[job(
    name = "kjob.test.order",
    version = 1,
    key = order_id,
    schema = "../../schemas/kjob.test.order.v1.avsc"
)]
struct OrderV1 {
    order_id: String,
    amount: i64,
    legacy_ref: String,
}

/// The contract as the new binary knows it.
#[derive(Serialize, Deserialize, Job)]
#[job(
    name = "kjob.test.order",
    version = 2,
    key = order_id,
    schema = "../../schemas/kjob.test.order.v2.avsc"
)]
struct OrderV2 {
    order_id: String,
    amount: i64,
    currency: String,
}

async fn old_worker(job: OrderV1, ctx: JobContext) -> Result<(), JobError> {
    println!(
        "old worker (reads v1) <- written as v{}: {} amount {} legacy_ref {:?}",
        ctx.version.unwrap_or(0),
        job.order_id,
        job.amount,
        job.legacy_ref
    );
    Ok(())
}

async fn new_worker(job: OrderV2, ctx: JobContext) -> Result<(), JobError> {
    println!(
        "new worker (reads v2) <- written as v{}: {} amount {} currency {}",
        ctx.version.unwrap_or(0),
        job.order_id,
        job.amount,
        job.currency
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = KafkaConfig::from_env();
    let run = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let topic = format!("examples.evolution.{run}");
    let group = format!("evolution-demo-{run}");
    kjob::topics::create_topics(&config, &[(topic.clone(), 4)]).await?;

    // Two producers of different versions, as during a deploy.
    let old_producer = Producer::new(&config)?;
    let new_producer = Producer::new(&config)?;
    for i in 0..10 {
        let id = format!("order-{i}");
        if i % 2 == 0 {
            old_producer
                .enqueue_to(
                    &topic,
                    &OrderV1 {
                        order_id: id,
                        amount: i,
                        legacy_ref: format!("L-{i}"),
                    },
                )
                .await?;
        } else {
            new_producer
                .enqueue_to(
                    &topic,
                    &OrderV2 {
                        order_id: id,
                        amount: i,
                        currency: "CHF".into(),
                    },
                )
                .await?;
        }
    }

    // Two workers of different versions in one group split the partitions.
    let old = Worker::builder(config.clone(), &group)
        .handle_on(&topic, old_worker)
        .build()?;
    let new = Worker::builder(config.clone(), &group)
        .handle_on(&topic, new_worker)
        .build()?;
    let (old_stats, new_stats) = (old.stats(), new.stats());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (mut rx1, mut rx2) = (stop_rx.clone(), stop_rx);
    let a = tokio::spawn(old.run_until(async move {
        let _ = rx1.changed().await;
    }));
    let b = tokio::spawn(new.run_until(async move {
        let _ = rx2.changed().await;
    }));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while WorkerStats::get(&old_stats.handled) + WorkerStats::get(&new_stats.handled) < 10 {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "not all 10 jobs handled within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop_tx.send(true);
    a.await??;
    b.await??;
    println!(
        "handled by the old worker: {}, by the new worker: {}, dead-lettered: {}",
        WorkerStats::get(&old_stats.handled),
        WorkerStats::get(&new_stats.handled),
        WorkerStats::get(&old_stats.dead_lettered) + WorkerStats::get(&new_stats.dead_lettered)
    );
    Ok(())
}
