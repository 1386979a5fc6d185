//! Retention on MariaDB (feature `mysql`): published and discarded
//! `outbox_event` rows, `processed_event` dedup rows (MySQL migration
//! 0004), processed and discarded `inbox_event` rows (0005), finished
//! sagas (`saga_state`, 0006).
//!
//! One batch is three statements. A plain read (no locks) chooses the next
//! `batch_size` eligible rows, walking an index from where the previous
//! batch stopped:
//!
//! - published outbox rows in `(published_at, id)` order on
//!   `ix_outbox_event_unpublished (published_at, parked_at, id)` (the
//!   index range below the cutoff holds published rows only, whose
//!   `parked_at` is NULL, so they come in `(published_at, id)` order),
//!   discarded ones in id order among the unpublished (the index's NULL
//!   head);
//! - dedup rows in `(processed_at, consumer_group, event_id)` order on
//!   `ix_processed_event_processed_at` (the primary key completes it);
//! - inbox rows group by group on `ix_inbox_event_group_processed
//!   (consumer_group, processed, processed_at)`: processed ones in
//!   `(processed_at, event_id)` order below the cutoff, discarded ones by
//!   event id among the group's unprocessed rows;
//! - finished sagas in `(finished_at, saga_type, saga_id)` order on
//!   `ix_saga_state_finished (finished_at)` (the primary key completes
//!   it; running sagas, `finished_at` NULL, are its head, before any
//!   cutoff).
//!
//! Every walk's position is the whole of its order, primary key included,
//! so no batch passes over a row that shares a part of its key with the
//! previous batch's last row (an event id in two consumer groups, say).
//!
//! Then one `READ COMMITTED` transaction locks those rows by primary key
//! (forced: on a small table the optimizer would rather scan it all,
//! locking every row) with `FOR UPDATE SKIP LOCKED`, re-checking the
//! condition, and deletes the rows it locked. The locks are taken on the
//! chosen rows only: InnoDB locks every row a locking read examines before
//! the server filters it, so a locking scan of the unpublished rows would
//! hold, for a moment, rows a relay is about to claim, and its claim (`SKIP
//! LOCKED`) would pass over them; the same holds for the inbox's pending
//! rows and its processors' claims.

use chrono::{DateTime, Utc};
use sqlx::{MySql, MySqlPool, QueryBuilder};
use uuid::Uuid;

use super::Target;
use crate::ops::OpsError;
use crate::ops::database::{
    JSON_KEYS, begin_mysql, hex, inbox_groups, json_ids, json_keys, push_groups,
};

