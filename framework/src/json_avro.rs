//! JSON to Avro against a schema, with errors that name the field.
//!
//! Used by `kjob enqueue`, where an operator types a job as JSON, and by the
//! outbox relay for jobs enqueued from SQL (`kjob.enqueue`, see
//! [`crate::codec::JsonContracts`]): a mistake
//! must come back as "`order.items[2].qty`: expected an int, got the string
//! \"two\"", not as the Avro library's "Invalid value ... for schema ...",
//! which names neither the field nor the fix. The conversion walks the
//! schema; the bytes are then written by `apache_avro` itself.
//!
//! JSON accepted for each Avro type: `null`; booleans; integral numbers for
//! `int`/`long` (in range) and any number for `float`/`double`; strings for
//! `string`, `enum` (a symbol), `uuid` and `bytes`/`fixed` (each character
//! one byte, as Avro's JSON encoding does); arrays; objects for `map` and
//! `record` (a missing field takes its schema default; an unknown field is
//! an error, since it is usually a typo); a union takes either the bare
//! value (the first branch it fits) or Avro's `{"<type>": value}` form.
//! `date`, `time-*` and `timestamp-*` take their underlying number.

use std::collections::HashMap;

use apache_avro::schema::{EnumSchema, FixedSchema, Name, RecordSchema, Schema, UnionSchema};
use apache_avro::types::Value;
use serde_json::Value as Json;

/// Why a JSON value does not fit the schema: where, and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {reason}", if path.is_empty() { "the value" } else { path.as_str() })]
pub struct Mismatch {
    /// The field path (`customer.address.zip`, `items[2]`); empty for the
    /// top-level value.
    pub path: String,
    /// What is wrong, in words.
    pub reason: String,
}

/// Converts `json` to an Avro value of `schema` and writes it as an Avro
/// datum (the body of a Confluent-framed record).
pub fn to_datum(schema: &Schema, json: &Json) -> Result<Vec<u8>, Mismatch> {
    let value = from_json(schema, json)?;
    apache_avro::writer::datum::GenericDatumWriter::builder(schema)
        .build()
        .and_then(|w| w.write_value_to_vec(value))
        .map_err(|e| Mismatch {
            path: String::new(),
            reason: format!("Avro refused the value: {e}"),
        })
}

/// A schema prepared for many conversions: its named types are collected
/// and its datum writer is built once, not per job (building a writer
/// resolves every named type, which costs more than writing a small job).
/// The outbox relay keeps one per registered contract.
#[ouroboros::self_referencing]
pub struct PreparedSchema {
    schema: Schema,
    #[borrows(schema)]
    #[covariant]
    names: HashMap<Name, &'this Schema>,
    #[borrows(schema)]
    #[covariant]
    writer: Option<apache_avro::writer::datum::GenericDatumWriter<'this>>,
}

impl PreparedSchema {
    /// Prepares `schema`.
    pub fn prepare(schema: Schema) -> Self {
        PreparedSchemaBuilder {
            schema,
            names_builder: |s: &Schema| {
                let mut names = HashMap::new();
                collect_names(s, &mut names);
                names
            },
            writer_builder: |s: &Schema| {
                apache_avro::writer::datum::GenericDatumWriter::builder(s)
                    .build()
                    .ok()
            },
        }
        .build()
    }

    /// The schema.
    pub fn schema(&self) -> &Schema {
        self.borrow_schema()
    }

    /// [`to_datum`] without redoing the preparation.
    pub fn to_datum(&self, json: &Json) -> Result<Vec<u8>, Mismatch> {
        let value = convert(self.borrow_schema(), json, "", self.borrow_names())?;
        let written = match self.borrow_writer() {
            Some(w) => w.write_value_to_vec(value),
            None => apache_avro::writer::datum::GenericDatumWriter::builder(self.borrow_schema())
                .build()
                .and_then(|w| w.write_value_to_vec(value)),
        };
        written.map_err(|e| Mismatch {
            path: String::new(),
            reason: format!("Avro refused the value: {e}"),
        })
    }
}

