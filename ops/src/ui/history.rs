//! The charts' 24 hours: one point per route per minute (lag, handled,
//! retried and dead-lettered in that minute, and the handlers' p50 and p99),
//! kept in memory and on the topic `kjob.dashboard.history`, so that a
//! dashboard that restarts starts with the last day instead of an empty
//! chart.
//!
//! A topic, not PostgreSQL: every dashboard has Kafka and not every one has
//! a database. The topic deletes by time (25 hours), not by key, so each
//! minute is its own record; a dashboard reads it once at start. Two
//! dashboards over one cluster both write their minutes, and a reader
//! keeps one point per route and minute (the later record).
//!
//! Lag and rates come from the sampler (offsets, as `kjob status`); the
//! handler durations come from the workers' heartbeats on each group's
//! control topic (mergeable histograms, see
//! [`kjob::control::DurationBuckets`]), folded into the minute they are
//! read in. Minutes while no dashboard ran are gaps.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kjob::control::{DurationBuckets, WorkerBeat};
use kjob::Producer;
use rdkafka::message::{Message, OwnedHeaders};
use serde::{Deserialize, Serialize};

use super::sampler::RouteKey;
use super::Shared;

/// Where the minutes are kept.
pub(super) const TOPIC: &str = "kjob.dashboard.history";

/// Minutes kept per route: a day.
pub(super) const KEEP: usize = 24 * 60;

const MINUTE_MS: i64 = 60_000;

/// One route's minute.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct Minute {
    pub(super) topic: String,
    pub(super) group: String,
    /// The minute's start (epoch ms).
    pub(super) minute_ms: i64,
    /// Lag at the minute's last sample.
    pub(super) lag: i64,
    /// Jobs handled in the minute (main topic and tiers).
    pub(super) handled: f64,
    /// Written to retry tiers in the minute.
    pub(super) retried: f64,
    /// Written to the DLQ in the minute.
    pub(super) dead_lettered: f64,
    /// Handler durations reported in the minute.
    #[serde(default)]
    pub(super) handler_count: u64,
    #[serde(default)]
    pub(super) p50_ms: Option<f64>,
    #[serde(default)]
    pub(super) p99_ms: Option<f64>,
}

/// The history of every route, and the durations of the minute under way.
#[derive(Default)]
pub(super) struct History {
    points: Mutex<HashMap<RouteKey, VecDeque<Minute>>>,
    pending: Mutex<HashMap<RouteKey, DurationBuckets>>,
    /// The last beat folded in, per worker.
    seen: Mutex<HashMap<String, i64>>,
}

