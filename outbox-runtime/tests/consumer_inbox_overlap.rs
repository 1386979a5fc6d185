//! Inbox ownership overlap: after a rebalance, the partition's evicted owner
//! may still be committing its last store (pending rows of a key) while the
//! new owner receives that key's later events. The new owner must not handle
//! them on receipt ahead of the old owner's rows: its store waits for the old
//! owner's (an advisory lock per partition, taken by every store), then sees
//! the key pending and stores behind it. Needs feature `test-hooks`, for
//! `Consumer::__store_pending`, the store path of the old owner.
#![allow(missing_docs)]

mod consumer_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use consumer_support::*;
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage, Timestamp};
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::DomainEvent;
use txoutbox_runtime::consumer::{Consumer, Mode, event_handler, telemetry as m};
use uuid::Uuid;

/// Counts `outbox_inbox_store_waits_total` (all other metrics are dropped).
#[derive(Default, Clone)]
struct StoreWaits(Arc<AtomicU64>);

impl metrics::Recorder for StoreWaits {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        if key.name() == m::INBOX_STORE_WAITS {
            metrics::Counter::from_arc(self.0.clone())
        } else {
            metrics::Counter::noop()
        }
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

test_event!(OverlapPaid, "consumer-test.inbox.overlap", "OverlapPaid");

#[event_handler]
async fn on_overlap_paid(
    tx: &mut Transaction<'_, Postgres>,
    event: OverlapPaid,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effect (event_id, amount) VALUES ($1, $2)")
        .bind(event.event_id)
        .bind(event.amount)
        .execute(&mut **tx)
        .await
        .map(drop)
}

fn consumer(pool: &PgPool, group: &str) -> txoutbox_runtime::consumer::ConsumerBuilder {
    Consumer::builder(pool.clone(), kafka_config(), group)
        .handler(on_overlap_paid)
        .mode(Mode::Inbox)
        .processor_poll_interval(Duration::from_millis(20))
}

/// `event` as the record the relay would have sent, at `offset` of partition 0.
fn record(event: &OverlapPaid, offset: i64) -> OwnedMessage {
    let headers = OwnedHeaders::new().insert(Header {
        key: txoutbox_core::wire::HEADER_EVENT_TYPE,
        value: Some(OverlapPaid::EVENT_TYPE),
    });
    OwnedMessage::new(
        Some(serde_json::to_vec(event).unwrap()),
        Some(event.order_id.to_string().into_bytes()),
        OverlapPaid::TOPIC.to_owned(),
        Timestamp::NotAvailable,
        0,
        offset,
        Some(headers),
    )
}

/// Backends of this database waiting for an advisory lock.
async fn advisory_waiters(pool: &PgPool) -> i64 {
    count(
        pool,
        "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
         WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()",
    )
    .await
}

#[sqlx::test(migrations = false)]
async fn a_new_owner_never_handles_a_key_on_receipt_ahead_of_the_old_owners_pending_rows(
    pool: PgPool,
) {
    let waits = StoreWaits::default();
    metrics::set_global_recorder(waits.clone()).expect("the only recorder of this binary");
    prepare_db(&pool).await;
    create_topic(OverlapPaid::TOPIC, 1).await;
    let group = unique_group("overlap");
    start_group_at(&group, OverlapPaid::TOPIC, 1, true).await;
    let producer = producer();
    let running = consumer(&pool, &group).build().unwrap().spawn();
    // The new owner is live: a first event of another key is handled.
    let warm_up = OverlapPaid::new(0);
    produce_event(&producer, &warm_up).await;
    eventually(
        "the consumer handles events",
        Duration::from_secs(20),
        || async { count(&pool, "SELECT count(*) FROM effect").await == 1 },
    )
    .await;

    // The old owner, still storing: a pending row of key K, not committed.
    let order_id = Uuid::new_v4();
    let first = OverlapPaid {
        event_id: Uuid::new_v4(),
        order_id,
        amount: 1,
    };
    let old_owner = consumer(&pool, &group).build().unwrap();
    let mut old_store = pool.begin().await.unwrap();
    let pending = old_owner
        .__store_pending(&mut old_store, &[record(&first, 1_000_000)])
        .await
        .unwrap();
    assert_eq!(pending, 1);

    // K's next event reaches the new owner meanwhile.
    let second = OverlapPaid {
        event_id: Uuid::new_v4(),
        order_id,
        amount: 2,
    };
    produce_event(&producer, &second).await;
    let end = high_watermarks(OverlapPaid::TOPIC, 1).await;
    let handled = |amount: i64| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM effect WHERE amount = $1")
                .bind(amount)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    eventually(
        "K's later event handled, or its store waiting",
        Duration::from_secs(20),
        || async { handled(2).await > 0 || advisory_waiters(&pool).await > 0 },
    )
    .await;
    // Give a wrong consumer every chance to overtake.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        handled(2).await,
        0,
        "K's later event was handled while K's earlier row was being stored"
    );
    assert_eq!(
        advisory_waiters(&pool).await,
        1,
        "the new owner's store waits"
    );
    assert_eq!(waits.0.load(Ordering::SeqCst), 1, "and says so");

