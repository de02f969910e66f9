//! Reading past a flood: a simulated consumer (a log, a fetch position,
//! pause and seek) drives a fair route whose buffer is small, and checks
//! what the module promises: everything runs once, per-key order holds,
//! no commit passes an unfinished record, and the tenants behind a flood
//! are read and run early.

use proptest::prelude::*;

use crate::worker::scheduler::fair::FairSpec;
use crate::worker::scheduler::*;

/// A record of tenant `.1`; topic "t", partition 0.
struct Rec(&'static str);

impl Located for Rec {
    fn topic(&self) -> &str {
        "t"
    }
    fn partition(&self) -> i32 {
        0
    }
    fn header(&self, name: &str) -> Option<&str> {
        (name == "kjob-tenant").then_some(self.0)
    }
}

/// A scheduler with one fair route "t" (by `kjob-tenant`), its partition
/// 0 assigned.
fn assigned(concurrency: usize, bound: usize, commit_interval_ms: i64) -> Scheduler<Rec> {
    let mut s = Scheduler::new(Limits {
        concurrency,
        max_in_flight: bound,
        commit_interval_ms,
    })
    .with_fairness(vec![(
        vec!["t".to_string()],
        FairSpec {
            route: "t".into(),
            header: "kjob-tenant".into(),
            ..FairSpec::default()
        },
    )]);
    s.assign(&[("t".to_string(), 0)], &mut Vec::new());
    s
}

/// What a simulated run saw.
struct Run {
    /// Offsets in the order they started.
    started: Vec<i64>,
    /// The most records buffered at once.
    max_buffered: usize,
    /// Seeks done.
    seeks: usize,
    /// Records fetched in all (a record read again counts again).
    fetched: usize,
}

/// Runs `log` (tenant, key) through a fair scheduler with buffer `bound`:
/// fetches `fetch` records a turn unless paused, finishes the `pick`ed
/// running job each turn, applies seeks, and checks every commit.
fn simulate(
    log: &[(&'static str, u64)],
    dues: &[Option<i64>],
    bound: usize,
    concurrency: usize,
    fetch: usize,
    picks: &[usize],
) -> Run {
    let mut s = assigned(concurrency, bound, 1);
    let mut out = Vec::new();
    let (mut pos, mut paused) = (0i64, false);
    let mut running: Vec<Ticket> = Vec::new();
    let mut done = vec![false; log.len()];
    let mut run = Run {
        started: Vec::new(),
        max_buffered: 0,
        seeks: 0,
        fetched: 0,
    };
    let mut now = 0;
    for turn in 0..(log.len() * 40 + 1000) {
        now += 1;
        if !paused {
            for _ in 0..fetch {
                let Some(&(tenant, key)) = log.get(pos as usize) else {
                    break;
                };
                run.fetched += 1;
                s.record(
                    Incoming {
                        offset: pos,
                        lane: LaneKey::Key(key),
                        timestamp_ms: None,
                        due_ms: dues.get(pos as usize).copied().flatten(),
                        foreign: false,
                        item: Rec(tenant),
                    },
                    now,
                    &mut out,
                );
                pos += 1;
            }
        }
        s.dispatch(&mut out);
        if !running.is_empty() {
            let i = picks.get(turn).copied().unwrap_or(0) % running.len();
            let t = running.swap_remove(i);
            done[t.offset as usize] = true;
            s.finished(t, true, &mut out);
            s.dispatch(&mut out);
        }
        s.tick(now, &mut out);
        for a in out.drain(..) {
            match a {
                Action::Run(jobs) => {
                    for j in jobs {
                        run.started.push(j.ticket.offset);
                        running.push(j.ticket);
                    }
                }
                Action::Pause(_) => paused = true,
                Action::Resume(_) => paused = false,
                Action::Seek(_, o) => {
                    run.seeks += 1;
                    pos = o;
                }
                Action::Commit(c) => {
                    for (_, next) in c {
                        let unfinished = done.iter().position(|d| !d).unwrap_or(log.len());
                        assert!(
                            next as usize <= unfinished,
                            "committed {next} with {unfinished} unfinished"
                        );
                    }
                }
                Action::Grant(_) => {}
            }
        }
        if let Some(p) = s.part(&("t".to_string(), 0)) {
            run.max_buffered = run.max_buffered.max(p.buffered());
        }
        if done.iter().all(|d| *d) {
            break;
        }
    }
    run
}

fn assert_per_key_order(log: &[(&'static str, u64)], started: &[i64]) {
    let keys: std::collections::HashSet<u64> = log.iter().map(|r| r.1).collect();
    for key in keys {
        let offsets: Vec<i64> = started
            .iter()
            .copied()
            .filter(|o| log[*o as usize].1 == key)
            .collect();
        let mut sorted = offsets.clone();
        sorted.sort_unstable();
        assert_eq!(offsets, sorted, "key {key} out of order");
    }
}

#[test]
fn the_tenants_behind_a_flood_are_read_past_it_and_run_early() {
    // 2 000 records of tenant a (20 keys), then 10 of tenant b; a buffer
    // of 100 (a tenant may hold 25 of it).
    let mut log: Vec<(&'static str, u64)> = (0..2000).map(|i| ("a", i % 20)).collect();
    log.extend((0..10).map(|i| ("b", 100 + i)));
    let run = simulate(&log, &[], 100, 4, 20, &[]);
    assert_eq!(run.started.len(), log.len(), "everything ran once");
    let mut once = run.started.clone();
    once.sort_unstable();
    once.dedup();
    assert_eq!(once.len(), log.len());
    assert_per_key_order(&log, &run.started);
    let last_b = run
        .started
        .iter()
        .position(|o| *o >= 2000 && *o == 2009)
        .expect("b ran");
    assert!(last_b < 200, "b's last job started as the {last_b}th");
    assert!(run.max_buffered <= 100, "{} buffered", run.max_buffered);
    // Read about twice, not once per round.
    println!("{} fetched, {} seeks", run.fetched, run.seeks);
    assert!(run.fetched < 3 * log.len(), "{} fetched", run.fetched);
    assert!(run.seeks > 0);
}

#[test]
fn a_tenant_alone_runs_everything_in_order_reading_past_its_excess() {
    let log: Vec<(&'static str, u64)> = (0..1000).map(|i| ("a", i % 7)).collect();
    let run = simulate(&log, &[], 40, 3, 17, &[2, 1, 0, 5, 3]);
    assert_eq!(run.started.len(), log.len());
    assert_per_key_order(&log, &run.started);
}

#[test]
fn passed_offsets_past_their_bound_pause_the_partition() {
    let mut p = passing::Passing::new(4);
    let (a, b) = (1, 2);
    // Share 1: the second record of a is passed, and so is every later one.
    assert_eq!(
        p.record(0, None, false, a, LaneKey::Key(0)),
        passing::Verdict::Admit
    );
    p.admitted(a);
    for o in 1..=160 {
        assert_eq!(
            p.record(o, Some(o - 1), false, a, LaneKey::Key(0)),
            passing::Verdict::Pass
        );
    }
    assert!(p.full(4), "160 = 40 × 4 passed");
    // Another tenant's record with a key of no passed record is taken.
    assert_eq!(
        p.record(161, Some(160), false, b, LaneKey::Key(9)),
        passing::Verdict::Admit
    );
    // One with a passed key follows it.
    assert_eq!(
        p.record(162, Some(161), false, b, LaneKey::Key(0)),
        passing::Verdict::Pass
    );
    // a's job finished: read again from 1, and while reading not full.
    p.finished(a);
    assert_eq!(p.reread(Some(162)), Some(1));
    assert!(p.rereading() && !p.full(4));
    assert_eq!(
        p.record(1, Some(162), true, a, LaneKey::Key(0)),
        passing::Verdict::Admit
    );
    p.admitted(a);
    // a is at its share again: forward to where reading had got.
    assert_eq!(
        p.record(2, Some(162), true, a, LaneKey::Key(0)),
        passing::Verdict::SeekForward(163)
    );
    assert!(!p.rereading());
}

#[test]
fn a_record_held_until_due_on_a_reading_past_partition_runs_when_due() {
    // A job enqueued to run a moment later sits on the main topic with its
    // run time: the partition holds just past it, and the kept record is
    // given back when due.
    let mut s = assigned(2, 8, 1_000_000);
    let mut out = Vec::new();
    let held = |due| Incoming {
        offset: 0,
        lane: LaneKey::Key(1),
        timestamp_ms: None,
        due_ms: Some(due),
        foreign: false,
        item: Rec("a"),
    };
    out.clear();
    s.record(held(100), 0, &mut out);
    assert!(
        matches!(&out[..], [Action::Pause(_), Action::Seek(_, 1)]),
        "{out:?}"
    );
    out.clear();
    s.tick(100, &mut out);
    assert!(
        out.iter().any(|a| matches!(a, Action::Seek(_, 1))),
        "{out:?}"
    );
    s.dispatch(&mut out);
    let ran: Vec<i64> = out
        .iter()
        .flat_map(|a| match a {
            Action::Run(jobs) => jobs.iter().map(|j| j.ticket.offset).collect(),
            _ => vec![],
        })
        .collect();
    assert_eq!(ran, [0], "the held record runs once due");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the tenants, keys, run times (a record due later holds
    /// the partition), buffer, fetch size and completion order: every
    /// record runs once, in per-key order, and no commit passes an
    /// unfinished one (checked inside `simulate`).
    #[test]
    fn reading_past_keeps_every_record_once_and_in_key_order(
        records in proptest::collection::vec((0usize..4, 0u64..8, proptest::option::weighted(0.05, 0i64..300)), 1..400),
        bound in 4usize..60,
        concurrency in 1usize..6,
        fetch in 1usize..40,
        picks in proptest::collection::vec(0usize..1000, 0..2000),
    ) {
        let tenants = ["a", "b", "c", ""];
        let log: Vec<(&'static str, u64)> =
            records.iter().map(|(t, k, _)| (tenants[*t], *k)).collect();
        let dues: Vec<Option<i64>> = records.iter().map(|r| r.2).collect();
        let run = simulate(&log, &dues, bound, concurrency, fetch, &picks);
        prop_assert_eq!(run.started.len(), log.len(), "every record ran");
        let mut once = run.started.clone();
        once.sort_unstable();
        once.dedup();
        prop_assert_eq!(once.len(), log.len(), "none twice");
        assert_per_key_order(&log, &run.started);
        // The bound pauses fetching after the batch that reached it (as on
        // every route), so it may be passed by what that batch held.
        prop_assert!(
            run.max_buffered <= bound + fetch,
            "{} buffered of {} + {}", run.max_buffered, bound, fetch
        );
    }
}
