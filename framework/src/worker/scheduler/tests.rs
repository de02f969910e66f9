//! The scheduler's unit and property tests.

use crate::worker::scheduler::*;
use proptest::prelude::*;
use std::collections::{BTreeSet, HashSet};

impl Located for i64 {
    fn topic(&self) -> &str {
        "t"
    }
    fn partition(&self) -> i32 {
        0
    }
    fn header(&self, _: &str) -> Option<&str> {
        None
    }
}

fn limits(concurrency: usize, max_in_flight: usize) -> Limits {
    Limits {
        concurrency,
        max_in_flight,
        commit_interval_ms: 0,
    }
}

fn tp(p: i32) -> Tp {
    ("t".to_string(), p)
}

fn rec(offset: i64, key: u64) -> Incoming<i64> {
    Incoming {
        offset,
        lane: LaneKey::Key(key),
        timestamp_ms: None,
        due_ms: None,
        foreign: false,
        item: offset,
    }
}

fn runs(out: &[Action<i64>]) -> Vec<Ticket> {
    out.iter()
        .flat_map(|a| match a {
            Action::Run(jobs) => jobs.iter().map(|j| j.ticket).collect(),
            _ => vec![],
        })
        .collect()
}

/// A record of a named topic (partition 0), for the priority tests.
struct Topical(&'static str);

impl Located for Topical {
    fn topic(&self) -> &str {
        self.0
    }
    fn partition(&self) -> i32 {
        0
    }
    fn header(&self, _: &str) -> Option<&str> {
        None
    }
}

fn on(topic: &'static str, offset: i64) -> Incoming<Topical> {
    Incoming {
        offset,
        lane: LaneKey::Offset(offset),
        timestamp_ms: None,
        due_ms: None,
        foreign: false,
        item: Topical(topic),
    }
}

/// The (topic, ticket) of every job in `Run` actions.
fn started(out: &[Action<Topical>]) -> Vec<(&'static str, Ticket)> {
    out.iter()
        .flat_map(|a| match a {
            Action::Run(jobs) => jobs.iter().map(|j| (j.item.0, j.ticket)).collect(),
            _ => vec![],
        })
        .collect()
}

#[test]
fn urgent_jobs_take_free_slots_first_and_bulk_keeps_three_quarters_meanwhile() {
    let mut s = Scheduler::new(limits(8, 1_000)).with_priorities(HashMap::from([
        ("hi".to_string(), Priority::High),
        ("lo".to_string(), Priority::Low),
    ]));
    let mut out = Vec::new();
    s.assign(&[("hi".to_string(), 0), ("lo".to_string(), 0)], &mut out);
    // A bulk flood alone takes every slot.
    for o in 0..100 {
        s.record(on("lo", o), 0, &mut out);
    }
    out.clear();
    s.dispatch(&mut out);
    let mut bulk: Vec<Ticket> = started(&out).into_iter().map(|(_, t)| t).collect();
    assert_eq!(bulk.len(), 8, "bulk alone uses all 8 slots");
    // Urgent work arrives behind 92 ready bulk jobs: the next free slots
    // are its own.
    for o in 0..3 {
        s.record(on("hi", o), 10, &mut out);
    }
    out.clear();
    for t in bulk.drain(..2) {
        s.finished(t, true, &mut out);
    }
    s.dispatch(&mut out);
    let next = started(&out);
    assert_eq!(
        next.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
        vec!["hi", "hi"],
        "freed slots go to the urgent level"
    );
    // While urgent work is active, bulk keeps at most 6 of 8 slots.
    out.clear();
    for (_, t) in next {
        s.finished(t, true, &mut out);
    }
    s.dispatch(&mut out);
    let third = started(&out);
    assert_eq!(third.len(), 1, "one urgent job left");
    assert_eq!(third[0].0, "hi");
    out.clear();
    s.finished(third[0].1, true, &mut out);
    s.record(on("hi", 3), 500, &mut out);
    s.dispatch(&mut out);
    let fourth = started(&out);
    assert_eq!(fourth.len(), 1, "the new urgent job starts at once");
    let (running, ready) = s.by_level()[2];
    assert_eq!(running, 6, "bulk holds 6 slots while urgent work is active");
    assert!(ready > 0);
    // A second after the urgent level went quiet, bulk takes every slot.
    out.clear();
    for (_, t) in fourth {
        s.finished(t, true, &mut out);
    }
    s.tick(1_600, &mut out);
    out.clear();
    s.dispatch(&mut out);
    assert_eq!(s.by_level()[0], (0, 0));
    assert_eq!(s.running(), 8, "bulk takes all 8 slots again");
}

/// A 64-slot scheduler with a High topic `hi` and a Low topic `lo`:
/// `bulk` records on `lo`, then one on `hi`.
fn hi_and_lo(bound: usize, bulk: i64) -> (Scheduler<Topical>, Vec<Action<Topical>>) {
    let mut s = Scheduler::new(limits(64, bound)).with_priorities(HashMap::from([
        ("hi".to_string(), Priority::High),
        ("lo".to_string(), Priority::Low),
    ]));
    let mut out = Vec::new();
    s.assign(&[("hi".to_string(), 0), ("lo".to_string(), 0)], &mut out);
    for o in 0..bulk {
        s.record(on("lo", o), 0, &mut out);
    }
    s.record(on("hi", 0), 0, &mut out);
    out.clear();
    (s, out)
}

/// Of the jobs `out` started: bulk ones join `running`, urgent ones finish
/// at once.
fn settle_started(
    s: &mut Scheduler<Topical>,
    running: &mut VecDeque<Ticket>,
    out: &mut Vec<Action<Topical>>,
) {
    for (topic, t) in started(out) {
        if topic == "lo" {
            running.push_back(t);
        } else {
            s.finished(t, true, out);
        }
    }
}

#[test]
fn a_trickle_of_urgent_jobs_keeps_two_slots_and_a_burst_widens_the_reserve() {
    // One urgent job at a time: bulk leaves 2 slots free beside it.
    let (mut s, mut out) = hi_and_lo(10_000, 1_000);
    s.dispatch(&mut out);
    let first = started(&out);
    assert_eq!(first.iter().filter(|(t, _)| *t == "hi").count(), 1);
    assert_eq!(
        s.by_level()[2].0,
        61,
        "bulk holds 61 of 64 beside one urgent job"
    );
    // A burst of 10 urgent jobs: those beyond the free slots wait for the
    // next ones, and meanwhile the reserve widens to a quarter.
    for o in 1..11 {
        s.record(on("hi", o), 100, &mut out);
    }
    let hi_ticket = first.iter().find(|(t, _)| *t == "hi").map(|(_, t)| *t);
    out.clear();
    if let Some(t) = hi_ticket {
        s.finished(t, true, &mut out);
    }
    s.dispatch(&mut out);
    let bulk: Vec<Ticket> = first
        .iter()
        .filter(|(t, _)| *t == "lo")
        .map(|(_, t)| *t)
        .collect();
    for t in bulk.iter().take(20) {
        s.finished(*t, true, &mut out);
    }
    out.clear();
    s.dispatch(&mut out);
    let (hi_running, hi_ready) = s.by_level()[0];
    assert_eq!((hi_running, hi_ready), (10, 0), "the burst runs");
    assert!(
        s.by_level()[2].0 <= 48,
        "bulk leaves a quarter while the burst's peak lasts: {:?}",
        s.by_level()
    );
}

#[test]
fn short_bulk_handlers_borrow_the_reserve_and_slow_ones_leave_it() {
    // One urgent job keeps the High level active for a second.
    let (mut s, mut out) = hi_and_lo(100_000, 20_000);
    s.dispatch(&mut out);
    let mut running: VecDeque<Ticket> = started(&out)
        .into_iter()
        .filter(|(t, _)| *t == "lo")
        .map(|(_, t)| t)
        .collect();
    assert_eq!(running.len(), 61, "slow turnover: bulk leaves the reserve");
    for (_, t) in started(&out).into_iter().filter(|(t, _)| *t == "hi") {
        s.finished(t, true, &mut out);
    }
    // Short bulk handlers: 12 slots free per millisecond.
    let mut hi_offset = 1;
    for ms in 1..=200 {
        s.tick(ms, &mut out);
        out.clear();
        for _ in 0..12 {
            if let Some(t) = running.pop_front() {
                s.finished(t, true, &mut out);
            }
        }
        s.dispatch(&mut out);
        settle_started(&mut s, &mut running, &mut out);
        if ms % 20 == 0 {
            // The trickle goes on: each urgent job starts as soon as it is
            // ready or at the next freed slot.
            s.record(on("hi", hi_offset), ms, &mut out);
            hi_offset += 1;
        }
    }
    let (bulk_running, _) = s.by_level()[2];
    assert_eq!(
        bulk_running, 63,
        "with 2 400 slots freed in 200 ms bulk borrows all the reserve but one slot"
    );
    // An urgent job takes the kept slot at once; a second one takes the
    // very next freed slot.
    out.clear();
    s.record(on("hi", hi_offset), 201, &mut out);
    s.record(on("hi", hi_offset + 1), 201, &mut out);
    hi_offset += 2;
    s.dispatch(&mut out);
    assert_eq!(
        started(&out).iter().map(|(t, _)| *t).collect::<Vec<_>>(),
        vec!["hi"],
        "the kept slot is the first urgent job's; every other slot is taken"
    );
    if let Some(t) = running.pop_front() {
        s.finished(t, true, &mut out);
    }
    out.clear();
    s.dispatch(&mut out);
    assert_eq!(
        started(&out).iter().map(|(t, _)| *t).collect::<Vec<_>>(),
        vec!["hi"],
        "the freed slot is the second urgent job's"
    );
    // Bulk slows to one finish every 10 ms: after two quiet seconds the
    // reserve is whole again.
    out.clear();
    for ms in (210..2_400).step_by(10) {
        s.tick(ms, &mut out);
        if let Some(t) = running.pop_front() {
            s.finished(t, true, &mut out);
        }
        if ms % 100 == 0 {
            s.record(on("hi", hi_offset + 1), ms, &mut out);
            hi_offset += 1;
        }
        s.dispatch(&mut out);
        settle_started(&mut s, &mut running, &mut out);
        out.clear();
    }
    assert!(
        s.by_level()[2].0 <= 62,
        "slow bulk leaves the reserve again: {:?}",
        s.by_level()
    );
}

#[test]
fn without_priorities_every_topic_shares_one_level() {
    let mut s: Scheduler<Topical> = Scheduler::new(limits(4, 1_000));
    let mut out = Vec::new();
    s.assign(&[("a".to_string(), 0), ("b".to_string(), 0)], &mut out);
    for o in 0..10 {
        s.record(on("a", o), 0, &mut out);
        s.record(on("b", o), 0, &mut out);
    }
    out.clear();
    s.dispatch(&mut out);
    assert_eq!(
        started(&out).iter().map(|(t, _)| *t).collect::<Vec<_>>(),
        vec!["a", "b", "a", "b"],
        "arrival order, all slots used"
    );
}

#[test]
fn same_key_runs_in_order_and_other_keys_in_parallel() {
    let mut s = Scheduler::new(limits(8, 100));
    let mut out = Vec::new();
    s.assign(&[tp(0)], &mut out);
    for (o, k) in [(0, 1), (1, 1), (2, 2), (3, 1)] {
        s.record(rec(o, k), 0, &mut out);
    }
    out.clear();
    s.dispatch(&mut out);
    let first = runs(&out);
    assert_eq!(
        first.iter().map(|t| t.offset).collect::<Vec<_>>(),
        vec![0, 2],
        "one job per key at a time"
    );
    out.clear();
    s.finished(first[0], true, &mut out);
    s.dispatch(&mut out);
    assert_eq!(
        runs(&out).iter().map(|t| t.offset).collect::<Vec<_>>(),
        vec![1]
    );
}

#[test]
fn a_revoke_or_stop_releases_the_jobs_of_its_partitions_only() {
    let mut s = Scheduler::new(limits(8, 100));
    let mut out = Vec::new();
    let (a, b) = (("a".to_string(), 0), ("b".to_string(), 0));
    s.assign(&[a.clone(), b], &mut out);
    s.record(on("a", 0), 0, &mut out);
    s.record(on("b", 0), 0, &mut out);
    out.clear();
    s.dispatch(&mut out);
    let released: Vec<(&str, crate::worker::scheduler::Released)> = out
        .iter()
        .flat_map(|a| match a {
            Action::Run(jobs) => jobs
                .iter()
                .map(|j| (j.item.0, j.released.clone()))
                .collect(),
            _ => vec![],
        })
        .collect();
    assert_eq!(released.len(), 2);
    assert!(released.iter().all(|(_, t)| !t.is_cancelled()));
    s.revoke(&[a]);
    for (topic, token) in &released {
        assert_eq!(
            token.is_cancelled(),
            *topic == "a",
            "only the revoked partition's job is released"
        );
    }
    s.stop(false, &mut out);
    assert!(
        released.iter().all(|(_, t)| t.is_cancelled()),
        "a stop releases every job"
    );
}

#[test]
fn the_watermark_never_passes_a_running_job() {
    let mut s = Scheduler::new(limits(8, 100));
    let mut out = Vec::new();
    s.assign(&[tp(0)], &mut out);
    for o in 0..3 {
        s.record(rec(o, o as u64), 0, &mut out);
    }
    s.dispatch(&mut out);
    let t = runs(&out);
    out.clear();
    s.finished(t[2], true, &mut out);
    s.finished(t[0], true, &mut out);
    s.commit_all(&mut out);
    assert!(matches!(&out[..], [Action::Commit(c)] if c == &vec![(tp(0), 1)]));
}

#[test]
fn the_in_flight_bound_pauses_and_resumes_at_three_quarters() {
    let mut s = Scheduler::new(limits(100, 8));
    let mut out = Vec::new();
    s.assign(&[tp(0)], &mut out);
    out.clear();
    for o in 0..8 {
        s.record(rec(o, o as u64), 0, &mut out);
    }
    assert!(matches!(&out[..], [Action::Pause(_)]), "{out:?}");
    assert!(s.wants_pause(&tp(0)));
    out.clear();
    s.dispatch(&mut out);
    let t = runs(&out);
    out.clear();
    s.finished(t[0], true, &mut out);
    assert!(out.is_empty(), "7 in flight: still above three quarters");
    s.finished(t[1], true, &mut out);
    assert!(matches!(&out[..], [Action::Resume(_)]), "{out:?}");
}

#[test]
fn the_next_due_time_is_the_earliest_hold_not_yet_ended() {
    let mut s: Scheduler<Topical> = Scheduler::new(limits(8, 100));
    let mut out = Vec::new();
    s.assign(&[("a".to_string(), 0), ("b".to_string(), 0)], &mut out);
    assert_eq!(s.next_due_ms(), None, "nothing held");
    for (topic, due) in [("a", 2_000), ("b", 1_000)] {
        let mut r = on(topic, 5);
        r.due_ms = Some(due);
        s.record(r, 0, &mut out);
    }
    assert_eq!(s.next_due_ms(), Some(1_000));
    s.tick(1_000, &mut out);
    assert_eq!(
        s.next_due_ms(),
        Some(2_000),
        "the ended hold no longer counts"
    );
    s.tick(2_000, &mut out);
    assert_eq!(s.next_due_ms(), None);
}

#[test]
fn a_hold_that_ends_on_a_partition_at_its_bound_keeps_it_paused_until_under() {
    // Bound 3: jobs 0-2 run and pause the partition; 3 was fetched before
    // the pause and is held. At its due time 3 runs, but the partition
    // stays paused while 3 (or more) of its records are unfinished.
    for finished_first in [0usize, 1] {
        let mut s = Scheduler::new(limits(8, 3));
        let mut out = Vec::new();
        s.assign(&[tp(0)], &mut out);
        for o in 0..3 {
            s.record(rec(o, o as u64), 0, &mut out);
        }
        s.dispatch(&mut out);
        let t = runs(&out);
        assert_eq!(t.len(), 3);
        let mut held = rec(3, 3);
        held.due_ms = Some(1_000);
        s.record(held, 0, &mut out);
        for ticket in t.iter().take(finished_first) {
            s.finished(*ticket, true, &mut out);
        }
        out.clear();
        s.tick(1_000, &mut out);
        s.dispatch(&mut out);
        assert!(
            !out.iter().any(|a| matches!(a, Action::Resume(_))),
            "{} unfinished: {out:?}",
            4 - finished_first
        );
        assert_eq!(runs(&out).iter().map(|t| t.offset).collect::<Vec<_>>(), [3]);
        out.clear();
        for ticket in t.iter().skip(finished_first) {
            s.finished(*ticket, true, &mut out);
        }
        assert!(
            out.iter().any(|a| matches!(a, Action::Resume(_))),
            "{out:?}"
        );
    }
}

#[test]
fn a_hold_that_ends_on_a_revoked_or_stopping_partition_resumes_nothing() {
    for stop in [false, true] {
        let mut s = Scheduler::new(limits(8, 100));
        let mut out = Vec::new();
        s.assign(&[tp(0)], &mut out);
        let mut r = rec(5, 1);
        r.due_ms = Some(1_000);
        s.record(r, 0, &mut out);
        match stop {
            true => s.stop(false, &mut out),
            false => s.revoke(&[tp(0)]),
        }
        out.clear();
        s.tick(1_000, &mut out);
        s.dispatch(&mut out);
        assert!(
            !out.iter()
                .any(|a| matches!(a, Action::Resume(_) | Action::Seek(..))),
            "stop {stop}: {out:?}"
        );
        assert!(
            runs(&out).is_empty(),
            "stop {stop}: the kept record does not run"
        );
    }
}

#[test]
fn a_record_not_due_holds_its_partition_until_due() {
    let mut s = Scheduler::new(limits(8, 100));
    let mut out = Vec::new();
    s.assign(&[tp(0)], &mut out);
    out.clear();
    let mut r = rec(5, 1);
    r.due_ms = Some(1_000);
    s.record(r, 0, &mut out);
    // Paused just past it: the record is kept, not fetched again.
    assert!(
        matches!(&out[..], [Action::Pause(_), Action::Seek(_, 6)]),
        "{out:?}"
    );
    out.clear();
    s.record(rec(6, 2), 0, &mut out);
    s.dispatch(&mut out);
    assert!(out.is_empty(), "nothing behind a hold runs");
    s.tick(999, &mut out);
    s.dispatch(&mut out);
    assert!(runs(&out).is_empty(), "not due yet: {out:?}");
    assert!(!out.iter().any(|a| matches!(a, Action::Resume(_))));
    out.clear();
    s.tick(1_000, &mut out);
    assert!(
        matches!(&out[..2], [Action::Resume(_), Action::Seek(_, 6)]),
        "{out:?}"
    );
    s.dispatch(&mut out);
    let ran = runs(&out);
    assert_eq!(ran.len(), 1, "the kept record runs at its due time");
    assert_eq!(ran[0].offset, 5);
    // Read on from just past it: 6 comes, and runs behind nothing.
    out.clear();
    s.record(rec(6, 2), 1_000, &mut out);
    s.dispatch(&mut out);
    assert_eq!(runs(&out).len(), 1);
    // No commit passes the held record before it finished.
    s.tick(10_000, &mut out);
    assert!(
        !out.iter()
            .any(|a| matches!(a, Action::Commit(c) if c.iter().any(|(_, n)| *n > 5))),
        "{out:?}"
    );
}

#[test]
fn a_revoke_drops_what_has_not_started_and_waits_only_for_running_jobs() {
    let mut s = Scheduler::new(limits(1, 100));
    let mut out = Vec::new();
    s.assign(&[tp(0)], &mut out);
    for o in 0..50 {
        s.record(rec(o, o as u64), 0, &mut out);
    }
    out.clear();
    s.dispatch(&mut out);
    let t = runs(&out);
    assert_eq!(t.len(), 1);
    s.revoke(&[tp(0)]);
    assert_eq!(s.running_in(&[tp(0)]), 1);
    assert_eq!(s.ready_len(), 0, "49 jobs dropped at once");
    out.clear();
    s.finished(t[0], true, &mut out);
    assert_eq!(s.running_in(&[tp(0)]), 0);
    s.release(&[tp(0)], false, &mut out);
    assert!(
        matches!(&out[..], [Action::Commit(c)] if c == &vec![(tp(0), 1)]),
        "{out:?}"
    );
}

#[test]
fn a_lost_partition_is_not_committed_and_a_stale_completion_is_ignored() {
    let mut s = Scheduler::new(limits(4, 100));
    let mut out = Vec::new();
    s.assign(&[tp(0)], &mut out);
    s.record(rec(0, 1), 0, &mut out);
    s.dispatch(&mut out);
    let t = runs(&out);
    out.clear();
    s.revoke(&[tp(0)]);
    s.release(&[tp(0)], true, &mut out);
    assert!(out.is_empty());
    s.assign(&[tp(0)], &mut out);
    out.clear();
    s.finished(t[0], true, &mut out);
    assert_eq!(s.running(), 0);
    s.commit_all(&mut out);
    assert!(out.is_empty(), "the old epoch's completion marked nothing");
}

fn grants(out: &[Action<i64>]) -> Vec<Ticket> {
    out.iter()
        .flat_map(|a| match a {
            Action::Grant(t) => t.clone(),
            _ => vec![],
        })
        .collect()
}

#[test]
fn a_parked_job_gives_its_slot_to_another_key_and_keeps_its_lane() {
    let mut s = Scheduler::new(limits(1, 100));
    let mut out = Vec::new();
    s.assign(&[tp(0)], &mut out);
    for (o, k) in [(0, 1), (1, 1), (2, 2)] {
        s.record(rec(o, k), 0, &mut out);
    }
    out.clear();
    s.dispatch(&mut out);
    let first = runs(&out);
    assert_eq!(first.iter().map(|t| t.offset).collect::<Vec<_>>(), [0]);
    out.clear();
    s.park(first[0]);
    assert_eq!((s.running(), s.parked()), (0, 1));
    s.dispatch(&mut out);
    let second = runs(&out);
    assert_eq!(
        second.iter().map(|t| t.offset).collect::<Vec<_>>(),
        [2],
        "key 2 takes the slot; key 1's next job waits behind its parked head"
    );
    out.clear();
    assert!(!s.unpark(first[0]), "no slot free: it waits for a grant");
    s.finished(second[0], true, &mut out);
    s.dispatch(&mut out);
    assert_eq!(grants(&out), [first[0]], "the parked job is served first");
    assert!(runs(&out).is_empty(), "the concurrency limit holds");
    out.clear();
    s.finished(first[0], true, &mut out);
    s.dispatch(&mut out);
    assert_eq!(runs(&out).iter().map(|t| t.offset).collect::<Vec<_>>(), [1]);
}

#[test]
fn a_parked_job_released_by_a_revoke_frees_nothing_twice() {
    let mut s = Scheduler::new(limits(2, 100));
    let mut out = Vec::new();
    s.assign(&[tp(0), tp(1)], &mut out);
    s.record(rec(0, 1), 0, &mut out);
    out.clear();
    s.dispatch(&mut out);
    let t = runs(&out)[0];
    s.park(t);
    assert!(
        !s.idle(),
        "a parked job keeps a stop waiting for its release"
    );
    s.revoke(&[tp(0)]);
    out.clear();
    s.finished(t, false, &mut out);
    assert_eq!((s.running(), s.parked()), (0, 0));
    assert!(s.idle());
}

#[test]
fn a_partition_that_comes_back_unchanged_skips_what_this_member_finished() {
    let mut s = Scheduler::new(limits(8, 100));
    let mut out = Vec::new();
    s.assign(&[tp(0)], &mut out);
    for o in 0..6 {
        s.record(rec(o, o as u64), 0, &mut out);
    }
    out.clear();
    s.dispatch(&mut out);
    let t = runs(&out);
    for i in [0, 1, 3] {
        s.finished(t[i], true, &mut out);
    }
    // The session expires (the coordinator is down): lost, no commit.
    s.revoke(&[tp(0)]);
    out.clear();
    s.release(&[tp(0)], true, &mut out);
    assert!(out.is_empty());
    // A job that was running finishes after the loss.
    s.finished(t[4], true, &mut out);
    s.assign(&[tp(0)], &mut out);
    out.clear();
    // Nothing was committed meanwhile: fetching starts at 0 again.
    for o in 0..6 {
        s.record(rec(o, o as u64), 0, &mut out);
    }
    s.dispatch(&mut out);
    let again: Vec<i64> = runs(&out).iter().map(|t| t.offset).collect();
    assert_eq!(again, [2, 5], "only what did not finish runs again");
    assert_eq!(s.skipped_finished(), 4);
    out.clear();
    s.commit_all(&mut out);
    assert!(
        matches!(&out[..], [Action::Commit(c)] if c == &vec![(tp(0), 2)]),
        "{out:?}"
    );
}

#[test]
fn a_partition_whose_position_moved_meanwhile_runs_everything_again() {
    let mut s = Scheduler::new(limits(8, 100));
    let mut out = Vec::new();
    s.assign(&[tp(0)], &mut out);
    for o in 0..4 {
        s.record(rec(o, o as u64), 0, &mut out);
    }
    s.dispatch(&mut out);
    let t = runs(&out);
    for ticket in &t {
        s.finished(*ticket, true, &mut out);
    }
    s.revoke(&[tp(0)]);
    s.release(&[tp(0)], true, &mut out);
    s.assign(&[tp(0)], &mut out);
    out.clear();
    // Another member committed 2 meanwhile: the kept state is dropped.
    for o in 2..4 {
        s.record(rec(o, o as u64), 0, &mut out);
    }
    s.dispatch(&mut out);
    let again: Vec<i64> = runs(&out).iter().map(|t| t.offset).collect();
    assert_eq!(again, [2, 3]);
    assert_eq!(s.skipped_finished(), 0);
}

#[test]
fn a_returning_partition_the_adapter_saw_moved_runs_everything_again() {
    // The position another member committed can equal one this member
    // sent and never saw answered; only the commit's tag tells them
    // apart, and the adapter reports what it read.
    let mut s = Scheduler::new(limits(8, 100));
    let mut out = Vec::new();
    s.assign(&[tp(0)], &mut out);
    for o in 0..4 {
        s.record(rec(o, o as u64), 0, &mut out);
    }
    s.dispatch(&mut out);
    for ticket in runs(&out) {
        s.finished(ticket, true, &mut out);
    }
    s.revoke(&[tp(0)]);
    s.release(&[tp(0)], true, &mut out);
    s.assign(&[tp(0)], &mut out);
    assert_eq!(s.returning(), vec![tp(0)]);
    s.forget_returning(&tp(0));
    assert!(s.returning().is_empty());
    out.clear();
    // Fetching starts where this member began, which alone would look
    // unchanged.
    for o in 0..4 {
        s.record(rec(o, o as u64), 0, &mut out);
    }
    s.dispatch(&mut out);
    let again: Vec<i64> = runs(&out).iter().map(|t| t.offset).collect();
    assert_eq!(again, [0, 1, 2, 3]);
    assert_eq!(s.skipped_finished(), 0);
}

#[test]
fn a_planned_stop_runs_what_lies_below_the_highest_started_job() {
    let mut s = Scheduler::new(limits(8, 100));
    let mut out = Vec::new();
    s.assign(&[tp(0)], &mut out);
    // Key 1: offsets 0, 1, 2 (one lane); key 2: offset 3; key 3: offset 4.
    for (o, k) in [(0, 1), (1, 1), (2, 1), (3, 2), (4, 3)] {
        s.record(rec(o, k), 0, &mut out);
    }
    out.clear();
    s.dispatch(&mut out);
    let started = runs(&out);
    assert_eq!(
        started.iter().map(|t| t.offset).collect::<Vec<_>>(),
        vec![0, 3, 4]
    );
    out.clear();
    s.stop(true, &mut out);
    // 1 and 2 lie below 4 (started): they still run; nothing above 4 exists.
    for t in &started {
        s.finished(*t, true, &mut out);
    }
    out.clear();
    s.dispatch(&mut out);
    let next = runs(&out);
    assert_eq!(next.iter().map(|t| t.offset).collect::<Vec<_>>(), vec![1]);
    s.finished(next[0], true, &mut out);
    out.clear();
    s.dispatch(&mut out);
    let last = runs(&out);
    assert_eq!(last.iter().map(|t| t.offset).collect::<Vec<_>>(), vec![2]);
    s.finished(last[0], true, &mut out);
    assert!(s.idle());
    out.clear();
    s.commit_all(&mut out);
    assert!(
        matches!(&out[..], [Action::Commit(c)] if c == &vec![(tp(0), 5)]),
        "{out:?}"
    );
    // A SIGTERM-like stop drops them instead.
    let mut s = Scheduler::new(limits(8, 100));
    s.assign(&[tp(0)], &mut out);
    for (o, k) in [(0, 1), (1, 1), (2, 2)] {
        s.record(rec(o, k), 0, &mut out);
    }
    out.clear();
    s.dispatch(&mut out);
    let started = runs(&out);
    s.stop(false, &mut out);
    for t in &started {
        s.finished(*t, true, &mut out);
    }
    out.clear();
    s.dispatch(&mut out);
    assert!(runs(&out).is_empty() && s.idle());
}

/// Operations of the property test.
#[derive(Clone, Debug)]
enum Op {
    Poll(u8),
    Finish(u8),
    /// A revoke and re-assignment; `true` cancels the running jobs
    /// (past the revoke timeout) instead of letting them finish.
    Rebalance(bool),
    /// The partition is lost (session expired) and comes back: running
    /// jobs go on and finish later, as stale completions.
    Lost,
    /// A running job starts waiting for a downstream.
    Park(u8),
    /// A parked job can go on.
    Unpark(u8),
    Tick(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u8..6).prop_map(Op::Poll),
        4 => any::<u8>().prop_map(Op::Finish),
        1 => any::<bool>().prop_map(Op::Rebalance),
        1 => Just(Op::Lost),
        2 => any::<u8>().prop_map(Op::Park),
        2 => any::<u8>().prop_map(Op::Unpark),
        1 => (1u16..2_000).prop_map(Op::Tick),
    ]
}

