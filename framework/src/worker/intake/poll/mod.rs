//! The poll thread: the rdkafka adapter around the
//! [`Scheduler`](crate::worker::scheduler::Scheduler).
//!
//! It is the only code that talks to the consumer. Each turn it polls a
//! batch of records, feeds them to the scheduler, and carries out the
//! scheduler's actions: `Run` batches go to the dispatcher tasks on the
//! async runtime, and `Pause`, `Resume`, `Seek` and `Commit` go to the
//! consumer. It never stops polling, so the group session and
//! `max.poll.interval.ms` stay healthy however slow handlers are.
//!
//! Completions do not travel back to this thread: a dispatcher reports the
//! attempts that finished together to the scheduler itself (`Hub::finished`
//! in `hub.rs`,
//! one lock per batch) and runs the jobs that this released right away. A
//! cheap job's slot is thus refilled without a hop between threads; only
//! the consumer actions a completion causes (resuming a partition that was
//! paused at its in-flight bound) are this thread's, which the hub wakes
//! for them: the poll thread waits parked, never blocked in librdkafka,
//! so every queue's non-empty callback and the hub end its wait. Without
//! split queues it parks on the main queue too, and a [`MainQueue`] handle
//! tells a main queue left non-empty (a poll ends at an event) from an
//! empty one.
//!
//! Commits (always the scheduler's watermark, "next offset to read"):
//! * every `commit_interval`, asynchronously, for partitions whose watermark
//!   moved, and every tenth interval for all of them (librdkafka reports
//!   nothing about an asynchronous commit with explicit offsets, so one that
//!   failed during a broker outage is re-sent this way);
//! * on revoke, synchronously, after the running jobs finished (bounded);
//! * on shutdown, synchronously, after the grace period.
//!
//! It never commits for partitions that were *lost* (session expired):
//! another member may already own them, and our watermark could move theirs
//! backwards.
//!
//! After every assignment it re-applies the scheduler's pause view to the
//! consumer: librdkafka keeps an application's pause across a revoke and a
//! re-assignment, while the scheduler starts the partition afresh.

mod actions;
mod commit;
pub(crate) mod context;
mod rebalance;

pub(crate) use commit::commit_tag;
pub(crate) use context::{FatalConsumerError, WorkerContext};

use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode};
use rdkafka::message::Message;
use tracing::{info, warn};

use crate::clock::now_ms;
use crate::worker::intake::polled::Polled;
use crate::worker::intake::MainQueue;
use crate::worker::scheduler::Incoming;
use context::consumer_error;

/// Most records taken from the consumer per turn: large enough to amortise
/// the lock and the wake-ups, small enough to keep completions flowing.
const MAX_BATCH: usize = 1024;

/// Records the poll thread gives the scheduler each time it takes the hub's lock.
/// A whole batch (up to [`MAX_BATCH`]) held it about a quarter of a
/// millisecond, while the dispatcher, its jobs done, waited to report them
/// and take the next: a fifth of its time, asleep on the lock, in a no-op
/// run (CHANGELOG.md's benchmark history, issue 29's ninth step). A chunk holds it a few
/// microseconds, which a waiter spins out ([`Hub::lock`](crate::worker::dispatch::hub::Hub::lock)).
const RECORD_CHUNK: usize = 64;

/// The longest a busy poll thread waits parked: every queue's non-empty
/// callback and the hub's wake-up end the wait at once, so this only
/// bounds what no wake-up announces (a fair route's read-back falling
/// due, the commit interval).
const BUSY_WAIT: Duration = Duration::from_millis(2);

