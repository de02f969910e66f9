//! `kjob dlq`: how an operator reviews a DLQ.
//!
//! `list` shows what is unresolved, `show` one record in full, `retry`
//! re-drives (dry run first), and `resolve` closes a record without
//! re-driving it. Every action is audited in `<topic>.dlq.audit`.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{anyhow, bail, Result};
use clap::{Args, Subcommand, ValueEnum};
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Deserialize;

use super::time::{format_ms, parse_time};
use kjob::codec::Codec;
use kjob::config::KafkaConfig;
use kjob::dlq::redrive::{redrive, resolve, target_topic, AuditLog, RedriveTarget};
use kjob::dlq::store::{AuditEntry, Coordinates, DeadLetter, DlqReader, Filter};
use kjob::headers::truncate_utf8;
use kjob::producer::Producer;

#[derive(Subcommand, Debug)]
pub enum DlqCommand {
    /// Unresolved dead letters as a table (all with --all).
    List {
        #[command(flatten)]
        select: Select,
        /// Include records already re-driven or resolved.
        #[arg(long)]
        all: bool,
        /// One JSON array instead of a table, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// One dead letter in full: headers and the payload decoded through the registry, as JSON.
    Show {
        /// DLQ topic or its main topic.
        #[arg(long)]
        topic: String,
        /// `partition:offset` in the DLQ.
        at: Coordinates,
        /// Compact JSON on one line (the default is indented JSON).
        #[arg(long)]
        json: bool,
    },
    /// Re-drive dead letters into the first retry tier (or the main topic). Dry run unless --execute.
    Retry {
        #[command(flatten)]
        select: Select,
        /// Specific records (`partition:offset`); otherwise the filters pick.
        at: Vec<Coordinates>,
        /// Where to send them.
        #[arg(long, value_enum, default_value_t = Target::Retry)]
        to: Target,
        /// Show what would move (the default).
        #[arg(long, conflicts_with = "execute")]
        dry_run: bool,
        /// Actually re-drive.
        #[arg(long)]
        execute: bool,
        /// Records per second at most, to spare a recovering downstream.
        #[arg(long, default_value_t = 100)]
        rate: u32,
        /// Who is doing this (recorded in the audit log).
        #[arg(long, env = "USER", default_value = "unknown")]
        by: String,
    },
    /// Mark dead letters handled without re-driving them (audited).
    Resolve {
        #[command(flatten)]
        select: Select,
        /// Specific records (`partition:offset`); otherwise the filters pick.
        at: Vec<Coordinates>,
        /// Why (required; kept in the audit log).
        #[arg(long)]
        reason: String,
        /// Who is doing this.
        #[arg(long, env = "USER", default_value = "unknown")]
        by: String,
    },
}

/// Which DLQ and which records: the CLI's flags and the dashboard's form
/// fields (empty fields count as absent).
#[derive(Args, Debug, Clone, Default, Deserialize)]
pub struct Select {
    /// DLQ topic or its main topic.
    #[arg(long)]
    pub topic: String,
    /// Only this job name.
    #[arg(long)]
    #[serde(default, deserialize_with = "empty_as_none")]
    pub job: Option<String>,
    /// Only this error class (or family, e.g. `decode`).
    #[arg(long)]
    #[serde(default, deserialize_with = "empty_as_none")]
    pub class: Option<String>,
    /// Dead-lettered at or after (2026-11-29T10:00:00, or 2h for "2 hours ago").
    #[arg(long)]
    #[serde(default, deserialize_with = "empty_as_none")]
    pub since: Option<String>,
    /// Dead-lettered before.
    #[arg(long)]
    #[serde(default, deserialize_with = "empty_as_none")]
    pub until: Option<String>,
}

/// A form field left empty is a filter not given.
pub fn empty_as_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let v: Option<String> = Option::deserialize(d)?;
    Ok(v.map(|s| s.trim().to_string()).filter(|s| !s.is_empty()))
}

/// Where a re-drive sends dead letters (`--to`, the form's `to`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// The shortest retry tier.
    #[default]
    Retry,
    /// The main topic.
    Main,
}

