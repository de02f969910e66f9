//! # The orders demo: kjob end to end
//!
//! An online shop moves three kinds of follow-up work out of its checkout
//! request: the confirmation mail, the invoice PDF and a CRM sync. This
//! program plays both sides:
//!
//! 1. it **enqueues** N jobs (acknowledged by the broker before it counts them),
//! 2. it runs a **worker** whose handlers simulate real downstreams: a few
//!    milliseconds of latency, an occasional 503 (retried through the
//!    group's shared retry tiers `orders-demo.retry.1s`, `.5s`, `.15s`), and
//!    a rare order that no longer exists (dead-lettered to `<topic>.dlq` at
//!    once),
//! 3. it waits until every job is handled or dead-lettered **and** the
//!    group's committed offsets reach the end of every partition, then prints
//!    a summary.
//!
//! Two scheduling features show on the way: confirmation mails are a
//! `Priority::High` route and CRM syncs `Priority::Low`, so a customer's
//! mail never waits behind a sync backlog; and a few "how was your order?"
//! follow-up mails are enqueued with `enqueue_in` (3 s), through the
//! group's delay buckets `orders-demo.delay.<bucket>`, and run no earlier
//! than that.
//!
//! The layout is the compact one (`shared_retry_tiers_with`,
//! `dlq_partitions`): the three routes share one set of retry tiers and
//! delay buckets of 3 partitions, and their DLQs have one partition each,
//! so the demo leaves 52 partitions behind where tiers and DLQs per route
//! would leave 133 (both counts with the group's 1-partition control topic).
//!
//! Run it with `./dev demo` (starts the local stack if needed).

mod contracts;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Parser;
use comfy_table::Table;
use contracts::{RenderInvoicePdf, SendOrderConfirmation, SyncCustomerToCrm};
use indicatif::{ProgressBar, ProgressStyle};
use kjob::retry::RetryPolicy;
use kjob::{
    Job, JobContext, JobError, KafkaConfig, Priority, Producer, SharedTiers, Worker, WorkerStats,
};
use rand::Rng;

#[derive(Parser, Debug, Clone)]
#[command(about = "kjob demo: enqueue order follow-up jobs and run a worker until all are done")]
struct Args {
    /// How many jobs to enqueue.
    #[arg(long, default_value_t = 10_000)]
    jobs: u64,
    /// Share of attempts failing with a transient 503 (retried).
    #[arg(long, default_value_t = 0.03)]
    transient_rate: f64,
    /// One order in this many no longer exists (dead-lettered).
    #[arg(long, default_value_t = 997)]
    missing_every: u64,
    /// Simulated handler latency, upper bound in milliseconds.
    #[arg(long, default_value_t = 8)]
    max_latency_ms: u64,
    /// Partitions of each main topic when the topics are created.
    #[arg(long, default_value_t = 6)]
    partitions: i32,
    /// Consumer group of the demo worker.
    #[arg(long, default_value = "orders-demo")]
    group: String,
    /// Give up (exit 1) if not done within this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
    /// Print the worker's deployment model (every topic, group, subject) as
    /// JSON and exit, without connecting (the same as `KJOB_DESCRIBE=json`).
    #[arg(long)]
    describe: bool,
}

/// What the simulated downstreams do on one attempt.
#[derive(Clone)]
struct Downstream {
    transient_rate: f64,
    missing_every: u64,
    max_latency_ms: u64,
}

impl Downstream {
    async fn call(&self, entity: &str) -> Result<(), JobError> {
        let (latency, flaky) = {
            let mut rng = rand::rng();
            (
                rng.random_range(1..=self.max_latency_ms.max(1)),
                rng.random_bool(self.transient_rate.clamp(0.0, 1.0)),
            )
        };
        tokio::time::sleep(Duration::from_millis(latency)).await;
        let number: u64 = entity
            .rsplit('-')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(1);
        if self.missing_every > 0 && number.is_multiple_of(self.missing_every) {
            return Err(JobError::not_found(format!(
                "{entity} does not exist any more"
            )));
        }
        if flaky {
            return Err(JobError::server(
                "downstream answered 503 Service Unavailable",
            ));
        }
        Ok(())
    }
}

