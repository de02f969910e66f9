//! `kjob schema check | register`: contracts in `schemas/` against the registry.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Subcommand;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

use kjob::codec::{subject_for_topic, Codec};
use kjob::config::KafkaConfig;
use kjob::registry::Registration;
use kjob::schema::{
    check, latest, load_dir, registered_versions, set_subject_compatibility, subject_compatibility,
    Compatibility,
};

#[derive(Subcommand, Debug)]
pub enum SchemaCommand {
    /// Check the newest local version of each contract against every version the registry holds (exit 1 on any incompatibility).
    Check {
        /// Directory of `<name>.v<N>.avsc` files.
        #[arg(long, default_value = "schemas")]
        dir: PathBuf,
        /// Level to check; defaults to each subject's own level, else BACKWARD.
        #[arg(long)]
        compatibility: Option<Compatibility>,
    },
    /// Register every local version, oldest first (subjects without a level get BACKWARD).
    Register {
        /// Directory of `<name>.v<N>.avsc` files.
        #[arg(long, default_value = "schemas")]
        dir: PathBuf,
    },
}

pub async fn run(config: &KafkaConfig, cmd: SchemaCommand) -> Result<()> {
    let codec = Codec::from_config(config)?;
    let registry = codec.client();
    match cmd {
        SchemaCommand::Check { dir, compatibility } => {
            let contracts = load_dir(&dir)?;
            if contracts.is_empty() {
                bail!("no <name>.v<N>.avsc files in {}", dir.display());
            }
            let mut t = Table::new();
            t.load_preset(UTF8_FULL_CONDENSED);
            t.set_header(vec![
                "contract",
                "local",
                "subject",
                "registered",
                "level",
                "result",
            ]);
            let mut failures = 0;
            for c in latest(&contracts) {
                let subject = subject_for_topic(&c.name);
                let level = match compatibility {
                    Some(l) => l,
                    None => subject_compatibility(registry, &subject)
                        .await?
                        .unwrap_or(Compatibility::Backward),
                };
                let versions = registered_versions(registry, &subject).await?;
                let problems = check(&c.schema, &versions, level);
                let result = if versions.is_empty() {
                    "new subject".to_string()
                } else if problems.is_empty() {
                    "compatible".to_string()
                } else {
                    failures += problems.len();
                    problems
                        .iter()
                        .map(|p| {
                            format!(
                                "INCOMPATIBLE with v{} ({}): {}",
                                p.version, p.direction, p.reason
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("\n")
                };
                let registered = versions
                    .iter()
                    .map(|(v, _)| v.to_string())
                    .collect::<Vec<_>>()
                    .join(",");
                t.add_row(vec![
                    c.name.clone(),
                    format!("v{}", c.version),
                    subject,
                    if registered.is_empty() {
                        "-".into()
                    } else {
                        registered
                    },
                    level.to_string(),
                    result,
                ]);
            }
            println!("{t}");
            if failures > 0 {
                bail!(
                    "{failures} incompatibilit{} found",
                    if failures == 1 { "y" } else { "ies" }
                );
            }
            Ok(())
        }
        SchemaCommand::Register { dir } => {
            let contracts = load_dir(&dir)?;
            for c in &contracts {
                let subject = subject_for_topic(&c.name);
                if subject_compatibility(registry, &subject).await?.is_none() {
                    set_subject_compatibility(registry, &subject, Compatibility::Backward).await?;
                }
                match registry.register(&subject, &c.raw).await? {
                    Registration::Id(id) => {
                        println!("{} v{} -> {subject} (id {id})", c.name, c.version)
                    }
                    Registration::Refused { status, message } => bail!(
                        "registering {} v{} under `{subject}`: HTTP {status}: {message}",
                        c.name,
                        c.version
                    ),
                }
            }
            Ok(())
        }
    }
}
