//! The dedup consumer on both backends (feature `mysql`): one test body,
//! run once on PostgreSQL and once on MariaDB (each test creates and drops
//! its own database), against the real broker. Every event is handled once
//! and redeliveries change nothing, with the events a handler records
//! committed with its effects; a failing event is dead-lettered after its
//! attempts while everything else flows; a handler that ends its transaction
//! and returns `Ok` is charged alone; a transient failure (SQLSTATE 40001)
//! is run again without counting an attempt; a hanging handler is abandoned
//! at the timeout; a dead letter the broker refuses is parked in
//! `consumer_dead_letter`. MariaDB's own: inbox mode is refused at build.
#![allow(missing_docs)]

mod consumer_support;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use consumer_support::*;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::{MySql, MySqlPool, PgPool, Postgres, Transaction};
use txoutbox_core::{Backoff, DomainEvent, Events};
use txoutbox_runtime::consumer::{
    BuildError, Consumer, ConsumerHandle, EventHandler, EventMeta, HandlerError, Mode,
    event_handler,
};
use txoutbox_testkit::db::{connect, create_database, drop_databases, unique_name};
use txoutbox_testkit::mysql::MySqlScratch;
use uuid::Uuid;

test_event!(OnceEvent, "consumer-backends.once", "OnceEvent");
test_event!(FailEvent, "consumer-backends.fail", "FailEvent");
test_event!(EndsTxEvent, "consumer-backends.ends-tx", "EndsTxEvent");
test_event!(
    TransientEvent,
    "consumer-backends.transient",
    "TransientEvent"
);
test_event!(HangEvent, "consumer-backends.hang", "HangEvent");
test_event!(ParkEvent, "consumer-backends.park", "ParkEvent");
test_event!(FollowUp, "consumer-backends.follow-up", "FollowUp");

/// What a test handler does with an event, by its amount.
enum Act {
    /// Records the effect (and, for amount 100, a follow-up event).
    Effect,
    /// Fails every time.
    Fail,
    /// Writes its effect, ends the transaction itself and returns `Ok`.
    EndTransaction,
    /// Fails with SQLSTATE 40001 on its first two calls.
    Transient,
    /// Never returns.
    Hang,
}

fn act(amount: i64) -> Act {
    match amount {
        13 => Act::Fail,
        7 => Act::EndTransaction,
        40 => Act::Transient,
        5 => Act::Hang,
        _ => Act::Effect,
    }
}

/// Calls of the transient event so far, by event id.
static TRANSIENT_CALLS: Mutex<Option<HashMap<Uuid, u32>>> = Mutex::new(None);

/// Whether this call of `event_id` is to fail transiently (its first two).
fn fails_transiently(event_id: Uuid) -> bool {
    let mut calls = TRANSIENT_CALLS.lock().unwrap();
    let calls = calls.get_or_insert_with(HashMap::new);
    let n = calls.entry(event_id).or_default();
    *n += 1;
    *n <= 2
}

async fn behave_postgres(
    tx: &mut Transaction<'_, Postgres>,
    event_id: Uuid,
    amount: i64,
    meta: &EventMeta,
    events: &mut Events,
) -> Result<(), HandlerError> {
    let insert = "INSERT INTO effect (event_id, amount, note) VALUES ($1, $2, $3)";
    let note = format!("attempt {}", meta.attempt);
    match act(amount) {
        Act::Fail => return Err(HandlerError::new("amount 13 is refused")),
        Act::Hang => std::future::pending::<()>().await,
        Act::Transient if fails_transiently(event_id) => {
            sqlx::raw_sql(
                "DO $$ BEGIN RAISE EXCEPTION 'could not serialize' USING ERRCODE = '40001'; END $$",
            )
            .execute(&mut **tx)
            .await?;
        }
        Act::EndTransaction => {
            sqlx::query(insert)
                .bind(event_id)
                .bind(amount)
                .bind(&note)
                .execute(&mut **tx)
                .await?;
            sqlx::raw_sql("ROLLBACK").execute(&mut **tx).await?;
            return Ok(());
        }
        Act::Transient | Act::Effect => {}
    }
    sqlx::query(insert)
        .bind(event_id)
        .bind(amount)
        .bind(&note)
        .execute(&mut **tx)
        .await?;
    if amount == 100 {
        events.record(FollowUp::new(amount));
    }
    Ok(())
}

