//! The watchdog: attempts whose handler runs for long.
//!
//! A handler stuck on a socket without a timeout holds its partition's
//! watermark for as long as it hangs: the lag grows until the in-flight
//! bound pauses the partition, and nothing says why. The watchdog makes it
//! visible without costing fast attempts anything:
//!
//! * an attempt whose handler is still running after [`VISIBLE_AFTER`] is
//!   registered (one timer per attempt that does not finish at once, no lock
//!   before that second), so `kjob_oldest_running_seconds{job}` shows the
//!   age of the oldest one per route (0 while every handler is younger);
//! * once it has run longer than the warning threshold (5 minutes by
//!   default, [`crate::WorkerBuilder::slow_attempt_warning`]) a warning names
//!   its job id, key and partition, once per attempt.
//!
//! It never cancels anything: that is the handler timeout's job
//! ([`crate::WorkerBuilder::handler_timeout`]), which is off by default
//! because no single limit is safe for every handler (a PDF render may
//! rightly take minutes, a mail one second).

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use rustc_hash::FxHashMap;

/// How long a handler runs before the watchdog tracks it.
pub(crate) const VISIBLE_AFTER: Duration = Duration::from_secs(1);

/// The default warning threshold.
pub(crate) const WARN_AFTER: Duration = Duration::from_secs(300);

/// What names an attempt in a warning, borrowed from the pipeline: nothing
/// is copied unless the attempt turns out slow.
pub(crate) struct Watched<'a> {
    pub job: &'static str,
    pub id: &'a str,
    pub key: Option<&'a [u8]>,
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
}

struct Slow {
    job: &'static str,
    since: Instant,
}

/// The slow attempts of one worker.
pub(crate) struct Watchdog {
    warn_after: Duration,
    slow: Mutex<FxHashMap<u64, Slow>>,
    next: AtomicU64,
}

impl Watchdog {
    /// A watchdog that warns after `warn_after`.
    pub(crate) fn new(warn_after: Duration) -> Self {
        Self {
            warn_after: warn_after.max(VISIBLE_AFTER),
            slow: Mutex::new(FxHashMap::default()),
            next: AtomicU64::new(0),
        }
    }

