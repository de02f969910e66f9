//! An in-memory index of one DLQ, kept by a long-lived process (the
//! dashboard) so that listing, sorting, counting and searching a million
//! dead letters never re-reads the topic.
//!
//! **What it holds.** One [`Entry`] per stored dead letter: its coordinates,
//! timestamp, attempt, job and error class (interned), its audit status, and
//! one string with the key, the job id, the error message and the printable
//! text of the payload's first bytes, each cut to a cap ([`KEY_BYTES`],
//! [`ID_BYTES`], [`ERROR_BYTES`], [`PAYLOAD_BYTES`]). The whole record is
//! fetched by its coordinates when someone opens it or acts on it. An entry
//! costs about [`FIXED_BYTES_PER_ENTRY`] plus its text (at most
//! [`MAX_TEXT_BYTES`]): 1 000 000 dead letters with short keys and errors take
//! roughly 230 MB.
//!
//! **How it stays correct** (the tailer in [`tail`]):
//! - it reads the DLQ and its audit topic from their start once, then
//!   follows them: every record appended after that arrives through the
//!   same consumer, so a new dead letter or a new re-drive/resolve shows
//!   within a poll (about a second), without reading anything twice;
//! - it fetches the partitions' watermarks every few seconds: a high
//!   watermark tells how far behind it is (the page says "indexing n of m"
//!   until it has caught up); a low watermark that moved means retention
//!   deleted records, and entries below it are dropped; a high watermark
//!   below what it read means the topic was recreated, and that partition is
//!   read again from its start; new partitions are read from their start;
//! - audit entries are applied whichever arrives first (the dead letter or
//!   its audit record), and a tombstone removes one;
//! - nothing is persisted: a restart rebuilds the index from the topics,
//!   which remain the only truth.
//!
//! The caller's view can thus lag the log by a poll. Actions re-check what
//! they pick against the index and fetch the records themselves, so a
//! record audited in that window may be re-driven twice (a duplicate, the
//! same guarantee as the CLI's), never lost.

mod entry;
mod query;
pub mod tail;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use super::store::{AuditEntry, Coordinates};
pub use entry::{
    Entry, Incoming, Status, ERROR_BYTES, FIXED_BYTES_PER_ENTRY, ID_BYTES, KEY_BYTES,
    MAX_TEXT_BYTES, PAYLOAD_BYTES,
};
pub use query::{Page, Query, Row, Sort, StatusFilter};

/// Interned strings (job names, error classes): an id per distinct value,
/// 0 for "none".
#[derive(Default)]
struct Interner {
    names: Vec<Option<String>>,
    ids: HashMap<String, u32>,
}

impl Interner {
    fn new() -> Self {
        Self {
            names: vec![None],
            ids: HashMap::new(),
        }
    }
    fn id(&mut self, name: Option<&str>) -> u32 {
        let Some(name) = name else { return 0 };
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        let id = self.names.len() as u32;
        self.names.push(Some(name.to_string()));
        self.ids.insert(name.to_string(), id);
        id
    }
    fn name(&self, id: u32) -> Option<&str> {
        self.names.get(id as usize).and_then(|n| n.as_deref())
    }
}

/// What the index holds, behind one lock.
struct Inner {
    entries: Vec<Entry>,
    by_at: HashMap<Coordinates, u32>,
    jobs: Interner,
    classes: Interner,
    audit: HashMap<Coordinates, AuditEntry>,
    text_bytes: usize,
    /// A hash of each job seen (id and key), to the position of that job's
    /// newest dead letter (16 bytes an entry, not the id's text again).
    newest: HashMap<u64, u32>,
    /// The earlier dead letters of the jobs dead-lettered more than once,
    /// by the newest one's position: `(timestamp, coordinates)`, oldest
    /// first.
    earlier: HashMap<u32, Vec<(i64, Coordinates)>>,
}

/// How far the index has read, for the page's "indexing" notice.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// DLQ records read so far (since the start or the last rebuild of a
    /// partition).
    pub read: u64,
    /// Records stored in the DLQ at the last watermark fetch.
    pub stored: u64,
    /// Whether every partition of the DLQ and its audit topic has been read
    /// up to the high watermark seen at the last fetch.
    pub caught_up: bool,
    /// Why the last read or watermark fetch failed, if it did.
    pub problem: Option<String>,
}

