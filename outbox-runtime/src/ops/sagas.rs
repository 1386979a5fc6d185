//! Sagas as an operator sees them: which run, which finished, which wait for
//! a message that does not come, and what one saga holds (its state and the
//! compensations it would send).
//!
//! Everything here reads `saga_state` (migration 0008; on MariaDB, feature
//! `mysql`, MySQL migration 0006, with the SQL in the child module `mysql`)
//! and changes nothing; removing finished sagas is the retention job's
//! ([`Target::FinishedSaga`](super::cleanup::Target::FinishedSaga)). Every
//! function takes a [`Database`]: a `&PgPool`, or a `&MySqlPool`, and
//! returns the same figures on both.
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool) -> Result<(), txoutbox_runtime::ops::OpsError> {
//! use std::time::Duration;
//! use txoutbox_runtime::ops::sagas;
//!
//! for saga in sagas::stuck(&pool, Duration::from_secs(600), Some("OrderFulfilment"), 20).await? {
//!     eprintln!(
//!         "saga {} `{}` waits since {} (last message {:?})",
//!         saga.saga_type, saga.saga_id, saga.updated_at, saga.last_message_type
//!     );
//! }
//! # Ok(()) }
//! ```

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use super::{Database, OpsError};
use crate::saga::SagaStatus;

#[cfg(feature = "mysql")]
mod mysql;

/// Which sagas [`list`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SagaFilter {
    /// Only sagas of this type (`saga_state.saga_type`).
    pub saga_type: Option<String>,
    /// Only sagas in this status.
    pub status: Option<SagaStatus>,
    /// At most this many sagas (at least 1).
    pub limit: i64,
}

impl SagaFilter {
    /// The default [`limit`](Self::limit).
    pub const DEFAULT_LIMIT: i64 = 50;
}

impl Default for SagaFilter {
    /// Every type and status, [`SagaFilter::DEFAULT_LIMIT`] sagas.
    fn default() -> Self {
        Self {
            saga_type: None,
            status: None,
            limit: Self::DEFAULT_LIMIT,
        }
    }
}

/// One saga instance, without its state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SagaSummary {
    /// The saga type's name.
    pub saga_type: String,
    /// The instance's id (its correlation value, as text).
    pub saga_id: String,
    /// Where it is in its life.
    pub status: SagaStatus,
    /// Steps applied (1 after the start).
    pub version: i64,
    /// The event type of the message of its last step.
    pub last_message_type: Option<String>,
    /// When its first message was handled.
    pub started_at: DateTime<Utc>,
    /// When its last step was applied.
    pub updated_at: DateTime<Utc>,
    /// When it completed or was compensated.
    pub finished_at: Option<DateTime<Utc>>,
    /// Seconds since its last step, by the database clock.
    pub idle_secs: f64,
    /// Compensations registered and not sent (sent, last registered first,
    /// if the saga is compensated; dropped if it completes).
    pub pending_compensations: usize,
}

/// One saga instance with its state and pending compensations.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SagaDetail {
    /// The saga's row, as [`list`] shows it.
    #[serde(flatten)]
    pub summary: SagaSummary,
    /// The saga's state, as its type serialized it.
    pub state: Value,
    /// The event id of the message of its last step.
    pub last_event_id: Option<Uuid>,
    /// The compensations registered and not sent, in registration order.
    pub compensations: Vec<PendingCompensation>,
}

/// A compensation message stored with a saga (an outbox record waiting in
/// `saga_state.compensations`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PendingCompensation {
    /// The event id it will be sent with (fixed when it was registered).
    pub event_id: Uuid,
    /// Its event type.
    pub event_type: String,
    /// The topic it will be sent to.
    pub topic: String,
    /// Its Kafka key.
    pub partition_key: String,
}

