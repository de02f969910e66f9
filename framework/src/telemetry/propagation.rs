//! Trace context in record headers, through the propagators that the
//! standard `OTEL_PROPAGATORS` variable names.
//!
//! The value is a comma-separated list, read once (by
//! [`super::init`]/[`super::init_with_provider`], or on the first
//! [`super::inject`]/[`super::extract`]):
//!
//! | value | headers |
//! |---|---|
//! | `tracecontext` | W3C `traceparent`, `tracestate` |
//! | `baggage` | W3C `baggage` |
//! | `b3` | B3 single header `b3` (cargo feature `b3`, on by default) |
//! | `b3multi` | B3 `x-b3-traceid`, `x-b3-spanid`, `x-b3-sampled`, `x-b3-flags` (feature `b3`) |
//! | `none` | nothing: no trace context travels |
//!
//! Unset or empty, it is `tracecontext,baggage`, the specification's
//! default. A value kjob does not support (`jaeger`, `xray`, `ottrace`, a
//! typo, `b3` without the feature) is skipped with a warning that names it,
//! rather than failing the binary over an observability setting; if nothing
//! usable is left, the default applies and the warning says so.
//!
//! The carrier is the record's headers ([`JobHeaders`]): `traceparent`,
//! `tracestate` and `baggage` have fields of their own, any other
//! propagator's headers live in [`JobHeaders::extra`]. Every hop rebuilds
//! the header set from a [`JobHeaders`], so all of them travel on retry,
//! delay and DLQ hops. Injecting first clears every header the configured
//! propagators own, so a forward never carries a stale value beside the new
//! one.

use std::sync::OnceLock;

use opentelemetry::propagation::{
    Extractor, Injector, TextMapCompositePropagator, TextMapPropagator,
};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};

use crate::headers::{JobHeaders, BAGGAGE, TRACEPARENT, TRACESTATE};

/// The standard variable naming the propagators.
pub(crate) const OTEL_PROPAGATORS: &str = "OTEL_PROPAGATORS";

/// A propagator kjob can build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// W3C trace context.
    TraceContext,
    /// W3C baggage.
    Baggage,
    /// B3, one `b3` header.
    B3,
    /// B3, one header per field.
    B3Multi,
}

/// What an `OTEL_PROPAGATORS` value asks for.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Choice {
    /// The propagators to use, in the order given, without repeats.
    pub(crate) kinds: Vec<Kind>,
    /// Each value that was skipped, with why; one warning apiece.
    pub(crate) skipped: Vec<(String, &'static str)>,
    /// Nothing usable was named (and `none` was not either): the default
    /// stands in.
    pub(crate) defaulted: bool,
}

impl Choice {
    /// Parses an `OTEL_PROPAGATORS` value (`None`: the variable is unset).
    pub(crate) fn parse(value: Option<&str>) -> Self {
        let mut choice = Choice::default();
        let mut none = false;
        for name in value.unwrap_or("").split(',').map(str::trim) {
            let kind = match name.to_ascii_lowercase().as_str() {
                "" => continue,
                "none" => {
                    none = true;
                    continue;
                }
                "tracecontext" => Kind::TraceContext,
                "baggage" => Kind::Baggage,
                "b3" | "b3multi" if !cfg!(feature = "b3") => {
                    choice.skipped.push((
                        name.to_string(),
                        "this build of kjob has no B3 propagator (enable its `b3` cargo feature)",
                    ));
                    continue;
                }
                "b3" => Kind::B3,
                "b3multi" => Kind::B3Multi,
                "jaeger" | "xray" | "ottrace" => {
                    choice
                        .skipped
                        .push((name.to_string(), "kjob does not support this propagator"));
                    continue;
                }
                _ => {
                    choice.skipped.push((
                        name.to_string(),
                        "unknown propagator (known: tracecontext, baggage, b3, b3multi, none)",
                    ));
                    continue;
                }
            };
            if !choice.kinds.contains(&kind) {
                choice.kinds.push(kind);
            }
        }
        if none {
            // `none` wins over anything listed with it, as the
            // specification has it.
            choice.kinds.clear();
        } else if choice.kinds.is_empty() {
            choice.defaulted = value.is_some_and(|v| !v.trim().is_empty());
            choice.kinds = vec![Kind::TraceContext, Kind::Baggage];
        }
        choice
    }

