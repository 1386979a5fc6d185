//! Debezium's outbox event router, both ways, on the real broker.
//!
//! Its records, as its documented defaults make them: topic
//! `outbox.event.<aggregatetype>`, key = the row's `aggregateid`, header
//! `id` = the event id, the event type in the header that
//! `table.fields.additional.placement=type:header:eventType` names, and the
//! value = the `payload` column, which Kafka Connect's `JsonConverter`
//! (schemas off) writes as a JSON string holding the object, or as the object
//! itself with `table.expand.json.payload=true`. No `event_id` in the
//! payload, no headers of ours.
//!
//! - Our consumers read such records with one setting (the type header's
//!   name), in dedup and inbox mode, deduplicating on the `id` header.
//! - A relay configured with `HeaderNames::debezium()` sends records a
//!   Debezium-fed consumer reads as it read the router's, and our own
//!   consumers, with no setting, still read them.
#![allow(missing_docs)]

mod consumer_support;

use std::time::Duration;

use consumer_support::*;
use rdkafka::Message;
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::{DomainEvent, Events};
use txoutbox_runtime::consumer::{Consumer, EventMeta, Mode, event_handler};
use txoutbox_runtime::relay::{HeaderNames, Relay};
use txoutbox_testkit::broker::client_config;
use uuid::Uuid;

test_event!(DbzCreated, "outbox.event.dbzorder", "OrderCreated");
test_event!(DbzCancelled, "outbox.event.dbzorder", "OrderCancelled");

// The relay's test has a topic of its own: tests run in parallel.
test_event!(MovedCreated, "outbox.event.dbzmoved", "OrderCreated");
test_event!(MovedCancelled, "outbox.event.dbzmoved", "OrderCancelled");

const TOPIC: &str = DbzCreated::TOPIC;
const MOVED: &str = MovedCreated::TOPIC;

#[event_handler]
async fn on_created(
    tx: &mut Transaction<'_, Postgres>,
    event: DbzCreated,
    meta: &EventMeta,
) -> Result<(), sqlx::Error> {
    record_effect(tx, event.event_id, event.amount, &meta.event_type).await
}

#[event_handler]
async fn on_cancelled(
    tx: &mut Transaction<'_, Postgres>,
    event: DbzCancelled,
    meta: &EventMeta,
) -> Result<(), sqlx::Error> {
    record_effect(tx, event.event_id, event.amount, &meta.event_type).await
}

#[event_handler]
async fn on_moved_created(
    tx: &mut Transaction<'_, Postgres>,
    event: MovedCreated,
    meta: &EventMeta,
) -> Result<(), sqlx::Error> {
    record_effect(tx, event.event_id, event.amount, &meta.event_type).await
}

#[event_handler]
async fn on_moved_cancelled(
    tx: &mut Transaction<'_, Postgres>,
    event: MovedCancelled,
    meta: &EventMeta,
) -> Result<(), sqlx::Error> {
    record_effect(tx, event.event_id, event.amount, &meta.event_type).await
}

/// One record as the router sends it.
struct RouterRecord {
    id: Uuid,
    aggregate_id: Uuid,
    event_type: &'static str,
    amount: i64,
    /// `table.expand.json.payload=true`: the value is the object itself.
    expanded: bool,
}

impl RouterRecord {
    fn value(&self) -> Vec<u8> {
        // The outbox row's payload column, as the application wrote it: its
        // own fields, no event id (that is the row's `id` column).
        let payload = format!(
            r#"{{"order_id": "{}", "amount": {}}}"#,
            self.aggregate_id, self.amount
        );
        if self.expanded {
            payload.into_bytes()
        } else {
            serde_json::to_vec(&payload).unwrap()
        }
    }

    async fn send(&self, producer: &rdkafka::producer::FutureProducer) {
        let id = self.id.to_string();
        produce(
            producer,
            TOPIC,
            Some(&self.aggregate_id.to_string()),
            &self.value(),
            &[("id", &id), ("eventType", self.event_type)],
        )
        .await;
    }
}

