//! # Replay is an offset reset
//!
//! After a bug fix you want the jobs since 10:00 handled again. They are
//! still in the log, so replay means committing an earlier position for the
//! group and letting the worker run. This example enqueues ten jobs, marks a
//! point in time, enqueues ten more, handles all twenty, then plans a replay
//! to that time (the dry-run table), applies it, and shows that exactly the
//! ten later jobs run again.
//!
//! Run: `./dev stack up && cargo run -p kjob-example-replay`
//! The CLI equivalent: `kjob replay --group G --topic T --to-datetime ... --execute`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kjob::{Job, JobContext, JobError, KafkaConfig, Producer, Worker};
use kjob_ops::replay::{apply, plan, ReplayTarget};
use serde::{Deserialize, Serialize};

/// Rebuild one entity's read model (`seq` counts the jobs).
#[derive(Serialize, Deserialize, Job)]
#[job(name = "examples.replay", version = 1, key = key)]
struct RebuildProjection {
    key: String,
    seq: i64,
    behaviour: String,
}

/// Runs a worker until `n` jobs were handled, printing each.
async fn run_worker(config: &KafkaConfig, topic: &str, group: &str, n: u64) -> anyhow::Result<()> {
    let handled = Arc::new(AtomicU64::new(0));
    let h = handled.clone();
    let worker = Worker::builder(config.clone(), group)
        .handle_on(topic, move |job: RebuildProjection, ctx: JobContext| {
            h.fetch_add(1, Ordering::Relaxed);
            println!(
                "  handled job {} (offset {}:{})",
                job.seq, ctx.partition, ctx.offset
            );
            async { Ok::<(), JobError>(()) }
        })
        .commit_interval(Duration::from_millis(200))
        .build()?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(worker.run_until(async {
        let _ = rx.await;
    }));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while handled.load(Ordering::Relaxed) < n {
        anyhow::ensure!(std::time::Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Give the last commit a moment, then stop (which commits again).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = tx.send(());
    task.await??;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = KafkaConfig::from_env();
    let run = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let topic = format!("examples.replay.{run}");
    let group = format!("replay-demo-{run}");
    kjob::topics::create_topics(&config, &[(topic.clone(), 2)]).await?;
    let producer = Producer::new(&config)?;
    let job = |i: i64| RebuildProjection {
        key: format!("k{i}"),
        seq: i,
        behaviour: "ok".into(),
    };
    for i in 0..10 {
        producer.enqueue_to(&topic, &job(i)).await?;
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let cut = kjob::clock::now_ms();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for i in 10..20 {
        producer.enqueue_to(&topic, &job(i)).await?;
    }

    println!("first run: all 20 jobs");
    run_worker(&config, &topic, &group, 20).await?;

    let (cfg, g, t) = (config.clone(), group.clone(), topic.clone());
    let rows = tokio::task::spawn_blocking(move || {
        plan(&cfg, &g, &[t], None, ReplayTarget::ToDatetime(cut))
    })
    .await??;
    println!("replay plan (dry run): partition, committed now -> target, jobs handled again");
    for r in &rows {
        println!(
            "  {}:{}  {:?} -> {}  {}",
            r.topic,
            r.partition,
            r.committed,
            r.target,
            r.replayed()
        );
    }
    let (cfg, g) = (config.clone(), group.clone());
    tokio::task::spawn_blocking(move || apply(&cfg, &g, &rows)).await??;

    println!("after the reset: only the 10 jobs enqueued after the cut run again");
    run_worker(&config, &topic, &group, 10).await?;
    Ok(())
}
