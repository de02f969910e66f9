//! Job spans, created directly with the OpenTelemetry API, named and
//! attributed after the OpenTelemetry semantic conventions for messaging.
//!
//! Only when tracing is on ([`super::init`] with an exporter, or
//! [`super::init_with_provider`]); otherwise every function here is a
//! branch on an atomic and returns an empty [`JobSpan`]. Direct spans cost
//! about half of what the `tracing` bridge costs per attempt, and a span the
//! sampler drops costs almost nothing.
//!
//! * An enqueue is a producer span `send <topic>` (`create <topic>` for an
//!   outbox row, written to Kafka later by the relay), child of the
//!   caller's current context.
//! * An attempt is a consumer span `process <main topic>`: the route's main
//!   topic also for an attempt read from a retry tier or a delay bucket
//!   (the topic actually read is then in `kjob.topic`; the partition and
//!   offset are that record's).
//! * The first attempt of a job read from its main topic continues the
//!   enqueue's trace: its parent is the enqueue's span, and it links to it
//!   too (`kjob.link=enqueue`), as the conventions ask of every consumer
//!   span. Every other attempt (from a retry tier, a delay bucket, or a
//!   dead letter re-driven to the main topic) starts a trace of its own, so
//!   a job that waits days for its retry does not make a trace days long:
//!   it links to the span that forwarded it (`kjob.link=previous_attempt`,
//!   the failed attempt, from the record's propagation headers) and to the
//!   job's enqueue (`kjob.link=enqueue`, from `kjob-trace-origin`). A
//!   delayed job's hops through the delay buckets make no spans, so its
//!   first attempt links to the enqueue alone.
//! * The baggage the record carries is in the attempt's context either way,
//!   so the handler reads it and forwards pass it on.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::baggage::{Baggage, BaggageExt, KeyValueMetadata};
use opentelemetry::trace::{
    Link, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer,
};
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

/// `server.address` and `server.port` of the first bootstrap server: the
/// broker a client first talks to (which broker leads a partition is not
/// known to the span). Empty when the list is empty.
pub(crate) fn server_attributes(bootstrap: &str) -> Vec<KeyValue> {
    let Some(first) = bootstrap.split(',').map(str::trim).find(|s| !s.is_empty()) else {
        return Vec::new();
    };
    // A listener name (`SASL_SSL://host:9093`) is not part of the address.
    let first = first.rsplit("://").next().unwrap_or(first);
    let (host, port) = match first.strip_prefix('[') {
        // `[::1]:9092`
        Some(v6) => match v6.split_once(']') {
            Some((host, rest)) => (host, rest.strip_prefix(':')),
            None => (first, None),
        },
        None => match first.rsplit_once(':') {
            // A bare IPv6 address has more than one colon and no port.
            Some((host, port)) if !host.contains(':') => (host, Some(port)),
            _ => (first, None),
        },
    };
    let mut out = vec![KeyValue::new("server.address", host.to_string())];
    if let Some(port) = port.and_then(|p| p.parse::<u16>().ok()) {
        out.push(KeyValue::new("server.port", i64::from(port)));
    }
    out
}

/// Which of its job's spans a link points to (`kjob.link`).
const LINK: &str = "kjob.link";

/// A job span (or nothing, when tracing is off). Ends when dropped.
pub(crate) struct JobSpan {
    cx: Option<Context>,
    /// The span that created the job, written to `kjob-trace-origin` on a
    /// forward. For a producer span, none: the span itself is the origin,
    /// and the record's `traceparent` names it.
    origin: Option<SpanContext>,
}

impl JobSpan {
    /// No span.
    pub(crate) fn none() -> Self {
        Self {
            cx: None,
            origin: None,
        }
    }

    fn start(
        name: String,
        kind: SpanKind,
        parent: Context,
        attributes: Vec<KeyValue>,
        links: Vec<Link>,
    ) -> Context {
        let tracer = opentelemetry::global::tracer("kjob");
        let span = tracer
            .span_builder(Cow::Owned(name))
            .with_kind(kind)
            .with_attributes(attributes)
            .with_links(links)
            .start_with_context(&tracer, &parent);
        parent.with_span(span)
    }

