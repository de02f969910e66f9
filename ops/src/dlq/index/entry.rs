//! One dead letter as the index holds it: a fixed 64 bytes (coordinates,
//! time, attempt, interned job and class, audit state, flags) plus one
//! short string with the key, job id, error and payload text, each cut to
//! its cap, so a million of them fit in a few hundred megabytes.

use kjob::headers::JobHeaders;

use crate::dlq::store::{AuditEntry, Coordinates};

/// Bytes of a record key kept for display, sorting and search.
pub const KEY_BYTES: usize = 64;
/// Bytes of a job id (`kjob-id`) kept.
pub const ID_BYTES: usize = 40;
/// Bytes of the error message (`kjob-error`) kept.
pub const ERROR_BYTES: usize = 120;
pub(crate) use crate::dlq::store::payload_text;
pub use crate::dlq::store::PAYLOAD_BYTES;

/// The most text one entry holds: the four fields above and their
/// separators.
pub const MAX_TEXT_BYTES: usize = KEY_BYTES + ID_BYTES + ERROR_BYTES + PAYLOAD_BYTES + 3;
/// What an entry costs besides its text: the entry itself (64 bytes), its
/// slot in the coordinates map (about 32), its job id's slot in the map
/// that links a job's dead letters (about 24) and the text's allocation
/// header (about 16).
pub const FIXED_BYTES_PER_ENTRY: usize = 136;

/// Separates the fields in an entry's text; removed from the values, so a
/// search never matches across two fields.
const SEP: char = '\u{1f}';

/// What an operator did with a dead letter, as the index keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    /// No audit entry.
    Unresolved,
    /// Re-driven (`retried`).
    Retried,
    /// Resolved as handled.
    Resolved,
    /// An audit entry with another action (another tool's).
    Other,
}

impl Status {
    pub(super) fn of(a: &AuditEntry) -> Self {
        match a.action.as_str() {
            "retried" => Status::Retried,
            "resolved" => Status::Resolved,
            _ => Status::Other,
        }
    }
}

/// The bits of `Entry::flags`.
const KEY_CUT: u8 = 1;
const ERROR_CUT: u8 = 2;
const HAS_KEY: u8 = 4;
/// An earlier dead letter of a job dead-lettered again (see
/// `store::superseded`): hidden, counted as settled.
const SUPERSEDED: u8 = 8;

/// One dead letter, in a fixed 64 bytes plus its short text.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Where it is in the DLQ.
    pub at: Coordinates,
    /// When it was dead-lettered (epoch ms; 0 when the record had none).
    pub timestamp_ms: i64,
    /// `kjob-attempt` (0 when absent).
    pub attempt: u32,
    pub(super) job: u32,
    pub(super) class: u32,
    pub(super) status: Status,
    pub(super) flags: u8,
    /// Byte lengths of key, id and error inside `text`.
    lens: [u8; 3],
    pub(super) text: Box<str>,
}

/// The longest prefix of `s` of at most `max` bytes ending on a character
/// boundary, and whether anything was cut.
fn prefix(s: &str, max: usize) -> (&str, bool) {
    if s.len() <= max {
        return (s, false);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    (&s[..end], true)
}

impl Entry {
    fn field(&self, i: usize) -> &str {
        let start: usize = self.lens[..i].iter().map(|l| *l as usize + 1).sum();
        let end = start + self.lens[i] as usize;
        self.text.get(start..end).unwrap_or_default()
    }
    /// The key as kept (at most [`KEY_BYTES`]); `None` when the record had none.
    pub fn key(&self) -> Option<&str> {
        (self.flags & HAS_KEY != 0).then(|| self.field(0))
    }
    /// Whether the key was longer than what is kept.
    pub fn key_cut(&self) -> bool {
        self.flags & KEY_CUT != 0
    }
    /// The job id as kept (empty when absent).
    pub fn id(&self) -> &str {
        self.field(1)
    }
    /// The error message as kept (empty when absent).
    pub fn error(&self) -> &str {
        self.field(2)
    }
    /// Whether the error was longer than what is kept.
    pub fn error_cut(&self) -> bool {
        self.flags & ERROR_CUT != 0
    }
    /// Whether a later dead letter of the same job stands for it.
    pub fn superseded(&self) -> bool {
        self.flags & SUPERSEDED != 0
    }
    pub(super) fn set_superseded(&mut self, yes: bool) {
        if yes {
            self.flags |= SUPERSEDED;
        } else {
            self.flags &= !SUPERSEDED;
        }
    }
    /// Whether a search for `needle` finds it in the key, id, error or
    /// payload text.
    pub(super) fn contains(&self, needle: &str) -> bool {
        self.text.contains(needle)
    }
    /// Whether the record's key is exactly `key` (a key cut to
    /// [`KEY_BYTES`] never is).
    pub(super) fn key_is(&self, key: &str) -> bool {
        !self.key_cut() && self.text.split(SEP).next() == Some(key)
    }
    /// The bytes this entry holds, its text included.
    pub fn bytes(&self) -> usize {
        FIXED_BYTES_PER_ENTRY + self.text.len()
    }
}

/// The record fields the index takes from a dead letter: what the tailer
/// hands it for each DLQ record.
pub struct Incoming<'a> {
    /// Coordinates.
    pub at: Coordinates,
    /// Record timestamp.
    pub timestamp_ms: Option<i64>,
    /// Record key.
    pub key: Option<&'a [u8]>,
    /// Parsed headers.
    pub headers: JobHeaders,
    /// Payload.
    pub payload: Option<&'a [u8]>,
}

impl Entry {
    /// The entry of one dead letter, its job and class already interned.
    pub(super) fn new(r: Incoming<'_>, job: u32, class: u32, status: Status) -> Entry {
        let clean = |s: &str| -> String { s.replace(SEP, " ") };
        let key = r.key.map(|k| clean(&String::from_utf8_lossy(k)));
        let (k, key_cut) = prefix(key.as_deref().unwrap_or_default(), KEY_BYTES);
        let id = clean(r.headers.id.as_deref().unwrap_or_default());
        let (id, _) = prefix(&id, ID_BYTES);
        let error = clean(r.headers.error.as_deref().unwrap_or_default());
        let (error, error_cut) = prefix(&error, ERROR_BYTES);
        let payload = clean(&payload_text(r.payload.unwrap_or_default()));
        let mut text = String::with_capacity(k.len() + id.len() + error.len() + payload.len() + 3);
        for (i, f) in [k, id, error, &payload].iter().enumerate() {
            if i > 0 {
                text.push(SEP);
            }
            text.push_str(f);
        }
        let mut flags = 0;
        if key.is_some() {
            flags |= HAS_KEY;
        }
        if key_cut {
            flags |= KEY_CUT;
        }
        if error_cut {
            flags |= ERROR_CUT;
        }
        Entry {
            at: r.at,
            timestamp_ms: r.timestamp_ms.unwrap_or(0),
            attempt: r.headers.attempt.unwrap_or(0),
            job,
            class,
            status,
            flags,
            // Each cap is below 256.
            lens: [k.len() as u8, id.len() as u8, error.len() as u8],
            text: text.into_boxed_str(),
        }
    }
}