/// The sagas of one type, by status (see [`overview`]).
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct SagaTypeOverview {
    /// The saga type's name.
    pub saga_type: String,
    /// Running sagas.
    pub running: i64,
    /// Completed sagas not yet removed by retention.
    pub completed: i64,
    /// Compensated sagas not yet removed by retention.
    pub compensated: i64,
    /// When the running saga that moved least recently took its last step.
    pub oldest_running_at: Option<DateTime<Utc>>,
    /// Seconds since then, by the database clock (`None` with no running
    /// saga).
    pub oldest_running_age_secs: Option<f64>,
}

/// The longest age [`stuck`] compares with, in seconds (about 3,000 years):
/// any longer age selects the same sagas (none), and `now()` minus it stays
/// inside PostgreSQL's time range, so no [`Duration`] makes the query fail
/// (on MariaDB the cutoff before year 1000 is NULL, and selects none).
const AGE_CAP_SECS: f64 = 1e11;

/// The columns of a [`SagaSummary`], from `saga_state` aliased `s`.
const SUMMARY_COLUMNS: &str = "s.saga_type, s.saga_id, s.status, s.version, s.last_message_type,
     s.started_at, s.updated_at, s.finished_at,
     EXTRACT(EPOCH FROM now() - s.updated_at)::float8 AS idle_secs,
     CASE WHEN jsonb_typeof(s.compensations) = 'array'
          THEN jsonb_array_length(s.compensations) ELSE 0 END::int8 AS pending_compensations";

#[derive(sqlx::FromRow)]
struct SummaryRow {
    saga_type: String,
    saga_id: String,
    status: String,
    version: i64,
    last_message_type: Option<String>,
    started_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    idle_secs: f64,
    pending_compensations: i64,
}

impl TryFrom<SummaryRow> for SagaSummary {
    type Error = OpsError;

    fn try_from(row: SummaryRow) -> Result<Self, OpsError> {
        let status = SagaStatus::parse(&row.status).ok_or_else(|| OpsError::UnknownSagaStatus {
            saga_type: row.saga_type.clone(),
            saga_id: row.saga_id.clone(),
            status: row.status.clone(),
        })?;
        Ok(Self {
            saga_type: row.saga_type,
            saga_id: row.saga_id,
            status,
            version: row.version,
            last_message_type: row.last_message_type,
            started_at: row.started_at,
            updated_at: row.updated_at,
            finished_at: row.finished_at,
            idle_secs: row.idle_secs,
            pending_compensations: usize::try_from(row.pending_compensations).unwrap_or(0),
        })
    }
}

#[derive(sqlx::FromRow)]
struct DetailRow {
    #[sqlx(flatten)]
    summary: SummaryRow,
    state: Value,
    last_event_id: Option<Uuid>,
    compensations: Value,
}

/// The fields of a stored compensation (an outbox record as JSON) that
/// [`show`] returns; `Err` names the first one missing.
fn compensation(item: &Value) -> Result<PendingCompensation, &'static str> {
    let text = |name: &'static str| {
        item.get(name)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or(name)
    };
    Ok(PendingCompensation {
        event_id: text("event_id")?.parse().map_err(|_| "event_id")?,
        event_type: text("event_type")?,
        topic: text("topic")?,
        partition_key: text("partition_key")?,
    })
}

fn summaries(rows: Vec<SummaryRow>) -> Result<Vec<SagaSummary>, OpsError> {
    rows.into_iter().map(SagaSummary::try_from).collect()
}

/// Sagas matching `filter`, the most recently moved first.
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> Result<(), txoutbox_runtime::ops::OpsError> {
/// use txoutbox_runtime::ops::sagas::{self, SagaFilter};
/// use txoutbox_runtime::saga::SagaStatus;
///
/// let filter = SagaFilter { status: Some(SagaStatus::Compensated), ..SagaFilter::default() };
/// for saga in sagas::list(&pool, &filter).await? {
///     println!("{} {} compensated at {:?}", saga.saga_type, saga.saga_id, saga.finished_at);
/// }
/// # Ok(()) }
/// ```
pub async fn list<'a>(
    database: impl Into<Database<'a>>,
    filter: &SagaFilter,
) -> Result<Vec<SagaSummary>, OpsError> {
    summaries(match database.into() {
        Database::Postgres(pool) => list_postgres(pool, filter).await?,
        #[cfg(feature = "mysql")]
        Database::MySql(pool) => mysql::list(pool, filter).await?,
    })
}