// Handlers are plain async fns of (job, context); dependencies come in via
// the closure that registers them.
async fn send_confirmation(
    job: SendOrderConfirmation,
    _ctx: JobContext,
    mail: Arc<Downstream>,
) -> Result<(), JobError> {
    mail.call(&job.order_id).await
}

async fn render_invoice(
    job: RenderInvoicePdf,
    _ctx: JobContext,
    pdf: Arc<Downstream>,
) -> Result<(), JobError> {
    pdf.call(&job.order_id).await
}

async fn sync_crm(
    job: SyncCustomerToCrm,
    _ctx: JobContext,
    crm: Arc<Downstream>,
) -> Result<(), JobError> {
    crm.call(&job.customer_id).await
}

fn topics() -> Vec<String> {
    vec![
        SendOrderConfirmation::NAME.to_string(),
        RenderInvoicePdf::NAME.to_string(),
        SyncCustomerToCrm::NAME.to_string(),
    ]
}

/// The demo's retry tiers: short, so a demo run finishes in seconds.
/// Production routes keep the defaults (5 s, 30 s, 5 m, 30 m).
fn retry_policy() -> RetryPolicy {
    RetryPolicy::tiers([
        Duration::from_secs(1),
        Duration::from_secs(5),
        Duration::from_secs(15),
    ])
}

/// Partitions of the shared retry tiers and delay buckets: retries and
/// delayed jobs are a small share of the demo's work, and three partitions
/// still let three workers share it.
const SHARED_PARTITIONS: usize = 3;

/// The main topics, then the group's shared retry tiers and delay buckets:
/// everything the worker's group consumes.
fn consumed_topics(group: &str) -> Vec<String> {
    topics()
        .into_iter()
        .chain(retry_policy().tier_topics(group))
        .chain(kjob::delay::delay_topics(group))
        .collect()
}

async fn enqueue_all(producer: &Producer, n: u64) -> anyhow::Result<u64> {
    let bar = ProgressBar::new(n).with_style(
        ProgressStyle::with_template("enqueue  [{bar:30}] {pos}/{len} {per_sec}")
            .context("progress template")?,
    );
    let mut enqueued = 0;
    let chunk = 1000;
    let mut i = 0;
    while i < n {
        let end = (i + chunk).min(n);
        let (mut mails, mut invoices, mut syncs) = (Vec::new(), Vec::new(), Vec::new());
        for k in i..end {
            let tenant = format!("shop-{}", k % 7);
            match k % 10 {
                0..=4 => mails.push(SendOrderConfirmation {
                    order_id: format!("order-{k}"),
                    tenant,
                    locale: "en".into(),
                }),
                5..=7 => invoices.push(RenderInvoicePdf {
                    order_id: format!("order-{k}"),
                    tenant,
                }),
                _ => syncs.push(SyncCustomerToCrm {
                    customer_id: format!("customer-{}", k % 1500),
                    tenant,
                }),
            }
        }
        let results = futures_join(producer, &mails, &invoices, &syncs).await;
        for r in results {
            r.context("enqueue failed (the broker did not acknowledge the job)")?;
            enqueued += 1;
        }
        bar.set_position(enqueued);
        i = end;
    }
    bar.finish();
    Ok(enqueued)
}

async fn futures_join(
    producer: &Producer,
    mails: &[SendOrderConfirmation],
    invoices: &[RenderInvoicePdf],
    syncs: &[SyncCustomerToCrm],
) -> Vec<kjob::Result<kjob::Enqueued>> {
    let (a, b, c) = tokio::join!(
        producer.enqueue_batch(mails),
        producer.enqueue_batch(invoices),
        producer.enqueue_batch(syncs)
    );
    a.into_iter().chain(b).chain(c).collect()
}

