//! Debounce: of several waiting jobs with the same key on a route, only the
//! newest runs ([`WorkerBuilder::debounce`](crate::WorkerBuilder::debounce)).
//!
//! A search index refresh, a cache rebuild, a "sync this customer to the
//! CRM": enqueued on every change, useful once. With a debounce window the
//! worker holds each main-topic job until `window` after it was written
//! (parked: the wait holds no handler slot), and then runs it only if no
//! newer job of the same key reached the worker meanwhile. The older ones
//! finish as `superseded`: committed without a handler call, counted in
//! `kjob_jobs_total{outcome="superseded"}` and `WorkerStats::superseded`.
//!
//! How it knows: the poll thread notes, for each `(topic, partition, key)`
//! of a debounced route, the newest offset it has fetched. A key's jobs all
//! sit in one partition and are fetched in offset order, so "a newer offset
//! of my key was fetched" is exactly "a newer job of my key exists". The
//! map forgets a key once its newest job ran, so it holds the keys with a
//! job in flight.
//!
//! What it keeps:
//! - **Nothing is lost.** The newest job of a key always runs; a superseded
//!   job is committed only as the watermark allows, like any finished job.
//! - **Across a crash or a rebalance.** Uncommitted records are fetched
//!   again by the partition's next owner, newest included, and the same
//!   rule picks the same survivor (a job that ran before the crash may run
//!   again: at-least-once).
//! - **Best effort past the in-flight bound.** A newer job the worker has
//!   not fetched yet (more than `max_in_flight_per_partition` records
//!   behind) does not count: the older one runs, and so does the newer.
//!
//! Keyless records run as on any route, without a wait. Retries (tier
//! records) are not debounced: they are already a job's only live copy.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// A record key where it lives: `(topic, partition, key)`.
type KeyAt = (String, i32, Vec<u8>);

/// The debounce windows of a worker's routes, and the newest offset of each
/// key fetched on them.
#[derive(Debug, Default)]
pub(crate) struct Debounce {
    /// Main topic to window.
    windows: HashMap<String, Duration>,
    /// `(topic, partition, key)` to the newest offset fetched.
    newest: Mutex<HashMap<KeyAt, i64>>,
}

impl Debounce {
    /// `None` when no route debounces: nothing is noted or checked.
    pub(crate) fn new(windows: HashMap<String, Duration>) -> Option<Self> {
        (!windows.is_empty()).then(|| Self {
            windows,
            newest: Mutex::default(),
        })
    }

    /// The window of `topic`, if it is a debounced route's main topic.
    pub(crate) fn window(&self, topic: &str) -> Option<Duration> {
        self.windows.get(topic).copied()
    }

    /// The poll thread fetched `offset` of `key` (records of debounced
    /// routes only).
    pub(crate) fn seen(&self, topic: &str, partition: i32, key: &[u8], offset: i64) {
        let mut newest = self.newest.lock().unwrap_or_else(PoisonError::into_inner);
        let at = newest
            .entry((topic.to_string(), partition, key.to_vec()))
            .or_insert(offset);
        *at = (*at).max(offset);
    }

    /// Whether a newer job of `key` than `offset` was fetched.
    pub(crate) fn superseded(&self, topic: &str, partition: i32, key: &[u8], offset: i64) -> bool {
        self.newest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(topic.to_string(), partition, key.to_vec()))
            .is_some_and(|n| *n > offset)
    }

    /// The job at `offset` runs: forget its key if it is the newest.
    pub(crate) fn running(&self, topic: &str, partition: i32, key: &[u8], offset: i64) {
        let mut newest = self.newest.lock().unwrap_or_else(PoisonError::into_inner);
        let k = (topic.to_string(), partition, key.to_vec());
        if newest.get(&k).is_some_and(|n| *n <= offset) {
            newest.remove(&k);
        }
    }

    /// Keys with a job in flight (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.newest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn debounce() -> Debounce {
        Debounce::new(HashMap::from([("t".to_string(), Duration::from_secs(1))]))
            .unwrap_or_default()
    }

    #[test]
    fn only_routes_with_a_window_debounce() {
        assert!(Debounce::new(HashMap::new()).is_none());
        let d = debounce();
        assert_eq!(d.window("t"), Some(Duration::from_secs(1)));
        assert_eq!(d.window("other"), None);
    }

    #[test]
    fn the_newest_of_a_key_survives_and_is_forgotten_when_it_runs() {
        let d = debounce();
        for o in [3, 5, 9] {
            d.seen("t", 0, b"k", o);
        }
        d.seen("t", 0, b"other", 4);
        // Another partition's key of the same bytes is another key.
        d.seen("t", 1, b"k", 1);
        assert!(d.superseded("t", 0, b"k", 3) && d.superseded("t", 0, b"k", 5));
        assert!(!d.superseded("t", 0, b"k", 9));
        assert!(!d.superseded("t", 0, b"other", 4));
        assert!(!d.superseded("t", 1, b"k", 1));
        // An older one running (it slipped past) forgets nothing.
        d.running("t", 0, b"k", 5);
        assert!(d.superseded("t", 0, b"k", 5));
        d.running("t", 0, b"k", 9);
        assert!(
            !d.superseded("t", 0, b"k", 5),
            "forgotten once the newest ran"
        );
        assert_eq!(d.len(), 2);
    }

    proptest! {
        /// Whatever the order records are noted and checked in (a poll
        /// batch, a redelivery after a crash), exactly the newest offset of
        /// each key is not superseded once every record was fetched.
        #[test]
        fn exactly_the_newest_of_each_key_runs(
            records in proptest::collection::vec((0u8..5, 0i64..1000), 1..200),
            redelivered in proptest::collection::vec(0usize..200, 0..50),
        ) {
            let d = debounce();
            let mut offsets: Vec<(u8, i64)> = Vec::new();
            for (i, (key, _)) in records.iter().enumerate() {
                offsets.push((*key, i as i64));
            }
            for (key, o) in &offsets {
                d.seen("t", 0, &[*key], *o);
            }
            for i in redelivered {
                if let Some((key, o)) = offsets.get(i) {
                    d.seen("t", 0, &[*key], *o);
                }
            }
            for (key, o) in &offsets {
                let newest = offsets.iter().filter(|(k, _)| k == key).map(|(_, o)| *o).max();
                prop_assert_eq!(d.superseded("t", 0, &[*key], *o), Some(*o) != newest);
            }
        }
    }
}