    old_store.commit().await.unwrap();
    eventually(
        "both handled, offsets committed, nothing pending",
        Duration::from_secs(20),
        || async {
            handled(1).await == 1
                && handled(2).await == 1
                && committed(&group, OverlapPaid::TOPIC, 1).await == end
                && count(
                    &pool,
                    "SELECT count(*) FROM inbox_event WHERE NOT processed",
                )
                .await
                    == 0
                && count(&pool, "SELECT count(*) FROM inbox_key").await == 0
        },
    )
    .await;
    let order: Vec<i64> =
        sqlx::query_scalar("SELECT amount FROM effect WHERE amount IN (1, 2) ORDER BY at")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        order,
        vec![1, 2],
        "K's rows in order: the old owner's first"
    );
    let summary = running.shutdown().await.unwrap();
    assert_eq!(summary.handled, 3, "{summary:?}");
    assert_eq!(count(&pool, "SELECT count(*) FROM effect").await, 3);
}

/// What the store's first statement returns: (locked, pending topic,
/// pending key, inserted id).
type StoreRow = (bool, Option<String>, Option<String>, Option<Uuid>);

/// A pending row of `key` stored by another transaction, committed while
/// the statement on `reader` runs; returns what that statement returned.
async fn committed_during(pool: &PgPool, reader_sql: &'static str, key: &str) -> Vec<StoreRow> {
    let mut reader = pool.acquire().await.unwrap();
    let key_for_reader = key.to_owned();
    // The statement takes its snapshot, sleeps a second, then reads.
    let read = tokio::spawn(async move {
        sqlx::query_as(reader_sql)
            .bind(key_for_reader)
            .fetch_all(&mut *reader)
            .await
            .unwrap()
    });
    eventually(
        "the reading statement is asleep",
        Duration::from_secs(10),
        || async {
            count(
                pool,
                "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event = 'PgSleep' AND datname = current_database()",
            )
            .await
                == 1
        },
    )
    .await;
    // Another store: a pending row of the key (its `inbox_key` entry comes
    // from the insert trigger), committed.
    sqlx::query(
        "INSERT INTO inbox_event (consumer_group, event_id, payload, event_type, topic,
                                  partition_key)
         VALUES ('g', $1, '{}', 'OverlapPaid', 't', $2)",
    )
    .bind(Uuid::new_v4())
    .bind(key)
    .execute(pool)
    .await
    .unwrap();
    read.await.unwrap()
}

/// The row the store passes to migration 0016's function in the tests below.
const ON_RECEIPT_ROW: Uuid = Uuid::from_u128(0x0016);

/// Calls migration 0016's function with one row to insert, of key 'k', for
/// the locks of `lock_texts`.
fn store_on_receipt_sql(lock_texts: &str) -> String {
    format!(
        "SELECT * FROM outbox_inbox_store_on_receipt(
             1, {lock_texts}, 'g', ARRAY['t'], ARRAY['k'],
             ARRAY['{ON_RECEIPT_ROW}'::uuid], ARRAY['{{\"amount\": 1}}'], ARRAY['OverlapPaid'],
             ARRAY['t'], ARRAY['k'], ARRAY['{{}}'::jsonb])"
    )
}