impl Select {
    /// The filter these selections mean; a bad time names its flag.
    pub fn filter(&self) -> Result<Filter> {
        let since_ms = self
            .since
            .as_deref()
            .map(|s| parse_time("--since", s))
            .transpose()?;
        let until_ms = self
            .until
            .as_deref()
            .map(|s| parse_time("--until", s))
            .transpose()?;
        if let (Some(s), Some(u)) = (since_ms, until_ms) {
            if s >= u {
                bail!("--since must be before --until");
            }
        }
        Ok(Filter {
            job: self.job.clone(),
            class: self.class.clone(),
            since_ms,
            until_ms,
        })
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> kjob::Result<T> + Send + 'static,
) -> Result<T> {
    Ok(tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| anyhow!("background task: {e}"))??)
}

fn table(rows: &[(DeadLetter, Option<AuditEntry>)], with_status: bool) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    let mut header = vec![
        "partition:offset",
        "job",
        "key",
        "attempts",
        "error class",
        "error",
        "failed at",
    ];
    if with_status {
        header.push("status");
    }
    t.set_header(header);
    for (d, a) in rows {
        let h = &d.headers;
        let mut row = vec![
            d.at.to_string(),
            h.job.clone().unwrap_or_else(|| "-".into()),
            d.key.clone().unwrap_or_else(|| "-".into()),
            h.attempt.map_or("-".into(), |a| a.to_string()),
            h.error_class.clone().unwrap_or_else(|| "-".into()),
            truncate_utf8(h.error.as_deref().unwrap_or("-"), 60).to_string(),
            format_ms(d.timestamp_ms),
        ];
        if with_status {
            row.push(
                a.as_ref()
                    .map_or("unresolved".into(), |a| format!("{} by {}", a.action, a.by)),
            );
        }
        t.add_row(row);
    }
    t
}

/// The most of an undecodable payload `show` prints as hex: enough to
/// recognise a format, without flooding a terminal with a 1 MB record.
pub const HEX_CAP_BYTES: usize = 4096;

/// An undecodable payload: the reason, the first [`HEX_CAP_BYTES`] as hex,
/// and how much was left out.
pub fn undecodable(reason: &str, payload: Option<&[u8]>) -> serde_json::Value {
    let bytes = payload.unwrap_or(&[]);
    let shown = &bytes[..bytes.len().min(HEX_CAP_BYTES)];
    serde_json::json!({
        "undecodable": reason,
        "size": bytes.len(),
        "hex": shown.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        "hex_omitted_bytes": bytes.len() - shown.len(),
    })
}

/// Where the original of an envelope (a dead letter without its payload)
/// can still be read.
fn omitted_payload(d: &DeadLetter) -> Option<String> {
    d.headers
        .extra
        .iter()
        .find(|(k, _)| k == kjob::dlq::PAYLOAD_OMITTED)
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
}

/// One row of `list --json`.
fn summary(d: &DeadLetter, a: &Option<AuditEntry>) -> serde_json::Value {
    let h = &d.headers;
    serde_json::json!({
        "at": d.at.to_string(),
        "id": h.id,
        "job": h.job,
        "key": d.key,
        "attempt": h.attempt,
        "error_class": h.error_class,
        "error": h.error,
        "failed_at_ms": d.timestamp_ms,
        "payload_omitted": omitted_payload(d),
        "status": a.as_ref().map_or("unresolved".to_string(), |a| a.action.clone()),
        "audit": a,
    })
}

/// The records an action applies to: the named coordinates (all must exist
/// and be unresolved), or every unresolved record passing the filters.
fn pick(
    rows: Vec<(DeadLetter, Option<AuditEntry>)>,
    at: &[Coordinates],
    dlq: &str,
) -> Result<Vec<DeadLetter>> {
    if at.is_empty() {
        return Ok(rows
            .into_iter()
            .filter(|(_, a)| a.is_none())
            .map(|(d, _)| d)
            .collect());
    }
    let mut by_at: HashMap<Coordinates, (DeadLetter, Option<AuditEntry>)> =
        rows.into_iter().map(|(d, a)| (d.at, (d, a))).collect();
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for c in at {
        if !seen.insert(*c) {
            continue;
        }
        match by_at.remove(c) {
            None => bail!("no dead letter at {c} in `{dlq}` (or it does not match the filters)"),
            Some((_, Some(a))) => bail!(
                "{c} was already {} by {} at {}",
                a.action,
                a.by,
                format_ms(Some(a.at_ms))
            ),
            Some((d, None)) => out.push(d),
        }
    }
    Ok(out)
}

