//! SeaORM 2 (feature `sea-orm`) end to end on real PostgreSQL and the real
//! broker: `#[outbox_handler]` on `&DatabaseTransaction` commits SeaORM
//! writes and the recorded events together or not at all (handler error,
//! panic, swallowed database error, retried serialization failure), the
//! relay publishes what it inserted; consumer handlers on
//! `&SeaConnection<'_>` write through SeaORM entities in the consumer's own
//! transaction, in dedup and in inbox mode: the effect, the dedup row or
//! the inbox mark, and the events they record commit together, once.
#![allow(missing_docs)]

mod consumer_support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use consumer_support::*;
use rdkafka::Message;
use rdkafka::message::{Headers, OwnedMessage};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr,
    EntityTrait, QueryFilter, Set, SqlxPostgresConnector,
};
use sqlx::PgPool;
use txoutbox_core::{DomainEvent, Events, outbox_handler};
use txoutbox_runtime::consumer::{Consumer, EventMeta, Mode, event_handler};
use txoutbox_runtime::relay::Relay;
use txoutbox_runtime::sea_orm::SeaConnection;
use txoutbox_testkit::broker::client_config;
use uuid::Uuid;

test_event!(SeaPlaced, "sea-orm-test.placed", "SeaPlaced");
test_event!(SeaPaid, "sea-orm-test.paid", "SeaPaid");
test_event!(SeaPaidInbox, "sea-orm-test.paid-inbox", "SeaPaidInbox");
test_event!(SeaAnswered, "sea-orm-test.answered", "SeaAnswered");

/// The table the handlers write through SeaORM (no unique key on
/// `event_id`: an effect applied twice shows as two rows).
mod sea_effect {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "sea_effect")]
    pub(crate) struct Model {
        #[sea_orm(primary_key)]
        pub id: i64,
        pub event_id: Uuid,
        pub amount: i64,
        pub note: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub(crate) enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

async fn prepare(pool: &PgPool) {
    txoutbox_runtime::migrations::run(pool).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE sea_effect (
             id bigserial PRIMARY KEY, event_id uuid NOT NULL, amount bigint NOT NULL,
             note text NOT NULL)",
    )
    .execute(pool)
    .await
    .unwrap();
}

fn sea(pool: &PgPool) -> DatabaseConnection {
    SqlxPostgresConnector::from_sqlx_postgres_pool(pool.clone())
}

/// Inserts the effect through SeaORM's active model (an `INSERT ..
/// RETURNING`, read back as a row).
async fn insert_effect<C: ConnectionTrait>(
    conn: &C,
    event_id: Uuid,
    amount: i64,
    note: &str,
) -> Result<sea_effect::Model, DbErr> {
    sea_effect::ActiveModel {
        event_id: Set(event_id),
        amount: Set(amount),
        note: Set(note.to_owned()),
        ..Default::default()
    }
    .insert(conn)
    .await
}

async fn effects(pool: &PgPool) -> i64 {
    count(pool, "SELECT count(*) FROM sea_effect").await
}

/// What a command handler misbehaves with, by amount.
const FAIL_AFTER_RECORDING: i64 = -1;
const SWALLOW_A_DATABASE_ERROR: i64 = -2;
const PANIC: i64 = -3;

/// The command: an effect through SeaORM and its event, in one transaction.
#[outbox_handler]
async fn place(tx: &DatabaseTransaction, events: &mut Events, amount: i64) -> Result<Uuid, DbErr> {
    let event = SeaPlaced::new(amount);
    let effect = insert_effect(tx, event.event_id, amount, "placed").await?;
    assert!(effect.id > 0, "the row came back from RETURNING");
    events.record(event.clone());
    match amount {
        FAIL_AFTER_RECORDING => return Err(DbErr::Custom("refused after recording".into())),
        SWALLOW_A_DATABASE_ERROR => {
            // "Already done" idiom gone wrong: the failure leaves the
            // transaction aborted, and PostgreSQL would turn the COMMIT into a
            // silent rollback.
            let _ = tx.execute_unprepared("SELECT 1/0").await;
        }
        PANIC => panic!("the handler panics after its writes"),
        _ => {}
    }
    Ok(event.event_id)
}

/// With headers of the user's own and a scheduled event, through the same
/// SeaORM transaction.
#[outbox_handler]
async fn place_with_extras(
    tx: &DatabaseTransaction,
    events: &mut Events,
    amount: i64,
) -> Result<(Uuid, Uuid), DbErr> {
    let now = SeaPlaced::new(amount);
    let later = SeaPlaced::new(amount + 1);
    insert_effect(tx, now.event_id, amount, "extras").await?;
    events
        .with_headers([("tenant", "acme")])
        .record(now.clone());
    events.record_after(later.clone(), Duration::from_millis(200));
    Ok((now.event_id, later.event_id))
}

