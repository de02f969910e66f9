//! Job spans, created directly with the OpenTelemetry API.
//!
//! Only when tracing is on ([`super::init`] with an exporter, or
//! [`super::init_with_provider`]); otherwise every function here is a
//! branch on an atomic and returns an empty [`JobSpan`]. Direct spans cost
//! about half of what the `tracing` bridge costs per attempt, and a span the
//! sampler drops costs almost nothing.

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};

use crate::headers::JobHeaders;

static ON: AtomicBool = AtomicBool::new(false);

/// Turns job spans on (called once a tracer provider is installed).
pub(crate) fn enable() {
    ON.store(true, Ordering::Release);
}

/// Whether job spans are being recorded.
pub(crate) fn enabled() -> bool {
    ON.load(Ordering::Acquire)
}

/// A job span (or nothing, when tracing is off). Ends when dropped.
pub(crate) struct JobSpan {
    cx: Option<Context>,
}

impl JobSpan {
    /// No span.
    pub(crate) fn none() -> Self {
        Self { cx: None }
    }

    fn start(
        name: &'static str,
        kind: SpanKind,
        parent: &Context,
        attributes: Vec<KeyValue>,
    ) -> Self {
        let tracer = opentelemetry::global::tracer("kjob");
        let span = tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes)
            .start_with_context(&tracer, parent);
        Self {
            cx: Some(parent.with_span(span)),
        }
    }

    /// A producer span for an enqueue, child of the current context.
    pub(crate) fn producer(attributes: impl FnOnce() -> Vec<KeyValue>) -> Self {
        if !enabled() {
            return Self::none();
        }
        Self::start(
            "kjob.enqueue",
            SpanKind::Producer,
            &Context::current(),
            attributes(),
        )
    }

    /// A consumer span for one attempt, continuing the trace in `headers`.
    pub(crate) fn consumer(
        headers: &JobHeaders,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Self {
        if !enabled() {
            return Self::none();
        }
        Self::start(
            "kjob.handle",
            SpanKind::Consumer,
            &super::extract(headers),
            attributes(),
        )
    }

    /// The span's context, to run the handler under (so spans the handler
    /// creates are its children).
    pub(crate) fn context(&self) -> Option<&Context> {
        self.cx.as_ref()
    }

    /// Writes this span's trace context into forwarded headers, so the next
    /// hop continues the trace.
    pub(crate) fn inject(&self, headers: &mut JobHeaders) {
        if let Some(cx) = &self.cx {
            super::inject(cx, headers);
        }
    }

    /// Adds an attribute (e.g. the acknowledged offset).
    pub(crate) fn set(&self, kv: KeyValue) {
        if let Some(cx) = &self.cx {
            cx.span().set_attribute(kv);
        }
    }

    /// Marks the span failed.
    pub(crate) fn fail(&self, message: &str) {
        if let Some(cx) = &self.cx {
            cx.span().set_status(Status::error(message.to_string()));
        }
    }
}

impl Drop for JobSpan {
    fn drop(&mut self) {
        if let Some(cx) = &self.cx {
            cx.span().end();
        }
    }
}
