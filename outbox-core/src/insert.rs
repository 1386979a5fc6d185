use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::{Events, MAX_PARTITION_KEY_BYTES, OutboxRecord, ScheduledRecord};

/// One statement for any number of rows: the arrays are unnested column by
/// column, so the round trip count does not grow with the events of a command.
/// `UNNEST` yields the rows in array order, so identity ids follow recording order.
const INSERT_OUTBOX: &str = "\
INSERT INTO outbox_event
    (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, traceparent,
     headers)
SELECT * FROM UNNEST(
    $1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::text[], $7::text[], $8::text[],
    $9::jsonb[])";

/// The same for scheduled events, into `outbox_scheduled` (migration 0007),
/// with their due time; the relay moves them into `outbox_event` when due.
const INSERT_SCHEDULED: &str = "\
INSERT INTO outbox_scheduled
    (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, traceparent,
     headers, deliver_after)
SELECT * FROM UNNEST(
    $1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::text[], $7::text[], $8::text[],
    $9::jsonb[], $10::timestamptz[])";

/// Removes a scheduled event that is not due yet. A row being moved by a
/// relay at this moment is locked: the delete waits for the move to commit,
/// then finds nothing.
const CANCEL_SCHEDULED: &str = "DELETE FROM outbox_scheduled WHERE event_id = $1";

/// Inserts everything `events` recorded, on `conn` (use `&mut *tx` inside a
/// transaction): the immediate records into `outbox_event` and the scheduled
/// ones into `outbox_scheduled`, one statement each (none for a kind with no
/// event). Returns the number of rows inserted, both kinds together. A
/// record whose partition key is longer than [`MAX_PARTITION_KEY_BYTES`]
/// (one built by hand and [prepared](Events::record_prepared)) fails the
/// call with `sqlx::Error::InvalidArgument` before anything is sent.
///
/// This is the insert of [`Events::write`], which the unit of work, the
/// test helper and the consumers call; use that one in code that manages
/// its own transaction: it also refuses the events whose deferred
/// serialization failed, and its [`AfterCommit`](crate::AfterCommit) wakes
/// the relay of this process after your commit. Rows written here alone are
/// published at the relay's next poll.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool, records: Vec<txoutbox_core::OutboxRecord>) -> Result<(), sqlx::Error> {
/// let mut events = txoutbox_core::Events::new();
/// for record in records {
///     events.record_prepared(record);
/// }
/// let mut tx = pool.begin().await?;
/// let inserted = txoutbox_core::insert_events(&mut tx, &events).await?;
/// assert_eq!(inserted, events.len() as u64);
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn insert_events(conn: &mut PgConnection, events: &Events) -> Result<u64, sqlx::Error> {
    let scheduled = events.scheduled();
    // Check everything before sending anything.
    check_records(
        events
            .records()
            .iter()
            .chain(scheduled.iter().map(|s| &s.record)),
    )?;
    let mut inserted = insert_records(&mut *conn, events.records()).await?;
    if !scheduled.is_empty() {
        inserted += insert_scheduled(conn, scheduled).await?;
    }
    Ok(inserted)
}

async fn insert_scheduled(
    conn: &mut PgConnection,
    scheduled: &[ScheduledRecord],
) -> Result<u64, sqlx::Error> {
    let columns = Columns::of(scheduled.iter().map(|s| &s.record));
    let due: Vec<DateTime<Utc>> = scheduled.iter().map(|s| s.deliver_after).collect();
    let done = columns
        .bind(sqlx::query(INSERT_SCHEDULED))
        .bind(due)
        .execute(conn)
        .await?;
    Ok(done.rows_affected())
}

/// Cancels the scheduled event `event_id` if it is not due yet: deletes it
/// from `outbox_scheduled`, on `conn` (inside your transaction with
/// `&mut *tx`, so the cancellation commits with your own changes).
///
/// Returns `true` if the event was still scheduled (it will never be
/// published, once the cancellation commits); `false` if there was no such
/// scheduled event: it never existed, was cancelled already, or is due and
/// was moved into `outbox_event` by the relay (then it is published, or
/// about to be; a cancellation cannot call it back). Cancelling therefore
/// races with the due time by up to the relay's `schedule_poll_interval`:
/// check the result.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool, reminder_id: uuid::Uuid) -> Result<(), sqlx::Error> {
/// let mut tx = pool.begin().await?;
/// // ... the order was paid: its payment reminder is no longer needed ...
/// if !txoutbox_core::cancel_scheduled(&mut tx, reminder_id).await? {
///     // Too late (or unknown): receivers must tolerate the reminder.
/// }
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn cancel_scheduled(
    conn: &mut PgConnection,
    event_id: Uuid,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(CANCEL_SCHEDULED)
        .bind(event_id)
        .execute(conn)
        .await?;
    Ok(done.rows_affected() > 0)
}

