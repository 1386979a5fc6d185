//! Every MariaDB statement of the relay's claim, settle and scheduler.
//! Lists (lanes, rows in flight, held topics, batches to mark) travel as one
//! parameter each: a JSON array read with `JSON_TABLE` and joined on the
//! primary key (`STRAIGHT_JOIN` keeps the list as the driving table and
//! `FORCE INDEX (PRIMARY)` the lookup by key, so a statement reads and locks
//! the listed rows only, even where the optimizer would scan a small or
//! freshly created table, locking every row), or for lanes a string of `0`
//! / `1`.

use std::collections::HashMap;

use sqlx::{Connection, MySqlConnection, MySqlPool};

use super::LockNames;
use crate::relay::backend::Moved;
use crate::relay::store::{ClaimedRow, Retry, SettleStatements};

/// Claims up to `limit` publishable rows of the given lanes in id order (see
/// the PostgreSQL claim, `relay/store.rs`, for the rules), in two statements
/// at `READ COMMITTED` (the session's level), each its own transaction.
///
/// The first reads without locking: InnoDB locks a row when its index entry
/// is read, before the server tests the lane condition, so one locking scan
/// over every lane would briefly lock the rows of other relays' lanes, and
/// their claims (`SKIP LOCKED`) would pass over their own earliest row of a
/// key and take the next one: order broken (the fault suite's broker-outage
/// scenario showed it). The second locks the chosen rows by primary key,
/// `SKIP LOCKED` (only a lane's previous owner or an operator can hold
/// them, as on PostgreSQL), and re-checks that they are still publishable.
///
/// The first statement returns, next to the candidates, the first row of
/// each key and topic of these lanes that waits for a retry; candidates
/// after such a row are left out here, in Rust. (As a correlated `NOT
/// EXISTS` per candidate, as on PostgreSQL, MariaDB took 6 ms of a 1,000-row
/// claim's 8 ms; a derived table of the waiting keys made it sort every
/// unpublished row.) Only this relay writes the retries of its lanes, on
/// this session, so the two reads see the same retries.
///
/// `ix_outbox_event_unpublished (published_at, parked_at, id)` gives the
/// claimable rows in id order without reading a published or a parked one
/// (MySQL migration 0008; forced, so the walk does not depend on the
/// optimizer's estimates: over the earlier `(published_at, id)`, with
/// parked rows making up much of the table, it preferred walking the
/// primary key), and
/// `ix_outbox_event_retrying (next_attempt_at)` the waiting ones. A key's
/// lane is `CRC32(partition_key) % lanes` (CRC-32 of the key's UTF-8 bytes:
/// the same on every server), tested against a string with a `1` at each
/// owned lane.
pub(super) async fn claim(
    conn: &mut MySqlConnection,
    lane_count: u32,
    lanes: &[i32],
    in_flight: &[i64],
    held_topics: &[String],
    limit: usize,
) -> sqlx::Result<Vec<ClaimedRow>> {
    let mut owned = vec![b'0'; lane_count as usize];
    for &lane in lanes {
        if let Some(slot) = owned.get_mut(lane as usize) {
            *slot = b'1';
        }
    }
    let owned = String::from_utf8(owned).expect("ASCII digits");
    let rows: Vec<(bool, i64, String, String)> = sqlx::query_as(CANDIDATES)
        .bind(&owned)
        .bind(lane_count)
        .bind(&owned)
        .bind(lane_count)
        .bind(json(in_flight))
        .bind(json(held_topics))
        .bind(limit as u64)
        .fetch_all(&mut *conn)
        .await?;
    let candidates = publishable(rows);
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_as(
        "SELECT o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.event_type,
                o.payload, o.topic, o.partition_key, o.traceparent, o.attempts, o.headers,
                o.created_at
         FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) c
              STRAIGHT_JOIN outbox_event o FORCE INDEX (PRIMARY) ON o.id = c.id
         WHERE o.published_at IS NULL AND o.parked_at IS NULL
         ORDER BY o.id
         FOR UPDATE SKIP LOCKED",
    )
    .bind(json(&candidates))
    .fetch_all(conn)
    .await
}