/// Dead letters passing `select`, each with its audit entry (unresolved
/// only unless `all`): `kjob dlq list` and the dashboard's DLQ browser.
pub async fn list(
    config: &KafkaConfig,
    select: &Select,
    all: bool,
) -> Result<Vec<(DeadLetter, Option<AuditEntry>)>> {
    let filter = select.filter()?;
    let reader = DlqReader::new(config, &select.topic);
    blocking(move || reader.list(&filter, all)).await
}

/// One dead letter in full, as `kjob dlq show` prints it: coordinates, key,
/// headers, the payload decoded through the registry (or capped hex), and
/// its audit entry.
pub async fn show(config: &KafkaConfig, topic: &str, at: Coordinates) -> Result<serde_json::Value> {
    let reader = DlqReader::new(config, topic);
    let dlq = format!("{}.dlq", reader.main_topic());
    let (letters, audit) = blocking(move || Ok((reader.dead_letters()?, reader.audit()?))).await?;
    let Some(d) = letters.into_iter().find(|d| d.at == at) else {
        bail!("no dead letter at {at} in `{dlq}`");
    };
    let codec = Codec::from_config(config)?;
    let payload = match (&d.payload, omitted_payload(&d)) {
        (None, Some(where_)) => serde_json::json!({
            "omitted": format!("the broker refused the full record; the original ({where_}) can still be read there until that topic's retention removes it"),
        }),
        _ => match codec.decode_to_json(d.payload.as_deref()).await {
            Ok(v) => v,
            Err(e) => undecodable(&e.to_string(), d.payload.as_deref()),
        },
    };
    let headers: serde_json::Map<String, serde_json::Value> = {
        use rdkafka::message::Headers;
        let owned = d.headers.to_owned_headers();
        owned
            .iter()
            .map(|h| {
                let v = h.value.map(|v| String::from_utf8_lossy(v).into_owned());
                (h.key.to_string(), serde_json::json!(v))
            })
            .collect()
    };
    Ok(serde_json::json!({
        "dlq": dlq,
        "at": d.at.to_string(),
        "key": d.key,
        "failed_at": format_ms(d.timestamp_ms),
        "headers": headers,
        "payload": payload,
        "audit": audit.get(&at),
    }))
}

/// What a re-drive would move, and where: the dry run.
#[derive(Debug, Clone)]
pub struct RedrivePlan {
    /// The route's main topic.
    pub main: String,
    /// Where the records go.
    pub target_topic: String,
    /// The unresolved dead letters picked.
    pub picked: Vec<DeadLetter>,
}

/// Picks the unresolved records (`at`, or all passing `select`) and resolves
/// the target topic. Nothing is written.
pub async fn plan_redrive(
    config: &KafkaConfig,
    select: &Select,
    at: &[Coordinates],
    to: Target,
) -> Result<RedrivePlan> {
    let filter = select.filter()?;
    let reader = DlqReader::new(config, &select.topic);
    let main = reader.main_topic().to_string();
    let dlq = format!("{main}.dlq");
    let rows = blocking(move || reader.list(&filter, true)).await?;
    let picked = pick(rows, at, &dlq)?;
    let target = match to {
        Target::Retry => RedriveTarget::FirstTier,
        Target::Main => RedriveTarget::Main,
    };
    let (cfg, m) = (config.clone(), main.clone());
    let target_topic = blocking(move || target_topic(&cfg, &m, target)).await?;
    Ok(RedrivePlan {
        main,
        target_topic,
        picked,
    })
}

