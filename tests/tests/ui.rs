//! `kjob ui` in a real browser: Debian's chromium driven over WebDriver
//! (chromedriver, started here on a free port) against the real stack.
//!
//! The overview's lag is checked against Kafka's own `kafka-consumer-groups
//! --describe`; dead letters are re-driven from the page and handled by a
//! worker, with the action in `<topic>.dlq.audit`; a resolve without a
//! reason is refused; a long re-drive is cancelled; read-only mode has no
//! action buttons and answers POSTs with 403; a hostile key and hostile
//! headers render as text. The screenshots in docs/src/ (the book's dashboard
//! chapter) are taken here.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::Message;

use kjob::{KafkaConfig, Producer, WorkerStats};
use kjob_integration_tests::*;
use kjob_ops::dlq::store::{Coordinates, DlqReader};

/// A child process (chromedriver, a dashboard) killed when the test ends,
/// however it ends.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free local port")
}

fn tool(env: &str, default: &str) -> PathBuf {
    let path = PathBuf::from(std::env::var(env).unwrap_or_else(|_| default.to_string()));
    assert!(
        path.exists(),
        "{} is missing: the browser tests need Debian's chromium and chromium-driver \
         (apt-get install -y chromium chromium-driver; .ci/run installs them), or set {env}",
        path.display()
    );
    path
}

async fn answers(url: &str, what: &str) {
    let start = Instant::now();
    loop {
        if reqwest::get(url).await.is_ok() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what} at {url} did not answer within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Starts chromedriver and a headless chromium session.
async fn browser() -> (Guard, Client) {
    let chromium = tool("KJOB_CHROMIUM", "/usr/bin/chromium");
    let driver = tool("KJOB_CHROMEDRIVER", "/usr/bin/chromedriver");
    let port = free_port();
    let child = Command::new(driver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting chromedriver");
    let guard = Guard(child);
    let url = format!("http://127.0.0.1:{port}");
    answers(&format!("{url}/status"), "chromedriver").await;
    let caps = serde_json::json!({
        "goog:chromeOptions": {
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1280,1000", "--hide-scrollbars"],
        }
    });
    let caps = caps.as_object().cloned().unwrap_or_default();
    let client = ClientBuilder::native()
        .capabilities(caps)
        .connect(&url)
        .await
        .expect("a chromium session through chromedriver");
    (guard, client)
}

/// Starts `kjob ui` with `args` on a free port and waits until it answers.
async fn dashboard(config: &KafkaConfig, args: &[&str]) -> (Guard, String) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let child = Command::new(env!("CARGO_BIN_EXE_kjob-cli"))
        .args(["ui", "--listen", &listen, "--sample-every", "1s"])
        .args(args)
        .env("KJOB_BOOTSTRAP_SERVERS", &config.bootstrap_servers)
        .env("KJOB_SCHEMA_REGISTRY_URL", &config.schema_registry_url)
        .env("USER", "ui-tester")
        .env_remove("KJOB_UI_TOKEN")
        .stdout(Stdio::null())
        .spawn()
        .expect("starting kjob ui");
    let guard = Guard(child);
    let base = format!("http://{listen}");
    answers(&format!("{base}/assets/style.css"), "kjob ui").await;
    (guard, base)
}

async fn text(c: &Client, css: &str) -> String {
    match c
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css(css))
        .await
    {
        Ok(e) => e.text().await.expect("element text"),
        Err(e) => {
            let url = c
                .current_url()
                .await
                .map(|u| u.to_string())
                .unwrap_or_default();
            let page = c.source().await.unwrap_or_default();
            panic!("no `{css}` on {url}: {e}\n{page}")
        }
    }
}

async fn click(c: &Client, css: &str) {
    c.wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no `{css}` to click: {e}"))
        .click()
        .await
        .expect("click");
}

async fn count(c: &Client, css: &str) -> usize {
    c.find_all(Locator::Css(css)).await.expect("find_all").len()
}

async fn not_pwned(c: &Client) {
    let v = c
        .execute("return window.pwned === undefined;", vec![])
        .await
        .expect("execute");
    assert_eq!(
        v,
        serde_json::json!(true),
        "a record's key or header ran as script"
    );
}

async fn save_screenshot(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("screenshot");
    let path = repo_root().join("docs").join("src").join(name);
    std::fs::create_dir_all(path.parent().unwrap_or(Path::new("."))).expect("docs/src/");
    std::fs::write(&path, png).expect("writing the screenshot");
}

