//! A polled record, copied out of librdkafka into a box and a buffer that
//! are reused from record to record.
//!
//! A job outlives the poll that fetched it (it waits in its lane, runs on a
//! dispatcher), so the worker copies it out of librdkafka's buffer.
//! (Keeping it there until its attempt ended was measured and not kept:
//! [`crate::worker::intake::split_queue`] says why.)
//! rdkafka's `detach` does so field by field: the topic name, key, payload,
//! and a C-side copy of the header list with one allocation per header. On
//! the poll thread, the one serial stage of the worker, that copy was the
//! largest cost per record. [`Polled`] keeps key, payload, every header
//! and the headers' index in one byte buffer, its other fields in a box
//! (so that the scheduler moves a pointer), and shares the topic name.
//! Both are reused for later records ([`crate::worker::intake::recycle`]): in steady state
//! a copy allocates nothing.
//! A record's parts are at most `i32::MAX` bytes in Kafka, so `u32`
//! offsets into the buffer suffice.
//!
//! It also reads header names without trusting them: a name that is not
//! UTF-8 (another producer's bug, or a hostile one) is kept with its bad
//! bytes replaced, where rdkafka's own header accessors would panic.

use std::ffi::CStr;
use std::sync::Arc;

use rdkafka::bindings as rd;
use rdkafka::message::{
    BorrowedMessage, Header, Headers, Message, OwnedHeaders, OwnedMessage, Timestamp,
};

use crate::worker::intake::split_queue::Fetched;

/// See the module docs.
///
/// Boxed: the scheduler moves each job several times between its queues
/// under the hub's lock (into a key's lane, to the ready queue, into a
/// dispatcher's batch), and a pointer moves faster than the record's
/// fields, which are read cold by then.
pub(crate) struct Polled(Box<Fields>);

/// A [`Polled`] record's fields.
struct Fields {
    topic: Arc<str>,
    partition: i32,
    offset: i64,
    timestamp: Timestamp,
    key: Option<Span>,
    payload: Option<Span>,
    /// The bytes and the header index.
    data: PolledHeaders,
    /// False for a record without headers (`Message::headers` says so).
    has_headers: bool,
}

/// A byte range in a record's buffer (u32: a Kafka record is far below
/// 4 GiB).
#[derive(Clone, Copy)]
struct Span {
    at: u32,
    len: u32,
}

impl Span {
    fn of(bytes: &[u8], span: Span) -> Option<&[u8]> {
        bytes.get(span.at as usize..(span.at as usize).checked_add(span.len as usize)?)
    }
}

/// The record's bytes (key, payload, header names and values) and its
/// headers' index, in its one allocation. Every record has it, whether or
/// not it has headers; [`Message::headers`] hands it out only if it does.
pub(crate) struct PolledHeaders {
    bytes: Vec<u8>,
    /// Where the index starts in `bytes`: per header, four little-endian
    /// `u32`s (name at, name length, value at, value length), a value at
    /// of `u32::MAX` for a null value.
    index_at: u32,
    count: u32,
}

/// Room for a record's headers and their index beyond its key and payload:
/// an enqueued job's four headers and index take about 170 bytes. A
/// retry's larger set (an error message of up to 1 KiB) grows the buffer
/// once, and the grown buffer is reused ([`crate::worker::intake::recycle`]). 512 bytes
/// was a third of the memory every buffered record took, and a worker
/// reading ahead faults all of it in.
const HEADER_ROOM: usize = 256;

/// Bytes per header in the index.
const ENTRY: usize = 16;
const NULL: u32 = u32::MAX;

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let b: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_le_bytes(b))
}

impl Polled {
    /// Copies `msg`; `topic` is its topic name, shared by every record of
    /// the topic.
    pub(crate) fn copy(msg: &BorrowedMessage<'_>, topic: Arc<str>) -> Self {
        Self::copy_into(msg, topic, None)
    }

