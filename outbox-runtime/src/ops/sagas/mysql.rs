//! The saga operations on MariaDB (feature `mysql`): `saga_state` of MySQL
//! migration 0006, whose `saga_type` and `saga_id` are `VARBINARY` (the
//! saga runtime's UTF-8 bytes, bound with `as_bytes()` and read back as
//! text), `state` and `compensations` `JSON` (text), timestamps
//! `DATETIME(6)` in UTC, read against `UTC_TIMESTAMP(6)`.
//!
//! Every statement is a plain read (no locks). `stuck` and `count_stuck`
//! read the open sagas only, through `ix_saga_state_open (saga_type,
//! finished_at, updated_at)`: the types are read first (`SELECT DISTINCT
//! saga_type`, one probe of the primary key per type), then each type's
//! open sagas (`finished_at` NULL, the index's head for the type) older
//! than the cutoff, however many finished ones the table keeps.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{MySql, MySqlPool, QueryBuilder};
use uuid::Uuid;

use super::{AGE_CAP_SECS, DetailRow, SagaFilter, SagaTypeOverview, SummaryRow};
use crate::ops::OpsError;
use crate::ops::database::text;
use crate::relay::{NO_SUCH_TABLE, error_number};
use crate::saga::SagaStatus;

/// The columns of a [`SummaryRow`], from `saga_state` aliased `s`, by the
/// database clock.
const SUMMARY_COLUMNS: &str = "s.saga_type, s.saga_id, s.status, s.version, s.last_message_type,
     s.started_at, s.updated_at, s.finished_at,
     CAST(TIMESTAMPDIFF(MICROSECOND, s.updated_at, UTC_TIMESTAMP(6)) AS DOUBLE) / 1000000
         AS idle_secs,
     CAST(IF(JSON_TYPE(s.compensations) = 'ARRAY', JSON_LENGTH(s.compensations), 0) AS SIGNED)
         AS pending_compensations";

/// A [`SummaryRow`] as MariaDB returns it (type and id as bytes).
#[derive(sqlx::FromRow)]
struct Summary {
    saga_type: Vec<u8>,
    saga_id: Vec<u8>,
    status: String,
    version: i64,
    last_message_type: Option<String>,
    started_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    idle_secs: f64,
    pending_compensations: i64,
}

impl From<Summary> for SummaryRow {
    fn from(row: Summary) -> Self {
        Self {
            saga_type: text(row.saga_type),
            saga_id: text(row.saga_id),
            status: row.status,
            version: row.version,
            last_message_type: row.last_message_type,
            started_at: row.started_at,
            updated_at: row.updated_at,
            finished_at: row.finished_at,
            idle_secs: row.idle_secs,
            pending_compensations: row.pending_compensations,
        }
    }
}

/// A [`DetailRow`] as MariaDB returns it (the JSON columns as text).
#[derive(sqlx::FromRow)]
struct Detail {
    #[sqlx(flatten)]
    summary: Summary,
    state: String,
    last_event_id: Option<Uuid>,
    compensations: String,
}

/// A JSON column's text, parsed (the columns are checked JSON, so a
/// failure is a decoding error).
fn json(text: &str) -> Result<serde_json::Value, OpsError> {
    serde_json::from_str(text).map_err(|e| OpsError::Database(sqlx::Error::Decode(Box::new(e))))
}

/// `older_than` in microseconds, capped as on PostgreSQL: a cutoff before
/// year 1000 is NULL on MariaDB (a warning, not an error), which selects
/// nothing, as any age that long would.
fn micros(older_than: Duration) -> i64 {
    (older_than.as_secs_f64().min(AGE_CAP_SECS) * 1e6) as i64
}

pub(super) async fn list(
    pool: &MySqlPool,
    filter: &SagaFilter,
) -> Result<Vec<SummaryRow>, OpsError> {
    let mut query = QueryBuilder::<MySql>::new(format!(
        "SELECT {SUMMARY_COLUMNS} FROM saga_state s WHERE TRUE"
    ));
    if let Some(saga_type) = &filter.saga_type {
        query
            .push(" AND s.saga_type = ")
            .push_bind(saga_type.as_bytes());
    }
    if let Some(status) = filter.status {
        query.push(" AND s.status = ").push_bind(status.as_str());
    }
    query
        .push(" ORDER BY s.updated_at DESC, s.saga_type, s.saga_id LIMIT ")
        .push_bind(filter.limit.max(1));
    let rows: Vec<Summary> = query.build_query_as().fetch_all(pool).await?;
    Ok(rows.into_iter().map(SummaryRow::from).collect())
}

