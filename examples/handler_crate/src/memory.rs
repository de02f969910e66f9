//! In-memory dependencies for unit tests (and for trying the crate without
//! a database).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use futures::future::BoxFuture;
use kjob::idempotency::{Mark, MemoryMarkers};

use crate::deps::{InvoiceStore, MailError, Mailer, Order};

/// A mailer that records what it sent and fails as scripted.
#[derive(Default)]
pub struct MemoryMailer {
    /// Outcomes to return, in order, before succeeding.
    pub script: Mutex<VecDeque<MailError>>,
    /// Mails sent: (to, subject).
    pub sent: Mutex<Vec<(String, String)>>,
}

impl MemoryMailer {
    /// Fails the next calls with these errors, then succeeds.
    pub fn failing(errors: impl IntoIterator<Item = MailError>) -> Self {
        Self {
            script: Mutex::new(errors.into_iter().collect()),
            sent: Mutex::default(),
        }
    }
}

impl Mailer for MemoryMailer {
    fn send(&self, to: &str, subject: &str) -> BoxFuture<'_, Result<(), MailError>> {
        let next = self
            .script
            .lock()
            .map(|mut s| s.pop_front())
            .unwrap_or(None);
        let (to, subject) = (to.to_string(), subject.to_string());
        Box::pin(async move {
            if let Some(e) = next {
                return Err(e);
            }
            if let Ok(mut sent) = self.sent.lock() {
                sent.push((to, subject));
            }
            Ok(())
        })
    }
}

/// Orders and invoices in memory, with processed markers.
#[derive(Default)]
pub struct MemoryStore {
    /// Known orders.
    pub orders: Mutex<HashMap<String, Order>>,
    /// Stored invoices: order id -> total.
    pub invoices: Mutex<Vec<(String, i64)>>,
    /// Processed markers (job ids).
    pub markers: MemoryMarkers,
}

impl MemoryStore {
    /// A store knowing these orders.
    pub fn with_orders(orders: impl IntoIterator<Item = Order>) -> Self {
        let store = Self::default();
        if let Ok(mut o) = store.orders.lock() {
            for order in orders {
                o.insert(order.id.clone(), order);
            }
        }
        store
    }
}

impl InvoiceStore for MemoryStore {
    fn order(&self, id: &str) -> BoxFuture<'_, anyhow::Result<Option<Order>>> {
        let found = self.orders.lock().ok().and_then(|o| o.get(id).cloned());
        Box::pin(async move { Ok(found) })
    }

    fn save_invoice_once(
        &self,
        job_id: &str,
        order: &Order,
    ) -> BoxFuture<'_, anyhow::Result<Mark>> {
        let mark = self.markers.mark(job_id);
        if mark == Mark::First {
            if let Ok(mut inv) = self.invoices.lock() {
                inv.push((order.id.clone(), order.total_cents));
            }
        }
        Box::pin(async move { Ok(mark) })
    }
}
