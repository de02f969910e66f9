//! Records held in librdkafka's buffer until their attempt ends.
//!
//! Copying every record out of librdkafka on the poll thread, the one
//! serial stage of the worker, was its largest cost per record (issue 29:
//! the copy, then freeing librdkafka's message and its parsed header list,
//! about a third of the poll thread's time). But a librdkafka message is
//! reference-counted on the C side and may be destroyed from any thread
//! (librdkafka's `rd_kafka_message_destroy`), so a main-topic record read
//! through its partition's own queue ([`super::intake`]) is not copied at
//! all: [`Held`] owns librdkafka's message, the handler reads key, payload
//! and headers where librdkafka put them, and when its attempt ends the
//! message goes back to the poll thread to be destroyed
//! ([`super::recycle::Spent`]). Its headers are parsed on first use, on
//! the dispatcher that runs it ([`super::polled`]).
//!
//! Where the work lands was measured (1 000 000 no-op jobs, 8 partitions,
//! 2 cores; CPU ticks per thread): librdkafka's header parse, one
//! allocation per header, is the largest part of what the poll thread used
//! to do. Parsed lazily on the dispatcher and freed there with the message,
//! the worker used 2.3 µs of CPU per job against 2.7 for the copy; parsed
//! on the poll thread, or destroyed there after the dispatcher finished,
//! every header allocation was freed by another thread than the one that
//! made it, and the saving mostly went (2.6-2.7 µs).
//!
//! The cost is memory: a held record keeps librdkafka's buffer of the
//! records fetched with it (one decompressed producer batch, or for
//! uncompressed records the fetch response) alive until it finishes. The
//! in-flight bound per partition bounds how many records are held.
//!
//! Reading happens in batches ([`SplitQueue::read`]: one librdkafka call
//! for many records, not one queue poll, clock read and event allocation
//! per record as rdkafka's `PartitionQueue::poll` costs).
//!
//! **Soundness.** librdkafka must outlive its messages and queue handles:
//! destroying a message after `rd_kafka_destroy` would touch freed client
//! state. So every queue handle and every held record keeps the consumer
//! alive: each holds an [`Origin`] (one per split queue, so that the
//! records' reference counts are spread over as many cache lines as there
//! are partitions), and each origin holds the consumer. The consumer is
//! destroyed when the last of them goes, wherever that is. So that this is
//! the poll thread, off the async runtime, as for any close, the poll
//! thread waits (with a bound) until no record is held before it lets its
//! own reference go ([`Origins::released`]).

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Timestamp;

use super::poll::WorkerContext;

type KjobConsumer = BaseConsumer<WorkerContext>;

/// What every record read from one split queue shares: the topic's name
/// and the consumer, which must outlive them; its reference count is the
/// number of those records alive (and the queue handle, if it still is).
pub(crate) struct Origin {
    topic: Arc<str>,
    consumer: Arc<KjobConsumer>,
}

/// A librdkafka message this worker owns (see the module docs).
pub(crate) struct Held {
    ptr: NonNull<rd::rd_kafka_message_t>,
    origin: Arc<Origin>,
}

// SAFETY: librdkafka allows a message to be read and destroyed from any
// thread. Its fields (key, payload, offsets) were written by librdkafka's
// broker thread before the message was put in the queue the poll thread
// took it from, under that queue's lock, and nothing changes them after:
// `Held` hands out shared references only. The one write librdkafka does
// to a message it has handed over is parsing its header list on the first
// `rd_kafka_message_headers`, and `Polled` makes that call once, inside a
// `OnceLock` (super::polled), so it never runs twice or concurrently with
// a read of the list. `rd_kafka_message_destroy` runs once, in `drop`,
// which has the message to itself, and before `origin` (and with it
// perhaps the last reference to the consumer) is dropped.
unsafe impl Send for Held {}
// SAFETY: as above: shared references only read.
unsafe impl Sync for Held {}

impl Held {
    /// The raw message, for librdkafka's accessors. Valid while `self` is.
    pub(crate) fn as_ptr(&self) -> *const rd::rd_kafka_message_t {
        self.ptr.as_ptr()
    }

    fn msg(&self) -> &rd::rd_kafka_message_t {
        // SAFETY: `ptr` came from rd_kafka_consume_batch_queue and is
        // destroyed only in `drop`, so it is valid (and not written, see
        // the `Send` impl) for as long as `&self` is.
        unsafe { self.ptr.as_ref() }
    }

