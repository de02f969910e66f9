//! `kjob ui` in a real browser: Debian's chromium driven over WebDriver
//! (chromedriver, started here on a free port) against the real stack.
//!
//! The overview's lag is checked against Kafka's own `kafka-consumer-groups
//! --describe`; dead letters are re-driven from the page and handled by a
//! worker, with the action in `<topic>.dlq.audit`; a resolve without a
//! reason is refused; a long re-drive is cancelled; read-only mode has no
//! action buttons and answers POSTs with 403; a hostile key and hostile
//! headers render as text. Over plain HTTP: the token redirect keeps its
//! query and stays on this server, forged POSTs (a foreign `Origin` or
//! `Sec-Fetch-Site`, another session's form token) are refused, and delay
//! and cron topics are no routes of their own. In the browser again: long
//! values stay in their columns, bidi controls show as escapes, times as
//! dates. On the DLQ page: the counts, the pager, a sort by column, and
//! two checked rows resolved. On the batches page: progress, open batches
//! first, callbacks fired or waiting, and a never-sealed batch cancelled
//! with its reason and actor (refused without a reason, when read-only and
//! a second time). On the schedules page: a pause (banner on every page, no tick while
//! paused), a trigger with a manual id, a resume that does not catch up, the CLI
//! on the same state, and the audit. A route paused from its page is held by
//! every worker of the group, one that joins meanwhile too, and resumed. The
//! workers page shows two processes with their heartbeats and assignments, and
//! a minute of history with handler p50/p99 survives a dashboard restart. The screenshots in docs/src/ (the book's
//! dashboard chapter) are taken here.

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
    found(c, css, "").await.text().await.expect("element text")
}

/// Waits up to 20 s for `css`; panics with the page's address and source
/// when it never appears, so a failed run shows what the page held.
async fn found(c: &Client, css: &str, to: &str) -> fantoccini::elements::Element {
    match c
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css(css))
        .await
    {
        Ok(e) => e,
        Err(e) => {
            let url = c
                .current_url()
                .await
                .map(|u| u.to_string())
                .unwrap_or_default();
            let page = c.source().await.unwrap_or_default();
            panic!("no `{css}`{to} on {url}: {e}\n{page}")
        }
    }
}

async fn click(c: &Client, css: &str) {
    // A page that refreshes itself may replace the element between finding
    // and clicking it (a stale element): find it again, a few times.
    let mut tries = 0;
    loop {
        match found(c, css, " to click").await.click().await {
            Ok(_) => return,
            Err(e) if tries < 5 && format!("{e:?}").contains("StaleElementReference") => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("click `{css}`: {e}"),
        }
    }
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
    // The heading names the tier as code, not between literal backticks.
    let heading = text(&c, "h1").await;
    assert_eq!(
        heading,
        format!("Re-drive of 10 record(s) to {topic}.retry.1s"),
        "{heading}"
    );
    assert_eq!(count(&c, "h1 code").await, 1);
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
    // The page lists what the DLQ topic holds when it is loaded: wait until
    // all six are listed, or the preview may pick fewer (or none, and then
    // there is no execute button).
    let start = Instant::now();
    loop {
        c.goto(&dlq_url).await.expect("goto");
        let count = text(&c, "p.count").await;
        if count.contains("6 unresolved") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(40), "{count}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    c.execute(
        "document.querySelector('form.redrive input[name=rate]').value = '1';",
        vec![],
    )
    .await
    .expect("execute");
    click(&c, "#redrive-preview").await;
    let preview = text(&c, "p.preview").await;
    assert!(
        preview.contains("6 record(s) would be re-driven"),
        "{preview}"
    );
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
    let cookie = cookie.split(';').next().unwrap_or_default().to_string();
    let by_cookie = get("/")
        .header("cookie", &cookie)
        .send()
        .await
        .expect("GET");
    assert_eq!(by_cookie.status().as_u16(), 200);

    // A link to one dead letter keeps its query through the token redirect
    // (it used to land on `/dlq/show` alone: a 400).
    let topic = unique("uitok");
    create_topic(&config, &topic, 1).await;
    create_topic(&config, &format!("{topic}.dlq"), 1).await;
    produce_raw(
        &config,
        &format!("{topic}.dlq"),
        0,
        "the-key-1",
        b"not avro",
    );
    let link = get(&format!(
        "/dlq/show?topic={topic}&at=0:0&token=s3cret-token"
    ))
    .send()
    .await
    .expect("GET");
    assert_eq!(link.status().as_u16(), 303);
    let kept = location(&link);
    assert_eq!(kept, format!("/dlq/show?topic={topic}&at=0%3A0"));
    let shown = get(&kept)
        .header("cookie", &cookie)
        .send()
        .await
        .expect("GET");
    assert_eq!(shown.status().as_u16(), 200, "{kept}");
    assert!(shown.text().await.unwrap_or_default().contains("the-key-1"));

    // No open redirect: a path that a browser would read as another host
    // is folded into a path of this server.
    let link = get("//evil.example/?token=s3cret-token")
        .send()
        .await
        .expect("GET");
    assert_eq!(link.status().as_u16(), 303);
    assert_eq!(location(&link), "/evil.example/");
    // Backslashes, which browsers read as slashes, sent raw (reqwest would
    // normalise them): refused by the HTTP parser or folded the same way.
    for target in [
        "/\\evil.example/?token=s3cret-token",
        "/\\/evil.example/?token=s3cret-token",
    ] {
        let head = raw_get(&base, target).await;
        let to = head.lines().find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("location:")
                .map(|v| v.trim().to_string())
        });
        if let Some(to) = to {
            assert!(
                to.starts_with('/') && !to.starts_with("//") && !to.starts_with("/\\"),
                "{target} redirects to {to}"
            );
        }
    }
}

