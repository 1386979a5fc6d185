//! The relay's bookkeeping of one row cannot hold a batch hostage: a row
//! whose failure cannot be recorded is parked, and the rest of its batch is
//! marked published once (real PostgreSQL, real broker).

mod relay_support;

use std::collections::HashMap;
use std::time::Duration;

use relay_support::*;
use sqlx::PgPool;
use txoutbox_core::Backoff;
use txoutbox_runtime::ops::dead_letters::{self, Selection, Table};
use txoutbox_runtime::relay::Relay;

/// A key PostgreSQL cannot put into a b-tree (over 2,704 bytes, and md5 hex
/// does not compress enough to fit), as rows written before the key length
/// limit existed, or by another writer, may have.
async fn unindexable_key(pool: &PgPool) -> String {
    sqlx::query_scalar("SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 125)")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn a_row_whose_failure_cannot_be_recorded_is_parked_and_its_batch_marked_once(pool: PgPool) {
    migrated(&pool).await;
    let brokers = brokers();
    let topic = unique_topic("bookkeeping");
    create_topic(&brokers, &topic, 2).await;
    let long_key = unindexable_key(&pool).await;
    assert!(long_key.len() > 3_000);

    // Refused by the producer (over its 20 kB limit): recording the refusal
    // sets next_attempt_at, which puts the key into ix_outbox_event_retrying.
    let mut events = vec![NewEvent {
        filler: 30_000,
        ..NewEvent::new(&topic, long_key.clone(), 0)
    }];
    // An over-long key the broker accepts is published like any other.
    events.push(NewEvent::new(&topic, format!("{long_key}-ok"), 0));
    events.extend((0..200).map(|i| NewEvent::new(&topic, format!("k{}", i % 20), i)));
    let ids = insert(&pool, &events).await;

    let mut kafka = kafka_config(&brokers);
    kafka.set("message.max.bytes", "20000");
    let relay = Relay::builder(pool.clone(), kafka)
        .max_attempts(3)
        .retry_backoff(Backoff::new(
            Duration::from_millis(100),
            Duration::from_secs(300),
        ))
        .error_backoff(Backoff::new(
            Duration::from_millis(100),
            Duration::from_millis(200),
        ))
        .spawn()
        .unwrap();
    eventually(
        "every row but the refused one published",
        Duration::from_secs(20),
        || async { unpublished(&pool).await == 1 },
    )
    .await;
    eventually(
        "the refused row parked",
        Duration::from_secs(10),
        || async {
            dead_letters::count(&pool, Table::Outbox, &Selection::All)
                .await
                .unwrap()
                == 1
        },
    )
    .await;
    // Give a looping relay the time to publish its batch again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let summary = relay.shutdown().await.unwrap();
    assert!(summary.clean);
    assert_eq!(summary.published, 201, "{summary:?}");

    let parked_rows = dead_letters::list(&pool, Table::Outbox, &Selection::All, 10)
        .await
        .unwrap();
    let row = &parked_rows[0];
    assert_eq!(row.event_id, ids[0]);
    let error = row.last_error.as_deref().unwrap_or_default();
    assert!(error.contains("could not record"), "{error}");

    let received = read_topic(&brokers, &topic, 201, Duration::from_secs(15)).await;
    let mut copies: HashMap<uuid::Uuid, usize> = HashMap::new();
    for record in &received {
        *copies.entry(record.event_id()).or_default() += 1;
    }
    assert!(
        !copies.contains_key(&ids[0]),
        "the refused row never went out"
    );
    for id in &ids[1..] {
        assert_eq!(
            copies.get(id),
            Some(&1),
            "event {id} published exactly once"
        );
    }
}
