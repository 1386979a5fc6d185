//! A consumer-side handler that reacts with events of its own
//! (`events: &mut Events`): they reach `outbox_event` in the consumer's
//! transaction, exactly once per handled event, never for a failed or
//! duplicate one, and the relay of the process is woken after the commit:
//! after every commit that stored some, however the transactions of
//! concurrent processors interleave.
#![allow(missing_docs)]

mod consumer_support;

use std::time::Duration;

use consumer_support::*;
use sqlx::{PgPool, Postgres, Transaction};
use txoutbox_core::Backoff;
use txoutbox_core::{DomainEvent, Events};
use txoutbox_runtime::consumer::{Consumer, Mode, event_handler};
use txoutbox_runtime::relay::Relay;

test_event!(ReactPaid, "consumer-test.react.paid", "ReactPaid");
test_event!(ReactInbox, "consumer-test.react.inbox", "ReactInbox");
test_event!(Answered, "consumer-test.react.answered", "Answered");

async fn react(
    tx: &mut Transaction<'_, Postgres>,
    events: &mut Events,
    event_id: uuid::Uuid,
    order_id: uuid::Uuid,
    amount: i64,
) -> Result<(), String> {
    sqlx::query("INSERT INTO effect (event_id, amount) VALUES ($1, $2)")
        .bind(event_id)
        .bind(amount)
        .execute(&mut **tx)
        .await
        .map_err(|e| e.to_string())?;
    events.record(Answered {
        event_id: uuid::Uuid::new_v4(),
        order_id,
        amount,
    });
    // Fails after recording: the recorded event must roll back with the effect.
    if amount < 0 {
        return Err(format!("refusing amount {amount}"));
    }
    Ok(())
}

#[event_handler]
async fn on_react_paid(
    tx: &mut Transaction<'_, Postgres>,
    event: ReactPaid,
    events: &mut Events,
) -> Result<(), String> {
    react(tx, events, event.event_id, event.order_id, event.amount).await
}

#[event_handler]
async fn on_react_inbox(
    tx: &mut Transaction<'_, Postgres>,
    event: ReactInbox,
    events: &mut Events,
) -> Result<(), String> {
    react(tx, events, event.event_id, event.order_id, event.amount).await
}

async fn answered_keys(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT partition_key FROM outbox_event WHERE event_type = 'Answered' ORDER BY partition_key",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

// One test for both modes: the wake-up is process-wide, so no other test of
// this binary may record events while the first phase waits for it.
#[sqlx::test(migrations = false)]
async fn recorded_events_are_stored_once_with_the_effect(pool: PgPool) {
    prepare_db(&pool).await;
    dedup_mode_stores_recorded_events_once_and_wakes_the_relay(&pool).await;
    sqlx::raw_sql("TRUNCATE effect, outbox_event")
        .execute(&pool)
        .await
        .unwrap();
    inbox_mode_stores_recorded_events_with_the_processed_mark(&pool).await;
    sqlx::raw_sql("TRUNCATE effect, outbox_event")
        .execute(&pool)
        .await
        .unwrap();
    every_commit_that_stored_recorded_events_wakes_the_relay(&pool).await;
}

async fn dedup_mode_stores_recorded_events_once_and_wakes_the_relay(pool: &PgPool) {
    create_topic(ReactPaid::TOPIC, 1).await;
    create_topic(&format!("{}.dlq", ReactPaid::TOPIC), 1).await;
    let group = unique_group("react");
    start_group_at(&group, ReactPaid::TOPIC, 1, true).await;

    let good: Vec<ReactPaid> = (1..=4).map(ReactPaid::new).collect();
    let poison = ReactPaid::new(-1);
    let producer = producer();
    for event in &good {
        produce_event(&producer, event).await;
    }
    produce_event(&producer, &good[0]).await; // a redelivery
    produce_event(&producer, &poison).await;
    let end = high_watermarks(ReactPaid::TOPIC, 1).await;

    let mut wakeup = txoutbox_core::__private::wakeup::listener();
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_react_paid)
        .max_attempts(2)
        .backoff(Backoff::new(
            Duration::from_millis(20),
            Duration::from_millis(50),
        ))
        .build()
        .unwrap()
        .spawn();
    tokio::time::timeout(Duration::from_secs(20), wakeup.committed())
        .await
        .expect("the relay is woken after a commit that stored recorded events");
    eventually(
        "good events handled, poison dead-lettered",
        Duration::from_secs(25),
        || async {
            count(pool, "SELECT count(*) FROM processed_event").await == 4
                && committed(&group, ReactPaid::TOPIC, 1).await == end
        },
    )
    .await;
    running.shutdown().await.unwrap();

    let mut expected: Vec<String> = good.iter().map(|e| e.order_id.to_string()).collect();
    expected.sort();
    assert_eq!(
        answered_keys(pool).await,
        expected,
        "one Answered per handled event"
    );
    assert_eq!(count(pool, "SELECT count(*) FROM effect").await, 4);
}