#[sqlx::test(migrations = false)]
async fn records_of_debeziums_outbox_router_are_consumed_with_one_setting(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(TOPIC, 1).await;
    let producer = producer();
    for mode in [Mode::Dedup, Mode::Inbox] {
        sqlx::query("TRUNCATE effect").execute(&pool).await.unwrap();
        let group = unique_group("debezium");
        start_group_at(&group, TOPIC, 1, true).await;
        let records = [
            RouterRecord {
                id: Uuid::new_v4(),
                aggregate_id: Uuid::new_v4(),
                event_type: "OrderCreated",
                amount: 1,
                expanded: false,
            },
            RouterRecord {
                id: Uuid::new_v4(),
                aggregate_id: Uuid::new_v4(),
                event_type: "OrderCancelled",
                amount: 2,
                expanded: true,
            },
        ];
        for record in &records {
            record.send(&producer).await;
        }
        // Delivered again (a connector restart resends from its last
        // committed source offset): the `id` header deduplicates it.
        records[0].send(&producer).await;
        let end = high_watermarks(TOPIC, 1).await;
        let running = Consumer::builder(pool.clone(), kafka_config(), &group)
            .mode(mode)
            .event_type_header("eventType")
            .handler(on_created)
            .handler(on_cancelled)
            .build()
            .unwrap()
            .spawn();
        eventually(
            &format!("{mode:?}: all three consumed"),
            Duration::from_secs(30),
            || async { committed(&group, TOPIC, 1).await == end },
        )
        .await;
        eventually(
            &format!("{mode:?}: both applied"),
            Duration::from_secs(30),
            || async {
                effects_of(&pool, &[records[0].id, records[1].id])
                    .await
                    .len()
                    >= 2
            },
        )
        .await;
        running.shutdown().await.unwrap();
        assert_eq!(
            effects_of(&pool, &[records[0].id, records[1].id]).await,
            [
                (records[0].id, 1, "OrderCreated".to_owned()),
                (records[1].id, 2, "OrderCancelled".to_owned()),
            ],
            "{mode:?}: each event applied once, routed by its eventType header, \
             with the `id` header as its event id"
        );
        let waiting: i64 = count(
            &pool,
            "SELECT count(*) FROM inbox_event WHERE processed_at IS NULL",
        )
        .await;
        assert_eq!(waiting, 0, "{mode:?}: nothing left in the inbox");
    }
}

/// The migration path: the relay takes the router's place with
/// `HeaderNames::debezium()`; a consumer written against the router (reads
/// `id` and `eventType`) and our consumer with no setting both read it.
#[sqlx::test(migrations = false)]
async fn a_relay_with_debeziums_header_names_replaces_the_router(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(MOVED, 1).await;
    let from = high_watermarks(MOVED, 1).await[0];
    let group = unique_group("after-debezium");
    start_group_at(&group, MOVED, 1, true).await;
    let (created, cancelled) = (MovedCreated::new(10), MovedCancelled::new(20));
    let mut events = Events::new();
    events.record(created.clone());
    events.record(cancelled.clone());
    let mut conn = pool.acquire().await.unwrap();
    txoutbox_core::insert_events(&mut conn, &events)
        .await
        .unwrap();
    drop(conn);

    assert!(matches!(
        Relay::builder(pool.clone(), client_config(&brokers()))
            .header_names(HeaderNames::debezium().aggregate_id("id"))
            .build(),
        Err(txoutbox_runtime::relay::BuildError::HeaderNames(problem))
            if problem.contains("both named `id`")
    ));
    let relay = Relay::builder(pool.clone(), client_config(&brokers()))
        .header_names(HeaderNames::debezium())
        .spawn()
        .unwrap();
    let ours = [created.event_id, cancelled.event_id];
    let is_ours = |message: &rdkafka::message::OwnedMessage| {
        header(message, "id")
            .and_then(|id| id.parse::<Uuid>().ok())
            .is_some_and(|id| ours.contains(&id))
    };
    let read = read_until(MOVED, from, Duration::from_secs(30), |read| {
        read.iter().filter(|m| is_ours(m)).count() >= 2
    })
    .await;

    // What a consumer written against the router reads.
    let mut seen = Vec::new();
    for message in read.iter().filter(|m| is_ours(m)) {
        let id: Uuid = header(message, "id").unwrap().parse().unwrap();
        let event_type = header(message, "eventType").unwrap();
        assert_eq!(header(message, "event_id"), None, "renamed, not doubled");
        assert_eq!(header(message, "event_type"), None);
        let value: serde_json::Value = serde_json::from_slice(message.payload().unwrap()).unwrap();
        let key = String::from_utf8(message.key().unwrap().to_vec()).unwrap();
        assert_eq!(
            key,
            value["order_id"].as_str().unwrap(),
            "key = aggregate id"
        );
        seen.push((id, event_type, value["amount"].as_i64().unwrap()));
    }
    assert_eq!(
        seen,
        [
            (created.event_id, "OrderCreated".to_owned(), 10),
            (cancelled.event_id, "OrderCancelled".to_owned(), 20),
        ]
    );

    // Our consumer, told nothing: the value names the id and the type.
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_moved_created)
        .handler(on_moved_cancelled)
        .build()
        .unwrap()
        .spawn();
    eventually("both applied", Duration::from_secs(30), || async {
        effects_of(&pool, &[created.event_id, cancelled.event_id])
            .await
            .len()
            >= 2
    })
    .await;
    running.shutdown().await.unwrap();
    relay.shutdown().await.unwrap();
    assert_eq!(
        effects_of(&pool, &[created.event_id, cancelled.event_id]).await,
        [
            (created.event_id, 10, "OrderCreated".to_owned()),
            (cancelled.event_id, 20, "OrderCancelled".to_owned()),
        ]
    );
}
