//! Parsing and printing times: `--since`/`--until`, replay's
//! `--to-datetime`/`--by-duration`, and the tables.
//!
//! The formats are those of `kafka-consumer-groups --reset-offsets`, so a
//! command an operator knows from Kafka's tool works here too:
//!
//! * durations in ISO-8601 (`PT2H`, `PT30M`, `P1DT3H`, `PT0.5S`; Java's
//!   `Duration.parse`: days, hours, minutes, seconds, each optionally
//!   signed), and kjob's short form (`2h`, `30m`, `1day`);
//! * datetimes `YYYY-MM-DDTHH:mm:SS[.sss]` with an offset (`Z`, `+01:00`,
//!   `+0100`, `+01`) or without one, which is UTC (as Kafka's tool reads it);
//!   a space instead of the `T` works too.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use chrono::{DateTime, FixedOffset, NaiveDateTime, SecondsFormat, TimeZone, Utc};

use crate::problem::Problem;

/// Parses an ISO-8601 duration as Java's `Duration.parse` (and so Kafka's
/// `--by-duration`) does: `[-]P[nD][T[nH][nM][n[.f]S]]`, case-insensitive,
/// each part optionally signed. Signed milliseconds; `None` if it is not
/// one.
pub fn parse_iso_duration(s: &str) -> Option<i64> {
    let upper = s.trim().to_ascii_uppercase();
    let (sign, rest) = match upper.as_bytes().first()? {
        b'-' => (-1i64, &upper[1..]),
        b'+' => (1, &upper[1..]),
        _ => (1, upper.as_str()),
    };
    let rest = rest.strip_prefix('P')?;
    let (days, time) = match rest.split_once('T') {
        Some((d, t)) => {
            if t.is_empty() {
                return None;
            }
            (d, Some(t))
        }
        None => (rest, None),
    };
    let mut total: i64 = 0;
    let mut parts = 0;
    if !days.is_empty() {
        let n = days.strip_suffix('D')?;
        total = total.checked_add(whole(n)?.checked_mul(86_400_000)?)?;
        parts += 1;
    }
    if let Some(mut t) = time {
        for (unit, ms) in [('H', 3_600_000i64), ('M', 60_000)] {
            if let Some(at) = t.find(unit) {
                total = total.checked_add(whole(&t[..at])?.checked_mul(ms)?)?;
                t = &t[at + 1..];
                parts += 1;
            }
        }
        if !t.is_empty() {
            let n = t.strip_suffix('S')?;
            total = total.checked_add(seconds_ms(n)?)?;
            parts += 1;
        }
    }
    (parts > 0).then_some(sign * total)
}

/// A signed whole number of an ISO duration part.
fn whole(n: &str) -> Option<i64> {
    if n.is_empty() || n == "-" || n == "+" {
        return None;
    }
    n.parse().ok()
}

/// Seconds with up to nine decimals (`.` or `,`), as milliseconds.
fn seconds_ms(n: &str) -> Option<i64> {
    let n = n.replace(',', ".");
    let (int, frac) = n.split_once('.').unwrap_or((n.as_str(), ""));
    let negative = int.starts_with('-');
    let secs: i64 = if int.is_empty() || int == "-" || int == "+" {
        if frac.is_empty() {
            return None;
        }
        0
    } else {
        int.parse().ok()?
    };
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let millis: i64 = format!("{frac:0<3}")[..3].parse().ok()?;
    let millis = if negative { -millis } else { millis };
    secs.checked_mul(1000)?.checked_add(millis)
}

/// Parses a datetime in the forms of the [module docs](self) into epoch
/// milliseconds; `None` if it is not one.
pub fn parse_datetime(s: &str) -> Option<i64> {
    let s = s.trim().replacen(' ', "T", 1);
    if let Ok(t) = DateTime::parse_from_rfc3339(&s) {
        return Some(t.timestamp_millis());
    }
    // An offset as +hhmm or +hh, which RFC 3339 does not allow.
    for format in ["%Y-%m-%dT%H:%M:%S%.f%z", "%Y-%m-%dT%H:%M:%S%z"] {
        if let Ok(t) = DateTime::<FixedOffset>::parse_from_str(&s, format) {
            return Some(t.timestamp_millis());
        }
    }
    if let Some((base, hours)) = split_hour_offset(&s) {
        let offset = FixedOffset::east_opt(hours * 3600)?;
        let naive = NaiveDateTime::parse_from_str(base, "%Y-%m-%dT%H:%M:%S%.f").ok()?;
        return Some(
            offset
                .from_local_datetime(&naive)
                .single()?
                .timestamp_millis(),
        );
    }
    // No offset: UTC, as Kafka's tool reads it.
    let naive = NaiveDateTime::parse_from_str(&s, "%Y-%m-%dT%H:%M:%S%.f").ok()?;
    Some(Utc.from_utc_datetime(&naive).timestamp_millis())
}

/// `2026-12-01T09:00:00+01` as (`2026-12-01T09:00:00`, 1).
fn split_hour_offset(s: &str) -> Option<(&str, i32)> {
    let (_, time) = s.split_once('T')?;
    let at = time.rfind(['+', '-'])?;
    let (base_len, tail) = (s.len() - time.len() + at, &time[at..]);
    if tail.len() != 3 {
        return None;
    }
    let hours: i32 = tail.parse().ok()?;
    Some((&s[..base_len], hours))
}

