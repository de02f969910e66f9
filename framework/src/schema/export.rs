//! Writing a crate's compiled-in contracts to `schemas/<name>.v<N>.avsc`.
//!
//! A contract's schema lives in the Rust type (`#[derive(Job)]` writes it
//! from the fields), but reviewers, `kjob schema check` and other teams'
//! producers read files. Exporting them into the repository makes a
//! contract change a visible diff in the pull request that causes it, and
//! a check in CI fails when someone changed a type and forgot to export.
//!
//! Only the handler crate knows its types, so it lists them, once:
//!
//! ```
//! use kjob::schema::export::{self, Contract, Mode};
//! # use serde::{Deserialize, Serialize};
//! # #[derive(Serialize, Deserialize, kjob::Job)]
//! # #[job(name = "invoices.render", version = 1, key = order_id)]
//! # struct RenderInvoice { order_id: String }
//!
//! pub const CONTRACTS: &[Contract] = &[Contract::of::<RenderInvoice>()];
//!
//! # fn main() -> kjob::Result<()> {
//! # let dir = std::env::temp_dir().join(format!("kjob-export-doc-{}", std::process::id()));
//! // In a test: fail when `schemas/` is behind the types.
//! let report = export::export(&dir, CONTRACTS, Mode::Check)?;
//! assert!(export::stale(&report).count() == 1, "nothing exported yet");
//! export::export(&dir, CONTRACTS, Mode::Write)?;
//! assert!(export::stale(&export::export(&dir, CONTRACTS, Mode::Check)?).next().is_none());
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok(()) }
//! ```
//!
//! and, for `kjob schema export --from <its worker binary>`, answers the
//! CLI at the start of its `main` (a worker needs no flag parser for this):
//!
//! ```no_run
//! # use kjob::schema::export::{self, Contract};
//! # const CONTRACTS: &[Contract] = &[];
//! fn main() {
//!     if export::serve(CONTRACTS) {
//!         return; // run by `kjob schema export`: contracts printed, nothing else to do
//!     }
//!     // ... build and run the worker
//! }
//! ```
//!
//! The CLI runs the program with `KJOB_SCHEMA_EXPORT=1`, reads the one
//! line that [`serve`] prints (prefixed, so log lines on stdout do no
//! harm), and writes or checks the files with [`export`], the same
//! function a test calls.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use apache_avro::Schema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::job::Job;

/// The environment variable `kjob schema export` sets for the program it
/// runs; [`serve`] answers when it is present.
pub const EXPORT_ENV: &str = "KJOB_SCHEMA_EXPORT";

/// The prefix of the line [`serve`] prints: the CLI takes the first line
/// that starts with it and ignores everything else on stdout.
pub const LINE_PREFIX: &str = "kjob-contracts: ";

/// One contract as it is exported: what the file is named for and what it
/// holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Contract {
    /// `Job::NAME`.
    pub name: Cow<'static, str>,
    /// `Job::VERSION`.
    pub version: u32,
    /// `Job::SCHEMA`, exactly: the file's content (plus a final newline
    /// when it has none).
    pub schema: Cow<'static, str>,
}

impl Contract {
    /// The contract of `J`. A `const fn`, so a crate can keep its list in a
    /// `const` shared by its tests and its binary.
    pub const fn of<J: Job>() -> Contract {
        Contract {
            name: Cow::Borrowed(J::NAME),
            version: J::VERSION,
            schema: Cow::Borrowed(J::SCHEMA),
        }
    }

    /// `<name>.v<version>.avsc`, the name `kjob schema check` and
    /// `kjob schema register` read contracts by.
    pub fn file_name(&self) -> String {
        format!("{}.v{}.avsc", self.name, self.version)
    }

    /// What the file holds: the schema text, ending with a newline.
    pub fn file_text(&self) -> Cow<'_, str> {
        if self.schema.ends_with('\n') {
            Cow::Borrowed(&self.schema)
        } else {
            Cow::Owned(format!("{}\n", self.schema))
        }
    }
}

/// Whether [`export`] writes the files or only compares them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Create or update the files.
    Write,
    /// Compare only; nothing on disk changes (for CI).
    Check,
}

/// What [`export`] found (and, in [`Mode::Write`], did) for one contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileChange {
    /// The file did not exist.
    Created,
    /// The file existed with other content.
    Updated,
    /// The file already held this schema.
    Unchanged,
}

/// One contract's file and what happened to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exported {
    /// The contract.
    pub contract: Contract,
    /// `<dir>/<name>.v<N>.avsc`.
    pub path: PathBuf,
    /// Created, updated or unchanged (in [`Mode::Check`]: would be).
    pub change: FileChange,
}

/// The files that were (or, in [`Mode::Check`], would be) created or
/// changed: empty means `dir` is up to date.
pub fn stale(report: &[Exported]) -> impl Iterator<Item = &Exported> {
    report.iter().filter(|e| e.change != FileChange::Unchanged)
}