    /// The composite propagator of the chosen kinds.
    pub(crate) fn build(&self) -> TextMapCompositePropagator {
        let parts = self
            .kinds
            .iter()
            .map(|kind| -> Box<dyn TextMapPropagator + Send + Sync> {
                match kind {
                    Kind::TraceContext => Box::new(TraceContextPropagator::new()),
                    Kind::Baggage => Box::new(BaggagePropagator::new()),
                    #[cfg(feature = "b3")]
                    Kind::B3 => Box::new(opentelemetry_propagator_b3::Propagator::with_encoding(
                        opentelemetry_propagator_b3::B3Encoding::SingleHeader,
                    )),
                    #[cfg(feature = "b3")]
                    Kind::B3Multi => {
                        Box::new(opentelemetry_propagator_b3::Propagator::with_encoding(
                            opentelemetry_propagator_b3::B3Encoding::MultipleHeader,
                        ))
                    }
                    // `parse` never chooses B3 without the feature.
                    #[cfg(not(feature = "b3"))]
                    Kind::B3 | Kind::B3Multi => Box::new(TextMapCompositePropagator::new(vec![])),
                }
            })
            .collect();
        TextMapCompositePropagator::new(parts)
    }

    /// Logs one warning per skipped value (once a subscriber is installed,
    /// so that the warnings are seen).
    pub(crate) fn warn(&self) {
        for (name, why) in &self.skipped {
            tracing::warn!(
                propagator = %name,
                "{OTEL_PROPAGATORS}: `{name}` ignored: {why}"
            );
        }
        if self.defaulted {
            tracing::warn!(
                "{OTEL_PROPAGATORS} named no propagator kjob supports; using tracecontext,baggage"
            );
        }
    }
}

/// The choice `OTEL_PROPAGATORS` makes now.
pub(crate) fn from_env() -> Choice {
    Choice::parse(std::env::var(OTEL_PROPAGATORS).ok().as_deref())
}

static CONFIGURED: OnceLock<TextMapCompositePropagator> = OnceLock::new();

/// The process's propagator: `OTEL_PROPAGATORS` as it was at first use.
pub(crate) fn configured() -> &'static TextMapCompositePropagator {
    CONFIGURED.get_or_init(|| from_env().build())
}

/// Writes `cx` into `headers` through `propagator`, after clearing every
/// header it owns.
pub(crate) fn inject_with(
    propagator: &dyn TextMapPropagator,
    cx: &Context,
    headers: &mut JobHeaders,
) {
    let fields: Vec<String> = propagator.fields().map(str::to_string).collect();
    for field in &fields {
        HeaderCarrier(headers).clear(field);
    }
    propagator.inject_context(cx, &mut HeaderCarrier(headers));
}

/// Reads a context from `headers` through `propagator`.
pub(crate) fn extract_with(propagator: &dyn TextMapPropagator, headers: &JobHeaders) -> Context {
    propagator.extract(&HeaderReader(headers))
}

/// [`JobHeaders`] as an injection carrier.
struct HeaderCarrier<'a>(&'a mut JobHeaders);

impl HeaderCarrier<'_> {
    fn clear(&mut self, key: &str) {
        match key {
            TRACEPARENT => self.0.traceparent = None,
            TRACESTATE => self.0.tracestate = None,
            BAGGAGE => self.0.baggage = None,
            other => self.0.extra.retain(|(k, _)| !k.eq_ignore_ascii_case(other)),
        }
    }
}

impl Injector for HeaderCarrier<'_> {
    fn set(&mut self, key: &str, value: String) {
        // An empty `tracestate` or `baggage` says nothing: no header.
        let value = Some(value).filter(|v| !v.is_empty());
        match key {
            TRACEPARENT => self.0.traceparent = value,
            TRACESTATE => self.0.tracestate = value,
            BAGGAGE => self.0.baggage = value,
            other => {
                self.clear(other);
                if let Some(v) = value {
                    self.0.extra.push((other.to_string(), v.into_bytes()));
                }
            }
        }
    }
}

/// [`JobHeaders`] as an extraction carrier. Kafka header names are case
/// sensitive, but other producers spell B3's (`X-B3-TraceId`) as HTTP
/// does: an extra header matches its name in any case.
struct HeaderReader<'a>(&'a JobHeaders);

