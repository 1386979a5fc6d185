//! Parked rows ("dead letters") of the outbox and the inbox: list, retry,
//! discard.
//!
//! The relay parks an outbox row (sets `parked_at`) after too many failed
//! publish attempts; the inbox processor does the same with an inbox row its
//! handler keeps failing on. Parked rows are skipped until an operator acts:
//!
//! - **retry** clears `parked_at`, resets `attempts` to 0 and the backoff
//!   (clears `next_attempt_at`), so the row is picked up on the next poll. `last_error` is kept: it
//!   documents why the row was parked until the next attempt overwrites it.
//! - **discard** sets `discarded_at` and leaves the row parked, so it is never
//!   published / processed and stays as evidence until the retention job
//!   removes it. It never sets `published_at` or `processed`, which would lie
//!   about what happened.
//!
//! On MariaDB (feature `mysql`, SQL in the child module `mysql`) both
//! tables' dead letters are handled alike. There no trigger keeps
//! `inbox_key` (the head of each key with pending rows): a retry of inbox
//! rows moves their keys' heads back to them itself, in its transaction.
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool) -> Result<(), txoutbox_runtime::ops::OpsError> {
//! use txoutbox_runtime::ops::dead_letters::{self, Selection, Table};
//!
//! let parked = dead_letters::list(&pool, Table::Outbox, &Selection::All, 100).await?;
//! let retried = dead_letters::retry(&pool, Table::Outbox, &Selection::Topic("orders".into())).await?;
//! println!("{} parked, retried {}", parked.len(), retried.len());
//! # Ok(()) }
//! ```

use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::status::ProblemRow;
use super::{Database, OpsError};

#[cfg(feature = "mysql")]
mod mysql;

/// Which table's dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Table {
    /// Parked `outbox_event` rows (events that could not be published).
    Outbox,
    /// Parked `inbox_event` rows (received events whose handler kept failing).
    Inbox,
}

impl Table {
    /// The table's name: `outbox_event` or `inbox_event`.
    pub fn name(self) -> &'static str {
        self.sql().0
    }

    fn sql(self) -> (&'static str, &'static str, &'static str, String) {
        // (table, id expression, written-at column, "parked and not finished")
        let (table, id, written_at, unfinished) = match self {
            Table::Outbox => (
                "outbox_event",
                "t.id",
                "t.created_at",
                "published_at IS NULL",
            ),
            Table::Inbox => (
                "inbox_event",
                "NULL::int8",
                "t.received_at",
                "NOT processed",
            ),
        };
        let parked = format!("{unfinished} AND {}", super::PARKED_NOT_DISCARDED);
        (table, id, written_at, parked)
    }
}

/// Which parked rows an operation applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// Every parked row of the table.
    All,
    /// Outbox rows by `outbox_event.id` (the inbox has no such id).
    Ids(Vec<i64>),
    /// Rows by event id.
    EventIds(Vec<Uuid>),
    /// Rows of one topic.
    Topic(String),
}

impl Selection {
    fn bind(
        &self,
        table: Table,
        sql: String,
    ) -> Result<sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments>, OpsError>
    {
        let query = sqlx::query(super::trusted(sql));
        Ok(match self {
            Selection::All => query,
            Selection::Ids(_) if table == Table::Inbox => {
                return Err(OpsError::InboxRowsHaveNoId);
            }
            Selection::Ids(ids) => query.bind(ids.clone()),
            Selection::EventIds(ids) => query.bind(ids.clone()),
            Selection::Topic(topic) => query.bind(topic),
        })
    }

    fn condition(&self) -> &'static str {
        match self {
            Selection::All => "TRUE",
            Selection::Ids(_) => "t.id = ANY($1)",
            Selection::EventIds(_) => "t.event_id = ANY($1)",
            Selection::Topic(_) => "t.topic = $1",
        }
    }
}

/// Parked, not discarded rows of `table` matching `selection`, oldest first,
/// at most `limit` (each with its `parked_at`).
pub async fn list<'a>(
    database: impl Into<Database<'a>>,
    table: Table,
    selection: &Selection,
    limit: i64,
) -> Result<Vec<ProblemRow>, OpsError> {
    match database.into() {
        Database::Postgres(pool) => list_postgres(pool, table, selection, limit).await,
        #[cfg(feature = "mysql")]
        Database::MySql(pool) => mysql::list(pool, table, selection, limit).await,
    }
}

