//! A job's spans after the OpenTelemetry messaging conventions, exported
//! over OTLP/gRPC (configured by the standard `OTEL_*` variables) and
//! received by a real OTLP receiver: a gRPC server decoding the protobuf,
//! here in the test. enqueue → handle (fails) → retry tier → handle: the
//! first attempt continues the enqueue's trace, the retried one starts its
//! own, linked to the failed attempt and to the enqueue; a handler's own
//! `tracing` span (another crate's target) nests under its attempt; W3C
//! baggage (`OTEL_PROPAGATORS=tracecontext,baggage`) reaches both attempts.
//! Its own test binary, because the tracing subscriber and the variables
//! are process-wide.

#[path = "support/otlp.rs"]
mod otlp;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kjob::retry::RetryPolicy;
use kjob::{JobContext, JobError, Producer, Worker, WorkerStats};
use kjob_integration_tests::*;
use opentelemetry::baggage::BaggageExt as _;
use opentelemetry::trace::FutureExt as _;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::Span;
use otlp::{attr, link_attr, names, spans_of, string_attr};
use tokio::sync::oneshot;

#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.spans
            .lock()
            .unwrap()
            .extend(spans_of(request.into_inner()));
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// (attempt, the `tenant` baggage entry it saw).
type Seen = Arc<Mutex<Vec<(u32, Option<String>)>>>;

