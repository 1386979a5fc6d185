//! The consumer's MySQL / MariaDB statements: how a transaction begins, the
//! dedup rows, the parked dead letters, and how a lost transaction shows.

use std::collections::HashSet;

use sqlx::{MySqlConnection, MySqlPool};
use uuid::Uuid;

use super::ParkedDeadLetter;

/// How each consumer transaction begins: `READ COMMITTED` for the next
/// transaction only (no gap locks between consumers' dedup inserts; see
/// [`Database::begin`](super::Database::begin)), then the transaction, in
/// one round trip. MariaDB has no transaction-scoped statement timeout
/// (`max_statement_time` is the session's, and the pool is shared with the
/// application): the handler timeout abandons the call and the transaction
/// rolls back; a statement still running on the server ends at
/// `innodb_lock_wait_timeout` if it waits for a lock.
pub(super) const BEGIN: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION";

/// `ER_SP_DOES_NOT_EXIST`: a savepoint that is gone, because the
/// transaction it belonged to was rolled back (a deadlock) or ended.
const SAVEPOINT_DOES_NOT_EXIST: u16 = 1305;

/// One statement for a batch: the ids whose dedup row this inserted.
/// MariaDB's `INSERT IGNORE .. RETURNING` returns the rows it inserted and
/// skips the duplicates; `IGNORE` would also turn a value too long into a
/// warning, which cannot happen here (ids are 16 bytes, and `build` refuses a
/// group id longer than its 1,024-byte column).
pub(super) async fn mark_processed_all(
    conn: &mut MySqlConnection,
    group: &str,
    ids: &[Uuid],
) -> sqlx::Result<HashSet<Uuid>> {
    let mut query = sqlx::QueryBuilder::<sqlx::MySql>::new(
        "INSERT IGNORE INTO processed_event (consumer_group, event_id) ",
    );
    query.push_values(ids, |mut row, id| {
        row.push_bind(group.as_bytes()).push_bind(*id);
    });
    query.push(" RETURNING event_id");
    let fresh: Vec<Uuid> = query.build_query_scalar().fetch_all(conn).await?;
    Ok(fresh.into_iter().collect())
}

pub(super) async fn mark_processed(
    conn: &mut MySqlConnection,
    group: &str,
    id: Uuid,
) -> sqlx::Result<bool> {
    let inserted =
        sqlx::query("INSERT IGNORE INTO processed_event (consumer_group, event_id) VALUES (?, ?)")
            .bind(group.as_bytes())
            .bind(id)
            .execute(conn)
            .await?
            .rows_affected();
    Ok(inserted == 1)
}

/// A statement of the framework's after a handler failed because the
/// transaction is gone: MySQL rolled it back under the handler (a deadlock
/// the handler swallowed), so the event's savepoint no longer exists or the
/// session is no longer in a transaction. A statement that fails in an open
/// transaction is its own failure (MySQL undoes the statement, not the
/// transaction).
pub(super) async fn not_committable(
    conn: &mut MySqlConnection,
    error: &sqlx::Error,
) -> Option<txoutbox_core::Error> {
    let number = error
        .as_database_error()
        .and_then(|db| db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .map(sqlx::mysql::MySqlDatabaseError::number);
    if number == Some(SAVEPOINT_DOES_NOT_EXIST) {
        return Some(txoutbox_core::Error::TransactionLost);
    }
    match txoutbox_core::mysql::check_in_transaction(conn).await {
        Err(lost @ txoutbox_core::Error::TransactionLost) => Some(lost),
        _ => None,
    }
}

pub(super) async fn park_dead_letter(
    pool: &MySqlPool,
    row: &ParkedDeadLetter<'_>,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO consumer_dead_letter
             (consumer_group, topic, `partition`, `offset`, record_key, record_value,
              headers, reason, error, dead_letter_topic, publish_error)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
         ON DUPLICATE KEY UPDATE id = id",
    )
    .bind(row.group.as_bytes())
    .bind(row.topic)
    .bind(row.partition)
    .bind(row.offset)
    .bind(row.key)
    .bind(row.value)
    .bind(headers_json(&row.headers))
    .bind(row.reason)
    .bind(row.error)
    .bind(row.dead_letter_topic)
    .bind(row.publish_error)
    .execute(pool)
    .await
    .map(drop)
}

/// The headers as the column keeps them: `[["6e616d65", "76616c7565"], ..]`,
/// names and values in hexadecimal, a null value as `null`.
fn headers_json(headers: &[(&[u8], Option<&[u8]>)]) -> String {
    let pairs: Vec<serde_json::Value> = headers
        .iter()
        .map(|(name, value)| serde_json::json!([hex(name), value.map(hex)]))
        .collect();
    serde_json::Value::Array(pairs).to_string()
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut text, byte| {
            let _ = write!(text, "{byte:02x}");
            text
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_keep_any_bytes_as_hexadecimal_pairs() {
        let headers: Vec<(&[u8], Option<&[u8]>)> = vec![
            (b"\xff\x00n", Some(b"v")),
            (b"empty", None),
            (b"", Some(b"")),
        ];
        assert_eq!(
            headers_json(&headers),
            r#"[["ff006e","76"],["656d707479",null],["",""]]"#
        );
    }
}
