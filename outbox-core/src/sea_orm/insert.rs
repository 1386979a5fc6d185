//! The outbox insert through a SeaORM connection: the statements of
//! [`crate::insert_events`], with SeaORM's array values.

use ::sea_orm::sea_query::Value;
use ::sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement};
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::insert::{check_records, headers_json};
use crate::{Events, OutboxRecord};

/// One statement for any number of rows, as on the sqlx path. SeaORM's
/// arrays hold no NULL element, so a missing `traceparent` travels as `''`
/// and missing headers as JSON `null`, both turned back into NULL here.
const INSERT_OUTBOX: &str = "\
INSERT INTO outbox_event
    (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, traceparent,
     headers)
SELECT e, at, ai, et, p, t, pk, NULLIF(tp, ''), NULLIF(h, 'null'::jsonb)
FROM UNNEST(
    $1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::text[], $7::text[], $8::text[],
    $9::jsonb[]) AS u(e, at, ai, et, p, t, pk, tp, h)";

/// The same for scheduled events, into `outbox_scheduled`.
const INSERT_SCHEDULED: &str = "\
INSERT INTO outbox_scheduled
    (event_id, aggregate_type, aggregate_id, event_type, payload, topic, partition_key, traceparent,
     headers, deliver_after)
SELECT e, at, ai, et, p, t, pk, NULLIF(tp, ''), NULLIF(h, 'null'::jsonb), d
FROM UNNEST(
    $1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::text[], $7::text[], $8::text[],
    $9::jsonb[], $10::timestamptz[]) AS u(e, at, ai, et, p, t, pk, tp, h, d)";

/// Inserts everything `events` recorded through `conn` (a SeaORM
/// `DatabaseTransaction`, or a [`SeaConnection`](super::SeaConnection)):
/// the immediate records into `outbox_event`, the scheduled ones into
/// `outbox_scheduled`, one statement each, none for a kind with no event.
/// Returns the rows inserted. Records are checked first, as by
/// [`crate::insert_events`] (partition key length, headers); a record that
/// fails the check fails the call before anything is sent.
///
/// This is the insert of this module's [`transaction`](super::transaction),
/// which also refuses events whose deferred serialization failed, checks
/// that the transaction can still commit, and wakes an in-process relay
/// after the commit; call it yourself only in code that manages its own
/// SeaORM transaction (then rows are published at the relay's next poll).
///
/// ```no_run
/// # async fn f(db: sea_orm::DatabaseConnection, events: txoutbox_core::Events) -> Result<(), sea_orm::DbErr> {
/// use sea_orm::TransactionTrait;
///
/// let tx = db.begin().await?;
/// txoutbox_core::sea_orm::insert_events(&tx, &events).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn insert_events<C: ConnectionTrait>(conn: &C, events: &Events) -> Result<u64, DbErr> {
    let scheduled = events.scheduled();
    check_records(
        events
            .records()
            .iter()
            .chain(scheduled.iter().map(|s| &s.record)),
    )
    .map_err(super::exec_error)?;
    let mut inserted = 0;
    if !events.records().is_empty() {
        let values = columns(events.records().iter());
        inserted += execute(conn, INSERT_OUTBOX, values).await?;
    }
    if !scheduled.is_empty() {
        let mut values = columns(scheduled.iter().map(|s| &s.record));
        let due: Vec<DateTime<Utc>> = scheduled.iter().map(|s| s.deliver_after).collect();
        values.push(due.into());
        inserted += execute(conn, INSERT_SCHEDULED, values).await?;
    }
    Ok(inserted)
}

async fn execute<C: ConnectionTrait>(
    conn: &C,
    sql: &str,
    values: Vec<Value>,
) -> Result<u64, DbErr> {
    let statement = Statement::from_sql_and_values(DbBackend::Postgres, sql, values);
    Ok(conn.execute_raw(statement).await?.rows_affected())
}

/// The arrays `$1`..`$9` of the inserts.
fn columns<'a>(records: impl ExactSizeIterator<Item = &'a OutboxRecord>) -> Vec<Value> {
    let n = records.len();
    let mut event_ids: Vec<Uuid> = Vec::with_capacity(n);
    let mut aggregate_types = Vec::with_capacity(n);
    let mut aggregate_ids = Vec::with_capacity(n);
    let mut event_types = Vec::with_capacity(n);
    let mut payloads = Vec::with_capacity(n);
    let mut topics = Vec::with_capacity(n);
    let mut partition_keys = Vec::with_capacity(n);
    let mut traceparents = Vec::with_capacity(n);
    let mut headers = Vec::with_capacity(n);
    for r in records {
        event_ids.push(r.event_id);
        aggregate_types.push(r.aggregate_type.clone());
        aggregate_ids.push(r.aggregate_id.clone());
        event_types.push(r.event_type.clone());
        payloads.push(r.payload.clone());
        topics.push(r.topic.clone());
        partition_keys.push(r.partition_key.clone());
        traceparents.push(r.traceparent.clone().unwrap_or_default());
        headers.push(headers_json(&r.headers).unwrap_or(serde_json::Value::Null));
    }
    vec![
        event_ids.into(),
        aggregate_types.into(),
        aggregate_ids.into(),
        event_types.into(),
        payloads.into(),
        topics.into(),
        partition_keys.into(),
        traceparents.into(),
        headers.into(),
    ]
}