impl Extractor for HeaderReader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            TRACEPARENT => self.0.traceparent.as_deref(),
            TRACESTATE => self.0.tracestate.as_deref(),
            BAGGAGE => self.0.baggage.as_deref(),
            other => self
                .0
                .extra
                .iter()
                .rev()
                .find(|(k, _)| k.eq_ignore_ascii_case(other))
                .and_then(|(_, v)| std::str::from_utf8(v).ok()),
        }
    }

    fn keys(&self) -> Vec<&str> {
        let typed = [
            (TRACEPARENT, self.0.traceparent.is_some()),
            (TRACESTATE, self.0.tracestate.is_some()),
            (BAGGAGE, self.0.baggage.is_some()),
        ];
        typed
            .into_iter()
            .filter(|(_, set)| *set)
            .map(|(k, _)| k)
            .chain(self.0.extra.iter().map(|(k, _)| k.as_str()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::baggage::BaggageExt;
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use opentelemetry::KeyValue;

    use super::*;

    fn remote() -> Context {
        Context::new().with_remote_span_context(SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        ))
    }

    #[test]
    fn the_default_is_tracecontext_and_baggage() {
        for value in [None, Some(""), Some(" ")] {
            let c = Choice::parse(value);
            assert_eq!(c.kinds, vec![Kind::TraceContext, Kind::Baggage]);
            assert!(c.skipped.is_empty() && !c.defaulted);
        }
    }

    #[test]
    fn unknown_and_unsupported_values_are_named_and_skipped() {
        let c = Choice::parse(Some("tracecontext, jaeger,TraceContext,w3c"));
        assert_eq!(c.kinds, vec![Kind::TraceContext]);
        let names: Vec<&str> = c.skipped.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["jaeger", "w3c"]);
        let c = Choice::parse(Some("xray"));
        assert!(c.defaulted, "nothing usable: the default, with a warning");
        assert_eq!(c.kinds, vec![Kind::TraceContext, Kind::Baggage]);
        let c = Choice::parse(Some("none,tracecontext"));
        assert!(c.kinds.is_empty() && !c.defaulted, "none wins");
    }

    #[test]
    fn baggage_and_trace_context_round_trip_and_replace_stale_values() {
        let p = Choice::parse(Some("tracecontext,baggage")).build();
        let cx = remote().with_baggage(vec![KeyValue::new("tenant", "acme")]);
        let mut h = JobHeaders {
            tracestate: Some("stale=1".into()),
            ..Default::default()
        };
        inject_with(&p, &cx, &mut h);
        assert_eq!(
            h.traceparent.as_deref(),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        assert_eq!(
            h.tracestate, None,
            "the old state is not kept beside the new"
        );
        assert_eq!(h.baggage.as_deref(), Some("tenant=acme"));
        let back = extract_with(&p, &h);
        assert_eq!(
            back.span().span_context().span_id(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap()
        );
        assert_eq!(
            back.baggage().get("tenant").map(|v| v.as_str()),
            Some("acme")
        );
        // No propagators: nothing written, nothing read.
        let none = Choice::parse(Some("none")).build();
        let mut empty = JobHeaders::default();
        inject_with(&none, &cx, &mut empty);
        assert_eq!(empty, JobHeaders::default());
        assert!(!extract_with(&none, &h).span().span_context().is_valid());
    }

    #[cfg(feature = "b3")]
    #[test]
    fn b3_headers_travel_in_the_extras_and_are_read_in_any_case() {
        let single = Choice::parse(Some("b3")).build();
        let mut h = JobHeaders::default();
        inject_with(&single, &remote(), &mut h);
        assert_eq!(h.traceparent, None);
        let b3 = h
            .extra
            .iter()
            .find(|(k, _)| k == "b3")
            .expect("a b3 header");
        assert!(std::str::from_utf8(&b3.1)
            .unwrap()
            .starts_with("4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1"));
        // Injecting again replaces the header, never adds a second one.
        inject_with(&single, &remote(), &mut h);
        assert_eq!(h.extra.iter().filter(|(k, _)| k == "b3").count(), 1);

        let multi = Choice::parse(Some("b3multi")).build();
        let spelled_as_http = JobHeaders {
            extra: vec![
                (
                    "X-B3-TraceId".into(),
                    b"4bf92f3577b34da6a3ce929d0e0e4736".to_vec(),
                ),
                ("X-B3-SpanId".into(), b"00f067aa0ba902b7".to_vec()),
                ("X-B3-Sampled".into(), b"1".to_vec()),
            ],
            ..Default::default()
        };
        let cx = extract_with(&multi, &spelled_as_http);
        assert_eq!(
            cx.span().span_context().trace_id(),
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
        );
    }
}
