//! Dead letters as data: which records a selection picks, one record in
//! full (payload decoded through the registry), and the audited re-drive
//! and resolve. `kjob dlq` prints these; the dashboard renders them.
//!
//! Underneath: [`store`] reads a DLQ and its audit trail, [`redrive`](mod@redrive)
//! writes re-drives and audit entries. Writing dead letters is the
//! worker's, in kjob ([`kjob::dlq`]).

pub mod index;
pub mod precheck;
pub mod redrive;
pub mod store;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use serde::Deserialize;

use crate::problem::Problem;
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
    /// Only this record key, exactly (what happened to order 4711?).
    #[cfg_attr(feature = "clap", arg(long, value_name = "KEY"))]
    #[serde(default, deserialize_with = "empty_as_none")]
    pub key: Option<String>,
    /// Only records whose key, job id, error or payload text contains TEXT
    /// (the dashboard's search).
    #[cfg_attr(feature = "clap", arg(long, value_name = "TEXT"))]
    #[serde(default, deserialize_with = "empty_as_none")]
    pub grep: Option<String>,
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
            key: self.key.clone(),
            grep: self.grep.clone(),
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
    // An earlier dead letter of a job dead-lettered again: the operator
    // acts on the job's newest one, which the list shows.
    let newer: HashMap<Coordinates, Coordinates> = rows
        .iter()
        .flat_map(|(d, _)| d.earlier.iter().map(|e| (*e, d.at)))
        .collect();
    let mut by_at: HashMap<Coordinates, (DeadLetter, Option<AuditEntry>)> =
        rows.into_iter().map(|(d, a)| (d.at, (d, a))).collect();
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for c in at {
        if !seen.insert(*c) {
            continue;
        }
        if let Some(n) = newer.get(c) {
            bail!("{c} is an earlier dead letter of a job that was dead-lettered again at {n}: act on {n}, which carries its history (`kjob dlq show --topic {dlq} {n}`)");
        }
        match by_at.remove(c) {
            None => {
                return Err(Problem::not_found(format!(
                    "no dead letter at {c} in `{dlq}` (or it does not match the filters)"
                ))
                .into())
            }
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
/// An unknown `--class` is an error listing the known ones; a missing DLQ
/// an error naming the command that creates it.
pub async fn list(
    config: &KafkaConfig,
    select: &Select,
    all: bool,
) -> Result<Vec<(DeadLetter, Option<AuditEntry>)>> {
    let filter = select.filter()?;
    let rows = read_rows(config, &select.topic, true).await?;
    check_class(select.class.as_deref(), &rows)?;
    Ok(rows
        .into_iter()
        .filter(|(d, a)| filter.matches(d) && (all || a.is_none()))
        .collect())
}

/// Every dead letter of the DLQ of `topic` with its audit entry (all of
/// them with `include_audited`), or the error of a missing DLQ that says
/// what to do (see [`missing_dlq`]).
async fn read_rows(
    config: &KafkaConfig,
    topic: &str,
    include_audited: bool,
) -> Result<Vec<(DeadLetter, Option<AuditEntry>)>> {
    let reader = DlqReader::new(config, topic);
    let main = reader.main_topic().to_string();
    match blocking(move || reader.list(&Filter::default(), include_audited)).await {
        Err(e)
            if matches!(
                e.downcast_ref::<kjob::Error>(),
                Some(kjob::Error::MissingTopic { .. })
            ) =>
        {
            Err(missing_dlq(config, &main).await)
        }
        other => other,
    }
}

/// The error for a route whose DLQ does not exist: when the main topic
/// exists, the command that creates just the DLQ with the main topic's
/// partition count (what a worker would create); when it does not either,
/// the names near `main`.
pub async fn missing_dlq(config: &KafkaConfig, main: &str) -> anyhow::Error {
    let dlq = kjob::topics::dlq_topic(main);
    let (cfg, m) = (config.clone(), main.to_string());
    let looked =
        tokio::task::spawn_blocking(move || -> kjob::Result<(Option<usize>, Vec<String>)> {
            let parts = kjob::topics::partition_counts(&cfg, &[m])?.pop().flatten();
            let all = if parts.is_none() {
                kjob::topics::list_topics(&cfg)?
            } else {
                Vec::new()
            };
            Ok((parts, all))
        })
        .await;
    let (parts, all) = match looked {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => return e.into(),
        Err(e) => return anyhow!("background task: {e}"),
    };
    match parts {
        Some(n) => Problem::not_found(format!(
            "`{dlq}` (the DLQ of `{main}`) does not exist on {}: nothing was dead-lettered there yet, or the route's workers may not create topics (a worker creates its DLQ at start); create it with `kjob topics create --topic {main} --partitions {n} --tiers none --execute` (the main topic is left alone)",
            config.bootstrap_servers
        ))
        .into(),
        None => {
            let candidates = all
                .iter()
                .map(String::as_str)
                .filter(|t| !t.starts_with("__") && kjob::topics::route_of(t) == *t);
            Problem::not_found(format!(
                "topic `{main}` does not exist on {} (nor its DLQ `{dlq}`){}; check --topic",
                config.bootstrap_servers,
                crate::suggest::did_you_mean(main, candidates)
            ))
            .into()
        }
    }
}

/// Every error class kjob writes, and their families (`permanent`,
/// `decode`, ...): what `--class` may name, besides the classes found in
/// the DLQ itself (another writer's).
pub fn known_classes() -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for c in kjob::ErrorClass::ALL {
        let name = c.as_str();
        if let Some((family, _)) = name.split_once('.') {
            out.push(family.to_string());
        }
        out.push(name.to_string());
    }
    out.sort();
    out.dedup();
    out
}

/// Refuses a `--class` that is neither a known class or family nor a class
/// (or family) of a record in the DLQ, listing the known ones.
fn check_class(class: Option<&str>, rows: &[(DeadLetter, Option<AuditEntry>)]) -> Result<()> {
    let Some(wanted) = class else {
        return Ok(());
    };
    let mut known = known_classes();
    for (d, _) in rows {
        if let Some(c) = d.headers.error_class.as_deref() {
            let mut prefix = String::new();
            for part in c.split('.') {
                if !prefix.is_empty() {
                    prefix.push('.');
                }
                prefix.push_str(part);
                known.push(prefix.clone());
            }
        }
    }
    known.sort();
    known.dedup();
    if known.iter().any(|k| k == wanted) {
        return Ok(());
    }
    let shown: Vec<String> = known.iter().map(|k| for_terminal(k, CELL_WIDTH)).collect();
    let near: Vec<String> = crate::suggest::near(wanted, known.iter().map(String::as_str))
        .iter()
        .map(|n| format!("`{}`", for_terminal(n, CELL_WIDTH)))
        .collect();
    let hint = if near.is_empty() {
        String::new()
    } else {
        format!(" (did you mean {}?)", near.join(" or "))
    };
    Err(Problem::usage(format!(
        "unknown error class `{}`{hint}; known classes: {}",
        for_terminal(wanted, CELL_WIDTH),
        shown.join(", ")
    ))
    .into())
}

/// One dead letter in full, as `kjob dlq show` prints it: coordinates, key,
/// headers, the payload decoded through the registry (or capped hex), and
/// its audit entry.
pub async fn show(config: &KafkaConfig, topic: &str, at: Coordinates) -> Result<serde_json::Value> {
    let reader = DlqReader::new(config, topic);
    let dlq = format!("{}.dlq", reader.main_topic());
    let (letters, audit) = blocking(move || Ok((reader.fetch(&[at])?, reader.audit()?))).await?;
    let Some(d) = letters.into_iter().find(|d| d.at == at) else {
        return Err(Problem::not_found(format!("no dead letter at {at} in `{dlq}`")).into());
    };
    describe(config, &dlq, d, audit.get(&at)).await
}

/// One dead letter in full, read by its coordinates, with the audit entry
/// the caller already knows (the dashboard's index): the detail page reads
/// one record, not the DLQ and its audit trail.
pub async fn show_with_audit(
    config: &KafkaConfig,
    topic: &str,
    at: Coordinates,
    audit: Option<AuditEntry>,
) -> Result<serde_json::Value> {
    let reader = DlqReader::new(config, topic);
    let dlq = format!("{}.dlq", reader.main_topic());
    let letters = blocking(move || reader.fetch(&[at])).await?;
    let Some(d) = letters.into_iter().find(|d| d.at == at) else {
        return Err(Problem::not_found(format!("no dead letter at {at} in `{dlq}`")).into());
    };
    describe(config, &dlq, d, audit.as_ref()).await
}

/// The JSON of one dead letter (see [`show`]).
async fn describe(
    config: &KafkaConfig,
    dlq: &str,
    d: DeadLetter,
    audit: Option<&AuditEntry>,
) -> Result<serde_json::Value> {
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
        "failed_at_ms": d.timestamp_ms,
        "headers": headers,
        "payload_format": if redrive::is_json(&d) { "json" } else { "avro" },
        "payload": payload,
        "audit": audit,
    }))
}