/// The claim's first statement (see [`claim`]): the waiting rows of the
/// lanes, then the candidates. Binds: the owned-lanes string and the lane
/// count (twice), the rows in flight and the held topics (JSON arrays), the
/// limit.
const CANDIDATES: &str = "(SELECT TRUE AS waiting, MIN(b.id) AS id, b.partition_key, b.topic
          FROM outbox_event b
          WHERE b.next_attempt_at > UTC_TIMESTAMP(6)
            AND b.published_at IS NULL AND b.parked_at IS NULL
            AND SUBSTRING(?, MOD(CRC32(b.partition_key), ?) + 1, 1) = '1'
          GROUP BY b.partition_key, b.topic)
         UNION ALL
         (SELECT FALSE, o.id, o.partition_key, o.topic
          FROM outbox_event o FORCE INDEX (ix_outbox_event_unpublished)
          WHERE o.published_at IS NULL AND o.parked_at IS NULL
            AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= UTC_TIMESTAMP(6))
            AND SUBSTRING(?, MOD(CRC32(o.partition_key), ?) + 1, 1) = '1'
            AND o.id NOT IN (SELECT f.id FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) f)
            AND o.topic NOT IN (SELECT h.topic FROM JSON_TABLE(?, '$[*]'
                                    COLUMNS (topic VARCHAR(249) COLLATE utf8mb4_bin PATH '$')) h)
          ORDER BY o.id
          LIMIT ?)";

/// Tests only (feature `test-hooks`): runs the claim's first statement (the
/// one that walks the outbox) under MariaDB's `ANALYZE FORMAT=JSON` over
/// every lane, nothing in flight, and returns what the server reports, so a
/// test can check which index it walked and how many rows it read.
#[cfg(feature = "test-hooks")]
pub async fn explain_claim(
    conn: &mut MySqlConnection,
    lane_count: u32,
    limit: usize,
) -> sqlx::Result<serde_json::Value> {
    // ANALYZE takes no placeholders: the values are this function's own.
    let owned = format!("'{}'", "1".repeat(lane_count as usize));
    let values = [
        owned.clone(),
        lane_count.to_string(),
        owned,
        lane_count.to_string(),
        "'[]'".to_owned(),
        "'[]'".to_owned(),
        limit.to_string(),
    ];
    let mut statement = String::from("ANALYZE FORMAT=JSON ");
    let mut parts = CANDIDATES.split('?');
    statement.push_str(parts.next().unwrap_or_default());
    for (value, part) in values.iter().zip(parts) {
        statement.push_str(value);
        statement.push_str(part);
    }
    let row = sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
        .fetch_one(conn)
        .await?;
    let text: String = sqlx::Row::try_get(&row, 0)?;
    serde_json::from_str(&text).map_err(|error| sqlx::Error::Decode(Box::new(error)))
}

/// The candidates' ids (`waiting` false, in id order) that no waiting row
/// (`waiting` true: the first row of its key and topic that waits for a
/// retry) precedes.
fn publishable(rows: Vec<(bool, i64, String, String)>) -> Vec<i64> {
    let mut first_waiting: HashMap<(String, String), i64> = HashMap::new();
    let mut candidates = Vec::with_capacity(rows.len());
    for (waiting, id, key, topic) in rows {
        if waiting {
            first_waiting.insert((key, topic), id);
        } else {
            candidates.push((id, key, topic));
        }
    }
    candidates
        .into_iter()
        .filter(|(id, key, topic)| {
            first_waiting.is_empty()
                || first_waiting
                    .get(&(key.clone(), topic.clone()))
                    .is_none_or(|first| first > id)
        })
        .map(|(id, _, _)| id)
        .collect()
}

fn json<T: serde::Serialize>(values: &[T]) -> String {
    serde_json::to_string(values).expect("plain values serialize")
}

impl SettleStatements for MySqlConnection {
    async fn mark_published(&mut self, ids: &[i64]) -> sqlx::Result<u64> {
        let done = sqlx::query(
            "UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) f
                 STRAIGHT_JOIN outbox_event o FORCE INDEX (PRIMARY) ON o.id = f.id
             SET o.published_at = UTC_TIMESTAMP(6)",
        )
        .bind(json(ids))
        .execute(self)
        .await?;
        Ok(done.rows_affected())
    }