/// Writes (or, with [`Mode::Check`], compares) each contract to
/// `dir/<name>.v<N>.avsc`, creating `dir` if needed. Files of other
/// contracts and versions are left alone: older versions are history that
/// `kjob schema check` still reads. Every schema must parse, and a name and
/// version listed twice must carry the same schema; either failure is an
/// error naming the contract, before any file is touched.
pub fn export(dir: &Path, contracts: &[Contract], mode: Mode) -> Result<Vec<Exported>> {
    for (i, c) in contracts.iter().enumerate() {
        Schema::parse_str(&c.schema).map_err(|e| Error::Contract {
            job: c.name.to_string(),
            message: format!("schema v{} does not parse: {e}", c.version),
        })?;
        if let Some(other) = contracts[..i]
            .iter()
            .find(|o| o.name == c.name && o.version == c.version)
        {
            if other.schema != c.schema {
                return Err(Error::Contract {
                    job: c.name.to_string(),
                    message: format!(
                        "v{} is listed twice with different schemas: two types claim one contract version",
                        c.version
                    ),
                });
            }
        }
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |e: std::io::Error| Error::Io {
            path,
            source: Arc::new(e),
        }
    };
    if mode == Mode::Write {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let mut out: Vec<Exported> = Vec::with_capacity(contracts.len());
    for c in contracts {
        let path = dir.join(c.file_name());
        if out.iter().any(|e| e.path == path) {
            continue;
        }
        let text = c.file_text();
        let change = match std::fs::read_to_string(&path) {
            Ok(existing) if existing == *text => FileChange::Unchanged,
            Ok(_) => FileChange::Updated,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => FileChange::Created,
            Err(e) => return Err(io(&path)(e)),
        };
        if mode == Mode::Write && change != FileChange::Unchanged {
            std::fs::write(&path, text.as_bytes()).map_err(io(&path))?;
        }
        out.push(Exported {
            contract: c.clone(),
            path,
            change,
        });
    }
    Ok(out)
}

/// The line [`serve`] prints for `contracts`.
pub fn line(contracts: &[Contract]) -> String {
    // A Vec of plain strings and numbers always serializes.
    let json = serde_json::to_string(contracts).unwrap_or_else(|_| "[]".into());
    format!("{LINE_PREFIX}{json}")
}

/// Parses the output of a program run by `kjob schema export`: the first
/// line starting with [`LINE_PREFIX`]. `None` when there is none.
pub fn parse_output(stdout: &str) -> Option<std::result::Result<Vec<Contract>, String>> {
    let json = stdout.lines().find_map(|l| l.strip_prefix(LINE_PREFIX))?;
    Some(serde_json::from_str(json).map_err(|e| e.to_string()))
}

/// When the process was started by `kjob schema export` (the
/// [`EXPORT_ENV`] variable is set), prints the contracts on one line and
/// returns `true`: `main` should then return without doing anything else.
/// Otherwise returns `false` at once.
pub fn serve(contracts: &[Contract]) -> bool {
    if std::env::var_os(EXPORT_ENV).is_none() {
        return false;
    }
    println!("{}", line(contracts));
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contract(name: &'static str, version: u32, fields: &str) -> Contract {
        Contract {
            name: Cow::Borrowed(name),
            version,
            schema: Cow::Owned(format!(
                r#"{{"type": "record", "name": "R", "fields": [{fields}]}}"#
            )),
        }
    }

    fn tmp(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!(
            "kjob-export-{tag}-{}",
            uuid::Uuid::new_v4().simple()
        ))
    }

    #[test]
    fn write_creates_updates_and_leaves_other_files_alone() -> Result<()> {
        let dir = tmp("write");
        let v1 = contract("a.b", 1, r#"{"name": "id", "type": "string"}"#);
        let report = export(&dir, std::slice::from_ref(&v1), Mode::Check)?;
        assert_eq!(report[0].change, FileChange::Created);
        assert!(!dir.exists(), "check mode writes nothing");
        export(&dir, std::slice::from_ref(&v1), Mode::Write)?;
        let text = std::fs::read_to_string(dir.join("a.b.v1.avsc")).unwrap_or_default();
        assert_eq!(text, format!("{}\n", v1.schema));
        std::fs::write(dir.join("a.b.v0.avsc"), "history").ok();
        let changed = contract("a.b", 1, r#"{"name": "id", "type": "long"}"#);
        let report = export(&dir, std::slice::from_ref(&changed), Mode::Check)?;
        assert_eq!(stale(&report).count(), 1);
        assert_eq!(report[0].change, FileChange::Updated);
        export(&dir, std::slice::from_ref(&changed), Mode::Write)?;
        assert!(stale(&export(&dir, &[changed], Mode::Check)?)
            .next()
            .is_none());
        assert_eq!(
            std::fs::read_to_string(dir.join("a.b.v0.avsc")).unwrap_or_default(),
            "history"
        );
        std::fs::remove_dir_all(&dir).ok();
        Ok(())
    }

    #[test]
    fn a_schema_that_does_not_parse_or_a_double_claim_is_refused() {
        let dir = tmp("refused");
        let bad = contract("a.b", 1, r#"{"name": "id", "type": "strin"}"#);
        let err = export(&dir, &[bad], Mode::Write)
            .err()
            .map(|e| e.to_string());
        assert!(err.as_deref().unwrap_or("").contains("a.b"), "{err:?}");
        let one = contract("a.b", 1, r#"{"name": "id", "type": "string"}"#);
        let two = contract("a.b", 1, r#"{"name": "id", "type": "long"}"#);
        let err = export(&dir, &[one, two], Mode::Write)
            .err()
            .map(|e| e.to_string());
        assert!(err.as_deref().unwrap_or("").contains("twice"), "{err:?}");
        assert!(!dir.exists());
    }

    #[test]
    fn the_line_survives_logs_around_it() {
        let contracts = vec![contract("a.b", 2, r#"{"name": "id", "type": "string"}"#)];
        let stdout = format!("INFO starting\n{}\nINFO done\n", line(&contracts));
        let parsed = parse_output(&stdout).and_then(|r| r.ok());
        assert_eq!(parsed, Some(contracts));
        assert!(parse_output("no contracts here\n").is_none());
    }
}
