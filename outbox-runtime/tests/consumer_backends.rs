//! The dedup consumer on both backends (feature `mysql`): one test body,
//! run once on PostgreSQL and once on MariaDB (each test creates and drops
//! its own database), against the real broker. Every event is handled once
//! and redeliveries change nothing, with the events a handler records
//! committed with its effects; a failing event is dead-lettered after its
//! attempts while everything else flows; a handler that ends its transaction
//! and returns `Ok` is charged alone; a transient failure (SQLSTATE 40001)
//! is run again without counting an attempt; a hanging handler is abandoned
//! at the timeout; a dead letter the broker refuses is parked in
//! `consumer_dead_letter`. MariaDB's own: a transaction lost mid-batch
//! writes nothing outside it. Inbox mode: `consumer_inbox_backends.rs`.
#![allow(missing_docs)]

mod backends_support;
mod consumer_support;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use backends_support::{Db, Setup};
use consumer_support::*;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::{MySql, Postgres, Transaction};
use txoutbox_core::{DomainEvent, Events};
use txoutbox_runtime::consumer::{
    ConsumerSummary, EventHandler, EventMeta, HandlerError, Mode, UnknownEventPolicy, event_handler,
};
use uuid::Uuid;

test_event!(OnceEvent, "consumer-backends.once", "OnceEvent");
test_event!(FailEvent, "consumer-backends.fail", "FailEvent");
// The ended-transaction tests, a topic for each run: one run's bad event
// read by another would be charged there too.
test_event!(EndsTxPg, "consumer-backends.ends-tx.pg", "EndsTxEvent");
test_event!(EndsTxMy, "consumer-backends.ends-tx.my", "EndsTxEvent");
test_event!(
    InboxEndsTxPg,
    "consumer-backends.inbox.ends-tx.pg",
    "InboxEndsTx"
);
test_event!(
    InboxEndsTxMy,
    "consumer-backends.inbox.ends-tx.my",
    "InboxEndsTx"
);
test_event!(LostMy, "consumer-backends.lost.my", "EndsTxEvent");
test_event!(
    InboxLostMy,
    "consumer-backends.inbox.lost.my",
    "InboxEndsTx"
);
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
    (event_id, order_id): (Uuid, Uuid),
    amount: i64,
    meta: &EventMeta,
    events: &mut Events,
) -> Result<(), HandlerError> {
    let insert = "INSERT INTO effect (event_id, order_id, amount, note) VALUES ($1, $2, $3, $4)";
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
                .bind(order_id)
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
        .bind(order_id)
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
    (event_id, order_id): (Uuid, Uuid),
    amount: i64,
    meta: &EventMeta,
    events: &mut Events,
) -> Result<(), HandlerError> {
    let insert = "INSERT INTO effect (event_id, order_id, amount, note) VALUES (?, ?, ?, ?)";
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
                .bind(order_id)
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
        .bind(order_id)
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
            behave_postgres(
                tx,
                (event.event_id, event.order_id),
                event.amount,
                meta,
                events,
            )
            .await
        }

        #[event_handler]
        async fn $mysql(
            tx: &mut Transaction<'_, MySql>,
            event: $event,
            meta: &EventMeta,
            events: &mut Events,
        ) -> Result<(), HandlerError> {
            behave_mysql(
                tx,
                (event.event_id, event.order_id),
                event.amount,
                meta,
                events,
            )
            .await
        }
    };
}

handlers!(OnceEvent, once_pg, once_my);
handlers!(FailEvent, fail_pg, fail_my);
handlers!(EndsTxPg, ends_tx_pg, ends_tx_pg_my);
handlers!(EndsTxMy, ends_tx_my_pg, ends_tx_my);
handlers!(InboxEndsTxPg, inbox_ends_tx_pg, inbox_ends_tx_pg_my);
handlers!(InboxEndsTxMy, inbox_ends_tx_my_pg, inbox_ends_tx_my);
handlers!(LostMy, lost_pg, lost_my);
handlers!(InboxLostMy, inbox_lost_pg, inbox_lost_my);
handlers!(TransientEvent, transient_pg, transient_my);
handlers!(HangEvent, hang_pg, hang_my);
handlers!(ParkEvent, park_pg, park_my);

