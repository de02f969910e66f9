//! The counts a worker's routes and layers update while they run, and
//! that its `/metrics` reads: the jobs waiting for the registry, the
//! breakers its jobs went through, the records whose reader drops fields.
//! Per worker, not process-global: two workers in one process each show
//! their own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// What a downstream guard (a circuit breaker) shows on `/metrics`.
pub(crate) trait GuardGauge: Send + Sync {
    /// The guard's name, its state (`closed`, `half_open`, `open`) and the
    /// jobs it holds; `None` once the guard is gone.
    fn read(&self) -> Option<(String, &'static str, i64)>;
    /// Whether `other` is the same guard (clones share state).
    fn same(&self, other: &dyn GuardGauge) -> bool;
    /// An identity for [`GuardGauge::same`].
    fn id(&self) -> usize;
}

/// Per-worker counts that layers and routes update while they wait: the
/// jobs waiting for the registry, and the breakers this worker's jobs went
/// through. Process-global counters would show every worker of a process
/// the sum of all of them.
#[derive(Default)]
pub(crate) struct WorkerGauges {
    /// Jobs waiting for the schema registry to serve their writer schema.
    pub(crate) registry_waiting: AtomicI64,
    guards: Mutex<Vec<Box<dyn GuardGauge>>>,
    /// Records decoded by a reader that drops fields their writer carries,
    /// per (contract, writer's contract version): `kjob_fields_dropped_total`.
    dropped: Mutex<HashMap<(&'static str, Option<u32>), u64>>,
    /// The (contract, writer id) pairs already warned about (one warning
    /// per writer id and route contract).
    dropped_warned: Mutex<std::collections::HashSet<(&'static str, u32)>>,
}

impl WorkerGauges {
    /// Shows `guard` on this worker's `/metrics` from now on.
    pub(crate) fn note_guard(&self, guard: Box<dyn GuardGauge>) {
        let mut guards = self.guards.lock().unwrap_or_else(PoisonError::into_inner);
        if !guards.iter().any(|g| g.same(guard.as_ref())) {
            guards.push(guard);
        }
    }

    /// Counts one record of contract `job` whose writer (schema `id`,
    /// contract version `version` from `kjob-version`) carries `fields` the
    /// reader drops, and warns once per writer id naming them: during a
    /// rolling deploy an old worker that reads a new producer's records
    /// loses what the new version added, which nothing else shows.
    pub(crate) fn note_dropped(
        &self,
        job: &'static str,
        version: Option<u32>,
        id: u32,
        fields: &[String],
    ) {
        let first = self
            .dropped_warned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((job, id));
        if first {
            tracing::warn!(
                job, writer_id = id, writer_version = %shown_version(version), fields = %fields.join(", "),
                "this worker's reader drops fields the writer of these records carries: it handles them without those fields; deploy the workers before the producers that add fields (docs: evolution)"
            );
        }
        *self
            .dropped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((job, version))
            .or_default() += 1;
    }

    pub(super) fn dropped(&self) -> Vec<(&'static str, String, u64)> {
        self.dropped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|((job, version), n)| (*job, shown_version(*version), *n))
            .collect()
    }

    pub(super) fn guards(&self) -> Vec<(String, &'static str, i64)> {
        self.guards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(|g| g.read())
            .collect()
    }
}

/// Counts one job in [`WorkerGauges::registry_waiting`] for as long as it
/// lives, however the wait ends (the registry answers, a revoke, a dropped
/// attempt).
pub(crate) struct RegistryWait(Arc<WorkerGauges>);

impl RegistryWait {
    pub(crate) fn begin(gauges: &Arc<WorkerGauges>) -> Self {
        gauges.registry_waiting.fetch_add(1, Ordering::Relaxed);
        RegistryWait(gauges.clone())
    }
}

impl Drop for RegistryWait {
    fn drop(&mut self) {
        self.0.registry_waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A writer's contract version as the metric's label and the warning show
/// it: the number, or `unknown` for a record without `kjob-version`.
fn shown_version(version: Option<u32>) -> String {
    version.map_or_else(|| "unknown".to_string(), |v| v.to_string())
}
