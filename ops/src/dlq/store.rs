//! Reading a DLQ and its audit trail, for operators.
//!
//! A dead letter is never deleted. What an operator did with it (re-drove
//! it, or resolved it as handled) is recorded in a compacted audit topic
//! `<topic>.dlq.audit`, keyed by the dead letter's `partition:offset`, with
//! who, when and why. The unresolved set, which `kjob dlq list` shows, is the
//! DLQ minus the audited coordinates; `--all` shows both.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use serde::{Deserialize, Serialize};

use kjob::config::KafkaConfig;
use kjob::error::{Error, Result};
use kjob::headers::JobHeaders;
use kjob::topics::{dlq_audit_topic, dlq_topic, partition_counts, read_topic, read_topic_tail};

/// The coordinates of a dead letter inside its DLQ topic: `partition:offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Coordinates {
    /// Partition of the DLQ topic.
    pub partition: i32,
    /// Offset within that partition.
    pub offset: i64,
}

impl fmt::Display for Coordinates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.partition, self.offset)
    }
}

impl FromStr for Coordinates {
    type Err = kjob::Error;
    fn from_str(s: &str) -> std::result::Result<Self, kjob::Error> {
        let invalid = |reason: String| kjob::Error::InvalidSetting {
            name: "dead-letter coordinates".into(),
            value: s.to_string(),
            reason,
        };
        let (p, o) = s
            .split_once(':')
            .ok_or_else(|| invalid("use partition:offset (e.g. 0:42)".into()))?;
        let partition = p
            .trim()
            .parse::<i32>()
            .ok()
            .filter(|p| *p >= 0)
            .ok_or_else(|| invalid(format!("`{p}` is not a partition number")))?;
        let offset = o
            .trim()
            .parse::<i64>()
            .ok()
            .filter(|o| *o >= 0)
            .ok_or_else(|| invalid(format!("`{o}` is not an offset")))?;
        Ok(Coordinates { partition, offset })
    }
}

/// One record of a DLQ.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    /// Where it is in the DLQ.
    pub at: Coordinates,
    /// Record key (UTF-8, lossy).
    pub key: Option<String>,
    /// Parsed kjob headers.
    pub headers: JobHeaders,
    /// The payload exactly as it failed.
    pub payload: Option<Vec<u8>>,
    /// When it was dead-lettered (record timestamp, epoch ms).
    pub timestamp_ms: Option<i64>,
    /// The same job's earlier dead letters (same `kjob-id`), oldest first:
    /// a job dead-lettered again after a re-drive or a replay is one entry,
    /// its newest dead letter, with these as its history. Filled by
    /// [`DlqReader::list`]; empty where records are fetched one by one.
    pub earlier: Vec<Coordinates>,
}

/// For each dead letter that is an earlier copy of a job dead-lettered
/// again (the same `kjob-id` and record key: after a re-drive or a
/// replay), the coordinates of that job's newest dead letter. The newest stands for the
/// job, in a list and in a count of the unresolved ones: whether the job
/// still needs an operator is whether its newest dead letter is audited.
/// Newest is the latest record timestamp, then the highest coordinates.
/// Records without an id are each their own job.
/// The key takes part because an id is only a header: two records that
/// share one but not their key are not one job's copies.
pub fn superseded<'a>(
    records: impl IntoIterator<Item = (Coordinates, &'a str, &'a str, i64)>,
) -> HashMap<Coordinates, Coordinates> {
    let mut newest: HashMap<(&'a str, &'a str), (i64, Coordinates)> = HashMap::new();
    let mut all = Vec::new();
    for (at, id, key, ts) in records {
        if id.is_empty() {
            continue;
        }
        let job = (id, key);
        all.push((at, job));
        let n = newest.entry(job).or_insert((ts, at));
        if (ts, at) > *n {
            *n = (ts, at);
        }
    }
    all.into_iter()
        .filter_map(|(at, job)| {
            let (_, n) = newest.get(&job)?;
            (*n != at).then_some((at, *n))
        })
        .collect()
}

/// What an operator did with a dead letter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// `retried` or `resolved`.
    pub action: String,
    /// Who did it (the `--by` flag, or `$USER`).
    pub by: String,
    /// When (epoch ms).
    pub at_ms: i64,
    /// Why (required for `resolved`).
    pub reason: Option<String>,
    /// Where a re-drive sent it.
    pub target: Option<String>,
}

