//! `kjob acls --model FILE --principal User:worker`: the `kafka-acls`
//! commands that grant a worker exactly what its model lists (each topic
//! and group by its literal name, the operations its role needs, Create
//! for what it creates at start). Reads only a file: it grants nothing.

use std::path::PathBuf;

use anyhow::{anyhow, Result};
use clap::Args;

use crate::output::{json, outln};
use crate::Ctx;
use kjob_ops::problem::Problem;

/// `kjob acls`.
#[derive(Args, Debug)]
pub(crate) struct AclsArgs {
    /// A worker's model (`KJOB_DESCRIBE=json ./worker > model.json`).
    #[arg(long, value_name = "FILE")]
    model: PathBuf,
    /// Who gets the grants, as Kafka names principals (`User:<sasl.username>`).
    #[arg(long, default_value = "User:worker")]
    principal: String,
}

pub(crate) async fn run(ctx: &Ctx, args: AclsArgs) -> Result<()> {
    if !args
        .principal
        .split_once(':')
        .is_some_and(|(kind, name)| !kind.is_empty() && !name.is_empty())
    {
        return Err(anyhow!(Problem::usage(format!(
            "--principal `{}` is not TYPE:NAME; Kafka names a SASL user `User:<sasl.username>`, e.g. --principal User:kjob-worker",
            args.principal
        ))));
    }
    let model = crate::model::load(&args.model)?;
    let acls = model.acls(&args.principal);
    if ctx.json() {
        return json(&serde_json::json!({ "group": model.group, "acls": acls }));
    }
    outln!(
        "# {} grant(s) for {} (worker group {}); each: why",
        acls.len(),
        args.principal,
        model.group
    )?;
    for a in &acls {
        outln!("# {}: {}", a.name, a.why)?;
        outln!("{}", a.command(&ctx.config.bootstrap_servers))?;
    }
    Ok(())
}
