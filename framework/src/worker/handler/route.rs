//! The typed-to-untyped bridge the worker dispatches through.
//!
//! A handler ([`crate::worker::handler`]) knows its job type; the worker keeps one
//! `Route` per topic; the route knows the job type, so it
//! can decode the record with that contract's reader schema before calling
//! the handler. Everything that can go wrong in one attempt (decode failure,
//! a returned error, a timeout, a panic) comes back as one [`Attempt`].

use std::future::Future;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;

use crate::classify::{ErrorClass, JobError};
use crate::codec::{DecodeError, ReaderSchema, SchemaSource};
use crate::job::{Job, JobContext};
use crate::layers::{AttemptService, LayerFn, Request};
use crate::telemetry::metrics::{RegistryWait, WorkerGauges};
use crate::worker::before::park::Waiter;
use crate::worker::handler::watchdog::{Watchdog, Watched};
use crate::worker::handler::{Handler, Parts, StateMap};

/// The result of one attempt at one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The handler returned `Ok`.
    Handled,
    /// The attempt failed; `class` decides what happens next.
    Failed {
        /// Classification of the failure.
        class: ErrorClass,
        /// Detail for the `kjob-error` header and logs.
        message: String,
        /// A handler-requested minimum wait (`JobError::RetryAfter`).
        retry_after: Option<Duration>,
        /// Where a panic happened (bounded; see `worker::backtrace`), for
        /// the dead letter's `kjob-backtrace` header.
        backtrace: Option<String>,
    },
    /// Not run: the attempt was still waiting (for the schema registry, or
    /// parked by a layer) when its partition was revoked or the worker
    /// stopped. Nothing is forwarded and the offset stays unfinished, so the
    /// partition's next owner runs the job; its attempt count is unchanged.
    Released,
}

/// A route's handler, type-erased: decode + handle for one topic. The
/// route itself is the whole [`RouteEntry`](crate::worker::state::RouteEntry).
pub(crate) trait RouteHandler: Send + Sync {
    fn job_name(&self) -> &'static str;
    /// The contract's version compiled into this binary.
    fn job_version(&self) -> u32;
    /// The contract's reader schema (checked at start against what the
    /// registry holds for the route's topic).
    fn reader(&self) -> &ReaderSchema;
    /// Decodes and handles one record. Waits before the handler starts
    /// (the registry, a layer's) go through `waiter`: parked, without a
    /// slot, and given up when the job is released. `ctx` and `watched`
    /// (the attempt as the watchdog names it) move into the returned box,
    /// so the attempt's own future does not carry them.
    fn run<'a>(
        &'a self,
        payload: Option<&'a [u8]>,
        ctx: JobContext,
        waiter: &'a Waiter,
        watched: Watched<'a>,
    ) -> BoxFuture<'a, Attempt>;
}

/// How long a job whose writer schema cannot be fetched waits before it
/// asks again: from [`REGISTRY_WAIT_FIRST`] doubling up to this. The codec
/// itself sends at most one request per outage interval whatever the number
/// of waiting jobs ([`crate::codec::Codec`]), so this only bounds how soon a
/// waiting job notices that the registry is back.
const REGISTRY_WAIT_MAX: Duration = Duration::from_secs(1);
const REGISTRY_WAIT_FIRST: Duration = Duration::from_millis(100);

/// What every route of one worker shares: the watch on long handlers and
/// the gauges its waits count.
#[derive(Clone)]
pub(crate) struct HandlerShared {
    pub watchdog: Arc<Watchdog>,
    pub gauges: Arc<WorkerGauges>,
}

pub(crate) struct TypedHandler<J, H, M> {
    pub handler: H,
    pub reader: ReaderSchema,
    pub schemas: Arc<dyn SchemaSource>,
    pub timeout: Option<Duration>,
    pub states: Arc<StateMap>,
    /// The layered stack, when any layer is configured (`None`: the handler
    /// is called directly, which costs nothing extra per attempt).
    pub stack: Option<AttemptService>,
    /// Tracks handlers that run for long.
    pub watchdog: Arc<Watchdog>,
    /// The worker's gauges: jobs waiting for the registry, breakers seen.
    pub gauges: Arc<WorkerGauges>,
    pub _job: PhantomData<fn() -> (J, M)>,
}