async fn list_postgres(
    pool: &PgPool,
    table: Table,
    selection: &Selection,
    limit: i64,
) -> Result<Vec<ProblemRow>, OpsError> {
    let (name, id, written_at, parked) = table.sql();
    let condition = selection.condition();
    // The limit is inlined: the selection owns `$1`.
    let sql = format!(
        "SELECT {id} AS id, t.event_id, t.topic, t.event_type, t.attempts, t.last_error,
                {written_at} AS written_at, t.parked_at, t.next_attempt_at
         FROM {name} t WHERE {parked} AND {condition}
         ORDER BY t.parked_at, t.event_id LIMIT {}",
        limit.max(0)
    );
    let rows = selection.bind(table, sql)?.fetch_all(pool).await?;
    rows.iter()
        .map(|row| sqlx::FromRow::from_row(row).map_err(OpsError::from))
        .collect()
}

/// How many parked, not discarded rows of `table` match `selection`.
pub async fn count<'a>(
    database: impl Into<Database<'a>>,
    table: Table,
    selection: &Selection,
) -> Result<i64, OpsError> {
    match database.into() {
        Database::Postgres(pool) => count_postgres(pool, table, selection).await,
        #[cfg(feature = "mysql")]
        Database::MySql(pool) => mysql::count(pool, table, selection).await,
    }
}

async fn count_postgres(
    pool: &PgPool,
    table: Table,
    selection: &Selection,
) -> Result<i64, OpsError> {
    let (name, _, _, parked) = table.sql();
    let condition = selection.condition();
    let sql = format!("SELECT count(*) FROM {name} t WHERE {parked} AND {condition}");
    let row = selection.bind(table, sql)?.fetch_one(pool).await?;
    Ok(sqlx::Row::try_get(&row, 0)?)
}

/// Returns the matching parked rows to their queue (clears `parked_at`,
/// `attempts` and `next_attempt_at`, keeps `last_error`); returns their event
/// ids. Fix the cause first (create the topic, raise the size limit).
///
/// Retried outbox rows wake the relays of this process at once; relays in
/// other processes take them at their next poll, or at once with
/// `outbox notify enable` (the trigger fires on un-parking too). A retried
/// outbox row is published after the later events of its key that went out
/// while it was parked: parking gives up per-key order for that row.
pub async fn retry<'a>(
    database: impl Into<Database<'a>>,
    table: Table,
    selection: &Selection,
) -> Result<Vec<Uuid>, OpsError> {
    let database = database.into();
    let scope = database.wakeup_scope();
    let retried = match database {
        Database::Postgres(pool) => {
            update(
                pool,
                table,
                selection,
                "parked_at = NULL, attempts = 0, next_attempt_at = NULL",
            )
            .await?
        }
        #[cfg(feature = "mysql")]
        Database::MySql(pool) => mysql::retry(pool, table, selection).await?,
    };
    if table == Table::Outbox && !retried.is_empty() {
        txoutbox_core::__private::wakeup::notify_committed_in(scope);
    }
    Ok(retried)
}

/// Marks the matching parked rows as discarded; returns their event ids.
pub async fn discard<'a>(
    database: impl Into<Database<'a>>,
    table: Table,
    selection: &Selection,
) -> Result<Vec<Uuid>, OpsError> {
    match database.into() {
        Database::Postgres(pool) => update(pool, table, selection, "discarded_at = now()").await,
        #[cfg(feature = "mysql")]
        Database::MySql(pool) => mysql::discard(pool, table, selection).await,
    }
}

/// Whether any row of `table`, parked or not, has `topic`: tells a topic
/// with no dead letters apart from a misspelt one.
pub async fn topic_exists<'a>(
    database: impl Into<Database<'a>>,
    table: Table,
    topic: &str,
) -> Result<bool, OpsError> {
    match database.into() {
        Database::Postgres(pool) => {
            let sql = format!(
                "SELECT EXISTS (SELECT 1 FROM {} WHERE topic = $1)",
                table.name()
            );
            Ok(sqlx::query_scalar(super::trusted(sql))
                .bind(topic)
                .fetch_one(pool)
                .await?)
        }
        #[cfg(feature = "mysql")]
        Database::MySql(pool) => mysql::topic_exists(pool, table, topic).await,
    }
}

async fn update(
    pool: &PgPool,
    table: Table,
    selection: &Selection,
    set: &str,
) -> Result<Vec<Uuid>, OpsError> {
    let (name, _, _, parked) = table.sql();
    let condition = selection.condition();
    let sql =
        format!("UPDATE {name} t SET {set} WHERE {parked} AND {condition} RETURNING t.event_id");
    // READ COMMITTED whatever the database's default (see `crate::txn`).
    let mut tx = crate::txn::begin(pool).await?;
    let rows = selection.bind(table, sql)?.fetch_all(&mut *tx).await?;
    tx.commit().await?;
    rows.iter()
        .map(|row| sqlx::Row::try_get(row, 0).map_err(OpsError::from))
        .collect()
}