fn location(resp: &reqwest::Response) -> String {
    resp.headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// The status line and headers of a GET of `target` sent byte for byte.
async fn raw_get(base: &str, target: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = base.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(host).await.expect("connect");
    s.write_all(
        format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    text.split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_string()
}

/// The value of the first `name="csrf"` field of a page.
fn form_token(page: &str) -> String {
    let needle = "name=\"csrf\" value=\"";
    let at = page.find(needle).expect("a form with a token") + needle.len();
    page[at..].split('"').next().unwrap_or_default().to_string()
}

/// The `name=value` of the session cookie a response sets.
fn session_cookie(resp: &reqwest::Response) -> String {
    let set = resp
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("kjob_ui_session="))
        .expect("a session cookie")
        .to_string();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    set.split(';').next().unwrap_or_default().to_string()
}

/// Forged POSTs: a foreign `Origin` or `Sec-Fetch-Site`, another session's
/// form token, no session cookie, each refused with nothing audited, while
/// the dashboard's own form (same origin, its session's token) still works
/// and is audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_posts_are_refused_and_the_form_token_belongs_to_its_session() {
    let config = ensure_stack();
    let topic = unique("uicsrf");
    create_topic(&config, &topic, 1).await;
    create_topic(&config, &format!("{topic}.dlq"), 1).await;
    produce_raw(&config, &format!("{topic}.dlq"), 0, "k", b"x");
    let (_ui, base) = dashboard(&config, &["--allow-actions", "--no-discover"]).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let page = format!("{base}/dlq/show?topic={topic}&at=0:0");
    let first = http.get(&page).send().await.expect("GET");
    let session_a = session_cookie(&first);
    let token_a = form_token(&first.text().await.unwrap_or_default());
    let second = http.get(&page).send().await.expect("GET");
    let session_b = session_cookie(&second);
    let token_b = form_token(&second.text().await.unwrap_or_default());
    assert_ne!(session_a, session_b);
    assert_ne!(token_a, token_b, "one token per session, not per process");
    // A page loaded with a session keeps it (no new cookie) and its token.
    let again = http
        .get(&page)
        .header("cookie", &session_a)
        .send()
        .await
        .expect("GET");
    assert!(again.headers().get("set-cookie").is_none());
    assert_eq!(form_token(&again.text().await.unwrap_or_default()), token_a);

    let resolve = |cookie: Option<&str>, token: &str, headers: &[(&str, &str)], reason: &str| {
        let mut req = http
            .post(format!("{base}/dlq/resolve"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("csrf={token}&topic={topic}&at=0:0&reason={reason}"));
        if let Some(c) = cookie {
            req = req.header("cookie", c);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send()
    };
    let own = base.as_str();
    for (what, cookie, token, headers) in [
        (
            "a foreign Origin",
            Some(&session_a),
            &token_a,
            vec![("origin", "http://evil.example")],
        ),
        (
            "Origin: null",
            Some(&session_a),
            &token_a,
            vec![("origin", "null")],
        ),
        (
            "Sec-Fetch-Site: cross-site",
            Some(&session_a),
            &token_a,
            vec![("sec-fetch-site", "cross-site"), ("origin", own)],
        ),
        (
            "Sec-Fetch-Site: same-site",
            Some(&session_a),
            &token_a,
            vec![("sec-fetch-site", "same-site")],
        ),
        (
            "another session's token",
            Some(&session_b),
            &token_a,
            vec![("origin", own)],
        ),
        ("no session cookie", None, &token_a, vec![("origin", own)]),
    ] {
        let r = resolve(cookie.map(String::as_str), token, &headers, "forged")
            .await
            .expect("POST");
        assert_eq!(r.status().as_u16(), 403, "{what}");
    }
    assert!(audit_actions(&config, &topic).is_empty(), "nothing audited");
    // The dashboard's own form passes both checks: without a reason it is
    // refused by the handler (400), with one it is resolved and audited.
    let same_origin = [("origin", own), ("sec-fetch-site", "same-origin")];
    let r = resolve(Some(&session_a), &token_a, &same_origin, "")
        .await
        .expect("POST");
    assert_eq!(r.status().as_u16(), 400);
    let r = resolve(Some(&session_b), &token_b, &same_origin, "a+probe")
        .await
        .expect("POST");
    assert_eq!(r.status().as_u16(), 200);
    assert!(r
        .text()
        .await
        .unwrap_or_default()
        .contains("resolved 1 record(s)"));
    let audit = audit_actions(&config, &topic);
    assert!(
        audit.len() == 1 && audit[0]["reason"] == "a probe" && audit[0]["by"] == "ui-tester",
        "{audit:?}"
    );
}

/// The page's width against the window's: `(document, table, window)`.
async fn widths(c: &Client, table: &str) -> (i64, i64, i64) {
    let v = c
        .execute(
            "const t = document.querySelector(arguments[0]); \
             return [document.documentElement.scrollWidth, t ? t.scrollWidth : 0, window.innerWidth];",
            vec![serde_json::json!(table)],
        )
        .await
        .expect("execute");
    let n = |i: usize| v[i].as_i64().unwrap_or(i64::MAX);
    (n(0), n(1), n(2))
}

const BIDI: [char; 12] = [
    '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{202e}', '\u{2066}', '\u{2067}', '\u{2068}',
    '\u{2069}', '\u{200e}', '\u{200f}', '\u{061c}',
];

/// A 100 KB key, a 5 KB job name and a 1 KiB error without a space stay
/// in their columns (the table is no wider than the window), cut with an
/// ellipsis, whole on the detail page; a right-to-left override shows as
/// an escape, never raw; times read as UTC dates with their age and the
/// raw milliseconds on hover; no rate reads `-0.0`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_and_bidi_values_keep_the_layout_and_read_as_they_are() {
    init_logging();
    let (_driver, c) = browser().await;
    let config = ensure_stack();
    let topic = unique("uilong");
    let group = unique("g");
    let dlq = format!("{topic}.dlq");
    create_topic(&config, &topic, 1).await;
    create_topic(&config, &dlq, 1).await;
    let producer = Producer::new(&config).expect("producer");
    let key = "k".repeat(100_000);
    let job = format!("kjob.{}", "very_long_job_name".repeat(300));
    let error = "e".repeat(1024);
    let failed_at = (kjob::dlq::now_ms() - 180_000).to_string();
    let long_headers = OwnedHeaders::new()
        .insert(Header {
            key: "kjob-job",
            value: Some(job.as_str()),
        })
        .insert(Header {
            key: "kjob-error-class",
            value: Some("permanent"),
        })
        .insert(Header {
            key: "kjob-error",
            value: Some(error.as_str()),
        })
        .insert(Header {
            key: "kjob-first-failed-at",
            value: Some(failed_at.as_str()),
        });
    let (_, long_at) = producer
        .send_raw_to(
            &dlq,
            Some(0),
            Some(key.as_bytes()),
            Some(b"x"),
            long_headers,
        )
        .await
        .expect("long record");
    let bidi_headers = OwnedHeaders::new()
        .insert(Header {
            key: "kjob-job",
            value: Some("job\u{2066}x\u{2069}"),
        })
        .insert(Header {
            key: "kjob-error",
            value: Some("\u{202b}failed\u{200f}\u{061c}"),
        });
    let (_, bidi_at) = producer
        .send_raw_to(
            &dlq,
            Some(0),
            Some("photo\u{202e}gnp.exe".as_bytes()),
            Some(b"x"),
            bidi_headers,
        )
        .await
        .expect("bidi record");
    let (_ui, base) = dashboard(
        &config,
        &["--no-discover", "--route", &format!("{topic}={group}")],
    )
    .await;

    // The DLQ list: no wider than the window; values cut, the key's cell
    // small in the page too (not 100 KB per row).
    c.goto(&format!("{base}/dlq?topic={topic}"))
        .await
        .expect("goto");
    let row = |at: i64| format!("table.dlq tr[data-at='0:{at}']");
    let shown_key = text(&c, &format!("{} td.key", row(long_at))).await;
    assert!(
        shown_key.chars().count() <= 81 && shown_key.ends_with('…'),
        "{} characters: {shown_key:.100}",
        shown_key.chars().count()
    );
    let (doc, table, window) = widths(&c, "table.dlq").await;
    assert!(
        doc <= window && table <= window,
        "page {doc} px, table {table} px, window {window} px"
    );
    let source = c.source().await.expect("source");
    assert!(
        source.len() < 30_000,
        "the list page weighs {} bytes",
        source.len()
    );
    assert_eq!(
        text(&c, &format!("{} td.key", row(bidi_at))).await,
        "photo\\u{202e}gnp.exe"
    );
    save_screenshot(&c, "ui-dlq-long-values.png").await;
    let body = c
        .execute("return document.body.innerText;", vec![])
        .await
        .expect("execute");
    let body = body.as_str().unwrap_or_default();
    assert!(
        !body.contains(&BIDI[..]),
        "a bidi control shown raw: {body:.300}"
    );
    assert!(body.contains("job\\u{2066}x\\u{2069}"), "{body:.2000}");

    // The detail page: the whole key, still no wider than the window; the
    // failure time as a date and an age, the raw value on hover.
    c.goto(&format!("{base}/dlq/show?topic={topic}&at=0:{long_at}"))
        .await
        .expect("goto");
    assert_eq!(text(&c, "td.key").await.len(), 100_000, "the whole key");
    let (doc, table, window) = widths(&c, "table.headers").await;
    assert!(
        doc <= window && table <= window,
        "page {doc} px, headers {table} px, window {window} px"
    );
    let time = c
        .find(Locator::Css("table.headers time.when"))
        .await
        .expect("a time in the headers");
    assert_eq!(
        time.attr("title").await.ok().flatten().as_deref(),
        Some(failed_at.as_str())
    );
    let shown = time.text().await.expect("text");
    assert!(
        shown.ends_with("UTC (3 min ago)") && shown.starts_with("20"),
        "{shown}"
    );
    let headers = text(&c, "table.headers").await;
    assert!(
        !headers.contains(&failed_at),
        "raw epoch ms shown: {headers:.500}"
    );
    not_pwned(&c).await;
    c.goto(&format!("{base}/dlq/show?topic={topic}&at=0:{bidi_at}"))
        .await
        .expect("goto");
    let body = c
        .execute("return document.body.innerText + document.title;", vec![])
        .await
        .expect("execute");
    let body = body.as_str().unwrap_or_default();
    assert!(
        !body.contains(&BIDI[..]),
        "a bidi control shown raw: {body:.300}"
    );
    assert!(
        body.contains("\\u{202b}failed\\u{200f}\\u{61c}"),
        "{body:.2000}"
    );

    // A route without retry tiers: its retried/s is 0.0, not -0.0.
    eventually_text(
        &c,
        &format!("{base}/"),
        &format!("section.route[data-topic='{topic}'] .metric:nth-child(3) .value"),
        "0.0",
    )
    .await;
    let overview = c.source().await.expect("source");
    assert!(!overview.contains("-0.0"), "a minus zero on the overview");
    let _ = c.close().await;
}

/// Every `(topic, group)` route section on an overview page.
fn routes_on(page: &str) -> Vec<(String, String)> {
    let attr = |s: &str, name: &str| -> Option<String> {
        let at = s.find(&format!("{name}=\""))? + name.len() + 2;
        Some(s[at..].split('"').next()?.to_string())
    };
    page.split("<section class=\"card route\" ")
        .skip(1)
        .filter_map(|s| {
            let tag = s.split('>').next()?;
            Some((attr(tag, "data-topic")?, attr(tag, "data-group")?))
        })
        .collect()
}

/// A worker with delayed jobs and a cron schedule consumes its main topic,
/// seven `T.delay.*` topics and `<group>.schedules`: the overview (routes
/// found from the live groups) shows one route, with the others among its
/// topics, as the retry tiers are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_and_cron_topics_fold_into_their_route() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("uifold");
    let group = unique("g");
    create_topic(&config, &topic, 1).await;
    let schedule = kjob::schedule::Schedule::new("yearly", "0 0 0 1 1 *", || TestJob::ok("k", 0))
        .on(&topic, || TestJob::ok("k", 0));
    let worker = kjob::Worker::builder(config.clone(), &group)
        .handle_on(&topic, |_job: TestJob, _ctx: kjob::JobContext| async {
            Ok::<(), kjob::JobError>(())
        })
        .retry(kjob::retry::RetryPolicy::tiers([Duration::from_secs(1)]))
        .delayed_jobs(true)
        .schedule_with(schedule)
        .build()
        .expect("worker builds");
    let running = start(worker);
    let assigned = |g: &kjob_ops::groups::Group| g.assigned_topics();
    let mut topics = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        topics = kjob_ops::groups::describe_groups(&config, Some(&group))
            .ok()
            .and_then(|g| g.first().map(assigned))
            .unwrap_or_default();
        if topics.iter().any(|t| t.ends_with(".schedules")) && topics.len() >= 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        topics.contains(&format!("{topic}.delay.1d"))
            && topics.contains(&format!("{group}.schedules")),
        "the worker consumes delay and cron topics: {topics:?}"
    );

    // Discovery among this group's topics only: the folding is the point,
    // and a shared stack holds the groups of every earlier test run.
    let (_ui, base) = dashboard(&config, &["--group", &group]).await;
    let http = reqwest::Client::new();
    let mine = |page: &str| -> Vec<String> {
        routes_on(page)
            .into_iter()
            .filter(|(_, g)| *g == group)
            .map(|(t, _)| t)
            .collect()
    };
    let start = Instant::now();
    // Until the route is shown with its sampled topics, then one more round.
    while start.elapsed() < Duration::from_secs(90) {
        let page = http
            .get(format!("{base}/"))
            .send()
            .await
            .expect("GET /")
            .text()
            .await
            .unwrap_or_default();
        if !mine(&page).is_empty() && page.contains(&format!("{topic}.delay.1d")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let page = http
        .get(format!("{base}/"))
        .send()
        .await
        .expect("GET /")
        .text()
        .await
        .unwrap_or_default();
    assert_eq!(mine(&page), vec![topic.clone()], "one route for the group");
    for (t, role) in [
        (format!("{topic}.retry.1s"), "retry tier"),
        (format!("{topic}.delay.1s"), "delay"),
        (format!("{topic}.delay.1d"), "delay"),
        (format!("{group}.schedules"), "cron leader"),
    ] {
        assert!(
            page.contains(&format!("<td class=\"mono\">{t}</td><td>{role}</td>")),
            "{t} shown as the route's {role}"
        );
    }
    running.stop().await;
}

/// The DLQ page in the browser: the counts first, the pager, a sort by
/// clicking a column, and two rows checked and resolved with the "Resolve
/// selected" button (the same audited action as the others). Takes the
/// book's screenshot of the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_rows_are_paged_sorted_checked_and_resolved_in_the_browser() {
    init_logging();
    let (_driver, c) = browser().await;
    let config = ensure_stack();
    let topic = unique("uisel");
    let dlq = format!("{topic}.dlq");
    create_topic(&config, &topic, 1).await;
    create_topic(&config, &dlq, 1).await;
    let producer = Producer::new(&config).expect("producer");
    for i in 0..60 {
        let class = ["permanent.invalid", "retryable.timeout", "bug.panic"][i % 3];
        let job = ["mail.confirmation", "invoice.pdf"][i % 2];
        let error = format!("downstream said no ({i})");
        let id = format!("job-{i:02}");
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "kjob-job",
                value: Some(job),
            })
            .insert(Header {
                key: "kjob-error-class",
                value: Some(class),
            })
            .insert(Header {
                key: "kjob-id",
                value: Some(&id),
            })
            .insert(Header {
                key: "kjob-error",
                value: Some(&error),
            });
        producer
            .send_raw(
                &dlq,
                Some(format!("order-{:02}", 59 - i).as_bytes()),
                Some(b"\0\0\0\0\x01\x0aEUR"),
                headers,
            )
            .await
            .expect("a dead letter");
    }
    let (_ui, base) = dashboard(&config, &["--allow-actions", "--no-discover"]).await;
    c.goto(&format!("{base}/dlq?topic={topic}"))
        .await
        .expect("goto");
    let classes = text(&c, "section.counts table.by-class").await;
    for c in [
        "permanent.invalid 20",
        "retryable.timeout 20",
        "bug.panic 20",
    ] {
        assert!(classes.contains(c), "{classes}");
    }
    assert!(text(&c, "section.counts table.by-job")
        .await
        .contains("invoice.pdf 30"));
    assert_eq!(count(&c, "table.dlq tbody tr").await, 50);
    click(&c, "nav.pager a.next").await;
    text(&c, "nav.pager span.number").await;
    assert_eq!(count(&c, "table.dlq tbody tr").await, 10, "the second page");
    // Sorted by key (ascending): order-00 is the last record written.
    c.goto(&format!("{base}/dlq?topic={topic}"))
        .await
        .expect("goto");
    click(&c, "th a.sort[data-sort='key']").await;
    let first = text(&c, "table.dlq tbody tr:first-child td.key").await;
    assert_eq!(first, "order-00");
    // Check two rows, give a reason, resolve just those.
    for at in ["0:53", "0:57"] {
        click(&c, &format!("table.dlq tr[data-at='{at}'] input.pick")).await;
    }
    c.find(Locator::Css("section.selection input[name=reason]"))
        .await
        .expect("the reason field")
        .send_keys("duplicates of 0:52")
        .await
        .expect("typing");
    c.execute("window.scrollTo(0, 0);", vec![])
        .await
        .expect("scroll");
    save_screenshot(&c, "ui-dlq-index.png").await;
    click(&c, "#resolve-selected").await;
    let done = text(&c, "p.notice.resolved").await;
    assert!(done.contains("resolved 2 record(s)"), "{done}");
    let audit = audit_actions(&config, &topic);
    assert_eq!(audit.len(), 2, "{audit:?}");
    assert!(audit.iter().all(|a| a["action"] == "resolved"
        && a["reason"] == "duplicates of 0:52"
        && a["by"] == "ui-tester"));
    c.goto(&format!("{base}/dlq?topic={topic}"))
        .await
        .expect("goto");
    assert!(text(&c, "p.count").await.contains("58 unresolved"));
    not_pwned(&c).await;
}

