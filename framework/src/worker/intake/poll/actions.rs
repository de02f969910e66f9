//! The scheduler's actions carried out on the consumer: pause, resume,
//! seek and commit (the commit itself in `commit.rs`), noted one by one in the order of the hub's lock, and
//! the operators' pauses and the scheduler's due-time holds re-applied after each
//! assignment.

use crate::worker::intake::poll::rebalance::tpl_of;
use crate::worker::intake::poll::WorkerContext;
use crate::worker::intake::polled::Polled;
use crate::worker::scheduler::Action;
use crate::worker::scheduler::Tp;
use rdkafka::consumer::BaseConsumer;
use rdkafka::consumer::CommitMode;
use rdkafka::consumer::Consumer;
use rdkafka::Offset;
use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::PoisonError;
use std::time::Duration;
use tracing::debug;
use tracing::info;
use tracing::warn;

impl WorkerContext {
    /// Carries out the scheduler's actions. The core lock is not held: a
    /// synchronous commit may run the commit callback, which takes it.
    pub(super) fn execute(
        &self,
        consumer: &BaseConsumer<Self>,
        actions: Vec<Action<Polled>>,
        mode: CommitMode,
        after_assign: bool,
    ) {
        if actions.is_empty() {
            return;
        }
        let mut committed = Vec::new();
        for action in actions {
            match action {
                Action::Run(jobs) => self.hub.dispatch.send(jobs),
                Action::Grant(tickets) => self.lock().grant(tickets),
                // At its bound, a main-topic partition read through its
                // own queue is left unread rather than paused: a pause
                // makes librdkafka fetch and parse again all it had
                // prefetched (issue 29). Its prefetch limits hold the rest.
                // After an assignment the partition may not be split yet,
                // and a stopping worker should stop fetching: both pause.
                //
                // Pauses and resumes are applied, and noted on the hub, one
                // by one in the order given (the order the scheduler made
                // them in): a partition paused and resumed in one list ends
                // resumed, and one resumed and paused ends paused. (Noted
                // all at once after the list, a split partition paused and
                // then resumed was left unread while the scheduler counted
                // it resumed, and stayed so.)
                Action::Pause(tp)
                    if !after_assign && !self.is_stopping() && self.reads_split(&tp.0) =>
                {
                    self.lock().throttled.add(vec![tp]);
                }
                Action::Pause(tp) => {
                    if let Err(e) = consumer.pause(&tpl_of(std::slice::from_ref(&tp))) {
                        warn!(error = %e, topic = %tp.0, partition = tp.1, "pause failed");
                    } else {
                        self.note_paused(tp, after_assign);
                    }
                }
                Action::Resume(tp)
                    if self.in_force.as_ref().is_some_and(|h| h.is_paused(&tp.0)) =>
                {
                    self.unthrottle(&tp);
                    // Paused for the whole group: the scheduler's own view
                    // is "not paused", the consumer's stays paused.
                    if let Err(e) = consumer.pause(&tpl_of(std::slice::from_ref(&tp))) {
                        warn!(error = %e, topic = %tp.0, partition = tp.1, "pause of a paused route failed");
                    }
                    self.note_resumed(&tp, after_assign);
                }
                // Only left unread: reading it again is the whole resume.
                Action::Resume(tp) if self.unthrottle(&tp) && !after_assign => {}
                Action::Resume(tp) => {
                    if let Err(e) = consumer.resume(&tpl_of(std::slice::from_ref(&tp))) {
                        warn!(error = %e, topic = %tp.0, partition = tp.1, "resume failed");
                    } else {
                        self.note_resumed(&tp, after_assign);
                    }
                }
                Action::Seek(tp, offset) => {
                    // Asynchronous (a zero timeout): librdkafka drops what
                    // it pre-fetched for the partition at once and moves
                    // the fetch position in its own thread. Waiting for
                    // that stalled every partition's poll for a fetch
                    // round trip, which a fair route reading past a flood
                    // (several seeks a second) cannot afford: A's share
                    // of the route fell from 77 % to 64 % in the fairness
                    // bench. Records fetched again are skipped by the
                    // scheduler, whichever way the seek lands.
                    if let Err(e) =
                        consumer.seek(&tp.0, tp.1, Offset::Offset(offset), Duration::ZERO)
                    {
                        // The watermark stays below `offset`, so a failed
                        // seek shows up as lag, never as a lost retry.
                        warn!(error = %e, topic = %tp.0, partition = tp.1, offset, "seek failed");
                    }
                }
                Action::Commit(offsets) => {
                    if self.commit(consumer, &offsets, mode) {
                        committed.extend(offsets);
                    }
                }
            }
        }
        self.note_committed(&committed, mode);
    }

