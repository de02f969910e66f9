//! Record contents made safe for an operator's terminal.
//!
//! Anyone who can produce a record to a route decides what its key, its
//! headers and its error text hold, and `kjob dlq list` shows them to the
//! operators who review the DLQ. Printed raw, `\x1b]0;PWNED\x07` retitles
//! their terminal, `\x1b[2J` clears it, a right-to-left override (U+202E)
//! makes text read backwards, and one 100 KB key turns the table into
//! megabytes. So every value taken from a record goes through
//! [`for_terminal`] before it reaches a table or a line of text, and JSON
//! output through [`json_for_terminal`], which keeps the values exact.

use std::fmt::Write as _;

/// Width (in characters) of a table cell holding a value from a record.
pub const CELL_WIDTH: usize = 60;

/// Width (in characters) of a value printed on a line of its own: an error
/// message, a string in `kjob dlq show`.
pub const LINE_WIDTH: usize = 4096;

/// Whether printing `c` raw could make a terminal do something rather than
/// show something: a control character (C0, DEL, C1: a C1 `U+009B` is a CSI
/// to some terminals) or a Unicode bidi control, which reorders the text
/// around it (embeddings and overrides U+202A–U+202E, isolates
/// U+2066–U+2069, the marks U+200E, U+200F and U+061C).
pub fn is_unsafe(c: char) -> bool {
    c.is_control() || is_bidi_control(c)
}

/// Whether `c` is a Unicode bidi control: it shows nothing itself but
/// reorders the text around it, so `photo\u{202e}gnp.exe` reads as
/// `photoexe.png`. The dashboard escapes these in what it shows too.
pub fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
    )
}

/// `value` as a terminal may show it: every [`is_unsafe`] character
/// escaped (`\n`, `\t`, `\r`, `\x1b`, `\u{9b}`, `\u{202e}`), and cut after
/// `width` characters with a marker saying how much was left out
/// (`…(+102387 bytes)`, bytes of `value`).
///
/// The output never holds an unsafe character, and has at most `width`
/// characters plus the marker. Safe text that fits comes back unchanged,
/// and applying it again (as wide or wider) changes nothing: a backslash is
/// not escaped, so escapes do not pile up when a message is made safe twice
/// (by `kjob_ops` and again by the CLI's error line).
pub fn for_terminal(value: &str, width: usize) -> String {
    shorten(value, width, true)
}

