//! A partition's own librdkafka queue, read in batches.
//!
//! Every main-topic partition is read through its own queue
//! ([`crate::worker::intake`] says why). rdkafka's `PartitionQueue::poll` takes one
//! record per call, and each call reads the clock, allocates an `Arc` for
//! librdkafka's event and looks at the event's type before the record is
//! copied ([`crate::worker::intake::polled`]) and the event destroyed. [`SplitQueue::read`]
//! takes up to a batch of records in one librdkafka call
//! (`rd_kafka_consume_batch_queue`) and hands each to the caller as a
//! [`Fetched`], destroyed right after, on the poll thread. With finished
//! records' buffers freed back on the poll thread ([`crate::worker::intake::recycle`]),
//! three interleaved 1 000 000-job no-op runs went from 107-110 to 80-87
//! CPU ticks on the poll thread and from 2.69-2.81 to 2.35-2.45 µs of CPU
//! per job (CHANGELOG.md's benchmark history, issue 29's sixth step).
//!
//! Keeping each record in librdkafka's buffer until its attempt ended,
//! instead of copying it, was measured too and not kept: on 2 cores it
//! moved librdkafka's header parse and the message's free onto the one
//! dispatcher, the serial stage, and jobs/s fell (see the same section).

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Timestamp;

/// A record just taken from a split queue, owned until [`SplitQueue::read`]
/// destroys it after the caller's look; it never leaves that call.
pub(crate) struct Fetched {
    ptr: NonNull<rd::rd_kafka_message_t>,
}

impl Fetched {
    /// The raw message, for librdkafka's accessors. Valid while `self` is.
    pub(crate) fn as_ptr(&self) -> *const rd::rd_kafka_message_t {
        self.ptr.as_ptr()
    }

    fn msg(&self) -> &rd::rd_kafka_message_t {
        // SAFETY: `ptr` came from rd_kafka_consume_batch_queue and is
        // destroyed only in `drop`, so it is valid for as long as `&self`.
        unsafe { self.ptr.as_ref() }
    }

    pub(crate) fn partition(&self) -> i32 {
        self.msg().partition
    }

    pub(crate) fn offset(&self) -> i64 {
        self.msg().offset
    }

    pub(crate) fn key(&self) -> Option<&[u8]> {
        let m = self.msg();
        bytes(m.key.cast_const(), m.key_len)
    }

    pub(crate) fn payload(&self) -> Option<&[u8]> {
        let m = self.msg();
        bytes(m.payload.cast_const(), m.len)
    }

    pub(crate) fn timestamp(&self) -> Timestamp {
        let mut kind = rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        // SAFETY: a valid message (see `msg`); `kind` is a valid local.
        let ts = unsafe { rd::rd_kafka_message_timestamp(self.as_ptr(), &mut kind) };
        match kind {
            _ if ts == -1 => Timestamp::NotAvailable,
            rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_CREATE_TIME => {
                Timestamp::CreateTime(ts)
            }
            rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME => {
                Timestamp::LogAppendTime(ts)
            }
            _ => Timestamp::NotAvailable,
        }
    }
}

/// `len` bytes at `at`, or `None` for a null pointer (a null key or
/// payload).
fn bytes<'a>(at: *const c_void, len: usize) -> Option<&'a [u8]> {
    if at.is_null() {
        return None;
    }
    // SAFETY: librdkafka guarantees `len` readable bytes at a non-null key
    // or payload of a message, for the message's lifetime, to which the
    // callers tie `'a` (they return it borrowed from `&self`).
    Some(unsafe { std::slice::from_raw_parts(at.cast::<u8>(), len) })
}

impl Drop for Fetched {
    fn drop(&mut self) {
        // SAFETY: the message is ours (from rd_kafka_consume_batch_queue),
        // destroyed once, here, inside `SplitQueue::read`, while the queue
        // handle, and through it librdkafka, lives.
        unsafe { rd::rd_kafka_message_destroy(self.ptr.as_ptr()) }
    }
}

/// A partition's own queue (librdkafka's fetch queue of the partition,
/// no longer forwarded to the consumer's queue), read in batches.
pub(crate) struct SplitQueue<C: ConsumerContext + 'static> {
    queue: NonNull<rd::rd_kafka_queue_t>,
    /// The non-empty callback's state, given to librdkafka as its opaque
    /// pointer: it must stay put until the callback is disabled.
    callback: Option<Box<Callback>>,
    topic: Arc<str>,
    /// Keeps librdkafka alive for as long as the handle.
    _consumer: Arc<BaseConsumer<C>>,
}

/// What the non-empty callback does.
struct Callback(Box<dyn Fn() + Send + Sync>);

// SAFETY: a librdkafka queue handle may be used and destroyed from any
// thread; the poll thread is its only user.
unsafe impl<C: ConsumerContext + 'static> Send for SplitQueue<C> {}

