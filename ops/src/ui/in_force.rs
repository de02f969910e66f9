//! The controls in force, as data: what the layout's banner shows on every
//! page and what `controls` keeps up to date. Apart from both, so the
//! layout does not depend on the control pages that use the layout.

use std::collections::BTreeMap;

/// What a control holds.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Held {
    /// A route (its main topic) for the whole group.
    Route(String),
    /// A cron schedule.
    Schedule(String),
}

/// One control in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct InForce {
    /// The group it applies to.
    pub(crate) group: String,
    /// What it holds.
    pub(crate) held: Held,
    /// Who put it in force.
    pub(crate) by: String,
    /// Since when (epoch ms).
    pub(crate) at_ms: i64,
    /// Why.
    pub(crate) reason: String,
}

/// The map behind [`super::AppState::in_force`].
pub(crate) type InForceMap = BTreeMap<String, Vec<InForce>>;
