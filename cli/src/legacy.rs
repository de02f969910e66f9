//! Flags that changed meaning, kept working for one release with a warning.
//!
//! `kjob enqueue --json JOB` took the job; `--json` now means JSON output,
//! as everywhere, and the job is `--data JOB`. `kjob enqueue --file FILE`
//! is now `--data-file FILE`. Before clap sees the arguments, the old forms
//! are rewritten to the new ones. `enqueue` has no positional arguments,
//! so a value after `--json` can only be the old form.

use std::ffi::OsString;

/// The arguments with the old `enqueue` forms rewritten, and a warning for
/// each.
pub(crate) fn rewrite(args: Vec<OsString>) -> (Vec<OsString>, Vec<String>) {
    let verb = verb_at(&args);
    let Some(at) = verb.filter(|i| args[*i] == "enqueue") else {
        return (args, Vec::new());
    };
    let mut out: Vec<OsString> = args[..=at].to_vec();
    let mut warnings = Vec::new();
    let mut rest = args[at + 1..].iter().peekable();
    while let Some(arg) = rest.next() {
        let text = arg.to_string_lossy();
        if let Some(value) = text.strip_prefix("--json=") {
            out.push("--data".into());
            out.push(value.into());
            warnings.push(deprecated("--json JOB", "--data JOB"));
        } else if text == "--json"
            && rest
                .peek()
                .is_some_and(|next| !next.to_string_lossy().starts_with("--"))
        {
            out.push("--data".into());
            if let Some(value) = rest.next() {
                out.push(value.clone());
            }
            warnings.push(deprecated("--json JOB", "--data JOB"));
        } else if text == "--file" || text.starts_with("--file=") {
            out.push(text.replacen("--file", "--data-file", 1).into());
            warnings.push(deprecated("--file FILE", "--data-file FILE"));
        } else {
            out.push(arg.clone());
        }
    }
    (out, warnings)
}

/// Where the subcommand is: the first argument that is not a flag or the
/// value of a global flag, by clap's own definition of the CLI (no list of
/// verbs to keep in step: `kjob batches list --topic enqueue` is `batches`).
fn verb_at(args: &[OsString]) -> Option<usize> {
    use clap::CommandFactory as _;
    let cli = crate::Cli::command();
    let takes_value: Vec<String> = cli
        .get_arguments()
        .filter(|a| a.get_action().takes_values())
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect();
    let mut i = 1;
    while i < args.len() {
        let a = args[i].to_string_lossy();
        if !a.starts_with('-') {
            return Some(i);
        }
        // `--timeout 10s`: skip the value too; `--timeout=10s` is one.
        if takes_value.iter().any(|f| *f == a) {
            i += 1;
        }
        i += 1;
    }
    None
}

fn deprecated(old: &str, new: &str) -> String {
    format!(
        "`kjob enqueue {old}` is deprecated and goes in the next release: use `{new}` (--json now selects JSON output, as for every command)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> (Vec<String>, usize) {
        let (out, warnings) = rewrite(args.iter().map(OsString::from).collect());
        (
            out.iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            warnings.len(),
        )
    }

    #[test]
    fn old_enqueue_forms_become_new_ones() {
        assert_eq!(
            run(&["kjob", "enqueue", "--topic", "t", "--json", "{\"a\":1}"]),
            (
                vec!["kjob", "enqueue", "--topic", "t", "--data", "{\"a\":1}"]
                    .into_iter()
                    .map(String::from)
                    .collect(),
                1
            )
        );
        assert_eq!(
            run(&["kjob", "--timeout", "5s", "enqueue", "--json", "{}"]).1,
            1,
            "after a global flag's value"
        );
        assert_eq!(
            run(&["kjob", "enqueue", "--json={}", "--file", "-"]).0,
            vec!["kjob", "enqueue", "--data", "{}", "--data-file", "-"]
        );
        // The new meaning: --json before another flag, or last.
        for args in [
            vec!["kjob", "enqueue", "--json", "--topic", "t", "--data", "{}"],
            vec!["kjob", "enqueue", "--topic", "t", "--data", "{}", "--json"],
            vec!["kjob", "dlq", "list", "--json", "--topic", "t"],
            vec!["kjob", "status", "--topic", "enqueue", "--json", "x"],
            // A verb missing from the old hidden list, with a value that
            // names `enqueue`.
            vec![
                "kjob", "batches", "list", "--topic", "enqueue", "--json", "x",
            ],
            vec![
                "kjob",
                "--bootstrap-server",
                "enqueue",
                "waiting",
                "--json",
                "x",
            ],
        ] {
            assert_eq!(
                run(&args),
                (args.iter().map(|s| s.to_string()).collect(), 0)
            );
        }
    }
}
