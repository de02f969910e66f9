//! Parsing and printing times for `--since`/`--until` and tables.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Result};

/// Parses an absolute time (`2026-11-29T10:00:00Z`, `2026-11-29 10:00:00`,
/// UTC when no offset is given) or a relative one (`2h`, `30m`, `1day`:
/// that long ago) into epoch milliseconds.
pub fn parse_time(flag: &str, s: &str) -> Result<i64> {
    if let Ok(t) = humantime::parse_rfc3339_weak(s) {
        return to_ms(t);
    }
    if let Ok(ago) = humantime::parse_duration(s) {
        return to_ms(SystemTime::now() - ago);
    }
    Err(anyhow!(
        "{flag} `{s}` is neither a date-time like 2026-11-29T10:00:00 nor a duration like 2h"
    ))
}

fn to_ms(t: SystemTime) -> Result<i64> {
    Ok(t.duration_since(UNIX_EPOCH)
        .map_err(|_| anyhow!("time before 1970"))?
        .as_millis() as i64)
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
        let now = to_ms(SystemTime::now()).unwrap_or(0);
        assert!((now - hour_ago - 3_600_000).abs() < 5_000);
        let err = parse_time("--until", "yesterday-ish")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("--until") && err.contains("yesterday-ish"),
            "{err}"
        );
        assert_eq!(format_ms(Some(1000)), "1970-01-01T00:00:01Z");
    }
}
