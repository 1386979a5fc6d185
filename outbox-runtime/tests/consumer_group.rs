//! Two consumers in one group share the partitions and together handle every
//! event exactly once, across the rebalance that the second one's arrival causes.
#![allow(missing_docs)]

mod consumer_support;

use std::time::Duration;

use consumer_support::*;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::DomainEvent;
use txoutbox_runtime::consumer::{Consumer, EventMeta, Mode, event_handler};

test_event!(GroupPaid, "consumer-test.group.paid", "GroupPaid");
test_event!(
    GroupInboxPaid,
    "consumer-test.group.inbox",
    "GroupInboxPaid"
);

/// Notes which consumer (by its pool's `application_name`) handled the event.
#[event_handler]
async fn on_group_paid(
    tx: &mut Transaction<'_, Postgres>,
    event: GroupPaid,
    meta: &EventMeta,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO effect (event_id, amount, note)
         VALUES ($1, $2, current_setting('application_name') || '/' || $3)",
    )
    .bind(event.event_id)
    .bind(event.amount)
    .bind(meta.partition.unwrap_or(-1).to_string())
    .execute(&mut **tx)
    .await
    .map(drop)
}

#[event_handler]
async fn on_group_inbox_paid(
    tx: &mut Transaction<'_, Postgres>,
    event: GroupInboxPaid,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO effect (event_id, amount, note) VALUES ($1, $2, current_setting('application_name'))",
    )
    .bind(event.event_id)
    .bind(event.amount)
    .execute(&mut **tx)
    .await
    .map(drop)
}

async fn named_pool(pool: &PgPool, name: &str) -> PgPool {
    let options = (*pool.connect_options()).clone().application_name(name);
    PgPoolOptions::new()
        .max_connections(3)
        .connect_with(options)
        .await
        .unwrap()
}

async fn two_consumers_share_the_work<E: DomainEvent>(
    pool: PgPool,
    mode: Mode,
    build: impl Fn(PgPool, &str) -> txoutbox_runtime::consumer::ConsumerBuilder,
    make: impl Fn(i64) -> E,
) {
    prepare_db(&pool).await;
    const PARTITIONS: i32 = 4;
    create_topic(E::TOPIC, PARTITIONS).await;
    let group = unique_group("group");
    start_group_at(&group, E::TOPIC, PARTITIONS, true).await;
    let producer = producer();
    for i in 0..200 {
        produce_event(&producer, &make(i)).await;
    }
    let first = build(named_pool(&pool, "consumer-a").await, &group)
        .mode(mode)
        .build()
        .unwrap()
        .spawn();
    eventually(
        "the first consumer working",
        Duration::from_secs(20),
        || async { count(&pool, "SELECT count(*) FROM effect").await > 0 },
    )
    .await;
    let second = build(named_pool(&pool, "consumer-b").await, &group)
        .mode(mode)
        .build()
        .unwrap()
        .spawn();
    for i in 200..400 {
        produce_event(&producer, &make(i)).await;
    }
    let end = high_watermarks(E::TOPIC, PARTITIONS).await;
    eventually(
        "all 400 events handled",
        Duration::from_secs(25),
        || async { count(&pool, "SELECT count(*) FROM effect").await >= 400 },
    )
    .await;
    eventually("all offsets committed", Duration::from_secs(15), || async {
        committed(&group, E::TOPIC, PARTITIONS).await == end
    })
    .await;
    first.shutdown().await.unwrap();
    second.shutdown().await.unwrap();

    assert_eq!(count(&pool, "SELECT count(*) FROM effect").await, 400);
    assert_eq!(
        count(&pool, "SELECT count(DISTINCT event_id) FROM effect").await,
        400
    );
    if mode == Mode::Dedup {
        // In dedup mode the handler runs on the consumer that owns the
        // partition, so this shows the group really split the partitions.
        let b = count(
            &pool,
            "SELECT count(*) FROM effect WHERE note LIKE 'consumer-b/%'",
        )
        .await;
        assert!(
            b > 0,
            "the second consumer got no partition: no group rebalance"
        );
    }
}

#[sqlx::test(migrations = false)]
async fn two_dedup_consumers_in_one_group_handle_every_event_once(pool: PgPool) {
    two_consumers_share_the_work(
        pool,
        Mode::Dedup,
        |pool, group| {
            Consumer::builder(pool, kafka_config(), group)
                .handler(on_group_paid)
                .batch_size(20)
        },
        GroupPaid::new,
    )
    .await;
}

#[sqlx::test(migrations = false)]
async fn two_inbox_consumers_in_one_group_handle_every_event_once(pool: PgPool) {
    two_consumers_share_the_work(
        pool,
        Mode::Inbox,
        |pool, group| {
            Consumer::builder(pool, kafka_config(), group)
                .handler(on_group_inbox_paid)
                .batch_size(20)
                .processor_batch_size(10)
        },
        GroupInboxPaid::new,
    )
    .await;
}
