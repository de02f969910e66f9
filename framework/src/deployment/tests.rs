//! Unit tests of the deployment model: what a worker lists, that the name
//! rules agree with it, and the ACLs it derives.

use super::*;
use crate::{Job, JobContext, JobError, KafkaConfig, Worker};

#[derive(serde::Serialize, serde::Deserialize)]
struct Invoice {
    id: String,
}
impl Job for Invoice {
    const NAME: &'static str = "invoices";
    const VERSION: u32 = 1;
    const SCHEMA: &'static str =
        r#"{"type":"record","name":"Invoice","fields":[{"name":"id","type":"string"}]}"#;
    fn key(&self) -> String {
        self.id.clone()
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Posting {
    id: String,
}
impl Job for Posting {
    const NAME: &'static str = "ledger";
    const VERSION: u32 = 1;
    const SCHEMA: &'static str =
        r#"{"type":"record","name":"Posting","fields":[{"name":"id","type":"string"}]}"#;
    fn key(&self) -> String {
        self.id.clone()
    }
}

async fn invoice(_: Invoice, _: JobContext) -> Result<(), JobError> {
    Ok(())
}

async fn posting(_: Posting, _: JobContext) -> Result<(), JobError> {
    Ok(())
}

/// A worker with every feature that adds a topic or a group.
fn everything() -> Worker {
    Worker::builder(KafkaConfig::from_env(), "billing")
        .handle(invoice)
        .handle_on("billing.invoices.eu", invoice)
        .handle(posting)
        .strict_order("ledger")
        .delayed_jobs(true)
        .shared_retry_tiers_with(crate::SharedTiers::default().delay_buckets())
        .batches_on("billing.batches")
        .schedule("nightly", "0 0 3 * * *", || Invoice { id: "n".into() })
        .build()
        .unwrap()
}

fn roles(model: &Deployment) -> Vec<(String, Role)> {
    model
        .topics
        .iter()
        .map(|t| (t.topic.clone(), t.role))
        .collect()
}

#[test]
fn a_worker_lists_every_topic_group_and_subject_it_owns() {
    let model = everything().deployment();
    let has = |topic: &str, role: Role| {
        assert!(
            roles(&model).contains(&(topic.to_string(), role)),
            "{topic} as {role:?} in {:#?}",
            roles(&model)
        )
    };
    has("invoices", Role::Main);
    has("billing.invoices.eu", Role::Main);
    has("ledger", Role::Main);
    has("invoices.dlq", Role::Dlq);
    has("ledger.dlq", Role::Dlq);
    has("ledger.order", Role::StrictOrder);
    // Strict order keeps tiers of its own; the others share the group's.
    has("ledger.retry.30s", Role::RetryTier);
    has("billing.retry.30s", Role::SharedRetryTier);
    has("billing.delay.1s", Role::SharedDelay);
    has("billing.schedules", Role::CronLeader);
    has("billing.schedules.state", Role::CronState);
    has("billing.batches", Role::Batch);
    has("billing.batches.state", Role::BatchState);
    has("billing.control", Role::Control);
    assert!(
        model.topic("invoices.retry.30s").is_none(),
        "a sharing route has no tiers of its own"
    );
    let shared = model.topic("billing.retry.30s").unwrap();
    assert_eq!(shared.shared_by, vec!["billing.invoices.eu", "invoices"]);
    assert_eq!(
        model.topic("ledger.retry.30s").unwrap().partitions,
        Partitions::SameAs("ledger".into())
    );
    assert!(!model.topic("invoices").unwrap().created_by_worker);
    let groups: Vec<(&str, GroupRole)> = model
        .groups
        .iter()
        .map(|g| (g.group.as_str(), g.role))
        .collect();
    assert_eq!(
        groups,
        vec![
            ("billing", GroupRole::Worker),
            ("billing.batches.coordinator", GroupRole::BatchCoordinator)
        ]
    );
    assert!(model.groups[0]
        .topics
        .contains(&"billing.schedules".to_string()));
    assert!(!model.groups[0]
        .topics
        .contains(&"billing.control".to_string()));
    let subjects: Vec<(&str, &str)> = model
        .subjects
        .iter()
        .map(|s| (s.subject.as_str(), s.job.as_str()))
        .collect();
    assert_eq!(
        subjects,
        vec![
            ("billing.invoices.eu-value", "invoices"),
            ("invoices-value", "invoices"),
            ("ledger-value", "ledger"),
        ],
        "subjects are named from topics, not contracts"
    );
    assert_eq!(model.writes_to, vec!["invoices"]);
}

#[test]
fn the_name_rules_agree_with_the_model_for_every_topic() {
    let model = everything().deployment();
    let topics = model.topic_names();
    let groups: Vec<String> = model.groups.iter().map(|g| g.group.clone()).collect();
    let found = classify(&topics, &groups);
    for t in &model.topics {
        let c = found
            .get(&t.topic)
            .unwrap_or_else(|| panic!("{} has no role by name", t.topic));
        assert_eq!(c.role, t.role, "{}", t.topic);
        if !t.role.group_wide() && t.route.is_some() {
            assert_eq!(c.route, t.route, "{}", t.topic);
        }
        assert_eq!(c.delay, t.delay, "{}", t.topic);
    }
    // Without the group, the shared tiers read as a route's: the reason
    // the rules take the groups.
    let blind = classify(&topics, &[]);
    assert_eq!(blind["billing.retry.30s"].role, Role::RetryTier);
    // A plain topic with nothing of its own is no kjob topic.
    let lone = classify(&["payments".to_string()], &[]);
    assert!(lone.is_empty());
}

#[test]
fn the_model_round_trips_through_json() {
    let model = everything().deployment();
    let json = model.to_json();
    assert!(json.contains(r#""role": "shared_retry_tier""#), "{json}");
    assert_eq!(Deployment::from_json(&json).unwrap(), model);
    let err = Deployment::from_json("{\"group\": 1}")
        .unwrap_err()
        .to_string();
    assert!(err.contains("KJOB_DESCRIBE=json"), "{err}");
}

#[test]
fn acls_are_literal_grants_of_each_role_s_rule_plus_create() {
    let model = everything().deployment();
    let acls = model.acls("User:billing");
    let of = |name: &str| {
        acls.iter()
            .find(|a| a.name == name)
            .unwrap_or_else(|| panic!("no ACL for {name}"))
    };
    use AclOperation::*;
    assert_eq!(
        of("invoices").operations,
        vec![Read, DescribeConfigs, Write]
    );
    assert_eq!(of("ledger").operations, vec![Read, DescribeConfigs]);
    assert_eq!(of("invoices.dlq").operations, vec![Write, Create]);
    assert_eq!(
        of("billing.delay.1s").operations,
        vec![Read, Write, DescribeConfigs, Create]
    );
    assert_eq!(of("billing").resource, AclResource::Group);
    assert_eq!(of("billing.batches.coordinator").operations, vec![Read]);
    assert_eq!(
        of("billing.control").command("b:9092"),
        "kafka-acls --bootstrap-server b:9092 --add --allow-principal User:billing \
         --operation Read --operation Write --operation Create --topic billing.control"
    );
    // One grant per topic and group, nothing else.
    assert_eq!(acls.len(), model.topics.len() + model.groups.len());
    let admin_made = Worker::builder(KafkaConfig::from_env(), "billing")
        .handle(invoice)
        .create_topics(false)
        .build()
        .unwrap()
        .deployment()
        .acls("User:b");
    assert!(
        admin_made.iter().all(|a| !a.operations.contains(&Create)),
        "{admin_made:?}"
    );
}

#[test]
fn every_role_the_worker_touches_has_a_rule_and_the_audit_trail_has_none() {
    let rows = acls::rows();
    for role in Role::ALL {
        let has = rows.iter().any(|r| r.role == Some(role));
        assert_eq!(has, role != Role::DlqAudit, "{role:?}");
    }
    assert_eq!(rows.iter().filter(|r| r.group.is_some()).count(), 2);
}