    /// Per job name of `jobs`: the age in seconds of its oldest handler
    /// running for at least [`VISIBLE_AFTER`], else 0.
    pub(crate) fn oldest_running(&self, jobs: &[&'static str]) -> Vec<(&'static str, f64)> {
        let slow = self.slow.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        jobs.iter()
            .map(|job| {
                let age = slow
                    .values()
                    .filter(|s| s.job == *job)
                    .map(|s| now.duration_since(s.since).as_secs_f64())
                    .fold(0.0, f64::max);
                (*job, age)
            })
            .collect()
    }

    /// Runs `handler` (whose handler code has begun once `started` is set,
    /// or at once without a flag) under watch.
    pub(crate) async fn watch<F: Future>(
        &self,
        handler: F,
        started: Option<&AtomicBool>,
        attempt: &Watched<'_>,
    ) -> F::Output {
        let mut handler = std::pin::pin!(handler);
        if let Poll::Ready(v) = futures::poll!(handler.as_mut()) {
            return v;
        }
        let began = Instant::now();
        let has_started = || started.is_none_or(|s| s.load(Ordering::Acquire));
        let mut visible = tokio::time::sleep(VISIBLE_AFTER);
        let mut entry: Option<(Entry<'_>, Instant)> = None;
        loop {
            let timer = std::pin::pin!(visible);
            tokio::select! {
                v = handler.as_mut() => return v,
                () = timer => {}
            }
            match &entry {
                // Still waiting in a layer (parked): not running yet.
                None if !has_started() => {}
                None => {
                    // Seen started now (a layer may have parked it first).
                    let since = if started.is_none() {
                        began
                    } else {
                        Instant::now()
                    };
                    entry = Some((self.register(attempt.job, since), since));
                }
                Some((_, since)) => {
                    tracing::warn!(
                        job.id = attempt.id,
                        job.type = attempt.job,
                        key = ?String::from_utf8_lossy(attempt.key.unwrap_or_default()),
                        topic = attempt.topic,
                        partition = attempt.partition,
                        offset = attempt.offset,
                        running_s = since.elapsed().as_secs(),
                        "handler still running; its partition's commit waits for it (set a handler_timeout if it may hang)"
                    );
                    return handler.await;
                }
            }
            let next = match &entry {
                Some((_, since)) => self.warn_after.saturating_sub(since.elapsed()),
                None => VISIBLE_AFTER,
            };
            visible = tokio::time::sleep(next);
        }
    }

    fn register(&self, job: &'static str, since: Instant) -> Entry<'_> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.slow
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(n, Slow { job, since });
        Entry { dog: self, n }
    }
}

/// A registered slow attempt; removed when the attempt ends however it ends.
struct Entry<'a> {
    dog: &'a Watchdog,
    n: u64,
}

impl Drop for Entry<'_> {
    fn drop(&mut self) {
        self.dog
            .slow
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOBS: &[&str] = &["mail", "pdf"];

    fn attempt() -> Watched<'static> {
        Watched {
            job: "mail",
            id: "j1",
            key: Some(b"k"),
            topic: "mail",
            partition: 3,
            offset: 9,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_handler_shows_in_the_gauge_until_it_ends() {
        let dog = std::sync::Arc::new(Watchdog::new(Duration::from_secs(60)));
        let watched = dog.clone();
        let run = tokio::spawn(async move {
            watched
                .watch(
                    tokio::time::sleep(Duration::from_secs(90)),
                    None,
                    &attempt(),
                )
                .await
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(dog.oldest_running(JOBS), [("mail", 0.0), ("pdf", 0.0)]);
        tokio::time::sleep(Duration::from_secs(10)).await;
        let age = dog.oldest_running(JOBS)[0].1;
        assert!((10.0..11.0).contains(&age), "{age}");
        run.await.unwrap();
        assert_eq!(dog.oldest_running(JOBS)[0].1, 0.0, "gone when it ends");
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_parked_in_a_layer_is_not_running() {
        let dog = Watchdog::new(Duration::from_secs(60));
        let started = AtomicBool::new(false);
        let wait = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            started.store(true, Ordering::Release);
            tokio::time::sleep(Duration::from_secs(5)).await;
        };
        let probe = async {
            tokio::time::sleep(Duration::from_secs(4)).await;
            let parked = dog.oldest_running(JOBS)[0].1;
            tokio::time::sleep(Duration::from_secs(4)).await;
            (parked, dog.oldest_running(JOBS)[0].1)
        };
        let watched = attempt();
        let ((), (parked, running)) =
            tokio::join!(dog.watch(wait, Some(&started), &watched), probe);
        assert_eq!(parked, 0.0);
        assert!(running > 0.0);
    }

    /// Collects the messages of warnings.
    #[derive(Clone, Default)]
    struct Warnings(std::sync::Arc<Mutex<Vec<String>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
        fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            struct Fields(String);
            impl tracing::field::Visit for Fields {
                fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                    self.0.push_str(&format!("{}={v:?} ", f.name()));
                }
            }
            if *e.metadata().level() == tracing::Level::WARN {
                let mut f = Fields(String::new());
                e.record(&mut f);
                self.0.lock().unwrap().push(f.0);
            }
        }
    }

    #[test]
    fn a_handler_past_the_threshold_is_named_in_one_warning() {
        use tracing_subscriber::layer::SubscriberExt as _;
        let warnings = Warnings::default();
        let subscriber = tracing_subscriber::registry().with(warnings.clone());
        let _guard = tracing::subscriber::set_default(subscriber);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let dog = Watchdog::new(Duration::from_secs(5));
            dog.watch(
                tokio::time::sleep(Duration::from_secs(30)),
                None,
                &attempt(),
            )
            .await;
        });
        let seen = warnings.0.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "{seen:?}");
        for part in ["job.id=\"j1\"", "key=\"k\"", "partition=3", "running_s=5"] {
            assert!(seen[0].contains(part), "{part} in {}", seen[0]);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_fast_handler_registers_nothing() {
        let dog = Watchdog::new(Duration::from_secs(60));
        assert_eq!(dog.watch(async { 7 }, None, &attempt()).await, 7);
        assert!(dog.slow.lock().unwrap().is_empty());
    }
}
