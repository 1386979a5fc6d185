//! The consumer's PostgreSQL statements: how a transaction begins, the
//! dedup rows, the parked dead letters.

use std::collections::HashSet;

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::ParkedDeadLetter;

/// The statement that opens each of a consumer's transactions: `READ
/// COMMITTED` and, unless the timeouts are off, a `statement_timeout` of the
/// handler timeout and an `idle_in_transaction_session_timeout` of the stall
/// limit (`SET LOCAL`: both end with the transaction).
///
/// The second is for a connection that froze mid-transaction: the consumer
/// abandons it at the stall limit ([`crate::consumer::stall`]), and
/// PostgreSQL, which waits for a `COMMIT` that never comes, ends the session
/// after as long without a statement, releasing the locks its dedup rows or
/// inbox keys hold, which the work's next attempt waits for. The consumer's
/// own transactions never idle that long: every wait inside one is shorter.
pub(super) fn begin_statement(
    handler_timeout: std::time::Duration,
    stall_limit: Option<std::time::Duration>,
) -> String {
    const BEGIN: &str = crate::txn::BEGIN;
    let millis = |timeout: std::time::Duration| {
        i32::try_from(timeout.as_millis())
            .ok()
            .filter(|millis| *millis > 0)
    };
    let mut statement = BEGIN.to_owned();
    if let Some(millis) = millis(handler_timeout) {
        statement += &format!("; SET LOCAL statement_timeout = {millis}");
    }
    if let Some(millis) = stall_limit.and_then(millis) {
        statement += &format!("; SET LOCAL idle_in_transaction_session_timeout = {millis}");
    }
    statement
}

/// One statement for a batch: the ids whose dedup row this inserted.
pub(super) async fn mark_processed_all(
    conn: &mut PgConnection,
    group: &str,
    ids: &[Uuid],
) -> sqlx::Result<HashSet<Uuid>> {
    let fresh = sqlx::query_scalar(
        "INSERT INTO processed_event (consumer_group, event_id)
         SELECT $1, id FROM UNNEST($2::uuid[]) AS t(id)
         ON CONFLICT DO NOTHING
         RETURNING event_id",
    )
    .bind(group)
    .bind(ids)
    .fetch_all(conn)
    .await?;
    Ok(fresh.into_iter().collect())
}

pub(super) async fn mark_processed(
    conn: &mut PgConnection,
    group: &str,
    id: Uuid,
) -> sqlx::Result<bool> {
    let inserted = sqlx::query(
        "INSERT INTO processed_event (consumer_group, event_id) VALUES ($1, $2)
         ON CONFLICT DO NOTHING",
    )
    .bind(group)
    .bind(id)
    .execute(conn)
    .await?
    .rows_affected();
    Ok(inserted == 1)
}

pub(super) async fn park_dead_letter(
    pool: &PgPool,
    row: &ParkedDeadLetter<'_>,
) -> sqlx::Result<()> {
    let (names, values): (Vec<&[u8]>, Vec<Option<&[u8]>>) = row.headers.iter().copied().unzip();
    sqlx::query(
        r#"INSERT INTO consumer_dead_letter
               (consumer_group, topic, "partition", "offset", record_key, record_value,
                header_names, header_values, reason, error, dead_letter_topic, publish_error)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
           ON CONFLICT (consumer_group, topic, "partition", "offset") DO NOTHING"#,
    )
    .bind(row.group)
    .bind(row.topic)
    .bind(row.partition)
    .bind(row.offset)
    .bind(row.key)
    .bind(row.value)
    .bind(&names)
    .bind(&values)
    .bind(row.reason)
    .bind(row.error)
    .bind(row.dead_letter_topic)
    .bind(row.publish_error)
    .execute(pool)
    .await
    .map(drop)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn transactions_state_their_isolation_and_bound_their_statements_and_idling() {
        assert_eq!(
            begin_statement(Duration::from_secs(30), Some(Duration::from_secs(35))),
            "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL statement_timeout = 30000; \
             SET LOCAL idle_in_transaction_session_timeout = 35000"
        );
        assert_eq!(
            begin_statement(Duration::MAX, None),
            "BEGIN ISOLATION LEVEL READ COMMITTED"
        );
    }
}