/// A worker on `route` and `callbacks` that keeps its batches on `batches`
/// and records the callback job ids it handles.
fn batch_worker(
    config: &KafkaConfig,
    group: &str,
    batches: &str,
    route: &str,
    callbacks: &str,
    fired: Arc<Mutex<Vec<String>>>,
) -> kjob::Worker {
    kjob::Worker::builder(config.clone(), group)
        .batches_on(batches)
        .batch_callback::<TestJob>()
        .handle_on(route, |_job: TestJob, _ctx: kjob::JobContext| async {
            Ok(())
        })
        .handle_on(callbacks, move |_job: TestJob, ctx: kjob::JobContext| {
            let fired = fired.clone();
            async move {
                fired.lock().unwrap().push(ctx.id.to_string());
                Ok(())
            }
        })
        .build()
        .expect("worker builds")
}

/// A POST of the cancel form from the browser's page (its session, its
/// origin) with the session's form token and `reason`: the status code.
async fn post_cancel_from_page(
    c: &Client,
    csrf: &str,
    batches: &str,
    batch: &str,
    reason: &str,
) -> u16 {
    let v = c
        .execute_async(
            r#"const [csrf, topic, batch, reason, done] = arguments;
               fetch('/batches/cancel', { method: 'POST', credentials: 'same-origin',
                 body: new URLSearchParams({ csrf, topic, batch, reason }) })
                 .then(r => done(r.status), () => done(0));"#,
            vec![
                serde_json::json!(csrf),
                serde_json::json!(batches),
                serde_json::json!(batch),
                serde_json::json!(reason),
            ],
        )
        .await
        .expect("execute_async");
    v.as_u64().unwrap_or(0) as u16
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_show_their_progress_and_a_never_sealed_one_is_cancelled_from_the_page() {
    init_logging();
    let (_driver, c) = browser().await;
    let config = ensure_stack();
    let (route, callbacks, batches) = (
        unique("ui.batch"),
        unique("ui.batch.cb"),
        unique("ui.batches"),
    );
    let group = unique("g");
    create_topic(&config, &route, 2).await;
    create_topic(&config, &callbacks, 1).await;
    let fired: Arc<Mutex<Vec<String>>> = Default::default();
    let running = start(batch_worker(
        &config,
        &group,
        &batches,
        &route,
        &callbacks,
        fired.clone(),
    ));
    wait_topics_exist(
        &config,
        &[batches.clone(), kjob::batch::state_topic(&batches)],
        "the batch topics",
    )
    .await;
    let producer = Producer::new(&config).expect("producer");

    // One batch sealed and complete, its callback fired.
    let done = unique("newsletter");
    let b = producer
        .batch(&done)
        .expect("batch id")
        .topic(&batches)
        .callback_to(
            kjob::batch::When::Complete,
            &callbacks,
            TestJob::ok("report", 1),
        );
    for i in 0..4 {
        b.enqueue_to(&route, &TestJob::ok(format!("k{i}"), i))
            .await
            .expect("enqueue");
    }
    b.seal().await.expect("seal");
    let complete = kjob::batch::callback_id(&done, kjob::batch::When::Complete);
    eventually(Duration::from_secs(60), "the callback", || {
        fired.lock().unwrap().contains(&complete)
    })
    .await;
    // One never sealed, with markup in its id: three finished, still open.
    let stuck = format!("{}-<img src=x onerror=window.pwned=5>", unique("stuck"));
    let s = producer
        .batch(&stuck)
        .expect("batch id")
        .topic(&batches)
        .callback_to(
            kjob::batch::When::Complete,
            &callbacks,
            TestJob::ok("report", 2),
        );
    for i in 0..3 {
        s.enqueue_to(&route, &TestJob::ok(format!("s{i}"), i))
            .await
            .expect("enqueue");
    }
    s.flush().await.expect("flush");

    let (_ui, base) = dashboard(&config, &["--allow-actions", "--no-discover"]).await;
    let (_ro, ro_base) = dashboard(&config, &["--no-discover"]).await;
    let list = format!("{base}/batches?topic={batches}");
    eventually_text(&c, &list, "tr[data-status='open'] span.finished", "3 / 3").await;
    not_pwned(&c).await;
    // Open batches first, then the complete one with its fired callback.
    let statuses: Vec<String> = {
        let mut out = Vec::new();
        for row in c
            .find_all(Locator::Css("table.batches tbody tr"))
            .await
            .expect("rows")
        {
            out.push(
                row.attr("data-status")
                    .await
                    .expect("attr")
                    .unwrap_or_default(),
            );
        }
        out
    };
    assert_eq!(statuses, ["open", "complete"], "open first");
    let id_cell = text(&c, "tr[data-status='open'] td.mono a").await;
    assert_eq!(id_cell, stuck, "the id shows as text");
    assert!(
        text(&c, "tr[data-status='open'] span.counts")
            .await
            .contains("(so far)"),
        "an unsealed batch's total is what was enqueued so far"
    );
    assert_eq!(
        text(&c, "tr[data-status='complete'] span.finished").await,
        "4 / 4"
    );
    let cb = text(&c, "tr[data-status='complete'] div.callback").await;
    assert!(cb.contains("fired"), "{cb}");
    assert!(
        text(&c, "tr[data-status='open'] div.callback")
            .await
            .contains("waiting"),
        "the open batch's callback waits"
    );
    save_screenshot(&c, "ui-batches.png").await;

    // Read-only: the detail page has no cancel form, and a POST is 403.
    let ro_url = reqwest::Url::parse_with_params(
        &format!("{ro_base}/batches/show"),
        &[("topic", batches.as_str()), ("batch", stuck.as_str())],
    )
    .expect("url");
    let ro_page = reqwest::get(ro_url)
        .await
        .expect("GET")
        .text()
        .await
        .expect("body");
    assert!(
        ro_page.contains("data-live"),
        "the detail page renders: {ro_page}"
    );
    assert!(
        !ro_page.contains("cancel-batch"),
        "no cancel form when read-only"
    );
    let refused = reqwest::Client::new()
        .post(format!("{ro_base}/batches/cancel"))
        .header("origin", &ro_base)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("topic={batches}&batch=x&reason=x"))
        .send()
        .await
        .expect("POST");
    assert_eq!(refused.status().as_u16(), 403);

    // The detail page, then a cancel without a reason is refused.
    click(&c, "tr[data-status='open'] td.mono a").await;
    assert_eq!(text(&c, "#batch span.status").await, "open");
    not_pwned(&c).await;
    let csrf = c
        .find(Locator::Css("form.cancel-batch input[name=csrf]"))
        .await
        .expect("the cancel form")
        .attr("value")
        .await
        .expect("attr")
        .unwrap_or_default();
    assert_eq!(
        post_cancel_from_page(&c, &csrf, &batches, &stuck, " ").await,
        400
    );
    let still = kjob_ops::batches::show(&config, &batches, &stuck).expect("the batch");
    assert!(
        still.cancelled.is_none(),
        "a cancel without a reason changed nothing"
    );
    // Cancelled from the page, with a reason.
    c.find(Locator::Css("#cancel-reason"))
        .await
        .expect("the reason field")
        .send_keys("never sealed: the export crashed")
        .await
        .expect("type");
    click(&c, "#cancel-batch").await;
    let notice = text(&c, "p.notice.cancelled").await;
    assert!(notice.contains("ui-tester"), "{notice}");
    eventually(
        Duration::from_secs(30),
        "cancelled on the state topic",
        || kjob_ops::batches::show(&config, &batches, &stuck).is_ok_and(|b| b.cancelled.is_some()),
    )
    .await;
    let b = kjob_ops::batches::show(&config, &batches, &stuck).expect("the batch");
    let cancel = b.cancelled.expect("cancelled");
    assert_eq!(cancel.by, "ui-tester", "the actor is recorded");
    assert_eq!(cancel.reason, "never sealed: the export crashed");
    assert_eq!(b.succeeded, 3, "finished jobs stay finished");
    // The page shows it, offers no second cancel, and refuses one.
    eventually_text(
        &c,
        &list,
        "tr[data-status='cancelled'] span.status",
        "cancelled",
    )
    .await;
    click(&c, "tr[data-status='cancelled'] td.mono a").await;
    assert_eq!(text(&c, "section.cancelled strong.by").await, "ui-tester");
    assert_eq!(
        count(&c, "#cancel-batch").await,
        0,
        "no cancel for a cancelled batch"
    );
    assert_eq!(
        post_cancel_from_page(&c, &csrf, &batches, &stuck, "again").await,
        409,
        "a second cancel is refused"
    );
    // Sealing it now fires nothing.
    s.seal().await.expect("seal");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stuck_cb = kjob::batch::callback_id(&stuck, kjob::batch::When::Complete);
    assert!(
        !fired.lock().unwrap().contains(&stuck_cb),
        "no callback for a cancelled batch"
    );
    // Another topic through `?topic=`: none recorded there.
    c.goto(&format!("{base}/batches?topic={}", unique("none")))
        .await
        .expect("goto");
    assert!(text(&c, "p.notice.empty").await.contains("No batches"));
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_and_delayed_jobs_waiting_show_with_their_due_times() {
    init_logging();
    let (_driver, c) = browser().await;
    let config = ensure_stack();
    let topic = unique("ui.wait");
    let group = unique("g");
    create_topic(&config, &topic, 2).await;
    let delays: Vec<(String, i32)> = kjob::delay::delay_topics(&topic)
        .into_iter()
        .map(|t| (t, 1))
        .collect();
    kjob::topics::create_topics(&config, &delays)
        .await
        .expect("delay topics");
    // Every attempt fails retryably; the one tier waits an hour (jittered).
    let w = kjob::Worker::builder(config.clone(), &group)
        .handle_on(&topic, |_job: TestJob, _ctx: kjob::JobContext| async {
            Err(kjob::JobError::retryable("test: downstream 503"))
        })
        .retry(kjob::retry::RetryPolicy::tiers([Duration::from_secs(3600)]))
        .build()
        .expect("worker builds");
    let running = start(w);
    let producer = Producer::new(&config).expect("producer");
    let mut ids = Vec::new();
    for i in 0..3 {
        let e = producer
            .enqueue_to(&topic, &TestJob::ok(format!("w{i}"), i))
            .await
            .expect("enqueue");
        ids.push(e.id);
    }
    let before = kjob::dlq::now_ms();
    let delayed = producer
        .enqueue_in_to(&topic, &TestJob::ok("later", 9), Duration::from_secs(7200))
        .await
        .expect("enqueue_in");
    let tier = kjob::retry::tier_topic(&topic, Duration::from_secs(3600));
    wait_topics_exist(&config, std::slice::from_ref(&tier), "the retry tier").await;

    let (_ui, base) = dashboard(
        &config,
        &["--no-discover", "--route", &format!("{topic}={group}")],
    )
    .await;
    let url = format!("{base}/waiting?topic={topic}&group={group}");
    // The three failed jobs wait in the tier, due an hour after they failed.
    eventually_text(
        &c,
        &url,
        &format!("section.waiting[data-topic='{tier}'] span.count"),
        "3",
    )
    .await;
    for id in &ids {
        let due = c
            .find(Locator::Css(&format!(
                "section.waiting[data-topic='{tier}'] tr[data-id='{id}'] td.due time"
            )))
            .await
            .unwrap_or_else(|e| panic!("job {id} in the tier: {e}"))
            .attr("title")
            .await
            .expect("attr")
            .and_then(|t| t.parse::<i64>().ok())
            .expect("the due time in ms");
        let ahead = due - kjob::dlq::now_ms();
        // An hour, give or take the policy's jitter.
        assert!(
            (2_880_000..=4_320_000).contains(&ahead),
            "due in about an hour, not {ahead} ms"
        );
    }
    // The delayed job waits in a delay topic, due at its run time.
    let row = format!("section.waiting tr[data-id='{}'] td.due time", delayed.id);
    let run_at = c
        .find(Locator::Css(&row))
        .await
        .unwrap_or_else(|e| panic!("the delayed job on the page: {e}"))
        .attr("title")
        .await
        .expect("attr")
        .and_then(|t| t.parse::<i64>().ok())
        .expect("the run time in ms");
    assert!(
        (run_at - (before + 7_200_000)).abs() < 5_000,
        "run at {run_at}, enqueued at {before} for two hours"
    );
    // A bound of one record per partition says there are more.
    c.goto(&format!("{url}&limit=1")).await.expect("goto");
    let rows = count(
        &c,
        &format!("section.waiting[data-topic='{tier}'] tbody tr"),
    )
    .await;
    assert!(rows <= 2, "one per partition of the tier's two: {rows}");
    assert!(
        text(&c, &format!("section.waiting[data-topic='{tier}'] p.more"))
            .await
            .contains("of 3"),
        "the rest is counted"
    );
    c.goto(&format!("{url}&limit=0")).await.expect("goto");
    assert!(text(&c, "div.error").await.contains("limit 0 must be"));
    // Linked from the route page.
    c.goto(&format!("{base}/route?topic={topic}&group={group}"))
        .await
        .expect("goto");
    click(&c, "#waiting-link").await;
    text(&c, &format!("section.waiting[data-topic='{tier}']")).await;
    save_screenshot(&c, "ui-waiting.png").await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_cancels_a_delayed_job_and_runs_a_waiting_retry_now() {
    init_logging();
    let (_driver, c) = browser().await;
    let config = ensure_stack();
    let topic = unique("ui.waitact");
    let group = unique("g");
    create_topic(&config, &topic, 2).await;
    let delays: Vec<(String, i32)> = kjob::delay::delay_topics(&topic)
        .into_iter()
        .map(|t| (t, 1))
        .collect();
    kjob::topics::create_topics(&config, &delays)
        .await
        .expect("delay topics");
    // "retry-once" fails its first attempt into the one tier, an hour away.
    let handled: Arc<Mutex<Vec<(i64, u32)>>> = Arc::default();
    let h = handled.clone();
    let w = kjob::Worker::builder(config.clone(), &group)
        .handle_on(&topic, move |job: TestJob, ctx: kjob::JobContext| {
            let h = h.clone();
            async move {
                if job.behaviour == "retry-once" && ctx.attempt == 1 {
                    return Err(kjob::JobError::retryable("test: downstream 503"));
                }
                h.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((job.seq, ctx.attempt));
                Ok(())
            }
        })
        .retry(kjob::retry::RetryPolicy::tiers([Duration::from_secs(3600)]))
        .build()
        .expect("worker builds");
    let running = start(w);
    let producer = Producer::new(&config).expect("producer");
    let mut failing = TestJob::ok("f", 1);
    failing.behaviour = "retry-once".into();
    let failed = producer
        .enqueue_to(&topic, &failing)
        .await
        .expect("enqueue");
    let in_20s = Duration::from_secs(20);
    let later = producer
        .enqueue_in_to(&topic, &TestJob::ok("later", 2), in_20s)
        .await
        .expect("enqueue_in");
    let keep = producer
        .enqueue_in_to(&topic, &TestJob::ok("keep", 3), in_20s)
        .await
        .expect("enqueue_in");
    let tier = kjob::retry::tier_topic(&topic, Duration::from_secs(3600));
    wait_topics_exist(&config, std::slice::from_ref(&tier), "the retry tier").await;
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
    let url = format!("{base}/waiting?topic={topic}&group={group}");
    eventually_text(
        &c,
        &url,
        &format!("section.waiting[data-topic='{tier}'] span.count"),
        "1",
    )
    .await;
    let row = |id: &str| format!("section.waiting tr[data-id='{id}']");
    // A cancel needs a reason: without one, 400 and nothing changes.
    click(&c, &format!("{} button.cancel", row(&keep.id))).await;
    assert!(
        text(&c, "div.error").await.contains("needs a reason"),
        "a cancel without a reason is refused"
    );
    // Cancel the delayed job, with a reason.
    c.goto(&url).await.expect("goto");
    c.find(Locator::Css(&format!("{} input.reason", row(&later.id))))
        .await
        .expect("the row's reason field")
        .send_keys("customer unsubscribed")
        .await
        .expect("type");
    click(&c, &format!("{} button.cancel", row(&later.id))).await;
    let notice = text(&c, "p.notice.done").await;
    assert!(
        notice.contains("cancelled") && notice.contains("ui-tester"),
        "{notice}"
    );
    // Run the waiting retry now, an hour early.
    c.goto(&url).await.expect("goto");
    click(
        &c,
        &format!(
            "section.waiting[data-topic='{tier}'] tr[data-id='{}'] button.now",
            failed.id
        ),
    )
    .await;
    let notice = text(&c, "p.notice.done").await;
    assert!(notice.contains("moved to now"), "{notice}");
    let ran = |seq: i64| {
        handled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(s, _)| *s == seq)
            .count()
    };
    eventually(Duration::from_secs(20), "the retry run now", || ran(1) == 1).await;
    assert!(
        handled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&(1, 2)),
        "it ran as its second attempt"
    );
    // The other delayed job runs when due; the cancelled one never does.
    eventually(Duration::from_secs(60), "the kept delayed job", || {
        ran(3) == 1
    })
    .await;
    eventually(Duration::from_secs(20), "the cancelled job skipped", || {
        WorkerStats::get(&running.stats.cancelled) == 1
    })
    .await;
    assert_eq!(ran(2), 0, "a cancelled delayed job never runs");
    // The moved retry's original waits out its hour, marked.
    c.goto(&url).await.expect("goto");
    let mark = format!(
        "section.waiting[data-topic='{tier}'] tr[data-id='{}'][data-cancelled='moved to now'] span.cancelled",
        failed.id
    );
    text(&c, &mark).await;
    let by = c
        .find(Locator::Css(&format!("{mark} strong")))
        .await
        .expect("who moved it")
        .html(true)
        .await
        .expect("html");
    assert_eq!(by, "ui-tester");
    save_screenshot(&c, "ui-waiting-actions.png").await;
    // Both audited on the group's control topic.
    let audit = kjob::control::read_control(&config, &group)
        .expect("controls")
        .audit;
    let acts: Vec<(String, String, String)> = audit
        .iter()
        .map(|a| (a.subject.clone(), a.action.clone(), a.by.clone()))
        .collect();
    assert_eq!(
        acts,
        [
            (
                format!("job:{}", later.id),
                "cancelled".into(),
                "ui-tester".into()
            ),
            (
                format!("job:{}", failed.id),
                "moved to now".into(),
                "ui-tester".into()
            ),
        ]
    );
    assert_eq!(audit[0].reason.as_deref(), Some("customer unsubscribed"));
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_route_page_shows_the_tenants_sharing_a_fair_route() {
    init_logging();
    let (_driver, c) = browser().await;
    let config = ensure_stack();
    let topic = unique("ui.fair");
    let group = unique("g");
    create_topic(&config, &topic, 2).await;
    let producer = Producer::new(&config).expect("producer");
    let contract = producer
        .codec()
        .register::<TestJob>(&topic)
        .await
        .expect("contract");
    let w = kjob::Worker::builder(config.clone(), &group)
        .handle_on(&topic, |job: TestJob, _ctx: kjob::JobContext| async move {
            if job.seq >= 0 {
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
            Ok::<(), kjob::JobError>(())
        })
        .concurrency(4)
        .fair_by_tenant(&topic)
        .build()
        .expect("worker builds");
    let running = start(w);
    // Warm: the contract's schema is cached, so no job waits for it.
    producer
        .enqueue_to(&topic, &TestJob::ok("warm", -1))
        .await
        .expect("enqueue");
    eventually(Duration::from_secs(60), "the warm-up ran", || {
        kjob::WorkerStats::get(&running.stats.handled) >= 1
    })
    .await;
    // TestJob has no tenant field: written as enqueue does, plus kjob-tenant.
    for (i, tenant) in (0..30).map(|i| (i, if i < 20 { "shop-a" } else { "shop-b" })) {
        let job = TestJob::ok(format!("k{i}"), i);
        let mut h = kjob::producer::enqueue_headers(&job, &kjob::producer::new_job_id());
        h.tenant = Some(tenant.into());
        let bytes = kjob::codec::Codec::encode(&contract, &job).expect("encode");
        producer
            .send_raw(
                &topic,
                Some(job.key.as_bytes()),
                Some(&bytes),
                h.to_owned_headers(),
            )
            .await
            .expect("enqueue");
    }
    let (_ui, base) = dashboard(
        &config,
        &["--no-discover", "--route", &format!("{topic}={group}")],
    )
    .await;
    let url = format!("{base}/route?topic={topic}&group={group}");
    // Four slots, two tenants with work: two each, the rest ready.
    eventually_text(
        &c,
        &url,
        "#tenants tr[data-tenant='shop-b'] td.running",
        "2",
    )
    .await;
    assert_eq!(
        text(&c, "#tenants tr[data-tenant='shop-a'] td.running").await,
        "2"
    );
    let ready: i64 = text(&c, "#tenants tr[data-tenant='shop-a'] td.ready")
        .await
        .parse()
        .expect("a count");
    assert!(ready > 0, "shop-a has jobs waiting for a slot: {ready}");
    save_screenshot(&c, "ui-route-tenants.png").await;
    running.stop().await;
}

/// The ticks (epoch ms) among `ids` of schedule `name`, and its manual
/// triggers' ids.
fn ticks_and_manual(ids: &[String], name: &str) -> (Vec<i64>, Vec<String>) {
    let prefix = format!("cron:{name}:");
    let (mut ticks, mut manual) = (Vec::new(), Vec::new());
    for id in ids {
        let Some(rest) = id.strip_prefix(&prefix) else {
            continue;
        };
        if rest.starts_with("manual:") {
            manual.push(id.clone());
        } else if let Ok(t) = humantime::parse_rfc3339(rest) {
            let ms = t
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0);
            ticks.push(ms);
        }
    }
    (ticks, manual)
}

/// A POST of a schedules form from the browser's page: the status code.
async fn post_schedule_from_page(
    c: &Client,
    action: &str,
    csrf: &str,
    group: &str,
    schedule: &str,
    reason: &str,
) -> u16 {
    let v = c
        .execute_async(
            r#"const [action, csrf, group, schedule, reason, done] = arguments;
               fetch('/schedules/' + action, { method: 'POST', credentials: 'same-origin',
                 body: new URLSearchParams({ csrf, group, schedule, reason }) })
                 .then(r => done(r.status), () => done(0));"#,
            vec![
                serde_json::json!(action),
                serde_json::json!(csrf),
                serde_json::json!(group),
                serde_json::json!(schedule),
                serde_json::json!(reason),
            ],
        )
        .await
        .expect("execute_async");
    v.as_u64().unwrap_or(0) as u16
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_is_paused_triggered_and_resumed_from_the_page_and_audited() {
    init_logging();
    let (_driver, c) = browser().await;
    let config = ensure_stack();
    let topic = unique("ui.cron");
    let group = unique("g");
    create_topic(&config, &topic, 1).await;
    let handled: Arc<Mutex<Vec<String>>> = Default::default();
    let seen = handled.clone();
    let worker = kjob::Worker::builder(config.clone(), &group)
        .handle_on(&topic, move |_job: TestJob, ctx: kjob::JobContext| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(ctx.id.to_string());
                Ok(())
            }
        })
        .schedule_with(
            kjob::schedule::Schedule::new("tick", "* * * * * *", || TestJob::ok("tick", 0))
                .on(&topic, || TestJob::ok("tick", 0)),
        )
        .build()
        .expect("worker builds");
    let running = start(worker);
    eventually(Duration::from_secs(60), "the first ticks", || {
        ticks_and_manual(&handled.lock().unwrap(), "tick").0.len() >= 2
    })
    .await;

    let (_ui, base) = dashboard(&config, &["--allow-actions", "--no-discover"]).await;
    let (_ro, ro_base) = dashboard(&config, &["--no-discover"]).await;
    let page = format!("{base}/schedules?group={group}");
    eventually_text(&c, &page, "tr[data-schedule='tick'] span.status", "running").await;
    let leader = text(&c, "p.leader").await;
    assert!(
        leader.contains(&format!("kjob-{group}-")),
        "the leader is the worker's member: {leader}"
    );
    assert!(
        text(&c, "tr[data-schedule='tick'] td.last")
            .await
            .contains("UTC"),
        "a last fired tick"
    );
    assert_eq!(count(&c, "#in-force").await, 0, "nothing in force yet");

    // A pause without a reason is refused, then one with a reason holds.
    let csrf = c
        .find(Locator::Css("form.pause input[name=csrf]"))
        .await
        .expect("the pause form")
        .attr("value")
        .await
        .expect("attr")
        .unwrap_or_default();
    assert_eq!(
        post_schedule_from_page(&c, "pause", &csrf, &group, "tick", " ").await,
        400
    );
    assert_eq!(
        post_schedule_from_page(&c, "resume", &csrf, &group, "tick", "").await,
        409,
        "a running schedule cannot be resumed"
    );
    assert_eq!(
        post_schedule_from_page(&c, "pause", &csrf, &group, "tock", "x").await,
        404,
        "no such schedule"
    );
    c.find(Locator::Css("form.pause input.reason"))
        .await
        .expect("the reason field")
        .send_keys("reports DB <b>migration</b>")
        .await
        .expect("type");
    click(&c, "form.pause button.pause").await;
    let paused_at = kjob::dlq::now_ms();
    let banner = text(&c, "#in-force").await;
    assert!(
        banner.contains("tick")
            && banner.contains("ui-tester")
            && banner.contains("<b>migration</b>"),
        "the confirmation page shows the pause, its actor and reason as text: {banner}"
    );
    // Shown on every page while in force.
    for other in ["/", "/dlq", "/batches"] {
        c.goto(&format!("{base}{other}")).await.expect("goto");
        assert!(
            text(&c, "#in-force span.control").await.contains("tick"),
            "the banner on {other}"
        );
    }
    // The leader reads the controls once a second (later on a loaded
    // machine): no tick fires once it has. A tick due before that may
    // still fire, and both checks below allow for it alike.
    const SEEN_WITHIN_MS: i64 = 3_500;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (ticks, _) = ticks_and_manual(&handled.lock().unwrap(), "tick");
    let late: Vec<i64> = ticks
        .iter()
        .copied()
        .filter(|t| *t > paused_at + SEEN_WITHIN_MS)
        .collect();
    assert!(
        late.is_empty(),
        "ticks fired while paused (paused at {paused_at}): {late:?}"
    );
    eventually_text(&c, &page, "tr[data-schedule='tick'] span.status", "paused").await;
    save_screenshot(&c, "ui-schedules.png").await;

    // Trigger now while paused: one job, with a manual id.
    click(&c, "form.trigger button.trigger").await;
    let job_id = text(&c, "code.job-id").await;
    assert!(
        job_id.starts_with("cron:tick:manual:"),
        "a manual id, not a tick's: {job_id}"
    );
    eventually(Duration::from_secs(30), "the triggered job handled", || {
        handled.lock().unwrap().contains(&job_id)
    })
    .await;
    eventually_text(
        &c,
        &page,
        "tr[data-schedule='tick'] td.manual span.fired",
        &job_id,
    )
    .await;

    // Read-only: no buttons, and its POSTs are 403.
    let ro_page = reqwest::get(format!("{ro_base}/schedules?group={group}"))
        .await
        .expect("GET")
        .text()
        .await
        .expect("body");
    assert!(ro_page.contains("data-schedule=\"tick\""), "{ro_page}");
    assert!(
        !ro_page.contains("/schedules/resume"),
        "no resume form when read-only"
    );
    let refused = reqwest::Client::new()
        .post(format!("{ro_base}/schedules/resume"))
        .header("origin", &ro_base)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("group={group}&schedule=tick"))
        .send()
        .await
        .expect("POST");
    assert_eq!(refused.status().as_u16(), 403);

    // Resume: ticks fire again from the next one; the paused ones are not
    // caught up.
    c.goto(&page).await.expect("goto");
    click(&c, "form.resume button.resume").await;
    let resumed_at = kjob::dlq::now_ms();
    // The confirmation page (not the page the click left).
    assert!(text(&c, "p.notice.done").await.contains("resumed"));
    assert_eq!(count(&c, "#in-force").await, 0, "the banner is gone");
    eventually(Duration::from_secs(20), "ticks after the resume", || {
        ticks_and_manual(&handled.lock().unwrap(), "tick")
            .0
            .iter()
            .any(|t| *t > resumed_at + 1_000)
    })
    .await;
    let (ticks, manual) = ticks_and_manual(&handled.lock().unwrap(), "tick");
    let caught_up: Vec<i64> = ticks
        .iter()
        .copied()
        .filter(|t| *t > paused_at + SEEN_WITHIN_MS && *t < resumed_at - 1_500)
        .collect();
    assert!(
        caught_up.is_empty(),
        "paused ticks were caught up (paused at {paused_at}, resumed at {resumed_at}): {caught_up:?}"
    );
    assert_eq!(
        manual,
        std::slice::from_ref(&job_id),
        "the trigger fired once"
    );

    // The CLI sees and steers the same state; the page shows the audit.
    let kjob = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_kjob-cli"))
            .args(args)
            .env("KJOB_BOOTSTRAP_SERVERS", &config.bootstrap_servers)
            .env("KJOB_SCHEMA_REGISTRY_URL", &config.schema_registry_url)
            .env("USER", "cli-tester")
            .output()
            .expect("running kjob");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let paused = kjob(&[
        "schedules",
        "--group",
        &group,
        "pause",
        "tick",
        "--reason",
        "from the CLI",
    ]);
    assert!(paused.contains("paused"), "{paused}");
    let listed = kjob(&["schedules", "--group", &group]);
    assert!(listed.contains("paused by cli-tester"), "{listed}");
    eventually_text(
        &c,
        &page,
        "tr[data-schedule='tick'] strong.by",
        "cli-tester",
    )
    .await;
    kjob(&["schedules", "--group", &group, "resume", "tick"]);
    let audit: Vec<String> = kjob::schedule::read_schedule_topic(&config, &group)
        .expect("the state topic")
        .audit
        .iter()
        .map(|a| format!("{} {}", a.action, a.by))
        .collect();
    assert_eq!(
        audit,
        [
            "paused ui-tester",
            "triggered ui-tester",
            "resumed ui-tester",
            "paused cli-tester",
            "resumed cli-tester"
        ]
    );
    c.goto(&page).await.expect("goto");
    assert_eq!(count(&c, "section.audit tbody tr").await, 5);
    not_pwned(&c).await;
    running.stop().await;
}

