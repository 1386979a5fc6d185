//! The outbox insert on MySQL / MariaDB: one multi-row `INSERT .. VALUES`
//! per kind, guarded by `@@in_transaction`.

use sqlx::query_builder::Separated;
use sqlx::{MySql, MySqlConnection, QueryBuilder};

use crate::insert::{check_records, headers_json};
use crate::{Error, Events, OutboxRecord};

const OUTBOX_COLUMNS: &str = "event_id, aggregate_type, aggregate_id, event_type, payload, topic, \
                              partition_key, traceparent, headers";

/// Inserts everything `events` recorded, on `conn` (`&mut *tx` inside a
/// transaction): the immediate records into `outbox_event`, the scheduled
/// ones into `outbox_scheduled`, one statement each, none for a kind with no
/// event. Returns the rows inserted.
///
/// Each statement guards itself: its event ids are
/// `IF(@@in_transaction = 1, ?, NULL)`, which the table refuses (`NOT NULL`,
/// and a `CHECK` against the nil UUID for servers not in strict mode), so on
/// a connection that is not inside a transaction (MySQL rolled it back on a
/// deadlock the handler swallowed) it writes nothing, and the call fails
/// with [`Error::TransactionLost`] rather than publishing events of writes
/// that were rolled back. The guard costs no round trip; a failed insert
/// asks the server whether a transaction is open, to tell the two causes
/// apart. Records are checked first (partition key length, headers), as on
/// PostgreSQL. MariaDB only: MySQL has no `@@in_transaction`.
///
/// ```no_run
/// # async fn f(pool: sqlx::MySqlPool, events: txoutbox_core::Events) -> Result<(), txoutbox_core::Error> {
/// let mut tx = pool.begin().await?;
/// txoutbox_core::mysql::insert_events(&mut tx, &events).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn insert_events(conn: &mut MySqlConnection, events: &Events) -> Result<u64, Error> {
    let scheduled = events.scheduled();
    check_records(
        events
            .records()
            .iter()
            .chain(scheduled.iter().map(|s| &s.record)),
    )?;
    let mut inserted = 0;
    if !events.records().is_empty() {
        let mut query =
            QueryBuilder::<MySql>::new(format!("INSERT INTO outbox_event ({OUTBOX_COLUMNS}) "));
        query.push_values(events.records(), |mut row, record| {
            push_columns(&mut row, record);
        });
        inserted += execute(&mut *conn, query, events.records().len()).await?;
    }
    if !scheduled.is_empty() {
        let mut query = QueryBuilder::<MySql>::new(format!(
            "INSERT INTO outbox_scheduled ({OUTBOX_COLUMNS}, deliver_after) "
        ));
        query.push_values(scheduled, |mut row, scheduled| {
            push_columns(&mut row, &scheduled.record);
            row.push_bind(scheduled.deliver_after.naive_utc());
        });
        inserted += execute(conn, query, scheduled.len()).await?;
    }
    Ok(inserted)
}

/// One record's nine columns. The event id is the guard: outside a
/// transaction it is NULL, which the `NOT NULL` column refuses in strict
/// mode and the `CHECK` against the nil UUID refuses otherwise (a NULL then
/// becomes sixteen zero bytes), so the whole statement fails and writes
/// nothing.
fn push_columns(row: &mut Separated<'_, MySql, &'static str>, record: &OutboxRecord) {
    // The first value, so no separator before it, and its own after it.
    row.push_unseparated("IF(@@in_transaction = 1, ")
        .push_bind_unseparated(record.event_id)
        .push_unseparated(", NULL), ")
        .push_bind(record.aggregate_type.clone())
        .push_bind(record.aggregate_id.clone())
        .push_bind(record.event_type.clone())
        .push_bind(sqlx::types::Json(record.payload.clone()))
        .push_bind(record.topic.clone())
        .push_bind(record.partition_key.clone())
        .push_bind(record.traceparent.clone())
        .push_bind(headers_json(&record.headers).map(sqlx::types::Json));
}

async fn execute(
    conn: &mut MySqlConnection,
    mut query: QueryBuilder<MySql>,
    expected: usize,
) -> Result<u64, Error> {
    let done = match query.build().execute(&mut *conn).await {
        Ok(done) => done,
        Err(error) => {
            // The guard, or the insert's own failure: the cold path asks.
            super::check_in_transaction(conn).await?;
            return Err(Error::Database(error));
        }
    };
    match done.rows_affected() {
        n if n == expected as u64 => Ok(n),
        n => Err(Error::Database(sqlx::Error::Protocol(format!(
            "the outbox insert wrote {n} of {expected} rows"
        )))),
    }
}
