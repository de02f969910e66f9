//! `build()`'s route table: every registered handler turned into a route
//! for its main topic, its tiers and delay topics, shared where asked.

use crate::codec::SchemaSource;
use crate::error::Error;
use crate::error::Result;
use crate::telemetry::metrics::WorkerGauges;
use crate::worker::builder::{Registration, WorkerBuilder};
use crate::worker::handler::route::HandlerShared;
use crate::worker::handler::watchdog;
use crate::worker::state::OrderingMode;
use crate::worker::state::RouteEntry;
use crate::worker::state::TopicRole;
use crate::worker::Priority;
use std::collections::HashMap;
use std::sync::Arc;

impl WorkerBuilder {
    /// Turns the registrations into routes decoding through `schemas`: the
    /// registry for a worker, an in-memory store for the test harness. One
    /// code path, so both route, classify and retry alike.
    pub(crate) fn build_routes(&self, schemas: Arc<dyn SchemaSource>) -> Result<Routes> {
        if self.routes.is_empty() {
            return Err(Error::NoHandlers);
        }
        let mut table = Table {
            entries: HashMap::new(),
            shared: Default::default(),
            mains: Vec::new(),
            states: Arc::new(self.states.clone()),
            watchdog: Arc::new(watchdog::Watchdog::new(self.slow_attempt_warning)),
            gauges: Arc::new(WorkerGauges::default()),
        };
        for registration in &self.routes {
            self.add_route(&mut table, registration, &schemas)?;
        }
        table.add_shared()?;
        self.check_named_routes(&table.mains)?;
        Ok(Routes {
            entries: table.entries,
            mains: table.mains,
            watchdog: table.watchdog,
            gauges: table.gauges,
        })
    }

    /// One registration's entries: its main topic, its tiers and, with
    /// delayed jobs, its delay topics; those in shared topics wait in
    /// `table.shared` for [`Table::add_shared`].
    fn add_route(
        &self,
        table: &mut Table,
        registration: &Registration,
        schemas: &Arc<dyn SchemaSource>,
    ) -> Result<()> {
        let Registration { topic, make, needs } = registration;
        let states = table.states.clone();
        if let Some((_, name)) = needs.iter().find(|(id, _)| !states.contains(*id)) {
            return Err(Error::MissingState {
                topic: topic.clone(),
                state: name,
            });
        }
        if table.entries.contains_key(topic) {
            return Err(Error::DuplicateTopic {
                topic: topic.clone(),
            });
        }
        let retry = self
            .retry_overrides
            .get(topic)
            .unwrap_or(&self.retry)
            .clone();
        retry.validate().map_err(|reason| Error::RetryPolicy {
            topic: topic.clone(),
            reason,
        })?;
        let retry = Arc::new(retry);
        let priority = self.priorities.get(topic).copied().unwrap_or_default();
        let delays = self.delayed_jobs || self.delayed_routes.contains(topic);
        let fair: Option<Arc<str>> = self.fair.get(topic).map(|f| Arc::from(f.header.as_str()));
        let mut layers = self.layers.clone();
        layers.extend(self.route_layers.get(topic).into_iter().flatten().cloned());
        let route = make(
            schemas.clone(),
            self.handler_timeout,
            states.clone(),
            &layers,
            HandlerShared {
                watchdog: table.watchdog.clone(),
                gauges: table.gauges.clone(),
            },
        )?;
        let shares = self
            .shared_tiers
            .as_ref()
            .filter(|_| !self.strict.contains(topic) && !self.fair.contains_key(topic));
        let tiers_at: Arc<str> = match shares {
            Some(t) => Arc::from(t.namespace_for(&self.settings.group)),
            None => Arc::from(topic.as_str()),
        };
        let shares_delays = shares.is_some_and(|t| t.delays) && delays;
        let delays_at: Arc<str> = match shares_delays {
            true => tiers_at.clone(),
            false => Arc::from(topic.as_str()),
        };
        let entry = RouteEntry {
            handler: route,
            main: topic.clone(),
            role: TopicRole::Main,
            retry,
            priority,
            delays,
            fair,
            tiers_at,
            delays_at,
            sharers: None,
        };
        for (i, tier) in entry
            .retry
            .tier_topics(&entry.tiers_at)
            .into_iter()
            .enumerate()
        {
            let role = TopicRole::Tier(i);
            table.add_side(
                tier,
                RouteEntry {
                    role,
                    ..entry.clone()
                },
                shares.is_some(),
            )?;
        }
        if delays {
            for (i, delay) in crate::delay::delay_topics(&entry.delays_at)
                .into_iter()
                .enumerate()
            {
                let role = TopicRole::Delay(i);
                table.add_side(
                    delay,
                    RouteEntry {
                        role,
                        ..entry.clone()
                    },
                    shares_delays,
                )?;
            }
        }
        if table.entries.insert(topic.clone(), entry).is_some() {
            return Err(Error::DuplicateTopic {
                topic: topic.clone(),
            });
        }
        table.mains.push(topic.clone());
        Ok(())
    }

