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
//! The producer and the worker check with [`check`] and
//! [`registered_versions`] before they register a contract; `kjob schema
//! check | register` (contract files in `schemas/` against the registry) is
//! in `kjob-ops` (`kjob_ops::contracts`).
//!
//! [`export`] writes the contracts compiled into a crate to `schemas/`
//! (`kjob schema export`), so a pull request shows a contract change.

pub mod export;

use apache_avro::schema_compatibility::SchemaCompatibility;
use apache_avro::Schema;

use crate::error::{Error, Result};
use crate::registry::RegistryClient;

pub use crate::registry::Compatibility;

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

/// Whether a reader with schema `reader` resolves records written with
/// `writer`; the error is the Avro library's reason, naming the field.
/// The one rule behind the worker's check at start, `kjob schema check
/// --in-flight` and the re-drive pre-check, so they never disagree.
pub fn can_read(writer: &Schema, reader: &Schema) -> std::result::Result<(), String> {
    SchemaCompatibility::can_read(writer, reader)
        .map(|_| ())
        .map_err(|e| reason(&e))
}

/// The fields records of `writer` carry that a `reader` drops when it
/// resolves them (not in the reader, by name or alias), as dotted paths
/// (`purchase_order`, `address.unit`), nested records included. Empty when
/// the reader keeps everything. A worker counts the records it decodes with
/// such a writer (`kjob_fields_dropped_total`): an old reader is silently
/// losing data a newer producer sends.
pub fn dropped_fields(writer: &Schema, reader: &Schema) -> Vec<String> {
    let mut out = Vec::new();
    dropped_into(writer, reader, "", &mut out);
    out
}

fn dropped_into(writer: &Schema, reader: &Schema, prefix: &str, out: &mut Vec<String>) {
    let (Some(w), Some(r)) = (record_of(writer), record_of(reader)) else {
        return;
    };
    for field in &w.fields {
        let path = format!("{prefix}{}", field.name);
        let kept = r
            .fields
            .iter()
            .find(|f| f.name == field.name || f.aliases.contains(&field.name));
        match kept {
            None => out.push(path),
            Some(kept) => dropped_into(&field.schema, &kept.schema, &format!("{path}."), out),
        }
    }
}

/// The record a schema is, or the one record of an optional record
/// (`["null", Record]`).
fn record_of(schema: &Schema) -> Option<&apache_avro::schema::RecordSchema> {
    match schema {
        Schema::Record(r) => Some(r),
        Schema::Union(u) => {
            let mut records = u.variants().iter().filter_map(|v| match v {
                Schema::Record(r) => Some(r),
                _ => None,
            });
            let first = records.next();
            first.filter(|_| records.next().is_none())
        }
        _ => None,
    }
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
    fn an_old_reader_names_the_fields_it_drops_nested_ones_too() {
        let v1 = Schema::parse_str(
            r#"{"type":"record","name":"O","fields":[{"name":"id","type":"string"},
            {"name":"addr","type":{"type":"record","name":"A","fields":[{"name":"city","type":"string"}]}}]}"#,
        )
        .unwrap_or(Schema::Null);
        let v2 = Schema::parse_str(
            r#"{"type":"record","name":"O","fields":[{"name":"id","type":"string"},
            {"name":"po","type":["null","string"],"default":null},
            {"name":"addr","type":{"type":"record","name":"A","fields":[{"name":"city","type":"string"},
            {"name":"unit","type":"string","default":""}]}}]}"#,
        )
        .unwrap_or(Schema::Null);
        assert_eq!(dropped_fields(&v2, &v1), vec!["po", "addr.unit"]);
        assert!(dropped_fields(&v1, &v2).is_empty(), "v2 keeps all of v1");
        assert!(dropped_fields(&v1, &v1).is_empty());
        assert!(can_read(&v2, &v1).is_ok());
        assert!(can_read(&v1, &v2).is_ok(), "the new fields have defaults");
        // A field renamed with its old name as an alias is not dropped.
        let renamed = schema(r#"{"name":"order_id","type":"string","aliases":["id"]}"#);
        let plain = schema(r#"{"name":"id","type":"string"}"#);
        assert!(dropped_fields(&plain, &renamed).is_empty());
        let required = schema(r#"{"name":"id","type":"string"},{"name":"cur","type":"string"}"#);
        let err = can_read(&plain, &required).err().unwrap_or_default();
        assert!(err.contains("cur"), "{err}");
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
