//! The `kjob` operator CLI. All logic lives in the `kjob_cli` library so
//! the integration tests run the same code.

fn main() -> std::process::ExitCode {
    kjob_cli::main()
}
