//! The README stays what the issue asked for: its hello program is
//! `examples/hello/src/main.rs` byte for byte (the example is built and run
//! by `cargo test`, so the README's program is too), it is at most 250
//! lines, and its Quickstart is the two commands. `scripts/check-book`
//! checks the same in `./dev check`; `scripts/readme-quickstart` builds the
//! README's blocks as a crate of their own in `./dev test`. The settings
//! chapter has a row for every public `WorkerBuilder` method and every
//! environment variable declared in `kjob::settings::VARIABLES`, which in
//! turn declares every `"KJOB_..."` name the crates' code reads.

use std::path::Path;

fn repo_file(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// The body of the fenced block that follows `marker`.
fn block_after<'a>(text: &'a str, marker: &str) -> Option<&'a str> {
    let rest = &text[text.find(marker)? + marker.len()..];
    let rest = rest.strip_prefix('\n')?;
    let body = &rest[rest.find('\n')? + 1..];
    Some(&body[..body.find("\n```")? + 1])
}

#[test]
fn the_readme_shows_examples_hello_verbatim() {
    let readme = repo_file("README.md");
    let shown = block_after(&readme, "<!-- readme-quickstart: src/main.rs -->")
        .expect("README.md has a block after <!-- readme-quickstart: src/main.rs -->");
    let file = repo_file("examples/hello/src/main.rs");
    assert!(
        shown == file,
        "README.md's hello program differs from examples/hello/src/main.rs; copy the file into the README"
    );
}

#[test]
fn the_readme_is_short_and_starts_with_the_quickstart_commands() {
    let readme = repo_file("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines; the limit is 250"
    );
    let quick = readme
        .split("\n## Quickstart\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("a ## Quickstart section");
    assert_eq!(
        quick.matches("```").count(),
        2,
        "one code block in the Quickstart"
    );
    assert!(
        quick.contains("```bash\n./dev demo\n./dev test\n```"),
        "{quick}"
    );
}

/// The public methods of every `impl WorkerBuilder` block in the worker's
/// sources, folders included (a block ends at the first `}` in column 0).
fn builder_methods() -> Vec<String> {
    fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for path in std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
        {
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path);
            }
        }
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../framework/src/worker");
    let mut out = Vec::new();
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let mut inside = false;
        for line in text.lines() {
            if line.starts_with("impl WorkerBuilder") {
                inside = true;
            } else if inside && line.starts_with('}') {
                inside = false;
            } else if inside {
                if let Some(rest) = line.trim_start().strip_prefix("pub fn ") {
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    out.push(name);
                }
            }
        }
    }
    out
}

/// Every public `WorkerBuilder` method has a row in the settings chapter
/// (`build` and `group` set nothing).
#[test]
fn the_settings_chapter_has_a_row_for_every_builder_method() {
    let book = repo_file("docs/src/settings.md");
    let methods = builder_methods();
    assert!(methods.len() > 30, "found {methods:?}");
    let missing: Vec<&String> = methods
        .iter()
        .filter(|m| !matches!(m.as_str(), "build" | "group"))
        .filter(|m| !book.contains(&format!("`.{m}(")) && !book.contains(&format!("`.{m}::<")))
        .collect();
    assert!(
        missing.is_empty(),
        "WorkerBuilder methods without a row in docs/src/settings.md: {missing:?}"
    );
}

/// The failure path's table of error classes lists exactly
/// `ErrorClass::ALL`: a class added to the code without a row, or a row
/// left for a class removed, fails.
#[test]
fn the_failure_path_lists_every_error_class() {
    let book = repo_file("docs/src/failure-path.md");
    let marker = "| class | retried | what it means |";
    let table = &book[book.find(marker).expect("the error classes table") + marker.len()..];
    let rows: std::collections::BTreeSet<String> = table
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.strip_prefix("| `")?.split('`').next().map(String::from))
        .collect();
    let all: std::collections::BTreeSet<String> = kjob::ErrorClass::ALL
        .iter()
        .map(|c| c.as_str().to_string())
        .collect();
    assert_eq!(rows, all, "docs/src/failure-path.md's classes");
}

/// `"KJOB_..."` literals in the non-test code of a crate's `src/` (a file
/// named `tests.rs`, and what follows `#[cfg(test)]`, are tests).
fn variables_in(dir: &Path, out: &mut std::collections::BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap().filter_map(|e| e.ok()) {
        let path = entry.path();
        if path.is_dir() {
            variables_in(&path, out);
            continue;
        }
        if path.extension().is_none_or(|x| x != "rs") || path.ends_with("tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for part in code.split("\"KJOB_").skip(1) {
            let name: String = part
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if part[name.len()..].starts_with('"') {
                out.insert(format!("KJOB_{name}"));
            }
        }
    }
}

/// Every environment variable kjob's crates read is declared in
/// `kjob::settings::VARIABLES`, and every declared one has a row in the
/// settings chapter.
#[test]
fn every_variable_is_declared_once_and_in_the_settings_chapter() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = std::collections::BTreeSet::new();
    for krate in ["framework/src", "ops/src", "cli/src"] {
        variables_in(&root.join(krate), &mut found);
    }
    assert!(found.contains("KJOB_BOOTSTRAP_SERVERS"), "{found:?}");
    let declared: Vec<&str> = kjob::settings::VARIABLES.iter().map(|v| v.name).collect();
    let undeclared: Vec<&String> = found
        .iter()
        .filter(|f| !declared.contains(&f.as_str()))
        .collect();
    assert!(
        undeclared.is_empty(),
        "read but not declared in kjob::settings::VARIABLES: {undeclared:?}"
    );
    let book = repo_file("docs/src/settings.md");
    let table = book
        .split("## Environment variables")
        .nth(1)
        .expect("the chapter's variables section");
    let unlisted: Vec<&&str> = declared
        .iter()
        .filter(|v| {
            let shown = match v.strip_suffix('_') {
                Some(prefix) => format!("`{prefix}_<"),
                None => format!("`{v}`"),
            };
            !table.contains(&shown)
        })
        .collect();
    assert!(
        unlisted.is_empty(),
        "declared but without a row in docs/src/settings.md: {unlisted:?}"
    );
}