/// The poll loop. Returns once stopping is set, or a fatal consumer error
/// (an ACL, the credentials) was seen, and the shutdown sequence (drop
/// queued work, wait for running jobs within the grace period, cancel the
/// rest, commit) is complete; the caller then closes the consumer.
pub(crate) fn poll_loop(
    ctx: &WorkerContext,
    consumer: &Arc<BaseConsumer<WorkerContext>>,
    abandon: impl FnOnce(),
) -> Result<(), FatalConsumerError> {
    ctx.wake.register();
    // Main-topic partitions, each through its own queue, most urgent
    // first (none when only fair routes are handled).
    let mut intake = crate::worker::intake::Intake::new(&ctx.routes, consumer, ctx.wake.clone());
    ctx.split_reading
        .store(intake.is_some(), AtomicOrdering::Release);
    let main = intake.is_none().then(|| MainQueue::of(consumer)).flatten();
    // Without that handle (librdkafka gave none), it blocks in the main
    // queue as before, rather than spin.
    let block_in_main = intake.is_none() && main.is_none();
    let mut throttle_seen = 0;
    let mut last_gauges = Instant::now();
    let mut fatal = None;
    let mut batch: Vec<Polled> = Vec::with_capacity(MAX_BATCH);
    // The scheduler's view of `batch`, reused from turn to turn: a new one
    // per turn was a fresh 170 KiB allocation (1 024 records), which glibc
    // may map and unmap each time.
    let mut incoming: Vec<Incoming<Polled>> = Vec::with_capacity(MAX_BATCH);
    // Topic names, shared by every record of their topic.
    let mut topics: rustc_hash::FxHashMap<String, Arc<str>> = Default::default();
    // Finished records, back from the dispatchers once per turn: kept
    // whole (box and buffer) for the next records, or dropped here (see
    // crate::worker::intake::recycle).
    let mut returned: Vec<Polled> = Vec::new();
    let mut spare = crate::worker::intake::recycle::Spare::default();
    while !ctx.is_stopping() && fatal.is_none() {
        ctx.hub.returned.take(&mut returned);
        returned.drain(..).for_each(|r| spare.keep(r));
        let mut out = Vec::new();
        let now = now_ms();
        let (busy, full, next_due) = {
            let mut core = ctx.lock();
            core.take_deferred(&mut out);
            core.sched.tick(now, &mut out);
            core.sched.dispatch(&mut out);
            (
                core.sched.running() > 0 || core.sched.ready_len() > 0,
                core.read_ahead_full(),
                core.sched.next_due_ms(),
            )
        };
        ctx.execute(consumer, out, CommitMode::Async, false);
        ctx.apply_pauses(consumer, false);
        if last_gauges.elapsed() >= ctx.settings.commit_interval {
            ctx.refresh_oldest_pending();
            last_gauges = Instant::now();
        }
        let mut timeout = wait_budget(ctx, busy, next_due, now);
        // Split partitions first: their records join the batch ahead of
        // whatever the main queue holds.
        let mut failed = None;
        if let Some(intake) = intake.as_mut() {
            let generation = ctx.assignments.load(AtomicOrdering::Acquire);
            intake.refresh(consumer, generation, || ctx.stats.assignment());
            // After this turn's actions: a partition they resumed is read
            // now. (Copied at the top of the turn instead, the set missed
            // such a resume, and when nothing else was left to run the
            // poll thread then waited out its idle timeout, 20 ms, with
            // the partition unread: at a bound of 250 records per
            // partition, about a second in a 200 000-job run.)
            let version = ctx.hub.throttle_version.load(AtomicOrdering::Acquire);
            if version != throttle_seen {
                throttle_seen = version;
                intake.stop_only(ctx.lock().throttled.set());
            }
            intake.leave_unread(full);
            failed = intake.read(&mut batch, MAX_BATCH, |m, topic| {
                Polled::copy_fetched(m, topic.clone(), spare.take())
            });
            // Blocking in the main queue would miss the split ones.
            if batch.is_empty() && failed.is_none() {
                intake.wait(timeout);
            }
            timeout = Duration::ZERO;
        }
        if !batch.is_empty() {
            timeout = Duration::ZERO;
        }
        if let Some(e) = failed {
            fatal = fatal.or_else(|| consumer_error(consumer, &e));
        }
        // Always polled, even after a full batch of split records or an
        // error from a split queue: the main queue also serves the
        // rebalance and commit callbacks.
        let from_main = poll_main(
            consumer,
            if block_in_main {
                timeout
            } else {
                Duration::ZERO
            },
            &mut batch,
            &mut topics,
            &mut spare,
            &mut fatal,
        );
        if let Some(intake) = intake.as_mut() {
            intake.main_drained(from_main);
        }
        if batch.is_empty() {
            // Only without split queues is `timeout` still to wait; the
            // main queue's non-empty callback and the hub unpark it.
            if !timeout.is_zero() && fatal.is_none() && main.as_ref().is_some_and(|m| m.len() == 0)
            {
                std::thread::park_timeout(timeout);
            }
            continue;
        }
        incoming.extend(batch.drain(..).map(|m| ctx.incoming(m)));
        record_batch(ctx, consumer, &mut incoming);
    }
    shutdown(ctx, consumer, abandon);
    fatal.map_or(Ok(()), Err)
}

/// How long this turn may wait for records. While jobs run, completions
/// may leave consumer actions behind (a resume): only briefly, so they are
/// carried out promptly even where no wake-up reaches this thread. A hold
/// due sooner ends the wait at its due time: its record is ready then, not
/// on the next turn.
fn wait_budget(ctx: &WorkerContext, busy: bool, next_due: Option<i64>, now: i64) -> Duration {
    let timeout = if busy {
        BUSY_WAIT
    } else {
        ctx.settings.poll_timeout
    };
    match next_due {
        Some(due) => timeout.min(Duration::from_millis(
            u64::try_from(due.saturating_sub(now)).unwrap_or(0),
        )),
        None => timeout,
    }
}

