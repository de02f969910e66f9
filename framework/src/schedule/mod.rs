//! Recurring jobs (cron), fired once per tick across the whole fleet, with
//! Kafka as the only coordinator.
//!
//! ```no_run
//! # use kjob::{Job, KafkaConfig, Worker, JobContext, JobError};
//! # use kjob::schedule::{CatchUp, Schedule};
//! # #[derive(serde::Serialize, serde::Deserialize)] struct MakeReport { day: String }
//! # impl Job for MakeReport { const NAME: &'static str = "reports"; const VERSION: u32 = 1;
//! #   const SCHEMA: &'static str = r#"{"type":"record","name":"MakeReport","fields":[{"name":"day","type":"string"}]}"#;
//! #   fn key(&self) -> String { self.day.clone() } }
//! # async fn h(_: MakeReport, _: JobContext) -> Result<(), JobError> { Ok(()) }
//! # fn b() -> kjob::WorkerBuilder {
//! Worker::builder(KafkaConfig::from_env(), "reports")
//!     .handle(h)
//!     // sec min hour day-of-month month day-of-week
//!     .schedule("report", "0 */5 * * * *", || MakeReport { day: "today".into() })
//!     .schedule_with(Schedule::new("nightly", "0 0 3 * * *", || MakeReport { day: "yesterday".into() })
//!         .catch_up(CatchUp::All { max: 10 }))
//! # }
//! ```
//!
//! **Leadership.** Every worker with schedules joins its group's
//! one-partition topic `<group>.schedules` with its ordinary consumer; the
//! member that owns partition 0 is the only one that fires. Kafka's group
//! protocol moves the partition when that member dies (after the session
//! timeout) or leaves (at once), so there is no lease, no lock and no side
//! database.
//!
//! **State.** `<group>.schedules.state` is compacted, keyed by schedule
//! name: the last tick settled (fired, or skipped by the catch-up policy)
//! and the last tick fired. A new leader reads it to the end before firing,
//! so it carries on where the previous one stopped.
//!
//! **Ids.** The job of tick `T` of schedule `name` has id
//! `cron:<name>:<T as RFC 3339, UTC>`. A leader that dies after enqueueing a
//! tick but before recording it makes its successor fire that tick again:
//! the same id twice, which `PgMarkers` (or any idempotency key) recognises.
//! Ticks are at least once, and exactly once per id.
//!
//! **Catch-up** ([`CatchUp`]): ticks that passed while no leader ran (the
//! fleet was down, or a leader died and the group had not yet moved its
//! partition) are fired all, only the latest, or skipped. A tick is *on
//! time* while it is at most [`ON_TIME`] old; on-time ticks always fire.

mod leader;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use futures::future::BoxFuture;

use crate::error::{Error, Result};
use crate::job::Job;
use crate::producer::{Enqueued, Producer};

pub(crate) use leader::run_schedules;
pub use leader::{
    audit_key, control_key, leader_topic, read_schedule_topic, read_states, state_topic,
    ScheduleAudit, ScheduleControl, ScheduleState, ScheduleTopic,
};

/// How old a tick may be and still count as on time (not missed).
pub const ON_TIME: Duration = Duration::from_secs(2);

/// What a new leader does with ticks that passed while no leader ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CatchUp {
    /// Fire only the most recent missed tick (a report that is late is
    /// still wanted once, not once per missed tick). The default.
    #[default]
    Latest,
    /// Fire every missed tick, oldest first, at most `max` of them (the
    /// most recent `max`); the rest are skipped and logged.
    All {
        /// The most missed ticks fired at once.
        max: usize,
    },
    /// Fire no missed tick; carry on from the next one.
    Skip,
}

impl CatchUp {
    /// The name used in the state topic and by `kjob schedules`.
    pub fn as_str(&self) -> String {
        match self {
            CatchUp::Latest => "latest".into(),
            CatchUp::All { max } => format!("all(max {max})"),
            CatchUp::Skip => "skip".into(),
        }
    }
}

/// Enqueues one tick's job with the given id.
type Fire = Arc<dyn Fn(Producer, String) -> BoxFuture<'static, Result<Enqueued>> + Send + Sync>;

/// One recurring job: a name (unique in the group), a cron expression with
/// seconds (`sec min hour day-of-month month day-of-week [year]`, UTC) and
/// the job it enqueues at each tick.
#[derive(Clone)]
pub struct Schedule {
    pub(crate) name: String,
    pub(crate) expr: String,
    pub(crate) cron: std::result::Result<cron::Schedule, String>,
    pub(crate) catch_up: CatchUp,
    pub(crate) topic: String,
    pub(crate) fire: Fire,
}

impl std::fmt::Debug for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schedule")
            .field("name", &self.name)
            .field("expr", &self.expr)
            .field("catch_up", &self.catch_up)
            .field("topic", &self.topic)
            .finish()
    }
}