/// A duration flag: ISO-8601 (`PT2H`, `-PT30M`) or kjob's short form
/// (`2h`), as signed milliseconds. A malformed one is a usage error
/// naming the flag and both forms.
pub fn parse_duration_flag(flag: &str, s: &str) -> Result<i64> {
    if let Some(ms) = parse_iso_duration(s) {
        return Ok(ms);
    }
    if let Ok(d) = humantime::parse_duration(s.trim()) {
        return Ok(i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    }
    Err(Problem::usage(format!(
        "{flag} `{s}` is not a duration: use ISO-8601 as Kafka's tools do (PT2H, PT30M, P1DT3H) or a short form (2h, 30m, 1day)"
    ))
    .into())
}

/// A datetime flag (see the [module docs](self)) as epoch milliseconds; a
/// malformed one is a usage error naming the flag and the forms.
pub fn parse_datetime_flag(flag: &str, s: &str) -> Result<i64> {
    parse_datetime(s).ok_or_else(|| {
        Problem::usage(format!(
            "{flag} `{s}` is not a date-time: use YYYY-MM-DDTHH:mm:SS[.sss] with an offset (2026-12-01T09:00:00+01:00, ...Z) or without one (UTC)"
        ))
        .into()
    })
}

/// Parses an absolute time or a relative one (a duration: that long ago)
/// into epoch milliseconds, for `--since`/`--until`.
pub fn parse_time(flag: &str, s: &str) -> Result<i64> {
    if let Some(ms) = parse_datetime(s) {
        return Ok(ms);
    }
    let ago = parse_iso_duration(s).or_else(|| {
        humantime::parse_duration(s.trim())
            .ok()
            .and_then(|d| i64::try_from(d.as_millis()).ok())
    });
    match ago {
        Some(ago) => Ok(now_ms().saturating_sub(ago)),
        None => Err(Problem::usage(format!(
            "{flag} `{s}` is neither a date-time like 2026-11-29T10:00:00 (UTC) or 2026-11-29T10:00:00+01:00 nor a duration like PT2H or 2h (that long ago)"
        ))
        .into()),
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Formats epoch milliseconds as an RFC 3339 UTC time (seconds).
pub fn format_ms(ms: Option<i64>) -> String {
    match ms {
        Some(ms) if ms >= 0 => {
            humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms as u64))
                .to_string()
        }
        _ => "-".into(),
    }
}

/// Formats epoch milliseconds as an RFC 3339 UTC time with milliseconds,
/// as a resolved `--to-datetime` is echoed back.
pub fn format_ms_exact(ms: i64) -> String {
    match Utc.timestamp_millis_opt(ms).single() {
        Some(t) => t.to_rfc3339_opts(SecondsFormat::Millis, true),
        None => ms.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_relative_and_bad() {
        assert_eq!(
            parse_time("--since", "1970-01-01T00:00:01Z").ok(),
            Some(1000)
        );
        assert_eq!(
            parse_time("--since", "1970-01-01 00:00:02").ok(),
            Some(2000)
        );
        let hour_ago = parse_time("--since", "1h").unwrap_or(0);
        let iso_hour_ago = parse_time("--since", "PT1H").unwrap_or(0);
        let now = now_ms();
        assert!((now - hour_ago - 3_600_000).abs() < 5_000);
        assert!((now - iso_hour_ago - 3_600_000).abs() < 5_000);
        let err = parse_time("--until", "yesterday-ish")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("--until") && err.contains("yesterday-ish"),
            "{err}"
        );
        assert_eq!(format_ms(Some(1000)), "1970-01-01T00:00:01Z");
        assert_eq!(format_ms_exact(1500), "1970-01-01T00:00:01.500Z");
    }

    #[test]
    fn iso_durations_as_java_parses_them() {
        for (s, ms) in [
            ("PT2H", 7_200_000),
            ("pt30m", 1_800_000),
            ("P1DT3H", 97_200_000),
            ("P2D", 172_800_000),
            ("PT0.5S", 500),
            ("PT1,25S", 1250),
            ("PT1H30M15S", 5_415_000),
            ("-PT30M", -1_800_000),
            ("PT-30M", -1_800_000),
            ("+PT1M", 60_000),
            ("PT-0.5S", -500),
        ] {
            assert_eq!(parse_iso_duration(s), Some(ms), "{s}");
        }
        for bad in [
            "P",
            "PT",
            "2h",
            "P1H",
            "PT1D",
            "PTH",
            "P1DT",
            "PT1.1234567891S",
            "",
        ] {
            assert_eq!(parse_iso_duration(bad), None, "{bad}");
        }
        assert_eq!(
            parse_duration_flag("--by-duration", "90m").ok(),
            Some(5_400_000)
        );
        let err = parse_duration_flag("--by-duration", "fortnight")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("PT2H") && err.contains("--by-duration"),
            "{err}"
        );
    }

    #[test]
    fn datetimes_with_and_without_offsets() {
        let utc_9 = 1_796_115_600_000; // 2026-12-01T09:00:00Z
        for (s, ms) in [
            ("2026-12-01T09:00:00Z", utc_9),
            ("2026-12-01T10:00:00+01:00", utc_9),
            ("2026-12-01T10:00:00+0100", utc_9),
            ("2026-12-01T10:00:00+01", utc_9),
            ("2026-12-01T08:00:00-01:00", utc_9),
            ("2026-12-01T09:00:00.000", utc_9),
            ("2026-12-01T09:00:00.250", utc_9 + 250),
            ("2026-12-01T10:00:00.250+01:00", utc_9 + 250),
            ("2026-12-01T09:00:00", utc_9),
            ("2026-12-01 09:00:00", utc_9),
        ] {
            assert_eq!(parse_datetime(s), Some(ms), "{s}");
        }
        for bad in [
            "2026-12-01",
            "tuesday",
            "2026-13-01T00:00:00",
            "2026-12-01T25:00:00Z",
        ] {
            assert_eq!(parse_datetime(bad), None, "{bad}");
        }
    }
}