/// Polls the main queue into `batch` (up to [`MAX_BATCH`]), waiting up to
/// `timeout` for its first record; answers how many came from it. A
/// consumer error ends the read and is kept in `fatal`.
fn poll_main(
    consumer: &Arc<BaseConsumer<WorkerContext>>,
    timeout: Duration,
    batch: &mut Vec<Polled>,
    topics: &mut rustc_hash::FxHashMap<String, Arc<str>>,
    spare: &mut crate::worker::intake::recycle::Spare<Polled>,
    fatal: &mut Option<FatalConsumerError>,
) -> usize {
    let mut copy = |m: &rdkafka::message::BorrowedMessage<'_>| {
        let name = m.topic();
        let topic = match topics.get(name) {
            Some(t) => t.clone(),
            None => {
                let t: Arc<str> = Arc::from(name);
                topics.insert(name.to_string(), t.clone());
                t
            }
        };
        Polled::copy_into(m, topic, spare.take())
    };
    let mut next = consumer.poll(timeout);
    let mut from_main = 0;
    while let Some(result) = next {
        match result {
            Ok(m) => {
                batch.push(copy(&m));
                from_main += 1;
            }
            Err(e) => {
                if fatal.is_none() {
                    *fatal = consumer_error(consumer, &e);
                }
                break;
            }
        }
        if batch.len() >= MAX_BATCH {
            break;
        }
        next = consumer.poll(Duration::ZERO);
    }
    from_main
}

/// Gives the scheduler a turn's records and carries out what it decided.
fn record_batch(
    ctx: &WorkerContext,
    consumer: &Arc<BaseConsumer<WorkerContext>>,
    incoming: &mut Vec<Incoming<Polled>>,
) {
    let now = now_ms();
    let mut out = Vec::new();
    // Recorded a chunk at a time, the lock let go in between: a
    // dispatcher reporting completions (and waiting for the jobs they
    // free) waits for one chunk, not for the whole batch.
    // `out` keeps the order of the lock: what completions left for this
    // thread before a hold comes before what the hold's records cause
    // (a resume made before a pause must not be carried out after it).
    // Free slots are given out once the whole batch is in, so that
    // they go to its most urgent records, not to the first chunk's.
    let mut recs = incoming.drain(..).peekable();
    while recs.peek().is_some() {
        let mut core = ctx.lock();
        core.take_deferred(&mut out);
        for rec in recs.by_ref().take(RECORD_CHUNK) {
            core.sched.record(rec, now, &mut out);
        }
        if recs.peek().is_none() {
            core.sched.dispatch(&mut out);
        }
    }
    drop(recs);
    ctx.execute(consumer, out, CommitMode::Async, false);
}

/// Shutdown: stop fetching, drop what has not started, let running jobs
/// finish within the grace period, abandon the rest, commit. Leaving the
/// group happens when the caller drops the consumer.
fn shutdown(ctx: &WorkerContext, consumer: &BaseConsumer<WorkerContext>, abandon: impl FnOnce()) {
    ctx.stats.ready.store(false, AtomicOrdering::Release);
    let mut out = Vec::new();
    let close_gaps = ctx.close_gaps.load(AtomicOrdering::Acquire);
    let running = {
        let mut core = ctx.lock();
        core.sched.stop(close_gaps, &mut out);
        core.sched.dispatch(&mut out);
        core.sched.running()
    };
    info!(running, grace = ?ctx.settings.shutdown_grace, "shutting down: waiting for running jobs");
    ctx.execute(consumer, out, CommitMode::Async, false);
    let deadline = Instant::now() + ctx.settings.shutdown_grace;
    loop {
        let mut out = Vec::new();
        let (idle, left) = {
            let mut core = ctx.hub.wait(ctx.lock(), Duration::from_millis(20));
            core.take_deferred(&mut out);
            // Only jobs kept to close gaps are still released; the
            // scheduler emits no resume while stopping.
            core.sched.dispatch(&mut out);
            (core.sched.idle(), core.sched.running())
        };
        ctx.execute(consumer, out, CommitMode::Async, false);
        if idle {
            break;
        }
        if Instant::now() >= deadline {
            warn!(
                left,
                "grace period over; cancelling the remaining jobs (they will be re-delivered)"
            );
            break;
        }
        // Keep serving the consumer, so the session stays alive.
        let _ = consumer.poll(Duration::ZERO);
    }
    abandon();
    let mut out = Vec::new();
    {
        let mut core = ctx.lock();
        core.deferred.clear();
        core.sched.commit_all(&mut out);
    }
    ctx.execute(consumer, out, CommitMode::Sync, false);
    // Forget the partitions so the revoke during close neither waits for
    // abandoned jobs nor commits again.
    ctx.lock().sched.clear();
}