/// A worker of `group` on `topic` that records the seq of each job.
fn recording_worker(
    config: &KafkaConfig,
    group: &str,
    topic: &str,
    seen: Arc<Mutex<Vec<i64>>>,
) -> kjob::Worker {
    kjob::Worker::builder(config.clone(), group)
        .handle_on(topic, move |job: TestJob, _ctx: kjob::JobContext| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(job.seq);
                Ok(())
            }
        })
        .build()
        .expect("worker builds")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_paused_from_the_page_is_held_by_every_worker_of_the_group_until_resumed() {
    init_logging();
    let (_driver, c) = browser().await;
    let config = ensure_stack();
    let topic = unique("ui.pause");
    let group = unique("g");
    create_topic(&config, &topic, 4).await;
    let seen: Arc<Mutex<Vec<i64>>> = Default::default();
    let first = start(recording_worker(&config, &group, &topic, seen.clone()));
    let producer = Producer::new(&config).expect("producer");
    for i in 0..4 {
        producer
            .enqueue_to(&topic, &TestJob::ok(format!("k{i}"), i))
            .await
            .expect("enqueue");
    }
    eventually(Duration::from_secs(60), "the first jobs", || {
        seen.lock().unwrap().len() == 4
    })
    .await;

    let route = format!("{topic}={group}");
    let (_ui, base) = dashboard(
        &config,
        &["--allow-actions", "--no-discover", "--route", &route],
    )
    .await;
    let page = format!("{base}/route?topic={topic}&group={group}");
    eventually_text(&c, &page, "#route-control span.status", "running").await;
    c.find(Locator::Css("#pause-reason"))
        .await
        .expect("the reason field")
        .send_keys("payments provider incident")
        .await
        .expect("type");
    click(&c, "#pause-route").await;
    let banner = text(&c, "#in-force").await;
    assert!(
        banner.contains(&topic)
            && banner.contains("ui-tester")
            && banner.contains("payments provider incident"),
        "{banner}"
    );
    c.goto(&format!("{base}/")).await.expect("goto");
    assert!(
        text(&c, "#in-force code.route").await.contains(&topic),
        "the banner on the overview"
    );

    // Within a second every worker holds the route: nothing new runs, not
    // even on a worker that joins while it is paused.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for i in 10..18 {
        producer
            .enqueue_to(&topic, &TestJob::ok(format!("k{i}"), i))
            .await
            .expect("enqueue");
    }
    let second = start(recording_worker(&config, &group, &topic, seen.clone()));
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        seen.lock().unwrap().len(),
        4,
        "jobs ran while the route was paused: {:?}",
        seen.lock().unwrap()
    );
    eventually_text(&c, &page, "#route-control span.status", "paused").await;
    assert_eq!(text(&c, "#route-control strong.by").await, "ui-tester");
    save_screenshot(&c, "ui-route-paused.png").await;

    // A second pause is refused; the resume lets both workers run them all.
    let (code, _) = {
        let s = dashboard_session(&base, &page).await;
        s.post(
            "/route/pause",
            &format!("topic={topic}&group={group}&reason=again"),
        )
        .await
    };
    assert_eq!(code, 409, "a paused route cannot be paused again");
    click(&c, "#resume-route").await;
    // The confirmation page (not the page the click left).
    assert!(text(&c, "p.notice.done").await.contains("resumed"));
    assert_eq!(count(&c, "#in-force").await, 0, "the banner is gone");
    eventually(
        Duration::from_secs(30),
        "the held jobs after the resume",
        || seen.lock().unwrap().len() == 12,
    )
    .await;
    let mut ran: Vec<i64> = seen.lock().unwrap().clone();
    ran.sort();
    assert_eq!(
        ran,
        [0, 1, 2, 3, 10, 11, 12, 13, 14, 15, 16, 17],
        "each once"
    );

    let audit: Vec<String> = kjob::control::read_control(&config, &group)
        .expect("the control topic")
        .audit
        .iter()
        .map(|a| format!("{} {} {}", a.subject, a.action, a.by))
        .collect();
    assert_eq!(
        audit,
        [
            format!("route:{topic} paused ui-tester"),
            format!("route:{topic} resumed ui-tester")
        ]
    );
    // The CLI reads the same state.
    let out = Command::new(env!("CARGO_BIN_EXE_kjob-cli"))
        .args(["routes", "list", "--group", &group])
        .env("KJOB_BOOTSTRAP_SERVERS", &config.bootstrap_servers)
        .env("KJOB_SCHEMA_REGISTRY_URL", &config.schema_registry_url)
        .output()
        .expect("running kjob");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("no route is paused"), "{stdout}");
    not_pwned(&c).await;
    second.stop().await;
    first.stop().await;
}