/// An in-memory partition log, consumer position and pause flag, driven
/// by the scheduler's actions, as the poll thread drives rdkafka.
struct Sim {
    keys: Vec<u64>,
    due: Vec<Option<i64>>,
    pos: i64,
    paused: bool,
    running: Vec<Ticket>,
    done: BTreeSet<i64>,
    committed: i64,
    now: i64,
    /// Per assignment: offsets run, to catch a double run.
    run_this_epoch: HashSet<i64>,
    /// Per lane: the offsets run, in order.
    lane_order: HashMap<u64, Vec<i64>>,
    /// Running jobs that are parked (holding no slot), and those of
    /// them that asked for a slot again.
    parked: HashSet<Ticket>,
    asked: HashSet<Ticket>,
    concurrency: usize,
    /// Jobs of an earlier, lost assignment, still running.
    stale: Vec<Ticket>,
}

impl Sim {
    fn apply(&mut self, out: Vec<Action<i64>>) {
        for a in out {
            match a {
                Action::Run(jobs) => {
                    for j in jobs {
                        assert!(
                            self.run_this_epoch.insert(j.ticket.offset),
                            "offset {} run twice in one assignment",
                            j.ticket.offset
                        );
                        let key = self.keys[j.ticket.offset as usize];
                        if let Some(last) = self.lane_order.get(&key).and_then(|v| v.last()) {
                            assert!(*last < j.ticket.offset, "key {key} ran out of order");
                        }
                        assert!(
                            self.running
                                .iter()
                                .all(|r| self.keys[r.offset as usize] != key),
                            "two jobs of key {key} at once"
                        );
                        self.lane_order
                            .entry(key)
                            .or_default()
                            .push(j.ticket.offset);
                        self.running.push(j.ticket);
                    }
                }
                Action::Grant(ts) => {
                    for t in ts {
                        assert!(self.asked.remove(&t), "a grant nobody asked for");
                        self.parked.remove(&t);
                    }
                }
                Action::Pause(_) => self.paused = true,
                Action::Resume(_) => self.paused = false,
                Action::Seek(_, o) => self.pos = o,
                Action::Commit(c) => {
                    for (_, next) in c {
                        for o in 0..next {
                            assert!(
                                self.done.contains(&o),
                                "commit {next} passes unfinished offset {o}"
                            );
                        }
                        self.committed = self.committed.max(next);
                    }
                }
            }
        }
    }