/// What a re-drive would move, and where: the dry run.
#[derive(Debug, Clone)]
pub struct RedrivePlan {
    /// The route's main topic.
    pub main: String,
    /// Where the records go.
    pub target_topic: String,
    /// The unresolved dead letters picked that the reader reads: what a
    /// re-drive sends.
    pub picked: Vec<DeadLetter>,
    /// The ones picked that the reader cannot read: left in place,
    /// unresolved, with the reason ([`precheck`]).
    pub held: Vec<precheck::Held>,
    /// What they were checked against; `None` when nothing was checked.
    pub checked_against: Option<String>,
    /// Why nothing was checked (nothing registered, the registry did not
    /// answer), when nothing was.
    pub not_checked: Option<String>,
}

/// Picks the unresolved records (`at`, or all passing `select`), holds
/// back the ones `reader` cannot read and resolves the target topic.
/// Nothing is written.
pub async fn plan_redrive(
    config: &KafkaConfig,
    select: &Select,
    at: &[Coordinates],
    to: Target,
    reader: &precheck::Reader,
) -> Result<RedrivePlan> {
    let filter = select.filter()?;
    let main = DlqReader::new(config, &select.topic)
        .main_topic()
        .to_string();
    let dlq = format!("{main}.dlq");
    let rows = read_rows(config, &select.topic, true).await?;
    check_class(select.class.as_deref(), &rows)?;
    let rows = rows
        .into_iter()
        .filter(|(d, _)| filter.matches(d))
        .collect();
    let picked = pick(rows, at, &dlq)?;
    plan_redrive_of(config, main, picked, to, reader).await
}

