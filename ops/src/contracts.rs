//! Contract files (`schemas/<name>.v<N>.avsc`) against the schema
//! registry: what `kjob schema check` and `kjob schema register` work on.
//!
//! The compatibility rules themselves are kjob's ([`kjob::schema::check`]),
//! the same ones a producer applies before it registers a contract, so CI
//! and a deploy can never disagree.

use std::path::{Path, PathBuf};

use apache_avro::Schema;

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
