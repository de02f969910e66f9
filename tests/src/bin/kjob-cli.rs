//! The `kjob` CLI built inside the test package, so the CLI tests can run
//! the real command (`CARGO_BIN_EXE_kjob-cli`) as an operator would.

fn main() -> std::process::ExitCode {
    kjob_cli::main()
}