/// The index of one route's DLQ. Cheap to query from any thread; fed by
/// its tailer ([`tail::spawn`]).
pub struct DlqIndex {
    main: String,
    inner: RwLock<Inner>,
    read: AtomicU64,
    stored: AtomicU64,
    caught_up: AtomicBool,
    problem: Mutex<Option<String>>,
}

impl DlqIndex {
    /// An empty index of the DLQ of `main` (nothing read yet).
    pub fn new(main: &str) -> Self {
        Self {
            main: main.to_string(),
            inner: RwLock::new(Inner {
                entries: Vec::new(),
                by_at: HashMap::new(),
                jobs: Interner::new(),
                classes: Interner::new(),
                audit: HashMap::new(),
                text_bytes: 0,
                newest: HashMap::new(),
                earlier: HashMap::new(),
            }),
            read: AtomicU64::new(0),
            stored: AtomicU64::new(0),
            caught_up: AtomicBool::new(false),
            problem: Mutex::new(None),
        }
    }

    /// The route's main topic.
    pub fn main_topic(&self) -> &str {
        &self.main
    }

    /// How far the tailer got.
    pub fn progress(&self) -> Progress {
        Progress {
            read: self.read.load(Ordering::Relaxed),
            stored: self.stored.load(Ordering::Relaxed),
            caught_up: self.caught_up.load(Ordering::Relaxed),
            problem: self.problem.lock().ok().and_then(|p| p.clone()),
        }
    }