/// The store's locks, its read of pending keys and its insert of the rows
/// it handles on receipt are one round trip (migration 0016's function), and
/// the read must still see every store committed before the locks were
/// taken: under READ COMMITTED the function reads with a snapshot of its
/// own, taken after the locks, not the calling statement's. The control
/// shows what the test tells apart: the same read sharing the calling
/// statement's snapshot misses the row committed while that statement ran,
/// which would let a new owner handle the key on receipt ahead of the old
/// owner's pending row. A key found pending inserts nothing; a held lock
/// reads and inserts nothing.
#[sqlx::test(migrations = false)]
async fn the_stores_read_of_pending_keys_sees_what_committed_before_its_locks(pool: PgPool) {
    prepare_db(&pool).await;
    let control = committed_during(
        &pool,
        "SELECT true, k.topic, k.partition_key, NULL::uuid
         FROM (SELECT 'g'::text AS grp FROM pg_sleep(1)) AS s,
              LATERAL (SELECT * FROM inbox_key k
                       WHERE k.consumer_group = s.grp AND k.topic = 't'
                         AND k.partition_key = $1) AS k",
        "k-control",
    )
    .await;
    assert_eq!(
        control,
        vec![],
        "a read sharing the calling statement's snapshot misses the commit"
    );

    let read = committed_during(
        &pool,
        "SELECT f.*
         FROM (SELECT 'g'::text AS grp FROM pg_sleep(1)) AS s,
              LATERAL outbox_inbox_store_on_receipt(
                  1, ARRAY['t:0:' || s.grp], s.grp, ARRAY['t'], ARRAY[$1::text],
                  ARRAY['00000000-0000-0000-0000-000000000016'::uuid], ARRAY['{}'],
                  ARRAY['OverlapPaid'], ARRAY['t'], ARRAY[$1::text], ARRAY['{}'::jsonb]) AS f",
        "k",
    )
    .await;
    assert_eq!(
        read,
        vec![(true, Some("t".to_owned()), Some("k".to_owned()), None)],
        "the function's read sees the store committed before its locks"
    );
    let on_receipt_rows = "SELECT count(*) FROM inbox_event WHERE event_id = $1";
    let count_row = || async {
        sqlx::query_scalar::<_, i64>(on_receipt_rows)
            .bind(ON_RECEIPT_ROW)
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    assert_eq!(
        count_row().await,
        0,
        "a key found pending: nothing inserted"
    );

    // Another transaction holding one of the locks: not locked, nothing read
    // or inserted.
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(1, hashtext('t:0:g'))")
        .execute(&mut *holder)
        .await
        .unwrap();
    let refused: Vec<StoreRow> = sqlx::query_as(sqlx::AssertSqlSafe(store_on_receipt_sql(
        "ARRAY['t:1:g', 't:0:g']",
    )))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(refused, vec![(false, None, None, None)]);
    assert_eq!(count_row().await, 0, "a lock held: nothing inserted");
    holder.rollback().await.unwrap();

    // Nothing pending (the rows of the key handled): the row goes in,
    // processed, once.
    sqlx::query("UPDATE inbox_event SET processed = true, processed_at = now()")
        .execute(&pool)
        .await
        .unwrap();
    let stored: Vec<StoreRow> =
        sqlx::query_as(sqlx::AssertSqlSafe(store_on_receipt_sql("ARRAY['t:0:g']")))
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(stored, vec![(true, None, None, Some(ON_RECEIPT_ROW))]);
    let again: Vec<StoreRow> =
        sqlx::query_as(sqlx::AssertSqlSafe(store_on_receipt_sql("ARRAY['t:0:g']")))
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(again, vec![], "a redelivered row is not inserted again");
    assert_eq!(count_row().await, 1);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM inbox_event WHERE processed AND processed_at IS NOT NULL
               AND payload_bytes IS NOT NULL AND event_id = '00000000-0000-0000-0000-000000000016'"
        )
        .await,
        1
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM inbox_key").await, 0);
}