impl History {
    /// A route's minutes, oldest first.
    pub(super) fn of(&self, key: &RouteKey) -> Vec<Minute> {
        self.points
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .map(|v| v.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Folds the handler durations of beats not seen yet into the minute
    /// under way.
    pub(super) fn absorb(&self, group: &str, beats: &[WorkerBeat]) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        for b in beats {
            let last = seen.entry(b.client_id.clone()).or_insert(i64::MIN);
            if b.at_ms <= *last {
                continue;
            }
            *last = b.at_ms;
            for (topic, sparse) in &b.durations {
                let key = RouteKey {
                    topic: topic.clone(),
                    group: group.to_string(),
                };
                pending.entry(key).or_default().merge(sparse);
            }
        }
    }

    /// Adds a minute, keeping one per route and minute (the later) and the
    /// last [`KEEP`].
    fn insert(&self, m: Minute) {
        let key = RouteKey {
            topic: m.topic.clone(),
            group: m.group.clone(),
        };
        let mut points = self.points.lock().unwrap_or_else(PoisonError::into_inner);
        let v = points.entry(key).or_default();
        match v.iter().position(|p| p.minute_ms >= m.minute_ms) {
            Some(i) if v[i].minute_ms == m.minute_ms => v[i] = m,
            Some(i) => v.insert(i, m),
            None => v.push_back(m),
        }
        while v.len() > KEEP {
            v.pop_front();
        }
    }
}

/// The minute `[start, start + 1 min)` of a route from its samples.
fn minute_of(
    key: &RouteKey,
    start: i64,
    samples: &[super::sampler::Point],
    durations: Option<DurationBuckets>,
) -> Option<Minute> {
    let inside: Vec<_> = samples
        .iter()
        .filter(|p| p.at_ms >= start && p.at_ms < start + MINUTE_MS)
        .collect();
    let last = inside.last()?;
    let n = inside.len() as f64;
    let per_minute = |f: fn(&super::sampler::Point) -> f64| {
        (inside.iter().map(|p| f(p)).sum::<f64>() / n * 60.0).max(0.0)
    };
    let d = durations.unwrap_or_default();
    Some(Minute {
        topic: key.topic.clone(),
        group: key.group.clone(),
        minute_ms: start,
        lag: last.lag,
        handled: per_minute(|p| p.handled),
        retried: per_minute(|p| p.retried),
        dead_lettered: per_minute(|p| p.dead_lettered),
        handler_count: d.count(),
        p50_ms: d.quantile_ms(0.5),
        p99_ms: d.quantile_ms(0.99),
    })
}

/// Reads the last day from the topic (creating it when missing), then
/// records a point per route at every minute's end. Only a weak hold, as
/// the sampler.
pub(super) fn spawn(state: Shared) {
    let weak = Arc::downgrade(&state);
    let config = state.config.clone();
    drop(state);
    tokio::spawn(async move {
        let created = kjob::topics::create_topics_with(
            &config,
            &[(TOPIC.to_string(), 1)],
            &[("cleanup.policy", "delete"), ("retention.ms", "90000000")],
        )
        .await;
        if let Err(e) = &created {
            tracing::warn!(topic = TOPIC, error = %e, "the dashboard's history is kept in memory only");
        }
        let producer = created.ok().and_then(|()| Producer::new(&config).ok());
        let c = config.clone();
        if let Ok(Ok(Some(records))) =
            tokio::task::spawn_blocking(move || kjob::topics::read_topic(&c, TOPIC)).await
        {
            let Some(state) = weak.upgrade() else { return };
            let from = kjob::clock::now_ms() - KEEP as i64 * MINUTE_MS;
            for m in records
                .iter()
                .filter_map(|r| serde_json::from_slice::<Minute>(r.payload()?).ok())
                .filter(|m| m.minute_ms >= from)
            {
                state.history.insert(m);
            }
        }
        let mut current = kjob::clock::now_ms() / MINUTE_MS * MINUTE_MS;
        loop {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let Some(state) = weak.upgrade() else { return };
            let now = kjob::clock::now_ms();
            if now < current + MINUTE_MS {
                continue;
            }
            let ended = current;
            current = now / MINUTE_MS * MINUTE_MS;
            let views = state.routes.read().map(|r| r.clone()).unwrap_or_default();
            let mut pending = std::mem::take(
                &mut *state
                    .history
                    .pending
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner),
            );
            for v in views {
                let samples: Vec<_> = v.history.iter().copied().collect();
                let Some(m) = minute_of(&v.key, ended, &samples, pending.remove(&v.key)) else {
                    continue;
                };
                if let (Some(p), Ok(body)) = (&producer, serde_json::to_vec(&m)) {
                    let key = format!("{}|{}", m.group, m.topic);
                    if let Err(e) = p
                        .send_raw(
                            TOPIC,
                            Some(key.as_bytes()),
                            Some(&body),
                            OwnedHeaders::new(),
                        )
                        .await
                    {
                        tracing::warn!(topic = TOPIC, error = %e, "a history minute was kept in memory only");
                    }
                }
                state.history.insert(m);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::super::sampler::Point;
    use super::*;

    fn key() -> RouteKey {
        RouteKey {
            topic: "t".into(),
            group: "g".into(),
        }
    }

    #[test]
    fn a_minute_sums_its_samples_rates_and_keeps_its_last_lag() {
        let start = 1_796_055_400_000;
        let samples = [
            Point {
                at_ms: start - 1,
                lag: 99,
                handled: 99.0,
                ..Point::default()
            },
            Point {
                at_ms: start + 5_000,
                lag: 7,
                handled: 2.0,
                retried: 1.0,
                ..Point::default()
            },
            Point {
                at_ms: start + 10_000,
                lag: 3,
                handled: 4.0,
                dead_lettered: 0.5,
                ..Point::default()
            },
            Point {
                at_ms: start + MINUTE_MS,
                lag: 50,
                ..Point::default()
            },
        ];
        let mut d = DurationBuckets::default();
        d.merge(&[(40, 3)]);
        let m = minute_of(&key(), start, &samples, Some(d)).expect("a minute");
        assert_eq!(m.lag, 3);
        assert_eq!(m.handled, 180.0, "3 jobs/s on average for a minute");
        assert_eq!(m.retried, 30.0);
        assert_eq!(m.dead_lettered, 15.0);
        assert_eq!(m.handler_count, 3);
        assert!(m.p50_ms.is_some() && m.p50_ms == m.p99_ms);
        assert!(minute_of(&key(), start + 2 * MINUTE_MS, &samples, None).is_none());
    }

    #[test]
    fn one_point_per_minute_in_order_and_a_day_at_most() {
        let h = History::default();
        let at = |minute: i64, lag: i64| Minute {
            topic: "t".into(),
            group: "g".into(),
            minute_ms: minute * MINUTE_MS,
            lag,
            handled: 0.0,
            retried: 0.0,
            dead_lettered: 0.0,
            handler_count: 0,
            p50_ms: None,
            p99_ms: None,
        };
        h.insert(at(2, 1));
        h.insert(at(1, 1));
        h.insert(at(2, 5));
        let lags: Vec<(i64, i64)> = h
            .of(&key())
            .iter()
            .map(|m| (m.minute_ms / MINUTE_MS, m.lag))
            .collect();
        assert_eq!(lags, [(1, 1), (2, 5)]);
        for i in 0..(KEEP as i64 + 10) {
            h.insert(at(10 + i, 0));
        }
        assert_eq!(h.of(&key()).len(), KEEP);
    }

    #[test]
    fn a_beat_is_folded_in_once() {
        let h = History::default();
        let beat = WorkerBeat {
            client_id: "w".into(),
            at_ms: 5,
            durations: vec![("t".into(), vec![(40, 2)])],
            ..WorkerBeat::default()
        };
        h.absorb("g", std::slice::from_ref(&beat));
        h.absorb("g", std::slice::from_ref(&beat));
        let pending = h.pending.lock().unwrap_or_else(PoisonError::into_inner);
        assert_eq!(pending.get(&key()).map(DurationBuckets::count), Some(2));
    }
}