    fn incoming(&self, o: i64) -> Incoming<i64> {
        Incoming {
            offset: o,
            lane: LaneKey::Key(self.keys[o as usize]),
            timestamp_ms: None,
            due_ms: self.due[o as usize],
            foreign: false,
            item: o,
        }
    }

    fn poll(&mut self, s: &mut Scheduler<i64>, n: u8) {
        let mut out = Vec::new();
        for _ in 0..n {
            if self.paused || self.pos as usize >= self.keys.len() {
                break;
            }
            let o = self.pos;
            self.pos += 1;
            s.record(self.incoming(o), self.now, &mut out);
            // An action (a hold's seek) may change the position.
            self.apply(std::mem::take(&mut out));
        }
        s.dispatch(&mut out);
        self.apply(out);
    }

    fn finish(&mut self, s: &mut Scheduler<i64>, i: usize, done: bool) {
        if self.running.is_empty() {
            return;
        }
        let t = self.running[i % self.running.len()];
        // A parked job cannot finish its handler; it only ends when
        // released (not done).
        let done = done && !self.parked.contains(&t);
        self.running.retain(|r| *r != t);
        self.parked.remove(&t);
        self.asked.remove(&t);
        if done {
            self.done.insert(t.offset);
        }
        let mut out = Vec::new();
        s.finished(t, done, &mut out);
        s.dispatch(&mut out);
        self.apply(out);
    }