/// A plain-HTTP session (cookie and form token) from a first GET of `page`.
async fn dashboard_session(base: &str, page: &str) -> HttpSession {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let r = http.get(page).send().await.expect("GET");
    let cookie = session_cookie(&r);
    let body = r.text().await.unwrap_or_default();
    HttpSession {
        http,
        base: base.to_string(),
        cookie,
        csrf: form_token(&body),
    }
}

struct HttpSession {
    http: reqwest::Client,
    base: String,
    cookie: String,
    csrf: String,
}

impl HttpSession {
    async fn post(&self, path: &str, body: &str) -> (u16, String) {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .header("origin", &self.base)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("csrf={}&{body}", self.csrf))
            .send()
            .await
            .expect("POST");
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_page_shows_each_process_with_its_heartbeat_and_assignment() {
    init_logging();
    let (_driver, c) = browser().await;
    let config = ensure_stack();
    let topic = unique("ui.workers");
    let group = unique("g");
    create_topic(&config, &topic, 4).await;
    let seen: Arc<Mutex<Vec<i64>>> = Default::default();
    let here = start(recording_worker(&config, &group, &topic, seen.clone()));
    let record = std::env::temp_dir().join(unique("kjob-workers"));
    let child = Command::new(env!("CARGO_BIN_EXE_test-worker"))
        .env("KJOB_TEST_TOPIC", &topic)
        .env("KJOB_TEST_GROUP", &group)
        .env("KJOB_TEST_RECORD", &record)
        .stdout(Stdio::null())
        .spawn()
        .expect("test-worker runs");
    let child_pid = child.id();
    let mut child = Guard(child);
    let (_ui, base) = dashboard(&config, &["--no-discover"]).await;
    let page = format!("{base}/workers?group={group}");
    let me = std::process::id();
    // Both processes, each a member with a fresh heartbeat.
    let start_wait = Instant::now();
    loop {
        c.goto(&page).await.expect("goto");
        let fresh = count(&c, "tr[data-member='true'][data-stale='false']").await;
        if fresh == 2 {
            break;
        }
        assert!(
            start_wait.elapsed() < Duration::from_secs(60),
            "two fresh members: {}",
            c.source().await.unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let pids: Vec<String> = {
        let mut out = Vec::new();
        for e in c
            .find_all(Locator::Css("table.workers tbody tr td:nth-child(3)"))
            .await
            .expect("cells")
        {
            out.push(e.text().await.expect("text"));
        }
        out.sort();
        out
    };
    let mut want = vec![me.to_string(), child_pid.to_string()];
    want.sort();
    assert_eq!(pids, want, "one row per process, by pid");
    // Work shows as jobs/s in the next heartbeat of whoever handled it.
    let producer = Producer::new(&config).expect("producer");
    for i in 0..200 {
        producer
            .enqueue_to(&topic, &TestJob::ok(format!("k{i}"), i))
            .await
            .expect("enqueue");
    }
    let start_wait = Instant::now();
    loop {
        c.goto(&page).await.expect("goto");
        let mut busy_rows = 0;
        for e in c
            .find_all(Locator::Css("table.workers td.rate"))
            .await
            .expect("cells")
        {
            if e.text().await.unwrap_or_default() != "0.0" {
                busy_rows += 1;
            }
        }
        if busy_rows > 0 {
            break;
        }
        assert!(
            start_wait.elapsed() < Duration::from_secs(30),
            "no jobs/s after 200 jobs"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let mine = format!("tr[data-client$='-{me}']");
    assert!(text(&c, &format!("{mine} td.rss")).await.ends_with("MiB"));
    let busy = text(&c, &format!("{mine} td.busy")).await;
    assert!(busy.contains(" / "), "busy / slots: {busy}");
    // Four partitions between two members: each shows its share.
    let a = text(&c, &format!("{mine} td.assignment")).await;
    assert!(a.contains(&topic), "the assignment names the topic: {a}");
    save_screenshot(&c, "ui-workers.png").await;

    // The child stops: it leaves the group, and its row goes or says so.
    let _ = Command::new("kill")
        .args(["-TERM", &child_pid.to_string()])
        .status();
    let _ = child.0.wait();
    let gone = format!("tr[data-client$='-{child_pid}']");
    let start_wait = Instant::now();
    loop {
        c.goto(&page).await.expect("goto");
        let still_member = count(&c, &format!("{gone}[data-member='true']")).await;
        if still_member == 0 {
            break;
        }
        assert!(
            start_wait.elapsed() < Duration::from_secs(60),
            "the stopped worker left"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(count(&c, &format!("{mine}[data-member='true']")).await, 1);
    not_pwned(&c).await;
    here.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minute_of_history_with_handler_durations_survives_a_dashboard_restart() {
    init_logging();
    let (_driver, c) = browser().await;
    let config = ensure_stack();
    let topic = unique("ui.history");
    let group = unique("g");
    create_topic(&config, &topic, 2).await;
    // Handlers that take about 20 ms.
    let worker = kjob::Worker::builder(config.clone(), &group)
        .handle_on(&topic, |_job: TestJob, _ctx: kjob::JobContext| async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(())
        })
        .build()
        .expect("worker builds");
    let running = start(worker);
    let route = format!("{topic}={group}");
    let (ui, base) = dashboard(&config, &["--no-discover", "--route", &route]).await;
    let producer = Producer::new(&config).expect("producer");
    let page = format!("{base}/route?topic={topic}&group={group}");
    // Jobs all through the next whole minute, until a point is recorded.
    let start_wait = Instant::now();
    let mut i = 0;
    loop {
        for _ in 0..10 {
            producer
                .enqueue_to(&topic, &TestJob::ok(format!("k{i}"), i))
                .await
                .expect("enqueue");
            i += 1;
        }
        c.goto(&page).await.expect("goto");
        if count(&c, "#day span.minutes").await > 0 {
            let p50 = text(&c, "#day .p50").await;
            if p50 != "-" {
                break;
            }
        }
        assert!(
            start_wait.elapsed() < Duration::from_secs(150),
            "no minute with durations after 150 s"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let p50: f64 = text(&c, "#day .p50").await.parse().expect("p50 in ms");
    let p99: f64 = text(&c, "#day .p99").await.parse().expect("p99 in ms");
    assert!(
        (15.0..=60.0).contains(&p50),
        "handlers take ~20 ms: p50 {p50}"
    );
    assert!(p99 >= p50, "p99 {p99} >= p50 {p50}");
    let handled: f64 = text(&c, "#day [data-series='handled'] .value")
        .await
        .parse()
        .expect("handled");
    assert!(handled > 0.0, "jobs handled in the minute");
    save_screenshot(&c, "ui-history.png").await;

    // A new dashboard process starts with the recorded minute.
    drop(ui);
    let (_ui2, base2) = dashboard(&config, &["--no-discover", "--route", &route]).await;
    let page2 = format!("{base2}/route?topic={topic}&group={group}");
    let start_wait = Instant::now();
    loop {
        c.goto(&page2).await.expect("goto");
        // The route page answers once the route is sampled; the history
        // was read from the topic before that.
        if count(&c, "#day").await > 0 {
            break;
        }
        assert!(start_wait.elapsed() < Duration::from_secs(30), "route page");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let minutes: usize = text(&c, "#day span.minutes")
        .await
        .parse()
        .expect("minutes");
    assert!(minutes >= 1, "the restarted dashboard has the minute");
    let again: f64 = text(&c, "#day .p50")
        .await
        .parse()
        .expect("p50 after restart");
    assert!((15.0..=60.0).contains(&again), "p50 after restart {again}");
    running.stop().await;
}
