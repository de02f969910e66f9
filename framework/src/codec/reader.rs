//! Reading records: the writer schema, fetched by id from a
//! [`SchemaSource`], resolved to the contract's reader schema compiled into
//! this binary ([`ReaderSchema`]), with bounded allocations for hostile
//! bodies.

use std::collections::HashMap;
use std::sync::Arc;

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value;
use apache_avro::{from_value, Schema};

use super::wire::MAGIC_BYTE;
#[cfg(doc)]
use super::Codec;
use crate::classify::ErrorClass;
use crate::job::Job;

/// The most any single allocation may take while decoding an Avro body.
///
/// An Avro string, bytes, array or map starts with a length, and the Avro
/// library allocates that length *before* reading the data. A hostile or
/// corrupt record of ten bytes can therefore claim half a gigabyte (the
/// library's default bound is 512 MiB), and with 64 jobs in flight a worker
/// would reserve 32 GiB for nothing. Jobs carry references, not documents
/// (and Kafka's default record limit is 1 MiB), so kjob bounds every such
/// allocation at 4 MiB; a longer value fails as a corrupt body
/// (`decode.body`, dead-lettered). A map's hash table may round up to about
/// twice that (`benches/src/bin/fuzz_decoder.rs` measures it). The bound is apache-avro's
/// process-wide, set-once setting: an application that calls
/// `apache_avro::util::max_allocation_bytes` before creating any kjob codec
/// keeps its own value.
pub const MAX_DECODE_ALLOCATION: usize = 4 * 1024 * 1024;

/// Applies [`MAX_DECODE_ALLOCATION`] unless the process chose a bound
/// already. Cheap after the first call (a `OnceLock` read).
pub fn bound_decode_allocations() -> usize {
    apache_avro::util::max_allocation_bytes(MAX_DECODE_ALLOCATION)
}

/// Why a record could not be turned into a job. Each variant maps to an
/// [`ErrorClass`] so poison records land in the DLQ with a specific reason.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Empty, shorter than the 5-byte header, or a wrong magic byte.
    #[error("not Confluent-framed: {0}")]
    NotFramed(String),
    /// The registry does not know this schema id.
    #[error("unknown schema id {id}: {message}")]
    UnknownSchema {
        /// The id from the record header.
        id: u32,
        /// The registry's answer.
        message: String,
    },
    /// The registry could not be reached. Transient: the record is fine and
    /// must be retried, never dead-lettered for this.
    #[error("schema registry unavailable while fetching schema id {id}: {message}")]
    RegistryUnavailable {
        /// The id being fetched.
        id: u32,
        /// The transport error.
        message: String,
    },
    /// The body is truncated or corrupt.
    #[error("corrupt Avro body for schema id {id}: {message}")]
    Body {
        /// The writer schema id.
        id: u32,
        /// The Avro library's reason.
        message: String,
    },
    /// The writer schema cannot be resolved to the reader schema, or the
    /// resolved value does not fit the Rust type.
    #[error("schema id {id} cannot be read as this binary's contract: {message}")]
    Incompatible {
        /// The writer schema id.
        id: u32,
        /// The reason.
        message: String,
    },
}

impl DecodeError {
    /// The class recorded when this record is dead-lettered, or `None` if
    /// the failure is transient and the record must be retried instead.
    pub fn class(&self) -> Option<ErrorClass> {
        match self {
            DecodeError::NotFramed(_) => Some(ErrorClass::DecodeNotFramed),
            DecodeError::UnknownSchema { .. } => Some(ErrorClass::DecodeUnknownSchema),
            DecodeError::RegistryUnavailable { .. } => None,
            DecodeError::Body { .. } => Some(ErrorClass::DecodeBody),
            DecodeError::Incompatible { .. } => Some(ErrorClass::DecodeIncompatible),
        }
    }
}

/// A writer schema as a [`SchemaSource`] holds it (shared, never copied
/// per record).
#[derive(Clone)]
pub enum WriterSchema {
    /// From the registry client's cache.
    Registry(Arc<Schema>),
    /// From an in-memory store.
    Owned(Arc<Schema>),
}

