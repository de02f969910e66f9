//! # A handler crate
//!
//! The pattern kjob recommends for teams writing jobs:
//!
//! * [`contracts`]: the job types, each with its `schemas/*.avsc` file;
//! * [`deps`]: traits for what handlers need (a mailer, a store);
//! * [`handlers`]: plain async fns of (job, context, `State` dependencies);
//! * [`layers`]: middleware of the crate's own around every attempt, and
//!   [`tx`]: one PostgreSQL transaction per attempt, committed on `Ok`;
//! * [`register`]: one function wiring handlers and retry policy into a
//!   [`WorkerBuilder`], used by the worker binary *and* by the unit tests
//!   (through `kjob::testing::Harness`), so tests run the production wiring;
//! * [`memory`] and [`pg`]: dependency implementations for tests and
//!   production.

pub mod contracts;
pub mod deps;
pub mod handlers;
pub mod layers;
pub mod memory;
pub mod pg;
pub mod tx;

use std::sync::Arc;
use std::time::Duration;

use kjob::retry::RetryPolicy;
use kjob::WorkerBuilder;

use contracts::{RenderInvoice, SendInvoiceMail};
use deps::{InvoiceStore, Mailer};

/// Everything the handlers need.
#[derive(Clone)]
pub struct Deps {
    /// Orders and invoices.
    pub store: Arc<dyn InvoiceStore>,
    /// Outgoing mail.
    pub mailer: Arc<dyn Mailer>,
}

/// The crate's retry policy: mail servers throttle for minutes, not hours.
pub fn retry_policy() -> RetryPolicy {
    RetryPolicy::tiers([
        Duration::from_secs(5),
        Duration::from_secs(30),
        Duration::from_secs(300),
    ])
}

/// Registers this crate's handlers on `builder`, on their main topics.
pub fn register(builder: WorkerBuilder, deps: Deps) -> WorkerBuilder {
    use kjob::Job;
    register_on(builder, deps, RenderInvoice::NAME, SendInvoiceMail::NAME)
}

/// [`register`] on explicit topics (tests use fresh topics per run).
pub fn register_on(
    builder: WorkerBuilder,
    deps: Deps,
    render_topic: &str,
    mail_topic: &str,
) -> WorkerBuilder {
    builder
        .state(deps.store)
        .state(deps.mailer)
        .handle_on(render_topic, handlers::render_invoice)
        .handle_on(mail_topic, handlers::send_invoice_mail)
        // Every attempt is logged with its outcome and duration, by a layer
        // of this crate's own (see `layers.rs`).
        .layer(layers::JobLog)
        .retry(retry_policy())
        .handler_timeout(Duration::from_secs(30))
}

#[cfg(test)]
mod tests {
    //! Unit tests through the harness: no broker, no registry, no waiting.

    use std::sync::Arc;
    use std::time::Duration;

    use kjob::testing::Harness;
    use kjob::{KafkaConfig, Worker};

    use super::*;
    use crate::deps::{MailError, Order};
    use crate::memory::{MemoryMailer, MemoryStore};

    fn harness(store: Arc<MemoryStore>, mailer: Arc<MemoryMailer>) -> Harness {
        let builder = register(
            Worker::builder(KafkaConfig::from_env(), "invoices"),
            Deps { store, mailer },
        );
        Harness::new(builder).expect("harness")
    }

    fn order(id: &str) -> Order {
        Order {
            id: id.into(),
            total_cents: 4200,
        }
    }

    #[tokio::test]
    async fn an_invoice_is_stored_once() {
        let store = Arc::new(MemoryStore::with_orders([order("o-1")]));
        let mut h = harness(store.clone(), Arc::default());
        h.enqueue(&RenderInvoice {
            order_id: "o-1".into(),
            tenant: "shop".into(),
        })
        .unwrap();
        h.run().await;
        assert_eq!(h.handled().len(), 1);
        assert_eq!(
            *store.invoices.lock().unwrap(),
            vec![("o-1".to_string(), 4200)]
        );
    }

    #[tokio::test]
    async fn a_missing_order_is_dead_lettered_without_retries() {
        let mut h = harness(Arc::new(MemoryStore::default()), Arc::default());
        let id = h
            .enqueue(&RenderInvoice {
                order_id: "ghost".into(),
                tenant: "shop".into(),
            })
            .unwrap();
        h.run_until_idle().await;
        assert_eq!(
            h.dead_letter_class(&id),
            Some(kjob::ErrorClass::PermanentNotFound)
        );
        assert!(h.waiting().is_empty());
        assert!(
            h.records("invoices.render.retry.5s").is_empty(),
            "no retry traffic"
        );
    }

    #[tokio::test]
    async fn a_throttling_mail_server_is_retried_through_the_tiers_in_no_time() {
        let mailer = Arc::new(MemoryMailer::failing([
            MailError::Unavailable("421 try later".into()),
            MailError::Unavailable("421 try later".into()),
        ]));
        let mut h = harness(Arc::default(), mailer.clone());
        let started = std::time::Instant::now();
        let id = h
            .enqueue(&SendInvoiceMail {
                order_id: "o-1".into(),
                email: "a@example.com".into(),
            })
            .unwrap();
        h.run().await;
        let waiting = h.waiting();
        assert_eq!(waiting.len(), 1);
        assert_eq!(waiting[0].topic, "invoices.mail.retry.5s");
        assert_eq!(waiting[0].class, "retryable.server");
        h.advance(Duration::from_secs(5)).await;
        assert_eq!(h.waiting()[0].topic, "invoices.mail.retry.30s");
        h.run_until_idle().await;
        assert_eq!(h.handled().len(), 1);
        assert_eq!(h.handled()[0].id, id);
        assert_eq!(h.handled()[0].attempt, 3);
        assert_eq!(
            h.handled()[0].at_ms - kjob::testing::EPOCH_MS,
            35_000,
            "5 s + 30 s of virtual time"
        );
        assert_eq!(mailer.sent.lock().unwrap().len(), 1);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "no real waiting"
        );
    }

    #[tokio::test]
    async fn a_rejected_address_is_dead_lettered_with_its_reason() {
        let mailer = Arc::new(MemoryMailer::failing([MailError::Rejected(
            "550 no such user".into(),
        )]));
        let mut h = harness(Arc::default(), mailer);
        h.enqueue(&SendInvoiceMail {
            order_id: "o-2".into(),
            email: "nobody@example.com".into(),
        })
        .unwrap();
        h.run().await;
        let dead = h.dead_letters();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].class, "permanent.invalid_input");
        assert!(dead[0].error.contains("550"));
        assert_eq!(
            dead[0].headers.original_topic.as_deref(),
            Some("invoices.mail")
        );
    }

    #[tokio::test]
    async fn a_duplicate_delivery_has_its_effect_once() {
        let store = Arc::new(MemoryStore::with_orders([order("o-3")]));
        let mut h = harness(store.clone(), Arc::default());
        h.enqueue(&RenderInvoice {
            order_id: "o-3".into(),
            tenant: "shop".into(),
        })
        .unwrap();
        h.run().await;
        // Re-deliver the very same record (same job id), as after a crash
        // between the effect and the commit.
        let again = h.records("invoices.render")[0].clone();
        h.redeliver(&again).unwrap();
        h.run().await;
        assert_eq!(h.handled().len(), 2, "delivered twice");
        assert_eq!(store.invoices.lock().unwrap().len(), 1, "stored once");
    }
}