/// The dead letters at `at`, read by their coordinates; an error names the
/// first one that is not stored. Whether they are unresolved is the
/// caller's to check (the dashboard asks its index).
pub async fn fetch(
    config: &KafkaConfig,
    topic: &str,
    at: &[Coordinates],
) -> Result<Vec<DeadLetter>> {
    let reader = DlqReader::new(config, topic);
    let dlq = format!("{}.dlq", reader.main_topic());
    let wanted = at.to_vec();
    let found = blocking(move || reader.fetch(&wanted)).await?;
    if let Some(c) = at.iter().find(|c| !found.iter().any(|d| d.at == **c)) {
        return Err(Problem::not_found(format!("no dead letter at {c} in `{dlq}`")).into());
    }
    Ok(found)
}

/// A re-drive plan of dead letters already picked (the dashboard's
/// selection): holds back the ones `reader` cannot read and resolves the
/// target topic. Nothing is written.
pub async fn plan_redrive_of(
    config: &KafkaConfig,
    main: String,
    picked: Vec<DeadLetter>,
    to: Target,
    reader: &precheck::Reader,
) -> Result<RedrivePlan> {
    let checked = precheck::check(config, &main, picked, reader).await?;
    let picked = checked.pass;
    let target = match to {
        Target::Retry => RedriveTarget::FirstTier,
        Target::Main => RedriveTarget::Main,
    };
    let (cfg, m) = (config.clone(), main.clone());
    let mut groups: Vec<String> = picked
        .iter()
        .filter_map(|d| d.headers.group.clone())
        .collect();
    groups.sort();
    groups.dedup();
    let target_topic = blocking(move || target_topic(&cfg, &m, target, &groups)).await?;
    Ok(RedrivePlan {
        main,
        target_topic,
        picked,
        held: checked.held,
        checked_against: checked.against,
        not_checked: checked.not_checked,
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

/// What a resolve would close: the dry run.
#[derive(Debug, Clone)]
pub struct ResolvePlan {
    /// The route's main topic.
    pub main: String,
    /// The DLQ topic.
    pub dlq: String,
    /// The unresolved dead letters picked (at most the limit).
    pub picked: Vec<DeadLetter>,
    /// How many matched before the limit.
    pub matched: usize,
}

/// Picks the unresolved records to resolve (`at`, or all passing `select`,
/// which then must filter something), the first `limit` of them when
/// given. Nothing is written.
pub async fn plan_resolve(
    config: &KafkaConfig,
    select: &Select,
    at: &[Coordinates],
    limit: Option<usize>,
) -> Result<ResolvePlan> {
    let filter = select.filter()?;
    let no_filter = select.job.is_none()
        && select.class.is_none()
        && select.since.is_none()
        && select.until.is_none()
        && select.key.is_none()
        && select.grep.is_none();
    if at.is_empty() && no_filter {
        return Err(Problem::usage(
            "name the records (partition:offset) or give a filter (--job, --class, --key, --grep, --since, --until)",
        )
        .into());
    }
    let main = DlqReader::new(config, &select.topic)
        .main_topic()
        .to_string();
    let dlq = format!("{main}.dlq");
    let rows = read_rows(config, &select.topic, true).await?;
    check_class(select.class.as_deref(), &rows)?;
    let rows = rows
        .into_iter()
        .filter(|(d, _)| filter.matches(d))
        .collect();
    let mut picked = pick(rows, at, &dlq)?;
    let matched = picked.len();
    if let Some(n) = limit {
        picked.truncate(n);
    }
    Ok(ResolvePlan {
        main,
        dlq,
        picked,
        matched,
    })
}

/// Resolves the plan's records with a required `reason`, audited as
/// `resolved` by `by`. Returns the count.
pub async fn execute_resolve(
    config: &KafkaConfig,
    plan: &ResolvePlan,
    reason: &str,
    by: &str,
) -> Result<usize> {
    if reason.trim().is_empty() {
        return Err(Problem::usage("--reason must say why the records need no re-drive").into());
    }
    let producer = Producer::new(config)?;
    let audit = AuditLog::open(config, producer, &plan.main).await?;
    for d in &plan.picked {
        resolve(&audit, d.at, by, reason).await?;
    }
    Ok(plan.picked.len())
}
