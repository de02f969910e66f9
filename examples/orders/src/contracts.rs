//! The three job contracts of the orders app. Each mirrors a file in
//! `schemas/`; the test at the bottom keeps Rust type and `.avsc` in step.

use apache_avro::AvroSchema;
use kjob::Job;
use serde::{Deserialize, Serialize};

/// Mail the order confirmation.
#[derive(Clone, Debug, Serialize, Deserialize, AvroSchema)]
#[avro(namespace = "kjob.examples.orders")]
pub struct SendOrderConfirmation {
    /// The order to confirm (a reference; the handler loads the order).
    pub order_id: String,
    /// Tenant of the shop.
    pub tenant: String,
    /// Mail language.
    pub locale: String,
}

impl Job for SendOrderConfirmation {
    const NAME: &'static str = "orders.confirmation";
    const VERSION: u32 = 1;
    const SCHEMA: &'static str = include_str!("../../../schemas/orders.confirmation.v1.avsc");
    fn key(&self) -> String {
        self.order_id.clone()
    }
    fn tenant(&self) -> Option<String> {
        Some(self.tenant.clone())
    }
}

/// Render and store the invoice PDF.
#[derive(Clone, Debug, Serialize, Deserialize, AvroSchema)]
#[avro(namespace = "kjob.examples.orders")]
pub struct RenderInvoicePdf {
    /// The order to invoice.
    pub order_id: String,
    /// Tenant of the shop.
    pub tenant: String,
}

impl Job for RenderInvoicePdf {
    const NAME: &'static str = "orders.invoice_pdf";
    const VERSION: u32 = 1;
    const SCHEMA: &'static str = include_str!("../../../schemas/orders.invoice_pdf.v1.avsc");
    fn key(&self) -> String {
        self.order_id.clone()
    }
    fn tenant(&self) -> Option<String> {
        Some(self.tenant.clone())
    }
}

/// Push a customer to the CRM.
#[derive(Clone, Debug, Serialize, Deserialize, AvroSchema)]
#[avro(namespace = "kjob.examples.crm")]
pub struct SyncCustomerToCrm {
    /// The customer to sync; also the key, so syncs of one customer never race.
    pub customer_id: String,
    /// Tenant of the shop.
    pub tenant: String,
}

impl Job for SyncCustomerToCrm {
    const NAME: &'static str = "crm.sync";
    const VERSION: u32 = 1;
    const SCHEMA: &'static str = include_str!("../../../schemas/crm.sync.v1.avsc");
    fn key(&self) -> String {
        self.customer_id.clone()
    }
    fn tenant(&self) -> Option<String> {
        Some(self.tenant.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apache_avro::Schema;

    fn same<J: Job + AvroSchema>() {
        let file = Schema::parse_str(J::SCHEMA).expect("schema file parses");
        assert_eq!(
            file.canonical_form(),
            J::get_schema().canonical_form(),
            "{}",
            J::NAME
        );
    }

    #[test]
    fn schema_files_match_the_rust_types() {
        same::<SendOrderConfirmation>();
        same::<RenderInvoicePdf>();
        same::<SyncCustomerToCrm>();
    }
}
