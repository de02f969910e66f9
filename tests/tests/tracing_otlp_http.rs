//! OTLP over HTTP/protobuf (`OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf`),
//! received by a real OTLP/HTTP receiver in the test (axum, decoding the
//! `ExportTraceServiceRequest` protobuf at `/v1/traces`), with B3 as the
//! only propagator (`OTEL_PROPAGATORS=b3`): a job's record carries a `b3`
//! header and no `traceparent`, and its attempt is still the enqueue's
//! child. A delayed job's attempt, read from a delay topic, starts a trace
//! of its own linked to its enqueue. Its own test binary, because the
//! tracing subscriber and the variables are process-wide.

#[path = "support/otlp.rs"]
mod otlp;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use kjob::delay::delay_topics;
use kjob::headers::JobHeaders;
use kjob::{JobContext, Producer, Worker, WorkerStats};
use kjob_integration_tests::*;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use otlp::{attr, link_attr, names, spans_of};
use prost::Message as _;
use tokio::sync::oneshot;

type Received = Arc<Mutex<Vec<Span>>>;

/// `POST /v1/traces`: an OTLP/HTTP export, protobuf in and out.
async fn export(
    State(spans): State<Received>,
    body: Bytes,
) -> Result<([(http::HeaderName, &'static str); 1], Vec<u8>), http::StatusCode> {
    let request =
        ExportTraceServiceRequest::decode(body).map_err(|_| http::StatusCode::BAD_REQUEST)?;
    spans.lock().unwrap().extend(spans_of(request));
    let response = ExportTraceServiceResponse {
        partial_success: None,
    };
    Ok((
        [(http::header::CONTENT_TYPE, "application/x-protobuf")],
        response.encode_to_vec(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_go_out_over_http_protobuf_with_b3_in_the_headers() {
    let config = ensure_stack();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received: Received = Arc::default();
    let app = axum::Router::new()
        .route("/v1/traces", post(export))
        .with_state(received.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });

    // SAFETY of set_var: this test binary has one test, set before any thread reads the env.
    std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}"));
    std::env::set_var("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf");
    std::env::set_var("OTEL_PROPAGATORS", "b3");
    std::env::set_var("OTEL_SERVICE_NAME", "kjob-tracing-http-test");
    std::env::set_var("RUST_LOG", "warn");
    let guard = kjob::telemetry::init().expect("telemetry init");
    assert!(guard.exporting());

    let topic = unique("trace-http");
    let group = unique("g");
    create_topic(&config, &topic, 1).await;
    let w = Worker::builder(config.clone(), &group)
        .handle_on(&topic, |_j: TestJob, _ctx: JobContext| async move {
            Ok::<(), kjob::JobError>(())
        })
        .delayed_jobs(true)
        .build()
        .unwrap();
    let stats = w.stats();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(w.run_until(async {
        let _ = rx.await;
    }));
    // The worker creates the delay topics as it starts.
    let delays = delay_topics(&topic);
    wait_topics_exist(&config, &delays, "the worker's delay topics").await;

    let producer = Producer::new(&config).unwrap();
    let now = producer
        .enqueue_to(&topic, &TestJob::ok("k", 1))
        .await
        .unwrap();
    let later = producer
        .enqueue_in_to(&topic, &TestJob::ok("k", 2), Duration::from_secs(2))
        .await
        .unwrap();
    eventually(Duration::from_secs(60), "both handled", || {
        WorkerStats::get(&stats.handled) == 2
    })
    .await;
    let _ = tx.send(());
    task.await.unwrap().unwrap();
    drop(guard); // flushes the batch exporter

    // B3 in the record's headers, and no W3C header beside it.
    let record = read_all(&config, &topic).remove(0);
    let headers = JobHeaders::parse(rdkafka::Message::headers(&record));
    assert_eq!(headers.id.as_deref(), Some(now.id.as_str()));
    assert_eq!(headers.traceparent, None);
    assert!(
        headers.extra.iter().any(|(k, _)| k == "b3"),
        "a b3 header among {:?}",
        headers.extra
    );

    let spans = received.lock().unwrap().clone();
    let find = |name: &str, id: &str| -> Span {
        spans
            .iter()
            .find(|s| s.name == name && attr(s, "messaging.message.id").as_deref() == Some(id))
            .cloned()
            .unwrap_or_else(|| panic!("no `{name}` for {id} among {:?}", names(&spans)))
    };
    let (send, process) = (format!("send {topic}"), format!("process {topic}"));

    // The job enqueued now: its attempt continues the enqueue, through b3.
    let (enqueue, attempt) = (find(&send, &now.id), find(&process, &now.id));
    assert_eq!(attempt.trace_id, enqueue.trace_id);
    assert_eq!(attempt.parent_span_id, enqueue.span_id);

    // The delayed job: written to a delay topic, run from one; its attempt
    // is a trace of its own, linked to the enqueue.
    let (enqueue, attempt) = (find(&send, &later.id), find(&process, &later.id));
    let written = attr(&enqueue, "kjob.topic").expect("the delay topic written");
    assert!(delays.contains(&written), "{written} is a delay topic");
    let read = attr(&attempt, "kjob.topic").expect("the delay topic read");
    assert!(delays.contains(&read), "{read} is a delay topic");
    assert_ne!(attempt.trace_id, enqueue.trace_id, "a new trace");
    assert!(attempt.parent_span_id.is_empty(), "a root span");
    assert_eq!(attempt.links.len(), 1, "{:?}", attempt.links);
    let link = &attempt.links[0];
    assert_eq!(
        (link.trace_id.as_slice(), link.span_id.as_slice()),
        (enqueue.trace_id.as_slice(), enqueue.span_id.as_slice())
    );
    assert_eq!(link_attr(link, "kjob.link").as_deref(), Some("enqueue"));
}