async fn behave_mysql(
    tx: &mut Transaction<'_, MySql>,
    event_id: Uuid,
    amount: i64,
    meta: &EventMeta,
    events: &mut Events,
) -> Result<(), HandlerError> {
    let insert = "INSERT INTO effect (event_id, amount, note) VALUES (?, ?, ?)";
    let note = format!("attempt {}", meta.attempt);
    match act(amount) {
        Act::Fail => return Err(HandlerError::new("amount 13 is refused")),
        Act::Hang => std::future::pending::<()>().await,
        Act::Transient if fails_transiently(event_id) => {
            sqlx::raw_sql("SIGNAL SQLSTATE '40001' SET MESSAGE_TEXT = 'could not serialize'")
                .execute(&mut **tx)
                .await?;
        }
        Act::EndTransaction => {
            sqlx::query(insert)
                .bind(event_id)
                .bind(amount)
                .bind(&note)
                .execute(&mut **tx)
                .await?;
            sqlx::raw_sql("ROLLBACK").execute(&mut **tx).await?;
            return Ok(());
        }
        Act::Transient | Act::Effect => {}
    }
    sqlx::query(insert)
        .bind(event_id)
        .bind(amount)
        .bind(&note)
        .execute(&mut **tx)
        .await?;
    if amount == 100 {
        events.record(FollowUp::new(amount));
    }
    Ok(())
}

/// One handler per event type and database, each calling the behaviour of
/// its database.
macro_rules! handlers {
    ($event:ident, $postgres:ident, $mysql:ident) => {
        #[event_handler]
        async fn $postgres(
            tx: &mut Transaction<'_, Postgres>,
            event: $event,
            meta: &EventMeta,
            events: &mut Events,
        ) -> Result<(), HandlerError> {
            behave_postgres(tx, event.event_id, event.amount, meta, events).await
        }

        #[event_handler]
        async fn $mysql(
            tx: &mut Transaction<'_, MySql>,
            event: $event,
            meta: &EventMeta,
            events: &mut Events,
        ) -> Result<(), HandlerError> {
            behave_mysql(tx, event.event_id, event.amount, meta, events).await
        }
    };
}

handlers!(OnceEvent, once_pg, once_my);
handlers!(FailEvent, fail_pg, fail_my);
handlers!(EndsTxEvent, ends_tx_pg, ends_tx_my);
handlers!(TransientEvent, transient_pg, transient_my);
handlers!(HangEvent, hang_pg, hang_my);
handlers!(ParkEvent, park_pg, park_my);

/// The consumer settings a test changes.
#[derive(Clone, Copy)]
struct Setup {
    max_attempts: u32,
    handler_timeout: Duration,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            handler_timeout: Duration::from_secs(30),
        }
    }
}

/// A scratch database of either backend, migrated, with the effect table.
enum Db {
    Postgres { pool: PgPool, name: String },
    MariaDb(Box<MySqlScratch>),
}

impl Db {
    async fn postgres() -> Self {
        txoutbox_testkit::init_tracing();
        let name = unique_name("consumer_backends");
        create_database(&name).await;
        let pool = connect(&name, 8).await;
        txoutbox_runtime::migrations::run(&pool).await.unwrap();
        sqlx::raw_sql(
            "CREATE TABLE effect (event_id uuid NOT NULL, amount bigint NOT NULL, note text)",
        )
        .execute(&pool)
        .await
        .unwrap();
        Self::Postgres { pool, name }
    }

    async fn mariadb() -> Self {
        txoutbox_testkit::init_tracing();
        let scratch = MySqlScratch::create(8).await;
        txoutbox_runtime::migrations::run(&scratch.pool)
            .await
            .unwrap();
        sqlx::raw_sql(
            "CREATE TABLE effect (event_id BINARY(16) NOT NULL, amount BIGINT NOT NULL, note TEXT)",
        )
        .execute(&scratch.pool)
        .await
        .unwrap();
        Self::MariaDb(Box::new(scratch))
    }

