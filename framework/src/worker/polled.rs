//! A polled record: held in librdkafka's buffer, or copied out of it.
//!
//! A job outlives the poll that fetched it (it waits in its lane, runs on a
//! dispatcher). A main-topic record read through its partition's own queue
//! stays where librdkafka put it until its attempt ends
//! ([`super::held`]): no copy on the poll thread, and its headers are
//! parsed on first use, on the dispatcher that runs it. A record from the
//! consumer's own queue (retry tiers, delay buckets, fair routes) comes as
//! rdkafka's `BorrowedMessage`, tied to the poll, and is copied: key,
//! payload, every header and the headers' index in one byte buffer (one
//! allocation per record, none once buffers come back,
//! [`super::recycle`]), sharing the topic name. rdkafka's `detach` would
//! copy field by field, with one allocation per header.
//! A record's parts are at most `i32::MAX` bytes in Kafka, so `u32`
//! offsets into the buffer suffice.
//!
//! Header names are read without trusting them: a name that is not UTF-8
//! (another producer's bug, or a hostile one) is kept with its bad bytes
//! replaced, where rdkafka's own header accessors would panic.

use std::ffi::CStr;
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

use rdkafka::bindings as rd;
use rdkafka::message::{
    BorrowedMessage, Header, Headers, Message, OwnedHeaders, OwnedMessage, Timestamp,
};

use super::held::Held;

/// See the module docs.
pub(crate) struct Polled {
    partition: i32,
    offset: i64,
    timestamp: Timestamp,
    body: Body,
}

enum Body {
    /// Copied out of librdkafka (a record of the consumer's own queue).
    Copied {
        topic: Arc<str>,
        key: Option<Span>,
        payload: Option<Span>,
        /// The bytes and the header index.
        data: PolledHeaders,
        /// False for a record without headers (`Message::headers` says so).
        has_headers: bool,
    },
    /// Still in librdkafka's buffer; its headers read on first use.
    Held {
        msg: Held,
        headers: OnceLock<Option<PolledHeaders>>,
    },
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

/// A record's headers: librdkafka's own list (a held record whose header
/// names are all UTF-8), or an index into a copy.
pub(crate) struct PolledHeaders(Store);

enum Store {
    /// The record's bytes (for a copied record: key, payload, header names
    /// and values) and, from `index_at`, per header four little-endian
    /// `u32`s (name at, name length, value at, value length), a value at
    /// of `u32::MAX` for a null value.
    Index {
        bytes: Vec<u8>,
        index_at: u32,
        count: u32,
    },
    /// librdkafka's parsed header list of a held record, owned by the
    /// message; every name in it was checked to be UTF-8.
    Native {
        list: NonNull<rd::rd_kafka_headers_t>,
        count: usize,
    },
}

// SAFETY: `Native`'s list belongs to a message the same `Polled` holds
// (super::held), and is only read after it was parsed (librdkafka writes
// to a message's header list only when it is parsed, or when headers are
// added or removed, which kjob never does to a polled record).
unsafe impl Send for PolledHeaders {}
// SAFETY: as above: only read.
unsafe impl Sync for PolledHeaders {}

/// Bytes per header in the index.
const ENTRY: usize = 16;
const NULL: u32 = u32::MAX;

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let b: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_le_bytes(b))
}

fn push(bytes: &mut Vec<u8>, b: &[u8]) -> Span {
    let at = bytes.len() as u32;
    bytes.extend_from_slice(b);
    Span {
        at,
        len: b.len() as u32,
    }
}

impl Polled {
    /// A record read through its partition's own queue, not copied.
    pub(crate) fn held(msg: Held) -> Self {
        Self {
            partition: msg.partition(),
            offset: msg.offset(),
            timestamp: msg.timestamp(),
            body: Body::Held {
                msg,
                headers: OnceLock::new(),
            },
        }
    }

    /// Copies `msg`; `topic` is its topic name, shared by every record of
    /// the topic.
    pub(crate) fn copy(msg: &BorrowedMessage<'_>, topic: Arc<str>) -> Self {
        Self::copy_into(msg, topic, Vec::new())
    }

