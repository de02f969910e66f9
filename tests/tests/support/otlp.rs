//! What the OTLP receiver tests share: reading the received spans.

#![allow(dead_code)] // Each test binary uses its own part.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::span::Link;
use opentelemetry_proto::tonic::trace::v1::Span;

/// The spans of one export request.
pub fn spans_of(request: ExportTraceServiceRequest) -> impl Iterator<Item = Span> {
    request
        .resource_spans
        .into_iter()
        .flat_map(|rs| rs.scope_spans)
        .flat_map(|ss| ss.spans)
}

fn value_of(attributes: &[KeyValue], key: &str) -> Option<Value> {
    attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref()?.value.clone())
}

/// An attribute as text, whatever its type.
pub fn attr(span: &Span, key: &str) -> Option<String> {
    text(value_of(&span.attributes, key)?)
}

/// An attribute that must be a string (not a number written as one).
pub fn string_attr(span: &Span, key: &str) -> Option<String> {
    match value_of(&span.attributes, key)? {
        Value::StringValue(s) => Some(s),
        other => panic!("{key} of `{}` is {other:?}, not a string", span.name),
    }
}

/// A link's attribute as text.
pub fn link_attr(link: &Link, key: &str) -> Option<String> {
    text(value_of(&link.attributes, key)?)
}

fn text(v: Value) -> Option<String> {
    match v {
        Value::StringValue(s) => Some(s),
        Value::IntValue(i) => Some(i.to_string()),
        Value::BoolValue(b) => Some(b.to_string()),
        Value::DoubleValue(d) => Some(d.to_string()),
        _ => None,
    }
}

/// The span names received, for failure messages.
pub fn names(spans: &[Span]) -> Vec<&str> {
    spans.iter().map(|s| s.name.as_str()).collect()
}
