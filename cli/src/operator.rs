//! Who an operator command acts as, for the audit records it writes
//! (dead-letter re-drives and resolves, route pauses, cancellations,
//! batch and schedule actions, the dashboard's actions).
//!
//! `--by NAME` when given, else `KJOB_OPERATOR` (for scripts and CI jobs),
//! else `$USER`, else `uid <N>@<host>`: a container often has no `$USER`,
//! and an audit trail that says "by unknown" answers nothing.

/// The variable a script sets to name itself in the audit trail.
pub(crate) const OPERATOR_ENV: &str = "KJOB_OPERATOR";

/// The name `--by` defaults to (see the module docs).
pub(crate) fn default_name() -> String {
    let set = |name: &str| {
        std::env::var(name)
            .ok()
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    set(OPERATOR_ENV)
        .or_else(|| set("USER"))
        .unwrap_or_else(uid_at_host)
}

/// `uid <N>@<host>` from `/proc` (Linux), with `?` for what it cannot read.
fn uid_at_host() -> String {
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().next().map(str::to_string))
        })
        .unwrap_or_else(|| "?".into());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "?".into());
    format!("uid {uid}@{host}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn without_a_name_it_is_the_uid_at_the_host() {
        let who = super::uid_at_host();
        assert!(who.starts_with("uid ") && who.contains('@'), "{who}");
        assert!(!who.contains("unknown"));
    }
}
