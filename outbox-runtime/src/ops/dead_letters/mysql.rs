//! Dead letters on MariaDB (feature `mysql`): the parked rows of
//! `outbox_event` and of `inbox_event` (MySQL migration 0005).
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
//!
//! The inbox has one more thing to keep: MySQL has no triggers, so the
//! `inbox_key` entry of a retried row's key (its head: its oldest pending
//! row) is moved back here, in the same transaction, with the consumer's
//! own statements ([`move_heads`], and an entry of its own for a row
//! without a key). A processor that is handling the key's current head
//! would, at its commit, move the head on from that row and pass over the
//! retried one, older: so the retry first locks each key's current head
//! row (waiting for such a processor; a claim skips a locked head), until
//! the heads it holds are the keys' heads. A discard changes no pending
//! row: a parked row has no entry.

use std::collections::{BTreeMap, HashMap, HashSet};

use sqlx::{MySql, MySqlConnection, MySqlPool, QueryBuilder};
use uuid::Uuid;

use super::{Selection, Table};
use crate::consumer::inbox::mysql::{KeyFrom, move_heads};
use crate::ops::database::{
    JSON_KEYS, begin_mysql, hex, inbox_groups, json_ids, json_keys, push_groups,
};
use crate::ops::status::ProblemRow;
use crate::ops::{OpsError, PARKED_NOT_DISCARDED};

/// Rows an operator may list, retry or discard (`t` is the table).
fn parked(table: Table) -> String {
    let unfinished = match table {
        Table::Outbox => "t.published_at IS NULL",
        Table::Inbox => "t.processed = FALSE",
    };
    format!("{unfinished} AND {PARKED_NOT_DISCARDED}")
}

