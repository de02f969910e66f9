//! [`HeaderView`]: a record's kjob headers, borrowed from the record.

use std::str::FromStr;

use rdkafka::message::Headers;

use super::*;

/// The kjob headers of a record, borrowed from it: what
/// [`JobHeaders::parse`] reads, without copying a value out or keeping the
/// headers kjob does not know.
///
/// Every attempt reads its record's headers, and the owned form costs an
/// allocation per text header and a struct of about 500 bytes per job.
/// A main-topic job that runs at once (the bulk of the work) needs only
/// this one; a record that may wait before its handler (every retry-tier
/// and delay record, a debounced or strictly ordered one) or names no
/// route is parsed again into the owned form, and so is a record whose
/// attempt makes a span.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct HeaderView<'a> {
    pub(crate) job: Option<&'a str>,
    pub(crate) version: Option<u32>,
    pub(crate) id: Option<&'a str>,
    pub(crate) attempt: Option<u32>,
    pub(crate) due_at_ms: Option<i64>,
    pub(crate) run_at_ms: Option<i64>,
    pub(crate) first_failed_at_ms: Option<i64>,
    pub(crate) error_class: Option<&'a str>,
    pub(crate) error: Option<&'a str>,
    pub(crate) original_topic: Option<&'a str>,
    pub(crate) original_partition: Option<i32>,
    pub(crate) original_offset: Option<i64>,
    pub(crate) original_timestamp_ms: Option<i64>,
    pub(crate) group: Option<&'a str>,
    pub(crate) tenant: Option<&'a str>,
    pub(crate) traceparent: Option<&'a str>,
    pub(crate) tracestate: Option<&'a str>,
    pub(crate) baggage: Option<&'a str>,
    pub(crate) trace_origin: Option<&'a str>,
    pub(crate) batch: Option<&'a str>,
    pub(crate) batch_report: Option<&'a str>,
    /// The last [`ROUTE`] header's value ([`JobHeaders::route`]).
    pub(crate) route: Option<&'a [u8]>,
}

fn number<T: FromStr>(text: Option<&str>) -> Option<T> {
    text.and_then(|t| t.parse().ok())
}

impl<'a> HeaderView<'a> {
    /// Reads a record's headers; the rules are [`JobHeaders::parse`]'s.
    pub(crate) fn parse<H: Headers>(headers: Option<&'a H>) -> Self {
        let mut out = Self::default();
        for h in headers.into_iter().flat_map(|h| h.iter()) {
            out.read(h.key, h.value);
        }
        out
    }

    /// Takes one header. False if [`JobHeaders`] has no field of its own
    /// for it (it keeps it in `extra`), [`ROUTE`] included.
    pub(super) fn read(&mut self, key: &str, value: Option<&'a [u8]>) -> bool {
        let text = value.and_then(|v| std::str::from_utf8(v).ok());
        match key {
            JOB => self.job = text,
            VERSION => self.version = number(text),
            // An empty id is no id: it would collide with every other
            // record that has one.
            ID => self.id = text.filter(|v| !v.trim().is_empty()),
            ATTEMPT => self.attempt = number(text),
            DUE_AT => self.due_at_ms = number(text),
            RUN_AT => self.run_at_ms = number(text),
            FIRST_FAILED_AT => self.first_failed_at_ms = number(text),
            ERROR_CLASS => self.error_class = text,
            ERROR => self.error = text,
            ORIGINAL_TOPIC => self.original_topic = text,
            ORIGINAL_PARTITION => self.original_partition = number(text),
            ORIGINAL_OFFSET => self.original_offset = number(text),
            ORIGINAL_TIMESTAMP => self.original_timestamp_ms = number(text),
            GROUP => self.group = text,
            TENANT => self.tenant = text,
            TRACEPARENT => self.traceparent = text,
            TRACESTATE => self.tracestate = text,
            BAGGAGE => self.baggage = text,
            TRACE_ORIGIN => self.trace_origin = text,
            BATCH => self.batch = text.filter(|v| !v.is_empty()),
            BATCH_REPORT => self.batch_report = text,
            ROUTE => {
                self.route = Some(value.unwrap_or_default());
                return false;
            }
            _ => return false,
        }
        true
    }

