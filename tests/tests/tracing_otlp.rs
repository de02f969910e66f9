//! One trace across enqueue → handle → retry → handle, exported over
//! OTLP/gRPC (configured by the standard `OTEL_*` variables) and received
//! by a real OTLP receiver: a gRPC server decoding the protobuf, here in the
//! test. Its own test binary, because the tracing subscriber is global.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kjob::retry::RetryPolicy;
use kjob::{JobContext, JobError, Producer, Worker, WorkerStats};
use kjob_integration_tests::*;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
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
        let mut spans = self.spans.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            for ss in rs.scope_spans {
                spans.extend(ss.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|a| a.key == key).and_then(|a| {
        match a.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(s.clone()),
            Value::IntValue(i) => Some(i.to_string()),
            Value::BoolValue(b) => Some(b.to_string()),
            Value::DoubleValue(d) => Some(d.to_string()),
            _ => None,
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_connects_enqueue_handle_retry_handle() {
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
    std::env::set_var("RUST_LOG", "warn");
    let guard = kjob::telemetry::init().expect("telemetry init");
    assert!(guard.exporting());

    let topic = unique("trace");
    let group = unique("g");
    create_topic(&config, &topic, 1).await;
    let w = Worker::builder(config.clone(), &group)
        .handle_on(&topic, |_j: TestJob, ctx: JobContext| async move {
            if ctx.attempt == 1 {
                Err(JobError::server("503 on the first attempt"))
            } else {
                Ok(())
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
    let enqueued = producer
        .enqueue_to(&topic, &TestJob::ok("k", 1))
        .await
        .unwrap();
    eventually(Duration::from_secs(30), "handled on the retry", || {
        WorkerStats::get(&stats.handled) == 1
    })
    .await;
    let _ = tx.send(());
    task.await.unwrap().unwrap();
    drop(guard); // flushes the batch exporter

    let spans = spans.lock().unwrap().clone();
    let enqueue = spans
        .iter()
        .find(|s| {
            s.name == "kjob.enqueue"
                && attr(s, "messaging.message.id").as_deref() == Some(enqueued.id.as_str())
        })
        .unwrap_or_else(|| {
            panic!(
                "no enqueue span among {:?}",
                spans.iter().map(|s| &s.name).collect::<Vec<_>>()
            )
        });
    let handles: Vec<&Span> = spans
        .iter()
        .filter(|s| {
            s.name == "kjob.handle"
                && attr(s, "messaging.message.id").as_deref() == Some(enqueued.id.as_str())
        })
        .collect();
    assert_eq!(handles.len(), 2, "one span per attempt");
    let first = handles
        .iter()
        .find(|s| attr(s, "kjob.attempt").as_deref() == Some("1"))
        .expect("attempt 1");
    let second = handles
        .iter()
        .find(|s| attr(s, "kjob.attempt").as_deref() == Some("2"))
        .expect("attempt 2");
    // One trace: enqueue → handle(1) → (retry tier) → handle(2).
    assert_eq!(first.trace_id, enqueue.trace_id);
    assert_eq!(second.trace_id, enqueue.trace_id);
    assert_eq!(
        first.parent_span_id, enqueue.span_id,
        "the first attempt continues the enqueue"
    );
    assert_eq!(
        second.parent_span_id, first.span_id,
        "the retry continues the failed attempt"
    );
    // Messaging attributes.
    assert_eq!(attr(enqueue, "messaging.system").as_deref(), Some("kafka"));
    assert_eq!(
        attr(enqueue, "messaging.destination.name").as_deref(),
        Some(topic.as_str())
    );
    assert_eq!(
        attr(first, "messaging.consumer.group.name").as_deref(),
        Some(group.as_str())
    );
    assert_eq!(
        attr(second, "messaging.destination.name").as_deref(),
        Some(format!("{topic}.retry.1s").as_str())
    );
    assert_eq!(attr(first, "messaging.kafka.offset").as_deref(), Some("0"));
    assert_eq!(attr(first, "kjob.job").as_deref(), Some("kjob.test.job"));
}
