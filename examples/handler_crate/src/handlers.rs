//! The handlers: plain async functions of (job, context, state). The
//! dependencies come as `State<...>`, registered once on the builder, so
//! a test registers in-memory ones and the worker binary real ones. The
//! handlers only classify failures; kjob decides what that means (retry
//! tier, DLQ).

use std::sync::Arc;

use kjob::idempotency::Mark;
use kjob::{JobContext, JobError, State};

use crate::contracts::{RenderInvoice, SendInvoiceMail};
use crate::deps::{InvoiceStore, MailError, Mailer};

/// Renders and stores the invoice, exactly once per job even if the job is
/// delivered twice (the marker is the job id).
pub async fn render_invoice(
    job: RenderInvoice,
    ctx: JobContext,
    State(store): State<Arc<dyn InvoiceStore>>,
) -> Result<(), JobError> {
    let order = store
        .order(&job.order_id)
        .await
        .map_err(|e| JobError::network(format!("loading order: {e}")))?
        .ok_or_else(|| JobError::not_found(format!("order {} does not exist", job.order_id)))?;
    match store
        .save_invoice_once(&ctx.id, &order)
        .await
        .map_err(|e| JobError::network(format!("saving invoice: {e}")))?
    {
        Mark::First => tracing::info!(order = %order.id, "invoice stored"),
        Mark::Duplicate => {
            tracing::info!(order = %order.id, "duplicate delivery; invoice already stored")
        }
    }
    Ok(())
}

/// Mails the invoice; a throttling mail server is retried, a rejected
/// address is dead-lettered.
pub async fn send_invoice_mail(
    job: SendInvoiceMail,
    _ctx: JobContext,
    State(mailer): State<Arc<dyn Mailer>>,
) -> Result<(), JobError> {
    let subject = format!("Your invoice for order {}", job.order_id);
    mailer
        .send(&job.email, &subject)
        .await
        .map_err(|e| match e {
            MailError::Unavailable(why) => JobError::server(format!("mail server: {why}")),
            MailError::Rejected(why) => JobError::invalid_input(format!("address rejected: {why}")),
        })
}