static SERIALIZABLE_ATTEMPTS: AtomicU32 = AtomicU32::new(0);

/// Fails its first attempt with a serialization failure, as a conflicting
/// SERIALIZABLE transaction would.
#[outbox_handler(isolation = "Serializable", retries = 3)]
async fn place_serializable(tx: &DatabaseTransaction, events: &mut Events) -> Result<Uuid, DbErr> {
    let attempt = SERIALIZABLE_ATTEMPTS.fetch_add(1, Ordering::SeqCst);
    let level: String = tx
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            "SELECT current_setting('transaction_isolation')",
        ))
        .await?
        .expect("a row")
        .try_get_by_index(0)?;
    assert_eq!(level, "serializable");
    let event = SeaPlaced::new(7);
    insert_effect(tx, event.event_id, 7, "serializable").await?;
    events.record(event.clone());
    if attempt == 0 {
        tx.execute_unprepared(
            "DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = 'serialization_failure'; END $$",
        )
        .await?;
    }
    Ok(event.event_id)
}

async fn outbox_rows(pool: &PgPool, event_id: Uuid) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_event WHERE event_id = $1")
        .bind(event_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

fn event_id_of(message: &OwnedMessage) -> Option<Uuid> {
    header(message, txoutbox_core::wire::HEADER_EVENT_ID)?
        .parse()
        .ok()
}

fn header_names(message: &OwnedMessage) -> Vec<String> {
    message
        .headers()
        .map(|h| h.iter().map(|h| h.key.to_owned()).collect())
        .unwrap_or_default()
}

// One test for the command side: the relay wake-up is process-wide, and the
// relay started at the end publishes whatever the phases inserted.
#[sqlx::test(migrations = false)]
async fn outbox_handler_on_a_database_transaction_commits_writes_and_events_together(pool: PgPool) {
    prepare(&pool).await;
    create_topic(SeaPlaced::TOPIC, 1).await;
    let from = high_watermarks(SeaPlaced::TOPIC, 1).await[0];
    let db = sea(&pool);

    // Committed: the effect and its row, and the in-process relay is woken.
    let mut wakeup = txoutbox_core::__private::wakeup::listener();
    let committed = place(&db, 10).await.expect("committed");
    tokio::time::timeout(Duration::from_secs(5), wakeup.committed())
        .await
        .expect("the commit wakes an in-process relay");
    assert_eq!(outbox_rows(&pool, committed).await, 1);
    assert_eq!(effects(&pool).await, 1);
    let row: (Option<String>, Option<serde_json::Value>, String) = sqlx::query_as(
        "SELECT traceparent, headers, partition_key FROM outbox_event WHERE event_id = $1",
    )
    .bind(committed)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (row.0, row.1),
        (None, None),
        "no trace context, no headers: NULL, as on the sqlx path"
    );

    // Every failure writes nothing, and the pool stays usable.
    let err = place(&db, FAIL_AFTER_RECORDING).await.unwrap_err();
    assert!(
        matches!(&err, DbErr::Custom(m) if m == "refused after recording"),
        "{err}"
    );
    let err = place(&db, SWALLOW_A_DATABASE_ERROR).await.unwrap_err();
    assert!(
        err.to_string().contains("aborted"),
        "a swallowed error is reported, not committed as a silent rollback: {err}"
    );
    let panicked = tokio::spawn({
        let db = db.clone();
        async move { place(&db, PANIC).await }
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    assert_eq!(effects(&pool).await, 1, "no effect of a failed attempt");
    assert_eq!(
        count(&pool, "SELECT count(*) FROM outbox_event").await,
        1,
        "no event of a failed attempt"
    );
    for _ in 0..pool.options().get_max_connections() + 1 {
        place(&db, 11)
            .await
            .expect("the pool's connections are clean");
    }
    let clean = count(&pool, "SELECT count(*) FROM outbox_event").await;
    assert_eq!(
        clean,
        1 + i64::from(pool.options().get_max_connections()) + 1
    );

    // Inside a caller's SeaORM transaction: a savepoint; the rows commit
    // with the outer transaction, or go with its rollback.
    let outer = sea_orm::TransactionTrait::begin(&db).await.unwrap();
    let nested = place(&outer, 12).await.unwrap();
    outer.rollback().await.unwrap();
    assert_eq!(outbox_rows(&pool, nested).await, 0);
    let outer = sea_orm::TransactionTrait::begin(&db).await.unwrap();
    let nested = place(&outer, 13).await.unwrap();
    outer.commit().await.unwrap();
    assert_eq!(outbox_rows(&pool, nested).await, 1);

    // Headers of the user's own and a scheduled event.
    let (now, later) = place_with_extras(&db, 20).await.unwrap();
    let headers: serde_json::Value =
        sqlx::query_scalar("SELECT headers FROM outbox_event WHERE event_id = $1")
            .bind(now)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(headers, serde_json::json!({"tenant": "acme"}));
    let scheduled: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_scheduled WHERE event_id = $1")
            .bind(later)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(scheduled, 1);

    // A serialization failure re-runs the handler in a fresh transaction.
    let retried = place_serializable(&db).await.expect("the retry commits");
    assert_eq!(SERIALIZABLE_ATTEMPTS.load(Ordering::SeqCst), 2);
    assert_eq!(outbox_rows(&pool, retried).await, 1);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM sea_effect WHERE note = 'serializable'"
        )
        .await,
        1,
        "the failed attempt's write rolled back"
    );

    // The relay publishes what the SeaORM path inserted, the scheduled
    // event when due, with the user's header.
    let relay = Relay::builder(pool.clone(), client_config(&brokers()))
        .schedule_poll_interval(Duration::from_millis(50))
        .spawn()
        .unwrap();
    let ids = [committed, now, later, retried];
    let read = read_until(SeaPlaced::TOPIC, from, Duration::from_secs(30), |read| {
        ids.iter()
            .all(|id| read.iter().any(|m| event_id_of(m) == Some(*id)))
    })
    .await;
    relay.shutdown().await.unwrap();
    let published = |id: Uuid| {
        read.iter()
            .find(|m| event_id_of(m) == Some(id))
            .expect("published")
    };
    assert_eq!(header(published(now), "tenant").as_deref(), Some("acme"));
    assert!(!header_names(published(committed)).contains(&"tenant".to_owned()));
    assert!(
        !header_names(published(committed)).contains(&"traceparent".to_owned()),
        "no traceparent header for a NULL column"
    );
    let value: serde_json::Value =
        serde_json::from_slice(published(committed).payload().unwrap()).unwrap();
    assert_eq!(value["amount"], 10);
    assert_eq!(value["event_type"], "SeaPlaced");
}

