//! The Confluent wire format: a magic byte, a 4-byte big-endian schema id,
//! then the Avro body; and the registry subject a topic's records use.

/// The Confluent wire-format magic byte.
pub const MAGIC_BYTE: u8 = 0;
/// Frames an Avro body with the magic byte and schema id.
pub fn frame(id: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 5);
    out.push(MAGIC_BYTE);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// The registry subject for a main topic (`TopicNameStrategy`, value side).
pub fn subject_for_topic(topic: &str) -> String {
    format!("{topic}-value")
}