impl Schedule {
    /// Enqueues `make()` on `J`'s main topic at every tick of `expr`.
    pub fn new<J: Job>(
        name: impl Into<String>,
        expr: &str,
        make: impl Fn() -> J + Send + Sync + 'static,
    ) -> Self {
        let make = Arc::new(make);
        let topic = J::NAME.to_string();
        let fire_topic = topic.clone();
        Self {
            name: name.into(),
            expr: expr.to_string(),
            cron: parse(expr),
            catch_up: CatchUp::default(),
            topic,
            fire: Self::firing::<J>(make, fire_topic),
        }
    }

    fn firing<J: Job>(make: Arc<dyn Fn() -> J + Send + Sync>, topic: String) -> Fire {
        Arc::new(move |producer: Producer, id: String| {
            let job = make();
            let topic = topic.clone();
            Box::pin(async move { producer.enqueue_with_id_to(&topic, &job, Some(id)).await })
        })
    }

    /// Enqueues on `topic` instead of `J::NAME` (the job type stays `J`).
    pub fn on<J: Job>(mut self, topic: &str, make: impl Fn() -> J + Send + Sync + 'static) -> Self {
        self.topic = topic.to_string();
        self.fire = Self::firing::<J>(Arc::new(make), topic.to_string());
        self
    }

    /// Sets the catch-up policy (default [`CatchUp::Latest`]).
    pub fn catch_up(mut self, policy: CatchUp) -> Self {
        self.catch_up = policy;
        self
    }

    /// The schedule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |reason: String| Error::InvalidSetting {
            name: format!("schedule `{}`", self.name),
            value: self.expr.clone(),
            reason,
        };
        if self.name.is_empty() || self.name.contains(':') {
            return Err(bad("a schedule name must be non-empty and contain no `:` (it is part of the job id cron:<name>:<tick>)".into()));
        }
        if let CatchUp::All { max: 0 } = self.catch_up {
            return Err(bad(
                "CatchUp::All needs max >= 1 (or use CatchUp::Skip)".into()
            ));
        }
        self.cron.as_ref().map(|_| ()).map_err(|e| bad(e.clone()))
    }
}

fn parse(expr: &str) -> std::result::Result<cron::Schedule, String> {
    expr.parse::<cron::Schedule>().map_err(|e| {
        format!("not a cron expression with seconds (`sec min hour day-of-month month day-of-week`, e.g. `0 */5 * * * *`): {e}")
    })
}

/// The first tick of `expr` strictly after `after_ms`, if any.
pub fn next_tick(expr: &str, after_ms: i64) -> Option<i64> {
    let cron = parse(expr).ok()?;
    let after = Utc.timestamp_millis_opt(after_ms).single()?;
    cron.after(&after).next().map(|t| t.timestamp_millis())
}

/// The job id of tick `tick_ms` of schedule `name`.
pub fn tick_id(name: &str, tick_ms: i64) -> String {
    format!("cron:{name}:{}", format_tick(tick_ms))
}

/// The job id of a manual trigger of schedule `name` asked for at
/// `asked_ms`: `cron:<name>:manual:<time>`. It can never equal a tick's id
/// (`manual:` is no time), and a leader that fires it twice (it died before
/// recording it) fires the same id twice, a recognised duplicate.
pub fn manual_id(name: &str, asked_ms: i64) -> String {
    format!("cron:{name}:manual:{}", format_tick(asked_ms))
}

/// A tick as RFC 3339 in UTC, to the second (or millisecond if it has one).
pub fn format_tick(tick_ms: i64) -> String {
    let format = if tick_ms % 1000 == 0 {
        SecondsFormat::Secs
    } else {
        SecondsFormat::Millis
    };
    DateTime::<Utc>::from_timestamp_millis(tick_ms)
        .map(|t| t.to_rfc3339_opts(format, true))
        .unwrap_or_else(|| tick_ms.to_string())
}

/// What to do with the ticks after `settled_ms` up to `now_ms`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Ticks to fire, oldest first.
    pub fire: Vec<i64>,
    /// Missed ticks left out by the policy.
    pub skipped: usize,
    /// The newest tick considered: the state's next "settled" mark.
    pub settled: Option<i64>,
}

/// Longest run of ticks looked at in one plan (a 1-second schedule missed
/// for a day is 86 400). A longer gap is settled a chunk at a time, its
/// ticks counted as skipped, whatever the policy.
const MAX_SCAN: usize = 1_000_000;