    /// Two statements in one transaction: first the rows that reach
    /// `max_attempts` are parked (MySQL gives no order to the assignments
    /// of a multi-table `UPDATE`, so the attempt count is read before the
    /// write that raises it), then every row's retry is recorded.
    async fn record_retries(&mut self, retries: &[Retry], max_attempts: u32) -> sqlx::Result<u64> {
        let rows: Vec<serde_json::Value> = retries
            .iter()
            .map(|r| {
                serde_json::json!({
                    "id": r.id, "error": r.error, "delay_ms": r.retry_in_ms,
                    "counts": i32::from(r.counts),
                })
            })
            .collect();
        let rows = serde_json::to_string(&rows).expect("plain values serialize");
        let mut tx = self.begin().await?;
        let parked = sqlx::query(
            "UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$.id', counts INT PATH '$.counts')) f
                 STRAIGHT_JOIN outbox_event o FORCE INDEX (PRIMARY) ON o.id = f.id
             SET o.parked_at = UTC_TIMESTAMP(6)
             WHERE f.counts = 1 AND o.attempts + 1 >= ? AND o.published_at IS NULL",
        )
        .bind(&rows)
        .bind(max_attempts)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        sqlx::query(
            "UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$.id',
                                                  error LONGTEXT PATH '$.error',
                                                  delay_ms BIGINT PATH '$.delay_ms',
                                                  counts INT PATH '$.counts')) f
                 STRAIGHT_JOIN outbox_event o FORCE INDEX (PRIMARY) ON o.id = f.id
             SET o.attempts = o.attempts + f.counts,
                 o.last_error = f.error,
                 o.next_attempt_at = UTC_TIMESTAMP(6) + INTERVAL f.delay_ms * 1000 MICROSECOND
             WHERE o.published_at IS NULL",
        )
        .bind(&rows)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(parked)
    }

    async fn park_unrecordable(&mut self, retry: &Retry, db_error: &str) -> sqlx::Result<u64> {
        let done = sqlx::query(
            "UPDATE outbox_event
             SET attempts = attempts + 1, parked_at = UTC_TIMESTAMP(6),
                 last_error = CONCAT('the relay could not record a retry of this row (', ?,
                                     '), so it parked it; the broker had refused it: ', ?)
             WHERE id = ? AND published_at IS NULL AND parked_at IS NULL",
        )
        .bind(db_error)
        .bind(&retry.error)
        .bind(retry.id)
        .execute(self)
        .await?;
        Ok(done.rows_affected())
    }
}

