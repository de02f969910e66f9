//! The handlers: plain async functions of (job, context, state). The
//! dependencies come as `State<...>`, registered once on the builder, so
//! a test registers in-memory ones and the worker binary real ones. The
//! handlers only classify failures; kjob decides what that means (retry
//! tier, DLQ). Most of that classification is `?`: the store's
//! `anyhow::Error` takes the class of what it wraps (a PostgreSQL error
//! retries unless its SQLSTATE says the data is wrong), and `MailError` has
//! its own `From` (in `deps.rs`); only "no such order" is said explicitly.

use std::sync::Arc;

use anyhow::Context as _;
use kjob::idempotency::Mark;
use kjob::prelude::*;

use crate::contracts::{RenderInvoice, SendInvoiceMail};
use crate::deps::{InvoiceStore, Mailer};

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
        .context("loading the order")?
        .or_not_found(format!("order {} does not exist", job.order_id))?;
    match store
        .save_invoice_once(&ctx.id, &order)
        .await
        .context("saving the invoice")?
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
    mailer.send(&job.email, &subject).await?;
    Ok(())
}
