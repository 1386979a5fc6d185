//! Dispatch: the event type comes from the header, else the payload's
//! `event_type`, else the topic's only handler (the seed's producer format:
//! value JSON with `event_id`, no headers); registration mistakes fail `build`.
#![allow(missing_docs)]

mod consumer_support;

use std::time::Duration;

use consumer_support::*;
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::DomainEvent;
use txoutbox_runtime::consumer::{BuildError, Consumer, EventMeta, event_handler};
use uuid::Uuid;

test_event!(SeedPaid, "consumer-test.dispatch.seed", "SeedPaid");
test_event!(MultiCreated, "consumer-test.dispatch.multi", "MultiCreated");
test_event!(
    MultiCancelled,
    "consumer-test.dispatch.multi",
    "MultiCancelled"
);

#[event_handler]
async fn on_seed_paid(
    tx: &mut Transaction<'_, Postgres>,
    event: SeedPaid,
    meta: &EventMeta,
) -> Result<(), sqlx::Error> {
    assert!(meta.headers.is_empty() && meta.key.is_none());
    record_effect(tx, event.event_id, event.amount, &meta.event_type).await
}

#[sqlx::test(migrations = false)]
async fn a_message_in_the_seeds_format_is_dispatched(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(SeedPaid::TOPIC, 1).await;
    let group = unique_group("seed");
    start_group_at(&group, SeedPaid::TOPIC, 1, true).await;
    let event_id = Uuid::new_v4();
    // What the seed's Python relay sends: JSON with event_id, no headers, no key.
    let value = format!(
        r#"{{"event_id":"{event_id}","order_id":"{}","amount":9}}"#,
        Uuid::new_v4()
    );
    produce(&producer(), SeedPaid::TOPIC, None, value.as_bytes(), &[]).await;
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_seed_paid)
        .build()
        .unwrap()
        .spawn();
    eventually("the event handled", Duration::from_secs(20), || async {
        count(&pool, "SELECT count(*) FROM effect").await == 1
    })
    .await;
    running.shutdown().await.unwrap();
    let (id, note): (Uuid, String) = sqlx::query_as("SELECT event_id, note FROM effect")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!((id, note.as_str()), (event_id, "SeedPaid"));
}

#[event_handler]
async fn on_multi_created(
    tx: &mut Transaction<'_, Postgres>,
    event: MultiCreated,
) -> Result<(), sqlx::Error> {
    record_effect(tx, event.event_id, event.amount, "created").await
}

#[event_handler]
async fn on_multi_cancelled(
    tx: &mut Transaction<'_, Postgres>,
    event: MultiCancelled,
) -> Result<(), sqlx::Error> {
    record_effect(tx, event.event_id, event.amount, "cancelled").await
}

#[sqlx::test(migrations = false)]
async fn the_payload_event_type_routes_when_a_topic_has_several_handlers(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(MultiCreated::TOPIC, 1).await;
    let group = unique_group("multi");
    start_group_at(&group, MultiCreated::TOPIC, 1, true).await;
    let producer = producer();
    let body = |event_type: Option<&str>, amount: i64| {
        let mut v = serde_json::json!({
            "event_id": Uuid::new_v4(), "order_id": Uuid::new_v4(), "amount": amount
        });
        if let Some(t) = event_type {
            v["event_type"] = t.into();
        }
        serde_json::to_vec(&v).unwrap()
    };
    let topic = MultiCreated::TOPIC;
    produce(&producer, topic, None, &body(Some("MultiCreated"), 1), &[]).await;
    produce(
        &producer,
        topic,
        None,
        &body(Some("MultiCancelled"), 2),
        &[],
    )
    .await;
    // No type anywhere and two handlers: unknown, skipped by the default policy.
    produce(&producer, topic, None, &body(None, 3), &[]).await;
    // The header wins over the payload field.
    produce(
        &producer,
        topic,
        None,
        &body(Some("MultiCreated"), 4),
        &[("event_type", "MultiCancelled")],
    )
    .await;
    let end = high_watermarks(topic, 1).await;
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_multi_created)
        .handler(on_multi_cancelled)
        .build()
        .unwrap()
        .spawn();
    eventually("all four consumed", Duration::from_secs(20), || async {
        committed(&group, topic, 1).await == end
    })
    .await;
    running.shutdown().await.unwrap();
    let effects: Vec<(i64, String)> =
        sqlx::query_as("SELECT amount, note FROM effect ORDER BY amount")
            .fetch_all(&pool)
            .await
            .unwrap();
    let expected = [(1, "created"), (2, "cancelled"), (4, "cancelled")];
    let effects: Vec<(i64, &str)> = effects.iter().map(|(a, n)| (*a, n.as_str())).collect();
    assert_eq!(effects, expected);
}

#[event_handler]
async fn on_multi_created_again(
    _tx: &mut Transaction<'_, Postgres>,
    _event: MultiCreated,
) -> Result<(), sqlx::Error> {
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn registration_mistakes_fail_build(pool: PgPool) {
    let duplicate = Consumer::builder(pool.clone(), kafka_config(), "g")
        .handler(on_multi_created)
        .handler(on_multi_cancelled)
        .handler(on_multi_created_again)
        .build();
    let Err(BuildError::DuplicateHandlers { duplicates }) = duplicate else {
        panic!("duplicate handlers accepted");
    };
    assert_eq!(
        duplicates,
        "`on_multi_created` and `on_multi_created_again` both handle `MultiCreated` on topic `consumer-test.dispatch.multi`"
    );
    let none = Consumer::builder(pool.clone(), kafka_config(), "g").build();
    assert!(matches!(none, Err(BuildError::NoHandlers)));
    // The group id is indexed with every dedup and inbox row.
    let long_group = Consumer::builder(pool, kafka_config(), "g".repeat(1025))
        .handler(on_multi_created)
        .build();
    let Err(BuildError::InvalidConfig(why)) = long_group else {
        panic!("a group id PostgreSQL cannot index accepted");
    };
    assert!(why.contains("shorter group id"), "{why}");
}

/// Dropping a consumer's handle stops it, as dropping a relay's does.
#[sqlx::test(migrations = false)]
async fn dropping_the_handle_stops_the_consumer(pool: PgPool) {
    prepare_db(&pool).await;
    create_topic(SeedPaid::TOPIC, 1).await;
    // `spawn()` on the builder is `build()?.spawn()`, as for a relay.
    let running = Consumer::builder(pool.clone(), kafka_config(), unique_group("drop"))
        .handler(on_seed_paid)
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(running.is_running());
    let token = running.cancellation_token();
    let stopped = running.stopped();
    drop(running);
    assert!(token.is_cancelled());
    let stopped = tokio::time::timeout(Duration::from_secs(20), stopped)
        .await
        .expect("the consumer stops after its handle is dropped");
    assert_eq!(stopped, txoutbox_runtime::lifecycle::Stopped::Requested);
}