    /// Every setting that names a route names one this worker has, and
    /// per-route settings that exclude each other are not both set.
    fn check_named_routes(&self, mains: &[String]) -> Result<()> {
        if let Some(unknown) = self.route_layers.keys().find(|t| !mains.contains(t)) {
            return Err(Error::NoSuchRoute {
                topic: unknown.clone(),
                setting: "layer_for",
            });
        }
        if let Some(unknown) = self.delayed_routes.iter().find(|t| !mains.contains(t)) {
            return Err(Error::NoSuchRoute {
                topic: unknown.clone(),
                setting: "delayed_jobs_on",
            });
        }
        if let Some(unknown) = self.strict.iter().find(|t| !mains.contains(t)) {
            return Err(Error::NoSuchRoute {
                topic: unknown.clone(),
                setting: "strict_order",
            });
        }
        if let Some(topic) = self.strict.iter().next() {
            if self.settings.ordering == OrderingMode::Unordered {
                return Err(Error::InvalidSetting {
                    name: "ordering".into(),
                    value: "OrderingMode::Unordered".into(),
                    reason: format!(
                        "strict_order(\"{topic}\") keeps per-key order across retries, which \
                         unordered dispatch breaks before any retry; use OrderingMode::PerKey \
                         (the default) or PerPartition, or drop strict_order"
                    ),
                });
            }
        }
        if let Some(unknown) = self.fair.keys().find(|t| !mains.contains(t)) {
            return Err(Error::NoSuchRoute {
                topic: unknown.clone(),
                setting: "fair",
            });
        }
        if let Some(unknown) = self.debounce.keys().find(|t| !mains.contains(t)) {
            return Err(Error::NoSuchRoute {
                topic: unknown.clone(),
                setting: "debounce",
            });
        }
        if let Some(topic) = self.debounce.keys().find(|t| self.strict.contains(*t)) {
            return Err(Error::InvalidSetting {
                name: "debounce".into(),
                value: topic.clone(),
                reason: format!(
                    "strict_order(\"{topic}\") runs every job of a key in order, and debounce skips \
                     all but the newest: choose one for this route"
                ),
            });
        }
        if let Some((topic, _)) = self.debounce.iter().find(|(_, w)| w.is_zero()) {
            return Err(Error::InvalidSetting {
                name: "debounce".into(),
                value: format!("{topic}: 0s"),
                reason: "a debounce window must be longer than zero: the jobs of a key written within it of each other are folded into the newest".into(),
            });
        }
        if let Some(unknown) = self.priorities.keys().find(|t| !mains.contains(t)) {
            return Err(Error::NoSuchRoute {
                topic: unknown.clone(),
                setting: "priority",
            });
        }
        if let Some(unknown) = self.retry_overrides.keys().find(|t| !mains.contains(t)) {
            return Err(Error::RetryPolicy {
                topic: unknown.clone(),
                reason: crate::retry::RetryPolicyError::NoSuchRoute,
            });
        }
        Ok(())
    }
}

/// The route table while `build_routes` fills it.
struct Table {
    entries: HashMap<String, RouteEntry>,
    /// Shared tier topic -> main topic -> that route's entry for it.
    shared: std::collections::BTreeMap<String, rustc_hash::FxHashMap<String, RouteEntry>>,
    mains: Vec<String>,
    states: Arc<crate::worker::handler::StateMap>,
    watchdog: Arc<watchdog::Watchdog>,
    gauges: Arc<WorkerGauges>,
}

impl Table {
    /// A retry tier's or delay topic's entry: among a shared topic's
    /// sharers, or the route's own.
    fn add_side(&mut self, topic: String, entry: RouteEntry, shared: bool) -> Result<()> {
        if shared {
            self.shared
                .entry(topic)
                .or_default()
                .insert(entry.main.clone(), entry);
        } else if self.entries.insert(topic.clone(), entry).is_some() {
            return Err(Error::DuplicateTopic { topic });
        }
        Ok(())
    }

    /// A shared topic's own entry stands for all its routes where the
    /// topic is what counts (subscription, creation, holds, priority);
    /// each record runs under its route's entry (RouteEntry::for_record).
    /// It is read at its routes' priority when they all have the same,
    /// else at Normal: a priority is a partition's, not a record's, so a
    /// Low route's retry storm in a tier read at High would compete with
    /// the High routes' main topics, the outage spreading to the work
    /// the priorities protect.
    fn add_shared(&mut self) -> Result<()> {
        for (tier, sharers) in std::mem::take(&mut self.shared) {
            let Some(first) = sharers.values().min_by(|a, b| a.main.cmp(&b.main)).cloned() else {
                continue;
            };
            let priority = match first.priority {
                p if sharers.values().all(|e| e.priority == p) => p,
                _ => Priority::Normal,
            };
            let entry = RouteEntry {
                priority,
                sharers: Some(Arc::new(sharers)),
                ..first
            };
            if self.entries.insert(tier.clone(), entry).is_some() {
                return Err(Error::DuplicateTopic { topic: tier });
            }
        }
        Ok(())
    }
}

/// Routes by topic (main topics and their tiers).
pub(crate) struct Routes {
    pub entries: HashMap<String, RouteEntry>,
    pub mains: Vec<String>,
    /// The handlers that run for long, across routes.
    pub watchdog: Arc<watchdog::Watchdog>,
    /// What the routes' waits count (registry, breakers), for `/metrics`.
    pub gauges: Arc<WorkerGauges>,
}
