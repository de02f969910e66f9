//! `--model FILE`: a worker's deployment model, as `KJOB_DESCRIBE=json
//! ./worker` writes it. One reader for every command that takes the flag
//! (`kjob acls`, `kjob topics list`, `kjob schema check | register`), so a
//! missing or garbage file gets the same usage error, naming the fix.

use std::path::Path;

use anyhow::{anyhow, Result};

use kjob::deployment::Deployment;
use kjob_ops::problem::Problem;

/// Reads and parses the model at `path`; a usage error (exit 2) otherwise.
pub(crate) fn load(path: &Path) -> Result<Deployment> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        anyhow!(Problem::usage(format!(
            "--model {}: {e}; write one with `KJOB_DESCRIBE=json ./your-worker > model.json`",
            path.display()
        )))
    })?;
    Deployment::from_json(&text).map_err(|e| anyhow!(Problem::usage(e.to_string())))
}