impl std::fmt::Debug for PreparedSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedSchema")
            .field("schema", &type_name(self.borrow_schema()))
            .finish()
    }
}

/// Converts `json` to an Avro value of `schema` (a parsed schema whose
/// named types are all defined in it).
pub fn from_json(schema: &Schema, json: &Json) -> Result<Value, Mismatch> {
    let mut names = HashMap::new();
    collect_names(schema, &mut names);
    convert(schema, json, "", &names)
}

fn collect_names<'a>(schema: &'a Schema, names: &mut HashMap<Name, &'a Schema>) {
    match schema {
        Schema::Record(r) => {
            names.insert(r.name.clone(), schema);
            for f in &r.fields {
                collect_names(&f.schema, names);
            }
        }
        Schema::Enum(e) => {
            names.insert(e.name.clone(), schema);
        }
        Schema::Fixed(f) => {
            names.insert(f.name.clone(), schema);
        }
        Schema::Array(a) => collect_names(&a.items, names),
        Schema::Map(m) => collect_names(&m.types, names),
        Schema::Union(u) => u.variants().iter().for_each(|v| collect_names(v, names)),
        _ => {}
    }
}

fn describe(json: &Json) -> String {
    let text = json.to_string();
    let short = if text.chars().count() > 40 {
        format!("{}...", text.chars().take(40).collect::<String>())
    } else {
        text
    };
    let kind = match json {
        Json::Null => return "null".into(),
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "the number",
        Json::String(_) => "the string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    };
    format!("{kind} {short}")
}

fn child(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

fn type_name(schema: &Schema) -> String {
    match schema {
        Schema::Record(r) => format!("record {}", r.name.name()),
        Schema::Enum(e) => format!("enum {}", e.name.name()),
        Schema::Fixed(f) => format!("fixed {}", f.name.name()),
        Schema::Ref { name } => name.name().to_string(),
        Schema::Union(u) => {
            let v: Vec<String> = u.variants().iter().map(type_name).collect();
            format!("one of [{}]", v.join(", "))
        }
        other => format!("{:?}", apache_avro::schema::SchemaKind::from(other)).to_lowercase(),
    }
}

fn convert(
    schema: &Schema,
    json: &Json,
    path: &str,
    names: &HashMap<Name, &Schema>,
) -> Result<Value, Mismatch> {
    let fail = |reason: String| Mismatch {
        path: path.to_string(),
        reason,
    };
    let expected = |what: &str| fail(format!("expected {what}, got {}", describe(json)));
    let int_in = |lo: i64, hi: i64, what: &str| -> Result<i64, Mismatch> {
        match json.as_i64() {
            Some(n) if (lo..=hi).contains(&n) => Ok(n),
            Some(n) => Err(fail(format!("{n} is out of range for {what}"))),
            None => Err(expected(&format!("{what} (a whole number)"))),
        }
    };
    Ok(match schema {
        Schema::Null => match json {
            Json::Null => Value::Null,
            _ => return Err(expected("null")),
        },
        Schema::Boolean => Value::Boolean(json.as_bool().ok_or_else(|| expected("a boolean"))?),
        Schema::Int => Value::Int(int_in(i32::MIN.into(), i32::MAX.into(), "an int")? as i32),
        Schema::Long => Value::Long(int_in(i64::MIN, i64::MAX, "a long")?),
        Schema::Date => Value::Date(int_in(
            i32::MIN.into(),
            i32::MAX.into(),
            "a date (days since 1970-01-01)",
        )? as i32),
        Schema::TimeMillis => Value::TimeMillis(int_in(0, 86_399_999, "a time-millis")? as i32),
        Schema::TimeMicros => Value::TimeMicros(int_in(0, 86_399_999_999, "a time-micros")?),
        Schema::TimestampMillis => {
            Value::TimestampMillis(int_in(i64::MIN, i64::MAX, "a timestamp-millis")?)
        }
        Schema::TimestampMicros => {
            Value::TimestampMicros(int_in(i64::MIN, i64::MAX, "a timestamp-micros")?)
        }
        Schema::TimestampNanos => {
            Value::TimestampNanos(int_in(i64::MIN, i64::MAX, "a timestamp-nanos")?)
        }
        Schema::LocalTimestampMillis => {
            Value::LocalTimestampMillis(int_in(i64::MIN, i64::MAX, "a local-timestamp-millis")?)
        }
        Schema::LocalTimestampMicros => {
            Value::LocalTimestampMicros(int_in(i64::MIN, i64::MAX, "a local-timestamp-micros")?)
        }
        Schema::LocalTimestampNanos => {
            Value::LocalTimestampNanos(int_in(i64::MIN, i64::MAX, "a local-timestamp-nanos")?)
        }
        Schema::Float => Value::Float(json.as_f64().ok_or_else(|| expected("a float"))? as f32),
        Schema::Double => Value::Double(json.as_f64().ok_or_else(|| expected("a double"))?),
        Schema::String => Value::String(
            json.as_str()
                .ok_or_else(|| expected("a string"))?
                .to_string(),
        ),
        Schema::Uuid(_) => {
            let s = json.as_str().ok_or_else(|| expected("a UUID string"))?;
            Value::Uuid(
                s.parse()
                    .map_err(|e| fail(format!("\"{s}\" is not a UUID: {e}")))?,
            )
        }
        Schema::Bytes => Value::Bytes(bytes(json).ok_or_else(|| {
            expected("bytes (a string, one character per byte, \\u0000-\\u00ff)")
        })?),
        Schema::Fixed(f) => convert_fixed(f, json, path)?,
        Schema::Enum(e) => convert_enum(e, json, path)?,
        Schema::Array(a) => {
            let items = json.as_array().ok_or_else(|| expected("an array"))?;
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                out.push(convert(&a.items, item, &format!("{path}[{i}]"), names)?);
            }
            Value::Array(out)
        }
        Schema::Map(m) => {
            let obj = json
                .as_object()
                .ok_or_else(|| expected("an object (a map)"))?;
            let mut out = HashMap::with_capacity(obj.len());
            for (k, v) in obj {
                out.insert(k.clone(), convert(&m.types, v, &child(path, k), names)?);
            }
            Value::Map(out)
        }
        Schema::Record(r) => convert_record(r, json, path, names)?,
        Schema::Union(u) => return convert_union(schema, u, json, path, names),
        Schema::Ref { name } => {
            let target = names
                .get(name)
                .or_else(|| {
                    names
                        .iter()
                        .find(|(n, _)| n.name() == name.name())
                        .map(|(_, s)| s)
                })
                .ok_or_else(|| {
                    fail(format!(
                        "the schema refers to `{}`, which it does not define",
                        name.name()
                    ))
                })?;
            convert(target, json, path, names)?
        }
        other => {
            return Err(fail(format!(
                "`kjob enqueue` cannot write {} fields from JSON yet; enqueue this job from code",
                type_name(other)
            )))
        }
    })
}

/// A mismatch at `path`.
fn mismatch(path: &str, reason: String) -> Mismatch {
    Mismatch {
        path: path.to_string(),
        reason,
    }
}

/// `json` at `path` is not `what`.
fn expected(json: &Json, path: &str, what: &str) -> Mismatch {
    mismatch(path, format!("expected {what}, got {}", describe(json)))
}

/// A `fixed`: a string of exactly its size in bytes.
fn convert_fixed(f: &FixedSchema, json: &Json, path: &str) -> Result<Value, Mismatch> {
    let b = bytes(json).ok_or_else(|| {
        expected(
            json,
            path,
            &format!("{} bytes (a string, one character per byte)", f.size),
        )
    })?;
    if b.len() != f.size {
        return Err(mismatch(
            path,
            format!(
                "fixed {} needs exactly {} bytes, got {}",
                f.name.name(),
                f.size,
                b.len()
            ),
        ));
    }
    Ok(Value::Fixed(f.size, b))
}

/// An `enum`: one of its symbols.
fn convert_enum(e: &EnumSchema, json: &Json, path: &str) -> Result<Value, Mismatch> {
    let s = json
        .as_str()
        .ok_or_else(|| expected(json, path, &format!("one of {:?}", e.symbols)))?;
    let i = e.symbols.iter().position(|x| x == s).ok_or_else(|| {
        mismatch(
            path,
            format!(
                "\"{s}\" is not a symbol of enum {}; one of {:?}",
                e.name.name(),
                e.symbols
            ),
        )
    })?;
    Ok(Value::Enum(i as u32, s.to_string()))
}

/// A record: an object with no field the record lacks, each field given
/// or defaulted.
fn convert_record(
    r: &RecordSchema,
    json: &Json,
    path: &str,
    names: &HashMap<Name, &Schema>,
) -> Result<Value, Mismatch> {
    let obj = json
        .as_object()
        .ok_or_else(|| expected(json, path, &format!("an object (record {})", r.name.name())))?;
    if let Some(unknown) = obj.keys().find(|k| !r.lookup.contains_key(*k)) {
        let known: Vec<&str> = r.fields.iter().map(|f| f.name.as_str()).collect();
        return Err(Mismatch {
            path: child(path, unknown),
            reason: format!(
                "record {} has no such field; its fields are {known:?}",
                r.name.name()
            ),
        });
    }
    let mut fields = Vec::with_capacity(r.fields.len());
    for f in &r.fields {
        let p = child(path, &f.name);
        let value = match (obj.get(&f.name), &f.default) {
            (Some(v), _) => convert(&f.schema, v, &p, names)?,
            (None, Some(default)) => convert_default(&f.schema, default, &p, names)?,
            (None, None) => {
                return Err(Mismatch {
                    path: p,
                    reason: format!(
                        "missing, and the schema gives it no default (type {})",
                        type_name(&f.schema)
                    ),
                })
            }
        };
        fields.push((f.name.clone(), value));
    }
    Ok(Value::Record(fields))
}

/// A union: Avro's JSON encoding naming its branch, or the first branch
/// the value converts to.
fn convert_union(
    schema: &Schema,
    u: &UnionSchema,
    json: &Json,
    path: &str,
    names: &HashMap<Name, &Schema>,
) -> Result<Value, Mismatch> {
    let variants = u.variants();
    // Avro's JSON encoding: {"string": "x"}, {"com.acme.Item": {...}}.
    if let Some((branch, inner)) = json
        .as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.iter().next())
    {
        if let Some((i, v)) = variants
            .iter()
            .enumerate()
            .find(|(_, v)| branch_name(v) == *branch)
        {
            return Ok(Value::Union(
                i as u32,
                Box::new(convert(v, inner, path, names)?),
            ));
        }
    }
    let mut reasons = Vec::new();
    for (i, v) in variants.iter().enumerate() {
        match convert(v, json, path, names) {
            Ok(value) => return Ok(Value::Union(i as u32, Box::new(value))),
            Err(m) => reasons.push(m),
        }
    }
    // The deepest reason is usually the useful one (a record branch
    // that failed on one of its fields).
    if let Some(deep) = reasons.iter().find(|m| m.path != path) {
        return Err(deep.clone());
    }
    Err(expected(json, path, &type_name(schema)))
}

