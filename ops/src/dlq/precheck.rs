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
//! the plan says so.

use std::collections::HashMap;

use anyhow::Result;
use apache_avro::Schema;

use kjob::codec::{subject_for_topic, Codec};
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
/// what they were checked against (`None`: nothing to check against).
pub struct Checked {
    pub(super) pass: Vec<DeadLetter>,
    pub(super) held: Vec<Held>,
    pub(super) against: Option<String>,
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
        Reader::Live => match client.subject_version(&subject, None).await? {
            Some(v) => match Schema::parse_str(&v.schema) {
                Ok(s) => (
                    s,
                    format!("`{subject}` version {} (the live reader)", v.version),
                ),
                Err(_) => {
                    return Ok(Checked {
                        pass: picked,
                        held: Vec::new(),
                        against: None,
                    })
                }
            },
            None => {
                return Ok(Checked {
                    pass: picked,
                    held: Vec::new(),
                    against: None,
                })
            }
        },
    };
    let mut verdicts: HashMap<u32, Option<String>> = HashMap::new();
    let (mut pass, mut held) = (Vec::new(), Vec::new());
    for letter in picked {
        if is_json(&letter) {
            pass.push(letter);
            continue;
        }
        let id = match letter.payload.as_deref() {
            Some([0, a, b, c, d, ..]) => u32::from_be_bytes([*a, *b, *c, *d]),
            _ => {
                held.push(Held {
                    letter,
                    reason: "not in the Confluent wire format: a re-drive would come straight back"
                        .into(),
                });
                continue;
            }
        };
        let verdict = match verdicts.get(&id) {
            Some(v) => v.clone(),
            None => {
                let v = match client.schema_by_id(id).await? {
                    None => Some(format!("the registry has no schema with id {id}")),
                    Some(text) => match Schema::parse_str(&text) {
                        Err(e) => Some(format!("writer schema {id} does not parse: {e}")),
                        Ok(writer) => can_read(&writer, &schema)
                            .err()
                            .map(|r| format!("{against} cannot read writer schema {id}: {r}")),
                    },
                };
                verdicts.insert(id, v.clone());
                v
            }
        };
        match verdict {
            None => pass.push(letter),
            Some(reason) => held.push(Held { letter, reason }),
        }
    }
    Ok(Checked {
        pass,
        held,
        against: Some(against),
    })
}