/// The consumer's effect through SeaORM entities: looks for an earlier
/// effect of the event with a query (`find`), inserts one with an active
/// model, records an answer; fails after its writes for a negative amount
/// (all of it must roll back), swallows a database error for `-2` (the
/// consumer must see the aborted transaction, not commit a silent rollback).
async fn apply(
    tx: &SeaConnection<'_>,
    event_id: Uuid,
    order_id: Uuid,
    amount: i64,
    meta: &EventMeta,
    events: &mut Events,
) -> Result<(), DbErr> {
    assert_eq!(meta.event_id, event_id);
    let earlier = sea_effect::Entity::find()
        .filter(sea_effect::Column::EventId.eq(event_id))
        .all(tx)
        .await?;
    let note = format!("seen before: {}", earlier.len());
    insert_effect(tx, event_id, amount, &note).await?;
    events.record(SeaAnswered {
        event_id: Uuid::new_v4(),
        order_id,
        amount,
    });
    match amount {
        SWALLOW_A_DATABASE_ERROR => {
            let _ = tx.execute_unprepared("SELECT 1/0").await;
            Ok(())
        }
        a if a < 0 => Err(DbErr::Custom(format!("refusing amount {a}"))),
        _ => Ok(()),
    }
}

#[event_handler]
async fn on_sea_paid(
    tx: &SeaConnection<'_>,
    event: SeaPaid,
    meta: &EventMeta,
    events: &mut Events,
) -> Result<(), DbErr> {
    apply(
        tx,
        event.event_id,
        event.order_id,
        event.amount,
        meta,
        events,
    )
    .await
}

#[event_handler]
async fn on_sea_paid_inbox(
    tx: &SeaConnection<'_>,
    event: SeaPaidInbox,
    meta: &EventMeta,
    events: &mut Events,
) -> Result<(), DbErr> {
    apply(
        tx,
        event.event_id,
        event.order_id,
        event.amount,
        meta,
        events,
    )
    .await
}

async fn answered(pool: &PgPool) -> i64 {
    count(
        pool,
        "SELECT count(*) FROM outbox_event WHERE event_type = 'SeaAnswered'",
    )
    .await
}