pub(super) async fn show(
    pool: &MySqlPool,
    saga_type: &str,
    saga_id: &str,
) -> Result<Option<DetailRow>, OpsError> {
    let row: Option<Detail> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {SUMMARY_COLUMNS}, s.state, s.last_event_id, s.compensations
         FROM saga_state s WHERE s.saga_type = ? AND s.saga_id = ?"
    )))
    .bind(saga_type.as_bytes())
    .bind(saga_id.as_bytes())
    .fetch_optional(pool)
    .await?;
    row.map(|row| {
        Ok(DetailRow {
            summary: row.summary.into(),
            state: json(&row.state)?,
            last_event_id: row.last_event_id,
            compensations: json(&row.compensations)?,
        })
    })
    .transpose()
}

/// The saga types `stuck` reads: the one asked, or every type there is
/// (one probe of the primary key per type).
async fn types(pool: &MySqlPool, saga_type: Option<&str>) -> Result<Vec<Vec<u8>>, OpsError> {
    Ok(match saga_type {
        Some(saga_type) => vec![saga_type.as_bytes().to_vec()],
        None => {
            sqlx::query_scalar("SELECT DISTINCT saga_type FROM saga_state ORDER BY saga_type")
                .fetch_all(pool)
                .await?
        }
    })
}

/// `<select> FROM saga_state s <the open sagas of types idle longer than
/// older_than>`, through `ix_saga_state_open`.
fn open_and_idle(select: &str, types: &[Vec<u8>], older_than: Duration) -> QueryBuilder<MySql> {
    let mut query = QueryBuilder::new(format!(
        "{select} FROM saga_state s FORCE INDEX (ix_saga_state_open) WHERE s.saga_type IN ("
    ));
    let mut list = query.separated(", ");
    for saga_type in types {
        list.push_bind(saga_type.as_slice());
    }
    query
        .push(
            ") AND s.finished_at IS NULL
               AND s.updated_at < UTC_TIMESTAMP(6) - INTERVAL ",
        )
        .push_bind(micros(older_than))
        .push(" MICROSECOND");
    query
}

pub(super) async fn stuck(
    pool: &MySqlPool,
    older_than: Duration,
    saga_type: Option<&str>,
    limit: i64,
) -> Result<Vec<SummaryRow>, OpsError> {
    let types = types(pool, saga_type).await?;
    if types.is_empty() {
        return Ok(Vec::new());
    }
    let mut query = open_and_idle(&format!("SELECT {SUMMARY_COLUMNS}"), &types, older_than);
    query
        .push(" ORDER BY s.updated_at, s.saga_type, s.saga_id LIMIT ")
        .push_bind(limit.max(1));
    let rows: Vec<Summary> = query.build_query_as().fetch_all(pool).await?;
    Ok(rows.into_iter().map(SummaryRow::from).collect())
}

pub(super) async fn count_stuck(
    pool: &MySqlPool,
    older_than: Duration,
    saga_type: Option<&str>,
) -> Result<i64, OpsError> {
    let types = types(pool, saga_type).await?;
    if types.is_empty() {
        return Ok(0);
    }
    Ok(open_and_idle("SELECT COUNT(*)", &types, older_than)
        .build_query_scalar()
        .fetch_one(pool)
        .await?)
}

/// One type's figures as MariaDB returns them (the type as bytes).
#[derive(sqlx::FromRow)]
struct Overview {
    saga_type: Vec<u8>,
    running: i64,
    completed: i64,
    compensated: i64,
    oldest_running_at: Option<DateTime<Utc>>,
    oldest_running_age_secs: Option<f64>,
}

pub(super) async fn overview(pool: &MySqlPool) -> Result<Vec<SagaTypeOverview>, OpsError> {
    let open = "MIN(IF(finished_at IS NULL, updated_at, NULL))";
    let rows: Vec<Overview> = match sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT saga_type,
                CAST(SUM(status = '{running}') AS SIGNED) AS running,
                CAST(SUM(status = '{completed}') AS SIGNED) AS completed,
                CAST(SUM(status = '{compensated}') AS SIGNED) AS compensated,
                {open} AS oldest_running_at,
                CAST(TIMESTAMPDIFF(MICROSECOND, {open}, UTC_TIMESTAMP(6)) AS DOUBLE) / 1000000
                    AS oldest_running_age_secs
         FROM saga_state GROUP BY saga_type ORDER BY saga_type",
        running = SagaStatus::Running.as_str(),
        completed = SagaStatus::Completed.as_str(),
        compensated = SagaStatus::Compensated.as_str(),
    )))
    .fetch_all(pool)
    .await
    {
        Ok(rows) => rows,
        // A schema migrated before MySQL migration 0006, as PostgreSQL's
        // before 0008: no sagas.
        Err(error) if error_number(&error) == Some(NO_SUCH_TABLE) => return Ok(Vec::new()),
        Err(error) => return Err(error.into()),
    };
    Ok(rows
        .into_iter()
        .map(|row| SagaTypeOverview {
            saga_type: text(row.saga_type),
            running: row.running,
            completed: row.completed,
            compensated: row.compensated,
            oldest_running_at: row.oldest_running_at,
            oldest_running_age_secs: row.oldest_running_age_secs,
        })
        .collect())
}
