//! Before a re-drive: can the live reader read each dead letter's writer?
//!
//! A dead letter whose writer schema the route's reader cannot resolve
//! comes straight back to the DLQ as `decode` after a re-drive, its
//! failure history one line longer. So a re-drive first checks each
//! record's writer (the schema id in its Confluent frame) against the
//! reader: the newest version registered under the route's subject (what
//! producers write and, after the worker's check at start, what the
//! workers read), or a reader file an operator names (`--reader`, the
//! contract about to be deployed). The ones it cannot read are held back:
//! left in place, unresolved, with the reason, and the dry run lists them.
//!
//! A JSON dead letter (from the outbox) is encoded against the newest
//! contract at re-drive time, so it passes. With nothing registered under
//! the subject and no `--reader` there is nothing to check against, and
//! the plan says so; a registry that does not answer leaves the re-drive
//! unchecked too (it never blocks one), with the reason.
//!
//! The live reader is the newest registered version, which is what the
//! workers read once they are deployed first (the order the book gives).
//! In the middle of a rollout where producers went first, older workers
//! may still read with an older version: check against that one with
//! `--reader`.

use std::collections::HashMap;

use anyhow::Result;
use apache_avro::Schema;

use kjob::codec::{split_frame, subject_for_topic, Codec};
use kjob::config::KafkaConfig;
use kjob::schema::can_read;

use super::redrive::is_json;
use super::store::DeadLetter;

/// The reader a re-drive checks its records against.
#[derive(Clone, Debug, Default)]
pub enum Reader {
    /// The newest version registered under the route's subject.
    #[default]
    Live,
    /// A contract file's schema (`--reader schemas/x.v3.avsc`), with how
    /// messages name it.
    File {
        /// The file, as given.
        shown: String,
        /// Its schema.
        schema: Box<Schema>,
    },
}

/// A dead letter held back from a re-drive, with why.
#[derive(Clone, Debug)]
pub struct Held {
    /// The record.
    pub letter: DeadLetter,
    /// Why the reader cannot read it.
    pub reason: String,
}

/// What the check found: the records to re-drive, the ones held back and
/// what they were checked against (`None`: nothing was, and why).
pub struct Checked {
    pub(super) pass: Vec<DeadLetter>,
    pub(super) held: Vec<Held>,
    pub(super) against: Option<String>,
    /// Why nothing was checked, when nothing was.
    pub(super) not_checked: Option<String>,
}

impl Checked {
    fn unchecked(pass: Vec<DeadLetter>, why: String) -> Self {
        Checked {
            pass,
            held: Vec::new(),
            against: None,
            not_checked: Some(why),
        }
    }
}

/// Splits `picked` into the records the reader reads and the ones it does
/// not (see the module docs).
pub(super) async fn check(
    config: &KafkaConfig,
    main: &str,
    picked: Vec<DeadLetter>,
    reader: &Reader,
) -> Result<Checked> {
    let codec = Codec::from_config(config)?;
    let client = codec.client();
    let subject = subject_for_topic(main);
    let (schema, against) = match reader {
        Reader::File { shown, schema } => ((**schema).clone(), shown.clone()),
        Reader::Live => match client.subject_version(&subject, None).await {
            Ok(Some(v)) => match Schema::parse_str(&v.schema) {
                Ok(s) => (
                    s,
                    format!("`{subject}` version {} (the live reader)", v.version),
                ),
                Err(e) => {
                    let why = format!("the newest version under `{subject}` does not parse: {e}");
                    return Ok(Checked::unchecked(picked, why));
                }
            },
            Ok(None) => {
                let why =
                    format!("nothing is registered under `{subject}`; name a reader with --reader");
                return Ok(Checked::unchecked(picked, why));
            }
            Err(e) => {
                let why = format!("the registry did not answer: {e}");
                return Ok(Checked::unchecked(picked, why));
            }
        },
    };
    // Each writer id once: `None` reads, `Some(reason)` is held back.
    let mut verdicts: HashMap<u32, Option<String>> = HashMap::new();
    for letter in &picked {
        let Ok((id, _)) = split_frame(letter.payload.as_deref()) else {
            continue;
        };
        if verdicts.contains_key(&id) || is_json(letter) {
            continue;
        }
        let found = match client.schema_by_id(id).await {
            Ok(found) => found,
            Err(e) => {
                let why = format!("the registry did not answer: {e}");
                return Ok(Checked::unchecked(picked, why));
            }
        };
        let verdict = match found {
            None => Some(format!("the registry has no schema with id {id}")),
            Some(text) => match Schema::parse_str(&text) {
                Err(e) => Some(format!("writer schema {id} does not parse: {e}")),
                Ok(writer) => can_read(&writer, &schema)
                    .err()
                    .map(|r| format!("{against} cannot read writer schema {id}: {r}")),
            },
        };
        verdicts.insert(id, verdict);
    }
    let (mut pass, mut held) = (Vec::new(), Vec::new());
    for letter in picked {
        if is_json(&letter) {
            pass.push(letter);
            continue;
        }
        let reason = match split_frame(letter.payload.as_deref()) {
            Ok((id, _)) => verdicts.get(&id).cloned().flatten(),
            Err(e) => Some(format!(
                "not in the Confluent wire format ({e}): a re-drive would come straight back"
            )),
        };
        match reason {
            None => pass.push(letter),
            Some(reason) => held.push(Held { letter, reason }),
        }
    }
    Ok(Checked {
        pass,
        held,
        against: Some(against),
        not_checked: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dlq::store::Coordinates;

    fn letter(offset: i64, payload: &[u8]) -> DeadLetter {
        DeadLetter {
            at: Coordinates {
                partition: 0,
                offset,
            },
            key: None,
            headers: Default::default(),
            payload: Some(payload.to_vec()),
            earlier: Vec::new(),
            timestamp_ms: None,
        }
    }

    #[tokio::test]
    async fn a_registry_that_does_not_answer_leaves_the_redrive_unchecked_never_blocked() {
        // Nothing listens on port 9.
        let config = KafkaConfig::new("127.0.0.1:9", "http://127.0.0.1:9");
        let picked = vec![letter(0, b"\0\0\0\0\x07ab"), letter(1, b"not avro")];
        let checked = check(&config, "orders", picked, &Reader::Live)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(checked.pass.len(), 2, "nothing held back");
        assert!(checked.held.is_empty() && checked.against.is_none());
        assert!(checked
            .not_checked
            .is_some_and(|w| w.contains("registry did not answer")),);
    }

    #[tokio::test]
    async fn with_a_reader_file_a_record_that_is_not_framed_is_held_back() {
        let config = KafkaConfig::new("127.0.0.1:9", "http://127.0.0.1:9");
        let schema = Schema::parse_str(r#"{"type":"record","name":"O","fields":[]}"#)
            .unwrap_or(Schema::Null);
        let reader = Reader::File {
            shown: "--reader o.avsc".into(),
            schema: Box::new(schema),
        };
        // Only the unframed one: no registry call is needed.
        let checked = check(&config, "orders", vec![letter(3, b"{}")], &reader)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(checked.held.len(), 1);
        assert!(checked.held[0].reason.contains("wire format"));
        assert_eq!(checked.against.as_deref(), Some("--reader o.avsc"));
    }
}