/// Waits until the page at `url` shows `want` in `css` (pages refresh
/// their live parts every second).
async fn eventually_text(c: &Client, url: &str, css: &str, want: &str) {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < Duration::from_secs(40) {
        c.goto(url).await.expect("goto");
        if let Ok(e) = c.find(Locator::Css(css)).await {
            last = e.text().await.unwrap_or_default();
            if last.trim() == want {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("`{css}` on {url} shows `{last}`, expected `{want}`");
}

fn audit_actions(config: &KafkaConfig, topic: &str) -> Vec<serde_json::Value> {
    read_all(config, &format!("{topic}.dlq.audit"))
        .iter()
        .filter_map(|m| serde_json::from_slice(m.payload()?).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_in_a_real_browser() {
    init_logging();
    let (_driver, c) = browser().await;
    let config = ensure_stack();
    let topic = unique("ui");
    let group = unique("g");
    create_topic(&config, &topic, 2).await;
    let producer = Producer::new(&config).expect("producer");
    for i in 0..10 {
        producer
            .enqueue_to(&topic, &TestJob::ok(format!("order-{i}"), i))
            .await
            .expect("enqueue");
    }

    // A broken deploy dead-letters all ten.
    let broken = Arc::new(AtomicBool::new(true));
    let handled: Arc<Mutex<Vec<i64>>> = Default::default();
    let w = start_breakable_worker(&config, &topic, &group, broken.clone(), handled.clone());
    eventually(Duration::from_secs(90), "ten dead letters", || {
        WorkerStats::get(&w.stats.dead_lettered) == 10
    })
    .await;
    w.stop().await;
    // Three more wait while no worker runs: lag.
    for i in 10..13 {
        producer
            .enqueue_to(&topic, &TestJob::ok(format!("order-{i}"), i))
            .await
            .expect("enqueue");
    }
    // An attacker-controlled record in the DLQ: key, headers and payload.
    let hostile = OwnedHeaders::new()
        .insert(Header {
            key: "kjob-job",
            value: Some("<script>window.pwned=1</script>"),
        })
        .insert(Header {
            key: "kjob-error-class",
            value: Some("<img src=x onerror=\"window.pwned=2\">"),
        });
    let (hp, ho) = producer
        .send_raw(
            &format!("{topic}.dlq"),
            Some(b"<script>window.pwned=3</script>"),
            Some(b"<script>window.pwned=4</script>"),
            hostile,
        )
        .await
        .expect("hostile record");
    let hostile_at = Coordinates {
        partition: hp,
        offset: ho,
    };

    let (_ui, base) = dashboard(
        &config,
        &[
            "--allow-actions",
            "--no-discover",
            "--route",
            &format!("{topic}={group}"),
        ],
    )
    .await;

    // Overview: the lag Kafka's own tool reports.
    let described = kafka_describe_group(&config, &group, &topic);
    assert_eq!(
        described.len(),
        2,
        "two partitions described: {described:?}"
    );
    let kafka_lag: i64 = described
        .iter()
        .map(|(p, _, _, lag)| lag.unwrap_or_else(|| panic!("no lag for partition {p}")))
        .sum();
    assert_eq!(kafka_lag, 3, "three jobs wait: {described:?}");
    eventually_text(
        &c,
        &format!("{base}/"),
        &format!("section.route[data-topic='{topic}'] td.lag[data-topic='{topic}']"),
        &kafka_lag.to_string(),
    )
    .await;
    let members = text(&c, &format!("section.route[data-topic='{topic}'] p.muted")).await;
    assert!(members.contains("Empty"), "the stopped group: {members}");
    text(&c, "section.route svg polyline").await;

    // Route page: per partition, the same numbers as the tool.
    c.goto(&format!("{base}/route?topic={topic}&group={group}"))
        .await
        .expect("goto");
    for (p, current, end, lag) in &described {
        let row = text(&c, &format!("#route table tbody tr:nth-child({})", p + 1)).await;
        let want = format!(
            "{topic} {p} {} {end} {}",
            current.map_or("-".to_string(), |c| c.to_string()),
            lag.unwrap_or(0)
        );
        assert_eq!(row, want, "partition {p} on the route page");
    }
    // The replay dry run: the same table as `kjob replay`.
    c.goto(&format!(
        "{base}/replay?topic={topic}&group={group}&to=to-earliest&value="
    ))
    .await
    .expect("goto");
    let plan = text(&c, "p.notice").await;
    assert!(
        plan.contains("10 job(s) would be handled again"),
        "replay dry run: {plan}"
    );

    // The DLQ browser: ten dead letters and the hostile one, as text.
    let dlq_url = format!("{base}/dlq?topic={topic}");
    c.goto(&dlq_url).await.expect("goto");
    assert_eq!(count(&c, "table.dlq tbody tr").await, 11);
    let key = text(&c, &format!("table.dlq tr[data-at='{hostile_at}'] td.key")).await;
    assert_eq!(key, "<script>window.pwned=3</script>");
    not_pwned(&c).await;
    let filtered = format!("{dlq_url}&job=kjob.test.job&class=permanent&since=1h");
    c.goto(&filtered).await.expect("goto");
    assert_eq!(count(&c, "table.dlq tbody tr").await, 10, "filtered by job");

    // The hostile record's detail: key, headers and payload as text.
    c.goto(&format!("{base}/dlq/show?topic={topic}&at={hostile_at}"))
        .await
        .expect("goto");
    assert_eq!(text(&c, "td.key").await, "<script>window.pwned=3</script>");
    let headers = text(&c, "table.headers").await;
    assert!(
        headers.contains("<script>window.pwned=1</script>")
            && headers.contains("<img src=x onerror=\"window.pwned=2\">"),
        "{headers}"
    );
    assert!(text(&c, "pre.payload").await.contains("undecodable"));
    assert_eq!(count(&c, "main script, main img").await, 0);
    not_pwned(&c).await;

    // Resolve without a reason: refused by the server (the browser's own
    // `required` check is removed first), nothing audited.
    c.execute(
        "document.getElementById('reason').removeAttribute('required');",
        vec![],
    )
    .await
    .expect("execute");
    click(&c, "#resolve").await;
    let refused = text(&c, "div.error").await;
    assert!(refused.contains("needs a reason"), "{refused}");
    assert!(audit_actions(&config, &topic).is_empty(), "nothing audited");
    c.goto(&format!("{base}/dlq/show?topic={topic}&at={hostile_at}"))
        .await
        .expect("goto");
    c.find(Locator::Css("#reason"))
        .await
        .expect("reason field")
        .send_keys("not a job: a probe")
        .await
        .expect("typing");
    click(&c, "#resolve").await;
    assert!(text(&c, "p.resolved")
        .await
        .contains("resolved 1 record(s)"));

    // The detail of a real dead letter: decoded payload; screenshot.
    let first = DlqReader::new(&config, &topic)
        .list(&Default::default(), false)
        .expect("reading the DLQ")
        .into_iter()
        .next()
        .expect("a dead letter")
        .0
        .at;
    c.goto(&format!("{base}/dlq/show?topic={topic}&at={first}"))
        .await
        .expect("goto");
    let payload = text(&c, "pre.payload").await;
    assert!(
        payload.contains("\"seq\""),
        "decoded through the registry: {payload}"
    );
    save_screenshot(&c, "ui-dlq-detail.png").await;

    // The fix is deployed; re-drive from the page: preview, then execute.
    broken.store(false, Ordering::SeqCst);
    let w = start_breakable_worker(&config, &topic, &group, broken.clone(), handled.clone());
    c.goto(&filtered).await.expect("goto");
    click(&c, "#redrive-preview").await;
    let preview = text(&c, "p.preview").await;
    assert!(
        preview.contains(&format!(
            "10 record(s) would be re-driven to {topic}.retry.1s"
        )),
        "{preview}"
    );
    assert!(
        audit_actions(&config, &topic).len() == 1,
        "a preview writes nothing"
    );
    click(&c, "#redrive-execute").await;
    let start = Instant::now();
    loop {
        // The click navigates to the progress page: wait for it to load.
        // Its script may replace the element between find and read (a
        // stale element): read again on the next turn.
        let task = c
            .wait()
            .at_most(Duration::from_secs(30))
            .for_element(Locator::Css("#task"))
            .await
            .unwrap_or_else(|e| panic!("no progress page after the re-drive: {e}"));
        let state = task.attr("data-state").await.ok().flatten();
        if state.as_deref() == Some("finished") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "re-drive still {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(text(&c, ".outcome").await.contains("re-drove 10 record(s)"));
    eventually(Duration::from_secs(90), "the worker handles all 13", || {
        let mut h = handled.lock().unwrap_or_else(|p| p.into_inner()).clone();
        h.sort_unstable();
        h.dedup();
        h == (0..13).collect::<Vec<i64>>()
    })
    .await;
    // The overview while the worker runs: members, assignment, rates
    // (the sparklines show the re-drive being handled).
    eventually_text(
        &c,
        &format!("{base}/"),
        &format!("section.route[data-topic='{topic}'] .dlq-unresolved"),
        "0",
    )
    .await;
    let members = text(
        &c,
        &format!("section.route[data-topic='{topic}'] table.members"),
    )
    .await;
    assert!(
        members.contains(&format!("{topic}: ")),
        "assignment shown: {members}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.set_window_size(1280, 760).await.expect("window size");
    save_screenshot(&c, "ui-overview.png").await;
    c.set_window_size(1280, 1000).await.expect("window size");

    let audit = audit_actions(&config, &topic);
    let retried: Vec<&serde_json::Value> =
        audit.iter().filter(|a| a["action"] == "retried").collect();
    assert_eq!(retried.len(), 10, "{audit:?}");
    assert!(retried
        .iter()
        .all(|a| a["by"] == "ui-tester" && a["target"] == format!("{topic}.retry.1s")));
    assert!(audit
        .iter()
        .any(|a| a["action"] == "resolved" && a["reason"] == "not a job: a probe"));
    c.goto(&dlq_url).await.expect("goto");
    assert!(text(&c, "p.count").await.contains("0 unresolved"));

    // A long re-drive is cancelled half-way: at 1 record/s, cancel at once.
    broken.store(true, Ordering::SeqCst);
    for i in 100..106 {
        producer
            .enqueue_to(&topic, &TestJob::ok(format!("order-{i}"), i))
            .await
            .expect("enqueue");
    }
    eventually(Duration::from_secs(90), "six more dead letters", || {
        WorkerStats::get(&w.stats.dead_lettered) == 6
    })
    .await;
    w.stop().await;
    c.goto(&dlq_url).await.expect("goto");
    c.execute(
        "document.querySelector('form.redrive input[name=rate]').value = '1';",
        vec![],
    )
    .await
    .expect("execute");
    click(&c, "#redrive-preview").await;
    click(&c, "#redrive-execute").await;
    click(&c, "#cancel").await;
    let start = Instant::now();
    let outcome = loop {
        c.goto(c.current_url().await.expect("url").as_ref())
            .await
            .expect("goto");
        if let Ok(e) = c.find(Locator::Css(".outcome")).await {
            break e.text().await.expect("text");
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no outcome");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(outcome.starts_with("cancelled after"), "{outcome}");
    let moved = audit_actions(&config, &topic)
        .iter()
        .filter(|a| a["action"] == "retried")
        .count()
        - 10;
    assert!(moved < 6, "cancelled before the end: {moved} moved");
    c.goto(&dlq_url).await.expect("goto");
    assert!(
        text(&c, "p.count")
            .await
            .contains(&format!("{} unresolved", 6 - moved)),
        "what was not re-driven stays listed"
    );

    // Read-only: no action buttons, and the POST endpoints answer 403.
    let (_ro, ro) = dashboard(
        &config,
        &["--no-discover", "--route", &format!("{topic}={group}")],
    )
    .await;
    for page in [
        format!("{ro}/dlq?topic={topic}"),
        format!("{ro}/dlq/show?topic={topic}&at={first}"),
    ] {
        c.goto(&page).await.expect("goto");
        text(&c, "h1").await;
        assert_eq!(
            count(&c, "form[method=post], button.danger, #redrive-preview").await,
            0,
            "{page}"
        );
    }
    let http = reqwest::Client::new();
    for action in ["/dlq/redrive", "/dlq/resolve", "/tasks/1/cancel"] {
        let status = http
            .post(format!("{ro}{action}"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("topic={topic}&reason=x&execute=1"))
            .send()
            .await
            .expect("POST")
            .status();
        assert_eq!(status.as_u16(), 403, "{action} in read-only mode");
    }
    // With actions allowed, a POST without the anti-CSRF token is refused too.
    let status = http
        .post(format!("{base}/dlq/resolve"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("topic={topic}&reason=x&job=kjob.test.job"))
        .send()
        .await
        .expect("POST")
        .status();
    assert_eq!(status.as_u16(), 403, "a forged form");

    let _ = c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_loopback_the_dashboard_needs_its_token() {
    let config = ensure_stack();
    let out = Command::new(env!("CARGO_BIN_EXE_kjob-cli"))
        .args(["ui", "--listen", "0.0.0.0:0"])
        .env("KJOB_BOOTSTRAP_SERVERS", &config.bootstrap_servers)
        .env_remove("KJOB_UI_TOKEN")
        .output()
        .expect("running kjob ui");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("KJOB_UI_TOKEN"), "{stderr}");

    let (_ui, base) = dashboard(&config, &["--token", "s3cret-token"]).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let get = |path: &str| http.get(format!("{base}{path}"));
    assert_eq!(get("/").send().await.expect("GET").status().as_u16(), 401);
    assert_eq!(
        get("/")
            .bearer_auth("wrong")
            .send()
            .await
            .expect("GET")
            .status()
            .as_u16(),
        401
    );
    let ok = get("/")
        .bearer_auth("s3cret-token")
        .send()
        .await
        .expect("GET");
    assert_eq!(ok.status().as_u16(), 200);
    let link = get("/?token=s3cret-token").send().await.expect("GET");
    assert_eq!(
        link.status().as_u16(),
        303,
        "the link's token becomes a cookie"
    );
    let cookie = link
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let by_cookie = get("/")
        .header("cookie", cookie.split(';').next().unwrap_or_default())
        .send()
        .await
        .expect("GET");
    assert_eq!(by_cookie.status().as_u16(), 200);
}