/// Which dead letters an operation applies to.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only this job name (`kjob-job`).
    pub job: Option<String>,
    /// Only this error class, or a class family: `retryable` matches
    /// `retryable.timeout` too.
    pub class: Option<String>,
    /// Dead-lettered at or after (epoch ms).
    pub since_ms: Option<i64>,
    /// Dead-lettered before (epoch ms).
    pub until_ms: Option<i64>,
    /// Only this record key, exactly (`--key 4711`: what happened to
    /// order 4711?).
    pub key: Option<String>,
    /// Only records whose key, job id, error text or payload text (its
    /// printable runs) contains this text, as the dashboard's search finds
    /// them (`--grep`).
    pub grep: Option<String>,
}

impl Filter {
    /// Whether `d` passes the filter.
    pub fn matches(&self, d: &DeadLetter) -> bool {
        let job_ok = self
            .job
            .as_ref()
            .is_none_or(|j| d.headers.job.as_ref() == Some(j));
        let class_ok = self.class.as_ref().is_none_or(|c| {
            d.headers
                .error_class
                .as_deref()
                .is_some_and(|have| have == c || have.starts_with(&format!("{c}.")))
        });
        let ts = d.timestamp_ms.unwrap_or(0);
        let since_ok = self.since_ms.is_none_or(|s| ts >= s);
        let until_ok = self.until_ms.is_none_or(|u| ts < u);
        let key_ok = self.key.as_ref().is_none_or(|k| d.key.as_ref() == Some(k));
        job_ok && class_ok && since_ok && until_ok && key_ok && self.grep_ok(d)
    }

    /// Whether `--grep` finds its text in `d` (see [`Filter::grep`]).
    fn grep_ok(&self, d: &DeadLetter) -> bool {
        let Some(needle) = self.grep.as_deref() else {
            return true;
        };
        let h = &d.headers;
        [d.key.as_deref(), h.id.as_deref(), h.error.as_deref()]
            .into_iter()
            .flatten()
            .any(|field| field.contains(needle))
            || payload_text(d.payload.as_deref().unwrap_or_default()).contains(needle)
    }
}

/// Bytes of the payload's start from which its printable text is kept
/// (Avro writes strings as raw UTF-8, so ids and names in a payload are
/// found by a search).
pub const PAYLOAD_BYTES: usize = 96;
/// The printable text in the first [`PAYLOAD_BYTES`] of a payload (after a
/// Confluent wire-format header): runs of at least three printable
/// characters, separated by spaces.
pub(crate) fn payload_text(payload: &[u8]) -> String {
    let body = match payload {
        [0, rest @ ..] if rest.len() >= 4 => &rest[4..],
        other => other,
    };
    let head = &body[..body.len().min(PAYLOAD_BYTES)];
    let lossy = String::from_utf8_lossy(head);
    let mut out = String::new();
    let mut run = String::new();
    for c in lossy.chars() {
        if !c.is_control() && c != '\u{fffd}' {
            run.push(c);
            continue;
        }
        if run.chars().count() >= 3 {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(&run);
        }
        run.clear();
    }
    if run.chars().count() >= 3 {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&run);
    }
    out
}

/// What [`DlqReader::count`] counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DlqCount {
    /// Dead letters stored.
    pub stored: i64,
    /// Jobs whose newest dead letter has no audit entry (a job
    /// dead-lettered again counts once).
    pub unresolved: usize,
    /// False when the audit trail holds more entries than were read, or
    /// the DLQ more records, so `unresolved` is an upper bound.
    pub exact: bool,
}

/// `(partition, low, high)` of every partition of `topic`; `None` if it
/// does not exist.
fn watermarks(config: &KafkaConfig, topic: &str) -> Result<Option<Vec<(i32, i64, i64)>>> {
    let Some(parts) = partition_counts(config, &[topic.to_string()])?
        .pop()
        .flatten()
    else {
        return Ok(None);
    };
    let consumer: BaseConsumer = config
        .client_config(&[
            ("group.id", "kjob-cli-reader"),
            ("enable.auto.commit", "false"),
        ])
        .create()
        .map_err(|e| Error::kafka("creating reader", e))?;
    let mut out = Vec::with_capacity(parts);
    for p in 0..parts as i32 {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .map_err(|e| Error::kafka(format!("watermarks of {topic}:{p}"), e))?;
        out.push((p, low, high));
    }
    Ok(Some(out))
}

