//! `kjob schema check | register`: contracts in `schemas/` against the
//! registry; `kjob schema export`: a crate's compiled-in contracts into
//! `schemas/`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use clap::Subcommand;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

use serde_json::json;

use crate::output::{json, outln};
use crate::Ctx;
use kjob::codec::{subject_for_topic, Codec};
use kjob::registry::Registration;
use kjob::schema::export::{self, Mode, Outcome, EXPORT_ENV};
use kjob::schema::{check, registered_versions, Compatibility};
use kjob_ops::contracts::{latest, load_dir, set_subject_compatibility, subject_compatibility};
use kjob_ops::problem::Problem;

#[derive(Subcommand, Debug)]
pub(crate) enum SchemaCommand {
    /// Check the newest local version of each contract against what the registry holds
    /// (exit 1 on an incompatibility, 4 when the registry does not answer).
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
        } => export_from(ctx, &from, &args, &dir, check, timeout).await,
        SchemaCommand::Check { dir, compatibility } => {
            let codec = codec()?;
            let registry = codec.client();
            let contracts = load_dir(&dir)?;
            if contracts.is_empty() {
                return Err(Problem::not_found(format!(
                    "no <name>.v<N>.avsc files in {}",
                    dir.display()
                ))
                .into());
            }
            let mut rows = Vec::new();
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
                rows.push(json!({
                    "contract": c.name,
                    "local_version": c.version,
                    "subject": subject,
                    "registered": versions.iter().map(|(v, _)| v).collect::<Vec<_>>(),
                    "level": level.to_string(),
                    "result": if versions.is_empty() { "new subject" } else if problems.is_empty() { "compatible" } else { "incompatible" },
                    "incompatibilities": problems.iter().map(|p| json!({
                        "version": p.version,
                        "direction": p.direction,
                        "reason": p.reason,
                    })).collect::<Vec<_>>(),
                }));
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
            if ctx.json() {
                json(&json!({ "contracts": rows, "incompatibilities": failures }))?;
            } else {
                outln!("{t}")?;
            }
            if failures > 0 {
                return Err(Problem::refused(format!(
                    "{failures} incompatibilit{} found",
                    if failures == 1 { "y" } else { "ies" }
                ))
                .into());
            }
            Ok(())
        }
        SchemaCommand::Register { dir } => {
            let codec = codec()?;
            let registry = codec.client();
            let contracts = load_dir(&dir)?;
            let mut registered = Vec::new();
            for c in &contracts {
                let subject = subject_for_topic(&c.name);
                if subject_compatibility(registry, &subject).await?.is_none() {
                    set_subject_compatibility(registry, &subject, Compatibility::Backward).await?;
                }
                match registry.register(&subject, &c.raw).await? {
                    Registration::Id(id) => {
                        if ctx.json() {
                            registered.push(json!({"contract": c.name, "version": c.version, "subject": subject, "id": id}));
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
            if ctx.json() {
                json(&json!({ "registered": registered }))?;
            }
            Ok(())
        }
    }
}

/// `kjob schema export`: runs `program`, reads its contracts, writes or
/// checks the files.
async fn export_from(
    ctx: &Ctx,
    program: &std::path::Path,
    args: &[String],
    dir: &std::path::Path,
    check: bool,
    timeout: Duration,
) -> Result<()> {
    let shown = std::iter::once(program.display().to_string())
        .chain(args.iter().cloned())
        .collect::<Vec<_>>()
        .join(" ");
    let child = tokio::process::Command::new(program)
        .args(args)
        .env(EXPORT_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting `{shown}`"))?;
    let output = match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(out) => out.with_context(|| format!("running `{shown}`"))?,
        Err(_) => bail!(
            "`{shown}` did not print its contracts within {}: does its main start with \
             `if kjob::schema::export::serve(CONTRACTS) {{ return }}`?",
            humantime::format_duration(timeout)
        ),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let contracts = match export::parse_output(&stdout) {
        Some(Ok(c)) => c,
        Some(Err(e)) => bail!("`{shown}` printed a contract list kjob cannot read: {e}"),
        None => bail!(
            "`{shown}` exited ({}) without printing its contracts: call \
             `kjob::schema::export::serve(CONTRACTS)` at the start of its main",
            output.status
        ),
    };
    if contracts.is_empty() {
        bail!("`{shown}` lists no contracts");
    }
    let mode = if check { Mode::Check } else { Mode::Write };
    let report = export::export(dir, &contracts, mode)?;
    let mut files = Vec::new();
    for e in &report {
        let what = match (e.outcome, check) {
            (Outcome::Unchanged, _) => "unchanged",
            (Outcome::Created, false) => "created",
            (Outcome::Updated, false) => "updated",
            (Outcome::Created, true) => "MISSING",
            (Outcome::Updated, true) => "DIFFERS",
        };
        if ctx.json() {
            files.push(
                json!({"file": e.path.display().to_string(), "outcome": what.to_lowercase()}),
            );
        } else {
            outln!("{what:>9}  {}", e.path.display())?;
        }
    }
    if ctx.json() {
        json(&json!({ "check": check, "files": files }))?;
    }
    let stale = export::stale(&report).count();
    if check && stale > 0 {
        bail!(
            "{stale} schema file{} behind the compiled contracts: run the same command without --check and commit the result",
            if stale == 1 { " is" } else { "s are" }
        );
    }
    Ok(())
}