/// Adds `AND <the selection>` to `query`, its values bound; inbox rows
/// have no numeric id.
fn push_selection(
    query: &mut QueryBuilder<MySql>,
    table: Table,
    selection: &Selection,
) -> Result<(), OpsError> {
    match selection {
        Selection::All => {}
        Selection::Ids(_) if table == Table::Inbox => return Err(OpsError::InboxRowsHaveNoId),
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
    Ok(())
}

/// `SELECT <columns> FROM <table> t WHERE <parked> AND <selection>`. The
/// inbox is read through `ix_inbox_event_group_processed`, each group's
/// unprocessed rows only (`groups`: [`inbox_groups`]).
fn select(
    columns: &str,
    table: Table,
    selection: &Selection,
    groups: &[Vec<u8>],
) -> Result<QueryBuilder<MySql>, OpsError> {
    let mut query = match table {
        Table::Outbox => QueryBuilder::new(format!(
            "SELECT {columns} FROM outbox_event t WHERE {}",
            parked(table)
        )),
        Table::Inbox => {
            let mut query = QueryBuilder::new(format!(
                "SELECT {columns} FROM inbox_event t
                 FORCE INDEX (ix_inbox_event_group_processed) WHERE "
            ));
            push_groups(&mut query, groups);
            query.push(format!(" AND {}", parked(table)));
            query
        }
    };
    push_selection(&mut query, table, selection)?;
    Ok(query)
}

/// The groups [`select`] reads: none needed for the outbox.
async fn groups(pool: &MySqlPool, table: Table) -> Result<Vec<Vec<u8>>, OpsError> {
    Ok(match table {
        Table::Outbox => Vec::new(),
        Table::Inbox => inbox_groups(pool).await?,
    })
}

pub(super) async fn list(
    pool: &MySqlPool,
    table: Table,
    selection: &Selection,
    limit: i64,
) -> Result<Vec<ProblemRow>, OpsError> {
    let columns = match table {
        Table::Outbox => {
            "t.id, t.event_id, t.topic, t.event_type, t.attempts, t.last_error,
             t.created_at AS written_at, t.parked_at, t.next_attempt_at"
        }
        Table::Inbox => {
            "CAST(NULL AS SIGNED) AS id, t.event_id, t.topic, t.event_type, t.attempts,
             t.last_error, t.received_at AS written_at, t.parked_at, t.next_attempt_at"
        }
    };
    let groups = groups(pool, table).await?;
    let mut query = select(columns, table, selection, &groups)?;
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
    let groups = groups(pool, table).await?;
    Ok(select("COUNT(*)", table, selection, &groups)?
        .build_query_scalar()
        .fetch_one(pool)
        .await?)
}

/// What a retry sets.
const RETRY: &str = "t.parked_at = NULL, t.attempts = 0, t.next_attempt_at = NULL";

/// What a discard sets.
const DISCARD: &str = "t.discarded_at = UTC_TIMESTAMP(6)";

pub(super) async fn retry(
    pool: &MySqlPool,
    table: Table,
    selection: &Selection,
) -> Result<Vec<Uuid>, OpsError> {
    match table {
        Table::Outbox => update_outbox(pool, selection, RETRY).await,
        Table::Inbox => update_inbox(pool, selection, RETRY, true).await,
    }
}

pub(super) async fn discard(
    pool: &MySqlPool,
    table: Table,
    selection: &Selection,
) -> Result<Vec<Uuid>, OpsError> {
    match table {
        Table::Outbox => update_outbox(pool, selection, DISCARD).await,
        Table::Inbox => update_inbox(pool, selection, DISCARD, false).await,
    }
}

/// Applies `set` to the matching parked outbox rows; returns their event
/// ids.
async fn update_outbox(
    pool: &MySqlPool,
    selection: &Selection,
    set: &str,
) -> Result<Vec<Uuid>, OpsError> {
    // Which rows: a plain read, no locks.
    let candidates: Vec<i64> = select("t.id", Table::Outbox, selection, &[])?
        .push(" ORDER BY t.id")
        .build_query_scalar()
        .fetch_all(pool)
        .await?;
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let candidates = json_ids(&candidates);
    let parked = parked(Table::Outbox);
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

/// A parked inbox row locked for a retry or a discard.
#[derive(sqlx::FromRow)]
struct LockedRow {
    consumer_group: Vec<u8>,
    event_id: Uuid,
    seq: i64,
    topic: Option<String>,
    partition_key: Option<Vec<u8>>,
    event_type: Option<String>,
}

/// Applies `set` to the matching parked inbox rows (and, for a retry,
/// mends their keys' entries: `pending`); returns their event ids.
async fn update_inbox(
    pool: &MySqlPool,
    selection: &Selection,
    set: &str,
    pending: bool,
) -> Result<Vec<Uuid>, OpsError> {
    let groups = inbox_groups(pool).await?;
    // Which rows: a plain read, no locks, in primary-key order.
    let candidates: Vec<(Vec<u8>, Uuid)> = select(
        "t.consumer_group, t.event_id",
        Table::Inbox,
        selection,
        &groups,
    )?
    .push(" ORDER BY t.consumer_group, t.event_id")
    .build_query_as()
    .fetch_all(pool)
    .await?;
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let candidates = json_keys(candidates.iter().map(|(g, e)| (g.as_slice(), *e)));
    let parked = parked(Table::Inbox);
    let mut tx = begin_mysql(pool).await?;
    // Lock them by primary key, in its order, re-checking the condition: a
    // processor that is parking one right now holds it until its commit.
    let locked: Vec<LockedRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT t.consumer_group, t.event_id, t.seq, t.topic, t.partition_key, t.event_type
         FROM {JSON_KEYS}
              STRAIGHT_JOIN inbox_event t FORCE INDEX (PRIMARY)
              ON t.consumer_group = UNHEX(f.g) AND t.event_id = UNHEX(f.e)
         WHERE {parked}
         FOR UPDATE"
    )))
    .bind(&candidates)
    .fetch_all(&mut *tx)
    .await?;
    if locked.is_empty() {
        tx.commit().await?;
        return Ok(Vec::new());
    }
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {JSON_KEYS}
             STRAIGHT_JOIN inbox_event t FORCE INDEX (PRIMARY)
             ON t.consumer_group = UNHEX(f.g) AND t.event_id = UNHEX(f.e)
         SET {set}
         WHERE {parked}"
    )))
    .bind(json_keys(
        locked
            .iter()
            .map(|r| (r.consumer_group.as_slice(), r.event_id)),
    ))
    .execute(&mut *tx)
    .await?;
    if pending {
        mend_keys(&mut tx, &locked).await?;
    }
    tx.commit().await?;
    Ok(locked.into_iter().map(|row| row.event_id).collect())
}

/// Makes the `inbox_key` entries of the rows a retry made pending again
/// point at them, group by group (each in key order, as every processor
/// locks entries): a key's entry moves back to its oldest pending row (a
/// retried row is older than the key's current head, or the key has no
/// entry), a row without a key gets an entry of its own. A row without a
/// topic gets none, as on PostgreSQL: no processor could claim it.
async fn mend_keys(conn: &mut MySqlConnection, rows: &[LockedRow]) -> Result<(), OpsError> {
    type Keys = BTreeMap<(String, Vec<u8>), i64>;
    let mut groups: BTreeMap<&[u8], (Keys, Vec<&LockedRow>)> = BTreeMap::new();
    for row in rows {
        let Some(topic) = &row.topic else { continue };
        let (keys, keyless) = groups.entry(&row.consumer_group).or_default();
        match &row.partition_key {
            Some(key) => {
                let from = keys.entry((topic.clone(), key.clone())).or_insert(row.seq);
                *from = (*from).min(row.seq);
            }
            None => keyless.push(row),
        }
    }
    for (group, (keys, keyless)) in groups {
        let group_id = String::from_utf8(group.to_vec())
            .map_err(|e| OpsError::Database(sqlx::Error::Decode(Box::new(e))))?;
        if !keys.is_empty() {
            let heads = hold_heads(conn, group, &keys).await?;
            // From the retried row, or from the key's current head when
            // that is older (a row retried before, still pending): the
            // head is the oldest pending row at or after it.
            let keys: Vec<KeyFrom> = keys
                .into_iter()
                .map(|((topic, key), seq)| {
                    let head = heads.get(&(topic.clone(), key.clone())).copied();
                    KeyFrom {
                        from_seq: head.map_or(seq, |head| head.min(seq)),
                        topic,
                        key,
                    }
                })
                .collect();
            move_heads(conn, &group_id, &keys).await?;
        }
        for chunk in keyless.chunks(1_000) {
            let mut insert = QueryBuilder::<MySql>::new(
                "INSERT INTO inbox_key
                     (consumer_group, topic, partition_key, head_seq, head_event_type, not_before) ",
            );
            insert.push_values(chunk, |mut values, row| {
                values
                    .push_bind(group)
                    .push_bind(row.topic.as_deref())
                    .push("NULL")
                    .push_bind(row.seq)
                    .push_bind(row.event_type.as_deref())
                    .push("NULL");
            });
            insert.push(
                " ON DUPLICATE KEY UPDATE head_event_type = VALUES(head_event_type),
                     not_before = NULL",
            );
            insert.build().execute(&mut *conn).await?;
        }
    }
    Ok(())
}