    /// [`Polled::copy`] into `reuse`, an earlier record that is finished
    /// ([`crate::worker::intake::recycle`]), so that no allocation is needed when its
    /// buffer is large enough.
    pub(crate) fn copy_into(
        msg: &BorrowedMessage<'_>,
        topic: Arc<str>,
        reuse: Option<Polled>,
    ) -> Self {
        let parts = Parts {
            raw: msg.ptr(),
            key: msg.key(),
            payload: msg.payload(),
            partition: msg.partition(),
            offset: msg.offset(),
            timestamp: msg.timestamp(),
        };
        Self::copy_parts(parts, topic, reuse)
    }

    /// [`Polled::copy_into`] for a record read from a split queue in a
    /// batch ([`crate::worker::intake::split_queue`]).
    pub(crate) fn copy_fetched(msg: &Fetched, topic: Arc<str>, reuse: Option<Polled>) -> Self {
        let parts = Parts {
            raw: msg.as_ptr(),
            key: msg.key(),
            payload: msg.payload(),
            partition: msg.partition(),
            offset: msg.offset(),
            timestamp: msg.timestamp(),
        };
        Self::copy_parts(parts, topic, reuse)
    }

    fn copy_parts(msg: Parts<'_>, topic: Arc<str>, reuse: Option<Polled>) -> Self {
        let (boxed, mut bytes) = match reuse {
            Some(Polled(mut b)) => {
                let bytes = std::mem::take(&mut b.data.bytes);
                (Some(b), bytes)
            }
            None => (None, Vec::new()),
        };
        bytes.clear();
        let push = |bytes: &mut Vec<u8>, b: &[u8]| {
            let at = bytes.len() as u32;
            bytes.extend_from_slice(b);
            Span {
                at,
                len: b.len() as u32,
            }
        };
        let (key, payload) = (msg.key, msg.payload);
        // Room for a typical kjob header set and its index, so the buffer
        // is allocated once.
        bytes.reserve(key.map_or(0, <[u8]>::len) + payload.map_or(0, <[u8]>::len) + HEADER_ROOM);
        let key = key.map(|k| push(&mut bytes, k));
        let payload = payload.map(|p| push(&mut bytes, p));
        // The spans go into a small stack buffer first and after the
        // header bytes at the end (spilling to the heap past 16 headers).
        let mut index: Vec<(Span, Option<Span>)> = Vec::new();
        let mut inline = [(Span { at: 0, len: 0 }, None); 16];
        let mut count = 0usize;
        let has_headers = copy_headers(msg.raw, |name, value| {
            let name = match std::str::from_utf8(name) {
                Ok(n) => push(&mut bytes, n.as_bytes()),
                Err(_) => push(&mut bytes, String::from_utf8_lossy(name).as_bytes()),
            };
            let value = value.map(|v| push(&mut bytes, v));
            match inline.get_mut(count) {
                Some(slot) if index.is_empty() => *slot = (name, value),
                _ => {
                    if index.is_empty() {
                        index.extend_from_slice(&inline);
                    }
                    index.push((name, value));
                }
            }
            count += 1;
        });
        let index_at = bytes.len() as u32;
        let spans = if index.is_empty() {
            &inline[..count.min(inline.len())]
        } else {
            &index[..]
        };
        bytes.reserve(spans.len() * ENTRY);
        for (name, value) in spans {
            let (v_at, v_len) = value.map_or((NULL, 0), |v| (v.at, v.len));
            for n in [name.at, name.len, v_at, v_len] {
                bytes.extend_from_slice(&n.to_le_bytes());
            }
        }
        let fields = Fields {
            topic,
            partition: msg.partition,
            offset: msg.offset,
            timestamp: msg.timestamp,
            key,
            payload,
            data: PolledHeaders {
                bytes,
                index_at,
                count: count as u32,
            },
            has_headers,
        };
        match boxed {
            Some(mut b) => {
                *b = fields;
                Self(b)
            }
            None => Self(Box::new(fields)),
        }
    }
}