    /// Spawns a dedup consumer of `group` with the database's handler.
    fn spawn<P, M>(&self, group: &str, setup: Setup, postgres: P, mysql: M) -> ConsumerHandle
    where
        P: EventHandler<Postgres>,
        M: EventHandler<MySql>,
    {
        let backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(50));
        match self {
            Self::Postgres { pool, .. } => Consumer::builder(pool.clone(), kafka_config(), group)
                .handler(postgres)
                .max_attempts(setup.max_attempts)
                .handler_timeout(setup.handler_timeout)
                .backoff(backoff)
                .build()
                .unwrap()
                .spawn(),
            Self::MariaDb(scratch) => {
                Consumer::builder(scratch.pool.clone(), kafka_config(), group)
                    .handler(mysql)
                    .max_attempts(setup.max_attempts)
                    .handler_timeout(setup.handler_timeout)
                    .backoff(backoff)
                    .build()
                    .unwrap()
                    .spawn()
            }
        }
    }

    /// The effects of `ids`: how many rows each has, and their notes.
    async fn effects(&self, ids: &[Uuid]) -> HashMap<Uuid, Vec<String>> {
        let rows: Vec<(Uuid, Option<String>)> = match self {
            Self::Postgres { pool, .. } => {
                sqlx::query_as("SELECT event_id, note FROM effect WHERE event_id = ANY($1)")
                    .bind(ids)
                    .fetch_all(pool)
                    .await
                    .unwrap()
            }
            Self::MariaDb(scratch) => sqlx::query_as("SELECT event_id, note FROM effect")
                .fetch_all(&scratch.pool)
                .await
                .unwrap(),
        };
        let mut effects: HashMap<Uuid, Vec<String>> = HashMap::new();
        for (id, note) in rows {
            if ids.contains(&id) {
                effects
                    .entry(id)
                    .or_default()
                    .push(note.unwrap_or_default());
            }
        }
        effects
    }

    /// `SELECT count(*)` of `table`.
    async fn rows(&self, table: &str) -> i64 {
        let sql = sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}"));
        match self {
            Self::Postgres { pool, .. } => sqlx::query_scalar(sql).fetch_one(pool).await.unwrap(),
            Self::MariaDb(scratch) => sqlx::query_scalar(sql)
                .fetch_one(&scratch.pool)
                .await
                .unwrap(),
        }
    }

    /// The parked dead letters: (reason, record value, partition, headers
    /// as the database keeps them).
    async fn parked(&self) -> Vec<(String, Option<Vec<u8>>, i32)> {
        match self {
            Self::Postgres { pool, .. } => sqlx::query_as(
                r#"SELECT reason, record_value, "partition" FROM consumer_dead_letter"#,
            )
            .fetch_all(pool)
            .await
            .unwrap(),
            Self::MariaDb(scratch) => {
                sqlx::query_as("SELECT reason, record_value, `partition` FROM consumer_dead_letter")
                    .fetch_all(&scratch.pool)
                    .await
                    .unwrap()
            }
        }
    }

    async fn drop(self) {
        match self {
            Self::Postgres { pool, name } => {
                pool.close().await;
                drop_databases(&[name]).await.unwrap();
            }
            Self::MariaDb(scratch) => MySqlScratch::drop(*scratch).await,
        }
    }
}