impl<J: Job, M: 'static, H: Handler<J, M> + Clone> TypedHandler<J, H, M> {
    /// A route whose attempts run through `layers` (outermost first).
    pub(crate) fn new(
        handler: H,
        reader: ReaderSchema,
        schemas: Arc<dyn SchemaSource>,
        timeout: Option<Duration>,
        states: Arc<StateMap>,
        layers: &[LayerFn],
        shared: HandlerShared,
    ) -> Self {
        let HandlerShared { watchdog, gauges } = shared;
        let stack = (!layers.is_empty()).then(|| {
            let inner = AttemptService::new(HandlerService::<J, H, M> {
                handler: handler.clone(),
                states: states.clone(),
                timeout,
                _job: PhantomData,
            });
            layers.iter().rev().fold(inner, |svc, layer| layer(svc))
        });
        Self {
            handler,
            reader,
            schemas,
            timeout,
            states,
            stack,
            watchdog,
            gauges,
            _job: PhantomData,
        }
    }
}

impl<J: Job, M: 'static, H: Handler<J, M> + Clone> RouteHandler for TypedHandler<J, H, M> {
    fn job_name(&self) -> &'static str {
        J::NAME
    }

    fn job_version(&self) -> u32 {
        J::VERSION
    }

    fn reader(&self) -> &ReaderSchema {
        &self.reader
    }

    fn run<'a>(
        &'a self,
        payload: Option<&'a [u8]>,
        ctx: JobContext,
        waiter: &'a Waiter,
        watched: Watched<'a>,
    ) -> BoxFuture<'a, Attempt> {
        // A cached writer schema (the steady state) decodes here, at once:
        // the box allocated for this attempt then holds neither the
        // registry wait nor a second decode of a bad record.
        match self
            .reader
            .decode_cached::<J>(self.schemas.as_ref(), payload)
        {
            Some(Ok(job)) => {
                self.note_dropped(payload, &ctx);
                self.call(job, ctx, waiter, watched)
            }
            Some(Err(e)) if e.class().is_some() => Box::pin(std::future::ready(undecodable(e))),
            // Not cached yet: fetched, parked while the registry is down.
            _ => Box::pin(async move {
                let decoded = async {
                    let mut wait = REGISTRY_WAIT_FIRST;
                    let mut waiting: Option<RegistryWait> = None;
                    loop {
                        match self
                            .reader
                            .decode::<J>(self.schemas.as_ref(), payload)
                            .await
                        {
                            Ok(job) => return Ok(job),
                            // No class: the registry could not be asked (down, a
                            // timeout, a 5xx). The record is fine and its attempt
                            // has not begun, so it waits (parked: other jobs take
                            // its slot) instead of walking the retry tiers.
                            Err(e) if e.class().is_none() => {
                                tracing::debug!(job.id = %ctx.id, error = %e, "waiting for the schema registry");
                                waiting.get_or_insert_with(|| RegistryWait::begin(&self.gauges));
                                tokio::time::sleep(wait).await;
                                wait = (wait * 2).min(REGISTRY_WAIT_MAX);
                            }
                            Err(e) => return Err(undecodable(e)),
                        }
                    }
                };
                match waiter.wait(decoded).await {
                    Some(Ok(job)) => {
                        self.note_dropped(payload, &ctx);
                        self.call(job, ctx, waiter, watched).await
                    }
                    Some(Err(failed)) => failed,
                    None => Attempt::Released,
                }
            }),
        }
    }
}