    /// The owned form, with `extra` as its other headers.
    pub(super) fn into_job_headers(self, extra: Vec<(String, Vec<u8>)>) -> JobHeaders {
        let owned = |s: Option<&str>| s.map(str::to_string);
        JobHeaders {
            job: owned(self.job),
            version: self.version,
            id: owned(self.id),
            attempt: self.attempt,
            due_at_ms: self.due_at_ms,
            run_at_ms: self.run_at_ms,
            first_failed_at_ms: self.first_failed_at_ms,
            error_class: owned(self.error_class),
            error: owned(self.error),
            original_topic: owned(self.original_topic),
            original_partition: self.original_partition,
            original_offset: self.original_offset,
            original_timestamp_ms: self.original_timestamp_ms,
            group: owned(self.group),
            tenant: owned(self.tenant),
            traceparent: owned(self.traceparent),
            tracestate: owned(self.tracestate),
            baggage: owned(self.baggage),
            trace_origin: owned(self.trace_origin),
            batch: owned(self.batch),
            batch_report: owned(self.batch_report),
            extra,
        }
    }

    /// The job's id; see [`JobHeaders::job_id`].
    pub(crate) fn job_id(&self, topic: &str, partition: i32, offset: i64) -> String {
        if let Some(id) = self.id {
            return id.to_string();
        }
        match (
            self.original_topic,
            self.original_partition,
            self.original_offset,
        ) {
            (Some(t), Some(p), Some(o)) => format!("{t}:{p}:{o}"),
            _ => format!("{topic}:{partition}:{offset}"),
        }
    }
}

impl JobHeaders {
    /// The headers as a [`HeaderView`] of this value.
    pub(crate) fn view(&self) -> HeaderView<'_> {
        HeaderView {
            job: self.job.as_deref(),
            version: self.version,
            id: self.id.as_deref(),
            attempt: self.attempt,
            due_at_ms: self.due_at_ms,
            run_at_ms: self.run_at_ms,
            first_failed_at_ms: self.first_failed_at_ms,
            error_class: self.error_class.as_deref(),
            error: self.error.as_deref(),
            original_topic: self.original_topic.as_deref(),
            original_partition: self.original_partition,
            original_offset: self.original_offset,
            original_timestamp_ms: self.original_timestamp_ms,
            group: self.group.as_deref(),
            tenant: self.tenant.as_deref(),
            traceparent: self.traceparent.as_deref(),
            tracestate: self.tracestate.as_deref(),
            baggage: self.baggage.as_deref(),
            trace_origin: self.trace_origin.as_deref(),
            batch: self.batch.as_deref(),
            batch_report: self.batch_report.as_deref(),
            route: self.route(),
        }
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::message::{Header, OwnedHeaders};

    use super::*;

