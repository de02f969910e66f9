//! `kjob schema export`: a crate's compiled-in contracts into `schemas/`.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use serde_json::json;

use crate::output::{json, outln};
use crate::Ctx;
use kjob::schema::export::{self, FileChange, Mode, EXPORT_ENV};

/// `kjob schema export`: runs `program`, reads its contracts, writes or
/// checks the files.
pub(super) async fn export_from(
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
        let what = match (e.change, check) {
            (FileChange::Unchanged, _) => "unchanged",
            (FileChange::Created, false) => "created",
            (FileChange::Updated, false) => "updated",
            (FileChange::Created, true) => "MISSING",
            (FileChange::Updated, true) => "DIFFERS",
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