impl<J: Job, M: 'static, H: Handler<J, M> + Clone> TypedHandler<J, H, M> {
    /// Counts a decoded record whose writer carries fields the reader
    /// drops (`kjob_fields_dropped_total`, a warning per writer id), when
    /// its producer's contract is newer than this reader's: an old worker
    /// losing what a new version added. A new worker dropping a field an
    /// old record still carries (a field removed on purpose) is not
    /// counted; a record without `kjob-version` is.
    #[inline]
    fn note_dropped(&self, payload: Option<&[u8]>, ctx: &JobContext) {
        if ctx.version.is_some_and(|v| v <= J::VERSION) {
            return;
        }
        if let Some((id, fields)) = self.reader.dropped_by(payload) {
            self.gauges.note_dropped(J::NAME, ctx.version, id, &fields);
        }
    }

    /// Runs the decoded `job` through the layers, if any, and the handler.
    /// Without layers the handler is called here, so the box holds only
    /// its future and the watch, not the layered stack's state (kilobytes).
    fn call<'a>(
        &'a self,
        job: J,
        ctx: JobContext,
        waiter: &'a Waiter,
        watched: Watched<'a>,
    ) -> BoxFuture<'a, Attempt> {
        let Some(stack) = &self.stack else {
            let parts = Parts {
                states: &self.states,
                extensions: &EMPTY_EXTENSIONS,
            };
            let handler = self.handler.call(job, ctx, &parts);
            return Box::pin(async move {
                let call = guarded(handler, self.timeout);
                self.watchdog.watch(call, None, &watched).await
            });
        };
        Box::pin(async move {
            let started = Arc::new(AtomicBool::new(false));
            let req = Request::new(job, ctx)
                .started_flag(started.clone())
                .waiter(waiter.clone())
                .gauges(self.gauges.clone());
            let released = waiter.released();
            // The timeout is the innermost layer; panics are caught
            // here, around every layer.
            let call = guarded(tower::ServiceExt::oneshot(stack.clone(), req), None);
            let call = self.watchdog.watch(call, Some(&*started), &watched);
            let mut call = std::pin::pin!(call);
            tokio::select! {
                biased;
                attempt = &mut call => attempt,
                // A layer may hold the job before the handler (the
                // breaker parks it, a rate limit delays it): such a
                // job is released; a running handler is awaited.
                _ = released.cancelled() => {
                    if started.load(AtomicOrdering::Acquire) {
                        call.await
                    } else {
                        Attempt::Released
                    }
                }
            }
        })
    }
}

/// The attempt of a record that cannot be decoded: failed with the
/// decode error's class (bad bytes, an incompatible writer: permanent).
fn undecodable(e: DecodeError) -> Attempt {
    Attempt::Failed {
        class: e.class().unwrap_or(ErrorClass::RetryableNetwork),
        message: e.to_string(),
        retry_after: None,
        backtrace: None,
    }
}

static EMPTY_EXTENSIONS: std::sync::LazyLock<http::Extensions> =
    std::sync::LazyLock::new(http::Extensions::new);

/// The innermost service of a route's stack: the handler, under the
/// handler timeout.
struct HandlerService<J, H, M> {
    handler: H,
    states: Arc<StateMap>,
    timeout: Option<Duration>,
    _job: PhantomData<fn() -> (J, M)>,
}

impl<J, H: Clone, M> Clone for HandlerService<J, H, M> {
    fn clone(&self) -> Self {
        Self {
            handler: self.handler.clone(),
            states: self.states.clone(),
            timeout: self.timeout,
            _job: PhantomData,
        }
    }
}

impl<J: Job, M: 'static, H: Handler<J, M> + Clone> tower::Service<Request>
    for HandlerService<J, H, M>
{
    type Response = ();
    type Error = JobError;
    type Future = BoxFuture<'static, Result<(), JobError>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), JobError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        req.mark_started();
        let (job, ctx, extensions) = req.into_parts();
        let Ok(job) = job.downcast::<J>() else {
            return Box::pin(async {
                Err(JobError::permanent(
                    "a layer replaced the job with a value of another type",
                ))
            });
        };
        let parts = Parts {
            states: &self.states,
            extensions: &extensions,
        };
        let fut = self.handler.call(*job, ctx, &parts);
        match self.timeout {
            None => fut,
            Some(limit) => Box::pin(async move {
                match tokio::time::timeout(limit, fut).await {
                    Ok(r) => r,
                    Err(_) => Err(JobError::timeout(format!(
                        "handler exceeded its timeout of {limit:?} and was cancelled"
                    ))),
                }
            }),
        }
    }
}

