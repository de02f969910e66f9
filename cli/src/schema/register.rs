//! `kjob schema register`: every local version of each contract, oldest
//! first, under each topic's subject.

use anyhow::Result;
use serde_json::json;

use crate::output::{json, outln};
use crate::Ctx;
use kjob::registry::{Registration, RegistryClient};
use kjob::schema::Compatibility;
use kjob_ops::contracts::{
    set_subject_compatibility, subject_compatibility, LocalContract, Target,
};
use kjob_ops::problem::Problem;

pub(super) async fn run(
    ctx: &Ctx,
    registry: &RegistryClient,
    contracts: &[LocalContract],
    targets: &[Target],
) -> Result<()> {
    let mut registered = Vec::new();
    for target in targets {
        let subject = &target.subject;
        for c in contracts.iter().filter(|c| c.name == target.contract) {
            if subject_compatibility(registry, subject).await?.is_none() {
                set_subject_compatibility(registry, subject, Compatibility::Backward).await?;
            }
            match registry.register(subject, &c.raw).await? {
                Registration::Id(id) => {
                    if ctx.json() {
                        registered.push(json!({"contract": c.name, "version": c.version, "topic": target.topic, "subject": subject, "id": id}));
                    } else {
                        outln!("{} v{} -> {subject} (id {id})", c.name, c.version)?;
                    }
                }
                Registration::Refused { status, message } => {
                    return Err(Problem::refused(format!(
                        "registering {} v{} under `{subject}`: HTTP {status}: {message}",
                        c.name, c.version
                    ))
                    .into())
                }
            }
        }
    }
    if ctx.json() {
        json(&json!({ "registered": registered }))?;
    }
    Ok(())
}
