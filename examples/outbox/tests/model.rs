//! The outbox example's worker prints its deployment model with
//! `KJOB_DESCRIBE=json`, and a run of the example creates exactly the
//! topics it lists (with the local stack, which `./dev test` starts).

use std::collections::BTreeSet;
use std::process::Command;

use kjob::deployment::{Deployment, Role};

const EXAMPLE: &str = env!("CARGO_BIN_EXE_kjob-example-outbox");

#[test]
fn a_run_creates_exactly_the_topics_of_its_model() {
    let described = Command::new(EXAMPLE)
        .env("KJOB_DESCRIBE", "json")
        .env("RUST_LOG", "warn")
        .output()
        .expect("running the example");
    assert!(
        described.status.success(),
        "{}",
        String::from_utf8_lossy(&described.stderr)
    );
    let stdout = String::from_utf8_lossy(&described.stdout);
    let start = stdout.find("{\n").expect("the model on stdout");
    let end = stdout.rfind("\n}").expect("the model's end") + 2;
    let model = Deployment::from_json(&stdout[start..end]).expect("a model");
    let run = Command::new(EXAMPLE)
        .env("RUST_LOG", "warn")
        .output()
        .expect("running the example");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let mains: Vec<String> = model
        .topics
        .iter()
        .filter(|t| t.role == Role::Main)
        .map(|t| t.topic.clone())
        .collect();
    let owners: Vec<String> = mains.iter().cloned().chain([model.group.clone()]).collect();
    let config = kjob::KafkaConfig::from_env();
    let on_broker: BTreeSet<String> = kjob::topics::list_topics(&config)
        .expect("listing topics")
        .into_iter()
        .filter(|t| {
            !t.ends_with(".dlq.audit")
                && owners
                    .iter()
                    .any(|o| t == o || t.starts_with(&format!("{o}.")))
        })
        .collect();
    let want: BTreeSet<String> = model.topic_names().into_iter().collect();
    assert_eq!(
        on_broker, want,
        "the broker's topics (left), the model (right)"
    );
}
