//! The chains of one strict-order state partition: pure data and rules,
//! unit tested without a broker (see the parent module for how they are
//! used and persisted).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::warn;

/// What a state record's value holds (JSON).
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    /// The chain, head first.
    ids: Vec<String>,
    /// When the head is due in its retry tier (epoch ms), if it waits in
    /// one: parked records are sent to a tier that brings them back about
    /// then, not every first-tier delay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    head_due_ms: Option<i64>,
    /// Jobs of the key that finished, each with the time (epoch ms) until
    /// which a copy of it is recognised: a re-delivery after a crash or a
    /// parked copy coming back is then skipped, not run (or dead-lettered)
    /// again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    done: Vec<(String, i64)>,
}

/// At most this many finished ids are kept per key (the oldest go
/// first): enough for a chain of a few hundred jobs drained at once.
const DONE_MAX: usize = 256;

/// One key's chain.
#[derive(Debug, Default)]
struct Chain {
    /// Job ids, head first.
    ids: VecDeque<String>,
    /// When the head is due in its tier (set when it is forwarded there,
    /// cleared when another job becomes head).
    head_due_ms: Option<i64>,
    /// Finished ids, oldest first, each with the time until which copies
    /// of it are skipped.
    done: VecDeque<(String, i64)>,
    /// The topic the head's record waits in (in memory only, like
    /// `parked`): a follower read from that same topic does not wait for
    /// the head in memory, as the head's record may be queued behind it
    /// on the key's lane there.
    head_topic: Option<String>,
    /// Where and until when each parked follower's record waits (in
    /// memory only): once it becomes the head, the jobs behind it know
    /// whether it is due soon, and wait for it rather than park.
    parked: HashMap<String, (String, i64)>,
}

impl Chain {
    /// Drops the finished ids whose time is up.
    fn forget(&mut self, now_ms: i64) {
        self.done.retain(|(_, until)| *until > now_ms);
    }

    /// Nothing to keep: no job waits and no finished id is remembered.
    fn is_empty(&self) -> bool {
        self.ids.is_empty() && self.done.is_empty()
    }
}

/// The chains of one state partition: key to job ids, head first. Pure
/// data, unit tested without a broker.
#[derive(Debug, Default)]
pub(crate) struct Chains {
    by_key: HashMap<Vec<u8>, Chain>,
}

/// Whether a record may run now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Its key has no chain, or it is the chain's head.
    Run,
    /// A copy of a job of the key that already finished (a re-delivery
    /// after a crash, or a parked copy coming back): it is not run again.
    Duplicate,
    /// It waits behind `head`; `appended` when its id was added now (the
    /// state must be written before it is parked).
    Follow {
        /// The id of the job in the retry path.
        head: String,
        /// When that job is due in its tier, if known.
        head_due_ms: Option<i64>,
        /// Whether the chain changed.
        appended: bool,
    },
}

impl Chains {
    /// Decides for the record `id` of `key` at `now_ms`, appending it
    /// when it has to wait.
    pub(crate) fn admit(&mut self, key: &[u8], id: &str, now_ms: i64) -> Admit {
        let Some(chain) = self.by_key.get_mut(key) else {
            return Admit::Run;
        };
        if chain
            .done
            .iter()
            .any(|(done, until)| done == id && *until > now_ms)
        {
            return Admit::Duplicate;
        }
        match chain.ids.front() {
            None => Admit::Run,
            Some(head) if head == id => {
                chain.parked.remove(id);
                Admit::Run
            }
            Some(head) => {
                let head = head.clone();
                let appended = !chain.ids.iter().any(|x| x == id);
                if appended {
                    chain.ids.push_back(id.to_string());
                }
                Admit::Follow {
                    head,
                    head_due_ms: chain.head_due_ms,
                    appended,
                }
            }
        }
    }

    /// `id` of `key` failed and goes to a retry tier, due at `due_ms`: it
    /// starts the chain (or stays in it). Returns whether the chain
    /// changed.
    pub(crate) fn retrying(&mut self, key: &[u8], id: &str, due_ms: Option<i64>) -> bool {
        let chain = self.by_key.entry(key.to_vec()).or_default();
        let mut changed = false;
        if !chain.ids.iter().any(|x| x == id) {
            chain.ids.push_back(id.to_string());
            changed = true;
        }
        if chain.ids.front().is_some_and(|h| h == id) && chain.head_due_ms != due_ms {
            chain.head_due_ms = due_ms;
            changed = true;
        }
        changed
    }

