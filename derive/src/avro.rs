//! Rust field types to Avro types, as apache-avro's serde writer and reader
//! see them, and the comparison of a field with its `.avsc` declaration.
//!
//! The mapping is the one apache-avro's own `AvroSchema` derive uses for
//! these types (kjob's tests compare the two), restricted to what kjob can
//! read from the tokens alone: a proc macro sees `Address`, not the fields
//! of `Address`, so a type it does not know is [`Avro::Opaque`].

use serde_json::Value;
use syn::{GenericArgument, PathArguments, Type};

use crate::json::Json;

/// The Avro form of a field type.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Avro {
    /// `int`, `long`, `string`, ...
    Prim(&'static str),
    /// `Option<T>`: the union `["null", T]`, default `null`.
    Optional(Box<Avro>),
    /// `Vec<T>`: `{"type": "array", "items": T}`.
    Array(Box<Avro>),
    /// `HashMap<String, T>`, `BTreeMap<String, T>`: `{"type": "map", "values": T}`.
    Map(Box<Avro>),
    /// A type the derive cannot see into (a struct or enum of the crate, a
    /// type with `#[serde(with)]`), with why it has no generated form. With
    /// a schema file its declaration there is taken as it stands.
    Opaque(String),
}

impl Avro {
    /// The type's Avro form, or a reason it has none.
    pub(crate) fn of(ty: &Type) -> Avro {
        match ty {
            Type::Paren(p) => Avro::of(&p.elem),
            Type::Group(g) => Avro::of(&g.elem),
            Type::Reference(r) => Avro::of(&r.elem),
            Type::Path(p) if p.qself.is_none() => {
                let Some(last) = p.path.segments.last() else {
                    return Avro::Opaque("an empty path".into());
                };
                let args = type_args(&last.arguments);
                match (last.ident.to_string().as_str(), args.as_slice()) {
                    ("bool", []) => Avro::Prim("boolean"),
                    ("i8" | "i16" | "i32" | "u8" | "u16", []) => Avro::Prim("int"),
                    ("i64" | "u32", []) => Avro::Prim("long"),
                    ("f32", []) => Avro::Prim("float"),
                    ("f64", []) => Avro::Prim("double"),
                    ("String" | "str" | "char", []) => Avro::Prim("string"),
                    ("u64" | "usize" | "isize" | "i128" | "u128", []) => Avro::Opaque(format!(
                        "`{}` has no Avro form that every reader agrees on (Avro has no unsigned or 128-bit integers): use i64 (`long`), or a String",
                        last.ident
                    )),
                    ("Box", [inner]) => Avro::of(inner),
                    ("Option", [inner]) => match Avro::of(inner) {
                        Avro::Optional(_) => Avro::Opaque(
                            "`Option<Option<T>>` has no Avro form (a union cannot hold a union)".into(),
                        ),
                        inner => Avro::Optional(Box::new(inner)),
                    },
                    ("Vec" | "VecDeque", [inner]) => Avro::Array(Box::new(Avro::of(inner))),
                    ("HashMap" | "BTreeMap", [key, value]) => match Avro::of(key) {
                        Avro::Prim("string") => Avro::Map(Box::new(Avro::of(value))),
                        _ => Avro::Opaque("Avro map keys are strings: use a String key".into()),
                    },
                    _ => Avro::Opaque(format!(
                        "`#[derive(Job)]` sees only the name `{}`, not its fields",
                        last.ident
                    )),
                }
            }
            _ => Avro::Opaque("this kind of type has no Avro form kjob generates".into()),
        }
    }

    /// Why this type (or a type inside it) has no generated form, if so.
    pub(crate) fn opaque(&self) -> Option<&str> {
        match self {
            Avro::Prim(_) => None,
            Avro::Optional(t) | Avro::Array(t) | Avro::Map(t) => t.opaque(),
            Avro::Opaque(why) => Some(why),
        }
    }

    /// The Avro type declaration (only for types without [`Avro::Opaque`]).
    pub(crate) fn to_json(&self) -> Json {
        match self {
            Avro::Prim(p) => Json::str(*p),
            Avro::Optional(t) => Json::Arr(vec![Json::str("null"), t.to_json()]),
            Avro::Array(t) => Json::obj([("type", Json::str("array")), ("items", t.to_json())]),
            Avro::Map(t) => Json::obj([("type", Json::str("map")), ("values", t.to_json())]),
            Avro::Opaque(_) => Json::Null,
        }
    }