/// Inserts `records` into `outbox_event` in one round trip, on `conn`.
/// Returns the number of rows inserted; an empty slice sends nothing.
async fn insert_records(
    conn: &mut PgConnection,
    records: &[OutboxRecord],
) -> Result<u64, sqlx::Error> {
    if records.is_empty() {
        return Ok(0);
    }
    let done = Columns::of(records.iter())
        .bind(sqlx::query(INSERT_OUTBOX))
        .execute(conn)
        .await?;
    Ok(done.rows_affected())
}

/// Refuses a record whose partition key is longer than
/// [`MAX_PARTITION_KEY_BYTES`] or whose headers cannot be sent (a record
/// built by hand: `OutboxRecord::from_event` checks both).
pub(crate) fn check_records<'a>(
    records: impl Iterator<Item = &'a OutboxRecord>,
) -> Result<(), sqlx::Error> {
    for record in records {
        if record.partition_key.len() > MAX_PARTITION_KEY_BYTES {
            return Err(sqlx::Error::InvalidArgument(format!(
                "event {} ({}) has a partition key of {} bytes; the outbox accepts at most {}",
                record.event_id,
                record.event_type,
                record.partition_key.len(),
                MAX_PARTITION_KEY_BYTES
            )));
        }
        if !record.headers.is_empty()
            && let Some(problem) = crate::wire::user_headers_problem(
                record.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
            )
        {
            return Err(sqlx::Error::InvalidArgument(format!(
                "event {} ({}) cannot carry its headers: {problem}",
                record.event_id, record.event_type
            )));
        }
    }
    Ok(())
}

/// The message columns of some records, as the arrays `$1`..`$9` of
/// [`INSERT_OUTBOX`] and [`INSERT_SCHEDULED`].
struct Columns<'a> {
    event_ids: Vec<Uuid>,
    aggregate_types: Vec<&'a str>,
    aggregate_ids: Vec<&'a str>,
    event_types: Vec<&'a str>,
    payloads: Vec<&'a Value>,
    topics: Vec<&'a str>,
    partition_keys: Vec<&'a str>,
    traceparents: Vec<Option<&'a str>>,
    /// The user's headers as a JSON object; NULL when there are none.
    headers: Vec<Option<Value>>,
}

impl<'a> Columns<'a> {
    fn of(records: impl Iterator<Item = &'a OutboxRecord>) -> Self {
        let mut columns = Self {
            event_ids: Vec::new(),
            aggregate_types: Vec::new(),
            aggregate_ids: Vec::new(),
            event_types: Vec::new(),
            payloads: Vec::new(),
            topics: Vec::new(),
            partition_keys: Vec::new(),
            traceparents: Vec::new(),
            headers: Vec::new(),
        };
        for r in records {
            columns.event_ids.push(r.event_id);
            columns.aggregate_types.push(&r.aggregate_type);
            columns.aggregate_ids.push(&r.aggregate_id);
            columns.event_types.push(&r.event_type);
            columns.payloads.push(&r.payload);
            columns.topics.push(&r.topic);
            columns.partition_keys.push(&r.partition_key);
            columns.traceparents.push(r.traceparent.as_deref());
            columns.headers.push(headers_json(&r.headers));
        }
        columns
    }

    fn bind<'q>(
        self,
        query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>
    where
        'a: 'q,
    {
        query
            .bind(self.event_ids)
            .bind(self.aggregate_types)
            .bind(self.aggregate_ids)
            .bind(self.event_types)
            .bind(self.payloads)
            .bind(self.topics)
            .bind(self.partition_keys)
            .bind(self.traceparents)
            .bind(self.headers)
    }
}

/// The `headers` column of a record: its user headers as a JSON object of
/// strings, `None` (NULL) when it has none.
pub(crate) fn headers_json(headers: &[(String, String)]) -> Option<Value> {
    if headers.is_empty() {
        return None;
    }
    Some(Value::Object(
        headers
            .iter()
            .map(|(name, value)| (name.clone(), Value::String(value.clone())))
            .collect(),
    ))
}