/// Lets rows held back for an unavailable partition be claimed at once,
/// unless something else changed them meanwhile.
pub(super) async fn release_held(conn: &mut MySqlConnection, ids: &[i64]) -> sqlx::Result<u64> {
    let done = sqlx::query(
        "UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) f
             STRAIGHT_JOIN outbox_event o FORCE INDEX (PRIMARY) ON o.id = f.id
         SET o.next_attempt_at = NULL
         WHERE o.published_at IS NULL AND o.parked_at IS NULL
           AND o.next_attempt_at > UTC_TIMESTAMP(6)",
    )
    .bind(json(ids))
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// Unpublished, unparked rows and the age of the oldest, in seconds: the
/// head of `ix_outbox_event_unpublished`, forced (left to itself the
/// optimizer scanned the whole table: 690 ms against 48 ms over 500,000
/// rows of which 50,000 unpublished).
pub(super) async fn backlog(pool: &MySqlPool) -> sqlx::Result<(i64, f64)> {
    let (rows, age_us): (i64, Option<i64>) = sqlx::query_as(
        "SELECT COUNT(*), TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6))
         FROM outbox_event FORCE INDEX (ix_outbox_event_unpublished)
         WHERE published_at IS NULL AND parked_at IS NULL",
    )
    .fetch_one(pool)
    .await?;
    Ok((rows, age_us.unwrap_or(0).max(0) as f64 / 1e6))
}

/// Moves up to `limit` due rows from `outbox_scheduled` into `outbox_event`
/// in due order, in one transaction, one relay at a time (the rules of the
/// PostgreSQL move, `relay/scheduler.rs`). The relays' moves serialize on
/// a named lock taken without waiting; a relay that does not get it moves
/// nothing (the holder is moving the same rows). A connection whose lock
/// could not be released is closed rather than returned to the pool.
pub(super) async fn move_due(
    pool: &MySqlPool,
    names: &LockNames,
    limit: usize,
) -> sqlx::Result<Moved> {
    let mut conn = pool.acquire().await?;
    let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
        .bind(names.schedule())
        .fetch_one(&mut *conn)
        .await?;
    if got != Some(1) {
        return Ok(Moved {
            taken: 0,
            inserted: 0,
        });
    }
    let moved = move_locked(&mut conn, limit).await;
    let released = sqlx::query("DO RELEASE_LOCK(?)")
        .bind(names.schedule())
        .execute(&mut *conn)
        .await;
    if moved.is_err() || released.is_err() {
        // The lock may still be held: the session must end with it.
        drop(conn.detach());
    }
    let moved = moved?;
    released?;
    Ok(moved)
}

async fn move_locked(conn: &mut MySqlConnection, limit: usize) -> sqlx::Result<Moved> {
    sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .execute(&mut *conn)
        .await?;
    let mut tx = conn.begin().await?;
    let due: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM outbox_scheduled
         WHERE deliver_after <= UTC_TIMESTAMP(6)
         ORDER BY deliver_after, id
         LIMIT ?
         FOR UPDATE SKIP LOCKED",
    )
    .bind(limit as u64)
    .fetch_all(&mut *tx)
    .await?;
    if due.is_empty() {
        tx.rollback().await?;
        return Ok(Moved {
            taken: 0,
            inserted: 0,
        });
    }
    let due_json = json(&due);
    // `created_at` is the time of the move (the backlog then sees the row as
    // written when it became due), as on PostgreSQL.
    let inserted = sqlx::query(
        "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, payload,
                                   topic, partition_key, traceparent, headers, deliver_after,
                                   created_at)
         SELECT s.event_id, s.aggregate_type, s.aggregate_id, s.event_type, s.payload, s.topic,
                s.partition_key, s.traceparent, s.headers, s.deliver_after, UTC_TIMESTAMP(6)
         FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) f
              STRAIGHT_JOIN outbox_scheduled s FORCE INDEX (PRIMARY) ON s.id = f.id
         WHERE NOT EXISTS (SELECT 1 FROM outbox_event e WHERE e.event_id = s.event_id)
         ORDER BY s.deliver_after, s.id",
    )
    .bind(&due_json)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    sqlx::query(
        "DELETE s FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) f
             STRAIGHT_JOIN outbox_scheduled s FORCE INDEX (PRIMARY) ON s.id = f.id",
    )
    .bind(&due_json)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Moved {
        taken: due.len() as i64,
        inserted: inserted as i64,
    })
}

/// Scheduled events not moved yet, due or not.
pub(super) async fn scheduled_pending(pool: &MySqlPool) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT COUNT(*) FROM outbox_scheduled")
        .fetch_one(pool)
        .await
}

/// Seconds from now until the earliest due time (negative if a row is due
/// already), `None` if nothing is scheduled.
pub(super) async fn next_due_in(pool: &MySqlPool) -> sqlx::Result<Option<f64>> {
    let micros: Option<i64> = sqlx::query_scalar(
        "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), MIN(deliver_after))
         FROM outbox_scheduled",
    )
    .fetch_one(pool)
    .await?;
    Ok(micros.map(|us| us as f64 / 1e6))
}

#[cfg(test)]
mod tests {
    use super::publishable;

    #[test]
    fn a_waiting_row_holds_back_the_later_rows_of_its_key_and_topic_only() {
        let row = |waiting, id, key: &str, topic: &str| (waiting, id, key.into(), topic.into());
        let rows = vec![
            row(true, 5, "k", "a"),
            row(false, 3, "k", "a"), // before the waiting row: goes
            row(false, 6, "k", "a"), // after it: waits
            row(false, 7, "k", "b"), // the key on another topic: goes
            row(false, 8, "j", "a"), // another key: goes
        ];
        assert_eq!(publishable(rows), [3, 7, 8]);
    }
}