/// Reads the DLQ of one main topic and its audit trail. Blocking.
pub struct DlqReader {
    config: KafkaConfig,
    main: String,
}

impl DlqReader {
    /// A reader for the DLQ of `topic`. Accepts the main topic or the DLQ
    /// topic itself (`orders.dlq`), the way operators tend to type it.
    pub fn new(config: &KafkaConfig, topic: &str) -> Self {
        let main = topic.strip_suffix(".dlq").unwrap_or(topic).to_string();
        Self {
            config: config.clone(),
            main,
        }
    }

    /// The main topic.
    pub fn main_topic(&self) -> &str {
        &self.main
    }

    /// The DLQ's `(partition, low, high)` watermarks; `None` when the DLQ
    /// topic does not exist.
    pub fn watermarks(&self) -> Result<Option<Vec<(i32, i64, i64)>>> {
        watermarks(&self.config, &dlq_topic(&self.main))
    }

    /// Every dead letter currently stored, in partition and offset order.
    /// A missing DLQ topic is an error naming it.
    pub fn dead_letters(&self) -> Result<Vec<DeadLetter>> {
        let topic = dlq_topic(&self.main);
        let records = read_topic(&self.config, &topic)?.ok_or_else(|| Error::MissingTopic {
            topic: topic.clone(),
            bootstrap: self.config.bootstrap_servers.clone(),
        })?;
        Ok(records
            .into_iter()
            .map(|m| DeadLetter {
                at: Coordinates {
                    partition: m.partition(),
                    offset: m.offset(),
                },
                key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                headers: JobHeaders::parse(m.headers()),
                payload: m.payload().map(<[u8]>::to_vec),
                earlier: Vec::new(),
                timestamp_ms: m.timestamp().to_millis(),
            })
            .collect())
    }

    /// The dead letters at `at` (those that exist; missing ones are left
    /// out), read by coordinates: each partition from its lowest wanted
    /// offset to its highest, never the whole topic for one record.
    /// Blocking.
    pub fn fetch(&self, at: &[Coordinates]) -> Result<Vec<DeadLetter>> {
        let topic = dlq_topic(&self.main);
        let mut span: HashMap<i32, (i64, i64)> = HashMap::new();
        for c in at {
            let s = span.entry(c.partition).or_insert((c.offset, c.offset));
            s.0 = s.0.min(c.offset);
            s.1 = s.1.max(c.offset);
        }
        let wanted: std::collections::HashSet<Coordinates> = at.iter().copied().collect();
        let consumer: BaseConsumer = self
            .config
            .client_config(&[
                ("group.id", "kjob-cli-reader"),
                ("enable.auto.commit", "false"),
                ("enable.partition.eof", "false"),
            ])
            .create()
            .map_err(|e| Error::kafka("creating reader", e))?;
        let mut tpl = rdkafka::TopicPartitionList::new();
        let mut ends = HashMap::new();
        for (p, (first, last)) in &span {
            let (low, high) = consumer
                .fetch_watermarks(&topic, *p, Duration::from_secs(10))
                .map_err(|e| Error::kafka(format!("watermarks of {topic}:{p}"), e))?;
            let start = (*first).max(low);
            let end = (*last + 1).min(high);
            if start < end {
                tpl.add_partition_offset(&topic, *p, rdkafka::Offset::Offset(start))
                    .map_err(|e| Error::kafka("building assignment", e))?;
                ends.insert(*p, end);
            }
        }
        let mut out = Vec::new();
        if ends.is_empty() {
            return Ok(out);
        }
        consumer
            .assign(&tpl)
            .map_err(|e| Error::kafka("assigning partitions", e))?;
        // Gives up only when nothing arrives for 30 s: a large selection
        // may take longer than that to read, a stalled broker does not.
        let mut last = std::time::Instant::now();
        while !ends.is_empty() && last.elapsed() < Duration::from_secs(30) {
            let Some(m) = consumer.poll(Duration::from_millis(500)) else {
                continue;
            };
            last = std::time::Instant::now();
            let m = m.map_err(|e| Error::kafka(format!("reading {topic}"), e))?;
            let c = Coordinates {
                partition: m.partition(),
                offset: m.offset(),
            };
            if wanted.contains(&c) {
                out.push(DeadLetter {
                    at: c,
                    key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                    headers: JobHeaders::parse(m.headers()),
                    payload: m.payload().map(<[u8]>::to_vec),
                    earlier: Vec::new(),
                    timestamp_ms: m.timestamp().to_millis(),
                });
            }
            if ends.get(&c.partition).is_some_and(|e| c.offset + 1 >= *e) {
                ends.remove(&c.partition);
                let mut done = rdkafka::TopicPartitionList::new();
                let _ = done.add_partition(&topic, c.partition);
                let _ = consumer.pause(&done);
            }
        }
        out.sort_by_key(|d| d.at);
        Ok(out)
    }

