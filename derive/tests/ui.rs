//! The compile errors of `#[derive(Job)]`, each with its expected message
//! (`ui/*.stderr`). Regenerate after a deliberate wording change with
//! `TRYBUILD=overwrite cargo test -p kjob-derive --test ui` and review the
//! diff.

use std::path::PathBuf;

/// trybuild compiles the cases in a project of its own under
/// `<target>/tests/trybuild/kjob-derive`, and that project's directory is
/// their `CARGO_MANIFEST_DIR`: the schema files the cases name are copied
/// there, so `schema = "schemas/..."` resolves as it would in a user's crate.
fn copy_schemas() -> Result<(), String> {
    let out = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .map_err(|e| format!("cargo metadata: {e}"))?;
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo metadata output: {e}"))?;
    let target = meta["target_directory"]
        .as_str()
        .ok_or("cargo metadata has no target_directory")?;
    let dest = PathBuf::from(target).join("tests/trybuild/kjob-derive/schemas");
    std::fs::create_dir_all(&dest).map_err(|e| format!("{}: {e}", dest.display()))?;
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/ui/schemas");
    for entry in std::fs::read_dir(&src).map_err(|e| format!("{}: {e}", src.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if let Some(name) = path.file_name() {
            std::fs::copy(&path, dest.join(name))
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    Ok(())
}

#[test]
fn compile_errors() {
    if let Err(e) = copy_schemas() {
        panic!("preparing the schema files: {e}");
    }
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