    fn park(&mut self, s: &mut Scheduler<i64>, i: usize) {
        let free: Vec<Ticket> = self
            .running
            .iter()
            .filter(|t| !self.parked.contains(t))
            .copied()
            .collect();
        if let Some(t) = free.get(i % free.len().max(1)) {
            s.park(*t);
            self.parked.insert(*t);
            let mut out = Vec::new();
            s.dispatch(&mut out);
            self.apply(out);
        }
    }

    fn unpark(&mut self, s: &mut Scheduler<i64>, i: usize) {
        let waiting: Vec<Ticket> = self
            .parked
            .iter()
            .filter(|t| !self.asked.contains(t))
            .copied()
            .collect();
        if let Some(t) = waiting.get(i % waiting.len().max(1)) {
            if s.unpark(*t) {
                self.parked.remove(t);
            } else {
                self.asked.insert(*t);
            }
        }
    }

    /// Jobs holding a slot never exceed the limit.
    fn check_concurrency(&self) {
        let holding = self.running.len() - self.parked.len();
        assert!(holding <= self.concurrency, "{holding} jobs hold a slot");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Random interleavings of arrival, completion (and failure to
    /// complete), rebalance and time: the commit never passes an
    /// unfinished record, per-key order holds, no record runs twice in
    /// one assignment, and at the end every record ran, everything is
    /// committed and nothing is left paused.
    #[test]
    fn scheduler_invariants_hold_under_random_interleavings(
        keys in prop::collection::vec(0u64..4, 1..40),
        dues in prop::collection::vec(prop::option::weighted(0.2, 0i64..3_000), 40),
        ops in prop::collection::vec(op(), 1..120),
        concurrency in 1usize..4,
        bound in 1usize..6,
    ) {
        let n = keys.len();
        let mut s = Scheduler::new(Limits { concurrency, max_in_flight: bound, commit_interval_ms: 100 });
        let mut sim = Sim {
            due: dues[..n].to_vec(),
            keys,
            pos: 0,
            paused: false,
            running: Vec::new(),
            done: BTreeSet::new(),
            committed: 0,
            now: 0,
            run_this_epoch: HashSet::new(),
            lane_order: HashMap::new(),
            parked: HashSet::new(),
            asked: HashSet::new(),
            concurrency,
            stale: Vec::new(),
        };
        let mut out = Vec::new();
        s.assign(&[tp(0)], &mut out);
        sim.apply(std::mem::take(&mut out));
        for op in ops {
            match op {
                Op::Poll(k) => sim.poll(&mut s, k),
                Op::Finish(i) => {
                    // Now and then a lost assignment's job finishes.
                    if i % 4 == 0 {
                        if let Some(t) = sim.stale.pop() {
                            sim.done.insert(t.offset);
                            s.finished(t, true, &mut out);
                            s.dispatch(&mut out);
                            sim.apply(std::mem::take(&mut out));
                        }
                    }
                    // A parked job only ends when released (a rebalance).
                    let free: Vec<usize> = (0..sim.running.len())
                        .filter(|k| !sim.parked.contains(&sim.running[*k]))
                        .collect();
                    if !free.is_empty() {
                        sim.finish(&mut s, free[i as usize % free.len()], true);
                    }
                }
                Op::Park(i) => sim.park(&mut s, i as usize),
                Op::Unpark(i) => sim.unpark(&mut s, i as usize),
                Op::Lost => {
                    s.revoke(&[tp(0)]);
                    s.release(&[tp(0)], true, &mut out);
                    sim.apply(std::mem::take(&mut out));
                    // Running jobs go on; parked ones are released.
                    for t in std::mem::take(&mut sim.running) {
                        if sim.parked.remove(&t) {
                            sim.asked.remove(&t);
                            s.finished(t, false, &mut out);
                        } else {
                            sim.stale.push(t);
                        }
                    }
                    sim.apply(std::mem::take(&mut out));
                    // Nobody else took it: fetching starts where the
                    // group's position is.
                    sim.pos = sim.committed;
                    sim.run_this_epoch.clear();
                    sim.lane_order.clear();
                    s.assign(&[tp(0)], &mut out);
                    sim.apply(std::mem::take(&mut out));
                }
                Op::Tick(ms) => {
                    sim.now += i64::from(ms);
                    s.tick(sim.now, &mut out);
                    s.dispatch(&mut out);
                    sim.apply(std::mem::take(&mut out));
                }

                Op::Rebalance(cancel) => {
                    s.revoke(&[tp(0)]);
                    while !sim.running.is_empty() {
                        sim.finish(&mut s, 0, !cancel);
                    }
                    for t in std::mem::take(&mut sim.stale) {
                        sim.done.insert(t.offset);
                        s.finished(t, true, &mut out);
                    }
                    s.release(&[tp(0)], false, &mut out);
                    sim.apply(std::mem::take(&mut out));
                    // The new assignment fetches from the committed position.
                    sim.pos = sim.committed;
                    sim.run_this_epoch.clear();
                    sim.lane_order.clear();
                    s.assign(&[tp(0)], &mut out);
                    sim.apply(std::mem::take(&mut out));
                }
            }
            sim.check_concurrency();
        }
        // Drain: everything finishes, time passes, nothing stays paused.
        for _ in 0..10_000 {
            let drained = sim.pos as usize == n && sim.running.is_empty() && s.ready_len() == 0;
            if drained && sim.done.len() == n && s.next_due_ms().is_none() {
                break;
            }
            sim.poll(&mut s, 8);
            for t in std::mem::take(&mut sim.stale) {
                sim.done.insert(t.offset);
                s.finished(t, true, &mut out);
            }
            // Parked jobs can go on; they finish once granted.
            for _ in 0..sim.parked.len() {
                sim.unpark(&mut s, 0);
            }
            s.dispatch(&mut out);
            sim.apply(std::mem::take(&mut out));
            while let Some(i) = sim.running.iter().position(|t| !sim.parked.contains(t)) {
                sim.finish(&mut s, i, true);
            }
            sim.now += 500;
            s.tick(sim.now, &mut out);
            s.dispatch(&mut out);
            sim.apply(std::mem::take(&mut out));
        }
        prop_assert_eq!(sim.done.len(), n, "every record ran");
        s.commit_all(&mut out);
        sim.apply(std::mem::take(&mut out));
        prop_assert_eq!(sim.committed, n as i64, "committed equals end");
        prop_assert!(!sim.paused, "no partition left paused");
    }
}

/// A record of a named topic that names its route (`kjob-route`), as in a
/// shared tier.
struct Named(&'static str, &'static str);

impl Located for Named {
    fn topic(&self) -> &str {
        self.0
    }
    fn partition(&self) -> i32 {
        0
    }
    fn header(&self, name: &str) -> Option<&str> {
        (name == crate::headers::ROUTE).then_some(self.1)
    }
}

fn named(topic: &'static str, route: &'static str, offset: i64) -> Incoming<Named> {
    Incoming {
        offset,
        lane: LaneKey::Offset(offset),
        timestamp_ms: None,
        due_ms: None,
        foreign: false,
        item: Named(topic, route),
    }
}

/// Two routes, `bulk` (index 0) and `urgent` (1), with the shared tier
/// `g.retry.1s`.
fn two_routes() -> Turns {
    Turns {
        own: HashMap::from([
            ("bulk".to_string(), 0),
            ("bulk.retry.1s".to_string(), 0),
            ("urgent".to_string(), 1),
        ]),
        shared: HashSet::from(["g.retry.1s".to_string()]),
        back: HashSet::from(["bulk.retry.1s".to_string(), "g.retry.1s".to_string()]),
    }
}

fn started_named(out: &[Action<Named>]) -> Vec<(&'static str, Ticket)> {
    out.iter()
        .flat_map(|a| match a {
            Action::Run(jobs) => jobs.iter().map(|j| (j.item.1, j.ticket)).collect(),
            _ => vec![],
        })
        .collect()
}

#[test]
fn routes_of_one_level_take_turns_so_a_flood_does_not_queue_another_route_behind_it() {
    let mut s = Scheduler::new(limits(4, 10_000)).with_turns(two_routes());
    let mut out = Vec::new();
    let tps: Vec<Tp> = ["bulk", "bulk.retry.1s", "urgent"]
        .iter()
        .map(|t| (t.to_string(), 0))
        .collect();
    s.assign(&tps, &mut out);
    // A flood of bulk work, first attempts and retries, fills the slots
    // and the ready queue.
    for o in 0..500 {
        s.record(named("bulk", "bulk", o), 0, &mut out);
        s.record(named("bulk.retry.1s", "bulk", o), 0, &mut out);
    }
    out.clear();
    s.dispatch(&mut out);
    let mut running: Vec<Ticket> = started_named(&out).into_iter().map(|(_, t)| t).collect();
    assert_eq!(running.len(), 4);
    // Urgent jobs arrive behind 996 ready bulk jobs of the same level.
    for o in 0..3 {
        s.record(named("urgent", "urgent", o), 0, &mut out);
    }
    let mut order = Vec::new();
    for _ in 0..6 {
        out.clear();
        let t = running.remove(0);
        s.finished(t, true, &mut out);
        s.dispatch(&mut out);
        for (route, t) in started_named(&out) {
            order.push(route);
            running.push(t);
        }
    }
    assert_eq!(
        order,
        vec!["bulk", "urgent", "bulk", "urgent", "bulk", "urgent"],
        "each freed slot goes to the next route in turn: urgent waits for one bulk job, not 996"
    );
    // With urgent idle, bulk takes every slot again.
    for t in running.drain(..) {
        s.finished(t, true, &mut out);
    }
    out.clear();
    s.dispatch(&mut out);
    let next = started_named(&out);
    assert_eq!(next.len(), 4);
    assert!(next.iter().all(|(r, _)| *r == "bulk"));
}

/// Within one route, jobs coming back (a retry tier, a delay bucket) and
/// new jobs take turns: a second's worth of due delayed jobs does not
/// queue a job due now behind all of them, and the route's turn against
/// other routes stays one.
#[test]
fn a_routes_jobs_coming_back_take_turns_with_its_new_jobs() {
    let mut s = Scheduler::new(limits(2, 10_000)).with_turns(two_routes());
    let mut out = Vec::new();
    let tps: Vec<Tp> = ["bulk", "bulk.retry.1s", "urgent"]
        .iter()
        .map(|t| (t.to_string(), 0))
        .collect();
    s.assign(&tps, &mut out);
    for o in 0..100 {
        s.record(named("bulk.retry.1s", "bulk", o), 0, &mut out);
    }
    s.record(named("bulk", "bulk", 0), 0, &mut out);
    out.clear();
    s.dispatch(&mut out);
    let mut first: Vec<(String, i64)> = started_named(&out)
        .iter()
        .map(|(_, t)| (s_topic(&s, t), t.offset))
        .collect();
    first.sort();
    assert_eq!(
        first,
        vec![("bulk".to_string(), 0), ("bulk.retry.1s".to_string(), 0)],
        "the new job starts beside the first retry, not after 100 of them"
    );
    // Another route still gets every other slot: bulk's two queues share
    // one turn.
    for o in 1..4 {
        s.record(named("bulk", "bulk", o), 0, &mut out);
    }
    for o in 0..2 {
        s.record(named("urgent", "urgent", o), 0, &mut out);
    }
    let mut running: Vec<Ticket> = started_named(&out).into_iter().map(|(_, t)| t).collect();
    let mut order = Vec::new();
    for _ in 0..4 {
        out.clear();
        s.finished(running.remove(0), true, &mut out);
        s.dispatch(&mut out);
        for (route, t) in started_named(&out) {
            order.push(route);
            running.push(t);
        }
    }
    assert_eq!(
        order,
        vec!["bulk", "urgent", "bulk", "urgent"],
        "bulk, with jobs in both of its queues, takes every other slot"
    );
}

/// The topic of a ticket's partition.
fn s_topic<R: Located>(s: &Scheduler<R>, t: &Ticket) -> String {
    s.slots[t.slot]
        .as_ref()
        .map_or_else(String::new, |p| p.tp.0.clone())
}

#[test]
fn a_shared_tier_record_takes_the_turn_of_the_route_it_names() {
    let mut s = Scheduler::new(limits(2, 10_000)).with_turns(two_routes());
    let mut out = Vec::new();
    s.assign(&[("g.retry.1s".to_string(), 0)], &mut out);
    // Bulk's retries ahead of urgent's in the one shared tier partition.
    for o in 0..100 {
        s.record(named("g.retry.1s", "bulk", o), 0, &mut out);
    }
    s.record(named("g.retry.1s", "urgent", 100), 0, &mut out);
    s.record(named("g.retry.1s", "nobody", 101), 0, &mut out);
    out.clear();
    s.dispatch(&mut out);
    let first: Vec<(&str, i64)> = started_named(&out)
        .iter()
        .map(|(r, t)| (*r, t.offset))
        .collect();
    assert_eq!(
        first,
        vec![("bulk", 0), ("urgent", 100)],
        "urgent's retry starts beside bulk's first, not after 100 of them"
    );
    // A record naming no route of the worker waits with the unnamed ones
    // (here: bulk, index 0), in its order.
    assert_eq!(s.ready_len(), 100);
}

proptest! {
    /// However the records of three routes of one level interleave, the
    /// free slots are shared out turn by turn: a route with jobs still
    /// ready never got more than one job fewer than any other route.
    #[test]
    fn routes_of_one_level_share_free_slots_turn_by_turn(
        order in proptest::collection::vec(0usize..3, 1..150),
        concurrency in 1usize..40,
    ) {
        const TOPICS: [&str; 3] = ["r0", "r1", "r2"];
        let turns = Turns {
            own: TOPICS.iter().enumerate().map(|(i, t)| (t.to_string(), i as u16)).collect(),
            shared: HashSet::new(),
            back: HashSet::new(),
        };
        let mut s = Scheduler::new(limits(concurrency, 10_000)).with_turns(turns);
        let mut out = Vec::new();
        let tps: Vec<Tp> = TOPICS.iter().map(|t| (t.to_string(), 0)).collect();
        s.assign(&tps, &mut out);
        let mut offsets = [0i64; 3];
        for r in &order {
            s.record(named(TOPICS[*r], TOPICS[*r], offsets[*r]), 0, &mut out);
            offsets[*r] += 1;
        }
        out.clear();
        s.dispatch(&mut out);
        let mut got = [0i64; 3];
        for (route, _) in started_named(&out) {
            let i = TOPICS.iter().position(|t| *t == route).unwrap_or(0);
            got[i] += 1;
        }
        let total: i64 = offsets.iter().sum();
        prop_assert_eq!(got.iter().sum::<i64>(), total.min(concurrency as i64));
        for i in 0..3 {
            if got[i] < offsets[i] {
                for j in 0..3 {
                    prop_assert!(got[i] + 1 >= got[j], "route {} got {:?} of {:?}", i, got, offsets);
                }
            }
        }
    }
}

/// Found by `cargo mutants` over `commits.rs`: no test noticed `committed`
/// or `commit_failed` doing nothing.
#[test]
fn a_sent_commit_is_not_sent_again_until_it_failed() {
    let mut s = Scheduler::new(limits(8, 100));
    let mut out = Vec::new();
    s.assign(&[tp(0)], &mut out);
    s.record(rec(0, 0), 0, &mut out);
    s.dispatch(&mut out);
    let t = runs(&out);
    out.clear();
    s.finished(t[0], true, &mut out);
    out.clear();
    s.commit_all(&mut out);
    assert!(matches!(&out[..], [Action::Commit(c)] if c == &vec![(tp(0), 1)]));
    s.committed(&[(tp(0), 1)]);
    out.clear();
    s.commit_all(&mut out);
    assert!(out.is_empty(), "sent once: {out:?}");
    s.commit_failed();
    s.commit_all(&mut out);
    assert!(
        matches!(&out[..], [Action::Commit(c)] if c == &vec![(tp(0), 1)]),
        "a failed commit is sent again: {out:?}"
    );
}

/// Found by `cargo mutants` over `commits.rs`: the age of what is
/// uncommitted (the `kjob_oldest_pending` gauge) was not checked.
#[test]
fn the_oldest_pending_timestamp_is_the_smallest_of_the_unfinished() {
    let mut s = Scheduler::new(limits(8, 100));
    let mut out = Vec::new();
    s.assign(&[tp(0)], &mut out);
    for (offset, ts) in [(0, 500), (1, 300), (2, 900)] {
        let mut r = rec(offset, offset as u64);
        r.timestamp_ms = Some(ts);
        s.record(r, 0, &mut out);
    }
    let oldest = s.oldest_pending();
    assert_eq!(oldest.len(), 1, "one topic: {oldest:?}");
    assert_eq!(oldest.get("t"), Some(&Some(300)));
}
