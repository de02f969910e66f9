//! How values are shown on the pages: bidi controls escaped, long values
//! cut to their column, times as dates with their age, rates without a
//! minus zero, and messages with their `quoted` names as code.
//!
//! Whoever can produce a record decides what its key, headers and error
//! hold. maud's escaping keeps that from being markup; this module keeps it
//! from being misread: a right-to-left override makes `gnp.exe` read
//! `exe.png`, and a 100 KB key would otherwise widen a table far past the
//! screen.

use std::borrow::Cow;
use std::fmt::Write as _;

use chrono::{TimeZone, Utc};
use maud::{html, Markup, PreEscaped};

use crate::terminal::is_bidi_control;

/// Characters of a record's value (key, job, error class) shown in a
/// table cell; the detail page shows the whole value.
pub(super) const CELL_CHARS: usize = 80;

/// Characters of an error message shown in the DLQ table (its column
/// wraps); the detail page shows the whole header.
pub(super) const ERROR_CHARS: usize = 160;

/// `html` with every bidi control outside a tag written as a visible
/// escape (`\u{202e}`, as `kjob dlq list` writes it), so it is shown
/// instead of reordering the text around it.
///
/// This runs over the whole rendered page rather than cell by cell, so no
/// value can be forgotten (headers, audit entries, group names, error
/// messages). It is exact because maud escapes `<` and `>` in text and in
/// attribute values alike: a raw `<` always opens a tag and a raw `>`
/// always closes one. Attribute values are left alone: they are not shown,
/// or (a form's hidden fields) must send back what they were given.
pub(super) fn neutralise_bidi(page: Markup) -> Markup {
    let html = page.into_string();
    if !html.chars().any(is_bidi_control) {
        return PreEscaped(html);
    }
    let mut out = String::with_capacity(html.len() + 64);
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            _ => {}
        }
        if !in_tag && is_bidi_control(c) {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    PreEscaped(out)
}

/// At most `max` characters of `value`, with `…` where it was cut: what a
/// table cell shows (the page then weighs kilobytes, not the megabytes of
/// a few 100 KB keys).
pub(super) fn cut(value: &str, max: usize) -> Cow<'_, str> {
    match value.char_indices().nth(max) {
        None => Cow::Borrowed(value),
        Some((at, _)) => Cow::Owned(format!("{}…", &value[..at])),
    }
}

/// A rate per second with one decimal. Never `-0.0`: a sum of no rates
/// is `-0.0` in Rust (the identity of float addition), and a rate below
/// zero only means offsets went backwards (a recreated topic), not work.
pub(super) fn rate(per_second: f64) -> String {
    if per_second.is_finite() && per_second >= 0.05 {
        format!("{per_second:.1}")
    } else {
        "0.0".to_string()
    }
}

/// Epoch milliseconds as a UTC date (`2026-11-29 10:00:00 UTC`).
pub(super) fn utc(ms: i64) -> Option<String> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
}

/// How long ago (or how far ahead) `ms` is from `now_ms`, in the largest
/// unit that fits: `12 s ago`, `3 min ago`, `in 2 h`, `5 days ago`.
pub(super) fn age(ms: i64, now_ms: i64) -> String {
    let delta = now_ms.saturating_sub(ms);
    let secs = delta.unsigned_abs() / 1000;
    let amount = match secs {
        0..=1 => return "now".to_string(),
        2..=119 => format!("{secs} s"),
        120..=7199 => format!("{} min", secs / 60),
        7200..=172_799 => format!("{} h", secs / 3600),
        _ => format!("{} days", secs / 86_400),
    };
    if delta >= 0 {
        format!("{amount} ago")
    } else {
        format!("in {amount}")
    }
}

/// A point in time for a page: the UTC date and its age, with the raw
/// epoch milliseconds on hover (the `title`) and as `datetime`. `-` when
/// there is none.
pub(super) fn when(ms: Option<i64>, now_ms: i64) -> Markup {
    match ms.and_then(|ms| Some((ms, utc(ms)?))) {
        Some((ms, date)) => html! {
            time.when datetime=(crate::time::format_ms_exact(ms)) title=(ms) {
                (date) " " span.age { "(" (age(ms, now_ms)) ")" }
            }
        },
        None => html! { "-" },
    }
}

/// Whether a header holds a time in epoch milliseconds, by kjob's naming
/// (`kjob-due-at`, `kjob-run-at`, `kjob-first-failed-at`,
/// `kjob-original-timestamp`) and a value that reads as one (1973 to 5138):
/// another header, or a value that is not a plausible time, stays as it is.
pub(super) fn header_time(name: &str, value: &str) -> Option<i64> {
    if !(name.ends_with("-at") || name.ends_with("-timestamp")) {
        return None;
    }
    value
        .trim()
        .parse::<i64>()
        .ok()
        .filter(|ms| (100_000_000_000..100_000_000_000_000).contains(ms))
}

