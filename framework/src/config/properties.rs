//! Java properties files, read the way Kafka's tools read a
//! `--command-config` file (`java.util.Properties.load`), so the file an
//! operator already has for `kafka-consumer-groups.sh` works for kjob too.
//!
//! The syntax: one `key=value` per line (`key: value` and `key value` too);
//! lines whose first non-blank character is `#` or `!` are comments; a line
//! ending in an odd number of backslashes continues on the next one (whose
//! leading blanks are dropped); `\t`, `\n`, `\r`, `\f`, `\uXXXX` and a
//! backslash before any other character (`\=`, `\:`, `\ `, `\\`) are escapes,
//! in keys and values alike. Unlike Java, which reads ISO-8859-1, the file is
//! read as UTF-8 (and as ISO-8859-1 only when it is not valid UTF-8).

/// One property of a file: the line its entry starts on (1-based), its key
/// and its value, escapes resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Property {
    /// The line the entry starts on (1-based), for error messages.
    pub line: usize,
    /// The key, e.g. `client.rack`.
    pub key: String,
    /// The value, e.g. `r1`.
    pub value: String,
}

/// A properties file's bytes as text: UTF-8, else ISO-8859-1 (what Java
/// reads), so a file written by a Java tool never fails to load.
pub(super) fn decode(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_string(),
        Err(_) => bytes.iter().map(|&b| char::from(b)).collect(),
    }
}

/// Parses properties text. The only errors are malformed `\u` escapes,
/// named with their line (Java fails on those too).
pub fn parse(text: &str) -> Result<Vec<Property>, String> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate().peekable();
    while let Some((i, first)) = lines.next() {
        let start = first.trim_start_matches([' ', '\t', '\x0c']);
        if start.is_empty() || start.starts_with('#') || start.starts_with('!') {
            continue;
        }
        // Join continuation lines into one logical line.
        let mut logical = String::from(start);
        while ends_with_odd_backslashes(&logical) {
            logical.pop();
            match lines.next() {
                Some((_, next)) => logical.push_str(next.trim_start_matches([' ', '\t', '\x0c'])),
                None => break,
            }
        }
        let (key, value) = split_entry(&logical);
        let line = i + 1;
        out.push(Property {
            line,
            key: unescape(key).map_err(|e| format!("line {line}: {e}"))?,
            value: unescape(value).map_err(|e| format!("line {line}: {e}"))?,
        });
    }
    Ok(out)
}

fn ends_with_odd_backslashes(s: &str) -> bool {
    s.chars().rev().take_while(|c| *c == '\\').count() % 2 == 1
}

/// The raw (still escaped) key and value of a logical line: the key ends at
/// the first unescaped `=`, `:` or blank; blanks, then one `=` or `:`, then
/// blanks separate it from the value.
fn split_entry(line: &str) -> (&str, &str) {
    let mut escaped = false;
    let mut key_end = line.len();
    for (i, c) in line.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '=' | ':' | ' ' | '\t' | '\x0c' => {
                key_end = i;
                break;
            }
            _ => {}
        }
    }
    let key = &line[..key_end];
    let rest = line[key_end..].trim_start_matches([' ', '\t', '\x0c']);
    let rest = rest
        .strip_prefix('=')
        .or_else(|| rest.strip_prefix(':'))
        .unwrap_or(rest);
    (key, rest.trim_start_matches([' ', '\t', '\x0c']))
}

fn unescape(raw: &str) -> Result<String, String> {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('f') => out.push('\x0c'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                let code = u32::from_str_radix(&hex, 16)
                    .ok()
                    .filter(|_| hex.len() == 4)
                    .and_then(char::from_u32)
                    .ok_or_else(|| format!("malformed \\uXXXX escape `\\u{hex}`"))?;
                out.push(code);
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(text: &str) -> Vec<(String, String)> {
        parse(text)
            .unwrap_or_default()
            .into_iter()
            .map(|p| (p.key, p.value))
            .collect()
    }

    #[test]
    fn separators_comments_and_blanks() {
        let text = "# a comment\n! another\n\nclient.rack=r1\n  linger.ms : 5\nacks all\nempty=\nspaced   =   v w  \n";
        assert_eq!(
            pairs(text),
            vec![
                ("client.rack".into(), "r1".into()),
                ("linger.ms".into(), "5".into()),
                ("acks".into(), "all".into()),
                ("empty".into(), String::new()),
                ("spaced".into(), "v w  ".into()),
            ]
        );
    }

    #[test]
    fn continuations_escapes_and_line_numbers() {
        let text = "a=one\\\n    two\\\n  three\nb\\=c=x\\ty\\u0041\\\\\nc=ends\\\\\nd=e";
        let parsed = parse(text).unwrap_or_default();
        let got: Vec<(usize, &str, &str)> = parsed
            .iter()
            .map(|p| (p.line, p.key.as_str(), p.value.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, "a", "onetwothree"),
                (4, "b=c", "x\tyA\\"),
                (5, "c", "ends\\"),
                (6, "d", "e"),
            ]
        );
    }

    #[test]
    fn a_bad_unicode_escape_names_its_line() {
        let err = parse("ok=1\nbad=\\u12G4\n").err().unwrap_or_default();
        assert!(err.contains("line 2") && err.contains("\\u12G4"), "{err}");
    }

    #[test]
    fn latin1_files_load() {
        assert_eq!(decode(b"k=caf\xe9"), "k=café");
        assert_eq!(decode("k=café".as_bytes()), "k=café");
    }
}