    pub(crate) fn topic(&self) -> &str {
        &self.origin.topic
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

    /// The payload, writable (rdkafka's `Message::payload_mut`).
    ///
    /// # Safety
    /// No other reference to the payload may be alive, as for
    /// `Message::payload_mut`.
    pub(crate) unsafe fn payload_mut(&mut self) -> Option<&mut [u8]> {
        let m = self.msg();
        if m.payload.is_null() {
            return None;
        }
        // SAFETY: librdkafka guarantees `len` bytes at a non-null payload,
        // owned by this message; the caller guarantees no other reference
        // to them, and `&mut self` that no other user of the message runs.
        Some(unsafe { std::slice::from_raw_parts_mut(m.payload.cast::<u8>(), m.len) })
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

impl Drop for Held {
    fn drop(&mut self) {
        // SAFETY: the message is ours (from rd_kafka_consume_batch_queue),
        // destroyed once, here, and librdkafka still lives: `origin` holds
        // the consumer, and fields are dropped only after `drop`.
        unsafe { rd::rd_kafka_message_destroy(self.ptr.as_ptr()) }
    }
}

/// Every [`Origin`] the poll thread created, so that it can tell when no
/// held record is left.
#[derive(Default)]
pub(crate) struct Origins {
    all: Vec<Arc<Origin>>,
}

impl Origins {
    /// A new origin for a split queue of `topic`.
    pub(crate) fn add(&mut self, topic: Arc<str>, consumer: &Arc<KjobConsumer>) -> Arc<Origin> {
        // Those of earlier splits whose records are all gone.
        self.all.retain(|o| Arc::strong_count(o) > 1);
        let o = Arc::new(Origin {
            topic,
            consumer: consumer.clone(),
        });
        self.all.push(o.clone());
        o
    }

    /// How many records (and split queue handles) are held now, anywhere
    /// in the worker.
    pub(crate) fn held(&self) -> usize {
        self.all.iter().map(|o| Arc::strong_count(o) - 1).sum()
    }

    /// Waits up to `bound` until no record is held (the jobs abandoned at
    /// the end of the grace period are dropped on the runtime, a moment
    /// after the abort). False if some still are: the consumer is then
    /// closed by whichever thread drops the last of them. Called once the
    /// split queues are dropped.
    pub(crate) fn released(&self, bound: Duration) -> bool {
        let until = Instant::now() + bound;
        loop {
            if self.held() == 0 {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// A partition's own queue (librdkafka's fetch queue of the partition,
/// no longer forwarded to the consumer's queue), read in batches.
pub(crate) struct SplitQueue {
    queue: NonNull<rd::rd_kafka_queue_t>,
    /// The non-empty callback's state, given to librdkafka as its opaque
    /// pointer: it must stay put until the callback is disabled.
    callback: Option<Box<Callback>>,
    /// Shared with the records read; keeps librdkafka alive for as long as
    /// the handle.
    origin: Arc<Origin>,
}

/// What the non-empty callback does.
struct Callback(Box<dyn Fn() + Send + Sync>);

// SAFETY: a librdkafka queue handle may be used and destroyed from any
// thread; the poll thread is its only user.
unsafe impl Send for SplitQueue {}

/// Records taken per librdkafka call at most.
const CHUNK: usize = 256;

impl SplitQueue {
    /// Splits `partition` of `origin.topic` off the consumer's queue (as
    /// rdkafka's `split_partition_queue`). `None` if librdkafka does not
    /// know the partition.
    pub(crate) fn split(origin: Arc<Origin>, partition: i32) -> Option<Self> {
        let topic = std::ffi::CString::new(origin.topic.as_bytes()).ok()?;
        // SAFETY: the client pointer is valid while the consumer lives,
        // which `origin` guarantees; `topic` is a valid C string.
        let ptr = unsafe {
            rd::rd_kafka_queue_get_partition(
                origin.consumer.client().native_ptr(),
                topic.as_ptr(),
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
            origin,
        })
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
        // after a new registration that no longer names it).
        unsafe {
            rd::rd_kafka_queue_cb_event_enable(self.queue.as_ptr(), Some(trampoline), opaque)
        };
        self.callback = Some(cb);
    }

    /// Takes up to `room` records into `out`, in offset order. An error
    /// librdkafka reported for the partition comes back after the records
    /// before it were taken. The second value is whether the queue was
    /// seen empty.
    pub(crate) fn read(
        &self,
        room: usize,
        mut out: impl FnMut(Held),
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
                let held = Held {
                    ptr,
                    origin: self.origin.clone(),
                };
                let err = held.msg().err;
                if err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                    out(held);
                } else if error.is_none() {
                    error = Some(match err {
                        rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__PARTITION_EOF => {
                            KafkaError::PartitionEOF(held.partition())
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

impl Drop for SplitQueue {
    fn drop(&mut self) {
        // SAFETY: a valid handle, destroyed once, here, while librdkafka
        // lives (`origin` holds it and is dropped after this). The callback is
        // disabled first, so librdkafka no longer holds `self.callback`'s
        // pointer when it is freed after this function.
        unsafe {
            rd::rd_kafka_queue_cb_event_enable(self.queue.as_ptr(), None, std::ptr::null_mut());
            rd::rd_kafka_queue_destroy(self.queue.as_ptr());
        }
    }
}
