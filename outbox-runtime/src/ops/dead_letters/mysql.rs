//! Dead letters on MariaDB (feature `mysql`): the parked rows of
//! `outbox_event`; the inbox is not on this database.
//!
//! MariaDB has no `UPDATE .. RETURNING`, and InnoDB locks every row a
//! locking read examines before the server filters it. So a retry or a
//! discard first finds the matching rows with a plain read (no locks),
//! then, in one `READ COMMITTED` transaction, locks those rows by primary
//! key (forced: on a small table the optimizer would rather scan it all,
//! locking every row), re-checking that they are still parked and not
//! discarded, and changes the rows it locked. The locking read never touches a row the
//! relays are about to claim: a claim (`FOR UPDATE SKIP LOCKED`) that met
//! such a lock would skip the row and could publish a later event of its
//! key first.

use sqlx::{MySql, MySqlPool, QueryBuilder};
use uuid::Uuid;

use super::{Selection, Table};
use crate::ops::database::{begin_mysql, json_ids};
use crate::ops::status::ProblemRow;
use crate::ops::{OpsError, PARKED_NOT_DISCARDED};

/// Outbox rows an operator may list, retry or discard (`t` is the outbox).
fn parked() -> String {
    format!("t.published_at IS NULL AND {PARKED_NOT_DISCARDED}")
}

/// The outbox is the one table with dead letters on this database.
fn outbox_only(table: Table) -> Result<(), OpsError> {
    match table {
        Table::Outbox => Ok(()),
        Table::Inbox => Err(OpsError::PostgresOnly {
            table: table.name(),
        }),
    }
}

/// Adds `AND <the selection>` to `query`, its values bound.
fn push_selection(query: &mut QueryBuilder<MySql>, selection: &Selection) {
    match selection {
        Selection::All => {}
        Selection::Ids(ids) if ids.is_empty() => {
            query.push(" AND FALSE");
        }
        Selection::Ids(ids) => {
            query.push(" AND t.id IN (");
            let mut values = query.separated(", ");
            for id in ids {
                values.push_bind(*id);
            }
            query.push(")");
        }
        Selection::EventIds(ids) if ids.is_empty() => {
            query.push(" AND FALSE");
        }
        Selection::EventIds(ids) => {
            query.push(" AND t.event_id IN (");
            let mut values = query.separated(", ");
            for id in ids {
                values.push_bind(*id);
            }
            query.push(")");
        }
        Selection::Topic(topic) => {
            query.push(" AND t.topic = ").push_bind(topic.clone());
        }
    }
}

/// `SELECT <columns> FROM outbox_event t WHERE <parked> AND <selection>`.
fn select(columns: &str, selection: &Selection) -> QueryBuilder<MySql> {
    let mut query = QueryBuilder::new(format!(
        "SELECT {columns} FROM outbox_event t WHERE {}",
        parked()
    ));
    push_selection(&mut query, selection);
    query
}

pub(super) async fn list(
    pool: &MySqlPool,
    table: Table,
    selection: &Selection,
    limit: i64,
) -> Result<Vec<ProblemRow>, OpsError> {
    outbox_only(table)?;
    let mut query = select(
        "t.id, t.event_id, t.topic, t.event_type, t.attempts, t.last_error,
         t.created_at AS written_at, t.parked_at, t.next_attempt_at",
        selection,
    );
    query
        .push(" ORDER BY t.parked_at, t.event_id LIMIT ")
        .push_bind(limit.max(0));
    Ok(query.build_query_as().fetch_all(pool).await?)
}

pub(super) async fn count(
    pool: &MySqlPool,
    table: Table,
    selection: &Selection,
) -> Result<i64, OpsError> {
    outbox_only(table)?;
    Ok(select("COUNT(*)", selection)
        .build_query_scalar()
        .fetch_one(pool)
        .await?)
}

pub(super) async fn retry(
    pool: &MySqlPool,
    table: Table,
    selection: &Selection,
) -> Result<Vec<Uuid>, OpsError> {
    update(
        pool,
        table,
        selection,
        "t.parked_at = NULL, t.attempts = 0, t.next_attempt_at = NULL",
    )
    .await
}

pub(super) async fn discard(
    pool: &MySqlPool,
    table: Table,
    selection: &Selection,
) -> Result<Vec<Uuid>, OpsError> {
    update(pool, table, selection, "t.discarded_at = UTC_TIMESTAMP(6)").await
}

/// Applies `set` to the matching parked rows; returns their event ids.
async fn update(
    pool: &MySqlPool,
    table: Table,
    selection: &Selection,
    set: &str,
) -> Result<Vec<Uuid>, OpsError> {
    outbox_only(table)?;
    // Which rows: a plain read, no locks.
    let candidates: Vec<i64> = select("t.id", selection)
        .push(" ORDER BY t.id")
        .build_query_scalar()
        .fetch_all(pool)
        .await?;
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let candidates = json_ids(&candidates);
    let parked = parked();
    let mut tx = begin_mysql(pool).await?;
    // Lock them by primary key, in id order, re-checking the condition:
    // waits for a relay's settlement that holds one (as PostgreSQL's
    // UPDATE does), and leaves out a row retried or discarded meanwhile.
    let locked: Vec<(i64, Uuid)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT t.id, t.event_id
         FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) f
              STRAIGHT_JOIN outbox_event t FORCE INDEX (PRIMARY) ON t.id = f.id
         WHERE {parked}
         ORDER BY t.id
         FOR UPDATE"
    )))
    .bind(&candidates)
    .fetch_all(&mut *tx)
    .await?;
    let ids: Vec<i64> = locked.iter().map(|(id, _)| *id).collect();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) f
             STRAIGHT_JOIN outbox_event t FORCE INDEX (PRIMARY) ON t.id = f.id
         SET {set}
         WHERE {parked}"
    )))
    .bind(json_ids(&ids))
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(locked.into_iter().map(|(_, event_id)| event_id).collect())
}

pub(super) async fn topic_exists(
    pool: &MySqlPool,
    table: Table,
    topic: &str,
) -> Result<bool, OpsError> {
    outbox_only(table)?;
    let found: Option<i64> =
        sqlx::query_scalar("SELECT 1 FROM outbox_event WHERE topic = ? LIMIT 1")
            .bind(topic)
            .fetch_optional(pool)
            .await?;
    Ok(found.is_some())
}
