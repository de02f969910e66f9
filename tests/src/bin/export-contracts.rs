//! A program that knows contracts, for `kjob schema export --from` in
//! tests/tests/schema_export.rs: the handler-crate example's list, served
//! the way its worker binary serves it. Without `KJOB_SCHEMA_EXPORT` it
//! prints a line that is not a contract list and exits 0 (what a program
//! that never calls `serve` looks like to the CLI).

use kjob_example_handler_crate::contracts::CONTRACTS;

fn main() {
    if kjob::schema::export::serve(CONTRACTS) {
        return;
    }
    println!("not asked for contracts");
}
