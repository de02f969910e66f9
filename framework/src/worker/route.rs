//! Handlers and the typed-to-untyped bridge the worker dispatches through.
//!
//! A handler is a plain `async fn(job, ctx) -> Result<(), JobError>`. The
//! worker keeps one `Route` per topic; the route knows the job type, so it
//! can decode the record with that contract's reader schema before calling
//! the handler. Everything that can go wrong in one attempt (decode failure,
//! a returned error, a timeout, a panic) comes back as one [`Attempt`].

use std::future::Future;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;

use crate::classify::{ErrorClass, JobError};
use crate::codec::{ReaderSchema, SchemaSource};
use crate::job::{Job, JobContext};

/// Anything that can handle jobs of type `J`. Implemented for every
/// `Fn(J, JobContext) -> impl Future<Output = Result<(), JobError>>`, so a
/// plain `async fn` is a handler; closures capturing an `Arc` of shared
/// dependencies (a mail client, a pool) work too.
pub trait Handler<J>: Send + Sync + 'static {
    /// Runs one attempt.
    fn call(&self, job: J, ctx: JobContext) -> BoxFuture<'static, Result<(), JobError>>;
}

/// A shared handler is a handler (the worker and the test harness can hold
/// the same one).
impl<J, H: Handler<J>> Handler<J> for Arc<H> {
    fn call(&self, job: J, ctx: JobContext) -> BoxFuture<'static, Result<(), JobError>> {
        (**self).call(job, ctx)
    }
}

impl<J, F, Fut> Handler<J> for F
where
    F: Fn(J, JobContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), JobError>> + Send + 'static,
{
    fn call(&self, job: J, ctx: JobContext) -> BoxFuture<'static, Result<(), JobError>> {
        Box::pin((self)(job, ctx))
    }
}

/// The result of one attempt at one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// The handler returned `Ok`.
    Done,
    /// The attempt failed; `class` decides what happens next.
    Failed {
        /// Classification of the failure.
        class: ErrorClass,
        /// Detail for the `kjob-error` header and logs.
        message: String,
        /// A handler-requested minimum wait (`JobError::RetryAfter`).
        retry_after: Option<Duration>,
    },
}

/// A type-erased route: decode + handle for one topic.
pub(crate) trait Route: Send + Sync {
    fn job_name(&self) -> &'static str;
    fn run<'a>(&'a self, payload: Option<&'a [u8]>, ctx: JobContext) -> BoxFuture<'a, Attempt>;
}

pub(crate) struct TypedRoute<J, H> {
    pub handler: H,
    pub reader: ReaderSchema,
    pub schemas: Arc<dyn SchemaSource>,
    pub timeout: Option<Duration>,
    pub _job: PhantomData<fn() -> J>,
}

impl<J: Job, H: Handler<J>> Route for TypedRoute<J, H> {
    fn job_name(&self) -> &'static str {
        J::NAME
    }

    fn run<'a>(&'a self, payload: Option<&'a [u8]>, ctx: JobContext) -> BoxFuture<'a, Attempt> {
        Box::pin(async move {
            let job = match self
                .reader
                .decode::<J>(self.schemas.as_ref(), payload)
                .await
            {
                Ok(job) => job,
                Err(e) => {
                    return Attempt::Failed {
                        // No class means transient (registry unreachable):
                        // the record is fine, so it is retried, not dead-lettered.
                        class: e.class().unwrap_or(ErrorClass::RetryableNetwork),
                        message: e.to_string(),
                        retry_after: None,
                    };
                }
            };
            run_handler(&self.handler, job, ctx, self.timeout).await
        })
    }
}

/// Runs one handler attempt with panic capture and an optional timeout.
/// Shared by the worker and anything else that must classify exactly as the
/// worker does.
pub async fn run_handler<J, H: Handler<J>>(
    handler: &H,
    job: J,
    ctx: JobContext,
    timeout: Option<Duration>,
) -> Attempt {
    // The async block makes a panic in the handler's synchronous prelude
    // (before its first await) land in catch_unwind as well.
    let guarded = AssertUnwindSafe(async move { handler.call(job, ctx).await }).catch_unwind();
    let outcome = match timeout {
        Some(limit) => match tokio::time::timeout(limit, guarded).await {
            Ok(outcome) => outcome,
            Err(_) => {
                return Attempt::Failed {
                    class: ErrorClass::RetryableTimeout,
                    message: format!("handler exceeded its timeout of {limit:?} and was cancelled"),
                    retry_after: None,
                }
            }
        },
        None => guarded.await,
    };
    match outcome {
        Ok(Ok(())) => Attempt::Done,
        Ok(Err(e)) => Attempt::Failed {
            class: e.class(),
            message: e.message().to_string(),
            retry_after: match &e {
                JobError::RetryAfter { after, .. } => Some(*after),
                _ => None,
            },
        },
        Err(panic) => Attempt::Failed {
            class: ErrorClass::Panic,
            message: format!("handler panicked: {}", panic_message(panic.as_ref())),
            retry_after: None,
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
    use crate::routing::{next_step, Next};
    use rdkafka::message::{OwnedMessage, Timestamp};

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
        }
    }

    #[tokio::test]
    async fn a_registry_outage_while_decoding_is_retried_not_dead_lettered() {
        let route = TypedRoute::<Ping, _> {
            handler: |_j: Ping, _c: JobContext| async { Ok::<(), JobError>(()) },
            reader: ReaderSchema::new(crate::codec::parse_contract::<Ping>().unwrap()),
            schemas: Arc::new(DownRegistry),
            timeout: None,
            _job: PhantomData,
        };
        let payload = frame(7, b"\x02a");
        let outcome = route.run(Some(&payload), ctx()).await;
        assert!(
            matches!(
                &outcome,
                Attempt::Failed {
                    class: ErrorClass::RetryableNetwork,
                    ..
                }
            ),
            "{outcome:?}"
        );
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
        let next = next_step(&outcome, &record, "ping", "g", &policy, 1, 0.0, 0);
        assert!(
            matches!(next, Next::Retry { ref topic, .. } if topic == "ping.retry.5s"),
            "{next:?}"
        );
    }
}
