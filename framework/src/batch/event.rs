//! What the batch topic carries: one JSON event per record, keyed by the
//! batch id, so every event of a batch lands in one partition and is folded
//! in write order by that partition's owner (the coordinator).

use serde::{Deserialize, Serialize};

/// When a callback fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum When {
    /// Once every job finished: succeeded or dead-lettered.
    Complete,
    /// Once every job succeeded (nothing dead-lettered); see the module
    /// docs of [`crate::batch`] for a re-drive that completes it later.
    Success,
}

impl When {
    /// `complete` or `success`: the suffix of the callback's job id.
    pub fn as_str(self) -> &'static str {
        match self {
            When::Complete => "complete",
            When::Success => "success",
        }
    }
}

/// A callback job, encoded when the batch was opened: what the coordinator
/// writes, as is, when the batch is done (it needs no contract of its own).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Callback {
    /// When it fires.
    pub when: When,
    /// The topic it goes to (the callback job's main topic).
    pub topic: String,
    /// The contract name (`kjob-job`).
    pub job: String,
    /// The contract version (`kjob-version`).
    pub version: u32,
    /// The record key.
    pub key: String,
    /// The Confluent-framed Avro payload.
    #[serde(with = "b64")]
    pub payload: Vec<u8>,
}

/// One record of the batch topic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    /// A producer opened the batch (each producing process may; the first
    /// open with callbacks sets them).
    Open {
        /// The batch id.
        batch: String,
        /// Epoch ms.
        at_ms: i64,
        /// Who opened it (`host:pid`).
        by: String,
        /// Its callbacks.
        callbacks: Vec<Callback>,
    },
    /// `count` more jobs were enqueued into the batch.
    Added {
        /// The batch id.
        batch: String,
        /// How many.
        count: u64,
    },
    /// No more jobs: the total is known.
    Sealed {
        /// The batch id.
        batch: String,
        /// Epoch ms.
        at_ms: i64,
    },
    /// Jobs of the batch finished (written by workers, acknowledged before
    /// the jobs' offsets may be committed).
    Done {
        /// The batch id.
        batch: String,
        /// Job ids that succeeded.
        #[serde(default)]
        ok: Vec<String>,
        /// Job ids that were dead-lettered.
        #[serde(default)]
        dead: Vec<String>,
    },
    /// An operator cancelled the batch: no callback fires.
    Cancelled {
        /// The batch id.
        batch: String,
        /// Epoch ms.
        at_ms: i64,
        /// Who (`--by`).
        by: String,
        /// Why (`--reason`).
        reason: String,
    },
    /// The coordinator wrote the callback `when` (so a new coordinator does
    /// not write it again).
    Fired {
        /// The batch id.
        batch: String,
        /// Which callback.
        when: When,
        /// Epoch ms.
        at_ms: i64,
    },
}

impl Event {
    /// The batch the event is about (its record key).
    pub fn batch(&self) -> &str {
        match self {
            Event::Open { batch, .. }
            | Event::Added { batch, .. }
            | Event::Sealed { batch, .. }
            | Event::Done { batch, .. }
            | Event::Cancelled { batch, .. }
            | Event::Fired { batch, .. } => batch,
        }
    }

    /// The record value.
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing these plain structs cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// Bytes as standard base64 in JSON.
pub(crate) mod b64 {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_as_tagged_json() {
        let e = Event::Open {
            batch: "b".into(),
            at_ms: 1,
            by: "h:1".into(),
            callbacks: vec![Callback {
                when: When::Complete,
                topic: "t".into(),
                job: "j".into(),
                version: 2,
                key: "k".into(),
                payload: vec![0, 1, 255],
            }],
        };
        let json = e.to_json();
        let text = String::from_utf8(json.clone()).unwrap();
        assert!(text.contains(r#""kind":"open""#), "{text}");
        assert!(text.contains(r#""payload":"AAH/""#), "{text}");
        assert_eq!(serde_json::from_slice::<Event>(&json).unwrap(), e);
        let done: Event =
            serde_json::from_str(r#"{"kind":"done","batch":"b","ok":["1"]}"#).unwrap();
        assert_eq!(
            done,
            Event::Done {
                batch: "b".into(),
                ok: vec!["1".into()],
                dead: vec![]
            }
        );
    }
}