/// Where a MariaDB pass stopped: the last row of the previous batch.
#[derive(Debug, Clone)]
pub(super) enum Position {
    /// An outbox row: its `published_at` (`None` for a discarded row,
    /// never published) and id.
    Outbox {
        published_at: Option<DateTime<Utc>>,
        id: i64,
    },
    /// A dedup row.
    Processed {
        processed_at: DateTime<Utc>,
        group: Vec<u8>,
        event_id: Uuid,
    },
    /// An inbox row (`processed_at` is `None` for a discarded one, never
    /// processed).
    Inbox {
        group: Vec<u8>,
        processed_at: Option<DateTime<Utc>>,
        event_id: Uuid,
    },
    /// A finished saga.
    Saga {
        finished_at: DateTime<Utc>,
        saga_type: Vec<u8>,
        saga_id: Vec<u8>,
    },
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

/// The table and condition of `target` on this database (alias `t`, `?`
/// the cutoff).
fn condition(target: Target) -> (&'static str, &'static str) {
    match target {
        Target::PublishedOutbox => ("outbox_event", "t.published_at < ? AND t.parked_at IS NULL"),
        // A discarded row is always parked, and never published.
        Target::DiscardedOutbox => (
            "outbox_event",
            "t.discarded_at < ? AND t.published_at IS NULL AND t.parked_at IS NOT NULL",
        ),
        Target::ProcessedEvent => ("processed_event", "t.processed_at < ?"),
        Target::ProcessedInbox => ("inbox_event", "t.processed = TRUE AND t.processed_at < ?"),
        // A discarded row is always parked: saying so keeps a row that
        // was (wrongly) made pending again, which its key's entry in
        // `inbox_key` may point at.
        Target::DiscardedInbox => (
            "inbox_event",
            "t.discarded_at < ? AND t.processed = FALSE AND t.parked_at IS NOT NULL",
        ),
        // A running saga has no `finished_at`.
        Target::FinishedSaga => ("saga_state", "t.finished_at < ?"),
    }
}

/// Pushes `condition` to `query` with `cutoff` bound at its one `?`.
fn push_condition(query: &mut QueryBuilder<MySql>, condition: &str, cutoff: DateTime<Utc>) {
    let (before, after) = condition
        .split_once('?')
        .expect("every condition has the cutoff");
    query.push(before).push_bind(cutoff).push(after);
}

pub(super) async fn count(
    pool: &MySqlPool,
    target: Target,
    cutoff: DateTime<Utc>,
) -> Result<i64, OpsError> {
    let (table, condition) = condition(target);
    let mut query = QueryBuilder::<MySql>::new("SELECT COUNT(*) FROM ");
    if table == "inbox_event" {
        // Each group's rows of the target only, through the index.
        let groups = inbox_groups(pool).await?;
        query.push("inbox_event t FORCE INDEX (ix_inbox_event_group_processed) WHERE ");
        push_groups(&mut query, &groups);
        query.push(" AND ");
    } else {
        query.push(table).push(" t WHERE ");
    }
    push_condition(&mut query, condition, cutoff);
    Ok(query.build_query_scalar().fetch_one(pool).await?)
}

pub(super) async fn step(
    pool: &MySqlPool,
    target: Target,
    cutoff: DateTime<Utc>,
    batch_size: i64,
    after: Option<&Position>,
) -> Result<Batch, OpsError> {
    let (table, condition) = condition(target);
    match table {
        "outbox_event" => step_outbox(pool, target, condition, cutoff, batch_size, after).await,
        "saga_state" => step_sagas(pool, condition, cutoff, batch_size, after).await,
        _ => step_keyed(pool, target, table, condition, cutoff, batch_size, after).await,
    }
}

async fn step_outbox(
    pool: &MySqlPool,
    target: Target,
    condition: &str,
    cutoff: DateTime<Utc>,
    batch_size: i64,
    after: Option<&Position>,
) -> Result<Batch, OpsError> {
    let after = match after {
        Some(Position::Outbox { published_at, id }) => Some((*published_at, *id)),
        _ => None,
    };
    let chosen = choose_outbox(pool, target, condition, cutoff, batch_size, after).await?;
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
        last: Some(Position::Outbox {
            published_at: last_published_at,
            id: last_id,
        }),
    })
}

/// The next `batch_size` eligible outbox rows after `after`, in the walk's
/// order: `(id, published_at)`.
async fn choose_outbox(
    pool: &MySqlPool,
    target: Target,
    condition: &str,
    cutoff: DateTime<Utc>,
    batch_size: i64,
    after: Option<(Option<DateTime<Utc>>, i64)>,
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
    if let Some((published_at, id)) = after {
        if published {
            query = query.bind(published_at).bind(published_at);
        }
        query = query.bind(id);
    }
    Ok(query.bind(batch_size).fetch_all(pool).await?)
}

/// A chosen row of a table keyed by `(consumer_group, event_id)`, with the
/// column its walk orders by (`processed_at`).
type Chosen = (Vec<u8>, Uuid, Option<DateTime<Utc>>);

/// A batch of `processed_event` or `inbox_event`, whose primary key is
/// `(consumer_group, event_id)`.
async fn step_keyed(
    pool: &MySqlPool,
    target: Target,
    table: &str,
    condition: &str,
    cutoff: DateTime<Utc>,
    batch_size: i64,
    after: Option<&Position>,
) -> Result<Batch, OpsError> {
    let chosen = if table == "processed_event" {
        choose_processed(pool, condition, cutoff, batch_size, after).await?
    } else {
        choose_inbox(pool, target, condition, cutoff, batch_size, after).await?
    };
    let Some((group, event_id, processed_at)) = chosen.last().cloned() else {
        return Ok(Batch {
            chosen: 0,
            deleted: 0,
            last: None,
        });
    };
    let last = if table == "processed_event" {
        Position::Processed {
            processed_at: processed_at.unwrap_or_default(),
            group,
            event_id,
        }
    } else {
        Position::Inbox {
            group,
            processed_at,
            event_id,
        }
    };
    // Locked in primary-key order.
    let mut keys: Vec<(&[u8], Uuid)> = chosen.iter().map(|(g, e, _)| (g.as_slice(), *e)).collect();
    keys.sort_unstable();
    let mut tx = begin_mysql(pool).await?;
    let locked: Vec<(Vec<u8>, Uuid)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT t.consumer_group, t.event_id
         FROM {JSON_KEYS}
              STRAIGHT_JOIN {table} t FORCE INDEX (PRIMARY)
              ON t.consumer_group = UNHEX(f.g) AND t.event_id = UNHEX(f.e)
         WHERE {condition}
         FOR UPDATE SKIP LOCKED"
    )))
    .bind(json_keys(keys))
    .bind(cutoff)
    .fetch_all(&mut *tx)
    .await?;
    let deleted = if locked.is_empty() {
        0
    } else {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE t FROM {JSON_KEYS}
                 STRAIGHT_JOIN {table} t FORCE INDEX (PRIMARY)
                 ON t.consumer_group = UNHEX(f.g) AND t.event_id = UNHEX(f.e)
             WHERE {condition}"
        )))
        .bind(json_keys(locked.iter().map(|(g, e)| (g.as_slice(), *e))))
        .bind(cutoff)
        .execute(&mut *tx)
        .await?
        .rows_affected()
    };
    tx.commit().await?;
    Ok(Batch {
        chosen: chosen.len() as i64,
        deleted,
        last: Some(last),
    })
}

