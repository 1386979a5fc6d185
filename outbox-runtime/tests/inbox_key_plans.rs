//! The inbox reads `inbox_key` one key at a time, however the plans of its
//! statements were made. Those statements run in plpgsql functions (the
//! store's function, the update trigger), whose plans each connection
//! caches: a plan made while `inbox_key` was young (a new service, before
//! autovacuum analyzed it) read every key of the group to find the few of
//! a batch, and kept doing so as a backlog filled the table (8 ms per
//! store at 50,000 pending keys, on the hot path of every batch).
//!
//! Each test makes the plans on a young table (autovacuum off for it, so
//! no analyze replaces them), grows the table to 30,000 pending keys on the
//! same connection, and then reads, from the transaction's own statistics
//! (`pg_stat_xact_user_tables`), how many `inbox_key` rows the statement
//! read.

use sqlx::{Connection as _, PgConnection, PgPool};

/// Pending keys the table grows to.
const GROWN_KEYS: i64 = 30_000;

/// A connection to the test's database with the framework's schema, and
/// autovacuum off for the inbox tables.
async fn young_inbox(pool: &PgPool) -> PgConnection {
    txoutbox_runtime::migrations::run(pool).await.unwrap();
    sqlx::raw_sql(
        "ALTER TABLE inbox_key SET (autovacuum_enabled = off);
         ALTER TABLE inbox_event SET (autovacuum_enabled = off);",
    )
    .execute(pool)
    .await
    .unwrap();
    let options = pool.connect_options();
    PgConnection::connect_with(&options).await.unwrap()
}

/// Stores pending rows of `count` keys `<prefix><n>` of group `g`.
async fn store_pending(conn: &mut PgConnection, prefix: &str, count: i64) {
    sqlx::query(
        "INSERT INTO inbox_event (consumer_group, event_id, payload, event_type, topic, partition_key)
         SELECT 'g', gen_random_uuid(), '{}', 'Paid', 't', $1 || n FROM generate_series(1, $2) n",
    )
    .bind(prefix)
    .bind(count)
    .execute(&mut *conn)
    .await
    .unwrap();
}

/// `inbox_key` rows this transaction read, by sequential and by index scans.
async fn keys_read(conn: &mut PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT (seq_tup_read + coalesce(idx_tup_fetch, 0))::int8
         FROM pg_stat_xact_user_tables WHERE relname = 'inbox_key'",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

/// The store's call with one row of key `key`, handled on receipt.
async fn store_on_receipt(conn: &mut PgConnection, key: &str) -> Vec<(bool, Option<String>)> {
    sqlx::query_as(
        "SELECT locked, pending_key FROM outbox_inbox_store_on_receipt(
             7, ARRAY['t:0:g'], 'g', ARRAY['t'], ARRAY[$1], ARRAY[gen_random_uuid()],
             ARRAY['{}'], ARRAY['Paid'], ARRAY['t'], ARRAY[$1], ARRAY[NULL::jsonb])",
    )
    .bind(key)
    .fetch_all(&mut *conn)
    .await
    .unwrap()
}

#[sqlx::test(migrations = false)]
async fn the_store_reads_its_batch_keys_only_once_the_table_grew(pool: PgPool) {
    let mut conn = young_inbox(&pool).await;
    for round in 0..8 {
        store_on_receipt(&mut conn, &format!("young{round}")).await;
    }
    store_pending(&mut conn, "big", GROWN_KEYS).await;

    sqlx::raw_sql("BEGIN").execute(&mut conn).await.unwrap();
    let idle = store_on_receipt(&mut conn, "fresh").await;
    let pending = store_on_receipt(&mut conn, "big7").await;
    let read = keys_read(&mut conn).await;
    sqlx::raw_sql("ROLLBACK").execute(&mut conn).await.unwrap();

    assert_eq!(
        idle,
        vec![(true, None)],
        "a key with nothing pending is inserted"
    );
    assert_eq!(
        pending,
        vec![(true, Some("big7".to_owned()))],
        "a key with pending rows is returned"
    );
    assert!(
        read <= 2,
        "the two stores read {read} inbox_key rows of {GROWN_KEYS} to look up two keys"
    );
}

#[sqlx::test(migrations = false)]
async fn handling_pending_rows_locks_their_keys_only_once_the_table_grew(pool: PgPool) {
    let mut conn = young_inbox(&pool).await;
    for round in 0..8 {
        store_pending(&mut conn, &format!("young{round}-"), 5).await;
        sqlx::query(
            "UPDATE inbox_event SET processed = true, processed_at = now() WHERE NOT processed",
        )
        .execute(&mut conn)
        .await
        .unwrap();
    }
    store_pending(&mut conn, "big", GROWN_KEYS).await;

    sqlx::raw_sql("BEGIN").execute(&mut conn).await.unwrap();
    let handled = sqlx::query(
        "UPDATE inbox_event SET processed = true, processed_at = now()
         WHERE consumer_group = 'g' AND topic = 't' AND partition_key IN ('big1', 'big2', 'big3')
           AND NOT processed",
    )
    .execute(&mut conn)
    .await
    .unwrap()
    .rows_affected();
    let read = keys_read(&mut conn).await;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_key WHERE consumer_group = 'g'")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    sqlx::raw_sql("ROLLBACK").execute(&mut conn).await.unwrap();

    assert_eq!(handled, 3);
    assert_eq!(left, GROWN_KEYS - 3, "the handled keys' entries are gone");
    // Three keys locked and three entries deleted, each through an index
    // probe; a probe may also step over the dead entries the young rounds
    // left (86 rows in all here, against 30,083 with the plan that read the
    // table).
    assert!(
        read < 1_000,
        "the update trigger read {read} inbox_key rows of {GROWN_KEYS} to move three keys along"
    );
}
