//! A JSON value that keeps object keys in the order they were added.
//!
//! The generated schema is read by people (exported to `schemas/` and
//! reviewed in pull requests), so `type`, `name` and `fields` come first as
//! in a hand-written `.avsc`. `serde_json::Value` sorts keys unless its
//! `preserve_order` feature is on, and turning that on here would change
//! the behaviour of every other proc macro sharing the build.

use std::fmt::Write as _;

/// A JSON value with ordered objects.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Json {
    Null,
    Bool(bool),
    /// A number, already in JSON syntax.
    Num(String),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// An object from `(key, value)` pairs.
    pub(crate) fn obj<const N: usize>(pairs: [(&str, Json); N]) -> Json {
        Json::Obj(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }

    /// A string value.
    pub(crate) fn str(s: impl Into<String>) -> Json {
        Json::Str(s.into())
    }

    /// One line, with a space after `:` and `,` like the `.avsc` files in
    /// kjob's repository.
    pub(crate) fn compact(&self) -> String {
        let mut out = String::new();
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Num(n) => out.push_str(n),
            Json::Str(s) => escape_into(s, out),
            Json::Arr(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    item.write(out);
                }
                out.push(']');
            }
            Json::Obj(pairs) => {
                out.push('{');
                for (i, (k, v)) in pairs.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    escape_into(k, out);
                    out.push_str(": ");
                    v.write(out);
                }
                out.push('}');
            }
        }
    }
}

/// Writes `s` as a JSON string literal.
fn escape_into(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped_and_keys_keep_their_order() {
        let j = Json::obj([
            ("type", Json::str("record")),
            ("doc", Json::str("a \"b\"\n\\c\u{1}")),
            (
                "n",
                Json::Arr(vec![Json::Null, Json::Bool(true), Json::Num("-1".into())]),
            ),
        ]);
        let text = j.compact();
        assert_eq!(
            text,
            r#"{"type": "record", "doc": "a \"b\"\n\\c\u0001", "n": [null, true, -1]}"#
        );
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(parsed["doc"], "a \"b\"\n\\c\u{1}");
    }
}