/// A field default is written in Avro's JSON encoding, where a union's
/// default belongs to its first branch.
fn convert_default(
    schema: &Schema,
    default: &Json,
    path: &str,
    names: &HashMap<Name, &Schema>,
) -> Result<Value, Mismatch> {
    match schema {
        Schema::Union(u) => match u.variants().first() {
            Some(first) => Ok(Value::Union(
                0,
                Box::new(convert(first, default, path, names)?),
            )),
            None => convert(schema, default, path, names),
        },
        _ => convert(schema, default, path, names),
    }
}

fn branch_name(schema: &Schema) -> String {
    match schema {
        Schema::Record(r) => r.name.fullname(None),
        Schema::Enum(e) => e.name.fullname(None),
        Schema::Fixed(f) => f.name.fullname(None),
        Schema::Ref { name } => name.fullname(None),
        other => type_name(other),
    }
}

/// Avro's JSON encoding of bytes: each char one byte (U+0000 to U+00FF).
fn bytes(json: &Json) -> Option<Vec<u8>> {
    json.as_str()?
        .chars()
        .map(|c| u8::try_from(u32::from(c)).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Schema {
        Schema::parse_str(
            r#"{"type":"record","name":"Order","namespace":"acme","fields":[
                {"name":"id","type":"string"},
                {"name":"qty","type":"int"},
                {"name":"note","type":["null","string"],"default":null},
                {"name":"kind","type":{"type":"enum","name":"Kind","symbols":["A","B"]},"default":"A"},
                {"name":"items","type":{"type":"array","items":{"type":"record","name":"Item","fields":[
                    {"name":"sku","type":"string"},{"name":"n","type":"long"}]}},"default":[]},
                {"name":"other","type":["null","Item"],"default":null}
            ]}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn err(j: Json) -> Mismatch {
        match from_json(&schema(), &j) {
            Err(m) => m,
            Ok(v) => panic!("accepted {v:?}"),
        }
    }

    #[test]
    fn a_fitting_value_encodes_and_defaults_fill_in() {
        let s = schema();
        let v = from_json(
            &s,
            &json!({"id":"o1","qty":2,"items":[{"sku":"x","n":1}],"other":{"sku":"y","n":2}}),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(v, Value::Record(_)));
        assert!(to_datum(&s, &json!({"id":"o1","qty":2,"note":{"string":"hi"}})).is_ok());
        assert!(to_datum(&s, &json!({"id":"o1","qty":2,"note":"hi"})).is_ok());
    }

    #[test]
    fn a_prepared_schema_writes_what_to_datum_writes() {
        let prepared = PreparedSchema::prepare(schema());
        let job = json!({"id":"o1","qty":2,"items":[{"sku":"x","n":1}]});
        assert_eq!(prepared.to_datum(&job), to_datum(&schema(), &job));
        let m = prepared
            .to_datum(&json!({"id":"o1"}))
            .err()
            .unwrap_or_else(|| panic!("accepted a job without qty"));
        assert_eq!(m.path, "qty");
    }

    #[test]
    fn mismatches_name_the_field_and_the_reason() {
        let m = err(json!({"id":"o1","qty":"two"}));
        assert_eq!(m.path, "qty");
        assert!(
            m.reason.contains("expected an int") && m.reason.contains("\"two\""),
            "{m}"
        );
        let m = err(json!({"qty":1}));
        assert_eq!(m.path, "id");
        assert!(m.reason.contains("missing"), "{m}");
        let m = err(json!({"id":"o","qty":1,"items":[{"sku":"a","n":1},{"sku":"b","n":"x"}]}));
        assert_eq!(m.path, "items[1].n");
        let m = err(json!({"id":"o","qty":1,"kind":"C"}));
        assert!(m.reason.contains("not a symbol"), "{m}");
        let m = err(json!({"id":"o","qty":1,"qtty":2}));
        assert_eq!(m.path, "qtty");
        assert!(m.reason.contains("no such field"), "{m}");
        let m = err(json!({"id":"o","qty":3_000_000_000i64}));
        assert!(m.reason.contains("out of range"), "{m}");
        let m = err(json!({"id":"o","qty":1,"other":{"sku":"a"}}));
        assert_eq!(m.path, "other.n", "{m}");
    }
}