/// Whether every partition's committed offset is at or past `end` (the
/// other database's run of a test may produce to the same topic meanwhile).
fn past(committed: &[i64], end: &[i64]) -> bool {
    committed.len() == end.len() && committed.iter().zip(end).all(|(c, e)| c >= e)
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
        || async { past(&committed(&group, OnceEvent::TOPIC, 2).await, &end) },
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

/// An event type of the ended-transaction tests: one per mode, so that
/// their runs never read each other's topic.
trait EndsTx: DomainEvent {
    fn with_amount(amount: i64) -> Self;
    fn id(&self) -> Uuid;
}

macro_rules! ends_tx {
    ($($event:ident),*) => {$(
        impl EndsTx for $event {
            fn with_amount(amount: i64) -> Self {
                Self::new(amount)
            }
            fn id(&self) -> Uuid {
                self.event_id
            }
        }
    )*};
}

ends_tx!(
    EndsTxPg,
    EndsTxMy,
    InboxEndsTxPg,
    InboxEndsTxMy,
    LostMy,
    InboxLostMy
);

/// How a mode sets aside an event after its attempts: dead-lettered
/// (dedup) or parked (inbox).
fn set_aside(mode: Mode, summary: &ConsumerSummary) -> u64 {
    match mode {
        Mode::Dedup => summary.dead_lettered,
        Mode::Inbox => summary.parked,
    }
}

/// A handler that writes, ends the transaction (`ROLLBACK`) and returns
/// `Ok` is found out and charged: its write is not kept, it is
/// dead-lettered (dedup) or parked (inbox) after its two attempts (on
/// MariaDB after its transient tries: there an ended transaction and one a
/// deadlock rolled back look alike), and the events before and after it
/// are handled once. (Before the fix, PostgreSQL's careful pass tried to
/// roll back to a savepoint of the ended transaction, failed, took that
/// for an outage and tried again for ever: the partition stalled.) It
/// comes in a batch of its own: on PostgreSQL the statements of the
/// handlers after it in its batch would run outside any transaction
/// (docs/consumer.md, "A handler that ends the transaction it was lent");
/// MariaDB's case of a batch is [`a_transaction_lost_mid_batch`].
async fn ended_transaction_is_charged<E, P, M>(db: Db, mode: Mode, postgres: P, mysql: M)
where
    E: EndsTx,
    P: EventHandler<Postgres>,
    M: EventHandler<MySql>,
{
    create_topic(E::TOPIC, 1).await;
    let group = unique_group("backends-ends-tx");
    start_group_at(&group, E::TOPIC, 1, true).await;
    let producer = producer();
    let setup = Setup {
        mode,
        max_attempts: 2,
        ..Setup::default()
    };
    let running = db.spawn(&group, setup, postgres, mysql);
    let mut before = Vec::new();
    for i in 0..5 {
        let event = E::with_amount(1000 + i);
        produce_to(&producer, &event, 0).await;
        before.push(event.id());
    }
    wait_for_effects(&db, &before, &[], "the events before it handled").await;
    let bad = E::with_amount(7);
    produce_to(&producer, &bad, 0).await;
    eventually(
        "the bad event set aside",
        Duration::from_secs(60),
        || async { set_aside(mode, &running.summary()) == 1 },
    )
    .await;
    let mut after = Vec::new();
    for i in 5..10 {
        let event = E::with_amount(1000 + i);
        produce_to(&producer, &event, 0).await;
        after.push(event.id());
    }
    wait_for_effects(&db, &after, &[bad.id()], "the events after it handled").await;
    if mode == Mode::Inbox {
        wait_for_empty_inbox(&db).await;
        let (attempts, processed, parked, _) = db.inbox_row(bad.id()).await;
        assert_eq!((attempts, processed, parked), (2, false, true));
    }
    let summary = running.shutdown().await.unwrap();
    assert_once(&db, &before).await;
    assert_once(&db, &after).await;
    assert_eq!(summary.handled, 10, "{summary:?}");
    assert_eq!(db.rows("effect").await, 10);
    db.drop().await;
}

async fn a_handler_that_ends_its_transaction_is_charged(db: Db) {
    if db.is_mariadb() {
        ended_transaction_is_charged::<EndsTxMy, _, _>(db, Mode::Dedup, ends_tx_my_pg, ends_tx_my)
            .await;
    } else {
        ended_transaction_is_charged::<EndsTxPg, _, _>(db, Mode::Dedup, ends_tx_pg, ends_tx_pg_my)
            .await;
    }
}

async fn inbox_a_handler_that_ends_its_transaction_is_parked(db: Db) {
    if db.is_mariadb() {
        ended_transaction_is_charged::<InboxEndsTxMy, _, _>(
            db,
            Mode::Inbox,
            inbox_ends_tx_my_pg,
            inbox_ends_tx_my,
        )
        .await;
    } else {
        ended_transaction_is_charged::<InboxEndsTxPg, _, _>(
            db,
            Mode::Inbox,
            inbox_ends_tx_pg,
            inbox_ends_tx_pg_my,
        )
        .await;
    }
}

/// MariaDB: a handler that loses the transaction (its `ROLLBACK` stands
/// for a deadlock it swallowed) in the middle of a batch (in the inbox: on
/// receipt and then in the processors). MySQL then runs later statements in
/// autocommit, so the handlers after it in the batch would write outside
/// any transaction; the consumer checks before each handler and runs the
/// batch again instead: every other event of the batch, before and after
/// the bad one, has its effect exactly once, and the bad one is set aside.
async fn a_transaction_lost_mid_batch<E, P, M>(mode: Mode, postgres: P, mysql: M)
where
    E: EndsTx,
    P: EventHandler<Postgres>,
    M: EventHandler<MySql>,
{
    let db = Db::mariadb().await;
    create_topic(E::TOPIC, 1).await;
    let group = unique_group("backends-lost-mid-batch");
    start_group_at(&group, E::TOPIC, 1, true).await;
    let producer = producer();
    let bad = E::with_amount(7);
    let mut good = Vec::new();
    for i in 0..10 {
        if i == 3 {
            produce_to(&producer, &bad, 0).await;
        }
        let event = E::with_amount(1000 + i);
        produce_to(&producer, &event, 0).await;
        good.push(event.id());
    }
    // Started after producing, so the eleven come in one batch.
    let setup = Setup {
        mode,
        max_attempts: 2,
        ..Setup::default()
    };
    let running = db.spawn(&group, setup, postgres, mysql);
    wait_for_effects(&db, &good, &[bad.id()], "the other events handled").await;
    eventually(
        "the bad event set aside",
        Duration::from_secs(60),
        || async { set_aside(mode, &running.summary()) == 1 },
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
    assert!(db.effects(&[bad.id()]).await.is_empty());
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_transaction_lost_mid_batch_writes_nothing_outside_it() {
    a_transaction_lost_mid_batch::<LostMy, _, _>(Mode::Dedup, lost_pg, lost_my).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_inbox_a_transaction_lost_mid_batch_writes_nothing_outside_it() {
    a_transaction_lost_mid_batch::<InboxLostMy, _, _>(Mode::Inbox, inbox_lost_pg, inbox_lost_my)
        .await;
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
        ..Setup::default()
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
                && past(&committed(&group, ParkEvent::TOPIC, 2).await, &end)
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

on_both!(
    each_event_once,
    a_failing_event_is_dead_lettered,
    a_handler_that_ends_its_transaction_is_charged,
    a_transient_failure_costs_no_attempt,
    a_hanging_handler_is_abandoned,
    a_refused_dead_letter_is_parked,
);

// Inbox mode (`Mode::Inbox`): the same test bodies on both databases.

test_event!(InboxOnce, "consumer-backends.inbox.once", "InboxOnce");
test_event!(
    InboxPending,
    "consumer-backends.inbox.pending",
    "InboxPending"
);
test_event!(InboxFail, "consumer-backends.inbox.fail", "InboxFail");
test_event!(
    InboxTransient,
    "consumer-backends.inbox.transient",
    "InboxTransient"
);
test_event!(InboxHang, "consumer-backends.inbox.hang", "InboxHang");
test_event!(
    InboxOrdered,
    "consumer-backends.inbox.ordered",
    "InboxOrdered"
);
test_event!(InboxRun, "consumer-backends.inbox.runs", "InboxRun");
test_event!(InboxOld, "consumer-backends.inbox.deploy", "InboxOld");
test_event!(InboxGate, "consumer-backends.inbox.gate", "InboxGate");
test_event!(InboxNew, "consumer-backends.inbox.deploy", "InboxNew");

handlers!(InboxOnce, inbox_once_pg, inbox_once_my);
handlers!(InboxPending, inbox_pending_pg, inbox_pending_my);
handlers!(InboxFail, inbox_fail_pg, inbox_fail_my);
handlers!(InboxTransient, inbox_transient_pg, inbox_transient_my);
handlers!(InboxHang, inbox_hang_pg, inbox_hang_my);
handlers!(InboxOld, inbox_old_pg, inbox_old_my);
handlers!(InboxNew, inbox_new_pg, inbox_new_my);

/// Calls that failed so far, by key: the run test's row 7 of each key
/// fails on its first two calls.
static RUN_FAILURES: Mutex<Vec<Uuid>> = Mutex::new(Vec::new());

/// Whether the call of row `amount` of `key` is to fail (see
/// [`RUN_FAILURES`]).
fn run_fails(key: Uuid, amount: i64) -> bool {
    if amount != 7 {
        return false;
    }
    let mut failures = RUN_FAILURES.lock().unwrap();
    if failures.iter().filter(|k| **k == key).count() < 2 {
        failures.push(key);
        return true;
    }
    false
}

/// Records the key and its sequence number (the amount), after a pause so
/// that processors overlap; the run test's row 7 fails twice.
macro_rules! ordered_handlers {
    ($event:ident, $postgres:ident, $mysql:ident) => {
        #[event_handler]
        async fn $postgres(
            tx: &mut Transaction<'_, Postgres>,
            event: $event,
        ) -> Result<(), HandlerError> {
            tokio::time::sleep(Duration::from_millis(1)).await;
            if run_fails(event.order_id, event.amount) && $event::EVENT_TYPE == "InboxRun" {
                return Err(HandlerError::new("row 7 fails twice"));
            }
            sqlx::query("INSERT INTO effect (event_id, order_id, amount) VALUES ($1, $2, $3)")
                .bind(event.event_id)
                .bind(event.order_id)
                .bind(event.amount)
                .execute(&mut **tx)
                .await?;
            Ok(())
        }

        #[event_handler]
        async fn $mysql(
            tx: &mut Transaction<'_, MySql>,
            event: $event,
        ) -> Result<(), HandlerError> {
            tokio::time::sleep(Duration::from_millis(1)).await;
            if run_fails(event.order_id, event.amount) && $event::EVENT_TYPE == "InboxRun" {
                return Err(HandlerError::new("row 7 fails twice"));
            }
            sqlx::query("INSERT INTO effect (event_id, order_id, amount) VALUES (?, ?, ?)")
                .bind(event.event_id)
                .bind(event.order_id)
                .bind(event.amount)
                .execute(&mut **tx)
                .await?;
            Ok(())
        }
    };
}

ordered_handlers!(InboxOrdered, inbox_ordered_pg, inbox_ordered_my);
ordered_handlers!(InboxRun, inbox_run_pg, inbox_run_my);

/// Produces `per_key` events for each of `keys` new keys to partition 0,
/// interleaved, the amount numbering each key's events 0, 1, 2, ...;
/// returns the keys.
async fn produce_numbered<E: DomainEvent>(
    keys: usize,
    per_key: i64,
    event: impl Fn(Uuid, i64) -> E,
) -> Vec<Uuid> {
    let producer = producer();
    let keys: Vec<Uuid> = (0..keys).map(|_| Uuid::new_v4()).collect();
    for sequence in 0..per_key {
        for key in &keys {
            produce_to(&producer, &event(*key, sequence), 0).await;
        }
    }
    keys
}

/// Every key's effects were applied once each, in order `0..per_key`.
async fn assert_applied_in_order(db: &Db, keys: &[Uuid], per_key: i64) {
    let applied = db.applied_by_key().await;
    for key in keys {
        assert_eq!(
            applied.get(key).cloned().unwrap_or_default(),
            (0..per_key).collect::<Vec<_>>(),
            "order of key {key}"
        );
    }
}

/// Waits until nothing is pending in the inbox and no key has an entry.
async fn wait_for_empty_inbox(db: &Db) {
    eventually("nothing pending", Duration::from_secs(60), || async {
        db.count("SELECT count(*) FROM inbox_event WHERE processed = FALSE AND parked_at IS NULL")
            .await
            == 0
            && db.rows("inbox_key").await == 0
    })
    .await;
}

/// Inbox: every event once with two processors; every tenth delivered
/// twice and stored once; the events the handler recorded committed with
/// its effects; nothing left pending, no key entry left; every offset
/// committed. Idle keys are handled by the receiving loop (as by default).
async fn inbox_each_event_once(db: Db) {
    let producer = producer();
    let events: Vec<InboxOnce> = (0..60)
        .map(|i| InboxOnce::new(if i < 3 { 100 } else { 1000 + i }))
        .collect();
    let ids: Vec<Uuid> = events.iter().map(|e| e.event_id).collect();
    let group = unique_group("backends-inbox-once");
    prepare_twice_delivered(&producer, &group, &events).await;
    let end = high_watermarks(InboxOnce::TOPIC, 2).await;
    let running = db.spawn(&group, Setup::inbox(), inbox_once_pg, inbox_once_my);
    wait_for_each_once(&db, &ids, &group, InboxOnce::TOPIC, &end).await;
    let summary = running.shutdown().await.unwrap();
    assert_stored_once(&db, &ids, summary).await;
    db.drop().await;
}

/// [`inbox_each_event_once`] with every row through the processors' claims
/// (no handling on receipt).
async fn inbox_each_event_once_through_processors(db: Db) {
    let producer = producer();
    let events: Vec<InboxPending> = (0..60)
        .map(|i| InboxPending::new(if i < 3 { 100 } else { 1000 + i }))
        .collect();
    let ids: Vec<Uuid> = events.iter().map(|e| e.event_id).collect();
    let group = unique_group("backends-inbox-pending");
    prepare_twice_delivered(&producer, &group, &events).await;
    let end = high_watermarks(InboxPending::TOPIC, 2).await;
    let setup = Setup {
        handle_on_receipt: false,
        ..Setup::inbox()
    };
    let running = db.spawn(&group, setup, inbox_pending_pg, inbox_pending_my);
    wait_for_each_once(&db, &ids, &group, InboxPending::TOPIC, &end).await;
    let summary = running.shutdown().await.unwrap();
    assert_stored_once(&db, &ids, summary).await;
    db.drop().await;
}

/// Creates `E`'s topic (two partitions), starts `group` at its end and
/// produces `events`, every tenth twice.
async fn prepare_twice_delivered<E: DomainEvent>(
    producer: &FutureProducer,
    group: &str,
    events: &[E],
) {
    create_topic(E::TOPIC, 2).await;
    start_group_at(group, E::TOPIC, 2, true).await;
    for (i, event) in events.iter().enumerate() {
        produce_to(producer, event, (i % 2) as i32).await;
        if i % 10 == 0 {
            produce_to(producer, event, (i % 2) as i32).await;
        }
    }
}

/// Waits until each of `ids` has one effect, nothing is pending and every
/// offset up to `end` is committed.
async fn wait_for_each_once(db: &Db, ids: &[Uuid], group: &str, topic: &str, end: &[i64]) {
    wait_for_effects(db, ids, &[], "every event handled").await;
    wait_for_empty_inbox(db).await;
    eventually(
        "every offset committed",
        Duration::from_secs(30),
        || async { past(&committed(group, topic, 2).await, end) },
    )
    .await;
}

/// After the consumer stopped: each of `ids` applied once, stored once and
/// processed; the follow-ups recorded with the effects of amount 100 in the
/// outbox. (The other database's run of the test produces to the same
/// topic, whose events this consumer handles too: counts are of these ids,
/// and the summary's at least theirs.)
async fn assert_stored_once(db: &Db, ids: &[Uuid], summary: ConsumerSummary) {
    assert_once(db, ids).await;
    let stored = db.inbox_rows().await;
    for id in ids {
        assert_eq!(stored.get(id), Some(&(1, true)), "inbox rows of {id}");
    }
    assert!(summary.handled >= 60, "{summary:?}");
    assert!(summary.stored >= 60, "{summary:?}");
    assert!(summary.duplicates >= 6, "{summary:?}");
    assert_eq!(
        db.rows("outbox_event").await,
        db.count("SELECT count(*) FROM effect WHERE amount = 100")
            .await,
        "a follow-up event per effect of amount 100"
    );
    assert!(db.rows("outbox_event").await >= 3);
}

/// Inbox, per-key order: five keys of thirty events on one partition,
/// stored pending, four processors claiming three rows at a time: each
/// key's effects once each, in order.
async fn inbox_parallel_processors_keep_per_key_order(db: Db) {
    create_topic(InboxOrdered::TOPIC, 1).await;
    let group = unique_group("backends-inbox-ordered");
    start_group_at(&group, InboxOrdered::TOPIC, 1, true).await;
    let keys = produce_numbered(5, 30, |order_id, amount| InboxOrdered {
        event_id: Uuid::new_v4(),
        order_id,
        amount,
    })
    .await;
    let setup = Setup {
        processors: 4,
        processor_batch_size: 3,
        handle_on_receipt: false,
        ..Setup::inbox()
    };
    let running = db.spawn(&group, setup, inbox_ordered_pg, inbox_ordered_my);
    eventually("all rows processed", Duration::from_secs(60), || async {
        db.count("SELECT count(*) FROM inbox_event WHERE processed = TRUE")
            .await
            == 150
    })
    .await;
    wait_for_empty_inbox(&db).await;
    running.shutdown().await.unwrap();
    assert_applied_in_order(&db, &keys, 30).await;
    assert_eq!(db.rows("effect").await, 150);
    db.drop().await;
}

/// Inbox, hot keys: two keys of 150 rows, one processor claiming 50 at a
/// time: a key's rows go in runs behind its head (well under a transaction
/// per row), and row 7 of each key, failing twice, holds back the rest of
/// its run: each key's effects in order, and only the two 7s have a
/// recorded failed attempt.
async fn inbox_hot_keys_drain_in_runs_and_a_failure_holds_back_its_run(db: Db) {
    create_topic(InboxRun::TOPIC, 1).await;
    let group = unique_group("backends-inbox-runs");
    start_group_at(&group, InboxRun::TOPIC, 1, true).await;
    let keys = produce_numbered(2, 150, |order_id, amount| InboxRun {
        event_id: Uuid::new_v4(),
        order_id,
        amount,
    })
    .await;
    let setup = Setup {
        processors: 1,
        processor_batch_size: 50,
        handle_on_receipt: false,
        ..Setup::inbox()
    };
    let running = db.spawn(&group, setup, inbox_run_pg, inbox_run_my);
    eventually("all rows processed", Duration::from_secs(60), || async {
        db.count("SELECT count(*) FROM inbox_event WHERE processed = TRUE")
            .await
            == 300
    })
    .await;
    wait_for_empty_inbox(&db).await;
    running.shutdown().await.unwrap();
    assert_applied_in_order(&db, &keys, 150).await;
    let transactions = db
        .count("SELECT count(DISTINCT processed_at) FROM inbox_event WHERE processed = TRUE")
        .await;
    assert!(
        transactions < 100,
        "{transactions} transactions for 300 rows of 2 keys"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM inbox_event WHERE attempts > 0")
            .await,
        2,
        "rows with a recorded failure: the two 7s"
    );
    let sevens = db.applied_ids(7).await;
    assert_eq!(sevens.len(), 2);
    for seven in sevens {
        assert_eq!(db.inbox_row(seven).await.0, 1, "the failed attempt of a 7");
    }
    db.drop().await;
}

/// Inbox: a key whose first row always fails is parked after its three
/// attempts with the handler's error; it holds back only its own key,
/// whose later rows then go on in order; every other key flows.
async fn inbox_a_failing_row_is_parked_and_holds_back_only_its_key(db: Db) {
    create_topic(InboxFail::TOPIC, 2).await;
    let group = unique_group("backends-inbox-fail");
    start_group_at(&group, InboxFail::TOPIC, 2, true).await;
    let producer = producer();
    let bad = InboxFail::new(13);
    produce_to(&producer, &bad, 0).await;
    let mut behind = Vec::new();
    for amount in [1001, 1002, 1003] {
        let event = InboxFail {
            event_id: Uuid::new_v4(),
            order_id: bad.order_id,
            amount,
        };
        produce_to(&producer, &event, 0).await;
        behind.push(event.event_id);
    }
    let mut others = Vec::new();
    for i in 0..20 {
        let event = InboxFail::new(2000 + i);
        produce_to(&producer, &event, (i % 2) as i32).await;
        others.push(event.event_id);
    }
    let running = db.spawn(&group, Setup::inbox(), inbox_fail_pg, inbox_fail_my);
    wait_for_effects(&db, &others, &[bad.event_id], "the other keys handled").await;
    wait_for_effects(&db, &behind, &[bad.event_id], "the rows behind it handled").await;
    wait_for_empty_inbox(&db).await;
    let summary = running.shutdown().await.unwrap();
    assert_eq!(summary.parked, 1, "{summary:?}");
    let (attempts, processed, parked, error) = db.inbox_row(bad.event_id).await;
    assert_eq!((attempts, processed, parked), (3, false, true));
    let error = error.unwrap_or_default();
    assert!(error.contains("amount 13 is refused"), "{error}");
    assert_eq!(
        db.applied_by_key().await[&bad.order_id],
        vec![1001, 1002, 1003],
        "the key goes on after its parked row, in order"
    );
    assert_once(&db, &others).await;
    db.drop().await;
}

/// Inbox: SQLSTATE 40001 on the first two calls (both in the processors),
/// then success, with `max_attempts(1)`: handled, no attempt recorded, not
/// parked.
async fn inbox_a_transient_failure_costs_no_attempt(db: Db) {
    create_topic(InboxTransient::TOPIC, 1).await;
    let group = unique_group("backends-inbox-transient");
    start_group_at(&group, InboxTransient::TOPIC, 1, true).await;
    let producer = producer();
    let mut ids = Vec::new();
    for amount in [1001, 40, 1002] {
        let event = InboxTransient::new(amount);
        produce_to(&producer, &event, 0).await;
        ids.push(event.event_id);
    }
    let setup = Setup {
        max_attempts: 1,
        handle_on_receipt: false,
        ..Setup::inbox()
    };
    let running = db.spawn(&group, setup, inbox_transient_pg, inbox_transient_my);
    wait_for_effects(&db, &ids, &[], "all three handled").await;
    wait_for_empty_inbox(&db).await;
    let summary = running.shutdown().await.unwrap();
    assert_once(&db, &ids).await;
    assert_eq!(summary.parked, 0, "{summary:?}");
    assert_eq!(summary.handled, 3, "{summary:?}");
    assert_eq!(db.inbox_row(ids[1]).await, (0, true, false, None));
    db.drop().await;
}

/// Inbox: a handler that never returns is abandoned at the 500 ms timeout
/// and parked (one attempt); the other keys flow meanwhile.
async fn inbox_a_hanging_handler_is_parked(db: Db) {
    create_topic(InboxHang::TOPIC, 2).await;
    let group = unique_group("backends-inbox-hang");
    start_group_at(&group, InboxHang::TOPIC, 2, true).await;
    let producer = producer();
    let hung = InboxHang::new(5);
    produce_to(&producer, &hung, 0).await;
    let mut good = Vec::new();
    for i in 0..10 {
        let event = InboxHang::new(1000 + i);
        produce_to(&producer, &event, (i % 2) as i32).await;
        good.push(event.event_id);
    }
    let setup = Setup {
        max_attempts: 1,
        handler_timeout: Duration::from_millis(500),
        ..Setup::inbox()
    };
    let running = db.spawn(&group, setup, inbox_hang_pg, inbox_hang_my);
    wait_for_effects(&db, &good, &[hung.event_id], "the other events handled").await;
    eventually(
        "the hanging row parked",
        Duration::from_secs(30),
        || async { running.summary().parked == 1 },
    )
    .await;
    running.shutdown().await.unwrap();
    let (attempts, _, parked, error) = db.inbox_row(hung.event_id).await;
    assert_eq!((attempts, parked), (1, true));
    let error = error.unwrap_or_default();
    assert!(error.contains("did not return within"), "{error}");
    assert_once(&db, &good).await;
    db.drop().await;
}

/// Inbox, a rolling deploy: a consumer that keeps event types it has no
/// handler for (`UnknownEventPolicy::Keep`) stores them, and their key
/// waits behind them (its later rows too) while the other keys flow; a
/// consumer of the same group that handles the new type takes them up, in
/// order.
async fn inbox_rows_without_a_handler_wait_for_one(db: Db) {
    create_topic(InboxOld::TOPIC, 1).await;
    let group = unique_group("backends-inbox-deploy");
    start_group_at(&group, InboxOld::TOPIC, 1, true).await;
    let producer = producer();
    let (waiting, flowing) = (Uuid::new_v4(), Uuid::new_v4());
    let old = |order_id, amount| InboxOld {
        event_id: Uuid::new_v4(),
        order_id,
        amount,
    };
    let first = old(waiting, 1);
    let new = InboxNew {
        event_id: Uuid::new_v4(),
        order_id: waiting,
        amount: 2,
    };
    let third = old(waiting, 3);
    let others = [old(flowing, 1), old(flowing, 2)];
    produce_to(&producer, &first, 0).await;
    produce_to(&producer, &new, 0).await;
    produce_to(&producer, &third, 0).await;
    for event in &others {
        produce_to(&producer, event, 0).await;
    }
    let setup = Setup {
        unknown: UnknownEventPolicy::Keep,
        ..Setup::inbox()
    };
    let running = db.spawn(&group, setup, inbox_old_pg, inbox_old_my);
    let handled_now: Vec<Uuid> = [first.event_id]
        .into_iter()
        .chain(others.iter().map(|e| e.event_id))
        .collect();
    wait_for_effects(&db, &handled_now, &[], "the handled types").await;
    // Long enough for a processor to have claimed the waiting key often.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        db.effects(&[new.event_id, third.event_id]).await.is_empty(),
        "the kept row or the one behind it ran"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM inbox_event WHERE processed = FALSE AND parked_at IS NULL")
            .await,
        2
    );
    assert_eq!(db.rows("inbox_key").await, 1, "the waiting key only");
    running.shutdown().await.unwrap();
    let running = db.spawn_with(
        &group,
        Setup::inbox(),
        |b| b.handler(inbox_old_pg).handler(inbox_new_pg),
        |b| b.handler(inbox_old_my).handler(inbox_new_my),
    );
    wait_for_effects(
        &db,
        &[new.event_id, third.event_id],
        &[],
        "the new version handles the waiting key",
    )
    .await;
    wait_for_empty_inbox(&db).await;
    running.shutdown().await.unwrap();
    assert_eq!(db.applied_by_key().await[&waiting], vec![1, 2, 3]);
    db.drop().await;
}

/// The gate of the retried-row test: row 13 fails until healed; row 2
/// waits, once its call has begun, until the test opens the gate.
struct Gate {
    healed: std::sync::atomic::AtomicBool,
    /// Calls of row 2 so far.
    entered: std::sync::atomic::AtomicUsize,
    open: tokio::sync::Semaphore,
}

static GATE: Gate = Gate {
    healed: std::sync::atomic::AtomicBool::new(false),
    entered: std::sync::atomic::AtomicUsize::new(0),
    open: tokio::sync::Semaphore::const_new(0),
};

impl Gate {
    async fn pass(&self, amount: i64) -> Result<(), HandlerError> {
        match amount {
            13 if !self.healed.load(std::sync::atomic::Ordering::SeqCst) => {
                Err(HandlerError::new("row 13 fails until healed"))
            }
            2 => {
                self.entered
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                self.open.acquire().await.expect("open").forget();
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

#[event_handler]
async fn inbox_gate_pg(
    tx: &mut Transaction<'_, Postgres>,
    event: InboxGate,
) -> Result<(), HandlerError> {
    GATE.pass(event.amount).await?;
    sqlx::query("INSERT INTO effect (event_id, order_id, amount) VALUES ($1, $2, $3)")
        .bind(event.event_id)
        .bind(event.order_id)
        .bind(event.amount)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[event_handler]
async fn inbox_gate_my(
    tx: &mut Transaction<'_, MySql>,
    event: InboxGate,
) -> Result<(), HandlerError> {
    GATE.pass(event.amount).await?;
    sqlx::query("INSERT INTO effect (event_id, order_id, amount) VALUES (?, ?, ?)")
        .bind(event.event_id)
        .bind(event.order_id)
        .bind(event.amount)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Inbox: a parked row made pending again by hand (as an operator's retry
/// does, its key's head moved back to it) while a processor is in the
/// middle of the key's later row: once that processor commits and moves
/// the key's head on, the retried row is still its head and is handled,
/// not stranded behind the row just processed. One test per process (the
/// gate is global), run on each database in turn.
async fn inbox_a_row_retried_while_its_key_is_claimed_is_handled(db: Db) {
    create_topic(InboxGate::TOPIC, 1).await;
    let group = unique_group("backends-inbox-gate");
    start_group_at(&group, InboxGate::TOPIC, 1, true).await;
    GATE.healed
        .store(false, std::sync::atomic::Ordering::SeqCst);
    // Closed: permits left by the other database's run are taken back.
    while let Ok(permit) = GATE.open.try_acquire() {
        permit.forget();
    }
    let producer = producer();
    let parked = InboxGate::new(13);
    let later = InboxGate {
        event_id: Uuid::new_v4(),
        order_id: parked.order_id,
        amount: 2,
    };
    let setup = Setup {
        max_attempts: 1,
        handle_on_receipt: false,
        processors: 1,
        ..Setup::inbox()
    };
    let running = db.spawn(&group, setup, inbox_gate_pg, inbox_gate_my);
    produce_to(&producer, &parked, 0).await;
    eventually("the first row parked", Duration::from_secs(30), || async {
        db.is_parked(parked.event_id).await
    })
    .await;
    let calls = GATE.entered.load(std::sync::atomic::Ordering::SeqCst);
    produce_to(&producer, &later, 0).await;
    eventually(
        "the later row's call begun",
        Duration::from_secs(30),
        || async { GATE.entered.load(std::sync::atomic::Ordering::SeqCst) > calls },
    )
    .await;
    // The processor holds the key's later row; the first row comes back.
    GATE.healed.store(true, std::sync::atomic::Ordering::SeqCst);
    db.unpark_by_hand(parked.event_id).await;
    GATE.open.add_permits(10);
    wait_for_effects(
        &db,
        &[later.event_id, parked.event_id],
        &[],
        "both rows handled",
    )
    .await;
    wait_for_empty_inbox(&db).await;
    running.shutdown().await.unwrap();
    db.drop().await;
}

/// [`inbox_a_row_retried_while_its_key_is_claimed_is_handled`] on both
/// databases, one after the other (the gate is global).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_a_row_retried_while_its_key_is_claimed_is_handled_on_both() {
    inbox_a_row_retried_while_its_key_is_claimed_is_handled(Db::postgres().await).await;
    inbox_a_row_retried_while_its_key_is_claimed_is_handled(Db::mariadb().await).await;
}

mod inbox {
    use super::*;

    on_both!(
        inbox_each_event_once,
        inbox_each_event_once_through_processors,
        inbox_parallel_processors_keep_per_key_order,
        inbox_hot_keys_drain_in_runs_and_a_failure_holds_back_its_run,
        inbox_a_failing_row_is_parked_and_holds_back_only_its_key,
        inbox_a_transient_failure_costs_no_attempt,
        inbox_a_handler_that_ends_its_transaction_is_parked,
        inbox_a_hanging_handler_is_parked,
        inbox_rows_without_a_handler_wait_for_one,
    );
}