    #[test]
    fn the_view_reads_what_the_owned_form_reads() {
        let mut owned = OwnedHeaders::new();
        for (key, value) in [
            (JOB, Some(&b"orders.confirmation"[..])),
            (ID, Some(b"  ")),
            (ID, Some(b"j-1")),
            (ATTEMPT, Some(b"x")),
            (ATTEMPT, Some(b"3")),
            (RUN_AT, Some(b"1700")),
            (TENANT, Some(b"\xff\xfe")),
            (BATCH, Some(b"")),
            (ROUTE, Some(b"orders")),
            ("x-app", None),
            (ROUTE, None),
            (
                TRACEPARENT,
                Some(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            ),
        ] {
            owned = owned.insert(Header { key, value });
        }
        let view = HeaderView::parse(Some(&owned));
        let parsed = JobHeaders::parse(Some(&owned));
        assert_eq!(view, parsed.view(), "the same reading either way");
        assert_eq!(view.id, Some("j-1"), "the last id, not the blank one");
        assert_eq!(view.attempt, Some(3));
        assert_eq!(view.tenant, None, "a value that is not UTF-8 is absent");
        assert_eq!(view.batch, None, "an empty batch is none");
        assert_eq!(view.route, Some(&b""[..]), "the last route, null or not");
        assert_eq!(parsed.extra.len(), 2, "the route and x-app stay extra");
        assert_eq!(view.job_id("t", 0, 1), parsed.job_id("t", 0, 1));
        assert_eq!(
            HeaderView::parse::<OwnedHeaders>(None),
            HeaderView::default()
        );
    }

    /// A header name kjob reads, or one it does not.
    const NAMES: [&str; 25] = [
        JOB,
        VERSION,
        ID,
        ATTEMPT,
        DUE_AT,
        RUN_AT,
        FIRST_FAILED_AT,
        ERROR_CLASS,
        ERROR,
        ORIGINAL_TOPIC,
        ORIGINAL_PARTITION,
        ORIGINAL_OFFSET,
        ORIGINAL_TIMESTAMP,
        GROUP,
        TENANT,
        TRACEPARENT,
        TRACESTATE,
        BAGGAGE,
        TRACE_ORIGIN,
        BATCH,
        BATCH_REPORT,
        ROUTE,
        "x-app",
        "b3",
        "",
    ];

    fn value() -> impl proptest::strategy::Strategy<Value = Option<Vec<u8>>> {
        use proptest::prelude::*;
        prop_oneof![
            Just(None),
            Just(Some(Vec::new())),
            Just(Some(b" ".to_vec())),
            (0i64..5_000).prop_map(|n| Some(n.to_string().into_bytes())),
            proptest::collection::vec(any::<u8>(), 0..6).prop_map(Some),
        ]
    }

    /// The rules of `JobHeaders::parse`, stated field by field rather
    /// than header by header: each field is its name's last header (absent
    /// if that value is null, not UTF-8, not a number where one is meant,
    /// a blank id or an empty batch); every other name keeps its last
    /// value, in the order of those last values.
    fn reference(list: &[(&str, Option<&[u8]>)]) -> JobHeaders {
        let last = |name: &str| {
            list.iter()
                .rev()
                .find(|(k, _)| *k == name)
                .and_then(|h| h.1)
        };
        let text = |name: &str| last(name).and_then(|v| std::str::from_utf8(v).ok());
        let string = |name: &str| text(name).map(str::to_string);
        fn num<T: FromStr>(t: Option<&str>) -> Option<T> {
            t?.parse().ok()
        }
        let typed: &[&str] = &NAMES[..21];
        let extra = list
            .iter()
            .enumerate()
            .filter(|(i, (k, _))| {
                !typed.contains(k) && !list[i + 1..].iter().any(|(later, _)| later == k)
            })
            .map(|(_, (k, v))| (k.to_string(), v.unwrap_or_default().to_vec()))
            .collect();
        JobHeaders {
            job: string(JOB),
            version: num(text(VERSION)),
            id: string(ID).filter(|v| !v.trim().is_empty()),
            attempt: num(text(ATTEMPT)),
            due_at_ms: num(text(DUE_AT)),
            run_at_ms: num(text(RUN_AT)),
            first_failed_at_ms: num(text(FIRST_FAILED_AT)),
            error_class: string(ERROR_CLASS),
            error: string(ERROR),
            original_topic: string(ORIGINAL_TOPIC),
            original_partition: num(text(ORIGINAL_PARTITION)),
            original_offset: num(text(ORIGINAL_OFFSET)),
            original_timestamp_ms: num(text(ORIGINAL_TIMESTAMP)),
            group: string(GROUP),
            tenant: string(TENANT),
            traceparent: string(TRACEPARENT),
            tracestate: string(TRACESTATE),
            baggage: string(BAGGAGE),
            trace_origin: string(TRACE_ORIGIN),
            batch: string(BATCH).filter(|v| !v.is_empty()),
            batch_report: string(BATCH_REPORT),
            extra,
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            cases: 2_000, failure_persistence: None, ..Default::default()
        })]

        /// Any list of headers, repeated names, null, blank, numeric and
        /// non-UTF-8 values included, reads the same in place as owned, and
        /// owned as the rules say.
        #[test]
        fn any_headers_read_the_same_in_place_as_owned(
            list in proptest::collection::vec((0..NAMES.len(), value()), 0..12)
        ) {
            let mut owned = OwnedHeaders::new();
            for (name, value) in &list {
                owned = owned.insert(Header { key: NAMES[*name], value: value.as_deref() });
            }
            let parsed = JobHeaders::parse(Some(&owned));
            proptest::prop_assert_eq!(HeaderView::parse(Some(&owned)), parsed.view());
            let named: Vec<(&str, Option<&[u8]>)> =
                list.iter().map(|(n, v)| (NAMES[*n], v.as_deref())).collect();
            proptest::prop_assert_eq!(parsed, reference(&named));
        }
    }
}
