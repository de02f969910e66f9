//! The `kjob` operator CLI. All logic lives in [`kjob::cli`] so it is tested
//! like the rest of the library.

fn main() -> std::process::ExitCode {
    kjob::cli::main()
}