    /// Waits (at most `wait`) until the tailer has caught up; whether it has.
    pub async fn wait_caught_up(&self, wait: std::time::Duration) -> bool {
        let start = std::time::Instant::now();
        loop {
            if self.caught_up.load(Ordering::Relaxed) {
                return true;
            }
            if start.elapsed() >= wait {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
    }

    /// Entries held and the bytes they take (fixed part and text).
    pub fn memory(&self) -> (usize, usize) {
        match self.inner.read() {
            Ok(i) => (
                i.entries.len(),
                i.entries.len() * FIXED_BYTES_PER_ENTRY + i.text_bytes,
            ),
            Err(_) => (0, 0),
        }
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        // A panic while holding the lock leaves data that is still
        // consistent entry by entry; keep serving it.
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    fn read_lock(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds dead letters (ones already held are skipped: a partition read
    /// again after a reassignment).
    pub fn add(&self, batch: Vec<Incoming<'_>>) {
        let n = batch.len() as u64;
        let mut inner = self.write();
        for r in batch {
            if inner.by_at.contains_key(&r.at) {
                continue;
            }
            let entry = inner.entry(r);
            let pos = inner.entries.len() as u32;
            inner.by_at.insert(entry.at, pos);
            inner.text_bytes += entry.text.len();
            inner.entries.push(entry);
            inner.link(pos);
        }
        drop(inner);
        self.read.fetch_add(n, Ordering::Relaxed);
    }

    /// Applies audit records: an entry per coordinates, or `None` for a
    /// tombstone (the entry removed).
    pub fn audit(&self, batch: Vec<(Coordinates, Option<AuditEntry>)>) {
        let mut inner = self.write();
        for (at, a) in batch {
            let status = a.as_ref().map_or(Status::Unresolved, Status::of);
            if let Some(pos) = inner.by_at.get(&at).copied() {
                if let Some(e) = inner.entries.get_mut(pos as usize) {
                    e.status = status;
                }
            }
            match a {
                Some(a) => inner.audit.insert(at, a),
                None => inner.audit.remove(&at),
            };
        }
    }

    /// Drops the entries of `partition` below `low` (retention deleted
    /// them), or all of that partition's with `low == None` (the topic was
    /// recreated). Returns how many were dropped.
    pub fn drop_below(&self, partition: i32, low: Option<i64>) -> usize {
        let gone =
            |at: &Coordinates| at.partition == partition && low.is_none_or(|l| at.offset < l);
        let mut inner = self.write();
        if !inner.entries.iter().any(|e| gone(&e.at)) {
            return 0;
        }
        let before = inner.entries.len();
        inner.entries.retain(|e| !gone(&e.at));
        inner.audit.retain(|at, _| !gone(at));
        let Inner {
            entries,
            by_at,
            text_bytes,
            ..
        } = &mut *inner;
        by_at.clear();
        *text_bytes = 0;
        for (i, e) in entries.iter_mut().enumerate() {
            by_at.insert(e.at, i as u32);
            *text_bytes += e.text.len();
            e.set_superseded(false);
        }
        // Positions moved: link the jobs' dead letters again.
        inner.newest.clear();
        inner.earlier.clear();
        for pos in 0..inner.entries.len() as u32 {
            inner.link(pos);
        }
        before - inner.entries.len()
    }

    /// Records the tailer's progress.
    pub(crate) fn set_progress(&self, stored: u64, caught_up: bool, problem: Option<String>) {
        self.stored.store(stored, Ordering::Relaxed);
        self.caught_up.store(caught_up, Ordering::Relaxed);
        if let Ok(mut p) = self.problem.lock() {
            *p = problem;
        }
    }

    /// The coordinates given that are held and unresolved, in the order
    /// given, or why one is not (unknown, or already audited).
    pub fn check_unresolved(&self, at: &[Coordinates]) -> Result<(), String> {
        let inner = self.read_lock();
        for c in at {
            let Some(pos) = inner.by_at.get(c) else {
                return Err(format!(
                    "no dead letter at {c} in `{}.dlq` (or the index has not read it yet)",
                    self.main
                ));
            };
            if inner.entries[*pos as usize].superseded() {
                let newer = inner
                    .newest
                    .get(&job_hash(&inner.entries[*pos as usize]))
                    .map(|n| inner.entries[*n as usize].at);
                return Err(match newer {
                    Some(n) => format!("{c} is an earlier dead letter of a job that was dead-lettered again at {n}: act on {n}, which carries its history"),
                    None => format!("{c} is an earlier dead letter of a job that was dead-lettered again"),
                });
            }
            if inner.entries[*pos as usize].status != Status::Unresolved {
                let by = inner
                    .audit
                    .get(c)
                    .map(|a| format!(" ({} by {})", a.action, a.by))
                    .unwrap_or_default();
                return Err(format!("{c} was already audited{by}"));
            }
        }
        Ok(())
    }

    /// The audit entry of one dead letter, if any.
    pub fn audit_of(&self, at: Coordinates) -> Option<AuditEntry> {
        self.read_lock().audit.get(&at).cloned()
    }
}

/// The hash a job is linked by (`Inner::newest`): its id and its key as
/// kept, as `store::superseded` tells one job's copies apart.
fn job_hash(e: &Entry) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
        .hash_one((e.id(), e.key()))
}

impl Inner {
    /// Links the entry at `pos` to the other dead letters of its job (same
    /// `kjob-id`): the newest stands for the job, the others are marked
    /// superseded and listed as its history. Newest: latest timestamp,
    /// then highest coordinates, as `store::superseded` decides.
    fn link(&mut self, pos: u32) {
        let e = &self.entries[pos as usize];
        if e.id().is_empty() {
            return;
        }
        let h = job_hash(e);
        let Some(old) = self.newest.get(&h).copied() else {
            self.newest.insert(h, pos);
            return;
        };
        let rank = |i: u32| {
            let x = &self.entries[i as usize];
            (x.timestamp_ms, x.at)
        };
        let (newer, older) = if rank(pos) > rank(old) {
            (pos, old)
        } else {
            (old, pos)
        };
        let mut history = self.earlier.remove(&old).unwrap_or_default();
        history.push(rank(older));
        history.sort_unstable();
        self.earlier.insert(newer, history);
        self.entries[older as usize].set_superseded(true);
        self.newest.insert(h, newer);
    }

    fn entry(&mut self, r: Incoming<'_>) -> Entry {
        let job = self.jobs.id(r.headers.job.as_deref());
        let class = self.classes.id(r.headers.error_class.as_deref());
        let status = self.audit.get(&r.at).map_or(Status::Unresolved, Status::of);
        Entry::new(r, job, class, status)
    }
}

#[cfg(test)]
mod tests;
