//! `kjob schema check | register`: contracts in `schemas/` against the
//! registry, under the subject of each topic they travel on
//! (`check.rs`, `register.rs`; the jobs still waiting, `--in-flight`, in
//! `in_flight.rs`); `kjob schema export`: a crate's compiled-in contracts
//! into `schemas/` (`export.rs`).

mod check;
mod export;
mod in_flight;
mod register;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, Result};
use clap::Subcommand;
use serde_json::json;

use crate::output::outln;
use crate::Ctx;
use kjob::codec::Codec;
use kjob::deployment::Deployment;
use kjob::schema::Compatibility;
use kjob_ops::contracts::{load_dir, targets, LocalContract, Target};
use kjob_ops::problem::Problem;

#[derive(Subcommand, Debug)]
pub(crate) enum SchemaCommand {
    /// Check the newest local version of each contract against what the registry holds
    /// under the subject of the topic it travels on (exit 1 on an incompatibility, 4 when
    /// the registry does not answer).
    ///
    /// The subject is `<topic>-value` (TopicNameStrategy, as producers and workers use):
    /// the contract's own name by default, each `--topic`, or each subject a worker's
    /// model lists. With `--in-flight`, it also reads the writer of every job still
    /// waiting for the group (main topics past the committed offset, retry tiers,
    /// delay topics, unresolved dead letters; strict order's parked jobs wait in the
    /// tiers) and checks that the new reader resolves each.
    ///
    /// Examples:
    ///   kjob schema check --dir schemas
    ///   kjob schema check --dir schemas --topic newcomer.invoices.generate
    ///   kjob schema check --dir schemas --model model.json --in-flight
    #[command(verbatim_doc_comment)]
    Check {
        /// Directory of `<name>.v<N>.avsc` files.
        #[arg(long, default_value = "schemas")]
        dir: PathBuf,
        #[command(flatten)]
        on: Subjects,
        /// Level to check; defaults to each subject's own level, else BACKWARD.
        #[arg(long)]
        compatibility: Option<Compatibility>,
        /// Also check the writers of the jobs still waiting (needs --group or --model).
        #[arg(long)]
        in_flight: bool,
        /// The worker group whose waiting jobs --in-flight reads (default: the model's).
        #[arg(long)]
        group: Option<String>,
    },
    /// Register every local version, oldest first, under the subject of each topic
    /// (subjects without a level get BACKWARD). Prints each subject it used.
    ///
    /// A topic that only SQL enqueues (`kjob.enqueue(...)`) or another language's
    /// producer writes to needs its contract registered before the first row:
    ///   kjob schema register --dir schemas --topic shop.invoices.generate
    #[command(verbatim_doc_comment)]
    Register {
        /// Directory of `<name>.v<N>.avsc` files.
        #[arg(long, default_value = "schemas")]
        dir: PathBuf,
        #[command(flatten)]
        on: Subjects,
    },
    /// Write the contracts compiled into a program to `<dir>/<name>.v<N>.avsc`.
    ///
    /// The CLI cannot know a crate's job types, so it asks the crate: it runs
    /// PROGRAM with KJOB_SCHEMA_EXPORT=1, and a program whose `main` starts
    /// with `kjob::schema::export::serve(CONTRACTS)` prints its contracts and
    /// exits. Files of other contracts and older versions are left alone.
    /// Needs no Kafka and no registry.
    ///
    /// Examples:
    ///   kjob schema export --from target/debug/my-worker
    ///   kjob schema export --check --from cargo -- run -q -p my-handlers
    #[command(verbatim_doc_comment)]
    Export {
        /// The program that knows the contracts (a worker binary, or `cargo`).
        #[arg(long, value_name = "PROGRAM")]
        from: PathBuf,
        /// Arguments for PROGRAM (after `--`).
        #[arg(last = true, value_name = "ARGS")]
        args: Vec<String>,
        /// Directory to write to.
        #[arg(long, default_value = "schemas")]
        dir: PathBuf,
        /// Write nothing; exit 1 if any file would be created or changed (for CI).
        #[arg(long)]
        check: bool,
        /// Give up on PROGRAM after this long (a `cargo run` may compile first).
        #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
        timeout: Duration,
    },
}

