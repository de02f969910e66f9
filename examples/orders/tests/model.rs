//! The demo's deployment model: `--describe` prints it without connecting,
//! the book's topology chapter shows the same JSON, and a demo run creates
//! exactly the topics it lists (with the local stack, which `./dev test`
//! starts).

use std::collections::BTreeSet;
use std::process::Command;

use kjob::deployment::{Deployment, Role};

const DEMO: &str = env!("CARGO_BIN_EXE_kjob-example-orders");

fn describe(group: Option<&str>) -> (String, Deployment) {
    let mut c = Command::new(DEMO);
    c.arg("--describe")
        .env("KJOB_BOOTSTRAP_SERVERS", "127.0.0.1:1")
        .env("RUST_LOG", "off");
    if let Some(g) = group {
        c.args(["--group", g]);
    }
    let out = c.output().expect("running the demo");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let model = Deployment::from_json(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (text, model)
}

#[test]
fn the_demo_prints_its_model_and_the_book_shows_the_same() {
    let (text, model) = describe(None);
    let count = |role: Role| model.topics.iter().filter(|t| t.role == role).count();
    assert_eq!(model.topics.len(), 17);
    assert_eq!(
        [
            count(Role::Main),
            count(Role::Dlq),
            count(Role::SharedRetryTier),
            count(Role::SharedDelay),
            count(Role::Control)
        ],
        [3, 3, 3, 7, 1]
    );
    let book = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/src/topology.md"),
    )
    .expect("the topology chapter");
    let shown = book
        .split("<!-- the orders demo's model: examples/orders/tests/model.rs -->")
        .nth(1)
        .and_then(|rest| rest.split("```json").nth(1))
        .and_then(|rest| rest.split("```").next())
        .expect("the model's block in docs/src/topology.md")
        .trim();
    assert_eq!(
        shown, text,
        "docs/src/topology.md shows another model than `cargo run -p kjob-example-orders -- --describe` prints"
    );
}

#[test]
fn a_demo_run_creates_exactly_the_topics_of_its_model() {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let group = format!("orders-demo-model-{}-{nanos:x}", std::process::id());
    let (_, model) = describe(Some(&group));
    let out = Command::new(DEMO)
        .args([
            "--jobs",
            "30",
            "--transient-rate",
            "0",
            "--timeout-secs",
            "120",
        ])
        .args(["--group", &group])
        .env("RUST_LOG", "warn")
        .output()
        .expect("running the demo");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mains: Vec<String> = model
        .topics
        .iter()
        .filter(|t| t.role == Role::Main)
        .map(|t| t.topic.clone())
        .collect();
    let config = kjob::KafkaConfig::from_env();
    let on_broker: BTreeSet<String> = kjob::topics::list_topics(&config)
        .expect("listing topics")
        .into_iter()
        .filter(|t| {
            // A DLQ's audit trail is the operators' (`kjob dlq`), never the
            // worker's.
            !t.ends_with(".dlq.audit")
                && (t.starts_with(&format!("{group}."))
                    || mains
                        .iter()
                        .any(|m| t == m || t.starts_with(&format!("{m}."))))
        })
        .collect();
    let want: BTreeSet<String> = model.topic_names().into_iter().collect();
    assert_eq!(
        on_broker, want,
        "the broker's topics (left), the model (right)"
    );
}
