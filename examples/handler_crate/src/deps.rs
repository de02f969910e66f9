//! What the handlers need from the outside world, as traits, so tests can
//! inject in-memory versions and the worker binary real ones.

use futures::future::BoxFuture;
use kjob::idempotency::Mark;

/// An order as the invoice needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Order {
    /// Order id.
    pub id: String,
    /// Total in cents.
    pub total_cents: i64,
}

/// Why a mail was not sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MailError {
    /// The mail server is down or throttling: try again later.
    Unavailable(String),
    /// The address is rejected: retrying will not help.
    Rejected(String),
}

/// The classification of a mail failure, written once, so handlers can use
/// `?`: a throttling server is retried, a rejected address dead-lettered.
impl From<MailError> for kjob::JobError {
    fn from(e: MailError) -> Self {
        match e {
            MailError::Unavailable(why) => kjob::JobError::server(format!("mail server: {why}")),
            MailError::Rejected(why) => {
                kjob::JobError::invalid_input(format!("address rejected: {why}"))
            }
        }
    }
}

/// Sends mail.
pub trait Mailer: Send + Sync + 'static {
    /// Sends one mail.
    fn send(&self, to: &str, subject: &str) -> BoxFuture<'_, Result<(), MailError>>;
}

/// Orders and invoices.
pub trait InvoiceStore: Send + Sync + 'static {
    /// Loads an order.
    fn order(&self, id: &str) -> BoxFuture<'_, anyhow::Result<Option<Order>>>;
    /// Stores the invoice of `order` unless job `job_id` already did: the
    /// marker and the invoice are written together, or not at all.
    fn save_invoice_once(&self, job_id: &str, order: &Order)
        -> BoxFuture<'_, anyhow::Result<Mark>>;
}