impl WriterSchema {
    /// The parsed schema.
    pub fn schema(&self) -> &Schema {
        match self {
            WriterSchema::Registry(s) | WriterSchema::Owned(s) => s,
        }
    }
}

/// Where writer schemas come from: the registry in production
/// ([`Codec`]), an in-memory store in `kjob::testing` (feature `testing`). Decoding goes
/// through this trait so both run the same resolution code.
pub trait SchemaSource: Send + Sync {
    /// The writer schema with this id.
    fn writer(
        &self,
        id: u32,
    ) -> futures::future::BoxFuture<'_, std::result::Result<WriterSchema, DecodeError>>;

    /// The writer schema with this id if it is at hand without waiting:
    /// decoding then needs no future of its own (the steady state, where
    /// every id was fetched before). `None` sends the caller to
    /// [`SchemaSource::writer`].
    fn cached(&self, _id: u32) -> Option<WriterSchema> {
        None
    }
}
/// A contract's reader schema plus what kjob learned about each writer
/// schema it met: when a writer is identical to the reader (the steady
/// state outside a deploy), records deserialize straight from the bytes into
/// the Rust type, with no intermediate value tree and no resolution.
pub struct ReaderSchema {
    schema: Schema,
    canonical: String,
    identical: std::sync::RwLock<HashMap<u32, bool>>,
    /// The id of the writer schema last found identical to the reader
    /// ([`NO_WRITER`]: none yet), read without a lock: in the steady state
    /// every record names it, and its records decode without a look at the
    /// writer cache or at `identical`.
    direct_id: std::sync::atomic::AtomicU64,
    /// The fields each writer's records carry that this reader drops
    /// ([`crate::schema::dropped_fields`]), for the writers that carry any:
    /// computed once per writer id, when it is first found not identical.
    dropped: std::sync::RwLock<HashMap<u32, Arc<[String]>>>,
    /// Whether `dropped` holds anything: the steady state (no writer drops
    /// a field) pays one relaxed load per record for the signal.
    any_dropped: std::sync::atomic::AtomicBool,
    /// A datum reader over the reader schema, built once: building one
    /// resolves every named type, which cost more than decoding a small
    /// record. Used for writers identical to the reader (same canonical
    /// form, so the same binary layout). `None` if it could not be built.
    direct: Option<DirectReader>,
}

/// A [`GenericDatumReader`] together with the schema it borrows.
#[ouroboros::self_referencing]
struct DirectReader {
    schema: Schema,
    #[borrows(schema)]
    #[covariant]
    reader: GenericDatumReader<'this>,
}

impl DirectReader {
    fn build(schema: &Schema) -> Option<Self> {
        DirectReaderTryBuilder {
            schema: schema.clone(),
            reader_builder: |s: &Schema| GenericDatumReader::builder(s).build(),
        }
        .try_build()
        .ok()
    }
}

impl ReaderSchema {
    /// Wraps a parsed reader schema.
    pub fn new(schema: Schema) -> Self {
        bound_decode_allocations();
        Self {
            canonical: schema.canonical_form(),
            direct: DirectReader::build(&schema),
            schema,
            identical: std::sync::RwLock::new(HashMap::new()),
            direct_id: std::sync::atomic::AtomicU64::new(NO_WRITER),
            dropped: std::sync::RwLock::new(HashMap::new()),
            any_dropped: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Decodes `body` straight into `J` if its writer `id` is the one last
    /// found identical to the reader. `None` if it is not, or if the direct
    /// read fails (the caller takes the general path, which also decides
    /// what such a failure means).
    fn decode_known_direct<J: Job>(
        &self,
        id: u32,
        body: &[u8],
    ) -> Option<std::result::Result<J, DecodeError>> {
        if self.direct_id.load(std::sync::atomic::Ordering::Relaxed) != u64::from(id) {
            return None;
        }
        let mut cursor = body;
        let job = self
            .direct
            .as_ref()?
            .borrow_reader()
            .read_deser::<J>(&mut cursor)
            .ok()?;
        Some(match cursor.is_empty() {
            true => Ok(job),
            false => Err(trailing(id, cursor.len())),
        })
    }

    /// The schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    fn is_identical(&self, id: u32, writer: &Schema) -> bool {
        if let Some(known) = self
            .identical
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&id)
        {
            // Two identical writers in use (mid-deploy): the one seen last
            // takes the direct path. One marked not identical meanwhile
            // (a direct read failed where the general one did not) is
            // never the direct one, whatever a racing store left.
            match *known {
                true if self.direct.is_some() => self
                    .direct_id
                    .store(u64::from(id), std::sync::atomic::Ordering::Relaxed),
                true => {}
                false => self.forget_direct(id),
            }
            return *known;
        }
        let same = writer.canonical_form() == self.canonical;
        if !same {
            self.note_dropped(id, writer);
        }
        let mut identical = self
            .identical
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // A verdict already there (a failed direct read's `false`) stands.
        let same = *identical.entry(id).or_insert(same);
        if same && self.direct.is_some() {
            self.direct_id
                .store(u64::from(id), std::sync::atomic::Ordering::Relaxed);
        }
        same
    }