#[sqlx::test(migrations = false)]
async fn consumer_handlers_on_a_sea_connection_commit_with_the_consumers_bookkeeping(pool: PgPool) {
    prepare(&pool).await;

    // Dedup mode: four good events (one of them delivered twice), one that
    // fails after its writes, one that swallows a database error.
    create_topic(SeaPaid::TOPIC, 1).await;
    let group = unique_group("sea-orm-dedup");
    start_group_at(&group, SeaPaid::TOPIC, 1, true).await;
    let dlq_from = high_watermarks(&format!("{}.dlq", SeaPaid::TOPIC), 1).await[0];
    let good: Vec<SeaPaid> = (1..=4).map(SeaPaid::new).collect();
    let failing = SeaPaid::new(-1);
    let swallowing = SeaPaid::new(SWALLOW_A_DATABASE_ERROR);
    let producer = producer();
    for event in &good {
        produce_event(&producer, event).await;
    }
    produce_event(&producer, &failing).await;
    produce_event(&producer, &good[0]).await; // a redelivery
    produce_event(&producer, &swallowing).await;
    let end = high_watermarks(SeaPaid::TOPIC, 1).await;
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_sea_paid)
        .max_attempts(2)
        .backoff(txoutbox_core::Backoff::new(
            Duration::from_millis(20),
            Duration::from_millis(50),
        ))
        .build()
        .unwrap()
        .spawn();
    eventually(
        "good events handled, the two culprits dead-lettered, every offset committed",
        Duration::from_secs(30),
        || async {
            count(&pool, "SELECT count(*) FROM processed_event").await == 4
                && committed(&group, SeaPaid::TOPIC, 1).await == end
        },
    )
    .await;
    let dead = read_until(
        &format!("{}.dlq", SeaPaid::TOPIC),
        dlq_from,
        Duration::from_secs(20),
        |read| read.len() >= 2,
    )
    .await;
    let summary = running.summary();
    running.shutdown().await.unwrap();
    assert_eq!((summary.handled, summary.dead_lettered), (4, 2));
    let errors: Vec<String> = dead
        .iter()
        .map(|m| header(m, "dlq_error").unwrap_or_default())
        .collect();
    assert!(
        errors.iter().any(|e| e.contains("refusing amount -1")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("aborted")),
        "the swallowed error is charged to its handler: {errors:?}"
    );
    assert_eq!(effects(&pool).await, 4, "one effect per good event, once");
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM sea_effect WHERE note <> 'seen before: 0'"
        )
        .await,
        0
    );
    assert_eq!(answered(&pool).await, 4, "one answer per good event");

    // Inbox mode, through the processors: the effect commits with the
    // processed mark; the failing row is parked with everything rolled back.
    sqlx::raw_sql("TRUNCATE sea_effect, outbox_event")
        .execute(&pool)
        .await
        .unwrap();
    create_topic(SeaPaidInbox::TOPIC, 1).await;
    let group = unique_group("sea-orm-inbox");
    start_group_at(&group, SeaPaidInbox::TOPIC, 1, true).await;
    let good: Vec<SeaPaidInbox> = (1..=3).map(SeaPaidInbox::new).collect();
    let failing = SeaPaidInbox::new(-5);
    for event in good.iter().chain([&failing, &good[1]]) {
        produce_event(&producer, event).await;
    }
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_sea_paid_inbox)
        .mode(Mode::Inbox)
        .max_attempts(2)
        .backoff(txoutbox_core::Backoff::new(
            Duration::from_millis(20),
            Duration::from_millis(50),
        ))
        .processor_poll_interval(Duration::from_millis(20))
        .build()
        .unwrap()
        .spawn();
    eventually(
        "rows processed or parked",
        Duration::from_secs(30),
        || async {
            count(&pool, "SELECT count(*) FROM inbox_event WHERE processed").await == 3
                && count(
                    &pool,
                    "SELECT count(*) FROM inbox_event WHERE parked_at IS NOT NULL",
                )
                .await
                    == 1
        },
    )
    .await;
    running.shutdown().await.unwrap();
    assert_eq!(effects(&pool).await, 3, "one effect per good row, once");
    assert_eq!(
        answered(&pool).await,
        3,
        "the parked row's answer rolled back"
    );
    let last_error: String =
        sqlx::query_scalar("SELECT last_error FROM inbox_event WHERE parked_at IS NOT NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(last_error.contains("refusing amount -5"), "{last_error}");
}