/// Records taken per librdkafka call at most.
const CHUNK: usize = 256;

impl<C: ConsumerContext + 'static> SplitQueue<C> {
    /// Splits `partition` of `topic` off the consumer's queue (as rdkafka's
    /// `split_partition_queue`). `None` if librdkafka does not know the
    /// partition.
    pub(crate) fn split(
        consumer: &Arc<BaseConsumer<C>>,
        topic: Arc<str>,
        partition: i32,
    ) -> Option<Self> {
        let name = std::ffi::CString::new(topic.as_bytes()).ok()?;
        // SAFETY: the client pointer is valid while the consumer lives,
        // which `consumer` guarantees; `name` is a valid C string.
        let ptr = unsafe {
            rd::rd_kafka_queue_get_partition(
                consumer.client().native_ptr(),
                name.as_ptr(),
                partition,
            )
        };
        let queue = NonNull::new(ptr)?;
        // SAFETY: a valid queue handle; a null destination stops the
        // forwarding to the consumer's queue.
        unsafe { rd::rd_kafka_queue_forward(queue.as_ptr(), std::ptr::null_mut()) };
        Some(Self {
            queue,
            callback: None,
            topic,
            _consumer: consumer.clone(),
        })
    }

    /// The topic's name, shared by its records.
    pub(crate) fn topic(&self) -> &Arc<str> {
        &self.topic
    }

    /// Calls `f` on librdkafka's thread whenever the queue turns non-empty.
    pub(crate) fn on_nonempty(&mut self, f: impl Fn() + Send + Sync + 'static) {
        unsafe extern "C" fn trampoline(_: *mut rd::rd_kafka_t, opaque: *mut c_void) {
            // SAFETY: `opaque` is the `Callback` boxed in `on_nonempty`,
            // which stays allocated until the callback is disabled (in
            // `drop`, or by the next `on_nonempty` before it is freed).
            let cb = unsafe { &*opaque.cast::<Callback>() };
            (cb.0)();
        }
        let cb = Box::new(Callback(Box::new(f)));
        let opaque = (&*cb as *const Callback).cast_mut().cast::<c_void>();
        // SAFETY: a valid queue handle; `opaque` outlives the registration
        // (it is kept in `self.callback` until replaced or dropped, each
        // after a new registration that no longer names it; librdkafka
        // swaps the callback under the queue's lock, which it holds while
        // calling it).
        unsafe {
            rd::rd_kafka_queue_cb_event_enable(self.queue.as_ptr(), Some(trampoline), opaque)
        };
        self.callback = Some(cb);
    }

    /// Takes up to `room` records, in offset order, and calls `each` with
    /// each; a record is destroyed as soon as `each` returns. An error
    /// librdkafka reported for the partition comes back after the records
    /// before it were seen. The second value is whether the queue was seen
    /// empty.
    pub(crate) fn read(
        &self,
        room: usize,
        mut each: impl FnMut(&Fetched),
    ) -> (Option<KafkaError>, bool) {
        let mut ptrs: [*mut rd::rd_kafka_message_t; CHUNK] = [std::ptr::null_mut(); CHUNK];
        let mut left = room;
        let mut error = None;
        while left > 0 {
            let want = left.min(CHUNK);
            // SAFETY: a valid queue handle; `ptrs` has room for `want`
            // pointers. Timeout 0: returns at once with what is queued.
            let n = unsafe {
                rd::rd_kafka_consume_batch_queue(self.queue.as_ptr(), 0, ptrs.as_mut_ptr(), want)
            };
            let n = usize::try_from(n).unwrap_or(0).min(want);
            for &p in &ptrs[..n] {
                let Some(ptr) = NonNull::new(p) else { continue };
                // Owned from here: destroyed at the end of this iteration.
                let fetched = Fetched { ptr };
                let err = fetched.msg().err;
                if err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                    each(&fetched);
                } else if error.is_none() {
                    error = Some(match err {
                        rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__PARTITION_EOF => {
                            KafkaError::PartitionEOF(fetched.partition())
                        }
                        e => KafkaError::MessageConsumption(e.into()),
                    });
                }
            }
            left -= n;
            if n < want {
                return (error, true);
            }
        }
        (error, false)
    }
}

impl<C: ConsumerContext + 'static> Drop for SplitQueue<C> {
    fn drop(&mut self) {
        // SAFETY: a valid handle, destroyed once, here, while librdkafka
        // lives (`_consumer` is dropped after this). The callback is
        // disabled first, so librdkafka no longer holds `self.callback`'s
        // pointer when it is freed after this function.
        unsafe {
            rd::rd_kafka_queue_cb_event_enable(self.queue.as_ptr(), None, std::ptr::null_mut());
            rd::rd_kafka_queue_destroy(self.queue.as_ptr());
        }
    }
}
