//! Everything kjob prints to stdout goes through [`outln!`] (and [`json`]):
//! a write error, above all a closed pipe, is returned instead of
//! panicking as `println!` does, and `main` ends quietly on it.

use anyhow::Result;
use serde::Serialize;

use kjob_ops::terminal::json_for_terminal;

/// `--output`: tables for people, JSON for scripts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Tables and sentences.
    Table,
    /// One JSON value per result, with named fields.
    Json,
}

/// `writeln!` to stdout, returning the `io::Result`.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}
pub(crate) use outln;

/// `write!` to stdout (no newline) and a flush, returning the `io::Result`.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        write!(stdout, $($arg)*).and_then(|()| stdout.flush())
    }};
}
pub(crate) use out;

/// Prints `value` as one line of JSON, safe for a terminal (see
/// [`json_for_terminal`]): values taken from records keep their exact
/// content, escaped.
pub(crate) fn json(value: &impl Serialize) -> Result<()> {
    outln!("{}", json_for_terminal(&serde_json::to_string(value)?))?;
    Ok(())
}
