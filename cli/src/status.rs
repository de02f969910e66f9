//! `kjob status`: how a route is doing, read from Kafka alone (no worker
//! needed): every topic of the route by role (main, retry tiers, delay
//! topics, DLQ and its audit, strict order, the group's cron topics), with
//! partitions, records, lag, the age of the oldest pending job and handled
//! per second, plus the DLQ's unresolved count.
//!
//! `--watch` refreshes. On a terminal it redraws in place; into a file or a
//! pipe it appends one report per refresh (one JSON object per line with
//! `--json`) and never writes terminal codes. A refresh that fails is
//! reported and the watch goes on.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::{anyhow, Result};
use clap::Args;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

use crate::output::{json, out, outln};
use crate::Ctx;
use kjob_ops::status::{read_status, RouteStatus};
use kjob_ops::terminal::{for_terminal, LINE_WIDTH};
use kjob_ops::time::format_ms;

#[derive(Args, Debug)]
pub(crate) struct StatusArgs {
    /// Consumer group of the workers (without it: records only, no lag).
    #[arg(long)]
    group: Option<String>,
    /// The route's main topic.
    #[arg(long)]
    topic: String,
    /// Refresh every N seconds until interrupted.
    #[arg(long, value_name = "SECONDS")]
    watch: Option<u64>,
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

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

/// The DLQ line: its counts, that it does not exist, or why it could not
/// be read.
fn dlq_line(status: &RouteStatus) -> String {
    let d = &status.dlq;
    if let Some(e) = &d.error {
        return format!(
            "DLQ `{}`: ERROR, could not be read: {}",
            d.topic,
            for_terminal(e, LINE_WIDTH)
        );
    }
    if !d.exists {
        return format!(
            "DLQ `{}`: does not exist yet (nothing dead-lettered; a worker creates it at start)",
            d.topic
        );
    }
    let unresolved = match (d.unresolved, d.exact) {
        (Some(n), true) => n.to_string(),
        (Some(n), false) => format!("at most {n}"),
        (None, _) => "-".into(),
    };
    format!(
        "DLQ `{}`: {} stored, {unresolved} unresolved",
        d.topic,
        opt(d.stored)
    )
}

fn print(status: &RouteStatus, json_out: bool) -> Result<()> {
    if json_out {
        // The outbox part carries the broker's last error text.
        return json(status);
    }
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "topic",
        "role",
        "partitions",
        "records",
        "lag / waiting",
        "oldest pending",
        "handled/s",
    ]);
    for s in &status.topics {
        let role = match &s.delay {
            Some(d) => format!("{} {d}", s.role),
            None => s.role.clone(),
        };
        t.add_row(vec![
            s.topic.clone(),
            role,
            s.partitions.to_string(),
            s.records.to_string(),
            s.lag_text(),
            s.oldest_pending_seconds
                .map_or("-".into(), |a| format!("{a:.1}s")),
            s.handled_per_second
                .map_or("-".into(), |h| format!("{h:.1}")),
        ]);
    }
    match &status.group {
        Some(g) => outln!("group `{g}`, route `{}`", status.topic)?,
        None => outln!("route `{}` (no --group: records only)", status.topic)?,
    }
    outln!("{t}")?;
    outln!(
        "retried/s {:.1}, dead-lettered/s {:.1}",
        status.retried_per_second,
        status.dead_lettered_per_second
    )?;
    outln!("{}", dlq_line(status))?;
    #[cfg(feature = "postgres")]
    if let Some(outbox) = &status.outbox {
        super::outbox::print_status(outbox)?;
    }
    Ok(())
}

async fn read_once(ctx: &Ctx, args: &StatusArgs, interval: Duration) -> Result<RouteStatus> {
    let (config, group, topic) = (ctx.config.clone(), args.group.clone(), args.topic.clone());
    let kafka = tokio::task::spawn_blocking(move || {
        read_status(&config, group.as_deref(), &topic, interval)
    });
    let status = kafka.await.map_err(|e| anyhow!("background task: {e}"))??;
    Ok(status)
}

pub(crate) async fn run(ctx: &Ctx, args: StatusArgs) -> Result<()> {
    #[cfg(feature = "postgres")]
    let outbox = match &args.database_url {
        Some(url) => Some((
            super::outbox::connect(url).await?,
            kjob::outbox::OutboxTable::new(&args.outbox_table)?,
        )),
        None => None,
    };
    let interval = Duration::from_secs(args.watch.unwrap_or(1).max(1));
    let terminal = std::io::stdout().is_terminal();
    let mut first = true;
    loop {
        let kafka = read_once(ctx, &args, interval);
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
        let mut status = match kafka {
            Ok(s) => s,
            // The first read decides: a typo is an error, not a watch.
            Err(e) if first || args.watch.is_none() => return Err(e),
            Err(e) => {
                let at = format_ms(Some(kjob::clock::now_ms()));
                let text = for_terminal(&format!("{e:#}"), LINE_WIDTH);
                if ctx.json() {
                    json(&serde_json::json!({ "at": at, "error": format!("{e:#}") }))?;
                } else {
                    outln!("{at}: ERROR reading the route: {text}")?;
                }
                tokio::time::sleep(interval).await;
                continue;
            }
        };
        #[cfg(feature = "postgres")]
        {
            status.outbox = outbox_status?;
        }
        if args.watch.is_some() && !ctx.json() {
            if terminal {
                // Redraw in place, on a terminal only.
                out!("\x1b[2J\x1b[H")?;
            } else if !first {
                outln!()?;
            }
            if !terminal {
                outln!("--- {}", format_ms(Some(kjob::clock::now_ms())))?;
            }
        }
        print(&status, ctx.json())?;
        first = false;
        if args.watch.is_none() {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kjob_ops::status::DlqStatus;

    fn status(dlq: DlqStatus) -> RouteStatus {
        RouteStatus {
            group: Some("g".into()),
            topic: "orders".into(),
            topics: Vec::new(),
            retried_per_second: 0.0,
            dead_lettered_per_second: 0.0,
            dlq_unresolved: dlq.unresolved,
            dlq,
            #[cfg(feature = "postgres")]
            outbox: None,
        }
    }

    #[test]
    fn a_failed_dlq_read_is_an_error_not_none() {
        let failed = status(DlqStatus {
            topic: "orders.dlq".into(),
            error: Some("kafka: reading orders.dlq.audit: \x1b[2Jtimed out".into()),
            ..Default::default()
        });
        let line = dlq_line(&failed);
        assert!(
            line.contains("ERROR") && line.contains("timed out"),
            "{line}"
        );
        assert!(!line.contains('\u{1b}'), "made safe: {line:?}");
        let missing = status(DlqStatus {
            topic: "orders.dlq".into(),
            exact: true,
            ..Default::default()
        });
        assert!(dlq_line(&missing).contains("does not exist yet"));
        let bounded = status(DlqStatus {
            topic: "orders.dlq".into(),
            exists: true,
            stored: Some(20_000),
            unresolved: Some(12_000),
            exact: false,
            error: None,
        });
        assert_eq!(
            dlq_line(&bounded),
            "DLQ `orders.dlq`: 20000 stored, at most 12000 unresolved"
        );
    }
}
