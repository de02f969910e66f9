//! Exit codes, and how an error reaches the operator: one line on stderr
//! (made safe for the terminal), and the code of its kind
//! ([`kjob_ops::problem::Kind`]). A closed stdout (`kjob ... | head -1`)
//! is not an error: kjob stops quietly with 0.

use std::process::ExitCode;

use kjob_ops::problem::{kind_of, Kind};
use kjob_ops::terminal::{for_terminal, LINE_WIDTH};

/// Failed, or refused by Kafka or the registry.
pub(crate) const FAILED: u8 = 1;
/// The flags or their values are wrong (clap's own code too).
pub(crate) const USAGE: u8 = 2;
/// Something named does not exist.
pub(crate) const NOT_FOUND: u8 = 3;
/// Kafka or the registry did not answer.
pub(crate) const UNREACHABLE: u8 = 4;

/// The end of `kjob --help`: the exit codes, and where settings come from.
pub(crate) const AFTER_HELP: &str = "\
EXIT CODES:
  0  success (a dry run included); also when stdout is closed early (| head)
  1  failed, or refused: an incompatible schema, an ACL, a group with live
     members, a job that does not fit its schema
  2  usage: a flag or its value is wrong (an unknown error class, a
     malformed duration, an unknown librdkafka property)
  3  not found: a group, topic, DLQ, dead letter or file that does not exist
  4  unreachable: Kafka or the schema registry did not answer (connection
     refused, DNS, timeout)

SETTINGS: flags win over KJOB_* variables, which win over KJOB_KAFKA_<PROPERTY>
variables (KJOB_KAFKA_CLIENT_RACK=r1 is client.rack=r1), which win over the
--command-config file. See docs/src/cli.md.";

/// The exit code of an error's kind.
pub(crate) fn code(kind: Kind) -> u8 {
    match kind {
        Kind::Usage => USAGE,
        Kind::NotFound => NOT_FOUND,
        Kind::Unreachable => UNREACHABLE,
        Kind::Refused | Kind::Failed => FAILED,
    }
}

/// Whether `e` is stdout closing under kjob (a reader that stopped).
pub(crate) fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Prints `e` (unless it is a closed pipe) and returns its exit code.
pub(crate) fn report(e: &anyhow::Error) -> ExitCode {
    if is_broken_pipe(e) {
        return ExitCode::SUCCESS;
    }
    // Errors can quote records (an audit entry's operator, a registry's or
    // broker's words): made safe line by line, so a message of several
    // lines keeps them.
    let text = format!("{e:#}");
    let safe: Vec<String> = text.lines().map(|l| for_terminal(l, LINE_WIDTH)).collect();
    eprintln!("error: {}", safe.join("\n"));
    ExitCode::from(code(kind_of(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_have_distinct_codes_and_a_closed_pipe_is_quiet() {
        let codes = [
            code(Kind::Usage),
            code(Kind::NotFound),
            code(Kind::Unreachable),
            code(Kind::Refused),
        ];
        assert_eq!(codes, [2, 3, 4, 1]);
        let pipe = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
            .context("printing the table");
        assert!(is_broken_pipe(&pipe));
        assert!(!is_broken_pipe(&anyhow::anyhow!("other")));
    }
}
