//! `kjob schema export`: the CLI runs a program that serves its contracts
//! and writes, or in `--check` mode compares, `<dir>/<name>.v<N>.avsc`.
//! Needs no stack.

use std::path::{Path, PathBuf};
use std::process::Command;

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn kjob(args: &[&str]) -> Out {
    let out = Command::new(env!("CARGO_BIN_EXE_kjob-cli"))
        .args(args)
        .output()
        .expect("running kjob");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn export(dir: &Path, extra: &[&str]) -> Out {
    let dir = dir.to_str().expect("utf-8 temp dir");
    let mut args = vec!["schema", "export", "--dir", dir];
    args.extend_from_slice(extra);
    args.extend(["--from", env!("CARGO_BIN_EXE_export-contracts")]);
    kjob(&args)
}

fn temp_dir() -> PathBuf {
    std::env::temp_dir().join(format!(
        "kjob-schema-export-{}",
        uuid::Uuid::new_v4().simple()
    ))
}

#[test]
fn export_writes_checks_and_leaves_other_files_alone() {
    let dir = temp_dir();
    let check = export(&dir, &["--check"]);
    assert_eq!(check.code, 1, "{}{}", check.stdout, check.stderr);
    assert!(check.stdout.contains("MISSING"), "{}", check.stdout);
    assert!(!dir.exists(), "--check writes nothing");

    let first = export(&dir, &[]);
    assert_eq!(first.code, 0, "{}{}", first.stdout, first.stderr);
    assert_eq!(
        first.stdout.matches("created").count(),
        2,
        "{}",
        first.stdout
    );
    // What the CLI wrote is what the repository holds (the handler crate's
    // own test keeps schemas/ current).
    for name in ["invoices.render.v1.avsc", "invoices.mail.v1.avsc"] {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../schemas")
            .join(name);
        assert_eq!(
            std::fs::read_to_string(dir.join(name)).expect("exported"),
            std::fs::read_to_string(repo).expect("in the repository"),
            "{name}"
        );
    }

    std::fs::write(dir.join("invoices.mail.v1.avsc"), "{}").expect("write");
    std::fs::write(dir.join("invoices.mail.v0.avsc"), "history").expect("write");
    let stale = export(&dir, &["--check"]);
    assert_eq!(stale.code, 1);
    assert!(
        stale.stdout.contains("DIFFERS") && stale.stdout.contains("invoices.mail.v1.avsc"),
        "{}",
        stale.stdout
    );
    assert!(
        stale.stderr.contains("behind the compiled contracts"),
        "{}",
        stale.stderr
    );

    let again = export(&dir, &[]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert!(again.stdout.contains("updated"), "{}", again.stdout);
    assert!(again.stdout.contains("unchanged"), "{}", again.stdout);
    assert_eq!(
        std::fs::read_to_string(dir.join("invoices.mail.v0.avsc")).expect("kept"),
        "history"
    );
    assert_eq!(export(&dir, &["--check"]).code, 0);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_program_that_does_not_serve_contracts_is_refused_with_the_fix() {
    let dir = temp_dir();
    let dir_arg = dir.to_str().expect("utf-8 temp dir");
    let missing = kjob(&["schema", "export", "--dir", dir_arg, "--from", "true"]);
    assert_eq!(missing.code, 1);
    assert!(
        missing.stderr.contains("kjob::schema::export::serve"),
        "{}",
        missing.stderr
    );
    assert!(!dir.exists());
}