#[cfg(test)]
impl Polled {
    /// A record of `topic` at `partition` and `offset`, without key,
    /// payload or headers: for unit tests that need only where it is.
    pub(crate) fn for_test(topic: &str, partition: i32, offset: i64) -> Self {
        Self(Box::new(Fields {
            topic: Arc::from(topic),
            partition,
            offset,
            timestamp: Timestamp::NotAvailable,
            key: None,
            payload: None,
            data: PolledHeaders {
                bytes: Vec::new(),
                index_at: 0,
                count: 0,
            },
            has_headers: false,
        }))
    }
}

impl Polled {
    /// Asks the CPU to bring the record's fields into its cache, ahead of
    /// their first use on a thread other than the one that wrote them.
    pub(crate) fn prefetch_fields(&self) {
        prefetch(
            std::ptr::from_ref::<Fields>(&self.0).cast(),
            std::mem::size_of::<Fields>(),
        );
    }

    /// Asks the CPU to bring the record's bytes (key, payload, headers)
    /// into its cache, up to [`PREFETCH_BYTES`]. Reads the fields: call
    /// [`Polled::prefetch_fields`] a step earlier.
    pub(crate) fn prefetch_bytes(&self) {
        let b = &self.0.data.bytes;
        prefetch(b.as_ptr(), b.len().min(PREFETCH_BYTES));
    }

    /// The memory the record keeps allocated (its buffer and its box), for
    /// the bounds on what is kept for reuse ([`crate::worker::intake::recycle`]).
    pub(crate) fn capacity(&self) -> usize {
        self.0.data.bytes.capacity() + std::mem::size_of::<Fields>()
    }

    /// An rdkafka `OwnedMessage` with the same content, for code that keeps
    /// records as such (the DLQ store): unlike `detach()`, its header names
    /// are valid UTF-8, so rdkafka's accessors cannot panic on them later.
    pub(crate) fn to_owned_message(&self) -> OwnedMessage {
        let headers = self.headers().map(|h| {
            (0..h.count()).filter_map(|i| h.try_get(i)).fold(
                OwnedHeaders::new_with_capacity(h.count()),
                |acc, hd| {
                    acc.insert(Header {
                        key: hd.key,
                        value: hd.value,
                    })
                },
            )
        });
        OwnedMessage::new(
            self.payload().map(<[u8]>::to_vec),
            self.key().map(<[u8]>::to_vec),
            self.0.topic.to_string(),
            self.0.timestamp,
            self.0.partition,
            self.0.offset,
            headers,
        )
    }
}

/// What a copy reads of a librdkafka message, whichever way it was read.
struct Parts<'a> {
    /// The message, valid for `'a`.
    raw: *const rd::rd_kafka_message_t,
    key: Option<&'a [u8]>,
    payload: Option<&'a [u8]>,
    partition: i32,
    offset: i64,
    timestamp: Timestamp,
}

/// Calls `each(name, value)` for every header of `msg`, read through
/// librdkafka's C API (see the module docs on header names). False if the
/// record has no headers.
fn copy_headers(
    msg: *const rd::rd_kafka_message_t,
    mut each: impl FnMut(&[u8], Option<&[u8]>),
) -> bool {
    let mut hdrs: *mut rd::rd_kafka_headers_t = std::ptr::null_mut();
    // SAFETY: `msg` is a valid message for as long as the `Parts` it came
    // in (the caller's borrow of the message); librdkafka parses its
    // headers on first use and keeps them with the message, so `hdrs` is
    // valid (and owned by the message) while the message is.
    let err = unsafe { rd::rd_kafka_message_headers(msg, &mut hdrs) };
    if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || hdrs.is_null() {
        return false;
    }
    // SAFETY: as above.
    let count = unsafe { rd::rd_kafka_header_cnt(hdrs) };
    for idx in 0..count {
        let mut name: *const std::os::raw::c_char = std::ptr::null();
        let mut value: *const std::os::raw::c_void = std::ptr::null();
        let mut size: usize = 0;
        // SAFETY: `idx < count`; the out-pointers are valid locals.
        let err =
            unsafe { rd::rd_kafka_header_get_all(hdrs, idx, &mut name, &mut value, &mut size) };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            continue;
        }
        // SAFETY: librdkafka stores header names NUL-terminated.
        let name = unsafe { CStr::from_ptr(name) }.to_bytes();
        // SAFETY: librdkafka guarantees `size` bytes at a non-null value.
        let value = (!value.is_null())
            .then(|| unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) });
        each(name, value);
    }
    true
}