/// Migration 0015's function, which consumers of the version before 0016
/// call during a rolling deploy, answers as it always did, now through
/// 0016's function with no row to insert: not locked while another
/// transaction holds a lock, else the batch's keys that have pending rows
/// (each once), else nothing; it never inserts.
#[sqlx::test(migrations = false)]
async fn the_previous_versions_lock_and_read_answers_as_before(pool: PgPool) {
    prepare_db(&pool).await;
    sqlx::query(
        "INSERT INTO inbox_event (consumer_group, event_id, payload, event_type, topic, partition_key)
         VALUES ('g', $1, '{}', 'OverlapPaid', 't', 'k')",
    )
    .bind(Uuid::new_v4())
    .execute(&pool)
    .await
    .unwrap();
    let lock_and_read = |lock_texts: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_as::<_, (bool, Option<String>, Option<String>)>(sqlx::AssertSqlSafe(
                format!(
                    "SELECT * FROM outbox_inbox_lock_and_read_pending(
                         1, {lock_texts}, 'g', ARRAY['t', 't', 't'], ARRAY['k', 'idle', 'k'])"
                ),
            ))
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };

    assert_eq!(
        lock_and_read("ARRAY['t:0:g']").await,
        vec![(true, Some("t".to_owned()), Some("k".to_owned()))],
        "the pending key, once"
    );

    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(1, hashtext('t:0:g'))")
        .execute(&mut *holder)
        .await
        .unwrap();
    assert_eq!(
        lock_and_read("ARRAY['t:1:g', 't:0:g']").await,
        vec![(false, None, None)],
        "a lock held"
    );
    holder.rollback().await.unwrap();

    sqlx::query("UPDATE inbox_event SET processed = true, processed_at = now()")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(
        lock_and_read("ARRAY['t:0:g']").await,
        vec![],
        "nothing pending"
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM inbox_event").await,
        1,
        "nothing inserted"
    );
}

/// `event`, taken by a fresh consumer of `group` through the consumer's own
/// step; returns the inbox row as the store left it.
async fn store_one(pool: &PgPool, group: &str, event: &OverlapPaid) -> StoredRow {
    let consumer = consumer(pool, group).build().unwrap();
    assert_eq!(consumer.__take(&[record(event, 1)]).await, 1);
    sqlx::query_as(
        "SELECT payload::text, payload_bytes, event_type, topic, partition_key, headers::text,
                processed, processed_at IS NOT NULL, attempts, parked_at IS NULL
         FROM inbox_event WHERE consumer_group = $1",
    )
    .bind(group)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// An inbox row's columns, apart from its group, ids and times.
type StoredRow = (
    String,
    Option<i32>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    bool,
    bool,
    i32,
    bool,
);

/// Code deployed before its migration ran: without migration 0016's
/// function the store takes its locks, reads pending keys and inserts in
/// statements of their own, and goes on handling on receipt; nothing
/// stalls. The rows it stores are the rows the function stores: the
/// function's insert and the consumer's are two texts of one statement.
#[sqlx::test(migrations = false)]
async fn without_migration_0016_the_store_still_handles_on_receipt(pool: PgPool) {
    prepare_db(&pool).await;
    let event = OverlapPaid {
        event_id: Uuid::new_v4(),
        order_id: Uuid::new_v4(),
        amount: 7,
    };
    let by_the_function = store_one(&pool, &unique_group("with-0016"), &event).await;
    sqlx::query(
        "DROP FUNCTION outbox_inbox_store_on_receipt(integer, text[], text, text[], text[],
             uuid[], text[], text[], text[], text[], jsonb[])",
    )
    .execute(&pool)
    .await
    .unwrap();
    let by_statements = store_one(&pool, &unique_group("no-0016"), &event).await;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM effect WHERE amount = 7").await,
        2,
        "both handled"
    );
    assert!(
        by_the_function.6,
        "handled on receipt: stored already processed"
    );
    assert_eq!(by_the_function, by_statements);
}