async fn list_postgres(pool: &PgPool, filter: &SagaFilter) -> Result<Vec<SummaryRow>, OpsError> {
    Ok(sqlx::query_as(super::trusted(format!(
        "SELECT {SUMMARY_COLUMNS} FROM saga_state s
         WHERE ($1::text IS NULL OR s.saga_type = $1)
           AND ($2::text IS NULL OR s.status = $2)
         ORDER BY s.updated_at DESC, s.saga_type, s.saga_id
         LIMIT $3"
    )))
    .bind(filter.saga_type.as_deref())
    .bind(filter.status.map(SagaStatus::as_str))
    .bind(filter.limit.max(1))
    .fetch_all(pool)
    .await?)
}

/// One saga with its state and pending compensations; `None` if there is no
/// such saga (never started, or removed by retention after it finished).
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> Result<(), txoutbox_runtime::ops::OpsError> {
/// use txoutbox_runtime::ops::sagas;
///
/// if let Some(saga) = sagas::show(&pool, "OrderFulfilment", "o-42").await? {
///     println!("{}: {}", saga.summary.status, saga.state);
///     for c in &saga.compensations {
///         println!("  would send {} to {}", c.event_type, c.topic);
///     }
/// }
/// # Ok(()) }
/// ```
pub async fn show<'a>(
    database: impl Into<Database<'a>>,
    saga_type: &str,
    saga_id: &str,
) -> Result<Option<SagaDetail>, OpsError> {
    let row = match database.into() {
        Database::Postgres(pool) => show_postgres(pool, saga_type, saga_id).await?,
        #[cfg(feature = "mysql")]
        Database::MySql(pool) => mysql::show(pool, saga_type, saga_id).await?,
    };
    row.map(|row| detail(row, saga_type, saga_id)).transpose()
}

async fn show_postgres(
    pool: &PgPool,
    saga_type: &str,
    saga_id: &str,
) -> Result<Option<DetailRow>, OpsError> {
    Ok(sqlx::query_as(super::trusted(format!(
        "SELECT {SUMMARY_COLUMNS}, s.state, s.last_event_id, s.compensations
         FROM saga_state s WHERE s.saga_type = $1 AND s.saga_id = $2"
    )))
    .bind(saga_type)
    .bind(saga_id)
    .fetch_optional(pool)
    .await?)
}

/// A stored saga as [`show`] returns it: its compensations read from the
/// stored list.
fn detail(row: DetailRow, saga_type: &str, saga_id: &str) -> Result<SagaDetail, OpsError> {
    let DetailRow {
        summary,
        state,
        last_event_id,
        compensations,
    } = row;
    let summary = SagaSummary::try_from(summary)?;
    let compensations = match compensations {
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(n, item)| {
                compensation(item).map_err(|field| OpsError::InvalidCompensation {
                    saga_type: saga_type.to_owned(),
                    saga_id: saga_id.to_owned(),
                    position: n + 1,
                    field,
                })
            })
            .collect::<Result<_, _>>()?,
        _ => Vec::new(),
    };
    Ok(SagaDetail {
        summary,
        state,
        last_event_id,
        compensations,
    })
}

/// Running sagas that have not moved (no step applied) for longer than
/// `older_than`, of one type or of every type, the longest waiting first; at
/// most `limit` (at least 1).
///
/// A saga waits for the reply to what it sent, or for a timeout it
/// scheduled; one that waits much longer than its slowest reply should take
/// lost a message or waits for a service that is down. The query walks the
/// partial index of open sagas (`ix_saga_state_open`), so it stays cheap
/// however many finished sagas the table holds (on MariaDB its index of
/// open sagas by type, `ix_saga_state_open`, for each type there is).
pub async fn stuck<'a>(
    database: impl Into<Database<'a>>,
    older_than: Duration,
    saga_type: Option<&str>,
    limit: i64,
) -> Result<Vec<SagaSummary>, OpsError> {
    summaries(match database.into() {
        Database::Postgres(pool) => stuck_postgres(pool, older_than, saga_type, limit).await?,
        #[cfg(feature = "mysql")]
        Database::MySql(pool) => mysql::stuck(pool, older_than, saga_type, limit).await?,
    })
}

