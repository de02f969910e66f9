//! Job contracts and the context a handler receives.
//!
//! A [`Job`] is a *contract* between the code that enqueues work and the code
//! that runs it, possibly deployed at different versions at the same time.
//! That is why it carries a stable name, an explicit version and an Avro
//! schema kept in `schemas/<name>.v<N>.avsc`: the schema, not the Rust type,
//! is what old and new binaries agree on.

use serde::{de::DeserializeOwned, Serialize};

/// A job contract.
///
/// Usually derived: `#[derive(Job)]` (re-exported from the `kjob-derive`
/// crate, like serde's derives) reads the name, version, key and tenant
/// from `#[job(...)]` and writes [`Job::SCHEMA`] from the field types at
/// compile time, or takes it from a `.avsc` file (`schema = "..."`) and
/// checks the file against the fields. See [`derive@crate::Job`] for the settings
/// and the type mapping.
///
/// ```
/// use kjob::Job;
/// use serde::{Deserialize, Serialize};
///
/// /// Send the order confirmation mail.
/// #[derive(Serialize, Deserialize, Job)]
/// #[job(name = "orders.confirmation", version = 1, key = order_id, tenant = tenant)]
/// struct SendOrderConfirmation { order_id: String, tenant: String }
///
/// let job = SendOrderConfirmation { order_id: "o-1".into(), tenant: "shop".into() };
/// assert_eq!(job.key(), "o-1");
/// assert_eq!(job.tenant().as_deref(), Some("shop"));
/// assert!(SendOrderConfirmation::SCHEMA.contains(r#"{"name": "order_id", "type": "string"}"#));
/// ```
///
/// Written by hand, for what the derive does not cover (a key computed
/// from several fields, serde attributes that reshape the record):
///
/// ```
/// use kjob::Job;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct SendOrderConfirmation { order_id: String, tenant: String }
///
/// impl Job for SendOrderConfirmation {
///     const NAME: &'static str = "orders.confirmation";
///     const VERSION: u32 = 1;
///     const SCHEMA: &'static str = r#"{"type":"record","name":"SendOrderConfirmation",
///         "namespace":"kjob.orders","fields":[
///         {"name":"order_id","type":"string"},{"name":"tenant","type":"string"}]}"#;
///     fn key(&self) -> String { self.order_id.clone() }
/// }
/// ```
pub trait Job: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// Stable contract name. Also the default main topic, so renaming it is a
    /// migration, not a refactor.
    const NAME: &'static str;
    /// Contract version compiled into this binary (`schemas/<NAME>.v<VERSION>.avsc`).
    const VERSION: u32;
    /// The Avro schema (JSON) for this version, normally
    /// `include_str!("../schemas/<name>.v<N>.avsc")`. Parsed once per process.
    const SCHEMA: &'static str;

    /// The partition key. Jobs with the same key land on the same partition
    /// and, in the default ordering mode, run one after another: use the
    /// entity the job is about (an order id), so two jobs for one order never
    /// race.
    fn key(&self) -> String;

    /// The tenant this job belongs to, if the domain has one. Recorded in the
    /// `kjob-tenant` header so operators can filter without decoding.
    fn tenant(&self) -> Option<String> {
        None
    }
}

/// What a handler knows about the record it is handling, besides the job.
///
/// It exists so handlers can make idempotency and logging decisions (the job
/// id, the attempt) without parsing Kafka headers themselves.
///
/// The string fields are `Arc<str>`: the topic, group and contract name are
/// shared by every job of a route, and the id is shared with the worker's
/// own bookkeeping, so building a context costs no copy of them. They read
/// as `&str` (`&ctx.id`, `ctx.id.as_ref()`); `ctx.id.to_string()` makes an
/// owned `String` where one is needed.
#[derive(Clone, Debug)]
pub struct JobContext {
    /// Unique job id (`kjob-id`), the default idempotency key.
    pub id: std::sync::Arc<str>,
    /// Contract name from the record (`kjob-job`).
    pub job: std::sync::Arc<str>,
    /// Contract version the producer wrote (`kjob-version`), if present.
    pub version: Option<u32>,
    /// 1 for the first attempt; grows with each retry.
    pub attempt: u32,
    /// Topic the record was read from.
    pub topic: std::sync::Arc<str>,
    /// Partition the record was read from.
    pub partition: i32,
    /// Offset of the record.
    pub offset: i64,
    /// The record key as UTF-8 (lossy), if any.
    pub key: Option<std::sync::Arc<str>>,
    /// Record timestamp in epoch milliseconds, if any.
    pub timestamp_ms: Option<i64>,
    /// The tenant header, if any.
    pub tenant: Option<String>,
    /// The consumer group running the job.
    pub group: std::sync::Arc<str>,
    /// For a retry: when it was due (`kjob-due-at`, epoch ms); for a
    /// delayed job: when it was asked to run (`kjob-run-at`). `now - due`
    /// is how late it ran.
    pub due_at_ms: Option<i64>,
    /// The batch this job belongs to (`kjob-batch`), if it was enqueued
    /// through [`crate::batch::Batch`].
    pub batch: Option<String>,
    /// On a batch's callback: the batch's counts when it fired.
    pub batch_report: Option<crate::batch::report::BatchReport>,
}