/// The next `batch_size` dedup rows processed before the cutoff, after
/// `after`, in `(processed_at, consumer_group, event_id)` order: the order
/// of `ix_processed_event_processed_at`, whose entries end with the
/// primary key.
async fn choose_processed(
    pool: &MySqlPool,
    condition: &str,
    cutoff: DateTime<Utc>,
    batch_size: i64,
    after: Option<&Position>,
) -> Result<Vec<Chosen>, OpsError> {
    let mut query = QueryBuilder::<MySql>::new(
        "SELECT t.consumer_group, t.event_id, t.processed_at
         FROM processed_event t FORCE INDEX (ix_processed_event_processed_at)
         WHERE ",
    );
    push_condition(&mut query, condition, cutoff);
    if let Some(Position::Processed {
        processed_at,
        group,
        event_id,
    }) = after
    {
        query
            .push(" AND (t.processed_at > ")
            .push_bind(*processed_at)
            .push(" OR (t.processed_at = ")
            .push_bind(*processed_at)
            .push(" AND (t.consumer_group > ")
            .push_bind(group.as_slice())
            .push(" OR (t.consumer_group = ")
            .push_bind(group.as_slice())
            .push(" AND t.event_id > ")
            .push_bind(*event_id)
            .push("))))");
    }
    query
        .push(" ORDER BY t.processed_at, t.consumer_group, t.event_id LIMIT ")
        .push_bind(batch_size);
    Ok(query.build_query_as().fetch_all(pool).await?)
}

/// The next `batch_size` inbox rows of `target` after `after`: group by
/// group (from the position's), each group's range of
/// `ix_inbox_event_group_processed`.
async fn choose_inbox(
    pool: &MySqlPool,
    target: Target,
    condition: &str,
    cutoff: DateTime<Utc>,
    batch_size: i64,
    after: Option<&Position>,
) -> Result<Vec<Chosen>, OpsError> {
    let after = match after {
        Some(Position::Inbox {
            group,
            processed_at,
            event_id,
        }) => Some((group.as_slice(), *processed_at, *event_id)),
        _ => None,
    };
    let groups = inbox_groups(pool).await?;
    let processed = target == Target::ProcessedInbox;
    let order = if processed {
        "t.processed_at, t.event_id"
    } else {
        "t.event_id"
    };
    let mut chosen: Vec<Chosen> = Vec::new();
    for group in groups {
        let resume = match after {
            Some((last, ..)) if group.as_slice() < last => continue,
            Some((last, processed_at, event_id)) if group.as_slice() == last => {
                Some((processed_at, event_id))
            }
            _ => None,
        };
        let want = batch_size - chosen.len() as i64;
        if want <= 0 {
            break;
        }
        let mut query = QueryBuilder::<MySql>::new(
            "SELECT t.consumer_group, t.event_id, t.processed_at
             FROM inbox_event t FORCE INDEX (ix_inbox_event_group_processed)
             WHERE t.consumer_group = ",
        );
        query.push_bind(group.as_slice()).push(" AND ");
        push_condition(&mut query, condition, cutoff);
        match resume {
            Some((processed_at, event_id)) if processed => {
                query
                    .push(" AND (t.processed_at > ")
                    .push_bind(processed_at)
                    .push(" OR (t.processed_at = ")
                    .push_bind(processed_at)
                    .push(" AND t.event_id > ")
                    .push_bind(event_id)
                    .push("))");
            }
            Some((_, event_id)) => {
                query.push(" AND t.event_id > ").push_bind(event_id);
            }
            None => {}
        }
        query
            .push(format!(" ORDER BY {order} LIMIT "))
            .push_bind(want);
        let rows: Vec<Chosen> = query.build_query_as().fetch_all(pool).await?;
        chosen.extend(rows);
    }
    Ok(chosen)
}

