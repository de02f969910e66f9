//! Every isolation promise in one table: runs each flood bench in turn and
//! puts the isolated class's p99 beside its p99 alone and the bound
//! (2 × alone + 20 ms).
//!
//! ```bash
//! ./dev stack wipe && ./dev stack up && cargo build --release -p kjob-benches --bins
//! target/release/floods
//! ```
//!
//! The scenarios, each its own binary next to this one (their own tables
//! are in `benches/RESULTS.md`):
//!
//! | scenario | binary and flags |
//! |---|---|
//! | a tenant flood | `fairness --flood 100000 --secs 10 --concurrency 32` |
//! | a priority bulk flood | `priority --burst 1 --secs 10` |
//! | a retry flood in a shared tier | `retry_tiers --flood 50000 --flood-only` |
//! | a delay flood beside short delays | `delays` |
//! | a registry outage beside cached-schema jobs | `isolation` |
//!
//! Each prints its row as a `FLOOD` line ([`kjob_benches::flood_row`]);
//! a binary that fails, or prints none, is listed as not measured.

use std::process::Command;

use anyhow::Context as _;

const SCENARIOS: [(&str, &[&str]); 5] = [
    (
        "fairness",
        &["--flood", "100000", "--secs", "10", "--concurrency", "32"],
    ),
    ("priority", &["--burst", "1", "--secs", "10"]),
    ("retry_tiers", &["--flood", "50000", "--flood-only"]),
    ("delays", &[]),
    ("isolation", &[]),
];

fn main() -> anyhow::Result<()> {
    let here = std::env::current_exe().context("where this binary is")?;
    let dir = here
        .parent()
        .context("the directory of this binary")?
        .to_path_buf();
    let only = std::env::args().nth(1);
    let mut rows = Vec::new();
    for (bin, args) in SCENARIOS {
        if only.as_deref().is_some_and(|o| o != bin) {
            continue;
        }
        eprintln!("floods: running {bin} {}", args.join(" "));
        let out = Command::new(dir.join(bin))
            .args(args)
            .output()
            .with_context(|| {
                format!(
                    "running {bin}: build it first (cargo build --release -p kjob-benches --bins)"
                )
            })?;
        let text = String::from_utf8_lossy(&out.stdout);
        let found: Vec<&str> = text.lines().filter(|l| l.starts_with("FLOOD\t")).collect();
        if !out.status.success() || found.is_empty() {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err.lines().last().unwrap_or("no output");
            rows.push(format!(
                "| {bin} | | not measured ({}: {last}) | | | |",
                out.status
            ));
            continue;
        }
        for line in found {
            rows.push(row(line));
        }
    }
    println!("| scenario | isolated class | p99 alone | p99 during the flood | bound (2 × alone + 20 ms) | within |");
    println!("|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    Ok(())
}

/// One table row from a `FLOOD` line.
fn row(line: &str) -> String {
    let f: Vec<&str> = line.split('\t').collect();
    let ms = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    match (f.get(1), f.get(2), ms(3), ms(4)) {
        (Some(scenario), Some(class), Some(alone), Some(during)) => {
            let bound = 2.0 * alone + 20.0;
            format!(
                "| {scenario} | {class} | {alone:.1} ms | {during:.1} ms | {bound:.1} ms | {} |",
                if during <= bound { "yes" } else { "**no**" }
            )
        }
        _ => format!("| unreadable line: `{line}` | | | | | |"),
    }
}