    /// [`Polled::copy`] into `bytes`, an emptied buffer of an earlier
    /// record ([`super::recycle`]), so that no allocation is needed when
    /// it is large enough.
    pub(crate) fn copy_into(
        msg: &BorrowedMessage<'_>,
        topic: Arc<str>,
        mut bytes: Vec<u8>,
    ) -> Self {
        bytes.clear();
        let (key, payload) = (msg.key(), msg.payload());
        // Room for a typical kjob header set and its index, so the buffer
        // is allocated once.
        bytes.reserve(key.map_or(0, <[u8]>::len) + payload.map_or(0, <[u8]>::len) + 512);
        let key = key.map(|k| push(&mut bytes, k));
        let payload = payload.map(|p| push(&mut bytes, p));
        let list = header_list(msg.ptr());
        let (index_at, count) = match list {
            Some(list) => index_headers(&mut bytes, list),
            None => (bytes.len() as u32, 0),
        };
        Self {
            partition: msg.partition(),
            offset: msg.offset(),
            timestamp: msg.timestamp(),
            body: Body::Copied {
                topic,
                key,
                payload,
                data: PolledHeaders(Store::Index {
                    bytes,
                    index_at,
                    count,
                }),
                has_headers: list.is_some(),
            },
        }
    }

    /// The record's buffer, to be reused for another record
    /// ([`super::recycle`]); empty (and unallocated) for a held record,
    /// which this destroys.
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        match self.body {
            Body::Copied {
                data: PolledHeaders(Store::Index { bytes, .. }),
                ..
            } => bytes,
            _ => Vec::new(),
        }
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
            self.topic().to_string(),
            self.timestamp,
            self.partition,
            self.offset,
            headers,
        )
    }
}

/// The header list of `msg`, parsed by librdkafka on the first call (which
/// writes to the message: see super::held on why that is called once per
/// message). `None` if the record has no headers.
fn header_list(msg: *const rd::rd_kafka_message_t) -> Option<NonNull<rd::rd_kafka_headers_t>> {
    let mut hdrs: *mut rd::rd_kafka_headers_t = std::ptr::null_mut();
    // SAFETY: `msg` is a valid message (the callers hold it); librdkafka
    // keeps the parsed list with the message, so it is valid, and owned
    // by the message, for as long as the message is.
    let err = unsafe { rd::rd_kafka_message_headers(msg, &mut hdrs) };
    if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        return None;
    }
    NonNull::new(hdrs)
}

/// Calls `each(name, value)` for every header in `list` (see the module
/// docs on header names).
fn each_header(list: NonNull<rd::rd_kafka_headers_t>, mut each: impl FnMut(&[u8], Option<&[u8]>)) {
    // SAFETY: a valid list, owned by a message the caller holds.
    let count = unsafe { rd::rd_kafka_header_cnt(list.as_ptr()) };
    for idx in 0..count {
        if let Some((name, value)) = native_header(list, idx) {
            each(name, value);
        }
    }
}

/// Header `idx` of `list`: its name's bytes and its value, borrowed from
/// the list (the caller ties them to the message's lifetime).
fn native_header<'a>(
    list: NonNull<rd::rd_kafka_headers_t>,
    idx: usize,
) -> Option<(&'a [u8], Option<&'a [u8]>)> {
    let mut name: *const std::os::raw::c_char = std::ptr::null();
    let mut value: *const std::os::raw::c_void = std::ptr::null();
    let mut size: usize = 0;
    // SAFETY: a valid list; an `idx` past the end is an error, not a read;
    // the out-pointers are valid locals.
    let err = unsafe {
        rd::rd_kafka_header_get_all(list.as_ptr(), idx, &mut name, &mut value, &mut size)
    };
    if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
        return None;
    }
    // SAFETY: librdkafka stores header names NUL-terminated, in the list.
    let name = unsafe { CStr::from_ptr(name) }.to_bytes();
    // SAFETY: librdkafka guarantees `size` bytes at a non-null value.
    let value =
        (!value.is_null()).then(|| unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) });
    Some((name, value))
}

