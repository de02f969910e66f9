//! The SQL the relay runs, and the rows it reads.

use tokio_postgres::types::Type;
use tokio_postgres::{Client, Statement};

use super::{OutboxError, OutboxTable};

/// What a row asks to publish.
#[derive(Debug)]
pub(super) enum Body {
    /// Confluent-framed Avro, written by `Outbox::enqueue`: sent as is.
    Avro(Vec<u8>),
    /// A JSON job, written by `kjob.enqueue`: encoded against the topic's
    /// contract first (`version`: the pinned subject version).
    Json {
        job: serde_json::Value,
        version: Option<u32>,
    },
}

/// One unsent row.
#[derive(Debug)]
pub(super) struct Row {
    pub id: i64,
    /// Failed publish attempts so far.
    pub attempts: i32,
    pub topic: String,
    pub key: String,
    pub body: Body,
    pub headers: Vec<(String, String)>,
    /// When the job is to run (epoch ms), if it was given one.
    pub run_at_ms: Option<i64>,
}

impl Row {
    pub(super) fn read(row: &tokio_postgres::Row) -> Result<Self, OutboxError> {
        let e = OutboxError::db;
        let headers: serde_json::Value = row.try_get("headers").map_err(e("reading headers"))?;
        let headers = match headers {
            serde_json::Value::Object(map) => map
                .into_iter()
                .map(|(k, v)| match v {
                    serde_json::Value::String(s) => (k, s),
                    other => (k, other.to_string()),
                })
                .collect(),
            _ => Vec::new(),
        };
        let payload: Option<Vec<u8>> = row.try_get("payload").map_err(e("reading payload"))?;
        let body = match payload {
            Some(bytes) => Body::Avro(bytes),
            None => {
                let job: Option<serde_json::Value> = row
                    .try_get("payload_json")
                    .map_err(e("reading payload_json"))?;
                let version: Option<i32> = row
                    .try_get("schema_version")
                    .map_err(e("reading schema_version"))?;
                Body::Json {
                    // The table's check constraint makes a row with neither
                    // unreachable; if one appears, it fails to encode (and
                    // is dead-lettered) instead of stopping the relay.
                    job: job.unwrap_or(serde_json::Value::Null),
                    version: version.and_then(|v| u32::try_from(v).ok()),
                }
            }
        };
        Ok(Self {
            id: row.try_get("id").map_err(e("reading id"))?,
            attempts: row.try_get("attempts").map_err(e("reading attempts"))?,
            topic: row.try_get("topic").map_err(e("reading topic"))?,
            key: row.try_get("key").map_err(e("reading key"))?,
            run_at_ms: row.try_get("run_at_ms").map_err(e("reading run_at"))?,
            body,
            headers,
        })
    }
}

/// The relay's statements, prepared once per session.
pub(super) struct Statements {
    /// Unsent rows of the held buckets, in id order.
    pub select: Statement,
    /// Marks rows sent (or deletes them, with a zero retention).
    pub mark: Statement,
    /// Records a failed attempt and its backoff.
    pub fail: Statement,
    /// Notes, on a dead-lettered row, where it went and why.
    pub note: Statement,
    /// Deletes sent rows past their retention.
    pub cleanup: Statement,
}

impl Statements {
    pub(super) async fn prepare(
        client: &Client,
        table: &OutboxTable,
        delete_on_send: bool,
    ) -> Result<Self, OutboxError> {
        let t = table.name();
        let prep = |sql: String, types: &'static [Type]| async move {
            client.prepare_typed(&sql, types).await.map_err(|e| {
                if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) {
                    OutboxError::NotMigrated {
                        table: t.to_string(),
                    }
                } else {
                    OutboxError::db(format!("preparing outbox statements on `{t}`"))(e)
                }
            })
        };
        // A key with a failing row that is not due yet is held back as a
        // whole, so nothing overtakes that row. `NOT IN` stays a hashed
        // subplan (normally over zero rows) instead of becoming an anti-join,
        // so the plan is always "walk the unsent index in id order, stop at
        // the limit", whatever the statistics say.
        let select = prep(
            format!(
                "SELECT id, topic, key, payload, payload_json, headers, attempts,
                        (extract(epoch FROM run_at) * 1000)::int8 AS run_at_ms, schema_version
                 FROM {t}
                 WHERE sent_at IS NULL AND bucket = ANY($1)
                   AND key NOT IN (
                       SELECT key FROM {t}
                       WHERE sent_at IS NULL AND retry_at > clock_timestamp())
                 ORDER BY id LIMIT $2"
            ),
            &[Type::INT2_ARRAY, Type::INT8],
        )
        .await?;
        let mark = if delete_on_send {
            prep(
                format!("DELETE FROM {t} WHERE id = ANY($1)"),
                &[Type::INT8_ARRAY],
            )
            .await?
        } else {
            prep(
                format!(
                    "UPDATE {t} SET sent_at = clock_timestamp(), retry_at = NULL WHERE id = ANY($1)"
                ),
                &[Type::INT8_ARRAY],
            )
            .await?
        };
        let fail = prep(
            format!(
                "UPDATE {t} SET attempts = attempts + 1, last_error = left($2, 1024),
                     retry_at = clock_timestamp()
                         + make_interval(secs => least(60, 0.5 * power(2, least(attempts, 10))))
                 WHERE id = ANY($1)"
            ),
            &[Type::INT8_ARRAY, Type::TEXT],
        )
        .await?;
        let note = prep(
            format!(
                "UPDATE {t} SET last_error = left(n.note, 1024)
                 FROM unnest($1::int8[], $2::text[]) AS n(id, note) WHERE {t}.id = n.id"
            ),
            &[Type::INT8_ARRAY, Type::TEXT_ARRAY],
        )
        .await?;
        let cleanup = prep(
            format!(
                "DELETE FROM {t} WHERE id IN (
                     SELECT id FROM {t}
                     WHERE sent_at < clock_timestamp() - make_interval(secs => $1)
                     LIMIT $2)"
            ),
            &[Type::FLOAT8, Type::INT8],
        )
        .await?;
        Ok(Self {
            select,
            mark,
            fail,
            note,
            cleanup,
        })
    }
}
