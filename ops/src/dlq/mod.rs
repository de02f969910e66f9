//! Dead letters as data: which records a selection picks, one record in
//! full (payload decoded through the registry), and the audited re-drive
//! and resolve. `kjob dlq` prints these; the dashboard renders them.
//!
//! Underneath: [`store`] reads a DLQ and its audit trail, [`redrive`]
//! writes re-drives and audit entries. Writing dead letters is the
//! worker's, in kjob ([`kjob::dlq`]).

pub mod redrive;
pub mod store;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use serde::Deserialize;

use crate::terminal::{for_terminal, CELL_WIDTH};
use crate::time::{format_ms, parse_time};
use kjob::codec::Codec;
use kjob::config::KafkaConfig;
use kjob::producer::Producer;
use redrive::{redrive, resolve, target_topic, AuditLog, RedriveTarget};
use store::{AuditEntry, Coordinates, DeadLetter, DlqReader, Filter};

/// Which DLQ and which records: the CLI's flags and the dashboard's form
/// fields (empty fields count as absent).
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct Select {
    /// DLQ topic or its main topic.
    #[cfg_attr(feature = "clap", arg(long))]
    #[serde(default)]
    pub topic: String,
    /// Only this job name.
    #[cfg_attr(feature = "clap", arg(long))]
    #[serde(default, deserialize_with = "empty_as_none")]
    pub job: Option<String>,
    /// Only this error class (or family, e.g. `decode`).
    #[cfg_attr(feature = "clap", arg(long))]
    #[serde(default, deserialize_with = "empty_as_none")]
    pub class: Option<String>,
    /// Dead-lettered at or after (2026-11-29T10:00:00, or 2h for "2 hours ago").
    #[cfg_attr(feature = "clap", arg(long))]
    #[serde(default, deserialize_with = "empty_as_none")]
    pub since: Option<String>,
    /// Dead-lettered before.
    #[cfg_attr(feature = "clap", arg(long))]
    #[serde(default, deserialize_with = "empty_as_none")]
    pub until: Option<String>,
}

/// A form field left empty is a filter not given.
pub fn empty_as_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let v: Option<String> = Option::deserialize(d)?;
    Ok(v.map(|s| s.trim().to_string()).filter(|s| !s.is_empty()))
}

/// Where a re-drive sends dead letters (`--to`, the form's `to`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
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
pub fn omitted_payload(d: &DeadLetter) -> Option<String> {
    d.headers
        .extra
        .iter()
        .find(|(k, _)| k == kjob::dlq::PAYLOAD_OMITTED)
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
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
            // The audit entry is a record anyone with write access to the
            // audit topic chose; the message reaches terminals and pages.
            Some((_, Some(a))) => bail!(
                "{c} was already {} by {} at {}",
                for_terminal(&a.action, CELL_WIDTH),
                for_terminal(&a.by, CELL_WIDTH),
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
        // A job enqueued from SQL that did not fit its contract: the JSON as
        // the application wrote it (`kjob dlq retry` encodes it first).
        (Some(bytes), None) if redrive::is_json(&d) => {
            match serde_json::from_slice::<serde_json::Value>(bytes) {
                Ok(v) => v,
                Err(e) => undecodable(&format!("marked JSON but does not parse: {e}"), Some(bytes)),
            }
        }
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
        "payload_format": if redrive::is_json(&d) { "json" } else { "avro" },
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