impl Headers for PolledHeaders {
    fn count(&self) -> usize {
        self.count as usize
    }

    fn try_get(&self, idx: usize) -> Option<Header<'_, &[u8]>> {
        if idx >= self.count as usize {
            return None;
        }
        let at = (self.index_at as usize).checked_add(idx.checked_mul(ENTRY)?)?;
        let field = |i: usize| u32_at(&self.bytes, at + 4 * i);
        let name = Span {
            at: field(0)?,
            len: field(1)?,
        };
        let value = match field(2)? {
            NULL => None,
            v_at => Some(Span {
                at: v_at,
                len: field(3)?,
            }),
        };
        let name = Span::of(&self.bytes, name)?;
        // SAFETY: every name span in the index was written by
        // `Polled::copy` from a `&str` (the name as it was when it was
        // valid UTF-8, else its lossy conversion), and nothing writes to
        // those bytes afterwards: `payload_mut` hands out the payload's
        // span only, and spans never overlap (each is appended after the
        // last). So the bytes are valid UTF-8. Checking them again here was
        // a tenth of a dispatcher's time per job: every header of every
        // record is read on the poll thread and again when it runs. The
        // non-UTF-8 header test in tests/tests/foreign.rs runs this path.
        let key = unsafe { std::str::from_utf8_unchecked(name) };
        Some(Header {
            key,
            value: value.and_then(|v| Span::of(&self.bytes, v)),
        })
    }
}

impl Message for Polled {
    type Headers = PolledHeaders;

    fn key(&self) -> Option<&[u8]> {
        Span::of(&self.0.data.bytes, self.0.key?)
    }

    fn payload(&self) -> Option<&[u8]> {
        Span::of(&self.0.data.bytes, self.0.payload?)
    }

    unsafe fn payload_mut(&mut self) -> Option<&mut [u8]> {
        let p = self.0.payload?;
        let end = (p.at as usize).checked_add(p.len as usize)?;
        self.0.data.bytes.get_mut(p.at as usize..end)
    }

    fn topic(&self) -> &str {
        &self.0.topic
    }

    fn partition(&self) -> i32 {
        self.0.partition
    }

    fn offset(&self) -> i64 {
        self.0.offset
    }

    fn timestamp(&self) -> Timestamp {
        self.0.timestamp
    }

    fn headers(&self) -> Option<&PolledHeaders> {
        self.0.has_headers.then_some(&self.0.data)
    }
}

/// The most of a record's bytes [`Polled::prefetch_bytes`] asks for: a
/// typical kjob record (a small payload and its headers) in all, a large
/// one's start.
const PREFETCH_BYTES: usize = 512;

/// Asks the CPU to bring the `len` bytes at `at` into its cache, one cache
/// line at a time. A hint only: it never faults and changes no result, and
/// on targets other than x86-64 it does nothing.
fn prefetch(at: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        if len == 0 {
            return;
        }
        // From the cache line `at` is in to the one its last byte is in.
        let skew = at as usize % 64;
        let line = at.wrapping_sub(skew);
        for offset in (0..skew + len).step_by(64) {
            // SAFETY: a prefetch reads nothing the program can see and never
            // faults, whatever the address (`wrapping_add` keeps the
            // pointer arithmetic itself defined).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line.wrapping_add(offset).cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (at, len);
}