/// Most rounds [`hold_heads`] waits for processors that move a key's head
/// while it waits; past them the retry goes on with the heads it holds.
const HOLD_ROUNDS: usize = 10;

/// Locks the inbox row each key of `keys` has as its head (`FOR UPDATE`,
/// waiting for a processor that handles it), again for a head that moved
/// meanwhile, until every key's head is held; returns the heads, by key
/// (a key without an entry has no pending row, and no processor at it).
async fn hold_heads(
    conn: &mut MySqlConnection,
    group: &[u8],
    keys: &BTreeMap<(String, Vec<u8>), i64>,
) -> Result<HashMap<(String, Vec<u8>), i64>, OpsError> {
    #[derive(serde::Serialize)]
    struct Pair<'a>(&'a str, String);
    let pairs: Vec<Pair<'_>> = keys
        .keys()
        .map(|(topic, key)| Pair(topic, hex(key)))
        .collect();
    let pairs = serde_json::to_string(&pairs).expect("strings serialize");
    let mut held: HashSet<i64> = HashSet::new();
    for round in 1..=HOLD_ROUNDS {
        let heads: Vec<(String, Vec<u8>, i64)> = sqlx::query_as(
            "SELECT k.topic, k.partition_key, k.head_seq
             FROM JSON_TABLE(?, '$[*]' COLUMNS (
                      topic VARCHAR(249) CHARACTER SET ascii COLLATE ascii_bin PATH '$[0]',
                      pk VARCHAR(2048) CHARACTER SET ascii PATH '$[1]')) f
                  STRAIGHT_JOIN inbox_key k FORCE INDEX (ux_inbox_key)
                  ON k.consumer_group = ? AND k.topic = f.topic
                     AND k.partition_key = UNHEX(f.pk)",
        )
        .bind(&pairs)
        .bind(group)
        .fetch_all(&mut *conn)
        .await?;
        let mut fresh: Vec<i64> = heads
            .iter()
            .map(|(_, _, seq)| *seq)
            .filter(|seq| !held.contains(seq))
            .collect();
        if fresh.is_empty() || round == HOLD_ROUNDS {
            return Ok(heads
                .into_iter()
                .map(|(topic, key, seq)| ((topic, key), seq))
                .collect());
        }
        fresh.sort_unstable();
        sqlx::query(
            "SELECT t.seq
             FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) f
                  STRAIGHT_JOIN inbox_event t FORCE INDEX (ux_inbox_event_seq) ON t.seq = f.id
             FOR UPDATE",
        )
        .bind(json_ids(&fresh))
        .execute(&mut *conn)
        .await?;
        held.extend(fresh);
    }
    unreachable!("the last round returns")
}

pub(super) async fn topic_exists(
    pool: &MySqlPool,
    table: Table,
    topic: &str,
) -> Result<bool, OpsError> {
    let found: Option<i64> = match table {
        Table::Outbox => {
            sqlx::query_scalar("SELECT 1 FROM outbox_event WHERE topic = ? LIMIT 1")
                .bind(topic)
                .fetch_optional(pool)
                .await?
        }
        Table::Inbox => {
            // Through `ix_inbox_event_key_pending (consumer_group, topic, ..)`
            // (forced: InnoDB's estimates can make the optimizer prefer the
            // whole primary key), one probe per group.
            let groups = inbox_groups(pool).await?;
            let mut query = QueryBuilder::<MySql>::new(
                "SELECT 1 FROM inbox_event t FORCE INDEX (ix_inbox_event_key_pending) WHERE ",
            );
            push_groups(&mut query, &groups);
            query
                .push(" AND t.topic = ")
                .push_bind(topic)
                .push(" LIMIT 1");
            query.build_query_scalar().fetch_optional(pool).await?
        }
    };
    Ok(found.is_some())
}