    /// A producer span `<operation> <topic>` for an enqueue, child of the
    /// current context.
    pub(crate) fn producer(
        operation: &'static str,
        topic: &str,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Self {
        if !enabled() {
            return Self::none();
        }
        let cx = Self::start(
            format!("{operation} {topic}"),
            SpanKind::Producer,
            Context::current(),
            attributes(),
            Vec::new(),
        );
        Self {
            cx: Some(cx),
            origin: None,
        }
    }

    /// The consumer span `process <main>` of one attempt. `continues`: the
    /// record is the enqueue's own (read from its main topic, never
    /// forwarded), so the attempt continues its trace; otherwise the
    /// attempt starts a trace of its own, linked to the span that forwarded
    /// it and to the job's enqueue (see the module docs).
    pub(crate) fn consumer<'h>(
        headers: impl FnOnce() -> std::borrow::Cow<'h, JobHeaders>,
        main: &str,
        continues: bool,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Self {
        if !enabled() {
            return Self::none();
        }
        let headers = headers();
        let carried = super::extract(&headers);
        let forwarded_by = Some(carried.span().span_context().clone()).filter(|c| c.is_valid());
        let link = |cx: &SpanContext, what: &'static str| {
            Link::new(cx.clone(), vec![KeyValue::new(LINK, what)], 0)
        };
        let name = format!("process {main}");
        let (parent, links, origin) = if continues {
            let links = forwarded_by.iter().map(|c| link(c, "enqueue")).collect();
            (carried, links, forwarded_by)
        } else {
            // A new root that keeps the record's baggage.
            let baggage: Baggage = carried
                .baggage()
                .iter()
                .map(|(k, (v, meta))| KeyValueMetadata::new(k.clone(), v.clone(), meta.clone()))
                .collect();
            let root = Context::new().with_baggage(baggage);
            let origin = headers
                .trace_origin
                .as_deref()
                .and_then(parse_traceparent)
                .filter(|o| forwarded_by.as_ref() != Some(o));
            let links = match (&forwarded_by, &origin) {
                (Some(by), Some(origin)) => {
                    vec![link(by, "previous_attempt"), link(origin, "enqueue")]
                }
                // Without an origin header, nothing has forwarded the job
                // since its enqueue (a delayed job's first run): the
                // context it carries is the enqueue's.
                (Some(by), None) => vec![link(by, "enqueue")],
                (None, Some(origin)) => vec![link(origin, "enqueue")],
                (None, None) => Vec::new(),
            };
            (root, links, origin.or(forwarded_by))
        };
        let cx = Self::start(name, SpanKind::Consumer, parent, attributes(), links);
        // A job whose enqueue was not traced: this attempt is the first span
        // of it that there is, and later attempts link to it.
        let origin = origin.or_else(|| Some(cx.span().span_context().clone()));
        Self {
            cx: Some(cx),
            origin,
        }
    }

    /// The span's context, to run the handler under (so spans the handler
    /// creates are its children).
    pub(crate) fn context(&self) -> Option<&Context> {
        self.cx.as_ref()
    }

    /// Writes this span's context (and its baggage) into forwarded headers
    /// through the configured propagators, and the job's origin span into
    /// `kjob-trace-origin`, so the next attempt can link to both.
    pub(crate) fn inject(&self, headers: &mut JobHeaders) {
        if let Some(cx) = &self.cx {
            super::inject(cx, headers);
            if let Some(origin) = self.origin.as_ref().filter(|o| o.is_valid()) {
                headers.trace_origin = Some(format_traceparent(origin));
            }
        }
    }

    /// Adds an attribute (e.g. the acknowledged offset).
    pub(crate) fn set(&self, kv: KeyValue) {
        if let Some(cx) = &self.cx {
            cx.span().set_attribute(kv);
        }
    }

    /// Marks the span failed: status Error with `message`, and
    /// `error.type` = `error_type`, a low-cardinality class of the failure
    /// (kjob's error class for an attempt, such as `retryable.server` or
    /// `bug.panic`).
    pub(crate) fn fail(&self, error_type: &'static str, message: &str) {
        if let Some(cx) = &self.cx {
            let span = cx.span();
            span.set_attribute(KeyValue::new("error.type", error_type));
            span.set_status(Status::error(message.to_string()));
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

/// `00-<trace id>-<span id>-<flags>`, the W3C `traceparent` form.
fn format_traceparent(cx: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        cx.trace_id(),
        cx.span_id(),
        cx.trace_flags().to_u8()
    )
}

/// The span context in a W3C `traceparent` value; `None` if malformed.
fn parse_traceparent(value: &str) -> Option<SpanContext> {
    let mut parts = value.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version != "00" || parts.next().is_some() || trace.len() != 32 || span.len() != 16 {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let cx = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        TraceFlags::new(flags & TraceFlags::SAMPLED.to_u8()),
        true,
        TraceState::default(),
    );
    cx.is_valid().then_some(cx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(kvs: &[KeyValue]) -> Vec<(String, String)> {
        kvs.iter()
            .map(|kv| (kv.key.to_string(), kv.value.to_string()))
            .collect()
    }

    #[test]
    fn the_first_bootstrap_server_is_the_server() {
        let pair = |h: &str, p: &str| {
            vec![
                ("server.address".into(), h.into()),
                ("server.port".into(), p.into()),
            ]
        };
        assert_eq!(
            attrs(&server_attributes("127.0.0.1:9092")),
            pair("127.0.0.1", "9092")
        );
        assert_eq!(
            attrs(&server_attributes(" kafka-1:9093, kafka-2:9093")),
            pair("kafka-1", "9093")
        );
        assert_eq!(attrs(&server_attributes("[::1]:9092")), pair("::1", "9092"));
        assert_eq!(
            attrs(&server_attributes("SASL_SSL://broker:9094")),
            pair("broker", "9094")
        );
        assert_eq!(
            attrs(&server_attributes("broker")),
            vec![("server.address".to_string(), "broker".to_string())]
        );
        assert!(server_attributes("").is_empty());
    }

    #[test]
    fn the_origin_header_round_trips() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let cx = parse_traceparent(tp).expect("valid");
        assert!(cx.is_sampled() && cx.is_remote());
        assert_eq!(format_traceparent(&cx), tp);
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-zz",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad:?}");
        }
    }
}
