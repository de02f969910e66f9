//! `kjob status`: how a route is doing, read from Kafka alone (no worker
//! needed): per topic of the route (main and retry tiers) the partitions,
//! lag, age of the oldest pending job and handled per second, plus the
//! unresolved DLQ count. `--watch` refreshes; `--json` is for scripts.

use std::time::Duration;

use anyhow::{anyhow, Result};
use clap::Args;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

use kjob::config::KafkaConfig;
use kjob_ops::status::{read_status, RouteStatus};

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Consumer group of the workers.
    #[arg(long)]
    group: String,
    /// The route's main topic.
    #[arg(long)]
    topic: String,
    /// Refresh every N seconds until interrupted.
    #[arg(long, value_name = "SECONDS")]
    watch: Option<u64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also show the transactional outbox in this PostgreSQL database
    /// (unsent rows, relay lag, publish rate, relays).
    #[cfg(feature = "postgres")]
    #[arg(long = "database-url")]
    database_url: Option<String>,
    /// The outbox table, with --database-url.
    #[cfg(feature = "postgres")]
    #[arg(long, default_value = kjob::outbox::DEFAULT_TABLE)]
    outbox_table: String,
}

fn print(status: &RouteStatus, json: bool) -> Result<()> {
    if json {
        // The outbox part carries the broker's last error text.
        println!(
            "{}",
            kjob_ops::terminal::json_for_terminal(&serde_json::to_string(status)?)
        );
        return Ok(());
    }
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "topic",
        "role",
        "partitions",
        "lag / waiting",
        "oldest pending",
        "handled/s",
    ]);
    for s in &status.topics {
        t.add_row(vec![
            s.topic.clone(),
            s.role.clone(),
            s.partitions.to_string(),
            s.lag.to_string(),
            format!("{:.1}s", s.oldest_pending_seconds),
            format!("{:.1}", s.handled_per_second),
        ]);
    }
    println!("group `{}`, route `{}`", status.group, status.topic);
    println!("{t}");
    println!(
        "retried/s {:.1}, dead-lettered/s {:.1}",
        status.retried_per_second, status.dead_lettered_per_second
    );
    match status.dlq_unresolved {
        Some(n) => println!("DLQ `{}.dlq`: {n} unresolved", status.topic),
        None => println!("DLQ `{}.dlq`: none", status.topic),
    }
    #[cfg(feature = "postgres")]
    if let Some(outbox) = &status.outbox {
        super::outbox::print_status(outbox);
    }
    Ok(())
}

pub async fn run(config: &KafkaConfig, args: StatusArgs) -> Result<()> {
    #[cfg(feature = "postgres")]
    let outbox = match &args.database_url {
        Some(url) => Some((
            super::outbox::connect(url).await?,
            kjob::outbox::OutboxTable::new(&args.outbox_table)?,
        )),
        None => None,
    };
    let interval = Duration::from_secs(args.watch.unwrap_or(1).max(1));
    loop {
        let (config, group, topic) = (config.clone(), args.group.clone(), args.topic.clone());
        let kafka =
            tokio::task::spawn_blocking(move || read_status(&config, &group, &topic, interval));
        #[cfg(feature = "postgres")]
        let (kafka, outbox_status) = {
            let read = async {
                match &outbox {
                    Some((client, table)) => {
                        kjob::outbox::read_status(client, table, Some(&args.topic), interval)
                            .await
                            .map(Some)
                    }
                    None => Ok(None),
                }
            };
            tokio::join!(kafka, read)
        };
        #[cfg(not(feature = "postgres"))]
        let kafka = kafka.await;
        #[allow(unused_mut)]
        let mut status = kafka.map_err(|e| anyhow!("background task: {e}"))??;
        #[cfg(feature = "postgres")]
        {
            status.outbox = outbox_status?;
        }
        if args.watch.is_some() && !args.json {
            print!("\x1b[2J\x1b[H");
        }
        print(&status, args.json)?;
        if args.watch.is_none() {
            return Ok(());
        }
    }
}
