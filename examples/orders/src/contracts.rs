//! The three job contracts of the orders app. Each names its file in
//! `schemas/`, and `#[derive(Job)]` compares the file with the struct while
//! compiling: a field added to one and not the other does not build.

use kjob::Job;
use serde::{Deserialize, Serialize};

/// Mail the order confirmation.
#[derive(Clone, Debug, Serialize, Deserialize, Job)]
#[job(
    name = "orders.confirmation",
    version = 1,
    key = order_id,
    tenant = tenant,
    schema = "../../schemas/orders.confirmation.v1.avsc"
)]
pub struct SendOrderConfirmation {
    /// The order to confirm (a reference; the handler loads the order).
    pub order_id: String,
    /// Tenant of the shop.
    pub tenant: String,
    /// Mail language (`"en"` for records written before it existed).
    pub locale: String,
}

/// Render and store the invoice PDF.
#[derive(Clone, Debug, Serialize, Deserialize, Job)]
#[job(
    name = "orders.invoice_pdf",
    version = 1,
    key = order_id,
    tenant = tenant,
    schema = "../../schemas/orders.invoice_pdf.v1.avsc"
)]
pub struct RenderInvoicePdf {
    /// The order to invoice.
    pub order_id: String,
    /// Tenant of the shop.
    pub tenant: String,
}

/// Push a customer to the CRM.
#[derive(Clone, Debug, Serialize, Deserialize, Job)]
#[job(
    name = "crm.sync",
    version = 1,
    key = customer_id,
    tenant = tenant,
    schema = "../../schemas/crm.sync.v1.avsc"
)]
pub struct SyncCustomerToCrm {
    /// The customer to sync; also the key, so syncs of one customer never race.
    pub customer_id: String,
    /// Tenant of the shop.
    pub tenant: String,
}