/// Appends the headers of `list` and their index to `bytes` (names not
/// UTF-8 with their bad bytes replaced); returns where the index starts and
/// how many headers it has.
fn index_headers(bytes: &mut Vec<u8>, list: NonNull<rd::rd_kafka_headers_t>) -> (u32, u32) {
    // The spans go into a small stack buffer first and after the header
    // bytes at the end (spilling to the heap past 16 headers).
    let mut index: Vec<(Span, Option<Span>)> = Vec::new();
    let mut inline = [(Span { at: 0, len: 0 }, None); 16];
    let mut count = 0usize;
    each_header(list, |name, value| {
        let name = match std::str::from_utf8(name) {
            Ok(n) => push(bytes, n.as_bytes()),
            Err(_) => push(bytes, String::from_utf8_lossy(name).as_bytes()),
        };
        let value = value.map(|v| push(bytes, v));
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
    (index_at, count as u32)
}

/// A held record's headers, read once: librdkafka's list as it is when
/// every name is UTF-8 (the usual case: nothing is copied), else an index
/// of a copy with the bad names mended.
fn held_headers(msg: &Held) -> Option<PolledHeaders> {
    let list = header_list(msg.as_ptr())?;
    // SAFETY: a valid list (header_list).
    let count = unsafe { rd::rd_kafka_header_cnt(list.as_ptr()) };
    let all_utf8 = (0..count)
        .all(|i| native_header(list, i).is_some_and(|(name, _)| std::str::from_utf8(name).is_ok()));
    if all_utf8 {
        return Some(PolledHeaders(Store::Native { list, count }));
    }
    let mut bytes = Vec::new();
    let (index_at, count) = index_headers(&mut bytes, list);
    Some(PolledHeaders(Store::Index {
        bytes,
        index_at,
        count,
    }))
}

impl Headers for PolledHeaders {
    fn count(&self) -> usize {
        match &self.0 {
            Store::Index { count, .. } => *count as usize,
            Store::Native { count, .. } => *count,
        }
    }

    fn try_get(&self, idx: usize) -> Option<Header<'_, &[u8]>> {
        let (bytes, index_at, count) = match &self.0 {
            Store::Native { list, count } => {
                if idx >= *count {
                    return None;
                }
                let (name, value) = native_header(*list, idx)?;
                // SAFETY: `held_headers` made a `Native` store only after
                // checking that every name in the list is UTF-8, and the
                // list does not change after (see the `Send` impl).
                let key = unsafe { std::str::from_utf8_unchecked(name) };
                return Some(Header { key, value });
            }
            Store::Index {
                bytes,
                index_at,
                count,
            } => (bytes, *index_at, *count),
        };
        if idx >= count as usize {
            return None;
        }
        let at = (index_at as usize).checked_add(idx.checked_mul(ENTRY)?)?;
        let field = |i: usize| u32_at(bytes, at + 4 * i);
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
        let name = Span::of(bytes, name)?;
        // SAFETY: every name span in the index was written by
        // `index_headers` from a `&str` (the name as it was when it was
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
            value: value.and_then(|v| Span::of(bytes, v)),
        })
    }
}

impl Message for Polled {
    type Headers = PolledHeaders;

    fn key(&self) -> Option<&[u8]> {
        match &self.body {
            Body::Copied {
                key,
                data: PolledHeaders(Store::Index { bytes, .. }),
                ..
            } => Span::of(bytes, (*key)?),
            Body::Copied { .. } => None,
            Body::Held { msg, .. } => msg.key(),
        }
    }

    fn payload(&self) -> Option<&[u8]> {
        match &self.body {
            Body::Copied {
                payload,
                data: PolledHeaders(Store::Index { bytes, .. }),
                ..
            } => Span::of(bytes, (*payload)?),
            Body::Copied { .. } => None,
            Body::Held { msg, .. } => msg.payload(),
        }
    }

    unsafe fn payload_mut(&mut self) -> Option<&mut [u8]> {
        match &mut self.body {
            Body::Copied {
                payload,
                data: PolledHeaders(Store::Index { bytes, .. }),
                ..
            } => {
                let p = (*payload)?;
                let end = (p.at as usize).checked_add(p.len as usize)?;
                bytes.get_mut(p.at as usize..end)
            }
            Body::Copied { .. } => None,
            // SAFETY: the caller's guarantee, passed on.
            Body::Held { msg, .. } => unsafe { msg.payload_mut() },
        }
    }

    fn topic(&self) -> &str {
        match &self.body {
            Body::Copied { topic, .. } => topic,
            Body::Held { msg, .. } => msg.topic(),
        }
    }

    fn partition(&self) -> i32 {
        self.partition
    }

    fn offset(&self) -> i64 {
        self.offset
    }

    fn timestamp(&self) -> Timestamp {
        self.timestamp
    }

    fn headers(&self) -> Option<&PolledHeaders> {
        match &self.body {
            Body::Copied {
                data, has_headers, ..
            } => has_headers.then_some(data),
            Body::Held { msg, headers } => headers.get_or_init(|| held_headers(msg)).as_ref(),
        }
    }
}