/// Plans the ticks of `cron` in `(settled_ms, now_ms]` under `policy`.
pub(crate) fn plan(cron: &cron::Schedule, settled_ms: i64, now_ms: i64, policy: CatchUp) -> Plan {
    let Some(after) = Utc.timestamp_millis_opt(settled_ms).single() else {
        return Plan::default();
    };
    let on_time_from = now_ms - ON_TIME.as_millis() as i64;
    let mut missed: Vec<i64> = Vec::new();
    let mut on_time: Vec<i64> = Vec::new();
    let mut dropped = 0usize;
    let keep = match policy {
        CatchUp::All { max } => max.max(1),
        _ => 1,
    };
    let mut scanned = 0usize;
    let mut last_scanned = None;
    for t in cron.after(&after).take(MAX_SCAN) {
        let ms = t.timestamp_millis();
        if ms > now_ms {
            break;
        }
        scanned += 1;
        last_scanned = Some(ms);
        if ms >= on_time_from {
            on_time.push(ms);
        } else {
            missed.push(ms);
            if missed.len() > keep {
                missed.remove(0);
                dropped += 1;
            }
        }
    }
    if scanned == MAX_SCAN {
        // Not at `now` yet: these are all long missed. Settle them and go
        // on from there next time, firing none of them.
        return Plan {
            fire: Vec::new(),
            skipped: scanned,
            settled: last_scanned,
        };
    }
    let settled = on_time.last().or(missed.last()).copied();
    let (fired_missed, skipped) = match policy {
        CatchUp::Skip => (Vec::new(), dropped + missed.len()),
        CatchUp::Latest | CatchUp::All { .. } => (missed, dropped),
    };
    let mut fire = fired_missed;
    fire.extend(on_time);
    Plan {
        fire,
        skipped,
        settled,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Tick {
        n: i64,
    }

    impl Job for Tick {
        const NAME: &'static str = "ticks";
        const VERSION: u32 = 1;
        const SCHEMA: &'static str =
            r#"{"type":"record","name":"Tick","fields":[{"name":"n","type":"long"}]}"#;
        fn key(&self) -> String {
            self.n.to_string()
        }
    }

    fn every_second() -> cron::Schedule {
        parse("* * * * * *").unwrap_or_else(|e| panic!("{e}"))
    }

    const T0: i64 = 1_700_000_000_000;

    #[test]
    fn on_time_ticks_fire() {
        let p = plan(&every_second(), T0, T0 + 1_000, CatchUp::Skip);
        assert_eq!(p.fire, vec![T0 + 1_000]);
        assert_eq!(p.settled, Some(T0 + 1_000));
        assert!(plan(&every_second(), T0, T0 + 999, CatchUp::Latest)
            .fire
            .is_empty());
    }

    #[test]
    fn catch_up_policies() {
        // Ten seconds without a leader.
        let now = T0 + 10_000;
        let all = plan(&every_second(), T0, now, CatchUp::All { max: 100 });
        assert_eq!(
            all.fire,
            (1..=10).map(|s| T0 + s * 1000).collect::<Vec<_>>()
        );
        assert_eq!(all.skipped, 0);
        let capped = plan(&every_second(), T0, now, CatchUp::All { max: 3 });
        // 8, 9, 10 are on time (within 2 s); 5, 6, 7 are the latest 3 missed.
        assert_eq!(
            capped.fire,
            (5..=10).map(|s| T0 + s * 1000).collect::<Vec<_>>()
        );
        assert_eq!(capped.skipped, 4);
        let latest = plan(&every_second(), T0, now, CatchUp::Latest);
        assert_eq!(
            latest.fire,
            vec![T0 + 7_000, T0 + 8_000, T0 + 9_000, T0 + 10_000]
        );
        let skip = plan(&every_second(), T0, now, CatchUp::Skip);
        assert_eq!(skip.fire, vec![T0 + 8_000, T0 + 9_000, T0 + 10_000]);
        assert_eq!(skip.skipped, 7);
        assert_eq!(skip.settled, Some(now));
    }

    #[test]
    fn a_very_long_gap_is_settled_in_chunks_without_firing_old_ticks() {
        let now = T0 + (MAX_SCAN as i64 + 500) * 1000;
        let first = plan(&every_second(), T0, now, CatchUp::Latest);
        assert!(first.fire.is_empty());
        assert_eq!(first.settled, Some(T0 + MAX_SCAN as i64 * 1000));
        let second = plan(
            &every_second(),
            T0 + MAX_SCAN as i64 * 1000,
            now,
            CatchUp::Latest,
        );
        assert_eq!(second.fire.last(), Some(&now));
    }

    #[test]
    fn ids_and_expressions() {
        assert_eq!(tick_id("report", T0), "cron:report:2023-11-14T22:13:20Z");
        assert_eq!(
            manual_id("report", T0 + 5),
            "cron:report:manual:2023-11-14T22:13:20.005Z"
        );
        assert_ne!(manual_id("report", T0), tick_id("report", T0));
        assert_eq!(next_tick("0 */5 * * * *", T0), Some(1_700_000_100_000));
        let s = Schedule::new("r", "not cron", || Tick { n: 1 });
        assert!(s.validate().is_err());
        let s = Schedule::new("a:b", "* * * * * *", || Tick { n: 1 });
        assert!(s.validate().is_err());
    }
}
