//! The crate's job contracts. `#[derive(Job)]` writes each schema from the
//! struct; [`CONTRACTS`] lists them so that `kjob schema export` (through
//! the worker binary) and the test below keep `schemas/` in step with the
//! types, and a pull request that changes a contract shows it in a `.avsc`
//! diff.

use kjob::schema::export::Contract;
use kjob::Job;
use serde::{Deserialize, Serialize};

/// Render and store the invoice of an order (once, however often it is delivered).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Job)]
#[job(
    name = "invoices.render",
    version = 1,
    key = order_id,
    tenant = tenant,
    namespace = "kjob.examples.invoices"
)]
pub struct RenderInvoice {
    /// The order (a reference: the handler loads it).
    pub order_id: String,
    /// The shop.
    pub tenant: String,
}

/// Mail the rendered invoice to the customer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Job)]
#[job(
    name = "invoices.mail",
    version = 1,
    key = order_id,
    namespace = "kjob.examples.invoices"
)]
pub struct SendInvoiceMail {
    /// The order.
    pub order_id: String,
    /// Where to send it.
    pub email: String,
}

/// Every contract of this crate, for `kjob schema export`.
pub const CONTRACTS: &[Contract] = &[
    Contract::of::<RenderInvoice>(),
    Contract::of::<SendInvoiceMail>(),
];

#[cfg(test)]
mod tests {
    use super::*;
    use kjob::schema::export::{export, stale, Mode};

    /// `schemas/` holds what the types compile to. When this fails after a
    /// change to a contract, run
    /// `kjob schema export --from cargo -- run -q -p kjob-example-handler-crate`
    /// (from the repository root) and commit the `.avsc` diff with the change.
    #[test]
    fn schemas_dir_is_up_to_date() -> kjob::Result<()> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas");
        let report = export(&dir, CONTRACTS, Mode::Check)?;
        let behind: Vec<_> = stale(&report)
            .map(|e| e.path.display().to_string())
            .collect();
        assert!(behind.is_empty(), "not exported: {behind:?}");
        Ok(())
    }
}
