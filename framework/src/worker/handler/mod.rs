//! The handler API: a handler is a plain `async fn(job, ctx)`, optionally
//! taking extractors after the context, in axum's style: [`State`] (values
//! registered once on the builder) and [`Ext`] (values a layer put in the
//! attempt's extensions).
//!
//! The room of step 7 in ARCHITECTURE.md, the handler.
//! **Enters:** a record its stages cleared (the pipeline's step 6).
//! **Leaves:** an [`Attempt`](route::Attempt), handled, failed with its
//! error's class, or released: the route (`route`) decodes with the
//! contract's reader schema and runs the layers and the handler under
//! panic capture (`backtrace`) and the timeout; slow attempts show in the
//! `watchdog`; `job_span` is the attempt's log span. The handler API
//! itself, below, is what handler authors see.

pub(in crate::worker) mod backtrace;
pub(in crate::worker) mod job_span;
pub(crate) mod route;
pub(in crate::worker) mod watchdog;

use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::classify::JobError;
use crate::job::JobContext;

/// Values registered once on the builder ([`crate::WorkerBuilder::state`])
/// and handed to every handler that asks for them with [`State`].
#[derive(Clone, Default)]
pub(crate) struct StateMap {
    values: std::collections::HashMap<std::any::TypeId, Arc<dyn std::any::Any + Send + Sync>>,
}

impl StateMap {
    pub(crate) fn insert<S: Clone + Send + Sync + 'static>(&mut self, value: S) {
        self.values
            .insert(std::any::TypeId::of::<S>(), Arc::new(value));
    }

    fn get<S: Clone + 'static>(&self) -> Option<S> {
        self.values
            .get(&std::any::TypeId::of::<S>())
            .and_then(|v| v.downcast_ref::<S>())
            .cloned()
    }

    pub(crate) fn contains(&self, id: std::any::TypeId) -> bool {
        self.values.contains_key(&id)
    }
}

/// What extractors read: the builder's state and the attempt's extensions
/// (set by layers).
pub struct Parts<'a> {
    pub(super) states: &'a StateMap,
    pub(super) extensions: &'a http::Extensions,
}

/// A value a handler can take as an argument after the job and its context,
/// in axum's style: [`State`] and [`Ext`].
pub trait FromParts: Sized + Send + 'static {
    /// Extracts the value for one attempt.
    fn from_parts(parts: &Parts<'_>) -> Result<Self, JobError>;
    /// A state type this extractor needs registered, checked when the
    /// worker is built (so a missing `.state(...)` fails at start, not on
    /// every job).
    fn required_state() -> Option<(std::any::TypeId, &'static str)> {
        None
    }
}

/// Shared state registered once with [`crate::WorkerBuilder::state`]: a
/// pool, a client, a configuration. `S` is cloned per attempt, so wrap
/// large things in an `Arc` (as in axum).
#[derive(Clone, Debug)]
pub struct State<S>(pub S);

impl<S: Clone + Send + Sync + 'static> FromParts for State<S> {
    fn from_parts(parts: &Parts<'_>) -> Result<Self, JobError> {
        parts.states.get::<S>().map(State).ok_or_else(|| {
            JobError::permanent(format!(
                "State<{}> is not registered: call WorkerBuilder::state(...) with it",
                std::any::type_name::<S>()
            ))
        })
    }

    fn required_state() -> Option<(std::any::TypeId, &'static str)> {
        Some((std::any::TypeId::of::<S>(), std::any::type_name::<S>()))
    }
}

/// A value a layer put into the attempt's extensions (a transaction, a
/// tenant scope). A missing one is the layer's bug: the attempt fails as
/// permanent with a message naming the type.
#[derive(Clone, Debug)]
pub struct Ext<T>(pub T);

impl<T: Clone + Send + Sync + 'static> FromParts for Ext<T> {
    fn from_parts(parts: &Parts<'_>) -> Result<Self, JobError> {
        parts
            .extensions
            .get::<T>()
            .cloned()
            .map(Ext)
            .ok_or_else(|| {
                JobError::permanent(format!(
                    "no {} in the attempt's extensions: is the layer that provides it installed?",
                    std::any::type_name::<T>()
                ))
            })
    }
}

/// Anything that can handle jobs of type `J`: a plain
/// `async fn(job, ctx) -> Result<(), JobError>`, optionally taking up to
/// three more arguments that implement [`FromParts`] ([`State`], [`Ext`]).
/// `M` only tells the implementations apart; callers never name it.
pub trait Handler<J, M>: Send + Sync + 'static {
    /// Runs one attempt.
    fn call(
        &self,
        job: J,
        ctx: JobContext,
        parts: &Parts<'_>,
    ) -> BoxFuture<'static, Result<(), JobError>>;

    /// The state types the handler's extractors need.
    fn required_states(&self) -> Vec<(std::any::TypeId, &'static str)> {
        Vec::new()
    }
}

/// A shared handler is a handler (the worker and the test harness can hold
/// the same one).
impl<J, M, H: Handler<J, M>> Handler<J, M> for Arc<H> {
    fn call(
        &self,
        job: J,
        ctx: JobContext,
        parts: &Parts<'_>,
    ) -> BoxFuture<'static, Result<(), JobError>> {
        (**self).call(job, ctx, parts)
    }
    fn required_states(&self) -> Vec<(std::any::TypeId, &'static str)> {
        (**self).required_states()
    }
}

impl<J, F, Fut> Handler<J, (JobContext,)> for F
where
    F: Fn(J, JobContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), JobError>> + Send + 'static,
{
    fn call(
        &self,
        job: J,
        ctx: JobContext,
        _parts: &Parts<'_>,
    ) -> BoxFuture<'static, Result<(), JobError>> {
        Box::pin((self)(job, ctx))
    }
}

macro_rules! handler_with_extractors {
    ($($a:ident),+) => {
        impl<J, F, Fut, $($a),+> Handler<J, (JobContext, $($a,)+)> for F
        where
            F: Fn(J, JobContext, $($a),+) -> Fut + Send + Sync + 'static,
            Fut: Future<Output = Result<(), JobError>> + Send + 'static,
            $($a: FromParts),+
        {
            #[allow(non_snake_case)]
            fn call(
                &self,
                job: J,
                ctx: JobContext,
                parts: &Parts<'_>,
            ) -> BoxFuture<'static, Result<(), JobError>> {
                $(
                    let $a = match $a::from_parts(parts) {
                        Ok(v) => v,
                        Err(e) => return Box::pin(async move { Err(e) }),
                    };
                )+
                Box::pin((self)(job, ctx, $($a),+))
            }

            fn required_states(&self) -> Vec<(std::any::TypeId, &'static str)> {
                [$($a::required_state()),+].into_iter().flatten().collect()
            }
        }
    };
}

handler_with_extractors!(A1);
handler_with_extractors!(A1, A2);
handler_with_extractors!(A1, A2, A3);