    /// `id` of `key` finished (handled or dead-lettered): it leaves the
    /// chain at `now_ms`, and copies of it are recognised for `keep_ms`.
    /// Returns whether the chain changed.
    pub(crate) fn finished(&mut self, key: &[u8], id: &str, now_ms: i64, keep_ms: i64) -> bool {
        let Some(chain) = self.by_key.get_mut(key) else {
            return false;
        };
        let was_head = chain.ids.front().is_some_and(|h| h == id);
        let before = chain.ids.len();
        chain.ids.retain(|x| x != id);
        let changed = chain.ids.len() != before;
        chain.parked.remove(id);
        if was_head {
            // The next head has not failed (yet): it waits in a tier only
            // if it was parked there.
            let hint = chain.ids.front().and_then(|h| chain.parked.get(h).cloned());
            chain.head_due_ms = hint.as_ref().map(|(_, due)| *due);
            chain.head_topic = hint.map(|(topic, _)| topic);
        }
        chain.forget(now_ms);
        if changed && keep_ms > 0 {
            chain.done.push_back((id.to_string(), now_ms + keep_ms));
            while chain.done.len() > DONE_MAX {
                chain.done.pop_front();
            }
        }
        if chain.is_empty() {
            self.by_key.remove(key);
        }
        changed
    }

    /// `id`, a follower of `key`, was parked in `topic` and comes back at
    /// `due_ms`.
    pub(crate) fn parked(&mut self, key: &[u8], id: &str, topic: &str, due_ms: i64) {
        if let Some(chain) = self.by_key.get_mut(key) {
            if chain.ids.iter().skip(1).any(|x| x == id) {
                chain
                    .parked
                    .insert(id.to_string(), (topic.to_string(), due_ms));
            }
        }
    }

    /// `id`, the head of `key`, waits in `topic` now.
    pub(crate) fn head_in(&mut self, key: &[u8], id: &str, topic: &str) {
        if let Some(chain) = self.by_key.get_mut(key) {
            if chain.ids.front().is_some_and(|h| h == id) {
                chain.head_topic = Some(topic.to_string());
            }
        }
    }

    /// The topic `key`'s head waits in, when this worker knows it.
    pub(crate) fn head_topic(&self, key: &[u8]) -> Option<&str> {
        self.by_key.get(key)?.head_topic.as_deref()
    }

    /// Forgets the finished ids whose time is up at `now_ms`, and returns
    /// the keys left with nothing to keep: their state records can be
    /// tombstoned, so the compacted topic does not grow with every key
    /// that ever waited.
    pub(crate) fn expire(&mut self, now_ms: i64) -> Vec<Vec<u8>> {
        let mut gone = Vec::new();
        self.by_key.retain(|key, chain| {
            chain.forget(now_ms);
            let keep = !chain.is_empty();
            if !keep {
                gone.push(key.clone());
            }
            keep
        });
        gone
    }

