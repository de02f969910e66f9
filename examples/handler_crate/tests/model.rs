//! The worker binary prints its deployment model with `KJOB_DESCRIBE=json`
//! and, once running, has created exactly the topics it lists (with the
//! local stack, which `./dev test` starts).

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kjob::deployment::Deployment;

const WORKER: &str = env!("CARGO_BIN_EXE_kjob-example-handler-crate");

fn worker(render: &str, mail: &str, group: &str) -> Command {
    let mut c = Command::new(WORKER);
    c.env("KJOB_RENDER_TOPIC", render)
        .env("KJOB_MAIL_TOPIC", mail)
        .env("KJOB_GROUP", group)
        .env("KJOB_METRICS_ADDR", "127.0.0.1:0")
        .env("RUST_LOG", "warn");
    c
}

#[test]
fn the_worker_creates_exactly_the_topics_of_its_model() {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let id = format!("{}-{nanos:x}", std::process::id());
    let (render, mail, group) = (
        format!("model.render.{id}"),
        format!("model.mail.{id}"),
        format!("model-invoices-{id}"),
    );
    let out = worker(&render, &mail, &group)
        .env("KJOB_DESCRIBE", "json")
        .output()
        .expect("running the worker");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The worker's own log lines may follow the model.
    let start = stdout.find("{\n").expect("the model on stdout");
    let end = stdout.rfind("\n}").expect("the model's end") + 2;
    let model = Deployment::from_json(&stdout[start..end]).expect("a model");
    let want: BTreeSet<String> = model.topic_names().into_iter().collect();
    assert!(want.contains(&format!("{render}.dlq")), "{want:?}");
    let mut child = worker(&render, &mail, &group)
        .stdout(Stdio::null())
        .spawn()
        .expect("starting the worker");
    let config = kjob::KafkaConfig::from_env();
    let owned = |t: &String| {
        !t.ends_with(".dlq.audit")
            && [&render, &mail, &group]
                .iter()
                .any(|o| t == *o || t.starts_with(&format!("{o}.")))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let on_broker = loop {
        let found: BTreeSet<String> = kjob::topics::list_topics(&config)
            .expect("listing topics")
            .into_iter()
            .filter(owned)
            .collect();
        if found.is_superset(&want) || Instant::now() > deadline {
            // The heartbeat creates the control topic last; a stray topic
            // would show within the same moments.
            std::thread::sleep(Duration::from_secs(2));
            break kjob::topics::list_topics(&config)
                .expect("listing topics")
                .into_iter()
                .filter(owned)
                .collect::<BTreeSet<String>>();
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        on_broker, want,
        "the broker's topics (left), the model (right)"
    );
}