    /// The latest audit entry per dead letter (empty if nothing was ever
    /// re-driven or resolved).
    pub fn audit(&self) -> Result<HashMap<Coordinates, AuditEntry>> {
        let mut out = HashMap::new();
        let Some(records) = read_topic(&self.config, &dlq_audit_topic(&self.main))? else {
            return Ok(out);
        };
        for m in records {
            let key = m.key().and_then(|k| std::str::from_utf8(k).ok());
            let coords = key.and_then(|k| k.parse::<Coordinates>().ok());
            let entry = m
                .payload()
                .and_then(|p| serde_json::from_slice::<AuditEntry>(p).ok());
            if let (Some(c), Some(e)) = (coords, entry) {
                out.insert(c, e);
            }
        }
        Ok(out)
    }

    /// How many dead letters are stored and unresolved, without reading
    /// them: the stored count from the DLQ's watermarks, the resolved ones
    /// from at most the last `max_audit` audit entries per partition (a
    /// bounded read for a view refreshed every second). `None` if the DLQ
    /// does not exist. Blocking.
    pub fn count(&self, max_audit: i64) -> Result<Option<DlqCount>> {
        let Some(dlq) = watermarks(&self.config, &dlq_topic(&self.main))? else {
            return Ok(None);
        };
        let stored = dlq.iter().map(|(_, low, high)| high - low).sum();
        let audit_topic = dlq_audit_topic(&self.main);
        let audit_stored: i64 = watermarks(&self.config, &audit_topic)?
            .unwrap_or_default()
            .iter()
            .map(|(_, low, high)| high - low)
            .max()
            .unwrap_or(0);
        // A job dead-lettered again counts once: when the DLQ is small
        // enough to read within the same bound, its earlier copies are
        // counted as settled (see `superseded`); beyond, the count is an
        // upper bound and says so.
        let small = stored <= max_audit;
        let older = if small {
            let letters = read_topic_tail(&self.config, &dlq_topic(&self.main), Some(max_audit))?
                .unwrap_or_default();
            let ids: Vec<(Coordinates, Option<String>, &[u8], i64)> = letters
                .iter()
                .map(|m| {
                    let h = JobHeaders::parse(m.headers());
                    let at = Coordinates {
                        partition: m.partition(),
                        offset: m.offset(),
                    };
                    let key = m.key().unwrap_or_default();
                    (at, h.id, key, m.timestamp().to_millis().unwrap_or(0))
                })
                .collect();
            let keys: Vec<String> = ids
                .iter()
                .map(|(_, _, k, _)| String::from_utf8_lossy(k).into_owned())
                .collect();
            superseded(ids.iter().zip(&keys).map(|((at, id, _, ts), key)| {
                (*at, id.as_deref().unwrap_or_default(), key.as_str(), *ts)
            }))
        } else {
            HashMap::new()
        };
        let records =
            read_topic_tail(&self.config, &audit_topic, Some(max_audit))?.unwrap_or_default();
        let mut audited = std::collections::HashSet::new();
        for m in &records {
            let Some(c) = m
                .key()
                .and_then(|k| std::str::from_utf8(k).ok())
                .and_then(|k| k.parse::<Coordinates>().ok())
            else {
                continue;
            };
            let stored_now = dlq
                .iter()
                .any(|(p, low, high)| *p == c.partition && (*low..*high).contains(&c.offset));
            if stored_now {
                audited.insert(c);
            }
        }
        audited.extend(older.keys().copied());
        Ok(Some(DlqCount {
            stored,
            unresolved: usize::try_from(stored)
                .unwrap_or(0)
                .saturating_sub(audited.len()),
            exact: audit_stored <= max_audit && small,
        }))
    }