/// Runs an attempt future with panic capture and an optional timeout, and
/// classifies its result.
async fn guarded(
    fut: impl Future<Output = Result<(), JobError>>,
    timeout: Option<Duration>,
) -> Attempt {
    // The async block makes a panic in the handler's synchronous prelude
    // (before its first await) land in catch_unwind as well.
    // A panic's backtrace is taken by the hook on the panicking thread,
    // inside this poll (see `backtrace`).
    crate::worker::handler::backtrace::install_hook();
    let caught = AssertUnwindSafe(crate::worker::handler::backtrace::traced(fut)).catch_unwind();
    let outcome = match timeout {
        Some(limit) => match tokio::time::timeout(limit, caught).await {
            Ok(outcome) => outcome,
            Err(_) => {
                return Attempt::Failed {
                    class: ErrorClass::RetryableTimeout,
                    message: format!("handler exceeded its timeout of {limit:?} and was cancelled"),
                    retry_after: None,
                    backtrace: None,
                }
            }
        },
        None => caught.await,
    };
    match outcome {
        Ok(Ok(())) => Attempt::Handled,
        Ok(Err(e)) => Attempt::Failed {
            class: e.class(),
            message: e.message().to_string(),
            retry_after: match &e {
                JobError::RetryAfter { after, .. } => Some(*after),
                _ => None,
            },
            backtrace: None,
        },
        Err(panic) => Attempt::Failed {
            class: ErrorClass::Panic,
            message: format!("handler panicked: {}", panic_message(panic.as_ref())),
            retry_after: None,
            backtrace: crate::worker::handler::backtrace::take(),
        },
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{frame, DecodeError, WriterSchema};
    use crate::retry::RetryPolicy;
    use crate::worker::decision::{next_step, Decision};
    use rdkafka::message::{OwnedMessage, Timestamp};
    use tokio_util::sync::CancellationToken;

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Ping {
        id: String,
    }
    impl Job for Ping {
        const NAME: &'static str = "ping";
        const VERSION: u32 = 1;
        const SCHEMA: &'static str =
            r#"{"type":"record","name":"Ping","fields":[{"name":"id","type":"string"}]}"#;
        fn key(&self) -> String {
            self.id.clone()
        }
    }

    /// A registry that is down: every lookup fails as transient.
    struct DownRegistry;
    impl SchemaSource for DownRegistry {
        fn writer(&self, id: u32) -> BoxFuture<'_, Result<WriterSchema, DecodeError>> {
            Box::pin(async move {
                Err(DecodeError::RegistryUnavailable {
                    id,
                    message: "connection refused".into(),
                })
            })
        }
    }

    fn ctx() -> JobContext {
        JobContext {
            id: "j".into(),
            job: "ping".into(),
            version: Some(1),
            attempt: 1,
            topic: "ping".into(),
            partition: 0,
            offset: 0,
            key: None,
            timestamp_ms: None,
            tenant: None,
            group: "g".into(),
            due_at_ms: None,
            batch: None,
            batch_report: None,
        }
    }

    /// A registry that fails `down_for` lookups, then answers with Ping's
    /// schema.
    struct FlakyRegistry {
        down_for: usize,
        calls: std::sync::atomic::AtomicUsize,
    }
    impl SchemaSource for FlakyRegistry {
        fn writer(&self, id: u32) -> BoxFuture<'_, Result<WriterSchema, DecodeError>> {
            Box::pin(async move {
                let n = self.calls.fetch_add(1, AtomicOrdering::SeqCst);
                if n < self.down_for {
                    return Err(DecodeError::RegistryUnavailable {
                        id,
                        message: "connection refused".into(),
                    });
                }
                Ok(WriterSchema::Owned(Arc::new(
                    crate::codec::parse_contract::<Ping>().unwrap(),
                )))
            })
        }
    }

    fn ping_route(
        schemas: Arc<dyn SchemaSource>,
        layers: &[LayerFn],
        handled: Arc<std::sync::atomic::AtomicUsize>,
    ) -> impl RouteHandler {
        let handler = Arc::new(move |_j: Ping, _c: JobContext| {
            let handled = handled.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                handled.fetch_add(1, AtomicOrdering::SeqCst);
                Ok::<(), JobError>(())
            }
        });
        TypedHandler::<Ping, _, _>::new(
            handler,
            ReaderSchema::new(crate::codec::parse_contract::<Ping>().unwrap()),
            schemas,
            None,
            Arc::new(StateMap::default()),
            layers,
            HandlerShared {
                watchdog: Arc::new(Watchdog::new(Duration::from_secs(300))),
                gauges: Arc::default(),
            },
        )
    }

    const WATCHED: Watched<'static> = Watched {
        job: "ping",
        id: "j",
        key: None,
        topic: "ping",
        partition: 0,
        offset: 0,
    };

    #[tokio::test(start_paused = true)]
    async fn a_registry_outage_while_decoding_makes_the_job_wait_not_fail() {
        let registry = Arc::new(FlakyRegistry {
            down_for: 5,
            calls: Default::default(),
        });
        let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let route = ping_route(registry.clone(), &[], handled.clone());
        let payload = frame(7, b"\x02a");
        let released = std::sync::Arc::new(CancellationToken::new());
        let waiter = Waiter::holding(released.clone());
        let outcome = route.run(Some(&payload), ctx(), &waiter, WATCHED).await;
        // Not a retryable failure (which would walk the tiers): the same
        // attempt ran once the registry answered.
        assert_eq!(outcome, Attempt::Handled);
        assert_eq!(registry.calls.load(AtomicOrdering::SeqCst), 6);
        assert_eq!(handled.load(AtomicOrdering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_waiting_for_the_registry_is_released_by_a_revoke() {
        let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let route = ping_route(Arc::new(DownRegistry), &[], handled.clone());
        let payload = frame(7, b"\x02a");
        let released = std::sync::Arc::new(CancellationToken::new());
        let waiter = Waiter::holding(released.clone());
        let run = route.run(Some(&payload), ctx(), &waiter, WATCHED);
        let cancel = async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            released.cancel();
        };
        let (outcome, ()) = tokio::join!(run, cancel);
        assert_eq!(outcome, Attempt::Released);
        assert_eq!(handled.load(AtomicOrdering::SeqCst), 0);
        let record = OwnedMessage::new(
            Some(payload),
            None,
            "ping".into(),
            Timestamp::NotAvailable,
            0,
            0,
            None,
        );
        let policy = RetryPolicy::tiers([Duration::from_secs(5)]);
        let next = next_step(&outcome, &record, "ping", "ping", "g", &policy, 1, 0.0, 0);
        assert_eq!(next, Decision::Released, "nothing is forwarded");
    }

    /// A layer that holds every job until `open` is set (as an open breaker
    /// parks them), then calls the handler.
    fn gate(open: Arc<tokio::sync::Notify>) -> LayerFn {
        Arc::new(move |inner: AttemptService| {
            let open = open.clone();
            AttemptService::new(tower::service_fn(move |req: Request| {
                let (open, inner) = (open.clone(), inner.clone());
                async move {
                    open.notified().await;
                    tower::ServiceExt::oneshot(inner, req).await
                }
            }))
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_parked_by_a_layer_is_released_but_a_running_handler_is_awaited() {
        let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let registry = Arc::new(FlakyRegistry {
            down_for: 0,
            calls: Default::default(),
        });
        let open = Arc::new(tokio::sync::Notify::new());
        let route = ping_route(registry, &[gate(open.clone())], handled.clone());
        let payload = frame(7, b"\x02a");

        // Parked in the layer when the revoke comes: released, not run.
        let released = std::sync::Arc::new(CancellationToken::new());
        let waiter = Waiter::holding(released.clone());
        let run = route.run(Some(&payload), ctx(), &waiter, WATCHED);
        let revoke = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            released.cancel();
        };
        let (outcome, ()) = tokio::join!(run, revoke);
        assert_eq!(outcome, Attempt::Released);
        assert_eq!(handled.load(AtomicOrdering::SeqCst), 0);

        // Past the layer, inside its 50 ms handler, when the revoke comes:
        // the handler finishes.
        let released = std::sync::Arc::new(CancellationToken::new());
        let waiter = Waiter::holding(released.clone());
        let run = route.run(Some(&payload), ctx(), &waiter, WATCHED);
        let revoke = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            open.notify_one();
            tokio::time::sleep(Duration::from_millis(10)).await;
            released.cancel();
        };
        let (outcome, ()) = tokio::join!(run, revoke);
        assert_eq!(outcome, Attempt::Handled);
        assert_eq!(handled.load(AtomicOrdering::SeqCst), 1);
    }

    /// A registry whose every schema is cached (the steady state): asking
    /// it over the network is counted, and never needed.
    #[derive(Default)]
    struct CachedRegistry {
        fetches: std::sync::atomic::AtomicUsize,
    }
    impl SchemaSource for CachedRegistry {
        fn writer(&self, _id: u32) -> BoxFuture<'_, Result<WriterSchema, DecodeError>> {
            self.fetches.fetch_add(1, AtomicOrdering::SeqCst);
            Box::pin(async move { Err(DecodeError::NotFramed("not expected".into())) })
        }
        fn cached(&self, _id: u32) -> Option<WriterSchema> {
            Some(WriterSchema::Owned(Arc::new(
                crate::codec::parse_contract::<Ping>().unwrap(),
            )))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_cached_schema_decodes_at_once_with_or_without_layers() {
        let registry = Arc::new(CachedRegistry::default());
        let payload = frame(7, b"\x02a");
        let open = Arc::new(tokio::sync::Notify::new());
        open.notify_one();
        for layers in [vec![], vec![gate(open.clone())]] {
            let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let route = ping_route(registry.clone(), &layers, handled.clone());
            let waiter = Waiter::holding(Arc::new(CancellationToken::new()));
            let outcome = route.run(Some(&payload), ctx(), &waiter, WATCHED).await;
            assert_eq!(outcome, Attempt::Handled, "{} layers", layers.len());
            assert_eq!(handled.load(AtomicOrdering::SeqCst), 1);
        }
        assert_eq!(registry.fetches.load(AtomicOrdering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn garbage_under_a_cached_schema_fails_for_good_without_the_registry() {
        let registry = Arc::new(CachedRegistry::default());
        let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let route = ping_route(registry.clone(), &[], handled.clone());
        let waiter = Waiter::holding(Arc::new(CancellationToken::new()));
        // A string length far past the body's end, then trailing bytes.
        for body in [&b"\x7f"[..], &b"\x02ab"[..]] {
            let payload = frame(7, body);
            let outcome = route.run(Some(&payload), ctx(), &waiter, WATCHED).await;
            let Attempt::Failed { class, message, .. } = outcome else {
                panic!("{body:?} decoded: {outcome:?}");
            };
            assert!(!class.is_retryable(), "{body:?}: {class:?} {message}");
        }
        assert_eq!(handled.load(AtomicOrdering::SeqCst), 0);
        assert_eq!(registry.fetches.load(AtomicOrdering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn once_its_writer_is_known_identical_a_record_decodes_the_same_way() {
        // The first good record makes id 7 the writer known identical to
        // the reader; later ones decode without a look at the cache.
        let registry = Arc::new(CachedRegistry::default());
        let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let route = ping_route(registry.clone(), &[], handled.clone());
        let waiter = Waiter::holding(Arc::new(CancellationToken::new()));
        let bodies: [(&[u8], bool); 5] = [
            (b"\x02a", true),
            (b"\x02ab", false),
            (b"\x7f", false),
            (b"", false),
            (b"\x04ab", true),
        ];
        for (body, good) in bodies {
            let outcome = route
                .run(Some(&frame(7, body)), ctx(), &waiter, WATCHED)
                .await;
            match good {
                true => assert_eq!(outcome, Attempt::Handled, "{body:?}"),
                false => {
                    let Attempt::Failed { class, .. } = outcome else {
                        panic!("{body:?} decoded: {outcome:?}");
                    };
                    assert!(!class.is_retryable(), "{body:?}: {class:?}");
                }
            }
        }
        assert_eq!(handled.load(AtomicOrdering::SeqCst), 2);
        assert_eq!(registry.fetches.load(AtomicOrdering::SeqCst), 0);
    }
}
