use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::{MAX_PARTITION_KEY_BYTES, OutboxRecord};

/// One statement for any number of rows: the arrays are unnested column by
/// column, so the round trip count does not grow with the events of a command.
/// `UNNEST` yields the rows in array order, so identity ids follow recording order.
const INSERT_OUTBOX: &str = "\
INSERT INTO outbox_event
    (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, traceparent)
SELECT * FROM UNNEST(
    $1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::text[], $7::text[], $8::text[])";

/// Inserts `records` into `outbox_event` in one round trip, on `conn` (use
/// `&mut *tx` to run it inside a transaction). Returns the number of rows
/// inserted; an empty slice sends nothing. A record whose partition key is
/// longer than [`MAX_PARTITION_KEY_BYTES`] fails the call with
/// `sqlx::Error::InvalidArgument` before anything is sent.
///
/// The unit of work calls this for you. It is public for code that manages
/// its own transaction (and for tests that need outbox rows).
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool, records: Vec<txoutbox_core::OutboxRecord>) -> Result<(), sqlx::Error> {
/// let mut tx = pool.begin().await?;
/// // ... your own statements on &mut *tx ...
/// txoutbox_core::insert_records(&mut tx, &records).await?;
/// tx.commit().await?;
/// txoutbox_core::wakeup::notify_committed();
/// # Ok(()) }
/// ```
pub async fn insert_records(
    conn: &mut PgConnection,
    records: &[OutboxRecord],
) -> Result<u64, sqlx::Error> {
    if records.is_empty() {
        return Ok(0);
    }
    // Records built by hand skip `OutboxRecord::from_event`'s check.
    if let Some(record) = records
        .iter()
        .find(|r| r.partition_key.len() > MAX_PARTITION_KEY_BYTES)
    {
        return Err(sqlx::Error::InvalidArgument(format!(
            "event {} ({}) has a partition key of {} bytes; the outbox accepts at most {}",
            record.event_id,
            record.event_type,
            record.partition_key.len(),
            MAX_PARTITION_KEY_BYTES
        )));
    }
    let column = |f: fn(&OutboxRecord) -> &String| -> Vec<&str> {
        records.iter().map(|r| f(r).as_str()).collect()
    };
    let event_ids: Vec<Uuid> = records.iter().map(|r| r.event_id).collect();
    let payloads: Vec<&Value> = records.iter().map(|r| &r.payload).collect();
    let traceparents: Vec<Option<&str>> =
        records.iter().map(|r| r.traceparent.as_deref()).collect();
    let done = sqlx::query(INSERT_OUTBOX)
        .bind(event_ids)
        .bind(column(|r| &r.aggregate_type))
        .bind(column(|r| &r.aggregate_id))
        .bind(column(|r| &r.event_type))
        .bind(payloads)
        .bind(column(|r| &r.topic))
        .bind(column(|r| &r.partition_key))
        .bind(traceparents)
        .execute(conn)
        .await?;
    Ok(done.rows_affected())
}
