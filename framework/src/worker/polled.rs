//! A polled record, copied out of librdkafka in two allocations.
//!
//! A job outlives the poll that fetched it (it waits in its lane, runs on a
//! dispatcher), so the worker must copy it out of librdkafka's buffer.
//! rdkafka's `detach` does so field by field: the topic name, key, payload,
//! and a C-side copy of the header list with one allocation per header. On
//! the poll thread, the one serial stage of the worker, that copy was the
//! largest cost per record. [`Polled`] keeps key, payload and every header
//! in one byte buffer plus one small index, and shares the topic name.
//!
//! It also reads header names without trusting them: a name that is not
//! UTF-8 (another producer's bug, or a hostile one) is kept with its bad
//! bytes replaced, where rdkafka's own header accessors would panic.

use std::ffi::CStr;
use std::ops::Range;
use std::sync::Arc;

use rdkafka::bindings as rd;
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, Timestamp};

/// See the module docs.
pub(crate) struct Polled {
    topic: Arc<str>,
    partition: i32,
    offset: i64,
    timestamp: Timestamp,
    key: Option<Range<usize>>,
    payload: Option<Range<usize>>,
    /// `None` for a record without headers (`Message::headers` says so).
    headers: Option<PolledHeaders>,
    /// Key and payload bytes.
    bytes: Box<[u8]>,
}

/// The headers of a [`Polled`] record, in their original order.
pub(crate) struct PolledHeaders {
    /// Names and values, back to back.
    bytes: Vec<u8>,
    index: Vec<(Range<usize>, Option<Range<usize>>)>,
}

impl Polled {
    /// Copies `msg`; `topic` is its topic name, shared by every record of
    /// the topic.
    pub(crate) fn copy(msg: &BorrowedMessage<'_>, topic: Arc<str>) -> Self {
        let key = msg.key();
        let payload = msg.payload();
        let (klen, plen) = (key.map_or(0, <[u8]>::len), payload.map_or(0, <[u8]>::len));
        let mut bytes = Vec::with_capacity(klen + plen);
        let key = key.map(|k| {
            bytes.extend_from_slice(k);
            0..klen
        });
        let payload = payload.map(|p| {
            let at = bytes.len();
            bytes.extend_from_slice(p);
            at..at + plen
        });
        Self {
            topic,
            partition: msg.partition(),
            offset: msg.offset(),
            timestamp: msg.timestamp(),
            key,
            payload,
            headers: copy_headers(msg),
            bytes: bytes.into_boxed_slice(),
        }
    }
}

/// The record's headers, read through librdkafka's C API (see the module
/// docs on header names).
fn copy_headers(msg: &BorrowedMessage<'_>) -> Option<PolledHeaders> {
    let mut hdrs: *mut rd::rd_kafka_headers_t = std::ptr::null_mut();
    // SAFETY: `msg.ptr()` is a valid message for the lifetime of `msg`;
    // librdkafka parses its headers on first use and keeps them with the
    // message, so `hdrs` is valid (and owned by the message) while `msg` is.
    let err = unsafe { rd::rd_kafka_message_headers(msg.ptr(), &mut hdrs) };
    if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || hdrs.is_null() {
        return None;
    }
    // SAFETY: as above.
    let count = unsafe { rd::rd_kafka_header_cnt(hdrs) };
    let mut out = PolledHeaders {
        bytes: Vec::new(),
        index: Vec::with_capacity(count),
    };
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
        let raw_name = unsafe { CStr::from_ptr(name) }.to_bytes();
        let at = out.bytes.len();
        match std::str::from_utf8(raw_name) {
            Ok(n) => out.bytes.extend_from_slice(n.as_bytes()),
            Err(_) => out
                .bytes
                .extend_from_slice(String::from_utf8_lossy(raw_name).as_bytes()),
        }
        let name_range = at..out.bytes.len();
        let value_range = (!value.is_null()).then(|| {
            // SAFETY: librdkafka guarantees `size` bytes at a non-null value.
            let v = unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) };
            let at = out.bytes.len();
            out.bytes.extend_from_slice(v);
            at..out.bytes.len()
        });
        out.index.push((name_range, value_range));
    }
    Some(out)
}

impl Headers for PolledHeaders {
    fn count(&self) -> usize {
        self.index.len()
    }

    fn try_get(&self, idx: usize) -> Option<Header<'_, &[u8]>> {
        let (name, value) = self.index.get(idx)?;
        // Always UTF-8: `copy_headers` stored it so.
        let key = std::str::from_utf8(self.bytes.get(name.clone())?).ok()?;
        Some(Header {
            key,
            value: value.clone().and_then(|v| self.bytes.get(v)),
        })
    }
}

impl Message for Polled {
    type Headers = PolledHeaders;

    fn key(&self) -> Option<&[u8]> {
        self.key.clone().and_then(|r| self.bytes.get(r))
    }

    fn payload(&self) -> Option<&[u8]> {
        self.payload.clone().and_then(|r| self.bytes.get(r))
    }

    unsafe fn payload_mut(&mut self) -> Option<&mut [u8]> {
        self.payload.clone().and_then(|r| self.bytes.get_mut(r))
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
        self.headers.as_ref()
    }
}
