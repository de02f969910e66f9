//! `kjob schema check --in-flight`: the writer of every job a group has not
//! finished yet, checked against the new local reader of its route.

use std::collections::{BTreeMap, HashMap};
use std::io::IsTerminal as _;

use anyhow::Result;
use apache_avro::Schema;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use serde_json::json;

use super::check::Report;
use crate::Ctx;
use kjob::codec::Codec;
use kjob::deployment::Deployment;
use kjob::schema::can_read;
use kjob_ops::contracts::in_flight::{places, writers_waiting, Writer, WriterCount};
use kjob_ops::contracts::{latest, LocalContract, Target};

/// What a writer is to the reader being deployed.
enum Verdict {
    Reads,
    CannotRead(String),
    UnknownId,
    Unparsable(String),
    Unframed,
    NoLocalContract,
}

impl Verdict {
    fn label(&self) -> String {
        match self {
            Verdict::Reads => "reads".into(),
            Verdict::CannotRead(reason) => format!("CANNOT READ: {reason}"),
            Verdict::UnknownId => "CANNOT READ: the registry has no schema with this id".into(),
            Verdict::Unparsable(e) => format!("CANNOT READ: the writer schema does not parse: {e}"),
            Verdict::Unframed => "not framed: dead-lettered whatever the reader".into(),
            Verdict::NoLocalContract => "not checked: no local file of its contract".into(),
        }
    }

    /// Whether the new reader turns these jobs into dead letters.
    fn fails(&self) -> bool {
        matches!(
            self,
            Verdict::CannotRead(_) | Verdict::UnknownId | Verdict::Unparsable(_)
        )
    }
}

/// Reads what `group` has not finished and checks each writer; the report
/// counts the waiting jobs the new reader cannot read.
pub(super) async fn run(
    ctx: &Ctx,
    codec: &Codec,
    contracts: &[LocalContract],
    targets: &[Target],
    group: &str,
    model: Option<&Deployment>,
) -> Result<Report> {
    let config = ctx.config.clone();
    let (group_owned, model_owned) = (group.to_string(), model.cloned());
    let routes: Vec<String> = targets.iter().map(|t| t.topic.clone()).collect();
    let quiet = ctx.json() || !std::io::stderr().is_terminal();
    let counts: Vec<WriterCount> = tokio::task::spawn_blocking(move || {
        let places = places(&config, &group_owned, model_owned.as_ref(), &routes)?;
        let mut progress = |read: u64, total: u64| {
            if !quiet && total >= 100_000 {
                eprintln!("read {read} of {total} waiting records");
            }
        };
        let known = routes.iter().cloned().collect();
        writers_waiting(&config, &group_owned, &places, &known, &mut progress)
    })
    .await??;

    // The reader each route gets: the newest local version of the contract
    // checked under its topic, else of the contract its records name.
    let newest: HashMap<&str, &Schema> = latest(contracts)
        .into_iter()
        .map(|c| (c.name.as_str(), &c.schema))
        .collect();
    let by_topic: HashMap<&str, &str> = targets
        .iter()
        .map(|t| (t.topic.as_str(), t.contract.as_str()))
        .collect();
    let writers = writer_schemas(codec, &counts).await?;

    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(vec![
        "waiting in",
        "role",
        "route",
        "contract",
        "writer id",
        "jobs",
        "result",
    ]);
    let mut rows = Vec::new();
    let mut failures = 0u64;
    let mut unchecked = 0u64;
    for c in &counts {
        let contract = by_topic
            .get(c.route.as_str())
            .copied()
            .or(c.contract.as_deref());
        let reader = contract.and_then(|name| newest.get(name).copied());
        let verdict = verdict(c.writer, reader, &writers);
        if verdict.fails() {
            failures += c.count;
        }
        if matches!(verdict, Verdict::NoLocalContract) {
            unchecked += c.count;
        }
        let writer = match c.writer {
            Writer::Id(id) => id.to_string(),
            Writer::Unframed => "-".into(),
        };
        let role = match &c.place.delay {
            Some(d) => format!("{} {d}", c.place.role.label()),
            None => c.place.role.label().to_string(),
        };
        rows.push(json!({
            "topic": c.place.topic,
            "role": c.place.role.label(),
            "delay": c.place.delay,
            "route": c.route,
            "contract": contract,
            "writer_id": match c.writer { Writer::Id(id) => Some(id), Writer::Unframed => None },
            "jobs": c.count,
            "readable": !verdict.fails(),
            "result": verdict.label(),
        }));
        table.add_row(vec![
            c.place.topic.clone(),
            role,
            c.route.clone(),
            contract.unwrap_or("-").to_string(),
            writer,
            c.count.to_string(),
            verdict.label(),
        ]);
    }
    if unchecked > 0 {
        // Not a failure (the deploy does not change their reader), but not
        // an all-clear for them either.
        eprintln!(
            "warning: {unchecked} waiting job(s) were not checked: their route's contract is not in the directory (name its topic with --topic and --contract, or give the worker's --model)"
        );
    }
    Ok(Report {
        table,
        rows,
        failures: usize::try_from(failures).unwrap_or(usize::MAX),
    })
}

/// Each writer id of `counts` once: `None` when the registry has no such
/// id, else the schema or why it does not parse.
async fn writer_schemas(
    codec: &Codec,
    counts: &[WriterCount],
) -> Result<BTreeMap<u32, Option<Result<Schema, String>>>> {
    let mut writers = BTreeMap::new();
    for c in counts {
        if let Writer::Id(id) = c.writer {
            if let std::collections::btree_map::Entry::Vacant(slot) = writers.entry(id) {
                let text = codec.client().schema_by_id(id).await?;
                slot.insert(text.map(|t| Schema::parse_str(&t).map_err(|e| e.to_string())));
            }
        }
    }
    Ok(writers)
}

/// Whether `reader` reads the jobs of `writer` (`None`: no local contract).
fn verdict(
    writer: Writer,
    reader: Option<&Schema>,
    writers: &BTreeMap<u32, Option<Result<Schema, String>>>,
) -> Verdict {
    match (writer, reader) {
        (Writer::Unframed, _) => Verdict::Unframed,
        (_, None) => Verdict::NoLocalContract,
        (Writer::Id(id), Some(reader)) => match writers.get(&id).and_then(Option::as_ref) {
            None => Verdict::UnknownId,
            Some(Err(e)) => Verdict::Unparsable(e.clone()),
            Some(Ok(writer)) => match can_read(writer, reader) {
                Ok(()) => Verdict::Reads,
                Err(reason) => Verdict::CannotRead(reason),
            },
        },
    }
}
