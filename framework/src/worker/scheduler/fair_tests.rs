//! Fair share among a route's tenants: the pick, and the scheduler with a
//! fair route (weights, caps, a tenant alone, per-key order).

use std::collections::HashMap;

use proptest::prelude::*;

use crate::worker::scheduler::fair::{FairRoute, FairSpec};
use crate::worker::scheduler::*;

/// A record of tenant `.1` on topic "t", partition 0.
struct Tenanted(i64, &'static str);

impl Located for Tenanted {
    fn topic(&self) -> &str {
        "t"
    }
    fn partition(&self) -> i32 {
        0
    }
    fn header(&self, name: &str) -> Option<&str> {
        (name == "kjob-tenant" && !self.1.is_empty()).then_some(self.1)
    }
}

fn spec(weights: &[(&str, u32)], cap: Option<usize>) -> FairSpec {
    FairSpec {
        route: "t".into(),
        header: "kjob-tenant".into(),
        weights: weights
            .iter()
            .map(|(t, w)| ((*t).to_string(), *w))
            .collect(),
        cap,
    }
}

fn fair_scheduler(concurrency: usize, spec: FairSpec) -> Scheduler<Tenanted> {
    let mut s = Scheduler::new(Limits {
        concurrency,
        max_in_flight: 100_000,
        commit_interval_ms: 0,
    })
    .with_fairness(vec![(vec!["t".to_string()], spec)]);
    let mut out = Vec::new();
    s.assign(&[("t".to_string(), 0)], &mut out);
    s
}

/// Feeds `n` records of `tenant` (one key each, so every one is ready).
fn feed(s: &mut Scheduler<Tenanted>, from: i64, n: i64, tenant: &'static str) {
    let mut out = Vec::new();
    for o in from..from + n {
        s.record(
            Incoming {
                offset: o,
                lane: LaneKey::Offset(o),
                timestamp_ms: None,
                due_ms: None,
                foreign: false,
                item: Tenanted(o, tenant),
            },
            0,
            &mut out,
        );
    }
}

fn dispatch(s: &mut Scheduler<Tenanted>) -> Vec<(&'static str, Ticket)> {
    let mut out = Vec::new();
    s.dispatch(&mut out);
    out.into_iter()
        .flat_map(|a| match a {
            Action::Run(jobs) => jobs.into_iter().map(|j| (j.item.1, j.ticket)).collect(),
            _ => vec![],
        })
        .collect()
}

fn per_tenant(started: &[(&'static str, Ticket)]) -> HashMap<&'static str, usize> {
    let mut m = HashMap::new();
    for (t, _) in started {
        *m.entry(*t).or_default() += 1;
    }
    m
}

#[test]
fn a_flood_shares_the_slots_with_a_late_tenant() {
    let mut s = fair_scheduler(8, spec(&[], None));
    // A's flood first, B's few jobs behind it in the log.
    feed(&mut s, 0, 1_000, "a");
    feed(&mut s, 1_000, 10, "b");
    let first = dispatch(&mut s);
    assert_eq!(per_tenant(&first), HashMap::from([("a", 4), ("b", 4)]));
    // A finished slot goes to the tenant with fewer running: B's share
    // holds while it has work, then A takes everything.
    let mut out = Vec::new();
    let (_, a_ticket) = first
        .iter()
        .find(|(t, _)| *t == "a")
        .copied()
        .unwrap_or(first[0]);
    s.finished(a_ticket, true, &mut out);
    assert_eq!(per_tenant(&dispatch(&mut s)), HashMap::from([("a", 1)]));
    let (_, b_ticket) = first
        .iter()
        .find(|(t, _)| *t == "b")
        .copied()
        .unwrap_or(first[0]);
    s.finished(b_ticket, true, &mut out);
    assert_eq!(per_tenant(&dispatch(&mut s)), HashMap::from([("b", 1)]));
}

#[test]
fn weights_divide_the_slots_in_proportion() {
    let mut s = fair_scheduler(8, spec(&[("a", 3)], None));
    feed(&mut s, 0, 100, "a");
    feed(&mut s, 100, 100, "b");
    assert_eq!(
        per_tenant(&dispatch(&mut s)),
        HashMap::from([("a", 6), ("b", 2)])
    );
}

#[test]
fn a_tenant_alone_gets_every_slot_and_a_cap_bounds_it() {
    let mut s = fair_scheduler(8, spec(&[], None));
    feed(&mut s, 0, 100, "a");
    assert_eq!(per_tenant(&dispatch(&mut s)), HashMap::from([("a", 8)]));
    // Capped at 3: the rest of the slots stay free for others.
    let mut s = fair_scheduler(8, spec(&[], Some(3)));
    feed(&mut s, 0, 100, "a");
    assert_eq!(per_tenant(&dispatch(&mut s)), HashMap::from([("a", 3)]));
    assert_eq!(s.ready_len(), 97, "A's other jobs wait, counted");
    feed(&mut s, 100, 10, "b");
    feed(&mut s, 110, 1, "");
    let next = per_tenant(&dispatch(&mut s));
    assert_eq!(
        next,
        HashMap::from([("b", 3), ("", 1)]),
        "B and the headerless take free slots"
    );
    let load = s.tenants();
    let a = load
        .iter()
        .find(|(_, t, _, _)| t == "a")
        .map(|(route, _, r, n)| (route.as_str(), *r, *n));
    assert_eq!(a, Some(("t", 97, 3)));
}

#[test]
fn a_revoke_drops_a_fair_routes_ready_jobs_and_their_places() {
    let mut s = fair_scheduler(2, spec(&[], None));
    feed(&mut s, 0, 10, "a");
    feed(&mut s, 10, 10, "b");
    let started = dispatch(&mut s);
    assert_eq!(started.len(), 2);
    s.revoke(&[("t".to_string(), 0)]);
    assert_eq!(s.ready_len(), 0);
    let mut out = Vec::new();
    for (_, t) in started {
        s.finished(t, true, &mut out);
    }
    assert!(dispatch(&mut s).is_empty());
    assert_eq!(s.tenants(), Vec::new(), "nothing ready or running");
}

#[test]
fn a_parked_job_does_not_count_among_its_tenants_running() {
    let mut s = fair_scheduler(2, spec(&[], None));
    feed(&mut s, 0, 1, "a");
    let started = dispatch(&mut s);
    let running = |s: &Scheduler<Tenanted>| {
        s.tenants()
            .iter()
            .find(|(_, t, _, _)| t == "a")
            .map_or(0, |(_, _, _, n)| *n)
    };
    assert_eq!(running(&s), 1);
    let t = started[0].1;
    s.park(t);
    assert_eq!(running(&s), 0, "parked: no slot held");
    assert!(s.unpark(t), "a free slot at once");
    assert_eq!(running(&s), 1);
    s.park(t);
    let mut out = Vec::new();
    // Finished while parked (released, say): counted once.
    s.finished(t, true, &mut out);
    assert_eq!(running(&s), 0);
    assert_eq!(s.running(), 0);
}

#[test]
fn a_cap_holds_while_jobs_park_and_come_back() {
    let mut s = fair_scheduler(8, spec(&[], Some(2)));
    feed(&mut s, 0, 20, "a");
    let first = dispatch(&mut s);
    assert_eq!(first.len(), 2);
    // Both park (a cold schema, say): their slots are free, the cap is not.
    for (_, t) in &first {
        s.park(*t);
    }
    assert!(
        dispatch(&mut s).is_empty(),
        "parked jobs still count for the cap"
    );
    for (_, t) in &first {
        assert!(s.unpark(*t));
    }
    let mut out = Vec::new();
    s.finished(first[0].1, true, &mut out);
    assert_eq!(per_tenant(&dispatch(&mut s)), HashMap::from([("a", 1)]));
}

proptest! {
    /// Whatever the pushes, picks and finishes: a pick takes the head of a
    /// tenant with the least running for its weight among those that may
    /// run, never a capped one, and each tenant's jobs in their order.
    #[test]
    fn a_pick_is_the_least_loaded_tenant_by_weight(
        weights in proptest::collection::vec(1u32..5, 1..5),
        cap in proptest::option::of(1usize..4),
        ops in proptest::collection::vec((0u8..3, 0usize..5), 1..300),
    ) {
        let names = ["t0", "t1", "t2", "t3", "t4"];
        let spec = FairSpec {
            route: "t".into(),
            header: "h".into(),
            weights: weights.iter().enumerate().map(|(i, w)| (names[i].to_string(), *w)).collect(),
            cap,
        };
        let mut f: FairRoute<Tenanted> = FairRoute::new(spec);
        let ids: Vec<u32> = (0..weights.len()).map(|i| f.intern(names[i])).collect();
        let mut next = 0i64;
        let mut pushed: Vec<Vec<i64>> = vec![Vec::new(); weights.len()];
        let mut picked: Vec<Vec<i64>> = vec![Vec::new(); weights.len()];
        let mut running = vec![0usize; weights.len()];
        for (op, who) in ops {
            let who = who % weights.len();
            match op {
                0 => {
                    f.push(ids[who], Job {
                        ticket: Ticket::for_test(next),
                        item: Tenanted(next, names[who]),
                        released: Default::default(),
                    });
                    pushed[who].push(next);
                    next += 1;
                }
                1 => {
                    let ready: Vec<usize> = (0..weights.len())
                        .filter(|i| picked[*i].len() < pushed[*i].len())
                        .filter(|i| cap.is_none_or(|c| running[*i] < c))
                        .collect();
                    match f.pick() {
                        None => prop_assert!(ready.is_empty()),
                        Some(j) => {
                            let t = names.iter().position(|n| *n == j.item.1).unwrap_or(0);
                            prop_assert!(ready.contains(&t), "a capped or empty tenant was picked");
                            for o in &ready {
                                // running[t]/w[t] <= running[o]/w[o]
                                prop_assert!(
                                    running[t] as u64 * u64::from(weights[*o])
                                        <= running[*o] as u64 * u64::from(weights[t])
                                );
                            }
                            prop_assert_eq!(Some(&j.item.0), pushed[t].get(picked[t].len()));
                            picked[t].push(j.item.0);
                            running[t] += 1;
                        }
                    }
                }
                _ => {
                    if running[who] > 0 {
                        f.finished(ids[who], true);
                        running[who] -= 1;
                    }
                }
            }
            let left: usize = (0..weights.len()).map(|i| pushed[i].len() - picked[i].len()).sum();
            prop_assert_eq!(f.len(), left);
        }
    }

    /// With a fair route, a key's jobs still start in offset order, each
    /// once, and every record finishes.
    #[test]
    fn a_fair_route_keeps_per_key_order_and_runs_everything(
        records in proptest::collection::vec((0u64..6, 0usize..4), 1..120),
        concurrency in 1usize..6,
        finish_order in proptest::collection::vec(0usize..1000, 0..400),
    ) {
        let tenants = ["a", "b", "c", ""];
        let mut s = fair_scheduler(concurrency, spec(&[("a", 2)], Some(3)));
        let mut out = Vec::new();
        for (o, (key, t)) in records.iter().enumerate() {
            s.record(
                Incoming {
                    offset: o as i64,
                    lane: LaneKey::Key(*key),
                    timestamp_ms: None,
                    due_ms: None,
                    foreign: false,
                    item: Tenanted(o as i64, tenants[*t]),
                },
                0,
                &mut out,
            );
        }
        let mut running: Vec<Ticket> = Vec::new();
        let mut started: Vec<i64> = Vec::new();
        let mut picks = finish_order.into_iter();
        loop {
            for (_, t) in dispatch(&mut s) {
                started.push(t.offset);
                running.push(t);
            }
            if running.is_empty() {
                break;
            }
            let i = picks.next().unwrap_or(0) % running.len();
            let t = running.swap_remove(i);
            s.finished(t, true, &mut out);
        }
        prop_assert_eq!(started.len(), records.len(), "every record ran once");
        for key in 0..6u64 {
            let offsets: Vec<i64> = started
                .iter()
                .copied()
                .filter(|o| records[*o as usize].0 == key)
                .collect();
            let mut sorted = offsets.clone();
            sorted.sort_unstable();
            prop_assert_eq!(offsets, sorted, "key {} out of order", key);
        }
        prop_assert_eq!(s.ready_len(), 0);
    }
}
