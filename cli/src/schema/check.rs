//! `kjob schema check`: the newest local version of each contract against
//! the versions registered under each topic's subject.

use anyhow::Result;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use serde_json::{json, Value};

use kjob::registry::RegistryClient;
use kjob::schema::{check, registered_versions, Compatibility};
use kjob_ops::contracts::{
    latest, record_name, subject_compatibility, subjects_with_record, FoundBy, LocalContract,
    Target,
};
use kjob_ops::problem::Problem;

/// What one check compares: the directory's contracts, the subjects to
/// compare them with, and the level (`None`: each subject's own).
pub(super) struct Gate<'a> {
    pub contracts: &'a [LocalContract],
    pub targets: Vec<Target>,
    pub compatibility: Option<Compatibility>,
}

/// What the check found, for the table or the JSON.
pub(super) struct Report {
    pub table: Table,
    pub rows: Vec<Value>,
    pub failures: usize,
}

impl Gate<'_> {
    /// Checks every target. A contract checked under its own name whose
    /// subject is empty, while the registry holds the same record under
    /// other subjects, is checked under those too (with a warning naming
    /// them): a route on `handle_on` reads another topic's subject, and an
    /// all-clear against an empty subject would be false.
    pub(super) async fn run(&mut self, registry: &RegistryClient) -> Result<Report> {
        let mut table = Table::new();
        table.load_preset(UTF8_FULL_CONDENSED);
        table.set_header(vec![
            "contract",
            "local",
            "topic",
            "subject",
            "registered",
            "level",
            "result",
        ]);
        let mut rows = Vec::new();
        let mut failures = 0;
        let newest = latest(self.contracts);
        let mut i = 0;
        while i < self.targets.len() {
            let target = self.targets[i].clone();
            i += 1;
            let Some(c) = newest.iter().find(|c| c.name == target.contract) else {
                continue;
            };
            let subject = &target.subject;
            let versions = registered_versions(registry, subject).await?;
            if versions.is_empty() && target.found_by == FoundBy::ContractName {
                if let Some(record) = record_name(&c.schema) {
                    let others = subjects_with_record(registry, &record, subject).await?;
                    if !others.is_empty() {
                        eprintln!(
                            "warning: `{subject}` is empty, but the registry holds record `{record}` under {}: a route on another topic (handle_on) reads that subject; checking there too (name the topic with --topic to check only it)",
                            others.join(", ")
                        );
                    }
                    for other in others {
                        let topic = other.strip_suffix("-value").unwrap_or(&other).to_string();
                        self.targets.push(Target {
                            contract: c.name.clone(),
                            topic,
                            subject: other,
                            found_by: FoundBy::SameRecord,
                        });
                    }
                }
            }
            let level = match self.compatibility {
                Some(l) => l,
                None => subject_compatibility(registry, subject)
                    .await?
                    .unwrap_or(Compatibility::Backward),
            };
            let problems = check(&c.schema, &versions, level);
            failures += problems.len();
            let verdict = if versions.is_empty() {
                "new subject"
            } else if problems.is_empty() {
                "compatible"
            } else {
                "incompatible"
            };
            let result = match verdict {
                "incompatible" => problems
                    .iter()
                    .map(|p| {
                        format!(
                            "INCOMPATIBLE with v{} ({}): {}",
                            p.version, p.direction, p.reason
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n"),
                other => other.to_string(),
            };
            let registered: Vec<u32> = versions.iter().map(|(v, _)| *v).collect();
            rows.push(json!({
                "contract": c.name,
                "local_version": c.version,
                "topic": target.topic,
                "subject": subject,
                "found_by": target.found_by.label(),
                "registered": registered,
                "level": level.to_string(),
                "result": verdict,
                "incompatibilities": problems.iter().map(|p| json!({
                    "version": p.version,
                    "direction": p.direction,
                    "reason": p.reason,
                })).collect::<Vec<_>>(),
            }));
            let registered = registered
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",");
            table.add_row(vec![
                c.name.clone(),
                format!("v{}", c.version),
                format!("{} ({})", target.topic, target.found_by.label()),
                subject.clone(),
                if registered.is_empty() {
                    "-".into()
                } else {
                    registered
                },
                level.to_string(),
                result,
            ]);
        }
        Ok(Report {
            table,
            rows,
            failures,
        })
    }
}

/// Exit 1 naming what was found, or success.
pub(super) fn verdict(incompatibilities: usize, unreadable_waiting: u64) -> Result<()> {
    let mut found = Vec::new();
    if incompatibilities > 0 {
        found.push(format!(
            "{incompatibilities} incompatibilit{} found",
            if incompatibilities == 1 { "y" } else { "ies" }
        ));
    }
    if unreadable_waiting > 0 {
        found.push(format!(
            "{unreadable_waiting} waiting job{} the new reader cannot read",
            if unreadable_waiting == 1 { "" } else { "s" }
        ));
    }
    match found.is_empty() {
        true => Ok(()),
        false => Err(Problem::refused(found.join("; ")).into()),
    }
}
