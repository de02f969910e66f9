//! The README stays what the issue asked for: its hello program is
//! `examples/hello/src/main.rs` byte for byte (the example is built and run
//! by `cargo test`, so the README's program is too), it is at most 250
//! lines, and its Quickstart is the two commands. `scripts/check-book`
//! checks the same in `./dev check`; `scripts/readme-quickstart` builds the
//! README's blocks as a crate of their own in `./dev test`.

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