/// Produces `event` to `partition` with its event type header.
async fn produce_to<E: DomainEvent>(producer: &FutureProducer, event: &E, partition: i32) {
    let record = txoutbox_core::OutboxRecord::from_event(event).unwrap();
    let value = serde_json::to_vec(&record.payload).unwrap();
    let headers = OwnedHeaders::new().insert(Header {
        key: txoutbox_core::wire::HEADER_EVENT_TYPE,
        value: Some(E::EVENT_TYPE),
    });
    producer
        .send(
            FutureRecord::to(E::TOPIC)
                .partition(partition)
                .key(&record.partition_key)
                .payload(&value)
                .headers(headers),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .expect("produce");
}

/// Waits until every id of `once` has exactly one effect and none of
/// `never` has any.
async fn wait_for_effects(db: &Db, once: &[Uuid], never: &[Uuid], what: &str) {
    eventually(what, Duration::from_secs(60), || async {
        let effects = db.effects(once).await;
        once.iter()
            .all(|id| effects.get(id).is_some_and(|notes| notes.len() == 1))
    })
    .await;
    let effects = db.effects(once).await;
    for id in once {
        assert_eq!(effects[id].len(), 1, "{id}: {:?}", effects[id]);
    }
    assert!(
        db.effects(never).await.is_empty(),
        "an effect of a failed event was committed"
    );
}

/// After the consumer stopped: every id of `once` has exactly one effect
/// (a second one, of a redelivery or of a write outside the transaction,
/// would come after the first, so this is checked at the end too).
async fn assert_once(db: &Db, once: &[Uuid]) {
    let effects = db.effects(once).await;
    for id in once {
        assert_eq!(
            effects.get(id).map(Vec::len),
            Some(1),
            "{id}: {:?}",
            effects.get(id)
        );
    }
}

/// Every event handled once; the five produced twice are skipped the second
/// time; the events a handler recorded are in the outbox, committed with its
/// effects; every offset committed.
async fn each_event_once(db: Db) {
    create_topic(OnceEvent::TOPIC, 2).await;
    let group = unique_group("backends-once");
    start_group_at(&group, OnceEvent::TOPIC, 2, true).await;
    let producer = producer();
    let events: Vec<OnceEvent> = (0..20)
        .map(|i| OnceEvent::new(if i < 2 { 100 } else { 1000 + i }))
        .collect();
    for (i, event) in events.iter().enumerate() {
        produce_to(&producer, event, (i % 2) as i32).await;
    }
    for event in &events[..5] {
        produce_to(&producer, event, 1).await; // redelivered
    }
    let end = high_watermarks(OnceEvent::TOPIC, 2).await;
    let running = db.spawn(&group, Setup::default(), once_pg, once_my);
    let ids: Vec<Uuid> = events.iter().map(|e| e.event_id).collect();
    wait_for_effects(&db, &ids, &[], "every event handled").await;
    eventually(
        "every offset committed",
        Duration::from_secs(30),
        || async { committed(&group, OnceEvent::TOPIC, 2).await == end },
    )
    .await;
    let summary = running.shutdown().await.unwrap();
    assert_once(&db, &ids).await;
    assert_eq!(summary.handled, 20, "{summary:?}");
    assert_eq!(summary.duplicates, 5, "{summary:?}");
    assert_eq!(db.rows("outbox_event").await, 2, "the follow-up events");
    assert_eq!(db.rows("processed_event").await, 20);
    db.drop().await;
}

/// A failing event (partition 0) is dead-lettered after three attempts;
/// everything else, before and behind it, is handled once.
async fn a_failing_event_is_dead_lettered(db: Db) {
    create_topic(FailEvent::TOPIC, 2).await;
    let group = unique_group("backends-fail");
    start_group_at(&group, FailEvent::TOPIC, 2, true).await;
    let producer = producer();
    let bad = FailEvent::new(13);
    let mut good = Vec::new();
    for i in 0..20 {
        if i == 4 {
            produce_to(&producer, &bad, 0).await;
        }
        let event = FailEvent::new(1000 + i);
        produce_to(&producer, &event, (i % 2) as i32).await;
        good.push(event.event_id);
    }
    let running = db.spawn(&group, Setup::default(), fail_pg, fail_my);
    wait_for_effects(&db, &good, &[bad.event_id], "the healthy events handled").await;
    eventually(
        "the failing event dead-lettered",
        Duration::from_secs(30),
        || async { running.summary().dead_lettered == 1 },
    )
    .await;
    let summary = running.shutdown().await.unwrap();
    assert_once(&db, &good).await;
    assert_eq!(summary.handled, 20, "{summary:?}");
    assert_eq!(db.rows("processed_event").await, 20);
    db.drop().await;
}

/// A handler that writes, ends the transaction (`ROLLBACK`) and returns
/// `Ok` is found out and charged: its write is not kept, it is
/// dead-lettered after its two attempts, and the events before and after it
/// are handled once. (Before the fix, PostgreSQL's careful pass tried to
/// roll back to a savepoint of the ended transaction, failed, took that for
/// an outage and tried again for ever: the partition stalled.)
async fn a_handler_that_ends_its_transaction_is_charged(db: Db) {
    create_topic(EndsTxEvent::TOPIC, 1).await;
    let group = unique_group("backends-ends-tx");
    start_group_at(&group, EndsTxEvent::TOPIC, 1, true).await;
    let producer = producer();
    let setup = Setup {
        max_attempts: 2,
        ..Setup::default()
    };
    let running = db.spawn(&group, setup, ends_tx_pg, ends_tx_my);
    let mut before = Vec::new();
    for i in 0..5 {
        let event = EndsTxEvent::new(1000 + i);
        produce_to(&producer, &event, 0).await;
        before.push(event.event_id);
    }
    wait_for_effects(&db, &before, &[], "the events before it handled").await;
    let bad = EndsTxEvent::new(7);
    produce_to(&producer, &bad, 0).await;
    eventually(
        "the bad event dead-lettered",
        Duration::from_secs(60),
        || async { running.summary().dead_lettered == 1 },
    )
    .await;
    let mut after = Vec::new();
    for i in 5..10 {
        let event = EndsTxEvent::new(1000 + i);
        produce_to(&producer, &event, 0).await;
        after.push(event.event_id);
    }
    wait_for_effects(&db, &after, &[bad.event_id], "the events after it handled").await;
    let summary = running.shutdown().await.unwrap();
    assert_once(&db, &before).await;
    assert_once(&db, &after).await;
    assert_eq!(summary.handled, 10, "{summary:?}");
    assert_eq!(db.rows("effect").await, 10);
    db.drop().await;
}

/// MariaDB: a handler that loses the transaction (its `ROLLBACK` stands
/// for a deadlock it swallowed) in the middle of a batch. MySQL then runs
/// later statements in autocommit, so the handlers after it in the batch
/// would write outside any transaction; the consumer checks before each
/// handler and runs the batch again instead: every other event of the
/// batch, before and after the bad one, has its effect exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_transaction_lost_mid_batch_writes_nothing_outside_it() {
    let db = Db::mariadb().await;
    create_topic(EndsTxEvent::TOPIC, 1).await;
    let group = unique_group("backends-lost-mid-batch");
    start_group_at(&group, EndsTxEvent::TOPIC, 1, true).await;
    let producer = producer();
    let bad = EndsTxEvent::new(7);
    let mut good = Vec::new();
    for i in 0..10 {
        if i == 3 {
            produce_to(&producer, &bad, 0).await;
        }
        let event = EndsTxEvent::new(1000 + i);
        produce_to(&producer, &event, 0).await;
        good.push(event.event_id);
    }
    // Started after producing, so the eleven come in one batch.
    let setup = Setup {
        max_attempts: 2,
        ..Setup::default()
    };
    let running = db.spawn(&group, setup, ends_tx_pg, ends_tx_my);
    wait_for_effects(&db, &good, &[bad.event_id], "the other events handled").await;
    eventually(
        "the bad event dead-lettered",
        Duration::from_secs(60),
        || async { running.summary().dead_lettered == 1 },
    )
    .await;
    let summary = running.shutdown().await.unwrap();
    assert_once(&db, &good).await;
    assert_eq!(
        db.rows("effect").await,
        10,
        "a write outside the transaction"
    );
    assert_eq!(summary.handled, 10, "{summary:?}");
    assert!(db.effects(&[bad.event_id]).await.is_empty());
    db.drop().await;
}

