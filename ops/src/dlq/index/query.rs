//! One page of an index: filter, count, sort and cut, in one pass over the
//! entries plus two linear-time selections, so a deep page costs what the
//! first page costs (no full sort of a million rows per request).

use std::cmp::Ordering;

use super::{DlqIndex, Entry, Inner, Status};
use crate::dlq::store::{AuditEntry, Coordinates, Filter};

/// Which audit states a page shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StatusFilter {
    /// Only dead letters without an audit entry (the default, as `kjob dlq list`).
    #[default]
    Unresolved,
    /// Re-driven and resolved ones too (`--all`).
    All,
}

/// What a page is sorted by; ties are broken by coordinates, so paging is
/// stable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sort {
    /// Partition, then offset.
    At,
    /// When it was dead-lettered (the default, newest first with `desc`).
    #[default]
    Time,
    /// `kjob-attempt`.
    Attempts,
    /// Job name.
    Job,
    /// Error class.
    Class,
    /// Record key.
    Key,
}

impl Sort {
    /// The query-string name of a sort (`sort=time`).
    pub fn name(self) -> &'static str {
        match self {
            Sort::At => "at",
            Sort::Time => "time",
            Sort::Attempts => "attempts",
            Sort::Job => "job",
            Sort::Class => "class",
            Sort::Key => "key",
        }
    }

    /// The sort a query-string name means; `None` for an unknown one.
    pub fn parse(s: &str) -> Option<Self> {
        [
            Sort::At,
            Sort::Time,
            Sort::Attempts,
            Sort::Job,
            Sort::Class,
            Sort::Key,
        ]
        .into_iter()
        .find(|k| k.name() == s)
    }
}

/// What to show: the CLI's filters, a search, the audit states, the order
/// and the window.
#[derive(Clone, Debug, Default)]
pub struct Query {
    /// Job, class family and time range, as `kjob dlq list` takes them.
    pub filter: Filter,
    /// A substring (case-sensitive) of the key, job id, error message or
    /// payload text.
    pub search: Option<String>,
    /// Unresolved only, or all.
    pub status: StatusFilter,
    /// Sort key.
    pub sort: Sort,
    /// Descending.
    pub desc: bool,
    /// Rows to skip.
    pub offset: usize,
    /// Rows to return.
    pub limit: usize,
}

/// One row of a page, owned, so the lock is released before rendering.
#[derive(Clone, Debug)]
pub struct Row {
    /// Coordinates.
    pub at: Coordinates,
    /// Record timestamp (epoch ms, 0 when absent).
    pub timestamp_ms: i64,
    /// `kjob-attempt` (0 when absent).
    pub attempt: u32,
    /// Job name.
    pub job: Option<String>,
    /// Error class.
    pub class: Option<String>,
    /// Key as kept, and whether it was cut.
    pub key: Option<String>,
    /// Whether the key was longer than what the index keeps.
    pub key_cut: bool,
    /// Job id.
    pub id: String,
    /// Error message as kept.
    pub error: String,
    /// Whether the error was longer than what the index keeps.
    pub error_cut: bool,
    /// The audit entry, if any.
    pub audit: Option<AuditEntry>,
    /// The same job's earlier dead letters (dead-lettered again after a
    /// re-drive or a replay), oldest first; this row stands for the job.
    pub earlier: Vec<Coordinates>,
}

/// A page and what the filters match: the counts per error class (with
/// every filter but the class) and per job (with every filter but the
/// job), most first, so each count is what clicking it would show.
#[derive(Clone, Debug, Default)]
pub struct Page {
    /// The rows of the window.
    pub rows: Vec<Row>,
    /// Rows matching every filter.
    pub matched: usize,
    /// Dead letters held.
    pub stored: usize,
    /// Held and without an audit entry.
    pub unresolved: usize,
    /// `(class, count)`; `None` is "no class header".
    pub by_class: Vec<(Option<String>, usize)>,
    /// `(job, count)`.
    pub by_job: Vec<(Option<String>, usize)>,
}

