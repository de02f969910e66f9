//! Due-time holds: a record read from a retry tier or a delay bucket
//! before its due time waits here, in memory, with its partition paused
//! just past it.
//!
//! Why keep the record rather than seek back to it: given back at its due
//! time, it is ready at once. Read again after a seek, it waited a fetch
//! round trip first, and in a shared tier the slots freed meanwhile went to
//! other routes' retries (a wave of them, about 300 ms on a busy worker).
//! A hold costs one record per partition.

use super::types::{Action, Hold, Incoming, Located, Part, Tp};
use super::Scheduler;

impl<R: Located> Scheduler<R> {
    /// Holds `rec`, due at `due_ms`: kept, its offset unfinished in the
    /// tracker (the watermark stays below it), the partition paused and its
    /// position set just past it, so nothing behind it runs first and
    /// nothing is read twice.
    pub(super) fn hold(p: &mut Part<R>, rec: Incoming<R>, due_ms: i64, out: &mut Vec<Action<R>>) {
        p.tracker.start_at(rec.offset, rec.timestamp_ms);
        p.hold = Some(Hold {
            offset: rec.offset,
            due_ms,
            resumed: false,
        });
        out.push(Action::Pause(p.tp.clone()));
        out.push(Action::Seek(p.tp.clone(), rec.offset + 1));
        p.held = Some(rec);
    }

    /// Ends `p`'s hold once it is due: resumes the partition (unless it is
    /// paused for its bound, revoked or stopping) and answers the kept
    /// record, for the caller to take in as if just read.
    pub(super) fn end_hold_if_due(
        p: &mut Part<R>,
        now_ms: i64,
        bound: usize,
        stopping: bool,
        out: &mut Vec<Action<R>>,
    ) -> Option<Incoming<R>> {
        let h = p
            .hold
            .as_mut()
            .filter(|h| !h.resumed && h.due_ms <= now_ms)?;
        h.resumed = true;
        let next = h.offset + 1;
        // Paused only for its passed offsets: those are read back once the
        // held record is in (no read-back during a hold).
        if p.paused_bound && p.buffered() < bound {
            p.paused_bound = false;
        }
        if !p.paused_bound && !p.revoked && !stopping {
            out.push(Action::Resume(p.tp.clone()));
            out.push(Action::Seek(p.tp.clone(), next));
        }
        p.held.take()
    }

    /// The offset `tp`'s hold keeps in memory, if any: the harness lists
    /// that record as waiting, its position being already past it.
    #[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))]
    pub(crate) fn held_offset(&self, tp: &Tp) -> Option<i64> {
        self.part(tp)?.held.as_ref().map(|r| r.offset)
    }

    /// The earliest due time of a hold not yet ended, if any: the poll
    /// thread waits no longer than that, and the harness jumps its virtual
    /// clock there.
    pub(crate) fn next_due_ms(&self) -> Option<i64> {
        self.slots
            .iter()
            .flatten()
            .filter_map(|p| p.hold.filter(|h| !h.resumed).map(|h| h.due_ms))
            .min()
    }
}
