//! The saga steps' MySQL / MariaDB statements on `saga_state` (MySQL
//! migration 0006). Saga types and ids are VARBINARY (UTF-8 bytes); state
//! and compensations are JSON.
//!
//! MySQL rolls a transaction back under a handler that swallows a deadlock
//! and runs later statements in autocommit, where the step's write would
//! commit on its own: a write first checks, in the same round trip, that
//! the transaction is still open (`@@in_transaction`).

use futures::future::BoxFuture;
use sqlx::{MySql, MySqlConnection, Transaction};
use uuid::Uuid;

use super::store::{self, Loaded, SagaDatabase, Write};
use crate::consumer::HandlerError;

/// Fails unless the step's transaction is still open (see the module).
async fn still_open(conn: &mut MySqlConnection, write: &Write<'_>) -> Result<(), HandlerError> {
    match txoutbox_core::mysql::check_in_transaction(conn).await {
        Ok(()) => Ok(()),
        Err(txoutbox_core::Error::Database(error)) => Err(HandlerError::from(error)),
        Err(lost) => Err(store::unusable_write(write, &lost).into_transient()),
    }
}

/// The text of a JSON value for a JSON column.
fn json(value: &serde_json::Value) -> String {
    value.to_string()
}

impl SagaDatabase for MySql {
    fn load<'a>(
        tx: &'a mut Transaction<'static, Self>,
        saga_type: &'a str,
        saga_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Loaded>, HandlerError>> {
        Box::pin(async move {
            let row: Option<(String, String, i64, String)> = sqlx::query_as(
                "SELECT status, state, version, compensations FROM saga_state
                 WHERE saga_type = ? AND saga_id = ?
                 FOR UPDATE",
            )
            .bind(saga_type.as_bytes())
            .bind(saga_id.as_bytes())
            .fetch_optional(&mut **tx)
            .await?;
            let Some((status, state, version, compensations)) = row else {
                return Ok(None);
            };
            let parse = |what: &str, text: &str| {
                serde_json::from_str(text).map_err(|error| {
                    HandlerError::new(format!(
                        "the stored {what} of saga {saga_type} `{saga_id}` is not JSON: {error}"
                    ))
                })
            };
            let compensations = parse("compensations", &compensations)?;
            Ok(Some(Loaded {
                status: store::status(saga_type, saga_id, &status)?,
                state: parse("state", &state)?,
                version,
                compensations: store::compensations(saga_type, saga_id, &compensations)?,
            }))
        })
    }

    fn insert<'a>(
        tx: &'a mut Transaction<'static, Self>,
        write: &'a Write<'a>,
    ) -> BoxFuture<'a, Result<bool, HandlerError>> {
        Box::pin(async move {
            still_open(tx, write).await?;
            // `IGNORE` skips the row a concurrent start created (this one
            // waited for its commit); the other values it could turn into
            // warnings cannot occur (ids are bounded, JSON is serde's).
            let done = sqlx::query(
                "INSERT IGNORE INTO saga_state
                     (saga_type, saga_id, status, state, compensations, version,
                      last_message_type, last_event_id, finished_at)
                 VALUES (?, ?, ?, ?, ?, 1, ?, ?, IF(? <> 'running', NOW(6), NULL))",
            )
            .bind(write.saga_type.as_bytes())
            .bind(write.saga_id.as_bytes())
            .bind(write.status.as_str())
            .bind(json(&write.state))
            .bind(json(&write.compensations))
            .bind(write.message_type)
            .bind(write.event_id)
            .bind(write.status.as_str())
            .execute(&mut **tx)
            .await?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn update<'a>(
        tx: &'a mut Transaction<'static, Self>,
        write: &'a Write<'a>,
        version: i64,
    ) -> BoxFuture<'a, Result<bool, HandlerError>> {
        Box::pin(async move {
            still_open(tx, write).await?;
            let done = sqlx::query(
                "UPDATE saga_state
                 SET status = ?, state = ?, compensations = ?, version = version + 1,
                     last_message_type = ?, last_event_id = ?, updated_at = NOW(6),
                     finished_at = IF(? <> 'running', NOW(6), NULL)
                 WHERE saga_type = ? AND saga_id = ? AND version = ?",
            )
            .bind(write.status.as_str())
            .bind(json(&write.state))
            .bind(json(&write.compensations))
            .bind(write.message_type)
            .bind(write.event_id)
            .bind(write.status.as_str())
            .bind(write.saga_type.as_bytes())
            .bind(write.saga_id.as_bytes())
            .bind(version)
            .execute(&mut **tx)
            .await?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn cancel_scheduled<'a>(
        tx: &'a mut Transaction<'static, Self>,
        event_id: Uuid,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>> {
        Box::pin(async move { txoutbox_core::mysql::cancel_scheduled(tx, event_id).await })
    }

    fn open_sagas<'a>(
        pool: &'a sqlx::MySqlPool,
        sagas: &'a [&'static str],
    ) -> BoxFuture<'a, sqlx::Result<Vec<(String, i64, f64)>>> {
        Box::pin(async move {
            let mut figures = Vec::with_capacity(sagas.len());
            for name in sagas {
                let (open, oldest): (i64, Option<f64>) = sqlx::query_as(
                    "SELECT CAST(COUNT(*) AS SIGNED),
                            CAST(TIMESTAMPDIFF(MICROSECOND, MIN(updated_at), NOW(6)) AS DOUBLE)
                                / 1000000
                     FROM saga_state WHERE saga_type = ? AND finished_at IS NULL",
                )
                .bind(name.as_bytes())
                .fetch_one(pool)
                .await?;
                figures.push(((*name).to_owned(), open, oldest.unwrap_or(0.0)));
            }
            Ok(figures)
        })
    }
}
