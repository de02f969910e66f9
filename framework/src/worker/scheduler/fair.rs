//! Fair share among the tenants of a route (see
//! [`Fairness`](crate::Fairness)): which ready job of a fair route gets the
//! next free slot.
//!
//! A fair route's ready jobs (lane heads: a key's later jobs still wait
//! behind their lane's head, so per-key order is untouched) are kept per
//! tenant. The route keeps its place in its priority level's queue as one
//! token per ready job, exactly as its jobs would have; when a token's turn
//! comes, the job taken is the head of the tenant with the fewest running
//! jobs for its weight (running / weight, ties to the tenant served longest
//! ago), skipping tenants at their cap. Under contention, each tenant with
//! work ready therefore runs about `concurrency × weight / Σ weights` jobs
//! at once; a tenant alone on the route gets every slot the route gets.
//! A parked job (waiting for a downstream, holding no slot) is not shown
//! as running but still counts for its tenant's share and cap; once it may
//! go on it takes a slot in the order parked jobs ask, ahead of every ready
//! job, as on any route.

use std::collections::{HashMap, VecDeque};

use rustc_hash::FxHashMap;

use crate::worker::scheduler::types::Job;

/// A fair route's settings, as the scheduler needs them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FairSpec {
    /// The route (its main topic), as metrics name it.
    pub(crate) route: String,
    /// The header naming a record's tenant (`kjob-tenant` by default).
    pub(crate) header: String,
    /// Weights by tenant; others weigh 1.
    pub(crate) weights: HashMap<String, u32>,
    /// The most jobs of one tenant running at once, if capped.
    pub(crate) cap: Option<usize>,
}

/// One tenant of a fair route.
pub(super) struct Tenant<R> {
    pub(super) name: Box<str>,
    ready: VecDeque<Job<R>>,
    /// Jobs holding a slot now (what the gauges show).
    pub(super) running: usize,
    /// Jobs picked and not finished, parked ones included: what the share
    /// and the cap count, so a job waiting for a downstream keeps its
    /// tenant's place (and a cap holds when parked jobs come back).
    inflight: usize,
    weight: u64,
    /// When it was last served (the route's serve count then).
    last: u64,
}

/// The ready jobs of one fair route, by tenant.
pub(super) struct FairRoute<R> {
    spec: FairSpec,
    names: FxHashMap<Box<str>, u32>,
    pub(super) tenants: Vec<Tenant<R>>,
    served: u64,
    ready: usize,
}

impl<R> FairRoute<R> {
    pub(super) fn new(spec: FairSpec) -> Self {
        Self {
            spec,
            names: FxHashMap::default(),
            tenants: Vec::new(),
            served: 0,
            ready: 0,
        }
    }

    /// The header naming the tenant.
    pub(super) fn header(&self) -> &str {
        &self.spec.header
    }

    /// The route's main topic.
    pub(super) fn route(&self) -> &str {
        &self.spec.route
    }

    /// The tenant called `name` (records without the header are the
    /// tenant `""`).
    pub(super) fn intern(&mut self, name: &str) -> u32 {
        if let Some(t) = self.names.get(name) {
            return *t;
        }
        let t = self.tenants.len() as u32;
        let weight = self.spec.weights.get(name).copied().unwrap_or(1).max(1);
        self.names.insert(name.into(), t);
        self.tenants.push(Tenant {
            name: name.into(),
            ready: VecDeque::new(),
            running: 0,
            inflight: 0,
            weight: u64::from(weight),
            last: 0,
        });
        t
    }

    pub(super) fn push(&mut self, tenant: u32, job: Job<R>) {
        if let Some(t) = self.tenants.get_mut(tenant as usize) {
            t.ready.push_back(job);
            self.ready += 1;
        }
    }

    /// Ready jobs over every tenant.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.ready
    }

    /// The next job by fair share, counted as running; `None` when every
    /// tenant with a ready job is at its cap.
    pub(super) fn pick(&mut self) -> Option<Job<R>> {
        let cap = self.spec.cap.unwrap_or(usize::MAX);
        let mut best: Option<usize> = None;
        for (i, t) in self.tenants.iter().enumerate() {
            if t.ready.is_empty() || t.inflight >= cap {
                continue;
            }
            best = match best {
                None => Some(i),
                Some(b) => {
                    let o = &self.tenants[b];
                    // in flight / weight, compared without division.
                    let (mine, theirs) =
                        (t.inflight as u64 * o.weight, o.inflight as u64 * t.weight);
                    if mine < theirs || (mine == theirs && t.last < o.last) {
                        Some(i)
                    } else {
                        Some(b)
                    }
                }
            };
        }
        let t = &mut self.tenants[best?];
        let job = t.ready.pop_front()?;
        t.running += 1;
        t.inflight += 1;
        self.served += 1;
        t.last = self.served;
        self.ready -= 1;
        Some(job)
    }

    /// A job of `tenant` gave its slot back while it waits.
    pub(super) fn parked(&mut self, tenant: u32) {
        if let Some(t) = self.tenants.get_mut(tenant as usize) {
            t.running = t.running.saturating_sub(1);
        }
    }

    /// A parked job of `tenant` holds a slot again.
    pub(super) fn resumed(&mut self, tenant: u32) {
        if let Some(t) = self.tenants.get_mut(tenant as usize) {
            t.running += 1;
        }
    }

    /// A job of `tenant` picked earlier finished or was released;
    /// `holding` if it held a slot then (it was not parked).
    pub(super) fn finished(&mut self, tenant: u32, holding: bool) {
        if let Some(t) = self.tenants.get_mut(tenant as usize) {
            t.inflight = t.inflight.saturating_sub(1);
            if holding {
                t.running = t.running.saturating_sub(1);
            }
        }
    }

    /// Keeps the ready jobs `keep` accepts; answers how many went.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Job<R>) -> bool) -> usize {
        let before = self.ready;
        for t in &mut self.tenants {
            t.ready.retain(&mut keep);
        }
        self.ready = self.tenants.iter().map(|t| t.ready.len()).sum();
        before - self.ready
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Job<R>> {
        self.tenants.iter().flat_map(|t| t.ready.iter())
    }

    pub(super) fn clear(&mut self) {
        for t in &mut self.tenants {
            t.ready.clear();
        }
        self.ready = 0;
    }

    /// `(tenant, ready, running)` of every tenant with work.
    pub(super) fn load(&self) -> Vec<(&str, usize, usize)> {
        self.tenants
            .iter()
            .filter(|t| !t.ready.is_empty() || t.inflight > 0)
            .map(|t| (&*t.name, t.ready.len(), t.running))
            .collect()
    }
}