    /// Dead letters passing `filter`, each with its audit entry; unresolved
    /// ones only unless `include_audited`.
    pub fn list(
        &self,
        filter: &Filter,
        include_audited: bool,
    ) -> Result<Vec<(DeadLetter, Option<AuditEntry>)>> {
        let mut audit = self.audit()?;
        let mut letters = self.dead_letters()?;
        let older = superseded(letters.iter().map(|d| {
            (
                d.at,
                d.headers.id.as_deref().unwrap_or_default(),
                d.key.as_deref().unwrap_or_default(),
                d.timestamp_ms.unwrap_or(0),
            )
        }));
        let mut history: HashMap<Coordinates, Vec<(i64, Coordinates)>> = HashMap::new();
        for d in &letters {
            if let Some(n) = older.get(&d.at) {
                history
                    .entry(*n)
                    .or_default()
                    .push((d.timestamp_ms.unwrap_or(0), d.at));
            }
        }
        letters.retain(|d| !older.contains_key(&d.at));
        for d in &mut letters {
            if let Some(mut h) = history.remove(&d.at) {
                h.sort_unstable();
                d.earlier = h.into_iter().map(|(_, at)| at).collect();
            }
        }
        Ok(letters
            .into_iter()
            .filter(|d| filter.matches(d))
            .map(|d| {
                let a = audit.remove(&d.at);
                (d, a)
            })
            .filter(|(_, a)| include_audited || a.is_none())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_dead_letter_of_a_job_stands_for_it() {
        let c = |partition, offset| Coordinates { partition, offset };
        let older = superseded([
            (c(0, 0), "a", "k", 100),
            (c(0, 1), "b", "k", 100),
            (c(1, 0), "a", "k", 300),
            (c(0, 2), "a", "k", 200),
            (c(0, 3), "", "k", 50),
            (c(0, 4), "", "k", 60),
            // Same time: the higher coordinates are the newer.
            (c(0, 5), "b", "k", 100),
            // The same id under another key is another job.
            (c(0, 6), "a", "other", 400),
        ]);
        let mut got: Vec<_> = older.into_iter().collect();
        got.sort();
        assert_eq!(
            got,
            vec![(c(0, 0), c(1, 0)), (c(0, 1), c(0, 5)), (c(0, 2), c(1, 0))],
            "records without an id are each their own job, and so is another key"
        );
    }

    #[test]
    fn coordinates_parse_strictly() {
        assert_eq!(
            "3:42".parse::<Coordinates>().ok(),
            Some(Coordinates {
                partition: 3,
                offset: 42
            })
        );
        for bad in ["3", "a:1", "1:b", "-1:0", "1:-5", ""] {
            assert!(
                matches!(
                    bad.parse::<Coordinates>(),
                    Err(kjob::Error::InvalidSetting { .. })
                ),
                "{bad}"
            );
        }
    }

    fn dead(class: &str, job: &str, ts: i64) -> DeadLetter {
        DeadLetter {
            at: Coordinates {
                partition: 0,
                offset: 0,
            },
            key: None,
            headers: JobHeaders {
                error_class: Some(class.into()),
                job: Some(job.into()),
                ..Default::default()
            },
            payload: None,
            earlier: Vec::new(),
            timestamp_ms: Some(ts),
        }
    }

    #[test]
    fn filters_combine() {
        let d = dead("retryable.timeout", "mail", 1000);
        assert!(Filter::default().matches(&d));
        assert!(Filter {
            class: Some("retryable".into()),
            ..Default::default()
        }
        .matches(&d));
        assert!(!Filter {
            class: Some("retry".into()),
            ..Default::default()
        }
        .matches(&d));
        assert!(!Filter {
            job: Some("pdf".into()),
            ..Default::default()
        }
        .matches(&d));
        assert!(Filter {
            since_ms: Some(1000),
            until_ms: Some(1001),
            ..Default::default()
        }
        .matches(&d));
        assert!(!Filter {
            until_ms: Some(1000),
            ..Default::default()
        }
        .matches(&d));
        let key = |k: &str| Filter {
            key: Some(k.into()),
            ..Default::default()
        };
        let grep = |t: &str| Filter {
            grep: Some(t.into()),
            ..Default::default()
        };
        let mut d = d;
        d.key = Some("order-4711".into());
        d.headers.error = Some("downstream said 503".into());
        d.payload = Some(b"\0\0\0\0\x01\x14customer-9".to_vec());
        assert!(key("order-4711").matches(&d));
        assert!(!key("order-471").matches(&d), "a key matches exactly");
        assert!(grep("4711").matches(&d) && grep("503").matches(&d));
        assert!(grep("customer-9").matches(&d), "the payload's text");
        assert!(!grep("customer-8").matches(&d));
    }
}
