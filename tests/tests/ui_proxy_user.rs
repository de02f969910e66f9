//! Behind an authenticating reverse proxy (oauth2-proxy), the dashboard
//! records the user the proxy names in `X-Forwarded-User` as the actor of
//! an audited action, but only when the request comes from a
//! `--trusted-proxy` address: the same header from any other peer is
//! ignored and `--by` is recorded. `--user-header` without a trusted proxy
//! is refused at start.

use std::process::Command;

use kjob_integration_tests::*;

use crate::dashboard as support;
use support::{audit, dashboard, session};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_user_is_audited_only_from_a_trusted_address() {
    let config = ensure_stack();
    let topic = unique("uiproxy");
    create_topic(&config, &topic, 1).await;
    create_topic(&config, &format!("{topic}.dlq"), 1).await;
    for i in 0..2 {
        produce_raw(&config, &format!("{topic}.dlq"), 0, &format!("k{i}"), b"x");
    }
    let user = [("x-forwarded-user", "ann@example.com")];

    // Loopback is the proxy here: the header is believed.
    let (_trusting, base) = dashboard(
        &config,
        &[
            "--allow-actions",
            "--user-header",
            "X-Forwarded-User",
            "--trusted-proxy",
            "127.0.0.1",
        ],
    )
    .await;
    let s = session(&base, &topic).await;
    let page = s
        .http
        .get(format!("{base}/dlq?topic={topic}"))
        .header("cookie", &s.cookie)
        .header(user[0].0, user[0].1)
        .send()
        .await
        .expect("GET")
        .text()
        .await
        .unwrap_or_default();
    assert!(
        page.contains("Audited as <code>ann@example.com</code>"),
        "the page names the actor"
    );
    let (status, body) = s
        .post_with(
            "/dlq/resolve",
            &format!("topic={topic}&at=0:0&reason=dup"),
            &user,
        )
        .await;
    assert_eq!(status, 200, "{body}");

    // Only 10.0.0.0/8 is the proxy: the same header from loopback is ignored.
    let (_strict, base) = dashboard(
        &config,
        &[
            "--allow-actions",
            "--user-header",
            "X-Forwarded-User",
            "--trusted-proxy",
            "10.0.0.0/8",
        ],
    )
    .await;
    let s = session(&base, &topic).await;
    let (status, body) = s
        .post_with(
            "/dlq/resolve",
            &format!("topic={topic}&at=0:1&reason=dup"),
            &[("x-forwarded-user", "mallory")],
        )
        .await;
    assert_eq!(status, 200, "{body}");

    let by: Vec<(String, String)> = audit(&config, &topic)
        .into_iter()
        .map(|(at, e)| (at, e["by"].as_str().unwrap_or_default().to_string()))
        .collect();
    assert_eq!(
        by,
        vec![
            ("0:0".to_string(), "ann@example.com".to_string()),
            ("0:1".to_string(), "index-tester".to_string()),
        ],
        "the trusted proxy's user, then --by for the untrusted peer"
    );

    // A user header nobody is trusted to send is refused at start.
    let out = Command::new(env!("CARGO_BIN_EXE_kjob-cli"))
        .args([
            "ui",
            "--listen",
            "127.0.0.1:0",
            "--user-header",
            "X-Forwarded-User",
        ])
        .env("KJOB_BOOTSTRAP_SERVERS", &config.bootstrap_servers)
        .env("KJOB_SCHEMA_REGISTRY_URL", &config.schema_registry_url)
        .output()
        .expect("kjob ui");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--trusted-proxy"), "{err}");
}