    /// How a message names this type: `"long"`, `["null", "string"]`.
    pub(crate) fn describe(&self) -> String {
        match self.opaque() {
            None => self.to_json().compact(),
            Some(_) => "a type kjob does not map".into(),
        }
    }

    /// Whether `declared` (a field's `type` in a `.avsc` file) is what
    /// apache-avro writes and reads for this Rust type. Opaque parts match
    /// anything: the file is the authority there.
    pub(crate) fn matches(&self, declared: &Value) -> bool {
        match self {
            Avro::Opaque(_) => true,
            Avro::Prim(p) => primitive(declared) == Some(p),
            Avro::Optional(t) => match declared {
                Value::Array(branches) if branches.len() == 2 => {
                    let is_null = |v: &Value| primitive(v) == Some("null");
                    match (is_null(&branches[0]), is_null(&branches[1])) {
                        (true, false) => t.matches(&branches[1]),
                        (false, true) => t.matches(&branches[0]),
                        _ => false,
                    }
                }
                _ => false,
            },
            Avro::Array(t) => complex(declared, "array", "items").is_some_and(|v| t.matches(v)),
            Avro::Map(t) => complex(declared, "map", "values").is_some_and(|v| t.matches(v)),
        }
    }
}

/// The primitive a declaration names: `"string"` and `{"type": "string",
/// "logicalType": "uuid"}` are both `string` on the wire.
fn primitive(declared: &Value) -> Option<&str> {
    const PRIMITIVES: [&str; 8] = [
        "null", "boolean", "int", "long", "float", "double", "bytes", "string",
    ];
    let name = match declared {
        Value::String(s) => s.as_str(),
        Value::Object(o) => o.get("type")?.as_str()?,
        _ => return None,
    };
    PRIMITIVES.contains(&name).then_some(name)
}

/// `declared[key]` when `declared` is `{"type": kind, key: ...}`.
fn complex<'a>(declared: &'a Value, kind: &str, key: &str) -> Option<&'a Value> {
    let o = declared.as_object()?;
    (o.get("type")?.as_str()? == kind).then(|| o.get(key))?
}

/// The type arguments of `Name<A, B>`, ignoring lifetimes.
fn type_args(args: &PathArguments) -> Vec<&Type> {
    match args {
        PathArguments::AngleBracketed(a) => a
            .args
            .iter()
            .filter_map(|g| match g {
                GenericArgument::Type(t) => Some(t),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(ty: &str) -> Avro {
        match syn::parse_str::<Type>(ty) {
            Ok(t) => Avro::of(&t),
            Err(e) => Avro::Opaque(e.to_string()),
        }
    }

    #[test]
    fn types_map_like_apache_avro() {
        assert_eq!(of("String").describe(), r#""string""#);
        assert_eq!(of("std::string::String").describe(), r#""string""#);
        assert_eq!(of("i32").describe(), r#""int""#);
        assert_eq!(of("u32").describe(), r#""long""#);
        assert_eq!(of("Option<i64>").describe(), r#"["null", "long"]"#);
        assert_eq!(
            of("Vec<Option<String>>").describe(),
            r#"{"type": "array", "items": ["null", "string"]}"#
        );
        assert_eq!(
            of("std::collections::BTreeMap<String, f64>").describe(),
            r#"{"type": "map", "values": "double"}"#
        );
        assert!(of("u64").opaque().is_some_and(|w| w.contains("unsigned")));
        assert!(of("HashMap<i32, String>").opaque().is_some());
        assert!(of("Option<Option<String>>").opaque().is_some());
        assert!(of("Vec<Address>")
            .opaque()
            .is_some_and(|w| w.contains("Address")));
    }

    #[test]
    fn declarations_match_by_what_is_on_the_wire() {
        let v = |s: &str| serde_json::from_str::<Value>(s).unwrap_or(Value::Null);
        assert!(of("String").matches(&v(r#"{"type": "string", "logicalType": "uuid"}"#)));
        assert!(of("Option<String>").matches(&v(r#"["string", "null"]"#)));
        assert!(!of("Option<String>").matches(&v(r#""string""#)));
        assert!(!of("i32").matches(&v(r#""long""#)));
        assert!(of("Vec<i64>").matches(&v(r#"{"type": "array", "items": {"type": "long"}}"#)));
        assert!(!of("Vec<i64>").matches(&v(r#"{"type": "map", "values": "long"}"#)));
        assert!(of("Address").matches(&v(r#""kjob.Address""#)));
    }
}