/// Which subjects a contract is checked or registered under.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct Subjects {
    /// A topic the contract travels on: its subject `<TOPIC>-value` is used (repeatable).
    #[arg(long, value_name = "TOPIC")]
    topic: Vec<String>,
    /// The contract (file name `<NAME>.v<N>.avsc`) for --topic when the directory holds
    /// several; with --model, only this one.
    #[arg(long, value_name = "NAME")]
    contract: Option<String>,
    /// A worker's model (`KJOB_DESCRIBE=json ./worker > model.json`): every topic its
    /// routes read, with the contract each reads.
    #[arg(long, value_name = "FILE")]
    model: Option<PathBuf>,
}

impl Subjects {
    /// The contracts of `dir` paired with their topics; `model` when one was read.
    fn targets(
        &self,
        contracts: &[LocalContract],
        model: Option<&Deployment>,
    ) -> Result<Vec<Target>> {
        targets(contracts, &self.topic, self.contract.as_deref(), model)
            .map_err(|e| anyhow!(Problem::usage(e)))
    }

    fn model(&self) -> Result<Option<Deployment>> {
        self.model.as_deref().map(crate::model::load).transpose()
    }
}

/// The contract files of `dir`; none is an error naming the directory.
fn contracts_in(dir: &std::path::Path) -> Result<Vec<LocalContract>> {
    let contracts = load_dir(dir)?;
    if contracts.is_empty() {
        return Err(
            Problem::not_found(format!("no <name>.v<N>.avsc files in {}", dir.display())).into(),
        );
    }
    Ok(contracts)
}

pub(crate) async fn run(ctx: &Ctx, cmd: SchemaCommand) -> Result<()> {
    let config = &ctx.config;
    // `export` needs no registry, so the client is made per command.
    let codec = || Codec::from_config(config);
    match cmd {
        SchemaCommand::Export {
            from,
            args,
            dir,
            check,
            timeout,
        } => export::export_from(ctx, &from, &args, &dir, check, timeout).await,
        SchemaCommand::Check {
            dir,
            on,
            compatibility,
            in_flight,
            group,
        } => {
            let contracts = contracts_in(&dir)?;
            let model = on.model()?;
            let targets = on.targets(&contracts, model.as_ref())?;
            let group = group.or(model.as_ref().map(|m| m.group.clone()));
            if in_flight && group.is_none() {
                return Err(anyhow!(Problem::usage(
                    "--in-flight reads a group's waiting jobs: name it with --group, or give the worker's --model"
                )));
            }
            let codec = codec()?;
            let mut gate = check::Gate {
                contracts: &contracts,
                targets,
                compatibility,
            };
            let report = gate.run(codec.client()).await?;
            let waiting = match (in_flight, group) {
                (true, Some(group)) => Some(
                    in_flight::run(
                        ctx,
                        &codec,
                        &contracts,
                        &gate.targets,
                        &group,
                        model.as_ref(),
                    )
                    .await?,
                ),
                _ => None,
            };
            if ctx.json() {
                let mut out =
                    json!({ "contracts": report.rows, "incompatibilities": report.failures });
                if let Some(w) = &waiting {
                    out["in_flight"] = json!(w.rows);
                    out["unreadable_waiting"] = json!(w.failures);
                }
                crate::output::json(&out)?;
            } else {
                outln!("{}", report.table)?;
                if let Some(w) = &waiting {
                    match w.rows.is_empty() {
                        true => outln!("\nno job is waiting")?,
                        false => outln!("\njobs still waiting, by writer:\n{}", w.table)?,
                    }
                }
            }
            check::verdict(report.failures, waiting.map_or(0, |w| w.failures as u64))
        }
        SchemaCommand::Register { dir, on } => {
            let contracts = contracts_in(&dir)?;
            let model = on.model()?;
            let targets = on.targets(&contracts, model.as_ref())?;
            register::run(ctx, codec()?.client(), &contracts, &targets).await
        }
    }
}
