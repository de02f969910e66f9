//! The crate's job contracts, one `.avsc` file each in `schemas/`.

use apache_avro::AvroSchema;
use kjob::Job;
use serde::{Deserialize, Serialize};

/// Render and store an order's invoice.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, AvroSchema)]
#[avro(namespace = "kjob.examples.invoices")]
pub struct RenderInvoice {
    /// The order (a reference: the handler loads it).
    pub order_id: String,
    /// The shop.
    pub tenant: String,
}

impl Job for RenderInvoice {
    const NAME: &'static str = "invoices.render";
    const VERSION: u32 = 1;
    const SCHEMA: &'static str = include_str!("../../../schemas/invoices.render.v1.avsc");
    fn key(&self) -> String {
        self.order_id.clone()
    }
    fn tenant(&self) -> Option<String> {
        Some(self.tenant.clone())
    }
}

/// Mail the invoice.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, AvroSchema)]
#[avro(namespace = "kjob.examples.invoices")]
pub struct SendInvoiceMail {
    /// The order.
    pub order_id: String,
    /// Where to send it.
    pub email: String,
}

impl Job for SendInvoiceMail {
    const NAME: &'static str = "invoices.mail";
    const VERSION: u32 = 1;
    const SCHEMA: &'static str = include_str!("../../../schemas/invoices.mail.v1.avsc");
    fn key(&self) -> String {
        self.order_id.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_files_match_the_rust_types() {
        for (file, derived) in [
            (RenderInvoice::SCHEMA, RenderInvoice::get_schema()),
            (SendInvoiceMail::SCHEMA, SendInvoiceMail::get_schema()),
        ] {
            let parsed = apache_avro::Schema::parse_str(file).expect("schema parses");
            assert_eq!(parsed.canonical_form(), derived.canonical_form());
        }
    }
}
