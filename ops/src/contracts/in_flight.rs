//! The jobs a group has not finished yet, by the writer schema each was
//! encoded with: what `kjob schema check --in-flight` checks a new reader
//! against before a deploy.
//!
//! A deploy changes the reader of every record still waiting: in a main
//! topic past the group's committed offset, in its retry tiers (its own
//! and the group's shared ones), in its delay topics, and unresolved in the
//! DLQ (a re-drive sends those back through the reader). The strict-order
//! topic holds only job ids (the jobs a key's head holds back wait in the
//! tiers, which are read), so it has no writers of its own.
//!
//! The cost is bounded by what it reads, not by what it decodes: every
//! waiting record is fetched (Kafka cannot send headers alone), but only
//! the 5-byte Confluent prefix and two headers of each are looked at, and
//! nothing is kept but a count per (place, contract, writer id). Progress
//! goes to a callback, for a long backlog.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use kjob::config::KafkaConfig;
use kjob::deployment::{classify, Deployment};
use kjob::error::{Error, Result};
use kjob::topics::{list_topics, operator_consumer};

use crate::dlq::store::DlqReader;
use crate::lag::group_lag;
use crate::topics::{route_topics, Role};

/// A topic holding waiting jobs of one route (or of several: a shared tier
/// or delay bucket, whose records name their route).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Place {
    /// The topic.
    pub topic: String,
    /// What it is to the worker.
    pub role: Role,
    /// A tier's or delay topic's delay.
    pub delay: Option<String>,
    /// The route (main topic); `None` on a shared topic.
    pub route: Option<String>,
}

/// The writer a waiting record was encoded with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Writer {
    /// The Confluent frame's schema id.
    Id(u32),
    /// No frame (empty, short, or not magic byte 0): the worker dead-letters
    /// such a record whatever its reader.
    Unframed,
}

/// How many waiting records of one route and contract, in one place, were
/// written with one writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriterCount {
    /// Where they wait.
    pub place: Place,
    /// Their route: the place's, or on a shared topic the one each names.
    pub route: String,
    /// The contract their `kjob-job` header names, if any (not read for a
    /// route whose contract the caller knows).
    pub contract: Option<String>,
    /// Their writer.
    pub writer: Writer,
    /// How many.
    pub count: u64,
}

