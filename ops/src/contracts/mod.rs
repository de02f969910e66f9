//! Contract files (`schemas/<name>.v<N>.avsc`) against the schema
//! registry: what `kjob schema check` and `kjob schema register` work on.
//!
//! The compatibility rules themselves are kjob's ([`kjob::schema::check`]),
//! the same ones a producer applies before it registers a contract, so CI
//! and a deploy can never disagree.
//!
//! Which subject a contract is checked under is the subject of the topic
//! it travels on (TopicNameStrategy: `<topic>-value`), the rule producers
//! and workers register and read by. A route on `handle_on("other.topic")`
//! reads `other.topic-value`, not the contract's own subject, so
//! [`targets`] pairs contracts with topics: named with `--topic`, read from
//! a worker's model (`--model`, the subjects `KJOB_DESCRIBE=json` lists), or
//! by default the contract's own name.

pub mod in_flight;

use std::path::{Path, PathBuf};

use apache_avro::Schema;

use kjob::codec::subject_for_topic;
use kjob::deployment::Deployment;
use kjob::error::{Error, Result};
use kjob::registry::RegistryClient;
use kjob::schema::Compatibility;

/// A contract file `schemas/<name>.v<N>.avsc`.
#[derive(Clone, Debug)]
pub struct LocalContract {
    /// Contract name (and default main topic).
    pub name: String,
    /// Version from the file name.
    pub version: u32,
    /// Where it was read from.
    pub path: PathBuf,
    /// The schema text.
    pub raw: String,
    /// The parsed schema.
    pub schema: Schema,
}

/// Loads every `<name>.v<N>.avsc` in `dir`, sorted by name and version. A
/// file that does not parse is an error naming it.
pub fn load_dir(dir: &Path) -> Result<Vec<LocalContract>> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |e: std::io::Error| Error::Io {
            path,
            source: std::sync::Arc::new(e),
        }
    };
    let entries = std::fs::read_dir(dir).map_err(io(dir))?;
    let mut out = Vec::new();
    for entry in entries {
        let path = entry.map_err(io(dir))?.path();
        let Some(file) = path.file_name().and_then(|f| f.to_str()) else {
            continue;
        };
        let Some(stem) = file.strip_suffix(".avsc") else {
            continue;
        };
        let Some((name, version)) = stem
            .rsplit_once(".v")
            .and_then(|(n, v)| v.parse::<u32>().ok().map(|v| (n.to_string(), v)))
        else {
            return Err(Error::ContractFileName { path });
        };
        let raw = std::fs::read_to_string(&path).map_err(io(&path))?;
        let schema = Schema::parse_str(&raw).map_err(|e| Error::Contract {
            job: name.clone(),
            message: format!("{} does not parse: {e}", path.display()),
        })?;
        out.push(LocalContract {
            name,
            version,
            path,
            raw,
            schema,
        });
    }
    out.sort_by(|a, b| (&a.name, a.version).cmp(&(&b.name, b.version)));
    Ok(out)
}

/// The highest version of each contract name.
pub fn latest(contracts: &[LocalContract]) -> Vec<&LocalContract> {
    let mut out: Vec<&LocalContract> = Vec::new();
    for c in contracts {
        match out.last_mut() {
            Some(last) if last.name == c.name => *last = c,
            _ => out.push(c),
        }
    }
    out
}

/// The subject's own compatibility level, or `None` if it has none set.
pub async fn subject_compatibility(
    client: &RegistryClient,
    subject: &str,
) -> Result<Option<Compatibility>> {
    client.compatibility(subject).await
}

/// Sets the subject's compatibility level.
pub async fn set_subject_compatibility(
    client: &RegistryClient,
    subject: &str,
    level: Compatibility,
) -> Result<()> {
    client.set_compatibility(subject, level).await
}

/// One contract to check or register under one topic's subject.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The contract's name (its files' `<name>`).
    pub contract: String,
    /// The topic whose subject it goes under.
    pub topic: String,
    /// `<topic>-value`.
    pub subject: String,
    /// How the topic was found.
    pub found_by: FoundBy,
}

/// How a [`Target`]'s topic was found: tables print it, so a reader sees
/// which subject was used and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FoundBy {
    /// The contract's own name (the default main topic).
    ContractName,
    /// A `--topic` flag.
    TopicFlag,
    /// The worker model's subjects (`--model`).
    Model,
    /// The registry holds the same record name under this subject, while
    /// the contract's own subject is empty: most likely a route on another
    /// topic (`handle_on`).
    SameRecord,
}

impl FoundBy {
    /// How tables and JSON name it.
    pub fn label(&self) -> &'static str {
        match self {
            FoundBy::ContractName => "contract name",
            FoundBy::TopicFlag => "--topic",
            FoundBy::Model => "model",
            FoundBy::SameRecord => "same record",
        }
    }
}

