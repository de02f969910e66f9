//! The offsets file of `kjob replay --export FILE` and `--from-file FILE`:
//! the CSV that `kafka-consumer-groups --reset-offsets --export` writes and
//! `--from-file` reads, one `topic,partition,offset` line per partition, no
//! header (Kafka's form for several groups, `group,topic,partition,offset`,
//! is read too, keeping the lines of the group asked for).
//!
//! One difference in meaning, none in format: Kafka's `--export` writes the
//! offsets the reset *moves to*; kjob's writes the committed offsets
//! *before* the reset, so the file undoes it (`kjob replay --from-file
//! FILE --execute`). Either file feeds either tool's `--from-file`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context as _, Result};

use super::ReplayRow;
use crate::lag::group_lag;
use crate::problem::Problem;
use kjob::config::KafkaConfig;

/// One line of an offsets file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileOffset {
    /// The line it was read from (1-based; 0 when not read from a file).
    pub line: usize,
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// The offset to commit.
    pub offset: i64,
}

/// The committed offsets of `rows` (a plan, before it is applied) as the
/// file's text, and how many partitions had no committed offset and so are
/// not in it (a reset cannot be undone to "no commit").
pub fn current_offsets_csv(rows: &[ReplayRow]) -> (String, usize) {
    let mut out = String::new();
    let mut skipped = 0;
    for r in rows {
        match r.committed {
            Some(c) => out.push_str(&format!("{},{},{c}\n", r.topic, r.partition)),
            None => skipped += 1,
        }
    }
    (out, skipped)
}

/// Writes [`current_offsets_csv`] of `rows` to `path`. Returns the lines
/// written and the partitions left out.
pub fn write_current_offsets(path: &Path, rows: &[ReplayRow]) -> Result<(usize, usize)> {
    let (text, skipped) = current_offsets_csv(rows);
    std::fs::write(path, &text)
        .with_context(|| format!("writing --export {}; nothing was reset", path.display()))?;
    Ok((text.lines().count(), skipped))
}

/// Parses an offsets file for `group`. Blank lines and a header line
/// (`topic,partition,offset`) are skipped; anything else that is not
/// `topic,partition,offset` or `group,topic,partition,offset` is a usage
/// error naming the line.
pub fn parse(text: &str, group: &str) -> Result<Vec<FileOffset>> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let fields: Vec<&str> = raw.split(',').map(str::trim).collect();
        if raw.trim().is_empty()
            || fields.first() == Some(&"topic")
            || fields.get(1) == Some(&"topic")
        {
            continue;
        }
        let (topic, partition, offset) = match fields.as_slice() {
            [t, p, o] => (*t, *p, *o),
            [g, t, p, o] => {
                if *g != group {
                    continue;
                }
                (*t, *p, *o)
            }
            _ => {
                return Err(Problem::usage(format!(
                    "--from-file line {line}: `{raw}` is not topic,partition,offset"
                ))
                .into())
            }
        };
        let bad = |what: &str| {
            Problem::usage(format!("--from-file line {line}: `{what}` is not a number"))
        };
        out.push(FileOffset {
            line,
            topic: topic.to_string(),
            partition: partition.parse().map_err(|_| bad(partition))?,
            offset: offset
                .parse::<i64>()
                .ok()
                .filter(|o| *o >= 0)
                .ok_or_else(|| bad(offset))?,
        });
    }
    if out.is_empty() {
        return Err(Problem::usage(format!(
            "--from-file has no topic,partition,offset line for group `{group}`"
        ))
        .into());
    }
    Ok(out)
}

/// The plan that commits the file's offsets for `group`: every partition
/// must exist; an offset outside the log is moved to its nearest end, as
/// Kafka's tool does, with a note saying so. Nothing is written. Blocking.
pub fn plan_from_file(
    config: &KafkaConfig,
    group: &str,
    offsets: &[FileOffset],
) -> Result<(Vec<ReplayRow>, Vec<String>)> {
    let mut topics: Vec<String> = offsets.iter().map(|o| o.topic.clone()).collect();
    topics.sort();
    topics.dedup();
    let positions = group_lag(config, group, &topics)?;
    let mut by_partition: BTreeMap<(String, i32), ReplayRow> = BTreeMap::new();
    let mut notes = Vec::new();
    for o in offsets {
        let Some(p) = positions
            .iter()
            .find(|p| p.topic == o.topic && p.partition == o.partition)
        else {
            return Err(Problem::not_found(format!(
                "--from-file line {}: partition {} of `{}` does not exist",
                o.line, o.partition, o.topic
            ))
            .into());
        };
        let target = o.offset.clamp(p.start, p.end);
        if target != o.offset {
            notes.push(format!(
                "line {}: offset {} of {}:{} is outside its log ({}..{}); using {target}",
                o.line, o.offset, o.topic, o.partition, p.start, p.end
            ));
        }
        by_partition.insert(
            (o.topic.clone(), o.partition),
            ReplayRow {
                topic: o.topic.clone(),
                partition: o.partition,
                committed: p.committed,
                target,
                start: p.start,
                end: p.end,
            },
        );
    }
    Ok((by_partition.into_values().collect(), notes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(topic: &str, partition: i32, committed: Option<i64>) -> ReplayRow {
        ReplayRow {
            topic: topic.into(),
            partition,
            committed,
            target: 0,
            start: 0,
            end: 10,
        }
    }

    #[test]
    fn kafkas_csv_round_trips() {
        let (text, skipped) = current_offsets_csv(&[
            row("orders", 0, Some(7)),
            row("orders", 1, None),
            row("orders.retry.5s", 0, Some(3)),
        ]);
        assert_eq!(text, "orders,0,7\norders.retry.5s,0,3\n");
        assert_eq!(skipped, 1);
        let parsed = parse(&text, "g").unwrap_or_default();
        assert_eq!(
            parsed
                .iter()
                .map(|o| (o.topic.as_str(), o.partition, o.offset))
                .collect::<Vec<_>>(),
            vec![("orders", 0, 7), ("orders.retry.5s", 0, 3)]
        );
    }

    #[test]
    fn the_several_groups_form_keeps_the_group_asked_for() {
        let text = "group,topic,partition,offset\ng1,orders,0,5\ng2,orders,0,9\n\ng1,orders,1,6\n";
        let parsed = parse(text, "g1").unwrap_or_default();
        assert_eq!(parsed.len(), 2);
        assert_eq!((parsed[1].line, parsed[1].offset), (5, 6));
        for bad in ["orders,zero,1", "orders,0", "orders,0,-3"] {
            let err = parse(bad, "g")
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains("line 1"), "{bad}: {err}");
        }
        assert!(parse("g2,orders,0,1\n", "g1").is_err(), "no line for g1");
    }
}