/// The target of the handler's own span: not kjob's, as a handler crate's.
const HANDLER_TARGET: &str = "acme_billing";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_spans_follow_the_messaging_conventions_and_link_across_a_retry() {
    let config = ensure_stack();
    // The OTLP receiver.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let receiver = Receiver::default();
    let spans = receiver.spans.clone();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(receiver))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );

    // Standard OTEL_* configuration, then kjob's telemetry init.
    // SAFETY of set_var: this test binary has one test, set before any thread reads the env.
    std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}"));
    std::env::set_var("OTEL_SERVICE_NAME", "kjob-tracing-test");
    std::env::set_var("OTEL_PROPAGATORS", "tracecontext,baggage");
    // kjob's own logs at warn; the handler crate's spans pass.
    std::env::set_var("RUST_LOG", format!("warn,{HANDLER_TARGET}=info"));
    let guard = kjob::telemetry::init().expect("telemetry init");
    assert!(guard.exporting());

    let topic = unique("trace");
    let group = unique("g");
    create_topic(&config, &topic, 1).await;
    // The baggage each attempt saw.
    let seen: Seen = Arc::default();
    let seen_in_handler = seen.clone();
    let w = Worker::builder(config.clone(), &group)
        .handle_on(&topic, move |_j: TestJob, ctx: JobContext| {
            let seen = seen_in_handler.clone();
            async move {
                let tenant = opentelemetry::Context::current()
                    .baggage()
                    .get("tenant")
                    .map(|v| v.to_string());
                seen.lock().unwrap().push((ctx.attempt, tenant));
                // The handler crate's own span, as `#[instrument]` makes.
                let _charge =
                    tracing::info_span!(target: HANDLER_TARGET, "charge card", attempt = ctx.attempt)
                        .entered();
                if ctx.attempt == 1 {
                    Err(JobError::server("503 on the first attempt"))
                } else {
                    Ok(())
                }
            }
        })
        .retry(RetryPolicy::tiers([Duration::from_secs(1)]))
        .build()
        .unwrap();
    let stats = w.stats();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(w.run_until(async {
        let _ = rx.await;
    }));
    let producer = Producer::new(&config).unwrap();
    let with_baggage = opentelemetry::Context::new()
        .with_baggage(vec![opentelemetry::KeyValue::new("tenant", "acme")]);
    let enqueued = producer
        .enqueue_to(&topic, &TestJob::ok("k", 1))
        .with_context(with_baggage)
        .await
        .unwrap();
    eventually(Duration::from_secs(30), "handled on the retry", || {
        WorkerStats::get(&stats.handled) == 1
    })
    .await;
    let _ = tx.send(());
    task.await.unwrap().unwrap();
    drop(guard); // flushes the batch exporter

    // Baggage: enqueue → handle, and on through the retry tier's record.
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(1, Some("acme".to_string())), (2, Some("acme".to_string()))]
    );
    let main_record = read_all(&config, &topic).remove(0);
    let baggage = kjob::headers::JobHeaders::parse(rdkafka::Message::headers(&main_record)).baggage;
    assert_eq!(baggage.as_deref(), Some("tenant=acme"));

    let spans = spans.lock().unwrap().clone();
    let of_job =
        |s: &&Span| attr(s, "messaging.message.id").as_deref() == Some(enqueued.id.as_str());
    let send = format!("send {topic}");
    let enqueue = spans
        .iter()
        .filter(of_job)
        .find(|s| s.name == send)
        .unwrap_or_else(|| panic!("no `{send}` among {:?}", names(&spans)));
    let process = format!("process {topic}");
    let handles: Vec<&Span> = spans
        .iter()
        .filter(of_job)
        .filter(|s| s.name == process)
        .collect();
    assert_eq!(
        handles.len(),
        2,
        "one `{process}` per attempt: {:?}",
        names(&spans)
    );
    let attempt = |n: &str| {
        *handles
            .iter()
            .find(|s| attr(s, "kjob.attempt").as_deref() == Some(n))
            .unwrap_or_else(|| panic!("attempt {n}"))
    };
    let (first, second) = (attempt("1"), attempt("2"));

    // The producer span.
    assert_eq!(enqueue.kind, SpanKind::Producer as i32);
    let server = config.bootstrap_servers.split(',').next().unwrap();
    let (host, port) = server.rsplit_once(':').unwrap();
    for (key, want) in [
        ("messaging.system", "kafka"),
        ("messaging.operation.name", "send"),
        ("messaging.operation.type", "send"),
        ("messaging.destination.name", topic.as_str()),
        ("messaging.destination.partition.id", "0"),
        ("messaging.kafka.message.key", "k"),
        ("kjob.job", "kjob.test.job"),
        ("server.address", host),
    ] {
        assert_eq!(
            string_attr(enqueue, key).as_deref(),
            Some(want),
            "send: {key}"
        );
    }
    assert_eq!(attr(enqueue, "server.port").as_deref(), Some(port));
    assert_eq!(
        attr(enqueue, "messaging.kafka.offset").as_deref(),
        Some("0")
    );

    // Both consumer spans name the main topic and carry the conventions'
    // attributes.
    for span in [first, second] {
        assert_eq!(span.kind, SpanKind::Consumer as i32);
        for (key, want) in [
            ("messaging.system", "kafka"),
            ("messaging.operation.name", "process"),
            ("messaging.operation.type", "process"),
            ("messaging.destination.name", topic.as_str()),
            ("messaging.destination.partition.id", "0"),
            ("messaging.kafka.message.key", "k"),
            ("messaging.consumer.group.name", group.as_str()),
            ("server.address", host),
        ] {
            assert_eq!(
                string_attr(span, key).as_deref(),
                Some(want),
                "{} attempt {:?}: {key}",
                span.name,
                attr(span, "kjob.attempt")
            );
        }
    }
    assert_eq!(attr(first, "messaging.kafka.offset").as_deref(), Some("0"));
    assert_eq!(attr(first, "kjob.topic"), None, "read from the main topic");
    assert_eq!(
        attr(second, "kjob.topic").as_deref(),
        Some(format!("{topic}.retry.1s").as_str()),
        "the topic actually read"
    );

    // The failed attempt: error.type and status Error; the retry succeeded.
    assert_eq!(
        attr(first, "error.type").as_deref(),
        Some("retryable.server")
    );
    let code = |s: &Span| s.status.as_ref().map(|st| st.code).unwrap_or_default();
    assert_eq!(code(first), StatusCode::Error as i32);
    assert_ne!(code(second), StatusCode::Error as i32);
    assert_eq!(attr(second, "error.type"), None);

    // The first attempt continues the enqueue's trace (parent) and links to
    // it, as the conventions ask.
    assert_eq!(first.trace_id, enqueue.trace_id);
    assert_eq!(first.parent_span_id, enqueue.span_id);
    assert_eq!(first.links.len(), 1);
    assert_eq!(first.links[0].span_id, enqueue.span_id);
    assert_eq!(
        link_attr(&first.links[0], "kjob.link").as_deref(),
        Some("enqueue")
    );

    // The retried attempt is a trace of its own: linked, not parented, to
    // the attempt that forwarded it, and linked to the enqueue.
    assert_ne!(second.trace_id, enqueue.trace_id, "a new trace");
    assert!(second.parent_span_id.is_empty(), "a root span");
    let link_to = |target: &Span| {
        second
            .links
            .iter()
            .find(|l| l.trace_id == target.trace_id && l.span_id == target.span_id)
            .unwrap_or_else(|| panic!("no link to `{}` in {:?}", target.name, second.links))
    };
    assert_eq!(
        link_attr(link_to(first), "kjob.link").as_deref(),
        Some("previous_attempt")
    );
    assert_eq!(
        link_attr(link_to(enqueue), "kjob.link").as_deref(),
        Some("enqueue")
    );
    assert_eq!(second.links.len(), 2);

    // The handler's own span (target `acme_billing`) reached the receiver,
    // a child of its attempt.
    let charges: Vec<&Span> = spans.iter().filter(|s| s.name == "charge card").collect();
    assert_eq!(charges.len(), 2, "one per attempt: {:?}", names(&spans));
    for (n, attempt) in [("1", first), ("2", second)] {
        let charge = charges
            .iter()
            .find(|s| attr(s, "attempt").as_deref() == Some(n))
            .unwrap_or_else(|| panic!("no handler span for attempt {n}"));
        assert_eq!(charge.trace_id, attempt.trace_id);
        assert_eq!(charge.parent_span_id, attempt.span_id, "attempt {n}");
    }
}