/// A chosen finished saga: `(saga_type, saga_id, finished_at)`.
type ChosenSaga = (Vec<u8>, Vec<u8>, DateTime<Utc>);

/// The rows of a [`json_pairs`] list of saga keys (alias `f`, columns `g`
/// the type and `e` the id, in hexadecimal): join on `t.saga_type =
/// UNHEX(f.g) AND t.saga_id = UNHEX(f.e)`.
const JSON_SAGA_KEYS: &str = "JSON_TABLE(?, '$[*]' COLUMNS (
             g VARCHAR(510) CHARACTER SET ascii PATH '$[0]',
             e VARCHAR(2048) CHARACTER SET ascii PATH '$[1]')) f";

/// Saga keys `(saga_type, saga_id)` as a JSON array of hexadecimal pairs,
/// for [`JSON_SAGA_KEYS`].
fn json_pairs<'a>(keys: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> String {
    let pairs: Vec<[String; 2]> = keys
        .into_iter()
        .map(|(saga_type, saga_id)| [hex(saga_type), hex(saga_id)])
        .collect();
    serde_json::to_string(&pairs).expect("strings serialize")
}

/// A batch of finished sagas: chosen in `(finished_at, saga_type,
/// saga_id)` order after `after`, locked by primary key `SKIP LOCKED`
/// (a saga whose step holds its row, even one the finished saga ignores,
/// is left to a later run) and deleted.
async fn step_sagas(
    pool: &MySqlPool,
    condition: &str,
    cutoff: DateTime<Utc>,
    batch_size: i64,
    after: Option<&Position>,
) -> Result<Batch, OpsError> {
    let mut query = QueryBuilder::<MySql>::new(
        "SELECT t.saga_type, t.saga_id, t.finished_at
         FROM saga_state t FORCE INDEX (ix_saga_state_finished)
         WHERE ",
    );
    push_condition(&mut query, condition, cutoff);
    if let Some(Position::Saga {
        finished_at,
        saga_type,
        saga_id,
    }) = after
    {
        query
            .push(" AND (t.finished_at > ")
            .push_bind(*finished_at)
            .push(" OR (t.finished_at = ")
            .push_bind(*finished_at)
            .push(" AND (t.saga_type > ")
            .push_bind(saga_type.as_slice())
            .push(" OR (t.saga_type = ")
            .push_bind(saga_type.as_slice())
            .push(" AND t.saga_id > ")
            .push_bind(saga_id.as_slice())
            .push("))))");
    }
    query
        .push(" ORDER BY t.finished_at, t.saga_type, t.saga_id LIMIT ")
        .push_bind(batch_size);
    let chosen: Vec<ChosenSaga> = query.build_query_as().fetch_all(pool).await?;
    let Some((saga_type, saga_id, finished_at)) = chosen.last().cloned() else {
        return Ok(Batch {
            chosen: 0,
            deleted: 0,
            last: None,
        });
    };
    // Locked in primary-key order.
    let mut keys: Vec<(&[u8], &[u8])> = chosen
        .iter()
        .map(|(t, i, _)| (t.as_slice(), i.as_slice()))
        .collect();
    keys.sort_unstable();
    let mut tx = begin_mysql(pool).await?;
    let locked: Vec<(Vec<u8>, Vec<u8>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT t.saga_type, t.saga_id
         FROM {JSON_SAGA_KEYS}
              STRAIGHT_JOIN saga_state t FORCE INDEX (PRIMARY)
              ON t.saga_type = UNHEX(f.g) AND t.saga_id = UNHEX(f.e)
         WHERE {condition}
         FOR UPDATE SKIP LOCKED"
    )))
    .bind(json_pairs(keys))
    .bind(cutoff)
    .fetch_all(&mut *tx)
    .await?;
    let deleted = if locked.is_empty() {
        0
    } else {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE t FROM {JSON_SAGA_KEYS}
                 STRAIGHT_JOIN saga_state t FORCE INDEX (PRIMARY)
                 ON t.saga_type = UNHEX(f.g) AND t.saga_id = UNHEX(f.e)
             WHERE {condition}"
        )))
        .bind(json_pairs(
            locked.iter().map(|(t, i)| (t.as_slice(), i.as_slice())),
        ))
        .bind(cutoff)
        .execute(&mut *tx)
        .await?
        .rows_affected()
    };
    tx.commit().await?;
    Ok(Batch {
        chosen: chosen.len() as i64,
        deleted,
        last: Some(Position::Saga {
            finished_at,
            saga_type,
            saga_id,
        }),
    })
}