/// SQLSTATE 40001 twice, then success, with `max_attempts(1)`: handled on
/// its first attempt, not dead-lettered.
async fn a_transient_failure_costs_no_attempt(db: Db) {
    create_topic(TransientEvent::TOPIC, 1).await;
    let group = unique_group("backends-transient");
    start_group_at(&group, TransientEvent::TOPIC, 1, true).await;
    let producer = producer();
    let mut ids = Vec::new();
    for amount in [1001, 40, 1002] {
        let event = TransientEvent::new(amount);
        produce_to(&producer, &event, 0).await;
        ids.push(event.event_id);
    }
    let setup = Setup {
        max_attempts: 1,
        ..Setup::default()
    };
    let running = db.spawn(&group, setup, transient_pg, transient_my);
    wait_for_effects(&db, &ids, &[], "all three handled").await;
    let summary = running.shutdown().await.unwrap();
    assert_once(&db, &ids).await;
    assert_eq!(summary.dead_lettered, 0, "{summary:?}");
    assert_eq!(summary.handled, 3, "{summary:?}");
    assert_eq!(db.effects(&ids[1..2]).await[&ids[1]], vec!["attempt 1"]);
    db.drop().await;
}

/// A handler that never returns is abandoned at the 500 ms timeout and
/// dead-lettered; the other partition never waits, and its own partition
/// goes on after it.
async fn a_hanging_handler_is_abandoned(db: Db) {
    create_topic(HangEvent::TOPIC, 2).await;
    let group = unique_group("backends-hang");
    start_group_at(&group, HangEvent::TOPIC, 2, true).await;
    let producer = producer();
    let hung = HangEvent::new(5);
    produce_to(&producer, &hung, 0).await;
    let mut good = Vec::new();
    for i in 0..10 {
        let event = HangEvent::new(1000 + i);
        produce_to(&producer, &event, (i % 2) as i32).await;
        good.push(event.event_id);
    }
    let setup = Setup {
        max_attempts: 1,
        handler_timeout: Duration::from_millis(500),
    };
    let running = db.spawn(&group, setup, hang_pg, hang_my);
    wait_for_effects(&db, &good, &[hung.event_id], "the other events handled").await;
    eventually(
        "the hanging event dead-lettered",
        Duration::from_secs(30),
        || async { running.summary().dead_lettered == 1 },
    )
    .await;
    running.shutdown().await.unwrap();
    assert_once(&db, &good).await;
    db.drop().await;
}

