//! Retention on MariaDB (feature `mysql`): published and discarded
//! `outbox_event` rows; the consumer tables are not on this database.
//!
//! One batch is three statements. A plain read (no locks) chooses the next
//! `batch_size` eligible rows, walking `ix_outbox_event_unpublished
//! (published_at, id)` from where the previous batch stopped: published rows
//! in `(published_at, id)` order (the index range below the cutoff holds
//! published rows only), discarded ones in id order among the unpublished
//! (the index's NULL head). Then one `READ COMMITTED` transaction locks
//! those rows by primary key (forced: on a small table the optimizer would
//! rather scan it all, locking every row) with `FOR UPDATE SKIP LOCKED`,
//! re-checking the condition, and deletes the rows it locked. The locks are taken on the
//! chosen rows only: InnoDB locks every row a locking read examines before
//! the server filters it, so a locking scan of the unpublished rows would
//! hold, for a moment, rows a relay is about to claim, and its claim (`SKIP
//! LOCKED`) would pass over them.

use chrono::{DateTime, Utc};
use sqlx::MySqlPool;

use super::{Target, TargetSql};
use crate::ops::OpsError;
use crate::ops::database::{begin_mysql, json_ids};

/// Where a MariaDB pass stopped: the last row of the previous batch.
#[derive(Debug, Clone)]
pub(super) struct Position {
    /// Its `published_at` (`None` for a discarded row, never published).
    published_at: Option<DateTime<Utc>>,
    id: i64,
}

/// What one batch did.
pub(super) struct Batch {
    /// Rows chosen: fewer than the batch size once the pass reached the end.
    pub chosen: i64,
    /// Rows deleted (fewer than chosen when another transaction held some,
    /// or one changed meanwhile).
    pub deleted: u64,
    /// Where the next batch starts.
    pub last: Option<Position>,
}

/// The condition of `target` on this database (alias `t`, `?` the cutoff),
/// or the error for a table it does not have.
fn condition(target: Target) -> Result<&'static str, OpsError> {
    match target {
        Target::PublishedOutbox => Ok("t.published_at < ? AND t.parked_at IS NULL"),
        // A discarded row is always parked, and never published.
        Target::DiscardedOutbox => {
            Ok("t.discarded_at < ? AND t.published_at IS NULL AND t.parked_at IS NOT NULL")
        }
        Target::ProcessedEvent
        | Target::ProcessedInbox
        | Target::DiscardedInbox
        | Target::FinishedSaga => {
            let TargetSql { table, .. } = target.sql();
            Err(OpsError::PostgresOnly { table })
        }
    }
}

pub(super) fn check(target: Target) -> Result<(), OpsError> {
    condition(target).map(|_| ())
}

pub(super) async fn count(
    pool: &MySqlPool,
    target: Target,
    cutoff: DateTime<Utc>,
) -> Result<i64, OpsError> {
    let condition = condition(target)?;
    Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM outbox_event t WHERE {condition}"
    )))
    .bind(cutoff)
    .fetch_one(pool)
    .await?)
}

pub(super) async fn step(
    pool: &MySqlPool,
    target: Target,
    cutoff: DateTime<Utc>,
    batch_size: i64,
    after: Option<&Position>,
) -> Result<Batch, OpsError> {
    let condition = condition(target)?;
    let chosen = choose(pool, target, condition, cutoff, batch_size, after).await?;
    let Some((last_id, last_published_at)) = chosen.last().copied() else {
        return Ok(Batch {
            chosen: 0,
            deleted: 0,
            last: None,
        });
    };
    let ids: Vec<i64> = chosen.iter().map(|(id, _)| *id).collect();
    let mut tx = begin_mysql(pool).await?;
    let locked: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT t.id
         FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) f
              STRAIGHT_JOIN outbox_event t FORCE INDEX (PRIMARY) ON t.id = f.id
         WHERE {condition}
         ORDER BY t.id
         FOR UPDATE SKIP LOCKED"
    )))
    .bind(json_ids(&ids))
    .bind(cutoff)
    .fetch_all(&mut *tx)
    .await?;
    let deleted = if locked.is_empty() {
        0
    } else {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE t FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) f
                 STRAIGHT_JOIN outbox_event t FORCE INDEX (PRIMARY) ON t.id = f.id
             WHERE {condition}"
        )))
        .bind(json_ids(&locked))
        .bind(cutoff)
        .execute(&mut *tx)
        .await?
        .rows_affected()
    };
    tx.commit().await?;
    Ok(Batch {
        chosen: chosen.len() as i64,
        deleted,
        last: Some(Position {
            published_at: last_published_at,
            id: last_id,
        }),
    })
}

/// The next `batch_size` eligible rows after `after`, in the walk's order:
/// `(id, published_at)`.
async fn choose(
    pool: &MySqlPool,
    target: Target,
    condition: &str,
    cutoff: DateTime<Utc>,
    batch_size: i64,
    after: Option<&Position>,
) -> Result<Vec<(i64, Option<DateTime<Utc>>)>, OpsError> {
    let published = target == Target::PublishedOutbox;
    let (keyset, order) = match (published, after) {
        (true, None) => ("", "t.published_at, t.id"),
        (true, Some(_)) => (
            " AND (t.published_at > ? OR (t.published_at = ? AND t.id > ?))",
            "t.published_at, t.id",
        ),
        (false, None) => ("", "t.id"),
        (false, Some(_)) => (" AND t.id > ?", "t.id"),
    };
    let mut query = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT t.id, t.published_at FROM outbox_event t
         WHERE {condition}{keyset}
         ORDER BY {order} LIMIT ?"
    )))
    .bind(cutoff);
    if let Some(after) = after {
        if published {
            query = query.bind(after.published_at).bind(after.published_at);
        }
        query = query.bind(after.id);
    }
    Ok(query.bind(batch_size).fetch_all(pool).await?)
}