/// The topics holding `group`'s unfinished jobs: from its `model` when
/// given (exact), else by name from the cluster's topics, for every main
/// topic the group has committed offsets on and every one in `routes`
/// (the topics a check names). Blocking.
pub fn places(
    config: &KafkaConfig,
    group: &str,
    model: Option<&Deployment>,
    routes: &[String],
) -> Result<Vec<Place>> {
    let holds = |role: Role| {
        matches!(
            role,
            Role::Main
                | Role::RetryTier
                | Role::SharedRetryTier
                | Role::Delay
                | Role::SharedDelay
                | Role::Dlq
        )
    };
    if let Some(model) = model {
        let mut out: Vec<Place> = model
            .topics
            .iter()
            .filter(|t| holds(t.role))
            .map(|t| Place {
                topic: t.topic.clone(),
                role: t.role,
                delay: t.delay.clone(),
                route: t.route.clone().filter(|_| !t.role.group_wide()),
            })
            .collect();
        out.sort();
        return Ok(out);
    }
    let all = list_topics(config)?;
    let groups = [group.to_string()];
    let mut mains: Vec<String> = classify(&all, &groups)
        .into_iter()
        .filter(|(_, c)| c.role == Role::Main)
        .map(|(t, _)| t)
        .collect();
    // A topic the check names is a route's main topic even before it has
    // tiers or a DLQ by which its name would say so.
    for route in routes {
        if all.contains(route) && !mains.contains(route) {
            mains.push(route.clone());
        }
    }
    let committed: HashSet<String> = group_lag(config, group, &mains)?
        .into_iter()
        .filter(|l| l.committed.is_some())
        .map(|l| l.topic)
        .collect();
    let mut out = Vec::new();
    for main in mains
        .iter()
        .filter(|m| committed.contains(*m) || routes.contains(m))
    {
        let found = route_topics(main, Some(group), &all);
        if !found.iter().any(|t| t.role == Role::Main) {
            out.push(Place {
                topic: main.clone(),
                role: Role::Main,
                delay: None,
                route: Some(main.clone()),
            });
        }
        for t in found {
            if holds(t.role) {
                let shared = matches!(t.role, Role::SharedRetryTier | Role::SharedDelay);
                out.push(Place {
                    topic: t.topic,
                    role: t.role,
                    delay: t.delay,
                    route: (!shared).then(|| main.clone()),
                });
            }
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// One partition's range to read.
struct Span {
    place: usize,
    partition: i32,
    from: i64,
    to: i64,
}

/// Reads every record `group` has not finished in `places` and counts them
/// by route, contract and writer. `known`: the routes whose contract the
/// caller knows (a `--topic`, a model's subjects): their records' headers
/// are not read (librdkafka parses a record's headers only when asked,
/// which doubled the cost of a million-record read), except on a shared
/// topic, whose records name their route. `progress(read, total)` is
/// called every 100 000 records and at the end. Blocking; gives up when
/// nothing arrives for 30 s.
pub fn writers_waiting(
    config: &KafkaConfig,
    group: &str,
    places: &[Place],
    known: &HashSet<String>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vec<WriterCount>> {
    let index: HashMap<&str, usize> = places
        .iter()
        .enumerate()
        .map(|(i, p)| (p.topic.as_str(), i))
        .collect();
    let (spans, audited) = spans_to_read(config, group, places, &index)?;
    let total: u64 = spans.iter().map(|s| (s.to - s.from).max(0) as u64).sum();
    let mut counts: HashMap<(usize, usize, Option<usize>, Writer), u64> = HashMap::new();
    let mut names = Names::default();
    if spans.is_empty() {
        progress(0, 0);
        return Ok(Vec::new());
    }
    let consumer = operator_consumer(config)?;
    let mut tpl = TopicPartitionList::new();
    let mut ends: HashMap<(usize, i32), i64> = HashMap::new();
    for s in &spans {
        tpl.add_partition_offset(&places[s.place].topic, s.partition, Offset::Offset(s.from))
            .map_err(|e| Error::kafka("building assignment", e))?;
        ends.insert((s.place, s.partition), s.to);
    }
    consumer
        .assign(&tpl)
        .map_err(|e| Error::kafka("assigning the waiting jobs' partitions", e))?;
    let mut read = 0u64;
    // Progress, not traffic, keeps the read alive: records past a
    // partition's end (a live topic) are not progress.
    let mut last = Instant::now();
    let mut checked = Instant::now();
    while !ends.is_empty() {
        if last.elapsed() > Duration::from_secs(30) {
            let (place, partition) = ends.keys().next().copied().unwrap_or_default();
            return Err(Error::ReadTimeout {
                topic: format!("{}:{partition}", places[place].topic),
                after: last.elapsed(),
            });
        }
        // Offsets a compaction or a transaction marker took never arrive:
        // a partition whose position reached its end is done. Checked
        // once a second, busy or not.
        if checked.elapsed() > Duration::from_secs(1) {
            checked = Instant::now();
            if let Ok(at) = consumer.position() {
                for e in at.elements() {
                    if let (Some(&place), Offset::Offset(o)) = (index.get(e.topic()), e.offset()) {
                        if ends
                            .get(&(place, e.partition()))
                            .is_some_and(|end| o >= *end)
                        {
                            finish(&consumer, &mut ends, places, (place, e.partition()));
                            last = Instant::now();
                        }
                    }
                }
            }
        }
        let Some(m) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m.map_err(|e| Error::kafka("reading waiting jobs", e))?;
        let Some(&place) = index.get(m.topic()) else {
            continue;
        };
        let key = (place, m.partition());
        let Some(&end) = ends.get(&key) else { continue };
        if m.offset() >= end {
            finish(&consumer, &mut ends, places, key);
            continue;
        }
        last = Instant::now();
        if m.offset() + 1 >= end {
            finish(&consumer, &mut ends, places, key);
        }
        read += 1;
        if read.is_multiple_of(100_000) {
            progress(read, total);
        }
        if audited
            .get(&place)
            .is_some_and(|a| a.contains(&(m.partition(), m.offset())))
        {
            continue;
        }
        let own = places[place].route.as_ref();
        let (contract, named_route) = match own {
            Some(route) if known.contains(route) => (None, None),
            _ => job_and_route(&m, own.is_none()),
        };
        let contract = contract.map(|c| names.intern(c));
        let route = match (&places[place].route, named_route) {
            (Some(own), _) => names.intern(own.as_bytes()),
            (None, Some(named)) => names.intern(named),
            (None, None) => names.intern(b"?"),
        };
        let writer = match kjob::codec::split_frame(m.payload()) {
            Ok((id, _)) => Writer::Id(id),
            Err(_) => Writer::Unframed,
        };
        *counts.entry((place, route, contract, writer)).or_default() += 1;
    }
    progress(read, total);
    Ok(sorted(counts, places, &names))
}

/// Where jobs wait: each consumed place's span from the group's committed
/// offset to its end, and each DLQ whole, with the DLQ records its audit
/// trail names (resolved or re-driven) set apart.
#[allow(clippy::type_complexity)]
fn spans_to_read(
    config: &KafkaConfig,
    group: &str,
    places: &[Place],
    index: &HashMap<&str, usize>,
) -> Result<(Vec<Span>, HashMap<usize, HashSet<(i32, i64)>>)> {
    let consumed: Vec<String> = places
        .iter()
        .filter(|p| p.role != Role::Dlq)
        .map(|p| p.topic.clone())
        .collect();
    let mut spans = Vec::new();
    for l in group_lag(config, group, &consumed)? {
        let from = l.committed.unwrap_or(l.start).max(l.start);
        if let Some(&place) = index.get(l.topic.as_str()) {
            if l.end > from {
                spans.push(Span {
                    place,
                    partition: l.partition,
                    from,
                    to: l.end,
                });
            }
        }
    }
    // A DLQ's unresolved records: all of it but what the audit trail names.
    let mut audited: HashMap<usize, HashSet<(i32, i64)>> = HashMap::new();
    for (i, p) in places
        .iter()
        .enumerate()
        .filter(|(_, p)| p.role == Role::Dlq)
    {
        let Some(main) = p.route.clone() else {
            continue;
        };
        let reader = DlqReader::new(config, &main);
        let Some(partitions) = reader.watermarks()? else {
            continue;
        };
        audited.insert(
            i,
            reader
                .audit()?
                .into_keys()
                .map(|c| (c.partition, c.offset))
                .collect(),
        );
        for (partition, low, high) in partitions {
            if high > low {
                spans.push(Span {
                    place: i,
                    partition,
                    from: low,
                    to: high,
                });
            }
        }
    }
    Ok((spans, audited))
}

/// The writers counted, one row per place, route, contract and writer, in
/// that order.
fn sorted(
    counts: HashMap<(usize, usize, Option<usize>, Writer), u64>,
    places: &[Place],
    names: &Names,
) -> Vec<WriterCount> {
    let mut out: Vec<WriterCount> = counts
        .into_iter()
        .map(|((place, route, contract, writer), count)| WriterCount {
            place: places[place].clone(),
            route: names.get(route),
            contract: contract.map(|c| names.get(c)),
            writer,
            count,
        })
        .collect();
    out.sort_by(|a, b| {
        (&a.place, &a.route, &a.contract, a.writer).cmp(&(
            &b.place,
            &b.route,
            &b.contract,
            b.writer,
        ))
    });
    out
}

/// Marks a partition read to its end and pauses it, so a live topic's new
/// records stop arriving for it.
fn finish(
    consumer: &rdkafka::consumer::BaseConsumer,
    ends: &mut HashMap<(usize, i32), i64>,
    places: &[Place],
    key: (usize, i32),
) {
    ends.remove(&key);
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&places[key.0].topic, key.1);
    // A partition that cannot be paused only sends records that are
    // ignored (past its end).
    let _ = consumer.pause(&tpl);
}

/// The distinct route and contract names of a backlog, each kept once: a
/// million records cost no allocation each. Records that name more than
/// [`Names::MAX`] distinct values (hostile headers) share one "(other)".
#[derive(Default)]
struct Names {
    ids: HashMap<Vec<u8>, usize>,
    names: Vec<Vec<u8>>,
}

impl Names {
    const MAX: usize = 1_000;

    fn intern(&mut self, name: &[u8]) -> usize {
        if let Some(&i) = self.ids.get(name) {
            return i;
        }
        let name = match self.names.len() < Self::MAX {
            true => name,
            false => b"(other)",
        };
        if let Some(&i) = self.ids.get(name) {
            return i;
        }
        self.names.push(name.to_vec());
        self.ids.insert(name.to_vec(), self.names.len() - 1);
        self.names.len() - 1
    }

    fn get(&self, i: usize) -> String {
        String::from_utf8_lossy(&self.names[i]).into_owned()
    }
}

/// The record's `kjob-job` (its contract) and, on a shared topic, the
/// route it belongs to (`kjob-route`, else `kjob-original-topic`).
fn job_and_route(m: &impl Message, shared: bool) -> (Option<&[u8]>, Option<&[u8]>) {
    let (mut job, mut route, mut original) = (None, None, None);
    if let Some(headers) = m.headers() {
        for h in headers.iter() {
            match h.key {
                kjob::headers::JOB => job = h.value,
                kjob::headers::ROUTE if shared => route = h.value,
                kjob::headers::ORIGINAL_TOPIC if shared => original = h.value,
                _ => {}
            }
        }
    }
    (job, route.or(original))
}

#[cfg(test)]
mod tests {
    use super::Names;

    #[test]
    fn names_are_kept_once_and_a_flood_of_distinct_ones_shares_one() {
        let mut names = Names::default();
        let a = names.intern(b"orders");
        assert_eq!(names.intern(b"orders"), a);
        for i in 0..5_000 {
            names.intern(format!("hostile-{i}").as_bytes());
        }
        assert!(names.names.len() <= Names::MAX + 1, "{}", names.names.len());
        let other = names.intern(b"one-more");
        assert_eq!(names.get(other), "(other)");
        assert_eq!(names.get(a), "orders");
    }
}