/// A record to dead-letter (not JSON) whose headers alone exceed what the
/// dead-letter producer may send is parked in `consumer_dead_letter`, and
/// the healthy events of both partitions flow.
async fn a_refused_dead_letter_is_parked(db: Db) {
    create_topic(ParkEvent::TOPIC, 2).await;
    let group = unique_group("backends-park");
    start_group_at(&group, ParkEvent::TOPIC, 2, true).await;
    let producer = producer();
    let huge = "h".repeat(1_200_000);
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "event_type",
            value: Some("ParkEvent"),
        })
        .insert(Header {
            key: "padding",
            value: Some(huge.as_str()),
        });
    producer
        .send(
            FutureRecord::<str, [u8]>::to(ParkEvent::TOPIC)
                .partition(0)
                .key("bad")
                .payload(b"not json {")
                .headers(headers),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .expect("produce the bad record");
    let mut good = Vec::new();
    for i in 0..10 {
        let event = ParkEvent::new(1000 + i);
        produce_to(&producer, &event, (i % 2) as i32).await;
        good.push(event.event_id);
    }
    let end = high_watermarks(ParkEvent::TOPIC, 2).await;
    let running = db.spawn(&group, Setup::default(), park_pg, park_my);
    wait_for_effects(&db, &good, &[], "the healthy events handled").await;
    eventually(
        "the bad record parked and every offset committed",
        Duration::from_secs(60),
        || async {
            db.rows("consumer_dead_letter").await == 1
                && committed(&group, ParkEvent::TOPIC, 2).await == end
        },
    )
    .await;
    running.shutdown().await.unwrap();
    assert_once(&db, &good).await;
    let parked = db.parked().await;
    assert_eq!(
        parked,
        vec![("not_json".to_owned(), Some(b"not json {".to_vec()), 0)]
    );
    db.drop().await;
}

macro_rules! on_both {
    ($($body:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $body() {
                    super::$body(super::Db::postgres().await).await;
                }
            )*
        }
        mod mariadb {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $body() {
                    super::$body(super::Db::mariadb().await).await;
                }
            )*
        }
    };
}

on_both!(
    each_event_once,
    a_failing_event_is_dead_lettered,
    a_handler_that_ends_its_transaction_is_charged,
    a_transient_failure_costs_no_attempt,
    a_hanging_handler_is_abandoned,
    a_refused_dead_letter_is_parked,
);

/// Inbox mode needs PostgreSQL for now; `build` says so.
#[tokio::test]
async fn mariadb_inbox_mode_is_refused_at_build() {
    let scratch = MySqlScratch::create(2).await;
    let pool: MySqlPool = scratch.pool.clone();
    let built = Consumer::builder(pool, kafka_config(), "inbox-on-mariadb")
        .handler(once_my)
        .mode(Mode::Inbox)
        .build();
    match built {
        Err(BuildError::InvalidConfig(why)) => assert!(why.contains("Mode::Inbox"), "{why}"),
        other => panic!("expected the inbox refused, got {other:?}"),
    }
    scratch.drop().await;
}