/// Pairs the contracts in a directory with the topics whose subjects they
/// go under: each `--topic` (with `--contract`, or the one contract the
/// directory holds, or the contract named like the topic), each subject of
/// a worker's `model`, or, with neither, each contract under its own name.
/// `contract` narrows to one contract. The error names what to add.
pub fn targets(
    contracts: &[LocalContract],
    topics: &[String],
    contract: Option<&str>,
    model: Option<&Deployment>,
) -> std::result::Result<Vec<Target>, String> {
    let mut names: Vec<&str> = contracts.iter().map(|c| c.name.as_str()).collect();
    names.dedup();
    if let Some(wanted) = contract {
        if !names.contains(&wanted) {
            return Err(format!(
                "--contract {wanted}: no {wanted}.v<N>.avsc in the directory (it holds {})",
                names.join(", ")
            ));
        }
    }
    let target = |contract: &str, topic: &str, found_by| Target {
        contract: contract.to_string(),
        topic: topic.to_string(),
        subject: subject_for_topic(topic),
        found_by,
    };
    let mut out = Vec::new();
    for topic in topics {
        let chosen = match contract {
            Some(c) => c,
            None if names.len() == 1 => names[0],
            None if names.contains(&topic.as_str()) => topic.as_str(),
            None => {
                return Err(format!(
                    "--topic {topic}: the directory holds {} contracts ({}); name the one that travels on it with --contract",
                    names.len(),
                    names.join(", ")
                ))
            }
        };
        out.push(target(chosen, topic, FoundBy::TopicFlag));
    }
    if let Some(model) = model {
        for s in &model.subjects {
            if contract.is_some_and(|c| c != s.job) {
                continue;
            }
            if !names.contains(&s.job.as_str()) {
                return Err(format!(
                    "the model's worker reads contract `{}` from `{}`, and the directory has no {}.v<N>.avsc: export it (`kjob schema export`) or narrow with --contract",
                    s.job, s.topic, s.job
                ));
            }
            out.push(target(&s.job, &s.topic, FoundBy::Model));
        }
    }
    if topics.is_empty() && model.is_none() {
        for name in names.iter().filter(|n| contract.is_none_or(|c| c == **n)) {
            out.push(target(name, name, FoundBy::ContractName));
        }
    }
    // Once each, whichever way it was found first (a --topic the model
    // lists too is checked once).
    let mut seen = std::collections::HashSet::new();
    out.retain(|t| seen.insert((t.contract.clone(), t.subject.clone())));
    Ok(out)
}

/// The record's full name (`namespace.Name`), for a record schema.
pub fn record_name(schema: &Schema) -> Option<String> {
    match schema {
        Schema::Record(r) => Some(r.name.fullname(None)),
        _ => None,
    }
}

/// Every value subject other than `except` whose newest version is a
/// record named `record`: where the same contract is registered under
/// another topic's subject. One request per subject; a subject whose
/// newest version does not parse is skipped.
pub async fn subjects_with_record(
    client: &RegistryClient,
    record: &str,
    except: &str,
) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for subject in client.subjects().await? {
        if subject == except || !subject.ends_with("-value") {
            continue;
        }
        let Some(latest) = client.subject_version(&subject, None).await? else {
            continue;
        };
        let same = Schema::parse_str(&latest.schema)
            .ok()
            .and_then(|s| record_name(&s))
            .is_some_and(|name| name == record);
        if same {
            out.push(subject);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contract(name: &str, version: u32) -> LocalContract {
        let raw = r#"{"type":"record","name":"Invoice","fields":[{"name":"id","type":"string"}]}"#;
        LocalContract {
            name: name.into(),
            version,
            path: PathBuf::from(format!("{name}.v{version}.avsc")),
            raw: raw.into(),
            schema: Schema::parse_str(raw).unwrap_or(Schema::Null),
        }
    }

    #[test]
    fn a_topic_takes_the_one_contract_or_the_one_named() {
        let one = [
            contract("invoices.generate", 1),
            contract("invoices.generate", 2),
        ];
        let t =
            targets(&one, &["newcomer.invoices.generate".into()], None, None).unwrap_or_default();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].subject, "newcomer.invoices.generate-value");
        assert_eq!(t[0].found_by, FoundBy::TopicFlag);

        let two = [contract("a", 1), contract("b", 1)];
        let err = targets(&two, &["x".into()], None, None)
            .err()
            .unwrap_or_default();
        assert!(err.contains("--contract") && err.contains("a, b"), "{err}");
        let named = targets(&two, &["b".into()], None, None).unwrap_or_default();
        assert_eq!(named[0].contract, "b");
        let chosen = targets(&two, &["x".into()], Some("a"), None).unwrap_or_default();
        assert_eq!(
            (chosen[0].contract.as_str(), chosen[0].subject.as_str()),
            ("a", "x-value")
        );
        assert!(targets(&two, &[], Some("c"), None).is_err());

        let own = targets(&two, &[], None, None).unwrap_or_default();
        let subjects: Vec<&str> = own.iter().map(|t| t.subject.as_str()).collect();
        assert_eq!(subjects, ["a-value", "b-value"]);
    }

    #[test]
    fn a_model_names_each_topics_contract_and_one_it_lacks_is_an_error() {
        let model = Deployment {
            group: "g".into(),
            topics: vec![],
            groups: vec![],
            subjects: vec![kjob::deployment::SubjectSpec {
                subject: "shop.inv-value".into(),
                topic: "shop.inv".into(),
                job: "invoices.generate".into(),
            }],
            writes_to: vec![],
        };
        let t = targets(&[contract("invoices.generate", 1)], &[], None, Some(&model))
            .unwrap_or_default();
        assert_eq!(t[0].subject, "shop.inv-value");
        assert_eq!(t[0].found_by, FoundBy::Model);
        let err = targets(&[contract("other", 1)], &[], None, Some(&model))
            .err()
            .unwrap_or_default();
        assert!(
            err.contains("invoices.generate") && err.contains("shop.inv"),
            "{err}"
        );
    }
}