    /// Notes that kjob paused `tp` on the consumer.
    #[inline]
    pub(super) fn note_paused(&self, tp: Tp, after_assign: bool) {
        let mut core = self.lock();
        if after_assign && !core.applied_pause.contains(&tp) {
            debug!(topic = %tp.0, partition = tp.1, "pause state corrected after an assignment: paused");
        }
        core.applied_pause.insert(tp);
    }

    /// Notes that kjob resumed `tp` on the consumer (or that the scheduler
    /// let go of it while a route pause holds it).
    #[inline]
    pub(super) fn note_resumed(&self, tp: &Tp, after_assign: bool) {
        if self.lock().applied_pause.remove(tp) && after_assign {
            debug!(topic = %tp.0, partition = tp.1, "pause state corrected after an assignment: resumed (librdkafka kept an old pause)");
        }
    }

    /// Whether a partition of `topic` is read through its own queue, so
    /// that leaving it unread holds it at its bound.
    #[inline]
    pub(super) fn reads_split(&self, topic: &str) -> bool {
        self.split_reading.load(AtomicOrdering::Acquire)
            && self
                .routes
                .get(topic)
                .is_some_and(crate::worker::intake::reads_split)
    }

    /// Reads a partition left unread at its bound again. Returns whether it
    /// was left unread (and not also paused on the consumer).
    #[inline]
    pub(super) fn unthrottle(&self, tp: &Tp) -> bool {
        let mut core = self.lock();
        core.throttled.remove(tp) && !core.applied_pause.contains(tp)
    }

    /// Pauses the assigned partitions of the routes paused for the group
    /// and resumes the ones no longer paused, unless the scheduler holds
    /// them itself. One atomic load when nothing changed (unless `force`:
    /// after an assignment).
    pub(super) fn apply_pauses(&self, consumer: &BaseConsumer<Self>, force: bool) {
        let Some(in_force) = &self.in_force else {
            return;
        };
        let version = in_force.version();
        let mut applied = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if !force && applied.0 == version {
            return;
        }
        applied.0 = version;
        let assigned = self.stats.assignment();
        let want: std::collections::HashSet<Tp> = assigned
            .iter()
            .filter(|(t, _)| in_force.is_paused(t))
            .cloned()
            .collect();
        for tp in want.iter().filter(|tp| force || !applied.1.contains(*tp)) {
            match consumer.pause(&tpl_of(std::slice::from_ref(tp))) {
                Ok(()) => {
                    info!(topic = %tp.0, partition = tp.1, "paused: the route is paused for the group")
                }
                Err(e) => {
                    warn!(error = %e, topic = %tp.0, partition = tp.1, "pause for a paused route failed")
                }
            }
        }
        let released: Vec<Tp> = applied
            .1
            .iter()
            .filter(|tp| !want.contains(*tp) && assigned.contains(*tp))
            .cloned()
            .collect();
        if !released.is_empty() && !self.is_stopping() {
            let core = self.lock();
            for tp in released
                .iter()
                .filter(|tp| !core.applied_pause.contains(*tp))
            {
                match consumer.resume(&tpl_of(std::slice::from_ref(tp))) {
                    Ok(()) => {
                        info!(topic = %tp.0, partition = tp.1, "resumed: the route is no longer paused for the group")
                    }
                    Err(e) => {
                        warn!(error = %e, topic = %tp.0, partition = tp.1, "resume after a route pause failed")
                    }
                }
            }
        }
        applied.1 = want;
    }
}