    /// Records which fields of `writer` this reader drops, if any.
    fn note_dropped(&self, id: u32, writer: &Schema) {
        let fields = crate::schema::dropped_fields(writer, &self.schema);
        if fields.is_empty() {
            return;
        }
        self.dropped
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(id, fields.into());
        self.any_dropped
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The writer id of a framed record and the fields its writer carries
    /// that this reader drops, when it drops any: a record a newer producer
    /// wrote, read by an older reader that loses what it added. Known once
    /// a record of that writer was decoded. One relaxed load when no
    /// writer met so far drops a field.
    #[inline]
    pub fn dropped_by(&self, bytes: Option<&[u8]>) -> Option<(u32, Arc<[String]>)> {
        if !self.any_dropped.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let (id, _) = split_frame(bytes).ok()?;
        let fields = self
            .dropped
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&id)?
            .clone();
        Some((id, fields))
    }

    /// Stops decoding records of writer `id` directly, if they were.
    fn forget_direct(&self, id: u32) {
        let _ = self.direct_id.compare_exchange(
            u64::from(id),
            NO_WRITER,
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Decodes a framed record into `J`, fetching the writer schema from
    /// `source` (unless it is the writer last found identical to the
    /// reader, whose records need no look at it).
    pub async fn decode<J: Job>(
        &self,
        source: &dyn SchemaSource,
        bytes: Option<&[u8]>,
    ) -> std::result::Result<J, DecodeError> {
        let (id, body) = split_frame(bytes)?;
        if let Some(decoded) = self.decode_known_direct(id, body) {
            return decoded;
        }
        let writer = match source.cached(id) {
            Some(w) => w,
            None => source.writer(id).await?,
        };
        self.decode_with(id, writer.schema(), body)
    }

    /// Decodes a framed record into `J` if its writer schema is cached in
    /// `source`; `None` if it is not (then [`ReaderSchema::decode`] fetches
    /// it). Synchronous, so the worker decodes nearly every record without
    /// a future: a cached schema is the steady state.
    pub fn decode_cached<J: Job>(
        &self,
        source: &dyn SchemaSource,
        bytes: Option<&[u8]>,
    ) -> Option<std::result::Result<J, DecodeError>> {
        let (id, body) = match split_frame(bytes) {
            Ok(frame) => frame,
            Err(e) => return Some(Err(e)),
        };
        if let Some(decoded) = self.decode_known_direct(id, body) {
            return Some(decoded);
        }
        let writer = source.cached(id)?;
        Some(self.decode_with(id, writer.schema(), body))
    }

    /// Decodes `body`, written with the schema `writer` registered as `id`.
    fn decode_with<J: Job>(
        &self,
        id: u32,
        writer: &Schema,
        body: &[u8],
    ) -> std::result::Result<J, DecodeError> {
        if self.is_identical(id, writer) {
            let mut cursor = body;
            let fast = match &self.direct {
                Some(direct) => direct.borrow_reader().read_deser::<J>(&mut cursor),
                None => GenericDatumReader::builder(writer)
                    .build()
                    .and_then(|r| r.read_deser::<J>(&mut cursor)),
            };
            match fast {
                Ok(job) if cursor.is_empty() => return Ok(job),
                Ok(_) => return Err(trailing(id, cursor.len())),
                Err(_) => {
                    // The direct path is stricter than value resolution
                    // (e.g. about Rust type names). If the general path
                    // reads this record, use it for this writer from now on.
                    let slow = decode_body::<J>(id, writer, body, &self.schema);
                    if slow.is_ok() {
                        self.identical
                            .write()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .insert(id, false);
                        self.forget_direct(id);
                    }
                    return slow;
                }
            }
        }
        decode_body::<J>(id, writer, body, &self.schema)
    }
}

/// [`ReaderSchema::direct_id`] when no writer is known identical (ids are
/// 32-bit).
const NO_WRITER: u64 = u64::MAX;

/// The error for a body with `left` bytes after the record.
fn trailing(id: u32, left: usize) -> DecodeError {
    DecodeError::Body {
        id,
        message: format!("{left} trailing bytes after the record"),
    }
}

/// Decodes an Avro body written with `writer` as `J` via `reader`. Pure and
/// synchronous, so the in-memory test harness and the worker share it.
pub fn decode_body<J: Job>(
    id: u32,
    writer: &Schema,
    body: &[u8],
    reader: &Schema,
) -> std::result::Result<J, DecodeError> {
    let value = decode_value(id, writer, body, reader)?;
    from_value::<J>(&value).map_err(|e| DecodeError::Incompatible {
        id,
        message: e.to_string(),
    })
}

/// Decodes an Avro body written with `writer` and resolves it to `reader`.
pub fn decode_value(
    id: u32,
    writer: &Schema,
    body: &[u8],
    reader: &Schema,
) -> std::result::Result<Value, DecodeError> {
    bound_decode_allocations();
    let mut cursor = body;
    let written = GenericDatumReader::builder(writer)
        .build()
        .and_then(|r| r.read_value(&mut cursor))
        .map_err(|e| DecodeError::Body {
            id,
            message: e.to_string(),
        })?;
    if !cursor.is_empty() {
        return Err(DecodeError::Body {
            id,
            message: format!("{} trailing bytes after the record", cursor.len()),
        });
    }
    // Avro resolution: a field renamed in the reader (with the old name as
    // an alias) takes the writer's value; then defaults, promotions, unions.
    rename_aliased(written, reader)
        .resolve(reader)
        .map_err(|e| DecodeError::Incompatible {
            id,
            message: e.to_string(),
        })
}

/// Renames top-level record fields the writer named by one of the reader
/// field's aliases (apache-avro's value resolution matches names only).
fn rename_aliased(value: Value, reader: &Schema) -> Value {
    let Schema::Record(rs) = reader else {
        return value;
    };
    let Value::Record(fields) = value else {
        return value;
    };
    let renamed = fields
        .into_iter()
        .map(|(name, v)| {
            if rs.fields.iter().any(|f| f.name == name) {
                return (name, v);
            }
            let target = rs.fields.iter().find(|f| f.aliases.contains(&name));
            match target {
                Some(f) => (f.name.clone(), v),
                None => (name, v),
            }
        })
        .collect();
    Value::Record(renamed)
}

/// Splits a Confluent-framed record into its schema id and body.
pub fn split_frame(bytes: Option<&[u8]>) -> std::result::Result<(u32, &[u8]), DecodeError> {
    bound_decode_allocations();
    let bytes = bytes.ok_or_else(|| DecodeError::NotFramed("record has no value".into()))?;
    if bytes.len() < 5 {
        return Err(DecodeError::NotFramed(format!(
            "{} bytes, the header alone needs 5",
            bytes.len()
        )));
    }
    if bytes[0] != MAGIC_BYTE {
        return Err(DecodeError::NotFramed(format!(
            "magic byte is {:#04x}, expected 0x00",
            bytes[0]
        )));
    }
    let id = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    Ok((id, &bytes[5..]))
}
