//! [`Fairness`]: a route's handler slots shared among its tenants.

use std::collections::HashMap;

use crate::worker::scheduler::FairSpec;

/// How a route shares its handler slots among tenants
/// ([`WorkerBuilder::fair`](crate::WorkerBuilder::fair)).
///
/// One shop importing 200 000 products must not make every other shop's
/// jobs of the same type wait behind it. With fairness, under contention
/// the route's slots go to the tenants that have a job ready, in
/// proportion to their weights (1 unless set): each free slot goes to the
/// tenant with the fewest running jobs for its weight. A tenant alone on
/// the route gets all of it, and a key's jobs still run in order (only a
/// key's next job is ever ready). The tenant is the `kjob-tenant` header
/// (the contract's `tenant = ...`, see [`Job::tenant`](crate::Job::tenant))
/// unless [`Fairness::by_header`] names another; records without it are one
/// tenant of their own.
///
/// The share applies to the jobs the worker has fetched, and a fair route
/// reads past a flood to reach them: one tenant may hold at most a quarter
/// of a partition's buffer (`max_in_flight_per_partition`, 5 000 by
/// default); the worker notes the offsets of that tenant's later records
/// instead of holding them, reads on to the other tenants' records behind
/// them, and seeks back for what it passed as the tenant's share drains,
/// in offset order (a passed offset is never committed past, so a crash
/// re-delivers it). The flood is fetched about twice. See the book's
/// fairness chapter, "Reading past a flood", for the bounds and figures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fairness {
    pub(crate) header: String,
    pub(crate) weights: HashMap<String, u32>,
    pub(crate) cap: Option<usize>,
}

impl Fairness {
    /// Fair share by the `kjob-tenant` header, every tenant weighing 1.
    pub fn by_tenant() -> Self {
        Self::by_header(crate::headers::TENANT)
    }

    /// Fair share by the value of another header.
    pub fn by_header(name: &str) -> Self {
        Self {
            header: name.to_string(),
            weights: HashMap::new(),
            cap: None,
        }
    }

    /// `tenant` gets `weight` shares (at least 1) where others get 1.
    pub fn weight(mut self, tenant: &str, weight: u32) -> Self {
        self.weights.insert(tenant.to_string(), weight.max(1));
        self
    }

    /// No tenant runs more than `n` jobs of the route at once (at least 1),
    /// even when others leave slots free.
    pub fn cap(mut self, n: usize) -> Self {
        self.cap = Some(n.max(1));
        self
    }

    pub(crate) fn spec(&self, route: &str) -> FairSpec {
        FairSpec {
            route: route.to_string(),
            header: self.header.clone(),
            weights: self.weights.clone(),
            cap: self.cap,
        }
    }
}

impl Default for Fairness {
    fn default() -> Self {
        Self::by_tenant()
    }
}