/// Serialised JSON (as `serde_json` writes it) safe for a terminal, with
/// every value exact: `serde_json` escapes C0 controls but leaves DEL, C1
/// and bidi controls raw, so this writes those as `\uXXXX` escapes, which
/// mean the same characters to any JSON reader. Nothing is cut.
pub fn json_for_terminal(json: &str) -> String {
    // Outside strings JSON is ASCII punctuation, digits, literals and
    // whitespace, so an unsafe character here is inside a string (C0 ones
    // serde_json escaped already, except in whitespace between tokens,
    // which is `\n`, `\t`, `\r` or a space and must stay as it is).
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if is_unsafe(c) && !matches!(c, '\n' | '\t' | '\r') {
            // Every unsafe character is in the Basic Multilingual Plane.
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

/// A JSON value for reading on a terminal (`kjob dlq show` without
/// `--json`): every string, and every object key, cut like
/// [`for_terminal`] cuts (marker included), but not escaped, since
/// [`json_for_terminal`] escapes the serialised text.
pub fn cut_json_strings(value: &serde_json::Value, width: usize) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::String(s) => Value::String(shorten(s, width, false)),
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| cut_json_strings(v, width)).collect())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (shorten(k, width, false), cut_json_strings(v, width)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The one loop behind [`for_terminal`] and [`cut_json_strings`]: at most
/// `width` characters of `value` (escaped first when `escape`), then the
/// marker for the rest.
fn shorten(value: &str, width: usize, escape: bool) -> String {
    let mut out = String::with_capacity(value.len().min(width.saturating_mul(4)) + 24);
    let mut shown = 0;
    for (at, c) in value.char_indices() {
        let start = out.len();
        if escape && is_unsafe(c) {
            match c {
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                c if c.is_ascii() => {
                    let _ = write!(out, "\\x{:02x}", u32::from(c));
                }
                c => {
                    let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
                }
            }
        } else {
            out.push(c);
        }
        let added = out[start..].chars().count();
        if shown + added > width {
            out.truncate(start);
            let _ = write!(out, "…(+{} bytes)", value.len() - at);
            return out;
        }
        shown += added;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn escape_sequences_are_shown_not_run() {
        assert_eq!(
            for_terminal("a\x1b]0;PWNED\x07b", 60),
            "a\\x1b]0;PWNED\\x07b"
        );
        assert_eq!(for_terminal("\x1b[2J", 60), "\\x1b[2J");
        assert_eq!(for_terminal("x\u{9b}31m", 60), "x\\u{9b}31m");
        assert_eq!(for_terminal("del\x7f", 60), "del\\x7f");
        assert_eq!(for_terminal("l1\nl2\tt\r", 60), "l1\\nl2\\tt\\r");
        assert_eq!(
            for_terminal("abc\u{202e}fed\u{2066}\u{200f}\u{061c}", 60),
            "abc\\u{202e}fed\\u{2066}\\u{200f}\\u{61c}"
        );
    }

    #[test]
    fn safe_text_is_unchanged() {
        for s in [
            "order-42",
            "Zürich 東京 😀",
            "C:\\dir\\x1b (typed, not an ESC)",
            "",
        ] {
            assert_eq!(for_terminal(s, 60), s);
        }
    }

    #[test]
    fn long_values_are_cut_with_a_marker() {
        let key = "k".repeat(102_400);
        let shown = for_terminal(&key, 13);
        assert_eq!(shown, format!("{}…(+102387 bytes)", "k".repeat(13)));
        // An escape is never split: it goes whole, or into the marker.
        assert_eq!(for_terminal("ab\x1b", 3), "ab…(+1 bytes)");
        assert_eq!(for_terminal("ab\x1b", 6), "ab\\x1b");
        // Bytes, not characters, are counted in the marker.
        assert_eq!(for_terminal("ééé", 1), "é…(+4 bytes)");
    }

    #[test]
    fn json_keeps_values_exact_and_escapes_what_serde_json_leaves_raw() -> serde_json::Result<()> {
        let key = "\x1b]0;PWNED\x07 \x7f \u{9b} \u{202e}rtl \u{2069}";
        let value = serde_json::json!({ "key": key, "n": 1 });
        for text in [
            serde_json::to_string(&value)?,
            serde_json::to_string_pretty(&value)?,
        ] {
            let safe = json_for_terminal(&text);
            assert!(!safe.chars().any(|c| is_unsafe(c) && c != '\n'), "{safe}");
            assert!(
                safe.contains("\\u001b") && safe.contains("\\u202e"),
                "{safe}"
            );
            let back: serde_json::Value = serde_json::from_str(&safe)?;
            assert_eq!(back, value);
        }
        Ok(())
    }

    #[test]
    fn json_for_reading_cuts_strings_and_keys() {
        let long = "v".repeat(10_000);
        let value = serde_json::json!({ long.clone(): [long.clone(), 7], "short": "s" });
        let cut = cut_json_strings(&value, 5);
        let expected_key = "vvvvv…(+9995 bytes)".to_string();
        assert_eq!(cut[&expected_key][0], serde_json::json!(expected_key));
        assert_eq!(cut[&expected_key][1], 7);
        assert_eq!(cut["short"], "s");
    }

    /// Strings rich in what a terminal must not see raw.
    fn hostile() -> impl Strategy<Value = String> {
        let pieces = prop_oneof![
            any::<char>().prop_map(String::from),
            Just("\x1b]0;PWNED\x07".to_string()),
            Just("\x1b[2J".to_string()),
            prop::sample::select(vec![
                '\u{9b}', '\u{7f}', '\u{0}', '\u{202a}', '\u{202e}', '\u{2066}', '\u{2069}',
                '\u{200e}', '\u{200f}', '\u{61c}', '\\', '…',
            ])
            .prop_map(String::from),
            "[a-z]{0,8}",
        ];
        prop::collection::vec(pieces, 0..200).prop_map(|v| v.concat())
    }

    proptest! {
        #[test]
        fn output_is_safe_and_bounded(s in hostile(), width in 0usize..120) {
            let shown = for_terminal(&s, width);
            prop_assert!(!shown.chars().any(is_unsafe), "{shown:?}");
            // The marker is at most "…(+" + 20 digits + " bytes)".
            prop_assert!(shown.chars().count() <= width + 30, "{shown:?}");
            let cut = shorten(&s, width, false);
            prop_assert!(cut.chars().count() <= width + 30);
        }

        #[test]
        fn safe_text_that_fits_is_unchanged_and_a_second_pass_changes_nothing(
            s in hostile(),
            width in 0usize..120,
        ) {
            let once = for_terminal(&s, width);
            prop_assert_eq!(for_terminal(&once, usize::MAX), once.clone());
            if !s.chars().any(is_unsafe) && s.chars().count() <= width {
                prop_assert_eq!(once, s);
            }
        }

        #[test]
        fn json_stays_exact(s in hostile()) {
            let value = serde_json::json!({ "k": s, "h": [s.clone()] });
            let text = serde_json::to_string(&value).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let safe = json_for_terminal(&text);
            prop_assert!(!safe.chars().any(is_unsafe));
            let back: serde_json::Value = serde_json::from_str(&safe).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(back, value);
        }
    }
}
