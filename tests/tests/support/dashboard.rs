//! A `kjob ui` process and an HTTP session with it (its cookie and form
//! token), for the dashboard tests that need no browser.

#![allow(dead_code)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kjob::KafkaConfig;
use kjob_integration_tests::read_all;
use rdkafka::Message;

/// The dashboard process, killed when the test ends however it ends.
pub struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free local port")
}

/// Starts `kjob ui` (no discovery, `USER=index-tester`) with `args` on a
/// free port and waits until it answers.
pub async fn dashboard(config: &KafkaConfig, args: &[&str]) -> (Guard, String) {
    start_ui(config, &[&["--no-discover"], args].concat()).await
}

/// [`dashboard`] finding routes from the consumer groups, as `kjob ui`
/// does by default.
pub async fn discovering_dashboard(config: &KafkaConfig, args: &[&str]) -> (Guard, String) {
    start_ui(config, args).await
}

async fn start_ui(config: &KafkaConfig, args: &[&str]) -> (Guard, String) {
    let listen = format!("127.0.0.1:{}", free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_kjob-cli"))
        .args(["ui", "--listen", &listen, "--sample-every", "1s"])
        .args(args)
        .env("KJOB_BOOTSTRAP_SERVERS", &config.bootstrap_servers)
        .env("KJOB_SCHEMA_REGISTRY_URL", &config.schema_registry_url)
        .env("USER", "index-tester")
        .env_remove("KJOB_UI_TOKEN")
        .stdout(Stdio::null())
        .spawn()
        .expect("starting kjob ui");
    let base = format!("http://{listen}");
    let start = Instant::now();
    while reqwest::get(format!("{base}/assets/style.css"))
        .await
        .is_err()
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "kjob ui did not answer"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (Guard(child), base)
}

/// An attribute's value after the first `marker` on a page.
pub fn attr(page: &str, marker: &str, name: &str) -> String {
    let from = page
        .find(marker)
        .unwrap_or_else(|| panic!("no `{marker}` on\n{page}"));
    let needle = format!("{name}=\"");
    let rest = &page[from..];
    let v = rest.find(&needle).expect("the attribute") + needle.len();
    rest[v..].split('"').next().unwrap_or_default().to_string()
}

pub struct Session {
    pub http: reqwest::Client,
    pub base: String,
    pub cookie: String,
    pub csrf: String,
}

impl Session {
    pub async fn get(&self, target: &str) -> String {
        let r = self
            .http
            .get(format!("{}{target}", self.base))
            .header("cookie", &self.cookie)
            .send()
            .await
            .expect("GET");
        assert_eq!(r.status().as_u16(), 200, "GET {target}");
        r.text().await.expect("body")
    }
    pub async fn post(&self, path: &str, body: &str) -> (u16, String) {
        self.post_with(path, body, &[]).await
    }
    /// A same-origin POST of the session's form with `headers` added.
    pub async fn post_with(
        &self,
        path: &str,
        body: &str,
        headers: &[(&str, &str)],
    ) -> (u16, String) {
        let mut req = self
            .http
            .post(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .header("origin", &self.base)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("csrf={}&{body}", self.csrf));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let r = req.send().await.expect("POST");
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    }
    /// The DLQ page once the index has caught up and `ready` holds.
    pub async fn settled(&self, target: &str, ready: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let page = self.get(target).await;
            if !page.contains("id=\"indexing\"") && ready(&page) {
                return page;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "never settled:\n{page}"
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

/// A session: the cookie and form token of a first GET of the DLQ page.
pub async fn session(base: &str, topic: &str) -> Session {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let r = http
        .get(format!("{base}/dlq?topic={topic}"))
        .send()
        .await
        .expect("GET");
    let cookie = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("kjob_ui_session="))
        .and_then(|v| v.split(';').next())
        .expect("a session cookie")
        .to_string();
    let page = r.text().await.unwrap_or_default();
    let csrf = attr(&page, "name=\"csrf\"", "value");
    Session {
        http,
        base: base.to_string(),
        cookie,
        csrf,
    }
}

/// The audit entries of a route's DLQ as `(coordinates, entry)`.
pub fn audit(config: &KafkaConfig, topic: &str) -> Vec<(String, serde_json::Value)> {
    read_all(config, &format!("{topic}.dlq.audit"))
        .iter()
        .filter_map(|m| {
            let k = String::from_utf8_lossy(m.key()?).into_owned();
            Some((k, serde_json::from_slice(m.payload()?).ok()?))
        })
        .collect()
}