async fn inbox_mode_stores_recorded_events_with_the_processed_mark(pool: &PgPool) {
    create_topic(ReactInbox::TOPIC, 1).await;
    let group = unique_group("react-inbox");
    start_group_at(&group, ReactInbox::TOPIC, 1, true).await;

    let good: Vec<ReactInbox> = (1..=3).map(ReactInbox::new).collect();
    let poison = ReactInbox::new(-5);
    let producer = producer();
    for event in good.iter().chain([&poison]) {
        produce_event(&producer, event).await;
    }
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_react_inbox)
        .mode(Mode::Inbox)
        .max_attempts(2)
        .backoff(Backoff::new(
            Duration::from_millis(20),
            Duration::from_millis(50),
        ))
        .processor_poll_interval(Duration::from_millis(20))
        .build()
        .unwrap()
        .spawn();
    eventually(
        "rows processed or parked",
        Duration::from_secs(25),
        || async {
            count(pool, "SELECT count(*) FROM inbox_event WHERE processed").await == 3
                && count(
                    pool,
                    "SELECT count(*) FROM inbox_event WHERE parked_at IS NOT NULL",
                )
                .await
                    == 1
        },
    )
    .await;
    running.shutdown().await.unwrap();

    let mut expected: Vec<String> = good.iter().map(|e| e.order_id.to_string()).collect();
    expected.sort();
    assert_eq!(
        answered_keys(pool).await,
        expected,
        "the parked row's event rolled back"
    );
    assert_eq!(count(pool, "SELECT count(*) FROM effect").await, 3);
}

/// Four processors handle rows of distinct keys in transactions of their
/// own, committing in any order; each commit that stored answers wakes the
/// relay, which otherwise would not look for a minute (its polls and
/// rebalances are that far apart): every answer is published within
/// seconds of its commit.
async fn every_commit_that_stored_recorded_events_wakes_the_relay(pool: &PgPool) {
    create_topic(ReactInbox::TOPIC, 1).await;
    create_topic(Answered::TOPIC, 1).await;
    let group = unique_group("react-wake");
    start_group_at(&group, ReactInbox::TOPIC, 1, true).await;
    let relay = Relay::builder(pool.clone(), kafka_config())
        .poll_interval(Duration::from_secs(60))
        .rebalance_interval(Duration::from_secs(120))
        .spawn()
        .unwrap();
    let running = Consumer::builder(pool.clone(), kafka_config(), &group)
        .handler(on_react_inbox)
        .mode(Mode::Inbox)
        .handle_on_receipt(false)
        .processors(4)
        .processor_batch_size(1)
        .processor_poll_interval(Duration::from_millis(20))
        .build()
        .unwrap()
        .spawn();
    let producer = producer();
    const BURSTS: i64 = 4;
    const PER_BURST: i64 = 10;
    for burst in 0..BURSTS {
        for n in 1..=PER_BURST {
            produce_event(&producer, &ReactInbox::new(burst * PER_BURST + n)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let total = BURSTS * PER_BURST;
    eventually("every row processed", Duration::from_secs(25), || async {
        let processed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM inbox_event WHERE processed AND consumer_group = $1",
        )
        .bind(&group)
        .fetch_one(pool)
        .await
        .unwrap();
        processed == total
    })
    .await;
    eventually(
        "every answer published (the relay woken by each commit)",
        Duration::from_secs(10),
        || async {
            count(
                pool,
                "SELECT count(*) FROM outbox_event
                 WHERE event_type = 'Answered' AND published_at IS NOT NULL",
            )
            .await
                == total
        },
    )
    .await;
    running.shutdown().await.unwrap();
    let summary = relay.shutdown().await.unwrap();
    assert_eq!(summary.published, total as u64);
}