/// A message with its `quoted` names shown as code rather than with their
/// backticks (messages are shared with the terminal commands, which quote
/// that way). A message with an odd number of backticks is shown as it is.
pub(super) fn prose(message: &str) -> Markup {
    let parts: Vec<&str> = message.split('`').collect();
    if parts.len().is_multiple_of(2) {
        return html! { (message) };
    }
    html! {
        @for (i, part) in parts.iter().enumerate() {
            @if i % 2 == 1 { code { (part) } } @else { (part) }
        }
    }
}

/// Percent-encodes a query value (topic and group names are plain, but a
/// link must not break on an odd one).
pub(super) fn urlencode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bidi_controls_become_escapes_in_text_only() {
        let page = html! {
            td title="x" data-v="a\u{202e}b" { "photo\u{202e}gnp.exe" }
            input value="\u{2066}kept";
            p { "\u{200e}\u{200f}\u{061c}\u{202a}\u{2069} <b>" }
        };
        let out = neutralise_bidi(page).into_string();
        assert!(out.contains("photo\\u{202e}gnp.exe"), "{out}");
        assert!(
            out.contains("\\u{200e}\\u{200f}\\u{61c}\\u{202a}\\u{2069} &lt;b&gt;"),
            "{out}"
        );
        // Attribute values are sent back by forms: unchanged.
        assert!(out.contains("data-v=\"a\u{202e}b\""), "{out}");
        assert!(out.contains("value=\"\u{2066}kept\""), "{out}");
        let text: String = out
            .split('<')
            .map(|s| s.split_once('>').map_or(s, |(_, t)| t))
            .collect();
        assert!(!text.chars().any(is_bidi_control), "{text}");
    }

    #[test]
    fn long_values_are_cut_on_a_character_boundary() {
        assert_eq!(cut("short", 80), "short");
        let long = "é".repeat(100_000);
        let shown = cut(&long, 80);
        assert_eq!(shown.chars().count(), 81);
        assert!(shown.ends_with('…'));
        assert_eq!(cut("abcdef", 3), "abc…");
        assert_eq!(cut("abc", 3), "abc");
    }

    #[test]
    fn rates_never_show_minus_zero() {
        let none: f64 = Vec::<f64>::new().iter().sum();
        assert!(none.is_sign_negative(), "the sum of no floats is -0.0");
        assert_eq!(rate(none), "0.0");
        assert_eq!(rate(-0.04), "0.0");
        assert_eq!(rate(-3.0), "0.0");
        assert_eq!(rate(f64::NAN), "0.0");
        assert_eq!(rate(0.04), "0.0");
        assert_eq!(rate(12.34), "12.3");
    }

    #[test]
    fn times_read_as_dates_and_ages_with_the_raw_value_on_hover() {
        let ms = 1_796_055_412_036; // 2026-11-30T...
        assert_eq!(utc(ms).as_deref(), Some("2026-11-30 16:16:52 UTC"));
        assert_eq!(age(ms, ms + 180_000), "3 min ago");
        assert_eq!(age(ms, ms + 5_000), "5 s ago");
        assert_eq!(age(ms, ms - 7_200_000), "in 2 h");
        assert_eq!(age(ms, ms + 3 * 86_400_000), "3 days ago");
        assert_eq!(age(ms, ms + 400), "now");
        let shown = when(Some(ms), ms + 180_000).into_string();
        assert!(shown.contains("title=\"1796055412036\""), "{shown}");
        assert!(shown.contains("2026-11-30 16:16:52 UTC"), "{shown}");
        assert!(shown.contains("(3 min ago)"), "{shown}");
        assert_eq!(when(None, ms).into_string(), "-");
        assert_eq!(
            header_time("kjob-first-failed-at", "1796055412036"),
            Some(ms)
        );
        assert_eq!(
            header_time("kjob-original-timestamp", " 1796055412036 "),
            Some(ms)
        );
        assert_eq!(header_time("kjob-attempt", "1796055412036"), None);
        assert_eq!(header_time("kjob-due-at", "soon"), None);
        assert_eq!(header_time("kjob-due-at", "12"), None);
    }

    #[test]
    fn quoted_names_become_code() {
        assert_eq!(
            prose("no route `a<b` for group `g`").into_string(),
            "no route <code>a&lt;b</code> for group <code>g</code>"
        );
        assert_eq!(prose("odd ` one").into_string(), "odd ` one");
    }
}
