//! Finished records go back to the poll thread, which reuses them (their
//! box and buffer) for the next records.
//!
//! The poll thread copies every record into one buffer
//! ([`crate::worker::intake::polled`]); a dispatcher, on another thread, finishes with
//! it. Freed there, each buffer went back to the poll thread's glibc arena
//! under that arena's lock, and the poll thread, whose own cache never
//! refilled, took every new buffer from the arena's bins: a quarter of the
//! poll thread's time per job went to `malloc` and the lock. So the
//! dispatchers hand finished records back ([`Returned`]), in one batch per
//! completion batch, and the poll thread keeps their buffers for the next
//! records ([`Spare`]), or frees them itself: in steady state a record
//! costs no allocation of kjob's at all. A record's box is kept with its
//! buffer: allocated per record instead, it cost the poll thread a
//! `malloc` and a `free` per job.
//!
//! The stash is bounded, in count and in each buffer's size, so a burst of
//! large records cannot pin its memory after the burst.

use std::sync::{Mutex, PoisonError};

/// Records kept at most: four poll batches' worth. What comes back while
/// the poll thread waits (its partitions at their in-flight bound) is
/// read again in the next batches; with one batch's worth kept, the rest
/// was freed and allocated again right after, a tenth of the poll
/// thread's time in a no-op run (CHANGELOG.md's benchmark history, issue 29's ninth
/// step).
const KEEP: usize = 4096;
/// A buffer larger than this is freed, not kept: one large record must not
/// hold its size for every record after it.
const KEEP_BYTES: usize = 16 * 1024;
/// The memory the kept records hold in all (buffers and boxes), in bytes:
/// a few thousand typical kjob records (a few hundred bytes of payload and
/// headers each), the most an idle worker holds on to after a burst.
const KEEP_TOTAL: usize = 2 * 1024 * 1024;

/// Finished records, handed from the dispatchers (giving) to the poll
/// thread (taking).
pub(crate) struct Returned<T> {
    done: Mutex<Vec<T>>,
}

impl<T> Default for Returned<T> {
    fn default() -> Self {
        Self {
            done: Mutex::new(Vec::new()),
        }
    }
}

impl<T> Returned<T> {
    /// Hands `done` over (leaving it empty, its capacity kept); one lock.
    pub(crate) fn give(&self, done: &mut Vec<T>) {
        if done.is_empty() {
            return;
        }
        let mut all = self.done.lock().unwrap_or_else(PoisonError::into_inner);
        all.append(done);
    }

    /// Moves everything handed over into `into`, to be dropped by the
    /// caller outside the lock.
    pub(crate) fn take(&self, into: &mut Vec<T>) {
        let mut all = self.done.lock().unwrap_or_else(PoisonError::into_inner);
        if into.is_empty() {
            std::mem::swap(&mut *all, into);
        } else {
            into.append(&mut all);
        }
    }
}

/// What the poll thread keeps for reuse: finished records (their box and
/// buffer both), or in unit tests plain buffers.
pub(crate) trait Reusable {
    /// The bytes it keeps allocated.
    fn capacity(&self) -> usize;
}

impl Reusable for Vec<u8> {
    fn capacity(&self) -> usize {
        Vec::capacity(self)
    }
}

impl Reusable for crate::worker::intake::polled::Polled {
    fn capacity(&self) -> usize {
        crate::worker::intake::polled::Polled::capacity(self)
    }
}

/// The poll thread's finished records, reused for the next records.
pub(crate) struct Spare<T> {
    kept: Vec<T>,
    /// The kept buffers' capacity, in bytes.
    bytes: usize,
}

impl<T> Default for Spare<T> {
    fn default() -> Self {
        Self {
            kept: Vec::new(),
            bytes: 0,
        }
    }
}

impl<T: Reusable> Spare<T> {
    /// Keeps `b` if it fits the bounds; frees it otherwise.
    pub(crate) fn keep(&mut self, b: T) {
        let cap = b.capacity();
        if cap == 0 || cap > KEEP_BYTES || self.kept.len() >= KEEP || self.bytes + cap > KEEP_TOTAL
        {
            return;
        }
        self.bytes += cap;
        self.kept.push(b);
    }

    /// One to fill again, if any is kept.
    pub(crate) fn take(&mut self) -> Option<T> {
        let b = self.kept.pop()?;
        self.bytes -= b.capacity();
        Some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spare_buffers_come_back_bounded() {
        let mut s = Spare::<Vec<u8>>::default();
        for i in 0..KEEP + 10 {
            s.keep(vec![i as u8; 64]);
        }
        s.keep(vec![0; KEEP_BYTES + 1]);
        s.keep(Vec::new());
        assert_eq!(s.kept.len(), KEEP, "kept up to the bound, the rest freed");
        let mut taken = Vec::new();
        while let Some(b) = s.take() {
            assert!(b.capacity() >= 64 && b.capacity() <= KEEP_BYTES);
            taken.push(b);
        }
        assert_eq!(taken.len(), KEEP);
        assert_eq!(s.bytes, 0);
        // The bound in bytes holds too.
        for _ in 0..200 {
            s.keep(Vec::with_capacity(KEEP_BYTES));
        }
        assert_eq!(s.kept.len(), KEEP_TOTAL / KEEP_BYTES);
        assert!(s.bytes <= KEEP_TOTAL);
    }

    #[test]
    fn records_returned_from_many_threads_all_reach_the_taker_once() {
        let r = std::sync::Arc::new(Returned::<u32>::default());
        let givers: Vec<_> = (0..4u32)
            .map(|g| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for i in 0..50u32 {
                        let mut done: Vec<u32> = (0..8).map(|k| g * 1000 + i * 8 + k).collect();
                        r.give(&mut done);
                        assert!(done.is_empty());
                    }
                })
            })
            .collect();
        let mut taken = Vec::new();
        for _ in 0..100 {
            r.take(&mut taken);
            std::thread::yield_now();
        }
        for g in givers {
            assert!(g.join().is_ok());
        }
        r.take(&mut taken);
        taken.sort_unstable();
        let before = taken.len();
        taken.dedup();
        assert_eq!(before, taken.len(), "none taken twice");
        assert_eq!(taken.len(), 4 * 50 * 8, "none lost");
    }
}
