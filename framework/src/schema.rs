//! Contract evolution: local `.avsc` files versus what the registry holds.
//!
//! Rolling deploys mean old and new binaries read each other's records. The
//! registry enforces a compatibility level per subject, and kjob checks the
//! same rules locally (`kjob schema check`, and at producer start) so a
//! breaking change is caught before deploy, with the field that breaks it.
//!
//! | level | the new schema must be able to... |
//! |---|---|
//! | `BACKWARD` (default) | read data written with the latest registered version |
//! | `FORWARD` | be read by the latest registered version |
//! | `FULL` | both |
//! | `*_TRANSITIVE` | the same, against *every* registered version |
//!
//! [`export`] writes the contracts compiled into a crate to `schemas/`
//! (`kjob schema export`), so a pull request shows a contract change.

pub mod export;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use apache_avro::schema_compatibility::SchemaCompatibility;
use apache_avro::Schema;

use crate::error::{Error, Result};
use crate::registry::RegistryClient;

/// A subject's compatibility level, as the Confluent API names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compatibility {
    /// No checks.
    None,
    /// New reads the latest old.
    Backward,
    /// New reads every old.
    BackwardTransitive,
    /// Latest old reads new.
    Forward,
    /// Every old reads new.
    ForwardTransitive,
    /// Both directions, latest.
    Full,
    /// Both directions, all versions.
    FullTransitive,
}

impl FromStr for Compatibility {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_uppercase().replace('-', "_").as_str() {
            "NONE" => Compatibility::None,
            "BACKWARD" => Compatibility::Backward,
            "BACKWARD_TRANSITIVE" => Compatibility::BackwardTransitive,
            "FORWARD" => Compatibility::Forward,
            "FORWARD_TRANSITIVE" => Compatibility::ForwardTransitive,
            "FULL" => Compatibility::Full,
            "FULL_TRANSITIVE" => Compatibility::FullTransitive,
            _ => {
                return Err(Error::InvalidSetting {
                    name: "compatibility".into(),
                    value: s.to_string(),
                    reason: "use NONE, BACKWARD, BACKWARD_TRANSITIVE, FORWARD, FORWARD_TRANSITIVE, FULL or FULL_TRANSITIVE".into(),
                })
            }
        })
    }
}

impl fmt::Display for Compatibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Compatibility::None => "NONE",
            Compatibility::Backward => "BACKWARD",
            Compatibility::BackwardTransitive => "BACKWARD_TRANSITIVE",
            Compatibility::Forward => "FORWARD",
            Compatibility::ForwardTransitive => "FORWARD_TRANSITIVE",
            Compatibility::Full => "FULL",
            Compatibility::FullTransitive => "FULL_TRANSITIVE",
        };
        f.write_str(s)
    }
}

impl Compatibility {
    fn transitive(self) -> bool {
        matches!(
            self,
            Compatibility::BackwardTransitive
                | Compatibility::ForwardTransitive
                | Compatibility::FullTransitive
        )
    }
    fn backward(self) -> bool {
        matches!(
            self,
            Compatibility::Backward
                | Compatibility::BackwardTransitive
                | Compatibility::Full
                | Compatibility::FullTransitive
        )
    }
    fn forward(self) -> bool {
        matches!(
            self,
            Compatibility::Forward
                | Compatibility::ForwardTransitive
                | Compatibility::Full
                | Compatibility::FullTransitive
        )
    }
}

/// One way a new schema breaks an existing version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incompatibility {
    /// The registered version it breaks.
    pub version: u32,
    /// `backward` (new cannot read old data) or `forward` (old cannot read new data).
    pub direction: &'static str,
    /// The Avro library's reason, naming the field.
    pub reason: String,
}

/// Checks `new` against registered `(version, schema)` pairs (ascending)
/// under `level`. Empty means compatible.
pub fn check(
    new: &Schema,
    registered: &[(u32, Schema)],
    level: Compatibility,
) -> Vec<Incompatibility> {
    let against: Vec<&(u32, Schema)> = if level.transitive() {
        registered.iter().collect()
    } else {
        registered.iter().last().into_iter().collect()
    };
    let mut out = Vec::new();
    for (version, old) in against {
        if level.backward() {
            if let Err(e) = SchemaCompatibility::can_read(old, new) {
                out.push(Incompatibility {
                    version: *version,
                    direction: "backward",
                    reason: reason(&e),
                });
            }
        }
        if level.forward() {
            if let Err(e) = SchemaCompatibility::can_read(new, old) {
                out.push(Incompatibility {
                    version: *version,
                    direction: "forward",
                    reason: reason(&e),
                });
            }
        }
    }
    out
}

fn reason(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

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

/// Every version the registry holds for `subject`, ascending, parsed. An
/// unknown subject (the registry answers 404) yields an empty list.
pub async fn registered_versions(
    client: &RegistryClient,
    subject: &str,
) -> Result<Vec<(u32, Schema)>> {
    let mut out = Vec::new();
    for v in client.versions(subject).await? {
        let raw = client.version(subject, v).await?;
        let schema = Schema::parse_str(&raw).map_err(|e| Error::Registry {
            url: client.url().to_string(),
            message: format!("`{subject}` version {v} does not parse: {e}"),
        })?;
        out.push((v, schema));
    }
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(fields: &str) -> Schema {
        Schema::parse_str(&format!(
            r#"{{"type":"record","name":"O","fields":[{fields}]}}"#
        ))
        .unwrap_or(Schema::Null)
    }

    #[test]
    fn adding_a_field_needs_a_default_for_backward() {
        let v1 = schema(r#"{"name":"id","type":"string"}"#);
        let ok =
            schema(r#"{"name":"id","type":"string"},{"name":"note","type":"string","default":""}"#);
        let bad = schema(r#"{"name":"id","type":"string"},{"name":"note","type":"string"}"#);
        let reg = vec![(1, v1)];
        assert!(check(&ok, &reg, Compatibility::Backward).is_empty());
        let errs = check(&bad, &reg, Compatibility::Backward);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].version, 1);
        assert!(errs[0].reason.contains("note"), "{}", errs[0].reason);
        assert!(
            check(&bad, &reg, Compatibility::Forward).is_empty(),
            "old readers ignore the new field"
        );
        assert_eq!(check(&bad, &reg, Compatibility::Full).len(), 1);
        assert!(check(&bad, &reg, Compatibility::None).is_empty());
    }

    #[test]
    fn transitive_checks_every_version() {
        let v1 = schema(r#"{"name":"id","type":"string"}"#);
        let v2 = schema(r#"{"name":"id","type":"string"},{"name":"x","type":"int","default":0}"#);
        // v3 drops `id` without a default in v1's eyes: forward-incompatible with v1 and v2.
        let v3 = schema(r#"{"name":"x","type":"int","default":0}"#);
        let reg = vec![(1, v1), (2, v2)];
        assert_eq!(check(&v3, &reg, Compatibility::Forward).len(), 1);
        assert_eq!(check(&v3, &reg, Compatibility::ForwardTransitive).len(), 2);
    }

    #[test]
    fn levels_parse() {
        assert_eq!(
            "full_transitive".parse::<Compatibility>().ok(),
            Some(Compatibility::FullTransitive)
        );
        assert_eq!(
            "BACKWARD".parse::<Compatibility>().ok(),
            Some(Compatibility::Backward)
        );
        assert!("sideways".parse::<Compatibility>().is_err());
    }
}
