//! Record buffers go back to the poll thread when their attempt ends.
//!
//! The poll thread copies every record of the consumer's own queue (retry
//! tiers, delay buckets, fair routes; main-topic records are held instead,
//! [`super::held`]) into one buffer ([`super::polled`]);
//! a dispatcher, on another thread, finishes with it. Freed there, each
//! buffer went back to the poll thread's glibc arena under that arena's
//! lock, and the poll thread, whose own cache never refilled, took every
//! new buffer from the arena's bins: a quarter of the poll thread's time
//! per job went to `malloc` and the lock. Handing the emptied buffers back
//! instead, in one batch per completion batch, lets the poll thread reuse
//! them: in steady state a record costs no allocation at all.
//!
//! The pool is bounded, in count and in each buffer's size, so a burst of
//! large records cannot pin its memory after the burst.

use std::sync::{Mutex, PoisonError};

/// Buffers kept at most: one poll batch's worth.
const KEEP: usize = 1024;
/// A buffer larger than this is freed, not kept: one large record must not
/// hold its size for every record after it.
const KEEP_BYTES: usize = 16 * 1024;
/// The pool's capacity in all, in bytes: about a thousand typical kjob
/// records (a few hundred bytes of payload and headers each).
const KEEP_TOTAL: usize = 1024 * 1024;

/// Emptied record buffers, shared by the dispatchers (giving) and the poll
/// thread (taking).
#[derive(Default)]
pub(crate) struct Buffers {
    pool: Mutex<Pool>,
}

#[derive(Default)]
struct Pool {
    kept: Vec<Vec<u8>>,
    /// The kept buffers' capacity, in bytes.
    bytes: usize,
}

impl Buffers {
    /// Keeps the buffers of `done` (emptied) for the poll thread, up to
    /// the bound; one lock for the whole batch.
    pub(crate) fn give(&self, done: &mut Vec<Vec<u8>>) {
        // A held record's (super::held) is empty and unallocated.
        done.retain(|b| b.capacity() > 0 && b.capacity() <= KEEP_BYTES);
        if done.is_empty() {
            return;
        }
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        // Taken from the back, so that a buffer that does not fit stays in
        // `done` and is not freed while the lock is held.
        while let Some(b) = done.last() {
            if pool.kept.len() >= KEEP || pool.bytes + b.capacity() > KEEP_TOTAL {
                break;
            }
            if let Some(mut b) = done.pop() {
                b.clear();
                pool.bytes += b.capacity();
                pool.kept.push(b);
            }
        }
        drop(pool);
        // What did not fit is freed here, outside the lock.
        done.clear();
    }

    /// Moves the kept buffers into `spare` (the poll thread's own stash,
    /// which it draws from without a lock until it is empty).
    pub(crate) fn take(&self, spare: &mut Vec<Vec<u8>>) {
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        pool.bytes = 0;
        if spare.is_empty() {
            std::mem::swap(&mut pool.kept, spare);
        } else {
            spare.append(&mut pool.kept);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_emptied_and_bounded() {
        let b = Buffers::default();
        let mut done: Vec<Vec<u8>> = (0..KEEP + 10).map(|i| vec![i as u8; 64]).collect();
        done.push(vec![0; KEEP_BYTES + 1]);
        b.give(&mut done);
        assert!(done.is_empty());
        let mut spare = Vec::new();
        b.take(&mut spare);
        assert_eq!(spare.len(), KEEP, "kept up to the bound, the rest freed");
        // The bound in bytes holds too.
        let mut big: Vec<Vec<u8>> = (0..200).map(|_| Vec::with_capacity(KEEP_BYTES)).collect();
        b.give(&mut big);
        let mut kept = Vec::new();
        b.take(&mut kept);
        assert_eq!(kept.len(), KEEP_TOTAL / KEEP_BYTES);
        assert!(spare.iter().all(|s| s.is_empty() && s.capacity() >= 64));
        assert!(spare.iter().all(|s| s.capacity() <= KEEP_BYTES));
        let mut more = Vec::new();
        b.take(&mut more);
        assert!(more.is_empty(), "taken once");
    }

    #[test]
    fn buffers_given_from_many_threads_all_come_back_under_the_bound() {
        let b = std::sync::Arc::new(Buffers::default());
        let givers: Vec<_> = (0..4)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || {
                    for _ in 0..25 {
                        let mut done: Vec<Vec<u8>> =
                            (0..8).map(|_| Vec::with_capacity(32)).collect();
                        b.give(&mut done);
                    }
                })
            })
            .collect();
        let mut taken = 0;
        let mut spare = Vec::new();
        for _ in 0..200 {
            b.take(&mut spare);
            taken += spare.len();
            spare.clear();
            std::thread::yield_now();
        }
        for g in givers {
            assert!(g.join().is_ok());
        }
        b.take(&mut spare);
        taken += spare.len();
        // 800 in all, under the bound: none may be dropped, whatever the
        // interleaving.
        assert_eq!(taken, 4 * 25 * 8, "every buffer given came back");
    }
}