/// The demo's worker: three routes sharing one set of retry tiers and delay
/// buckets, small DLQs, priorities.
fn demo_worker(config: &KafkaConfig, args: &Args) -> anyhow::Result<Worker> {
    let downstream = Arc::new(Downstream {
        transient_rate: args.transient_rate,
        missing_every: args.missing_every,
        max_latency_ms: args.max_latency_ms,
    });
    let (d1, d2, d3) = (downstream.clone(), downstream.clone(), downstream);
    Ok(Worker::builder(config.clone(), &args.group)
        .handle(move |j, c| send_confirmation(j, c, d1.clone()))
        .handle(move |j, c| render_invoice(j, c, d2.clone()))
        .handle(move |j, c| sync_crm(j, c, d3.clone()))
        .retry(retry_policy())
        .priority(SendOrderConfirmation::NAME, Priority::High)
        .priority(SyncCustomerToCrm::NAME, Priority::Low)
        // Only the follow-up mails are delayed.
        .delayed_jobs_on(SendOrderConfirmation::NAME)
        // One set of retry tiers and delay buckets for the three routes, and
        // small DLQs: 52 partitions instead of 133.
        .shared_retry_tiers_with(
            SharedTiers::new()
                .delay_buckets()
                .partitions(SHARED_PARTITIONS),
        )
        .dlq_partitions(1)
        .concurrency(256)
        .build()?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .init();
    let args = Args::parse();
    let config = KafkaConfig::from_env();
    if args.describe {
        println!("{}", demo_worker(&config, &args)?.deployment().to_json());
        return Ok(());
    }
    println!(
        "kjob orders demo: {} jobs, Kafka {}, registry {}",
        args.jobs, config.bootstrap_servers, config.schema_registry_url
    );

    let to_create: Vec<(String, i32)> =
        topics().into_iter().map(|t| (t, args.partitions)).collect();
    kjob::topics::create_topics(&config, &to_create)
        .await
        .context("creating the demo topics")?;

    // The group's delay buckets, for the follow-up mails below (the worker
    // would create them too, but the producer writes before it starts).
    let delays: Vec<(String, i32)> = kjob::delay::delay_topics(&args.group)
        .into_iter()
        .map(|t| (t, SHARED_PARTITIONS as i32))
        .collect();
    let retention = kjob::delay::CREATED_RETENTION.as_millis().to_string();
    kjob::topics::create_topics_with(&config, &delays, &[("retention.ms", &retention)])
        .await
        .context("creating the delay topics")?;
    let delay_names: Vec<String> = delays.into_iter().map(|(t, _)| t).collect();
    kjob::topics::wait_visible(&config, &delay_names).await?;

    // Delayed jobs go where the workers read them: the group's buckets.
    let producer = Producer::new(&config)?.shared_delay_buckets(&args.group);
    // Register the contracts up front: an incompatible schema fails here.
    producer.prepare::<SendOrderConfirmation>().await?;
    producer.prepare::<RenderInvoicePdf>().await?;
    producer.prepare::<SyncCustomerToCrm>().await?;

    let started = Instant::now();
    let mut enqueued = enqueue_all(&producer, args.jobs).await?;
    // Follow-up mails, due 3 s from now: they wait in the delay topics, not
    // in the worker's memory, and do not hold up their order's other jobs.
    const FOLLOW_UPS: u64 = 20;
    for k in 0..FOLLOW_UPS {
        let mail = SendOrderConfirmation {
            order_id: format!("follow-up-{k}"),
            tenant: format!("shop-{}", k % 7),
            locale: "en".into(),
        };
        producer
            .enqueue_in(&mail, Duration::from_secs(3))
            .await
            .context("delayed enqueue failed")?;
        enqueued += 1;
    }
    println!("enqueued {FOLLOW_UPS} follow-up mails due in 3 s (enqueue_in)");

    let worker = demo_worker(&config, &args)?;
    let stats = worker.stats();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run_until(async {
        let _ = stop_rx.await;
    }));

    let handle_started = Instant::now();
    let bar = ProgressBar::new(enqueued).with_style(
        ProgressStyle::with_template("handle   [{bar:30}] {pos}/{len} {per_sec} {msg}")
            .context("progress template")?,
    );
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    let lag_topics = consumed_topics(&args.group);
    let lag = loop {
        let done = WorkerStats::get(&stats.handled) + WorkerStats::get(&stats.dead_lettered);
        bar.set_position(done.min(enqueued));
        bar.set_message(format!(
            "retried {} dead-lettered {}",
            WorkerStats::get(&stats.retried),
            WorkerStats::get(&stats.dead_lettered)
        ));
        if done >= enqueued {
            let (cfg, group, t) = (config.clone(), args.group.clone(), lag_topics.clone());
            let lag =
                tokio::task::spawn_blocking(move || kjob_ops::lag::group_lag(&cfg, &group, &t))
                    .await??;
            if lag.iter().all(|p| p.lag() == 0) {
                break lag;
            }
        }
        if Instant::now() > deadline {
            bar.abandon();
            let _ = stop_tx.send(());
            bail!(
                "not done within {}s: {done} of {enqueued} jobs finished",
                args.timeout_secs
            );
        }
        if running.is_finished() {
            bail!("the worker stopped unexpectedly");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    bar.finish();
    let handle_elapsed = handle_started.elapsed();
    let _ = stop_tx.send(());
    running.await.context("worker task")??;

    let handled = WorkerStats::get(&stats.handled);
    let dead = WorkerStats::get(&stats.dead_lettered);
    let mut summary = Table::new();
    summary.set_header(vec![
        "enqueued",
        "handled",
        "dead-lettered",
        "retried",
        "elapsed",
        "jobs/s (handling)",
    ]);
    summary.add_row(vec![
        enqueued.to_string(),
        handled.to_string(),
        dead.to_string(),
        WorkerStats::get(&stats.retried).to_string(),
        format!("{:.1}s", started.elapsed().as_secs_f64()),
        format!(
            "{:.0}",
            (handled + dead) as f64 / handle_elapsed.as_secs_f64().max(1e-9)
        ),
    ]);
    println!("{summary}");
    // One row per topic; a partition whose commit trails its end offset is
    // listed on its own line so nothing hides in a sum.
    let mut offsets = Table::new();
    offsets.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED);
    offsets.set_header(vec!["topic", "partitions", "records", "committed", "lag"]);
    for topic in &lag_topics {
        let parts: Vec<&kjob::lag::PartitionLag> =
            lag.iter().filter(|p| &p.topic == topic).collect();
        let end: i64 = parts.iter().map(|p| p.end).sum();
        let committed: i64 = parts.iter().map(|p| p.committed.unwrap_or(p.start)).sum();
        let lagging: i64 = parts.iter().map(|p| p.lag()).sum();
        offsets.add_row(vec![
            topic.clone(),
            parts.len().to_string(),
            end.to_string(),
            committed.to_string(),
            lagging.to_string(),
        ]);
        for p in parts.iter().filter(|p| p.lag() > 0) {
            offsets.add_row(vec![
                format!("  partition {}", p.partition),
                String::new(),
                p.end.to_string(),
                p.committed.map_or("-".into(), |c| c.to_string()),
                p.lag().to_string(),
            ]);
        }
    }
    println!("{offsets}");
    let all_committed = lag.iter().all(|p| p.lag() == 0);
    println!(
        "committed offsets == end offsets on every partition: {}",
        if all_committed { "yes" } else { "NO" }
    );
    if handled + dead < enqueued || !all_committed {
        bail!("demo incomplete");
    }
    Ok(())
}