/// Whether interned name `name` passes `wanted` (exact for jobs; the class
/// or its family for classes).
fn passes(name: Option<&str>, wanted: Option<&str>, family: bool) -> bool {
    match (wanted, name) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(w), Some(n)) => {
            n == w
                || (family
                    && n.len() > w.len()
                    && n.starts_with(w)
                    && n[w.len()..].starts_with('.'))
        }
    }
}

/// The rank of every interned name in sorted order ("none" first).
fn ranks(names: &[Option<String>]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..names.len() as u32).collect();
    order.sort_by(|a, b| names[*a as usize].cmp(&names[*b as usize]));
    let mut rank = vec![0; names.len()];
    for (r, id) in order.into_iter().enumerate() {
        rank[id as usize] = r as u32;
    }
    rank
}

fn counts(names: &[Option<String>], n: Vec<usize>) -> Vec<(Option<String>, usize)> {
    let mut out: Vec<(Option<String>, usize)> = n
        .into_iter()
        .enumerate()
        .filter(|(_, c)| *c > 0)
        .map(|(id, c)| (names[id].clone(), c))
        .collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

impl DlqIndex {
    /// One page of dead letters for `q`, with the counts.
    pub fn query(&self, q: &Query) -> Page {
        let inner = self.read_lock();
        inner.page(q)
    }

    /// The coordinates of every unresolved dead letter matching `q`'s
    /// filter and search (its window and status ignored), in partition and
    /// offset order: what "everything matching" acts on.
    pub fn matching_unresolved(&self, q: &Query) -> Vec<Coordinates> {
        let inner = self.read_lock();
        let all = Query {
            status: StatusFilter::Unresolved,
            sort: Sort::At,
            desc: false,
            offset: 0,
            limit: usize::MAX,
            ..q.clone()
        };
        let (mut picked, _) = inner.matches(&all);
        picked.sort_unstable_by_key(|i| inner.entries[*i as usize].at);
        picked
            .into_iter()
            .map(|i| inner.entries[i as usize].at)
            .collect()
    }
}

impl Inner {
    /// The positions matching every filter, and the counters of the
    /// facets: `(class counts, job counts, unresolved)`.
    fn matches(&self, q: &Query) -> (Vec<u32>, (Vec<usize>, Vec<usize>, usize)) {
        let f = &q.filter;
        let job_ok: Vec<bool> = self
            .jobs
            .names
            .iter()
            .map(|n| passes(n.as_deref(), f.job.as_deref(), false))
            .collect();
        let class_ok: Vec<bool> = self
            .classes
            .names
            .iter()
            .map(|n| passes(n.as_deref(), f.class.as_deref(), true))
            .collect();
        let mut by_class = vec![0usize; self.classes.names.len()];
        let mut by_job = vec![0usize; self.jobs.names.len()];
        let mut unresolved = 0;
        let mut out = Vec::new();
        let needle = q.search.as_deref().filter(|s| !s.is_empty());
        for (i, e) in self.entries.iter().enumerate() {
            // A job's earlier dead letters are its newest one's history.
            if e.superseded() {
                continue;
            }
            let open = e.status == Status::Unresolved;
            unresolved += usize::from(open);
            if q.status == StatusFilter::Unresolved && !open {
                continue;
            }
            if f.since_ms.is_some_and(|s| e.timestamp_ms < s)
                || f.until_ms.is_some_and(|u| e.timestamp_ms >= u)
            {
                continue;
            }
            let jo = job_ok[e.job as usize];
            let co = class_ok[e.class as usize];
            if !(jo || co) {
                continue;
            }
            if needle.is_some_and(|n| !e.contains(n))
                || f.grep.as_deref().is_some_and(|n| !e.contains(n))
                || f.key.as_deref().is_some_and(|k| !e.key_is(k))
            {
                continue;
            }
            if jo {
                by_class[e.class as usize] += 1;
            }
            if co {
                by_job[e.job as usize] += 1;
            }
            if jo && co {
                out.push(i as u32);
            }
        }
        (out, (by_class, by_job, unresolved))
    }

    fn page(&self, q: &Query) -> Page {
        let (mut picked, (by_class, by_job, unresolved)) = self.matches(q);
        let matched = picked.len();
        let job_rank = ranks(&self.jobs.names);
        let class_rank = ranks(&self.classes.names);
        let e = |i: &u32| -> &Entry { &self.entries[*i as usize] };
        let by = |a: &u32, b: &u32| -> Ordering {
            let (x, y) = (e(a), e(b));
            let primary = match q.sort {
                Sort::At => Ordering::Equal,
                Sort::Time => x.timestamp_ms.cmp(&y.timestamp_ms),
                Sort::Attempts => x.attempt.cmp(&y.attempt),
                Sort::Job => job_rank[x.job as usize].cmp(&job_rank[y.job as usize]),
                Sort::Class => class_rank[x.class as usize].cmp(&class_rank[y.class as usize]),
                Sort::Key => x.key().cmp(&y.key()),
            };
            let o = primary.then_with(|| x.at.cmp(&y.at));
            if q.desc {
                o.reverse()
            } else {
                o
            }
        };
        let window = window(&mut picked, q.offset, q.limit, by);
        let rows = window
            .iter()
            .map(|i| {
                let x = e(i);
                Row {
                    at: x.at,
                    timestamp_ms: x.timestamp_ms,
                    attempt: x.attempt,
                    job: self.jobs.name(x.job).map(str::to_string),
                    class: self.classes.name(x.class).map(str::to_string),
                    key: x.key().map(str::to_string),
                    key_cut: x.key_cut(),
                    id: x.id().to_string(),
                    error: x.error().to_string(),
                    error_cut: x.error_cut(),
                    audit: (x.status != Status::Unresolved)
                        .then(|| self.audit.get(&x.at).cloned())
                        .flatten(),
                    earlier: self
                        .earlier
                        .get(i)
                        .map(|h| h.iter().map(|(_, at)| *at).collect())
                        .unwrap_or_default(),
                }
            })
            .collect();
        Page {
            rows,
            matched,
            stored: self.entries.len(),
            unresolved,
            by_class: counts(&self.classes.names, by_class),
            by_job: counts(&self.jobs.names, by_job),
        }
    }
}

/// The sorted window `[offset, offset + limit)` of `v` under `by`, in
/// linear time: one selection puts the offset-th element in place (all
/// before it sort before it), a second one the window's end, and only the
/// window itself is sorted.
fn window<T, F>(v: &mut [T], offset: usize, limit: usize, by: F) -> &mut [T]
where
    F: Fn(&T, &T) -> Ordering,
{
    if offset >= v.len() || limit == 0 {
        return &mut [];
    }
    if offset > 0 {
        v.select_nth_unstable_by(offset, &by);
    }
    let rest = &mut v[offset..];
    if rest.len() > limit {
        rest.select_nth_unstable_by(limit, &by);
    }
    let n = limit.min(rest.len());
    let page = &mut rest[..n];
    page.sort_unstable_by(&by);
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_the_slice_of_the_full_sort() {
        let data: Vec<u32> = (0..1000u32).map(|i| (i * 7919) % 1009).collect();
        let mut sorted = data.clone();
        sorted.sort_unstable();
        for (offset, limit) in [
            (0, 10),
            (10, 10),
            (995, 10),
            (1000, 10),
            (0, 2000),
            (500, 1),
        ] {
            let mut v = data.clone();
            let w = window(&mut v, offset, limit, |a, b| a.cmp(b)).to_vec();
            let end = (offset + limit).min(sorted.len());
            let want = if offset >= sorted.len() {
                Vec::new()
            } else {
                sorted[offset..end].to_vec()
            };
            assert_eq!(w, want, "offset {offset}, limit {limit}");
        }
    }

    #[test]
    fn class_families_and_exact_jobs() {
        assert!(passes(Some("retryable.timeout"), Some("retryable"), true));
        assert!(!passes(Some("retryable.timeout"), Some("retry"), true));
        assert!(!passes(Some("mail.x"), Some("mail"), false));
        assert!(passes(None, None, false));
        assert!(!passes(None, Some("mail"), false));
        assert_eq!(Sort::parse("key"), Some(Sort::Key));
        assert_eq!(Sort::parse("nope"), None);
    }
}