async fn stuck_postgres(
    pool: &PgPool,
    older_than: Duration,
    saga_type: Option<&str>,
    limit: i64,
) -> Result<Vec<SummaryRow>, OpsError> {
    Ok(sqlx::query_as(super::trusted(format!(
        "SELECT {SUMMARY_COLUMNS} FROM saga_state s
         WHERE s.finished_at IS NULL
           AND s.updated_at < now() - make_interval(secs => $1)
           AND ($2::text IS NULL OR s.saga_type = $2)
         ORDER BY s.updated_at, s.saga_type, s.saga_id
         LIMIT $3"
    )))
    .bind(older_than.as_secs_f64().min(AGE_CAP_SECS))
    .bind(saga_type)
    .bind(limit.max(1))
    .fetch_all(pool)
    .await?)
}

/// How many sagas [`stuck`] would return without a limit.
pub async fn count_stuck<'a>(
    database: impl Into<Database<'a>>,
    older_than: Duration,
    saga_type: Option<&str>,
) -> Result<i64, OpsError> {
    match database.into() {
        Database::Postgres(pool) => count_stuck_postgres(pool, older_than, saga_type).await,
        #[cfg(feature = "mysql")]
        Database::MySql(pool) => mysql::count_stuck(pool, older_than, saga_type).await,
    }
}

async fn count_stuck_postgres(
    pool: &PgPool,
    older_than: Duration,
    saga_type: Option<&str>,
) -> Result<i64, OpsError> {
    let count = sqlx::query_scalar(
        "SELECT count(*) FROM saga_state s
         WHERE s.finished_at IS NULL
           AND s.updated_at < now() - make_interval(secs => $1)
           AND ($2::text IS NULL OR s.saga_type = $2)",
    )
    .bind(older_than.as_secs_f64().min(AGE_CAP_SECS))
    .bind(saga_type)
    .fetch_one(pool)
    .await?;
    Ok(count)
}

/// Per saga type: running, completed and compensated sagas, and how long the
/// least recently moved running saga has waited. Empty when the database has
/// no `saga_state` table (migrations before 0008; MySQL migrations before
/// 0006) or no saga.
///
/// Finished sagas stay until the retention job removes them, so this counts
/// the whole table: keep the retention (`outbox cleanup --sagas-older-than`)
/// in step with how often this runs.
pub async fn overview<'a>(
    database: impl Into<Database<'a>>,
) -> Result<Vec<SagaTypeOverview>, OpsError> {
    match database.into() {
        Database::Postgres(pool) => overview_postgres(pool).await,
        #[cfg(feature = "mysql")]
        Database::MySql(pool) => mysql::overview(pool).await,
    }
}

async fn overview_postgres(pool: &PgPool) -> Result<Vec<SagaTypeOverview>, OpsError> {
    let migrated: bool = sqlx::query_scalar("SELECT to_regclass('saga_state') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !migrated {
        return Ok(Vec::new());
    }
    let rows = sqlx::query_as(
        "SELECT saga_type,
                count(*) FILTER (WHERE status = 'running') AS running,
                count(*) FILTER (WHERE status = 'completed') AS completed,
                count(*) FILTER (WHERE status = 'compensated') AS compensated,
                min(updated_at) FILTER (WHERE finished_at IS NULL) AS oldest_running_at,
                EXTRACT(EPOCH FROM now() - min(updated_at) FILTER (WHERE finished_at IS NULL))::float8
                    AS oldest_running_age_secs
         FROM saga_state GROUP BY saga_type ORDER BY saga_type",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows)
}
