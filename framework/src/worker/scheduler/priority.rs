//! Priority lanes: several routes on one worker, the urgent ones served
//! first.
//!
//! Give each kind of work its own topic (`mail.critical`, `mail.bulk`) and
//! say how urgent each is with [`crate::WorkerBuilder::priority`]. The
//! scheduler keeps one ready queue per level and hands free concurrency
//! slots to the most urgent level first; while a more urgent level is
//! active, the less urgent ones together keep at most three quarters of the
//! slots, so a password-reset mail never waits behind a newsletter of
//! 200 000. Nothing is paused for it and polling never stops: bulk work goes
//! on at its share and takes every slot again a second after the urgent
//! work went quiet. A route's retry tiers have its priority; a tier or
//! delay bucket shared by routes of different priorities has `Normal`.

/// How urgent a route's jobs are, relative to the other routes of the same
/// worker. The default is [`Priority::Normal`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Priority {
    /// Served before everything else (password resets, payment captures).
    High,
    /// The default.
    #[default]
    Normal,
    /// Served with what the others leave (newsletters, re-indexing).
    Low,
}

impl Priority {
    /// How many levels there are.
    pub(crate) const LEVELS: usize = 3;

    /// The scheduler's index of the level: 0 is the most urgent.
    pub(crate) fn level(self) -> usize {
        match self {
            Self::High => 0,
            Self::Normal => 1,
            Self::Low => 2,
        }
    }

    /// The name used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::High => "high",
            Self::Normal => "normal",
            Self::Low => "low",
        }
    }

    /// The priority at scheduler level `level`.
    pub(crate) fn at_level(level: usize) -> Self {
        match level {
            0 => Self::High,
            1 => Self::Normal,
            _ => Self::Low,
        }
    }
}
