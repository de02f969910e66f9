//! The dashboard served by a worker, next to its `/metrics`
//! (`WorkerBuilder::http_routes` with `kjob_ops::ui::Dashboard::router_on`),
//! so a deployment can show its routes without a separate `kjob ui`.

use std::net::SocketAddr;
use std::time::Duration;

use kjob::{JobContext, JobError, Producer, Worker};
use kjob_integration_tests::*;
use kjob_ops::ui::{Dashboard, RouteKey};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_serves_the_dashboard_beside_its_metrics() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("uiw");
    let group = unique("g");
    create_topic(&config, &topic, 2).await;

    // Off loopback the pages need a token, as with `kjob ui`.
    let open: SocketAddr = "0.0.0.0:0".parse().expect("address");
    let refused = Dashboard::new(config.clone())
        .router_on(open)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(refused.contains("needs an access token"), "{refused}");

    let addr: SocketAddr = "127.0.0.1:0".parse().expect("address");
    let dashboard = Dashboard::new(config.clone())
        .route(RouteKey {
            topic: topic.clone(),
            group: group.clone(),
        })
        .discover(false)
        .sample_every(Duration::from_millis(500))
        .router_on(addr)
        .expect("dashboard");
    let worker = Worker::builder(config.clone(), &group)
        .handle_on(&topic, |_job: TestJob, _ctx: JobContext| async {
            Ok::<(), JobError>(())
        })
        .metrics_endpoint(addr)
        .http_routes(dashboard)
        .build()
        .expect("worker builds");
    let running = start(worker);
    let producer = Producer::new(&config).expect("producer");
    enqueue_n(&producer, &topic, 20, 5, "ok").await;
    wait_committed_at_end(&config, &group, &topic, 2).await;
    let bound = *running.stats.endpoint.get().expect("endpoint bound");
    let base = format!("http://{bound}");
    let http = reqwest::Client::new();

    // The worker's own paths answer as before.
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("GET /metrics");
    assert_eq!(metrics.status().as_u16(), 200);
    assert!(metrics
        .text()
        .await
        .unwrap_or_default()
        .contains("kjob_jobs_total"));
    let ready = http
        .get(format!("{base}/readyz"))
        .send()
        .await
        .expect("GET /readyz");
    assert_eq!(ready.status().as_u16(), 200);

    // Every other path is the dashboard: the overview shows the route.
    let mut overview = String::new();
    for _ in 0..40 {
        overview = http
            .get(format!("{base}/"))
            .send()
            .await
            .expect("GET /")
            .text()
            .await
            .unwrap_or_default();
        if overview.contains(&topic) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        overview.contains(&topic),
        "the overview lists the route: {overview}"
    );
    let route = http
        .get(format!("{base}/route?topic={topic}&group={group}"))
        .send()
        .await
        .expect("GET /route");
    assert_eq!(route.status().as_u16(), 200);

    // The worker's consumer names its group, host and process: the group
    // description (what `kafka-consumer-groups --describe --members`
    // shows) has that client id, not librdkafka's `rdkafka`, and the
    // members table shows the host and pid.
    let client_id = kjob::config::default_client_id(&group);
    let (host, pid) = kjob::config::host_and_pid(&client_id, &group).expect("host and pid");
    assert_eq!(pid, std::process::id());
    let described = kjob_ops::groups::describe_groups(&config, Some(&group)).expect("describe");
    let ids: Vec<&str> = described
        .iter()
        .flat_map(|g| g.members.iter().map(|m| m.client_id.as_str()))
        .collect();
    assert_eq!(ids, vec![client_id.as_str()], "{described:?}");
    let mut members = String::new();
    for _ in 0..40 {
        members = http
            .get(format!("{base}/route?topic={topic}&group={group}"))
            .send()
            .await
            .expect("GET /route")
            .text()
            .await
            .unwrap_or_default();
        if members.contains(&client_id) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        members.contains(&format!("<td class=\"host\">{host}</td>"))
            && members.contains(&format!("<td class=\"num pid\">{pid}</td>")),
        "host {host} and pid {pid} in the members table: {members}"
    );

    // Read-only by default: actions answer 403.
    let status = http
        .post(format!("{base}/dlq/resolve"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("topic={topic}&reason=x&job=kjob.test.job"))
        .send()
        .await
        .expect("POST")
        .status();
    assert_eq!(status.as_u16(), 403);
    running.stop().await;
}

#[test]
fn http_routes_without_an_endpoint_are_refused_at_build() {
    let config = kjob::KafkaConfig::new("127.0.0.1:9092", "http://127.0.0.1:8081/apis/ccompat/v7");
    let err = Worker::builder(config, "g")
        .handle_on("t", |_job: TestJob, _ctx: JobContext| async {
            Ok::<(), JobError>(())
        })
        .http_routes(axum::Router::new())
        .build()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("metrics_endpoint"), "{err}");
}
