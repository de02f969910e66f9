//! A polled record, copied out of librdkafka in two allocations.
//!
//! A job outlives the poll that fetched it (it waits in its lane, runs on a
//! dispatcher), so the worker must copy it out of librdkafka's buffer.
//! rdkafka's `detach` does so field by field: the topic name, key, payload,
//! and a C-side copy of the header list with one allocation per header. On
//! the poll thread, the one serial stage of the worker, that copy was the
//! largest cost per record. [`Polled`] keeps key, payload and every header
//! in one byte buffer plus one small index, and shares the topic name.
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

/// See the module docs.
pub(crate) struct Polled {
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
    /// Name and value (absent: a null header value) of each header.
    index: Vec<(Span, Option<Span>)>,
}

impl Polled {
    /// Copies `msg`; `topic` is its topic name, shared by every record of
    /// the topic.
    pub(crate) fn copy(msg: &BorrowedMessage<'_>, topic: Arc<str>) -> Self {
        let mut bytes = Vec::new();
        let push = |bytes: &mut Vec<u8>, b: &[u8]| {
            let at = bytes.len() as u32;
            bytes.extend_from_slice(b);
            Span {
                at,
                len: b.len() as u32,
            }
        };
        let (key, payload) = (msg.key(), msg.payload());
        bytes.reserve(key.map_or(0, <[u8]>::len) + payload.map_or(0, <[u8]>::len) + 256);
        let key = key.map(|k| push(&mut bytes, k));
        let payload = payload.map(|p| push(&mut bytes, p));
        let mut index = Vec::with_capacity(8);
        let has_headers = copy_headers(msg, |name, value| {
            let name = match std::str::from_utf8(name) {
                Ok(n) => push(&mut bytes, n.as_bytes()),
                Err(_) => push(&mut bytes, String::from_utf8_lossy(name).as_bytes()),
            };
            let value = value.map(|v| push(&mut bytes, v));
            index.push((name, value));
        });
        Self {
            topic,
            partition: msg.partition(),
            offset: msg.offset(),
            timestamp: msg.timestamp(),
            key,
            payload,
            data: PolledHeaders { bytes, index },
            has_headers,
        }
    }
}

impl Polled {
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
            self.topic.to_string(),
            self.timestamp,
            self.partition,
            self.offset,
            headers,
        )
    }
}

/// Calls `each(name, value)` for every header of `msg`, read through
/// librdkafka's C API (see the module docs on header names). False if the
/// record has no headers.
fn copy_headers(msg: &BorrowedMessage<'_>, mut each: impl FnMut(&[u8], Option<&[u8]>)) -> bool {
    let mut hdrs: *mut rd::rd_kafka_headers_t = std::ptr::null_mut();
    // SAFETY: `msg.ptr()` is a valid message for the lifetime of `msg`;
    // librdkafka parses its headers on first use and keeps them with the
    // message, so `hdrs` is valid (and owned by the message) while `msg` is.
    let err = unsafe { rd::rd_kafka_message_headers(msg.ptr(), &mut hdrs) };
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
        self.index.len()
    }

    fn try_get(&self, idx: usize) -> Option<Header<'_, &[u8]>> {
        let (name, value) = self.index.get(idx)?;
        // Always UTF-8: `Polled::copy` stored it so.
        let key = std::str::from_utf8(Span::of(&self.bytes, *name)?).ok()?;
        Some(Header {
            key,
            value: value.and_then(|v| Span::of(&self.bytes, v)),
        })
    }
}

impl Message for Polled {
    type Headers = PolledHeaders;

    fn key(&self) -> Option<&[u8]> {
        Span::of(&self.data.bytes, self.key?)
    }

    fn payload(&self) -> Option<&[u8]> {
        Span::of(&self.data.bytes, self.payload?)
    }

    unsafe fn payload_mut(&mut self) -> Option<&mut [u8]> {
        let p = self.payload?;
        let end = (p.at as usize).checked_add(p.len as usize)?;
        self.data.bytes.get_mut(p.at as usize..end)
    }

    fn topic(&self) -> &str {
        &self.topic
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
        self.has_headers.then_some(&self.data)
    }
}
