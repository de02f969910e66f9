//! The schema-registry client's failure modes, against tiny local servers
//! this test starts: a registry that accepts connections and never answers
//! must not hang `Producer::enqueue` (it tries the call once more, then
//! fails after two of the configured timeouts, naming the URL and the
//! timeout), and credentials reach the
//! registry while a refusal names the variables to set.
//!
//! Kafka comes from the local stack (so the only thing wrong is the
//! registry); the registries here are 127.0.0.1 listeners owned by the test.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kjob::{Error, KafkaConfig, Producer};
use kjob_integration_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A "registry" that accepts every connection, reads nothing, answers
/// nothing and keeps the socket open. Returns its base URL and the number of
/// connections it accepted.
async fn silent_registry() -> (String, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binding a loopback port for the silent registry");
    let addr = listener.local_addr().expect("its address");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            held.push(socket);
        }
    });
    (format!("http://{addr}/apis/ccompat/v7"), accepted, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_fails_after_one_retry_when_the_registry_never_answers() {
    init_logging();
    let live = ensure_stack();
    let (url, accepted, server) = silent_registry().await;
    let request_timeout = Duration::from_millis(800);
    let config = KafkaConfig::new(live.bootstrap_servers.clone(), url.clone())
        .registry_timeouts(Duration::from_millis(500), request_timeout);
    let producer = Producer::new(&config).expect("producer");

    let started = Instant::now();
    let result = tokio::time::timeout(
        Duration::from_secs(30),
        producer.enqueue(&TestJob::ok("k", 1)),
    )
    .await
    .expect("enqueue hung for 30 s: the registry timeout was not applied");
    let took = started.elapsed();
    server.abort();

    let err = result.expect_err("a registry that never answers cannot register the contract");
    assert!(
        accepted.load(Ordering::SeqCst) >= 1,
        "the registry was never called, so this test proves nothing: {err}"
    );
    // It waited for the timeout (not some other, faster failure)...
    assert!(took >= request_timeout, "failed after {took:?}: {err}");
    // ...made the call once more (a stalled registry often answers the
    // second try)...
    assert!(
        took >= request_timeout * 2,
        "failed after {took:?}, one {request_timeout:?} timeout: the call was not tried again: {err}"
    );
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        2,
        "one call and its one retry reached the registry: {err}"
    );
    // ...and no more than those two calls' worth of it.
    assert!(
        took < request_timeout * 3 + Duration::from_millis(500),
        "took {took:?} with a {request_timeout:?} request timeout: {err}"
    );
    match &err {
        Error::RegistryTimeout {
            url: named,
            timeout,
            during,
        } => {
            assert_eq!(named, &url);
            assert_eq!(*timeout, request_timeout);
            assert!(during.contains("kjob.test.job-value"), "{during}");
        }
        other => panic!("expected Error::RegistryTimeout, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains(&url),
        "the message names the registry: {text}"
    );
    assert!(
        text.contains("800ms"),
        "the message names the timeout: {text}"
    );
    assert!(
        text.contains("raise the timeout"),
        "the message says what to do: {text}"
    );
}

/// A "registry" that reads one request, remembers its `Authorization`
/// header and answers 401 to everything.
async fn refusing_registry() -> (String, Arc<Mutex<Vec<String>>>, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binding a loopback port for the refusing registry");
    let addr = listener.local_addr().expect("its address");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buf = vec![0u8; 8192];
            let mut read = 0;
            // Read until the end of the request head (bounded).
            while read < buf.len() {
                match socket.read(&mut buf[read..]).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => read += n,
                }
                if buf[..read].windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            let head = String::from_utf8_lossy(&buf[..read]).to_string();
            let auth = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .starts_with("authorization:")
                        .then(|| l["authorization:".len()..].trim().to_string())
                })
                .unwrap_or_default();
            log.lock().unwrap_or_else(|e| e.into_inner()).push(auth);
            let body = r#"{"error_code":40101,"message":"Unauthorized"}"#;
            let resp = format!(
                "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(resp.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
    });
    (format!("http://{addr}"), seen, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_reach_the_registry_and_a_refusal_names_the_fix() {
    init_logging();
    let live = ensure_stack();
    let (url, seen, server) = refusing_registry().await;

    let basic = KafkaConfig::new(live.bootstrap_servers.clone(), url.clone())
        .registry_basic_auth("api-key", "api-secret");
    let err = Producer::new(&basic)
        .expect("producer")
        .enqueue(&TestJob::ok("k", 1))
        .await
        .expect_err("the registry refuses");
    assert!(
        matches!(&err, Error::RegistryUnauthorized { status: 401, .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("KJOB_SCHEMA_REGISTRY_USER"), "{text}");
    assert!(!text.contains("api-secret"), "a secret leaked: {text}");

    let bearer = KafkaConfig::new(live.bootstrap_servers.clone(), url.clone())
        .registry_bearer_token("tok-123");
    let err = Producer::new(&bearer)
        .expect("producer")
        .enqueue(&TestJob::ok("k", 2))
        .await
        .expect_err("the registry refuses");
    assert!(!err.to_string().contains("tok-123"), "{err}");
    server.abort();

    let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    // base64("api-key:api-secret")
    assert_eq!(
        seen.first().map(String::as_str),
        Some("Basic YXBpLWtleTphcGktc2VjcmV0")
    );
    assert_eq!(seen.last().map(String::as_str), Some("Bearer tok-123"));
}