/// Re-drives the plan at most `rate` records per second, auditing each one
/// as `retried` by `by` in `<topic>.dlq.audit`. `progress` hears the count
/// done after each record; setting `cancel` stops before the next record
/// (what was re-drove stays re-driven and audited). Returns the count done.
pub async fn execute_redrive(
    config: &KafkaConfig,
    plan: &RedrivePlan,
    rate: u32,
    by: &str,
    progress: impl Fn(usize),
    cancel: &AtomicBool,
) -> Result<usize> {
    if rate == 0 {
        bail!("--rate must be at least 1 record per second");
    }
    let producer = Producer::new(config)?;
    let audit = AuditLog::open(config, producer.clone(), &plan.main).await?;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    let mut done = 0;
    for d in &plan.picked {
        tick.tick().await;
        if cancel.load(Ordering::SeqCst) {
            break;
        }
        redrive(&producer, &audit, &plan.main, d, &plan.target_topic, by).await?;
        done += 1;
        progress(done);
    }
    Ok(done)
}

/// Resolves the unresolved records (`at`, or all passing `select`, which
/// then must filter something) with a required `reason`, audited as
/// `resolved` by `by`. Returns the DLQ topic and the count.
pub async fn resolve_records(
    config: &KafkaConfig,
    select: &Select,
    at: &[Coordinates],
    reason: &str,
    by: &str,
) -> Result<(String, usize)> {
    if reason.trim().is_empty() {
        bail!("--reason must say why the records need no re-drive");
    }
    let filter = select.filter()?;
    let no_filter = select.job.is_none()
        && select.class.is_none()
        && select.since.is_none()
        && select.until.is_none();
    if at.is_empty() && no_filter {
        bail!("name the records (partition:offset) or give a filter (--job, --class, --since, --until)");
    }
    let reader = DlqReader::new(config, &select.topic);
    let main = reader.main_topic().to_string();
    let dlq = format!("{main}.dlq");
    let rows = blocking(move || reader.list(&filter, true)).await?;
    let picked = pick(rows, at, &dlq)?;
    let producer = Producer::new(config)?;
    let audit = AuditLog::open(config, producer, &main).await?;
    for d in &picked {
        resolve(&audit, d.at, by, reason).await?;
    }
    Ok((dlq, picked.len()))
}

pub async fn run(config: &KafkaConfig, cmd: DlqCommand) -> Result<()> {
    match cmd {
        DlqCommand::List { select, all, json } => {
            let rows = list(config, &select, all).await?;
            if json {
                let out: Vec<serde_json::Value> = rows.iter().map(|(d, a)| summary(d, a)).collect();
                println!("{}", serde_json::to_string(&out)?);
                return Ok(());
            }
            println!("{}", table(&rows, all));
            let unresolved = rows.iter().filter(|(_, a)| a.is_none()).count();
            println!("{} shown, {unresolved} unresolved", rows.len());
            Ok(())
        }
        DlqCommand::Show { topic, at, json } => {
            let out = show(config, &topic, at).await?;
            if json {
                println!("{}", serde_json::to_string(&out)?);
            } else {
                println!("{}", serde_json::to_string_pretty(&out)?);
            }
            Ok(())
        }
        DlqCommand::Retry {
            select,
            at,
            to,
            dry_run: _,
            execute,
            rate,
            by,
        } => {
            if rate == 0 {
                bail!("--rate must be at least 1 record per second");
            }
            let plan = plan_redrive(config, &select, &at, to).await?;
            let rows: Vec<(DeadLetter, Option<AuditEntry>)> =
                plan.picked.iter().cloned().map(|d| (d, None)).collect();
            println!("{}", table(&rows, false));
            if !execute {
                println!(
                    "dry run: {} record(s) would be re-driven to `{}`; pass --execute to do it",
                    plan.picked.len(),
                    plan.target_topic
                );
                return Ok(());
            }
            let bar = ProgressBar::new(plan.picked.len() as u64).with_style(
                ProgressStyle::with_template("re-drive [{bar:30}] {pos}/{len} {per_sec}")?,
            );
            let never = AtomicBool::new(false);
            let done = execute_redrive(
                config,
                &plan,
                rate,
                &by,
                |n| bar.set_position(n as u64),
                &never,
            )
            .await?;
            bar.finish();
            println!("re-drove {done} record(s) to `{}`", plan.target_topic);
            Ok(())
        }
        DlqCommand::Resolve {
            select,
            at,
            reason,
            by,
        } => {
            let (dlq, n) = resolve_records(config, &select, &at, &reason, &by).await?;
            println!("resolved {n} record(s) in `{dlq}`");
            Ok(())
        }
    }
}
