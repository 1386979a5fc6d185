//! The saga steps' PostgreSQL statements on `saga_state` (migration 0008).

use futures::future::BoxFuture;
use serde_json::Value;
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use super::store::{self, Loaded, SagaDatabase, Write};
use crate::consumer::HandlerError;

type Query<'q> = sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>;

/// Binds `write` as `$1` to `$7`: saga type and id, status, state,
/// compensations, message type and event id (both statements below number
/// them so).
fn bind<'q>(write: &'q Write<'q>, query: Query<'q>) -> Query<'q> {
    query
        .bind(write.saga_type)
        .bind(write.saga_id)
        .bind(write.status.as_str())
        .bind(&write.state)
        .bind(&write.compensations)
        .bind(write.message_type)
        .bind(write.event_id)
}

/// A failed write: the transaction could not commit any more (see
/// [`store::unusable_write`]), or the statement failed on its own.
fn write_failed(write: &Write<'_>, error: sqlx::Error) -> HandlerError {
    match txoutbox_core::not_committable(&error) {
        Some(unusable) => store::unusable_write(write, &unusable),
        None => HandlerError::from(error),
    }
}

impl SagaDatabase for Postgres {
    fn load<'a>(
        tx: &'a mut Transaction<'static, Self>,
        saga_type: &'a str,
        saga_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Loaded>, HandlerError>> {
        Box::pin(async move {
            let row: Option<(String, Value, i64, Value)> = sqlx::query_as(
                "SELECT status, state, version, compensations FROM saga_state
                 WHERE saga_type = $1 AND saga_id = $2
                 FOR UPDATE",
            )
            .bind(saga_type)
            .bind(saga_id)
            .fetch_optional(&mut **tx)
            .await?;
            let Some((status, state, version, compensations)) = row else {
                return Ok(None);
            };
            Ok(Some(Loaded {
                status: store::status(saga_type, saga_id, &status)?,
                state,
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
            let query = sqlx::query(
                "INSERT INTO saga_state
                     (saga_type, saga_id, status, state, compensations, version,
                      last_message_type, last_event_id, finished_at)
                 VALUES ($1, $2, $3, $4, $5, 1, $6, $7, CASE WHEN $3 <> 'running' THEN now() END)
                 ON CONFLICT (saga_type, saga_id) DO NOTHING",
            );
            let done = bind(write, query)
                .execute(&mut **tx)
                .await
                .map_err(|error| write_failed(write, error))?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn update<'a>(
        tx: &'a mut Transaction<'static, Self>,
        write: &'a Write<'a>,
        version: i64,
    ) -> BoxFuture<'a, Result<bool, HandlerError>> {
        Box::pin(async move {
            let query = sqlx::query(
                "UPDATE saga_state
                 SET status = $3, state = $4, compensations = $5, version = version + 1,
                     last_message_type = $6, last_event_id = $7, updated_at = now(),
                     finished_at = CASE WHEN $3 <> 'running' THEN now() END
                 WHERE saga_type = $1 AND saga_id = $2 AND version = $8",
            );
            let done = bind(write, query)
                .bind(version)
                .execute(&mut **tx)
                .await
                .map_err(|error| write_failed(write, error))?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn cancel_scheduled<'a>(
        tx: &'a mut Transaction<'static, Self>,
        event_id: Uuid,
    ) -> BoxFuture<'a, Result<bool, sqlx::Error>> {
        Box::pin(async move { txoutbox_core::cancel_scheduled(tx, event_id).await })
    }

    fn open_sagas<'a>(
        pool: &'a sqlx::PgPool,
        sagas: &'a [&'static str],
    ) -> BoxFuture<'a, sqlx::Result<Vec<(String, i64, f64)>>> {
        Box::pin(async move {
            let names: Vec<&str> = sagas.to_vec();
            sqlx::query_as(
                "SELECT s.name, count(t.saga_id),
                        COALESCE(EXTRACT(EPOCH FROM now() - min(t.updated_at))::float8, 0)
                 FROM unnest($1::text[]) AS s(name)
                 LEFT JOIN saga_state t ON t.saga_type = s.name AND t.finished_at IS NULL
                 GROUP BY s.name",
            )
            .bind(&names)
            .fetch_all(pool)
            .await
        })
    }
}
