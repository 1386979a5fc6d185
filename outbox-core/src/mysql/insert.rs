//! The outbox insert on MySQL / MariaDB: one statement per kind for any
//! number of rows, guarded by `@@in_transaction`.

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
/// Each statement is `INSERT .. SELECT .. WHERE @@in_transaction = 1`: on a
/// connection that is not inside a transaction (MySQL rolled it back on a
/// deadlock the handler swallowed) it writes nothing, and the call fails
/// with [`Error::TransactionLost`] rather than publishing events of writes
/// that were rolled back. Records are checked first (partition key length,
/// headers), as on PostgreSQL.
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
        let mut query = QueryBuilder::<MySql>::new(format!(
            "INSERT INTO outbox_event ({OUTBOX_COLUMNS}) SELECT * FROM ("
        ));
        for (i, record) in events.records().iter().enumerate() {
            if i > 0 {
                query.push(" UNION ALL ");
            }
            push_row(&mut query, record);
            query.push(")");
        }
        query.push(") AS rows_ WHERE @@in_transaction = 1");
        inserted += execute(conn, query, events.records().len()).await?;
    }
    if !scheduled.is_empty() {
        let mut query = QueryBuilder::<MySql>::new(format!(
            "INSERT INTO outbox_scheduled ({OUTBOX_COLUMNS}, deliver_after) SELECT * FROM ("
        ));
        for (i, scheduled) in scheduled.iter().enumerate() {
            if i > 0 {
                query.push(" UNION ALL ");
            }
            push_row(&mut query, &scheduled.record);
            query.push(", ");
            query.push_bind(scheduled.deliver_after.naive_utc());
            query.push(" AS c9)");
        }
        query.push(") AS rows_ WHERE @@in_transaction = 1");
        inserted += execute(conn, query, scheduled.len()).await?;
    }
    Ok(inserted)
}

/// `(SELECT ? AS c0, ? AS c1, ..` of one record's nine columns (the caller
/// closes it; a derived table needs distinct column names).
fn push_row(query: &mut QueryBuilder<MySql>, record: &OutboxRecord) {
    query.push("(SELECT ");
    query.push_bind(record.event_id);
    query.push(" AS c0, ");
    query.push_bind(record.aggregate_type.clone());
    query.push(" AS c1, ");
    query.push_bind(record.aggregate_id.clone());
    query.push(" AS c2, ");
    query.push_bind(record.event_type.clone());
    query.push(" AS c3, ");
    query.push_bind(sqlx::types::Json(record.payload.clone()));
    query.push(" AS c4, ");
    query.push_bind(record.topic.clone());
    query.push(" AS c5, ");
    query.push_bind(record.partition_key.clone());
    query.push(" AS c6, ");
    query.push_bind(record.traceparent.clone());
    query.push(" AS c7, ");
    query.push_bind(headers_json(&record.headers).map(sqlx::types::Json));
    query.push(" AS c8");
}

async fn execute(
    conn: &mut MySqlConnection,
    mut query: QueryBuilder<MySql>,
    expected: usize,
) -> Result<u64, Error> {
    let done = query.build().execute(conn).await?;
    match done.rows_affected() {
        0 => Err(Error::TransactionLost),
        n if n == expected as u64 => Ok(n),
        n => Err(Error::Database(sqlx::Error::Protocol(format!(
            "the outbox insert wrote {n} of {expected} rows"
        )))),
    }
}