    /// The chain of `key`, head first (empty when there is none).
    #[cfg(test)]
    fn chain(&self, key: &[u8]) -> Vec<String> {
        self.by_key
            .get(key)
            .map(|c| c.ids.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The state record's value for `key`: `None` (a tombstone) when no
    /// job of it waits and no finished id is still remembered.
    pub(crate) fn encode(&self, key: &[u8]) -> Option<Vec<u8>> {
        let chain = self.by_key.get(key).filter(|c| !c.is_empty())?;
        serde_json::to_vec(&Stored {
            ids: chain.ids.iter().cloned().collect(),
            head_due_ms: chain.head_due_ms,
            done: chain.done.iter().cloned().collect(),
        })
        .ok()
    }

    /// Applies one state record read back from `<main>.order`. A value that
    /// is not a chain is logged and treated as an empty chain: the key's
    /// parked records then run as newcomers (out of order, never lost).
    pub(crate) fn apply(&mut self, topic: &str, key: &[u8], value: Option<&[u8]>) {
        let parsed = match value {
            None => None,
            Some(v) => match serde_json::from_slice::<Stored>(v) {
                Ok(s) => Some(s),
                Err(e) => {
                    warn!(
                        topic, key = %String::from_utf8_lossy(key), error = %e,
                        "unreadable strict-order state record; treating the key's chain as empty \
                         (its waiting jobs run as they come due, without strict order). Fix: \
                         only kjob workers may write to this topic"
                    );
                    None
                }
            },
        };
        match parsed {
            Some(s) if !s.ids.is_empty() || !s.done.is_empty() => {
                self.by_key.insert(
                    key.to_vec(),
                    Chain {
                        ids: s.ids.into_iter().collect(),
                        head_due_ms: s.head_due_ms,
                        done: s.done.into_iter().collect(),
                        head_topic: None,
                        parked: HashMap::new(),
                    },
                );
            }
            _ => {
                self.by_key.remove(key);
            }
        }
    }

    /// Whether `id` heads `key`'s chain.
    pub(crate) fn has_head(&self, key: &[u8], id: &str) -> bool {
        self.by_key
            .get(key)
            .and_then(|c| c.ids.front())
            .is_some_and(|h| h == id)
    }

    /// Keys with a chain or remembered finished ids.
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }
}

/// The retry tier a waiting record is parked in: the longest one that
/// brings it back no later than its head is due (`head_due_ms`), so a
/// record behind a job waiting 30 minutes is not re-parked every few
/// seconds; the first tier when the head's due time is unknown or near.
/// A parked record is thus back at most one first-tier delay after the
/// head could have finished.
pub(crate) fn park_tier(tiers: &[Duration], now_ms: i64, head_due_ms: Option<i64>) -> usize {
    let Some(due) = head_due_ms else {
        return 0;
    };
    let left = due - now_ms;
    tiers
        .iter()
        .enumerate()
        .filter(|(_, t)| (t.as_millis() as i64) <= left)
        .max_by_key(|(_, t)| **t)
        .map_or(0, |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_key_runs_and_a_failure_starts_its_chain() {
        let mut c = Chains::default();
        assert_eq!(c.admit(b"k", "1", 0), Admit::Run);
        assert!(c.retrying(b"k", "1", None));
        assert!(
            !c.retrying(b"k", "1", None),
            "a second failure keeps it head"
        );
        assert_eq!(c.chain(b"k"), vec!["1"]);
        assert_eq!(c.admit(b"k", "1", 0), Admit::Run, "the head runs");
        assert_eq!(c.admit(b"other", "9", 0), Admit::Run, "other keys flow");
    }

    #[test]
    fn later_jobs_follow_in_arrival_order_and_run_after_the_head() {
        let mut c = Chains::default();
        c.retrying(b"k", "1", None);
        for id in ["2", "3", "4"] {
            assert_eq!(
                c.admit(b"k", id, 0),
                Admit::Follow {
                    head: "1".into(),
                    head_due_ms: None,
                    appended: true
                }
            );
        }
        // A re-delivery (or a parked copy coming due) is not appended again.
        assert_eq!(
            c.admit(b"k", "3", 0),
            Admit::Follow {
                head: "1".into(),
                head_due_ms: None,
                appended: false
            }
        );
        assert_eq!(c.chain(b"k"), vec!["1", "2", "3", "4"]);
        assert!(c.finished(b"k", "1", 0, 0));
        assert_eq!(
            c.admit(b"k", "3", 0),
            Admit::Follow {
                head: "2".into(),
                head_due_ms: None,
                appended: false
            }
        );
        assert_eq!(c.admit(b"k", "2", 0), Admit::Run);
        assert!(c.finished(b"k", "2", 0, 0));
        assert!(c.finished(b"k", "3", 0, 0));
        assert!(c.finished(b"k", "4", 0, 0));
        assert_eq!(c.len(), 0, "an empty chain is dropped");
        assert!(c.encode(b"k").is_none(), "and written as a tombstone");
        assert!(
            !c.finished(b"k", "4", 0, 0),
            "finishing twice changes nothing"
        );
    }

    #[test]
    fn a_follower_that_fails_keeps_its_place_as_head() {
        let mut c = Chains::default();
        c.retrying(b"k", "1", None);
        c.admit(b"k", "2", 0);
        c.admit(b"k", "3", 0);
        c.finished(b"k", "1", 0, 0);
        assert_eq!(c.admit(b"k", "2", 0), Admit::Run);
        assert!(
            !c.retrying(b"k", "2", None),
            "already in the chain, at its head"
        );
        assert_eq!(c.chain(b"k"), vec!["2", "3"]);
    }

    #[test]
    fn a_dead_lettered_head_pops_and_unblocks_the_key() {
        let mut c = Chains::default();
        c.retrying(b"k", "bad", None);
        c.admit(b"k", "2", 0);
        assert!(c.finished(b"k", "bad", 0, 0));
        assert_eq!(c.admit(b"k", "2", 0), Admit::Run);
    }

    #[test]
    fn an_unknown_record_joins_the_back_of_a_busy_key() {
        // A stale copy of a finished job (or a pre-strict retry) while the
        // key has a chain: it waits its turn rather than being dropped.
        let mut c = Chains::default();
        c.retrying(b"k", "5", None);
        assert_eq!(
            c.admit(b"k", "1", 0),
            Admit::Follow {
                head: "5".into(),
                head_due_ms: None,
                appended: true
            }
        );
    }

    #[test]
    fn state_round_trips_and_garbage_reads_as_empty() {
        let mut c = Chains::default();
        c.retrying(b"k", "1", None);
        c.admit(b"k", "2", 0);
        let value = c.encode(b"k");
        let mut loaded = Chains::default();
        loaded.apply("t.order", b"k", value.as_deref());
        assert_eq!(loaded.chain(b"k"), vec!["1", "2"]);
        loaded.apply("t.order", b"k", Some(b"not json"));
        assert_eq!(loaded.chain(b"k"), Vec::<String>::new());
        loaded.apply("t.order", b"j", value.as_deref());
        loaded.apply("t.order", b"j", None);
        assert_eq!(loaded.len(), 0, "a tombstone clears the key");
        loaded.apply("t.order", b"j", Some(br#"{"ids":[]}"#));
        assert_eq!(loaded.len(), 0);
    }

    #[test]
    fn the_heads_due_time_is_kept_for_its_followers_and_cleared_when_it_leaves() {
        let mut c = Chains::default();
        assert!(c.retrying(b"k", "1", Some(60_000)));
        assert!(!c.retrying(b"k", "1", Some(60_000)), "nothing new");
        assert!(
            c.retrying(b"k", "1", Some(90_000)),
            "failed again: due later"
        );
        assert_eq!(
            c.admit(b"k", "2", 0),
            Admit::Follow {
                head: "1".into(),
                head_due_ms: Some(90_000),
                appended: true
            }
        );
        // A follower's own failure never sets the head's due time.
        assert!(!c.retrying(b"k", "2", Some(5)));
        let mut loaded = Chains::default();
        loaded.apply("t.order", b"k", c.encode(b"k").as_deref());
        assert_eq!(
            loaded.admit(b"k", "2", 0),
            Admit::Follow {
                head: "1".into(),
                head_due_ms: Some(90_000),
                appended: false
            },
            "the due time survives a reload"
        );
        assert!(c.finished(b"k", "1", 0, 0));
        assert!(
            c.retrying(b"k", "2", Some(7)),
            "the new head waits in a tier"
        );
        c.admit(b"k", "3", 0);
        c.finished(b"k", "2", 0, 0);
        assert_eq!(
            c.admit(b"k", "4", 0),
            Admit::Follow {
                head: "3".into(),
                head_due_ms: None,
                appended: true
            },
            "a head that has not failed is due nowhere"
        );
    }

    #[test]
    fn a_copy_of_a_finished_job_is_a_duplicate_until_its_time_is_up() {
        let mut c = Chains::default();
        c.retrying(b"k", "1", Some(5_000));
        c.admit(b"k", "2", 1_000);
        assert!(c.finished(b"k", "1", 6_000, 60_000));
        assert_eq!(c.admit(b"k", "1", 7_000), Admit::Duplicate, "job 1's copy");
        assert_eq!(c.admit(b"k", "2", 7_000), Admit::Run, "the next head runs");
        assert!(c.finished(b"k", "2", 7_000, 60_000));
        assert_eq!(c.chain(b"k"), Vec::<String>::new());
        // The key's record keeps the finished ids, so a new owner knows
        // them too; it is tombstoned only once they are forgotten.
        let value = c.encode(b"k");
        assert!(value.is_some(), "finished ids are persisted");
        let mut loaded = Chains::default();
        loaded.apply("t.order", b"k", value.as_deref());
        assert_eq!(loaded.admit(b"k", "2", 8_000), Admit::Duplicate);
        assert_eq!(loaded.admit(b"k", "3", 8_000), Admit::Run, "a new job runs");
        assert_eq!(loaded.admit(b"k", "1", 66_001), Admit::Run, "forgotten");
        assert!(loaded.expire(66_000).is_empty(), "job 2 is still kept");
        assert_eq!(loaded.expire(67_001), vec![b"k".to_vec()]);
        assert_eq!(loaded.len(), 0);
        assert!(loaded.encode(b"k").is_none(), "a tombstone");
    }

    #[test]
    fn a_parked_follower_that_becomes_head_is_due_when_its_record_comes_back() {
        let mut c = Chains::default();
        c.retrying(b"k", "1", Some(5_000));
        c.admit(b"k", "2", 1_000);
        c.admit(b"k", "3", 1_000);
        c.head_in(b"k", "1", "t.retry.5s");
        c.parked(b"k", "2", "t.retry.2s", 3_000);
        c.parked(b"k", "1", "t.retry.2s", 9_999);
        assert_eq!(c.head_topic(b"k"), Some("t.retry.5s"));
        let follows = |head: &str, due| Admit::Follow {
            head: head.into(),
            head_due_ms: due,
            appended: false,
        };
        assert_eq!(
            c.admit(b"k", "3", 1_500),
            follows("1", Some(5_000)),
            "the head's own due time"
        );
        c.finished(b"k", "1", 5_000, 60_000);
        assert_eq!(
            c.admit(b"k", "3", 5_000),
            follows("2", Some(3_000)),
            "job 2 comes back from its park then"
        );
        assert_eq!(c.head_topic(b"k"), Some("t.retry.2s"));
        assert_eq!(c.admit(b"k", "2", 5_000), Admit::Run);
        c.finished(b"k", "2", 5_100, 60_000);
        assert_eq!(c.admit(b"k", "3", 5_100), Admit::Run);
    }

    #[test]
    fn a_record_an_older_worker_wrote_still_loads() {
        // Before finished ids were kept, a record held only the chain; a
        // rolling deploy reads both kinds side by side.
        let mut loaded = Chains::default();
        loaded.apply(
            "t.order",
            b"k",
            Some(br#"{"ids":["1","2"],"head_due_ms":5000}"#),
        );
        assert_eq!(
            loaded.admit(b"k", "2", 0),
            Admit::Follow {
                head: "1".into(),
                head_due_ms: Some(5_000),
                appended: false,
            }
        );
        assert_eq!(loaded.admit(b"k", "1", 0), Admit::Run);
    }

    #[test]
    fn only_the_newest_finished_ids_are_kept() {
        let mut c = Chains::default();
        c.retrying(b"k", "head", None);
        for i in 0..DONE_MAX + 10 {
            c.admit(b"k", &i.to_string(), 0);
        }
        assert!(c.finished(b"k", "head", 0, 1_000));
        for i in 0..DONE_MAX + 10 {
            assert!(c.finished(b"k", &i.to_string(), 0, 1_000));
        }
        assert_eq!(c.admit(b"k", "0", 1), Admit::Run, "the oldest went first");
        assert_eq!(
            c.admit(b"k", &(DONE_MAX + 9).to_string(), 1),
            Admit::Duplicate
        );
    }

    #[test]
    fn a_parked_job_comes_back_no_later_than_its_head_is_due() {
        let s = Duration::from_secs;
        let tiers = [s(5), s(30), s(300), s(1800)];
        assert_eq!(park_tier(&tiers, 0, None), 0, "unknown: the first tier");
        assert_eq!(park_tier(&tiers, 0, Some(4_000)), 0, "near: the first tier");
        assert_eq!(park_tier(&tiers, 0, Some(-1)), 0, "overdue: the first tier");
        assert_eq!(park_tier(&tiers, 0, Some(30_000)), 1);
        assert_eq!(park_tier(&tiers, 0, Some(299_999)), 1);
        assert_eq!(park_tier(&tiers, 0, Some(1_980_000)), 3);
        assert_eq!(park_tier(&[], 0, Some(1_000_000)), 0);
        // Unsorted tiers: still the longest that fits.
        assert_eq!(park_tier(&[s(60), s(5), s(30)], 0, Some(45_000)), 2);
    }
}
